"""The package in layers: one-way imports, no cycles, heavy dependencies only where they are needed.

Every ``import`` statement of ``workbench/`` is read with ``ast``, wherever it sits (module level, inside a
function, under ``TYPE_CHECKING``): an import inside a function is still a dependency, so it may not dodge the
rule or close a cycle.

Besides the order of the layers, the lab reads results and never runs a model: it imports neither
``workbench.train`` nor ``workbench.agents`` (`READ_ONLY`); what trains or runs models sits in ``jobs``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"

LAYERS = ("core", "tasks", "config", "agents", "train", "lab", "jobs")
"""Bottom to top: a module imports only from its own layer or a lower one."""
READ_ONLY = {"lab": ("agents", "train")}
"""Layers that may not import some lower ones: the lab reads run directories and never trains or loads a
model, so it can start nothing."""
ROOMS = {"agents": ("plan", "forward", "generation", "models")}
"""Rooms of a layer, bottom to top: a module in a room imports only from its own room or a lower one (the
layer's ``__init__`` facade may import any)."""
TOP = {"workbench", "workbench.__main__", "workbench.hacpo"}
"""Entry points above every layer (``hacpo`` is the math facade and may import ``core`` only)."""

HEAVY_ALLOWED = {
    "torch": {"core", "agents", "train", "lab"},
    "transformers": {"agents"},
    "peft": {"agents"},
    "bitsandbytes": {"agents"},
    "tokenizers": {"agents"},
    "altair": {"lab.plots"},
    "ipywidgets": {"lab.widgets"},
    "papermill": {"jobs.runner"},
    "ray": {"train.executors"},
}
"""Where each heavy third-party package may be imported (a layer, or one ``layer.module``)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Absolute names ``path`` imports (``from a import b`` also gives ``a.b``, which may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {
    name: sorted({imp for imp in _imports(path) if imp in MODULES and imp != name})
    for name, path in MODULES.items()
}


def _layer(module: str) -> int:
    if module in TOP:
        return len(LAYERS)
    return LAYERS.index(module.split(".")[1])


def test_every_module_sits_in_a_layer():
    stray = [m for m in MODULES if m not in TOP and (m.count(".") < 1 or m.split(".")[1] not in LAYERS)]
    assert stray == [], f"modules outside the layers {LAYERS}: {stray}"


def test_imports_only_go_down_or_sideways():
    upward = [
        f"{module} (layer {LAYERS[_layer(module)] if module not in TOP else 'top'}) imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upward == [], "upward imports:\n" + "\n".join(upward)


@pytest.mark.parametrize("layer", sorted(ROOMS))
def test_rooms_of_a_layer_import_only_down_or_sideways(layer):
    rooms = ROOMS[layer]
    prefix = f"workbench.{layer}."
    stray = [m for m in MODULES if m.startswith(prefix) and m.split(".")[2] not in rooms]
    assert stray == [], f"modules of workbench.{layer} outside its rooms {rooms}: {stray}"
    upward = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module.startswith(prefix)
        for target in targets
        if target.startswith(prefix) and rooms.index(target.split(".")[2]) > rooms.index(module.split(".")[2])
    ]
    assert upward == [], f"upward imports between the rooms of workbench.{layer}:\n" + "\n".join(upward)


@pytest.mark.parametrize("layer", sorted(READ_ONLY))
def test_read_only_layers_never_import_what_trains_or_runs_models(layer):
    forbidden = READ_ONLY[layer]
    offenders = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[1:2] == [layer]
        for target in targets
        if target.split(".")[1:2] and target.split(".")[1] in forbidden
    ]
    assert offenders == [], f"workbench.{layer} must not import {forbidden}:\n" + "\n".join(offenders)


def test_the_lab_loads_without_models_or_training():
    """At run time too: importing every lab module pulls in no trainer, no agent and no transformers."""
    code = (
        "import pkgutil, importlib, sys, workbench.lab\n"
        "for m in pkgutil.walk_packages(workbench.lab.__path__, 'workbench.lab.'):\n"
        "    importlib.import_module(m.name)\n"
        "above = ('workbench.train', 'workbench.agents', 'workbench.jobs', 'transformers', 'peft')\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith(above))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"workbench.lab pulled in: {out.stdout.strip()}"


def test_the_math_facade_imports_core_only():
    assert all(t.startswith("workbench.core.") for t in GRAPH["workbench.hacpo"]), GRAPH["workbench.hacpo"]


def test_no_import_cycles():
    """Depth-first search over the module graph (package ``__init__`` facades included)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in GRAPH[node]:
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for module in MODULES:
        if module not in state:
            visit(module, [module])
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", sorted(HEAVY_ALLOWED))
def test_heavy_dependencies_stay_in_their_layers(package):
    allowed = HEAVY_ALLOWED[package]
    offenders = [
        module
        for module, path in MODULES.items()
        if module not in TOP
        and any(imp == package or imp.startswith(f"{package}.") for imp in _imports(path))
        and not (module.split(".")[1] in allowed or ".".join(module.split(".")[1:3]) in allowed)
    ]
    assert offenders == [], f"{package} imported outside {sorted(allowed)}: {offenders}"


def test_math_modules_import_no_heavy_dependency():
    """At run time too: ``workbench.hacpo`` pulls in torch and nothing heavier."""
    heavy = ["transformers", "peft", "bitsandbytes", "altair", "ipywidgets", "papermill", "pandas"]
    code = (
        "import sys, workbench.hacpo, workbench.core.types\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"workbench.hacpo pulled in: {out.stdout.strip()}"


def test_config_and_tasks_load_without_torch():
    """Reading an experiment YAML or generating problems never pays for torch."""
    code = (
        "import sys, workbench.config, workbench.tasks, workbench.tasks.loaders\n"
        "print(','.join(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"workbench.config / workbench.tasks pulled in: {out.stdout.strip()}"


MAX_MODULE_LINES = 400
"""The longest a module may grow: past it, a reader scrolls instead of reading, and it is time to split."""


def test_no_module_is_longer_than_the_limit():
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"
