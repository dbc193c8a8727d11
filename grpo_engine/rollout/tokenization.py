"""Between text and tokens: prompts in, completions out.

- ``prompt_formatter``: the run's ``prompt_template`` as a function question -> prompt text;
- ``end_token_ids``: every token id that ends a completion (instruct models have several);
- ``completion_mask``: which sampled tokens belong to each completion (up to and including its end);
- ``token_pieces``: the text each token adds to a decoded completion, read in context;
- ``step_boundaries``: a completion's reasoning steps and the token where each one ends.

Shapes: N completions, T sampled tokens each (padded).
"""

from __future__ import annotations

import torch

from grpo_engine.data.builtin_task import STEP_DELIMITER
from grpo_engine.data.data import format_prompt

PIECE_CONTEXT = 4  # tokens decoded before a token to read its text in context (see token_pieces)
REPLACEMENT = "\ufffd"  # what a decoder gives for the bytes of a character cut in the middle


def prompt_formatter(tokenizer, template: str, system_prompt: str = "", question_template: str = ""):
    """The run's prompt keys as a function question -> prompt text, exactly as the model reads it.

    1. ``question_template`` words the question: its ``{question}`` is replaced by it (plain replacement, so
       other braces, such as DeepSeekMath's ``\\boxed{}``, stay as they are); empty = the question itself.
    2. ``template`` makes it a prompt. chat: the tokenizer's chat template with ``system_prompt`` as a system
       turn (when given), the worded question as the user's turn and the assistant's turn opened (the template
       adds any BOS itself); plain: the system prompt on its own line, then the question on its own line, after
       the BOS token when the tokenizer has one; auto: chat when the tokenizer has a chat template, else plain.

    >>> class Plain: chat_template, bos_token = None, "<s>"
    >>> prompt_formatter(Plain(), "auto", "Be brief.", "Q: {question} in {braces}?")("1+1")
    '<s>Be brief.\\nQ: 1+1 in {braces}?\\n'
    """
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "chat" and not has_chat:
        raise ValueError("prompt_template: 'chat', but the model's tokenizer has no chat template; use 'plain'")

    def worded(question: str) -> str:
        return question_template.replace("{question}", question) if question_template else question

    if template == "chat" or (template == "auto" and has_chat):
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return lambda q: tokenizer.apply_chat_template(
            system + [{"role": "user", "content": worded(q)}], tokenize=False, add_generation_prompt=True
        )
    head = (tokenizer.bos_token or "") + (format_prompt(system_prompt) if system_prompt else "")
    return lambda q: head + format_prompt(worded(q))


def run_prompt(tokenizer, spec, template: str | None = None):
    """:func:`prompt_formatter` for a run spec's prompt keys (``template`` in place of its prompt_template when
    given: a model read through its own chat template)."""
    return prompt_formatter(tokenizer, template or spec.prompt_template, spec.system_prompt, spec.question_template)


def end_token_ids(model, tokenizer) -> list[int]:
    """Every token id that ends a completion: the tokenizer's EOS and the model's generation config's
    ``eos_token_id`` (an int or a list). Instruct models list several: Qwen2.5-Instruct ends a turn on
    <|im_end|> and text on <|endoftext|>, Llama-3-Instruct on <|eot_id|> or <|end_of_text|>."""
    ids = [tokenizer.eos_token_id]
    config = getattr(model, "generation_config", None)
    listed = getattr(config, "eos_token_id", None)
    ids += listed if isinstance(listed, (list, tuple)) else [listed]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def completion_mask(completions: torch.Tensor, end_ids: int | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """1.0 on each completion's tokens up to and including its first end token (any of ``end_ids``).

    completions (N, T) -> mask (N, T) float, ended (N,) bool (False: cut at T without an end token).
    Example: end ids {2, 3}, row [5, 3, 0, 0] -> mask [1, 1, 0, 0], ended True.
    """
    ends = torch.as_tensor(end_ids if isinstance(end_ids, (list, tuple)) else [end_ids], device=completions.device)
    is_end = torch.isin(completions, ends)
    ended = is_end.any(dim=1)
    # number of end tokens strictly before position t; a token is real while none came before it
    before = torch.cumsum(is_end.int(), dim=1) - is_end.int()
    return (before == 0).float(), ended


def token_pieces(tokenizer, rows: list[list[int]]) -> list[list[str]]:
    """The text each token adds to its decoded row, read in context: "".join(pieces) == decode(row).

    A token decoded alone is not its text in context: a SentencePiece tokenizer drops the space of a
    word-start token ("▁sold" alone is "sold", after "▁Natalia" it adds " sold"), and a byte-level BPE
    token holding part of a multi-byte character decodes to "\\ufffd". So token k's piece is
    decode(row[k-C : k+1]) minus decode(row[k-C : k]) with C = PIECE_CONTEXT tokens of context; tokens that
    end inside a character add "" and the token that completes it carries the whole character. Special
    tokens add "". All windows of all rows go through two batched decodes.
    """
    windows = [(row, max(0, k - PIECE_CONTEXT), k) for row in rows for k in range(len(row))]
    before = _decode_batch(tokenizer, [row[s:k] for row, s, k in windows])
    upto = _decode_batch(tokenizer, [row[s : k + 1] for row, s, k in windows])
    out, w = [], 0
    for row in rows:
        pieces, pending = [], None  # pending: the first token of a character not yet complete
        for k in range(len(row)):
            head, full = before[w], upto[w]
            w += 1
            if full.endswith(REPLACEMENT) and k < len(row) - 1:  # the character goes on in the next token
                pending = k if pending is None else pending
                pieces.append("")
                continue
            if pending is not None or not full.startswith(head):  # read from before the unfinished character
                first = pending if pending is not None else k
                s = max(0, first - PIECE_CONTEXT)
                head, full = _decode_batch(tokenizer, [row[s:first], row[s : k + 1]])
                pending = None
            pieces.append(full[len(head) :])
        out.append(pieces)
    return out


def _decode_batch(tokenizer, rows: list[list[int]]) -> list[str]:
    """Each row's text, special tokens left out. A fast tokenizer's Rust decoder takes the whole batch in one
    call (about 12x faster than ``batch_decode``, which decodes row by row in Python); others decode as usual."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return backend.decode_batch(rows, skip_special_tokens=True)
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def step_boundaries(token_texts: list[str], delimiter: str = STEP_DELIMITER) -> tuple[list[str], list[int]]:
    """Split a completion into steps at ``delimiter``; return (steps, 0-based token index of each step's end).

    ``token_texts``: each token's text in context (``token_pieces``), so that their concatenation is the
    completion. A step ends at the token holding its last character (the delimiter belongs to no step).
    Example: ["3*4", "=12\\n2", "+12=14"] -> (["3*4=12", "2+12=14"], [1, 2]).
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
