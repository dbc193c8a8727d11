"""The real dashboard server in a subprocess, driven through gradio_client.

One server for the module, on a free port, with its store (SQLite) and broker
(``sqla+sqlite``) in a temporary directory. Data the endpoints read back is seeded
through app.store from this process, the way a worker writes it.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from kombu import Connection

from app import store
from app.ui import group_html, progress_html, token_span
from app.db import make_engine, session_scope, upgrade_database
from grpo_engine.recorder import GroupRecord, SampleRecord
from workers.celery_app import RUN_TASK

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "grpo-ui-test"
ENDPOINTS = {"/launch_run", "/list_runs", "/get_run", "/get_metrics", "/list_groups", "/get_group", "/cancel_run"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Start `serve` in a subprocess; yield (url, database url, broker url, process)."""
    tmp = tmp_path_factory.mktemp("ui")
    db_url, broker_url, port = f"sqlite:///{tmp / 'grpo.sqlite'}", f"sqla+sqlite:///{tmp / 'broker.sqlite'}", _free_port()
    upgrade_database(db_url)
    env = {**os.environ, "GRPO_DATA_DIR": str(tmp), "GRPO_DATABASE_URL": db_url, "GRPO_BROKER_URL": broker_url,
           "GRPO_QUEUE": QUEUE, "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", f"from app.ui import serve; serve('127.0.0.1', {port})"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, f"server exited: {(tmp / 'server.log').read_text()}"
        assert time.monotonic() < deadline, f"server did not answer: {(tmp / 'server.log').read_text()}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.3)
    try:
        yield url, db_url, broker_url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        make_engine(db_url).dispose()


@pytest.fixture(scope="module")
def client(server):
    return Client(server[0], verbose=False)


def _queued_tasks(broker_url: str) -> list:
    found = []
    with Connection(broker_url) as connection:
        queue = connection.SimpleQueue(QUEUE)
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                return found
            message.ack()
            found.append((message.headers["task"], message.payload[0]))


@pytest.mark.slow
def test_only_the_named_endpoints_are_public(client):
    assert set(client.view_api(print_info=False, return_format="dict")["named_endpoints"]) == ENDPOINTS


@pytest.mark.slow
def test_launch_list_get_cancel(server, client):
    _, _, broker_url, _ = server
    result = client.predict({"name": "ui-run", "group_size": 4}, api_name="/launch_run")
    assert result == {"run_id": result["run_id"], "status": "queued"}
    run_id = result["run_id"]
    assert _queued_tasks(broker_url) == [(RUN_TASK, [run_id])]

    runs = client.predict(api_name="/list_runs")
    assert isinstance(runs, list) and runs[0]["run_id"] == run_id
    assert set(runs[0]) == {"run_id", "name", "status", "model", "dataset", "supervision", "step",
                            "total_steps", "created_at"}

    run = client.predict(run_id, api_name="/get_run")
    assert {"run_id", "name", "status", "config", "step", "total_steps", "error", "started_at",
            "finished_at"} <= set(run)
    assert run["name"] == "ui-run" and run["status"] == "queued" and run["config"]["group_size"] == 4

    assert client.predict(run_id, api_name="/cancel_run") == {"run_id": run_id, "status": "cancelled"}
    assert client.predict(run_id, api_name="/get_run")["status"] == "cancelled"


@pytest.mark.slow
@pytest.mark.parametrize("spec,message", [
    ({"group_size": 1}, "group_size: must be at least 2, got 1"),
    ({"supervision": "both"}, "supervision: must be one of 'outcome', 'process', got 'both'"),
    ({"grop_size": 8}, "grop_size: unknown key"),
])
def test_bad_spec_error_names_the_key(client, spec, message):
    with pytest.raises(AppError, match=message):
        client.predict(spec, api_name="/launch_run")


@pytest.mark.slow
def test_unknown_run_is_an_error(client):
    with pytest.raises(AppError, match="run 99999 not found"):
        client.predict(99999, api_name="/get_run")


@pytest.mark.slow
def test_metrics_and_groups(server, client):
    _, db_url, _, _ = server
    run_id = client.predict({"name": "seeded"}, api_name="/launch_run")["run_id"]
    tokens = ["<b>", " 4", "\n"]
    samples = [SampleRecord(completion="".join(tokens), tokens=tokens, reward=r, advantages=[2 * r - 1] * 3,
                            step_rewards=[r], step_end_indices=[2]) for r in (0.0, 1.0)]
    with session_scope(db_url) as s:
        store.mark_running(s, run_id, total_steps=40)
        store.record_step(s, run_id, 1, 0, {"reward_mean": 0.5, "kl": 0.0, "loss": 0.2, "eval/accuracy": 0.25})
        store.record_step(s, run_id, 2, 0, {"reward_mean": 0.75, "kl": 0.01, "loss": 0.1})
        store.record_groups(s, run_id, 2, [GroupRecord("2+2=", "4", samples).to_dict()])

    metrics = client.predict(run_id, api_name="/get_metrics")
    assert [m["step"] for m in metrics] == [1, 2] and metrics[0]["eval/accuracy"] == 0.25
    assert client.predict(run_id, api_name="/get_run")["step"] == 2

    [group_row] = client.predict(run_id, None, api_name="/list_groups")
    assert group_row == {"group_id": group_row["group_id"], "step": 2, "prompt": "2+2=",
                         "reward_mean": 0.5, "reward_std": 0.5}
    assert client.predict(run_id, 2, api_name="/list_groups") == [group_row]
    assert client.predict(run_id, 1, api_name="/list_groups") == []

    group = client.predict(group_row["group_id"], api_name="/get_group")
    assert {"group_id", "run_id", "step", "prompt", "reference", "samples"} <= set(group)
    assert len(group["samples"]) == 2
    sample = group["samples"][1]
    assert sample["tokens"] == tokens and sample["advantages"] == [1.0, 1.0, 1.0]
    assert sample["step_end_indices"] == [2] and sample["step_rewards"] == [1.0]

    # a running run is asked to stop and stays running until its worker does
    assert client.predict(run_id, api_name="/cancel_run") == {"run_id": run_id, "status": "running"}
    with pytest.raises(AppError, match="group 99999 not found"):
        client.predict(99999, api_name="/get_group")


@pytest.mark.slow
def test_server_process_has_not_loaded_torch(server, client):
    """After serving every endpoint, no libtorch is mapped into the server process."""
    client.predict(api_name="/list_runs")
    maps = Path(f"/proc/{server[3].pid}/maps").read_text()
    assert "libtorch" not in maps
    check = "import sys, app.ui; assert 'torch' not in sys.modules, 'app.ui imported torch'"
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True)


# ---- what the browser is shown (pure rendering functions) -----------------------------------------


def test_token_span_escapes_and_colours_by_advantage():
    negative = token_span("<b>\n", -1.0, 2.0)
    assert negative.startswith('<span class="token" data-adv="-1" ')
    assert "&lt;b&gt;" in negative and "<b>" not in negative.replace('<span class="token"', "")
    assert '<span class="ws">↵</span>' in negative  # the newline is drawn, not just broken
    assert "background:rgb(238,146,146)" in negative  # half way from white to red
    assert 'title="&#x27;&lt;b&gt;\\n&#x27;  A = -1.0000"' in negative
    assert "background:rgb(22,163,74)" in token_span(" a", 2.0, 2.0)  # full green
    assert 'class="token strong"' in token_span(" a", 2.0, 2.0)
    assert "background:rgb(255,255,255)" in token_span(" a", 0.0, 2.0)  # white at 0
    assert '<span class="ws">·</span>a' in token_span(" a", 0.0, 0.0)


def test_group_html_shows_every_sample_and_step_marks():
    group = {"group_id": 3, "run_id": 1, "step": 4, "prompt": "1+1=<?>", "reference": "2", "samples": [
        {"sample_id": 10, "completion": "2\n", "tokens": ["2", "\n"], "reward": 1.0, "advantages": [0.5, 0.5],
         "step_rewards": [1.0], "step_end_indices": [1], "reward_components": {"correct": 1.0}},
        {"sample_id": 11, "completion": "3", "tokens": ["3"], "reward": 0.0, "advantages": [-0.5],
         "step_rewards": None, "step_end_indices": None, "reward_components": {}},
    ]}
    page = group_html(group)
    assert page.count('class="sample"') == 2 and page.count(' data-adv=') == 3
    assert "1+1=&lt;?&gt;" in page and 'data-sample-id="11"' in page
    # the step mark sits after the step's last token, before the line break
    assert '<span class="step-end">step 1 r=+1.00</span><br>' in page


def test_progress_html_eta_and_error():
    run = {"run_id": 7, "name": "r<1>", "status": "running", "step": 10, "total_steps": 40, "error": None,
           "started_at": "2025-01-01T00:00:00+00:00", "finished_at": None, "cancel_requested": False}
    now = datetime(2025, 1, 1, 0, 1, 40, tzinfo=timezone.utc)  # 100 s for 10 steps: 300 s left
    page = progress_html(run, now)
    assert "width:25.0%" in page and "step 10 / 40 · 25%" in page
    assert "elapsed 1m 40s · ETA 5m 00s" in page and "r&lt;1&gt;" in page
    failed = {**run, "status": "failed", "error": "boom <x>", "finished_at": "2025-01-01T00:00:30+00:00"}
    assert '<pre class="run-error">boom &lt;x&gt;</pre>' in progress_html(failed, now)
    assert "waiting for a worker" in progress_html({**run, "status": "queued", "step": 0, "started_at": None}, now)
