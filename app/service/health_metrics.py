"""Reading a run's metric rows for the health rules (app.service.health): the training rows, the recent and earlier
windows, a metric's mean over a window, a window's span, a Pearson r, and measured numbers as messages show them.

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
