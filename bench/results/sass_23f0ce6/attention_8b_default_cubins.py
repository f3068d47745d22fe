import hashlib, sys
from helios_ignition.capture import launch
from helios_ignition.capture.buffers import decode_splits
from helios_ignition.kernels_aot import compile_variant
launch.ATTN_LIVE, launch.ATTN_LIVE_MIN_ROWS = 4096, 1
out = []
for op in ["attention_decode_split", "attention_decode_split_bf16kv"]:
    for rows, cap, (H, KVH, HD) in [(256, 4096, (32, 8, 128)), (1, 4096, (32, 8, 128)), (64, 16384, (32, 8, 128)), (64, 4096, (9, 3, 64))]:
        ns, split = decode_splits(cap)
        c = launch.launch_config(op, [rows, cap // 16, 16, H, KVH, HD, ns, split, 0.125]).constants
        ck = compile_variant(op, c, "sm_90")
        out.append((op, rows, cap, H, sorted(c.items()), hashlib.sha256(ck.binary).hexdigest()[:16]))
for op in ["attention_prefill", "attention_prefill_bf16kv", "attention_prefill_window"]:
    for T, R, H, KVH, HD in [(64, 8, 32, 8, 128), (512, 256, 9, 3, 64)]:
        w = [0] if "window" in op else []
        c = launch.launch_config(op, [T, R, 256, 16, H, KVH, HD, *w, 0.125]).constants
        ck = compile_variant(op, c, "sm_90")
        out.append((op, T, R, H, sorted(c.items()), hashlib.sha256(ck.binary).hexdigest()[:16]))
for o in out: print(o)
