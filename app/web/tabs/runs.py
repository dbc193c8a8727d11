"""The Runs tab: every run, newest first, with a status filter, a text search and a "Show archived" toggle; the
table and the run pickers of the other tabs refresh on opening and on every tick. A click on a row opens that
run in the Run tab; a click on its "Manage" button picks it for the Manage area: rename, tags, notes, archive,
delete (after a confirmation). What the table shows is drawn by app.web.views.runs, styled by app/web/static/runs.css."""

import html
from dataclasses import dataclass

import gradio as gr

from app.core.run_status import RunStatus
from app.service import api, manage_api
from app.web.tabs.components import Picker
from app.web.tabs.shared import PRIVATE, QUIET, Shared, attempt, error_html, fold
from app.web.views.runs import STATUS_FILTERS, matches, run_choices, runs_table_html

# The table's clicks, sent to the server as a click event with {run_id, action}: "manage" on a row's Manage
# button (the Manage area then opens and scrolls into view), "open" anywhere else in the row, or Enter on a focused row.
TABLE_JS = """
element.addEventListener('click', (event) => {
  const row = event.target.closest('tr[data-run-id]');
  if (!row) return;
  const manage = event.target.closest('[data-manage]') !== null;
  trigger('click', {run_id: Number(row.dataset.runId), action: manage ? 'manage' : 'open'});
  if (!manage) return;
  const area = document.getElementById('runs-manage');
  window.grpoOpenFold?.(area);
  area?.scrollIntoView({behavior: 'smooth', block: 'nearest'});
});
element.addEventListener('keydown', (event) => {
  const row = event.target.closest('tr[data-run-id]');
  if (row && event.key === 'Enter' && !event.target.closest('[data-manage]')) {
    trigger('click', {run_id: Number(row.dataset.runId), action: 'open'});
  }
});
"""


@dataclass(frozen=True, kw_only=True)
class Manage:
    """The Manage area's components."""

    select: gr.Dropdown  # the run it acts on
    name: gr.Textbox
    tags: gr.Textbox
    notes: gr.Textbox
    save: gr.Button
    archive: gr.Button  # "Archive" or "Unarchive", as the run is
    delete: gr.Button  # hidden while the confirmation shows
    confirm: gr.Row  # "Really delete run #N ...?" with its two buttons
    confirm_text: gr.HTML
    confirm_button: gr.Button
    keep_button: gr.Button
    message: gr.HTML


def build_runs_tab(shared: Shared) -> None:
    """The tab and its listeners: refresh the table and the pickers; open a clicked run; manage a run."""
    with gr.Tab("Runs", id="runs", elem_id="tab-runs"):
        with gr.Row(elem_id="runs-filters", equal_height=True):
            status = gr.Dropdown(
                list(STATUS_FILTERS), value="all", label="Status", elem_id="runs-status", scale=1, min_width=180
            )
            search = gr.Textbox(
                label="Search", placeholder="name, model, dataset, tag or #id", elem_id="runs-search", scale=3
            )
            archived = gr.Checkbox(False, label="Show archived", elem_id="runs-show-archived", scale=0, min_width=160)
        manage = _build_manage()
        table = gr.HTML(runs_table_html([], []), elem_id="runs-table", js_on_load=TABLE_JS)
        seen = gr.State(None)  # what the table and the pickers last showed

    inputs = [
        seen,
        shared.run_select,
        shared.groups_run_select,
        shared.compare_select,
        manage.select,
        status,
        search,
        archived,
    ]
    outputs = [table, shared.run_select, shared.groups_run_select, shared.compare_select, manage.select, seen]
    # every refresh of the table in one queue, one at a time: a tick that read the old filter never lands after
    # the refresh for the new one
    refresh = dict(fn=_refresh_runs, inputs=inputs, outputs=outputs, concurrency_id="runs-refresh", **QUIET)
    shared.demo.load(**refresh)
    shared.store_seen.change(**refresh)
    for control in (status, archived):
        control.change(**refresh)
    # "always_last": a keystroke sent while the refresh of the one before runs is not dropped (an .input listener
    # drops it by default), so deleting the search back to empty shows every run again
    search.input(**refresh, trigger_mode="always_last")
    table.click(
        _table_click,
        None,
        [shared.tabs, shared.run_select, shared.groups_run_select, manage.select],
        concurrency_id="runs-refresh",
        **PRIVATE,
    )
    _wire_manage(manage, lambda event: event.then(**refresh))


def _build_manage() -> Manage:
    """The Manage area (closed until a run is picked): the run, its name, tags and notes, Save, Archive and
    Delete, the delete confirmation and a message line."""
    with fold("Manage a run", elem_id="runs-manage"):  # drawn with the tab: a Manage click's run lands in its picker
        with gr.Row(equal_height=True):
            select = Picker([], value=None, label="Run", elem_id="manage-run", scale=2)
            name = gr.Textbox(label="Name", max_length=manage_api.NAME_MAX, elem_id="manage-name", scale=2)
            tags = gr.Textbox(
                label="Tags (comma-separated)", placeholder="baseline, lr-sweep", elem_id="manage-tags", scale=2
            )
        notes = gr.Textbox(label="Notes", lines=2, max_lines=8, max_length=manage_api.NOTES_MAX, elem_id="manage-notes")
        with gr.Row(elem_id="manage-actions"):
            save = gr.Button("Save", variant="primary", size="md", elem_id="manage-save", scale=0, min_width=110)
            archive = gr.Button("Archive", size="md", elem_id="manage-archive", scale=0, min_width=110)
            delete = gr.Button("Delete…", variant="stop", size="md", elem_id="manage-delete", scale=0, min_width=110)
            with gr.Row(visible=False, elem_id="manage-confirm") as confirm:
                confirm_text = gr.HTML(elem_id="manage-confirm-text")
                confirm_button = gr.Button(
                    "Delete for good",
                    variant="stop",
                    size="md",
                    elem_id="manage-confirm-delete",
                    scale=0,
                    min_width=160,
                )
                keep_button = gr.Button("Keep it", size="md", elem_id="manage-keep", scale=0, min_width=100)
        message = gr.HTML(elem_id="manage-message")
    return Manage(
        select=select,
        name=name,
        tags=tags,
        notes=notes,
        save=save,
        archive=archive,
        delete=delete,
        confirm=confirm,
        confirm_text=confirm_text,
        confirm_button=confirm_button,
        keep_button=keep_button,
        message=message,
    )


def _wire_manage(m: Manage, then_refresh) -> None:
    """The Manage area's listeners; ``then_refresh(event)`` refreshes the table after a change, at once."""
    shown = [m.name, m.tags, m.notes, m.archive, m.confirm, m.delete, m.message]
    m.select.change(_load_manage, m.select, shown, **PRIVATE)
    then_refresh(m.save.click(_save, [m.select, m.name, m.tags, m.notes], [m.message, m.tags], **PRIVATE))
    then_refresh(m.archive.click(_toggle_archive, m.select, [m.message, m.archive], **PRIVATE))
    m.delete.click(_ask_delete, m.select, [m.confirm, m.confirm_text, m.delete, m.message], **PRIVATE)
    m.keep_button.click(
        lambda: (gr.Row(visible=False), gr.Button(visible=True), ""), None, [m.confirm, m.delete, m.message], **PRIVATE
    )
    then_refresh(m.confirm_button.click(_delete, m.select, [m.select, *shown], **PRIVATE))


def _refresh_runs(seen, run_id, groups_run_id, compared, manage_id, status, search, show_archived):
    """The table and the pickers' choices, each when it changed. A picker's value is set only where it must move:
    a deleted run, or the Run and Groups pickers empty while runs exist (they take the newest); the Compare and
    Manage pickers drop deleted runs. Otherwise a picker keeps what it shows: a tick reads the pickers when it
    is sent, so a value it read can be older than a Launch or a click that lands first."""
    runs = manage_api.runs_overview()
    shown = [run for run in runs if matches(run, status, search, show_archived)]
    table = runs_table_html(runs, shown, manage_id, show_archived)
    choices = run_choices(runs)
    ids = {run["run_id"] for run in runs}
    newest = runs[0]["run_id"] if runs else None
    seen = seen or {}

    def picker(value, moved):
        return gr.Dropdown(choices=choices, value=moved) if moved is not value else gr.Dropdown(choices=choices)

    def single(value, empty):  # the value a single picker must move to, else ``value`` itself
        if value is None:
            return empty if runs else value
        return value if value in ids else empty

    kept = [r for r in compared or [] if r in ids]
    moved = (
        single(run_id, newest),
        single(groups_run_id, newest),
        compared if len(kept) == len(compared or []) else kept,
        single(manage_id, None),
    )
    values = (run_id, groups_run_id, compared, manage_id)
    stale = any(m is not v for m, v in zip(moved, values, strict=True))
    pickers = (gr.skip(),) * 4
    if choices != seen.get("choices") or stale:
        pickers = tuple(picker(v, m) for v, m in zip(values, moved, strict=True))
    return (gr.skip() if table == seen.get("table") else table, *pickers, {"table": table, "choices": choices})


def _table_click(evt: gr.EventData):
    """A click in the table: "open" shows the row's run in the Run tab (the Groups tab follows); "manage" picks
    it for the Manage area (which the page opens)."""
    data = evt._data if isinstance(evt._data, dict) else {}
    got = attempt(api.as_id, data.get("run_id"))
    if not got.ok:  # a click outside a row
        return (gr.skip(),) * 4
    run_id = got.value
    if data.get("action") == "manage":  # the page opened the Manage area (TABLE_JS)
        return gr.skip(), gr.skip(), gr.skip(), run_id
    return gr.Tabs(selected="run"), run_id, run_id, gr.skip()


def _note(text: str, ok: bool = True) -> str:
    """A message line of the Manage area: done (green) or refused (red)."""
    return f'<div class="ok">{html.escape(text)}</div>' if ok else error_html(text)


def _load_manage(run_id):
    """The picked run's name, tags and notes in the Manage area, Archive or Unarchive as it is, no confirmation
    showing; all empty with no run, the message kept (a delete empties the picker, and its "Deleted run #N"
    stays)."""
    hide_confirm, show_delete = gr.Row(visible=False), gr.Button(visible=True)
    if run_id is None:
        return "", "", "", gr.Button("Archive"), hide_confirm, show_delete, gr.skip()
    got = attempt(api.get_run, run_id)
    if not got.ok:
        return "", "", "", gr.Button("Archive"), hide_confirm, show_delete, _note(got.error, ok=False)
    run = got.value
    return (
        run["name"],
        ", ".join(run["tags"]),
        run["notes"],
        gr.Button("Unarchive" if run["archived"] else "Archive"),
        hide_confirm,
        show_delete,
        "",
    )


def _save(run_id, name, tags, notes):
    """Save the Manage area's name, tags and notes on the run; the message says what happened."""
    if run_id is None:
        return _note("Pick a run first: its Manage button in the table, or the Run list here.", ok=False), gr.skip()
    got = attempt(_save_manage, run_id, name or "", tags or "", notes or "")
    if not got.ok:
        return _note(got.error, ok=False), gr.skip()
    return _note(f"Saved run #{run_id}."), ", ".join(got.value["tags"])


def _save_manage(run_id: int, name: str, tags: str, notes: str) -> dict:
    """Rename the run where ``name`` differs from its stored name, then set its notes and tags; the run after."""
    if name.strip() != api.get_run(run_id)["name"]:
        manage_api.rename_run(run_id, name)
    return manage_api.annotate_run(run_id, notes, tags)


def _toggle_archive(run_id):
    """Archive the run, or bring back an archived one; the button then offers the other."""
    if run_id is None:
        return _note("Pick a run first.", ok=False), gr.skip()
    got = attempt(lambda: manage_api.archive_run(run_id, not api.get_run(run_id)["archived"]))
    if not got.ok:
        return _note(got.error, ok=False), gr.skip()
    if got.value["archived"]:
        return (
            _note(f'Archived run #{run_id}: the table hides it unless "Show archived" is ticked.'),
            gr.Button("Unarchive"),
        )
    return _note(f"Run #{run_id} is no longer archived."), gr.Button("Archive")


def _ask_delete(run_id):
    """The Delete button turns into the question "Really delete run #N ...?" with its confirm and keep buttons;
    a running run is refused at once (cancel it first)."""
    keep = gr.Row(visible=False), gr.skip(), gr.Button(visible=True)
    if run_id is None:
        return *keep, _note("Pick a run first.", ok=False)
    got = attempt(api.get_run, run_id)
    if not got.ok:
        return *keep, _note(got.error, ok=False)
    run = got.value
    if run["status"] == RunStatus.RUNNING:
        return *keep, _note(
            f'Run #{run_id} is running: cancel it first (Run tab, "Cancel run"), then delete it once it has stopped.',
            ok=False,
        )
    question = (
        f"Really delete run #{run_id} “{html.escape(run['name'])}” and its data (metrics, groups, "
        "samples, log, checkpoints)? This cannot be undone."
    )
    return gr.Row(visible=True), question, gr.Button(visible=False), ""


def _delete(run_id):
    """Delete the run (confirmed); the Manage area then picks no run."""
    hide_confirm, show_delete = gr.Row(visible=False), gr.Button(visible=True)
    got = attempt(manage_api.delete_run, run_id)
    if not got.ok:
        return (
            gr.skip(),
            gr.skip(),
            gr.skip(),
            gr.skip(),
            gr.skip(),
            hide_confirm,
            show_delete,
            _note(got.error, ok=False),
        )
    return (
        gr.Dropdown(value=None),
        "",
        "",
        "",
        gr.Button("Archive"),
        hide_confirm,
        show_delete,
        _note(f"Deleted run #{run_id} and its data."),
    )
