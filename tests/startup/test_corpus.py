"""One corpus of bad cores drives both consumers of the rules: helios-serve's startup
(`helios_serve.cli.start`: Bootstrap.load -> NativeModel.load -> Server) and
`helios-tools lint-core`. Every case must fail startup with an error naming a rule, and
lint-core must list a finding of that same rule: lint-core passing means startup cannot
fail for a structural reason (docs/contract-rules.md).

Each case rewrites the tiny served core (tests/tiny_model.py) with one fault and signs it
again, so the faults reach startup exactly as a publisher's core would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from helios_contract.schema import contract_pb2 as c
from helios_contract.schema import frontend_pb2 as f
from helios_contract.schema import manifest_pb2 as m
from helios_serve.bootstrap import Bootstrap, StartupError
from helios_serve.cli import start
from helios_serve.config import ServeOptions
from helios_serve.runtime import NativeModel
from helios_tools.cli import main as tools_main
from helios_tools.core import CoreWriter, load_private_key, load_public_key, open_core

Mutate = Callable[[c.ServingContract, m.ExecutionManifest], None]


@dataclass(frozen=True)
class Case:
    """A fault: `mutate` edits the contract and manifest; `resources` replaces resource
    bytes; `flip` corrupts a stored byte of a resource after signing; `accept` is the
    namespace startup and lint accept (None: the core's)."""

    rule: str
    mutate: Mutate = lambda s, mf: None
    resources: dict[str, Callable[[bytes], bytes]] = field(default_factory=dict)
    flip: str | None = None
    accept: str | None = None


def graph(serving, name) -> c.GraphContract:
    return next(g for g in serving.model.graphs if g.name == name)


def program(manifest, name) -> m.GraphProgram:
    return next(p for p in manifest.graphs if p.name == name)


def buffer(manifest, name) -> m.Buffer:
    return next(b for b in manifest.buffers if b.name == name)


def drop_program(name: str) -> Mutate:
    def apply(serving, manifest):
        keep = [p for p in manifest.graphs if p.name != name]
        del manifest.graphs[:]
        manifest.graphs.extend(keep)
    return apply


def set_operation(name: str, operation: int, *, contract=True) -> Mutate:
    def apply(serving, manifest):
        program(manifest, name).operation = operation
        if contract:
            graph(serving, name).operation = operation
    return apply


def mixed_prefill(change) -> Mutate:
    """prefill_t16 declared a MIXED program (its packing is a mixed program's), then
    `change(graph contract)`."""
    def apply(serving, manifest):
        set_operation("prefill_t16", c.OPERATION_MIXED)(serving, manifest)
        change(graph(serving, "prefill_t16"))
    return apply


def _drop_rows(g) -> None:
    keep = [b for b in g.bindings if b.source != c.VALUE_SOURCE_MIXED_PREFILL_ROW]
    del g.bindings[:]
    g.bindings.extend(keep)


def bind_output_limit(serving, manifest):
    """A decode binding of VALUE_SOURCE_OUTPUT_LIMIT, which shared packing does not pack."""
    manifest.buffers.add(name="in.output_limit", dtype=m.D_TYPE_I32, shape=[64],
                         role=m.BUFFER_ROLE_REQUEST_INPUT)
    program(manifest, "decode_b1").transports.add(destination="in.output_limit", nbytes=256)
    graph(serving, "decode_b1").bindings.add(destination="in.output_limit",
                                             source=c.VALUE_SOURCE_OUTPUT_LIMIT,
                                             indexing=c.INDEXING_SUBMISSION_ROW)


def tuned_without_producer(serving, manifest):
    """A tuned binding whose producer the manifest's tuning catalog lacks."""
    manifest.buffers.add(name="tuned.splits", dtype=m.D_TYPE_I32, shape=[1],
                         role=m.BUFFER_ROLE_TUNED)
    program(manifest, "decode_b1").tuning_producers.append("tune_splits")
    graph(serving, "decode_b1").tuned_bindings.add(buffer="tuned.splits",
                                                   producer_graph="tune_splits")


def add_images(serving, manifest):
    model = serving.model
    vocab = model.vocabulary.sampled_tokens
    model.input_vocabulary.input_tokens = vocab + 3
    model.input_vocabulary.image_sentinel_ids.append(vocab)
    model.vision.CopyFrom(c.VisionContract(feature_slots=64, features_per_window=16,
                                           patches_per_feature=4, patch_capacities=[256]))
    front = model.frontend
    front.image_preparation = f.IMAGE_PREPARATION_PATCH_GRID
    front.image_layout = f.IMAGE_LAYOUT_SINGLE_SPAN
    front.image_token_layout.CopyFrom(f.ImageTokenLayout(
        feature_token_id=vocab, span_start_token_id=vocab + 1, span_end_token_id=vocab + 2,
        patches_per_feature=4, atomic_spans=True))


def tiled_without_geometry(serving, manifest):
    """The tiled preparation and tile-grid layout without their tile geometry."""
    add_images(serving, manifest)
    front = serving.model.frontend
    front.image_preparation = f.IMAGE_PREPARATION_TILED_GLOBAL
    front.image_layout = f.IMAGE_LAYOUT_TILE_GRID_SPAN


def recipient_frames(serving, manifest):
    """ATEM recipient frames, whose controls the tiny tokenizer splits into bytes."""
    front = serving.model.frontend
    front.tool_parser = f.TOOL_PARSER_ATEM_RECIPIENT_HEADERS
    front.reasoning_parser = f.REASONING_PARSER_RECIPIENT_HEADER
    front.ClearField("reasoning_syntax")
    front.tool_syntax.CopyFrom(f.ToolSyntax(
        call_open="<atem:function_calls>", call_close="</atem:function_calls>",
        function_name_open='<atem:invoke name="', function_name_close='">',
        function_close="</atem:invoke>", parameter_name_open='<atem:parameter name="',
        parameter_name_close='">', parameter_value_close="</atem:parameter>"))
    front.recipient_syntax.CopyFrom(f.RecipientSyntax(
        recipient_prefix=" to=", message_open="<|message|>", internal_message_end="<|eom|>",
        reasoning_recipient="self", content_recipients=["commentary", "user"],
        tool_recipient="functions", named_tool_separator=".", answer_recipient="user",
        frame_start="<|start|>"))
    front.assistant_boundaries.CopyFrom(f.AssistantBoundaries(
        message_end_markers=["<|end|>", "<|eom|>"], assistant_header="<|start|>assistant"))


def no_prefill(serving, manifest):
    for name in ("prefill_t16", "prefill_t128"):
        drop_program(name)(serving, manifest)
    keep = [g for g in serving.model.graphs if g.operation != c.OPERATION_PREFILL]
    del serving.model.graphs[:]
    serving.model.graphs.extend(keep)


def add_collective(serving, manifest):
    """An all-reduce kernel launched by a single-rank core's decode graph."""
    manifest.kernels.add(id="all_reduce_sum", reference_op="all_reduce_sum")
    launch = program(manifest, "decode_b1").launches.add(kernel="all_reduce_sum")
    launch.args.add(buffer=m.BufferView(buffer="scratch.x", shape=[1, 32]))
    launch.args.add(int_value=1)
    launch.args.add(int_value=32)


def split_final_norm(serving, manifest):
    """A two-rank manifest whose final norm names three per-rank resources."""
    manifest.rank_count = 2
    norm = buffer(manifest, "final_norm")
    norm.weight_resource_id = ""
    norm.rank_weight_resource_ids.extend(["weights/final_norm"] * 3)


def drop_score_targets(serving, manifest):
    """A SCORED_PREFILL graph that binds no targets (its score_tokens would read stale
    ones)."""
    g = graph(serving, "scored_t16")
    keep = [b for b in g.bindings if b.source != c.VALUE_SOURCE_SCORED_TARGET_TOKENS]
    del g.bindings[:]
    g.bindings.extend(keep)


def targets_in_prefill(serving, manifest):
    """Target tokens bound in a plain PREFILL graph (only scored programs read them)."""
    scored = graph(serving, "scored_t16")
    bound = next(b for b in scored.bindings if b.source == c.VALUE_SOURCE_SCORED_TARGET_TOKENS)
    graph(serving, "prefill_t16").bindings.append(bound)
    program(manifest, "prefill_t16").transports.add(destination=bound.destination, nbytes=64)


CASES: dict[str, Case] = {
    # contract and manifest rules (PreparedContract.from_contract)
    "graph variant missing": Case("graph.missing", drop_program("decode_b2")),
    "operation disagrees": Case(
        "graph.operation", set_operation("decode_b2", c.OPERATION_PREFILL, contract=False)),
    "mask words": Case("vocabulary.mask_words",
                       lambda s, mf: setattr(s.model.vocabulary, "mask_words", 10)),
    "u32 page table": Case("cache.view_table",
                           lambda s, mf: setattr(buffer(mf, "state.page_table"), "dtype",
                                                 m.D_TYPE_U32)),
    "page offset before the first page": Case(
        "cache.view_offset",
        lambda s, mf: setattr(s.model.cache.page_table_views[0], "page_offset", -1)),
    "uncaptured speculative width": Case("capacity.speculative_width",
                                         lambda s, mf: s.speculative_widths.append(4)),
    # SCORED_PREFILL programs (prompt log probabilities)
    "scored graph without targets": Case("scored.targets", drop_score_targets),
    "targets bound in a prefill graph": Case("scored.targets", targets_in_prefill),
    "scored program without its scores record": Case(
        "scored.record",
        lambda s, mf: program(mf, "scored_t16").completion.ClearField("scores_buffer")),
    "scores record in a decode program": Case(
        "scored.record",
        lambda s, mf: setattr(program(mf, "decode_b1").completion, "scores_buffer",
                              "out.scores")),
    "scores ids of the wrong dtype": Case(
        "scored.record",
        lambda s, mf: setattr(program(mf, "scored_t16").completion, "score_ids_buffer",
                              "out.logprobs")),
    # capability tables (NativeModel.load)
    "graph never scheduled": Case("runtime.operation",
                                  set_operation("decode_b1", c.OPERATION_RESUME)),
    # No served history needs fresh state (docs/snapshots.md, "INITIALIZE programs").
    "mixed graph without its packed rows": Case("mixed.bindings", mixed_prefill(_drop_rows)),
    "mixed graph off the decode pending view": Case(
        "runtime.mixed_pending_token",
        mixed_prefill(lambda g: g.ClearField("pending_token"))),
    "initialize graph": Case("runtime.operation",
                             set_operation("decode_b2", c.OPERATION_INITIALIZE)),
    "no prefill graph": Case("runtime.required_operation", no_prefill),
    "output limit binding": Case("runtime.binding", bind_output_limit),
    # Sliding windows are served (one region); a declaration without planes is not.
    "sliding window without planes": Case(
        "cache.window_planes",
        lambda s, mf: s.model.cache.regions.add(name="local", window_tokens=64,
                                                kind=c.HISTORY_KIND_SLIDING_WINDOW,
                                                tokens_per_record=1)),
    "sliding window of compressed records": Case(
        "cache.window_records",
        lambda s, mf: s.model.cache.regions.add(name="local", window_tokens=64,
                                                planes=["local.k"],
                                                kind=c.HISTORY_KIND_SLIDING_WINDOW)),
    "recurrent history": Case(
        "runtime.history_kind",
        lambda s, mf: s.model.cache.regions.add(name="ssm", kind=c.HISTORY_KIND_RECURRENT)),
    "compressed history": Case(
        "runtime.tokens_per_record",
        lambda s, mf: setattr(s.model.cache.regions[0], "tokens_per_record", 2)),
    "two state rows per request": Case(
        "runtime.state_rows",
        lambda s, mf: setattr(graph(s, "decode_b1"), "state_rows_per_request", 2)),
    "draft completion cursor": Case(
        "runtime.completion_cursor",
        lambda s, mf: graph(s, "decode_b1").completion_cursor.CopyFrom(
            c.CompletionCursor(has_draft_cursor=True, lag_tokens=1))),
    "tuned binding without its producer": Case("tuned.producer", tuned_without_producer),
    "image selectors": Case("runtime.image", add_images),
    "tiled images without tile geometry": Case("image.tiling", tiled_without_geometry),
    "f16 buffer": Case("runtime.dtype",
                       lambda s, mf: mf.buffers.add(name="scratch.half", dtype=m.D_TYPE_F16,
                                                    shape=[4], role=m.BUFFER_ROLE_SCRATCH)),
    "unknown reference op": Case(
        "runtime.reference_op", lambda s, mf: setattr(mf.kernels[0], "reference_op", "magic")),
    # what needs the tokenizer and the core's resources
    "split recipient frame control": Case("frontend.token_bound", recipient_frames),
    "chat template including another": Case(
        "frontend.chat_template",
        resources={"chat_template.jinja": lambda data: b"{% include 'base.jinja' %}"}),
    "tokenizer that does not load": Case(
        "frontend.tokenizer", resources={"tokenizer.json": lambda data: b'{"model": 7}'}),
    "weight of the wrong size": Case(
        "weight.nbytes", resources={"weights/final_norm": lambda data: data[:-4]}),
    "corrupt weight chunk": Case("resource.integrity", flip="weights/L1.w_down"),
    "wrong namespace": Case("core.authorize", accept="someone.else/models"),
    "collective in a single-rank core": Case("kernel.collective", add_collective),
    "per-rank weights of another rank count": Case("buffer.rank_weights", split_final_norm),
    "expert geometry with top-k 0": Case("experts.geometry", lambda s, mf: (
        mf.expert_geometry.CopyFrom(m.ExpertGeometry(experts=8, experts_per_token=0, hidden=32,
                                                     expert_width=16, block_rows=16)))),
}


def _rewrite(src: Path, key: Path, out: Path, case: Case) -> Path:
    with open_core(src, [load_public_key(Path(f"{key}.pub"))]) as core:
        contract, manifest = type(core.contract)(), type(core.manifest)()
        contract.CopyFrom(core.contract)
        manifest.CopyFrom(core.manifest)
        case.mutate(contract, manifest)
        with CoreWriter(out, load_private_key(key), None, core.namespace) as writer:
            for rid, res in core.resources.items():
                data = core.read_resource(rid)
                writer.add_resource(rid, res.kind, case.resources.get(rid, bytes)(data))
            writer.finish(contract, manifest)
    if case.flip is not None:
        with open_core(out, [load_public_key(Path(f"{key}.pub"))]) as core:
            offset, length = core.locations[case.flip]
        data = bytearray(out.read_bytes())
        data[offset + length // 2] ^= 0x40
        out.write_bytes(bytes(data))
    return out


def _startup_rule(path: Path, public: Path, accept: str) -> str:
    """The rule named by the startup error of `helios-serve PATH` (cpu backend)."""
    with pytest.raises(StartupError) as info:
        server = start(path, [str(public)], accept, ServeOptions(port=0))
        server.stop()  # not reached for a bad core
    assert info.value.rule, f"startup failed without naming a rule: {info.value}"
    return info.value.rule


def _lint_rules(path: Path, public: Path, accept: str, *backends: str) -> set[str]:
    args = ["lint-core", str(path), "--trust", str(public), "--accept", accept, "--format",
            "json", *(a for b in backends for a in ("--backend", b))]
    result = CliRunner().invoke(tools_main, args)
    findings = json.loads(result.output)["findings"]
    assert result.exit_code == (1 if findings else 0), result.output
    return {finding["rule"] for finding in findings}


@pytest.fixture(scope="module")
def source(tiny_served):
    core = tiny_served.core
    return core.path, core.private_key, core.public_key, core.namespace


def test_the_source_core_starts_and_lints_clean(source):
    path, _, public, namespace = source
    assert _lint_rules(path, public, namespace) == set()
    bootstrap = Bootstrap.load(path, [public], namespace)
    with bootstrap:
        NativeModel.load(bootstrap.prepared, bootstrap.core.read_resource, "cpu").close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_startup_rejection_is_a_lint_finding_of_the_same_rule(name, source, tmp_path):
    src, key, public, namespace = source
    case = CASES[name]
    accept = case.accept or namespace
    path = _rewrite(src, key, tmp_path / "bad.core", case)
    rule = _startup_rule(path, public, accept)
    assert rule == case.rule
    assert rule in _lint_rules(path, public, accept)  # default: every backend
    assert rule in _lint_rules(path, public, accept, "cpu")
    if rule != "runtime.reference_op":  # the cuda backend runs binaries, not NumPy ops
        assert rule in _lint_rules(path, public, accept, "cuda")
