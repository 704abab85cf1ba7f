"""A test app whose jobs write which node they ran on (a checkpoint naming it).
With `fail_on_last_node`, a job that runs on the last node of `ray.nodes()`
writes a partial checkpoint there, then takes that node's CPU for a while (an
actor that ends itself) and fails: its retry runs on another node. So one job's
failed attempt leaves its files on one node, its recorded attempt on another."""

import hashlib
import os
import threading
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


class NodeHog:
    """Holds a CPU of its node for `seconds`, then ends its own process."""

    def __init__(self, seconds: float) -> None:
        threading.Timer(seconds, os._exit, [0]).start()


@hydra.main(version_base=None, config_path=".", config_name="node_app")
def main(cfg: DictConfig) -> str:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    out = Path(HydraConfig.get().runtime.output_dir)
    time.sleep(cfg.seconds)
    last = [n for n in ray.nodes() if n["Alive"]][-1]  # type: ignore[no-untyped-call]
    fails = cfg.fail_on_last_node and last["NodeManagerAddress"] == node
    (out / "checkpoint.txt").write_text(f"{'partial' if fails else 'final'} from {node}")
    if fails:
        (out / f"partial_from_{node}").write_text("")
        ray.remote(num_cpus=1)(NodeHog).options(
            name="hog-" + hashlib.sha256(str(out).encode()).hexdigest()[:16],
            get_if_exists=True,
            lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(last["NodeID"], soft=False),
        ).remote(cfg.hog_seconds)
        raise RuntimeError(f"x={cfg.x} fails on {node}")
    return str(node)


if __name__ == "__main__":
    main()
