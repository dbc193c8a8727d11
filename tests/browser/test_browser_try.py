"""The Run tab's "Try a question" in a real browser (Chromium through Playwright) against `grpo-dashboard serve` with
its embedded workers: a trained run's starting model and trained policy are offered, a held-out question of the run
is picked, and G outputs of each come back side by side, each card with the verifier's reading, its reward and
components, its tokens tinted by surprise (the log-prob in the tooltip); no model picked is refused by name; nothing
overflows at 1280 x 900 and 1600 x 1000. Screenshots: test-artifacts/try-WIDTH.png."""

from __future__ import annotations

import re

import pytest
from gradio_client import Client
from playwright.sync_api import expect

from tests.support.servers import ROOT, browser_page, wait_finished

SHORT = {"steps_per_iteration": 2, "batch_size": 2, "group_size": 4, "eval_every": 2, "max_new_tokens": 24,
         "format_reward": 0.1, "name": "tried"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.browser
def test_a_question_tried_on_two_models_side_by_side(dashboard):
    client = Client(dashboard, verbose=False)
    run_id = client.predict(SHORT, api_name="/launch_run")["run_id"]
    assert wait_finished(client, run_id, lambda: "")["status"] == "completed"
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with browser_page() as page:
        page.goto(dashboard)
        page.locator("#tab-run-button").click()
        expect(page.locator('#run-progress .run-progress[data-status="completed"]')).to_be_visible(timeout=30_000)
        page.locator("#try-panel .fold-toggle").click()
        models = page.locator("#try-models")
        expect(models.get_by_label("starting model (builtin-arith)")).to_be_checked()
        expect(models.get_by_label("trained policy (final)")).to_be_checked()
        page.locator("#try-pick input").click()
        page.get_by_role("option").filter(has_text="[held-out]").first.click()
        expect(page.locator("#try-question textarea")).not_to_have_value("")
        expect(page.locator("#try-reference textarea")).not_to_have_value("")
        expect(page.locator("#try-pick input")).to_have_value(re.compile(r"^\[held-out\] "))  # the pick stays shown
        expect(page.locator("#try-max-new input")).to_have_value("24")  # the run's max_new_tokens
        page.locator("#try-button").click()
        result = page.locator("#try-result")
        expect(result.locator(".try-model")).to_have_count(2, timeout=60_000)
        expect(result.locator(".try-output")).to_have_count(8)
        expect(result.locator('.try-model[data-model="final"] .try-head')).to_contain_text("trained policy (final)")
        expect(result.locator(".try-output .reading").first).to_contain_text("verifier read")
        expect(result.locator(".try-output .verdict").first).to_be_visible()
        tip = result.locator(".try-output .token").first.get_attribute("data-tip")
        assert "log π" in tip
        for width, height in ((1280, 900), (1600, 1000)):
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(400)
            assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing overflows sideways
            columns = [m.bounding_box() for m in result.locator(".try-model").all()]
            assert columns[0]["y"] == columns[1]["y"] and columns[0]["x"] < columns[1]["x"]  # side by side
            frame = result.bounding_box()
            assert all(frame["x"] <= c["x"] and c["x"] + c["width"] <= frame["x"] + frame["width"] + 1 for c in columns)
            page.locator("#try-panel").scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / f"try-{width}.png"), full_page=False)

        models.get_by_label("starting model (builtin-arith)").uncheck()
        models.get_by_label("trained policy (final)").uncheck()
        page.locator("#try-button").click()
        expect(page.locator("#try-result .try-error")).to_have_text("models: pick one or two of the run's models")
