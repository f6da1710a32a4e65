/* common/util.h — small shared helpers: fatal errors, checked allocation and
 * file I/O, bf16 conversion, a portable RNG, the memory tracker.
 *
 * Error policy: a user mistake or an I/O failure calls fatal(), which prints
 * one line "error: ..." to stderr and ends the process (and, once the
 * communicator has installed an abort hook, every other rank too). */
#ifndef COMMON_UTIL_H
#define COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__GNUC__)
#define NORETURN __attribute__((noreturn))
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define NORETURN
#define PRINTF_LIKE(a, b)
#endif

/* Print "error: <msg>" on one line and exit non-zero on every rank. */
NORETURN void fatal(const char* fmt, ...) PRINTF_LIKE(1, 2);
/* Installed by the communicator: called by fatal() after printing; it must not
 * return (e.g. MPI_Abort). NULL means plain exit(1). */
typedef void (*fatal_hook_fn)(void* ctx);
void util_set_fatal_hook(fatal_hook_fn fn, void* ctx);

void* xmalloc(size_t bytes); /* fatal() on failure */
void* xcalloc(size_t n, size_t size);

FILE* xfopen(const char* path, const char* mode);                       /* fatal() naming the file */
void xfread(void* p, size_t size, size_t n, FILE* f, const char* path); /* fatal() on short read: "truncated" */
void xfwrite(const void* p, size_t size, size_t n, FILE* f, const char* path);
long long file_size(FILE* f);

/* bf16 <-> fp32 (round to nearest even) on the host. */
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);

/* splitmix64-seeded xorshift64* RNG; identical on every platform. */
typedef struct {
    uint64_t s;
} Rng;
void rng_seed(Rng* r, uint64_t seed);
uint64_t rng_u64(Rng* r);
float rng_uniform(Rng* r); /* [0, 1) */
float rng_normal(Rng* r);  /* standard normal, Box-Muller */

/* Argument parsing helpers: fatal() naming the flag on malformed input. */
long long parse_int_flag(const char* flag, const char* s);
double parse_float_flag(const char* flag, const char* s);

double wall_time_s(void);

/* ---- memory tracker: every buffer of the run is allocated through one ----
 * Categories make the start-up memory lines; peak is the high-water mark of
 * the sum over categories. */
/* clang-format off */
typedef enum {
    MEM_PARAMS = 0, MEM_GRADS, MEM_MASTER, MEM_ADAM_M, MEM_ADAM_V,
    MEM_ACTIVATIONS, MEM_COMM, MEM_OTHER, MEM_NCAT
} MemCategory;
/* clang-format on */
typedef struct {
    size_t current[MEM_NCAT];
    size_t total_current;
    size_t peak; /* peak allocated through the tracker */
} MemTracker;
extern const char* mem_category_name[MEM_NCAT];
void mem_track_alloc(MemTracker* t, MemCategory c, size_t bytes);
void mem_track_free(MemTracker* t, MemCategory c, size_t bytes);
/* Peak resident set size of the process in bytes (getrusage), 0 if unknown. */
size_t mem_peak_rss(void);

#endif
