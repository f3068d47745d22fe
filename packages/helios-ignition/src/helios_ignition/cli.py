"""`ignition`: prepare models into signed cores.

Every failure is one line on stderr, `ignition: error: ...`, and an exit status:

    1  the export failed (recipe, checkpoint, key, kernels, writing the core)
    2  usage: an unknown option, a bad value (e.g. `--target sm_xx`), a missing or
       conflicting option (no `--checkpoint` nor `--random-weights`, `--geometry` without
       `--random-weights`, carrier options that do not go together), or `--out` exists
       without `--force`
    3  an internal error (a bug): the line names the exception; IGNITION_TRACEBACK=1
       prints the traceback too
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import click
from helios_tools.progress import StepProgress

from .checkpoint import CheckpointError
from .export import ExportError, ExportUsageError, export_core
from .kernels_aot import KernelCompileError, parse_target
from .recipe import RecipeError, SplitTuning

EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130
_EXPORT_ERRORS = (ExportError, RecipeError, CheckpointError, KernelCompileError, OSError)


def _fail(message: str, status: int) -> None:
    first, *rest = message.splitlines() or [""]  # one line: a compiler's report can be pages
    click.echo(f"ignition: error: {first}" + (" (...)" if rest else ""), err=True)
    sys.exit(status)


class _OneLineErrors(click.Group):
    """Runs a command so that every failure is one line and a documented exit status
    (the module docstring), never click's usage block or a traceback."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):  # fmt: skip
        try:
            super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            _fail(exc.format_message(), EXIT_USAGE)
        except click.ClickException as exc:
            _fail(exc.format_message(), EXIT_FAILED)
        except (click.Abort, KeyboardInterrupt):
            _fail("interrupted", EXIT_INTERRUPTED)
        except _EXPORT_ERRORS as exc:
            _fail(str(exc), EXIT_FAILED)
        except Exception as exc:  # a bug: still one line (the traceback on request)
            if os.environ.get("IGNITION_TRACEBACK") == "1":
                traceback.print_exc()
            _fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL)
        sys.exit(0)


def _targets(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    for target in values:
        try:
            parse_target(target)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return values


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ignition: Helios preparation (recipes, checkpoints, program capture, export).

    A failure is one line, `ignition: error: ...`, with exit status 1 (the export
    failed), 2 (usage, or --out exists without --force), 3 (internal error) or 130
    (interrupted).
    """


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--checkpoint", help="smollm2 (the embedded GGUF), a .gguf file or a "
              "safetensors directory.")
@click.option("--random-weights", "random_seed", type=int, default=None,
              help="Seeded random bf16 weights of --geometry's real shapes.")
@click.option("--geometry", help="smollm2-135m, llama-3.1-8b, qwen3-8b or qwen3-30b-a3b "
              "(with --random-weights).")
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False),
              help="Ed25519 private key (helios-tools keygen).")
@click.option("--namespace", required=True, help="Publisher namespace signed into the core.")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Core to write (refused if it exists, unless --force).")
@click.option("--force", is_flag=True, help="Overwrite an existing --out.")
@click.option("--weight-dtype", type=click.Choice(["bf16", "f32", "gguf"]), default=None,
              help="Override the recipe's weight dtype (gguf: keep a GGUF checkpoint's "
                   "quantized blocks: as they are for the cpu backend's ggml without "
                   "--target; with --target, repacked exactly into INT4/INT8 codes both "
                   "backends execute, docs/gguf-cuda.md).")
@click.option("--quantize", type=click.Choice(["fp8", "int4"]), default=None,
              help="fp8: store the products' weight matrices as FP8 e4m3 codes with one "
                   "scale per output channel (a checkpoint's own FP8 codes kept), served "
                   "W8A8 with activations quantized per token; embedding and LM head keep "
                   "the weight dtype. int4: W4A16, packed 4-bit codes in groups of 128 "
                   "along K with f32 scales and zero points (AWQ's asymmetric scheme; an "
                   "AWQ/GPTQ checkpoint's own codes repacked as stored).")
@click.option("--kv-cache-dtype", "kv_cache_dtype",
              type=click.Choice(["auto", "fp8", "fp8_e4m3", "bf16"]), default="auto",
              show_default=True,
              help="auto: the recipe's f32 KV cache. fp8 (= fp8_e4m3, vLLM's names): store "
                   "the KV cache as e4m3 codes with one f32 scale per layer and kv head; "
                   "attention reads them directly. bf16: bfloat16 planes, half the bytes "
                   "of f32, each write rounded to nearest even (docs/kv-cache.md).")
@click.option("--activation-dtype", "activation_dtype", type=click.Choice(["f32", "bf16"]),
              default=None,
              help="The activations of the packed bf16 products (8B-class matrices on the "
                   "tensor cores): f32 (two bf16 terms, near-f32 products) or bf16 (rounded "
                   "to bf16 by both backends, one term: half the tensor work; "
                   "docs/gpu.md) [default: the recipe's Recipe.activation_dtype, f32].")
@click.option("--target", "targets", multiple=True, callback=_targets,
              help="GPU target to compile kernels for (repeatable), e.g. sm_90.")
@click.option("--carrier", type=click.Choice(["payload", "logical"]), default="payload",
              show_default=True,
              help="payload: a payload core; logical: a logical-resource core.")
@click.option("--protected-version", type=click.Choice(["6", "4"]), default=None,
              help="With --carrier logical: 6 (zstd frames) [default] or 4 (AES-GCM chunks "
                   "under --resource-key).")
@click.option("--resource-key", "resource_key", type=click.Path(dir_okay=False),
              help="With --protected-version 4: AES-256 key file, 32 raw bytes "
                   "(`helios-tools keygen --aes --out FILE` or `head -c 32 /dev/urandom`).")
@click.option("--tune-decode-splits", "tune_splits", is_flag=True,
              help="Capture a startup tuning producer that times decode attention's split "
                   "counts on the serving device and makes decode use the fastest (the "
                   "recipe may declare it already: Recipe.split_tuning).")
@click.option("--fold-layers", is_flag=True,
              help="Decode graphs fold each RMS norm into the next matrix product and each "
                   "residual add into the previous one: 7 kernels per layer instead of 9, "
                   "same arithmetic (the recipe may declare it already: "
                   "Recipe.fold_layers).")
@click.option("--chunked-sampling/--bisection-sampling", default=None,
              help="The sampler: chunked (each row's vocabulary split over many programs, "
                   "top-k rows with top_k <= 64 resolved without bisection sweeps; the "
                   "default) or the one-launch bisection sampler. Same tokens either way "
                   "[default: the recipe's Recipe.chunked_sampling].")
@click.option("--tensor-parallel", "tensor_parallel", type=click.IntRange(min=1), default=1,
              show_default=True,
              help="Split the model between N tensor-parallel ranks (per-rank weights and "
                   "collectives in one core; the query heads, key/value heads and FFN width "
                   "must divide by N). docs/tensor-parallel.md.")
def export(recipe, checkpoint, random_seed, geometry, key_path, namespace, out, force,
           weight_dtype, quantize, kv_cache_dtype, activation_dtype, targets, carrier, protected_version, resource_key, tune_splits,
           fold_layers, chunked_sampling, tensor_parallel) -> None:
    """Export RECIPE with a checkpoint to a signed core.

    Progress (kernels compiled, weights read, bytes written) goes to stderr: live bars on a
    terminal, a plain line per quarter otherwise.
    """

    if Path(out).exists() and not force:
        raise click.UsageError(f"--out {out} exists; pass --force to overwrite it")
    try:
        with StepProgress() as progress:
            summary = export_core(recipe, checkpoint=checkpoint, key_path=key_path,
                                  namespace=namespace, out=out, weight_dtype=weight_dtype,
                                  random_seed=random_seed, geometry=geometry,
                                  targets=tuple(targets), carrier=carrier,
                                  protected_version=None if protected_version is None
                                  else int(protected_version),
                                  resource_key_path=resource_key,
                                  split_tuning=SplitTuning() if tune_splits else None,
                                  fold_layers=True if fold_layers else None,
                                  chunked_sampling=chunked_sampling,
                                  tensor_parallel=tensor_parallel,
                                  quantize=quantize, kv_cache_dtype=kv_cache_dtype,
                                  activation_dtype=activation_dtype,
                                  progress=progress.update)
    except ExportUsageError as exc:  # options that do not go together: nothing was read
        raise click.UsageError(str(exc)) from None
    except _EXPORT_ERRORS as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {summary.path} ({summary.format}): served id {summary.served_id}, "
               f"{len(summary.graphs)} graphs ({', '.join(summary.graphs)}), "
               f"{summary.resources} resources, {summary.decoded_bytes / 2**20:.1f} MiB decoded, "
               f"{summary.core_bytes / 2**20:.1f} MiB stored, {summary.seconds:.1f} s")
    if summary.kv_cache:
        click.echo(summary.kv_cache)
