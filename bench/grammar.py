"""Grammar-constrained decoding cost: llguidance masks on the real tokenizer, CPU backend.

Serves nothing: loads a core of recipes/smollm2_135m_instruct_tools.py into a NativeModel
on the CPU backend and drives prefill + decode directly (as `runtime.driver` does), with
the JSON-schema grammar of a response_format request built by the frontend's
`GrammarCompiler` from the core's own tokenizer and syntax. Each constrained row's mask is
filled per step into `RowPlan.grammar_mask` (as the worker's `_with_masks` does), the
backend applies it through the GRAMMAR_MASK binding, and the sampled token advances the
matcher.

    mask us         GrammarState.fill_mask for one row, per token (llguidance compute_mask
                    over the 49152-token vocabulary), measured by replaying the generated
                    documents through fresh grammar states with no model running in
                    between; the first mask of a document is reported apart
    advance us      GrammarState.advance (consume_token), per token, same replay
    tok/s           rows / median decode step time; a constrained step includes filling
                    every row's mask and advancing every row's matcher
    ratio           constrained tok/s / unconstrained tok/s (same batch, prompts, seeds)

Two decoding modes: greedy (temperature 0: the constraint's cost is masks + advance +
the masked argmax) and sampled (temperature 0.8, top_p 0.95, a seed per row; the NumPy
reference sampler's nucleus search is cheaper when the mask leaves few candidates, so
constrained sampling can cost less per step than free sampling on this backend). The
unconstrained and the constrained stream of a configuration occupy different slots and
decode step by step in alternation (the order flips every step), so load swings of a
shared machine hit both alike; per-step medians are reported. A row whose document is
finished (EOS consumed) restarts with a new grammar state outside the timed region, so
every timed step is a live constrained step.

Run: `cd /work/main && uv run python bench/grammar.py [--steps 24] [--batches 1 8]
[--core C --trust PUB --accept NS]` -> prints a table and writes
bench/out/grammar.json. Without --core it exports the tools recipe once (its bf16 weights)
into bench/out/grammar-core/ with a local key. Figures only; never asserted on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from _report import write_json  # bench/ is this script's folder

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out" / "grammar.json"
RECIPE = REPO / "recipes" / "smollm2_135m_instruct_tools.py"
NAMESPACE = "helios.bench/local"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "hobbies", "employed"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
# One prompt per row (row i uses PROMPTS[i % 8]) so greedy rows differ too.
PROMPTS = [
    f"Invent {who} and describe them as JSON with name, age, city, hobbies and employed."
    for who in (
        "a person", "a retired sailor", "a young painter", "a chess champion",
        "a baker from Lyon", "a software engineer", "a farmer", "a jazz musician",
    )
]  # fmt: skip
MODES = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.8, "top_p": 0.95}}


def default_core() -> tuple[Path, Path, str]:
    """Export the tools recipe once into bench/out/grammar-core/: (core, public key, ns)."""
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair

    folder = HERE / "out" / "grammar-core"
    core, public = folder / "smollm2-tools.core", folder / "publisher.key.pub"
    if core.is_file() and public.is_file():
        return core, public, NAMESPACE
    folder.mkdir(parents=True, exist_ok=True)
    private, public = write_key_pair(generate_key(), folder / "publisher.key")
    print(f"exporting {RECIPE.name} once into {folder} ...", flush=True)
    export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE, out=core)
    return core, public, NAMESPACE


def p99(values: list[float]) -> float:
    return float(np.percentile(np.asarray(values), 99)) if values else float("nan")


class Stream:
    """`rows` requests decoding together on slots [first_slot, first_slot + rows), with or
    without a grammar state per row; slot s owns pages [s * per_slot, (s + 1) * per_slot)."""

    def __init__(self, bench: Bench, rows: int, first_slot: int, mode: str, constrained: bool):
        from helios_serve.engine.plan import SamplingParams

        g = bench.model.manifests
        self.bench, self.model, self.g = bench, bench.model, g
        self.per_slot = min(g.max_pages_per_request, g.num_pages // g.slots)
        self.slots = list(range(first_slot, first_slot + rows))
        self.tokens = [list(bench.prompts[i % len(PROMPTS)]) for i in range(rows)]  # consumed
        self.sampling = [SamplingParams(seed=1000 + i, **MODES[mode]) for i in range(rows)]
        bench.generation += 1
        self.generation = bench.generation
        self.states = [bench.new_state(i) if constrained else None for i in range(rows)]
        self.docs: list[list[int]] = [[] for _ in range(rows)]
        words = g.mask_words
        self.masks = [np.zeros(words, dtype=np.int32) if constrained else None for _ in range(rows)]
        self.rejected = 0
        self.fed: list[int] = []

    def _pages(self, slot: int, length_tokens: int) -> tuple[int, ...]:
        count = -(-length_tokens // self.g.page_tokens)
        return tuple(range(slot * self.per_slot, slot * self.per_slot + count))

    def _fill(self) -> None:
        for state, mask in zip(self.states, self.masks, strict=True):
            if state is not None:
                state.fill_mask(mask)

    def _advance(self, sampled) -> None:
        self.fed = [int(t) for t in sampled]
        for i, (state, tok) in enumerate(zip(self.states, self.fed, strict=True)):
            if state is not None:
                self.rejected += not state.advance(tok)
                self.docs[i].append(tok)

    def prefill(self) -> None:
        """Prefill every row's prompt (one chunk each), sampling its first token."""
        from helios_serve.engine.plan import RowPlan, StepKind, StepPlan

        chunk = max(self.g.prefill_token_capacities)
        self._fill()
        first = []
        for i, (slot, prompt) in enumerate(zip(self.slots, self.tokens, strict=True)):
            if len(prompt) > chunk:
                raise ValueError(f"prompt of {len(prompt)} tokens exceeds one {chunk}-token chunk")
            row = RowPlan(
                request_id=slot, slot=slot, generation=self.generation, tokens=tuple(prompt),
                start_position=0, page_ids=self._pages(slot, len(prompt)), sample=True,
                sampling=self.sampling[i], histogram_tokens=tuple(prompt),
                grammar_mask=self.masks[i],
            )  # fmt: skip
            first.append(int(self.model.execute(StepPlan(StepKind.PREFILL, (row,)))[0]))
        self._advance(first)

    def step(self) -> tuple[float, float]:
        """One timed decode step: masks, execute, advance. Returns (step_s, mask_s)."""
        from helios_serve.engine.plan import RowPlan, StepKind, StepPlan

        for i, state in enumerate(self.states):  # a finished document restarts, untimed
            if state is not None and state.is_terminated():
                self.bench.documents.append(self.docs[i])
                self.states[i], self.docs[i] = self.bench.new_state(i), []
        t0 = time.perf_counter()
        self._fill()
        t1 = time.perf_counter()
        rows = tuple(
            RowPlan(
                request_id=slot, slot=slot, generation=self.generation, tokens=(tok,),
                start_position=len(self.tokens[i]),
                page_ids=self._pages(slot, len(self.tokens[i]) + 1), sample=True,
                sampling=self.sampling[i], grammar_mask=self.masks[i],
            )  # fmt: skip
            for i, (slot, tok) in enumerate(zip(self.slots, self.fed, strict=True))
        )
        sampled = self.model.execute(StepPlan(StepKind.DECODE, rows))
        for i, tok in enumerate(self.fed):
            self.tokens[i].append(tok)
        self._advance(sampled)
        return time.perf_counter() - t0, t1 - t0

    def finish(self) -> None:
        self.bench.documents.extend(d for d in self.docs if d)


class Bench:
    """The loaded model, the grammar compiler and the rendered prompts."""

    def __init__(self, boot, model, compiler):
        from helios_tools.frontend_assets import render_chat

        self.model, self.compiler = model, compiler
        self.prompt_texts = [
            render_chat(boot.chat_template, [{"role": "user", "content": p}],
                        **boot.template_variables)
            for p in PROMPTS
        ]  # fmt: skip
        self.prompts = [
            boot.tokenizer.encode(t, add_special_tokens=False).ids for t in self.prompt_texts
        ]
        self.generation = 0
        self.documents: list[list[int]] = []  # constrained outputs, one per grammar state

    def new_state(self, row: int):
        text = self.prompt_texts[row % len(PROMPTS)]
        return self.compiler.for_request(response_format=RESPONSE_FORMAT, prompt_text=text)

    def pair(self, rows: int, steps: int, mode: str) -> dict:
        """An unconstrained and a constrained stream of `rows` rows, decoded step by step
        in alternation (the order flips every step), so load swings of a shared machine
        hit both alike; medians of the per-step times."""
        free = Stream(self, rows, 0, mode, constrained=False)
        json_ = Stream(self, rows, rows, mode, constrained=True)
        free.prefill()
        json_.prefill()
        times: dict[str, list[tuple[float, float]]] = {"unconstrained": [], "constrained": []}
        for k in range(steps):
            order = [("unconstrained", free), ("constrained", json_)]
            for key, stream in order if k % 2 == 0 else order[::-1]:
                times[key].append(stream.step())
        json_.finish()
        out: dict = {}
        for key, pairs in times.items():
            step_s = statistics.median(t for t, _ in pairs)
            out[key] = {
                "tokens_per_s": rows / step_s,
                "step_ms_median": step_s * 1e3,
                "step_ms_p90": float(np.percentile([t for t, _ in pairs], 90)) * 1e3,
                "mask_ms_per_step_median": statistics.median(m for _, m in pairs) * 1e3,
            }
        out["constrained"]["grammar_rejections"] = json_.rejected
        out["ratio"] = out["constrained"]["tokens_per_s"] / out["unconstrained"]["tokens_per_s"]
        return out

    def replay(self, times: int) -> dict:
        """Per-token mask and advance cost over the generated documents, model idle."""
        first_ns, fill_ns, advance_ns = [], [], []
        mask = np.zeros(self.model.manifests.mask_words, dtype=np.int32)
        for _ in range(times):
            for doc in self.documents:
                state = self.new_state(0)
                for k, tok in enumerate(doc):
                    t = time.perf_counter_ns()
                    state.fill_mask(mask)
                    t1 = time.perf_counter_ns()
                    ok = state.advance(tok)
                    t2 = time.perf_counter_ns()
                    (first_ns if k == 0 else fill_ns).append(t1 - t)
                    advance_ns.append(t2 - t1)
                    if not ok:
                        break
        return {
            "documents": len(self.documents),
            "tokens": sum(len(d) for d in self.documents),
            "replays": times,
            "mask_us_median": statistics.median(fill_ns) / 1e3,
            "mask_us_p99": p99(fill_ns) / 1e3,
            "first_mask_us_median": statistics.median(first_ns) / 1e3,
            "advance_us_median": statistics.median(advance_ns) / 1e3,
            "advance_us_p99": p99(advance_ns) / 1e3,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--core", help="core to load (default: export the tools recipe once)")
    parser.add_argument("--trust", help="publisher public key of --core")
    parser.add_argument("--accept", help="publisher namespace of --core")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()

    import llguidance
    from helios_serve.bootstrap import Bootstrap
    from helios_serve.frontend.grammar import GrammarCompiler
    from helios_serve.runtime.native_model import NativeModel

    if args.core:
        core, public, namespace = Path(args.core), Path(args.trust), args.accept
    else:
        core, public, namespace = default_core()
    boot = Bootstrap.load(core, [public], namespace)
    model = NativeModel.load(boot.prepared, boot.core.read_resource, "cpu",
                             max_concurrency=max(args.batches))
    g = model.manifests
    t = time.perf_counter()
    compiler = GrammarCompiler(boot.frontend, vocab_size=g.vocab_size)
    tokenizer_s = time.perf_counter() - t
    assert compiler.mask_words == g.mask_words, (compiler.mask_words, g.mask_words)
    bench = Bench(boot, model, compiler)
    compile_ms = []
    for i in range(8):
        t = time.perf_counter()
        bench.new_state(i)
        compile_ms.append((time.perf_counter() - t) * 1e3)

    result: dict = {
        "core": str(core),
        "served_id": boot.served_id,
        "weight_dtype": boot.contract.cache_identity.split("/")[1],
        "vocab_size": g.vocab_size,
        "mask_words": g.mask_words,
        "schema": SCHEMA,
        "steps": args.steps,
        "llg_tokenizer_ms": tokenizer_s * 1e3,
        "grammar_compile_ms_median": statistics.median(compile_ms),
        "decode": {},
    }
    if 2 * max(args.batches) > g.slots:
        raise SystemExit(f"--batches up to {g.slots // 2}: the pair needs two rows per slot")
    for mode in MODES:
        for rows in args.batches:
            bench.pair(rows, 2, mode)  # warm-up
            result["decode"][f"{mode}/{rows}"] = bench.pair(rows, args.steps, mode)
            print(f"  {mode} batch {rows}: done", flush=True)
    result["mask"] = bench.replay(times=3)
    sample = max(bench.documents, key=len, default=[])
    result["sample_document"] = boot.tokenizer.decode(sample, skip_special_tokens=False)
    result["host"] = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "llguidance": getattr(llguidance, "__version__", "?"),
        "loadavg_1m_after": os.getloadavg()[0],
    }
    model.close()
    boot.close()

    m = result["mask"]
    print(f"llguidance JSON-schema constraint on {boot.served_id} "
          f"({result['weight_dtype']}, CPU backend; vocab {g.vocab_size}, "
          f"{g.mask_words} mask words)")  # fmt: skip
    print(f"grammar compile {result['grammar_compile_ms_median']:.2f} ms/request (median), "
          f"llguidance tokenizer {tokenizer_s * 1e3:.0f} ms once at startup")  # fmt: skip
    print(f"per-token mask: median {m['mask_us_median']:.1f} us, p99 {m['mask_us_p99']:.1f} us "
          f"(first mask of a document: median {m['first_mask_us_median']:.1f} us); "
          f"advance median {m['advance_us_median']:.1f} us; "
          f"{m['tokens']} tokens x {m['replays']}")  # fmt: skip
    print(f"{'mode':<8} {'batch':>5} {'free tok/s':>11} {'json tok/s':>11} {'ratio':>7} "
          f"{'mask ms/step':>13} {'json step ms':>13}")  # fmt: skip
    for key, pair in result["decode"].items():
        mode, rows = key.split("/")
        c, u = pair["constrained"], pair["unconstrained"]
        print(f"{mode:<8} {rows:>5} {u['tokens_per_s']:>11.2f} {c['tokens_per_s']:>11.2f} "
              f"{pair['ratio']:>7.3f} {c['mask_ms_per_step_median']:>13.2f} "
              f"{c['step_ms_median']:>13.1f}")  # fmt: skip
    print(f"load average (1 min) after: {result['host']['loadavg_1m_after']:.2f} "
          f"on {os.cpu_count()} CPUs; medians of {args.steps} alternating decode steps")  # fmt: skip
    print(f"wrote {write_json(args.out, result, indent=2)}")


if __name__ == "__main__":
    main()
