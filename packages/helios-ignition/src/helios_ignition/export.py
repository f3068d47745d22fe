"""`ignition export`: recipe + checkpoint -> a signed payload core (docs/architecture.md, "Preparation: from a recipe to a core").

Order of work: every cheap check first (recipe, checkpoint geometry, tokenizer,
template, output path, key), then capture, then the streaming write through
helios-tools' CoreWriter, which is atomic: a failure at any point leaves no file.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from helios_contract import stored_nbytes
from helios_contract.errors import FieldError
from helios_contract.prepared import PreparedContract
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import core_pb2
from helios_contract.schema import frontend_pb2 as fe_pb
from helios_tools.core import CoreWriter, LogicalCoreWriter, load_private_key
from helios_tools.core.protected import load_resource_key
from helios_tools.frontend_assets import (
    ChatTemplateCompileError,
    ChatTemplateError,
    ChatTemplateLimitError,
    load_tokenizer,
    render_chat,
)
from helios_tools.kernels import grammar_mask_words
from helios_tools.kernels.linear_splitk import ROUNDED_PRODUCERS

from .capture import launch as launch_rules
from .capture.buffers import Speculation, cache_contract, weight_resource_id
from .capture.family import TensorParallelError
from .capture.programs import capture
from .checkpoint import (
    Checkpoint,
    CheckpointError,
    MissingChatTemplateError,
    MissingTokenizerError,
    gemma3_270m_gguf_path,
    load_checkpoint,
    load_gguf,
    random_checkpoint,
    smollm2_gguf_path,
)
from .checkpoint.drafter import Drafter, DrafterGeometry, random_drafter, read_drafter
from .families import vision
from .families.registry import FamilyMismatchError, family_shapes
from .kv_cache import (
    CALIBRATION_MAX_BYTES,
    CALIBRATION_TEXT,
    KV_CACHE_DTYPES,
    apply_kv_bf16,
    apply_kv_fp8,
    calibrate_kv_scales,
    checkpoint_kv_scales,
    describe_kv_bf16,
    describe_kv_fp8,
    fp8_planes,
    is_fp8,
)
from .quantize import (
    QUANTIZE_CHOICES,
    apply_quantize,
    apply_storage,
    packed_path_off,
    quantized_weights,
    repacked_weights,
)
from .recipe import (
    SUPPORTED_ACTIVATION_DTYPES,
    Recipe,
    RecipeError,
    SplitTuning,
    load_recipe_module,
    validate_recipe,
)
from .weights import (
    declare_storage,
    gguf_blocks,
    iter_drafter_buffers,
    iter_stored_weights,
    repack_storage,
    weight_catalogs,
)

CONTRACT_VERSION = 3
CARRIERS = ("payload", "logical")  # CoreBody.format_version 2 / logical-resource core
PROTECTED_VERSIONS = (6, 4)  # ProtectedIndex.version: zstd frames / AES-GCM chunks


class ExportError(ValueError):
    """Export cannot proceed; the message names the input at fault."""


class ExportUsageError(ExportError):
    """The export's options do not go together or one is missing (`ignition export`
    exits with its usage status, 2); nothing was read."""


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote (sizes in bytes, time in seconds)."""

    path: str
    served_id: str
    graphs: tuple[str, ...]
    resources: int
    decoded_bytes: int
    core_bytes: int
    seconds: float
    carrier: str = "payload"
    protected_version: int | None = None
    # The KV cache as stored, in words ("" for the recipe's f32 cache).
    kv_cache: str = ""

    @property
    def format(self) -> str:
        """The carrier in words: "payload core" or "logical-resource core (ProtectedIndex
        version N)"."""
        if self.carrier == "payload":
            return "payload core"
        return f"logical-resource core (ProtectedIndex version {self.protected_version})"


def open_checkpoint(spec: str | Checkpoint | None, random_seed: int | None,
                    geometry: str | None):
    """Resolve a checkpoint spec: "smollm2" (the embedded GGUF), "gemma3-270m" (the
    development group's Gemma 3 270M GGUF), a path, random weights, or a `Checkpoint`
    already opened (returned as it is).

    Raises:
        ExportError: conflicting or missing choices.
        CheckpointError: the checkpoint itself is bad (from the loaders).
    """
    if isinstance(spec, Checkpoint) and random_seed is None and not geometry:
        return spec
    if random_seed is not None:
        if spec:
            raise ExportUsageError("--checkpoint and --random-weights are exclusive")
        if not geometry:
            raise ExportUsageError("--random-weights needs --geometry (smollm2-135m, llama-3.1-8b, "
                                   "qwen3-8b or qwen3-30b-a3b)")
        return random_checkpoint(geometry, random_seed)
    if geometry:
        raise ExportUsageError("--geometry applies only with --random-weights")
    if not spec:
        raise ExportUsageError("no checkpoint: pass --checkpoint PATH|smollm2 or --random-weights")
    if spec == "smollm2":
        return load_gguf(smollm2_gguf_path())
    if spec == "gemma3-270m":
        return load_gguf(gemma3_270m_gguf_path())
    return load_checkpoint(spec)


def resolve_recipe(recipe_path: str | Path, checkpoint) -> Recipe:
    """The recipe file's RECIPE, or what its make_recipe(checkpoint) returns.

    Raises:
        RecipeError: the file does not load, its make_recipe raises (a recipe that refuses
            the checkpoint: SmolVLM's on a vocabulary without its image tokens), or it
            yields no Recipe.
    """
    module = load_recipe_module(recipe_path)
    if hasattr(module, "RECIPE"):
        recipe = module.RECIPE
    else:
        try:
            recipe = module.make_recipe(checkpoint)
        except RecipeError:
            raise
        except Exception as exc:  # a recipe is user code: report, don't crash
            raise RecipeError(f"recipe {recipe_path}: make_recipe failed for checkpoint "
                              f"{checkpoint.source}: {' '.join(str(exc).split())}") from exc
    if not isinstance(recipe, Recipe):
        raise RecipeError(f"recipe {recipe_path}: RECIPE is a {type(recipe).__name__}, "
                          "not a helios_ignition.recipe.Recipe")
    return recipe


def _check_output(out: Path) -> None:
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise ExportError(f"output directory does not exist: {parent}")
    if not os.access(parent, os.W_OK):
        raise ExportError(f"output directory is not writable: {parent}")
    if out.is_dir():
        raise ExportError(f"output path is a directory: {out}")


@dataclass(frozen=True)
class Carrier:
    """How the core is carried (the specification, "Payload cores"): a payload core, or a
    logical-resource core with ProtectedIndex version 6 (zstd frames) or 4 (AES-GCM chunks
    under the operator's resource key)."""

    name: str = "payload"
    protected_version: int | None = None
    resource_key: bytes | None = None

    @classmethod
    def choose(cls, carrier: str, protected_version: int | None,
               resource_key_path: str | Path | None) -> Carrier:
        """Check the carrier options together and read the resource key.

        Raises:
            ExportError: an unknown carrier or version, a version without
                `--carrier logical`, version 4 without a key, or a key it would not use.
        """

        if carrier not in CARRIERS:
            raise ExportUsageError(f"--carrier must be one of {', '.join(CARRIERS)}, not {carrier!r}")
        if carrier == "payload":
            if protected_version is not None:
                raise ExportUsageError("--protected-version applies only with --carrier logical")
            if resource_key_path is not None:
                raise ExportUsageError("--resource-key applies only with --carrier logical "
                                  "--protected-version 4")
            return cls()
        version = 6 if protected_version is None else protected_version
        if version not in PROTECTED_VERSIONS:
            raise ExportUsageError(f"--protected-version must be 6 or 4, not {version}")
        if version == 6:
            if resource_key_path is not None:
                raise ExportUsageError("--resource-key applies only with --protected-version 4 "
                                  "(version 6 resources are not encrypted)")
            return cls("logical", 6)
        if resource_key_path is None:
            raise ExportUsageError("--protected-version 4 needs --resource-key FILE (32 random "
                              "bytes: `helios-tools keygen --aes --out FILE`)")
        try:
            key = load_resource_key(resource_key_path)
        except FileNotFoundError:
            raise ExportError(f"resource key not found: {resource_key_path}") from None
        except OSError as exc:
            raise ExportError(f"resource key {resource_key_path}: "
                              f"{exc.strerror or exc}") from None
        except ValueError as exc:  # its message names the file already
            raise ExportError(f"cannot read resource key: {exc}") from None
        return cls("logical", 4, key)

    def writer(self, out: Path, key, namespace: str):
        """The helios-tools core writer for this carrier."""

        if self.name == "payload":
            return CoreWriter(out, key, None, namespace)
        return LogicalCoreWriter(out, key, None, namespace, version=self.protected_version,
                                 resource_key=self.resource_key)


def fit_context(recipe: Recipe, max_context_tokens: int) -> Recipe:
    """The recipe with its context capped at the checkpoint's trained context.

    The cap is rounded down to whole pages; prefill and scored chunk capacities and the
    default output limit longer than the capped context shrink with it (the contract
    requires chunk <= context and max_output_tokens <= context).

    Raises:
        ExportError: no prefill chunk capacity fits in the checkpoint's context.
    """
    caps = recipe.capacities
    if caps.context_tokens <= max_context_tokens:
        return recipe
    context = max_context_tokens - max_context_tokens % caps.page_tokens
    prefill = tuple(t for t in caps.prefill_tokens if t <= context)
    if not prefill:
        raise ExportError(f"checkpoint context of {max_context_tokens} tokens ({context} in "
                          f"whole {caps.page_tokens}-token pages) is shorter than every prefill "
                          f"capacity {caps.prefill_tokens} of recipe {recipe.name}")
    sampling = replace(recipe.sampling,
                       max_output_tokens=min(recipe.sampling.max_output_tokens, context))
    scored = tuple(t for t in caps.scored_tokens if t <= context)
    return replace(recipe, capacities=replace(caps, context_tokens=context,
                                              prefill_tokens=prefill, scored_tokens=scored),
                   sampling=sampling)


def check_contract(contract: cpb.ServingContract, manifest) -> None:
    """Validate what is about to be signed exactly as helios-serve will at startup.

    Raises:
        ExportError: the contract breaks a rule (names the field and value).
    """

    try:
        PreparedContract.from_contract(contract, manifest)
    except FieldError as exc:
        raise ExportError(f"recipe {contract.served_id}: the exported contract would be "
                          f"refused at startup: {exc}") from None


def check_tokenizer(tokenizer_json: str, vocab_size: int, source: str) -> None:
    """Refuse a tokenizer helios-serve cannot load, or with ids the model cannot embed.

    Raises:
        CheckpointError: names `source` and the problem.
    """

    try:
        tokenizer = load_tokenizer(tokenizer_json)
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    top_id = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if top_id >= vocab_size:
        raise CheckpointError(f"{source}: tokenizer has token id {top_id}, beyond the "
                              f"model's vocabulary of {vocab_size} ids")


def check_template(chat_template: str, source: str, error: type[Exception]) -> None:
    """Refuse a chat template that does not compile (helios-serve refuses it at startup).

    Raises:
        `error` (RecipeError or CheckpointError, whichever supplied the template).
    """
    # As Bootstrap does: a template may refuse some conversations, but one that does not
    # compile, loads other templates or exceeds its limits on one message never serves.
    try:
        render_chat(chat_template, [{"role": "user", "content": "ping"}])
    except (ChatTemplateCompileError, ChatTemplateLimitError) as exc:
        raise error(f"{source}: {exc}") from None
    except ChatTemplateError:
        pass



def read_ahead(items: Iterator, depth: int = 2) -> Iterator:
    """Yield `items` in order while a background thread produces up to `depth` ahead.

    Export reads and converts a weight (checkpoint decode, bf16 rounding: NumPy, which
    releases the GIL) while the writer compresses and hashes the previous one. An exception
    in the producer is raised here, at the item where it happened; closing this generator
    early (an error while writing) stops the producer.
    """
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(entry: tuple) -> bool:
        while not stop.is_set():  # never blocks for good once the consumer has gone
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((done, exc))

    worker = threading.Thread(target=produce, name="export-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, exc = slots.get()
            if item is done:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        worker.join()

@contextmanager
def _write_errors(out: Path) -> Iterator[None]:
    """Turn an OSError of writing the core (folder, disk) into an ExportError naming `out`."""
    try:
        yield
    except OSError as exc:
        # Checkpoint reads name their own file; the core's writes are all in `out`'s folder.
        if exc.filename is not None and Path(exc.filename).parent != out.parent:
            raise
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None


def open_drafter(recipe: Recipe, recipe_path: str | Path, checkpoint) -> Drafter | None:
    """The recipe's drafter checked against the target, or None when it declares none.

    Raises:
        RecipeError: a malformed "random:SEED:VOCAB" spec.
        CheckpointError: the drafter file is missing, malformed or does not fit the target.
    """
    if recipe.drafter is None:
        return None
    spec = recipe.drafter.checkpoint
    target = checkpoint.geometry
    if spec.startswith("random:"):
        try:
            _, seed, vocab = spec.split(":")
            tensors = random_drafter(target, int(vocab), int(seed), checkpoint.eos_token_ids)
        except ValueError as exc:
            raise RecipeError(f"recipe {recipe.name}: drafter {spec!r} is not "
                              f"'random:SEED:DRAFT_VOCAB' ({exc})") from None
        geometry = DrafterGeometry.for_target(target, int(vocab))
        return Drafter(spec, geometry, tensors, {})
    path = Path(spec)
    if not path.is_absolute():
        path = Path(recipe_path).resolve().parent / path
    return read_drafter(path, target)


def build_contract(recipe: Recipe, checkpoint, shapes,
                   graphs: list[cpb.GraphContract], manifest,
                   speculation: Speculation | None = None) -> cpb.ServingContract:
    """Assemble the ServingContract (contract version 3) for the captured graphs."""
    caps = recipe.capacities
    eos = recipe.eos_token_ids or checkpoint.eos_token_ids
    words = grammar_mask_words(shapes.vocab)
    cache = cache_contract(shapes, caps, speculation)
    inputs, vision_contract = cpb.InputVocabulary(input_tokens=shapes.vocab), cpb.VisionContract()
    if shapes.vision is not None:  # one nonsampled sentinel after the text vocabulary
        inputs = cpb.InputVocabulary(input_tokens=shapes.vocab + 1,
                                     image_sentinel_ids=[shapes.vocab])
        per_window = vision.features_per_window(shapes.vision)
        vision_contract = cpb.VisionContract(
            feature_slots=caps.image_feature_slots or caps.image_windows * per_window,
            features_per_window=per_window, patches_per_feature=shapes.vision.scale_factor ** 2,
            patch_capacities=[caps.image_windows * shapes.vision.grid ** 2])
    model = cpb.ModelContract(
        version=CONTRACT_VERSION,
        vocabulary=cpb.Vocabulary(sampled_tokens=shapes.vocab, histogram_width=shapes.vocab,
                                  mask_words=words),
        input_vocabulary=inputs, vision=vision_contract,
        cache=cache, graphs=graphs, frontend=recipe.frontend)
    s, d = recipe.sampling, recipe.serving
    identity = hashlib.sha256(manifest.SerializeToString(deterministic=True)
                              + checkpoint.tokenizer_json.encode()).hexdigest()[:16]
    special = checkpoint.special_tokens
    return cpb.ServingContract(
        served_id=recipe.name, aliases=list(recipe.aliases),
        cache_identity=f"{recipe.name}/{recipe.weight_dtype}/{identity}",
        context_tokens=caps.context_tokens, prefill_chunk_tokens=max(caps.prefill_tokens),
        prepared_pages=caps.prepared_pages,
        prepared_snapshots=caps.prepared_snapshots if caps.transfer_rows else 0,
        selected_concurrency=max(caps.decode_batch),
        speculative_widths=list(speculation.widths) if speculation else [],
        defaults=cpb.ServingDefaults(
            sampling=cpb.SamplingDefaults(
                temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                repetition_penalty=s.repetition_penalty, max_output_tokens=s.max_output_tokens),
            max_active=d.max_active, queue_capacity=d.queue_capacity,
            frontend_workers=d.frontend_workers, event_capacity=d.event_capacity),
        eos_token_ids=list(eos),
        template_tokens=cpb.TemplateTokens(bos_token=special.get("bos_token", ""),
                                           eos_token=special.get("eos_token", ""),
                                           pad_token=special.get("pad_token", "")),
        model=model)


def _weight_nbytes(manifest) -> int:
    """Decoded bytes of every weight buffer (the manifest's shapes and stored dtypes or
    block storage)."""
    total = 0
    for b in manifest.buffers:
        copies = len(b.rank_weight_resource_ids) or int(bool(b.weight_resource_id))
        if copies:
            total += stored_nbytes(b) * copies
    return total


def _gguf_blocks(recipe: Recipe, ckpt, shapes, tensor_parallel: int) -> dict[str, str]:
    """The weight buffers that keep GGUF blocks (weights.gguf_blocks) under the ``gguf``
    weight dtype; none under the others.

    Raises:
        ExportError: ``gguf`` with tensor parallelism, a drafter (its row-invariant
            products have no quantized form) or a checkpoint that holds no GGUF blocks.
    """
    if recipe.weight_dtype != "gguf":
        return {}
    if tensor_parallel > 1:
        raise ExportError("--weight-dtype gguf keeps whole GGUF tensors: export without "
                          "--tensor-parallel")
    if recipe.drafter is not None:
        raise ExportError(f"--weight-dtype gguf: recipe {recipe.name} declares a drafter, "
                          "whose row-invariant products have no quantized form")
    blocks = gguf_blocks(ckpt, shapes)
    if not blocks:
        raise ExportError(f"--weight-dtype gguf: {ckpt.source} stores no matrix in GGUF "
                          "blocks (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)")
    return blocks


def _kv_calibration_refusal(manifest, quantized: bool, tensor_parallel: int, drafter) -> str:
    """Why the e4m3 cache's scales are not calibrated at export ("" when they are): the
    calibration runs the f32 prefill of one rank over plain float weights of at most
    ``CALIBRATION_MAX_BYTES`` (`quantized`: GGUF blocks, repacked or not, or
    ``--quantize``)."""
    if quantized:
        return "quantized weights"
    if tensor_parallel > 1:
        return "tensor-parallel ranks"
    if drafter is not None:
        return "a drafter"
    if _weight_nbytes(manifest) > CALIBRATION_MAX_BYTES:
        return f"weights above {CALIBRATION_MAX_BYTES >> 30} GiB"
    return ""


def _check_quantize(quantize: str | None, recipe: Recipe, tensor_parallel: int,
                    weight_dtype: str | None = None) -> None:
    """Refuse a ``--quantize`` the export cannot honour.

    Args:
        weight_dtype: the ``--weight-dtype`` given (None: the recipe's), to name where
            ``gguf`` weights came from.

    Raises:
        ExportUsageError: an unknown choice, or one with ``gguf`` weights (already
            quantized) or tensor parallelism (per-rank FP8 parts are not written).
    """
    if quantize is None:
        return
    if quantize not in QUANTIZE_CHOICES:
        raise ExportUsageError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, "
                               f"not {quantize!r}")
    if recipe.weight_dtype == "gguf":
        # A recipe may keep GGUF blocks by default (gemma3_270m.py): name the recipe, or
        # the refusal names an option the operator never passed.
        which = ("--weight-dtype gguf" if weight_dtype else
                 f"recipe {recipe.name}'s weight dtype gguf (pass --weight-dtype bf16 or f32 "
                 "to quantize float weights)")
        raise ExportUsageError(f"--quantize {quantize} and {which} are exclusive (the gguf "
                               "blocks are quantized already)")
    if tensor_parallel > 1:
        raise ExportUsageError(f"--quantize {quantize} stores whole tensors: export without "
                               "--tensor-parallel")


def export_core(recipe_path: str | Path, *, checkpoint: str | Checkpoint | None,
                key_path: str | Path,
                namespace: str, out: str | Path, weight_dtype: str | None = None,
                random_seed: int | None = None, geometry: str | None = None,
                targets: tuple[str, ...] = (), carrier: str = "payload",
                protected_version: int | None = None,
                resource_key_path: str | Path | None = None,
                split_tuning: SplitTuning | None = None,
                fold_layers: bool | None = None,
                chunked_sampling: bool | None = None,
                tensor_parallel: int = 1,
                quantize: str | None = None,
                kv_cache_dtype: str | None = None,
                activation_dtype: str | None = None,
                progress: Callable[[str, int, int, str], None] | None = None
                ) -> ExportSummary:
    """Export a recipe and checkpoint to a signed core at `out` (atomic).

    Args:
        recipe_path: a recipe file in recipes/.
        checkpoint: "smollm2", "gemma3-270m", a .gguf file, a safetensors directory or an
            opened `Checkpoint` (or None with `random_seed` + `geometry`).
        key_path: Ed25519 private key (PEM) from `helios-tools keygen`.
        namespace: publisher namespace signed into the core.
        out: core path to write.
        weight_dtype: override the recipe's weight dtype ("bf16" or "f32").
        targets: GPU targets to compile kernels for (e.g. "sm_90").
        carrier: "payload" (CoreBody.format_version 2) or "logical" (a logical-resource
            core).
        protected_version: with carrier "logical": 6 (zstd frames, the default) or 4
            (AES-GCM chunks).
        resource_key_path: with protected_version 4: the AES-256 key file (32 raw bytes).
        split_tuning: capture the decode-split tuning producer with these settings
            (None: the recipe's `split_tuning`).
        fold_layers: fold norms and residual adds into the decode products (None: the
            recipe's `fold_layers`).
        chunked_sampling: sample with the chunked sampler (None: the recipe's
            `chunked_sampling`).
        tensor_parallel: ranks the model is split between (docs/tensor-parallel.md): the
            manifest's shapes become one rank's, split weights are stored once per rank
            with a per-rank weight catalog, and the programs carry the collectives.
        quantize: "fp8": store the products' weight matrices as FP8 e4m3 codes with
            per-row scales, served W8A8; "int4": as packed 4-bit codes with group-128
            scales and zero points, served W4A16 (helios_ignition.quantize); None: as the
            weight dtype says.
        kv_cache_dtype: "fp8" / "fp8_e4m3": store the KV cache planes as e4m3 codes with
            per-(layer, kv head) scales (helios_ignition.kv_cache); "bf16": bfloat16
            planes, each write rounded (``apply_kv_bf16``); "auto" or None: f32.
        activation_dtype: "bf16": the packed products' activations rounded to bf16
            (``round_bf16``; one tensor-core term), "f32": two terms; None: the recipe's
            ``activation_dtype``. bf16 given here with no packed product in the programs
            is refused.
        progress: called as progress(step, done, total, unit) for the steps "kernels
            compiled" (kernel variants), "weights read" (weight tensors) and "bytes
            written" (decoded bytes stored in the core; unit "bytes"), as
            helios_tools.progress.StepProgress.update takes them.

    Raises:
        ExportError, RecipeError, CheckpointError: bad input; no file is written.
    """

    started = time.perf_counter()
    out = Path(out)
    _check_output(out)
    if not namespace:
        raise ExportError("--namespace must be non-empty")
    carried = Carrier.choose(carrier, protected_version, resource_key_path)
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ExportUsageError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                               f"not {kv_cache_dtype!r}")
    if activation_dtype is not None and activation_dtype not in SUPPORTED_ACTIVATION_DTYPES:
        raise ExportUsageError(f"--activation-dtype must be one of "
                               f"{', '.join(SUPPORTED_ACTIVATION_DTYPES)}, not "
                               f"{activation_dtype!r}")
    try:  # HELIOS_ATTN_MMA reads bf16 cache planes only
        launch_rules.check_attention_mma(kv_cache_dtype)
    except ValueError as exc:
        raise ExportUsageError(str(exc)) from None
    try:
        key = load_private_key(key_path)
    except FileNotFoundError:
        raise ExportError(f"signing key not found: {key_path}") from None
    except (OSError, ValueError) as exc:
        raise ExportError(f"signing key {key_path}: not a PEM Ed25519 private key "
                          f"({exc})") from None
    ckpt = open_checkpoint(checkpoint, random_seed, geometry)
    recipe = resolve_recipe(recipe_path, ckpt)
    if weight_dtype:
        recipe = replace(recipe, weight_dtype=weight_dtype)
    if split_tuning is not None:
        recipe = replace(recipe, split_tuning=split_tuning)
    if fold_layers is not None:
        recipe = replace(recipe, fold_layers=fold_layers)
    if chunked_sampling is not None:
        recipe = replace(recipe, chunked_sampling=chunked_sampling)
    if activation_dtype is not None:
        recipe = replace(recipe, activation_dtype=activation_dtype)
    validate_recipe(recipe)
    _check_quantize(quantize, recipe, tensor_parallel, weight_dtype)
    try:
        shapes = family_shapes(recipe.family, ckpt.geometry)
    except FamilyMismatchError as exc:
        # The checkpoint's: a generic recipe's name is the checkpoint's file name.
        raise ExportError(f"checkpoint {ckpt.source}: {exc}") from None
    if not ckpt.tokenizer_json:
        raise MissingTokenizerError(f"{ckpt.source}: no tokenizer")
    chat_template = recipe.chat_template or ckpt.chat_template  # the recipe's wins
    if not chat_template:
        raise MissingChatTemplateError(f"{ckpt.source}: no chat template")
    check_tokenizer(ckpt.tokenizer_json, ckpt.geometry.vocab_size, ckpt.source)
    if recipe.chat_template:
        check_template(chat_template, f"recipe {recipe.name}", RecipeError)
    else:
        check_template(chat_template, ckpt.source, CheckpointError)
    try:
        shapes = shapes.shard(tensor_parallel)
        if tensor_parallel > 1 and recipe.fold_layers:
            raise TensorParallelError(
                "folded layers add the O and down products into the residual, which split "
                "ranks must all-reduce first: export without --fold-layers")
    except TensorParallelError as exc:
        raise ExportError(f"--tensor-parallel {tensor_parallel}: {exc}") from None
    recipe = fit_context(recipe, ckpt.geometry.max_context)
    caps = recipe.capacities
    images = recipe.frontend.image_layout not in (fe_pb.IMAGE_LAYOUT_NONE,
                                                  fe_pb.IMAGE_LAYOUT_UNSPECIFIED)
    if images != (shapes.vision is not None) or (images and not caps.image_windows):
        raise ExportError(
            f"recipe {recipe.name} declares "
            f"{'an image layout' if images else 'no image layout'} "
            f"(capacities.image_windows {caps.image_windows}) but {ckpt.source} has "
            f"{'a vision tower' if shapes.vision is not None else 'no vision tower'}")
    drafter = open_drafter(recipe, recipe_path, ckpt)
    speculation = (Speculation(drafter.geometry, recipe.drafter.widths,
                               coupled=recipe.drafter.coupled)
                   if drafter is not None and recipe.drafter is not None else None)
    blocks = _gguf_blocks(recipe, ckpt, shapes, tensor_parallel)
    # gguf: the programs see f32 elements (the blocks are declared storage of them).
    capture_dtype = "f32" if recipe.weight_dtype == "gguf" else recipe.weight_dtype
    # A gguf core for a GPU target stores its blocks repacked into the element-wise code
    # forms both backends execute (docs/gguf-cuda.md); without a target, as ggml blocks.
    repack_blocks = bool(blocks) and bool(targets)
    with packed_path_off() if quantize or repack_blocks else nullcontext():
        manifest, graphs = capture(shapes, caps, capture_dtype, spec=speculation,
                                   split_tuning=recipe.split_tuning,
                                   fold_layers=recipe.fold_layers,
                                   chunked_sampling=recipe.chunked_sampling,
                                   activations=recipe.activation_dtype)
    # Asked for on the command line, bf16 activations that round nothing are refused; a
    # recipe's choice holds for whichever checkpoints it takes (Recipe.activation_dtype).
    if activation_dtype == "bf16" and not any(
            k.reference_op in ROUNDED_PRODUCERS for k in manifest.kernels):
        raise ExportError(
            f"--activation-dtype bf16: recipe {recipe.name}'s programs record no packed bf16 "
            f"product to round (it applies to bf16 matrices of at least "
            f"{launch_rules.MMA_MIN_WEIGHTS:,} weights at {launch_rules.MMA_ROWS[0]}+ rows, "
            "without --quantize or GGUF blocks; the others keep f32 activations)")
    repacked = repacked_weights(manifest, repack_storage(ckpt, shapes)) if repack_blocks \
        else {}
    if repack_blocks:
        apply_storage(manifest, repacked)
        blocks = {}  # the other block matrices (the embedding) are stored as f32
    declare_storage(manifest, blocks)
    chosen = frozenset(quantized_weights(manifest, quantize)) if quantize else frozenset()
    if quantize and not chosen:
        raise ExportError(f"--quantize {quantize}: recipe {recipe.name}'s programs read no "
                          f"weight matrix through a product with a {quantize} form")
    if quantize:
        apply_quantize(manifest, sorted(chosen, key=[b.name for b in manifest.buffers].index),
                       quantize)
    kv_scales, uncalibrated, own_scales = {}, "", False
    if is_fp8(kv_cache_dtype):
        planes = fp8_planes(manifest)
        heads = {b.name: int(b.shape[-2]) for b in manifest.buffers if b.name in planes}
        calibrated = checkpoint_kv_scales(ckpt.source, planes, heads)
        own_scales = calibrated is not None
        uncalibrated = "" if own_scales else _kv_calibration_refusal(
            manifest, bool(blocks or repacked or quantize), tensor_parallel, drafter)
        if not own_scales and not uncalibrated:
            weights = {w.buffer: w.array for w in iter_stored_weights(
                ckpt, shapes, recipe.weight_dtype, blocks)}
            tokens = load_tokenizer(ckpt.tokenizer_json).encode(
                CALIBRATION_TEXT, add_special_tokens=False).ids
            calibrated = calibrate_kv_scales(manifest, graphs, weights, tokens, planes)
        try:
            kv_scales = apply_kv_fp8(manifest, calibrated)
        except ValueError as exc:
            raise ExportError(f"--kv-cache-dtype {kv_cache_dtype}: recipe {recipe.name}: "
                              f"{exc}") from None
    kv_report = describe_kv_fp8(kv_scales, uncalibrated, own_scales) if kv_scales else ""
    if kv_cache_dtype == "bf16":
        try:
            kv_report = describe_kv_bf16(apply_kv_bf16(manifest, graphs))
        except ValueError as exc:
            raise ExportError(f"--kv-cache-dtype bf16: recipe {recipe.name}: {exc}") from None
    fp8 = chosen if quantize == "fp8" else frozenset()
    int4 = chosen if quantize == "int4" else frozenset()
    blobs: dict[str, bytes] = {}
    if targets:
        from .kernels_aot import compile_targets  # imports Triton: only with --target

        compiled = (lambda done, total: progress("kernels compiled", done, total, "")) \
            if progress else None
        blobs = compile_targets(manifest, targets, progress=compiled)
    contract = build_contract(recipe, ckpt, shapes, graphs, manifest, speculation)
    check_contract(contract, manifest)
    weight_count = sum(len(b.rank_weight_resource_ids) or int(bool(b.weight_resource_id))
                       for b in manifest.buffers)
    tok = ckpt.tokenizer_json.encode()
    tpl = chat_template.encode()
    total = len(tok) + len(tpl) + _weight_nbytes(manifest) + sum(map(len, blobs.values()))
    decoded = 0

    def written(nbytes: int) -> None:
        nonlocal decoded
        decoded += nbytes
        if progress:
            progress("bytes written", decoded, total, "bytes")

    with _write_errors(out), carried.writer(out, key, namespace) as writer:
        writer.add_resource("tokenizer.json", core_pb2.RESOURCE_KIND_TOKENIZER, tok)
        writer.add_resource("chat_template.jinja", core_pb2.RESOURCE_KIND_CHAT_TEMPLATE, tpl)
        written(len(tok) + len(tpl))
        stored = []
        for done, weight in enumerate(read_ahead(iter_stored_weights(
                ckpt, shapes, recipe.weight_dtype, blocks, fp8, int4, frozenset(repacked)))):
            if progress:
                progress("weights read", done + 1, weight_count, "")
            writer.add_resource(weight.resource_id, core_pb2.RESOURCE_KIND_WEIGHTS,
                                memoryview(weight.array).cast("B"))
            written(weight.array.nbytes)
            stored.append(replace(weight, array=weight.array[:0]))  # the catalog's facts
        manifest.weight_catalogs.extend(weight_catalogs(stored, shapes.ranks))
        for name, array in kv_scales.items():  # the e4m3 KV cache's per-head scales
            writer.add_resource(weight_resource_id(name), core_pb2.RESOURCE_KIND_WEIGHTS,
                                memoryview(array).cast("B"))
            written(array.nbytes)
        if drafter is not None:
            for name, array in iter_drafter_buffers(drafter, ckpt, shapes, recipe.weight_dtype):
                writer.add_resource(weight_resource_id(name), core_pb2.RESOURCE_KIND_WEIGHTS,
                                    memoryview(array).cast("B"))
                written(array.nbytes)
        if targets:
            from .kernels_aot import add_binaries  # imports Triton: only with --target

            written(add_binaries(writer, manifest))
        writer.finish(contract, manifest)
    return ExportSummary(path=str(out), served_id=contract.served_id,
                         graphs=tuple(g.name for g in manifest.graphs),
                         resources=weight_count + 2, decoded_bytes=decoded,
                         core_bytes=out.stat().st_size,
                         seconds=time.perf_counter() - started, carrier=carried.name,
                         protected_version=carried.protected_version,
                         kv_cache=kv_report)
