"""What one turn of the engine's loop costs when every job of a sweep is in
flight, against the same turn with the engine's in-flight limit.

Each turn calls ray.wait over the attempts in flight (streaming generators,
as the engine submits them). Before the limit, a 10,000-job sweep had all
10,000 in flight, so every turn, and so every job, paid for the whole sweep:
the loop was quadratic. This measures that turn on a local Ray, with tasks
that stay pending (they ask for a resource no node has), so that nothing
but the wait itself is timed.

Run by hand, on an otherwise idle machine:

    .venv/bin/python benchmarks/bench_engine_loop.py
"""

import statistics
import time
from typing import Any

import ray

from hydra_ray.engine.run import IN_FLIGHT_MIN

SIZES = tuple(sorted({100, IN_FLIGHT_MIN, 1_000, 10_000}))
TURNS = 30


def _never_runs() -> Any:
    yield 1


def turn_cost(refs: list[Any]) -> float:
    """Median seconds of one turn: a ray.wait for one ready item, that finds none."""
    times = []
    for _ in range(TURNS):
        started = time.perf_counter()
        ray.wait(list(refs), num_returns=1, timeout=0)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    task = ray.remote(_never_runs).options(
        num_returns="streaming", resources={"no-such-resource": 1}
    )
    try:
        costs = {}
        for size in SIZES:
            refs = [task.remote() for _ in range(size)]
            costs[size] = turn_cost(refs)
            for ref in refs:
                ray.cancel(ref)
        base = costs[IN_FLIGHT_MIN]
        print(f"One turn of the loop (ray.wait over what is in flight, median of {TURNS}):")
        for size, cost in costs.items():
            print(f"  {size:>6} in flight: {cost * 1e3:8.2f} ms  ({cost / base:5.2f}x the limit's)")
        jobs = 10_000
        # A sweep has about two turns per job (its start, its end) at worst.
        print(
            f"Over a {jobs}-job sweep (2 turns a job): all in flight "
            f"{2 * jobs * costs[10_000]:.1f} s of waits, with the limit "
            f"{2 * jobs * base:.1f} s ({costs[10_000] / base:.1f}x less)"
        )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
