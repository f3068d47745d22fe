"""Make tests/golden/smollm2_goldens.json with HF transformers (an independent implementation).

Run it in a throwaway environment OUTSIDE the repository (torch is never a project
dependency; pip takes the CPU torch wheel from local disk):

    python3.11 -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch==2.13.0 transformers gguf numpy
    GGUF=$(cd /work/main && uv run python -c \
        "from helios_ignition.checkpoint import smollm2_gguf_path; print(smollm2_gguf_path())")
    /tmp/hfenv/bin/python tests/golden/make_goldens.py "$GGUF" tests/golden/smollm2_goldens.json

What it records, per prompt (float32 model, transformers' own GGUF loader and tokenizer):
the chat-templated prompt text (`apply_chat_template(tokenize=False,
add_generation_prompt=True)`), its token ids, the last-position top-5 ids and logits, the
logits of 20 fixed token ids at the last position, and 32 greedy steps (EOS does not stop
the loop) with the chosen id, its logit and the top-1 minus top-2 margin at each step.
`teacher_forcing_ids` = prompt ids + greedy ids: feeding it in one forward pass gives, at
position len(prompt)-1+k, the logits of greedy step k.
"""

from __future__ import annotations

import json
import os
import platform
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
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
FIXED_TOKEN_IDS = [0, 1, 2, 3, 17, 100, 256, 504, 1000, 2016, 4096, 7000, 9906, 12345, 20000,
                   25565, 31337, 40000, 45000, 49151]
GREEDY_STEPS = 32
TOP_K = 5


def main(gguf_path: str, out_path: str) -> None:
    torch.manual_seed(0)
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "generator": {
            "script": "tests/golden/make_goldens.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "dtype": "float32",
        },
        "fixed_token_ids": FIXED_TOKEN_IDS,
        "greedy_steps": GREEDY_STEPS,
        "eos_token_id": int(tok.eos_token_id),
        "prompts": [],
    }
    for prompt in PROMPTS:
        text = tok.apply_chat_template(prompt["messages"], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            result = model(torch.tensor([ids]), use_cache=True)
            last = result.logits[0, -1].float().numpy()
            past = result.past_key_values
            top = np.argsort(-last, kind="stable")[:TOP_K]
            greedy_ids, greedy_logits, margins = [], [], []
            logits = last
            for _ in range(GREEDY_STEPS):
                order = np.argsort(-logits, kind="stable")[:2]
                nxt = int(order[0])
                greedy_ids.append(nxt)
                greedy_logits.append(float(logits[nxt]))
                margins.append(float(logits[order[0]] - logits[order[1]]))
                step = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = step.past_key_values
                logits = step.logits[0, -1].float().numpy()
        eos = int(tok.eos_token_id)
        out["prompts"].append({
            "name": prompt["name"],
            "messages": prompt["messages"],
            "rendered": text,
            "prompt_ids": [int(i) for i in ids],
            "last_top5_ids": [int(i) for i in top],
            "last_top5_logits": [float(last[i]) for i in top],
            "last_fixed_logits": [float(last[i]) for i in FIXED_TOKEN_IDS],
            "greedy_ids": greedy_ids,
            "greedy_logits": greedy_logits,
            "greedy_margins": margins,
            "greedy_text": tok.decode(greedy_ids),
            "first_eos_step": greedy_ids.index(eos) if eos in greedy_ids else None,
            "teacher_forcing_ids": [int(i) for i in ids] + greedy_ids,
        })
        print(prompt["name"], repr(tok.decode(greedy_ids)), file=sys.stderr)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
