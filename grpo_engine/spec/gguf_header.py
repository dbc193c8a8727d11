"""A .gguf file's tensors from its header: names, shapes and types, read without torch nor the gguf package.

The dashboard sizes a run at launch (app.service.placement.check_fits_a_gpu) from the parameter count of a local model. A
.gguf file's size says little about it (a 4-bit block holds about 5 bits per parameter, and the run trains the
dequantized fp32 weights), but its header lists every tensor's shape. The header is, after the magic ``GGUF``,
a version (2 or 3), the tensor and metadata counts, the metadata (key, type, value; arrays of any type, the
vocabulary among them) and then each tensor's name, dims, type and offset, all little-endian. The metadata
values are skipped, not decoded: the gguf package's reader decodes them all in Python (about 4 s for a
49k-token vocabulary on 2 CPU cores), this reads the same file's shapes in tens of milliseconds.

Where a file's conversion into a model directory goes (:func:`converted_dir`, grpo_engine.model.gguf_model writes it)
is here too, so the dashboard can tell a first conversion coming without torch.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import re
import struct
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
STRING, ARRAY = 8, 9  # the two value types of variable length
MAX_DIMS = 8
GGUF_CACHE = "gguf"  # the model cache's folder of converted .gguf files
GGML_FLOAT_DTYPES = {0: "float32", 1: "float16", 30: "bfloat16"}  # ggml type -> torch's name


def is_gguf_file(path: Path) -> bool:
    """Whether the file at ``path`` starts with the GGUF magic."""
    with open(path, "rb") as fh:
        return fh.read(4) == MAGIC


def gguf_key(path: str | Path) -> str:
    """The cache entry of the .gguf file at ``path``: its name, then a digest of its resolved path, size and
    modification time (the same file converts once; a replaced or rewritten one converts again)."""
    resolved = Path(path).expanduser().resolve()
    stat = resolved.stat()
    digest = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", resolved.stem)[:80]
    return f"{name}-{digest}"


def converted_dir(path: str | Path, cache_dir: str | Path) -> Path:
    """The model directory the .gguf file at ``path`` converts into under the model cache ``cache_dir`` (present
    once converted)."""
    return Path(cache_dir) / GGUF_CACHE / gguf_key(path)


class _Header:
    """A cursor over the header's bytes; every read past the end raises ValueError."""

    def __init__(self, data, name: str):
        self.data, self.pos, self.name = data, 0, name

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.data):
            raise ValueError(f"{self.name}: the GGUF header ends early (a truncated or damaged file)")
        self.pos += n
        return start

    def u32(self) -> int:
        return struct.unpack_from("<I", self.data, self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.data, self.take(8))[0]

    def string(self) -> str:
        n = self.u64()
        return bytes(self.data[self.take(n) : self.pos]).decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind in SCALAR_SIZES:
            self.take(SCALAR_SIZES[kind])
        elif kind == STRING:
            self.take(self.u64())
        elif kind == ARRAY:
            item, count = self.u32(), self.u64()
            if item in SCALAR_SIZES:
                self.take(SCALAR_SIZES[item] * count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"{self.name}: unknown GGUF metadata type {kind}")


def gguf_tensors(path: str | Path) -> dict[str, tuple[tuple[int, ...], int]]:
    """Each tensor's name -> (its shape as torch holds it, its ggml type: 0 F32, 1 F16, 30 BF16, the others
    quantized). The header lists ggml's dims innermost first, reversed here, so a linear weight is (out, in).
    Raises ValueError for a file that is not GGUF (version 2 or 3) or whose header is cut short, OSError for one
    that cannot be read."""
    path = Path(path)
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise ValueError(f"{path.name}: not a GGUF file (it does not start with 'GGUF')")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            header = _Header(data, path.name)
            header.take(4)
            version = header.u32()
            if version not in VERSIONS:
                raise ValueError(f"{path.name}: GGUF version {version}, where this reads versions 2 and 3")
            n_tensors, n_values = header.u64(), header.u64()
            for _ in range(n_values):
                header.string()
                header.skip_value(header.u32())
            tensors = {}
            for _ in range(n_tensors):
                name, n_dims = header.string(), header.u32()
                if n_dims > MAX_DIMS:
                    raise ValueError(f"{path.name}: tensor {name!r} has {n_dims} dims")
                dims = [header.u64() for _ in range(n_dims)]
                kind = header.u32()
                header.take(8)  # its offset
                tensors[name] = (tuple(reversed(dims)), kind)
    return tensors


def gguf_tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's name -> its shape as torch holds it (see :func:`gguf_tensors`)."""
    return {name: shape for name, (shape, _) in gguf_tensors(path).items()}


def float_dtype_of(types: dict[int, int]) -> str:
    """The float dtype a .gguf file's weights are written back in, from ``types`` (ggml type -> parameters of that
    type): the type holding most parameters, as torch names it where it is a float (F32, F16, BF16), else
    "bfloat16": a quantized type (Q4_1, Q8_0, K-quants, ...) has no torch dtype, and bfloat16 is the float dtype
    nearest to what the file came from (the hub's checkpoints, llama.cpp's usual source, are mostly bf16) with
    fp32's range, so no trained weight overflows.

    >>> float_dtype_of({0: 1_000, 1: 90_000}), float_dtype_of({0: 1_000, 30: 90_000})
    ('float16', 'bfloat16')
    >>> float_dtype_of({0: 1_000, 3: 80_000, 14: 10_000}), float_dtype_of({0: 1_000})
    ('bfloat16', 'float32')
    """
    main = max(types, key=types.get)
    return GGML_FLOAT_DTYPES.get(main, "bfloat16")


def gguf_float_dtype(path: str | Path) -> str:
    """The float dtype of the .gguf file at ``path`` (:func:`float_dtype_of` of its tensors' types), the dtype its
    trained policy downloads in: "float32", "float16" or "bfloat16" (a quantized file's too)."""
    counts: dict[int, int] = {}
    for shape, kind in gguf_tensors(path).values():
        counts[kind] = counts.get(kind, 0) + math.prod(shape)
    return float_dtype_of(counts) if counts else "float32"


def gguf_parameter_counts(path: str | Path) -> tuple[int, list[tuple[int, int]]]:
    """(total parameter count, the (out, in) shapes of the linear weights LoRA's "all-linear" wraps) of a .gguf
    file, as grpo_engine.spec.memory.count_parameters gives them for its converted directory: the linear weights are
    the 2-D weights of the blocks (``blk.N.*.weight``), not the embedding (``token_embd``) nor the output head
    (``output``, absent where the head is tied to the embedding, which then counts once)."""
    shapes = gguf_tensor_shapes(path)
    total = sum(math.prod(shape) for shape in shapes.values())
    linear = [
        (s[0], s[1])
        for name, s in shapes.items()
        if len(s) == 2 and name.startswith("blk.") and name.endswith(".weight")
    ]
    return total, linear
