"""Pick the batched-decode GEMM launch rule from a bench/gpu_mma_sweep.py JSON.

    python bench/gpu_mma_pick.py RESULT.json

For each (matrix, M): today's time, the fastest verified (finite, bitwise repeatable,
rel < 5e-5) packed sequence and its tile + S, and whether it beats today. Verified means
what the sweep checked on the device; the choice prints as the ``launch._MMA_TILES``
rows it implies.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    d = json.loads(open(sys.argv[1]).read())
    tol = d.get("tolerance_rel", 5e-5)
    rows = d["rows"]

    def ok(r):
        return r["finite"] and r["deterministic"] and r["rel"] < tol

    cells = sorted({(r["mat"], r["M"]) for r in rows}, key=lambda c: (c[1], c[0]))
    table = []
    print(f"{'matrix':8} {'M':>3} {'today us':>9} {'packed us':>9} {'x':>5}  tile (BT BN BK W ST) S"
          "   TB/s  max_abs")
    for mat, M in cells:
        mine = [r for r in rows if (r["mat"], r["M"]) == (mat, M)]
        base = next(r for r in mine if r["kind"] == "today")
        packed = sorted((r for r in mine if r["kind"] == "packed" and ok(r)),
                        key=lambda r: r["us"])
        if not packed:
            print(f"{mat:8} {M:3} {base['us']:9.1f}   no verified packed row")
            table.append(f"    ({base['N']}, {base['K']}, {M}): None,  # {mat}: no verified row")
            continue
        p = packed[0]
        c = p["constants"]
        x = base["us"] / p["us"]
        table.append(f"    ({base['N']}, {base['K']}, {M}): " + (
            f"({c['BLOCK_T']}, {c['BLOCK_N']}, {c['BLOCK_K']}, {c['WARPS']}, {c['STAGES']}, "
            f"{p['S']}),  # {mat} x{x:.2f}" if x > 1 else f"None,  # {mat}: linear x{1 / x:.2f}"))
        print(f"{mat:8} {M:3} {base['us']:9.1f} {p['us']:9.1f} {base['us'] / p['us']:5.2f}  "
              f"({c['BLOCK_T']:3} {c['BLOCK_N']:3} {c['BLOCK_K']:3} {c['WARPS']} {c['STAGES']})"
              f" {p['S']:2} {p['TBps']:6.2f} {p['max_abs']:.1e}")
    print("_MMA_TILES = {")
    print("\n".join(table))
    print("}")


if __name__ == "__main__":
    main()
