"""A torch-free EngineClient for HTTP tests: a word tokenizer and scripted outputs.

With ``takes_images=True`` it stands for a vision-language model: ``apply_chat_template`` takes the
conversation's images, opens each with the real ``decoding.vision.open_image`` (so a bomb or a truncated
file is the engine's 400 naming its part), writes ``IMAGE_TOKENS`` placeholder ids where each
``{"type": "image"}`` part stands, and returns a ``PromptIds`` carrying them (kept in ``prompts``, the
images in ``images``), as the real engine client does."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace

from decoding import (
    EngineClient,
    FinishReason,
    GenerationParams,
    ModelFacts,
    QueueFullError,
    RequestOutput,
    SequenceDelta,
    ServedModel,
    TokenLogprob,
    TopLogprob,
)
from decoding.media import ImageInput, PromptIds
from decoding.params import ParameterError
from decoding.vision import open_image

WORDS = ["<eos>", "hello", "world", "foo", "bar", "baz", "the", "end"] + [f"w{i}" for i in range(92)]
IMAGE_TOKEN, IMAGE_TOKENS = 9, 4  # "w1" four times where each image stands


class FakeEngineClient(EngineClient):
    """Generates ``WORDS[1], WORDS[2], ...`` (one word per step) for each choice."""

    def __init__(
        self, *, delay: float = 0.0, fail: bool = False, queue_full: bool = False, error_code: str = "internal",
        takes_images: bool = False, max_image_pixels: int = 4096 * 4096,
    ) -> None:  # fmt: skip
        self.delay = delay
        self.fail = fail
        self.error_code = error_code  # what a failed request reports: "internal" or "unavailable"
        self.queue_full = queue_full
        self.alive = True
        self.submitted: list[tuple[str, list[int], GenerationParams]] = []
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.images: list[list[ImageInput]] = []  # the images of each rendering that had some
        self.prompts: list[list[int]] = []  # what each rendering returned
        self.max_image_pixels = max_image_pixels
        if takes_images:
            self.facts = dataclasses.replace(self.facts, takes_images=True)

    model_name = "fake-model"  # type: ignore[assignment]
    facts = ModelFacts(vocab_size=len(WORDS), max_model_len=64, num_layers=4)  # type: ignore[assignment]

    def served_models(self) -> list[ServedModel]:
        return [ServedModel(self.model_name, "target", self.max_model_len)]

    def is_alive(self) -> bool:
        return self.alive

    def is_ready(self) -> bool:
        return self.alive

    def _words(self, text: str) -> list[int]:
        return [WORDS.index(w) if w in WORDS else 3 for w in text.split()]

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._words(text)

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                                  template_kwargs: dict | None = None, add_generation_prompt: bool = True,
                                  add_special_tokens: bool = False,
                                  images: Sequence[ImageInput] = ()) -> list[int]:  # fmt: skip
        self.template_kwargs = template_kwargs
        ids = [t for m in messages for t in self._content_ids(m["content"])] + ([6] if add_generation_prompt else [])
        if not images:
            self.prompts.append(ids)
            return ids
        if not self.facts.takes_images:
            raise ParameterError(f"{images[0].param}: the model reads no images", param=images[0].param)
        if ids.count(IMAGE_TOKEN) != IMAGE_TOKENS * len(images):
            raise AssertionError(f"{len(images)} images for {ids.count(IMAGE_TOKEN) // IMAGE_TOKENS} image parts")
        pictures = [open_image(image, self.max_image_pixels) for image in images]
        self.images.append(list(images))
        prompt = PromptIds(ids, media=SimpleNamespace(images=pictures))
        self.prompts.append(prompt)
        return prompt

    def _content_ids(self, content: str | list[dict]) -> list[int]:
        """A message's ids: its text's words, and with parts each image's placeholders where it stands."""
        if isinstance(content, str):
            return self._words(content)
        ids: list[int] = []
        for part in content:
            ids += [IMAGE_TOKEN] * IMAGE_TOKENS if part["type"] == "image" else self._words(part["text"])
        return ids

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(WORDS[t] for t in token_ids)

    def generate(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        if self.queue_full:
            raise QueueFullError("the waiting queue is full", retry_after=2)
        self.submitted.append((request_id, prompt_ids, params))
        return self._run(request_id, prompt_ids, params)

    async def _run(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        done = False
        try:
            prompt_logprobs = None
            if params.prompt_logprobs is not None:
                prompt_logprobs = [
                    TokenLogprob(t, WORDS[t], None if i == 0 else -1.0) for i, t in enumerate(prompt_ids)
                ]
            generated = 0
            for step in range(params.max_new_tokens):
                await asyncio.sleep(self.delay)
                if self.fail:
                    done = True
                    error = f"request {request_id} failed: boom"
                    yield RequestOutput(request_id, finished=True, error=error, error_code=self.error_code)
                    return
                token = 1 + step % 7
                last = step == params.max_new_tokens - 1
                deltas = []
                for index in range(params.n):
                    text = (" " if step else "") + WORDS[token]
                    logprobs = None
                    if params.logprobs is not None:
                        top = [TopLogprob(token, WORDS[token], -0.5)][: params.logprobs]
                        logprobs = [TokenLogprob(token, WORDS[token], -0.5, top)]
                    deltas.append(SequenceDelta(index, text, [token], logprobs, FinishReason.LENGTH if last else None))
                generated += params.n
                output = RequestOutput(request_id, deltas, len(prompt_ids), generated, finished=last)
                if step == 0:
                    output.prompt_logprobs = prompt_logprobs
                done = last
                yield output
        finally:
            if done:
                self.finished.append(request_id)
            else:
                self.aborted.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
