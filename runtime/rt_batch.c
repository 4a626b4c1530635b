/* rt_batch.c - which rows make up each batch, and copying them into the
 * input slots.
 *
 * The order of epoch e (0-based) over N rows, P_e:
 *   - without --shuffle, the identity: P_e[k] = k;
 *   - with --shuffle SEED, a Fisher-Yates shuffle of the identity driven by
 *     splitmix64 with the state seeded to SEED * 1000003 + e (mod 2^64):
 *         P = [0, 1, ..., N-1]
 *         for i = N-1 down to 1:
 *             j = next() % (i + 1)
 *             swap P[i], P[j]
 *     where next() is splitmix64 below.  (The modulo has a bias of at most
 *     N / 2^64, far below anything a test or a model can see.)
 * Step i of the epoch (0-based) uses the rows P_e[(i*B + r) mod N] for
 * r = 0 .. B-1, so the last batch of an epoch wraps around to its start.
 * runtime/README.md repeats this so that tests can replay it. */
#include <stdlib.h>
#include <string.h>

#include "rt.h"

uint64_t rt_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

bool rt_order_init(RtOrder *o, int64_t n, bool shuffle, uint64_t seed, RtErr *e) {
    memset(o, 0, sizeof *o);
    o->n = n;
    o->shuffle = shuffle;
    o->seed = seed;
    if (!shuffle) return true;
    o->perm = malloc((size_t)n * sizeof *o->perm);
    if (!o->perm) return rt_error(e, "out of memory for the row order of %lld rows", (long long)n);
    rt_order_epoch(o, 0);
    return true;
}

void rt_order_epoch(RtOrder *o, int64_t epoch) {
    if (!o->shuffle) return;
    int64_t *p = o->perm;
    for (int64_t k = 0; k < o->n; k++) p[k] = k;
    uint64_t state = o->seed * 1000003ull + (uint64_t)epoch;
    for (int64_t i = o->n - 1; i >= 1; i--) {
        int64_t j = (int64_t)(rt_splitmix64(&state) % (uint64_t)(i + 1));
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

void rt_order_free(RtOrder *o) {
    free(o->perm);
    memset(o, 0, sizeof *o);
}

int64_t rt_batch_row(const RtOrder *o, int64_t batch, int64_t step, int64_t r) {
    /* step < ceil(N / B), so step * B + r < N + B: no overflow for any N
     * that fits in memory. */
    int64_t k = (step * batch + r) % o->n;
    return o->perm ? o->perm[k] : k;
}

void rt_batch_fill(const RtOrder *o, const RtTensor *slots, const RtArray *data, int n,
                   int64_t batch, int64_t step, int64_t r0, int64_t r1, char *arena) {
    for (int k = 0; k < n; k++) {
        const RtArray *a = &data[k];
        if (slots[k].absent) continue; /* another stage reads this input */
        char *dst = arena + slots[k].offset;
        if (slots[k].positions) { /* the rows' positions in the global batch */
            for (int64_t r = r0; r < r1; r++) memcpy(dst + (size_t)(r - r0) * sizeof r, &r, sizeof r);
            continue;
        }
        for (int64_t r = r0; r < r1; r++) {
            int64_t row = rt_batch_row(o, batch, step, r);
            memcpy(dst + (size_t)(r - r0) * a->row_bytes, (const char *)a->data + (size_t)row * a->row_bytes,
                   a->row_bytes);
        }
    }
}
