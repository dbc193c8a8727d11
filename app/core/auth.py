"""Login for the dashboard and its API, and keeping secrets out of what is shown.

Who may log in comes from the environment (app/core/settings.py): ``GRPO_AUTH_USERS`` holds
comma-separated ``user:hash`` entries, ``GRPO_AUTH_FILE`` names a file with one ``user:hash`` per
line (blank lines and ``#`` comments allowed). With neither set, there is no login.

A hash is PBKDF2-HMAC-SHA256 (hashlib) with a random 16-byte salt, written with its iteration
count so that it can be raised later without invalidating old entries::

    pbkdf2_sha256$<iterations>$<salt, base64>$<derived key, base64>

``grpo-dashboard hash-password`` prints one. Passwords are compared with ``hmac.compare_digest``.
Error messages name the variable or file and the entry, never the hash.

``app.web.ui.serve`` passes :func:`check` to Gradio's ``launch(auth=...)``: the page then shows a login
form, and every route (gradio_client calls, ``/gradio_api/*``, uploads, file downloads) needs the
session cookie that a login gives (gradio_client: ``Client(url, auth=(user, password))``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import sys
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import unquote

from kombu.utils.url import maybe_sanitize_url

from app.core.settings import Settings, get_settings

SCHEME = "pbkdf2_sha256"
ITERATIONS = 600_000  # what new hashes get (OWASP's 2023 figure for PBKDF2-HMAC-SHA256)
MIN_ITERATIONS = 10_000  # fewer is refused as too weak to store
MAX_ITERATIONS = 100_000_000  # more would make every login take minutes
SALT_BYTES = 16
USER_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,64}")  # no ':' ',' '#' or spaces: they separate entries
HINT = "make a hash with `grpo-dashboard hash-password`"


class AuthConfigError(ValueError):
    """GRPO_AUTH_USERS or GRPO_AUTH_FILE cannot be used; the message says where (never the hash)."""


# ---- hashes ----------------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def hash_password(password: str, iterations: int = ITERATIONS) -> str:
    """A new ``pbkdf2_sha256$<iterations>$<salt>$<key>`` hash of ``password``, with a random salt."""
    if not password:
        raise ValueError("the password must not be empty")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}, got {iterations}")
    salt = secrets.token_bytes(SALT_BYTES)
    key = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(key)}"


def parse_hash(encoded: str) -> tuple[int, bytes, bytes]:
    """(iterations, salt, key) of a hash; a ValueError that never quotes it when it is malformed."""
    parts = encoded.split("$")
    if len(parts) != 4 or parts[0] != SCHEME:
        raise ValueError(f"the hash is not of the form {SCHEME}$<iterations>$<salt>$<hash>")
    if not parts[1].isdigit() or not MIN_ITERATIONS <= int(parts[1]) <= MAX_ITERATIONS:
        raise ValueError(f"the hash's iteration count must be a whole number from {MIN_ITERATIONS} to {MAX_ITERATIONS}")
    try:
        salt = base64.b64decode(parts[2], validate=True)
        key = base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the hash's salt or key is not valid base64") from None
    if len(salt) < 8 or len(key) != hashlib.sha256().digest_size:
        raise ValueError("the hash's salt or key has the wrong length (a salt of 8 bytes or more, a key of 32)")
    return int(parts[1]), salt, key


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches the hash (False for a malformed hash), compared in constant time."""
    try:
        iterations, salt, key = parse_hash(encoded)
    except ValueError:
        return False
    candidate = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return hmac.compare_digest(candidate, key)


# ---- who may log in --------------------------------------------------------------------------


def parse_entry(text: str, where: str) -> tuple[str, str]:
    """(user, hash) of one ``user:hash`` entry; ``where`` ("GRPO_AUTH_USERS entry 2") starts the error."""
    user, sep, encoded = text.strip().partition(":")
    user, encoded = user.strip(), encoded.strip()
    if not sep or not USER_NAME.fullmatch(user):
        # the text may be a pasted password or hash: it is not repeated
        raise AuthConfigError(
            f"{where}: expected user:hash, with a user name of 1 to 64 letters, digits or ._@+- ({HINT})"
        )
    try:
        parse_hash(encoded)
    except ValueError as e:
        raise AuthConfigError(f"{where} (user {user!r}): {e} ({HINT})") from None
    return user, encoded


def _entries(settings: Settings) -> Iterable[tuple[str, str]]:
    """(where, text) of every configured entry: GRPO_AUTH_USERS first, then GRPO_AUTH_FILE's lines."""
    if settings.auth_users.strip():
        items = settings.auth_users.split(",")
        if not any(item.strip() for item in items):
            raise AuthConfigError("GRPO_AUTH_USERS is set but holds no user:hash entry")
        for number, item in enumerate(items, start=1):
            if item.strip():
                yield f"GRPO_AUTH_USERS entry {number}", item
    if settings.auth_file is not None:
        path = settings.auth_file
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise AuthConfigError(f"GRPO_AUTH_FILE {path}: cannot read it ({reason})") from None
        found = [
            (n, line) for n, line in enumerate(lines, start=1) if line.strip() and not line.lstrip().startswith("#")
        ]
        if not found:
            raise AuthConfigError(f"GRPO_AUTH_FILE {path}: holds no user:hash line")
        for number, line in found:
            yield f"GRPO_AUTH_FILE {path} line {number}", line


def load_users(settings: Settings) -> dict[str, str]:
    """{user: hash} from GRPO_AUTH_USERS and GRPO_AUTH_FILE; empty when neither is set (no login).

    A malformed entry, a user named twice, an unreadable or empty file: AuthConfigError naming where.
    """
    users: dict[str, str] = {}
    seen_at: dict[str, str] = {}
    for where, text in _entries(settings):
        user, encoded = parse_entry(text, where)
        if user in users:
            raise AuthConfigError(f"{where}: user {user!r} is already given at {seen_at[user]}")
        users[user], seen_at[user] = encoded, where
    return users


@lru_cache(maxsize=8)
def _decoy_hash(iterations: int) -> str:
    """A hash of ``iterations`` nobody knows the password of, checked for unknown users."""
    return hash_password(secrets.token_urlsafe(16), iterations)


def decoy_hash(users: dict[str, str]) -> str:
    """The hash an unknown user's password is checked against, as costly as the configured users' hashes (the
    iteration count most of them use), so a login for an unknown user takes as long as one for a known user."""
    counts = Counter(parse_hash(encoded)[0] for encoded in users.values())
    return _decoy_hash(counts.most_common(1)[0][0] if counts else ITERATIONS)


def check(user: str, password: str) -> bool:
    """Gradio's ``auth`` callable: whether ``user`` may log in with ``password``.

    The users are read again at each login (a line removed from GRPO_AUTH_FILE stops that user's next
    login); if they can no longer be read, nobody logs in until they can.
    """
    try:
        users = load_users(get_settings())
    except AuthConfigError as e:
        print(f"grpo-dashboard: login refused: {e}", file=sys.stderr, flush=True)
        return False
    encoded = users.get(user)
    matched = verify_password(password or "", encoded or decoy_hash(users))
    return encoded is not None and matched


# ---- secrets never shown ---------------------------------------------------------------------

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<password>[^\s@/]+)@")


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``**`` (kombu's sanitizer; works for database URLs too)."""
    return maybe_sanitize_url(url)


def mask_secrets(text: str, settings: Settings | None = None) -> str:
    """``text`` with the password of any ``scheme://user:password@`` URL, and the passwords of the
    configured database and broker URLs wherever they appear, replaced by ``**``."""
    settings = settings or get_settings()
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}**@", text)
    for url in (settings.database_url, settings.broker_url):
        found = _URL_PASSWORD.search(url)
        if not found:
            continue
        for password in {found["password"], unquote(found["password"])}:
            if len(password) >= 4:  # a 1-3 character password would mask ordinary words
                text = text.replace(password, "**")
    return text
