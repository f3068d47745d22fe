"""Print the sha256 (first 16 hex digits) of the sm_90 cubins of the decode and prefill
attention kernels at the launch rule's default constants, one tuple per variant (no GPU).

Run in each tree with line info off, the other tree's packages first on PYTHONPATH, and
diff the outputs (bench/results/sass_23f0ce6/README.md):

    TRITON_DISABLE_LINE_INFO=1 uv run python attention_8b_default_cubins.py > head.txt
"""

from __future__ import annotations

import hashlib

from helios_ignition.capture import launch
from helios_ignition.capture.buffers import decode_splits
from helios_ignition.kernels_aot import compile_variant

DECODE_CASES = [(256, 4096, (32, 8, 128)), (1, 4096, (32, 8, 128)),
                (64, 16384, (32, 8, 128)), (64, 4096, (9, 3, 64))]  # rows, capacity, geometry
PREFILL_CASES = [(64, 8, 32, 8, 128), (512, 256, 9, 3, 64)]  # T, R, H, KVH, HD


def main() -> None:
    launch.ATTN_LIVE, launch.ATTN_LIVE_MIN_ROWS = 4096, 1  # the committed defaults
    out = []
    for op in ["attention_decode_split", "attention_decode_split_bf16kv"]:
        for rows, cap, (H, KVH, HD) in DECODE_CASES:
            ns, split = decode_splits(cap)
            c = launch.launch_config(op, [rows, cap // 16, 16, H, KVH, HD, ns, split,
                                          0.125]).constants
            ck = compile_variant(op, c, "sm_90")
            out.append((op, rows, cap, H, sorted(c.items()),
                        hashlib.sha256(ck.binary).hexdigest()[:16]))
    for op in ["attention_prefill", "attention_prefill_bf16kv", "attention_prefill_window"]:
        for T, R, H, KVH, HD in PREFILL_CASES:
            w = [0] if "window" in op else []
            c = launch.launch_config(op, [T, R, 256, 16, H, KVH, HD, *w, 0.125]).constants
            ck = compile_variant(op, c, "sm_90")
            out.append((op, T, R, H, sorted(c.items()),
                        hashlib.sha256(ck.binary).hexdigest()[:16]))
    for row in out:
        print(row)


if __name__ == "__main__":
    main()
