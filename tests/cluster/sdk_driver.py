"""Drives a cluster-launcher round trip through `ray.autoscaler.sdk` only (no plugin code).

test_harness.py runs it in a subprocess inside the fake hosts' network namespace:

    python sdk_driver.py PLAN.json RESULT.json

PLAN.json: {"config": <cluster config>, "steps": [[op, args], ...]} with ops
  "create", "head_ip", "run" {"cmd"}, "rsync_up"/"rsync_down" {"source", "target"},
  "count_instances" {"region"} (AWS: instances in state pending/running), "teardown".
A "teardown" step also runs if an earlier step failed. RESULT.json gets one record per
step: {"op", "seconds", "ok", "value" or "error"}.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from typing import Any

from ray.autoscaler import sdk


def run_step(config: dict[str, Any], op: str, args: dict[str, Any]) -> Any:
    if op == "create":
        # no_config_cache: each test's config must be used as given
        sdk.create_or_update_cluster(config, no_config_cache=True)
        return None
    if op == "head_ip":
        return sdk.get_head_node_ip(config)
    if op == "run":
        out = sdk.run_on_cluster(config, cmd=args["cmd"], with_output=True)
        return out.decode(errors="replace") if isinstance(out, bytes) else out
    if op in ("rsync_up", "rsync_down"):
        sdk.rsync(config, source=args["source"], target=args["target"], down=op == "rsync_down")
        return None
    if op == "count_instances":
        # only the AWS scenario needs boto3; it ships no type hints (mypy --strict)
        boto3 = importlib.import_module("boto3")
        ec2 = boto3.client("ec2", region_name=args["region"])
        states = {"Name": "instance-state-name", "Values": ["pending", "running"]}
        reservations = ec2.describe_instances(Filters=[states])["Reservations"]
        return sum(len(r["Instances"]) for r in reservations)
    if op == "teardown":
        sdk.teardown_cluster(config)
        return None
    raise ValueError(f"unknown op {op!r}")


def main(plan_path: str, result_path: str) -> int:
    with open(plan_path) as f:
        plan = json.load(f)
    config: dict[str, Any] = plan["config"]
    sdk.configure_logging(log_style="record", color_mode="false", verbosity=0)
    records: list[dict[str, Any]] = []
    failed = False
    for op, args in plan["steps"]:
        if failed and op != "teardown":
            continue
        start = time.monotonic()
        record: dict[str, Any] = {"op": op}
        try:
            record["value"] = run_step(config, op, args)
            record["ok"] = True
        except BaseException as exc:  # ClickException, SystemExit from cli_logger.abort, ...
            record["ok"] = False
            record["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            failed = True
        record["seconds"] = round(time.monotonic() - start, 1)
        print(f"### {op}: {record['seconds']}s ok={record['ok']}", flush=True)
        records.append(record)
        with open(result_path, "w") as f:  # rewritten after each step: partial runs are readable
            json.dump(records, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
