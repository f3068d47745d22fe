"""Upgrade version 1 and 2 model contracts to the version 3 view.

What each version lacked is defined once, in the header comment of
proto/helios/v1/contract.proto:

- version 1: no ``vocabulary.mask_words``, no ``cache.page_table_views`` (one implicit
  view per paged region: destination buffer ``"page_table"``, page offset 0), no
  ``GraphContract.completion_cursor`` (read as "no draft cursor"), no
  ``SpeculativeDescriptor.lane_limit``;
- version 2: no ``vocabulary.mask_words`` and no ``lane_limit``.

The implicit values are ``mask_words = ceil(histogram_width / 32)`` and
``lane_limit = min(D + 1, W)``. A contract that sets a field its version lacks is
rejected rather than guessed at.
"""

from __future__ import annotations

from helios_contract._gen.helios.v1 import contract_pb2
from helios_contract.errors import UnsupportedVersionError

__all__ = ["CURRENT_VERSION", "IMPLICIT_PAGE_TABLE", "SUPPORTED_VERSIONS", "upgrade_to_current"]

CURRENT_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)
# Destination buffer of version 1's implicit page-table views.
IMPLICIT_PAGE_TABLE = "page_table"

_PAGED = (contract_pb2.HISTORY_KIND_PAGED_KV, contract_pb2.HISTORY_KIND_PAGED_LATENT)


def _newer_field(path: str, value: object, version: int, introduced: int) -> UnsupportedVersionError:
    return UnsupportedVersionError(
        path, value, f"field introduced in version {introduced} set in a version {version} contract"
    )


def upgrade_to_current(serving: contract_pb2.ServingContract) -> contract_pb2.ServingContract:
    """Return a copy of ``serving`` whose model contract is the version 3 view.

    Args:
        serving: A decoded contract of any supported version (not modified).

    Returns:
        A new ``ServingContract`` with ``model.version == 3`` and every implicit field
        made explicit.

    Raises:
        UnsupportedVersionError: ``model.version`` is not 1, 2 or 3, or a version 1/2
            contract sets a field its version lacks.
    """
    version = serving.model.version
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(
            "model.version", version, f"supported contract versions are {list(SUPPORTED_VERSIONS)}"
        )
    out = contract_pb2.ServingContract()
    out.CopyFrom(serving)
    if version == CURRENT_VERSION:
        return out
    model = out.model
    if model.vocabulary.mask_words:
        raise _newer_field("model.vocabulary.mask_words", model.vocabulary.mask_words, version, 3)
    model.vocabulary.mask_words = -(-model.vocabulary.histogram_width // 32)
    for index, graph in enumerate(model.graphs):
        if not graph.HasField("speculative"):
            continue
        spec = graph.speculative
        if spec.lane_limit:
            raise _newer_field(
                f"model.graphs[{index}].speculative.lane_limit", spec.lane_limit, version, 3
            )
        spec.lane_limit = min(spec.draft_tokens + 1, spec.token_capacity)
    if version == 1:
        if model.cache.page_table_views:
            raise _newer_field(
                "model.cache.page_table_views", len(model.cache.page_table_views), version, 2
            )
        for index, graph in enumerate(model.graphs):
            if graph.HasField("completion_cursor"):
                raise _newer_field(
                    f"model.graphs[{index}].completion_cursor", "set", version, 2
                )
        for region in model.cache.regions:
            if region.kind in _PAGED:
                model.cache.page_table_views.add(
                    region=region.name, buffer=IMPLICIT_PAGE_TABLE, page_offset=0
                )
    model.version = CURRENT_VERSION
    return out
