"""Image content parts of a chat request: what the chat template sees, and the prompt's
image spans (the specification, "Frontend implementations": layout data declares feature
IDs and atomic spans; the layout produces token positions, feature mappings and the
vision tensors).

A message's ``image_url`` part reaches the template as ``{"type": "image"}``; the
template writes the layout's placeholder text, which the tokenizer encodes as one token.
After encoding, each placeholder token is replaced by its image's span
(images.span_tokens), in order, and the image becomes a `PromptImage` naming its span
and the positions of its feature sentinels. A placeholder the user typed in text makes
the counts disagree: rejected, never guessed.

Every bound is checked here, before the engine sees the request: images per request,
bytes and pixels per image (ImageLimits), each span within one prefill chunk and the
encoder's window capacity, and the features of all images within the core's
``vision.feature_slots``.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from helios_serve.engine.plan import ModelGeometry, PromptImage

from .errors import FrontendRequestError
from .images import (
    ImageInputError,
    ImageLimits,
    decode_data_url,
    decode_image,
    span_tokens,
    tile_image,
)
from .syntax import FrontendSyntax, ImagePreparation

FETCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ImageSource:
    """One image part: where it is in the request (for errors) and its URL."""

    where: str
    url: str


def _fail(error: ImageInputError) -> FrontendRequestError:
    return FrontendRequestError(error.where, error.detail)


class ImagePrompt:
    """Image parts to template parts and prompt spans for one served model.

    Args:
        syntax: the core's frontend syntax (image selectors, tiling, layout).
        geometry: the serving geometry (prefill chunk, encoder windows, feature slots).
        limits: per-request image bounds (serving options).
        allow_urls: fetch http(s) image URLs (``--allow-image-urls``); else only data:
            URLs are accepted.
    """

    def __init__(self, syntax: FrontendSyntax, geometry: ModelGeometry,
                 limits: ImageLimits | None = None, allow_urls: bool = False) -> None:
        self.syntax = syntax
        self.geometry = geometry
        self.limits = limits or ImageLimits()
        self.allow_urls = allow_urls
        self.accepts = syntax.image_preparation is ImagePreparation.TILED_GLOBAL
        tiling, layout = syntax.image_tiling, syntax.image_token_layout
        if self.accepts:
            per_window = (tiling.tile_pixels // tiling.patch_pixels) ** 2
            self.features_per_window = per_window // layout.patches_per_feature

    def message_parts(self, i: int, content: Sequence[Mapping[str, Any]],
                      sources: list[ImageSource]) -> list[dict[str, Any]]:
        """The template's parts of message `i`'s `content`; image parts are appended to
        `sources` in prompt order.

        Raises:
            FrontendRequestError: an image on a model without images, or too many images.
        """
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            if part.get("type") == "text":
                parts.append({"type": "text", "text": part["text"]})
                continue
            where = f"messages[{i}].content[{j}]"
            if not self.accepts:
                raise FrontendRequestError(where, "this model accepts no images")
            if len(sources) == self.limits.max_images:
                raise FrontendRequestError(where, f"more than {self.limits.max_images} images "
                                           "in one request (max_images_per_request)")
            sources.append(ImageSource(f"{where}.image_url", part["image_url"]["url"]))
            parts.append({"type": "image"})
        return parts

    def expand(self, prompt_ids: Sequence[int], placeholder_id: int | None,
               sources: Sequence[ImageSource]) -> tuple[tuple[int, ...], tuple[PromptImage, ...],
                                                        list[int]]:
        """Replace each placeholder token of `prompt_ids` by its image's span.

        Returns:
            (the prompt's ids, its images, for each original token index the index it
            moved to: shifts token counts such as prefix endpoints).

        Raises:
            FrontendRequestError: an image cannot be read or breaks a bound, or the
                placeholders and images disagree in number.
        """
        layout = self.syntax.image_token_layout
        at = [k for k, t in enumerate(prompt_ids) if t == placeholder_id]
        if len(at) != len(sources):
            raise FrontendRequestError(
                "messages", f"the prompt holds {len(at)} image placeholders "
                f"({layout.template_placeholder!r}) for {len(sources)} images: the text may "
                "not contain the placeholder")
        chunk = self.geometry.prefill_token_capacities[-1]
        ids: list[int] = []
        moved: list[int] = []
        images: list[PromptImage] = []
        features = 0
        for token in prompt_ids:
            moved.append(len(ids))
            if token != placeholder_id:
                ids.append(token)
                continue
            source = sources[len(images)]
            prepared = tile_image(self._decode(source), self.syntax.image_tiling)
            span = span_tokens(prepared, layout, self.features_per_window,
                               layout.feature_token_id)
            windows = prepared.windows.shape[0]
            if len(span) > chunk or windows > self.geometry.image_windows:
                raise FrontendRequestError(source.where, f"its span of {len(span)} tokens and "
                                           f"{windows} windows exceeds the prefill chunk of "
                                           f"{chunk} tokens or the encoder's "
                                           f"{self.geometry.image_windows} windows")
            start = len(ids)
            ids.extend(span)
            positions = tuple(start + p for p, t in enumerate(span)
                              if t == layout.feature_token_id)
            features += len(positions)
            if features > self.geometry.image_feature_slots:
                raise FrontendRequestError(source.where, f"the images need {features} feature "
                                           f"slots; the model holds "
                                           f"{self.geometry.image_feature_slots} per request "
                                           "(vision.feature_slots)")
            images.append(PromptImage(start, len(ids), positions, prepared.windows.tobytes(),
                                      windows, prepared.windows.shape[-1],
                                      prepared.content_hash))
        moved.append(len(ids))
        return tuple(ids), tuple(images), moved

    def _decode(self, source: ImageSource):
        try:
            url = source.url
            if url.startswith("data:"):
                return decode_image(decode_data_url(url, source.where, self.limits),
                                    source.where, self.limits, _declared(url))
            if not url.startswith(("http://", "https://")):
                raise ImageInputError(source.where, "an image URL is a data: URL (or http(s) "
                                      "with --allow-image-urls)")
            if not self.allow_urls:
                raise ImageInputError(source.where, "remote image URLs are refused: send a "
                                      "data: URL, or start the server with --allow-image-urls",
                                      "allow_image_urls")
            return decode_image(self._fetch(source), source.where, self.limits)
        except ImageInputError as exc:
            raise _fail(exc) from None

    def _fetch(self, source: ImageSource) -> bytes:
        """GET an http(s) image within FETCH_TIMEOUT_S and ``limits.max_bytes``."""
        limit = self.limits.max_bytes
        try:
            with urllib.request.urlopen(source.url, timeout=FETCH_TIMEOUT_S) as response:
                data = response.read(limit + 1)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ImageInputError(source.where, f"the image URL could not be fetched: "
                                  f"{getattr(exc, 'reason', exc)}") from None
        if len(data) > limit:
            raise ImageInputError(source.where, f"the image exceeds {limit} bytes",
                                  "max_image_bytes")
        return data


def _declared(url: str) -> str:
    return url[len("data:"):url.index(";")].lower()
