/* ops_batchnorm.c - BatchNormalization in its inference and training
 * forms, and the internal ops of domain "cleave" that train it.
 *
 * Inference form: Y = (X - mean) / sqrt(var + eps) * scale + B with the
 * running statistics (inputs 3 and 4, state), and the BatchNormGrad
 * gradient.
 *
 * Training form (training_mode=1 from opset 15; before it, the running
 * statistics' outputs requested), as torch.nn.BatchNorm*d in train mode:
 * the train_form rule replaces the node with
 *   BatchNormStats(X) -> S1                  sum x, per channel
 *   BatchNormStats(X, S1) -> S2              sum (x - mean)^2
 *   BatchNormTrain(X, scale, B, S1, S2, running_mean, running_var) -> Y, MI
 *   BatchNormRunning(running_mean, running_var, S1, S2)   (once per step)
 * and the backward pass of BatchNormTrain is
 *   BatchNormGradStats(dY, X, MI) -> G, dScale, dB
 *   BatchNormGradInput(dY, X, MI, scale, G) -> dX
 * with G = [sum dY, sum dY * (x - mean)] ([2, C]).  S1, S2 and G are sums
 * over this rank's rows; with "replicas" R > 1 the plan sums them over the
 * R data-parallel replicas right after the node that computes them
 * (OpDef.replica_sums), so every replica normalises with the statistics
 * of the global batch and dp trains as one process does.  "count" is the
 * number of values per channel the sums then cover.  With micro-batches,
 * each is normalised with its own statistics and the running statistics
 * are updated once per step from the whole batch's (BatchNormMoment,
 * docs/pipeline.md).  MI = [mean, 1 /
 * sqrt(var + eps)] ([2, C]) is what the backward pass reads.  The eval
 * step runs BatchNormTrain's inference kernel on the running statistics
 * and skips BatchNormStats.
 *
 * The variance is a second pass over the centred values, and every sum
 * runs in double within a kernel, as PyTorch's CPU kernels compute float32
 * batch statistics; the sums are stored (and summed over replicas) in
 * float32.
 *
 * The kernels walk X in memory order (sample, channel, position), not
 * channel by channel: the late layers of a CNN have one to sixteen
 * positions per channel, and a channel's values then lie C floats apart,
 * which no vector reads.  Per-channel coefficients are computed first
 * into a scratch array; sums go into one double accumulator per
 * (channel, position), which the walk updates contiguously, and each
 * channel's accumulators are added up in order at the end.  The order of
 * every sum depends on the shapes alone. */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_cg.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg_gemm.h"

/* ==== shapes ==== */

/* X, scale, B, mean, var.  The optional outputs are statistics of length
 * C: running mean and variance (training mode), and before opset 14 also
 * the saved batch mean and variance; means take the type of input 3 and
 * variances that of input 4. */
static bool infer_batchnorm(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    if (x->rank < 2) return op_error(c, n, "input rank %d; at least 2 required", x->rank);
    if (c->opset < 9 && node_attr_i(n, "spatial", 1) == 0)
        return op_error_kind(c, n, DIAG_UNSUPPORTED,
                             "spatial=0 (statistics per element, not per channel) is not supported");
    int max_out = c->opset >= 14 ? 3 : 5;
    if (n->n_out > max_out)
        return op_error_kind(c, n, DIAG_GRAPH, "has %d outputs; opset %lld allows at most %d", n->n_out,
                             (long long)c->opset, max_out);
    Dim ch = x->dims[1];
    for (int i = 1; i < n->n_in; i++) {
        const Value *p = n->in[i];
        if (!p) continue;
        if (p->rank != 1 || (dim_is_const(p->dims[0]) && dim_is_const(ch) && p->dims[0].k != ch.k)) {
            char cs[64];
            return op_error(c, n, "'%s' must be 1-D of length C = %s", p->name, dim_str(c->g, ch, cs, sizeof cs));
        }
    }
    same_as_input(n, 0, 0);
    for (int k = 1; k < n->n_out; k++) set_out(n, k, n->in[k % 2 ? 3 : 4]->dtype, 1, &ch);
    return true;
}

/* Output k: dtype t, shape [rows, C] with C input x's dimension 1. */
static void set_stats(Node *n, int k, DType t, int rows, const Value *x) {
    Dim d[2] = {dim_const(rows), x->dims[1]};
    set_out(n, k, t, 2, d);
}

static bool infer_bn_stats(OpCtx *c, Node *n) {
    (void)c;
    Dim ch = n->in[0]->dims[1];
    set_out(n, 0, DT_FLOAT, 1, &ch);
    return true;
}

static bool infer_bn_train(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 0);
    set_stats(n, 1, DT_FLOAT, 2, n->in[0]);
    return true;
}

static bool infer_none(OpCtx *c, Node *n) {
    (void)c;
    (void)n;
    return true;
}

static bool infer_bn_grad_stats(OpCtx *c, Node *n) {
    (void)c;
    set_stats(n, 0, DT_FLOAT, 2, n->in[1]);
    Dim ch = n->in[1]->dims[1];
    set_out(n, 1, DT_FLOAT, 1, &ch);
    set_out(n, 2, DT_FLOAT, 1, &ch);
    return true;
}

static bool infer_like_input(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 0);
    return true;
}

static bool infer_bn_grad_input(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 1);
    return true;
}

static bool infer_bn_grad(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 1);
    same_as_input(n, 1, 2);
    same_as_input(n, 2, 2);
    return true;
}

static double flops_norm(const Node *n) { return flops_per_out_elem(n, 5); }

/* Reads of every element of input i, `per` operations each. */
static double flops_in(const Node *n, int i, double per) {
    int64_t e = value_numel(n->in[i]);
    return e < 0 ? 0 : per * (double)e;
}

static double flops_stats(const Node *n) { return flops_in(n, 0, 3); }
static double flops_grad_stats(const Node *n) { return flops_in(n, 1, 4); }
static double flops_grad_input(const Node *n) { return flops_in(n, 1, 6); }
static double flops_norm_grad(const Node *n) { return flops_in(n, 0, 8); }
static double flops_running(const Node *n) { return flops_in(n, 0, 6); }

/* ==== the training form ==== */

/* Whether the node normalises with its batch's statistics: training_mode
 * from opset 15, the running statistics' outputs requested before. */
static bool bn_training(const Graph *g, const Node *n) {
    int64_t opset = graph_opset(g, ""); /* 0: graphs built in memory, of the current opset */
    if (opset == 0 || opset >= 15) return node_attr_i(n, "training_mode", 0) != 0;
    for (int k = 1; k < n->n_out; k++)
        if (n->out[k]) return true;
    return false;
}

/* A reader of v among the live nodes, or NULL. */
static const Node *reader_of(const Graph *g, const Value *v) {
    GRAPH_FOR_NODES(g, r) {
        for (int k = 0; k < r->n_in; k++)
            if (r->in[k] == v) return r;
    }
    return NULL;
}

/* True (with the Diag set) when the node is a form cleave does not
 * compute in this context: training_mode outside training, or the
 * statistics' outputs read by anything. */
static bool bn_refused(Diag *d, const Graph *g, const Node *n, bool training) {
    if (!training && bn_training(g, n)) {
        diag_error(d, DIAG_UNSUPPORTED,
                   "%s: node '%s' (BatchNormalization): the training form (batch statistics) is only computed when "
                   "training; export the model in eval mode for inference",
                   g->path, n->name);
        return true;
    }
    for (int k = 1; k < n->n_out; k++) {
        const Value *v = n->out[k];
        const Node *r = v ? reader_of(g, v) : NULL;
        if (v && (r || v->is_output)) {
            diag_error(d, DIAG_UNSUPPORTED,
                       "%s: node '%s' (BatchNormalization): output %d ('%s') is read by %s; only Y is computed (the "
                       "running statistics are updated in place)",
                       g->path, n->name, k, v->name, r ? r->name : "the graph's outputs");
            return true;
        }
    }
    return false;
}

/* Values per channel in this rank's X (batch and spatial dims). */
static int64_t per_channel(const Value *x) {
    int64_t e = 1;
    for (int j = 0; j < x->rank; j++)
        if (j != 1) e *= x->dims[j].k;
    return e;
}

static void set_group(GradCtx *c, Node *s, int64_t count) {
    gb_attr_i(c, s, "replicas", c->stat_replicas);
    gb_attr_i(c, s, "count", count);
}

static bool bn_train_form(GradCtx *c, Node *n) {
    Graph *g = c->g;
    if (!bn_training(g, n)) return true;
    if (bn_refused(c->d, g, n, true)) return false;
    Value *X = n->in[0];
    if (!value_shape_known(X))
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (BatchNormalization): batch statistics need a static "
                          "input shape", g->path, n->name);
    int64_t count = per_channel(X) * c->stat_replicas;
    if (count < 2)
        return diag_error(c->d, DIAG_SHAPE, "%s: node '%s' (BatchNormalization): training needs more than one value "
                          "per channel, and a batch of this size gives %lld", g->path, n->name, (long long)count);
    c->phase = PHASE_FORWARD;
    c->origin = NULL;
    c->train->n_batch_stats++;
    Node *st = gb_start(c, "cleave", "BatchNormStats", 1, &X, 1);
    set_group(c, st, count);
    Value *S1 = gb_finish(c, st);
    Value *centred[2] = {X, S1};
    st = gb_start(c, "cleave", "BatchNormStats", 2, centred, 1);
    set_group(c, st, count);
    Value *S2 = gb_finish(c, st);
    Value *in[7] = {X, n->in[1], n->in[2], S1, S2, n->in[3], n->in[4]};
    Node *t = gb_start(c, "cleave", "BatchNormTrain", 7, in, 2);
    if (!t) return false;
    gb_attr_f(c, t, "epsilon", node_attr_f(n, "epsilon", 1e-5f));
    gb_attr_i(c, t, "count", count);
    if (!gb_finish_replacing(c, t, n)) return false;
    /* The running statistics move once per step, with the updates. */
    /* With micro-batches each normalises with its own statistics, as in
     * GPipe, and the running statistics take the whole batch's once per
     * step (torchgpipe's deferred batch norm): the plan sums S1, S2 and
     * Q = count (mean - K)^2 over the micro-batches, K the running mean
     * (fixed until the update), and the whole batch's sum of squared
     * deviations is sum S2 + sum Q - M count (batch mean - K)^2.  The
     * shift K keeps that difference small where the running mean tracks
     * the batch's. */
    Value *Q = NULL;
    if (c->microbatches > 1) {
        Value *moment[2] = {S1, n->in[3]};
        Node *q = gb_start(c, "cleave", "BatchNormMoment", 2, moment, 1);
        gb_attr_i(c, q, "count", count);
        Q = gb_finish(c, q);
    }
    c->phase = PHASE_OPTIMIZER;
    c->origin = t;
    Value *upd[5] = {n->in[3], n->in[4], S1, S2, Q};
    Node *r = gb_start(c, "cleave", "BatchNormRunning", Q ? 5 : 4, upd, 0);
    /* ONNX's momentum weighs the running value; torch's the batch's. */
    gb_attr_f(c, r, "momentum", 1.0f - node_attr_f(n, "momentum", 0.9f));
    gb_attr_i(c, r, "count", count * c->microbatches);
    gb_finish(c, r);
    c->origin = NULL;
    return !diag_failed(c->d);
}

/* ==== gradients ==== */

/* Inference form: mean and var are state, so only X, scale and B get
 * gradients, from one BatchNormGrad node. */
static bool g_batchnorm(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (bn_refused(c->d, c->g, n, false)) return false;
    if (!need[0] && !need[1] && !need[2]) return true;
    Value *in[5] = {dy[0], n->in[0], n->in[1], n->in[3], n->in[4]};
    Node *g = gb_start(c, "cleave", "BatchNormGrad", 5, in, 3);
    if (!g) return false;
    gb_attr_f(c, g, "epsilon", node_attr_f(n, "epsilon", 1e-5f));
    if (!gb_finish(c, g)) return false;
    for (int i = 0; i < 3; i++)
        if (need[i]) dx[i] = g->out[i];
    return true;
}

/* Training form: X, scale and B.  The statistics S1 and S2 are functions
 * of X whose effect the formula for dX already holds, so they get
 * nothing. */
static bool g_bn_train(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!dy[0] || (!need[0] && !need[1] && !need[2])) return true;
    Value *in[3] = {dy[0], n->in[0], n->out[1]};
    Node *gs = gb_start(c, "cleave", "BatchNormGradStats", 3, in, 3);
    if (!gs) return false;
    set_group(c, gs, node_attr_i(n, "count", 0));
    if (!gb_finish(c, gs)) return false;
    if (need[1]) dx[1] = gs->out[1];
    if (need[2]) dx[2] = gs->out[2];
    if (need[0]) {
        Value *gin[5] = {dy[0], n->in[0], n->out[1], n->in[1], gs->out[0]};
        Node *gi = gb_start(c, "cleave", "BatchNormGradInput", 5, gin, 1);
        gb_attr_i(c, gi, "count", node_attr_i(n, "count", 0));
        dx[0] = gb_finish(c, gi);
    }
    return !diag_failed(c->d);
}

/* ==== kernels ==== */

static LLVMValueRef to_d(Cg *c, LLVMValueRef x) { return LLVMBuildFPExt(c->b, x, c->t_f64, ""); }
static LLVMValueRef to_f(Cg *c, LLVMValueRef x) { return LLVMBuildFPTrunc(c->b, x, c->t_f32, ""); }
static LLVMValueRef const_d(Cg *c, double x) { return LLVMConstReal(c->t_f64, x); }
static LLVMValueRef sqrt_d(Cg *c, LLVMValueRef x) {
    LLVMTypeRef t = c->t_f64, ft = LLVMFunctionType(t, &t, 1, 0);
    LLVMValueRef f = LLVMGetNamedFunction(c->mod, "llvm.sqrt.f64");
    if (!f) f = LLVMAddFunction(c->mod, "llvm.sqrt.f64", ft);
    return LLVMBuildCall2(c->b, ft, f, &x, 1, "");
}
static LLVMValueRef slot_d(Cg *c, double x) {
    LLVMValueRef s = cg_alloca(c, c->t_f64);
    LLVMBuildStore(c->b, const_d(c, x), s);
    return s;
}
static LLVMValueRef get_d(Cg *c, LLVMValueRef slot) { return LLVMBuildLoad2(c->b, c->t_f64, slot, ""); }
/* *slot += x */
static void add_d(Cg *c, LLVMValueRef slot, LLVMValueRef x) { LLVMBuildStore(c->b, f_add(c, get_d(c, slot), x), slot); }

/* Loops over channel ch's values of X ([outer, C, inner]); returns the
 * element index.  The caller closes `in`. */
static LLVMValueRef channel_elems(Cg *c, Nest *in, const Value *X, LLVMValueRef ch) {
    int64_t outer, C, inner;
    cg_axis_split(X, 1, &outer, &C, &inner);
    LLVMValueRef nn = nest_for(c, in, cg_i64(c, outer));
    return cg_add(c, cg_mul(c, cg_mad(c, nn, C, ch), inner), nest_for(c, in, cg_i64(c, inner)));
}

static int64_t channels(const Value *X) { return X->dims[1].k; }

/* Scratch areas (cg_scratch): per-(channel, position) double sums, and
 * per-channel coefficients. */
#define SUMS_AREA "cleave.bn.sums"
#define COEF_AREA "cleave.bn.coef"

static LLVMValueRef elem(Cg *c, LLVMTypeRef t, LLVMValueRef base, LLVMValueRef i) {
    return LLVMBuildInBoundsGEP2(c->b, t, base, &i, 1, "");
}

/* Loops over rows [row0, row0 + rows) of X ([outer, C, inner]) in memory
 * order; *ch gets the channel, *j the (channel, position) index ch *
 * inner + i, and the result is the element's index.  The caller closes
 * `ns`. */
static LLVMValueRef memory_order_rows(Cg *c, Nest *ns, const Value *X, LLVMValueRef row0, int64_t rows,
                                      LLVMValueRef *ch, LLVMValueRef *j) {
    int64_t outer, C, inner;
    cg_axis_split(X, 1, &outer, &C, &inner);
    LLVMValueRef nn = cg_add(c, row0, nest_for(c, ns, cg_i64(c, rows)));
    *ch = nest_for(c, ns, cg_i64(c, C));
    *j = cg_mad(c, *ch, inner, nest_for(c, ns, cg_i64(c, inner)));
    return cg_add(c, cg_mul(c, nn, C * inner), *j);
}

/* All of X in memory order. */
static LLVMValueRef memory_order(Cg *c, Nest *ns, const Value *X, LLVMValueRef *ch, LLVMValueRef *j) {
    int64_t outer, C, inner;
    cg_axis_split(X, 1, &outer, &C, &inner);
    return memory_order_rows(c, ns, X, cg_i64(c, 0), outer, ch, j);
}

static int64_t positions(const Value *X) {
    int64_t outer, C, inner;
    cg_axis_split(X, 1, &outer, &C, &inner);
    return inner;
}

/* k double accumulators per (channel, position) of X. */
static LLVMValueRef sums_at(Cg *c, const Value *X, int k) {
    int64_t n = (int64_t)k * channels(X) * positions(X);
    return elem(c, c->t_f64, cg_scratch(c, SUMS_AREA, 2 * n), cg_i64(c, 0));
}

/* The same, zeroed. */
static LLVMValueRef sums_area(Cg *c, const Value *X, int k) {
    LLVMValueRef a = sums_at(c, X, k);
    LLVMBuildMemSet(c->b, a, LLVMConstInt(c->t_i8, 0, 0), cg_i64(c, (int64_t)k * channels(X) * positions(X) * 8), 16);
    return a;
}

/* acc[j] += x (double) */
static void acc_add(Cg *c, LLVMValueRef acc, LLVMValueRef j, LLVMValueRef x) {
    LLVMValueRef p = elem(c, c->t_f64, acc, j);
    LLVMBuildStore(c->b, f_add(c, LLVMBuildLoad2(c->b, c->t_f64, p, ""), x), p);
}

/* The sum, in position order, of channel ch's accumulators in block k of
 * the area (blocks of C * inner). */
static LLVMValueRef channel_total(Cg *c, const Value *X, LLVMValueRef acc, int k, LLVMValueRef ch) {
    int64_t inner = positions(X), C = channels(X);
    LLVMValueRef sum = slot_d(c, 0);
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, inner));
    add_d(c, sum, LLVMBuildLoad2(c->b, c->t_f64, elem(c, c->t_f64, acc, cg_add(c, cg_i64(c, k * C * inner), cg_mad(c, ch, inner, i))), ""));
    cg_for_end(c, &l);
    return get_d(c, sum);
}

/* Per-channel coefficients: n_coef float arrays of C each. */
static LLVMValueRef coef_area(Cg *c, int64_t C, int n_coef) {
    return elem(c, c->t_f32, cg_scratch(c, COEF_AREA, n_coef * C), cg_i64(c, 0));
}
static LLVMValueRef coef_at(Cg *c, LLVMValueRef coef, int64_t C, int k, LLVMValueRef ch) {
    return elem(c, c->t_f32, coef, cg_add(c, cg_i64(c, k * C), ch));
}

/* The inference form's factor scale / sqrt(var + eps) of a channel. */
static LLVMValueRef bn_factor(Cg *c, const Node *n, LLVMValueRef scale, LLVMValueRef var) {
    return f_mul(c, scale, inv_std(c, var, node_attr_f(n, "epsilon", 1e-5f)));
}

/* y = (x - mean) * a + B: the kernel below with a per channel, and the
 * element-wise forms that fused chains run (bn_scalar), alike to the
 * bit. */
static LLVMValueRef bn_apply(Cg *c, LLVMValueRef x, LLVMValueRef mean, LLVMValueRef a, LLVMValueRef bias) {
    return f_add(c, f_mul(c, f_sub(c, x, mean), a), bias);
}

/* Y = (X - mean[c]) * (scale[c] / sqrt(var[c] + eps)) + B[c], each
 * channel's factor computed once. */
static bool bn_infer_kernel(Cg *c, const Node *n, const Value *const bufs[6]) {
    const Value *X = bufs[0], *S = bufs[1], *B = bufs[2], *M = bufs[3], *V = bufs[4], *Y = bufs[5];
    if (!cg_kernel_begin(c, n, 6, bufs)) return false;
    Nest ns = {.n = 0};
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, channels(X)));
    LLVMValueRef a = bn_factor(c, n, cg_load(c, S, ch), cg_load(c, V, ch));
    LLVMValueRef mean = cg_load(c, M, ch), bias = cg_load(c, B, ch);
    LLVMValueRef i = channel_elems(c, &ns, X, ch);
    cg_store(c, Y, i, bn_apply(c, cg_load(c, X, i), mean, a, bias));
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* The inference form one element at a time, for fused chains (OpDef
 * scalar, channel_inputs): x = X, scale, B, mean, var.  A chain after a
 * convolution runs it in the convolution's blocks, with the ReLU after
 * it, where the kernel above makes a pass of its own; the factor is
 * computed again for every (sample, channel), a division and a square
 * root per plane. */
static LLVMValueRef bn_scalar(Cg *c, const Node *n, LLVMValueRef *x) {
    return bn_apply(c, x[0], x[3], bn_factor(c, n, x[1], x[4]), x[2]);
}

/* BatchNormTrain's eval step, the same on the running statistics: x = X,
 * scale, B, S1, S2, running mean, running var. */
static LLVMValueRef bn_eval_scalar(Cg *c, const Node *n, LLVMValueRef *x) {
    return bn_apply(c, x[0], x[5], bn_factor(c, n, x[1], x[6]), x[2]);
}

static bool k_batchnorm(Cg *c, const Node *n) {
    if (bn_refused(c->d, c->g, n, false)) return false;
    const Value *bufs[6] = {n->in[0], n->in[1], n->in[2], n->in[3], n->in[4], n->out[0]};
    return bn_infer_kernel(c, n, bufs);
}

/* The eval step's BatchNormTrain: the running statistics. */
static bool k_bn_train_eval(Cg *c, const Node *n) {
    const Value *bufs[6] = {n->in[0], n->in[1], n->in[2], n->in[5], n->in[6], n->out[0]};
    return bn_infer_kernel(c, n, bufs);
}

/* acc[(ch, position)] += x, or (x - mean[ch])^2 with the means given
 * (doubles), over rows [row0, row0 + rows) of X. */
static void stats_rows(Cg *c, const Value *X, LLVMValueRef acc, LLVMValueRef mean, LLVMValueRef row0, int64_t rows) {
    Nest ns = {.n = 0};
    LLVMValueRef ch, j, i = memory_order_rows(c, &ns, X, row0, rows, &ch, &j);
    LLVMValueRef x = to_d(c, cg_load(c, X, i));
    if (mean) {
        x = f_sub(c, x, LLVMBuildLoad2(c->b, c->t_f64, elem(c, c->t_f64, mean, ch), ""));
        x = f_mul(c, x, x);
    }
    acc_add(c, acc, j, x);
    nest_close(c, &ns);
}

/* S[ch] = channel ch's accumulators added up, rounded to float. */
static void stats_totals(Cg *c, const Value *X, LLVMValueRef acc, const Value *S) {
    CgLoop l;
    LLVMValueRef ch = cg_for(c, &l, cg_i64(c, channels(X)));
    cg_store(c, S, ch, to_f(c, channel_total(c, X, acc, 0, ch)));
    cg_for_end(c, &l);
}

/* S[ch] = sum x, or with S1 given sum (x - S1[ch] / count)^2, over this
 * rank's values of channel ch; the sum runs in double. */
static bool k_bn_stats(Cg *c, const Node *n) {
    const Value *X = n->in[0], *S1 = n->n_in > 1 ? n->in[1] : NULL, *S = n->out[0];
    int64_t count = node_attr_i(n, "count", 0), outer, C, inner;
    cg_axis_split(X, 1, &outer, &C, &inner);
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef acc = sums_area(c, X, 1), mean = NULL;
    if (S1) { /* the means first, as doubles in the coefficient area */
        mean = coef_area(c, C, 2);
        CgLoop l;
        LLVMValueRef ch = cg_for(c, &l, cg_i64(c, C));
        LLVMValueRef m = f_mul(c, to_d(c, cg_load(c, S1, ch)), const_d(c, 1.0 / (double)count));
        LLVMBuildStore(c->b, m, elem(c, c->t_f64, mean, ch));
        cg_for_end(c, &l);
    }
    stats_rows(c, X, acc, mean, cg_i64(c, 0), outer);
    stats_totals(c, X, acc, S);
    cg_kernel_end(c);
    return true;
}

/* The sum of x (not the centred one, which needs the whole sum first)
 * taken block by block inside the kernel that makes X, in the order of
 * k_bn_stats: rows in order, each (channel, position) accumulator adding
 * its values row after row. */
static bool stats_takes_rows(const Node *n) { return n->n_in == 1; }
static void stats_begin(Cg *c, const Node *n) { (void)sums_area(c, n->in[0], 1); }
static void stats_block(Cg *c, const Node *n, LLVMValueRef row0, int64_t rows) {
    stats_rows(c, n->in[0], sums_at(c, n->in[0], 1), NULL, row0, rows);
}
static void stats_end(Cg *c, const Node *n) { stats_totals(c, n->in[0], sums_at(c, n->in[0], 1), n->out[0]); }
static const CgRows stats_in_rows = {stats_takes_rows, stats_begin, stats_block, stats_end};

/* Q[ch] = count (S1[ch] / count - K[ch])^2 in double: a micro-batch's
 * squared deviation of its mean from the running mean K, times count. */
static bool k_bn_moment(Cg *c, const Node *n) {
    const Value *S1 = n->in[0], *K = n->in[1], *Q = n->out[0];
    double count = (double)node_attr_i(n, "count", 0);
    if (!cg_kernel_begin_io(c, n)) return false;
    CgLoop l;
    LLVMValueRef ch = cg_for(c, &l, cg_i64(c, S1->dims[0].k));
    LLVMValueRef d = f_sub(c, f_mul(c, to_d(c, cg_load(c, S1, ch)), const_d(c, 1.0 / count)), to_d(c, cg_load(c, K, ch)));
    cg_store(c, Q, ch, to_f(c, f_mul(c, f_mul(c, d, d), const_d(c, count))));
    cg_for_end(c, &l);
    cg_kernel_end(c);
    return true;
}

/* The eval step normalises with the running statistics: no sums. */
static bool k_skip(Cg *c, const Node *n) {
    (void)c;
    (void)n;
    return true;
}

/* The mean and biased variance of channel ch (double) from S1 and S2. */
static void stats_of(Cg *c, const Value *S1, const Value *S2, LLVMValueRef ch, int64_t count, LLVMValueRef *mean,
                     LLVMValueRef *var) {
    LLVMValueRef rn = const_d(c, 1.0 / (double)count);
    *mean = f_mul(c, to_d(c, cg_load(c, S1, ch)), rn);
    *var = f_mul(c, to_d(c, cg_load(c, S2, ch)), rn);
}

/* Y = X * alpha + beta with alpha = scale * invstd, beta = B - mean * alpha
 * (the order PyTorch's CPU kernel uses); MI = [mean, invstd]. */
static bool k_bn_train(Cg *c, const Node *n) {
    const Value *X = n->in[0], *Sc = n->in[1], *B = n->in[2], *S1 = n->in[3], *S2 = n->in[4];
    const Value *Y = n->out[0], *MI = n->out[1];
    int64_t C = channels(X), count = node_attr_i(n, "count", 0);
    double eps = node_attr_f(n, "epsilon", 1e-5f);
    const Value *bufs[7] = {X, Sc, B, S1, S2, Y, MI};
    if (!cg_kernel_begin(c, n, 7, bufs)) return false;
    LLVMValueRef coef = coef_area(c, C, 2);
    CgLoop l;
    LLVMValueRef ch = cg_for(c, &l, cg_i64(c, C)), mean, var;
    stats_of(c, S1, S2, ch, count, &mean, &var);
    LLVMValueRef inv = to_f(c, LLVMBuildFDiv(c->b, const_d(c, 1), sqrt_d(c, f_add(c, var, const_d(c, eps))), ""));
    LLVMValueRef meanf = to_f(c, mean);
    cg_store(c, MI, ch, meanf);
    cg_store(c, MI, cg_add(c, ch, cg_i64(c, C)), inv);
    LLVMValueRef alpha = f_mul(c, cg_load(c, Sc, ch), inv);
    LLVMBuildStore(c->b, alpha, coef_at(c, coef, C, 0, ch));
    LLVMBuildStore(c->b, f_sub(c, cg_load(c, B, ch), f_mul(c, meanf, alpha)), coef_at(c, coef, C, 1, ch));
    cg_for_end(c, &l);
    Nest ns = {.n = 0};
    LLVMValueRef j, i = memory_order(c, &ns, X, &ch, &j);
    LLVMValueRef a = load_f(c, coef_at(c, coef, C, 0, ch)), b = load_f(c, coef_at(c, coef, C, 1, ch));
    cg_store(c, Y, i, f_add(c, f_mul(c, cg_load(c, X, i), a), b));
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* running = (1 - m) * running + m * batch, the variance unbiased
 * (count / (count - 1)), in double as torch does; m is torch's momentum. */
static bool k_bn_running(Cg *c, const Node *n) {
    const Value *RM = n->in[0], *RV = n->in[1], *S1 = n->in[2], *S2 = n->in[3], *Q = n->n_in > 4 ? n->in[4] : NULL;
    int64_t C = RM->dims[0].k, count = node_attr_i(n, "count", 0);
    double m = node_attr_f(n, "momentum", 0.1f);
    if (!cg_kernel_begin_io(c, n)) return false;
    CgLoop l;
    LLVMValueRef ch = cg_for(c, &l, cg_i64(c, C)), mean, var;
    stats_of(c, S1, S2, ch, count, &mean, &var);
    if (Q) { /* the micro-batches' deviations about their means, moved to the batch's */
        LLVMValueRef shift = f_sub(c, mean, to_d(c, cg_load(c, RM, ch)));
        LLVMValueRef spread = f_sub(c, to_d(c, cg_load(c, Q, ch)), f_mul(c, f_mul(c, shift, shift), const_d(c, (double)count)));
        var = cg_max(c, f_add(c, var, f_mul(c, spread, const_d(c, 1.0 / (double)count))), const_d(c, 0));
    }
    LLVMValueRef unbiased = f_mul(c, var, const_d(c, (double)count / (double)(count - 1)));
    LLVMValueRef keep = const_d(c, 1 - m), take = const_d(c, m);
    cg_store(c, RM, ch, to_f(c, f_add(c, f_mul(c, take, mean), f_mul(c, keep, to_d(c, cg_load(c, RM, ch))))));
    cg_store(c, RV, ch, to_f(c, f_add(c, f_mul(c, take, unbiased), f_mul(c, keep, to_d(c, cg_load(c, RV, ch))))));
    cg_for_end(c, &l);
    cg_kernel_end(c);
    return true;
}

/* G = [sum dY, sum dY * (x - mean)], each summed in double; dB = sum dY
 * and dScale = invstd * sum dY * (x - mean) of this rank's rows. */
static bool k_bn_grad_stats(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *X = n->in[1], *MI = n->in[2], *G = n->out[0], *dS = n->out[1], *dB = n->out[2];
    int64_t C = channels(X);
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef acc = sums_area(c, X, 2), mean = coef_area(c, C, 2);
    CgLoop l;
    LLVMValueRef ch = cg_for(c, &l, cg_i64(c, C));
    LLVMBuildStore(c->b, to_d(c, cg_load(c, MI, ch)), elem(c, c->t_f64, mean, ch));
    cg_for_end(c, &l);
    Nest ns = {.n = 0};
    LLVMValueRef j, i = memory_order(c, &ns, X, &ch, &j);
    LLVMValueRef dy = to_d(c, cg_load(c, dY, i));
    LLVMValueRef xc = f_sub(c, to_d(c, cg_load(c, X, i)), LLVMBuildLoad2(c->b, c->t_f64, elem(c, c->t_f64, mean, ch), ""));
    acc_add(c, acc, j, dy);
    acc_add(c, acc, cg_add(c, j, cg_i64(c, C * positions(X))), f_mul(c, dy, xc));
    nest_close(c, &ns);
    ch = cg_for(c, &l, cg_i64(c, C));
    LLVMValueRef chc = cg_add(c, ch, cg_i64(c, C)), inv = to_d(c, cg_load(c, MI, chc));
    LLVMValueRef s1 = channel_total(c, X, acc, 0, ch), s2 = channel_total(c, X, acc, 1, ch);
    cg_store(c, G, ch, to_f(c, s1));
    cg_store(c, G, chc, to_f(c, s2));
    cg_store(c, dB, ch, to_f(c, s1));
    cg_store(c, dS, ch, to_f(c, f_mul(c, s2, inv)));
    cg_for_end(c, &l);
    cg_kernel_end(c);
    return true;
}

/* dX = (dY - sum dY / n - (x - mean) * k) * invstd * scale, with
 * k = sum dY (x - mean) * invstd^2 / n over the n values G covers. */
static bool k_bn_grad_input(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *X = n->in[1], *MI = n->in[2], *Sc = n->in[3], *G = n->in[4], *dX = n->out[0];
    int64_t C = channels(X), count = node_attr_i(n, "count", 0);
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef coef = coef_area(c, C, 4);
    CgLoop l;
    LLVMValueRef ch = cg_for(c, &l, cg_i64(c, C));
    LLVMValueRef inv = cg_load(c, MI, cg_add(c, ch, cg_i64(c, C)));
    LLVMValueRef rn = const_d(c, 1.0 / (double)count), invd = to_d(c, inv);
    LLVMValueRef gmean = to_f(c, f_mul(c, to_d(c, cg_load(c, G, ch)), rn));
    LLVMValueRef gdot = to_d(c, cg_load(c, G, cg_add(c, ch, cg_i64(c, C))));
    LLVMValueRef k = to_f(c, f_mul(c, f_mul(c, f_mul(c, gdot, invd), invd), rn));
    LLVMValueRef vals[4] = {cg_load(c, MI, ch), gmean, k, f_mul(c, inv, cg_load(c, Sc, ch))};
    for (int t = 0; t < 4; t++) LLVMBuildStore(c->b, vals[t], coef_at(c, coef, C, t, ch));
    cg_for_end(c, &l);
    Nest ns = {.n = 0};
    LLVMValueRef j, i = memory_order(c, &ns, X, &ch, &j), v[4];
    for (int t = 0; t < 4; t++) v[t] = load_f(c, coef_at(c, coef, C, t, ch));
    LLVMValueRef d = f_sub(c, f_sub(c, cg_load(c, dY, i), v[1]), f_mul(c, f_sub(c, cg_load(c, X, i), v[0]), v[2]));
    cg_store(c, dX, i, f_mul(c, d, v[3]));
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* BatchNormGrad(dY, X, scale, mean, var) -> dX, dScale, dB of the
 * inference form: dX = dY * scale * invstd, dScale[c] = sum dY * xhat,
 * dB[c] = sum dY. */
static bool k_batchnorm_grad(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *X = n->in[1], *S = n->in[2], *M = n->in[3], *V = n->in[4];
    const Value *dX = n->out[0], *dS = n->out[1], *dB = n->out[2];
    float eps = node_attr_f(n, "epsilon", 1e-5f);
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef s1 = cg_alloca(c, c->t_f32), s2 = cg_alloca(c, c->t_f32);
    Nest ns = {.n = 0};
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, channels(X)));
    LLVMValueRef inv = inv_std(c, cg_load(c, V, ch), eps);
    LLVMValueRef a = f_mul(c, cg_load(c, S, ch), inv), mean = cg_load(c, M, ch);
    LLVMBuildStore(c->b, cg_f32(c, 0), s1);
    LLVMBuildStore(c->b, cg_f32(c, 0), s2);
    Nest in = {.n = 0};
    LLVMValueRef i = channel_elems(c, &in, X, ch);
    LLVMValueRef dy = cg_load(c, dY, i);
    cg_store(c, dX, i, f_mul(c, dy, a));
    LLVMBuildStore(c->b, f_add(c, load_f(c, s1), dy), s1);
    LLVMBuildStore(c->b, f_add(c, load_f(c, s2), f_mul(c, dy, f_sub(c, cg_load(c, X, i), mean))), s2);
    nest_close(c, &in);
    cg_store(c, dB, ch, load_f(c, s1));
    cg_store(c, dS, ch, f_mul(c, load_f(c, s2), inv));
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* ==== entries ==== */

static const AttrSpec attrs_bn[] = {
    {"epsilon", ATTR_FLOAT, .f = 1e-5f}, {"momentum", ATTR_FLOAT, .f = 0.9f}, {"training_mode", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_bn_grad[] = {{"epsilon", ATTR_FLOAT, .f = 1e-5f}, {0}};
/* count: values per channel the statistics cover (over `replicas` replicas). */
static const AttrSpec attrs_bn_group[] = {
    {"replicas", ATTR_INT, .i = 1}, {"count", ATTR_INT, .required = true}, {0}};
static const AttrSpec attrs_bn_train[] = {
    {"epsilon", ATTR_FLOAT, .f = 1e-5f}, {"count", ATTR_INT, .required = true}, {0}};
static const AttrSpec attrs_bn_running[] = {
    {"momentum", ATTR_FLOAT, .f = 0.1f}, {"count", ATTR_INT, .required = true}, {0}};
static const AttrSpec attrs_bn_count[] = {{"count", ATTR_INT, .required = true}, {0}};

/* Inputs 3 and 4 (running mean and variance) are state, not weights. */
const OpDef op_BatchNormalization = {"BatchNormalization", "", 1, 0, 5, 5, 1, 5, attrs_bn, (1u << 3) | (1u << 4), infer_batchnorm, NULL, flops_norm, .grad = g_batchnorm, .cg = k_batchnorm, .train_form = bn_train_form, .scalar = bn_scalar, .channel_inputs = 0x1e};
/* BatchNormGrad reads the running statistics as state, as the forward op does. */
const OpDef op_BatchNormGrad = {"BatchNormGrad", "cleave", 1, 0, 5, 5, 3, 3, attrs_bn_grad, (1u << 3) | (1u << 4), infer_bn_grad, NULL, flops_norm_grad, .cg = k_batchnorm_grad};
const OpDef op_BatchNormStats = {"BatchNormStats", "cleave", 1, 0, 1, 2, 1, 1, attrs_bn_group, 0, infer_bn_stats, NULL, flops_stats, .cg = k_bn_stats, .cg_eval = k_skip, .replica_sums = 1, .cg_rows = &stats_in_rows};
const OpDef op_BatchNormTrain = {"BatchNormTrain", "cleave", 1, 0, 7, 7, 2, 2, attrs_bn_train, (1u << 5) | (1u << 6), infer_bn_train, NULL, flops_norm, .grad = g_bn_train, .cg = k_bn_train, .cg_eval = k_bn_train_eval, .eval_scalar = bn_eval_scalar, .channel_inputs = 0x7e};
/* Input 1, the running mean, is state: read here, updated by BatchNormRunning. */
const OpDef op_BatchNormMoment = {"BatchNormMoment", "cleave", 1, 0, 2, 2, 1, 1, attrs_bn_count, 2, infer_like_input, NULL, flops_running, .cg = k_bn_moment, .cg_eval = k_skip};
const OpDef op_BatchNormRunning = {"BatchNormRunning", "cleave", 1, 0, 4, 5, 0, 0, attrs_bn_running, 3, infer_none, NULL, flops_running, .cg = k_bn_running, .mutates_inputs = 3};
const OpDef op_BatchNormGradStats = {"BatchNormGradStats", "cleave", 1, 0, 3, 3, 3, 3, attrs_bn_group, 0, infer_bn_grad_stats, NULL, flops_grad_stats, .cg = k_bn_grad_stats, .replica_sums = 1};
const OpDef op_BatchNormGradInput = {"BatchNormGradInput", "cleave", 1, 0, 5, 5, 1, 1, attrs_bn_count, 0, infer_bn_grad_input, NULL, flops_grad_input, .cg = k_bn_grad_input};
