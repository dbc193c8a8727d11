"""What guards the dashboard's web server, as one ASGI middleware around the Gradio app (app.web.ui.serve).

Each rule and the threat it answers:

- **Other origins.** A request whose ``Origin`` is neither the dashboard's own (the ``Host`` it was sent to) nor
  in GRPO_ALLOWED_ORIGINS is refused (403), whatever its method: a page elsewhere (another port on localhost
  included) can neither act nor read with a user's session. Cross-origin reads by allowed origins get CORS
  headers from the parent app's CORSMiddleware; no other origin ever does.
- **Cookies.** Gradio's session cookies are sent back ``SameSite=Lax`` (Gradio asks for ``None``), so other sites'
  pages do not carry them.
- **Framing and sniffing.** Every response says ``X-Frame-Options: SAMEORIGIN``, ``Content-Security-Policy:
  frame-ancestors 'self'``, ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: same-origin``.
- **Sessions.** With a login, logging out is a POST (``/logout``) that ends only the session it is sent from; a
  session unused for GRPO_SESSION_IDLE_MINUTES ends.
- **Before login.** Only the login form and its static files answer; the login page carries no API description.
- **Uploads.** Files per request, bytes per request and bytes per user per hour are limited
  (app.web.guards.uploads); a request over a limit is cut off and answered 413 or 429.
- **Guessing passwords.** Failed logins are counted per client address and per user name (:class:`LoginThrottle`):
  after a few, each further attempt must wait, doubling up to a cap; refused attempts are logged.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from app.core.settings import Settings
from app.web.guards.asgi import edited_page, log, parse_cookies, read_body, replay, request_headers, respond
from app.web.guards.uploads import UploadGuard

SECURITY_HEADERS = (
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", b"frame-ancestors 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
# what answers before a login: the page (the login form), the login itself and the static files the form needs
PUBLIC_PATHS = {
    "/",
    "/login",
    "/login/",
    "/login_check",
    "/login_check/",
    "/theme.css",
    "/favicon.ico",
    "/robots.txt",
    "/manifest.json",
    "/gradio_api/startup-events",
}
PUBLIC_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon")
_API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.DOTALL)
_SAMESITE = re.compile(rb";\s*samesite=[a-z]+", re.IGNORECASE)


class LoginThrottle:
    """Failed logins per key (a client address, a user name): the first ``free`` failures cost nothing, then
    each failure makes the next attempt wait ``base * 2^(failures - free)`` seconds, at most ``cap``. A success
    clears the keys it was made with; failures older than ``forget`` seconds are forgotten.

    >>> t = LoginThrottle(free=2, base=1.0, cap=4.0)
    >>> [t.failed(["ip"], now=0.0) for _ in range(5)]
    [0.0, 0.0, 1.0, 2.0, 4.0]
    >>> t.wait(["ip"], now=3.0), t.wait(["ip"], now=4.0)
    (1.0, 0.0)
    """

    def __init__(self, free: int = 5, base: float = 1.0, cap: float = 300.0, forget: float = 900.0):
        self.free, self.base, self.cap, self.forget = free, base, cap, forget
        self._state: dict[str, tuple[int, float, float]] = {}  # key -> (failures, last failure, next allowed)
        self._lock = threading.Lock()

    def wait(self, keys: list[str], now: float | None = None) -> float:
        """Seconds until an attempt with ``keys`` is allowed (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return max([0.0] + [self._state[k][2] - now for k in keys if k in self._state])

    def failed(self, keys: list[str], now: float | None = None) -> float:
        """Count a failed attempt; returns the wait it imposes on the next one."""
        now = time.monotonic() if now is None else now
        waits = []
        with self._lock:
            for key in keys:
                failures, last, _ = self._state.get(key, (0, now, now))
                failures = 1 if now - last > self.forget else failures + 1
                wait = 0.0 if failures <= self.free else min(self.cap, self.base * 2 ** (failures - self.free - 1))
                self._state[key] = (failures, now, now + wait)
                waits.append(wait)
        return max(waits, default=0.0)

    def succeeded(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._state.pop(key, None)


class SecurityMiddleware:
    """The rules of this module's docstring around ``app`` (the parent app holding the mounted Gradio app).

    ``gradio_app``: returns the mounted Gradio app (its session tokens and cookie names); ``login``: whether a
    login is required; ``page_head``: HTML put first in the page's <head>, ahead of Gradio's own scripts.
    """

    def __init__(
        self,
        app,
        settings: Settings,
        gradio_app: Callable,
        login: bool,
        throttle: LoginThrottle | None = None,
        page_head: str = "",
    ):
        self.app, self.settings, self.gradio_app, self.login = app, settings, gradio_app, login
        self.page_head = page_head.encode()
        self.throttle = throttle or LoginThrottle(free=settings.login_free_attempts)
        self.last_seen: dict[str, float] = {}  # session token -> when it was last used
        self.upload = UploadGuard(settings)  # the upload limits, with what each user uploaded in the last hour

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = request_headers(scope)
        path, method = scope["path"], scope["method"]
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, headers.get("host", "")):
            log(f"refused {method} {path} from origin {origin[:200]!r}")
            await respond(send, 403, {"error": "requests from another origin are refused"})
            return
        send = self._with_headers(send)
        if path == "/" and method == "GET" and self.page_head:
            send = edited_page(send, lambda body: body.replace(b"<head>", b"<head>" + self.page_head, 1))
        if not self.login:
            if path.rstrip("/") == "/gradio_api/upload" and method == "POST":
                who = (scope.get("client") or ("?", 0))[0]
                await self.upload(self.app, scope, receive, send, headers=headers, who=who)
                return
            await self.app(scope, receive, send)
            return
        token = self.session_token(headers)
        if path.rstrip("/") == "/logout":
            await self.logout(method, token, send)
            return
        user = self.session_user(token)
        if path.rstrip("/") == "/gradio_api/upload" and method == "POST":
            who = user or (scope.get("client") or ("?", 0))[0]
            await self.upload(self.app, scope, receive, send, headers=headers, who=who)
            return
        if path.rstrip("/") == "/login" and method == "POST":
            await self.login_attempt(scope, receive, send)
            return
        if user is None and not (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)):
            await respond(send, 401, {"error": "Not authenticated"})
            return
        if user is None and path == "/":
            send = edited_page(send, _without_api_info)
        await self.app(scope, receive, send)

    # ---- origins, cookies, headers -------------------------------------------------------------------

    def origin_allowed(self, origin: str, host: str) -> bool:
        """The dashboard's own origin (the same host and port the request was sent to) or an allowed one."""
        origin = origin.strip().rstrip("/").lower()
        return urlsplit(origin).netloc == host.strip().lower() or origin in self.settings.allowed_origins

    def _with_headers(self, send):
        async def wrapped(message):
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in dict(SECURITY_HEADERS)]
                cookies = [(k, _lax(v) if k.lower() == b"set-cookie" else v) for k, v in kept]
                message = {**message, "headers": cookies + list(SECURITY_HEADERS)}
            await send(message)

        return wrapped

    # ---- sessions ------------------------------------------------------------------------------------

    def _cookie_names(self) -> tuple[str, str]:
        cookie_id = self.gradio_app().cookie_id
        return f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}"

    def session_token(self, headers: dict[str, str]) -> str | None:
        cookies = parse_cookies(headers.get("cookie", ""))
        secure, unsecure = self._cookie_names()
        return cookies.get(secure) or cookies.get(unsecure)

    def session_user(self, token: str | None) -> str | None:
        """The user of a live session (its idle time restarts), or None; an idle session ends here."""
        tokens = self.gradio_app().tokens
        if token is None or token not in tokens:
            return None
        now = time.monotonic()
        if now - self.last_seen.get(token, now) > self.settings.session_idle_minutes * 60:
            log(f"session of {tokens[token]!r} ended after {self.settings.session_idle_minutes:g} idle minutes")
            tokens.pop(token, None)
            self.last_seen.pop(token, None)
            return None
        self.last_seen[token] = now
        return tokens[token]

    async def logout(self, method: str, token: str | None, send) -> None:
        """POST /logout ends this session only and returns to the login form; any other method is refused."""
        if method != "POST":
            await respond(send, 405, {"error": "log out with POST /logout"}, [(b"allow", b"POST")])
            return
        if token is not None:
            self.gradio_app().tokens.pop(token, None)
            self.last_seen.pop(token, None)
        expired = [
            (b"set-cookie", f"{name}=; Max-Age=0; Path=/; HttpOnly; SameSite=Lax".encode())
            for name in self._cookie_names()
        ]
        await respond(send, 303, {"logged_out": True}, [(b"location", b"./"), *expired])

    # ---- uploads -------------------------------------------------------------------------------------

    # ---- logins --------------------------------------------------------------------------------------

    async def login_attempt(self, scope, receive, send) -> None:
        """A login through the throttle: refused (429, Retry-After) while its address or user must wait; else
        Gradio checks it, and a failure or success is counted."""
        body = await read_body(receive)
        form = parse_qs(body.decode("utf-8", "replace"))
        user = (form.get("username") or [""])[0].strip()[:200]
        address = (scope.get("client") or ("?", 0))[0]
        keys = [f"address:{address}", f"user:{user}"]
        wait = self.throttle.wait(keys)
        if wait > 0:
            log(f"login of {user!r} from {address} refused: too many failed logins, next allowed in {wait:.0f}s")
            await respond(
                send,
                429,
                {"detail": f"Too many failed logins: try again in {wait:.0f} s."},
                [(b"retry-after", str(max(1, round(wait))).encode())],
            )
            return
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                for name, value in message.get("headers", []):  # the new session's idle time starts now
                    cookie = parse_cookies(value.decode("latin-1").split(";", 1)[0])
                    if name.lower() == b"set-cookie" and cookie.keys() & set(self._cookie_names()):
                        self.last_seen[next(iter(cookie.values()))] = time.monotonic()
            await send(message)

        await self.app(scope, replay(body), watch)
        if status.get("code") == 200:
            self.throttle.succeeded(keys)
        else:
            wait = self.throttle.failed(keys)
            log(f"failed login of {user!r} from {address}" + (f"; next attempt allowed in {wait:.0f}s" if wait else ""))


def _lax(cookie: bytes) -> bytes:
    """A Set-Cookie value with SameSite=Lax, whatever it asked for."""
    return _SAMESITE.sub(b"", cookie) + b"; SameSite=Lax"


def _without_api_info(body: bytes) -> bytes:
    """The login page: its embedded API description emptied."""
    return _API_INFO.sub(b"window.gradio_api_info = {};</script>", body)
