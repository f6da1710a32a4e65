#!/usr/bin/env bash
# test/test_train.sh — the trainer end to end on CPU:
#  - two identical runs: bit-identical losses and parameters;
#  - the distributed equivalence matrix: N in 1..4 x zero_stage 0/1 x
#    gradient accumulation 1/2 x {one bucket, many tiny buckets}, clipping on,
#    10 steps, against the single-process run with the same global batch:
#    N=1 bit-identical, every other cell losses and final parameters within
#    1e-6 relative; a cell run twice is bit-identical;
#  - optimizer state bytes per rank = 12 x owned elements, summing to the model;
#  - save -> load of llm.c model files (fp32 exact, bf16 within rounding).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
build/make_shard "$TMP/train.bin" 30000 1
build/make_shard "$TMP/val.bin" 3000 2
COMMON="--input_bin $TMP/train.bin --input_val_bin $TMP/val.bin --model d2 --n_embd 32 --n_head 2
  --max_seq_len 32 --batch_size 2 --sequence_length 16 --num_iterations 10 --learning_rate 3e-3
  --warmup_iters 2 --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 0.5 --seed 7 --shuffle 1"
# run, same_losses, same_params, close_losses: test/lib.sh

# ---- determinism ----
run "$TMP/det1" 0 && run "$TMP/det2" 0
check "two identical single-process runs: identical losses" same_losses "$TMP/det1" "$TMP/det2"
check "two identical single-process runs: identical parameters" build/compare_models "$TMP/det1/model.bin" "$TMP/det2/model.bin" --exact
first=$(losses "$TMP/det1" | head -1); last=$(losses "$TMP/det1" | tail -1)
check "loss falls over 10 steps ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }'

run "$TMP/rec1" 0 --recompute 1 && run "$TMP/rec2" 0 --recompute 2
check "--recompute 1 (GELU recomputed): bit-identical losses" same_losses "$TMP/det1" "$TMP/rec1"
check "--recompute 2 (GELU and layernorms recomputed): bit-identical losses" same_losses "$TMP/det1" "$TMP/rec2"
check "--recompute 2: bit-identical parameters" build/compare_models "$TMP/det1/model.bin" "$TMP/rec2/model.bin" --exact
check "--recompute 2 uses less activation memory" [ "$(grep -o 'activations [0-9.]* MB' "$TMP/rec2.out")" != "$(grep -o 'activations [0-9.]* MB' "$TMP/det1.out")" ]

# ---- references: single process, same global batch (B*T*N*accum) ----
for prod in 1 2 3 4 6 8; do
    run "$TMP/ref$prod" 0 --total_batch_size $((2*16*prod)) || bad "reference run x$prod"
done

# ---- the matrix ----
for n in 1 2 3 4; do
  for zs in 0 1; do
    for acc in 1 2; do
      for bk in one tiny; do
        if [ $bk = one ]; then bflags="--bucket_size 100M"; else bflags="--bucket_size 1000"; fi
        cell="n$n-z$zs-a$acc-$bk"
        dir="$TMP/$cell"
        ref="$TMP/ref$((n*acc))"
        if ! run "$dir" $n --zero_stage $zs --total_batch_size $((2*16*n*acc)) $bflags; then bad "$cell runs"; continue; fi
        if [ $n = 1 ]; then
            check "$cell: bit-identical to single process (losses)" same_losses "$dir" "$ref"
            check "$cell: bit-identical to single process (params)" build/compare_models "$dir/model.bin" "$ref/model.bin" --exact
        else
            check "$cell: losses within 1e-6 of single process" close_losses "$dir" "$ref" 1e-6
            check "$cell: params within 1e-6 of single process" build/compare_models "$dir/model.bin" "$ref/model.bin" --rtol 1e-6
        fi
        if [ $acc = 2 ] && [ $bk = tiny ]; then
            run "$dir.again" $n --zero_stage $zs --total_batch_size $((2*16*n*acc)) $bflags
            check "$cell run twice: bit-identical losses" same_losses "$dir" "$dir.again"
            check "$cell run twice: bit-identical params" build/compare_models "$dir/model.bin" "$dir.again/model.bin" --exact
        fi
      done
    done
  done
done

# ---- optimizer memory per rank ----
for n in 1 2 4; do
    out="$TMP/n$n-z1-a1-tiny.out"
    total=$(grep -o 'optimizer state [0-9]* bytes for [0-9]* owned of [0-9]*' "$out" | head -1 | awk '{print $9}')
    sum=$(grep -o 'optimizer state [0-9]* bytes for [0-9]* owned' "$out" | awk '{s += $6} END {print s}')
    okbytes=$(grep -o 'optimizer state [0-9]* bytes for [0-9]* owned' "$out" | awk '{ if ($3 != 12 * $6) bad = 1 } END { print bad ? 0 : 1 }')
    grep -o 'rank [0-9]* memory:.*' "$out" | sed 's/^/    /'
    check "zero_stage 1, N=$n: optimizer bytes = 12 x owned elements on every rank" [ "$okbytes" = 1 ]
    check "zero_stage 1, N=$n: owned elements sum to the model ($sum of $total)" [ "$sum" = "$total" ]
    out0="$TMP/n$n-z0-a1-tiny.out"
    full=$(grep -o 'optimizer state [0-9]* bytes for [0-9]* owned' "$out0" | awk '{ if ($6 != '"${total:-0}"') bad = 1 } END { print bad ? 0 : 1 }')
    check "zero_stage 0, N=$n: full optimizer state on every rank" [ "$full" = 1 ]
done

# ---- model files ----
run "$TMP/reload" 0 --model "$TMP/det1/model.bin" --num_iterations 0
check "load -> save of an fp32 model file is bit-exact" build/compare_models "$TMP/det1/model.bin" "$TMP/reload/model.bin" --exact
check "the reloaded file is byte-identical" cmp -s "$TMP/det1/model.bin" "$TMP/reload/model.bin"
run "$TMP/bf16" 0 --model "$TMP/det1/model.bin" --num_iterations 0 --save_dtype bf16
check "bf16 model file (version 5) is half the size" [ $(stat -c %s "$TMP/bf16/model.bin") -eq $(( ( $(stat -c %s "$TMP/det1/model.bin") - 1024 ) / 2 + 1024 )) ]
check "bf16 model file loads back within bf16 rounding" build/compare_models "$TMP/bf16/model.bin" "$TMP/det1/model.bin" --rtol 4e-3
run "$TMP/resume_from_file" 0 --model "$TMP/det1/model.bin" --num_iterations 2
check "training continues from a loaded model (loss below the fresh start)" awk -v a="$(losses "$TMP/resume_from_file" | head -1)" -v b="$first" 'BEGIN { exit !(a < b) }'

finish test_train
