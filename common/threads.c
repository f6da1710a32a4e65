/* common/threads.c — see threads.h. */
#define _GNU_SOURCE
#include "threads.h"
#include "util.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MASK_CPUS 4096 /* CPUs a mask can name (bits of the exchanged masks) */
#define MASK_WORDS (MASK_CPUS / 64)

int threads_from_masks(const uint64_t* masks, int nranks, int words, int r, int* nsharing) {
    const uint64_t* mine = masks + (size_t)r * words;
    double share = 0.0;
    int sharing = 0;
    for (int q = 0; q < nranks; q++) {
        const uint64_t* other = masks + (size_t)q * words;
        for (int w = 0; w < words; w++)
            if (mine[w] & other[w]) {
                sharing++;
                break;
            }
    }
    for (int w = 0; w < words; w++)
        for (int k = 0; k < 64; k++) {
            uint64_t bit = (uint64_t)1 << k;
            if (!(mine[w] & bit)) continue;
            int on = 0;
            for (int q = 0; q < nranks; q++) on += (masks[(size_t)q * words + w] & bit) != 0;
            share += 1.0 / on;
        }
    if (nsharing) *nsharing = sharing;
    int n = (int)(share + 1e-9);
    return n < 1 ? 1 : n;
}

/* "0-3,8" for the set bits of mask (at most len - 1 characters, "..." when cut). */
static void mask_list(const uint64_t* mask, char* out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (int c = 0; c < MASK_CPUS; c++) {
        if (!(mask[c / 64] >> (c % 64) & 1)) continue;
        int e = c;
        while (e + 1 < MASK_CPUS && (mask[(e + 1) / 64] >> ((e + 1) % 64) & 1)) e++;
        char part[32];
        if (e == c) snprintf(part, sizeof part, "%s%d", used ? "," : "", c);
        else snprintf(part, sizeof part, "%s%d-%d", used ? "," : "", c, e);
        if (used + strlen(part) + 4 >= len) {
            snprintf(out + used, len - used, "...");
            return;
        }
        used += (size_t)snprintf(out + used, len - used, "%s", part);
        c = e;
    }
}

static int mask_count(const uint64_t* mask) {
    int n = 0;
    for (int w = 0; w < MASK_WORDS; w++) n += __builtin_popcountll(mask[w]);
    return n;
}

ThreadPolicy threads_setup(Comm* c) {
    ThreadPolicy p;
    memset(&p, 0, sizeof p);
    /* this rank's affinity mask: the CPUs it may run on */
    uint64_t mine[MASK_WORDS];
    memset(mine, 0, sizeof mine);
    cpu_set_t* set = CPU_ALLOC(MASK_CPUS);
    size_t setsize = CPU_ALLOC_SIZE(MASK_CPUS);
    if (set) CPU_ZERO_S(setsize, set);
    if (set && sched_getaffinity(0, setsize, set) == 0) {
        for (int k = 0; k < MASK_CPUS; k++)
            if (CPU_ISSET_S(k, setsize, set)) mine[k / 64] |= (uint64_t)1 << (k % 64);
    } else {
        long n = sysconf(_SC_NPROCESSORS_ONLN); /* no mask: every online CPU */
        for (long k = 0; k < n && k < MASK_CPUS; k++) mine[k / 64] |= (uint64_t)1 << (k % 64);
    }
    if (set) CPU_FREE(set);
    /* every local rank's mask (collective, whatever rule applies here) */
    uint64_t* all = xmalloc(sizeof mine * (size_t)c->local_world);
    comm_local_allgather_host(c, mine, sizeof mine, all);
    int ncpu = mask_count(mine);
    char list[64];
    mask_list(mine, list, sizeof list);

    const char* omp_env = getenv("OMP_NUM_THREADS");
    const char* slurm_cpt = getenv("SLURM_CPUS_PER_TASK");
    char* end = NULL;
    long cpt = slurm_cpt ? strtol(slurm_cpt, &end, 10) : 0;
    if (omp_env && omp_env[0]) {
#ifdef _OPENMP
        p.threads = omp_get_max_threads();
#else
        p.threads = 1;
#endif
        snprintf(p.why, sizeof p.why, "OMP_NUM_THREADS=%.64s", omp_env);
    } else if (slurm_cpt && end != slurm_cpt && *end == '\0' && cpt >= 1) {
        p.threads = cpt <= ncpu || ncpu < 1 ? (int)cpt : ncpu;
        if (p.threads == cpt) snprintf(p.why, sizeof p.why, "SLURM_CPUS_PER_TASK=%ld", cpt);
        else
            snprintf(p.why, sizeof p.why, "SLURM_CPUS_PER_TASK=%ld, but it may run on CPU%s %s only", cpt,
                     ncpu == 1 ? "" : "s", list);
    } else {
        int sharing = 1;
        p.threads = threads_from_masks(all, c->local_world, MASK_WORDS, c->local_rank, &sharing);
        snprintf(p.why, sizeof p.why, "may run on CPU%s %s, %s", ncpu == 1 ? "" : "s", list,
                 sharing <= 1 ? "not shared with another local rank" : "shared by");
        if (sharing > 1)
            snprintf(p.why + strlen(p.why), sizeof p.why - strlen(p.why), " %d local ranks", sharing);
    }
    free(all);
#ifdef _OPENMP
    omp_set_num_threads(p.threads);
#else
    p.threads = 1;
    snprintf(p.why, sizeof p.why, "built without OpenMP");
#endif
    char host[256] = "?";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    for (int r = 0; r < c->world; r++) {
        comm_barrier(c);
        if (r != c->rank) continue;
        printf("rank %d: host %s, local rank %d of %d, %d OpenMP thread%s (%s)\n", c->rank, host, c->local_rank,
               c->local_world, p.threads, p.threads == 1 ? "" : "s", p.why);
        fflush(stdout);
    }
    comm_barrier(c);
    return p;
}
