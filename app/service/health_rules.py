"""The health rules as the docs and the UI state them: each rule's thresholds, and its id, title, when it fires
and what to do (:class:`Rule`); :data:`RULES`, every rule in the order app.service.health checks them, and
:func:`rules_markdown`, that list as docs/diagnosing.md's Markdown table. The checks themselves, which read these
thresholds, are app.service.health's.

What to do for one run (:func:`form_remedies`, :func:`form_not_answers_remedies`, :func:`repetition_remedies`,
...) is read from the run's config: a remedy is left out where the config already has it (answer_match already
'flexible', a question_template or system_prompt that asks for '####' or \\boxed, a reward that pays the form, a
key the run does not read). A config may be partial (a key it lacks is not known, so its remedy stays, without
its value).

Pure: the standard library and the run spec's fields (grpo_engine.spec.run_spec).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from grpo_engine.spec.run_spec import DEFAULTS, FIELD_BY_NAME

# form_not_answers: held-out accuracy falls over the evaluations while the form rises
FALL_EVAL_POINTS = 3  # evaluations needed, step 0's included: two make one change, three a direction
FALL_DROP = 0.1  # the latest eval/accuracy at least this far below the best one before it (2 of 20 held-out
#                  questions: more than one question's wobble) ...
FALL_SHARE = 1 / 3  # ... and at least this share of that best (0.90 -> 0.80 is a wobble; 0.25 -> 0.15 lost 40%)
FORM_RISE = 0.1  # the form rose by at least this: eval/format from that best evaluation to the latest, or the
#                  share a reward that pays the form pays (first training window since then vs the recent window)

# windows
MIN_STEPS = 10  # training steps recorded before a rule that compares windows may fire
MIN_STEPS_RECENT = 5  # ... before a rule that reads the recent window alone may fire

# reward_hacking
HACK_REWARD_RISE = 0.1  # reward_mean rise (recent window mean minus a baseline window mean), absolute
HACK_EVAL_RISE = 0.02  # eval/accuracy counts as flat when it changed by less than this over the same span
HACK_EVAL_POINTS = 3  # evaluations needed over the span
HACK_EVAL_CEILING = 0.95  # held-out accuracy this high at the span's start has no room left to rise

# length_reward
LENGTH_R = 0.5  # Pearson r of (length, reward) at or above which longer outputs are paid more
LENGTH_PAIRS = 30  # samples needed

# repetition_rising
REPETITION_LEVEL = 0.2  # recent mean share of repeated word 3-grams
REPETITION_RISE = 0.1  # its rise over the earlier window

# entropy_collapse
ENTROPY_BASELINE_STEPS = 5  # the first training steps whose mean entropy is the baseline
ENTROPY_SHARE = 0.2  # recent entropy below this share of the baseline ...
ENTROPY_FLOOR = 0.05  # ... or below this many nats (when it fell to there)

# kl_runaway
KL_LIMIT = 0.5  # nats per token: recent mean above this
KL_GROWTH = 4.0  # ... or above this many times the earlier window's mean ...
KL_GROWTH_FLOOR = 0.1  # ... while above this many nats per token

# zero_spread
ZERO_SPREAD_LEVEL = 0.8  # recent mean share of groups whose rewards are all equal

# truncation
TRUNCATION_LEVEL = 0.2  # recent mean share of completions cut at max_new_tokens

# answer_form: the latest evaluation's eval/accuracy_flexible, eval/accuracy_strict and eval/format
FORM_FLEXIBLE_LEVEL = 0.2  # a fifth of the held-out questions answered right (by the last number) or more ...
FORM_GAP = 0.15  # ... at least this much above the strict accuracy (right answers the reward does not see) ...
FORM_FORMAT_LEVEL = 0.5  # ... while fewer than this share of the outputs state a final answer in the strict form
FORM_METRICS = ("eval/accuracy_strict", "eval/accuracy_flexible", "eval/format")
CAUSE_CUT_LEVEL = 0.5  # zero spread's cause: at least this share of the outputs cut at max_new_tokens, or ...
CAUSE_STATED_LEVEL = 0.2  # ... mostly all wrong with fewer than this share stating an answer in the strict form


@dataclass(frozen=True)
class Rule:
    """One health rule as the docs and UI list it: its id, a short title, when it fires, what to do."""

    id: str
    title: str
    condition: str
    action: str


ANSWER_FORM = Rule(
    "answer_form",
    "Right answers, wrong form",
    f"at the latest evaluation (step 0's included), eval/accuracy_flexible is >= {FORM_FLEXIBLE_LEVEL} and "
    f">= {FORM_GAP} above eval/accuracy_strict while eval/format is < {FORM_FORMAT_LEVEL}; not with answer_match "
    "'flexible'",
    "set answer_match: flexible; or ask for the form with question_template (e.g. '{question}\\nLet's think step "
    'by step and output the final answer after "####".\'); or pay for it after some working with the named reward '
    "format_after_working (format_reward pays a bare '#### 7' too)",
)
REWARD_HACKING = Rule(
    "reward_hacking",
    "Reward up, accuracy flat",
    f"reward_mean's recent-window mean is >= {HACK_REWARD_RISE} above its earlier-window mean (or, failing "
    f"that, the mean of as many first training steps) while eval/accuracy, over >= {HACK_EVAL_POINTS} evaluations from the last "
    f"one at or before that span to its end, changed by < {HACK_EVAL_RISE} (or fell); not when held-out "
    f"accuracy already was >= {HACK_EVAL_CEILING} at the span's start",
    "look at samples with a high reward that the verifier calls wrong; check the reward functions (or the "
    "learned reward model) for what they pay for besides a right answer",
)
LENGTH_REWARD = Rule(
    "length_reward",
    "Longer outputs paid more",
    f"Pearson r of (completion length, reward) over the latest recorded samples is >= {LENGTH_R}, over "
    f">= {LENGTH_PAIRS} samples with some spread in both (a negative r is not flagged: short right answers "
    "beating long wrong or cut ones is normal)",
    "check that the reward does not pay for length (a length reward, a learned reward model)",
)
REPETITION_RISING = Rule(
    "repetition_rising",
    "Outputs repeat themselves",
    f"repetition's recent-window mean is >= {REPETITION_LEVEL} and >= {REPETITION_RISE} above its earlier-window mean",
    "look at the samples; add a repetition reward, lower the learning rate or raise kl_coef",
)
ENTROPY_COLLAPSE = Rule(
    "entropy_collapse",
    "Entropy collapsed",
    f"entropy's recent-window mean is < {ENTROPY_SHARE:.0%} of its mean over the first "
    f"{ENTROPY_BASELINE_STEPS} training steps, or < {ENTROPY_FLOOR} nats having started above that",
    "lower the learning rate, raise the temperature, or use clip-higher (clip_eps_high)",
)
KL_RUNAWAY = Rule(
    "kl_runaway",
    "KL running away",
    f"in the current iteration (the reference resets at each), kl's recent-window mean is > {KL_LIMIT} "
    f"nats/token, or > {KL_GROWTH:g}x its earlier-window mean while > {KL_GROWTH_FLOOR} nats/token",
    "raise kl_coef or lower the learning rate",
)
ZERO_SPREAD = Rule(
    "zero_spread",
    "Most groups teach nothing",
    f"zero_std_frac's recent-window mean is >= {ZERO_SPREAD_LEVEL} (from {MIN_STEPS_RECENT} training steps on)",
    "the message names the cause: outputs cut (raise max_new_tokens), no answer in the reward's form (answer_match, "
    "question_template, format_reward), mostly all wrong (easier questions, group_size, temperature) or all right "
    "(harder questions, skip_zero_spread)",
)
TRUNCATION = Rule(
    "truncation",
    "Outputs cut short",
    f"truncated_frac's recent-window mean is >= {TRUNCATION_LEVEL} (from {MIN_STEPS_RECENT} training steps on)",
    "raise max_new_tokens, or set mask_truncated or overlong_penalty",
)

FORM_NOT_ANSWERS = Rule(
    "form_not_answers",
    "Learning the form, not the answers",
    f"over >= {FALL_EVAL_POINTS} evaluations (step 0's included), the latest eval/accuracy (held-out accuracy under "
    f"the run's answer_match) is >= {FALL_DROP} and >= {FALL_SHARE:.0%} below the best one before it, while "
    f"eval/format rose by >= {FORM_RISE} since that evaluation or a reward that pays the form rose by >= "
    f"{FORM_RISE} over the training steps since (answer_stated_frac with format_reward > 0, reward/format, "
    "reward/format_after_working)",
    "lower or drop format_reward or the format named reward (they pay a bare '#### 7'); use the named rewards "
    "strict_correct and format_after_working; lower learning_rate",
)

# every rule, in the order health_warnings checks them: the badge's headline is the first that fires
RULES: tuple[Rule, ...] = (
    FORM_NOT_ANSWERS,
    ANSWER_FORM,
    REWARD_HACKING,
    LENGTH_REWARD,
    REPETITION_RISING,
    ENTROPY_COLLAPSE,
    KL_RUNAWAY,
    ZERO_SPREAD,
    TRUNCATION,
)


def rules_markdown() -> str:
    """RULES as a Markdown table: rule | fires when | what to do."""
    lines = ["| rule | fires when | what to do |", "| --- | --- | --- |"]
    lines += [f"| `{r.id}` ({r.title}) | {r.condition} | {r.action} |" for r in RULES]
    return "\n".join(lines) + "\n"


# --- what to do, for one run ---------------------------------------------------------------------------------

# what eval/accuracy counts under each answer_match, and the other rule's accuracy
MATCH_WORDS = {
    "strict": ("only '#### <answer>' or \\boxed{} counts", "eval/accuracy_flexible"),
    "flexible": ("an output's last number counts too", "eval/accuracy_strict"),
}
FORM_WORDS = ("####", "boxed")  # a prompt holding one of these asks for the strict form
# the named rewards that teach a small instruct model the answer and not only the form (docs/data-and-rewards.md,
# "Teaching an instruct model the answer, not only the form"), with answer_match 'flexible'
ANSWER_RECIPE = ({"name": "accuracy", "weight": 1.0}, {"name": "strict_correct", "weight": 1.0})
FORM_AFTER_WORKING = {"name": "format_after_working", "weight": 0.15}
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


def _rewards_json(rewards: Sequence[Mapping]) -> str:
    return json.dumps(list(rewards))


def _named_builtins(config: Mapping) -> bool:
    """Whether the run can take built-in named rewards: outcome supervision with the rule's rewards."""
    return config.get("supervision", "outcome") == "outcome" and reads(config, "rewards")


def form_remedies(config: Mapping) -> list[str]:
    """What to change when right answers are not stated in the form the reward reads (answer_form, zero_spread's
    form cause), leaving out what the config already has: answer_match 'flexible', a prompt that asks for '####',
    a reward that pays the form.

    >>> form_remedies({"answer_match": "flexible", "question_template": "{question} ####", "format_reward": 0.1})
    []
    """
    remedies = []
    if config.get("answer_match") != "flexible":
        remedies.append("set answer_match: flexible (the reward then also counts an output's last number)")
    if not asks_for_form(config):
        remedies.append(
            "reword question_template to ask for a last line '#### <answer>'"
            if config.get("question_template")
            else f"ask for the form with question_template, e.g. '{GSM8K_TEMPLATE}'"
        )
    if not form_rewards(config) and config.get("supervision") != "process":
        if not named_rewards(config) and reads(config, "format_reward"):
            remedies.append(
                "pay for the form after some working with the named reward format_after_working (rewards "
                f"{_rewards_json([*ANSWER_RECIPE, FORM_AFTER_WORKING])}; format_reward pays a bare '#### 7' too)"
                if _named_builtins(config)
                else "pay for the form with format_reward (e.g. 0.1)"
            )
        elif _named_builtins(config):
            remedies.append(f"add {_rewards_json([FORM_AFTER_WORKING])[1:-1]} to rewards")
    return remedies


def form_not_answers_remedies(config: Mapping) -> list[str]:
    """What to change when held-out accuracy falls while the form rises (form_not_answers): lower or drop what
    pays a bare form (format_reward, the 'format' named reward; format_after_working's weight), use the named
    rewards strict_correct and format_after_working where the run has not, lower learning_rate.

    >>> form_not_answers_remedies({"format_reward": 0.1, "learning_rate": 1e-05})[0]
    'lower or drop format_reward (now 0.1)'
    """
    rewards = named_rewards(config)
    remedies = [
        f"lower or drop format_reward{now(config, 'format_reward')}"
        if name == "format_reward"
        else f"lower or drop the named reward {name} (weight {rewards[name]})"
        if name != FORM_AFTER_WORKING["name"]
        else f"lower the named reward {name}'s weight (now {rewards[name]})"
        for name in form_rewards(config)
    ]
    wanted = [r for r in (*ANSWER_RECIPE[1:], FORM_AFTER_WORKING) if r["name"] not in rewards]
    if wanted and _named_builtins(config):
        remedies.append(
            "pay the answer and not only the form with the named rewards strict_correct (a right answer stated "
            "as '#### <answer>') and format_after_working (the form after 5 or more words of working): "
            + (
                f"rewards {_rewards_json([*ANSWER_RECIPE, FORM_AFTER_WORKING])}"
                if not rewards
                else f"add {_rewards_json(wanted)[1:-1]} to rewards"
                + (" in place of format" if "format" in rewards else "")
            )
        )
    if config.get("reward") == "model":
        remedies.append("check what the learned reward model pays for besides a right answer")
    remedies.append(f"lower learning_rate{now(config, 'learning_rate')}")
    return remedies


def repetition_remedies(config: Mapping) -> list[str]:
    """repetition_rising's remedies: a repetition named reward (its weight raised where the run has one; not
    with a learned reward model or process supervision, which take no built-in), the learning rate, kl_coef."""
    rewards = named_rewards(config)
    remedies = []
    if "repetition" in rewards:
        remedies.append(f"raise the repetition reward's weight (now {rewards['repetition']})")
    elif _named_builtins(config):
        remedies.append('add {"name": "repetition", "weight": 1.0} to rewards')
    return remedies + [
        f"lower learning_rate{now(config, 'learning_rate')}",
        f"raise kl_coef{now(config, 'kl_coef')}",
    ]


def entropy_remedies(config: Mapping) -> list[str]:
    """entropy_collapse's remedies: learning_rate, temperature, and clip-higher unless clip_eps_high is set."""
    high = config.get("clip_eps_high")
    return [
        f"lower learning_rate{now(config, 'learning_rate')}",
        f"raise the temperature{now(config, 'temperature')}",
        f"raise clip_eps_high{now(config, 'clip_eps_high')}" if high else "use clip-higher (clip_eps_high, e.g. 0.28)",
    ]


def truncation_remedies(config: Mapping) -> list[str]:
    """truncation's remedies: max_new_tokens, and mask_truncated and overlong_penalty unless already set."""
    unset = [k for k in ("mask_truncated", "overlong_penalty") if not config.get(k)]
    return [f"raise max_new_tokens{now(config, 'max_new_tokens')}"] + (["set " + " or ".join(unset)] if unset else [])


def length_remedies(config: Mapping) -> list[str]:
    """length_reward's remedies: the named 'length' reward when the run has one, the learned reward model when
    it learns one, else what to look at."""
    rewards = named_rewards(config)
    remedies = [f"lower or drop the named reward length (weight {rewards['length']})"] if "length" in rewards else []
    if config.get("reward") == "model":
        remedies.append("check whether the learned reward model pays for length")
    return remedies or ["look at the longest and the shortest samples: what in the rewards pays for length"]


def kl_remedies(config: Mapping) -> list[str]:
    """kl_runaway's remedies: kl_coef and learning_rate, with their values."""
    return [f"raise kl_coef{now(config, 'kl_coef')}", f"lower learning_rate{now(config, 'learning_rate')}"]


def spread_remedies(config: Mapping, too: str) -> list[str]:
    """zero_spread's remedies when most groups are all wrong (``too`` 'hard'), all right ('easy') or neither
    ('far'): the questions, group_size and the temperature (not for questions too easy), and skip_zero_spread
    unless it is on.

    >>> spread_remedies({"skip_zero_spread": True}, "easy")
    ['use harder questions']
    """
    questions = {"hard": "use easier questions", "easy": "use harder questions"}
    remedies = [questions.get(too, "use questions nearer the model's level")]
    if too != "easy":
        remedies += [
            f"raise group_size{now(config, 'group_size')}",
            f"raise the temperature{now(config, 'temperature')}",
        ]
    return remedies + ([] if config.get("skip_zero_spread") else ["turn on skip_zero_spread"])
