"""A job's exception back on the launching side with its traceback and its causes.

Pickling an exception keeps its args and `__dict__` only: its traceback (which
cannot pickle), `__cause__` and `__context__` are lost on the way from the
worker. `pack` stores them in the exception's `__dict__` (the frames as plain
file, line, name tuples); `unpack`, on the other side, sets the causes again
and gives the exception a traceback of stand-in frames with the worker's file
names, line numbers and function names: `traceback` prints it as the worker's
(with source lines where the file exists here) and `extract_tb` reads it the same.
The packed data stays in `__dict__`, so the exception travels on (head driver ->
launching machine, job records) with it.
"""

import sys
import traceback
import types
from typing import Any

_KEY = "_hydra_ray_trace"
_MAX_CHAIN = 16


class _Marker(Exception):
    pass


def pack(exc: BaseException, _depth: int = 0) -> None:
    """Store exc's frames and causes (recursively) in its `__dict__`."""
    if _KEY in exc.__dict__ or _depth > _MAX_CHAIN:
        return
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    cause, context = exc.__cause__, exc.__context__
    for linked in (cause, context):
        if linked is not None:
            pack(linked, _depth + 1)
    exc.__dict__[_KEY] = (frames, cause, context, exc.__suppress_context__)


def drop_chain(exc: BaseException) -> None:
    """Keep exc's own frames only (its causes would not pickle)."""
    packed = exc.__dict__.get(_KEY)
    if packed is not None:
        exc.__dict__[_KEY] = (packed[0], None, None, packed[3])


def unpack(exc: Any, _depth: int = 0) -> Any:
    """exc with its causes and a stand-in traceback, if `pack` stored them."""
    if not isinstance(exc, BaseException) or _depth > _MAX_CHAIN:
        return exc
    packed = exc.__dict__.get(_KEY)
    if packed is None:
        return exc
    frames, cause, context, suppress = packed
    if cause is not None:
        exc.__cause__ = unpack(cause, _depth + 1)
    if context is not None:
        exc.__context__ = unpack(context, _depth + 1)
    exc.__suppress_context__ = suppress
    if exc.__traceback__ is None:
        exc.__traceback__ = _stand_in(frames)
    return exc


def _stand_in(frames: list[tuple[str, int, str]]) -> types.TracebackType | None:
    tb: types.TracebackType | None = None
    for filename, lineno, name in reversed(frames):
        code = compile("\n" * max(lineno - 1, 0) + "raise _Marker", filename, "exec")
        code = code.replace(co_name=name)
        if sys.version_info >= (3, 11):
            code = code.replace(co_qualname=name)
        try:
            exec(code, {"_Marker": _Marker})
        except _Marker:
            raised = sys.exc_info()[2]
            assert raised is not None and raised.tb_next is not None
            frame = raised.tb_next
            tb = types.TracebackType(tb, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return tb
