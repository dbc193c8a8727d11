"""The store (app/store/) against real databases: a SQLite file and a PostgreSQL database.

Every test runs on both backends through the ``db_url`` fixture (tests/conftest.py).
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import delete, func, select, update

from app import store
from app.store.db import session_scope
from app.store.groups import SAMPLE_COLUMNS
from app.store.models import Base, Group, Run, Sample
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.rewards.rewards import final_answer, outcome_reward
from grpo_engine.spec.config import validate_spec
from tests.support.store import new_run


def parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    assert parsed.utcoffset() == timedelta(0), value
    return parsed


def recent(value: str) -> bool:
    return abs(datetime.now(timezone.utc) - parse_time(value)) < timedelta(minutes=1)


def group(prompt: str, rewards: list[float], process: bool = False) -> dict:
    """A GroupRecord dict with one sample per reward; awkward floats and tokens to round-trip."""
    samples = []
    for i, reward in enumerate(rewards):
        tokens = ["  ", "é", "\n", "", "<|endoftext|>", f"t{i}"]
        advantages = [0.1 + 0.2, 1 / 3, -2.5e-300, 1e300, -0.0, float(i) - math.pi]
        samples.append(
            SampleRecord(
                completion="".join(tokens),
                tokens=tokens,
                reward=reward,
                advantages=advantages,
                step_rewards=[reward / 2, reward / 2] if process else None,
                step_end_indices=[2, 5] if process else None,
                reward_components={"correct": reward, "format": 1.0},
            )
        )
    return GroupRecord(prompt=prompt, reference="42", samples=samples).to_dict()


# ---- runs -----------------------------------------------------------------------------------


def test_a_run_id_is_never_reused_after_a_delete(db_url):
    """A service holding a deleted run's id must never read another run under it: on SQLite (which numbers a
    row max(id) + 1) as on PostgreSQL (a sequence)."""
    first, second, newest = (new_run(db_url) for _ in range(3))
    with session_scope(db_url) as s:
        assert store.delete_run(s, newest) == "deleted"
    again = new_run(db_url)
    assert again > newest > second > first
    with session_scope(db_url) as s:
        for run_id in (first, second, again):
            assert store.delete_run(s, run_id) == "deleted"
        assert store.delete_run(s, again) == "missing"
    assert new_run(db_url) > again  # every run gone: still above every id ever used


def test_create_get_and_list_runs(db_url):
    first = new_run(db_url, name="first", supervision="process")
    second = new_run(db_url)
    with session_scope(db_url) as s:
        run = store.get_run(s, first)
        runs = store.list_runs(s)
        assert store.get_run(s, 10_000) is None

    assert run["run_id"] == first and run["name"] == "first" and run["status"] == "queued"
    assert (
        run["config"]
        == validate_spec(
            {"name": "first", "supervision": "process", "iterations": 2, "steps_per_iteration": 3}
        ).to_dict()
    )
    assert (run["step"], run["total_steps"], run["error"], run["cancel_requested"]) == (0, 6, None, False)
    assert recent(run["created_at"]) and run["started_at"] is None and run["finished_at"] is None

    assert [r["run_id"] for r in runs] == [second, first]  # newest first
    assert runs[1] == {
        "run_id": first,
        "name": "first",
        "status": "queued",
        "model": "builtin-arith",
        "dataset": "builtin-arith",
        "supervision": "process",
        "step": 0,
        "total_steps": 6,
        "created_at": run["created_at"],
        "started_at": None,
        "finished_at": None,
        "phase": None,
        "phase_done": None,
        "phase_total": None,
        "notes": "",
        "tags": [],
        "archived": False,
    }


def test_status_transitions_set_timestamps(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.mark_running(s, run_id, total_steps=5)
    with session_scope(db_url) as s:
        run = store.get_run(s, run_id)
    assert run["status"] == "running" and run["total_steps"] == 5 and recent(run["started_at"])
    assert run["finished_at"] is None

    time.sleep(0.01)
    with session_scope(db_url) as s:  # a redelivered job starts the run again: first started_at is kept
        store.mark_running(s, run_id, total_steps=5)
        assert store.get_run(s, run_id)["started_at"] == run["started_at"]
        store.finish_run(s, run_id, "completed")
    with session_scope(db_url) as s:
        done = store.get_run(s, run_id)
    assert done["status"] == "completed" and done["error"] is None
    assert parse_time(done["finished_at"]) >= parse_time(done["started_at"]) >= parse_time(done["created_at"])

    failed = new_run(db_url)
    with session_scope(db_url) as s:
        store.mark_running(s, failed, total_steps=6)
        store.finish_run(s, failed, "failed", error="Traceback ...\nRuntimeError: out of memory")
        with pytest.raises(ValueError, match="status"):
            store.finish_run(s, failed, "running")
    with session_scope(db_url) as s:
        run = store.get_run(s, failed)
    assert run["status"] == "failed" and run["error"].endswith("out of memory") and recent(run["finished_at"])
    assert store.FINISHED_STATUSES == ("completed", "failed", "cancelled")


def test_session_scope_rolls_back_on_error(db_url):
    run_id = new_run(db_url)
    with pytest.raises(RuntimeError):
        with session_scope(db_url) as s:
            store.mark_running(s, run_id, total_steps=6)
            raise RuntimeError("boom")
    with session_scope(db_url) as s:
        assert store.get_run(s, run_id)["status"] == "queued"


def test_cancel_queued_run_at_once(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        assert store.request_cancel(s, run_id) == {"run_id": run_id, "status": "cancelled"}
    with session_scope(db_url) as s:
        run = store.get_run(s, run_id)
        assert run["status"] == "cancelled" and recent(run["finished_at"])
        assert store.is_cancel_requested(s, run_id)
        # A worker that picks the job up late does not bring the run back.
        store.mark_running(s, run_id, total_steps=6)
        assert store.get_run(s, run_id)["status"] == "cancelled"
        assert store.is_cancel_requested(s, run_id)


def test_cancel_running_run_asks_the_worker(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.mark_running(s, run_id, total_steps=6)
        assert not store.is_cancel_requested(s, run_id)
    with session_scope(db_url) as s:
        assert store.request_cancel(s, run_id) == {"run_id": run_id, "status": "running"}
    with session_scope(db_url) as s:
        run = store.get_run(s, run_id)
        assert run["status"] == "running" and run["cancel_requested"] and run["finished_at"] is None
        assert store.is_cancel_requested(s, run_id)
        store.finish_run(s, run_id, "cancelled")
    with session_scope(db_url) as s:
        assert store.get_run(s, run_id)["status"] == "cancelled"


def test_cancel_finished_or_unknown_run(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.mark_running(s, run_id, total_steps=6)
        store.finish_run(s, run_id, "completed")
    with session_scope(db_url) as s:
        finished_at = store.get_run(s, run_id)["finished_at"]
        assert store.request_cancel(s, run_id) == {"run_id": run_id, "status": "completed"}
        run = store.get_run(s, run_id)
        assert run["finished_at"] == finished_at and not run["cancel_requested"]
        with pytest.raises(LookupError):
            store.request_cancel(s, 10_000)
        assert store.is_cancel_requested(s, 10_000)  # a deleted run: the worker stops


# ---- metrics --------------------------------------------------------------------------------


def test_record_step_upserts_and_orders_by_step(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.record_step(s, run_id, 2, 1, {"reward_mean": 0.5, "kl": 0.01})
        store.record_step(s, run_id, 1, 1, {"reward_mean": 0.25, "kl": 0.0})
    with session_scope(db_url) as s:  # a redelivered job repeats step 2 with other numbers
        store.record_step(s, run_id, 2, 1, {"reward_mean": 0.75, "kl": float("nan"), "loss": float("inf")})
        store.record_step(s, run_id, 3, 2, {"reward_mean": 1.0, "eval/accuracy": 0.5})
    with session_scope(db_url) as s:
        metrics = store.get_metrics(s, run_id)
        assert store.get_run(s, run_id)["step"] == 3
        assert store.get_metrics(s, 10_000) == []
    assert metrics == [
        {"step": 1, "iteration": 1, "reward_mean": 0.25, "kl": 0.0},
        {"step": 2, "iteration": 1, "reward_mean": 0.75, "kl": None, "loss": None},
        {"step": 3, "iteration": 2, "reward_mean": 1.0, "eval/accuracy": 0.5},
    ]
    assert list(metrics[0]) == ["step", "iteration", "reward_mean", "kl"]


# ---- groups and samples ---------------------------------------------------------------------


def test_record_groups_stats_and_listing(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [group("q1", [0.0, 1.0, 0.0]), group("q2", [1.0, 1.0, 1.0])])
        store.record_groups(s, run_id, 3, [group("q3", [2.0, 0.0]), group("q4", [0.0, 0.0]), group("q5", [1.0, 0.0])])
    with session_scope(db_url) as s:
        latest = store.list_groups(s, run_id)
        first = store.list_groups(s, run_id, step=1)
        assert store.group_steps(s, run_id) == [1, 3]
        assert store.list_groups(s, run_id, step=2) == []
        assert store.list_groups(s, 10_000) == [] and store.group_steps(s, 10_000) == []

    assert [g["prompt"] for g in latest] == ["q3", "q4", "q5"] and {g["step"] for g in latest} == {3}
    assert [(g["reward_mean"], g["reward_std"]) for g in latest] == [(1.0, 1.0), (0.0, 0.0), (0.5, 0.5)]
    assert [g["prompt"] for g in first] == ["q1", "q2"]
    assert first[0]["reward_mean"] == pytest.approx(1 / 3) and first[0]["reward_std"] == pytest.approx(0.4714, abs=1e-4)
    assert first[0]["reward_std"] == pytest.approx(math.sqrt(2 / 9), rel=1e-12)  # population std
    assert (first[1]["reward_mean"], first[1]["reward_std"]) == (1.0, 0.0)
    assert set(first[0]) == {"group_id", "step", "prompt", "reward_mean", "reward_std", "kind"}


def test_record_groups_is_idempotent_per_step(db_url):
    run_id = new_run(db_url)
    other = new_run(db_url)
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [group("old", [0.0, 1.0]), group("old2", [0.0, 1.0])])
        store.record_groups(s, run_id, 2, [group("keep", [1.0, 1.0])])
        store.record_groups(s, other, 1, [group("other", [1.0, 0.0])])
    with session_scope(db_url) as s:  # the job is redelivered and step 1 is recorded again
        store.record_groups(s, run_id, 1, [group("new", [1.0, 1.0])])
    with session_scope(db_url) as s:
        assert [g["prompt"] for g in store.list_groups(s, run_id, 1)] == ["new"]
        assert [g["prompt"] for g in store.list_groups(s, run_id, 2)] == ["keep"]
        assert [g["prompt"] for g in store.list_groups(s, other, 1)] == ["other"]
        # The replaced groups' samples are gone too (ON DELETE CASCADE).
        assert s.scalar(select(func.count()).select_from(Group)) == 3
        assert s.scalar(select(func.count()).select_from(Sample)) == 6


def test_record_groups_fills_every_samples_column():
    """record_groups writes the samples through the driver, column by column: the list must be the table's."""
    assert sorted(SAMPLE_COLUMNS) == sorted(c.name for c in Sample.__table__.columns if c.name != "id")


def test_get_group_round_trips_samples_exactly(db_url):
    run_id = new_run(db_url)
    outcome, process = group("What is 6*7?", [1.0, 0.0, 0.5]), group("Steps?", [1.0, 0.0], process=True)
    outcome["model_prompt"] = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"  # a chat template's
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 4, [outcome, process])
    with session_scope(db_url) as s:
        ids = [g["group_id"] for g in store.list_groups(s, run_id, 4)]
        got = [store.get_group(s, group_id) for group_id in ids]
        assert store.get_group(s, 10_000) is None

    for sent, received, group_id in zip([outcome, process], got, ids, strict=True):
        assert (received["group_id"], received["run_id"], received["step"]) == (group_id, run_id, 4)
        assert (received["prompt"], received["reference"]) == (sent["prompt"], "42")
        assert len(received["samples"]) == len(sent["samples"])
        for a, b in zip(sent["samples"], received["samples"], strict=True):
            assert isinstance(b["sample_id"], int)
            for key in (
                "completion",
                "tokens",
                "reward",
                "advantages",
                "step_rewards",
                "step_end_indices",
                "reward_components",
            ):
                assert b[key] == a[key], key
            assert [x.hex() for x in b["advantages"]] == [x.hex() for x in a["advantages"]]  # bit for bit
            assert all(type(x) is float for x in b["advantages"])
    assert got[0]["model_prompt"] == outcome["model_prompt"] and got[1]["model_prompt"] is None  # none given
    assert got[0]["samples"][0]["step_rewards"] is None and got[0]["samples"][0]["step_end_indices"] is None
    assert got[1]["samples"][0]["step_end_indices"] == [2, 5]
    assert got[1]["samples"][1]["step_rewards"] == [0.0, 0.0]


def test_a_samples_reading_comes_back_and_decides_answer_found(db_url):
    """The verifier's reading recorded with a sample (the answer and its rule, as rewards.final_answer gives them
    under the run's answer_match) comes back from get_group, the export's rows and a search; answer_found follows
    it (a flexible last number is an answer found, though no strict form was stated); a sample recorded without a
    reading keeps both null and answer_found from its strict ``formatted`` component."""
    texts = {  # the two outputs, a stated answer, and one with no number at all
        "hashes": "8 - 5 = 3 stickers left.\n######## Eva ended up with 3 stickers!\n########",
        "prose": "8 - 5 = 3.\n######## Eva has 3 stickers left",
        "stated": "8 - 5 = 3\n#### 3",
        "nothing": "I cannot tell.",
    }
    samples = []
    for text in texts.values():
        answer, rule = final_answer(text, "flexible")
        components = outcome_reward(text, "3", 0.1, "flexible")[1]
        samples.append(
            SampleRecord(text, [text], 1.0, [0.0], reward_components=components, answer=answer, answer_rule=rule)
        )
    samples.append(SampleRecord("old", ["old"], 0.0, [0.0], reward_components={"correct": 0.0, "formatted": 0.0}))
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [GroupRecord("Eva's stickers?", "3", samples).to_dict()])
    with session_scope(db_url) as s:
        [summary] = store.list_groups(s, run_id, 1)
        got = store.get_group(s, summary["group_id"])["samples"]
        exported = list(store.iter_sample_rows(s, run_id))
        no_answer = store.search_samples(s, run_id, store.SampleQuery(outcome="no_answer"))["rows"]
    readings = [(x["answer"], x["answer_rule"], x["answer_found"]) for x in got]
    assert readings == [
        ("3", "number", True),
        ("3", "number", True),
        ("3", "gsm8k", True),
        (None, "none", False),
        (None, None, False),  # recorded without a reading: not recorded
    ]
    assert [x["reward_components"]["formatted"] for x in got[:3]] == [0.0, 0.0, 1.0]
    assert [(r["answer"], r["answer_rule"]) for r in exported] == [(a, r) for a, r, _ in readings]
    assert {"answer", "answer_rule"} <= set(store.EXPORT_COLUMNS)
    assert [(r["completion"], r["answer_rule"]) for r in no_answer] == [(texts["nothing"], "none"), ("old", None)]
    assert no_answer[0]["reward_components"] == {"correct": 0.0, "formatted": 0.0, "format": 0.0}


# ---- logs -----------------------------------------------------------------------------------


def test_logs_oldest_first_with_limit(db_url):
    run_id = new_run(db_url)
    other = new_run(db_url)
    with session_scope(db_url) as s:
        for i in range(5):
            store.append_log(s, run_id, f"line {i}")
        store.append_log(s, other, "elsewhere")
    with session_scope(db_url) as s:
        assert store.get_logs(s, run_id) == [f"line {i}" for i in range(5)]
        assert store.get_logs(s, run_id, limit=2) == ["line 3", "line 4"]
        assert store.get_logs(s, other) == ["elsewhere"]
        assert store.get_logs(s, 10_000) == []


def test_deleting_a_run_deletes_everything_under_it(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.record_step(s, run_id, 1, 1, {"reward_mean": 1.0})
        store.record_groups(s, run_id, 1, [group("q", [1.0, 0.0])])
        store.append_log(s, run_id, "hello")
    with session_scope(db_url) as s:
        s.execute(delete(Run).where(Run.id == run_id))
    with session_scope(db_url) as s:
        for table in Base.metadata.sorted_tables:
            if table.name != "id_high_water":  # the largest id used is kept on purpose
                assert s.scalar(select(func.count()).select_from(table)) == 0, table.name


# ---- leases ------------------------------------------------------------------


def test_one_worker_wins_the_claim_and_only_it_may_write(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        assert store.claim_run(s, run_id, "a:1", lease_seconds=60)
    with session_scope(db_url) as s:
        assert not store.claim_run(s, run_id, "b:2", lease_seconds=60)  # a's lease is fresh
        run = store.get_run(s, run_id)
    assert run["status"] == "running" and run["worker"] == "a:1" and run["attempts"] == 1
    with session_scope(db_url) as s:
        store.record_step(s, run_id, 1, 1, {"loss": 0.5}, worker="a:1")
    with pytest.raises(store.LeaseLost), session_scope(db_url) as s:
        store.record_step(s, run_id, 2, 1, {"loss": 0.4}, worker="b:2")
    with session_scope(db_url) as s:
        assert [m["step"] for m in store.get_metrics(s, run_id)] == [1]  # b's write rolled back
        assert store.renew_lease(s, run_id, "a:1") and not store.renew_lease(s, run_id, "b:2")


def test_a_stale_lease_is_requeued_once_and_taken_over(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.claim_run(s, run_id, "a:1", lease_seconds=60)
        store.record_step(s, run_id, 1, 1, {"loss": 0.5}, worker="a:1")
        s.execute(
            update(Run).where(Run.id == run_id).values(heartbeat_at=datetime.now(timezone.utc) - timedelta(seconds=120))
        )  # a died two minutes ago
    with session_scope(db_url) as s:
        assert [r["run_id"] for r in store.requeue_stale_runs(s, lease_seconds=300)] == []  # not stale for 300 s
        assert [r["run_id"] for r in store.requeue_stale_runs(s, lease_seconds=60)] == [run_id]
        assert store.requeue_stale_runs(s, lease_seconds=60) == []  # once
        assert store.get_run(s, run_id)["status"] == "queued"
    with session_scope(db_url) as s:
        assert store.claim_run(s, run_id, "b:2", lease_seconds=60)
    with pytest.raises(store.LeaseLost), session_scope(db_url) as s:  # a comes back to life: fenced off
        store.record_step(s, run_id, 2, 1, {"loss": 0.4}, worker="a:1")
    with session_scope(db_url) as s:
        assert not store.finish_run(s, run_id, "failed", "a's error", worker="a:1")
        store.truncate_after(s, run_id, 0)  # b resumes from the start
        store.record_step(s, run_id, 1, 1, {"loss": 0.6}, worker="b:2")
        assert store.finish_run(s, run_id, "completed", worker="b:2")
        run = store.get_run(s, run_id)
        assert run["status"] == "completed" and run["attempts"] == 2 and run["worker"] is None
        assert store.get_metrics(s, run_id) == [{"step": 1, "iteration": 1, "loss": 0.6}]


def test_cancelled_runs_are_never_claimed(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.request_cancel(s, run_id)
        assert not store.claim_run(s, run_id, "a:1", lease_seconds=60)


def test_truncate_after_drops_later_metrics_and_groups(db_url):
    run_id = new_run(db_url)
    group = GroupRecord(prompt="q", reference="1", samples=[SampleRecord("1", ["1"], 1.0, [0.0])]).to_dict()
    with session_scope(db_url) as s:
        for step in (1, 2, 3):
            store.record_step(s, run_id, step, 1, {"loss": float(step)})
            store.record_groups(s, run_id, step, [group])
        store.truncate_after(s, run_id, 2)
        assert [m["step"] for m in store.get_metrics(s, run_id)] == [1, 2]
        assert store.group_steps(s, run_id) == [1, 2]
        assert store.get_run(s, run_id)["step"] == 2
