"""What a health rule says and how its advice reads the run: :class:`Rule` (its id, title, when it fires, what to
do), a warning (:func:`warn`), and the config's reading every rule's advice shares: a remedy is left out where the
config already has it (answer_match already 'flexible', a question_template or system_prompt that asks for '####'
or \\boxed, a reward that pays the form, a key the run does not read). A config may be partial (a key it lacks is
not known, so its remedy stays, without its value). Pure: the standard library and the run spec's fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from grpo_engine.spec.presets import PRESETS, WORD_PROBLEMS_CPU
from grpo_engine.spec.run_spec import DEFAULTS, FIELD_BY_NAME


@dataclass(frozen=True)
class Rule:
    """One health rule as the docs and UI list it: its id, a short title, when it fires, what to do."""

    id: str
    title: str
    condition: str
    action: str


HealthWarning = dict[str, Any]  # one warning: rule, title, message, steps, metrics, severity


def warn(rule: Rule, message: str, steps: list[int], metrics: list[str]) -> HealthWarning:
    return {
        "rule": rule.id,
        "title": rule.title,
        "message": message,
        "steps": steps,
        "metrics": metrics,
        "severity": "warning",
    }


# what eval/accuracy counts under each answer_match, and the other rule's accuracy
MATCH_WORDS = {
    "strict": ("only '#### <answer>' or \\boxed{} counts", "eval/accuracy_flexible"),
    "flexible": ("an output's last number counts too", "eval/accuracy_strict"),
}

FORM_WORDS = ("####", "boxed")  # a prompt holding one of these asks for the strict form

# the named rewards that teach a small instruct model the answer and not only the form (docs/data-and-rewards.md,
# "Teaching an instruct model the answer, not only the form"), with answer_match 'flexible': the CPU preset's
_PRESET_REWARDS = {r["name"]: r for r in PRESETS[WORD_PROBLEMS_CPU]["rewards"]}
ANSWER_RECIPE = (_PRESET_REWARDS["accuracy"], _PRESET_REWARDS["strict_correct"])
FORM_AFTER_WORKING = _PRESET_REWARDS["format_after_working"]
GSM8K_TEMPLATE = '{question}\\nLet\'s think step by step and output the final answer after "####".'


def now(config: Mapping, key: str) -> str:
    """' (now <value>)' when the config holds ``key``, else ''.

    >>> now({"learning_rate": 1e-05}, "learning_rate"), now({}, "kl_coef")
    (' (now 1e-05)', '')
    """
    value = config.get(key)
    return "" if value is None else f" (now {value:g})" if isinstance(value, float) else f" (now {value})"


def either(remedies: Sequence[str]) -> str:
    """Remedies as one sentence: the first with a capital, the others after '; or ', a period at the end.

    >>> either(["raise kl_coef", "lower the learning rate"]), either([])
    ('Raise kl_coef; or lower the learning rate.', '')
    """
    return f"{remedies[0][0].upper()}{remedies[0][1:]}{''.join('; or ' + r for r in remedies[1:])}." if remedies else ""


def reads(config: Mapping, key: str) -> bool:
    """Whether the run reads ``key`` (its applicability rule over the config, a missing key at its default).

    >>> reads({"rewards": [{"name": "accuracy"}]}, "format_reward"), reads({}, "format_reward")
    (False, True)
    """
    rule = FIELD_BY_NAME[key].applies
    return rule is None or rule({**DEFAULTS, **config})


def named_rewards(config: Mapping) -> dict[str, Any]:
    """The config's named rewards, name -> weight (None when it gives none).

    >>> named_rewards({"rewards": [{"name": "accuracy", "weight": 1.0}, {"name": "format"}]})
    {'accuracy': 1.0, 'format': None}
    """
    entries = config.get("rewards") if reads(config, "rewards") else None
    return {r["name"]: r.get("weight") for r in entries or [] if isinstance(r, Mapping) and "name" in r}


def pays_form(name: str) -> bool:
    """Whether a named reward pays the form: a name holding 'format' (format, format_after_working, a custom one)."""
    return "format" in name.lower()


def form_rewards(config: Mapping) -> list[str]:
    """What pays the form in this run: 'format_reward' (when it is > 0 and read) and the named rewards that do."""
    paid = ["format_reward"] if reads(config, "format_reward") and (config.get("format_reward") or 0) > 0 else []
    return paid + [name for name in named_rewards(config) if pays_form(name)]


def form_metrics(config: Mapping) -> list[str]:
    """The training metrics of what pays the form: answer_stated_frac for format_reward (the share it pays),
    reward/<name> for a named reward.

    >>> form_metrics({"rewards": [{"name": "accuracy"}, {"name": "format_after_working"}]})
    ['reward/format_after_working']
    """
    return ["answer_stated_frac" if name == "format_reward" else f"reward/{name}" for name in form_rewards(config)]


def asks_for_form(config: Mapping) -> bool:
    """Whether question_template or system_prompt asks for the strict form (holds '####' or 'boxed')."""
    prompt = f"{config.get('question_template') or ''}\n{config.get('system_prompt') or ''}"
    return any(word in prompt for word in FORM_WORDS)


def rewards_json(rewards: Sequence[Mapping]) -> str:
    return json.dumps(list(rewards))


def named_builtins(config: Mapping) -> bool:
    """Whether the run can take built-in named rewards: outcome supervision with the rule's rewards."""
    return config.get("supervision", "outcome") == "outcome" and reads(config, "rewards")
