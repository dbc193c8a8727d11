"""Diagnosing a finished run in a real browser (Chromium through Playwright), at 1280 and 1600 pixels wide.

A short run on the built-in model trains through the embedded worker; then, at 1280 (at 1600 the same views, without
the paging, filtering and refusal): the Run tab draws
"Where the gradient comes from" (a stacked bar per step, each segment with its step range and kind); a click on a
bar opens the Groups tab with Find samples filtered to that step and kind (the count the API gives) and the first
group found shown, its sample marked; with no filter the samples page by 50; filtering to wrong answers lists only
those, and a click on one shows its group; "This question through time" shows the question's share of right
answers and its outputs by step; a refused filter says why; hovering a token shows its log-probs (the policy's
at sampling and the reference's, as /get_group has them), ratio and KL, and "Tint tokens by" KL recolours the
group. Screenshots go to test-artifacts/diagnose-{run,groups,history,tokens}-{1280,1600}.png.
"""

from __future__ import annotations

import re

import pytest
from gradio_client import Client
from playwright.sync_api import expect, sync_playwright

from tests.support.servers import ROOT, wait_finished

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
SPEC = {"name": "diagnose run", "steps_per_iteration": 6, "batch_size": 4, "group_size": 4, "eval_every": 0}
WIDTHS = (1280, 1600)
STEP_MIN, STEP_MAX = "#find-step-min input", "#find-step-max input"
NO_SIDEWAYS_SCROLL = "() => document.documentElement.scrollWidth <= window.innerWidth"


def _search(client: Client, run_id: int, **filters) -> dict:
    """/search_samples with these filters (the rest left open)."""
    return client.predict(run_id=run_id, api_name="/search_samples", **filters)


@pytest.mark.slow
@pytest.mark.browser
def test_a_bar_opens_its_groups_and_a_question_shows_its_history(dashboard):
    client = Client(dashboard, verbose=False)
    run_id = client.predict(SPEC, api_name="/launch_run")["run_id"]
    run = wait_finished(client, run_id, lambda: "")
    assert run["status"] == "completed", run["error"]
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 1000})
                page.set_default_timeout(20_000)
                expect.set_options(timeout=20_000)
                page.goto(dashboard)
                page.locator(f'#runs-table tr[data-run-id="{run_id}"]').click()
                bar = _check_the_chart(page, width)
                _check_a_bar_opens_its_groups(page, client, run_id, bar, width)
                if width == WIDTHS[0]:  # every interaction once; the other width repeats what its screenshots show
                    _check_wrong_answers_and_a_question_through_time(page, client, run_id, width)
                else:
                    _check_the_history_of_the_group_shown(page, width)
                _check_token_detail(page, client, width)
                page.close()
        finally:
            browser.close()


def _check_the_history_of_the_group_shown(page, width: int) -> None:
    """ "This question through time" for the group the bar opened: its question, with that group among its steps."""
    group_id = page.locator("#group-view .group").get_attribute("data-group-id")
    page.click("#question-history-button")
    history = page.locator("#question-history .question-history")
    expect(history.locator(f'.hist-group[data-group-id="{group_id}"]')).to_be_visible()
    assert page.evaluate(NO_SIDEWAYS_SCROLL)
    history.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"diagnose-history-{width}.png"), full_page=True)


def _check_token_detail(page, client: Client, width: int) -> None:
    """A token's tooltip holds the numbers /get_group recorded for it; tinting by KL says so and recolours."""
    group_id = int(page.locator("#group-view .group").get_attribute("data-group-id"))
    sample = client.predict(group_id, api_name="/get_group")["samples"][0]
    token = page.locator(f'#group-view .sample[data-sample-id="{sample["sample_id"]}"] .token').first
    token.scroll_into_view_if_needed()
    token.hover()
    tip = token.get_attribute("data-tip")
    assert f"log π_old {sample['logprobs'][0]:+.4f}" in tip and f"log π_ref {sample['ref_logprobs'][0]:+.4f}" in tip
    assert f"ratio {sample['ratios'][0]:.3f}" in tip and f"KL {sample['kls'][0]:.4f}" in tip
    page.get_by_label("KL to the reference (k3)").check()
    expect(page.locator("#group-view .tint-legend")).to_contain_text("KL to the reference")
    token.hover()
    assert page.evaluate(NO_SIDEWAYS_SCROLL)
    page.screenshot(path=str(ARTIFACTS / f"diagnose-tokens-{width}.png"), full_page=False)


def _check_the_chart(page, width: int) -> dict:
    """One bar segment per kind of group at each step, inside the page; returns the segment to click (a mixed one
    where there is one) as its data attributes."""
    chart = page.locator("#gradient-chart .gradient-chart")
    expect(chart).to_contain_text("Where the gradient comes from")
    segments = chart.locator("svg [data-kind]")
    expect(segments.first).to_be_attached()
    steps = {int(s.get_attribute("data-step")) for s in segments.all()}
    assert steps == set(range(1, SPEC["steps_per_iteration"] + 1))  # every step drew its groups
    expect(chart.locator(".token-shares")).to_contain_text(f"Tokens at step {SPEC['steps_per_iteration']}")
    box = chart.locator("svg").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width and page.evaluate(NO_SIDEWAYS_SCROLL)
    mixed = chart.locator('svg rect[data-kind="mixed"]')
    target = mixed.first if mixed.count() else segments.first
    target.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"diagnose-run-{width}.png"), full_page=True)
    return {
        "step": int(target.get_attribute("data-step")),
        "step_end": int(target.get_attribute("data-step-end")),
        "kind": target.get_attribute("data-kind"),
        "locator": target,
    }


def _check_a_bar_opens_its_groups(page, client: Client, run_id: int, bar: dict, width: int) -> None:
    """The click opens the Groups tab's Find samples on the bar's steps and kind, with what the API finds, and
    shows the first group found with its sample marked."""
    bar["locator"].click()
    expect(page.locator("#tab-groups")).to_be_visible()
    expect(page.locator(STEP_MIN)).to_have_value(str(bar["step"]))
    expect(page.locator(STEP_MAX)).to_have_value(str(bar["step_end"]))
    found = _search(client, run_id, step_min=bar["step"], step_max=bar["step_end"], kind=bar["kind"])
    assert found["total"] > 0
    pager = page.locator("#find-samples .find-pager")
    expect(pager).to_contain_text(f"page 1 of {found['pages']} ({found['total']} samples found)")
    first = found["rows"][0]
    expect(page.locator('#find-results [data-testid="cell-0-2"]')).to_have_text(str(first["sample_id"]))
    expect(page.locator("#group-view .group")).to_have_attribute("data-group-id", str(first["group_id"]))
    expect(page.locator(f'#group-view .sample[data-sample-id="{first["sample_id"]}"][data-found]')).to_be_visible()
    _check_the_table_lists_the_shown_groups_step(page, first)
    assert page.evaluate(NO_SIDEWAYS_SCROLL)
    page.screenshot(path=str(ARTIFACTS / f"diagnose-groups-{width}.png"), full_page=True)


def _check_the_table_lists_the_shown_groups_step(page, row: dict) -> None:
    """The step slider stands at the found group's step, the groups table above lists that step's groups (the
    found one among them), and the found group stays shown."""
    expect(page.locator('#group-step input[type="number"]')).to_have_value(str(row["step"]))
    expect(
        page.locator('#groups-table [role="gridcell"][data-col="0"]').filter(
            has_text=re.compile(rf"^\s*{row['group_id']}\s*$")
        )
    ).to_have_count(1)
    page.wait_for_timeout(2_500)  # a tick of the timer: the slider does not jump back to the latest step
    expect(page.locator('#group-step input[type="number"]')).to_have_value(str(row["step"]))
    expect(page.locator("#group-view .group")).to_have_attribute("data-group-id", str(row["group_id"]))


def _pick(page, elem_id: str, option: str) -> None:
    """Choose ``option`` (its label) in the dropdown ``elem_id``."""
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def _check_wrong_answers_and_a_question_through_time(page, client: Client, run_id: int, width: int) -> None:
    """Clear the filters, keep the wrong answers (the right ones where the run gave none wrong), open one's group
    and its question's history; then a refused filter says why."""
    page.click("#find-clear")
    expect(page.locator(STEP_MIN)).to_have_value("")
    page.click("#find-button")  # every sample: two pages of 50
    pages = _search(client, run_id)["pages"]
    expect(page.locator("#find-samples .find-pager")).to_contain_text(f"page 1 of {pages}")
    if pages > 1:
        page.click("#find-next")
        expect(page.locator("#find-samples .find-pager")).to_contain_text(f"page 2 of {pages}")
        expect(page.locator("#find-prev")).to_be_enabled()
    outcome, label, mark = "wrong", "wrong ✗ (an answer found)", "✗"
    if not _search(client, run_id, outcome="wrong")["total"]:
        outcome, label, mark = "correct", "correct ✓", "✓"
    _pick(page, "find-outcome", label)
    page.click("#find-button")
    found = _search(client, run_id, outcome=outcome)
    expect(page.locator("#find-samples .find-pager")).to_contain_text(f"({found['total']} samples found)")
    verdicts = page.locator('#find-results [role="gridcell"][data-col="4"]')  # the rows drawn (the table scrolls)
    expect(verdicts.first).to_have_text(mark if not found["rows"][0]["truncated"] else f"{mark} · cut")
    assert all(v.inner_text().strip().startswith(mark) for v in verdicts.all())
    row = found["rows"][-1] if len(found["rows"]) < 10 else found["rows"][9]
    page.locator(f'#find-results [data-testid="cell-{found["rows"].index(row)}-3"]').click()
    expect(page.locator("#group-view .group")).to_have_attribute("data-group-id", str(row["group_id"]))
    expect(page.locator(f'#group-view .sample[data-sample-id="{row["sample_id"]}"][data-found]')).to_be_visible()
    _check_the_table_lists_the_shown_groups_step(page, row)

    page.click("#question-history-button")
    history = page.locator("#question-history .question-history")
    expect(history).to_be_visible()
    expect(history.locator(".hist-question")).to_have_text(row["question"])
    expect(history.locator(f'.hist-group[data-group-id="{row["group_id"]}"]')).to_be_visible()
    expect(history.locator(".hist-run")).to_contain_text(f"#{run_id}")
    assert page.evaluate(NO_SIDEWAYS_SCROLL)
    history.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"diagnose-history-{width}.png"), full_page=True)

    page.locator(STEP_MIN).fill("5")
    page.locator(STEP_MAX).fill("2")
    page.click("#find-button")
    expect(page.locator("#find-samples .find-error")).to_have_text("step_min must be at most step_max, got 5 > 2")
