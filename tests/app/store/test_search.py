"""Finding samples across a run and one question through time (app.store.search, app.service.diagnose_api, the
``/search_samples`` and ``/question_history`` endpoints), on SQLite and PostgreSQL.

Run A records three steps of hand-made groups whose rewards, verdicts, lengths and truncation are known, so each
filter's answer is written out below by the completions it must return (every completion is unique in run A).
"""

from __future__ import annotations

import re

import pytest
from alembic import command
from gradio_client import Client
from gradio_client.exceptions import AppError
from sqlalchemy import event

from app import store
from app.service import diagnose_api
from app.service.api import ApiError
from app.store.db import alembic_config, make_engine, session_scope, upgrade_database
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from tests.support.servers import running_server, server_env
from tests.support.store import new_run

TWO = "What is 2+2?"
# per step: (question, [(completion, reward, correct, answer found, length, truncated), ...]) for each group
STEPS = {
    1: [
        (
            TWO,
            [
                ("The answer is 4", 1.0, True, True, 3, False),
                ("50% sure: 5", 0.0, False, True, 5, False),
                ("no idea at all", 0.0, False, False, 8, True),
            ],
        ),  # mixed, std 0.471
        ("What is 1+1?", [("2 it is", 1.0, True, True, 3, False), ("two: 2", 1.0, True, True, 4, False)]),
    ],  # 0
    2: [
        (TWO, [("4 again", 1.0, True, True, 2, False), ("5_x wrong", 0.2, False, True, 4, False)]),  # mixed, 0.4
        ("What is 3+3?", [("7 maybe", 0.0, False, True, 6, False), ("back\\slash", 0.5, False, False, 7, True)]),
    ],  # all_wrong, std 0.25
    3: [(TWO, [("4 at last", 1.0, True, True, 2, False), ("four is 4", 1.0, True, True, 3, False)])],  # all_right
}
ALL = [x[0] for step in STEPS.values() for _, samples in step for x in samples]  # by sample id


def group(question: str, samples: list[tuple]) -> dict:
    """A GroupRecord dict of hand-made samples: each verdict in reward_components, ``length`` tokens."""
    return GroupRecord(
        question,
        "4",
        [
            SampleRecord(
                completion=text,
                tokens=["t"] * length,
                reward=reward,
                advantages=[0.0] * length,
                reward_components={"correct": float(correct), "formatted": float(found)},
                truncated=truncated,
            )
            for text, reward, correct, found, length, truncated in samples
        ],
    ).to_dict()


def record(url: str, run_id: int, steps: dict[int, list]) -> None:
    with session_scope(url) as s:
        for step, groups in steps.items():
            store.record_groups(s, run_id, step, [group(q, samples) for q, samples in groups])


@pytest.fixture
def run_a(db_url):
    run_id = new_run(db_url, name="a")
    record(db_url, run_id, STEPS)
    return db_url, run_id


def found(url: str, run_id: int, **filters) -> list[str]:
    """The completions search_samples returns on one page of 200, in its order."""
    with session_scope(url) as s:
        result = store.search_samples(s, run_id, store.SampleQuery(page_size=200, **filters))
    assert result["total"] == len(result["rows"])
    return [r["completion"] for r in result["rows"]]


# ---- filters, sorts, paging -----------------------------------------------------------------------


FILTER_CASES = [  # (filters, the completions found, in order)
    ({}, ALL),
    ({"outcome": "correct"}, ["The answer is 4", "2 it is", "two: 2", "4 again", "4 at last", "four is 4"]),
    ({"outcome": "wrong"}, ["50% sure: 5", "5_x wrong", "7 maybe"]),
    ({"outcome": "no_answer"}, ["no idea at all", "back\\slash"]),
    ({"outcome": "truncated"}, ["no idea at all", "back\\slash"]),
    ({"reward_min": 0.1, "reward_max": 0.6}, ["5_x wrong", "back\\slash"]),
    ({"reward_min": 1.0}, ["The answer is 4", "2 it is", "two: 2", "4 again", "4 at last", "four is 4"]),
    ({"length_min": 4, "length_max": 6}, ["50% sure: 5", "two: 2", "5_x wrong", "7 maybe"]),
    ({"length_max": 2}, ["4 again", "4 at last"]),
    ({"step_min": 2, "step_max": 2}, ["4 again", "5_x wrong", "7 maybe", "back\\slash"]),
    ({"spread_min": 0.3}, ["The answer is 4", "50% sure: 5", "no idea at all", "4 again", "5_x wrong"]),
    ({"spread_min": 0.2, "spread_max": 0.3}, ["7 maybe", "back\\slash"]),
    ({"kind": "mixed"}, ["The answer is 4", "50% sure: 5", "no idea at all", "4 again", "5_x wrong"]),
    ({"kind": "all_wrong"}, ["7 maybe", "back\\slash"]),
    ({"kind": "all_right"}, ["2 it is", "two: 2", "4 at last", "four is 4"]),
    ({"kind": "zero_spread"}, ["2 it is", "two: 2", "4 at last", "four is 4"]),
    ({"contains": "%"}, ["50% sure: 5"]),  # the wildcards match only themselves
    ({"contains": "_"}, ["5_x wrong"]),
    ({"contains": "\\"}, ["back\\slash"]),
    ({"contains": "0%"}, ["50% sure: 5"]),
    ({"contains": "ANSWER"}, ["The answer is 4"]),  # case-insensitive
    ({"contains": "4"}, ["The answer is 4", "4 again", "4 at last", "four is 4"]),
    ({"contains": "nowhere"}, []),
    ({"outcome": "correct", "step_min": 2}, ["4 again", "4 at last", "four is 4"]),
    ({"outcome": "wrong", "kind": "mixed", "contains": "5"}, ["50% sure: 5", "5_x wrong"]),
    ({"kind": "mixed", "step_min": 2, "length_max": 3}, ["4 again"]),
    (
        {"spread_min": 0.01, "sort": "spread", "descending": True},
        ["no idea at all", "50% sure: 5", "The answer is 4", "5_x wrong", "4 again", "back\\slash", "7 maybe"],
    ),
]


def test_each_filter(run_a):
    for filters, expected in FILTER_CASES:  # one seeded run for all of them
        assert found(*run_a, **filters) == expected, filters


def test_a_row_says_what_the_sample_and_its_group_were(run_a):
    url, run_id = run_a
    with session_scope(url) as s:
        [row] = store.search_samples(s, run_id, store.SampleQuery(contains="50%"))["rows"]
        group_id = store.list_groups(s, run_id, 1)[0]["group_id"]
    assert row == {
        "sample_id": row["sample_id"],
        "group_id": group_id,
        "step": 1,
        "question": TWO,
        "completion": "50% sure: 5",
        "reward": 0.0,
        "correct": False,
        "answer_found": True,
        "answer": None,  # not recorded by this seed
        "answer_rule": None,
        "reward_components": {"correct": 0.0, "formatted": 1.0},
        "truncated": False,
        "length": 5,
        "spread": pytest.approx((2 / 9) ** 0.5),
        "kind": "mixed",
    }


def test_each_sort_with_the_sample_id_breaking_ties(run_a):
    url, run_id = run_a
    for sort, descending in [
        (sort, descending) for sort in ("step", "reward", "length", "spread") for descending in (False, True)
    ]:
        with session_scope(url) as s:
            rows = store.search_samples(s, run_id, store.SampleQuery(sort=sort, descending=descending))["rows"]
        keys = [(r[sort], r["sample_id"]) for r in rows]
        assert len(keys) == len(ALL) and keys == sorted(keys, reverse=descending), (sort, descending)
        assert len({r[sort] for r in rows}) > 1  # the order is not the ids' alone


def test_pages_cover_every_match_once(run_a):
    url, run_id = run_a
    with session_scope(url) as s:
        pages = [
            store.search_samples(s, run_id, store.SampleQuery(sort="reward", page=p, page_size=4)) for p in (1, 2, 3, 4)
        ]
        empty = store.search_samples(s, run_id, store.SampleQuery(contains="nowhere"))
    assert [(p["total"], p["pages"], p["page"], len(p["rows"])) for p in pages] == [
        (11, 3, 1, 4),
        (11, 3, 2, 4),
        (11, 3, 3, 3),
        (11, 3, 4, 0),
    ]
    ids = [r["sample_id"] for p in pages for r in p["rows"]]
    assert len(set(ids)) == len(ALL)
    assert (empty["total"], empty["pages"], empty["rows"]) == (0, 1, [])


def test_only_this_runs_samples_and_long_completions_cut(db_url):
    run_id, other = new_run(db_url, name="long"), new_run(db_url, name="other")
    record(db_url, run_id, {1: [("q", [("x" * 400, 1.0, True, True, 3, False)])]})
    record(db_url, other, {1: [("q", [("y", 1.0, True, True, 3, False)])]})
    [row] = found(db_url, run_id)
    assert row == "x" * 300 + "…"
    assert found(db_url, other) == ["y"]


# ---- one question through time --------------------------------------------------------------------


def test_question_history_in_this_run_and_others_on_its_dataset(run_a):
    url, a = run_a
    b, c = new_run(url, name="b"), new_run(url, name="c", dataset="openai/gsm8k")
    d = new_run(url, name="d")  # same dataset, never saw the question
    record(url, b, {4: [(TWO, [("4", 1.0, True, True, 1, False), ("3", 0.0, False, True, 1, False)])]})
    record(url, c, {1: [(TWO, [("4", 1.0, True, True, 1, False)])]})
    record(url, d, {1: [("What is 9+9?", [("18", 1.0, True, True, 2, False)])]})
    with session_scope(url) as s:
        store.set_archived(s, b, True)
        history = store.question_history(s, a, TWO)
        alone = store.question_history(s, a, TWO, other_runs=False)
        latest = store.question_history(s, a, TWO, max_groups=2)
        unseen = store.question_history(s, d, TWO)
        assert store.question_history(s, 99999, TWO) is None
    assert history["question"] == TWO and history["dataset"] == "builtin-arith"
    assert history["question_key"] == store.groups.question_key(TWO)
    assert [r["run_id"] for r in history["runs"]] == [a, b]  # not c (another dataset) nor d
    this, there = history["runs"]
    assert (this["name"], this["archived"], there["archived"]) == ("a", False, True)
    assert [g["step"] for g in this["groups"]] == [1, 2, 3] and this["groups_total"] == 3
    assert [g["correct_share"] for g in this["groups"]] == [pytest.approx(1 / 3), 0.5, 1.0]
    assert [g["kind"] for g in this["groups"]] == ["mixed", "mixed", "all_right"]
    assert (this["correct_share_first"], this["correct_share_last"]) == (pytest.approx(1 / 3), 1.0)
    assert [x["completion"] for x in this["groups"][0]["samples"]] == [
        "The answer is 4",
        "50% sure: 5",
        "no idea at all",
    ]
    assert this["groups"][0]["samples"][2] == {
        "sample_id": this["groups"][0]["samples"][2]["sample_id"],
        "completion": "no idea at all",
        "reward": 0.0,
        "correct": False,
        "truncated": True,
        "length": 8,
    }
    assert [g["step"] for g in there["groups"]] == [4] and there["correct_share_last"] == 0.5
    assert [r["run_id"] for r in alone["runs"]] == [a]
    assert [g["step"] for g in latest["runs"][0]["groups"]] == [2, 3] and latest["runs"][0]["groups_total"] == 3
    assert [(r["run_id"], len(r["groups"])) for r in unseen["runs"]] == [(d, 0), (b, 1), (a, 3)]
    assert unseen["runs"][0]["correct_share_first"] is None


def test_question_history_reads_every_groups_samples_in_one_query(run_a):
    url, a = run_a
    statements = []
    engine = make_engine(url)
    listener = lambda conn, cursor, statement, *args: statements.append(statement)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        with session_scope(url) as s:
            history = store.question_history(s, a, TWO)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert sum(len(g["samples"]) for g in history["runs"][0]["groups"]) == 7
    assert len([x for x in statements if "FROM samples" in x]) == 1


# ---- the API: parameters checked and named --------------------------------------------------------


@pytest.fixture
def api_run(run_a, monkeypatch):
    url, run_id = run_a
    monkeypatch.setenv("GRPO_DATABASE_URL", url)
    return run_id


def test_the_api_takes_numbers_as_text_and_empty_bounds(api_run):
    got = diagnose_api.search_samples(
        str(api_run),
        reward_min="0.1",
        reward_max=" 0.6 ",
        step_min="",
        step_max=None,
        outcome="",
        kind=None,
        sort="reward",
        descending="true",
        page="1",
        page_size="10",
    )
    assert [r["completion"] for r in got["rows"]] == ["back\\slash", "5_x wrong"]
    assert diagnose_api.search_samples(api_run, length_min=4.0, length_max="4")["total"] == 2


BAD_PARAMETERS = [
    ({"outcome": "x"}, "outcome must be one of any, correct, wrong, no_answer, truncated, got 'x'"),
    ({"kind": "half"}, "kind must be one of any, all_right, all_wrong, mixed, zero_spread, got 'half'"),
    ({"sort": "id"}, "sort must be one of step, reward, length, spread, got 'id'"),
    ({"reward_min": "high"}, "reward_min must be a number, got 'high'"),
    ({"reward_max": float("nan")}, "reward_max must be a number"),
    ({"spread_min": True}, "spread_min must be a number"),
    ({"reward_min": 1, "reward_max": 0}, "reward_min must be at most reward_max"),
    ({"length_min": -1}, "length_min must be an integer from 0"),
    ({"length_max": 2.5}, "length_max must be an integer from 0"),
    ({"step_min": "two"}, "step_min must be an integer from 0"),
    ({"step_min": 3, "step_max": 2}, "step_min must be at most step_max"),
    ({"contains": 5}, "contains must be a string"),
    ({"contains": "a\0b"}, "contains must not contain a NUL character"),
    ({"descending": "maybe"}, "descending must be true or false, got 'maybe'"),
    ({"page": 0}, "page must be an integer from 1"),
    ({"page_size": 201}, "page_size must be an integer from 1 to 200, got 201"),
    ({"page_size": "0"}, "page_size must be an integer from 1"),
    ({"rewards_min": 0}, "rewards_min is not a search filter; the filters are reward_min, reward_max, outcome"),
]


def test_the_filters_are_one_list_that_the_api_the_service_and_the_find_form_read():
    """SampleQuery names every filter once: the service parses exactly its keys (each bound with a parser), and the
    /search_samples endpoint's parameters (the API page's) and the Find form's inputs are the same names."""
    import inspect
    from dataclasses import fields

    from app.web import endpoints
    from app.web.tabs.groups_find import FILTERS

    keys = tuple(f.name for f in fields(store.SampleQuery))
    assert diagnose_api.QUERY_KEYS == keys
    assert {f"{b}_{end}" for b in diagnose_api.BOUND_PARSERS for end in ("min", "max")} == {
        k for k in keys if k.endswith(("_min", "_max"))
    }
    endpoint = inspect.signature(endpoints.search_samples).parameters
    assert tuple(endpoint)[1:] == keys
    assert all(endpoint[k].default == f.default for k, f in zip(keys, fields(store.SampleQuery), strict=True))
    assert set(FILTERS) | {"page", "page_size"} == set(keys)


def test_the_api_names_a_bad_parameter(api_run):
    for kwargs, message in BAD_PARAMETERS:  # one run for all of them: the checks come before any query
        with pytest.raises(ApiError, match=re.escape(message)):
            diagnose_api.search_samples(api_run, **kwargs)


def test_the_api_refuses_unknown_runs_groups_and_empty_questions(api_run):
    with pytest.raises(ApiError, match="run 99999 not found"):
        diagnose_api.search_samples(99999)
    with pytest.raises(ApiError, match="run 99999 not found"):
        diagnose_api.question_history(99999, TWO)
    with pytest.raises(ApiError, match="run_id must be an integer"):
        diagnose_api.search_samples("a")
    for empty in ("", "  ", None):
        with pytest.raises(ApiError, match="question must not be empty"):
            diagnose_api.question_history(api_run, empty)
    with pytest.raises(ApiError, match="other_runs must be true or false"):
        diagnose_api.question_history(api_run, TWO, other_runs="yes please")
    with pytest.raises(ApiError, match="group 99999 not found"):
        diagnose_api.question_of_group(99999)


def test_question_of_group_feeds_question_history(api_run):
    group_id = diagnose_api.search_samples(api_run, contains="four")["rows"][0]["group_id"]
    question = diagnose_api.question_of_group(str(group_id))
    assert question == TWO
    history = diagnose_api.question_history(api_run, question, other_runs="false")
    assert [g["step"] for g in history["runs"][0]["groups"]] == [1, 2, 3]


# ---- migration 0006 -------------------------------------------------------------------------------


def test_migration_0006_backfills_what_a_search_filters_on(run_a):
    url, run_id = run_a
    command.downgrade(alembic_config(url), "0005")
    make_engine(url).dispose()  # drop cached connections (and their cached schema) between DDL runs
    upgrade_database(url)
    make_engine(url).dispose()
    assert found(url, run_id, outcome="wrong") == ["50% sure: 5", "5_x wrong", "7 maybe"]
    assert found(url, run_id, outcome="no_answer") == ["no idea at all", "back\\slash"]
    assert found(url, run_id, outcome="truncated") == []  # not recorded before the revision
    assert found(url, run_id, kind="mixed") == [
        "The answer is 4",
        "50% sure: 5",
        "no idea at all",
        "4 again",
        "5_x wrong",
    ]
    assert found(url, run_id, step_min=3) == ["4 at last", "four is 4"]
    assert found(url, run_id, length_min=7) == ["no idea at all", "back\\slash"]
    with session_scope(url) as s:
        rows = store.search_samples(s, run_id, store.SampleQuery(page_size=200))["rows"]
        history = store.question_history(s, run_id, TWO)
    assert [(r["step"], r["length"], r["correct"], r["answer_found"]) for r in rows][:3] == [
        (1, 3, True, True),
        (1, 5, False, True),
        (1, 8, False, False),
    ]
    assert [g["kind"] for g in history["runs"][0]["groups"]] == ["mixed", "mixed", "all_right"]


# ---- through a live server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A real `serve` on a SQLite store with run A recorded; yields (client, run id)."""
    tmp = tmp_path_factory.mktemp("search")
    env = server_env(tmp, GRPO_EMBEDDED_WORKER="0")
    url = env["GRPO_DATABASE_URL"]
    upgrade_database(url)
    run_id = new_run(url, name="a")
    record(url, run_id, STEPS)
    try:
        with running_server(tmp, env) as (server_url, _, _):
            yield Client(server_url, verbose=False), run_id
    finally:
        make_engine(url).dispose()


@pytest.mark.slow
def test_search_samples_through_the_endpoint(live):
    client, run_id = live
    got = client.predict(run_id, None, None, "wrong", api_name="/search_samples")
    assert (got["total"], got["pages"]) == (3, 1)
    assert [r["completion"] for r in got["rows"]] == ["50% sure: 5", "5_x wrong", "7 maybe"]
    got = client.predict(run_id, contains="%", sort="length", descending=True, page_size=10, api_name="/search_samples")
    assert [r["completion"] for r in got["rows"]] == ["50% sure: 5"] and got["page_size"] == 10
    with pytest.raises(AppError, match="outcome must be one of any, correct, wrong, no_answer, truncated, got 'x'"):
        client.predict(run_id, outcome="x", api_name="/search_samples")


@pytest.mark.slow
def test_question_history_through_the_endpoint(live):
    client, run_id = live
    history = client.predict(run_id, TWO, api_name="/question_history")
    [this] = history["runs"]
    assert this["run_id"] == run_id and [g["step"] for g in this["groups"]] == [1, 2, 3]
    assert this["correct_share_last"] == 1.0
    with pytest.raises(AppError, match="question must not be empty"):
        client.predict(run_id, "", api_name="/question_history")
