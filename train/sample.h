/* train/sample.h — drawing the next token from the model's logits, for text
 * samples during training (pipeline_sample runs the model). */
#ifndef TRAIN_SAMPLE_H
#define TRAIN_SAMPLE_H

#include "../common/util.h"

/* A token drawn from softmax(row[0..V)) (temperature 1) with one uniform
 * number from r: the same row and generator state give the same token. */
int sample_token(const float* row, int V, Rng* r);

#endif
