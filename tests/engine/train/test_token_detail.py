"""What a step records for diagnosis: each token's log-probs, ratio, KL and clip flag (one typed array per sample
per quantity in the store), and where the step's gradient came from (the groups/* and tokens/* metrics)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from app import store
from app.service import api
from app.store.db import session_scope
from app.store.groups import pack, unpack
from app.web.views.group import group_html
from grpo_engine.algo.objective import LossSettings, grpo_loss, kl_k3
from grpo_engine.report.recorder import GroupRecord, MemoryRecorder, SampleRecord
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.step_report import gradient_sources, repetition_share
from grpo_engine.train.trainer import train
from tests.support.store import new_run

# ---- the objective's per-token view, on hand numbers ------------------------------------------------------------


def test_grpo_loss_gives_each_tokens_ratio_kl_and_clip():
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -0.1]])
    old = torch.tensor([[-1.0, -1.0], [-1.5, -0.1]])
    ref = torch.tensor([[-1.2, -0.5], [-2.0, -0.3]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2)
    _, stats = grpo_loss(logp, old, ref, adv, mask, settings=LossSettings(0.2, 0.04))
    ratio = torch.exp(logp - old)  # 1, e^0.5 = 1.6487 (clipped: A > 0 above 1.2), e^-0.5 = 0.6065 (clipped: A < 0), 1
    assert torch.allclose(stats["token_ratio"], ratio)
    assert stats["token_clipped"].tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert torch.allclose(stats["token_kl"], kl_k3(logp, ref))
    # k3 at log-ratio ref - logp = -0.2: e^-0.2 + 0.2 - 1 = 0.018731
    assert stats["token_kl"][0, 0].item() == pytest.approx(math.exp(-0.2) + 0.2 - 1, abs=1e-6)


# ---- a real run's recorded groups ------------------------------------------------------------------------------


def run_groups(cache_dir, **spec) -> tuple[list[GroupRecord], dict]:
    """The groups and the metrics of step 2 of a short run on the built-in model."""
    recorder = MemoryRecorder()
    train(
        validate_spec({"steps_per_iteration": 2, "batch_size": 4, "group_size": 4, "eval_every": 0, **spec}),
        recorder,
        cache_dir,
        device="cpu",
    )
    return recorder.group_log[2], recorder.metrics[-1]


def test_one_update_records_ratio_one_and_no_clip(grpo_cache_dir):
    groups, metrics = run_groups(grpo_cache_dir)
    for sample in (s for g in groups for s in g.samples):
        n = len(sample.advantages)
        assert [len(getattr(sample, k)) for k in ("logprobs", "ref_logprobs", "ratios", "kls", "clipped")] == [n] * 5
        assert all(r == pytest.approx(1.0, abs=1e-6) for r in sample.ratios)  # mu = 1: pi_theta is pi_old
        assert not any(sample.clipped)
        assert all(lp <= 1e-6 for lp in sample.logprobs) and all(k >= -1e-6 for k in sample.kls)
        # k3 from the recorded log-probs themselves (with mu = 1 the update's log-prob is the sampling one)
        for lp, ref, kl in zip(sample.logprobs, sample.ref_logprobs, sample.kls, strict=True):
            assert kl == pytest.approx(math.exp(ref - lp) - (ref - lp) - 1, abs=1e-4)
        assert sample.truncated == (sample.tokens[-1] != "</s>")
    assert metrics["groups/all_right"] + metrics["groups/all_wrong"] + metrics["groups/mixed"] == 4
    assert metrics["tokens/adv_pos"] + metrics["tokens/adv_neg"] + metrics["tokens/adv_zero"] == pytest.approx(1.0)


def test_two_updates_record_the_ratio_of_the_second_and_no_kl_without_a_reference(grpo_cache_dir):
    groups, _ = run_groups(grpo_cache_dir, policy_updates_per_batch=2, kl_coef=0.0, learning_rate=1e-3)
    samples = [s for g in groups for s in g.samples]
    assert all(s.ref_logprobs is None and s.kls is None for s in samples)
    ratios = [r for s in samples for r in s.ratios]
    assert max(abs(r - 1.0) for r in ratios) > 1e-3  # the second update sees the first one's change


# ---- the metrics of where the gradient came from, on a hand-made batch --------------------------------------


class OneProcess:
    n = 1

    def gather(self, values):
        return list(values)

    def sum(self, values):
        return list(values)


def test_gradient_sources_count_groups_and_token_signs():
    G = 2
    correct = [1, 1, 0, 0, 1, 0, 0, 0]  # groups: all right, all wrong, mixed, all wrong
    scored = SimpleNamespace(
        components=[{"correct": float(c)} for c in correct],
        group_rewards=[[1, 1], [0, 0], [1, 0], [0.5, 0.2]],  # the last: wrong but rewards differ
        advantages=torch.tensor([[0.0, 0.0]] * 4 + [[1.0, 1.0], [-1.0, 0.0]] + [[1.0, 0.0], [-1.0, 0.0]]),
    )
    sampled = SimpleNamespace(mask=torch.tensor([[1.0, 1.0]] * 5 + [[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]))
    got = gradient_sources(OneProcess(), sampled, scored, G)
    assert (got["groups/all_right"], got["groups/all_wrong"], got["groups/mixed"], got["groups/zero_spread"]) == (
        1.0,
        2.0,
        1.0,
        2.0,
    )
    # 14 real tokens: positive 3 (both of sample 5, the first of sample 7), negative 2 (the first of samples 6
    # and 8), zero 9 (the 8 of the first two groups, the second of sample 7)
    assert (got["tokens/adv_pos"], got["tokens/adv_neg"]) == (pytest.approx(3 / 14), pytest.approx(2 / 14))
    assert got["tokens/adv_zero"] == pytest.approx(9 / 14)


def test_repetition_share():
    assert repetition_share("a b a b a b") == 0.5 and repetition_share("one two") == 0.0


# ---- the store: typed arrays, the columns a search reads, on SQLite and PostgreSQL -------------------------------


def test_pack_is_float32_little_endian():
    assert pack([1.0]) == b"\x00\x00\x80\x3f" and pack([True, False], "B") == b"\x01\x00"
    assert unpack(pack([0.1])) == [0.1] and unpack(None) is None and unpack(pack([1, 0], "B"), "B") == [True, False]


def test_recorded_token_arrays_and_columns_read_back(db_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", db_url)
    run_id = new_run(db_url)
    sample = SampleRecord(
        completion="3 #### 4",
        tokens=["3", " ####", " 4", "</s>"],
        reward=1.0,
        advantages=[0.5, 0.5, 0.5, 0.5],
        reward_components={"correct": 1.0, "formatted": 1.0},
        truncated=False,
        logprobs=[-0.1, -2.25, -0.5, -0.01],
        ref_logprobs=[-0.2, -2.0, -0.5, 0.0],
        ratios=[1.0, 1.3, 0.7, 1.0],
        kls=[0.005, 0.03, 0.0, 0.0],
        clipped=[False, True, True, False],
    )
    cut = SampleRecord(
        completion="3 3 3",
        tokens=["3", " 3", " 3"],
        reward=0.0,
        advantages=[-0.5] * 3,
        reward_components={"correct": 0.0, "formatted": 0.0},
        truncated=True,
    )
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [GroupRecord("2+2", "4", [sample, cut]).to_dict()])
        group_id = store.list_groups(s, run_id, 1)[0]["group_id"]
    got = api.get_group(group_id)
    first, second = got["samples"]
    assert first["logprobs"] == [-0.1, -2.25, -0.5, -0.01] and first["ratios"] == [1.0, 1.3, 0.7, 1.0]
    assert first["kls"] == [0.005, 0.03, 0.0, 0.0] and first["clipped"] == [False, True, True, False]
    assert (first["length"], first["correct"], first["answer_found"], first["truncated"]) == (4, True, True, False)
    assert (second["length"], second["correct"], second["answer_found"], second["truncated"]) == (3, False, False, True)
    assert second["logprobs"] is None and second["clipped"] is None
    assert got["kind"] == "mixed" and got["rm_version"] is None
    view = group_html(got, "kl")
    assert "KL 0.0300" in view and "clipped" in view and "ratio 1.300" in view and "tint-kl" in view
    assert "log π_ref -2.0000" in group_html(got)
