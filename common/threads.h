/* common/threads.h — how many OpenMP threads each rank runs.
 *
 * Without a policy every rank starts one thread per CPU it may run on. Where
 * a launcher does not bind ranks to CPUs (srun without CPU binding, mpirun
 * --bind-to none) every rank of a host may run on every CPU, so N ranks
 * start N threads per CPU and the oversubscribed threads wait for each
 * other at every parallel region. The policy, first that applies:
 *   1. OMP_NUM_THREADS is set: the OpenMP runtime's value, untouched.
 *   2. SLURM_CPUS_PER_TASK is set (srun or sbatch -c, inherited by mpirun's
 *      ranks inside a job): that many, at most the CPUs the rank may run on.
 *   3. Otherwise the CPUs the rank may run on (its affinity mask), each
 *      shared evenly among the ranks of this host that may run on it:
 *      floor(sum over its CPUs of 1 / ranks that may run on that CPU), at
 *      least 1. Ranks bound one per core get one thread each, unbound ranks
 *      share the host's CPUs, a single process uses them all.
 * The count changes no result: the CPU kernels give the same bits at any
 * thread count (kernels/cpu.c).
 */
#ifndef COMMON_THREADS_H
#define COMMON_THREADS_H

#include <stdint.h>
#include "../comm/comm.h"

typedef struct {
    int threads;   /* OpenMP threads of this rank */
    char why[192]; /* the rule that gave it, e.g. "CPUs 0-1 shared by 2 local ranks" */
} ThreadPolicy;

/* Collective over every rank, after comm_bootstrap and before any parallel
 * work: applies the policy (omp_set_num_threads) and prints one line per
 * rank, in rank order: rank, host, local rank, threads and why. */
ThreadPolicy threads_setup(Comm* c);

/* The policy's rule 3 for one rank, exposed for the unit test: masks holds
 * nranks CPU masks of words 64-bit words each (bit k of word w = CPU
 * 64 w + k); returns the threads of rank r (at least 1) and, when nsharing
 * is not NULL, how many of the ranks (r included) may run on one of its CPUs. */
int threads_from_masks(const uint64_t* masks, int nranks, int words, int r, int* nsharing);

#endif
