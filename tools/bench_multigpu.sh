#!/usr/bin/env bash
# tools/bench_multigpu.sh — the several-GPU figures in one command: NCCL
# equivalence, scaling, overlap, memory per rank and a model that fits only with ZeRO-1.
# Writes DIR/report.md (markdown) and prints it. Run after `make -j` (needs ./train_gpt2,
# build/make_shard and, for part c, build/nccl_bench). See docs/MULTIGPU.md.
#
#   tools/bench_multigpu.sh [--parts a,b,c,d,e] [--ngpus N] [--out DIR] [--budget S]
#                           [--gpu_mem_mib M] [--e_pick largest|smallest] [--e_model dN]
#                           [--nccl_bench_log FILE] [--tol_bf16 X] [--tol_fp32 X] [--smoke]
#
#   a  equivalence: N = all GPUs, zero_stage 0 and 1, --comm nccl, against 1 GPU with
#      accumulation N (same global batch); bf16 50 steps, losses within --tol_bf16 (1e-2)
#      relative; --dtype fp32 50 steps within --tol_fp32 (1e-5). d12, B 4 x T 256 per GPU.
#   b  scaling: d12, T 1024, B 64 per GPU, 15 steps, median tokens/s of steps 6..15 at
#      N = 1, 2, 4, 8 (those that fit) for zero_stage 0 and 1; efficiency, zero 1 vs 0.
#   c  overlap at the largest N: ms/step with the default buckets against one bucket
#      (--bucket_size 1000M), the trainer's "overlap:" lines, and build/nccl_bench's busbw
#      at the trainer's bucket sizes (--nccl_bench_log FILE: read that output instead).
#   d  memory per rank: d24 at the largest N, zero_stage 0 and 1, rank 0's peak allocated
#      against 16 and 4 + 12/N bytes/param plus activations.
#   e  of the dN whose 16 bytes/param + activations (B 1, T 1024) exceed the GPU while
#      (4 + 12/N) bytes/param + activations + 2 GiB fit in 90 % of it, the smallest
#      (--e_pick largest: the largest; on H200s d57, 9.3 B params, and up to d62 / d70 /
#      d76 at N = 2 / 4 / 8); 5 steps at zero_stage 1, then zero_stage 0, which must fail
#      with the trainer's out-of-memory error. The weights come from a bf16 llm.c model
#      file written here: every rank reads them single-threaded (several ns per
#      parameter, a random init is ~45 ns), so the smallest is the default that fits the
#      call's time. --e_model dN forces the model, --gpu_mem_mib the memory (default:
#      nvidia-smi's smallest memory.total).
#   --ngpus N   use at most N GPUs (default: all of nvidia-smi -L)
#   --budget S  seconds for the whole call (default 560): a run is given at most what is
#               left, and runs that no longer fit are reported as not run
#   --smoke     every part on the CPU with a tiny model (--comm mpi, N 1 and 2, part e
#               against a pretend GPU of --gpu_mem_mib, default 300): tests this script
#   --out DIR   default runs/multigpu (runs/multigpu_smoke with --smoke)
# Every mpirun gets NCCL_NVLS_ENABLE=0 (exported, and passed with -x).
set -u
SELF=$(readlink -f "$0")
cd "$(dirname "$SELF")/.."
die() { echo "bench_multigpu.sh: $*" >&2; exit 2; }
CMDLINE="tools/bench_multigpu.sh $*"
PARTS=a,b,c,d,e NGPUS_CAP=0 OUT="" BUDGET=560 GPU_MEM_MIB="" E_PICK=smallest E_MODEL="" NB_LOG=""
TOL_BF16=1e-2 TOL_FP32=1e-5 SMOKE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1; shift; continue ;;
        -h|--help) sed -n '2,36p' "$SELF"; exit 0 ;;
    esac
    [ $# -ge 2 ] || die "$1 needs a value (see --help)"
    case "$1" in
        --parts) PARTS="$2" ;; --ngpus) NGPUS_CAP="$2" ;; --out) OUT="$2" ;; --budget) BUDGET="$2" ;;
        --gpu_mem_mib) GPU_MEM_MIB="$2" ;; --e_pick) E_PICK="$2" ;; --e_model) E_MODEL="$2" ;;
        --nccl_bench_log) NB_LOG="$2" ;; --tol_bf16) TOL_BF16="$2" ;; --tol_fp32) TOL_FP32="$2" ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift 2
done
PARTS=$(echo "$PARTS" | tr -d ' ')
[[ "$PARTS" =~ ^[a-e](,[a-e])*$ ]] || die "--parts: '$PARTS' is not a comma-separated list of a b c d e"
has() { [[ ",$PARTS," == *",$1,"* ]]; }
[[ "$NGPUS_CAP" =~ ^[0-9]+$ ]] || die "--ngpus: '$NGPUS_CAP' is not a non-negative integer"
[[ "$BUDGET" =~ ^[1-9][0-9]*$ ]] || die "--budget: '$BUDGET' is not a positive integer (seconds)"
[ -z "$GPU_MEM_MIB" ] || [[ "$GPU_MEM_MIB" =~ ^[1-9][0-9]*$ ]] || die "--gpu_mem_mib: '$GPU_MEM_MIB' is not a positive integer"
[ "$E_PICK" = largest ] || [ "$E_PICK" = smallest ] || die "--e_pick must be largest or smallest"
[ -z "$E_MODEL" ] || [[ "$E_MODEL" =~ ^d[1-9][0-9]*$ ]] || die "--e_model: '$E_MODEL' is not a preset dN"
[ -z "$NB_LOG" ] || [ -r "$NB_LOG" ] || die "--nccl_bench_log: cannot read '$NB_LOG'"
for t in "$TOL_BF16" "$TOL_FP32"; do
    [[ "$t" =~ ^[0-9.]+([eE]-?[0-9]+)?$ ]] || die "--tol_bf16/--tol_fp32: '$t' is not a non-negative number"
done
command -v python3 >/dev/null || die "python3 not found (it builds the tables)"
command -v mpirun >/dev/null || die "mpirun not found (Open MPI; make deps installs it)"
for f in ./train_gpt2 build/make_shard; do [ -x "$f" ] || die "$f not found: run make -j first"; done
NCCL_BENCH=${NCCL_BENCH:-build/nccl_bench}

START=$(date +%s)
DEADLINE=$((START + BUDGET))
export NCCL_NVLS_ENABLE=0
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
NPROC=$(nproc 2>/dev/null || echo 1)

# ---- the machine and the configurations ----
if [ $SMOKE = 1 ]; then
    DEVICE=cpu COMM_N=mpi NGPU=2 GPU_NAME="cpu (smoke: no GPU)"
    : "${GPU_MEM_MIB:=300}"
    OUT=${OUT:-runs/multigpu_smoke}
    MF="--model d2 --n_embd 32 --n_head 2 --max_seq_len 64"   # the tiny model of a, b, c
    A_B=4 A_T=32 A_STEPS=20 A_DT_BF16=fp32                     # the CPU has no bf16: both legs fp32
    B_B=4 B_T=32 B_STEPS=6 B_SKIP=2 B_EXTRA="--bucket_size 300K"     # several buckets in the tiny model
    D_MF="--model d4 --n_embd 64 --n_head 4 --max_seq_len 64" D_NAME="d4 (C 64, T 64)" D_B=4 D_T=32 D_STEPS=3
    E_T=64 E_STEPS=3 E_OVERHEAD=0 ES=4
    RUN_TIMEOUT=${RUN_TIMEOUT:-120}
    OMP_ALL=1
else
    DEVICE=cuda COMM_N=nccl
    command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no GPU here (use --smoke to test the script on CPU)"
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    [ "$NGPU" -ge 1 ] || die "nvidia-smi -L lists no GPU"
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    if [ -z "$GPU_MEM_MIB" ]; then
        GPU_MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | sort -n | head -1 | tr -d ' ')
        [[ "$GPU_MEM_MIB" =~ ^[0-9]+$ ]] || die "nvidia-smi gave no memory size ('$GPU_MEM_MIB'): pass --gpu_mem_mib"
    fi
    OUT=${OUT:-runs/multigpu}
    MF="--model d12"
    A_B=4 A_T=256 A_STEPS=50 A_DT_BF16=bf16
    B_B=64 B_T=1024 B_STEPS=15 B_SKIP=5 B_EXTRA=""
    D_MF="--model d24" D_NAME="d24 (GPT-2 350M)" D_B=4 D_T=1024 D_STEPS=3
    E_T=1024 E_STEPS=5 E_OVERHEAD=$((2 << 30)) ES=2
    RUN_TIMEOUT=${RUN_TIMEOUT:-300}
    OMP_ALL=0
fi
[ "$NGPUS_CAP" -gt 0 ] && [ "$NGPUS_CAP" -lt "$NGPU" ] && NGPU=$NGPUS_CAP
COUNTS=""
for n in 1 2 4 8; do [ "$n" -le "$NGPU" ] && COUNTS="$COUNTS $n"; done
COUNTS=${COUNTS# }
NMAX=${COUNTS##* }
mkdir -p "$OUT" || die "--out $OUT: cannot create"
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ "$REV" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && REV="$REV+dirty"
echo "bench_multigpu.sh: parts $PARTS | $NGPU x $GPU_NAME | N in {$COUNTS} | rev $REV | out $OUT | budget ${BUDGET}s"

SHARD="$OUT/train.bin"
if [ $SMOKE = 1 ]; then ntok=400000; else ntok=$((2 * NMAX * B_B * (B_T + 1) * (B_STEPS + 1) + 1)); fi
build/make_shard "$SHARD" "$ntok" 1 >/dev/null || die "build/make_shard failed"

# run_train DIR NP [trainer flags...]: one run through mpirun and timeout; DIR/{cmd.txt,out.txt,log.jsonl,rc}
run_train() {
    local dir="$1" np="$2"; shift 2
    rm -rf "$dir"; mkdir -p "$dir"
    local left=$((DEADLINE - $(date +%s) - 15)) t=$RUN_TIMEOUT
    [ "$left" -lt "$t" ] && t=$left
    if [ "$t" -lt 20 ]; then
        echo budget >"$dir/rc"
        echo "  $dir: not run (the --budget of ${BUDGET}s is spent)"
        return 99
    fi
    local omp=1
    [ $OMP_ALL = 0 ] && omp=$((NPROC / np)) && [ $omp -lt 1 ] && omp=1
    local comm=()
    [ "$np" -gt 1 ] && comm=(--comm "$COMM_N")
    local cmd=(./train_gpt2 --device "$DEVICE" "${comm[@]}" --input_bin "$SHARD" --input_val_bin "" --output_dir "$dir" "$@")
    echo "OMP_NUM_THREADS=$omp NCCL_NVLS_ENABLE=0 timeout $t $MPIRUN -np $np -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE ${cmd[*]}" >"$dir/cmd.txt"
    local t0=$(date +%s)
    OMP_NUM_THREADS=$omp timeout -k 10 "$t" $MPIRUN -np "$np" -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE "${cmd[@]}" >"$dir/out.txt" 2>&1
    local rc=$?
    echo "$rc" >"$dir/rc"
    local last
    last=$(grep -E '^step +[0-9]+/' "$dir/out.txt" | tail -1 | cut -c1-110)
    if [ $rc -eq 0 ]; then
        echo "  $dir: ok in $(($(date +%s) - t0)) s | $last"
    else
        echo "  $dir: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)') in $(($(date +%s) - t0)) s | $(grep -m1 '^error:' "$dir/out.txt" | cut -c1-200)"
    fi
    return $rc
}
# the python side of the script: $PY CMD ARGS (see the end of this file)
py() { python3 -c "$(sed -n '/^#==PYTHON==$/,/^#==END==$/p' "$SELF" | sed '1d;$d')" "$@"; }
part_start() { echo "==== part $1: $2 ($(($(date +%s) - START)) s elapsed)"; }

export OUT SMOKE DEVICE NMAX COUNTS GPU_NAME GPU_MEM_MIB NGPU REV CMDLINE MF D_NAME ES E_T E_PICK E_MODEL
export B_EXTRA A_B A_T A_STEPS A_DT_BF16 B_B B_T B_STEPS B_SKIP D_B D_T D_STEPS E_STEPS E_OVERHEAD TOL_BF16 TOL_FP32 PARTS
rm -f "$OUT/parts_run"

# ---- a. equivalence ----
if has a; then
    part_start a "equivalence, N = $NMAX against 1 with accumulation $NMAX"
    echo a >>"$OUT/parts_run"
    if [ "$NMAX" -ge 2 ]; then
        tb=$((A_B * A_T * NMAX))
        for leg in bf16 fp32; do
            dt=$leg; [ $leg = bf16 ] && dt=$A_DT_BF16
            common=($MF --batch_size "$A_B" --sequence_length "$A_T" --total_batch_size "$tb"
                    --num_iterations "$A_STEPS" --dtype "$dt" --learning_rate 6e-4 --weight_decay 0.1)
            run_train "$OUT/a/$leg/n1" 1 "${common[@]}"
            for z in 0 1; do run_train "$OUT/a/$leg/n${NMAX}_z$z" "$NMAX" "${common[@]}" --zero_stage $z; done
        done
    fi
fi

# ---- b. scaling ----
if has b; then
    part_start b "scaling, N in {$COUNTS}, zero_stage 0 and 1"
    echo b >>"$OUT/parts_run"
    for n in $COUNTS; do
        for z in 0 1; do
            run_train "$OUT/b/n${n}_z$z" "$n" $MF --batch_size "$B_B" --sequence_length "$B_T" \
                --num_iterations "$B_STEPS" --zero_stage $z --learning_rate 6e-4 --weight_decay 0.1 $B_EXTRA
        done
    done
fi

# ---- c. overlap ----
if has c; then
    part_start c "overlap at N = $NMAX: default buckets against one bucket; nccl_bench"
    echo c >>"$OUT/parts_run"
    if [ "$NMAX" -ge 2 ]; then
        for z in 0 1; do
            flags=($MF --batch_size "$B_B" --sequence_length "$B_T" --num_iterations "$B_STEPS" --zero_stage $z
                   --learning_rate 6e-4 --weight_decay 0.1 $B_EXTRA)
            if [ "$(cat "$OUT/b/n${NMAX}_z$z/rc" 2>/dev/null)" = 0 ]; then
                echo "  default buckets, zero_stage $z: the run of part b ($OUT/b/n${NMAX}_z$z)"
                rm -rf "$OUT/c/n${NMAX}_z${z}_default"
            else
                run_train "$OUT/c/n${NMAX}_z${z}_default" "$NMAX" "${flags[@]}"
            fi
            run_train "$OUT/c/n${NMAX}_z${z}_onebucket" "$NMAX" "${flags[@]}" --bucket_size 1000M
        done
        # the trainer's bucket sizes (from its layout line) and the whole buffer, then 1Mi .. 256Mi
        lay="$OUT/b/n${NMAX}_z0/out.txt"
        [ -f "$lay" ] || lay="$OUT/c/n${NMAX}_z0_default/out.txt"
        sizes=$(sed -nE 's/^layout: [0-9]+ params, [0-9]+ buckets \(len ([0-9]+)\.\.([0-9]+)\).*/\1,\2/p' "$lay" 2>/dev/null | head -1)
        total=$(sed -nE 's/^layout: ([0-9]+) elements = .*/\1/p' "$lay" 2>/dev/null | head -1)
        [ -n "$sizes" ] && [ -n "$total" ] && sizes=$(echo "$sizes,$total" | tr ',' '\n' | sort -un | tr '\n' ',') || sizes=""
        sizes="${sizes}1Mi,2Mi,4Mi,8Mi,16Mi,32Mi,64Mi,128Mi,256Mi"
        [ $SMOKE = 1 ] && sizes="${sizes%%,1Mi*},1Mi"
        echo "$sizes" >"$OUT/c/nccl_bench_sizes"
        if [ -n "$NB_LOG" ]; then
            echo "  nccl_bench: reading $NB_LOG"
            cp "$NB_LOG" "$OUT/c/nccl_bench.txt"; echo 0 >"$OUT/c/nccl_bench.rc"
        elif [ ! -x "$NCCL_BENCH" ]; then
            echo "$NCCL_BENCH not built (make builds it where nvcc and mpicc are found)" >"$OUT/c/nccl_bench.txt"
            echo 127 >"$OUT/c/nccl_bench.rc"; echo "  nccl_bench: $NCCL_BENCH not built"
        else
            left=$((DEADLINE - $(date +%s) - 15)); t=240; [ $left -lt $t ] && t=$left
            if [ $t -lt 20 ]; then
                echo "not run: the --budget is spent" >"$OUT/c/nccl_bench.txt"; echo budget >"$OUT/c/nccl_bench.rc"
            else
                echo "  nccl_bench: $MPIRUN -np $NMAX -x NCCL_NVLS_ENABLE $NCCL_BENCH --sizes $sizes"
                timeout -k 10 $t $MPIRUN -np "$NMAX" -x NCCL_NVLS_ENABLE "$NCCL_BENCH" --sizes "$sizes" \
                    >"$OUT/c/nccl_bench.txt" 2>&1
                echo $? >"$OUT/c/nccl_bench.rc"
                echo "  nccl_bench: exit $(cat "$OUT/c/nccl_bench.rc") | $(grep -m1 -E '^error:' "$OUT/c/nccl_bench.txt")"
            fi
        fi
    fi
fi

# ---- d. memory per rank ----
if has d; then
    part_start d "memory per rank, $D_NAME at N = $NMAX"
    echo d >>"$OUT/parts_run"
    for z in 0 1; do
        run_train "$OUT/d/n${NMAX}_z$z" "$NMAX" $D_MF --batch_size "$D_B" --sequence_length "$D_T" \
            --num_iterations "$D_STEPS" --zero_stage $z
    done
fi

# ---- e. a model that fits only with ZeRO-1 ----
if has e; then
    part_start e "a model that fits only with ZeRO-1 at N = $NMAX"
    echo e >>"$OUT/parts_run"
    rm -rf "$OUT/e"; mkdir -p "$OUT/e"
    if [ "$NMAX" -ge 2 ]; then
        py choose >"$OUT/e/choice.txt" 2>&1
        cat "$OUT/e/choice.txt"
        if [ -f "$OUT/e/choice.json" ]; then
            read -r L C NH FILE_GB < <(py choice_fields)
            model="$OUT/e/model.bin"
            avail=$(df -Pk "$OUT" | awk 'NR == 2 {print int($4 / 1048576)}')
            if [ -z "${FILE_GB:-}" ]; then
                echo "could not read $OUT/e/choice.json" | tee "$OUT/e/skipped"
            elif [ $((DEADLINE - $(date +%s))) -lt 150 ]; then
                echo "the --budget is nearly spent ($((DEADLINE - $(date +%s))) s left): run --parts e in its own call" | tee "$OUT/e/skipped"
            elif [ "$avail" -lt $((FILE_GB + 5)) ]; then
                echo "not enough disk for the ${FILE_GB} GB model file: ${avail} GB free" | tee "$OUT/e/skipped"
            else
                t0=$(date +%s)
                if py write_model "$model" "$L" "$C" "$NH" "$E_T"; then
                    echo "  wrote $model (d$L, $FILE_GB GB) in $(($(date +%s) - t0)) s"
                else
                    echo "writing the model file $model failed" | tee "$OUT/e/skipped"
                fi
                if [ ! -f "$OUT/e/skipped" ]; then
                    run_train "$OUT/e/z1" "$NMAX" --model "$model" --batch_size 1 --sequence_length "$E_T" \
                        --num_iterations "$E_STEPS" --zero_stage 1
                    run_train "$OUT/e/z0" "$NMAX" --model "$model" --batch_size 1 --sequence_length "$E_T" \
                        --num_iterations "$E_STEPS" --zero_stage 0
                fi
                rm -f "$model"
            fi
        fi
    fi
fi

# ---- the report ----
py report >"$OUT/report.md" || die "could not build the report (see $OUT/report.md)"
echo
cat "$OUT/report.md"
echo
echo "report: $OUT/report.md ($(($(date +%s) - START)) s)"
exit 0

# The python side (tables, arithmetic, the model file): read by py() above, skipped by bash.
: <<'#==END=='
#==PYTHON==
import json, math, os, re, statistics, struct, sys, random

E = os.environ
OUT = E.get("OUT", ".")
SMOKE = E.get("SMOKE") == "1"
VP, V = 50304, 50257


def rd(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def rc_of(d):
    r = rd(os.path.join(d, "rc"))
    return None if r is None else r.strip()


def steps_of(d):
    out = []
    for line in (rd(os.path.join(d, "log.jsonl")) or "").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "loss" in r and "tokens_per_s" in r:
            out.append(r)
    return out


def err_line(d):
    for line in (rd(os.path.join(d, "out.txt")) or "").splitlines():
        if line.startswith("error:"):
            return line.strip()
    return None


FAILS = {}   # error line -> the runs that ended with it; listed under the part's table


def status(d):
    """None when the run finished; else a short reason (the error line goes to FAILS)."""
    rc = rc_of(d)
    if rc is None:
        return "not run"
    if rc == "budget":
        return "not run (time budget spent)"
    if rc == "0":
        return None
    e = err_line(d) or "(no error line; see out.txt)"
    runs = FAILS.setdefault(e, [])
    name = os.path.relpath(d, OUT)
    if name not in runs:
        runs.append(name)
    return f"exit {rc}{' (timed out)' if rc == '124' else ''}"


def flush_fails(o):
    if FAILS:
        o.append("Failed runs (DIR/out.txt holds the whole output):\n")
        for e, runs in FAILS.items():
            o.append(f"- {', '.join(runs)}: `{e[:200]}`")
        o.append("")
    FAILS.clear()


def mem_line(d, rank=0):
    m = re.search(rf"^rank {rank} memory: params ([\d.]+) MB, grads ([\d.]+) MB, master ([\d.]+) MB, "
                  r"adam_m ([\d.]+) MB, adam_v ([\d.]+) MB, activations ([\d.]+) MB.*$",
                  rd(os.path.join(d, "out.txt")) or "", re.M)
    if not m:
        return None, None
    keys = ["params", "grads", "master", "adam_m", "adam_v", "activations"]
    return dict(zip(keys, map(float, m.groups()[:6]))), m.group(0)


def nparams(d):
    m = re.search(r"^model .*?, (\d+) parameters$", rd(os.path.join(d, "out.txt")) or "", re.M)
    return int(m.group(1)) if m else None


def layout_of(d):
    t = rd(os.path.join(d, "out.txt")) or ""
    m = re.search(r"^layout: \d+ params, (\d+) buckets \(len (\d+)\.\.(\d+)\)", t, re.M)
    m2 = re.search(r"^layout: (\d+) elements = ", t, re.M)
    if not m or not m2:
        return None
    return {"nbuckets": int(m.group(1)), "bmin": int(m.group(2)), "bmax": int(m.group(3)), "total": int(m2.group(1))}


def dtype_of(d):
    m = re.search(r"\| dtype (\w+) \|", rd(os.path.join(d, "out.txt")) or "")
    return m.group(1) if m else "?"


def overlap_lines(d):
    return [l.strip() for l in (rd(os.path.join(d, "out.txt")) or "").splitlines() if l.startswith("overlap:")]


def timed(d, skip):
    s = steps_of(d)
    if not s:
        return []
    last = max(r["step"] for r in s)
    k = skip if last > skip else min(1, last - 1)
    return [r for r in s if r["step"] > k]


def med(d, key, skip):
    t = timed(d, skip)
    return statistics.median(r[key] for r in t) if t else None


def fmt(x, spec=",.0f", none="-"):
    return none if x is None else format(x, spec)


# ---------------------------------------------------------------- model arithmetic

def params_of(L, C, T):
    # llm.c's tensors: wte (Vp x C), wpe (T x C), per layer 12 C^2 + 13 C, final layernorm 2 C
    return VP * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def acts_of(L, C, NH, B, T, es):
    # model/gpt2.c acts_layout, recompute 0: per layer 16 BTC (ln1 1, qkv 3, atty 1, res2 1, ln2 1,
    # fch 4, fch_gelu 4, res3 1), shared 9 BTC (encoded, attproj, fcproj, lnf, dres, dbtc, dqkv 3;
    # the fc gradient goes into fch_gelu), logits BT Vp; fp32 stats: 4 L BT (layernorms) + L BT NH
    # (lse) + 3 BT; inputs/targets
    BT = B * T
    return es * BT * C * (16 * L + 9) + es * BT * VP + 4 * BT * (4 * L + L * NH + 3) + 8 * BT


def gib(x):
    """bytes as GiB, or MiB below 10 GiB (the smoke test's pretend GPU)"""
    return f"{x / 2**30:.1f} GiB" if x >= 10 * 2**30 else f"{x / 2**20:,.0f} MiB"


def cmd_choose():
    N = int(E["NMAX"])
    es = int(E["ES"])
    T = int(E["E_T"])
    mem = int(E["GPU_MEM_MIB"]) * 1048576
    over = int(E["E_OVERHEAD"])
    margin = 0.90
    b0, b1 = 2 * es + 12, 2 * es + 12.0 / N

    def row(d):
        L, C = d, 64 * d
        P = params_of(L, C, T)
        A = acts_of(L, C, L, 1, T, es)
        return {"d": d, "L": L, "C": C, "NH": L, "P": P, "acts": A, "z0": b0 * P + A, "z1": b1 * P + A + over}

    rows = [row(d) for d in range(1, 161)]
    ok = [r for r in rows if r["z0"] > mem and r["z1"] <= margin * mem]
    gpu = "pretend GPU (smoke)" if SMOKE else "GPU"
    print(f"part e: {gpu} memory {gib(mem)}; N = {N}; "
          f"zero_stage 0 needs {b0:g} bytes/param, zero_stage 1 {2 * es} + 12/{N} = {b1:.2f}; "
          f"activations at B 1, T {T} by model/gpt2.c's layout; fits = zero_stage 1 + {gib(over)} "
          f"(context, NCCL, workspaces) <= {margin:.0%} of the GPU")
    if E.get("E_MODEL"):
        d = int(E["E_MODEL"][1:])
        pick = row(d)
        why = f"forced by --e_model {E['E_MODEL']}"
    elif not ok:
        print(f"part e: no dN (d1..d160) fits with ZeRO-1 but not without at N = {N}: skipped")
        return
    else:
        pick = dict(ok[-1] if E.get("E_PICK", "largest") == "largest" else ok[0])
        why = f"the {E.get('E_PICK', 'largest')} dN with zero_stage 0 > the GPU and zero_stage 1 fitting"
    pick.update({"mem": mem, "N": N, "b0": b0, "b1": b1, "over": over, "margin": margin, "why": why, "T": T,
                 "es": es, "ok": [r["d"] for r in ok]})
    pick["near"] = [row(d) for d in range(max(1, pick["d"] - 1), pick["d"] + 2)]
    with open(os.path.join(OUT, "e", "choice.json"), "w") as f:
        json.dump(pick, f)
    print(f"part e: d{pick['d']} ({why}): L {pick['L']}, C {pick['C']}, {pick['P'] / 1e9:.2f} B params, "
          f"zero_stage 0 {gib(pick['z0'])}, zero_stage 1 {gib(pick['z1'])}")


def cmd_choice_fields():
    c = json.load(open(os.path.join(OUT, "e", "choice.json")))
    print(c["L"], c["C"], c["NH"], math.ceil((1024 + 2 * c["P"]) / 1e9))


def cmd_write_model(path, L, C, NH, T):
    """A bf16 llm.c model file (version 5): layernorm weights 1, biases 0, the rest N(0, 0.02^2)
    drawn once for a block of 2^20 values and repeated (enough to train a few steps)."""
    L, C, NH, T = int(L), int(C), int(NH), int(T)
    sys.path.insert(0, "tools")
    from llmc_format import MODEL_MAGIC, param_shapes
    rng = random.Random(1337)

    def bf16(x):
        b = struct.unpack("<I", struct.pack("<f", x))[0]
        return (b + 0x7FFF + ((b >> 16) & 1)) >> 16

    n_blk = 1 << 20
    rnd = struct.pack(f"<{n_blk}H", *(bf16(rng.gauss(0.0, 0.02)) for _ in range(n_blk)))
    one = struct.pack("<H", bf16(1.0)) * n_blk
    zero = bytes(2 * n_blk)
    hdr = [0] * 256
    hdr[:8] = [MODEL_MAGIC, 5, T, V, L, NH, C, VP]
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        for name, shape in param_shapes(T, L, C, VP):
            n = 1
            for s in shape:
                n *= s
            blk = one if name in ("ln1w", "ln2w", "lnfw") else zero if name.endswith("b") else rnd
            while n > 0:
                k = min(n, n_blk)
                f.write(blk[:2 * k])
                n -= k
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- the report

def part_a(o):
    N = int(E["NMAX"])
    o.append("## a. Equivalence with NCCL\n")
    if N < 2:
        o.append("Not run: one GPU only.\n")
        return
    comm = "MPI (smoke)" if SMOKE else "NCCL"
    o.append(f"N = {N} ranks ({comm}), zero_stage 0 and 1, against 1 rank with gradient accumulation {N}: "
             f"{E['MF']}, B {E['A_B']} x T {E['A_T']} per rank, global batch "
             f"{int(E['A_B']) * int(E['A_T']) * N} tokens, {E['A_STEPS']} steps, lr 6e-4, weight decay 0.1. "
             "Max relative difference of the per-step losses (log.jsonl) against the 1-rank run.\n")
    if SMOKE:
        o.append("(Smoke: the CPU computes in fp32, so the 'bf16' leg runs --dtype fp32 with bf16's tolerance.)\n")
    o.append("| leg | dtype run | zero_stage | steps compared | max rel diff | tolerance | result |")
    o.append("|---|---|--:|--:|--:|--:|---|")
    for leg, tol in (("bf16", float(E["TOL_BF16"])), ("fp32", float(E["TOL_FP32"]))):
        ref = os.path.join(OUT, "a", leg, "n1")
        rs = status(ref)
        ref_l = [r["loss"] for r in steps_of(ref)]
        for z in (0, 1):
            d = os.path.join(OUT, "a", leg, f"n{N}_z{z}")
            st = status(d)
            if rs or st:
                why = f"1 rank: {rs}" if rs else f"N = {N}: {st}"
                o.append(f"| {leg} | {dtype_of(d)} | {z} | - | - | {tol:g} | FAIL ({why}) |")
                continue
            x = [r["loss"] for r in steps_of(d)]
            n = min(len(x), len(ref_l))
            rel = [abs(a - b) / abs(b) if math.isfinite(a) and math.isfinite(b) and b else math.inf
                   for a, b in zip(x, ref_l)]
            m = max(rel, default=math.inf)
            full = n == int(E["A_STEPS"]) and len(x) == len(ref_l)
            res = "PASS" if full and m <= tol else "FAIL" + ("" if full else f" ({len(x)} vs {len(ref_l)} steps)")
            o.append(f"| {leg} | {dtype_of(d)} | {z} | {n} | {m:.2e} | {tol:g} | {res} |")
        if ref_l:
            o.append(f"| {leg} | 1-rank losses | | | step 1 {ref_l[0]:.4f} -> step {len(ref_l)} {ref_l[-1]:.4f} | | |")
    o.append("")


def part_b(o):
    counts = [int(c) for c in E["COUNTS"].split()]
    skip, steps = int(E["B_SKIP"]), int(E["B_STEPS"])
    o.append("## b. Scaling\n")
    o.append(f"{E['MF']}, B {E['B_B']} x T {E['B_T']} per rank, {steps} steps, median tokens/s of steps "
             f"{skip + 1}..{steps} (log.jsonl); efficiency = tok/s(N) / (N x tok/s(1)) at the same zero_stage; "
             "zero 1 vs 0 = tok/s(zero 1) / tok/s(zero 0) - 1.\n")
    o.append("| N | zero 0 tok/s | zero 0 ms/step | zero 0 efficiency | zero 1 tok/s | zero 1 ms/step | "
             "zero 1 efficiency | zero 1 vs 0 |")
    o.append("|--:|--:|--:|--:|--:|--:|--:|--:|")
    base = {}
    res = {}
    for n in counts:
        cells = []
        for z in (0, 1):
            d = os.path.join(OUT, "b", f"n{n}_z{z}")
            st = status(d)
            tps = med(d, "tokens_per_s", skip) if not st else None
            ms = med(d, "ms", skip) if not st else None
            if n == 1:
                base[z] = tps
            eff = tps / (n * base[z]) if tps and base.get(z) else None
            res[(n, z)] = (tps, eff)
            cells += [fmt(tps) if not st else st, fmt(ms, ".1f"), fmt(eff and 100 * eff, ".1f") + ("%" if eff else "")]
        t0, t1 = res[(n, 0)][0], res[(n, 1)][0]
        diff = f"{100 * (t1 / t0 - 1):+.1f}%" if t0 and t1 else "-"
        o.append(f"| {n} | " + " | ".join(cells) + f" | {diff} |")
    nmax = counts[-1]
    e0, e1 = res[(nmax, 0)][1], res[(nmax, 1)][1]
    t0, t1 = res[(nmax, 0)][0], res[(nmax, 1)][0]
    o.append("")
    if nmax > 1:
        tgt = "at 8 GPUs" if nmax == 8 else f"(set for 8 GPUs; here N = {nmax})"
        verdict = lambda ok: "met" if ok else "missed"
        if e0 and e1:
            o.append(f"Target: efficiency >= 95 % {tgt}: zero 0 {100 * e0:.1f} % ({verdict(e0 >= 0.95)}), "
                     f"zero 1 {100 * e1:.1f} % ({verdict(e1 >= 0.95)}).")
        if t0 and t1:
            o.append(f"Target: zero_stage 1 within 3 % of zero_stage 0: {100 * (t1 / t0 - 1):+.1f} % "
                     f"({verdict(abs(t1 / t0 - 1) <= 0.03)}).")
        if SMOKE:
            o.append("(Smoke: ranks share 2 CPU cores, so these figures say nothing about scaling.)")
    o.append("")


def nccl_table():
    """{(op, dtype, elements): (busbw, time_us)} from nccl_bench's output"""
    t = rd(os.path.join(OUT, "c", "nccl_bench.txt")) or ""
    tab, op = {}, None
    for line in t.splitlines():
        m = re.match(r"^# op (\w+)", line)
        if m:
            op = m.group(1)
            continue
        f = line.split()
        if op and len(f) == 6 and f[0].isdigit() and f[2] in ("bf16", "fp32"):
            tab[(op, f[2], int(f[0]))] = (float(f[5]), float(f[3]))
    return tab, t


def part_c(o):
    N = int(E["NMAX"])
    skip = int(E["B_SKIP"])
    o.append("## c. Overlap\n")
    if N < 2:
        o.append("Not run: one GPU only.\n")
        return
    o.append(f"N = {N}, {E['MF']}, B {E['B_B']} x T {E['B_T']}: median ms/step (steps {skip + 1}..{E['B_STEPS']}) with "
             f"the default buckets ({E.get('B_EXTRA') or '--bucket_size 4M'} elements; each bucket's reduction launched as backward finishes "
             "it) against one bucket (--bucket_size 1000M: one reduction after the whole backward). Exposed "
             "communication = ms/step(N) - ms/step(1 rank, part b).\n")
    o.append("| zero_stage | buckets | default ms/step | one bucket ms/step | 1 rank ms/step | exposed, default | "
             "exposed, one bucket | hidden by the buckets |")
    o.append("|--:|--:|--:|--:|--:|--:|--:|--:|")
    lay, quotes, implied = None, [], {}
    for z in (0, 1):
        dd = os.path.join(OUT, "b", f"n{N}_z{z}")
        if rc_of(dd) != "0":
            dd = os.path.join(OUT, "c", f"n{N}_z{z}_default")
        d1 = os.path.join(OUT, "c", f"n{N}_z{z}_onebucket")
        r1 = os.path.join(OUT, "b", f"n1_z{z}")
        sd, s1 = status(dd), status(d1)
        md = med(dd, "ms", skip) if not sd else None
        m1 = med(d1, "ms", skip) if not s1 else None
        mr = med(r1, "ms", skip) if not status(r1) else None
        ly = layout_of(dd)
        lay = lay or ly
        ed = md - mr if md and mr else None
        e1 = m1 - mr if m1 and mr else None
        hid = f"{100 * (1 - ed / e1):.0f}%" if ed is not None and e1 and e1 > 0 else "-"
        o.append(f"| {z} | {ly['nbuckets'] if ly else '-'} | {fmt(md, '.1f') if not sd else sd} | "
                 f"{fmt(m1, '.1f') if not s1 else s1} | {fmt(mr, '.1f')} | {fmt(ed, '.1f')} | {fmt(e1, '.1f')} | {hid} |")
        for d, what in ((dd, "default buckets"), (d1, "one bucket")):
            q = overlap_lines(d)
            if q:
                quotes.append(f"- zero_stage {z}, {what}: `{q[-1]}`")
        tot = (ly or layout_of(d1) or {}).get("total")
        if e1 and e1 > 0 and tot:
            implied[z] = (tot, e1)
    o.append("")
    if quotes:
        o.append("The trainer's last `overlap:` line of each run (launch time of each bucket's reduction within the "
                 "forward+backward of the last micro-step):\n")
        o += quotes
        o.append("")
    tab, raw = nccl_table()
    nrc = (rd(os.path.join(OUT, "c", "nccl_bench.rc")) or "").strip()
    o.append(f"NCCL's own figure: `build/nccl_bench` at N = {N} (5 warm-up + 20 timed calls, CUDA events, "
             "busbw as NCCL's tests define it; sizes = the full buffer in elements).\n")
    if not tab:
        first = next((l for l in raw.splitlines() if l.startswith("error:")), raw.strip().splitlines()[-1] if raw.strip() else "no output")
        o.append(f"nccl_bench gave no table (exit {nrc or '?'}): `{first[:200]}`\n")
    else:
        hdr = next((l for l in raw.splitlines() if l.startswith("# nccl_bench:")), "")
        if hdr:
            o.append(f"`{hdr[2:]}`\n")
        sizes = sorted({k[2] for k in tab})
        named = {}
        if lay:
            named = {lay["bmin"]: "smallest bucket", lay["bmax"]: "largest bucket", lay["total"]: "whole model"}
        o.append("| elements | what | allreduce bf16 | reducescatter bf16 | allgather bf16 | allreduce fp32 | "
                 "reducescatter fp32 | allgather fp32 |")
        o.append("|--:|---|--:|--:|--:|--:|--:|--:|")
        for s in sizes:
            cells = [fmt(tab.get((op, dt, s), (None,))[0], ".1f") for dt in ("bf16", "fp32")
                     for op in ("allreduce", "reducescatter", "allgather")]
            # the layout pads a bucket to lcm(N, 128): match the nearest size within 0.1 %
            what = next((v for k, v in named.items() if abs(k - s) <= max(1, k // 1000)), "")
            o.append(f"| {s:,} | {what} | " + " | ".join(cells) + " |")
        o.append("\n(busbw in GB/s)\n")
        es = int(E["ES"])
        for z, (tot, e1) in sorted(implied.items()):
            near = min(sizes, key=lambda s: abs(s - tot))
            dt = "bf16" if es == 2 else "fp32"
            by = tot * es
            if z == 0:
                bus = by / (e1 / 1e3) * 2 * (N - 1) / N / 1e9
                ar = tab.get(("allreduce", dt, near))
                ref = f"nccl_bench's all-reduce of {near:,} {dt}: {ar[0]:.1f} GB/s ({ar[1] / 1e3:.2f} ms)" if ar else "-"
                o.append(f"- Trainer, zero_stage 0, one bucket: the exposed {e1:.1f} ms carry the all-reduce of "
                         f"{tot:,} {dt} gradients, so its busbw is at least {bus:.1f} GB/s; {ref}.")
            else:
                bus = 2 * by / (e1 / 1e3) * (N - 1) / N / 1e9
                rs, ag = tab.get(("reducescatter", dt, near)), tab.get(("allgather", dt, near))
                ref = (f"nccl_bench's reduce-scatter + all-gather of {near:,} {dt}: {(rs[1] + ag[1]) / 1e3:.2f} ms, "
                       f"{2 * by * (N - 1) / N / ((rs[1] + ag[1]) / 1e6) / 1e9:.1f} GB/s") if rs and ag else "-"
                o.append(f"- Trainer, zero_stage 1, one bucket: the exposed {e1:.1f} ms carry the reduce-scatter "
                         f"of the gradients and the all-gather of the parameters ({tot:,} {dt} each), so their busbw is "
                         f"at least {bus:.1f} GB/s; {ref}.")
        if implied:
            o.append("  (The exposed time also holds whatever else differs from the 1-rank step, so the trainer's "
                     "figure is a lower bound on its busbw.)")
        o.append("")


def part_d(o):
    N = int(E["NMAX"])
    es = int(E["ES"])
    o.append("## d. Memory per rank\n")
    o.append(f"{E['D_NAME']}, N = {N}, B {E['D_B']} x T {E['D_T']}, {E['D_STEPS']} steps. Rank 0: peak allocated "
             "through the trainer's tracker (log.jsonl peak_alloc_mb, MiB) and its start-up memory line, against "
             f"{2 * es + 12} bytes/param (zero_stage 0: param {es} + grad {es} + master, m, v 12) and "
             f"{2 * es} + 12/{N} = {2 * es + 12 / N:.2f} bytes/param (zero_stage 1), each plus the activations of "
             "the memory line.\n")
    o.append("| zero_stage | params | memory line: params / grads / master / m / v / activations MiB | expected MiB "
             "(bytes/param x params + activations) | peak allocated MiB | peak / expected |")
    o.append("|--:|--:|---|--:|--:|--:|")
    lines = []
    for z in (0, 1):
        d = os.path.join(OUT, "d", f"n{N}_z{z}")
        st = status(d)
        P = nparams(d)
        m, line = mem_line(d)
        s = steps_of(d)
        peak = max((r["peak_alloc_mb"] for r in s), default=None)
        if st or not P or not m:
            o.append(f"| {z} | {fmt(P)} | {st or 'no memory line'} | - | {fmt(peak, ',.1f')} | - |")
            continue
        bpp = 2 * es + (12 if z == 0 else 12 / N)
        exp = (bpp * P) / 2**20 + m["activations"]
        o.append(f"| {z} | {P:,} | {m['params']:.0f} / {m['grads']:.0f} / {m['master']:.0f} / {m['adam_m']:.0f} / "
                 f"{m['adam_v']:.0f} / {m['activations']:.0f} | {bpp:.2f} x {P / 1e6:.1f} M + "
                 f"{m['activations']:.0f} = {exp:,.0f} | {fmt(peak, ',.0f')} | "
                 f"{(peak / exp if peak else float('nan')):.3f} |")
        lines.append(f"- zero_stage {z}: `{line}`")
    o.append("")
    o += lines
    o.append("")


def part_e(o):
    N = int(E["NMAX"])
    o.append("## e. A larger model that fits only with ZeRO-1\n")
    txt = (rd(os.path.join(OUT, "e", "choice.txt")) or "").strip()
    if N < 2:
        o.append("Not run: one GPU only (ZeRO-1 saves nothing at N = 1).\n")
        return
    cj = os.path.join(OUT, "e", "choice.json")
    if not os.path.exists(cj):
        o.append("No model chosen:\n\n```\n" + txt + "\n```\n")
        return
    c = json.load(open(cj))
    g = 2**30
    o.append(f"GPU memory {gib(c['mem'])}{' (pretend, smoke)' if SMOKE else ''}; N = {N}; B 1, T {c['T']}. "
             f"Params of dN (L = N, C = 64N, 50304-row tied embedding, T-row position embedding): "
             "P = 50304 C + T C + L (12 C^2 + 13 C) + 2 C. Activations as model/gpt2.c lays them out "
             f"({c['es']}-byte elements): (16 L + 9) B T C + B T 50304 + fp32 statistics. "
             f"zero_stage 0 needs {c['b0']:g} P + activations; zero_stage 1 needs {c['b1']:.2f} P + activations "
             f"+ {gib(c['over'])} (CUDA context, NCCL, workspaces), which must stay within "
             f"{c['margin']:.0%} of the GPU. Candidates meeting both: "
             f"{', '.join('d' + str(d) for d in c['ok']) or 'none'}; chosen: **d{c['d']}** ({c['why']}).\n")
    o.append("| model | params | activations | zero_stage 0 needs | zero_stage 1 needs (+ overhead) | GPU |")
    o.append("|---|--:|--:|--:|--:|--:|")
    for r in c["near"]:
        mark = " (chosen)" if r["d"] == c["d"] else ""
        o.append(f"| d{r['d']}{mark} | {r['P'] / 1e9:.3f} B | {gib(r['acts'])} | {gib(r['z0'])} | "
                 f"{gib(r['z1'])} | {gib(c['mem'])} |")
    o.append("")
    sk = rd(os.path.join(OUT, "e", "skipped"))
    if sk:
        o.append(f"Not run: {sk.strip()}\n")
        return
    d1, d0 = os.path.join(OUT, "e", "z1"), os.path.join(OUT, "e", "z0")
    s1, s0 = status(d1), status(d0)
    st1 = steps_of(d1)
    m1, line1 = mem_line(d1)
    if s1:
        o.append(f"- zero_stage 1: {s1} — the model did NOT run with ZeRO-1.")
    else:
        peak = max(r["peak_alloc_mb"] for r in st1) if st1 else None
        o.append(f"- zero_stage 1: {len(st1)} steps, loss {st1[0]['loss']:.4f} -> {st1[-1]['loss']:.4f}, "
                 f"median {med(d1, 'ms', 1) or 0:,.0f} ms/step, rank 0 peak allocated {fmt(peak, ',.0f')} MiB "
                 f"(estimate {(c['b1'] * c['P']) / 2**20 + c['acts'] / 2**20:,.0f} MiB without the overhead), "
                 f"peak reserved {fmt(max((r['peak_reserved_mb'] for r in st1), default=None), ',.0f')} MiB.")
        if line1:
            o.append(f"  `{line1}`")
            if m1:
                o.append(f"  (activations: {m1['activations']:,.0f} MiB printed, {c['acts'] / 2**20:,.0f} MiB estimated)")
    rc0 = rc_of(d0)
    e0 = err_line(d0)
    if rc0 == "0":
        pk0 = max((r["peak_alloc_mb"] for r in steps_of(d0)), default=0)
        o.append(f"- zero_stage 0: ran to the end (exit 0), rank 0 peak allocated {pk0:,.0f} MiB "
                 f"({'more' if pk0 * 2**20 > c['mem'] else 'LESS'} than the GPU's {gib(c['mem'])})" +
                 (" — expected in the smoke test: the CPU is not limited to the pretend GPU's memory." if SMOKE
                  else " — it should NOT fit: the arithmetic above is wrong for this machine."))
    elif rc0 in (None, "budget"):
        o.append(f"- zero_stage 0: {s0}.")
    else:
        oom = e0 and ("out of memory" in e0 or "cudaMalloc" in e0)
        o.append(f"- zero_stage 0: exit {rc0}{', out of memory as expected' if oom else ' (NOT the out-of-memory error)'}: "
                 f"`{e0 or 'no error line'}`")
    o.append("")


def cmd_report():
    rev, parts = E.get("REV", "?"), (rd(os.path.join(OUT, "parts_run")) or "").split()
    from datetime import datetime
    o = [f"# Several GPUs{' — SMOKE TEST on CPU' if SMOKE else ''}\n",
         f"{datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')} | rev {rev} | {E['NGPU']} x {E['GPU_NAME']} | "
         f"N in {{{E['COUNTS']}}} | NCCL_NVLS_ENABLE=0 | command: `{E['CMDLINE'].strip()}`\n"]
    if SMOKE:
        o.append("Smoke mode: tiny models on the CPU through MPI; it tests the script (runs, parsing, tables, "
                 "tolerances), not the GPUs.\n")
    for p, fn in (("a", part_a), ("b", part_b), ("c", part_c), ("d", part_d), ("e", part_e)):
        if p in parts:
            fn(o)
            flush_fails(o)
    print("\n".join(o))


if __name__ == "__main__":
    cmd = sys.argv[1]
    {"choose": cmd_choose, "choice_fields": cmd_choice_fields, "write_model": cmd_write_model,
     "report": cmd_report}[cmd](*sys.argv[2:])
#==END==
