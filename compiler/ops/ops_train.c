/* ops_train.c - operators of training graphs: the loss
 * (SoftmaxCrossEntropyLoss, an ONNX op), and cleave's own gradient and
 * optimizer ops (domain "cleave"), which gradient rules of other ops and
 * the optimizer construction emit. */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"

static const AttrSpec attrs_none[] = {{0}};

/* ---- SoftmaxCrossEntropyLoss(scores [N,C], labels [N]) -> loss ---- */

static bool infer_sce(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *l = n->in[1];
    if (x->rank != 2) return op_error_kind(c, n, DIAG_UNSUPPORTED, "scores must be [N, C] (rank %d given)", x->rank);
    if (l->rank != 1 || (dim_is_const(l->dims[0]) && dim_is_const(x->dims[0]) && l->dims[0].k != x->dims[0].k))
        return op_error(c, n, "labels '%s' must be [N] matching the scores", l->name);
    if (l->dtype != DT_INT64 && l->dtype != DT_INT32) return op_error(c, n, "labels must be int64 or int32");
    if (n->n_in > 2 && n->in[2]) return op_error_kind(c, n, DIAG_UNSUPPORTED, "class weights are not supported");
    const char *red = node_attr_s(n, "reduction", "mean");
    if (strcmp(red, "mean") && strcmp(red, "sum"))
        return op_error_kind(c, n, DIAG_UNSUPPORTED, "reduction '%s' is not supported (mean or sum)", red);
    set_out(n, 0, x->dtype, 0, NULL);
    set_out(n, 1, x->dtype, 2, x->dims);
    return true;
}

/* Rows whose label equals ignore_index (when given) contribute nothing, and
 * the mean divides by the rows that count, as ONNX and PyTorch define it.
 * Returns the i1 "row counts" and adds it to *count. */
static LLVMValueRef sce_row_counts(Cg *c, const Node *n, LLVMValueRef label, LLVMValueRef count) {
    const Attr *ig = node_attr(n, "ignore_index");
    if (!ig) return LLVMConstInt(c->t_i1, 1, 0);
    LLVMValueRef keep = LLVMBuildICmp(c->b, LLVMIntNE, label, cg_i64(c, ig->i), "");
    LLVMValueRef cur = LLVMBuildLoad2(c->b, c->t_f32, count, "");
    LLVMBuildStore(c->b, LLVMBuildSelect(c->b, keep, LLVMBuildFAdd(c->b, cur, cg_f32(c, 1), ""), cur, ""), count);
    return keep;
}

/* Rows that count under ignore_index, computed before the main loop so the
 * mean's divisor is known. */
static LLVMValueRef sce_count(Cg *c, const Node *n, const Value *lab, int64_t rows) {
    LLVMValueRef count = cg_alloca(c, c->t_f32);
    LLVMBuildStore(c->b, cg_f32(c, node_attr(n, "ignore_index") ? 0 : (double)rows), count);
    if (node_attr(n, "ignore_index")) {
        CgLoop l;
        LLVMValueRef i = cg_for(c, &l, cg_i64(c, rows));
        sce_row_counts(c, n, cg_load_i(c, lab, i), count);
        cg_for_end(c, &l);
    }
    return LLVMBuildLoad2(c->b, c->t_f32, count, "");
}

/* loss = sum over counted rows (logsumexp(x_r) - x_r[label_r]), divided by
 * their number for reduction=mean; the optional second output is
 * log_prob = x_r - logsumexp(x_r) for every row, ignored or not. */
static bool cg_sce(Cg *c, const Node *n) {
    const Value *x = n->in[0], *lab = n->in[1], *loss = n->out[0];
    const Value *logp = n->n_out > 1 ? n->out[1] : NULL;
    int64_t rows = x->dims[0].k, cols = x->dims[1].k;
    bool mean = strcmp(node_attr_s(n, "reduction", "mean"), "mean") == 0;
    const Value *bufs[4] = {x, lab, loss, logp};
    if (!cg_kernel_begin(c, n, logp ? 4 : 3, bufs)) return false;
    LLVMValueRef counted = sce_count(c, n, lab, rows);
    LLVMValueRef acc = cg_alloca(c, c->t_f32);
    LLVMBuildStore(c->b, cg_f32(c, 0), acc);
    CgLoop r, k1, k2;
    LLVMValueRef i = cg_for(c, &r, cg_i64(c, rows));
    LLVMValueRef mx = cg_alloca(c, c->t_f32), se = cg_alloca(c, c->t_f32);
    LLVMBuildStore(c->b, cg_f32(c, -INFINITY), mx);
    LLVMBuildStore(c->b, cg_f32(c, 0), se);
    LLVMValueRef j = cg_for(c, &k1, cg_i64(c, cols));
    LLVMValueRef v = cg_load(c, x, cg_mad(c, i, cols, j));
    LLVMBuildStore(c->b, cg_max(c, LLVMBuildLoad2(c->b, c->t_f32, mx, ""), v), mx);
    cg_for_end(c, &k1);
    LLVMValueRef m = LLVMBuildLoad2(c->b, c->t_f32, mx, "");
    j = cg_for(c, &k2, cg_i64(c, cols));
    v = cg_load(c, x, cg_mad(c, i, cols, j));
    LLVMValueRef e = cg_math(c, "exp", LLVMBuildFSub(c->b, v, m, ""), NULL);
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, se, ""), e, ""), se);
    cg_for_end(c, &k2);
    LLVMValueRef lse = LLVMBuildFAdd(c->b, m, cg_math(c, "log", LLVMBuildLoad2(c->b, c->t_f32, se, ""), NULL), "");
    if (logp) {
        CgLoop k3;
        j = cg_for(c, &k3, cg_i64(c, cols));
        LLVMValueRef idx = cg_mad(c, i, cols, j);
        cg_store(c, logp, idx, LLVMBuildFSub(c->b, cg_load(c, x, idx), lse, ""));
        cg_for_end(c, &k3);
    }
    LLVMValueRef label = cg_load_i(c, lab, i);
    const Attr *ig = node_attr(n, "ignore_index");
    LLVMValueRef keep = ig ? LLVMBuildICmp(c->b, LLVMIntNE, label, cg_i64(c, ig->i), "") : NULL;
    /* an ignored row may hold any label: read column 0 instead */
    LLVMValueRef col = keep ? LLVMBuildSelect(c->b, keep, label, cg_i64(c, 0), "") : label;
    LLVMValueRef xl = cg_load(c, x, cg_add(c, cg_mul(c, i, cols), col));
    LLVMValueRef term = LLVMBuildFSub(c->b, lse, xl, "");
    if (keep) term = LLVMBuildSelect(c->b, keep, term, cg_f32(c, 0), "");
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, acc, ""), term, ""), acc);
    cg_for_end(c, &r);
    LLVMValueRef total = LLVMBuildLoad2(c->b, c->t_f32, acc, "");
    if (mean) total = LLVMBuildFDiv(c->b, total, counted, "");
    cg_store(c, loss, cg_i64(c, 0), total);
    cg_kernel_end(c);
    return true;
}

static bool grad_sce(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0] || !dy[0]) return true;
    Value *in[3] = {dy[0], n->in[0], n->in[1]};
    Node *g = gb_start(c, "cleave", "SoftmaxCrossEntropyLossGrad", 3, in, 1);
    gb_attr_i(c, g, "mean", strcmp(node_attr_s(n, "reduction", "mean"), "mean") == 0);
    const Attr *ig = node_attr(n, "ignore_index");
    if (ig) gb_attr_i(c, g, "ignore_index", ig->i);
    dx[0] = gb_finish(c, g);
    return dx[0] != NULL;
}

static double flops_sce(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : 6.0 * (double)e;
}

/* ---- SoftmaxCrossEntropyLossGrad(dloss, scores, labels) ---- */

static bool infer_sce_grad(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 1);
    return true;
}

/* dx[r,j] = dloss * scale * (softmax(x_r)_j - [j == label_r]) */
static bool cg_sce_grad(Cg *c, const Node *n) {
    const Value *dl = n->in[0], *x = n->in[1], *lab = n->in[2], *dx = n->out[0];
    int64_t rows = x->dims[0].k, cols = x->dims[1].k;
    bool mean = node_attr_i(n, "mean", 1) != 0;
    const Value *bufs[4] = {dl, x, lab, dx};
    if (!cg_kernel_begin(c, n, 4, bufs)) return false;
    LLVMValueRef s = cg_load(c, dl, cg_i64(c, 0));
    if (mean) s = LLVMBuildFDiv(c->b, s, sce_count(c, n, lab, rows), "");
    LLVMValueRef mx = cg_alloca(c, c->t_f32), se = cg_alloca(c, c->t_f32);
    CgLoop r, k1, k2, k3;
    LLVMValueRef i = cg_for(c, &r, cg_i64(c, rows));
    LLVMBuildStore(c->b, cg_f32(c, -INFINITY), mx);
    LLVMBuildStore(c->b, cg_f32(c, 0), se);
    LLVMValueRef j = cg_for(c, &k1, cg_i64(c, cols));
    LLVMBuildStore(c->b, cg_max(c, LLVMBuildLoad2(c->b, c->t_f32, mx, ""), cg_load(c, x, cg_mad(c, i, cols, j))), mx);
    cg_for_end(c, &k1);
    LLVMValueRef m = LLVMBuildLoad2(c->b, c->t_f32, mx, "");
    j = cg_for(c, &k2, cg_i64(c, cols));
    LLVMValueRef e = cg_math(c, "exp", LLVMBuildFSub(c->b, cg_load(c, x, cg_mad(c, i, cols, j)), m, ""), NULL);
    cg_store(c, dx, cg_mad(c, i, cols, j), e);
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, se, ""), e, ""), se);
    cg_for_end(c, &k2);
    LLVMValueRef label = cg_load_i(c, lab, i);
    const Attr *ig = node_attr(n, "ignore_index");
    LLVMValueRef row_s = ig ? LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, LLVMIntNE, label, cg_i64(c, ig->i), ""), s,
                                              cg_f32(c, 0), "")
                            : s;
    LLVMValueRef inv = LLVMBuildFDiv(c->b, row_s, LLVMBuildLoad2(c->b, c->t_f32, se, ""), "");
    j = cg_for(c, &k3, cg_i64(c, cols));
    LLVMValueRef idx = cg_mad(c, i, cols, j);
    LLVMValueRef p = LLVMBuildFMul(c->b, cg_load(c, dx, idx), inv, "");
    LLVMValueRef hit = LLVMBuildICmp(c->b, LLVMIntEQ, j, label, "");
    p = LLVMBuildSelect(c->b, hit, LLVMBuildFSub(c->b, p, row_s, ""), p, "");
    cg_store(c, dx, idx, p);
    cg_for_end(c, &k3);
    cg_for_end(c, &r);
    cg_kernel_end(c);
    return true;
}

/* ---- SumTo(x, like): sums x over the dims broadcast from like ---- */

static bool infer_sum_to(OpCtx *c, Node *n) {
    (void)c;
    set_out(n, 0, n->in[0]->dtype, n->in[1]->rank, n->in[1]->dims);
    return true;
}

static bool cg_sum_to(Cg *c, const Node *n) {
    const Value *x = n->in[0], *y = n->out[0];
    const Value *bufs[2] = {x, y};
    if (!cg_kernel_begin(c, n, 2, bufs)) return false;
    int64_t ny = value_numel(y);
    cg_fill(c, y, ny, cg_f32(c, 0));
    /* walk x; the y index drops broadcast dims */
    int r = x->rank;
    int64_t ys[MAX_RANK], s = 1;
    for (int j = r - 1; j >= 0; j--) {
        int yj = j - (r - y->rank);
        int64_t dk = yj >= 0 ? y->dims[yj].k : 1;
        ys[j] = dk == 1 ? 0 : s;
        s *= dk;
    }
    CgLoop loops[MAX_RANK];
    LLVMValueRef xi = cg_i64(c, 0), yi = cg_i64(c, 0);
    for (int j = 0; j < r; j++) {
        LLVMValueRef iv = cg_for(c, &loops[j], cg_i64(c, x->dims[j].k));
        xi = cg_mad(c, xi, x->dims[j].k, iv);
        if (ys[j]) yi = cg_add(c, yi, cg_mul(c, iv, ys[j]));
    }
    cg_store(c, y, yi, LLVMBuildFAdd(c->b, cg_load(c, y, yi), cg_load(c, x, xi), ""));
    for (int j = r - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
    cg_kernel_end(c);
    return true;
}

/* ---- activation gradients: f(dy, saved) element-wise ---- */

static bool infer_like_first(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 0);
    return true;
}

static LLVMValueRef s_relu_grad(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    return cg_select_gt0(c, x[1], x[0], cg_f32(c, 0));
}
static LLVMValueRef s_leaky_grad(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef ge = LLVMBuildFCmp(c->b, LLVMRealOGE, x[1], cg_f32(c, 0), "");
    return LLVMBuildSelect(c->b, ge, x[0], LLVMBuildFMul(c->b, x[0], cg_f32(c, node_attr_f(n, "alpha", 0.01f)), ""), "");
}
static LLVMValueRef s_sigmoid_grad(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    LLVMValueRef one_m = LLVMBuildFSub(c->b, cg_f32(c, 1), x[1], "");
    return LLVMBuildFMul(c->b, x[0], LLVMBuildFMul(c->b, x[1], one_m, ""), "");
}
static LLVMValueRef s_tanh_grad(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    LLVMValueRef sq = LLVMBuildFMul(c->b, x[1], x[1], "");
    return LLVMBuildFMul(c->b, x[0], LLVMBuildFSub(c->b, cg_f32(c, 1), sq, ""), "");
}
static bool cg_relu_grad(Cg *c, const Node *n) { return cg_elementwise(c, n, s_relu_grad); }
static bool cg_leaky_grad(Cg *c, const Node *n) { return cg_elementwise(c, n, s_leaky_grad); }
static bool cg_sigmoid_grad(Cg *c, const Node *n) { return cg_elementwise(c, n, s_sigmoid_grad); }
static bool cg_tanh_grad(Cg *c, const Node *n) { return cg_elementwise(c, n, s_tanh_grad); }

/* ---- SoftmaxGrad / LogSoftmaxGrad (dy, y) along `axis` ---- */

static bool cg_softmax_grad_common(Cg *c, const Node *n, bool log) {
    const Value *dy = n->in[0], *y = n->in[1], *dx = n->out[0];
    int64_t axis = node_attr_i(n, "axis", -1);
    if (axis < 0) axis += y->rank;
    int64_t outer, len, inner;
    cg_axis_split(y, (int)axis, &outer, &len, &inner);
    const Value *bufs[3] = {dy, y, dx};
    if (!cg_kernel_begin(c, n, 3, bufs)) return false;
    LLVMValueRef acc = cg_alloca(c, c->t_f32);
    CgLoop lo, li, l1, l2;
    LLVMValueRef o = cg_for(c, &lo, cg_i64(c, outer));
    LLVMValueRef in = cg_for(c, &li, cg_i64(c, inner));
    LLVMValueRef base = cg_add(c, cg_mul(c, o, len * inner), in);
    LLVMBuildStore(c->b, cg_f32(c, 0), acc);
    LLVMValueRef k = cg_for(c, &l1, cg_i64(c, len));
    LLVMValueRef idx = cg_add(c, base, cg_mul(c, k, inner));
    LLVMValueRef t = log ? cg_load(c, dy, idx) : LLVMBuildFMul(c->b, cg_load(c, dy, idx), cg_load(c, y, idx), "");
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, acc, ""), t, ""), acc);
    cg_for_end(c, &l1);
    LLVMValueRef sum = LLVMBuildLoad2(c->b, c->t_f32, acc, "");
    k = cg_for(c, &l2, cg_i64(c, len));
    idx = cg_add(c, base, cg_mul(c, k, inner));
    LLVMValueRef g, yv = cg_load(c, y, idx), dv = cg_load(c, dy, idx);
    if (log) g = LLVMBuildFSub(c->b, dv, LLVMBuildFMul(c->b, cg_math(c, "exp", yv, NULL), sum, ""), "");
    else g = LLVMBuildFMul(c->b, yv, LLVMBuildFSub(c->b, dv, sum, ""), "");
    cg_store(c, dx, idx, g);
    cg_for_end(c, &l2);
    cg_for_end(c, &li);
    cg_for_end(c, &lo);
    cg_kernel_end(c);
    return true;
}
static bool cg_softmax_grad(Cg *c, const Node *n) { return cg_softmax_grad_common(c, n, false); }
static bool cg_logsoftmax_grad(Cg *c, const Node *n) { return cg_softmax_grad_common(c, n, true); }

/* ---- ReduceGrad(dy, x): dy broadcast back over the reduced axes ---- */

static bool infer_reduce_grad(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 1);
    return true;
}

/* dx[i] = scale * dy[j(i)], j dropping the reduced axes of x */
static bool cg_reduce_grad(Cg *c, const Node *n) {
    const Value *dy = n->in[0], *x = n->in[1], *dx = n->out[0];
    const int64_t *axes;
    int na = node_attr_ints(n, "axes", &axes);
    bool red[MAX_RANK] = {0};
    for (int i = 0; i < na; i++) red[axes[i]] = true;
    if (na <= 0)
        for (int j = 0; j < x->rank; j++) red[j] = true;
    float scale = node_attr_f(n, "scale", 1.0f);
    const Value *bufs[3] = {dy, x, dx};
    if (!cg_kernel_begin(c, n, 3, bufs)) return false;
    int64_t st[MAX_RANK], s = 1;
    for (int j = x->rank - 1; j >= 0; j--) {
        st[j] = red[j] ? 0 : s;
        if (!red[j]) s *= x->dims[j].k;
    }
    CgLoop loops[MAX_RANK];
    LLVMValueRef xi = cg_i64(c, 0), yi = cg_i64(c, 0);
    for (int j = 0; j < x->rank; j++) {
        LLVMValueRef iv = cg_for(c, &loops[j], cg_i64(c, x->dims[j].k));
        xi = cg_mad(c, xi, x->dims[j].k, iv);
        if (st[j]) yi = cg_add(c, yi, cg_mul(c, iv, st[j]));
    }
    cg_store(c, dx, xi, LLVMBuildFMul(c->b, cg_load(c, dy, yi), cg_f32(c, scale), ""));
    for (int j = x->rank - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
    cg_kernel_end(c);
    return true;
}

/* ---- optimizer updates (no outputs; parameters updated in place) ---- */

/* SGD(w, g, lr, [momentum_buffer], [clip]) and Adam(w, g, m, v, lr, step,
 * [clip]): the optional last input is ClipCoef's factor, the momentum
 * buffer's slot left empty before it when there is none. */
enum { SGD_CLIP = 4, ADAM_CLIP = 6 };

static bool infer_update(OpCtx *c, Node *n) {
    if (value_numel(n->in[0]) != value_numel(n->in[1]))
        return op_error(c, n, "gradient '%s' does not match parameter '%s'", n->in[1]->name, n->in[0]->name);
    int clip = strcmp(n->op_type, "Adam") == 0 ? ADAM_CLIP : SGD_CLIP;
    if (n->n_in > clip && n->in[clip] && value_numel(n->in[clip]) != 1)
        return op_error(c, n, "the clipping factor '%s' must be a scalar", n->in[clip]->name);
    return true;
}

/* The gradient element g as the update reads it: times the clipping
 * factor first, as clip_grad_norm_ scales p.grad before the step. */
static LLVMValueRef clipped(Cg *c, LLVMValueRef g, LLVMValueRef factor) {
    return factor ? LLVMBuildFMul(c->b, g, factor, "") : g;
}

static LLVMValueRef clip_factor(Cg *c, const Node *n, int slot) {
    return n->n_in > slot && n->in[slot] ? cg_load(c, n->in[slot], cg_i64(c, 0)) : NULL;
}

/* torch.optim.SGD: g += wd*w; v = mu*v + g; g = nesterov ? g + mu*v : v;
 * w -= lr*g (dampening 0, so the first step's v = g as torch's clone). */
static bool cg_sgd(Cg *c, const Node *n) {
    const Value *w = n->in[0], *gr = n->in[1], *lr = n->in[2], *v = n->n_in > 3 ? n->in[3] : NULL;
    float wd = node_attr_f(n, "weight_decay", 0), mu = node_attr_f(n, "momentum", 0);
    bool nesterov = node_attr_i(n, "nesterov", 0) != 0;
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef rate = cg_load(c, lr, cg_i64(c, 0)), factor = clip_factor(c, n, SGD_CLIP);
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, value_numel(w)));
    LLVMValueRef wi = cg_load(c, w, i), g = clipped(c, cg_load(c, gr, i), factor);
    if (wd != 0) g = LLVMBuildFAdd(c->b, g, LLVMBuildFMul(c->b, wi, cg_f32(c, wd), ""), "");
    if (v) {
        LLVMValueRef vi = LLVMBuildFAdd(c->b, LLVMBuildFMul(c->b, cg_load(c, v, i), cg_f32(c, mu), ""), g, "");
        cg_store(c, v, i, vi);
        g = nesterov ? LLVMBuildFAdd(c->b, g, LLVMBuildFMul(c->b, vi, cg_f32(c, mu), ""), "") : vi;
    }
    cg_store(c, w, i, LLVMBuildFSub(c->b, wi, LLVMBuildFMul(c->b, rate, g, ""), ""));
    cg_for_end(c, &l);
    cg_kernel_end(c);
    return true;
}

/* torch.optim.Adam (amsgrad off): g += wd*w; m = b1*m + (1-b1)*g;
 * v = b2*v + (1-b2)*g*g; w -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
 * with bc = 1 - beta^t computed in double, as torch does in Python.
 * With "decoupled" it is torch.optim.AdamW: g is left alone and w is
 * first multiplied by 1 - lr*wd (that factor in double, as torch's
 * Python float, then rounded for the float32 multiply). */
static bool cg_adam(Cg *c, const Node *n) {
    const Value *w = n->in[0], *gr = n->in[1], *m = n->in[2], *v = n->in[3], *lr = n->in[4], *st = n->in[5];
    double b1 = node_attr_f(n, "beta1", 0.9f), b2 = node_attr_f(n, "beta2", 0.999f);
    float eps = node_attr_f(n, "eps", 1e-8f), wd = node_attr_f(n, "weight_decay", 0);
    bool decoupled = node_attr_i(n, "decoupled", 0) != 0;
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef t = LLVMBuildFPExt(c->b, cg_load(c, st, cg_i64(c, 0)), c->t_f64, "");
    LLVMTypeRef ps[2] = {c->t_f64, c->t_f64};
    LLVMValueRef powf64 = LLVMGetNamedFunction(c->mod, "pow");
    if (!powf64) powf64 = LLVMAddFunction(c->mod, "pow", LLVMFunctionType(c->t_f64, ps, 2, 0));
    LLVMValueRef a1[2] = {LLVMConstReal(c->t_f64, b1), t}, a2[2] = {LLVMConstReal(c->t_f64, b2), t};
    LLVMTypeRef pty = LLVMFunctionType(c->t_f64, ps, 2, 0);
    LLVMValueRef one = LLVMConstReal(c->t_f64, 1.0);
    LLVMValueRef bc1 = LLVMBuildFSub(c->b, one, LLVMBuildCall2(c->b, pty, powf64, a1, 2, ""), "");
    LLVMValueRef bc2 = LLVMBuildFSub(c->b, one, LLVMBuildCall2(c->b, pty, powf64, a2, 2, ""), "");
    LLVMValueRef lr64 = LLVMBuildFPExt(c->b, cg_load(c, lr, cg_i64(c, 0)), c->t_f64, "");
    LLVMValueRef step_size = LLVMBuildFPTrunc(c->b, LLVMBuildFDiv(c->b, lr64, bc1, ""), c->t_f32, "");
    LLVMTypeRef p1 = c->t_f64;
    LLVMValueRef sqrt64 = LLVMGetNamedFunction(c->mod, "llvm.sqrt.f64");
    if (!sqrt64) sqrt64 = LLVMAddFunction(c->mod, "llvm.sqrt.f64", LLVMFunctionType(c->t_f64, &p1, 1, 0));
    LLVMValueRef sbc2 = LLVMBuildFPTrunc(c->b, LLVMBuildCall2(c->b, LLVMFunctionType(c->t_f64, &p1, 1, 0), sqrt64, &bc2, 1, ""), c->t_f32, "");
    LLVMValueRef shrink = NULL;
    if (decoupled && wd != 0)
        shrink = LLVMBuildFPTrunc(
            c->b, LLVMBuildFSub(c->b, one, LLVMBuildFMul(c->b, lr64, LLVMConstReal(c->t_f64, wd), ""), ""),
            c->t_f32, "");
    LLVMValueRef factor = clip_factor(c, n, ADAM_CLIP);
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, value_numel(w)));
    LLVMValueRef wi = cg_load(c, w, i), g = clipped(c, cg_load(c, gr, i), factor);
    if (shrink) wi = LLVMBuildFMul(c->b, wi, shrink, "");
    else if (wd != 0) g = LLVMBuildFAdd(c->b, g, LLVMBuildFMul(c->b, wi, cg_f32(c, wd), ""), "");
    /* torch's lerp_(g, 1-b1) computes m + (1-b1)*(g-m) */
    LLVMValueRef mi = cg_load(c, m, i);
    mi = LLVMBuildFAdd(c->b, mi, LLVMBuildFMul(c->b, cg_f32(c, 1.0 - b1), LLVMBuildFSub(c->b, g, mi, ""), ""), "");
    LLVMValueRef vi = LLVMBuildFAdd(c->b, LLVMBuildFMul(c->b, cg_load(c, v, i), cg_f32(c, b2), ""),
                                    LLVMBuildFMul(c->b, LLVMBuildFMul(c->b, g, g, ""), cg_f32(c, 1.0 - b2), ""), "");
    cg_store(c, m, i, mi);
    cg_store(c, v, i, vi);
    LLVMValueRef denom = LLVMBuildFAdd(c->b, LLVMBuildFDiv(c->b, cg_math(c, "sqrt", vi, NULL), sbc2, ""), cg_f32(c, eps), "");
    LLVMValueRef upd = LLVMBuildFMul(c->b, step_size, LLVMBuildFDiv(c->b, mi, denom, ""), "");
    cg_store(c, w, i, LLVMBuildFSub(c->b, wi, upd, ""));
    cg_for_end(c, &l);
    cg_kernel_end(c);
    return true;
}

/* ---- gradient clipping: GradNormSq(g, sum) and ClipCoef(sum) -> factor ---- */

static bool infer_grad_norm_sq(OpCtx *c, Node *n) {
    if (n->in[1]->dtype != DT_FLOAT || value_numel(n->in[1]) != 1)
        return op_error(c, n, "the sum of squares '%s' must be a float32 scalar", n->in[1]->name);
    return true;
}

/* sum += the sum of g's squares.  Blocks of GRAD_NORM_BLOCK elements are
 * summed in float32 vector lanes (cg_row_sum) and the blocks in double, so
 * that a gradient of millions of elements loses no more than a block's
 * rounding, in an order that depends only on its size. */
enum { GRAD_NORM_BLOCK = 1024 };
static bool cg_grad_norm_sq(Cg *c, const Node *n) {
    const Value *g = n->in[0], *sum = n->in[1];
    int64_t count = value_numel(g), blocks = count / GRAD_NORM_BLOCK, rest = count % GRAD_NORM_BLOCK;
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef acc = cg_alloca(c, c->t_f64);
    LLVMBuildStore(c->b, LLVMBuildFPExt(c->b, cg_load(c, sum, cg_i64(c, 0)), c->t_f64, ""), acc);
    if (blocks > 0) {
        CgLoop l;
        LLVMValueRef b = cg_for(c, &l, cg_i64(c, blocks));
        LLVMValueRef part = cg_row_sum(c, CG_SUM_SQUARES, g, cg_mul(c, b, GRAD_NORM_BLOCK), NULL, NULL, GRAD_NORM_BLOCK);
        LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f64, acc, ""),
                                           LLVMBuildFPExt(c->b, part, c->t_f64, ""), ""), acc);
        cg_for_end(c, &l);
    }
    if (rest > 0) {
        LLVMValueRef part = cg_row_sum(c, CG_SUM_SQUARES, g, cg_i64(c, blocks * GRAD_NORM_BLOCK), NULL, NULL, rest);
        LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f64, acc, ""),
                                           LLVMBuildFPExt(c->b, part, c->t_f64, ""), ""), acc);
    }
    cg_store(c, sum, cg_i64(c, 0), LLVMBuildFPTrunc(c->b, LLVMBuildLoad2(c->b, c->t_f64, acc, ""), c->t_f32, ""));
    cg_kernel_end(c);
    return true;
}

static double flops_grad_norm_sq(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : 2.0 * (double)e;
}

static bool infer_clip_coef(OpCtx *c, Node *n) {
    if (n->in[0]->dtype != DT_FLOAT || value_numel(n->in[0]) != 1)
        return op_error(c, n, "the sum of squares '%s' must be a float32 scalar", n->in[0]->name);
    set_out(n, 0, DT_FLOAT, 0, NULL);
    return true;
}

/* factor = min(1, C / (norm + 1e-6)) with norm = sqrt(sum), in float32 as
 * clip_grad_norm_ computes it on its float32 total_norm; then sum = 0 for
 * the next step's GradNormSq nodes to add into. */
static bool cg_clip_coef(Cg *c, const Node *n) {
    const Value *sum = n->in[0], *factor = n->out[0];
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef sq = cg_load(c, sum, cg_i64(c, 0));
    LLVMValueRef norm = cg_math(c, "sqrt", sq, NULL);
    LLVMValueRef coef = LLVMBuildFDiv(c->b, cg_f32(c, node_attr_f(n, "max_norm", 1)),
                                      LLVMBuildFAdd(c->b, norm, cg_f32(c, 1e-6f), ""), "");
    LLVMValueRef over = LLVMBuildFCmp(c->b, LLVMRealOLT, coef, cg_f32(c, 1), "");
    cg_store(c, factor, cg_i64(c, 0), LLVMBuildSelect(c->b, over, coef, cg_f32(c, 1), ""));
    cg_store(c, sum, cg_i64(c, 0), cg_f32(c, 0));
    cg_kernel_end(c);
    return true;
}

static double flops_update(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : 4.0 * (double)e;
}

static const AttrSpec attrs_sce[] = {{"reduction", ATTR_STRING, .s = "mean"}, {"ignore_index", ATTR_INT}, {0}};
static const AttrSpec attrs_axis[] = {{"axis", ATTR_INT, .i = -1}, {0}};
static const AttrSpec attrs_alpha[] = {{"alpha", ATTR_FLOAT, .f = 0.01f}, {0}};
static const AttrSpec attrs_reduce_grad[] = {{"axes", ATTR_INTS}, {"scale", ATTR_FLOAT, .f = 1.0f}, {0}};
static const AttrSpec attrs_sgd[] = {
    {"momentum", ATTR_FLOAT, .f = 0}, {"nesterov", ATTR_INT, .i = 0}, {"weight_decay", ATTR_FLOAT, .f = 0}, {0}};
static const AttrSpec attrs_adam[] = {{"beta1", ATTR_FLOAT, .f = 0.9f}, {"beta2", ATTR_FLOAT, .f = 0.999f},
                                      {"eps", ATTR_FLOAT, .f = 1e-8f}, {"weight_decay", ATTR_FLOAT, .f = 0},
                                      {"decoupled", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_clip_coef[] = {{"max_norm", ATTR_FLOAT, .f = 1}, {0}};

const OpDef op_SoftmaxCrossEntropyLoss = {"SoftmaxCrossEntropyLoss", "", 12, 0, 2, 3, 1, 2, attrs_sce, 0, infer_sce,
                                          NULL, flops_sce, .grad = grad_sce, .cg = cg_sce};
static const AttrSpec attrs_sce_grad[] = {{"mean", ATTR_INT, .i = 1}, {"ignore_index", ATTR_INT}, {0}};
const OpDef op_SoftmaxCrossEntropyLossGrad = {"SoftmaxCrossEntropyLossGrad", "cleave", 1, 0, 3, 3, 1, 1, attrs_sce_grad, 0,
                                              infer_sce_grad, NULL, flops_sce, .cg = cg_sce_grad};
const OpDef op_SumTo = {"SumTo", "cleave", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_sum_to, NULL, NULL, .cg = cg_sum_to};
const OpDef op_ReluGrad = {"ReluGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_like_first, NULL, NULL, .cg = cg_relu_grad, .inplace = true, .scalar = s_relu_grad};
const OpDef op_LeakyReluGrad = {"LeakyReluGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_alpha, 0, infer_like_first, NULL, NULL, .cg = cg_leaky_grad, .inplace = true, .scalar = s_leaky_grad};
const OpDef op_SigmoidGrad = {"SigmoidGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_like_first, NULL, NULL, .cg = cg_sigmoid_grad, .inplace = true, .scalar = s_sigmoid_grad};
const OpDef op_TanhGrad = {"TanhGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_like_first, NULL, NULL, .cg = cg_tanh_grad, .inplace = true, .scalar = s_tanh_grad};
const OpDef op_SoftmaxGrad = {"SoftmaxGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_axis, 0, infer_like_first, NULL, NULL, .cg = cg_softmax_grad};
const OpDef op_LogSoftmaxGrad = {"LogSoftmaxGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_axis, 0, infer_like_first, NULL, NULL, .cg = cg_logsoftmax_grad};
const OpDef op_ReduceGrad = {"ReduceGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_reduce_grad, 0, infer_reduce_grad, NULL, NULL, .cg = cg_reduce_grad};
const OpDef op_SGD = {"SGD", "cleave", 1, 0, 3, 5, 0, 0, attrs_sgd, 0, infer_update, NULL, flops_update, .cg = cg_sgd, .mutates_inputs = 1u | (1u << 3)};
const OpDef op_Adam = {"Adam", "cleave", 1, 0, 6, 7, 0, 0, attrs_adam, 0, infer_update, NULL, flops_update, .cg = cg_adam, .mutates_inputs = 1u | (1u << 2) | (1u << 3)};
/* Input 1 is a sum GradNormSq adds into: with stages, the plan sums it over
 * the stages of a replica before ClipCoef reads it (OpDef.stage_sums). */
const OpDef op_GradNormSq = {"GradNormSq", "cleave", 1, 0, 2, 2, 0, 0, attrs_none, 0, infer_grad_norm_sq, NULL,
                             flops_grad_norm_sq, .cg = cg_grad_norm_sq, .mutates_inputs = 1u << 1,
                             .stage_sums = 1u << 1};
const OpDef op_ClipCoef = {"ClipCoef", "cleave", 1, 0, 1, 1, 1, 1, attrs_clip_coef, 0, infer_clip_coef, NULL, NULL,
                           .cg = cg_clip_coef, .mutates_inputs = 1u};
