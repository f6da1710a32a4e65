/* train/sample.h — text generation from the model, for a look at how
 * training goes. */
#ifndef TRAIN_SAMPLE_H
#define TRAIN_SAMPLE_H

#include <stdint.h>
#include "../data/tokenizer.h"
#include "../model/gpt2.h"

/* Prints up to ntokens tokens sampled from the model (softmax of the logits,
 * temperature 1) after the end-of-text token, with a generator seeded by
 * `seed`: the same seed gives the same text. Runs forward on batch 1 of up to
 * T positions, overwriting the model's activations. */
void sample_text(GPT2* m, const Tokenizer* tok, int ntokens, int T, uint64_t seed);

#endif
