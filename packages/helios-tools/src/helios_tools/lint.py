"""lint-core: every structural reason a core would fail ``helios-serve`` startup, as values.

A finding names the rule, the field path and the offending value
(``helios_contract.Finding``). ``lint_core`` lists, for one open core:

- what ``verify`` checks: authorization and every resource's digests and frame;
- every contract and manifest rule (``helios_contract.contract_findings``: the same
  generators ``PreparedContract.from_contract`` raises the first of at startup);
- what only the core's resource list can tell (``resource_findings``, also run by
  ``helios-serve`` at startup): weights, kernel binaries, graph dependencies and
  frontend assets name resources of the right kind and size; kernel binaries exist for
  every declared (and every required) GPU target;
- what needs the frontend tokenizer (``token_rules.token_findings``, which the output
  frontend runs at startup): the tokenizer loads and token-bound markers are one token;
- what the serving backends execute (``capability_findings`` against the tables of
  ``helios_tools.capabilities``, which ``NativeModel.load`` checks): a field a backend
  cannot execute is a finding, never accepted and ignored.

Unlike startup, which stops at the first broken rule, lint reports every finding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

from helios_contract import (
    COLLECTIVE_OPS,
    ContractError,
    Finding,
    ResourceReferenceError,
    capability_findings,
    contract_findings,
    stored_nbytes,
    upgrade_to_current,
)
from helios_contract.capabilities import backend_phrase
from helios_contract.schema import contract_pb2 as pb
from helios_contract.schema import core_pb2
from helios_contract.schema import manifest_pb2 as mpb

from helios_tools.capabilities import BACKENDS
from helios_tools.core.errors import CoreError
from helios_tools.core.reader import Core, authorize
from helios_tools.frontend_assets import (
    ChatTemplateCompileError,
    ChatTemplateError,
    ChatTemplateLimitError,
    load_tokenizer,
    render_chat,
)
from helios_tools.token_rules import token_findings

__all__ = ["INTEGRITY_RULES", "Finding", "backend_note", "chat_template_findings",
           "integrity_first", "lint_capabilities", "lint_contract", "lint_core",
           "resource_findings", "tokenizer_findings"]

F = Finding.of
# Findings that say the core is not what its publisher signed (or not for this namespace):
# whatever else lint finds, such a core must not be served.
INTEGRITY_RULES = frozenset({"core.SignatureError", "core.UntrustedKey", "core.LengthMismatch",
                             "resource.integrity", "core.authorize"})
# Bootstrap loads exactly one of each from the core.
FRONTEND_ASSETS = (core_pb2.RESOURCE_KIND_TOKENIZER, core_pb2.RESOURCE_KIND_CHAT_TEMPLATE)


def lint_core(core: Core, *, acceptance: str | None = None,
              check_resources: bool = True,
              progress: Callable[[int], None] | None = None,
              require_targets: Iterable[str] = (),
              backends: Sequence[str] = tuple(BACKENDS)) -> list[Finding]:
    """Lint an open core.

    Args:
        core: The core (``open_core``, or ``open_core_unverified`` to lint structure only).
        acceptance: When given, the namespace must authorize (``authorize``).
        check_resources: Verify every resource's chunks and frame (reads the whole file).
        progress: Called with the stored bytes of each resource once it is checked.
        require_targets: GPU targets the core must carry binaries for (e.g. ``sm_90``, the
            architecture it will be served on). A core without targets is a valid
            CPU-only core; `helios-serve --backend cuda` rejects it at startup.
        backends: Serving backends whose capability tables the core must fit (default:
            every one of ``helios_tools.capabilities.BACKENDS``).

    Returns:
        Findings, empty for a core that passes.
    """
    findings: list[Finding] = []
    if acceptance is not None:
        try:
            authorize(core, acceptance)
        except CoreError as e:
            findings.append(F("core.authorize", ResourceReferenceError, "publisher_namespace",
                              repr(acceptance), str(e)))
    if check_resources:
        for rid, res in core.resources.items():
            try:
                core.verify_resource(rid)
            except CoreError as e:
                findings.append(F("resource.integrity", ResourceReferenceError,
                                  f"resources[{rid!r}]", type(e).__name__, str(e)))
            if progress is not None:
                progress(res.stored_nbytes)
    findings += lint_contract(core.contract, core.manifest)
    findings += lint_capabilities(core.contract, core.manifest, backends)
    findings += resource_findings(core.contract, core.manifest, core.resources.values())
    findings += tokenizer_findings(core)
    findings += _template_findings(core)
    declared = set(core.manifest.targets)
    for target in require_targets:
        if target not in declared:
            findings.append(F("kernel.target", ResourceReferenceError, "manifest.targets", target,
                              f"no kernel binaries for required target {target!r}; "
                              f"the core declares {sorted(declared) or 'none'}"))
    return findings


def lint_contract(contract: pb.ServingContract,
                  manifest: mpb.ExecutionManifest) -> list[Finding]:
    """Every finding of the contract and manifest rules (``contract_findings``)."""
    return list(contract_findings(contract, manifest))


def lint_capabilities(contract: pb.ServingContract, manifest: mpb.ExecutionManifest,
                      backends: Sequence[str] = tuple(BACKENDS)) -> list[Finding]:
    """What the given backends cannot execute (``capability_findings`` of their tables).

    A finding of several backends is listed once, naming them all. Nothing is reported
    for a contract without a version 3 view (its version finding says why).

    Raises:
        KeyError: a backend without a capability table.
    """
    try:
        upgraded = upgrade_to_current(contract)
    except ContractError:
        return []
    merged: dict[tuple[str, str, str], tuple[Finding, list[str]]] = {}
    for backend in backends:
        for f in capability_findings(upgraded, manifest, BACKENDS[backend]):
            merged.setdefault((f.rule, f.path, f.value), (f, []))[1].append(backend)
    out = []
    for f, names in merged.values():
        if len(names) > 1:
            both = f"the {' and '.join(names)} backends"
            f = replace(f, detail=f.detail.replace(backend_phrase(names[0]), both))
        out.append(f)
    return out


def integrity_first(findings: Iterable[Finding]) -> list[Finding]:
    """`findings` with those of INTEGRITY_RULES first, each group in its own order."""
    findings = list(findings)
    return ([f for f in findings if f.rule in INTEGRITY_RULES]
            + [f for f in findings if f.rule not in INTEGRITY_RULES])


def backend_note(contract: pb.ServingContract, manifest: mpb.ExecutionManifest,
                 backends: Sequence[str]) -> str | None:
    """One line for a core that some of the linted `backends` execute and others do not
    (a `--weight-dtype gguf` core: cpu only): it names the backends that cannot execute
    it and the `--backend` option that lints it for one that can. None when every backend
    or none executes the core, or for a contract without a version 3 view.

    Raises:
        KeyError: a backend without a capability table.
    """
    try:
        upgraded = upgrade_to_current(contract)
    except ContractError:
        return None
    counts = {b: sum(1 for _ in capability_findings(upgraded, manifest, BACKENDS[b]))
              for b in backends}
    fit = [b for b, n in counts.items() if n == 0]
    unfit = [b for b, n in counts.items() if n]
    if not fit or not unfit:
        return None
    cannot = "; ".join(f"the {b} backend cannot execute this core ({counts[b]} finding(s))"
                       for b in unfit)
    return f"{cannot}: `--backend {fit[0]}` lints it for the {fit[0]} backend alone"


def _resource(resources: dict[str, core_pb2.ExecutableResource], rid: str, path: str,
              kind: int) -> Iterator[Finding]:
    res = resources.get(rid)
    if res is None:
        yield F("resource.missing", ResourceReferenceError, path, rid,
                "no such resource in the core")
    elif kind and res.kind != kind:
        yield F("resource.kind", ResourceReferenceError, path, rid,
                f"resource is {core_pb2.ResourceKind.Name(res.kind)}, expected "
                f"{core_pb2.ResourceKind.Name(kind)}")


def resource_findings(contract: pb.ServingContract, manifest: mpb.ExecutionManifest,
                      resources: Iterable[core_pb2.ExecutableResource]) -> Iterator[Finding]:
    """The references into the core's resource list (DeploymentBody.resources).

    Args:
        contract: The ServingContract (graph resource dependencies).
        manifest: The ExecutionManifest (weights, kernel binaries, targets).
        resources: The core's signed resources.

    Yields:
        Findings: a missing or wrongly kinded resource, a weight whose signed decoded size
        is not its buffer's, a kernel without exactly one binary per declared target, and
        frontend assets that are not exactly one tokenizer and one chat template.
    """
    by_id = {r.resource_id: r for r in resources}
    for i, b in enumerate(manifest.buffers):
        if b.role != mpb.BUFFER_ROLE_WEIGHT:
            continue  # a weight naming nothing is a manifest rule (buffer.weight_resource)
        # A weight every rank reads, or one resource per tensor-parallel rank.
        named = [(f"manifest.buffers[{i}].weight_resource_id", b.weight_resource_id)]
        named += [(f"manifest.buffers[{i}].rank_weight_resource_ids[{r}]", rid)
                  for r, rid in enumerate(b.rank_weight_resource_ids)]
        for path, rid in named:
            if not rid:
                continue
            found = list(_resource(by_id, rid, path, core_pb2.RESOURCE_KIND_WEIGHTS))
            yield from found
            res = by_id.get(rid)
            if (not found and b.dtype and (not b.HasField("storage") or b.storage.block_elements)
                    and res.decoded_nbytes != stored_nbytes(b)):
                yield F("weight.nbytes", ResourceReferenceError, path, rid,
                        f"resource decodes to {res.decoded_nbytes} bytes; buffer {b.name!r} "
                        f"holds {stored_nbytes(b)}")
    targets = list(manifest.targets)
    for i, k in enumerate(manifest.kernels):
        path = f"manifest.kernels[{i}]"
        if k.reference_op in COLLECTIVE_OPS:
            continue  # rank peers run collectives (NCCL on cuda): no binaries
        have = Counter(b.target for b in k.binaries)
        for t in targets:
            if have[t] != 1:
                yield F("kernel.target", ResourceReferenceError, f"{path}.binaries", f"{k.id}@{t}",
                        f"kernel {k.id!r} has {have[t]} binaries for declared target {t!r}; "
                        "it needs one")
        for j, b in enumerate(k.binaries):
            yield from _resource(by_id, b.resource_id, f"{path}.binaries[{j}].resource_id",
                                 core_pb2.RESOURCE_KIND_KERNEL_BINARY)
            if not b.entry_name:
                yield F("kernel.binary", ResourceReferenceError,
                        f"{path}.binaries[{j}].entry_name", "", "binaries name their entry point")
    for g, graph in enumerate(contract.model.graphs):
        for r, rid in enumerate(graph.resource_dependencies):
            yield from _resource(by_id, rid, f"model.graphs[{g}].resource_dependencies[{r}]", 0)
    kinds = Counter(r.kind for r in by_id.values())
    for kind in FRONTEND_ASSETS:
        if kinds[kind] != 1:
            yield F("resource.frontend_assets", ResourceReferenceError, "resources",
                    core_pb2.ResourceKind.Name(kind),
                    f"bootstrap loads exactly one; the core has {kinds[kind]}")


def tokenizer_findings(core: Core) -> list[Finding]:
    """The frontend tokenizer loads, and the token-bound markers are one token of it.

    Nothing is reported for a core without exactly one tokenizer resource
    (``resource.frontend_assets``) or whose tokenizer fails its digests
    (``resource.integrity``).
    """
    ids = [rid for rid, res in core.resources.items()
           if res.kind == core_pb2.RESOURCE_KIND_TOKENIZER]
    if len(ids) != 1:
        return []
    path = f"resources[{ids[0]!r}]"
    try:
        tokenizer = load_tokenizer(bytes(core.read_resource(ids[0])).decode("utf-8"))
    except CoreError:
        return []
    except (UnicodeDecodeError, ValueError) as e:
        return [F("frontend.tokenizer", ResourceReferenceError, path, type(e).__name__,
                  f"the tokenizer resource does not load: {' '.join(str(e).split())}")]
    return list(token_findings(core.contract.model.frontend, tokenizer))


def chat_template_findings(template: str, path: str = "resources[chat template]"
                           ) -> Iterator[Finding]:
    """The chat template compiles, loads no other template and renders the smallest
    conversation within its limits (``Bootstrap.from_parts`` raises the first finding).

    A template that refuses that conversation through ``raise_exception`` is valid: it may
    refuse some conversations.
    """
    try:
        render_chat(template, [{"role": "user", "content": "ping"}])
    except (ChatTemplateCompileError, ChatTemplateLimitError) as e:
        yield F("frontend.chat_template", ResourceReferenceError, path, type(e).__name__,
                " ".join(str(e).split()))
    except ChatTemplateError:
        pass


def _template_findings(core: Core) -> list[Finding]:
    ids = [rid for rid, res in core.resources.items()
           if res.kind == core_pb2.RESOURCE_KIND_CHAT_TEMPLATE]
    if len(ids) != 1:
        return []  # resource.frontend_assets
    path = f"resources[{ids[0]!r}]"
    try:
        text = bytes(core.read_resource(ids[0])).decode("utf-8")
    except CoreError:
        return []  # resource.integrity
    except UnicodeDecodeError as e:
        return [F("frontend.chat_template", ResourceReferenceError, path, type(e).__name__,
                  "the chat template resource is not UTF-8 text")]
    return list(chat_template_findings(text, path))
