"""What does an open dashboard tab cost while nothing runs?

Starts a real ``grpo-dashboard serve`` (SQLite store, no worker) in a fresh data dir holding one completed run of
--steps steps (20) with its metrics, groups and log, opens it in Chromium (headless, 1280x900) and, on each of the
Runs, Run and Groups tabs in turn, waits --settle seconds (5), then measures for --seconds (20) the CPU time the
browser's processes and the server's process use. Nothing trains meanwhile, so nothing on screen changes.

    .venv/bin/python -m bench.idle_cpu
    .venv/bin/python -m bench.idle_cpu --seconds 60

Prints, per tab, the browser's and the server's CPU use in % of one core. Target: the browser under 3% of a core
on every tab. Exit status 0 when it is met.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil
from playwright.sync_api import sync_playwright

from app import store
from app.store.db import make_engine, session_scope, upgrade_database
from bench.harness import dashboard
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.spec.config import validate_spec

CHROMIUM = "/usr/bin/chromium"
TABS = ("runs", "run", "groups")
TARGET = 3.0  # % of one core, the browser, on every tab


def seed(db_url: str, steps: int) -> None:
    """One completed run of ``steps`` steps: metrics, a group of 4 outputs per step and a log."""
    from sqlalchemy import update

    from app.store.models import Run

    tokens = ["6", "*", "7", "=", "42", "\n", "####", " 42", "</s>"]
    with session_scope(db_url) as s:
        run_id = store.create_run(s, validate_spec({"name": "idle", "steps_per_iteration": steps}).to_dict(), "idle")
        for step in range(1, steps + 1):
            store.record_step(
                s,
                run_id,
                step,
                1,
                {
                    "reward_mean": step / steps,
                    "kl": 1e-4 * step,
                    "loss": 0.1,
                    "grad_norm": 0.5,
                    "entropy": 1.0,
                    "time/step": 1.0,
                },
            )
            samples = [
                SampleRecord(
                    completion="".join(tokens),
                    tokens=tokens,
                    reward=float(i % 2),
                    advantages=[i % 2 - 0.5] * len(tokens),
                    reward_components={"correct": float(i % 2)},
                )
                for i in range(4)
            ]
            store.record_groups(s, run_id, step, [GroupRecord("6*7", "42", samples).to_dict()])
        for step in range(1, steps + 1):
            store.append_log(s, run_id, f"step {step}")
        s.execute(update(Run).where(Run.id == run_id).values(status="completed", step=steps))


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """The user + system CPU seconds of ``processes`` (those that still exist)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def browser_processes() -> list[psutil.Process]:
    """Every Chromium process under this one (Playwright's driver starts them)."""
    return [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name().lower()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        db_url = f"sqlite:///{data / 'grpo.sqlite'}"
        upgrade_database(db_url)
        seed(db_url, args.steps)
        make_engine(db_url).dispose()
        results = {}
        # no worker: the server's process is the web server alone, whose CPU use is measured
        with dashboard(data, GRPO_EMBEDDED_WORKER="0") as (url, server), sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            page.wait_for_selector("#runs-table tr.run-row")
            server_process = psutil.Process(server.pid)
            for tab in TABS:
                page.locator(f"#tab-{tab}-button").click()
                time.sleep(args.settle)
                processes = browser_processes()
                before, server_before, start = cpu_seconds(processes), cpu_seconds([server_process]), time.monotonic()
                time.sleep(args.seconds)
                elapsed = time.monotonic() - start
                results[tab] = (
                    100 * (cpu_seconds(processes) - before) / elapsed,
                    100 * (cpu_seconds([server_process]) - server_before) / elapsed,
                )
            browser.close()
    print(f"idle dashboard tab, {args.seconds:g} s per tab, nothing running (% of one core):")
    for tab, (browser_pct, server_pct) in results.items():
        print(f"  {tab:<7} browser {browser_pct:5.1f}%   server {server_pct:5.1f}%")
    worst = max(b for b, _ in results.values())
    print(f"worst tab: browser {worst:.1f}% (target under {TARGET:g}%): {'met' if worst < TARGET else 'NOT met'}")
    return 0 if worst < TARGET else 1


if __name__ == "__main__":
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.exit(main())
