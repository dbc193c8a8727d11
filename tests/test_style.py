"""The product's shape, read from the source (grpo_engine, app, workers, grpo_dashboard): no call passes more than
MAX_POSITIONAL arguments by position (past that, a function's settings are keyword-only and a dataclass of many
fields is built by name, so that two swapped arguments of the same type cannot pass silently), no function is longer
than MAX_FUNCTION_LINES and no module longer than MAX_MODULE_LINES."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.servers import ROOT

PRODUCT = ("grpo_engine", "app", "workers", "grpo_dashboard")
MAX_POSITIONAL = 5
MAX_FUNCTION_LINES = 80  # from its def line to its last line, docstring included
MAX_MODULE_LINES = 400
# SQLAlchemy's select(col1, col2, ...) takes its columns as varargs: they are a list, not arguments that could swap
VARARGS_CALLS = {"select"}


def product_files() -> dict[Path, str]:
    """Each product module's path (relative to the repository) -> its source."""
    return {
        p.relative_to(ROOT): p.read_text(encoding="utf-8")
        for top in PRODUCT
        for p in sorted((ROOT / top).rglob("*.py"))
    }


def test_no_call_passes_more_than_five_arguments_by_position():
    found = []
    for path, source in product_files().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func) not in VARARGS_CALLS:
                positional = [a for a in node.args if not isinstance(a, ast.Starred)]
                if len(positional) > MAX_POSITIONAL:
                    found.append(f"{path}:{node.lineno} {ast.unparse(node.func)} ({len(positional)} positional)")
    assert not found, "calls past MAX_POSITIONAL positional arguments:\n" + "\n".join(found)


def test_no_function_is_longer_than_80_lines():
    found = [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, source in product_files().items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not found, "functions past MAX_FUNCTION_LINES:\n" + "\n".join(found)


def test_no_module_is_longer_than_400_lines():
    found = [
        f"{path} ({len(source.splitlines())} lines)"
        for path, source in product_files().items()
        if len(source.splitlines()) > MAX_MODULE_LINES
    ]
    assert not found, "modules past MAX_MODULE_LINES:\n" + "\n".join(found)


def test_the_checks_read_the_product():
    files = product_files()
    assert Path("grpo_engine/algo/objective.py") in files and Path("app/web/ui.py") in files
