"""The app's script as each job's `__main__`, and the job's own command line as
its `sys.argv`: a job runs as `python train.py <its overrides>` would.

cloudpickle ships the task function of a script by value; in a Ray worker,
`__main__` is Ray's own worker script, so plain pickle (multiprocessing, torch.save,
joblib) cannot find the script's classes and functions by name. Here the launching
side captures the script's source (`script_of`); each worker process makes a
module of it once per launch (`load`), with the file's path on that node, and
every job runs inside `as_main`: that module as `sys.modules["__main__"]`, the
job's argv as `sys.argv`, both put back after the job.

The module runs with `__name__ == "__main__"`, so its classes and loggers are
named as under plain Python, except in the tests of its top-level `if`s, which
read `__name__` as multiprocessing's children do (`"__mp_main__"`): the
`if __name__ == "__main__":` block does not run. No Ray here.
"""

import ast
import contextlib
import importlib.machinery
import linecache
import os
import signal
import sys
import tokenize
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hydra.types import TaskFunction
from omegaconf.basecontainer import BaseContainer

from hydra_ray.core.jobs import Script
from hydra_ray.core.redact import redacting_logger

log = redacting_logger(__name__)


def script_of(task_function: TaskFunction) -> Script | None:
    """The script that was run (`__main__`), read as it is now, with where the
    task function is in it (None if the script imports it from elsewhere); None
    when there is no script file (`python -c`, a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return None
    code = getattr(task_function, "__code__", None)
    own = getattr(task_function, "__module__", None) == "__main__" and code is not None
    try:
        with tokenize.open(path) as f:  # in the encoding it declares
            source = f.read()
    except (OSError, SyntaxError) as exc:
        log.debug(f"The app's script {path} cannot be read ({exc}): its task is shipped alone")
        return None
    spec = getattr(main, "__spec__", None)
    return Script(
        source=source,
        path=os.path.abspath(path),
        sent_as=None,
        cwd_sent_as=None,
        module=spec.name if spec is not None else None,
        package=spec.parent if spec is not None else None,
        task=(task_function.__qualname__, code.co_firstlineno) if own and code else None,
    )


def sent_from(script: Script, source_dir: str, cwd: str) -> Script:
    """`script` as the jobs find it when sync_up sends `source_dir` to a cluster:
    by its path inside that dir, on their sys.path; and the launch's working dir
    `cwd`, where it is in that dir (unchanged for what is outside)."""
    root = Path(source_dir).expanduser().resolve()

    def inside(path: str) -> str | None:
        resolved = Path(path).resolve()
        return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else None

    return replace(script, sent_as=inside(script.path), cwd_sent_as=inside(cwd))


def left_out_warning(script: Script | None, staged: Path | None) -> str | None:
    """What will not work on the cluster when sync_up does not send the script
    (`staged`: the code as filtered to send, None when none is sent); None if it is sent."""
    if script is None:
        return None
    if staged is not None and script.sent_as is not None and (staged / script.sent_as).is_file():
        return None
    name = Path(script.path).name
    how = (
        f"set hydra.launcher.sync_up.source_dir (e.g. '.') to the dir that holds {name}"
        if script.sent_as is None
        else f"add '{script.sent_as}' to hydra.launcher.sync_up.include"
    )
    return (
        f"The app's script {name} is not in what hydra.launcher.sync_up sends: the jobs run "
        "it from the source launched, but what needs the file on the cluster will fail there: "
        "relaunching the script (PyTorch Lightning's DDP ranks, torchrun) and multiprocessing's "
        f"spawn start method. To send it, {how}"
    )


@dataclass(frozen=True)
class Main:
    """The app's script made a module in this process, or why it could not be."""

    # None: it could not be made (`why`); the jobs run the task as shipped.
    module: types.ModuleType | None
    # The script's path on this node (its argv[0]).
    path: str
    task: TaskFunction | None
    why: str = ""
    # The launch's working dir on this node, where sync_up sent it: the jobs'
    # original cwd (Hydra's get_original_cwd()); None: the launching machine's.
    cwd: str | None = None


def load(script: Script, overrides: Sequence[str]) -> Main:
    """Run the script's source as a module, as `__main__` with `overrides` as its
    command line (module-level code may read them), and find the task function in it.

    The script may register OmegaConf resolvers without replace=True: the sweep's
    state already has them, so it runs with none registered, then its own join
    (and win over) the others."""
    path, cwd = _on_this_node(script)
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__spec__ = (
        importlib.machinery.ModuleSpec(script.module, None, origin=path) if script.module else None
    )
    module.__package__ = script.package
    try:
        tree = ast.parse(script.source, filename=path)
        code = compile(_NotMain().visit(tree), path, "exec", dont_inherit=True)
    except SyntaxError as exc:  # a Python older than the launching machine's
        return Main(None, path, None, f"its source does not compile here: {exc}")
    # Tracebacks and inspect.getsource show the source that runs, even where the
    # file on this node differs.
    lines = script.source.splitlines(keepends=True)
    linecache.cache[path] = (len(script.source), None, lines, path)
    registered = BaseContainer._resolvers
    BaseContainer._resolvers = {}
    try:
        with as_main(module, path, overrides):
            exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:  # whatever the app's module-level code raises
        return Main(None, path, None, f"its module-level code raised {type(exc).__name__}: {exc}")
    finally:
        BaseContainer._resolvers = {**registered, **BaseContainer._resolvers}
    if script.task is None:  # the script imports it: it runs as shipped
        return Main(module, path, None, cwd=cwd)
    task = _task_in(module, script)
    if task is None:
        return Main(None, path, None, f"{script.task[0]} is not in it as launched")
    return Main(module, path, task, cwd=cwd)


@contextlib.contextmanager
def as_main(module: types.ModuleType | None, path: str, overrides: Sequence[str]) -> Iterator[None]:
    """`module` as `sys.modules["__main__"]` (unless None) and `[path, *overrides]`
    as `sys.argv`, as they were before once the block ends."""
    main, argv = sys.modules.get("__main__"), sys.argv
    if module is not None:
        sys.modules["__main__"] = module
    sys.argv = [path, *overrides]
    try:
        yield
    finally:
        sys.argv = argv
        if module is not None:
            if main is None:
                sys.modules.pop("__main__", None)
            else:
                sys.modules["__main__"] = main


_ray_sigterm: list[Any] = []


def plain_children() -> None:
    """Processes this Ray worker forks (a fork Pool, a DataLoader's workers) get
    SIGTERM's default action, as under plain Python, not Ray's worker handler,
    which raises SystemExit wherever it lands: in a child's at-fork hooks it is
    ignored, and `with Pool(...)`, whose end terminates its workers, waited
    forever on the child that lived on. SIGTERM stays blocked from before the
    fork until the child has the default action (a SIGTERM meanwhile then ends
    it). Once per process; a handler the job sets itself is left as it is."""
    if _ray_sigterm:
        return
    _ray_sigterm.append(signal.getsignal(signal.SIGTERM))
    blocked: list[bool] = []

    def before() -> None:
        if signal.getsignal(signal.SIGTERM) is _ray_sigterm[0]:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            blocked.append(True)

    def unblock() -> None:
        if blocked:
            blocked.clear()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def in_child() -> None:
        if blocked:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        unblock()

    os.register_at_fork(before=before, after_in_parent=unblock, after_in_child=in_child)


def _on_this_node(script: Script) -> tuple[str, str | None]:
    """The script's path here, and the launch's working dir here if sync_up sent
    it: in the code sync_up sent (a dir on sys.path), else where it was launched
    (the same machine, a shared disk); that path anyway where neither has it
    (the launch warned: see `left_out_warning`)."""
    if script.sent_as is not None:
        for root in sys.path:
            path = os.path.join(root, script.sent_as)
            if os.path.isabs(root) and os.path.isfile(path):
                cwd = script.cwd_sent_as
                return path, None if cwd is None else os.path.normpath(os.path.join(root, cwd))
    return script.path, None


def _task_in(module: types.ModuleType, script: Script) -> TaskFunction | None:
    """The task function as the module defines it: by its qualified name, then
    through decorators' `__wrapped__` (hydra.main's) to the one on the same line."""
    assert script.task is not None
    qualname, line = script.task
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    seen: set[int] = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        code = getattr(obj, "__code__", None)
        if code is not None and code.co_firstlineno == line and obj.__qualname__ == qualname:
            task: TaskFunction = obj
            return task
        obj = getattr(obj, "__wrapped__", None)
    return None


class _NotMain(ast.NodeTransformer):
    """In the tests of the module's own `if`s and conditional expressions (not
    those in its functions and classes), `__name__` reads "__mp_main__"."""

    def visit_If(self, node: ast.If) -> ast.AST:
        node.test = _AsMpMain().visit(node.test)
        return self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        node.test = _AsMpMain().visit(node.test)
        return self.generic_visit(node)

    def _unchanged(self, node: ast.AST) -> ast.AST:
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _unchanged


class _AsMpMain(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == "__name__" and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Constant("__mp_main__"), node)
        return node
