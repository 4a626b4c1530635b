/* ops_dropout.c - Dropout, and the DropoutTrain op of domain "cleave"
 * that trains it.
 *
 * At inference, and whenever it is not in training mode, Dropout is the
 * identity.  In training mode (training_mode true from opset 12,
 * is_test 0 before opset 7) with a ratio above 0, the train_form rule
 * replaces it with
 *   DropoutTrain(X, positions, seed, step) -> Y
 * Y = X * mask / (1 - ratio), as torch.nn.Dropout in train mode computes
 * it.  The mask is a function of (seed, step, the row's position in the
 * global batch, the element's index in its row) alone: a counter-based
 * generator rather than a stream, so every strategy, rank count and
 * micro-batch split draws the same masks and trains to the same losses.
 * The backward pass is the same op on dY (the same mask and scale); the
 * eval step copies.  Masks cannot match PyTorch's own generator; a ratio
 * of 0 is exactly the identity. */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../autodiff/train.h"
#include "../codegen/cg.h"

static bool infer_dropout(OpCtx *c, Node *n) {
    same_as_input(n, 0, 0);
    set_out(n, 1, c->opset >= 10 ? DT_BOOL : n->in[0]->dtype, n->in[0]->rank, n->in[0]->dims);
    return true;
}

static bool infer_dropout_train(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 0);
    return true;
}

static double flops_zero(const Node *n) {
    (void)n;
    return 0;
}

/* Four integer operations and a compare per element for the mask. */
static double flops_mask(const Node *n) { return flops_per_out_elem(n, 6); }

/* Whether the node drops in training: *ratio is its ratio.  False with the
 * Diag set when its mode or ratio is not a constant. */
static bool dropout_mode(const Graph *g, Diag *d, const Node *n, bool *training, float *ratio) {
    int64_t opset = graph_opset(g, "");
    *ratio = node_attr_f(n, "ratio", 0.5f);
    *training = opset > 0 && opset < 7 && node_attr_i(n, "is_test", 1) == 0;
    if (opset >= 12 || opset == 0) {
        const Value *r = n->n_in > 1 ? n->in[1] : NULL, *t = n->n_in > 2 ? n->in[2] : NULL;
        if ((r && !(r->konst && r->konst->n == 1)) || (t && !(t->konst && t->konst->n == 1)))
            return diag_error(d, DIAG_UNSUPPORTED, "%s: node '%s' (Dropout): ratio and training_mode must be "
                              "constant scalars", g->path, n->name);
        *ratio = r ? (float)const_get_f(r->konst, 0) : 0.5f;
        *training = t && const_get_f(t->konst, 0) != 0;
    }
    if (*training && !(*ratio >= 0 && *ratio < 1))
        return diag_error(d, DIAG_UNSUPPORTED, "%s: node '%s' (Dropout): ratio %g; training needs a ratio in "
                          "[0, 1)", g->path, n->name, (double)*ratio);
    return true;
}

/* The identity, as at inference; the mask output (opset 10+) all true.
 * Training mode with a ratio is computed only in training graphs, where
 * DropoutTrain replaces the node. */
static bool k_dropout(Cg *c, const Node *n) {
    bool training;
    float ratio;
    if (!dropout_mode(c->g, c->d, n, &training, &ratio)) return false;
    if (training && ratio > 0)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Dropout): training mode with ratio %g is only "
                          "computed when training", c->g->path, n->name, (double)ratio);
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_copy(c, n->out[0], n->in[0]);
    if (n->n_out > 1 && n->out[1]) cg_fill(c, n->out[1], value_numel(n->out[1]), cg_f32(c, 1));
    cg_kernel_end(c);
    return true;
}

/* The eval step runs no dropout. */
static bool k_dropout_eval(Cg *c, const Node *n) {
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_copy(c, n->out[0], n->in[0]);
    cg_kernel_end(c);
    return true;
}

/* ---- the training form ---- */

static bool dropout_train_form(GradCtx *c, Node *n) {
    Graph *g = c->g;
    bool training;
    float ratio;
    if (!dropout_mode(g, c->d, n, &training, &ratio)) return false;
    if (!training || ratio == 0) return true; /* the identity, as it computes */
    if (n->n_out > 1 && n->out[1])
        GRAPH_FOR_NODES(g, r) {
            for (int k = 0; k < r->n_in; k++)
                if (r->in[k] == n->out[1])
                    return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Dropout): its mask is read by '%s'; "
                                      "only the output is computed in training", g->path, n->name, r->name);
        }
    Value *X = n->in[0], *pos = train_positions(c);
    if (!pos) return false;
    if (X->rank < 1 || !dim_eq(X->dims[0], pos->dims[0]) || !value_shape_known(X))
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Dropout): training draws a mask per row, so the "
                          "input's first dimension must be the batch and its shape static", g->path, n->name);
    c->phase = PHASE_FORWARD;
    c->origin = NULL;
    Value *in[4] = {X, pos, train_seed(c), c->train->step};
    Node *t = gb_start(c, "cleave", "DropoutTrain", 4, in, 1);
    if (!t) return false;
    gb_attr_f(c, t, "ratio", ratio);
    return gb_finish_replacing(c, t, n) != NULL;
}

/* Outside training Dropout is the identity, and so is its gradient. */
static bool g_dropout(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    (void)c;
    (void)n;
    if (need[0]) dx[0] = dy[0];
    return true;
}

/* dX = dY * mask / (1 - ratio): the same op on dY. */
static bool g_dropout_train(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0] || !dy[0]) return true;
    Value *in[4] = {dy[0], n->in[1], n->in[2], n->in[3]};
    Node *g = gb_start(c, "cleave", "DropoutTrain", 4, in, 1);
    gb_attr_f(c, g, "ratio", node_attr_f(n, "ratio", 0.5f));
    dx[0] = gb_finish(c, g);
    return dx[0] != NULL;
}

/* ---- the mask ---- */

/* splitmix64's finaliser: a bijection of 64-bit words that mixes every
 * input bit into every output bit. */
static LLVMValueRef mix64(Cg *c, LLVMValueRef z) {
    LLVMTypeRef t = c->t_i64;
    z = LLVMBuildXor(c->b, z, LLVMBuildLShr(c->b, z, LLVMConstInt(t, 30, 0), ""), "");
    z = LLVMBuildMul(c->b, z, LLVMConstInt(t, 0xbf58476d1ce4e5b9ull, 0), "");
    z = LLVMBuildXor(c->b, z, LLVMBuildLShr(c->b, z, LLVMConstInt(t, 27, 0), ""), "");
    z = LLVMBuildMul(c->b, z, LLVMConstInt(t, 0x94d049bb133111ebull, 0), "");
    return LLVMBuildXor(c->b, z, LLVMBuildLShr(c->b, z, LLVMConstInt(t, 31, 0), ""), "");
}

static LLVMValueRef mix_in(Cg *c, LLVMValueRef h, LLVMValueRef x) { return mix64(c, LLVMBuildXor(c->b, h, x, "")); }

/* Y = X * scale where the element's 24-bit draw is at least ratio * 2^24,
 * else 0.  The draw of element e of the row at position p in step s is the
 * top 24 bits of mix(mix(mix(mix(seed) ^ s) ^ p) ^ e * golden). */
static bool k_dropout_train(Cg *c, const Node *n) {
    const Value *X = n->in[0], *P = n->in[1], *S = n->in[2], *T = n->in[3], *Y = n->out[0];
    double ratio = node_attr_f(n, "ratio", 0.5f);
    int64_t rows = X->dims[0].k, per_row = value_numel(X) / (rows ? rows : 1);
    uint64_t threshold = (uint64_t)ceil(ratio * (double)(1 << 24));
    float scale = (float)(1.0 / (1.0 - ratio));
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMTypeRef i64 = c->t_i64;
    LLVMValueRef step = LLVMBuildFPToUI(c->b, cg_load(c, T, cg_i64(c, 0)), i64, "");
    LLVMValueRef key = mix_in(c, mix64(c, cg_load_i(c, S, cg_i64(c, 0))), step);
    CgLoop lr, le;
    LLVMValueRef r = cg_for(c, &lr, cg_i64(c, rows));
    LLVMValueRef hrow = mix_in(c, key, cg_load_i(c, P, r));
    LLVMValueRef e = cg_for(c, &le, cg_i64(c, per_row)), i = cg_mad(c, r, per_row, e);
    LLVMValueRef h = mix_in(c, hrow, LLVMBuildMul(c->b, e, LLVMConstInt(i64, 0x9e3779b97f4a7c15ull, 0), ""));
    LLVMValueRef draw = LLVMBuildLShr(c->b, h, LLVMConstInt(i64, 40, 0), "");
    LLVMValueRef keep = LLVMBuildICmp(c->b, LLVMIntUGE, draw, LLVMConstInt(i64, threshold, 0), "");
    LLVMValueRef y = LLVMBuildFMul(c->b, cg_load(c, X, i), cg_f32(c, scale), "");
    cg_store(c, Y, i, LLVMBuildSelect(c->b, keep, y, cg_f32(c, 0), ""));
    cg_for_end(c, &le);
    cg_for_end(c, &lr);
    cg_kernel_end(c);
    return true;
}

static const AttrSpec attrs_dropout[] = {{"ratio", ATTR_FLOAT, .f = 0.5f}, {"seed", ATTR_INT}, {"is_test", ATTR_INT},
                                         {0}};
static const AttrSpec attrs_dropout_train[] = {{"ratio", ATTR_FLOAT, .required = true}, {0}};

const OpDef op_Dropout = {"Dropout", "", 1, 0, 1, 3, 1, 2, attrs_dropout, 0, infer_dropout, NULL, flops_zero, .grad = g_dropout, .cg = k_dropout, .train_form = dropout_train_form};
/* The positions, seed and step inputs key the mask; they take no gradient. */
const OpDef op_DropoutTrain = {"DropoutTrain", "cleave", 1, 0, 4, 4, 1, 1, attrs_dropout_train, 0, infer_dropout_train, NULL, flops_mask, .grad = g_dropout_train, .cg = k_dropout_train, .cg_eval = k_dropout_eval};
