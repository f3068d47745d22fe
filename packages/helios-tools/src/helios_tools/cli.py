"""The ``helios-tools`` command line: keygen, inspect, verify, lint-core.

Exit codes: 0 ok; 1 findings (bad signature, untrusted key, namespace mismatch, a resource
failing its digests or frame, lint findings); 2 unreadable (missing file, not a
well-formed core, unusable key file, bad usage).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from helios_contract.prepared import default_max_active, request_slots
from helios_contract.schema import contract_pb2 as pb
from helios_contract.schema import core_pb2
from helios_contract.schema import manifest_pb2 as mpb

from helios_tools.capabilities import BACKENDS
from helios_tools.core import (
    Core,
    CoreError,
    CoreFormatError,
    LengthMismatch,
    SignatureError,
    UntrustedKey,
    authorize,
    generate_key,
    load_public_key,
    open_core,
    open_core_unverified,
    write_key_pair,
)
from helios_tools.core.protected import load_resource_key, write_resource_key
from helios_tools.lint import INTEGRITY_RULES, Finding, backend_note, integrity_first, lint_core
from helios_tools.progress import StepProgress

EXIT_OK, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2
# lint-core's text output: an integrity finding's line starts with it (lint.INTEGRITY_RULES).
INTEGRITY_MARK = "INTEGRITY FAILURE "
UNSIGNED_NOTE = ("signature not checked (no --trust): the core's structure was linted, not "
                 "who signed it")
_PROGRESS_MIN_NBYTES = 64 << 20  # show a progress bar from this stored size


class _Unreadable(click.ClickException):
    exit_code = EXIT_UNREADABLE


def _read_resource_key(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return load_resource_key(path)
    except OSError as e:
        raise _Unreadable(f"cannot read resource key {path}: {_why(e)}") from None
    except ValueError as e:
        raise _Unreadable(f"cannot read resource key: {e}") from None


def _trusted(paths: tuple[Path, ...]) -> list:
    try:
        return [load_public_key(p) for p in paths]
    except (OSError, ValueError) as e:
        raise _Unreadable(f"cannot load trusted key: {e}") from None


def _why(e: Exception) -> str:
    """An error's text without the path the caller already names (OSError repeats it)."""
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


_UNREADABLE = (OSError, CoreFormatError)


@contextmanager
def _opened(path: Path, keys: list | None, resource_key: bytes | None,
            unreadable: tuple[type[Exception], ...] = _UNREADABLE) -> Iterator[Core]:
    """Open a core; `unreadable` errors exit 2 with one line, other CoreErrors propagate."""
    try:
        core = open_core(path, keys, resource_key=resource_key) if keys is not None else \
            open_core_unverified(path, resource_key=resource_key)
    except unreadable as e:
        raise _Unreadable(f"{path}: {_why(e)}") from None
    try:
        yield core
    finally:
        core.close()


def _summary(core: Core) -> dict[str, Any]:
    c = core.contract
    kind = ("payload core" if core.protected_version is None
            else f"logical-resource core (ProtectedIndex version {core.protected_version})")
    return {
        "path": str(core.path),
        "file_nbytes": core.file_nbytes,
        "format_version": core.format_version,
        "format": kind,
        "namespace": core.namespace,
        "key_id": core.key_id,
        "signature_verified": core.verified,
        "contract_version": c.model.version,
        "served_id": c.served_id,
        "aliases": list(c.aliases),
        "context_tokens": c.context_tokens,
        "selected_concurrency": c.selected_concurrency,
        **_concurrency(core),
        "speculative_widths": list(c.speculative_widths),
        "kv_cache": _kv_cache(core),
        "graphs": [{"name": g.name,
                    "operation": pb.Operation.Name(g.operation),
                    "batch_capacity": g.batch_capacity,
                    "token_capacity": g.token_capacity} for g in c.model.graphs],
        "resources": [{"id": r.resource_id,
                       "kind": core_pb2.ResourceKind.Name(r.kind),
                       "stored_nbytes": r.stored_nbytes,
                       "decoded_nbytes": r.decoded_nbytes,
                       "ratio": round(r.decoded_nbytes / r.stored_nbytes, 3)
                       if r.stored_nbytes else None} for r in core.resources.values()],
    }


def _kv_cache(core: Core) -> list[dict[str, Any]]:
    """Each history region's planes and how their elements are stored: ``element`` is
    the plane's storage type when it declares one (``fp8_e4m3``: an e4m3 cache with
    per-head scales), else its dtype (``f32``, ``bf16``); ``element_bytes`` what one
    element costs in the cache (0 where the manifest names no such buffer: lint-core
    reports it)."""
    buffers = {b.name: b for b in core.manifest.buffers}
    regions = []
    for region in core.contract.model.cache.regions:
        planes = []
        for name in region.planes:
            b = buffers.get(name)
            if b is None:
                element, nbytes = "missing", 0
            elif b.HasField("storage"):
                element = mpb.StorageType.Name(b.storage.type).removeprefix("STORAGE_TYPE_")
                nbytes = 1 if b.storage.type == mpb.STORAGE_TYPE_FP8_E4M3 else 0
            else:
                element = mpb.DType.Name(b.dtype).removeprefix("D_TYPE_")
                nbytes = _DTYPE_BYTES.get(b.dtype, 0)
            planes.append({"plane": name, "element": element.lower(), "element_bytes": nbytes})
        regions.append({"region": region.name,
                        "kind": pb.HistoryKind.Name(region.kind).removeprefix("HISTORY_KIND_"),
                        "planes": planes})
    return regions


_DTYPE_BYTES = {mpb.D_TYPE_F32: 4, mpb.D_TYPE_BF16: 2, mpb.D_TYPE_F16: 2}


def _kv_cache_line(regions: list[dict[str, Any]]) -> str:
    """One line: each region's kind and its planes' element types (distinct, in order)."""
    parts = []
    for r in regions:
        kinds = list(dict.fromkeys(p["element"] for p in r["planes"]))
        parts.append(f"{r['region']} ({r['kind'].lower()}, {len(r['planes'])} planes: "
                     f"{'/'.join(kinds) or '-'})")
    return "; ".join(parts) or "-"


def _concurrency(core: Core) -> dict[str, Any]:
    """What helios-serve runs at once, by the rules it applies (helios_contract.prepared):
    `served_concurrency`, without --max-active: `default_max_active` (the core's serving
    default max_active, `serving_default_max_active`, else its selected concurrency) at
    most `request_slots` (the most --max-active serves; None when a page-table view
    names no manifest buffer)."""
    default = default_max_active(core.contract)
    try:
        slots: int | None = request_slots(core.contract, core.manifest)
    except KeyError:  # a view naming no manifest buffer: lint-core reports it
        slots = None
    return {"serving_default_max_active": core.contract.defaults.max_active,
            "default_max_active": default, "request_slots": slots,
            "served_concurrency": default if slots is None else min(default, slots)}


def _concurrency_line(s: dict[str, Any]) -> str:
    """"serves 8 requests at once by default (serving default max_active 8); --max-active
    up to 32 request slots; captured concurrency 32"."""
    source = (f"serving default max_active {s['serving_default_max_active']}"
              if s["serving_default_max_active"] else
              f"no serving default max_active: the selected concurrency {s['default_max_active']}")
    text = f"serves {s['served_concurrency']} requests at once by default ({source})"
    if s["request_slots"] is not None:
        text += f"; --max-active up to {s['request_slots']} request slots"
    return f"{text}; captured concurrency {s['selected_concurrency']}"


def _print_summary(s: dict[str, Any]) -> None:
    echo = click.echo
    echo(f"core         {s['path']} ({s['file_nbytes']} bytes)")
    echo(f"format       {s['format']}, format_version {s['format_version']}")
    echo(f"namespace    {s['namespace']}")
    echo(f"key id       {s['key_id']} (signature not verified; use verify)")
    echo(f"contract     version {s['contract_version']}")
    echo(f"served id    {s['served_id']}  aliases: {', '.join(s['aliases']) or '-'}")
    echo(f"context      {s['context_tokens']} tokens; speculative widths "
         f"{s['speculative_widths'] or '-'}")
    echo(f"concurrency  {_concurrency_line(s)}")
    echo(f"kv cache     {_kv_cache_line(s['kv_cache'])}")
    echo(f"graphs       {len(s['graphs'])}")
    for g in s["graphs"]:
        echo(f"  {g['name']:<32} {g['operation'].removeprefix('OPERATION_'):<15} "
             f"batch {g['batch_capacity']:>5}  tokens {g['token_capacity']:>6}")
    echo(f"resources    {len(s['resources'])}")
    echo(f"  {'id':<40} {'kind':<14} {'stored':>12} {'decoded':>12} {'ratio':>6}")
    for r in s["resources"]:
        echo(f"  {r['id']:<40} {r['kind'].removeprefix('RESOURCE_KIND_'):<14} "
             f"{r['stored_nbytes']:>12} {r['decoded_nbytes']:>12} {r['ratio']:>6}")


class _OneLineUsage(click.Group):
    """Every failure as one ``helios-tools: error: ...`` line (the form ignition and
    helios-serve print) with its exit status (the module docstring); usage errors too,
    instead of click's ``Usage:`` / ``Try`` block."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):  # fmt: skip
        try:
            super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:  # click.UsageError included
            click.echo(f"helios-tools: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(0)


@click.group(cls=_OneLineUsage, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Helios core tools: make signing keys, inspect, verify and lint cores.

    Exit codes: 0 ok, 1 findings, 2 unreadable.
    """


@main.command()
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Private key path (PEM, mode 0600); the public key goes to OUT.pub. "
                   "With --aes: the resource key file.")
@click.option("--aes", is_flag=True,
              help="Write an AES-256 resource key (32 random bytes, mode 0600) for "
                   "ProtectedIndex version 4 cores instead of a signing key.")
def keygen(out: Path, aes: bool) -> None:
    """Write a new Ed25519 signing key (OUT) and its public key (OUT.pub), or with --aes
    an AES-256 resource key (the same as `head -c 32 /dev/urandom > OUT`)."""
    try:
        if aes:
            write_resource_key(out)
        else:
            priv, pub = write_key_pair(generate_key(), out)
    except FileExistsError as e:
        raise _Unreadable(f"refusing to overwrite {e.filename or e}") from None
    except OSError as e:  # a missing or read-only folder: "[Errno 2] ..." said nothing more
        raise _Unreadable(f"cannot write {e.filename or out}: {_why(e)}") from None
    if aes:
        click.echo(f"wrote {out} (AES-256 resource key, 32 bytes, 0600)")
    else:
        click.echo(f"wrote {priv} (private, 0600) and {pub} (public)")


RESOURCE_KEY_ENV = "HELIOS_RESOURCE_KEY_FILE"
_resource_key_option = click.option(
    "--resource-key", type=click.Path(dir_okay=False, path_type=Path), envvar=RESOURCE_KEY_ENV,
    help=f"AES-256 key file (32 raw bytes or 64 hex digits) for ProtectedIndex version 4 "
         f"cores [env {RESOURCE_KEY_ENV}].")


@main.command()
@click.argument("core", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def inspect(core: Path, as_json: bool) -> None:
    """Summarize CORE: namespace, contract, graphs and resources (does not verify)."""
    # A location disagreeing with its signed length leaves nothing to summarize.
    with _opened(core, None, None, _UNREADABLE + (LengthMismatch,)) as c:
        s = _summary(c)
    if as_json:
        click.echo(json.dumps(s, indent=2))
    else:
        _print_summary(s)


@contextmanager
def _verifying(c: Core) -> Iterator[Callable[[int], None] | None]:
    """A callback taking each checked resource's stored bytes: a progress display on
    stderr for large cores (rich bars on a terminal, plain lines otherwise), else None."""
    total = sum(r.stored_nbytes for r in c.resources.values())
    if total < _PROGRESS_MIN_NBYTES:
        yield None
        return
    done = 0
    with StepProgress() as progress:
        def checked(nbytes: int) -> None:
            nonlocal done
            done += nbytes
            progress.update("verifying", done, total, "bytes")

        yield checked


def _check_resources(c: Core, findings: list[str]) -> None:
    with _verifying(c) as checked:
        for rid, res in c.resources.items():
            try:
                c.verify_resource(rid)
            except CoreError as e:
                findings.append(f"{type(e).__name__}: {e}")
            if checked is not None:
                checked(res.stored_nbytes)


@main.command()
@click.argument("core", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--trust", "trust", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Trusted Ed25519 public key (PEM); repeat for several.")
@click.option("--accept", "accept", required=True,
              help="Acceptance string: must equal the signed publisher namespace exactly.")
@_resource_key_option
def verify(core: Path, trust: tuple[Path, ...], accept: str, resource_key: Path | None) -> None:
    """Verify CORE's signature, authorization and every chunk of every resource."""
    keys = _trusted(trust)
    rkey = _read_resource_key(resource_key)
    findings: list[str] = []
    try:
        with _opened(core, keys, rkey) as c:
            try:
                authorize(c, accept)
            except CoreError as e:
                findings.append(f"{type(e).__name__}: {e}")
            _check_resources(c, findings)
            nres = len(c.resources)
    except CoreError as e:  # signature or key: the body cannot be trusted
        click.echo(f"FAIL {core}: {type(e).__name__}: {e}", err=True)
        sys.exit(EXIT_FINDINGS)
    for f in findings:
        click.echo(f"FAIL {core}: {f}", err=True)
    if findings:
        sys.exit(EXIT_FINDINGS)
    click.echo(f"OK {core}: signature, namespace and {nres} resources verified")


@main.command("lint-core")
@click.argument("core", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--trust", "trust", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Trusted Ed25519 public key (PEM); repeat for several. Without it the "
                   "signature is not checked.")
@click.option("--accept", "accept", default=None,
              help="Acceptance string to authorize (needs --trust).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.option("--require-target", "require_targets", multiple=True,
              help="GPU target (e.g. sm_90) the core must carry kernel binaries for; "
                   "repeatable. Without it a CPU-only core passes.")
@click.option("--backend", "backends", multiple=True, type=click.Choice(tuple(BACKENDS)),
              help="helios-serve backend the core must fit (what it executes: operations, "
                   "bindings, histories, tuning, ...); repeatable [default: all].")
@_resource_key_option
def lint_core_command(core: Path, trust: tuple[Path, ...], accept: str | None, fmt: str,
                      require_targets: tuple[str, ...], backends: tuple[str, ...],
                      resource_key: Path | None) -> None:
    """Everything verify does, every contract and manifest rule, and every field the
    serving backends cannot execute: a core that passes cannot fail helios-serve startup
    for a structural reason."""
    try:
        _lint(core, trust, accept, fmt, require_targets, backends or tuple(BACKENDS),
              resource_key)
    except _Unreadable as e:
        if fmt != "json":
            raise
        # A machine reading --format json gets JSON on stdout whatever happened.
        click.echo(json.dumps({"core": str(core), "error": e.message, "findings": []},
                              indent=2))
        sys.exit(e.exit_code)


def _open_for_lint(path: Path, keys: list | None, rkey: bytes | None,
                   findings: list[Finding]) -> Core | None:
    """Open a core for lint, appending what opening found.

    A signature or key failure is a finding and the body's structure is then linted
    unverified. A location whose length disagrees with the signed stored length is a
    finding (as `verify` reports it) and leaves nothing to lint: None.

    Raises:
        _Unreadable: a missing file or a core that is not well formed (exit 2).
    """
    try:
        if keys is None:
            return open_core_unverified(path, resource_key=rkey)
        return open_core(path, keys, resource_key=rkey)
    except (OSError, CoreFormatError) as e:
        raise _Unreadable(f"{path}: {_why(e)}") from None
    except (SignatureError, UntrustedKey) as e:
        findings.append(Finding(f"core.{type(e).__name__}", "envelope.signature", "", str(e)))
        return _open_for_lint(path, None, rkey, findings)
    except LengthMismatch as e:
        findings.append(Finding("core.LengthMismatch", "locations", e.resource_id or "",
                                str(e)))
        return None


def _lint(core: Path, trust: tuple[Path, ...], accept: str | None, fmt: str,
          require_targets: tuple[str, ...], backends: tuple[str, ...],
          resource_key: Path | None) -> None:
    keys = _trusted(trust) if trust else None
    if accept is not None and keys is None:
        raise click.UsageError("--accept needs --trust")
    rkey = _read_resource_key(resource_key)
    findings: list[Finding] = []
    notes: list[str] = []
    if keys is None:
        notes.append(UNSIGNED_NOTE)
    opened = _open_for_lint(core, keys, rkey, findings)
    if opened is not None:
        with opened as c, _verifying(c) as checked:
            findings += lint_core(c, acceptance=accept if c.verified else None,
                                  progress=checked, require_targets=require_targets,
                                  backends=backends)
            note = backend_note(c.contract, c.manifest, backends)
            if note is not None:
                notes.append(note)
    findings = integrity_first(findings)
    broken = sum(f.rule in INTEGRITY_RULES for f in findings)
    if fmt == "json":
        click.echo(json.dumps({"core": str(core), "signature_checked": keys is not None,
                               "integrity_findings": broken, "notes": notes,
                               "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        for f in findings:
            click.echo(f"{INTEGRITY_MARK}{f}" if f.rule in INTEGRITY_RULES else str(f))
        for line in notes:
            click.echo(f"note: {line}")
        summary = f"{core}: {len(findings)} finding(s)"
        if broken:
            summary += (f", {INTEGRITY_MARK}in {broken} (listed first): the core is not what "
                        "its publisher signed for this namespace; do not serve it")
        click.echo(summary)
    sys.exit(EXIT_FINDINGS if findings else EXIT_OK)
