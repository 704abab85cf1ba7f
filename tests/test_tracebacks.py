"""A job's exception crosses processes (worker -> driver -> launching machine,
and into its record) with its traceback and causes, as Hydra 1.4's conformance
suite asks; these cases run on every Hydra."""

import pickle
import traceback
from pathlib import Path

import cloudpickle

from hydra_ray.core.tracebacks import unpack
from hydra_ray.engine.worker import _portable_error


class _Unpicklable(Exception):
    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("cannot pickle this")


def _fails() -> None:
    try:
        raise ValueError("the cause")
    except ValueError as cause:
        raise RuntimeError("the failure") from cause


def _travelled(exc: BaseException, hops: int = 2) -> BaseException:
    """exc as the launching machine gets it: pickled at each hop, as Ray and
    the head's returns file do."""
    packed = _portable_error(exc, 0, "node")
    for _ in range(hops):
        packed = unpack(cloudpickle.loads(cloudpickle.dumps(packed)))
    return packed


def test_the_frames_and_the_cause_come_back_after_two_hops() -> None:
    try:
        _fails()
    except RuntimeError as exc:
        back = _travelled(exc)
    frames = traceback.extract_tb(back.__traceback__)
    assert [f.name for f in frames][-1] == "_fails"
    assert Path(frames[-1].filename).name == Path(__file__).name
    assert frames[-1].line == 'raise RuntimeError("the failure") from cause'
    text = "".join(traceback.TracebackException.from_exception(back).format())
    assert "ValueError: the cause" in text
    assert "The above exception was the direct cause" in text
    assert "RuntimeError: the failure" in text
    assert pickle.loads(pickle.dumps(back)).args == ("the failure",)


def test_a_cause_that_cannot_pickle_is_dropped_and_the_frames_stay() -> None:
    try:
        try:
            raise _Unpicklable("inner")
        except _Unpicklable as cause:
            raise RuntimeError("outer") from cause
    except RuntimeError as exc:
        back = _travelled(exc)
    assert isinstance(back, RuntimeError) and back.__cause__ is None
    assert traceback.extract_tb(back.__traceback__)[-1].name == (
        "test_a_cause_that_cannot_pickle_is_dropped_and_the_frames_stay"
    )


def test_an_exception_that_cannot_pickle_becomes_a_job_error_with_its_frames() -> None:
    try:
        raise _Unpicklable("itself")
    except _Unpicklable as exc:
        back = _travelled(exc)
    assert type(back).__name__ == "JobError" and "_Unpicklable: itself" in str(back)
    assert traceback.extract_tb(back.__traceback__)[-1].line == 'raise _Unpicklable("itself")'
