""".gguf files as a run's model, without a real model: the header's shapes (grpo_engine.spec.gguf_header, checked against
the gguf package's reader), the launch checks (app.core.paths: a file inside the roots, starting with the GGUF magic;
app.service.api: the GPU-memory estimate from the header), and the conversion's cache (grpo_engine.model.gguf_model: once per
file, again when it changes). The real SmolLM2 file converted and trained: tests/engine/model/test_smollm2.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app import store
from app.core.paths import check_spec_paths
from app.service import api
from app.store.db import session_scope
from grpo_engine.spec.config import SpecError, validate_spec
from grpo_engine.spec.gguf_header import gguf_parameter_counts, gguf_tensor_shapes
from grpo_engine.spec.memory import estimate_memory
from tests.support.files import TENSORS, write_gguf
from tests.support.servers import ROOT

QUEUE = "grpo-gguf-test"


# ---- the header ------------------------------------------------------------------------------------


def test_the_header_gives_each_tensors_shape_as_the_gguf_package_reads_it(tmp_path):
    from gguf import GGUFReader

    path = write_gguf(tmp_path / "m.gguf")
    shapes = gguf_tensor_shapes(path)
    assert shapes == TENSORS
    assert {t.name: tuple(int(n) for n in reversed(t.shape)) for t in GGUFReader(str(path)).tensors} == shapes
    total, linear = gguf_parameter_counts(path)
    assert total == sum(int(np.prod(s)) for s in TENSORS.values()) == 32 * 8 + 8 + 64 + 32 + 128 + 128 + 8
    assert sorted(linear) == sorted([(8, 8), (4, 8), (16, 8), (8, 16)])  # the blocks' linear weights only


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda data: b"GGML" + data[4:], "not a GGUF file"),
        (lambda data: data[:4] + (7).to_bytes(4, "little") + data[8:], "GGUF version 7"),
        (lambda data: data[:200], "the GGUF header ends early"),
    ],
)
def test_a_damaged_header_is_a_value_error(tmp_path, damage, words):
    path = write_gguf(tmp_path / "m.gguf")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=words):
        gguf_tensor_shapes(path)


# ---- the launch checks -------------------------------------------------------------------------------


@pytest.fixture
def gguf_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    write_gguf(root / "model.gguf")
    (root / "folder.gguf").mkdir()
    (root / "fake.gguf").write_bytes(b"not a model")
    write_gguf(tmp_path / "outside.gguf")
    return root


@pytest.mark.parametrize("key", ["model", "reward_model", "label_completer"])
def test_a_gguf_file_inside_the_roots_passes_as_a_file(gguf_root, key):
    check_spec_paths(
        {"model": "builtin-arith", "dataset": "builtin-arith", key: str(gguf_root / "model.gguf")}, [gguf_root]
    )


@pytest.mark.parametrize(
    "key, name, words",
    [
        ("model", "missing.gguf", "does not exist"),
        ("model", "folder.gguf", "is not a .gguf file but a directory"),
        ("model", "fake.gguf", "is not a GGUF file (it does not start with 'GGUF')"),
        ("model", "../outside.gguf", "is outside the directories runs may read"),
        ("reward_model", "missing.gguf", "does not exist"),
        ("label_completer", "fake.gguf", "is not a GGUF file"),
    ],
)
def test_an_unusable_gguf_model_is_refused_naming_its_key(gguf_root, key, name, words):
    config = {"model": "builtin-arith", "dataset": "builtin-arith", key: str(gguf_root / name)}
    with pytest.raises(SpecError) as refused:
        check_spec_paths(config, [gguf_root])
    assert str(refused.value).startswith(f"{key}: ") and words in str(refused.value)


def test_without_the_gguf_package_a_gguf_model_is_refused_at_launch(gguf_root, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    path = str(gguf_root / "model.gguf")
    with pytest.raises(SpecError, match=r"^model: .* pip install 'gguf>=0.10'"):
        validate_spec({"model": path})
    with pytest.raises(SpecError, match=r"^reward_model: .* pip install 'gguf>=0.10'"):
        check_spec_paths({"reward_model": path}, [gguf_root])


def test_the_launch_checks_of_a_gguf_model_leave_torch_unloaded(gguf_root):
    code = (
        "import sys\nfrom app.core import paths\nfrom app.service import placement\n"
        f"paths.check_spec_paths({{'model': {str(gguf_root / 'model.gguf')!r}}}, [{str(gguf_root)!r}])\n"
        f"print(placement._local_counts({str(gguf_root / 'model.gguf')!r})[0], 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [str(gguf_parameter_counts(gguf_root / "model.gguf")[0]), "False"], out.stderr


@pytest.fixture
def launch_env(sqlite_url, tmp_path, gguf_root, monkeypatch):
    """Settings pointed at a fresh store and broker, with ``gguf_root`` allowed in run specs."""
    for key in [k for k in os.environ if k.startswith("GRPO_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GRPO_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("GRPO_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}")
    monkeypatch.setenv("GRPO_QUEUE", QUEUE)
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GRPO_PATH_ROOTS", str(gguf_root))
    monkeypatch.setenv("GRPO_HUB_CHECK_SECONDS", "0")
    return sqlite_url


def _report_gpu(url: str, memory: int) -> None:
    with session_scope(url) as s:
        store.report_worker(s, "gpu:1", [QUEUE, f"{QUEUE}.gpu"], [{"name": "GPU", "memory": memory}])


def test_launch_sizes_a_gguf_model_from_its_header(launch_env, gguf_root):
    path = gguf_root / "model.gguf"
    params, _ = gguf_parameter_counts(path)
    need = estimate_memory(params, params, lora=False, bf16=True).total  # 'auto' precision: bf16 on a GPU
    _report_gpu(launch_env, need - 1)
    with pytest.raises(api.ApiError, match="^model: the run needs about "):
        api.launch_run({"model": str(path), "device": "gpu"})
    _report_gpu(launch_env, need)
    assert api.launch_run({"model": str(path), "device": "gpu"})["status"] == "queued"
    with pytest.raises(api.ApiError, match="^model: .*missing.gguf' does not exist"):
        api.launch_run({"model": str(gguf_root / "missing.gguf"), "device": "gpu"})


# ---- the conversion's cache ----------------------------------------------------------------------------


def test_a_gguf_file_converts_once_and_again_when_it_changes(tmp_path, monkeypatch):
    from grpo_engine.model import gguf_model
    from grpo_engine.model.model import resolve_model_path

    converted = []

    def fake_convert(source: Path, out_dir: Path) -> None:  # the real one: tests/engine/model/test_smollm2.py
        converted.append(source)
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(source.read_bytes()[:16])

    monkeypatch.setattr(gguf_model, "convert_gguf", fake_convert)
    path, cache, lines = write_gguf(tmp_path / "m.gguf"), tmp_path / "cache", []
    first = Path(resolve_model_path(str(path), cache, log=lines.append))
    assert first.parent == cache / "gguf" and first.name.startswith("m-") and (first / "model.safetensors").is_file()
    assert lines[0] == "converting m.gguf into a model directory (first use of this file only)"
    assert lines[1].startswith("converted m.gguf in ") and lines[1].endswith(f"s into {first}")
    assert resolve_model_path(str(path), cache, log=lines.append) == str(first) and len(converted) == 1
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == sorted([first.name, f".{first.name}.lock"])
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # the file changed
    second = Path(resolve_model_path(str(path), cache, log=lines.append))
    assert second != first and len(converted) == 2
    with pytest.raises(FileNotFoundError, match="GGUF file .*missing.gguf' does not exist"):
        resolve_model_path(str(tmp_path / "missing.gguf"), cache)


def test_a_failed_conversion_leaves_nothing_that_looks_converted(tmp_path, monkeypatch):
    from grpo_engine.model import gguf_model

    def failing(source: Path, out_dir: Path) -> None:
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        raise ValueError("the tokenizer's chat_template differs")

    monkeypatch.setattr(gguf_model, "convert_gguf", failing)
    path = write_gguf(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="chat_template"):
        gguf_model.gguf_model_dir(path, tmp_path / "cache", log=lambda message: None)
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.startswith(".")] == []
