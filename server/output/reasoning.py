"""Splitting a reasoning model's thinking from its answer (``--reasoning-parser``; vLLM's flag and names).

Reasoning models write their thinking between ``<think>`` and ``</think>`` before the answer. Every
peer server hands the thinking out apart (chat's ``reasoning_content``, the Responses API's
``reasoning`` item, the Messages API's ``thinking`` block), so the answer (``content``, tool calls)
never holds the tags or the thinking. The formats differ only in where the thinking starts:

- ``deepseek_r1``: the chat template already opened ``<think>`` in the prompt, so the reply starts
  inside the thinking and ``</think>`` ends it (a reply that repeats the opening tag first is read
  the same); a reply without ``</think>`` is all thinking (it was cut short while thinking).
- ``qwen3``: the thinking is a ``<think>…</think>`` block at the very start of the reply; a reply
  that does not open with it is all answer (Qwen3 with ``enable_thinking`` false).
- ``think``: the generic form: any number of ``<think>…</think>`` blocks anywhere in the reply.

The whitespace right after ``</think>`` is the format's separator before the answer, not content
(after a block in the middle of the answer, it is the answer's own). A reply is
split as it streams (``ReasoningStream``), holding back only text that may be the start of a tag,
so that a tag split across deltas never leaks into either side; a whole reply goes through the same
stream (``split_reasoning``), so a streamed reply and its body always agree. The split comes first:
the tool-call parser (``server.output.tool_parser``) only ever reads the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"
NONE = "none"


@dataclass(frozen=True)
class ReasoningFormat:
    """Where a model's thinking is: ``opened_by_prompt`` (the reply starts inside it), else blocks
    the reply opens, only at its start unless ``anywhere``."""

    name: str
    opened_by_prompt: bool = False
    anywhere: bool = False

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


FORMATS = {
    "deepseek_r1": ReasoningFormat("deepseek_r1", opened_by_prompt=True),
    "qwen3": ReasoningFormat("qwen3"),
    "think": ReasoningFormat("think", anywhere=True),
}
PARSER_NAMES = (NONE, *FORMATS)


def check_reasoning_parser(name: str) -> None:
    if name != NONE and name not in FORMATS:
        raise ValueError(f"--reasoning-parser {name!r} is not known; choose from {', '.join(PARSER_NAMES)}")


def reasoning_format(name: str, thinking: bool = True) -> ReasoningFormat | None:
    """The format ``--reasoning-parser name`` reads (None: no split); ``thinking`` false (a request
    that turned the model's thinking off) makes the whole reply the answer."""
    return FORMATS.get(name) if thinking else None


# where a stream is: before the reply shows whether it opens a block, inside one, right after one
# (its separating whitespace), in the answer (looking for another block only when ``anywhere``)
AT_START, THINKING, AFTER_END, ANSWER = "at_start", "thinking", "after_end", "answer"


class ReasoningStream:
    """Feed text deltas; get (thinking, answer) to release for each, never a tag or part of one."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self.format = fmt
        self._state = AT_START
        self._pending = ""  # text held back: a possible tag start, or the whitespace after a block
        self._answered = False  # whether any answer was released

    def feed(self, text: str) -> tuple[str, str]:
        self._pending += text
        thinking, answer = "", ""
        while True:
            if self._state == AT_START:
                head = self._pending.lstrip() if not self.format.opened_by_prompt else self._pending
                if START.startswith(head) and len(head) < len(START):  # may still become the opening tag
                    break
                if head.startswith(START):
                    self._pending, self._state = head[len(START) :], THINKING
                else:
                    self._state = THINKING if self.format.opened_by_prompt else ANSWER
                continue
            if self._state == THINKING:
                end = self._pending.find(END)
                if end < 0:
                    keep = _partial_tail(self._pending, END)
                    thinking += self._pending[: len(self._pending) - keep]
                    self._pending = self._pending[len(self._pending) - keep :]
                    break
                thinking += self._pending[:end]
                self._pending, self._state = self._pending[end + len(END) :], AFTER_END
                continue
            if self._state == AFTER_END:
                if not (self._answered or answer):
                    self._pending = self._pending.lstrip()
                    if not self._pending:
                        break
                self._state = ANSWER
                continue
            if not self.format.anywhere:  # ANSWER, and no block can follow
                answer, self._pending = answer + self._pending, ""
                break
            start = self._pending.find(START)
            if start >= 0:
                answer += self._pending[:start]
                self._pending, self._state = self._pending[start + len(START) :], THINKING
                continue
            keep = _partial_tail(self._pending, START)
            answer += self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep :]
            break
        self._answered = self._answered or bool(answer)
        return thinking, answer

    def finish(self) -> tuple[str, str]:
        """The stream ended: what it held is thinking inside a block, nothing after one, else answer."""
        rest, self._pending = self._pending, ""
        if self._state == THINKING or (self._state == AT_START and self.format.opened_by_prompt):
            return rest, ""
        if self._state == AFTER_END and not self._answered:
            return "", ""
        return "", rest


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that begins ``tag`` (held back: the next delta may finish it)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def split_reasoning(text: str, fmt: ReasoningFormat | None) -> tuple[str | None, str]:
    """(the thinking, or None when there was none; the answer) of a whole reply, by the streamed rules.

    The one call every API's body makes (chat, Responses, Messages): ``fmt`` None leaves the text whole."""
    if fmt is None:
        return None, text
    stream = fmt.stream()
    thinking, answer = stream.feed(text)
    more_thinking, more_answer = stream.finish()
    thinking, answer = thinking + more_thinking, answer + more_answer
    return thinking or None, answer


def thinking_block(thinking: str) -> dict[str, str]:
    """Anthropic's Messages API ``thinking`` content block (no signature: nothing here signs it)."""
    return {"type": "thinking", "thinking": thinking, "signature": ""}
