"""A thinking budget: how many tokens a reasoning model may think before its end-of-thinking tag is forced.

Anthropic's ``thinking: {"type": "enabled", "budget_tokens": N}`` is the one way a request sets it
(the server turns the reasoning parser's tags into token ids: ``server.translate.thinking``), so
the errors name ``thinking``, as ``prediction_ids``' name ``prediction``. The fields are serving
fields of ``GenerationParams``:

- ``thinking_budget``: the reply's tokens, from its first, after which the thinking must end;
- ``thinking_end_ids``: the end tag's ids (``</think>``), forced one by one once the budget is spent
  (a tag the reply already began is continued, not restarted), after which the reply is free;
- ``thinking_start_ids``: the opening tag's ids when the reply opens its own thinking (Qwen3's
  ``<think>``): the budget applies only to a reply that starts with exactly them; None when the
  prompt opened the thinking (DeepSeek-R1's template), so the reply starts inside it.

The engine side is ``decoding.sampling.thinking``. A custom method decodes by itself, outside the
sampler that forces the tag, so it cannot take a budget.
"""

from __future__ import annotations

from decoding.params.errors import require
from decoding.params.generation import GenerationParams

PARAM = "thinking"


def _ids(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


def validate_thinking(params: GenerationParams) -> None:
    """The three fields together and well formed (see the module's docstring)."""
    budget = params.thinking_budget
    if budget is None:
        require(params.thinking_end_ids is None and params.thinking_start_ids is None, PARAM,
                "thinking_end_ids and thinking_start_ids belong to a thinking_budget")  # fmt: skip
        return
    require(isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1, PARAM,
            f"the thinking budget must be a whole number of tokens >= 1, got {budget!r}")  # fmt: skip
    end_ids = params.thinking_end_ids
    require(_ids(end_ids), PARAM, f"a thinking budget needs the end tag's token ids (ids >= 0), got {end_ids!r}")
    require(params.thinking_start_ids is None or _ids(params.thinking_start_ids), PARAM,
            f"thinking_start_ids must be non-empty token ids >= 0, got {params.thinking_start_ids!r}")  # fmt: skip
    require(params.custom_generate is None, PARAM,
            f"a thinking budget cannot be combined with custom_generate: the method '{params.custom_generate}' "
            "decodes by itself, outside the sampler that ends the thinking")  # fmt: skip


def thinking_ids(params: GenerationParams) -> list[int]:
    """Every token id the budget names (checked against the vocabulary by ``model_checks``)."""
    return [*(params.thinking_end_ids or []), *(params.thinking_start_ids or [])]
