"""The Launch form's model field and its upload: a dropdown offering the built-in model, the models folder's models
and the Hugging Face cache's model ids (app.service.datasets.list_models), which takes any typed value too (a hub id
or a path); its choices are read again when the Launch tab opens and after an upload. Beside it, an upload of a
.gguf file or a zipped model directory into the models folder, which then selects it."""

from __future__ import annotations

import html

import gradio as gr

from app.service import datasets
from app.web.tabs.shared import PRIVATE, Shared, attempt, error_html
from app.web.views.launch_form import label
from grpo_engine.spec.config import BUILTIN_MODEL
from grpo_engine.spec.run_spec import FIELD_BY_NAME

UPLOAD_TYPES = [".gguf", ".zip"]


def size_text(n: int) -> str:
    """A model's size as the field says it.

    >>> size_text(98_000_000), size_text(1_540_000_000), size_text(2_100)
    ('98 MB', '1.5 GB', '2 kB')
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale and unit == "GB" else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def model_choices(listing: dict | None) -> list[tuple[str, str]]:
    """The field's choices as (what the list shows, the run spec's value): the built-in model, then the models
    folder's models (their path), the trained policies of completed runs (run:<id>) and the checkpoints runs keep
    (run:<id>@<step>), then the Hugging Face cache's ids.

    >>> m = {"name": "m.gguf", "model": "/d/models/m.gguf", "kind": "gguf", "size": 98_000_000}
    >>> runs = [{"model": "run:7", "name": "smollm2-word-problems"}, {"model": "run:9@30", "name": "b", "step": 30}]
    >>> model_choices({"local": [m], "runs": runs, "hub": ["Qwen/Qwen2.5-0.5B-Instruct"]})
    ... # doctest: +NORMALIZE_WHITESPACE
    [('builtin-arith · the built-in tiny model', 'builtin-arith'),
     ('models/m.gguf · .gguf, 98 MB', '/d/models/m.gguf'),
     ('run:7 · smollm2-word-problems, its trained policy', 'run:7'),
     ('run:9@30 · b, its checkpoint of step 30', 'run:9@30'),
     ('Qwen/Qwen2.5-0.5B-Instruct · in the Hugging Face cache', 'Qwen/Qwen2.5-0.5B-Instruct')]
    """
    choices = [(f"{BUILTIN_MODEL} · the built-in tiny model", BUILTIN_MODEL)]
    for entry in (listing or {}).get("local", []):
        kind = ".gguf" if entry["kind"] == "gguf" else "model directory"
        choices.append((f"models/{entry['name']} · {kind}, {size_text(entry['size'])}", entry["model"]))
    choices += [
        (
            f"{r['model']} · {r['name']}, "
            + (f"its checkpoint of step {r['step']}" if "step" in r else "its trained policy"),
            r["model"],
        )
        for r in (listing or {}).get("runs", [])
    ]
    choices += [(f"{repo_id} · in the Hugging Face cache", repo_id) for repo_id in (listing or {}).get("hub", [])]
    return choices


def current_choices() -> list[tuple[str, str]]:
    """The field's choices now (the built-in model alone where the listing fails)."""
    got = attempt(datasets.list_models)
    return model_choices(got.value if got.ok else None)


def build_model_field() -> tuple[gr.Dropdown, gr.File]:
    """The model dropdown and the model upload, side by side in the caller's row: (the dropdown, the upload)."""
    field = FIELD_BY_NAME["model"]
    box = gr.Dropdown(
        choices=current_choices(),
        value=field.default,
        allow_custom_value=True,  # a hub id or a path typed in
        filterable=True,
        label=label("model"),
        info=field.help,
        elem_id="spec-model",
        scale=2,
    )
    upload = gr.File(
        label="Upload a model (.gguf or .zip)",
        file_types=UPLOAD_TYPES,
        elem_id="model-upload",
        height=90,
        scale=1,
    )
    return box, upload


def wire_model_field(shared: Shared, tab: gr.Tab, box: gr.Dropdown, upload: gr.File, info: gr.HTML) -> None:
    """The field's listeners: its choices read again when the tab opens and the page loads; an upload stored and
    selected."""
    for event in (tab.select, shared.demo.load):
        event(lambda: gr.Dropdown(choices=current_choices()), None, box, **PRIVATE)
    upload.upload(_upload_model, upload, [box, info, upload], **PRIVATE)


def _upload_model(path):
    """Store an uploaded model in the models folder: the field offers it and selects it; the message says where it
    went, or why it was refused (nothing stored). The upload box is emptied for the next one."""
    if not path:
        return gr.skip(), "", gr.skip()
    got = attempt(datasets.upload_model, path, remove_source=True)
    if not got.ok:
        return gr.skip(), error_html(got.error, prefix="Not stored: "), None
    stored = got.value
    what = ".gguf file" if stored["kind"] == "gguf" else "model directory"
    note = (
        " Its first run (or “Show the model's prompt”) converts it once into a model directory, about a minute."
        if stored["kind"] == "gguf"
        else ""
    )
    message = (
        f'<div class="ok">Stored the {what} <code>models/{html.escape(stored["name"])}</code> '
        f"({size_text(stored['size'])}): 'model' names it.{note}</div>"
    )
    return gr.Dropdown(choices=current_choices(), value=stored["model"]), message, None
