"""The engine's Recorder, implemented against the store: every event the engine reports becomes rows.

One short transaction per event, so the dashboard sees each step as soon as it is done. A recorder
given a ``worker`` name writes only while that worker holds the run's lease (``app.store.LeaseLost``
otherwise). No torch here.

The worker's recorders write in the background (``background=True``): the events go, in order, to a
writer thread, so the training loop does not wait for the store (a step's groups are thousands of
values). A failed write (a lost lease, a store error) is raised in the training loop at its next
event; ``flush()`` (which the engine calls before it saves a checkpoint) and ``close()`` wait for every
queued write. So a crash loses at most the events still queued, all of them after the last checkpoint,
and a resumed run records those steps again.

Phases (what the run is doing now, and how far) go through the same writer. A new phase is written at
once; new counts of the same phase at most every PHASE_WRITE_SECONDS (a warm start or the reward model's
batches report many per second): the newest count held back is written with the next count after that
interval, or by ``flush()`` / ``close()``, and a new phase replaces it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from app import store
from app.core.settings import get_settings
from app.store.db import session_scope
from grpo_engine.report.recorder import EvalQuestion, GroupRecord, Recorder
from grpo_engine.report.trackers import TrackerRecorder
from grpo_engine.spec.config import RunSpec

logger = logging.getLogger("grpo.worker")

CANCEL_POLL_SECONDS = 1.0  # the store is asked about cancellation at most this often
QUEUED_WRITES = 16  # events a background writer may hold before the training loop waits for it
PHASE_WRITE_SECONDS = 0.5  # a phase's counts are written at most this often (a new phase at once)

# Set when the worker shuts down (Ctrl-C, SIGTERM, or the dashboard of an embedded worker stopped):
# the running job pauses at its next step boundary, after saving a checkpoint, and goes back to the queue.
interrupt = threading.Event()


class DBRecorder(Recorder):
    """Writes one run's engine events to the store (``database_url`` None = the configured store).

    ``worker``: the name of the worker holding the run's lease (None: no lease checks, e.g. tests).
    ``lease_lost``: an Event a LeaseKeeper sets when the lease was taken over; the run then stops.
    ``background``: write on a writer thread (see the module's docstring); call ``close()`` at the end.
    """

    def __init__(
        self,
        run_id: int,
        database_url: str | None = None,
        worker: str | None = None,
        lease_lost: threading.Event | None = None,
        background: bool = False,
    ):
        self.run_id = run_id
        self.database_url = database_url
        self.worker = worker
        self.lease_lost = lease_lost or threading.Event()
        self.stop_reason: str | None = None  # "cancel", "pause" or "lost" once should_stop() said so
        self._last_poll = float("-inf")
        self._pending_groups: tuple[int, list[dict]] | None = None  # (step, groups) until step() comes
        self._pending_evaluation: tuple[int, list[dict]] | None = None  # (step, questions) until step() comes
        self._phase_written: tuple[str | None, float] = (None, float("-inf"))  # the last phase written, and when
        self._held_phase: tuple[str, int | None, int | None] | None = None  # a newer count of it, not yet written
        self._writer = _Writer(database_url) if background else None

    def _write(self, write: Callable) -> None:
        """Run ``write(session)`` in a transaction: now, or queued for the writer thread."""
        if self._writer is not None:
            self._writer.put(write)
            return
        with session_scope(self.database_url) as s:
            write(s)

    def flush(self) -> None:
        """Wait until every event so far (a held-back phase count included) is in the store; raise what a
        background write raised."""
        self._write_held_phase()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Wait until every event (a held-back phase count included) is in the store and stop the writer; raise
        what a background write raised."""
        try:
            self._write_held_phase()
        finally:
            if self._writer is not None:
                self._writer.close()

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """The run's phase and its count, written in order with the other events: a new phase at once, a new
        count of the same phase at most every PHASE_WRITE_SECONDS (the newest one is held back until then, or
        until ``flush()`` / ``close()``)."""
        last_name, written_at = self._phase_written
        self._held_phase = (name, done, total)
        if name != last_name or time.monotonic() - written_at >= PHASE_WRITE_SECONDS:
            self._write_held_phase()

    def _write_held_phase(self) -> None:
        """Write the phase count held back by the throttle, if there is one."""
        held, self._held_phase = self._held_phase, None
        if held is not None:
            self._phase_written = (held[0], time.monotonic())
            self._write(lambda s: store.set_phase(s, self.run_id, *held, worker=self.worker))

    def start(self, total_steps: int) -> None:
        self._write(lambda s: store.mark_running(s, self.run_id, total_steps))

    def resume(self, step: int) -> None:
        """An earlier attempt's records after ``step`` are dropped: the steps are recorded again."""
        self._write(lambda s: store.truncate_after(s, self.run_id, step))

    def checkpoint(self, step: int, path: str) -> None:
        self._write(lambda s: store.record_checkpoint(s, self.run_id, step))

    def log(self, message: str) -> None:
        logger.info("run %s: %s", self.run_id, message)
        self._write(lambda s: store.append_log(s, self.run_id, message))

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        """The step's metrics, and the groups and the evaluation reported for it, in one transaction (which also
        renews the lease)."""
        pending, self._pending_groups = self._pending_groups, None
        evaluated, self._pending_evaluation = self._pending_evaluation, None

        def write(s) -> None:
            if pending is not None and pending[0] == step:
                store.record_groups(s, self.run_id, step, pending[1])
            if evaluated is not None and evaluated[0] == step:
                store.record_evaluation(s, self.run_id, step, evaluated[1])
            store.record_step(s, self.run_id, step, iteration, metrics, worker=self.worker)

        self._write(write)

    def groups(self, step: int, groups: list[GroupRecord]) -> None:
        """Held until the step's metrics come (the engine reports groups first), then written with them."""
        if self._pending_groups is not None:  # groups of a step that never reported metrics: write them now
            orphan = self._pending_groups
            self._write(lambda s: store.record_groups(s, self.run_id, *orphan))
        self._pending_groups = (step, [g.to_dict() for g in groups])

    def evaluation(self, step: int, questions: list[EvalQuestion]) -> None:
        """Held until the step's metrics come (the engine reports the evaluation first), then written with them."""
        self._pending_evaluation = (step, [q.to_dict() for q in questions])

    def should_stop(self) -> bool | str:
        """Why the run should stop now, or False: "lost" (another worker took the run over), "pause"
        (this worker is shutting down) or "cancel" (a user cancelled it in the store). A failed
        background write is raised here."""
        if self._writer is not None:
            self._writer.raise_error()
        if self.stop_reason is not None:
            return self.stop_reason
        if self.lease_lost.is_set():
            self.stop_reason = "lost"
        elif interrupt.is_set():
            self.stop_reason = "pause"
        else:
            now = time.monotonic()
            if now - self._last_poll < CANCEL_POLL_SECONDS:
                return False
            self._last_poll = now
            with session_scope(self.database_url) as s:
                if store.is_cancel_requested(s, self.run_id):
                    self.stop_reason = "cancel"
        return self.stop_reason or False


def with_trackers(recorder: Recorder, run_id: int, spec: RunSpec) -> contextlib.AbstractContextManager[Recorder]:
    """The recorder a run trains with, as a context manager: ``recorder`` itself, or, when the spec's ``report_to``
    names trackers, a TrackerRecorder around it that mirrors metrics and groups to them (grpo_engine.report.trackers, under
    the data directory), whose trackers are closed when the block ends, however it ends."""
    if not spec.report_to:
        return contextlib.nullcontext(recorder)
    return TrackerRecorder.open(
        recorder,
        spec.report_to,
        get_settings().data_dir,
        run_id=run_id,
        run_name=spec.name or f"run-{run_id}",
        config=spec.to_dict(),
    )


class _Writer:
    """A thread that runs queued writes in order, each in its own transaction. After a write fails, the
    rest are dropped and the error is raised by the next ``put``, ``raise_error`` or ``close``."""

    def __init__(self, database_url: str | None):
        self.database_url = database_url
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(QUEUED_WRITES)
        self._thread = threading.Thread(target=self._run, name="recorder-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (write := self._queue.get()) is not None:
            if self.error is None:
                try:
                    with session_scope(self.database_url) as s:
                        write(s)
                except BaseException as exc:  # surfaced in the training loop
                    self.error = exc
            self._queue.task_done()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, write: Callable) -> None:
        self.raise_error()
        if not self._thread.is_alive():
            raise RuntimeError("the recorder was closed")
        self._queue.put(write)

    def flush(self) -> None:
        self._queue.join()
        self.raise_error()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.raise_error()


class LeaseKeeper:
    """Renews ``worker``'s lease on a run every ``period`` seconds in a background thread, so the lease
    stays fresh through long phases without steps (loading a model, training the reward model).
    Sets ``lost`` when the lease turns out to be taken over. A context manager."""

    def __init__(self, run_id: int, worker: str, period: float, database_url: str | None = None):
        self.run_id, self.worker, self.period, self.database_url = run_id, worker, period, database_url
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{run_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                with session_scope(self.database_url) as s:
                    held = store.renew_lease(s, self.run_id, self.worker)
            except Exception:  # the store hiccuped: try again next period (the lease has slack)
                logger.warning("run %s: could not renew the lease", self.run_id, exc_info=True)
                continue
            if not held:
                logger.warning("run %s: lease lost; another worker has taken the run over", self.run_id)
                self.lost.set()
                return

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
