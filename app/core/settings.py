"""One settings object for the dashboard, the workers and Alembic, read from the environment.

Infrastructure only; training settings are the run spec (grpo_engine.spec.config).

| variable | default | meaning |
| --- | --- | --- |
| `GRPO_DATA_DIR` | `./grpo-data` | where the embedded store, broker, caches and logs live |
| `GRPO_DATABASE_URL` | `sqlite:///<data dir>/grpo.sqlite` | the store (PostgreSQL: `postgresql+psycopg://user@host/db`) |
| `GRPO_BROKER_URL` | `sqla+sqlite:///<data dir>/broker.sqlite` | Celery broker (Redis: `redis://host:6379/0`, RabbitMQ: `amqp://...`) |
| `GRPO_EMBEDDED_WORKER` | `1` when `GRPO_BROKER_URL` is unset, else `0` | whether `grpo-dashboard serve` starts a worker itself |
| `GRPO_QUEUE` | `grpo` | Celery queue that runs are sent to and workers consume |
| `GRPO_CACHE_DIR` | `<data dir>/cache` | built-in model cache (shared by runs) |
| `GRPO_CHECKPOINT_DIR` | `<data dir>/checkpoints` | run checkpoints and trained policies; in production a directory every worker and the dashboard reach (a shared mount), so a run resumes on any machine and its policy can be downloaded |
| `GRPO_LEASE_SECONDS` | `60` | a worker renews its run's lease 4 times in this period; a run whose lease is older (its worker died) is put back in the queue by any live worker and resumes from its last checkpoint |
| `GRPO_AUTH_USERS` | none | who may log in: comma-separated `user:hash` entries, each hash made by `grpo-dashboard hash-password`; with this or `GRPO_AUTH_FILE` set, the page and every API call need a login (see Login) |
| `GRPO_AUTH_FILE` | none | a file of `user:hash` lines (blank lines and `#` comments allowed), read at start-up and at every login, so deleting a line stops that user's next login |
| `GRPO_PATH_ROOTS` | the data directory and the directory the process started in | directories (separated by `:`) that a local `model`, `reward_model` or `dataset` path in a run spec must lie in, after following symlinks; `<data dir>/uploads` (uploaded datasets) and `<data dir>/models` (the models folder: uploaded models, or any model directory or `.gguf` file copied there) are always allowed |
| `GRPO_MAX_UPLOAD_MB` | `200` | largest dataset file an upload may be, in MiB (2^20 bytes) |
| `GRPO_MAX_MODEL_UPLOAD_MB` | `2048` | largest model an upload may be, in MiB: a `.gguf` file, or a zipped model directory both as uploaded and as unpacked (the sum of its files) |
| `GRPO_MAX_UPLOAD_FILES` | `4` | most files one upload request may carry |
| `GRPO_UPLOAD_MB_PER_HOUR` | `4096` | most MiB one user (without a login: one client address) may upload in an hour (datasets and models together: at least `GRPO_MAX_MODEL_UPLOAD_MB`, or a model at the cap cannot be uploaded) |
| `GRPO_ALLOWED_ORIGINS` | none | other web origins (comma-separated `scheme://host[:port]`) whose pages may call the dashboard with a user's session; its own origin is always allowed, every other is refused (see Security) |
| `GRPO_SESSION_IDLE_MINUTES` | `720` | a login session unused for this long ends |
| `GRPO_MAX_TOKENS_PER_STEP` | `1048576` | the most tokens a run may sample in one step (`batch_size` x `group_size` x `max_new_tokens`), checked at launch and again by the worker, which may set its own; a reward model's (re)training may sample 8 steps' worth (`rm_samples` x 1.25 x `max_new_tokens`); size it to the workers' memory |
| `GRPO_ALLOW_CUSTOM_REWARDS` | `0` | `1` lets run specs name custom reward functions in `rewards` (an installed package's entry point in `grpo_dashboard.rewards`, or a `.py` file inside `GRPO_PATH_ROOTS`; see Rewards): they run user code on the workers, and the Launch tab's "Test rewards" runs them in a subprocess of the dashboard; set it on the dashboard and on every worker (a worker without it fails such a run) |
| `GRPO_LOGIN_FREE_ATTEMPTS` | `5` | failed logins allowed per client address and per user before each further attempt must wait (1 s, doubling up to 5 minutes; a success clears the count) |
| `GRPO_WORKER_MEMORY_GB` | none | a worker's cap on its own memory, in GiB (the process's writable memory; GPU memory does not count, CUDA's host-side buffers do): a run that would need more is refused when it starts (by its estimate) or fails when an allocation passes the cap, with the out-of-memory message, and the worker takes the next run |
| `GRPO_HUB_CHECK_SECONDS` | `5` | how long launch (on the dashboard's machine) and a worker (before loading) wait for the Hugging Face Hub to confirm a model or dataset id that is not in the local cache; `0` skips the check |
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from grpo_engine.report.run_files import FINAL_DIR, policy_at_dir

UPLOADS = "uploads"  # the data directory's folder of uploaded datasets
MODELS = "models"  # the data directory's models folder: uploaded models, and any copied there by hand


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _number(env, name: str, default: float | None, at_least_zero: bool = False) -> float | None:
    """A number from the environment (greater than 0, or with ``at_least_zero`` 0 or more), or a ValueError that
    names the variable."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not (value >= 0 if at_least_zero else value > 0):
        raise ValueError(f"{name} must be {'0 or more' if at_least_zero else 'greater than 0'}, got {raw!r}")
    return value


def _positive(env, name: str, default: float | None) -> float | None:
    """A positive number from the environment, or a ValueError that names the variable."""
    return _number(env, name, default)


def _origins(raw: str | None) -> tuple[str, ...]:
    """GRPO_ALLOWED_ORIGINS: each ``scheme://host[:port]``, lower-cased, without a trailing slash; a ValueError that
    names the variable for anything else."""
    origins = []
    for item in (raw or "").split(","):
        origin = item.strip().rstrip("/").lower()
        if not origin:
            continue
        scheme, sep, host = origin.partition("://")
        if scheme not in ("http", "https") or not sep or not host or "/" in host:
            raise ValueError(f"GRPO_ALLOWED_ORIGINS entries must be scheme://host[:port], got {item.strip()!r}")
        origins.append(origin)
    return tuple(origins)


def _path_roots(raw: str | None, data_dir: Path) -> tuple[Path, ...]:
    """GRPO_PATH_ROOTS (os.pathsep-separated), else the data directory and the current directory; resolved
    (symlinks followed), with the uploads directory and the models folder added."""
    given = [p for p in (raw or "").split(os.pathsep) if p.strip()]
    roots = [Path(p.strip()).expanduser().resolve() for p in given] or [data_dir, Path.cwd().resolve()]
    return tuple(dict.fromkeys([*roots, (data_dir / UPLOADS).resolve(), (data_dir / MODELS).resolve()]))


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str = field(repr=False)  # may hold a password
    broker_url: str = field(repr=False)
    embedded_worker: bool
    queue: str
    cache_dir: Path
    checkpoint_dir: Path
    lease_seconds: float
    auth_users: str = field(repr=False)  # the raw GRPO_AUTH_USERS, parsed by app.core.auth (hashes: never printed)
    auth_file: Path | None
    path_roots: tuple[Path, ...]  # resolved, the uploads directory and the models folder included
    max_upload_mb: float
    max_model_upload_mb: float = 2048.0
    allowed_origins: tuple[str, ...] = ()  # besides the dashboard's own
    max_upload_files: int = 4
    upload_mb_per_hour: float = 4096.0
    session_idle_minutes: float = 720.0
    login_free_attempts: int = 5
    max_tokens_per_step: int = 2**20
    worker_memory_gb: float | None = None  # a worker's cap on its own memory (RLIMIT_DATA); None: no cap
    hub_check_seconds: float = 5.0  # how long launch and workers wait for the Hub to confirm an id; 0: no check
    allow_custom_rewards: bool = False  # run specs may name custom reward functions (user code on the workers)

    def run_dir(self, run_id: int) -> Path:
        """A run's folder under the checkpoint directory: its checkpoints and, once it completes, its final
        policy (``final/``)."""
        return self.checkpoint_dir / f"run-{run_id}"

    def trained_policy_dir(self, run_id: int) -> Path:
        """A completed run's trained policy as a Hugging Face model directory (LoRA merged): what ``model:
        run:<id>`` loads and the "Trained policy" download zips."""
        return self.run_dir(run_id) / FINAL_DIR / "model"

    def policy_at_dir(self, run_id: int, step: int) -> Path:
        """The policy of a run's checkpoint of ``step`` as a model directory, once a run named it: what ``model:
        run:<id>@<step>`` loads (grpo_engine.report.run_files)."""
        return policy_at_dir(self.run_dir(run_id), step)

    @property
    def uploads_dir(self) -> Path:
        """Where uploaded dataset files are stored."""
        return self.data_dir / UPLOADS

    @property
    def models_dir(self) -> Path:
        """The models folder: uploaded models, and model directories or .gguf files copied there; always a path
        root."""
        return self.data_dir / MODELS

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)

    @property
    def max_model_upload_bytes(self) -> int:
        return int(self.max_model_upload_mb * 2**20)

    @property
    def largest_upload_bytes(self) -> int:
        """The most one uploaded file may be, a dataset or a model (what the web server lets through)."""
        return max(self.max_upload_bytes, self.max_model_upload_bytes)


def get_settings() -> Settings:
    """Read the environment now (cheap; call it where settings are needed)."""
    env = os.environ
    data_dir = Path(env.get("GRPO_DATA_DIR") or "grpo-data").expanduser().resolve()
    broker_url = env.get("GRPO_BROKER_URL") or f"sqla+sqlite:///{data_dir / 'broker.sqlite'}"
    embedded = env.get("GRPO_EMBEDDED_WORKER")
    return Settings(
        data_dir=data_dir,
        database_url=env.get("GRPO_DATABASE_URL") or f"sqlite:///{data_dir / 'grpo.sqlite'}",
        broker_url=broker_url,
        embedded_worker=_flag(embedded) if embedded is not None else not env.get("GRPO_BROKER_URL"),
        queue=env.get("GRPO_QUEUE") or "grpo",
        cache_dir=Path(env.get("GRPO_CACHE_DIR") or data_dir / "cache").expanduser().resolve(),
        checkpoint_dir=Path(env.get("GRPO_CHECKPOINT_DIR") or data_dir / "checkpoints").expanduser().resolve(),
        lease_seconds=_positive(env, "GRPO_LEASE_SECONDS", 60.0),
        auth_users=env.get("GRPO_AUTH_USERS") or "",
        auth_file=Path(env["GRPO_AUTH_FILE"]).expanduser() if env.get("GRPO_AUTH_FILE", "").strip() else None,
        path_roots=_path_roots(env.get("GRPO_PATH_ROOTS"), data_dir),
        max_upload_mb=_positive(env, "GRPO_MAX_UPLOAD_MB", 200.0),
        max_model_upload_mb=_positive(env, "GRPO_MAX_MODEL_UPLOAD_MB", 2048.0),
        allowed_origins=_origins(env.get("GRPO_ALLOWED_ORIGINS")),
        max_upload_files=int(_positive(env, "GRPO_MAX_UPLOAD_FILES", 4)),
        upload_mb_per_hour=_positive(env, "GRPO_UPLOAD_MB_PER_HOUR", 4096.0),
        session_idle_minutes=_positive(env, "GRPO_SESSION_IDLE_MINUTES", 720.0),
        login_free_attempts=int(_positive(env, "GRPO_LOGIN_FREE_ATTEMPTS", 5)),
        max_tokens_per_step=int(_positive(env, "GRPO_MAX_TOKENS_PER_STEP", 2**20)),
        worker_memory_gb=_positive(env, "GRPO_WORKER_MEMORY_GB", None),
        hub_check_seconds=_number(env, "GRPO_HUB_CHECK_SECONDS", 5.0, at_least_zero=True),
        allow_custom_rewards=_flag(env.get("GRPO_ALLOW_CUSTOM_REWARDS") or ""),
    )
