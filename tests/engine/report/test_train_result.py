"""TrainResult: how a run's training ended, as train() returns it and as a data-parallel run's main process sends it
to the worker (JSON between processes)."""

from __future__ import annotations

from grpo_engine.report.recorder import TrainResult, TrainStatus


def test_a_result_crosses_processes_as_json_unchanged():
    for result in (
        TrainResult(TrainStatus.PAUSED, 3, {"loss": 0.25}, stop_reason="pause"),
        TrainResult(TrainStatus.STOPPED, stop_reason="lost"),
        TrainResult(TrainStatus.FAILED, error="the run's processes exited with status 1", log="Traceback ..."),
    ):
        back = TrainResult.from_json(result.to_json())
        assert back == result and isinstance(back.status, TrainStatus)


def test_a_status_compares_equal_to_its_word():
    assert TrainResult(TrainStatus.COMPLETED, 4).status == "completed"  # the statuses are strings, as JSON has them
