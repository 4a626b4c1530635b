/* nic.c - busy timelines of the nodes' links (nic.h).  A timeline is a
 * sorted array of disjoint intervals; a booking scans it from the start,
 * which is cheap for the few hundred transfers a step puts on one node's
 * link. */
#include "nic.h"

#include <stdlib.h>
#include <string.h>

bool nics_init(Nics *x, int nodes) {
    memset(x, 0, sizeof *x);
    x->tx = calloc((size_t)nodes, sizeof *x->tx);
    x->rx = calloc((size_t)nodes, sizeof *x->rx);
    if (!x->tx || !x->rx) {
        nics_free(x);
        return false;
    }
    x->nodes = nodes;
    return true;
}

void nics_clear(Nics *x) {
    for (int i = 0; i < x->nodes; i++) x->tx[i].n = x->rx[i].n = 0;
    x->failed = false;
}

static void line_free(NicLine *l) {
    free(l->t0);
    free(l->t1);
}

void nics_free(Nics *x) {
    for (int i = 0; x->tx && i < x->nodes; i++) line_free(&x->tx[i]);
    for (int i = 0; x->rx && i < x->nodes; i++) line_free(&x->rx[i]);
    free(x->tx);
    free(x->rx);
    memset(x, 0, sizeof *x);
}

/* The end of the first interval of l overlapping [t, t + dur), or t when
 * none does (intervals only touching it do not overlap). */
static double first_clash(const NicLine *l, double t, double dur) {
    for (int i = 0; i < l->n; i++) {
        if (l->t0[i] >= t + dur) break;
        if (l->t1[i] > t) return l->t1[i];
    }
    return t;
}

/* Marks [t0, t1) busy on l, which first_clash found free. */
static void occupy(Nics *x, NicLine *l, double t0, double t1) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        double *a = realloc(l->t0, sizeof *a * (size_t)cap);
        if (a) l->t0 = a;
        double *b = a ? realloc(l->t1, sizeof *b * (size_t)cap) : NULL;
        if (b) l->t1 = b;
        if (!a || !b) {
            x->failed = true;
            return;
        }
        l->cap = cap;
    }
    int at = l->n;
    while (at > 0 && l->t0[at - 1] > t0) at--;
    memmove(l->t0 + at + 1, l->t0 + at, sizeof *l->t0 * (size_t)(l->n - at));
    memmove(l->t1 + at + 1, l->t1 + at, sizeof *l->t1 * (size_t)(l->n - at));
    l->t0[at] = t0;
    l->t1[at] = t1;
    l->n++;
}

double nics_book(Nics *x, int src, int dst, double t, double dur) {
    if (!(dur > 0)) return t;
    NicLine *a = &x->tx[src], *b = &x->rx[dst];
    /* Each move only goes forward, past an interval in the way. */
    for (;;) {
        double u = first_clash(a, t, dur);
        u = first_clash(b, u, dur);
        if (u == t) break;
        t = u;
    }
    occupy(x, a, t, t + dur);
    occupy(x, b, t, t + dur);
    return t;
}

double nics_book_one(Nics *x, int node, bool rx, double t, double dur) {
    if (!(dur > 0)) return t;
    NicLine *l = rx ? &x->rx[node] : &x->tx[node];
    for (double u; (u = first_clash(l, t, dur)) != t;) t = u;
    occupy(x, l, t, t + dur);
    return t + dur;
}
