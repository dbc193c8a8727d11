"""The real dashboard server in a subprocess, driven through gradio_client.

One server for the module, on a free port, with its store (SQLite) and broker
(``sqla+sqlite``) in a temporary directory. Data the endpoints read back is seeded
through app.store from this process, the way a worker writes it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from kombu import Connection

from app import store
from app.core.broker import RUN_TASK
from app.store.db import make_engine, session_scope, upgrade_database
from app.web.views.charts import PANELS, compare_figure, ema, metrics_figure
from app.web.views.group import group_html, token_span
from app.web.views.run import RM_TABLE, config_diff_html, progress_html, rm_refresh_frame
from grpo_engine.report.metrics import METRIC_REGISTRY
from grpo_engine.report.recorder import GroupRecord, SampleRecord
from tests.support.servers import ROOT, running_server, server_env

QUEUE = "grpo-ui-test"
ENDPOINTS = {
    "/launch_run",
    "/list_presets",
    "/list_runs",
    "/get_run",
    "/get_metrics",
    "/get_logs",
    "/wait_run",
    "/list_groups",
    "/get_group",
    "/cancel_run",
    "/compare_runs",
    "/export_run",
    "/upload_dataset",
    "/preview_dataset",
    "/upload_model",
    "/list_models",
    "/preview_rewards",
    "/preview_prompt",
    "/rename_run",
    "/annotate_run",
    "/archive_run",
    "/delete_run",
    "/search_samples",
    "/question_history",
    "/list_eval_results",
    "/compare_evals",
    "/list_try_options",
    "/try_question",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Start `serve` in a subprocess; yield (url, database url, broker url, process)."""
    tmp = tmp_path_factory.mktemp("ui")
    env = server_env(tmp, GRPO_QUEUE=QUEUE)
    db_url, broker_url = env["GRPO_DATABASE_URL"], env["GRPO_BROKER_URL"]
    upgrade_database(db_url)
    try:
        with running_server(tmp, env) as (url, proc, _):
            yield url, db_url, broker_url, proc
    finally:
        make_engine(db_url).dispose()


@pytest.fixture(scope="module")
def client(server):
    return Client(server[0], verbose=False)


def _queued_tasks(broker_url: str) -> list:
    found = []
    with Connection(broker_url) as connection:
        queue = connection.SimpleQueue(QUEUE)
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                return found
            message.ack()
            found.append((message.headers["task"], message.payload[0]))


@pytest.mark.slow
def test_only_the_named_endpoints_are_public(client):
    assert set(client.view_api(print_info=False, return_format="dict")["named_endpoints"]) == ENDPOINTS


@pytest.mark.slow
def test_launch_list_get_cancel(server, client):
    _, _, broker_url, _ = server
    result = client.predict({"name": "ui-run", "group_size": 4}, api_name="/launch_run")
    assert result == {"run_id": result["run_id"], "status": "queued"}
    run_id = result["run_id"]
    assert _queued_tasks(broker_url) == [(RUN_TASK, [run_id])]

    runs = client.predict(api_name="/list_runs")
    assert isinstance(runs, list) and runs[0]["run_id"] == run_id
    assert set(runs[0]) == {
        "run_id",
        "name",
        "status",
        "model",
        "dataset",
        "supervision",
        "step",
        "total_steps",
        "created_at",
        "started_at",
        "finished_at",
        "phase",
        "phase_done",
        "phase_total",
        "notes",
        "tags",
        "archived",
    }

    run = client.predict(run_id, api_name="/get_run")
    assert {"run_id", "name", "status", "config", "step", "total_steps", "error", "started_at", "finished_at"} <= set(
        run
    )
    assert run["name"] == "ui-run" and run["status"] == "queued" and run["config"]["group_size"] == 4

    assert client.predict(run_id, api_name="/cancel_run") == {"run_id": run_id, "status": "cancelled"}
    assert client.predict(run_id, api_name="/get_run")["status"] == "cancelled"


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec,message",
    [
        ({"group_size": 1}, "group_size: must be at least 2, got 1"),
        ({"supervision": "both"}, "supervision: must be one of 'outcome', 'process', got 'both'"),
        ({"grop_size": 8}, "grop_size: unknown key"),
    ],
)
def test_bad_spec_error_names_the_key(client, spec, message):
    with pytest.raises(AppError, match=message):
        client.predict(spec, api_name="/launch_run")


@pytest.mark.slow
def test_presets_are_the_forms_list_and_each_is_a_valid_run_spec(client):
    from grpo_engine.spec.config import validate_spec
    from grpo_engine.spec.presets import PRESETS

    presets = client.predict(api_name="/list_presets")
    assert [p["name"] for p in presets] == list(PRESETS)
    by_name = {p["name"]: p["spec"] for p in presets}
    word = by_name["Small instruct model on word problems (CPU)"]
    assert word["dataset"] == "builtin-word-problems" and word["answer_match"] == "flexible"
    assert [r["name"] for r in word["rewards"]] == ["accuracy", "strict_correct", "format_after_working"]
    for spec in by_name.values():
        validate_spec(spec)


def test_unknown_run_is_an_error(client):
    with pytest.raises(AppError, match="run 99999 not found"):
        client.predict(99999, api_name="/get_run")


@pytest.mark.slow
def test_metrics_and_groups(server, client):
    _, db_url, _, _ = server
    run_id = client.predict({"name": "seeded"}, api_name="/launch_run")["run_id"]
    tokens = ["<b>", " 4", "\n"]
    samples = [
        SampleRecord(
            completion="".join(tokens),
            tokens=tokens,
            reward=r,
            advantages=[2 * r - 1] * 3,
            step_rewards=[r],
            step_end_indices=[2],
            answer=answer,
            answer_rule=rule,
        )
        for r, (answer, rule) in zip((0.0, 1.0), ((None, "none"), ("4", "number")), strict=True)
    ]
    with session_scope(db_url) as s:
        store.mark_running(s, run_id, total_steps=40)
        store.record_step(s, run_id, 1, 0, {"reward_mean": 0.5, "kl": 0.0, "loss": 0.2, "eval/accuracy": 0.25})
        store.record_step(s, run_id, 2, 0, {"reward_mean": 0.75, "kl": 0.01, "loss": 0.1})
        store.record_groups(s, run_id, 2, [GroupRecord("2+2=", "4", samples).to_dict()])

    metrics = client.predict(run_id, api_name="/get_metrics")
    assert [m["step"] for m in metrics] == [1, 2] and metrics[0]["eval/accuracy"] == 0.25
    assert client.predict(run_id, api_name="/get_run")["step"] == 2

    [group_row] = client.predict(run_id, None, api_name="/list_groups")
    assert group_row == {
        "group_id": group_row["group_id"],
        "step": 2,
        "prompt": "2+2=",
        "reward_mean": 0.5,
        "reward_std": 0.5,
        "kind": "all_wrong",
    }  # no verdicts recorded
    assert client.predict(run_id, 2, api_name="/list_groups") == [group_row]
    assert client.predict(run_id, 1, api_name="/list_groups") == []

    group = client.predict(group_row["group_id"], api_name="/get_group")
    assert {"group_id", "run_id", "step", "prompt", "reference", "samples"} <= set(group)
    assert len(group["samples"]) == 2
    sample = group["samples"][1]
    assert sample["tokens"] == tokens and sample["advantages"] == [1.0, 1.0, 1.0]
    assert sample["step_end_indices"] == [2] and sample["step_rewards"] == [1.0]
    # the verifier's reading: the answer it read and its rule; none read, and no answer found
    assert (sample["answer"], sample["answer_rule"], sample["answer_found"]) == ("4", "number", True)
    first = group["samples"][0]
    assert (first["answer"], first["answer_rule"], first["answer_found"]) == (None, "none", False)

    # a running run is asked to stop and stays running until its worker does
    assert client.predict(run_id, api_name="/cancel_run") == {"run_id": run_id, "status": "running"}
    with pytest.raises(AppError, match="group 99999 not found"):
        client.predict(99999, api_name="/get_group")


def _seed_groups(db_url: str, run_id: int, step: int, rewards_per_group: list[list[float]]) -> None:
    groups = []
    for b, rewards in enumerate(rewards_per_group):
        samples = [
            SampleRecord(
                completion=f"{b}-{i}",
                tokens=[f"{b}", "-", f"{i}"],
                reward=r,
                advantages=[r] * 3,
                reward_components={"correct": r},
            )
            for i, r in enumerate(rewards)
        ]
        groups.append(GroupRecord(f"q{b}", "1", samples).to_dict())
    with session_scope(db_url) as s:
        store.record_groups(s, run_id, step, groups)


@pytest.mark.slow
def test_list_groups_sorts_by_spread_or_mean(server, client):
    _, db_url, _, _ = server
    run_id = client.predict({"name": "sorted"}, api_name="/launch_run")["run_id"]
    _seed_groups(db_url, run_id, 1, [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])  # std 0, 0.5, 0; mean 1, .5, 0
    prompts = lambda order: [g["prompt"] for g in client.predict(run_id, 1, order, api_name="/list_groups")]  # noqa: E731
    assert prompts(None) == prompts("position") == ["q0", "q1", "q2"]
    assert prompts("spread") == ["q1", "q0", "q2"]
    assert prompts("mean") == ["q0", "q1", "q2"] and prompts("mean_asc") == ["q2", "q1", "q0"]
    with pytest.raises(AppError, match="order must be one of position, spread, mean, mean_asc"):
        client.predict(run_id, 1, "best", api_name="/list_groups")


@pytest.mark.slow
def test_compare_runs_overlays_metrics_and_names_differing_keys(server, client):
    _, db_url, _, _ = server
    a = client.predict({"name": "a", "learning_rate": 1e-4}, api_name="/launch_run")["run_id"]
    b = client.predict({"name": "b", "learning_rate": 3e-4, "group_size": 4}, api_name="/launch_run")["run_id"]
    with session_scope(db_url) as s:
        for run_id, value in ((a, 0.25), (b, 0.5)):
            store.record_step(s, run_id, 1, 1, {"reward_mean": value})
    compared = client.predict([a, b], api_name="/compare_runs")
    assert [r["run_id"] for r in compared["runs"]] == [a, b]
    assert compared["differing_keys"] == ["group_size", "learning_rate"]  # "name" never counts
    assert compared["metrics"][str(a)] == [{"step": 1, "iteration": 1, "reward_mean": 0.25}]
    assert compared["metrics"][str(b)][0]["reward_mean"] == 0.5
    with pytest.raises(AppError, match="run 99999 not found"):
        client.predict([a, 99999], api_name="/compare_runs")
    with pytest.raises(AppError, match="run_ids must be a non-empty list"):
        client.predict([], api_name="/compare_runs")


@pytest.mark.slow
def test_export_groups_as_parquet_and_csv_and_config_as_json(server, client):
    import json

    import pandas as pd

    _, db_url, _, _ = server
    run_id = client.predict({"name": "export", "group_size": 2}, api_name="/launch_run")["run_id"]
    _seed_groups(db_url, run_id, 1, [[0.0, 1.0], [1.0, 1.0]])
    _seed_groups(db_url, run_id, 2, [[1.0, 0.0]])
    parquet = pd.read_parquet(client.predict(run_id, "parquet", api_name="/export_run"))
    assert len(parquet) == 6 and list(parquet["step"]) == [1, 1, 1, 1, 2, 2]
    assert list(parquet["completion"]) == ["0-0", "0-1", "1-0", "1-1", "0-0", "0-1"]
    assert list(parquet.loc[1, "tokens"]) == ["0", "-", "1"] and list(parquet.loc[1, "advantages"]) == [1.0] * 3
    assert parquet.loc[0, "group_reward_std"] == 0.5 and parquet.loc[2, "group_reward_std"] == 0.0
    csv = pd.read_csv(client.predict(run_id, "csv", api_name="/export_run"))
    assert len(csv) == 6 and json.loads(csv.loc[1, "tokens"]) == ["0", "-", "1"]
    assert json.loads(csv.loc[1, "reward_components"]) == {"correct": 1.0}
    # the verifier's reading: a column each, empty for samples recorded without it
    assert {"answer", "answer_rule"} <= set(parquet.columns) and csv["answer_rule"].isna().all()
    with open(client.predict(run_id, "config", api_name="/export_run"), encoding="utf-8") as fh:
        config = json.load(fh)
    assert config == client.predict(run_id, api_name="/get_run")["config"] and config["group_size"] == 2
    again = client.predict(config, api_name="/launch_run")  # an exported config launches as it is
    assert client.predict(again["run_id"], api_name="/get_run")["config"] == config
    with pytest.raises(AppError, match="kind must be one of parquet, csv, eval-parquet, eval-csv, config"):
        client.predict(run_id, "xlsx", api_name="/export_run")


@pytest.mark.slow
def test_server_process_has_not_loaded_torch(server, client):
    """After serving every endpoint, no libtorch is mapped into the server process."""
    client.predict(api_name="/list_runs")
    client.predict("builtin-arith", api_name="/preview_dataset")  # the engine's pure-Python data module, no torch
    maps = Path(f"/proc/{server[3].pid}/maps").read_text()
    assert "libtorch" not in maps
    check = "import sys, app.web.ui, app.web.endpoints, app.web.views.run; assert 'torch' not in sys.modules, 'the web app imported torch'"
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True)


# ---- what the browser is shown (pure rendering functions) -----------------------------------------


def test_token_span_escapes_and_colours_by_advantage():
    negative = token_span("<b>\n", -1.0, 2.0)
    assert negative.startswith('<span class="token" data-adv="-1" ')
    assert "&lt;b&gt;" in negative and "<b>" not in negative.replace('<span class="token"', "")
    assert '<span class="ws">↵</span>' in negative  # the newline is drawn, not just broken
    assert "background:rgba(220,38,38,0.560)" in negative  # half way: 0.12 + 0.88 * 0.5 of red over the page
    assert 'data-tip="&#x27;&lt;b&gt;\\n&#x27;  A = -1.0000"' in negative
    assert "background:rgba(22,163,74,1.000)" in token_span(" a", 2.0, 2.0)  # full green
    assert 'class="token strong"' in token_span(" a", 2.0, 2.0)
    assert "background:rgba(22,163,74,0.000)" in token_span(" a", 0.0, 2.0)  # clear at 0
    assert '"> a</span>' in token_span(" a", 0.0, 0.0)  # a space stays a space, so the text wraps between words


def test_group_html_shows_every_sample_and_step_marks():
    group = {
        "group_id": 3,
        "run_id": 1,
        "step": 4,
        "prompt": "1+1=<?>",
        "reference": "2",
        "samples": [
            {
                "sample_id": 10,
                "completion": "2\n",
                "tokens": ["2", "\n"],
                "reward": 1.0,
                "advantages": [0.5, 0.5],
                "step_rewards": [1.0],
                "step_end_indices": [1],
                "reward_components": {"correct": 1.0},
            },
            {
                "sample_id": 11,
                "completion": "3",
                "tokens": ["3"],
                "reward": 0.0,
                "advantages": [-0.5],
                "step_rewards": None,
                "step_end_indices": None,
                "reward_components": {},
            },
        ],
    }
    page = group_html(group)
    assert page.count('class="sample"') == 2 and page.count(" data-adv=") == 3
    assert "1+1=&lt;?&gt;" in page and 'data-sample-id="11"' in page
    # the step mark sits after the step's last token, before the line break
    assert re.search(
        r'<span class="step-end" data-tip="step 1: reward \+1\.000; normalised [^"]+">step 1 r=\+1\.00</span><br>', page
    )


def test_progress_html_eta_and_error():
    run = {
        "run_id": 7,
        "name": "r<1>",
        "status": "running",
        "step": 10,
        "total_steps": 40,
        "error": None,
        "started_at": "2025-01-01T00:00:00+00:00",
        "finished_at": None,
        "cancel_requested": False,
    }
    now = datetime(2025, 1, 1, 0, 1, 40, tzinfo=timezone.utc)  # 100 s for 10 steps: 300 s left
    page = progress_html(run, now)
    assert "width:25.0%" in page and "step 10 / 40 · 25%" in page
    # the elapsed time a clock the page counts on, from the 100 s drawn
    assert '<span class="clock" data-elapsed="100" data-prefix="elapsed ">elapsed 1m 40s</span> · ETA 5m 00s' in page
    assert "r&lt;1&gt;" in page
    failed = {**run, "status": "failed", "error": "boom <x>", "finished_at": "2025-01-01T00:00:30+00:00"}
    assert '<pre class="run-error">boom &lt;x&gt;</pre>' in progress_html(failed, now)
    assert "waiting for a worker" in progress_html({**run, "status": "queued", "step": 0, "started_at": None}, now)


def test_progress_html_names_the_iteration():
    run = {
        "run_id": 7,
        "name": "it",
        "status": "running",
        "step": 250,
        "total_steps": 600,
        "error": None,
        "config": {"iterations": 3, "steps_per_iteration": 200},
        "started_at": None,
        "finished_at": None,
    }
    assert "iteration 2 / 3 · step 250 / 600" in progress_html(run)


def test_progress_html_shows_the_worker_the_attempt_and_the_checkpoint():
    run = {
        "run_id": 7,
        "name": "r",
        "status": "running",
        "step": 25,
        "total_steps": 40,
        "error": None,
        "config": {},
        "started_at": None,
        "finished_at": None,
        "worker": "gpu-3:811",
        "attempts": 2,
        "checkpoint_step": 21,
    }
    assert "on gpu-3:811 (attempt 2) · checkpoint at step 21" in progress_html(run)
    paused = {**run, "status": "queued", "worker": None}
    assert "waiting for a worker to resume it from step 21" in progress_html(paused)
    assert "attempt" not in progress_html({**run, "attempts": 1})


def test_metrics_figure_draws_every_recorded_metric_in_its_panel():
    metrics = [
        {"step": 1, "iteration": 1, "reward_mean": 0.5, "kl": 0.01, "time/step": 0.3, "custom/x": 2.0},
        {"step": 2, "iteration": 1, "reward_mean": 0.6, "kl": 0.02, "time/step": 0.3, "custom/x": 3.0},
    ]
    fig = metrics_figure(metrics)
    names = {trace.name for trace in fig.data}
    assert names == {"reward_mean", "kl", "time/step", "custom/x"}
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["reward", "KL and loss", "timing (s)", "other"]  # the panels with something recorded
    assert [title for title, _ in PANELS] == [
        "reward",
        "accuracy",
        "fractions",
        "sampled evaluation",
        "KL and loss",
        "entropy (nats)",
        "completion length (tokens)",
        "gradient sources",
        "token advantages",
        "gradient norm",
        "learning rate",
        "groups per step",
        "timing (s)",
        "reward model",
    ]


def test_rm_refresh_table_has_one_row_per_training():
    metrics = [
        {"step": 0, "iteration": 0, "rm/loss": 0.5, "rm/accuracy_after": 0.8, "rm/train_examples": 64.0},
        {"step": 1, "iteration": 1, "reward_mean": 0.2},
        {
            "step": 2,
            "iteration": 1,
            "rm/loss": 0.4,
            "rm/accuracy_before": 0.75,
            "rm/accuracy_after": 0.85,
            "rm/train_examples": 70.0,
            "rm/replayed": 6.0,
        },
    ]
    frame = rm_refresh_frame(metrics)
    assert frame["step"].tolist() == [0, 2]
    assert frame.iloc[1]["change"] == pytest.approx(0.1) and frame.iloc[1]["replayed"] == 6.0
    assert rm_refresh_frame([{"step": 1, "iteration": 1, "kl": 0.0}]).empty
    registered = {m.name for m in METRIC_REGISTRY} | {"step", "iteration"}
    assert {key for _, key in RM_TABLE if key is not None} <= registered  # every column shows a recorded metric


def test_group_html_shows_the_advantage_as_the_normalised_reward():
    samples = [
        {
            "sample_id": i,
            "completion": "x",
            "tokens": ["x", "<eos>"][:n],
            "reward": 0.5,
            "advantages": [0.25] * n,
            "step_rewards": None,
            "step_end_indices": None,
            "reward_components": {},
        }
        for i, n in enumerate([2, 0])
    ]
    page = group_html({"group_id": 1, "run_id": 1, "step": 1, "prompt": "q", "reference": "1", "samples": samples})
    assert 'class="norm">+0.250<' in page and 'class="norm">n/a<' in page  # the engine's value, not recomputed


def test_config_diff_marks_the_differing_keys_and_compare_figure_draws_each_run():
    compared = {
        "runs": [
            {"run_id": 1, "name": "a", "config": {"kl_coef": 0.04, "seed": 0}},
            {"run_id": 2, "name": "b<", "config": {"kl_coef": 0.0, "seed": 0}},
        ],
        "differing_keys": ["kl_coef"],
        "metrics": {"1": [{"step": 1, "kl": 0.1}], "2": [{"step": 1, "kl": 0.0}]},
    }
    page = config_diff_html(compared)
    assert '<tr class="diff" data-key="kl_coef">' in page and '<tr data-key="seed">' in page
    assert "b&lt;" in page and "1 key differs: kl_coef" in page
    differing, same = page.split("<details")  # the shared keys folded away below the differing ones
    assert "kl_coef" in differing and "seed" not in differing and "1 key the same in every run" in same
    fig = compare_figure(compared, ["kl", "reward_mean"])
    assert [t.name for t in fig.data] == ["#1 a", "#1 a", "#2 b<", "#2 b<"]  # one point each: drawn raw
    assert fig.layout.xaxis2.matches == "x" and fig.layout.xaxis.dtick == 1  # one step axis, whole steps


def test_compare_smooths_long_runs_and_draws_short_ones_raw():
    long = [{"step": s, "kl": float(s % 2)} for s in range(1, 101)]
    compared = {
        "runs": [{"run_id": 1, "name": "long", "config": {}}, {"run_id": 2, "name": "short", "config": {}}],
        "differing_keys": [],
        "metrics": {"1": long, "2": long[:8]},
    }
    fig = compare_figure(compared, ["kl"], smoothing=0.6)
    assert [t.name for t in fig.data] == ["#1 long (raw)", "#1 long", "#2 short"]
    assert fig.data[1].y[-1] == pytest.approx(ema([float(s % 2) for s in range(1, 101)], 0.6)[-1])
    assert fig.data[2].y == tuple(float(s % 2) for s in range(1, 9))


def test_group_html_shows_normalised_rewards_and_the_rm_score_beside_the_verifier():
    norm = 0.4 / (0.4 + 1e-4)  # rewards 0.9 and 0.1: (r - mean) / (std + eps'), the engine's outcome advantage
    samples = [
        {
            "sample_id": i,
            "completion": "x",
            "tokens": ["x"],
            "reward": r,
            "advantages": [a],
            "step_rewards": None,
            "step_end_indices": None,
            "reward_components": {"correct": c, "rm_score": r},
        }
        for i, (r, a, c) in enumerate([(0.9, norm, 1.0), (0.1, -norm, 0.0)])
    ]
    page = group_html({"group_id": 1, "run_id": 1, "step": 1, "prompt": "q", "reference": "1", "samples": samples})
    assert page.count('class="norm">+1.000<') == 1 and page.count('class="norm">-1.000<') == 1
    assert "correct 1 ✓</span>" in page and "correct 0 ✗</span>" in page
    assert '<span class="rm-score" data-component="rm_score">reward model score 0.900</span>' in page


@pytest.mark.slow
def test_preview_dataset_shows_the_first_rows_of_each_format(server, client, tmp_path):
    import pandas as pd

    data_dir = Path(server[1].split("///", 1)[1]).parent  # the server's data dir: a path root
    rows = [{"question": f"{i}+1", "answer": str(i + 1), "solution": ""} for i in range(8)]
    paths = {".jsonl": data_dir / "p.jsonl", ".csv": data_dir / "p.csv", ".parquet": data_dir / "p.parquet"}
    paths[".jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_csv(paths[".csv"], index=False)
    pd.DataFrame(rows).to_parquet(paths[".parquet"], index=False)
    for path in paths.values():
        shown = client.predict(str(path), api_name="/preview_dataset")
        assert shown["rows"] == 8 and [r["question"] for r in shown["preview"]] == ["0+1", "1+1", "2+1", "3+1", "4+1"]
    mapped = data_dir / "mapped.csv"
    pd.DataFrame([{"problem": r["question"], "final": r["answer"]} for r in rows]).to_csv(mapped, index=False)
    shown = client.predict(str(mapped), "problem", "final", None, api_name="/preview_dataset")
    assert shown["preview"][0] == {"question": "0+1", "answer": "1", "solution": ""}
    with pytest.raises(AppError, match="needs the columns 'question' and 'answer'"):
        client.predict(str(mapped), api_name="/preview_dataset")
    builtin = client.predict("builtin-arith", api_name="/preview_dataset")
    assert builtin["rows"] > 100 and len(builtin["preview"]) == 5
    words = client.predict("builtin-word-problems", api_name="/preview_dataset")
    assert words["rows"] == 1100 and words["preview"][0]["solution"].endswith("#### " + words["preview"][0]["answer"])
    (data_dir / "bad.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2"}\n')
    with pytest.raises(AppError, match=r"bad.jsonl: line 2 needs the fields 'question' and 'answer'"):
        client.predict(str(data_dir / "bad.jsonl"), api_name="/preview_dataset")
    outside = tmp_path / "outside.jsonl"
    outside.write_text(paths[".jsonl"].read_text())
    with pytest.raises(AppError, match="outside the directories runs may read"):
        client.predict(str(outside), api_name="/preview_dataset")
    with pytest.raises(AppError, match="not a local file"):
        client.predict("openai/gsm8k", api_name="/preview_dataset")


@pytest.mark.slow
def test_the_server_stops_at_once_on_sigterm_with_clients_connected(tmp_path):
    """Open event streams (a client's or browser's heartbeat never ends by itself) do not hold the server up: it
    ends them and exits within seconds of SIGTERM, with nothing in its log but its own lines."""
    import signal
    import time

    with running_server(tmp_path, server_env(tmp_path, GRPO_EMBEDDED_WORKER="0")) as (url, proc, log_path):
        client = Client(url, verbose=False)
        assert client.predict(api_name="/list_runs") == []
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - started < 10
        assert "Traceback" not in log_path.read_text()
