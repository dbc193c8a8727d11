"""Login and secrets: app.core.auth, the settings, the CLI's hash-password.

Unit tests: password hashes, the user list (GRPO_AUTH_USERS / GRPO_AUTH_FILE) and its errors, masking
of URLs, the settings.
Then real servers in subprocesses, driven through gradio_client and raw HTTP:
- with users configured, nothing answers without a login (API routes 401, the page is a login form,
  a wrong password is refused) and a logged-in client works;
- `grpo-dashboard serve` on PostgreSQL with passwords in the store and broker URLs and users configured:
  no password or hash appears in its output or in any API answer.

Where each other threat is tested (all against live servers or real workers unless said):
- another origin's page using a logged-in session, in Chromium; only the own and allowed origins answered:
  test_web_security.py, test_another_origins_page_cannot_use_a_logged_in_session,
  test_only_the_own_and_the_allowed_origins_get_answers;
- password guessing (throttled per address and user, the user still gets in):
  test_web_security.py, test_guessing_passwords_is_throttled_and_the_user_still_gets_in;
- unknown users told apart by timing: test_web_security.py, test_unknown_users_cost_as_much_as_known_ones;
- cancel and shutdown ignored during reward-model work: test_stop_in_rm_work.py;
- a run too large for the workers: test_web_security.py, test_a_run_beyond_the_budget_is_refused_at_launch_naming_the_keys;
  a worker's own memory cap: test_worker.py, test_a_worker_memory_cap_fails_a_run_cleanly,
  test_memory.py, test_a_cpu_worker_refuses_a_run_over_its_memory_cap;
- a large dataset file exhausting the server's memory: test_heavy_use.py,
  test_previewing_a_large_file_takes_bounded_memory_and_is_checked_once;
- uploads unbounded in count, size and time, copies left behind: test_heavy_use.py,
  test_uploads_are_bounded_per_request_and_per_hour_and_leave_no_copy;
- an export written through a planted link: test_paths_uploads.py, test_exports_go_to_a_private_directory_and_never_through_a_link;
- a dataset directory's file linking outside the roots: test_paths_uploads.py,
  test_a_dataset_directory_with_a_link_outside_the_roots_is_refused (run-spec paths outside the roots: the
  same file's test_paths_outside_the_roots_or_unusable_are_refused_naming_the_key);
- database errors, SQL and server paths reaching clients; huge or NUL-bearing strings: test_web_security.py,
  test_bad_ids_and_strings_are_refused_without_database_errors,
  test_an_unexpected_error_reaches_the_client_as_an_id_and_the_log_as_its_detail, and test_worker.py,
  test_worker_records_a_failed_run (the traceback only in the worker's log);
- the API described before login: test_web_security.py, test_nothing_but_the_login_form_answers_before_login;
- framing, sniffing, a logout by link, sessions that never end: test_web_security.py,
  test_every_answer_forbids_framing_and_sniffing, test_logout_is_a_post_that_ends_only_its_own_session,
  test_an_idle_session_ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from sqlalchemy.engine import make_url

from app.core import auth
from app.core.auth import (
    AuthConfigError,
    check,
    hash_password,
    load_users,
    mask_secrets,
    mask_url,
    parse_hash,
    verify_password,
)
from app.core.settings import get_settings
from tests.support.files import GOOD_ROWS, write_jsonl
from tests.support.servers import ROOT, free_port, running_server, server_env

FAST = auth.MIN_ITERATIONS  # hashes made in tests: the fewest iterations allowed, so logins are quick
API_ROUTES = (
    "/gradio_api/call/list_runs",
    "/gradio_api/call/launch_run",
    "/gradio_api/run/list_runs",
    "/gradio_api/queue/join",
    "/gradio_api/upload",
    "/gradio_api/call/v2/list_runs",
)


# ---- password hashes -----------------------------------------------------------------------------


def test_hash_has_its_scheme_iterations_and_salt_and_verifies():
    encoded = hash_password("correct horse")
    scheme, iterations, _, _ = encoded.split("$")
    assert scheme == "pbkdf2_sha256" and int(iterations) == auth.ITERATIONS
    assert verify_password("correct horse", encoded)
    assert not verify_password("correct horse ", encoded) and not verify_password("", encoded)
    again = hash_password("correct horse", iterations=FAST)
    assert again != hash_password("correct horse", iterations=FAST)  # a fresh salt every time
    assert verify_password("correct horse", again) and parse_hash(again)[0] == FAST


def test_a_tampered_or_malformed_hash_never_verifies():
    encoded = hash_password("pw", iterations=FAST)
    scheme, iterations, salt, key = encoded.split("$")
    other_key = hash_password("other", iterations=FAST).split("$")[3]
    for bad in (
        f"{scheme}${iterations}${salt}${other_key}",
        f"{scheme}${int(iterations) + 1}${salt}${key}",
        f"md5${iterations}${salt}${key}",
        f"{scheme}$1000${salt}${key}",
        f"{scheme}${iterations}$!!${key}",
        f"{scheme}${iterations}${salt}",
        "",
        "pw",
    ):
        assert not verify_password("pw", bad)


@pytest.mark.parametrize(
    "password,iterations,words", [("", FAST, "must not be empty"), ("pw", 1000, "iterations must be from")]
)
def test_hash_password_refuses_an_empty_password_and_too_few_iterations(password, iterations, words):
    with pytest.raises(ValueError, match=words):
        hash_password(password, iterations=iterations)


# ---- who may log in ------------------------------------------------------------------------------


def test_users_come_from_the_variable_and_the_file(settings_env, monkeypatch):
    a, b, c = (hash_password(p, iterations=FAST) for p in ("pa", "pb", "pc"))
    users_file = settings_env / "users"
    users_file.write_text(f"# who may log in\n\n  carol:{c}  \n# dave: left\n")
    monkeypatch.setenv("GRPO_AUTH_USERS", f"alice:{a}, bob:{b},")
    monkeypatch.setenv("GRPO_AUTH_FILE", str(users_file))
    assert load_users(get_settings()) == {"alice": a, "bob": b, "carol": c}
    monkeypatch.delenv("GRPO_AUTH_USERS")
    monkeypatch.delenv("GRPO_AUTH_FILE")
    assert load_users(get_settings()) == {}  # nothing set: no login


def test_settings_never_show_the_users_variable(settings_env, monkeypatch):
    encoded = hash_password("pw", iterations=FAST)
    monkeypatch.setenv("GRPO_AUTH_USERS", f"alice:{encoded}")
    assert encoded not in repr(get_settings()) and encoded not in str(get_settings())


def _bad_entries(tmp: Path) -> list[tuple[dict, str]]:
    """(environment, where the error must say) for malformed user lists; every hash in them is secret."""
    good = hash_password("pw", iterations=FAST)
    _, iterations, salt, key = good.split("$")
    users_file = tmp / "users"
    return [
        ({"GRPO_AUTH_USERS": f"alice{good}"}, "GRPO_AUTH_USERS entry 1: expected user:hash"),
        ({"GRPO_AUTH_USERS": f"alice:{good},bob:md5$x{key}"}, "GRPO_AUTH_USERS entry 2 (user 'bob'): the hash is not"),
        (
            {"GRPO_AUTH_USERS": f"alice:pbkdf2_sha256$999${salt}${key}"},
            "GRPO_AUTH_USERS entry 1 (user 'alice'): the hash's iteration count",
        ),
        (
            {"GRPO_AUTH_USERS": f"alice:pbkdf2_sha256${iterations}${salt}${key[:-8]}"},
            "(user 'alice'): the hash's salt or key",
        ),
        ({"GRPO_AUTH_USERS": f"al ice:{good}"}, "GRPO_AUTH_USERS entry 1: expected user:hash"),
        ({"GRPO_AUTH_USERS": " , "}, "GRPO_AUTH_USERS is set but holds no user:hash entry"),
        (
            {"GRPO_AUTH_USERS": f"alice:{good},alice:{good}"},
            "GRPO_AUTH_USERS entry 2: user 'alice' is already given at GRPO_AUTH_USERS entry 1",
        ),
        (
            {"GRPO_AUTH_FILE": str(users_file), "file": f"# users\nalice:{good}\nbob {good}\n"},
            f"GRPO_AUTH_FILE {users_file} line 3: expected user:hash",
        ),
        (
            {"GRPO_AUTH_FILE": str(users_file), "file": f"alice:{good}\nbob:{good}x\n"},
            f"GRPO_AUTH_FILE {users_file} line 2 (user 'bob'): the hash",
        ),
        (
            {"GRPO_AUTH_FILE": str(users_file), "file": "# nobody yet\n\n"},
            f"GRPO_AUTH_FILE {users_file}: holds no user",
        ),
        ({"GRPO_AUTH_FILE": str(tmp / "missing")}, f"GRPO_AUTH_FILE {tmp / 'missing'}: cannot read it"),
        (
            {"GRPO_AUTH_USERS": f"alice:{good}", "GRPO_AUTH_FILE": str(users_file), "file": f"alice:{good}\n"},
            f"GRPO_AUTH_FILE {users_file} line 1: user 'alice' is already given at GRPO_AUTH_USERS entry 1",
        ),
    ]


@pytest.mark.parametrize("case", range(12))
def test_a_malformed_entry_names_where_it_is_but_never_the_hash(settings_env, monkeypatch, case):
    env, where = _bad_entries(settings_env)[case]
    if "file" in env:
        Path(env["GRPO_AUTH_FILE"]).write_text(env["file"])
    for key in ("GRPO_AUTH_USERS", "GRPO_AUTH_FILE"):
        if key in env:
            monkeypatch.setenv(key, env[key])
    with pytest.raises(AuthConfigError) as caught:
        load_users(get_settings())
    message = str(caught.value)
    assert where in message
    secrets_in_config = [
        part
        for text in (env.get("GRPO_AUTH_USERS", ""), env.get("file", ""))
        for part in text.replace(",", "$").replace(":", "$").replace("\n", "$").split("$")
        if len(part) >= 16
    ]  # salts and keys
    assert not any(part in message for part in secrets_in_config)


def test_check_reads_the_users_at_each_login(settings_env, monkeypatch, capsys):
    users_file = settings_env / "users"
    users_file.write_text(f"alice:{hash_password('pa', iterations=FAST)}\nbob:{hash_password('pb', iterations=FAST)}\n")
    monkeypatch.setenv("GRPO_AUTH_FILE", str(users_file))
    assert check("alice", "pa") and check("bob", "pb")
    assert not check("alice", "pb") and not check("carol", "pa") and not check("", "")
    users_file.write_text(users_file.read_text().splitlines()[1] + "\n")  # alice removed
    assert not check("alice", "pa") and check("bob", "pb")
    users_file.write_text("bob:not-a-hash\n")  # broken: nobody logs in, and the log says why (not the hash)
    assert not check("bob", "pb")
    logged = capsys.readouterr().err
    assert "login refused" in logged and "line 1" in logged and "not-a-hash" not in logged


# ---- secrets never shown -------------------------------------------------------------------------


def test_urls_are_shown_with_their_passwords_masked(settings_env, monkeypatch):
    assert (
        mask_url("postgresql+psycopg://postgres:S3cretPw@db:5432/grpo")
        == "postgresql+psycopg://postgres:**@db:5432/grpo"
    )
    assert mask_url("redis://:S3cretPw@cache:6379/0") == "redis://:**@cache:6379/0"
    assert mask_url("sqlite:////data/grpo.sqlite") == "sqlite:////data/grpo.sqlite"
    monkeypatch.setenv("GRPO_DATABASE_URL", "postgresql+psycopg://grpo:p%40ssW0rd@db/grpo")
    monkeypatch.setenv("GRPO_BROKER_URL", "amqp://grpo:BrokerPw1@mq//")
    text = (
        "connect to postgresql://grpo:p%40ssW0rd@db/grpo failed; password 'p@ssW0rd' rejected; "
        "amqp://other:Else123@mq// and BrokerPw1"
    )
    masked = mask_secrets(text)
    for secret in ("p%40ssW0rd", "p@ssW0rd", "Else123", "BrokerPw1"):
        assert secret not in masked
    assert "postgresql://grpo:**@db/grpo" in masked and "amqp://other:**@mq//" in masked


# ---- settings ------------------------------------------------------------------------------------


def test_path_roots_default_to_the_data_dir_and_the_start_directory(settings_env, monkeypatch):
    data = (settings_env / "data").resolve()
    assert get_settings().path_roots == (data, Path.cwd().resolve(), data / "uploads", data / "models")
    a, b = settings_env / "a", settings_env / "b"
    monkeypatch.setenv("GRPO_PATH_ROOTS", f"{a}{os.pathsep}{os.pathsep}{b}")
    assert get_settings().path_roots == (a.resolve(), b.resolve(), data / "uploads", data / "models")


def test_upload_limit_setting(settings_env, monkeypatch):
    assert get_settings().max_upload_mb == 200 and get_settings().max_upload_bytes == 200 * 2**20
    assert get_settings().max_model_upload_bytes == get_settings().largest_upload_bytes == 2048 * 2**20
    assert get_settings().upload_mb_per_hour >= get_settings().max_model_upload_mb  # a model at the cap fits
    monkeypatch.setenv("GRPO_MAX_UPLOAD_MB", "0.5")
    assert get_settings().max_upload_bytes == 2**19
    monkeypatch.setenv("GRPO_MAX_MODEL_UPLOAD_MB", "0.25")
    assert get_settings().max_model_upload_bytes == 2**18 and get_settings().largest_upload_bytes == 2**19
    for bad, words in (("0", "must be greater than 0"), ("lots", "must be a number")):
        monkeypatch.setenv("GRPO_MAX_UPLOAD_MB", bad)
        with pytest.raises(ValueError, match=f"GRPO_MAX_UPLOAD_MB {words}"):
            get_settings()


# ---- the hash-password command -------------------------------------------------------------------


def _cli(args: list[str], stdin: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_dashboard.cli", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_hash_password_prints_a_hash_that_verifies():
    result = _cli(["hash-password", "alice"], "tr0ub4dor&3\n")
    assert result.returncode == 0, result.stderr
    user, encoded = result.stdout.strip().split(":", 1)
    assert user == "alice" and verify_password("tr0ub4dor&3", encoded) and "tr0ub4dor" not in result.stdout
    alone = _cli(["hash-password"], "pw with spaces \n").stdout.strip()
    assert verify_password("pw with spaces ", alone)


@pytest.mark.parametrize(
    "args,stdin,words",
    [(["hash-password"], "\n", "must not be empty"), (["hash-password", "a:b"], "pw\n", "a user name is")],
)
def test_hash_password_refuses_an_empty_password_or_a_bad_user(args, stdin, words):
    result = _cli(args, stdin)
    assert result.returncode == 2 and words in result.stderr and result.stdout == ""


def test_serve_refuses_to_start_with_a_malformed_entry(tmp_path):
    secret = "pbkdf2_sha256$600000$c2FsdHNhbHRzYWx0$notakeynotakeynotakey"
    result = _cli(
        ["serve", "--port", str(free_port())], "", env=server_env(tmp_path, GRPO_AUTH_USERS=f"alice:{secret}")
    )
    assert result.returncode == 2
    assert "GRPO_AUTH_USERS entry 1 (user 'alice'): the hash's salt or key" in result.stderr
    assert "notakey" not in result.stdout + result.stderr and "c2FsdHNhbHRzYWx0" not in result.stdout + result.stderr


# ---- a real server with a login ------------------------------------------------------------------

USERS = {"alice": "correct horse", "bob": "battery staple"}


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """A server where alice (GRPO_AUTH_USERS) and bob (GRPO_AUTH_FILE) may log in; yields (url, hashes, log)."""
    tmp = tmp_path_factory.mktemp("auth")
    hashes = {user: hash_password(pw, iterations=FAST) for user, pw in USERS.items()}
    (tmp / "users").write_text(f"# dashboard users\nbob:{hashes['bob']}\n")
    env = server_env(
        tmp,
        GRPO_AUTH_USERS=f"alice:{hashes['alice']}",
        GRPO_AUTH_FILE=str(tmp / "users"),
        GRPO_LOGIN_FREE_ATTEMPTS="1000",
    )  # its wrong logins are many; the throttle: test_web_security.py
    with running_server(tmp, env) as (url, _, log_path):
        yield url, hashes, log_path


def _post(url: str, body: dict | None = None, **kwargs) -> httpx.Response:
    return httpx.post(url, json=body if body is not None else {"data": []}, timeout=10, **kwargs)


@pytest.mark.slow
def test_without_a_login_no_route_answers(auth_server):
    url, _, _ = auth_server
    with pytest.raises(ValueError, match="credentials were not provided"):  # gradio_client's AuthenticationError
        Client(url, verbose=False)
    for route in API_ROUTES:
        assert _post(url + route.lstrip("/")).status_code == 401, route
    for route in ("config", "gradio_api/info", "gradio_api/openapi.json", f"gradio_api/file={ROOT / 'README.md'}"):
        assert httpx.get(url + route, timeout=10).status_code == 401, route
    upload = httpx.post(
        url + "gradio_api/upload", files=[("files", ("d.jsonl", b'{"question": "1", "answer": "1"}\n'))], timeout=10
    )
    assert upload.status_code == 401


@pytest.mark.slow
def test_the_page_is_a_login_form(auth_server):
    url, _, _ = auth_server
    page = httpx.get(url, timeout=10)
    assert page.status_code == 200
    assert '"auth_required":true' in page.text.replace(" ", "")
    assert "launch-button" not in page.text and "tab-launch" not in page.text  # no dashboard before a login


@pytest.mark.slow
@pytest.mark.parametrize(
    "user,password", [("alice", "wrong"), ("alice", USERS["bob"]), ("ALICE", USERS["alice"]), ("carol", USERS["alice"])]
)
def test_a_wrong_password_or_user_is_refused(auth_server, user, password):
    url, _, _ = auth_server
    with pytest.raises(ValueError, match="Could not login"):
        Client(url, auth=(user, password), verbose=False)
    response = httpx.post(url + "login", data={"username": user, "password": password}, timeout=10)
    assert response.status_code == 400 and "access-token" not in response.cookies


@pytest.mark.slow
def test_a_logged_in_client_uses_every_endpoint(auth_server, tmp_path):
    url, _, _ = auth_server
    for user, password in USERS.items():  # one user from the variable, one from the file
        client = Client(url, auth=(user, password), verbose=False)
        assert "/launch_run" in client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        launched = client.predict({"name": f"by {user}", "steps_per_iteration": 2}, api_name="/launch_run")
        assert launched["status"] == "queued"
        assert any(r["run_id"] == launched["run_id"] for r in client.predict(api_name="/list_runs"))
    uploaded = client.predict(handle_file(write_jsonl(tmp_path / "data.jsonl", GOOD_ROWS)), api_name="/upload_dataset")
    assert uploaded["rows"] == 3
    run = client.predict({"dataset": uploaded["dataset"]}, api_name="/launch_run")
    assert client.predict(run["run_id"], api_name="/get_run")["config"]["dataset"] == uploaded["dataset"]
    exported = client.predict(run["run_id"], "config", api_name="/export_run")  # a file download, with the cookie
    assert json.loads(Path(exported).read_text())["dataset"] == uploaded["dataset"]
    # a login by raw HTTP gives the cookie that the API routes need
    session = httpx.Client(base_url=url, timeout=10)
    assert session.post("login", data={"username": "bob", "password": USERS["bob"]}).status_code == 200
    assert session.get("gradio_api/info").status_code == 200
    assert _post(url + "gradio_api/call/list_runs", cookies=session.cookies).status_code == 200


@pytest.mark.slow
def test_the_log_counts_the_users_and_shows_no_secret(auth_server):
    url, hashes, log_path = auth_server
    Client(url, auth=("alice", USERS["alice"]), verbose=False).predict(api_name="/list_runs")
    log = log_path.read_text()
    assert "login required; 2 users may log in" in log
    for secret in [*hashes.values(), *USERS.values()]:
        assert secret not in log


# ---- secrets: serve on PostgreSQL with passwords everywhere -------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
def test_no_password_or_hash_appears_in_output_or_answers(postgres_url, tmp_path):
    """`grpo-dashboard serve` with the store's password in GRPO_DATABASE_URL (PostgreSQL trusts local
    connections, so any password connects), a broker URL with a password that cannot be reached (so a
    launch fails and reports it), and users configured."""
    db_password, broker_password = "S3cretPw", "BrokerS3cret"
    database_url = make_url(postgres_url).set(password=db_password).render_as_string(hide_password=False)
    broker_url = f"redis://:{broker_password}@127.0.0.1:1/0"  # nothing listens on port 1
    hashed = hash_password(USERS["alice"], iterations=FAST)
    env = server_env(
        tmp_path,
        GRPO_DATABASE_URL=database_url,
        GRPO_BROKER_URL=broker_url,
        GRPO_EMBEDDED_WORKER="0",
        GRPO_AUTH_USERS=f"alice:{hashed}",
    )
    secrets = [db_password, broker_password, hashed, hashed.split("$")[3], USERS["alice"]]
    command = [sys.executable, "-m", "grpo_dashboard.cli", "serve", "--data-dir", str(tmp_path)]
    with running_server(tmp_path, env, command) as (url, _, log_path):
        client = Client(url, auth=("alice", USERS["alice"]), verbose=False)
        with pytest.raises(AppError) as caught:
            client.predict({"name": "lost"}, api_name="/launch_run")
        answers = [str(caught.value)]
        assert "could not reach the broker at redis://:**@127.0.0.1:1/0" in answers[0]
        [run] = client.predict(api_name="/list_runs")
        answers += [
            json.dumps(run),
            json.dumps(client.predict(run["run_id"], api_name="/get_run")),
            json.dumps(client.view_api(print_info=False, return_format="dict")),
            httpx.get(url, timeout=10).text,
        ]
        assert run["status"] == "failed"
    output = log_path.read_text()
    assert f"store {mask_url(database_url)}" in output and "redis://:**@127.0.0.1:1/0" in output
    for secret in secrets:
        assert secret not in output, secret
        for answer in answers:
            assert secret not in answer, secret
