"""Does the dashboard stay fast on a big run? /list_groups, /get_group, /search_samples and /question_history
against a store with 1M tokens.

Seeds ONE run with at least --tokens stored completion tokens into a fresh store per backend: an
SQLite file in a temporary data dir, and a uniquely named PostgreSQL database (dropped at the end).
The run has the default shape, B = 8 groups per step and G = 8 samples per group, at most 32 tokens
each (max_new_tokens), so 1,024,000 tokens take about 700 steps. Samples look like the built-in
task's: its questions, their step-by-step solutions cut into the built-in tokenizer's tokens
(numbers of up to 3 digits, single characters, then "</s>"): most end after their answer line
(40% of them with a wrong answer), the rest ramble on without one until cut at max_new_tokens
(truncated), each question with a difficulty of its own (easy ones' groups are often all right,
hard ones' all wrong); the built-in verifier (grpo_engine.rewards.rewards.outcome_reward) gives their
reward_components (correct, formatted). Per-token advantages are normalised within the group;
every 4th group is process-supervised (step_rewards and step_end_indices). Seeding goes through
app.store (record_step, record_groups, which fill the columns a search filters on) in transactions
of --steps-per-commit steps.

Then, per backend, it starts a real ``grpo-dashboard serve`` on that store (no embedded worker:
GRPO_EMBEDDED_WORKER=0; for PostgreSQL also GRPO_BROKER_URL=--redis-url, the production shape),
connects with gradio_client and times --calls calls of each endpoint, after one untimed warm-up:
``/list_groups`` with a step spread across the run, ``/list_groups`` with step None (the latest
step, what the tab opens on) and ``/get_group`` with random group ids. The same calls are also
timed on app.store directly, in this process, to tell the database's share from the server's.
``/search_samples`` is timed with: wrong answers by reward; a reward and a step range; a text search;
the samples of mixed groups by spread; a deep page (near the last, by length). ``/question_history``
with the question the run sampled most often.

    .venv/bin/python -m bench.store_scale                            # both backends, 1,024,000 tokens
    .venv/bin/python -m bench.store_scale --tokens 100000 --backends sqlite
    .venv/bin/python -m bench.store_scale --keep                     # keep the data dir (and its SQLite file)

Prints seeding time and token count per backend, then per endpoint and backend the median and
p90 seconds of a call, PASS or FAIL against --max-median (0.5 s). Exit status 0 when all pass.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import fields
from pathlib import Path

from bench.harness import dashboard, pass_fail

GROUPS_PER_STEP = 8  # B, the default batch_size
SAMPLES_PER_GROUP = 8  # G, the default group_size
TOKENS_PER_SAMPLE = 32  # the default max_new_tokens
PROCESS_EVERY = 4  # every 4th group is process-supervised
EOS = "</s>"
TOKEN_PATTERN = re.compile(r"\d{1,3}|\D")  # the built-in tokenizer's pre-tokenizer (grpo_engine/model/model.py)
ADV_EPS = 1e-4


# ---- 1. realistic groups ---------------------------------------------------------------------


def completion_tokens(question: str, solution: str, difficulty: float, rng: random.Random) -> list[str]:
    """The tokens of a plausible completion, at most TOKENS_PER_SAMPLE, for a question of ``difficulty`` d in
    [0, 1]: with probability 0.95 - 0.4 d the solution (with probability 0.8 d with a wrong final answer) and EOS;
    else its steps without the answer line, then the question and the steps again until the token budget runs
    out (truncated at max_new_tokens, no EOS). On average a quarter ramble and 40% of answers are wrong."""
    lines = solution.split("\n")
    if rng.random() < 0.8 * difficulty:
        lines[-1] = f"#### {int(lines[-1][5:]) + rng.choice((-6, -2, 1, 4, 8))}"
    if rng.random() < 0.95 - 0.4 * difficulty:
        return TOKEN_PATTERN.findall("\n".join(lines))[: TOKENS_PER_SAMPLE - 1] + [EOS]
    text = "\n".join(lines[:-1])
    tokens = TOKEN_PATTERN.findall(text)
    while len(tokens) < TOKENS_PER_SAMPLE:
        tokens += TOKEN_PATTERN.findall(f"\n{question}\n{text}")
    return tokens[:TOKENS_PER_SAMPLE]


def step_ends(tokens: list[str]) -> list[int]:
    """0-based index of the token that ends each step: the one before each "\\n", and the last one (EOS is no step)."""
    body = tokens[:-1] if tokens[-1] == EOS else tokens
    ends = [i - 1 for i, t in enumerate(body) if t == "\n" and i > 0 and body[i - 1] != "\n"]
    return ends if body[-1] == "\n" else ends + [len(body) - 1]


def make_group(example: dict, process: bool, rng: random.Random) -> dict:
    """One group as ``GroupRecord.to_dict()`` gives it: G samples with the verifier's reward components, whether
    they were truncated, rewards and advantages."""
    from grpo_engine.rewards.rewards import outcome_reward

    samples = []
    difficulty = random.Random(example["question"]).random()  # the same for every group of a question
    for _ in range(SAMPLES_PER_GROUP):
        tokens = completion_tokens(example["question"], example["solution"], difficulty, rng)
        completion = "".join(t for t in tokens if t != EOS)
        reward, components = outcome_reward(completion, example["answer"])
        sample = {
            "completion": completion,
            "tokens": tokens,
            "reward": reward,
            "step_rewards": None,
            "step_end_indices": None,
            "reward_components": components,
            "truncated": tokens[-1] != EOS,
        }
        if process:
            sample["step_end_indices"] = step_ends(tokens)
            sample["step_rewards"] = [float(rng.random() < 0.7) for _ in sample["step_end_indices"]]
            sample["reward"] = statistics.fmean(sample["step_rewards"])
        samples.append(sample)
    (process_advantages if process else outcome_advantages)(samples)
    return {"prompt": example["question"], "reference": example["answer"], "samples": samples}


def outcome_advantages(samples: list[dict]) -> None:
    """A_i = (r_i - mean(r)) / (std(r) + eps) on every token (section 4.1.2; population std)."""
    rewards = [s["reward"] for s in samples]
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    for s in samples:
        a = 0.0 if std == 0 else round((s["reward"] - mean) / (std + ADV_EPS), 6)
        s["advantages"] = [a] * len(s["tokens"])


def process_advantages(samples: list[dict]) -> None:
    """A_t = sum of the normalised rewards of the steps ending at or after t (section 4.1.3)."""
    flat = [r for s in samples for r in s["step_rewards"]]
    mean, std = statistics.fmean(flat), statistics.pstdev(flat)
    for s in samples:
        adv = [0.0] * len(s["tokens"])
        for r, end in zip(s["step_rewards"], s["step_end_indices"], strict=True):
            for t in range(end + 1):
                adv[t] += 0.0 if std == 0 else (r - mean) / (std + ADV_EPS)
        s["advantages"] = [round(a, 6) for a in adv]


# ---- 2. seeding through app.store -------------------------------------------------------------


def seed_store(url: str, min_tokens: int, steps_per_commit: int, seed: int) -> dict:
    """Migrate ``url`` and record one completed run with at least ``min_tokens`` completion tokens; return
    {run_id, steps, group_ids, tokens, question: the one sampled most often, question_groups: how often}."""
    from sqlalchemy import select

    from app import store
    from app.store.db import session_scope, upgrade_database
    from app.store.models import Group
    from grpo_engine.data.data import load_dataset
    from grpo_engine.spec.config import validate_spec

    rng = random.Random(seed)
    train_set, _ = load_dataset("builtin-arith")
    upgrade_database(url)
    guess = -(-min_tokens // (GROUPS_PER_STEP * SAMPLES_PER_GROUP * 23))  # ~23 tokens a sample
    spec = validate_spec({"name": "store-scale", "steps_per_iteration": guess}).to_dict()
    with session_scope(url) as s:
        run_id = store.create_run(s, spec, spec["name"])
        store.mark_running(s, run_id, guess)
    tokens, step, asked = 0, 0, collections.Counter()
    while tokens < min_tokens:
        with session_scope(url) as s:  # one transaction per chunk of steps
            for _ in range(steps_per_commit):
                step += 1
                examples = [rng.choice(train_set) for _ in range(GROUPS_PER_STEP)]
                groups = [
                    make_group(e, (step * GROUPS_PER_STEP + b) % PROCESS_EVERY == 0, rng)
                    for b, e in enumerate(examples)
                ]
                store.record_groups(s, run_id, step, groups)
                rewards = [x["reward"] for g in groups for x in g["samples"]]
                store.record_step(
                    s,
                    run_id,
                    step,
                    1,
                    {"reward_mean": statistics.fmean(rewards), "reward_std": statistics.pstdev(rewards)},
                )
                tokens += sum(len(x["tokens"]) for g in groups for x in g["samples"])
                asked.update(e["question"] for e in examples)
                if tokens >= min_tokens:
                    break
    with session_scope(url) as s:
        store.mark_running(s, run_id, step)
        store.finish_run(s, run_id, "completed")
        group_ids = list(s.scalars(select(Group.id).where(Group.run_id == run_id)))
    ((question, times),) = asked.most_common(1)
    return {
        "run_id": run_id,
        "steps": step,
        "group_ids": group_ids,
        "tokens": tokens,
        "question": question,
        "question_groups": times,
    }


# ---- 3. timing -------------------------------------------------------------------------------


def seconds_per_call(fn, calls: list[tuple]) -> list[float]:
    """Wall seconds of ``fn(*args)`` for each args in ``calls``, after one untimed warm-up call."""
    fn(*calls[0])
    times = []
    for args in calls:
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return times


def p90(times: list[float]) -> float:
    return statistics.quantiles(times, n=10, method="inclusive")[8]


def search_args(run_id: int, **filters) -> tuple:
    """The positional arguments of a /search_samples call with ``filters`` (app.store.SampleQuery's keys), the rest
    at their defaults."""
    from app.store import SampleQuery

    defaults = SampleQuery()
    return (run_id, *(filters.get(f.name, getattr(defaults, f.name)) for f in fields(SampleQuery)))


def store_search(s, run_id: int, *args):
    """app.store.search_samples on search_args' positional arguments."""
    from app import store

    return store.search_samples(s, run_id, store.SampleQuery(*args))


def cases(seeded: dict, n: int, rng: random.Random) -> dict[str, tuple[str, object, list[tuple]]]:
    """Per timed case: (endpoint, the app.store function it wraps, the arguments of each call)."""
    from app import store

    run_id, steps = seeded["run_id"], seeded["steps"]
    spread = [1 + round(i * (steps - 1) / max(1, n - 1)) for i in range(n)]
    last_page = -(-len(seeded["group_ids"]) * SAMPLES_PER_GROUP // 50)
    search = [
        (
            "search(wrong,reward)",
            [search_args(run_id, outcome="wrong", sort="reward", page=1 + i % 3) for i in range(n)],
        ),
        (
            "search(reward+steps)",
            [search_args(run_id, reward_min=0.5, reward_max=1.0, step_min=max(1, s - 50), step_max=s) for s in spread],
        ),
        (
            "search(contains)",
            [search_args(run_id, contains=f"{rng.choice('+-*')}{rng.randint(1, 9)}=") for _ in range(n)],
        ),
        (
            "search(kind mixed)",
            [search_args(run_id, kind="mixed", sort="spread", descending=True, page=1 + i) for i in range(n)],
        ),
        ("search(deep page)", [search_args(run_id, sort="length", page=last_page - i) for i in range(n)]),
    ]
    return {
        "list_groups(step)": ("/list_groups", store.list_groups, [(run_id, s) for s in spread]),
        "list_groups(None)": ("/list_groups", store.list_groups, [(run_id, None)] * n),
        "get_group": ("/get_group", store.get_group, [(g,) for g in rng.sample(seeded["group_ids"], n)]),
        **{name: ("/search_samples", store_search, calls) for name, calls in search},
        "question_history": ("/question_history", store.question_history, [(run_id, seeded["question"])] * n),
    }


def measure(
    url: str, db_url: str, seeded: dict, n: int, rng: random.Random
) -> dict[str, tuple[list[float], list[float]]]:
    """Per case: (seconds per API call, seconds per app.store call on the same arguments)."""
    from gradio_client import Client

    from app.store.db import session_scope

    client = Client(url, verbose=False)
    check(client, seeded)

    def in_store(fn):
        def call(*args):
            with session_scope(db_url) as s:
                return fn(s, *args)

        return call

    return {
        name: (
            seconds_per_call(lambda *a, e=endpoint: client.predict(*a, api_name=e), calls),
            seconds_per_call(in_store(fn), calls),
        )
        for name, (endpoint, fn, calls) in cases(seeded, n, rng).items()
    }


def check(client, seeded: dict) -> None:
    """The server answers with the seeded data: B groups at the last step, G samples of at most 32 tokens; wrong
    answers are wrong; the question's history holds every group that sampled it."""
    run_id, steps = seeded["run_id"], seeded["steps"]
    groups = client.predict(run_id, None, api_name="/list_groups")
    assert len(groups) == GROUPS_PER_STEP and {g["step"] for g in groups} == {steps}, groups
    group = client.predict(seeded["group_ids"][0], api_name="/get_group")
    assert len(group["samples"]) == SAMPLES_PER_GROUP, group
    assert all(len(x["tokens"]) == len(x["advantages"]) <= TOKENS_PER_SAMPLE for x in group["samples"])
    wrong = client.predict(*search_args(run_id, outcome="wrong", sort="reward"), api_name="/search_samples")
    assert wrong["total"] > 0 and all(r["answer_found"] and not r["correct"] for r in wrong["rows"]), wrong
    truncated = client.predict(*search_args(run_id, outcome="truncated"), api_name="/search_samples")
    assert 0 < truncated["total"] < wrong["total"] * 3, truncated["total"]
    history = client.predict(run_id, seeded["question"], api_name="/question_history")
    shown = len(history["runs"][0]["groups"])
    assert history["runs"][0]["groups_total"] == seeded["question_groups"] >= shown > 0, history["runs"][0]
    print(
        f"  {wrong['total']} wrong answers, {truncated['total']} truncated samples; the question "
        f"{seeded['question']!r} in {seeded['question_groups']} groups",
        flush=True,
    )


# ---- 4. one backend --------------------------------------------------------------------------


def create_postgres_database(server_url: str) -> str:
    """A new, uniquely named database on the server; returns its URL."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    server = make_url(server_url)
    name = f"grpo_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server.set(database=server.database or "postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return server.set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(url: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from app.store.db import make_engine

    make_engine(url).dispose()
    parsed = make_url(url)
    admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)')
    admin.dispose()


def bench_backend(backend: str, data_dir: Path, args: argparse.Namespace) -> dict:
    """Seed one store, serve it, time the endpoints; returns the timings per endpoint."""
    data_dir.mkdir(parents=True)
    db_url = (
        create_postgres_database(args.postgres_url)
        if backend == "postgres"
        else f"sqlite:///{data_dir / 'grpo.sqlite'}"
    )
    try:
        t0 = time.perf_counter()
        seeded = seed_store(db_url, args.tokens, args.steps_per_commit, args.seed)
        seconds, tokens = time.perf_counter() - t0, seeded["tokens"]
        groups = len(seeded["group_ids"])
        print(
            f"{backend}: seeded run {seeded['run_id']}: {seeded['steps']} steps, {groups} groups, "
            f"{groups * SAMPLES_PER_GROUP} samples, {tokens:,} tokens in {seconds:.1f}s "
            f"({tokens / seconds:,.0f} tokens/s)",
            flush=True,
        )
        if backend == "sqlite":
            size = sum(f.stat().st_size for f in data_dir.glob("grpo.sqlite*"))  # the WAL file included
            print(f"{backend}: store files {size / 1e6:.0f} MB", flush=True)
        settings = {"GRPO_DATABASE_URL": db_url}
        if backend == "postgres":
            settings["GRPO_BROKER_URL"] = args.redis_url
        with dashboard(data_dir, GRPO_EMBEDDED_WORKER="0", **settings) as (url, _):
            return measure(url, db_url, seeded, args.calls, random.Random(args.seed))
    finally:
        if backend == "postgres":
            drop_postgres_database(db_url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_024_000, help="at least this many stored completion tokens")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per endpoint")
    parser.add_argument("--max-median", type=float, default=0.5, help="PASS when an endpoint's median is at most this")
    parser.add_argument("--steps-per-commit", type=int, default=50, help="steps seeded per transaction")
    parser.add_argument(
        "--postgres-url",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/",
        help="PostgreSQL server the database is created on",
    )
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/7",
        help="GRPO_BROKER_URL of the PostgreSQL server (never used: nothing is launched)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not set(backends) <= {"sqlite", "postgres"}:
        parser.error(f"--backends: unknown backend in {args.backends!r}")

    root = Path(tempfile.mkdtemp(prefix="grpo-store-scale-"))
    print(f"data dir {root}")
    results = {}
    try:
        for backend in backends:
            results[backend] = bench_backend(backend, root / backend, args)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    print(
        f"\n{'backend':<9} {'endpoint':<20} {'median s':>9} {'p90 s':>7} {'store median s':>15}  "
        f"(API: {args.calls} calls via gradio_client; store: app.store in-process)"
    )
    passed = True
    for backend, timings in results.items():
        for name, (api_times, store_times) in timings.items():
            median = statistics.median(api_times)
            ok = median <= args.max_median
            passed &= ok
            store_median = statistics.median(store_times)
            print(
                f"{backend:<9} {name:<20} {median:9.3f} {p90(api_times):7.3f} {store_median:15.4f}  "
                f"{'PASS' if ok else 'FAIL'} (median <= {args.max_median} s)"
            )
    return pass_fail(passed)


if __name__ == "__main__":
    sys.exit(main())
