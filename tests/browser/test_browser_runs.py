"""The Runs tab in a real browser (Chromium through Playwright): coloured status badges, the phase of a running
run, the search filter, renaming a run and deleting one after the confirmation, and a row opening its run; a
short run's "too few steps yet" badge and its cut output's mark.

The server runs without a worker; runs are written into its store from this process, the way a worker
writes them. Screenshots go to test-artifacts/ (runs-tab.png, too-few-WIDTH.png, cut-card-WIDTH.png).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect, sync_playwright
from sqlalchemy import update

from app import store
from app.store.db import make_engine, session_scope, upgrade_database
from app.store.models import Run
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.spec.presets import GSM8K_INSTRUCTION
from tests.support.servers import CHROMIUM, ROOT, browser_page, running_server, server_env

SPEC = {
    "model": "builtin-arith",
    "dataset": "builtin-arith",
    "supervision": "outcome",
    "iterations": 1,
    "steps_per_iteration": 10,
    "device": "auto",
    "question_template": GSM8K_INSTRUCTION,  # a long string with a line break, as the Run tab's config shows it
}
BADGE_COLOURS = {"completed": "rgb(21, 128, 61)", "failed": "rgb(185, 28, 28)", "running": "rgb(37, 99, 235)"}
# the Compare chart's drawn width and its box's width (the Run tab's with "run-charts")
COMPARE_WIDTHS = """() => [document.querySelector('#compare-charts .main-svg').getBoundingClientRect().width,
                            document.querySelector('#compare-charts').getBoundingClientRect().width]"""


def _seed(db_url: str) -> dict[str, int]:
    """Three runs, one per status of BADGE_COLOURS; the running one reports a phase. Returns status -> run id."""
    ids = {}
    with session_scope(db_url) as s:
        for status in BADGE_COLOURS:
            run_id = store.create_run(s, {**SPEC, "name": f"{status} run"}, f"{status} run")
            store.record_step(s, run_id, 1, 1, {"reward_mean": 0.5, "correct_frac": 0.25})
            phase = ("building built-in model", 400, 900) if status == "running" else (None, None, None)
            s.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(status=status, phase=phase[0], phase_done=phase[1], phase_total=phase[2])
            )
            ids[status] = run_id
    return ids


@pytest.mark.slow
@pytest.mark.browser
def test_runs_table_colours_filters_renames_and_deletes(tmp_path):
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")
    upgrade_database(env["GRPO_DATABASE_URL"])
    ids = _seed(env["GRPO_DATABASE_URL"])
    try:
        with running_server(tmp_path, env) as (url, _, _), sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            try:
                _drive(browser.new_page(viewport={"width": 1280, "height": 900}), url, ids)
            finally:
                browser.close()
    finally:
        make_engine(env["GRPO_DATABASE_URL"]).dispose()


def _drive(page, url: str, ids: dict[str, int]) -> None:
    """The user's steps on the Runs tab."""
    page.set_default_timeout(15_000)
    expect.set_options(timeout=15_000)
    page.goto(url)
    rows = page.locator("#runs-table tr.run-row")
    expect(rows).to_have_count(3)
    for status, colour in BADGE_COLOURS.items():  # each status in its colour, as the Run tab's badges
        badge = page.locator(f'#runs-table tr[data-run-id="{ids[status]}"] .badge')
        expect(badge).to_have_text(status)
        expect(badge).to_have_css("background-color", colour)
    expect(page.locator(f'#runs-table tr[data-run-id="{ids["running"]}"] .run-phase')).to_have_text(
        "building built-in model 400/900"
    )
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "test-artifacts" / "runs-tab.png"), full_page=True)

    page.locator("#runs-search textarea, #runs-search input").first.fill("fail")  # the search narrows the table
    expect(rows).to_have_count(1)
    page.locator("#runs-search textarea, #runs-search input").first.fill("")
    expect(rows).to_have_count(3)
    search = page.locator("#runs-search textarea, #runs-search input").first
    search.press_sequentially("failed")  # typed, then deleted key by key: the last key's refresh is not dropped
    for _ in "failed":
        search.press("Backspace")
    expect(rows).to_have_count(3)
    expect(page.locator("#runs-table .runs-count")).to_have_text(re.compile(r"^3 runs · "))

    completed = page.locator(f'#runs-table tr[data-run-id="{ids["completed"]}"]')
    completed.locator(".run-manage").click()  # rename through the Manage area
    name = page.locator("#manage-name textarea, #manage-name input").first
    expect(name).to_have_value("completed run")
    name.fill("best run so far")
    page.locator("#manage-save").click()
    expect(page.locator("#manage-message")).to_contain_text(f"Saved run #{ids['completed']}.")
    expect(completed.locator(".run-name")).to_have_text("best run so far")

    failed = page.locator(f'#runs-table tr[data-run-id="{ids["failed"]}"]')
    failed.locator(".run-manage").click()  # delete, with the confirmation
    expect(name).to_have_value("failed run")
    page.locator("#manage-delete").click()
    expect(page.locator("#manage-confirm-text")).to_contain_text(f"Really delete run #{ids['failed']}")
    expect(page.locator("#manage-delete")).to_be_hidden()
    page.locator("#manage-keep").click()  # not yet
    expect(page.locator("#manage-delete")).to_be_visible()
    expect(rows).to_have_count(3)
    page.locator("#manage-delete").click()
    page.locator("#manage-confirm-delete").click()
    expect(page.locator("#manage-message")).to_contain_text(f"Deleted run #{ids['failed']} and its data.")
    expect(rows).to_have_count(2)
    expect(failed).to_have_count(0)

    page.locator(f'#runs-table tr[data-run-id="{ids["running"]}"] .run-manage').click()  # a running run: refused
    expect(name).to_have_value("running run")  # the Manage area holds it before Delete is asked
    page.locator("#manage-delete").click()
    expect(page.locator("#manage-message")).to_contain_text("is running: cancel it first")

    completed.locator(".run-name").click()  # a click on a row opens its run in the Run tab
    expect(page.locator("#run-select input").first).to_have_value(f"#{ids['completed']} best run so far (completed)")
    expect(page.locator("#tab-run")).to_be_visible()
    line = page.locator("#run-config .content").filter(has_text='"question_template"')
    expect(line.locator(".value")).to_contain_text("Let's think step by step")
    line.scroll_into_view_if_needed()
    whole, value = line.bounding_box(), line.locator(".value").bounding_box()
    assert value["height"] > 20 and abs(whole["height"] - value["height"]) < 2  # its comma ends its last line
    line.screenshot(path=str(ROOT / "test-artifacts" / "run-config-long-string.png"))


# every text the Run tab's progress shows from now on, in window.progressShown
WATCH_PROGRESS = """() => {
  window.progressShown = [];
  new MutationObserver(() => {
    const text = document.querySelector('#run-progress')?.textContent.trim();
    if (text && text !== window.progressShown.at(-1)) window.progressShown.push(text);
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def _seed_two_runs_with_groups(db_url: str, steps: int) -> tuple[int, int]:
    """Two completed runs, each with a group at every step 1..``steps``; returns their ids (the older first)."""
    tokens = ["1", "+", "1"]
    samples = [
        SampleRecord(
            completion="1+1",
            tokens=tokens,
            reward=float(i % 2),
            advantages=[i % 2 - 0.5] * 3,
            reward_components={"correct": float(i % 2)},
        )
        for i in range(4)
    ]
    ids = []
    with session_scope(db_url) as s:
        for name in ("older", "newest"):
            run_id = store.create_run(s, {**SPEC, "name": name, "steps_per_iteration": steps}, name)
            for step in range(1, steps + 1):
                store.record_step(s, run_id, step, 1, {"reward_mean": 0.5})
                store.record_groups(s, run_id, step, [GroupRecord("1+1", "2", samples).to_dict()])
            s.execute(update(Run).where(Run.id == run_id).values(status="completed", step=steps))
            ids.append(run_id)
    return ids[0], ids[1]


@pytest.mark.slow
@pytest.mark.browser
def test_deleting_the_newest_run_and_launching_again_keeps_the_page_consistent(tmp_path):
    """The newest run, open in the Run and Groups tabs at its last step, is deleted; a run launched next gets a
    new id, both tabs show it, no error toast appears and the server logs no refused value."""
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")  # the new run stays queued: what is drawn is the point
    upgrade_database(env["GRPO_DATABASE_URL"])
    older, newest = _seed_two_runs_with_groups(env["GRPO_DATABASE_URL"], steps=12)
    try:
        with running_server(tmp_path, env) as (url, _, log_path), browser_page() as page:
            page.goto(url)
            run_picker = page.locator("#run-select input").first
            groups_picker = page.locator("#groups-run-select input").first
            page.locator("#tab-groups-button").click()
            expect(groups_picker).to_have_value(f"#{newest} newest (completed)")
            expect(page.locator("#group-step")).to_contain_text("12 recorded")

            page.locator("#tab-runs-button").click()
            page.locator(f'#runs-table tr[data-run-id="{newest}"] .run-manage').click()
            expect(page.locator("#manage-run input")).to_have_value(re.compile(rf"^#{newest} "))  # the area holds it
            page.locator("#manage-delete").click()
            page.locator("#manage-confirm-delete").click()
            expect(page.locator("#manage-message")).to_contain_text(f"Deleted run #{newest} and its data.")
            page.wait_for_timeout(1_500)  # the emptied Manage picker's reload has come and gone
            expect(page.locator("#manage-message")).to_contain_text(f"Deleted run #{newest} and its data.")
            expect(groups_picker).to_have_value(f"#{older} older (completed)")  # the pickers move to what is left

            page.locator("#tab-launch-button").click()
            page.evaluate(WATCH_PROGRESS)
            page.locator("#launch-button").click()
            launched = newest + 1  # never the deleted run's id
            expect(page.locator("#launch-result")).to_contain_text(f"Launched run {launched}")
            expect(run_picker).to_have_value(re.compile(rf"^#{launched} "))
            expect(page.locator("#run-progress")).to_contain_text("queued")
            page.wait_for_timeout(2_500)  # a tick of the timer
            shown = page.evaluate("window.progressShown")
            assert shown and not [text for text in shown if "No run selected" in text], shown
            page.locator("#tab-groups-button").click()
            expect(groups_picker).to_have_value(re.compile(rf"^#{launched} "))
            expect(page.locator("#group-step")).to_contain_text("no groups recorded yet")
            page.wait_for_timeout(3_000)  # a tick or two of the timer
            (ROOT / "test-artifacts").mkdir(exist_ok=True)
            page.screenshot(path=str(ROOT / "test-artifacts" / "after-delete-and-launch.png"), full_page=True)
            expect(page.locator(".toast-body")).to_have_count(0)
            log = log_path.read_text(errors="replace")
            for refused in ("is not in the list of choices", "greater than maximum", "less than minimum"):
                assert refused not in log, log[-5000:]
    finally:
        make_engine(env["GRPO_DATABASE_URL"]).dispose()


@pytest.mark.slow
@pytest.mark.browser
def test_the_first_run_launched_is_shown_from_the_first_moment(tmp_path):
    """On an empty store the Run tab says "No run selected."; once Launch opens it on run 1, it never says so
    again, and its badge agrees with the picker."""
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")
    with running_server(tmp_path, env) as (url, _, _), browser_page() as page:
        page.goto(url)
        page.locator("#tab-run-button").click()
        expect(page.locator("#run-progress")).to_contain_text("No run selected.")
        page.locator("#tab-launch-button").click()
        page.evaluate(WATCH_PROGRESS)
        page.locator("#launch-button").click()
        expect(page.locator("#run-select input").first).to_have_value(re.compile(r"^#1 .*\(queued\)$"))
        expect(page.locator("#run-progress .badge")).to_have_text("queued")
        page.wait_for_timeout(4_500)  # two ticks of the timer
        shown = page.evaluate("window.progressShown")
        first = next(i for i, text in enumerate(shown) if "#1" in text)
        assert not [text for text in shown[first:] if "No run selected" in text], shown


@pytest.mark.slow
@pytest.mark.browser
def test_a_short_runs_badge_says_too_few_steps_and_a_cut_output_is_marked(tmp_path):
    """A run with two steps recorded: its health badge says "too few steps yet", not "no warnings"; its latest
    group has an output cut at max_new_tokens, and that output's card says so, in view, at 1280 x 900 and
    1600 x 1000 (screenshots too-few-WIDTH.png and cut-card-WIDTH.png)."""
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")
    upgrade_database(env["GRPO_DATABASE_URL"])
    tokens = ["6", "*", "7", "=", "4"]
    samples = [
        SampleRecord(
            completion="6*7=4",
            tokens=tokens,
            reward=0.0,
            advantages=[0.0] * 5,
            truncated=i == 0,
            reward_components={"correct": 0.0},
        )
        for i in range(4)
    ]
    with session_scope(env["GRPO_DATABASE_URL"]) as s:
        run_id = store.create_run(s, {**SPEC, "name": "short"}, "short")
        for step in (1, 2):
            store.record_step(s, run_id, step, 1, {"reward_mean": 0.0, "zero_std_frac": 1.0, "truncated_frac": 0.25})
            store.record_groups(s, run_id, step, [GroupRecord("6*7", "42", samples).to_dict()])
        s.execute(update(Run).where(Run.id == run_id).values(status="completed", step=2))
    make_engine(env["GRPO_DATABASE_URL"]).dispose()
    with running_server(tmp_path, env) as (url, _, _), browser_page() as page:
        page.goto(url)
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        for width, height in ((1280, 900), (1600, 1000)):
            page.set_viewport_size({"width": width, "height": height})
            page.locator("#tab-run-button").click()
            badge = page.locator('#run-health .health[data-state="too-few"]')
            expect(badge).to_contain_text("too few steps yet (2 training steps; the first rules read 5, the others 10)")
            expect(badge).to_be_in_viewport()
            expect(page.locator("#run-charts .main-svg").first).to_be_visible()
            page.wait_for_timeout(500)  # a window made wider: the charts follow its width
            drawn, box = page.evaluate(COMPARE_WIDTHS.replace("compare-charts", "run-charts"))
            assert drawn > 0.9 * box, (drawn, box)
            page.screenshot(path=str(ROOT / "test-artifacts" / f"too-few-{width}.png"))
            page.locator("#tab-groups-button").click()
            cards = page.locator("#group-view .sample")
            expect(cards).to_have_count(4)
            cut = page.locator("#group-view .sample .cut")
            expect(cut).to_have_count(1)  # only the output that was cut
            expect(cut).to_have_text("cut at max_new_tokens")
            cut.scroll_into_view_if_needed()
            expect(cut).to_be_in_viewport()
            page.screenshot(path=str(ROOT / "test-artifacts" / f"cut-card-{width}.png"))


@pytest.mark.slow
@pytest.mark.browser
def test_compare_keeps_its_full_width_after_a_compared_run_is_deleted(tmp_path):
    """Three runs compared; the newest is deleted from the Runs tab, which redraws the Compare chart while its tab
    is hidden; back on Compare, the chart fills its box (not plotly's default 700 px), at 1600 x 1000, and its
    config table says the configs are the same (screenshot compare-after-delete.png). Before any run is picked, the tab
    says to pick runs and draws no empty chart frame, at 1280 and 1600 px (compare-empty-<width>.png). A row's Manage
    opens the Manage area, drawn folded with the tab, on that run."""
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")
    upgrade_database(env["GRPO_DATABASE_URL"])
    _seed_two_runs_with_groups(env["GRPO_DATABASE_URL"], steps=20)
    _, newest = _seed_two_runs_with_groups(env["GRPO_DATABASE_URL"], steps=20)
    make_engine(env["GRPO_DATABASE_URL"]).dispose()
    with running_server(tmp_path, env) as (url, _, _), browser_page(1600, 1000) as page:
        page.goto(url)
        page.locator("#tab-compare-button").click()
        for width, height in ((1280, 900), (1600, 1000)):  # no runs picked: what to do, and no empty chart frame
            page.set_viewport_size({"width": width, "height": height})
            expect(page.locator("#compare-config")).to_have_text("Pick runs to compare.")
            expect(page.locator("#compare-charts")).to_be_hidden()
            page.screenshot(path=str(ROOT / "test-artifacts" / f"compare-empty-{width}.png"))
        for run_id in (1, 2, newest):
            page.locator("#compare-runs input").first.click()
            page.get_by_role("option", name=re.compile(rf"^#{run_id} ")).click()
        page.keyboard.press("Escape")
        expect(page.locator("#compare-charts .main-svg").first).to_be_visible()
        drawn, box = page.evaluate(COMPARE_WIDTHS)
        assert drawn > 0.9 * box > 1000

        page.locator("#tab-runs-button").click()
        expect(page.locator("#manage-name")).to_have_count(1)  # the Manage area is drawn with its tab, folded
        expect(page.locator("#manage-name")).to_be_hidden()
        page.locator(f'#runs-table tr[data-run-id="{newest}"] .run-manage').click()
        expect(page.locator("#manage-run input")).to_have_value(re.compile(rf"^#{newest} "))  # opened on its run
        page.locator("#manage-delete").click()
        page.locator("#manage-confirm-delete").click()
        expect(page.locator("#manage-message")).to_contain_text(f"Deleted run #{newest}")
        page.wait_for_timeout(1_000)  # the Compare picker drops it: the chart is drawn again, hidden
        page.locator("#tab-compare-button").click()
        expect(page.locator("#compare-runs")).not_to_contain_text(f"#{newest} ")
        page.wait_for_timeout(500)
        drawn, box = page.evaluate(COMPARE_WIDTHS)
        assert drawn > 0.9 * box, (drawn, box)
        expect(page.locator("#compare-config .diff-note")).to_have_text("The configs are the same.")
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "test-artifacts" / "compare-after-delete.png"), full_page=True)
