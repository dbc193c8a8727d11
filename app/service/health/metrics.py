"""Reading a run's metric rows for the health rules (app.service.health's modules): the training rows, the recent and earlier
windows, a metric's mean over a window, a window's span, the evaluations' values, a Pearson r, and measured numbers
as messages show them.

Rows are ``{"step", "iteration", <metric>: value}`` in step order (app.service.api.get_metrics); a metric may be missing or
None on any row. The training steps are the rows with step >= 1 (step 0 is the evaluation before training). The
recent window is the last RECENT_SHARE (20%) of them, rounded up and at least RECENT_MIN (5), the earlier window as
many rows just before it. Pure Python, standard library only.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

Row = Mapping[str, Any]

RECENT_SHARE = 0.2  # the recent window: this share of the training steps (rounded up) ...
RECENT_MIN = 5  # ... and at least this many
# windows
MIN_STEPS = 10  # training steps recorded before a rule that compares windows may fire
MIN_STEPS_RECENT = 5  # ... before a rule that reads the recent window alone may fire


def number(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing, not a number or not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def training_rows(metrics: Iterable[Row]) -> list[Row]:
    """The rows of training steps (step >= 1), in the order given."""
    return [r for r in metrics if isinstance(r.get("step"), int) and r["step"] >= 1]


def window_size(n_steps: int) -> int:
    """Rows in the recent (and the earlier) window of a run with ``n_steps`` training steps.

    >>> window_size(10), window_size(40), window_size(101)
    (5, 8, 21)
    """
    return max(RECENT_MIN, math.ceil(RECENT_SHARE * n_steps))


def windows(rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """(earlier, recent): the last window_size rows, and as many rows before them (fewer when there are not)."""
    n = window_size(len(rows))
    recent = list(rows[-n:])
    earlier = list(rows[max(0, len(rows) - 2 * n) : max(0, len(rows) - n)])
    return earlier, recent


def mean_of(rows: Iterable[Row], name: str) -> float | None:
    """Mean of metric ``name`` over the rows that hold it; None when none does."""
    values = [v for v in (number(r.get(name)) for r in rows) if v is not None]
    return sum(values) / len(values) if values else None


def span(rows: Sequence[Row]) -> list[int]:
    """[first step, last step] of ``rows``."""
    return [rows[0]["step"], rows[-1]["step"]]


def eval_points(metrics: Iterable[Row], name: str = "eval/accuracy") -> list[tuple[int, float]]:
    """(step, value) of every row holding metric ``name`` (an evaluation's, step 0's included), in the order given.

    >>> eval_points([{"step": 0, "eval/accuracy": 0.25}, {"step": 1}, {"step": 5, "eval/accuracy": 0.3}])
    [(0, 0.25), (5, 0.3)]
    """
    return [
        (r["step"], v) for r in metrics if isinstance(r.get("step"), int) and (v := number(r.get(name))) is not None
    ]


def evaluations_between(metrics: Sequence[Row], first: int, last: int) -> list[tuple[int, float]]:
    """(step, eval/accuracy) of the evaluations from the last one at or before step ``first`` to step ``last``.

    >>> evaluations_between([{"step": s, "eval/accuracy": s / 10} for s in (0, 5, 10, 15)], 7, 10)
    [(5, 0.5), (10, 1.0)]
    """
    points = eval_points(metrics)
    start = max((i for i, (s, _) in enumerate(points) if s <= first), default=0)
    return [(s, v) for s, v in points[start:] if s <= last]


def latest_evaluation(metrics: Sequence[Row], names: Sequence[str]) -> tuple[int, list[float]] | None:
    """(step, [each of ``names``]) of the last row holding all of them; None when none does (a run recorded
    before evaluation measured them, or with eval_every 0)."""
    for row in reversed(metrics):
        values = [number(row.get(k)) for k in names]
        if isinstance(row.get("step"), int) and all(v is not None for v in values):
            return row["step"], values
    return None


def first_and_last(rows: Sequence[Row], name: str, n: int) -> tuple[float, float] | None:
    """(mean over the first ``n`` rows, mean over the last ``n``) of metric ``name``; None when n < 1 or either
    holds none.

    >>> first_and_last([{"x": 0.1}, {"x": 0.2}, {"x": 0.5}, {"x": 0.7}], "x", 2)
    (0.15000000000000002, 0.6)
    """
    before, after = (mean_of(rows[:n], name), mean_of(rows[-n:], name)) if n >= 1 else (None, None)
    return None if before is None or after is None else (before, after)


def rises_between(
    metrics: Sequence[Row], evaluated: Sequence[str], trained: Sequence[str], *, first: int, last: int, level: float
) -> list[tuple[str, float, float]]:
    """(metric, before, after) of each metric that rose by >= ``level`` from step ``first`` to step ``last``: each
    of ``evaluated`` from its value at ``first`` to its value at ``last``, each of ``trained`` from its mean over
    the first to its mean over the last window of the training steps after ``first`` up to ``last`` (windows of
    the run's window_size, at most half of those steps each).

    >>> rows = [{"step": s, "eval/format": s / 20, "x": s / 8} for s in range(11)]
    >>> rises_between(rows, ["eval/format"], ["x"], first=0, last=10, level=0.1)  # x: steps 1-5 against steps 6-10
    [('eval/format', 0.0, 0.5), ('x', 0.375, 1.0)]
    """
    found = []
    for name in evaluated:
        values = dict(eval_points(metrics, name))
        found += [(name, values[first], values[last])] if first in values and last in values else []
    rows = [r for r in training_rows(metrics) if first < r["step"] <= last]
    n = min(window_size(len(training_rows(metrics))), len(rows) // 2)
    for name in trained:
        found += [(name, *means) for means in [first_and_last(rows, name, n)] if means]
    return [(m, a, b) for m, a, b in found if round(b - a, 9) >= level]


def pearson(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Pearson correlation of the pairs; None for fewer than 2 or when either side has no spread.

    >>> pearson([(1, 2), (2, 4), (3, 6)]), pearson([(1, 5), (2, 5)])
    (1.0, None)
    """
    n = len(pairs)
    if n < 2:
        return None
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    if sxx <= 1e-12 or syy <= 1e-12:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    return round(sxy / math.sqrt(sxx * syy), 12)


def fmt(x: float) -> str:
    """A measured number as messages show it: 2 decimals, 3 significant digits below 0.1."""
    return f"{x:.2f}" if abs(x) >= 0.1 or x == 0 else f"{x:.3g}"


def recent_at_least(metrics: Sequence[Row], name: str, level: float) -> tuple[list[Row], float] | None:
    """(the recent window, ``name``'s mean over it) when that mean is >= ``level`` after >= MIN_STEPS_RECENT
    training steps; None otherwise (too few steps, the metric not recorded, or below ``level``)."""
    rows = training_rows(metrics)
    if len(rows) < MIN_STEPS_RECENT:
        return None
    recent = windows(rows)[1]
    now = mean_of(recent, name)
    return None if now is None or now < level else (recent, now)
