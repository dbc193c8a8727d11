"""The metrics a run records, named once: :data:`METRIC_REGISTRY` gives each its meaning, the dashboard chart panel
that draws it and whether the CLI's progress bar shows it; a name ending in ``<...>`` stands for a family
(``reward/<name>``, ``eval/pass@<k>``). The store, the API, the charts, the health rules and the docs read them from
here. Pure Python: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric the engine records: its key (the same in the store, the API's ``/get_metrics`` and the
    dashboard), what it means, the dashboard chart panel that draws it (None: in no panel; drawn in "other" only when picked), and whether
    ``grpo-dashboard train`` shows it beside its progress bar (``headline``)."""

    name: str
    meaning: str
    panel: str | None
    headline: bool = False


# Every metric the engine records, documented once, in the order the dashboard draws them: the panels in
# order of their first metric, each panel's lines in this order.
METRIC_REGISTRY: tuple[Metric, ...] = (
    Metric("reward_mean", "mean reward of the step's B x G sampled outputs", "reward", headline=True),
    Metric("reward_std", "standard deviation (population) of those rewards", "reward"),
    Metric(
        "reward/<name>",
        "one metric per named reward of the run spec's rewards: the mean of its own (unweighted) "
        "value over the step's outputs (process supervision: of each output's mean step value)",
        "reward",
    ),
    Metric("correct_frac", "share of sampled outputs whose final answer the verifier accepts", "accuracy"),
    Metric(
        "zero_std_frac",
        "share of groups whose rewards are all equal (their advantages are 0: they teach nothing)",
        "fractions",
    ),
    Metric(
        "eval/accuracy",
        "held-out greedy accuracy (exact final answer, read as answer_match says); at step 0, "
        "before training, and every eval_every steps",
        "accuracy",
        headline=True,
    ),
    Metric(
        "eval/accuracy_strict",
        "held-out greedy accuracy counting only final answers stated as '#### <answer>' "
        "(the last line) or \\boxed{...}, whatever answer_match is; on the steps of eval/accuracy",
        "accuracy",
    ),
    Metric(
        "eval/accuracy_flexible",
        "held-out greedy accuracy also counting the last number of an output that "
        "states no such answer (lm-eval's flexible extraction), whatever answer_match is; on the same steps",
        "accuracy",
    ),
    Metric(
        "eval/format",
        "share of held-out greedy outputs that state a final answer as '#### <answer>' or "
        "\\boxed{...}, right or wrong; on the same steps",
        "accuracy",
    ),
    Metric(
        "eval/pass@<k>",
        "with eval_samples K > 0, for k = 1, 2, 4, ... up to K: the unbiased estimate of the chance that some of k "
        "outputs sampled at eval_temperature is right (1 - C(n - c, k) / C(n, k), n = K outputs of which c are right), "
        "averaged over the held-out questions; on the steps of eval/accuracy",
        "sampled evaluation",
    ),
    Metric(
        "eval/maj@<k>",
        "with eval_samples K > 0: the share of held-out questions whose majority answer over k sampled outputs is "
        "right (outputs stating no answer do not vote; a tie goes to the answer stated first); on the same steps",
        "sampled evaluation",
    ),
    Metric(
        "kl", "mean over tokens of the k3 estimator of KL(pi_theta || pi_ref) (Eq. 4)", "KL and loss", headline=True
    ),
    Metric(
        "loss",
        "policy loss -J_GRPO (Eq. 3), its per-token terms aggregated as loss_type says, averaged over the mu updates",
        "KL and loss",
        headline=True,
    ),
    Metric(
        "clip_frac",
        "share of tokens where the clipped ratio term was the active one (only > 0 when mu > 1)",
        "fractions",
    ),
    Metric("entropy", "mean per-token entropy of the policy on the sampled outputs, in nats", "entropy (nats)"),
    Metric("completion_len", "mean completion length in tokens (EOS included)", "completion length (tokens)"),
    Metric("truncated_frac", "share of completions cut at max_new_tokens without an EOS", "fractions"),
    Metric(
        "answer_stated_frac",
        "share of sampled outputs that state a final answer in the strict form ('#### "
        "<answer>' line or \\boxed{}), right or wrong",
        "fractions",
    ),
    Metric(
        "repetition",
        "mean over outputs of the share of word 3-grams that repeat an earlier one in the output (0 = none)",
        "fractions",
    ),
    Metric(
        "groups/all_right",
        "groups whose outputs the verifier all accepted (binary rewards: no gradient)",
        "gradient sources",
    ),
    Metric(
        "groups/all_wrong",
        "groups whose outputs the verifier all rejected (binary rewards: no gradient)",
        "gradient sources",
    ),
    Metric(
        "groups/mixed",
        "groups with right and wrong outputs (where a binary reward's gradient comes from)",
        "gradient sources",
    ),
    Metric(
        "groups/zero_spread",
        "groups whose rewards (process: step rewards) are all equal: advantages 0, whatever the verdicts",
        "gradient sources",
    ),
    Metric(
        "tokens/adv_pos", "share of the step's real tokens with a positive advantage (pushed up)", "token advantages"
    ),
    Metric(
        "tokens/adv_neg", "share of the step's real tokens with a negative advantage (pushed down)", "token advantages"
    ),
    Metric(
        "tokens/adv_zero", "share of the step's real tokens with advantage 0 (no policy gradient)", "token advantages"
    ),
    Metric("grad_norm", "policy gradient norm before clipping (last of the mu updates)", "gradient norm"),
    Metric("learning_rate", "policy learning rate used at this step", "learning rate"),
    Metric(
        "sampling/drawn",
        "groups sampled at this step: batch_size, and with skip_zero_spread its extra draws too",
        "groups per step",
    ),
    Metric(
        "sampling/dropped",
        "groups whose rewards were all equal that skip_zero_spread dropped at this step (0 without it)",
        "groups per step",
    ),
    Metric(
        "update/skipped",
        "1 when the optimizer did not step because every advantage of the batch was 0 (no "
        "reward signal: every group zero-spread; the policy is unchanged, its loss and kl still measured), else 0",
        None,
    ),
    Metric("time/sampling", "seconds spent generating the G outputs per question", "timing (s)"),
    Metric("time/scoring", "seconds spent on rewards, advantages and reference log-probs", "timing (s)"),
    Metric(
        "time/labelling",
        "seconds spent labelling steps by rollouts (step_labels 'rollouts', else 0; not in time/scoring)",
        "timing (s)",
    ),
    Metric("time/update", "seconds spent on the mu policy updates", "timing (s)"),
    Metric(
        "time/step",
        "seconds for the step (sampling, scoring, update, recording; evaluation and an RM refresh apart)",
        "timing (s)",
    ),
    Metric("time/eval", "seconds spent on the held-out evaluation, on the steps that have one", "timing (s)"),
    # With ``reward: model``, the learned reward model's training, recorded at step 0 (its initial training on
    # the initial policy's labelled outputs; no accuracy_before) and on the last step of every iteration but
    # the last (the refresh of Algorithm 1; after the last iteration nothing would use it). Accuracy is over
    # outputs (ORM) or steps (PRM): (score > 0.5) == label, on fresh samples of the current policy on held-out
    # questions, measured before and after the refresh.
    Metric(
        "rm/accuracy_before",
        "reward model: held-out accuracy on fresh policy samples just before the refresh",
        "reward model",
    ),
    Metric(
        "rm/accuracy_after",
        "reward model: held-out accuracy on the same samples after the (re)training",
        "reward model",
    ),
    Metric("rm/loss", "reward model: mean binary cross-entropy of its last training epoch", "reward model"),
    Metric("rm/train_examples", "reward model: labelled outputs it was (re)trained on, replayed ones included", None),
    Metric(
        "rm/replayed",
        "reward model: how many of those were replayed from its earlier data (rm_replay_ratio x fresh)",
        None,
    ),
)
RM_PREFIX = "rm/"  # the reward model's metrics: recorded only with ``reward: model``
FAMILY = re.compile(r"<\w+>$")  # a registry name ending so stands for a family: reward/<name> is reward/length, ...


def family_prefix(name: str) -> str | None:
    """The prefix a family's metrics share ('reward/<name>' -> 'reward/', 'eval/pass@<k>' -> 'eval/pass@'); None for
    a name that is not a family.

    >>> family_prefix("reward/<name>"), family_prefix("eval/pass@<k>"), family_prefix("eval/accuracy")
    ('reward/', 'eval/pass@', None)
    """
    found = FAMILY.search(name)
    return name[: found.start()] if found else None


# what every evaluation records (step 0 and the evaluation steps): the run's accuracy, both rules' and the format's
EVAL_METRICS = ("eval/accuracy", "eval/accuracy_strict", "eval/accuracy_flexible", "eval/format")
# name -> meaning: the metrics of every training step (EVAL_METRICS and ``time/eval`` on evaluation steps)
METRICS: dict[str, str] = {
    m.name: m.meaning for m in METRIC_REGISTRY if not m.name.startswith(RM_PREFIX) and family_prefix(m.name) is None
}
# name -> meaning: the reward model's (re)trainings, on the steps described above
RM_METRICS: dict[str, str] = {m.name: m.meaning for m in METRIC_REGISTRY if m.name.startswith(RM_PREFIX)}
