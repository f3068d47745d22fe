"""Image preparation and the tile-grid layout against transformers' Idefics3 image
processor (tests/fixtures/idefics3_tiny, made by its make_reference.py), and every
rejection of a bad image."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from helios_serve.frontend.images import (
    ImageInputError,
    ImageLimits,
    decode_data_url,
    decode_image,
    span_tokens,
    tile_image,
)
from helios_serve.frontend.syntax import ImageResample, ImageTiling, ImageTokenLayout
from PIL import Image

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "idefics3_tiny"
REFERENCE = np.load(FIXTURE / "reference.npz")
META = json.loads((FIXTURE / "reference.json").read_text())
TILING = ImageTiling(tile_pixels=64, patch_pixels=16, resize_longest_edge=128,
                     resample=ImageResample.LANCZOS, rescale=1 / 255, mean=(0.5,) * 3,
                     std=(0.5,) * 3)
# The fixture tokenizer's ids: <fake_token_around_image> 3, <image> 4, <global-img> 5,
# <row_r_col_c> 6..9, "Ċ" (newline) 208.
LAYOUT = ImageTokenLayout(feature_token_id=300, span_start_token_id=3, span_end_token_id=3,
                          row_separator_token_id=208, patches_per_feature=4, atomic_spans=True,
                          tile_token_ids=(6, 7, 8, 9), tile_grid_columns=2, global_token_id=5,
                          grid_end_token_ids=(208, 208), template_placeholder="<image>")
LIMITS = ImageLimits()


def _load(name: str) -> Image.Image:
    return decode_image((FIXTURE / name).read_bytes(), "image", LIMITS)


def _encode(image: Image.Image, fmt: str, **kw) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kw)
    return buffer.getvalue()


def test_windows_equal_the_processor():
    wide, square = (tile_image(_load(n), TILING) for n in ("wide.png", "square.png"))
    assert (wide.rows, wide.cols, square.rows, square.cols) == (1, 2, 2, 2)
    assert [wide.rows, square.rows] == META["rows"] and [wide.cols, square.cols] == META["cols"]
    windows = np.concatenate([wide.windows, square.windows])
    assert windows.shape == (8, 3, 64, 64) and windows.dtype == np.float32
    np.testing.assert_array_equal(windows, REFERENCE["pixel_values"])


def test_span_tokens_equal_the_processor_prompt():
    ids = REFERENCE["input_ids"].tolist()
    wide, square = (tile_image(_load(n), TILING) for n in ("wide.png", "square.png"))
    spans = [span_tokens(image, LAYOUT, 4, sentinel=300) for image in (wide, square)]
    # the processor writes <image> (4) where Helios writes the nonsampled sentinel
    spans = [[4 if t == 300 else t for t in span] for span in spans]
    assert ids[6:6 + len(spans[0])] == spans[0]
    start = ids.index(3, 6 + len(spans[0]))
    assert ids[start:start + len(spans[1])] == spans[1]
    assert (len(spans[0]), len(spans[1])) == (21, 34)


def test_one_tile_image_is_the_global_view_alone():
    tiling = ImageTiling(tile_pixels=64, patch_pixels=16, resize_longest_edge=64,
                         resample=ImageResample.LANCZOS, rescale=1 / 255, mean=(0.5,) * 3,
                         std=(0.5,) * 3)
    image = tile_image(_load("wide.png"), tiling)
    assert (image.rows, image.cols, image.windows.shape) == (0, 0, (1, 3, 64, 64))
    assert span_tokens(image, LAYOUT, 4, 300) == [3, 5, 300, 300, 300, 300, 3]


def test_content_hash_is_the_pixels_not_the_encoding():
    picture = Image.open(FIXTURE / "square.png").convert("RGB")
    png = tile_image(decode_image(_encode(picture, "PNG"), "a", LIMITS), TILING)
    webp = tile_image(decode_image(_encode(picture, "WEBP", lossless=True), "b", LIMITS), TILING)
    other = tile_image(_load("wide.png"), TILING)
    assert png.content_hash == webp.content_hash != other.content_hash
    assert len(png.content_hash) == 32


def test_exif_orientation_is_applied():
    picture = Image.open(FIXTURE / "wide.png").convert("RGB")  # 120 x 40
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = _encode(picture, "JPEG", exif=exif.tobytes(), quality=95)
    assert decode_image(data, "image", LIMITS).size == (40, 120)


def test_transparency_is_composited_on_white():
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    decoded = decode_image(_encode(rgba, "PNG"), "image", LIMITS)
    assert decoded.mode == "RGB" and decoded.getpixel((0, 0)) == (255, 255, 255)


def test_data_url_round_trip():
    data = (FIXTURE / "wide.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert decode_data_url(url, "image", LIMITS) == data


@pytest.mark.parametrize(("url", "detail", "limit"), [
    ("https://example.com/cat.png", "data:image/...;base64", ""),
    ("data:image/png,abcd", "data:image/...;base64", ""),
    ("data:image/gif;base64,R0lGODlh", "unsupported image type 'image/gif'", "image types"),
    ("data:text/plain;base64,aGVsbG8=", "unsupported image type 'text/plain'", "image types"),
    ("data:image/png;base64,@@@@", "base64 is malformed", ""),
    ("data:image/png;base64," + "A" * 200, "exceeds 100 bytes", "max_image_bytes"),
])
def test_bad_data_urls(url, detail, limit):
    with pytest.raises(ImageInputError) as info:
        decode_data_url(url, "messages[0].content[1]", ImageLimits(max_bytes=100))
    assert detail in str(info.value) and info.value.limit == limit
    assert str(info.value).startswith("messages[0].content[1]: ")


def test_bad_image_bytes():
    png = (FIXTURE / "wide.png").read_bytes()
    gif = _encode(Image.new("RGB", (4, 4)), "GIF")
    cases = [
        (b"not an image at all", "not a readable PNG, JPEG or WebP image"),
        (gif, "not a readable PNG, JPEG or WebP image"),
        (png[: len(png) // 2], "corrupt or truncated"),
    ]
    for data, detail in cases:
        with pytest.raises(ImageInputError) as info:
            decode_image(data, "image", LIMITS)
        assert detail in str(info.value), (detail, str(info.value))


def test_declared_type_must_match():
    with pytest.raises(ImageInputError) as info:
        decode_image((FIXTURE / "wide.png").read_bytes(), "image", LIMITS, "image/jpeg")
    assert "says image/jpeg but the image is image/png" in str(info.value)


def test_huge_dimensions_are_refused_before_decoding():
    # PNG headers over tiny bodies: refused from the header's size, before decoding
    big = _encode(Image.new("L", (2000, 1000)), "PNG", optimize=True)
    with pytest.raises(ImageInputError) as info:
        decode_image(big, "image", ImageLimits(max_pixels=1 << 20))
    assert info.value.limit == "max_image_pixels"
    assert str(info.value) == ("image: the image is 2000x1000 = 2000000 pixels; the limit "
                               "is 1048576")
    bomb = _encode(Image.new("L", (20000, 20000)), "PNG", optimize=True)  # Pillow's own bound
    with pytest.raises(ImageInputError) as info:
        decode_image(bomb, "image", ImageLimits(max_pixels=1 << 20))
    assert (str(info.value), info.value.limit) == ("image: the image has too many pixels",
                                                   "max_image_pixels")


def test_the_placeholder_must_encode_as_one_token():
    """Startup (the output frontend) and lint-core share this finding."""
    from helios_contract.schema import frontend_pb2 as fpb
    from helios_tools.token_rules import token_findings
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(FIXTURE / "checkpoint" / "tokenizer.json"))
    front = fpb.FrontendContract(image_layout=fpb.IMAGE_LAYOUT_TILE_GRID_SPAN,
                                 image_token_layout=fpb.ImageTokenLayout(
                                     template_placeholder="<image>"))
    assert list(token_findings(front, tok)) == []
    front.image_token_layout.template_placeholder = "[img]"
    (finding,) = token_findings(front, tok)
    assert (finding.rule, finding.path, finding.value) == (
        "frontend.token_bound", "model.frontend.image_token_layout.template_placeholder",
        "[img]")
    assert finding.detail.startswith("the layout replaces the image placeholder's one token; "
                                     "the tokenizer encodes it as ")
