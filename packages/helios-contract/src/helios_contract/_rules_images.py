"""Image rules: the layout data and tile geometry agree with the vision capacities and
the input vocabulary (the specification, ModelContract ``vision`` and ``input_vocabulary``;
"Frontend implementations": "Image token layout data declares feature IDs and atomic
spans").

The arithmetic both the rules and the serving frontend read is here once:
`patches_per_window`, `max_tile_grid` and `max_windows` (the frontend's preparation
never produces more windows than the rules checked the capacities against).

- a model without images declares no layout data, sentinels or image bindings;
- an image model declares every vision capacity and its layout data;
- the feature token is a declared sentinel; every other layout token lies in the input
  range (TILE_GRID_SPAN: tile tokens distinct, a whole number of grid rows);
- TILED_GLOBAL declares its tile geometry (and only it does): the patch divides the
  tile, three means and positive stds, a positive rescale, a resample filter;
- one window's patches are ``features_per_window x patches_per_feature`` (and a pixel
  shuffle merges a square of patches, so ``patches_per_feature`` is a square whose
  side divides the patch grid);
- the largest image's tile grid fits the declared tile tokens, its features fit
  ``feature_slots``, its patches the largest patch capacity (an image span is atomic:
  one submission encodes it whole), and every patch capacity is whole windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract._gen.helios.v1 import frontend_pb2 as fpb
from helios_contract._rules_contract import enum_name
from helios_contract.errors import (
    BindingError,
    DuplicateIdentifierError,
    ExtentError,
    FrontendSyntaxError,
    MissingFieldError,
    UnspecifiedSelectorError,
    VocabularyRangeError,
)
from helios_contract.findings import Finding

F = Finding.of
Findings = Iterator[Finding]
FRONTEND = "model.frontend"
IMAGE_SOURCES = (
    pb.VALUE_SOURCE_IMAGE_FEATURE_INDEX,
    pb.VALUE_SOURCE_IMAGE_CONTEXT_INDEX,
    pb.VALUE_SOURCE_IMAGE_FEATURE_SLOT,
    pb.VALUE_SOURCE_IMAGE_TENSOR,
)


def patches_per_window(tiling: fpb.ImageTiling) -> int:
    """Patches of one window: (tile_pixels / patch_pixels)^2 (0 for a bad geometry)."""
    if not tiling.patch_pixels or tiling.tile_pixels % tiling.patch_pixels:
        return 0
    return (tiling.tile_pixels // tiling.patch_pixels) ** 2


def max_tile_grid(tiling: fpb.ImageTiling) -> int:
    """Tiles along either edge of the largest image: ceil(resize_longest_edge /
    tile_pixels) (a square image resized to the longest edge has that many rows and
    columns; preparation never makes more)."""
    if not tiling.tile_pixels:
        return 0
    return -(-tiling.resize_longest_edge // tiling.tile_pixels)


def max_windows(tiling: fpb.ImageTiling) -> int:
    """Windows of the largest image: its full tile grid plus the global view."""
    side = max_tile_grid(tiling)
    return side * side + 1 if side > 1 else 1


def layout_token_ids(layout_enum: int, layout: fpb.ImageTokenLayout
                     ) -> list[tuple[str, int]]:  # fmt: skip
    """(field path under image_token_layout, id) of every token layout `layout_enum`
    writes into a prompt (the feature sentinel included)."""
    names = ["feature_token_id", "span_start_token_id", "span_end_token_id"]
    if layout_enum in (fpb.IMAGE_LAYOUT_ROW_SEPARATED_SPAN, fpb.IMAGE_LAYOUT_TILE_GRID_SPAN):
        names.append("row_separator_token_id")
    if layout_enum == fpb.IMAGE_LAYOUT_TILE_GRID_SPAN:
        names.append("global_token_id")
    ids = [(name, getattr(layout, name)) for name in names]
    if layout_enum == fpb.IMAGE_LAYOUT_TILE_GRID_SPAN:
        ids += [(f"tile_token_ids[{i}]", v) for i, v in enumerate(layout.tile_token_ids)]
        ids += [(f"grid_end_token_ids[{i}]", v) for i, v in enumerate(layout.grid_end_token_ids)]
    return ids


def _no_images(model: pb.ModelContract) -> Findings:
    front = model.frontend
    if front.HasField("image_token_layout"):
        yield F("frontend.syntax_unused", FrontendSyntaxError, f"{FRONTEND}.image_token_layout",
                "set", "IMAGE_LAYOUT_NONE reads no image token layout")
    if model.input_vocabulary.image_sentinel_ids:
        yield F("vocabulary.image_sentinel", VocabularyRangeError,
                "model.input_vocabulary.image_sentinel_ids",
                list(model.input_vocabulary.image_sentinel_ids),
                "image sentinels without an image layout")
    for g, graph in enumerate(model.graphs):
        for b, binding in enumerate(graph.bindings):
            if binding.source in IMAGE_SOURCES:
                yield F("binding.image_source", BindingError,
                        f"model.graphs[{g}].bindings[{b}].source",
                        enum_name(pb.ValueSource, binding.source),
                        "image inputs bound while the image layout is IMAGE_LAYOUT_NONE")


def _tiling(front: fpb.FrontendContract) -> Findings:
    """IMAGE_PREPARATION_TILED_GLOBAL's geometry on its own."""
    path = f"{FRONTEND}.image_tiling"
    if front.image_preparation != fpb.IMAGE_PREPARATION_TILED_GLOBAL:
        if front.HasField("image_tiling"):
            yield F("frontend.syntax_unused", FrontendSyntaxError, path, "set",
                    "only IMAGE_PREPARATION_TILED_GLOBAL reads tile geometry")
        return
    if not front.HasField("image_tiling"):
        yield F("image.tiling", MissingFieldError, path,
                detail="IMAGE_PREPARATION_TILED_GLOBAL reads tile geometry")
        return
    tiling = front.image_tiling
    rule = "image.tiling"
    for name in ("tile_pixels", "patch_pixels", "resize_longest_edge"):
        if not getattr(tiling, name):
            yield F(rule, ExtentError, f"{path}.{name}", 0, "a positive pixel count")
    if tiling.patch_pixels and tiling.tile_pixels % tiling.patch_pixels:
        yield F(rule, ExtentError, f"{path}.patch_pixels", tiling.patch_pixels,
                f"must divide tile_pixels ({tiling.tile_pixels})")
    if tiling.resample == fpb.IMAGE_RESAMPLE_UNSPECIFIED:
        yield F(rule, UnspecifiedSelectorError, f"{path}.resample",
                "IMAGE_RESAMPLE_UNSPECIFIED", "a resize names its filter")
    if not tiling.rescale > 0:  # also rejects NaN
        yield F(rule, ExtentError, f"{path}.rescale", tiling.rescale, "must be > 0")
    for name in ("mean", "std"):
        values = list(getattr(tiling, name))
        if len(values) != 3 or not all(math.isfinite(v) for v in values):
            yield F(rule, ExtentError, f"{path}.{name}", values,
                    "three finite values, one per RGB channel")
    if not all(v > 0 for v in tiling.std):
        yield F(rule, ExtentError, f"{path}.std", list(tiling.std), "every std is > 0")


def _token_grid(model: pb.ModelContract) -> Findings:
    """The layout's tokens lie in the input range; TILE_GRID_SPAN's tile grid."""
    front = model.frontend
    layout, path = front.image_token_layout, f"{FRONTEND}.image_token_layout"
    inputs = model.input_vocabulary
    if layout.feature_token_id not in inputs.image_sentinel_ids:
        yield F("frontend.image_layout", VocabularyRangeError, f"{path}.feature_token_id",
                layout.feature_token_id,
                "the feature token is a declared image sentinel "
                "(input_vocabulary.image_sentinel_ids)")
    for name, value in layout_token_ids(front.image_layout, layout)[1:]:
        if not 0 <= value < inputs.input_tokens:
            yield F("frontend.image_layout", VocabularyRangeError, f"{path}.{name}", value,
                    f"outside the input range [0, {inputs.input_tokens})")
    if front.image_layout != fpb.IMAGE_LAYOUT_TILE_GRID_SPAN:
        return
    if not layout.grid_end_token_ids:
        yield F("image.tile_grid", MissingFieldError, f"{path}.grid_end_token_ids",
                detail="tokens between the tile rows and the global view")
    if not layout.template_placeholder:
        yield F("image.tile_grid", MissingFieldError, f"{path}.template_placeholder",
                detail="the text the chat template writes for an image part")
    columns, tiles = layout.tile_grid_columns, list(layout.tile_token_ids)
    if not columns or not tiles or len(tiles) % columns:
        yield F("image.tile_grid", ExtentError, f"{path}.tile_grid_columns", columns,
                f"the {len(tiles)} tile tokens are a positive whole number of rows of "
                "tile_grid_columns")
    seen: set[int] = set()
    for index, value in enumerate(tiles):
        if value in seen:
            yield F("image.tile_grid", DuplicateIdentifierError,
                    f"{path}.tile_token_ids[{index}]", value, "each tile position has its own token")
        seen.add(value)


def _capacities(model: pb.ModelContract) -> Findings:
    """The vision capacities agree with one window's patches and hold the largest image."""
    front, vision = model.frontend, model.vision
    layout = front.image_token_layout
    if layout.patches_per_feature != vision.patches_per_feature:
        yield F("frontend.image_layout", FrontendSyntaxError,
                f"{FRONTEND}.image_token_layout.patches_per_feature", layout.patches_per_feature,
                f"disagrees with model.vision.patches_per_feature ({vision.patches_per_feature})")
    if front.image_preparation != fpb.IMAGE_PREPARATION_TILED_GLOBAL or \
            not front.HasField("image_tiling"):
        return
    tiling = front.image_tiling
    per_window = patches_per_window(tiling)
    if not per_window or not vision.features_per_window or not vision.patches_per_feature:
        return  # reported by _tiling or the capacity rule
    rule = "vision.window"
    if vision.features_per_window * vision.patches_per_feature != per_window:
        yield F(rule, ExtentError, "model.vision.features_per_window", vision.features_per_window,
                f"x patches_per_feature ({vision.patches_per_feature}) must be one window's "
                f"{per_window} patches ((tile_pixels / patch_pixels)^2)")
    side = math.isqrt(vision.patches_per_feature)
    if side * side != vision.patches_per_feature or \
            (tiling.tile_pixels // tiling.patch_pixels) % side:
        yield F(rule, ExtentError, "model.vision.patches_per_feature",
                vision.patches_per_feature,
                "a pixel shuffle merges a square of patches whose side divides the "
                f"{tiling.tile_pixels // tiling.patch_pixels}-patch grid of a window")
    grid = max_tile_grid(tiling)
    columns = layout.tile_grid_columns
    if columns and front.image_layout == fpb.IMAGE_LAYOUT_TILE_GRID_SPAN and \
            (grid > columns or grid > len(layout.tile_token_ids) // columns):
        yield F("image.tile_grid", ExtentError,
                f"{FRONTEND}.image_token_layout.tile_token_ids", len(layout.tile_token_ids),
                f"an image resized to {tiling.resize_longest_edge} pixels has up to {grid} x "
                f"{grid} tiles of {tiling.tile_pixels}: the grid of {columns} columns "
                "names fewer")
    windows = max_windows(tiling)
    if vision.feature_slots < windows * vision.features_per_window:
        yield F("vision.capacity", ExtentError, "model.vision.feature_slots",
                vision.feature_slots,
                f"the largest image has {windows} windows of {vision.features_per_window} "
                "features")
    for index, capacity in enumerate(vision.patch_capacities):
        if capacity % per_window:
            yield F("vision.capacity", ExtentError, f"model.vision.patch_capacities[{index}]",
                    capacity, f"whole windows of {per_window} patches")
    if vision.patch_capacities and max(vision.patch_capacities) < windows * per_window:
        yield F("vision.capacity", ExtentError, "model.vision.patch_capacities",
                list(vision.patch_capacities),
                f"an image span is atomic: the largest image's {windows * per_window} "
                "patches are encoded in one submission")


def images(serving: pb.ServingContract) -> Findings:
    """Image layout data and tile geometry agree with the vision capacities and the input
    vocabulary."""
    model, front = serving.model, serving.model.frontend
    yield from _tiling(front)
    if front.image_layout == fpb.IMAGE_LAYOUT_NONE:
        yield from _no_images(model)
        return
    if front.image_layout == fpb.IMAGE_LAYOUT_UNSPECIFIED:
        return
    vision = model.vision
    for name in ("feature_slots", "features_per_window", "patches_per_feature"):
        if getattr(vision, name) == 0:
            yield F("vision.capacity", ExtentError, f"model.vision.{name}", 0,
                    "image models declare vision capacities")
    if not vision.patch_capacities:
        yield F("vision.capacity", ExtentError, "model.vision.patch_capacities", [],
                "image models capture patches")
    if not front.HasField("image_token_layout"):
        yield F("frontend.image_layout", MissingFieldError, f"{FRONTEND}.image_token_layout",
                detail="image layouts read image token layout data")
        return
    yield from _token_grid(model)
    yield from _capacities(model)
