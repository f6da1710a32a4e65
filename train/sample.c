/* train/sample.c — see sample.h. */
#include "sample.h"

#include <math.h>

int sample_token(const float* row, int V, Rng* r) {
    double mx = row[0];
    for (int i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    double u = (double)rng_uniform(r) * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += exp((double)row[i] - mx);
        if (acc > u) return i;
    }
    return V - 1;
}
