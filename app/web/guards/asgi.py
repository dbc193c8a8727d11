"""Small pieces of ASGI the web server's guards share (app.web.guards.security, app.web.guards.uploads): a request's headers
and cookies, a JSON answer, a request body read and replayed, the page's HTML edited on its way out, and a line in
the server's log."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable


def log(message: str) -> None:
    """A line in the server's log (stderr)."""
    print(f"grpo-dashboard: {message}", file=sys.stderr, flush=True)


def request_headers(scope) -> dict[str, str]:
    """A request's headers, names in lower case."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def parse_cookies(header: str) -> dict[str, str]:
    """A Cookie header as name -> value."""
    out = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name] = value
    return out


async def respond(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer with ``status`` and ``body`` as JSON."""
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def read_body(receive, limit: int = 64 * 1024) -> bytes:
    """A request's body (a login form: small; anything past ``limit`` is dropped)."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        chunk = message.get("body", b"")
        if size < limit:
            chunks.append(chunk[: limit - size])
        size += len(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def replay(body: bytes):
    """A ``receive`` that gives ``body`` once (a body already read, for the app to read again)."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


def edited_page(send, edit: Callable[[bytes], bytes]):
    """``send`` for the page's HTML: its body is held until complete, then sent as ``edit`` makes it."""
    held: dict = {}
    parts: list[bytes] = []

    async def wrapped(message):
        if message["type"] == "http.response.start":
            held["start"] = message
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = edit(b"".join(parts))
        start = held["start"]
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": headers + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return wrapped
