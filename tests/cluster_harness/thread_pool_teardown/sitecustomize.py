"""Loaded at start-up by a launching process with this dir on its PYTHONPATH:
Ray's local provider then terminates nodes through a ThreadPoolExecutor, as
Ray's teardown of a docker cluster stops the containers. Python refuses new
thread-pool work once the interpreter exits ("cannot schedule new futures after
interpreter shutdown"), so a teardown left to `atexit` fails with it, as it does
for docker clusters."""

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray.autoscaler._private.local.node_provider import LocalNodeProvider

_terminate_node = LocalNodeProvider.terminate_node


def _terminate_node_in_a_pool(self: LocalNodeProvider, node_id: str) -> Any:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_terminate_node, self, node_id).result()


LocalNodeProvider.terminate_node = _terminate_node_in_a_pool  # type: ignore[method-assign]
