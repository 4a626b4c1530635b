/* ops_elementwise.c - element-wise operators: arithmetic with numpy
 * broadcasting, Max/Min, activations, Clip, comparisons and logic, Where,
 * Cast/CastLike, Identity, and the shape-preserving Softmax family; and
 * the gradient ops of Clip, HardSigmoid and HardSwish, whose scalar
 * functions share the clamping of their forward ops. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"
#include "../codegen/cg_gemm.h"

/* ---- shape rules ---- */

/* Before opset 7 the binary ops did not broadcast numpy-style: with
 * broadcast=1, B is either one element or a contiguous run of A's dims
 * starting at 'axis' (a suffix when absent; dims of 1 in B are let
 * through); without it the shapes are equal.  The result has A's shape. */
static bool legacy_broadcast(OpCtx *c, const Node *n, Dim *dims, int *rank) {
    const Value *a = n->in[0], *b = n->in[1];
    int64_t axis = 0;
    if (node_attr_i(n, "broadcast", 0) == 0) {
        if (b->rank != a->rank)
            return op_error(c, n, "'%s' has rank %d and '%s' rank %d; without broadcast=1 (opset %lld) the shapes "
                            "must be equal", a->name, a->rank, b->name, b->rank, (long long)c->opset);
    } else if (value_numel(b) != 1) {
        const Attr *ax = node_attr(n, "axis");
        axis = ax ? ax->i : a->rank - b->rank;
        if (axis < 0) axis += a->rank;
        if (b->rank > a->rank || axis < 0 || axis + b->rank > a->rank)
            return op_error(c, n, "'%s' (rank %d) does not fit into '%s' (rank %d) at axis %lld", b->name, b->rank,
                            a->name, a->rank, (long long)axis);
    } else {
        axis = -1; /* one element: nothing to match */
    }
    for (int j = 0; axis >= 0 && j < b->rank; j++) {
        Dim x = a->dims[axis + j], y = b->dims[j];
        if (dim_is_const(x) && dim_is_const(y) && x.k != y.k && y.k != 1)
            return op_error(c, n, "dimension %lld of '%s' does not match %lld of '%s' (opset %lld broadcasting)",
                            (long long)y.k, b->name, (long long)x.k, a->name, (long long)c->opset);
    }
    for (int j = 0; j < a->rank; j++) dims[j] = a->dims[j];
    *rank = a->rank;
    return true;
}

/* Broadcasting of a binary op at the node's opset. */
static bool broadcast_binary(OpCtx *c, const Node *n, Dim *dims, int *rank) {
    if (c->opset < 7) return legacy_broadcast(c, n, dims, rank);
    return broadcast_inputs(c, n, 0, n->n_in, dims, rank);
}

/* Inputs of one dtype broadcast together; output of that dtype (or bool). */
static bool infer_broadcast_as(OpCtx *c, Node *n, bool to_bool) {
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    Dim dims[MAX_RANK];
    int rank;
    if (!broadcast_binary(c, n, dims, &rank)) return false;
    set_out(n, 0, to_bool ? DT_BOOL : t, rank, dims);
    return true;
}

static bool infer_broadcast(OpCtx *c, Node *n) { return infer_broadcast_as(c, n, false); }
static bool infer_compare(OpCtx *c, Node *n) { return infer_broadcast_as(c, n, true); }

/* Max, Min: any number of inputs of one dtype, numpy-broadcast together. */
static bool infer_variadic(OpCtx *c, Node *n) {
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    Dim dims[MAX_RANK];
    int rank;
    if (!broadcast_inputs(c, n, 0, n->n_in, dims, &rank)) return false;
    set_out(n, 0, t, rank, dims);
    return true;
}

static bool infer_float_variadic(OpCtx *c, Node *n) {
    if (!infer_variadic(c, n)) return false;
    if (!dtype_is_float(n->out[0]->dtype))
        return op_error(c, n, "inputs are %s; a floating-point type is required", dtype_name(n->out[0]->dtype));
    return true;
}

static bool infer_unary(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 0);
    return true;
}

static bool infer_float_unary(OpCtx *c, Node *n) {
    if (n->in[0]->dtype != DT_UNDEFINED && !dtype_is_float(n->in[0]->dtype))
        return op_error(c, n, "input '%s' is %s; a floating-point type is required", n->in[0]->name,
                        dtype_name(n->in[0]->dtype));
    same_as_input(n, 0, 0);
    return true;
}

/* Clip's min and max are float attributes before opset 11, and optional
 * inputs of x's type, one element each, from opset 11 (integer types
 * too). */
static bool infer_clip(OpCtx *c, Node *n) {
    if (c->opset < 11) {
        if (n->n_in > 1) return op_error(c, n, "min and max are attributes before opset 11, not inputs");
        return infer_float_unary(c, n);
    }
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    for (int i = 1; i < n->n_in; i++)
        if (n->in[i] && value_numel(n->in[i]) != 1)
            return op_error(c, n, "%s '%s' must be a scalar (one element)", i == 1 ? "min" : "max", n->in[i]->name);
    same_as_input(n, 0, 0);
    return true;
}

/* Pow: base and exponent may differ in type; the result has the base's. */
static bool infer_pow(OpCtx *c, Node *n) {
    Dim dims[MAX_RANK];
    int rank;
    if (!broadcast_binary(c, n, dims, &rank)) return false;
    set_out(n, 0, n->in[0]->dtype, rank, dims);
    return true;
}

static bool infer_where(OpCtx *c, Node *n) {
    if (n->in[0]->dtype != DT_UNDEFINED && n->in[0]->dtype != DT_BOOL)
        return op_error(c, n, "condition '%s' is %s, not bool", n->in[0]->name, dtype_name(n->in[0]->dtype));
    DType t;
    if (!same_dtype(c, n, 1, 2, &t)) return false;
    Dim dims[MAX_RANK];
    int rank;
    if (!broadcast_inputs(c, n, 0, 3, dims, &rank)) return false;
    set_out(n, 0, t, rank, dims);
    return true;
}

/* Targets cleave has no storage for (strings, 8-bit floats, 4-bit and
 * 2-bit integers, ...) are valid ONNX but refused, like such tensors in a
 * model file. */
static bool infer_cast(OpCtx *c, Node *n) {
    const Attr *a = node_attr(n, "to");
    int64_t to = a ? a->i : 0;
    if (to <= 0) return op_error(c, n, "attribute 'to' = %lld is not a data type", (long long)to);
    if (!dtype_size((DType)to) || dtype_store((DType)to) == DT_UNDEFINED)
        return to == DT_STRING ? op_error_kind(c, n, DIAG_UNSUPPORTED, "casting to string is not supported")
                               : op_error_kind(c, n, DIAG_UNSUPPORTED,
                                               "casting to ONNX data type %lld is not supported (cleave handles "
                                               "float, integer and bool types)", (long long)to);
    set_out(n, 0, (DType)to, n->in[0]->rank, n->in[0]->dims);
    return true;
}

/* CastLike: Cast to the type of the second input. */
static bool infer_castlike(OpCtx *c, Node *n) {
    (void)c;
    set_out(n, 0, n->in[1]->dtype, n->in[0]->rank, n->in[0]->dims);
    return true;
}

/* The mask is bool since opset 10, of the input's type before. */
static bool infer_softmax(OpCtx *c, Node *n) {
    /* The default axis changed from 1 to -1 in opset 13. */
    const Attr *a = node_attr(n, "axis");
    int64_t axis = a ? a->i : (c->opset >= 13 ? -1 : 1);
    if (n->in[0]->rank > 0 && !norm_axis(c, n, &axis, n->in[0]->rank)) return false;
    return infer_float_unary(c, n);
}

/* ---- constant evaluation ---- */

static double f_add(const double *x, const Node *n) { (void)n; return x[0] + x[1]; }
static double f_sub(const double *x, const Node *n) { (void)n; return x[0] - x[1]; }
static double f_mul(const double *x, const Node *n) { (void)n; return x[0] * x[1]; }
static double f_div(const double *x, const Node *n) { (void)n; return x[0] / x[1]; }
static double f_pow(const double *x, const Node *n) { (void)n; return pow(x[0], x[1]); }
static double f_sqrt(const double *x, const Node *n) { (void)n; return sqrt(x[0]); }
static double f_neg(const double *x, const Node *n) { (void)n; return -x[0]; }
static double f_erf(const double *x, const Node *n) { (void)n; return erf(x[0]); }
static double f_exp(const double *x, const Node *n) { (void)n; return exp(x[0]); }
static double f_log(const double *x, const Node *n) { (void)n; return log(x[0]); }
static double f_abs(const double *x, const Node *n) { (void)n; return fabs(x[0]); }
static double f_recip(const double *x, const Node *n) { (void)n; return 1.0 / x[0]; }
static double f_relu(const double *x, const Node *n) { (void)n; return x[0] > 0 ? x[0] : 0; }
static double f_sigmoid(const double *x, const Node *n) { (void)n; return 1.0 / (1.0 + exp(-x[0])); }
static double f_tanh(const double *x, const Node *n) { (void)n; return tanh(x[0]); }
static double f_copy(const double *x, const Node *n) { (void)n; return x[0]; }
static double f_equal(const double *x, const Node *n) { (void)n; return x[0] == x[1]; }
static double f_less(const double *x, const Node *n) { (void)n; return x[0] < x[1]; }
static double f_greater(const double *x, const Node *n) { (void)n; return x[0] > x[1]; }
static double f_where(const double *x, const Node *n) { (void)n; return x[0] != 0 ? x[1] : x[2]; }
static double f_not(const double *x, const Node *n) { (void)n; return x[0] == 0; }
static double f_ge(const double *x, const Node *n) { (void)n; return x[0] >= x[1]; }
static double f_le(const double *x, const Node *n) { (void)n; return x[0] <= x[1]; }
static double f_and(const double *x, const Node *n) { (void)n; return x[0] != 0 && x[1] != 0; }
static double f_or(const double *x, const Node *n) { (void)n; return x[0] != 0 || x[1] != 0; }
static double f_xor(const double *x, const Node *n) { (void)n; return (x[0] != 0) != (x[1] != 0); }
static double f_max(const double *x, const Node *n) {
    double m = x[0];
    for (int i = 1; i < n->n_in; i++) m = x[i] > m ? x[i] : m;
    return m;
}
static double f_sum(const double *x, const Node *n) {
    double s = x[0];
    for (int i = 1; i < n->n_in; i++) s += x[i];
    return s;
}
static double f_mean(const double *x, const Node *n) { return f_sum(x, n) / n->n_in; }
static double f_min(const double *x, const Node *n) {
    double m = x[0];
    for (int i = 1; i < n->n_in; i++) m = x[i] < m ? x[i] : m;
    return m;
}
/* fmod=0: the result takes the divisor's sign, as Python's %. */
static double f_mod(const double *x, const Node *n) {
    double r = fmod(x[0], x[1]);
    if (node_attr_i(n, "fmod", 0) == 0 && r != 0 && (r < 0) != (x[1] < 0)) r += x[1];
    return r;
}
static double f_leaky(const double *x, const Node *n) {
    return x[0] >= 0 ? x[0] : x[0] * node_attr_f(n, "alpha", 0.01f);
}
/* min(max(x, lo), hi) as ONNX defines Clip: NaN stays NaN (both
 * comparisons are false for it), as in np.clip, and lo > hi gives hi. */
static double clamp_d(double x, double lo, double hi) {
    double y = x < lo ? lo : x;
    return y > hi ? hi : y;
}
/* Clip from opset 11: x[1] and x[2] are the bounds when present. */
static double f_clip(const double *x, const Node *n) {
    bool lo = n->n_in > 1 && n->in[1], hi = n->n_in > 2 && n->in[2];
    return clamp_d(x[0], lo ? x[1] : -INFINITY, hi ? x[2] : INFINITY);
}
/* Clip before opset 11: the attributes, whose absence means -+FLT_MAX. */
static double f_clip_attrs(const double *x, const Node *n) {
    return clamp_d(x[0], node_attr_f(n, "min", -FLT_MAX), node_attr_f(n, "max", FLT_MAX));
}
static double f_hardsigmoid(const double *x, const Node *n) {
    return clamp_d(node_attr_f(n, "alpha", 0.2f) * x[0] + node_attr_f(n, "beta", 0.5f), 0, 1);
}
static double f_hardswish(const double *x, const Node *n) { (void)n; return x[0] * clamp_d(x[0] + 3, 0, 6) / 6; }

/* Integer forms: exact in int64 (shape arithmetic must not round). */
static int64_t i_add(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return (int64_t)((uint64_t)x[0] + (uint64_t)x[1]); }
static int64_t i_sub(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return (int64_t)((uint64_t)x[0] - (uint64_t)x[1]); }
static int64_t i_mul(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return (int64_t)((uint64_t)x[0] * (uint64_t)x[1]); }
static int64_t i_div(const int64_t *x, const Node *n, bool *ok) {
    (void)n;
    if (x[1] == 0 || (x[0] == INT64_MIN && x[1] == -1)) { *ok = false; return 0; }
    return x[0] / x[1];
}
static int64_t i_neg(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return (int64_t)(0 - (uint64_t)x[0]); }
static int64_t i_abs(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] < 0 ? (int64_t)(0 - (uint64_t)x[0]) : x[0]; }
static int64_t i_copy(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0]; }
static int64_t i_equal(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] == x[1]; }
static int64_t i_less(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] < x[1]; }
static int64_t i_greater(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] > x[1]; }
static int64_t i_where(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] ? x[1] : x[2]; }
static int64_t i_ge(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] >= x[1]; }
static int64_t i_le(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] <= x[1]; }
static int64_t i_and(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] && x[1]; }
static int64_t i_or(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] || x[1]; }
static int64_t i_xor(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return !x[0] != !x[1]; }
static int64_t i_max(const int64_t *x, const Node *n, bool *ok) {
    (void)ok;
    int64_t m = x[0];
    for (int i = 1; i < n->n_in; i++) m = x[i] > m ? x[i] : m;
    return m;
}
static int64_t i_min(const int64_t *x, const Node *n, bool *ok) {
    (void)ok;
    int64_t m = x[0];
    for (int i = 1; i < n->n_in; i++) m = x[i] < m ? x[i] : m;
    return m;
}
static int64_t i_mod(const int64_t *x, const Node *n, bool *ok) {
    if (x[1] == 0) { *ok = false; return 0; }
    if (x[1] == -1) return 0; /* INT64_MIN % -1 overflows */
    int64_t r = x[0] % x[1];
    if (node_attr_i(n, "fmod", 0) == 0 && r != 0 && (r < 0) != (x[1] < 0)) r += x[1];
    return r;
}
static int64_t i_not(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] == 0; }
static int64_t i_clip(const int64_t *x, const Node *n, bool *ok) {
    (void)ok;
    int64_t y = x[0];
    if (n->n_in > 1 && n->in[1] && y < x[1]) y = x[1];
    if (n->n_in > 2 && n->in[2] && y > x[2]) y = x[2];
    return y;
}

#define FOLDER(name, ff, fi) \
    static FoldResult name(OpCtx *c, Node *n) { return fold_elementwise(c, n, ff, fi); }
FOLDER(fold_add, f_add, i_add)
FOLDER(fold_sub, f_sub, i_sub)
FOLDER(fold_mul, f_mul, i_mul)
FOLDER(fold_div, f_div, i_div)
FOLDER(fold_pow, f_pow, NULL)
FOLDER(fold_sqrt, f_sqrt, NULL)
FOLDER(fold_neg, f_neg, i_neg)
FOLDER(fold_abs, f_abs, i_abs)
FOLDER(fold_erf, f_erf, NULL)
FOLDER(fold_exp, f_exp, NULL)
FOLDER(fold_log, f_log, NULL)
FOLDER(fold_recip, f_recip, NULL)
FOLDER(fold_relu, f_relu, NULL)
FOLDER(fold_leaky, f_leaky, NULL)
FOLDER(fold_sigmoid, f_sigmoid, NULL)
FOLDER(fold_tanh, f_tanh, NULL)
FOLDER(fold_equal, f_equal, i_equal)
FOLDER(fold_less, f_less, i_less)
FOLDER(fold_greater, f_greater, i_greater)
FOLDER(fold_where, f_where, i_where)
FOLDER(fold_ge, f_ge, i_ge)
FOLDER(fold_le, f_le, i_le)
FOLDER(fold_and, f_and, i_and)
FOLDER(fold_or, f_or, i_or)
FOLDER(fold_xor, f_xor, i_xor)
FOLDER(fold_max, f_max, i_max)
FOLDER(fold_sum, f_sum, NULL)
FOLDER(fold_mean, f_mean, NULL)
FOLDER(fold_min, f_min, i_min)
FOLDER(fold_mod, f_mod, i_mod)
FOLDER(fold_not, f_not, i_not)
FOLDER(fold_copy, f_copy, i_copy)
FOLDER(fold_hardsigmoid, f_hardsigmoid, NULL)
FOLDER(fold_hardswish, f_hardswish, NULL)

/* Integer Clip (shape arithmetic) folds exactly in int64. */
static FoldResult fold_clip(OpCtx *c, Node *n) {
    return c->opset < 11 ? fold_elementwise(c, n, f_clip_attrs, NULL) : fold_elementwise(c, n, f_clip, i_clip);
}

static double f_nonzero(const double *x, const Node *n) { (void)n; return x[0] != 0; }
static int64_t i_nonzero(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] != 0; }

/* Cast to an integer type from floats truncates toward zero, as ONNX does,
 * and to bool tests for nonzero; symbolic integers pass through casts
 * between integer types. */
static FoldResult fold_cast(OpCtx *c, Node *n) {
    if (n->out[0]->dtype == DT_BOOL) return fold_elementwise(c, n, f_nonzero, i_nonzero);
    const Value *x = n->in[0];
    if (x->konst && x->konst->sym && value_is_const(x) && dtype_store(n->out[0]->dtype) == DT_INT64) {
        Const *r = fold_out(c, n, 0);
        if (!r) return FOLD_NO;
        for (int64_t i = 0; i < r->n; i++)
            if (!const_copy_elem(c->g, r, i, x->konst, i)) return FOLD_NO;
        return FOLD_DONE;
    }
    return fold_elementwise(c, n, f_copy, i_copy);
}

/* CastLike folds as Cast: its second input contributes only the type. */
static FoldResult fold_castlike(OpCtx *c, Node *n) {
    Node probe = *n;
    probe.n_in = 1;
    return fold_cast(c, &probe);
}

/* ---- FLOP counts: per output element ---- */

static double flops_1(const Node *n) { return flops_per_out_elem(n, 1); }
static double flops_transcend(const Node *n) { return flops_per_out_elem(n, 4); }
static double flops_zero(const Node *n) { (void)n; return 0; }
/* max, subtract, exp, sum, divide */
static double flops_softmax(const Node *n) { return flops_per_out_elem(n, 5); }

/* ---- code generation: scalar functions over the broadcasting nest ---- */

/* cg_elementwise hands the scalar functions i64 elements when every input
 * is an integer tensor (exact integer arithmetic) and float32 otherwise.
 * Only uint64 needs unsigned instructions: narrower unsigned types load
 * zero-extended, so they are non-negative as int64. */
static bool is_i(Cg *c, LLVMValueRef x) { return LLVMTypeOf(x) == c->t_i64; }
static bool u64_in(const Node *n) { return n->in[0]->dtype == DT_UINT64; }
static bool u64_out(const Node *n) { return n->out[0]->dtype == DT_UINT64; }
/* float32 of an element, for functions that only exist in floating point */
static LLVMValueRef as_f(Cg *c, const Node *n, LLVMValueRef x) {
    if (!is_i(c, x)) return x;
    return u64_in(n) ? LLVMBuildUIToFP(c->b, x, c->t_f32, "") : LLVMBuildSIToFP(c->b, x, c->t_f32, "");
}
static LLVMValueRef b_to_i64(Cg *c, LLVMValueRef b) { return LLVMBuildZExt(c->b, b, c->t_i64, ""); }

static LLVMValueRef s_add(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    return is_i(c, x[0]) ? LLVMBuildAdd(c->b, x[0], x[1], "") : LLVMBuildFAdd(c->b, x[0], x[1], "");
}
static LLVMValueRef s_sub(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    return is_i(c, x[0]) ? LLVMBuildSub(c->b, x[0], x[1], "") : LLVMBuildFSub(c->b, x[0], x[1], "");
}
static LLVMValueRef s_mul(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    return is_i(c, x[0]) ? LLVMBuildMul(c->b, x[0], x[1], "") : LLVMBuildFMul(c->b, x[0], x[1], "");
}
/* Integer division truncates toward zero (numpy's true division cast back
 * to the integer type); a zero divisor gives 0 instead of trapping, and
 * INT64_MIN / -1 wraps. */
static LLVMValueRef s_div(Cg *c, const Node *n, LLVMValueRef *x) {
    if (!is_i(c, x[0])) return LLVMBuildFDiv(c->b, x[0], x[1], "");
    LLVMValueRef zero = cg_i64(c, 0), one = cg_i64(c, 1);
    LLVMValueRef z = LLVMBuildICmp(c->b, LLVMIntEQ, x[1], zero, "");
    LLVMValueRef d = LLVMBuildSelect(c->b, z, one, x[1], "");
    LLVMValueRef q;
    if (u64_out(n)) {
        q = LLVMBuildUDiv(c->b, x[0], d, "");
    } else {
        LLVMValueRef m1 = LLVMBuildICmp(c->b, LLVMIntEQ, d, cg_i64(c, -1), "");
        LLVMValueRef safe = LLVMBuildSelect(c->b, m1, one, d, "");
        q = LLVMBuildSelect(c->b, m1, LLVMBuildSub(c->b, zero, x[0], ""), LLVMBuildSDiv(c->b, x[0], safe, ""), "");
    }
    return LLVMBuildSelect(c->b, z, zero, q, "");
}
/* Integer results are computed in double precision and truncated, which is
 * exact while they stay below 2^53. */
static LLVMValueRef s_pow(Cg *c, const Node *n, LLVMValueRef *x) {
    if (dtype_is_float(n->out[0]->dtype)) return cg_math(c, "pow", as_f(c, n, x[0]), x[1]);
    LLVMTypeRef ps[2] = {c->t_f64, c->t_f64};
    LLVMTypeRef fty = LLVMFunctionType(c->t_f64, ps, 2, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(c->mod, "pow");
    if (!fn) fn = LLVMAddFunction(c->mod, "pow", fty);
    LLVMValueRef a[2];
    for (int i = 0; i < 2; i++)
        a[i] = is_i(c, x[i]) ? LLVMBuildSIToFP(c->b, x[i], c->t_f64, "") : LLVMBuildFPExt(c->b, x[i], c->t_f64, "");
    return LLVMBuildFPToSI(c->b, LLVMBuildCall2(c->b, fty, fn, a, 2, ""), c->t_i64, "");
}
static LLVMValueRef s_copy(Cg *c, const Node *n, LLVMValueRef *x) { (void)c; (void)n; return x[0]; }
static LLVMValueRef s_neg(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    return is_i(c, x[0]) ? LLVMBuildSub(c->b, cg_i64(c, 0), x[0], "") : LLVMBuildFNeg(c->b, x[0], "");
}
static LLVMValueRef s_abs(Cg *c, const Node *n, LLVMValueRef *x) {
    if (!is_i(c, x[0])) return cg_math(c, "fabs", x[0], NULL);
    if (u64_in(n)) return x[0];
    LLVMValueRef neg = LLVMBuildICmp(c->b, LLVMIntSLT, x[0], cg_i64(c, 0), "");
    return LLVMBuildSelect(c->b, neg, LLVMBuildSub(c->b, cg_i64(c, 0), x[0], ""), x[0], "");
}
static LLVMValueRef s_sqrt(Cg *c, const Node *n, LLVMValueRef *x) { return cg_math(c, "sqrt", as_f(c, n, x[0]), NULL); }
static LLVMValueRef s_exp(Cg *c, const Node *n, LLVMValueRef *x) { return cg_math(c, "exp", as_f(c, n, x[0]), NULL); }
static LLVMValueRef s_log(Cg *c, const Node *n, LLVMValueRef *x) { return cg_math(c, "log", as_f(c, n, x[0]), NULL); }
static LLVMValueRef s_tanh(Cg *c, const Node *n, LLVMValueRef *x) { return cg_math(c, "tanh", as_f(c, n, x[0]), NULL); }
static LLVMValueRef s_erf(Cg *c, const Node *n, LLVMValueRef *x) { return cg_math(c, "erf", as_f(c, n, x[0]), NULL); }
static LLVMValueRef s_recip(Cg *c, const Node *n, LLVMValueRef *x) {
    return LLVMBuildFDiv(c->b, cg_f32(c, 1), as_f(c, n, x[0]), "");
}
/* x < 0 ? 0 : x keeps NaN, as torch.relu does */
static LLVMValueRef s_relu(Cg *c, const Node *n, LLVMValueRef *x) {
    if (is_i(c, x[0])) {
        if (u64_in(n)) return x[0];
        LLVMValueRef neg = LLVMBuildICmp(c->b, LLVMIntSLT, x[0], cg_i64(c, 0), "");
        return LLVMBuildSelect(c->b, neg, cg_i64(c, 0), x[0], "");
    }
    LLVMValueRef neg = LLVMBuildFCmp(c->b, LLVMRealOLT, x[0], cg_f32(c, 0), "");
    return LLVMBuildSelect(c->b, neg, cg_f32(c, 0), x[0], "");
}
static LLVMValueRef s_leaky(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef v = as_f(c, n, x[0]);
    LLVMValueRef neg = LLVMBuildFCmp(c->b, LLVMRealOLT, v, cg_f32(c, 0), "");
    LLVMValueRef scaled = LLVMBuildFMul(c->b, v, cg_f32(c, node_attr_f(n, "alpha", 0.01f)), "");
    return LLVMBuildSelect(c->b, neg, scaled, v, "");
}
static LLVMValueRef s_sigmoid(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef e = cg_math(c, "exp", LLVMBuildFNeg(c->b, as_f(c, n, x[0]), ""), NULL);
    return LLVMBuildFDiv(c->b, cg_f32(c, 1), LLVMBuildFAdd(c->b, cg_f32(c, 1), e, ""), "");
}
/* The condition is bool: loaded as 0/1 (i64, or float32 when x and y are
 * floats). */
static LLVMValueRef s_where(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    LLVMValueRef t = is_i(c, x[0]) ? LLVMBuildICmp(c->b, LLVMIntNE, x[0], cg_i64(c, 0), "")
                                   : LLVMBuildFCmp(c->b, LLVMRealUNE, x[0], cg_f32(c, 0), "");
    return LLVMBuildSelect(c->b, t, x[1], x[2], "");
}
/* Comparisons give 0/1 for the bool output (cg_store). */
static LLVMValueRef compare(Cg *c, const Node *n, LLVMRealPredicate fp, LLVMIntPredicate sp, LLVMIntPredicate up,
                            LLVMValueRef a, LLVMValueRef b) {
    if (is_i(c, a)) return b_to_i64(c, LLVMBuildICmp(c->b, u64_in(n) ? up : sp, a, b, ""));
    return LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, fp, a, b, ""), cg_f32(c, 1), cg_f32(c, 0), "");
}
static LLVMValueRef s_equal(Cg *c, const Node *n, LLVMValueRef *x) {
    return compare(c, n, LLVMRealOEQ, LLVMIntEQ, LLVMIntEQ, x[0], x[1]);
}
static LLVMValueRef s_less(Cg *c, const Node *n, LLVMValueRef *x) {
    return compare(c, n, LLVMRealOLT, LLVMIntSLT, LLVMIntULT, x[0], x[1]);
}
static LLVMValueRef s_greater(Cg *c, const Node *n, LLVMValueRef *x) {
    return compare(c, n, LLVMRealOGT, LLVMIntSGT, LLVMIntUGT, x[0], x[1]);
}
/* Max and Min over the present inputs; NaN propagates as numpy's maximum
 * and minimum do. */
static LLVMValueRef s_extreme(Cg *c, const Node *n, LLVMValueRef *x, bool max) {
    int k = 0;
    for (int i = 0; i < n->n_in; i++) k += n->in[i] != NULL;
    LLVMValueRef m = x[0];
    for (int i = 1; i < k; i++) {
        if (is_i(c, m)) {
            LLVMIntPredicate p = u64_in(n) ? (max ? LLVMIntUGT : LLVMIntULT) : (max ? LLVMIntSGT : LLVMIntSLT);
            m = LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, p, x[i], m, ""), x[i], m, "");
        } else if (max) {
            m = cg_max(c, m, x[i]);
        } else {
            LLVMValueRef lt = LLVMBuildFCmp(c->b, LLVMRealOLT, m, x[i], "");
            LLVMValueRef nan = LLVMBuildFCmp(c->b, LLVMRealUNO, m, m, "");
            m = LLVMBuildSelect(c->b, LLVMBuildOr(c->b, lt, nan, ""), m, x[i], "");
        }
    }
    return m;
}
static LLVMValueRef s_max(Cg *c, const Node *n, LLVMValueRef *x) { return s_extreme(c, n, x, true); }
/* x0 + x1 + ... in input order, as ONNX's reference adds them (float
 * inputs: Sum and Mean are float-only). */
static LLVMValueRef s_sum(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef s = x[0];
    for (int i = 1; i < n->n_in; i++) s = LLVMBuildFAdd(c->b, s, x[i], "");
    return s;
}
static LLVMValueRef s_mean(Cg *c, const Node *n, LLVMValueRef *x) {
    return LLVMBuildFDiv(c->b, s_sum(c, n, x), cg_f32(c, n->n_in), "");
}
static LLVMValueRef s_min(Cg *c, const Node *n, LLVMValueRef *x) { return s_extreme(c, n, x, false); }

/* a < b as an i1, for either kind of operand cg_elementwise hands over. */
static LLVMValueRef less(Cg *c, const Node *n, LLVMValueRef a, LLVMValueRef b) {
    if (is_i(c, a)) return LLVMBuildICmp(c->b, u64_in(n) ? LLVMIntULT : LLVMIntSLT, a, b, "");
    return LLVMBuildFCmp(c->b, LLVMRealOLT, a, b, "");
}
/* min(max(y, lo), hi) as clamp_d computes it (NaN kept, hi when lo > hi);
 * a NULL bound leaves that side open. */
static LLVMValueRef clamp_v(Cg *c, const Node *n, LLVMValueRef y, LLVMValueRef lo, LLVMValueRef hi) {
    if (lo) y = LLVMBuildSelect(c->b, less(c, n, y, lo), lo, y, "");
    if (hi) y = LLVMBuildSelect(c->b, less(c, n, hi, y), hi, y, "");
    return y;
}
/* Clip's bounds are attributes before opset 11; ClipGrad, which the
 * gradient rule builds, always takes them as inputs. */
static bool clip_attr_form(const Graph *g, const Node *n) {
    return !(n->domain && *n->domain) && graph_opset(g, "") < 11;
}
/* The bounds of Clip (first = 1) or ClipGrad (first = 2) inside a scalar
 * function, whose operands x[] skip omitted inputs; NULL for an open side. */
static void clip_bounds(Cg *c, const Node *n, int first, LLVMValueRef *x, LLVMValueRef *lo, LLVMValueRef *hi) {
    if (clip_attr_form(c->g, n)) {
        *lo = cg_f32(c, node_attr_f(n, "min", -FLT_MAX));
        *hi = cg_f32(c, node_attr_f(n, "max", FLT_MAX));
        return;
    }
    int k = first;
    *lo = first < n->n_in && n->in[first] ? x[k++] : NULL;
    *hi = first + 1 < n->n_in && n->in[first + 1] ? x[k] : NULL;
}
static LLVMValueRef s_clip(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef lo, hi;
    clip_bounds(c, n, 1, x, &lo, &hi);
    return clamp_v(c, n, x[0], lo, hi);
}
static LLVMValueRef s_hardsigmoid(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef t = LLVMBuildFMul(c->b, x[0], cg_f32(c, node_attr_f(n, "alpha", 0.2f)), "");
    t = LLVMBuildFAdd(c->b, t, cg_f32(c, node_attr_f(n, "beta", 0.5f)), "");
    return clamp_v(c, n, t, cg_f32(c, 0), cg_f32(c, 1));
}
/* x * min(max(x + 3, 0), 6) / 6: ONNX's x * HardSigmoid(x, 1/6, 1/2) in
 * the order torch's hardswish computes it, so the two round alike. */
static LLVMValueRef s_hardswish(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef r = clamp_v(c, n, LLVMBuildFAdd(c->b, x[0], cg_f32(c, 3), ""), cg_f32(c, 0), cg_f32(c, 6));
    return LLVMBuildFDiv(c->b, LLVMBuildFMul(c->b, x[0], r, ""), cg_f32(c, 6), "");
}
/* ClipGrad(dy, x, min, max): dy where min < x < max, else 0 (g_clip says
 * why the bounds themselves get 0). */
static LLVMValueRef s_clip_grad(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef lo, hi, out = LLVMConstInt(c->t_i1, 0, 0);
    clip_bounds(c, n, 2, x, &lo, &hi);
    if (lo) out = LLVMBuildOr(c->b, out, LLVMBuildFCmp(c->b, LLVMRealOLE, x[1], lo, ""), "");
    if (hi) out = LLVMBuildOr(c->b, out, LLVMBuildFCmp(c->b, LLVMRealOGE, x[1], hi, ""), "");
    return LLVMBuildSelect(c->b, out, cg_f32(c, 0), x[0], "");
}
/* HardSigmoidGrad(dy, x): dy * alpha where 0 < alpha*x + beta < 1 strictly,
 * as torch's hardsigmoid_backward (0 at x = -3 and 3 for torch's 1/6, 1/2). */
static LLVMValueRef s_hardsigmoid_grad(Cg *c, const Node *n, LLVMValueRef *x) {
    LLVMValueRef alpha = cg_f32(c, node_attr_f(n, "alpha", 0.2f));
    LLVMValueRef beta = cg_f32(c, node_attr_f(n, "beta", 0.5f));
    LLVMValueRef t = LLVMBuildFAdd(c->b, LLVMBuildFMul(c->b, x[1], alpha, ""), beta, "");
    LLVMValueRef in = LLVMBuildAnd(c->b, LLVMBuildFCmp(c->b, LLVMRealOGT, t, cg_f32(c, 0), ""),
                                   LLVMBuildFCmp(c->b, LLVMRealOLT, t, cg_f32(c, 1), ""), "");
    return LLVMBuildSelect(c->b, in, LLVMBuildFMul(c->b, x[0], alpha, ""), cg_f32(c, 0), "");
}
/* HardSwishGrad(dy, x), torch's hardswish_backward: 0 below -3,
 * dy * (x/3 + 1/2) from -3 to 3 inclusive, dy above. */
static LLVMValueRef s_hardswish_grad(Cg *c, const Node *n, LLVMValueRef *x) {
    (void)n;
    LLVMValueRef slope = LLVMBuildFAdd(c->b, LLVMBuildFDiv(c->b, x[1], cg_f32(c, 3), ""), cg_f32(c, 0.5), "");
    LLVMValueRef g = LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealOLE, x[1], cg_f32(c, 3), ""),
                                     LLVMBuildFMul(c->b, x[0], slope, ""), x[0], "");
    return LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealOLT, x[1], cg_f32(c, -3), ""), cg_f32(c, 0), g, "");
}

#define CG_EW(name, fn) \
    static bool name(Cg *c, const Node *n) { return cg_elementwise(c, n, fn); }
CG_EW(k_add, s_add)
CG_EW(k_sum, s_sum)
CG_EW(k_mean, s_mean)
CG_EW(k_sub, s_sub)
CG_EW(k_mul, s_mul)
CG_EW(k_div, s_div)
CG_EW(k_pow, s_pow)
CG_EW(k_copy, s_copy)
CG_EW(k_neg, s_neg)
CG_EW(k_abs, s_abs)
CG_EW(k_sqrt, s_sqrt)
CG_EW(k_exp, s_exp)
CG_EW(k_log, s_log)
CG_EW(k_tanh, s_tanh)
CG_EW(k_erf, s_erf)
CG_EW(k_recip, s_recip)
CG_EW(k_relu, s_relu)
CG_EW(k_leaky, s_leaky)
CG_EW(k_sigmoid, s_sigmoid)
CG_EW(k_where, s_where)
CG_EW(k_equal, s_equal)
CG_EW(k_less, s_less)
CG_EW(k_greater, s_greater)
CG_EW(k_max, s_max)
CG_EW(k_min, s_min)
CG_EW(k_clip, s_clip)
CG_EW(k_hardsigmoid, s_hardsigmoid)
CG_EW(k_hardswish, s_hardswish)
CG_EW(k_clip_grad, s_clip_grad)
CG_EW(k_hardsigmoid_grad, s_hardsigmoid_grad)
CG_EW(k_hardswish_grad, s_hardswish_grad)

/* Binary ops before opset 7 broadcast differently; codegen covers the
 * numpy form only. */
static bool cg_binary_checked(Cg *c, const Node *n, bool (*cg)(Cg *, const Node *)) {
    if (node_attr(n, "broadcast") && graph_opset(c->g, "") < 7)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): opset < 7 broadcasting is not compiled",
                          c->g->path, n->name, n->op_type);
    return cg(c, n);
}

/* Softmax and LogSoftmax: before opset 13 the input is coerced to 2-D at
 * `axis` (the softmax spans every later dim); from 13 it spans one axis. */
static int64_t softmax_axis(const Graph *g, const Node *n) {
    const Attr *a = node_attr(n, "axis");
    int64_t opset = graph_opset(g, "");
    int64_t axis = a ? a->i : (opset >= 13 ? -1 : 1);
    return axis < 0 ? axis + n->in[0]->rank : axis;
}

/* Softmax over contiguous float32 rows, a vector at a time: the maximum,
 * then e = exp(x - max) stored and summed in vector lanes, then e / sum
 * (or x - max - log(sum)).  The padding lanes of a row's last vector read
 * -inf, whose exp adds nothing. */
typedef struct SoftRow {
    const Value *x, *y;
    LLVMValueRef base, m, ls, acc; /* row offset, maximum, log-sum or sum, accumulator slot */
    int w, pass;
    bool log;
} SoftRow;

static void softmax_vec(Cg *c, void *ctx, LLVMValueRef off, int lanes) {
    SoftRow *r = ctx;
    LLVMValueRef i = cg_add(c, r->base, off), ninf = cg_vsplat(c, cg_f32(c, -INFINITY), r->w);
    LLVMTypeRef vt = cg_vtype(c, r->w);
    if (r->pass == 0) {
        LLVMValueRef v = cg_vload(c, r->x, i, r->w, lanes, ninf);
        LLVMBuildStore(c->b, cg_max(c, LLVMBuildLoad2(c->b, vt, r->acc, ""), v), r->acc);
    } else if (r->pass == 1) {
        LLVMValueRef sh = LLVMBuildFSub(c->b, cg_vload(c, r->x, i, r->w, lanes, ninf), cg_vsplat(c, r->m, r->w), "");
        LLVMValueRef e = cg_vexp(c, sh);
        if (!r->log) cg_vstore(c, r->y, i, e, lanes);
        LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, vt, r->acc, ""), e, ""), r->acc);
    } else if (r->log) {
        LLVMValueRef sh = LLVMBuildFSub(c->b, cg_vload(c, r->x, i, r->w, lanes, NULL), cg_vsplat(c, r->m, r->w), "");
        cg_vstore(c, r->y, i, LLVMBuildFSub(c->b, sh, cg_vsplat(c, r->ls, r->w), ""), lanes);
    } else {
        LLVMValueRef e = cg_vload(c, r->y, i, r->w, lanes, NULL);
        cg_vstore(c, r->y, i, LLVMBuildFDiv(c->b, e, cg_vsplat(c, r->ls, r->w), ""), lanes);
    }
}

static void softmax_rows(Cg *c, const Value *x, const Value *y, int64_t rows, int64_t len, bool log) {
    int w = cg_vector_floats();
    SoftRow r = {.x = x, .y = y, .w = w, .log = log};
    LLVMTypeRef vt = cg_vtype(c, w);
    r.acc = cg_alloca(c, vt);
    CgLoop lr;
    r.base = cg_mul(c, cg_for(c, &lr, cg_i64(c, rows)), len);
    LLVMBuildStore(c->b, cg_vsplat(c, cg_f32(c, -INFINITY), w), r.acc);
    r.pass = 0;
    cg_vrow(c, len, w, softmax_vec, &r);
    r.m = cg_vmax(c, LLVMBuildLoad2(c->b, vt, r.acc, ""));
    LLVMBuildStore(c->b, LLVMConstNull(vt), r.acc);
    r.pass = 1;
    cg_vrow(c, len, w, softmax_vec, &r);
    r.ls = cg_vsum(c, LLVMBuildLoad2(c->b, vt, r.acc, ""));
    if (log) r.ls = cg_math(c, "log", r.ls, NULL);
    r.pass = 2;
    cg_vrow(c, len, w, softmax_vec, &r);
    cg_for_end(c, &lr);
}

static bool cg_softmax_common(Cg *c, const Node *n, bool log) {
    const Value *x = n->in[0], *y = n->out[0];
    int64_t axis = softmax_axis(c->g, n), outer, len, inner;
    cg_axis_split(x, (int)axis, &outer, &len, &inner);
    if (graph_opset(c->g, "") < 13) {
        len *= inner;
        inner = 1;
    }
    if (!cg_kernel_begin_io(c, n)) return false;
    if (inner == 1 && x->dtype == DT_FLOAT && y->dtype == DT_FLOAT && len > 0) {
        softmax_rows(c, x, y, outer, len, log);
        cg_kernel_end(c);
        return true;
    }
    LLVMValueRef mx = cg_alloca(c, c->t_f32), se = cg_alloca(c, c->t_f32);
    CgLoop lo, li, l1, l2, l3;
    LLVMValueRef o = cg_for(c, &lo, cg_i64(c, outer));
    LLVMValueRef in = cg_for(c, &li, cg_i64(c, inner));
    LLVMValueRef base = cg_add(c, cg_mul(c, o, len * inner), in);
    LLVMBuildStore(c->b, cg_f32(c, -INFINITY), mx);
    LLVMBuildStore(c->b, cg_f32(c, 0), se);
    LLVMValueRef k = cg_for(c, &l1, cg_i64(c, len));
    LLVMValueRef idx = cg_add(c, base, cg_mul(c, k, inner));
    LLVMBuildStore(c->b, cg_max(c, LLVMBuildLoad2(c->b, c->t_f32, mx, ""), cg_load(c, x, idx)), mx);
    cg_for_end(c, &l1);
    LLVMValueRef m = LLVMBuildLoad2(c->b, c->t_f32, mx, "");
    k = cg_for(c, &l2, cg_i64(c, len));
    idx = cg_add(c, base, cg_mul(c, k, inner));
    LLVMValueRef sh = LLVMBuildFSub(c->b, cg_load(c, x, idx), m, "");
    LLVMValueRef e = cg_math(c, "exp", sh, NULL);
    if (!log) cg_store(c, y, idx, e);
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, se, ""), e, ""), se);
    cg_for_end(c, &l2);
    LLVMValueRef s = LLVMBuildLoad2(c->b, c->t_f32, se, "");
    LLVMValueRef ls = log ? cg_math(c, "log", s, NULL) : NULL;
    k = cg_for(c, &l3, cg_i64(c, len));
    idx = cg_add(c, base, cg_mul(c, k, inner));
    if (log) cg_store(c, y, idx, LLVMBuildFSub(c->b, LLVMBuildFSub(c->b, cg_load(c, x, idx), m, ""), ls, ""));
    else cg_store(c, y, idx, LLVMBuildFDiv(c->b, cg_load(c, y, idx), s, ""));
    cg_for_end(c, &l3);
    cg_for_end(c, &li);
    cg_for_end(c, &lo);
    cg_kernel_end(c);
    return true;
}
static bool cg_softmax(Cg *c, const Node *n) { return cg_softmax_common(c, n, false); }
static bool cg_logsoftmax(Cg *c, const Node *n) { return cg_softmax_common(c, n, true); }

/* ---- gradient rules ---- */

/* Sum and Mean: every input gets dY (over n for Mean), summed over the
 * dimensions it was broadcast along. */
static bool g_sum(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *d = strcmp(n->op_type, "Mean") == 0 ? gb_scale(c, dy[0], 1.0f / (float)n->n_in) : dy[0];
    for (int i = 0; i < n->n_in; i++)
        if (need[i]) dx[i] = gb_sum_to(c, d, n->in[i]);
    return true;
}
static bool g_add(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_sum_to(c, dy[0], n->in[0]);
    if (need[1]) dx[1] = gb_sum_to(c, dy[0], n->in[1]);
    return true;
}
static bool g_sub(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_sum_to(c, dy[0], n->in[0]);
    if (need[1]) dx[1] = gb_sum_to(c, gb_op1(c, "Neg", dy[0]), n->in[1]);
    return true;
}
static bool g_mul(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_sum_to(c, gb_op2(c, "Mul", dy[0], n->in[1]), n->in[0]);
    if (need[1]) dx[1] = gb_sum_to(c, gb_op2(c, "Mul", dy[0], n->in[0]), n->in[1]);
    return true;
}
/* y = a/b: da = dy/b, db = -(dy/b)*y */
static bool g_div(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *t = gb_op2(c, "Div", dy[0], n->in[1]);
    if (need[0]) dx[0] = gb_sum_to(c, t, n->in[0]);
    if (need[1]) dx[1] = gb_sum_to(c, gb_op1(c, "Neg", gb_op2(c, "Mul", t, n->out[0])), n->in[1]);
    return true;
}
/* y = x^e: dx = dy*e*x^(e-1), de = dy*y*log(x) */
static bool g_pow(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *x = n->in[0], *e = n->in[1];
    if (need[0]) {
        Value *em1 = gb_op2(c, "Sub", e, gb_const_f(c, 1));
        dx[0] = gb_sum_to(c, gb_op2(c, "Mul", dy[0], gb_op2(c, "Mul", e, gb_op2(c, "Pow", x, em1))), x);
    }
    if (need[1]) dx[1] = gb_sum_to(c, gb_op2(c, "Mul", dy[0], gb_op2(c, "Mul", n->out[0], gb_op1(c, "Log", x))), e);
    return true;
}
static bool g_identity(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    (void)c;
    (void)n;
    if (need[0]) dx[0] = dy[0];
    return true;
}
static bool g_neg(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    (void)n;
    if (need[0]) dx[0] = gb_op1(c, "Neg", dy[0]);
    return true;
}
static bool g_exp(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_op2(c, "Mul", dy[0], n->out[0]);
    return true;
}
static bool g_log(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_op2(c, "Div", dy[0], n->in[0]);
    return true;
}
static bool g_sqrt(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_op2(c, "Div", gb_scale(c, dy[0], 0.5f), n->out[0]);
    return true;
}
static bool g_recip(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_op1(c, "Neg", gb_op2(c, "Mul", dy[0], gb_op2(c, "Mul", n->out[0], n->out[0])));
    return true;
}
/* d erf(x) = 2/sqrt(pi) * exp(-x^2) */
static bool g_erf(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    Value *x = n->in[0];
    Value *e = gb_op1(c, "Exp", gb_op1(c, "Neg", gb_op2(c, "Mul", x, x)));
    dx[0] = gb_op2(c, "Mul", dy[0], gb_scale(c, e, (float)(2.0 / sqrt(M_PI))));
    return true;
}
static bool g_via_output(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need, const char *op) {
    if (need[0]) dx[0] = gb_internal2(c, op, dy[0], n->out[0]);
    return true;
}
static bool g_relu(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    return g_via_output(c, n, dy, dx, need, "ReluGrad");
}
static bool g_sigmoid(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    return g_via_output(c, n, dy, dx, need, "SigmoidGrad");
}
static bool g_tanh(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    return g_via_output(c, n, dy, dx, need, "TanhGrad");
}
static bool g_leaky(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    Value *in[2] = {dy[0], n->in[0]};
    Node *g = gb_start(c, "cleave", "LeakyReluGrad", 2, in, 1);
    gb_attr_f(c, g, "alpha", node_attr_f(n, "alpha", 0.01f));
    dx[0] = gb_finish(c, g);
    return true;
}
static bool g_softmax_common(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need, const char *op) {
    if (!need[0]) return true;
    int64_t axis = softmax_axis(c->g, n);
    if (graph_opset(c->g, "") < 13 && axis != n->in[0]->rank - 1)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): gradient of opset < 13 %s over several axes",
                          c->g->path, n->name, n->op_type, n->op_type);
    Value *in[2] = {dy[0], n->out[0]};
    Node *g = gb_start(c, "cleave", op, 2, in, 1);
    gb_attr_i(c, g, "axis", axis);
    dx[0] = gb_finish(c, g);
    return true;
}
static bool g_softmax(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    return g_softmax_common(c, n, dy, dx, need, "SoftmaxGrad");
}
static bool g_logsoftmax(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    return g_softmax_common(c, n, dy, dx, need, "LogSoftmaxGrad");
}
static bool g_where(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *zero = gb_const_f(c, 0);
    for (int k = 1; k <= 2; k++) {
        if (!need[k]) continue;
        Value *in[3] = {n->in[0], k == 1 ? dy[0] : zero, k == 1 ? zero : dy[0]};
        dx[k] = gb_sum_to(c, gb_finish(c, gb_start(c, "", "Where", 3, in, 1)), n->in[k]);
    }
    return true;
}
/* Clip's bound `slot` (1: min, 2: max) as ClipGrad's input: Clip's own
 * input from opset 11 (NULL when omitted), its attribute before. */
static Value *clip_bound(GradCtx *c, const Node *n, int slot) {
    if (!clip_attr_form(c->g, n)) return slot < n->n_in ? n->in[slot] : NULL;
    return gb_const_f(c, slot == 1 ? node_attr_f(n, "min", -FLT_MAX) : node_attr_f(n, "max", FLT_MAX));
}
/* PyTorch exports nn.ReLU6 and F.hardtanh as Clip, and torch.clamp too;
 * hardtanh's backward passes dy only strictly inside (min, max), clamp's
 * at the bounds as well.  The node cannot tell which it came from, and the
 * two differ only where x equals a bound exactly; cleave follows hardtanh,
 * since the Clip torchvision's models export is ReLU6 (mobilenet_v2). */
static bool g_clip(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    for (int i = 1; i < n->n_in; i++)
        if (need[i])
            return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Clip): no gradient for the bound '%s'",
                              c->g->path, n->name, n->in[i]->name);
    if (!need[0]) return true;
    Value *in[4] = {dy[0], n->in[0], clip_bound(c, n, 1), clip_bound(c, n, 2)};
    dx[0] = gb_finish(c, gb_start(c, "cleave", "ClipGrad", 4, in, 1));
    return true;
}
static bool g_hardsigmoid(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    Value *in[2] = {dy[0], n->in[0]};
    Node *g = gb_start(c, "cleave", "HardSigmoidGrad", 2, in, 1);
    gb_attr_f(c, g, "alpha", node_attr_f(n, "alpha", 0.2f));
    gb_attr_f(c, g, "beta", node_attr_f(n, "beta", 0.5f));
    dx[0] = gb_finish(c, g);
    return true;
}
static bool g_hardswish(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_internal2(c, "HardSwishGrad", dy[0], n->in[0]);
    return true;
}
static bool g_cast(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    if (!dtype_is_float(n->in[0]->dtype) || !dtype_is_float(n->out[0]->dtype))
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Cast): no gradient through integer casts",
                          c->g->path, n->name);
    dx[0] = dy[0];
    return true;
}

static bool cg_add_checked(Cg *c, const Node *n) { return cg_binary_checked(c, n, k_add); }
static bool cg_sub_checked(Cg *c, const Node *n) { return cg_binary_checked(c, n, k_sub); }
static bool cg_mul_checked(Cg *c, const Node *n) { return cg_binary_checked(c, n, k_mul); }
static bool cg_div_checked(Cg *c, const Node *n) { return cg_binary_checked(c, n, k_div); }
static bool cg_pow_checked(Cg *c, const Node *n) { return cg_binary_checked(c, n, k_pow); }

/* ---- entries ---- */

static const AttrSpec attrs_none[] = {{0}};
static const AttrSpec attrs_leaky[] = {{"alpha", ATTR_FLOAT, .f = 0.01f}, {0}};
static const AttrSpec attrs_softmax[] = {{"axis", ATTR_INT, .i = -1}, {0}};
static const AttrSpec attrs_cast[] = {{"to", ATTR_INT, .required = true}, {"saturate", ATTR_INT, .i = 1}, {0}};
static const AttrSpec attrs_mod[] = {{"fmod", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_castlike[] = {{"saturate", ATTR_INT, .i = 1}, {0}};
static const AttrSpec attrs_clip[] = {{"min", ATTR_FLOAT, .f = -FLT_MAX}, {"max", ATTR_FLOAT, .f = FLT_MAX}, {0}};
static const AttrSpec attrs_hardsigmoid[] = {{"alpha", ATTR_FLOAT, .f = 0.2f}, {"beta", ATTR_FLOAT, .f = 0.5f}, {0}};

#define BINARY(NAME, fold, since, G, K, S) \
    {NAME, "", since, 0, 2, 2, 1, 1, attrs_none, 0, infer_broadcast, fold, flops_1, .grad = G, .cg = K, \
     .inplace = true, .scalar = S}
#define UNARY(NAME, infer, fold, flops, G, K, S) \
    {NAME, "", 1, 0, 1, 1, 1, 1, attrs_none, 0, infer, fold, flops, .grad = G, .cg = K, .inplace = true, .scalar = S}

const OpDef op_Add = BINARY("Add", fold_add, 1, g_add, cg_add_checked, s_add);
const OpDef op_Sub = BINARY("Sub", fold_sub, 1, g_sub, cg_sub_checked, s_sub);
const OpDef op_Mul = BINARY("Mul", fold_mul, 1, g_mul, cg_mul_checked, s_mul);
const OpDef op_Div = BINARY("Div", fold_div, 1, g_div, cg_div_checked, s_div);
const OpDef op_Pow = {"Pow", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_pow, fold_pow, flops_transcend, .grad = g_pow, .cg = cg_pow_checked, .scalar = s_pow};
const OpDef op_Equal = {"Equal", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_equal, flops_1, .cg = k_equal};
const OpDef op_Less = {"Less", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_less, flops_1, .cg = k_less};
const OpDef op_Greater = {"Greater", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_greater, flops_1, .cg = k_greater};
const OpDef op_GreaterOrEqual = {"GreaterOrEqual", "", 12, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_ge, flops_1};
const OpDef op_LessOrEqual = {"LessOrEqual", "", 12, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_le, flops_1};
const OpDef op_Not = UNARY("Not", infer_unary, fold_not, flops_1, NULL, NULL, NULL);
const OpDef op_And = {"And", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_and, flops_1};
const OpDef op_Or = {"Or", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_or, flops_1};
const OpDef op_Xor = {"Xor", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_xor, flops_1};
const OpDef op_Max = {"Max", "", 1, 0, 1, 1 << 16, 1, 1, attrs_none, 0, infer_variadic, fold_max, flops_1, .cg = k_max, .scalar = s_max};
/* Variadic float sums with broadcasting; inputs may be absent in no form. */
const OpDef op_Sum = {"Sum", "", 1, 0, 1, 1 << 16, 1, 1, attrs_none, 0, infer_float_variadic, fold_sum, flops_1, .grad = g_sum, .cg = k_sum, .scalar = s_sum};
const OpDef op_Mean = {"Mean", "", 1, 0, 1, 1 << 16, 1, 1, attrs_none, 0, infer_float_variadic, fold_mean, flops_1, .grad = g_sum, .cg = k_mean, .scalar = s_mean};
const OpDef op_Min = {"Min", "", 1, 0, 1, 1 << 16, 1, 1, attrs_none, 0, infer_variadic, fold_min, flops_1, .cg = k_min, .scalar = s_min};
const OpDef op_Mod = {"Mod", "", 10, 0, 2, 2, 1, 1, attrs_mod, 0, infer_broadcast, fold_mod, flops_1};
const OpDef op_Where = {"Where", "", 9, 0, 3, 3, 1, 1, attrs_none, 0, infer_where, fold_where, flops_1, .grad = g_where, .cg = k_where};
const OpDef op_Relu = UNARY("Relu", infer_unary, fold_relu, flops_1, g_relu, k_relu, s_relu);
const OpDef op_LeakyRelu = {"LeakyRelu", "", 1, 0, 1, 1, 1, 1, attrs_leaky, 0, infer_float_unary, fold_leaky, flops_1, .grad = g_leaky, .cg = k_leaky, .inplace = true, .scalar = s_leaky};
const OpDef op_Clip = {"Clip", "", 1, 0, 1, 3, 1, 1, attrs_clip, 0, infer_clip, fold_clip, flops_1, .grad = g_clip, .cg = k_clip, .inplace = true, .scalar = s_clip};
const OpDef op_HardSigmoid = {"HardSigmoid", "", 1, 0, 1, 1, 1, 1, attrs_hardsigmoid, 0, infer_float_unary, fold_hardsigmoid, flops_1, .grad = g_hardsigmoid, .cg = k_hardsigmoid, .inplace = true, .scalar = s_hardsigmoid};
const OpDef op_HardSwish = {"HardSwish", "", 14, 0, 1, 1, 1, 1, attrs_none, 0, infer_float_unary, fold_hardswish, flops_1, .grad = g_hardswish, .cg = k_hardswish, .inplace = true, .scalar = s_hardswish};
const OpDef op_Sigmoid = UNARY("Sigmoid", infer_float_unary, fold_sigmoid, flops_transcend, g_sigmoid, k_sigmoid, s_sigmoid);
const OpDef op_Tanh = UNARY("Tanh", infer_float_unary, fold_tanh, flops_transcend, g_tanh, k_tanh, s_tanh);
const OpDef op_Erf = UNARY("Erf", infer_unary, fold_erf, flops_transcend, g_erf, k_erf, s_erf);
const OpDef op_Sqrt = UNARY("Sqrt", infer_float_unary, fold_sqrt, flops_transcend, g_sqrt, k_sqrt, s_sqrt);
const OpDef op_Exp = UNARY("Exp", infer_float_unary, fold_exp, flops_transcend, g_exp, k_exp, s_exp);
const OpDef op_Log = UNARY("Log", infer_float_unary, fold_log, flops_transcend, g_log, k_log, s_log);
const OpDef op_Neg = UNARY("Neg", infer_unary, fold_neg, flops_1, g_neg, k_neg, s_neg);
const OpDef op_Abs = UNARY("Abs", infer_unary, fold_abs, flops_1, NULL, k_abs, s_abs);
const OpDef op_Reciprocal = UNARY("Reciprocal", infer_float_unary, fold_recip, flops_1, g_recip, k_recip, s_recip);
const OpDef op_Identity = UNARY("Identity", infer_unary, fold_copy, flops_zero, g_identity, k_copy, s_copy);
const OpDef op_Cast = {"Cast", "", 1, 0, 1, 1, 1, 1, attrs_cast, 0, infer_cast, fold_cast, flops_zero, .grad = g_cast, .cg = k_copy};
const OpDef op_CastLike = {"CastLike", "", 15, 0, 2, 2, 1, 1, attrs_castlike, 0, infer_castlike, fold_castlike, flops_zero};
const OpDef op_Softmax = {"Softmax", "", 1, 0, 1, 1, 1, 1, attrs_softmax, 0, infer_softmax, NULL, flops_softmax, .grad = g_softmax, .cg = cg_softmax};
const OpDef op_LogSoftmax = {"LogSoftmax", "", 1, 0, 1, 1, 1, 1, attrs_softmax, 0, infer_softmax, NULL, flops_softmax, .grad = g_logsoftmax, .cg = cg_logsoftmax};

/* Gradient ops (domain "cleave"): f(dy, x, ...) element-wise. */
const OpDef op_ClipGrad = {"ClipGrad", "cleave", 1, 0, 2, 4, 1, 1, attrs_none, 0, infer_unary, NULL, flops_1, .cg = k_clip_grad, .inplace = true, .scalar = s_clip_grad};
const OpDef op_HardSigmoidGrad = {"HardSigmoidGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_hardsigmoid, 0, infer_unary, NULL, flops_1, .cg = k_hardsigmoid_grad, .inplace = true, .scalar = s_hardsigmoid_grad};
const OpDef op_HardSwishGrad = {"HardSwishGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_unary, NULL, flops_1, .cg = k_hardswish_grad, .inplace = true, .scalar = s_hardswish_grad};
