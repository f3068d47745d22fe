"""Every way `ignition export` refuses its input: exact error, and nothing left behind.

Each case runs twice: through the library (`export_core` raises the named class) and
through the CLI in-process (exit 1, one `ignition: error: ...` line on stderr, no traceback,
no summary; `--force` where a core is already at the output path). Either way the output folder is byte-for-byte what it was before: no core, no
temporary `.NAME.*` file, and a core already at the output path is untouched.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helios_ignition.checkpoint import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    MissingChatTemplateError,
    MissingTensorError,
    MissingTokenizerError,
    TensorShapeError,
    UnsupportedTensorError,
)
from helios_ignition.export import ExportError, ExportUsageError, export_core
from helios_ignition.recipe import RecipeError

from tests.ignition.export.tiny import LLAMA_RECIPE, NAMESPACE, TINY, run_export

RECIPE_SOURCE = '''
from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe

RECIPE = Recipe(
    name="custom", family={family!r}, checkpoint="unused", weight_dtype={dtype!r},
    chat_template={template!r}, capacities=Capacities(scored_tokens={scored!r}),
    frontend=fe.FrontendContract(tool_parser={tool}, reasoning_parser={reasoning},
                                 image_preparation=fe.IMAGE_PREPARATION_NONE,
                                 image_layout=fe.IMAGE_LAYOUT_NONE))
'''
BROKEN_TEMPLATE = "{% if %}{{ messages }}"


def write_recipe(folder: Path, *, family: str = "llama", dtype: str = "f32",
                 tool: str = "fe.TOOL_PARSER_NONE",
                 reasoning: str = "fe.REASONING_PARSER_NONE",
                 template: str | None = None, scored_tokens: tuple[int, ...] = ()) -> Path:
    """A recipe file declaring one thing differently from a valid one."""
    path = folder / "custom_recipe.py"
    path.write_text(RECIPE_SOURCE.format(family=family, dtype=dtype, tool=tool,
                                         reasoning=reasoning, template=template,
                                         scored=scored_tokens))
    return path


@dataclass
class Env:
    """What a case may use: a scratch folder, the output folder, keys and checkpoints."""

    tmp: Path
    out_dir: Path
    private_key: Path
    public_key: Path
    make_checkpoint: Callable[..., Path]
    checkpoint: Path
    monkeypatch: pytest.MonkeyPatch
    # export_core keyword arguments, completed by the case
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One refusal: how to provoke it, the error class and what its message must say."""

    name: str
    setup: Callable[[Env], tuple[str, ...]]  # edits env.kwargs, returns message fragments
    error: type[Exception]
    cli: bool = True  # False: the CLI refuses it as a usage error first (tested apart)
    status: int = 1  # the CLI's exit status: 1 the export failed, 2 usage


def _shape_mismatch(env: Env) -> tuple[str, ...]:
    # The last matrix of the last layer: the export is well into writing when it fails.
    bad = "model.layers.1.mlp.down_proj.weight"
    env.kwargs["checkpoint"] = env.make_checkpoint(shapes={bad: (64, 100)})
    return (bad, "(64, 100)", "(64, 128)", str(env.kwargs["checkpoint"]))


def _shape_mismatch_existing_core(env: Env) -> tuple[str, ...]:
    env.kwargs["out"].write_bytes(b"an earlier core, which must survive a failed export")
    bad = "model.embed_tokens.weight"
    env.kwargs["checkpoint"] = env.make_checkpoint(shapes={bad: (49152, 32)})
    return (bad, "(49152, 32)", "(49152, 64)")


def _missing_tensor(env: Env) -> tuple[str, ...]:
    gone = "model.layers.1.mlp.up_proj.weight"
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint(drop=(gone,))
    return (str(ckpt), f"missing tensor {gone!r}", "model.safetensors")


def _integer_tensor(env: Env) -> tuple[str, ...]:
    import numpy as np

    name = "model.layers.0.self_attn.o_proj.weight"
    env.kwargs["checkpoint"] = env.make_checkpoint(arrays={name: np.ones((64, 64), np.int32)})
    return (name, "dtype I32")


def _missing_tokenizer(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint(tokenizer=False)
    return (str(ckpt), "no tokenizer.json")


def _missing_template(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint(template=False)
    return (str(ckpt), "no chat template")


def _empty_template(env: Env) -> tuple[str, ...]:
    # The loader accepts chat_template.jinja as it is; an empty one is no template.
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint(template=False)
    (ckpt / "chat_template.jinja").write_text("")
    return (str(ckpt), "no chat template")


def _tokenizer_beyond_vocab(env: Env) -> tuple[str, ...]:
    from dataclasses import replace

    geometry = replace(TINY, vocab_size=1000)  # SmolLM2's tokenizer has 49152 ids
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint(geometry=geometry)
    return (str(ckpt), "token id 49151", "vocabulary of 1000 ids")


def _invalid_tokenizer(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint()
    (ckpt / "tokenizer.json").write_text('{"model": {}}')
    return (str(ckpt), "invalid tokenizer.json")


def _tokenizer_not_json(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint()
    (ckpt / "tokenizer.json").write_text("")
    return (str(ckpt), "tokenizer.json")


def _config_not_json(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint()
    (ckpt / "config.json").write_text("{not json")
    return (str(ckpt), "config.json")


def _truncated_safetensors(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint()
    shard = ckpt / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:100_000])
    return (str(shard),)


def _template_does_not_compile(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = ckpt = env.make_checkpoint(template=False)
    (ckpt / "chat_template.jinja").write_text(BROKEN_TEMPLATE)
    return (str(ckpt), "chat template does not compile")


def _recipe_template_does_not_compile(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = write_recipe(env.tmp, template=BROKEN_TEMPLATE)
    return ("recipe custom", "chat template does not compile")


def _unspecified_tool_parser(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = write_recipe(env.tmp, tool="fe.TOOL_PARSER_UNSPECIFIED")
    return ("frontend.tool_parser = 0", "not a supported parser", "TOOL_PARSER_NONE")


def _unknown_reasoning_parser(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = write_recipe(env.tmp, reasoning="99")
    return ("frontend.reasoning_parser = 99", "not a supported parser",
            "REASONING_PARSER_THINK_TAGS")


def _unsupported_family(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = write_recipe(env.tmp, family="mistral")
    return ("unsupported family 'mistral'", "supported: gemma3, llama, qwen3, qwen3_moe")


def _unsupported_recipe_dtype(env: Env) -> tuple[str, ...]:
    env.kwargs.update(recipe_path=write_recipe(env.tmp, dtype="f16"), weight_dtype=None)
    return ("unsupported weight dtype 'f16'", "bf16, f32")


def _unsupported_dtype_override(env: Env) -> tuple[str, ...]:
    env.kwargs["weight_dtype"] = "fp8"
    return ("unsupported weight dtype 'fp8'",)


def _recipe_missing(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = path = env.tmp / "absent_recipe.py"
    return ("recipe file not found", str(path))


def _recipe_declares_nothing(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = path = env.tmp / "empty_recipe.py"
    path.write_text("NAME = 'not a recipe'\n")
    return ("defines neither RECIPE nor make_recipe",)


def _recipe_fails_to_import(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = path = env.tmp / "broken_recipe.py"
    path.write_text("import helios_no_such_module\n")
    return ("failed to import", "helios_no_such_module")


def _make_recipe_raises(env: Env) -> tuple[str, ...]:
    # As the SmolVLM recipe does on a checkpoint without its image tokens: an internal
    # error (exit 3) before, for a recipe's own refusal of the checkpoint.
    env.kwargs["recipe_path"] = path = env.tmp / "picky_recipe.py"
    path.write_text("def make_recipe(checkpoint):\n"
                    "    raise ValueError('no <image> token in this vocabulary')\n")
    return (f"recipe {path}: make_recipe failed for checkpoint {env.checkpoint}: no <image> "
            "token in this vocabulary",)


def _context_shorter_than_prefill(env: Env) -> tuple[str, ...]:
    from dataclasses import replace

    env.kwargs["checkpoint"] = env.make_checkpoint(geometry=replace(TINY, max_context=8))
    return ("8 tokens", "prefill")


def _missing_output_dir(env: Env) -> tuple[str, ...]:
    env.kwargs["out"] = env.out_dir / "absent" / "x.core"
    return ("output directory does not exist", str(env.out_dir / "absent"))


def _output_is_directory(env: Env) -> tuple[str, ...]:
    env.kwargs["out"] = out = env.out_dir / "taken.core"
    out.mkdir()
    return ("output path is a directory", str(out))


def _output_in_procfs(env: Env) -> tuple[str, ...]:
    # procfs takes no new files, even from root (for whom access(W_OK) always says yes).
    env.kwargs["out"] = Path("/proc/helios-export-test.core")
    return ("/proc",)


def _disk_full(env: Env) -> tuple[str, ...]:
    from helios_tools.core import CoreWriter

    real = CoreWriter.add_resource
    calls = []

    def add_resource(self, *args, **kwargs):
        calls.append(args[0])
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    env.monkeypatch.setattr(CoreWriter, "add_resource", add_resource)
    return (str(env.kwargs["out"]), os.strerror(errno.ENOSPC))


def _missing_key(env: Env) -> tuple[str, ...]:
    env.kwargs["key_path"] = path = env.tmp / "absent.key"
    return ("signing key not found", str(path))


def _public_key_as_key(env: Env) -> tuple[str, ...]:
    env.kwargs["key_path"] = env.public_key
    return (str(env.public_key), "not a PEM Ed25519 private key")


def _garbage_key(env: Env) -> tuple[str, ...]:
    env.kwargs["key_path"] = path = env.tmp / "garbage.key"
    path.write_text("not a key\n")
    return (str(path), "not a PEM Ed25519 private key")


def _empty_namespace(env: Env) -> tuple[str, ...]:
    env.kwargs["namespace"] = ""
    return ("--namespace must be non-empty",)


def _random_without_geometry(env: Env) -> tuple[str, ...]:
    env.kwargs.update(checkpoint=None, random_seed=7)
    return ("--random-weights needs --geometry", "smollm2-135m", "llama-3.1-8b")


def _checkpoint_and_random(env: Env) -> tuple[str, ...]:
    env.kwargs.update(random_seed=7, geometry="smollm2-135m")
    return ("--checkpoint and --random-weights are exclusive",)


def _geometry_without_random(env: Env) -> tuple[str, ...]:
    env.kwargs["geometry"] = "smollm2-135m"
    return ("--geometry applies only with --random-weights",)


def _no_checkpoint(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = None
    return ("no checkpoint", "--checkpoint", "--random-weights")


def _mma_without_bf16_cache(env: Env) -> tuple[str, ...]:
    from helios_ignition.capture import launch

    env.monkeypatch.setattr(launch, "ATTN_MMA", "2")  # HELIOS_ATTN_MMA=2 at import
    return ("HELIOS_ATTN_MMA=2 (tensor-core decode attention, GROUPED=4) reads bf16 KV "
            "planes only, not the recipe's f32 cache (--kv-cache-dtype auto): export with "
            "--kv-cache-dtype bf16 or with HELIOS_ATTN_MMA=off",)


def _mma_with_fp8_cache(env: Env) -> tuple[str, ...]:
    from helios_ignition.capture import launch

    env.monkeypatch.setattr(launch, "ATTN_MMA", "1")
    env.kwargs["kv_cache_dtype"] = "fp8"
    return ("HELIOS_ATTN_MMA=1 (tensor-core decode attention, GROUPED=4) reads bf16 KV "
            "planes only, not --kv-cache-dtype fp8",)


def _unknown_geometry(env: Env) -> tuple[str, ...]:
    env.kwargs.update(checkpoint=None, random_seed=7, geometry="llama-9000")
    return ("unknown geometry 'llama-9000'",
            "known: llama-3.1-8b, qwen3-30b-a3b, qwen3-8b, smollm2-135m")


def _gguf_without_blocks(env: Env) -> tuple[str, ...]:
    env.kwargs["weight_dtype"] = "gguf"  # the tiny checkpoint is safetensors: no blocks
    return ("--weight-dtype gguf", str(env.checkpoint), "stores no matrix in GGUF blocks")


def _scored_beyond_prefill(env: Env) -> tuple[str, ...]:
    env.kwargs["recipe_path"] = write_recipe(env.tmp, scored_tokens=(16, 4096))
    return ("capacities.scored_tokens must be ascending positive and at most the largest "
            "prefill capacity", "(16, 4096)")


def _checkpoint_path_missing(env: Env) -> tuple[str, ...]:
    env.kwargs["checkpoint"] = path = env.tmp / "absent-checkpoint"
    return (str(path), "neither a .gguf file nor a safetensors directory")


CASES = [
    Case("tensor shape", _shape_mismatch, TensorShapeError),
    Case("tensor shape, earlier core kept", _shape_mismatch_existing_core, TensorShapeError),
    Case("tensor missing", _missing_tensor, MissingTensorError),
    Case("tensor of integers", _integer_tensor, UnsupportedTensorError),
    Case("missing tokenizer", _missing_tokenizer, MissingTokenizerError),
    Case("missing chat template", _missing_template, MissingChatTemplateError),
    Case("empty chat template", _empty_template, MissingChatTemplateError),
    Case("chat template does not compile", _template_does_not_compile, CheckpointError),
    Case("recipe's chat template does not compile", _recipe_template_does_not_compile,
         RecipeError),
    Case("tokenizer ids beyond vocab", _tokenizer_beyond_vocab, CheckpointError),
    Case("tokenizer invalid", _invalid_tokenizer, CheckpointError),
    Case("tokenizer not JSON", _tokenizer_not_json, CheckpointFormatError),
    Case("config.json not JSON", _config_not_json, CheckpointFormatError),
    Case("safetensors truncated", _truncated_safetensors, CheckpointFormatError),
    Case("tool parser unspecified", _unspecified_tool_parser, RecipeError),
    Case("reasoning parser unknown", _unknown_reasoning_parser, RecipeError),
    Case("family unsupported", _unsupported_family, RecipeError),
    Case("recipe dtype unsupported", _unsupported_recipe_dtype, RecipeError),
    Case("dtype override unsupported", _unsupported_dtype_override, RecipeError, cli=False),
    Case("recipe missing", _recipe_missing, RecipeError),
    Case("recipe declares nothing", _recipe_declares_nothing, RecipeError),
    Case("recipe fails to import", _recipe_fails_to_import, RecipeError),
    Case("recipe's make_recipe raises", _make_recipe_raises, RecipeError),
    Case("context shorter than every prefill chunk", _context_shorter_than_prefill,
         ExportError),
    Case("output dir missing", _missing_output_dir, ExportError),
    Case("output is a directory", _output_is_directory, ExportError, cli=False),
    Case("output unwritable (procfs)", _output_in_procfs, ExportError),
    Case("disk full while writing", _disk_full, ExportError),
    Case("key missing", _missing_key, ExportError),
    Case("key is the public key", _public_key_as_key, ExportError),
    Case("key is not PEM", _garbage_key, ExportError),
    Case("namespace empty", _empty_namespace, ExportError),
    # options that do not go together: usage (ExportUsageError, an ExportError)
    Case("random weights without geometry", _random_without_geometry, ExportUsageError,
         status=2),
    Case("checkpoint with random weights", _checkpoint_and_random, ExportUsageError, status=2),
    Case("geometry without random weights", _geometry_without_random, ExportUsageError,
         status=2),
    Case("no checkpoint", _no_checkpoint, ExportUsageError, status=2),
    Case("tensor-core attention without a bf16 cache", _mma_without_bf16_cache,
         ExportUsageError, status=2),
    Case("tensor-core attention with an fp8 cache", _mma_with_fp8_cache, ExportUsageError,
         status=2),
    Case("scored capacity beyond the prefill chunk", _scored_beyond_prefill, RecipeError),
    Case("geometry unknown", _unknown_geometry, CheckpointError),
    Case("checkpoint path missing", _checkpoint_path_missing, CheckpointNotFoundError),
    Case("gguf weights from a checkpoint without blocks", _gguf_without_blocks, ExportError),
]


@pytest.fixture
def env(tmp_path, signing_key_pair, make_checkpoint, tiny_checkpoint, monkeypatch) -> Env:
    private, public = signing_key_pair
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    e = Env(scratch, out_dir, private, public, make_checkpoint, tiny_checkpoint, monkeypatch)
    e.kwargs = dict(recipe_path=LLAMA_RECIPE, checkpoint=tiny_checkpoint, key_path=private,
                    namespace=NAMESPACE, out=out_dir / "tiny.core", weight_dtype="f32")
    return e


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` (relative), with file contents; directories map to None."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def cli_args(kwargs: dict) -> list[str]:
    """The `ignition export` arguments equivalent to export_core keyword arguments."""
    args = [str(kwargs["recipe_path"]), "--key", str(kwargs["key_path"]),
            "--namespace", kwargs["namespace"], "--out", str(kwargs["out"])]
    for key, flag in (("checkpoint", "--checkpoint"), ("weight_dtype", "--weight-dtype"),
                      ("random_seed", "--random-weights"), ("geometry", "--geometry"),
                      ("kv_cache_dtype", "--kv-cache-dtype")):
        if kwargs.get(key) is not None:
            args += [flag, str(kwargs[key])]
    if Path(kwargs["out"]).is_file():  # an earlier core: the CLI overwrites only with --force
        args.append("--force")
    return args


def _assert_nothing_written(env: Env, before: dict) -> None:
    assert snapshot(env.out_dir) == before
    out = Path(env.kwargs["out"])
    if out.parent.is_dir() and out.parent != env.out_dir:  # e.g. /proc
        assert not list(out.parent.glob(f"*{out.name}*"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_library_refuses(case: Case, env: Env):
    fragments = case.setup(env)
    before = snapshot(env.out_dir)
    with pytest.raises(case.error) as info:
        export_core(**env.kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)
    _assert_nothing_written(env, before)


@pytest.mark.parametrize("case", [c for c in CASES if c.cli], ids=lambda c: c.name)
def test_cli_refuses(case: Case, env: Env):
    fragments = case.setup(env)
    before = snapshot(env.out_dir)
    result = run_export(*cli_args(env.kwargs))
    assert result.exit_code == case.status, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    assert result.stdout == ""  # no summary line
    errors = [line for line in result.stderr.splitlines()
              if line.startswith("ignition: error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in errors[0]
    _assert_nothing_written(env, before)


def test_read_only_output_dir(env: Env):
    """sysfs refuses new files even to root (CI runs as root, where mode bits don't bind):
    the access check names the directory, or the write itself fails as an ExportError."""
    out = Path("/sys/helios-export-test.core")
    env.kwargs["out"] = out
    expected = ("cannot write /sys/helios-export-test.core: Permission denied"
                if os.geteuid() == 0 else "output directory is not writable: /sys")
    with pytest.raises(ExportError) as err:
        export_core(**env.kwargs)
    assert str(err.value) == expected
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--weight-dtype", "f16"], "Invalid value for '--weight-dtype'"),
    (["--out", "{out_dir}"], "is a directory"),
    (["--random-weights", "seven"], "Invalid value for '--random-weights'"),
])
def test_cli_usage_errors(env: Env, args: list[str], message: str):
    """Bad option values are click usage errors (exit 2) before any work."""
    args = [a.format(out_dir=env.out_dir) for a in args]
    base = [a for a in cli_args(env.kwargs)]
    result = run_export(*base, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert snapshot(env.out_dir) == {}


@pytest.mark.parametrize("missing", ["--key", "--namespace", "--out"])
def test_cli_required_options(env: Env, missing: str):
    args = cli_args(env.kwargs)
    i = args.index(missing)
    del args[i:i + 2]
    result = run_export(*args)
    assert result.exit_code == 2
    assert f"Missing option '{missing}'" in result.stderr
    assert snapshot(env.out_dir) == {}


def test_custom_recipe_control(env: Env):
    """The recipe file the parser/family/dtype cases vary is itself valid."""
    env.kwargs["recipe_path"] = write_recipe(env.tmp)
    summary = export_core(**env.kwargs)
    assert summary.served_id == "custom"
    assert sorted(snapshot(env.out_dir)) == ["tiny.core"]
