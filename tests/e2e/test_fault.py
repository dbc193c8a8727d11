"""A worker killed (SIGKILL) three times during one run: the run completes, every step recorded once.

The production shape (PostgreSQL store, Redis broker, the dashboard and separate `grpo-dashboard worker`
processes) and the embedded one (SQLite store and SQLite broker), each with a short lease
(GRPO_LEASE_SECONDS=4) and one checkpoint directory shared by all workers. A run of 20 steps is
launched through gradio_client; three times a worker is killed with SIGKILL mid-run and a fresh one
started: it notices the dead worker's stale lease, puts the run back in the queue and resumes it
from its last checkpoint. A last fresh worker finishes the run. And the dashboard restarted while a
run trains leaves the run alone.
"""

from __future__ import annotations

import signal
import time

import pytest
from gradio_client import Client

from app import store
from app.store.db import make_engine, session_scope
from tests.support.servers import REDIS_URL, Process, clean_env, start_server, wait_finished

STEPS = 20
SPEC = {
    "name": "fault",
    "steps_per_iteration": STEPS,
    "batch_size": 4,
    "group_size": 8,
    "eval_every": 0,
    "checkpoint_every": 3,
    "checkpoint_keep": 2,
}
KILL_AT = (4, 8, 12)  # the worker is killed once the run has recorded at least this step
# the sharded run: 2 CPU processes with the policy sharded (FSDP2), its checkpoints written by both
SHARDED = {**SPEC, "name": "fault-fsdp", "steps_per_iteration": 9, "devices": 2, "device": "cpu", "sharding": "fsdp"}


def run_with_kills(
    tmp_path, env: dict[str, str], database_url: str, spec: dict = SPEC, kill_at: tuple[int, ...] = KILL_AT
) -> None:
    steps = spec["steps_per_iteration"]
    env = {
        **env,
        "GRPO_LEASE_SECONDS": "4",
        "GRPO_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "GRPO_EMBEDDED_WORKER": "0",
    }
    server, url = start_server(tmp_path / "data", env)
    workers: list[Process] = []

    def start_worker() -> Process:
        n = len(workers) + 1
        (tmp_path / f"worker{n}").mkdir()
        workers.append(
            Process(["worker", "--data-dir", str(tmp_path / f"worker{n}")], env, tmp_path / f"worker{n}.log")
        )
        return workers[-1]

    def logs() -> str:
        return server.log() + "".join(f"\n--- worker {i + 1} ---\n{w.log()}" for i, w in enumerate(workers))

    try:
        client = Client(url, verbose=False)
        run_id = client.predict(spec, api_name="/launch_run")["run_id"]
        killed_at = []
        for target in kill_at:
            worker = start_worker()
            deadline = time.monotonic() + 180
            while (run := client.predict(run_id, api_name="/get_run"))["step"] < target:
                assert run["status"] in ("queued", "running"), f"{run}\n{logs()}"
                assert time.monotonic() < deadline, f"step {target} not reached: {run}\n{logs()}"
                time.sleep(0.2)
            worker.proc.send_signal(signal.SIGKILL)
            worker.proc.wait()
            killed_at.append(client.predict(run_id, api_name="/get_run")["step"])
        start_worker()
        run = wait_finished(client, run_id, logs, timeout=300)
        assert run["status"] == "completed", f"{run}\n{logs()}"

        # every step exactly once, in order, with its B groups (nothing left from the killed attempts)
        assert [m["step"] for m in client.predict(run_id, api_name="/get_metrics")] == list(range(1, steps + 1))
        with session_scope(database_url) as s:
            full = store.get_run(s, run_id)
            run_logs = store.get_logs(s, run_id, limit=1000)
            for step in range(1, steps + 1):
                assert len(store.list_groups(s, run_id, step)) == spec["batch_size"], step
        assert full["attempts"] == len(kill_at) + 1 and full["step"] == steps, full
        assert sum("stopped renewing its lease" in line for line in run_logs) == len(kill_at), run_logs
        resumed = [line for line in run_logs if line.startswith("resuming from the checkpoint after step")]
        assert len(resumed) == len(kill_at), run_logs
        for line, killed in zip(
            resumed, killed_at, strict=True
        ):  # each resume lost at most the steps since the last checkpoint
            step = int(line.split("after step ")[1].split()[0])
            assert killed - spec["checkpoint_every"] - 1 <= step <= killed, (line, killed_at)
        final = tmp_path / "checkpoints" / f"run-{run_id}"
        assert (final / "final" / "model" / "model.safetensors").is_file()
        assert not list(final.glob("step-*"))  # step checkpoints removed once the run completed
    finally:
        server.stop()
        for worker in workers:
            worker.stop()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_sigkilled_workers_on_postgres_and_redis(tmp_path, grpo_cache_dir, postgres_url, redis_queue):
    env = clean_env(grpo_cache_dir, GRPO_DATABASE_URL=postgres_url, GRPO_BROKER_URL=REDIS_URL, GRPO_QUEUE=redis_queue)
    run_with_kills(tmp_path, env, postgres_url)


def run_with_kills_embedded(tmp_path, grpo_cache_dir, spec: dict = SPEC, kill_at: tuple[int, ...] = KILL_AT) -> None:
    """run_with_kills on the embedded SQLite store and SQLite broker, shared by every worker."""
    database_url = f"sqlite:///{tmp_path / 'shared' / 'grpo.sqlite'}"
    env = clean_env(
        grpo_cache_dir,
        GRPO_DATABASE_URL=database_url,
        GRPO_BROKER_URL=f"sqla+sqlite:///{tmp_path / 'shared' / 'broker.sqlite'}",
    )
    try:
        run_with_kills(tmp_path, env, database_url, spec, kill_at)
    finally:
        make_engine(database_url).dispose()


@pytest.mark.slow
def test_sigkilled_workers_on_the_embedded_sqlite_store_and_broker(tmp_path, grpo_cache_dir):
    run_with_kills_embedded(tmp_path, grpo_cache_dir)


@pytest.mark.slow
def test_a_sharded_run_whose_workers_are_sigkilled_resumes_from_its_shards(tmp_path, grpo_cache_dir):
    """sharding 'fsdp' on 2 CPU processes, on the embedded store and broker: the fresh worker resumes the run from the
    distributed checkpoint both processes wrote."""
    run_with_kills_embedded(tmp_path, grpo_cache_dir, SHARDED, kill_at=(4,))


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_a_dashboard_restart_leaves_a_running_run_alone(tmp_path, grpo_cache_dir, postgres_url, redis_queue):
    env = clean_env(
        grpo_cache_dir,
        GRPO_DATABASE_URL=postgres_url,
        GRPO_BROKER_URL=REDIS_URL,
        GRPO_QUEUE=redis_queue,
        GRPO_EMBEDDED_WORKER="0",
        GRPO_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
    )
    (tmp_path / "worker").mkdir()
    worker = Process(["worker", "--data-dir", str(tmp_path / "worker")], env, tmp_path / "worker.log")
    server, url = start_server(tmp_path / "data", env)
    try:
        client = Client(url, verbose=False)
        run_id = client.predict({**SPEC, "steps_per_iteration": 100_000}, api_name="/launch_run")["run_id"]
        deadline = time.monotonic() + 120
        while client.predict(run_id, api_name="/get_run")["step"] < 2:
            assert time.monotonic() < deadline, worker.log()
            time.sleep(0.2)
        server.stop()
        server, url = start_server(tmp_path / "data", env)
        client = Client(url, verbose=False)
        before = client.predict(run_id, api_name="/get_run")
        assert before["status"] == "running" and before["attempts"] == 1, before
        deadline = time.monotonic() + 60
        while client.predict(run_id, api_name="/get_run")["step"] <= before["step"]:  # still training
            assert time.monotonic() < deadline, worker.log()
            time.sleep(0.2)
        assert client.predict(run_id, api_name="/cancel_run")["status"] == "running"  # stops at its next step
        assert wait_finished(client, run_id, worker.log)["status"] == "cancelled"
    finally:
        server.stop()
        worker.stop()
