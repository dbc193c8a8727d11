"""Hub ids in a run spec (grpo_engine.spec.hub): which keys name one, the cache and HF_HUB_OFFLINE, and the Hub's
answers. The Hub itself is played by a local HTTP server answering as the Hub does (huggingface_hub's client reads
its X-Error-Code header), since this machine cannot reach the real one; an unreachable Hub is a closed port."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
from huggingface_hub import constants

from grpo_engine.spec.config import SpecError
from grpo_engine.spec.hub import check_hub_ids, hub_ids
from tests.support.servers import free_port

MODEL = "someone/tiny-model"


class FakeHub(http.server.BaseHTTPRequestHandler):
    """/api/models/<id> and /api/datasets/<id>: 200 for 'someone/*', 403 gated for 'gated/*', else 404."""

    def do_GET(self):  # noqa: N802 (the handler's name)
        repo = self.path.split("/api/", 1)[-1].split("/", 1)[-1].split("?")[0]
        status, code = (
            (200, None)
            if repo.startswith("someone/")
            else (403, "GatedRepo")
            if repo.startswith("gated/")
            else (404, "RepoNotFound")
        )
        body = json.dumps({"id": repo, "sha": "0" * 40, "siblings": []} if status == 200 else {"error": code}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The client pointed at a local fake Hub, with an empty cache and HF_HUB_OFFLINE unset."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield tmp_path / "hub"
    server.shutdown()


def test_only_hub_ids_are_checked():
    config = {"model": "builtin-arith", "dataset": "/data/train.jsonl", "reward_model": "org/rm", "rm_data": ""}
    assert hub_ids(config) == [("reward_model", "org/rm", "model")]
    check_hub_ids({"model": "no/such-model"}, timeout=0)  # 0: no check at all


def test_the_hub_confirms_a_repository(hub):
    check_hub_ids({"model": MODEL, "dataset": "someone/data"}, timeout=5)


def test_a_missing_repository_is_refused_naming_the_key(hub):
    with pytest.raises(SpecError, match=r"^dataset: no dataset 'nobody/gsm8k' on the Hugging Face Hub: is it spelled"):
        check_hub_ids({"model": MODEL, "dataset": "nobody/gsm8k"}, timeout=5)


def test_a_gated_repository_says_to_accept_and_set_a_token(hub):
    with pytest.raises(SpecError, match=r"^model: 'gated/llama' is gated .* set HF_TOKEN"):
        check_hub_ids({"model": "gated/llama"}, timeout=5)


def test_an_unreachable_hub_is_refused_quickly_with_what_to_do(hub, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"^model: could not reach the Hugging Face Hub within 2 s .* HF_HUB_OFFLINE=1"):
        check_hub_ids({"model": MODEL}, timeout=2)
    assert time.monotonic() - started < 10


def test_a_cached_repository_passes_without_the_hub_and_offline_refuses_the_rest(hub, monkeypatch):
    (hub / "models--someone--cached" / "snapshots" / ("0" * 40)).mkdir(parents=True)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # unreachable: the cache answers
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_hub_ids({"model": "someone/cached"}, timeout=2)
    with pytest.raises(
        SpecError,
        match=r"^model: 'someone/other' is not in this machine's Hugging Face cache and "
        r"HF_HUB_OFFLINE is set",
    ):
        check_hub_ids({"model": "someone/other"}, timeout=2)
