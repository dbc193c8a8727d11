"""Real-model paths: local Llama and Qwen2 models (random weights, chat templates) trained on local
dataset files of every format, with outcome and process supervision, through the engine and through
the live dashboard (gradio_client); the prompt template each model gets."""

from __future__ import annotations

import pytest
from gradio_client import Client

from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rollout.tokenization import prompt_formatter
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.trainer import train
from tests.support.files import ROWS, write_dataset
from tests.support.servers import clean_env, start_server, wait_finished
from tests.support.tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {arch: write_tiny_model(root / arch, arch) for arch in ("llama", "qwen2")}


def test_each_model_gets_its_chat_template_and_base_models_a_plain_prompt(models, grpo_cache_dir):
    from transformers import AutoTokenizer

    from grpo_engine.model.model import builtin_model_dir

    llama = AutoTokenizer.from_pretrained(models["llama"])
    qwen = AutoTokenizer.from_pretrained(models["qwen2"])
    assert prompt_formatter(llama, "auto")("1+2") == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n1+2<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert prompt_formatter(qwen, "auto")("1+2") == "<|im_start|>user\n1+2<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_formatter(qwen, "plain")("1+2") == "1+2\n"
    assert prompt_formatter(llama, "plain")("1+2") == "<|begin_of_text|>1+2\n"  # BOS first, as the model expects
    builtin = AutoTokenizer.from_pretrained(builtin_model_dir(grpo_cache_dir))
    assert prompt_formatter(builtin, "auto")("1+2") == "1+2\n"  # no chat template: plain
    with pytest.raises(ValueError, match="prompt_template"):
        prompt_formatter(builtin, "chat")


@pytest.mark.parametrize(
    "arch, supervision, suffix",
    [
        ("llama", "outcome", ".jsonl"),
        ("llama", "process", ".csv"),
        ("qwen2", "outcome", ".parquet"),
        ("qwen2", "process", ".jsonl"),
    ],
)
def test_short_runs_on_each_architecture_and_file_format(models, tmp_path, grpo_cache_dir, arch, supervision, suffix):
    dataset = write_dataset(tmp_path / f"data{suffix}")
    spec = validate_spec(
        {
            "model": str(models[arch]),
            "dataset": str(dataset),
            "supervision": supervision,
            "steps_per_iteration": 2,
            "batch_size": 2,
            "group_size": 4,
            "max_new_tokens": 12,
            "eval_every": 1,
            "learning_rate": 1e-3,
            "format_reward": 0.1 if supervision == "outcome" else 0.0,
        }
    )  # process rewards steps only
    recorder = MemoryRecorder()
    result = train(spec, recorder, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "ckpt")
    assert result.status == "completed"
    assert [m["step"] for m in recorder.metrics] == [0, 1, 2]
    group = recorder.group_log[2][0]
    assert group.prompt in {r["question"] for r in ROWS} and len(group.samples) == 4
    for sample in group.samples:
        assert len(sample.tokens) == len(sample.advantages) <= 12
        assert (sample.step_end_indices is not None) == (supervision == "process")
    assert (tmp_path / "ckpt" / "final" / "model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_qwen2_run_on_a_parquet_file_through_the_dashboard(models, tmp_path, grpo_cache_dir):
    dataset = write_dataset(tmp_path / "train.parquet")
    env = clean_env(grpo_cache_dir, GRPO_PATH_ROOTS=f"{tmp_path}:{models['qwen2'].parent}")
    server, url = start_server(tmp_path / "data", env)
    try:
        client = Client(url, verbose=False)
        spec = {
            "model": str(models["qwen2"]),
            "dataset": str(dataset),
            "steps_per_iteration": 2,
            "batch_size": 2,
            "group_size": 4,
            "max_new_tokens": 12,
            "eval_every": 0,
        }
        run_id = client.predict(spec, api_name="/launch_run")["run_id"]
        run = wait_finished(client, run_id, server.log)
        assert run["status"] == "completed", run
        (group,) = client.predict(run_id, None, "position", api_name="/list_groups")[:1]
        assert group["prompt"] in {r["question"] for r in ROWS}
        samples = client.predict(group["group_id"], api_name="/get_group")["samples"]
        assert len(samples) == 4 and all(len(s["tokens"]) == len(s["advantages"]) for s in samples)
    finally:
        server.stop()


def test_a_run_on_a_hugging_face_dataset_directory_with_config_and_splits(tmp_path, grpo_cache_dir):
    from app.core.paths import check_spec_paths
    from tests.support.files import GSM8K_LIKE, write_hub_style_dataset

    root = write_hub_style_dataset(tmp_path / "gsm8k")
    raw = {
        "dataset": str(root),
        "dataset_config": "main",
        "eval_split": "test",
        "steps_per_iteration": 2,
        "batch_size": 2,
        "group_size": 4,
        "max_new_tokens": 16,
        "eval_every": 1,
    }
    check_spec_paths(raw, [tmp_path])  # a dataset directory inside the roots is accepted at launch
    recorder = MemoryRecorder()
    assert train(validate_spec(raw), recorder, grpo_cache_dir, device="cpu").status == "completed"
    questions = {r["question"] for r in GSM8K_LIKE[:10]}
    assert all(g.prompt in questions for g in recorder.group_log[2])  # trained on the train split
    assert "eval/accuracy" in recorder.metrics[0]  # evaluated on the test split


def test_a_hub_model_that_cannot_be_reached_fails_with_a_message_saying_so():
    import os
    import subprocess
    import sys

    code = (
        "from grpo_engine.model.model import load_causal_lm\n"
        "try:\n    load_causal_lm('nobody/no-such-model')\nexcept FileNotFoundError as e:\n    print(e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # no hub here: fail at once, not after the retries
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith(
        "could not load model 'nobody/no-such-model': We couldn't connect to 'https://huggingface.co'"
    ), out
