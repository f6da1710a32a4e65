/* test/test_ckpt.c — unit tests of checkpoint/ (ckpt_format.c, ckpt_file.c,
 * checkpoint.c's log trim), no MPI:
 *  - CRC-32: the standard check value, and a bit-by-bit reference over
 *    random data in random chunks;
 *  - state.bin header: encode -> decode round trip, the encoding against the
 *    format's bytes written out by hand, rejection of corrupt fields; DONE:
 *    the exact format, format -> parse round trip, rejection of near misses;
 *  - the header's field table: slots in range and unique, each role's
 *    member where it must be; every field with a bounded range refuses the
 *    values just outside it; every must-match setting fails the resume check
 *    with its message when it differs, every may-change setting is printed;
 *  - canonical order: for world sizes 1..6, zero_stage 0 and 1, one bucket
 *    and many tiny buckets, every rank writes its owned ranges into one file
 *    (as the trainer does); the file must equal a reference built
 *    independently through the model's own llm.c-order tensor placement
 *    (gpt2_params_from_host), and every other configuration must read back
 *    exactly the state its optimizer would hold (optimizer_init's copy);
 *  - ckpt_verify on a directory: a good one passes; a flipped byte, a
 *    truncated file, a missing file, another model shape each fail, naming
 *    the problem;
 *  - log.jsonl trimming on resume. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../checkpoint/checkpoint.h"
#include "../train/runlog.h"
#include "../common/util.h"
#include "test.h"

static char g_dir[256];

static uint32_t ref_crc32(const unsigned char* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static void test_crc(void) {
    CHECK(ckpt_crc32(0, "123456789", 9) == 0xCBF43926u, "crc32('123456789') = %08x, expected cbf43926",
          ckpt_crc32(0, "123456789", 9));
    CHECK(ckpt_crc32(0, "", 0) == 0, "crc32 of nothing is 0");
    Rng r;
    rng_seed(&r, 5);
    unsigned char buf[3000];
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        size_t n = (size_t)(rng_u64(&r) % sizeof buf);
        for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)rng_u64(&r);
        uint32_t want = ref_crc32(buf, n), c = 0;
        size_t off = 0;
        while (off < n) { /* random chunking: the running value must chain */
            size_t k = 1 + (size_t)(rng_u64(&r) % 97);
            if (k > n - off) k = n - off;
            c = ckpt_crc32(c, buf + off, k);
            off += k;
        }
        if (c != want || ckpt_crc32(0, buf, n) != want) bad++;
    }
    CHECK(bad == 0, "crc32: %d of 200 random buffers disagree with the bitwise reference", bad);
    printf("crc32: check value and 200 random chunked buffers against the bitwise reference\n");
}

static GPT2Config tiny_cfg(void) {
    GPT2Config c = {.max_seq_len = 16,
                    .vocab_size = 60,
                    .padded_vocab_size = 64,
                    .num_layers = 2,
                    .num_heads = 2,
                    .channels = 8};
    return c;
}

static CkptHeader sample_header(const GPT2Config* cfg, size_t P) {
    CkptHeader h;
    memset(&h, 0, sizeof h);
    h.version = CKPT_VERSION;
    h.num_parameters = P;
    h.cfg = *cfg;
    h.progress = (CkptProgress){.step = 17, .next_row = 1234567890123ull, .bad_streak = 2};
    h.opt_t = 15;
    h.dtype = 1;
    h.hp = (CkptHparams){
        .sequence_length = 16,
        .seed = -42,
        .shuffle = 1,
        .train_rows = 999,
        .total_batch_size = 1LL << 40,
        .batch_size = 3,
        .world = 5,
        .zero_stage = 1,
        .num_iterations = 100,
        .lr_schedule = 2,
        .warmup_iters = 7,
        .learning_rate = 3e-4f,
        .lr_decay_frac = 0.1f,
        .weight_decay = 0.1f,
        .beta1 = 0.9f,
        .beta2 = 0.95f,
        .eps = 1e-8f,
        .grad_clip = 1.0f};
    return h;
}

static size_t num_params(const GPT2Config* cfg) {
    GPT2 m;
    memset(&m, 0, sizeof m);
    int n;
    free(gpt2_describe(&m, cfg, &n));
    free(m.tensors);
    free(m.layout_to_tensor);
    return m.num_parameters;
}

/* The on-disk bytes of sample_header, slot by slot, written out here by hand
 * from the format (docs/CHECKPOINTS.md): signed values as int64 two's
 * complement, floats as their IEEE bits in the low 32 bits, slots 33..127 zero. */
static void test_header_bytes(void) {
    GPT2Config cfg = tiny_cfg();
    size_t P = num_params(&cfg);
    CkptHeader h = sample_header(&cfg, P);
    const float fl[7] = {3e-4f, 0.1f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    uint64_t slots[128] = {
        20261203,   1,
        1024,       P, /* magic, version, header bytes, P */
        17,         1234567890123ull,
        15,         2, /* step, next row, AdamW t, bad streak */
        16,         60,
        64,         2,
        2,          8, /* maxT, V, padded V, L, NH, C */
        16,         (uint64_t)(int64_t)-42,
        1,          999, /* T, seed, shuffle, training rows */
        1ull << 40, 3,
        5,          1,
        100,        2,
        7, /* total batch, B, world, zero, iters, schedule, warmup */
    };
    for (int i = 0; i < 7; i++) {
        uint32_t u;
        memcpy(&u, &fl[i], 4);
        slots[25 + i] = u;
    }
    slots[32] = 1; /* dtype */
    unsigned char want[CKPT_HEADER_BYTES], got[CKPT_HEADER_BYTES];
    for (int s = 0; s < 128; s++)
        for (int b = 0; b < 8; b++) want[s * 8 + b] = (unsigned char)(slots[s] >> (8 * b));
    ckpt_header_encode(&h, got);
    int first = -1;
    for (int i = 0; i < CKPT_HEADER_BYTES && first < 0; i++)
        if (got[i] != want[i]) first = i;
    CHECK(first < 0, "header bytes differ from the format first in slot %d", first / 8);
    printf("header: the encoding equals the format's bytes, slot by slot\n");
}

static void test_header(void) {
    GPT2Config cfg = tiny_cfg();
    size_t P = num_params(&cfg);
    CkptHeader h = sample_header(&cfg, P), d;
    unsigned char buf[CKPT_HEADER_BYTES], bad[CKPT_HEADER_BYTES];
    char err[512];
    ckpt_header_encode(&h, buf);
    int rc = ckpt_header_decode(buf, sizeof buf, &d, err, sizeof err);
    CHECK(rc == 0, "decode of an encoded header failed: %s", err);
    CHECK(memcmp(&h.cfg, &d.cfg, sizeof h.cfg) == 0 && d.num_parameters == P, "header: shape round trip");
    CHECK(d.progress.step == 17 && d.progress.next_row == 1234567890123ull && d.progress.bad_streak == 2 &&
              d.opt_t == 15 && d.dtype == 1,
          "header: progress round trip");
    CHECK(memcmp(&h.hp, &d.hp, sizeof h.hp) == 0, "header: hyperparameters round trip (seed %d, lr %g)",
          d.hp.seed, d.hp.learning_rate);
    /* corruptions: each must be refused with a reason */
    struct {
        int slot;
        uint64_t val;
        const char* what;
    } cases[] = {
        {0, 12345, "magic"},
        {1, 2, "version"},
        {2, 512, "header size"},
        {3, 1000, "parameter count"},
        {4, (uint64_t)-1, "negative step"},
        {6, 18, "AdamW t above the step"},
        {8, 0, "maxT 0"},
        {10, 59, "padded vocab below vocab"},
        {12, 3, "heads not dividing C"},
        {14, 17, "T above maxT"},
        {16, 2, "shuffle 2"},
        {17, 0, "no training rows"},
        {18, 0, "total batch 0"},
        {21, 5, "zero_stage 5"},
        {23, 9, "unknown schedule"},
        {25, 0x7fc00000u, "NaN learning rate"},
        {30, 0x7f800000u, "Inf eps"},
        {11, 1u << 20, "absurd layer count"}};
    int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < nc; i++) {
        memcpy(bad, buf, sizeof buf);
        for (int b = 0; b < 8; b++) bad[cases[i].slot * 8 + b] = (unsigned char)(cases[i].val >> (8 * b));
        err[0] = '\0';
        int r = ckpt_header_decode(bad, sizeof bad, &d, err, sizeof err);
        CHECK(r != 0 && err[0], "header with a bad %s was accepted", cases[i].what);
    }
    CHECK(ckpt_header_decode(buf, 1000, &d, err, sizeof err) != 0 && strstr(err, "truncated"),
          "a short header is refused as truncated: %s", err);
    printf("header: round trip, %d corruptions refused\n", nc);

    const char* good =
        "gpt2-checkpoint v1\nstep 12\nmodel.bin 6545920 crc32 58724e6e\nstate.bin 19635712 crc32 ad0793a6\n";
    CkptDone dn;
    rc = ckpt_done_parse(good, strlen(good), &dn, err, sizeof err);
    CHECK(rc == 0 && dn.step == 12 && dn.model_bytes == 6545920 && dn.model_crc == 0x58724e6eu &&
              dn.state_bytes == 19635712 && dn.state_crc == 0xad0793a6u,
          "DONE: parse of a good marker (%s)", err);
    char again[256];
    int len = ckpt_done_format(&dn, again, sizeof again);
    CHECK(len == (int)strlen(good) && strcmp(again, good) == 0, "DONE: format of the parsed marker: '%s'",
          again);
    const char* near[] = {
        "gpt2-checkpoint v1\nstep 12\nmodel.bin 6545920 crc32 58724e6e\nstate.bin 19635712 crc32 ad0793a6",
        "gpt2-checkpoint v1\nstep 12\nmodel.bin 6545920 crc32 58724e6e\nstate.bin 19635712 crc32 ad0793a6\n\n",
        "gpt2-checkpoint v2\nstep 12\nmodel.bin 6545920 crc32 58724e6e\nstate.bin 19635712 crc32 ad0793a6\n",
        "gpt2-checkpoint v1\nstep -12\nmodel.bin 6545920 crc32 58724e6e\nstate.bin 19635712 crc32 ad0793a6\n",
        "gpt2-checkpoint v1\nstep 12\nmodel.bin 6545920 crc32 58724E6E\nstate.bin 19635712 crc32 ad0793a6\n",
        "gpt2-checkpoint v1\nstep 12\nmodel.bin 6545920 crc32 58724e6\nstate.bin 19635712 crc32 ad0793a6\n",
        "gpt2-checkpoint v1\nstep 99999999999\nmodel.bin 1 crc32 58724e6e\nstate.bin 1 crc32 ad0793a6\n",
        "gpt2-checkpoint v1\nstep 12\nstate.bin 19635712 crc32 ad0793a6\nmodel.bin 6545920 crc32 58724e6e\n",
        "",
        "gpt2-checkpoint v1\n"};
    int nn = (int)(sizeof near / sizeof near[0]);
    for (int i = 0; i < nn; i++)
        CHECK(ckpt_done_parse(near[i], strlen(near[i]), &dn, err, sizeof err) != 0,
              "DONE near miss %d accepted", i);
    printf("DONE: good marker parsed and formatted back, %d near misses refused\n", nn);
}

/* ---- the header's field table ---- */

/* Changes a field's value in h (to another value of its type). */
static void bump(const CkptField* f, CkptHeader* h) {
    void* p = (char*)h + f->off;
    switch (f->type) {
    case CKPT_I32: *(int*)p += 1; break;
    case CKPT_I64: *(long long*)p += 1; break;
    case CKPT_U64: *(uint64_t*)p += 1; break;
    case CKPT_F32: *(float*)p = 2.0f * *(float*)p + 1.0f; break;
    }
}

static int inside(size_t off, size_t base, size_t size) { return off >= base && off < base + size; }

static void test_fields(void) {
    GPT2Config cfg = tiny_cfg();
    size_t P = num_params(&cfg);
    CkptHeader h = sample_header(&cfg, P), d;
    unsigned char buf[CKPT_HEADER_BYTES], bad[CKPT_HEADER_BYTES];
    char err[512], notes[4096];
    ckpt_header_encode(&h, buf);
    /* the table itself */
    int used[CKPT_HEADER_SLOTS] = {0}, table_ok = 1;
    for (int i = 0; i < ckpt_nfields; i++) {
        const CkptField* f = &ckpt_fields[i];
        int ok = f->slot >= CKPT_FIRST_FIELD_SLOT && f->slot < CKPT_HEADER_SLOTS && !used[f->slot]++;
        if (f->role == CKPT_SHAPE) ok &= inside(f->off, offsetof(CkptHeader, cfg), sizeof(GPT2Config));
        if (f->role == CKPT_MUST_MATCH || f->role == CKPT_MAY_CHANGE)
            ok &= inside(f->off, offsetof(CkptHeader, hp), sizeof(CkptHparams));
        if (f->role == CKPT_MUST_MATCH) { /* two %s, no other conversion */
            int conv = 0, strs = 0;
            for (const char* c = f->mismatch ? f->mismatch : ""; *c; c++)
                if (*c == '%') {
                    conv++;
                    strs += c[1] == 's';
                    c++;
                }
            ok &= f->mismatch && conv == 2 && strs == 2;
        } else {
            ok &= f->mismatch == NULL;
        }
        CHECK(ok, "field table: row %d (%s, slot %d) breaks the table's rules", i, f->name, f->slot);
        table_ok &= ok;
        /* the slot holds the member's value */
        uint64_t v = 0;
        for (int b = 0; b < 8; b++) v |= (uint64_t)buf[f->slot * 8 + b] << (8 * b);
        CHECK(v == ckpt_field_bits(f, &h), "field %s: slot %d does not hold its value", f->name, f->slot);
    }
    /* ranges: the values just outside each bounded range are refused */
    int refused = 0, probes = 0;
    for (int i = 0; i < ckpt_nfields; i++) {
        const CkptField* f = &ckpt_fields[i];
        uint64_t outside[3];
        int no = 0;
        if (f->type == CKPT_F32) {
            outside[no++] = 0x7fc00000u; /* NaN */
            outside[no++] = 0xff800000u; /* -Inf */
        } else {
            long long min = f->type == CKPT_U64 ? 0 : -0x7fffffffffffffffLL - 1; /* of the slot's type */
            if (f->lo > min) outside[no++] = (uint64_t)(f->lo - 1);
            if (f->hi != CKPT_NO_MAX) outside[no++] = (uint64_t)(f->hi + 1);
        }
        for (int k = 0; k < no; k++) {
            memcpy(bad, buf, sizeof buf);
            for (int b = 0; b < 8; b++) bad[f->slot * 8 + b] = (unsigned char)(outside[k] >> (8 * b));
            err[0] = '\0';
            int r = ckpt_header_decode(bad, sizeof bad, &d, err, sizeof err);
            probes++;
            refused += r != 0 && err[0];
            CHECK(r != 0 && err[0], "field %s: the value %lld outside [%lld, %lld] was accepted", f->name,
                  (long long)outside[k], f->lo, f->hi);
        }
    }
    /* resume: every must-match setting refuses a change, every may-change one prints it */
    CkptHparams now = h.hp;
    int rc = ckpt_header_check_resume(&h, &now, notes, sizeof notes, err, sizeof err);
    CHECK(rc == 0 && notes[0] == '\0', "resume with the same settings: rc %d, notes '%s'", rc, notes);
    int matched = 0, noted = 0;
    for (int i = 0; i < ckpt_nfields; i++) {
        const CkptField* f = &ckpt_fields[i];
        if (f->role != CKPT_MUST_MATCH && f->role != CKPT_MAY_CHANGE) continue;
        CkptHeader run = h;
        bump(f, &run);
        char want[256], a[64], b[64];
        ckpt_field_str(f, &run, a, sizeof a);
        ckpt_field_str(f, &h, b, sizeof b);
        err[0] = notes[0] = '\0';
        rc = ckpt_header_check_resume(&h, &run.hp, notes, sizeof notes, err, sizeof err);
        if (f->role == CKPT_MUST_MATCH) {
            snprintf(want, sizeof want, f->mismatch, a, b);
            matched += rc != 0 && strcmp(err, want) == 0;
            CHECK(rc != 0 && strcmp(err, want) == 0, "must-match %s: rc %d, '%s'", f->name, rc, err);
        } else {
            snprintf(want, sizeof want, "resume: %s changes from %s (checkpoint) to %s\n", f->name, b, a);
            noted += rc == 0 && strcmp(notes, want) == 0;
            CHECK(rc == 0 && strcmp(notes, want) == 0, "may-change %s: rc %d, notes '%s'", f->name, rc, notes);
        }
    }
    /* two of them against text written out here */
    now = h.hp;
    now.seed = -41;
    rc = ckpt_header_check_resume(&h, &now, notes, sizeof notes, err, sizeof err);
    CHECK(rc != 0 &&
              strcmp(err, "--seed -41 differs from the checkpoint's -42 (the data order and the rounding "
                          "depend on it)") == 0,
          "seed mismatch: '%s'", err);
    now = h.hp;
    now.world = 2;
    now.learning_rate = 6e-4f;
    rc = ckpt_header_check_resume(&h, &now, notes, sizeof notes, err, sizeof err);
    CHECK(rc == 0 && strcmp(notes, "resume: ranks changes from 5 (checkpoint) to 2\n"
                                   "resume: --learning_rate changes from 0.0003 (checkpoint) to 0.0006\n") == 0,
          "notes: '%s'", notes);
    now = h.hp;
    now.num_iterations = 16;
    rc = ckpt_header_check_resume(&h, &now, NULL, 0, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "--num_iterations 16 is below the checkpoint's step 17"),
          "num_iterations: '%s'", err);
    printf(
        "field table: %d fields, slots unique (%s); %d/%d out-of-range values refused; %d must-match settings "
        "refused, %d may-change settings printed\n",
        ckpt_nfields, table_ok ? "ok" : "BAD", refused, probes, matched, noted);
}

/* ---- canonical order across world sizes, stages and bucket sizes ---- */

typedef struct {
    int world, zero, small_buckets;
    Layout L;
    GPT2 m;
    LayoutParamSpec* specs;
    Optimizer* opt;   /* [world] */
    Checkpointer* ck; /* [world]: spans only (ckpt_init does no I/O) */
} Config;

static void config_make(Config* c, Backend* be, const GPT2Config* cfg, const float* ref, int world, int zero,
                        int small) {
    memset(c, 0, sizeof *c);
    c->world = world;
    c->zero = zero;
    c->small_buckets = small;
    int ns;
    c->specs = gpt2_describe(&c->m, cfg, &ns);
    char err[256];
    if (layout_build(&c->L, c->specs, ns, small ? 100 : 100000000, 1, world, 64, err, sizeof err) != 0)
        fatal("layout: %s", err);
    gpt2_bind(&c->m, be, &c->L);
    gpt2_params_from_host(&c->m, ref); /* the model's own llm.c-order placement */
    c->opt = xcalloc((size_t)world, sizeof(Optimizer));
    c->ck = xcalloc((size_t)world, sizeof(Checkpointer));
    CkptHparams hp;
    memset(&hp, 0, sizeof hp);
    for (int r = 0; r < world; r++) {
        int n;
        OptPiece* p = layout_opt_pieces(&c->L, zero ? r : -1, &n);
        /* master <- params of its pieces */
        optimizer_init(&c->opt[r], be, &(OptBuffer){.params = c->m.params, .pieces = p, .npieces = n}, 1);
        Comm comm;
        memset(&comm, 0, sizeof comm);
        comm.rank = r;
        comm.world = world;
        CkptChunk ch = {.model = &c->m, .layout = &c->L, .dp_rank = r, .writer = r == 0};
        ckpt_init(&c->ck[r], &comm, &ch, 1, &c->opt[r], "", 0, 0, &hp);
        c->ck[r].comm = NULL;
    }
}

static void config_free(Config* c) {
    for (int r = 0; r < c->world; r++) {
        ckpt_free(&c->ck[r]);
        optimizer_free(&c->opt[r]);
    }
    free(c->ck);
    free(c->opt);
    gpt2_free(&c->m);
    layout_free(&c->L);
    free(c->specs);
}

static void test_canonical(void) {
    Backend* be = backend_cpu_create();
    GPT2Config cfg = tiny_cfg();
    size_t P = num_params(&cfg);
    /* reference values, canonical index i: master 1000 + i, m = 2 x, v = 3 x (all exact in fp32) */
    float* ref = xmalloc(P * sizeof(float));
    for (size_t i = 0; i < P; i++) ref[i] = 1000.0f + (float)i;
    unsigned char* want = xmalloc(CKPT_HEADER_BYTES + 12 * P);
    CkptHeader h = sample_header(&cfg, P);
    ckpt_header_encode(&h, want);
    float* arr = (float*)(want + CKPT_HEADER_BYTES);
    for (size_t i = 0; i < P; i++) {
        arr[i] = ref[i];
        arr[P + i] = 2.0f * ref[i];
        arr[2 * P + i] = 3.0f * ref[i];
    }
    char path[512], err[512];
    int files_ok = 0, files = 0, reads_ok = 0, reads = 0, tiles_ok = 0;
    float* got = xmalloc(P * sizeof(float));
    for (int world = 1; world <= 6; world++)
        for (int zero = 0; zero <= 1; zero++)
            for (int small = 0; small <= 1; small++) {
                Config A;
                config_make(&A, be, &cfg, ref, world, zero, small);
                /* the held spans map the optimizer's state exactly onto the reference */
                int held_ok = 1;
                for (int r = 0; r < world; r++) {
                    Optimizer* o = &A.opt[r];
                    for (int s = 0; s < A.ck[r].nheld; s++) {
                        const CkptSpan* sp = &A.ck[r].held[s];
                        if (sp->canon_off + sp->len > P) {
                            held_ok = 0;
                            continue;
                        }
                        for (size_t i = 0; i < sp->len; i++)
                            if (o->master[sp->state_off + i] != ref[sp->canon_off + i]) held_ok = 0;
                    }
                    for (size_t i = 0; i < o->nstate; i++) {
                        o->m[i] = 2.0f * o->master[i];
                        o->v[i] = 3.0f * o->master[i];
                    }
                }
                CHECK(held_ok, "world %d zero %d small %d: state ranges disagree with the model's placement",
                      world, zero, small);
                /* owned ranges tile [0, P) once */
                int* cover = xcalloc(P, sizeof(int));
                for (int r = 0; r < world; r++)
                    for (int s = 0; s < A.ck[r].nown; s++)
                        for (size_t i = 0; i < A.ck[r].own[s].len; i++) cover[A.ck[r].own[s].canon_off + i]++;
                int tile = 1;
                for (size_t i = 0; i < P; i++) tile &= cover[i] == 1;
                free(cover);
                tiles_ok += tile;
                CHECK(tile, "world %d zero %d small %d: owned ranges do not tile the parameters once", world,
                      zero, small);
                /* every rank writes its owned ranges into one file (rank 0 the header) */
                snprintf(path, sizeof path, "%s/state_w%d_z%d_s%d.bin", g_dir, world, zero, small);
                unlink(path);
                int wrc = 0;
                for (int r = world - 1; r >= 0; r--) /* any order: the offsets are absolute */
                    wrc |= ckpt_write_state(path, be, P, r == 0 ? want : NULL, A.ck[r].own, A.ck[r].nown,
                                            A.opt[r].master, A.opt[r].m, A.opt[r].v, err, sizeof err);
                FILE* f = fopen(path, "rb");
                unsigned char* file = xmalloc(CKPT_HEADER_BYTES + 12 * P + 1);
                size_t n = f ? fread(file, 1, CKPT_HEADER_BYTES + 12 * P + 1, f) : 0;
                if (f) fclose(f);
                int same = wrc == 0 && n == CKPT_HEADER_BYTES + 12 * P && memcmp(file, want, n) == 0;
                free(file);
                files++;
                files_ok += same;
                CHECK(same,
                      "world %d zero %d small %d: state.bin differs from the canonical reference (%zu bytes)",
                      world, zero, small, n);
                /* read back at other configurations */
                for (int w2 = 1; w2 <= 6; w2 += 2)
                    for (int z2 = 0; z2 <= 1; z2++) {
                        Config B;
                        config_make(&B, be, &cfg, ref, w2, z2, !small);
                        int ok = 1;
                        for (int r = 0; r < w2; r++) {
                            Optimizer* o = &B.opt[r];
                            float* m0 = xmalloc(o->nstate * sizeof(float) + 1);
                            memcpy(m0, o->master, o->nstate * sizeof(float)); /* what init derived */
                            for (size_t i = 0; i < o->nstate; i++) o->master[i] = o->m[i] = o->v[i] = -1.0f;
                            if (ckpt_read_state(path, be, P, B.ck[r].held, B.ck[r].nheld, o->master, o->m, o->v,
                                                err, sizeof err) != 0) {
                                ok = 0;
                                free(m0);
                                continue;
                            }
                            for (size_t i = 0; i < o->nstate; i++)
                                if (o->master[i] != m0[i] || o->m[i] != 2.0f * m0[i] || o->v[i] != 3.0f * m0[i])
                                    ok = 0;
                            free(m0);
                        }
                        reads++;
                        reads_ok += ok;
                        CHECK(ok, "saved at world %d zero %d, read at world %d zero %d: state differs", world,
                              zero, w2, z2);
                        config_free(&B);
                    }
                unlink(path);
                config_free(&A);
            }
    (void)got;
    free(got);
    printf("canonical order: %d/%d configurations tile the parameters, %d/%d files equal the reference, "
           "%d/%d cross-configuration reads exact\n",
           tiles_ok, files, files_ok, files, reads_ok, reads);
    free(ref);
    free(want);
    be->destroy(be);
}

/* ---- ckpt_verify on a checkpoint directory ---- */

static void write_file(const char* path, const void* p, size_t n) {
    FILE* f = xfopen(path, "wb");
    xfwrite(p, 1, n, f, path);
    fclose(f);
}
static void write_done(const char* dir) {
    char mp[512], sp[512], dp[512], err[256], text[512];
    uint32_t mc = 0, sc = 0;
    long long mb = 0, sb = 0;
    snprintf(mp, sizeof mp, "%s/model.bin", dir);
    snprintf(sp, sizeof sp, "%s/state.bin", dir);
    snprintf(dp, sizeof dp, "%s/DONE", dir);
    ckpt_crc32_file(mp, &mc, &mb, err, sizeof err);
    ckpt_crc32_file(sp, &sc, &sb, err, sizeof err);
    int n = snprintf(text, sizeof text,
                     "gpt2-checkpoint v1\nstep 17\nmodel.bin %lld crc32 %08x\nstate.bin %lld crc32 %08x\n", mb,
                     mc, sb, sc);
    write_file(dp, text, (size_t)n);
}

static void make_ckpt(const char* dir, const GPT2Config* cfg, size_t P) {
    mkdir(dir, 0755);
    char p[512];
    int32_t mh[GPT2_HEADER_INTS];
    gpt2_header_encode(cfg, 3, mh);
    unsigned char* model = xcalloc(sizeof mh + 4 * P, 1);
    memcpy(model, mh, sizeof mh);
    snprintf(p, sizeof p, "%s/model.bin", dir);
    write_file(p, model, sizeof mh + 4 * P);
    free(model);
    unsigned char* state = xcalloc(CKPT_HEADER_BYTES + 12 * P, 1);
    CkptHeader h = sample_header(cfg, P);
    ckpt_header_encode(&h, state);
    snprintf(p, sizeof p, "%s/state.bin", dir);
    write_file(p, state, CKPT_HEADER_BYTES + 12 * P);
    free(state);
    write_done(dir);
}

static int verify_fails(const char* dir, const GPT2Config* cfg, size_t P, const char* pattern,
                        const char* what) {
    CkptHeader h;
    char err[1024] = "";
    int rc = ckpt_verify(dir, cfg, P, &h, err, sizeof err);
    int ok = rc != 0 && strstr(err, pattern) != NULL;
    printf("  %-34s -> %s\n", what, rc ? err : "(accepted)");
    CHECK(ok, "%s: expected an error containing '%s', got '%s'", what, pattern, rc ? err : "(accepted)");
    return ok;
}

static void test_verify(void) {
    GPT2Config cfg = tiny_cfg();
    size_t P = num_params(&cfg);
    char dir[512], p[600], cmd[1200];
    CkptHeader h;
    char err[1024];
    snprintf(dir, sizeof dir, "%s/ckpt", g_dir);
    make_ckpt(dir, &cfg, P);
    int rc = ckpt_verify(dir, &cfg, P, &h, err, sizeof err);
    CHECK(rc == 0 && h.progress.step == 17, "a good checkpoint verifies (%s)", rc ? err : "ok");
    printf("ckpt_verify:\n");
    /* flip one byte in the state arrays */
    snprintf(p, sizeof p, "%s/state.bin", dir);
    FILE* f = xfopen(p, "r+b");
    fseek(f, CKPT_HEADER_BYTES + 40, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    verify_fails(dir, &cfg, P, "checksum mismatch", "a flipped byte in state.bin");
    make_ckpt(dir, &cfg, P);
    snprintf(p, sizeof p, "%s/model.bin", dir);
    f = xfopen(p, "r+b");
    fseek(f, 2000, SEEK_SET);
    fputc(0x01, f);
    fclose(f);
    verify_fails(dir, &cfg, P, "checksum mismatch", "a flipped byte in model.bin");
    make_ckpt(dir, &cfg, P);
    snprintf(p, sizeof p, "%s/state.bin", dir);
    if (truncate(p, CKPT_HEADER_BYTES + 100) != 0) perror("truncate");
    verify_fails(dir, &cfg, P, "truncated", "a truncated state.bin");
    make_ckpt(dir, &cfg, P);
    unlink(p);
    verify_fails(dir, &cfg, P, "missing", "a missing state.bin");
    make_ckpt(dir, &cfg, P);
    snprintf(p, sizeof p, "%s/DONE", dir);
    write_file(p, "gpt2-checkpoint v1\nstep 17\n", 27);
    verify_fails(dir, &cfg, P, "malformed", "a damaged DONE");
    /* a bf16 model.bin (version 5) with a DONE that matches it */
    make_ckpt(dir, &cfg, P);
    snprintf(p, sizeof p, "%s/model.bin", dir);
    f = xfopen(p, "r+b");
    fseek(f, 4, SEEK_SET);
    int32_t five = 5;
    xfwrite(&five, 4, 1, f, p);
    fclose(f);
    write_done(dir);
    verify_fails(dir, &cfg, P, "not an fp32 llm.c model file (magic 20240326, version 5)", "a bf16 model.bin");
    /* another shape: the files are intact but describe a wider model */
    GPT2Config wide = cfg;
    wide.channels = 16;
    size_t PW = num_params(&wide);
    make_ckpt(dir, &wide, PW);
    verify_fails(dir, &cfg, P, "model shape", "a checkpoint of another model shape");
    /* a consistent header that lies about the step */
    make_ckpt(dir, &cfg, P);
    snprintf(p, sizeof p, "%s/DONE", dir);
    write_done(dir);
    snprintf(cmd, sizeof cmd, "sed -i 's/^step 17$/step 18/' %s", p);
    if (system(cmd) != 0) printf("sed failed\n");
    verify_fails(dir, &cfg, P, "step", "DONE's step differs from the header's");
}

/* ---- log.jsonl trimming ---- */
static void test_log_trim(void) {
    char p[512], err[256];
    snprintf(p, sizeof p, "%s/log.jsonl", g_dir);
    const char* in =
        "{\"step\":0,\"val_loss\":5}\n{\"step\":1,\"loss\":4}\n{\"step\":2,\"loss\":3}\n{\"step\":2,\"val_loss\":3.5}\n"
        "{\"step\":3,\"skipped\":1,\"bad_in_a_row\":1}\n{\"step\":4,\"loss\":2}\n{\"step\":4,\"val_loss\":2.5}\n"
        "{\"step\":5,\"loss\":1}\n";
    const char* want =
        "{\"step\":0,\"val_loss\":5}\n{\"step\":1,\"loss\":4}\n{\"step\":2,\"loss\":3}\n{\"step\":2,\"val_loss\":3.5}\n"
        "{\"step\":3,\"skipped\":1,\"bad_in_a_row\":1}\n{\"step\":4,\"loss\":2}\n";
    write_file(p, in, strlen(in));
    int rc = runlog_trim(p, 4, err, sizeof err);
    char buf[1024] = "";
    FILE* f = fopen(p, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    CHECK(rc == 0 && strcmp(buf, want) == 0, "log trim at step 4 kept:\n%s", buf);
    snprintf(p, sizeof p, "%s/no_such_log.jsonl", g_dir);
    CHECK(runlog_trim(p, 3, err, sizeof err) == 0, "log trim of a missing log is fine");
    printf("log.jsonl: trimmed to the lines before the validation at the resume step\n");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_ckpt.XXXXXX");
    if (!mkdtemp(g_dir)) fatal("mkdtemp failed");
    test_crc();
    test_header();
    test_header_bytes();
    test_fields();
    test_canonical();
    test_verify();
    test_log_trim();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) printf("cleanup of %s failed\n", g_dir);
    return test_done("test_ckpt");
}
