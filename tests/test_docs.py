"""The README's tables say what the code defines: every run-spec key (``RunSpec``) with its type, default and
help, and every metric of the registry with its meaning, so the docs cannot drift from the one definition."""

from __future__ import annotations

import json

from grpo_engine.config import FIELDS
from grpo_engine.recorder import METRIC_REGISTRY
from tests.servers import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _rows(section: str) -> dict[str, list[str]]:
    """The table rows of a README section whose first cell is a `code` name -> their cells."""
    text = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").replace("\\|", "\0").split("|")]
            rows[cells[0].strip("`")] = [c.replace("\0", "|") for c in cells]
    return rows


def test_every_run_spec_key_is_in_the_readme_with_its_type_default_and_help():
    rows = _rows("The run spec")
    for f in FIELDS:
        assert f.name in rows, f"README has no row for run-spec key {f.name}"
        cells = rows[f.name]
        assert cells[1] == f.type.__name__, f.name
        assert cells[2] == f"`{json.dumps(f.default)}`", f.name
        assert cells[-1] == f.help, f.name


def test_every_metric_is_in_the_readme_with_its_meaning():
    rows = _rows("Metrics")
    for m in METRIC_REGISTRY:
        assert m.name in rows, f"README has no row for metric {m.name}"
        assert rows[m.name][-1] == m.meaning, m.name


def test_the_health_rules_are_in_the_readme_as_the_code_states_them():
    from app.health import rules_markdown

    assert rules_markdown() in (ROOT / "README.md").read_text(encoding="utf-8")
