"""Local paths in a run spec (app.core.paths: inside GRPO_PATH_ROOTS and usable) and dataset uploads in this
process (app.service.datasets.upload_dataset, with real files). Uploads through a live server with a login:
tests/app/core/test_security.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from app.core.paths import check_spec_paths, is_local_path
from app.core.settings import get_settings
from app.service import api, datasets
from grpo_engine.spec.config import SpecError
from tests.support.files import GOOD_ROWS, write_jsonl
from tests.support.servers import ROOT

# ---- local paths in a run spec -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,local",
    [
        ("builtin-arith", False),
        ("Qwen/Qwen2.5-0.5B-Instruct", False),
        ("gsm8k", False),
        ("openai/gsm8k", False),
        ("", False),
        ("/data/model", True),
        ("./model", True),
        ("../model", True),
        ("~/model", True),
        ("train.jsonl", True),
        ("data/train.CSV", True),
        ("x.parquet", True),
        ("spec.json", True),
        ("models/org/name", True),
        ("app", True),  # "app" exists in the directory the tests run from
    ],
)
def test_what_counts_as_a_local_path(value, local, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert is_local_path(value) is local


@pytest.fixture
def roots(tmp_path):
    """(root, outside): a root with a model dir, a model dir without config.json and a dataset; files
    outside it; symlinks inside it that point outside."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    for d in (root / "model", root / "empty-model", outside / "model"):
        d.mkdir(parents=True)
    (root / "model" / "config.json").write_text("{}")
    (outside / "model" / "config.json").write_text("{}")
    write_jsonl(root / "data.jsonl", GOOD_ROWS)
    write_jsonl(outside / "secret.jsonl", GOOD_ROWS)
    write_jsonl(root / "bad.jsonl", [GOOD_ROWS[0], {"question": "2+2"}])
    (root / "link.jsonl").symlink_to(outside / "secret.jsonl")
    (root / "model-link").symlink_to(outside / "model")
    return root, outside


def test_paths_inside_the_roots_pass(roots):
    root, _ = roots
    check_spec_paths({"model": str(root / "model"), "dataset": str(root / "data.jsonl"), "reward_model": ""}, [root])
    check_spec_paths({"model": f"{root}/../root/model", "dataset": "builtin-arith"}, [root])
    check_spec_paths({"model": "Qwen/Qwen2.5-0.5B-Instruct", "reward_model": "gpt2", "dataset": "gsm8k"}, [root])


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("model", "{outside}/model", "is outside the directories runs may read"),
        ("reward_model", "{outside}/model", "is outside"),
        ("dataset", "{outside}/secret.jsonl", "is outside"),
        ("dataset", "{root}/../outside/secret.jsonl", "is outside"),  # '..' escapes
        ("dataset", "{root}/link.jsonl", "is outside"),  # a symlink inside a root pointing out
        ("model", "{root}/model-link", "is outside"),
        ("model", "/", "is outside"),
        ("dataset", "{outside}/missing.jsonl", "is outside"),  # outside: nothing is said about whether it exists
        ("model", "{root}/no-such-model", "does not exist"),
        ("model", "{root}/empty-model", "has no config.json"),
        ("model", "{root}/data.jsonl", "has no config.json"),
        ("dataset", "{root}/missing.csv", "does not exist"),
        ("dataset", "{root}/model", "is not a dataset file, nor a dataset directory"),
        ("dataset", "{root}/bad.jsonl", "bad.jsonl: line 2 needs the fields 'question' and 'answer'"),
    ],
)
def test_paths_outside_the_roots_or_unusable_are_refused_naming_the_key(roots, key, value, words):
    root, outside = roots
    config = {
        "model": "builtin-arith",
        "dataset": "builtin-arith",
        "reward_model": "",
        key: value.format(root=root, outside=outside),
    }
    with pytest.raises(SpecError) as caught:
        check_spec_paths(config, [root])
    assert caught.value.key == key and str(caught.value).startswith(f"{key}: ") and words in str(caught.value)


def test_path_checks_import_no_torch():
    check = "import sys, app.core.paths, app.core.auth; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True)


# ---- upload (in this process) --------------------------------------------------------------------


def test_upload_stores_a_good_file_under_its_hash_and_a_safe_name(settings_env):
    source = settings_env / "my data (v1) é.csv"
    pd.DataFrame(GOOD_ROWS).to_csv(source, index=False)
    result = datasets.upload_dataset(str(source))
    stored = Path(result["dataset"])
    assert stored.parent == get_settings().uploads_dir and stored.read_bytes() == source.read_bytes()
    prefix, name = stored.name.split("-", 1)
    assert len(prefix) == 16 and name == "my_data_v1.csv"
    assert result["rows"] == 3 and result["preview"][1] == {
        "question": "2*3-1",
        "answer": "5",
        "solution": "2*3=6\n#### 5",
    }
    # Gradio's file dict works too, and the same content under the same name is stored once
    again = datasets.upload_dataset(
        {"path": str(source), "orig_name": source.name, "meta": {"_type": "gradio.FileData"}}
    )
    assert again == result and len(list(stored.parent.iterdir())) == 1
    check_spec_paths({"dataset": result["dataset"]}, get_settings().path_roots)  # usable in a run spec


def test_upload_preview_is_the_first_five_rows(settings_env):
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(12)]
    result = datasets.upload_dataset(str(write_jsonl(settings_env / "twelve.jsonl", rows)))
    assert result["rows"] == 12 and [r["question"] for r in result["preview"]] == ["0+1", "1+1", "2+1", "3+1", "4+1"]


def test_upload_refuses_a_file_over_the_limit_and_a_bad_file_naming_it(settings_env, monkeypatch):
    big = write_jsonl(settings_env / "big.jsonl", GOOD_ROWS * 400)
    monkeypatch.setenv("GRPO_MAX_UPLOAD_MB", "0.01")
    with pytest.raises(
        api.ApiError, match=r"big.jsonl: the file is 0\.\d\d MiB, larger than the 0\.01 MiB .*GRPO_MAX_UPLOAD_MB"
    ):
        datasets.upload_dataset(str(big))
    bad = write_jsonl(settings_env / "bad.jsonl", [GOOD_ROWS[0], ["not", "an", "object"]])
    with pytest.raises(api.ApiError) as caught:
        datasets.upload_dataset({"path": str(bad), "orig_name": "mine.jsonl"})
    assert (
        str(caught.value) == "mine.jsonl: line 2 is not a JSON object (it is a list)"
    )  # the user's name, not the path
    for nothing in (None, 5, {"orig_name": "x.jsonl"}, str(settings_env / "gone.jsonl")):
        with pytest.raises(api.ApiError, match="uploaded file"):
            datasets.upload_dataset(nothing)
    assert not get_settings().uploads_dir.exists()  # nothing refused was kept


# ---- files a run reads and the server writes ------------------------------------------------------


def test_a_dataset_directory_with_a_link_outside_the_roots_is_refused(roots):
    """Threat: a Hub-style dataset directory inside a root whose data file is a link to a file outside every root
    (its rows would be read into a run and shown in its groups)."""
    inside, outside = roots
    secret = outside / "secret.jsonl"
    folder = inside / "hubdata"
    folder.mkdir()
    (folder / "train.jsonl").symlink_to(secret)
    with pytest.raises(SpecError, match=r"holds 'train.jsonl', a link to a file outside"):
        check_spec_paths({"dataset": str(folder)}, [inside])
    (folder / "train.jsonl").unlink()
    (folder / "data").symlink_to(outside, target_is_directory=True)  # a linked folder, too
    with pytest.raises(SpecError, match=r"holds 'data', a link"):
        check_spec_paths({"dataset": str(folder)}, [inside])
    (folder / "data").unlink()
    write_jsonl(folder / "train.jsonl", GOOD_ROWS)
    (folder / "also.jsonl").symlink_to(folder / "train.jsonl")  # a link that stays inside is fine
    check_spec_paths({"dataset": str(folder)}, [inside])


def test_exports_go_to_a_private_directory_and_never_through_a_link(settings_env, tmp_path):
    """Threat: on a host shared by several users or dashboards, a planted link in a shared export directory making
    an export overwrite another file, or one dashboard's export read by another."""
    import stat
    import tempfile

    from app import store
    from app.service import exports
    from app.store.db import session_scope, upgrade_database
    from grpo_engine.spec.config import RunSpec

    upgrade_database()
    with session_scope() as s:
        run_id = store.create_run(s, RunSpec().to_dict(), "private")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    shared = Path(tempfile.gettempdir()) / "grpo-dashboard-exports"
    shared.mkdir(exist_ok=True)
    planted = shared / f"run-{run_id}-config.json"
    planted.unlink(missing_ok=True)
    planted.symlink_to(victim)
    try:
        first, second = Path(exports.export_run(run_id, "config")), Path(exports.export_run(run_id, "csv"))
    finally:
        planted.unlink()
    assert victim.read_text() == "keep me"
    assert first.parent != second.parent and first.parent.parent == second.parent.parent
    root = first.parent.parent
    assert root.name.startswith("grpo-dashboard-exports-") and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert json.loads(first.read_text())["name"] == "" and second.read_text().startswith("run_id,step")
    link = first.parent / "run-1-groups.parquet"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        exports._create(link)  # an existing name, a link above all, is never written through
    with pytest.raises(FileExistsError):
        exports._create(first)
    assert victim.read_text() == "keep me"
