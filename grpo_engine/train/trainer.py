"""The GRPO training loop: Algorithm 1 of DeepSeekMath (arXiv 2402.03300), read top to bottom.

    for iteration = 1..I:
        pi_ref <- policy                                   (reference reset)
        for step = 1..M:
            1. sample B questions, G outputs each from pi_old (= the policy, no grad)
            2. score every output (verifier / step checker, or the learned ORM / PRM)
            3. advantages: outcome (4.1.2) or process (4.1.3) supervision
            4. mu policy updates maximising J_GRPO (Eq. 3) with the k3 KL penalty (Eq. 4)
            5. report metrics and groups to the recorder; evaluate every eval_every steps
        reward: model -> refresh the reward model on fresh labelled policy samples + a replay

With ``reward: model`` the reward model is first trained, before step 1, on outputs of the initial
policy labelled by the verifier (ORM) or the step checker (PRM).

Run in several processes (``devices`` > 1, launched by the worker through Accelerate), every process
runs this loop on its share of the B questions (whole groups, see parallel.py): gradients are averaged,
metrics and groups gathered, and only the main process records and checkpoints.

Shapes: B questions (in one process: its B / devices), G outputs each, N = B*G sequences, P prompt
tokens, T completion tokens.
"""

from __future__ import annotations

import gc
import random
import time
from pathlib import Path

import torch

from grpo_engine.report.recorder import Recorder, StopRequested, TrainResult, TrainStatus, no_check, stop_check
from grpo_engine.rm.rm_training import RewardModelState, Sampler, train_reward_model
from grpo_engine.rollout.outputs import RMExample
from grpo_engine.spec.config import RunSpec
from grpo_engine.train import checkpoint
from grpo_engine.train.evaluation import eval_summary, heldout_metrics
from grpo_engine.train.learner import Learner
from grpo_engine.train.loading import load_learner, new_iteration, unsharded_policy
from grpo_engine.train.parallel import peak_memory, reset_peak_memory
from grpo_engine.train.schedule import learning_rate_at, set_learning_rate
from grpo_engine.train.sharding import SHARDED_DIR, full_state_dict, save_sharded
from grpo_engine.train.step import grpo_step


def train(
    spec: RunSpec, recorder: Recorder, cache_dir: Path, device: str | None = None, checkpoint_dir: Path | None = None
) -> TrainResult:
    """Run GRPO as ``spec`` says, reporting to ``recorder``. Returns how it ended (status, step, last metrics).

    status (a TrainStatus) is completed; cancelled when ``recorder.should_stop()`` said so at a step boundary; or
    paused when it said "pause" (a checkpoint of the state was saved first, when checkpointing is on).
    ``checkpoint_dir``: where the run's checkpoints live (None: none are saved). If it holds one, the
    run resumes from the newest; every ``spec.checkpoint_every`` steps a new one is saved, and at the
    end the trained policy is saved in ``checkpoint_dir/final`` (Hugging Face format). What the run is doing
    (loading, training k/N, evaluating, saving, ...) is reported to ``recorder.phase`` as it goes.
    """
    t_load = time.time()
    try:
        loaded = load_learner(spec, recorder, Path(cache_dir), device)
    except StopRequested as stopped:  # cancelled or stopped while loading (the built-in model's build included)
        return stopped_while_loading(recorder, stopped.reason)
    run = TrainingRun(spec, recorder, checkpoint_dir, *loaded)
    # What is loaded now (the libraries, the model's modules, the tokenizer) lives as long as the run: the cyclic
    # garbage collector leaves it alone from here on. Its full collections, which every step's garbage brings on
    # now and then, then scan only what was made since: ~10 ms instead of ~0.2-0.3 s on the built-in model.
    # Unfrozen and collected when the run ends, however it ends: a worker's next run (under its memory cap,
    # after an out-of-memory failure too) starts without this one's cycles.
    gc.freeze()
    try:
        return _train(run, spec, recorder, t_load)
    finally:
        gc.unfreeze()
        del run
        gc.collect()


def stop_status(reason: bool | str) -> TrainStatus:
    """The status a run stopped for ``reason`` (Recorder.should_stop's value) ends with."""
    return TrainStatus.PAUSED if reason == "pause" else TrainStatus.CANCELLED


def stopped_while_loading(recorder: Recorder, reason: bool | str) -> TrainResult:
    """End the run before this attempt trained anything: nothing to save (a paused run resumes from its last
    checkpoint, as it would have). ``step`` 0: no step of this attempt."""
    status = stop_status(reason)
    recorder.log(f"{status} while loading")
    return TrainResult(status, 0, {})


def _train(run: TrainingRun, spec: RunSpec, recorder: Recorder, t_load: float) -> TrainResult:
    """train's loop, from resuming a checkpoint to the run's result."""
    start_iteration = run.resume()
    recorder.log(
        f"ready in {time.time() - t_load:.1f}s: {sum(p.numel() for p in run.learner.params):,} trainable "
        f"parameters, {len(run.train_set)} training / {len(run.heldout)} held-out questions"
    )
    recorder.resume(run.step)
    recorder.start(spec.total_steps)
    run.log_peak_memory("loading", torch.device("cpu"))  # each process's host memory since it started
    reset_peak_memory(run.learner.dev)  # the peak logged at the end is training's, not loading's
    try:
        if run.step == 0:
            run.before_training()
        if not spec.evaluates_only:
            run.training_phase()
        for iteration in range(start_iteration, spec.iterations + 1):
            if (
                iteration > 1 and run.step == (iteration - 1) * spec.steps_per_iteration
            ):  # (not when resumed mid-iteration)
                gc.unfreeze()  # what the reset lets go of (LoRA's adapter and optimizer) can be collected
                new_iteration(run.learner)
                gc.freeze()
            while run.step < iteration * spec.steps_per_iteration:
                stop = run.procs.from_main(recorder.should_stop())  # all processes stop at the same step
                if stop:
                    return run.stop(stop, iteration)
                run.next_step(iteration)
    except StopRequested as stopped:  # asked to stop in the middle of the reward model's work
        return run.stop_in_rm_work(stopped.reason)
    return run.finish()


class TrainingRun:
    """One run in progress: its learner and data, the step reached, and what is done around a GRPO step
    (evaluation, the reward model's training, recording, checkpoints). ``train`` drives it."""

    def __init__(
        self,
        spec: RunSpec,
        recorder: Recorder,
        checkpoint_dir: Path | None,
        learner: Learner,
        train_set: list[dict],
        heldout: list[dict],
        rm_state: RewardModelState | None,
    ):
        self.spec, self.recorder, self.checkpoint_dir = spec, recorder, checkpoint_dir
        self.learner, self.train_set, self.heldout, self.rm_state = learner, train_set, heldout, rm_state
        self.procs, self.rm = learner.procs, learner.rm
        self.rng = random.Random(spec.seed)  # which questions each step draws
        self.step = 0  # the last finished step
        self.saved_step = 0  # the step of the newest checkpoint on disk (0: none)
        self.attempt_dir: Path | None = None  # this attempt's checkpoints (checkpoint.begin_attempt, in resume)
        self.metrics: dict[str, float] = {}  # the last step's

    def resume(self) -> int:
        """Restore the newest checkpoint, if an earlier attempt left one; returns the iteration to start in."""
        if self.checkpoint_dir is not None:  # sealing the attempts before this one: no stale process writes here
            main = self.procs.main
            self.attempt_dir = self.procs.from_main(checkpoint.begin_attempt(self.checkpoint_dir) if main else None)
        found = checkpoint.latest(self.checkpoint_dir) if self.checkpoint_dir is not None else None
        if found is None:
            if self.procs.rank > 0:  # each process samples with its own random stream (the main one keeps the seed)
                torch.manual_seed(self.spec.seed + self.procs.rank)
            return 1
        self.recorder.phase("loading model")  # the policy (and optimizer) saved in the checkpoint
        state = checkpoint.read_state(found[1])
        # (LoRA after iteration 1: the saved policy is the base with the earlier adapters folded in plus the
        # current adapter, under the same parameter names as this freshly wrapped model)
        checkpoint.load(
            found[1],
            state,
            policy=self.learner.unwrapped(),
            optimizer=self.learner.optimizer,
            reference=self.learner.reference,
            rng=self.rng,
            rm=self.rm,
            rm_rng=self.rm_state and self.rm_state.rng,
            rank=self.procs.rank,
        )
        if self.rm is not None:
            self.rm_state.history = [RMExample(**e) for e in state["rm_history"] or []]
        self.step = self.saved_step = state["step"]
        self.recorder.log(f"resuming from the checkpoint after step {self.step} (iteration {state['iteration']})")
        return state["iteration"]

    def before_training(self) -> None:
        """Step 0: the reward model's first training (reward: model) and the initial policy's accuracy."""
        metrics = {}
        if self.rm is not None:
            metrics = self.train_reward_model()
            source = (
                f"solutions of {self.spec.rm_data!r}"
                if self.rm_state.data
                else f"outputs of the initial policy labelled by {self.spec.label_source}"
            )
            self.recorder.log(
                f"{self.rm_state.name} trained on {len(self.rm_state.history)} {source}: "
                f"loss {metrics['rm/loss']:.3f}, held-out accuracy {metrics['rm/accuracy_after']:.3f}"
            )
        if self.spec.eval_every:
            t_eval = time.time()
            self.recorder.phase("evaluating")
            evaluated, questions = heldout_metrics(self.learner, self.heldout, 0)
            metrics.update(evaluated)
            self.recorder.evaluation(0, questions)
            metrics["time/eval"] = time.time() - t_eval
            self.recorder.log(f"step 0: {eval_summary(metrics)}")
        if metrics:
            self.recorder.step(0, 0, metrics)
        if self.spec.evaluates_only:
            self.metrics = metrics  # the run's result: its only evaluation

    def next_step(self, iteration: int) -> None:
        """One GRPO step on B fresh questions, then what falls due after it: recording the groups, evaluation,
        the reward model's refresh at the end of an iteration, a checkpoint."""
        spec, step = self.spec, self.step + 1
        self.step = step
        t0 = time.time()
        record = bool(spec.record_every) and (step % spec.record_every == 0 or step == spec.total_steps)
        # this step's scheduled learning rate, from its number alone (a resumed run, LoRA's new optimizer)
        set_learning_rate(
            self.learner.optimizer,
            learning_rate_at(step - 1, spec.total_steps, spec.learning_rate, spec.lr_warmup_steps, spec.lr_schedule),
        )
        # B questions, the same on every process, each of which keeps its share (whole groups)
        result = grpo_step(self.learner, self.questions(spec.batch_size // self.procs.n), record, self.questions)
        metrics = self.metrics = result.metrics
        if record:
            self.recorder.groups(step, self.procs.gather(result.groups))
        metrics["time/step"] = time.time() - t0  # the step itself: evaluation and an RM refresh are timed apart
        if spec.eval_every and (step % spec.eval_every == 0 or step == spec.total_steps):
            t_eval = time.time()
            self.recorder.phase("evaluating")
            evaluated, questions = heldout_metrics(self.learner, self.heldout, step)
            metrics.update(evaluated)
            self.recorder.evaluation(step, questions)
            metrics["time/eval"] = time.time() - t_eval
        # RM refresh (Algorithm 1) at the end of every iteration but the last, after which nothing uses the RM
        if self.rm is not None and step == iteration * spec.steps_per_iteration and iteration < spec.iterations:
            t_refresh = time.time()
            metrics.update(self.train_reward_model())
            self.recorder.log(
                f"iteration {iteration}: {self.rm_state.name} refreshed on {metrics['rm/train_examples']:.0f} examples "
                f"(the policy's samples labelled by {self.spec.label_source}, {metrics['rm/replayed']:.0f} replayed) "
                f"in {time.time() - t_refresh:.1f}s: loss {metrics['rm/loss']:.3f}, "
                f"held-out accuracy {metrics['rm/accuracy_before']:.3f} -> {metrics['rm/accuracy_after']:.3f}"
            )
        self.recorder.step(step, iteration, metrics)
        self.training_phase()
        if "eval/accuracy" in metrics:
            kl = f"kl {metrics['kl']:.4f}" if "kl" in metrics else "no update"  # (every advantage 0)
            self.recorder.log(
                f"step {step}/{spec.total_steps}: reward_mean {metrics['reward_mean']:.3f}, {kl}, "
                f"{eval_summary(metrics)}"
            )
        if self.checkpointing and step % spec.checkpoint_every == 0 and step < spec.total_steps and self.owns_run():
            self.save_checkpoint(iteration)
            self.training_phase()

    def questions(self, m: int) -> list[dict]:
        """m fresh questions for this process: m x processes drawn from the training set (the same on every
        process), of which each keeps its share."""
        return self.procs.share(self.rng.sample(self.train_set, m * self.procs.n))

    def training_phase(self) -> None:
        """Report the "training" phase: steps done of the run's total."""
        self.recorder.phase("training", self.step, self.spec.total_steps)

    @property
    def checkpointing(self) -> bool:
        return self.checkpoint_dir is not None and bool(self.spec.checkpoint_every)

    def stop(self, stop: bool | str, iteration: int) -> TrainResult:
        """End the run before the next step: "pause" saves a checkpoint first (when checkpointing is on and
        none holds this step yet); anything else cancels."""
        if stop == "pause":
            if self.checkpointing and self.step > self.saved_step:
                self.save_checkpoint(iteration)
            self.recorder.log(f"paused before step {self.step + 1}")
            return TrainResult(TrainStatus.PAUSED, self.step, self.metrics)
        self.recorder.log(f"cancelled before step {self.step + 1}")
        return TrainResult(TrainStatus.CANCELLED, self.step, self.metrics)

    def stop_in_rm_work(self, stop: bool | str) -> TrainResult:
        """End the run in the middle of the reward model's sampling or training: no checkpoint is saved (the
        work is half done), so a paused run resumes from its last checkpoint and does that work again."""
        status = stop_status(stop)
        self.recorder.log(
            f"{status} during the reward model's work at step {self.step}"
            + (f"; it resumes after step {self.saved_step}" if status == TrainStatus.PAUSED else "")
        )
        return TrainResult(status, self.saved_step if status == TrainStatus.PAUSED else self.step, {})

    def log_peak_memory(self, phase: str, device: torch.device) -> None:
        """Every process calls it: with several, the main one logs each one's peak memory on ``device``
        (parallel.peak_memory: on the CPU, the peak resident set)."""
        if self.procs.n == 1:
            return
        peaks = self.procs.gather([peak_memory(device)])
        where = "GPU memory" if device.type == "cuda" else "resident memory"
        self.recorder.log(f"peak {where} per process while {phase}: " + ", ".join(f"{p / 1e9:.2f} GB" for p in peaks))

    def finish(self) -> TrainResult:
        """Save the trained policy for download (step checkpoints are no longer needed) and end the run; an
        evaluation-only run trained nothing and saves nothing."""
        learner = self.learner
        if self.spec.evaluates_only:
            self.recorder.log("evaluated the model; nothing trained (steps_per_iteration 0), no policy saved")
            self.log_peak_memory("evaluating", learner.dev)
            return TrainResult(TrainStatus.COMPLETED, self.step, self.metrics)
        self.recorder.log(f"finished {self.step} steps")
        self.log_peak_memory("training", learner.dev)
        # a sharded policy is gathered whole onto the main process (every process takes part) and saved from there
        weights = full_state_dict(learner.unwrapped()) if self.checkpoint_dir is not None and learner.sharded else None
        if self.checkpoint_dir is not None and self.procs.main:
            t = time.time()
            self.recorder.phase("saving")
            checkpoint.save_final(
                self.checkpoint_dir / "final",
                learner.unwrapped() if weights is None else unsharded_policy(learner, weights),
                learner.tokenizer,
                lora=self.spec.lora_rank > 0,
                source_dtype=learner.source_dtype,
            )
            checkpoint.clear(self.checkpoint_dir)
            self.recorder.log(f"final policy saved in {time.time() - t:.1f}s")
        self.procs.barrier()
        return TrainResult(TrainStatus.COMPLETED, self.step, self.metrics)

    def owns_run(self) -> bool:
        """Whether this attempt may still write the run's checkpoints: not once it has lost the run (its worker is
        gone, or another worker took the run over). A step in flight when its worker was killed ends, but the fresh
        worker that takes the run over may already be resuming from the checkpoint directory, which the orphaned
        processes then leave alone. Every process gets the main process's answer: a sharded save is collective."""
        return self.procs.from_main(self.recorder.should_stop()) != "lost"

    def save_checkpoint(self, iteration: int) -> None:
        """The main process saves the state, with every process's random states."""
        t = time.time()
        procs, rm, rm_state, learner = self.procs, self.rm, self.rm_state, self.learner
        states = procs.gather([checkpoint.process_random_state()]) if procs.n > 1 else None
        self.saved_step = self.step
        reference = learner.reference if iteration > 1 else None
        sharded = None
        if learner.sharded:  # every process writes its shards into the main process's new checkpoint directory
            sharded = procs.from_main(checkpoint.temp_dir(self.attempt_dir, self.step) if procs.main else None)
            save_sharded(sharded / SHARDED_DIR, learner.unwrapped(), learner.optimizer, reference)
        if procs.main:
            self.recorder.phase("saving")
            self.recorder.flush()  # what was reported up to this step is recorded before the checkpoint exists
            path = checkpoint.save(
                self.attempt_dir,
                step=self.step,
                iteration=iteration,
                policy=learner.unwrapped(),
                optimizer=learner.optimizer,
                reference=reference,
                lora=self.spec.lora_rank > 0,
                rng=self.rng,
                rm=rm,
                rm_rng=rm_state and rm_state.rng,
                rm_history=rm_state.history if rm is not None else None,
                keep=self.spec.checkpoint_keep,
                process_states=states,
                sharded=sharded,
            )
            self.recorder.checkpoint(self.step, str(path))
            self.recorder.log(f"checkpoint after step {self.step} saved in {time.time() - t:.1f}s")
        procs.barrier()  # no process runs ahead of a checkpoint that is still being written

    def train_reward_model(self) -> dict[str, float]:
        """Train (or refresh) the reward model on the main process; every process then gets its weights."""
        metrics, learner = {}, self.learner
        # one process: stop requests are heeded between batches of this work; several processes wait for the main
        # one here, so they all stop together at the next step boundary instead
        check = stop_check(self.recorder.should_stop) if self.procs.n == 1 else no_check
        with learner.gathered():  # a sharded policy: the main process samples with it alone
            if self.procs.main:
                sampler = Sampler(
                    learner.unwrapped(), learner.tokenizer, learner.prompt, learner.dev, learner.completer
                )
                metrics = train_reward_model(
                    self.rm,
                    self.rm_state,
                    sampler,
                    train_set=self.train_set,
                    heldout=self.heldout,
                    spec=self.spec,
                    check=check,
                    progress=self.reward_model_progress,
                )
        self.procs.broadcast_module(self.rm)
        return self.procs.from_main(metrics)

    def reward_model_progress(self, done: int, total: int) -> None:
        """Report the "training reward model" phase: batches of its sampling and training done of their total."""
        self.recorder.phase("training reward model", done, total)
