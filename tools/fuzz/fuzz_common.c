/* tools/fuzz/fuzz_common.c — see fuzz_common.h: the fatal() hook that
 * longjmps, allocation and FILE tracking through the linker's --wrap, temp
 * files. */
#define _GNU_SOURCE
#include "fuzz_common.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/util.h"

void* __real_malloc(size_t n);
void* __real_calloc(size_t n, size_t s);
void* __real_realloc(void* p, size_t n);
void __real_free(void* p);
int __real_posix_memalign(void** p, size_t align, size_t n);
FILE* __real_fopen(const char* path, const char* mode);
int __real_fclose(FILE* f);

/* ---- an open-addressing set of pointers (tombstones on removal) ---- */
#define FUZZ_TOMB ((void*)1)
typedef struct {
    void** slot;
    size_t cap, used, live; /* used counts live + tombstones */
} FuzzSet;

static FuzzSet g_allocs, g_files;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* kernels allocate scratch in OpenMP threads */
static int g_tracking;
static jmp_buf* g_jump;

static size_t fuzz_hash(const void* p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static void fuzz_set_add(FuzzSet* s, void* p);
static void fuzz_set_grow(FuzzSet* s) {
    FuzzSet old = *s;
    s->cap = old.cap ? old.cap * 2 : 1024;
    if (old.cap && old.live * 4 < old.cap) s->cap = old.cap; /* mostly tombstones: rebuild in place */
    s->slot = __real_calloc(s->cap, sizeof(void*));
    if (!s->slot) abort();
    s->used = s->live = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.slot[i] && old.slot[i] != FUZZ_TOMB) fuzz_set_add(s, old.slot[i]);
    __real_free(old.slot);
}

static void fuzz_set_add(FuzzSet* s, void* p) {
    if (!p) return;
    if ((s->used + 1) * 2 > s->cap) fuzz_set_grow(s);
    size_t i = fuzz_hash(p, s->cap);
    while (s->slot[i] && s->slot[i] != FUZZ_TOMB) i = (i + 1) & (s->cap - 1);
    if (!s->slot[i]) s->used++;
    s->slot[i] = p;
    s->live++;
}

/* 1 if p was in the set (and is removed) */
static int fuzz_set_del(FuzzSet* s, void* p) {
    if (!p || !s->cap) return 0;
    size_t i = fuzz_hash(p, s->cap);
    while (s->slot[i]) {
        if (s->slot[i] == p) {
            s->slot[i] = FUZZ_TOMB;
            s->live--;
            return 1;
        }
        i = (i + 1) & (s->cap - 1);
    }
    return 0;
}

static void fuzz_track(FuzzSet* s, void* p) {
    pthread_mutex_lock(&g_lock);
    fuzz_set_add(s, p);
    pthread_mutex_unlock(&g_lock);
}
static int fuzz_untrack(FuzzSet* s, void* p) {
    pthread_mutex_lock(&g_lock);
    int had = fuzz_set_del(s, p);
    pthread_mutex_unlock(&g_lock);
    return had;
}

/* ---- the wrapped functions: our code's calls land here ---- */
void* __wrap_malloc(size_t n) {
    void* p = __real_malloc(n);
    if (g_tracking) fuzz_track(&g_allocs, p);
    return p;
}
void* __wrap_calloc(size_t n, size_t s) {
    void* p = __real_calloc(n, s);
    if (g_tracking) fuzz_track(&g_allocs, p);
    return p;
}
void* __wrap_realloc(void* p, size_t n) {
    int had = fuzz_untrack(&g_allocs, p);
    void* q = __real_realloc(p, n);
    if (!q && n && had) fuzz_track(&g_allocs, p); /* failed: p still ours */
    else if (g_tracking || had) fuzz_track(&g_allocs, q);
    return q;
}
int __wrap_posix_memalign(void** p, size_t align, size_t n) {
    int rc = __real_posix_memalign(p, align, n);
    if (rc == 0 && g_tracking) fuzz_track(&g_allocs, *p);
    return rc;
}
void __wrap_free(void* p) {
    fuzz_untrack(&g_allocs, p);
    __real_free(p);
}
FILE* __wrap_fopen(const char* path, const char* mode) {
    FILE* f = __real_fopen(path, mode);
    if (g_tracking) fuzz_track(&g_files, f);
    return f;
}
int __wrap_fclose(FILE* f) {
    fuzz_untrack(&g_files, f);
    return __real_fclose(f);
}

static void fuzz_release_all(void) {
    for (size_t i = 0; i < g_files.cap; i++)
        if (g_files.slot[i] && g_files.slot[i] != FUZZ_TOMB) __real_fclose(g_files.slot[i]);
    for (size_t i = 0; i < g_allocs.cap; i++)
        if (g_allocs.slot[i] && g_allocs.slot[i] != FUZZ_TOMB) __real_free(g_allocs.slot[i]);
    __real_free(g_files.slot);
    __real_free(g_allocs.slot);
    memset(&g_files, 0, sizeof g_files);
    memset(&g_allocs, 0, sizeof g_allocs);
}

static void fuzz_fatal_hook(void* ctx) {
    (void)ctx;
    if (g_jump) longjmp(*g_jump, 1);
}

static FILE* g_quiet; /* fatal()'s messages go here instead of stderr (sanitizer reports still reach fd 2) */

int fuzz_run(void (*body)(void* ctx), void* ctx) {
    if (!g_quiet) {
        g_quiet = __real_fopen("/dev/null", "w");
        if (g_quiet && !getenv("FUZZ_VERBOSE")) stderr = g_quiet;
    }
    jmp_buf jb;
    volatile int cut = 0;
    util_set_fatal_hook(fuzz_fatal_hook, NULL);
    g_jump = &jb;
    g_tracking = 1;
    if (setjmp(jb) == 0) body(ctx);
    else cut = 1;
    g_tracking = 0;
    g_jump = NULL;
    util_set_fatal_hook(NULL, NULL);
    if (!cut && (g_allocs.live || g_files.live)) {
        fprintf(stdout, "fuzz: %zu allocations and %zu files still held after a normal return: leak%s\n",
                g_allocs.live, g_files.live, getenv("FUZZ_LEAK_REPORT") ? " (left for LeakSanitizer)" : "");
        fflush(stdout);
        if (!getenv("FUZZ_LEAK_REPORT")) abort();
        memset(&g_files, 0, sizeof g_files); /* forget them: LeakSanitizer reports where they came from */
        memset(&g_allocs, 0, sizeof g_allocs);
    }
    fuzz_release_all();
    return cut;
}

static char g_dir[128];

static void fuzz_cleanup(void) {
    if (!g_dir[0]) return;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stdout, "fuzz: could not remove %s\n", g_dir);
}

const char* fuzz_temp_dir(void) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/gpt2fuzz.XXXXXX");
        if (!mkdtemp(g_dir)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fuzz_cleanup);
    }
    return g_dir;
}

void fuzz_write_file(const char* name, const uint8_t* data, size_t n, char* path, size_t cap) {
    snprintf(path, cap, "%s/%s", fuzz_temp_dir(), name);
    FILE* f = __real_fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || __real_fclose(f) != 0) {
        perror(path);
        abort();
    }
}
