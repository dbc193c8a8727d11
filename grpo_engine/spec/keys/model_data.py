"""The run spec's "Model & data" keys: what is trained on what: the policy model, the dataset and its columns, and how a
question becomes the model's prompt.

One field a key (``key``: default, help, bounds, the Launch form's place and label, when a run reads it); RunSpec
(grpo_engine.spec.run_spec) gathers the four sections' keys in the form's order. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_engine.spec.applicability import HUB_DATASET, OWN_DATASET
from grpo_engine.spec.keys.field import key
from grpo_engine.spec.words import BUILTIN_DATASET, BUILTIN_MODEL, BUILTIN_WORD_PROBLEMS, MODEL_AND_DATA


@dataclass(frozen=True)
class ModelAndDataKeys:
    """The Model & data section's keys."""

    name: str = key(
        "", "A label for the run; empty picks one from the model and the time.", max_length=200, section=MODEL_AND_DATA
    )
    model: str = key(
        BUILTIN_MODEL,
        f"Policy to train: '{BUILTIN_MODEL}' (built-in tiny model, no download), a Hugging Face model id, or a local "
        "model directory (config.json, safetensors weights) or .gguf file, such as one in the models folder "
        "<data dir>/models (or one uploaded in the Launch tab: a .gguf file or a zipped model directory), or "
        "'run:<id>', the trained policy of a completed run of this dashboard (to evaluate it or train it further), "
        "or 'run:<id>@<step>', the policy of a checkpoint that run keeps (one still training, failed or cancelled).",
        section=MODEL_AND_DATA,
    )
    dataset: str = key(
        BUILTIN_DATASET,
        f"Questions with reference answers: '{BUILTIN_DATASET}' (built-in arithmetic), '{BUILTIN_WORD_PROBLEMS}' "
        "(built-in word problems of one or two operations, worked answers ending in '#### N'), a local .jsonl, .csv or "
        ".parquet file (or one uploaded in the Launch tab), or a Hugging Face dataset: a hub id such as "
        "'openai/gsm8k' or a local dataset directory (see dataset_config, dataset_split, eval_split).",
        section=MODEL_AND_DATA,
    )
    prompt_template: str = key(
        "auto",
        "How a question becomes the prompt: 'chat' = the model's chat template (a user turn, then the assistant's "
        "turn opened; for instruct models), 'plain' = the question on its own line (for base models), 'auto' = "
        "'chat' when the tokenizer has a chat template, else 'plain'.",
        choices=("auto", "chat", "plain"),
        section=MODEL_AND_DATA,
        label="Prompt template",
    )
    system_prompt: str = key(
        "",
        "Text the model reads before every question: a system turn through the chat template (prompt_template "
        "'chat'), or text on the line before the question ('plain'); empty = none. Used for training, evaluation, "
        "the reward model and rollout labels alike.",
        max_length=8000,
        section=MODEL_AND_DATA,
        label="System prompt",
    )
    question_template: str = key(
        "",
        "How a question is worded for the model: text holding {question} once, e.g. '{question}\\nLet's think step "
        "by step and output the final answer after \"####\".' (verl's GSM8K instruction); empty = the question as it "
        "is. Applied before prompt_template, everywhere the question is asked.",
        max_length=8000,
        note="holding `{question}` once, or empty",
        section=MODEL_AND_DATA,
        label="Question template ({question} is the question)",
    )
    dataset_config: str = key(
        "",
        "Hugging Face datasets: the configuration to load (e.g. 'main' for openai/gsm8k); empty = the default.",
        section=MODEL_AND_DATA,
        fold=True,
        label="Dataset configuration",
        applies=HUB_DATASET,
    )
    dataset_split: str = key(
        "train", "Hugging Face datasets: the split to train on.", section=MODEL_AND_DATA, fold=True, applies=HUB_DATASET
    )
    eval_split: str = key(
        "",
        "Hugging Face datasets: the split held out for eval/accuracy (e.g. 'test'); empty = the last 10% (at most "
        "200) of the training rows, as for files.",
        section=MODEL_AND_DATA,
        fold=True,
        label="Held-out split",
        applies=HUB_DATASET,
    )
    question_field: str = key(
        "question",
        "The dataset column that holds the question (the prompt).",
        section=MODEL_AND_DATA,
        fold=True,
        applies=OWN_DATASET,
    )
    answer_field: str = key(
        "answer",
        "The dataset column that holds the reference answer: the answer itself, or a whole solution that ends in "
        "'#### <answer>' or holds \\boxed{...} (GSM8K's 'answer', MATH's 'solution').",
        section=MODEL_AND_DATA,
        fold=True,
        applies=OWN_DATASET,
    )
    solution_field: str = key(
        "solution",
        "The dataset column with a step-by-step reference solution (optional).",
        section=MODEL_AND_DATA,
        fold=True,
        applies=OWN_DATASET,
    )
