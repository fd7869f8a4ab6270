"""Named generation presets: ``config/presets/*.json`` (and ``--presets-dir``), picked by ``generation_preset``.

A preset file is a ``GenerationConfig`` file in transformers' own format (what
``GenerationConfig.save_pretrained`` writes and ``GenerationConfig.from_pretrained(folder,
config_file_name=NAME.json)`` reads), so a config tuned with HF is served as it is. The JSON is
parsed here rather than through transformers, which would import torch into ``server/``; every
value is checked at start the way a request's field is (the request schema, then
``decoding.params.validate``), so a bad file stops the server naming the file and the field,
never a request later.

Precedence is request > preset > the model's generation_config.json > server defaults: the
preset's fields count as if the request had sent them, except where the request itself already
decided (an alias it set, or OpenAI's greedy switch ``temperature: 0`` overriding a sampling
preset's warpers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Request
from pydantic import ValidationError

from decoding import ParameterError
from server.config.sources import SOURCE_CONFIG, packaged_config
from server.translate import aliases
from server.translate.fields import GenerationFields
from server.translate.params import is_greedy, sampling_only, to_params

PRESETS_DIR = "presets"
# transformers writes these into every GenerationConfig file; they are not knobs
METADATA = ("transformers_version", "_from_model_config")
# request fields that are not GenerationConfig knobs: serving switches, the prompt side; OpenAI's and
# vLLM's other names for a knob are ``aliases.NOT_HF_NAMES``
NOT_IN_PRESETS = aliases.NOT_HF_NAMES | frozenset({
    "model", "stop", "seed", "stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias",
    "user", "assistant_model", "generation_preset", "custom_generate", "stop_token_ids", "ignore_eos",
    "return_token_ids", "skip_special_tokens", "negative_prompt", "negative_prompt_ids", "priority",
})  # fmt: skip

Body = TypeVar("Body", bound=GenerationFields)


class PresetError(ValueError):
    """A preset file that cannot be served; raised at start, naming the file and the field."""


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    generation_config: dict[str, Any]  # the file's knobs as written (for GET /v1/presets)
    fields: dict[str, Any]  # the same knobs as validated request values


def load_preset(path: Path) -> Preset:
    """Read and check one preset file; ``PresetError`` names the file and the field that is wrong."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PresetError(f"preset file {path}: not a readable JSON file ({exc})") from None
    if not isinstance(raw, dict):
        raise PresetError(f"preset file {path}: expected a JSON object of GenerationConfig fields")
    config = {key: value for key, value in raw.items() if key not in METADATA}
    for key in config:
        if key not in GenerationFields.model_fields or key in NOT_IN_PRESETS:
            raise PresetError(f"preset file {path}: field '{key}' is not a GenerationConfig knob this server serves")
    try:
        validated = GenerationFields.model_validate(config)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise PresetError(f"preset file {path}: field '{field}': {error['msg']}") from None
    try:
        to_params(validated, default_max_tokens=16)
    except ParameterError as exc:
        raise PresetError(f"preset file {path}: field '{exc.param}': {exc.message}") from None
    fields = {key: getattr(validated, key) for key in config}
    return Preset(path.stem, path, config, fields)


class Presets:
    """Every preset the server offers, loaded once at start."""

    def __init__(self, presets: dict[str, Preset]) -> None:
        self.presets = dict(sorted(presets.items()))

    @classmethod
    def load(cls, folders: list[Path]) -> Presets:
        """``*.json`` of each folder in order; a later folder's preset replaces one of the same name
        (``--presets-dir`` over the bundled ones). A folder named explicitly must exist."""
        presets: dict[str, Preset] = {}
        for folder in folders:
            if not folder.is_dir():
                raise PresetError(f"presets folder {folder} does not exist")
            for path in sorted(folder.glob("*.json")):
                presets[path.stem] = load_preset(path)
        return cls(presets)

    def names(self) -> list[str]:
        return list(self.presets)

    def listing(self) -> dict[str, Any]:
        data = [{"id": p.name, "generation_config": p.generation_config} for p in self.presets.values()]
        return {"object": "list", "data": data}

    def apply(self, body: Body) -> Body:
        """The request with its preset's fields filled in where the request left them unset."""
        name = body.generation_preset
        if name is None:
            return body
        preset = self.presets.get(name)
        if preset is None:
            raise ParameterError(
                f"unknown generation_preset '{name}'; available presets: {', '.join(self.names()) or 'none'}",
                param="generation_preset",
                code="preset_not_found",
            )
        greedy = is_greedy(body)
        updates = {}
        for key, value in preset.fields.items():
            if aliases.preset_gives_way(body, key):
                continue
            if greedy and sampling_only(key, preset.fields.get("penalty_alpha")):
                continue  # the request asked for greedy decoding: the preset's sampling knobs do not apply
            updates[key] = value
        return body.model_copy(update=updates)


def bundled_presets() -> Path | None:
    """The presets shipped with Decoda: the working directory's ``config/presets`` (the Docker
    image's ``/app``, a checkout), the checkout's own, or the copy installed with the package."""
    packaged = packaged_config()
    candidates = [Path.cwd() / "config", SOURCE_CONFIG.parent] + ([packaged.parent] if packaged else [])
    return next((folder / PRESETS_DIR for folder in candidates if (folder / PRESETS_DIR).is_dir()), None)


def load_presets(presets_dir: str | None) -> Presets:
    """The bundled presets, then ``--presets-dir``'s (which must exist), checked once at start."""
    bundled = bundled_presets()
    return Presets.load(([bundled] if bundled is not None else []) + ([Path(presets_dir)] if presets_dir else []))


def presets_of(request: Request) -> Presets:
    return request.app.state.presets
