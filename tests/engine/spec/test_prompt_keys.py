"""The prompt keys (system_prompt, question_template): how a question is worded and framed for the model, the same
for training, evaluation, the reward model and rollout labels; their refusals; and the Launch form's preview of the
first training question as the model reads it (/preview_prompt)."""

from __future__ import annotations

import pytest

from app.service import api, previews
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rollout.tokenization import prompt_formatter
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.train.trainer import train
from tests.support.files import ROWS, write_dataset
from tests.support.tiny_models import write_tiny_model

INSTRUCTION = '{question}\nLet\'s think step by step and output the final answer after "####".'


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A tiny Qwen2 model directory with Qwen's ChatML chat template (random weights)."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "qwen2", "qwen2")


def test_the_question_is_worded_then_framed_by_the_chat_template_with_a_system_turn(qwen):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen)
    chat = prompt_formatter(tokenizer, "auto", "Be brief.", INSTRUCTION)
    assert chat("1+2") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+2\nLet's think step by "
        'step and output the final answer after "####".<|im_end|>\n<|im_start|>assistant\n'
    )
    assert (
        prompt_formatter(tokenizer, "plain", "Be brief.", "Q: {question} in \\boxed{}")("1+2")
        == "Be brief.\nQ: 1+2 in \\boxed{}\n"
    )  # braces other than {question} stay as written
    assert prompt_formatter(tokenizer, "auto")("1+2") == "<|im_start|>user\n1+2<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("template", ["Solve it.", "{question} and again {question}", "{Question}"])
def test_a_question_template_without_exactly_one_slot_is_refused_naming_the_key(template):
    with pytest.raises(SpecError, match=r"^question_template: must hold \{question\} once"):
        validate_spec({"question_template": template})


def test_a_long_system_prompt_is_refused_naming_the_key():
    with pytest.raises(SpecError, match="^system_prompt: "):
        validate_spec({"system_prompt": "x" * 8001})


def test_training_and_its_recorded_prompts_read_the_worded_question(qwen, tmp_path, grpo_cache_dir):
    from transformers import AutoTokenizer

    dataset = write_dataset(tmp_path / "data.jsonl")
    spec = validate_spec(
        {
            "model": str(qwen),
            "dataset": str(dataset),
            "steps_per_iteration": 1,
            "batch_size": 2,
            "group_size": 2,
            "max_new_tokens": 6,
            "eval_every": 1,
            "system_prompt": "Be brief.",
            "question_template": INSTRUCTION,
        }
    )
    recorder = MemoryRecorder()
    assert train(spec, recorder, grpo_cache_dir, device="cpu").status == "completed"
    expected = prompt_formatter(AutoTokenizer.from_pretrained(qwen), "auto", "Be brief.", INSTRUCTION)
    for group in recorder.group_log[1]:
        assert group.prompt in {r["question"] for r in ROWS}  # the dataset's question, as it was asked
        assert group.model_prompt == expected(group.prompt)  # what the model read
        assert "<|im_start|>system\nBe brief." in group.model_prompt and 'after "####"' in group.model_prompt


def test_the_reward_model_reads_the_question_as_the_policy_does(qwen):
    from grpo_engine.model.model import load_causal_lm
    from grpo_engine.rm.reward_model import RewardModel

    lm, tokenizer = load_causal_lm(str(qwen))
    rm = RewardModel(lm, tokenizer, "orm", "auto", system_prompt="Be brief.", question_template=INSTRUCTION)
    assert rm.prompt("1+2") == prompt_formatter(tokenizer, "auto", "Be brief.", INSTRUCTION)("1+2")


def test_the_preview_shows_the_first_training_question_as_the_model_reads_it(settings_env, monkeypatch, qwen, tmp_path):
    from transformers import AutoTokenizer

    dataset = write_dataset(tmp_path / "data.jsonl")
    monkeypatch.setenv("GRPO_PATH_ROOTS", f"{tmp_path}:{qwen.parent}")
    spec = {"model": str(qwen), "dataset": str(dataset), "system_prompt": "Be brief.", "question_template": INSTRUCTION}
    result = previews.preview_prompt(spec)
    tokenizer = AutoTokenizer.from_pretrained(qwen)
    prompt = prompt_formatter(tokenizer, "auto", "Be brief.", INSTRUCTION)(ROWS[0]["question"])
    assert result["question"] == ROWS[0]["question"] and not result["stand_in"]
    assert result["prompt"] == prompt
    assert result["token_count"] == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert result["special_tokens"] == ["<|im_start|>", "<|im_end|>"]
    page = previews.prompt_html(result)
    assert '<mark class="special">&lt;|im_start|&gt;</mark>system' in page and f"{result['token_count']} tokens" in page

    builtin = previews.preview_prompt({"question_template": "Q: {question}"})  # the built-in model: plain
    assert builtin["prompt"] == f"Q: {builtin['question']}\n" and builtin["special_tokens"] == []
    with pytest.raises(api.ApiError, match="^question_template: "):
        previews.preview_prompt({"question_template": "no slot"})
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(api.ApiError, match="^model: the tokenizer of .* could not be loaded"):
        previews.preview_prompt({"model": str(tmp_path / "empty")})  # a model directory without a tokenizer
