/* common/util.c — see util.h. */
#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static fatal_hook_fn g_fatal_hook = NULL; /* the one process-wide hook: set by comm */
static void* g_fatal_ctx = NULL;

void util_set_fatal_hook(fatal_hook_fn fn, void* ctx) {
    g_fatal_hook = fn;
    g_fatal_ctx = ctx;
}

void fatal(const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: %s\n", msg);
    fflush(stderr);
    fflush(stdout);
    if (g_fatal_hook) g_fatal_hook(g_fatal_ctx);
    exit(1);
}

void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) fatal("out of host memory allocating %zu bytes", bytes);
    return p;
}

void* xcalloc(size_t n, size_t size) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fatal("out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

FILE* xfopen(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (!f) fatal("cannot open %s: %s", path, strerror(errno));
    return f;
}

void xfread(void* p, size_t size, size_t n, FILE* f, const char* path) {
    if (n == 0) return;
    size_t got = fread(p, size, n, f);
    if (got != n) {
        if (ferror(f)) fatal("%s: read error: %s", path, strerror(errno));
        fatal("%s: file is truncated (wanted %zu more bytes, got %zu)", path, size * n, size * got);
    }
}

void xfwrite(const void* p, size_t size, size_t n, FILE* f, const char* path) {
    if (n == 0) return;
    if (fwrite(p, size, n, f) != n) fatal("%s: write failed: %s", path, strerror(errno));
}

long long file_size(FILE* f) {
    long cur = ftell(f);
    if (fseek(f, 0, SEEK_END) != 0) return -1;
    long end = ftell(f);
    fseek(f, cur, SEEK_SET);
    return (long long)end;
}

uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(Rng* r, uint64_t seed) {
    uint64_t x = seed;
    r->s = splitmix64(&x);
    if (r->s == 0) r->s = 0x2545f4914f6cdd1dull;
}

uint64_t rng_u64(Rng* r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}

float rng_uniform(Rng* r) { return (float)(rng_u64(r) >> 40) / 16777216.0f; }

float rng_normal(Rng* r) {
    /* Box-Muller with one value per call: simple and platform independent. */
    float u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return (float)(sqrt(-2.0 * log((double)u1)) * cos(6.283185307179586 * (double)u2));
}

long long parse_int_flag(const char* flag, const char* s) {
    if (!s || !*s) fatal("flag %s needs an integer value", flag);
    char* end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0') fatal("flag %s: '%s' is not an integer", flag, s);
    return v;
}

double parse_float_flag(const char* flag, const char* s) {
    if (!s || !*s) fatal("flag %s needs a number", flag);
    char* end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || v != v) fatal("flag %s: '%s' is not a number", flag, s);
    return v;
}

double wall_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char* mem_category_name[MEM_NCAT] = {
    "params", "grads", "master", "adam_m", "adam_v", "activations", "comm", "other"};

void mem_track_alloc(MemTracker* t, MemCategory c, size_t bytes) {
    t->current[c] += bytes;
    t->total_current += bytes;
    if (t->total_current > t->peak) t->peak = t->total_current;
}

void mem_track_free(MemTracker* t, MemCategory c, size_t bytes) {
    t->current[c] -= bytes;
    t->total_current -= bytes;
}

size_t mem_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
}
