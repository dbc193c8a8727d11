"""Run phases: what a run is doing now ("loading model", "training", ...) and how far.

The engine reports them to ``Recorder.phase`` (short real runs of ``grpo_engine.train.trainer.train`` on the built-in
model, and the built-in model's warm start), the store keeps the current one on the run (``set_phase``, cleared
when the run ends or goes back to the queue) on SQLite and PostgreSQL, and the worker's ``DBRecorder`` writes
them through its background writer, at most a few count updates a second.
"""

from __future__ import annotations

import time

from sqlalchemy import event

from app import store
from app.store.db import make_engine, session_scope
from grpo_engine.model import model
from grpo_engine.report.recorder import Recorder
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.loading import building_progress
from grpo_engine.train.trainer import train
from workers.recorder import PHASE_WRITE_SECONDS, DBRecorder

TINY = dict(steps_per_iteration=3, batch_size=2, group_size=4, max_new_tokens=16)


class PhaseRecorder(Recorder):
    """Collects the phases the engine reports, as (name, done, total)."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int | None, int | None]] = []

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """Keep the phase."""
        self.phases.append((name, done, total))


def names(phases: list[tuple]) -> list[str]:
    """The phase names in order, each repetition of the same name (a count update) kept once."""
    return [p[0] for i, p in enumerate(phases) if i == 0 or phases[i - 1][0] != p[0]]


def new_run(url: str) -> int:
    """A queued run of a tiny spec."""
    with session_scope(url) as s:
        return store.create_run(s, validate_spec(TINY).to_dict(), "phases")


def run_phase(url: str, run_id: int) -> tuple:
    """(phase, phase_done, phase_total) of the run, as ``get_run`` and ``list_runs`` give them."""
    with session_scope(url) as s:
        run = store.get_run(s, run_id)
        (listed,) = [r for r in store.list_runs(s) if r["run_id"] == run_id]
    assert (listed["phase"], listed["phase_done"], listed["phase_total"]) == (
        run["phase"],
        run["phase_done"],
        run["phase_total"],
    )
    return run["phase"], run["phase_done"], run["phase_total"]


# ---- the engine ---------------------------------------------------------------------------------


def test_a_run_reports_its_phases_in_order(grpo_cache_dir, tmp_path):
    """Loading, the step-0 evaluation, then "training" k/3 after each step, "evaluating" on evaluation steps,
    "saving" for the checkpoint after step 2 and for the final policy."""
    recorder = PhaseRecorder()
    spec = validate_spec({**TINY, "eval_every": 2, "checkpoint_every": 2})
    result = train(spec, recorder, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "run")
    assert result.status == "completed"
    assert recorder.phases == [
        ("loading model", None, None),
        ("loading dataset", None, None),
        ("loading reference model", None, None),
        ("evaluating", None, None),  # step 0: the initial policy's accuracy
        ("training", 0, 3),
        ("training", 1, 3),
        ("evaluating", None, None),
        ("training", 2, 3),
        ("saving", None, None),
        ("training", 2, 3),
        ("evaluating", None, None),
        ("training", 3, 3),  # the last step is evaluated too
        ("saving", None, None),  # the final policy
    ]


def test_lora_and_reward_model_phases(grpo_cache_dir):
    """With LoRA there is no reference copy to load; with ``reward: model`` the reward model is loaded and then
    trained before step 1 and refreshed after iteration 1, each time counting its batches 0..total."""
    recorder = PhaseRecorder()
    spec = validate_spec(
        {
            **TINY,
            "iterations": 2,
            "steps_per_iteration": 1,
            "eval_every": 0,
            "lora_rank": 2,
            "reward": "model",
            "rm_samples": 16,
        }
    )
    assert train(spec, recorder, grpo_cache_dir, device="cpu").status == "completed"
    assert names(recorder.phases) == [
        "loading model",
        "loading dataset",
        "loading model",
        "training reward model",
        "training",
        "training reward model",
        "training",
    ]
    assert [p for p in recorder.phases if p[0] == "training"] == [("training", k, 2) for k in (0, 1, 2)]
    # 16 samples + 4 held out in batches of B x G = 8 (3 batches), then 2 epochs of one batch of 32 (the
    # refresh's 16 + 2 replayed also fit in one)
    rm_counts = [(done, total) for name, done, total in recorder.phases if name == "training reward model"]
    assert rm_counts == [(k, 5) for k in range(6)] * 2


def test_the_built_in_model_build_reports_its_warm_up_steps(tmp_path, monkeypatch):
    """A first use builds the built-in model: "building built-in model" counts its warm-up steps. The warm start
    is shortened to 5 steps here (the real one takes minutes); the model it leaves is only this test's."""
    monkeypatch.setitem(model.WARMUP, "steps", 5)
    recorder = PhaseRecorder()
    built = model.builtin_model_dir(tmp_path, log=lambda message: None, progress=building_progress(recorder))
    assert (built / "model.safetensors").exists()
    assert recorder.phases == [("building built-in model", k, 5) for k in range(6)]
    recorder.phases.clear()
    model.builtin_model_dir(tmp_path, log=lambda message: None, progress=building_progress(recorder))
    assert recorder.phases == []  # built already: nothing to report


# ---- the store ----------------------------------------------------------------------------------


def test_the_store_keeps_the_phase_of_a_running_run_only(db_url):
    """``set_phase`` on a running run shows in get_run / list_runs; a queued run, another worker's write and an
    ended run have none; finish_run, requeue_run and requeue_stale_runs clear it."""
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        assert not store.set_phase(s, run_id, "loading model")  # still queued
        assert store.claim_run(s, run_id, "w1", 60)
        assert store.set_phase(s, run_id, "building built-in model", 400, 900, worker="w1")
        assert not store.set_phase(s, run_id, "training", 1, 3, worker="w2")  # not the lease holder
    assert run_phase(db_url, run_id) == ("building built-in model", 400, 900)

    with session_scope(db_url) as s:
        assert store.set_phase(s, run_id, "evaluating", worker="w1")
    assert run_phase(db_url, run_id) == ("evaluating", None, None)

    with session_scope(db_url) as s:
        assert store.requeue_run(s, run_id, "w1")  # paused: back in the queue
    assert run_phase(db_url, run_id) == (None, None, None)

    with session_scope(db_url) as s:
        assert store.claim_run(s, run_id, "w2", 60)
        store.set_phase(s, run_id, "training", 2, 3)
    time.sleep(0.05)
    with session_scope(db_url) as s:  # w2 died: its lease is older than 0.01 s
        assert [r["run_id"] for r in store.requeue_stale_runs(s, 0.01)] == [run_id]
    assert run_phase(db_url, run_id) == (None, None, None)

    with session_scope(db_url) as s:
        assert store.claim_run(s, run_id, "w3", 60)
        store.set_phase(s, run_id, "saving", worker="w3")
    assert run_phase(db_url, run_id) == ("saving", None, None)
    with session_scope(db_url) as s:
        assert store.finish_run(s, run_id, "completed", worker="w3")
        assert not store.set_phase(s, run_id, "training", 3, 3)  # ended: a late write changes nothing
    assert run_phase(db_url, run_id) == (None, None, None)


# ---- the worker's recorder ----------------------------------------------------------------------


def test_db_recorder_throttles_counts_and_writes_the_last_one(db_url):
    """A thousand count updates in a burst become a few writes, the newest count is in the store after
    ``flush()``, a new phase is written at once, and ``close()`` writes a count still held back."""
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        assert store.claim_run(s, run_id, "w1", 60)
    writes = []

    def count_phase_writes(conn, cursor, statement, parameters, context, executemany) -> None:
        """Count the UPDATEs that set a run's phase."""
        if statement.lstrip().upper().startswith("UPDATE RUNS") and "phase_done" in statement:
            writes.append(statement)

    engine = make_engine(db_url)
    event.listen(engine, "before_cursor_execute", count_phase_writes)
    recorder = DBRecorder(run_id, db_url, worker="w1", background=True)
    try:
        started = time.monotonic()
        for done in range(1001):
            recorder.phase("building built-in model", done, 1000)
        elapsed = time.monotonic() - started
        recorder.flush()
        assert run_phase(db_url, run_id) == ("building built-in model", 1000, 1000)
        # the first count at once, then at most one every PHASE_WRITE_SECONDS, and the one flush() wrote
        assert len(writes) <= 2 + elapsed / PHASE_WRITE_SECONDS

        before = len(writes)
        recorder.phase("loading dataset")  # a new phase: written at once, however recent the last write
        recorder.phase("training", 0, 3)
        recorder.phase("training", 1, 3)  # held back: the "training" count was written just now
        recorder.flush()
        assert len(writes) == before + 3
        assert run_phase(db_url, run_id) == ("training", 1, 3)

        recorder.phase("training", 2, 3)  # held back again, until close()
    finally:
        recorder.close()
        event.remove(engine, "before_cursor_execute", count_phase_writes)
    assert run_phase(db_url, run_id) == ("training", 2, 3)
