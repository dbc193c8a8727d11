"""The dashboard's named API endpoints: what ``gradio_client`` calls, and all that the API page lists.

``/launch_run``, ``/list_presets``, ``/list_runs``, ``/get_run``, ``/get_metrics``, ``/get_logs``, ``/wait_run``, ``/list_groups``,
``/get_group``, ``/cancel_run``, ``/compare_runs``, ``/export_run``, ``/upload_dataset``, ``/preview_dataset``,
``/upload_model``, ``/list_models``,
``/preview_rewards``, ``/preview_prompt``, the run management ``/rename_run``, ``/annotate_run``, ``/archive_run``, ``/delete_run`` and
the diagnosis ``/search_samples``, ``/question_history``, the evaluations ``/list_eval_results``, ``/compare_evals``, and
``/list_try_options``, ``/try_question`` (a question tried by hand on a run's models) wrap app.service.api (and app.service.manage_api, app.service.exports,
app.service.datasets, app.service.previews, app.service.diagnose_api, app.service.tries) one to one; a refused request reaches the client as gr.Error with
its reason. app.web.ui registers :data:`ENDPOINTS` under their function names.

No ``from __future__ import annotations`` here: gr.api reads the signatures' types, and the API page shows
them with these docstrings. A return annotated ``gr.FileData`` is shown as a file (``filepath``), and
gradio_client downloads it and returns its local path.
"""

from pathlib import Path

import gradio as gr
import gradio.utils

from app.service import api, datasets, diagnose_api, evaluations, exports, manage_api, previews, tries
from app.web.tabs.shared import call_api


def launch_run(spec: dict) -> dict:
    """Launch a run from a run spec (JSON object; missing keys take their defaults). Returns {run_id, status}."""
    return call_api(api.launch_run, spec)


def list_presets() -> list[dict]:
    """The Launch form's presets, in its order: [{name, spec}], spec the run-spec keys the preset sets over the
    defaults (pass it to /launch_run as it is, or with keys changed)."""
    return call_api(api.list_presets)


def list_runs() -> list[dict]:
    """Every run, newest first."""
    return call_api(api.list_runs)


def get_run(run_id: int) -> dict:
    """One run: status, config, step / total_steps, error, timestamps."""
    return call_api(api.get_run, run_id)


def get_metrics(run_id: int) -> list[dict]:
    """Per-step metrics of a run, ordered by step."""
    return call_api(api.get_metrics, run_id)


def get_logs(run_id: int, limit: int = 200) -> list[str]:
    """The newest log lines of a run, oldest first: limit (1 to 10000, default 200) lines."""
    return call_api(api.get_logs, run_id, limit)


def wait_run(run_id: int, timeout: float = 60) -> dict:
    """Wait for a run to finish: returns the run (as /get_run) once it is completed, failed or cancelled, or as it
    stands when timeout seconds (1 to 600, default 60) have passed; compare its status to tell which."""
    return call_api(manage_api.wait_run, run_id, timeout)


def list_groups(run_id: int, step: int | None = None, order: str | None = None) -> list[dict]:
    """Groups sampled at a step (default: the latest step that has groups), sorted by order:
    position (default), spread, mean or mean_asc."""
    return call_api(api.list_groups, run_id, step, order)


def get_group(group_id: int) -> dict:
    """One group: prompt, reference and its samples with tokens, rewards and per-token advantages, and the
    verifier's reading of each (answer, answer_rule: gsm8k, boxed, number or none; null when not recorded)."""
    return call_api(api.get_group, group_id)


def cancel_run(run_id: int) -> dict:
    """Cancel a run (queued: at once; running: at the next step). Returns {run_id, status}."""
    return call_api(api.cancel_run, run_id)


def compare_runs(run_ids: list) -> dict:
    """Several runs side by side: {runs, differing_keys (config keys that differ), metrics: {"<run_id>": [...]}}."""
    return call_api(api.compare_runs, run_ids)


def rename_run(run_id: int, name: str) -> dict:
    """Rename a run (1 to 200 characters). Returns the run as /get_run."""
    return call_api(manage_api.rename_run, run_id, name)


def annotate_run(run_id: int, notes: str | None = None, tags: list[str] | str | None = None) -> dict:
    """Set a run's notes (free text) and tags (a list of strings, or one comma-separated string); None leaves
    that one as it is. Returns the run as /get_run."""
    return call_api(manage_api.annotate_run, run_id, notes, tags)


def archive_run(run_id: int, archived: bool = True) -> dict:
    """Archive a run (the Runs table hides it unless asked; nothing is deleted), or with archived=False bring it
    back. Returns the run as /get_run."""
    return call_api(manage_api.archive_run, run_id, archived)


def delete_run(run_id: int) -> dict:
    """Delete a run for good: its metrics, groups, samples, log and checkpoints. A running run is refused (cancel
    it first). Returns {run_id, deleted: true, checkpoints: "removed", "none" or why they were left}."""
    return call_api(manage_api.delete_run, run_id)


def export_run(run_id: int, kind: str = "parquet", dtype: str = "source") -> gr.FileData:
    """A run's export as a file (gradio_client downloads it and returns its local path): its recorded samples as
    'parquet' or 'csv', its 'config' as JSON, or the trained policy of a completed run as a zip: 'model' (LoRA
    merged; ``dtype`` 'source': in the dtype the model came in, or 'fp32') or 'adapter' (LoRA adapter alone, fp32)."""
    path = call_api(exports.export_run, run_id, kind, dtype)
    return gr.FileData(path=path, orig_name=Path(path).name)


def _is_upload(file) -> bool:
    """Whether ``file`` is Gradio's dict of a file uploaded to this server: a path in Gradio's upload folder.

    Anything else (a bare path, a dict naming another file on the server) would let a caller make the
    server read a file of its choosing.
    """
    if not isinstance(file, dict) or (file.get("meta") or {}).get("_type") != "gradio.FileData":
        return False
    path = file.get("path")
    folder = Path(gradio.utils.get_upload_folder()).resolve()
    return isinstance(path, str) and Path(path).resolve().is_relative_to(folder)


def upload_dataset(file: gr.FileData) -> dict:
    """Upload a dataset file (gradio_client: handle_file(path)): .jsonl, .csv or .parquet with 'question' and
    'answer' (and optional 'solution'). Returns {dataset: the stored path, for a run spec's dataset, rows, preview}."""
    if not _is_upload(file):
        raise gr.Error("file must be an uploaded file (gradio_client: handle_file(path))", print_exception=False)
    return call_api(datasets.upload_dataset, file, True)


def upload_model(file: gr.FileData) -> dict:
    """Upload a model into the models folder (gradio_client: handle_file(path)): a .gguf file, or a .zip of a model
    directory (config.json, .safetensors weights, tokenizer files). Returns {model: the stored path, for a run
    spec's model, name, kind: 'gguf' or 'directory', size}. Refused, naming why, beyond GRPO_MAX_MODEL_UPLOAD_MB
    (a zip: also unpacked) and for a zip whose members escape its folder, are links, or that is damaged."""
    if not _is_upload(file):
        raise gr.Error("file must be an uploaded file (gradio_client: handle_file(path))", print_exception=False)
    return call_api(datasets.upload_model, file, True)


def list_models() -> dict:
    """What the Launch form's model field offers: {models_folder, local, runs, hub}: local the models folder's models,
    each {name, model (its path, for a run spec's model), kind: 'directory' or 'gguf', size in bytes}; runs the newest
    completed runs whose trained policy a run may start from, each {model: 'run:<id>', name}; hub the model ids in
    the server's Hugging Face cache."""
    return call_api(datasets.list_models)


def preview_dataset(
    dataset: str, question_field: str | None = None, answer_field: str | None = None, solution_field: str | None = None
) -> dict:
    """The first rows of a dataset as a run reads it: 'builtin-arith' or a local file's path (inside the path
    roots), from the columns the *_field arguments name (default question, answer, solution). Returns
    {dataset, rows, preview}; a bad file is refused naming the file and line."""
    return call_api(datasets.preview_dataset, dataset, question_field, answer_field, solution_field)


def preview_rewards(spec: dict) -> dict:
    """Score the first rows of the run spec's dataset with its rewards, each row's reference solution as the
    completion (in a subprocess). Returns {names, weights, rows}, each row {row, question, completion, components,
    reward, step_rewards}; custom rewards need GRPO_ALLOW_CUSTOM_REWARDS=1."""
    return call_api(previews.preview_rewards, spec)


def preview_prompt(spec: dict) -> dict:
    """The run spec's first training question as its model reads it: question_template, system_prompt and
    prompt_template applied, special tokens included (the tokenizer loaded in a subprocess). Returns {model,
    question, prompt, token_count, special_tokens, stand_in} (stand_in: the dataset is a Hugging Face id, read only
    by the worker, and a stand-in question is worded)."""
    return call_api(previews.preview_prompt, spec)


def search_samples(
    run_id: int,
    reward_min: float | None = None,
    reward_max: float | None = None,
    outcome: str = "any",
    spread_min: float | None = None,
    spread_max: float | None = None,
    length_min: int | None = None,
    length_max: int | None = None,
    step_min: int | None = None,
    step_max: int | None = None,
    contains: str = "",
    kind: str = "any",
    sort: str = "step",
    descending: bool = False,
    page: int = 1,
    page_size: int = 50,
) -> dict:
    """Find samples across a run: one page of those that pass every filter. Bounds are inclusive, None leaves one
    out: reward, spread (the group's reward std), length (tokens, the end token included), step. outcome: any,
    correct, wrong (an answer found, but wrong), no_answer or truncated; kind (the group's): any, all_right,
    all_wrong, mixed or zero_spread; contains: a case-insensitive substring of the completion; sort: step, reward,
    length or spread (then by sample id), descending; page from 1, page_size 1 to 200. Returns {run_id, total,
    page, page_size, pages, rows}, each row {sample_id, group_id, step, question, completion (cut to 300
    characters), reward, correct, answer_found, answer, answer_rule, reward_components, truncated, length, spread,
    kind}."""
    request = {name: value for name, value in locals().items() if name != "run_id"}  # SampleQuery's keys
    return call_api(diagnose_api.search_samples, run_id, **request)


def question_history(run_id: int, question: str, other_runs: bool = True) -> dict:
    """One question through time: every group sampled for the question (its exact text) in the run, by step, and
    with other_runs in up to 10 other runs on the same dataset, newest first. Returns {question, question_key,
    dataset, runs}, this run first; each run {run_id, name, status, archived, groups_total, groups,
    correct_share_first, correct_share_last} with its latest 200 groups, each {group_id, step, reward_mean,
    reward_std, kind, correct_share, samples}, each sample {sample_id, completion (cut to 300 characters), reward,
    correct, truncated, length}."""
    return call_api(diagnose_api.question_history, run_id, question, other_runs)


def list_eval_results(run_id: int, step: int | None = None) -> dict:
    """One evaluation of a run question by question (step None: its latest). Returns {run_id, step, steps,
    questions}: steps every evaluation the run recorded; questions in held-out order, each {index, question,
    reference, greedy, samples}, an output {completion, answer (the final answer the verifier read, None: none),
    answer_rule (gsm8k, boxed, number or none), correct, formatted, tokens (each token's text, None before they were
    kept)}, samples the eval_samples sampled outputs."""
    return call_api(evaluations.list_eval_results, run_id, step)


def compare_evals(
    run_id: int,
    step: int | None = None,
    other_run_id: int | None = None,
    other_step: int | None = None,
    flip: str = "changed",
    text: str = "",
) -> dict:
    """Two evaluations compared question by question: run_id at step (None: its first) against other_run_id (None:
    the same run) at other_step (None: its latest), questions matched by their text. flip: changed (gained or lost),
    gained (wrong then right), lost (right then wrong), unchanged or all; text: a case-insensitive substring of the
    question or either greedy output. Returns {first: {run_id, step}, second, counts: {gained, lost, right both,
    wrong both, only first, only second}, rows}, each row {index, question, reference, flip, first, second}, first
    and second {greedy, samples} as /list_eval_results gives them."""
    request = {"other_run_id": other_run_id, "other_step": other_step, "flip": flip, "text": text}
    return call_api(evaluations.compare_evals, run_id, step, **request)


def list_try_options(run_id: int) -> dict:
    """What a try of run_id can use: {models, questions}; models [{model, label}]: 'start' (the run's starting
    model), each kept checkpoint's step, 'final' (a completed run's trained policy); questions [{question, reference,
    split}]: its held-out questions (as its latest evaluation recorded them), then those it trained on (at most 50)."""
    return {"models": call_api(tries.try_models, run_id), "questions": call_api(tries.try_questions, run_id)}


def try_question(
    run_id: int,
    question: str,
    models: list | str = "start",
    reference: str = "",
    g: int = 4,
    max_new_tokens: int | None = None,
    seed: int = 0,
    time_limit: float = 120,
) -> dict:
    """Sample g outputs (1 to 16) of one or two of run_id's models (models: 'start', a kept step, 'final'; see
    /list_try_options) to question, as the run samples (its prompt keys, temperature, top_p) and scored by its
    rewards against reference (empty: the verdict is not judged), on a worker serving tries. max_new_tokens 1 to
    1024 (default: the run's); time_limit 5 to 600 s, after which the try is refused as unfinished. Returns {try_id,
    run_id, question, reference, reward_weights, models}, each model {model, label, seconds, outputs}, each output {completion,
    tokens, token_ids, logprobs (each token's log-prob at the run's temperature), ended, answer, answer_rule, reward,
    components, reward_error}."""
    bounds = {"g": g, "max_new_tokens": max_new_tokens, "seed": seed, "time_limit": time_limit}
    return call_api(tries.try_question, run_id, models, question, reference, **bounds)


ENDPOINT_CONCURRENCY = 8  # calls of one endpoint served at once (Gradio's default is one: callers would queue)
ENDPOINTS = (
    launch_run,
    list_presets,
    list_runs,
    get_run,
    get_metrics,
    get_logs,
    wait_run,
    list_groups,
    get_group,
    cancel_run,
    compare_runs,
    export_run,
    upload_dataset,
    preview_dataset,
    upload_model,
    list_models,
    preview_rewards,
    preview_prompt,
    rename_run,
    annotate_run,
    archive_run,
    delete_run,
    search_samples,
    question_history,
    list_eval_results,
    compare_evals,
    list_try_options,
    try_question,
)
