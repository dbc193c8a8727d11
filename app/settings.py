"""One settings object for the dashboard, the workers and Alembic, read from the environment.

Infrastructure only; training settings are the run spec (grpo_engine.config).

| variable | default | meaning |
| --- | --- | --- |
| GRPO_DATA_DIR | ./grpo-data | where the embedded store, broker, caches and logs live |
| GRPO_DATABASE_URL | sqlite:///<data dir>/grpo.sqlite | the store (PostgreSQL: postgresql+psycopg://user@host/db) |
| GRPO_BROKER_URL | sqla+sqlite:///<data dir>/broker.sqlite | Celery broker (Redis: redis://host:6379/0, RabbitMQ: amqp://...) |
| GRPO_EMBEDDED_WORKER | 1 when GRPO_BROKER_URL is unset, else 0 | whether `grpo-dashboard serve` starts a worker itself |
| GRPO_QUEUE | grpo | Celery queue that runs are sent to and workers consume |
| GRPO_CACHE_DIR | <data dir>/cache | built-in model cache (shared by runs) |
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str
    broker_url: str
    embedded_worker: bool
    queue: str
    cache_dir: Path

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def get_settings() -> Settings:
    """Read the environment now (cheap; call it where settings are needed)."""
    env = os.environ
    data_dir = Path(env.get("GRPO_DATA_DIR") or "grpo-data").expanduser().resolve()
    broker_url = env.get("GRPO_BROKER_URL") or f"sqla+sqlite:///{data_dir / 'broker.sqlite'}"
    embedded = env.get("GRPO_EMBEDDED_WORKER")
    return Settings(
        data_dir=data_dir,
        database_url=env.get("GRPO_DATABASE_URL") or f"sqlite:///{data_dir / 'grpo.sqlite'}",
        broker_url=broker_url,
        embedded_worker=_flag(embedded) if embedded is not None else not env.get("GRPO_BROKER_URL"),
        queue=env.get("GRPO_QUEUE") or "grpo",
        cache_dir=Path(env.get("GRPO_CACHE_DIR") or data_dir / "cache").expanduser().resolve(),
    )
