"""The Run tab's header and buttons and the Groups tab's words, on hand-made run dicts, metric rows and groups:
the run's phase with its own bar, the latest key numbers, which buttons apply, the name "Launch again"
proposes, the reward components in words, the warning over groups without reward spread."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from app.web.tabs.run import _button_states, next_name
from app.web.views.group import group_html, token_span, zero_spread_banner
from app.web.views.run import progress_html

NOW = datetime(2025, 1, 1, 0, 1, 40, tzinfo=timezone.utc)
RUNNING = {
    "run_id": 3,
    "name": "r",
    "status": "running",
    "step": 0,
    "total_steps": 40,
    "error": None,
    "config": {},
    "started_at": "2025-01-01T00:00:00+00:00",
    "finished_at": None,
    "phase": None,
    "phase_done": None,
    "phase_total": None,
}


def test_a_phase_with_a_count_has_its_own_bar_and_promises_no_eta():
    page = progress_html({**RUNNING, "phase": "building built-in model", "phase_done": 400, "phase_total": 900}, NOW)
    assert 'data-phase="building built-in model"' in page
    assert '<span class="phase">building built-in model 400 / 900<span class="phase-track">' in page
    assert 'class="phase-fill" style="width:44.4%"' in page
    assert "ETA" not in page and "elapsed 1m 40s" in page


def test_a_phase_without_a_count_is_named_alone():
    page = progress_html({**RUNNING, "phase": "loading dataset"}, NOW)
    assert '<span class="phase">loading dataset</span>' in page and "phase-track" not in page
    assert "ETA" not in page


def test_training_names_the_phase_and_the_main_bar_counts_the_steps():
    first = progress_html({**RUNNING, "phase": "training", "phase_done": 0, "phase_total": 40}, NOW)
    assert '<span class="phase">training</span>' in first and "ETA: estimating" in first
    later = progress_html({**RUNNING, "step": 10, "phase": "evaluating", "phase_done": 1, "phase_total": 4}, NOW)
    assert "evaluating 1 / 4" in later and "ETA 5m 00s" in later  # the ETA stands once steps are done


def test_the_eta_counts_the_recorded_steps_time_not_the_models_build():
    """30 of 60 steps done 10 minutes after the start, of which the built-in model's build took 8: the steps took
    2.5 s each (4 s with the evaluation of every tenth step), so 30 more take 75 + 3 x 1.5 s."""
    rows = [{"step": s, "time/step": 2.5, **({"time/eval": 1.5} if s % 10 == 0 else {})} for s in range(1, 31)]
    started = "2025-01-01T00:00:00+00:00"
    page = progress_html(
        {**RUNNING, "step": 30, "total_steps": 60, "phase": "training", "started_at": started},
        datetime(2025, 1, 1, 0, 10, tzinfo=timezone.utc),
        metrics=rows,
    )
    assert "elapsed 10m 00s" in page and "ETA 1m 20s" in page  # 79.5 s; elapsed / step would say 10m 00s


def test_only_a_running_run_shows_a_phase():
    queued = progress_html({**RUNNING, "status": "queued", "started_at": None, "phase": "loading model"}, NOW)
    assert "waiting for a worker" in queued and 'class="phase"' not in queued
    done = progress_html(
        {**RUNNING, "status": "completed", "step": 40, "phase": "saving", "finished_at": "2025-01-01T00:01:00+00:00"},
        NOW,
    )
    assert 'class="phase"' not in done and "ran 1m 00s" in done


def test_the_header_shows_the_latest_key_numbers_in_one_line():
    metrics = [
        {"step": 0, "iteration": 0, "eval/accuracy": 0.25},
        {"step": 1, "iteration": 1, "reward_mean": 0.5, "correct_frac": 0.5, "kl": 0.0012},
        {"step": 2, "iteration": 1, "reward_mean": 0.625, "correct_frac": 0.625, "kl": 0.00311},
    ]
    page = progress_html({**RUNNING, "step": 2}, NOW, metrics)
    line = page.split('<div class="key-numbers">', 1)[1].split("</div>", 1)[0]
    assert line.startswith("latest, step 2: ")
    assert '<span data-key="reward_mean">reward_mean <b>0.625</b></span>' in line
    assert '<span data-key="kl">kl <b>0.00311</b></span>' in line
    assert 'eval/accuracy (strict) <b>0.25</b> <span class="at">(step 0)</span>' in line  # older; the rule that read it
    assert line.index("reward_mean") < line.index("correct_frac") < line.index("eval/accuracy") < line.index("kl")
    assert "key-numbers" not in progress_html(RUNNING, NOW, [])


@pytest.mark.parametrize(
    "run,cancel,model,adapter,adapter_shown",
    [
        ({"status": "queued", "config": {"lora_rank": 0}}, True, False, False, False),
        ({"status": "running", "config": {"lora_rank": 8}}, True, False, False, True),
        ({"status": "running", "cancel_requested": True, "config": {}}, False, False, False, False),
        ({"status": "completed", "config": {"lora_rank": 0}}, False, True, False, False),
        ({"status": "completed", "config": {"lora_rank": 8}}, False, True, True, True),
        ({"status": "cancelled", "config": {"lora_rank": 8}}, False, False, False, True),
        ({"status": "failed", "config": {}}, False, False, False, False),
        ({"status": "completed", "config": {"lora_rank": 0, "steps_per_iteration": 0}}, False, False, False, False),
    ],
)
def test_buttons_apply_by_the_runs_state_and_config(run, cancel, model, adapter, adapter_shown):
    cancel_button, model_button, fp32_button, adapter_button = _button_states(run)
    assert (cancel_button.interactive, model_button.interactive, adapter_button.interactive) == (cancel, model, adapter)
    assert fp32_button.interactive == model  # the trained policy in fp32 beside it, in the dtype the model came in
    assert adapter_button.visible == adapter_shown


def test_launch_again_proposes_a_new_name():
    assert next_name("my run") == "my run (2)"
    assert next_name("my run (2)") == "my run (3)"
    assert next_name("my run (9) (12)") == "my run (9) (13)"
    assert next_name("(2)") == "(2) (2)"


def test_reward_components_in_words_and_the_tooltip():
    samples = [
        {
            "sample_id": i,
            "completion": "x",
            "tokens": ["x"],
            "reward": c,
            "advantages": [c - 0.5],
            "step_rewards": None,
            "step_end_indices": None,
            "reward_components": {"correct": c, "formatted": c, "format": 0.1 * c, "rm_score": 0.25, "len": 3.0},
        }
        for i, c in enumerate([1.0, 0.0])
    ]
    page = group_html({"group_id": 1, "run_id": 1, "step": 1, "prompt": "q", "reference": "1", "samples": samples})
    for words in (
        "correct 1 ✓",
        "correct 0 ✗",
        "formatted 1 (#### or \\boxed stated)",
        "formatted 0 (no #### or \\boxed)",
        "verifier's reading: not recorded",  # recorded without the verifier's reading
        "format reward +0.1",
        "reward model score 0.250",
        ">len 3<",
    ):
        assert words in page, words
    span = token_span("a b", -0.5, 1.0)
    assert 'data-tip="&#x27;a b&#x27;  A = -0.5000"' in span and "title=" not in span


def test_the_banner_warns_when_most_groups_have_no_reward_spread():
    groups = [{"reward_std": s} for s in (0.0, 0.0, 0.5)]
    banner = zero_spread_banner(groups)
    assert 'data-flat="2" data-groups="3"' in banner and "carry no gradient" in banner
    assert "group_size" in banner and "temperature" in banner
    cause = zero_spread_banner(groups, "Most are all wrong, and only 0% of the outputs state a final answer.")
    assert "only 0% of the outputs state a final answer" in cause and "temperature" not in cause
    assert zero_spread_banner([{"reward_std": 0.0}, {"reward_std": 0.1}]) == ""  # half is not most
    assert zero_spread_banner([]) == ""


def test_the_prompt_is_shown_as_the_model_saw_it():
    sample = {
        "sample_id": 1,
        "completion": "x",
        "tokens": ["x"],
        "reward": 1.0,
        "advantages": [0.0],
        "step_rewards": None,
        "step_end_indices": None,
        "reward_components": {},
    }
    group = {
        "group_id": 1,
        "run_id": 1,
        "step": 1,
        "prompt": "What is 2+2?",
        "reference": "4",
        "samples": [sample],
        "model_prompt": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    }
    page = group_html(group)
    assert "Prompt as the model saw it" in page and "&lt;|im_start|&gt;user" in page
    assert "the question alone" in page
    for seen in (None, "What is 2+2?\n"):  # recorded without it; the plain template's line break only
        plain = group_html({**group, "model_prompt": seen})
        assert "Prompt as the model saw it" not in plain and "What is 2+2?" in plain


def test_step_marks_give_the_reward_its_source_and_the_normalised_value():
    def sample(i, rewards):  # the advantages the engine gives: each token, the normalised rewards of its step onwards
        first, second = [(r - 0.75) / 0.4330127 for r in rewards]
        return {
            "sample_id": i,
            "completion": "a\nb",
            "tokens": ["a", "\n", "b", "<eos>"],
            "reward": sum(rewards) / 2,
            "advantages": [first + second] * 2 + [second, 0.0],
            "step_rewards": rewards,
            "step_end_indices": [1, 2],
            "reward_components": {},
        }

    group = {
        "group_id": 1,
        "run_id": 1,
        "step": 1,
        "prompt": "q",
        "reference": "1",
        "samples": [sample(1, [1.0, 1.0]), sample(2, [0.0, 1.0])],
        "step_labels": "rollouts, N=4, hard estimate",
    }
    page = group_html(group)  # R = {1, 1, 0, 1}: mean 0.75, std 0.4330 (GRPO_SPEC's worked example)
    assert "step rewards at each step end (from rollouts, N=4, hard estimate)" in page
    assert 'data-tip="step 1: reward +1.000 from rollouts, N=4, hard estimate; normalised +0.577"' in page
    assert 'data-tip="step 1: reward +0.000 from rollouts, N=4, hard estimate; normalised -1.732"' in page


def test_each_card_shows_the_verifiers_reading():
    """The issue's two outputs under 'flexible': each card says the answer the verifier read and the rule that read
    it, a stated answer its strict rule, none read says so; the answer is escaped and a long one cut on the card."""
    readings = [("3", "number"), ("3", "gsm8k"), (None, "none"), ("<b>" + "9" * 100, "boxed")]
    samples = [
        {
            "sample_id": i,
            "tokens": ["x"],
            "reward": 1.0,
            "advantages": [0.0],
            "answer": answer,
            "answer_rule": rule,
            "reward_components": {"correct": 1.0, "formatted": float(rule != "number"), "format": 0.0},
        }
        for i, (answer, rule) in enumerate(readings)
    ]
    page = group_html({"group_id": 1, "run_id": 1, "step": 1, "prompt": "q", "reference": "3", "samples": samples})
    cards = page.split('<div class="sample" ')[1:]
    assert 'verifier read <code class="answer" title="3">3</code> · by flexible last number' in cards[0]
    assert "formatted 0 (no #### or \\boxed)" in cards[0] and "format reward +0" in cards[0]
    assert ">3</code> · by strict ####" in cards[1]
    assert "verifier read no final answer (rule: none)" in cards[2]
    assert "&lt;b&gt;" + "9" * 77 + "…</code> · by strict \\boxed{}" in cards[3] and "<b>9" not in cards[3]


def test_an_evaluation_only_run_says_so_and_fills_its_bar_when_done():
    from app.web.views.runs import runs_table_html

    run = {
        **RUNNING,
        "status": "completed",
        "total_steps": 0,
        "config": {"steps_per_iteration": 0},
        "finished_at": "2025-01-01T00:01:00+00:00",
    }
    page = progress_html(run, NOW, [])
    assert "evaluation only (steps_per_iteration 0)" in page and "step 0 / 0" not in page
    assert 'style="width:100.0%"' in page and "ran 1m" in page
    assert 'style="width:0.0%"' in progress_html({**run, "status": "running"}, NOW, [])
    listed = {**run, "model": "builtin-arith", "dataset": "builtin-arith", "created_at": None, "tags": [], "notes": ""}
    assert "eval only" in runs_table_html([listed], [listed], now=NOW)
