"""Speculative kernels and programs on the GPU against the NumPy references.

Kernels: fresh random inputs, poisoned outputs, exact agreement for integer outputs and
the sampled tokens (the same race in float64 as the reference); the coupled-verification
ops of new cores and the standard-sampling ops of cores exported before them. Model: the
real model with a speculative core on the cuda backend. Decode rows and verification
rows of a drafter core run the row-invariant linear (one binary per matrix whatever the
row count, every row reduced in one order: kernels_triton/invariant.py, bitwise per row
in tests/gpu/test_invariant.py), so a verified position's logits are the decode row's
and greedy speculative text equals the cuda decode programs' text by construction: 100
chat prompts x 128 tokens at batch 1 and batch 8, no divergence allowed. Seeded sampled
text is measured and bounded (the decode sampler and the verification race sum the
softmax normalizer in different orders, so a draw at a last-bit tie can differ).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.speculative import RECORD_FIELDS

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


def test_draft_inputs_and_pack_tokens(gpu, rng):
    B, S, DMAX = 7, 16, 3
    pending = rng.integers(0, 49152, S).astype(np.int32)
    slot = rng.permutation(S)[:B].astype(np.int32)
    slot[3] = -1
    start = rng.integers(0, 4000, B).astype(np.int32)
    qlen = rng.integers(0, 5, B).astype(np.int32)
    drafts = rng.integers(0, 49152, (B, DMAX)).astype(np.int32)
    for step in (1, 2, 3):
        ref = [np.full(B, -99, np.int32) for _ in range(4)]
        K.spec_draft_inputs(pending, slot, start, qlen, drafts, *ref, B, S, DMAX, step)
        got = gpu.run("spec_draft_inputs", pending, slot, start, qlen, drafts,
                      *[np.full(B, -99, np.int32) for _ in range(4)], B, S, DMAX, step)
        for name, want in zip(("tok", "pos", "row", "lane_slot"), ref, strict=True):
            np.testing.assert_array_equal(got[name], want, err_msg=f"step {step} {name}")
    P = int(np.maximum(qlen, 0).sum()) + 3
    token_row = np.concatenate([np.repeat(np.arange(B), np.maximum(qlen, 0)), [-1] * 3])
    positions = np.concatenate([start[b] + np.arange(max(qlen[b], 0)) for b in range(B)]
                               + [np.zeros(3, np.int64)]).astype(np.int32)
    ref = np.full(P, -99, np.int32)
    K.spec_pack_tokens(pending, slot, start, drafts, positions, token_row.astype(np.int32), ref,
                       B, P, S, DMAX)
    got = gpu.run("spec_pack_tokens", pending, slot, start, drafts, positions,
                  token_row.astype(np.int32), np.full(P, -99, np.int32), B, P, S, DMAX)
    np.testing.assert_array_equal(got["tokens"], ref)


def test_paged_rows(gpu, rng):
    T, R, MP, PT, D, pages = 9, 3, 8, 16, 576, 40
    page_table = rng.permutation(pages)[:R * MP].astype(np.int32).reshape(R, MP)
    plane = rng.standard_normal((pages, PT, D)).astype(np.float32)
    x = rng.standard_normal((T, D)).astype(np.float32)
    # distinct positions, 0 among them: two tokens of one request never share a position
    # (two writes of one row would race on the device)
    positions = np.concatenate([[0], 1 + rng.permutation(MP * PT - 1)[:T - 1]]).astype(np.int32)
    token_row = np.asarray([0, 0, 1, 1, 2, -1, 2, 0, 1], np.int32)
    slot = np.asarray([1, 0, -1], np.int32)
    ref = plane.copy()
    K.paged_row_write(x, positions, token_row, slot, page_table, ref, T, R, MP, PT, D)
    got = gpu.run("paged_row_write", x, positions, token_row, slot, page_table, plane.copy(),
                  T, R, MP, PT, D)["plane"]
    np.testing.assert_array_equal(got, ref)
    out = np.zeros((T, D), np.float32)
    K.paged_row_gather_prev(ref, positions, token_row, slot, page_table, out, T, R, MP, PT, D)
    got = gpu.run("paged_row_gather_prev", ref, positions, token_row, slot, page_table,
                  np.full((T, D), np.nan, np.float32), T, R, MP, PT, D)["out"]
    np.testing.assert_array_equal(got, out)


def _sampling(rng, B, temperature):
    f = np.float32
    return dict(seed=rng.integers(0, 2**32, (B, 2), dtype=np.uint64).astype(np.uint32),
                temperature=np.asarray(temperature, f), top_p=np.full(B, 0.9, f),
                top_k=np.asarray([0, 40, 0, 0, 7, 0][:B], np.int32),
                min_p=np.asarray([0, 0, 0.05, 0, 0, 0][:B], f))


@pytest.mark.parametrize("VD,V", [(512, 49152), (8192, 49152)])
def test_draft_sample(gpu, rng, VD, V):
    B, DMAX, step = 6, 3, 2
    logits = (rng.standard_normal((B, VD)) * 3).astype(np.float32)
    lane_slot = np.asarray([0, 1, -1, 3, 4, 5], np.int32)
    pos = rng.integers(0, 4000, B).astype(np.int32)
    vocab_map = np.sort(rng.choice(V, VD, replace=False)).astype(np.int32)
    s = _sampling(rng, B, [0.0, 0.8, 0.7, 1.0, 0.0, 0.6])
    args = [s["seed"], s["temperature"], s["top_p"], s["top_k"], s["min_p"]]
    drafts = np.full((B, DMAX), -1, np.int32)
    q = np.full((B, DMAX, V), np.nan, np.float32)
    ref_d, ref_q = drafts.copy(), np.zeros_like(q)
    K.draft_sample(logits, lane_slot, pos, vocab_map, *args, ref_d, ref_q, B, VD, V, DMAX, step)
    got = gpu.run("draft_sample", logits, lane_slot, pos, vocab_map, *args, drafts, q,
                  B, VD, V, DMAX, step)
    np.testing.assert_array_equal(got["drafts"], ref_d)
    for b in (1, 3, 5):  # sampled lanes keep q over target ids
        gq, rq = got["q"][b, step - 1], ref_q[b, step - 1]
        assert np.isfinite(gq).all() and np.abs(gq - rq).max() < 1e-5


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_spec_verify(gpu, rng, temperature):
    B, V, VD, W = 5, 49152, 8192, 4
    DMAX, S, W32 = W - 1, 8, (V + 31) // 32
    qlen = np.asarray([4, 1, 3, 0, 2], np.int32)
    P = int(qlen.sum()) + 2
    slot = np.asarray([2, 0, 5, -1, 7], np.int32)
    start = rng.integers(0, 4000, B).astype(np.int32)
    logits = (rng.standard_normal((P, V)) * 2).astype(np.float32)
    token_row = np.concatenate([np.repeat(np.arange(B), qlen), [-1, -1]]).astype(np.int32)
    greedy = logits.argmax(-1)
    off = np.concatenate([[0], np.cumsum(qlen)[:-1]])
    drafts = rng.integers(0, V, (B, DMAX)).astype(np.int32)
    drafts[0, :2] = greedy[off[0]:off[0] + 2]  # lane 0: two drafts match the argmax
    vocab_map = np.sort(rng.choice(V, VD, replace=False)).astype(np.int32)
    q = np.zeros((B, DMAX, V), np.float32)
    for b in range(B):
        for j in range(DMAX):
            ids = rng.choice(V, 20, replace=False)
            ids[0] = drafts[b, j]
            q[b, j, ids] = rng.dirichlet(np.ones(20)).astype(np.float32)
    s = _sampling(rng, B, [temperature] * B)
    f = np.float32
    common = [slot, np.arange(B, dtype=np.int32) + 3, start, qlen, np.ones(B, np.int32),
              s["seed"], s["temperature"], s["top_p"], s["top_k"], s["min_p"],
              np.asarray([0, 0.1, 0.1, 0.1, 0.1], f), np.asarray([0, 0.05, 0.05, 0.05, 0.05], f),
              np.asarray([1, 1.1, 1.1, 1.1, 1.1], f)]  # lane 0 without penalties
    hist = rng.integers(0, 3, (S, V)).astype(np.int32)
    mask = np.full((B, W32), -1, np.int32)
    use_mask = np.zeros(B, np.int32)
    pending = rng.integers(0, V, S).astype(np.int32)
    ref = dict(histogram=hist.copy(), pending=pending.copy(),
               commit_row=np.full(P, -99, np.int32),
               record=np.full((B, RECORD_FIELDS + W), -99, np.int32))
    K.spec_verify(logits, *common, ref["histogram"], mask, use_mask, drafts, q, vocab_map,
                  token_row, ref["pending"], ref["commit_row"], ref["record"], B, P, V, VD, W32,
                  DMAX, W, 0)
    got = gpu.run("spec_verify", logits, *common, hist.copy(), mask, use_mask, drafts, q,
                  vocab_map, token_row, pending.copy(), np.full(P, -99, np.int32),
                  np.full((B, RECORD_FIELDS + W), -99, np.int32), B, P, V, VD, W32, DMAX, W, 0)
    for name in ("record", "pending", "commit_row", "histogram"):
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    if temperature == 0.0:
        assert ref["record"][0, 2] == 2  # the accept path ran


@pytest.mark.parametrize("VD,V", [(512, 49152), (8192, 49152)])
def test_draft_sample_coupled(gpu, rng, VD, V):
    """The head's race with the target's stream-0 noise (coupled drafts), poisoned drafts:
    exact draft ids, and each sampled lane's draft is the reference target race over the
    head's own distribution (the same function the sampler draws with)."""
    B, DMAX, step = 6, 3, 2
    logits = (rng.standard_normal((B, VD)) * 3).astype(np.float32)
    lane_slot = np.asarray([0, 1, -1, 3, 4, 5], np.int32)
    pos = rng.integers(0, 4000, B).astype(np.int32)
    vocab_map = rng.permutation(V)[:VD].astype(np.int32)  # not monotone: ids map anywhere
    s = _sampling(rng, B, [0.0, 0.8, 0.7, 1.0, 0.0, 0.6])
    args = [s["seed"], s["temperature"], s["top_p"], s["top_k"], s["min_p"]]
    ref = np.full((B, DMAX), -7, np.int32)
    K.draft_sample_coupled(logits, lane_slot, pos, vocab_map, *args, ref, B, VD, DMAX, step)
    got = gpu.run("draft_sample_coupled", logits, lane_slot, pos, vocab_map, *args,
                  np.full((B, DMAX), -7, np.int32), B, VD, DMAX, step)
    np.testing.assert_array_equal(got["drafts"], ref)
    assert ref[2, step - 1] == -7 and (ref[[0, 1, 3, 4, 5], step - 1] >= 0).all()


def _coupled_verify_inputs(rng, temperature):
    """Inputs of a coupled verify step whose drafts match the target's draws where the
    test wants acceptance: lane 0 accepts every draft, lane 2 one of two, the others none
    (drafts built by rerunning the reference with the emitted prefix as drafts)."""
    B, V, W = 5, 49152, 4
    DMAX, S, W32 = W - 1, 8, (V + 31) // 32
    qlen = np.asarray([4, 1, 3, 0, 2], np.int32)
    P = int(qlen.sum()) + 2
    f = np.float32
    s = _sampling(rng, B, [temperature] * B)
    ins = dict(
        logits=(rng.standard_normal((P, V)) * 2).astype(f),
        slot=np.asarray([2, 0, 5, -1, 7], np.int32), generation=np.arange(B, dtype=np.int32) + 3,
        lane_start=rng.integers(0, 4000, B).astype(np.int32), query_length=qlen,
        sampling_decision=np.ones(B, np.int32), seed=s["seed"], temperature=s["temperature"],
        top_p=s["top_p"], top_k=s["top_k"], min_p=s["min_p"],
        presence=np.asarray([0, 0.1, 0.1, 0.1, 0.1], f),
        frequency=np.asarray([0, 0.05, 0.05, 0.05, 0.05], f),
        repetition=np.asarray([1, 1.1, 1.1, 1.1, 1.1], f),
        histogram=rng.integers(0, 3, (S, V)).astype(np.int32),
        grammar_mask=rng.integers(-2**31, 2**31, (B, W32), dtype=np.int64).astype(np.int32),
        use_mask=np.asarray([0, 0, 1, 0, 0], np.int32),
        drafts=np.full((B, DMAX), -1, np.int32),
        token_row=np.concatenate([np.repeat(np.arange(B), qlen), [-1, -1]]).astype(np.int32),
        pending=rng.integers(0, V, S).astype(np.int32))
    geometry = (B, P, V, W32, DMAX, W, 0)
    for b, accept in ((0, 3), (2, 1)):
        for j in range(accept):
            out = _reference_verify(ins, geometry)
            ins["drafts"][b, j] = out["record"][b, RECORD_FIELDS + j]
    out = _reference_verify(ins, geometry)
    ins["drafts"][2, 1] = (out["record"][2, RECORD_FIELDS + 1] + 1) % V  # lane 2 rejects it
    return ins, geometry


def _reference_verify(ins, geometry):
    P, W = geometry[1], geometry[5]
    out = dict(histogram=ins["histogram"].copy(), pending=ins["pending"].copy(),
               commit_row=np.full(P, -99, np.int32),
               record=np.full((len(ins["slot"]), RECORD_FIELDS + W), -99, np.int32))
    args = {**ins, **out}
    K.spec_verify_coupled(*(args[p.name] for p in K.kernel_params("spec_verify_coupled")
                            if p.kind == "buffer"), *geometry)
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_spec_verify_coupled(gpu, rng, temperature):
    """Coupled verification against the reference with poisoned outputs: the emitted
    tokens (the target's own draws: argmax, or the sampler's stream-0 race with the
    lane's penalties and mask), accepted counts, commit rows, pending, histogram."""
    ins, geometry = _coupled_verify_inputs(rng, temperature)
    ref = _reference_verify(ins, geometry)
    assert ref["record"][:, 2].tolist() == [3, 0, 1, -1, 0]  # accept and reject paths ran
    P, W = geometry[1], geometry[5]
    poisoned = dict(commit_row=np.full(P, -99, np.int32),
                    record=np.full((len(ins["slot"]), RECORD_FIELDS + W), -99, np.int32))
    args = {**ins, **poisoned, "histogram": ins["histogram"].copy(),
            "pending": ins["pending"].copy()}
    got = gpu.run("spec_verify_coupled",
                  *(args[p.name] for p in K.kernel_params("spec_verify_coupled")
                    if p.kind == "buffer"), *geometry)
    for name in ("record", "pending", "commit_row", "histogram"):
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


def test_copy_drafts(gpu, rng):
    """spec_copy_drafts (coupled programs: copied candidates with no q) against the
    reference over stale, clipped and out-of-range candidates."""
    B, CMAX, DMAX, V = 8, 3, 3, 49152
    for _ in range(20):
        ins = [rng.integers(-2, V + 2, (B, CMAX)).astype(np.int32),
               rng.integers(-1, 5, B).astype(np.int32), rng.integers(1, 3, B).astype(np.int32),
               rng.integers(5, 7, B).astype(np.int32), rng.integers(1, 3, B).astype(np.int32),
               rng.integers(5, 7, B).astype(np.int32), rng.integers(1, 5, B).astype(np.int32),
               rng.integers(-1, 3, B).astype(np.int32)]
        for step in (1, 2, 3):
            drafts = rng.integers(0, V, (B, DMAX)).astype(np.int32)
            want = drafts.copy()
            K.spec_copy_drafts(*ins, want, B, CMAX, DMAX, V, step)
            got = gpu.run("spec_copy_drafts", *ins, drafts, B, CMAX, DMAX, V, step)
            np.testing.assert_array_equal(got["drafts"], want)


GREEDY_TOKENS = 64
DIVERGENCE_BOUND = 0.10  # seeded sampled prompts whose text may differ (measured, printed)


@pytest.fixture(scope="module")
def spec_model(gpu, tmp_path_factory):
    """A speculative SmolLM2 core compiled for this GPU (the trained head when committed)."""
    from helios_ignition.export import export_core
    from helios_serve.testing.native import load_native
    from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair

    d = tmp_path_factory.mktemp("spec-core")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    trained = ROOT / "recipes/drafters/smollm2-135m-instruct-eagle.safetensors"
    drafter = str(trained) if trained.is_file() else "random:7:8192"
    recipe = d / "spec.py"
    recipe.write_text(
        "from dataclasses import replace\nimport importlib.util\n"
        f"s = importlib.util.spec_from_file_location('b', {str(ROOT / 'recipes/smollm2_135m_instruct.py')!r})\n"
        "b = importlib.util.module_from_spec(s); s.loader.exec_module(b)\n"
        "from helios_ignition.recipe import DrafterDecl\n"
        f"RECIPE = replace(b.RECIPE, drafter=DrafterDecl({drafter!r}, widths=(1, 2, 3, 4)),\n"
        "                 capacities=replace(b.RECIPE.capacities, mixed_tokens=()))\n")
    out = d / "spec.core"
    export_core(recipe, checkpoint=os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2"),
                key_path=key, namespace="gpu.test", out=out, targets=(gpu.target,))
    core = open_core(out, trusted_keys=[load_public_key(Path(str(key) + ".pub"))])
    model = load_native(core, "cuda")
    yield model, drafter
    model.close()


def _chat_prompts(count: int):
    spec = importlib.util.spec_from_file_location("drafter_prompts",
                                                  ROOT / "scripts/drafter_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.chat_prompts("eval", count, seed=5)


IDENTITY_TOKENS = 128


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_speculative_output_is_the_decode_output(spec_model, batch):
    """Issue 32, item 1: 100 chat prompts x 128 tokens, greedy, W = 4, learned drafts:
    every speculative text equals the decode programs' text at batch 1 and batch 8."""
    from helios_serve.runtime.driver import Driver
    from helios_tools.frontend_assets import load_tokenizer, render_chat

    model, drafter = spec_model
    ck = _gguf()
    tok = load_tokenizer(ck.tokenizer_json)
    ids = [tok.encode(render_chat(ck.chat_template, m, add_generation_prompt=True),
                      add_special_tokens=False).ids for m in _chat_prompts(100)]
    differ, accepted, rounds = [], 0, 0
    for start in range(0, len(ids), batch):
        group = ids[start:start + batch]
        want = Driver(model).generate(group, IDENTITY_TOKENS)
        got, records = Driver(model).generate_speculative(group, IDENTITY_TOKENS, 4)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                first = next(j for j, (u, v) in enumerate(zip(a, b, strict=True)) if u != v)
                differ.append({"prompt": start + i, "first_divergent_token": first})
        accepted += sum(int(r[:, 2].sum()) for r in records)
        rounds += sum(len(r) for r in records)
    print(json.dumps({"drafter": drafter, "batch": batch, "prompts": len(ids),
                      "tokens": IDENTITY_TOKENS, "divergent": differ,
                      "mean_tokens_per_lane_round": (accepted + rounds) / max(rounds, 1)}))
    assert accepted > 0
    assert differ == []


def test_seeded_sampled_speculative_divergence_over_64_prompts(spec_model):
    """Coupled verification on the device: seeded sampled (T 0.8, top_p 0.95) speculative
    text against the cuda decode programs' text of the same seeds. Every emitted token
    is the target's own draw over the same logits (the row-invariant linear), but the
    verification race and the decode sampler sum the softmax normalizer in different
    orders, so a draw at a last-bit tie of two race scores can differ: the rate is
    measured, printed and bounded."""
    from helios_serve.engine.plan import SamplingParams
    from helios_serve.runtime.driver import Driver
    from helios_tools.frontend_assets import load_tokenizer, render_chat

    model, drafter = spec_model
    ck = _gguf()
    tok = load_tokenizer(ck.tokenizer_json)
    ids = [tok.encode(render_chat(ck.chat_template, m, add_generation_prompt=True),
                      add_special_tokens=False).ids for m in _chat_prompts(64)]
    differ, accepted, rounds = 0, 0, 0
    for start in range(0, len(ids), 8):
        batch = ids[start:start + 8]
        params = [SamplingParams(temperature=0.8, top_p=0.95, seed=900 + start + i)
                  for i in range(len(batch))]
        want = Driver(model).generate(batch, GREEDY_TOKENS, params)
        got, records = Driver(model).generate_speculative(batch, GREEDY_TOKENS, 4, params)
        differ += sum(a != b for a, b in zip(got, want, strict=True))
        accepted += sum(int(r[:, 2].sum()) for r in records)
        rounds += sum(len(r) for r in records)
    rate = differ / len(ids)
    print(json.dumps({"drafter": drafter, "sampling": "T0.8 top_p0.95", "prompts": len(ids),
                      "tokens": GREEDY_TOKENS, "divergent_prompts": differ,
                      "divergence_rate": rate,
                      "mean_tokens_per_lane_round": (accepted + rounds) / max(rounds, 1)}))
    assert accepted > 0 and rate <= DIVERGENCE_BOUND


def _gguf():
    from helios_ignition.checkpoint import load_gguf, smollm2_gguf_path

    return load_gguf(os.environ.get("HELIOS_SMOLLM2_GGUF") or smollm2_gguf_path())


def test_allocation_and_row_packing(gpu, rng):
    """spec_allocate / spec_pack_rows against the references: crafted ties (equal
    products 0.5 * 0.5 = 0.25, equal first confidences), NaN and zero confidences,
    ceilings, padding lanes; then 200 random cases."""
    cases = [([3, 3], [[0.5, 0.5], [0.25, 0.25]], 4, [0, 1]),
             ([2, 2], [[0.5], [0.5]], 3, [5, 2]),
             ([4, 4], [[0.5, 0.5, 0.5], [0.125, 1.0, 1.0]], 5, [0, 1]),
             ([3, 3], [[np.nan, 1.0], [0.01, 1.0]], 3, [0, 1]),
             ([4, 4, 0], [[0.5] * 3, [0.9] * 3, [1.0] * 3], 4, [0, -1, 2])]
    values = np.asarray([0.5, 0.25, 0.125, 1.0, 0.0, 0.7, np.nan], np.float32)
    for _ in range(200):
        B, DMAX = int(rng.integers(1, 33)), int(rng.integers(1, 5))
        slot = rng.permutation(64)[:B].astype(np.int32)
        slot[rng.random(B) < 0.2] = -1
        ceiling = rng.integers(0, DMAX + 3, B).astype(np.int32)
        live = int(((slot >= 0) & (ceiling >= 1)).sum())
        P = max(live, int(rng.integers(B, B * (DMAX + 1) + 3)))
        cases.append((ceiling, rng.choice(values, (B, DMAX)), P, slot))
    for ceiling, conf, P, slot in cases:
        ceiling = np.asarray(ceiling, np.int32)
        conf = np.asarray(conf, np.float32)
        slot = np.asarray(slot, np.int32)
        B, DMAX = conf.shape
        ref = np.full(B, -9, np.int32)
        K.spec_allocate(ceiling, slot, conf, ref, B, P, DMAX)
        got = gpu.run("spec_allocate", ceiling, slot, conf, np.full(B, -9, np.int32), B, P, DMAX)
        np.testing.assert_array_equal(got["query_length"], ref, err_msg=f"{ceiling} {conf} {P}")
        start = rng.integers(0, 4000, B).astype(np.int32)
        refs = [np.full(P, 99, np.int32) for _ in range(3)]
        K.spec_pack_rows(ref, start, slot, *refs, B, P)
        got = gpu.run("spec_pack_rows", ref, start, slot,
                      *[np.full(P, 99, np.int32) for _ in range(3)], B, P)
        for name, want in zip(("positions", "token_row", "token_slot"), refs, strict=True):
            np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_copied_candidates_and_confidence(gpu, rng):
    B, CMAX, DMAX, V, VD = 8, 3, 3, 49152, 8192
    for _ in range(20):
        cand = rng.integers(-2, V + 2, (B, CMAX)).astype(np.int32)
        count = rng.integers(-1, 5, B).astype(np.int32)
        generation = rng.integers(1, 3, B).astype(np.int32)
        cand_generation = rng.integers(1, 3, B).astype(np.int32)
        start = rng.integers(5, 7, B).astype(np.int32)
        cand_endpoint = rng.integers(5, 7, B).astype(np.int32)
        qlen = rng.integers(1, 5, B).astype(np.int32)
        lane_slot = rng.integers(-1, 3, B).astype(np.int32)
        for step in (1, 2, 3):
            drafts = rng.integers(0, V, (B, DMAX)).astype(np.int32)
            q = rng.random((B, DMAX, V)).astype(np.float32)
            want_d, want_q = drafts.copy(), q.copy()
            K.spec_copy_candidates(cand, count, cand_generation, cand_endpoint, generation,
                                   start, qlen, lane_slot, want_d, want_q, B, CMAX, DMAX, V,
                                   step)
            got = gpu.run("spec_copy_candidates", cand, count, cand_generation, cand_endpoint,
                          generation, start, qlen, lane_slot, drafts, q, B, CMAX, DMAX, V, step)
            np.testing.assert_array_equal(got["drafts"], want_d)
            np.testing.assert_array_equal(got["q"], want_q)
            logits = (rng.standard_normal((B, VD)) * 3).astype(np.float32)
            vocab_map = rng.permutation(V)[:VD].astype(np.int32)
            drafted = np.where(rng.random((B, DMAX)) < 0.8,
                               vocab_map[rng.integers(0, VD, (B, DMAX))], V + 1).astype(np.int32)
            want = np.full((B, DMAX), -1, np.float32)
            K.spec_confidence(logits, lane_slot, drafted, vocab_map, want, B, VD, DMAX, step)
            got = gpu.run("spec_confidence", logits, lane_slot, drafted, vocab_map,
                          np.full((B, DMAX), -1, np.float32), B, VD, DMAX, step)
            np.testing.assert_allclose(got["confidence"], want, rtol=2e-6, atol=1e-9)


def test_copied_candidates_and_prefix_limit_programs_on_the_device(spec_model):
    """History drafting's copied candidates and SPECULATIVE_PREFIX_LIMIT programs in the
    captured cuda programs: with the decode programs' own continuation as candidates
    nearly every draft is accepted; prefix-limit steps (B = 8, P = 16) keep every lane
    within its ceiling and the step within P; greedy text is the decode programs' (the
    row-invariant linear: no divergence allowed)."""
    from helios_serve.runtime.driver import Driver
    from helios_tools.frontend_assets import load_tokenizer, render_chat

    model, _ = spec_model
    ck = _gguf()
    tok = load_tokenizer(ck.tokenizer_json)
    batch = [tok.encode(render_chat(ck.chat_template, m, add_generation_prompt=True),
                        add_special_tokens=False).ids for m in _chat_prompts(8)]
    want = Driver(model).generate(batch, GREEDY_TOKENS)

    def oracle(seq):
        for prompt, out in zip(batch, want, strict=True):
            full = list(prompt) + out
            if full[:len(seq)] == seq:
                return full[len(seq):len(seq) + 3]
        return ()

    result = {}
    for name, kw in (("copied", dict(propose=oracle)), ("prefix", dict(packed_rows=16)),
                     ("prefix+copied", dict(propose=oracle, packed_rows=16))):
        got, records = Driver(model).generate_speculative(batch, GREEDY_TOKENS, 4, **kw)
        offers = np.concatenate([r[:, 1] for r in records])
        accepted = sum(int(r[:, 2].sum()) for r in records)
        drafts = int((offers - 1).sum())
        if kw.get("packed_rows"):
            assert all(int(r[:, 1].sum()) <= 16 for r in records)
            assert (offers >= 1).all() and (offers <= 4).all()
        result[name] = {"divergent": sum(a != b for a, b in zip(got, want, strict=True)),
                        "acceptance": accepted / max(drafts, 1)}
    print(json.dumps(result))
    assert result["copied"]["acceptance"] > 0.9
    assert all(r["divergent"] == 0 for r in result.values())


def _candidate_mask_case(rng, V, B=6, CMAX=3, DMAX=3):
    """Random lanes for spec_candidate_masks: constrained and free lanes, fresh and stale
    candidates, counts past the lane, padding rows poisoned with NaN (never touched)."""
    W32 = (V + 31) // 32
    qlen = rng.integers(0, 5, B).astype(np.int32)
    P = int(qlen.sum()) + 3
    slot = rng.permutation(16)[:B].astype(np.int32)
    slot[rng.integers(B)] = -1
    start = rng.integers(5, 4000, B).astype(np.int32)
    token_row = np.concatenate([np.repeat(np.arange(B), qlen), [-1] * 3]).astype(np.int32)
    positions = np.concatenate([start[b] + np.arange(qlen[b]) for b in range(B)]
                               + [np.zeros(3, np.int64)]).astype(np.int32)
    logits = (rng.standard_normal((P, V)) * 2).astype(np.float32)
    logits[-3:] = np.nan  # padding rows: must stay exactly as they are
    generation = rng.integers(1, 3, B).astype(np.int32)
    stale = rng.random(B) < 0.3
    inputs = dict(
        slot=slot, lane_start=start, query_length=qlen,
        use_mask=(rng.random(B) < 0.7).astype(np.int32),
        cand_masks=rng.integers(-2**31, 2**31, (16, CMAX, W32), dtype=np.int64).astype(np.int32),
        cand_count=rng.integers(-1, 5, B).astype(np.int32),
        cand_generation=np.where(stale, generation + 1, generation).astype(np.int32),
        cand_endpoint=np.where(rng.random(B) < 0.2, start + 1, start).astype(np.int32),
        generation=generation)
    drafts = rng.integers(0, V, (B, DMAX)).astype(np.int32)
    return logits, token_row, positions, inputs, drafts, P, B, W32, CMAX, DMAX


def test_candidate_masks(gpu, rng):
    """spec_candidate_masks against the reference: exact logits (-inf where a mask bit is
    clear, poisoned padding rows untouched) and exact cut drafts."""
    V = 49152
    for _ in range(10):
        logits, token_row, positions, inp, drafts, P, B, W32, CMAX, DMAX = \
            _candidate_mask_case(rng, V)
        args = [inp[k] for k in ("slot", "lane_start", "query_length", "use_mask",
                                 "cand_masks", "cand_count", "cand_generation",
                                 "cand_endpoint", "generation")]
        want_l, want_d = logits.copy(), drafts.copy()
        K.spec_candidate_masks(want_l, token_row, positions, *args, want_d, P, B, V, W32,
                               CMAX, DMAX)
        got = gpu.run("spec_candidate_masks", logits, token_row, positions, *args, drafts,
                      P, B, V, W32, CMAX, DMAX)
        np.testing.assert_array_equal(got["logits"], want_l)
        np.testing.assert_array_equal(got["drafts"], want_d)
        assert np.isnan(got["logits"][-3:]).all()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_spec_verify_never_accepts_a_cut_draft(gpu, rng, temperature):
    """Drafts of -1 (cut by spec_candidate_masks past a constrained lane's copied run) are
    never accepted and read no q row: device record = reference record."""
    B, V, VD, W = 4, 49152, 8192, 4
    DMAX, S, W32 = W - 1, 8, (V + 31) // 32
    qlen = np.asarray([4, 3, 4, 2], np.int32)
    P = int(qlen.sum())
    slot = np.asarray([1, 4, 6, 0], np.int32)
    start = rng.integers(0, 4000, B).astype(np.int32)
    logits = (rng.standard_normal((P, V)) * 2).astype(np.float32)
    token_row = np.repeat(np.arange(B), qlen).astype(np.int32)
    greedy = logits.argmax(-1)
    off = np.concatenate([[0], np.cumsum(qlen)[:-1]])
    drafts = np.stack([greedy[off[b]:off[b] + DMAX] if qlen[b] > DMAX else
                       np.resize(greedy[off[b]:off[b] + qlen[b]], DMAX)
                       for b in range(B)]).astype(np.int32)
    drafts[0, 2] = -1  # accepted run of 2, then a cut
    drafts[1, 0] = -1  # cut at once: the lane's pending row decides
    drafts[2, 1:] = -1
    q = np.zeros((B, DMAX, V), np.float32)
    q[:, :, :] = 1.0 / V
    for b in range(B):
        for j in range(DMAX):
            if drafts[b, j] >= 0:
                q[b, j] = 0.0
                q[b, j, drafts[b, j]] = 1.0  # copied drafts: one-hot
    s = _sampling(rng, B, [temperature] * B)
    f = np.float32
    vocab_map = np.sort(rng.choice(V, VD, replace=False)).astype(np.int32)
    common = [slot, np.arange(B, dtype=np.int32) + 3, start, qlen, np.ones(B, np.int32),
              s["seed"], s["temperature"], s["top_p"], s["top_k"], s["min_p"],
              np.zeros(B, f), np.zeros(B, f), np.ones(B, f)]
    hist = rng.integers(0, 3, (S, V)).astype(np.int32)
    mask = np.full((B, W32), -1, np.int32)
    use_mask = np.ones(B, np.int32)
    pending = rng.integers(0, V, S).astype(np.int32)
    ref = dict(histogram=hist.copy(), pending=pending.copy(),
               commit_row=np.full(P, -99, np.int32),
               record=np.full((B, RECORD_FIELDS + W), -99, np.int32))
    K.spec_verify(logits, *common, ref["histogram"], mask, use_mask, drafts, q, vocab_map,
                  token_row, ref["pending"], ref["commit_row"], ref["record"], B, P, V, VD, W32,
                  DMAX, W, 0)
    got = gpu.run("spec_verify", logits, *common, hist.copy(), mask, use_mask, drafts, q,
                  vocab_map, token_row, pending.copy(), np.full(P, -99, np.int32),
                  np.full((B, RECORD_FIELDS + W), -99, np.int32), B, P, V, VD, W32, DMAX, W, 0)
    for name in ("record", "pending", "commit_row", "histogram"):
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    accepted = ref["record"][:, 2]
    assert accepted[1] == 0 and accepted[2] <= 1 and accepted[0] <= 2
    if temperature == 0.0:
        assert accepted[0] == 2


def test_framed_proposal_confidence_on_the_device(spec_model):
    """proposal_confidence on the cuda backend: two prefix-limit steps in flight in frames
    0 and 1 each read back their own plane (one pinned [2, slots, D] record), finite
    probabilities whose NumPy allocation reproduces the device's lane lengths exactly."""
    from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
    from helios_serve.runtime.driver import Driver, _Lane

    model, _ = spec_model
    g = model.manifests
    B, P, W = g.prefix_programs[0]
    n = min(B, g.slots // 2)
    driver = Driver(model)
    driver._generation = 3
    ck = _gguf()
    from helios_tools.frontend_assets import load_tokenizer, render_chat

    tok = load_tokenizer(ck.tokenizer_json)
    prompts = [tok.encode(render_chat(ck.chat_template, m, add_generation_prompt=True),
                          add_special_tokens=False).ids for m in _chat_prompts(2 * n)]
    plans = []
    for half in range(2):
        rows = []
        for slot in range(half * n, (half + 1) * n):
            prompt = prompts[slot]
            first = driver.prefill(_Lane(slot, list(prompt), SamplingParams()))
            rows.append(RowPlan(request_id=slot, slot=slot, generation=3, tokens=(first,),
                                start_position=len(prompt),
                                page_ids=driver._pages(slot, len(prompt) + W), sample=True,
                                sampling=SamplingParams(), query_length=W - slot % 2))
        plans.append(StepPlan(StepKind.SPECULATIVE, tuple(rows), P))
    tickets = [model.submit(plan) for plan in plans]
    # The frame a step takes follows the model's alternation (the prefills above used
    # frames too), so the two steps hold the two frames in either order.
    assert sorted(t.frame for t in tickets) == [0, 1]
    done = [model.wait_step(t) for t in tickets]
    staged = model.backend.staging(0)["proposal_confidence"]
    assert staged is model.backend.staging(1)["proposal_confidence"]
    for ticket, plan, completion in zip(tickets, plans, done, strict=True):
        conf = completion.confidence
        np.testing.assert_array_equal(conf, staged[ticket.frame, :n])
        ceilings = np.asarray([r.lane_length for r in plan.rows], np.int32)
        drafted = np.arange(conf.shape[1]) < ceilings[:, None] - 1
        assert np.isfinite(conf[drafted]).all()
        assert ((conf[drafted] >= 0) & (conf[drafted] <= 1)).all()
        lengths = np.zeros(n, np.int32)
        K.spec_allocate(ceilings, np.asarray([r.slot for r in plan.rows], np.int32),
                        np.where(drafted, conf, 0).astype(np.float32), lengths, n, P,
                        conf.shape[1])
        np.testing.assert_array_equal(completion.sampled[:, 1], lengths)
