"""The plugin's shape, checked: the rules its import graph keeps (every import
counted, lazy and TYPE_CHECKING ones included) and what Hydra's plugin
discovery loads, here and in a Ray worker (it runs at every start of every app
and in every worker, so it loads the Hydra face alone)."""

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

FACE_PACKAGE = "hydra_plugins.hydra_ray_launcher"
REPO = Path(__file__).parent.parent
# What Hydra's scan loads: the package, its config dataclasses, the launchers.
FACE = {
    f"{FACE_PACKAGE}.{name}" if name != "__init__" else FACE_PACKAGE
    for name in (
        "__init__",
        "_config",
        "_launcher",
        "ray_launcher",
        "ray_aws_launcher",
        "ray_jobs_launcher",
    )
}
# The implementation's layers, bottom first: a module imports only from its own
# layer and the ones before it (the top package, FACE's constant, from any).
LAYERS = [
    ["hydra_ray.core"],
    ["hydra_ray.checks", "hydra_ray.infra"],
    ["hydra_ray.engine"],
    ["hydra_ray.driver"],
    ["hydra_ray.launch"],
]
# One module per way of reaching Ray.
LAUNCH_PATHS = {"hydra_ray.launch.local", "hydra_ray.launch.cluster", "hydra_ray.launch.jobs_api"}
MAX_LEVELS = 8


def _name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, ast.Module]:
    files = [
        *sorted((REPO / "hydra_ray").rglob("*.py")),
        *sorted((REPO / "hydra_plugins" / "hydra_ray_launcher").glob("*.py")),
    ]
    return {_name(p): ast.parse(p.read_text(), str(p)) for p in files}


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an import statement of `module` imports from, made absolute."""
    if node.level == 0:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _is_package(module: str) -> bool:
    return module in ("hydra_ray", FACE_PACKAGE) or (
        module.count(".") == 1 and module.startswith("hydra_ray.")
    )


def _targets(module: str, node: ast.ImportFrom) -> set[str]:
    """The modules of ours an import statement names (a name imported from a
    package counts as its submodule when there is one)."""
    names = set(_modules())
    base = _absolute(module, node)
    found = {f"{base}.{a.name}" for a in node.names} & names
    return found or ({base} & names)


@cache
def _graph() -> dict[str, frozenset[str]]:
    return {
        name: frozenset(
            target
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for target in _targets(name, node)
            if target != name
        )
        for name, tree in _modules().items()
    }


def _cycle(graph: dict[str, frozenset[str]]) -> list[str] | None:
    """One import cycle, as the modules along it; None if there is none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)) is not None:
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def _level(graph: dict[str, frozenset[str]]) -> Callable[[str], int]:
    @cache
    def level(name: str) -> int:
        return 1 + max((level(dep) for dep in graph[name]), default=0)

    return level


def test_the_import_graph_has_at_most_eight_levels() -> None:
    graph = _graph()
    level = _level(graph)
    deepest = max(graph, key=level)
    chain = [deepest]
    while graph[chain[-1]]:
        chain.append(max(graph[chain[-1]], key=level))
    assert level(deepest) <= MAX_LEVELS, " -> ".join(chain)


def _layer(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in layer):
            return i
    return None


def test_no_layer_imports_a_layer_above_it() -> None:
    upward = {
        name: sorted(dep for dep in deps if (_layer(dep) or 0) > (_layer(name) or 0))
        for name, deps in _graph().items()
        if _layer(name) is not None
    }
    assert {name: deps for name, deps in upward.items() if deps} == {}


def test_the_data_types_import_nothing_else_of_ours_and_no_ray() -> None:
    core = {name: tree for name, tree in _modules().items() if _layer(name) == 0}
    assert "hydra_ray.core.jobs" in core
    outside = {name: sorted(d for d in _graph()[name] if _layer(d) != 0) for name in core}
    assert {name: deps for name, deps in outside.items() if deps} == {}
    ray = {
        name
        for name, tree in core.items()
        for node in ast.walk(tree)
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ray" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray")
    }
    assert ray == set()


def test_the_implementation_never_imports_the_hydra_face() -> None:
    wrong = {name: deps & FACE for name, deps in _graph().items() if name not in FACE}
    assert {name: deps for name, deps in wrong.items() if deps} == {}


def test_a_launch_path_never_imports_another() -> None:
    graph = _graph()
    assert {name: graph[name] & LAUNCH_PATHS for name in LAUNCH_PATHS} == {
        name: frozenset() for name in LAUNCH_PATHS
    }


def test_the_hydra_face_is_at_most_six_modules() -> None:
    assert {m for m in _modules() if m.startswith(FACE_PACKAGE)} == FACE
    assert len(FACE) <= 6


def test_the_face_imports_the_implementation_only_when_a_sweep_launches() -> None:
    """At module level the face imports only itself (TYPE_CHECKING blocks aside):
    the implementation comes in inside setup() and launch()."""
    modules = _modules()
    found = {}
    for name in FACE:
        for node in modules[name].body:
            if isinstance(node, ast.ImportFrom):
                impl = _targets(name, node) - FACE
                if impl:
                    found[name] = impl
    assert found == {}


def test_every_exception_of_the_plugin_is_in_the_errors_module() -> None:
    elsewhere = [
        f"{name}.{node.name}"
        for name, tree in _modules().items()
        if name != "hydra_ray.core.errors"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and not node.name.startswith("_")
        and any(
            isinstance(base, ast.Name) and base.id.endswith(("Error", "Exception"))
            for base in node.bases
        )
    ]
    assert elsewhere == []


_DISCOVERY = textwrap.dedent(
    """
    import json, sys
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    def discover():
        launchers = [p.__name__ for p in Plugins.instance().discover(Launcher)]
        ours = sorted(m for m in sys.modules if m.startswith(("{package}", "hydra_ray")))
        return {{"launchers": launchers, "modules": ours, "ray": "ray" in sys.modules}}
    """
).format(package=FACE_PACKAGE)


def _check(found: dict[str, Any]) -> None:
    assert {"RayLauncher", "RayAWSLauncher", "RayJobsLauncher"} <= set(found["launchers"])
    assert set(found["modules"]) <= FACE, found


def test_plugin_discovery_loads_the_face_alone() -> None:
    script = _DISCOVERY + "print(json.dumps(discover()))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    found = json.loads(out.stdout)
    _check(found)
    assert found["ray"] is False  # nor Ray


def test_plugin_discovery_in_a_ray_worker_loads_the_face_alone(ray_session: str) -> None:
    script = _DISCOVERY + textwrap.dedent(
        f"""
        import ray
        ray.init(address={ray_session!r}, log_to_driver=False)
        print(json.dumps(ray.get(ray.remote(num_cpus=0.1)(discover).remote())))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    _check(json.loads(out.stdout.strip().splitlines()[-1]))
