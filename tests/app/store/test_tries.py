"""Questions tried by hand in the store (app.store.tries, migration 0012) on SQLite and PostgreSQL: a try's life
cycle (queued, claimed once, done or failed, expired when the dashboard stops waiting), the run's questions to
pick from, and the service's refusals (app.service.tries), each naming the field or what to start."""

from __future__ import annotations

import pytest

from app import store
from app.service import tries
from app.service.api import ApiError
from app.store.db import session_scope
from grpo_engine.report.recorder import EvalOutput, EvalQuestion, GroupRecord, SampleRecord
from tests.support.store import new_run

REQUEST = {"models": ["start"], "question": "2+2?", "reference": "4", "g": 2, "max_new_tokens": 8, "seed": 0,
           "time_limit": 30.0}  # fmt: skip


def test_a_try_is_claimed_once_and_finished_or_expired(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        first, second, third = (store.create_try(s, run_id, REQUEST) for _ in range(3))
    with session_scope(db_url) as s:
        claimed = store.claim_try(s, first)
        assert claimed["status"] == "running" and claimed["request"] == REQUEST and claimed["run_id"] == run_id
        assert store.claim_try(s, first) is None  # a redelivered message finds it taken
        assert store.finish_try(s, first, result=[{"model": "start", "outputs": []}])
        assert store.expire_try(s, first) is False  # done stays done
        assert store.expire_try(s, second)  # the dashboard stopped waiting before a worker took it
        assert store.claim_try(s, second) is None
        store.claim_try(s, third)
        assert store.expire_try(s, third)
        assert store.finish_try(s, third, error="late") is False  # outputs that come after expiry are dropped
    with session_scope(db_url) as s:
        done, expired = store.get_try(s, first), store.get_try(s, third)
        assert (done["status"], done["result"], done["error"]) == ("done", [{"model": "start", "outputs": []}], None)
        assert done["finished_at"] >= done["created_at"]
        assert (expired["status"], expired["result"]) == ("expired", None)
        assert store.get_try(s, 99999) is None
        store.delete_run(s, run_id)
    with session_scope(db_url) as s:
        assert store.get_try(s, first) is None  # deleted with its run


def test_a_failed_try_keeps_its_error(db_url):
    run_id = new_run(db_url)
    with session_scope(db_url) as s:
        try_id = store.create_try(s, run_id, REQUEST)
        store.claim_try(s, try_id)
        assert store.finish_try(s, try_id, error="ValueError: no")
        assert store.get_try(s, try_id)["status"] == "failed"
        assert store.get_try(s, try_id)["error"] == "ValueError: no"


def _evaluation(questions: list[str]) -> list[dict]:
    shown = EvalOutput("so 4", "4", "number", True, False)
    return [EvalQuestion(i, q, f"ref {q}", shown, []).to_dict() for i, q in enumerate(questions)]


def test_the_runs_questions_come_held_out_first_then_trained(db_url):
    run_id = new_run(db_url)
    sample = SampleRecord(completion="x", tokens=["x"], reward=0.0, advantages=[0.0])
    with session_scope(db_url) as s:
        store.record_evaluation(s, run_id, 0, _evaluation(["old held-out"]))
        store.record_evaluation(s, run_id, 2, _evaluation(["h1", "h2"]))
        for step, question in ((1, "t1"), (2, "h1"), (2, "t2"), (3, "t1")):
            store.record_groups(s, run_id, step, [GroupRecord(question, "ref", [sample]).to_dict()])
    with session_scope(db_url) as s:
        got = store.run_questions(s, run_id, 10)
        assert [(q["question"], q["split"]) for q in got] == [
            ("h1", "held-out"),
            ("h2", "held-out"),
            ("t1", "trained"),
            ("t2", "trained"),
        ]  # the latest evaluation's, in held-out order; each question once
        assert got[0]["reference"] == "ref h1"
        assert len(store.run_questions(s, run_id, 3)) == 3


def test_a_try_is_refused_naming_the_bound_or_the_model(store_url):
    run_id = new_run(store_url)
    offered = tries.try_models(run_id)
    assert [m["model"] for m in offered] == ["start"]  # nothing trained yet: no checkpoint, no trained policy
    refusals = {
        "g: 17 is out of bounds; a try takes 1 to 16": {"g": 17},
        "max_new_tokens: 2000 is out of bounds; a try takes 1 to 1024": {"max_new_tokens": 2000},
        "time_limit: 1 is out of bounds; a try takes 5 to 600": {"time_limit": 1},
        "g: 'many' is not a number": {"g": "many"},
    }
    for message, bounds in refusals.items():
        with pytest.raises(ApiError, match=message) as refused:
            tries.make_request(run_id, ["start"], "2+2?", **bounds)
        assert refused.value.key == message.split(":")[0]
    with pytest.raises(ApiError, match=f"models: run {run_id} has no model 'final' to try; it offers start"):
        tries.make_request(run_id, ["final"], "2+2?")
    with pytest.raises(ApiError, match="models: 3 is out of bounds; a try takes 1 to 2"):
        tries.make_request(run_id, ["start", "final", "3"], "2+2?")
    with pytest.raises(ApiError, match="question: type a question"):
        tries.make_request(run_id, "start", "  ")
    with pytest.raises(ApiError, match="run 99999 not found"):
        tries.make_request(99999, "start", "2+2?")
    request = tries.make_request(run_id, "start", " 2+2? ", " 4 ")
    assert (request.question, request.reference, request.g, request.time_limit) == ("2+2?", "4", 4, 120.0)
    assert request.max_new_tokens == 32  # the run's own max_new_tokens
    with pytest.raises(ApiError, match=r"no worker serves tries \(queue 'grpo.tries'\); start one with"):
        tries.try_question(run_id, "start", "2+2?")  # this store has no live worker
