/* ops_elementwise.c - element-wise operators: arithmetic with numpy
 * broadcasting, activations, comparisons, Where, Cast, Identity, Dropout,
 * and the shape-preserving Softmax family. */
#include <math.h>

#include "op_util.h"
#include "ops_families.h"

/* ---- shape rules ---- */

/* Inputs of one dtype broadcast together; output of that dtype (or bool). */
static bool infer_broadcast_as(OpCtx *c, Node *n, bool to_bool) {
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    Dim dims[MAX_RANK];
    int rank;
    if (!broadcast_inputs(c, n, 0, n->n_in, dims, &rank)) return false;
    set_out(n, 0, to_bool ? DT_BOOL : t, rank, dims);
    return true;
}

static bool infer_broadcast(OpCtx *c, Node *n) { return infer_broadcast_as(c, n, false); }
static bool infer_compare(OpCtx *c, Node *n) { return infer_broadcast_as(c, n, true); }

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

/* Pow: base and exponent may differ in type; the result has the base's. */
static bool infer_pow(OpCtx *c, Node *n) {
    Dim dims[MAX_RANK];
    int rank;
    if (!broadcast_inputs(c, n, 0, 2, dims, &rank)) return false;
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

static bool infer_cast(OpCtx *c, Node *n) {
    DType to = (DType)node_attr_i(n, "to", 0);
    if (!dtype_size(to) && to != DT_STRING)
        return op_error(c, n, "attribute 'to' = %d is not a known type", (int)to);
    set_out(n, 0, to, n->in[0]->rank, n->in[0]->dims);
    return true;
}

static bool infer_dropout(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 0);
    set_out(n, 1, DT_BOOL, n->in[0]->rank, n->in[0]->dims);
    return true;
}

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
static double f_leaky(const double *x, const Node *n) {
    return x[0] >= 0 ? x[0] : x[0] * node_attr_f(n, "alpha", 0.01f);
}

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
static int64_t i_not(const int64_t *x, const Node *n, bool *ok) { (void)n; (void)ok; return x[0] == 0; }

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
FOLDER(fold_not, f_not, i_not)
FOLDER(fold_copy, f_copy, i_copy)

/* Cast to an integer type from floats truncates toward zero, as ONNX does;
 * symbolic integers pass through casts between integer types. */
static FoldResult fold_cast(OpCtx *c, Node *n) {
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

/* ---- FLOP counts: per output element ---- */

static double flops_1(const Node *n) { return flops_per_out_elem(n, 1); }
static double flops_transcend(const Node *n) { return flops_per_out_elem(n, 4); }
static double flops_zero(const Node *n) { (void)n; return 0; }
/* max, subtract, exp, sum, divide */
static double flops_softmax(const Node *n) { return flops_per_out_elem(n, 5); }

/* ---- entries ---- */

static const AttrSpec attrs_none[] = {{0}};
static const AttrSpec attrs_leaky[] = {{"alpha", ATTR_FLOAT, .f = 0.01f}, {0}};
static const AttrSpec attrs_softmax[] = {{"axis", ATTR_INT, .i = -1}, {0}};
static const AttrSpec attrs_cast[] = {{"to", ATTR_INT, .required = true}, {"saturate", ATTR_INT, .i = 1}, {0}};
static const AttrSpec attrs_dropout[] = {{"ratio", ATTR_FLOAT, .f = 0.5f}, {"seed", ATTR_INT}, {0}};

#define BINARY(NAME, fold, since) \
    {NAME, "", since, 0, 2, 2, 1, 1, attrs_none, 0, infer_broadcast, fold, flops_1}
#define UNARY(NAME, infer, fold, flops) {NAME, "", 1, 0, 1, 1, 1, 1, attrs_none, 0, infer, fold, flops}

const OpDef op_Add = BINARY("Add", fold_add, 1);
const OpDef op_Sub = BINARY("Sub", fold_sub, 1);
const OpDef op_Mul = BINARY("Mul", fold_mul, 1);
const OpDef op_Div = BINARY("Div", fold_div, 1);
const OpDef op_Pow = {"Pow", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_pow, fold_pow, flops_transcend};
const OpDef op_Equal = {"Equal", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_equal, flops_1};
const OpDef op_Less = {"Less", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_less, flops_1};
const OpDef op_Greater = {"Greater", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_compare, fold_greater, flops_1};
const OpDef op_Not = UNARY("Not", infer_unary, fold_not, flops_1);
const OpDef op_Where = {"Where", "", 9, 0, 3, 3, 1, 1, attrs_none, 0, infer_where, fold_where, flops_1};
const OpDef op_Relu = UNARY("Relu", infer_unary, fold_relu, flops_1);
const OpDef op_LeakyRelu = {"LeakyRelu", "", 1, 0, 1, 1, 1, 1, attrs_leaky, 0, infer_float_unary, fold_leaky, flops_1};
const OpDef op_Sigmoid = UNARY("Sigmoid", infer_float_unary, fold_sigmoid, flops_transcend);
const OpDef op_Tanh = UNARY("Tanh", infer_float_unary, fold_tanh, flops_transcend);
const OpDef op_Erf = UNARY("Erf", infer_unary, fold_erf, flops_transcend);
const OpDef op_Sqrt = UNARY("Sqrt", infer_float_unary, fold_sqrt, flops_transcend);
const OpDef op_Exp = UNARY("Exp", infer_float_unary, fold_exp, flops_transcend);
const OpDef op_Log = UNARY("Log", infer_float_unary, fold_log, flops_transcend);
const OpDef op_Neg = UNARY("Neg", infer_unary, fold_neg, flops_1);
const OpDef op_Abs = UNARY("Abs", infer_unary, fold_abs, flops_1);
const OpDef op_Reciprocal = UNARY("Reciprocal", infer_float_unary, fold_recip, flops_1);
const OpDef op_Identity = UNARY("Identity", infer_unary, fold_copy, flops_zero);
const OpDef op_Cast = {"Cast", "", 1, 0, 1, 1, 1, 1, attrs_cast, 0, infer_cast, fold_cast, flops_zero};
/* Dropout is the identity at inference and in cleave's deterministic
 * training (ratio applies only with training_mode, which is refused later). */
const OpDef op_Dropout = {"Dropout", "", 1, 0, 1, 3, 1, 2, attrs_dropout, 0, infer_dropout, NULL, flops_zero};
const OpDef op_Softmax = {"Softmax", "", 1, 0, 1, 1, 1, 1, attrs_softmax, 0, infer_softmax, NULL, flops_softmax};
const OpDef op_LogSoftmax = {"LogSoftmax", "", 1, 0, 1, 1, 1, 1, attrs_softmax, 0, infer_softmax, NULL, flops_softmax};
