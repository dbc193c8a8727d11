"""The GRPO training loop: Algorithm 1 of DeepSeekMath (arXiv 2402.03300), read top to bottom.

    for iteration = 1..I:
        pi_ref <- policy                                   (reference reset)
        for step = 1..M:
            1. sample B questions, G outputs each from pi_old (= the policy, no grad)
            2. score every output (verifier or step checker)
            3. advantages: outcome (4.1.2) or process (4.1.3) supervision
            4. mu policy updates maximising J_GRPO (Eq. 3) with the k3 KL penalty (Eq. 4)
            5. report metrics and groups to the recorder; evaluate every eval_every steps

Shapes: B questions, G outputs each, N = B*G sequences, P prompt tokens, T completion tokens.
"""
from __future__ import annotations

import copy
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .config import RunSpec
from .data import STEP_DELIMITER, format_prompt, load_dataset
from .model import load_policy
from .objective import grpo_loss, outcome_advantages, process_advantages
from .recorder import GroupRecord, Recorder, SampleRecord
from .rewards import check_step, outcome_reward, split_steps

EVAL_BATCH = 256


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _encode_prompts(tokenizer, questions: list[str], device) -> dict[str, torch.Tensor]:
    """Left-padded prompt batch: input_ids and attention_mask, both (B, P)."""
    enc = tokenizer([format_prompt(q) for q in questions], return_tensors="pt", padding=True,
                    add_special_tokens=False)
    return {k: v.to(device) for k, v in enc.items()}


@torch.no_grad()
def generate(policy, tokenizer, prompts: dict[str, torch.Tensor], *, repeat: int, max_new_tokens: int,
             greedy: bool, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Sample ``repeat`` completions per prompt (the prompt is encoded once). Returns (B*repeat, T)."""
    ids = prompts["input_ids"].repeat_interleave(repeat, dim=0)  # (N, P)
    attn = prompts["attention_mask"].repeat_interleave(repeat, dim=0)  # (N, P)
    kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    out = policy.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **kwargs)
    return out[:, ids.shape[1]:]  # (N, T)


def completion_mask(completions: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1.0 on each completion's tokens up to and including its first EOS. (N, T) -> mask (N, T), ended (N,)."""
    is_eos = completions == eos_id
    ended = is_eos.any(dim=1)
    # number of EOS strictly before position t; a token is real while none came before it
    before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    return (before == 0).float(), ended


def token_logprobs(model, prompt_ids, prompt_attn, completions, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(o_t | q, o_<t) of each completion token, and the per-token entropy. Both (N, T)."""
    ids = torch.cat([prompt_ids, completions], dim=1)  # (N, P+T)
    attn = torch.cat([prompt_attn, mask.long()], dim=1)  # (N, P+T)
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)  # left padding: positions start at each prompt
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits  # (N, P+T, V)
    logits = logits[:, prompt_ids.shape[1] - 1 : -1].float()  # (N, T, V): the logits that predict o_t
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, completions.unsqueeze(-1)).squeeze(-1)  # (N, T)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (N, T)
    return logp, entropy


def step_boundaries(token_texts: list[str], delimiter: str = STEP_DELIMITER) -> tuple[list[str], list[int]]:
    """Split a completion into steps at ``delimiter``; return (steps, 0-based token index of each step's end).

    A step ends at the token holding its last character (the delimiter itself belongs to no step).
    """
    text = "".join(token_texts)
    ends_char = []  # char index (exclusive) where each token's text ends
    pos = 0
    for t in token_texts:
        pos += len(t)
        ends_char.append(pos)
    steps, ends, start = [], [], 0
    for piece in text.split(delimiter):
        stop = start + len(piece)
        if piece.strip():
            last_char = stop - 1 - (len(piece) - len(piece.rstrip()))
            tok = next(k for k, e in enumerate(ends_char) if e > last_char)
            steps.append(piece.strip())
            ends.append(tok)
        start = stop + len(delimiter)
    return steps, ends


@torch.no_grad()
def evaluate(policy, tokenizer, examples: list[dict], max_new_tokens: int, device) -> float:
    """Held-out greedy accuracy: the share of questions whose final answer is exactly right."""
    policy.eval()
    correct = 0.0
    for i in range(0, len(examples), EVAL_BATCH):
        chunk = examples[i : i + EVAL_BATCH]
        prompts = _encode_prompts(tokenizer, [e["question"] for e in chunk], device)
        comps = generate(policy, tokenizer, prompts, repeat=1, max_new_tokens=max_new_tokens, greedy=True)
        texts = tokenizer.batch_decode(comps, skip_special_tokens=True)
        correct += sum(outcome_reward(t, e["answer"])[0] for t, e in zip(texts, chunk))
    return correct / max(1, len(examples))


def _wrap_lora(policy, rank: int):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear",
                        task_type="CAUSAL_LM")
    return get_peft_model(policy, config)


def train(spec: RunSpec, recorder: Recorder, cache_dir: Path, device: str | None = None) -> dict:
    """Run GRPO as ``spec`` says, reporting to ``recorder``. Returns {status, step, metrics}.

    status is "completed", or "cancelled" when ``recorder.should_stop()`` said so at a step boundary.
    """
    t_load = time.time()
    dev = pick_device(device)
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    recorder.log(f"loading model {spec.model!r} on {dev}")
    policy, tokenizer = load_policy(spec.model, Path(cache_dir), dev, log=recorder.log)
    recorder.log(f"loading dataset {spec.dataset!r}")
    train_set, heldout = load_dataset(spec.dataset)
    if spec.batch_size > len(train_set):
        raise ValueError(f"batch_size {spec.batch_size} is larger than the dataset's {len(train_set)} training rows")
    if spec.lora_rank > 0:
        policy = _wrap_lora(policy, spec.lora_rank)
        reference = None  # the base model with the adapter disabled
    else:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)
    eos = tokenizer.eos_token_id
    n_params = sum(p.numel() for p in params)
    recorder.log(f"ready in {time.time() - t_load:.1f}s: {n_params:,} trainable parameters, "
                 f"{len(train_set)} training / {len(heldout)} held-out questions")
    recorder.start(spec.total_steps)

    def ref_logprobs(prompt_ids, prompt_attn, completions, mask):
        if reference is not None:
            return token_logprobs(reference, prompt_ids, prompt_attn, completions, mask)[0]
        with policy.disable_adapter():
            return token_logprobs(policy, prompt_ids, prompt_attn, completions, mask)[0]

    if spec.eval_every:
        acc = evaluate(policy, tokenizer, heldout, spec.max_new_tokens, dev)
        recorder.step(0, 0, {"eval/accuracy": acc})
        recorder.log(f"step 0: eval/accuracy {acc:.3f}")

    step, metrics = 0, {}
    for iteration in range(1, spec.iterations + 1):
        if iteration > 1 and reference is not None:  # reference reset (Algorithm 1); LoRA's reference stays the base
            reference.load_state_dict(policy.state_dict())
        for _ in range(spec.steps_per_iteration):
            if recorder.should_stop():
                recorder.log(f"cancelled before step {step + 1}")
                return {"status": "cancelled", "step": step, "metrics": metrics}
            step += 1
            t0 = time.time()

            # 1. sample B questions, G outputs each, from pi_old (the current policy, no grad)
            batch = rng.sample(train_set, spec.batch_size)
            prompts = _encode_prompts(tokenizer, [e["question"] for e in batch], dev)
            policy.eval()
            completions = generate(policy, tokenizer, prompts, repeat=spec.group_size, greedy=False,
                                   max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                                   top_p=spec.top_p)  # (N, T)
            mask, ended = completion_mask(completions, eos)  # (N, T), (N,)
            prompt_ids = prompts["input_ids"].repeat_interleave(spec.group_size, dim=0)  # (N, P)
            prompt_attn = prompts["attention_mask"].repeat_interleave(spec.group_size, dim=0)  # (N, P)
            t1 = time.time()

            # 2. score every output
            N, T = completions.shape
            G = spec.group_size
            lengths = mask.sum(dim=1).long().tolist()
            token_texts = [tokenizer.batch_decode([[t] for t in completions[i, : lengths[i]].tolist()])
                           for i in range(N)]
            texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
            outcome = [outcome_reward(texts[i], batch[i // G]["answer"]) for i in range(N)]
            correct = torch.tensor([c["correct"] for _, c in outcome])

            # 3. advantages, (N, T)
            step_rewards: list[list[float] | None] = [None] * N
            step_ends: list[list[int] | None] = [None] * N
            if spec.supervision == "outcome":
                rewards = torch.tensor([r for r, _ in outcome]).view(-1, G)  # (B, G)
                advantages = outcome_advantages(rewards).view(-1, 1) * mask  # every token of o_i gets A_i
                rewards = rewards.view(-1)
            else:
                adv_rows = []
                for b in range(spec.batch_size):
                    rs, es = [], []
                    for i in range(b * G, (b + 1) * G):
                        steps, ends = step_boundaries(token_texts[i][: lengths[i] - int(ended[i])])  # EOS is no step
                        verdicts = [float(check_step(s, batch[b]["question"], steps[:j])) for j, s in enumerate(steps)]
                        step_rewards[i], step_ends[i] = verdicts, ends
                        rs.append(verdicts)
                        es.append(ends)
                    adv_rows.append(process_advantages(rs, es, T))  # (G, T)
                advantages = torch.cat(adv_rows).to(dev) * mask
                rewards = torch.tensor([sum(r) / len(r) if r else 0.0 for r in step_rewards])
            advantages = advantages.to(dev)
            with torch.no_grad():
                ref_logp = ref_logprobs(prompt_ids, prompt_attn, completions, mask) if spec.kl_coef > 0 else None
                old_logp = None
                if spec.policy_updates_per_batch > 1:  # with mu = 1, pi_old's log-probs equal the detached current ones
                    old_logp = token_logprobs(policy, prompt_ids, prompt_attn, completions, mask)[0]
            t2 = time.time()

            # 4. mu policy updates maximising J_GRPO
            policy.train()
            losses, kls, clips, grad_norm, entropy = [], [], [], 0.0, 0.0
            for _ in range(spec.policy_updates_per_batch):
                logp, ent = token_logprobs(policy, prompt_ids, prompt_attn, completions, mask)
                old = old_logp if old_logp is not None else logp.detach()
                ref = ref_logp if ref_logp is not None else logp.detach()
                loss, stats = grpo_loss(logp, old, ref, advantages, mask, spec.clip_eps, spec.kl_coef)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0).item()
                optimizer.step()
                losses.append(loss.item())
                kls.append(stats["kl"].item())
                clips.append(stats["clip_frac"].item())
                entropy = ((ent.detach() * mask).sum() / mask.sum().clamp(min=1)).item()
            t3 = time.time()

            # 5. report
            if spec.supervision == "outcome":
                flat_group_rewards = [rewards[b * G:(b + 1) * G].tolist() for b in range(spec.batch_size)]
            else:  # process advantages normalise over all step rewards of the group
                flat_group_rewards = [[r for i in range(b * G, (b + 1) * G) for r in step_rewards[i]]
                                      for b in range(spec.batch_size)]
            zero_std = sum(len(set(g)) <= 1 for g in flat_group_rewards) / spec.batch_size
            metrics = {
                "reward_mean": rewards.mean().item(),
                "reward_std": rewards.std(unbiased=False).item(),
                "correct_frac": correct.mean().item(),
                "zero_std_frac": zero_std,
                "loss": sum(losses) / len(losses),
                "kl": sum(kls) / len(kls),
                "clip_frac": sum(clips) / len(clips),
                "entropy": entropy,
                "completion_len": float(sum(lengths)) / N,
                "truncated_frac": 1.0 - ended.float().mean().item(),
                "learning_rate": optimizer.param_groups[0]["lr"],
                "grad_norm": grad_norm if math.isfinite(grad_norm) else -1.0,
                "time/sampling": t1 - t0,
                "time/scoring": t2 - t1,
                "time/update": t3 - t2,
            }
            groups = []
            adv_cpu = advantages.cpu()
            for b in range(spec.batch_size):
                samples = []
                for i in range(b * G, (b + 1) * G):
                    samples.append(SampleRecord(
                        completion=texts[i], tokens=token_texts[i], reward=float(rewards[i]),
                        advantages=[round(a, 6) for a in adv_cpu[i, : lengths[i]].tolist()],
                        step_rewards=step_rewards[i], step_end_indices=step_ends[i],
                        reward_components=outcome[i][1]))
                groups.append(GroupRecord(prompt=batch[b]["question"], reference=batch[b]["answer"], samples=samples))
            recorder.groups(step, groups)
            if spec.eval_every and (step % spec.eval_every == 0 or step == spec.total_steps):
                metrics["eval/accuracy"] = evaluate(policy, tokenizer, heldout, spec.max_new_tokens, dev)
            metrics["time/step"] = time.time() - t0
            recorder.step(step, iteration, metrics)
            if "eval/accuracy" in metrics:
                recorder.log(f"step {step}/{spec.total_steps}: reward_mean {metrics['reward_mean']:.3f}, "
                             f"kl {metrics['kl']:.4f}, eval/accuracy {metrics['eval/accuracy']:.3f}")
    recorder.log(f"finished {step} steps")
    return {"status": "completed", "step": step, "metrics": metrics}
