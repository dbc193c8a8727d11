"""The store: data access as small functions taking a Session (``app.store.db.session_scope`` owns the transaction).

``runs``: a run's life cycle and lease, and the workers; ``records``: a run's metrics and logs; ``groups``: its
sampled groups and their samples; ``manage``: what users do to runs (rename, notes and tags, archive, delete);
``search``: finding samples across a run, and one question through time; ``evaluations``: each evaluation's
held-out questions and outputs; ``tries``: questions tried by hand on a run's models. Callers use them through this package:
``store.create_run(s, ...)``.
"""

from app.store.evaluations import (
    EVAL_EXPORT_COLUMNS,
    eval_results,
    eval_steps,
    evaluated_runs,
    iter_eval_rows,
    record_evaluation,
)
from app.store.groups import (
    EXPORT_COLUMNS,
    GROUP_ORDERS,
    get_group,
    group_steps,
    iter_sample_rows,
    list_groups,
    recent_lengths_rewards,
    record_groups,
)
from app.store.manage import annotate_run, delete_run, metrics_after, rename_run, set_archived
from app.store.records import append_log, get_logs, get_metrics, latest_writes, record_step, truncate_after
from app.store.runs import (
    FINISHED_STATUSES,
    LeaseLost,
    RunStatus,
    claim_run,
    create_run,
    default_run_name,
    finish_run,
    get_run,
    is_cancel_requested,
    list_runs,
    live_workers,
    mark_running,
    record_checkpoint,
    renew_lease,
    report_worker,
    request_cancel,
    requeue_run,
    requeue_stale_runs,
    set_phase,
)
from app.store.search import SampleQuery, group_question, question_history, search_samples
from app.store.tries import claim_try, create_try, expire_try, finish_try, get_try, run_questions

__all__ = [
    "EVAL_EXPORT_COLUMNS",
    "EXPORT_COLUMNS",
    "FINISHED_STATUSES",
    "GROUP_ORDERS",
    "LeaseLost",
    "RunStatus",
    "append_log",
    "claim_run",
    "create_run",
    "default_run_name",
    "eval_results",
    "eval_steps",
    "evaluated_runs",
    "finish_run",
    "get_group",
    "get_logs",
    "get_metrics",
    "get_run",
    "group_steps",
    "is_cancel_requested",
    "iter_eval_rows",
    "iter_sample_rows",
    "latest_writes",
    "list_groups",
    "list_runs",
    "live_workers",
    "mark_running",
    "record_checkpoint",
    "record_evaluation",
    "record_groups",
    "record_step",
    "renew_lease",
    "report_worker",
    "request_cancel",
    "requeue_run",
    "requeue_stale_runs",
    "set_phase",
    "truncate_after",
    "annotate_run",
    "delete_run",
    "metrics_after",
    "rename_run",
    "set_archived",
    "group_question",
    "question_history",
    "search_samples",
    "SampleQuery",
    "recent_lengths_rewards",
    "claim_try",
    "create_try",
    "expire_try",
    "finish_try",
    "get_try",
    "run_questions",
]
