"""Metric names come from one place, grpo_engine.report.metrics.METRIC_REGISTRY: every string in the web app, the
store, the workers and the CLI that reads as a metric under one of the registry's prefixes (``eval/``, ``groups/``,
``rm/``, ...) is a registered metric, a prefix the registry uses, or a member of a registered family
(``reward/<name>``). A misspelt prefixed metric in a chart, a health rule or a table fails here, not as an empty
panel. Bare names (``reward_mean``) cannot be told from other words by their shape and are not checked."""

from __future__ import annotations

import ast

from grpo_engine.report.metrics import METRIC_REGISTRY, family_prefix
from tests.support.servers import ROOT

NAMES = {m.name for m in METRIC_REGISTRY}
PREFIXES = {name.split("/")[0] + "/" for name in NAMES if "/" in name}
FAMILIES = {family_prefix(name) for name in NAMES} - {None}  # e.g. "reward/", "eval/pass@"
PACKAGES = ("app", "workers", "grpo_dashboard")


def _metric_shaped(value: str) -> bool:
    """Whether a string literal reads as a metric name: under a registry prefix, one word (no spaces or markup)."""
    return any(value.startswith(p) for p in PREFIXES) and value.replace("/", "").replace("_", "").isalnum()


def _strings(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_every_metric_named_outside_the_engine_is_registered():
    unknown = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, value in _strings(path):
                if not _metric_shaped(value):
                    continue
                if value in NAMES or value in PREFIXES or any(value.startswith(f) for f in FAMILIES):
                    continue
                if any(name.startswith(value) for name in NAMES):  # a prefix of registered names ("tokens/adv_")
                    continue
                unknown.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert not unknown, "metric names that the registry does not define:\n" + "\n".join(unknown)


def test_the_guard_sees_a_misspelt_metric():
    assert _metric_shaped("eval/acuracy") and "eval/acuracy" not in NAMES
    assert not _metric_shaped("eval/ accuracy") and not _metric_shaped("rewards")
