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
