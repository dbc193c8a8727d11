"""A local model without a restart: the models folder (``<data dir>/models``) is always a path root, whatever
GRPO_PATH_ROOTS says; models are uploaded into it (a .gguf file, or a zipped model directory: app.core.models_folder,
/upload_model), refused naming why beyond the cap or when a zip escapes its folder, holds a link or expands beyond
what it declares, with nothing left behind; /list_models and the Launch form's model field offer what it holds; a
first .gguf conversion is announced (the prompt preview's notice, the run's phase). The real SmolLM2 .gguf is
uploaded only where GRPO_TEST_SMOLLM2 names it."""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from app.core.paths import check_spec_paths
from app.core.settings import get_settings
from app.service import api, datasets, previews
from app.store.db import upgrade_database
from grpo_engine.spec.config import SpecError
from grpo_engine.spec.gguf_header import converted_dir
from tests.support.files import fake_model_dir, write_gguf
from tests.support.servers import running_server, server_env

CAP_MB = 4  # the model cap of this file's server and settings


def zip_dir(directory: Path, out: Path, top: str | None = None) -> Path:
    """``directory`` zipped, its files under ``top/`` (or at the zip's top)."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for f in sorted(directory.rglob("*")):
            if f.is_file():
                rel = f.relative_to(directory).as_posix()
                archive.write(f, f"{top}/{rel}" if top else rel)
    return out


def zip_with(out: Path, members: dict[str, bytes], link: tuple[str, str] | None = None) -> Path:
    """A zip of a model directory's files plus ``members``; ``link``: (member, target) stored as a symbolic link."""
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("m/config.json", "{}")
        archive.writestr("m/model.safetensors", b"\0" * 100)
        archive.writestr("m/tokenizer.json", "{}")
        for name, data in members.items():
            archive.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link[0])
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, link[1])
    return out


def zip_bomb(out: Path, real: int, declared: int = 1000) -> Path:
    """A zip whose one member expands to ``real`` bytes of zeros while its directory declares ``declared``."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("m/config.json", "{}")
        archive.writestr("m/tokenizer.json", "{}")
        archive.writestr("m/model.safetensors", b"\0" * real)
    data = bytearray(out.read_bytes())
    # the size fields of the member's local header (offset 22) and central directory entry (offset 24)
    with zipfile.ZipFile(out) as archive:
        info = archive.getinfo("m/model.safetensors")
    local = info.header_offset
    data[local + 22 : local + 26] = declared.to_bytes(4, "little")
    central = data.rfind(b"PK\x01\x02")  # the last entry's: the weights were written last
    assert data[central + 46 : central + 46 + len(info.filename)] == info.filename.encode()
    data[central + 24 : central + 28] = declared.to_bytes(4, "little")
    out.write_bytes(bytes(data))
    return out


def everything_in(folder: Path) -> list[str]:
    """Every entry under ``folder``, hidden ones included (what an upload may have left)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture
def models_env(settings_env, monkeypatch):
    """Settings with a small model cap and GRPO_PATH_ROOTS naming another directory, and the data dir's store
    migrated (the model field also offers completed runs); returns the models folder."""
    monkeypatch.setenv("GRPO_MAX_MODEL_UPLOAD_MB", str(CAP_MB))
    monkeypatch.setenv("GRPO_PATH_ROOTS", str(settings_env / "elsewhere"))
    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.database_url)
    return settings.models_dir


# ---- the models folder is a root -----------------------------------------------------------------------


def test_the_models_folder_is_a_root_whatever_GRPO_PATH_ROOTS_says(settings_env, monkeypatch, tmp_path):
    for roots in (None, str(tmp_path / "elsewhere")):
        if roots:
            monkeypatch.setenv("GRPO_PATH_ROOTS", roots)
        settings = get_settings()
        assert settings.models_dir == (tmp_path / "data" / "models").resolve()
        model = fake_model_dir(settings.models_dir / f"m-{bool(roots)}")
        check_spec_paths({"model": str(model)}, settings.path_roots)
    outside = fake_model_dir(tmp_path / "outside" / "m")
    with pytest.raises(SpecError, match=r"^model: .* is outside the directories runs may read .*<data dir>/models"):
        check_spec_paths({"model": str(outside)}, get_settings().path_roots)
    link = get_settings().models_dir / "link"  # a link in the models folder to a model outside: still refused
    link.symlink_to(outside)
    with pytest.raises(SpecError, match="is outside"):
        check_spec_paths({"model": str(link)}, get_settings().path_roots)


# ---- uploads, in this process --------------------------------------------------------------------------


def test_a_zipped_model_directory_and_a_gguf_file_are_stored_and_listed(models_env, tmp_path):
    source = zip_dir(fake_model_dir(tmp_path / "src" / "my model"), tmp_path / "upload.zip", top="my model")
    stored = datasets.upload_model(str(source))
    assert stored == {
        "model": str(models_env / "my_model"),
        "name": "my_model",
        "kind": "directory",
        "size": stored["size"],
    }
    assert sorted(p.name for p in (models_env / "my_model").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    again = datasets.upload_model(str(source))  # the name is taken: the same zip lands beside it, then is found
    assert again["name"].startswith("my_model-") and len(again["name"]) == len("my_model-") + 8
    assert datasets.upload_model(str(source)) == again

    flat = zip_dir(fake_model_dir(tmp_path / "src" / "flat"), tmp_path / "flat-model.zip")  # files at the top
    assert datasets.upload_model(str(flat))["name"] == "flat-model"

    gguf = write_gguf(tmp_path / "Tiny Model.Q4_1.gguf")
    first = datasets.upload_model({"path": str(gguf), "orig_name": "Tiny Model.Q4_1.gguf"})
    assert first["model"] == str(models_env / "Tiny_Model.Q4_1.gguf") and first["kind"] == "gguf"
    assert datasets.upload_model(str(gguf))["model"] == first["model"]  # the same file: kept once
    assert everything_in(models_env).count("Tiny_Model.Q4_1.gguf") == 1
    assert not [p for p in everything_in(models_env) if p.startswith(".")]

    listing = datasets.list_models()
    assert listing["models_folder"] == str(models_env)
    assert [(e["name"], e["kind"]) for e in listing["local"]] == [
        ("Tiny_Model.Q4_1.gguf", "gguf"),
        ("flat-model", "directory"),
        ("my_model", "directory"),
        (again["name"], "directory"),
    ]
    assert {e["name"]: e["size"] for e in listing["local"]}["my_model"] == stored["size"] > 1000
    assert listing["runs"] == []  # no run completed in this store
    check_spec_paths({"model": stored["model"]}, get_settings().path_roots)  # a run may name it


def _zip_cases(tmp: Path) -> list[tuple[str, Path, str]]:
    """(case, upload, words of its refusal)."""
    big = tmp / "big.gguf"
    big.write_bytes(b"GGUF" + b"\0" * (CAP_MB * 2**20 + 10))
    large_dir = fake_model_dir(tmp / "large", weights=CAP_MB * 2**20 + 10)
    not_gguf = tmp / "fake.gguf"
    not_gguf.write_bytes(b"not a gguf file")
    lone = tmp / "model.safetensors"
    lone.write_bytes(b"\0" * 10)
    no_config = tmp / "no-config.zip"
    with zipfile.ZipFile(no_config, "w") as archive:
        archive.writestr("m/model.safetensors", b"\0")
    return [
        (
            "too big",
            big,
            f"big.gguf: the file is {(CAP_MB * 2**20 + 14) / 2**20:.2f} MiB, larger than the "
            f"{CAP_MB} MiB a model may be (GRPO_MAX_MODEL_UPLOAD_MB)",
        ),
        (
            "unpacks too big",
            zip_dir(large_dir, tmp / "large.zip"),
            f"(as the zip declares), more than the {CAP_MB} MiB a model may be (GRPO_MAX_MODEL_UPLOAD_MB)",
        ),
        (
            "dot-dot",
            zip_with(tmp / "dotdot.zip", {"m/../../escape.txt": b"x"}),
            "member 'm/../../escape.txt' would unpack outside its folder",
        ),
        (
            "absolute",
            zip_with(tmp / "absolute.zip", {"/tmp/escape.txt": b"x"}),
            "member '/tmp/escape.txt' would unpack outside its folder",
        ),
        (
            "symlink",
            zip_with(tmp / "link.zip", {}, link=("m/tokenizer_config.json", "/etc/passwd")),
            "member 'm/tokenizer_config.json' is a symbolic link",
        ),
        ("zip bomb", zip_bomb(tmp / "bomb.zip", real=CAP_MB * 2**20 * 4), "unpacks to other bytes than it declares"),
        ("no config", no_config, "holds no config.json at its top or in its one top folder"),
        ("not gguf", not_gguf, "fake.gguf: not a GGUF file"),
        ("lone safetensors", lone, "a .safetensors file alone is not a model: zip its directory"),
    ]


def test_refused_uploads_name_why_and_leave_nothing_behind(models_env, tmp_path):
    cases = _zip_cases(tmp_path)
    assert (tmp_path / "bomb.zip").stat().st_size < CAP_MB * 2**20  # small as uploaded
    for case, upload, words in cases:
        with pytest.raises(api.ApiError) as refused:
            datasets.upload_model(str(upload))
        assert words in str(refused.value), (case, str(refused.value))
        assert everything_in(models_env) == [], case
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/escape.txt").exists()


def test_a_zip_that_expands_beyond_what_it_declares_is_refused_as_it_unpacks(models_env, tmp_path):
    """Its declared sizes pass the cap, so the refusal comes while unpacking: zipfile stops at the declared size and
    fails the member's checksum (the bytes written are counted against the cap too, a second guard)."""
    bomb = zip_bomb(tmp_path / "bomb.zip", real=CAP_MB * 2**20 * 4)
    with zipfile.ZipFile(bomb) as archive:
        assert sum(i.file_size for i in archive.infolist()) < 2000
    with pytest.raises(api.ApiError, match="bomb.zip: the zip is damaged or unpacks to other bytes"):
        datasets.upload_model(str(bomb))
    assert everything_in(models_env) == []


# ---- a first .gguf conversion is announced -----------------------------------------------------------


def test_the_prompt_preview_announces_a_first_conversion(models_env, tmp_path):
    from app.web.tabs.launch import _show_prompt
    from grpo_engine.spec.run_spec import FIELDS

    gguf = Path(datasets.upload_model(str(write_gguf(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")))["model"])
    notice = "Converting SmolLM2-135M-Instruct.Q4_1.gguf into a model directory (once, about a minute)…"
    assert previews.conversion_notice({"model": str(gguf)}) == notice
    shown = _show_prompt(*[str(gguf) if f.name == "model" else f.default for f in FIELDS])
    assert notice in next(shown)  # before the conversion starts
    shown.close()
    assert previews.conversion_notice({"model": "builtin-arith"}) is None
    assert previews.conversion_notice({"model": str(tmp_path / "outside.gguf")}) is None  # refused later, by name
    converted_dir(gguf, get_settings().cache_dir).mkdir(parents=True)
    assert previews.conversion_notice(json.dumps({"model": str(gguf)})) is None  # converted: nothing to wait for


def test_a_conversion_reports_its_phase_first(tmp_path):
    from grpo_engine.model.gguf_model import CONVERTING, gguf_model_dir

    phases = []
    with pytest.raises(ValueError):  # a header-only file: the conversion itself fails (transformers says why)
        gguf_model_dir(write_gguf(tmp_path / "m.gguf"), tmp_path / "cache", log=lambda m: None, phase=phases.append)
    assert phases == [CONVERTING] == ["converting the .gguf model (once)"]


# ---- through a live server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server (no worker) with a 4 MiB model cap under an 8 MiB dataset cap (so Gradio lets a too-big model
    through to /upload_model's own check), and GRPO_PATH_ROOTS naming a directory elsewhere."""
    tmp = tmp_path_factory.mktemp("models")
    env = server_env(
        tmp / "data",
        GRPO_MAX_MODEL_UPLOAD_MB=str(CAP_MB),
        GRPO_MAX_UPLOAD_MB="8",
        GRPO_PATH_ROOTS=str(tmp / "elsewhere"),
        GRPO_HUB_CHECK_SECONDS="0",
    )
    with running_server(tmp, env) as (url, _, _):
        yield Client(url, verbose=False), tmp


@pytest.mark.slow
def test_upload_model_on_a_live_server(server, tmp_path):
    from tests.support.tiny_models import write_tiny_model

    client, tmp = server
    models = tmp / "data" / "models"
    assert models.is_dir() and everything_in(models) == []  # created at start
    for case, upload, words in _zip_cases(tmp_path):
        with pytest.raises(AppError) as refused:
            client.predict(handle_file(str(upload)), api_name="/upload_model")
        assert words in str(refused.value), (case, str(refused.value))
        assert everything_in(models) == [], case

    source = zip_dir(write_tiny_model(tmp_path / "tiny-llama", "llama"), tmp_path / "tiny-llama.zip", "tiny-llama")
    stored = client.predict(handle_file(str(source)), api_name="/upload_model")
    assert stored["model"] == str(models / "tiny-llama") and stored["kind"] == "directory"
    listing = client.predict(api_name="/list_models")
    assert [(e["name"], e["model"], e["kind"]) for e in listing["local"]] == [
        ("tiny-llama", stored["model"], "directory")
    ]
    assert listing["local"][0]["size"] == stored["size"] > 0
    # a run may name it, though GRPO_PATH_ROOTS names another directory
    run = client.predict({"model": stored["model"], "group_size": 2}, api_name="/launch_run")
    assert run["status"] == "queued"
    prompt = client.predict({"model": stored["model"]}, api_name="/preview_prompt")
    assert "<|start_header_id|>" in prompt["prompt"]  # its own chat template


@pytest.mark.slow
def test_upload_the_real_smollm2_gguf(tmp_path):
    source = os.environ.get("GRPO_TEST_SMOLLM2")
    if not source:
        pytest.skip("not run: GRPO_TEST_SMOLLM2 does not name SmolLM2-135M-Instruct.Q4_1.gguf")
    env = server_env(tmp_path / "data", GRPO_PATH_ROOTS=str(tmp_path / "elsewhere"), GRPO_HUB_CHECK_SECONDS="0")
    with running_server(tmp_path, env) as (url, _, _):
        client = Client(url, verbose=False)
        stored = client.predict(handle_file(source), api_name="/upload_model")
        assert stored["name"] == Path(source).name and stored["kind"] == "gguf"
        assert Path(stored["model"]).stat().st_size == Path(source).stat().st_size
        listing = client.predict(api_name="/list_models")
        assert [e["model"] for e in listing["local"]] == [stored["model"]]
        assert client.predict({"model": stored["model"]}, api_name="/launch_run")["status"] == "queued"
