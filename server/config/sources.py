"""Where settings come from: command-line flag > ``DECODA_<NAME>`` environment variable > config file >
built-in default, for every field of ``server.config.settings.Settings``; the only module that reads
environment variables.

The config file is ``--config FILE`` or ``DECODA_CONFIG`` when given (then it must exist), else
the first of: ``config/server.yaml`` in the working directory (the Docker image's ``/app``, or a
checkout), the checkout's own ``config/server.yaml``, and the copy ``pip install .`` ships inside
the package (``server/defaults/``, see pyproject.toml).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from server.config.settings import Settings

CONFIG_NAME = "server.yaml"
SOURCE_CONFIG = Path(__file__).resolve().parents[2] / "config" / CONFIG_NAME  # in a checkout
PACKAGED_CONFIG = "server.defaults"  # config/ as installed package data (pyproject.toml)
# flags given several times; comma-joined like env and yaml
REPEATABLE = ("assistant_model", "api_key", "admin_api_key", "custom_generate", "lora_modules", "allowed_media_domains")


def env_name(name: str) -> str:
    return f"DECODA_{name.upper()}"


def _kind(f: Any) -> type:
    text = str(f.type)
    for kind in (bool, int, float):
        if kind.__name__ in text:
            return kind
    return str


def _convert(kind: type, raw: Any, source: str) -> Any:
    if raw is None or isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    text = str(raw).strip()
    if text.lower() in ("", "none", "null"):
        return None
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{source}: expected true/false, got {raw!r}")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{source}: expected {kind.__name__}, got {raw!r}") from None


def packaged_config() -> Path | None:
    """The server.yaml installed with the package, if this is an installed copy."""
    try:
        spec = importlib.util.find_spec(PACKAGED_CONFIG)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / CONFIG_NAME


def default_config() -> Path | None:
    """The defaults file when none is named: the working directory's, the checkout's, the installed one."""
    for candidate in (Path.cwd() / "config" / CONFIG_NAME, SOURCE_CONFIG, packaged_config()):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def config_path(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Path | None:
    """The YAML file ``load_settings`` reads (None: built-in defaults only); a named one must exist."""
    environ = os.environ if environ is None else environ
    named = (vars(args).get("config") if args is not None else None) or environ.get("DECODA_CONFIG")
    if named:
        if not Path(named).is_file():
            raise ValueError(f"config file not found: {named}")
        return Path(named)
    return default_config()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        help="YAML settings file (env DECODA_CONFIG; default ./config/server.yaml, else the one installed with Decoda)",
    )
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata.get('help', '')} [env {env_name(f.name)}; default {f.default}]"
        if f.name in REPEATABLE:
            parser.add_argument(flag, dest=f.name, default=None, action="append", help=help_text)
        elif _kind(f) is bool:
            parser.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=help_text)


def load_settings(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Settings:
    """The settings from every source by precedence, checked (``Settings.check``): a ValueError names
    the flag, variable or file entry that is wrong."""
    environ = dict(os.environ if environ is None else environ)
    cli = vars(args) if args is not None else {}
    path = config_path(args, environ)
    from_file: dict[str, Any] = {}
    if path is not None:
        from_file = yaml.safe_load(path.read_text()) or {}
        unknown = set(from_file) - {f.name for f in fields(Settings)}
        if unknown:
            raise ValueError(f"{path}: unknown settings {sorted(unknown)}")
    values: dict[str, Any] = {}
    for f in fields(Settings):
        kind = _kind(f)
        if isinstance(cli.get(f.name), list):  # a repeatable flag
            values[f.name] = ",".join(cli[f.name])
        elif isinstance(from_file.get(f.name), list) and cli.get(f.name) is None and env_name(f.name) not in environ:
            values[f.name] = ",".join(str(v) for v in from_file[f.name])
        elif cli.get(f.name) is not None:
            values[f.name] = _convert(kind, cli[f.name], "--" + f.name.replace("_", "-"))
        elif env_name(f.name) in environ:
            values[f.name] = _convert(kind, environ[env_name(f.name)], env_name(f.name))
        elif f.name in from_file:
            values[f.name] = _convert(kind, from_file[f.name], f"{path}:{f.name}")
    settings = Settings(**values)
    settings.check()
    return settings
