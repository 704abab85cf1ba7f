"""A test app whose jobs each write `big.bin`, `mb` MiB of random bytes, in their
output dir (slow to bring home), then succeed."""

import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="big_output")
def main(cfg: DictConfig) -> int:
    out = Path(HydraConfig.get().runtime.output_dir)
    with (out / "big.bin").open("wb") as f:
        for _ in range(int(cfg.mb)):
            f.write(os.urandom(2**20))
    return int(cfg.x)


if __name__ == "__main__":
    main()
