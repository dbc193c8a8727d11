"""The Run tab's sampled-evaluation chart in a real browser (Chromium through Playwright), at 1280 x 900 and 1600 x
1000: a run with eval_samples shows Pass@K and Maj@K against K for its first and latest evaluation, picking another
evaluation redraws it; the questions that flipped between the two are listed, folded, unfolding into both outputs side
by side, and filter by flip and by text; an evaluation of another run on the same questions (the baseline of an
evaluation-only run) is picked and compared the same way; a run without a sampled evaluation shows no Pass@K chart, and an
evaluation-only run (steps_per_iteration 0) says so and offers no trained policy.

The server runs without a worker; the runs' metrics are written into its store from this process, the way a worker
writes them, with their questions. Screenshots: test-artifacts/eval-curves-WIDTH.png, eval-flips-WIDTH.png,
eval-runs-1600.png, eval-only-1280.png.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from app import store
from app.store.db import make_engine, session_scope, upgrade_database
from grpo_engine.report.recorder import EvalOutput, EvalQuestion
from grpo_engine.spec.config import validate_spec
from tests.support.servers import ROOT, browser_page, running_server, server_env

KS = (1, 2, 4, 8)
EVALUATIONS = {  # step -> (pass@k, maj@k) for k in KS: Figure 7's shape, Maj@K rising after RL while Pass@K stays
    0: ((0.20, 0.33, 0.48, 0.62), (0.20, 0.20, 0.27, 0.31)),
    4: ((0.31, 0.42, 0.53, 0.63), (0.31, 0.31, 0.40, 0.46)),
    8: ((0.38, 0.47, 0.56, 0.64), (0.38, 0.38, 0.49, 0.55)),
}


QUESTION = "Mia has 7 marbles and buys 5 more. How many marbles does Mia have now?"
RIGHT = EvalOutput("Mia has 7 + 5 = 12 marbles now.\n#### 12", "12", "gsm8k", True, True)
WRONG = EvalOutput("Mia has 7 marbles and buys 5 more, so she has 11 marbles in all now.", "11", "number", False, False)


def _questions(step: int) -> list[dict]:
    """Six held-out questions: the first wrong at step 0 and right at step 8 (gained), the second the other way."""
    gained = {0: WRONG, 4: RIGHT, 8: RIGHT}[step]
    lost = {0: RIGHT, 4: RIGHT, 8: WRONG}[step]
    rows = [
        EvalQuestion(0, QUESTION, "12", gained, [RIGHT, WRONG, RIGHT]),
        EvalQuestion(1, "Omar had 9 cards and gave 4 away. How many are left?", "5", lost, [WRONG, WRONG, RIGHT]),
    ]
    rows += [EvalQuestion(i, f"Question {i}: 2 + {i}?", str(2 + i), RIGHT, [RIGHT] * 3) for i in range(2, 6)]
    return [q.to_dict() for q in rows]  # fmt: skip


def _record(url: str, name: str, spec: dict, sampled: bool, steps: int = 9) -> int:
    with session_scope(url) as s:
        run_id = store.create_run(s, validate_spec({**spec, "name": name}).to_dict(), name)
        for step in range(steps):
            metrics = {"reward_mean": 0.3 + step / 40, "loss": 0.1}
            if step in EVALUATIONS:
                passes, majs = EVALUATIONS[step]
                metrics["eval/accuracy"] = passes[0]
                if sampled:
                    metrics |= {f"eval/pass@{k}": v for k, v in zip(KS, passes, strict=True)}
                    metrics |= {f"eval/maj@{k}": v for k, v in zip(KS, majs, strict=True)}
                    store.record_evaluation(s, run_id, step, _questions(step))
            store.record_step(s, run_id, step, 1, metrics)
    return run_id


@pytest.mark.slow
@pytest.mark.browser
def test_the_run_tab_draws_pass_and_maj_at_k_for_two_evaluations(tmp_path):
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")
    url_db = env["GRPO_DATABASE_URL"]
    upgrade_database(url_db)
    evaluate = {"steps_per_iteration": 0, "eval_every": 1, "eval_samples": 8}
    baseline = _record(url_db, "baseline", evaluate, sampled=True, steps=1)
    with session_scope(url_db) as s:
        store.finish_run(s, baseline, "completed")
    _record(url_db, "greedy only", {"steps_per_iteration": 8, "eval_every": 4}, sampled=False)
    _record(url_db, "sampled eval", {"steps_per_iteration": 8, "eval_every": 4, "eval_samples": 8}, sampled=True)
    make_engine(url_db).dispose()
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with running_server(tmp_path, env) as (url, _, _), browser_page() as page:
        page.goto(url)
        page.locator("#tab-run-button").click()
        expect(page.locator("#run-charts .js-plotly-plot")).to_be_visible(timeout=30_000)  # the newest run, picked
        box = page.locator("#eval-curves")
        expect(box).to_be_visible()
        expect(page.locator("#eval-first input")).to_have_value("step 0 (before training)")
        expect(page.locator("#eval-second input")).to_have_value("step 8")
        legend = page.locator("#eval-curves-plot .legendtext")
        expect(legend).to_have_text(["Pass@K, step 0", "Maj@K, step 0", "Pass@K, step 8", "Maj@K, step 8"])
        for width, height in ((1280, 900), (1600, 1000)):
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(400)
            assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing overflows sideways
            plot = page.locator("#eval-curves-plot .main-svg").first.bounding_box()
            frame = box.bounding_box()
            assert frame["x"] <= plot["x"] and plot["x"] + plot["width"] <= frame["x"] + frame["width"] + 1
            box.scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / f"eval-curves-{width}.png"))

            flips = page.locator("#eval-flips")  # the questions that changed, folded; one unfolded
            expect(flips.locator(".eval-counts")).to_contain_text("wrong → right 1 · right → wrong 1")
            expect(flips.locator(".eval-flip")).to_have_count(2)
            row = flips.locator('.eval-flip[data-flip="gained"]')
            if row.get_attribute("open") is None:
                row.locator("summary").click()
            expect(row.locator(".eval-output")).to_have_count(2)
            expect(row.locator(".eval-samples").first).to_contain_text("2 of 3 sampled right")
            for side in row.locator(".eval-side").all():  # both outputs inside the row, side by side
                box_side, box_row = side.bounding_box(), row.bounding_box()
                assert (
                    box_row["x"] <= box_side["x"]
                    and box_side["x"] + box_side["width"] <= box_row["x"] + box_row["width"] + 1
                )
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            row.scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / f"eval-flips-{width}.png"))

        page.get_by_label("unchanged").check()  # the unchanged questions on request
        expect(page.locator("#eval-flips .eval-flip")).to_have_count(4)
        page.locator("#eval-text textarea, #eval-text input").first.fill("2 + 3")
        page.locator("#eval-text textarea, #eval-text input").first.press("Enter")
        expect(page.locator("#eval-flips .eval-flip")).to_have_count(1)

        page.locator("#eval-second input").click()  # another evaluation picked: the chart follows it
        page.get_by_role("option", name="step 4", exact=True).click()
        expect(legend).to_have_text(["Pass@K, step 0", "Maj@K, step 0", "Pass@K, step 4", "Maj@K, step 4"])

        page.get_by_label("changed", exact=True).check()  # step 8 of this run against the baseline run, same questions
        page.locator("#eval-text textarea, #eval-text input").first.fill("")
        page.locator("#eval-text textarea, #eval-text input").first.press("Enter")
        page.locator("#eval-first input").click()
        page.get_by_role("option", name="step 8", exact=True).click()
        page.locator("#eval-other-run input").click()
        page.get_by_role("option", name=f"run {baseline} · baseline", exact=True).click()
        expect(page.locator("#eval-second input")).to_have_value("step 0 (before training)")
        other = f"run {baseline}, step 0"
        expect(legend).to_have_text(["Pass@K, step 8", "Maj@K, step 8", f"Pass@K, {other}", f"Maj@K, {other}"])
        expect(page.locator("#eval-flips .eval-counts")).to_contain_text("wrong → right 1 · right → wrong 1")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1600
        box.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "eval-runs-1600.png"))

        page.locator("#run-select input").click()  # a run without a sampled evaluation: no Pass@K chart
        page.get_by_role("option", name="greedy only").first.click()
        expect(page.locator("#eval-first input")).to_have_value("step 0 (before training)")
        expect(page.locator("#eval-curves-plot")).to_be_hidden()
        expect(page.locator("#eval-flips")).to_contain_text("recorded no evaluation's questions")

        page.locator("#run-select input").click()  # the evaluation-only run: one evaluation, nothing trained
        page.get_by_role("option", name="baseline").first.click()
        expect(page.locator("#run-progress")).to_contain_text("evaluation only (steps_per_iteration 0)")
        expect(page.locator("#eval-first input")).to_have_value("step 0 (before training)")
        expect(legend).to_have_text(["Pass@K, step 0", "Maj@K, step 0"])
        expect(page.locator("#export-model")).to_be_disabled()
        page.set_viewport_size({"width": 1280, "height": 900})
        page.locator("#run-progress").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "eval-only-1280.png"))
        exports = page.locator("#export-eval-csv")  # the downloads, each label whole on its button at 1280 px
        exports.scroll_into_view_if_needed()
        for button in page.locator("button[id^='export-']").all():
            if button.is_visible():
                assert button.evaluate("b => b.scrollWidth <= b.clientWidth + 1"), button.get_attribute("id")
        page.screenshot(path=str(artifacts / "run-exports-1280.png"))
