/* data/bpe.c — GPT-2's byte-level BPE encoder: vocabulary loading
 * (encoder.json through a small JSON parser, vocab.bpe), the hand-written
 * pre-tokeniser for GPT-2's regex on UTF-8, the merge loop and the per-piece
 * cache. See bpe.h for the contract. */
#include "bpe.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"
#include "../common/util.h"

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */

static void* bpe_grow(void* p, size_t* cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void* q = realloc(p, c * elem);
    if (!q) fatal("out of host memory growing a BPE buffer to %zu x %zu bytes", c, elem);
    *cap = c;
    return q;
}

void bpe_tokens_push(BpeTokens* t, int32_t id) {
    if (t->n == t->cap) t->ids = bpe_grow(t->ids, &t->cap, t->n + 1, sizeof(int32_t));
    t->ids[t->n++] = id;
}

void bpe_tokens_free(BpeTokens* t) {
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

static void bpe_tokens_append(BpeTokens* t, const int32_t* ids, size_t n) {
    t->ids = bpe_grow(t->ids, &t->cap, t->n + n, sizeof(int32_t));
    memcpy(t->ids + t->n, ids, n * sizeof(int32_t));
    t->n += n;
}

/* 64-bit FNV-1a, never 0 (0 marks an empty slot). */
static uint64_t bpe_hash_bytes(const uint8_t* s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h ? h : 1;
}

/* ------------------------------------------------------------------------ */
/* byte-string map                                                           */

static void strmap_alloc(BpeStrMap* m, size_t cap) {
    m->cap = cap;
    m->count = 0;
    m->hash = xcalloc(cap, sizeof(uint64_t));
    m->key_off = xmalloc(cap * sizeof(uint32_t));
    m->key_len = xmalloc(cap * sizeof(uint32_t));
    m->val_off = xmalloc(cap * sizeof(uint32_t));
    m->val_len = xmalloc(cap * sizeof(uint32_t));
}

static void strmap_free_slots(BpeStrMap* m) {
    free(m->hash);
    free(m->key_off);
    free(m->key_len);
    free(m->val_off);
    free(m->val_len);
    m->hash = NULL;
    m->key_off = m->key_len = m->val_off = m->val_len = NULL;
}

static void strmap_free(BpeStrMap* m) {
    strmap_free_slots(m);
    free(m->keys);
    memset(m, 0, sizeof *m);
}

static void strmap_clear(BpeStrMap* m) {
    memset(m->hash, 0, m->cap * sizeof(uint64_t));
    m->count = 0;
    m->keys_len = 0;
}

/* Slot holding key, or SIZE_MAX. */
static size_t strmap_find(const BpeStrMap* m, const uint8_t* key, size_t len, uint64_t h) {
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        if (m->hash[i] == 0) return SIZE_MAX;
        if (m->hash[i] == h && m->key_len[i] == len && memcmp(m->keys + m->key_off[i], key, len) == 0) return i;
    }
}

static void strmap_put_slot(BpeStrMap* m, uint64_t h, uint32_t koff, uint32_t klen, uint32_t voff,
                            uint32_t vlen) {
    size_t mask = m->cap - 1;
    size_t i = (size_t)h & mask;
    while (m->hash[i] != 0) i = (i + 1) & mask;
    m->hash[i] = h;
    m->key_off[i] = koff;
    m->key_len[i] = klen;
    m->val_off[i] = voff;
    m->val_len[i] = vlen;
    m->count++;
}

/* Insert a key that is not present. */
static void strmap_insert(BpeStrMap* m, const uint8_t* key, size_t len, uint64_t h, uint32_t voff,
                          uint32_t vlen) {
    if ((m->count + 1) * 2 > m->cap) { /* grow: rehash into twice the slots */
        BpeStrMap old = *m;
        strmap_alloc(m, old.cap * 2);
        m->keys = old.keys;
        m->keys_len = old.keys_len;
        m->keys_cap = old.keys_cap;
        for (size_t i = 0; i < old.cap; i++)
            if (old.hash[i])
                strmap_put_slot(m, old.hash[i], old.key_off[i], old.key_len[i], old.val_off[i], old.val_len[i]);
        strmap_free_slots(&old);
    }
    if (m->keys_len + len > UINT32_MAX) fatal("BPE map: key arena over 4 GiB");
    m->keys = bpe_grow(m->keys, &m->keys_cap, m->keys_len + len, 1);
    memcpy(m->keys + m->keys_len, key, len);
    strmap_put_slot(m, h, (uint32_t)m->keys_len, (uint32_t)len, voff, vlen);
    m->keys_len += len;
}

/* ------------------------------------------------------------------------ */
/* UTF-8 and code point classes                                              */

size_t bpe_utf8_next(const uint8_t* s, size_t n, size_t i, uint32_t* cp) {
    uint8_t b0 = s[i];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        c = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0; /* no overlongs */
        if (b0 == 0xED) hi = 0x9F; /* no surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        c = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90; /* no overlongs */
        if (b0 == 0xF4) hi = 0x8F; /* nothing past U+10FFFF */
    } else {                       /* continuation byte, C0, C1, F5..FF */
        *cp = BPE_INVALID_CP;
        return 1;
    }
    size_t k = 1;
    while (need > 0) {
        if (i + k >= n || s[i + k] < lo || s[i + k] > hi) { /* maximal subpart ends here */
            *cp = BPE_INVALID_CP;
            return k;
        }
        c = (c << 6) | (s[i + k] & 0x3F);
        lo = 0x80;
        hi = 0xBF;
        k++;
        need--;
    }
    *cp = c;
    return k;
}

size_t bpe_utf8_first_invalid(const uint8_t* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t l = bpe_utf8_next(s, n, i, &cp);
        if (cp == BPE_INVALID_CP) return i;
        i += l;
    }
    return n;
}

int bpe_unicode_class(uint32_t cp) {
    if (cp > 0x10FFFF) return BPE_CLASS_OTHER;
    uint32_t key = (cp << 2) | 3u;
    size_t lo = 0, hi = BPE_UNICODE_NRUNS; /* runs[lo] <= key < runs[hi] */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (bpe_unicode_runs[mid] <= key) lo = mid;
        else hi = mid;
    }
    return (int)(bpe_unicode_runs[lo] & 3u);
}

const char* bpe_unicode_source(void) { return BPE_UNICODE_SOURCE; }

static inline int bpe_ascii_class(uint8_t b) {
    if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')) return BPE_CLASS_LETTER;
    if (b >= '0' && b <= '9') return BPE_CLASS_NUMBER;
    if (b == ' ' || (b >= 0x09 && b <= 0x0D)) return BPE_CLASS_SPACE;
    return BPE_CLASS_OTHER;
}

/* Length and class of the character (or invalid subpart) at s[i]. */
static inline size_t bpe_unit(const uint8_t* s, size_t n, size_t i, int* cls) {
    if (s[i] < 0x80) {
        *cls = bpe_ascii_class(s[i]);
        return 1;
    }
    uint32_t cp;
    size_t l = bpe_utf8_next(s, n, i, &cp);
    *cls = cp == BPE_INVALID_CP ? BPE_CLASS_OTHER : bpe_unicode_class(cp);
    return l;
}

/* GPT-2's regex, alternative by alternative, as a backtracking engine would
 * take them at position i:
 *   's 't 're 've 'm 'll 'd          literal contractions (lowercase only)
 *   ' '? then a run of letters, of numbers, or of "other" characters
 *   \s+(?!\S)  a whitespace run up to the end of the text, or all of it but
 *              its last character when a non-space follows (that last
 *              character then starts the next piece, e.g. " word")
 *   \s+        a lone whitespace character before a non-space */
size_t bpe_piece_end(const uint8_t* s, size_t n, size_t i) {
    uint8_t b = s[i];
    if (b == '\'' && i + 1 < n) {
        uint8_t c = s[i + 1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
        if (i + 2 < n) {
            uint8_t d = s[i + 2];
            if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return i + 3;
        }
    }
    int cls;
    size_t j = i + bpe_unit(s, n, i, &cls);
    if (b == ' ' && j < n) { /* the optional leading space */
        int c1;
        size_t l1 = bpe_unit(s, n, j, &c1);
        if (c1 != BPE_CLASS_SPACE) {
            cls = c1;
            j += l1;
        }
    }
    if (cls != BPE_CLASS_SPACE) {
        while (j < n) {
            int c;
            size_t l = bpe_unit(s, n, j, &c);
            if (c != cls) break;
            j += l;
        }
        return j;
    }
    size_t last = i, k = 1; /* whitespace run: start of its last char, length */
    while (j < n) {
        int c;
        size_t l = bpe_unit(s, n, j, &c);
        if (c != BPE_CLASS_SPACE) break;
        last = j;
        j += l;
        k++;
    }
    if (j == n || k == 1) return j;
    return last;
}

/* ------------------------------------------------------------------------ */
/* merges                                                                    */

static inline size_t bpe_merge_slot(uint64_t key, size_t cap) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

/* Rank of the pair (a, b) and its merged id, or -1 when it is not a merge. */
static inline int bpe_merge_find(const BpeEncoder* e, int32_t a, int32_t b, int32_t* merged) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = e->merge_cap - 1;
    for (size_t i = bpe_merge_slot(key, e->merge_cap);; i = (i + 1) & mask) {
        if (e->merge_key[i] == key) {
            *merged = e->merge_id[i];
            return e->merge_rank[i];
        }
        if (e->merge_key[i] == 0) return -1;
    }
}

static void bpe_merge_put(BpeEncoder* e, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = e->merge_cap - 1;
    size_t i = bpe_merge_slot(key, e->merge_cap);
    while (e->merge_key[i] != 0 && e->merge_key[i] != key) i = (i + 1) & mask;
    e->merge_key[i] = key; /* a repeated pair keeps its last rank, as the reference's table does */
    e->merge_rank[i] = rank;
    e->merge_id[i] = merged;
}

/* O(n^2): find the lowest-ranked pair, merge all its occurrences left to
 * right, repeat. This is the reference's loop, literally. */
static size_t bpe_merge_scan(const BpeEncoder* e, int32_t* sym, size_t n) {
    while (n > 1) {
        int best = INT_MAX;
        size_t bi = 0;
        int32_t bid = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t mid;
            int r = bpe_merge_find(e, sym[i], sym[i + 1], &mid);
            if (r >= 0 && r < best) {
                best = r;
                bi = i;
                bid = mid;
            }
        }
        if (best == INT_MAX) break;
        int32_t a = sym[bi], b = sym[bi + 1];
        size_t j = bi;
        for (size_t i = bi; i < n;) {
            if (i + 1 < n && sym[i] == a && sym[i + 1] == b) {
                sym[j++] = bid;
                i += 2;
            } else {
                sym[j++] = sym[i++];
            }
        }
        n = j;
    }
    return n;
}

static void bpe_heap_push(int64_t* h, size_t* hn, int64_t v) {
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static int64_t bpe_heap_pop(int64_t* h, size_t* hn) {
    int64_t top = h[0], v = h[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}

/* O(n log n) for long pieces, same result as bpe_merge_scan: a heap of
 * (rank, position) over a linked list of symbols. All occurrences of one
 * rank are merged in position order before the pairs they create are
 * pushed, which is exactly one pass of the scan loop (a merge never creates
 * another occurrence of the pair being merged). */
static size_t bpe_merge_heap(BpeEncoder* e, int32_t* sym, size_t n) {
    int32_t* nxt = e->nxt; /* -1: end of list; -2: merged away */
    int32_t* prv = e->prv;
    int64_t* heap = e->heap;
    int32_t* pend = e->prv + n; /* room for 2n pending positions after prv[0..n) */
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t mid;
        int r = bpe_merge_find(e, sym[i], sym[i + 1], &mid);
        if (r >= 0) bpe_heap_push(heap, &hn, ((int64_t)r << 32) | (int64_t)i);
    }
    while (hn > 0) {
        int64_t top = bpe_heap_pop(heap, &hn);
        int r = (int)(top >> 32);
        int32_t p = (int32_t)(top & 0xFFFFFFFF);
        int32_t mid = 0;
        if (nxt[p] < 0 || bpe_merge_find(e, sym[p], sym[nxt[p]], &mid) != r) continue; /* stale */
        size_t np = 0;
        for (;;) {
            int32_t q = nxt[p];
            sym[p] = mid;
            nxt[p] = nxt[q];
            if (nxt[q] >= 0) prv[nxt[q]] = p;
            nxt[q] = -2;
            if (prv[p] >= 0) pend[np++] = prv[p];
            pend[np++] = p;
            /* the next occurrence of the same rank, if any */
            int found = 0;
            while (hn > 0 && (int)(heap[0] >> 32) == r) {
                int64_t t = bpe_heap_pop(heap, &hn);
                p = (int32_t)(t & 0xFFFFFFFF);
                if (nxt[p] >= 0 && bpe_merge_find(e, sym[p], sym[nxt[p]], &mid) == r) {
                    found = 1;
                    break;
                }
            }
            if (!found) break;
        }
        for (size_t k = 0; k < np; k++) {
            int32_t x = pend[k];
            if (nxt[x] < 0) continue;
            int rr = bpe_merge_find(e, sym[x], sym[nxt[x]], &mid);
            if (rr >= 0) bpe_heap_push(heap, &hn, ((int64_t)rr << 32) | (int64_t)x);
        }
    }
    size_t m = 0;
    for (int32_t i = 0; i >= 0; i = nxt[i]) sym[m++] = sym[i]; /* position 0 is never merged away */
    return m;
}

/* ------------------------------------------------------------------------ */
/* encoding                                                                  */

#define BPE_CACHE_MAX_KEY 256            /* longer pieces are not cached */
#define BPE_CACHE_MAX_BYTES (256u << 20) /* key or token arena size that clears the cache */

static void bpe_encode_piece(BpeEncoder* e, const uint8_t* p, size_t len, BpeTokens* out) {
    if (len == 1) {
        bpe_tokens_push(out, e->byte_id[p[0]]);
        return;
    }
    uint64_t h = 0;
    if (len <= BPE_CACHE_MAX_KEY) {
        h = bpe_hash_bytes(p, len);
        size_t slot = strmap_find(&e->cache, p, len, h);
        if (slot != SIZE_MAX) {
            e->cache_hits++;
            bpe_tokens_append(out, e->cache_tok + e->cache.val_off[slot], e->cache.val_len[slot]);
            return;
        }
    }
    e->cache_misses++;
    if (len > e->scratch_cap) {
        size_t c = len < 64 ? 64 : len;
        free(e->sym);
        free(e->nxt);
        free(e->prv);
        free(e->heap);
        e->sym = xmalloc(c * sizeof(int32_t));
        e->nxt = xmalloc(c * sizeof(int32_t));
        e->prv = xmalloc(3 * c * sizeof(int32_t)); /* prv + 2n pending */
        e->heap = xmalloc(3 * c * sizeof(int64_t));
        e->scratch_cap = c;
    }
    if (len > INT32_MAX) fatal("BPE: a piece of %zu bytes is too long", len);
    int32_t* sym = e->sym;
    for (size_t i = 0; i < len; i++) sym[i] = e->byte_id[p[i]];
    size_t n = len >= e->heap_min_len ? bpe_merge_heap(e, sym, len) : bpe_merge_scan(e, sym, len);
    bpe_tokens_append(out, sym, n);
    if (len <= BPE_CACHE_MAX_KEY) {
        if (e->cache.count >= e->cache_max || e->cache.keys_len + len > BPE_CACHE_MAX_BYTES ||
            (e->cache_tok_len + n) * sizeof(int32_t) > BPE_CACHE_MAX_BYTES) {
            strmap_clear(&e->cache);
            e->cache_tok_len = 0;
        }
        e->cache_tok = bpe_grow(e->cache_tok, &e->cache_tok_cap, e->cache_tok_len + n, sizeof(int32_t));
        memcpy(e->cache_tok + e->cache_tok_len, sym, n * sizeof(int32_t));
        strmap_insert(&e->cache, p, len, h, (uint32_t)e->cache_tok_len, (uint32_t)n);
        e->cache_tok_len += n;
    }
}

size_t bpe_encode(BpeEncoder* e, const uint8_t* text, size_t n, BpeUtf8Mode mode, BpeTokens* out) {
    size_t ninvalid = 0;
    size_t bad = bpe_utf8_first_invalid(text, n);
    if (bad < n) {
        /* count the invalid subparts; in replace mode also build the U+FFFD copy */
        size_t m = 0;
        if (mode == BPE_UTF8_REPLACE) e->clean = bpe_grow(e->clean, &e->clean_cap, 3 * n, 1);
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = text[i] < 0x80 ? 1 : bpe_utf8_next(text, n, i, &cp);
            int invalid = text[i] >= 0x80 && cp == BPE_INVALID_CP;
            ninvalid += invalid;
            if (mode == BPE_UTF8_REPLACE) {
                if (invalid) {
                    e->clean[m++] = 0xEF;
                    e->clean[m++] = 0xBF;
                    e->clean[m++] = 0xBD;
                } else {
                    memcpy(e->clean + m, text + i, l);
                    m += l;
                }
            }
            i += l;
        }
        if (mode == BPE_UTF8_REPLACE) {
            text = e->clean;
            n = m;
        }
    }
    for (size_t i = 0; i < n;) {
        size_t j = bpe_piece_end(text, n, i);
        bpe_encode_piece(e, text + i, j - i, out);
        i = j;
    }
    return ninvalid;
}

const uint8_t* bpe_token_bytes(const BpeEncoder* e, int id, size_t* len) {
    if (id < 0 || id >= e->vocab_size) return NULL;
    *len = e->tok_off[id + 1] - e->tok_off[id];
    return e->tok_bytes + e->tok_off[id];
}

/* ------------------------------------------------------------------------ */
/* loading encoder.json and vocab.bpe                                        */

/* GPT-2's byte-to-unicode alphabet: the printable bytes ! .. ~, ¡ .. ¬ and
 * ® .. ÿ stand for themselves; the other 68 bytes, in order, become
 * U+0100, U+0101, ... Returns the code point of byte b. */
static uint32_t bpe_byte_to_cp(int b) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (uint32_t)b;
    int k = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) k++;
    return 256u + (uint32_t)k;
}

#define BPE_ALPHABET_MAX 0x144 /* 256 + 68: every alphabet code point is below this */

typedef struct {
    const char* path;
    const uint8_t* s;
    size_t n, i;
    const int16_t* cp_to_byte; /* [BPE_ALPHABET_MAX], -1 where not in the alphabet */
} BpeJson;

static uint8_t* bpe_read_file(const char* path, size_t* n) {
    FILE* f = xfopen(path, "rb");
    long long sz = file_size(f);
    if (sz < 0) fatal("%s: cannot determine the file size", path);
    uint8_t* buf = xmalloc((size_t)sz + 1);
    xfread(buf, 1, (size_t)sz, f, path);
    fclose(f);
    buf[sz] = 0;
    *n = (size_t)sz;
    return buf;
}

static void bpe_json_ws(BpeJson* j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
}

static NORETURN void bpe_json_fail(const BpeJson* j, const char* what) {
    fatal("%s: not GPT-2's encoder.json: %s at byte %zu", j->path, what, j->i);
}

static int bpe_json_hex4(BpeJson* j) {
    if (j->i + 4 > j->n) bpe_json_fail(j, "truncated \\u escape");
    int v = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t c = j->s[j->i++];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0) bpe_json_fail(j, "bad hex digit in a \\u escape");
        v = v * 16 + d;
    }
    return v;
}

/* Parse a JSON string (at the opening quote); each character must be in
 * GPT-2's byte alphabet and is appended as its raw byte to out. */
static void bpe_json_key(BpeJson* j, uint8_t** out, size_t* len, size_t* cap) {
    if (j->i >= j->n || j->s[j->i] != '"') bpe_json_fail(j, "expected a string");
    j->i++;
    for (;;) {
        if (j->i >= j->n) bpe_json_fail(j, "unterminated string");
        uint8_t c = j->s[j->i];
        uint32_t cp;
        if (c == '"') {
            j->i++;
            return;
        } else if (c == '\\') {
            j->i++;
            if (j->i >= j->n) bpe_json_fail(j, "unterminated escape");
            uint8_t x = j->s[j->i++];
            switch (x) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = 8; break;
            case 'f': cp = 12; break;
            case 'n': cp = 10; break;
            case 'r': cp = 13; break;
            case 't': cp = 9; break;
            case 'u': {
                cp = (uint32_t)bpe_json_hex4(j);
                if (cp >= 0xD800 && cp <= 0xDBFF && j->i + 1 < j->n && j->s[j->i] == '\\' &&
                    j->s[j->i + 1] == 'u') {
                    size_t save = j->i;
                    j->i += 2;
                    uint32_t lo = (uint32_t)bpe_json_hex4(j);
                    if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    else j->i = save;
                }
                break;
            }
            default: bpe_json_fail(j, "bad escape");
            }
        } else if (c < 0x20) {
            bpe_json_fail(j, "control character in a string");
        } else {
            size_t l = bpe_utf8_next(j->s, j->n, j->i, &cp);
            if (cp == BPE_INVALID_CP) bpe_json_fail(j, "invalid UTF-8");
            j->i += l;
        }
        if (cp >= BPE_ALPHABET_MAX || j->cp_to_byte[cp] < 0) {
            char what[96];
            snprintf(what, sizeof what, "a key holds U+%04X, which is not in GPT-2's byte alphabet",
                     (unsigned)cp);
            bpe_json_fail(j, what);
        }
        *out = bpe_grow(*out, cap, *len + 1, 1);
        (*out)[(*len)++] = (uint8_t)j->cp_to_byte[cp];
    }
}

/* Decode one whitespace-separated field of vocab.bpe into raw bytes. */
static size_t bpe_decode_field(const uint8_t* s, size_t n, const int16_t* cp_to_byte, uint8_t* out,
                               const char* path, int line) {
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = bpe_utf8_next(s, n, i, &cp);
        if (cp == BPE_INVALID_CP || cp >= BPE_ALPHABET_MAX || cp_to_byte[cp] < 0)
            fatal("%s line %d: a character outside GPT-2's byte alphabet", path, line);
        out[m++] = (uint8_t)cp_to_byte[cp];
        i += l;
    }
    return m;
}

static int bpe_vocab_id(const BpeStrMap* vocab, const uint8_t* s, size_t n) {
    size_t slot = strmap_find(vocab, s, n, bpe_hash_bytes(s, n));
    return slot == SIZE_MAX ? -1 : (int)vocab->val_off[slot];
}

void bpe_init(BpeEncoder* e, const char* vocab_dir) {
    memset(e, 0, sizeof *e);
    int16_t cp_to_byte[BPE_ALPHABET_MAX];
    for (int c = 0; c < BPE_ALPHABET_MAX; c++) cp_to_byte[c] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[bpe_byte_to_cp(b)] = (int16_t)b;

    size_t plen = strlen(vocab_dir) + 32;
    char* path = xmalloc(plen);

    /* encoder.json: {"token": id, ...} */
    snprintf(path, plen, "%s/encoder.json", vocab_dir);
    size_t n;
    uint8_t* buf = bpe_read_file(path, &n);
    BpeJson j = {path, buf, n, 0, cp_to_byte};
    uint8_t* keys = NULL;
    size_t keys_len = 0, keys_cap = 0;
    size_t* key_off = NULL;
    int32_t* key_id = NULL;
    size_t nkeys = 0, koff_cap = 0, kid_cap = 0;
    int max_id = -1;
    bpe_json_ws(&j);
    if (j.i >= j.n || j.s[j.i] != '{') bpe_json_fail(&j, "expected '{'");
    j.i++;
    bpe_json_ws(&j);
    if (j.i < j.n && j.s[j.i] == '}') bpe_json_fail(&j, "empty object");
    for (;;) {
        bpe_json_ws(&j);
        key_off = bpe_grow(key_off, &koff_cap, nkeys + 2, sizeof(size_t));
        key_id = bpe_grow(key_id, &kid_cap, nkeys + 1, sizeof(int32_t));
        key_off[nkeys] = keys_len;
        bpe_json_key(&j, &keys, &keys_len, &keys_cap);
        key_off[nkeys + 1] = keys_len;
        bpe_json_ws(&j);
        if (j.i >= j.n || j.s[j.i] != ':') bpe_json_fail(&j, "expected ':'");
        j.i++;
        bpe_json_ws(&j);
        long long v = 0;
        size_t start = j.i;
        while (j.i < j.n && j.s[j.i] >= '0' && j.s[j.i] <= '9') {
            v = v * 10 + (j.s[j.i++] - '0');
            if (v >= BPE_MAX_VOCAB) bpe_json_fail(&j, "token id too large (the shards hold uint16 ids)");
        }
        if (j.i == start) bpe_json_fail(&j, "expected a non-negative integer id");
        key_id[nkeys++] = (int32_t)v;
        if (v > max_id) max_id = (int)v;
        bpe_json_ws(&j);
        if (j.i < j.n && j.s[j.i] == ',') {
            j.i++;
            continue;
        }
        if (j.i < j.n && j.s[j.i] == '}') {
            j.i++;
            break;
        }
        bpe_json_fail(&j, "expected ',' or '}'");
    }
    bpe_json_ws(&j);
    if (j.i != j.n) bpe_json_fail(&j, "trailing data after the object");
    free(buf);

    /* every id from 0 to max exactly once */
    e->vocab_size = max_id + 1;
    if ((size_t)e->vocab_size != nkeys)
        fatal("%s: %zu entries but ids go up to %d (ids must be 0..N-1, each once)", path, nkeys, max_id);
    int32_t* key_of_id = xmalloc((size_t)e->vocab_size * sizeof(int32_t));
    for (int i = 0; i < e->vocab_size; i++) key_of_id[i] = -1;
    for (size_t k = 0; k < nkeys; k++) {
        if (key_of_id[key_id[k]] >= 0) fatal("%s: id %d appears twice", path, key_id[k]);
        key_of_id[key_id[k]] = (int32_t)k;
    }
    e->tok_off = xmalloc(((size_t)e->vocab_size + 1) * sizeof(uint32_t));
    e->tok_bytes = xmalloc(keys_len ? keys_len : 1);
    BpeStrMap vocab = {0};
    strmap_alloc(&vocab, 1024);
    size_t off = 0;
    for (int id = 0; id < e->vocab_size; id++) {
        size_t k = (size_t)key_of_id[id];
        size_t len = key_off[k + 1] - key_off[k];
        e->tok_off[id] = (uint32_t)off;
        memcpy(e->tok_bytes + off, keys + key_off[k], len);
        uint64_t h = bpe_hash_bytes(keys + key_off[k], len);
        if (strmap_find(&vocab, keys + key_off[k], len, h) != SIZE_MAX)
            fatal("%s: two keys decode to the same bytes (id %d)", path, id);
        strmap_insert(&vocab, keys + key_off[k], len, h, (uint32_t)id, 0);
        off += len;
    }
    e->tok_off[e->vocab_size] = (uint32_t)off;
    free(keys);
    free(key_off);
    free(key_id);
    free(key_of_id);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        e->byte_id[b] = bpe_vocab_id(&vocab, &c, 1);
        if (e->byte_id[b] < 0) fatal("%s: no token for the single byte 0x%02X", path, b);
    }
    e->eot = bpe_vocab_id(&vocab, (const uint8_t*)"<|endoftext|>", 13);
    if (e->eot < 0) fatal("%s: no <|endoftext|> token", path);

    /* vocab.bpe: a version line, then one merge "left right" a line, best first */
    snprintf(path, plen, "%s/vocab.bpe", vocab_dir);
    buf = bpe_read_file(path, &n);
    e->merge_cap = 1u << 17;
    e->merge_key = xcalloc(e->merge_cap, sizeof(uint64_t));
    e->merge_rank = xmalloc(e->merge_cap * sizeof(int32_t));
    e->merge_id = xmalloc(e->merge_cap * sizeof(int32_t));
    uint8_t* field = xmalloc(n + 1);
    uint8_t* both = xmalloc(n + 1);
    size_t i = 0;
    int line = 1;
    while (i < n && buf[i] != '\n') i++; /* the "#version: 0.2" line */
    while (i < n) {
        i++; /* past '\n' */
        line++;
        size_t le = i;
        while (le < n && buf[le] != '\n') le++;
        size_t fs[3], fe[3];
        int nf = 0;
        for (size_t k = i; k < le;) {
            while (k < le && (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r')) k++;
            if (k >= le) break;
            if (nf == 3) break;
            fs[nf] = k;
            while (k < le && buf[k] != ' ' && buf[k] != '\t' && buf[k] != '\r') k++;
            fe[nf++] = k;
        }
        if (nf != 0) {
            if (nf != 2) fatal("%s line %d: a merge line must hold two tokens", path, line);
            size_t la = bpe_decode_field(buf + fs[0], fe[0] - fs[0], cp_to_byte, both, path, line);
            size_t lb = bpe_decode_field(buf + fs[1], fe[1] - fs[1], cp_to_byte, both + la, path, line);
            int a = bpe_vocab_id(&vocab, both, la);
            memcpy(field, both + la, lb);
            int b = bpe_vocab_id(&vocab, field, lb);
            int m = bpe_vocab_id(&vocab, both, la + lb);
            if (a < 0 || b < 0 || m < 0)
                fatal("%s line %d: the merge or its parts are not in encoder.json", path, line);
            if (e->nmerges + 1 > (int)(e->merge_cap / 2))
                fatal("%s: more than %zu merges", path, e->merge_cap / 2);
            bpe_merge_put(e, a, b, e->nmerges, m);
            e->nmerges++;
        }
        i = le;
    }
    if (e->nmerges == 0) fatal("%s: no merges", path);
    free(field);
    free(both);
    free(buf);
    strmap_free(&vocab);
    free(path);

    strmap_alloc(&e->cache, 1u << 12);
    e->cache_max = 1u << 20;
    e->heap_min_len = 64;
}

void bpe_free(BpeEncoder* e) {
    free(e->tok_bytes);
    free(e->tok_off);
    free(e->merge_key);
    free(e->merge_rank);
    free(e->merge_id);
    strmap_free(&e->cache);
    free(e->cache_tok);
    free(e->sym);
    free(e->nxt);
    free(e->prv);
    free(e->heap);
    free(e->clean);
    memset(e, 0, sizeof *e);
}
