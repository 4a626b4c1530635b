/* cg_math.c - exp, erf and tanh of float32 as inline code.
 *
 * libm's expf, erff and tanhf are calls, which keep every loop around
 * them scalar: a transformer's GELU (erf, or tanh), softmax and their
 * gradients spent a fifth to a third of a training step in them.  These
 * builders emit the functions as straight-line code (polynomials,
 * selects and bit operations, no branches), on a float32 scalar or on a
 * vector of them alike, so that LLVM's loop vectorizer widens the loops
 * that call them and kernels written with vectors call them directly.
 * Each lane gets exactly the operations a scalar gets, so a result does
 * not depend on whether its loop was vectorised, nor on the vector width:
 * fused and separate element-wise kernels keep giving the same bits.
 *
 * Multiply-adds are llvm.fmuladd, one FMA instruction on targets that
 * have one (as the packed products' are) and a multiply and an add
 * elsewhere; a given target makes the same choice for scalars and
 * vectors.  The coefficients are minimax polynomials fitted by a Remez
 * exchange in double precision and rounded to float32
 * (scripts/fit_vector_math.py fits them again and measures the float32
 * functions): against double-precision references over dense grids and
 * random points of their ranges (with FMA), exp was within 0.88 ulp of
 * the correctly rounded result, erf within 1.12 ulp, tanh within 1.02
 * ulp.  glibc's functions, which the scalar code called before, are
 * within about 1 ulp too; results can differ from theirs in the last
 * bit. */
#include <math.h>

#include "cg.h"
#include "cg_gemm.h"

/* x's type with i32 elements: i32 or a vector of them. */
static LLVMTypeRef int_like(Cg *c, LLVMTypeRef t) {
    if (LLVMGetTypeKind(t) == LLVMVectorTypeKind) return LLVMVectorType(c->t_i32, LLVMGetVectorSize(t));
    return c->t_i32;
}

/* A constant of type t (float32 or a vector of them: splatted). */
static LLVMValueRef kf(Cg *c, LLVMTypeRef t, double v) {
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind) return cg_f32(c, v);
    LLVMValueRef lanes[64];
    unsigned n = LLVMGetVectorSize(t);
    for (unsigned i = 0; i < n; i++) lanes[i] = cg_f32(c, v);
    return LLVMConstVector(lanes, n);
}

static LLVMValueRef ki(Cg *c, LLVMTypeRef t, int v) {
    LLVMTypeRef it = int_like(c, t);
    if (it == c->t_i32) return LLVMConstInt(c->t_i32, (unsigned long long)(int64_t)v, 1);
    LLVMValueRef lanes[64];
    unsigned n = LLVMGetVectorSize(t);
    for (unsigned i = 0; i < n; i++) lanes[i] = LLVMConstInt(c->t_i32, (unsigned long long)(int64_t)v, 1);
    return LLVMConstVector(lanes, n);
}

static LLVMValueRef call1(Cg *c, const char *name, LLVMValueRef x) {
    LLVMTypeRef t = LLVMTypeOf(x);
    return cg_intrinsic(c, name, &t, 1, &x, 1);
}

static LLVMValueRef fmuladd(Cg *c, LLVMValueRef a, LLVMValueRef b, LLVMValueRef d) {
    LLVMTypeRef t = LLVMTypeOf(a);
    LLVMValueRef args[3] = {a, b, d};
    return cg_intrinsic(c, "llvm.fmuladd", &t, 1, args, 3);
}

/* p(x) = k[n-1] x^(n-1) + ... + k[0] by Horner's rule. */
static LLVMValueRef horner(Cg *c, LLVMValueRef x, const float *k, int n) {
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef p = kf(c, t, k[n - 1]);
    for (int j = n - 2; j >= 0; j--) p = fmuladd(c, p, x, kf(c, t, k[j]));
    return p;
}

static LLVMValueRef lt(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFCmp(c->b, LLVMRealOLT, a, b, ""); }

/* x itself where x is NaN, else r: the polynomials' selects would turn a
 * NaN into a number. */
static LLVMValueRef keep_nan(Cg *c, LLVMValueRef x, LLVMValueRef r) {
    return LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealUNO, x, x, ""), x, r, "");
}

/* e^x = 2^k e^r with k = round(x / ln 2) and |r| <= ln2 / 2, r computed
 * as x - k ln2_hi - k ln2_lo (ln2_hi has 9 significant bits, so k ln2_hi
 * is exact for every k that occurs, with or without FMA); e^r = 1 + r +
 * r^2 P(r), P of degree 4.  2^k is applied as two factors 2^(k/2) and
 * 2^(k - k/2), each a normal float built from its bits, so that results
 * near the overflow threshold (k = 128) and subnormal results (k down to
 * -150) are rounded once, as the exact value would be.  x is first
 * clamped to [-104, 89], beyond which e^x rounds to 0 or overflows to
 * infinity anyway; NaN stays NaN. */
LLVMValueRef cg_vexp(Cg *c, LLVMValueRef x) {
    static const float P[] = {1.0f, 1.0f, 0.4999999403953552f, 0.1666652113199234f, 0.04166838899254799f,
                              0.008368730545043945f, 0.0013814570847898722f};
    LLVMTypeRef t = LLVMTypeOf(x), it = int_like(c, t);
    LLVMValueRef lo = kf(c, t, -104.0), hi = kf(c, t, 89.0);
    LLVMValueRef xc = LLVMBuildSelect(c->b, lt(c, x, lo), lo, x, "");
    xc = LLVMBuildSelect(c->b, lt(c, hi, xc), hi, xc, "");
    LLVMValueRef k = call1(c, "llvm.rint", LLVMBuildFMul(c->b, xc, kf(c, t, 1.4426950408889634), ""));
    LLVMValueRef r = fmuladd(c, k, kf(c, t, -0.693359375), xc);
    r = fmuladd(c, k, kf(c, t, 0.00021219444170128554), r);
    LLVMValueRef p = horner(c, r, P, 7);
    LLVMValueRef kn = LLVMBuildFPToSI(c->b, k, it, "");
    LLVMValueRef k1 = LLVMBuildAShr(c->b, kn, ki(c, t, 1), ""), k2 = LLVMBuildSub(c->b, kn, k1, "");
    LLVMValueRef s1 = LLVMBuildShl(c->b, LLVMBuildAdd(c->b, k1, ki(c, t, 127), ""), ki(c, t, 23), "");
    LLVMValueRef s2 = LLVMBuildShl(c->b, LLVMBuildAdd(c->b, k2, ki(c, t, 127), ""), ki(c, t, 23), "");
    p = LLVMBuildFMul(c->b, p, LLVMBuildBitCast(c->b, s1, t, ""), "");
    p = LLVMBuildFMul(c->b, p, LLVMBuildBitCast(c->b, s2, t, ""), "");
    return keep_nan(c, x, p);
}

/* erf(x) = sign(x) erf(a), a = |x|:
 *   a < 0.9:      a + a Q(a^2), Q of degree 5 (the leading term a kept
 *                 exact, which the float32 rounding of 2/sqrt(pi) would
 *                 not be)
 *   0.9 <= a < 4: 1 - e^R(a), R of degree 8 approximating log erfc(a),
 *                 fitted for the error it makes in erf
 *   a >= 4:       1 (erf(4) rounds to 1 in float32).
 * Both polynomials are computed for every lane and one is selected. */
LLVMValueRef cg_verf(Cg *c, LLVMValueRef x) {
    static const float Q[] = {0.12837915122509003f,  -0.3761252462863922f,  0.11282140761613846f,
                              -0.02677890844643116f, 0.005011962726712227f, -0.0006090360111556947f};
    static const float R[] = {0.00015061217709444463f, -1.129381775856018f,     -0.6336633563041687f,
                              -0.10785818845033646f,   0.024774489924311638f,   -0.003994089085608721f,
                              0.000378845987142995f,   -1.1310702575428877e-05f, -7.375047061941586e-07f};
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef a = call1(c, "llvm.fabs", x), four = kf(c, t, 4.0);
    LLVMValueRef small = fmuladd(c, horner(c, LLVMBuildFMul(c->b, a, a, ""), Q, 6), a, a);
    LLVMValueRef in = lt(c, a, four), ac = LLVMBuildSelect(c->b, in, a, four, "");
    LLVMValueRef big = LLVMBuildFSub(c->b, kf(c, t, 1.0), cg_vexp(c, horner(c, ac, R, 9)), "");
    LLVMValueRef r = LLVMBuildSelect(c->b, lt(c, a, kf(c, t, 0.9)), small, big, "");
    r = LLVMBuildSelect(c->b, in, r, kf(c, t, 1.0), "");
    LLVMValueRef args[2] = {r, x};
    return keep_nan(c, x, cg_intrinsic(c, "llvm.copysign", &t, 1, args, 2));
}

/* tanh(x) = sign(x) tanh(a), a = |x|:
 *   a < 0.9:  a + a s P(s), s = a^2, P of degree 6
 *   a >= 0.9: 1 - 2 / (e^(2a) + 1), which is 1 once e^(2a) is large or
 *             infinite. */
LLVMValueRef cg_vtanh(Cg *c, LLVMValueRef x) {
    static const float P[] = {-0.33333322405815125f, 0.13332977890968323f,  -0.05392930284142494f,
                              0.021663542836904526f, -0.008264545351266861f, 0.0025826687924563885f,
                              -0.0004554603074211627f};
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef a = call1(c, "llvm.fabs", x), s = LLVMBuildFMul(c->b, a, a, "");
    LLVMValueRef small = fmuladd(c, LLVMBuildFMul(c->b, horner(c, s, P, 7), s, ""), a, a);
    LLVMValueRef e = cg_vexp(c, LLVMBuildFAdd(c->b, a, a, ""));
    LLVMValueRef big = LLVMBuildFSub(c->b, kf(c, t, 1.0),
                                     LLVMBuildFDiv(c->b, kf(c, t, 2.0), LLVMBuildFAdd(c->b, e, kf(c, t, 1.0), ""), ""),
                                     "");
    LLVMValueRef r = LLVMBuildSelect(c->b, lt(c, a, kf(c, t, 0.9)), small, big, "");
    LLVMValueRef args[2] = {r, x};
    return keep_nan(c, x, cg_intrinsic(c, "llvm.copysign", &t, 1, args, 2));
}
