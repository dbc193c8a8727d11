"""What ``grpo-dashboard train`` shows and hears in the terminal while its run trains: a progress bar
with the latest metrics and the run's phase, the engine's log lines, and Ctrl-C to cancel the run.

Imported only when ``train`` runs: it brings in the store's recorder and tqdm, which the other
commands (and ``--help``) do not need.
"""

from __future__ import annotations

import signal
import threading

from tqdm import tqdm

from grpo_engine.report.metrics import METRIC_REGISTRY
from workers.recorder import DBRecorder

PROGRESS_METRICS = tuple(m.name for m in METRIC_REGISTRY if m.headline)  # shown next to `train`'s progress bar


class ProgressBar:
    """A bar of the run's steps with the PROGRESS_METRICS of the last one next to it. It opens when the
    run starts, or at the first step shown (a data-parallel run's steps are recorded by its processes).
    The run's phase is printed as a line while the bar is not open yet (loading), then written before the
    bar, with its count, whenever the run is doing something other than a training step."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None
        self.phase: str | None = None  # the last phase shown

    def open(self, total_steps: int) -> None:
        self.bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True)

    def show(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
        """Move the bar to ``step`` and show that step's metrics."""
        if self.bar is None:
            self.open(total_steps)
        shown = {k: f"{v:.3g}" for k, v in metrics.items() if k in PROGRESS_METRICS}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(step - self.bar.n)

    def show_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """Show the run's phase: a line when a new one starts before the bar is open, else the bar's
        description (none while training: the bar itself counts the steps)."""
        if self.bar is None:
            if name != self.phase:
                tqdm.write(f"[{name}]")
        elif name == "training":
            self.bar.set_description_str("")
        else:
            self.bar.set_description_str(name if done is None or total is None else f"{name} {done}/{total}")
        self.phase = name

    def close(self) -> None:
        """Leave the bar as it ended, without the phase it was in (the run is over)."""
        if self.bar is not None:
            self.bar.set_description_str("", refresh=False)
            self.bar.close()


class ProgressRecorder(DBRecorder):
    """The DB recorder, plus a progress bar, the engine's log lines in the terminal, and Ctrl-C to cancel.

    ``progress``: the bar it draws on (the caller closes it); ``cancel``: set when the user pressed Ctrl-C,
    the run then stops as cancelled at its next step. The other arguments are DBRecorder's."""

    def __init__(self, run_id: int, *, progress: ProgressBar, cancel: threading.Event, **kwargs) -> None:
        super().__init__(run_id, **kwargs)
        self.progress, self.cancel = progress, cancel

    def start(self, total_steps: int) -> None:
        super().start(total_steps)
        self.progress.open(total_steps)

    def log(self, message: str) -> None:
        super().log(message)
        tqdm.write(message)

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        super().step(step, iteration, metrics)
        if self.progress.bar is not None:
            self.show(step, self.progress.bar.total, metrics)

    def show(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
        """Move the bar to ``step`` (also called for the steps a data-parallel run's processes record)."""
        self.progress.show(step, total_steps, metrics)

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """Record the phase (DBRecorder) and show it in the terminal."""
        super().phase(name, done, total)
        self.show_phase(name, done, total)

    def show_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """Show the run's phase (also called for the phases a data-parallel run's main process records)."""
        self.progress.show_phase(name, done, total)

    def should_stop(self) -> bool | str:
        if self.cancel.is_set():
            self.stop_reason = "cancel"
        return super().should_stop()


class CancelOnCtrlC:
    """A context manager: inside it, the first Ctrl-C sets ``pressed`` (the run is cancelled at its next
    step) and a second one stops at once (KeyboardInterrupt); on the way out Ctrl-C interrupts again."""

    def __init__(self) -> None:
        self.pressed = threading.Event()

    def _first_ctrl_c(self, signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        tqdm.write("cancelling at the next step (Ctrl-C again to stop now)")
        self.pressed.set()

    def __enter__(self) -> "CancelOnCtrlC":
        signal.signal(signal.SIGINT, self._first_ctrl_c)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
