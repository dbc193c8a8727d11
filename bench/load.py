"""Does the dashboard hold up under many watchers while a run trains?

Starts a real ``grpo-dashboard serve`` (embedded SQLite store, broker and worker) in a fresh data dir, trains a
short run alone to measure its unloaded step time, then launches a long run and, while it trains, has --clients
``gradio_client`` clients (16) poll the read endpoints the dashboard's tabs poll (``/list_runs``, ``/get_run``,
``/get_metrics``, ``/list_groups``, ``/get_group``) for --seconds (120), each client one call every --interval
seconds (0.4: its five endpoints every 2 s, as the dashboard's tabs poll; 0: each call right after the last).

    .venv/bin/python -m bench.load --cache-dir /tmp/grpo-cache          # reuse a built-in model cached there
    .venv/bin/python -m bench.load --clients 16 --seconds 120

Prints the requests made, the errors, p50 / p95 / max latency per endpoint and overall, the steps the loaded
run recorded (each exactly once) and its median step time against the unloaded one. Targets: 0 errors, p95
under 1 s, and the loaded step time at most 2x the unloaded one. Exit status 0 when all are met.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import dashboard, pass_fail

ENDPOINTS = ("/list_runs", "/get_run", "/get_metrics", "/list_groups", "/get_group")
SPEC = {"steps_per_iteration": 30, "eval_every": 0, "checkpoint_every": 0}


def wait_for(client, run_id: int, done, what: str, timeout: float = 900) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        run = client.predict(run_id, api_name="/get_run")
        if done(run):
            return run
        if run["status"] == "failed":
            raise SystemExit(f"run {run_id} failed: {run['error']}")
        time.sleep(1)
    raise SystemExit(f"timed out waiting for {what}")


def step_times(client, run_id: int, after: int = 0) -> list[float]:
    return [
        m["time/step"]
        for m in client.predict(run_id, api_name="/get_metrics")
        if m["step"] > after and m.get("time/step") is not None
    ]


def poller(url: str, run_id: int, stop: threading.Event, out: dict, interval: float) -> None:
    """One client: the endpoints in turn, a call every ``interval`` seconds (or right after the last when it took
    longer), until ``stop``."""
    from gradio_client import Client

    # ssl_verify=False: the URL is plain HTTP, so nothing is verified either way; with the default, gradio_client
    # loads the CA bundle into a new SSL context for every request (~25 ms of CPU per call, most of a client's
    # cost), and 16 such clients would need this machine's both cores for themselves
    client = Client(url, verbose=False, ssl_verify=False)
    k, group_id = 0, None
    while not stop.wait(interval if k else 0):
        endpoint = ENDPOINTS[k % len(ENDPOINTS)]
        k += 1
        started = time.perf_counter()
        try:
            if endpoint == "/list_runs":
                client.predict(api_name=endpoint)
            elif endpoint == "/get_group":
                if group_id is not None:
                    client.predict(group_id, api_name=endpoint)
            elif endpoint == "/list_groups":
                groups = client.predict(run_id, None, None, api_name=endpoint)
                group_id = groups[0]["group_id"] if groups else None  # the group the next call opens
            else:
                client.predict(run_id, api_name=endpoint)
            out.setdefault(endpoint, []).append(time.perf_counter() - started)
        except Exception as e:  # noqa: BLE001 (every failure is counted and shown)
            out.setdefault("errors", []).append(f"{endpoint}: {type(e).__name__}: {e}"[:300])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="built-in model cache (default: one in the data dir, built first)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument(
        "--interval",
        type=float,
        default=0.4,
        help="seconds between one client's calls (0.4: its five endpoints every 2 s, as the tabs poll)",
    )
    args = parser.parse_args()
    from gradio_client import Client

    data_dir = Path(tempfile.mkdtemp(prefix="grpo-load-"))
    cache = {"GRPO_CACHE_DIR": str(Path(args.cache_dir).resolve())} if args.cache_dir else {}
    with dashboard(data_dir, **cache) as (url, _):
        client = Client(url, verbose=False)
        print(f"dashboard {url}, data dir {data_dir}", flush=True)
        alone = client.predict({**SPEC, "name": "alone"}, api_name="/launch_run")["run_id"]
        wait_for(client, alone, lambda r: r["status"] == "completed", "the unloaded run")
        unloaded = statistics.median(step_times(client, alone, after=5))  # the first steps warm up
        loaded_id = client.predict({**SPEC, "name": "loaded", "steps_per_iteration": 100_000}, api_name="/launch_run")[
            "run_id"
        ]
        first = wait_for(client, loaded_id, lambda r: r["step"] >= 5, "the loaded run's first steps")["step"]
        stop, results = threading.Event(), [dict() for _ in range(args.clients)]
        threads = [
            threading.Thread(target=poller, args=(url, loaded_id, stop, out, args.interval), daemon=True)
            for out in results
        ]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join(60)
        client.predict(loaded_id, api_name="/cancel_run")
        metrics = client.predict(loaded_id, api_name="/get_metrics")
        clients_cpu = time.process_time()

    latencies = {e: [x for out in results for x in out.get(e, [])] for e in ENDPOINTS}
    every = [x for values in latencies.values() for x in values]
    errors = [x for out in results for x in out.get("errors", [])]
    steps = [m["step"] for m in metrics]
    during = [m["time/step"] for m in metrics if m["step"] > first and m.get("time/step") is not None]
    loaded = statistics.median(during) if during else float("inf")
    print(f"{args.clients} clients for {args.seconds:.0f} s: {len(every)} requests, {len(errors)} errors")
    print(f"{'endpoint':14} {'calls':>6} {'p50 s':>7} {'p95 s':>7} {'max s':>7}")
    for name, values in [*latencies.items(), ("all", every)]:
        if values:
            print(
                f"{name:14} {len(values):6d} {statistics.median(values):7.3f} {percentile(values, 0.95):7.3f} "
                f"{max(values):7.3f}"
            )
    once = steps == list(range(steps[0], steps[0] + len(steps))) if steps else False
    print(
        f"the loaded run recorded steps {steps[0] if steps else '-'}..{steps[-1] if steps else '-'}, "
        f"{'each once' if once else 'NOT each once'}"
    )
    print(f"median step time: unloaded {unloaded:.3f} s, under load {loaded:.3f} s ({loaded / unloaded:.2f}x)")
    print(
        f"CPU: the clients (this process) used {clients_cpu:.0f} s of the machine's "
        f"{(os.cpu_count() or 1) * args.seconds:.0f} core-seconds while polling"
    )
    for e in errors[:5]:
        print("  error:", e)
    return pass_fail(bool(every) and not errors and percentile(every, 0.95) < 1.0 and loaded <= 2 * unloaded and once)


if __name__ == "__main__":
    sys.exit(main())
