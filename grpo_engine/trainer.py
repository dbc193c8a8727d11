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
import math
from contextlib import nullcontext
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import checkpoint
from .config import RunSpec, decode_delimiter
from .data import STEP_DELIMITER, format_prompt, load_dataset
from .math_shepherd import load_math_shepherd
from .memory import estimate_memory, too_big_message
from .model import disable_dropout, load_policy, resolve_model_path
from .objective import grpo_loss, outcome_advantages, process_advantages
from .parallel import Processes
from .recorder import GroupRecord, Recorder, SampleRecord
from .reward_model import RewardModel, RMExample, accuracy as rm_accuracy, fit as rm_fit, load_reward_model, replay_mix
from .rewards import check_step, outcome_reward
from .sampling import generate
from .tokenization import completion_mask, end_token_ids, prompt_formatter, step_boundaries, token_pieces

EVAL_BATCH = 256
ENTROPY_CHUNK = 8  # completion positions whose entropy is computed at once


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


def _encode_prompts(tokenizer, questions: list[str], device) -> dict[str, torch.Tensor]:
    """Left-padded prompt batch: input_ids and attention_mask, both (B, P). The prompt text comes from
    ``tokenizer.grpo_prompt`` (set by train() from the run's prompt_template), else the plain template."""
    fmt = getattr(tokenizer, "grpo_prompt", format_prompt)
    enc = tokenizer([fmt(q) for q in questions], return_tensors="pt", padding=True, add_special_tokens=False)
    return {k: v.to(device) for k, v in enc.items()}


def token_logprobs(model, prompt_ids, prompt_attn, completions, mask,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(o_t | q, o_<t) of each completion token under the distribution it was sampled from, and the
    per-token entropy of that distribution. Both (N, T).

    Outputs are drawn from softmax(logits / T) with T the sampling temperature, so the ratio to pi_old and
    the KL to pi_ref are taken between those distributions: log pi(o_t) = log_softmax(logits / T)[o_t].
    Example: logits [2, 0] at T = 2 -> log_softmax([1, 0]) = [-0.3133, -1.3133] (at T = 1: [-0.1269, -2.1269]).
    """
    ids = torch.cat([prompt_ids, completions], dim=1)  # (N, P+T)
    attn = torch.cat([prompt_attn, mask.long()], dim=1)  # (N, P+T)
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)  # left padding: positions start at each prompt
    T = completions.shape[1]
    # only the T + 1 last positions go through the output layer (those before the prompt's last predict nothing)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False,
                   logits_to_keep=T + 1).logits  # (N, T+1, V)
    logits = logits[:, :-1].float()  # (N, T, V): the logits that predict o_t
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)  # (N, T, V)
    logp = logp_all.gather(-1, completions.unsqueeze(-1)).squeeze(-1)  # (N, T)
    with torch.no_grad():  # entropy is reported, not trained on; a few positions at a time bound the memory
        entropy = torch.cat([-(chunk.exp() * chunk).sum(-1) for chunk in logp_all.split(ENTROPY_CHUNK, dim=1)], dim=1)
    return logp, entropy


def completion_texts(tokenizer, completions, mask, ended) -> list[str]:
    """Each completion's text: its tokens up to its end token (not included), special tokens left out."""
    content = (mask.sum(dim=1).long() - ended.long()).tolist()  # (N,) tokens before the end token
    return tokenizer.batch_decode([row[:n] for row, n in zip(completions.tolist(), content)], skip_special_tokens=True)


@torch.no_grad()
def evaluate(policy, tokenizer, examples: list[dict], max_new_tokens: int, device) -> float:
    """Held-out greedy accuracy: the share of questions whose final answer is exactly right."""
    policy.eval()
    correct = 0.0
    for i in range(0, len(examples), EVAL_BATCH):
        chunk = examples[i : i + EVAL_BATCH]
        prompts = _encode_prompts(tokenizer, [e["question"] for e in chunk], device)
        comps = generate(policy, tokenizer, prompts, repeat=1, max_new_tokens=max_new_tokens, greedy=True)
        texts = completion_texts(tokenizer, comps, *completion_mask(comps, end_token_ids(policy, tokenizer)))
        correct += sum(outcome_reward(t, e["answer"])[0] for t, e in zip(texts, chunk))
    return correct / max(1, len(examples))


def token_texts(tokenizer, ids: set[int]) -> dict[int, str]:
    """The text of each token id decoded alone (the group view shows end tokens so), remembered on the
    tokenizer: a run decodes the same few ids over and over."""
    known = tokenizer.__dict__.setdefault("_grpo_token_texts", {})
    new = sorted(ids - known.keys())
    if new:
        known.update(zip(new, tokenizer.batch_decode([[t] for t in new])))
    return known


def judge(tokenizer, completions, mask, ended, examples: list[dict], process: bool,
          format_weight: float = 0.0, delimiter: str = STEP_DELIMITER) -> dict[str, list]:
    """Decode N sampled outputs and judge them with the rules; ``examples[i]`` is output i's question.

    Returns lists of N: ``texts``, ``tokens`` (each token's text in context, see token_pieces, so that they
    spell the text; then the end token's own text, as the group view shows them), ``outcome`` ((reward,
    components) from the verifier) and, when ``process``, ``steps`` (cut from those texts), ``step_ends``
    (0-based token index of each step's end; the end token is no step) and ``verdicts`` (the step
    checker's, 1.0 / 0.0).
    """
    lengths, ended = mask.sum(dim=1).long().tolist(), ended.tolist()
    ids = [completions[i, : lengths[i]].tolist() for i in range(len(examples))]
    pieces = token_pieces(tokenizer, [row[: n - int(e)] for row, n, e in zip(ids, lengths, ended)])
    end_text = token_texts(tokenizer, {row[-1] for row, e in zip(ids, ended) if e})
    texts = ["".join(p) for p in pieces]
    out = {"texts": texts, "tokens": [], "outcome": [], "steps": [], "step_ends": [], "verdicts": []}
    for i, ex in enumerate(examples):
        out["tokens"].append(pieces[i] + ([end_text[ids[i][-1]]] if ended[i] else []))
        out["outcome"].append(outcome_reward(texts[i], ex["answer"], format_weight))
        if process:
            steps, ends = step_boundaries(pieces[i], delimiter)
            out["steps"].append(steps)
            out["step_ends"].append(ends)
            out["verdicts"].append([float(check_step(s, ex["question"], steps[:j])) for j, s in enumerate(steps)])
    return out


def rm_examples(judged: dict[str, list], examples: list[dict], kind: str, labelled: bool = True) -> list[RMExample]:
    """The reward model's view of judged outputs: ORM the whole output labelled by the verifier,
    PRM its steps labelled by the step checker (``labelled=False``: no labels, for scoring only)."""
    if kind == "orm":
        return [RMExample(ex["question"], [text], [comps["correct"]] if labelled else [])
                for ex, text, (_, comps) in zip(examples, judged["texts"], judged["outcome"])]
    return [RMExample(ex["question"], steps, verdicts if labelled else [])
            for ex, steps, verdicts in zip(examples, judged["steps"], judged["verdicts"])]


@torch.no_grad()
def sample_labelled(policy, tokenizer, questions: list[dict], spec: RunSpec, kind: str, device) -> list[RMExample]:
    """One output per question from the current policy (sampled as in training), labelled without humans:
    by the verifier (ORM) or the step checker (PRM). Generates B x G outputs at a time."""
    policy.eval()
    out = []
    for i in range(0, len(questions), spec.batch_size * spec.group_size):
        chunk = questions[i : i + spec.batch_size * spec.group_size]
        prompts = _encode_prompts(tokenizer, [e["question"] for e in chunk], device)
        completions = generate(policy, tokenizer, prompts, repeat=1, greedy=False, max_new_tokens=spec.max_new_tokens,
                               temperature=spec.temperature, top_p=spec.top_p)
        mask, ended = completion_mask(completions, end_token_ids(policy, tokenizer))
        out += rm_examples(judge(tokenizer, completions, mask, ended, chunk, kind == "prm",
                                 delimiter=decode_delimiter(spec.step_delimiter)), chunk, kind)
    return out


def train_reward_model(rm: RewardModel, history: list[RMExample], policy, tokenizer, train_set: list[dict],
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
        held = sample_labelled(policy, tokenizer, rng.choices(heldout, k=max(1, spec.rm_samples // 4)), spec, rm.kind,
                               device)
        fresh = sample_labelled(policy, tokenizer, rng.choices(train_set, k=spec.rm_samples), spec, rm.kind, device)
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
    accelerator = make_accelerator(run_device(spec.device, device), spec.precision)
    dev = accelerator.device
    procs = Processes(accelerator)  # one, or the data-parallel processes of a run with devices > 1
    if procs.n != spec.devices:
        raise ValueError(f"devices: the run asks for {spec.devices} processes but was started in {procs.n}")
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    recorder.log(f"loading model {spec.model!r} on {dev} "
                 f"({'bf16 mixed precision' if accelerator.mixed_precision == 'bf16' else 'fp32'})"
                 + (f", {procs.n} data-parallel processes ({accelerator.distributed_type.value})" if procs.n > 1 else ""))
    if procs.n > 1:  # a built-in model is created by the main process (transformers saves from rank 0 only)
        if procs.main:
            for name in {spec.model, *([spec.reward_model or spec.model] if spec.reward == "model" else [])}:
                resolve_model_path(name, Path(cache_dir), log=recorder.log)
        procs.barrier()
    policy, tokenizer = load_policy(spec.model, Path(cache_dir), dev, log=recorder.log)
    disable_dropout(policy)  # training forwards must match sampling's: pi_old, pi_ref and pi_theta alike
    if spec.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    bf16 = accelerator.mixed_precision == "bf16"
    tokenizer.grpo_prompt = prompt_formatter(tokenizer, spec.prompt_template)  # the run's prompts travel with it
    delimiter = decode_delimiter(spec.step_delimiter)
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
    end_ids = end_token_ids(policy, tokenizer)  # the tokens that end a completion
    rm, rm_history, rm_name, rm_data = None, [], "", None
    if spec.reward == "model":  # a learned ORM (outcome) or PRM (process); its backbone starts from a causal LM
        rm_kind = "orm" if spec.supervision == "outcome" else "prm"
        rm_name = f"{rm_kind.upper()} from {(spec.reward_model or spec.model)!r}"
        recorder.log(f"loading the reward model: {rm_name}")
        # the RM reads prompts as the policy does (its own tokenizer's chat template, when it starts elsewhere)
        rm = load_reward_model(resolve_model_path(spec.reward_model or spec.model, Path(cache_dir), log=recorder.log),
                               rm_kind, dev, prompt_template="auto" if spec.reward_model else spec.prompt_template,
                               prior_dtype=torch.bfloat16 if bf16 else torch.float32)
        if spec.reward_model:  # the estimate again, with this reward model's size
            check_memory(accelerator.unwrap_model(policy), spec, bf16, dev, recorder.log,
                         rm_params=sum(p.numel() for p in rm.backbone.parameters()))
        rm.autocast = accelerator.autocast
        rm.delimiter = delimiter
        rm_rng = random.Random(spec.seed + 1)
        if spec.rm_data:  # Math-Shepherd-labelled solutions instead of the step checker's labels
            labelled, skipped = load_math_shepherd(spec.rm_data)
            labelled = [RMExample(q, steps, labels) for q, steps, labels in labelled]
            random.Random(spec.seed + 2).shuffle(labelled)
            n_held = max(1, min(len(labelled) // 10, spec.rm_samples // 4))
            rm_data = (labelled[:-n_held], labelled[-n_held:])
            recorder.log(f"rm_data {spec.rm_data!r}: {len(labelled)} step-labelled solutions ({skipped} rows skipped), "
                         f"{n_held} held out to measure the PRM")
    else:
        rm_rng = None

    # resume from the newest checkpoint, if an earlier attempt left one
    step, start_iteration = 0, 1
    found = checkpoint.latest(checkpoint_dir) if checkpoint_dir is not None else None
    if found is not None:
        state = checkpoint.read_state(found[1])
        step, start_iteration = state["step"], state["iteration"]
        # (LoRA after iteration 1: the saved policy is the base with the earlier adapters folded in plus the
        # current adapter, under the same parameter names as this freshly wrapped model)
        checkpoint.load(found[1], state, policy=accelerator.unwrap_model(policy), optimizer=optimizer,
                        reference=reference, rng=rng, rm=rm, rm_rng=rm_rng, rank=procs.rank)
        if rm is not None:
            rm_history = [RMExample(**e) for e in state["rm_history"] or []]
        recorder.log(f"resuming from the checkpoint after step {step} (iteration {start_iteration})")
    elif procs.rank > 0:  # each process samples with its own random stream (the main one keeps the run's seed)
        torch.manual_seed(spec.seed + procs.rank)
    n_params = sum(p.numel() for p in params)
    recorder.log(f"ready in {time.time() - t_load:.1f}s: {n_params:,} trainable parameters, "
                 f"{len(train_set)} training / {len(heldout)} held-out questions")
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
                checkpoint_dir, step=step, iteration=iteration, policy=accelerator.unwrap_model(policy),
                optimizer=optimizer, reference=reference if iteration > 1 else None, lora=spec.lora_rank > 0,
                rng=rng, rm=rm, rm_rng=rm_rng, rm_history=rm_history if rm is not None else None,
                keep=spec.checkpoint_keep, process_states=states)
            recorder.checkpoint(step, str(path))
            recorder.log(f"checkpoint after step {step} saved in {time.time() - t:.1f}s")
        procs.barrier()  # no process runs ahead of a checkpoint that is still being written

    def ref_logprobs(prompt_ids, prompt_attn, completions, mask):
        if reference is not None:
            with accelerator.autocast():
                return token_logprobs(reference, prompt_ids, prompt_attn, completions, mask, spec.temperature)[0]
        model = accelerator.unwrap_model(policy)
        with model.disable_adapter():
            return token_logprobs(model, prompt_ids, prompt_attn, completions, mask, spec.temperature)[0]

    def eval_accuracy() -> float:
        """Held-out greedy accuracy; each process evaluates every n-th question."""
        mine = heldout[procs.rank::procs.n]
        correct = evaluate(accelerator.unwrap_model(policy), tokenizer, mine, spec.max_new_tokens, dev) * len(mine)
        return procs.sum([correct])[0] / max(1, len(heldout))

    def refresh_reward_model() -> dict[str, float]:
        """Train (or refresh) the reward model on the main process; every process then gets its weights."""
        metrics = {}
        if procs.main:
            metrics = train_reward_model(rm, rm_history, accelerator.unwrap_model(policy), tokenizer, train_set,
                                         heldout, spec, rm_rng, dev, rm_data)
        procs.broadcast_module(rm)
        return procs.from_main(metrics)

    start_metrics = {}
    if rm is not None and step == 0:
        start_metrics = refresh_reward_model()
        source = f"solutions of {spec.rm_data!r}" if rm_data else "labelled outputs of the initial policy"
        recorder.log(f"{rm_name} trained on {len(rm_history)} {source}: "
                     f"loss {start_metrics['rm/loss']:.3f}, held-out accuracy {start_metrics['rm/accuracy_after']:.3f}")
    if spec.eval_every and step == 0:
        start_metrics["eval/accuracy"] = eval_accuracy()
        recorder.log(f"step 0: eval/accuracy {start_metrics['eval/accuracy']:.3f}")
    if start_metrics:
        recorder.step(0, 0, start_metrics)

    metrics = {}
    for iteration in range(start_iteration, spec.iterations + 1):
        begins = step == (iteration - 1) * spec.steps_per_iteration  # False: resumed in the middle of it
        if iteration > 1 and begins and reference is not None:  # reference reset (Algorithm 1)
            reference.load_state_dict(accelerator.unwrap_model(policy).state_dict())
        elif iteration > 1 and begins:  # LoRA: fold the adapter into the base (the new reference), train a fresh adapter
            accelerator.free_memory()  # forgets the previous model and optimizer
            policy = _wrap_lora(accelerator.unwrap_model(policy).merge_and_unload(), spec.lora_rank)
            params = [p for p in policy.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)
            policy, optimizer = accelerator.prepare(policy, optimizer)
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

            # 1. sample B questions (this process's share of them), G outputs each, from pi_old (the current
            #    policy, no grad)
            batch = procs.share(rng.sample(train_set, spec.batch_size))
            B = len(batch)
            prompts = _encode_prompts(tokenizer, [e["question"] for e in batch], dev)
            policy.eval()
            completions = generate(accelerator.unwrap_model(policy), tokenizer, prompts, repeat=spec.group_size, greedy=False,
                                   max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                                   top_p=spec.top_p, end_ids=end_ids)  # (N, T)
            mask, ended = completion_mask(completions, end_ids)  # (N, T), (N,)
            prompt_ids = prompts["input_ids"].repeat_interleave(spec.group_size, dim=0)  # (N, P)
            prompt_attn = prompts["attention_mask"].repeat_interleave(spec.group_size, dim=0)  # (N, P)
            t1 = time.time()

            # 2. score every output: the rules judge it (and give the true verdict "correct");
            #    with reward: model the ORM's score is r_i, or the PRM's scores are the step rewards
            N, T = completions.shape
            G = spec.group_size
            lengths = mask.sum(dim=1).long().tolist()
            rows = [batch[i // G] for i in range(N)]
            judged = judge(tokenizer, completions, mask, ended, rows, spec.supervision == "process", spec.format_reward,
                           delimiter)
            texts, token_texts, outcome = judged["texts"], judged["tokens"], judged["outcome"]
            components = [dict(c) for _, c in outcome]
            correct = torch.tensor([c["correct"] for c in components])
            scores = rm.score(rm_examples(judged, rows, rm.kind, labelled=False)) if rm is not None else None

            # 3. advantages, (N, T)
            step_rewards: list[list[float] | None] = [None] * N
            step_ends: list[list[int] | None] = [None] * N
            if spec.supervision == "outcome":
                flat = [s[0] for s in scores] if scores is not None else [r for r, _ in outcome]
                rewards = torch.tensor(flat, device=dev).view(-1, G)  # (B, G)
                advantages = outcome_advantages(rewards).view(-1, 1) * mask  # every token of o_i gets A_i
                rewards = rewards.view(-1)
            else:
                step_rewards = scores if scores is not None else judged["verdicts"]
                step_ends = judged["step_ends"]
                adv_rows = [process_advantages(step_rewards[b * G:(b + 1) * G], step_ends[b * G:(b + 1) * G], T)
                            for b in range(B)]  # each (G, T)
                advantages = torch.cat(adv_rows).to(dev) * mask
                rewards = torch.tensor([sum(r) / len(r) if r else 0.0 for r in step_rewards])
            if scores is not None:
                for c, r in zip(components, rewards.tolist()):
                    c["rm_score"] = r  # ORM: its score; PRM: the mean of its step scores
            advantages = advantages.to(dev)
            # micro-batches of sequences for every forward pass below (memory stays bounded whatever B x G)
            chunks = [slice(i, min(i + (spec.micro_batch_size or N), N)) for i in range(0, N, spec.micro_batch_size or N)]
            with torch.no_grad():
                ref_logp = torch.cat([ref_logprobs(prompt_ids[c], prompt_attn[c], completions[c], mask[c])
                                      for c in chunks]) if spec.kl_coef > 0 else None
                old_logp = None
                if spec.policy_updates_per_batch > 1:  # with mu = 1, pi_old's log-probs equal the detached current ones
                    model = accelerator.unwrap_model(policy)
                    old_logp = torch.cat([token_logprobs(model, prompt_ids[c], prompt_attn[c], completions[c], mask[c],
                                                         spec.temperature)[0]
                                          for c in chunks])
            t2 = time.time()

            # 4. mu policy updates maximising J_GRPO; the gradient of each is accumulated over the micro-batches:
            #    the loss is a mean over the N outputs, so a micro-batch's mean counts with its share of them.
            #    With several processes the gradients are averaged across them once, at the last micro-batch
            #    (each process holds as many outputs, so the average is the whole batch's mean).
            policy.train()
            grad_norm, entropy_sum, sums = 0.0, 0.0, []
            for _ in range(spec.policy_updates_per_batch):
                optimizer.zero_grad(set_to_none=True)
                loss_sum = kl_sum = clip_sum = entropy_sum = 0.0
                for k, c in enumerate(chunks):
                    with accelerator.no_sync(policy) if k < len(chunks) - 1 else nullcontext():
                        logp, ent = token_logprobs(policy, prompt_ids[c], prompt_attn[c], completions[c], mask[c],
                                                   spec.temperature)
                        old = old_logp[c] if old_logp is not None else logp.detach()
                        ref = ref_logp[c] if ref_logp is not None else logp.detach()
                        loss, stats = grpo_loss(logp, old, ref, advantages[c], mask[c], spec.clip_eps, spec.kl_coef)
                        share, tokens = (c.stop - c.start) / N, mask[c].sum().item()
                        accelerator.backward(loss * share)
                    loss_sum += loss.item() * share
                    kl_sum += stats["kl"].item() * tokens  # the stats are token means: weight them by tokens
                    clip_sum += stats["clip_frac"].item() * tokens
                    entropy_sum += (ent.detach() * mask[c]).sum().item()
                grad_norm = accelerator.clip_grad_norm_(params, 1.0).item()
                optimizer.step()
                sums += [loss_sum, kl_sum, clip_sum]
            t3 = time.time()

            # 5. report; with several processes, over the whole batch (values gathered in rank order)
            mu = spec.policy_updates_per_batch
            totals = procs.sum(sums + [entropy_sum, mask.sum().item()])
            n_tokens = max(totals[-1], 1.0)
            losses = [totals[3 * u] / procs.n for u in range(mu)]
            kls = [totals[3 * u + 1] / n_tokens for u in range(mu)]
            clips = [totals[3 * u + 2] / n_tokens for u in range(mu)]
            if spec.supervision == "outcome":
                flat_group_rewards = [rewards[b * G:(b + 1) * G].tolist() for b in range(B)]
            else:  # process advantages normalise over all step rewards of the group
                flat_group_rewards = [[r for i in range(b * G, (b + 1) * G) for r in step_rewards[i]] for b in range(B)]
            flat_group_rewards = procs.gather(flat_group_rewards)
            outputs = procs.gather(list(zip(rewards.tolist(), correct.tolist(), lengths, ended.tolist())))
            all_rewards = torch.tensor([o[0] for o in outputs])
            zero_std = sum(len(set(g)) <= 1 for g in flat_group_rewards) / len(flat_group_rewards)
            metrics = {
                "reward_mean": all_rewards.mean().item(),
                "reward_std": all_rewards.std(unbiased=False).item(),
                "correct_frac": sum(o[1] for o in outputs) / len(outputs),
                "zero_std_frac": zero_std,
                "loss": sum(losses) / mu,
                "kl": sum(kls) / mu,
                "clip_frac": sum(clips) / mu,
                "entropy": totals[-2] / n_tokens,
                "completion_len": float(sum(o[2] for o in outputs)) / len(outputs),
                "truncated_frac": 1.0 - sum(o[3] for o in outputs) / len(outputs),
                "learning_rate": optimizer.param_groups[0]["lr"],
                "grad_norm": grad_norm if math.isfinite(grad_norm) else -1.0,
                "time/sampling": t1 - t0,
                "time/scoring": t2 - t1,
                "time/update": t3 - t2,
            }
            record = spec.record_every and (step % spec.record_every == 0 or step == spec.total_steps)
            groups = []
            adv_cpu = advantages.cpu()
            for b in range(B if record else 0):
                samples = []
                for i in range(b * G, (b + 1) * G):
                    samples.append(SampleRecord(
                        completion=texts[i], tokens=token_texts[i], reward=float(rewards[i]),
                        advantages=[round(a, 6) for a in adv_cpu[i, : lengths[i]].tolist()],
                        step_rewards=step_rewards[i], step_end_indices=step_ends[i],
                        reward_components=components[i]))
                groups.append(GroupRecord(prompt=batch[b]["question"], reference=batch[b]["answer"], samples=samples))
            if record:
                recorder.groups(step, procs.gather(groups))
            metrics["time/step"] = time.time() - t0  # the step itself: evaluation and an RM refresh are timed apart
            if spec.eval_every and (step % spec.eval_every == 0 or step == spec.total_steps):
                t_eval = time.time()
                metrics["eval/accuracy"] = eval_accuracy()
                metrics["time/eval"] = time.time() - t_eval
            # RM refresh (Algorithm 1) at the end of every iteration but the last, after which nothing uses the RM
            if rm is not None and step == iteration * spec.steps_per_iteration and iteration < spec.iterations:
                t_refresh = time.time()
                metrics.update(refresh_reward_model())
                recorder.log(f"iteration {iteration}: {rm_name} refreshed on {metrics['rm/train_examples']:.0f} "
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
        checkpoint.save_final(checkpoint_dir / "final", accelerator.unwrap_model(policy), tokenizer,
                              lora=spec.lora_rank > 0)
        for _, old in checkpoint.step_dirs(checkpoint_dir):
            shutil.rmtree(old, ignore_errors=True)
        recorder.log(f"final policy saved in {time.time() - t:.1f}s")
    procs.barrier()
    return {"status": "completed", "step": step, "metrics": metrics}
