/* ops_linalg.c - Gemm, MatMul, and MatMulT (cleave's MatMul with either
 * operand's last two dims swapped, which MatMul's gradient uses so that no
 * transposed copy is made: the packed GEMM folds the swap into its
 * packing). */
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
    for (int i = 0; i < ar; i++) ad[i] = a->dims[i];
    for (int i = 0; i < br; i++) bd[i] = b->dims[i];
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

/* Batched matmul with numpy broadcasting of the batch dims; 1-D operands
 * are promoted as in infer_matmul (A [K] is a row [1,K], B [K] a column
 * [K,1]), and the promoted dims are absent from Y. */
static bool k_matmul(Cg *c, const Node *n) {
    const Value *A = n->in[0], *B = n->in[1], *Y = n->out[0];
    /* MatMulT's operands are at least 2-D (infer_matmul_t) */
    bool ta = node_attr_i(n, "transA", 0) != 0, tb = node_attr_i(n, "transB", 0) != 0;
    int64_t M = A->rank >= 2 ? A->dims[A->rank - (ta ? 1 : 2)].k : 1, K = A->dims[A->rank - (ta ? 2 : 1)].k;
    int64_t N = B->rank >= 2 ? B->dims[B->rank - (tb ? 2 : 1)].k : 1;
    int ab = A->rank > 2 ? A->rank - 2 : 0, bb = B->rank > 2 ? B->rank - 2 : 0;
    int nb = ab > bb ? ab : bb;
    int64_t bdims[MAX_RANK], as[MAX_RANK], bs[MAX_RANK];
    int64_t sa = M * K, sb = K * N;
    for (int j = nb - 1; j >= 0; j--) {
        int ja = j - (nb - ab), jb = j - (nb - bb);
        int64_t da = ja >= 0 ? A->dims[ja].k : 1, db = jb >= 0 ? B->dims[jb].k : 1;
        bdims[j] = da > db ? da : db;
        as[j] = da == 1 ? 0 : sa;
        bs[j] = db == 1 ? 0 : sb;
        sa *= da;
        sb *= db;
    }
    /* A's batch dims are contiguous and every one of them has its own
     * matrix (none broadcast) */
    bool a_whole = true, b_whole = true;
    int64_t batch = 1;
    for (int j = 0; j < nb; j++) {
        batch *= bdims[j];
        a_whole = a_whole && (as[j] != 0 || bdims[j] == 1);
        b_whole = b_whole && (bs[j] != 0 || bdims[j] == 1);
    }
    if (node_attr_i(n, "fold", 0)) {
        /* sum_b op(A_b) B_b with A [batch.., T, M] read transposed and B
         * [batch.., T, N] (MatMul's weight gradient, g_matmul): one product
         * over the batch's rows, K = batch * T, instead of one per batch
         * element and a sum of their results */
        if (!ta || tb || nb == 0 || !a_whole || !b_whole) {
            return diag_error(c->d, DIAG_INTERNAL, "node '%s' (MatMulT): fold needs transA and equal batch dims",
                              n->name);
        }
        if (!cg_kernel_begin_io(c, n)) return false;
        bool whole = cg_gemm_applies(A, B, Y, M, N, K * batch);
        if (!whole) cg_fill(c, Y, value_numel(Y), cg_f32(c, 0));
        Mat a = {A, cg_i64(c, 0), 1, M}, b = {B, cg_i64(c, 0), N, 1};
        gemm_block(c, &a, &b, Y, cg_i64(c, 0), M, N, K * batch, 1.0f, whole);
        cg_kernel_end(c);
        return true;
    }
    if (!cg_kernel_begin_io(c, n)) return false;
    if (nb > 0 && !ta && a_whole && batch > 1) {
        bool b_shared = true;
        for (int j = 0; j < nb; j++) b_shared = b_shared && bs[j] == 0;
        if (b_shared) {
            /* one B for every batch element (a Linear layer over [B, T, K]):
             * the batch's rows are one product of batch * M rows, which
             * packs B once instead of once per batch element */
            bool whole = cg_gemm_applies(A, B, Y, M * batch, N, K);
            if (!whole) cg_fill(c, Y, value_numel(Y), cg_f32(c, 0));
            Mat a = {A, cg_i64(c, 0), K, 1}, b = {B, cg_i64(c, 0), tb ? 1 : N, tb ? K : 1};
            gemm_block(c, &a, &b, Y, cg_i64(c, 0), M * batch, N, K, 1.0f, whole);
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
    Mat a = {A, ao, ta ? 1 : K, ta ? M : 1}, b = {B, bo, tb ? 1 : N, tb ? K : 1};
    gemm_block(c, &a, &b, Y, yo, M, N, K, 1.0f, packed);
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

static const AttrSpec attrs_gemm[] = {
    {"alpha", ATTR_FLOAT, .f = 1.0f}, {"beta", ATTR_FLOAT, .f = 1.0f},
    {"transA", ATTR_INT, .i = 0},     {"transB", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_none[] = {{0}};
/* fold: the batch dims of both operands are summed over (A's read
 * transposed), giving op(A)'s last two dims' product alone */
static const AttrSpec attrs_matmul_t[] = {
    {"transA", ATTR_INT, .i = 0}, {"transB", ATTR_INT, .i = 0}, {"fold", ATTR_INT, .i = 0}, {0}};

const OpDef op_Gemm = {"Gemm", "", 1, 0, 2, 3, 1, 1, attrs_gemm, 0, infer_gemm, NULL, flops_gemm, .grad = g_gemm, .cg = k_gemm, .dense = true};
const OpDef op_MatMul = {"MatMul", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_matmul, NULL, flops_matmul, .grad = g_matmul, .cg = k_matmul, .dense = true};
const OpDef op_MatMulT = {"MatMulT", "cleave", 1, 0, 2, 2, 1, 1, attrs_matmul_t, 0, infer_matmul_t, NULL, flops_matmul, .cg = k_matmul, .dense = true};
