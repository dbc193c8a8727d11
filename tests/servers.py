"""A real dashboard server in a subprocess, for the tests that drive it through HTTP and gradio_client, and a
Chromium page for those that drive it in a browser."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from workers.distributed import free_port

ROOT = Path(__file__).resolve().parents[1]


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
