"""A store's tables and a run created in it with hand-made metrics, for the tests of the store and what reads it."""

from __future__ import annotations

from app import store
from app.store.db import session_scope
from grpo_engine.spec.config import validate_spec
from tests.support.servers import ROOT

REPO = ROOT


TABLES = {"runs", "metrics", "groups", "samples", "run_logs", "workers", "id_high_water", "eval_results", "tries"}


def new_run(url: str, **spec) -> int:
    spec = validate_spec({"iterations": 2, "steps_per_iteration": 3, **spec}).to_dict()
    with session_scope(url) as s:
        return store.create_run(s, spec, spec["name"] or "run")
