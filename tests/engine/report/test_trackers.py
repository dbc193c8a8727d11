"""report_to: a short real run of the built-in model mirrored to TensorBoard, MLflow and W&B (offline), each read
back with its own reader; the run spec's refusals; a tracker that fails mid-run; and the worker's path.

TensorBoard is read with its EventAccumulator, MLflow with MlflowClient, and W&B's offline run from its ``.wandb``
file: a LevelDB-style log of the protobuf ``Record``s W&B ships (wandb.proto.wandb_internal_pb2), whose ``history``
records hold each step's values (W&B has no reader of its own for it any more).
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from pathlib import Path
from urllib.parse import urlparse

import pytest

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.report.trackers import COLUMNS, TrackerRecorder
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.train.trainer import train

RUN = dict(
    name="mirrored",
    batch_size=2,
    group_size=4,
    steps_per_iteration=3,
    max_new_tokens=16,
    eval_every=0,
    report_to=["tensorboard", "mlflow", "wandb"],
)
WANDB_BLOCK = 32768  # a .wandb file's records are in blocks of this many bytes, each record with a 7-byte header


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One data directory for the module's runs (each with its own run id): MLflow creates its SQLite database once."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def tracker_env(monkeypatch):
    """W&B offline and quiet; MLflow and W&B on their defaults (no server, experiment or project from outside)."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_DIR", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def mirrored_run(cache_dir, data_dir, inner, **overrides):
    """Train a short run reporting to ``inner`` through a TrackerRecorder writing under ``data_dir``; returns the
    train result and the trackers it opened."""
    spec = validate_spec({**RUN, **overrides})
    with TrackerRecorder.open(
        inner, spec.report_to, data_dir, run_id=7, run_name=spec.name, config=spec.to_dict()
    ) as recorder:
        trackers = {t.name: t for t in recorder.trackers}
        result = train(spec, recorder, cache_dir, device="cpu")
    return result, trackers


def tensorboard_scalars(directory, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def tensorboard_text(directory, tag: str) -> dict[int, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(tag)}


def wandb_history(run_dir) -> dict[int, dict]:
    """An offline W&B run's history, step -> {key: value}, read from its .wandb file."""
    from wandb.proto import wandb_internal_pb2

    data = next(run_dir.glob("*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    history, pos, pending = {}, 7, b""
    while pos + 7 <= len(data):
        if WANDB_BLOCK - pos % WANDB_BLOCK < 7:  # a block's tail too short for a header is padding
            pos += WANDB_BLOCK - pos % WANDB_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
                history[row["_step"]] = row
    return history


def test_a_run_mirrors_every_metric_and_its_groups_to_each_tracker(data_dir, grpo_cache_dir, tracker_env):
    from mlflow.tracking import MlflowClient

    memory = MemoryRecorder()
    result, trackers = mirrored_run(grpo_cache_dir, data_dir, memory)
    assert result.status == "completed"
    expected = {m["step"]: m["reward_mean"] for m in memory.metrics}
    assert sorted(expected) == [1, 2, 3]
    uri = f"sqlite:///{data_dir / 'mlflow.db'}"
    assert [m for m in memory.messages if m.startswith("report_to")] == [
        f"report_to: tensorboard -> {data_dir / 'tensorboard' / 'run-7'}, mlflow -> {uri}, "
        "wandb -> grpo-dashboard (offline)"
    ]

    # TensorBoard: every metric, and a text table of the groups at each recorded step
    scalars = tensorboard_scalars(data_dir / "tensorboard" / "run-7", "reward_mean")
    assert scalars == pytest.approx(expected, rel=1e-6)
    assert tensorboard_scalars(data_dir / "tensorboard" / "run-7", "time/step").keys() == {1, 2, 3}
    text = tensorboard_text(data_dir / "tensorboard" / "run-7", "sampled_groups/text_summary")
    assert sorted(text) == [1, 2, 3] and text[2].splitlines()[0] == "| " + " | ".join(COLUMNS) + " |"
    assert len(text[2].splitlines()) == 2 + 2 * 4 and f"| 2 | 1 | 3 | {memory.group_log[2][1].prompt} |" in text[2]

    # MLflow: the metric history, the run spec as parameters, a table per recorded step, the run finished
    client, run_id = MlflowClient(uri), trackers["mlflow"].run_id
    history = {m.step: m.value for m in client.get_metric_history(run_id, "reward_mean")}
    assert history == pytest.approx(expected)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "mirrored" and run.data.params["group_size"] == "4"
    assert run.info.artifact_uri.startswith((data_dir / "mlflow-artifacts").as_uri())
    artifacts = [a.path for a in client.list_artifacts(run_id, "sampled_groups")]
    assert artifacts == [f"sampled_groups/step-00000{s}.json" for s in (1, 2, 3)]
    table = json.loads(Path(urlparse(run.info.artifact_uri).path, "sampled_groups", "step-000002.json").read_text())
    assert table["columns"] == list(COLUMNS) and len(table["data"]) == 2 * 4
    row = dict(zip(COLUMNS, table["data"][0], strict=True))
    sample = memory.group_log[2][0].samples[0]
    assert (row["step"], row["question"], row["completion"]) == (2, memory.group_log[2][0].prompt, sample.completion)
    assert row["reward"] == pytest.approx(sample.reward)

    # W&B (offline): the history of every step, and a groups table
    run_dir = next((data_dir / "wandb" / "wandb").glob("offline-run-*"))
    rows = wandb_history(run_dir)
    assert {step: row["reward_mean"] for step, row in rows.items()} == pytest.approx(expected)
    assert all(
        rows[s]["sampled_groups/_type"] == "table-file" and rows[s]["sampled_groups/nrows"] == 8 for s in (1, 2, 3)
    )
    saved = json.loads((run_dir / "files" / rows[3]["sampled_groups/path"]).read_text())
    assert saved["columns"] == list(COLUMNS) and len(saved["data"]) == 8


def test_report_to_takes_known_installed_trackers_as_a_list_or_comma_separated_text(monkeypatch):
    assert validate_spec({}).report_to == []
    assert validate_spec({"report_to": "tensorboard, wandb"}).report_to == ["tensorboard", "wandb"]
    assert validate_spec({"report_to": '["mlflow"]'}).report_to == ["mlflow"]
    assert validate_spec({"report_to": ""}).report_to == []
    for bad, says in [
        (["neptune"], "unknown tracker 'neptune'; the trackers are 'tensorboard', 'mlflow', 'wandb'"),
        ("tensorboard, comet", "unknown tracker 'comet'"),
        (["wandb", "wandb"], "names 'wandb' twice"),
        (3, "must be a list of tracker names"),
        ({"wandb": 1}, "must be a list of tracker names"),
    ]:
        with pytest.raises(SpecError, match="^report_to: " + says) as refused:
            validate_spec({"report_to": bad})
        assert refused.value.key == "report_to"

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    assert validate_spec({"report_to": ["tensorboard", "wandb"]}).report_to == ["tensorboard", "wandb"]
    with pytest.raises(SpecError, match="'mlflow' is not installed on this machine: pip install mlflow-skinny"):
        validate_spec({"report_to": "tensorboard, mlflow"})


class DeletesTheMlflowRun(MemoryRecorder):
    """Records in memory; after step 1 is recorded, deletes the run's MLflow run, as a user cleaning up the tracker
    mid-run would (MLflow then refuses every later write to it)."""

    def __init__(self):
        super().__init__()
        self.trackers: dict = {}  # name -> the run's tracker, set once they are open

    def step(self, step, iteration, metrics):
        super().step(step, iteration, metrics)
        if step == 1:
            mlflow = self.trackers["mlflow"]
            mlflow.client.delete_run(mlflow.run_id)


def test_a_tracker_that_fails_mid_run_is_dropped_with_one_line_and_the_run_completes(
    data_dir, grpo_cache_dir, tracker_env
):
    inner = DeletesTheMlflowRun()
    spec = validate_spec({**RUN, "report_to": ["tensorboard", "mlflow"]})
    with TrackerRecorder.open(
        inner, spec.report_to, data_dir, run_id=8, run_name=spec.name, config=spec.to_dict()
    ) as recorder:
        inner.trackers = {t.name: t for t in recorder.trackers}
        result = train(spec, recorder, grpo_cache_dir, device="cpu")
    assert result.status == "completed" and [m["step"] for m in inner.metrics] == [1, 2, 3]
    dropped = [m for m in inner.messages if m.startswith("report_to mlflow")]
    assert len(dropped) == 1 and dropped[0].endswith("; metrics are no longer sent to it"), inner.messages
    assert "MlflowException" in dropped[0]
    assert tensorboard_scalars(data_dir / "tensorboard" / "run-8", "reward_mean").keys() == {1, 2, 3}


def test_the_worker_mirrors_a_stored_run_to_tensorboard(tmp_path, grpo_cache_dir, monkeypatch):
    """execute_run on a fresh SQLite store: the run completes, its log says where TensorBoard writes, and the event
    files under the data directory hold every step."""
    from app import store
    from app.store.db import session_scope, upgrade_database
    from workers.runner import execute_run

    url = f"sqlite:///{tmp_path / 'grpo.sqlite'}"
    for name in [k for k in os.environ if k.startswith("GRPO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_DATABASE_URL", url)
    monkeypatch.setenv("GRPO_CACHE_DIR", str(grpo_cache_dir))
    upgrade_database(url)
    spec = validate_spec({**RUN, "report_to": "tensorboard", "steps_per_iteration": 2}).to_dict()
    with session_scope(url) as s:
        run_id = store.create_run(s, spec, spec["name"])
    assert execute_run(run_id) == "completed"
    with session_scope(url) as s:
        logs = store.get_logs(s, run_id)
    where = tmp_path / "tensorboard" / f"run-{run_id}"
    assert f"report_to: tensorboard -> {where}" in logs
    assert tensorboard_scalars(where, "reward_mean").keys() == {1, 2}


def test_tensorboard_replaces_the_steps_after_the_checkpoint_a_run_resumes_from(tmp_path):
    """A second attempt resumed after step 1 records steps 2 and 3 again: TensorBoard shows its values, not the first
    attempt's."""
    from grpo_engine.report.trackers import TensorBoardTracker

    first = TensorBoardTracker(tmp_path)
    first.resume(0)
    for step in (1, 2, 3):
        first.metrics(step, {"reward_mean": step / 10})
    first.close("failed")
    again = TensorBoardTracker(tmp_path)
    again.resume(1)
    for step in (2, 3):
        again.metrics(step, {"reward_mean": step})
    again.close("completed")
    assert tensorboard_scalars(tmp_path, "reward_mean") == pytest.approx({1: 0.1, 2: 2.0, 3: 3.0})
