"""Secrets in the launcher's settings (the jobs' environment variables, passwords,
tokens, credentials in URLs) reach Ray and the jobs, never the plugin's logs or
files."""

import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hydra_ray.core.redact import HIDDEN, redacted, redacted_hydra_config, redacted_override

from .conftest import run_app

SECRETS = ("hunter2-env-value", "pw-s3cr3t-value")


def test_env_var_values_passwords_tokens_and_url_credentials_are_hidden() -> None:
    init = {
        "address": "auto",
        "num_cpus": 2,
        "_redis_password": "pw",
        "runtime_env": {
            "env_vars": {"WANDB_API_KEY": "k", "PLAIN": "v"},
            "pip": ["--index-url=https://me:tok@pypi.example/simple", "numpy"],
            "working_dir": ".",
        },
        "headers": {"Authorization-Token": "t", "Accept": "json", "Authorization": "Bearer t"},
    }
    assert redacted(init) == {
        "address": "auto",
        "num_cpus": 2,
        "_redis_password": HIDDEN,
        "runtime_env": {
            "env_vars": {"WANDB_API_KEY": HIDDEN, "PLAIN": HIDDEN},
            "pip": [f"--index-url=https://{HIDDEN}@pypi.example/simple", "numpy"],
            "working_dir": ".",
        },
        "headers": {"Authorization-Token": HIDDEN, "Accept": "json", "Authorization": HIDDEN},
    }
    assert redacted_override("++hydra.launcher.ray.init.runtime_env.env_vars.K=v") == (
        f"++hydra.launcher.ray.init.runtime_env.env_vars.K={HIDDEN}"
    )
    assert redacted_override("+hydra.launcher.headers.Authorization=Bearer t") == (
        f"+hydra.launcher.headers.Authorization={HIDDEN}"
    )
    # A copy: what Ray gets keeps the real values.
    assert init["runtime_env"]["env_vars"]["PLAIN"] == "v"  # type: ignore[index]


def test_a_jobs_hydra_config_keeps_everything_but_the_launchers_secrets() -> None:
    cfg = OmegaConf.create(
        {
            "hydra": {
                "run": {"dir": "x"},
                "overrides": {
                    "hydra": ["+hydra.launcher.ray.init._redis_password=pw", "hydra.run.dir=x"],
                    "task": ["lr=0.1"],
                },
                "launcher": {"ray": {"init": {"runtime_env": {"env_vars": {"K": "secret"}}}}},
            }
        }
    )
    for node in (cfg, cfg.hydra):  # read-only and struct, as Hydra hands it over
        OmegaConf.set_readonly(node, True)
        OmegaConf.set_struct(node, True)
    hidden = redacted_hydra_config(cfg)
    assert hidden.hydra.launcher.ray.init.runtime_env.env_vars.K == HIDDEN
    assert hidden.hydra.run.dir == "x"
    assert list(hidden.hydra.overrides.hydra) == [
        f"+hydra.launcher.ray.init._redis_password={HIDDEN}",
        "hydra.run.dir=x",
    ]
    assert list(hidden.hydra.overrides.task) == ["lr=0.1"]
    assert cfg.hydra.launcher.ray.init.runtime_env.env_vars.K == "secret"


def test_secrets_reach_the_jobs_but_not_the_logs_records_or_summary(
    ray_session: str, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "secret_app.py",
        "x=1,2",
        f"hydra.launcher.ray.init.address={ray_session}",
        f"+hydra.launcher.ray.init._redis_password={SECRETS[1]}",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "Initializing ray with config" in ln)
    assert f"'APP_SECRET': '{HIDDEN}'" in line and f"'_redis_password': '{HIDDEN}'" in line
    for secret in SECRETS:
        assert secret not in res.output
    # The jobs got the real value from Ray.
    for num in range(2):
        assert (sweep / str(num) / "secret_seen").read_text() == SECRETS[0]
    # Everything the plugin wrote (records, manifest, summary); Hydra's own files
    # (multirun.yaml, each job's .hydra/) hold the config as the user wrote it.
    ours = [sweep / "sweep_summary.json", *(sweep / ".hydra_ray").rglob("*")]
    assert any(p.suffix == ".pkl" for p in ours) and any(p.suffix == ".json" for p in ours)
    for path in ours:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, path


def test_headers_named_like_a_key_and_secret_assignments_are_hidden_numbers_shown() -> None:
    assert redacted({"X-Api-Key": "k", "x-access-key": "a", "Accept": "json"}) == {
        "X-Api-Key": HIDDEN,
        "x-access-key": HIDDEN,
        "Accept": "json",
    }
    assert (
        redacted("+api_token=tok1 lr=0.1 max_tokens=512")
        == f"+api_token={HIDDEN} lr=0.1 max_tokens=512"
    )
    assert redacted("export WANDB_API_KEY=abc && python x.py") == (
        f"export WANDB_API_KEY={HIDDEN} && python x.py"
    )
    assert redacted("s3://AKID:sec@bucket/p") == f"s3://{HIDDEN}@bucket/p"


# What a user puts in a sweep: a pip index with a password and an API key in
# the set-up commands, a storage and a dashboard with credentials in their
# URLs, a header with a key, a token as an override of the app's config.
LEAKS = {
    "pip": "pipPW-s3cr3t",
    "wandb": "wandb-s3cr3t",
    "storage": "stor-s3cr3t",
    "dashboard": "dash-s3cr3t",
    "header": "hdr-s3cr3t",
    "override": "tok-s3cr3t",
}


def _no_leak(output: str) -> None:
    found = {name: value for name, value in LEAKS.items() if value in output}
    assert not found, (found, output)


def _dry(*overrides: str, cwd: Path) -> str:
    res = run_app(
        "app.py",
        "x=1,2",
        f"+api_token={LEAKS['override']}",
        f"hydra.launcher.sync_down.storage='s3://AKID:{LEAKS['storage']}@bucket/p'",
        "hydra.launcher.dry_run=true",
        *overrides,
        cwd=cwd,
    )
    return res.output


def test_no_secret_in_a_cluster_dry_run(tmp_path: Path) -> None:
    yaml = tmp_path / "cluster.yaml"
    yaml.write_text(
        "cluster_name: dry\n"
        "provider: {type: local, head_ip: 127.0.0.9, worker_ips: [127.0.0.10]}\n"
        "auth: {ssh_user: nobody, ssh_private_key: /nonexistent/key}\n"
    )
    commands = (
        f"'pip install --index-url=https://me:{LEAKS['pip']}@pypi.example/simple numpy',"
        f"'export WANDB_API_KEY={LEAKS['wandb']}'"
    )
    out = _dry(
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={yaml}",
        f"hydra.launcher.env_setup.commands=[{commands}]",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    # The plan is there, with the secrets hidden in it.
    head = out.split("Commands on the head, in the order they run:", 1)[1]
    assert f"pip install --index-url=https://{HIDDEN}@pypi.example/simple numpy" in head, out
    assert f"export WANDB_API_KEY={HIDDEN}" in head, out
    assert f"api_token={HIDDEN}" in out, out
    _no_leak(out)


def test_no_secret_in_a_ray_jobs_dry_run(tmp_path: Path) -> None:
    out = _dry(
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address=http://me:{LEAKS['dashboard']}@127.0.0.1:9",
        f"+hydra.launcher.headers={{X-Api-Key:{LEAKS['header']}}}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert "Dry run" in out and "127.0.0.1:9" in out, out
    _no_leak(out)


def test_every_log_line_and_error_of_the_plugin_goes_through_the_redaction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever a message quotes (a dashboard's address, a storage's URI, an
    override), the line logged and the error raised show no secret."""
    from hydra_ray.core.errors import ConfigError
    from hydra_ray.launch import jobs_api

    address = f"http://me:{LEAKS['dashboard']}@127.0.0.1:9"
    with caplog.at_level(logging.INFO, logger="hydra_ray"):
        jobs_api.log.info("Submitted the sweep to %s; +api_token=%s", address, LEAKS["override"])
    assert caplog.records and f"http://{HIDDEN}@127.0.0.1:9" in caplog.text, caplog.text
    error = ConfigError(f"hydra.launcher.address={address} did not answer")
    assert str(error) == f"hydra.launcher.address=http://{HIDDEN}@127.0.0.1:9 did not answer"
    _no_leak(caplog.text + str(error))
