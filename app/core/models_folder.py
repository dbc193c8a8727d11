"""The models folder (``<data dir>/models``, always a path root): what it holds, for the Launch form's model field,
and storing an uploaded model in it.

A model there is a directory holding a ``config.json`` (a Hugging Face model directory) or a ``.gguf`` file
(converted on first use: grpo_engine.model.gguf_model), at its top or one folder down (``models/org/name``).
Anyone with the data directory may copy one there; the dashboard stores uploads there (:func:`store_model`):

- a ``.gguf`` file (starting with the GGUF magic) is kept under its own name;
- a ``.zip`` of a model directory (``config.json``, ``.safetensors`` weights and tokenizer files, at the zip's top
  or in its one top folder) is unpacked into a directory named after that folder, or after the zip.

Each is refused, naming why, when it is larger than the cap (GRPO_MAX_MODEL_UPLOAD_MB: the file, and a zip's files
unpacked, both the sizes its directory declares and the bytes actually written, so a zip that declares little and
expands to much is stopped), when a zip member would land outside its folder (an absolute path, a ``..`` part), is
a link or a special file, or when the zip is damaged. What is written goes under a hidden temporary name in the
models folder, renamed into place at the end; a refusal or any failure removes it, so the folder never holds half a
model. A name already taken keeps its model: the upload gets the name with the first 8 hex digits of its SHA-256
added (the same .gguf file uploaded again is found and kept once). Pure Python: no torch, no Gradio.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from grpo_engine.spec.gguf_header import is_gguf_file

MAX_MEMBERS = 10_000  # files in one zipped model (a sharded checkpoint has hundreds at most)
PARTIAL = ".partial"  # the suffix of what an upload is writing (hidden: its name starts with a dot)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
SAFE = re.compile(r"[^A-Za-z0-9._-]+")
IGNORED = ("__MACOSX",)  # folders a zip tool adds beside the model


class ModelUploadError(ValueError):
    """An uploaded model refused: the message names the file and why."""


def mib(n: int) -> str:
    """Bytes in MiB, as a refusal says them.

    >>> mib(3 * 2**20), mib(1536)
    ('3.00 MiB', '0.00 MiB')
    """
    return f"{n / 2**20:.2f} MiB"


def safe_name(name: str, default: str = "model") -> str:
    """A file or folder name of letters, digits and ``._-`` only, at most 100 characters, its ``.gguf`` kept.

    >>> safe_name("SmolLM2 135M (Q4_1).gguf"), safe_name("../../"), safe_name("Qwen2.5-0.5B")
    ('SmolLM2_135M_Q4_1.gguf', 'model', 'Qwen2.5-0.5B')
    """
    suffix = ".gguf" if name.lower().endswith(".gguf") else ""
    stem = name[: len(name) - len(suffix)]
    return (SAFE.sub("_", stem).strip("._-")[: 100 - len(suffix)] or default) + suffix


# ---- what the folder holds ---------------------------------------------------------------------------


def _entry(path: Path, folder: Path) -> dict | None:
    """A model in the folder: ``{name, model, kind, size}``, or None where ``path`` is not one."""
    if path.name.startswith("."):
        return None
    if path.is_file() and path.suffix.lower() == ".gguf":
        return {"name": str(path.relative_to(folder)), "model": str(path), "kind": "gguf", "size": path.stat().st_size}
    if path.is_dir() and (path / "config.json").is_file():
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        return {"name": str(path.relative_to(folder)), "model": str(path), "kind": "directory", "size": size}
    return None


def list_models(folder: Path) -> list[dict]:
    """The models in ``folder``, by name: each ``{name, model, kind, size}``, ``kind`` 'directory' (a model
    directory with config.json) or 'gguf' (a .gguf file), ``size`` in bytes (a directory's files summed),
    ``name`` its path inside the folder. Hidden entries (an upload being written) are left out; a missing
    folder holds nothing."""
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        entry = _entry(path, folder)
        if entry is None and path.is_dir() and not path.name.startswith("."):
            entry_list = [_entry(sub, folder) for sub in sorted(path.iterdir())]  # models/org/name
            found.extend(e for e in entry_list if e is not None)
        elif entry is not None:
            found.append(entry)
    return found


def remove_stale_partials(folder: Path, older_than_s: float = 3600) -> None:
    """Remove what uploads began writing in ``folder`` more than ``older_than_s`` seconds ago and never finished
    (a server stopped mid-upload)."""
    if not folder.is_dir():
        return
    for path in folder.glob(f".*{PARTIAL}"):
        if time.time() - path.lstat().st_mtime > older_than_s:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


# ---- storing an upload -------------------------------------------------------------------------------


def store_model(source: Path, name: str, folder: Path, cap: int, cap_words: str) -> dict:
    """Keep the uploaded model at ``source`` (known to the user as ``name``) in ``folder``; returns ``{model, name,
    kind, size}``: ``model`` the stored path, for a run spec's ``model``. ``cap``: the most bytes it may be (a zip:
    also unpacked), ``cap_words`` how a refusal names that limit. Raises ModelUploadError naming the file and why
    (see the module's docstring); nothing is left in ``folder`` then."""
    suffix = Path(name).suffix.lower()
    if suffix not in (".gguf", ".zip"):
        raise ModelUploadError(
            f"{name}: a model upload is a .gguf file or a .zip of a model directory (config.json, .safetensors "
            "weights and tokenizer files)"
            + ("; a .safetensors file alone is not a model: zip its directory" if suffix == ".safetensors" else "")
        )
    size = source.stat().st_size
    if size > cap:
        raise ModelUploadError(f"{name}: the file is {mib(size)}, larger than the {cap_words}")
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".upload-{secrets.token_hex(6)}{PARTIAL}"
    try:
        if suffix == ".gguf":
            return _store_gguf(source, name, folder, partial)
        return _store_zip(source, name, folder, partial, cap=cap, cap_words=cap_words)
    finally:
        if partial.is_dir() and not partial.is_symlink():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, in hex, read 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _with_digest(name: str, digest: str) -> str:
    """``name`` with the digest's first 8 hex digits before its .gguf: 'm.gguf' -> 'm-1a2b3c4d.gguf'."""
    suffix = ".gguf" if name.endswith(".gguf") else ""
    return f"{name[: len(name) - len(suffix)]}-{digest[:8]}{suffix}"


def _store_gguf(source: Path, name: str, folder: Path, partial: Path) -> dict:
    """A .gguf file: checked for the GGUF magic, copied under ``partial``, then linked to its name (never over
    another file: os.link refuses a taken name), or to the name with its digest."""
    if not is_gguf_file(source):
        raise ModelUploadError(f"{name}: not a GGUF file (it does not start with 'GGUF')")
    _copy(source, partial, name)
    digest = sha256_file(partial)
    wanted = safe_name(Path(name).name)
    for candidate in (wanted, _with_digest(wanted, digest)):
        final = folder / candidate
        if final.is_file() and final.stat().st_size == partial.stat().st_size and sha256_file(final) == digest:
            break  # the same file, uploaded before
        try:
            os.link(partial, final)
            break
        except FileExistsError:
            continue
    else:
        raise ModelUploadError(f"{name}: both {wanted!r} and {final.name!r} are taken in the models folder")
    return {"model": str(final), "name": final.name, "kind": "gguf", "size": final.stat().st_size}


def _copy(source: Path, target: Path, name: str) -> None:
    try:
        shutil.copyfile(source, target)
    except OSError as e:
        raise ModelUploadError(f"{name}: could not be written to the models folder: {e.strerror or e}") from None


def _checked_members(archive: zipfile.ZipFile, name: str, cap: int, cap_words: str) -> list[zipfile.ZipInfo]:
    """The zip's members, each refused naming it when it would land outside its folder, is a link, a special file
    or encrypted, or appears twice; then the sizes they declare, summed, against ``cap``."""
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise ModelUploadError(f"{name}: holds {len(members):,} files, more than the {MAX_MEMBERS:,} a model may")
    seen, declared = set(), 0
    for info in members:
        member = info.filename
        parts = PurePosixPath(member).parts
        if member.startswith("/") or re.match(r"^[A-Za-z]:", member) or "\\" in member or ".." in parts:
            raise ModelUploadError(
                f"{name}: member {member!r} would unpack outside its folder (an absolute path or a '..' part)"
            )
        if "\x00" in member or not parts:
            raise ModelUploadError(f"{name}: member {member!r} has no usable name")
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise ModelUploadError(f"{name}: member {member!r} is a symbolic link; a zipped model holds files only")
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: a zip tool that records no file type
            raise ModelUploadError(f"{name}: member {member!r} is a special file; a zipped model holds files only")
        if info.flag_bits & 0x1:
            raise ModelUploadError(f"{name}: member {member!r} is encrypted")
        key = member.rstrip("/")
        if key in seen:
            raise ModelUploadError(f"{name}: member {member!r} appears twice")
        seen.add(key)
        declared += info.file_size
    if declared > cap:
        raise ModelUploadError(f"{name}: unpacks to {mib(declared)} (as the zip declares), more than the {cap_words}")
    return members


def _unpack(source: Path, name: str, target: Path, cap: int, cap_words: str) -> None:
    """Unpack the zip at ``source`` into the directory ``target``, counting the bytes written against ``cap``."""
    target.mkdir()
    written = 0
    try:
        with zipfile.ZipFile(source) as archive:
            for info in _checked_members(archive, name, cap, cap_words):
                path = target / info.filename
                if not path.resolve().is_relative_to(target.resolve()):  # the name check's second guard
                    raise ModelUploadError(f"{name}: member {info.filename!r} would unpack outside its folder")
                if info.is_dir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(path, "xb") as dst:
                    while chunk := src.read(1 << 20):
                        written += len(chunk)
                        if written > cap:
                            raise ModelUploadError(
                                f"{name}: unpacks to more than the {cap_words} (more than the zip declares: "
                                "a zip bomb?)"
                            )
                        dst.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ModelUploadError(
            f"{name}: the zip is damaged or unpacks to other bytes than it declares ({e}); a zip that declares "
            "little and expands to much is refused too"
        ) from None
    except OSError as e:
        raise ModelUploadError(f"{name}: could not be unpacked into the models folder: {e.strerror or e}") from None


def _model_root(unpacked: Path, name: str) -> Path:
    """The model directory in an unpacked zip: its top, or its one top folder, whichever holds config.json (a
    valid JSON object), with .safetensors weights and a tokenizer beside it."""
    tops = [p for p in unpacked.iterdir() if p.name not in IGNORED and not p.name.startswith(".")]
    if (unpacked / "config.json").is_file():
        root = unpacked
    elif len(tops) == 1 and (tops[0] / "config.json").is_file():
        root = tops[0]
    else:
        raise ModelUploadError(
            f"{name}: holds no config.json at its top or in its one top folder: zip the model directory itself "
            "(config.json, .safetensors weights and tokenizer files)"
        )
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelUploadError(f"{name}: config.json is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelUploadError(f"{name}: config.json is not a JSON object")
    if not any(root.glob("*.safetensors")):
        raise ModelUploadError(
            f"{name}: holds no .safetensors weights beside config.json (runs load safetensors only: save the "
            "model with save_pretrained)"
        )
    if not any((root / f).is_file() for f in TOKENIZER_FILES):
        raise ModelUploadError(
            f"{name}: holds no tokenizer beside config.json ({', '.join(TOKENIZER_FILES)}): save the tokenizer "
            "into the model directory too"
        )
    return root


def _store_zip(source: Path, name: str, folder: Path, partial: Path, *, cap: int, cap_words: str) -> dict:
    """A zipped model directory: checked and unpacked under ``partial``, then renamed to its name (never over
    another model: a rename refuses a taken, non-empty directory), or to the name with the zip's digest."""
    _unpack(source, name, partial, cap, cap_words)
    root = _model_root(partial, name)
    wanted = safe_name(root.name if root != partial else Path(name).stem)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    digest = sha256_file(source)
    for candidate in (wanted, _with_digest(wanted, digest)):
        final = folder / candidate
        if final.exists():
            continue
        try:
            root.rename(final)
            break
        except OSError:  # taken meanwhile
            continue
    else:
        final = folder / _with_digest(wanted, digest)
        if not (final / "config.json").is_file():
            raise ModelUploadError(f"{name}: both {wanted!r} and {final.name!r} are taken in the models folder")
        # the same zip, uploaded before: that copy is kept
    return {"model": str(final), "name": final.name, "kind": "directory", "size": size}
