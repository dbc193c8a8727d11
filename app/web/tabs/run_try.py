"""The Run tab's "Try a question" (a fold): one or two of the shown run's models (its starting model, a kept
checkpoint's policy, its trained policy), a question typed or picked from the run's (held-out first), and G
outputs of each side by side, scored by the run's rewards (app.service.tries, drawn by app.web.views.tries). The
models and questions offered follow the run: read again when another run is shown or a step is recorded."""

import gradio as gr

from app.service import api
from app.service import tries as try_api
from app.web.tabs.shared import PRIVATE, QUIET, attempt, error_html, fold
from app.web.views.tries import try_html

NOTE = (
    '<div class="try-note">Sampled on a worker that serves tries, at the run\'s temperature and top_p, with its '
    "prompt keys; scored by its verifier and rewards (a learned reward model's score is not computed). Up to two "
    "models, 1 to 16 outputs each.</div>"
)


def build_try(run_select: gr.Dropdown, charts: gr.Plot) -> None:
    """The fold, placed where it is called; its options follow ``run_select`` and ``charts`` (redrawn on a new
    step)."""
    with fold("Try a question", elem_id="try-panel"):
        gr.HTML(NOTE, padding=False)
        with gr.Row(equal_height=True):
            models = gr.CheckboxGroup([], label="Models (one or two)", elem_id="try-models", scale=2)
            pick = gr.Dropdown([], value=None, label="A question of the run", elem_id="try-pick", scale=3)
        with gr.Row(equal_height=True):
            question = gr.Textbox(label="Question", lines=2, max_lines=6, elem_id="try-question", scale=3)
            reference = gr.Textbox(
                label="Reference answer (optional)", lines=2, max_lines=6, elem_id="try-reference", scale=2
            )
        with gr.Row(equal_height=True):
            bounds = try_api.TRY_BOUNDS
            g = gr.Slider(*bounds["g"], value=try_api.DEFAULT_G, step=1, label="Outputs per model (G)", elem_id="try-g")
            max_new = gr.Number(None, label="Max new tokens (0: the run's)", precision=0, elem_id="try-max-new")
            seed = gr.Number(0, label="Seed", precision=0, minimum=0, elem_id="try-seed")
            go = gr.Button("Try", variant="primary", elem_id="try-button", scale=0, min_width=120)
        result = gr.HTML(elem_id="try-result")
    offered = gr.State(None)  # what the run offered when last read: {run_id, models, questions (the picker's order)}
    for event in (run_select.change, charts.change):
        event(_options, [run_select, models, offered], [models, pick, offered, max_new],
              trigger_mode="always_last", concurrency_id="try-options", **QUIET)  # fmt: skip
    pick.input(_picked, [pick, offered], [question, reference], **PRIVATE)
    go.click(_try, [run_select, models, question, reference, g, max_new, seed], result, **PRIVATE)


def _options(run_id, picked, offered_before):
    """The run's models (by default the starting model and the newest other) and questions, each left as the user
    has it while the run offers the same (an event sent before the user's pick must not undo it), and its
    max_new_tokens (set when another run is shown)."""
    if run_id is None:
        return gr.CheckboxGroup(choices=[], value=[]), gr.Dropdown(choices=[], value=None), None, gr.skip()
    models, questions = attempt(try_api.try_models, run_id), attempt(try_api.try_questions, run_id)
    run = attempt(api.get_run, run_id)
    if not (models.ok and questions.ok and run.ok):
        return (gr.skip(),) * 4
    offered = {"run_id": run_id, "models": models.value, "questions": questions.value}
    if offered == offered_before:
        return (gr.skip(),) * 4
    same_run = offered_before is not None and offered_before["run_id"] == run_id
    keys = [m["model"] for m in models.value]
    kept = [m for m in (picked or []) if m in keys] if same_run else []
    value = kept or (keys[:1] + keys[-1:] if len(keys) > 1 else keys)
    choices = [(m["label"], m["model"]) for m in models.value]
    listed = [(f"[{q['split']}] {_short(q['question'])}", i) for i, q in enumerate(questions.value)]
    max_new = min(run.value["config"].get("max_new_tokens", 0), try_api.TRY_BOUNDS["max_new_tokens"][1])
    same_questions = same_run and offered_before["questions"] == questions.value
    return (
        gr.CheckboxGroup(choices=choices, value=value),
        gr.skip() if same_questions else gr.Dropdown(choices=listed, value=None),
        offered,
        gr.skip() if same_run else max_new,
    )


def _short(text: str, limit: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _picked(index, offered):
    """A question of the run picked (its index): it and its reference in the fields, to try or edit."""
    questions = (offered or {}).get("questions") or []
    if index is None or not 0 <= index < len(questions):
        return gr.skip(), gr.skip()
    return questions[index]["question"], questions[index]["reference"]


def _try(run_id, models, question, reference, g, max_new, seed):
    """The try, side by side, or the refusal."""
    if run_id is None:
        return error_html("Pick a run first.", "try-error")
    bounds = {"g": g, "max_new_tokens": max_new, "seed": seed}
    got = attempt(try_api.try_question, run_id, models or [], question, reference, **bounds)
    if not got.ok:
        return error_html(got.error, "try-error")
    return try_html(got.value)
