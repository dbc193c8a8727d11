"""The store's database (app/store/db.py, migrations/) on a SQLite file and a PostgreSQL database: the schema comes
only from the Alembic migrations, SQLite's locking, concurrent writers and upgrades.

Every test runs on both backends through the ``db_url`` fixture (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError

from app import store
from app.core.run_status import RUN_STATUS_CHECK, RunStatus
from app.store.db import alembic_config, make_engine, session_scope, upgrade_database
from app.store.models import Base
from tests.support.store import REPO, TABLES, new_run


def test_schema_comes_only_from_the_migrations(db_url):
    engine = make_engine(db_url)

    def tables() -> set[str]:
        engine.dispose()  # drop cached connections (and their cached schema) between DDL runs
        return set(inspect(engine).get_table_names())

    assert tables() == TABLES | {"alembic_version"}
    with engine.connect() as connection:  # the migrated schema is exactly what the models describe
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []

    command.downgrade(alembic_config(db_url), "base")
    assert tables() == {"alembic_version"}
    upgrade_database(db_url)
    assert tables() == TABLES | {"alembic_version"}
    new_run(db_url)  # usable again


def test_fresh_database_has_no_tables_until_upgraded(tmp_path):
    url = f"sqlite:///{tmp_path / 'nested' / 'dir' / 'grpo.sqlite'}"
    engine = make_engine(url)
    assert inspect(engine).get_table_names() == []
    upgrade_database(url)
    engine.dispose()
    assert set(inspect(engine).get_table_names()) == TABLES | {"alembic_version"}
    engine.dispose()


def test_alembic_command_line_reads_the_settings(tmp_path):
    path = tmp_path / "data" / "cli.sqlite"
    env = {**os.environ, "GRPO_DATABASE_URL": f"sqlite:///{path}"}
    alembic = [sys.executable, "-m", "alembic", "-c", str(REPO / "migrations" / "alembic.ini")]
    subprocess.run([*alembic, "upgrade", "head"], cwd=tmp_path, env=env, check=True, capture_output=True)
    current = subprocess.run([*alembic, "current"], cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    assert "0013 (head)" in current.stdout
    engine = make_engine(env["GRPO_DATABASE_URL"])
    assert set(inspect(engine).get_table_names()) == TABLES | {"alembic_version"}
    engine.dispose()


def test_sqlite_connections_use_wal_and_wait_for_locks(sqlite_url):
    with make_engine(sqlite_url).connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_a_writer_waits_for_another_writer(db_url):
    """The worker writes while the web process cancels: the second writer waits, it does not fail."""
    run_id = new_run(db_url)
    errors: list[BaseException] = []
    done = threading.Event()

    def cancel() -> None:
        try:
            with session_scope(db_url) as s:
                store.request_cancel(s, run_id)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)
        done.set()

    with session_scope(db_url) as s:
        store.mark_running(s, run_id, total_steps=6)  # holds the write lock (SQLite) / the row lock (PostgreSQL)
        thread = threading.Thread(target=cancel)
        thread.start()
        time.sleep(0.5)
        assert not done.is_set()
        store.append_log(s, run_id, "step 1")
    thread.join(timeout=30)
    assert done.is_set() and errors == []
    with session_scope(db_url) as s:
        run = store.get_run(s, run_id)
        assert (run["status"], run["cancel_requested"]) == ("running", True)


def test_read_then_write_after_another_commit(db_url):
    """A session that read before another process committed can still write afterwards."""
    run_id = new_run(db_url)
    with session_scope(db_url) as worker:
        assert store.get_run(worker, run_id)["status"] == "queued"
        with session_scope(db_url) as web:
            store.request_cancel(web, run_id)
        store.append_log(worker, run_id, "skipped: cancelled")
        store.mark_running(worker, run_id, total_steps=6)
    with session_scope(db_url) as s:
        assert store.get_run(s, run_id)["status"] == "cancelled"
        assert store.get_logs(s, run_id) == ["skipped: cancelled"]


def test_concurrent_upgrades_do_not_collide(db_url):
    """The web process and workers may all upgrade at start-up, each in its own process."""
    command.downgrade(alembic_config(db_url), "base")
    code = f"from app.store.db import upgrade_database; upgrade_database({db_url!r})"
    processes = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    new_run(db_url)


def test_migration_0002_keeps_existing_runs(db_url):
    command.downgrade(alembic_config(db_url), "0001")
    engine = make_engine(db_url)
    engine.dispose()
    with engine.begin() as connection:  # a run written by the 0001 schema
        connection.exec_driver_sql(
            "INSERT INTO runs (name, status, config, model, dataset, supervision, step, total_steps, "
            "cancel_requested, created_at, updated_at) VALUES ('old', 'running', '{}', 'm', 'd', 'outcome', 3, 6, "
            "false, '2026-01-01 00:00:00+00:00', '2026-01-01 00:00:00+00:00')"
        )
    upgrade_database(db_url)
    engine.dispose()
    with session_scope(db_url) as s:
        (run,) = [r for r in store.list_runs(s) if r["name"] == "old"]
        full = store.get_run(s, run["run_id"])
    assert full["step"] == 3 and full["attempts"] == 0 and full["worker"] is None and full["checkpoint_step"] is None


def test_migration_0007_packs_advantages_exactly_and_back(db_url):
    """Advantages recorded as JSON lists (0006) become float64 arrays bit for bit, and JSON again on downgrade."""
    values = [0.1, -1 / 3, 12.345678901234, 1e-300, -0.0, 5.0]
    run_id = new_run(db_url)
    command.downgrade(alembic_config(db_url), "0006")
    engine = make_engine(db_url)
    engine.dispose()
    with engine.begin() as connection:  # a group and two samples written by the 0006 schema
        connection.exec_driver_sql(
            "INSERT INTO groups (run_id, step, position, prompt, reference, reward_mean, reward_std) "
            f"VALUES ({run_id}, 1, 0, 'q', '42', 0.5, 0.5)"
        )
        group_id = connection.exec_driver_sql("SELECT max(id) FROM groups").scalar()
        for position, advantages in enumerate([values, []]):
            connection.exec_driver_sql(
                "INSERT INTO samples (group_id, run_id, step, position, completion, tokens, advantages, reward, "
                f"reward_components) VALUES ({group_id}, {run_id}, 1, {position}, 'c', "
                f"'{json.dumps(['t'] * len(advantages))}', '{json.dumps(advantages)}', 1.0, '{{}}')"
            )
    engine.dispose()
    upgrade_database(db_url)
    engine.dispose()
    with session_scope(db_url) as s:
        got = [sample["advantages"] for sample in store.get_group(s, group_id)["samples"]]
    assert [[x.hex() for x in a] for a in got] == [[x.hex() for x in values], []]  # bit for bit

    command.downgrade(alembic_config(db_url), "0006")
    engine.dispose()
    with engine.connect() as connection:
        stored = (
            connection.exec_driver_sql(f"SELECT advantages FROM samples WHERE group_id = {group_id} ORDER BY position")
            .scalars()
            .all()
        )
    assert [json.loads(a) if isinstance(a, str) else a for a in stored] == [values, []]
    engine.dispose()
    upgrade_database(db_url)


def test_migration_0008_starts_the_high_water_mark_at_the_largest_run_id(db_url):
    """Runs made before id_high_water existed: the newest deleted without the store (no mark raised) still
    leaves its id unused."""
    newest = max(new_run(db_url) for _ in range(2))
    command.downgrade(alembic_config(db_url), "0007")
    make_engine(db_url).dispose()
    upgrade_database(db_url)
    engine = make_engine(db_url)
    engine.dispose()
    with engine.begin() as connection:
        connection.exec_driver_sql(f"DELETE FROM runs WHERE id = {newest}")
    assert new_run(db_url) > newest
    engine.dispose()


def test_a_run_status_outside_the_vocabulary_is_refused_by_the_database(db_url):
    """runs.status holds only a RunStatus (migration 0009: a CHECK constraint on PostgreSQL, triggers on SQLite),
    whether a row is inserted or updated, even by a writer that bypasses the store; each valid status is taken."""
    assert RUN_STATUS_CHECK == "status IN ('queued', 'running', 'completed', 'failed', 'cancelled')"
    run_id = new_run(db_url)
    engine = make_engine(db_url)
    for status in RunStatus:
        with engine.begin() as connection:
            connection.exec_driver_sql(f"UPDATE runs SET status = '{status}' WHERE id = {run_id}")
    for statement in (
        f"UPDATE runs SET status = 'paused' WHERE id = {run_id}",
        "INSERT INTO runs (name, status, config, model, dataset, supervision, step, total_steps, cancel_requested, "
        "created_at, updated_at, attempts, archived) SELECT name, 'held', config, model, dataset, supervision, step, "
        f"total_steps, cancel_requested, created_at, updated_at, attempts, archived FROM runs WHERE id = {run_id}",
    ):
        with pytest.raises(IntegrityError, match="ck_runs_status"):
            with engine.begin() as connection:
                connection.exec_driver_sql(statement)
    with session_scope(db_url) as s:
        assert store.get_run(s, run_id)["status"] == RunStatus.CANCELLED  # the last valid one, nothing else
    command.downgrade(alembic_config(db_url), "0008")  # the constraint goes with its migration
    with engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE runs SET status = 'paused' WHERE id = {run_id}")
        connection.exec_driver_sql(f"UPDATE runs SET status = 'queued' WHERE id = {run_id}")
    engine.dispose()
    upgrade_database(db_url)
    engine.dispose()


def test_migration_0010_leaves_earlier_samples_unread_and_goes_back(db_url):
    """Samples recorded before the verifier's reading was kept have answer and answer_rule null after the upgrade
    (not read again); the downgrade drops both columns and keeps every sample."""
    run_id = new_run(db_url)
    command.downgrade(alembic_config(db_url), "0009")
    engine = make_engine(db_url)
    engine.dispose()
    with engine.begin() as connection:  # a group and a sample written by the 0009 schema
        connection.exec_driver_sql(
            "INSERT INTO groups (run_id, step, position, prompt, reference, reward_mean, reward_std) "
            f"VALUES ({run_id}, 1, 0, 'q', '3', 1.0, 0.0)"
        )
        group_id = connection.exec_driver_sql("SELECT max(id) FROM groups").scalar()
        connection.exec_driver_sql(
            "INSERT INTO samples (group_id, run_id, step, position, completion, tokens, reward, reward_components, "
            f"answer_found) VALUES ({group_id}, {run_id}, 1, 0, '#### 3', '[\"#### 3\"]', 1.0, '{{}}', true)"
        )
    engine.dispose()
    upgrade_database(db_url)
    engine.dispose()
    with session_scope(db_url) as s:
        [sample] = store.get_group(s, group_id)["samples"]
    assert (sample["completion"], sample["answer"], sample["answer_rule"], sample["answer_found"]) == (
        "#### 3",
        None,
        None,
        True,
    )
    command.downgrade(alembic_config(db_url), "0009")
    engine.dispose()
    columns = {c["name"] for c in inspect(engine).get_columns("samples")}
    assert "answer" not in columns and "answer_rule" not in columns and "answer_found" in columns
    with engine.connect() as connection:
        assert connection.exec_driver_sql(f"SELECT count(*) FROM samples WHERE group_id = {group_id}").scalar() == 1
    engine.dispose()
    upgrade_database(db_url)
    engine.dispose()


def test_migration_0011_adds_the_evaluations_table_and_goes_back(db_url):
    """Runs recorded before it have no evaluation's questions (the dashboard says so); the downgrade drops the table
    and keeps the runs."""
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        store.record_evaluation(s, run_id, 0, [])  # nothing to record: nothing written
        assert store.eval_steps(s, run_id) == []
    command.downgrade(alembic_config(db_url), "0010")
    engine = make_engine(db_url)
    assert "eval_results" not in set(inspect(engine).get_table_names())
    with engine.connect() as connection:
        assert connection.exec_driver_sql(f"SELECT count(*) FROM runs WHERE id = {run_id}").scalar() == 1
    engine.dispose()
    upgrade_database(db_url)
    engine.dispose()
