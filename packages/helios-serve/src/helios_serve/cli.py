"""`helios-serve`: serve a core over OpenAI-compatible HTTP.

    helios-serve CORE --trust PUB --accept NAMESPACE [options]
    helios-serve --demo

Startup is Bootstrap.load -> NativeModel.load -> Server.start. Any startup failure
prints one line (`helios-serve: error: ...`) without a traceback and exits 2.

`--demo` prepares the embedded default once: it generates a local key with
`helios-tools keygen` and exports the real SmolLM2 core with `ignition export` (both as
subprocesses: serve never imports ignition) into ${XDG_CACHE_HOME:-~/.cache}/helios/demo/,
then serves it. The core's file name carries a digest of what exports it (the recipe and
the helios-ignition, helios-tools and helios-contract sources), so a core exported by an
older Helios is prepared again instead of served without what the new code exports. A
cached core of this digest is served as found (nothing in the cache changes); cores of
other digests (another checkout or environment, an older version) are kept up to
DEMO_KEEP in all, so alternating between two installs reuses each one's core instead of
exporting and removing the other's every time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
from helios_tools.capabilities import BACKENDS

from helios_serve.bootstrap import Bootstrap, StartupError
from helios_serve.config import ServeOptions, parse_bytes, resolve
from helios_serve.startup import StartupLog

DEMO_NAMESPACE = "helios.demo/local"
DEMO_RECIPE = Path("recipes") / "smollm2_135m_instruct.py"


def demo_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "helios" / "demo"


def _tool(name: str) -> str:
    """A console script of this environment (beside the interpreter), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise StartupError(f"--demo needs the `{name}` command (install the Helios workspace)")
    return found


def _demo_recipe() -> Path:
    """recipes/smollm2_135m_instruct.py in the working directory or the repository root."""
    candidates = [Path.cwd() / DEMO_RECIPE, Path(__file__).resolve().parents[4] / DEMO_RECIPE]
    for path in candidates:
        if path.is_file():
            return path
    raise StartupError(
        f"--demo cannot find {DEMO_RECIPE} (looked in {', '.join(str(p.parent) for p in candidates)})"
    )


EXPORT_PACKAGES = ("helios_ignition", "helios_tools", "helios_contract")
DEMO_KEEP = 3  # demo cores kept after an export: the new one and the 2 newest others


def demo_fingerprint(recipe: Path, roots: list[Path] | None = None) -> str:
    """16 hex digits of sha256 over the recipe and every .py file under `roots` (default:
    the installed export packages, located without importing them)."""
    if roots is None:
        roots = []
        for name in EXPORT_PACKAGES:
            spec = importlib.util.find_spec(name)
            roots.extend(Path(p) for p in (spec.submodule_search_locations or []) if spec)
    digest = hashlib.sha256(recipe.read_bytes())
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def prepare_demo(echo=click.echo) -> tuple[Path, Path, str]:
    """Export the demo core once per version of the export code; returns (core, public
    key, namespace). A cached core of this version is returned untouched; after a new
    export the DEMO_KEEP - 1 most recently exported cores of other versions are kept
    (another install reuses its own) and older ones removed.

    Raises:
        StartupError: keygen or export failed (their last output line is included).
    """
    folder = demo_dir()
    recipe = _demo_recipe()
    core = folder / f"smollm2-135m-instruct-{demo_fingerprint(recipe)}.core"
    key = folder / "publisher.key"
    public = folder / "publisher.key.pub"
    if core.is_file() and public.is_file():
        return core, public, DEMO_NAMESPACE
    folder.mkdir(parents=True, exist_ok=True)
    if not (key.is_file() and public.is_file()):
        _run([_tool("helios-tools"), "keygen", "--out", str(key)], "key generation")
    others = sorted((p for p in folder.glob("smollm2-135m-instruct*.core") if p != core),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    why = ("for this version of the export code (the cached cores were exported by other "
           "versions)" if others else "once")
    echo(f"preparing the demo core {why}, into {folder} (about a minute) ...", err=True)
    partial = core.with_suffix(".core.partial")
    _run(
        [_tool("ignition"), "export", str(recipe), "--checkpoint", "smollm2",
         "--key", str(key), "--namespace", DEMO_NAMESPACE, "--out", str(partial)],
        "demo export",
    )  # fmt: skip
    partial.replace(core)
    for path in others[DEMO_KEEP - 1:]:
        path.unlink(missing_ok=True)
    return core, public, DEMO_NAMESPACE


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise StartupError(f"{what} failed: {lines[-1] if lines else f'exit {proc.returncode}'}")


def _curl_example(url: str, model: str) -> str:
    return (
        f"curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f'-d \'{{"model": "{model}", "messages": [{{"role": "user", '
        f'"content": "What is the capital of France?"}}]}}\''
    )


RESOURCE_KEY_ENV = "HELIOS_RESOURCE_KEY_FILE"


def read_resource_key(path: str | os.PathLike[str] | None) -> bytes | None:
    """The AES-256 resource key in `path` (32 raw bytes or 64 hex digits), or None.

    Raises:
        StartupError: the file cannot be read or holds no key.
    """
    if path is None:
        return None
    from helios_tools.core.protected import load_resource_key

    try:
        return load_resource_key(path)
    except OSError as exc:
        raise StartupError(f"cannot read resource key {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise StartupError(f"cannot read resource key: {exc}") from None


def start(core: str | os.PathLike[str], trust: list[str], accept: str, options: ServeOptions,
          resource_key: bytes | None = None, ranks=None):
    """Check the core path, bind the port, then Bootstrap.load -> NativeModel.load -> Server
    (bound, not yet serving). What can be checked without loading is checked first, so a
    missing core or a busy port is reported at once.

    With `options.engine_process` the model loads in the engine process
    (`engine_process.EngineClient.start`; it verifies the core again) and this process
    serves HTTP around it.

    `ranks` (runtime.rank_processes.ProcessRanks): this is rank 0 of process ranks.

    Raises:
        StartupError: one line naming what is wrong.
    """
    from helios_serve.clock import ObservationClock
    from helios_serve.server import Server, bind_listener

    cache = _cache_sizing(options)
    log = _startup_log()
    path = _core_path(core)
    try:
        listener = bind_listener(options.host, options.port)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None
    try:
        bootstrap = Bootstrap.load(path, trust, accept, resource_key=resource_key, log=log)
    except BaseException:
        listener.close()
        raise
    try:
        try:
            settings = resolve(options, bootstrap.contract)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        check_options(bootstrap.prepared, options)  # before the engine or the weights load
        clock = ObservationClock()  # the observation origin: native runtime startup
        if options.engine_process:
            from helios_serve.engine_process import EngineClient, EngineSpec

            engine = EngineClient.start(EngineSpec(str(path), list(trust), accept, options,
                                                   resource_key, clock.origin_ns))
            try:
                with log.phase("listen") as phase:
                    server = Server(bootstrap, None, settings, clock, listener, engine=engine)
                    phase.detail = f"{server.url} (engine process {engine.pid})"
                return server
            except BaseException:
                engine.stop()
                raise
        model = load_model(bootstrap, path, options, settings, cache, log, ranks)
        try:
            with log.phase("listen") as phase:
                server = Server(bootstrap, model, settings, clock, listener)
                phase.detail = server.url
            return server
        except BaseException:
            model.close()
            raise
    except BaseException:
        listener.close()
        bootstrap.close()
        raise


def _cache_sizing(options: ServeOptions):
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.runtime.errors import RuntimeLoadError

    try:
        return CacheSizing(num_pages=options.num_pages, memory_bytes=options.kv_cache_memory,
                           fraction=options.kv_cache_fraction)
    except RuntimeLoadError as exc:
        raise StartupError(str(exc)) from None


def _startup_log(prefix: str = "") -> StartupLog:
    return StartupLog(emit=lambda line: click.echo(f"helios-serve: {prefix}{line}", err=True))


def _core_path(core: str | os.PathLike[str]) -> Path:
    path = Path(core)
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "no such file"
        raise StartupError(f"bad core: {path}: {why}")
    return path


def load_model(bootstrap: Bootstrap, path: Path, options: ServeOptions, settings, cache,
               log: StartupLog, ranks=None):
    """NativeModel.load for `bootstrap`'s core with the operator's options (checked
    against the core first by `check_options`).

    Raises:
        StartupError: one line naming what is wrong.
    """
    from helios_tools.core.errors import CoreError

    from helios_serve.runtime.errors import RuntimeLoadError
    from helios_serve.runtime.native_model import NativeModel

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
        log.record("speculation", 0.0, _speculation_line(model.manifests.speculative_widths,
                                                          options))
    return model


def _speculation_line(served_widths, options: ServeOptions) -> str:
    """The startup log's account of the speculation served: "widths up to 4, adaptive width
    policy, history drafting", or "off (--speculative-width 0)"."""
    widest = max(served_widths, default=1)
    if widest < 2:  # lanes of one position: plain decode
        return f"off (--speculative-width {options.speculative_width})"
    history = ", history drafting" if options.history_drafting else ""
    return f"widths up to {widest}, {options.speculative_policy} width policy{history}"


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
    from helios_contract.errors import ContractError

    from helios_serve.runtime.errors import SpeculativeWidthError
    from helios_serve.runtime.native_model import served_speculative_widths

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


class _OneLineUsage(click.Command):
    """Usage errors (an unknown --backend, a non-integer --port) print one line and exit 2,
    like every other startup failure, instead of click's usage block."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            click.echo(f"helios-serve: error: {exc.format_message()}", err=True)
            sys.exit(2)


@click.command(cls=_OneLineUsage, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("core", required=False, type=click.Path())
@click.option(
    "--trust",
    "trust",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Trusted publisher public key (PEM); repeatable.",
)
@click.option("--accept", "accept", help="Accepted publisher namespace (must match exactly).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port (0: any free port).")
@click.option("--backend", type=click.Choice(tuple(BACKENDS)), default="cpu", show_default=True,
              help="Execution backend: cpu (NumPy reference kernels) or cuda.")
@click.option("--max-active", type=int, help="Requests running at once [core default].")
@click.option("--queue-capacity", type=int, help="Requests queued for the model [core default].")
@click.option("--frontend-workers", type=int, help="CPU preparation slots [core default].")
@click.option("--event-capacity", type=int, help="Minimum per-response event budget.")
@click.option("--served-name", help="Model name in responses [the core's served id].")
@click.option("--speculative-width", type=click.IntRange(min=0),
              help="Widest speculative lane W served (target positions per round, pending "
                   "token included); 0 turns speculation off [the core's widest].")
@click.option("--history-drafting", is_flag=True,
              help="Copy proposals from each request's own prompt and output (n-gram "
                   "lookup) beside the learned drafter's; needs learned speculation.")
@click.option("--speculative-policy", type=click.Choice(["adaptive", "fixed"]),
              default="adaptive", show_default=True,
              help="adaptive: each step's speculative program (decode, a width, or a "
                   "prefix-limit program) chosen from measured step costs and acceptance; "
                   "fixed: always the widest lane (sampled text then depends on the "
                   "request alone).")
@click.option("--num-pages", type=int,
              help="Physical KV cache pages [cpu: the core's prepared count; cuda: see "
                   "--kv-cache-fraction].")
@click.option("--kv-cache-memory", "kv_cache_memory",
              help="KV cache budget in bytes (e.g. 2GiB); as many pages as fit.")
@click.option("--kv-cache-fraction", "kv_cache_fraction", type=float,
              help="KV cache budget as a fraction of the memory left after loading: free "
                   "device memory on cuda [0.9], available host memory on cpu.")
@click.option("--snapshots", type=click.IntRange(min=0),
              help="Exact-endpoint snapshot capacity (continuation rows); 0 turns snapshots "
                   "off [the core's prepared count].")
@click.option("--host-cache-bytes", "host_cache_bytes", default="0", show_default=True,
              help="Host-memory cache tier for evicted pages and snapshots, in bytes (e.g. "
                   "4GiB; pinned memory on cuda); 0: none.")
@click.option("--stream-interval", "stream_interval", type=click.IntRange(min=1), default=1,
              show_default=True,
              help="Deliver a choice's streamed output every N tokens (its first token and "
                   "its end at once): fewer, larger SSE chunks for less host work per token "
                   "at high concurrency (vLLM's --stream-interval).")
@click.option("--engine-process", "engine_process", is_flag=True,
              help="Run the model worker (scheduler, model, packing, host-feedback output) in "
                   "an engine process and HTTP, preparation and the other output pipelines "
                   "in this one (vLLM V1's split): their host work stops sharing one GIL.")
@click.option("--resource-key", "resource_key", envvar=RESOURCE_KEY_ENV,
              help="AES-256 key file (32 raw bytes) of a ProtectedIndex version 4 core "
                   f"[env {RESOURCE_KEY_ENV}].")
@click.option("--api-key", envvar="HELIOS_API_KEY", default=None,
              help="Require `Authorization: Bearer KEY` on /v1/* and the tokenize routes "
                   "[env HELIOS_API_KEY; none: open].")
@click.option("--demo", is_flag=True, help="Prepare (once) and serve the embedded SmolLM2 model.")
@click.option("--world", type=int,
              help="Tensor-parallel ranks as processes (RankPeers::Processes; the core's "
                   "rank count). Without it a tensor-parallel core runs its ranks as threads.")
@click.option("--rank", type=int, default=0, show_default=True,
              help="With --world: this process's rank (0 serves HTTP; others only execute).")
@click.option("--peers", help="With --world: every rank's control address HOST:PORT, comma-"
                              "separated in rank order (rank R > 0 listens on entry R).")
@click.option("--rank-key", "rank_key", type=click.Path(dir_okay=False),
              help="With --world: the key authenticating the ranks to each other (a file "
                   "of 32 random bytes, the same on every rank).")
@click.option("--rank-timeout", "rank_timeout", type=click.FloatRange(min=0, min_open=True),
              default=120.0, show_default=True,
              help="With --world: seconds bootstrap waits for the other ranks.")
def main(core, trust, accept, host, port, backend, max_active, queue_capacity, frontend_workers,
         event_capacity, served_name, speculative_width, history_drafting, speculative_policy,
         num_pages, kv_cache_memory, kv_cache_fraction, snapshots, host_cache_bytes,
         stream_interval, engine_process, resource_key, api_key, demo, world, rank, peers,
         rank_key, rank_timeout) -> None:  # fmt: skip
    """Serve CORE (a signed Helios core) over OpenAI-compatible HTTP.

    Startup phases and their durations go to stderr as they end; the serving URL to stdout.
    """
    try:
        try:
            memory = None if kv_cache_memory is None else parse_bytes(kv_cache_memory)
        except ValueError as exc:
            raise StartupError(f"--kv-cache-memory: {exc}") from None
        try:
            host_bytes = parse_bytes(host_cache_bytes, zero=True)
        except ValueError as exc:
            raise StartupError(f"--host-cache-bytes: {exc}") from None
        if served_name is not None and not served_name.strip():
            raise StartupError("--served-name must not be empty (omit it to serve the core's "
                               "served id)")
        options = ServeOptions(
            host=host, port=port, backend=backend, max_active=max_active,
            queue_capacity=queue_capacity, frontend_workers=frontend_workers,
            event_capacity=event_capacity, served_name=served_name,
            speculative_width=speculative_width, num_pages=num_pages,
            kv_cache_memory=memory, kv_cache_fraction=kv_cache_fraction, api_key=api_key,
            history_drafting=history_drafting, speculative_policy=speculative_policy,
            snapshots=snapshots, host_cache_bytes=host_bytes, stream_interval=stream_interval,
            engine_process=engine_process,
        )  # fmt: skip
        if demo:
            if core or trust or accept:
                raise StartupError("--demo takes no CORE, --trust or --accept")
            core_path, public, accept = prepare_demo()
            trust = (str(public),)
        else:
            if not core:
                raise StartupError("missing CORE (or use --demo)")
            if not trust:
                raise StartupError("missing --trust PUB (the publisher's public key)")
            if accept is None:
                raise StartupError("missing --accept NAMESPACE (the publisher namespace)")
            core_path = core
        if engine_process and world is not None:
            raise StartupError("--engine-process does not serve process ranks (--world) yet")
        ranks = _process_ranks(world, rank, peers, rank_key, backend, rank_timeout)
        if ranks is not None and ranks.rank > 0:
            serve_rank_process(core_path, list(trust), accept, options, ranks,
                               read_resource_key(resource_key))
            return
        server = start(core_path, list(trust), accept, options, read_resource_key(resource_key),
                       ranks)
    except StartupError as exc:
        click.echo(f"helios-serve: error: {exc}", err=True)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = server.settings.served_name
    click.echo(f"Helios is serving {name} at {server.url} (backend {backend})")
    click.echo(f"Try: {_curl_example(server.url, name)}")
    sys.stdout.flush()
    server.run()


def _process_ranks(world, rank, peers, rank_key, backend, timeout_s=120.0):
    """The process-rank options checked together (None without --world); re-executes
    this process under the MPI wheel's `mpiexec -n 1` when no MPI launcher started it.

    Raises:
        StartupError: one line naming the option at fault.
    """
    if world is None:
        if rank or peers or rank_key:
            raise StartupError("--rank, --peers and --rank-key need --world N")
        return None
    from helios_serve.runtime.errors import RuntimeLoadError
    from helios_serve.runtime.rank_processes import ProcessRanks, reexec_under_mpiexec

    try:
        if backend != "cpu":
            raise StartupError(f"--world: process ranks run on the cpu backend; the {backend} "
                               "backend executes one rank")
        setup = ProcessRanks.parse(rank, world, peers or "", rank_key, timeout_s)
        reexec_under_mpiexec(sys.argv[1:])
    except RuntimeLoadError as exc:
        raise StartupError(str(exc)) from None
    return setup


def serve_rank_process(core, trust: list[str], accept: str, options: ServeOptions, ranks,
                       resource_key: bytes | None = None) -> None:
    """Rank R > 0 of process ranks: verify the core as rank 0 does, load this rank's part,
    join rank 0 and execute its steps until it closes them (exit 0) or disappears (exit 3).

    Raises:
        StartupError: one line naming what is wrong.
    """
    from helios_serve.runtime.cache_sizing import CacheSizing
    from helios_serve.runtime.errors import RuntimeLoadError
    from helios_serve.runtime.rank_processes import serve_rank

    log = StartupLog(emit=lambda line: click.echo(f"helios-serve: {line}", err=True))
    path = Path(core)
    if not path.is_file():
        raise StartupError(f"bad core: {path}: no such file")
    bootstrap = Bootstrap.load(path, trust, accept, resource_key=resource_key, log=log)
    host, port = ranks.peers[ranks.rank]

    def ready() -> None:
        click.echo(f"Helios rank {ranks.rank} of {ranks.world} joined rank 0 "
                   f"(control {host}:{port})")
        sys.stdout.flush()

    try:
        cache = CacheSizing(num_pages=options.num_pages, memory_bytes=options.kv_cache_memory,
                            fraction=options.kv_cache_fraction)
        serve_rank(bootstrap.core.manifest, bootstrap.core.read_resource, ranks, cache,
                   log=log, ready=ready)
    except RuntimeLoadError as exc:
        raise StartupError(" ".join(str(exc).split())) from None
    finally:
        bootstrap.close()


if __name__ == "__main__":  # `python -m helios_serve.cli` (process ranks under mpiexec)
    main()
