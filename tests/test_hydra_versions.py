"""Which Hydra and OmegaConf the suite runs on: scripts/test.sh runs a part of it a
second time with Hydra 1.4 and OmegaConf 2.4 first on PYTHONPATH, and this test
shows that the apps it starts get those too (not only the pytest process)."""

import subprocess
import sys

import hydra
import omegaconf


def test_the_apps_the_tests_start_run_on_the_same_hydra_and_omegaconf() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import hydra, omegaconf; print(hydra.__version__, omegaconf.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.split() == [hydra.__version__, omegaconf.__version__]
    print(f"Hydra {hydra.__version__}, OmegaConf {omegaconf.__version__}")
