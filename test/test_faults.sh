#!/usr/bin/env bash
# test/test_faults.sh — the trainer under faults, on CPU:
#  - NaN/Inf (injected with --inject_nan_at_step): the step is skipped and
#    logged, the update is really skipped (params equal a run that stopped
#    before it), the next step is finite again (the poisoned grads were
#    dropped); --max_bad_steps in a row stop the run on every rank with a
#    message naming the last complete checkpoint, and --resume from it
#    gives exactly the losses of a run that survived the same faults;
#  - kill -9 of one rank of an np 3 run: the run ends non-zero within
#    --comm_timeout; a stalled rank (SIGSTOP): the others end with the
#    timeout message; after either, --resume continues from the last
#    complete checkpoint, bit-identical to the uninterrupted run;
#  - kill -9 of every rank while a checkpoint is being saved: no directory
#    that --resume would take is incomplete, and --resume continues exactly;
#  - an unwritable --output_dir (under a file; a read-only mount) and a disk
#    too small for one checkpoint: a clear error on every rank before
#    training; a disk that fills up at the second save: a clear error, the
#    first checkpoint intact and resumable.
# The mounts (tmpfs) need root; without them those cases say "skip".
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
MOUNTS=()
cleanup() { for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
build/make_shard "$TMP/train.bin" 30000 1
COMMON="--input_bin $TMP/train.bin --model d2 --n_embd 32 --n_head 2 --max_seq_len 32 --batch_size 2
  --sequence_length 16 --learning_rate 3e-3 --lr_schedule constant --weight_decay 0.1 --grad_clip 0.5
  --seed 7 --shuffle 1"
# runs (test/lib.sh's run / run_quiet): output in DIR.out; model files only where a run asks
RUN_SAVE_MODEL=0 RUN_TIMEOUT=120
nerrors() { grep -c "^error: .*$2" "$1"; }
# wait_for PATH SECONDS: until PATH exists (0) or time runs out (1)
wait_for() {
    local t=0
    while [ ! -e "$1" ]; do sleep 0.02; t=$((t+1)); [ $t -gt $(( $2 * 50 )) ] && return 1; done
    return 0
}
now_ms() { date +%s%3N; }
# the newest checkpoint of DIR that holds DONE (what --resume must take)
newest_complete() { local d; for d in "$1"/ckpt_????????; do [ -f "$d/DONE" ] && basename "$d"; done | tail -1; }

# ---- NaN / Inf ----
run "$TMP/nan1" 2 --zero_stage 1 --num_iterations 6 --inject_nan_at_step 3 || bad "np 2 run with a NaN at step 3"
grep -E 'step +[2-4]/' "$TMP/nan1.out" | sed 's/ | [0-9.]* ms.*//; s/^/    /'
check "a NaN gradient at step 3: logged as skipped (1 in a row)" grep -q 'step    3/6 | non-finite grad norm (loss [0-9.]*, norm nan): update skipped (1 in a row' "$TMP/nan1.out"
check "the run goes on: 5 finite losses, step 4 finite" eval '[ "$(losses "$TMP/nan1" | wc -l)" = 5 ] && grep -q "step    4/6 | loss [0-9]" "$TMP/nan1.out"'
check "the skipped step is in log.jsonl" grep -q '{"step":3,"skipped":1,"bad_in_a_row":1}' "$TMP/nan1/log.jsonl"
run "$TMP/nan2" 2 --zero_stage 1 --num_iterations 3 --inject_nan_at_step 3 --save_model "$TMP/nan2.bin" || bad "3 steps, the last poisoned"
run "$TMP/nan3" 2 --zero_stage 1 --num_iterations 2 --save_model "$TMP/nan3.bin" || bad "2 clean steps"
check "no update on the skipped step: params after it equal those of a run that stopped before it" build/compare_models "$TMP/nan2.bin" "$TMP/nan3.bin" --exact
run "$TMP/nan4" 0 --num_iterations 5 --inject_nan_at_step 2 --inject_nan_steps 2 || bad "single process, 2 bad steps"
check "an infinite loss is skipped too (2 in a row), then training goes on" \
    eval 'grep -q "step    3/5 | non-finite loss (loss inf, norm [0-9.]*): update skipped (2 in a row" "$TMP/nan4.out" && grep -q "step    4/5 | loss [0-9]" "$TMP/nan4.out"'
# max_bad_steps: 3 in a row stop the run; the checkpoint of step 6 (inside the streak) is usable
run_quiet "$TMP/stop" 2 --zero_stage 1 --num_iterations 10 --checkpoint_every 2 --inject_nan_at_step 5 --inject_nan_steps 10 --max_bad_steps 3
rc=$?
msg="step 7: 3 steps in a row had a non-finite loss or grad norm (--max_bad_steps 3): stopping; the last complete checkpoint is $TMP/stop/ckpt_00000006"
check "--max_bad_steps 3: exit $rc, stopped at step 7 on both ranks naming ckpt_00000006" eval '[ $rc -ne 0 ] && [ "$(grep -cF "error: $msg" "$TMP/stop.out")" = 2 ] && ! grep -q "step    8/10" "$TMP/stop.out"'
grep -m1 '^error:' "$TMP/stop.out" | sed "s|$TMP/||; s/^/    /"
run "$TMP/survive" 2 --zero_stage 1 --num_iterations 10 --checkpoint_every 2 --inject_nan_at_step 5 --inject_nan_steps 2 --max_bad_steps 3 || bad "the run that survives 2 bad steps"
run "$TMP/stop" 2 --zero_stage 1 --num_iterations 10 --checkpoint_every 2 --max_bad_steps 3 --resume || bad "resume after the stop"
check "--resume after the stop continues from ckpt_00000006: the same losses as a run that survived the same faults" \
    eval 'grep -q "resume: from $TMP/stop/ckpt_00000006: step 6" "$TMP/stop.out" && same_losses "$TMP/stop" "$TMP/survive" && [ "$(losses "$TMP/stop" | wc -l)" = 8 ]'

# ---- a rank that dies or stalls (np 3) ----
F="--zero_stage 1 --num_iterations 24 --comm_timeout 5"
C="--checkpoint_every 4 --checkpoints_keep 2"
run "$TMP/ref3" 3 $F || bad "np 3 reference run"
for mode in KILL STOP; do
    D="$TMP/fault_$mode"
    start_bg "$D" 3 $F $C --num_iterations 500   # constant lr: the length does not change the steps; it cannot end before the fault
    if ! wait_for "$D/ckpt_00000004/DONE" 60; then bad "$mode: no checkpoint appeared"; kill -9 $(pgrep -P "$BG") 2>/dev/null; wait "$BG"; continue; fi
    victim=$(rank_pid 1)
    t0=$(now_ms)
    kill -$mode "$victim"
    wait "$BG"; rc=$?
    ms=$(( $(now_ms) - t0 ))
    for p in $(pgrep -P "$BG" 2>/dev/null) $victim; do kill -0 "$p" 2>/dev/null && kill -9 "$p"; done   # leave nothing behind
    last=$(newest_complete "$D")
    if [ $mode = KILL ]; then
        check "kill -9 of rank 1 mid-training: the run ends non-zero (exit $rc) in $ms ms, within --comm_timeout 5 s" eval '[ $rc -ne 0 ] && [ $ms -lt 15000 ]'
    else
        check "SIGSTOP of rank 1: the other ranks end (exit $rc) after $ms ms with the timeout message" \
            eval '[ $rc -ne 0 ] && [ $ms -ge 4500 ] && [ $ms -lt 20000 ] && grep -q "did not complete within 5 s: a peer rank died or stalled" "$D.out"'
    fi
    grep -m1 -E '^error:|mpirun noticed' "$D.out" | sed 's/^/    /'
    run "$D" 3 $F $C --resume || bad "$mode: resume"
    check "$mode: --resume continues from the last complete checkpoint ($last), bit-identical to the uninterrupted run" \
        eval 'grep -q "resume: from $D/$last:" "$D.out" && same_losses "$D" "$TMP/ref3" && [ "$(losses "$D" | wc -l)" = 24 ]'
done

# ---- kill -9 of every rank while a checkpoint is being saved ----
S="--zero_stage 1 --num_iterations 16"
C="--checkpoint_every 1 --checkpoints_keep 2"
run "$TMP/ref2" 2 $S || bad "np 2 reference run"
caught=""
for attempt in 1 2 3 4 5; do
    D="$TMP/save_kill$attempt"
    start_bg "$D" 2 $S $C
    # spin (no sleep) until a save from step 3 on is in flight, then kill every rank at once
    t0=$(now_ms); pids=""
    while [ $(( $(now_ms) - t0 )) -lt 60000 ]; do
        for d in "$D"/ckpt_*.tmp; do
            case "$d" in *ckpt_0000000[012].tmp|*'*'*) continue;; esac
            pids=$(pgrep -P "$BG"); kill -9 $pids; break 2
        done
    done
    [ -n "$pids" ] || { bad "no save started within 60 s"; kill -9 $(pgrep -P "$BG") 2>/dev/null; wait "$BG"; break; }
    wait "$BG"
    inside=$(ls "$D"/ckpt_*.tmp 2>/dev/null | tr '\n' ' ')
    nodone=$(for d in "$D"/ckpt_????????; do [ -f "$d/DONE" ] || echo -n "$(basename "$d") "; done)
    if [ -n "$inside$nodone" ]; then caught="$attempt"; break; fi
done
if [ -n "$caught" ]; then
    ok "kill -9 during a save (attempt $caught) left an unfinished checkpoint: $(ls -d "$D"/ckpt_*.tmp 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ')$nodone"
    last=$(newest_complete "$D")
    run "$D" 2 $S $C --resume || bad "resume after the kill during a save"
    check "--resume skips it and takes $last, the newest complete one" grep -q "resume: from $D/$last:" "$D.out"
    check "the resumed run is bit-identical to the uninterrupted run" eval 'same_losses "$D" "$TMP/ref2" && [ "$(losses "$D" | wc -l)" = 16 ]'
else
    bad "5 attempts never killed the run in the middle of a save"
fi

# ---- unwritable or full --output_dir ----
expect_err() {   # NAME PATTERN NP DIR [flags...]: every rank prints the error, no step ran
    local name="$1" pat="$2" np="$3" dir="$4"; shift 4
    local out="$TMP/err$((++NERR)).out" rc n want=$(( np == 0 ? 1 : np ))
    OMP_NUM_THREADS=1 timeout 120 $MPIRUN -np "$want" -x OMP_NUM_THREADS ./train_gpt2 $COMMON --output_dir "$dir" "$@" >"$out" 2>&1
    rc=$?
    n=$(nerrors "$out" "$pat")
    if [ $rc -ne 0 ] && [ "$n" = "$want" ] && ! grep -q '^step ' "$out"; then
        ok "$name: exit $rc before training, $n of $want ranks: $(grep -m1 '^error:' "$out" | sed "s|$TMP/||g")"
    else
        bad "$name: exit $rc, $n of $want ranks printed '$pat'"; tail -4 "$out" | sed 's/^/      /'
    fi
}
NERR=0
touch "$TMP/afile"
expect_err "--output_dir under a regular file" "cannot create" 2 "$TMP/afile/out" --num_iterations 2 --checkpoint_every 1
mnt() { mkdir -p "$2" && mount -t tmpfs -o "$1" tmpfs "$2" 2>/dev/null && MOUNTS+=("$2"); }
if mnt ro,size=1m "$TMP/ro"; then
    expect_err "--output_dir on a read-only file system" "is not writable: Read-only file system" 2 "$TMP/ro" --num_iterations 2
else
    echo "skip read-only --output_dir: cannot mount a tmpfs here (not root?)"
fi
if mnt size=10m "$TMP/small"; then
    expect_err "--output_dir with room for less than one checkpoint (10 MB tmpfs)" "MB free on its file system, but one checkpoint needs" 2 "$TMP/small" --num_iterations 2 --checkpoint_every 1
else
    echo "skip small disk: cannot mount a tmpfs here"
fi
if mnt size=40m "$TMP/full"; then
    # one checkpoint (25 MB) fits, the second does not
    run "$TMP/full" 2 --zero_stage 1 --num_iterations 6 --checkpoint_every 2 --checkpoints_keep 1; rc=$?
    check "disk full at the second save: exit $rc, the error names the file and the cause" \
        eval '[ $rc -ne 0 ] && grep -q "^error: .*ckpt_00000004.tmp/.*\(No space left on device\|disk full\)" "$TMP/full.out"'
    grep -m1 '^error:' "$TMP/full.out" | sed "s|$TMP/||g; s/^/    /"
    check "the first checkpoint is kept, complete" eval '[ -f "$TMP/full/ckpt_00000002/DONE" ] && [ ! -e "$TMP/full/ckpt_00000004" ]'
    mkdir -p "$TMP/after_full" && cp -r "$TMP/full/ckpt_00000002" "$TMP/full/log.jsonl" "$TMP/after_full/"
    run "$TMP/after_full" 2 --zero_stage 1 --num_iterations 6 --checkpoint_every 2 --resume || bad "resume from the kept checkpoint"
    run "$TMP/ref_full" 2 --zero_stage 1 --num_iterations 6 || bad "reference for the disk-full case"
    check "it resumes (elsewhere) and matches the uninterrupted run bit for bit" eval 'grep -q "resume: from .*ckpt_00000002: step 2" "$TMP/after_full.out" && same_losses "$TMP/after_full" "$TMP/ref_full"'
else
    echo "skip disk full: cannot mount a tmpfs here"
fi

finish test_faults
