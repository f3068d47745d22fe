"""Whether a tree compiles the f32 cuda path to the same machine code as another (no GPU).

When a change touches kernels that an existing core also runs (a new form beside an old
one) and no GPU is at hand, this says whether the old path's GPU results still describe
it: each variant is compiled for sm_90 in this tree and disassembled with Triton's own
`cuobjdump -sass`; address and encoding comments are stripped, so two trees agree when
their instruction streams are the same even where line tables differ.

    # in each tree (the other tree through PYTHONPATH=<tree>/packages/*/src):
    uv run python bench/sass_identity.py cores OUT_cores.json      # SmolLM2 cores' cubins
    uv run python bench/sass_identity.py packed OUT_packed.json    # the 8B packed variants
    uv run python bench/sass_identity.py compare A.json B.json

`cores` exports SmolLM2 with `--target sm_90` for the default and the serving-bench recipe
and records each kernel binary's sha256 and SASS digest; `packed` compiles the f32
packed-path variants of the 8B matrices (linear_packed's K split and TC tiles, the
prefill TC `linear`, split_bf16 / swiglu_split_bf16 / splitk_reduce) at 8-1,024 rows as
capture's launch rule picks them. Figures only; nothing here is asserted on.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

REPO = Path(__file__).resolve().parent.parent
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
RECIPES = ("smollm2_135m_instruct", "llama_serving_bench")
# The 8B's (N, K): qkv, o, gate_up, down, LM head.
MATRICES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096))


def sass_digest(binary: bytes) -> tuple[str, int]:
    """md5 of a cubin's SASS instructions (comments holding addresses and encodings
    dropped) and the instruction line count."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary)
        f.flush()
        out = subprocess.run([str(CUOBJDUMP), "-sass", f.name], capture_output=True,
                             text=True, check=True).stdout
    lines = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line) for line in out.splitlines()
             if line.strip() and "Function" not in line and "code for" not in line]
    return hashlib.md5("\n".join(lines).encode()).hexdigest(), len(lines)


def cores() -> dict:
    from helios_contract.schema import core_pb2
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair
    from helios_tools.core.reader import open_core_unverified

    result = {}
    with tempfile.TemporaryDirectory() as d:
        private, _ = write_key_pair(generate_key(), Path(d) / "k.key")
        for recipe in RECIPES:
            core = Path(d) / f"{recipe}.core"
            export_core(REPO / "recipes" / f"{recipe}.py", checkpoint="smollm2",
                        key_path=private, namespace="helios.bench/sass", out=core,
                        targets=("sm_90",))
            reader = open_core_unverified(core)
            for rid, res in reader.resources.items():
                if res.kind == core_pb2.RESOURCE_KIND_KERNEL_BINARY:
                    blob = reader.read_resource(rid)
                    result[f"{recipe}:{rid}"] = [hashlib.sha256(blob).hexdigest()[:16],
                                                 *sass_digest(blob)]
    return result


def packed() -> dict:
    from helios_ignition.capture.launch import launch_config, mma_plan
    from helios_ignition.kernels_aot import compile_variant

    class View:  # a weight view of dtype `dtype`, as launch_config reads it
        def __init__(self, dtype):
            self.shape, self.buffer = (), type("D", (), {"dtype": dtype})()

    variants = {}

    def add(op, scalars, views=()):
        c = launch_config(op, scalars, views)
        name = f"{op}:" + ",".join(f"{k}={v}" for k, v in sorted(c.constants.items()))
        variants[name] = (op, dict(c.constants))

    for rows in (8, 16, 32, 64, 96, 128, 160, 192, 224, 256, 512, 1024):
        for n, k in MATRICES:
            if (slices := mma_plan(rows, n, k)) is not None:
                add("linear_packed", [rows, n, k, slices], [None, View("bf16")])
                add("splitk_reduce", [rows, n, slices])
        add("split_bf16", [rows, 4096])
        add("swiglu_split_bf16", [rows, 14336])
    add("linear", [1024, 6144, 4096], [None, View("bf16"), None])
    return {name: list(sass_digest(compile_variant(op, c, "sm_90").binary))
            for name, (op, c) in sorted(variants.items())}


def compare(a: dict, b: dict) -> None:
    keys = sorted(set(a) | set(b))
    both = [k for k in keys if k in a and k in b]
    with_bytes = len(next(iter(a.values()))) == 3  # cores: [sha256, SASS md5, lines]
    digest = 1 if with_bytes else 0
    same_sass = [k for k in both if a[k][digest] == b[k][digest]]
    same_bytes = sum(1 for k in both if a[k][0] == b[k][0]) if with_bytes else "-"
    print(f"{len(keys)} variants, {len(a)} / {len(b)} in each, {same_bytes} identical "
          f"bytes, {len(same_sass)} identical SASS")
    for k in keys:
        if k not in same_sass:
            print("differs or missing:", k)


def main() -> None:
    mode, *paths = sys.argv[1:]
    if mode == "compare":
        compare(*(json.loads(Path(p).read_text()) for p in paths))
        return
    result = {"cores": cores, "packed": packed}[mode]()
    Path(paths[0]).write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{len(result)} variants -> {paths[0]}")


if __name__ == "__main__":
    main()
