"""The Launch form in a real browser (Chromium through Playwright) on a live `grpo-dashboard serve`: a preset fills
the form, keys that do not apply are hidden and come back when their option is chosen, a refused launch marks the
field it names (opening its folded section and bringing it into view), and a launch opens the Run tab, where the
run's phase shows until it completes. Screenshots of every tab at 1280 and 1600 px go to test-artifacts/
(tab-<name>-<width>.png)."""

from __future__ import annotations

import re
from io import BytesIO

import pytest
from PIL import Image
from playwright.sync_api import expect, sync_playwright

from tests.support.browser import ARTIFACTS, CHROMIUM

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.mark.slow
@pytest.mark.browser
def test_presets_applicable_fields_and_a_marked_refusal(dashboard):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for width in (1280, 1600):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(dashboard)
                page.click("#tab-launch-button")
                expect(page.locator("#dataset-upload-info")).to_contain_text("builtin-arith: ")
                page.screenshot(path=str(ARTIFACTS / f"launch-{width}.png"), full_page=True)
                # the first question as the model reads it: the template's words around it, its token count
                page.locator("#spec-question_template textarea, #spec-question_template input").first.fill(
                    '{question}\nOutput the final answer after "####".'
                )
                page.click("#show-prompt")
                shown = page.locator("#prompt-preview .prompt-preview")
                expect(shown).to_contain_text("The first training question as the model reads it:", timeout=60_000)
                expect(shown.locator("pre")).to_contain_text('Output the final answer after "####".')
                assert re.search(r"reads it: \d+ tokens\.", shown.inner_text())
                box = shown.bounding_box()
                assert box["x"] >= 0 and box["x"] + box["width"] <= width  # nothing runs off the page
                page.locator("#prompt-preview").screenshot(path=str(ARTIFACTS / f"launch-prompt-{width}.png"))
                # the CPU recipe for a small instruct model: its built-in dataset previewed, its named rewards
                page.locator("#launch-preset input").click()
                page.get_by_role("option", name="Small instruct model on word problems (CPU)").click()
                expect(page.locator("#dataset-upload-info")).to_contain_text("builtin-word-problems: 1100 rows")
                rewards = page.locator("#spec-rewards textarea, #spec-rewards input").first
                expect(rewards).to_have_value(re.compile(r'"strict_correct".*"format_after_working", "weight": 0.05'))
                expect(page.locator("#spec-answer_match input[value=flexible]")).to_be_checked()
                expect(page.locator("#spec-format_reward")).to_be_hidden()  # named rewards pay the form
                page.screenshot(path=str(ARTIFACTS / f"launch-preset-cpu-{width}.png"), full_page=True)
                page.locator("#launch-preset input").click()
                page.get_by_role("option", name="GSM8K with a 0.5B instruct model (GPU)").click()
                expect(page.locator("#dataset-upload-info")).to_contain_text("openai/gsm8k: read by the worker")
                page.close()
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(30_000)
            expect.set_options(timeout=30_000)
            page.goto(dashboard)
            page.click("#tab-launch-button")
            rm_samples = page.locator("#spec-rm_samples")
            expect(page.locator("#spec-format_reward")).to_be_visible()  # outcome, rule reward: no RM keys
            expect(rm_samples).to_be_hidden()
            expect(page.locator("#spec-step_delimiter")).to_be_hidden()
            # "Test rewards" scores the dataset's first rows with the named rewards, as they would be in a run
            page.locator("#spec-rewards textarea, #spec-rewards input").first.fill(
                '[{"name": "accuracy", "weight": 1}, {"name": "length", "weight": 0.5}]'
            )
            page.click("#test-rewards")
            expect(page.locator("#rewards-preview table")).to_contain_text("length")
            expect(page.locator("#rewards-preview table tr")).to_have_count(6)  # the header and 5 rows
            page.locator("#test-rewards-box").screenshot(path=str(ARTIFACTS / "launch-test-rewards.png"))
            page.locator("#spec-rewards textarea, #spec-rewards input").first.fill("")

            page.locator("#launch-preset input").click()
            page.get_by_role("option", name="Process supervision with a learned PRM (built-in)").click()
            expect(page.locator("#spec-name textarea, #spec-name input").first).to_have_value("builtin-prm")
            expect(page.locator("#spec-steps_per_iteration input")).to_have_value("100")
            expect(page.locator("#spec-format_reward")).to_be_hidden()  # process supervision
            page.locator(".launch-section").nth(2).get_by_text("More options").click()  # Reward's folded keys
            expect(rm_samples).to_be_visible()  # reward: model
            expect(page.locator("#test-rewards")).to_be_hidden()  # a learned reward model: no named rewards
            expect(page.locator("#spec-rm_samples input")).to_have_value("1024")

            page.locator("#spec-rm_samples input").fill("1")  # too few: refused, naming rm_samples
            page.click("#launch-button")
            expect(page.locator("#launch-result .error")).to_contain_text("rm_samples")
            expect(page.locator("#spec-rm_samples.invalid")).to_be_visible()
            assert page.locator("#tab-launch .invalid").count() == 1
            assert _marked_red(page.locator("#spec-rm_samples"))
            page.screenshot(path=str(ARTIFACTS / "launch-refused.png"))

            page.locator("#spec-rm_samples input").fill("64")
            group_size = page.locator("#spec-group_size input").first
            kept = group_size.input_value()
            group_size.fill("1")  # a field of the left column, whose edge clips what is drawn outside a field
            page.click("#launch-button")
            expect(page.locator("#launch-result .error")).to_contain_text("group_size")
            expect(page.locator("#spec-group_size.invalid")).to_be_visible()
            assert _marked_red(page.locator("#spec-group_size"))
            page.screenshot(path=str(ARTIFACTS / "launch-refused-left.png"))
            group_size.fill(kept)
            page.locator("#spec-steps_per_iteration input").fill("3")
            page.click("#launch-button")
            expect(page.locator("#launch-result .ok")).to_contain_text("Launched run")
            progress = page.locator("#run-progress .run-progress")
            expect(progress).to_contain_text("builtin-prm")
            assert page.locator("#tab-launch .invalid").count() == 0
            expect(
                page.locator('#run-progress .run-progress[data-status="running"]:not([data-phase=""])')
            ).to_be_visible(timeout=120_000)  # what it is doing: loading, training the reward model, training
            page.screenshot(path=str(ARTIFACTS / "run-phase.png"))
            expect(page.locator('#run-progress .run-progress[data-status="completed"]')).to_be_visible(timeout=300_000)
            expect(progress).not_to_have_attribute("data-phase", re.compile(".+"))  # no phase once it ended
            _every_tab(page)
        finally:
            browser.close()


def _marked_red(field) -> bool:
    """Whether a refused field shows its red mark within its own box, down its left edge: what a user sees there,
    whatever a column around it clips."""
    shot = Image.open(BytesIO(field.screenshot())).convert("RGB")
    edge = [shot.getpixel((x, y)) for y in range(shot.height) for x in range(4)]
    return sum(1 for r, g, b in edge if r > 170 and g < 100 and b < 100) >= shot.height // 2


TABS = ("launch", "runs", "run", "groups", "compare")


def _every_tab(page) -> None:
    """A screenshot of each tab at 1280 and 1600 px wide, for a person to look at."""
    for width in (1280, 1600):
        page.set_viewport_size({"width": width, "height": 900})
        for tab in TABS:
            page.click(f"#tab-{tab}-button")
            expect(page.locator(f"#tab-{tab}")).to_be_visible()
            page.wait_for_timeout(1500)  # the tab's content and charts drawn
            page.screenshot(path=str(ARTIFACTS / f"tab-{tab}-{width}.png"), full_page=True)


@pytest.mark.slow
@pytest.mark.browser
def test_a_refusal_at_the_bottom_of_the_form_keeps_the_launch_bar_and_its_message_in_view(dashboard):
    """checkpoint_keep, the form's last section, folded, set to 0 and launched: the page scrolls to the marked
    field, and the Launch bar with "Not launched: checkpoint_keep: ..." stays in the window, at 1280 x 900 and
    1600 x 1000 (screenshots launch-refused-bottom-WIDTH.png). The value is typed the moment the fold opens, and kept;
    the fold is closed again before Launch, and the refusal opens it. In the same section, Sharding shows once devices is
    2 (launch-sharding-WIDTH.png)."""
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for width, height in ((1280, 900), (1600, 1000)):
                page = browser.new_page(viewport={"width": width, "height": height})
                page.set_default_timeout(30_000)
                page.goto(dashboard)
                page.click("#tab-launch-button")
                expect(page.locator("#dataset-upload-info")).to_contain_text("builtin-arith: ")  # the page's load done
                field = page.locator("#spec-checkpoint_keep input")
                expect(field).to_have_count(1)  # drawn with the tab, its fold closed: nothing is drawn as it opens
                expect(field).to_be_hidden()
                more = page.locator(".launch-section").nth(3).get_by_text("More options")  # Runtime & saving
                more.click()
                field.fill("0")  # at once: a field drawn as its fold opened took its default again a moment later
                field.press("Tab")
                page.wait_for_timeout(500)
                expect(field).to_have_value("0")
                more.click()  # folded again: the refusal opens it
                expect(field).to_be_hidden()
                page.click("#launch-button")
                message = page.locator("#launch-result .error")
                expect(message).to_contain_text("Not launched: checkpoint_keep: must be at least 1, got 0")
                expect(page.locator("#spec-checkpoint_keep.invalid")).to_be_in_viewport()
                page.wait_for_timeout(500)  # the scroll to the field has settled
                expect(page.locator("#launch-button")).to_be_in_viewport()
                expect(message).to_be_in_viewport()
                assert page.evaluate("window.scrollY") > 0  # the form did scroll: the bar stayed on top of it
                page.screenshot(path=str(ARTIFACTS / f"launch-refused-bottom-{width}.png"))
                # sharding applies to runs of several processes: hidden with devices 1, shown with 2
                sharding = page.locator("#spec-sharding")
                expect(sharding).to_be_hidden()
                devices = page.locator("#spec-devices input")
                devices.fill("2")
                devices.press("Tab")
                expect(sharding).to_be_visible()
                sharding.scroll_into_view_if_needed()
                page.locator(".launch-section").nth(3).screenshot(path=str(ARTIFACTS / f"launch-sharding-{width}.png"))
                page.close()
        finally:
            browser.close()
