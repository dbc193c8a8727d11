"""A process sample step by step (app/service/step_detail.py): each step's text, the rules' label and share, the learned
PRM's score and the normalised reward; stored (samples.step_labels / step_shares, migration 0005) on SQLite and
PostgreSQL, returned by /get_group (app.service.api.get_group) and drawn as the Groups tab's step table (app.web.views.run)."""

from __future__ import annotations

import html
import math
import re

import pytest
from alembic import command
from sqlalchemy import inspect

from app import store
from app.service import api
from app.service.step_detail import step_details
from app.store.db import alembic_config, make_engine, session_scope, upgrade_database
from app.web.views.group import group_html
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from tests.support.store import new_run

STD = math.sqrt(0.24)  # the step rewards {1, 0, 1, 1, 0}: mean 0.6, population variance (3 x 0.16 + 2 x 0.36) / 5
UP, DOWN = 0.4 / STD, -0.6 / STD  # a reward of 1 and of 0, normalised: +0.8165 and -1.2247


def hand_samples() -> list[dict]:
    """Two process samples, as the store returns them: step rewards [1, 0] and [1, 1, 0], and the advantages the
    engine gives them (each token: the sum of the normalised rewards of its step and the later ones)."""
    first = {
        "sample_id": 1,
        "completion": "2+2=4\n4<eos>",
        "tokens": ["2", "+2", "=4", "\n", "4", "<eos>"],
        "reward": 0.5,
        "advantages": [UP + DOWN] * 4 + [DOWN, 0.0],
        "step_rewards": [1.0, 0.0],
        "step_end_indices": [3, 4],
        "step_labels": [1.0, 0.0],
        "step_shares": [0.75, 0.0],
        "reward_components": {"correct": 0.0},
    }
    second = {
        "sample_id": 2,
        "completion": "a<b\nc\nd",
        "tokens": ["a<b", "\n", "c", "\n", "d"],
        "reward": 2 / 3,
        "advantages": [2 * UP + DOWN] * 2 + [UP + DOWN] * 2 + [DOWN],
        "step_rewards": [1.0, 1.0, 0.0],
        "step_end_indices": [1, 3, 4],
        "step_labels": None,
        "step_shares": None,
        "reward_components": {},
    }
    return [first, second]


# ---- the pure function, on hand numbers ---------------------------------------------------------


def test_steps_on_hand_numbers():
    first, second = step_details(hand_samples(), prm=False)
    assert [s["text"] for s in first] == ["2+2=4", "4"] and [s["text"] for s in second] == ["a<b", "c", "d"]
    assert [s["index"] for s in second] == [0, 1, 2]
    assert [(s["label"], s["share"]) for s in first] == [(1.0, 0.75), (0.0, 0.0)]
    assert all(s["label"] is None and s["share"] is None and s["prm_score"] is None for s in second)
    assert [s["reward"] for s in first + second] == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert [s["normalised"] for s in first + second] == pytest.approx([UP, DOWN, UP, UP, DOWN])
    assert UP == pytest.approx(0.8165, abs=1e-4) and DOWN == pytest.approx(-1.2247, abs=1e-4)


def test_a_learned_prm_scores_are_the_step_rewards():
    samples = hand_samples()
    # {1, 0, 0.9, 0.6, 0.3}: mean 0.56; squared deviations 0.1936 + 0.3136 + 0.1156 + 0.0016 + 0.0676 = 0.692,
    # population variance 0.1384, std 0.37202; the last score normalises to -0.26 / 0.37202 = -0.6989
    samples[1]["step_rewards"] = [0.9, 0.6, 0.3]
    for sample in samples:  # no advantages to read the trained rewards from: the group's normalisation is recomputed
        sample["advantages"] = []
    first, second = step_details(samples, prm=True)
    assert [s["prm_score"] for s in first + second] == [1.0, 0.0, 0.9, 0.6, 0.3]
    assert [s["label"] for s in first] == [1.0, 0.0]  # the checker's verdicts beside the PRM's scores
    assert second[2]["normalised"] == pytest.approx(-0.26 / math.sqrt(0.1384)) == pytest.approx(-0.6989, abs=1e-4)


def test_the_normalised_rewards_are_those_trained_with_whatever_the_scaling():
    # scale_rewards 'none': rewards minus the group's mean (0.6), not divided by the std
    samples = hand_samples()
    samples[0]["advantages"] = [0.4 - 0.6] * 4 + [-0.6, 0.0]
    samples[1]["advantages"] = [0.4 + 0.4 - 0.6] * 2 + [0.4 - 0.6] * 2 + [-0.6]
    first, second = step_details(samples, prm=False)
    assert [s["normalised"] for s in first + second] == pytest.approx([0.4, -0.6, 0.4, 0.4, -0.6])


def test_equal_step_rewards_normalise_to_zero_and_outcome_samples_have_no_steps():
    same = [{"tokens": ["a", "\n", "b"], "step_end_indices": [1, 2], "step_rewards": [1.0, 1.0]}]
    assert [s["normalised"] for s in step_details(same, prm=False)[0]] == [0.0, 0.0]
    assert step_details([{"tokens": ["4", "<eos>"], "step_end_indices": None, "step_rewards": None}], prm=False) == [[]]


# ---- the store and /get_group on SQLite and PostgreSQL ------------------------------------------


def labelled_group() -> dict:
    """A GroupRecord dict through the engine's own records: rollout labels, a soft label, and a sample without."""
    samples = [
        SampleRecord(
            completion="1\n2",
            tokens=["1", "\n", "2"],
            reward=0.5,
            advantages=[UP + DOWN] * 2 + [DOWN],
            step_rewards=[1.0, 0.0],
            step_end_indices=[1, 2],
            step_labels=[1.0, 0.0],
            step_shares=[0.75, 0.0],
        ),
        SampleRecord(
            completion="x\ny",
            tokens=["x", "\n", "y"],
            reward=1.0,
            advantages=[2 * UP] * 2 + [UP],
            step_rewards=[1.0, 1.0],
            step_end_indices=[1, 2],
            step_labels=[1 / 3, 1.0],
            step_shares=[1 / 3, 1.0],
        ),
        SampleRecord(
            completion="z", tokens=["z"], reward=0.0, advantages=[DOWN], step_rewards=[0.0], step_end_indices=[0]
        ),  # not labelled by rules: both stay None
    ]
    return GroupRecord(prompt="1+1?", reference="2", samples=samples).to_dict()


def test_step_labels_and_shares_round_trip(db_url):
    run_id = new_run(db_url, supervision="process")
    sent = labelled_group()
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [sent])
    with session_scope(db_url) as s:
        got = store.get_group(s, store.list_groups(s, run_id, 1)[0]["group_id"])
        rows = list(store.iter_sample_rows(s, run_id))
    for a, b in zip(sent["samples"], got["samples"], strict=True):
        assert (b["step_labels"], b["step_shares"]) == (a["step_labels"], a["step_shares"])
    assert got["samples"][1]["step_labels"][0].hex() == (1 / 3).hex()  # bit for bit
    assert got["samples"][2]["step_labels"] is None and got["samples"][2]["step_shares"] is None
    assert [r["step_shares"] for r in rows] == [[0.75, 0.0], [1 / 3, 1.0], None]
    assert {"step_labels", "step_shares"} <= set(store.EXPORT_COLUMNS)


@pytest.mark.parametrize("reward", ["rule", "model"])
def test_get_group_returns_each_step(db_url, monkeypatch, reward):
    monkeypatch.setenv("GRPO_DATABASE_URL", db_url)
    run_id = new_run(
        db_url, supervision="process", reward=reward, step_labels="rollouts", label_rollouts=4, dataset="builtin-arith"
    )
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [labelled_group()])
        group_id = store.list_groups(s, run_id, 1)[0]["group_id"]
    group = api.get_group(group_id)
    assert group["step_label_rule"] == "rollouts, N=4, hard estimate"
    assert group["step_labels"] == ("the learned PRM's scores" if reward == "model" else group["step_label_rule"])
    first = group["samples"][0]
    assert first["step_labels"] == [1.0, 0.0] and first["step_shares"] == [0.75, 0.0]
    # the step rewards {1, 0, 1, 1, 0}: mean 0.6, population std sqrt(0.24)
    assert first["steps"] == [
        {
            "index": 0,
            "text": "1",
            "label": 1.0,
            "share": 0.75,
            "prm_score": 1.0 if reward == "model" else None,
            "reward": 1.0,
            "normalised": pytest.approx(UP),
        },
        {
            "index": 1,
            "text": "2",
            "label": 0.0,
            "share": 0.0,
            "prm_score": 0.0 if reward == "model" else None,
            "reward": 0.0,
            "normalised": pytest.approx(DOWN),
        },
    ]
    assert group["samples"][2]["steps"][0]["label"] is None and group["samples"][2]["step_labels"] is None


def test_outcome_groups_have_no_steps(db_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", db_url)
    run_id = new_run(db_url)
    sample = SampleRecord(completion="4", tokens=["4"], reward=1.0, advantages=[0.0])
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [GroupRecord(prompt="2+2", reference="4", samples=[sample]).to_dict()])
        group_id = store.list_groups(s, run_id, 1)[0]["group_id"]
    group = api.get_group(group_id)
    assert group["step_label_rule"] is None and group["step_labels"] is None
    (got,) = group["samples"]
    assert (got["steps"], got["step_labels"], got["step_shares"]) == ([], None, None)


# ---- migration 0005 -------------------------------------------------------------------------------


def test_migration_0005_adds_and_drops_the_columns(db_url):
    run_id = new_run(db_url, supervision="process")
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, 1, [labelled_group()])
    engine = make_engine(db_url)

    def columns() -> set[str]:
        engine.dispose()  # drop cached connections (and their cached schema) between DDL runs
        return {c["name"] for c in inspect(engine).get_columns("samples")}

    assert {"step_labels", "step_shares"} <= columns()
    command.downgrade(alembic_config(db_url), "0004")
    assert not {"step_labels", "step_shares"} & columns() and "step_rewards" in columns()
    upgrade_database(db_url)
    assert {"step_labels", "step_shares"} <= columns()
    with session_scope(db_url) as s:  # the samples kept; labels recorded before the revision read as None
        got = store.get_group(s, store.list_groups(s, run_id, 1)[0]["group_id"])
    assert [x["step_rewards"] for x in got["samples"]] == [[1.0, 0.0], [1.0, 1.0], [0.0]]
    assert all(x["step_labels"] is None and x["step_shares"] is None for x in got["samples"])
    engine.dispose()


# ---- the Groups tab's step table ------------------------------------------------------------------


def group_dict(samples: list[dict], prm: bool, rule: str) -> dict:
    """A /get_group answer: the samples with their steps."""
    steps = step_details(samples, prm)
    return {
        "group_id": 5,
        "run_id": 1,
        "step": 2,
        "prompt": "q",
        "reference": "4",
        "step_labels": "the learned PRM's scores" if prm else rule,
        "step_label_rule": rule,
        "samples": [{**s, "steps": st} for s, st in zip(samples, steps, strict=True)],
    }


def table_rows(page: str, sample_id: int) -> list[list[str]]:
    """The step table of one sample: its rows' cells as plain text (the header row first)."""
    card = page.split(f'data-sample-id="{sample_id}"', 1)[1].split('class="sample"', 1)[0]
    table = card.split('<table class="step-table">', 1)[1].split("</table>", 1)[0]
    return [
        [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table)
    ]


def test_a_rule_runs_step_table():
    page = group_html(group_dict(hand_samples(), prm=False, rule="rollouts, N=4, hard estimate"))
    assert page.count('<details class="steps" open>') == 2 and 'class="samples process"' in page
    assert table_rows(page, 1) == [
        ["step", "text", "label", "reward (normalised)"],
        ["1", "2+2=4", "1 · 0.75", "+1.00 (+0.82)"],
        ["2", "4", "0", "+0.00 (-1.22)"],
    ]
    # no labels recorded: no label column; the step text is escaped
    assert table_rows(page, 2) == [
        ["step", "text", "reward (normalised)"],
        ["1", "a<b", "+1.00 (+0.82)"],
        ["2", "c", "+1.00 (+0.82)"],
        ["3", "d", "+0.00 (-1.22)"],
    ]
    assert '<td class="text">a&lt;b</td>' in page and "a<b" not in page and "PRM score" not in page
    # the step mark's tooltip carries the label and the share
    assert (
        'data-tip="step 1: reward +1.000 from rollouts, N=4, hard estimate; normalised +0.816; label 1; '
        'share reaching the answer 0.75"'
    ) in page


def test_a_prm_runs_step_table_sets_the_checker_beside_the_prm():
    samples = hand_samples()
    samples[0]["step_rewards"], samples[0]["step_shares"] = [0.875, 0.125], None  # the PRM's scores; 'builtin' labels
    page = group_html(group_dict(samples, prm=True, rule="the built-in task's exact step checker"))
    assert "3 steps</summary>" in page  # no labels recorded for the second sample: no rule named above its table
    rule = html.escape("the built-in task's exact step checker")
    assert f'2 steps · labels by <span class="src">{rule}</span>' in page
    assert table_rows(page, 1)[0] == ["step", "text", "label", "PRM score", "reward (normalised)"]
    assert [row[2:4] for row in table_rows(page, 1)[1:]] == [["1", "0.875"], ["0", "0.125"]]
    assert table_rows(page, 2)[0] == ["step", "text", "PRM score", "reward (normalised)"]
    assert [row[2] for row in table_rows(page, 2)[1:]] == ["1.000", "1.000", "0.000"]
    assert "; label 0" in page and "share reaching" not in page


def test_groups_without_steps_keep_their_view():
    sample = {
        "sample_id": 1,
        "completion": "4",
        "tokens": ["4"],
        "reward": 1.0,
        "advantages": [0.0],
        "step_rewards": None,
        "step_end_indices": None,
        "reward_components": {},
    }
    page = group_html({"group_id": 1, "run_id": 1, "step": 1, "prompt": "q", "reference": "4", "samples": [sample]})
    assert "step-table" not in page and 'class="samples"' in page
