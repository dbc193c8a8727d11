"""What a heavy user (or one who means harm) does to a live server, each test naming the threat it covers: a
large dataset file previewed over and over and by several clients at once, uploads of many files or many
megabytes, and Gradio's copies of uploads left behind."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file

from tests.support.servers import running_server, server_env


def _vm_hwm(pid: int) -> int:
    """Peak resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _big_jsonl(path: Path, megabytes: int) -> int:
    """A JSONL dataset of about ``megabytes`` MB; returns its row count."""
    rng = random.Random(0)
    rows, size = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < megabytes * 10**6:
            line = (
                json.dumps(
                    {
                        "question": " ".join(str(rng.random()) for _ in range(20)),
                        "answer": str(rows),
                        "solution": "x" * 200,
                    }
                )
                + "\n"
            )
            f.write(line)
            rows, size = rows + 1, size + len(line)
    return rows


@pytest.mark.slow
def test_previewing_a_large_file_takes_bounded_memory_and_is_checked_once(tmp_path):
    """Threat: a 200 MB dataset file read whole by every preview (the browser re-runs it on each blur), four at a
    time: the server grew from 0.4 to 4 GB. Files are checked as a stream, at most two at a time, and a file
    already checked (same path, size and modification time) is not read again."""
    data = tmp_path / "data"
    data.mkdir()
    rows = _big_jsonl(data / "big.jsonl", 40)
    env = server_env(tmp_path, GRPO_EMBEDDED_WORKER="0", GRPO_DATA_DIR=str(data))
    with running_server(tmp_path, env) as (url, proc, _):
        client = Client(url, verbose=False)
        before = _vm_hwm(proc.pid)
        results, errors = [], []

        def preview():
            try:
                results.append(client.predict(str(data / "big.jsonl"), None, None, None, api_name="/preview_dataset"))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=preview) for _ in range(4)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        first_round = time.monotonic() - started
        grown = _vm_hwm(proc.pid) - before
        again = time.monotonic()
        results.append(client.predict(str(data / "big.jsonl"), None, None, None, api_name="/preview_dataset"))
        cached = time.monotonic() - again
    assert not errors, errors
    assert all(r["rows"] == rows and len(r["preview"]) == 5 for r in results)
    assert grown < 80 * 2**20, f"the server grew {grown / 2**20:.0f} MiB reading a 40 MB file four times"
    assert cached < max(2.0, first_round / 4), (cached, first_round)


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A server allowing 3 files and 1 MiB a request, 2 MiB an hour, with Gradio's files in its own folder."""
    tmp = tmp_path_factory.mktemp("limited")
    env = server_env(
        tmp,
        GRPO_EMBEDDED_WORKER="0",
        GRPO_MAX_UPLOAD_FILES="3",
        GRPO_MAX_UPLOAD_MB="1",
        GRPO_MAX_MODEL_UPLOAD_MB="1",
        GRPO_UPLOAD_MB_PER_HOUR="2",
        GRADIO_TEMP_DIR=str(tmp / "gradio"),
    )
    with running_server(tmp, env) as (url, _, log_path):
        yield url, tmp, log_path


def _upload(url: str, files: list[tuple[str, bytes]]) -> httpx.Response:
    return httpx.post(
        url + "gradio_api/upload", files=[("files", (n, b, "application/octet-stream")) for n, b in files], timeout=60
    )


@pytest.mark.slow
def test_uploads_are_bounded_per_request_and_per_hour_and_leave_no_copy(limited):
    """Threat: 300 files in one request, or 3 x 199 MB one after another, filling the server's disk (its temp folder
    grew to 834 MB and was never cleaned)."""
    url, tmp, log_path = limited
    row = json.dumps({"question": "1+1", "answer": "2"}) + "\n"
    dataset = (row * 2).encode()
    big = _upload(url, [("big.jsonl", b"x" * (1024 * 1024 + 200_000))])
    assert big.status_code == 413 and "at most 1 MiB a request" in big.text, big.text
    many = _upload(url, [(f"f{i}.jsonl", dataset) for i in range(6)])
    assert many.status_code == 413 and "at most 3 files" in many.text, many.text
    assert _upload(url, [("a.jsonl", dataset), ("b.jsonl", dataset)]).status_code == 200  # within the limits

    client = Client(url, verbose=False)
    source = tmp / "mine.jsonl"
    source.write_bytes(dataset)
    stored = client.predict(handle_file(str(source)), api_name="/upload_dataset")
    assert stored["rows"] == 2 and Path(stored["dataset"]).read_bytes() == dataset
    copies = [p for p in (tmp / "gradio").rglob("mine.jsonl")]
    assert copies == [], copies  # Gradio's copy of the upload is gone once the file is stored

    half = (row * (600_000 // len(row))).encode()  # ~0.6 MB, three times: past the 2 MiB an hour
    codes = [_upload(url, [(f"h{i}.jsonl", half)]).status_code for i in range(4)]
    assert codes[:3] == [200, 200, 200] and codes[3] in (413, 429), codes
    log = log_path.read_text()
    assert "refused: upload too large" in log and "cut off" in log and "upload limit: at most 2 MiB an hour" in log
