"""An open dashboard page with nothing running does no work in the browser (Chromium through Playwright): no
animation-frame loop runs once the page is up (Gradio's loading timer, ended by app.web.ui.HEAD_JS), the timer ticks
every IDLE_REFRESH_SECONDS, and no tick redraws anything. bench/idle_cpu.py measures what that costs."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from app import store
from app.store.db import make_engine, session_scope, upgrade_database
from app.store.models import Run
from app.web.tabs.shared import IDLE_REFRESH_SECONDS
from grpo_engine.spec.config import validate_spec
from tests.support.servers import browser_page, running_server, server_env

# before any page script: counts the animation frames run, the queue calls sent and the changes to the page (but
# Gradio's screen-reader line, which announces each finished event)
COUNTERS_JS = """
window.idle = {frames: 0, joins: 0, redraws: 0};
const raf = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = (cb) => raf((t) => { window.idle.frames++; cb(t); });
const fetch0 = window.fetch.bind(window);
window.fetch = (url, ...rest) => { if (String(url).includes('/queue/join')) window.idle.joins++; return fetch0(url, ...rest); };
document.addEventListener('DOMContentLoaded', () => {
  new MutationObserver((changes) => {
    window.idle.redraws += changes.filter((c) => !(c.target.parentElement || c.target).closest('.sr-only')).length;
  })
    .observe(document.body, {subtree: true, childList: true, characterData: true});
});
"""


def settle(page, quiet_ms=2_000, limit_s=30):
    """Waits until the page has drawn what opening the Run tab asked for: no change for quiet_ms, at most limit_s (a
    loaded machine answers the tab's first calls late; a page that never settles fails the assertions after)."""
    for _ in range(int(limit_s * 1000 / quiet_ms)):
        page.evaluate("() => { window.idle.redraws = 0; }")
        page.wait_for_timeout(quiet_ms)
        if page.evaluate("window.idle.redraws") == 0:
            return


@pytest.mark.slow
@pytest.mark.browser
def test_an_idle_page_runs_no_frame_loop_and_redraws_nothing(tmp_path):
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")
    upgrade_database(env["GRPO_DATABASE_URL"])
    with session_scope(env["GRPO_DATABASE_URL"]) as s:
        run_id = store.create_run(s, validate_spec({"steps_per_iteration": 2}).to_dict(), "done")
        for step in (1, 2):
            store.record_step(s, run_id, step, 1, {"reward_mean": 0.5, "kl": 1e-4})
        s.execute(update(Run).where(Run.id == run_id).values(status="completed", step=2))
    make_engine(env["GRPO_DATABASE_URL"]).dispose()
    with running_server(tmp_path, env) as (url, _, _), browser_page() as page:
        page.add_init_script(COUNTERS_JS)
        page.goto(url)
        page.wait_for_selector("#runs-table tr.run-row")
        page.locator("#tab-run-button").click()
        page.wait_for_selector("#run-progress .run-progress")
        settle(page)
        page.evaluate("() => { window.idle.frames = 0; window.idle.joins = 0; window.idle.redraws = 0; }")
        page.wait_for_timeout(IDLE_REFRESH_SECONDS * 1000 + 500)
        idle = page.evaluate("window.idle")
    assert idle["frames"] < 200, idle  # a tick draws a few dozen; a frame loop would draw 60 a second, 630 here
    assert 1 <= idle["joins"] <= 2, idle  # the idle period's tick, not the running one's five
    assert idle["redraws"] == 0, idle
