"""The Runs tab in a real browser (Chromium through Playwright): coloured status badges, the phase of a running
run, the search filter, renaming a run and deleting one after the confirmation, and a row opening its run.

The server runs without a worker; runs are written into its store from this process, the way a worker
writes them. A screenshot goes to test-artifacts/runs-tab.png.
"""
from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright
from sqlalchemy import update

from app import store
from app.db import make_engine, session_scope, upgrade_database
from app.models import Run
from tests.servers import ROOT, running_server, server_env

CHROMIUM = "/usr/bin/chromium"
SPEC = {"model": "builtin-arith", "dataset": "builtin-arith", "supervision": "outcome", "iterations": 1,
        "steps_per_iteration": 10, "device": "auto"}
BADGE_COLOURS = {"completed": "rgb(21, 128, 61)", "failed": "rgb(185, 28, 28)", "running": "rgb(37, 99, 235)"}


def _seed(db_url: str) -> dict[str, int]:
    """Three runs, one per status of BADGE_COLOURS; the running one reports a phase. Returns status -> run id."""
    ids = {}
    with session_scope(db_url) as s:
        for status in BADGE_COLOURS:
            run_id = store.create_run(s, {**SPEC, "name": f"{status} run"}, f"{status} run")
            store.record_step(s, run_id, 1, 1, {"reward_mean": 0.5, "correct_frac": 0.25})
            phase = ("building built-in model", 400, 900) if status == "running" else (None, None, None)
            s.execute(update(Run).where(Run.id == run_id).values(status=status, phase=phase[0], phase_done=phase[1],
                                                                 phase_total=phase[2]))
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
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
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
        "building built-in model 400/900")
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "test-artifacts" / "runs-tab.png"), full_page=True)

    page.locator("#runs-search textarea, #runs-search input").first.fill("fail")  # the search narrows the table
    expect(rows).to_have_count(1)
    page.locator("#runs-search textarea, #runs-search input").first.fill("")
    expect(rows).to_have_count(3)

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
    page.locator("#manage-delete").click()
    expect(page.locator("#manage-message")).to_contain_text("is running: cancel it first")

    completed.locator(".run-name").click()  # a click on a row opens its run in the Run tab
    expect(page.locator("#run-select input").first).to_have_value(f"#{ids['completed']} best run so far (completed)")
    expect(page.locator("#tab-run")).to_be_visible()
