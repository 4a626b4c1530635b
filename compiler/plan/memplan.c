/* memplan.c - the memory plan of one rank, for every plan.
 *
 * A rank's training step runs its stage once per micro-batch, so a value
 * exists as several instances: (v, m) for every micro-batch m the rank
 * computes or receives it in, and (v, -1) for what exists once per step
 * (parameters, constants, state, gradient accumulators, and values
 * computed or received at micro -1).  Graph inputs have one instance per
 * micro-batch, since the runtime fills every micro-batch's rows before the
 * step.
 *
 * The persistent region holds, 64-byte aligned and in value order, every
 * input (its M micro-batch instances back to back, so that they are the
 * rank's rows of the batch in order), parameter, constant and state the
 * rank holds; then each gradient bucket (dp and hybrid), its gradients
 * packed back to back in bucket order: their accumulators when M > 1,
 * the computed instances themselves when M = 1; then the accumulators of
 * the other gradients it accumulates over micro-batches, then the loss
 * and outputs the rank computes, M instances
 * back to back like the inputs (the runtime reads them after the step:
 * the loss of every micro-batch, the output rows in batch order).
 *
 * Every other instance gets a live interval over the unrolled train
 * sequence, from the step that computes or receives it to the last step
 * that touches it; instances handed to a SEND, and received copies of the
 * loss and outputs, stay live to the end of the step.
 * An in-place op's output takes its input's bytes when that input instance
 * dies at the op.  Intervals are placed largest first at
 * the lowest offset that overlaps no placed instance whose interval
 * intersects.  The eval step runs the same forward units in the same
 * micro-batch order with a subset of the reads and sends, so every eval
 * interval maps into the train interval of the same instance and the one
 * placement serves both. */
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "../ops/ops.h"

enum { NONE = -1, PERSIST = -2 };

int64_t plan_value_bytes(const Value *v) {
    int64_t n = value_numel(v);
    if (n < 0) return -1;
    size_t es = dtype_is_float(v->dtype) ? 4 : dtype_size(v->dtype) == 1 ? 1 : 8;
    return n * (int64_t)es;
}

typedef struct Inst {
    int value, slot;   /* slot: micro-batch + 1 */
    int64_t bytes;     /* plan_value_bytes */
    int64_t size;      /* bytes as placed: aligned, at least PLAN_ALIGN */
    int start, end;    /* first and last train step touching it (for a send, the STEP_SEND_WAIT
                          completing it); n_train: to the end of the step */
    int last_read;     /* last step reading it (start when none) */
    int root;          /* in place: the instance whose bytes it uses (itself when placed on its own) */
    int prev;          /* in place: the instance it took the bytes from, or -1 */
    bool sent, act;
    int64_t fixed;     /* offset in the persistent region (the loss and outputs), or -1 */
    int64_t offset;    /* roots: offset in the transient region */
} Inst;

typedef struct MP {
    Graph *g;
    const Plan *p;
    RankPlan *rp;
    Diag *d;
    int S;           /* slots per value: microbatches + 1 */
    int *where;      /* [v * S + slot]: index in iv, PERSIST (no interval needed) or NONE */
    Inst *iv;
    int n_iv, cap_iv;
} MP;

static int64_t align_up(int64_t x) { return (x + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }

static bool nomem(MP *m) {
    return diag_error(m->d, DIAG_NOMEM, "%s: out of memory planning the memory of rank %d", m->g->path, m->rp->rank);
}

static int *at(MP *m, const Value *v, int slot) { return &m->where[(size_t)v->id * (size_t)m->S + (size_t)slot]; }

/* The slot a step of micro-batch `micro` uses for v, given a test for the
 * slots that exist: its own; failing that, for a per-micro-batch step the
 * once-per-step instance (parameters, constants, state), and for a
 * once-per-step step the instance of micro-batch 0 (with one micro-batch,
 * gradients are not accumulated and the update reads that instance). */
#define PICK_SLOT(has, micro, S)                                                                   \
    ((micro) >= -1 && (micro) + 1 < (S) && has((micro) + 1) ? (micro) + 1                         \
     : (micro) >= 0 && has(0)                               ? 0                                    \
     : (micro) == -1 && (S) > 1 && has(1)                   ? 1                                    \
                                                            : -1)

static int lookup(MP *m, const Value *v, int micro) {
#define HAS(s) (*at(m, v, (s)) != NONE)
    int slot = PICK_SLOT(HAS, micro, m->S);
#undef HAS
    return slot < 0 ? NONE : *at(m, v, slot);
}

/* Each gradient bucket (dp and hybrid plans) is a byte range one in-place
 * sum covers (place_persistent lays it out): no other instance may lie
 * inside. */
static bool bucket_check(const Plan *p, const RankPlan *rp, Diag *d) {
    int S = p->microbatches + 1, slot = S > 2 ? 0 : 1;
    for (int b = 0; b < rp->n_buckets; b++) {
        const Bucket *bk = &rp->buckets[b];
        for (int v = 0; v < p->g->n_values; v++)
            for (int k = 0; k < S; k++) {
                int64_t off = rp->inst[(size_t)v * (size_t)S + (size_t)k];
                bool in_bucket = false;
                for (int j = 0; j < bk->n && !in_bucket; j++) in_bucket = bk->grads[j]->id == v && k == slot;
                if (off >= bk->offset && off < bk->offset + bk->bytes && !in_bucket)
                    return diag_error(d, DIAG_INTERNAL, "rank %d: '%s' lies inside gradient bucket %d", rp->rank,
                                      p->g->values[v]->name, b);
            }
    }
    return true;
}

int64_t pipeline_buffer(const Plan *p, const RankPlan *rp, const Value *v, int micro) {
    if (!rp->inst || !v) return -1;
    int S = p->microbatches + 1;
    const int64_t *row = &rp->inst[(size_t)v->id * (size_t)S];
#define HAS(s) (row[(s)] >= 0)
    int slot = PICK_SLOT(HAS, micro, S);
#undef HAS
    return slot < 0 ? -1 : row[slot];
}

static int find(const Inst *iv, int i) {
    while (iv[i].root != i) i = iv[i].root;
    return i;
}

/* A value's byte size, or a Diag when it has none. */
static bool value_size(MP *m, const Value *v, int64_t *bytes) {
    *bytes = plan_value_bytes(v);
    if (*bytes < 0)
        return diag_error(m->d, DIAG_SHAPE, "%s: value '%s' on rank %d has no static shape; bind --batch", m->g->path,
                          v->name, m->rp->rank);
    return true;
}

/* A new instance with an interval (start -1 until a step defines it). */
static bool new_inst(MP *m, const Value *v, int slot, int step, int64_t fixed) {
    int64_t b;
    if (!value_size(m, v, &b)) return false;
    if (m->n_iv == m->cap_iv) {
        int cap = m->cap_iv ? 2 * m->cap_iv : 256;
        Inst *a = realloc(m->iv, sizeof *a * (size_t)cap);
        if (!a) return nomem(m);
        m->iv = a;
        m->cap_iv = cap;
    }
    const Node *pr = v->producer;
    int i = m->n_iv++;
    *at(m, v, slot) = i;
    m->iv[i] = (Inst){.value = v->id, .slot = slot, .bytes = b, .size = align_up(b ? b : 1), .start = step,
                      .end = step, .last_read = step, .root = i, .prev = -1,
                      .act = slot > 0 && pr && pr->phase <= PHASE_LOSS, .fixed = fixed};
    return true;
}

static bool define(MP *m, const Value *v, int micro, int step) {
    int w = *at(m, v, micro + 1);
    if (w >= 0 && m->iv[w].fixed >= 0 && m->iv[w].start < 0) {
        m->iv[w].start = m->iv[w].end = m->iv[w].last_read = step;
        return true;
    }
    if (w != NONE)
        return diag_error(m->d, DIAG_INTERNAL, "%s: rank %d step %d defines '%s' for micro-batch %d, which already has a buffer",
                          m->g->path, m->rp->rank, step, v->name, micro);
    return new_inst(m, v, micro + 1, step, -1);
}

/* The loss and the outputs, which the runtime reads after the step. */
static bool is_kept(const MP *m, const Value *v) {
    const TrainGraph *t = m->p->t;
    if (v->is_output || (t && (v == t->loss || v == t->output))) return true;
    for (int k = 0; k < m->g->n_outputs; k++)
        if (m->g->outputs[k] == v) return true;
    return false;
}

/* The instance a step reads; a Diag when it has no buffer. */
static bool read_inst(MP *m, const PlanStep *s, int step, const Value *v, const char *which, int *out) {
    *out = lookup(m, v, s->micro);
    if (*out == NONE)
        return diag_error(m->d, DIAG_INTERNAL, "%s: rank %d %s step %d (micro-batch %d) reads '%s', which has no buffer",
                          m->g->path, m->rp->rank, which, step, s->micro, v->name);
    return true;
}

static void touch(MP *m, int i, int step, bool read) {
    if (i < 0) return; /* persistent, no interval */
    Inst *x = &m->iv[i];
    if (step > x->end) x->end = step;
    if (read && step > x->last_read) x->last_read = step;
}

/* Persistent region: inputs (M instances each), parameters, constants and
 * state, then accumulators, then the loss and outputs the rank computes
 * (M instances each). */
static bool place_persistent(MP *m) {
    Graph *g = m->g;
    RankPlan *rp = m->rp;
    int M = m->S - 1;
    int64_t pos = 0;
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = g->values[i];
        if (!(rp->holds[i] & HOLD_PERSISTENT) || v->kind == VAL_INTERMEDIATE) continue;
        int64_t b;
        if (!value_size(m, v, &b)) return false;
        if (v->kind == VAL_INPUT) {
            for (int k = 0; k < M; k++) {
                *at(m, v, k + 1) = PERSIST;
                rp->inst[(size_t)i * (size_t)m->S + (size_t)k + 1] = pos + k * b;
            }
            pos = align_up(pos + (b ? M * b : 1));
        } else {
            *at(m, v, 0) = PERSIST;
            rp->inst[(size_t)i * (size_t)m->S] = pos;
            pos = align_up(pos + (b ? b : 1));
        }
    }
    /* Buckets: their gradients back to back in bucket order, the
     * accumulators with several micro-batches, with one the computed
     * instance itself, so that one in-place sum covers each bucket. */
    for (int b = 0; b < rp->n_buckets; b++) {
        Bucket *bk = &rp->buckets[b];
        bk->offset = pos;
        for (int k = 0; k < bk->n; k++) {
            const Value *v = bk->grads[k];
            int64_t bytes;
            if (!value_size(m, v, &bytes)) return false;
            if (M > 1 && !(rp->holds[v->id] & HOLD_ACCUM))
                return diag_error(m->d, DIAG_INTERNAL, "%s: rank %d: gradient '%s' of bucket %d has no accumulator",
                                  g->path, rp->rank, v->name, b);
            if (M > 1) *at(m, v, 0) = PERSIST;
            else if (!new_inst(m, v, 1, -1, pos)) return false;
            rp->inst[(size_t)v->id * (size_t)m->S + (M > 1 ? 0 : 1)] = pos;
            pos += bytes;
        }
        bk->bytes = pos - bk->offset;
        pos = align_up(pos);
    }
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = g->values[i];
        if (!(rp->holds[i] & HOLD_ACCUM) || rp->inst[(size_t)i * (size_t)m->S] >= 0) continue; /* bucketed */
        if (*at(m, v, 0) != NONE)
            return diag_error(m->d, DIAG_INTERNAL, "%s: rank %d accumulates '%s', which it also holds once per step",
                              g->path, rp->rank, v->name);
        int64_t b;
        if (!value_size(m, v, &b)) return false;
        *at(m, v, 0) = PERSIST;
        rp->inst[(size_t)i * (size_t)m->S] = pos;
        pos = align_up(pos + (b ? b : 1));
    }
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = g->values[i];
        if (!(rp->holds[i] & HOLD_COMPUTED) || v->kind != VAL_INTERMEDIATE || !is_kept(m, v)) continue;
        int64_t b;
        if (!value_size(m, v, &b)) return false;
        for (int k = 0; k < M; k++) {
            if (!new_inst(m, v, k + 1, -1, pos + k * b)) return false;
            rp->inst[(size_t)i * (size_t)m->S + (size_t)k + 1] = pos + k * b;
        }
        pos = align_up(pos + (b ? M * b : 1));
    }
    rp->init_bytes = pos;
    return true;
}

/* Instances, and their intervals over the train sequence. */
static bool intervals(MP *m) {
    const RankPlan *rp = m->rp;
    int n = rp->n_train;
    for (int t = 0; t < n; t++) {
        const PlanStep *s = &rp->train[t];
        if (s->kind == STEP_COMPUTE) {
            for (int k = 0; k < s->node->n_out; k++)
                if (s->node->out[k] && !define(m, s->node->out[k], s->micro, t)) return false;
        } else if (s->kind == STEP_RECV) {
            if (!define(m, s->value, s->micro, t)) return false;
        }
    }
    for (int t = 0; t < n; t++) {
        const PlanStep *s = &rp->train[t];
        int i;
        switch (s->kind) {
        case STEP_COMPUTE:
            for (int k = 0; k < s->node->n_in; k++) {
                if (!s->node->in[k]) continue;
                if (!read_inst(m, s, t, s->node->in[k], "train", &i)) return false;
                touch(m, i, t, true);
            }
            break;
        case STEP_SEND:
            if (!read_inst(m, s, t, s->value, "train", &i)) return false;
            touch(m, i, t, true);
            if (i >= 0) {
                /* untouched until the send completes: the next
                 * STEP_SEND_WAIT, or the end of the step */
                int w = t;
                while (w < n && !(rp->train[w].kind == STEP_SEND_WAIT && rp->train[w].peer == s->peer &&
                                  rp->train[w].tag == s->tag))
                    w++;
                m->iv[i].sent = true;
                if (w > m->iv[i].end) m->iv[i].end = w;
            }
            break;
        case STEP_ACCUMULATE:
            if (!read_inst(m, s, t, s->value, "train", &i)) return false;
            touch(m, i, t, true);
            if (*at(m, s->value, 0) != PERSIST)
                return diag_error(m->d, DIAG_INTERNAL, "%s: rank %d step %d accumulates '%s', which has no accumulator",
                                  m->g->path, rp->rank, t, s->value->name);
            break;
        case STEP_ALLREDUCE:
            if (!read_inst(m, s, t, s->value, "train", &i)) return false;
            touch(m, i, t, true);
            break;
        default:
            break;
        }
    }
    /* the loss and outputs: read by the runtime after the step */
    const Graph *g = m->g;
    for (int i = 0; i < m->n_iv; i++)
        if (is_kept(m, g->values[m->iv[i].value])) m->iv[i].end = n;
    /* every buffer the eval step names is one the train step has */
    for (int t = 0; t < rp->n_eval; t++) {
        const PlanStep *s = &rp->eval[t];
        int i;
        if (s->kind == STEP_COMPUTE) {
            for (int k = 0; k < s->node->n_in; k++)
                if (s->node->in[k] && !read_inst(m, s, t, s->node->in[k], "eval", &i)) return false;
            for (int k = 0; k < s->node->n_out; k++)
                if (s->node->out[k] && *at(m, s->node->out[k], s->micro + 1) == NONE)
                    return diag_error(m->d, DIAG_INTERNAL, "%s: rank %d eval step %d writes '%s' (micro-batch %d), which the train step never computes",
                                      g->path, rp->rank, t, s->node->out[k]->name, s->micro);
        } else if (s->kind == STEP_SEND || s->kind == STEP_RECV) {
            if (!read_inst(m, s, t, s->value, "eval", &i)) return false;
        }
    }
    return true;
}

/* An in-place op's output takes its input's bytes when the input instance
 * (and everything already sharing its bytes) dies at the op. */
static void in_place(MP *m) {
    RankPlan *rp = m->rp;
    for (int t = 0; t < rp->n_train; t++) {
        const PlanStep *s = &rp->train[t];
        if (s->kind != STEP_COMPUTE) continue;
        const Node *n = s->node;
        if (!n->def || !n->def->inplace || n->n_out < 1 || !n->out[0] || n->n_in < 1 || !n->in[0]) continue;
        int x = lookup(m, n->in[0], s->micro), y = *at(m, n->out[0], s->micro + 1);
        if (x < 0 || y < 0 || m->iv[x].fixed >= 0 || m->iv[y].fixed >= 0) continue;
        bool read_twice = false;
        for (int k = 1; k < n->n_in; k++) read_twice |= n->in[k] == n->in[0];
        int r = find(m->iv, x);
        if (read_twice || m->iv[x].end != t || m->iv[r].end != t || m->iv[x].bytes != m->iv[y].bytes) continue;
        m->iv[y].root = r;
        m->iv[y].prev = x;
        if (m->iv[y].end > m->iv[r].end) m->iv[r].end = m->iv[y].end;
        rp->inplace++;
    }
}

/* Placement order: largest first, then by value and slot. */
typedef struct Key {
    int64_t size;
    int value, slot, inst;
} Key;

static int by_size_desc(const void *a, const void *b) {
    const Key *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    if (x->value != y->value) return x->value - y->value;
    return x->slot - y->slot;
}

/* A placed byte range. */
typedef struct Span {
    int64_t offset, size;
} Span;

static int by_offset(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Largest first, each at the lowest offset clear of every placed instance
 * whose interval intersects its own. */
static bool place_transient(MP *m, int64_t *top) {
    Inst *iv = m->iv;
    int n_roots = 0;
    Key *order = malloc(sizeof *order * (size_t)(m->n_iv + 1));
    Span *clash = malloc(sizeof *clash * (size_t)(m->n_iv + 1));
    if (!order || !clash) {
        free(order);
        free(clash);
        return nomem(m);
    }
    for (int i = 0; i < m->n_iv; i++)
        if (iv[i].root == i && iv[i].fixed < 0) order[n_roots++] = (Key){iv[i].size, iv[i].value, iv[i].slot, i};
    qsort(order, (size_t)n_roots, sizeof *order, by_size_desc);
    *top = 0;
    for (int a = 0; a < n_roots; a++) {
        Inst *x = &iv[order[a].inst];
        int n_clash = 0;
        for (int b = 0; b < a; b++) {
            const Inst *y = &iv[order[b].inst];
            if (y->end >= x->start && y->start <= x->end) clash[n_clash++] = (Span){y->offset, y->size};
        }
        qsort(clash, (size_t)n_clash, sizeof *clash, by_offset);
        int64_t off = 0; /* no offset below it fits */
        for (int k = 0; k < n_clash && clash[k].offset < off + x->size; k++)
            if (clash[k].offset + clash[k].size > off) off = clash[k].offset + clash[k].size;
        x->offset = off;
        if (off + x->size > *top) *top = off + x->size;
    }
    free(order);
    free(clash);
    return true;
}

/* Bytes of activations (forward and loss values of a micro-batch) alive
 * at each train step, counting an instance from the step that defines it
 * to the last step that reads it. */
static bool peak_activations(MP *m) {
    RankPlan *rp = m->rp;
    int n = rp->n_train;
    rp->peak_act_bytes = 0;
    rp->peak_act_step = -1;
    int64_t *delta = calloc((size_t)n + 2, sizeof *delta);
    if (!delta) return nomem(m);
    for (int i = 0; i < m->n_iv; i++) {
        const Inst *x = &m->iv[i];
        if (!x->act || x->start < 0) continue;
        int s = x->start, e = x->last_read;
        if (x->prev >= 0 && m->iv[x->prev].act) s++; /* its input held these bytes at step start */
        if (s > e) continue;
        delta[s] += x->bytes;
        delta[e + 1] -= x->bytes;
    }
    int64_t live = 0;
    for (int t = 0; t < n; t++) {
        live += delta[t];
        if (live > rp->peak_act_bytes) {
            rp->peak_act_bytes = live;
            rp->peak_act_step = t;
        }
    }
    free(delta);
    return true;
}

bool pipeline_memplan(const Plan *p, RankPlan *rp, Diag *d) {
    Graph *g = p->g;
    int nv = g->n_values, S = p->microbatches + 1;
    if (p->microbatches < 1 || !rp->holds)
        return diag_error(d, DIAG_INTERNAL, "%s: rank %d: memory planning needs a plan with steps", g->path, rp->rank);
    size_t cells = (size_t)nv * (size_t)S;
    if (S > 0 && cells / (size_t)S != (size_t)nv)
        return diag_error(d, DIAG_LIMIT, "%s: %d values x %d micro-batches is too many", g->path, nv, p->microbatches);
    MP m = {g, p, rp, d, S, NULL, NULL, 0, 0};
    rp->inst = ARENA_ARRAY(&g->arena, int64_t, cells ? cells : 1);
    rp->offset = ARENA_ARRAY(&g->arena, int64_t, nv ? nv : 1);
    m.where = malloc(sizeof *m.where * (cells ? cells : 1));
    if (!rp->inst || !rp->offset || !m.where) {
        free(m.where);
        return nomem(&m);
    }
    for (size_t k = 0; k < cells; k++) {
        rp->inst[k] = -1;
        m.where[k] = NONE;
    }
    rp->inplace = 0;
    rp->transient_naive = 0;
    rp->send_pinned_bytes = 0;
    int64_t top = 0;
    bool ok = place_persistent(&m) && intervals(&m);
    if (ok) {
        in_place(&m);
        ok = place_transient(&m, &top);
    }
    if (ok) {
        for (int i = 0; i < m.n_iv; i++) {
            const Inst *x = &m.iv[i];
            if (x->sent) rp->send_pinned_bytes += x->bytes;
            if (x->fixed >= 0) continue;
            rp->inst[(size_t)x->value * (size_t)S + (size_t)x->slot] = rp->init_bytes + m.iv[find(m.iv, i)].offset;
            rp->transient_naive += x->size;
        }
        for (int v = 0; v < nv; v++) {
            const int64_t *row = &rp->inst[(size_t)v * (size_t)S];
            rp->offset[v] = row[0] >= 0 ? row[0] : row[1];
        }
        rp->arena_bytes = rp->init_bytes + top;
        ok = peak_activations(&m) && bucket_check(p, rp, m.d);
    }
    free(m.where);
    free(m.iv);
    return ok;
}
