/* tools/fuzz/fuzz_replay.c — a main() for the fuzz harnesses without
 * libFuzzer, so that `make test` replays the committed corpus (seeds and
 * regression inputs, test/fuzz/<harness>/) with gcc under the sanitizers:
 *   build-asan/fuzz_replay_shard test/fuzz/shard [more files or dirs]
 * Each file is one input; directories are read in sorted order. A crash or
 * a sanitizer report ends the process non-zero. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int replay_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t* buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        perror(path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

static int by_name(const struct dirent** a, const struct dirent** b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char** argv) {
    int count = 0, errors = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errors += replay_file(argv[i]) != 0;
            count++;
            continue;
        }
        struct dirent** list;
        int n = scandir(argv[i], &list, NULL, by_name);
        if (n < 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        for (int k = 0; k < n; k++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], list[k]->d_name);
            if (list[k]->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
                errors += replay_file(p) != 0;
                count++;
            }
            free(list[k]);
        }
        free(list);
    }
    printf("%s: replayed %d inputs, %d unreadable\n", argv[0], count, errors);
    return errors ? 1 : 0;
}
