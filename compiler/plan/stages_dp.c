/* stages_dp.c - stages balanced on compute, communication and memory.
 *
 * stages_balance (stages.c) splits a row of weights so that the heaviest
 * part is as light as possible.  When the cost model prices the split,
 * a stage also pays for the values that cross its two boundaries (a
 * boundary between positions x - 1 and x moves every value produced
 * before x and read from x on, forward as an activation and back as its
 * gradient), and a stage must fit its rank's memory (parameters with
 * their gradients and optimizer state, plus the activations its schedule
 * keeps alive).  Neither term is a sum of per-position weights, so this is
 * the plain dynamic programme over (stage, end), O(k n^2): affordable for
 * the few thousand forward nodes of real models; larger graphs keep
 * stages_balance. */
#include <math.h>
#include <stdlib.h>

#include "pipeline.h"

/* Largest k n^2 this file takes on; above it the caller falls back. */
#define STAGES_DP_MAX_WORK 6e7

/* Seconds stage j (0-based) spends on positions [x, i) per micro-batch:
 * compute plus, at each boundary it owns, the crossing values sent one
 * way and their gradients the other. */
static double part_cost(const StageCosts *c, const double *S, int k, int j, int x, int i) {
    double t = S[i] - S[x];
    if (j > 0) t += 2 * (c->cut_values[x] * c->latency[j - 1] + c->cut_bytes[x] * c->sec_per_byte[j - 1]);
    if (j < k - 1) t += 2 * (c->cut_values[i] * c->latency[j] + c->cut_bytes[i] * c->sec_per_byte[j]);
    return t;
}

static bool part_fits(const StageCosts *c, const double *P, const double *A, int j, int x, int i) {
    if (!(c->memory_limit > 0)) return true;
    double bytes = c->param_copies * (P[i] - P[x]) + c->act_copies[j] * (A[i] - A[x]);
    return bytes <= c->memory_limit;
}

static bool within(double x, double bound) { return x <= bound * (1 + 1e-12) + 1e-15; }

/* Best split of positions [0, n) into k non-empty parts, honouring
 * memory when `memory`; false when no split qualifies. */
static bool solve(const StageCosts *c, const double *S, const double *P, const double *A, int k, bool memory,
                  int *begin) {
    int n = c->n;
    size_t cells = (size_t)(k + 1) * (size_t)(n + 1);
    double *best = malloc(sizeof *best * cells), *sq = malloc(sizeof *sq * cells);
    int *from = malloc(sizeof *from * cells);
    bool ok = best && sq && from;
#define AT(a, j, i) a[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
    if (ok) {
        for (size_t q = 0; q < cells; q++) best[q] = sq[q] = INFINITY;
        AT(best, 0, 0) = 0;
        /* Pass 1: the least possible bottleneck over every split. */
        for (int j = 1; j <= k; j++)
            for (int i = j; i <= n - (k - j); i++)
                for (int x = j - 1; x < i; x++) {
                    if (!isfinite(AT(best, j - 1, x)) || (memory && !part_fits(c, P, A, j - 1, x, i))) continue;
                    double m = fmax(AT(best, j - 1, x), part_cost(c, S, k, j - 1, x, i));
                    if (m < AT(best, j, i)) AT(best, j, i) = m;
                }
        double bottleneck = AT(best, k, n);
        ok = isfinite(bottleneck);
        /* Pass 2: within that bottleneck, the most even split (least sum
         * of squared stage costs), the earliest cut on ties. */
        if (ok) {
            AT(sq, 0, 0) = 0;
            for (int j = 1; j <= k; j++)
                for (int i = j; i <= n - (k - j); i++)
                    for (int x = j - 1; x < i; x++) {
                        double base = AT(sq, j - 1, x);
                        if (!isfinite(base) || (memory && !part_fits(c, P, A, j - 1, x, i))) continue;
                        double part = part_cost(c, S, k, j - 1, x, i);
                        if (!within(part, bottleneck)) continue;
                        double v = base + part * part;
                        if (v < AT(sq, j, i) * (1 - 1e-12) || !isfinite(AT(sq, j, i))) {
                            AT(sq, j, i) = v;
                            AT(from, j, i) = x;
                        }
                    }
            ok = isfinite(AT(sq, k, n));
        }
        if (ok) {
            begin[k] = n;
            for (int j = k; j >= 1; j--) begin[j - 1] = AT(from, j, begin[j]);
        }
    }
#undef AT
    free(best);
    free(sq);
    free(from);
    return ok;
}

int stages_balance_costs(const StageCosts *c, int k, int *begin) {
    int n = c->n;
    if (k < 1 || k > n || (double)k * n * n > STAGES_DP_MAX_WORK) return -1;
    double *S = malloc(sizeof *S * (size_t)(n + 1)), *P = malloc(sizeof *P * (size_t)(n + 1)),
           *A = malloc(sizeof *A * (size_t)(n + 1));
    int status = -1;
    if (S && P && A) {
        S[0] = P[0] = A[0] = 0;
        for (int i = 0; i < n; i++) {
            S[i + 1] = S[i] + (c->seconds[i] > 0 ? c->seconds[i] : 0);
            P[i + 1] = P[i] + (c->param_bytes ? c->param_bytes[i] : 0);
            A[i + 1] = A[i] + (c->act_bytes ? c->act_bytes[i] : 0);
        }
        /* Over memory everywhere: the split that would be best without the
         * limit, so that the search can say by how much it is over. */
        if (solve(c, S, P, A, k, true, begin)) status = 1;
        else if (solve(c, S, P, A, k, false, begin)) status = 0;
    }
    free(S);
    free(P);
    free(A);
    return status;
}
