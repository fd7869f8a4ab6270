"""A conversation rendered by the chat template, and with ``truncation: "auto"`` made to fit the context.

OpenAI's ``truncation: "auto"``: when the conversation (earlier turns included) does not leave the
room the reply asks for (``max_output_tokens``, or at least one token), drop whole items from its
start until it does. Never dropped: the instructions and every system or developer message (they
say how to answer, not what was said); never split: a ``function_call`` and the
``function_call_output`` that answers it go together, so the template never sees a result without
its call. The newest item is always kept: a conversation whose last item alone does not fit is
the same 400 as with ``"disabled"``, which keeps every item and refuses what does not fit.

The number of items to drop is found by bisection over the template's rendering (a prompt only
gets shorter as items go), so a long conversation costs a few renderings, not one per item. What
gets tokenized is bounded by the context, not by the conversation: a token spells at most
``max_chars_per_token`` characters (the tokenizer's longest), so items whose characters, with what
is always kept, pass ``max_model_len * max_chars_per_token`` cannot all be in a prompt that fits:
the oldest of them are dropped before anything is rendered, and with ``"disabled"`` such a
conversation is the 400 before any tokenizer work.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from decoding import EngineClient, GenerationParams
from decoding.media import ImageInput
from decoding.params.lengths import new_token_limit
from server.api.generation import images_of, templated
from server.api.responses.items import call_ids, image_parts, item_texts, template_messages
from server.api.responses.protocol import ResponsesRequest

KEPT_ROLES = ("system", "developer")

Rendered = tuple[list[int], GenerationParams]
ImagesByItem = dict[int, list[ImageInput]]  # id() of a conversation's item dict -> its images, in order


async def item_images(
    request: Request, client: EngineClient, earlier: list[dict[str, Any]], input_items: list[dict[str, Any]]
) -> ImagesByItem:
    """Every image of the conversation (the stored turns', then this input's), read once before any rendering:
    each rendering sends the images of the items it keeps (truncation drops whole items). An error names the
    part (``input[1].content[0]``), or ``previous_response_id`` for an image of the stored turns."""

    def param_of(index: int, j: int) -> str:
        return f"input[{index - len(earlier)}].content[{j}]" if index >= len(earlier) else "previous_response_id"

    conversation = earlier + input_items
    located = image_parts(conversation, param_of)
    files = await images_of(request, client, [part for _, part in located])
    out: ImagesByItem = {}
    for (index, _), image in zip(located, files, strict=True):
        out.setdefault(id(conversation[index]), []).append(image)
    return out


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


def unkeepable(client: EngineClient, body: ResponsesRequest, items: list[dict[str, Any]], units: list[list[int]],
               tools: list[dict[str, Any]] | None) -> int:  # fmt: skip
    """How many of the oldest units no prompt that fits can hold: with them, the text has more
    characters than the context's tokens can spell. The newest unit is never counted."""
    per_token = client.facts.max_chars_per_token
    if per_token is None:
        return 0
    sizes = [sum(len(text) for index in unit for text in item_texts(items[index])) for unit in units]
    in_units = {index for unit in units for index in unit}
    total = sum(len(text) for index, item in enumerate(items) if index not in in_units for text in item_texts(item))
    total += len(body.instructions or "") + (len(json.dumps(tools)) if tools else 0) + sum(sizes)
    dropped = 0
    while dropped < len(units) - 1 and total > client.max_model_len * per_token:
        total -= sizes[dropped]
        dropped += 1
    return dropped


async def rendered(
    client: EngineClient, body: ResponsesRequest, params: GenerationParams, conversation: list[dict[str, Any]],
    images: ImagesByItem | None = None,
) -> Rendered:  # fmt: skip
    """The conversation's prompt ids and the params with the length the context leaves: all of it,
    or with ``truncation: "auto"`` the fewest oldest units dropped that make it fit. ``images``: the
    conversation's (``item_images``)."""
    tools = body.template_tools()

    async def render(items: list[dict[str, Any]]) -> Rendered:
        kept = [image for item in items for image in (images or {}).get(id(item), [])]
        return await templated(client, body, params, template_messages(body.instructions, items), tools, images=kept)

    if body.truncation != "auto":  # one that cannot fit is the 400 without tokenizing it
        texts = [text for item in conversation for text in item_texts(item)] + [body.instructions or ""]
        client.check_text_size(texts + ([json.dumps(tools)] if tools else []), "input")
        return await render(conversation)
    units = droppable_units(conversation)
    least = unkeepable(client, body, conversation, units, tools)
    whole = await render(without_oldest(conversation, units, least))
    if fits(client, whole):
        return whole
    low, high = least + 1, len(units) - 1  # how many units to drop: the newest one always stays
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
    return await render(without_oldest(conversation, units, len(units) - 1)) if len(units) > least + 1 else whole
