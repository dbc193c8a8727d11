"""A run's health warnings in /get_run (app.service.run_health over app.service.health's rules, read from the store, cached
between polls), and the reward model's timeline on the charts."""

from __future__ import annotations

from app import store
from app.service import api, manage_api
from app.store.db import session_scope
from app.web.views.charts import chart_panels, metrics_figure, rm_refresh_steps
from app.web.views.run import health_html
from tests.support.store import new_run


def record(db_url: str, run_id: int, steps: range, **metrics) -> None:
    with session_scope(db_url) as s:
        for step in steps:
            store.record_step(
                s,
                run_id,
                step,
                1,
                {
                    "reward_mean": 0.5,
                    "entropy": 1.0,
                    "kl": 0.01,
                    "zero_std_frac": 0.1,
                    "truncated_frac": 0.0,
                    **metrics,
                },
            )


def test_get_run_lists_warnings_and_works_them_out_again_as_the_run_moves_on(db_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", db_url)
    run_id = new_run(db_url, max_new_tokens=24)
    record(db_url, run_id, range(1, 13))
    assert api.get_run(run_id)["warnings"] == []
    record(db_url, run_id, range(13, 25), truncated_frac=0.6)  # the recent window is all truncated outputs
    [warning] = api.get_run(run_id)["warnings"]
    assert warning["rule"] == "truncation" and "max_new_tokens" in warning["message"] and "24" in warning["message"]
    assert warning["steps"][1] == 24 and "truncated_frac" in warning["metrics"]
    # every answer that is "the run as /get_run gives it" carries the warnings too
    with session_scope(db_url) as s:
        store.finish_run(s, run_id, "completed")
    assert [w["rule"] for w in manage_api.wait_run(run_id, 1)["warnings"]] == ["truncation"]
    assert [w["rule"] for w in manage_api.rename_run(run_id, "renamed")["warnings"]] == ["truncation"]
    assert [w["rule"] for w in api.compare_runs([run_id])["runs"][0]["warnings"]] == ["truncation"]
    badge = health_html([warning])
    assert 'data-rule="truncation"' in badge and "1 health warning" in badge


def test_get_run_warns_at_step_0_when_right_answers_are_not_in_the_form_the_reward_reads(db_url, monkeypatch):
    monkeypatch.setenv("GRPO_DATABASE_URL", db_url)
    prose = {"eval/accuracy": 0.0, "eval/accuracy_strict": 0.0, "eval/accuracy_flexible": 0.4, "eval/format": 0.0}
    strict_run, flexible_run = new_run(db_url), new_run(db_url, answer_match="flexible")
    with session_scope(db_url) as s:
        store.record_step(s, strict_run, 0, 0, prose)
        store.record_step(s, flexible_run, 0, 0, {**prose, "eval/accuracy": 0.4})
    [warning] = api.get_run(strict_run)["warnings"]
    assert warning["rule"] == "answer_form" and warning["steps"] == [0, 0]
    assert "answer_match: flexible" in warning["message"] and "format_reward" in warning["message"]
    assert api.get_run(flexible_run)["warnings"] == []  # its reward already counts those answers
    panels = dict(chart_panels(store_metrics(db_url, strict_run), warning["metrics"]))
    assert panels == {"accuracy": tuple(warning["metrics"])}  # a click on it charts them in one panel


def store_metrics(db_url: str, run_id: int) -> list[dict]:
    with session_scope(db_url) as s:
        return store.get_metrics(s, run_id)


def test_rm_refreshes_are_drawn_on_every_panel_and_the_rm_panel_shows_the_policys_accuracy():
    metrics = [{"step": 0, "eval/accuracy": 0.3, "rm/accuracy_after": 0.9}]
    metrics += [
        {
            "step": s,
            "reward_mean": 0.5,
            "kl": 0.01,
            "eval/accuracy": 0.5 if s % 5 == 0 else None,
            "rm/accuracy_before": 0.8 if s == 10 else None,
            "rm/accuracy_after": 0.9 if s == 10 else None,
        }
        for s in range(1, 21)
    ]
    assert rm_refresh_steps(metrics) == [10]
    panels = dict(chart_panels(metrics))
    assert panels["reward model"] == ("rm/accuracy_before", "rm/accuracy_after", "eval/accuracy")
    fig = metrics_figure(metrics)
    lines = [s for s in fig.layout.shapes if s.x0 == 10 and s.x1 == 10]
    assert len(lines) == len(chart_panels(metrics))  # one on every panel
    assert any(a.text == "RM v2" for a in fig.layout.annotations)


def test_rm_version_of_a_group():
    assert [api.rm_version({"reward": "model", "steps_per_iteration": 3}, s) for s in (1, 3, 4, 7)] == [1, 1, 2, 3]
