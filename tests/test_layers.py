"""The layering of ARCHITECTURE.md, read from the source (every import statement, module level or not):

engine (grpo_engine) <- shared core <- store <- {web app, workers} <- CLI (grpo_dashboard); the core, the store
and the web app are modules of the ``app`` package, and migrations run against the store. No module and no
package imports in a circle. (That the live web process never loads
torch is checked on a real server: tests/app/web/test_ui_server.py::test_server_process_has_not_loaded_torch.)
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.servers import ROOT

PACKAGES = ("grpo_engine", "app", "workers", "grpo_dashboard", "migrations")
# what each package may import from the others
ALLOWED = {
    "grpo_engine": set(),
    "app": {"grpo_engine"},
    "workers": {"grpo_engine", "app"},
    "grpo_dashboard": {"grpo_engine", "app", "workers"},
    "migrations": {"app"},
}
# app's folders, lowest first: a module imports only its own folder and the ones before it (the web app reads the
# store only to migrate it at start-up); the workers read the core and the store, never the service or the web app
APP_FOLDERS = ("app.core", "app.store", "app.service", "app.web")
WORKERS_MAY_USE = {"app.core", "app.store"}
# app/web's folders, lowest first: views draw (pure, no Gradio), tabs build the page from them, guards wrap the
# server; the modules of app/web itself (ui, endpoints) assemble the app from all three
WEB_FOLDERS = ("app.web.views", "app.web.tabs", "app.web.guards", "app.web")
TORCH = {"torch", "transformers", "peft", "accelerate", "bitsandbytes", "safetensors"}  # what loads torch
MAX_MODULES = 12  # modules in one folder (its __init__ aside)
TORCH_FREE_ROOMS = ("spec", "data", "rewards", "report")  # the engine's rooms the web process reads
# the engine's rooms (its sub-packages), lowest first: a module imports only its own room and the ones before it.
# algo and report are pure leaves; rewards reads answers; spec validates a run (its reward names among it); data
# loads questions; model builds and loads models; rollout samples and judges; rm learns rewards from judged
# samples; train runs the steps.
ENGINE_ROOMS = ("algo", "report", "rewards", "spec", "data", "model", "rollout", "rm", "train")


def module_imports() -> dict[str, set[str]]:
    """Each project module -> the project modules it imports."""
    files = {
        p: ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for top in PACKAGES
        for p in (ROOT / top).rglob("*.py")
    }
    modules = set(files.values())
    graph = {}
    for path, name in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                # "from pkg import mod" imports pkg.mod; "from mod import name" imports mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_in_a_circle():
    graph = module_imports()
    assert {"grpo_engine.train.checkpoint", "grpo_engine.train.evaluation"} <= graph[
        "grpo_engine.train.trainer"
    ]  # relative imports
    assert {"app.store", "workers.errors"} <= graph["workers.runner"]  # absolute ones
    assert circles(graph) == []


def test_packages_import_only_downward():
    wrong = sorted(
        (a, b)
        for a, targets in module_imports().items()
        for b in targets
        if a.split(".")[0] != b.split(".")[0] and b.split(".")[0] not in ALLOWED[a.split(".")[0]]
    )
    assert wrong == []


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def folder(module: str) -> str:
    """The folder a module sits in, as the layering names it: app.core, app.store, app.service, app.web, or the
    top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "app" and len(parts) > 1 else parts[0]


def test_the_app_folders_import_only_downward_and_the_workers_only_the_core_and_the_store():
    graph = module_imports()
    assert {folder(m) for m in graph if m.startswith("app.")} == set(APP_FOLDERS)
    wrong = []
    for a, targets in graph.items():
        for b in targets:
            fa, fb = folder(a), folder(b)
            if fb in APP_FOLDERS and fa in APP_FOLDERS and APP_FOLDERS.index(fb) > APP_FOLDERS.index(fa):
                wrong.append((a, b))
            if fa == "workers" and fb.startswith("app") and fb not in WORKERS_MAY_USE:
                wrong.append((a, b))
    assert wrong == []


def web_folder(module: str) -> str | None:
    """The folder of app/web a module sits in (``app.web.tabs.run`` -> ``app.web.tabs``, ``app.web.ui`` ->
    ``app.web``); None outside app/web."""
    parts = module.split(".")
    if parts[:2] != ["app", "web"]:
        return None
    return ".".join(parts[:3]) if ".".join(parts[:3]) in WEB_FOLDERS else "app.web"


def upward_imports(place, order: tuple[str, ...]) -> list[tuple[str, str]]:
    """The imports from a module to one placed later in ``order`` (``place``: a module's place, None outside it),
    after checking that every place is in the order and none is left out."""
    graph = module_imports()
    places = {place(m) for m in graph} - {None}
    assert places == set(order), places
    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if place(a) and place(b) and order.index(place(b)) > order.index(place(a))
    )


def test_the_web_apps_folders_import_only_downward():
    assert upward_imports(web_folder, WEB_FOLDERS) == []


def room(module: str) -> str | None:
    """The engine room a module of grpo_engine sits in (``grpo_engine.rollout.sampling`` -> ``rollout``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "grpo_engine" and len(parts) > 2 else None


def test_the_engines_rooms_import_only_downward():
    assert upward_imports(room, ENGINE_ROOMS) == []


def module_level_imports() -> dict[str, set[str]]:
    """Each project module -> every module its top-level statements import (project modules and libraries alike):
    what importing it loads, a function's own imports aside."""
    out = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            found = set()
            stack = list(ast.parse(path.read_text(encoding="utf-8")).body)
            while stack:
                node = stack.pop()
                if isinstance(node, (ast.If, ast.Try)):  # a guarded import still runs at import time
                    stack += (
                        node.body
                        + node.orelse
                        + getattr(node, "finalbody", [])
                        + [s for h in getattr(node, "handlers", []) for s in h.body]
                    )
                elif isinstance(node, ast.Import):
                    found |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        base = ".".join(
                            package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                        )
                    found |= {base} | {f"{base}.{a.name}" for a in node.names}
            out[name] = found
    return out


def loads_torch() -> set[str]:
    """The project modules whose import loads torch (or a library built on it), directly or through another."""
    imports = module_level_imports()
    loaded = {m for m, found in imports.items() if {f.split(".")[0] for f in found} & TORCH}
    while True:
        more = {m for m, found in imports.items() if m not in loaded and found & loaded}
        if not more:
            return loaded
        loaded |= more


def test_no_module_of_the_web_process_and_no_module_of_a_torch_free_engine_room_loads_torch():
    torch_modules = loads_torch()
    assert {"grpo_engine.train.trainer", "grpo_engine.rollout.sampling"} <= torch_modules  # the finder finds them
    assert {m for m in torch_modules if m.startswith("app")} == set()
    torch_free = {m for m in module_imports() if m.startswith(tuple(f"grpo_engine.{r}" for r in TORCH_FREE_ROOMS))}
    assert "grpo_engine.spec.config" in torch_free and torch_free & torch_modules == set()
    torch_rooms = {  # what the web app's modules import of the engine's torch rooms, even inside a function: nothing
        (a, b)
        for a, targets in module_imports().items()
        if a.startswith("app")
        for b in targets
        if b.startswith("grpo_engine.") and b.split(".")[1] not in TORCH_FREE_ROOMS
    }
    assert torch_rooms == set()


def test_no_folder_holds_more_than_a_dozen_modules():
    for top in ("app", "workers", "grpo_engine", "grpo_dashboard"):
        for directory in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            modules = [p for p in directory.glob("*.py") if p.name != "__init__.py"]
            assert len(modules) <= MAX_MODULES, f"{directory.relative_to(ROOT)} holds {len(modules)} modules"


# the tests' folders, each the product folder it tests; the project-wide tests (this file among them) sit at the top
TEST_FOLDERS = {"engine": "grpo_engine", "app": "app", "workers": "workers", "cli": "grpo_dashboard"}
TEST_OTHERS = {"e2e", "browser", "support"}  # the whole product through its processes, in a browser; the helpers


def test_the_tests_folders_mirror_the_product():
    tests = ROOT / "tests"
    wrong = []
    for path in sorted(tests.rglob("test_*.py")):
        parts = path.relative_to(tests).parts
        if len(parts) == 1:
            continue  # project-wide
        top, inner = parts[0], parts[1:-1]
        if top in TEST_OTHERS:
            continue
        product = ROOT / TEST_FOLDERS.get(top, f"<no product folder for tests/{top}>") / Path(*inner)
        if not product.is_dir():
            wrong.append(f"{path.relative_to(ROOT)} (no {product.relative_to(ROOT)})")
    assert wrong == []
    assert {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        TEST_FOLDERS
    ) | TEST_OTHERS
    assert all((d / "__init__.py").is_file() for d in tests.rglob("*") if d.is_dir() and d.name != "__pycache__")
