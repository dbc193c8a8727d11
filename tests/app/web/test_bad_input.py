"""Bad input through gradio_client: every refusal names what is wrong, and the server carries on.

One real server (app.web.ui.serve in a subprocess, SQLite store and ``sqla+sqlite`` broker in a temporary
directory, no worker) with GRPO_PATH_ROOTS set to one directory and a small GRPO_MAX_UPLOAD_MB. A table
of bad run specs (types, ranges, unknown keys, relations, paths outside the roots, '..' and symlink
escapes, missing or unusable model directories and dataset files) goes to /launch_run, and a table of
malformed dataset files goes both to /launch_run (as the spec's dataset, inside the root) and to
/upload_dataset. Each must raise AppError whose message holds the key or the file name and the reason;
no refused launch may leave a run. Afterwards the server still lists runs and launches a valid spec.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pandas as pd
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from tests.support.files import GOOD_ROWS, write_jsonl
from tests.support.servers import running_server, server_env

pytestmark = pytest.mark.slow

MAX_UPLOAD_MB = 0.05  # 52,428 bytes: every file below fits except big.jsonl


def _make_files(root: Path, outside: Path) -> None:
    """The root's model directories and dataset files, good and bad; files outside it and symlinks out."""
    for d in (root / "model", root / "empty-model", outside / "model"):
        d.mkdir(parents=True)
    (root / "model" / "config.json").write_text("{}")
    (outside / "model" / "config.json").write_text("{}")
    write_jsonl(outside / "secret.jsonl", GOOD_ROWS)
    (root / "escape.jsonl").symlink_to(outside / "secret.jsonl")
    (root / "model-link").symlink_to(outside / "model")
    write_jsonl(root / "good.jsonl", GOOD_ROWS)
    (root / "bad_json.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": \n')
    write_jsonl(root / "not_object.jsonl", [GOOD_ROWS[0], [1, 2]])
    write_jsonl(root / "missing_answer.jsonl", [GOOD_ROWS[0], {"question": "2+2"}])
    write_jsonl(root / "empty_question.jsonl", [GOOD_ROWS[0], GOOD_ROWS[1], {"question": " ", "answer": "1"}])
    write_jsonl(root / "list_answer.jsonl", [GOOD_ROWS[0], {"question": "2+2", "answer": [4]}])
    write_jsonl(root / "one_row.jsonl", [GOOD_ROWS[0]])
    (root / "empty.jsonl").write_text("")
    (root / "blank.csv").write_text("\n\n  \n")
    (root / "binary.jsonl").write_bytes(b'{"question": "1", "answer": "1"}\n\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR')
    (root / "latin1.csv").write_bytes("question,answer\ncaf\xe9,1\n".encode("latin-1"))
    (root / "bad_columns.csv").write_text("prompt,reference\n1+1,2\n2+2,4\n")
    (root / "short_row.csv").write_text("question,answer\n1+1,2\n2+2\n")
    (root / "empty_answer.csv").write_text("question,answer\n1+1,2\n2+2,\n")
    (root / "broken.parquet").write_text("this is not parquet")
    pd.DataFrame({"question": ["1+1", "2+2"]}).to_parquet(root / "no_answer.parquet")
    pd.DataFrame({"question": ["1+1", "2+2"], "answer": ["2", None]}).to_parquet(root / "empty_answer.parquet")
    (root / "notes.txt").write_text("question,answer\n1+1,2\n2+2,4\n")
    write_jsonl(root.parent / "big.jsonl", GOOD_ROWS * 1000)  # over MAX_UPLOAD_MB


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(client, url, root, outside) of a server whose only path root is ``root``."""
    tmp = tmp_path_factory.mktemp("bad-input")
    root, outside = tmp / "root", tmp / "outside"
    _make_files(root, outside)
    env = server_env(
        tmp / "data",
        GRPO_PATH_ROOTS=str(root),
        GRPO_MAX_UPLOAD_MB=str(MAX_UPLOAD_MB),
        GRPO_MAX_MODEL_UPLOAD_MB=str(MAX_UPLOAD_MB),  # the model cap too: Gradio's limit is the larger
    )
    (tmp / "data").mkdir()
    with running_server(tmp / "data", env) as (url, proc, log_path):
        yield Client(url, verbose=False), url, root, outside
        assert proc.poll() is None, f"the server died:\n{log_path.read_text()}"


# (case id, run spec ("{root}" and "{outside}" filled in), words the message must hold; the first is the key)
BAD_SPECS = [
    ("group_size_1", {"group_size": 1}, ["group_size", "at least 2"]),
    ("batch_size_0", {"batch_size": 0}, ["batch_size", "at least 1"]),
    ("clip_eps_0", {"clip_eps": 0}, ["clip_eps", "greater than 0"]),
    ("kl_coef_negative", {"kl_coef": -1}, ["kl_coef", "at least 0"]),
    ("learning_rate_text", {"learning_rate": "fast"}, ["learning_rate", "must be a number", "fast"]),
    ("learning_rate_above_1", {"learning_rate": 2}, ["learning_rate", "at most 1"]),
    ("temperature_0", {"temperature": 0}, ["temperature", "greater than 0"]),
    ("top_p_1.5", {"top_p": 1.5}, ["top_p", "at most 1"]),
    ("lora_rank_negative", {"lora_rank": -1}, ["lora_rank", "at least 0"]),
    ("precision_fp8", {"precision": "fp8"}, ["precision", "must be one of", "fp8"]),
    ("device_tpu", {"device": "tpu"}, ["device", "must be one of", "tpu"]),
    ("checkpoint_keep_0", {"checkpoint_keep": 0}, ["checkpoint_keep", "at least 1"]),
    ("checkpoint_every_negative", {"checkpoint_every": -5}, ["checkpoint_every", "at least 0"]),
    ("rm_replay_ratio_2", {"rm_replay_ratio": 2}, ["rm_replay_ratio", "at most 1"]),
    ("max_new_tokens_huge", {"max_new_tokens": 100_000}, ["max_new_tokens", "at most 32768"]),
    ("steps_per_iteration_negative", {"steps_per_iteration": -1}, ["steps_per_iteration", "at least 0"]),
    ("seed_negative", {"seed": -1}, ["seed", "at least 0"]),
    ("group_size_text", {"group_size": "eight"}, ["group_size", "must be an integer", "eight"]),
    ("group_size_fraction", {"group_size": 2.5}, ["group_size", "must be an integer"]),
    ("iterations_boolean", {"iterations": True}, ["iterations", "boolean"]),
    ("name_number", {"name": 5}, ["name", "must be a string"]),
    ("model_list", {"model": ["a"]}, ["model", "must be a string"]),
    ("supervision_both", {"supervision": "both"}, ["supervision", "must be one of", "both"]),
    ("reward_learned", {"reward": "learned"}, ["reward", "must be one of", "learned"]),
    ("unknown_key", {"grop_size": 8}, ["grop_size", "unknown key"]),
    ("model_empty", {"model": ""}, ["model", "must not be empty"]),
    ("reward_model_with_rule", {"reward_model": "gpt2"}, ["reward_model", "only used with reward 'model'"]),
    ("not_an_object", [1, 2], ["run spec", "must be a JSON object"]),
    ("invalid_json_text", '{"group_size": ', ["run spec", "not valid JSON"]),
    ("model_outside_roots", {"model": "{outside}/model"}, ["model", "outside the directories runs may read"]),
    ("model_root_dir", {"model": "/"}, ["model", "outside"]),
    ("model_home", {"model": "~"}, ["model", "outside"]),
    ("reward_model_outside_roots", {"reward": "model", "reward_model": "{outside}/model"}, ["reward_model", "outside"]),
    ("dataset_outside_roots", {"dataset": "{outside}/secret.jsonl"}, ["dataset", "outside"]),
    ("dataset_system_file", {"dataset": "/etc/passwd"}, ["dataset", "outside"]),
    ("dataset_dotdot_escape", {"dataset": "{root}/../outside/secret.jsonl"}, ["dataset", "outside"]),
    ("dataset_symlink_escape", {"dataset": "{root}/escape.jsonl"}, ["dataset", "outside"]),
    ("model_symlink_escape", {"model": "{root}/model-link"}, ["model", "outside"]),
    ("model_missing", {"model": "{root}/no-such-model"}, ["model", "no-such-model", "does not exist"]),
    ("model_without_config", {"model": "{root}/empty-model"}, ["model", "empty-model", "no config.json"]),
    ("model_is_a_file", {"model": "{root}/good.jsonl"}, ["model", "good.jsonl", "no config.json"]),
    ("dataset_missing", {"dataset": "{root}/missing.jsonl"}, ["dataset", "missing.jsonl", "does not exist"]),
    ("dataset_is_a_directory", {"dataset": "{root}/model"}, ["dataset", "not a dataset file, nor a dataset directory"]),
]

# (file in the root, words the message must hold besides the file's name)
BAD_FILES = [
    ("bad_json.jsonl", ["line 2", "not valid JSON"]),
    ("not_object.jsonl", ["line 2", "not a JSON object"]),
    ("missing_answer.jsonl", ["line 2", "needs the fields 'question' and 'answer'"]),
    ("empty_question.jsonl", ["line 3", "empty 'question'"]),
    ("list_answer.jsonl", ["line 2", "'answer' must be text or a number"]),
    ("one_row.jsonl", ["needs at least 2 rows, found 1"]),
    ("empty.jsonl", ["the file is empty"]),
    ("blank.csv", ["the file is empty"]),
    ("binary.jsonl", ["line 2", "binary file"]),
    ("latin1.csv", ["line 2", "not UTF-8"]),
    ("bad_columns.csv", ["needs the columns 'question' and 'answer'", "'prompt'"]),
    ("short_row.csv", ["line 3", "has 1 field, the header has 2"]),
    ("empty_answer.csv", ["line 3", "empty 'answer'"]),
    ("broken.parquet", ["not a valid Parquet file"]),
    ("no_answer.parquet", ["needs the columns", "missing 'answer'"]),
    ("empty_answer.parquet", ["row 2", "empty 'answer'"]),
    ("notes.txt", ["unsupported file type '.txt'"]),
]


def _fill(value, root: Path, outside: Path):
    """``value`` with "{root}" and "{outside}" replaced by those directories in its strings."""
    if isinstance(value, dict):
        return {k: _fill(v, root, outside) for k, v in value.items()}
    if isinstance(value, str):
        return value.replace("{root}", str(root)).replace("{outside}", str(outside))
    return value


def _refused(call) -> str:
    """The AppError message of a call that must be refused."""
    with pytest.raises(AppError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("spec,words", [case[1:] for case in BAD_SPECS], ids=[case[0] for case in BAD_SPECS])
def test_bad_spec_is_refused_naming_the_key(server, spec, words):
    client, _, root, outside = server
    message = _refused(lambda: client.predict(_fill(spec, root, outside), api_name="/launch_run"))
    key, *reason = words
    assert message.startswith(f"{key}: ") or key == "run spec", message
    for word in [key, *reason]:
        assert word in message, message
    assert client.predict(api_name="/list_runs") == []  # nothing stored


@pytest.mark.parametrize("name,words", BAD_FILES, ids=[f"launch-{n}" for n, _ in BAD_FILES])
def test_bad_dataset_file_is_refused_at_launch_naming_the_file_and_line(server, name, words):
    client, _, root, _ = server
    message = _refused(lambda: client.predict({"dataset": str(root / name)}, api_name="/launch_run"))
    assert message.startswith(f"dataset: {root / name}"), message
    for word in words:
        assert word in message, message
    assert client.predict(api_name="/list_runs") == []


@pytest.mark.parametrize("name,words", BAD_FILES, ids=[f"upload-{n}" for n, _ in BAD_FILES])
def test_bad_dataset_file_is_refused_on_upload_naming_the_file_and_line(server, name, words):
    client, _, root, _ = server
    message = _refused(lambda: client.predict(handle_file(root / name), api_name="/upload_dataset"))
    assert message.startswith(f"{name}: "), message  # the name the user gave, not a path on the server
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("file", ["/etc/passwd", {"path": "/etc/passwd"}, {"path": "{root}/good.jsonl"}, 42])
def test_upload_of_something_not_uploaded_is_refused(server, file):
    client, _, root, outside = server
    message = _refused(lambda: client.predict(_fill(file, root, outside), api_name="/upload_dataset"))
    assert message == "file must be an uploaded file (gradio_client: handle_file(path))"


def test_oversized_upload_is_refused(server):
    client, url, root, _ = server
    big = root.parent / "big.jsonl"
    assert big.stat().st_size > MAX_UPLOAD_MB * 2**20
    with pytest.raises(ValueError, match=f"exceeds the maximum file size of {int(MAX_UPLOAD_MB * 2**20)} bytes"):
        client.predict(handle_file(big), api_name="/upload_dataset")  # gradio_client checks before sending
    with open(big, "rb") as f:  # and the server refuses it when a client does not check
        response = httpx.post(url + "gradio_api/upload", files=[("files", ("big.jsonl", f))], timeout=30)
    assert response.status_code == 413 and "maximum allowed size" in response.text


def test_the_table_has_at_least_30_distinct_bad_inputs():
    cases = [json.dumps(spec, sort_keys=True) for _, spec, _ in BAD_SPECS] + [name for name, _ in BAD_FILES]
    assert len(set(cases)) == len(cases) >= 30


def test_the_server_answers_normally_afterwards(server):
    """Runs after the tables above (pytest keeps the file's order): nothing was stored, and a good upload
    and a valid spec that uses it launch."""
    client, _, root, _ = server
    assert client.predict(api_name="/list_runs") == []
    uploaded = client.predict(handle_file(root / "good.jsonl"), api_name="/upload_dataset")
    assert uploaded["rows"] == 3 and uploaded["preview"][0] == {"question": "1+2*3", "answer": "7", "solution": ""}
    for dataset in (uploaded["dataset"], str(root / "good.jsonl")):
        launched = client.predict(
            {"name": "after", "model": str(root / "model"), "dataset": dataset}, api_name="/launch_run"
        )
        assert launched["status"] == "queued"
        assert client.predict(launched["run_id"], api_name="/get_run")["config"]["dataset"] == dataset
    assert [r["status"] for r in client.predict(api_name="/list_runs")] == ["queued", "queued"]
