"""Fast batched sampling: a lean decode loop over a KV cache.

GRPO spends most of its time sampling. ``generate`` does what ``transformers``' ``generate`` does for
plain sampling (temperature, nucleus top-p) and greedy decoding, without its per-token machinery
(logits processors, stopping criteria objects, input re-preparation):

* the B prompts are encoded once (one prefill pass over B rows, only the last position's logits
  computed); the KV cache is then repeated G times for the group's outputs;
* left padding: position ids count from each prompt's first real token, the attention mask grows by
  one column per new token;
* every step feeds one token per sequence; a sequence that emitted an end token (the tokenizer's EOS or
  any the model's generation config lists: instruct models have several) gets the pad token from then on;
* the loop stops as soon as every sequence has ended (or at ``max_new_tokens``); past a caller's ``deadline`` it
  raises TimeoutError between two steps (a try by hand is bounded in time, not only in tokens);
* rows that have ended are dropped from the batch (and the cache) once they are at least a quarter of
  it, so long tails of a few unfinished outputs do not pay for the finished ones;
* the KV cache grows in blocks of ``CACHE_BLOCK`` positions (:class:`BlockLayer`) and each step writes its
  keys and values in place: ``transformers``' dynamic cache concatenates the whole cache at every step,
  which with 347-token prompts made a decode step of 32 rows about 1.5x slower on a CPU (short prompts:
  no difference).

Shapes: B prompts, N = B * repeat sequences, P prompt tokens, T generated tokens (T <= max_new_tokens).
"""

from __future__ import annotations

import time

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

try:  # layered caches (transformers >= 4.56)
    from transformers.cache_utils import DynamicLayer
except ImportError:  # older: no layers to replace (block_cache leaves the cache as it is)
    DynamicLayer = object

from grpo_engine.rollout.tokenization import end_token_ids

PRUNE_SHARE = 0.25  # drop finished rows once they are at least this share of the rows still decoded
CACHE_BLOCK = 64  # positions a decode cache layer grows by when it is full (BlockLayer)
# the KV cache's keyword: "cache" in recent transformers, "past_key_values" before
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class BlockLayer(DynamicLayer):
    """A dynamic cache layer that keeps its keys and values in a buffer with room for ``CACHE_BLOCK`` more
    positions, so a decode step writes one position in place instead of copying the whole cache.
    ``keys``/``values`` are views of the filled positions, (N, H, S, D), as the attention reads them."""

    def __init__(self, filled: DynamicLayer):
        super().__init__()
        self.device, self.is_initialized = filled.device, True
        self.length = filled.keys.shape[-2]
        self._keys, self._values = self._room(filled.keys, 0), self._room(filled.values, 0)
        self._view()

    def _room(self, states: torch.Tensor, needed: int) -> torch.Tensor:
        """A buffer holding ``states``'s positions and room after them for ``needed`` more, rounded up to
        whole blocks of CACHE_BLOCK (at least one)."""
        n, h, s, d = states.shape
        buffer = states.new_empty((n, h, s + CACHE_BLOCK * max(1, -(-needed // CACHE_BLOCK)), d))
        buffer[:, :, :s] = states
        return buffer

    def _view(self) -> None:
        self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        s = key_states.shape[-2]
        if self.length + s > self._keys.shape[-2]:
            self._keys, self._values = self._room(self.keys, s), self._room(self.values, s)
        self._keys[:, :, self.length : self.length + s] = key_states
        self._values[:, :, self.length : self.length + s] = value_states
        self.length += s
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._keys, self._values = (b.repeat_interleave(repeats, dim=0) for b in (self._keys, self._values))
        self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._view()


def block_cache(cache):
    """The prefill's cache with each plain dynamic layer made a :class:`BlockLayer` (sliding-window and other
    layer kinds, and caches without layers, stay as they are)."""
    for i, layer in enumerate(getattr(cache, "layers", ())):
        if type(layer) is DynamicLayer and layer.is_initialized:
            cache.layers[i] = BlockLayer(layer)
    return cache


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose probability adds up to at least ``top_p``
    (the most likely token always stays); the others get -inf. (N, V) -> (N, V)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= top_p  # the mass of the likelier tokens already reaches top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def next_tokens(logits: torch.Tensor, greedy: bool, temperature: float, top_p: float) -> torch.Tensor:
    """One token per row from next-token logits (N, V): the argmax, or a sample from
    softmax(logits / temperature) restricted to the top-p nucleus. Returns (N,)."""
    if greedy:
        return logits.argmax(dim=-1)
    probs = top_p_filter(logits.float() / temperature, top_p).softmax(dim=-1)
    # inverse-CDF sampling: one uniform number per row (drawing one per vocabulary entry, as
    # torch.multinomial or the exponential race do, costs more than the forward pass on a CPU)
    cdf = probs.cumsum(dim=-1)  # (N, V)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]
    # the first token whose cumulative mass exceeds u: never one of probability 0
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)


def generate(
    model,
    tokenizer,
    prompts: dict[str, torch.Tensor],
    *,
    repeat: int,
    max_new_tokens: int,
    greedy: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
    end_ids: list[int] | None = None,
    decode: str = "dynamic",
    deadline: float | None = None,
) -> torch.Tensor:
    """Sample ``repeat`` completions per prompt; the prompts are encoded once. Returns (B*repeat, T).

    ``model``: a causal LM (or a LoRA-wrapped one), not a distributed wrapper. ``prompts``: left-padded
    ``input_ids`` and ``attention_mask``, both (B, P). ``end_ids``: the tokens that end a completion
    (default: ``end_token_ids(model, tokenizer)``). After a sequence's end token its row holds the pad token.
    The loop runs in inference mode (no autograd bookkeeping: the decode steps are many small ops); the
    result is copied out of it, since the training forwards take it as input. ``decode`` (the run spec's
    ``decode``): 'dynamic' the loop below; 'static' or 'compiled' fixed shapes (:func:`_decode_static`).
    ``deadline``: a ``time.monotonic()`` reading past which a decode step is not started (TimeoutError).
    """
    how = {"max_new_tokens": max_new_tokens, "greedy": greedy, "temperature": temperature, "top_p": top_p}
    how["deadline"] = deadline
    with torch.inference_mode():
        if decode == "dynamic":
            out = _decode(model, tokenizer, prompts, repeat, end_ids=end_ids, **how)
        else:
            out = _decode_static(
                model, tokenizer, prompts, repeat, end_ids=end_ids, compiled=decode == "compiled", **how
            )
    return out.clone()


def _prefill(model, tokenizer, prompts, repeat: int, end_ids):
    """Both loops' start: the B prompts encoded once. Returns the end tokens, each prompt's positions (B, P),
    the prefill's KV cache (B rows) and the next-token logits of each of the N = B * repeat rows (N, V)."""
    attn = prompts["attention_mask"]
    ends = torch.tensor(end_token_ids(model, tokenizer) if end_ids is None else end_ids, device=attn.device)
    positions = (attn.cumsum(dim=1) - 1).clamp(min=0)  # (B, P)
    out = model(
        input_ids=prompts["input_ids"], attention_mask=attn, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    return ends, positions, getattr(out, CACHE), out.logits[:, -1].repeat_interleave(repeat, dim=0)


def check_deadline(deadline: float | None, length: int, max_new_tokens: int) -> None:
    """TimeoutError when ``deadline`` (a ``time.monotonic()`` reading) has passed, saying how far sampling got."""
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(f"sampling passed its deadline after {length} of {max_new_tokens} new tokens")


def _decode(
    model, tokenizer, prompts, repeat, *, max_new_tokens, greedy, temperature, top_p, end_ids, deadline
) -> torch.Tensor:
    """generate's decode loop."""
    pad = tokenizer.pad_token_id
    attn = prompts["attention_mask"]
    ends, positions, cache, logits = _prefill(model, tokenizer, prompts, repeat, end_ids)  # logits (N, V)
    cache = block_cache(cache)
    if repeat > 1:
        cache.batch_repeat_interleave(repeat)
    attn = attn.repeat_interleave(repeat, dim=0)  # (N, P)
    next_pos = positions[:, -1].repeat_interleave(repeat, dim=0) + 1  # (N,)
    n = logits.shape[0]
    result = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=logits.device)
    rows = torch.arange(n, device=logits.device)  # which sequences the decoded batch still holds
    ended = torch.zeros(n, dtype=torch.bool, device=logits.device)  # per decoded row: EOS emitted
    length = 0
    for t in range(max_new_tokens):
        token = next_tokens(logits, greedy, temperature, top_p).masked_fill(ended, pad)  # (rows,)
        result[rows, t] = token
        length = t + 1
        ended = ended | torch.isin(token, ends)
        n_live = len(rows) - int(ended.sum())
        if n_live == 0 or length == max_new_tokens:
            break
        check_deadline(deadline, length, max_new_tokens)
        if n_live <= (1 - PRUNE_SHARE) * len(rows):  # drop the rows that have ended
            keep = (~ended).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, token, attn, next_pos, ended = rows[keep], token[keep], attn[keep], next_pos[keep], ended[keep]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        out = model(
            input_ids=token.unsqueeze(1),
            attention_mask=attn,
            position_ids=next_pos.unsqueeze(1),
            use_cache=True,
            **{CACHE: cache},
        )
        logits = out.logits[:, -1]
        next_pos = next_pos + 1
    return result[:, :length]


def _static_cache(model, prefill, repeat: int, max_len: int):
    """A StaticCache of ``max_len`` positions holding the prefill's keys and values, each prompt's ``repeat``
    times (the prompts were still encoded once)."""
    from transformers import StaticCache

    if not hasattr(prefill, "layers"):
        raise ValueError(
            "decode: 'static' and 'compiled' need transformers' layered caches (transformers >= 4.56); "
            "use decode 'dynamic'"
        )
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    for layer, filled in zip(cache.layers, prefill.layers, strict=True):
        layer.update(filled.keys.repeat_interleave(repeat, dim=0), filled.values.repeat_interleave(repeat, dim=0))
    return cache


def _decode_static(
    model, tokenizer, prompts, repeat, *, max_new_tokens, greedy, temperature, top_p, end_ids, deadline, compiled: bool
) -> torch.Tensor:
    """generate's loop with the same shapes at every step, so that one decode step can be captured once and
    replayed: a StaticCache of N rows and P + max_new_tokens positions, an attention mask of that full width
    (a column switched on per step), every row decoded to the end (none dropped). ``compiled``: the step
    through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs on a GPU). The tokens are those of the
    dynamic loop: greedy decoding gives the same outputs (tests/engine/rollout/test_sampling.py)."""
    pad = tokenizer.pad_token_id
    attn = prompts["attention_mask"]
    P = attn.shape[1]
    ends, positions, prefill, logits = _prefill(model, tokenizer, prompts, repeat, end_ids)  # logits (N, V)
    cache = _static_cache(model, prefill, repeat, P + max_new_tokens)
    n = logits.shape[0]
    mask = torch.zeros((n, P + max_new_tokens), dtype=attn.dtype, device=attn.device)
    mask[:, :P] = attn.repeat_interleave(repeat, dim=0)
    next_pos = positions[:, -1:].repeat_interleave(repeat, dim=0) + 1  # (N, 1)
    step = torch.compile(model, mode="reduce-overhead", dynamic=False) if compiled else model
    result = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=logits.device)
    ended = torch.zeros(n, dtype=torch.bool, device=logits.device)
    length = 0
    for t in range(max_new_tokens):
        token = next_tokens(logits, greedy, temperature, top_p).masked_fill(ended, pad)  # (N,)
        result[:, t] = token
        length = t + 1
        ended = ended | torch.isin(token, ends)
        if length == max_new_tokens or bool(ended.all()):
            break
        check_deadline(deadline, length, max_new_tokens)
        mask[:, P + t] = 1  # the token fed now sits at cache position P + t
        logits = step(
            input_ids=token.unsqueeze(1), attention_mask=mask, position_ids=next_pos, use_cache=True, **{CACHE: cache}
        ).logits[:, -1]
        next_pos = next_pos + 1
    return result[:, :length]
