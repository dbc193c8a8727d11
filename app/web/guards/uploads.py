"""The limits on uploads (``POST /gradio_api/upload``): one request carries at most GRPO_MAX_UPLOAD_FILES files and
the larger of GRPO_MAX_MODEL_UPLOAD_MB and GRPO_MAX_UPLOAD_MB (each file's limit, which Gradio checks too: an upload
does not say whether it is a model or a dataset, so /upload_dataset checks the smaller dataset cap itself) plus its
form's framing; a user (without a login: a client address) uploads at most GRPO_UPLOAD_MB_PER_HOUR an hour. A
request over a limit is cut off and answered 413 or 429. app.web.guards.security's middleware sends every upload here.
"""

from __future__ import annotations

import time

from app.core.settings import Settings
from app.web.guards.asgi import log, respond

UPLOAD_CAPS = "GRPO_MAX_MODEL_UPLOAD_MB for a model, GRPO_MAX_UPLOAD_MB for a dataset: the larger"


class UploadGuard:
    """The upload limits of this module's docstring, with each user's (or address's) uploads of the last hour."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.uploaded: dict[str, list[tuple[float, int]]] = {}  # user or address -> (when, bytes) of its uploads

    async def __call__(self, app, scope, receive, send, *, headers: dict[str, str], who: str) -> None:
        """An upload through its limits: files and bytes per request, bytes per user per hour. The body is counted
        as it streams in; past a limit the app sees the client leave, and the answer is 413 (or 429)."""
        settings = self.settings
        hour_ago = time.monotonic() - 3600
        recent = [(t, n) for t, n in self.uploaded.get(who, []) if t > hour_ago]
        budget = settings.upload_mb_per_hour * 2**20 - sum(n for _, n in recent)
        limit = settings.largest_upload_bytes + 64 * 1024 * settings.max_upload_files  # files plus the form's framing
        most = f"at most {settings.largest_upload_bytes / 2**20:g} MiB a request"
        declared = int(headers.get("content-length") or 0)
        refusal = None
        if declared > budget:
            refusal = (
                429,
                f"upload limit: at most {settings.upload_mb_per_hour:g} MiB an hour (GRPO_UPLOAD_MB_PER_HOUR)",
            )
        elif declared > limit:
            refusal = (413, f"upload too large: {most} ({UPLOAD_CAPS})")
        if refusal:
            log(f"upload of {declared:,} bytes by {who!r} refused: {refusal[1]}")
            await respond(send, refusal[0], {"error": refusal[1]})
            return
        counted = {"bytes": 0, "files": 0, "tail": b"", "over": None}

        async def counting_receive():
            if counted["over"]:
                return {"type": "http.disconnect"}
            message = await receive()
            chunk = message.get("body", b"")
            seen = counted["tail"] + chunk  # each file's part header names it: '; filename="..."'
            counted["files"] += seen.count(b"; filename=") - counted["tail"].count(b"; filename=")
            counted["tail"] = seen[-64:]
            counted["bytes"] += len(chunk)
            if counted["files"] > settings.max_upload_files:
                counted["over"] = (
                    413,
                    f"upload refused: at most {settings.max_upload_files} files a request (GRPO_MAX_UPLOAD_FILES)",
                )
            elif counted["bytes"] > min(limit, budget):
                counted["over"] = (
                    413,
                    f"upload too large: {most} ({UPLOAD_CAPS}), and the hour's budget (GRPO_UPLOAD_MB_PER_HOUR)",
                )
            return {"type": "http.disconnect"} if counted["over"] else message

        started = {}

        async def watch(message):  # once over a limit, the app's own answer (to a client that left) is dropped
            if counted["over"]:
                return
            if message["type"] == "http.response.start":
                started["yes"] = True
            await send(message)

        try:
            await app(scope, counting_receive, watch)
        except Exception:
            if not counted["over"]:
                raise
        self.uploaded[who] = recent + [(time.monotonic(), counted["bytes"])]
        if counted["over"]:
            log(f"upload by {who!r} cut off after {counted['bytes']:,} bytes: {counted['over'][1]}")
            if not started:
                await respond(send, *counted["over"])
