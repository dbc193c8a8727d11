"""A run's health warnings as ``/get_run`` lists them: app.service.health's rules on the run's recorded metrics and on its
latest recorded samples, read from the store.

``/get_run`` is polled every few seconds by every open dashboard, so the warnings of a run are kept per process and
worked out again only when the run has moved on by a fiftieth of its recorded steps (at least one step) or its
status changed (or it is another run under a reused id): a long run's metrics are not read on every poll.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy.orm import Session

from app import store
from app.service import health

RECENT_GROUP_STEPS = 5  # the recorded steps whose samples the length-reward rule reads
CACHE_RUNS = 256  # runs whose warnings are kept

_cache: dict[int, tuple[str, int, str, list[dict]]] = {}  # run id -> (created_at, step, status, warnings)
_lock = threading.Lock()


def run_warnings(s: Session, run: dict[str, Any]) -> list[dict]:
    """The run's warnings (app.service.health.health_warnings), from the cache while it is fresh (see the module)."""
    run_id, step, status, created = run["run_id"], int(run.get("step") or 0), run["status"], run["created_at"]
    with _lock:
        cached = _cache.get(run_id)
    if (
        cached is not None
        and cached[0] == created
        and cached[2] == status
        and 0 <= step - cached[1] < max(1, cached[1] // 50)
    ):
        return cached[3]
    warnings = health.health_warnings(
        store.get_metrics(s, run_id),
        store.recent_lengths_rewards(s, run_id, RECENT_GROUP_STEPS),
        run.get("config") or {},
    )
    with _lock:
        if len(_cache) >= CACHE_RUNS and run_id not in _cache:
            _cache.pop(next(iter(_cache)))
        _cache[run_id] = (created, step, status, warnings)
    return warnings
