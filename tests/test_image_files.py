"""``decoding.vision.open_image``: hostile image files are 400s naming their part, before any pixel is decoded."""

from __future__ import annotations

import struct
import zlib
from io import BytesIO

import pytest
from PIL import Image

from decoding import ParameterError
from decoding.media import ImageInput
from decoding.vision import open_image

PARAM = "messages[0].content[1]"
LIMIT = 4096 * 4096


def encoded(fmt: str, size: tuple[int, int] = (8, 6), **save: object) -> bytes:
    if fmt == "WEBP":
        save.setdefault("lossless", True)
    out = BytesIO()
    Image.new("RGB", size, (200, 30, 40)).save(out, format=fmt, **save)
    return out.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width: int, height: int) -> bytes:
    """A valid PNG header declaring ``width x height`` RGB pixels, followed by a few bytes of data."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + png_chunk(b"IEND", b""))  # fmt: skip


def refused(data: bytes, max_pixels: int = LIMIT) -> ParameterError:
    with pytest.raises(ParameterError) as caught:
        open_image(ImageInput(data, PARAM), max_pixels)
    error = caught.value
    assert (error.param, error.code) == (PARAM, "invalid_image")
    assert error.message.startswith(f"{PARAM}: ")
    return error


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_a_valid_image_opens_as_rgb(fmt):
    picture = open_image(ImageInput(encoded(fmt), PARAM), LIMIT)
    assert (picture.mode, picture.size) == ("RGB", (8, 6))
    if fmt in ("PNG", "WEBP"):  # lossless here: the pixels themselves
        assert picture.getpixel((3, 3)) == (200, 30, 40)


def test_an_rgba_png_and_a_palette_gif_come_out_rgb():
    out = BytesIO()
    Image.new("RGBA", (4, 4), (1, 2, 3, 0)).save(out, format="PNG")
    assert open_image(ImageInput(out.getvalue(), PARAM), LIMIT).mode == "RGB"
    out = BytesIO()
    Image.new("P", (4, 4), 7).save(out, format="GIF", transparency=7)
    assert open_image(ImageInput(out.getvalue(), PARAM), LIMIT).mode == "RGB"


def test_an_animated_gif_is_read_as_its_first_frame():
    frames = [Image.new("RGB", (5, 5), colour) for colour in ((255, 0, 0), (0, 0, 255), (0, 255, 0))]
    out = BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    picture = open_image(ImageInput(out.getvalue(), PARAM), LIMIT)
    red, green, blue = picture.getpixel((2, 2))
    assert red > 200 and green < 50 and blue < 50


def test_a_decompression_bomb_is_refused_from_its_header():
    """30000 x 30000 (900 M pixels: 2.7 GB as RGB) declared by a file of about a hundred bytes."""
    bomb = png_declaring(30000, 30000)
    assert len(bomb) < 200
    error = refused(bomb)
    assert "too many pixels" in error.message and "--max-image-pixels" in error.message


def test_an_image_over_max_pixels_but_under_pillows_own_guard_is_refused_before_decoding():
    error = refused(png_declaring(5000, 5000))  # 25 M pixels, under Pillow's 89 M warning: our limit decides
    assert "5000x5000 = 25000000 pixels" in error.message and str(LIMIT) in error.message
    refused(encoded("PNG", (20, 20)), max_pixels=399)
    assert open_image(ImageInput(encoded("PNG", (20, 20)), PARAM), 400).size == (20, 20)


def test_pillows_process_wide_limit_is_left_as_it_is():
    before = Image.MAX_IMAGE_PIXELS
    refused(png_declaring(30000, 30000))
    refused(png_declaring(5000, 5000))
    assert Image.MAX_IMAGE_PIXELS == before


def test_a_truncated_png_is_refused():
    whole = encoded("PNG", (64, 64))
    error = refused(whole[: len(whole) // 2])
    assert "damaged or truncated" in error.message or "not an image" in error.message


def test_a_header_whose_data_is_garbage_is_refused():
    refused(png_declaring(64, 64))  # the IDAT holds 64 bytes for 64 rows of 192


@pytest.mark.parametrize("payload", [b"hello, this is text", b"", b"\x89PNG\r\n\x1a\n"])
def test_a_payload_that_is_no_image_is_refused(payload):
    assert "not an image file" in refused(payload).message


def test_another_format_pillow_reads_is_refused_naming_the_formats_taken():
    error = refused(encoded("TIFF"))
    assert "PNG, JPEG, WEBP, GIF" in error.message
