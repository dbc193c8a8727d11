"""Every group a run samples, with its samples: writing a step's groups (their rewards' mean and spread, kind and
question key; each sample's row, its per-token arrays packed), reading them back (one mapping per table turns a row
into its dict: ``sample_dict``, ``group_summary``), a step's groups in order, a run's recent lengths and rewards,
and the export's rows. Small functions taking a Session, returning plain JSON-able values.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from array import array
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from app.store.models import Group, Sample

# The table a worker writes every step, for Core statements (no ORM unit of work on the hot path)
GROUPS = Group.__table__


def record_groups(s: Session, run_id: int, step: int, groups: list[dict[str, Any]]) -> None:
    """Store every group sampled at ``step`` (``GroupRecord.to_dict()`` each), replacing earlier ones.

    Each group keeps the mean and population std of the rewards its advantages were normalised over: its G rewards
    (outcome supervision), or every step reward of its outputs (process supervision; a group whose outputs' mean
    rewards are equal may still teach through its steps).

    A worker writes this every step, on a thread that shares the CPU (and Python's lock) with the training loop, so
    it runs on the tables rather than through the ORM: one delete, one multi-row insert of the groups returning
    their ids in order, and the samples as one executemany of rows encoded here (``_sample``), given to the
    database driver as they are.
    """
    s.execute(delete(GROUPS).where(GROUPS.c.run_id == run_id, GROUPS.c.step == step))
    if not groups:
        return
    rows = []
    for position, group in enumerate(groups):
        steps = [float(r) for sample in group["samples"] for r in (sample.get("step_rewards") or [])]
        mean, std = mean_std(steps or [float(sample["reward"]) for sample in group["samples"]])
        rows.append(
            dict(
                run_id=run_id,
                step=step,
                position=position,
                prompt=group["prompt"],
                model_prompt=group.get("model_prompt") or None,
                reference=group["reference"],
                reward_mean=mean,
                reward_std=std,
                kind=group_kind([_correct(sample) for sample in group["samples"]]),
                question_key=question_key(group["prompt"]),
            )
        )
    ids = s.execute(insert(GROUPS).returning(GROUPS.c.id, sort_by_parameter_order=True), rows).scalars().all()
    samples = [
        _sample(group_id, run_id, step, i, sample)
        for group_id, group in zip(ids, groups, strict=True)
        for i, sample in enumerate(group["samples"])
    ]
    if samples:
        s.connection().exec_driver_sql(_samples_insert(s.get_bind().dialect.paramstyle), samples)


@functools.cache
def _samples_insert(paramstyle: str) -> str:
    """The driver-level INSERT of one samples row (SAMPLE_COLUMNS, positional parameters in ``paramstyle``)."""
    marker = PLACEHOLDERS[paramstyle]
    return f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join([marker] * len(SAMPLE_COLUMNS))})"


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and population standard deviation of a group's rewards, in floats with correctly rounded sums
    (math.fsum; statistics.pstdev computes in exact fractions, some 20 times slower, on every recorded step).

    >>> mean_std([1.0, 0.0, 0.0, 1.0])
    (0.5, 0.5)
    """
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def group_kind(verdicts: list[bool]) -> str:
    """'all_right', 'all_wrong' or 'mixed': whether the verifier accepted all, none or some of a group's outputs.

    >>> group_kind([True, True]), group_kind([False, False]), group_kind([True, False])
    ('all_right', 'all_wrong', 'mixed')
    """
    right = sum(verdicts)
    return "all_right" if verdicts and right == len(verdicts) else "all_wrong" if right == 0 else "mixed"


def question_key(question: str) -> str:
    """The key of one question's groups across steps and runs: the sha1 of its text, in hex (an index on the
    text itself would not fit PostgreSQL's btree rows for long prompts)."""
    return hashlib.sha1(question.encode("utf-8")).hexdigest()


def _correct(sample: dict[str, Any]) -> bool:
    """Whether the verifier accepted a sample's final answer (its ``correct`` reward component)."""
    return float((sample.get("reward_components") or {}).get("correct", 0.0)) > 0


def pack(values, typecode: str = "f") -> bytes | None:
    """A per-token list as the bytes of one typed array: little-endian float32 ('f'), float64 ('d', which keeps a
    Python float exactly) or uint8 ('B', one byte per value: 1 where it is true / nonzero); None stays None.

    >>> unpack(pack([0.5, -1.25])), unpack(pack([0.1], "d"), "d"), unpack(pack([1.0, 0.0, True], "B"), "B")
    ([0.5, -1.25], [0.1], [True, False, True])
    """
    if values is None:
        return None
    if typecode == "B":
        return bytes(map(bool, values))
    packed = array(typecode, values)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def unpack(data: bytes | None, typecode: str = "f", digits: int = 5) -> list | None:
    """The list ``pack`` stored: float32 rounded to ``digits`` decimals (what float32 holds of a log-prob), float64
    exactly, flags as bools; None stays None."""
    if data is None:
        return None
    if typecode == "B":
        return [bool(v) for v in data]
    values = array(typecode)
    values.frombytes(data)
    if _BIG_ENDIAN:
        values.byteswap()
    return values.tolist() if typecode == "d" else [round(v, digits) for v in values]


_BIG_ENDIAN = array("H", [1]).tobytes() == b"\x00\x01"
TOKEN_ARRAYS = (
    "logprobs",
    "ref_logprobs",
    "ratios",
    "kls",
)  # float32 per token; "clipped" is uint8, "advantages" float64


# The samples columns record_groups fills, in the order of _sample's tuples (all but the id)
SAMPLE_COLUMNS = (
    "group_id",
    "run_id",
    "step",
    "position",
    "completion",
    "tokens",
    "advantages",
    "reward",
    "step_rewards",
    "step_end_indices",
    "step_labels",
    "step_shares",
    "reward_components",
    "length",
    "correct",
    "answer_found",
    "answer",
    "answer_rule",
    "truncated",
    *TOKEN_ARRAYS,
    "clipped",
)
PLACEHOLDERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}  # a positional parameter, by the driver's style


def _json(values) -> str | None:
    """A JSON column's value as the driver takes it: the JSON text (None: SQL null)."""
    return None if values is None else json.dumps(values)


def _floats(values) -> str | None:
    """A per-step list of floats as JSON text; None (not recorded) stays None."""
    return None if values is None else json.dumps([float(v) for v in values])


def answer_found(sample: dict[str, Any]) -> bool:
    """Whether the verifier read a final answer from a ``SampleRecord`` dict, under its run's answer_match: its
    recorded reading (``answer_rule`` not 'none'; with 'flexible' a last number counts); for a sample recorded
    without one, a final answer stated in the strict form (its ``formatted`` reward component, true when absent).

    >>> answer_found({"answer": "3", "answer_rule": "number", "reward_components": {"formatted": 0.0}})
    True
    >>> answer_found({"answer": None, "answer_rule": "none"}), answer_found({"reward_components": {"formatted": 0.0}})
    (False, False)
    """
    if sample.get("answer_rule") is not None:
        return sample["answer_rule"] != "none"
    return float((sample.get("reward_components") or {}).get("formatted", 1.0)) > 0


def _sample(group_id: int, run_id: int, step: int, position: int, sample: dict[str, Any]) -> tuple:
    """The samples row of one ``SampleRecord`` dict, as a tuple of SAMPLE_COLUMNS: JSON columns as JSON text,
    per-token arrays packed."""
    components = {key: float(v) for key, v in (sample.get("reward_components") or {}).items()}
    rule = sample.get("answer_rule")
    ends = sample.get("step_end_indices")
    advantages = sample["advantages"]
    return (
        group_id,
        run_id,
        step,
        position,
        sample["completion"],
        json.dumps(list(map(str, sample["tokens"]))),
        pack(advantages, "d"),
        float(sample["reward"]),
        _floats(sample.get("step_rewards")),
        _json(None if ends is None else [int(i) for i in ends]),
        _floats(sample.get("step_labels")),
        _floats(sample.get("step_shares")),
        json.dumps(components),
        len(advantages),
        components.get("correct", 0.0) > 0,
        answer_found(sample),
        None if rule is None or sample.get("answer") is None else str(sample["answer"]),
        rule,
        sample.get("truncated"),
        *(pack(sample.get(name)) for name in TOKEN_ARRAYS),
        pack(sample.get("clipped"), "B"),
    )


def recent_lengths_rewards(s: Session, run_id: int, steps: int = 5, limit: int = 5000) -> list[tuple[int, float]]:
    """(completion length, reward) of the samples recorded in a run's last ``steps`` recorded steps (at most
    ``limit``; samples recorded before lengths were kept are left out); read through the (run_id, step) index."""
    recent = list(
        s.scalars(select(Group.step).where(Group.run_id == run_id).distinct().order_by(Group.step.desc()).limit(steps))
    )
    if not recent:
        return []
    rows = s.execute(
        select(Sample.length, Sample.reward)
        .where(Sample.run_id == run_id, Sample.step >= min(recent), Sample.length.is_not(None))
        .limit(limit)
    )
    return [(int(n), float(r)) for n, r in rows]


def group_steps(s: Session, run_id: int) -> list[int]:
    """The steps that have recorded groups, ascending."""
    return list(s.scalars(select(Group.step).where(Group.run_id == run_id).distinct().order_by(Group.step)))


GROUP_ORDERS = {  # how list_groups may sort a step's groups
    "position": (Group.position,),  # sampling order
    "spread": (Group.reward_std.desc(), Group.position),  # most disagreeing rewards first
    "mean": (Group.reward_mean.desc(), Group.position),  # highest mean reward first
    "mean_asc": (Group.reward_mean, Group.position),  # lowest mean reward first
}


def list_groups(s: Session, run_id: int, step: int | None = None, order: str = "position") -> list[dict[str, Any]]:
    """The groups of one step (default: the latest step with groups), sorted by ``order`` (GROUP_ORDERS)."""
    if order not in GROUP_ORDERS:
        raise ValueError(f"order must be one of {', '.join(GROUP_ORDERS)}, got {order!r}")
    if step is None:
        step = s.scalar(select(func.max(Group.step)).where(Group.run_id == run_id))
        if step is None:
            return []
    rows = s.execute(
        select(Group.id, Group.step, Group.prompt, Group.reward_mean, Group.reward_std, Group.kind)
        .where(Group.run_id == run_id, Group.step == step)
        .order_by(*GROUP_ORDERS[order])
    )
    return [group_summary(r) for r in rows]


def sample_dict(sample: Sample) -> dict[str, Any]:
    """A samples row as the API returns it (``/get_group``) and exports it."""
    return {
        "sample_id": sample.id,
        "sample_position": sample.position,
        "completion": sample.completion,
        "tokens": sample.tokens,
        "reward": sample.reward,
        "step_rewards": sample.step_rewards,
        "step_end_indices": sample.step_end_indices,
        "step_labels": sample.step_labels,
        "step_shares": sample.step_shares,
        "advantages": unpack(sample.advantages, "d"),
        "reward_components": sample.reward_components,
        "length": sample.length,
        "correct": sample.correct,
        "answer_found": sample.answer_found,
        "answer": sample.answer,
        "answer_rule": sample.answer_rule,
        "truncated": sample.truncated,
        **{name: unpack(getattr(sample, name)) for name in TOKEN_ARRAYS},
        "clipped": unpack(sample.clipped, "B"),
    }


def group_summary(row) -> dict[str, Any]:
    """A groups row as ``list_groups`` shows it (a Group, or a row with those columns)."""
    return {
        "group_id": row.id,
        "step": row.step,
        "prompt": row.prompt,
        "reward_mean": row.reward_mean,
        "reward_std": row.reward_std,
        "kind": row.kind,
    }


def get_group(s: Session, group_id: int) -> dict[str, Any] | None:
    """A group with all its samples (tokens, per-token advantages, rewards)."""
    group = s.get(Group, group_id)
    if group is None:
        return None
    return {
        **group_summary(group),
        "run_id": group.run_id,
        "reference": group.reference,
        "model_prompt": group.model_prompt,
        "samples": [sample_dict(sample) for sample in group.samples],
    }


EXPORT_COLUMNS = (
    "run_id",
    "step",
    "group_id",
    "group_position",
    "prompt",
    "reference",
    "group_reward_mean",
    "group_reward_std",
    "sample_id",
    "sample_position",
    "completion",
    "reward",
    "reward_components",
    "tokens",
    "advantages",
    "step_rewards",
    "step_end_indices",
    "step_labels",
    "step_shares",
    "length",
    "correct",
    "answer_found",
    "answer",
    "answer_rule",
    "truncated",
    *TOKEN_ARRAYS,
    "clipped",
)  # an export's columns, in order


def iter_sample_rows(s: Session, run_id: int, chunk: int = 200):
    """Every recorded sample of a run, one flat dict each (its group's columns, then ``sample_dict``; the keys of
    EXPORT_COLUMNS), by step, group and sample position.

    Reads ``chunk`` groups at a time, so exporting a large run does not load it all at once.
    """
    last = (-1, -1)  # (step, position) of the last group read
    while True:
        groups = list(
            s.scalars(
                select(Group)
                .where(
                    Group.run_id == run_id,
                    (Group.step > last[0]) | ((Group.step == last[0]) & (Group.position > last[1])),
                )
                .order_by(Group.step, Group.position)
                .limit(chunk)
            )
        )
        if not groups:
            return
        for g in groups:
            for sample in g.samples:
                yield {
                    "run_id": run_id,
                    "step": g.step,
                    "group_id": g.id,
                    "group_position": g.position,
                    "prompt": g.prompt,
                    "reference": g.reference,
                    "group_reward_mean": g.reward_mean,
                    "group_reward_std": g.reward_std,
                    **sample_dict(sample),
                }
        last = (groups[-1].step, groups[-1].position)
        s.expunge_all()  # keep the session small
