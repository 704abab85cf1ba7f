"""A test app whose jobs ask Ray for what their own `model` config says
(hydra.launcher.ray.remote interpolates into it), and each record what Ray
gave them: the resources assigned to the task and CUDA_VISIBLE_DEVICES."""

import json
import os
import time
from pathlib import Path
from typing import Any

import hydra
import ray
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="resources_app")
def main(cfg: DictConfig) -> Any:
    got = {
        "model": cfg.model.name,
        "assigned": ray.get_runtime_context().get_assigned_resources(),  # type: ignore[no-untyped-call]
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "start": time.time(),
    }
    time.sleep(cfg.seconds)
    got["end"] = time.time()
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / "resources.json").write_text(json.dumps(got))
    return got


if __name__ == "__main__":
    main()
