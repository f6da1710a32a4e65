/* data/tokenizer.c — owns the llm.c tokenizer-file reader declared in
 * tokenizer.h (validation, id -> bytes) and the printing of decoded text,
 * which keeps valid UTF-8 (also when a character spans several tokens) and
 * escapes every other byte that is not printable ASCII, '\n' or '\t', as \xNN. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

#define TOKENIZER_MAGIC 20240328u
#define TOKENIZER_HEADER_INTS 256
#define TOKENIZER_HEADER_BYTES (TOKENIZER_HEADER_INTS * 4)
#define TOKENIZER_V1_EOT 50256u

static uint32_t tokenizer_le32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void tokenizer_init(Tokenizer* t, const char* path) {
    memset(t, 0, sizeof *t);
    FILE* f = xfopen(path, "rb");
    long long size = file_size(f);
    if (size < 0) fatal("%s: cannot determine the file size", path);
    if (size < TOKENIZER_HEADER_BYTES)
        fatal("%s: truncated: file is %lld bytes, shorter than the %d-byte tokenizer header", path, size,
              TOKENIZER_HEADER_BYTES);
    /* The whole file in memory: tokenizer files are under a megabyte. */
    unsigned char* buf = (unsigned char*)xmalloc((size_t)size);
    xfread(buf, 1, (size_t)size, f, path);
    fclose(f);

    uint32_t magic = tokenizer_le32(buf + 0);
    uint32_t version = tokenizer_le32(buf + 4);
    uint32_t vocab = tokenizer_le32(buf + 8);
    if (magic != TOKENIZER_MAGIC)
        fatal("%s: wrong magic number %u (expected %u): not an llm.c tokenizer file", path, magic,
              TOKENIZER_MAGIC);
    if (version != 1 && version != 2)
        fatal("%s: unsupported tokenizer version %u (expected 1 or 2)", path, version);
    if (vocab == 0) fatal("%s: tokenizer vocab size is 0", path);
    uint32_t eot = version == 1 ? TOKENIZER_V1_EOT : tokenizer_le32(buf + 12);
    if (version == 2 && eot >= vocab) /* v1 stores no EOT: 50256 is implied */
        fatal("%s: end-of-text id %u is not below the vocab size %u: corrupt tokenizer file", path, eot, vocab);

    /* every token takes at least 2 bytes (its length, at least 1 byte): check before allocating */
    if ((uint64_t)vocab * 2 > (uint64_t)size - TOKENIZER_HEADER_BYTES)
        fatal("%s: truncated: the header says %u tokens, but the %lld bytes after the header hold at most %lld",
              path, vocab, size - TOKENIZER_HEADER_BYTES, (size - TOKENIZER_HEADER_BYTES) / 2);
    t->vocab_size = vocab;
    t->eot = eot;
    t->tokens = (char**)xcalloc(vocab, sizeof(char*));
    t->lens = (uint8_t*)xcalloc(vocab, 1);
    size_t off = TOKENIZER_HEADER_BYTES;
    for (uint32_t i = 0; i < vocab; i++) {
        if (off >= (size_t)size) fatal("%s: truncated: file ends at token %u of %u", path, i, vocab);
        uint8_t len = buf[off++];
        if (len == 0) fatal("%s: token %u has length 0: corrupt tokenizer file", path, i);
        if ((size_t)size - off < len)
            fatal("%s: truncated: token %u needs %u bytes, only %zu left", path, i, (unsigned)len,
                  (size_t)size - off);
        t->tokens[i] = (char*)xmalloc((size_t)len + 1);
        memcpy(t->tokens[i], buf + off, len);
        t->tokens[i][len] = '\0';
        t->lens[i] = len;
        off += len;
    }
    if (off != (size_t)size)
        fatal("%s: %zu unexpected bytes after the last of %u tokens: corrupt tokenizer file", path,
              (size_t)size - off, vocab);
    free(buf);
}

const char* tokenizer_decode(const Tokenizer* t, uint32_t id) {
    if (id >= t->vocab_size) return NULL;
    return t->tokens[id];
}

/* Length of the valid UTF-8 multibyte sequence starting at p (at most n bytes
 * available), or 0 if none starts there. Rejects overlong forms, surrogates
 * and code points above U+10FFFF. */
static size_t tokenizer_utf8_len(const unsigned char* p, size_t n) {
    unsigned char c = p[0];
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0Fu;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07u;
    } else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3Fu);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return len;
}

void tokenizer_print(const Tokenizer* t, const int* ids, int n, FILE* f) {
    /* Concatenate first, so a character split across tokens is kept whole.
     * An id outside the vocabulary prints as <|bad id N|>. */
    size_t cap = 256, len = 0;
    unsigned char* buf = (unsigned char*)xmalloc(cap);
    for (int k = 0; k < n; k++) {
        char tmp[48];
        const char* src;
        size_t l;
        if (ids[k] >= 0 && (uint32_t)ids[k] < t->vocab_size) {
            src = t->tokens[ids[k]];
            l = t->lens[ids[k]];
        } else {
            snprintf(tmp, sizeof tmp, "<|bad id %d|>", ids[k]);
            src = tmp;
            l = strlen(tmp);
        }
        if (len + l > cap) {
            while (len + l > cap) cap *= 2;
            unsigned char* nb = (unsigned char*)xmalloc(cap);
            memcpy(nb, buf, len);
            free(buf);
            buf = nb;
        }
        memcpy(buf + len, src, l);
        len += l;
    }
    for (size_t i = 0; i < len;) {
        unsigned char c = buf[i];
        if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7F)) {
            fputc(c, f);
            i++;
            continue;
        }
        size_t u = tokenizer_utf8_len(buf + i, len - i);
        if (u > 0) {
            fwrite(buf + i, 1, u, f);
            i += u;
        } else {
            fprintf(f, "\\x%02x", c);
            i++;
        }
    }
    free(buf);
}

void tokenizer_free(Tokenizer* t) {
    if (t->tokens)
        for (uint32_t i = 0; i < t->vocab_size; i++) free(t->tokens[i]);
    free(t->tokens);
    free(t->lens);
    memset(t, 0, sizeof *t);
}
