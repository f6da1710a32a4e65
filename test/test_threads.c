/* test/test_threads.c — the thread policy's CPU sharing (common/threads.h,
 * rule 3: a rank's CPUs shared evenly among the local ranks that may run on
 * them), on hand-made affinity masks:
 *  - one rank: every CPU of its mask;
 *  - ranks bound one per CPU (mpirun's default binding): one each;
 *  - N unbound ranks on C CPUs (srun without CPU binding, mpirun --bind-to
 *    none): C / N each, rounded down, at least 1 (more ranks than CPUs);
 *  - uneven masks: rank A on CPUs 0-3, rank B on 2-3: A gets 2 + 1/2 + 1/2
 *    = 3, B 1/2 + 1/2 = 1;
 *  - CPUs beyond the first 64-bit word;
 *  - how many ranks share a rank's CPUs (the start-up line's "shared by"). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../common/threads.h"
#include "test.h"

#define W 2 /* 64-bit words per mask: CPUs 0..127 */

static void set_cpus(uint64_t* m, int lo, int hi) {
    for (int c = lo; c <= hi; c++) m[c / 64] |= (uint64_t)1 << (c % 64);
}

int main(void) {
    uint64_t m[8 * W];
    int sharing;

    memset(m, 0, sizeof m);
    set_cpus(m, 0, 15);
    CHECK(threads_from_masks(m, 1, W, 0, &sharing) == 16 && sharing == 1,
          "one rank on 16 CPUs: 16 threads, alone");

    memset(m, 0, sizeof m);
    for (int r = 0; r < 4; r++) set_cpus(m + r * W, r, r);
    for (int r = 0; r < 4; r++)
        CHECK(threads_from_masks(m, 4, W, r, &sharing) == 1 && sharing == 1, "bound rank %d: 1 thread, alone",
              r);

    for (int n = 1; n <= 8; n++)
        for (int c = 1; c <= 16; c++) {
            memset(m, 0, sizeof m);
            for (int r = 0; r < n; r++) set_cpus(m + r * W, 0, c - 1);
            int want = c / n < 1 ? 1 : c / n;
            for (int r = 0; r < n; r++) {
                int got = threads_from_masks(m, n, W, r, &sharing);
                CHECK(got == want && sharing == n,
                      "%d unbound ranks on %d CPUs: rank %d has %d threads (want %d), "
                      "shared by %d",
                      n, c, r, got, want, sharing);
            }
        }

    memset(m, 0, sizeof m);
    set_cpus(m, 0, 3);
    set_cpus(m + W, 2, 3);
    CHECK(threads_from_masks(m, 2, W, 0, &sharing) == 3 && sharing == 2,
          "CPUs 0-3 with another rank on 2-3: 3 threads");
    CHECK(threads_from_masks(m, 2, W, 1, &sharing) == 1 && sharing == 2,
          "CPUs 2-3 inside another rank's 0-3: 1 thread");

    memset(m, 0, sizeof m);
    set_cpus(m, 60, 67);       /* rank 0: CPUs 60-67, across the word boundary */
    set_cpus(m + W, 64, 127);  /* rank 1: 64-127 */
    set_cpus(m + 2 * W, 0, 7); /* rank 2: 0-7, no CPU in common with rank 1 */
    CHECK(threads_from_masks(m, 3, W, 0, &sharing) == 6 && sharing == 2,
          "CPUs 60-67 with 64-67 shared: 4 + 4/2 = 6");
    CHECK(threads_from_masks(m, 3, W, 1, &sharing) == 62 && sharing == 2,
          "CPUs 64-127, 4 shared: 60 + 4/2 = 62");
    CHECK(threads_from_masks(m, 3, W, 2, &sharing) == 8 && sharing == 1, "CPUs 0-7, none shared: 8");

    memset(m, 0, sizeof m); /* an empty mask (cannot happen): still 1 thread */
    CHECK(threads_from_masks(m, 1, W, 0, NULL) == 1, "no CPU: 1 thread");
    return test_done("test_threads");
}
