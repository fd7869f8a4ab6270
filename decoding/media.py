"""The image contract between the APIs and the engine (torch-free, as the facade is).

An API reads a request's image parts (chat's ``image_url``, Responses' ``input_image``, Messages'
``image`` blocks), turns each into the file's bytes (a data: URL decoded, or a remote URL fetched
where the operator allowed its host) and hands them, in the order the parts appear in the
conversation, to ``EngineClient.apply_chat_template(..., images=...)``; the messages it renders carry
a ``{"type": "image"}`` content part where each image stood, which is how transformers' chat
templates of vision-language models place their image markers.

What comes back is a ``PromptIds``: the token ids with the model's placeholder tokens laid out as its
processor lays them out, plus the engine's own record of the images (``media``: pixels, where their
tokens sit, their content hashes). It is a ``list[int]`` so everything that measures, checks or logs
a prompt keeps working unchanged; the engine refuses a prompt holding image placeholder tokens
without its images (a copy that lost ``media``), so an image is never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ImageInput:
    """One image of a request: the encoded file as the client sent it (PNG, JPEG, WebP, GIF...) and
    the path of the part it came from (``messages[0].content[1]``), which every error about it names."""

    data: bytes
    param: str


@dataclass(frozen=True)
class ImageLimits:
    """What one request may send (the one size table's ``max_image_bytes``, ``max_image_pixels``,
    ``max_images_per_request``): checked on the file's header, before any pixel is decoded."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 4096 * 4096
    max_images: int = 8


class PromptIds(list):
    """A prompt's token ids (a ``list[int]``) and, for a prompt with images, the engine's record of
    them (``media``; opaque to the server, which only passes it back with the ids)."""

    def __init__(self, ids: Iterable[int] = (), media: object | None = None) -> None:
        super().__init__(ids)
        self.media = media

    @property
    def num_images(self) -> int:
        return 0 if self.media is None else len(getattr(self.media, "images", ()))


def media_of(prompt_ids: object) -> object | None:
    """The images a prompt carries (None for a plain list of ids)."""
    return getattr(prompt_ids, "media", None)
