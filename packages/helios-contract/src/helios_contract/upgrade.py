"""Upgrade version 1 and 2 model contracts to the version 3 view.

What each version lacked is defined once, in the header comment of
proto/helios/v1/contract.proto:

- version 1: no ``vocabulary.mask_words``, no ``cache.page_table_views`` (one implicit
  view per paged region: destination buffer ``"page_table"``, page offset 0), no
  ``GraphContract.completion_cursor`` (read as "no draft cursor"), no
  ``SpeculativeDescriptor.lane_limit``;
- version 2: no ``vocabulary.mask_words`` and no ``lane_limit``;
- versions 1 and 2: no ``HistoryRegion.host_planes`` (no host tier).

The implicit values are ``mask_words = ceil(histogram_width / 32)`` and
``lane_limit = min(D + 1, W)``. A contract that sets a field its version lacks is
rejected rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Iterator

from helios_contract._gen.helios.v1 import contract_pb2
from helios_contract.errors import UnsupportedVersionError
from helios_contract.findings import Finding, raise_first

__all__ = [
    "CURRENT_VERSION",
    "IMPLICIT_PAGE_TABLE",
    "SUPPORTED_VERSIONS",
    "upgrade_to_current",
    "version_findings",
]

CURRENT_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)
# Destination buffer of version 1's implicit page-table views.
IMPLICIT_PAGE_TABLE = "page_table"

_PAGED = (contract_pb2.HISTORY_KIND_PAGED_KV, contract_pb2.HISTORY_KIND_PAGED_LATENT)


def _newer_field(path: str, value: object, version: int, introduced: int) -> Finding:
    return Finding.of(
        "contract.version_field", UnsupportedVersionError, path, value,
        f"field introduced in version {introduced} set in a version {version} contract",
    )


def version_findings(serving: contract_pb2.ServingContract) -> Iterator[Finding]:
    """The version rules: a supported ``model.version``, and no field newer than it.

    Nothing else can be judged until these pass (there is no version 3 view yet).
    """
    version = serving.model.version
    if version not in SUPPORTED_VERSIONS:
        yield Finding.of("contract.version", UnsupportedVersionError, "model.version", version,
                         f"supported contract versions are {list(SUPPORTED_VERSIONS)}")
        return
    if version == CURRENT_VERSION:
        return
    model = serving.model
    if model.vocabulary.mask_words:
        yield _newer_field("model.vocabulary.mask_words", model.vocabulary.mask_words, version, 3)
    for index, graph in enumerate(model.graphs):
        if graph.HasField("speculative") and graph.speculative.lane_limit:
            yield _newer_field(f"model.graphs[{index}].speculative.lane_limit",
                               graph.speculative.lane_limit, version, 3)
    for index, region in enumerate(model.cache.regions):
        if region.host_planes:
            yield _newer_field(f"model.cache.regions[{index}].host_planes",
                               len(region.host_planes), version, 3)
    if version == 1:
        if model.cache.page_table_views:
            yield _newer_field("model.cache.page_table_views", len(model.cache.page_table_views),
                               version, 2)
        for index, graph in enumerate(model.graphs):
            if graph.HasField("completion_cursor"):
                yield _newer_field(f"model.graphs[{index}].completion_cursor", "set", version, 2)


def upgrade_to_current(serving: contract_pb2.ServingContract) -> contract_pb2.ServingContract:
    """Return a copy of ``serving`` whose model contract is the version 3 view.

    Args:
        serving: A decoded contract of any supported version (not modified).

    Returns:
        A new ``ServingContract`` with ``model.version == 3`` and every implicit field
        made explicit.

    Raises:
        UnsupportedVersionError: ``model.version`` is not 1, 2 or 3, or a version 1/2
            contract sets a field its version lacks (``version_findings``).
    """
    raise_first(version_findings(serving))
    out = contract_pb2.ServingContract()
    out.CopyFrom(serving)
    version = serving.model.version
    if version == CURRENT_VERSION:
        return out
    model = out.model
    model.vocabulary.mask_words = -(-model.vocabulary.histogram_width // 32)
    for graph in model.graphs:
        if graph.HasField("speculative"):
            spec = graph.speculative
            spec.lane_limit = min(spec.draft_tokens + 1, spec.token_capacity)
    if version == 1:
        for region in model.cache.regions:
            if region.kind in _PAGED:
                model.cache.page_table_views.add(
                    region=region.name, buffer=IMPLICIT_PAGE_TABLE, page_offset=0
                )
    model.version = CURRENT_VERSION
    return out
