"""How the engine reports what it does, without knowing where it goes.

The worker implements :class:`Recorder` against the database; tests and benchmarks
use the base class (which records nothing) or :class:`MemoryRecorder`. :data:`METRIC_REGISTRY`
names every metric a step reports, with its meaning and the dashboard chart panel that draws it.
Pure Python: no torch here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
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


@dataclass
class EvalOutput:
    """One output to a held-out question, as the verifier read it under the run's answer_match."""

    completion: str  # decoded text (without padding / end token)
    answer: str | None  # the final answer read (None: none)
    answer_rule: str  # the form that held it: gsm8k, boxed, number or none (rewards.FORM_WORDS)
    correct: bool  # the answer matches the reference
    formatted: bool  # an answer is stated in the strict form ('####' line or \\boxed{}), right or wrong
    tokens: list[str] = field(default_factory=list)  # each token's text in context, then the end token's (if any)


@dataclass
class EvalQuestion:
    """One held-out question at one evaluation: its greedy output and the eval_samples sampled ones."""

    index: int  # its place in the run's held-out split
    question: str
    reference: str
    greedy: EvalOutput
    samples: list[EvalOutput] = field(default_factory=list)  # eval_samples K of them (none: greedy only)

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts (the store's rows, JSON between processes)."""
        return {
            "index": self.index,
            "question": self.question,
            "reference": self.reference,
            "greedy": asdict(self.greedy),
            "samples": [asdict(o) for o in self.samples],
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

    def evaluation(self, step: int, questions: list[EvalQuestion]) -> None:
        """Every held-out question's outputs at the evaluation of ``step`` (0: before training), reported before the
        step's metrics."""

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
        self.eval_log: dict[int, list[EvalQuestion]] = {}

    def start(self, total_steps: int) -> None:
        self.total_steps = total_steps

    def log(self, message: str) -> None:
        self.messages.append(message)

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        self.metrics.append({"step": step, "iteration": iteration, **metrics})

    def groups(self, step: int, groups: list[GroupRecord]) -> None:
        self.group_log[step] = groups

    def evaluation(self, step: int, questions: list[EvalQuestion]) -> None:
        self.eval_log[step] = questions
