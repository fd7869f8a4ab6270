"""Logprobs in the two shapes OpenAI uses: the legacy completions lists, and chat's per-token objects
(which the Responses API's ``output_text.logprobs`` reuse).
"""

from __future__ import annotations

from decoding import TokenLogprob


def completion_logprobs(entries: list[TokenLogprob], text_offset: int) -> dict:
    """Legacy completions format: parallel lists plus character offsets into the choice text."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = text_offset
    for entry in entries:
        tokens.append(entry.token)
        token_logprobs.append(entry.logprob)
        top.append({alt.token: alt.logprob for alt in entry.top} if entry.logprob is not None else None)
        offsets.append(offset)
        offset += len(entry.token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": _bytes(e.token),
                "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token)} for t in e.top],
            }
            for e in entries
        ]
    }
