#!/usr/bin/env bash
# tools/bench.sh — throughput benchmark: our trainer against PyTorch, side by side in one call.
#
# GPU (default): GPT-2 d12, T 1024, for several batch sizes; PyTorch with torch.compile, bf16
# autocast, fused AdamW (tools/bench_pytorch.py). Run from anywhere on the GPU machine after
# `make -j16`:
#
#   tools/bench.sh [--quick] [--bs "16 32 64"] [--skip_pytorch] [--skip_ours]
#                  [--notes FILE] [--out DIR]
#
#   --quick         ours 15 steps (median over steps 6..15), PyTorch 5 warm-up + 10 timed steps
#                   (default: ours 40 steps, median over steps 11..40; PyTorch 10 + 30)
#   --bs LIST       batch sizes (default "16 32 64")
#   --skip_pytorch  run only our trainer;  --skip_ours: run only PyTorch
#   --out DIR       keep the runs here (default runs/bench); a side that is skipped is read
#                   from DIR when an earlier call left it there (so the two sides can run in
#                   two calls: --skip_pytorch, then --skip_ours); the table goes to DIR/table.md
#   --notes FILE    also append the table, the date and `git rev-parse --short HEAD` to FILE
#   env: PYTHON (python3 with torch, default python3), RUN_TIMEOUT (s per trainer run, 300),
#        PT_TIMEOUT (s for all of PyTorch, 540)
#
# CPU (--device cpu): fp32, GPT-2 d12, B 4, T 256 unless --model/--model_flags/--bs/--seq_len
# say otherwise, at each thread count of --threads (default "1 4 16"): ours with
# OMP_NUM_THREADS=n, PyTorch eager with torch.set_num_threads(n) and the same model, AdamW and
# clipping. Ours 8 steps (median over steps 3..8; --quick 4, over 2..4), PyTorch 2 + 6 (--quick
# 1 + 3). The table | threads | ours ms/step | PyTorch ms/step | ratio | (ratio = PyTorch's
# ms / ours: above 1 we are faster) goes to DIR/table_cpu.md. A tiny smoke test of the script:
#   tools/bench.sh --device cpu --quick --threads "1 2" --model d2 --bs 2 --seq_len 32 \
#       --model_flags "--n_embd 32 --n_head 2 --max_seq_len 64"
#
# Ours: median tokens_per_s and median mfu of log.jsonl over the steps after the warm-up, max
# peak_alloc_mb / peak_reserved_mb over all steps. MFU (both sides) = flops_per_token * tokens/s
# / 989e12 (H200 dense bf16), flops_per_token = 6*(12*L*C^2 + Vp*C) + 12*L*C*T, Vp = 50304.
# PyTorch: median step time by CUDA events over the timed steps, peak memory over them.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
PT_TIMEOUT=${PT_TIMEOUT:-540}
BS=""
QUICK=0 SKIP_PT=0 SKIP_OURS=0
NOTES="" OUT="runs/bench" DEVICE=cuda MODEL=d12 MODEL_FLAGS="" T="" THREADS="1 4 16"
die() { echo "bench.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --skip_pytorch) SKIP_PT=1 ;;
        --skip_ours) SKIP_OURS=1 ;;
        --bs|--notes|--out|--device|--model|--model_flags|--seq_len|--threads)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                --bs) BS="$2" ;; --notes) NOTES="$2" ;; --out) OUT="$2" ;; --device) DEVICE="$2" ;;
                --model) MODEL="$2" ;; --model_flags) MODEL_FLAGS="$2" ;; --seq_len) T="$2" ;;
                --threads) THREADS="$2" ;;
            esac
            shift ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
[ "$DEVICE" = cpu ] && : "${BS:=4}" "${T:=256}"
: "${BS:=16 32 64}" "${T:=1024}"
BS=$(echo "$BS" | tr ',' ' ')
for b in $BS; do [[ "$b" =~ ^[1-9][0-9]*$ ]] || die "--bs: '$b' is not a positive integer"; done
[ -n "$BS" ] || die "--bs is empty"
[[ "$T" =~ ^[1-9][0-9]*$ ]] || die "--seq_len: '$T' is not a positive integer"
[ "$DEVICE" = cuda ] || [ "$DEVICE" = cpu ] || die "--device must be cuda or cpu"
if [ $QUICK = 1 ]; then ITERS=15 SKIP=5 PT_WARM=5 PT_STEPS=10; else ITERS=40 SKIP=10 PT_WARM=10 PT_STEPS=30; fi
mkdir -p "$OUT" || die "--out $OUT: cannot create"
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ "$REV" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && REV="$REV+dirty"
if [ "$DEVICE" = cuda ]; then
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
else
    GPU="cpu"
fi
echo "bench.sh: $MODEL $MODEL_FLAGS T $T | B: $BS | device $DEVICE (${GPU:-?}) | rev $REV | out $OUT"

# ---- CPU: ours and PyTorch at each thread count ----
if [ "$DEVICE" = cpu ]; then
    [ "$(echo $BS | wc -w)" = 1 ] || die "--device cpu takes one batch size (--bs)"
    for n in $THREADS; do [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--threads: '$n' is not a positive integer"; done
    if [ $QUICK = 1 ]; then ITERS=4 SKIP=1 PT_WARM=1 PT_STEPS=3; else ITERS=8 SKIP=2 PT_WARM=2 PT_STEPS=6; fi
    CPU_NAME=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')
    echo "bench.sh: CPU ${CPU_NAME:-?}, $(nproc) CPUs; threads: $THREADS"
    if [ $SKIP_OURS = 0 ]; then
        for f in ./train_gpt2 build/make_shard; do [ -x "$f" ] || die "$f not found: run make first"; done
        SHARD="$OUT/bench_shard_cpu.bin"
        build/make_shard "$SHARD" $((BS * T * (ITERS + 2) + 1)) 1 >/dev/null || die "build/make_shard failed"
        for n in $THREADS; do
            dir="$OUT/ours_cpu_t$n"
            rm -rf "$dir"; mkdir -p "$dir"
            OMP_NUM_THREADS=$n timeout "$RUN_TIMEOUT" ./train_gpt2 --device cpu --model "$MODEL" $MODEL_FLAGS \
                --batch_size "$BS" --sequence_length "$T" --num_iterations "$ITERS" --input_bin "$SHARD" \
                --learning_rate 6e-4 --weight_decay 0.1 --grad_clip 1.0 --val_loss_every 0 --sample_every 0 \
                --output_dir "$dir" >"$dir/out.txt" 2>&1
            rc=$?
            echo "$rc" >"$dir/rc"
            [ $rc -eq 0 ] || { echo "ours, $n threads: FAILED (exit $rc):"; tail -3 "$dir/out.txt"; }
            echo "ours, $n threads: $(grep -E "^step +$ITERS/" "$dir/out.txt")"
        done
        rm -f "$SHARD"
    fi
    if [ $SKIP_PT = 0 ]; then
        for n in $THREADS; do
            rm -f "$OUT/pytorch_cpu_t$n.json"
            OMP_NUM_THREADS=$n timeout "$PT_TIMEOUT" "$PYTHON" tools/bench_pytorch.py --device cpu --no_compile \
                --dtype fp32 --threads "$n" --model "$MODEL" $MODEL_FLAGS --batch_size "$BS" --seq_len "$T" \
                --warmup "$PT_WARM" --steps "$PT_STEPS" --json "$OUT/pytorch_cpu_t$n.json" 2>&1 | tail -2
        done
    fi
    "$PYTHON" - "$OUT" "$SKIP" "$THREADS" >"$OUT/table_cpu.md" <<'EOF'
import json, os, statistics, sys
out, skip, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
print("| threads | ours ms/step | PyTorch ms/step | ratio |")
print("|--:|--:|--:|--:|")
for n in threads:
    ours = None
    try:
        ms = [json.loads(l)["ms"] for l in open(os.path.join(out, f"ours_cpu_t{n}", "log.jsonl"))
              if l.strip() and '"ms"' in l]
        ms = ms[skip:] if len(ms) > skip else ms[-1:]
        ours = statistics.median(ms) if ms else None
    except (OSError, ValueError, KeyError):
        pass
    pt = None
    try:
        r = json.load(open(os.path.join(out, f"pytorch_cpu_t{n}.json")))
        pt = next(iter(r.values())).get("ms")
    except (OSError, ValueError, StopIteration):
        pass
    f = lambda x: "-" if x is None else f"{x:,.1f}"
    ratio = f"{pt / ours:.2f}" if ours and pt else "-"
    print(f"| {n} | {f(ours)} | {f(pt)} | {ratio} |")
EOF
    echo
    echo "$(date '+%Y-%m-%d %H:%M %Z') | rev $REV | ${CPU_NAME:-cpu} | $MODEL $MODEL_FLAGS B $BS T $T fp32 | ours $ITERS steps (median over steps $((SKIP + 1))..$ITERS), PyTorch eager $PT_WARM + $PT_STEPS steps | ratio = PyTorch ms / ours"
    echo
    cat "$OUT/table_cpu.md"
    exit 0
fi

# ---- ours ----
if [ $SKIP_OURS = 0 ]; then
    for f in ./train_gpt2 build/make_shard; do [ -x "$f" ] || die "$f not found: run make -j16 first"; done
    maxb=0; for b in $BS; do [ "$b" -gt "$maxb" ] && maxb=$b; done
    SHARD="$OUT/bench_shard.bin"
    ntok=$((maxb * T * (ITERS + 5) + 1))
    build/make_shard "$SHARD" "$ntok" 1 || die "build/make_shard failed"
    for b in $BS; do
        dir="$OUT/ours_B$b"
        rm -rf "$dir"; mkdir -p "$dir"
        echo "---- ours B $b: $ITERS steps"
        timeout "$RUN_TIMEOUT" ./train_gpt2 --device "$DEVICE" --model "$MODEL" $MODEL_FLAGS --batch_size "$b" \
            --sequence_length "$T" --num_iterations "$ITERS" --input_bin "$SHARD" --learning_rate 6e-4 \
            --weight_decay 0.1 --grad_clip 1.0 --output_dir "$dir" >"$dir/out.txt" 2>&1
        rc=$?
        echo "$rc" >"$dir/rc"
        if [ $rc -ne 0 ]; then echo "ours B $b FAILED (exit $rc):"; tail -5 "$dir/out.txt"; fi
        grep -E "^step +$ITERS/" "$dir/out.txt" || true
    done
    rm -f "$SHARD"
fi

# ---- PyTorch ----
if [ $SKIP_PT = 0 ]; then
    echo "---- PyTorch: $PT_WARM warm-up + $PT_STEPS timed steps per B"
    ptflags=""
    [ "$DEVICE" = cpu ] && ptflags="--device cpu --no_compile"
    # bench_pytorch takes --n_embd/--n_head/--max_seq_len like our trainer
    rm -f "$OUT/pytorch.json"
    timeout "$PT_TIMEOUT" "$PYTHON" tools/bench_pytorch.py --model "$MODEL" $MODEL_FLAGS --batch_size "$BS" \
        --seq_len "$T" --warmup "$PT_WARM" --steps "$PT_STEPS" --json "$OUT/pytorch.json" $ptflags \
        2>&1 | tee "$OUT/pytorch.txt"
    rc=${PIPESTATUS[0]}
    [ $rc -eq 0 ] || echo "PyTorch exited $rc (124 = timed out after $PT_TIMEOUT s); the table shows what it measured"
fi

# ---- the table ----
[ $SKIP_OURS = 1 ] && ls -d "$OUT"/ours_B* >/dev/null 2>&1 && echo "(ours: reusing the runs an earlier call left in $OUT)"
[ $SKIP_PT = 1 ] && [ -f "$OUT/pytorch.json" ] && echo "(PyTorch: reusing $OUT/pytorch.json from an earlier call)"
"$PYTHON" - "$OUT" "$SKIP" "$BS" >"$OUT/table.md" <<'EOF'
import json, os, statistics, sys
out, skip, bs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
try:
    pt = json.load(open(os.path.join(out, "pytorch.json")))
except (OSError, ValueError):
    pt = {}
def fmt_mem(a, r):
    return "-" if a is None else f"{a:,.0f} / {r:,.0f}"
print("| B | ours tok/s | ours MFU | ours peak alloc/reserved MB | PyTorch tok/s | PyTorch peak alloc/reserved MB | ratio ours/PyTorch |")
print("|--:|-----------:|---------:|----------------------------:|--------------:|-------------------------------:|-------------------:|")
for b in bs:
    steps = []
    try:
        for line in open(os.path.join(out, f"ours_B{b}", "log.jsonl")):
            if line.strip():
                r = json.loads(line)
                if "tokens_per_s" in r:
                    steps.append(r)
    except (OSError, ValueError):
        pass
    ours_tps = None
    if steps:
        last = max(r["step"] for r in steps)
        k = skip if last > skip else min(1, last - 1)  # too short a run: skip only the first step
        timed = [r for r in steps if r["step"] > k]
        ours_tps = statistics.median(r["tokens_per_s"] for r in timed)
        mfu = statistics.median(r["mfu"] for r in timed)
        alloc = max(r["peak_alloc_mb"] for r in steps)
        res = max(r["peak_reserved_mb"] for r in steps)
        o = f"{ours_tps:,.0f} | {100 * mfu:.1f}% | {fmt_mem(alloc, res)}"
        if len(timed) < 2 or not os.path.exists(os.path.join(out, f"ours_B{b}", "rc")) or \
                open(os.path.join(out, f"ours_B{b}", "rc")).read().strip() != "0":
            o = o.replace(" |", " (partial) |", 1)
    else:
        o = "failed | - | -" if os.path.isdir(os.path.join(out, f"ours_B{b}")) else "not run | - | -"
    p = pt.get(b)
    if p is None:
        ps, ratio = "not run | -", "-"
    elif "error" in p:
        ps, ratio = f"failed ({p['error'][:60]}) | -", "-"
    else:
        eager = "" if p.get("compiled", True) else " (eager)"
        ps = f"{p['tokens_per_s']:,.0f}{eager} | {fmt_mem(p['peak_alloc_mb'], p['peak_reserved_mb'])}"
        ratio = f"{ours_tps / p['tokens_per_s']:.3f}" if ours_tps else "-"
    print(f"| {b} | {o} | {ps} | {ratio} |")
EOF
[ $? -eq 0 ] || die "could not build the table (see $OUT/table.md)"
stamp="$(date '+%Y-%m-%d %H:%M %Z') | rev $REV | ${GPU:-$DEVICE} | $MODEL $MODEL_FLAGS T $T | ours $ITERS steps (median over steps $((SKIP+1))..$ITERS), PyTorch $PT_WARM + $PT_STEPS steps$([ $QUICK = 1 ] && echo ' (--quick)')"
echo
echo "$stamp"
echo
cat "$OUT/table.md"
echo
echo "MFU = (6*(12*L*C^2 + Vp*C) + 12*L*C*T) * tokens/s / 989e12"
if [ -n "$NOTES" ]; then
    {
        echo
        echo "### GPU benchmark, $stamp"
        echo
        cat "$OUT/table.md"
    } >>"$NOTES" || die "--notes $NOTES: cannot append"
    echo "appended to $NOTES"
fi
