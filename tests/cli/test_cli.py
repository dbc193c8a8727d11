"""The `grpo-dashboard` command, run as a real subprocess.

train: a tiny spec runs in the foreground with a progress bar; a bad spec exits 2 naming the key.
builtin-model: writes a directory that transformers loads.
serve: answers HTTP, starts two embedded workers, one that runs jobs and one that answers tries, and takes them
down with it on SIGTERM (the job in progress pauses with a checkpoint, goes back to the queue and resumes when the
dashboard starts again) and on SIGKILL (the workers notice their parent is gone).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery import Celery

from app import store
from app.core.broker import RUN_TASK
from app.store.db import make_engine, session_scope, upgrade_database
from grpo_engine.spec.config import validate_spec
from tests.support.runs import TINY_SPEC
from tests.support.servers import ROOT, free_port, wait_until_answers

COMMAND = str(Path(sys.executable).with_name("grpo-dashboard"))


def _env(cache_dir: Path) -> dict[str, str]:
    """This environment without any GRPO_* setting, except the shared model cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**env, "GRPO_CACHE_DIR": str(cache_dir), "GRADIO_ANALYTICS_ENABLED": "False"}


def _run(args: list[str], cache_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [COMMAND, *args], cwd=ROOT, env=_env(cache_dir), capture_output=True, text=True, timeout=timeout
    )


# ---- train ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_train_runs_a_spec_in_the_foreground(tmp_path, grpo_cache_dir, devices):
    """Also with 2 data-parallel CPU processes: the progress bar follows what their main process records."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**TINY_SPEC, "name": "cli run", "devices": devices, "device": "cpu"}))
    result = _run(["train", str(spec), "--data-dir", str(tmp_path / "data")], grpo_cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2/2" in result.stderr  # the progress bar reached the last step
    assert "run 1: completed" in result.stdout
    final = json.loads(result.stdout.split("final metrics: ", 1)[1])
    assert final["step"] == 2 and "reward_mean" in final

    url = f"sqlite:///{tmp_path / 'data' / 'grpo.sqlite'}"
    with session_scope(url) as s:
        run = store.get_run(s, 1)
        assert (run["name"], run["status"], run["step"]) == ("cli run", "completed", 2)
    make_engine(url).dispose()


@pytest.mark.parametrize("spec, key", [({"group_size": 1}, "group_size"), ({"lerning_rate": 0.1}, "lerning_rate")])
def test_train_refuses_a_bad_spec(tmp_path, spec, key):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    result = _run(["train", str(path), "--data-dir", str(tmp_path / "data")], tmp_path / "cache", timeout=60)
    assert result.returncode == 2
    assert key in result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created


# ---- builtin-model -------------------------------------------------------------------------------


@pytest.mark.slow
def test_builtin_model_writes_a_loadable_model(tmp_path, grpo_cache_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "model"
    result = _run(["builtin-model", str(out)], grpo_cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("2+3*4=", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits  # (1, T, V)
    assert logits.shape[:2] == ids.shape and logits.shape[2] >= len(tokenizer)


# ---- serve ---------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float) -> float:
    """Seconds until ``pid`` exits; fails after ``timeout``."""
    start = time.monotonic()
    while _alive(pid):
        assert time.monotonic() - start < timeout, f"process {pid} still alive after {timeout}s"
        time.sleep(0.1)
    return time.monotonic() - start


def _start_serve(data_dir: Path, cache_dir: Path) -> tuple[subprocess.Popen, list[int], str]:
    """`grpo-dashboard serve` on a free port; returns (server, its workers' pids, url) once the server and the
    worker that trains are ready (the other answers tries)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = open(data_dir.parent / "serve.log", "w")
    server = subprocess.Popen(
        [COMMAND, "serve", "--port", str(port), "--data-dir", str(data_dir)],
        cwd=ROOT,
        env=_env(cache_dir),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    output = lambda: (data_dir.parent / "serve.log").read_text()  # noqa: E731
    worker_log = data_dir / "worker.log"
    seen = worker_log.stat().st_size if worker_log.exists() else 0  # a restart appends to the same log
    wait_until_answers(
        url, server, output, ready=lambda: worker_log.exists() and "ready." in worker_log.read_text()[seen:]
    )
    workers = _children(server.pid)
    assert len(workers) == 2, output()  # the worker that trains, the one that answers tries
    assert f"open {url.rstrip('/')}" in output() and str(worker_log) in output()
    assert str(data_dir / "tries.log") in output()
    return server, workers, url


def _wait_for(db_url: str, run_id: int, condition, what: str, log: Path, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        with session_scope(db_url) as s:
            run = store.get_run(s, run_id)
        if condition(run):
            return run
        assert time.monotonic() < deadline, f"{what}: {run}\n{log.read_text()}"
        time.sleep(0.3)


@pytest.mark.slow
def test_serve_runs_a_worker_and_stops_it_on_sigterm_and_the_run_resumes(tmp_path, grpo_cache_dir):
    data_dir = tmp_path / "data"
    db_url = f"sqlite:///{data_dir / 'grpo.sqlite'}"
    worker_log = data_dir / "worker.log"
    upgrade_database(db_url)
    with session_scope(db_url) as s:  # left 'running' by an earlier worker that was killed
        orphan = store.create_run(s, validate_spec(TINY_SPEC).to_dict(), "orphan")
        store.claim_run(s, orphan, "gone:1", lease_seconds=60)

    server, workers, _ = _start_serve(data_dir, grpo_cache_dir)
    try:
        _wait_for(db_url, orphan, lambda r: r["status"] == "completed", "the orphan resumes", worker_log)
        with session_scope(db_url) as s:
            run_id = store.create_run(
                s,
                validate_spec(
                    {**TINY_SPEC, "steps_per_iteration": 500, "eval_every": 0, "checkpoint_every": 100}
                ).to_dict(),
                "long",
            )
        sender = Celery("grpo-test", broker=f"sqla+sqlite:///{data_dir / 'broker.sqlite'}")
        sender.send_task(RUN_TASK, args=[run_id], queue="grpo")
        sender.close()
        _wait_for(db_url, run_id, lambda r: r["step"] >= 2, "the long run starts", worker_log)

        server.send_signal(signal.SIGTERM)
        server.wait(60)
        assert not any(_alive(worker) for worker in workers)
        with session_scope(db_url) as s:
            run = store.get_run(s, run_id)
            logs = store.get_logs(s, run_id)
        assert run["status"] == "queued" and run["error"] is None, run  # paused, not failed
        paused_at = run["step"]
        assert 2 <= paused_at < 500 and run["checkpoint_step"] == paused_at  # a checkpoint on the way out
        assert any("paused after step" in line for line in logs), logs

        server, workers, _ = _start_serve(data_dir, grpo_cache_dir)  # the dashboard again: the run resumes
        run = _wait_for(db_url, run_id, lambda r: r["step"] > paused_at, "the run resumes", worker_log)
        with session_scope(db_url) as s:
            assert run["status"] == "running" and run["attempts"] == 2, "\n".join(store.get_logs(s, run_id))
            assert any(
                f"resuming from the checkpoint after step {paused_at}" in line for line in store.get_logs(s, run_id)
            )
            assert [m["step"] for m in store.get_metrics(s, run_id)][:paused_at] == list(range(1, paused_at + 1))
            store.request_cancel(s, run_id)
        _wait_for(db_url, run_id, lambda r: r["status"] == "cancelled", "the run is cancelled", worker_log)
    finally:
        if server.poll() is None:
            server.kill()
        make_engine(db_url).dispose()


@pytest.mark.slow
def test_serve_killed_takes_its_worker_down(tmp_path, grpo_cache_dir):
    server, workers, url = _start_serve(tmp_path / "data", grpo_cache_dir)
    server.kill()
    server.wait()
    for worker in workers:
        _wait_gone(worker, timeout=15)
