# test/lib.sh — shared by the shell tests: counters, mpirun, temp dirs.
set -u
PASS=0
FAIL=0
ok()   { PASS=$((PASS+1)); echo "ok   $*"; }
bad()  { FAIL=$((FAIL+1)); echo "FAIL $*"; }
check() { local what="$1"; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
finish() { echo "$1: $PASS passed, $FAIL failed"; [ "$FAIL" -eq 0 ]; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
TMP=$(mktemp -d /tmp/gpt2test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# losses of a run's log.jsonl, one per line, exactly as printed
losses() { grep -o '"loss":[^,]*' "$1/log.jsonl" | cut -d: -f2; }

# The training runs of the shell tests. Each test sets COMMON (its flags) first.
# run_quiet DIR NP [flags...]: NP 0 runs without mpirun. The trainer's output goes to DIR.out (beside
# the output directory DIR, which then holds only what the trainer wrote: log.jsonl, checkpoints
# and, unless RUN_SAVE_MODEL=0, the final model DIR/model.bin). RUN_TIMEOUT (default 300 s) bounds
# the run; RUN_MPI_FLAGS are added to the trainer's flags under mpirun. Returns the exit status.
run_quiet() {
    local dir="$1" np="$2"; shift 2
    mkdir -p "$dir"
    local save=(); [ "${RUN_SAVE_MODEL:-1}" = 1 ] && save=(--save_model "$dir/model.bin")
    if [ "$np" = 0 ]; then
        timeout "${RUN_TIMEOUT:-300}" ./train_gpt2 $COMMON --output_dir "$dir" "${save[@]}" "$@" >"$dir.out" 2>&1
    else
        OMP_NUM_THREADS=1 timeout "${RUN_TIMEOUT:-300}" $MPIRUN -np "$np" -x OMP_NUM_THREADS ./train_gpt2 $COMMON \
            ${RUN_MPI_FLAGS:-} --output_dir "$dir" "${save[@]}" "$@" >"$dir.out" 2>&1
    fi
}
# run: the same, for a run that must succeed: a failure prints its last lines
run() {
    run_quiet "$@" && return 0
    local rc=$?
    echo "    run $1 failed ($rc):"; tail -5 "$1.out" | sed 's/^/      /'
    return $rc
}
# identical losses, bit for bit (and at least one)
same_losses() { cmp -s <(losses "$1") <(losses "$2") && [ "$(losses "$1" | wc -l)" -ge 1 ]; }
same_params() { build/compare_models "$1/model.bin" "$2/model.bin" --exact; }
# close_losses A B TOL: 10 steps each, max relative difference <= TOL
close_losses() {
    paste <(losses "$1") <(losses "$2") | awk -v tol="$3" '
      { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r; n++ }
      END { printf "    losses: %d steps, max rel diff %.2e\n", n, m; exit !(n == 10 && m <= tol) }'
}
# start_bg DIR NP [flags...]: the trainer under mpirun in the background; sets BG (its pid)
start_bg() {
    local dir="$1" np="$2"; shift 2
    mkdir -p "$dir"
    OMP_NUM_THREADS=1 $MPIRUN -np "$np" -x OMP_NUM_THREADS ./train_gpt2 $COMMON --output_dir "$dir" "$@" >"$dir.out" 2>&1 &
    BG=$!
}
# the pid of rank R among the children of mpirun BG
rank_pid() {
    local p
    for p in $(pgrep -P "$BG"); do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
    done
}
