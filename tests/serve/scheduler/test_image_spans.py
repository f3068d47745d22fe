"""Image spans in the scheduler: chunks never end inside a span, a step's images fit
the encoder's windows, and the prefix cache keys feature positions by content."""

from __future__ import annotations

from helios_serve.engine.plan import PromptImage
from helios_serve.scheduler.request import SchedRequest
from helios_serve.scheduler.sequence import Sequence


def _image(start: int, end: int, windows: int, seed: int) -> PromptImage:
    return PromptImage(start, end, tuple(range(start + 2, end - 1)), b"", windows, 2,
                       bytes([seed]) * 32)


def _seq(*images: PromptImage, length: int = 100) -> Sequence:
    return Sequence(SchedRequest(1, tuple(range(length)), 4, images=images), 0)


def test_a_chunk_ends_before_a_span_it_would_split():
    seq = _seq(_image(10, 30, 2, 1), _image(40, 70, 3, 2))
    assert seq.image_cut(0, 20, 8) == (10, 0)  # would end inside [10, 30)
    assert seq.image_cut(0, 30, 8) == (30, 2)  # ends at its end
    assert seq.image_cut(0, 50, 8) == (40, 2)  # the second would be split
    assert seq.image_cut(0, 80, 8) == (80, 5)
    assert seq.image_cut(12, 10, 8) == (0, 0)  # starts inside a span: all of it or nothing
    assert seq.image_cut(30, 10, 8) == (10, 0)


def test_a_steps_images_fit_the_encoder_windows():
    seq = _seq(_image(10, 30, 2, 1), _image(40, 70, 3, 2))
    assert seq.image_cut(0, 80, 4) == (40, 2)  # the second image waits for a step
    assert seq.image_cut(0, 80, 1) == (10, 0)
    assert seq.image_cut(40, 40, 3) == (40, 3)


def test_cache_tokens_key_feature_positions_by_content():
    a, b = _image(10, 30, 2, 1), _image(10, 30, 2, 2)
    one, other, same = _seq(a), _seq(b), _seq(_image(10, 30, 2, 1))
    assert one.tokens == other.tokens  # the same ids ...
    assert one.cache_tokens != other.cache_tokens  # ... keyed apart by content
    assert one.cache_tokens == same.cache_tokens
    keys = one.cache_tokens
    assert keys[:12] == list(range(12)) and keys[29:] == list(range(29, 100))
    assert all(k >= 1 << 62 for k in keys[12:29]) and len(set(keys[12:29])) == 17
    assert one.chunk_images(0, 10) == () and one.chunk_images(29, 31) == (a,)
