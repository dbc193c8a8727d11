"""app.service.api over a real SQLite store and a real embedded broker (kombu's SQLAlchemy transport).

Each test points the settings (environment) at a fresh migrated SQLite file and a fresh
``sqla+sqlite`` broker file, so ``launch_run`` writes a real row and puts a real message.
"""

from __future__ import annotations

import pytest
from kombu import Connection

from app import store
from app.core.broker import RUN_TASK
from app.service import api, manage_api
from app.store.db import session_scope
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.spec.config import RunSpec

QUEUE = "grpo-test"


@pytest.fixture
def broker_url(sqlite_url, tmp_path, monkeypatch):
    """Settings pointed at the test store and a broker file in tmp_path; returns the broker URL."""
    url = f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}"
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("GRPO_BROKER_URL", url)
    monkeypatch.setenv("GRPO_QUEUE", QUEUE)
    return url


def broker_messages(url: str) -> list:
    """Every message waiting on the test queue, as (task name, args)."""
    found = []
    with Connection(url) as connection:
        queue = connection.SimpleQueue(QUEUE)
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                return found
            found.append((message.headers["task"], message.payload[0]))


# ---- launch -----------------------------------------------------------------------------------


def test_launch_with_defaults_queues_a_row_and_a_message(broker_url):
    result = api.launch_run({})
    assert result == {"run_id": result["run_id"], "status": "queued"}
    run = api.get_run(result["run_id"])
    assert run["status"] == "queued" and run["step"] == 0
    spec = RunSpec().to_dict()
    assert run["total_steps"] == spec["iterations"] * spec["steps_per_iteration"]
    # the default name is "<model>-<YYYYmmdd-HHMMSS>", stored in the config too
    assert run["name"].startswith(f"{spec['model']}-") and len(run["name"]) == len(spec["model"]) + 16
    assert run["config"] == {**spec, "name": run["name"]}
    assert broker_messages(broker_url) == [(RUN_TASK, [result["run_id"]])]


def test_launch_accepts_json_text_and_keeps_given_values(broker_url):
    result = api.launch_run('{"name": "mine", "group_size": 4, "learning_rate": "0.01", "iterations": 2.0}')
    run = api.get_run(result["run_id"])
    assert run["name"] == "mine"
    assert run["config"]["group_size"] == 4 and run["config"]["learning_rate"] == 0.01
    assert run["total_steps"] == 2 * RunSpec().steps_per_iteration
    assert broker_messages(broker_url) == [(RUN_TASK, [result["run_id"]])]


def test_default_name_uses_the_last_part_of_a_model_id(broker_url, monkeypatch):
    monkeypatch.setenv(
        "GRPO_HUB_CHECK_SECONDS", "0"
    )  # the Hub is out of reach here; tests/engine/spec/test_hub.py checks it
    run_id = api.launch_run({"model": "Qwen/Qwen2.5-0.5B-Instruct"})["run_id"]
    assert api.get_run(run_id)["name"].startswith("Qwen2.5-0.5B-Instruct-")


BAD_SPECS = [
    ({"group_size": 1}, "group_size", "at least 2"),
    ({"group_size": "many"}, "group_size", "integer"),
    ({"batch_size": 0}, "batch_size", "at least 1"),
    ({"clip_eps": 0}, "clip_eps", "greater than 0"),
    ({"kl_coef": -0.1}, "kl_coef", "at least 0"),
    ({"learning_rate": "fast"}, "learning_rate", "number"),
    ({"iterations": 2.5}, "iterations", "integer"),
    ({"steps_per_iteration": True}, "steps_per_iteration", "boolean"),
    ({"supervision": "both"}, "supervision", "'outcome', 'process'"),
    ({"reward": "learned"}, "reward", "must be one of"),
    ({"reward": "rule", "reward_model": "x/y"}, "reward_model", "only used with reward"),
    ({"temperature": 0}, "temperature", "greater than 0"),
    ({"top_p": 1.5}, "top_p", "at most 1"),
    ({"model": ""}, "model", "empty"),
    ({"dataset": 3}, "dataset", "string"),
    ({"lora_rank": -1}, "lora_rank", "at least 0"),
    ({"max_new_tokens": 0}, "max_new_tokens", "at least 1"),
    ({"rm_replay_ratio": 2}, "rm_replay_ratio", "at most 1"),
    ({"seed": "x"}, "seed", "integer"),
    ({"grop_size": 8}, "grop_size", "unknown key"),
]


@pytest.mark.parametrize("spec,key,words", BAD_SPECS, ids=[key for _, key, _ in BAD_SPECS])
def test_bad_spec_is_refused_naming_the_key(broker_url, spec, key, words):
    with pytest.raises(api.ApiError) as caught:
        api.launch_run(spec)
    message = str(caught.value)
    assert message.startswith(f"{key}: ") and words in message
    assert caught.value.key == key  # the key itself, for a form to mark its field without reading the message
    assert api.list_runs() == [] and broker_messages(broker_url) == []


@pytest.mark.parametrize(
    "spec,words", [("{not json", "not valid JSON"), ("[1, 2]", "JSON object"), ([1], "JSON object")]
)
def test_spec_that_is_not_an_object_is_refused(broker_url, spec, words):
    with pytest.raises(api.ApiError, match=words) as caught:
        api.launch_run(spec)
    assert caught.value.key is None and api.list_runs() == []


def test_unreachable_broker_fails_the_run(broker_url, monkeypatch):
    monkeypatch.setenv("GRPO_BROKER_URL", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    with pytest.raises(api.ApiError, match="could not reach the broker"):
        api.launch_run({"name": "lost"})
    [run] = api.list_runs()
    assert run["status"] == "failed"
    assert "could not reach the broker at redis://127.0.0.1:1/0" in api.get_run(run["run_id"])["error"]


# ---- list / get / cancel ---------------------------------------------------------------------


def test_list_and_get_runs(broker_url):
    first = api.launch_run({"name": "a"})["run_id"]
    second = api.launch_run({"name": "b", "supervision": "process"})["run_id"]
    runs = api.list_runs()
    assert [r["run_id"] for r in runs] == [second, first]  # newest first
    assert set(runs[0]) == {
        "run_id",
        "name",
        "status",
        "model",
        "dataset",
        "supervision",
        "step",
        "total_steps",
        "created_at",
        "started_at",
        "finished_at",
        "phase",
        "phase_done",
        "phase_total",
        "notes",
        "tags",
        "archived",
    }
    assert runs[0]["supervision"] == "process" and runs[1]["name"] == "a"
    run = api.get_run(first)
    assert {"run_id", "name", "status", "config", "step", "total_steps", "error", "started_at", "finished_at"} <= set(
        run
    )
    assert run["started_at"] is None and run["error"] is None
    # ids as clients send them
    assert api.get_run(str(first))["run_id"] == first and api.get_run(float(first))["run_id"] == first


@pytest.mark.parametrize("bad", ["abc", 1.5, None, True])
def test_bad_ids_are_refused(broker_url, bad):
    with pytest.raises(api.ApiError, match="run_id must be an integer"):
        api.get_run(bad)


def test_unknown_ids_are_refused(broker_url):
    for call in (
        api.get_run,
        api.get_metrics,
        api.get_logs,
        api.list_groups,
        api.cancel_run,
        manage_api.wait_run,
        manage_api.archive_run,
        manage_api.delete_run,
        manage_api.annotate_run,
        lambda run_id: manage_api.rename_run(run_id, "x"),
    ):
        with pytest.raises(api.ApiError, match="^run 12 not found$"):
            call(12)
    with pytest.raises(api.ApiError, match="^group 7 not found$"):
        api.get_group(7)


def test_cancel_queued_running_and_finished_runs(broker_url):
    queued, running, done = (api.launch_run({"name": n})["run_id"] for n in ("q", "r", "d"))
    with session_scope() as s:
        store.mark_running(s, running, total_steps=40)
        store.mark_running(s, done, total_steps=40)
        store.finish_run(s, done, "completed")
    assert api.cancel_run(queued) == {"run_id": queued, "status": "cancelled"}
    assert api.get_run(queued)["finished_at"] is not None
    assert api.cancel_run(str(running)) == {"run_id": running, "status": "running"}
    assert api.get_run(running)["cancel_requested"] is True
    assert api.cancel_run(done) == {"run_id": done, "status": "completed"}


# ---- metrics and groups -------------------------------------------------------------------------


def _group(prompt: str, rewards: list[float]) -> dict:
    samples = [
        SampleRecord(
            completion=f"{r:g}",
            tokens=[" 4", "\n", "<eos>"],
            reward=r,
            advantages=[r - 0.5] * 3,
            reward_components={"correct": r},
        )
        for r in rewards
    ]
    return GroupRecord(prompt=prompt, reference="4", samples=samples).to_dict()


def test_a_process_groups_step_rewards_name_their_source(broker_url):
    for spec, source in (
        ({}, "the built-in task's exact step checker"),
        ({"step_labels": "rollouts", "label_rollouts": 2}, "rollouts, N=2, hard estimate"),
        ({"reward": "model"}, "the learned PRM's scores"),
    ):
        run_id = api.launch_run({"supervision": "process", **spec})["run_id"]
        with session_scope() as s:
            store.record_groups(s, run_id, 1, [_group("2+2=", [0.0, 1.0])])
        group_id = api.list_groups(run_id, 1)[0]["group_id"]
        assert api.get_group(group_id)["step_labels"] == source


def test_metrics_and_groups(broker_url):
    run_id = api.launch_run({"group_size": 2})["run_id"]
    with session_scope() as s:
        store.record_step(s, run_id, 1, 0, {"reward_mean": 0.25, "kl": 0.0, "loss": 0.1})
        store.record_step(s, run_id, 2, 0, {"reward_mean": 0.5, "kl": 0.01, "loss": 0.05, "eval/accuracy": 0.5})
        store.record_groups(s, run_id, 1, [_group("2+2=", [0.0, 1.0])])
        store.record_groups(s, run_id, 2, [_group("1+3=", [1.0, 1.0]), _group("3+1=", [0.0, 0.0])])

    metrics = api.get_metrics(run_id)
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[1] == {"step": 2, "iteration": 0, "reward_mean": 0.5, "kl": 0.01, "loss": 0.05, "eval/accuracy": 0.5}
    assert api.get_run(run_id)["step"] == 2

    latest = api.list_groups(run_id, None)  # default: the latest step with groups
    assert [g["prompt"] for g in latest] == ["1+3=", "3+1="]
    assert set(latest[0]) == {"group_id", "step", "prompt", "reward_mean", "reward_std", "kind"}
    assert latest[0]["step"] == 2 and latest[0]["reward_std"] == 0.0
    assert api.list_groups(run_id, "") == latest
    [first] = api.list_groups(run_id, "1")
    assert first["reward_mean"] == 0.5 and first["reward_std"] == 0.5
    assert api.list_groups(run_id, 5) == []
    assert api.group_steps(run_id) == [1, 2]

    group = api.get_group(str(first["group_id"]))
    assert {"group_id", "run_id", "step", "prompt", "reference", "samples"} <= set(group)
    assert (group["run_id"], group["step"], group["reference"]) == (run_id, 1, "4")
    assert group["step_labels"] is None  # outcome supervision: no step rewards
    sample = group["samples"][1]
    assert {"sample_id", "completion", "tokens", "reward", "step_rewards", "step_end_indices", "advantages"} <= set(
        sample
    )
    assert sample["tokens"] == [" 4", "\n", "<eos>"] and sample["advantages"] == [0.5, 0.5, 0.5]
    assert sample["reward"] == 1.0 and sample["step_end_indices"] is None


def test_logs(broker_url):
    run_id = api.launch_run({})["run_id"]
    with session_scope() as s:
        for i in range(3):
            store.append_log(s, run_id, f"line {i}")
    assert api.get_logs(run_id) == ["line 0", "line 1", "line 2"]
    assert api.get_logs(run_id, 2) == ["line 1", "line 2"]
