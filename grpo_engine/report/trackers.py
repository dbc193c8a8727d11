"""Mirror a run's metrics, and a table of its sampled groups, to the trackers users keep (the run spec's ``report_to``):
TensorBoard, MLflow and Weights & Biases.

:class:`TrackerRecorder` wraps the recorder a run reports to: every event goes on to it unchanged, and each step's
metrics, and each recorded step's groups as a table, also go to the trackers. A tracker that fails is dropped with one
line in the run's log; the run goes on. Each tracker's library is imported when the tracker is opened, never at import.
Pure engine layer: no store, no Celery, no Gradio.

Where each tracker writes (``data_dir``: the dashboard's data directory):

- tensorboard: event files in ``<data_dir>/tensorboard/run-<run id>`` (torch.utils.tensorboard's SummaryWriter).
- mlflow: the tracking server or store of MLFLOW_TRACKING_URI, else ``sqlite:///<data_dir>/mlflow.db`` with artifacts
  in ``<data_dir>/mlflow-artifacts`` (MLflow 3 refuses its old file store ``./mlruns`` by default and documents a
  SQLite database for local use); the experiment MLFLOW_EXPERIMENT_NAME, else "grpo-dashboard".
- wandb: the project WANDB_PROJECT, else "grpo-dashboard", its files in ``<data_dir>/wandb``; WANDB_MODE (``offline``
  needs no network and no login), WANDB_API_KEY and W&B's other variables apply.

An attempt of a run that resumes from a checkpoint opens a new MLflow and W&B run; TensorBoard purges the steps after
the checkpoint and records them again.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from grpo_engine.report.recorder import EvalQuestion, GroupRecord, Recorder, TrainStatus

logger = logging.getLogger("grpo.trackers")

PROJECT = "grpo-dashboard"  # the MLflow experiment and the W&B project when the environment names none
COLUMNS = ("step", "group", "sample", "question", "completion", "reward", "correct")  # a groups table's columns
TABLE = "sampled_groups"  # the groups table's name in each tracker, apart from the metrics named groups/...
TEXT_GROUPS = 5  # TensorBoard's text table shows this many groups of a step
TEXT_CHARS = 300  # and cuts each completion to this many characters
MLFLOW_KEY_LENGTH = 250  # MLflow's longest metric name
MLFLOW_PARAM_LENGTH = 500  # the longest parameter value every MLflow version takes


def one_line(exc: BaseException) -> str:
    """An error as one short line: 'ValueError: first line of the message' (its final period dropped, as a ';' may
    follow)."""
    text = str(exc).strip().splitlines()
    return (f"{type(exc).__name__}: {text[0].rstrip('.')}" if text else type(exc).__name__)[:300]


def metric_values(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a tracker is sent: each as a float, None and NaN left out (a step without that value).

    >>> metric_values({"loss": 0.5, "kl": None, "eval/accuracy": float("nan"), "sampling/drawn": 4})
    {'loss': 0.5, 'sampling/drawn': 4.0}
    """
    return {k: float(v) for k, v in metrics.items() if v is not None and not math.isnan(v)}


def mlflow_key(name: str) -> str:
    """A metric name as MLflow takes it on every platform: letters, digits, '_', '-', '.', ' ' and '/' kept, any other
    character (a custom reward's ':') made '_', and no part of the path empty, '.' or '..' (MLflow refuses a name that
    would resolve to another path); at most 250 characters.

    >>> mlflow_key("time/step"), mlflow_key("reward//srv/my_rewards.py:brevity"), mlflow_key("reward/../x")
    ('time/step', 'reward/srv/my_rewards.py_brevity', 'reward/_/x')
    """
    parts = [re.sub(r"[^\w.\- ]", "_", part) for part in name.split("/") if part]
    key = "/".join("_" if part in (".", "..") else part for part in parts)
    return key[:MLFLOW_KEY_LENGTH].rstrip("/") or "_"


def group_rows(step: int, groups: list[GroupRecord]) -> list[list]:
    """A step's groups as table rows, one per sampled output, in COLUMNS order; ``correct`` is the verifier's verdict
    (None when the output has none)."""
    rows = []
    for g, group in enumerate(groups):
        for i, sample in enumerate(group.samples):
            verdict = sample.reward_components.get("correct")
            rows.append(
                [
                    step,
                    g,
                    i,
                    group.prompt,
                    sample.completion,
                    float(sample.reward),
                    None if verdict is None else verdict > 0,
                ]
            )
    return rows


def markdown_table(rows: list[list]) -> str:
    """The rows of the first TEXT_GROUPS groups as a markdown table (TensorBoard's text tab), each completion cut to
    TEXT_CHARS characters, '|' escaped and line breaks as <br>."""

    def cell(value: Any) -> str:
        text = str(value)
        text = text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "…"
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows if row[1] < TEXT_GROUPS]
    return "\n".join(lines)


class Tracker:
    """One tracker a run reports to: what it is called, where it writes, and what it is sent. ``close(outcome)``: a
    TrainStatus, completed, failed, or stopped (cancelled, paused or taken over)."""

    name = ""
    where = ""  # for the run's log: "tensorboard -> /path"

    def resume(self, step: int) -> None:
        """The run goes on after ``step`` (0: from the start); what an earlier attempt sent for later steps is void."""

    def flush(self) -> None:
        """Write out what was sent so far (before a checkpoint)."""

    def metrics(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def table(self, step: int, rows: list[list]) -> None:
        raise NotImplementedError

    def close(self, outcome: str) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    """Scalars and a text table of groups, in TensorBoard event files under ``directory``."""

    name = "tensorboard"

    def __init__(self, directory: Path):
        from torch.utils.tensorboard import SummaryWriter  # the worker has torch; it needs the tensorboard package

        self.directory, self._writer_class = directory, SummaryWriter
        self.writer = SummaryWriter(str(directory))
        self.where = str(directory)

    def resume(self, step: int) -> None:
        """Reopen the writer so that TensorBoard drops what an earlier attempt wrote for the steps after ``step``
        (SummaryWriter's purge_step: every step from step + 1 on, or all of them when the run starts over)."""
        self.writer.close()
        self.writer = self._writer_class(str(self.directory), purge_step=step + 1 if step else 0)

    def flush(self) -> None:
        self.writer.flush()

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def table(self, step: int, rows: list[list]) -> None:
        self.writer.add_text(TABLE, markdown_table(rows), step)

    def close(self, outcome: str) -> None:
        self.writer.close()


class MLflowTracker(Tracker):
    """An MLflow run: the run spec as parameters, each step's metrics (names made valid by :func:`mlflow_key`), each
    recorded step's groups as a table artifact ``sampled_groups/step-<step>.json``. Through MlflowClient, so no global
    MLflow state (active run, tracking URI) of the process is touched."""

    name = "mlflow"
    STATUS = {TrainStatus.COMPLETED: "FINISHED", TrainStatus.FAILED: "FAILED"}  # anything else (a stop): KILLED

    def __init__(self, data_dir: Path, run_name: str, config: dict[str, Any]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{data_dir / 'mlflow.db'}"
        self.client = MlflowClient(uri)
        self.run_id = self.client.create_run(self._experiment(data_dir, uri), run_name=run_name).info.run_id
        params = [Param(k, str(v)[:MLFLOW_PARAM_LENGTH]) for k, v in config.items()]
        self.client.log_batch(self.run_id, params=params)
        self.where = uri

    def _experiment(self, data_dir: Path, uri: str) -> str:
        """The id of the experiment the run goes in, created when missing (a local store keeps its artifacts in
        ``<data_dir>/mlflow-artifacts``; a server decides where for itself)."""
        from mlflow.exceptions import MlflowException

        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        local = not os.environ.get("MLFLOW_TRACKING_URI")
        try:
            return self.client.create_experiment(
                name, artifact_location=(data_dir / "mlflow-artifacts").as_uri() if local else None
            )
        except MlflowException:  # another worker created it meanwhile
            return self.client.get_experiment_by_name(name).experiment_id

    def metrics(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_key(k), v, now, step) for k, v in values.items()])

    def table(self, step: int, rows: list[list]) -> None:
        """The rows as MLflow's table artifact (log_table, which needs pandas), or, without pandas, the same JSON
        ({"columns", "data"}) through log_dict."""
        artifact = f"{TABLE}/step-{step:06d}.json"
        try:
            import pandas
        except ImportError:
            self.client.log_dict(self.run_id, {"columns": list(COLUMNS), "data": rows}, artifact)
            return
        self.client.log_table(self.run_id, pandas.DataFrame(rows, columns=list(COLUMNS)), artifact)

    def close(self, outcome: str) -> None:
        self.client.set_terminated(self.run_id, self.STATUS.get(outcome, "KILLED"))


class WandbTracker(Tracker):
    """A W&B run: the run spec as its config, each step's metrics, each recorded step's groups as a wandb.Table
    (``sampled_groups``). A run object of its own (``reinit="create_new"``), so other W&B runs of the process are left
    alone."""

    name = "wandb"

    def __init__(self, data_dir: Path, run_name: str, config: dict[str, Any]):
        import wandb

        directory = data_dir / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        project = os.environ.get("WANDB_PROJECT") or PROJECT
        self.wandb = wandb
        self.run = wandb.init(
            project=project,
            dir=str(directory),
            name=run_name,
            config=config,
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )
        self.where = f"{project} ({'offline' if self.run.offline else self.run.url or 'online'})"

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def table(self, step: int, rows: list[list]) -> None:
        self.run.log({TABLE: self.wandb.Table(columns=list(COLUMNS), data=rows)}, step=step)

    def close(self, outcome: str) -> None:
        self.run.finish(exit_code=1 if outcome == TrainStatus.FAILED else 0)


def open_trackers(
    names: Iterable[str],
    data_dir: Path,
    *,
    run_id: int,
    run_name: str,
    config: dict[str, Any],
    warn: Callable[[str], None],
) -> list[Tracker]:
    """Open the trackers ``names`` for one run. One that cannot open (its library fails, W&B without a login, a
    server that does not answer) is left out, and ``warn`` gets one line saying why."""
    openers: dict[str, Callable[[], Tracker]] = {
        "tensorboard": lambda: TensorBoardTracker(data_dir / "tensorboard" / f"run-{run_id}"),
        "mlflow": lambda: MLflowTracker(data_dir, run_name, config),
        "wandb": lambda: WandbTracker(data_dir, run_name, config),
    }
    trackers = []
    for name in names:
        try:
            trackers.append(openers[name]())
        except Exception as exc:
            warn(f"report_to {name}: {one_line(exc)}; metrics are not sent to it")
    return trackers


class TrackerRecorder(Recorder):
    """A recorder that passes every event to ``inner`` and mirrors metrics and groups to ``trackers``. A context
    manager: leaving it closes the trackers, as failed when an exception ends the block, as stopped when
    ``should_stop`` said to stop, else as completed."""

    def __init__(self, inner: Recorder, trackers: list[Tracker]):
        self.inner, self.trackers = inner, list(trackers)
        self.stopped: bool | str = False  # what should_stop last returned, once truthy

    @classmethod
    def open(
        cls,
        inner: Recorder,
        names: Iterable[str],
        data_dir: Path,
        *,
        run_id: int,
        run_name: str,
        config: dict[str, Any],
    ) -> "TrackerRecorder":
        """Open the trackers ``names`` for a run (see :func:`open_trackers`) around ``inner``, and say in the run's
        log where each one writes."""
        mirrored = cls(inner, [])
        mirrored.trackers = open_trackers(
            names, Path(data_dir), run_id=run_id, run_name=run_name, config=config, warn=mirrored._warn
        )
        if mirrored.trackers:
            inner.log("report_to: " + ", ".join(f"{t.name} -> {t.where}" for t in mirrored.trackers))
        return mirrored

    def _warn(self, message: str) -> None:
        """A tracker's problem: in the worker's log, and in the run's log unless the inner recorder fails too."""
        logger.warning(message)
        try:
            self.inner.log(message)
        except Exception:  # the inner recorder's own error surfaces at its next event
            logger.warning("could not record: %s", message, exc_info=True)

    def _each(self, send: Callable[[Tracker], None]) -> None:
        """``send`` to every tracker; one that raises is dropped, with one line in the run's log."""
        for tracker in list(self.trackers):
            try:
                send(tracker)
            except Exception as exc:
                self.trackers.remove(tracker)
                self._warn(f"report_to {tracker.name}: {one_line(exc)}; metrics are no longer sent to it")

    def start(self, total_steps: int) -> None:
        self.inner.start(total_steps)

    def resume(self, step: int) -> None:
        self.inner.resume(step)
        self._each(lambda t: t.resume(step))

    def flush(self) -> None:
        self.inner.flush()
        self._each(lambda t: t.flush())

    def checkpoint(self, step: int, path: str) -> None:
        self.inner.checkpoint(step, path)

    def log(self, message: str) -> None:
        self.inner.log(message)

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        self.inner.phase(name, done, total)

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        self.inner.step(step, iteration, metrics)
        values = metric_values(metrics)
        self._each(lambda t: t.metrics(step, values))

    def groups(self, step: int, groups: list[GroupRecord]) -> None:
        self.inner.groups(step, groups)
        if self.trackers:
            rows = group_rows(step, groups)
            self._each(lambda t: t.table(step, rows))

    def evaluation(self, step: int, questions: list[EvalQuestion]) -> None:
        self.inner.evaluation(step, questions)

    def should_stop(self) -> bool | str:
        reason = self.inner.should_stop()
        if reason:
            self.stopped = reason
        return reason

    def close(self, failed: bool = False) -> None:
        """Finish every tracker's run (a tracker that fails to is named in the logs; the run's outcome stands)."""
        outcome = TrainStatus.FAILED if failed else TrainStatus.STOPPED if self.stopped else TrainStatus.COMPLETED
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close(outcome)
            except Exception as exc:
                self._warn(f"report_to {tracker.name}: {one_line(exc)} while closing")

    def __enter__(self) -> "TrackerRecorder":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.close(failed=exc is not None)
