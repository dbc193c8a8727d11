"""Files the tests write: dataset rows (JSONL, Parquet, GSM8K- and hub-style), .gguf files with a real header, a model
directory, a custom rewards file; and the real model's .gguf the environment names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD_ROWS = [
    {"question": "1+2*3", "answer": "7"},
    {"question": "2*3-1", "answer": 5, "solution": "2*3=6\n#### 5"},
    {"question": "4-1+2", "answer": "5"},
]


TENSORS = {
    "token_embd.weight": (32, 8),
    "blk.0.attn_norm.weight": (8,),
    "blk.0.attn_q.weight": (8, 8),
    "blk.0.attn_k.weight": (4, 8),
    "blk.0.ffn_up.weight": (16, 8),
    "blk.0.ffn_down.weight": (8, 16),
    "output_norm.weight": (8,),
}  # torch's shapes: a linear weight is (out, in); the head tied (no "output")


def write_gguf(path: Path, tensors: dict = TENSORS) -> Path:
    """A small GGUF file (llama metadata, a vocabulary, nested arrays) holding ``tensors`` as fp32 zeros."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list([f"tok{i}" for i in range(32)])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_float32("test.scale", 1.5)
    writer.add_string("test.name", "é 🙂")
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fake_model_dir(path: Path, weights: int = 1000) -> Path:
    """A directory shaped as a model (config.json, .safetensors weights of ``weights`` bytes, a tokenizer); not
    loadable: for the checks that never load it."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"\0" * weights)
    (path / "tokenizer.json").write_text("{}")
    return path


ROWS = [
    {
        "question": f"{a}+{b}*{c}",
        "answer": str(a + b * c),
        "solution": f"{b}*{c}={b * c}\n{a}+{b * c}={a + b * c}\n#### {a + b * c}",
    }
    for a in range(1, 4)
    for b in range(1, 4)
    for c in range(1, 3)
]


def write_dataset(path, rows=ROWS):
    """``rows`` as .jsonl, .csv or .parquet, by the path's extension."""
    frame = pd.DataFrame(rows)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return path


GSM8K_LIKE = [
    {
        "question": f"Tom has {i} apples and buys {i + 2} more. How many?",
        "answer": f"He has {i}+{i + 2}={2 * i + 2}.\n#### {2 * i + 2}",
    }
    for i in range(12)
]


def write_hub_style_dataset(root):
    """A dataset directory laid out as on the Hugging Face Hub (openai/gsm8k's shape): a config 'main'
    with train and test splits, declared in the README's YAML header."""
    import json

    (root / "main").mkdir(parents=True)
    for split, rows in (("train", GSM8K_LIKE[:10]), ("test", GSM8K_LIKE[10:])):
        (root / "main" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n"
        "  - split: test\n    path: main/test.jsonl\n---\n"
    )
    return root


FILE = '''
def equations(question, completion, reference, **row):
    """Process: 1.0 for each step that holds an '=', else 0.0."""
    return [1.0 if "=" in step else 0.0 for step in row["steps"]]


def words(question, completion, reference, **row):
    """Outcome: the number of words."""
    return len(completion.split())


def not_a_number(question, completion, reference, **row):
    return "high"
'''
