/* memplan.c - placing every runtime tensor in the program's arena.
 *
 * Persistent values (inputs, initializers, constants, state) are laid out
 * first, in value order, and form the initial image.  Transient values get
 * a live interval [definition, last use] over the train order and are
 * placed greedily, largest first, at the lowest offset that overlaps no
 * placed value with an intersecting interval. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "../ops/ops.h"

int64_t plan_value_bytes(const Value *v) {
    int64_t n = value_numel(v);
    if (n < 0) return -1;
    size_t es = dtype_is_float(v->dtype) ? 4 : dtype_size(v->dtype) == 1 ? 1 : 8;
    return n * (int64_t)es;
}

static int64_t align_up(int64_t x) { return (x + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }

typedef struct Interval {
    int id;
    int64_t bytes, start, end, offset;
} Interval;

static int by_size_desc(const void *a, const void *b) {
    const Interval *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->id - y->id;
}

static bool is_persistent(const Value *v) {
    return v->kind != VAL_INTERMEDIATE;
}

bool memplan_assign(Graph *g, RankPlan *r, Value *const *keep, int n_keep, Diag *d) {
    int nv = g->n_values;
    r->offset = ARENA_ARRAY(&g->arena, int64_t, nv);
    int64_t *first = malloc(sizeof *first * (size_t)nv), *last = malloc(sizeof *last * (size_t)nv);
    Interval *iv = malloc(sizeof *iv * (size_t)nv);
    if (!r->offset || !first || !last || !iv) {
        free(first); free(last); free(iv);
        return diag_error(d, DIAG_NOMEM, "%s: out of memory planning memory", g->path);
    }
    for (int i = 0; i < nv; i++) {
        r->offset[i] = -1;
        first[i] = last[i] = -1;
    }
    /* Liveness over the train order; graph outputs stay live to the end so
     * the runtime can read them after the step. */
    for (int s = 0; s < r->n_train; s++) {
        const Node *n = r->train[s].node;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]) last[n->in[k]->id] = s;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k]) {
                if (first[n->out[k]->id] < 0) first[n->out[k]->id] = s;
                if (last[n->out[k]->id] < s) last[n->out[k]->id] = s;
            }
    }
    for (int i = 0; i < g->n_outputs; i++) last[g->outputs[i]->id] = r->n_train;
    for (int i = 0; i < n_keep; i++)
        if (keep[i]) last[keep[i]->id] = r->n_train;
    int64_t pos = 0;
    for (int i = 0; i < nv; i++) {
        const Value *v = g->values[i];
        if (!is_persistent(v) || (last[i] < 0 && v->kind != VAL_INPUT && v->kind != VAL_STATE && v->kind != VAL_INITIALIZER))
            continue;
        int64_t b = plan_value_bytes(v);
        if (b < 0) {
            free(first); free(last); free(iv);
            return diag_error(d, DIAG_SHAPE, "%s: value '%s' has no static shape; bind --batch", g->path, v->name);
        }
        r->offset[i] = pos;
        pos = align_up(pos + (b ? b : 1));
    }
    /* Bucketed gradients: dense and contiguous per bucket, so that one
     * in-place collective covers a bucket. */
    for (int b = 0; b < r->n_buckets; b++) {
        Bucket *bk = &r->buckets[b];
        bk->offset = pos;
        for (int k = 0; k < bk->n; k++) {
            r->offset[bk->grads[k]->id] = pos;
            pos += plan_value_bytes(bk->grads[k]);
        }
        bk->bytes = pos - bk->offset;
        pos = align_up(pos);
    }
    r->init_bytes = pos;
    /* In place: an output that may reuse its dying input's buffer joins the
     * input's interval (the union is placed once, as its root). */
    int *root = malloc(sizeof *root * (size_t)nv);
    if (!root) {
        free(first); free(last); free(iv);
        return diag_error(d, DIAG_NOMEM, "%s: out of memory planning memory", g->path);
    }
    for (int i = 0; i < nv; i++) root[i] = i;
    for (int s = 0; s < r->n_train; s++) {
        const Node *n = r->train[s].node;
        if (!n->def || !n->def->inplace || n->n_out < 1 || !n->out[0] || !n->in[0]) continue;
        int x = n->in[0]->id, y = n->out[0]->id;
        while (root[x] != x) x = root[x];
        const Value *xv = g->values[n->in[0]->id];
        if (is_persistent(xv) || r->offset[n->in[0]->id] >= 0 || last[n->in[0]->id] != s || last[x] != s) continue;
        /* An output already placed (a bucketed gradient) keeps its place. */
        if (plan_value_bytes(xv) != plan_value_bytes(n->out[0]) || is_persistent(n->out[0]) ||
            r->offset[n->out[0]->id] >= 0)
            continue;
        bool read_twice = false; /* x also read through another input slot */
        for (int k = 1; k < n->n_in; k++) read_twice |= n->in[k] == n->in[0];
        if (read_twice) continue;
        root[y] = x;
        if (last[y] > last[x]) last[x] = last[y];
        r->inplace++;
    }
    int n_iv = 0;
    for (int i = 0; i < nv; i++) {
        const Value *v = g->values[i];
        if (is_persistent(v) || first[i] < 0 || r->offset[i] >= 0) continue;
        if (root[i] != i) {
            r->transient_naive += align_up(plan_value_bytes(v) ? plan_value_bytes(v) : 1);
            continue;
        }
        int64_t b = plan_value_bytes(v);
        if (b < 0) {
            free(first); free(last); free(iv);
            return diag_error(d, DIAG_SHAPE, "%s: value '%s' has no static shape", g->path, v->name);
        }
        iv[n_iv++] = (Interval){i, align_up(b ? b : 1), first[i], last[i], 0};
        r->transient_naive += align_up(b ? b : 1);
    }
    qsort(iv, (size_t)n_iv, sizeof *iv, by_size_desc);
    int64_t top = 0;
    for (int a = 0; a < n_iv; a++) {
        /* candidate offsets: 0 and the end of every conflicting placement */
        int64_t best = -1;
        for (int cnd = -1; cnd < a; cnd++) {
            int64_t off = cnd < 0 ? 0 : iv[cnd].offset + iv[cnd].bytes;
            if (cnd >= 0 && (iv[cnd].end < iv[a].start || iv[cnd].start > iv[a].end)) continue;
            bool clash = false;
            for (int b = 0; b < a && !clash; b++) {
                if (iv[b].end < iv[a].start || iv[b].start > iv[a].end) continue;
                clash = off < iv[b].offset + iv[b].bytes && iv[b].offset < off + iv[a].bytes;
            }
            if (!clash && (best < 0 || off < best)) best = off;
        }
        iv[a].offset = best;
        if (best + iv[a].bytes > top) top = best + iv[a].bytes;
        r->offset[iv[a].id] = r->init_bytes + best;
    }
    for (int i = 0; i < nv; i++) {
        int x = i;
        while (root[x] != x) x = root[x];
        if (x != i) r->offset[i] = r->offset[x];
    }
    r->arena_bytes = r->init_bytes + top;
    free(root);
    free(first); free(last); free(iv);
    return true;
}
