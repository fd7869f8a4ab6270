"""The request's parameters and their one validation; torch-free, so the HTTP layer imports it.

Read in import order: ``errors`` (ParameterError, Bounds) → ``sizes`` (how long each list may be:
the one table) → ``watermarking`` (HF's WatermarkingConfig) and ``structured`` (a constraint) →
``generation`` (GenerationParams, the strategy HF would pick) → ``bounds`` (the ranges table
/openapi.json states) → ``lengths`` (HF's total lengths as per-row limits) →
``knobs``, ``custom_methods`` and ``thinking`` (checks of the newer knobs, of custom methods and of a
thinking budget) → ``validate``
(everything, once) → ``model_checks`` (what also depends on the served model) and
``model_defaults`` (a model's generation_config.json as request defaults).

The names the server and users import are re-exported here; modules inside this package import
each other by module, never through this facade.
"""

from decoding.params.bounds import BOUNDS, MAX_CONTRASTIVE_TOP_K, MAX_N
from decoding.params.errors import Bounds, ParameterError
from decoding.params.generation import GenerationParams, Strategy, guidance_active, is_assisted, resolve_strategy
from decoding.params.sizes import SIZE_LIMITS, check_size
from decoding.params.validate import validate

__all__ = [
    "BOUNDS",
    "MAX_CONTRASTIVE_TOP_K",
    "MAX_N",
    "SIZE_LIMITS",
    "Bounds",
    "GenerationParams",
    "ParameterError",
    "Strategy",
    "check_size",
    "guidance_active",
    "is_assisted",
    "resolve_strategy",
    "validate",
]
