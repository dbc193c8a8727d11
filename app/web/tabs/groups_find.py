"""The Groups tab's diagnosis parts: "Find samples" (filters over a run's samples, a page of results; a clicked
result shows its group, the sample marked), "This question through time" (the shown group's question in this run
and in other runs on its dataset), and what a click on the Run tab's gradient chart opens (those groups, found).

app.web.tabs.groups places them (:func:`build_find`, :func:`build_history`) and wires them (:func:`wire_find`,
:func:`wire_history`); the searches are app.service.diagnose_api's, the views app.web.views.diagnose's and
app.web.views.question_history's.
"""

from dataclasses import dataclass

import gradio as gr

from app.service import api, diagnose_api
from app.web.tabs.shared import PRIVATE, Shared, attempt, error_html
from app.web.views.diagnose import mark_sample, pager_text, samples_frame
from app.web.views.group import group_html
from app.web.views.question_history import question_history_html

OUTCOMES = (
    ("any", "any"),
    ("correct ✓", "correct"),
    ("wrong ✗ (an answer found)", "wrong"),
    ("no answer found", "no_answer"),
    ("cut at the length limit", "truncated"),
)
KINDS = (
    ("any", "any"),
    ("all right", "all_right"),
    ("all wrong", "all_wrong"),
    ("mixed", "mixed"),
    ("zero reward spread", "zero_spread"),
)
SORTS = (("step", "step"), ("reward", "reward"), ("length", "length"), ("group reward spread", "spread"))
# the filters of the Find form, in its inputs' order (diagnose_api.QUERY_KEYS without the page), and their values
# when cleared
FILTERS = (
    "outcome",
    "kind",
    "reward_min",
    "reward_max",
    "spread_min",
    "spread_max",
    "length_min",
    "length_max",
    "step_min",
    "step_max",
    "contains",
    "sort",
    "descending",
)
CLEARED = {"outcome": "any", "kind": "any", "sort": "step", "descending": False}  # the rest: "" (no bound)
PAGE_SIZE = 50
# of the table's width, in SAMPLE_COLUMNS' order; the verdict, the answer read and the components wrap (diagnose.css)
RESULT_WIDTHS = ["5%", "5%", "6%", "6%", "8%", "14%", "18%", "6%", "6%", "10%", "16%"]
SCROLL_TO_FOUND = (
    "() => document.querySelector('#group-view .sample[data-found]')"
    "?.scrollIntoView({behavior: 'smooth', block: 'nearest'})"
)
SCROLL_TO_FIND = "() => document.getElementById('find-samples')?.scrollIntoView({block: 'start'})"


@dataclass(frozen=True, kw_only=True)
class Find:
    """The Find samples section's components."""

    filters: tuple  # one component per name of FILTERS
    find: gr.Button
    clear: gr.Button
    results: gr.Dataframe
    pager: gr.HTML
    prev: gr.Button
    next: gr.Button
    shown: gr.State  # {"run", "page", "pages"} of the results shown; None before a search
    section: gr.Accordion  # folded on opening (the cards come first); a chart click unfolds it


def build_find() -> Find:
    """The "Find samples" section (folded, so that the group's cards are near the top): the filters, Find and
    Clear, the results and the pager."""
    # bounds as text ("" for none; diagnose_api parses it and names a bad one): an empty gr.Number would send 0
    bound = dict(value="", placeholder="any", max_lines=1, min_width=100)
    with gr.Accordion("Find samples", open=False, elem_id="find-samples") as section:
        with gr.Row(equal_height=True):
            outcome = gr.Dropdown(list(OUTCOMES), value="any", label="Outcome", elem_id="find-outcome")
            kind = gr.Dropdown(list(KINDS), value="any", label="Group kind", elem_id="find-kind")
            sort = gr.Dropdown(list(SORTS), value="step", label="Sort by", elem_id="find-sort")
            descending = gr.Checkbox(False, label="Descending", elem_id="find-descending", scale=0, min_width=130)
        with gr.Row(equal_height=True):
            bounds = [
                gr.Textbox(label=label, elem_id=f"find-{name.replace('_', '-')}", **bound)
                for name, label in (
                    ("reward_min", "reward from"),
                    ("reward_max", "reward to"),
                    ("spread_min", "spread from"),
                    ("spread_max", "spread to"),
                    ("length_min", "length from"),
                    ("length_max", "length to"),
                    ("step_min", "step from"),
                    ("step_max", "step to"),
                )
            ]
        with gr.Row(equal_height=True):
            contains = gr.Textbox(
                label="Completion contains", placeholder="text (any case)", elem_id="find-contains", scale=3
            )
            find = gr.Button("Find", variant="primary", elem_id="find-button", scale=0, min_width=110)
            clear = gr.Button("Clear filters", elem_id="find-clear", scale=0, min_width=160)
        results = gr.Dataframe(
            samples_frame(None),
            interactive=False,
            elem_id="find-results",
            max_height=380,
            column_widths=RESULT_WIDTHS,
            label="Samples found (click a row to show its group below)",
        )
        with gr.Row(elem_id="find-pager-row", equal_height=True):
            prev = gr.Button("◀ Previous", size="sm", elem_id="find-prev", interactive=False, scale=0, min_width=120)
            pager = gr.HTML(pager_text(None), elem_id="find-pager")
            next_ = gr.Button("Next ▶", size="sm", elem_id="find-next", interactive=False, scale=0, min_width=120)
        shown = gr.State(None)
    return Find(
        filters=(outcome, kind, *bounds, contains, sort, descending),
        find=find,
        clear=clear,
        results=results,
        pager=pager,
        prev=prev,
        next=next_,
        shown=shown,
        section=section,
    )


def build_history() -> tuple[gr.Button, gr.HTML]:
    """The "This question through time" button and where its answer shows."""
    with gr.Row():
        button = gr.Button(
            "This question through time",
            elem_id="question-history-button",
            size="sm",
            interactive=False,
            scale=0,
            min_width=260,
        )
    return button, gr.HTML(elem_id="question-history")


def wire_find(
    shared: Shared,
    f: Find,
    *,
    group_view: gr.HTML,
    shown_group: gr.State,
    tint: gr.Radio,
    pinned: gr.State,
    step_slider: gr.Slider,
) -> None:
    """Find, the pager, Clear, a click on a result, another run, and a click on the Run tab's gradient chart. A group
    they show is tinted by ``tint``; with it the step slider moves to its step (so the groups table above lists
    that step's groups) and ``pinned`` notes its run, so the slider's move and its following the latest step leave
    the group shown."""
    run_select = shared.groups_run_select
    page_out = [f.results, f.pager, f.shown, f.prev, f.next]
    shown_out = [group_view, shown_group, step_slider, pinned]
    found_out = [*page_out, *shown_out]

    f.find.click(_find, [run_select, tint, *f.filters], found_out, **PRIVATE)
    for name in ("contains", *(n for n in FILTERS if n.endswith(("_min", "_max")))):  # Enter in a text field
        f.filters[FILTERS.index(name)].submit(_find, [run_select, tint, *f.filters], found_out, **PRIVATE)
    f.prev.click(_turn(-1), [run_select, f.shown], page_out, **PRIVATE)
    f.next.click(_turn(+1), [run_select, f.shown], page_out, **PRIVATE)
    f.clear.click(lambda: [CLEARED.get(name, "") for name in FILTERS], None, list(f.filters), **PRIVATE)
    f.results.select(_open_found, [run_select, tint], shown_out, **PRIVATE).then(None, js=SCROLL_TO_FOUND)
    run_select.change(_forget, [run_select, f.shown], page_out, **PRIVATE)
    shared.gradient_chart.click(
        _open_bar, [shared.run_select, tint], [shared.tabs, f.section, run_select, *f.filters, *found_out], **PRIVATE
    ).then(None, js=SCROLL_TO_FIND)


def wire_history(shared: Shared, button: gr.Button, view: gr.HTML, shown_group: gr.State) -> None:
    """The button shows the shown group's question through time; showing another group clears that."""
    button.click(_history, [shared.groups_run_select, shown_group], view, **PRIVATE)
    shown_group.change(lambda g: ("", gr.Button(interactive=g is not None)), shown_group, [view, button], **PRIVATE)


def _search(run_id, values, page: int):
    """A page of the run's samples that pass ``values`` (FILTERS' values), or the refusal's message."""
    if run_id is None:
        return None, "Pick a run first."
    got = attempt(
        diagnose_api.search_samples, run_id, **dict(zip(FILTERS, values, strict=True)), page=page, page_size=PAGE_SIZE
    )
    return got.value, got.error


def _page(run_id, values, result, error) -> tuple:
    """The results table, the pager line, what is shown (the run, the filters' ``values``, the page), and Previous
    / Next enabled where they lead somewhere."""
    if result is None:
        return (
            samples_frame(None),
            pager_text(None, error),
            None,
            gr.Button(interactive=False),
            gr.Button(interactive=False),
        )
    shown = {"run": run_id, "filters": list(values), "page": result["page"], "pages": result["pages"]}
    return (
        samples_frame(result),
        pager_text(result),
        shown,
        gr.Button(interactive=result["page"] > 1),
        gr.Button(interactive=result["page"] < result["pages"]),
    )


def _found_group(run_id, result, tint: str) -> tuple:
    """The group of the first sample found (tinted by ``tint``), that sample marked, its group id, its step and
    ``run_id`` (pinned); a note where none was found."""
    rows = (result or {}).get("rows") or []
    if not rows:
        return (
            ("<div>No sample found.</div>" if result else gr.skip()),
            (None if result else gr.skip()),
            gr.skip(),
            gr.skip(),
        )
    return _shown(run_id, rows[0]["group_id"], rows[0]["sample_id"], tint)


def _shown(run_id, group_id: int, sample_id: int, tint: str) -> tuple:
    """The group view with ``sample_id`` marked, the group's id and step, and ``run_id`` (pinned)."""
    got = attempt(api.get_group, group_id)
    if not got.ok:
        return error_html(got.error, "run-error"), None, gr.skip(), gr.skip()
    return mark_sample(group_html(got.value, tint), sample_id), group_id, got.value["step"], run_id


def _find(run_id, tint, *values):
    """The first page of samples found, and the group of the first shown."""
    result, error = _search(run_id, values, 1)
    return *_page(run_id, values, result, error), *_found_group(run_id, result, tint)


def _turn(delta: int):
    """The listener of Previous (-1) or Next (+1): the page before or after the one shown, with the filters it was
    found with (not those changed since, until Find)."""

    def turn(run_id, shown):
        """That page; nothing changes where there is none."""
        if not shown or shown["run"] != run_id:
            return (gr.skip(),) * 5
        page = min(max(shown["page"] + delta, 1), shown["pages"])
        return _page(run_id, shown["filters"], *_search(run_id, shown["filters"], page))

    return turn


def _open_found(run_id, tint, evt: gr.SelectData):
    """The group of the clicked result (its "group" and "sample" columns), that sample marked."""
    try:
        group_id, sample_id = int(evt.row_value[1]), int(evt.row_value[2])
    except (TypeError, ValueError, IndexError) as e:
        return error_html(str(e), "run-error"), gr.skip(), gr.skip(), gr.skip()
    return _shown(run_id, group_id, sample_id, tint)


def _forget(run_id, shown):
    """Another run picked: the results of the last one go (unless they are this run's already)."""
    if shown is not None and shown["run"] == run_id:
        return (gr.skip(),) * 5
    return _page(run_id, (), None, None)


def _open_bar(run_id, tint, evt: gr.EventData):
    """A click on a bar of the Run tab's gradient chart: the Groups tab on the run, with the filters cleared but
    the bar's steps and kind, and the first page of its samples found."""
    data = evt._data if isinstance(evt._data, dict) else {}
    if run_id is None or data.get("kind") not in dict(KINDS).values():
        return (gr.skip(),) * (3 + len(FILTERS) + 9)
    values = {
        **{name: CLEARED.get(name, "") for name in FILTERS},
        "kind": data["kind"],
        "step_min": str(data.get("step", "")),
        "step_max": str(data.get("step_end", data.get("step", ""))),
    }
    filters = [values[name] for name in FILTERS]
    return (gr.Tabs(selected="groups"), gr.Accordion(open=True), run_id, *filters, *_find(run_id, tint, *filters))


def _history(run_id, group_id):
    """The shown group's question through time, in this run and in the other runs on its dataset."""
    if run_id is None or group_id is None:
        return "<div>Show a group first.</div>"
    got = attempt(lambda: diagnose_api.question_history(run_id, diagnose_api.question_of_group(group_id)))
    return question_history_html(got.value) if got.ok else error_html(got.error, "run-error")
