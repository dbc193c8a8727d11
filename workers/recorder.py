"""The engine's Recorder, implemented against the store: every event the engine reports becomes rows.

One short transaction per event, so the dashboard sees each step as soon as it is done and a
crash loses at most the event in flight. No torch here.
"""
from __future__ import annotations

import logging
import threading
import time

from app import store
from app.db import session_scope
from grpo_engine.recorder import GroupRecord, Recorder

logger = logging.getLogger("grpo.worker")

CANCEL_POLL_SECONDS = 1.0  # the store is asked about cancellation at most this often

# Set by the embedded worker when it shuts down (the dashboard stopped): the running job stops at
# its next step boundary. A standalone worker leaves it unset and finishes its job (Celery's warm shutdown).
interrupt = threading.Event()


class DBRecorder(Recorder):
    """Writes one run's engine events to the store (``database_url`` None = the configured store)."""

    def __init__(self, run_id: int, database_url: str | None = None):
        self.run_id = run_id
        self.database_url = database_url
        self.stop_reason: str | None = None  # "cancel" or "interrupt" once should_stop() said True
        self._last_poll = float("-inf")
        self._pending_groups: tuple[int, list[dict]] | None = None  # (step, groups) until step() comes

    def start(self, total_steps: int) -> None:
        with session_scope(self.database_url) as s:
            store.mark_running(s, self.run_id, total_steps)

    def log(self, message: str) -> None:
        logger.info("run %s: %s", self.run_id, message)
        with session_scope(self.database_url) as s:
            store.append_log(s, self.run_id, message)

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        """The step's metrics, and the groups reported for it, in one transaction."""
        pending, self._pending_groups = self._pending_groups, None
        with session_scope(self.database_url) as s:
            if pending is not None and pending[0] == step:
                store.record_groups(s, self.run_id, step, pending[1])
            store.record_step(s, self.run_id, step, iteration, metrics)

    def groups(self, step: int, groups: list[GroupRecord]) -> None:
        """Held until the step's metrics come (the engine reports groups first), then written with them."""
        if self._pending_groups is not None:  # groups of a step that never reported metrics: write them now
            with session_scope(self.database_url) as s:
                store.record_groups(s, self.run_id, *self._pending_groups)
        self._pending_groups = (step, [g.to_dict() for g in groups])

    def should_stop(self) -> bool:
        """True once the run was cancelled in the store or the embedded worker is shutting down."""
        if self.stop_reason is not None:
            return True
        if interrupt.is_set():
            self.stop_reason = "interrupt"
            return True
        now = time.monotonic()
        if now - self._last_poll < CANCEL_POLL_SECONDS:
            return False
        self._last_poll = now
        with session_scope(self.database_url) as s:
            if store.is_cancel_requested(s, self.run_id):
                self.stop_reason = "cancel"
        return self.stop_reason is not None
