"""A real dashboard server in a subprocess, for the tests that drive it through HTTP and gradio_client, and a
Chromium page for those that drive it in a browser."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from gradio_client import Client

from workers.distributed import free_port

ROOT = Path(__file__).resolve().parents[2]


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until_answers(url: str, proc: subprocess.Popen, output, ready=lambda: True, timeout: float = 90) -> None:
    """Poll ``url`` until it answers 200 and ``ready()`` holds; fail with the process's ``output()`` if it
    exits or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"server exited:\n{output()}"
        assert time.monotonic() < deadline, f"server not ready within {timeout:g} s:\n{output()}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200 and ready():
                    return
        except OSError:
            pass
        time.sleep(0.3)


def server_env(tmp: Path, **settings: str) -> dict[str, str]:
    """This environment without GRPO_* settings, with a SQLite store and broker in ``tmp``, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {
        **env,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "GRPO_DATA_DIR": str(tmp),
        "GRPO_DATABASE_URL": f"sqlite:///{tmp / 'grpo.sqlite'}",
        "GRPO_BROKER_URL": f"sqla+sqlite:///{tmp / 'broker.sqlite'}",
        "GRPO_QUEUE": "grpo-test",
        **settings,
    }


@contextmanager
def running_server(tmp: Path, env: dict[str, str], command: list[str] | None = None):
    """Start ``serve`` (app.web.ui.serve, or ``command`` + its port) and yield (url, process, log path) once the
    page answers; stop it afterwards."""
    port = free_port()
    log_path = tmp / "server.log"
    args = (
        [*command, "--port", str(port)]
        if command
        else [sys.executable, "-c", f"from app.web.ui import serve; serve('127.0.0.1', {port})"]
    )
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_answers(url, proc, log_path.read_text)
        yield url, proc, log_path
    finally:
        stop_process(proc)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@contextmanager
def browser_page(width: int = 1280, height: int = 900, timeout_ms: int = 15_000):
    """A page of a fresh headless Chromium (Debian's, through Playwright) at ``width`` x ``height``, waiting up to
    ``timeout_ms`` for an action or an expect; the browser is closed afterwards."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_ms)
            expect.set_options(timeout=timeout_ms)
            yield page
        finally:
            browser.close()


COMMAND = str(Path(sys.executable).with_name("grpo-dashboard"))


REDIS_URL = os.environ.get("GRPO_TEST_E2E_REDIS_URL", "redis://127.0.0.1:6379/6")


RUN_TIMEOUT = 240  # seconds from /launch_run to a finished status


def clean_env(cache_dir: Path, **settings: str) -> dict[str, str]:
    """This environment without any GRPO_* variable, plus the shared model cache and ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**env, "GRPO_CACHE_DIR": str(cache_dir), "GRADIO_ANALYTICS_ENABLED": "False", **settings}


class Process:
    """A `grpo-dashboard ...` subprocess with its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [COMMAND, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (serve stops its embedded worker on the way out), SIGKILL after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(data_dir: Path, env: dict[str, str]) -> tuple[Process, str]:
    """`grpo-dashboard serve --port P --data-dir D`; returns it and its URL once it answers HTTP."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = Process(["serve", "--port", str(port), "--data-dir", str(data_dir)], env, data_dir / "serve.log")
    try:
        wait_until_answers(url, server.proc, server.log)
    except AssertionError:
        server.stop()
        raise
    return server, url


def wait_finished(client: Client, run_id: int, logs, timeout: float = RUN_TIMEOUT) -> dict:
    """Poll /get_run until the run is completed, failed or cancelled."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            run = client.predict(run_id, api_name="/get_run")
        except concurrent.futures.CancelledError:  # the client's event stream ended before the answer: ask again
            assert time.monotonic() < deadline, f"run {run_id}: /get_run kept dropping its answer:\n{logs()}"
            time.sleep(1)
            continue
        if run["status"] in ("completed", "failed", "cancelled"):
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run['status']} after {timeout}s:\n{logs()}"
        time.sleep(1)
