#!/usr/bin/env bash
# test/test_comm.sh — runs test_comm (the communicator's tests: collectives,
# sub-communicators, point-to-point transfers) under mpirun for several world
# sizes, then the error and fault cases: every rank must end, non-zero and
# promptly, with a clear message, and mpirun must never hang.
#
#   bash test/test_comm.sh [path/to/test_comm] [--gpu]   (default: build/test_comm)
#
# With --gpu (a binary built with CUDA, on a machine with a GPU) it also runs
# the device cases: NCCL (whose comm_wait must not block the host) and its
# watchdog (an operation the GPU has reached that never completes ends the
# job after the timeout, while the host blocks in cudaStreamSynchronize), the
# MPI backend staging device buffers through pinned memory (several ranks on
# one GPU), and the GPU-sharing error; with 2+ GPUs also NCCL's
# sub-communicators and point-to-point channels, and their faults.
#
# Prints one line per case and ends with "test_comm: N passed, N failed".
set -u
BIN=${1:-build/test_comm}
GPU=0
[ "${2:-}" = "--gpu" ] && GPU=1
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
LOG=$(mktemp -d /tmp/test_comm.XXXXXX)
trap 'rm -rf "$LOG"' EXIT
pass=0
fail=0

if [ ! -x "$BIN" ]; then
    echo "test_comm.sh: $BIN not found or not executable (build it first)"
    echo "test_comm: 0 passed, 1 failed"
    exit 1
fi

now_ms() { date +%s%3N; }

ok() { echo "ok    $1"; pass=$((pass + 1)); }
bad() {
    echo "FAIL  $1"
    echo "----- last lines of its output:"
    tail -n 15 "$2" | sed 's/^/    /'
    fail=$((fail + 1))
}

# run NAME LIMIT_S CMD...: runs CMD under `timeout LIMIT_S`, output in $LOG/NAME;
# sets RC and MS (elapsed milliseconds).
run() {
    local name=$1 limit=$2
    shift 2
    local t0
    t0=$(now_ms)
    timeout "$limit" "$@" >"$LOG/$name" 2>&1
    RC=$?
    MS=$(($(now_ms) - t0))
}

# expect_pass NAME CMD...: exit 0 and a "0 failed" summary line.
expect_pass() {
    local name=$1
    shift
    run "$name" 120 "$@"
    if [ "$RC" -eq 0 ] && grep -q "passed, 0 failed" "$LOG/$name"; then
        ok "$name ($(grep 'passed, 0 failed' "$LOG/$name" | tail -n 1 | sed 's/.*: //'), ${MS} ms)"
    else
        bad "$name (exit $RC)" "$LOG/$name"
    fi
}

# expect_fail NAME MAX_MS PATTERN CMD...: ends non-zero (not by our 60 s
# timeout) within MAX_MS, and the output contains PATTERN.
expect_fail() {
    local name=$1 maxms=$2 pattern=$3
    shift 3
    run "$name" 60 "$@"
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 -a "$MS" -ge 59000 ]; then
        bad "$name: still running after 60 s (hang)" "$LOG/$name"
    elif [ "$RC" -eq 0 ]; then
        bad "$name: exit status 0, want non-zero" "$LOG/$name"
    elif [ "$MS" -gt "$maxms" ]; then
        bad "$name: took ${MS} ms, want <= ${maxms} ms" "$LOG/$name"
    elif ! grep -q -- "$pattern" "$LOG/$name"; then
        bad "$name: no '$pattern' in the output" "$LOG/$name"
    else
        ok "$name (exit $RC after ${MS} ms: $(grep -m 1 -- "$pattern" "$LOG/$name" | cut -c1-110))"
    fi
}

# ---- correctness at several world sizes
for np in 1 2 3 4; do
    expect_pass "np=$np --comm auto" $MPIRUN -np $np "$BIN"
done
expect_pass "np=1 --comm mpi (MPI backend at world 1)" $MPIRUN -np 1 "$BIN" --comm mpi
expect_pass "np=3 --comm mpi" $MPIRUN -np 3 "$BIN" --comm mpi
expect_pass "singleton (no mpirun)" "$BIN"

# ---- user errors: fatal on every rank, clear message, no hang
expect_fail "np=2 reduce-scatter count not divisible" 15000 "does not divide by the world size 2" \
    $MPIRUN -np 2 "$BIN" --case bad_count
expect_fail "np=2 --comm xyz" 15000 "--comm: unknown value 'xyz' (expected auto, nccl or mpi)" \
    $MPIRUN -np 2 "$BIN" --comm xyz
expect_fail "np=2 --comm nccl on the CPU" 15000 "--comm nccl needs --device cuda" \
    $MPIRUN -np 2 "$BIN" --comm nccl
expect_fail "np=1 send at world 1 (one pipeline stage)" 15000 "comm_send: this communicator has one rank, so no peer" \
    $MPIRUN -np 1 "$BIN" --case p2p_world1
expect_fail "np=2 send before comm_p2p_setup" 15000 "call comm_p2p_setup on every rank" \
    $MPIRUN -np 2 "$BIN" --case p2p_nosetup
expect_fail "np=4 send to a rank that is not a neighbour" 15000 "comm_send: peer 2 is not a neighbour of rank 0" \
    $MPIRUN -np 4 "$BIN" --case p2p_notneighbour
expect_fail "np=2 receives posted in another order than the sends" 15000 \
    "tag 2: the message that arrived has tag 1 and 10 elements: sends and receives between two ranks must be posted in the same order" \
    $MPIRUN -np 2 "$BIN" --case p2p_order
expect_fail "np=2 receive shorter than its send" 15000 "the peer sent more elements than this receive expects" \
    $MPIRUN -np 2 "$BIN" --case p2p_count

# ---- faults
# (a) a rank stalls before a collective: the others time out after 3 s and abort all
expect_fail "np=3 rank 2 stalls, --timeout 3" 15000 "did not complete within 3 s: a peer rank died or stalled" \
    $MPIRUN -np 3 "$BIN" --fault sleep --fault_rank 2 --timeout 3
if [ "$RC" -ne 0 ] && [ "$MS" -lt 3000 ]; then
    bad "np=3 rank 2 stalls: ended after ${MS} ms, before the 3 s timeout could fire" "$LOG/np=3 rank 2 stalls, --timeout 3"
fi
# (b) a rank calls fatal() mid-run: every rank ends within a few seconds (the
# timeout is 60 s, so it is MPI_Abort from the fatal hook that ends them)
expect_fail "np=3 rank 1 calls fatal()" 10000 "injected fatal error on rank 1" \
    $MPIRUN -np 3 "$BIN" --fault fatal --fault_rank 1 --timeout 60
# (c) a rank dies by SIGKILL: mpirun ends the job, at the latest through our timeout
expect_fail "np=3 rank 0 killed by SIGKILL, --timeout 10" 20000 "" \
    $MPIRUN -np 3 "$BIN" --fault kill --fault_rank 0 --timeout 10
# (d) a pipeline peer never sends: its right neighbour's receive times out after
# 3 s, naming the transfer and the peer; the ranks that got their message sleep
# outside MPI, so the abort is what ends them
expect_fail "np=3 rank 1 never sends, --timeout 3" 15000 \
    "receive of 1000 elements from rank 1 of 3 (global rank 1), tag 0 did not complete within 3 s" \
    $MPIRUN -np 3 "$BIN" --fault nosend --fault_rank 1 --timeout 3
if [ "$RC" -ne 0 ] && [ "$MS" -lt 3000 ]; then
    bad "np=3 rank 1 never sends: ended after ${MS} ms, before the 3 s timeout could fire" "$LOG/np=3 rank 1 never sends, --timeout 3"
fi
# (e) a rank stalls in a sub-communicator (groups {0, 2} and {1}): the stall in
# one group ends the whole job, rank 1 of the other group included
expect_fail "np=3 rank 2 stalls in its group, --timeout 3" 15000 \
    "all-reduce of 1000 elements did not complete within 3 s: a peer rank died or stalled" \
    $MPIRUN -np 3 "$BIN" --fault group_sleep --fault_rank 2 --timeout 3

# ---- device cases
if [ "$GPU" -eq 1 ]; then
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    expect_pass "cuda np=1 --comm nccl" $MPIRUN -np 1 "$BIN" --device cuda --comm nccl
    # the watchdog: the all-reduce's stream is held 16 s (8 x the timeout) after
    # its 'started' event; comm_wait returns, the host blocks in
    # cudaStreamSynchronize, and the watchdog must end the run after the 2 s
    # timeout (plus at most 2 s for ncclCommAbort, and mpirun's own wind-down),
    # long before the hold ends
    name="cuda np=1 nccl, stream held after the GPU reached the all-reduce, --timeout 2"
    expect_fail "$name" 10000 \
        "nccl all-reduce of 1000 elements did not complete within 2 s: a peer rank died or stalled" \
        $MPIRUN -np 1 "$BIN" --device cuda --comm nccl --fault device_stall --timeout 2
    if [ "$RC" -ne 0 ] && [ "$MS" -lt 2000 ]; then
        bad "$name: ended after ${MS} ms, before the 2 s timeout could fire" "$LOG/$name"
    fi
    if [ "$RC" -ne 0 ] && ! grep -q "comm_wait returned; blocking in cudaStreamSynchronize" "$LOG/$name"; then
        bad "$name: the host never got past comm_wait (it must not block there)" "$LOG/$name"
    fi
    expect_pass "cuda np=1 --comm auto (single)" $MPIRUN -np 1 "$BIN" --device cuda
    expect_pass "cuda np=3 --comm mpi (staged, ranks share GPUs)" $MPIRUN -np 3 "$BIN" --device cuda --comm mpi
    expect_pass "cuda np=2 --comm auto" $MPIRUN -np 2 "$BIN" --device cuda
    if [ "$NGPU" -ge 2 ]; then
        expect_pass "cuda np=2 --comm nccl" $MPIRUN -np 2 "$BIN" --device cuda --comm nccl
        expect_fail "cuda np=2 nccl, rank 1 stalls, --timeout 3" 20000 "did not complete within 3 s" \
            $MPIRUN -np 2 "$BIN" --device cuda --comm nccl --fault sleep --fault_rank 1 --timeout 3
        expect_fail "cuda np=2 nccl, rank 1 never sends, --timeout 3" 20000 \
            "nccl receive of 1000 elements from rank 1 of 2 (global rank 1), tag 0 did not complete within 3 s" \
            $MPIRUN -np 2 "$BIN" --device cuda --comm nccl --fault nosend --fault_rank 1 --timeout 3
        # rank 1's stream held 24 s after the GPU reached the all-reduce: both
        # ranks' watchdogs see it started and not completing
        expect_fail "cuda np=2 nccl, rank 1's stream held in an all-reduce, --timeout 3" 14000 \
            "all-reduce of 1000 elements did not complete within 3 s: a peer rank died or stalled" \
            $MPIRUN -np 2 "$BIN" --device cuda --comm nccl --fault device_stall --fault_rank 1 --timeout 3
    fi
    if [ "$NGPU" -ge 3 ]; then
        expect_pass "cuda np=3 --comm nccl" $MPIRUN -np 3 "$BIN" --device cuda --comm nccl
        expect_fail "cuda np=3 nccl, rank 2 stalls in its group, --timeout 3" 20000 "did not complete within 3 s" \
            $MPIRUN -np 3 "$BIN" --device cuda --comm nccl --fault group_sleep --fault_rank 2 --timeout 3
    fi
    if [ "$NGPU" -ge 4 ]; then
        expect_pass "cuda np=4 --comm nccl" $MPIRUN -np 4 "$BIN" --device cuda --comm nccl
    fi
    np=$((NGPU + 1))
    expect_fail "cuda np=$np --comm nccl on $NGPU GPU(s)" 20000 "share $NGPU GPU(s) on this host" \
        $MPIRUN -np $np "$BIN" --device cuda --comm nccl
    expect_fail "cuda np=2 staged mpi, rank 1 stalls, --timeout 3" 20000 "did not complete within 3 s" \
        $MPIRUN -np 2 "$BIN" --device cuda --comm mpi --fault sleep --fault_rank 1 --timeout 3
    expect_fail "cuda np=2 staged mpi, rank 1 never sends, --timeout 3" 20000 \
        "receive of 1000 elements from rank 1 of 2 (global rank 1), tag 0 did not complete within 3 s" \
        $MPIRUN -np 2 "$BIN" --device cuda --comm mpi --fault nosend --fault_rank 1 --timeout 3
fi

echo "test_comm: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
