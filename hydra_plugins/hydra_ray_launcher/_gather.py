"""Bring home what jobs wrote on other nodes of a Ray cluster: each node's part
of the sweep dir travels to the driver's node as a tar archive through Ray's
object store, and is removed on the node it came from.

Ray is imported inside functions: Hydra imports this package at every start.
"""

import io
import logging
import os
import shutil
import tarfile
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Extract the jobs' files as the jobs wrote them (symlinks included), on every
# Python: 3.14 would filter them by default, Pythons before 3.10.12 lack filters.
_AS_WRITTEN: dict[str, Any] = (
    {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
)


def gather_outputs(sweep_dir: Path, *, workdir: str | None) -> None:
    """Extract into `sweep_dir` (on this machine) the files the jobs wrote into it
    on the cluster's other machines, and remove them there, with `workdir` (the
    jobs' working dir there) if given.

    A node that sees this machine's files (this machine itself, or a shared
    filesystem) holds nothing to bring and nothing it may remove: a marker file
    written here tells such nodes apart. (With Ray Client this machine is no node
    of the cluster at all.)"""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]
    if len(nodes) < 2 and not ray.util.client.ray.is_connected():  # type: ignore[no-untyped-call]
        return  # a single machine, this one: everything is here
    sweep_dir.mkdir(parents=True, exist_ok=True)
    marker = sweep_dir / f".hydra-ray-node-{uuid.uuid4().hex}"
    marker.touch()
    try:
        pack = ray.remote(num_cpus=0)(_pack_and_remove)
        packs = [
            pack.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(str(sweep_dir), workdir, str(marker))
            for node in nodes
        ]
        for node, data in zip(nodes, ray.get(packs), strict=True):
            if data:
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    tar.extractall(sweep_dir, **_AS_WRITTEN)
                log.info(f"Gathered the outputs written on node {node[:8]} into {sweep_dir}")
    finally:
        marker.unlink(missing_ok=True)


def _pack_and_remove(sweep_dir: str, workdir: str | None, marker: str) -> bytes:
    """On another node: its part of the sweep dir as a tar archive; then the
    sweep dir and the jobs' working dir there are removed. Nothing, and nothing
    removed, where the marker shows the driver's own filesystem."""
    if os.path.exists(marker):
        return b""
    data = b""
    if os.path.isdir(sweep_dir):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(sweep_dir, arcname=".")
        data = buf.getvalue()
    shutil.rmtree(sweep_dir, ignore_errors=True)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
    return data
