/* checkpoint/ckpt_file.h — the file system side of checkpoints, one process
 * at a time (no communicator): full pread/pwrite, fsync of a file or a
 * directory, creating and removing directories, listing the checkpoint
 * directories of --output_dir, small files written atomically, CRC-32 of a
 * file, rank 0's check of a checkpoint directory (ckpt_verify), and the
 * parallel-safe reading and writing of state.bin's arrays by spans. The
 * format itself (what the bytes mean) is ckpt_format.h; who calls what, in
 * which order, across ranks is checkpoint.h.
 *
 * Errors: functions that take err/errlen return 0, or -1 with one line in
 * err naming the file; none of them exits, except where noted (out of host
 * memory, a path too long for a checkpoint directory name). */
#ifndef CHECKPOINT_CKPT_FILE_H
#define CHECKPOINT_CKPT_FILE_H

#include <stddef.h>
#include <stdint.h>
#include "../kernels/kernels.h"
#include "ckpt_format.h"

#define CKPT_PATH 4096
#define CKPT_CHUNK ((size_t)1 << 20) /* elements per staging chunk (4 MB) */

/* pread/pwrite of exactly `bytes` at `off`, retried on EINTR and short
 * counts. 0, or -1 with errno set (pread: errno 0 at the end of the file,
 * i.e. the file is truncated; pwrite: ENOSPC when nothing could be written). */
int ckpt_pread_full(int fd, void* buf, size_t bytes, long long off);
int ckpt_pwrite_full(int fd, const void* buf, size_t bytes, long long off);
/* fsync of a file, or of a directory (is_dir; a file system that refuses
 * fsync on a directory with EINVAL counts as done). */
int ckpt_fsync_path(const char* path, int is_dir, char* err, size_t errlen);
/* mkdir -p of --output_dir; fails if dir exists but is not a directory. */
int ckpt_mkdir_p(const char* dir, char* err, size_t errlen);
/* Removes a checkpoint directory (flat: files only). DONE goes first (and
 * the directory is fsynced), so an interrupted removal leaves an incomplete
 * directory, never a damaged one that still looks complete. A missing
 * directory is fine. */
int ckpt_remove_dir(const char* path, char* err, size_t errlen);
int ckpt_exists(const char* path);

/* Reads at most cap bytes of a small file into buf; *n = bytes read. */
int ckpt_read_small(const char* path, char* buf, size_t cap, size_t* n, char* err, size_t errlen);
/* Writes dir/name atomically: dir/name.tmp, fsync, rename to dir/name,
 * fsync of dir. */
int ckpt_write_small(const char* dir, const char* name, const void* data, size_t n, char* err, size_t errlen);
/* CRC-32 (ckpt_crc32) and size of a file. A missing file is reported as
 * "missing: the checkpoint is incomplete". */
int ckpt_crc32_file(const char* path, uint32_t* crc, long long* bytes, char* err, size_t errlen);

/* ---- the checkpoint directories of --output_dir ---- */

typedef struct {
    int step;
    int tmp;      /* name ends in .tmp */
    int complete; /* not tmp, and DONE exists */
} CkptEntry;

/* "ckpt_" + at least 8 digits (a value that fits an int) [+ ".tmp"]: the
 * step (and *tmp), or -1 for any other name. */
int ckpt_parse_name(const char* name, int* tmp);
/* dir/ckpt_<step as %08d>[.tmp] into out; fatal if it does not fit. */
void ckpt_dir_name(char* out, size_t n, const char* dir, int step, int tmp);
/* The checkpoint directories in dir (those ckpt_parse_name accepts that are
 * directories), sorted by step, a .tmp after the complete name of its step.
 * *out is a new array (free it; NULL when none). */
int ckpt_scan(const char* dir, CkptEntry** out, int* n, char* err, size_t errlen);

/* ---- one checkpoint directory ---- */

/* Everything rank 0 checks before a resume, on the checkpoint directory
 * `path`, in this order: DONE parses; both files present with the recorded
 * sizes and checksums; model.bin's header is an fp32 llm.c header of shape
 * cfg and its size fits P; state.bin's header decodes, has shape cfg and P
 * parameters, the size fits P, and its step is DONE's. Fills *h. */
int ckpt_verify(const char* path, const GPT2Config* cfg, size_t P, CkptHeader* h, char* err, size_t errlen);
/* Writes the spans of master/m/v (backend memory, through a host staging
 * buffer) into path at their canonical offsets, creating the file but never
 * truncating it (every rank writes its own ranges into the one file, in any
 * order), and the header too when header != NULL (rank 0); then fsyncs. */
int ckpt_write_state(const char* path, Backend* be, size_t P, const unsigned char* header,
                     const CkptSpan* spans, int nspans, const float* master, const float* m, const float* v,
                     char* err, size_t errlen);
/* Reads the spans of state.bin (P parameters) into master/m/v (backend
 * memory, through a host staging buffer), refusing non-finite values and
 * negative second moments. */
int ckpt_read_state(const char* path, Backend* be, size_t P, const CkptSpan* spans, int nspans, float* master,
                    float* m, float* v, char* err, size_t errlen);

#endif
