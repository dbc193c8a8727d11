"""How the engine reports what it does, without knowing where it goes.

The worker implements :class:`Recorder` against the database; tests and benchmarks
use the base class (which records nothing) or :class:`MemoryRecorder`. :data:`METRIC_REGISTRY`
names every metric a step reports, with its meaning and the dashboard chart panel that draws it.
Pure Python: no torch here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any


class TrainStatus(StrEnum):
    """How a run's training ended, as the engine and its callers say it: ``train``'s result (completed, cancelled,
    paused), a data-parallel launch's (failed: its processes failed) or a worker's that lost the run (stopped), and
    what the trackers are told (completed, failed, stopped). Strings, as they travel in JSON between processes. The
    store's statuses are app.core.run_status.RunStatus; a paused or stopped run is not finished there."""

    COMPLETED = "completed"  # every step trained, the final policy saved
    CANCELLED = "cancelled"  # the recorder said stop at a step boundary (or while loading)
    PAUSED = "paused"  # the recorder said pause: a checkpoint was saved first, the run resumes from it
    FAILED = "failed"  # a data-parallel run's processes failed; to a tracker: the run failed
    STOPPED = "stopped"  # the worker lost the run's lease; to a tracker: cancelled, paused or taken over


@dataclass(frozen=True)
class TrainResult:
    """How a run's training ended: what ``train`` returns, and what a data-parallel launch reads back from its main
    process (``to_json``/``from_json``: it travels between processes as JSON)."""

    status: TrainStatus
    step: int | None = None  # the last step trained; a paused run's, the step its checkpoint holds; None if unknown
    metrics: dict[str, float] = field(default_factory=dict)  # the last step's metrics (completed, cancelled, paused)
    stop_reason: str | None = None  # a data-parallel run: why its main process's recorder stopped it ("cancel", ...)
    error: str | None = None  # failed: one line, the reason
    log: str | None = None  # failed: the traceback or the end of the processes' output

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> TrainResult:
        values = json.loads(text)
        return cls(**{**values, "status": TrainStatus(values["status"])})


@dataclass
class SampleRecord:
    """One of the G outputs of a group, as stored and shown."""

    completion: str  # decoded completion text (without padding / EOS)
    tokens: list[
        str
    ]  # each completion token's text in context (they spell the completion), then the end token; as many as advantages
    reward: float  # reward r_i (outcome) or the mean of the step rewards (process)
    advantages: list[float]  # A_hat[i, t], one per token of the completion
    step_rewards: list[float] | None = None  # process supervision: one reward per step
    step_end_indices: list[int] | None = None  # 0-based token index where each step ends
    reward_components: dict[str, float] = field(default_factory=dict)  # e.g. {"correct": 1.0}
    step_labels: list[float] | None = None  # process: the rules' label of each step (None when not labelled)
    step_shares: list[float] | None = (
        None  # step_labels 'rollouts': the share of each step's continuations that reached the answer
    )
    truncated: bool | None = None  # cut at max_new_tokens without an end token
    # per token, as many as advantages (None when not measured): log pi_old (the policy at sampling), log pi_ref
    # (None with kl_coef 0), the ratio pi_theta / pi_old and the k3 KL at the last update, and whether the clip
    # bound it there
    logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    ratios: list[float] | None = None
    kls: list[float] | None = None
    clipped: list[bool] | None = None
    # the verifier's reading under the run's answer_match (rewards.final_answer): the final answer it read (None:
    # none) and the form that held it, gsm8k, boxed, number or none (rewards.FORM_WORDS); None when not recorded
    answer: str | None = None
    answer_rule: str | None = None


@dataclass
class GroupRecord:
    """The G outputs sampled for one question at one step."""

    prompt: str  # the question
    reference: str  # the reference answer
    samples: list[SampleRecord]
    model_prompt: str = ""  # the prompt text as the model saw it (after the run's prompt_template)

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, sharing the samples' lists (no deep copy: recording runs every step)."""
        return {
            "prompt": self.prompt,
            "reference": self.reference,
            "model_prompt": self.model_prompt,
            "samples": [{f.name: getattr(s, f.name) for f in fields(s)} for s in self.samples],
        }


class Recorder:
    """Receives the engine's events. Every method is optional; the defaults do nothing."""

    def start(self, total_steps: int) -> None:
        """Called once the model and data are loaded, before step 1 (or the first step after a resume)."""

    def resume(self, step: int) -> None:
        """Training continues after ``step`` (0: from the start): whatever was reported for later steps
        by an earlier, interrupted attempt is void and is reported again."""

    def flush(self) -> None:
        """Make everything reported so far durable. Called before a checkpoint is saved, so that a run
        resumed from it never misses what was reported up to its step."""

    def checkpoint(self, step: int, path: str) -> None:
        """A checkpoint of the state after ``step`` was saved at ``path``."""

    def log(self, message: str) -> None:
        """A human-readable line about what the engine is doing."""

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """What the run is doing now, in words a user reads, and how far (``done`` of ``total``, in the phase's
        own units; None when it has no count). Reported again with a new ``done`` as the phase advances.

        The phases, in the order a run goes through them: "loading model" (the policy, the reward model, or a
        checkpoint being restored), "building built-in model" (warm-up steps, on first use), "loading dataset",
        "loading reference model" (when it is a copy of its own, i.e. without LoRA), "training reward model"
        (batches of its sampling and training), "training" (steps done of the run's total), "evaluating" and
        "saving" (a checkpoint, or the final policy)."""

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        """Metrics of one finished step (1-based). EVAL_METRICS appear on evaluation steps."""

    def groups(self, step: int, groups: list[GroupRecord]) -> None:
        """Every group sampled at ``step``, with rewards and per-token advantages."""

    def should_stop(self) -> bool | str:
        """Polled at each step boundary. False goes on; a truthy value ends the run early:
        ``"pause"`` after saving a checkpoint (the run will resume), anything else (``True``,
        ``"cancel"``) at once."""
        return False


class StopRequested(Exception):
    """Raised from inside long work (the reward model's sampling, labelling and training) when the recorder asked
    the run to stop (``reason``: what ``should_stop`` returned); ``train`` then ends the run."""

    def __init__(self, reason: bool | str):
        super().__init__(f"stop requested: {reason}")
        self.reason = reason


def stop_check(should_stop: Callable[[], bool | str]) -> Callable[[], None]:
    """A check to call between batches of long work: raises StopRequested once ``should_stop()`` is truthy."""

    def check() -> None:
        reason = should_stop()
        if reason:
            raise StopRequested(reason)

    return check


def no_check() -> None:
    """The check of work that is never stopped half-way."""


class MemoryRecorder(Recorder):
    """Keeps everything in lists (tests, benchmarks, the engine used as a library)."""

    def __init__(self) -> None:
        self.total_steps = 0
        self.messages: list[str] = []
        self.metrics: list[dict[str, float]] = []
        self.group_log: dict[int, list[GroupRecord]] = {}

    def start(self, total_steps: int) -> None:
        self.total_steps = total_steps

    def log(self, message: str) -> None:
        self.messages.append(message)

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        self.metrics.append({"step": step, "iteration": iteration, **metrics})

    def groups(self, step: int, groups: list[GroupRecord]) -> None:
        self.group_log[step] = groups


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
