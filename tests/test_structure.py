"""The plugin's shape, checked: the rules its import graph keeps (every import
counted, lazy and TYPE_CHECKING ones included) and what Hydra's plugin
discovery loads, here and in a Ray worker (it runs at every start of every app
and in every worker, so it loads the Hydra face alone)."""

import ast
import json
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE = "hydra_plugins.hydra_ray_launcher"
SOURCE = Path(__file__).parent.parent / "hydra_plugins" / "hydra_ray_launcher"
# What Hydra's scan loads: the package, its config dataclasses, the launchers.
FACE = {"__init__", "_config", "_launcher", "ray_launcher", "ray_aws_launcher", "ray_jobs_launcher"}
# One module per way of reaching Ray.
LAUNCH_PATHS = {"_local", "_remote", "_jobs_api"}
MAX_LEVELS = 8


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(SOURCE.glob("*.py"))}


def _targets(node: ast.ImportFrom, modules: set[str]) -> set[str]:
    """The package's modules an import statement names."""
    if node.level == 1:
        if node.module:
            return {node.module.split(".")[0]} & modules
        return {a.name for a in node.names} & modules
    if node.module == PACKAGE:
        return {a.name for a in node.names} & modules
    if node.module and node.module.startswith(PACKAGE + "."):
        return {node.module[len(PACKAGE) + 1 :].split(".")[0]} & modules
    return set()


@cache
def _graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    names = set(modules)
    return {
        name: frozenset(
            target
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for target in _targets(node, names)
            if target != name
        )
        for name, tree in modules.items()
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


def test_the_import_graph_has_at_most_eight_levels() -> None:
    graph = _graph()

    @cache
    def level(name: str) -> int:
        return 1 + max((level(dep) for dep in graph[name]), default=0)

    deepest = max(graph, key=level)
    chain = [deepest]
    while graph[chain[-1]]:
        chain.append(max(graph[chain[-1]], key=level))
    assert level(deepest) <= MAX_LEVELS, " -> ".join(chain)


def test_the_implementation_never_imports_the_hydra_face() -> None:
    wrong = {name: deps & FACE for name, deps in _graph().items() if name not in FACE}
    assert {name: deps for name, deps in wrong.items() if deps} == {}


def test_a_launch_path_never_imports_another() -> None:
    graph = _graph()
    assert {name: graph[name] & LAUNCH_PATHS for name in LAUNCH_PATHS} == {
        name: frozenset() for name in LAUNCH_PATHS
    }


def test_the_face_imports_the_implementation_only_when_a_sweep_launches() -> None:
    """At module level the face imports only itself (TYPE_CHECKING blocks aside):
    the implementation comes in inside setup() and launch()."""
    modules = _modules()
    names = set(modules)
    found = {}
    for name in FACE:
        for node in modules[name].body:
            if isinstance(node, ast.ImportFrom):
                impl = _targets(node, names) - FACE
                if impl:
                    found[name] = impl
    assert found == {}


def test_every_exception_of_the_plugin_is_in_the_errors_module() -> None:
    elsewhere = [
        f"{name}.{node.name}"
        for name, tree in _modules().items()
        if name != "_errors"
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
        ours = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("{package}."))
        return {{"launchers": launchers, "modules": ours, "ray": "ray" in sys.modules}}
    """
).format(package=PACKAGE)


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
