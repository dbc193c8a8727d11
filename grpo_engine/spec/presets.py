"""The presets: named run specs a user starts from, the keys each sets over the defaults. The Launch form offers them
(app.web.views.launch_form.preset_values) and ``/list_presets`` returns them, from this one list; tests check each is a
valid run spec.

"Small instruct model on word problems (CPU)" is the recipe that teaches SmolLM2-135M-Instruct the answers on
2 CPU cores, not only the form (docs/data-and-rewards.md, "Teaching an instruct model the answer"): the verifier
reads answers in prose (answer_match flexible) so right answers carry a signal from step 1, ``strict_correct`` pays
a right answer stated after '####' as much again, and ``format_after_working`` pays the form, a little, only after
some working. bench/real_model.py trains this spec and prints its held-out curves.
"""

from __future__ import annotations

# verl's GSM8K instruction: the answer after "####", the form the strict answer match reads
GSM8K_INSTRUCTION = '{question}\nLet\'s think step by step and output the final answer after "####".'

WORD_PROBLEMS_CPU = "Small instruct model on word problems (CPU)"
EVALUATE = "Evaluate a model (no training)"

PRESETS: dict[str, dict] = {
    "Built-in demo (CPU, minutes)": {},
    EVALUATE: {  # the model's baseline on its held-out questions: greedy accuracy, Pass@K and Maj@K, nothing trained
        "name": "evaluate",
        "steps_per_iteration": 0,
        "eval_every": 1,
        "eval_samples": 8,
    },
    WORD_PROBLEMS_CPU: {
        "name": "smollm2-word-problems",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "dataset": "builtin-word-problems",
        "question_template": GSM8K_INSTRUCTION,
        "answer_match": "flexible",
        "rewards": [
            {"name": "accuracy", "weight": 1.0},
            {"name": "strict_correct", "weight": 1.0},
            {"name": "format_after_working", "weight": 0.05},
        ],
        "group_size": 8,
        "batch_size": 4,
        "micro_batch_size": 8,  # the update's activations near 1 GB; the whole batch in one pass is no faster
        "max_new_tokens": 160,
        "temperature": 0.7,
        "learning_rate": 1e-5,
        "kl_coef": 0.04,
        "steps_per_iteration": 40,
        "eval_every": 10,
        "checkpoint_every": 10,
    },
    "GSM8K with a 0.5B instruct model (GPU)": {
        "name": "qwen0.5b-gsm8k",
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dataset": "openai/gsm8k",
        "dataset_config": "main",
        "dataset_split": "train",
        "eval_split": "test",
        "prompt_template": "auto",
        "question_template": GSM8K_INSTRUCTION,
        "format_reward": 0.1,
        "group_size": 8,
        "batch_size": 16,
        "max_new_tokens": 300,
        "learning_rate": 1e-6,
        "steps_per_iteration": 500,
        "eval_every": 25,
        "checkpoint_every": 25,
        "device": "gpu",
        "micro_batch_size": 16,
        "gradient_checkpointing": True,
    },
    "Process supervision with a learned PRM (built-in)": {
        "name": "builtin-prm",
        "supervision": "process",
        "reward": "model",
        "iterations": 2,
        "steps_per_iteration": 100,
        "rm_samples": 1024,
    },
}
