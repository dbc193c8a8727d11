"""The examples in the product's docstrings (``>>>``) run and give what they say: they are worked numbers the
docs rely on."""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests.support.servers import ROOT

MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for top in ("grpo_engine", "app", "workers", "grpo_dashboard")
    for p in (ROOT / top).rglob("*.py")
    if ">>>" in p.read_text(encoding="utf-8")
)


def test_some_modules_have_examples():
    assert "grpo_engine.spec.config" in MODULES and "app.web.guards.security" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
