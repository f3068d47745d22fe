"""Image preparation and token layout (the specification, "Frontend implementations":
image preparation and image layout are independent enum selectors over declared data).

Bad input is a value: every rejection is an `ImageInputError` naming the content part
and the limit, which the HTTP layer answers with 400; nothing here touches the engine.

Decoding is bounded before any pixel is decoded: the encoded bytes (`ImageLimits.
max_bytes`), the format (PNG, JPEG, WebP: the header Pillow identifies, never the
declared MIME type alone) and the pixel count of the header's size (`max_pixels`,
against decompression bombs). EXIF orientation is applied, transparency composited on
white (as transformers' ``convert_to_rgb``), then IMAGE_PREPARATION_TILED_GLOBAL:

1. resize the longest edge to ``resize_longest_edge`` (aspect kept; the other edge
   ``int(edge / aspect)``, rounded up to even, at least 1);
2. resize each edge up to a multiple of ``tile_pixels`` (the short edge from
   ``int(long / aspect)``);
3. more than one tile: row-major tiles, then the whole image resized to one tile (the
   global view); one tile: the image alone, which is the global view;
4. rescale and normalize per RGB channel in float32.

Steps 1-3 are transformers' ``Idefics3ImageProcessorPil`` (``_resize_output_size_
rescale_to_max_len``, ``resize_for_vision_encoder``, ``split_images``), resampled by
Pillow on 8-bit RGB as it does; tests/fixtures/idefics3_tiny holds its outputs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from .syntax import ImageResample, ImageTiling, ImageTokenLayout

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_RESAMPLE = {ImageResample.BILINEAR: Image.Resampling.BILINEAR,
             ImageResample.BICUBIC: Image.Resampling.BICUBIC,
             ImageResample.LANCZOS: Image.Resampling.LANCZOS}


class ImageInputError(ValueError):
    """An image content part that cannot be prepared: `where` names the part, `limit`
    the bound or rule it broke (a 400 whatever the reason)."""

    def __init__(self, where: str, detail: str, limit: str = "") -> None:
        super().__init__(f"{where}: {detail}")
        self.where, self.detail, self.limit = where, detail, limit


@dataclass(frozen=True)
class ImageLimits:
    """Per-request image bounds (serving options, within the contract's capacities).

    Attributes:
        max_images: images per request.
        max_pixels: width x height of one decoded image.
        max_bytes: encoded bytes of one image.
    """

    max_images: int = 8
    max_pixels: int = 4096 * 4096
    max_bytes: int = 16 << 20


@dataclass(frozen=True)
class PreparedImage:
    """One image's encoder windows.

    Attributes:
        windows: ``[W, 3, tile, tile]`` f32 normalized pixels, the tiles row-major then
            the global view (W = rows x cols + 1, or 1 without tiles).
        rows / cols: the tile grid (0, 0 without tiles).
        content_hash: SHA-256 of the windows' bytes: the image span's prefix-cache key
            (equal pixels after preparation are the same span, whatever the encoding).
    """

    windows: np.ndarray
    rows: int
    cols: int
    content_hash: bytes


def decode_data_url(url: str, where: str, limits: ImageLimits) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL.

    Raises:
        ImageInputError: not a base64 data URL of an image MIME type, bad base64, or
            more than ``limits.max_bytes`` bytes.
    """
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ImageInputError(where, "an image URL is a data:image/...;base64, URL")
    mime = head[len("data:"):-len(";base64")].lower()
    if mime not in FORMATS.values():
        raise ImageInputError(where, f"unsupported image type {mime!r}: send one of "
                              f"{', '.join(sorted(FORMATS.values()))}", "image types")
    if len(payload) > (limits.max_bytes + 2) // 3 * 4 + 4:  # before decoding it
        raise ImageInputError(where, f"the image exceeds {limits.max_bytes} bytes",
                              "max_image_bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError(where, "the data URL's base64 is malformed") from None
    if len(data) > limits.max_bytes:
        raise ImageInputError(where, f"the image exceeds {limits.max_bytes} bytes",
                              "max_image_bytes")
    return data


def decode_image(data: bytes, where: str, limits: ImageLimits,
                 declared_mime: str | None = None) -> Image.Image:
    """Decode `data` into an 8-bit RGB image, orientation applied.

    Raises:
        ImageInputError: not PNG/JPEG/WebP, a format other than `declared_mime`, more
            than ``limits.max_pixels`` pixels, or a corrupt or truncated file.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(FORMATS))
    except Image.DecompressionBombError:
        raise ImageInputError(where, "the image has too many pixels", "max_image_pixels") from None
    except (OSError, ValueError, Image.DecompressionBombWarning, SyntaxError):
        raise ImageInputError(where, "not a readable PNG, JPEG or WebP image") from None
    mime = FORMATS[image.format]
    if declared_mime is not None and declared_mime != mime:
        raise ImageInputError(where, f"the data URL says {declared_mime} but the image is "
                              f"{mime}", "image types")
    width, height = image.size
    if width * height > limits.max_pixels:
        raise ImageInputError(where, f"the image is {width}x{height} = {width * height} "
                              f"pixels; the limit is {limits.max_pixels}", "max_image_pixels")
    try:
        image.load()
        image = ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError):
        raise ImageInputError(where, "the image is corrupt or truncated") from None
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _fit_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """Step 1: (height, width) with the longest edge `longest`, the other rounded up to
    even (transformers' ``_resize_output_size_rescale_to_max_len``)."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    return max(height, 1), max(width, 1)


def _tile_multiple(height: int, width: int, tile: int) -> tuple[int, int]:
    """Step 2: each edge up to a multiple of `tile` (``resize_for_vision_encoder``)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def tile_image(image: Image.Image, tiling: ImageTiling) -> PreparedImage:
    """IMAGE_PREPARATION_TILED_GLOBAL of one decoded RGB image (steps 1-4 above)."""
    resample = _RESAMPLE[tiling.resample]
    tile = tiling.tile_pixels
    height, width = _fit_longest(image.height, image.width, tiling.resize_longest_edge)
    image = image.resize((width, height), resample)
    height, width = _tile_multiple(height, width, tile)
    image = image.resize((width, height), resample)
    pixels = np.asarray(image)  # [H, W, 3] u8
    if height > tile or width > tile:
        rows, cols = height // tile, width // tile
        parts = [pixels[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile]
                 for r in range(rows) for c in range(cols)]
        parts.append(np.asarray(image.resize((tile, tile), resample)))
    else:
        rows = cols = 0
        parts = [pixels]
    stack = np.stack(parts).astype(np.float64) * tiling.rescale  # [W, T, T, 3]
    mean = np.asarray(tiling.mean, np.float32)
    std = np.asarray(tiling.std, np.float32)
    windows = (stack.astype(np.float32) - mean) / std
    windows = np.ascontiguousarray(windows.transpose(0, 3, 1, 2), dtype=np.float32)
    return PreparedImage(windows, rows, cols, hashlib.sha256(windows.tobytes()).digest())


def span_tokens(image: PreparedImage, layout: ImageTokenLayout, features_per_window: int,
                sentinel: int) -> list[int]:
    """IMAGE_LAYOUT_TILE_GRID_SPAN: the token ids of one image's atomic span, each
    window's features written as `sentinel` (the feature slot it fills is its order)."""
    features = [sentinel] * features_per_window
    start = layout.span_start_token_id
    out: list[int] = []
    for r in range(image.rows):
        for c in range(image.cols):
            out += [start, layout.tile_token_ids[r * layout.tile_grid_columns + c], *features]
        out += [layout.row_separator_token_id] if r + 1 < image.rows else \
            list(layout.grid_end_token_ids)
    out += [start, layout.global_token_id, *features, layout.span_end_token_id]
    return out
