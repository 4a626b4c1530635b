/* cg_fuse.c - chains of element-wise nodes fused into one loop.
 *
 * A run of consecutive compute steps of one program whose nodes are
 * element-wise (OpDef.scalar), float32 throughout and of one output shape,
 * each node after the first reading a value an earlier one made, runs as
 * one kernel: a single pass over the elements computes every node's value
 * in registers, reads the chain's outside inputs once, and stores only the
 * values that something outside the chain reads.  Each value is rounded to
 * float32 exactly as the separate kernels round it (no fast-math flags), so
 * fusing changes no bit of any result: the separate kernels stay in the
 * module and a chain may be fused in one call and not in another.
 *
 * The memory plan placed the chain's values for separate kernels, which
 * finish one node before the next starts.  The fused loop computes the
 * same values only when none of its stores lands on bytes it reads later;
 * cg_fuse_scan checks the buffers of every call of a chain (every program,
 * pass and micro-batch) and leaves the chain unfused when one call could.
 *
 * The eval step fuses as well the ops whose eval kernel is element-wise
 * (OpDef.eval_scalar: batch normalisation on its running statistics,
 * which then runs in the blocks of the convolution before it) and steps
 * over the nodes its eval kernels skip (the batch statistics between
 * them), which run nothing there.
 *
 * A kernel working in blocks of rows may also be followed by a reduction
 * over its output that takes it block by block (OpDef.cg_rows: the sum
 * of a batch normalisation's statistics after a convolution), in the
 * order of the reduction's own kernel.  Such a pair is a chain of two
 * whose second node is a "tail".  It is fused in the train steps only
 * (the eval steps skip the statistics) and on one thread: with --threads
 * the head's blocks run on several threads at once, and their sums would
 * need an order of their own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_fuse.h"
#include "cg_gemm.h"
#include "../ops/ops.h"
#include "../plan/pipeline.h"

/* A chain's nodes, and its kernel's buffers (below CG_MAX_BUFS: the
 * chains fused were measured at this bound). */
enum { MAX_CHAIN = 32, FUSE_MAX_BUFS = 16 };

typedef struct Chain {
    int n;
    const Node *nodes[MAX_CHAIN];
    /* nodes[0] is a kernel finishing its output in blocks of rows (a
     * convolution, OpDef.cg_blocks) and the rest of the chain runs on each
     * block as it is done */
    bool head;
    /* nodes[1] is a reduction taking the head's blocks (OpDef.cg_rows) */
    bool tail;
    int pass; /* 0: the train step's, 1: the eval step's (scalar_of) */
    /* kernel buffers: the outside inputs of the element-wise nodes, the
     * stored outputs, then the head's inputs */
    int n_in, n_out, n_hin;
    const Value *bufs[FUSE_MAX_BUFS];
    bool bcast[FUSE_MAX_BUFS];    /* input read through broadcasting by some node */
    uint32_t chan;                /* bit i: input i has one value per channel (OpDef.channel_inputs) */
    int first_reader[FUSE_MAX_BUFS], last_reader[FUSE_MAX_BUFS]; /* chain positions reading input i */
    int maker[FUSE_MAX_BUFS];     /* chain position making output i */
    bool shared[FUSE_MAX_BUFS];   /* overlaps another buffer in some call */
    /* differ[a][b] (a < b): not the same bytes in some call; those that are
     * in every call share one pointer in the kernel (cg_kernel_begin_as) */
    bool differ[FUSE_MAX_BUFS][FUSE_MAX_BUFS];
    bool unsafe;                /* some call's stores overwrite bytes it still reads */
    CgKernel k;
} Chain;

struct CgFuse {
    int n_chains, cap;
    Chain *chains;
    int n_seq;
    int **start; /* per (program, pass): chain index starting at each step, or -1 */
    int **span;  /* per (program, pass): the steps the chain starting there stands for */
    int *uses;   /* per value id: input slots reading it over the whole graph */
};

static int seq_index(int prog, int pass) { return prog * 2 + pass; }

static bool same_dims(const Value *a, const Value *b) {
    if (a->rank != b->rank) return false;
    for (int j = 0; j < a->rank; j++)
        if (a->dims[j].k != b->dims[j].k) return false;
    return true;
}

/* The scalar function of n's kernel in a pass (0: train, 1: eval), or
 * NULL: an op with an eval kernel of its own has its eval_scalar there. */
static CgScalarFn scalar_of(const Node *n, int pass) {
    if (!n->def) return NULL;
    return pass == 1 && n->def->cg_eval ? n->def->eval_scalar : n->def->scalar;
}

/* A node whose kernel in this pass is element-wise, float32, making
 * output 0 alone (an eval_scalar's node may have more outputs, which its
 * eval kernel does not make: BatchNormTrain's saved statistics). */
static bool fusable(const Cg *c, const Node *n, int pass) {
    if (!scalar_of(n, pass) || !c->kernels[n->id].fn) return false;
    bool eval_form = pass == 1 && n->def->cg_eval;
    if ((n->n_out != 1 && !eval_form) || !n->out[0] || n->out[0]->dtype != DT_FLOAT || !value_shape_known(n->out[0]))
        return false;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && n->in[i]->dtype != DT_FLOAT) return false;
    return true;
}

/* A node that can head a chain: its kernel finishes float32 output 0 a
 * block of rows at a time, the same kernel in the train and eval steps. */
static bool heads(Cg *c, const Node *n) {
    if (!n->def || !n->def->cg_blocks || n->def->cg_eval || !c->kernels[n->id].fn) return false;
    if (n->n_out != 1 || !n->out[0] || n->out[0]->dtype != DT_FLOAT || n->out[0]->rank < 1) return false;
    return value_shape_known(n->out[0]) && n->def->cg_blocks(c, n, NULL);
}

static int chain_pos(const Chain *ch, const Value *v) {
    for (int j = 0; j < ch->n; j++)
        if (ch->nodes[j]->out[0] == v) return j;
    return -1;
}

static int buf_index(const Chain *ch, const Value *v, int from, int to) {
    for (int i = from; i < to; i++)
        if (ch->bufs[i] == v) return i;
    return -1;
}

/* Whether the chain's output at position j is read only inside the chain:
 * then it lives in a register and is never stored. */
static bool internal(const Cg *c, const CgFuse *f, const Chain *ch, int j) {
    const Value *v = ch->nodes[j]->out[0];
    const TrainGraph *t = c->plan->t;
    if (v->kind != VAL_INTERMEDIATE || v->is_output || (t && (v == t->loss || v == t->output))) return false;
    int in_chain = 0;
    for (int m = 0; m < ch->n; m++)
        for (int i = 0; i < ch->nodes[m]->n_in; i++) in_chain += ch->nodes[m]->in[i] == v;
    return in_chain > 0 && in_chain == f->uses[v->id];
}

/* Fills the buffer lists of a chain whose nodes are set; false when they
 * are more than a kernel takes. */
static bool chain_buffers(const Cg *c, const CgFuse *f, Chain *ch) {
    const Value *dom = ch->nodes[0]->out[0];
    ch->n_in = ch->n_out = ch->n_hin = 0;
    ch->chan = 0;
    for (int j = ch->head; j < ch->n; j++) {
        const Node *nd = ch->nodes[j];
        for (int i = 0; i < nd->n_in; i++) {
            const Value *x = nd->in[i];
            if (!x || chain_pos(ch, x) >= 0) continue;
            bool per_channel = nd->def->channel_inputs >> i & 1;
            int b = buf_index(ch, x, 0, ch->n_in);
            if (b < 0) {
                if (ch->n_in == FUSE_MAX_BUFS) return false;
                b = ch->n_in++;
                ch->bufs[b] = x;
                ch->bcast[b] = false;
                ch->first_reader[b] = j;
                ch->chan |= (uint32_t)per_channel << b;
            } else if (per_channel != (ch->chan >> b & 1)) {
                return false; /* one buffer read per channel and numpy's way: two indices */
            }
            ch->bcast[b] |= !same_dims(x, dom);
            ch->last_reader[b] = j;
        }
    }
    for (int j = 0; j < ch->n; j++) {
        /* the head's kernel stores its output whoever reads it */
        if (!(ch->head && j == 0) && internal(c, f, ch, j)) continue;
        if (ch->n_in + ch->n_out == FUSE_MAX_BUFS) return false;
        ch->bufs[ch->n_in + ch->n_out] = ch->nodes[j]->out[0];
        ch->maker[ch->n_in + ch->n_out] = j;
        ch->n_out++;
    }
    const Node *h = ch->nodes[0];
    for (int i = 0; ch->head && i < h->n_in; i++) {
        int at = ch->n_in + ch->n_out;
        if (!h->in[i] || buf_index(ch, h->in[i], at, at + ch->n_hin) >= 0) continue;
        if (at + ch->n_hin == FUSE_MAX_BUFS) return false;
        ch->bufs[at + ch->n_hin++] = h->in[i];
    }
    return true;
}

/* Whether buffers a and b (a stored output among them) may share bytes
 * in a call: an outside input may share its bytes with an output only
 * exactly (in place), when every node reading it reads element i at step
 * i and comes no later than the node storing the output: element i is
 * then read before it is overwritten, and never again.  The head's output
 * may share exactly with another output, which is stored after the head's
 * element has been read.  Nothing may land on the head's inputs, which
 * the head's kernel reads again for later blocks. */
static bool may_overlap(const Chain *ch, int a, int b, bool exact) {
    int outs = ch->n_in + ch->n_out;
    bool a_out = a >= ch->n_in && a < outs, b_out = b >= ch->n_in && b < outs;
    if (a_out && b_out) return exact && ch->head && (ch->maker[a] == 0 || ch->maker[b] == 0);
    int in = a_out ? b : a, out = a_out ? a : b;
    if (in >= outs) return false;
    return exact && !ch->bcast[in] && ch->last_reader[in] <= ch->maker[out];
}

/* One call of the chain with its buffers where this program has them:
 * marks overlapping buffers shared, and the chain unsafe when a store can
 * land on bytes the kernel reads afterwards (may_overlap). */
static void check_call(const Cg *c, Chain *ch, const RankPlan *rp, int micro) {
    int nb = ch->n_in + ch->n_out + ch->n_hin, outs = ch->n_in + ch->n_out;
    int64_t off[FUSE_MAX_BUFS], len[FUSE_MAX_BUFS];
    for (int i = 0; i < nb; i++) {
        off[i] = pipeline_buffer(c->plan, rp, ch->bufs[i], micro);
        len[i] = plan_value_bytes(ch->bufs[i]);
        if (off[i] < 0) ch->unsafe = true;
    }
    for (int a = 0; a < nb; a++)
        for (int b = a + 1; b < nb; b++) ch->differ[a][b] |= off[a] != off[b] || len[a] != len[b];
    for (int a = 0; a < nb && !ch->unsafe; a++)
        for (int b = a + 1; b < nb; b++) {
            bool overlap = off[a] < off[b] + len[b] && off[b] < off[a] + len[a];
            if (!overlap) continue;
            ch->shared[a] = ch->shared[b] = true;
            bool a_read = a < ch->n_in || a >= outs, b_read = b < ch->n_in || b >= outs;
            if (a_read && b_read) continue; /* both only read */
            if (!may_overlap(ch, a, b, off[a] == off[b] && len[a] == len[b])) {
                ch->unsafe = true;
                break;
            }
        }
}

/* The chain already found with the same nodes computing the same way
 * (the same scalar functions, which differ between the passes for a node
 * with an eval kernel of its own), if any. */
static int find_chain(const CgFuse *f, const Chain *ch) {
    for (int i = 0; i < f->n_chains; i++) {
        const Chain *o = &f->chains[i];
        if (o->n != ch->n || o->tail != ch->tail || memcmp(o->nodes, ch->nodes, sizeof(ch->nodes[0]) * (size_t)ch->n))
            continue;
        bool same = true;
        for (int j = o->head; j < o->n && same; j++)
            same = scalar_of(o->nodes[j], o->pass) == scalar_of(ch->nodes[j], ch->pass);
        if (same) return i;
    }
    return -1;
}

/* Whether step st is a reduction that can take head's output block by
 * block, in the same micro-batch and unit of work. */
static bool takes_rows(Cg *c, const PlanStep *st0, const PlanStep *st) {
    const Node *nd = st->node;
    if (st->kind != STEP_COMPUTE || st->micro != st0->micro || !nd->def || !nd->def->cg_rows) return false;
    if (plan_step_unit(c->plan, st) != plan_step_unit(c->plan, st0) || !c->kernels[nd->id].fn) return false;
    return nd->n_in >= 1 && nd->in[0] == st0->node->out[0] && nd->n_out == 1 && nd->def->cg_rows->takes(nd);
}

/* Whether step st runs nothing in the eval step (its eval kernel emits
 * none: the batch statistics between a convolution and the batch norm
 * that reads them in training), so that an eval chain may step over it. */
static bool idle(const Cg *c, const PlanStep *st, int pass) {
    const Node *nd = st->node;
    return pass == 1 && st->kind == STEP_COMPUTE && nd->def && nd->def->cg_eval && !c->eval_kernels[nd->id].fn;
}

/* The chain starting at step s of a program's sequence (pass 0: train,
 * 1: eval), if any: in *span the steps it stands for, its nodes' and
 * idle ones between them.  Staged plans keep a chain inside one unit of
 * work (one micro-batch's forward or backward), which the traces time. */
static bool chain_at(Cg *c, const CgFuse *f, const PlanStep *steps, int n, int s, int pass, Chain *ch, int *span) {
    const PlanStep *st0 = &steps[s];
    if (st0->kind != STEP_COMPUTE) return false;
    bool head = !fusable(c, st0->node, pass) && heads(c, st0->node);
    if (!head && !fusable(c, st0->node, pass)) return false;
    const Plan *p = c->plan;
    memset(ch, 0, sizeof *ch);
    ch->head = head;
    ch->pass = pass;
    ch->nodes[0] = st0->node;
    ch->n = 1;
    if (head && pass == 0 && cg_threads(c) == 1 && s + 1 < n && takes_rows(c, st0, &steps[s + 1])) {
        ch->tail = true;
        ch->nodes[ch->n++] = steps[s + 1].node;
        *span = 2;
        return chain_buffers(c, f, ch);
    }
    const Value *dom = st0->node->out[0];
    int last = s;
    for (int t = s + 1; t < n && ch->n < MAX_CHAIN; t++) {
        const PlanStep *st = &steps[t];
        if (st->kind != STEP_COMPUTE || st->micro != st0->micro) break;
        if (plan_step_unit(p, st) != plan_step_unit(p, st0)) break;
        if (idle(c, st, pass)) continue;
        if (!fusable(c, st->node, pass)) break;
        const Node *nd = st->node;
        if (!same_dims(nd->out[0], dom)) break;
        bool reads = false;
        for (int i = 0; i < nd->n_in; i++) reads |= nd->in[i] && chain_pos(ch, nd->in[i]) >= 0;
        if (!reads) break;
        ch->nodes[ch->n++] = nd;
        if (!chain_buffers(c, f, ch)) {
            ch->n--;
            break;
        }
        last = t;
    }
    *span = last - s + 1;
    return ch->n >= 2 && chain_buffers(c, f, ch);
}

static bool scan_seq(Cg *c, CgFuse *f, const RankPlan *rp, const PlanStep *steps, int n, int pass, int *start,
                     int *span) {
    for (int s = 0; s < n; s++) start[s] = -1;
    for (int s = 0; s < n;) {
        Chain ch;
        if (!chain_at(c, f, steps, n, s, pass, &ch, &span[s])) {
            s++;
            continue;
        }
        int i = find_chain(f, &ch);
        if (i < 0) {
            if (f->n_chains == f->cap) {
                int cap = f->cap ? 2 * f->cap : 16;
                Chain *nc = realloc(f->chains, sizeof *nc * (size_t)cap);
                if (!nc) return diag_error(c->d, DIAG_NOMEM, "out of memory fusing element-wise chains");
                f->chains = nc;
                f->cap = cap;
            }
            i = f->n_chains++;
            f->chains[i] = ch;
        }
        check_call(c, &f->chains[i], rp, steps[s].micro);
        start[s] = i;
        s += span[s];
    }
    return true;
}

static void chain_body(Cg *c, void *ctx, LLVMValueRef out_idx, const LLVMValueRef *in_idx) {
    const Chain *ch = ctx;
    LLVMValueRef val[MAX_CHAIN];
    if (ch->head) val[0] = cg_load(c, ch->nodes[0]->out[0], out_idx); /* stored by the head */
    for (int j = ch->head; j < ch->n; j++) {
        const Node *nd = ch->nodes[j];
        LLVMValueRef x[FUSE_MAX_BUFS];
        int k = 0;
        for (int i = 0; i < nd->n_in; i++) {
            const Value *v = nd->in[i];
            if (!v) continue;
            int pos = chain_pos(ch, v);
            if (pos >= 0 && pos < j) {
                x[k++] = val[pos];
            } else {
                int b = buf_index(ch, v, 0, ch->n_in);
                x[k++] = cg_load(c, v, in_idx[b]);
            }
        }
        val[j] = scalar_of(nd, ch->pass)(c, nd, x);
        int o = buf_index(ch, nd->out[0], ch->n_in, ch->n_in + ch->n_out);
        if (o >= 0) cg_store(c, nd->out[0], out_idx, val[j]);
    }
}

/* The element-wise part of a headed chain over the rows the head has
 * just finished. */
static void chain_block(Cg *c, void *ctx, LLVMValueRef row0, int64_t rows) {
    Chain *ch = ctx;
    cg_ew_nest_rows(c, ch->nodes[0]->out[0], row0, rows, ch->n_in, ch->bufs, ch->chan, chain_body, ch);
}

/* The tail's reduction over the rows the head has just finished. */
static void tail_block(Cg *c, void *ctx, LLVMValueRef row0, int64_t rows) {
    const Node *t = ((Chain *)ctx)->nodes[1];
    t->def->cg_rows->rows(c, t, row0, rows);
}

static bool build_chain(Cg *c, Chain *ch) {
    char name[96];
    const Node *h = ch->nodes[0];
    snprintf(name, sizeof name, "f%d_%s_x%d", h->id, h->op_type, ch->n);
    int nb = ch->n_in + ch->n_out + ch->n_hin, alias[FUSE_MAX_BUFS];
    for (int b = 0; b < nb; b++) {
        alias[b] = -1;
        for (int a = 0; a < b && alias[b] < 0; a++)
            if (!ch->differ[a][b]) alias[b] = a;
    }
    if (!cg_kernel_begin_as(c, &ch->k, name, h, nb, ch->bufs, ch->shared, alias)) return false;
    if (ch->tail) {
        const Node *t = ch->nodes[1];
        CgEpilogue epi = {tail_block, ch};
        t->def->cg_rows->begin(c, t);
        h->def->cg_blocks(c, h, &epi);
        t->def->cg_rows->end(c, t);
    } else if (ch->head) {
        CgEpilogue epi = {chain_block, ch};
        h->def->cg_blocks(c, h, &epi);
    } else {
        cg_ew_nest(c, h->out[0], ch->n_in, ch->bufs, ch->chan, chain_body, ch);
    }
    cg_kernel_end(c);
    return !diag_failed(c->d);
}

bool cg_fuse_scan(Cg *c, int n_programs) {
    const Plan *p = c->plan;
    CgFuse *f = calloc(1, sizeof *f);
    if (!f) return diag_error(c->d, DIAG_NOMEM, "out of memory fusing element-wise chains");
    c->fuse = f;
    f->n_seq = 2 * n_programs;
    f->start = calloc((size_t)f->n_seq, sizeof *f->start);
    f->span = calloc((size_t)f->n_seq, sizeof *f->span);
    f->uses = calloc((size_t)p->g->n_values + 1, sizeof *f->uses);
    if (!f->start || !f->span || !f->uses)
        return diag_error(c->d, DIAG_NOMEM, "out of memory fusing element-wise chains");
    GRAPH_FOR_NODES(p->g, nd) {
        for (int i = 0; i < nd->n_in; i++)
            if (nd->in[i]) f->uses[nd->in[i]->id]++;
    }
    for (int k = 0; k < n_programs; k++) {
        const RankPlan *rp = plan_stage_rank(p, k);
        for (int pass = 0; pass < 2; pass++) {
            const PlanStep *steps = pass ? rp->eval : rp->train;
            int n = pass ? rp->n_eval : rp->n_train;
            size_t len = (size_t)(n ? n : 1);
            int *start = malloc(sizeof *start * len), *span = malloc(sizeof *span * len);
            f->start[seq_index(k, pass)] = start;
            f->span[seq_index(k, pass)] = span;
            if (!start || !span) return diag_error(c->d, DIAG_NOMEM, "out of memory fusing element-wise chains");
            if (!scan_seq(c, f, rp, steps, n, pass, start, span)) return false;
        }
    }
    for (int i = 0; i < f->n_chains; i++)
        if (!f->chains[i].unsafe && !build_chain(c, &f->chains[i])) return false;
    return true;
}

const CgKernel *cg_fused_at(const Cg *c, int prog, int pass, int s, int *n_steps) {
    const CgFuse *f = c->fuse;
    if (!f || seq_index(prog, pass) >= f->n_seq) return NULL;
    int i = f->start[seq_index(prog, pass)][s];
    if (i < 0 || f->chains[i].unsafe) return NULL;
    *n_steps = f->span[seq_index(prog, pass)][s];
    return &f->chains[i].k;
}

void cg_fuse_stats(const Cg *c, int *chains, int *nodes, int *headed, int *tails, int *unfused) {
    *chains = *nodes = *headed = *tails = *unfused = 0;
    const CgFuse *f = c->fuse;
    for (int i = 0; f && i < f->n_chains; i++) {
        if (f->chains[i].unsafe) {
            (*unfused)++;
            continue;
        }
        if (f->chains[i].tail) {
            (*tails)++;
            continue;
        }
        (*chains)++;
        *nodes += f->chains[i].n;
        *headed += f->chains[i].head;
    }
}

void cg_fuse_free(CgFuse *f) {
    if (!f) return;
    for (int i = 0; f->start && i < f->n_seq; i++) free(f->start[i]);
    for (int i = 0; f->span && i < f->n_seq; i++) free(f->span[i]);
    free(f->start);
    free(f->span);
    free(f->uses);
    free(f->chains);
    free(f);
}
