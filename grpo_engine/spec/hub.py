"""Hugging Face Hub ids in a run spec: found, quickly, or refused with what to do.

A run naming a misspelled or unreachable Hub model or dataset would otherwise hold a worker through the hub
client's retries (tens of seconds) and then fail with a connection error that says nothing useful. The dashboard
checks at launch and the worker again before loading (each on its own machine), with a short timeout:

- an id already in this machine's Hugging Face cache passes without asking the Hub;
- with ``HF_HUB_OFFLINE`` set, an id not in the cache is refused (nothing will download it);
- otherwise the Hub is asked whether the repository exists: a missing one is refused (misspelled, or private),
  a gated one says to accept its terms and set ``HF_TOKEN``, and no answer within the timeout is refused with the
  ways to run without the Hub.

Pure: huggingface_hub only (no torch), so the web process can use it.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_engine.spec.config import BUILTIN_DATASETS, BUILTIN_MODEL, SpecError, is_local_path
from grpo_engine.spec.words import run_model_id

HUB_KEYS = (
    ("model", "model"),
    ("reward_model", "model"),
    ("label_completer", "model"),
    ("dataset", "dataset"),
    ("rm_data", "dataset"),
)
WITHOUT_THE_HUB = (
    "give a local directory or .gguf file instead (a model in the data directory's models folder, or uploaded in the "
    "Launch tab; a dataset uploaded there), or download it on the workers first (`hf download <id>`, add "
    "`--repo-type dataset` for a dataset) and set HF_HUB_OFFLINE=1 there"
)


def hub_ids(config: dict) -> list[tuple[str, str, str]]:
    """The run spec's keys that name a Hub repository: (key, id, 'model' or 'dataset').

    >>> hub_ids({"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "builtin-arith", "reward_model": "",
    ...          "rm_data": "./shepherd.jsonl"})
    [('model', 'Qwen/Qwen2.5-0.5B-Instruct', 'model')]
    """
    found = []
    for key, kind in HUB_KEYS:
        value = (config.get(key) or "").strip()
        if (
            value
            and value != BUILTIN_MODEL
            and value not in BUILTIN_DATASETS
            and not is_local_path(value)
            and run_model_id(value) is None  # an earlier run's policy (run:<id>)
        ):
            found.append((key, value, kind))
    return found


def in_cache(repo_id: str, kind: str) -> bool:
    """Whether this machine's Hugging Face hub cache holds a snapshot of the repository."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"{kind}s--{repo_id.replace('/', '--')}" / "snapshots"
    return folder.is_dir() and any(folder.iterdir())


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_hub_ids(config: dict, timeout: float) -> None:
    """Refuse (SpecError naming the key) a Hub id in ``config`` that is not cached here and that the Hub does not
    confirm within ``timeout`` seconds; see the module's docstring. ``timeout`` 0 checks nothing."""
    if timeout <= 0:
        return
    for key, repo_id, kind in hub_ids(config):
        if in_cache(repo_id, kind):
            continue
        if _offline():
            raise SpecError(
                key,
                f"{repo_id!r} is not in this machine's Hugging Face cache and HF_HUB_OFFLINE is "
                f"set, so nothing can download it; {WITHOUT_THE_HUB}",
            )
        _ask_the_hub(key, repo_id, kind, timeout)


def _ask_the_hub(key: str, repo_id: str, kind: str, timeout: float) -> None:
    """Whether the Hub has the repository; a SpecError naming ``key`` when it does not or does not answer."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().repo_info(repo_id, repo_type=kind, timeout=timeout)
    except GatedRepoError:
        raise SpecError(
            key,
            f"{repo_id!r} is gated on the Hugging Face Hub: accept its terms on its page and "
            "set HF_TOKEN on the workers",
        ) from None
    except RepositoryNotFoundError:
        raise SpecError(
            key, f"no {kind} {repo_id!r} on the Hugging Face Hub: is it spelled right? (a private one needs HF_TOKEN)"
        ) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "error"
        raise SpecError(key, f"the Hugging Face Hub refused {repo_id!r} ({status}); {WITHOUT_THE_HUB}") from None
    except Exception as e:  # no network, DNS, a timeout: the client's errors differ between versions
        raise SpecError(
            key,
            f"could not reach the Hugging Face Hub within {timeout:g} s to find {repo_id!r} "
            f"({type(e).__name__}); {WITHOUT_THE_HUB}",
        ) from None


def cached_models() -> list[str]:
    """The ids of the models this machine's Hugging Face hub cache holds a snapshot of, sorted (huggingface_hub's
    cache scan); none where there is no cache or it cannot be read."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    try:
        scanned = scan_cache_dir()
    except (CacheNotFound, CorruptedCacheException, OSError):
        return []
    return sorted(repo.repo_id for repo in scanned.repos if repo.repo_type == "model" and repo.revisions)
