/* test/test.h — the tiny test harness every C test uses.
 * CHECK prints "FAIL <file>:<line>: <message>" and counts; test_done() prints
 * "<name>: N passed, N failed" and returns the exit status. Each test binary
 * also prints its own figures (errors against the reference) so a reader
 * sees how close, not only pass/fail. */
#ifndef TEST_TEST_H
#define TEST_TEST_H
#include <stdio.h>

static int test_passed = 0, test_failed = 0;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (cond) {                                              \
            test_passed++;                                       \
        } else {                                                 \
            test_failed++;                                       \
            fprintf(stdout, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stdout, __VA_ARGS__);                        \
            fprintf(stdout, "\n");                               \
            fflush(stdout);                                      \
        }                                                        \
    } while (0)

static inline int test_done(const char* name) {
    printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
    return test_failed ? 1 : 0;
}
#endif
