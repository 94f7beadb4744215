#!/usr/bin/env bash
# Sets up binaries built on the development VM and carried to the GPU machine (build-carry/bins.tar.xz:
# loom, loom-test-ops, loom-exec-equivalence, libloom_cuda.so, made by scripts/pack-carried.sh;
# .debs-run: the runtime libraries' Debian packages), then runs
# the named steps. Meant to be sourced-free: one device call is `bash scripts/gpu-carried.sh STEPS...`.
#   ops      every op, CUDA against the CPU, exact and fast numerics
#   opsfast  LOOM_OPS_OPS's ops (','-separated, default mul_mat) in fast numerics under each of
#            LOOM_OPS_MODES (space-separated, each ','-separated VAR=VALUE settings or "-" for none)
#   hf       each of LOOM_HF_SHAPES (default llama31-tiny:f32; e.g. "llama31-tiny:f32 gptoss-tiny:f32
#            gptoss-mxfp4-tiny:f32@2e-3") in exact numerics against transformers (tools/hf_reference.py)
#   prefill  loom bench -p 512,4096 on LOOM_MODELS (default llama3-1b:q4_0 llama3-8b:q4_0) under each of
#            LOOM_PREFILL_MODES (LOOM_PREFILL_FLAGS replaces the bench flags), then the modes' logits compared
#   kl       loom perplexity --kl-divergence of fast against exact numerics on LOOM_MODELS (-c LOOM_KL_CTX,
#            2048; LOOM_KL_CHUNKS, 2) under each of LOOM_KL_MODES (fast runs' VAR=VALUE settings, "-" none)
#   decode   loom bench -n 128 on LOOM_MODELS (under each of LOOM_DECODE_MODES, LOOM_DECODE_FLAGS added)
#   batched  loom bench -npl 1,8,32,64 (-npp 128 -ntg 32) with a trace of one step at each npl (and
#            again under LOOM_BATCHED_BASE's VAR=VALUE settings, ','-separated, when given)
#   batchedmodes  loom bench -npp 128 -ntg LOOM_NTG (128) -npl LOOM_NPL (16,64) under each of
#            LOOM_BATCHED_MODES in turn (space-separated, each ','-separated VAR=VALUE settings or "-";
#            repeat a list to alternate, e.g. "A B A B")
#   perf     op-test perf of LOOM_PERF_OP (default mul_mat; e.g. argmax,top_k) at LOOM_PERF_FILTER's cases
#            (one filter word; LOOM_PERF_EXCLUDES: '|'-separated --exclude words, e.g. ", 4]|, 8]" for 1-2
#            columns; LOOM_PERF_TIMEOUT a mode's seconds; LOOM_PERF_FILTERS: '|'-separated filters, each its own --filter, for words
#            with spaces), under each of LOOM_PERF_MODES in turn (as LOOM_PREFILL_MODES: "@base - @base -"
#            alternates the two builds), each line tagged with its mode
#   serve    loom serve -np 64 on each of LOOM_MODELS: 64 streams of 256-token prompts and 256 generated
#            tokens (tools/serve_load.py), one stream, and the engine's figures beside them; LOOM_SERVE_VARIANTS
#            (';'-separated flag sets, ENV=VALUE words for the server's environment, "-" the defaults)
#            runs one server after another, e.g. "-;--prefill-chunk 128;LOOM_EXEC_FIRST_EAGER=0"
#            (LOOM_SOAK=S adds S seconds of them back to back with the server's memory sampled;
#            LOOM_SERVE_FLAGS adds flags to loom serve; LOOM_SERVE_ONLY=1 skips the engine's figures)
#   prefilltrace  a Chrome trace of one 512-token prompt chunk (the second) on LOOM_MODELS, summarized
#   tp       -tp 2 (and 4 on 4 GPUs) against -tp 1 on LOOM_MODELS: prompt logits and greedy tokens in both
#            numerics, then loom bench -p 512 -n 128 at each rank count, for each all-reduce path of
#            LOOM_TP_AR (ll fused nccl: see the step); LOOM_TP_TIMEOUT per command, 90 s; then
#            loom-exec-equivalence --tp N (fast): 16 sequences together, LL against NCCL alone
#   tp70b    synthetic llama3-70b F16 (141 GB: more than one GPU holds) with -tp 2 and -tp 4 (x4 disk, or
#            LOOM_WORK=/dev/shm/loom on a x2)
#   floor    where a generated token's time goes (issue 14's per-token floor): loom bench -p 0 -n 128 --exec all
#            on the built-in model and LOOM_MODELS, without and with LOOM_EXEC_GPU_TIME=1 (device time of each
#            replay between two events), twice: graph inputs, compute (its host part, the device's), read-back
#   decodetrace  a Chrome trace of one decode step (the third) on LOOM_MODELS with --stats, summarized
#            (LOOM_TRACE_WORDS=N: after a prompt of about N tokens)
#   mvperf   ncu of the fast mat-vec on LOOM_MV_CASES (';'-separated op-test descriptions) under each of
#            LOOM_MV_MODES (space-separated modes, each ','-separated VAR=VALUE settings or "-" for none)
#   normquant  greedy logits with the norms' quantized-activation hand-off against LOOM_CUDA_NORM_QUANT=0
#            (or LOOM_NQ_BASE's ','-separated VAR=VALUE settings)
#   plans    the fusions and kernels a token of `loom run --stats` (8 generated tokens) on LOOM_MODELS at each
#            rank count of LOOM_PLAN_TP (default 1; e.g. "1 2"): a fold a memory placement disables shows as
#            a lower count (stop 48: `loom run -tp 2` had lost rope_flash_attn, `loom bench` had not)
#   fusedrift  loom-exec-equivalence fast on LOOM_MODELS under each of LOOM_DRIFT_MODES (as LOOM_DECODE_MODES):
#            each executor configuration's logits drift against serialized, per setting
#   attnncu  ncu sections of the decode attention kernels (flash_decode*) of a step after a prompt of about
#            LOOM_TRACE_WORDS (4000) words on LOOM_MODELS (LOOM_NCU_SKIP launches skipped, 64; LOOM_NCU_COUNT
#            profiled, 2; LOOM_NCU_REGEX the kernels; LOOM_NCU_MODES as LOOM_DECODE_MODES, @base included)
#   samebits  greedy prompt and decode-step logits (a short prompt and ~LOOM_SAMEBITS_WORDS-word ones) of this build
#            against @base's, bit for bit
#   decodediff  greedy decode-step logits (16 steps, --dump-step-logits) under LOOM_DIFF_A against LOOM_DIFF_B settings
#   decodencu  every kernel of one decode step under ncu, grouped, against the step's measured time
#   batchedncu  every kernel of one batched decode step (LOOM_NPL sequences, 64) under ncu, grouped
#   kperf    ncu kernel times of op-test perf cases (LOOM_K_CASES: ';'-separated OP|FILTER) under each
#            of LOOM_K_MODES (space-separated, each ','-separated VAR=VALUE settings or "-" for none)
#   devsample  loom run/chat text sampled in the graph against --host-sampling on CUDA (same seeds),
#            and their speed on LOOM_MODELS
#   kprof    ncu sections and top SASS stall lines of one kernel (LOOM_KPROF_KERNEL) of one perf case
#            (LOOM_KPROF_CASE, OP|FILTER)
#   fastdiff  per-position logits: CUDA fast vs exact and CUDA vs CPU (exact) on LOOM_MODELS
#   peer     llama.cpp (../shared/peer) built and run beside Loom on LOOM_MODELS: llama-bench and
#            llama-batched-bench against loom bench, one run
#   phases   bench_phases (LOOM_PHASES_ARGS): a kernel per dependent phase against a persistent kernel
#   sasswait  per kernel of libloom_cuda.so (LOOM_SASS_FILTER: a regular expression on its name), the loads its
#            SASS issues before the first griddepcontrol.wait (tools/sass_wait.py)
#   batchcheck  loom-exec-equivalence on the built-in model and LOOM_MODELS, both numerics and fast with
#            LOOM_DETERMINISTIC=1 (includes 16 sequences decoded together against alone, required in exact
#            and deterministic, and sampled in the graph against the host; LOOM_BATCHCHECK_MODES picks
#            some of "exact fast fast-deterministic")
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/loom-out}
mkdir -p "$out"
bin=$root/build-carry/bin
mkdir -p "$bin" && tar xJf build-carry/bins.tar.xz -C "$bin"
# build-carry/base.tar.xz (scripts/pack-carried.sh --base): another build's binaries, run by the
# "@base" mode of kperf, decode, prefill and batchedmodes (the same process order, one call)
bin_base=$root/build-carry/bin-base
[[ -f build-carry/base.tar.xz ]] && mkdir -p "$bin_base" && tar xJf build-carry/base.tar.xz -C "$bin_base"
binof() { [[ $1 == "@base" ]] && echo "$bin_base" || echo "$bin"; }
modeenv() { [[ $1 == "-" || $1 == "@base" ]] || tr "," " " <<<"$1"; }
prefix=/tmp/loom-deps
if [[ ! -d $prefix/usr ]]; then
  mkdir -p "$prefix"
  for f in .debs-run/*.deb; do dpkg -x "$f" "$prefix"; done
fi
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=${LOOM_WORK:-/tmp/loom-work}  # generated models (LOOM_WORK=/dev/shm/loom: in memory, for ones the disk cannot hold)
mkdir -p "$work"
t0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
model() {  # model SHAPE:TYPE -> path of a generated model (made if missing); a file's path as it is
  [[ -f $1 ]] && { echo "$1"; return 0; }
  local shape=${1%%:*} type=${1##*:}
  local f="$work/$shape-$type.gguf"
  [[ -s $f ]] || "$bin/loom" gen-model --shape "$shape" --type "$type" -o "$f" -t 16 >/dev/null 2>&1 || return 1
  echo "$f"
}
models=${LOOM_MODELS:-llama3-1b:q4_0 llama3-8b:q4_0}
tag() { basename "$1" .gguf | tr ':/' '--'; }  # a model's name in output files: SHAPE-TYPE, or a file's base name
find_nccl() {  # NCCL for -tp: the toolkit's, else PyTorch's copy
  if [[ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]] && ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
    local nccl
    nccl=$(find /usr /opt /root -name libnccl.so.2 2>/dev/null | head -1)
    [[ -n $nccl ]] && export LD_LIBRARY_PATH="$(dirname "$nccl"):$LD_LIBRARY_PATH" && echo "NCCL: $nccl"
  fi
}
# words_prompt N SHORT: sets `prompt` to loom run's flags for a prompt of N words ("the cat sat on a mat"
# repeated; ~1.7 tokens a word, -c 16384) or, with N empty or 0, to -p SHORT
words_prompt() {
  prompt=(-p "$2")
  if [[ -n $1 && $1 != 0 ]]; then
    python3 -c "import sys; print(' '.join(['the cat sat on a mat'] * (int(sys.argv[1]) // 6)))" "$1" >"$work/words-$1.txt"
    prompt=(-f "$work/words-$1.txt" -c 16384)
  fi
}
for step in "$@"; do
  stamp "$step"
  case $step in
    ops)
      for mode in exact fast; do
        timeout 200 "$bin/loom-test-ops" --backend cuda,cpu --numerics $mode -t 16 >"$out/ops-$mode.log" 2>&1
        echo "ops $mode rc=$?"; grep -E "FAIL|passed|failed" "$out/ops-$mode.log" | tail -n 6
      done
      # the op test's small products take the direct mat-vec's 2-row tiles; its 4-row ones too
      LOOM_MV_TILE_ROWS=4 timeout 100 "$bin/loom-test-ops" --backend cuda,cpu --numerics fast \
        --op mul_mat,mat_vec_multi,glu_mat_vec,mat_vec_bias >"$out/ops-fast-rows4.log" 2>&1
      echo "ops fast, 4-row mat-vec tiles rc=$?"; grep -E "FAIL|passed|failed" "$out/ops-fast-rows4.log" | tail -n 6
      # the batch-invariant mode's own routes (gemm_q at every column count; float weights on the 8-column
      # float mat-vec in launches of 8 columns)
      LOOM_DETERMINISTIC=1 timeout 100 "$bin/loom-test-ops" --backend cuda,cpu --numerics fast \
        --op mul_mat,mat_vec_bias >"$out/ops-fast-deterministic.log" 2>&1
      echo "ops fast, LOOM_DETERMINISTIC=1 rc=$?"; grep -E "FAIL|passed|failed" "$out/ops-fast-deterministic.log" | tail -n 6
      # the prompt attention of 128-query blocks (wgmma on sm_90a, else the two-slab mma.sync kernel)
      # takes only long prompts; forced here on every case, in both forms
      for fa in LOOM_CUDA_FA_WGMMA=1 LOOM_CUDA_FA_WGMMA=0; do
        env LOOM_CUDA_FA_SLABS=2 $fa timeout 100 "$bin/loom-test-ops" --backend cuda,cpu --numerics fast \
          --op flash_attn,gather_flash_attn >"$out/ops-fast-fa.log" 2>&1
        echo "ops fast, 128-query attention blocks ($fa) rc=$?"; grep -E "FAIL|passed|failed" "$out/ops-fast-fa.log" | tail -n 4
      done ;;
    opsfast)
      for mode in ${LOOM_OPS_MODES:--}; do
        env $(tr "," " " <<<"${mode/#-/}") timeout ${LOOM_OPS_TIMEOUT:-200} "$bin/loom-test-ops" --backend cuda,cpu --numerics fast -t 16 \
          --op "${LOOM_OPS_OPS:-mul_mat}" >"$out/opsfast.log" 2>&1
        echo "opsfast $mode rc=$?: $(grep -E "FAIL|passed|failed" "$out/opsfast.log" | tail -n 4 | tr '\n' ' ')"
      done ;;
    hf)
      # SHAPE:TYPE[@THRESHOLD]: 1e-4 unless given. A file with block-quantized weights (gptoss-mxfp4-tiny's
      # experts) needs its own: Loom, as llama.cpp, quantizes the activations of those products to 8 bits
      # and the reference does not (measured on that 4-layer random model: NMSE 3e-4 on the CPU, 1e-3 on
      # CUDA, whose float products round differently at 1e-14 and flip activation codes); its f32 twin
      # (gptoss-tiny:f32) is the strict check of the graph.
      for spec in ${LOOM_HF_SHAPES:-llama31-tiny:f32}; do
        m=${spec%@*} thr=1e-4
        [[ $spec == *@* ]] && thr=${spec#*@}
        f=$(model "$m") || { echo "hf: cannot make $m"; continue; }
        "$bin/loom" run -m "$f" --backend cuda --numerics exact -p "The quick brown fox jumps over the lazy dog" \
          -n 16 --temp 0 --dump-logits "$work/hf-$(tag "$m").bin" >/dev/null 2>&1
        python3 tools/hf_reference.py --model "$f" --loom-logits "$work/hf-$(tag "$m").bin" --threshold "$thr"
      done ;;
    prefill)  # under each of LOOM_PREFILL_MODES (as LOOM_DECODE_MODES), then a ~300-token prompt's logits
      # under each mode against the first's (bit-identical expected: modes that change order, not arithmetic)
      pmodes=${LOOM_PREFILL_MODES:--}
      long=$(for i in $(seq 30); do printf "The quick brown fox jumps over the lazy dog. "; done)
      for m in $models; do
        f=$(model "$m") || continue
        # LOOM_PREFILL_UB: pass sizes (-ub) to time, "-" for loom bench's default
        for mode in $pmodes; do for ub in ${LOOM_PREFILL_UB:--}; do
          env $(modeenv "$mode") timeout 200 "$(binof "$mode")/loom" bench -m "$f" ${LOOM_PREFILL_FLAGS:--p 512,4096 -n 0 -r 3} \
            $([[ $ub == - ]] || echo "-ub $ub") 2>/dev/null |
            grep -E "^\|" | grep -v -- "---" | grep -v "t/s" | awk -v tag="$mode$([[ $ub == - ]] || echo " -ub $ub")" '{ print $0 " " tag }'
        done; done
        [[ $pmodes == "-" ]] && continue
        first=""
        for mode in $pmodes; do
          lf="$work/pf-$(tr -c 'A-Za-z0-9' _ <<<"$mode").bin"
          env $(modeenv "$mode") timeout 120 "$(binof "$mode")/loom" run -m "$f" -p "$long" -n 2 --temp 0 --dump-logits "$lf" >/dev/null 2>&1
          if [[ -z $first ]]; then first=$lf; else cmp -s "$lf" "$first" && echo "$m $mode: prompt logits bit-identical to ${pmodes%% *}" || echo "$m $mode: prompt logits DIFFER from ${pmodes%% *}"; fi
        done
      done ;;
    kl)
      for m in $models; do
        f=$(model "$m") || continue
        base="$work/kl-$(tag "$f").kld"
        timeout 300 "$bin/loom" perplexity -m "$f" -f tests/data/shakespeare_heldout.txt -c "${LOOM_KL_CTX:-2048}" \
          --chunks "${LOOM_KL_CHUNKS:-2}" --backend cuda --numerics exact --kl-divergence-base "$base" >"$out/kl-exact.log" 2>&1 ||
          { echo "kl $m: exact run failed: $(tail -1 "$out/kl-exact.log")"; continue; }
        for mode in ${LOOM_KL_MODES:--}; do
          env $(modeenv "$mode") timeout 300 "$(binof "$mode")/loom" perplexity -m "$f" -c "${LOOM_KL_CTX:-2048}" \
            --chunks "${LOOM_KL_CHUNKS:-2}" --backend cuda --numerics fast --kl-divergence --kl-divergence-base "$base" \
            >"$out/kl-fast.log" 2>&1 || { echo "kl $m $mode: fast run failed: $(tail -1 "$out/kl-fast.log")"; continue; }
          echo "kl $m $mode: $(grep -E "^Mean +KLD:|^Same top p:|^Mean PPL\(Q\)/PPL" "$out/kl-fast.log" | tr -s ' ' | tr '\n' ';')"
        done
      done ;;
    decode)
      # LOOM_DECODE_MODES: space-separated, each ','-separated VAR=VALUE settings or "-" for none, run
      # alternately in one process order per model (e.g. "- LOOM_EXEC_PDL=0"); LOOM_DECODE_FLAGS adds
      # flags to loom bench (e.g. "-tp 2")
      [[ ${LOOM_DECODE_FLAGS:-} == *-tp* ]] && find_nccl
      for m in $models; do
        f=$(model "$m") || continue
        for mode in ${LOOM_DECODE_MODES:--}; do
          env $(modeenv "$mode") timeout 120 "$(binof "$mode")/loom" bench -m "$f" -p 0 -n 128 -r 3 ${LOOM_DECODE_FLAGS:-} 2>/dev/null |
            grep -E "^\|" | grep -v -- "---" | awk -v tag="$mode" '{ print $0 " " tag }'
        done
      done ;;
    floor)
      for f in models/loom-shakespeare-f16.gguf $(for m in $models; do model "$m"; done); do
        for t in 0 1 0 1; do
          LOOM_EXEC_GPU_TIME=$t timeout 120 "$bin/loom" bench -m "$f" -p 0 -n 128 -r 3 --exec all 2>&1 |
            grep -E "a generated token|^\| [a-z]" | grep -v "^| model" | sed "s/^/LOOM_EXEC_GPU_TIME=$t /"
        done
      done ;;
    batched)
      for m in $models; do
        f=$(model "$m") || continue
        timeout 240 "$bin/loom" bench -m "$f" -npp 128 -ntg 32 -npl ${LOOM_NPL:-1,8,32,64} --trace "$out/batched-$(tag "$m")" 2>/dev/null | grep -E "^\|"
        if [[ -n ${LOOM_BATCHED_BASE:-} ]]; then  # VAR=VALUE settings (','-separated) to time beside
          echo "-- with ${LOOM_BATCHED_BASE}:"
          env $(tr "," " " <<<"$LOOM_BATCHED_BASE") timeout 240 "$bin/loom" bench -m "$f" -npp 128 -ntg 32 \
            -npl ${LOOM_NPL:-1,8,32,64} 2>/dev/null | grep -E "^\|" | grep -v -- "---"
        fi
        for t in "$out"/batched-$(tag "$m")-pl*.json; do
          echo "-- $t"; python3 tools/trace_summary.py "$t" --by-shape | head -${LOOM_TRACE_LINES:-16}
        done
      done ;;
    batchedmodes)
      for m in $models; do
        f=$(model "$m") || continue
        for mode in ${LOOM_BATCHED_MODES:--}; do
          env $(modeenv "$mode") timeout 120 "$(binof "$mode")/loom" bench -m "$f" -npp ${LOOM_NPP:-128} -ntg ${LOOM_NTG:-128} \
            -npl ${LOOM_NPL:-16,64} 2>/dev/null | grep -E "^\|" | grep -v -- "---" | grep -v "PP" | awk -v tag="$mode" '{ print $0 " " tag }'
        done
      done ;;
    perf)
      # LOOM_PERF_FILTER: one filter word (or, as before, "--filter WORD ..." words); LOOM_PERF_FILTERS and
      # LOOM_PERF_EXCLUDES: '|'-separated filters (all must match) and exclusions (none may), spaces allowed;
      # LOOM_PERF_TIMEOUT: seconds a mode (300; the big cases' inputs are made on the CPU, slowly)
      filters=()
      if [[ -n ${LOOM_PERF_FILTER:-} ]]; then
        if [[ $LOOM_PERF_FILTER == --* ]]; then read -ra fs <<<"$LOOM_PERF_FILTER"; filters+=("${fs[@]}")
        else filters+=(--filter "$LOOM_PERF_FILTER"); fi
      fi
      if [[ -n ${LOOM_PERF_FILTERS:-} ]]; then
        IFS='|' read -ra fs <<<"$LOOM_PERF_FILTERS"
        for f in "${fs[@]}"; do filters+=(--filter "$f"); done
      fi
      if [[ -n ${LOOM_PERF_EXCLUDES:-} ]]; then
        IFS='|' read -ra fs <<<"$LOOM_PERF_EXCLUDES"
        for f in "${fs[@]}"; do filters+=(--exclude "$f"); done
      fi
      for mode in ${LOOM_PERF_MODES:--}; do
        env $(modeenv "$mode") timeout ${LOOM_PERF_TIMEOUT:-300} "$(binof "$mode")/loom-test-ops" --backend cuda --numerics fast perf \
          --op ${LOOM_PERF_OP:-mul_mat} "${filters[@]}" >"$out/perf.log" 2>&1
        grep -E "us|GB/s|TFLOP" "$out/perf.log" | head -80 | awk -v tag="$mode" '{ print $0 " " tag }'
      done ;;
    serve)
      [[ ${LOOM_SERVE_VARIANTS:-}${LOOM_SERVE_FLAGS:-} == *-tp* ]] && find_nccl
      for m in $models; do
        f=$(model "$m") || continue
        echo "-- engine: loom bench -npp 256 -ntg 256 -npl 1,64; tg256; tg256 @ d256"
        [[ -n ${LOOM_SERVE_ONLY:-} ]] || timeout 200 "$bin/loom" bench -m "$f" -npp 256 -ntg 256 -npl 1,64 2>/dev/null | grep -E "^\|"
        # tg256 from position 0, and from 256 (-d 256: the positions of a stream below, 256-token prompt)
        [[ -n ${LOOM_SERVE_ONLY:-} ]] || timeout 60 "$bin/loom" bench -m "$f" -p 0 -n 256 -r 2 2>/dev/null | grep -E "tg256"
        [[ -n ${LOOM_SERVE_ONLY:-} ]] || timeout 60 "$bin/loom" bench -m "$f" -p 0 -n 256 -d 256 -r 2 2>/dev/null | grep -E "tg256"
        # LOOM_SERVE_VARIANTS: ';'-separated flag sets (ENV=VALUE words set the server's environment),
        # each a server of its own in turn ("-": the defaults); else LOOM_SERVE_FLAGS, one server
        IFS=';' read -ra variants <<<"${LOOM_SERVE_VARIANTS:-${LOOM_SERVE_FLAGS:--}}"
        for variant in "${variants[@]}"; do
        [[ $variant == "-" || $variant == " - " ]] && variant=""
        envs=() flags=()
        for w in $variant; do [[ $w == [A-Z]*=* ]] && envs+=("$w") || flags+=("$w"); done
        echo "-- serve flags: ${variant:-(defaults)}"
        env "${envs[@]}" "$bin/loom" serve -m "$f" -ngl 99 -np 64 -c 1024 --port 0 "${flags[@]}" >"$out/serve.out" 2>"$out/serve.err" &
        spid=$!
        for _ in $(seq 600); do [[ -s $out/serve.out ]] && break; sleep 0.1; done
        port=$(head -1 "$out/serve.out")
        for _ in $(seq 600); do
          python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
          sleep 0.2
        done
        echo "-- serve: 64 streams"
        timeout 200 python3 tools/serve_load.py --url "http://127.0.0.1:$port" -c 64 -n 64 --prompt-tokens 256 \
          --max-tokens 256 --ignore-eos --json
        echo "-- serve: one stream"
        timeout 100 python3 tools/serve_load.py --url "http://127.0.0.1:$port" -c 1 -n 2 --prompt-tokens 256 \
          --max-tokens 256 --ignore-eos --json
        if [[ -n ${LOOM_SOAK:-} ]]; then  # seconds of 64 streams back to back, memory sampled
          echo "-- serve: soak ${LOOM_SOAK} s"
          timeout $((LOOM_SOAK + 120)) python3 tools/serve_load.py --url "http://127.0.0.1:$port" -c 64 \
            --soak "$LOOM_SOAK" --prompt-tokens 256 --max-tokens 256 --ignore-eos --server-pid $spid \
            --max-growth-pct 5 --json
        fi
        python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())" \
          "http://127.0.0.1:$port/metrics" | grep -E "^loom_(steps|forward_passes|prompt_chunk_steps|mixed_steps)_total|^loom_(decode_step|prompt_step|inter_token)_seconds_(bucket|sum|count)|^loom_(graph_builds|decode_step_host_seconds|prompt_step_host_seconds|exec_host_seconds|exec_plan_seconds|exec_record_seconds|exec_instantiate_seconds|exec_chunk_graphs|exec_graphs_instantiated|exec_graph_replays)_total"
        kill $spid; wait $spid 2>/dev/null
        tail -3 "$out/serve.err"
        done
      done ;;
    prefilltrace)
      for m in $models; do
        f=$(model "$m") || continue
        head -c 3000 tests/data/shakespeare_heldout.txt >"$work/prompt.txt"
        timeout 120 "$bin/loom" run -m "$f" -f "$work/prompt.txt" -n 1 -c 4096 -ub ${LOOM_TRACE_UB:-512} --trace-prompt "$out/prefill-$(tag "$m").json" \
          >/dev/null 2>"$out/prefill-$(tag "$m").err" || tail -2 "$out/prefill-$(tag "$m").err"
        python3 tools/trace_summary.py "$out/prefill-$(tag "$m").json" --by-shape 2>&1 | head -${LOOM_TRACE_LINES:-24}
      done ;;
    decodetrace)
      for m in $models; do
        f=$(model "$m") || continue
        # LOOM_TRACE_WORDS=N: a prompt of N words instead (the step then attends over them)
        words_prompt "${LOOM_TRACE_WORDS:-}" "The quick brown fox"
        timeout 120 "$bin/loom" run -m "$f" "${prompt[@]}" -n 8 --stats --trace "$out/decode-$(tag "$m").json" \
          >/dev/null 2>"$out/decode-$(tag "$m").err" || tail -2 "$out/decode-$(tag "$m").err"
        grep -iE "kernels|per token|host" "$out/decode-$(tag "$m").err" | head -6
        python3 tools/trace_summary.py "$out/decode-$(tag "$m").json" --by-shape 2>&1 | head -${LOOM_TRACE_LINES:-24}
      done ;;
    fusedrift)  # the fast executor's fused-against-serialized logits drift per setting (LOOM_DRIFT_MODES, as
      # LOOM_DECODE_MODES) on LOOM_MODELS: which fold moves the logits of a random-weight model
      for m in $models; do
        f=$(model "$m") || continue
        for mode in ${LOOM_DRIFT_MODES:--}; do
          env LOOM_NUMERICS=fast $(modeenv "$mode") timeout 300 "$(binof "$mode")/loom-exec-equivalence" --steps 16 --runs 1 "$f" 2>&1 |
            grep -E "(graph|concurrency|fusion|reorder|all): (worst|teacher)" | sed "s/^/$mode: /"
        done
      done ;;
    attnncu)  # ncu sections of one decode step's attention kernels after a prompt of LOOM_TRACE_WORDS (4000) words
      for m in $models; do
        f=$(model "$m") || continue
        words_prompt "${LOOM_TRACE_WORDS:-4000}" ""
        for mode in ${LOOM_NCU_MODES:--}; do
          echo "-- $m, $mode"
          env $(modeenv "$mode") timeout 400 /usr/local/cuda/bin/ncu --kernel-name regex:${LOOM_NCU_REGEX:-flash_decode} \
            --launch-skip ${LOOM_NCU_SKIP:-64} --launch-count ${LOOM_NCU_COUNT:-2} \
            --cache-control none --clock-control none --section SpeedOfLight --section WarpStateStats --section LaunchStats \
            --section Occupancy --section MemoryWorkloadAnalysis "$(binof "$mode")/loom" run -m "$f" "${prompt[@]}" -n 3 --temp 0 \
            2>/dev/null | grep -vE "^ *(-|$)" | grep -E "${LOOM_NCU_GREP:-flash_decode|Duration|Throughput|Busy|Stall|Warp Cycles|Registers|Shared Memory Config|Block Limit|Achieved|Theoretical Occ|Elapsed|Issued|Eligible|One or More|No Eligible}" | head -${LOOM_TRACE_LINES:-80}
        done
      done ;;
    samebits)  # greedy logits of this build against @base's (build-carry/base.tar.xz), bit for bit, on LOOM_MODELS:
      # a short prompt and prompts of about each of LOOM_SAMEBITS_WORDS tokens (default 1500), 32 tokens generated
      for m in $models; do
        f=$(model "$m") || continue
        for words in 0 ${LOOM_SAMEBITS_WORDS:-1500}; do
          words_prompt "$words" "Once upon a time"
          for b in "$bin" "$bin_base"; do
            # the prompt's logits (--dump-logits) and the generated steps' (--dump-step-logits: the decode path's)
            timeout 120 "$b/loom" run -m "$f" "${prompt[@]}" -n 32 --temp 0 --dump-logits "$work/sb-$(basename "$b").bin" \
              --dump-step-logits "$work/sb-$(basename "$b").steps" >"$work/sb-$(basename "$b").txt" 2>"$work/sb.err" ||
              tail -2 "$work/sb.err"
          done
          r="DIFFER"
          cmp -s "$work/sb-bin.bin" "$work/sb-bin-base.bin" && cmp -s "$work/sb-bin.txt" "$work/sb-bin-base.txt" && r="bit-identical"
          rs="DIFFER"
          cmp -s "$work/sb-bin.steps" "$work/sb-bin-base.steps" && rs="bit-identical"
          echo "samebits $m (prompt ~$words words, $(grep -oE "prompt [0-9]+ tokens" "$work/sb.err")): prompt logits and text against @base $r ($(stat -c %s "$work/sb-bin.bin") bytes);" \
            "generated steps' logits $rs ($(stat -c %s "$work/sb-bin.steps") bytes)"
        done
      done ;;
    decodediff)  # greedy decode logits under LOOM_DIFF_A against LOOM_DIFF_B (','-separated VAR=VALUE settings, "-"
      # none; e.g. A "-", B "LOOM_FLASH_DECODE_MMA=0"): the 16 decode steps' logits (--dump-step-logits), NMSE and argmax agreement after
      # a short prompt and prompts of about each of LOOM_SAMEBITS_WORDS words (default 1500)
      for m in $models; do
        f=$(model "$m") || continue
        vocab=$("$bin/loom" info -m "$f" 2>/dev/null | awk '/vocab_size/ {print $NF; exit}')
        for words in 0 ${LOOM_SAMEBITS_WORDS:-1500}; do
          words_prompt "$words" "Once upon a time"
          for side in A B; do
            var=LOOM_DIFF_$side
            env $(modeenv "${!var:--}") timeout 120 "$bin/loom" run -m "$f" "${prompt[@]}" -n 17 --temp 0 \
              --dump-step-logits "$work/dd-$side.bin" >"$work/dd-$side.txt" 2>"$work/dd.err" || tail -2 "$work/dd.err"
          done
          cmp -s "$work/dd-A.bin" "$work/dd-B.bin" && echo "decodediff: the 16 steps' logits bit-identical"
          python3 tools/compare_logits.py "$work/dd-A.bin" "$work/dd-B.bin" --threshold 1e-3 --vocab "${vocab:-0}" \
            --label "$m, ~$words words, ${LOOM_DIFF_A:--} against ${LOOM_DIFF_B:--}"
          cmp -s "$work/dd-A.txt" "$work/dd-B.txt" && echo "decodediff: the same 16 greedy tokens" || echo "decodediff: greedy text differs"
        done
      done ;;
    plans)
      [[ ${LOOM_PLAN_TP:-1} == *2* || ${LOOM_PLAN_TP:-1} == *4* ]] && find_nccl
      for m in $models; do
        f=$(model "$m") || continue
        for n in ${LOOM_PLAN_TP:-1}; do
          timeout 120 "$bin/loom" run -m "$f" -p "The quick brown fox jumps over the lazy dog" -n 8 --temp 0 --stats \
            -tp $n 2>&1 >/dev/null | grep -E "fusions|kernels/token" | sed "s/^/$m -tp $n: /"
        done
      done ;;
    normquant)
      # the norms' quantized-activation hand-off against LOOM_CUDA_NORM_QUANT=0 (f32 norm outputs and a
      # quantize kernel per mat-vec): logits of a greedy run bit-identical, and the dispatches marked
      for m in $models; do
        f=$(model "$m") || continue
        for nq in 1 0; do
          base=""
          [[ $nq == 0 ]] && base=$(tr "," " " <<<"${LOOM_NQ_BASE:-LOOM_CUDA_NORM_QUANT=0}")
          # both with flash-decoding's splits: without a hand-off (an f32 attention output) few keys take one
          # (LOOM_NQ_SINGLE: that limit for both instead, e.g. 32768, against one split writing the activations)
          env $base LOOM_FLASH_DECODE_SINGLE=${LOOM_NQ_SINGLE:-0} LOOM_EXEC_DUMP="$work/nq$nq" timeout 120 "$bin/loom" run -m "$f" --numerics fast \
            -p "Once upon a time" -n 48 --temp 0 --dump-step-logits "$work/nq$nq.bin" >"$work/nq$nq.txt" 2>"$work/nq$nq.err" ||
            tail -2 "$work/nq$nq.err"
        done
        r="DIFFER"
        cmp -s "$work/nq1.bin" "$work/nq0.bin" && cmp -s "$work/nq1.txt" "$work/nq0.txt" && r="bit-identical"
        echo "normquant $m against ${LOOM_NQ_BASE:-LOOM_CUDA_NORM_QUANT=0}: generated steps' logits and text $r ($(stat -c %s "$work/nq1.bin") bytes of logits);" \
          "norms writing activations in the last plan: $(ls "$work"/nq1-*.txt | grep -v graph | sort -V | tail -1 | xargs grep -c "writes activations"), mat-vecs reading them: $(ls "$work"/nq1-*.txt | grep -v graph | sort -V | tail -1 | xargs grep -c "activations handed over)")"
        rm -f "$work"/nq[01]-*
      done ;;
    decodencu)
      # every kernel of one decode step under ncu (kernel time, DRAM bytes; caches not flushed, so what a
      # replayed graph sees up to ncu serializing the kernels), grouped by kernel and grid (tools/ncu_step.py)
      for m in $models; do
        f=$(model "$m") || continue
        us=$(timeout 120 "$bin/loom" bench -m "$f" -p 0 -n 128 -r 2 2>/dev/null | grep -E "tg128" | awk -F'|' '{ split($(NF-1), a, " "); printf "%.1f", 1e6 / a[1] }')
        timeout 400 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none --clock-control none --csv --page raw \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
          "$bin/loom" run -m "$f" -p "Hi" -n 3 --temp 0 >"$out/ncu-step-$(tag "$m").csv" 2>/dev/null
        echo "-- $m (tg128 step $us us)"
        python3 tools/ncu_step.py "$out/ncu-step-$(tag "$m").csv" "${LOOM_PEAK_GBS:-3350}" "$us" | head -${LOOM_TRACE_LINES:-40}
      done ;;
    batchedncu)
      # every kernel of one batched decode step (-npl LOOM_NPL, default 64, after 16-token prompts) under ncu,
      # grouped by kernel and grid (tools/ncu_step.py: from the second-to-last embedding get_rows to the last),
      # against the step's time from the same bench without ncu
      for m in $models; do
        f=$(model "$m") || continue
        npl=${LOOM_NPL:-64}
        us=$(timeout 120 "$bin/loom" bench -m "$f" -npp 16 -ntg 32 -npl "$npl" 2>/dev/null | grep -E "^\| +16 " |
          awk -F'|' '{ printf "%.1f", 1e6 * $8 / $3 }')
        timeout 400 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none --clock-control none --csv --page raw \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
          "$bin/loom" bench -m "$f" -npp 16 -ntg 3 -npl "$npl" >"$out/ncu-batched-$(tag "$m").csv" 2>/dev/null
        echo "-- $m, $npl sequences (a step $us us)"
        python3 tools/ncu_step.py "$out/ncu-batched-$(tag "$m").csv" "${LOOM_PEAK_GBS:-4350}" "$us" --first get_rows_kernel |
          head -${LOOM_TRACE_LINES:-40}
      done ;;
    kperf)
      # ncu kernel times (caches not flushed: what a replayed graph sees; LOOM_K_FLUSH=1 flushes them, as a
      # decode step's weights come from DRAM) of the op-test perf cases in LOOM_K_CASES (';'-separated
      # OP|FILTER), every kernel the case runs, averaged per kernel name
      IFS=';' read -ra cases <<<"${LOOM_K_CASES:-top_k|[128256] k=1;top_k|[128256] k=40;top_k|[128256, 64] k=64}"
      for c in "${cases[@]}"; do
       for mode in ${LOOM_K_MODES:--}; do
        env $(modeenv "$mode") timeout 120 /usr/local/cuda/bin/ncu --cache-control "$([[ ${LOOM_K_FLUSH:-0} == 1 ]] && echo all || echo none)" \
          --clock-control none -c 40 --csv --page raw \
          --metrics gpu__time_duration.sum "$(binof "$mode")/loom-test-ops" --backend cuda --numerics fast perf \
          --op "${c%%|*}" --filter "${c#*|}" 2>/dev/null | python3 -c '
import csv, sys, collections
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith("\""))]
head, t = rows[0], collections.defaultdict(list)
for r in rows[2:]:
    t[r[head.index("Kernel Name")].split("(")[0]].append(float(r[head.index("gpu__time_duration.sum")].replace(",", "")))
print("; ".join(f"{k} {sum(v) / len(v) / 1000:.2f} us (x{len(v)})" for k, v in t.items()))' |
          awk -v tag="kperf [$c] $mode: " '{ print tag $0 }'
       done
      done ;;
    devsample)
      # sampling in the graph against the host sampler on CUDA: loom run's text with and without
      # --host-sampling (same seed) over sampler settings and both numerics, loom chat, a sliding-window
      # model, the 1B file's speed both ways
      cmp_run() {  # label model args...
        local label=$1 m=$2; shift 2
        timeout 120 "$bin/loom" run -m "$m" --backend cuda "$@" >"$work/d.txt" 2>"$work/d.err"
        local rd=$?
        timeout 120 "$bin/loom" run -m "$m" --backend cuda "$@" --host-sampling >"$work/h.txt" 2>"$work/h.err"
        local rh=$? r="DIFFERS"
        cmp -s "$work/d.txt" "$work/h.txt" && r="same text"
        ((rd == 0 && rh == 0)) || r="FAILED (rc $rd / $rh: $(tail -1 "$work/d.err"))"
        echo "$label [$*]: $r ($(wc -c <"$work/d.txt") bytes) | device: $(tail -1 "$work/d.err" | grep -o 'generated.*') | host: $(tail -1 "$work/h.err" | grep -o 'generated.*')"
      }
      q8=models/loom-shakespeare-q8_0.gguf
      for num in exact fast; do
        cmp_run "q8 $num" $q8 --numerics $num -s 7 -n 200
        cmp_run "q8 $num" $q8 --numerics $num -s 3 -n 200 --temp 1.3 --top-k 100 --top-p 0.9 --min-p 0.02
        cmp_run "q8 $num" $q8 --numerics $num -n 200 --temp 0
        cmp_run "q8 $num" $q8 --numerics $num -s 11 -n 200 --top-k 1000 --temp 1.0 --top-p 1 --min-p 0
        cmp_run "q8 $num" $q8 --numerics $num -s 5 -n 100 --repeat-penalty 1.2
      done
      if g3=$(model gemma3-tiny:f16); then
        for num in exact fast; do
          cmp_run "gemma3 ring $num" "$g3" --numerics $num --ubatch-size 4 -s 5 -n 100 -p "The quick brown fox"
        done
      fi
      for how in device host; do
        f=()
        [[ $how == host ]] && f=(--host-sampling)
        printf 'ROMEO:\nAnd then?\n' | timeout 120 "$bin/loom" chat -m $q8 --backend cuda -n 40 -s 11 "${f[@]}" \
          >"$work/c-$how.txt" 2>"$work/c-$how.err"
      done
      cmp -s "$work/c-device.txt" "$work/c-host.txt" && echo "chat: same replies" || echo "chat: DIFFERS"
      for m in $models; do
        f=$(model "$m") || continue
        for num in exact fast; do cmp_run "$m $num" "$f" --numerics $num -s 9 -n 256 -p "Once upon a time"; done
      done ;;
    phases)  # bench/bench_phases.cu: dependent mat-vec phases, a kernel each (graph, graph+pdl) against one
      # persistent kernel with grid barriers (with and without the next phase's weights before the barrier)
      timeout 300 "$bin/bench_phases" ${LOOM_PHASES_ARGS:-} ;;
    sasswait)
      /usr/local/cuda/bin/cuobjdump -sass "$bin/libloom_cuda.so" | python3 tools/sass_wait.py ${LOOM_SASS_FILTER:+"$LOOM_SASS_FILTER"} ;;
    kprof)
      # one kernel (LOOM_KPROF_KERNEL, a regex) of one op-test perf case (LOOM_KPROF_CASE, OP|FILTER) under
      # ncu's speed-of-light, occupancy, launch and warp-state sections, and its top stall lines (SASS)
      c=${LOOM_KPROF_CASE:-mul_mat|a=q4_K[4096, 14336] b=f32[4096, 64]}
      args=(--backend cuda --numerics fast perf --op "${c%%|*}" --filter "${c#*|}")
      timeout 200 /usr/local/cuda/bin/ncu --clock-control none -k "regex:${LOOM_KPROF_KERNEL:-gemm_q_kernel}" -s 2 -c 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats \
        "$bin/loom-test-ops" "${args[@]}" 2>&1 | grep -vE "^==PROF==|^  *-+$" |
        grep -E "Duration|Throughput|Occupancy|Registers|Shared Memory|Block Size|Grid Size|Waves|Stall|Warp Cycles|Issued|Eligible|Active Warps|L1|L2|DRAM|Bank|Pipe|Executed Ipc|Instructions" | head -70
      timeout 200 /usr/local/cuda/bin/ncu --clock-control none -k "regex:${LOOM_KPROF_KERNEL:-gemm_q_kernel}" -s 2 -c 1 \
        --section SourceCounters --page source --print-source sass --csv "$bin/loom-test-ops" "${args[@]}" \
        >"$out/kprof-source.csv" 2>/dev/null
      python3 tools/ncu_source_stalls.py "$out/kprof-source.csv" 24 ;;
    mvperf)
      # ncu (caches flushed) of the fast mat-vec on LOOM_MV_CASES (op-test descriptions), once per
      # LOOM_MV_MODES entry (VAR=VALUE environment settings; "-" for none)
      IFS=';' read -ra cases <<<"${LOOM_MV_CASES:-q4_K[4096, 14336] b=f32[4096];q4_K[14336, 4096] b=f32[14336]}"
      for c in "${cases[@]}"; do
        for mode in ${LOOM_MV_MODES:--}; do
          r=$(env $(tr "," " " <<<"${mode/#-/}") timeout 60 /usr/local/cuda/bin/ncu --clock-control none -k regex:"mat_vec" -c 3 \
            --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum \
            "$bin/loom-test-ops" --backend cuda --numerics fast perf --op mul_mat --filter "$c" 2>&1 |
            grep -E "duration|throughput|inst_exec" | tail -3 | awk '{print $NF, $(NF-1)}' | tr '\n' ' ')
          echo "mvperf [$c] $mode: $r"
        done
      done ;;
    fastdiff)
      # fast against exact on CUDA, and CUDA exact against the CPU, per prompt position, on LOOM_MODELS
      # (e.g. "gptoss-tiny:q8_0 qwen3moe-tiny:q8_0 llama31-tiny:q8_0"; the vocabulary is read from the file)
      for m in $models; do
        f=$(model "$m") || continue
        vocab=$("$bin/loom" info -m "$f" 2>/dev/null | awk '/vocab_size/ {print $NF; exit}')
        for cfg in "cuda exact" "cuda fast" "cpu exact"; do
          set -- $cfg
          "$bin/loom" run -m "$f" --backend "$1" --numerics "$2" -p "The quick brown fox jumps over the lazy dog" \
            -n 16 --temp 0 --dump-logits "$work/fd-$1-$2.bin" >/dev/null 2>&1
        done
        python3 tools/compare_logits.py "$work/fd-cuda-fast.bin" "$work/fd-cuda-exact.bin" --threshold 1 \
          --vocab "${vocab:-0}" --label "$m fast vs exact"
        python3 tools/compare_logits.py "$work/fd-cuda-exact.bin" "$work/fd-cpu-exact.bin" --threshold 1 \
          --vocab "${vocab:-0}" --label "$m cuda vs cpu (exact)"
      done ;;
    peer)
      # llama.cpp (../shared/peer, built here, ~5 min) beside Loom on each of LOOM_MODELS in one run:
      # llama-bench against loom bench (-p 512 -n 128 -r 5), llama-batched-bench against loom bench
      # (-npp 256 -ntg 256 -npl LOOM_PEER_NPL, default 1,8,16,32,64)
      pdir=shared/peer; [[ -d $pdir ]] || pdir=../shared/peer
      [[ -x $HOME/peer/build/bin/llama-bench ]] || bash "$pdir/build-llama-cpp.sh" "$HOME/peer" 2>&1 | tail -3
      npl=${LOOM_PEER_NPL:-1,8,16,32,64}
      for m in $models; do
        f=$(model "$m") || continue
        echo "-- $m: loom bench"; timeout 120 "$bin/loom" bench -m "$f" -p 512 -n 128 -r 5 2>/dev/null | grep "^|"
        echo "-- $m: llama-bench"
        timeout 120 "$HOME/peer/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 5 2>&1 | grep "^|"
        echo "-- $m: loom bench batched"
        timeout 200 "$bin/loom" bench -m "$f" -npp 256 -ntg 256 -npl "$npl" 2>/dev/null | grep "^|"
        echo "-- $m: llama-batched-bench"
        timeout 200 "$HOME/peer/build/bin/llama-batched-bench" -m "$f" -ngl 99 -fa on -c 33792 -b 2048 -ub 512 \
          -npp 256 -ntg 256 -npl "$npl" 2>&1 | grep "^|"
      done ;;
    batchcheck)
      fs=(models/loom-shakespeare-f16.gguf)
      for m in $models; do f=$(model "$m") && fs+=("$f"); done
      for mode in ${LOOM_BATCHCHECK_MODES:-exact fast fast-deterministic}; do
        env LOOM_NUMERICS=${mode%-*} $([[ $mode == *-deterministic ]] && echo LOOM_DETERMINISTIC=1) timeout 300 \
          "$bin/loom-exec-equivalence" --steps 16 --runs 2 "${fs[@]}" 2>&1 |
          grep -E "FAIL|together|sampled|failures|differ" ; done ;;
    tp)  # tensor parallelism: -tp N (LOOM_TP, default 2 and 4 when there are GPUs for them) against -tp 1
      find_nccl
      tps=${LOOM_TP:-$( (($(nvidia-smi -L | wc -l) >= 4)) && echo "2 4" || echo 2)}
      p="The quick brown fox jumps over the lazy dog and then"
      tlim=${LOOM_TP_TIMEOUT:-90}
      # all-reduce paths (LOOM_TP_AR): ll (the default: the LL all-reduce folded into the next norm in
      # decode steps, the other small ones by the LL kernel, NCCL for prefill), fused (folded ones only:
      # LOOM_TP_ALLREDUCE=nccl), nccl (LOOM_TP_LL=0: NCCL only)
      ars=${LOOM_TP_AR:-ll nccl}
      ar_env() { case $1 in nccl) echo LOOM_TP_LL=0 ;; fused) echo LOOM_TP_ALLREDUCE=nccl ;; *) echo LOOM_TP_LL=1 ;; esac; }
      for m in $models; do
        f=$(model "$m") || continue
        for mode in ${LOOM_TP_MODES:-exact fast}; do
          timeout -k 5 $tlim "$bin/loom" run -m "$f" -p "$p" -n 24 --temp 0 --numerics $mode --dump-logits "$work/tp1.bin" \
            >"$work/tp1.txt" 2>"$out/tp1.err" || tail -3 "$out/tp1.err"
          for n in $tps; do for ar in $ars; do
            t0=$(date +%s)
            env $(ar_env $ar) timeout -k 5 $tlim "$bin/loom" run -m "$f" -p "$p" -n 24 --temp 0 --numerics $mode -tp $n \
              --dump-logits "$work/tp$n-$ar.bin" >"$work/tp$n-$ar.txt" 2>"$out/tp$n-$mode-$ar.err"
            echo "run -tp $n ($ar) rc=$? in $(($(date +%s) - t0)) s"; tail -1 "$out/tp$n-$mode-$ar.err"
            python3 tools/compare_logits.py "$work/tp$n-$ar.bin" "$work/tp1.bin" --threshold 1e-6 --label "$m $mode -tp $n $ar prompt logits"
            cmp -s "$work/tp$n-$ar.txt" "$work/tp1.txt" && echo "$m $mode -tp $n $ar: same 24 greedy tokens" ||
              { echo "$m $mode -tp $n $ar: greedy text differs"; head -c 300 "$work/tp1.txt"; echo; head -c 300 "$work/tp$n-$ar.txt"; echo; }
            # sampled in the graph (each rank gathers the vocabulary) against the host sampler, same seed
            for hs in "" --host-sampling; do
              env $(ar_env $ar) timeout -k 5 $tlim "$bin/loom" run -m "$f" -p "$p" -n 24 --temp 0.8 --seed 5 --numerics $mode \
                -tp $n $hs >"$work/tps$hs.txt" 2>/dev/null
            done
            cmp -s "$work/tps.txt" "$work/tps--host-sampling.txt" && echo "$m $mode -tp $n $ar: sampled text as the host sampler's" ||
              echo "$m $mode -tp $n $ar: sampled text DIFFERS from the host sampler's"
            first=${ars%% *}
            [[ $ar != "$first" ]] && { cmp -s "$work/tp$n-$ar.bin" "$work/tp$n-$first.bin" &&
              echo "$m $mode -tp $n: $ar and $first logits bit-identical" || echo "$m $mode -tp $n: $ar and $first logits differ"; }
          done; done
        done
        for n in $tps; do for ar in $ars; do  # rank 0's trace of a decode step: the all-reduces' share (they wait for the peers)
          env $(ar_env $ar) timeout -k 5 $tlim "$bin/loom" run -m "$f" -p "$p" -n 8 --temp 0 -tp $n --stats --trace "$out/tp$n-$ar-$(tag "$m").json" \
            >/dev/null 2>"$out/tp$n-$ar-stats.err" && grep -E "fusions|kernels/token|tensor-parallel ranks" "$out/tp$n-$ar-stats.err" | tail -3 && python3 tools/trace_summary.py "$out/tp$n-$ar-$(tag "$m").json" | grep -E "dispatch|all_reduce|total" |
            sed "s/^/-tp $n $ar trace: /"
        done; done
        for n in 1 $tps; do for ar in $ars; do
          [[ $n == 1 && $ar != ${ars%% *} ]] && continue
          t0=$(date +%s)
          env $(ar_env $ar) timeout -k 5 $tlim "$bin/loom" bench -m "$f" ${LOOM_TP_BENCH:--p 512 -n 128 -r 3} -tp $n >"$out/tpbench$n-$ar.out" 2>"$out/tpbench$n-$ar.err"
          echo "-- $m -tp $n ($ar): rc=$? in $(($(date +%s) - t0)) s"
          grep -E "^\|" "$out/tpbench$n-$ar.out" | grep -v -- "---" || tail -3 "$out/tpbench$n-$ar.err"
        done; done
        for n in $tps; do
          LOOM_NUMERICS=fast timeout -k 5 300 "$bin/loom-exec-equivalence" --tp $n "$f" 2>&1 | grep -E "exec-equivalence"
          [[ -n ${LOOM_TP_NPL:-} ]] && for k in 1 $n; do  # batched decode, unsplit and split
            # the table, then (split) each rank's part of a decode pass and when it began
            timeout -k 5 240 "$bin/loom" bench -m "$f" -npp 128 -ntg 32 -npl $LOOM_TP_NPL -tp $k 2>"$out/tpnpl$k.err" |
              grep -E "^\|" | grep -v -- "---" | sed "s/^/-tp $k: /"
            grep -E "ranks' parts" "$out/tpnpl$k.err"
          done
        done
      done ;;
    tp70b)  # a model no GPU holds alone: synthetic llama3-70b F16 (141 GB of file: the disk of a x4, or LOOM_WORK=/dev/shm/loom)
      find_nccl
      t0=$(date +%s)
      f=$(model llama3-70b:f16) || { echo "gen-model llama3-70b f16 failed"; continue; }
      echo "generated in $(($(date +%s) - t0)) s: $(du -h "$f" | cut -f1)"
      for n in ${LOOM_TP:-2 4}; do
        t0=$(date +%s)
        timeout -k 5 ${LOOM_TP_TIMEOUT:-600} "$bin/loom" bench -m "$f" -p 512 -n 32 -r 1 -tp $n >"$out/tp70b-$n.out" 2>"$out/tp70b-$n.err"
        echo "-- 70B F16 -tp $n: rc=$? in $(($(date +%s) - t0)) s"; grep -iE "split over|GiB|error" "$out/tp70b-$n.err" | head -4; grep -E "^\|" "$out/tp70b-$n.out" | grep -v -- "---" || tail -3 "$out/tp70b-$n.err"
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
stamp done
