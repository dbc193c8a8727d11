"""Step labels by rollouts (grpo_engine.rollout.rollout_labels, Math-Shepherd's): the hard and soft estimates on hand-made
continuation verdicts and on a hand-made completer (a language model whose continuations are fixed in advance), the
labels of the built-in policy's own outputs against the exact step checker, and process-supervision runs whose rule
reward, or whose learned PRM's training data, comes from rollouts on the built-in task."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from grpo_engine.data.builtin_task import STEP_DELIMITER
from grpo_engine.data.data import load_dataset
from grpo_engine.model.model import build_tokenizer, load_policy
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rollout.outputs import encode_prompts, judge
from grpo_engine.rollout.rollout_labels import (
    Completer,
    Continuing,
    StepOutputs,
    labels_from_rollouts,
    rollout_shares,
    rollout_verdicts,
)
from grpo_engine.rollout.sampling import CACHE, generate
from grpo_engine.rollout.tokenization import completion_mask, end_token_ids, prompt_formatter


@pytest.mark.parametrize("estimate, expected", [("hard", [1.0, 0.0, 1.0, 0.0]), ("soft", [0.5, 0.0, 1.0, 0.0])])
def test_hard_and_soft_estimates(estimate, expected):
    right = [[True, False, True, False], [False, False, False, False], [True] * 4, []]
    assert labels_from_rollouts(right, estimate) == expected


class ScriptCache:
    """The KV cache of :class:`ScriptedLM`: what each decoded row still has to say."""

    def __init__(self, plans: list[list[int]], right_of: list[int]):
        self.plans, self.right_of = plans, right_of  # per prompt row: (its two scripts), how many repeats are right

    def batch_repeat_interleave(self, n: int) -> None:
        """Repeat k of prompt row b says the right script when k < right_of[b], else the wrong one."""
        self.plans = [self.plans[b][0 if k < self.right_of[b] else 1] for b in range(len(self.plans)) for k in range(n)]
        self.pos = [1] * len(self.plans)

    def batch_select_indices(self, keep: torch.Tensor) -> None:
        self.plans = [self.plans[i] for i in keep.tolist()]
        self.pos = [self.pos[i] for i in keep.tolist()]


class ScriptedLM(torch.nn.Module):
    """A hand-made completer for the built-in tokenizer: after a prompt that holds k newlines (the question's line
    and k - 1 finished steps), ``right[k]`` of every ``n`` continuations say '#### 14' and the others '#### 99'.
    The labels of an output's steps are then known exactly."""

    def __init__(self, tokenizer, right: dict[int, int]):
        super().__init__()
        self.tokenizer, self.right = tokenizer, right
        self.scripts = [
            tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in ("#### 14", "#### 99")
        ]
        assert self.scripts[0][0] == self.scripts[1][0]  # both start alike: the first token comes before the repeat

    def _logits(self, tokens: list[int]) -> torch.Tensor:
        logits = torch.full((len(tokens), 1, len(self.tokenizer)), -1e9)
        logits[torch.arange(len(tokens)), 0, torch.tensor(tokens)] = 0.0
        return logits

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep=0, **cache):
        state = cache.get(CACHE)
        if state is None:  # the prompts' prefill
            texts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
            state = ScriptCache([self.scripts] * len(texts), [self.right[t.count("\n")] for t in texts])
            return CausalLMOutputWithPast(logits=self._logits([self.scripts[0][0]] * len(texts)), **{CACHE: state})
        tokens = [plan[min(p, len(plan) - 1)] for plan, p in zip(state.plans, state.pos, strict=True)]
        state.pos = [p + 1 for p in state.pos]
        return CausalLMOutputWithPast(logits=self._logits(tokens), **{CACHE: state})


def scripted_outputs(tokenizer):
    """Two sampled outputs of '2+3*4' as the policy would hold them: left-padded prompts and completions, each
    output's step ends and text. The first has steps '3*4=12', '2+12=14', '#### 14'; the second '2+3=5', '#### 5'."""
    texts = ["3*4=12\n2+12=14\n#### 14", "2+3=5\n#### 5"]
    rows = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, rows))
    completions = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    prompt = torch.tensor([tokenizer.encode("2+3*4\n", add_special_tokens=False)] * 2)
    newline = tokenizer.convert_tokens_to_ids("\n")
    step_ends = [[i for i, t in enumerate(r) if t == newline] + [len(r) - 2] for r in rows]
    tokens = [tokenizer.batch_decode([[t] for t in r]) for r in rows]
    return prompt, torch.ones_like(prompt), completions, step_ends, texts, tokens


@pytest.mark.parametrize(
    "estimate, expected", [("hard", [[1.0, 0.0, 1.0], [1.0, 0.0]]), ("soft", [[0.75, 0.0, 1.0], [0.75, 0.0]])]
)
def test_hard_and_soft_estimates_on_a_hand_made_completer(estimate, expected):
    tokenizer = build_tokenizer()
    right = {2: 3, 3: 0}  # after the question and one step, 3 of 4 continuations reach 14; after two steps, none
    prompt, attn, completions, step_ends, texts, tokens = scripted_outputs(tokenizer)
    how = Continuing(n=4, max_new_tokens=12, temperature=1.0, top_p=1.0, end_ids=[tokenizer.eos_token_id])
    outputs = StepOutputs(
        prompt_ids=prompt,
        prompt_attn=attn,
        completions=completions,
        step_ends=step_ends,
        texts=texts,
        answers=["14", "14"],
        questions=["2+3*4"] * 2,
        tokens=tokens,
    )
    # the second output's wrong first step '2+3=5' gets 3 right continuations of 4 too: the completer recovers from
    # the slip, which hard estimation then calls right; its last step is the output's own (wrong) answer
    assert rollout_shares(ScriptedLM(tokenizer, right), tokenizer, outputs, how) == [[0.75, 0.0, 1.0], [0.75, 0.0]]
    assert rollout_verdicts(ScriptedLM(tokenizer, right), tokenizer, outputs, how, estimate) == expected
    # the same through a Completer: it reads the question with its own template and the output so far as text
    completer = Completer(ScriptedLM(tokenizer, right), tokenizer, lambda q: f"{q}\n", [tokenizer.eos_token_id])
    assert rollout_verdicts(None, None, outputs, how, estimate, completer=completer) == expected


class ProseLM(ScriptedLM):
    """ScriptedLM whose continuations state their number without '####': '= 14' (the right one) or '= 99'."""

    def __init__(self, tokenizer, right: dict[int, int]):
        super().__init__(tokenizer, right)
        self.scripts = [
            tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in ("= 14", "= 99")
        ]


@pytest.mark.parametrize(
    "match, expected", [("strict", [[0.0, 0.0, 1.0], [0.0, 0.0]]), ("flexible", [[0.75, 0.0, 1.0], [0.75, 0.0]])]
)
def test_continuations_reach_the_answer_as_the_runs_answer_match_reads_it(match, expected):
    tokenizer = build_tokenizer()
    prompt, attn, completions, step_ends, texts, _ = scripted_outputs(tokenizer)
    how = Continuing(n=4, max_new_tokens=12, temperature=1.0, top_p=1.0, end_ids=[tokenizer.eos_token_id], match=match)
    # 3 of 4 continuations after the first step end '= 14': the last number is the answer, stated without '####';
    # the last steps are the outputs' own '#### 14' (right) and '#### 5' (wrong) under both rules
    outputs = StepOutputs(
        prompt_ids=prompt,
        prompt_attn=attn,
        completions=completions,
        step_ends=step_ends,
        texts=texts,
        answers=["14", "14"],
    )
    shares = rollout_shares(ProseLM(tokenizer, {2: 3, 3: 0}), tokenizer, outputs, how)
    assert shares == expected


def labelled_steps(cache_dir, questions: int, n: int, estimate: str, seed: int = 0):
    """(rollout labels, exact labels) of the steps of one fresh output per built-in question: the measurement of
    bench/rollout_labels.py, small."""
    torch.manual_seed(seed)
    policy, tokenizer = load_policy("builtin-arith", cache_dir, torch.device("cpu"), log=lambda m: None)
    policy.eval()
    rows = load_dataset("builtin-arith")[0][:questions]
    prompts = encode_prompts(tokenizer, [r["question"] for r in rows], "cpu", prompt_formatter(tokenizer, "auto"))
    end_ids = end_token_ids(policy, tokenizer)
    with torch.no_grad():
        completions = generate(policy, tokenizer, prompts, repeat=1, greedy=False, max_new_tokens=32, end_ids=end_ids)
    mask, ended = completion_mask(completions, end_ids)
    judged = judge(tokenizer, completions, mask, ended, rows, process=True, delimiter=STEP_DELIMITER, checker="builtin")
    outputs = StepOutputs.judged(prompts["input_ids"], prompts["attention_mask"], completions, judged, rows)
    how = Continuing(n, max_new_tokens=32, temperature=1.0, top_p=1.0, end_ids=end_ids)
    return rollout_verdicts(policy, tokenizer, outputs, how, estimate), judged.verdicts


def test_rollout_labels_of_the_builtin_policy_agree_with_the_exact_checker(grpo_cache_dir):
    rollouts, exact = labelled_steps(grpo_cache_dir, questions=48, n=4, estimate="hard")
    assert [len(r) for r in rollouts] == [len(e) for e in exact]  # one label per step
    pairs = [(r, e) for rs, es in zip(rollouts, exact, strict=True) for r, e in zip(rs, es, strict=True)]
    assert {r for r, _ in pairs} <= {0.0, 1.0}
    assert all(
        rs[-1] == es[-1] for rs, es in zip(rollouts, exact, strict=True) if rs
    )  # the last step: the output's own verdict
    assert sum(r == e for r, e in pairs) / len(pairs) >= 0.85  # bench/rollout_labels.py: 0.957 on 256 outputs
    soft, _ = labelled_steps(grpo_cache_dir, questions=16, n=4, estimate="soft")
    assert {r for rs in soft for r in rs} <= {0.0, 0.25, 0.5, 0.75, 1.0}


@pytest.mark.slow
@pytest.mark.parametrize("completer", ["", "builtin"])
def test_a_process_run_rewarded_by_rollout_labels(grpo_cache_dir, completer):
    from grpo_engine.model.model import builtin_model_dir
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.train.trainer import train

    recorder = MemoryRecorder()
    spec = validate_spec(
        dict(
            supervision="process",
            step_labels="rollouts",
            label_rollouts=2,
            steps_per_iteration=2,
            batch_size=2,
            group_size=4,
            eval_every=0,
            max_new_tokens=24,
            label_estimate="soft",
            label_completer=str(builtin_model_dir(grpo_cache_dir)) if completer else "",
        )
    )
    assert train(spec, recorder, grpo_cache_dir, device="cpu").status == "completed"
    assert any("label_completer" in m and "frozen" in m for m in recorder.messages) == bool(completer)
    steps = {m["step"]: m for m in recorder.metrics}
    assert steps[2]["time/labelling"] > 0
    for groups in recorder.group_log.values():
        for group in groups:
            for sample in group.samples:
                assert len(sample.step_rewards) == len(sample.step_end_indices) == len(sample.step_shares)
                assert set(sample.step_rewards) <= {0.0, 0.5, 1.0}  # soft: the share of 2 continuations
                assert sample.step_labels == sample.step_rewards == sample.step_shares


@pytest.mark.slow
def test_a_prm_learns_from_rollout_labels_of_the_policys_samples(grpo_cache_dir):
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.train.trainer import train

    recorder = MemoryRecorder()
    spec = validate_spec(
        dict(
            supervision="process",
            reward="model",
            step_labels="rollouts",
            label_rollouts=2,
            iterations=2,
            steps_per_iteration=1,
            batch_size=2,
            group_size=4,
            eval_every=0,
            max_new_tokens=24,
            rm_samples=16,
        )
    )
    assert train(spec, recorder, grpo_cache_dir, device="cpu").status == "completed"
    assert any(
        "trained on 16 outputs of the initial policy labelled by rollouts, N=2, hard estimate" in m
        for m in recorder.messages
    )
    assert any(
        "refreshed on 18 examples (the policy's samples labelled by rollouts, N=2, hard estimate" in m
        for m in recorder.messages
    )
    for groups in recorder.group_log.values():  # the PRM scores the steps; rollouts label only its training data
        for sample in (s for g in groups for s in g.samples):
            assert sample.step_labels is None and sample.step_shares is None and sample.step_rewards is not None
