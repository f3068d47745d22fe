"""bench/gpu_attention_live.py's variant table (CPU only, nothing compiled): the old grid
first, then each live layout x WARPS x BLOCK_N once, a BLOCK_N shorter than the split on
GROUPED=3 and marked ``reorders``, the skipped combinations named, the tensor-core
body's variants (bf16 planes only, their own bounds, the one-term form not servable),
the ``--quick`` preset's exact rows and kernels with flags beside it winning, and the
refusals of non-positive values, unknown plane dtypes and term counts."""

from __future__ import annotations

import pytest
from helios_ignition.capture import launch

from tests.bench.scripts import load_script


@pytest.fixture(scope="module")
def live():
    return load_script("gpu_attention_live.py")


def test_quick_preset_variants_at_256_rows(live):
    args = live.parse_args(["--quick"])
    vs, skipped = live.variants(256, 32, 8, 128, 4096, args.targets, args.warps, args.block_n)
    assert skipped == []
    assert [v.label for v in vs] == ["old"] + [
        f"live {t} L{n} W{w} N{bn}" for t, n in (("4096*", 2), ("2048", 1), ("8192", 4),
                                                 ("16384", 8))
        for bn in (64, 32) for w in (4, 8)]
    assert {(v.ns, v.split_len) for v in vs} == {(64, 64)}  # decode_splits(4096)
    assert vs[0].split == dict(BLOCK_N=64, BLOCK_HD=128, BLOCK_G=4, GROUPED=2, EVEN_HD=1,
                               WARPS=4)
    assert vs[3].split == dict(BLOCK_N=32, BLOCK_HD=128, BLOCK_G=4, GROUPED=3, EVEN_HD=1,
                               WARPS=4, LIVE=2)
    assert [v.reorders for v in vs[:5]] == [False, False, False, True, True]
    assert {v.reorders for v in vs} == {False, True}
    assert all(v.reorders == (v.split["BLOCK_N"] == 32) for v in vs)


def test_the_rule_default_is_among_the_variants_unchanged(live):
    vs, _ = live.variants(64, 32, 8, 128, 4096, [2048], [4, 8], [64])
    assert launch.ATTN_LIVE == 4096  # restored after the table
    launch.ATTN_LIVE_MIN_ROWS, saved = 1, launch.ATTN_LIVE_MIN_ROWS
    try:
        rule = launch.attention_split_constants(64, 32, 8, 128, 64, 64, "v3")
    finally:
        launch.ATTN_LIVE_MIN_ROWS = saved
    assert rule == dict(BLOCK_N=64, BLOCK_HD=128, BLOCK_G=4, GROUPED=2, EVEN_HD=1, WARPS=4,
                        LIVE=8)
    assert next(v for v in vs if v.label == "live 4096* L8 W4 N64").split == rule
    assert [v.label for v in vs] == ["old", "live 4096* L8 W4 N64", "live 4096* L8 W8 N64",
                                     "live 2048 L4 W4 N64", "live 2048 L4 W8 N64"]


def test_repeated_layouts_are_timed_once(live):
    # at one row every target gives LIVE = NS (32 at 2,048 positions): one live layout
    vs, _ = live.variants(1, 9, 3, 64, 2048, [1024, 2048, 8192], [4], [64])
    assert [v.label for v in vs] == ["old", "live 4096* L32 W4 N64"]


def test_block_n_longer_than_or_not_dividing_the_split_is_skipped(live):
    vs, skipped = live.variants(64, 32, 8, 128, 4096, [4096], [4], [128, 48, 16])
    assert skipped == ["BLOCK_N 128 at SPLIT 64: longer than a split",
                       "BLOCK_N 48 at SPLIT 64: does not divide a split"]
    assert [v.label for v in vs] == ["old", "live 4096* L8 W4 N16"]
    assert vs[1].split["GROUPED"] == 3 and vs[1].reorders
    # splits of 128 positions (16,384 of capacity): the old grid walks 64-position tiles
    # (GROUPED=3); a 128 tile is one a split (GROUPED=2) and reorders
    vs, skipped = live.variants(64, 32, 8, 128, 16384, [4096], [4], [64, 128])
    assert skipped == []
    assert [(v.split["BLOCK_N"], v.split["GROUPED"], v.reorders) for v in vs] == [
        (64, 3, False), (64, 3, False), (128, 2, True)]


def test_quick_table_counts_and_flags_beside_it_win(live):
    args = live.parse_args(["--quick"])
    allv, timed, skipped = live.variant_table(args)
    # the tensor-core kernels: LIVE 8 and 32 at 64 rows, 2 and 8 at 256 (8 shared) x WARPS
    # x BLOCK_N x terms
    assert {op: len(t) for op, t in allv.items()} == {
        "attention_decode_split": 25, "attention_decode_split_bf16kv": 25 + 3 * 8,
        "attention_decode_merge": 1}
    # rows x positions x (planes x FMA variants + the bf16 tensor-core ones)
    assert (timed, skipped) == (2 * 2 * (2 * 17 + 16), [])
    assert (args.budget_s, args.models, args.capacities) == (330, ["llama8b"], [4096])
    assert (args.mma_terms, args.mma_targets) == ([2, 1], [4096, 16384])
    args = live.parse_args(["--rows", "8", "--quick", "--planes", "bf16"])
    assert (args.rows, args.planes, args.positions) == ([8], ["bf16"], [1024, 2048])
    assert live.parse_args([]).warps == [4]  # without --quick: the rule's constants only


def test_quick_preset_tensor_core_variants_at_256_rows(live):
    """Each target's tensor-core variants follow its FMA ones; bf16 planes only, always
    reordering, held to the body's bound by terms, the one-term form not servable."""
    args = live.parse_args(["--quick"])
    before = launch.ATTN_MMA, launch.ATTN_LIVE
    vs, _ = live.variants(256, 32, 8, 128, 4096, args.targets, args.warps, args.block_n,
                          args.mma_terms, args.mma_targets)
    assert (launch.ATTN_MMA, launch.ATTN_LIVE) == before  # restored
    labels = [v.label for v in vs]
    mma = [v for v in vs if v.label.startswith("mma")]
    assert [v.label for v in mma] == [
        f"mma{k} {t} L{n} W{w} N{bn}" for t, n in (("4096*", 2), ("16384", 8))
        for bn in (64, 32) for w in (4, 8) for k in (2, 1)]
    assert labels.index("mma2 4096* L2 W4 N64") == 5  # after old and 4096's FMA variants
    assert labels.index("mma2 16384 L8 W4 N64") == labels.index("live 16384 L8 W8 N32") + 1
    assert mma[0].split == dict(BLOCK_N=64, BLOCK_HD=128, BLOCK_G=16, GROUPED=4, TERMS=2,
                                EVEN_HD=1, WARPS=4, LIVE=2)
    assert mma[3].split == dict(mma[0].split, WARPS=8, TERMS=1)
    assert all(v.planes == ("bf16",) and v.reorders for v in mma)
    assert [(v.tol, v.serving) for v in mma[:2]] == [(5e-5, True), (5e-2, False)]
    assert all(v.planes == ("f32", "bf16") and v.tol == 1e-5 and v.serving
               for v in vs if v not in mma)


def test_tensor_core_variants_default_and_off(live):
    args = live.parse_args([])
    assert (args.mma_terms, args.mma_targets) == ([2], [4096])
    args = live.parse_args(["--quick", "--mma-terms", "--planes", "f32"])
    assert args.mma_terms == []
    allv, timed, _ = live.variant_table(args)
    assert set(allv) == {"attention_decode_split", "attention_decode_merge"}
    assert timed == 2 * 2 * 17
    args = live.parse_args(["--quick", "--planes", "f32"])  # bf16-only variants: no rows
    assert live.variant_table(args)[1] == 2 * 2 * 17


@pytest.mark.parametrize("argv, message", [
    (["--mma-terms", "3"], "argument --mma-terms: invalid choice: 3"),
    (["--mma-targets", "0"], "--mma-targets takes positive integers"),
    (["--warps", "0"], "--warps takes positive integers"),
    (["--quick", "--block-n", "64", "-32"], "--block-n takes positive integers"),
    (["--planes", "f16"], "argument --planes: invalid choice: 'f16'"),
])
def test_refusals(live, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        live.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
