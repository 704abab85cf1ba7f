"""A test app whose jobs write the APP_SECRET they got from Ray's runtime_env
into their own dir, and return x."""

import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="secret_app")
def main(cfg: DictConfig) -> int:
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / "secret_seen").write_text(os.environ.get("APP_SECRET", ""))
    return int(cfg.x)


if __name__ == "__main__":
    main()
