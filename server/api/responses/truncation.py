"""A conversation rendered by the chat template, and with ``truncation: "auto"`` made to fit the context.

OpenAI's ``truncation: "auto"``: when the conversation (earlier turns included) does not leave the
room the reply asks for (``max_output_tokens``, or at least one token), drop whole items from its
start until it does. Never dropped: the instructions and every system or developer message (they
say how to answer, not what was said); never split: a ``function_call`` and the
``function_call_output`` that answers it go together, so the template never sees a result without
its call. The newest item is always kept: a conversation whose last item alone does not fit is
the same 400 as with ``"disabled"``, which keeps every item and refuses what does not fit.

The number of items to drop is found by bisection over the template's rendering (a prompt only
gets shorter as items go), so a long conversation costs a few renderings, not one per item.
"""

from __future__ import annotations

from typing import Any

from decoding import EngineClient, GenerationParams
from decoding.params.lengths import new_token_limit
from server.api.generation import templated
from server.api.responses.items import call_ids, template_messages
from server.api.responses.protocol import ResponsesRequest

KEPT_ROLES = ("system", "developer")

Rendered = tuple[list[int], GenerationParams]


def droppable_units(items: list[dict[str, Any]]) -> list[list[int]]:
    """The indexes of ``items`` that go together, oldest first: one unit per item, except that a
    function call's outputs join its call's unit; system and developer messages are in none."""
    units: list[list[int]] = []
    unit_of_call: dict[str | None, list[int]] = {}
    ids = call_ids(items)  # an output without call_id answers the oldest unanswered call
    for index, item in enumerate(items):
        if item["type"] == "message" and item["role"] in KEPT_ROLES:
            continue
        call_unit = unit_of_call.get(ids[index]) if item["type"] == "function_call_output" else None
        if call_unit is not None:
            call_unit.append(index)
            continue
        units.append([index])
        if item["type"] == "function_call":
            unit_of_call[item["call_id"]] = units[-1]
    return units


def without_oldest(items: list[dict[str, Any]], units: list[list[int]], count: int) -> list[dict[str, Any]]:
    """``items`` less the first ``count`` units."""
    dropped = {index for unit in units[:count] for index in unit}
    return [item for index, item in enumerate(items) if index not in dropped]


def fits(client: EngineClient, rendered: Rendered) -> bool:
    """Whether the prompt leaves the room its reply asks for (the engine's context check, as a test)."""
    prompt_ids, params = rendered
    return len(prompt_ids) + new_token_limit(params, len(prompt_ids)) <= client.max_model_len


async def rendered(
    client: EngineClient, body: ResponsesRequest, params: GenerationParams, conversation: list[dict[str, Any]]
) -> Rendered:
    """The conversation's prompt ids and the params with the length the context leaves: all of it,
    or with ``truncation: "auto"`` the fewest oldest units dropped that make it fit."""
    tools = body.template_tools()

    async def render(items: list[dict[str, Any]]) -> Rendered:
        return await templated(client, body, params, template_messages(body.instructions, items), tools)

    whole = await render(conversation)
    if body.truncation != "auto" or fits(client, whole):
        return whole
    units = droppable_units(conversation)
    low, high = 1, len(units) - 1  # how many units to drop: the newest one always stays
    best = None
    while low <= high:
        middle = (low + high) // 2
        attempt = await render(without_oldest(conversation, units, middle))
        if fits(client, attempt):
            best, high = attempt, middle - 1
        else:
            low = middle + 1
    if best is not None:
        return best
    return await render(without_oldest(conversation, units, len(units) - 1)) if len(units) > 1 else whole
