/* dp.c - the data-parallel plan: every rank runs the single-rank step on
 * its share of the batch, and gradients are summed across ranks in buckets
 * that overlap with the rest of the backward pass, as PyTorch DDP does. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

bool memplan_assign(Graph *g, RankPlan *r, Value *const *keep, int n_keep, Diag *d);

/* Index of the parameter whose gradient v is, or -1. */
static int grad_index(const TrainGraph *t, const Value *v) {
    for (int i = 0; i < t->n_params; i++)
        if (t->grads[i] == v) return i;
    return -1;
}

/* Buckets in order of production: a bucket closes when it reaches the
 * byte cap, so the first bucket (the last layers) can start while the
 * earlier layers' gradients are still being computed. */
static bool make_buckets(Graph *g, const TrainGraph *t, RankPlan *rp, int64_t cap, int *done_at, Diag *d) {
    rp->buckets = ARENA_ARRAY(&g->arena, Bucket, t->n_params ? t->n_params : 1);
    Value **order = ARENA_ARRAY(&g->arena, Value *, t->n_params ? t->n_params : 1);
    if (!rp->buckets || !order) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    int n_order = 0;
    for (int s = 0; s < rp->n_train; s++) {
        const Node *n = rp->train[s].node;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] && grad_index(t, n->out[k]) >= 0) order[n_order++] = n->out[k];
    }
    int64_t bytes = 0;
    Bucket *cur = NULL;
    for (int i = 0; i < n_order; i++) {
        if (!cur || bytes >= cap) {
            cur = &rp->buckets[rp->n_buckets++];
            cur->grads = order + i;
            cur->n = 0;
            bytes = 0;
        }
        cur->n++;
        bytes += plan_value_bytes(order[i]);
    }
    /* the step after which each bucket is complete */
    for (int b = 0; b < rp->n_buckets; b++) {
        done_at[b] = -1;
        for (int s = 0; s < rp->n_train; s++) {
            const Node *n = rp->train[s].node;
            for (int k = 0; k < n->n_out; k++)
                for (int j = 0; j < rp->buckets[b].n; j++)
                    if (n->out[k] == rp->buckets[b].grads[j] && s > done_at[b]) done_at[b] = s;
        }
    }
    return true;
}

/* Rebuilds the train sequence with a start after each bucket completes and
 * a wait before the first optimizer step that reads one of its gradients. */
static bool insert_collectives(Graph *g, RankPlan *rp, const int *done_at, Diag *d) {
    int n = rp->n_train, nb = rp->n_buckets;
    PlanStep *seq = ARENA_ARRAY(&g->arena, PlanStep, n + 2 * nb + 1);
    bool *waited = calloc((size_t)nb + 1, sizeof *waited);
    if (!seq || !waited) {
        free(waited);
        return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    }
    int k = 0;
    for (int s = 0; s < n; s++) {
        const Node *node = rp->train[s].node;
        for (int b = 0; b < nb; b++) {
            if (waited[b]) continue;
            bool reads = false;
            for (int i = 0; i < node->n_in && !reads; i++)
                for (int j = 0; j < rp->buckets[b].n; j++) reads |= node->in[i] == rp->buckets[b].grads[j];
            if (reads) {
                seq[k++] = (PlanStep){STEP_ALLREDUCE_WAIT, NULL, b, .group = -1};
                waited[b] = true;
            }
        }
        seq[k++] = rp->train[s];
        for (int b = 0; b < nb; b++)
            if (done_at[b] == s) seq[k++] = (PlanStep){STEP_ALLREDUCE_START, NULL, b, .group = -1};
    }
    for (int b = 0; b < nb; b++) /* buckets no optimizer reads (none today) */
        if (!waited[b]) seq[k++] = (PlanStep){STEP_ALLREDUCE_WAIT, NULL, b, .group = -1};
    free(waited);
    rp->train = seq;
    rp->n_train = k;
    return true;
}

bool plan_dp(Graph *g, const TrainGraph *t, int64_t batch, int replicas, double bucket_mb, Plan *p, Diag *d) {
    if (!plan_single(g, t, batch / replicas, p, d)) return false;
    p->strategy = "dp";
    p->batch = batch;
    p->local_batch = batch / replicas;
    p->n_ranks = p->replicas = replicas;
    p->bucket_mb = bucket_mb;
    RankPlan *rp = &p->ranks[0];
    int *done_at = calloc((size_t)t->n_params + 1, sizeof *done_at);
    if (!done_at) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    int64_t cap = (int64_t)(bucket_mb * 1024 * 1024);
    bool ok = make_buckets(g, t, rp, cap > 0 ? cap : 1, done_at, d);
    /* Memory: gradients pinned contiguously per bucket (memplan places
     * them in the persistent region in bucket order). */
    if (ok) {
        rp->offset = NULL;
        ok = memplan_assign(g, rp, (Value *const[]){t->loss, t->output}, 2, d);
    }
    if (ok) ok = insert_collectives(g, rp, done_at, d);
    free(done_at);
    /* every rank runs the same program */
    RankPlan *all = ARENA_ARRAY(&g->arena, RankPlan, replicas);
    if (ok && !all) ok = diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    if (ok) {
        for (int r = 0; r < replicas; r++) {
            all[r] = *rp;
            all[r].rank = r;
        }
        p->ranks = all;
    }
    return ok;
}
