"""What does an open dashboard tab cost, while nothing runs and while a run trains?

Starts a real ``grpo-dashboard serve`` (SQLite store, no worker) in a fresh data dir holding one completed run of
--steps steps (20) with its metrics, groups and log, opens it in Chromium (headless, 1280x900) and, on each of the
Runs, Run and Groups tabs in turn, waits --settle seconds (5), then measures for --seconds (20) the CPU time the
browser's processes and the server's process use. Nothing trains meanwhile, so nothing on screen changes.

With ``--during-run`` the server runs its embedded workers and a long built-in run trains throughout (launched through
``/launch_run``, one step every second or two here): the same measure on the same tabs, the workers' own CPU left
out (the server's process is the web server; its workers are processes of their own). Then, on the Run tab, how long
each new step the store records takes to show on the page (its progress bar's ``data-step``), over --steps-shown (10)
steps.

    .venv/bin/python -m bench.idle_cpu
    .venv/bin/python -m bench.idle_cpu --seconds 60
    .venv/bin/python -m bench.idle_cpu --during-run --cache-dir ~/.cache/grpo-dashboard-ci/builtin

Prints, per tab, the browser's and the server's CPU use in % of one core. Targets: idle, the browser under 3% of a
core on every tab; during a run, the browser and the server together under 3%, and every step shown within 2 s.
Exit status 0 when they are met.
"""

from __future__ import annotations

import argparse
import json
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
TARGET = 3.0  # % of one core, the browser (idle), the browser and the server together (during a run), on every tab
SHOWN_WITHIN = 2.0  # seconds from a step's recording to the Run tab showing it
# a run whose steps take seconds here, as a real model's take a minute: most ticks find nothing written
RUN_SPEC = {"name": "watched", "steps_per_iteration": 5000, "eval_every": 0, "checkpoint_every": 0, "batch_size": 64}


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


def measure_tabs(page, server, settle: float, seconds: float) -> dict[str, tuple[float, float]]:
    """Per tab: the browser's and the server's CPU use over ``seconds``, in % of one core, after ``settle``."""
    results = {}
    server_process = psutil.Process(server.pid)
    for tab in TABS:
        page.locator(f"#tab-{tab}-button").click()
        time.sleep(settle)
        processes = browser_processes()
        before, server_before, start = cpu_seconds(processes), cpu_seconds([server_process]), time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - start
        results[tab] = (
            100 * (cpu_seconds(processes) - before) / elapsed,
            100 * (cpu_seconds([server_process]) - server_before) / elapsed,
        )
    return results


def recorded_step(db_url: str, run_id: int) -> int:
    with session_scope(db_url) as s:
        return store.get_run(s, run_id)["step"] or 0


def shown_delays(page, db_url: str, run_id: int, steps: int) -> list[float]:
    """On the Run tab, for ``steps`` new steps: seconds from the store recording a step to the page showing it."""
    page.locator("#tab-run-button").click()
    delays = []
    while len(delays) < steps:
        last = recorded_step(db_url, run_id)
        while (now := recorded_step(db_url, run_id)) == last:
            time.sleep(0.02)
        recorded = time.monotonic()
        page.wait_for_function(
            "step => Number(document.querySelector('#run-progress .run-progress')?.dataset.step) >= step",
            arg=now,
            timeout=30_000,
        )
        delays.append(time.monotonic() - recorded)
    return delays


def watch(args, data: Path) -> tuple[dict, list[float]]:
    """The dashboard open in Chromium on ``data``'s store: each tab's CPU use, and with ``--during-run`` a run
    trained meanwhile and the delays of its steps' showing."""
    db_url = f"sqlite:///{data / 'grpo.sqlite'}"
    settings = {"GRPO_EMBEDDED_WORKER": "1" if args.during_run else "0"}
    if args.cache_dir:
        settings["GRPO_CACHE_DIR"] = str(Path(args.cache_dir).expanduser().resolve())
    with dashboard(data, **settings) as (url, server), sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.wait_for_selector("#runs-table tr.run-row")
        delays = []
        if args.during_run:
            from gradio_client import Client

            spec = {**RUN_SPEC, **json.loads(args.spec)}
            run_id = Client(url, verbose=False).predict(spec, api_name="/launch_run")["run_id"]
            while recorded_step(db_url, run_id) < 3:  # past the model's loading and the first steps
                time.sleep(0.5)
            page.locator("#tab-runs-button").click()
            page.locator(f"#runs-table tr.run-row[data-run-id='{run_id}']").click()  # the Run tab shows it
        results = measure_tabs(page, server, args.settle, args.seconds)
        if args.during_run:
            delays = shown_delays(page, db_url, run_id, args.steps_shown)
        browser.close()
    return results, delays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of the completed run the store holds")
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--during-run", action="store_true", help="a built-in run trains while the tabs are measured")
    parser.add_argument("--steps-shown", type=int, default=10, help="--during-run: steps timed to show on the Run tab")
    parser.add_argument("--spec", default="{}", help="--during-run: JSON run-spec keys over the watched run's")
    parser.add_argument("--cache-dir", help="--during-run: the built-in model's cache (default: built in the data dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        db_url = f"sqlite:///{data / 'grpo.sqlite'}"
        upgrade_database(db_url)
        seed(db_url, args.steps)
        make_engine(db_url).dispose()
        results, delays = watch(args, data)
    what = "a built-in run training" if args.during_run else "nothing running"
    print(f"open dashboard tab, {args.seconds:g} s per tab, {what} (% of one core):")
    for tab, (browser_pct, server_pct) in results.items():
        print(
            f"  {tab:<7} browser {browser_pct:5.1f}%   server {server_pct:5.1f}%   together {browser_pct + server_pct:5.1f}%"
        )
    if not args.during_run:
        worst = max(b for b, _ in results.values())
        print(f"worst tab: browser {worst:.1f}% (target under {TARGET:g}%): {'met' if worst < TARGET else 'NOT met'}")
        return 0 if worst < TARGET else 1
    worst = max(b + s for b, s in results.values())
    print(
        f"worst tab: browser and server {worst:.1f}% (target under {TARGET:g}%): {'met' if worst < TARGET else 'NOT met'}"
    )
    late = max(delays)
    print(
        f"a new step shown on the Run tab after {', '.join(f'{d:.2f}' for d in delays)} s; slowest {late:.2f} s "
        f"(target within {SHOWN_WITHIN:g} s): {'met' if late <= SHOWN_WITHIN else 'NOT met'}"
    )
    return 0 if worst < TARGET and late <= SHOWN_WITHIN else 1


if __name__ == "__main__":
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.exit(main())
