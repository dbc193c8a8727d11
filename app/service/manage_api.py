"""Managing runs through the API: rename, notes and tags, archive, delete, wait for a run to end; and the Runs
table's data (every run with its newest headline metrics).

Plain functions raising app.service.api.ApiError, as app.service.api's; app.web.endpoints wraps them for ``gradio_client`` and the
Runs tab (app.web.tabs.runs) calls them directly, so the browser and clients get the same checks.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from typing import Any

from app import store
from app.core.settings import get_settings
from app.service.api import ApiError, as_id, checked_text, require_run, run_view
from app.store.db import session_scope
from grpo_engine.spec.config import FIELD_BY_NAME, shown

NAME_MAX = FIELD_BY_NAME["name"].max_length  # a run's name: as long as a run spec's ``name`` may be
NOTES_MAX = 10_000
TAG_MAX, TAGS_MAX = 40, 20  # the longest tag, the most tags on a run
WAIT_POLL_SECONDS = 0.5
WAIT_MAX_SECONDS = 600
HEADLINE_METRICS = ("reward_mean", "correct_frac", "eval/accuracy")  # what the Runs table shows of each run


def checked_tags(value: Any) -> list[str]:
    """Tags from a list of strings or a comma-separated string: each stripped, empty ones dropped, duplicates
    dropped (first kept); a comma inside a listed tag splits it too, as the store keeps tags comma-separated."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ApiError(f"tags must be a list of strings or a comma-separated string, got {shown(value)}")
    tags: list[str] = []
    for item in value:
        for tag in checked_text(item, "a tag", NOTES_MAX).split(","):
            tag = tag.strip()
            if len(tag) > TAG_MAX:
                raise ApiError(f"a tag must be at most {TAG_MAX} characters, got {shown(tag)}")
            if tag and tag not in tags:
                tags.append(tag)
    if len(tags) > TAGS_MAX:
        raise ApiError(f"a run takes at most {TAGS_MAX} tags, got {len(tags)}")
    return tags


def rename_run(run_id: Any, name: Any) -> dict:
    """Give a run a new name (1 to NAME_MAX characters, surrounding spaces dropped); returns the run as get_run."""
    run_id = as_id(run_id)
    name = checked_text(name, "name", NAME_MAX).strip()
    if not name:
        raise ApiError("name must not be empty")
    with session_scope() as s:
        require_run(s, run_id)
        store.rename_run(s, run_id, name)
        return run_view(s, require_run(s, run_id))


def annotate_run(run_id: Any, notes: Any = None, tags: Any = None) -> dict:
    """Set a run's notes (free text) and tags (a list, or a comma-separated string); None leaves that one as it
    is. Returns the run as get_run."""
    run_id = as_id(run_id)
    notes = None if notes is None else checked_text(notes, "notes", NOTES_MAX)
    tags = None if tags is None else checked_tags(tags)
    with session_scope() as s:
        require_run(s, run_id)
        store.annotate_run(s, run_id, notes, tags)
        return run_view(s, require_run(s, run_id))


def archive_run(run_id: Any, archived: Any = True) -> dict:
    """Archive a run (hidden from the Runs table unless archived runs are shown; nothing is deleted), or with
    ``archived`` false bring it back. Returns the run as get_run."""
    run_id = as_id(run_id)
    if isinstance(archived, str) and archived.strip().lower() in ("true", "false"):
        archived = archived.strip().lower() == "true"
    if not isinstance(archived, bool):
        raise ApiError(f"archived must be true or false, got {shown(archived)}")
    with session_scope() as s:
        require_run(s, run_id)
        store.set_archived(s, run_id, archived)
        return run_view(s, require_run(s, run_id))


def delete_run(run_id: Any) -> dict:
    """Delete a run that is not running, with everything it recorded and its checkpoint directory.

    Returns ``{run_id, deleted: true, checkpoints}``: "removed", "none" (the dashboard's checkpoint directory
    has none for it) or why they were left. A running run is refused: cancel it first.
    """
    run_id = as_id(run_id)
    with session_scope() as s:
        run = require_run(s, run_id)
        outcome = store.delete_run(s, run_id)
    if outcome == "running":
        stopping = " (it is stopping: cancel requested)" if run["cancel_requested"] else ""
        raise ApiError(f"run {run_id} is running{stopping}; cancel it first and delete it once it has stopped")
    if outcome == "missing":
        raise ApiError(f"run {run_id} not found")
    return {"run_id": run_id, "deleted": True, "checkpoints": _remove_checkpoints(run_id)}


def _remove_checkpoints(run_id: int) -> str:
    """Remove a deleted run's checkpoint directory (its saved states and final policy): "removed", "none", or
    why it was left. A link there is removed, not followed."""
    path = get_settings().run_dir(run_id)
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            return "none"
    except OSError as e:
        return f"left in place: {e.strerror or type(e).__name__}"
    return "removed"


def wait_run(run_id: Any, timeout: Any = 60) -> dict:
    """The run (as get_run) once it has finished (completed, failed or cancelled), or as it stands when
    ``timeout`` seconds (1 to WAIT_MAX_SECONDS) have passed, whichever comes first; the store is read every
    WAIT_POLL_SECONDS."""
    run_id = as_id(run_id)
    if isinstance(timeout, str):
        try:
            timeout = float(timeout.strip())
        except ValueError:
            pass
    if (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not math.isfinite(timeout)
        or not 1 <= timeout <= WAIT_MAX_SECONDS
    ):
        raise ApiError(f"timeout must be a number of seconds from 1 to {WAIT_MAX_SECONDS}, got {shown(timeout)}")
    deadline = time.monotonic() + timeout
    while True:
        with session_scope() as s:
            run = store.get_run(s, run_id)
            if run is None:
                raise ApiError(f"run {run_id} not found")
            left = deadline - time.monotonic()
            if run["status"] in store.FINISHED_STATUSES or left <= 0:
                return run_view(s, run)
        time.sleep(min(WAIT_POLL_SECONDS, left))


class HeadlineMetrics:
    """Each run's newest value of every HEADLINE_METRICS name, for the Runs table.

    ``eval/accuracy`` is recorded only on evaluation steps, so a run's newest metrics row may lack it: the
    newest value of each name is kept here, per run, and a look reads only the rows of the runs whose step or
    status changed since the last one, from that step on (store.metrics_after). A run whose step went back
    (resumed from a checkpoint) or whose id now names another run (a different created_at) is read afresh.
    """

    def __init__(self) -> None:
        """An empty cache; it fills on the first look."""
        self._lock = threading.Lock()  # refreshes of several browsers run in threads at once
        self._seen: dict[int, tuple] = {}  # run id -> (created_at, step, status) when last read
        self._values: dict[int, dict[str, float | None]] = {}  # run id -> {metric: newest value}

    def look(self, runs: list[dict]) -> dict[int, dict[str, float | None]]:
        """``{run_id: {metric: newest value}}`` for ``runs`` (list_runs' dicts); a metric never recorded is absent."""
        with self._lock:
            after, fresh = {}, set()
            for run in runs:
                key = (run["created_at"], run["step"], run["status"])
                old = self._seen.get(run["run_id"])
                if old == key:
                    continue
                if old is None or old[0] != key[0] or key[1] < old[1]:
                    fresh.add(run["run_id"])
                after[run["run_id"]] = -1 if run["run_id"] in fresh else old[1]
            rows = []
            if after:  # nothing changed: no query
                with session_scope() as s:
                    rows = store.metrics_after(s, after)
            for run_id in fresh:
                self._values[run_id] = {}
            for run_id, _, values in rows:  # by step: a newer row's value replaces an older one's
                self._values.setdefault(run_id, {}).update({k: values[k] for k in HEADLINE_METRICS if k in values})
            for run in runs:
                self._seen[run["run_id"]] = (run["created_at"], run["step"], run["status"])
            for gone in set(self._seen) - {run["run_id"] for run in runs}:  # deleted runs
                self._seen.pop(gone)
                self._values.pop(gone, None)
            return {run["run_id"]: dict(self._values.get(run["run_id"], {})) for run in runs}


HEADLINES = HeadlineMetrics()


def runs_overview() -> list[dict]:
    """Every run as list_runs gives it, newest first, each with ``headline``: its newest value of each
    HEADLINE_METRICS name that it recorded."""
    with session_scope() as s:
        runs = store.list_runs(s)
    headlines = HEADLINES.look(runs)
    return [{**run, "headline": headlines[run["run_id"]]} for run in runs]
