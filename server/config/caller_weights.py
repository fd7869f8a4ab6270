"""The fair share's weights (``--caller-weights``, and ``weight=`` in the API keys file): caller -> weight.

A caller is named as the scheduler names it (``server.translate.scheduling``): ``key:`` and the first
12 hex digits of the SHA-256 of its API key (what the access log shows, so no key is ever written on a
command line), or ``user:<id>`` for the end user a body names on a server without keys. A key's weight
is most naturally written beside it in ``--api-keys-file`` (``KEY weight=4``); the flag wins where both
name the same caller. A caller without a weight has 1; a backlogged caller's share of the running batch
is its weight over the sum of the backlogged callers' weights (``decoding/engine/policy.py``).
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from server.http.access_log import CALLER_SHOWN

WEIGHT_FLAG = "caller_weights (--caller-weights)"
MAX_WEIGHT = 1_000_000.0
_KEY_NAME = re.compile(rf"key:[0-9a-f]{{{CALLER_SHOWN}}}")


def key_caller(identity: str) -> str:
    """The caller name of an API key, from its checked identity (the hex SHA-256 digest, ``auth.Caller``)."""
    return f"key:{identity[:CALLER_SHOWN]}"


def key_name(key: str) -> str:
    """The caller name of a configured API key (the digest ``auth`` checks it by)."""
    return key_caller(hashlib.sha256(key.encode()).hexdigest())


def parse_weight(text: str, where: str) -> float:
    """A weight: a number in (0, 1e6]; a ValueError naming ``where`` otherwise."""
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not (0 < weight <= MAX_WEIGHT):
        raise ValueError(f"{where}: a weight must be a number in (0, {MAX_WEIGHT:g}], got {text!r}")
    return weight


def parse_caller_weights(spec: str | None) -> dict[str, float]:
    """``"key:3f2a9c1b0d4e=4,user:alice=2"`` -> ``{"key:3f2a9c1b0d4e": 4.0, "user:alice": 2.0}``."""
    weights: dict[str, float] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, weight = item.strip().rpartition("=")
        if not sep or not (_KEY_NAME.fullmatch(name) or (name.startswith("user:") and len(name) > len("user:"))):
            raise ValueError(f"{WEIGHT_FLAG}: each entry is NAME=WEIGHT, NAME being key:<the first {CALLER_SHOWN} "
                             "hex digits of the key's SHA-256, as the access log shows> or user:<id>; a key's weight "
                             f"may also follow it in --api-keys-file (KEY weight=4); got {item.strip()!r}")  # fmt: skip
        weights[name] = parse_weight(weight, WEIGHT_FLAG)
    return weights


def split_key_line(line: str, where: str) -> tuple[str, float | None]:
    """One line of the API keys file: ``KEY`` or ``KEY weight=N`` -> (key, its weight or None)."""
    key, _, rest = line.strip().partition(" ")
    rest = rest.strip()
    if not rest:
        return key, None
    if not rest.startswith("weight="):
        raise ValueError(f"{where}: a line is a key, optionally followed by weight=N (its fair share's weight); "
                         f"got {rest[:40]!r} after a key")  # fmt: skip
    return key, parse_weight(rest.removeprefix("weight="), where)


def keys_file_entries(path_name: str) -> list[tuple[str, float | None]]:
    """The API keys file's keys, each with its weight (None: none given); '#' comments and blank lines
    skipped. A file that cannot be read is a ValueError, like every other config error."""
    path = Path(path_name)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"API keys file {path}: {exc.strerror or exc}") from None
    lines = [line.strip() for line in text.splitlines()]
    return [split_key_line(line, f"API keys file {path}") for line in lines if line and not line.startswith("#")]
