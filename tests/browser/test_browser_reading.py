"""The verifier's reading in a real browser (Chromium through Playwright), at 1280 x 900 and 1600 x 1000: each card of
the Groups tab says the answer the verifier read, the rule that read it in words and each reward component's value,
inside its card; Find samples lists the same reading and components beside each verdict.

The group is the issue's: two outputs whose last line is a run of hashes or prose after them, read under 'flexible'
by their last number (no format reward paid), one stated in the strict form, one with no number at all, and one
recorded without its reading. The server runs without a worker; the group is written into its store from this
process, the way a worker writes it. Screenshots: test-artifacts/reading-card-WIDTH.png, reading-find-WIDTH.png.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from app import store
from app.store.db import make_engine, session_scope, upgrade_database
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from grpo_engine.rewards.rewards import final_answer, outcome_reward
from grpo_engine.spec.config import validate_spec
from tests.support.servers import ROOT, browser_page, running_server, server_env

SPEC = {"answer_match": "flexible", "format_reward": 0.1}
EVA = "Eva had 8 stickers and gave 5 to her brother, so 8 - 5 = 3 stickers left."
TEXTS = [
    f"{EVA}\n######## Eva ended up with 3 stickers without surrendering!\n########",
    f"{EVA}\n######## Eva has 3 stickers left",
    f"{EVA}\n#### 3",
    "Eva gave some away, so she has fewer stickers now.",
]
READS = [  # what each card says of the verifier's reading, in order (the last sample has none recorded)
    "verifier read 3 · by flexible last number",
    "verifier read 3 · by flexible last number",
    "verifier read 3 · by strict ####",
    "verifier read no final answer (rule: none)",
    "verifier's reading: not recorded",
]


def _samples() -> list[SampleRecord]:
    samples = []
    for text in TEXTS:
        reward, components = outcome_reward(text, "3", 0.1, "flexible")
        answer, rule = final_answer(text, "flexible")
        tokens = text.split(" ")
        tokens = [t + " " for t in tokens[:-1]] + tokens[-1:]
        advantages = [reward - 0.6] * len(tokens)
        samples.append(
            SampleRecord(
                text, tokens, reward, advantages, reward_components=components, answer=answer, answer_rule=rule
            )
        )
    samples.append(SampleRecord("3", ["3"], 0.0, [-0.6], reward_components={"correct": 0.0, "formatted": 0.0}))
    return samples


@pytest.mark.slow
@pytest.mark.browser
def test_each_card_and_each_found_sample_shows_the_verifiers_reading(tmp_path):
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")
    url_db = env["GRPO_DATABASE_URL"]
    upgrade_database(url_db)
    with session_scope(url_db) as s:
        run_id = store.create_run(s, validate_spec({**SPEC, "name": "reading"}).to_dict(), "reading")
        store.record_groups(s, run_id, 1, [GroupRecord("How many stickers does Eva have?", "3", _samples()).to_dict()])
    make_engine(url_db).dispose()
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with running_server(tmp_path, env) as (url, _, _), browser_page() as page:
        page.goto(url)
        page.locator("#tab-groups-button").click()
        cards = page.locator("#group-view .sample")
        expect(cards).to_have_count(len(READS))
        for i, words in enumerate(READS):
            expect(cards.nth(i).locator(".reading")).to_have_text(words)
        # the first output: read 3 by its last number, right; no strict form, so no format reward
        verdicts = cards.nth(0).locator(".verdicts")
        expect(verdicts).to_contain_text("correct 1 ✓")
        expect(verdicts).to_contain_text("formatted 0 (no #### or \\boxed)")
        expect(verdicts).to_contain_text("format reward +0")
        expect(cards.nth(2).locator(".verdicts")).to_contain_text("format reward +0.1")
        for width, height in ((1280, 900), (1600, 1000)):
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(300)
            assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing overflows sideways
            for i in range(len(READS)):  # the reading and the components stay inside their card
                card = cards.nth(i).bounding_box()
                for part in (".reading", ".verdicts"):
                    box = cards.nth(i).locator(part).bounding_box()
                    assert card["x"] <= box["x"] and box["x"] + box["width"] <= card["x"] + card["width"] + 0.5
                    assert cards.nth(i).locator(part).evaluate("e => e.scrollWidth <= e.clientWidth + 1"), (i, part)
            cards.first.scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / f"reading-card-{width}.png"))

            # Find samples: outputs with no answer found under the run's rule, then all, each with its reading
            page.locator("#find-samples").get_by_text("Find samples").first.click()
            page.locator("#find-button").click()
            expect(page.locator("#find-samples .find-pager")).to_contain_text(f"({len(READS)} samples found)")
            reads = page.locator('#find-results [role="gridcell"][data-col="5"]')
            expect(reads.first).to_have_text("3 (flexible last number)")
            assert [r.inner_text().strip() for r in reads.all()] == [
                "3 (flexible last number)",
                "3 (flexible last number)",
                "3 (strict ####)",
                "none read",
                "not recorded",
            ]
            components = page.locator('#find-results [role="gridcell"][data-col="6"]')
            expect(components.first).to_have_text("correct\xa01 · formatted\xa00 · format\xa00")
            verdict_cells = page.locator('#find-results [role="gridcell"][data-col="4"]')
            assert [v.inner_text().strip() for v in verdict_cells.all()] == ["✓", "✓", "✓", "no answer", "no answer"]
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            page.locator("#find-results").scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / f"reading-find-{width}.png"))
            page.locator("#find-samples").get_by_text("Find samples").first.click()  # folded again
