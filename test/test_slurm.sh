#!/usr/bin/env bash
# test/test_slurm.sh — the trainer under a real SLURM: munged, slurmctld and slurmd started here for
# this machine alone (their configuration, key, sockets, ports, state and logs under the test's
# temporary folder), stopped at the end (exactly the processes started here). Against a run of 2
# ranks under plain mpirun (the reference):
#  - srun --mpi=pmix -n 2: the same losses; local ranks 0 and 1 of 2; one OpenMP thread per rank
#    (both may run on both CPUs: they share them); the median step time within 1.5x of the
#    reference's (both printed; for scale also srun with OMP_NUM_THREADS=2, which is what every
#    rank ran before the thread policy);
#  - tools/slurm/train.sbatch (mpirun inside, 2 tasks): the same losses and final model, one
#    thread per rank from SLURM_CPUS_PER_TASK;
#  - scancel of a running job (mpirun inside): the ranks save on SIGTERM and exit 75, the script
#    does not requeue a cancelled job; submitted again, it resumes and ends with the reference's
#    final model, byte for byte;
#  - a job past its --time (srun inside): SIGTERM at the limit, the ranks save, the script
#    requeues the job, which resumes and ends with the reference's final model;
#  - the early warning (scancel --signal=USR1 --batch, what sbatch --signal=B:USR1@N sends): the
#    script hands it to srun, the ranks save, the job is requeued and ends the same way.
# The signalled jobs' ranks are frozen (SIGSTOP) once they have trained a few steps, so that the
# signal finds them mid-run however fast the machine is; SLURM sends SIGCONT before SIGTERM (and
# the test sends it after SIGUSR1 has reached them). The time-limit job is started first and waits
# frozen while the other cases run (the node is declared with twice its CPUs so that it holds no
# one back). A requeued job waits two minutes before SLURM starts it again; the test lets it start
# 2 s after the requeue (scontrol update StartTime=now). If a daemon cannot start, the test fails with its own
# error.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
T_START=$(date +%s)
SL="$TMP/slurm"
DAEMONS=()   # pids of the daemons started here: munged slurmctld slurmd

stop_cluster() {
    if [ ${#DAEMONS[@]} -eq 3 ] && kill -0 "${DAEMONS[1]}" 2>/dev/null; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null)
        if [ -n "$jobs" ]; then
            scancel $jobs 2>/dev/null
            for _ in $(seq 1 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
        fi
    fi
    local p i
    for i in 2 1 0; do   # slurmd, slurmctld, then munged
        p=${DAEMONS[$i]:-}
        [ -n "$p" ] || continue
        kill -TERM "$p" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$p" 2>/dev/null && kill -KILL "$p"
        wait "$p" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap stop_cluster EXIT

# no_cluster WHAT: the cluster is unusable: fail with what the daemons said, end the test
no_cluster() {
    bad "SLURM: $1"
    local f
    for f in "$SL"/*.err "$SL"/*.log; do
        [ -s "$f" ] || continue
        echo "    ---- $(basename "$f") (errors, last lines):"
        { grep -i -E 'error|fatal|cannot|unable|failed' "$f" || tail -5 "$f"; } | tail -8 | sed 's/^/      /'
    done
    finish test_slurm
    exit 1
}

# ---- the cluster ----
for c in munged slurmctld slurmd sbatch srun scontrol squeue scancel sinfo; do
    command -v "$c" >/dev/null || no_cluster "$c is not installed (tools/install_deps.sh installs munge, slurmctld, slurmd and slurm-client)"
done
mkdir -p "$SL/state" "$SL/spool" "$SL/munge"
chmod 700 "$SL/munge"
# two free TCP ports in a row for slurmctld and slurmd (other tests may run a cluster too)
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORT=""
for _ in $(seq 1 50); do
    p=$(( 20000 + (RANDOM % 5000) * 2 ))
    if port_free "$p" && port_free $((p + 1)); then PORT=$p; break; fi
done
[ -n "$PORT" ] || no_cluster "no two free TCP ports in a row between 20000 and 30000"
H=$(hostname -s)
NCPU=$(nproc)
head -c 1024 /dev/urandom > "$SL/munge/munge.key"
chmod 400 "$SL/munge/munge.key"
munged -F --force --socket="$SL/munge/munge.sock" --key-file="$SL/munge/munge.key" \
    --pid-file="$SL/munge/munged.pid" --log-file="$SL/munged.log" --seed-file="$SL/munge/munged.seed" \
    </dev/null >"$SL/munged.err" 2>&1 &
DAEMONS+=($!)
for _ in $(seq 1 100); do [ -S "$SL/munge/munge.sock" ] || ! kill -0 "${DAEMONS[0]}" 2>/dev/null && break; sleep 0.1; done
[ -S "$SL/munge/munge.sock" ] || no_cluster "munged did not start"
cat > "$SL/slurm.conf" <<EOF
ClusterName=gpt2test
SlurmctldHost=$H(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SL/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$SL/state
SlurmdSpoolDir=$SL/spool
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldLogFile=$SL/slurmctld.log
SlurmdLogFile=$SL/slurmd.log
PlugStackConfig=$SL/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=30
MinJobAge=600
NodeName=$H NodeAddr=127.0.0.1 CPUs=$((2 * NCPU)) State=UNKNOWN
PartitionName=test Nodes=$H Default=YES MaxTime=INFINITE State=UP
EOF
printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' > "$SL/cgroup.conf"
: > "$SL/plugstack.conf"
export SLURM_CONF="$SL/slurm.conf"
slurmctld -D -c -f "$SLURM_CONF" </dev/null >"$SL/slurmctld.err" 2>&1 &
DAEMONS+=($!)
slurmd -D -N "$H" -f "$SLURM_CONF" </dev/null >"$SL/slurmd.err" 2>&1 &
DAEMONS+=($!)
state=""
for _ in $(seq 1 150); do
    kill -0 "${DAEMONS[1]}" 2>/dev/null || no_cluster "slurmctld exited"
    kill -0 "${DAEMONS[2]}" 2>/dev/null || no_cluster "slurmd exited"
    state=$(sinfo -h -n "$H" -o %t 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.2
done
[ "$state" = idle ] || no_cluster "node $H is not idle after 30 s (sinfo: ${state:-no answer})"
# an idle node may still fail its first step launch (seen as "task launch failed: Unspecified
# error" on a freshly started slurmd): launch a step of 2 tasks through the PMIx plugin, as the
# cases below do, before any of them; up to 5 tries, each failure shown
tries=0
until env -u OMP_NUM_THREADS timeout 60 srun --mpi=pmix -n 2 --cpus-per-task=1 -t 1 true >"$SL/probe.out" 2>&1; do
    tries=$((tries + 1))
    echo "    first step launch, try $tries failed: $(tr '\n' ' ' <"$SL/probe.out" | cut -c1-200)"
    [ $tries -lt 5 ] || no_cluster "srun --mpi=pmix -n 2 true failed 5 times"
    sleep 1
done
ok "munged, slurmctld and slurmd started (ports $PORT-$((PORT + 1)), node $H idle, a 2-task step launched after $tries failed tries) in $(( $(date +%s) - T_START )) s"

# ---- helpers ----
build/make_shard "$TMP/train.bin" 30000 1 >/dev/null
N=30
# every flag of the example script's defaults that changes the run, overridden (it passes the
# flags after its name last); --val_loss_every 0 --sample_every 0: no val data, no tokenizer
COMMON="--device cpu --input_bin $TMP/train.bin --val_loss_every 0 --sample_every 0 --model d2 --n_embd 32
  --n_head 2 --max_seq_len 32 --batch_size 2 --sequence_length 16 --total_batch_size -1 --num_iterations $N
  --learning_rate 3e-3 --lr_schedule constant --warmup_iters 0 --learning_rate_decay_frac 1
  --weight_decay 0.1 --grad_clip 0.5 --seed 7 --shuffle 1 --zero_stage 1 --checkpoint_every 10"
nsteps() { losses "$1" 2>/dev/null | wc -l; }
# median step time (ms) of a run's log, the first step left out
median_ms() {
    grep -o '"ms":[0-9.]*' "$1/log.jsonl" | cut -d: -f2 | tail -n +2 | sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
# the processes of the trainer whose command line holds DIR
trainer_pids() { local p; for p in $(pgrep -x train_gpt2); do grep -qaF -- "$1" "/proc/$p/cmdline" 2>/dev/null && echo "$p"; done; }
# freeze DIR JOB: once the run in DIR has logged 3 steps, SIGSTOP its 2 ranks; prints the steps
# logged (fails when the job ends or 120 s pass first)
freeze() {
    local end=$((SECONDS + 120)) pids
    while [ "$(nsteps "$1")" -lt 3 ]; do
        [ $SECONDS -gt $end ] || [ -z "$2" ] || [ -z "$(squeue -h -j "$2" 2>/dev/null)" ] && { echo 0; return 1; }
        sleep 0.02
    done
    pids=$(trainer_pids "$1")
    [ "$(echo "$pids" | wc -w)" = 2 ] || { echo 0; return 1; }
    kill -STOP $pids
    nsteps "$1"
}
# submit DIR LAUNCHER [sbatch options] -- [trainer flags]: tools/slurm/train.sbatch with 2 tasks
# of one CPU on one node, no GPU, output in DIR and DIR.job.out; prints the job id (sbatch's
# error on stderr, and no id, when it refuses the job)
submit() {
    local dir="$1" launcher="$2" opts=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    env -u OMP_NUM_THREADS OUT="$dir" LAUNCHER="$launcher" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        sbatch --parsable -J "$(basename "$dir")" -n 2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-task=0 -o "$dir.job.out" \
        "${opts[@]}" tools/slurm/train.sbatch $COMMON "$@"
}
job_info() { scontrol show job "$1" 2>/dev/null | tr '\n' ' '; }
# wait_job ID REGEX SECONDS: until scontrol's view of the job matches REGEX (0) or time runs out (1)
wait_job() {
    local end=$((SECONDS + $3))
    until [[ "$(job_info "$1")" =~ $2 ]]; do [ $SECONDS -gt $end ] && return 1; sleep 0.25; done
    return 0
}
# requeued ID [SECONDS]: wait until the job is pending again after a requeue, then let it start
# (2 s later: slurmd refuses a start in the second of the requeue, "Job credential revoked")
requeued() { wait_job "$1" "JobState=PENDING .*Restarts=1 " "${2:-60}" && sleep 2 && scontrol update JobId="$1" StartTime=now; }
same_model() { cmp -s "$1/model.bin" "$2/model.bin"; }
# check_job JOBOUT WHAT COMMAND...: check, and on failure show the end of the job's output
check_job() {
    local out="$1"; shift
    local before=$FAIL
    check "$@"
    [ $FAIL -eq $before ] || tail -12 "$out" 2>/dev/null | sed "s|$TMP/||g; s/^/      | /"
}
thread_line() { grep -m1 "^rank $2: " "$1" | sed 's/^rank [0-9]*: host [^,]*, //'; }

# ---- the time-limit job first: frozen, it waits for its limit while the other cases run ----
TL="$TMP/timelimit"
tl_id=$(submit "$TL" srun --time=1) || bad "time limit: sbatch refused the job"
tl_t0=$(date +%s)
if ! tl_steps=$(freeze "$TL" "$tl_id"); then
    bad "time limit: the job did not log 3 steps with 2 ranks (job $tl_id: $(tail -2 "$TL.job.out" 2>/dev/null | tr '\n' ' '))"
    grep -i -E 'error|fatal' "$SL/slurmd.log" 2>/dev/null | tail -5 | sed 's/^/      slurmd.log: /'
    tl_id=""   # nothing to wait for at the end
fi

# ---- the reference: plain mpirun, default binding, OMP_NUM_THREADS unset ----
REF="$TMP/ref"
mkdir -p "$REF"
env -u OMP_NUM_THREADS timeout 300 mpirun --allow-run-as-root -np 2 ./train_gpt2 $COMMON --output_dir "$REF" \
    --save_model "$REF/model.bin" >"$REF.out" 2>&1 || bad "the reference run under mpirun (exit $?): $(tail -2 "$REF.out")"
check "mpirun: $N losses; rank 0: $(thread_line "$REF.out" 0)" \
    eval '[ "$(nsteps "$REF")" = $N ] && [ "$(thread_line "$REF.out" 0)" = "local rank 0 of 2, 1 OpenMP thread (may run on CPU 0, not shared with another local rank)" ]'
check "mpirun: rank 1: $(thread_line "$REF.out" 1)" eval '[[ "$(thread_line "$REF.out" 1)" == "local rank 1 of 2, 1 OpenMP thread (may run on CPU "* ]]'

# ---- srun --mpi=pmix -n 2 ----
SR="$TMP/srun"
mkdir -p "$SR"
env -u OMP_NUM_THREADS timeout 300 srun --mpi=pmix -n 2 ./train_gpt2 $COMMON --output_dir "$SR" \
    --save_model "$SR/model.bin" >"$SR.out" 2>&1 || bad "srun -n 2 (exit $?): $(tail -2 "$SR.out")"
check "srun: the same $N losses as mpirun, bit for bit" same_losses "$SR" "$REF"
check "srun: the same final model" same_model "$SR" "$REF"
want="1 OpenMP thread (may run on CPUs 0-$((NCPU - 1)), shared by 2 local ranks)"
[ "$NCPU" = 1 ] && want="1 OpenMP thread (may run on CPU 0, shared by 2 local ranks)"
check "srun: rank 0: $(thread_line "$SR.out" 0)" [ "$(thread_line "$SR.out" 0)" = "local rank 0 of 2, $want" ]
check "srun: rank 1: $(thread_line "$SR.out" 1)" [ "$(thread_line "$SR.out" 1)" = "local rank 1 of 2, $want" ]
ms_ref=$(median_ms "$REF"); ms_srun=$(median_ms "$SR")
X="$TMP/srun2"
mkdir -p "$X"
OMP_NUM_THREADS=2 timeout 300 srun --mpi=pmix -n 2 ./train_gpt2 $COMMON --num_iterations 5 --checkpoint_every 0 \
    --output_dir "$X" >"$X.out" 2>&1
echo "    median step time: mpirun $ms_ref ms, srun $ms_srun ms (srun with OMP_NUM_THREADS=2, 2 ranks x 2 threads on $NCPU CPUs: $(median_ms "$X") ms)"
check "srun's step time within 1.5x of mpirun's ($ms_srun ms against $ms_ref ms)" \
    awk -v a="$ms_srun" -v b="$ms_ref" 'BEGIN { exit !(b > 0 && a <= 1.5 * b) }'

# ---- the example batch script, mpirun inside ----
SB="$TMP/sbatch"
id=$(submit "$SB" mpirun) || bad "sbatch refused the job"
wait_job "$id" "JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)" 120 || bad "sbatch: job $id did not end within 120 s"
check_job "$SB.job.out" "sbatch (mpirun inside, job $id): exit 0, the same $N losses as mpirun" \
    eval '[[ "$(job_info "$id")" == *"JobState=COMPLETED"*"ExitCode=0:0"* ]] && same_losses "$SB" "$REF"'
check "sbatch: the same final model" same_model "$SB" "$REF"
check "sbatch: rank 1: $(thread_line "$SB.job.out" 1)" [ "$(thread_line "$SB.job.out" 1)" = "local rank 1 of 2, 1 OpenMP thread (SLURM_CPUS_PER_TASK=1)" ]

# ---- scancel of a running job (mpirun inside), then submitted again ----
CA="$TMP/cancel"
id=$(submit "$CA" mpirun) || bad "scancel: sbatch refused the job"
steps=$(freeze "$CA" "$id") || bad "scancel: the job did not log 3 steps with 2 ranks"
scancel "$id"
wait_job "$id" "JobState=CANCELLED" 60 || bad "scancel: job $id not cancelled within 60 s"
sleep 1
stop=$(grep -m1 '^stopped by' "$CA.job.out")
check_job "$CA.job.out" "scancel after $steps steps: the ranks saved and exited 75: ${stop/$TMP\//}" \
    eval 'grep -q "^stopped by SIGTERM after step [0-9]*: checkpoint $CA/ckpt_[0-9]* holds it" "$CA.job.out" && grep -q "^train.sbatch: the trainer exited with status 75" "$CA.job.out"'
check "scancel: the job is not requeued" \
    eval 'grep -q "the job was cancelled: not requeued" "$CA.job.out" && [[ "$(job_info "$id")" == *"JobState=CANCELLED"*"Restarts=0"* ]]'
id=$(submit "$CA" mpirun) || bad "scancel: sbatch refused the job submitted again"
wait_job "$id" "JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)" 120 || bad "scancel: the job submitted again did not end"
check_job "$CA.job.out" "submitted again: $(grep -o 'resume: from [^:]*' "$CA.job.out" | sed "s|$TMP/||"), the final model byte for byte the uninterrupted run's" \
    eval 'grep -q "^resume: from $CA/ckpt_" "$CA.job.out" && same_model "$CA" "$REF" && same_losses "$CA" "$REF"'

# ---- the early warning: SIGUSR1 to the batch script (srun inside) ----
EW="$TMP/warning"
id=$(submit "$EW" srun) || bad "SIGUSR1: sbatch refused the job"
steps=$(freeze "$EW" "$id") || bad "SIGUSR1: the job did not log 3 steps with 2 ranks"
pids=$(trainer_pids "$EW")
scancel --batch --signal=USR1 "$id"
# the ranks are stopped: wait until the signal, handed on by the script and srun, is pending on both
usr1_pending() { local p m; for p in $pids; do m=$(awk '/^(ShdPnd|SigPnd):/ { printf "%s ", $2 }' "/proc/$p/status" 2>/dev/null);
    for v in $m; do (( 0x$v & 0x200 )) && continue 2; done; return 1; done; return 0; }
end=$((SECONDS + 10))
until usr1_pending || [ $SECONDS -gt $end ]; do sleep 0.05; done
usr1_pending || bad "SIGUSR1 did not reach the ranks within 10 s"
kill -CONT $pids
requeued "$id" || bad "SIGUSR1: job $id was not requeued within 60 s ($(job_info "$id" | grep -o 'JobState=[A-Z]*'))"
check_job "$EW.job.out" "SIGUSR1 to the batch script after $steps steps: handed on to the ranks, which saved; the running job requeued" \
    eval 'grep -q "^stopped by SIGUSR1 after step [0-9]*: checkpoint $EW/ckpt_" "$EW.job.out" && grep -q "^train.sbatch: requeued job $id" "$EW.job.out"'
wait_job "$id" "JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)" 120 || bad "SIGUSR1: the requeued job did not end"
check_job "$EW.job.out" "the requeued job: $(grep -o 'resume: from [^:]*' "$EW.job.out" | sed "s|$TMP/||"), the final model byte for byte the uninterrupted run's" \
    eval 'grep -q "^resume: from $EW/ckpt_" "$EW.job.out" && same_model "$EW" "$REF" && same_losses "$EW" "$REF"'

# ---- the time-limit job ----
if [ -z "$tl_id" ]; then
    :   # failed above
elif requeued "$tl_id" 150; then
    check_job "$TL.job.out" "--time=1: SIGTERM at the limit ($(( $(date +%s) - tl_t0 )) s after submission), frozen after $tl_steps steps: the ranks saved, the job was requeued" \
        eval 'grep -q "DUE TO TIME LIMIT" "$TL.job.out" && grep -q "^stopped by SIGTERM after step [0-9]*: checkpoint $TL/ckpt_" "$TL.job.out" && grep -q "^train.sbatch: requeued job $tl_id" "$TL.job.out"'
    wait_job "$tl_id" "JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)" 120 || bad "time limit: the requeued job did not end"
    check_job "$TL.job.out" "the requeued job: $(grep -o 'resume: from [^:]*' "$TL.job.out" | sed "s|$TMP/||"), the final model byte for byte the uninterrupted run's" \
        eval 'grep -q "^resume: from $TL/ckpt_" "$TL.job.out" && same_model "$TL" "$REF" && same_losses "$TL" "$REF"'
else
    bad "time limit: job $tl_id was not requeued within 150 s: $(job_info "$tl_id" | grep -o -E 'JobState=[A-Z]+|Reason=[^ ]+|RunTime=[^ ]+' | tr '\n' ' ')"
    tail -5 "$TL.job.out" | sed 's/^/      /'
fi

echo "    test_slurm ran $(( $(date +%s) - T_START )) s"
finish test_slurm
