/* ddp/bucket.c — see bucket.h. */
#include "bucket.h"

#include <stdlib.h>
#include <string.h>

Bucket* buckets_create(const Layout* L) {
    Bucket* b = xcalloc((size_t)L->nbuckets, sizeof(Bucket));
    for (int i = 0; i < L->nbuckets; i++) {
        b[i].index = i;
        b[i].lb = &L->buckets[i];
        b[i].wslot = b[i].rslot = -1;
    }
    return b;
}

BucketGroup* bucket_groups_create(const Layout* L) {
    BucketGroup* g = xcalloc((size_t)L->ngroups, sizeof(BucketGroup));
    for (int i = 0; i < L->ngroups; i++) {
        g[i].first = L->group_first_bucket[i];
        g[i].n = L->group_first_bucket[i + 1] - L->group_first_bucket[i];
    }
    return g;
}

void bucket_begin_micro_step(Bucket* b) {
    b->pending = b->lb->nparams;
    b->launched = 0;
}

void bucket_group_begin_micro_step(BucketGroup* g) { g->pending = g->n; }

void bucket_reduce_launch(Bucket* b, Comm* comm, void* grads, DType dt, int allreduce, double t0) {
    if (allreduce) comm_allreduce(comm, grads, b->lb->len, dt, 0, &b->reduce);
    else comm_reduce_scatter(comm, grads, b->lb->len, dt, 0, &b->reduce);
    b->launch_time = wall_time_s() - t0;
    b->launched = 1;
    b->nlaunch++;
}

void bucket_gather_launch(Bucket* b, Comm* comm, void* params, DType dt) {
    comm_allgather(comm, (char*)params + b->lb->start * dtype_size(dt), b->lb->len, dt, &b->gather);
}
