"""How the dashboard's tabs show a refused service call: one helper (app.web.tabs.shared.attempt and error_html)
masks the secrets in the refusal's message and escapes it, and no tab keeps its own copy of that handling.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.service import api
from app.web.tabs import shared
from app.web.tabs.launch import _launch, form_values
from app.web.tabs.shared import attempt, error_html
from app.web.views.launch_form import SECTIONS, section_of
from grpo_engine.spec.config import FIELDS

TABS = Path(shared.__file__).parent


def _refuse(message: str):
    raise api.ApiError(message)


def test_no_tab_but_shared_handles_a_refusal_itself():
    """Every tab goes through app.web.tabs.shared for a refusal: no other module of app/web/tabs names ApiError, so
    none catches it with its own (unmasked) copy of the handling."""
    modules = sorted(path for path in TABS.glob("*.py") if path.name != "shared.py")
    assert modules, TABS
    handling = [path.name for path in modules if "ApiError" in path.read_text(encoding="utf-8")]
    assert handling == []


def test_a_refusal_becomes_a_masked_error_and_escaped_html():
    """A refusal's message loses the password of a URL in it, and its HTML shows the message as text, with the
    CSS class and prefix asked for."""
    got = attempt(_refuse, "postgresql://user:secret@host/db is down")
    assert not got.ok and got.value is None
    assert "secret" not in got.error and "postgresql://user:**@host/db is down" == got.error
    page = error_html(got.error, "run-error", prefix="Not stored: ")
    assert page == '<div class="run-error">Not stored: postgresql://user:**@host/db is down</div>'
    marked = error_html(attempt(_refuse, "name: <b>bold</b> & more").error, data={"key": "name"})
    assert marked == '<div class="error" data-key="name">name: &lt;b&gt;bold&lt;/b&gt; &amp; more</div>'


def test_a_call_that_returns_gives_its_value_and_no_error():
    """A call that is not refused gives its return value (keywords passed on) and no error."""
    got = attempt(lambda a, b=0: a + b, 2, b=3)
    assert got.ok and got.value == 5 and got.error is None


@pytest.mark.parametrize("error", [ValueError("a bug, not a refusal"), RuntimeError("the store is gone")])
def test_an_error_other_than_a_refusal_propagates(error):
    """Only a refusal (api.ApiError) is caught: any other exception, ApiError's base class ValueError included,
    reaches the caller (the UI's generic error), never a tab's message line."""

    def fail():
        raise error

    with pytest.raises(type(error)) as raised:
        attempt(fail)
    assert raised.value is error


def test_a_refused_launch_marks_the_field_it_names_and_opens_its_section():
    """The Launch tab reads the key from the refusal's (masked) message: the message says "Not launched: ...", the
    field named is marked invalid and no other (the page then opens the fold around it: tests/browser/test_browser_launch.py)."""
    values = form_values([field.default for field in FIELDS])
    names = [field.name for field in FIELDS]
    key = next(name for name in ("clip_eps", "kl_coef") if name not in SECTIONS[section_of(name)].essential)
    values[names.index(key)] = -1.0
    out = _launch(*values)
    assert out[0].startswith(f'<div class="error" data-key="{key}">Not launched: {key}: ')
    marks = out[5:]
    assert [name for name, mark in zip(names, marks, strict=True) if mark.get("elem_classes")] == [key]


def test_a_step_sent_before_the_page_saw_the_sliders_new_bounds_is_clamped_not_refused():
    """The Groups tab's step slider: its bounds follow the run's recorded steps; a step the page sent under the old
    bounds (a timer tick racing a deleted or newly picked run) is clamped into the new ones, not refused."""
    from app.web.tabs.components import StepSlider

    slider = StepSlider(0, 1, value=0, step=1)
    assert slider.get_block_name() == "slider"  # drawn by Gradio's own slider
    assert slider.preprocess(12) == 1
    assert slider.preprocess(-3) == 0
    assert slider.preprocess(1) == 1
