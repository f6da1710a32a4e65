#!/usr/bin/env bash
# test/test_gpu_vs_pytorch.sh — our CUDA bf16 trainer against PyTorch bf16 autocast:
# 20 training steps of a d12 from the same llm.c checkpoint, same data (--shuffle 0),
# same hyperparameters (B 8, T 1024, lr 6e-4 cosine, warmup 5, final frac 0.1,
# weight decay 0.1, clip 1.0): every step's loss within 2% relative, and the loss
# falls. PyTorch's side is tools/pytorch_train_d12.py (fp32 params, autocast bf16).
#
#   test/test_gpu_vs_pytorch.sh [--out DIR]      on the GPU machine, after make
#   test/test_gpu_vs_pytorch.sh --cpu [--out DIR] the same comparison on the CPU at a tiny
#                  size (d2, C 32, T 32, B 2, 12 steps at lr 1e-2 on a 12-row shard so the data
#                  wraps), our fp32 CPU trainer against PyTorch fp32: within 1e-5 relative.
#   PYTHON=...     the python3 with torch (default python3)
#   --out DIR      keep both runs' logs, the losses JSON and the table there
# Without CUDA for torch (GPU mode) it reports "skipped" and passes.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MODE=gpu
OUTDIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) MODE=cpu ;;
        --out) [ $# -ge 2 ] || { echo "error: --out needs a folder" >&2; exit 2; }; OUTDIR="$2"; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for f in ./train_gpt2 build/make_shard tools/pytorch_train_d12.py; do
    [ -e "$f" ] || { echo "error: $f not found; run make first" >&2; exit 1; }
done
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "skipped: '$PYTHON' has no torch (set PYTHON=...)"
    finish test_gpu_vs_pytorch; exit $?
fi

if [ $MODE = gpu ]; then
    if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        echo "skipped: torch sees no CUDA device"
        finish test_gpu_vs_pytorch; exit $?
    fi
    STEPS=20 TOL=0.02
    build/make_shard "$TMP/shard.bin" $((8 * 1024 * 25)) 11
    SHAPE="--device cuda --model d12"
    HP="--batch_size 8 --sequence_length 1024 --num_iterations $STEPS --learning_rate 6e-4 --warmup_iters 5
        --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 1.0 --beta1 0.9 --beta2 0.95 --eps 1e-8"
    OURS_DT="--device cuda --dtype bf16"
    PT_DT="--device cuda --dtype bf16"
else
    STEPS=12 TOL=1e-5
    build/make_shard "$TMP/shard.bin" 400 5
    SHAPE="--device cpu --model d2 --n_embd 32 --n_head 2 --max_seq_len 64 --batch_size 2 --sequence_length 32"
    HP="--batch_size 2 --sequence_length 32 --num_iterations $STEPS --learning_rate 1e-2 --warmup_iters 3
        --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 1.0 --beta1 0.9 --beta2 0.95 --eps 1e-8"
    OURS_DT="--device cpu --dtype fp32"
    PT_DT="--device cpu --dtype fp32"
fi
echo "mode $MODE: $STEPS steps, tolerance $TOL relative; python $("$PYTHON" -c 'import torch; print("torch", torch.__version__)')"

# 1. the checkpoint, written by our trainer
if timeout 300 ./train_gpt2 $SHAPE --num_iterations 0 --input_bin "$TMP/shard.bin" \
        --save_model "$TMP/ckpt.bin" >"$TMP/ckpt.txt" 2>&1 && [ -s "$TMP/ckpt.bin" ]; then
    ok "our trainer writes the checkpoint ($(stat -c %s "$TMP/ckpt.bin") bytes)"
else
    bad "our trainer writes the checkpoint:"; tail -5 "$TMP/ckpt.txt"
    finish test_gpu_vs_pytorch; exit $?
fi
grep "^model" "$TMP/ckpt.txt"

# 2. our trainer from it
t0=$(date +%s.%N)
if timeout 300 ./train_gpt2 --model "$TMP/ckpt.bin" --input_bin "$TMP/shard.bin" $HP $OURS_DT \
        --lr_schedule cosine --shuffle 0 --output_dir "$TMP/ours" >"$TMP/ours.txt" 2>&1; then
    ok "our trainer: $STEPS steps ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)"
else
    bad "our trainer: $STEPS steps:"; tail -5 "$TMP/ours.txt"
fi
head -1 "$TMP/ours.txt"

# 3. PyTorch from it
t0=$(date +%s.%N)
if timeout 300 "$PYTHON" tools/pytorch_train_d12.py --model "$TMP/ckpt.bin" --input_bin "$TMP/shard.bin" \
        $HP $PT_DT --json "$TMP/pytorch.json" >"$TMP/pytorch.txt" 2>&1; then
    ok "PyTorch: $STEPS steps ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)"
else
    bad "PyTorch: $STEPS steps:"; tail -5 "$TMP/pytorch.txt"
fi
head -1 "$TMP/pytorch.txt"

# 4. compare: one check per step, then the loss falls
"$PYTHON" - "$TMP/ours/log.jsonl" "$TMP/pytorch.json" "$STEPS" "$TOL" >"$TMP/compare.txt" 2>&1 <<'EOF'
import json, math, sys
log, ptj, steps, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
ours = {}
try:
    for line in open(log):
        line = line.strip()
        if line:
            r = json.loads(line)
            if "loss" in r:
                ours[r["step"]] = r
except (OSError, ValueError) as e:
    print(f"FAIL our log {log} unreadable: {e}")
try:
    pt = json.load(open(ptj))
except (OSError, ValueError) as e:
    print(f"FAIL PyTorch losses {ptj} unreadable: {e}")
    pt = {"losses": [], "norms": []}
print(f"| step | ours loss | PyTorch loss | rel diff | ours norm | PyTorch norm |")
print(f"|-----:|----------:|-------------:|---------:|----------:|-------------:|")
res, worst = [], 0.0
for s in range(1, steps + 1):
    o = ours.get(s)
    p = pt["losses"][s - 1] if len(pt["losses"]) >= s else None
    if o is None or p is None or not math.isfinite(o["loss"]) or not math.isfinite(p):
        print(f"| {s} | {o['loss'] if o else 'missing'} | {p if p is not None else 'missing'} | - | - | - |")
        res.append(f"FAIL step {s}: a loss is missing or not finite")
        continue
    d = abs(o["loss"] - p) / abs(p)
    worst = max(worst, d)
    pn = pt["norms"][s - 1]
    print(f"| {s} | {o['loss']:.6f} | {p:.6f} | {d:.2e} | {o['grad_norm']:.4f} | {pn:.4f} |")
    res.append(("ok  " if d <= tol else "FAIL") + f" step {s}: loss {o['loss']:.6f} vs {p:.6f}, rel diff {d:.2e} (tolerance {tol:g})")
print(f"max rel diff over the steps: {worst:.2e}")
for r in res:
    print(r)
if ours.get(1) and ours.get(steps):
    a, b = ours[1]["loss"], ours[steps]["loss"]
    print(("ok  " if b < a - 0.05 else "FAIL") + f" our loss falls over {steps} steps ({a:.4f} -> {b:.4f})")
else:
    print("FAIL our loss falls: first or last step missing")
EOF
cat "$TMP/compare.txt"
PASS=$((PASS + $(grep -c '^ok ' "$TMP/compare.txt")))
FAIL=$((FAIL + $(grep -c '^FAIL' "$TMP/compare.txt")))
grep -q '^| 1 |' "$TMP/compare.txt" || bad "the comparison ran (see above)"

if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR" && cp "$TMP/ours/log.jsonl" "$OUTDIR/ours_log.jsonl" 2>/dev/null
    cp "$TMP/ours.txt" "$TMP/pytorch.txt" "$TMP/pytorch.json" "$TMP/compare.txt" "$OUTDIR/" 2>/dev/null
    echo "kept the logs in $OUTDIR"
fi
finish test_gpu_vs_pytorch
