"""The Launch tab: the run spec as a form in four sections (app.web.views.launch_form: model & data, algorithm, reward,
runtime & saving), each showing its essential keys and folding the rest under "More options"; keys that do not
apply to the chosen options are hidden. A bar at the top holds the presets and the Launch button; a refused launch
marks the field it names and opens its section. The model field offers the models folder's models and the Hugging
Face cache's, with a model upload beside it (app.web.tabs.model_field). The dataset upload and the dataset's first rows sit next to the
'dataset' field; "Show the model's prompt" shows its first training question as the model reads it; "Test rewards" scores the dataset's first rows with the form's named rewards. Launch opens the Run
tab on the new run."""

import html
import json
from dataclasses import dataclass

import gradio as gr

from app.service import api, datasets, previews
from app.web.tabs.model_field import build_model_field, wire_model_field
from app.web.tabs.shared import PRIVATE, REFRESH_SECONDS, Shared, attempt, error_html, fold
from app.web.views.launch_form import (
    APPLIES,
    DECIDING,
    SECTIONS,
    applicable,
    applies,
    label,
    preset_values,
)
from app.web.views.run import upload_preview_html
from app.web.views.runs import run_choices
from grpo_engine.spec.presets import PRESETS
from grpo_engine.spec.run_spec import FIELD_BY_NAME, FIELDS

# after a refused launch: bring the field it marked into view (its section was opened)
SHOW_INVALID = (  # after a refusal: the marked field's fold opened (if it is folded) and the field scrolled to
    "() => { const field = document.querySelector('#tab-launch .invalid'); if (!field) return;"
    " window.grpoOpenFold?.(field); setTimeout(() => field.scrollIntoView({block: 'center', behavior: 'smooth'}), 50); }"
)


@dataclass(frozen=True)
class LaunchForm:
    """What the Run tab's "Launch again" fills in: the form's inputs (in FIELDS order) and the result line."""

    inputs: list
    result: gr.HTML


def build_launch_tab(shared: Shared) -> LaunchForm:
    """The tab and its listeners: presets, launch, upload a dataset, preview the dataset named (also on opening),
    and hiding what does not apply."""
    inputs, folds = {}, []
    with gr.Tab("Launch", id="launch", elem_id="tab-launch") as launch_tab:
        with gr.Column(elem_id="launch-top"):  # stays in view: the bar, and what the last launch said
            with gr.Row(elem_id="launch-bar", equal_height=True):
                preset = gr.Dropdown(
                    list(PRESETS),
                    value=next(iter(PRESETS)),  # the defaults: the built-in demo
                    label="Start from a preset",
                    elem_id="launch-preset",
                    scale=3,
                )
                launch_button = gr.Button("Launch", variant="primary", elem_id="launch-button", scale=1, min_width=160)
            launch_result = gr.HTML(elem_id="launch-result")
        for section in SECTIONS:
            with gr.Column(elem_classes=["launch-section"]):
                gr.Markdown(f"#### {section.title}")
                if section.title == "Model & data":
                    upload_info, dataset_upload, show_prompt, prompt_shown, model_parts = _model_and_data(inputs)
                else:
                    _rows(section.essential, inputs)
                if section.title == "Reward":  # shown with the rewards key (not for a learned reward model)
                    with gr.Column(elem_id="test-rewards-box") as test_box:
                        test_rewards = gr.Button("Test rewards", elem_id="test-rewards", scale=0, min_width=160)
                        rewards_preview = gr.HTML(elem_id="rewards-preview")
                with fold("More options", elem_classes=("launch-more",)) as more:  # drawn with the tab
                    _rows(section.more, inputs)
                folds.append(more)
    form = [inputs[f.name] for f in FIELDS]

    launch_outputs = [
        launch_result,
        shared.tabs,
        shared.run_select,
        shared.groups_run_select,
        shared.timer,
        *form,
    ]
    launch_button.click(
        _launch,
        form,
        launch_outputs,
        concurrency_id="runs-refresh",  # in line with the ticks
        **PRIVATE,
    ).then(None, js=SHOW_INVALID)
    picked = preset.input(lambda name: form_values(preset_values(name)), preset, form, **PRIVATE)
    test_rewards.click(_test_rewards, form, rewards_preview, **PRIVATE)
    show_prompt.click(_show_prompt, form, prompt_shown, **PRIVATE)
    dependent = [inputs[k] for k in APPLIES] + [test_box] + folds
    deciding = [inputs[k] for k in DECIDING]
    for box in deciding:  # a preset or "Launch again" changes them too: .change, not .input
        box.change(_visibility, deciding, dependent, **PRIVATE)
    shared.demo.load(_visibility, deciding, dependent, **PRIVATE)
    wire_model_field(shared, launch_tab, inputs["model"], *model_parts)
    dataset_box = inputs["dataset"]
    dataset_upload.upload(_upload, dataset_upload, [dataset_box, upload_info], **PRIVATE)
    field_boxes = [inputs[k] for k in ("question_field", "answer_field", "solution_field")]
    for event in (dataset_box.blur, dataset_box.submit, *(box.blur for box in field_boxes)):  # typed in: the first rows
        event(_preview, [dataset_box, *field_boxes], upload_info, **PRIVATE)
    shared.demo.load(_preview, [dataset_box, *field_boxes], upload_info, **PRIVATE)  # the default dataset's rows
    picked.then(_preview, [dataset_box, *field_boxes], upload_info, **PRIVATE)  # the preset's dataset's rows
    return LaunchForm(form, launch_result)


def _model_and_data(inputs: dict):
    """The first section's essentials: name and model beside the model upload (app.web.tabs.model_field), then the
    dataset beside its upload, its first rows below, then the prompt keys and "Show the model's prompt". Returns
    (the dataset preview HTML, the upload component, the prompt button, the prompt's HTML, and the model upload
    and its message)."""
    with gr.Row(equal_height=True):
        inputs["name"] = _field_input(FIELD_BY_NAME["name"])
        inputs["model"], model_upload = build_model_field()
    model_info = gr.HTML(elem_id="model-upload-info")
    with gr.Row(equal_height=True):
        with gr.Column(scale=2):
            inputs["dataset"] = _field_input(FIELD_BY_NAME["dataset"])
        dataset_upload = gr.File(
            label="Upload a dataset (.jsonl, .csv, .parquet): fills in 'dataset'",
            file_types=[".jsonl", ".csv", ".parquet"],
            elem_id="dataset-upload",
            height=90,
            scale=1,
        )
    upload_info = gr.HTML(elem_id="dataset-upload-info")
    with gr.Row():
        for key in ("prompt_template", "system_prompt", "question_template"):
            inputs[key] = _field_input(FIELD_BY_NAME[key])
    show_prompt = gr.Button("Show the model's prompt", elem_id="show-prompt", scale=0, min_width=200)
    prompt_shown = gr.HTML(elem_id="prompt-preview")
    return upload_info, dataset_upload, show_prompt, prompt_shown, (model_upload, model_info)


def _rows(keys: tuple[str, ...], inputs: dict, per_row: int = 3) -> None:
    """The inputs of ``keys``, ``per_row`` to a row, into ``inputs``."""
    for start in range(0, len(keys), per_row):
        with gr.Row():
            for key in keys[start : start + per_row]:
                inputs[key] = _field_input(FIELD_BY_NAME[key])


def _visibility(*deciding):
    """Each key that applies only under some options: shown when it applies to the form's current values; then the
    "Test rewards" box, shown with the rewards key; then each section's "More options", shown when a key under it
    applies (never a fold that opens onto nothing)."""
    values = dict(zip(DECIDING, deciding, strict=True))
    return (
        [gr.update(visible=applies(key, values)) for key in APPLIES]
        + [gr.update(visible=applies("rewards", values))]
        + [gr.update(visible=any(applies(key, values) for key in section.more)) for section in SECTIONS]
    )


LIST_EXAMPLE = '[{"name": "accuracy", "weight": 1.0}, {"name": "length", "weight": 0.5}]'  # rewards
LIST_EXAMPLES = {"report_to": "tensorboard, mlflow"}  # the other list keys' placeholders


def form_values(values: list) -> list:
    """Run-spec values (in FIELDS order) as the form's inputs hold them: a list as its JSON text."""
    return [
        json.dumps(list(v)) if f.type is list and not isinstance(v, str) else v
        for f, v in zip(FIELDS, values, strict=True)
    ]


def _field_input(field):
    """The form input of one run-spec field: radio for choices, a checkbox for booleans, text for strings and (as
    JSON) lists, else a number."""
    if field.choices:
        return gr.Radio(
            list(field.choices),
            value=field.default,
            label=label(field.name),
            info=field.help,
            elem_id=f"spec-{field.name}",
        )
    if field.type is bool:
        return gr.Checkbox(value=field.default, label=label(field.name), info=field.help, elem_id=f"spec-{field.name}")
    if field.type is list:
        return gr.Textbox(
            value=json.dumps(list(field.default)),
            label=label(field.name),
            info=field.help,
            lines=1 if field.name in LIST_EXAMPLES else 2,
            placeholder=LIST_EXAMPLES.get(field.name, LIST_EXAMPLE),
            elem_id=f"spec-{field.name}",
        )
    if field.type is str:
        return gr.Textbox(value=field.default, label=label(field.name), info=field.help, elem_id=f"spec-{field.name}")
    # no min/max/precision on the component: validate_spec is the one judge and names the key
    return gr.Number(value=field.default, label=label(field.name), info=field.help, elem_id=f"spec-{field.name}")


def _launch(*values):
    """Launch the form's run spec; on success open the Run tab on it (both run pickers), else say why not, mark
    the field the refusal names and open its section."""
    spec = applicable({field.name: value for field, value in zip(FIELDS, values, strict=True)})
    got = attempt(api.launch_run, spec)
    if not got.ok:
        key = got.key if got.key in FIELD_BY_NAME else None
        marks = [gr.update(elem_classes=["invalid"] if f.name == key else []) for f in FIELDS]
        return (
            error_html(got.error, prefix="Not launched: ", data={"key": key or ""}),
            gr.skip(),
            gr.skip(),
            gr.skip(),
            gr.skip(),
            *marks,
        )
    result = got.value
    runs = api.list_runs()
    run_id = result["run_id"]
    choices = run_choices(runs)
    return (
        f'<div class="ok">Launched run {run_id} ({result["status"]}).</div>',
        gr.Tabs(selected="run"),
        gr.Dropdown(choices=choices, value=run_id),
        gr.Dropdown(choices=choices, value=run_id),
        gr.Timer(REFRESH_SECONDS),  # the run is queued: the page follows it at the running pace at once
        *[gr.update(elem_classes=[]) for _ in FIELDS],
    )


def _test_rewards(*values):
    """The form's named rewards on the dataset's first rows (app.service.previews), as a table, or why not."""
    spec = applicable({field.name: value for field, value in zip(FIELDS, values, strict=True)})
    got = attempt(previews.preview_rewards, spec)
    return previews.preview_html(got.value) if got.ok else error_html(got.error)


def _show_prompt(*values):
    """The dataset's first training question as the form's model reads it (app.service.previews), or why not; a
    .gguf model's first conversion is announced while it runs."""
    spec = applicable({field.name: value for field, value in zip(FIELDS, values, strict=True)})
    notice = previews.conversion_notice(spec)
    if notice:
        yield f'<div class="hint converting">{html.escape(notice)}</div>'
    got = attempt(previews.preview_prompt, spec)
    yield previews.prompt_html(got.value) if got.ok else error_html(got.error)


def _upload(path):
    """Store an uploaded dataset: its stored path goes into 'dataset', its first rows below the upload."""
    if not path:
        return gr.skip(), ""
    got = attempt(datasets.upload_dataset, path, remove_source=True)
    if not got.ok:
        return gr.skip(), error_html(got.error, prefix="Not stored: ")
    return got.value["dataset"], upload_preview_html(got.value)


def _preview(dataset, *fields):
    """The first rows of the dataset the form names, read through its question/answer/solution fields; for a Hugging
    Face dataset or a dataset directory, which only the worker reads, a line saying so."""
    if isinstance(dataset, str) and dataset.strip() and datasets.read_by_the_worker(dataset.strip()):
        name = html.escape(dataset.strip())
        return f'<div class="hint">{name}: read by the worker when the run starts (not previewed here).</div>'
    got = attempt(datasets.preview_dataset, dataset, *fields)
    return upload_preview_html(got.value, uploaded=False) if got.ok else error_html(got.error)
