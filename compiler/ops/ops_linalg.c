/* ops_linalg.c - Gemm, MatMul, and MatMulT (cleave's MatMul with either
 * operand's last two dims swapped, which MatMul's gradient uses so that no
 * transposed copy is made: the packed GEMM folds the swap into its
 * packing). */
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"
#include "../codegen/cg_gemm.h"

/* Y[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, C broadcast to [M,N]. */
static bool infer_gemm(OpCtx *c, Node *n) {
    const Value *a = n->in[0], *b = n->in[1];
    if (a->rank != 2 || b->rank != 2)
        return op_error(c, n, "A and B must be 2-D, got rank %d and %d", a->rank, b->rank);
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    bool ta = node_attr_i(n, "transA", 0) != 0, tb = node_attr_i(n, "transB", 0) != 0;
    Dim m = a->dims[ta ? 1 : 0], ka = a->dims[ta ? 0 : 1];
    Dim kb = b->dims[tb ? 1 : 0], nn = b->dims[tb ? 0 : 1];
    if (dim_is_const(ka) && dim_is_const(kb) && ka.k != kb.k)
        return op_error(c, n, "inner dimensions differ: A gives K=%lld, B gives K=%lld", (long long)ka.k,
                        (long long)kb.k);
    Dim out[2] = {m, nn};
    if (n->n_in > 2 && n->in[2]) {
        const Value *cv = n->in[2];
        if (cv->rank > 2) return op_error(c, n, "C has rank %d; at most 2 is allowed", cv->rank);
        for (int j = 0; j < cv->rank; j++) {
            Dim d = cv->dims[j], o = out[2 - cv->rank + j];
            if (dim_is_const(d) && d.k != 1 && dim_is_const(o) && d.k != o.k)
                return op_error(c, n, "C's dimension %lld does not broadcast to %lld", (long long)d.k,
                                (long long)o.k);
        }
    }
    set_out(n, 0, t, 2, out);
    return true;
}

static bool infer_matmul(OpCtx *c, Node *n) {
    const Value *a = n->in[0], *b = n->in[1];
    if (a->rank < 1 || b->rank < 1) return op_error(c, n, "inputs must have rank >= 1");
    DType t;
    if (!same_dtype(c, n, 0, 2, &t)) return false;
    /* 1-D operands are promoted (a row for A, a column for B) and the added
     * dimension is removed again from the result, as numpy.matmul does. */
    Dim ad[MAX_RANK], bd[MAX_RANK];
    int ar = a->rank, br = b->rank;
    /* MatMulT's permA/permB: the operand is its input transposed so */
    const int64_t *pa, *pb;
    bool perm_a = node_attr_ints(n, "permA", &pa) == ar, perm_b = node_attr_ints(n, "permB", &pb) == br;
    for (int i = 0; i < ar; i++) ad[i] = a->dims[perm_a ? pa[i] : i];
    for (int i = 0; i < br; i++) bd[i] = b->dims[perm_b ? pb[i] : i];
    if (ar == 1) { ad[1] = ad[0]; ad[0] = dim_const(1); ar = 2; }
    if (br == 1) { bd[1] = dim_const(1); br = 2; }
    /* MatMulT: the operand's last two dims are read swapped */
    if (node_attr_i(n, "transA", 0)) { Dim t0 = ad[ar - 1]; ad[ar - 1] = ad[ar - 2]; ad[ar - 2] = t0; }
    if (node_attr_i(n, "transB", 0)) { Dim t0 = bd[br - 1]; bd[br - 1] = bd[br - 2]; bd[br - 2] = t0; }
    Dim ka = ad[ar - 1], kb = bd[br - 2];
    if (dim_is_const(ka) && dim_is_const(kb) && ka.k != kb.k)
        return op_error(c, n, "inner dimensions differ: %lld vs %lld", (long long)ka.k, (long long)kb.k);
    /* batch dims broadcast */
    int batch = (ar > br ? ar : br) - 2;
    Dim out[MAX_RANK + 1];
    for (int i = 0; i < batch; i++) {
        int ai = i - (batch - (ar - 2)), bi = i - (batch - (br - 2));
        Dim x = ai >= 0 ? ad[ai] : dim_const(1), y = bi >= 0 ? bd[bi] : dim_const(1);
        if (dim_is_const(x) && x.k == 1) out[i] = y;
        else if (dim_is_const(y) && y.k == 1) out[i] = x;
        else if (dim_is_const(x) && dim_is_const(y) && x.k != y.k)
            return op_error(c, n, "batch dimensions %lld and %lld do not broadcast", (long long)x.k, (long long)y.k);
        else out[i] = dim_is_const(x) ? x : y;
    }
    int r = batch;
    if (a->rank != 1) out[r++] = ad[ar - 2];
    if (b->rank != 1) out[r++] = bd[br - 1];
    /* MatMulT with fold: the batch dims are summed over (folded into K) */
    if (node_attr_i(n, "fold", 0)) {
        set_out(n, 0, t, 2, out + batch);
        return true;
    }
    set_out(n, 0, t, r, out);
    return true;
}

/* 2*M*N*K multiply-adds plus M*N for the bias. */
static double flops_gemm(const Node *n) {
    const Value *a = n->in[0], *y = n->out[0];
    if (!value_shape_known(a) || !value_shape_known(y)) return 0;
    double k = (double)a->dims[node_attr_i(n, "transA", 0) ? 0 : 1].k;
    double mn = (double)value_numel(y);
    return 2 * mn * k + ((n->n_in > 2 && n->in[2]) ? mn : 0);
}

static double flops_matmul(const Node *n) {
    const Value *a = n->in[0], *y = n->out[0];
    if (!value_shape_known(a) || !value_shape_known(y)) return 0;
    int kdim = a->rank >= 2 && node_attr_i(n, "transA", 0) ? a->rank - 2 : a->rank - 1;
    const int64_t *perm;
    if (node_attr_ints(n, "permA", &perm) == a->rank) kdim = (int)perm[kdim];
    double k = (double)a->dims[kdim].k;
    if (node_attr_i(n, "fold", 0)) /* every batch element's products are summed */
        for (int j = 0; j < a->rank - 2; j++) k *= (double)a->dims[j].k;
    return 2 * (double)value_numel(y) * k;
}

/* ---- code generation ---- */

/* Strided view of a matrix operand: element (i, j) at base + i*si + j*sj. */
typedef struct Mat {
    const Value *v;
    LLVMValueRef base; /* element offset of the matrix inside v */
    int64_t si, sj;
} Mat;

static LLVMValueRef mat_at(Cg *c, const Mat *m, LLVMValueRef i, LLVMValueRef j) {
    return cg_add(c, m->base, cg_add(c, cg_mul(c, i, m->si), cg_mul(c, j, m->sj)));
}

/* Pointer to element `base` of a float32 buffer. */
static LLVMValueRef mat_ptr(Cg *c, const Value *v, LLVMValueRef base) {
    return LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, v), &base, 1, "");
}

/* y[m, n] (+)= alpha * sum_k a(m,k) b(k,n), y row-major (rows N apart)
 * from element offset ybase; with overwrite (only where the packed path
 * applies) y's old values are replaced, not added to.  Float32 products large enough
 * for packing to pay go to the packed, register-blocked kernels of
 * codegen/cg_gemm.c, which fold a's and b's strides (transposes) into
 * their packing.  For the other float32 outputs: when b is contiguous
 * along n the n loop is innermost (an axpy that vectorises); when a and b
 * are both contiguous along k a vector dot product is used; otherwise
 * scalar.  Integer outputs accumulate exactly in an i64 register (alpha is
 * 1 for them), and float16/bfloat16 outputs in a float32 register, so
 * that y is rounded once, not after every product. */

static void gemm_block(Cg *c, const Mat *a, const Mat *b, const Value *y, LLVMValueRef ybase, int64_t M, int64_t N,
                       int64_t K, float alpha, bool overwrite) {
    if (cg_gemm_applies(a->v, b->v, y, M, N, K)) {
        CgGemm g = {M, N, K, a->si, a->sj, b->si, b->sj, N, alpha, overwrite};
        cg_gemm(c, &g, mat_ptr(c, a->v, a->base), mat_ptr(c, b->v, b->base), mat_ptr(c, y, ybase));
        return;
    }
    bool ints = !dtype_is_float(y->dtype), narrow = y->dtype == DT_FLOAT16 || y->dtype == DT_BFLOAT16;
    bool dot = a->sj == 1 && b->si == 1 && b->sj != 1;
    CgLoop lm, lk, ln;
    LLVMValueRef m = cg_for(c, &lm, cg_i64(c, M));
    LLVMValueRef yrow = cg_add(c, ybase, cg_mul(c, m, N));
    if (ints || (narrow && !dot)) {
        LLVMTypeRef t = ints ? c->t_i64 : c->t_f32;
        LLVMValueRef acc = cg_alloca(c, t);
        LLVMValueRef n = cg_for(c, &ln, cg_i64(c, N));
        LLVMBuildStore(c->b, LLVMConstNull(t), acc);
        LLVMValueRef k = cg_for(c, &lk, cg_i64(c, K));
        LLVMValueRef ia = mat_at(c, a, m, k), ib = mat_at(c, b, k, n), s = LLVMBuildLoad2(c->b, t, acc, "");
        if (ints)
            s = LLVMBuildAdd(c->b, s, LLVMBuildMul(c->b, cg_load_i(c, a->v, ia), cg_load_i(c, b->v, ib), ""), "");
        else
            s = LLVMBuildFAdd(c->b, s, LLVMBuildFMul(c->b, cg_load(c, a->v, ia), cg_load(c, b->v, ib), ""), "");
        LLVMBuildStore(c->b, s, acc);
        cg_for_end(c, &lk);
        LLVMValueRef yi = cg_add(c, yrow, n), sum = LLVMBuildLoad2(c->b, t, acc, "");
        if (ints) {
            cg_store(c, y, yi, LLVMBuildAdd(c->b, cg_load_i(c, y, yi), sum, ""));
        } else {
            if (alpha != 1.0f) sum = LLVMBuildFMul(c->b, sum, cg_f32(c, alpha), "");
            cg_store(c, y, yi, LLVMBuildFAdd(c->b, cg_load(c, y, yi), sum, ""));
        }
        cg_for_end(c, &ln);
    } else if (!dot) {
        LLVMValueRef k = cg_for(c, &lk, cg_i64(c, K));
        LLVMValueRef av = cg_load(c, a->v, mat_at(c, a, m, k));
        if (alpha != 1.0f) av = LLVMBuildFMul(c->b, av, cg_f32(c, alpha), "");
        LLVMValueRef n = cg_for(c, &ln, cg_i64(c, N));
        LLVMValueRef yi = cg_add(c, yrow, n);
        LLVMValueRef prod = LLVMBuildFMul(c->b, av, cg_load(c, b->v, mat_at(c, b, k, n)), "");
        cg_store(c, y, yi, LLVMBuildFAdd(c->b, cg_load(c, y, yi), prod, ""));
        cg_for_end(c, &ln);
        cg_for_end(c, &lk);
    } else {
        LLVMValueRef n = cg_for(c, &ln, cg_i64(c, N));
        LLVMValueRef d = cg_dot(c, a->v, mat_at(c, a, m, cg_i64(c, 0)), b->v, mat_at(c, b, cg_i64(c, 0), n), K);
        if (alpha != 1.0f) d = LLVMBuildFMul(c->b, d, cg_f32(c, alpha), "");
        LLVMValueRef yi = cg_add(c, yrow, n);
        cg_store(c, y, yi, LLVMBuildFAdd(c->b, cg_load(c, y, yi), d, ""));
        cg_for_end(c, &ln);
    }
    cg_for_end(c, &lm);
}

/* Y = alpha * op(A) op(B) + beta * C.  Integer Gemm is exact in int64 when
 * alpha is 1 and beta 0 or 1; other scalings of integers are refused. */
static bool k_gemm(Cg *c, const Node *n) {
    const Value *A = n->in[0], *B = n->in[1], *C = n->n_in > 2 ? n->in[2] : NULL, *Y = n->out[0];
    bool ta = node_attr_i(n, "transA", 0) != 0, tb = node_attr_i(n, "transB", 0) != 0;
    float alpha = node_attr_f(n, "alpha", 1.0f), beta = node_attr_f(n, "beta", 1.0f);
    int64_t M = Y->dims[0].k, N = Y->dims[1].k, K = A->dims[ta ? 0 : 1].k;
    bool ints = !dtype_is_float(Y->dtype);
    if (ints && (alpha != 1.0f || (beta != 0.0f && beta != 1.0f)))
        return diag_error(c->d, DIAG_UNSUPPORTED,
                          "%s: node '%s' (Gemm): integer Gemm with alpha %g and beta %g is not compiled (only "
                          "alpha 1, beta 0 or 1 are exact)", c->g->path, n->name, alpha, beta);
    if (!cg_kernel_begin_io(c, n)) return false;
    /* Y starts as beta*C broadcast (or 0) */
    int64_t cs0 = 0, cs1 = 0;
    if (C && C->rank == 2) {
        cs0 = C->dims[0].k == 1 ? 0 : C->dims[1].k;
        cs1 = C->dims[1].k == 1 ? 0 : 1;
    } else if (C && C->rank == 1) {
        cs1 = C->dims[0].k == 1 ? 0 : 1;
    }
    Mat a = {A, cg_i64(c, 0), ta ? 1 : K, ta ? M : 1};
    Mat b = {B, cg_i64(c, 0), tb ? 1 : N, tb ? K : 1};
    /* without C the packed product writes Y outright */
    if ((!C || beta == 0.0f) && cg_gemm_applies(A, B, Y, M, N, K)) {
        gemm_block(c, &a, &b, Y, cg_i64(c, 0), M, N, K, alpha, true);
        cg_kernel_end(c);
        return true;
    }
    CgLoop l0, l1;
    LLVMValueRef i = cg_for(c, &l0, cg_i64(c, M));
    LLVMValueRef j = cg_for(c, &l1, cg_i64(c, N));
    LLVMValueRef init = ints ? cg_i64(c, 0) : cg_f32(c, 0);
    if (C && beta != 0.0f) {
        LLVMValueRef ci = cg_add(c, cg_mul(c, i, cs0), cg_mul(c, j, cs1));
        init = ints ? cg_load_i(c, C, ci) : cg_load(c, C, ci);
        if (beta != 1.0f) init = LLVMBuildFMul(c->b, init, cg_f32(c, beta), "");
    }
    cg_store(c, Y, cg_mad(c, i, N, j), init);
    cg_for_end(c, &l1);
    cg_for_end(c, &l0);
    gemm_block(c, &a, &b, Y, cg_i64(c, 0), M, N, K, alpha, false);
    cg_kernel_end(c);
    return true;
}

/* Operand `slot` of a MatMul or MatMulT as the matrices it reads: its dims
 * and each dim's stride in its buffer, after MatMulT's perm (the operand
 * is the input read through that transposition, matmul_fold_transposes)
 * and its trans (the last two dims swapped).  A 1-D operand is promoted
 * as numpy.matmul does: A [K] to a row [1, K], B [K] to a column [K, 1].
 * Returns the rank. */
static int operand_view(const Node *n, int slot, int64_t *dims, int64_t *st) {
    const Value *v = n->in[slot];
    int r = v->rank;
    int64_t vs[MAX_RANK], s = 1;
    for (int j = r - 1; j >= 0; j--) {
        vs[j] = s;
        s *= v->dims[j].k;
    }
    if (r == 1) {
        dims[1 - slot] = v->dims[0].k, st[1 - slot] = 1;
        dims[slot] = 1, st[slot] = 0;
        return 2;
    }
    const int64_t *perm;
    bool permuted = node_attr_ints(n, slot ? "permB" : "permA", &perm) == r;
    for (int j = 0; j < r; j++) {
        int from = permuted ? (int)perm[j] : j;
        dims[j] = v->dims[from].k;
        st[j] = vs[from];
    }
    if (node_attr_i(n, slot ? "transB" : "transA", 0)) {
        int64_t t = dims[r - 1];
        dims[r - 1] = dims[r - 2], dims[r - 2] = t;
        t = st[r - 1];
        st[r - 1] = st[r - 2], st[r - 2] = t;
    }
    return r;
}

/* Whether an operand's batch dims (strides st, sizes dims) continue its
 * dim of stride `stride` and size `len`: element b's run starts where
 * element b - 1's ends, so the batch and that dim are one dim of stride
 * `stride`.  Batch dims of size 1 do not count. */
static bool continues(const int64_t *st, const int64_t *dims, int nb, int64_t stride, int64_t len) {
    int64_t next = stride * len;
    for (int j = nb - 1; j >= 0; j--) {
        if (dims[j] == 1) continue;
        if (st[j] != next) return false;
        next *= dims[j];
    }
    return true;
}

/* Batched matmul with numpy broadcasting of the batch dims; 1-D operands
 * are promoted as in infer_matmul, and the promoted dims are absent from
 * Y.  Operands are read at any strides (operand_view), Y is written
 * contiguous. */
static bool k_matmul(Cg *c, const Node *n) {
    const Value *A = n->in[0], *B = n->in[1], *Y = n->out[0];
    int64_t ad[MAX_RANK], ast[MAX_RANK], bd[MAX_RANK], bst[MAX_RANK];
    int ra = operand_view(n, 0, ad, ast), rb = operand_view(n, 1, bd, bst);
    int64_t M = ad[ra - 2], K = ad[ra - 1], N = bd[rb - 1];
    int ab = ra - 2, bb = rb - 2, nb = ab > bb ? ab : bb;
    int64_t bdims[MAX_RANK], as[MAX_RANK], bs[MAX_RANK];
    for (int j = nb - 1; j >= 0; j--) {
        int ja = j - (nb - ab), jb = j - (nb - bb);
        int64_t da = ja >= 0 ? ad[ja] : 1, db = jb >= 0 ? bd[jb] : 1;
        bdims[j] = da > db ? da : db;
        as[j] = da == 1 ? 0 : ast[ja];
        bs[j] = db == 1 ? 0 : bst[jb];
    }
    int64_t batch = 1;
    for (int j = 0; j < nb; j++) batch *= bdims[j];
    Mat a0 = {A, NULL, ast[ra - 2], ast[ra - 1]}, b0 = {B, NULL, bst[rb - 2], bst[rb - 1]};
    if (node_attr_i(n, "fold", 0)) {
        /* sum_b op(A_b) B_b with A [batch.., T, M] read transposed and B
         * [batch.., T, N] (MatMul's weight gradient, g_matmul): one product
         * over the batch's rows, K = batch * T, instead of one per batch
         * element and a sum of their results */
        if (nb == 0 || !continues(as, bdims, nb, ast[ra - 1], K) || !continues(bs, bdims, nb, bst[rb - 2], K))
            return diag_error(c->d, DIAG_INTERNAL, "node '%s' (MatMulT): fold needs operands whose batch continues "
                              "their rows", n->name);
        if (!cg_kernel_begin_io(c, n)) return false;
        bool whole = cg_gemm_applies(A, B, Y, M, N, K * batch);
        if (!whole) cg_fill(c, Y, value_numel(Y), cg_f32(c, 0));
        a0.base = b0.base = cg_i64(c, 0);
        gemm_block(c, &a0, &b0, Y, cg_i64(c, 0), M, N, K * batch, 1.0f, whole);
        cg_kernel_end(c);
        return true;
    }
    if (!cg_kernel_begin_io(c, n)) return false;
    if (nb > 0 && batch > 1 && continues(as, bdims, nb, ast[ra - 2], M)) {
        bool b_shared = true;
        for (int j = 0; j < nb; j++) b_shared = b_shared && bs[j] == 0;
        if (b_shared) {
            /* one B for every batch element (a Linear layer over [B, T, K]):
             * the batch's rows are one product of batch * M rows, which
             * packs B once instead of once per batch element */
            bool whole = cg_gemm_applies(A, B, Y, M * batch, N, K);
            if (!whole) cg_fill(c, Y, value_numel(Y), cg_f32(c, 0));
            a0.base = b0.base = cg_i64(c, 0);
            gemm_block(c, &a0, &b0, Y, cg_i64(c, 0), M * batch, N, K, 1.0f, whole);
            cg_kernel_end(c);
            return true;
        }
    }
    /* a packed product writes Y outright; the other loops add into zeros */
    bool packed = cg_gemm_applies(A, B, Y, M, N, K);
    if (!packed) cg_fill(c, Y, value_numel(Y), cg_f32(c, 0));
    CgLoop loops[MAX_RANK];
    LLVMValueRef ao = cg_i64(c, 0), bo = cg_i64(c, 0), yo = cg_i64(c, 0);
    for (int j = 0; j < nb; j++) {
        LLVMValueRef iv = cg_for(c, &loops[j], cg_i64(c, bdims[j]));
        if (as[j]) ao = cg_add(c, ao, cg_mul(c, iv, as[j]));
        if (bs[j]) bo = cg_add(c, bo, cg_mul(c, iv, bs[j]));
        yo = cg_mad(c, yo, bdims[j], iv);
    }
    yo = cg_mul(c, yo, M * N);
    /* element (i, k) of op(A) and (k, j) of op(B) */
    a0.base = ao, b0.base = bo;
    gemm_block(c, &a0, &b0, Y, yo, M, N, K, 1.0f, packed);
    for (int j = nb - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
    cg_kernel_end(c);
    return true;
}

/* ---- gradient rules ---- */

static Value *gemm(GradCtx *c, Value *a, Value *b, bool ta, bool tb, float alpha) {
    Value *in[2] = {a, b};
    Node *g = gb_start(c, "", "Gemm", 2, in, 1);
    gb_attr_i(c, g, "transA", ta);
    gb_attr_i(c, g, "transB", tb);
    if (alpha != 1.0f) gb_attr_f(c, g, "alpha", alpha);
    return gb_finish(c, g);
}

/* Y = alpha op(A) op(B) + beta C:
 *   d op(A) = alpha dY op(B)^T,  d op(B) = alpha op(A)^T dY,
 * written so that no operand needs a transposed copy. */
static bool g_gemm(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *A = n->in[0], *B = n->in[1], *d = dy[0];
    bool ta = node_attr_i(n, "transA", 0) != 0, tb = node_attr_i(n, "transB", 0) != 0;
    float alpha = node_attr_f(n, "alpha", 1.0f), beta = node_attr_f(n, "beta", 1.0f);
    if (need[0]) dx[0] = ta ? gemm(c, B, d, tb, true, alpha) : gemm(c, d, B, false, !tb, alpha);
    if (need[1]) dx[1] = tb ? gemm(c, d, A, true, ta, alpha) : gemm(c, A, d, !ta, false, alpha);
    if (n->n_in > 2 && need[2]) dx[2] = gb_sum_to(c, gb_scale(c, d, beta), n->in[2]);
    return true;
}

/* op(A) op(B) as MatMulT, op swapping the last two dims where asked. */
static Value *matmul_t(GradCtx *c, Value *a, Value *b, bool ta, bool tb) {
    if (!a || !b) return NULL;
    Value *in[2] = {a, b};
    Node *m = gb_start(c, "cleave", "MatMulT", 2, in, 1);
    gb_attr_i(c, m, "transA", ta);
    gb_attr_i(c, m, "transB", tb);
    return gb_finish(c, m);
}

/* Y = A B (batched): dA = dY B^T, dB = A^T dY, summed over broadcast
 * batch dims; the transposes are MatMulT's, never copies. */
static bool g_matmul(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *A = n->in[0], *B = n->in[1];
    if (A->rank < 2 || B->rank < 2)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (MatMul): gradient of 1-D operands is not supported",
                          c->g->path, n->name);
    if (need[0]) dx[0] = gb_sum_to(c, matmul_t(c, dy[0], B, false, true), A);
    if (need[1]) {
        if (B->rank == 2 && A->rank > 2 && value_shape_known(A)) {
            /* a weight shared by every batch element: the sum of the
             * elements' products is one product over all their rows */
            Value *in[2] = {A, dy[0]};
            Node *m = gb_start(c, "cleave", "MatMulT", 2, in, 1);
            gb_attr_i(c, m, "transA", 1);
            gb_attr_i(c, m, "transB", 0);
            gb_attr_i(c, m, "fold", 1);
            dx[1] = gb_finish(c, m);
        } else {
            dx[1] = gb_sum_to(c, matmul_t(c, A, dy[0], true, false), B);
        }
    }
    return true;
}

/* MatMulT is made only by g_matmul, on operands of rank >= 2. */
static bool infer_matmul_t(OpCtx *c, Node *n) {
    if (n->in[0]->rank < 2 || n->in[1]->rank < 2) return op_error(c, n, "MatMulT's inputs must have rank >= 2");
    return infer_matmul(c, n);
}

/* ---- Transposes read in place by matrix products ---- */

/* The permutation of Transpose node t (reversed dims by default). */
static void transpose_perm(const Node *t, int rank, int64_t *perm) {
    const int64_t *p;
    if (node_attr_ints(t, "perm", &p) == rank) {
        for (int j = 0; j < rank; j++) perm[j] = p[j];
    } else {
        for (int j = 0; j < rank; j++) perm[j] = rank - 1 - j;
    }
}

/* Node n's attribute `name` set to the ints v, added when absent (the
 * node's attribute array is copied into a larger one). */
static bool set_ints(Graph *g, Node *n, const char *name, const int64_t *v, int count) {
    Attr *a = (Attr *)node_attr(n, name);
    if (!a) {
        Attr *na = ARENA_ARRAY(&g->arena, Attr, n->n_attr + 1);
        if (!na) return false;
        if (n->n_attr) memcpy(na, n->attrs, sizeof *na * (size_t)n->n_attr);
        n->attrs = na;
        a = &na[n->n_attr++];
        memset(a, 0, sizeof *a);
        a->name = arena_strdup(&g->arena, name);
        a->kind = ATTR_INTS;
    }
    a->ints = ARENA_ARRAY(&g->arena, int64_t, count);
    if (!a->name || !a->ints) return false;
    memcpy(a->ints, v, sizeof *v * (size_t)count);
    a->n = count;
    return true;
}

/* Whether value v is read by a live node other than `but`, or is a graph
 * output. */
static bool read_elsewhere(Graph *g, const Value *v, const Node *but) {
    if (v->is_output) return true;
    GRAPH_FOR_NODES(g, m) {
        if (m == but) continue;
        for (int i = 0; i < m->n_in; i++)
            if (m->in[i] == v) return true;
    }
    return false;
}

int matmul_fold_transposes(Graph *g) {
    int folded = 0;
    GRAPH_FOR_NODES(g, n) {
        bool t_node = n->def == &op_MatMulT;
        if ((n->def != &op_MatMul && !t_node) || node_attr_i(n, "fold", 0)) continue;
        if (n->in[0]->rank < 2 || n->in[1]->rank < 2) continue; /* MatMulT's operands are matrices */
        for (int slot = 0; slot < 2; slot++) {
            /* rank 2 only (the exporter's W^T of a Linear layer): reading
             * attention's q, k and v through their [B, T, H, dh] layout
             * instead of copying them measured no faster, the packing's
             * rows 512 bytes apart conflicting in L1 (docs/perf.md) */
            Value *v = n->in[slot];
            Node *t = v ? v->producer : NULL;
            if (!t || t->dead || t->def != &op_Transpose || v->rank != 2 || !value_shape_known(v)) continue;
            const Value *x = t->in[0];
            if (x->dtype != DT_FLOAT || x->rank != v->rank) continue;
            /* the operand read through the node's perm is x read through
             * the composition of the two */
            int r = v->rank;
            int64_t p[MAX_RANK], q[MAX_RANK];
            const int64_t *old;
            bool had = node_attr_ints(n, slot ? "permB" : "permA", &old) == r;
            transpose_perm(t, r, p);
            for (int j = 0; j < r; j++) q[j] = p[had ? old[j] : j];
            if (!t_node) {
                n->op_type = "MatMulT";
                n->domain = "cleave";
                n->def = &op_MatMulT;
                t_node = true;
            }
            if (!set_ints(g, n, slot ? "permB" : "permA", q, r)) return -1;
            n->in[slot] = t->in[0];
            folded++;
            if (read_elsewhere(g, v, NULL)) continue;
            /* partitioning places the gradient and update nodes serving
             * the Transpose with it: they follow the product now */
            Node *heir = n->phase == PHASE_FORWARD ? n : n->origin;
            if (t->phase == PHASE_FORWARD && !heir) continue;
            GRAPH_FOR_NODES(g, m) {
                if (m->origin == t) m->origin = heir;
            }
            t->dead = true;
        }
    }
    /* The exporter's W^T also sends a Linear weight's gradient through a
     * Transpose of the product that makes it: (sum_b A_b^T B_b)^T is
     * sum_b B_b^T A_b, the fold product with its operands swapped, which
     * then writes the Transpose's output itself. */
    GRAPH_FOR_NODES(g, t) {
        Value *v = t->def == &op_Transpose ? t->in[0] : NULL;
        Node *f = v ? v->producer : NULL;
        if (!f || f->dead || f->def != &op_MatMulT || !node_attr_i(f, "fold", 0) || v->rank != 2) continue;
        int64_t p[2];
        transpose_perm(t, 2, p);
        if (p[0] != 1 || read_elsewhere(g, v, t)) continue;
        Value *a = f->in[0], *y = t->out[0];
        f->in[0] = f->in[1];
        f->in[1] = a;
        f->out[0] = y;
        y->producer = f;
        y->producer_slot = 0;
        v->producer = NULL; /* read by nothing now */
        GRAPH_FOR_NODES(g, m) {
            if (m->origin == t) m->origin = t->origin;
        }
        t->dead = true;
        folded++;
    }
    return folded;
}

static const AttrSpec attrs_gemm[] = {
    {"alpha", ATTR_FLOAT, .f = 1.0f}, {"beta", ATTR_FLOAT, .f = 1.0f},
    {"transA", ATTR_INT, .i = 0},     {"transB", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_none[] = {{0}};
/* fold: the batch dims of both operands are summed over (A's read
 * transposed), giving op(A)'s last two dims' product alone.  permA, permB:
 * the operand is its input transposed by this permutation (before trans),
 * read in place (matmul_fold_transposes). */
static const AttrSpec attrs_matmul_t[] = {{"transA", ATTR_INT, .i = 0}, {"transB", ATTR_INT, .i = 0},
                                          {"fold", ATTR_INT, .i = 0},   {"permA", ATTR_INTS},
                                          {"permB", ATTR_INTS},         {0}};

const OpDef op_Gemm = {"Gemm", "", 1, 0, 2, 3, 1, 1, attrs_gemm, 0, infer_gemm, NULL, flops_gemm, .grad = g_gemm, .cg = k_gemm, .dense = true};
const OpDef op_MatMul = {"MatMul", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_matmul, NULL, flops_matmul, .grad = g_matmul, .cg = k_matmul, .dense = true};
const OpDef op_MatMulT = {"MatMulT", "cleave", 1, 0, 2, 2, 1, 1, attrs_matmul_t, 0, infer_matmul_t, NULL, flops_matmul, .cg = k_matmul, .dense = true};
