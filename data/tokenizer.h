/* data/tokenizer.h — llm.c's tokenizer file, for decoding samples.
 * Header of 256 uint32: [0]=20240328, [1]=2 (version 1 has no EOT field:
 * EOT is then 50256), [2]=vocab size, [3]=EOT id; then per token one uint8
 * length followed by that many bytes. Errors are fatal() naming the file. */
#ifndef DATA_TOKENIZER_H
#define DATA_TOKENIZER_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    uint32_t vocab_size;
    uint32_t eot;
    char** tokens; /* NUL-terminated byte strings */
    uint8_t* lens;
} Tokenizer;

void tokenizer_init(Tokenizer* t, const char* path);
/* The bytes of token id (not NUL-safe if a token holds a 0 byte: use lens),
 * or NULL for an id out of range. */
const char* tokenizer_decode(const Tokenizer* t, uint32_t id);
/* Write tokens[0..n) as text to f; unprintable single bytes become \xNN. */
void tokenizer_print(const Tokenizer* t, const int* ids, int n, FILE* f);
void tokenizer_free(Tokenizer* t);

#endif
