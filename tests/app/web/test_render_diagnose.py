"""The diagnosis renderers (app.web.views.diagnose, app.web.views.question_history) on hand-made metric rows, search
results and question histories: the gradient chart's bars and their data attributes, the binning of many steps, the
zero-spread line only where it tells something, the token shares; the results table and pager; the question's
history, user text escaped; and what each shows with nothing recorded."""

from __future__ import annotations

import re

from app.web.views.diagnose import (
    MAX_BARS,
    bin_rows,
    gradient_chart_html,
    mark_sample,
    pager_text,
    samples_frame,
    verdict_text,
)
from app.web.views.question_history import question_history_html, share_line_svg


def _row(step: int, right: int, wrong: int, mixed: int, zero: int | None = None, **more) -> dict:
    """One metric row with its group counts (zero spread: right + wrong unless given)."""
    return {
        "step": step,
        "iteration": 1,
        "groups/all_right": float(right),
        "groups/all_wrong": float(wrong),
        "groups/mixed": float(mixed),
        "groups/zero_spread": float(right + wrong if zero is None else zero),
        "reward_mean": 0.5,
        **more,
    }


def _segments(page: str) -> list[dict]:
    """The bar segments and markers of a chart: their data attributes."""
    return [
        dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag))
        for tag in re.findall(r"<(?:rect|circle) [^>]*data-kind[^>]*>", page)
    ]


def test_each_step_gets_one_stacked_bar_of_its_group_kinds():
    page = gradient_chart_html([_row(1, 2, 1, 5), _row(2, 0, 3, 5, tokens_adv=None)])
    assert "Where the gradient comes from" in page
    assert 'data-bars="2"' in page and 'data-zero-line="0"' in page
    segs = _segments(page)
    assert {(s["step"], s["step-end"], s["kind"]) for s in segs} == {
        ("1", "1", "mixed"),
        ("1", "1", "all_right"),
        ("1", "1", "all_wrong"),
        ("2", "2", "mixed"),
        ("2", "2", "all_wrong"),
    }  # a kind with no group at a step has no segment
    assert "<title>step 1: 5 of 8 groups mixed: some outputs right, some wrong</title>" in page
    assert "step</text>" in page and ">groups</text>" in page  # both axes named
    assert "zero_spread" not in page  # binary rewards: zero spread is all right + all wrong, no line


def test_segment_heights_are_proportional_to_their_counts():
    page = gradient_chart_html([_row(1, 2, 0, 6)])
    heights = {kind: float(h) for kind, h in re.findall(r'data-kind="(\w+)"[^>]*height="([\d.]+)"', page)}
    assert abs(heights["mixed"] / heights["all_right"] - 3) < 1e-6


def test_two_thousand_steps_are_binned_into_at_most_two_hundred_bars_that_name_their_ranges():
    rows = [_row(s, s % 3, 1, 4) for s in range(1, 2001)]
    page = gradient_chart_html(rows)
    assert int(re.search(r'data-bars="(\d+)"', page).group(1)) <= MAX_BARS
    mixed = [s for s in _segments(page) if s["kind"] == "mixed"]
    assert len(mixed) <= MAX_BARS
    assert (mixed[0]["step"], mixed[0]["step-end"]) == ("1", "10")
    assert (mixed[-1]["step"], mixed[-1]["step-end"]) == ("1991", "2000")
    assert "steps 1–10 (mean): " in page and "Each bar stands for 10 steps" in page
    assert len(page) < 130_000  # small enough to redraw on every new step


def test_a_bin_holds_the_mean_of_its_steps():
    bins = bin_rows([_row(s, 0, 0, s) for s in range(1, 8)], max_bars=3)
    assert [(b["step"], b["step_end"], b["mixed"]) for b in bins] == [(1, 3, 2.0), (4, 6, 5.0), (7, 7, 7.0)]


def test_the_zero_spread_line_shows_only_where_it_differs_from_all_right_plus_all_wrong():
    same = gradient_chart_html([_row(1, 1, 1, 2), _row(2, 2, 0, 2)])
    assert 'data-kind="zero_spread"' not in same and "zero reward spread" not in same
    differs = gradient_chart_html([_row(1, 1, 1, 2), _row(2, 0, 0, 4, zero=1)])  # continuous rewards
    assert 'data-zero-line="1"' in differs and "<polyline" in differs
    markers = [s for s in _segments(differs) if s["kind"] == "zero_spread"]
    assert [(m["step"], m["step-end"]) for m in markers] == [("1", "1"), ("2", "2")]
    assert "zero reward spread (all rewards equal: no gradient)" in differs  # in the legend
    assert "all right (no gradient)" in same and "all right (no gradient)" not in differs  # verdicts say less


def test_the_latest_token_shares_show_under_the_bars():
    rows = [
        _row(1, 0, 0, 2, **{"tokens/adv_pos": 0.1, "tokens/adv_neg": 0.1, "tokens/adv_zero": 0.8}),
        _row(2, 0, 0, 2, **{"tokens/adv_pos": 0.4, "tokens/adv_neg": 0.35, "tokens/adv_zero": 0.25}),
        _row(3, 0, 0, 2),
    ]  # a later step without token shares: the latest with them is shown
    page = gradient_chart_html(rows)
    assert '<div class="token-shares" data-step="2">' in page
    assert "40% pushed up (A &gt; 0)" in page and "35% pushed down (A &lt; 0)" in page
    assert "25% zero advantage" in page and 'style="width:40.00%"' in page


def test_nothing_recorded_says_so():
    for rows in ([], [{"step": 1, "iteration": 1, "reward_mean": 0.5}]):  # none, or a run from before the counts
        page = gradient_chart_html(rows)
        assert "gradient-chart empty" in page and "No group counts recorded yet" in page and "<svg" not in page


RESULT = {
    "run_id": 1,
    "total": 51,
    "page": 1,
    "page_size": 50,
    "pages": 2,
    "rows": [
        {
            "sample_id": 7,
            "group_id": 3,
            "step": 2,
            "question": "What is\n12 + 30?",
            "completion": "line one\nline <two> " + "x" * 200,
            "reward": 0.123456,
            "correct": False,
            "answer_found": False,
            "truncated": True,
            "length": 64,
            "spread": 0.5,
            "kind": "mixed",
        }
    ],
}


def test_found_samples_are_one_row_each_with_their_verdict_in_a_word():
    frame = samples_frame(RESULT)
    assert list(frame.columns) == [
        "step",
        "group",
        "sample",
        "reward",
        "verdict",
        "answer read",
        "reward components",
        "length",
        "spread",
        "question",
        "completion",
    ]
    row = frame.iloc[0]
    assert (row["step"], row["group"], row["sample"], row["reward"]) == (2, 3, 7, 0.1235)
    assert row["verdict"] == "no answer · cut" and row["question"] == "What is 12 + 30?"
    assert (row["answer read"], row["reward components"]) == ("not recorded", "")  # recorded without them
    assert row["completion"].startswith("line one line <two> x") and row["completion"].endswith("…")
    assert samples_frame(None).empty
    assert [
        verdict_text(r)
        for r in (
            {"correct": True, "answer_found": True},
            {"correct": False, "answer_found": True},
            {"correct": True, "truncated": True},
        )
    ] == ["✓", "✗", "✓ · cut"]


def test_a_found_sample_shows_the_answer_the_verifier_read_and_its_components():
    """The issue's output read under 'flexible' by its last number, paid no format reward; a stated wrong answer;
    none read; a long answer cut."""
    rows = [
        ("3", "number", True, True, {"correct": 1.0, "formatted": 0.0, "format": 0.0}),
        ("4", "gsm8k", False, True, {"correct": 0.0, "formatted": 1.0, "format": 0.1}),
        (None, "none", False, False, {"correct": 0.0, "formatted": 0.0}),
        ("\\frac{" + "1" * 60 + "}{2}", "boxed", False, True, {"correct": 0.0, "formatted": 1.0}),
    ]
    result = {
        **RESULT,
        "rows": [
            {
                **RESULT["rows"][0],
                "truncated": False,
                "answer": answer,
                "answer_rule": rule,
                "correct": correct,
                "answer_found": found,
                "reward_components": components,
            }
            for answer, rule, correct, found, components in rows
        ],
    }
    frame = samples_frame(result)
    assert list(frame["verdict"]) == ["✓", "✗", "no answer", "✗"]
    assert list(frame["answer read"])[:3] == ["3 (flexible last number)", "4 (strict ####)", "none read"]
    assert frame["answer read"].iloc[3] == "\\frac{" + "1" * 34 + "… (strict \\boxed{})"
    assert [c.replace("\xa0", " ") for c in frame["reward components"][:2]] == [
        "correct 1 · formatted 0 · format 0",
        "correct 0 · formatted 1 · format 0.1",
    ]


def test_the_pager_says_where_it_is_or_why_the_search_was_refused():
    assert "page 1 of 2 (51 samples found)" in pager_text(RESULT)
    refused = pager_text(None, "reward_min must be a number, got '<x>'")
    assert "run-error" in refused and "&lt;x&gt;" in refused and "<x>" not in refused


def test_the_sample_found_is_marked_in_its_group():
    view = '<div class="sample" data-sample-id="7"></div><div class="sample" data-sample-id="70"></div>'
    marked = mark_sample(view, 7)
    assert marked.count("data-found") == 1 and 'data-sample-id="7" data-found="1"' in marked
    assert mark_sample(view, None) == view


def _group(step: int, share: float, text: str = "4") -> dict:
    return {
        "group_id": 100 + step,
        "step": step,
        "reward_mean": share,
        "reward_std": 0.5,
        "kind": "mixed",
        "correct_share": share,
        "samples": [
            {
                "sample_id": 10 * step,
                "completion": text,
                "reward": 1.0,
                "correct": True,
                "truncated": False,
                "length": 5,
            },
            {
                "sample_id": 10 * step + 1,
                "completion": "5",
                "reward": 0.0,
                "correct": False,
                "truncated": True,
                "length": 9,
            },
        ],
    }


HISTORY = {
    "question": "What is <b>2+2</b>?",
    "question_key": "abc",
    "dataset": "builtin-arith",
    "runs": [
        {
            "run_id": 1,
            "name": "mine <i>",
            "status": "completed",
            "archived": False,
            "groups_total": 3,
            "correct_share_first": 0.0,
            "correct_share_last": 1.0,
            "groups": [_group(1, 0.0), _group(5, 0.5, "<script>alert(1)</script>"), _group(9, 1.0)],
        },
        {
            "run_id": 2,
            "name": "other",
            "status": "failed",
            "archived": True,
            "groups_total": 1,
            "correct_share_first": 0.5,
            "correct_share_last": 0.5,
            "groups": [_group(3, 0.5)],
        },
    ],
}


def test_a_question_through_time_shows_its_share_line_its_outputs_and_the_other_runs():
    page = question_history_html(HISTORY)
    assert "sampled 3 times · right 0% the first time, 100% the last" in page
    assert page.count('class="share-dot"') == 3 and "step 5: 50% right" in page
    steps = re.findall(r'class="hist-group" data-group-id="\d+" data-step="(\d+)"', page)
    assert steps == ["9", "5", "1"]  # latest first
    assert page.count('class="hist-out ok"') == 3 and page.count('class="hist-out bad"') == 3
    assert "9 tok · cut" in page
    assert '<tr data-run-id="2">' in page and "archived" in page


def test_user_text_in_a_history_is_escaped():
    page = question_history_html(HISTORY)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>2+2</b>" not in page and "What is &lt;b&gt;2+2&lt;/b&gt;?" in page
    assert "mine &lt;i&gt;" in page


def test_a_question_seen_once_and_in_no_other_run():
    single = {**HISTORY, "runs": [{**HISTORY["runs"][0], "groups": [_group(4, 0.5)], "groups_total": 1}]}
    page = question_history_html(single)
    assert "sampled 1 time ·" in page and "share-svg" not in page  # one point: no line to draw
    assert "No other run on this dataset sampled this question." in page
    assert share_line_svg([]) == ""
