"""A test app that saves its work when it is stopped: each job works in steps
of 0.1 s for `seconds`; on KeyboardInterrupt (the launcher's catchable stop of
a job past its timeout) it writes `checkpoint` in its job dir and re-raises. A
job that finds its checkpoint (a later attempt, in the same dir) finishes at
once. It touches `working` in its job dir when its work starts. With
`ignore_stop`, a job notes the stop and works on (it is then cancelled by
force)."""

import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="checkpoint_app")
def main(cfg: DictConfig) -> str:
    here = Path(HydraConfig.get().runtime.output_dir)
    checkpoint = here / "checkpoint"
    if checkpoint.exists():
        (here / "resumed").write_text(checkpoint.read_text())
        return "resumed"
    (here / "working").touch()
    step = 0
    end = time.monotonic() + cfg.seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.1)
            step += 1
        except KeyboardInterrupt:
            if cfg.ignore_stop:
                (here / "stop_ignored").touch()
                continue
            checkpoint.write_text(str(step))
            raise
    (here / "done").touch()
    return "done"


if __name__ == "__main__":
    main()
