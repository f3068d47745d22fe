"""helios-serve startup failures on the tiny served core: one line, exit 2, and what can be
checked without loading the model (core path, port) is checked before loading it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helios_tools.core import load_public_key, open_core

from tests.tiny_model import serve_fails


def _fails(*args) -> str:
    """helios-serve ARGS exits 2 with one error line (after any startup phase lines)."""
    return serve_fails("--port", "0", *args)  # (a later --port wins)


@pytest.fixture(scope="module")
def corrupt_weights(tiny_served, module_tmp) -> tuple[Path, str]:
    """A copy of the tiny core with one byte of a weight's stored frame flipped (the
    signed envelope and the tokenizer are intact: only loading the weights fails)."""
    core = tiny_served.core
    with open_core(core.path, [load_public_key(core.public_key)]) as opened:
        rid = "weights/L1.w_down"
        offset, length = opened.locations[rid]
    data = bytearray(core.path.read_bytes())
    data[offset + length // 2] ^= 0x40
    out = module_tmp("corrupt") / "corrupt.core"
    out.write_bytes(bytes(data))
    return out, rid


def _args(core, path: Path, *more: str) -> list[str]:
    return [str(path), "--trust", str(core.public_key), "--accept", core.namespace, *more]


def test_weight_chunk_failing_its_digest_is_a_bad_core(tiny_served, corrupt_weights):
    path, rid = corrupt_weights
    line = _fails(*_args(tiny_served.core, path, "--port", "0"))
    assert line.startswith(f"helios-serve: error: bad core: {path}: chunk 0 of 1 does not "
                           f"match its signed SHA-256 (resource {rid!r}, offset ")


def test_busy_port_is_reported_before_the_model_loads(tiny_served, corrupt_weights):
    path, _ = corrupt_weights
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        # The corrupt weights would fail loading: the port error shows nothing was loaded.
        line = _fails(*_args(tiny_served.core, path, "--port", str(port)))
    assert line == (f"helios-serve: error: cannot listen on 127.0.0.1:{port}: "
                    "Address already in use")


def test_missing_core_is_reported_before_the_port_is_bound(tiny_served, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        missing = tmp_path / "absent.core"
        line = _fails(*_args(tiny_served.core, missing, "--port", str(port)))
        assert line == f"helios-serve: error: bad core: {missing}: no such file"
        line = _fails(*_args(tiny_served.core, tmp_path, "--port", str(port)))
        assert line == f"helios-serve: error: bad core: {tmp_path}: is a directory"


def test_unknown_backend_is_a_usage_error_before_anything_loads(tmp_path):
    """--backend is a click.Choice of the backends with a capability table: an unknown one
    fails at once (the core path is not even read), one line, exit 2."""
    line = _fails(str(tmp_path / "absent.core"), "--trust", "k.pub", "--accept", "ns",
                  "--backend", "tpu")
    assert line == ("helios-serve: error: Invalid value for '--backend': 'tpu' is not one of "
                    "'cpu', 'cuda'.")


SPECULATIVE_RECIPE = """
from dataclasses import replace
import importlib.util
spec = importlib.util.spec_from_file_location("base", {base!r})
base = importlib.util.module_from_spec(spec); spec.loader.exec_module(base)
from helios_ignition.recipe import DrafterDecl


def make_recipe(checkpoint):
    return replace(base.make_recipe(checkpoint),
                   drafter=DrafterDecl("random:7:128", widths=(1, 2, 4)))
"""


@pytest.fixture(scope="module")
def speculative_core(tiny_served, module_tmp) -> Path:
    """The tiny checkpoint exported with a seeded random drafter (widths 1, 2, 4)."""
    from helios_ignition.export import export_core

    from tests.tiny_model import LLAMA_RECIPE, NAMESPACE

    folder = module_tmp("tiny-spec")
    recipe = folder / "tiny_spec.py"
    recipe.write_text(SPECULATIVE_RECIPE.format(base=str(LLAMA_RECIPE)))
    out = folder / "tiny-spec.core"
    export_core(recipe, checkpoint=str(tiny_served.checkpoint),
                key_path=tiny_served.core.private_key, namespace=NAMESPACE, out=out,
                weight_dtype="f32")
    return out


@pytest.mark.parametrize("engine", [(), ("--engine-process",)], ids=["thread", "engine"])
def test_history_drafting_without_learned_speculation_fails_before_the_weights_load(
        tiny_served, corrupt_weights, engine):
    # The corrupt weights would fail loading: the option's error shows nothing was loaded.
    path, _ = corrupt_weights
    line = _fails(*_args(tiny_served.core, path, "--port", "0", "--history-drafting", *engine))
    assert line == ("helios-serve: error: --history-drafting needs learned speculation: the "
                    "core has no speculative programs")


def test_history_drafting_with_speculation_off_fails_startup(tiny_served, speculative_core):
    line = _fails(*_args(tiny_served.core, speculative_core, "--port", "0",
                         "--history-drafting", "--speculative-width", "1"))
    assert line == ("helios-serve: error: --history-drafting needs learned speculation: "
                    "--speculative-width 1 serves no lane wider than one")


@pytest.mark.parametrize("engine", [(), ("--engine-process",)], ids=["thread", "engine"])
def test_speculative_width_on_a_core_without_speculative_programs_fails_before_the_weights_load(
        tiny_served, corrupt_weights, engine):
    path, _ = corrupt_weights
    line = _fails(*_args(tiny_served.core, path, "--port", "0", "--speculative-width", "4",
                         *engine))
    assert line == ("helios-serve: error: --speculative-width 4: the core has no speculative "
                    "programs (0 or no option serves plain decode)")


def test_speculative_width_zero_passes_the_option_check(tiny_served, corrupt_weights):
    # Past the option check, loading reaches the corrupt weight.
    path, rid = corrupt_weights
    line = _fails(*_args(tiny_served.core, path, "--port", "0", "--speculative-width", "0"))
    assert line.startswith(f"helios-serve: error: bad core: {path}: chunk 0 of 1 does not "
                           f"match its signed SHA-256 (resource {rid!r}, offset ")


def test_speculative_width_above_the_captured_width_fails_naming_it(tiny_served,
                                                                    speculative_core):
    line = _fails(*_args(tiny_served.core, speculative_core, "--port", "0",
                         "--speculative-width", "5"))
    assert line == ("helios-serve: error: --speculative-width 5: the core's widest captured "
                    "speculative width is 4 (captured: 1, 2, 4); load-time selection may "
                    "reduce it, never raise it")


def test_negative_speculative_width_is_a_usage_error(tmp_path):
    line = _fails(str(tmp_path / "absent.core"), "--trust", "k.pub", "--accept", "ns",
                  "--speculative-width", "-1")
    assert line == ("helios-serve: error: Invalid value for '--speculative-width': -1 is not "
                    "in the range x>=0.")


def test_an_unknown_history_proposer_is_a_usage_error(tmp_path):
    line = _fails(str(tmp_path / "absent.core"), "--trust", "k.pub", "--accept", "ns",
                  "--history-proposer", "tree")
    assert line == ("helios-serve: error: Invalid value for '--history-proposer': 'tree' is "
                    "not one of 'copy', 'suffix'.")


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_outside_0_to_65535_is_one_line(tiny_served, port):
    """It was a traceback (socket.bind's OverflowError) and exit 1."""
    core = tiny_served.core
    assert _fails(*_args(core, core.path, "--port", port)) == (
        f"helios-serve: error: Invalid value for '--port': {port} is not in the range "
        "0<=x<=65535.")


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_served_name_is_refused(tiny_served, name):
    """It was ignored: the core's served id was served under a name the operator cleared."""
    core = tiny_served.core
    assert _fails(*_args(core, core.path, "--port", "0", "--served-name", name)) == (
        "helios-serve: error: --served-name must not be empty (omit it to serve the core's "
        "served id)")


@pytest.mark.parametrize(("options", "line"), [
    ((), "widths up to 4, adaptive width policy"),
    (("--speculative-width", "2", "--speculative-policy", "fixed", "--history-drafting"),
     "widths up to 2, fixed width policy, history drafting (copy)"),
    (("--speculative-width", "0"), "off (--speculative-width 0)"),
])  # fmt: skip
def test_the_startup_log_says_how_speculation_is_served(tiny_served, speculative_core,
                                                        options, line):
    from tests.tiny_model import ServeProcess

    core = tiny_served.core
    with ServeProcess(speculative_core, "--trust", core.public_key, "--accept", core.namespace,
                      *options) as served:
        pass
    spec = [x for x in served.stderr_lines if x.startswith("helios-serve: speculation")]
    assert len(spec) == 1 and spec[0].endswith(f" s  {line}"), served.stderr_lines
