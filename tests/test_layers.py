"""The layering of ARCHITECTURE.md, read from the source (every import statement, module level or not):

engine (grpo_engine) <- shared core <- store <- {web app, workers} <- CLI (grpo_dashboard); the core, the store
and the web app are modules of the ``app`` package, and migrations run against the store. No module and no
package imports in a circle. (That the live web process never loads
torch is checked on a real server: tests/test_ui_server.py::test_server_process_has_not_loaded_torch.)
"""

from __future__ import annotations

import ast

from tests.servers import ROOT

PACKAGES = ("grpo_engine", "app", "workers", "grpo_dashboard", "migrations")
# what each package may import from the others
ALLOWED = {
    "grpo_engine": set(),
    "app": {"grpo_engine"},
    "workers": {"grpo_engine", "app"},
    "grpo_dashboard": {"grpo_engine", "app", "workers"},
    "migrations": {"app"},
}
CORE = {"app.settings", "app.paths", "app.auth", "app.broker", "app.run_status", "app.admission"}  # the shared core
STORE = {
    "app.models",
    "app.db",
    "app.store",
    "app.store.runs",
    "app.store.records",
    "app.store.manage",
    "app.store.search",
}


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
    assert {"grpo_engine.checkpoint", "grpo_engine.tokenization"} <= graph["grpo_engine.trainer"]  # relative imports
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


def test_core_and_store_sit_below_the_web_app_and_the_workers():
    graph = module_imports()
    web = {m for m in graph if m.startswith("app.")} - CORE - STORE
    assert {"app.ui", "app.api", "app.render", "app.endpoints"} <= web
    assert {(a, b) for a in CORE for b in graph[a] if b in STORE | web} == set()  # the core imports neither
    assert {(a, b) for a in STORE for b in graph[a] if b in web} == set()  # the store imports no web module
    workers_to_app = {
        b
        for a, targets in graph.items()
        if a.startswith(("workers", "grpo_engine"))
        for b in targets
        if b.startswith("app")
    }
    assert workers_to_app and workers_to_app <= CORE | STORE, workers_to_app - CORE - STORE
