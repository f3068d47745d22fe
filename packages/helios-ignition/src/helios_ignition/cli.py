"""`ignition`: prepare models into signed cores."""

from __future__ import annotations

import click

from .checkpoint import CheckpointError
from .export import ExportError, export_core
from .recipe import RecipeError, SplitTuning


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ignition: Helios preparation (recipes, checkpoints, program capture, export)."""


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--checkpoint", help="smollm2 (the embedded GGUF), a .gguf file or a "
              "safetensors directory.")
@click.option("--random-weights", "random_seed", type=int, default=None,
              help="Seeded random bf16 weights of --geometry's real shapes.")
@click.option("--geometry", help="smollm2-135m or llama-3.1-8b (with --random-weights).")
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False),
              help="Ed25519 private key (helios-tools keygen).")
@click.option("--namespace", required=True, help="Publisher namespace signed into the core.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Core to write.")
@click.option("--weight-dtype", type=click.Choice(["bf16", "f32", "gguf"]), default=None,
              help="Override the recipe's weight dtype (gguf: keep a GGUF checkpoint's "
                   "quantized blocks as they are; the cpu backend executes them).")
@click.option("--target", "targets", multiple=True,
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
def export(recipe, checkpoint, random_seed, geometry, key_path, namespace, out, weight_dtype,
           targets, carrier, protected_version, resource_key, tune_splits,
           fold_layers, chunked_sampling, tensor_parallel) -> None:
    """Export RECIPE with a checkpoint to a signed core.

    Progress (kernels compiled, weights read, bytes written) goes to stderr: live bars on a
    terminal, a plain line per quarter otherwise.
    """
    from helios_tools.progress import StepProgress

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
                                  progress=progress.update)
    except (ExportError, RecipeError, CheckpointError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {summary.path} ({summary.format}): served id {summary.served_id}, "
               f"{len(summary.graphs)} graphs ({', '.join(summary.graphs)}), "
               f"{summary.resources} resources, {summary.decoded_bytes / 2**20:.1f} MiB decoded, "
               f"{summary.core_bytes / 2**20:.1f} MiB stored, {summary.seconds:.1f} s")
