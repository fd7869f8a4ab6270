"""An image a client sent, opened safely: its header read and checked before any pixel is decoded.

A client's image is hostile until proven otherwise. A PNG of a few hundred bytes may declare
30000 x 30000 pixels (a decompression bomb: 2.7 GB once decoded as RGB); a truncated file, text
sent as an image, or a format with a risky decoder must be a 400 naming the part it came from,
never a ``MemoryError`` or a Pillow exception escaping as a 500. So:

- only the formats OpenAI's image inputs take are opened (PNG, JPEG, WebP, GIF), which keeps
  Pillow's rarer plugins (EPS runs Ghostscript) out of reach;
- ``Image.open`` reads the header only; the declared ``width * height`` is checked against
  ``max_pixels`` (``--max-image-pixels``) before ``convert`` decodes anything. Pillow's own process-wide
  guard (``Image.MAX_IMAGE_PIXELS``, which raises ``DecompressionBombError`` inside ``open`` for images
  over twice its value) is left as it is, since other code in the process shares it; its error is
  answered the same way as ours (so a ``--max-image-pixels`` above that, 179 M pixels by default, takes
  no image larger than Pillow's guard does);
- an animated GIF or WebP is read as its first frame, as OpenAI reads a GIF.
"""

from __future__ import annotations

from io import BytesIO

from PIL import Image

from decoding.media import ImageInput
from decoding.params import ParameterError

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # OpenAI's image inputs' formats
INVALID = "invalid_image"


def _refused(image: ImageInput, message: str) -> ParameterError:
    return ParameterError(f"{image.param}: {message}", param=image.param, code=INVALID)


def open_image(image: ImageInput, max_pixels: int) -> Image.Image:
    """The image's first frame as an RGB picture, or a ``ParameterError`` naming ``image.param`` (code
    ``invalid_image``) for a file that is no image, is truncated, is in another format, or declares more
    than ``max_pixels`` pixels (refused from its header, before any pixel is decoded)."""
    try:
        picture = Image.open(BytesIO(image.data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as error:  # Pillow's own guard, raised from the header
        raise _refused(image, f"the image declares too many pixels ({error}); at most {max_pixels} are "
                              "taken (--max-image-pixels)") from None  # fmt: skip
    except (OSError, SyntaxError, ValueError, EOFError) as error:  # UnidentifiedImageError is an OSError
        raise _refused(image, f"not an image file in a format taken here ({', '.join(IMAGE_FORMATS)}): "
                              f"{error}") from None  # fmt: skip
    with picture:
        width, height = picture.size
        if width * height > max_pixels:
            raise _refused(image, f"the image is {width}x{height} = {width * height} pixels; at most {max_pixels} "
                                  "are taken (--max-image-pixels)")  # fmt: skip
        if width < 1 or height < 1:
            raise _refused(image, f"the image is {width}x{height}: it has no pixels")
        try:
            picture.seek(0)  # an animated image: its first frame
            return picture.convert("RGB")  # decodes the pixels (a copy: the file can close)
        except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as error:
            raise _refused(image, f"the image file is damaged or truncated: {error}") from None
