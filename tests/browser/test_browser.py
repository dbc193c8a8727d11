"""The dashboard in a real browser: Chromium (/usr/bin/chromium) driven through Playwright.

Starts `grpo-dashboard serve` as the end-to-end test does (embedded store, broker and worker),
fills the launch form, launches, watches the run's progress move in the Run tab, reloads the page
and finds the run still there and still followed until it completes (Cancel then disabled; its log
follows the newest lines unless scrolled up), then opens the Groups tab, moves the step slider to a
step with a group whose rewards differ (found through the API), finds the groups sorted by reward
spread and its completions drawn as advantage-coloured token spans with their value on hover; a
long completion without spaces stays inside its card; downloads the trained policy; cancels a
second, long run from the Run tab. Lines and groups the checks need are written to the server's
store from the test, the way its worker writes them. Screenshots go to test-artifacts/
(launch-form.png, run-view.png, group-view.png).
"""

from __future__ import annotations

import re

import pytest
from gradio_client import Client
from playwright.sync_api import expect, sync_playwright

from app import store
from app.store.db import make_engine, session_scope
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from tests.support.browser import ARTIFACTS, CHROMIUM
from tests.support.servers import RUN_TIMEOUT

# long enough that the page sees it running at its pace under CI's load (80 steps took 17 s on an idle machine)
FORM = {"name": "browser run", "steps_per_iteration": "200", "batch_size": "2", "group_size": "4", "eval_every": "0"}


@pytest.fixture
def page():
    """A fresh Chromium page, 1400 x 1000."""
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def _progress_step(page) -> tuple[str, int]:
    box = page.locator("#run-progress .run-progress")
    return box.get_attribute("data-status"), int(box.get_attribute("data-step") or 0)


@pytest.mark.slow
@pytest.mark.browser
def test_launch_watch_reload_and_browse_groups(dashboard, page, tmp_path):
    """A new user's first run in one browser session: launch, watch it train, reload, browse its groups.
    Over ~80 lines because each numbered part needs the page the one before left."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_default_timeout(30_000)
    expect.set_options(timeout=30_000)
    page.goto(dashboard)

    # 1. the launch form: a few fields, then Launch
    page.click("#tab-launch-button")
    expect(page.locator("#dataset-upload-info")).to_contain_text("builtin-arith: ")  # the dataset's first rows
    expect(page.locator("#dataset-upload-info table tr")).to_have_count(6)  # a header and 5 rows
    for field, value in FORM.items():
        box = page.locator(f"#spec-{field} input, #spec-{field} textarea").first
        if not box.is_visible():  # under a section's "More options" (eval_every is): open it as a user would
            page.locator(f"#tab-launch .fold:has(#spec-{field}) .fold-toggle").click()
        box.fill(value)
        box.press("Tab")
    page.screenshot(path=str(ARTIFACTS / "launch-form.png"), full_page=True)
    page.click("#launch-button")
    result = page.locator("#launch-result .ok")
    expect(result).to_contain_text("Launched run")
    run_id = re.search(r"Launched run (\d+)", result.inner_text()).group(1)

    # 2. the Run tab opens on the new run; its progress moves while it trains
    progress = page.locator("#run-progress .run-progress")
    expect(progress).to_contain_text(f"#{run_id}")
    expect(progress).to_contain_text("browser run")
    expect(page.locator('#run-progress .run-progress[data-status="running"]:not([data-step="0"])')).to_be_visible(
        timeout=RUN_TIMEOUT * 1000
    )
    status, first_step = _progress_step(page)
    page.wait_for_function(
        "s => { const e = document.querySelector('#run-progress .run-progress');"
        " return e && (Number(e.dataset.step) > s || e.dataset.status === 'completed'); }",
        arg=first_step,
        timeout=RUN_TIMEOUT * 1000,
    )
    status, later_step = _progress_step(page)
    assert later_step > first_step, (first_step, later_step, status)

    # 3. reload: the run is still listed and still followed, and it keeps going to the end
    page.reload()
    expect(page.locator("#runs-table")).to_contain_text("browser run")
    page.click("#tab-run-button")
    expect(progress).to_contain_text(f"#{run_id}")
    assert _progress_step(page)[1] >= later_step
    expect(page.locator('#run-progress .run-progress[data-status="completed"]')).to_be_visible(
        timeout=RUN_TIMEOUT * 1000
    )
    total = FORM["steps_per_iteration"]
    expect(progress).to_contain_text(f"step {total} / {total}")
    expect(page.locator("#run-charts .js-plotly-plot")).to_be_visible()
    expect(page.locator("#cancel-button")).to_be_disabled()  # a finished run cannot be cancelled
    expect(page.locator("#export-adapter")).to_be_hidden()  # no LoRA adapter in this run
    db_url = f"sqlite:///{tmp_path / 'data' / 'grpo.sqlite'}"
    _check_the_log_follows_its_newest_lines(page, db_url, int(run_id))
    page.screenshot(path=str(ARTIFACTS / "run-view.png"), full_page=True)
    page.click("#export-model")  # the trained policy, zipped, offered for download
    expect(page.locator("#export-file")).to_contain_text(re.compile(rf"run-{run_id}-model-fp32\s*\.zip"))

    # 4. the Groups tab: the latest step's groups, the first one shown as token spans
    page.click("#tab-groups-button")
    first_cells = page.locator('#groups-table [role="gridcell"][data-col="0"]')  # one per row of the table
    expect(first_cells).to_have_count(2)  # batch_size groups at the step
    step_box = page.locator('#group-step input[type="number"]')
    expect(step_box).to_have_value(total)
    view = page.locator("#group-view .group")
    expect(view).to_have_attribute("data-group-id", first_cells.first.inner_text().strip())
    expect(page.locator("#group-view .sample")).to_have_count(4)  # group_size samples
    tokens = page.locator("#group-view span.token")
    expect(tokens.first).to_be_visible()
    for i in range(min(tokens.count(), 20)):
        assert tokens.nth(i).get_attribute("data-adv") is not None
        assert "background:rgba(" in (tokens.nth(i).get_attribute("style") or "")

    # 5. move the slider to a step with a group whose rewards differ (if the run sampled one), sort the
    #    groups by reward spread: that group comes first, and its tokens are coloured
    client = Client(dashboard, verbose=False)
    varied = [
        (step, g["group_id"])
        for step in range(1, int(total) + 1)
        for g in client.predict(int(run_id), step, "spread", api_name="/list_groups")[:1]
        if g["reward_std"] > 0
    ]
    step, group_id = varied[0] if varied else (1, None)
    step_box.fill(str(step))
    step_box.press("Enter")
    expect(page.locator("#group-order input")).to_have_value("reward spread (largest first)")  # the default
    if group_id is not None:
        expect(first_cells.first).to_have_text(str(group_id))
        page.click('#groups-table [data-testid="cell-0-1"]')
        expect(view).to_have_attribute("data-group-id", str(group_id))
        coloured = page.locator('#group-view span.token:not([style*=",0.000)"])')
        expect(coloured.first).to_be_visible()
        assert float(coloured.first.get_attribute("data-adv")) != 0
        expect(page.locator("#group-view .norm").first).to_be_visible()  # normalised rewards beside raw ones
    expect(page.locator("#group-view span.token").first).to_be_visible()
    page.locator("#group-view").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "group-view.png"), full_page=True)
    _check_a_long_completion_stays_in_its_card(page, db_url, int(run_id), int(total) + 1)

    # 6. cancel a long run from the Run tab: it stops at its next step, its data stays
    long_id = client.predict(
        {
            **{k: v for k, v in FORM.items() if k != "steps_per_iteration"},
            "name": "long run",
            "steps_per_iteration": 5000,
        },
        api_name="/launch_run",
    )["run_id"]
    page.click("#tab-runs-button")
    page.locator("#runs-table").get_by_text("long run").click()
    expect(progress).to_contain_text(f"#{long_id}")
    expect(page.locator('#run-progress .run-progress[data-status="running"]:not([data-step="0"])')).to_be_visible(
        timeout=RUN_TIMEOUT * 1000
    )
    page.click("#cancel-button")
    expect(page.locator('#run-progress .run-progress[data-status="cancelled"]')).to_be_visible(timeout=60_000)
    expect(page.locator("#cancel-button")).to_be_disabled()
    make_engine(db_url).dispose()
    run = client.predict(long_id, api_name="/get_run")
    assert run["status"] == "cancelled" and 0 < run["step"] < 5000
    assert len(client.predict(long_id, api_name="/get_metrics")) == run["step"]  # what it recorded stays


# the log box: where it is scrolled, and whether that is its end
LOG_SCROLL = (
    "() => { const t = document.querySelector('#run-log textarea');"
    " return {top: t.scrollTop, bottom: t.scrollTop + t.clientHeight >= t.scrollHeight - 4,"
    " scrolls: t.scrollHeight > t.clientHeight}; }"
)


def _append_log(page, db_url: str, run_id: int, lines: list[str]) -> None:
    """Add ``lines`` to the run's log in its store, and wait until the Run tab's log shows the last."""
    with session_scope(db_url) as s:
        for line in lines:
            store.append_log(s, run_id, line)
    page.wait_for_function(
        "last => document.querySelector('#run-log textarea').value.endsWith(last)", arg=lines[-1], timeout=15_000
    )
    page.wait_for_timeout(600)  # the page checks where its log is scrolled every 250 ms


def _check_the_log_follows_its_newest_lines(page, db_url: str, run_id: int) -> None:
    """New lines keep the log at its end; scrolled up, it stays where the reader put it; scrolled back to the
    end, it follows again."""
    log = page.locator("#run-log textarea")
    _append_log(page, db_url, run_id, [f"extra line {i}" for i in range(30)])
    state = page.evaluate(LOG_SCROLL)
    assert state["scrolls"] and state["bottom"]
    log.hover()
    page.mouse.wheel(0, -200)
    page.wait_for_timeout(400)
    up = page.evaluate(LOG_SCROLL)
    assert not up["bottom"]
    _append_log(page, db_url, run_id, [f"read later {i}" for i in range(5)])
    assert page.evaluate(LOG_SCROLL) == up  # left where the reader scrolled
    page.mouse.wheel(0, 5000)
    page.wait_for_timeout(400)
    _append_log(page, db_url, run_id, [f"followed again {i}" for i in range(5)])
    assert page.evaluate(LOG_SCROLL)["bottom"]


def _check_a_long_completion_stays_in_its_card(page, db_url: str, run_id: int, step: int) -> None:
    """A completion without spaces, longer than its card is wide and high, wraps inside the card and scrolls
    within it; a token's value shows on hover at once."""
    tokens = ["abcdefghij"] * 200 + ["</s>"]
    samples = [
        SampleRecord(
            completion="".join(tokens),
            tokens=tokens,
            reward=float(i % 2),
            advantages=[i % 2 - 0.5] * len(tokens),
            reward_components={"correct": float(i % 2)},
        )
        for i in range(4)
    ]
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, step, [GroupRecord("long", "1", samples).to_dict()])
    # every step before it has groups: the slider now counts ``step`` recorded steps
    expect(page.locator("#group-step")).to_contain_text(f"{step} recorded", timeout=15_000)
    step_box = page.locator('#group-step input[type="number"]')
    step_box.fill(str(step))
    step_box.press("Enter")
    expect(page.locator("#group-view pre.prompt").last).to_have_text("long")  # the question (alone, or folded last)
    cards = page.locator("#group-view .sample")
    for i in range(2):
        card, box = cards.nth(i).bounding_box(), cards.nth(i).locator(".tokens")
        inner = box.bounding_box()
        assert card["x"] <= inner["x"] and inner["x"] + inner["width"] <= card["x"] + card["width"]
        assert inner["y"] + inner["height"] <= card["y"] + card["height"]
        assert box.evaluate("e => e.scrollWidth <= e.clientWidth && e.scrollHeight > e.clientHeight")
        assert card["height"] < 500
    first, second = cards.nth(0).bounding_box(), cards.nth(1).bounding_box()
    assert first["x"] + first["width"] <= second["x"] or first["y"] + first["height"] <= second["y"]
    _check_token_tips_stay_in_the_window(page, "A = -0.5000")


def _check_token_tips_stay_in_the_window(page, text: str) -> None:
    """At 1280 x 900 and 1600 x 1000, with the page scrolled to the cards: a token's tooltip shows at once on
    hover, wholly inside the window, both for a token high in the window and for one near its bottom edge (the
    tooltip then opens above it). Screenshots: token-tip-WIDTH.png."""
    token = page.locator("#group-view span.token").first
    tip = page.locator("#token-tip")
    for width, height in ((1280, 900), (1600, 1000)):
        page.set_viewport_size({"width": width, "height": height})
        for from_top in (120, height - 40):  # the token's place in the window, from its top edge
            token.evaluate(f"e => window.scrollBy(0, e.getBoundingClientRect().top - {from_top})")
            page.mouse.move(0, 0)
            token.hover()
            expect(tip).to_be_visible()
            assert text in tip.inner_text()
            box = tip.bounding_box()
            assert 0 <= box["x"] and box["x"] + box["width"] <= width, (width, box)
            assert 0 <= box["y"] and box["y"] + box["height"] <= height, (width, height, from_top, box)
        page.screenshot(path=str(ARTIFACTS / f"token-tip-{width}.png"))
    page.set_viewport_size({"width": 1400, "height": 1000})


@pytest.mark.slow
@pytest.mark.browser
def test_learned_prm_groups_show_step_rewards(dashboard, page):
    """A learned-PRM run (process supervision, reward: model) launched through the API: its groups carry
    one PRM score per step in /get_group, and the Groups tab marks each step's end with its reward."""
    from tests.support.servers import wait_finished

    ARTIFACTS.mkdir(exist_ok=True)
    client = Client(dashboard, verbose=False)
    spec = {
        "name": "prm run",
        "supervision": "process",
        "reward": "model",
        "rm_samples": 16,
        "steps_per_iteration": 2,
        "batch_size": 2,
        "group_size": 4,
        "eval_every": 0,
    }
    run_id = client.predict(spec, api_name="/launch_run")["run_id"]
    run = wait_finished(client, run_id, lambda: "")
    assert run["status"] == "completed", run["error"]

    # the API: every sample's steps, each with the PRM's score (a probability) and its end token
    listed = client.predict(run_id, None, "spread", api_name="/list_groups")  # the Groups tab's order
    assert [g["step"] for g in listed] == [2, 2]
    shown = client.predict(listed[0]["group_id"], api_name="/get_group")
    marks = 0
    for group in [shown] + [client.predict(g["group_id"], api_name="/get_group") for g in listed[1:]]:
        for s in group["samples"]:
            assert len(s["step_rewards"]) == len(s["step_end_indices"])
            assert all(0.0 < r < 1.0 for r in s["step_rewards"])
            assert s["step_end_indices"] == sorted(s["step_end_indices"])
            assert all(0 <= e < len(s["tokens"]) for e in s["step_end_indices"])
            assert s["reward_components"]["rm_score"] == pytest.approx(
                sum(s["step_rewards"]) / len(s["step_rewards"]) if s["step_rewards"] else 0.0
            )
    marks = sum(len(s["step_end_indices"]) for s in shown["samples"])
    assert marks > 0
    # each step: the PRM's score, and beside it the built-in task's exact checker's label (the rule the PRM learns)
    for s in shown["samples"]:
        assert [st["prm_score"] for st in s["steps"]] == s["step_rewards"] == [st["reward"] for st in s["steps"]]
        assert [st["label"] for st in s["steps"]] == s["step_labels"] and set(s["step_labels"]) <= {0.0, 1.0}
        if s["steps"]:  # the steps spell the output up to the last step's end, the delimiters left out
            spelled = "".join(s["tokens"][: s["step_end_indices"][-1] + 1])
            assert "".join("".join(st["text"] for st in s["steps"]).split()) == "".join(spelled.split())
    assert shown["step_label_rule"] == "the built-in task's exact step checker"

    # the UI: the Groups tab opens on the newest run's latest step, first group, steps marked with rewards
    page.set_default_timeout(30_000)
    expect.set_options(timeout=30_000)
    page.goto(dashboard)
    page.click("#tab-groups-button")
    view = page.locator("#group-view .group")
    expect(view).to_have_attribute("data-group-id", str(shown["group_id"]))
    step_marks = page.locator("#group-view .step-end")
    expect(step_marks).to_have_count(marks)
    first = shown["samples"][0]
    if first["step_rewards"]:
        expect(step_marks.first).to_have_text(f"step 1 r={first['step_rewards'][0]:+.2f}")
    table = page.locator("#group-view .step-table").first
    expect(table).to_contain_text("PRM score")
    expect(page.locator("#group-view details.steps summary").first).to_contain_text(
        "labels by the built-in task's exact step checker"
    )
    expect(table.locator("tr[data-step]")).to_have_count(len(next(s for s in shown["samples"] if s["steps"])["steps"]))
    page.locator("#group-view").scroll_into_view_if_needed()
    for width in (1280, 1600):
        page.set_viewport_size({"width": width, "height": 1000})
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing overflows sideways
        page.screenshot(path=str(ARTIFACTS / f"group-view-prm-{width}.png"), full_page=True)

    # the Compare tab: pick the run, its curves and its config appear
    page.click("#tab-compare-button")
    page.click("#compare-runs input")
    page.get_by_role("option", name=f"#{run_id} prm run (completed)").click()
    expect(page.locator("#compare-charts .js-plotly-plot")).to_be_visible()
    expect(page.locator('#compare-config tr[data-key="supervision"]')).to_contain_text("process")
