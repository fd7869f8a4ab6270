"""A request's image parts to the engine's ``ImageInput``s, the same for every API.

Each API reads its own spelling of an image (chat's ``image_url`` part, the Responses API's
``input_image``, a Messages ``image`` block) into an ``ImagePart``: the URL as sent (an Anthropic
base64 source becomes the ``data:`` URL it stands for) and the part's path (``messages[0].content[1]``).
``image_inputs`` then turns the conversation's parts, in order, into the files' bytes, or a 400 naming
the part:

- a model that reads no images (``ModelFacts.takes_images`` false) refuses them before any work;
- more than ``--max-images-per-request`` images: the first part over the limit is named;
- a ``data:`` URL is decoded (base64, or percent-encoded without ``;base64``); bad base64 is a 400;
- an ``http(s)`` URL is fetched only from a host ``--allowed-media-domains`` names (none by default: the
  server never reaches an address a client chose), with ``--media-fetch-timeout`` for the whole fetch,
  the size limit counted while the body streams in (a missing or false ``Content-Length`` changes
  nothing, a compressed body is counted as it is decompressed), and a redirect followed only to an
  allowed host;
- ``file://`` and every other scheme are 400s;
- a file over ``--max-image-bytes`` is a 400 (before a data: URL is decoded, from its length).

What the bytes hold (a format Pillow opens, a pixel count within ``--max-image-pixels``, a whole file)
is checked where the pixels are decoded, by the engine's processor (``decoding.vision.open_image``),
whose error names the same part.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

import httpx

from decoding import EngineClient, ParameterError
from decoding.media import ImageInput, ImageLimits
from server.config.media_domains import parse_media_domains
from server.config.settings import Settings

MAX_REDIRECTS = 3
FETCHED_SCHEMES = ("http", "https")
FLAG = "--allowed-media-domains"


@dataclass(frozen=True)
class ImagePart:
    """One image of a conversation as the request wrote it: its URL and the path of its part."""

    url: str
    param: str


@dataclass(frozen=True)
class MediaPolicy:
    """What the server's settings allow a request's images."""

    limits: ImageLimits
    hosts: tuple[str, ...] = ()  # --allowed-media-domains: hosts whose http(s) URLs are fetched
    fetch_timeout: float = 10.0

    @classmethod
    def of(cls, settings: Settings) -> MediaPolicy:
        """The policy of the server's ``Settings``."""
        limits = ImageLimits(settings.max_image_bytes, settings.max_image_pixels, settings.max_images_per_request)
        return cls(limits, parse_media_domains(settings.allowed_media_domains), settings.media_fetch_timeout)


def base64_url(media_type: str, data: str) -> str:
    """An Anthropic base64 source as the data: URL it stands for."""
    return f"data:{media_type};base64,{data}"


def _refused(part: ImagePart, message: str, code: str = "invalid_image") -> ParameterError:
    return ParameterError(f"{part.param}: {message}", param=part.param, code=code)


def _too_large(part: ImagePart, size: int | str, limit: int) -> ParameterError:
    return _refused(
        part, f"the image is {size} bytes; at most {limit} are taken (--max-image-bytes)", "image_too_large"
    )


async def image_inputs(client: EngineClient, parts: Sequence[ImagePart], policy: MediaPolicy) -> list[ImageInput]:
    """Every part's file, in order (fetched ones concurrently); a ``ParameterError`` names the first part
    refused (see the module's docstring)."""
    if not parts:
        return []
    if not client.facts.takes_images:
        raise _refused(parts[0], f"model '{client.model_name}' does not take images: image parts are not served "
                       "by a text-only model", "images_not_supported")  # fmt: skip
    if len(parts) > policy.limits.max_images:
        raise _refused(parts[policy.limits.max_images], f"a request may hold at most {policy.limits.max_images} "
                       f"images (--max-images-per-request), this conversation holds {len(parts)}",
                       "too_many_images")  # fmt: skip
    files: list[bytes | None] = [_decoded(part, policy.limits.max_bytes) for part in parts]
    remote = [i for i, data in enumerate(files) if data is None]
    if remote:
        try:
            async with asyncio.TaskGroup() as group:  # the first failure cancels the other fetches
                tasks = {i: group.create_task(_fetched(parts[i], policy)) for i in remote}
        except ExceptionGroup as failed:  # a refused part is its own 400, not a group of errors
            refused = [error for error in failed.exceptions if isinstance(error, ParameterError)]
            if refused:
                raise refused[0] from None
            raise
        for i, task in tasks.items():
            files[i] = task.result()
    return [ImageInput(data, part.param) for data, part in zip(files, parts, strict=True)]


def _decoded(part: ImagePart, max_bytes: int) -> bytes | None:
    """A data: URL's bytes; None for a URL to fetch (one this server may fetch from); a 400 for the rest."""
    scheme = part.url.partition(":")[0].lower() if ":" in part.url else ""
    if scheme in FETCHED_SCHEMES:
        return None
    if scheme != "data":
        shown = f"'{scheme}:' URLs are" if scheme else "a URL without a scheme is"
        raise _refused(part, f"{shown} not taken: send the image as a data: URL (data:image/png;base64,...) or "
                       f"an http(s) URL of a host {FLAG} names", "invalid_image_url")  # fmt: skip
    header, comma, payload = part.url[len("data:") :].partition(",")
    if not comma:
        raise _refused(
            part, "a data: URL needs a comma before its data (data:image/png;base64,...)", "invalid_image_url"
        )
    if header.lower().endswith(";base64"):
        payload = "".join(payload.split())  # line breaks some encoders insert
        size = len(payload) * 3 // 4 - payload[-2:].count("=")
        if max_bytes and size > max_bytes:
            raise _too_large(part, size, max_bytes)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as error:
            raise _refused(part, f"the data: URL's base64 does not decode: {error}") from None
    else:
        data = unquote_to_bytes(payload)
    if max_bytes and len(data) > max_bytes:
        raise _too_large(part, len(data), max_bytes)
    if not data:
        raise _refused(part, "the data: URL holds no data")
    return data


def _allowed(part: ImagePart, url: str, policy: MediaPolicy) -> httpx.URL:
    """``url`` when this server may fetch it (an http(s) URL of an allowed host), else a 400. It is parsed
    by httpx itself, so the host checked is the host connected to."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise _refused(part, f"the image URL {url[:200]!r} does not parse", "invalid_image_url") from None
    host = parsed.host.lower().rstrip(".")
    if parsed.scheme not in FETCHED_SCHEMES or not host:
        raise _refused(part, f"the image URL led to {url[:200]!r}, which is not an http(s) URL", "invalid_image_url")
    if host not in policy.hosts:
        allowed = f"only from {', '.join(policy.hosts)}" if policy.hosts else "from no host"
        raise _refused(part, f"this server fetches image URLs {allowed} ({FLAG}); {host!r} is not among them: send "
                       "the image as a data: URL (data:image/png;base64,...)", "image_url_not_allowed")  # fmt: skip
    return parsed


async def _fetched(part: ImagePart, policy: MediaPolicy) -> bytes:
    """The file at the part's URL, within the time and size limits (see the module's docstring)."""
    url = _allowed(part, part.url, policy)
    try:
        async with asyncio.timeout(policy.fetch_timeout):
            async with httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=policy.fetch_timeout) as http:
                for _ in range(MAX_REDIRECTS + 1):
                    async with http.stream("GET", url) as response:
                        if not response.is_redirect:
                            return await _body(part, response, policy.limits.max_bytes)
                        url = _allowed(part, str(url.join(response.headers.get("location", ""))), policy)
    except TimeoutError:
        raise _refused(part, f"fetching the image took more than {policy.fetch_timeout:g} s (--media-fetch-timeout)",
                       "image_fetch_failed") from None  # fmt: skip
    except httpx.HTTPError as error:
        raise _refused(part, f"the image URL could not be fetched: {type(error).__name__}: {error}",
                       "image_fetch_failed") from None  # fmt: skip
    raise _refused(part, f"the image URL redirects more than {MAX_REDIRECTS} times", "image_fetch_failed")


async def _body(part: ImagePart, response: httpx.Response, max_bytes: int) -> bytes:
    if response.status_code != 200:
        raise _refused(part, f"fetching the image URL answered HTTP {response.status_code}", "image_fetch_failed")
    declared = response.headers.get("content-length", "")
    if max_bytes and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(part, declared, max_bytes)
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if max_bytes and len(data) > max_bytes:
            raise _too_large(part, f"more than {len(data)}", max_bytes)
    if not data:
        raise _refused(part, "the image URL's answer is empty")
    return bytes(data)
