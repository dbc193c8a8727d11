"""Alembic environment: runs the migrations against the store.

The URL is ``sqlalchemy.url`` when the caller set one (app.store.db.upgrade_database does), else
GRPO_DATABASE_URL through app.core.settings (the `alembic -c migrations/alembic.ini` command line).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context

from app.core.settings import get_settings
from app.store.db import make_engine
from app.store.models import Base

config = context.config
if config.config_file_name is not None:  # command line: log through alembic.ini's loggers
    fileConfig(config.config_file_name, disable_existing_loggers=False)

MIGRATION_LOCK_ID = 0x6772706F  # "grpo": the PostgreSQL advisory lock held while migrating

url = config.get_main_option("sqlalchemy.url") or get_settings().database_url


def run_migrations_offline() -> None:
    """`alembic upgrade head --sql`: print the SQL instead of running it."""
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate in one transaction that holds a lock: the web process and several workers may
    upgrade at once; they go one at a time and the later ones find the schema already at head."""
    with make_engine(url).connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})")
        else:  # SQLite: take the write lock now (waits up to busy_timeout for another upgrader)
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        context.configure(connection=connection, target_metadata=Base.metadata)
        with context.begin_transaction():  # joins the transaction begun above
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
