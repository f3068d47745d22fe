"""`helios-serve`: serve a core over OpenAI-compatible HTTP.

    helios-serve CORE --trust PUB --accept NAMESPACE [options]
    helios-serve --demo
    helios-serve --recipe RECIPE --checkpoint PATH [options]

Startup is Bootstrap.load -> NativeModel.load -> Server.start. Any startup failure
prints one line (`helios-serve: error: ...`) without a traceback and exits 2; a SIGINT
(Ctrl-C) before serving starts prints `helios-serve: error: interrupted` and exits 130,
as `ignition export` does (a running export child is killed with it).

`--demo` prepares the embedded default once: it generates a local key with
`helios-tools keygen` and exports the real SmolLM2 core with `ignition export` (both as
subprocesses: serve never imports ignition) into ${XDG_CACHE_HOME:-~/.cache}/helios/demo/,
then serves it: the recipe's GGUF blocks kept as they are (DEMO_EXPORT_OPTIONS, `--weight-dtype
gguf`), run as ggml whole-program graphs. The core's file name carries a digest of what
exports it (the recipe, the export options and the helios-ignition, helios-tools and
helios-contract sources), so a core exported by an
older Helios is prepared again instead of served without what the new code exports. A
cached core of this digest is served as found (nothing in the cache changes); cores of
other digests (another checkout or environment, an older version) are kept up to
DEMO_KEEP in all, so alternating between two installs reuses each one's core instead of
exporting and removing the other's every time.

`--recipe RECIPE --checkpoint PATH` does the same for any recipe and checkpoint (a .gguf
file or a safetensors directory), into ${XDG_CACHE_HOME:-~/.cache}/helios/checkpoints/
under its own local key and the namespace CHECKPOINT_NAMESPACE: the core's name carries a
digest of the recipe, the export code, the checkpoint's name and every byte of its files
(`checkpoint_fingerprint`), so one command goes from a checkpoint to a server and exports
again only when one of them changes. Concurrent starts share one export (a lock file; the
core is written under a temporary name and renamed into place). A missing recipe or
checkpoint, a missing `ignition` command or a failed export is one line and exit 2. The
signed-core flow (`ignition export`, `helios-tools lint-core`, `helios-serve CORE --trust
--accept`) stays the production path: a publisher's key, not a local one.

With --api-key (or $HELIOS_API_KEY) the startup `Try:` example sends `Authorization:
Bearer $HELIOS_API_KEY`, never the key itself (stdout may be a log); a key given on the
command line adds a line saying to set HELIOS_API_KEY first.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
from click.core import ParameterSource
from helios_tools.capabilities import BACKENDS
from helios_tools.core.protected import load_resource_key

from helios_serve.bootstrap import Bootstrap, StartupError
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, check_positive, parse_bytes
from helios_serve.engine_client import EngineClient
from helios_serve.liveness import DEFAULT_STALL_TIMEOUT_S
from helios_serve.loading import (
    cache_sizing,
    check_options,
    core_path,
    load_model,
    resolve_settings,
    startup_log,
)
from helios_serve.responses.store import ResponseStore
from helios_serve.runtime.errors import RuntimeLoadError
from helios_serve.runtime.rank_processes import ProcessRanks, reexec_under_mpiexec, serve_rank
from helios_serve.wire import EngineSpec

DEMO_NAMESPACE = "helios.demo/local"
DEMO_RECIPE = Path("recipes") / "smollm2_135m_instruct.py"
# The demo serves the GGUF's quantized blocks as they are (docs/cpu-kernels.md): ggml
# whole-program graphs over 93 MB of Q4_1/Q8_0 blocks, llama.cpp's numbers and speed.
DEMO_EXPORT_OPTIONS = ("--weight-dtype", "gguf")
# The startup `Try:` question and the README's: one on which the demo's Q4_1 model and
# the float model answer alike with a clear margin at every step ("The capital of
# Germany is Berlin."; France is a near tie on this GGUF, docs/cpu-kernels.md).
EXAMPLE_QUESTION = "What is the capital of Germany?"


def demo_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "helios" / "demo"


def _tool(name: str, what: str = "--demo") -> str:
    """A console script of this environment (beside the interpreter), else on PATH.

    Raises:
        StartupError: neither has it (`what` names the option that needs it).
    """
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        package = "helios-ignition" if name == "ignition" else name
        raise StartupError(f"{what} needs the `{name}` command (install {package}, part of "
                           "the Helios workspace)")
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


def demo_fingerprint(recipe: Path, roots: list[Path] | None = None,
                     options: tuple[str, ...] = ()) -> str:
    """16 hex digits of sha256 over the recipe, the export `options` (e.g. the weight
    dtype) and every .py file under `roots` (default: the installed export packages,
    located without importing them)."""
    if roots is None:
        roots = []
        for name in EXPORT_PACKAGES:
            spec = importlib.util.find_spec(name)
            roots.extend(Path(p) for p in (spec.submodule_search_locations or []) if spec)
    digest = hashlib.sha256(recipe.read_bytes())
    digest.update(b"\0".join(o.encode() for o in options) + b"\1")
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def prepare_demo(echo=click.echo) -> tuple[Path, Path, str]:
    """Export the demo core (the recipe with DEMO_EXPORT_OPTIONS: the GGUF's blocks kept)
    once per version of the recipe, options and export code; returns (core, public
    key, namespace). A cached core of this version is returned untouched; after a new
    export the DEMO_KEEP - 1 most recently exported cores of other versions are kept
    (another install reuses its own) and older ones removed.

    Raises:
        StartupError: keygen or export failed (their last output line is included).
    """
    folder = demo_dir()
    recipe = _demo_recipe()
    digest = demo_fingerprint(recipe, options=DEMO_EXPORT_OPTIONS)
    core = folder / f"smollm2-135m-instruct-{digest}.core"
    public = cached_export(
        folder, core, [str(recipe), "--checkpoint", "smollm2", *DEMO_EXPORT_OPTIONS],
        DEMO_NAMESPACE, "demo",
        option="--demo",
        changed="for this version of the export code (the cached cores were exported by "
                "other versions)", echo=echo, duration=" (about a minute)")
    return core, public, DEMO_NAMESPACE


def cached_export(folder: Path, core: Path, export_args: list[str], namespace: str,
                  what: str, *, option: str, changed: str, echo=click.echo,
                  duration: str = "") -> Path:
    """Make `core` (a file in `folder` whose name carries the digest of everything that
    exports it) with `ignition export EXPORT_ARGS`, signed by the folder's local key
    (made once with `helios-tools keygen`), unless it is there already; returns the
    public key. Concurrent starts wait on one lock file (`folder/.lock`) and export to
    a private temporary name renamed into place, so none sees a partial core and the
    second start serves the first one's. After a new export, other cores of the same
    stem (the name up to its last `-`, the digest) beyond the DEMO_KEEP - 1 most
    recently exported are removed. Progress goes to stderr: "preparing the WHAT core
    once" (`changed` instead of "once" when cores of the stem are there). `option` (the
    command-line option asking for the export) names what needs a missing command.

    Raises:
        StartupError: keygen or export failed (their last output line is included), or
            the cache folder cannot be written.
    """
    key, public = folder / "publisher.key", folder / "publisher.key.pub"
    if core.is_file() and public.is_file():
        return public  # served as found: nothing in the cache changes
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "a")  # noqa: SIM115 (held until the export ends)
    except OSError as exc:
        raise StartupError(f"cannot write the core cache {folder}: {exc.strerror or exc}") \
            from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if core.is_file() and public.is_file():  # another start exported it meanwhile
            return public
        if not (key.is_file() and public.is_file()):
            _run([_tool("helios-tools", option), "keygen", "--out", str(key)], "key generation")
        stem = core.name.rsplit("-", 1)[0]
        others = sorted((p for p in folder.glob(f"{stem}-*.core") if p != core),
                        key=lambda p: p.stat().st_mtime, reverse=True)
        why = changed if others else "once"
        echo(f"preparing the {what} core {why}, into {folder}{duration} ...", err=True)
        partial = folder / f".{core.name}.{os.getpid()}.partial"
        try:
            _run([_tool("ignition", option), "export", *export_args, "--key", str(key),
                  "--namespace", namespace, "--out", str(partial),
                  "--force"],  # a partial file a killed start left behind (under the lock)
                 f"{what} export")
            partial.replace(core)
        finally:
            partial.unlink(missing_ok=True)
        for path in others[DEMO_KEEP - 1:]:
            path.unlink(missing_ok=True)
    return public


CHECKPOINT_NAMESPACE = "helios.local/checkpoint"
_HASH_BLOCK = 1 << 20


def checkpoints_dir() -> Path:
    """${XDG_CACHE_HOME:-~/.cache}/helios/checkpoints: cores of `--recipe --checkpoint`."""
    return demo_dir().parent / "checkpoints"


def checkpoint_fingerprint(recipe: Path, checkpoint: Path, options: list[str],
                           roots: list[Path] | None = None) -> str:
    """16 hex digits of sha256 over everything a `--recipe --checkpoint` core comes from:
    the recipe and the export code (`demo_fingerprint`), the export options, and every
    byte of the checkpoint (a file, or each file under a directory with its relative
    path). The whole checkpoint is read: about a second per GB, once per start, and no
    shortcut (size and mtime) can miss an edit that keeps both.

    Raises:
        OSError: a checkpoint file cannot be read.
    """
    digest = hashlib.sha256(demo_fingerprint(recipe, roots).encode())
    digest.update(b"\0".join(o.encode() for o in options) + b"\1")
    files = [checkpoint] if checkpoint.is_file() else \
        sorted(p for p in checkpoint.rglob("*") if p.is_file())
    for path in files:
        digest.update(str(path.relative_to(checkpoint)).encode() + b"\0")
        with open(path, "rb") as f:
            while block := f.read(_HASH_BLOCK):
                digest.update(block)
    return digest.hexdigest()[:16]


def checkpoint_sources(recipe: str, checkpoint: str) -> tuple[Path, Path]:
    """(recipe, checkpoint) as paths, once each exists: the recipe a file, the checkpoint a
    file or directory.

    Raises:
        StartupError: one line naming the option and what is wrong with its path.
    """
    recipe_path, source = Path(recipe), Path(checkpoint)
    if not recipe_path.is_file():
        why = "is a directory" if recipe_path.is_dir() else "no such file"
        raise StartupError(f"--recipe {recipe}: {why}")
    if not source.exists():
        hint = " (the embedded SmolLM2: use --demo)" if checkpoint == "smollm2" else ""
        raise StartupError(f"--checkpoint {checkpoint}: no such file or directory{hint}")
    return recipe_path, source


def prepare_checkpoint(recipe: str, checkpoint: str, echo=click.echo) -> tuple[Path, Path, str]:
    """Export RECIPE with CHECKPOINT (a .gguf file or a safetensors directory) once per
    content (`checkpoint_fingerprint`) into checkpoints_dir(), signed by a local key under
    CHECKPOINT_NAMESPACE; returns (core, public key, namespace).

    Raises:
        StartupError: the recipe or checkpoint is missing or unreadable, ignition is not
            installed, or the export failed (its last output line is included).
    """
    recipe_path, source = checkpoint_sources(recipe, checkpoint)
    _tool("ignition", "--recipe")  # a missing ignition fails before the checkpoint is read
    # The checkpoint's own name counts: a recipe may derive the served id from it.
    options = ["--checkpoint-name", source.resolve().name]
    try:
        digest = checkpoint_fingerprint(recipe_path, source, options)
    except OSError as exc:
        raise StartupError(f"--checkpoint {checkpoint}: cannot read "
                           f"{exc.filename or source}: {exc.strerror or exc}") from None
    name = f"{_slug(recipe_path.stem)}-{_slug(source.name)}"
    folder = checkpoints_dir()
    core = folder / f"{name}-{digest}.core"
    public = cached_export(
        folder, core, [str(recipe_path.resolve()), "--checkpoint", str(source.resolve())],
        CHECKPOINT_NAMESPACE, name, option="--recipe", echo=echo,
        changed="again (the recipe, the checkpoint or the export code changed since the "
                "cached core)")
    return core, public, CHECKPOINT_NAMESPACE


def _slug(text: str) -> str:
    """A core name's part: lower-case letters, digits, `.` and `_` (anything else becomes
    `_`), so the last `-` of a cached core's name is the one before its digest."""
    return "".join(c if c.isalnum() or c in "._" else "_" for c in text.lower()) or "_"


def _run(argv: list[str], what: str) -> None:
    """Run a Helios command (`argv[0]`: ignition or helios-tools) to completion.

    Raises:
        StartupError: ``WHAT failed: `` and the command's last output line, less its own
            ``<tool>: error: `` prefix (ours comes first), or its exit status if it printed
            nothing.
    """
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        last = lines[-1].removeprefix(f"{Path(argv[0]).name}: error: ") if lines else \
            f"exit {proc.returncode}"
        raise StartupError(f"{what} failed: {last}")


API_KEY_ENV = "HELIOS_API_KEY"
EXIT_INTERRUPTED = 130  # a SIGINT before serving starts (128 + SIGINT, ignition's too)


def _curl_example(url: str, model: str, api_key: bool = False) -> str:
    """The startup `Try:` command. With an API key it sends `Authorization: Bearer
    $HELIOS_API_KEY`: the shell fills in the key, so the secret itself never reaches the
    terminal or a log that keeps stdout."""
    auth = f'-H "Authorization: Bearer ${API_KEY_ENV}" ' if api_key else ""
    return (
        f"curl {url}/v1/chat/completions {auth}-H 'Content-Type: application/json' "
        f'-d \'{{"model": "{model}", "messages": [{{"role": "user", '
        f'"content": "{EXAMPLE_QUESTION}"}}], "temperature": 0, '
        f'"max_tokens": 64}}\''  # greedy and short: a small model's first answer, at once
    )


RESOURCE_KEY_ENV = "HELIOS_RESOURCE_KEY_FILE"


def read_resource_key(path: str | os.PathLike[str] | None) -> bytes | None:
    """The AES-256 resource key in `path` (32 raw bytes or 64 hex digits), or None.

    Raises:
        StartupError: the file cannot be read or holds no key.
    """
    if path is None:
        return None
    try:
        return load_resource_key(path)
    except OSError as exc:
        raise StartupError(f"cannot read resource key {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise StartupError(f"cannot read resource key: {exc}") from None


def _check_port(options: ServeOptions) -> None:
    """A busy port is reported before a --demo or --recipe export (minutes for a large
    checkpoint), not after it. `start` binds it again for serving.

    Raises:
        StartupError: the port cannot be bound.
    """
    # start-up time: the HTTP server module imports uvicorn and Litestar
    from helios_serve.server import bind_listener

    try:
        bind_listener(options.host, options.port).close()
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None


def start(core: str | os.PathLike[str], trust: list[str], accept: str, options: ServeOptions,
          resource_key: bytes | None = None, ranks=None):
    """Check the core path, bind the port, then Bootstrap.load -> NativeModel.load -> Server
    (bound, not yet serving). What can be checked without loading is checked first, so a
    missing core or a busy port is reported at once.

    With `options.engine_process` the model loads in the engine process
    (`engine_client.EngineClient.spawn`; it verifies the core again) and this process
    serves HTTP around it.

    `ranks` (runtime.rank_processes.ProcessRanks): this is rank 0 of process ranks.

    Raises:
        StartupError: one line naming what is wrong.
    """
    # start-up time: a usage error or --help answers without importing HTTP (uvicorn,
    # Litestar: most of the import time).
    from helios_serve.server import Server, bind_listener

    cache = cache_sizing(options)
    log = startup_log()
    path = core_path(core)
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
        settings = resolve_settings(options, bootstrap)
        check_options(bootstrap.prepared, options)  # before the engine or the weights load
        clock = ObservationClock()  # the observation origin: native runtime startup
        if options.engine_process:
            engine = EngineClient.spawn(EngineSpec(str(path), list(trust), accept, options,
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
@click.option("--history-proposer", type=click.Choice(["copy", "suffix"]), default="copy",
              show_default=True,
              help="With --history-drafting: copy (the latest occurrence of the longest "
                   "matching n-gram, followed while in step) or suffix (suffix drafting: "
                   "the most frequent continuation of the best-scoring match, its length "
                   "adapted to the match).")
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
@click.option("--engine-stall-timeout", "engine_stall_timeout",
              type=click.FloatRange(min=0, min_open=True), default=DEFAULT_STALL_TIMEOUT_S,
              show_default=True,
              help="Seconds the model engine may have work and make no progress before "
                   "/health answers 503 and admission refuses (a stopped engine process, a "
                   "hung device call); healthy again once it moves.")
@click.option("--responses-db", "responses_db", type=click.Path(dir_okay=False),
              help="Keep stored /v1/responses in this SQLite file (created if missing; "
                   "bounded, oldest evicted first) [a bounded in-memory store].")
@click.option("--resource-key", "resource_key", envvar=RESOURCE_KEY_ENV,
              help="AES-256 key file (32 raw bytes) of a ProtectedIndex version 4 core "
                   f"[env {RESOURCE_KEY_ENV}].")
@click.option("--allow-image-urls", "allow_image_urls", is_flag=True,
              help="Fetch http(s) image URLs of image parts (10 s timeout, 16 MiB); without "
                   "it only data: URLs are accepted.")
@click.option("--max-images-per-request", "max_images_per_request", type=int, default=8,
              show_default=True, help="Images one request may carry.")
@click.option("--max-image-pixels", "max_image_pixels", type=int, default=4096 * 4096,
              show_default=True, help="Width x height of one decoded image.")
@click.option("--api-key", envvar=API_KEY_ENV, default=None,
              help="Require `Authorization: Bearer KEY` on /v1/* and the tokenize routes "
                   "[env HELIOS_API_KEY; none: open].")
@click.option("--demo", is_flag=True, help="Prepare (once) and serve the embedded SmolLM2 model.")
@click.option("--recipe", "recipe", type=click.Path(),
              help="With --checkpoint: export RECIPE with the checkpoint once (cached by "
                   "content, signed by a local key) and serve it.")
@click.option("--checkpoint", "checkpoint", type=click.Path(),
              help="With --recipe: a .gguf file or a safetensors directory.")
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
         event_capacity, served_name, speculative_width, history_drafting, history_proposer,
         speculative_policy,
         num_pages, kv_cache_memory, kv_cache_fraction, snapshots, host_cache_bytes,
         stream_interval, engine_process, engine_stall_timeout, responses_db, resource_key,
         allow_image_urls, max_images_per_request, max_image_pixels, api_key, demo, recipe, checkpoint, world, rank, peers, rank_key,
         rank_timeout) -> None:  # fmt: skip
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
            history_drafting=history_drafting, history_proposer=history_proposer,
            speculative_policy=speculative_policy,
            snapshots=snapshots, host_cache_bytes=host_bytes, stream_interval=stream_interval,
            engine_process=engine_process, responses_db=responses_db,
            engine_stall_timeout=engine_stall_timeout, allow_image_urls=allow_image_urls,
            max_images_per_request=max_images_per_request, max_image_pixels=max_image_pixels,
        )  # fmt: skip
        # What needs no core is checked before the port and any export (a first --demo
        # exports for about a minute).
        try:
            check_positive(options)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        cache_sizing(options)
        if engine_process and world is not None:
            raise StartupError("--engine-process does not serve process ranks (--world) yet")
        ranks = _process_ranks(world, rank, peers, rank_key, backend, rank_timeout)
        key = read_resource_key(resource_key)
        if responses_db is not None:  # a missing folder or a foreign file, before any load
            ResponseStore(responses_db).close()
        if demo:
            if core or trust or accept or recipe or checkpoint:
                raise StartupError("--demo takes no CORE, --trust, --accept, --recipe or "
                                   "--checkpoint")
            _check_port(options)
            core_path, public, accept = prepare_demo()
            trust = (str(public),)
        elif recipe or checkpoint:
            if core or trust or accept:
                raise StartupError("--recipe and --checkpoint take no CORE, --trust or "
                                   "--accept (the core they export is signed by a local key)")
            if not checkpoint:
                raise StartupError("--recipe needs --checkpoint PATH (a .gguf file or a "
                                   "safetensors directory)")
            if not recipe:
                raise StartupError("--checkpoint needs --recipe RECIPE")
            # A wrong path is the user's first mistake to hear of, before a busy port.
            checkpoint_sources(recipe, checkpoint)
            _check_port(options)
            core_path, public, accept = prepare_checkpoint(recipe, checkpoint)
            trust = (str(public),)
        else:
            if not core:
                raise StartupError("missing CORE (or use --demo, or --recipe with "
                                   "--checkpoint)")
            if not trust:
                raise StartupError("missing --trust PUB (the publisher's public key)")
            if accept is None:
                raise StartupError("missing --accept NAMESPACE (the publisher namespace)")
            core_path = core
        if ranks is not None:
            _under_mpi_launcher()
        if ranks is not None and ranks.rank > 0:
            serve_rank_process(core_path, list(trust), accept, options, ranks, key)
            return
        server = start(core_path, list(trust), accept, options, key, ranks)
    except StartupError as exc:
        click.echo(f"helios-serve: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C during an export or a load: click said "Aborted!", 1
        click.echo("helios-serve: error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = server.settings.served_name
    click.echo(f"Helios is serving {name} at {server.url} (backend {backend})")
    click.echo(f"Try: {_curl_example(server.url, name, api_key=bool(api_key))}")
    if api_key and click.get_current_context().get_parameter_source("api_key") \
            is not ParameterSource.ENVIRONMENT:
        click.echo(f"(the example reads the key from ${API_KEY_ENV}: set it to the --api-key "
                   "value first)")
    sys.stdout.flush()
    server.run()


def _process_ranks(world, rank, peers, rank_key, backend, timeout_s=120.0):
    """The process-rank options checked together (None without --world), before any
    export or load.

    Raises:
        StartupError: one line naming the option at fault.
    """
    if world is None:
        if rank or peers or rank_key:
            raise StartupError("--rank, --peers and --rank-key need --world N")
        return None
    try:
        if backend != "cpu":
            raise StartupError(f"--world: process ranks run on the cpu backend; the {backend} "
                               "backend executes one rank")
        return ProcessRanks.parse(rank, world, peers or "", rank_key, timeout_s)
    except RuntimeLoadError as exc:
        raise StartupError(str(exc)) from None


def _under_mpi_launcher() -> None:
    """Re-execute this process under the MPI wheel's `mpiexec -n 1` when no MPI launcher
    started it (process ranks; the re-executed process checks its options again).

    Raises:
        StartupError: no MPI launcher is installed.
    """
    try:
        reexec_under_mpiexec(sys.argv[1:])
    except RuntimeLoadError as exc:
        raise StartupError(str(exc)) from None


def serve_rank_process(core, trust: list[str], accept: str, options: ServeOptions, ranks,
                       resource_key: bytes | None = None) -> None:
    """Rank R > 0 of process ranks: verify the core as rank 0 does, load this rank's part,
    join rank 0 and execute its steps until it closes them (exit 0) or disappears (exit 3).

    Raises:
        StartupError: one line naming what is wrong.
    """
    log = startup_log()
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
        cache = cache_sizing(options)
        serve_rank(bootstrap.core.manifest, bootstrap.core.read_resource, ranks, cache,
                   log=log, ready=ready)
    except RuntimeLoadError as exc:
        raise StartupError(" ".join(str(exc).split())) from None
    finally:
        bootstrap.close()


if __name__ == "__main__":  # `python -m helios_serve.cli` (process ranks under mpiexec)
    main()
