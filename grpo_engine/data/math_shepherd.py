"""Math-Shepherd's step-labelled solutions (arXiv 2312.08935): the PRM's optional training data (``rm_data``).

A row holds ``input`` (the question, then a solution whose every step ends with the step tag ``ки``) and
``label`` (the same text with each tag replaced by ``+`` or ``-``). :func:`parse_math_shepherd` reads one
row, :func:`load_math_shepherd` a whole file or Hugging Face dataset. Pure Python.
"""

from __future__ import annotations

import re
from pathlib import Path

from grpo_engine.data.data import iter_jsonl, load_hub_split

MATH_SHEPHERD_TAG = "ки"
_FIRST_STEP_RE = re.compile(r"step 1\s*:", re.IGNORECASE)


def parse_math_shepherd(
    input_text: str, label_text: str, tag: str = MATH_SHEPHERD_TAG
) -> tuple[str, list[str], list[float]]:
    """One Math-Shepherd row (peiyi9979/Math-Shepherd, arXiv 2312.08935) as (question, steps, labels).

    ``input`` is the question followed by a solution whose every step ends with the step tag
    ``ки``; ``label`` is the same text with each tag replaced by ``+`` (a good step: rollouts from it
    reach the right answer) or ``-`` (a bad one). Labels are 1.0 / 0.0, one per step.

    Where the question ends: the rows write ``<question> Step 1: ... ки\\nStep 2: ... ки``, so the
    question is the text before the first ``Step 1:`` (any case) and that step starts there; steps keep
    their ``Step k:`` prefix, as the PRM sees them. A few rows have no ``Step 1:``: then the question
    ends at its last ``?`` before the first tag. A row whose ``Step 1:`` comes only after a tag (a
    stray tag inside the question, a known annotation slip in the dataset) is refused.
    Raises ValueError, naming the problem, when the label text is not the input with each tag
    replaced by one ``+`` / ``-``, when a label is anything else, when there is no tag, when text
    follows the last tag, or when a step is empty.
    """
    if not tag:
        raise ValueError("the step tag is empty")
    parts = input_text.split(tag)  # parts[j] is the text before tag j; parts[-1] follows the last tag
    if len(parts) == 1:
        raise ValueError(f"the input has no step tag {tag!r}")
    if parts[-1].strip():
        raise ValueError(f"text after the last step tag {tag!r}: {parts[-1].strip()[:40]!r}")
    labels, pos = [], 0
    for j, part in enumerate(parts):
        got = label_text[pos : pos + len(part)]
        if got != part:
            # the first place they differ: their common prefix's length when one is a prefix of the other
            k = next((i for i, (x, y) in enumerate(zip(got, part, strict=False)) if x != y), min(len(got), len(part)))
            raise ValueError(
                f"the label text differs from the input at character {pos + k} (step {j + 1}): "
                f"{label_text[pos + k : pos + k + 20]!r} where the input has {part[k : k + 20]!r}"
            )
        pos += len(part)
        if j == len(parts) - 1:
            break
        mark = label_text[pos : pos + 1]
        if mark not in ("+", "-"):
            raise ValueError(
                f"the label of step {j + 1} is {mark!r}, not '+' or '-'"
                if mark
                else f"the label text ends before the label of step {j + 1}"
            )
        labels.append(1.0 if mark == "+" else 0.0)
        pos += 1
    if pos != len(label_text):
        raise ValueError(f"the label text goes on after the last step: {label_text[pos : pos + 20]!r}")

    head = parts[0]
    first = _FIRST_STEP_RE.search(head)
    if first is not None:
        question, first_step = head[: first.start()], head[first.start() :]
    elif any(_FIRST_STEP_RE.search(p) for p in parts[1:]):
        raise ValueError(f"a step tag {tag!r} comes before 'Step 1:' (a tag inside the question?)")
    elif "?" in head:
        cut = head.rindex("?") + 1
        question, first_step = head[:cut], head[cut:]
    else:
        raise ValueError("cannot tell where the question ends: no 'Step 1:' and no '?' before the first step tag")
    steps = [first_step.strip()] + [p.strip() for p in parts[1:-1]]
    if not question.strip():
        raise ValueError("the question is empty")
    for j, step in enumerate(steps):
        if not step:
            raise ValueError(f"step {j + 1} is empty")
    return question.strip(), steps, labels


def load_math_shepherd(name: str, tag: str = "ки") -> tuple[list[tuple[str, list[str], list[float]]], int]:
    """Step-labelled PRM data in Math-Shepherd's format (rows with 'input' and 'label'; see
    parse_math_shepherd): a local .jsonl or .parquet file, or a Hugging Face dataset id (its
    'train' split). Returns ([(question, steps, labels)], rows skipped). A row that does not parse (the
    dataset has a few annotation slips) is skipped; a source where most rows do not parse is refused."""

    path = Path(name).expanduser()
    if path.suffix.lower() in (".jsonl", ".parquet"):
        if not path.is_file():
            raise ValueError(f"rm_data {name!r}: no such file")
        if path.suffix.lower() == ".jsonl":
            raw = [row for _, row in iter_jsonl(path, f"rm_data {name!r}")]
        else:
            import pyarrow.parquet as pq

            raw = pq.read_table(path).to_pylist()
    else:
        raw = list(load_hub_split(name, "", "train", what="rm_data"))
    examples, skipped = [], 0
    for i, row in enumerate(raw, start=1):
        if not isinstance(row, dict) or not isinstance(row.get("input"), str) or not isinstance(row.get("label"), str):
            raise ValueError(f"rm_data {name!r}: row {i} needs the text fields 'input' and 'label'")
        try:
            examples.append(parse_math_shepherd(row["input"], row["label"], tag))
        except ValueError:
            skipped += 1
    if len(examples) < max(2, skipped):
        raise ValueError(
            f"rm_data {name!r}: only {len(examples)} of {len(raw)} rows are Math-Shepherd rows "
            f"(question, steps each ending in {tag!r}, and the same text with each tag replaced by + or -)"
        )
    return examples, skipped
