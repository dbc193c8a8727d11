"""``python -m grpo_engine.rollout.prompt_preview``: a question as the model will read it, JSON in and JSON out.

The Launch tab's "Show the model's prompt" (app.service.previews) runs this in a subprocess, so that the web process
never loads a tokenizer's model files nor imports torch. It reads ``{model, cache_dir, prompt_template,
system_prompt, question_template, question}`` on stdin and writes ``{prompt, token_count, special_tokens}`` on
stdout: the prompt text exactly as training encodes it (tokenization.run_prompt, then the tokenizer without added
special tokens, as outputs.encode_prompts does), its length in tokens and the special tokens it holds, or
``{error}`` when the model's tokenizer cannot be loaded or the template refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def load_tokenizer(model: str, cache_dir: str):
    """The tokenizer a run of ``model`` trains with: the built-in one (built in memory when the built-in model is
    not cached yet: the same vocabulary), or the tokenizer of the directory the model resolves to (a local
    directory, a .gguf file's converted directory, a Hugging Face id)."""
    from transformers import AutoTokenizer

    from grpo_engine.model.model import BUILTIN_VERSION, build_tokenizer, resolve_model_path
    from grpo_engine.spec.config import BUILTIN_MODEL

    if model == BUILTIN_MODEL and not (Path(cache_dir) / f"{BUILTIN_MODEL}-{BUILTIN_VERSION}").is_dir():
        return build_tokenizer()
    return AutoTokenizer.from_pretrained(resolve_model_path(model, Path(cache_dir), log=lambda message: None))


def preview(request: dict) -> dict:
    """The prompt text of ``request["question"]`` under the request's prompt keys, its token count and the special
    tokens it holds (in the order they first appear)."""
    from grpo_engine.rollout.tokenization import run_prompt

    tokenizer = load_tokenizer(request["model"], request["cache_dir"])
    spec = SimpleNamespace(
        prompt_template=request.get("prompt_template") or "auto",
        system_prompt=request.get("system_prompt") or "",
        question_template=request.get("question_template") or "",
    )
    text = run_prompt(tokenizer, spec)(request["question"])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    found = dict.fromkeys(tokenizer.convert_ids_to_tokens([i for i in ids if i in special]))
    return {"prompt": text, "token_count": len(ids), "special_tokens": list(found)}


def main() -> None:
    """Read the request on stdin, write the result (or ``{error}``) on stdout."""
    request = json.load(sys.stdin)
    out, sys.stdout = sys.stdout, sys.stderr  # a library that prints must not break the JSON answer
    try:
        result = preview(request)
    except (OSError, ValueError, KeyError) as e:
        result = {"error": " ".join(str(e).split())[:500]}
    out.write(json.dumps(result))
    out.flush()


if __name__ == "__main__":
    main()
