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

import copy
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoint
from .config import RunSpec, decode_delimiter
from .data import load_dataset
from .math_shepherd import load_math_shepherd
from .memory import estimate_memory, too_big_message
from .model import disable_dropout, load_policy, resolve_model_path
from .parallel import Processes
from .recorder import Recorder
from .reward_model import RewardModel, RMExample, accuracy as rm_accuracy, fit as rm_fit, load_reward_model, replay_mix
from .rewards import outcome_reward
from .sampling import generate
from .step import Learner, completion_texts, encode_prompts, grpo_step, judge, rm_examples
from .tokenization import completion_mask, end_token_ids, prompt_formatter

EVAL_BATCH = 256


def resolve_precision(precision: str, device_type: str, bf16_supported: bool) -> str:
    """Accelerate's ``mixed_precision`` for a run-spec ``precision`` on a device: "bf16" or "no".

    auto -> bf16 on a CUDA device that supports it, else no autocast; fp32 -> no; bf16 -> bf16, which
    a CUDA device without bf16 support refuses (ValueError naming the key). bf16 autocast on CPU is
    supported by torch, though rarely faster there.
    """
    if precision == "fp32":
        return "no"
    if precision == "auto":
        return "bf16" if device_type == "cuda" and bf16_supported else "no"
    if precision == "bf16":
        if device_type == "cuda" and not bf16_supported:
            raise ValueError("precision: this GPU does not support bf16; use 'fp32' or 'auto'")
        return "bf16"
    raise ValueError(f"precision: unknown value {precision!r}")


def make_accelerator(device: str | None, precision: str):
    """The run's Accelerator: it places the models and runs their forward passes under autocast.

    ``device``: None picks what Accelerate sees (a GPU when there is one), "cpu" forces the CPU.
    One worker process runs many jobs one after another, each with its own precision, so the
    process-wide Accelerate state left by an earlier job is cleared first (unless this process is
    part of a distributed launch).
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    cpu = device == "cpu" or (device is None and not torch.cuda.is_available())
    if device not in (None, "cpu") and not str(device).startswith("cuda"):
        raise ValueError(f"device must be None, 'cpu' or 'cuda', got {device!r}")
    if not (PartialState._shared_state and PartialState().use_distributed):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    device_type = "cpu" if cpu else "cuda"
    bf16_ok = (not cpu) and torch.cuda.is_bf16_supported()
    return Accelerator(cpu=cpu, mixed_precision=resolve_precision(precision, device_type, bf16_ok))


@torch.no_grad()
def evaluate(policy, tokenizer, prompt, examples: list[dict], max_new_tokens: int, device) -> float:
    """Held-out greedy accuracy: the share of questions whose final answer is exactly right."""
    policy.eval()
    correct = 0.0
    for i in range(0, len(examples), EVAL_BATCH):
        chunk = examples[i : i + EVAL_BATCH]
        prompts = encode_prompts(tokenizer, [e["question"] for e in chunk], device, prompt)
        comps = generate(policy, tokenizer, prompts, repeat=1, max_new_tokens=max_new_tokens, greedy=True)
        texts = completion_texts(tokenizer, comps, *completion_mask(comps, end_token_ids(policy, tokenizer)))
        correct += sum(outcome_reward(t, e["answer"])[0] for t, e in zip(texts, chunk))
    return correct / max(1, len(examples))


@torch.no_grad()
def sample_labelled(policy, tokenizer, prompt, questions: list[dict], spec: RunSpec, kind: str,
                    device) -> list[RMExample]:
    """One output per question from the current policy (sampled as in training), labelled without humans:
    by the verifier (ORM) or the step checker (PRM). Generates B x G outputs at a time."""
    policy.eval()
    out = []
    for i in range(0, len(questions), spec.batch_size * spec.group_size):
        chunk = questions[i : i + spec.batch_size * spec.group_size]
        prompts = encode_prompts(tokenizer, [e["question"] for e in chunk], device, prompt)
        completions = generate(policy, tokenizer, prompts, repeat=1, greedy=False, max_new_tokens=spec.max_new_tokens,
                               temperature=spec.temperature, top_p=spec.top_p)
        mask, ended = completion_mask(completions, end_token_ids(policy, tokenizer))
        out += rm_examples(judge(tokenizer, completions, mask, ended, chunk, kind == "prm",
                                 delimiter=decode_delimiter(spec.step_delimiter)), chunk, kind)
    return out


def train_reward_model(rm: RewardModel, history: list[RMExample], policy, tokenizer, prompt, train_set: list[dict],
                       heldout: list[dict], spec: RunSpec, rng: random.Random, device,
                       data: tuple[list[RMExample], list[RMExample]] | None = None) -> dict[str, float]:
    """Train the RM on fresh labelled samples of the current policy mixed with a replay of ``history``.

    The first call (empty history) is the RM's initial training on the initial policy's outputs; later
    calls are Algorithm 1's refresh, and also measure the RM's accuracy on held-out fresh policy
    samples before it. Questions are drawn at random (with replacement). Appends the fresh samples to
    ``history``; returns the rm/* metrics.

    ``data`` (rm_data: Math-Shepherd-labelled solutions, as (pool, held out)): the fresh examples are the
    next rm_samples of the pool not used before (from the start again once all were used), and accuracy
    is measured on the held-out ones, instead of sampling and labelling the policy's outputs.
    """
    if data is not None:
        pool, held = data
        start = len(history) % len(pool)  # every example drawn so far is in the history
        fresh = (pool[start:] + pool[:start])[: spec.rm_samples]
    else:
        held = sample_labelled(policy, tokenizer, prompt, rng.choices(heldout, k=max(1, spec.rm_samples // 4)), spec, rm.kind,
                               device)
        fresh = sample_labelled(policy, tokenizer, prompt, rng.choices(train_set, k=spec.rm_samples), spec, rm.kind, device)
    metrics = {"rm/accuracy_before": rm_accuracy(rm, held)} if history else {}  # before this (re)training
    mixed, n_replayed = replay_mix(fresh, history, spec.rm_replay_ratio, rng)
    metrics["rm/loss"] = rm_fit(rm, mixed, spec.rm_learning_rate, rng)
    metrics["rm/accuracy_after"] = rm_accuracy(rm, held)
    metrics["rm/train_examples"] = float(len(mixed))
    metrics["rm/replayed"] = float(n_replayed)
    history.extend(fresh)
    return metrics


def _wrap_lora(policy, rank: int):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear",
                        task_type="CAUSAL_LM")
    return get_peft_model(policy, config)


def check_memory(policy, spec: RunSpec, bf16: bool, dev: torch.device, log, rm_params: int | None = None) -> None:
    """Log the estimated memory of the run's weights, gradients, optimizer state and reference (memory.py), and
    refuse (ValueError naming the keys to change) a run on a GPU whose memory it exceeds. ``policy``: loaded,
    LoRA-wrapped when the run uses LoRA. ``rm_params``: the learned reward model's parameters; None counts it as
    large as the policy's base when it starts from the policy's weights (0 without one, or before a reward model
    from another checkpoint is loaded: the check is then made again with it)."""
    params = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    if rm_params is None:
        rm_params = params - trainable * (spec.lora_rank > 0) if spec.reward == "model" and not spec.reward_model else 0
    estimate = estimate_memory(params, trainable, lora=spec.lora_rank > 0, bf16=bf16, rm_params=rm_params)
    log(f"memory estimate (activations not included): {estimate.describe()}")
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        if estimate.total > props.total_memory:
            raise ValueError(too_big_message(estimate, props.total_memory, f"this worker's GPU ({props.name})",
                                             lora=spec.lora_rank > 0, bf16=bf16))


def run_device(spec_device: str, device: str | None = None) -> str | None:
    """The device a run trains on: ``device`` when given (tests force "cpu"), else by the spec's
    ``device`` key: "cpu", "gpu" (refused on a machine without CUDA) or "auto" (None: a GPU if any)."""
    if device is not None:
        return device
    if spec_device == "cpu":
        return "cpu"
    if spec_device == "gpu" and not torch.cuda.is_available():
        raise ValueError("device: the run asks for 'gpu' but this worker has no CUDA GPU")
    return None


@dataclass
class RewardModelState:
    """A learned reward model's training: its examples so far (replayed at each refresh), its random stream,
    and Math-Shepherd data when ``rm_data`` is given (pool, held out)."""

    name: str
    history: list[RMExample] = field(default_factory=list)
    rng: random.Random | None = None
    data: tuple[list[RMExample], list[RMExample]] | None = None


def load_learner(spec: RunSpec, recorder: Recorder, cache_dir: Path, device: str | None):
    """Place the run (Accelerate), load the policy (fp32, dropout off), the dataset, the reference and the
    optimizer, and the learned reward model (reward: model). Returns (learner, train set, held-out set,
    RewardModelState or None)."""
    accelerator = make_accelerator(run_device(spec.device, device), spec.precision)
    dev = accelerator.device
    procs = Processes(accelerator)  # one, or the data-parallel processes of a run with devices > 1
    if procs.n != spec.devices:
        raise ValueError(f"devices: the run asks for {spec.devices} processes but was started in {procs.n}")
    torch.manual_seed(spec.seed)
    bf16 = accelerator.mixed_precision == "bf16"
    recorder.log(f"loading model {spec.model!r} on {dev} ({'bf16 mixed precision' if bf16 else 'fp32'})"
                 + (f", {procs.n} data-parallel processes ({accelerator.distributed_type.value})" if procs.n > 1 else ""))
    if procs.n > 1:  # a built-in model is created by the main process (transformers saves from rank 0 only)
        if procs.main:
            for name in {spec.model, *([spec.reward_model or spec.model] if spec.reward == "model" else [])}:
                resolve_model_path(name, cache_dir, log=recorder.log)
        procs.barrier()
    policy, tokenizer = load_policy(spec.model, cache_dir, dev, log=recorder.log)
    disable_dropout(policy)  # training forwards must match sampling's: pi_old, pi_ref and pi_theta alike
    if spec.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    recorder.log(f"loading dataset {spec.dataset!r}")
    train_set, heldout = load_dataset(spec.dataset, config=spec.dataset_config, split=spec.dataset_split,
                                      eval_split=spec.eval_split,
                                      fields=(spec.question_field, spec.answer_field, spec.solution_field))
    if spec.batch_size > len(train_set):
        raise ValueError(f"batch_size {spec.batch_size} is larger than the dataset's {len(train_set)} training rows")
    if spec.lora_rank > 0:
        policy = _wrap_lora(policy, spec.lora_rank)
    check_memory(policy, spec, bf16, dev, recorder.log)
    if spec.lora_rank > 0:
        reference = None  # the base model with the adapter disabled
    else:  # frozen: in bf16 under bf16 autocast, where its forward passes run in bf16 anyway
        reference = copy.deepcopy(policy).eval().requires_grad_(False).to(torch.bfloat16 if bf16 else torch.float32)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)
    policy, optimizer = accelerator.prepare(policy, optimizer)  # placed on dev; forward under autocast
    learner = Learner(spec, accelerator, procs, policy, optimizer, params, reference, tokenizer,
                      prompt_formatter(tokenizer, spec.prompt_template), end_token_ids(policy, tokenizer),
                      decode_delimiter(spec.step_delimiter))
    rm_state = load_reward_model_state(learner, recorder, cache_dir, bf16) if spec.reward == "model" else None
    return learner, train_set, heldout, rm_state


def load_reward_model_state(learner: Learner, recorder: Recorder, cache_dir: Path, bf16: bool) -> RewardModelState:
    """A learned ORM (outcome) or PRM (process), its backbone started from a causal LM, set on ``learner.rm``;
    with ``rm_data``, its Math-Shepherd-labelled solutions (a tenth, at most rm_samples / 4, held out)."""
    spec, dev = learner.spec, learner.dev
    kind = "orm" if spec.supervision == "outcome" else "prm"
    state = RewardModelState(f"{kind.upper()} from {(spec.reward_model or spec.model)!r}",
                             rng=random.Random(spec.seed + 1))
    recorder.log(f"loading the reward model: {state.name}")
    # the RM reads prompts as the policy does (its own tokenizer's chat template, when it starts elsewhere)
    rm = load_reward_model(resolve_model_path(spec.reward_model or spec.model, cache_dir, log=recorder.log),
                           kind, dev, prompt_template="auto" if spec.reward_model else spec.prompt_template,
                           prior_dtype=torch.bfloat16 if bf16 else torch.float32, delimiter=learner.delimiter,
                           autocast=learner.accelerator.autocast)
    if spec.reward_model:  # the estimate again, with this reward model's size
        check_memory(learner.unwrapped(), spec, bf16, dev, recorder.log,
                     rm_params=sum(p.numel() for p in rm.backbone.parameters()))
    learner.rm = rm
    if spec.rm_data:  # Math-Shepherd-labelled solutions instead of the step checker's labels
        labelled, skipped = load_math_shepherd(spec.rm_data)
        labelled = [RMExample(q, steps, labels) for q, steps, labels in labelled]
        random.Random(spec.seed + 2).shuffle(labelled)
        n_held = max(1, min(len(labelled) // 10, spec.rm_samples // 4))
        state.data = (labelled[:-n_held], labelled[-n_held:])
        recorder.log(f"rm_data {spec.rm_data!r}: {len(labelled)} step-labelled solutions ({skipped} rows skipped), "
                     f"{n_held} held out to measure the PRM")
    return state


def new_iteration(learner: Learner) -> None:
    """Algorithm 1's reference reset at the start of iterations 2, 3, ...: the reference becomes the policy.
    LoRA: the adapter is folded into the base (the new reference) and a fresh adapter is trained, with a new
    optimizer."""
    if learner.reference is not None:
        learner.reference.load_state_dict(learner.unwrapped().state_dict())
        return
    accelerator = learner.accelerator
    accelerator.free_memory()  # forgets the previous model and optimizer
    policy = _wrap_lora(learner.unwrapped().merge_and_unload(), learner.spec.lora_rank)
    learner.params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(learner.params, lr=learner.spec.learning_rate, weight_decay=0.0)
    learner.policy, learner.optimizer = accelerator.prepare(policy, optimizer)


def train(spec: RunSpec, recorder: Recorder, cache_dir: Path, device: str | None = None,
          checkpoint_dir: Path | None = None) -> dict:
    """Run GRPO as ``spec`` says, reporting to ``recorder``. Returns {status, step, metrics}.

    status is "completed"; "cancelled" when ``recorder.should_stop()`` said so at a step boundary; or
    "paused" when it said "pause" (a checkpoint of the state was saved first, when checkpointing is on).
    ``checkpoint_dir``: where the run's checkpoints live (None: none are saved). If it holds one, the
    run resumes from the newest; every ``spec.checkpoint_every`` steps a new one is saved, and at the
    end the trained policy is saved in ``checkpoint_dir/final`` (Hugging Face format).
    """
    t_load = time.time()
    learner, train_set, heldout, rm_state = load_learner(spec, recorder, Path(cache_dir), device)
    procs, rm = learner.procs, learner.rm
    rng = random.Random(spec.seed)

    # resume from the newest checkpoint, if an earlier attempt left one
    step, start_iteration = 0, 1
    found = checkpoint.latest(checkpoint_dir) if checkpoint_dir is not None else None
    if found is not None:
        state = checkpoint.read_state(found[1])
        step, start_iteration = state["step"], state["iteration"]
        # (LoRA after iteration 1: the saved policy is the base with the earlier adapters folded in plus the
        # current adapter, under the same parameter names as this freshly wrapped model)
        checkpoint.load(found[1], state, policy=learner.unwrapped(), optimizer=learner.optimizer,
                        reference=learner.reference, rng=rng, rm=rm, rm_rng=rm_state and rm_state.rng, rank=procs.rank)
        if rm is not None:
            rm_state.history = [RMExample(**e) for e in state["rm_history"] or []]
        recorder.log(f"resuming from the checkpoint after step {step} (iteration {start_iteration})")
    elif procs.rank > 0:  # each process samples with its own random stream (the main one keeps the run's seed)
        torch.manual_seed(spec.seed + procs.rank)
    recorder.log(f"ready in {time.time() - t_load:.1f}s: {sum(p.numel() for p in learner.params):,} trainable "
                 f"parameters, {len(train_set)} training / {len(heldout)} held-out questions")
    recorder.resume(step)
    recorder.start(spec.total_steps)
    saved_step = step  # the step of the newest checkpoint on disk (0: none)

    def save_checkpoint(iteration: int) -> None:
        """The main process saves the state, with every process's random states."""
        nonlocal saved_step
        t = time.time()
        states = procs.gather([checkpoint.process_random_state()]) if procs.n > 1 else None
        saved_step = step
        if procs.main:
            recorder.flush()  # what was reported up to this step is recorded before the checkpoint exists
            path = checkpoint.save(
                checkpoint_dir, step=step, iteration=iteration, policy=learner.unwrapped(),
                optimizer=learner.optimizer, reference=learner.reference if iteration > 1 else None,
                lora=spec.lora_rank > 0, rng=rng, rm=rm, rm_rng=rm_state and rm_state.rng,
                rm_history=rm_state.history if rm is not None else None, keep=spec.checkpoint_keep,
                process_states=states)
            recorder.checkpoint(step, str(path))
            recorder.log(f"checkpoint after step {step} saved in {time.time() - t:.1f}s")
        procs.barrier()  # no process runs ahead of a checkpoint that is still being written

    def eval_accuracy() -> float:
        """Held-out greedy accuracy; each process evaluates every n-th question."""
        mine = heldout[procs.rank::procs.n]
        correct = evaluate(learner.unwrapped(), learner.tokenizer, learner.prompt, mine, spec.max_new_tokens,
                           learner.dev) * len(mine)
        return procs.sum([correct])[0] / max(1, len(heldout))

    def refresh_reward_model() -> dict[str, float]:
        """Train (or refresh) the reward model on the main process; every process then gets its weights."""
        metrics = {}
        if procs.main:
            metrics = train_reward_model(rm, rm_state.history, learner.unwrapped(), learner.tokenizer, learner.prompt,
                                         train_set,
                                         heldout, spec, rm_state.rng, learner.dev, rm_state.data)
        procs.broadcast_module(rm)
        return procs.from_main(metrics)

    start_metrics = {}
    if rm is not None and step == 0:
        start_metrics = refresh_reward_model()
        source = f"solutions of {spec.rm_data!r}" if rm_state.data else "labelled outputs of the initial policy"
        recorder.log(f"{rm_state.name} trained on {len(rm_state.history)} {source}: "
                     f"loss {start_metrics['rm/loss']:.3f}, held-out accuracy {start_metrics['rm/accuracy_after']:.3f}")
    if spec.eval_every and step == 0:
        start_metrics["eval/accuracy"] = eval_accuracy()
        recorder.log(f"step 0: eval/accuracy {start_metrics['eval/accuracy']:.3f}")
    if start_metrics:
        recorder.step(0, 0, start_metrics)

    metrics = {}
    for iteration in range(start_iteration, spec.iterations + 1):
        if iteration > 1 and step == (iteration - 1) * spec.steps_per_iteration:  # (not when resumed mid-iteration)
            new_iteration(learner)
        while step < iteration * spec.steps_per_iteration:
            stop = procs.from_main(recorder.should_stop())  # all processes stop at the same step
            if stop == "pause":
                if checkpoint_dir is not None and spec.checkpoint_every and step > saved_step:
                    save_checkpoint(iteration)
                recorder.log(f"paused before step {step + 1}")
                return {"status": "paused", "step": step, "metrics": metrics}
            if stop:
                recorder.log(f"cancelled before step {step + 1}")
                return {"status": "cancelled", "step": step, "metrics": metrics}
            step += 1
            t0 = time.time()
            # B questions, the same on every process, each of which keeps its share (whole groups)
            record = bool(spec.record_every) and (step % spec.record_every == 0 or step == spec.total_steps)
            result = grpo_step(learner, procs.share(rng.sample(train_set, spec.batch_size)), record)
            metrics = result.metrics
            if record:
                recorder.groups(step, procs.gather(result.groups))
            metrics["time/step"] = time.time() - t0  # the step itself: evaluation and an RM refresh are timed apart
            if spec.eval_every and (step % spec.eval_every == 0 or step == spec.total_steps):
                t_eval = time.time()
                metrics["eval/accuracy"] = eval_accuracy()
                metrics["time/eval"] = time.time() - t_eval
            # RM refresh (Algorithm 1) at the end of every iteration but the last, after which nothing uses the RM
            if rm is not None and step == iteration * spec.steps_per_iteration and iteration < spec.iterations:
                t_refresh = time.time()
                metrics.update(refresh_reward_model())
                recorder.log(f"iteration {iteration}: {rm_state.name} refreshed on {metrics['rm/train_examples']:.0f} "
                             f"examples ({metrics['rm/replayed']:.0f} replayed) in {time.time() - t_refresh:.1f}s: "
                             f"loss {metrics['rm/loss']:.3f}, held-out accuracy {metrics['rm/accuracy_before']:.3f} -> "
                             f"{metrics['rm/accuracy_after']:.3f}")
            recorder.step(step, iteration, metrics)
            if "eval/accuracy" in metrics:
                recorder.log(f"step {step}/{spec.total_steps}: reward_mean {metrics['reward_mean']:.3f}, "
                             f"kl {metrics['kl']:.4f}, eval/accuracy {metrics['eval/accuracy']:.3f}")
            if (checkpoint_dir is not None and spec.checkpoint_every and step % spec.checkpoint_every == 0
                    and step < spec.total_steps):
                save_checkpoint(iteration)
    recorder.log(f"finished {step} steps")
    if checkpoint_dir is not None and procs.main:  # the trained policy, for download; step checkpoints are no longer needed
        t = time.time()
        checkpoint.save_final(checkpoint_dir / "final", learner.unwrapped(), learner.tokenizer, lora=spec.lora_rank > 0)
        for _, old in checkpoint.step_dirs(checkpoint_dir):
            shutil.rmtree(old, ignore_errors=True)
        recorder.log(f"final policy saved in {time.time() - t:.1f}s")
    procs.barrier()
    return {"status": "completed", "step": step, "metrics": metrics}
