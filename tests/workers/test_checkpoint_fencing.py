"""No stale process writes a checkpoint that a resumption reads or writes.

A worker killed during a save leaves its processes running (an orphan finishing the save). Each attempt at a run
writes into a directory of its own, and the next attempt seals the ones before it (grpo_engine.train.checkpoint):
an orphan's save, slowed half-way until the next attempt has begun, then fails to land, and one killed half-way
leaves only an incomplete directory that no resumption reads. The run, paused and resumed twice with such an
orphan each time, records every step once and the same metrics as a run straight through.

Short real runs of grpo_engine.train.trainer.train on the built-in model; the orphans are processes of this test
that run the product's checkpoint.save, slowed by the test.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path

from grpo_engine.spec.config import validate_spec
from grpo_engine.train import checkpoint
from grpo_engine.train.trainer import train
from tests.support.runs import BASE, PauseAt, metrics_by_step

ORPHAN_STEP = 99  # the step an orphan's checkpoint would carry: no listing may ever show it
LANDED, REFUSED = 0, 3  # an orphan's exit codes: its save landed, or it failed on its directory sealed under it


def orphan_save(attempt_dir: str, wait_for: str, ready) -> None:
    """An orphaned process of an earlier attempt finishing a save: its weights written, then held (``ready`` set)
    until the path ``wait_for`` exists (the next attempt has begun; "" = until killed), then the rest and the
    rename. Exits LANDED, or REFUSED where a write or the rename failed."""
    import random

    import torch

    real = checkpoint.save_file

    def held(tensors, path, *args, **kwargs):  # the optimizer's tensors: half-way through the save
        ready.set()
        while not (wait_for and Path(wait_for).exists()):
            time.sleep(0.05)
        real(tensors, path, *args, **kwargs)

    checkpoint.save_file = held
    model = torch.nn.Linear(2, 2)
    try:
        checkpoint.save(
            Path(attempt_dir),
            step=ORPHAN_STEP,
            iteration=1,
            policy=model,
            optimizer=torch.optim.AdamW(model.parameters()),
            reference=None,
            lora=False,
            rng=random.Random(0),
        )
    except Exception:  # its next write, or its rename, finds its directory gone (sealed: renamed away)
        raise SystemExit(REFUSED) from None
    raise SystemExit(LANDED)


def start_orphan(attempt_dir: Path, wait_for: Path | None):
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    orphan = context.Process(target=orphan_save, args=(str(attempt_dir), str(wait_for or ""), ready))
    orphan.start()
    assert ready.wait(120), "the orphan did not start its save"
    assert list(attempt_dir.glob(".tmp-step-*")), "the orphan's half-written checkpoint"
    return orphan


def steps_listed(run_dir: Path) -> list[int]:
    return [step for step, _ in checkpoint.step_dirs(run_dir)]


def test_an_orphaned_save_never_lands_where_a_resumption_reads_or_writes(grpo_cache_dir, tmp_path):
    spec = validate_spec(BASE)  # 6 steps, a checkpoint every 2
    straight = PauseAt(None)
    assert train(spec, straight, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "straight").status == (
        "completed"
    )
    run_dir = tmp_path / "run"

    first = PauseAt(2)  # attempt 1 stops after step 2 ...
    assert train(spec, first, grpo_cache_dir, device="cpu", checkpoint_dir=run_dir).status == "paused"
    attempt1, attempt2 = run_dir / "attempt-000001", run_dir / "attempt-000002"
    # ... while a process of it goes on saving, held half-way until attempt 2 has begun
    late = start_orphan(attempt1, wait_for=attempt2)
    second = PauseAt(4)
    assert train(spec, second, grpo_cache_dir, device="cpu", checkpoint_dir=run_dir).status == "paused"
    late.join(60)
    assert late.exitcode == REFUSED  # its directory was sealed under it
    assert ORPHAN_STEP not in steps_listed(run_dir) and not attempt1.exists()

    killed = start_orphan(attempt2, wait_for=None)  # attempt 2's orphan, killed half-way through its save
    killed.kill()
    killed.join(30)
    assert killed.exitcode == -signal.SIGKILL
    third = PauseAt(None)
    assert train(spec, third, grpo_cache_dir, device="cpu", checkpoint_dir=run_dir).status == "completed"

    assert second.resumed == [2] and third.resumed == [4]  # each resumed from its predecessor's newest checkpoint
    recorded = [m["step"] for r in (first, second, third) for m in r.metrics]
    assert recorded == [0, 1, 2, 3, 4, 5, 6]  # every step once (step 0: the evaluation before training)
    assert {**metrics_by_step(first), **metrics_by_step(second), **metrics_by_step(third)} == metrics_by_step(straight)
    assert steps_listed(run_dir) == [] and (run_dir / "final" / "model" / "model.safetensors").exists()
    assert not [p for p in run_dir.iterdir() if p.name != "final"]  # every attempt's directory cleared


def test_checkpoints_saved_before_attempts_had_directories_are_resumed_from(tmp_path):
    """A run saved as <run dir>/step-<n> (before this layout) resumes from its newest checkpoint after an upgrade."""
    run_dir = tmp_path / "run"
    for step in (2, 4):
        (run_dir / f"step-{step:08d}").mkdir(parents=True)
        (run_dir / f"step-{step:08d}" / "state.json").write_text("{}")
    assert checkpoint.begin_attempt(run_dir).name == "attempt-000001"
    assert checkpoint.latest(run_dir) == (4, run_dir / "sealed-000000" / "step-00000004")


def test_a_directory_made_again_by_an_orphan_is_never_resumed_from(tmp_path):
    """An orphan that starts a save after its attempt was sealed makes its old directory again: the next attempt
    deletes it unread, and keeps the sealed checkpoint it resumes from."""
    run_dir = tmp_path / "run"
    one = checkpoint.begin_attempt(run_dir)
    (one / "step-00000002").mkdir()
    (one / "step-00000002" / "state.json").write_text("{}")
    two = checkpoint.begin_attempt(run_dir)
    assert two.name == "attempt-000002" and not one.exists()
    assert checkpoint.latest(run_dir) == (2, run_dir / "sealed-000001" / "step-00000002")
    (one / f"step-{ORPHAN_STEP:08d}").mkdir(parents=True)  # the orphan of attempt 1, writing again
    (one / f"step-{ORPHAN_STEP:08d}" / "state.json").write_text("{}")
    three = checkpoint.begin_attempt(run_dir)
    assert three.name == "attempt-000003" and not one.exists()
    assert checkpoint.latest(run_dir) == (2, run_dir / "sealed-000001" / "step-00000002")
    assert sorted(p.name for p in run_dir.iterdir()) == ["attempt-000003", "sealed-000001"]
