"""One MIXED step of the Llama-3.1-8B geometry in isolation, per op, beside the DECODE and
PREFILL steps it combines (issue 27: docs/mixed.md, "A model of the rule").

    HELIOS_COMMIT=<sha> python bench/gpu_mixed_step.py --json OUT.json

The served 1024/1024 run at C256 on the H100 (bench/results/h100_2026-12-06k) implied a
MIXED step of ~313 ms at ~140-220 decode lanes and a 512-token budget, where a DECODE
step at 256 rows took ~44-75 ms. This script times each step kind alone, with the
serving-bench recipe's options (recipes/llama_serving_bench.py: bf16 activations; the
bf16 KV cache of ``ignition export --kv-cache-dtype bf16``; its prefill row capacity,
context and MIXED token budgets; of its decode buckets, those the steps run and the
largest; its prefill capacities plus the budgets), seeded random bf16 weights
(bench/gpu_common.py), the core built in memory and compiled for this GPU:

- ``decode_bB``: a DECODE step of B rows, every row at ``--context`` positions;
- ``mixed_bB_tT``: a MIXED step of the same B decode lanes (one token each at
  ``--context`` positions) plus prompt chunks filling the budget T (T - B tokens);
- ``lanes_bB``: a MIXED step of the B lanes alone, in the smallest budget's program
  holding B rows (its attention is the lane programs only: the difference to
  ``mixed_bB_tT`` is the chunks' share; its program may be a smaller bucket's);
- ``prefill_tT``: a PREFILL step of the same chunks as ``mixed_b0_tT``, T tokens alone.

Prompt chunks (``chunks``): prompts of ``--prompt`` tokens (the served workload's 1,024);
the first chunk starts mid-prompt (position prompt / 2, to the prompt's end), the next
ones are whole prompts from position 0, the last one cut to what the budget leaves. So
at B = 224 and T = 512 the step holds 224 lanes and one 288-token chunk at positions
512..799; at T = 2,048 chunks of 512, 1,024 and 288 tokens.

A step's KV pages hold zeros (the cuda backend clears every non-weight buffer at load),
which costs attention what real keys cost: its time depends on the positions read, not
their values, so no prompt is prefilled first. Each row owns ``pages_per_row`` pages
(its slot's window of the page pool: ceil(max(context + 1, prompt) / page_tokens)) and
the KV cache is sized to exactly the rows' pages (``CacheSizing(num_pages=...)``): at
B = 256 and 1,500 positions 24,064 pages of 16 tokens, 47 GiB of bf16 K and V, which an
H100 holds beside the 15 GiB of weights (rows of 2,048 positions would need 64 GiB: the
H100 holds ~224 of them; ``--context`` chooses).

Per step (cuda): ``device_ms``, back-to-back replays of the step's captured graph with
no host work between (the plan executed twice first, so both frames hold its inputs);
``execute_ms``, NativeModel.execute (pack + launch + wait) median; and the breakdown of
bench/gpu_decode_breakdown.py (``profile_groups``: each launch group, an op and its
integer scalars, replayed as its own graph) by op class and by group. A MIXED step's
attention is one ``attention_prefill*`` launch per layer whose grid holds the block
programs (prompt chunks) then one lane program per decode lane
(kernels_triton/attention.py, ``_prefill_block``): its group is that op; ``lanes_bB``
against ``mixed_bB_tT`` splits it. On the cpu backend (``--backend cpu``, a smoke test
of the plans: ``--geometry smollm2-135m`` and small numbers) only ``execute_ms`` is
measured. ``--dry-run``: capture and compile for ``--target`` only (no GPU).
``HELIOS_ATTN_MMA=2`` in the environment puts the decode steps' split attention and the
MIXED steps' lane programs on the tensor-core body (docs/gpu.md); ``attn_mma`` in the JSON
says which ran.

Run time (estimated, not yet run on a GPU): ~1 min to build and load (34 kernels compile
in ~20 s cold on 2 CPU cores; 15 GiB of weights uploaded), then at most ~6 s a step
(replays capped at ~1.5 s, groups at ~3-20 replays): ~3 min for the twelve default steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, write_json  # bench/ is this script's folder
from gpu_common import (  # noqa: E402
    build_core,
    device_target,
    geometry_checkpoint,
    random_bf16_weights,
)
from gpu_decode_breakdown import profile_groups  # noqa: E402
from helios_ignition.capture import launch  # noqa: E402
from helios_ignition.checkpoint.synthetic import NAMED_GEOMETRIES  # noqa: E402
from helios_ignition.export import resolve_recipe  # noqa: E402
from helios_ignition.families.llama import LlamaShapes  # noqa: E402
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan  # noqa: E402
from helios_serve.runtime.cache_sizing import CacheSizing  # noqa: E402
from helios_serve.testing.native import load_native  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes/llama_serving_bench.py"
GREEDY = SamplingParams()
LANE_TOKEN = 1000  # a MIXED lane's completed pending token (any id below the vocabulary)


def chunks(budget: int, prompt: int) -> list[tuple[int, int]]:
    """(start position, tokens) of the prompt chunks filling `budget` tokens (module
    docstring): the first from mid-prompt to its end, then whole prompts, the last cut."""
    out, left, start = [], budget, prompt // 2
    while left > 0:
        n = min(left, prompt - start)
        out.append((start, n))
        left -= n
        start = 0
    return out


def bucket(buckets: tuple[int, ...], rows: int) -> int | None:
    """The smallest decode bucket holding `rows` (None: none does)."""
    return next((b for b in buckets if b >= rows), None)


class Steps:
    """Plans over a page pool where slot s owns pages [s * per, (s + 1) * per)."""

    def __init__(self, context: int, prompt: int, page_tokens: int) -> None:
        self.context, self.prompt, self.page = context, prompt, page_tokens
        self.per = -(-max(context + 1, prompt) // page_tokens)

    def _pages(self, slot: int, end: int) -> tuple[int, ...]:
        return tuple(range(slot * self.per, slot * self.per + -(-end // self.page)))

    def lanes(self, b: int, token: int) -> list[RowPlan]:
        """`b` one-token rows at `context` positions (slots 0..b-1); token -1: the
        device-owned pending token (DECODE)."""
        return [RowPlan(request_id=s, slot=s, generation=1, tokens=(token,),
                        start_position=self.context, page_ids=self._pages(s, self.context + 1),
                        sample=True, sampling=GREEDY) for s in range(b)]

    def chunk_rows(self, first_slot: int, budget: int) -> list[RowPlan]:
        rows = []
        for i, (start, n) in enumerate(chunks(budget, self.prompt)):
            slot = first_slot + i
            toks = tuple(3 + (slot * 7919 + p) % 30000 for p in range(start, start + n))
            rows.append(RowPlan(request_id=slot, slot=slot, generation=1, tokens=toks,
                                start_position=start, page_ids=self._pages(slot, start + n),
                                sample=start + n == self.prompt, sampling=GREEDY,
                                histogram_tokens=toks if start == 0 else None))
        return rows

    def decode(self, b: int) -> StepPlan:
        return StepPlan(StepKind.DECODE, tuple(self.lanes(b, -1)))

    def mixed(self, b: int, budget: int, fill: bool = True) -> StepPlan:
        """B lanes plus chunks of `budget - b` tokens (with `fill`; else the lanes alone)."""
        rows = self.lanes(b, LANE_TOKEN) + (self.chunk_rows(b, budget - b) if fill else [])
        return StepPlan(StepKind.MIXED, tuple(rows), lanes=b, token_budget=budget)

    def prefill(self, budget: int) -> StepPlan:
        return StepPlan(StepKind.PREFILL, tuple(self.chunk_rows(0, budget)))


def cases(steps: Steps, batches: list[int], budgets: list[int], buckets: tuple[int, ...]
          ) -> list[tuple[str, StepPlan]]:
    """Every step this run times, in order (module docstring); a MIXED step whose rows no
    decode bucket holds (B = 256: 257 rows) is left out and said so."""
    out = []
    for b in batches:
        out.append((f"decode_b{b}", steps.decode(b)))
    for b in batches:
        for t in budgets:
            if t <= b:
                continue
            plan = steps.mixed(b, t)
            if bucket(buckets, len(plan.rows)) is None:
                print(f"mixed_b{b}_t{t}: {len(plan.rows)} rows, no decode bucket holds them: "
                      "left out", flush=True)
                continue
            out.append((f"mixed_b{b}_t{t}", plan))
        holding = [t for t in budgets if t >= b]
        if holding:
            out.append((f"lanes_b{b}", steps.mixed(b, holding[0], fill=False)))
    for t in budgets:
        out.append((f"prefill_t{t}", steps.prefill(t)))
    return out


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(model, plan: StepPlan, vocab: int, cuda: bool) -> dict:
    """One step's figures (module docstring)."""
    ticket = model.submit(plan)
    model.wait(ticket)
    entry = dict(graph=ticket.graph, rows=len(plan.rows), tokens=plan.token_count,
                 lanes=plan.lanes)
    if not cuda:
        entry["execute_ms"] = median_ms(lambda: model.execute(plan), 1)
        return entry
    model.execute(plan)  # the other frame
    entry["execute_ms"] = median_ms(lambda: model.execute(plan), 3)
    backend = model.backend
    backend.synchronize()
    probe = median_ms(lambda: (backend.launch_only(ticket.graph), backend.synchronize()), 2)
    reps = max(3, min(50, round(1500 / max(probe, 0.1))))
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        backend.launch_only(ticket.graph)
    backend.synchronize()
    entry["device_ms"] = (time.perf_counter() - t0) / reps * 1e3
    entry["device_reps"] = reps
    groups = profile_groups(backend, ticket.graph, vocab,
                            reps=max(3, min(20, round(1000 / max(probe, 0.1)))))
    classes: dict[str, float] = {}
    for g in groups:
        classes[g["cls"]] = classes.get(g["cls"], 0.0) + g["ms"]
    entry["breakdown"] = dict(sum_ms=sum(classes.values()), classes=classes,
                              groups=sorted(groups, key=lambda g: -g["ms"]))
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--geometry", default="llama-3.1-8b", choices=sorted(NAMED_GEOMETRIES))
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 224, 256],
                    help="decode rows / MIXED lanes")
    ap.add_argument("--budgets", type=int, nargs="+", default=None,
                    help="MIXED token budgets (default: the recipe's mixed_tokens)")
    ap.add_argument("--context", type=int, default=1500, help="positions of every lane")
    ap.add_argument("--prompt", type=int, default=1024, help="tokens of a chunk's prompt")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--target", default=None,
                    help="compile target (default: this GPU's; --dry-run: sm_90)")
    ap.add_argument("--dry-run", action="store_true",
                    help="capture, plan and compile for --target only (no GPU)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these step names")
    ap.add_argument("--json")
    args = ap.parse_args()
    t_start = time.perf_counter()
    cuda = args.backend == "cuda" and not args.dry_run
    target = args.target
    if args.dry_run:
        target = target or "sm_90"
    elif cuda and target is None:
        target = device_target()
    geometry = NAMED_GEOMETRIES[args.geometry]
    ckpt = geometry_checkpoint(geometry, args.geometry)
    recipe = resolve_recipe(RECIPE, ckpt)
    rc = recipe.capacities
    budgets = sorted(args.budgets or rc.mixed_tokens)
    steps = Steps(args.context, args.prompt, rc.page_tokens)
    if steps.per > rc.context_tokens // rc.page_tokens:
        ap.error(f"--context {args.context} / --prompt {args.prompt} need {steps.per} pages "
                 f"a row; the recipe's context holds {rc.context_tokens // rc.page_tokens}")
    plans = cases(steps, args.batches, budgets, rc.decode_batch)
    if args.only:
        plans = [(n, p) for n, p in plans if n in args.only]
    # Only the decode buckets the steps run and the largest (the page table's rows, so
    # the slot count) are captured: each program's launches are those of the recipe's
    # full core (compared launch by launch at the 8B geometry), with fewer graphs to
    # compile and load. The prefill capacities add the budgets, so a
    # PREFILL step of T tokens runs a T-token program as the MIXED one does. The prepared
    # pages stay the recipe's (the cache planes' declared shape); the load sizes the cache
    # to `pages`.
    used = sorted({max(rc.decode_batch)} | {bucket(rc.decode_batch, len(p.rows))
                                            for _, p in plans if p.kind is not StepKind.PREFILL})
    slots = max(p.rows[-1].slot for _, p in plans) + 1
    pages = slots * steps.per
    caps = replace(rc, decode_batch=tuple(used),
                   prefill_tokens=tuple(sorted({*rc.prefill_tokens, *budgets})),
                   mixed_tokens=tuple(budgets))
    shapes = LlamaShapes.from_geometry(geometry)
    result = dict(commit=git_commit(), geometry=args.geometry, backend=args.backend,
                  target=target, context=args.context, prompt=args.prompt,
                  batches=args.batches, budgets=budgets, pages_per_row=steps.per,
                  num_pages=pages, page_tokens=rc.page_tokens,
                  capacities=dict(decode_batch=list(caps.decode_batch),
                                  prefill_tokens=list(caps.prefill_tokens),
                                  prefill_rows=caps.prefill_rows,
                                  context_tokens=caps.context_tokens,
                                  mixed_tokens=list(caps.mixed_tokens)),
                  activations=recipe.activation_dtype, kv_cache="bf16",
                  attn_mma=launch.ATTN_MMA, steps=[])
    print(f"{args.geometry}: {len(plans)} steps, decode buckets {list(caps.decode_batch)}, "
          f"{pages} pages ({steps.per} a row, {slots} rows)", flush=True)
    weights = random_bf16_weights(shapes, 0, geometry.rope_scaling)
    core, info = build_core(recipe, ckpt, caps, None if args.backend == "cpu" else target,
                            weights, activations=recipe.activation_dtype, kv_cache="bf16")
    result.update(capture_s=info["capture_s"], compile_s=info["compile_s"],
                  kernels=info["kernels"])
    print(f"captured in {info['capture_s']:.1f} s, compiled {info['kernels']} kernels in "
          f"{info['compile_s']:.1f} s", flush=True)
    if args.dry_run:
        mixed = [g for g in core.manifest.graphs if g.name.startswith("mixed")]
        result["graphs"] = info["graphs"]
        print(f"dry run: {len(info['graphs'])} graphs ({len(mixed)} mixed); the steps: "
              + ", ".join(f"{n} ({len(p.rows)} rows, {p.token_count} tokens)"
                          for n, p in plans), flush=True)
        if args.json:
            write_json(args.json, result)
        return
    t0 = time.perf_counter()
    model = load_native(core, args.backend, cache=CacheSizing(num_pages=pages))
    result["load_s"] = time.perf_counter() - t0
    result["device"] = getattr(model.backend, "device_name", args.backend)
    print(f"loaded in {result['load_s']:.1f} s on {result['device']}", flush=True)
    try:
        for name, plan in plans:
            entry = dict(name=name, kind=plan.kind.value,
                         **measure(model, plan, shapes.vocab, cuda))
            result["steps"].append(entry)
            dev = f", device {entry['device_ms']:.2f} ms" if "device_ms" in entry else ""
            print(f"{name:18} {entry['graph']:18} rows {entry['rows']:>3} tokens "
                  f"{entry['tokens']:>4}: execute {entry['execute_ms']:.2f} ms{dev}",
                  flush=True)
    finally:
        model.close()
    result["total_s"] = time.perf_counter() - t_start
    report(result)
    if args.json:
        write_json(args.json, result)


def report(result: dict) -> None:
    """A table of device ms by op class per step, then each step's top launch groups."""
    print(f"\n{result['geometry']} on {result.get('device')}, commit {result['commit']}, "
          f"lanes at {result['context']} positions, {result['total_s']:.0f} s in all")
    timed = [s for s in result["steps"] if "breakdown" in s]
    if not timed:
        return
    classes = sorted({c for s in timed for c in s["breakdown"]["classes"]})
    print(f"{'step':18} {'graph':18} {'device':>8} {'sum':>8} "
          + " ".join(f"{c:>10}" for c in classes))
    for s in timed:
        bd = s["breakdown"]
        print(f"{s['name']:18} {s['graph']:18} {s['device_ms']:8.2f} {bd['sum_ms']:8.2f} "
              + " ".join(f"{bd['classes'].get(c, 0.0):10.2f}" for c in classes))
    for s in timed:
        print(f"\n{s['name']} ({s['graph']}): top launch groups")
        for g in s["breakdown"]["groups"][:10]:
            print(f"  {g['op']:30} {str(g['scalars'])[:44]:44} x{g['launches']:<3} "
                  f"{g['ms']:8.3f} ms")


if __name__ == "__main__":
    main()
