/* ops_reduce.c - reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin,
 * ReduceProd, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp,
 * ReduceSumSquare), which share one shape rule. */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"

/* Which dims of x the node reduces.  Axes moved from attribute to input
 * in opset 13 for ReduceSum and in opset 18 for the others.  Returns 1 when
 * known, 0 when the axes are known only at run time, -1 on error. */
static int reduce_axes(OpCtx *c, const Node *n, bool *red) {
    const Value *x = n->in[0];
    int64_t since = strcmp(n->op_type, "ReduceSum") == 0 ? 13 : 18;
    int64_t axes[MAX_RANK * 2];
    int k;
    if (c->opset >= since) {
        k = n->n_in > 1 && n->in[1] ? in_ints(n, 1, axes, MAX_RANK * 2) : 0;
        if (k == -1) return 0;
    } else {
        const int64_t *a;
        k = node_attr_ints(n, "axes", &a);
        if (k < 0) k = 0;
        if (k > MAX_RANK * 2) k = -2;
        if (k > 0) memcpy(axes, a, sizeof *a * (size_t)k);
    }
    if (k == -2) return op_error(c, n, "too many axes") ? -1 : -1;
    memset(red, 0, sizeof(bool) * MAX_RANK);
    bool noop = k == 0 && node_attr_i(n, "noop_with_empty_axes", 0) != 0;
    for (int i = 0; i < k; i++) {
        if (!norm_axis(c, n, &axes[i], x->rank)) return -1;
        red[axes[i]] = true;
    }
    if (k == 0 && !noop)
        for (int j = 0; j < x->rank; j++) red[j] = true;
    return 1;
}

static bool infer_reduce(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    if (n->n_in > 1 && n->in[1] && n->in[1]->dtype != DT_INT64)
        return op_error(c, n, "axes '%s' are %s; int64 expected", n->in[1]->name, dtype_name(n->in[1]->dtype));
    bool red[MAX_RANK];
    int known = reduce_axes(c, n, red);
    if (known < 0) return false;
    if (known == 0) { /* axes known only at run time */
        set_out_unknown(n, 0, x->dtype, node_attr_i(n, "keepdims", 1) ? x->rank : -1);
        return true;
    }
    bool keep = node_attr_i(n, "keepdims", 1) != 0;
    Dim out[MAX_RANK];
    int r = 0;
    for (int j = 0; j < x->rank; j++) {
        if (!red[j]) out[r++] = x->dims[j];
        else if (keep) out[r++] = dim_const(1);
    }
    set_out(n, 0, x->dtype, r, out);
    return true;
}

/* ---- code generation ---- */

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_SUMSQ, R_L1, R_L2, R_LOGSUM } ReduceKind;

static ReduceKind reduce_kind(const char *op) {
    static const char *names[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                  "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum"};
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (strcmp(op, names[i]) == 0) return (ReduceKind)i;
    return R_SUM;
}

/* Largest and smallest value of an integer type, as int64 bits. */
static void int_range(DType t, int64_t *lo, int64_t *hi) {
    switch (t) {
    case DT_BOOL: *lo = 0; *hi = 1; break;
    case DT_INT8: *lo = INT8_MIN; *hi = INT8_MAX; break;
    case DT_UINT8: *lo = 0; *hi = UINT8_MAX; break;
    case DT_INT16: *lo = INT16_MIN; *hi = INT16_MAX; break;
    case DT_UINT16: *lo = 0; *hi = UINT16_MAX; break;
    case DT_INT32: *lo = INT32_MIN; *hi = INT32_MAX; break;
    case DT_UINT32: *lo = 0; *hi = UINT32_MAX; break;
    case DT_UINT64: *lo = 0; *hi = -1; break; /* all bits set, compared unsigned */
    default: *lo = INT64_MIN; *hi = INT64_MAX; break;
    }
}

/* Reductions one output element at a time, accumulated in a register over
 * the reduced dims: for integers exactly in int64 (sum and product wrap as
 * numpy does; the mean truncates toward zero, as numpy's mean cast back to
 * the integer type; L2 and LogSum take the root or log in double), and for
 * float16/bfloat16 in float32, so the output is rounded once, as numpy's
 * half-precision reductions do. */
static void reduce_acc(Cg *c, const Value *x, const Value *y, const bool *red, ReduceKind kind) {
    bool ints = !dtype_is_float(x->dtype);
    LLVMTypeRef t = ints ? c->t_i64 : c->t_f32;
    int64_t xs[MAX_RANK], s = 1, count = 1;
    for (int j = x->rank - 1; j >= 0; j--) {
        xs[j] = s;
        s *= x->dims[j].k;
        if (red[j]) count *= x->dims[j].k;
    }
    int64_t lo, hi;
    int_range(x->dtype, &lo, &hi);
    bool uns = x->dtype == DT_UINT64;
    LLVMValueRef init;
    if (ints) init = cg_i64(c, kind == R_MAX ? lo : kind == R_MIN ? hi : kind == R_PROD ? 1 : 0);
    else init = cg_f32(c, kind == R_MAX ? -INFINITY : kind == R_MIN ? INFINITY : kind == R_PROD ? 1 : 0);
    LLVMValueRef acc = cg_alloca(c, t);
    CgLoop keep[MAX_RANK], over[MAX_RANK];
    LLVMValueRef base = cg_i64(c, 0), yi = cg_i64(c, 0);
    int nk = 0, nr = 0;
    for (int j = 0; j < x->rank; j++) {
        if (red[j]) continue;
        LLVMValueRef iv = cg_for(c, &keep[nk++], cg_i64(c, x->dims[j].k));
        base = cg_add(c, base, cg_mul(c, iv, xs[j]));
        yi = cg_mad(c, yi, x->dims[j].k, iv);
    }
    LLVMBuildStore(c->b, init, acc);
    LLVMValueRef xi = base;
    for (int j = 0; j < x->rank; j++) {
        if (!red[j]) continue;
        LLVMValueRef iv = cg_for(c, &over[nr++], cg_i64(c, x->dims[j].k));
        xi = cg_add(c, xi, cg_mul(c, iv, xs[j]));
    }
    LLVMValueRef v = ints ? cg_load_i(c, x, xi) : cg_load(c, x, xi), a = LLVMBuildLoad2(c->b, t, acc, ""), r;
    LLVMValueRef zero = LLVMConstNull(t);
    if (ints) {
        switch (kind) {
        case R_MAX:
            r = LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, uns ? LLVMIntUGT : LLVMIntSGT, v, a, ""), v, a, "");
            break;
        case R_MIN:
            r = LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, uns ? LLVMIntULT : LLVMIntSLT, v, a, ""), v, a, "");
            break;
        case R_PROD: r = LLVMBuildMul(c->b, a, v, ""); break;
        case R_SUMSQ: case R_L2: r = LLVMBuildAdd(c->b, a, LLVMBuildMul(c->b, v, v, ""), ""); break;
        case R_L1: {
            LLVMValueRef neg = uns ? LLVMConstInt(c->t_i1, 0, 0) : LLVMBuildICmp(c->b, LLVMIntSLT, v, zero, "");
            r = LLVMBuildAdd(c->b, a, LLVMBuildSelect(c->b, neg, LLVMBuildSub(c->b, zero, v, ""), v, ""), "");
            break;
        }
        default: r = LLVMBuildAdd(c->b, a, v, ""); break;
        }
    } else {
        switch (kind) {
        case R_MAX: r = cg_max(c, a, v); break;
        case R_MIN: {
            LLVMValueRef lt = LLVMBuildFCmp(c->b, LLVMRealOLT, a, v, "");
            LLVMValueRef nan = LLVMBuildFCmp(c->b, LLVMRealUNO, a, a, "");
            r = LLVMBuildSelect(c->b, LLVMBuildOr(c->b, lt, nan, ""), a, v, "");
            break;
        }
        case R_PROD: r = LLVMBuildFMul(c->b, a, v, ""); break;
        case R_SUMSQ: case R_L2: r = LLVMBuildFAdd(c->b, a, LLVMBuildFMul(c->b, v, v, ""), ""); break;
        case R_L1: r = LLVMBuildFAdd(c->b, a, cg_math(c, "fabs", v, NULL), ""); break;
        default: r = LLVMBuildFAdd(c->b, a, v, ""); break;
        }
    }
    LLVMBuildStore(c->b, r, acc);
    for (int j = nr - 1; j >= 0; j--) cg_for_end(c, &over[j]);
    r = LLVMBuildLoad2(c->b, t, acc, "");
    if (!ints) {
        if (kind == R_MEAN) r = LLVMBuildFMul(c->b, r, cg_f32(c, count ? 1.0 / (double)count : INFINITY), "");
        else if (kind == R_L2 || kind == R_LOGSUM) r = cg_math(c, kind == R_L2 ? "sqrt" : "log", r, NULL);
    } else if (kind == R_MEAN && count > 0) {
        r = uns ? LLVMBuildUDiv(c->b, r, cg_i64(c, count), "") : LLVMBuildSDiv(c->b, r, cg_i64(c, count), "");
    } else if (kind == R_L2 || kind == R_LOGSUM) {
        LLVMTypeRef p1 = c->t_f64, fty = LLVMFunctionType(c->t_f64, &p1, 1, 0);
        const char *name = kind == R_L2 ? "llvm.sqrt.f64" : "log";
        LLVMValueRef fn = LLVMGetNamedFunction(c->mod, name);
        if (!fn) fn = LLVMAddFunction(c->mod, name, fty);
        LLVMValueRef d = uns ? LLVMBuildUIToFP(c->b, r, c->t_f64, "") : LLVMBuildSIToFP(c->b, r, c->t_f64, "");
        r = LLVMBuildFPToSI(c->b, LLVMBuildCall2(c->b, fty, fn, &d, 1, ""), c->t_i64, "");
    }
    cg_store(c, y, yi, r);
    for (int j = nk - 1; j >= 0; j--) cg_for_end(c, &keep[j]);
}

/* Whether the reduced axes are the trailing ones (and some are): each
 * output element then sums one contiguous row of the input. */
static bool trailing_rows(const Value *x, const bool *red) {
    int t = x->rank;
    while (t > 0 && red[t - 1]) t--;
    if (t == x->rank) return false;
    for (int j = 0; j < t; j++)
        if (red[j]) return false;
    return true;
}

/* Sums over contiguous rows of `len` floats, vectorised (cg_row_sum), then
 * the mean's scale, the square root or the log. */
static void row_sums(Cg *c, const Value *x, const Value *y, int64_t rows, int64_t len, ReduceKind kind) {
    CgSumKind sk = kind == R_SUMSQ || kind == R_L2 ? CG_SUM_SQUARES : kind == R_L1 ? CG_SUM_ABS : CG_SUM_PLAIN;
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, rows));
    LLVMValueRef r = cg_row_sum(c, sk, x, cg_mul(c, i, len), NULL, NULL, len);
    if (kind == R_MEAN) r = LLVMBuildFMul(c->b, r, cg_f32(c, 1.0 / (double)len), "");
    else if (kind == R_L2 || kind == R_LOGSUM) r = cg_math(c, kind == R_L2 ? "sqrt" : "log", r, NULL);
    cg_store(c, y, i, r);
    cg_for_end(c, &l);
}

/* Float reductions: the output starts at the identity of the reduction;
 * every input element is combined into the output element it maps to; a
 * final pass applies the mean's scale, the square root or the log. */
static bool k_reduce(Cg *c, const Node *n) {
    const Value *x = n->in[0], *y = n->out[0];
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    bool red[MAX_RANK];
    if (reduce_axes(&oc, n, red) != 1)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): axes must be constant", c->g->path, n->name,
                          n->op_type);
    ReduceKind kind = reduce_kind(n->op_type);
    const Value *bufs[2] = {x, y};
    /* noop_with_empty_axes with no axes: the output is the input as is */
    bool any = false;
    for (int j = 0; j < x->rank; j++) any = any || red[j];
    bool noop = !any && node_attr_i(n, "noop_with_empty_axes", 0) != 0;
    bool narrow = x->dtype == DT_FLOAT16 || x->dtype == DT_BFLOAT16;
    if (noop || narrow || !dtype_is_float(x->dtype)) {
        if (!cg_kernel_begin(c, n, 2, bufs)) return false;
        if (noop) cg_copy(c, y, x);
        else reduce_acc(c, x, y, red, kind);
        cg_kernel_end(c);
        return true;
    }
    int64_t ny = value_numel(y), count = 1, st[MAX_RANK], s = 1;
    for (int j = x->rank - 1; j >= 0; j--) {
        st[j] = red[j] ? 0 : s;
        if (red[j]) count *= x->dims[j].k;
        else s *= x->dims[j].k;
    }
    if (!cg_kernel_begin(c, n, 2, bufs)) return false;
    if (kind != R_MAX && kind != R_MIN && kind != R_PROD && trailing_rows(x, red) && count > 0) {
        row_sums(c, x, y, ny, count, kind);
        cg_kernel_end(c);
        return true;
    }
    double init = kind == R_MAX ? -INFINITY : kind == R_MIN ? INFINITY : kind == R_PROD ? 1 : 0;
    cg_fill(c, y, ny, cg_f32(c, init));
    CgLoop loops[MAX_RANK];
    LLVMValueRef xi = cg_i64(c, 0), yi = cg_i64(c, 0);
    for (int j = 0; j < x->rank; j++) {
        LLVMValueRef iv = cg_for(c, &loops[j], cg_i64(c, x->dims[j].k));
        xi = cg_mad(c, xi, x->dims[j].k, iv);
        if (st[j]) yi = cg_add(c, yi, cg_mul(c, iv, st[j]));
    }
    LLVMValueRef v = cg_load(c, x, xi), acc = cg_load(c, y, yi), r;
    switch (kind) {
    case R_MAX: r = cg_max(c, acc, v); break;
    case R_MIN: {
        /* NaN-propagating, like numpy's minimum */
        LLVMValueRef lt = LLVMBuildFCmp(c->b, LLVMRealOLT, acc, v, "");
        LLVMValueRef nan = LLVMBuildFCmp(c->b, LLVMRealUNO, acc, acc, "");
        r = LLVMBuildSelect(c->b, LLVMBuildOr(c->b, lt, nan, ""), acc, v, "");
        break;
    }
    case R_PROD: r = LLVMBuildFMul(c->b, acc, v, ""); break;
    case R_SUMSQ: case R_L2: r = LLVMBuildFAdd(c->b, acc, LLVMBuildFMul(c->b, v, v, ""), ""); break;
    case R_L1: r = LLVMBuildFAdd(c->b, acc, cg_math(c, "fabs", v, NULL), ""); break;
    default: r = LLVMBuildFAdd(c->b, acc, v, ""); break;
    }
    cg_store(c, y, yi, r);
    for (int j = x->rank - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
    if (kind == R_MEAN || kind == R_L2 || kind == R_LOGSUM) {
        CgLoop l;
        LLVMValueRef i = cg_for(c, &l, cg_i64(c, ny));
        LLVMValueRef a = cg_load(c, y, i);
        /* the mean of nothing is NaN (0 * inf), as numpy's */
        if (kind == R_MEAN) a = LLVMBuildFMul(c->b, a, cg_f32(c, count ? 1.0 / (double)count : INFINITY), "");
        else a = cg_math(c, kind == R_L2 ? "sqrt" : "log", a, NULL);
        cg_store(c, y, i, a);
        cg_for_end(c, &l);
    }
    cg_kernel_end(c);
    return true;
}

/* ---- gradient rules: dy broadcast back over the reduced axes ---- */

static bool g_reduce_linear(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    const Value *x = n->in[0];
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    bool red[MAX_RANK];
    int known = reduce_axes(&oc, n, red);
    if (known < 0) return false;
    if (known == 0)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): the gradient needs constant axes, not '%s'",
                          c->g->path, n->name, n->op_type, n->in[1]->name);
    int64_t axes[MAX_RANK], count = 1;
    int na = 0;
    for (int j = 0; j < x->rank; j++)
        if (red[j]) {
            axes[na++] = j;
            count *= x->dims[j].k;
        }
    Value *in[2] = {dy[0], n->in[0]};
    Node *g = gb_start(c, "cleave", "ReduceGrad", 2, in, 1);
    gb_attr_ints(c, g, "axes", axes, na);
    if (strcmp(n->op_type, "ReduceMean") == 0) gb_attr_f(c, g, "scale", 1.0f / (float)(count ? count : 1));
    dx[0] = gb_finish(c, g);
    return true;
}

static double flops_reduce(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : (double)e;
}

static const AttrSpec attrs_reduce[] = {
    {"axes", ATTR_INTS}, {"keepdims", ATTR_INT, .i = 1}, {"noop_with_empty_axes", ATTR_INT, .i = 0}, {0}};

const OpDef op_ReduceMean = {"ReduceMean", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .grad = g_reduce_linear, .cg = k_reduce};
const OpDef op_ReduceSum = {"ReduceSum", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .grad = g_reduce_linear, .cg = k_reduce};
const OpDef op_ReduceMax = {"ReduceMax", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .cg = k_reduce};
const OpDef op_ReduceMin = {"ReduceMin", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .cg = k_reduce};
const OpDef op_ReduceProd = {"ReduceProd", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .cg = k_reduce};
const OpDef op_ReduceL1 = {"ReduceL1", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .cg = k_reduce};
const OpDef op_ReduceL2 = {"ReduceL2", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .cg = k_reduce};
const OpDef op_ReduceLogSum = {"ReduceLogSum", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .cg = k_reduce};
const OpDef op_ReduceLogSumExp = {"ReduceLogSumExp", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce};
const OpDef op_ReduceSumSquare = {"ReduceSumSquare", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce, .cg = k_reduce};
