"""PreparedContract: a validated, version 3 view of a ServingContract.

Startup decodes the core's ``ServingContract`` (strictly, see ``helios_contract.strict``),
then calls ``PreparedContract.from_contract``. Every rule of the specification
(the specification) is checked there once; the runtime then reads typed views
and never re-validates. There is no per-model code and no model-name dispatch: everything
below is keyed by contract enums and declared names.

Validation order (first failure raises): version and upgrade, required messages, enum
selectors, vocabulary, cache, graphs (bindings, speculative extents, pending tokens),
serving extents and sampling defaults, frontend, then the execution manifest when given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from helios_contract import _rules_contract, _rules_frontend, _rules_manifest, _rules_tiers
from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract._gen.helios.v1 import frontend_pb2 as fpb
from helios_contract._gen.helios.v1 import manifest_pb2 as mpb
from helios_contract.errors import BindingError, MissingFieldError
from helios_contract.findings import Finding, raise_first
from helios_contract.upgrade import upgrade_to_current, version_findings

__all__ = ["PreparedContract", "contract_findings", "default_max_active", "request_slots",
           "validate_contract"]


def default_max_active(serving: pb.ServingContract) -> int:
    """Requests served at once when the operator sets none (helios-serve --max-active):
    the core's serving default ``defaults.max_active``, else its ``selected_concurrency``
    (the specification, "Serving metadata": core defaults fill missing settings); 0 when
    the contract gives neither. The one rule helios-serve's settings and
    ``helios-tools inspect`` both apply; the server then runs at most
    ``request_slots`` of them (load-time selection may reduce captured concurrency,
    never raise it)."""
    return serving.defaults.max_active or serving.selected_concurrency


def request_slots(serving: pb.ServingContract, manifest: mpb.ExecutionManifest) -> int:
    """Requests the core can hold at once: the fewest rows of its page-table buffers
    (``[slots, pages_per_request]`` int32; rule cache.view_table), 0 without a view.

    Raises:
        KeyError: a view names a buffer the manifest lacks (rule cache.view_table).
    """
    buffers = {b.name: b for b in manifest.buffers}
    return min((int(buffers[v.buffer].shape[0]) for v in serving.model.cache.page_table_views),
               default=0)


def _presence(serving: pb.ServingContract) -> Iterator[Finding]:
    """What must hold before a version 3 view exists: a model, of a supported version."""
    if not serving.HasField("model"):
        yield Finding.of("contract.required", MissingFieldError, "model",
                         detail="ServingContract carries no ModelContract")
        return
    yield from version_findings(serving)


def _upgraded_findings(upgraded: pb.ServingContract,
                       manifest: mpb.ExecutionManifest | None) -> Iterator[Finding]:
    """Every rule of a version 3 contract (and its manifest), in startup order."""
    yield from _rules_contract.required(upgraded)
    yield from _rules_contract.selectors(upgraded.model, "model")
    yield from _rules_contract.vocabulary(upgraded)
    yield from _rules_contract.cache(upgraded)
    yield from _rules_contract.graphs(upgraded)
    yield from _rules_tiers.tier_findings(upgraded)
    yield from _rules_contract.serving_extents(upgraded)
    yield from _rules_contract.sampling_defaults(upgraded)
    yield from _rules_frontend.frontend_findings(upgraded)
    if manifest is not None:
        yield from _rules_manifest.manifest_findings(upgraded, manifest)


def contract_findings(serving: pb.ServingContract,
                      manifest: mpb.ExecutionManifest | None = None) -> Iterator[Finding]:
    """Every finding of every contract rule (what ``helios-tools lint-core`` lists).

    ``PreparedContract.from_contract`` raises the first of exactly these.

    Args:
        serving: Decoded contract of version 1, 2 or 3 (not modified).
        manifest: The execution manifest of the same core; ``None`` skips its rules.

    Yields:
        ``Finding``s in startup order; after a version finding nothing else is judged.
    """
    presence = list(_presence(serving))
    if presence:
        yield from presence
        return
    yield from _upgraded_findings(upgrade_to_current(serving), manifest)


def validate_contract(
    serving: pb.ServingContract, manifest: mpb.ExecutionManifest | None = None
) -> pb.ServingContract:
    """Check every specification rule and return the version 3 view of ``serving``.

    Args:
        serving: Decoded contract of version 1, 2 or 3 (not modified).
        manifest: The execution manifest of the same core; ``None`` skips the cross-checks
            that need it (identifiers, operations, capacities, view bounds, tuning).

    Returns:
        A new ``ServingContract`` with ``model.version == 3``.

    Raises:
        ContractError: A subclass naming the field path and the offending value, for the
            first finding of ``contract_findings`` (its ``rule`` attribute names the rule).
    """
    raise_first(_presence(serving))
    upgraded = upgrade_to_current(serving)
    raise_first(_upgraded_findings(upgraded, manifest))
    return upgraded


@dataclass(frozen=True)
class PreparedContract:
    """A validated serving contract with the typed views the runtime reads.

    Do not construct directly; use ``from_contract``. The protobuf messages it holds are
    private copies: treat them as read-only.

    Attributes:
        serving: The version 3 view of the contract (``serving.model.version == 3``).
        manifest: The execution manifest it was checked against, or ``None``.
        source_version: ``model.version`` as decoded (1, 2 or 3).
        graphs: Graph contracts by name, in declaration order.
    """

    serving: pb.ServingContract
    manifest: mpb.ExecutionManifest | None
    source_version: int
    graphs: Mapping[str, pb.GraphContract] = field(repr=False)

    @classmethod
    def from_contract(
        cls, serving: pb.ServingContract, manifest: mpb.ExecutionManifest | None = None
    ) -> PreparedContract:
        """Validate ``serving`` (and its cross-references into ``manifest``).

        Args:
            serving: Decoded ``ServingContract`` of version 1, 2 or 3 (not modified).
            manifest: The core's ``ExecutionManifest``; ``None`` validates the contract alone.

        Returns:
            The prepared contract.

        Raises:
            ContractError: A subclass naming the field path and the offending value, for
                the first rule ``serving`` breaks (see ``helios_contract.errors``).
        """
        upgraded = validate_contract(serving, manifest)
        own_manifest = None
        if manifest is not None:
            own_manifest = mpb.ExecutionManifest()
            own_manifest.CopyFrom(manifest)
        graphs = MappingProxyType({g.name: g for g in upgraded.model.graphs})
        return cls(upgraded, own_manifest, serving.model.version, graphs)

    # --- identity and extents ---------------------------------------------------------------

    @property
    def model(self) -> pb.ModelContract:
        return self.serving.model

    @property
    def served_id(self) -> str:
        return self.serving.served_id

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(self.serving.aliases)

    @property
    def cache_identity(self) -> str:
        return self.serving.cache_identity

    @property
    def context_tokens(self) -> int:
        return self.serving.context_tokens

    @property
    def prefill_chunk_tokens(self) -> int:
        return self.serving.prefill_chunk_tokens

    # --- graphs -----------------------------------------------------------------------------

    def graphs_for(self, operation: int) -> tuple[pb.GraphContract, ...]:
        """Graphs of one ``Operation``, sorted by (batch_capacity, token_capacity, name)."""
        chosen = [g for g in self.graphs.values() if g.operation == operation]
        return tuple(sorted(chosen, key=lambda g: (g.batch_capacity, g.token_capacity, g.name)))

    @property
    def decode_capacities(self) -> tuple[int, ...]:
        """Distinct captured DECODE batch capacities (request rows), ascending."""
        return tuple(sorted({g.batch_capacity for g in self.graphs_for(pb.OPERATION_DECODE)}))

    @property
    def prefill_capacities(self) -> tuple[tuple[int, int], ...]:
        """Distinct captured PREFILL (batch rows, chunk tokens) pairs, ascending."""
        return tuple(sorted({(g.batch_capacity, g.token_capacity)
                             for g in self.graphs_for(pb.OPERATION_PREFILL)}))

    @property
    def speculative_widths(self) -> tuple[int, ...]:
        """Distinct captured speculative widths W (verify tokens per request), ascending."""
        return tuple(sorted({g.speculative.token_capacity
                             for g in self.graphs_for(pb.OPERATION_SPECULATIVE)}))

    @property
    def lane_limits(self) -> Mapping[int, int]:
        """Speculative width W -> the longest lane (target positions, pending token
        included) the host may select for its programs (SpeculativeDescriptor.lane_limit;
        rule ``speculative.lane_limit_consistency``: one limit per width)."""
        return MappingProxyType({g.speculative.token_capacity: g.speculative.lane_limit
                                 for g in self.graphs_for(pb.OPERATION_SPECULATIVE)})

    def history_drafting_findings(self, widths: Iterable[int] | None = None
                                  ) -> Iterator[Finding]:
        """The contract side of the history-drafting startup option, as findings.

        History drafting needs concrete copied-token inputs in each selected wider
        SPECULATIVE graph (W > 1): bindings of VALUE_SOURCE_CANDIDATE_IDS and
        VALUE_SOURCE_CANDIDATE_COUNT. Whether learned speculation is enabled is a startup
        setting the caller checks.

        Args:
            widths: Speculative widths W selected at load; ``None`` means every captured one.
        """
        chosen = set(self.speculative_widths if widths is None else widths)
        needed = (pb.VALUE_SOURCE_CANDIDATE_IDS, pb.VALUE_SOURCE_CANDIDATE_COUNT)
        for index, graph in enumerate(self.model.graphs):
            if graph.operation != pb.OPERATION_SPECULATIVE:
                continue
            width = graph.speculative.token_capacity
            if width <= 1 or width not in chosen:
                continue
            bound = {b.source for b in graph.bindings}
            missing = [pb.ValueSource.Name(s) for s in needed if s not in bound]
            if missing:
                yield Finding.of(
                    "speculative.history_inputs", BindingError,
                    f"model.graphs[{index}].bindings", missing,
                    f"history drafting needs copied-token inputs in {graph.name!r} (W = {width})",
                )

    def constrained_speculation(self, widths: Iterable[int] | None = None) -> bool:
        """Whether constrained lanes (a grammar mask applies) may verify copied candidates.

        The rule (the specification's value sources, "Copied proposals"): the host masks only
        what it proposes, so a constrained lane is wider than one only through copied
        candidates with their per-position grammar masks. That needs every selected wider
        SPECULATIVE graph (W > 1) to bind CANDIDATE_IDS and CANDIDATE_GRAMMAR_MASKS
        (rule ``speculative.candidate_masks`` checks what the masks follow); otherwise
        constrained lanes stay at width one. Learned drafts are never verified for them
        (the program cannot ask the host's grammar).

        Args:
            widths: Speculative widths W selected at load; ``None`` means every captured one.
        """
        chosen = set(self.speculative_widths if widths is None else widths)
        wider = [g for g in self.graphs_for(pb.OPERATION_SPECULATIVE)
                 if g.speculative.token_capacity > 1 and g.speculative.token_capacity in chosen]
        need = {pb.VALUE_SOURCE_CANDIDATE_IDS, pb.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS}
        return bool(wider) and all(need <= {b.source for b in g.bindings} for g in wider)

    def check_history_drafting(self, widths: Iterable[int] | None = None) -> None:
        """Raise the first of ``history_drafting_findings(widths)``.

        Raises:
            BindingError: A selected wider graph lacks a copied-token input (path: its
                ``bindings``; value: the missing source names).
        """
        raise_first(self.history_drafting_findings(widths))

    @property
    def selected_concurrency(self) -> int:
        return self.serving.selected_concurrency

    @property
    def state_rows_per_request(self) -> int:
        """Maximum state rows per request among the graphs (partitions execution rows)."""
        return max((g.state_rows_per_request for g in self.graphs.values()), default=0)

    # --- vocabulary and sampling ------------------------------------------------------------

    @property
    def sampled_tokens(self) -> int:
        return self.model.vocabulary.sampled_tokens

    @property
    def histogram_width(self) -> int:
        return self.model.vocabulary.histogram_width

    @property
    def mask_words(self) -> int:
        return self.model.vocabulary.mask_words

    @property
    def input_tokens(self) -> int:
        return self.model.input_vocabulary.input_tokens

    @property
    def image_sentinel_ids(self) -> frozenset[int]:
        return frozenset(self.model.input_vocabulary.image_sentinel_ids)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids in declaration order (all < sampled_tokens)."""
        return tuple(self.serving.eos_token_ids)

    @property
    def sampling_defaults(self) -> pb.SamplingDefaults:
        return self.serving.defaults.sampling

    @property
    def defaults(self) -> pb.ServingDefaults:
        return self.serving.defaults

    @property
    def template_tokens(self) -> pb.TemplateTokens:
        return self.serving.template_tokens

    # --- cache ------------------------------------------------------------------------------

    @property
    def page_tokens(self) -> int:
        """Logical tokens represented by one page id."""
        return self.model.cache.page_tokens

    @property
    def history_regions(self) -> tuple[pb.HistoryRegion, ...]:
        return tuple(self.model.cache.regions)

    @property
    def cache_planes(self) -> tuple[str, ...]:
        """Manifest buffer names of every history plane, in region order."""
        return tuple(p for r in self.model.cache.regions for p in r.planes)

    @property
    def page_table_views(self) -> tuple[pb.PageTableView, ...]:
        return tuple(self.model.cache.page_table_views)

    # --- frontend ---------------------------------------------------------------------------

    @property
    def frontend(self) -> fpb.FrontendContract:
        return self.model.frontend

    @property
    def tool_parser(self) -> int:
        """``ToolParser`` enum value."""
        return self.frontend.tool_parser

    @property
    def reasoning_parser(self) -> int:
        """``ReasoningParser`` enum value."""
        return self.frontend.reasoning_parser

    @property
    def tool_syntax(self) -> fpb.ToolSyntax:
        return self.frontend.tool_syntax

    @property
    def reasoning_syntax(self) -> fpb.ReasoningSyntax:
        return self.frontend.reasoning_syntax

    @property
    def recipient_syntax(self) -> fpb.RecipientSyntax:
        return self.frontend.recipient_syntax

    @property
    def assistant_boundaries(self) -> fpb.AssistantBoundaries:
        return self.frontend.assistant_boundaries

    @property
    def vision(self) -> pb.VisionContract:
        return self.model.vision
