"""Shared fixtures: real cores (SmolLM2, Gemma 3) exported once per test session.

`ignition export` runs through its library entry point (the CLI is covered by its own
tests); each core is signed with a key generated for the session. Use these fixtures
instead of exporting again: an export takes about 10 s on the CI machine.

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
test_launch_choices.py 30 -> 34 s). OPENBLAS_NUM_THREADS=2 in the environment runs
the suite the other way. The tests and the servers they start compute with the same
setting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads: see above

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2_135m_instruct.py"
NAMESPACE = "helios.test/models"


@dataclass(frozen=True)
class ExportedCore:
    """A core on disk with what it takes to open it."""

    path: Path
    public_key: Path
    private_key: Path
    namespace: str


@pytest.fixture(scope="session")
def signing_key_pair(tmp_path_factory) -> tuple[Path, Path]:
    from helios_tools.core import generate_key, write_key_pair

    folder = tmp_path_factory.mktemp("keys")
    private, public = write_key_pair(generate_key(), folder / "publisher.key")
    return private, public


def _export(tmp_path_factory, keys, weight_dtype: str) -> ExportedCore:
    from helios_ignition.export import export_core

    private, public = keys
    out = tmp_path_factory.mktemp(f"core-{weight_dtype}") / f"smollm2-{weight_dtype}.core"
    export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE, out=out,
                weight_dtype=weight_dtype)
    return ExportedCore(out, public, private, NAMESPACE)


@pytest.fixture(scope="session")
def smollm2_core_f32(tmp_path_factory, signing_key_pair) -> ExportedCore:
    """The real model exported with float32 weights."""
    return _export(tmp_path_factory, signing_key_pair, "f32")


@pytest.fixture(scope="session")
def smollm2_core_bf16(tmp_path_factory, signing_key_pair) -> ExportedCore:
    """The real model exported with bf16 weights (the recipe's default)."""
    return _export(tmp_path_factory, signing_key_pair, "bf16")


@pytest.fixture(scope="session")
def gemma3_checkpoint():
    """Gemma 3 270M's Q4_K_M GGUF from the development group's package, opened once (its
    262,144-piece vocabulary takes most of the load): the reader tests and `gemma3_core`
    share it."""
    from helios_ignition.checkpoint import gemma3_270m_gguf_path, load_gguf

    return load_gguf(gemma3_270m_gguf_path())


@pytest.fixture(scope="session")
def gemma3_core(tmp_path_factory, signing_key_pair, gemma3_checkpoint) -> ExportedCore:
    """Gemma 3 270M (recipes/gemma3_270m.py: GGUF blocks) from `gemma3_checkpoint`."""
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    out = tmp_path_factory.mktemp("core-gemma3") / "gemma3-270m.core"
    export_core(REPO / "recipes" / "gemma3_270m.py", checkpoint=gemma3_checkpoint,
                key_path=private, namespace=NAMESPACE, out=out)
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
    folder = tmp_path_factory.mktemp("tiny-served")
    checkpoint = write_tiny_checkpoint(folder)
    out = export_tiny(checkpoint, private, folder / "tiny.core")
    return TinyServed(checkpoint, ExportedCore(out, public, private, NAMESPACE))


@pytest.fixture(scope="session")
def tiny_tp2(tmp_path_factory, tiny_served) -> ExportedCore:
    """The tiny checkpoint exported with `--tensor-parallel 2` (docs/tensor-parallel.md)."""
    from tests.tiny_model import export_tiny

    core = tiny_served.core
    out = tmp_path_factory.mktemp("tiny-tp2") / "tiny-tp2.core"
    export_tiny(tiny_served.checkpoint, core.private_key, out, tensor_parallel=2)
    return ExportedCore(out, core.public_key, core.private_key, core.namespace)


@pytest.fixture(scope="session")
def smollm2_tp3_f32(tmp_path_factory, signing_key_pair) -> ExportedCore:
    """The real model exported with float32 weights and `--tensor-parallel 3` (its 9 query
    and 3 key/value heads, FFN 1536 and vocabulary 49152 divide by 3)."""
    from helios_ignition.export import export_core

    private, public = signing_key_pair
    out = tmp_path_factory.mktemp("core-tp3") / "smollm2-f32-tp3.core"
    export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE, out=out,
                weight_dtype="f32", tensor_parallel=3)
    return ExportedCore(out, public, private, NAMESPACE)
