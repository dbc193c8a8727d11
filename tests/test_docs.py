"""The docs say what the code defines, and hold together: docs/run-spec.md, docs/metrics.md and docs/settings.md are
what app.core.reference_docs renders from ``RunSpec``, the metric registry and app/core/settings.py (regenerate them with
``python -m app.core.reference_docs``); each key's and metric's row carries its definition; the health rules are in
docs/diagnosing.md as the code states them; the README stays a short front page whose links all resolve."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.core import reference_docs
from grpo_engine.report.metrics import METRIC_REGISTRY
from grpo_engine.spec.config import FIELDS
from tests.support.servers import ROOT
from tests.test_layers import APP_FOLDERS, ENGINE_ROOMS, PACKAGES, WEB_FOLDERS

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


# a module of the product named in a page, as a path (app/web/ui.py) or dotted (app.service.api.launch_run)
MODULE_REF = re.compile(r"\b((?:app|grpo_engine|workers|grpo_dashboard|tests|bench)(?:[./][A-Za-z_][A-Za-z_0-9]*)+)")


NOT_MODULES = {
    "grpo_dashboard.rewards"
}  # the entry-point group custom rewards are declared in (docs/data-and-rewards.md)


def _resolves(ref: str) -> bool:
    """Whether ``ref`` names a file, a module or a folder that exists, followed by at most two names inside it (a
    function, a class's method): app.service.api.launch_run, app/web/static/runs.css, grpo_engine/spec/keys/."""
    if ref in NOT_MODULES or (ROOT / ref).exists():
        return True
    parts = re.split(r"[./]", ref)
    if parts[-1] in ("py", "css", "md", "json", "png"):
        parts = parts[:-1]
    for k in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:k])
        if path.with_suffix(".py").is_file() or (k == len(parts) and path.exists()):
            return k >= len(parts) - 2
    return False


@pytest.mark.parametrize(
    "page", ["ARCHITECTURE.md", "README.md", "bench/README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]
)
def test_every_module_path_a_page_names_exists(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    refs = {m.group(1).rstrip(".") for m in MODULE_REF.finditer(text)}
    if page == "ARCHITECTURE.md":
        assert len(refs) > 50  # the tables and the prose are read
    assert [ref for ref in sorted(refs) if not _resolves(ref)] == []


def folder_order(folder: str) -> tuple:
    """Where a folder's table sits in ARCHITECTURE.md's Rooms: the layers' order (tests/test_layers.py), lowest
    first, a folder before its sub-folders."""
    parts = folder.split("/")
    key = [PACKAGES.index(parts[0])]
    if parts[0] == "grpo_engine":
        key.append(ENGINE_ROOMS.index(parts[1]))
    if parts[0] == "app":
        key.append(APP_FOLDERS.index(f"app.{parts[1]}"))
    if parts[:2] == ["app", "web"]:
        inner = f"app.web.{parts[2]}" if len(parts) > 2 else "app.web"
        key.append(WEB_FOLDERS.index(inner if inner in WEB_FOLDERS else "app.web"))
    return (*key, len(parts))


def architecture_rooms() -> list[tuple[str, list[str]]]:
    """ARCHITECTURE.md's Rooms: (folder, the names its table's rows cite in their first column), in the page's order."""
    section = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").split("\n## Rooms\n")[1].split("\n## ")[0]
    tables = []
    for block in section.split("\n### ")[1:]:
        heading, _, body = block.partition("\n")
        rows = [line.split("|")[1] for line in body.splitlines() if line.startswith("| `")]
        tables.append((heading.strip("`/ "), [name for row in rows for name in re.findall(r"`([^`]+)`", row)]))
    return tables


def test_architecture_md_has_a_table_per_folder_in_the_layers_order_naming_every_module():
    tables = architecture_rooms()
    folders = [folder for folder, _ in tables]
    assert len(folders) > 15 and folders == sorted(folders, key=folder_order) and len(set(folders)) == len(folders)
    misplaced, cited = [], set()
    for folder, names in tables:
        for name in names:
            # a bare name is a module of its table's folder
            path = name if "/" in name.rstrip("/") or name.rstrip("/") == folder else f"{folder}/{name}"
            if not path.startswith(f"{folder}/") and path.rstrip("/") != folder:
                misplaced.append(f"{name} under {folder}/")
            cited.add(path)
    assert misplaced == []
    modules = sorted(
        str(p.relative_to(ROOT)) for top in PACKAGES for p in (ROOT / top).rglob("*.py") if p.name != "__init__.py"
    )

    def named(module: str) -> bool:
        return any(
            module == c or (c.endswith("/") and module.startswith(c)) or ("*" in c and Path(module).match(c))
            for c in cited
        )

    assert [m for m in modules if not named(m)] == []
