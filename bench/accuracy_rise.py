"""How fast a default run on the built-in model and dataset learns, end to end.

Starts the real dashboard (embedded SQLite store, broker and worker) in a temporary data directory,
launches a run with the default spec through ``gradio_client`` (the same endpoint the browser's
launch button calls), polls it until it ends, and prints held-out accuracy against wall time.

    .venv/bin/python -m bench.accuracy_rise               # a fresh data dir: includes creating the built-in model
    .venv/bin/python -m bench.accuracy_rise --cache-dir D # reuse a built-in model cached in D
    .venv/bin/python -m bench.accuracy_rise --url http://127.0.0.1:7860   # against a running dashboard
    .venv/bin/python -m bench.accuracy_rise --spec '{"supervision": "process"}'   # other settings

Prints one line per evaluation and a summary: the first and best eval/accuracy, the rise in points,
seconds from launch to the first evaluation at +20 points, to the first at --target (0.90), and to completion.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.harness import dashboard


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running dashboard; default: start one in a temporary data dir")
    parser.add_argument("--cache-dir", help="GRPO_CACHE_DIR for the started dashboard (default: inside the data dir)")
    parser.add_argument("--spec", default="{}", help="JSON run spec (default: all defaults)")
    parser.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
    parser.add_argument("--target", type=float, default=0.90, help="also report when eval/accuracy first reaches this")
    args = parser.parse_args()
    with ExitStack() as stack:
        url = args.url
        if url is None:
            data_dir = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
            cache = {"GRPO_CACHE_DIR": str(Path(args.cache_dir).resolve())} if args.cache_dir else {}
            url, _ = stack.enter_context(dashboard(data_dir, **cache))
            print(f"dashboard {url}, data dir {data_dir}")
        return launch_and_watch(url, args)


def launch_and_watch(url: str, args) -> int:
    """Launch the run on the dashboard at ``url``, print its evaluations until it ends; the exit status."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    spec = json.loads(args.spec)
    t0 = time.time()
    run_id = client.predict(spec, api_name="/launch_run")["run_id"]
    print(f"run {run_id} launched with {spec or 'the defaults'}")
    seen, first, reached, reached_target, status = set(), None, None, None, "queued"
    print(f"{'seconds':>8} {'step':>5} {'eval/accuracy':>14}")
    while time.time() - t0 < args.timeout:
        run = client.predict(run_id, api_name="/get_run")
        status = run["status"]
        for m in client.predict(run_id, api_name="/get_metrics"):
            if "eval/accuracy" in m and m["step"] not in seen:
                seen.add(m["step"])
                acc = m["eval/accuracy"]
                elapsed = time.time() - t0
                first = acc if first is None else first
                if reached is None and acc >= first + 0.20:
                    reached = elapsed
                if reached_target is None and acc >= args.target:
                    reached_target = (elapsed, m["step"])
                print(f"{elapsed:8.1f} {m['step']:5d} {acc:14.3f}", flush=True)
        if status in ("completed", "failed", "cancelled"):
            break
        time.sleep(1.0)
    total = time.time() - t0
    accs = [m["eval/accuracy"] for m in client.predict(run_id, api_name="/get_metrics") if "eval/accuracy" in m]
    print(f"status: {status}{' (' + run['error'] + ')' if run.get('error') else ''}")
    if accs:
        print(
            f"eval/accuracy: first {accs[0]:.3f}, last {accs[-1]:.3f}, best {max(accs):.3f}, "
            f"rise {100 * (max(accs) - accs[0]):.1f} points"
        )
    print(
        f"seconds from launch to +20 points: {reached:.1f}"
        if reached is not None
        else "eval/accuracy never rose by 20 points"
    )
    print(
        f"seconds from launch to eval/accuracy >= {args.target:.2f}: {reached_target[0]:.1f} (step {reached_target[1]})"
        if reached_target is not None
        else f"eval/accuracy never reached {args.target:.2f}"
    )
    print(f"seconds from launch to the end of the run: {total:.1f}")
    return 0 if status == "completed" and reached is not None else 1


if __name__ == "__main__":
    sys.exit(main())
