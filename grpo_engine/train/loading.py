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
from pathlib import Path

import torch

from grpo_engine.data.data import load_dataset
from grpo_engine.data.math_shepherd import load_math_shepherd
from grpo_engine.model.model import disable_dropout, load_policy, resolve_model_path, source_dtype
from grpo_engine.report.recorder import Recorder, no_check, stop_check
from grpo_engine.rm.reward_model import load_reward_model
from grpo_engine.rm.rm_training import RewardModelState
from grpo_engine.rollout.outputs import RMExample
from grpo_engine.rollout.rollout_labels import Completer
from grpo_engine.rollout.tokenization import end_token_ids, run_prompt
from grpo_engine.spec.config import RunSpec
from grpo_engine.spec.memory import estimate_memory, memory_limit, too_big_message
from grpo_engine.spec.words import decode_delimiter
from grpo_engine.train.learner import Learner
from grpo_engine.train.parallel import Processes
from grpo_engine.train.placement import make_accelerator, run_device
from grpo_engine.train.sharding import full_state_dict, shard


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
    if procs.n > 1:
        build_models_on_main(spec, cache_dir, procs, recorder, building)
    policy, tokenizer = load_policy_once(spec, cache_dir, dev, procs=procs, recorder=recorder, building=building)
    check()
    # the run's random stream starts here, once the policy is in memory however it came (built now, converted, read
    # from the cache): LoRA's first adapter and every sample after draw from the spec's seed alone
    torch.manual_seed(spec.seed)
    disable_dropout(policy)  # training forwards must match sampling's: pi_old, pi_ref and pi_theta alike
    if spec.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    train_set, heldout = load_questions(spec, recorder)
    check()
    if spec.lora_rank > 0:
        policy = wrap_lora(policy, spec.lora_rank)
    check_memory(policy, spec, bf16, dev, recorder.log)
    if spec.lora_rank > 0 or spec.kl_coef == 0 or spec.evaluates_only:
        # LoRA: the base model with the adapter disabled; kl_coef 0: no KL term; evaluation only: no step to compare
        reference = None
    else:  # frozen: in bf16 under bf16 autocast, where its forward passes run in bf16 anyway
        recorder.phase("loading reference model")
        reference = copy.deepcopy(policy).eval().requires_grad_(False).to(torch.bfloat16 if bf16 else torch.float32)
    if spec.sharding == "fsdp":  # sharded before the optimizer is made: its moments are then sharded too
        recorder.log(
            f"sharding the policy{' and the reference' if reference is not None else ''} across {procs.n} processes (FSDP2)"
        )
        sampling_bf16 = precision.accelerate == "bf16"
        policy = shard(policy, dev, procs.n, sampling_bf16, from_main=True)
        reference = shard(reference, dev, procs.n, sampling_bf16, from_main=True) if reference is not None else None
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, spec)
    if spec.sharding != "fsdp":
        policy, optimizer = accelerator.prepare(policy, optimizer)  # placed on dev; forward under autocast
    learner = Learner(
        spec=spec,
        accelerator=accelerator,
        scoring_bf16=bf16,
        procs=procs,
        policy=policy,
        optimizer=optimizer,
        params=params,
        reference=reference,
        tokenizer=tokenizer,
        prompt=run_prompt(tokenizer, spec),
        end_ids=end_token_ids(policy, tokenizer),
        delimiter=decode_delimiter(spec.step_delimiter),
        source_dtype=source_dtype(spec.model, cache_dir),
    )
    if spec.label_completer:  # validate_spec allows it only with rollout step labels
        learner.completer = load_completer(
            spec, recorder, cache_dir, dev=dev, bf16=precision.accelerate == "bf16", check=check
        )
    check()
    rm_state = load_reward_model_state(learner, recorder, cache_dir, bf16, check) if spec.reward == "model" else None
    return learner, train_set, heldout, rm_state


def build_models_on_main(spec: RunSpec, cache_dir: Path, procs: Processes, recorder: Recorder, building) -> None:
    """A run of several processes: the built-in models it names (policy, reward model, label completer) are built
    by the main process (transformers saves from rank 0 only) while the others wait."""
    if procs.main:
        for name in {
            spec.model,
            *([spec.reward_model or spec.model] if spec.reward == "model" else []),
            *([spec.label_completer] if spec.label_completer else []),
        }:
            resolve_model_path(name, cache_dir, log=recorder.log, progress=building, phase=recorder.phase)
    procs.barrier()


def load_questions(spec: RunSpec, recorder: Recorder) -> tuple[list[dict], list[dict]]:
    """The run's (training, held-out) questions, the "loading dataset" phase reported; a batch larger than the
    training set is refused."""
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
    return train_set, heldout


def load_policy_once(
    spec: RunSpec, cache_dir: Path, dev: torch.device, *, procs: Processes, recorder: Recorder, building
) -> tuple:
    """The run's (policy, tokenizer), its weights read from disk once per machine: by the one process of a run, or
    by the main process of a run with several. The others build the architecture on the meta device (no memory)
    and get their weights from the main process: a data-parallel run's each a whole copy, broadcast here onto its
    device; a sharded run's only their shards, sent when the policy is sharded (``shard(..., from_main=True)``),
    so that no process but the main one ever holds the whole model in the CPU's memory (8 processes of a 7B
    model would otherwise hold 8 x 30 GB at once). A sharded run's main process loads into the CPU's memory and
    shard() moves each layer's share to the device: a model bigger than one GPU never sits whole on one."""
    sharded = spec.sharding == "fsdp"
    on_meta = procs.n > 1 and not procs.main
    policy, tokenizer = load_policy(
        spec.model,
        cache_dir,
        torch.device("cpu") if sharded else dev,
        log=recorder.log,
        progress=building,
        phase=recorder.phase,
        on_meta=on_meta,
    )
    if procs.n > 1 and not sharded:
        if on_meta:
            policy.to_empty(device=dev)  # storage without values, then the main process's values
            policy.tie_weights()  # to_empty gives each module its own tensor: tied embeddings are one again
        procs.broadcast_module(policy)
    return policy, tokenizer


def load_completer(
    spec: RunSpec,
    recorder: Recorder,
    cache_dir: Path,
    *,
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
