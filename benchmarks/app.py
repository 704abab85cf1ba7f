"""The app every launcher runs in the benchmark: sleeps `seconds`, returns `i`.

With BENCH_TIMES set, each job appends its start and end (time.time()), its
process and that process's CPU time so far to that file, and the launching
process appends its peak RSS (bytes) at exit: the benchmark reads both from
there (between two jobs in one worker process, the CPU time it spent is what
one job costs there, the launcher's work around it included)."""

import atexit
import os
import time

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg: DictConfig) -> int:
    started = time.time()
    if cfg.seconds:
        time.sleep(cfg.seconds)
    if os.environ.get("BENCH_TIMES"):
        with open(os.environ["BENCH_TIMES"], "a") as f:
            f.write(f"job {started} {time.time()} {os.getpid()} {time.process_time()}\n")
    return int(cfg.i)


def _peak_rss() -> None:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(os.environ["BENCH_TIMES"], "a") as f:
        f.write(f"rss {kib * 1024}\n")


if __name__ == "__main__":
    if os.environ.get("BENCH_TIMES") and os.path.exists("/proc/self/status"):
        atexit.register(_peak_rss)  # in the launching process only
    main()
