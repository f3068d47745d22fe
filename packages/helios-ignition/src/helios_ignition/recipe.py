"""The recipe API: what a file in recipes/ declares (docs/architecture.md, "Preparation: from a recipe to a core").

A recipe declares semantic metadata only: the model family, where its checkpoint comes
from, frontend syntax, EOS and template tokens, model-card sampling defaults, captured
capacities and the weight dtype. Geometry is read from the checkpoint. A recipe installs
no scheduling or state-update code.

A recipe module defines `RECIPE = Recipe(...)`, or `make_recipe(checkpoint) -> Recipe`
when declarations depend on the checkpoint (a generic family recipe).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from helios_contract.schema import frontend_pb2


class RecipeError(ValueError):
    """A recipe file is missing, malformed, or declares something unsupported."""


@dataclass(frozen=True)
class Capacities:
    """Captured capacities (graph variants are captured for each).

    Attributes:
        decode_batch: DECODE batch capacities (request rows), ascending.
        prefill_tokens: PREFILL packed-token capacities, ascending; the largest is the
            prefill chunk extent.
        prefill_rows: request rows of every PREFILL variant.
        context_tokens: context extent (prompt + output) of one request.
        page_tokens: tokens per KV page.
        prepared_pages: prepared page capacity (the load-time default).
        prepared_snapshots: continuation rows for exact-endpoint snapshots (the
            load-time default; 0: no continuation storage, no snapshots).
        host_tier: declare host-tier planes (sized at load by the host cache capacity).
        scored_tokens: SCORED_PREFILL packed-token capacities, ascending, each at most the
            largest prefill capacity (empty: no scored programs, so no prompt log
            probabilities). A scored program is its prefill variant plus the LM head over
            every packed token and a log-softmax gather of each token's target (the next
            prompt token): it holds an f32 [tokens, vocab] logits scratch, so its
            capacities stay small.
        transfer_rows: rows one captured RESTORE program copies (0: no transfer programs,
            so neither snapshots nor a host tier). A TRANSFER step holds this many copies
            per route, so `context_tokens // page_tokens` (one request's whole history)
            makes a swap-in of any request one step: padding rows copy nothing (NumPy
            skips them; a Triton program per padding row returns at once).
        image_windows: windows (tiles and global views) one image prefill program
            encodes (a vision model's patch capacity is this x patches per window; 0 for
            a text model). Every image span of a prefill step is encoded whole in it.
        image_feature_slots: image features one request may hold (0: one program's,
            image_windows x features per window).
        mixed_tokens: MIXED packed-token capacities, ascending (empty: no mixed programs;
            the scheduler then alternates PREFILL and DECODE steps). Each is a token
            budget the scheduler may give a mixed step, chosen per step (the largest
            while as many requests owe prompt tokens as the step has decode lanes, else
            the smallest with room; docs/mixed.md, "Token budget"): its decode lanes (one
            token each) first, then prefill chunks fill the rest. Activation buffers are
            sized by the largest of these and the prefill token capacities (one token's
            activations per packed token). One MIXED program is captured per
            (decode batch capacity B <= T, T): B rows in all, decode lanes and prefill
            chunks, packed as a PREFILL program packs them. Not captured with a drafter
            (a drafter core's decode rows are row-invariant with verification).
    """

    decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    prefill_tokens: tuple[int, ...] = (16, 64, 256)
    prefill_rows: int = 8
    context_tokens: int = 8192
    page_tokens: int = 16
    prepared_pages: int = 1024
    prepared_snapshots: int = 0
    host_tier: bool = False
    transfer_rows: int = 0
    scored_tokens: tuple[int, ...] = ()
    image_windows: int = 0
    image_feature_slots: int = 0
    mixed_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class SplitTuning:
    """Startup tuning of decode attention's split count (specification: startup tuning
    bindings).

    Ignition captures a tuning producer that times split counts of the decode attention on
    the serving device and writes the fastest to a tuned buffer every decode graph reads:
    their split and merge kernels are captured at the maximum count and read the tuned one.

    Attributes:
        context_tokens: context of the timing workload (0: the full context); the decode
            batch is the largest captured one.
        repeats: split + merge launches timed per candidate, after one untimed sweep.
        candidates: split counts tried, at most 4: the captured count NS, NS/2, NS/4, NS/8
            (distinct, at least 1).
    """

    context_tokens: int = 0
    repeats: int = 2
    candidates: int = 4


@dataclass(frozen=True)
class SamplingDefaults:
    """Model-card sampling recommendations (complete: every field is explicit)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_output_tokens: int = 512


@dataclass(frozen=True)
class ServingDefaults:
    """Core defaults for startup settings (explicit startup options win)."""

    max_active: int = 8
    queue_capacity: int = 64
    frontend_workers: int = 2
    event_capacity: int = 256


@dataclass(frozen=True)
class DrafterDecl:
    """The learned drafter of a speculative core (the specification, "Complete speculative
    generation"; format: helios_ignition/checkpoint/drafter.py).

    Attributes:
        checkpoint: the drafter's safetensors file, relative to the recipe file's folder
            (or absolute); "random:SEED:DRAFT_VOCAB" for a seeded random head (tests).
        widths: captured speculative widths W (target positions per lane, pending token
            included; D = W - 1 draft tokens each), ascending, starting at 1 (width-one
            programs serve lanes that cannot speculate). The largest is the core's
            default width.
        coupled: coupled (drafter-invariant) verification of sampled rows: every
            emitted token is the target's own seeded draw, so seeded text is the decode
            programs' text whatever the lane lengths (docs/speculative.md). False records
            standard speculative sampling, the ops of cores exported before it (kept so
            they load, and for measuring the two: bench/speculative_acceptance.py).
    """

    checkpoint: str
    widths: tuple[int, ...] = (1, 2, 3, 4)
    coupled: bool = True


@dataclass(frozen=True)
class Recipe:
    """Everything a recipe declares.

    Attributes:
        name: recipe name (also the default served id).
        family: model family whose forward pass is captured ("llama", "qwen3",
            "qwen3_moe").
        checkpoint: default checkpoint spec ("smollm2" = the embedded GGUF, a path, or
            "random:<geometry>" for seeded random weights).
        frontend: tool/reasoning parser selectors and their syntax data.
        eos_token_ids: ids that end generation; None reads them from the checkpoint.
        sampling: model-card sampling defaults.
        capacities: captured capacities.
        weight_dtype: "bf16", "f32" or "gguf" (a GGUF checkpoint's matrices kept as their
            blocks, for the cpu backend; the others f32).
        aliases: extra served names.
        chat_template: a Jinja chat template stored in the core instead of the
            checkpoint's (None keeps the checkpoint's).
        drafter: the learned drafter; None captures no SPECULATIVE programs.
        split_tuning: capture a startup producer that tunes decode attention's split
            count on the serving device (None: the captured count is used as is).
        fold_layers: decode graphs fold each RMS norm into the next product and each
            residual add into the previous one (7 launches per layer instead of 9; same
            arithmetic). Off by default until its GPU kernels are measured.
        chunked_sampling: sample with the chunked sampler (its candidate race:
            ``sample_chunks_mass`` + ``sample_merge`` + ``sample_race_top`` +
            ``sample_race_mass`` + ``sample_race_pick``: same outputs as
            ``sample_biased``, the vocabulary split over many programs per row; the
            default; capture/sampling.py). False: the one-launch bisection sampler
            ``sample_biased``.
        activation_dtype: the activations of the packed bf16 products (the 8B-class
            matrices' tensor-core path): "f32" (two bf16 terms, near-f32 products) or
            "bf16" (rounded to bf16, one term: half the tensor work; both backends
            execute the rounding, docs/gpu.md "bf16 activations"). Products off the
            packed path keep f32 activations, so for a checkpoint with none (SmolLM2 under
            the default rule) "bf16" changes nothing; ``--activation-dtype bf16`` on the
            command line refuses such an export instead.
    """

    name: str
    family: str
    checkpoint: str
    frontend: frontend_pb2.FrontendContract
    sampling: SamplingDefaults = SamplingDefaults()
    capacities: Capacities = Capacities()
    serving: ServingDefaults = ServingDefaults()
    weight_dtype: str = "bf16"
    eos_token_ids: tuple[int, ...] | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)
    chat_template: str | None = None
    drafter: DrafterDecl | None = None
    split_tuning: SplitTuning | None = None
    fold_layers: bool = False
    chunked_sampling: bool = True
    activation_dtype: str = "f32"


SUPPORTED_FAMILIES = ("gemma3", "llama", "qwen3", "qwen3_moe")  # families.registry.FAMILIES
SUPPORTED_WEIGHT_DTYPES = ("bf16", "f32", "gguf")
SUPPORTED_ACTIVATION_DTYPES = ("f32", "bf16")  # Recipe.activation_dtype


def load_recipe_module(path: str | Path) -> ModuleType:
    """Import a recipe file by path.

    Raises:
        RecipeError: the file does not exist or fails to import.
    """
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"helios_recipe_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise RecipeError(f"cannot import recipe {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a recipe is user code: report, don't crash
        raise RecipeError(f"recipe {path} failed to import: {exc}") from exc
    if not hasattr(module, "RECIPE") and not hasattr(module, "make_recipe"):
        raise RecipeError(f"recipe {path} defines neither RECIPE nor make_recipe(checkpoint)")
    return module


def validate_recipe(recipe: Recipe) -> None:
    """Check a recipe's declarations before any work is done.

    Raises:
        RecipeError: unsupported family or dtype, empty or unsorted capacities, mixed
            capacities with a drafter, or a parser selector left UNSPECIFIED.
    """
    if recipe.family not in SUPPORTED_FAMILIES:
        raise RecipeError(f"recipe {recipe.name}: unsupported family {recipe.family!r}; "
                          f"supported: {', '.join(SUPPORTED_FAMILIES)}")
    if recipe.weight_dtype not in SUPPORTED_WEIGHT_DTYPES:
        raise RecipeError(f"recipe {recipe.name}: unsupported weight dtype "
                          f"{recipe.weight_dtype!r}; supported: bf16, f32, gguf")
    if recipe.activation_dtype not in SUPPORTED_ACTIVATION_DTYPES:
        raise RecipeError(f"recipe {recipe.name}: unsupported activation dtype "
                          f"{recipe.activation_dtype!r}; supported: f32, bf16")
    caps = recipe.capacities
    for label, values in (("decode_batch", caps.decode_batch),
                          ("prefill_tokens", caps.prefill_tokens)):
        if not values or list(values) != sorted(set(values)) or values[0] < 1:
            raise RecipeError(f"recipe {recipe.name}: capacities.{label} must be ascending "
                              f"positive and non-empty, got {values}")
    scored = caps.scored_tokens
    if scored and (list(scored) != sorted(set(scored)) or scored[0] < 1
                   or scored[-1] > caps.prefill_tokens[-1]):
        raise RecipeError(f"recipe {recipe.name}: capacities.scored_tokens must be ascending "
                          f"positive and at most the largest prefill capacity "
                          f"({caps.prefill_tokens[-1]}), got {scored}")
    if caps.context_tokens % caps.page_tokens:
        raise RecipeError(f"recipe {recipe.name}: context_tokens {caps.context_tokens} is not "
                          f"a multiple of page_tokens {caps.page_tokens}")
    mixed = caps.mixed_tokens
    if mixed and (list(mixed) != sorted(set(mixed)) or mixed[0] < 2):
        raise RecipeError(f"recipe {recipe.name}: capacities.mixed_tokens must be ascending and "
                          f"at least 2 (a decode lane and a prefill token), got {mixed}")
    if mixed and recipe.drafter is not None:
        raise RecipeError(f"recipe {recipe.name}: capacities.mixed_tokens with a drafter: "
                          "mixed programs are not captured in a drafter core (its decode rows "
                          "stay row-invariant with verification)")
    if recipe.drafter is not None:
        widths = recipe.drafter.widths
        if not widths or list(widths) != sorted(set(widths)) or widths[0] != 1 or widths[-1] > 8:
            raise RecipeError(f"recipe {recipe.name}: drafter.widths must be ascending, start at "
                              f"1 and stay <= 8, got {widths}")
    tuning = recipe.split_tuning
    if tuning is not None and not (tuning.repeats >= 1 and 1 <= tuning.candidates <= 4
                                   and 0 <= tuning.context_tokens <= caps.context_tokens):
        raise RecipeError(f"recipe {recipe.name}: split_tuning needs repeats >= 1, 1..4 "
                          f"candidates and 0 <= context_tokens <= {caps.context_tokens}, got "
                          f"{tuning}")
    _check_frontend_selectors(recipe)


def _check_frontend_selectors(recipe: Recipe) -> None:
    for field_desc in recipe.frontend.DESCRIPTOR.fields:
        if field_desc.enum_type is None:
            continue
        value = getattr(recipe.frontend, field_desc.name)
        known = {v.number: v.name for v in field_desc.enum_type.values}
        if value == 0 or value not in known:
            names = ", ".join(n for num, n in sorted(known.items()) if num)
            raise RecipeError(f"recipe {recipe.name}: frontend.{field_desc.name} = {value} is not "
                              f"a supported parser; known: {names}")
