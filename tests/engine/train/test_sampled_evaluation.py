"""The sampled evaluation (eval_samples, eval_temperature) in short real runs of the built-in model: pass@k and maj@k
recorded at every evaluation, their relations, and the training left exactly as it is without them (the evaluation
samples from a random stream of its own); the keys' refusals. And evaluation-only runs (steps_per_iteration 0): what
they record, load and save, and what their spec refuses."""

from __future__ import annotations

import pytest

from grpo_engine.report.metrics import EVAL_METRICS
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rewards.sampled_eval import ks_up_to
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.train.evaluation import eval_summary
from grpo_engine.train.trainer import train

BASE = dict(steps_per_iteration=2, batch_size=2, group_size=4, eval_every=2, max_new_tokens=16)
K = 3


def run(cache_dir, **overrides) -> MemoryRecorder:
    recorder = MemoryRecorder()
    assert train(validate_spec({**BASE, **overrides}), recorder, cache_dir, device="cpu").status == "completed"
    return recorder


@pytest.fixture(scope="module")
def sampled(grpo_cache_dir):
    return run(grpo_cache_dir, eval_samples=K, eval_temperature=1.0)


def test_every_evaluation_records_pass_and_maj_at_each_k(sampled):
    evaluations = [m for m in sampled.metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evaluations] == [0, 2]
    for m in evaluations:
        assert sorted(k for k in m if k.startswith(("eval/pass@", "eval/maj@"))) == sorted(
            [f"eval/pass@{k}" for k in ks_up_to(K)] + [f"eval/maj@{k}" for k in ks_up_to(K)]
        )
        passes = [m[f"eval/pass@{k}"] for k in ks_up_to(K)]  # [1, 2, 3]
        assert all(0.0 <= v <= 1.0 for v in passes) and passes == sorted(passes)  # more tries never pass less
        assert all(0.0 <= m[f"eval/maj@{k}"] <= m[f"eval/pass@{K}"] for k in ks_up_to(K))  # a vote needs a right one
    assert any(f"pass@{K}" in line for line in sampled.messages)  # the log line carries the widest K


def test_sampled_evaluation_leaves_the_training_as_it_is(sampled, grpo_cache_dir):
    greedy_only = run(grpo_cache_dir)
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith(("eval/pass@", "eval/maj@", "time/"))}  # noqa: E731
    assert [strip(m) for m in sampled.metrics] == [strip(m) for m in greedy_only.metrics]
    assert {s: [g.to_dict() for g in gs] for s, gs in sampled.group_log.items()} == {
        s: [g.to_dict() for g in gs] for s, gs in greedy_only.group_log.items()
    }


def test_the_same_spec_evaluates_the_same(sampled, grpo_cache_dir):
    again = run(grpo_cache_dir, eval_samples=K, eval_temperature=1.0)
    pick = lambda rec: [{k: v for k, v in m.items() if k.startswith("eval/")} for m in rec.metrics]  # noqa: E731
    assert pick(again) == pick(sampled)


def test_the_summary_line_names_the_widest_k():
    metrics = {"eval/accuracy": 0.5, "eval/accuracy_strict": 0.25, "eval/accuracy_flexible": 0.5, "eval/format": 0.5}
    assert eval_summary({**metrics, "eval/pass@1": 0.4, "eval/pass@8": 0.9, "eval/maj@1": 0.4, "eval/maj@8": 0.6}) == (
        "eval/accuracy 0.500 (strict 0.250, flexible 0.500, format 0.500), pass@8 0.900, maj@8 0.600"
    )


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"eval_every": 0, "eval_samples": 4}, "eval_samples: is only used when the run evaluates"),
        ({"eval_temperature": 0.5}, "eval_temperature: is only used with eval_samples > 0"),
        ({"eval_samples": 65}, "eval_samples: must be at most 64"),
        ({"eval_samples": 4, "eval_temperature": 0}, "eval_temperature"),
    ],
)
def test_the_keys_refusals_name_them(spec, words):
    with pytest.raises(SpecError, match=words):
        validate_spec(spec)


class PhaseRecorder(MemoryRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.phases: list[str] = []

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        self.phases.append(name)


def test_an_evaluation_only_run_evaluates_once_and_saves_nothing(grpo_cache_dir, tmp_path):
    recorder = PhaseRecorder()
    spec = validate_spec({"steps_per_iteration": 0, "eval_samples": 2, "max_new_tokens": 16})
    result = train(spec, recorder, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "run")
    assert (result.status, result.step, recorder.total_steps) == ("completed", 0, 0)
    [evaluation] = recorder.metrics
    assert evaluation["step"] == 0 and set(EVAL_METRICS) <= set(evaluation)
    assert {f"eval/pass@{k}" for k in ks_up_to(2)} <= set(evaluation)
    assert {"step": 0, "iteration": 0, **result.metrics} == evaluation
    assert not (tmp_path / "run" / "final").exists()  # nothing trained, nothing saved
    assert any("nothing trained" in line for line in recorder.messages)
    assert "evaluating" in recorder.phases and "training" not in recorder.phases


@pytest.mark.parametrize(
    ("spec", "key", "words"),
    [
        ({"eval_every": 0}, "eval_every", "must be more than 0 when steps_per_iteration is 0"),
        ({"iterations": 2}, "iterations", "must be 1 when steps_per_iteration is 0"),
        ({"reward": "model"}, "reward", "'model' trains a reward model"),
    ],
)
def test_an_evaluation_only_spec_refuses_what_it_cannot_do(spec, key, words):
    with pytest.raises(SpecError, match=words) as refused:
        validate_spec({"steps_per_iteration": 0, **spec})
    assert refused.value.key == key
    assert validate_spec({"steps_per_iteration": 0, "lr_warmup_steps": 0}).total_steps == 0


def test_every_evaluation_reports_each_questions_outputs(sampled):
    """What the store keeps of each evaluation (Recorder.evaluation): every held-out question, in order, with its
    greedy output and K sampled ones, read as the metrics read them."""
    evaluations = [m for m in sampled.metrics if "eval/accuracy" in m]
    assert sorted(sampled.eval_log) == [m["step"] for m in evaluations]
    for m in evaluations:
        questions = sampled.eval_log[m["step"]]
        assert [q.index for q in questions] == list(range(len(questions))) and len(questions) == 200
        assert sum(q.greedy.correct for q in questions) / len(questions) == pytest.approx(m["eval/accuracy"])
        assert sum(q.greedy.formatted for q in questions) / len(questions) == pytest.approx(m["eval/format"])
        assert all(len(q.samples) == K for q in questions)
        right = sum(o.correct for q in questions for o in q.samples) / (K * len(questions))
        assert right == pytest.approx(m["eval/pass@1"])  # pass@1: the share of sampled outputs that are right
        for output in (o for q in questions for o in (q.greedy, *q.samples)):  # each output's tokens spell it
            ended = output.tokens[-1:] == ["</s>"]  # else cut at max_new_tokens
            assert ended or len(output.tokens) == BASE["max_new_tokens"]
            assert "".join(output.tokens).removesuffix("</s>") == output.completion
