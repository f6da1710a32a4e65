#!/usr/bin/env bash
# test/test_checkpoint.sh — checkpoints end to end on CPU:
#  - save at step 4, resume with the same N and configuration: losses and
#    final parameters bit-identical to the uninterrupted run, and the next
#    checkpoint (step 8) byte-identical, for one process, N=2 zero_stage 0
#    (with gradient accumulation) and N=2 zero_stage 1;
#  - save at N=4 zero_stage 1, resume at N=1 and 3 at zero_stage 0, N=2 and 3
#    at zero_stage 1 (N=3 with another micro-batch size): losses and parameters within 1e-6
#    relative of the single-process run with the same global batch; resumed
#    at N=4 it is bit-identical to the uninterrupted N=4 run;
#  - bad checkpoints and mismatched runs (flipped bytes, truncation, missing
#    files, damaged DONE, another model shape, seed, sequence length, data):
#    a clear error printed by every rank, a non-zero exit, and the output
#    directory unchanged, file for file;
#  - incomplete checkpoints are skipped, an empty directory starts afresh,
#    a fresh run refuses a directory that holds checkpoints, and
#    --checkpoints_keep keeps the newest K.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
build/make_shard "$TMP/train.bin" 30000 1
build/make_shard "$TMP/val.bin" 3000 2
build/make_shard "$TMP/other.bin" 20000 3
COMMON="--input_bin $TMP/train.bin --input_val_bin $TMP/val.bin --val_loss_every 3 --val_max_steps 2
  --model d2 --n_embd 32 --n_head 2 --max_seq_len 32 --batch_size 2 --sequence_length 16 --num_iterations 10
  --learning_rate 3e-3 --warmup_iters 2 --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 0.5
  --seed 7 --shuffle 1 --bucket_size 1000"
# runs (test/lib.sh's run / run_quiet): output in DIR.out; model files only where a run asks
RUN_SAVE_MODEL=0
nlosses() { losses "$1" | wc -l; }
# a copy of SRC holding only its checkpoint of step STEP (and its log)
seed_dir() {
    local src="$1" step="$2" dst="$3"
    rm -rf "$dst"; mkdir -p "$dst"
    cp -r "$src/$(printf 'ckpt_%08d' "$step")" "$src/log.jsonl" "$dst/"
}

# ---- same N: bit-identical ----
for cfg in "0|" "2|--zero_stage 0 --total_batch_size 128" "2|--zero_stage 1"; do
    np=${cfg%%|*}; flags=${cfg#*|}
    name="np$np${flags:+ $flags}"
    tag=$(printf '%s' "$np$flags" | tr -c 'a-z0-9' '_')
    U="$TMP/u_$tag"; R="$TMP/r_$tag"
    run "$U" "$np" $flags --checkpoint_every 4 --save_model "$U.model.bin" || { bad "$name: uninterrupted run"; continue; }
    seed_dir "$U" 4 "$R"
    run "$R" "$np" $flags --checkpoint_every 4 --resume --save_model "$R.model.bin" || { bad "$name: resumed run"; continue; }
    check "$name: resumed from step 4 ($(grep -o 'resume: from .*' "$R.out" | head -1 | sed 's|/tmp/[^ ]*/||'))" grep -q "resume: from $R/ckpt_00000004: step 4" "$R.out"
    check "$name: 10 losses, bit-identical to the uninterrupted run" eval '[ "$(nlosses "$R")" = 10 ] && same_losses "$U" "$R"'
    check "$name: validation losses identical" cmp -s <(grep -o '"val_loss":[^}]*' "$U/log.jsonl") <(grep -o '"val_loss":[^}]*' "$R/log.jsonl")
    check "$name: final parameters bit-identical" build/compare_models "$U.model.bin" "$R.model.bin" --exact
    check "$name: the step-8 checkpoint is byte-identical (params, master, m, v, position)" \
        eval 'cmp -s "$U/ckpt_00000008/state.bin" "$R/ckpt_00000008/state.bin" && cmp -s "$U/ckpt_00000008/model.bin" "$R/ckpt_00000008/model.bin"'
done
if command -v python3 >/dev/null; then
    d="$TMP/u_0/ckpt_00000004"
    py=$(python3 -c "import zlib,sys; print(' '.join('%08x' % zlib.crc32(open(sys.argv[1]+'/'+f,'rb').read()) for f in ('model.bin','state.bin')))" "$d")
    mine=$(awk '$3 == "crc32" { printf "%s ", $4 }' "$d/DONE" | sed 's/ $//')
    check "DONE's checksums equal zlib.crc32 of the files ($mine)" [ "$py" = "$mine" ]
fi

# ---- save at N=4 (zero_stage 1), resume at other N and stages ----
G="--total_batch_size 384"   # 12 rows of 16 tokens per step: divides by B*T*N for N = 1..4
run "$TMP/ref" 0 $G --save_model "$TMP/ref.model.bin" || bad "single-process reference run"
run "$TMP/n4" 4 $G --zero_stage 1 --checkpoint_every 5 --save_model "$TMP/n4.model.bin" || bad "N=4 run"
check "N=4 zero_stage 1 within 1e-6 of the single process (sanity)" close_losses "$TMP/n4" "$TMP/ref" 1e-6
for cell in "1 0" "2 1" "3 0" "3 1 --batch_size 4"; do
    set -- $cell; n=$1; z=$2; shift 2
    d="$TMP/from4_n${n}_z$z${1:+_b4}"
    seed_dir "$TMP/n4" 5 "$d"
    if ! run "$d" "$n" $G --zero_stage $z --resume --save_model "$d.model.bin" "$@"; then bad "resume at N=$n zero $z${*:+ $*}"; continue; fi
    check "saved at N=4 zero 1, resumed at N=$n zero $z${*:+ $*}: losses within 1e-6 of the single process" close_losses "$d" "$TMP/ref" 1e-6
    check "saved at N=4 zero 1, resumed at N=$n zero $z${*:+ $*}: params within 1e-6" build/compare_models "$d.model.bin" "$TMP/ref.model.bin" --rtol 1e-6
done
grep '^resume: ' "$TMP/from4_n3_z1_b4.out" | sed 's/^/    /'
d="$TMP/from4_n4"
seed_dir "$TMP/n4" 5 "$d"
run "$d" 4 $G --zero_stage 1 --resume --save_model "$d.model.bin" || bad "resume at N=4"
check "saved and resumed at N=4 zero 1: losses bit-identical to the uninterrupted N=4 run" same_losses "$d" "$TMP/n4"
check "saved and resumed at N=4 zero 1: params bit-identical" build/compare_models "$d.model.bin" "$TMP/n4.model.bin" --exact

# ---- bad checkpoints: a clear error on every rank, nothing overwritten ----
snapshot() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
# expect_bad NAME PATTERN DIR NP [flags...]: the run must fail with PATTERN printed by every rank
expect_bad() {
    local name="$1" pat="$2" dir="$3" np="$4"; shift 4
    local before after rc nerr want
    before=$(snapshot "$dir")
    run "$dir" "$np" "$@"; rc=$?
    after=$(snapshot "$dir")
    nerr=$(grep -c "^error: .*$pat" "$dir.out")
    want=$(( np == 0 ? 1 : np ))
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$nerr" -eq "$want" ] && [ "$before" = "$after" ] &&
       ! grep -qiE 'segmentation|assert|core dumped|backtrace' "$dir.out"; then
        ok "$name: exit $rc, $nerr of $want ranks: $(grep -m1 '^error:' "$dir.out" | sed "s|$TMP/||g")"
    else
        bad "$name: exit $rc, $nerr of $want ranks printed '$pat', directory $([ "$before" = "$after" ] && echo unchanged || echo CHANGED)"
        sed 's/^/      /' "$dir.out" | tail -6
    fi
}
B="$TMP/u_2__zero_stage_1"   # N=2 zero 1 run: checkpoints 4, 8, 10
fresh() { seed_dir "$B" 8 "$1"; }
flip() { printf '\x5a' | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
fresh "$TMP/bad1"; flip "$TMP/bad1/ckpt_00000008/state.bin" 50000
expect_bad "a flipped byte in state.bin" "state.bin: checksum mismatch" "$TMP/bad1" 2 --zero_stage 1 --resume
fresh "$TMP/bad2"; flip "$TMP/bad2/ckpt_00000008/model.bin" 4000
expect_bad "a flipped byte in model.bin" "model.bin: checksum mismatch" "$TMP/bad2" 2 --zero_stage 1 --resume
fresh "$TMP/bad3"; truncate -s 1000000 "$TMP/bad3/ckpt_00000008/state.bin"
expect_bad "a truncated state.bin" "state.bin: .*truncated" "$TMP/bad3" 2 --zero_stage 1 --resume
fresh "$TMP/bad4"; rm "$TMP/bad4/ckpt_00000008/model.bin"
expect_bad "a missing model.bin" "model.bin: missing" "$TMP/bad4" 2 --zero_stage 1 --resume
fresh "$TMP/bad5"; rm "$TMP/bad5/ckpt_00000008/state.bin"
expect_bad "a missing state.bin (np 3)" "state.bin: missing" "$TMP/bad5" 3 --zero_stage 1 --resume
fresh "$TMP/bad6"; echo "gpt2-checkpoint v1" > "$TMP/bad6/ckpt_00000008/DONE"
expect_bad "a damaged DONE marker" "DONE: malformed" "$TMP/bad6" 2 --zero_stage 1 --resume
fresh "$TMP/bad7"
expect_bad "another model shape (--n_embd 64)" "model shape .* differs" "$TMP/bad7" 2 --zero_stage 1 --resume --n_embd 64
expect_bad "another --seed" "seed 8 differs from the checkpoint's 7" "$TMP/bad7" 2 --zero_stage 1 --resume --seed 8
expect_bad "another --sequence_length" "sequence_length 8 differs" "$TMP/bad7" 2 --zero_stage 1 --resume --sequence_length 8
expect_bad "other training data" "training data holds" "$TMP/bad7" 2 --zero_stage 1 --resume --input_bin "$TMP/other.bin"
expect_bad "--num_iterations below the checkpoint's step" "below the checkpoint's step 8" "$TMP/bad7" 2 --zero_stage 1 --resume --num_iterations 6
expect_bad "a fresh run into a directory with checkpoints" "already holds checkpoints" "$TMP/bad7" 2 --zero_stage 1 --checkpoint_every 2
expect_bad "single process, flipped byte" "checksum mismatch" "$TMP/bad1" 0 --resume

# ---- incomplete checkpoints, empty directory, keeping K ----
I="$TMP/incomplete"
seed_dir "$B" 4 "$I"
cp -r "$B/ckpt_00000008" "$I/"; rm "$I/ckpt_00000008/DONE"              # crashed between rename and DONE
cp -r "$B/ckpt_00000010" "$I/ckpt_00000010.tmp"                         # crashed before the rename
run_quiet "$I" 2 --zero_stage 1 --resume --num_iterations 4
check "incomplete newer checkpoints are skipped (no DONE, .tmp): resumes from step 4" \
    eval 'grep -q "skipping the incomplete checkpoint .*ckpt_00000008 " "$I.out" && grep -q "skipping the incomplete checkpoint .*ckpt_00000010.tmp" "$I.out" && grep -q "resume: from $I/ckpt_00000004: step 4" "$I.out"'
E="$TMP/empty"
run "$E" 0 --resume --num_iterations 2 --checkpoint_every 1 || bad "resume into an empty directory"
check "--resume with no checkpoint starts from step 0" eval 'grep -q "no complete checkpoint in .*: starting from step 0" "$E.out" && [ "$(nlosses "$E")" = 2 ]'
K="$TMP/keep"
run "$K" 0 --checkpoint_every 2 --checkpoints_keep 2 || bad "keep run"
check "--checkpoints_keep 2 keeps the newest two ($(ls "$K" | grep ckpt_ | tr '\n' ' '))" [ "$(ls "$K" | grep ckpt_ | tr '\n' ' ')" = "ckpt_00000008 ckpt_00000010 " ]

finish test_checkpoint
