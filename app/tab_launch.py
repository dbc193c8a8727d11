"""The Launch tab: one input per run-spec field (grpo_engine.config.FIELDS) with its default and its help, a
dataset upload that fills in 'dataset', the first rows of the dataset named, and the Launch button, which
opens the Run tab on the new run."""
import html
from dataclasses import dataclass

import gradio as gr

from app import api, datasets
from app.render import run_choices, upload_preview_html
from app.tab_shared import PRIVATE, Shared
from grpo_engine.config import FIELDS


@dataclass(frozen=True)
class LaunchForm:
    """What the Run tab's "Launch again" fills in: the form's inputs (in FIELDS order) and the result line."""

    inputs: list
    result: gr.HTML


def build_launch_tab(shared: Shared) -> LaunchForm:
    """The tab and its listeners: launch, upload a dataset, preview the dataset named (also on opening)."""
    with gr.Tab("Launch", id="launch", elem_id="tab-launch"):
        form = []
        for start in range(0, len(FIELDS), 3):
            with gr.Row():
                for field in FIELDS[start:start + 3]:
                    form.append(_field_input(field))
        form_input = dict(zip((f.name for f in FIELDS), form))  # run-spec key -> its input
        with gr.Row():
            dataset_upload = gr.File(label="Upload a dataset (.jsonl, .csv, .parquet): fills in 'dataset'",
                                     file_types=[".jsonl", ".csv", ".parquet"], elem_id="dataset-upload",
                                     height=90, scale=1)
            upload_info = gr.HTML(elem_id="dataset-upload-info")
        launch_button = gr.Button("Launch", variant="primary", elem_id="launch-button")
        launch_result = gr.HTML(elem_id="launch-result")

    launch_button.click(_launch, form, [launch_result, shared.tabs, shared.run_select, shared.groups_run_select],
                        **PRIVATE)
    dataset_box = form_input["dataset"]
    dataset_upload.upload(_upload, dataset_upload, [dataset_box, upload_info], **PRIVATE)
    field_boxes = [form_input[k] for k in ("question_field", "answer_field", "solution_field")]
    for event in (dataset_box.blur, dataset_box.submit, *(box.blur for box in field_boxes)):  # typed in: the first rows
        event(_preview, [dataset_box, *field_boxes], upload_info, **PRIVATE)
    shared.demo.load(_preview, [dataset_box, *field_boxes], upload_info, **PRIVATE)  # the default dataset's rows
    return LaunchForm(form, launch_result)


def _field_input(field):
    """The form input of one run-spec field: radio for choices, a checkbox for booleans, text for strings, else a
    number."""
    if field.choices:
        return gr.Radio(list(field.choices), value=field.default, label=field.name, info=field.help,
                        elem_id=f"spec-{field.name}")
    if field.type is bool:
        return gr.Checkbox(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")
    if field.type is str:
        return gr.Textbox(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")
    # no min/max/precision on the component: validate_spec is the one judge and names the key
    return gr.Number(value=field.default, label=field.name, info=field.help, elem_id=f"spec-{field.name}")


def _launch(*values):
    """Launch the form's run spec; on success open the Run tab on it (both run pickers), else say why not."""
    spec = {field.name: value for field, value in zip(FIELDS, values)}
    try:
        result = api.launch_run(spec)
    except api.ApiError as e:
        return f'<div class="error">Not launched: {html.escape(str(e))}</div>', gr.skip(), gr.skip(), gr.skip()
    runs = api.list_runs()
    run_id = result["run_id"]
    choices = run_choices(runs)
    return (f'<div class="ok">Launched run {run_id} ({result["status"]}).</div>',
            gr.Tabs(selected="run"),
            gr.Dropdown(choices=choices, value=run_id),
            gr.Dropdown(choices=choices, value=run_id))


def _upload(path):
    """Store an uploaded dataset: its stored path goes into 'dataset', its first rows below the upload."""
    if not path:
        return gr.skip(), ""
    try:
        result = datasets.upload_dataset(path, remove_source=True)
    except api.ApiError as e:
        return gr.skip(), f'<div class="error">Not stored: {html.escape(str(e))}</div>'
    return result["dataset"], upload_preview_html(result)


def _preview(dataset, *fields):
    """The first rows of the dataset the form names, read through its question/answer/solution fields."""
    try:
        return upload_preview_html(datasets.preview_dataset(dataset, *fields), uploaded=False)
    except api.ApiError as e:
        return f'<div class="error">{html.escape(str(e))}</div>'
