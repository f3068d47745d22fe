"""A tiny model that `helios-serve` serves from disk in a second: real export, real core.

The checkpoint is a real HF safetensors directory (tests/ignition/export/tiny.py writes
it): the byte-level test tokenizer of helios_serve.testing.tokenizer (283 ids, `<|im_end|>`
= 2 is EOS), its ChatML template and seeded float32 weights of a 2-layer, width-32 Llama.
`export_tiny` runs `ignition export` through its library entry point with the generic
recipe (recipes/llama.py) and float32 weights, so the greedy ids of a served core can be
compared exactly with the plain NumPy forward of bench/numpy_forward.py on the same
checkpoint (`plain_greedy`).

A core file is about 150 KB; loading it takes well under a second on the CI machine.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from helios_ignition.checkpoint import LlamaGeometry
from helios_serve.cli import main as serve_main
from helios_serve.testing.tokenizer import CHAT_TEMPLATE, TinyTokenizer

from tests.ignition.export.tiny import Frontend, write_checkpoint

REPO = Path(__file__).resolve().parents[1]
LLAMA_RECIPE = REPO / "recipes" / "llama.py"
NAMESPACE = "helios.test/tiny"
SERVED_ID = "tiny-served"  # the checkpoint folder's name becomes the served id

TOKENIZER = TinyTokenizer()
GEOMETRY = LlamaGeometry(vocab_size=TOKENIZER.vocab_size, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         rope_theta=10000.0, rms_eps=1e-5, max_context=256,
                         tie_word_embeddings=True)
PROMPTS = ("What is the capital of France?", "Hello, world!", "Name three colours.")


def tiny_tensors(seed: int) -> dict[str, np.ndarray]:
    """Seeded float32 tensors by HF name: matrices N(0, 0.3), norms 1 + N(0, 0.1).

    Wider than tests/ignition/export/tiny.py's 0.05 so that greedy output at width 32
    varies with the prompt instead of repeating one token.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in GEOMETRY.tensor_shapes().items():
        noise = rng.standard_normal(shape).astype(np.float32)
        out[name] = 1 + 0.1 * noise if len(shape) == 1 else 0.3 * noise
    return out


def write_tiny_checkpoint(parent: Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint directory `parent/tiny-served` and return it."""
    frontend = Frontend(TOKENIZER.to_json(), CHAT_TEMPLATE)
    return write_checkpoint(parent / SERVED_ID, frontend, geometry=GEOMETRY,
                            arrays=tiny_tensors(seed))


def export_tiny(checkpoint: Path, key: Path, out: Path, **options) -> Path:
    """`ignition export recipes/llama.py --checkpoint CHECKPOINT --weight-dtype f32 ...`.

    `options` go to `export_core` (carrier, protected_version, resource_key_path, ...).
    """
    from helios_ignition.export import export_core

    export_core(LLAMA_RECIPE, checkpoint=str(checkpoint), key_path=key, namespace=NAMESPACE,
                out=out, weight_dtype="f32", **options)
    return out


def prompt_ids(text: str) -> list[int]:
    """The chat-templated prompt ids of one user message (as helios-serve builds them)."""
    from helios_tools.frontend_assets import render_chat

    prompt = render_chat(CHAT_TEMPLATE, [{"role": "user", "content": text}])
    return TOKENIZER.tokenizer.encode(prompt, add_special_tokens=False).ids


def _plain(checkpoint: Path):
    """The independent plain NumPy forward (bench/numpy_forward.py) over `checkpoint`."""
    from helios_ignition.checkpoint import load_safetensors_dir

    spec = importlib.util.spec_from_file_location("helios_bench_numpy_forward",
                                                  REPO / "bench" / "numpy_forward.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module.PlainLlama(load_safetensors_dir(checkpoint), max_context=GEOMETRY.max_context)


def plain_greedy(checkpoint: Path, ids: list[int], steps: int) -> list[int]:
    """Greedy ids of the independent plain NumPy forward (bench/numpy_forward.py)."""
    return _plain(checkpoint).greedy(ids, steps)[0]


def plain_logprobs(checkpoint: Path, ids: list[int], steps: int, top: int
                   ) -> list[tuple[int, float, list[tuple[int, float]]]]:  # fmt: skip
    """Greedy decode with the plain NumPy forward, reporting what the logprobs record
    should hold for each step: (greedy id, its log probability, the `top` most likely
    (id, log probability), most likely first, ties by lower id). Log probabilities are
    the raw model distribution: log_softmax of the logits, computed in float64."""
    plain = _plain(checkpoint)
    cache = plain.new_cache(1, len(ids) + steps)
    logits = plain.forward(np.asarray([ids]), cache)[0]
    out = []
    for _ in range(steps):
        z = logits.astype(np.float64) - float(np.max(logits))
        logprobs = z - np.log(np.exp(z).sum())
        token = int(np.argmax(logits))
        best = np.argsort(-logprobs, kind="stable")[:top]
        out.append((token, float(logprobs[token]), [(int(t), float(logprobs[t])) for t in best]))
        logits = plain.forward(np.asarray([[token]]), cache)[0]
    return out


def _default_signals() -> None:
    """In the child before exec: no blocked signals and SIGINT at its default, whatever the
    test process inherited or set (a blocked or ignored SIGINT is inherited across exec,
    and Ray's in-process drivers in tests/ray may leave one behind), so that the server's
    own SIGINT handling is what the test sees."""
    import signal

    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServeProcess:
    """`helios-serve ARGS --port 0` as a subprocess; `url` once it serves.

    Use as a context manager; leaving it sends SIGINT and waits for the exit.

    Raises:
        AssertionError: the server exited or printed something else first.
    """

    def __init__(self, *args: str | Path, env: dict[str, str] | None = None) -> None:
        import os
        import subprocess

        serve = Path(sys.executable).parent / "helios-serve"
        self.proc = subprocess.Popen([str(serve), *map(str, args), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})},
                                     preexec_fn=_default_signals)
        first = self.proc.stdout.readline()
        if not first.startswith("Helios is serving"):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"helios-serve did not start: {first}{err}")
        self.url = first.split(" at ")[1].split()[0]
        self.stderr_lines: list[str] = []

    def chat_ids(self, text: str, max_tokens: int = 12) -> list[int]:
        """Greedy token ids of one user message (`return_token_ids`)."""
        import httpx

        r = httpx.post(self.url + "/v1/chat/completions", timeout=60, json={
            "model": SERVED_ID, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        self.proc.send_signal(signal.SIGINT)
        try:  # a hang guard, generous for a loaded 2-core machine
            _, err = self.proc.communicate(timeout=120)
        except Exception:
            self.proc.kill()
            raise
        self.stderr_lines = err.splitlines()


def until_eos(ids: list[int], eos: int = 2) -> list[int]:
    """`ids` up to and including the first EOS (what a served request returns)."""
    return ids[:ids.index(eos) + 1] if eos in ids else ids


PHASES = ("verify", "contract", "cache tiers", "weights", "kernels", "cache sizing", "graphs",
          "ranks", "tuning", "speculation", "listen")
PHASE_LINE = re.compile(rf"^helios-serve: (engine: )?({'|'.join(PHASES)}) +\d+\.\d\d s( |$)")


def serve_fails(*args: object, env: dict[str, str] | None = None) -> str:
    """The one error line of `helios-serve ARGS` (str of each), which must exit 2: run in
    this process through click's runner (`env` over os.environ while it runs), so each case
    costs no interpreter start and imports (seconds each). A startup failure is the same
    code as in the installed command; tests/e2e/test_cli.py::test_usage_errors runs the
    command itself.

    Raises:
        AssertionError: another exit status, or stderr that `serve_error_line` refuses.
    """
    result = CliRunner().invoke(serve_main, [str(a) for a in args], env=env)
    assert result.exit_code == 2, (result.output, result.exception)
    return serve_error_line(result.stderr)


def serve_error_line(stderr: str) -> str:
    """The one error line of a failed helios-serve: its last stderr line; the lines
    before it may only be startup phase lines, and there is no traceback.

    Raises:
        AssertionError: otherwise.
    """
    lines = stderr.strip().splitlines()
    assert lines and "Traceback" not in stderr, stderr
    *phases, last = lines
    assert last.startswith("helios-serve: error: "), stderr
    assert all(PHASE_LINE.match(line) for line in phases), stderr
    return last
