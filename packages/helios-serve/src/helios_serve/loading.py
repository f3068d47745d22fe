"""Loading a served model from a core: the startup steps `helios-serve` (cli) and the
engine process (engine_process) share.

    core_path -> Bootstrap.load -> resolve_settings -> check_options -> load_model

Every failure is one `StartupError` line (the CLI prints it and exits 2; the engine
process sends it to the frontend, which does the same). The startup log's lines go to
stderr as `helios-serve: [prefix]phase seconds detail`.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from helios_contract.errors import ContractError
from helios_tools.core.errors import CoreError

from helios_serve.bootstrap import Bootstrap, StartupError
from helios_serve.config import ServeOptions, ServeSettings, resolve
from helios_serve.runtime.cache_sizing import CacheSizing
from helios_serve.runtime.errors import RuntimeLoadError, SpeculativeWidthError
from helios_serve.runtime.native_model import NativeModel, served_speculative_widths
from helios_serve.startup import StartupLog


def cache_sizing(options: ServeOptions) -> CacheSizing:
    """The operator's KV cache sizing options, checked before anything loads.

    Raises:
        StartupError: the options contradict each other or are out of range.
    """
    try:
        return CacheSizing(num_pages=options.num_pages, memory_bytes=options.kv_cache_memory,
                           fraction=options.kv_cache_fraction)
    except RuntimeLoadError as exc:
        raise StartupError(str(exc)) from None


def startup_log(prefix: str = "") -> StartupLog:
    """A startup log whose lines go to stderr as `helios-serve: {prefix}{line}`."""
    return StartupLog(emit=lambda line: click.echo(f"helios-serve: {prefix}{line}", err=True))


def core_path(core: str | os.PathLike[str]) -> Path:
    """The core's path, once it names a file.

    Raises:
        StartupError: no such file, or a directory.
    """
    path = Path(core)
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "no such file"
        raise StartupError(f"bad core: {path}: {why}")
    return path


def resolve_settings(options: ServeOptions, bootstrap: Bootstrap) -> ServeSettings:
    """The operator's options over the core's serving defaults (`config.resolve`).

    Raises:
        StartupError: a resolved setting is not positive.
    """
    try:
        return resolve(options, bootstrap.contract)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def load_model(bootstrap: Bootstrap, path: Path, options: ServeOptions,
               settings: ServeSettings, cache: CacheSizing, log: StartupLog,
               ranks=None) -> NativeModel:  # fmt: skip
    """NativeModel.load for `bootstrap`'s core with the operator's options (checked
    against the core first by `check_options`).

    Raises:
        StartupError: one line naming what is wrong.
    """
    try:
        model = NativeModel.load(
            bootstrap.prepared, bootstrap.core.read_resource, options.backend, cache=cache,
            max_concurrency=settings.max_active,
            speculative_width=options.speculative_width, log=log, ranks=ranks,
            snapshots=options.snapshots, host_cache_bytes=options.host_cache_bytes,
        )
    except RuntimeLoadError as exc:
        raise StartupError(" ".join(str(exc).split()), exc.rule) from None
    except CoreError as exc:  # a weight or kernel resource failing its digests
        raise StartupError(f"bad core: {path}: {' '.join(str(exc).split())}",
                           "resource.integrity") from None
    if model.prepared.speculative_widths:  # what the operator's options made of them
        log.record("speculation", 0.0, _speculation_line(model.manifests, options))
    return model


def _speculation_line(geometry, options: ServeOptions) -> str:
    """The startup log's account of the speculation served: "widths up to 4, adaptive width
    policy, history drafting" ("widths up to 4 (lanes up to 2), ..." where the core's lane
    limits are shorter), or "off (--speculative-width 0)"."""
    widest = max(geometry.speculative_widths, default=1)
    longest = max(geometry.lane_widths, default=1)
    if widest < 2:  # lanes of one position: plain decode
        return f"off (--speculative-width {options.speculative_width})"
    lanes = f" (lanes up to {longest})" if longest < widest else ""
    history = (f", history drafting ({options.history_proposer})" if options.history_drafting
               else "")
    return f"widths up to {widest}{lanes}, {options.speculative_policy} width policy{history}"


def check_options(prepared, options: ServeOptions) -> None:
    """The startup options the core must back, checked before anything loads (the one
    place helios-serve checks an option against what the core captures):

    - --speculative-width: a captured width or narrower (runtime.native_model.
      served_speculative_widths, the rule NativeModel.load applies too);
    - --history-drafting: learned speculation served (a width above one) and the
      copied-token inputs in every selected wider graph (the contract's rule:
      PreparedContract.history_drafting_findings).

    Raises:
        StartupError: one line naming the option and what the core lacks.
    """
    try:
        widths = served_speculative_widths(prepared, options.speculative_width)
    except SpeculativeWidthError as exc:
        raise StartupError(str(exc), exc.rule) from None
    if not options.history_drafting:
        return
    if not widths:
        why = ("the core has no speculative programs" if not prepared.speculative_widths
               else f"--speculative-width {options.speculative_width} serves no lane wider "
                    "than one")
        raise StartupError(f"--history-drafting needs learned speculation: {why}",
                           rule="speculative.history_inputs")
    try:
        prepared.check_history_drafting(widths)
    except ContractError as exc:
        raise StartupError(f"--history-drafting: {exc}", rule=getattr(exc, "rule", "")) from None
