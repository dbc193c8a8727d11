"""The docs say what the code defines, and hold together: docs/run-spec.md, docs/metrics.md and docs/settings.md are
what app.core.reference_docs renders from ``RunSpec``, the metric registry and app/core/settings.py (regenerate them with
``python -m app.core.reference_docs``); each key's and metric's row carries its definition; the health rules are in
docs/diagnosing.md as the code states them; the README stays a short front page whose links all resolve."""

from __future__ import annotations

import json
import re

import pytest

from app.core import reference_docs
from grpo_engine.report.recorder import METRIC_REGISTRY
from grpo_engine.spec.config import FIELDS
from tests.servers import ROOT

DOCS = ROOT / "docs"


def _rows(path) -> dict[str, list[str]]:
    """The table rows of a Markdown page whose first cell is a `code` name -> their cells."""
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").replace("\\|", "\0").split("|")]
            rows[cells[0].strip("`")] = [c.replace("\0", "|") for c in cells]
    return rows


@pytest.mark.parametrize("name", sorted(reference_docs.PAGES))
def test_each_generated_page_is_what_the_code_renders(name):
    on_disk = (DOCS / name).read_text(encoding="utf-8")
    assert on_disk == reference_docs.PAGES[name](), f"docs/{name} is stale: run python -m app.core.reference_docs"


def test_every_run_spec_key_has_its_row_with_type_default_and_help():
    rows = _rows(DOCS / "run-spec.md")
    assert len(rows) == len(FIELDS)
    for f in FIELDS:
        assert f.name in rows, f"docs/run-spec.md has no row for run-spec key {f.name}"
        cells = rows[f.name]
        assert cells[1] == f.type.__name__, f.name
        assert cells[2] == f"`{json.dumps(f.default)}`", f.name
        assert cells[-1] == f.help, f.name


def test_the_allowed_column_states_bounds_choices_and_notes():
    rows = _rows(DOCS / "run-spec.md")
    assert rows["temperature"][3] == "> 0, ≤ 10"
    assert rows["loss_type"][3] == "`grpo` | `bnpo` | `dapo` | `dr_grpo`"
    assert rows["model"][3] == "text, not empty"
    assert rows["max_resample"][3] == "0 to 64; only with `skip_zero_spread`"


def test_every_metric_has_its_row_with_its_meaning():
    rows = _rows(DOCS / "metrics.md")
    for m in METRIC_REGISTRY:
        assert m.name in rows, f"docs/metrics.md has no row for metric {m.name}"
        assert rows[m.name][-1] == m.meaning, m.name


def test_every_setting_the_code_reads_is_in_the_settings_page():
    read = set(re.findall(r'"(GRPO_[A-Z_]+)"', (ROOT / "app" / "core" / "settings.py").read_text(encoding="utf-8")))
    documented = set(_rows(DOCS / "settings.md"))
    assert read and read <= documented, f"undocumented settings: {sorted(read - documented)}"


def test_the_health_rules_are_in_the_diagnosing_page_as_the_code_states_them():
    from app.service.health import rules_markdown

    assert rules_markdown() in (DOCS / "diagnosing.md").read_text(encoding="utf-8")


def test_the_readme_is_a_short_front_page_with_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    assert ".venv/bin/grpo-dashboard\n" in readme  # the dashboard on the embedded default
    assert ".venv/bin/python -m pytest" in readme  # the tests


def test_every_relative_link_in_the_readme_and_the_docs_resolves():
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


# a module of the product named in ARCHITECTURE.md, as a path (app/web/ui.py) or dotted (app.service.api.launch_run)
MODULE_REF = re.compile(r"\b((?:app|grpo_engine|workers|grpo_dashboard|tests|bench)(?:[./][A-Za-z_][A-Za-z_0-9]*)+)")


def _resolves(ref: str) -> bool:
    """Whether ``ref`` names a module or folder that exists, followed by at most two names inside it (a function, a
    class's method): app.service.api.launch_run, app/web/static/runs.css, grpo_engine/spec/keys/."""
    parts = re.split(r"[./]", ref)
    if parts[-1] in ("py", "css", "md", "json", "png"):
        parts = parts[:-1]
    for k in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:k])
        if path.with_suffix(".py").is_file() or (k == len(parts) and path.exists()):
            return k >= len(parts) - 2
    return False


def test_every_module_architecture_md_names_exists():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    refs = {m.group(1).rstrip(".") for m in MODULE_REF.finditer(text)}
    assert len(refs) > 50  # the table and the prose are read
    assert [ref for ref in sorted(refs) if not _resolves(ref)] == []
