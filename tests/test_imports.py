"""The package's import graph has no circle: every module of custom/prrfl can be read knowing only the
modules it imports. All imports count, those inside functions and under TYPE_CHECKING too."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "custom" / "prrfl"


def module_files(package: Path) -> dict[str, Path]:
    files = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that module `name` imports (a name imported from a package counts as its
    submodule when there is one)."""
    root = name.split(".")[0]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name defined in a.b
                target = target.rpartition(".")[0]
            if target and target.split(".")[0] == root and target != name:
                found.add(target)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    files = module_files(package)
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_package_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert {"prrfl.config", "prrfl.methods.method"} <= graph["prrfl.registry"]  # the graph is read
    assert circles(graph) == []


def test_the_check_finds_a_circle_through_type_checking_and_function_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (package / "c.py").write_text("import pkg.a\nx = 1\n")
    (package / "d.py").write_text("from pkg import c\n")
    assert circles(import_graph(package)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def top_level_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph of the package's top-level parts (prrfl.server.federation -> server): part -> parts it imports."""

    def part(module: str) -> str:
        names = module.split(".")
        return names[1] if len(names) > 1 else names[0]

    parts: dict[str, set[str]] = {}
    for module, imported in graph.items():
        parts.setdefault(part(module), set()).update(part(m) for m in imported if part(m) != part(module))
    return parts


def test_the_top_level_parts_form_no_loop():
    """A folder can be read knowing only the folders below it: the site's loop runs methods, methods use the
    server's cores, the FLARE glue sits on top of everything."""
    parts = top_level_graph(import_graph(PACKAGE))
    assert {"server", "site", "methods", "flare", "tasks"} <= set(parts)  # the graph is read
    assert "server" in parts["methods"] and "methods" in parts["site"]
    assert circles(parts) == []


def test_only_the_flare_glue_and_its_callers_import_flare():
    parts = top_level_graph(import_graph(PACKAGE))
    users = sorted(p for p, imported in parts.items() if "flare" in imported)
    assert users == ["cli", "sweep"]  # the command line and the sweeps run jobs; no method, task, site or server part does


def nvflare_importers(package: Path) -> set[str]:
    """The package's modules that import nvflare anywhere: at the top, in a function or under TYPE_CHECKING."""
    found = set()
    for name, path in module_files(package).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            if any(target.split(".")[0] == "nvflare" for target in targets):
                found.add(name)
    return found


def test_only_the_flare_glue_imports_nvflare():
    """FLARE is used in one folder, prrfl/flare/ (its deployment on provisioned kits and POC processes too); every
    other module, and every module the glue imports from outside it, runs without FLARE."""
    importers = nvflare_importers(PACKAGE)
    assert {"prrfl.flare.deployment", "prrfl.flare.components.aggregators"} <= importers  # function-level imports count
    assert sorted(m for m in importers if not m.startswith("prrfl.flare.")) == []


def test_the_server_cores_load_no_nvflare_module():
    """The server's cores, the round logic and the site-side cores the FLARE components wrap (the DET pair, the prototype
    tracker) are FLARE-free: importing them (and every method) loads no nvflare module."""
    code = (
        "import prrfl.server.aggregation, prrfl.server.checks, prrfl.server.class_statistics, prrfl.server.federation, "
        "prrfl.keys, prrfl.registry, prrfl.methods.prr, prrfl.site.trainer, prrfl.algorithms.det, prrfl.algorithms.class_prototypes"
    )
    assert packages_loaded(code, "nvflare") == []


def packages_loaded(code: str, package: str) -> list[str]:
    """The modules of `package` that running `code` in a fresh interpreter (this checkout's prrfl) has loaded."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == {package!r}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    )
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_a_server_building_a_dermoscopy_task_loads_no_torchvision():
    """A FLARE server builds its task (metrics, cohorts, the reference model) but never augments: torchvision, whose
    import costs seconds of CPU (it loads torch._dynamo), waits for the first blurred batch of a site."""
    code = (
        "from prrfl.config import RunConfig; from prrfl.registry import build_task, build_method; "
        "cfg = RunConfig.from_dict({'task': 'derm', 'method': 'prr'}); task = build_task(cfg); build_method(cfg, task); "
        "task.build_model()"
    )
    assert packages_loaded(code, "torchvision") == []


def test_no_two_modules_share_a_file_name_outside_the_task_packages():
    """A module of prrfl is known by its file name alone: no two share one (flare/'s modules among them), outside the
    task packages (tasks/<task>/ repeat task.py, cache.py, ... on purpose: one package per task, behind the contract)."""
    task_packages = [p.parent for p in (PACKAGE / "tasks").glob("*/__init__.py")]
    assert len(task_packages) >= 2
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and not any(p.is_relative_to(t) for t in task_packages)]
    names = [p.name for p in modules]
    assert {"server_workflow.py", "site_app.py", "workflow.py", "deployment.py", "contract.py"} <= set(
        names
    )  # flare/, components/, tasks/ read
    clashes = sorted(str(p.relative_to(PACKAGE)) for p in modules if names.count(p.name) > 1)
    assert clashes == []
