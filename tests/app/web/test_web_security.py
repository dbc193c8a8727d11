"""The web server's guards (app.web.guards.security) on live servers with a login, each test naming the threat it covers:
a page on another origin using a logged-in session (in a real browser), framing, cookies, sessions that never
end, logout by a link, the API described before login, password guessing, and unknown users told apart by timing.
"""

from __future__ import annotations

import http.server
import threading
import time
from functools import partial

import httpx
import pytest
from gradio_client import Client

from app.core import auth
from app.core.auth import hash_password
from tests.support.servers import free_port, running_server, server_env

USER, PASSWORD = "alice", "correct horse"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _server(tmp_path_factory, name: str, **settings: str):
    tmp = tmp_path_factory.mktemp(name)
    users = f"{USER}:{hash_password(PASSWORD, iterations=auth.MIN_ITERATIONS)}"
    return tmp, running_server(tmp, server_env(tmp, GRPO_AUTH_USERS=users, GRPO_EMBEDDED_WORKER="0", **settings))


@pytest.fixture(scope="module")
def attacker():
    """A web server on another port of localhost serving a page that tries to use the dashboard; yields its origin
    and the folder its pages are written to."""
    folder = __import__("tempfile").mkdtemp()
    port = free_port()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}", folder
    server.shutdown()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, attacker):
    """A server with a login that allows one other origin (``friend``); yields (url, log path, friend)."""
    friend = f"http://localhost:{free_port()}"
    tmp, server = _server(tmp_path_factory, "guarded", GRPO_ALLOWED_ORIGINS=friend)
    with server as (url, _, log_path):
        yield url, log_path, friend


def _session(url: str) -> httpx.Client:
    session = httpx.Client(base_url=url, timeout=10)
    assert session.post("login", data={"username": USER, "password": PASSWORD}).status_code == 200
    return session


def _log_in(page, url: str) -> None:
    """Log in through the login form in a browser page, and wait for the dashboard."""
    page.goto(url)
    page.fill("input[type=text]", USER)
    page.fill("input[type=password]", PASSWORD)
    page.click("button")
    page.wait_for_selector("#runs-table", timeout=60_000)


def _call(session: httpx.Client, endpoint: str, data: list, **headers) -> httpx.Response:
    return session.post(f"gradio_api/call/{endpoint}", json={"data": data}, headers=headers)


# ---- other origins ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_another_origins_page_cannot_use_a_logged_in_session(guarded, attacker):
    """Threat: a page on another origin (here another port of localhost) launching runs and reading them with the
    cookie of a user logged in to the dashboard in the same browser. Its requests are refused before they act."""
    from playwright.sync_api import sync_playwright

    url, log_path, _ = guarded
    origin, folder = attacker
    (__import__("pathlib").Path(folder) / "attack.html").write_text(f"""<html><body><script>
      async function attempt(endpoint, data) {{
        try {{
          const r = await fetch("{url}gradio_api/call/" + endpoint, {{method: "POST", credentials: "include",
            headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({{data: data}})}});
          return "status " + r.status + " " + (await r.text());
        }} catch (e) {{ return "blocked " + e; }}
      }}
      (async () => {{
        const results = [await attempt("launch_run", [{{"name": "forged"}}]), await attempt("list_runs", [])];
        document.body.setAttribute("data-results", JSON.stringify(results));
      }})();
    </script><iframe id="framed" src="{url}"></iframe></body></html>""")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        context = browser.new_context()
        page = context.new_page()
        _log_in(page, url)
        cookies = {c["name"]: c for c in context.cookies() if c["name"].startswith("access-token")}
        assert cookies and all(c["sameSite"] == "Lax" for c in cookies.values())
        attack = context.new_page()
        attack.goto(f"{origin}/attack.html")
        attack.wait_for_function("document.body.getAttribute('data-results') !== null", timeout=30_000)
        results = attack.evaluate("JSON.parse(document.body.getAttribute('data-results'))")
        attack.wait_for_timeout(2000)  # time for the frame to load, were it allowed to
        framed = attack.frame_locator("#framed").locator("#runs-table").count()
        browser.close()
    assert all(r.startswith("blocked") for r in results), results  # no answer the page could read
    assert framed == 0  # the dashboard does not render inside another origin's page
    runs = Client(url, auth=(USER, PASSWORD), verbose=False).predict(api_name="/list_runs")
    assert all(r["name"] != "forged" for r in runs)  # and nothing was launched
    log = log_path.read_text()  # the browser's preflight, or the request itself, was refused
    assert (
        "refused OPTIONS /gradio_api/call/launch_run from origin" in log
        or "refused POST /gradio_api/call/launch_run" in log
    )


@pytest.mark.slow
def test_only_the_own_and_the_allowed_origins_get_answers(guarded, attacker):
    """Threat: cross-origin reads and writes by raw requests carrying a session cookie and a foreign Origin."""
    url, _, friend = guarded
    session = _session(url)
    own = url.rstrip("/")
    assert _call(session, "list_runs", [], Origin=own).status_code == 200  # the dashboard's own pages
    allowed = _call(session, "list_runs", [], Origin=friend)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == friend
    assert allowed.headers["access-control-allow-credentials"] == "true"
    for other in (attacker[0], "null", "http://127.0.0.1.evil.example", f"{friend}.evil.example"):
        refused = _call(session, "launch_run", [{"name": "forged"}], Origin=other)
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers, other
        assert session.get("gradio_api/info", headers={"Origin": other}).status_code == 403
        preflight = session.options(
            "gradio_api/call/launch_run", headers={"Origin": other, "Access-Control-Request-Method": "POST"}
        )
        assert "access-control-allow-origin" not in preflight.headers


@pytest.mark.slow
def test_every_answer_forbids_framing_and_sniffing(guarded):
    """Threat: the dashboard framed by another site (clickjacking) or a response read as another content type."""
    url, _, _ = guarded
    session = _session(url)
    for response in (
        httpx.get(url, timeout=10),
        session.get("config"),
        session.get("gradio_api/info"),
        httpx.get(url + "config", timeout=10),
    ):
        assert response.headers["x-frame-options"] == "SAMEORIGIN"
        assert response.headers["content-security-policy"] == "frame-ancestors 'self'"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"


# ---- sessions ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_logout_is_a_post_that_ends_only_its_own_session(guarded):
    """Threat: a link or image on any page logging the user out (logout by GET), and one logout ending every
    session of the user on other machines."""
    url, _, _ = guarded
    first, second = _session(url), _session(url)
    assert first.get("logout", follow_redirects=False).status_code == 405
    assert first.get("config").status_code == 200  # the GET ended nothing
    token = dict(first.cookies)
    ended = first.post("logout", follow_redirects=False)
    assert ended.status_code == 303 and "Max-Age=0" in ended.headers["set-cookie"]
    assert httpx.get(url + "config", cookies=token, timeout=10).status_code == 401  # the session itself ended
    assert second.get("config").status_code == 200  # the other session goes on


@pytest.mark.slow
def test_the_log_out_button_ends_the_browsers_session(guarded, tmp_path):
    """Threat: a shared machine's browser left logged in, with no way to end the session but closing it."""
    from playwright.sync_api import sync_playwright

    url, _, _ = guarded
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        _log_in(page, url)
        cookies = {c["name"]: c["value"] for c in context.cookies() if c["name"].startswith("access-token")}
        assert page.locator("#logout").is_visible()
        page.screenshot(path=str(tmp_path / "logged-in.png"))
        page.click("#logout")
        page.wait_for_selector("input[type=password]", timeout=30_000)  # the login form again
        browser.close()
    assert httpx.get(url + "config", cookies=cookies, timeout=10).status_code == 401  # that session has ended


@pytest.mark.slow
def test_nothing_but_the_login_form_answers_before_login(guarded):
    """Threat: what the server tells someone who has not logged in: the API's description, Gradio's queue routes."""
    url, _, _ = guarded
    page = httpx.get(url, timeout=10)
    assert page.status_code == 200 and '"auth_required":true' in page.text.replace(" ", "")
    assert "launch_run" not in page.text and "window.gradio_api_info = {};" in page.text
    for path in (
        "config",
        "gradio_api/info",
        "openapi.json",
        "docs",
        "gradio_api/heartbeat/abc",
        "gradio_api/reset",
        "gradio_api/cancel",
        "gradio_api/queue/join",
        "gradio_api/upload",
        "gradio_api/openapi.json",
    ):
        for method in ("GET", "POST"):
            answer = httpx.request(method, url + path, timeout=10)
            assert answer.status_code in (401, 404, 405), (method, path, answer.status_code)
            assert "launch_run" not in answer.text, (method, path)


@pytest.fixture(scope="module")
def short_sessions(tmp_path_factory):
    """A server whose sessions end after 3 idle seconds, with the default login throttle."""
    tmp, server = _server(tmp_path_factory, "short", GRPO_SESSION_IDLE_MINUTES="0.05")
    with server as (url, _, log_path):
        yield url, log_path


@pytest.mark.slow
def test_an_idle_session_ends(short_sessions):
    """Threat: a session cookie (left on a shared machine, or stolen) that works for ever."""
    url, log_path = short_sessions
    busy, idle = _session(url), _session(url)
    for _ in range(3):  # used every second: it stays alive past the idle limit
        time.sleep(1.2)
        assert busy.get("config").status_code == 200
    time.sleep(0.5)
    assert idle.get("config").status_code == 401
    assert "ended after 0.05 idle minutes" in log_path.read_text()


@pytest.mark.slow
def test_guessing_passwords_is_throttled_and_the_user_still_gets_in(short_sessions):
    """Threat: guessing a password at the server's speed (about 12 guesses a second with 8 threads, unthrottled).
    After 5 failures each attempt must wait, doubling; the right password works once the guessing stops."""
    url, log_path = short_sessions
    codes = [
        httpx.post(url + "login", data={"username": USER, "password": f"guess {i}"}, timeout=10).status_code
        for i in range(12)
    ]
    assert codes[:6] == [400] * 6 and 429 in codes[6:], codes
    refused = httpx.post(url + "login", data={"username": USER, "password": PASSWORD}, timeout=10)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1  # not even the right one, yet
    time.sleep(int(refused.headers["retry-after"]) + 0.5)
    assert httpx.post(url + "login", data={"username": USER, "password": PASSWORD}, timeout=10).status_code == 200
    log = log_path.read_text()
    assert f"failed login of {USER!r} from 127.0.0.1; next attempt allowed in" in log
    assert "refused: too many failed logins" in log and PASSWORD not in log


def test_unknown_users_cost_as_much_as_known_ones():
    """Threat: telling unknown user names from known ones by how long a wrong login takes (a decoy hash cheaper
    or dearer than the configured ones)."""
    users = {
        "a": hash_password("x", iterations=auth.MIN_ITERATIONS),
        "b": hash_password("y", iterations=20_000),
        "c": hash_password("z", iterations=auth.MIN_ITERATIONS),
    }
    assert auth.parse_hash(auth.decoy_hash(users))[0] == auth.MIN_ITERATIONS  # what most users' hashes cost
    assert auth.parse_hash(auth.decoy_hash({"b": users["b"]}))[0] == 20_000
    assert auth.parse_hash(auth.decoy_hash({}))[0] == auth.ITERATIONS


# ---- what errors tell a client ------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_ids_and_strings_are_refused_without_database_errors(guarded):
    """Threat: database errors (with their SQL) and server paths reaching clients, and values that make every later
    request slow: an id past the store's integer range, a NUL byte, a name of millions of characters."""
    from gradio_client.exceptions import AppError

    url, log_path, _ = guarded
    client = Client(url, auth=(USER, PASSWORD), verbose=False)
    answers = []
    for bad in (2**70, -5, 0, "x" * 10_000, "12abc", 10**100):
        with pytest.raises(AppError) as caught:
            client.predict(bad, api_name="/get_run")
        answers.append(str(caught.value))
        assert "run_id must be an integer from 1 to 2147483647" in answers[-1], answers[-1]
    with pytest.raises(AppError) as caught:
        client.predict(2**70, api_name="/get_group")
    answers.append(str(caught.value))
    for spec, words in (
        ({"name": "a\x00b"}, "name: must not contain a NUL character"),
        ({"name": "n" * 5_000_000}, "name: must be at most 200 characters, got 5000000"),
        ({"dataset": "/etc/passwd.jsonl"}, "is outside the directories runs may read"),
    ):
        started = time.monotonic()
        with pytest.raises(AppError) as caught:
            client.predict(spec, api_name="/launch_run")
        answers.append(str(caught.value))
        assert words in answers[-1] and time.monotonic() - started < 30, answers[-1][:300]
    with pytest.raises(AppError) as caught:
        client.predict("bad\x00name.jsonl", None, None, None, api_name="/preview_dataset")
    answers.append(str(caught.value))
    data_dir = str(log_path.parent)
    for answer in answers:
        for leak in ("sqlalchemy", "SELECT", "Traceback", "site-packages", data_dir, "psycopg", "sqlite3"):
            assert leak not in answer, (leak, answer[:300])
    assert all(len(answer) < 1000 for answer in answers)
    assert all(r["name"] not in ("a\x00b",) and len(r["name"]) <= 200 for r in client.predict(api_name="/list_runs"))


def test_an_unexpected_error_reaches_the_client_as_an_id_and_the_log_as_its_detail(capsys):
    """Threat: an unexpected error's message (a SQL statement, a file path) shown to the client."""
    import gradio as gr

    from app.web.tabs.shared import call_api

    def broken():
        raise RuntimeError("(psycopg.errors) SELECT * FROM runs WHERE id = 1 at /srv/secret/place")

    with pytest.raises(gr.Error) as caught:
        call_api(broken)
    message = caught.value.message
    assert message.startswith("internal error ") and "SELECT" not in message and "/srv" not in message
    error_id = message.split()[2].rstrip(":")
    logged = capsys.readouterr().err
    assert f"error {error_id} in broken" in logged and "SELECT * FROM runs" in logged


# ---- the work a run may ask for ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_beyond_the_budget_is_refused_at_launch_naming_the_keys(guarded):
    """Threat: one launch asking for more than any worker can do (a heavy user's typo or an attacker's), which the
    workers would accept and grind on, or die on, for hours."""
    from gradio_client.exceptions import AppError

    url, _, _ = guarded
    client = Client(url, auth=(USER, PASSWORD), verbose=False)
    for spec, words in (
        (
            {"group_size": 1024, "batch_size": 4096, "max_new_tokens": 32768},
            "batch_size x group_size x max_new_tokens: 4096 x 1024 x 32768 = 137,438,953,472 tokens a step, more "
            "than this dashboard's budget of 1,048,576 (GRPO_MAX_TOKENS_PER_STEP)",
        ),
        (
            {"iterations": 1000, "steps_per_iteration": 1_000_000},
            "steps_per_iteration: iterations x steps_per_iteration = 1,000,000,000 steps, more than 1,000,000",
        ),
        ({"reward": "model", "rm_samples": 1_000_000, "max_new_tokens": 512}, "rm_samples: 1000000 samples"),
    ):
        with pytest.raises(AppError) as caught:
            client.predict(spec, api_name="/launch_run")
        assert words in str(caught.value), str(caught.value)
    assert (
        client.predict(
            {"batch_size": 16, "group_size": 16, "max_new_tokens": 4096, "steps_per_iteration": 1},
            api_name="/launch_run",
        )["status"]
        == "queued"
    )  # within the budget
