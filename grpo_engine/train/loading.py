"""Everything a run needs before its first step, and the reference reset between iterations.

``load_learner`` places the run (Accelerate: device, mixed precision, data-parallel processes), loads the
policy (fp32, dropout off, LoRA when asked), the dataset, the frozen reference (none with kl_coef 0) and the
optimizer, logs the memory estimate (and refuses a run too big for its GPU), and loads the learned reward model
(``reward: model``, with its Math-Shepherd data when ``rm_data`` is given). ``new_iteration`` is Algorithm 1's reference reset.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_engine.data.data import load_dataset
from grpo_engine.data.math_shepherd import load_math_shepherd
from grpo_engine.model.model import disable_dropout, load_policy, resolve_model_path, source_dtype
from grpo_engine.report.recorder import Recorder, no_check, stop_check
from grpo_engine.rm.reward_model import RMExample, load_reward_model
from grpo_engine.rm.rm_training import RewardModelState
from grpo_engine.rollout.rollout_labels import Completer
from grpo_engine.rollout.tokenization import end_token_ids, run_prompt
from grpo_engine.spec.config import RunSpec
from grpo_engine.spec.memory import estimate_memory, memory_limit, too_big_message
from grpo_engine.spec.spec_values import decode_delimiter
from grpo_engine.train.learner import Learner
from grpo_engine.train.parallel import Processes
from grpo_engine.train.sharding import full_state_dict, shard


@dataclass(frozen=True)
class Precision:
    """Where a run's forward passes use bf16 autocast.

    ``accelerate``: Accelerate's ``mixed_precision`` ("bf16" or "no"); "bf16" autocasts every forward of the
    prepared policy, sampling included. ``scoring_bf16``: the log-prob passes and the update (pi_old, pi_ref,
    pi_theta, the learned reward model) run under bf16 autocast (``Learner.autocast``), and the frozen reference
    and reward-model prior are kept in bf16. On a CPU the sampler stays fp32 even then: token-by-token decoding
    re-casts every fp32 weight at each token under autocast, and measured slower in bf16 than in fp32.
    """

    accelerate: str
    scoring_bf16: bool

    def describe(self) -> str:
        if self.accelerate == "bf16":
            return "bf16 mixed precision"
        return "bf16 autocast for scoring and the update, fp32 sampling" if self.scoring_bf16 else "fp32"


def resolve_precision(precision: str, device_type: str, bf16_fast: bool) -> Precision:
    """The Precision of a run-spec ``precision`` on a device. ``bf16_fast``: on CUDA, the GPU supports bf16; on
    the CPU, it has bf16 matrix instructions (``cpu_bf16_is_fast``).

    fp32 -> no autocast. auto -> on CUDA, bf16 everywhere where supported; on the CPU, bf16 for scoring and
    the update where the CPU has bf16 instructions (AVX-512 BF16 or AMX: there a 2048x2048 bf16 matmul measured
    2.2x fp32's speed, and on SmolLM2-135M the log-prob passes 2.4x and the update 1.35x; without them bf16 is
    emulated, and the same matmul measured 3x slower than fp32), fp32 otherwise. bf16 -> bf16 whatever the CPU;
    a CUDA device without bf16 support refuses it (ValueError naming the key).
    """
    if precision == "fp32":
        return Precision("no", False)
    if precision not in ("auto", "bf16"):
        raise ValueError(f"precision: unknown value {precision!r}")
    if device_type == "cuda":
        if precision == "bf16" and not bf16_fast:
            raise ValueError("precision: this GPU does not support bf16; use 'fp32' or 'auto'")
        return Precision("bf16", True) if bf16_fast else Precision("no", False)
    return Precision("no", precision == "bf16" or bf16_fast)


def cpu_bf16_is_fast(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 matrices natively: its flags (Linux /proc/cpuinfo, or ``cpuinfo``'s
    text) list avx512_bf16 (AMD Zen 4 and later, Intel Cooper Lake) or amx_bf16 (Intel Sapphire Rapids and
    later). False where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def make_accelerator(device: str | None, precision: str):
    """The run's Accelerator and Precision: the Accelerator places the models (and, with bf16 on a GPU, runs
    the prepared policy's forwards under autocast).

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
    plan = resolve_precision(
        precision, "cpu" if cpu else "cuda", cpu_bf16_is_fast() if cpu else torch.cuda.is_bf16_supported()
    )
    return Accelerator(cpu=cpu, mixed_precision=plan.accelerate), plan


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


def make_optimizer(params: list[torch.nn.Parameter], spec: RunSpec) -> torch.optim.Optimizer:
    """The policy's optimizer (run-spec ``optimizer``) over ``params``, at ``learning_rate``, without weight decay
    and with AdamW's default betas (0.9, 0.999) and epsilon (1e-8): torch's AdamW ('adamw'), or bitsandbytes'
    AdamW8bit ('adamw_8bit': both moments of each tensor of 4,096 values or more quantized block-wise to 8 bits,
    its smaller tensors' moments in fp32; on the CPU too). validate_spec refused 'adamw_8bit' where bitsandbytes is
    missing."""
    if spec.optimizer == "adamw_8bit":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=spec.learning_rate, weight_decay=0.0)
    return torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)


def wrap_lora(policy, rank: int):
    """The policy with a LoRA adapter of ``rank`` on every linear layer (alpha = 2 x rank, no dropout)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    return get_peft_model(policy, config)


def unsharded_policy(learner: Learner, weights: dict[str, torch.Tensor]):
    """A sharded run's policy as one ordinary model on the CPU: its architecture built from its config (LoRA-wrapped
    as the run's is) and ``weights``, its whole state dict (sharding.full_state_dict), loaded into it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(learner.unwrapped().config).float()
    if learner.spec.lora_rank > 0:
        model = wrap_lora(model, learner.spec.lora_rank)
    model.load_state_dict(weights)
    return model


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
    estimate = estimate_memory(
        params,
        trainable,
        lora=spec.lora_rank > 0,
        bf16=bf16,
        rm_params=rm_params,
        reference=spec.kl_coef > 0,
        optimizer=spec.optimizer,
        shards=spec.devices if spec.sharding == "fsdp" else 1,
    )
    log(f"memory estimate (activations not included): {estimate.describe()}")
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        if estimate.total > props.total_memory:
            raise ValueError(
                too_big_message(
                    estimate,
                    props.total_memory,
                    f"this worker's GPU ({props.name})",
                    lora=spec.lora_rank > 0,
                    bf16=bf16,
                )
            )
    elif (limit := memory_limit()) is not None and estimate.total > limit:
        raise ValueError(
            too_big_message(estimate, limit, "this worker's memory limit", lora=spec.lora_rank > 0, bf16=bf16)
        )


def loading_check(recorder: Recorder, procs: Processes) -> Callable[[], None]:
    """The stop check of loading, called between its phases and at every step of the built-in model's build: a
    cancel, or the worker's stop, ends the run within seconds (StopRequested; ``train`` ends the run). One process
    only: with several, the main process builds while the others wait at a barrier that a stop would never reach."""
    return stop_check(recorder.should_stop) if procs.n == 1 else no_check


def building_progress(recorder: Recorder, check: Callable[[], None] = no_check):
    """A ``progress(done, total)`` for the built-in model's warm start that reports it as the run's phase and
    calls ``check`` (loading_check) at each of its steps."""

    def progress(done: int, total: int) -> None:
        recorder.phase("building built-in model", done, total)
        check()

    return progress


def load_learner(spec: RunSpec, recorder: Recorder, cache_dir: Path, device: str | None):
    """Place the run (Accelerate), load the policy (fp32, dropout off), the dataset, the reference and the
    optimizer, and the learned reward model (reward: model), reporting each phase to ``recorder``. Returns
    (learner, train set, held-out set, RewardModelState or None)."""
    recorder.phase("loading model")
    accelerator, precision = make_accelerator(run_device(spec.device, device), spec.precision)
    dev = accelerator.device
    procs = Processes(accelerator)  # one, or the data-parallel processes of a run with devices > 1
    if procs.n != spec.devices:
        raise ValueError(f"devices: the run asks for {spec.devices} processes but was started in {procs.n}")
    bf16 = precision.scoring_bf16  # scoring and the update in bf16 autocast; the frozen copies kept in bf16
    recorder.log(
        f"loading model {spec.model!r} on {dev} ({precision.describe()})"
        + (f", {procs.n} data-parallel processes ({accelerator.distributed_type.value})" if procs.n > 1 else "")
    )
    check = loading_check(recorder, procs)
    building = building_progress(recorder, check)
    if procs.n > 1:  # a built-in model is created by the main process (transformers saves from rank 0 only)
        if procs.main:
            for name in {
                spec.model,
                *([spec.reward_model or spec.model] if spec.reward == "model" else []),
                *([spec.label_completer] if spec.label_completer else []),
            }:
                resolve_model_path(name, cache_dir, log=recorder.log, progress=building, phase=recorder.phase)
        procs.barrier()
    # a sharded run loads the whole model into the CPU's memory, and shard() moves each layer's share to the device:
    # a model bigger than one GPU never sits whole on one
    load_dev = torch.device("cpu") if spec.sharding == "fsdp" else dev
    policy, tokenizer = load_policy(
        spec.model, cache_dir, load_dev, log=recorder.log, progress=building, phase=recorder.phase
    )
    check()
    # the run's random stream starts here, once the policy is in memory however it came (built now, converted, read
    # from the cache): LoRA's first adapter and every sample after draw from the spec's seed alone
    torch.manual_seed(spec.seed)
    disable_dropout(policy)  # training forwards must match sampling's: pi_old, pi_ref and pi_theta alike
    if spec.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    recorder.phase("loading dataset")
    recorder.log(f"loading dataset {spec.dataset!r}")
    train_set, heldout = load_dataset(
        spec.dataset,
        config=spec.dataset_config,
        split=spec.dataset_split,
        eval_split=spec.eval_split,
        fields=(spec.question_field, spec.answer_field, spec.solution_field),
    )
    if spec.batch_size > len(train_set):
        raise ValueError(f"batch_size {spec.batch_size} is larger than the dataset's {len(train_set)} training rows")
    check()
    if spec.lora_rank > 0:
        policy = wrap_lora(policy, spec.lora_rank)
    check_memory(policy, spec, bf16, dev, recorder.log)
    if spec.lora_rank > 0 or spec.kl_coef == 0:
        reference = None  # LoRA: the base model with the adapter disabled; kl_coef 0: no KL term, no reference
    else:  # frozen: in bf16 under bf16 autocast, where its forward passes run in bf16 anyway
        recorder.phase("loading reference model")
        reference = copy.deepcopy(policy).eval().requires_grad_(False).to(torch.bfloat16 if bf16 else torch.float32)
    if spec.sharding == "fsdp":  # sharded before the optimizer is made: its moments are then sharded too
        recorder.log(
            f"sharding the policy{' and the reference' if reference is not None else ''} across {procs.n} processes (FSDP2)"
        )
        sampling_bf16 = precision.accelerate == "bf16"
        policy = shard(policy, dev, procs.n, sampling_bf16)
        reference = shard(reference, dev, procs.n, sampling_bf16) if reference is not None else None
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, spec)
    if spec.sharding != "fsdp":
        policy, optimizer = accelerator.prepare(policy, optimizer)  # placed on dev; forward under autocast
    learner = Learner(
        spec,
        accelerator,
        bf16,
        procs,
        policy,
        optimizer,
        params,
        reference,
        tokenizer,
        run_prompt(tokenizer, spec),
        end_token_ids(policy, tokenizer),
        decode_delimiter(spec.step_delimiter),
        source_dtype=source_dtype(spec.model, cache_dir),
    )
    if spec.label_completer:  # validate_spec allows it only with rollout step labels
        learner.completer = load_completer(spec, recorder, cache_dir, dev, precision.accelerate == "bf16", check)
    check()
    rm_state = load_reward_model_state(learner, recorder, cache_dir, bf16, check) if spec.reward == "model" else None
    return learner, train_set, heldout, rm_state


def load_completer(
    spec: RunSpec,
    recorder: Recorder,
    cache_dir: Path,
    dev: torch.device,
    bf16: bool,
    check: Callable[[], None] = no_check,
) -> Completer:
    """The model that continues outputs for rollout step labels (``label_completer``): frozen, dropout off, in
    bf16 when the run samples in bf16 (``bf16``), reading questions (worded by the run's prompt keys) through its
    own chat template when it has one."""
    name = spec.label_completer
    recorder.phase("loading model")
    model, tokenizer = load_policy(
        name, cache_dir, dev, log=recorder.log, progress=building_progress(recorder, check), phase=recorder.phase
    )
    model = model.eval().requires_grad_(False).to(torch.bfloat16 if bf16 else torch.float32)
    recorder.log(f"label_completer {name!r}: {sum(p.numel() for p in model.parameters()):,} parameters, frozen")
    return Completer(model, tokenizer, run_prompt(tokenizer, spec, "auto"), end_token_ids(model, tokenizer))


def load_reward_model_state(
    learner: Learner, recorder: Recorder, cache_dir: Path, bf16: bool, check: Callable[[], None] = no_check
) -> RewardModelState:
    """A learned ORM (outcome) or PRM (process), its backbone started from a causal LM, set on ``learner.rm``;
    with ``rm_data``, its Math-Shepherd-labelled solutions (a tenth, at most rm_samples / 4, held out)."""
    spec, dev = learner.spec, learner.dev
    kind = "orm" if spec.supervision == "outcome" else "prm"
    state = RewardModelState(
        f"{kind.upper()} from {(spec.reward_model or spec.model)!r}", rng=random.Random(spec.seed + 1)
    )
    recorder.log(f"loading the reward model: {state.name}")
    recorder.phase("loading model")
    # the RM reads prompts as the policy does (its own tokenizer's chat template, when it starts elsewhere)
    rm = load_reward_model(
        resolve_model_path(
            spec.reward_model or spec.model,
            cache_dir,
            log=recorder.log,
            progress=building_progress(recorder, check),
            phase=recorder.phase,
        ),
        kind,
        dev,
        prompt_template="auto" if spec.reward_model else spec.prompt_template,
        system_prompt=spec.system_prompt,
        question_template=spec.question_template,
        prior_dtype=torch.bfloat16 if bf16 else torch.float32,
        delimiter=learner.delimiter,
        autocast=learner.autocast,
    )
    if spec.reward_model:  # the estimate again, with this reward model's size
        check_memory(
            learner.unwrapped(),
            spec,
            bf16,
            dev,
            recorder.log,
            rm_params=sum(p.numel() for p in rm.backbone.parameters()),
        )
    learner.rm = rm
    if spec.rm_data:  # Math-Shepherd-labelled solutions instead of the step checker's labels
        recorder.phase("loading dataset")
        labelled, skipped = load_math_shepherd(spec.rm_data)
        labelled = [RMExample(q, steps, labels) for q, steps, labels in labelled]
        random.Random(spec.seed + 2).shuffle(labelled)
        n_held = max(1, min(len(labelled) // 10, spec.rm_samples // 4))
        state.data = (labelled[:-n_held], labelled[-n_held:])
        recorder.log(
            f"rm_data {spec.rm_data!r}: {len(labelled)} step-labelled solutions ({skipped} rows skipped), "
            f"{n_held} held out to measure the PRM"
        )
    return state


def new_iteration(learner: Learner) -> None:
    """Algorithm 1's reference reset at the start of iterations 2, 3, ...: the reference becomes the policy.
    LoRA: the adapter is folded into the base (the new reference) and a fresh adapter is trained, with a new
    optimizer (trainer.TrainingRun.next_step sets the scheduled learning rate on it). kl_coef 0: there is no
    reference, nothing to reset."""
    if learner.spec.kl_coef == 0:
        return
    if learner.reference is not None:
        learner.reference.load_state_dict(learner.unwrapped().state_dict())
        return
    accelerator = learner.accelerator
    accelerator.free_memory()  # forgets the previous model and optimizer
    if learner.sharded:  # the adapter is folded into a whole copy in each process's CPU memory, then sharded again
        whole = unsharded_policy(learner, full_state_dict(learner.unwrapped(), everywhere=True))
        policy = wrap_lora(whole.merge_and_unload(), learner.spec.lora_rank)
        policy = shard(policy, learner.dev, learner.procs.n, learner.accelerator.mixed_precision == "bf16")
        learner.policy, learner.params = policy, [p for p in policy.parameters() if p.requires_grad]
        learner.optimizer = make_optimizer(learner.params, learner.spec)
        return
    policy = wrap_lora(learner.unwrapped().merge_and_unload(), learner.spec.lora_rank)
    learner.params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = make_optimizer(learner.params, learner.spec)
    learner.policy, learner.optimizer = accelerator.prepare(policy, optimizer)
