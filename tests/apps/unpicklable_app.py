"""A test app whose job returns, for the values of x in `unpicklable_on`, a
value that Ray carries back (a serializer registered in the job's worker) but
that cloudpickle refuses: the launcher's record of that job cannot be written."""

import time
from typing import Any

import hydra
from omegaconf import DictConfig


class Unpicklable:
    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        raise TypeError("an Unpicklable cannot be pickled")

    def __repr__(self) -> str:
        return f"Unpicklable({self.value})"


@hydra.main(version_base=None, config_path=".", config_name="unpicklable_app")
def main(cfg: DictConfig) -> Any:
    time.sleep(cfg.seconds)
    if cfg.x in cfg.unpicklable_on:
        import ray

        ray.util.register_serializer(
            Unpicklable, serializer=lambda obj: obj.value, deserializer=Unpicklable
        )
        return Unpicklable(cfg.x)
    return cfg.x * 10


if __name__ == "__main__":
    main()
