"""Secrets out of what the plugin prints and writes: the values of environment
variables shipped to the jobs (`runtime_env.env_vars`), passwords, tokens and
credentials in URLs. Only copies are changed: Ray gets the real values.

Pure functions on plain data and configs; nothing heavy is imported.
"""

import copy
import logging
import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

HIDDEN = "***"

# Names of keys whose value is a secret, wherever they sit (`_redis_password`,
# `auth_token`, `aws_secret_access_key`, an `Authorization` header, ...).
_SECRET_KEY = re.compile(
    r"password|passwd|passphrase|token|secret|credential|api[-_]?key|access[-_]?key|"
    r"authorization|cookie",
    re.I,
)
# Keys whose every value is a secret: the environment given to the jobs.
_ALL_SECRET = frozenset({"env_vars"})
# NAME=VALUE in a text (an override, a command's `export WANDB_API_KEY=...`,
# `--password=...`) whose NAME names a secret: VALUE up to a space or a quote.
_SECRET_ASSIGNMENT = re.compile(
    r"(?P<name>[\w.+~-]*(?:password|passwd|token|secret|api[-_]?key|access[-_]?key)"
    r"[\w.-]*\s*=\s*)(?P<value>[^\s'\"]+)",
    re.I,
)
_PLAIN_VALUE = re.compile(r"[-+]?(\d[\d_]*\.?\d*(e[-+]?\d+)?|true|false|null|none)", re.I)
# user:password@ in a URL (a pip index, a git remote, an S3 endpoint, ...).
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.I)


def redacted(value: Any) -> Any:
    """A copy of plain data (dicts, lists, strings) with every secret hidden."""
    if isinstance(value, Mapping):
        return {k: _redacted_item(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    if isinstance(value, str):
        value = _URL_USERINFO.sub(rf"\g<scheme>{HIDDEN}@", value)
        return _SECRET_ASSIGNMENT.sub(_hide_assigned, value)
    return value


def _hide_assigned(match: re.Match[str]) -> str:
    """The value hidden, unless a number or a boolean (`max_tokens=512` is a
    hyperparameter, not a secret: the job listing must tell jobs apart)."""
    value = match.group("value")
    if _PLAIN_VALUE.fullmatch(value):
        return match.group(0)
    return f"{match.group('name')}{HIDDEN}"


def _redacted_item(key: str, value: Any) -> Any:
    if key in _ALL_SECRET and isinstance(value, Mapping):
        return {k: HIDDEN for k in value}
    if _SECRET_KEY.search(key) and value is not None and not isinstance(value, Mapping):
        return HIDDEN
    return redacted(value)


def redacted_override(override: str) -> str:
    """`KEY=VALUE` from a command line, its value hidden if KEY names a secret."""
    key, sep, value = override.partition("=")
    path = key.lstrip("+~").split(".")
    if sep and value and ("env_vars" in path[:-1] or _SECRET_KEY.search(path[-1])):
        return f"{key}={HIDDEN}"
    return str(redacted(override))


def redacted_hydra_config(hydra_cfg: DictConfig) -> DictConfig:
    """A copy of a job's Hydra config (`JobReturn.hydra_cfg`) whose launcher
    settings, and the command-line overrides of Hydra's settings, have their
    secrets hidden; interpolations are kept as written."""
    launcher = OmegaConf.select(hydra_cfg, "hydra.launcher")
    if not isinstance(launcher, DictConfig):
        return hydra_cfg
    plain = OmegaConf.to_container(launcher, resolve=False)
    hidden = redacted(plain)
    # As written: an override with an interpolation into the job's config
    # (`hydra.launcher.ray.remote.num_gpus=${model.gpus}`) does not resolve here.
    node = OmegaConf.select(hydra_cfg, "hydra.overrides.hydra", default=None)
    overrides = list(OmegaConf.to_container(node, resolve=False) or []) if node is not None else []
    hidden_overrides = [redacted_override(str(o)) for o in overrides]
    if hidden == plain and hidden_overrides == overrides:
        return hydra_cfg
    out = copy.deepcopy(hydra_cfg)
    # A job's Hydra config is read-only and struct: lift both for this change.
    with read_write(out), read_write(out.hydra), open_dict(out.hydra):
        out.hydra.launcher = OmegaConf.create(hidden)
        if overrides:
            with read_write(out.hydra.overrides), open_dict(out.hydra.overrides):
                out.hydra.overrides.hydra = hidden_overrides
    return out


class _Redacting(logging.Filter):
    """Every record of the logger it is on, through `redacted` as it is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = redacted(message)
        if hidden != message:
            record.msg, record.args = hidden, ()
        return True


def redacting_logger(name: str) -> logging.Logger:
    """The logger `name`, every line it logs redacted: the plugin's modules log
    through these, so no line of theirs shows a secret, whatever it quotes (a
    dashboard's address, a command, a storage's URI)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _Redacting) for f in logger.filters):
        logger.addFilter(_Redacting())
    return logger
