/* tools/fuzz/fuzz_common.h — what the fuzz harnesses share: running a parser
 * whose errors call fatal() (which must not return: the harness's hook
 * longjmps back), releasing what the parser had allocated or opened when it
 * was cut short, and per-process temporary files.
 *
 * The harnesses link with -Wl,--wrap= malloc, calloc, realloc, posix_memalign,
 * free, fopen, fclose
 * (the Makefile's FUZZ_WRAP): while fuzz_run() is active, every allocation
 * and FILE made by our code is tracked, so that after a fatal() the harness
 * frees them (the process would have exited; the fuzzer goes on), and after
 * a normal return an allocation still held is reported as a leak (abort).
 * Test-harness state (the tracking table, the jump buffer) lives in
 * fuzz_common.c's file-scope variables: a harness is one process. */
#ifndef TOOLS_FUZZ_FUZZ_COMMON_H
#define TOOLS_FUZZ_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Runs body(ctx) with fatal() turned into a return. Returns 0 when body
 * returned, 1 when it called fatal(). */
int fuzz_run(void (*body)(void* ctx), void* ctx);
/* Writes data to <this process's temp dir>/<name>; its path goes to path
 * (cap bytes). */
void fuzz_write_file(const char* name, const uint8_t* data, size_t n, char* path, size_t cap);
/* The process's temp dir (created on first use, removed at exit). */
const char* fuzz_temp_dir(void);

#endif
