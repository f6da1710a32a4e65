/* checkpoint/ckpt_format.h — the checkpoint format, pure: bytes and text in,
 * values out, no file system, no communicator (the fuzz harness and the unit
 * test call everything here directly). ckpt_file.h reads and writes what this
 * defines; checkpoint.h runs the collective protocol on top of both.
 *
 * A checkpoint of a run that has completed S optimizer steps is a directory
 *   <output_dir>/ckpt_<S as %08d>/
 *     model.bin  llm.c model file, fp32 (version 3), written by rank 0
 *     state.bin  the training state (below), written by every rank
 *     DONE       the completion marker, written last, text:
 *                  gpt2-checkpoint v1
 *                  step <S>
 *                  model.bin <bytes> crc32 <8 hex digits>
 *                  state.bin <bytes> crc32 <8 hex digits>
 *
 * state.bin: a 1024-byte header of 128 little-endian uint64 slots, then three
 * fp32 arrays of P = num_parameters elements: the master weights, AdamW m,
 * AdamW v. Slots 0..2 are the frame (magic CKPT_MAGIC, version CKPT_VERSION,
 * header bytes CKPT_HEADER_BYTES); every other slot in use is a row of the
 * field table ckpt_fields (ckpt_format.c), the one definition of the header:
 * its slot, name, C type (taken from the CkptHeader member), decode range and
 * role on resume. Unused slots are zero. Signed values are stored as int64
 * two's complement, floats as their IEEE bits in the low 32 bits (the upper
 * half is written as zero and ignored when read). Each array is in llm.c's
 * file order (tensor by tensor, the order of model.bin), with no padding:
 * element e of a tensor that starts at file_off lies at byte
 * ckpt_state_offset(P, a, file_off + e) = 1024 + 4 * (a * P + file_off + e)
 * for array a (0 master, 1 m, 2 v). Nothing in the file depends on the world
 * size, the bucket size or the zero_stage.
 *
 * Adding a header field: a member in CkptHeader (a run setting: in
 * CkptHparams) and one row in ckpt_fields. Encoding, decoding with its range
 * check, the resume check or the printed change, and the unit test's per-field
 * checks all follow from the row; the trainer fills the value. A constraint
 * between fields is code (ckpt_header_decode, ckpt_header_check_resume). */
#ifndef CHECKPOINT_CKPT_FORMAT_H
#define CHECKPOINT_CKPT_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include "../common/util.h"
#include "../ddp/layout.h"
#include "../model/gpt2.h"

#define CKPT_MAGIC 20261203
#define CKPT_VERSION 1
#define CKPT_HEADER_BYTES 1024
#define CKPT_HEADER_SLOTS (CKPT_HEADER_BYTES / 8)
/* the frame; the field table uses slots CKPT_FIRST_FIELD_SLOT .. CKPT_HEADER_SLOTS - 1 */
#define CKPT_SLOT_MAGIC 0
#define CKPT_SLOT_VERSION 1
#define CKPT_SLOT_HEADER_BYTES 2
#define CKPT_FIRST_FIELD_SLOT 3
#define CKPT_DONE_MAX 4096 /* DONE is a few lines; anything this long is corrupt */

/* The run's settings recorded in state.bin (each has a row in ckpt_fields). */
typedef struct {
    /* must match on resume */
    int sequence_length;
    int seed;
    int shuffle;
    uint64_t train_rows; /* rows of T+1 tokens in one epoch of the training data */
    /* recorded; may change on resume (each change is printed) */
    long long total_batch_size;
    int batch_size, world, zero_stage, num_iterations;
    int lr_schedule, warmup_iters;
    float learning_rate, lr_decay_frac, weight_decay, beta1, beta2, eps, grad_clip;
} CkptHparams;

/* Where the training loop stands. */
typedef struct {
    int step;          /* optimizer steps completed (skipped ones included) */
    uint64_t next_row; /* global row index of the next step's first row */
    int bad_streak;    /* consecutive skipped (non-finite) steps so far */
} CkptProgress;

/* state.bin's header, decoded. Every member but version is a row of
 * ckpt_fields; its C type must be int, long long, uint64_t or float. */
typedef struct {
    int version;
    uint64_t num_parameters;
    GPT2Config cfg;
    CkptProgress progress;
    int opt_t; /* AdamW updates taken (bias correction) */
    int dtype; /* the run's DType at save (informational) */
    CkptHparams hp;
} CkptHeader;

/* DONE, parsed. */
typedef struct {
    int step;
    long long model_bytes, state_bytes;
    uint32_t model_crc, state_crc;
} CkptDone;

/* One range of this rank's optimizer state and where it lives in the
 * canonical arrays of state.bin. */
typedef struct {
    size_t state_off; /* element offset in the optimizer's master/m/v */
    size_t canon_off; /* element offset in each canonical array */
    size_t len;
} CkptSpan;

/* ---- the header's field table ---- */

/* A slot's C type, from its CkptHeader member. */
typedef enum { CKPT_I32, CKPT_I64, CKPT_U64, CKPT_F32 } CkptType;

/* What a field is to decoding and to resuming:
 *   SHAPE       the model's shape (a member of cfg): decoded first (a bad one is
 *               "invalid model shape"); must equal the run's model on resume;
 *   DERIVED     num_parameters: must equal the count of the shape, and the run's P;
 *   PROGRESS    where training stands: restored on resume;
 *   MUST_MATCH  a run setting (a member of hp) that must equal the run's, else
 *               the error `mismatch` (a format with two %s: the run's value,
 *               then the checkpoint's);
 *   MAY_CHANGE  a run setting (a member of hp) that may change; a change is
 *               printed as "resume: <name> changes from A (checkpoint) to B";
 *   INFO        recorded only. */
typedef enum { CKPT_SHAPE, CKPT_DERIVED, CKPT_PROGRESS, CKPT_MUST_MATCH, CKPT_MAY_CHANGE, CKPT_INFO } CkptRole;

#define CKPT_NO_MAX 0x7fffffffffffffffLL /* hi of a field with no upper bound */

typedef struct {
    int slot;
    const char* name; /* as printed (a flag where the setting is one) */
    CkptType type;
    size_t off;       /* offset of the member in CkptHeader */
    long long lo, hi; /* decode range, inclusive (F32: ignored, must be finite) */
    CkptRole role;
    const char* mismatch; /* MUST_MATCH only */
} CkptField;

/* The table, in the order of the resume checks and of the printed changes
 * (not the slot order). Each slot appears once. */
extern const CkptField ckpt_fields[];
extern const int ckpt_nfields;

/* A field's value in h, as the header stores it (uint64 slot). */
uint64_t ckpt_field_bits(const CkptField* f, const CkptHeader* h);
/* A field's value in h as printed (%lld, %llu or %g). */
void ckpt_field_str(const CkptField* f, const CkptHeader* h, char* out, size_t n);

/* ---- state.bin ---- */

void ckpt_header_encode(const CkptHeader* h, unsigned char out[CKPT_HEADER_BYTES]);
/* Decodes and checks a header of n bytes: the frame, each field's range, the
 * shape's consistency, P against the shape, the step counters against each
 * other. 0, or -1 with a one-line reason in err. */
int ckpt_header_decode(const unsigned char* buf, size_t n, CkptHeader* h, char* err, size_t errlen);
/* Resume check of a decoded header against the run's settings `now` (rank 0,
 * after the shape check): the MUST_MATCH fields, and num_iterations not below
 * the checkpoint's step. 0 with one line per changed MAY_CHANGE field in
 * notes (NUL-terminated; cut at notes_len; notes may be NULL), or -1 + err. */
int ckpt_header_check_resume(const CkptHeader* h, const CkptHparams* now, char* notes, size_t notes_len,
                             char* err, size_t errlen);
/* 0 if the SHAPE fields of `saved` (a checkpoint's) equal those of `run`;
 * else -1 with "the checkpoint's model shape (...) differs from the run's (...)". */
int ckpt_shape_check(const GPT2Config* saved, const GPT2Config* run, char* err, size_t errlen);
/* model.bin's first GPT2_HEADER_INTS * 4 bytes: 0 if they are the header of
 * an fp32 llm.c model file (gpt2_header_decode, version 3) of the shape run,
 * else -1 + err. */
int ckpt_model_header_check(const unsigned char* buf, const GPT2Config* run, char* err, size_t errlen);

/* Sizes and offsets of the files of a model of P parameters (model.bin: the
 * llm.c header and P fp32 values). */
long long ckpt_model_bytes(size_t P);
long long ckpt_state_bytes(size_t P);
long long ckpt_state_offset(size_t P, int array, size_t canon);

/* ---- DONE ---- */

/* Parses DONE's text (n bytes), strictly. 0 or -1 + err. */
int ckpt_done_parse(const char* text, size_t n, CkptDone* d, char* err, size_t errlen);
/* DONE's text for d into out (n bytes); returns its length (snprintf's). */
int ckpt_done_format(const CkptDone* d, char* out, size_t n);

/* ---- canonical offsets, checksums ---- */

/* For each buffer range of `want` (each inside one parameter and one piece
 * of `held`), the matching range of the optimizer state described by
 * `held` and its canonical offset (via m->layout_to_tensor, the layout
 * parameter's spec_off inside its tensor (a row chunk of wte) and file_off).
 * Returns a new array of *n = nwant spans; fatal on a range that is not
 * inside one parameter and one piece. */
CkptSpan* ckpt_spans(const Layout* L, const GPT2* m, const OptPiece* held, int nheld, const OptPiece* want,
                     int nwant, int* n);

/* CRC-32 (zlib's polynomial 0xEDB88320, init and final xor 0xFFFFFFFF),
 * chained: ckpt_crc32(ckpt_crc32(0, a, n), b, k) is the CRC of a then b. */
uint32_t ckpt_crc32(uint32_t crc, const void* data, size_t n);

/* snprintf into err; the error reporting of every checkpoint/ function. */
void ckpt_errf(char* err, size_t errlen, const char* fmt, ...) PRINTF_LIKE(3, 4);

#endif
