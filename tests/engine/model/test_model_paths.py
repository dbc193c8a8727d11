"""What real models bring that the built-in one does not, each on a tiny local model built here:

- several end tokens (an instruct model's generation config lists two; its chat template ends turns with one);
- tokenizers whose tokens decoded alone are not their text in context (SentencePiece's word-start "▁",
  byte-level BPE's multi-byte characters), for the step texts of process supervision;
- the reward model's prompt (BOS, chat template), dropout, the sampling temperature in the log-probs;
- the accelerator's device: a whole run under tests/support/device_guard.py, which refuses host/device mixes as CUDA does.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from grpo_engine.algo.objective import outcome_advantages
from grpo_engine.model.model import disable_dropout, load_causal_lm
from grpo_engine.report.recorder import MemoryRecorder
from grpo_engine.rm.reward_model import RewardModel
from grpo_engine.rollout.outputs import encode_prompts as _encode_prompts
from grpo_engine.rollout.outputs import token_logprobs
from grpo_engine.rollout.sampling import generate
from grpo_engine.rollout.tokenization import completion_mask, end_token_ids, step_boundaries, token_pieces
from grpo_engine.spec.config import validate_spec
from grpo_engine.train.trainer import train
from tests.support.device_guard import DeviceGuard, DeviceMixError
from tests.support.files import write_dataset
from tests.support.tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A ChatML model whose turns end with <|im_end|> and whose generation config also lists <|endoftext|>."""
    out = write_tiny_model(tmp_path_factory.mktemp("models") / "qwen2", "qwen2")
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]})
    tokenizer.save_pretrained(out)
    config = json.loads((out / "generation_config.json").read_text())
    config["eos_token_id"] = [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]
    (out / "generation_config.json").write_text(json.dumps(config))
    return out


# --- several end tokens ------------------------------------------------------------------------


def test_every_end_token_of_the_generation_config_ends_a_completion(qwen_dir):
    model, tokenizer = load_causal_lm(str(qwen_dir))
    tokenizer.padding_side = "left"
    im_end, text_end = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tokenizer.eos_token_id == im_end and tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+2"}], tokenize=False
    ).endswith("<|im_end|>\n")
    assert end_token_ids(model, tokenizer) == [im_end, text_end]

    prompts = _encode_prompts(tokenizer, ["1+2", "3*4+5"], "cpu")
    free = generate(model, tokenizer, prompts, repeat=1, max_new_tokens=8, greedy=True, end_ids=[im_end])
    assert free.shape[1] == 8  # random weights: neither row emits <|im_end|>
    # make row 0's first greedy token the second end id: that row must stop right there
    row, k = free[0].tolist(), 0
    model.generation_config.eos_token_id = [im_end, row[k]]
    out = generate(model, tokenizer, prompts, repeat=1, max_new_tokens=8, greedy=True)
    mask, ended = completion_mask(out, end_token_ids(model, tokenizer))
    assert bool(ended[0]) and mask[0].tolist() == [1.0] * (k + 1) + [0.0] * (out.shape[1] - k - 1)
    assert out[0, : k + 1].tolist() == row[: k + 1] and (out[0, k + 1 :] == tokenizer.pad_token_id).all()


def test_completion_mask_with_two_end_ids_on_hand_numbers():
    rows = torch.tensor([[5, 3, 0, 0], [5, 6, 2, 7], [5, 6, 7, 8]])
    mask, ended = completion_mask(rows, [2, 3])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]] and ended.tolist() == [True, True, False]


def test_a_run_on_a_two_end_token_model_stops_and_scores_at_either(qwen_dir, tmp_path, grpo_cache_dir):
    spec = validate_spec(
        {
            "model": str(qwen_dir),
            "dataset": str(write_dataset(tmp_path / "d.jsonl")),
            "steps_per_iteration": 1,
            "batch_size": 2,
            "group_size": 4,
            "max_new_tokens": 10,
            "eval_every": 0,
        }
    )
    recorder = MemoryRecorder()
    assert train(spec, recorder, grpo_cache_dir, device="cpu").status == "completed"
    for sample in recorder.group_log[1][0].samples:
        assert "<|endoftext|>" not in sample.completion and "<|im_end|>" not in sample.completion


# --- step texts read in context -------------------------------------------------------------------


def sentencepiece_style_tokenizer() -> PreTrainedTokenizerFast:
    """Words with a leading "▁" (SentencePiece's Metaspace): decoded alone, a word-start token loses its space."""
    words = [
        "Natalia",
        "sold",
        "48",
        "clips",
        "in",
        "April",
        "then",
        "half",
        "as",
        "many",
        "in",
        "May",
        "\n",
        "24",
        "+",
        "=",
        "72",
        "####",
    ]
    vocab = {"<unk>": 0, "</s>": 1, "<pad>": 2}
    for w in words:
        vocab.setdefault("▁" + w, len(vocab))
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>", pad_token="<pad>")


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ASCII only: every é, 中 or emoji is split over 2-4 byte tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["the cafe sold 48 clips then 24 more"] * 10,
        trainers.BpeTrainer(
            vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def test_sentencepiece_style_steps_keep_their_spaces():
    tokenizer = sentencepiece_style_tokenizer()
    text = "Natalia sold 48 clips in April\nthen half as many in May\n#### 72"
    ids = tokenizer.encode(text, add_special_tokens=False)
    alone = tokenizer.batch_decode([[i] for i in ids])
    assert "".join(alone).startswith("Nataliasold48")  # what steps were cut from before
    (pieces,) = token_pieces(tokenizer, [ids])
    assert "".join(pieces) == tokenizer.decode(ids) == text
    steps, ends = step_boundaries(pieces)
    assert steps == ["Natalia sold 48 clips in April", "then half as many in May", "#### 72"]
    assert [pieces[e] for e in ends] == [" April", " May", " 72"]


def test_byte_level_steps_keep_multi_byte_characters_whole():
    tokenizer = byte_level_tokenizer()
    text = "the café sold 48 clips 中文\nthen 24 more 🙂\n#### 72"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert "\ufffd" in "".join(tokenizer.batch_decode([[i] for i in ids]))  # decoded alone: broken characters
    (pieces,) = token_pieces(tokenizer, [ids])
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    steps, ends = step_boundaries(pieces)
    assert steps == ["the café sold 48 clips 中文", "then 24 more 🙂", "#### 72"]
    assert pieces[ends[0]].endswith("文") and pieces[ends[1]] == "🙂"  # a step ends at its last character's token


def test_token_pieces_of_several_rows_and_of_special_tokens():
    tokenizer = byte_level_tokenizer()
    rows = [
        tokenizer.encode("中 then", add_special_tokens=False),
        [],
        tokenizer.encode("48", add_special_tokens=False) + [tokenizer.eos_token_id],
    ]
    pieces = token_pieces(tokenizer, rows)
    assert ["".join(p) for p in pieces] == ["中 then", "", "48"] and pieces[2][-1] == ""


# --- the reward model's prompt ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("models") / "llama", "llama")


@pytest.mark.parametrize("template", ["plain", "chat"])
def test_the_reward_model_reads_the_runs_prompt_with_bos(llama_dir, template):
    lm, tokenizer = load_causal_lm(str(llama_dir))
    rm = RewardModel(lm, tokenizer, "orm", prompt_template=template)
    ids, _, (start,) = rm.encode("1+2", ["3"])
    assert ids[0] == tokenizer.bos_token_id
    prompt = tokenizer.decode(ids[:start])
    if template == "chat":
        assert prompt == tokenizer.apply_chat_template(
            [{"role": "user", "content": "1+2"}], tokenize=False, add_generation_prompt=True
        )
    else:
        assert prompt == "<|begin_of_text|>1+2\n"


# --- dropout ----------------------------------------------------------------------------------------


def gpt2_with_dropout(tmp_path, p: float = 0.5):
    tokenizer = byte_level_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=p,
        embd_pdrop=p,
        attn_pdrop=p,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_disable_dropout_makes_training_forwards_equal_sampling_ones(tmp_path, llama_dir):
    model, tokenizer = load_causal_lm(str(gpt2_with_dropout(tmp_path)))
    tokenizer.padding_side = "left"
    prompts = _encode_prompts(tokenizer, ["the cafe", "sold 48 clips"], "cpu")
    comps = generate(model.eval(), tokenizer, prompts, repeat=2, max_new_tokens=6, greedy=False)
    mask, _ = completion_mask(comps, tokenizer.eos_token_id)
    ids, attn = prompts["input_ids"].repeat_interleave(2, 0), prompts["attention_mask"].repeat_interleave(2, 0)
    with torch.no_grad():
        old = token_logprobs(model.eval(), ids, attn, comps, mask)[0]
        noisy = token_logprobs(model.train(), ids, attn, comps, mask)[0]
        assert not torch.equal(old * mask, noisy * mask)  # dropout on: the ratio is not 1
        disable_dropout(model)
        assert torch.equal(old * mask, token_logprobs(model.train(), ids, attn, comps, mask)[0] * mask)
    llama, _ = load_causal_lm(str(llama_dir))
    llama.model.layers[0].self_attn.attention_dropout = 0.5  # a rate kept as a number, not an nn.Dropout
    disable_dropout(llama)
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in llama.model.layers)


def test_with_dropout_in_the_model_the_first_update_has_no_kl(tmp_path, grpo_cache_dir):
    """At step 1 the policy is the reference: with dropout left on in the update's forward, k3 was ~0.004."""
    spec = validate_spec(
        {
            "model": str(gpt2_with_dropout(tmp_path)),
            "dataset": str(write_dataset(tmp_path / "d.jsonl")),
            "prompt_template": "plain",
            "batch_size": 2,
            "group_size": 4,
            "max_new_tokens": 8,
            "eval_every": 0,
            "steps_per_iteration": 1,
            "precision": "fp32",
        }
    )
    recorder = MemoryRecorder()
    train(spec, recorder, grpo_cache_dir, device="cpu")
    assert recorder.metrics[0]["kl"] == 0.0  # fp32: a bf16 reference would differ from the policy by its rounding


# --- the sampling temperature -------------------------------------------------------------------------


def test_log_probs_are_those_of_the_tempered_distribution(llama_dir):
    model, tokenizer = load_causal_lm(str(llama_dir))
    tokenizer.padding_side = "left"
    prompts = _encode_prompts(tokenizer, ["1+2", "3*4+5"], "cpu")
    comps = generate(model, tokenizer, prompts, repeat=1, max_new_tokens=5, greedy=False, temperature=2.0)
    mask = torch.ones_like(comps, dtype=torch.float)
    ids, attn = prompts["input_ids"], prompts["attention_mask"]
    with torch.no_grad():
        logp, entropy = token_logprobs(model, ids, attn, comps, mask, temperature=2.0)
        full = torch.cat([ids, comps], 1)
        logits = model(
            input_ids=full,
            attention_mask=torch.cat([attn, mask.long()], 1),
            position_ids=(torch.cat([attn, mask.long()], 1).cumsum(1) - 1).clamp(min=0),
        ).logits
        want = torch.log_softmax(logits[:, ids.shape[1] - 1 : -1].float() / 2.0, -1)  # (N, T, V): logits / T
        assert torch.allclose(logp, want.gather(-1, comps[..., None])[..., 0], atol=1e-5)
        assert torch.allclose(entropy, -(want.exp() * want).sum(-1), atol=1e-5)
        assert not torch.allclose(logp, token_logprobs(model, ids, attn, comps, mask)[0], atol=1e-3)
    # the docstring's hand number: logits [2, 0] at T = 2 -> log_softmax([1, 0])
    assert torch.log_softmax(torch.tensor([2.0, 0.0]) / 2, -1).tolist() == pytest.approx([-0.3133, -1.3133], abs=1e-4)


# --- the accelerator's device ---------------------------------------------------------------------------


def test_the_device_guard_refuses_what_cuda_refuses():
    dev = torch.device("cpu")  # the accelerator's device, as the trainer names it
    with DeviceGuard():
        mask = torch.ones(4, 3, device=dev)
        rewards = torch.tensor([0.0, 1.0, 0.0, 1.0]).view(-1, 2)  # built on the host
        with pytest.raises(DeviceMixError, match="same device"):
            _ = outcome_advantages(rewards).view(-1, 1) * mask  # the outcome branch's old bug
        ok = outcome_advantages(torch.tensor([0.0, 1.0, 0.0, 1.0], device=dev).view(-1, 2)).view(-1, 1) * mask
        moved = outcome_advantages(rewards).to(dev).view(-1, 1) * mask
        assert torch.equal(ok, moved)
        assert torch.equal(mask * torch.tensor(2.0), mask * 2)  # a 0-dim host tensor may join, as on CUDA
        with pytest.raises(DeviceMixError):
            torch.cat([mask, torch.zeros(1, 3)])
        assert mask[torch.tensor([0, 2])].shape == (2, 3)  # an index tensor may be on the host
        with pytest.raises(DeviceMixError):
            _ = mask.cpu() + mask


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"supervision": "process"},
        {"lora_rank": 4, "policy_updates_per_batch": 2, "micro_batch_size": 3},
        {"reward": "model", "rm_samples": 16, "iterations": 2},
        {"reward": "model", "supervision": "process", "rm_samples": 16},
    ],
    ids=["outcome", "process", "lora-mu2-micro", "orm-2-iterations", "prm"],
)
def test_a_run_keeps_every_tensor_on_the_accelerators_device(grpo_cache_dir, tmp_path, overrides):
    spec = validate_spec(
        {
            "steps_per_iteration": 2,
            "batch_size": 2,
            "group_size": 4,
            "max_new_tokens": 12,
            "eval_every": 1,
            "checkpoint_every": 1,
            **overrides,
        }
    )
    with DeviceGuard():
        result = train(spec, MemoryRecorder(), grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path / "ckpt")
    assert result.status == "completed"


def test_a_bf16_checkpoint_is_trained_in_fp32(tmp_path):
    """Instruct models ship bf16 weights, which transformers 5 loads as they are; AdamW's small updates would
    vanish in them, so the policy (and a reward model) load in fp32 and autocast runs the forward in bf16."""
    lm, tokenizer = load_causal_lm(str(write_tiny_model(tmp_path / "m", "qwen2")))
    lm.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    loaded, _ = load_causal_lm(str(tmp_path / "bf16"))
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}


# --- memory: a bf16 reference, gradient checkpointing, the estimate -----------------------------------------


def test_under_bf16_the_reference_is_kept_in_bf16_and_the_estimate_is_logged(grpo_cache_dir, tmp_path):
    from safetensors import safe_open

    from grpo_engine.model.model import builtin_model_dir
    from grpo_engine.spec.memory import estimate_memory
    from grpo_engine.train import checkpoint
    from tests.support.runs import PauseAt

    spec = validate_spec(
        {
            "precision": "bf16",
            "iterations": 2,
            "steps_per_iteration": 2,
            "batch_size": 2,
            "group_size": 4,
            "max_new_tokens": 12,
            "eval_every": 0,
            "checkpoint_every": 1,
        }
    )
    recorder = PauseAt(3)  # pause after step 3, the first of iteration 2: its checkpoint holds the reset reference
    assert train(spec, recorder, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path).status == "paused"
    with safe_open(str(checkpoint.latest(tmp_path)[1] / "reference.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    with safe_open(str(checkpoint.latest(tmp_path)[1] / "policy.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}  # weights and optimizer stay fp32
    resumed = MemoryRecorder()  # the bf16 reference loads back from the checkpoint and training goes on
    assert train(spec, resumed, grpo_cache_dir, device="cpu", checkpoint_dir=tmp_path).status == "completed"
    assert [m["step"] for m in resumed.metrics] == [4]
    (line,) = [m for m in recorder.messages if m.startswith("memory estimate")]
    n = sum(p.numel() for p in load_causal_lm(str(builtin_model_dir(grpo_cache_dir)))[0].parameters())
    assert (
        line == "memory estimate (activations not included): " + estimate_memory(n, n, lora=False, bf16=True).describe()
    )


def test_gradient_checkpointing_changes_memory_not_results(grpo_cache_dir):
    """Recomputed activations (the flat forward: no KV cache while training) train as the shared-prompt forward
    does; 32 new tokens let the built-in model answer, so some group has spread and a step's gradient is real (a
    step whose groups are each all right or all wrong has only the KL term's)."""
    runs = []
    for checkpointing in (False, True):
        recorder = MemoryRecorder()
        spec = validate_spec(
            {
                "gradient_checkpointing": checkpointing,
                "steps_per_iteration": 2,
                "batch_size": 2,
                "group_size": 4,
                "max_new_tokens": 32,
                "eval_every": 0,
                "precision": "fp32",
            }
        )  # bf16 scoring rounds the two forwards differently
        train(spec, recorder, grpo_cache_dir, device="cpu")
        runs.append(recorder.metrics)
    assert max(m["grad_norm"] for m in runs[0]) > 0.1
    for plain, recomputed in zip(*runs, strict=True):
        for key in ("reward_mean", "loss", "kl", "grad_norm", "entropy"):
            assert recomputed[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-7), key


def test_a_reward_model_from_another_checkpoint_is_counted_once_loaded(grpo_cache_dir, llama_dir, qwen_dir, tmp_path):
    spec = validate_spec(
        {
            "model": str(qwen_dir),
            "dataset": str(write_dataset(tmp_path / "d.jsonl")),
            "reward": "model",
            "reward_model": str(llama_dir),
            "rm_samples": 8,
            "steps_per_iteration": 1,
            "batch_size": 2,
            "group_size": 4,
            "max_new_tokens": 8,
            "eval_every": 0,
        }
    )
    recorder = MemoryRecorder()
    assert train(spec, recorder, grpo_cache_dir, device="cpu").status == "completed"
    first, second = [m for m in recorder.messages if m.startswith("memory estimate")]
    assert "reward model" not in first and "reward model" in second


def test_the_group_view_shows_each_tokens_text_in_context():
    """What judge() records as a sample's tokens: the pieces that spell the completion, then the end token."""
    from grpo_engine.rollout.outputs import judge

    for tokenizer, text in (
        (sentencepiece_style_tokenizer(), "Natalia sold 48 clips\n#### 72"),
        (byte_level_tokenizer(), "the café sold 中文\n#### 72"),
    ):
        ids = tokenizer.encode(text, add_special_tokens=False)
        completions = torch.tensor([ids + [tokenizer.eos_token_id, tokenizer.pad_token_id], ids + ids[:2]])
        mask, ended = completion_mask(completions, tokenizer.eos_token_id)
        judged = judge(tokenizer, completions, mask, ended, [{"question": "q", "answer": "72"}] * 2, process=True)
        first, second = judged.tokens
        assert "".join(first[:-1]) == judged.texts[0] == text and first[-1] == tokenizer.eos_token
        assert len(first) == len(ids) + 1 and len(second) == len(ids) + 2  # one text per token
        assert "".join(second) == judged.texts[1] == tokenizer.decode(ids + ids[:2])  # cut at max_new_tokens
        assert judged.outcome[0][1]["correct"] == 1.0
        assert judged.steps[0] == text.split("\n")
