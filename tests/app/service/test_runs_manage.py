"""Managing runs: the store's functions (app.store.manage) on SQLite and PostgreSQL, the API's
(app.service.manage_api, app.service.api.get_logs, launch's 'gpu' check) over a real SQLite store and broker, the run spec's
near-key message, the Runs table's renderers, and the new endpoints through gradio_client on a live server.
"""

from __future__ import annotations

import threading
import time

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from sqlalchemy import func, select

from app import store
from app.service import api, manage_api
from app.store.db import make_engine, session_scope, upgrade_database
from app.store.models import Group, Metric, Run, RunLog, Sample
from app.web.views.runs import matches, phase_text, run_duration, runs_table_html
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.spec.config import SpecError, validate_spec
from tests.support.servers import running_server, server_env

QUEUE = "grpo-manage-test"
SPEC = {
    "model": "builtin-arith",
    "dataset": "builtin-arith",
    "supervision": "outcome",
    "iterations": 1,
    "steps_per_iteration": 10,
    "name": "r",
    "device": "auto",
}


def _group(rewards: list[float]) -> dict:
    """One recorded group with a sample per reward."""
    samples = [SampleRecord(completion="4", tokens=["4"], reward=r, advantages=[r]) for r in rewards]
    return GroupRecord(prompt="2+2=", reference="4", samples=samples).to_dict()


def _seed_run(s, name: str = "r") -> int:
    """A run with two steps of metrics, a step of groups and two log lines."""
    run_id = store.create_run(s, {**SPEC, "name": name}, name)
    store.record_step(s, run_id, 1, 1, {"reward_mean": 0.5})
    store.record_step(s, run_id, 2, 1, {"reward_mean": 0.75})
    store.record_groups(s, run_id, 2, [_group([0.0, 1.0]), _group([1.0, 1.0])])
    store.append_log(s, run_id, "one")
    store.append_log(s, run_id, "two")
    return run_id


def _counts(s, run_id: int) -> dict[str, int]:
    """How many rows of each table belong to the run."""
    groups = select(Group.id).where(Group.run_id == run_id)
    return {
        "runs": s.scalar(select(func.count()).where(Run.id == run_id)),
        "metrics": s.scalar(select(func.count()).where(Metric.run_id == run_id)),
        "groups": s.scalar(select(func.count()).where(Group.run_id == run_id)),
        "samples": s.scalar(select(func.count()).where(Sample.group_id.in_(groups))),
        "logs": s.scalar(select(func.count()).where(RunLog.run_id == run_id)),
    }


# ---- the store, on both backends ------------------------------------------------------------------


def test_store_renames_annotates_and_archives(db_url):
    with session_scope(db_url) as s:
        run_id = _seed_run(s)
        assert store.rename_run(s, run_id, "renamed") and not store.rename_run(s, 999, "x")
        assert store.annotate_run(s, run_id, "a note", ["baseline", "lr sweep"])
        assert store.annotate_run(s, run_id, None, None) and not store.annotate_run(s, 999, "x")
        assert store.set_archived(s, run_id, True) and not store.set_archived(s, 999, True)
    with session_scope(db_url) as s:
        run = store.get_run(s, run_id)
        assert run["name"] == run["config"]["name"] == "renamed"  # an exported config carries the new name
        assert (run["notes"], run["tags"], run["archived"]) == ("a note", ["baseline", "lr sweep"], True)
        store.annotate_run(s, run_id, None, [])  # tags cleared, notes kept
        store.set_archived(s, run_id, False)
        [summary] = store.list_runs(s)
        assert (summary["notes"], summary["tags"], summary["archived"]) == ("a note", [], False)


def test_store_delete_removes_every_row_of_the_run_but_refuses_a_running_one(db_url):
    with session_scope(db_url) as s:
        gone, kept, running = _seed_run(s, "gone"), _seed_run(s, "kept"), _seed_run(s, "running")
        store.mark_running(s, running, total_steps=10)
        assert _counts(s, gone) == {"runs": 1, "metrics": 2, "groups": 2, "samples": 4, "logs": 2}
    with session_scope(db_url) as s:
        assert store.delete_run(s, gone) == "deleted"
        assert store.delete_run(s, running) == "running" and store.delete_run(s, 999) == "missing"
    with session_scope(db_url) as s:
        assert _counts(s, gone) == {"runs": 0, "metrics": 0, "groups": 0, "samples": 0, "logs": 0}
        assert _counts(s, kept) == {"runs": 1, "metrics": 2, "groups": 2, "samples": 4, "logs": 2}
        assert _counts(s, running)["runs"] == 1


def test_metrics_after_reads_from_a_step_on(db_url):
    with session_scope(db_url) as s:
        a, b = _seed_run(s, "a"), _seed_run(s, "b")
        assert [(r, step) for r, step, _ in store.metrics_after(s, {a: -1, b: 2})] == [(a, 1), (a, 2), (b, 2)]
        assert store.metrics_after(s, {}) == []


# ---- the API ---------------------------------------------------------------------------------------


@pytest.fixture
def api_env(sqlite_url, tmp_path, monkeypatch):
    """Settings pointed at a fresh store, a broker file and a checkpoint directory in tmp_path; returns the
    checkpoint directory."""
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("GRPO_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}")
    monkeypatch.setenv("GRPO_QUEUE", QUEUE)
    monkeypatch.setenv("GRPO_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.delenv("GRPO_EMBEDDED_WORKER", raising=False)
    monkeypatch.delenv("GRPO_LEASE_SECONDS", raising=False)
    return tmp_path / "checkpoints"


def test_rename_annotate_archive(api_env):
    run_id = api.launch_run({"name": "first"})["run_id"]
    assert manage_api.rename_run(str(run_id), "  second  ")["name"] == "second"
    run = manage_api.annotate_run(run_id, "notes\nover lines", "baseline, lr-sweep,,baseline ")
    assert run["tags"] == ["baseline", "lr-sweep"] and run["notes"] == "notes\nover lines"
    assert manage_api.annotate_run(run_id, None, ["a", "b,c"])["tags"] == ["a", "b", "c"]
    assert manage_api.annotate_run(run_id, tags=None)["notes"] == "notes\nover lines"  # None keeps
    assert manage_api.archive_run(run_id)["archived"] is True
    assert manage_api.archive_run(run_id, "false")["archived"] is False


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda r: manage_api.rename_run(r, ""), "name must not be empty"),
        (lambda r: manage_api.rename_run(r, "x" * 201), "name must be at most 200 characters"),
        (lambda r: manage_api.rename_run(r, "a\0b"), "name must not contain a NUL"),
        (lambda r: manage_api.rename_run(r, 5), "name must be a string"),
        (lambda r: manage_api.annotate_run(r, "x" * 10_001), "notes must be at most 10000"),
        (lambda r: manage_api.annotate_run(r, None, {"a": 1}), "tags must be a list of strings"),
        (lambda r: manage_api.annotate_run(r, None, ["x" * 41]), "a tag must be at most 40"),
        (lambda r: manage_api.annotate_run(r, None, [str(i) for i in range(21)]), "at most 20 tags"),
        (lambda r: manage_api.archive_run(r, "maybe"), "archived must be true or false"),
        (lambda r: manage_api.wait_run(r, 0), "timeout must be a number of seconds from 1 to 600"),
        (lambda r: manage_api.wait_run(r, "forever"), "timeout must be a number"),
        (lambda r: api.get_logs(r, 0), "limit must be an integer from 1"),
        (lambda r: api.get_logs(r, 10_001), "limit must be an integer from 1 to 10000"),
        (lambda r: manage_api.delete_run(r + 1), "not found"),
        (lambda r: manage_api.rename_run("abc", "x"), "run_id must be an integer"),
    ],
    ids=[
        "empty",
        "long",
        "nul",
        "not-text",
        "long-notes",
        "tags-dict",
        "long-tag",
        "many-tags",
        "archived",
        "timeout-0",
        "timeout-text",
        "limit-0",
        "limit-big",
        "unknown",
        "bad-id",
    ],
)
def test_bad_management_requests_are_refused(api_env, call, words):
    run_id = api.launch_run({"name": "kept"})["run_id"]
    with pytest.raises(api.ApiError, match=words):
        call(run_id)
    assert api.get_run(run_id)["name"] == "kept"


def test_delete_removes_the_run_its_rows_and_its_checkpoints(api_env):
    run_id = api.launch_run({"name": "doomed"})["run_id"]
    with session_scope() as s:
        store.record_step(s, run_id, 1, 1, {"reward_mean": 0.5})
        store.record_groups(s, run_id, 1, [_group([0.0, 1.0])])
        store.append_log(s, run_id, "a line")
    (api_env / f"run-{run_id}" / "final" / "model").mkdir(parents=True)
    (api_env / f"run-{run_id}" / "step-1.pt").write_bytes(b"state")
    assert manage_api.delete_run(run_id) == {"run_id": run_id, "deleted": True, "checkpoints": "removed"}
    assert not (api_env / f"run-{run_id}").exists()
    with session_scope() as s:
        assert _counts(s, run_id) == {"runs": 0, "metrics": 0, "groups": 0, "samples": 0, "logs": 0}
    with pytest.raises(api.ApiError, match=f"^run {run_id} not found$"):
        api.get_run(run_id)
    other = api.launch_run({})["run_id"]
    assert manage_api.delete_run(other)["checkpoints"] == "none"


def test_delete_refuses_a_running_run(api_env):
    run_id = api.launch_run({})["run_id"]
    with session_scope() as s:
        store.claim_run(s, run_id, "host:1", 60)
    with pytest.raises(api.ApiError, match=f"^run {run_id} is running; cancel it first"):
        manage_api.delete_run(run_id)
    api.cancel_run(run_id)
    with pytest.raises(api.ApiError, match=r"is running \(it is stopping: cancel requested\)"):
        manage_api.delete_run(run_id)
    with session_scope() as s:
        store.finish_run(s, run_id, "cancelled", worker="host:1")
    assert manage_api.delete_run(run_id)["deleted"] is True


def test_get_logs_gives_the_newest_lines_oldest_first(api_env):
    run_id = api.launch_run({})["run_id"]
    with session_scope() as s:
        for i in range(5):
            store.append_log(s, run_id, f"line {i}")
    assert api.get_logs(run_id, "2") == ["line 3", "line 4"]
    assert api.get_logs(run_id, None) == [f"line {i}" for i in range(5)]


def test_wait_run_returns_when_the_run_ends_or_at_the_timeout(api_env):
    run_id = api.launch_run({})["run_id"]
    started = time.monotonic()
    assert manage_api.wait_run(run_id, 1)["status"] == "queued"  # as it stands at the timeout
    assert 1 <= time.monotonic() - started < 2

    def finish():
        time.sleep(0.6)
        with session_scope() as s:
            store.finish_run(s, run_id, "completed")

    threading.Thread(target=finish).start()
    started = time.monotonic()
    assert manage_api.wait_run(run_id, "30")["status"] == "completed"
    assert time.monotonic() - started < 3
    started = time.monotonic()
    assert manage_api.wait_run(run_id, 600)["status"] == "completed"  # finished already: at once
    assert time.monotonic() - started < 0.5


def test_headline_metrics_keep_the_newest_value_of_each(api_env):
    run_id = api.launch_run({})["run_id"]
    with session_scope() as s:
        store.record_step(s, run_id, 0, 0, {"eval/accuracy": 0.25})
        store.record_step(s, run_id, 1, 1, {"reward_mean": 0.5, "correct_frac": 0.25})
    [run] = manage_api.runs_overview()
    assert run["headline"] == {"eval/accuracy": 0.25, "reward_mean": 0.5, "correct_frac": 0.25}
    with session_scope() as s:
        store.record_step(s, run_id, 2, 1, {"reward_mean": 0.75, "correct_frac": 0.5})
    assert manage_api.runs_overview()[0]["headline"] == {
        "eval/accuracy": 0.25,
        "reward_mean": 0.75,
        "correct_frac": 0.5,
    }
    with session_scope() as s:
        store.truncate_after(s, run_id, 0)  # resumed from step 0: the later steps are forgotten
    assert manage_api.runs_overview()[0]["headline"] == {"eval/accuracy": 0.25}


# ---- launch: the run spec's near key, and 'gpu' with no GPU worker -------------------------------------


def test_an_unknown_key_names_the_nearest_valid_one():
    with pytest.raises(SpecError, match="^groupsize: unknown key; did you mean group_size\\?$"):
        validate_spec({"groupsize": 4})
    with pytest.raises(SpecError, match="^zzz: unknown key; valid keys are: name, model, "):
        validate_spec({"zzz": 1})


def _report(name: str, queues: list[str], gpus: list[int]) -> None:
    """A worker's report, as a worker process writes it."""
    with session_scope() as s:
        store.report_worker(s, name, queues, [{"name": "GPU", "memory": m} for m in gpus])


def test_gpu_run_is_refused_when_the_workers_that_take_it_have_no_gpu(api_env, monkeypatch):
    assert api.launch_run({"device": "gpu"})["status"] == "queued"  # no worker known: it waits
    _report("cpu-host:2", [QUEUE, f"{QUEUE}.cpu"], [])  # a CPU worker leaves 'gpu' runs on the queue
    assert api.launch_run({"device": "gpu"})["status"] == "queued"
    _report("here:1", [QUEUE, f"{QUEUE}.gpu", f"{QUEUE}.cpu"], [])  # the embedded worker, without a GPU
    monkeypatch.setenv("GRPO_EMBEDDED_WORKER", "1")
    with pytest.raises(api.ApiError) as refused:
        api.launch_run({"device": "gpu"})
    assert str(refused.value) == (
        "device: 'gpu' but no live worker has a GPU (the embedded worker runs on this "
        "machine's CPU); use device 'auto' or 'cpu', or start `grpo-dashboard worker` "
        "on a GPU machine"
    )
    assert api.launch_run({"device": "auto"})["status"] == "queued"
    monkeypatch.setenv("GRPO_EMBEDDED_WORKER", "0")
    with pytest.raises(api.ApiError, match="the workers that take 'gpu' runs have none: here:1"):
        api.launch_run({"device": "gpu"})
    _report("gpu-host:3", [QUEUE, f"{QUEUE}.gpu"], [80 * 2**30])
    assert api.launch_run({"device": "gpu"})["status"] == "queued"
    assert len(api.list_runs()) == 4


# ---- the Runs table ----------------------------------------------------------------------------------


def _summary(**values) -> dict:
    """A run as runs_overview gives it."""
    return {
        "run_id": 3,
        "name": "sweep <a>",
        "status": "completed",
        "model": "org/Model-1B",
        "dataset": "gsm8k",
        "supervision": "outcome",
        "step": 10,
        "total_steps": 10,
        "created_at": "2026-01-02T03:04:05+00:00",
        "started_at": "2026-01-02T03:05:00+00:00",
        "finished_at": "2026-01-02T04:07:30+00:00",
        "phase": None,
        "phase_done": None,
        "phase_total": None,
        "notes": "",
        "tags": ["lr", "base"],
        "archived": False,
        "headline": {"reward_mean": 0.625, "correct_frac": 0.5},
        **values,
    }


def test_runs_table_shows_status_phase_metrics_duration_and_tags():
    running = _summary(
        run_id=4, status="running", finished_at=None, phase="building built-in model", phase_done=400, phase_total=900
    )
    page = runs_table_html([running, _summary()], [running, _summary()], selected=3)
    assert '<span class="badge running">running</span><div class="run-phase">building built-in model 400/900' in page
    assert '<span class="badge completed">completed</span>' in page and "sweep &lt;a&gt;" in page
    assert "0.625" in page and "50.0%" in page and "1h 02m" in page and "2026-01-02 03:04" in page
    assert '<span class="tag">lr</span>' in page and 'class="run-row completed selected"' in page
    assert phase_text({**running, "status": "completed"}) == "" and run_duration({**running, "started_at": None}) == ""


def test_runs_filter_by_status_search_and_archived():
    run = _summary()
    assert matches(run, "all", "", False) and matches(run, "completed", "SWEEP base", False)
    assert not matches(run, "active", "", False) and not matches(run, "failed", "", False)
    assert matches(run, "all", "model-1b #3", False) and not matches(run, "all", "llama", False)
    archived = {**run, "archived": True}
    assert not matches(archived, "all", "", False) and matches(archived, "all", "", True)
    assert "1 of 2 runs shown · 1 archived hidden" in runs_table_html([run, {**run, "archived": True}], [run])
    assert "1 of 2 runs shown · click" in runs_table_html([run, {**run, "archived": True}], [run], show_archived=True)
    assert "No runs yet" in runs_table_html([], [])
    assert '<div class="runs-count">1 run · click' in runs_table_html([run], [run])


def test_an_uploaded_dataset_shows_under_the_name_it_was_uploaded_with():
    """The uploads folder keeps a file as '<16 hex of its SHA-256>-<name>'; the table shows the name, the tooltip
    the stored path."""
    stored = "/data/uploads/c8454ba910d8fbef-word_problems.jsonl"
    page = runs_table_html([_summary(dataset=stored)], [_summary(dataset=stored)])
    assert f'<span title="{stored}">word_problems.jsonl</span>' in page
    plain = runs_table_html([_summary(dataset="openai/gsm8k")], [_summary(dataset="openai/gsm8k")])
    assert ">gsm8k</span>" in plain


def test_a_tick_that_read_the_pickers_before_a_launch_keeps_the_launched_run_shown(api_env, sqlite_url):
    """A Runs-table tick sent while the pickers showed run 1 runs after Launch created run 2 and opened it: it
    brings run 2 into every picker's choices and sets no picker's value, so the launched run stays shown. A
    deleted run still moves its pickers to the newest run left."""
    from app.web.tabs.runs import _refresh_runs

    with session_scope(sqlite_url) as s:
        first = _seed_run(s, "first")
        seen = _refresh_runs(None, first, first, [first], None, "all", "", False)[-1]
        launched = store.create_run(s, {**SPEC, "name": "launched"}, "launched")
    _, *pickers, seen = _refresh_runs(seen, first, first, [first], None, "all", "", False)
    for picker in pickers:
        assert [value for _, value in picker.constructor_args["choices"]] == [launched, first]
        assert "value" not in picker.constructor_args, picker.constructor_args
    with session_scope(sqlite_url) as s:
        store.delete_run(s, launched)
    _, run, groups, compared, manage, _ = _refresh_runs(
        seen, launched, launched, [first, launched], launched, "all", "", False
    )
    assert (run.constructor_args["value"], groups.constructor_args["value"]) == (first, first)
    assert compared.constructor_args["value"] == [first] and manage.constructor_args["value"] is None


def test_an_event_that_read_a_deleted_run_from_a_picker_reaches_its_listener_as_no_pick():
    """The refresh after a delete took run 2 out of the choices before a tick sent with run 2 picked was run: the
    run pickers hand that tick's listeners None (or the list without run 2) where gr.Dropdown refuses the event,
    and the page still draws them with gr.Dropdown's component."""
    from app.web.tabs.components import Picker

    single = Picker([("#1 older (completed)", 1)], value=1)
    several = Picker([("#1 older (completed)", 1)], value=[1], multiselect=True)
    assert (single.preprocess(2), single.preprocess(1), single.preprocess(None)) == (None, 1, None)
    assert several.preprocess([1, 2]) == [1] and several.preprocess([2]) == []
    assert single.get_block_name() == several.get_block_name() == "dropdown"


# ---- the endpoints, on a live server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A live server without a worker (launched runs stay queued): yields (client, database url, checkpoint dir)."""
    tmp = tmp_path_factory.mktemp("manage")
    env = server_env(tmp, GRPO_QUEUE=QUEUE, GRPO_EMBEDDED_WORKER="0", GRPO_CHECKPOINT_DIR=str(tmp / "checkpoints"))
    upgrade_database(env["GRPO_DATABASE_URL"])
    try:
        with running_server(tmp, env) as (url, _, _):
            yield Client(url, verbose=False), env["GRPO_DATABASE_URL"], tmp / "checkpoints"
    finally:
        make_engine(env["GRPO_DATABASE_URL"]).dispose()


@pytest.mark.slow
def test_endpoints_wait_logs_rename_annotate_archive_delete(live):
    client, db_url, checkpoints = live
    run_id = client.predict({"name": "api"}, api_name="/launch_run")["run_id"]
    with session_scope(db_url) as s:
        for i in range(3):
            store.append_log(s, run_id, f"line {i}")
    assert client.predict(run_id, 2, api_name="/get_logs") == ["line 1", "line 2"]
    assert client.predict(run_id, 1, api_name="/wait_run")["status"] == "queued"  # the timeout passed
    threading.Timer(0.5, _cancel, (db_url, run_id)).start()
    assert client.predict(run_id, 30, api_name="/wait_run")["status"] == "cancelled"
    assert client.predict(run_id, "renamed", api_name="/rename_run")["name"] == "renamed"
    run = client.predict(run_id, "why", ["a", "b"], api_name="/annotate_run")
    assert (run["notes"], run["tags"]) == ("why", ["a", "b"])
    run = client.predict(run_id, tags="c, d", api_name="/annotate_run")  # notes left out: kept
    assert (run["notes"], run["tags"]) == ("why", ["c", "d"])
    assert client.predict(run_id, True, api_name="/archive_run")["archived"] is True
    (checkpoints / f"run-{run_id}").mkdir(parents=True)
    assert client.predict(run_id, api_name="/delete_run") == {
        "run_id": run_id,
        "deleted": True,
        "checkpoints": "removed",
    }
    with pytest.raises(AppError, match=f"run {run_id} not found"):
        client.predict(run_id, api_name="/get_run")
    with pytest.raises(AppError, match="name must not be empty"):
        client.predict(1, " ", api_name="/rename_run")


def _cancel(db_url: str, run_id: int) -> None:
    """Cancel a queued run in the store, as the dashboard does."""
    with session_scope(db_url) as s:
        store.request_cancel(s, run_id)


@pytest.mark.slow
def test_view_api_describes_the_new_endpoints_and_the_export_as_a_file(live):
    client, _, _ = live
    named = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/get_logs", "/wait_run", "/rename_run", "/annotate_run", "/archive_run", "/delete_run"} <= set(named)
    assert named["/export_run"]["returns"][0]["python_type"]["type"] == "filepath"
    assert named["/upload_dataset"]["parameters"][0]["python_type"]["type"] == "filepath"
    assert [p["parameter_name"] for p in named["/annotate_run"]["parameters"]] == ["run_id", "notes", "tags"]
