"""Engines, sessions and schema upgrades for the store.

SQLite (the embedded default) is shared by the web process, which mostly reads, and a worker
process, which writes: each connection runs in WAL mode (readers never block the writer) and
waits up to 30 s for a lock instead of failing. PostgreSQL connections are checked before use
(``pool_pre_ping``) so a restarted server does not break long-lived processes.
The schema comes only from the Alembic migrations (``upgrade_database``), never ``create_all``.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.core.settings import get_settings

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_pragmas(dbapi_connection, connection_record) -> None:
    """Per-connection SQLite settings: WAL journal, lock wait, foreign keys (for ON DELETE CASCADE).

    ``synchronous = NORMAL`` in WAL mode syncs at checkpoints instead of at every commit: a process
    crash loses nothing committed; only a power cut can lose the last commits (SQLite's documented
    trade-off). It makes the worker's per-step commits several times cheaper.
    """
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


@functools.cache
def make_engine(url: str) -> Engine:
    """The engine for ``url``, created once per process and URL.

    For an SQLite file, its directory is created if missing.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(parsed, pool_pre_ping=True)


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A session in one transaction: committed if the block succeeds, rolled back if it raises.

    ``url`` defaults to the configured store (``GRPO_DATABASE_URL``).
    """
    engine = make_engine(url or get_settings().database_url)
    with Session(engine) as session, session.begin():
        yield session


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for the migrations package, pointed at ``url`` (default: the configured store)."""
    config = Config()
    # the scripts' directory, found as a package resource: the store runs them through Alembic, it does not
    # import them (their env.py imports the store's models)
    config.set_main_option("script_location", str(importlib.resources.files("migrations")))
    # Config values go through configparser interpolation: escape '%' (e.g. in encoded passwords).
    config.set_main_option("sqlalchemy.url", (url or get_settings().database_url).replace("%", "%%"))
    return config


def upgrade_database(url: str | None = None) -> None:
    """Bring the schema up to the latest migration (``alembic upgrade head``)."""
    command.upgrade(alembic_config(url), "head")
