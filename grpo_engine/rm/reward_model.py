"""Learned reward models (``reward: model``): an outcome RM (ORM) and a process RM (PRM).

A reward model is a transformer backbone (the base model of a causal LM, without its LM head) plus a
linear head that gives one logit per position. It reads the question and the output as text, in its
own tokenizer, and its score is ``sigmoid(logit)`` in (0, 1):

- ORM: one score per output, read at the EOS token appended after the output (its last real token);
- PRM: one score per reasoning step, read at each step's last token (Math-Shepherd style).

Each logit also gets ``prior_weight x`` the lowest log-probability that the frozen causal LM the
model started from gives any token of the span read (ORM: the whole output; PRM: that step). This
likelihood prior (weight learned, starting at 1) marks outputs with a token their starting model
finds implausible. It matters: on the built-in task a head alone learns "multiplication first
means correct" and stays blind to a second step that ignores the product, which the policy then
learns to write (reward hacking); the starting model finds such a step very unlikely.

Training data is labelled without humans (docs/algorithm.md, Learned reward models): the verifier labels an
output (ORM), the step checker labels each step (PRM). Both train with binary cross-entropy on the
positions they read. The model holds two copies of its starting weights: the trained backbone and
the frozen LM. Shapes: N examples, L tokens (right-padded), H hidden size.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

from grpo_engine.data.builtin_task import STEP_DELIMITER
from grpo_engine.model.model import load_causal_lm
from grpo_engine.report.recorder import no_check
from grpo_engine.rollout.outputs import RMExample
from grpo_engine.rollout.tokenization import prompt_formatter

FIT_EPOCHS = 2  # passes over the data at each (re)training
FIT_BATCH = 32  # examples per RM update


class RewardModel(torch.nn.Module):
    """A causal LM's backbone (trained) + linear head + the frozen LM's likelihood prior.

    ``kind`` is "orm" (read at EOS) or "prm" (read at each step's end). ``prompt_template`` makes a question
    the prompt the RM reads, as tokenization.prompt_formatter does for the policy (BOS first, chat template), with
    the run's ``system_prompt`` and ``question_template``.
    ``delimiter`` joins a PRM example's steps (the run's step_delimiter). ``autocast`` is a factory of the
    context its forward passes run in (the trainer gives Accelerate's, for mixed precision).
    """

    def __init__(
        self,
        lm,
        tokenizer,
        kind: str,
        prompt_template: str = "plain",
        delimiter: str = STEP_DELIMITER,
        autocast=contextlib.nullcontext,
        system_prompt: str = "",
        question_template: str = "",
    ):
        super().__init__()
        if kind not in ("orm", "prm"):
            raise ValueError(f"kind must be 'orm' or 'prm', got {kind!r}")
        self.tokenizer, self.kind = tokenizer, kind
        self.prompt = prompt_formatter(tokenizer, prompt_template, system_prompt, question_template)
        self.delimiter, self.autocast = delimiter, autocast
        self.backbone = copy.deepcopy(lm.base_model)  # the transformer without its LM head, trained
        self.prior = lm.eval().requires_grad_(False)  # the starting LM, frozen
        self.head = torch.nn.Linear(lm.config.hidden_size, 1)
        torch.nn.init.normal_(self.head.weight, std=lm.config.hidden_size**-0.5)
        torch.nn.init.zeros_(self.head.bias)
        self.prior_weight = torch.nn.Parameter(torch.ones(()))

    def train(self, mode: bool = True):
        super().train(mode)
        self.prior.eval()  # the prior never trains
        return self

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def encode(self, question: str, steps: list[str]) -> tuple[list[int], list[int], list[int]]:
        """Token ids of prompt + output + EOS, the positions read (ORM: [EOS]; PRM: each step's end),
        and where the span of each read starts (ORM: the output's first token; PRM: the step's).

        Each step is encoded on its own (after the first, with the step delimiter in front), so a
        step's end is a token boundary whatever the tokenizer.
        """
        tok = self.tokenizer
        ids = tok.encode(self.prompt(question), add_special_tokens=False)
        output_start, starts, ends = len(ids), [], []
        for j, step in enumerate(steps):
            starts.append(len(ids))
            ids += tok.encode((self.delimiter if j else "") + step, add_special_tokens=False)
            ends.append(len(ids) - 1)
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        if self.kind == "orm":
            return ids, [len(ids) - 1], [output_start]
        return ids, ends, starts

    def logits(self, examples: list[RMExample]) -> list[torch.Tensor]:
        """The logit at every position each example is read at: a list of N tensors (K_n,).

        logit = head(hidden state at the read position) + prior_weight * (lowest log-probability the
        frozen LM gives a token of the read's span).
        """
        encoded = [self.encode(e.question, e.steps) for e in examples]
        width = max(len(ids) for ids, _, _ in encoded)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([x + [pad] * (width - len(x)) for x, _, _ in encoded], device=self.device)  # (N, L)
        attn = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _, _ in encoded], device=self.device)
        with self.autocast():
            hidden = self.backbone(input_ids=ids, attention_mask=attn).last_hidden_state  # (N, L, H)
            per_position = self.head(hidden).squeeze(-1).float()  # (N, L)
        with torch.no_grad(), self.autocast():
            prior_logits = self.prior(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (N, L-1, V)
            token_logp = F.log_softmax(prior_logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (N, L-1)
            token_logp = F.pad(token_logp, (1, 0))  # (N, L): log p(token t | tokens < t); 0 at t = 0
        out = []
        for n, (_, reads, starts) in enumerate(encoded):
            lowest = (
                torch.stack([token_logp[n, s : r + 1].min() for s, r in zip(starts, reads, strict=True)])
                if reads
                else token_logp.new_zeros(0)
            )  # (K_n,)
            out.append(per_position[n, reads] + self.prior_weight * lowest)
        return out

    @torch.no_grad()
    def score(self, examples: list[RMExample], batch_size: int = 256) -> list[list[float]]:
        """sigmoid(logit) at every read position: ORM [one score] per example, PRM one per step."""
        was_training = self.training
        self.eval()
        out = []
        for i in range(0, len(examples), batch_size):
            out += [torch.sigmoid(x).tolist() for x in self.logits(examples[i : i + batch_size])]
        self.train(was_training)
        return out


def load_reward_model(
    path: str,
    kind: str,
    device: torch.device,
    prompt_template: str = "plain",
    prior_dtype: torch.dtype = torch.float32,
    **options,
) -> RewardModel:
    """A reward model that starts from the causal LM at ``path`` (a local directory or a Hugging Face id;
    safetensors only): its backbone and frozen prior are that LM's weights, its head is fresh. The frozen
    prior is kept in ``prior_dtype`` (bf16 under bf16 autocast: it only runs forward passes). ``options``:
    RewardModel's delimiter, autocast and prompt words (system_prompt, question_template)."""
    lm, tokenizer = load_causal_lm(path, what="reward model")
    rm = RewardModel(lm, tokenizer, kind, prompt_template, **options).to(device)
    rm.prior.to(prior_dtype)
    return rm


def fit(
    rm: RewardModel,
    examples: list[RMExample],
    lr: float,
    rng: random.Random,
    epochs: int = FIT_EPOCHS,
    batch_size: int = FIT_BATCH,
    check: Callable[[], None] = no_check,
) -> float:
    """Train on ``examples`` with binary cross-entropy (AdamW at ``lr``, decaying linearly to 0 over the
    updates); returns the last epoch's mean loss. ``check`` is called before every batch (it raises to stop)."""
    params = [p for p in rm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    total = max(1, epochs * math.ceil(len(examples) / batch_size))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0 - k / total)
    rm.train()
    order = list(examples)
    epoch_loss = 0.0
    for _ in range(epochs):
        rng.shuffle(order)
        loss_sum, count = 0.0, 0
        for i in range(0, len(order), batch_size):
            check()
            chunk = order[i : i + batch_size]
            logits = torch.cat(rm.logits(chunk))  # (sum K_n,)
            if logits.numel() == 0:  # PRM outputs without any step teach nothing
                continue
            labels = torch.tensor([y for e in chunk for y in e.labels], device=logits.device)
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            loss_sum += loss.item() * logits.numel()
            count += logits.numel()
        epoch_loss = loss_sum / max(1, count)
    rm.eval()
    return epoch_loss


def accuracy(rm: RewardModel, examples: list[RMExample]) -> float:
    """Share of read positions where (score > 0.5) matches the label: outputs (ORM) or steps (PRM)."""
    hits, count = 0, 0
    for scores, e in zip(rm.score(examples), examples, strict=True):
        hits += sum((s > 0.5) == (y > 0.5) for s, y in zip(scores, e.labels, strict=True))
        count += len(e.labels)
    return hits / count if count else 0.0


def replay_mix(
    fresh: list[RMExample], history: list[RMExample], ratio: float, rng: random.Random
) -> tuple[list[RMExample], int]:
    """``fresh`` plus round(ratio * len(fresh)) examples drawn at random from ``history`` (at most all of it).

    Returns (the mixed training set, the number replayed).
    """
    n = min(len(history), round(ratio * len(fresh)))
    return fresh + rng.sample(history, n), n
