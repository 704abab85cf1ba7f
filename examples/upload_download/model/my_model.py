import logging
import pickle
import random
from pathlib import Path

log = logging.getLogger(__name__)


class MyModel:
    def __init__(self, random_seed: int) -> None:
        log.info("Init my model")
        self.weights = random.Random(random_seed).random()

    def save(self, path: Path) -> None:
        path.write_bytes(pickle.dumps({"weights": self.weights}))
