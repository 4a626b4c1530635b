/* ops_conv_gemm.c - Conv's training kernels as packed matrix products
 * (ops_conv.h).
 *
 * For a block of nb samples and one group g, with P output positions per
 * sample and K = Cpg * kernel elements:
 *
 *   forward        Y_g  (Mpg x nb*P)  = W_g (Mpg x K) * cols (K x nb*P)
 *   input grad     cols (K x nb*P)    = W_g^T * dY_g, scattered onto dX
 *                  (at stride 1: a forward pass over dY, see as_forward)
 *   weight grad    dW_g (Mpg x K)    += dY_g * cols^T
 *
 * where cols holds the block's patches (row (c, kernel offset), column
 * (sample, output position)).  Samples are blocked so that a product has
 * at least MIN_COLS columns: the late layers of a CNN have few output
 * positions, and a product one or two columns wide leaves the
 * micro-kernel's vectors empty.  With one sample per block the products
 * read and write Y and dY in place; with more, the rows of each output
 * channel are regrouped through a scratch matrix, a copy of P floats at a
 * time.
 *
 * Every sum has a fixed order (cg_gemm's, then the blocks in order), so the
 * bits depend on the shapes alone, as everywhere else. */
#include <stdio.h>
#include <string.h>

#include "../codegen/cg_gemm.h"
#include "op_util.h"
#include "ops_cg.h"
#include "ops_conv.h"

/* Scratch areas (cg_scratch): the patch matrix, a block's output-channel
 * rows, one group's weight gradient before its float64 sum, and the
 * flipped filters of an input gradient at stride 1. */
#define COL_AREA "cleave.conv.cols"
#define ROWS_AREA "cleave.conv.rows"
#define DW_AREA "cleave.conv.dw"
#define WT_AREA "cleave.conv.wt"

/* Products at least this wide fill the micro-kernel's vectors (its tiles
 * are 48 or 64 columns wide) several times over. */
enum { MIN_COLS = 256 };

static int64_t k_dim(const ConvShape *s) { return s->C / s->G * s->w.k_sz; }
static int64_t mpg(const ConvShape *s) { return s->M / s->G; }

/* Samples per block. */
static int64_t block_of(const ConvShape *s) {
    int64_t P = s->w.out_sz, nb = (MIN_COLS + P - 1) / P;
    return nb > s->N ? s->N : nb < 1 ? 1 : nb;
}

static int64_t n_blocks(const ConvShape *s) { return (s->N + block_of(s) - 1) / block_of(s); }

bool conv_gemm_applies(const ConvShape *s, const Value *x, const Value *f, const Value *y) {
    /* a product with fewer than 8 rows (depthwise and narrow grouped
     * convolutions) wastes most of the micro-kernel; the direct kernels
     * serve those better */
    if (s->w.out_sz < 1 || s->N < 1) return false;
    if (cg_gemm_forced() == 0 && (mpg(s) < 8 || k_dim(s) < 8)) return false;
    return cg_gemm_applies(x, f, y, mpg(s), block_of(s) * s->w.out_sz, k_dim(s));
}

/* ---- pointers ---- */

static LLVMValueRef fptr(Cg *c, LLVMValueRef base, LLVMValueRef i) {
    return LLVMBuildInBoundsGEP2(c->b, c->t_f32, base, &i, 1, "");
}

static LLVMValueRef area(Cg *c, const char *name, int64_t n) { return fptr(c, cg_scratch(c, name, n), cg_i64(c, 0)); }

static void zero_floats(Cg *c, LLVMValueRef p, int64_t n) {
    LLVMBuildMemSet(c->b, p, LLVMConstInt(c->t_i8, 0, 0), cg_i64(c, n * 4), 16);
}

/* ---- patches ---- */

/* x splatted over the lanes of a vector of w elements. */
static LLVMValueRef splat(Cg *c, LLVMValueRef x, int w) {
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(x), (unsigned)w);
    LLVMValueRef v = LLVMBuildInsertElement(c->b, LLVMGetUndef(vt), x, LLVMConstInt(c->t_i32, 0, 0), "");
    return LLVMBuildShuffleVector(c->b, v, LLVMGetUndef(vt), LLVMConstNull(LLVMVectorType(c->t_i32, (unsigned)w)),
                                  "");
}

/* The vector of W floats at element o0 of a run: gathered from x into
 * cols, or added from cols into x.  Lanes outside [lo, hi) are padding:
 * masked loads and stores do not touch them (so x's address may lie
 * outside its buffer there); tail, when set, masks the lanes past the
 * run's end. */
static void vector_at(Cg *c, LLVMValueRef xp, LLVMValueRef cp, LLVMValueRef vlo, LLVMValueRef vhi, int64_t o0,
                      LLVMValueRef o_iv, LLVMValueRef tail, int64_t stride, bool scatter) {
    int W = cg_vector_floats();
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, (unsigned)W), over[2] = {vt, c->t_ptr};
    LLVMValueRef iota[16];
    for (int i = 0; i < W; i++) iota[i] = cg_i64(c, i);
    LLVMValueRef o = o_iv ? o_iv : cg_i64(c, o0);
    LLVMValueRef idx = LLVMBuildAdd(c->b, splat(c, o, W), LLVMConstVector(iota, (unsigned)W), "");
    LLVMValueRef m = LLVMBuildAnd(c->b, LLVMBuildICmp(c->b, LLVMIntSGE, idx, vlo, ""),
                                  LLVMBuildICmp(c->b, LLVMIntSLT, idx, vhi, ""), "");
    if (tail) m = LLVMBuildAnd(c->b, m, tail, "");
    LLVMValueRef xa = LLVMBuildGEP2(c->b, c->t_f32, xp, &o, 1, ""), ca = fptr(c, cp, o);
    LLVMValueRef align = LLVMConstInt(c->t_i32, 4, 0), zero = LLVMConstNull(vt);
    LLVMValueRef xv;
    if (stride == 1) {
        xv = cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){xa, align, m, zero}, 4);
    } else { /* gathering only: lane t reads x at (o + t) * stride, through
              * 32-bit offsets (x86 gathers 16 lanes of those per
              * instruction, 8 of 64-bit ones); a run's offsets are small */
        LLVMValueRef at = LLVMBuildMul(c->b, idx, splat(c, cg_i64(c, stride), W), "");
        at = LLVMBuildTrunc(c->b, at, LLVMVectorType(c->t_i32, (unsigned)W), "");
        LLVMValueRef ps = LLVMBuildGEP2(c->b, c->t_f32, xp, &at, 1, "");
        LLVMTypeRef gover[2] = {vt, LLVMTypeOf(ps)};
        xv = cg_intrinsic(c, "llvm.masked.gather", gover, 2, (LLVMValueRef[]){ps, align, m, zero}, 4);
    }
    if (!scatter) {
        if (tail)
            cg_intrinsic(c, "llvm.masked.store", over, 2, (LLVMValueRef[]){xv, ca, align, tail}, 4);
        else
            LLVMSetAlignment(LLVMBuildStore(c->b, xv, ca), 4);
        return;
    }
    LLVMValueRef cv;
    if (tail) {
        cv = cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){ca, align, tail, zero}, 4);
    } else {
        cv = LLVMBuildLoad2(c->b, vt, ca, "");
        LLVMSetAlignment(cv, 4);
    }
    cg_intrinsic(c, "llvm.masked.store", over, 2, (LLVMValueRef[]){LLVMBuildFAdd(c->b, xv, cv, ""), xa, align, m}, 4);
}

/* A run of `last` floats in vectors: the whole ones in a loop, then the
 * partial one.  xp is x's element at o = 0 (possibly outside x), cp the
 * run's start in cols; x is read at `stride` (gathers where it is not 1,
 * which only the gathering direction takes). */
static void vector_run(Cg *c, LLVMValueRef xp, LLVMValueRef cp, LLVMValueRef lo, LLVMValueRef hi, int64_t last,
                       int64_t stride, bool scatter) {
    int W = cg_vector_floats();
    LLVMValueRef vlo = splat(c, lo, W), vhi = splat(c, hi, W);
    int64_t whole = last / W, rest = last % W;
    if (whole > 0) {
        CgLoop l;
        LLVMValueRef v = cg_for(c, &l, cg_i64(c, whole));
        vector_at(c, xp, cp, vlo, vhi, 0, cg_mul(c, v, W), NULL, stride, scatter);
        cg_for_end(c, &l);
    }
    if (rest > 0) {
        LLVMValueRef bits[16];
        for (int i = 0; i < W; i++) bits[i] = LLVMConstInt(c->t_i1, i < rest, 0);
        vector_at(c, xp, cp, vlo, vhi, whole * W, NULL, LLVMConstVector(bits, (unsigned)W), stride, scatter);
    }
}

/* ---- small planes ---- */

/* Where the output rows are shorter than a vector (the late layers of a
 * CNN: 8x8, 4x4, 2x2 and 1x1 planes), runs along the last dim would leave
 * most lanes of every vector empty.  A patch row is then walked as whole
 * vectors of its columns (sample, output position), lane t standing for
 * output position p_t of sample offset n_t, both fixed at compile time.
 * For kernel offset k the lane reads input position o_j(p_t)*s_j - pb_j +
 * k_j*d_j along each dim j, padding where outside [0, in_j).
 *
 * At stride 1 with the input's inner dims equal to the output's (a 3x3
 * convolution padded by 1, and its input gradient) the positions a row
 * reads are contiguous: p + a constant.  A sample's P positions are then
 * ceil(P/W) masked vector loads.  Otherwise, at strides above 1, each
 * lane gathers through a 32-bit offset; when P divides W a vector spans
 * W/P samples and every vector of a row has the same pattern, else each
 * sample takes ceil(P/W) vectors of its own.  At stride 1 without
 * contiguity the runs' masked loads beat gathers (resnet18's 8x8 and 4x4
 * layers, measured: 143 against 109 GFLOP/s), and col2im keeps its runs
 * and scalar loops: a vector scatter at stride 2 ran at 130 GFLOP/s
 * against 149, and masked loads and stores at stride 1 on 2x2 and 1x1
 * planes at half the speed (each row's masked stores land where the next
 * row's loads read). */

typedef struct Plane {
    int W;           /* lanes */
    bool contig;     /* a sample's positions are contiguous in x */
    bool spans;      /* gathering, P divides W: a vector spans W/P samples */
    int64_t vecs;    /* vectors per pattern: ceil(P/W), or 1 when spans */
    int64_t sample;  /* floats between two samples of x (C * in_sz) */
} Plane;

/* Whether the small-plane walk serves this convolution (see above): rows
 * shorter than a vector, at most 8 vectors of unrolled code per sample,
 * 32-bit offsets within a block of x. */
static bool plane_walk(const ConvShape *s, int64_t nb, bool scatter, Plane *pl) {
    int W = cg_vector_floats();
    const Win *w = &s->w;
    int r = w->nsp;
    int64_t P = w->out_sz;
    bool contig = true;
    for (int j = 0; j < r; j++) contig &= w->s[j] == 1 && (j == 0 || w->in[j] == w->out[j]);
    /* contiguous 2x2 planes ran 10% slower than their runs of 2 */
    if (scatter || (!contig && w->s[r - 1] == 1) || (contig && 2 * P < W)) return false;
    if (w->out[r - 1] >= W || P > 8 * W || nb * s->C * w->in_sz >= INT32_MAX) return false;
    pl->W = W;
    pl->contig = contig;
    pl->spans = !contig && W % P == 0;
    pl->vecs = pl->spans ? 1 : (P + W - 1) / W;
    pl->sample = s->C * w->in_sz;
    return true;
}

static LLVMValueRef i32_vector(Cg *c, const int64_t *v, int W) {
    LLVMValueRef e[16];
    for (int t = 0; t < W; t++) e[t] = LLVMConstInt(c->t_i32, (unsigned long long)v[t], 1);
    return LLVMConstVector(e, (unsigned)W);
}

/* Vector v of a pattern at kernel offsets k[]: *mask gets the lanes that
 * read inside x (and inside the row), and *at where they read, from the
 * sample block's x at channel ch: a vector of lane offsets when
 * gathering, the first lane's offset when contiguous. */
static void plane_lanes(Cg *c, const Win *w, const Plane *pl, int64_t v, const LLVMValueRef *k, LLVMValueRef *at,
                        LLVMValueRef *mask) {
    int W = pl->W, r = w->nsp;
    int64_t P = w->out_sz, is[MAX_RANK], os[MAX_RANK], off[16], pos[16], live[16];
    strides_of(w->in, r, is);
    strides_of(w->out, r, os);
    LLVMTypeRef vi = LLVMVectorType(c->t_i32, (unsigned)W);
    LLVMValueRef kofs = cg_i64(c, 0);
    for (int j = 0; j < r; j++) kofs = cg_add(c, kofs, cg_mul(c, k[j], w->d[j] * is[j]));
    for (int t = 0; t < W; t++) {
        int64_t q = pl->spans ? t : v * W + t, p = q % P;
        live[t] = pl->spans || q < P;
        off[t] = (pl->spans ? q / P * pl->sample : 0);
        for (int j = 0; j < r; j++) off[t] += ((p / os[j]) % w->out[j] * w->s[j] - w->pb[j]) * is[j];
    }
    if (pl->contig) /* off[t] = off[0] + t: the inner strides of x and of the output agree */
        *at = cg_add(c, kofs, cg_i64(c, off[0]));
    else
        *at = LLVMBuildAdd(c->b, i32_vector(c, off, W), splat(c, LLVMBuildTrunc(c->b, kofs, c->t_i32, ""), W), "");
    LLVMValueRef m = LLVMBuildICmp(c->b, LLVMIntNE, i32_vector(c, live, W), LLVMConstNull(vi), "");
    for (int j = 0; j < r; j++) {
        for (int t = 0; t < W; t++) {
            int64_t q = pl->spans ? t : v * W + t, p = q % P;
            pos[t] = (p / os[j]) % w->out[j] * w->s[j] - w->pb[j];
        }
        LLVMValueRef pj = LLVMBuildAdd(c->b, i32_vector(c, pos, W),
                                       splat(c, LLVMBuildTrunc(c->b, cg_mul(c, k[j], w->d[j]), c->t_i32, ""), W), "");
        LLVMValueRef in = LLVMBuildAnd(c->b, LLVMBuildICmp(c->b, LLVMIntSGE, pj, LLVMConstNull(vi), ""),
                                       LLVMBuildICmp(c->b, LLVMIntSLT, pj, splat(c, LLVMConstInt(c->t_i32,
                                                     (unsigned long long)w->in[j], 0), W), ""), "");
        m = LLVMBuildAnd(c->b, m, in, "");
    }
    *mask = m;
}

/* One vector of a patch row: lanes read from x (base xb, at as
 * plane_lanes gives it) into cols at cp, zeros where masked off.
 * Masked-off lanes touch no memory, so their addresses may lie outside
 * x. */
static void plane_vector(Cg *c, const Plane *pl, LLVMValueRef xb, LLVMValueRef cp, LLVMValueRef at,
                         LLVMValueRef mask, LLVMValueRef store_mask) {
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, (unsigned)pl->W), over[2] = {vt, c->t_ptr};
    LLVMValueRef align = LLVMConstInt(c->t_i32, 4, 0), zero = LLVMConstNull(vt);
    LLVMValueRef ps = LLVMBuildGEP2(c->b, c->t_f32, xb, &at, 1, ""), xv;
    if (pl->contig) {
        xv = cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){ps, align, mask, zero}, 4);
    } else {
        LLVMTypeRef gover[2] = {vt, LLVMTypeOf(ps)};
        xv = cg_intrinsic(c, "llvm.masked.gather", gover, 2, (LLVMValueRef[]){ps, align, mask, zero}, 4);
    }
    if (store_mask)
        cg_intrinsic(c, "llvm.masked.store", over, 2, (LLVMValueRef[]){xv, cp, align, store_mask}, 4);
    else
        LLVMSetAlignment(LLVMBuildStore(c->b, xv, cp), 4);
}

/* The first n lanes of W. */
static LLVMValueRef lanes_below(Cg *c, int W, int64_t n) {
    LLVMValueRef bits[16];
    for (int t = 0; t < W; t++) bits[t] = LLVMConstInt(c->t_i1, t < n, 0);
    return LLVMConstVector(bits, (unsigned)W);
}

/* im2col for small planes (see above): rows (ch, kernel offset) in
 * order, each as whole vectors of its nb*P columns. */
static void plane_patches(Cg *c, const ConvShape *s, const Plane *pl, const Value *x, LLVMValueRef n0, int64_t nb,
                          LLVMValueRef g, LLVMValueRef cols) {
    const Win *w = &s->w;
    int r = w->nsp, W = pl->W;
    int64_t Cpg = s->C / s->G, P = w->out_sz;
    Nest ns = {.n = 0};
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg)), row = ch, k[MAX_RANK];
    for (int j = 0; j < r; j++) {
        k[j] = nest_for(c, &ns, cg_i64(c, w->k[j]));
        row = cg_mad(c, row, w->k[j], k[j]);
    }
    LLVMValueRef xi = cg_mul(c, cg_add(c, cg_mul(c, n0, s->C), cg_mad(c, g, Cpg, ch)), w->in_sz);
    LLVMValueRef xb = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, x), &xi, 1, "");
    LLVMValueRef rowp = fptr(c, cols, cg_mul(c, row, nb * P));
    if (pl->spans) { /* every vector of the row: W/P samples, one pattern */
        int64_t per = W / P, whole = nb / per, rest = nb % per;
        LLVMValueRef at, mask;
        plane_lanes(c, w, pl, 0, k, &at, &mask);
        for (int part = 0; part < 2; part++) {
            int64_t count = part ? (rest > 0) : whole;
            if (count == 0) continue;
            CgLoop l;
            LLVMValueRef v = cg_add(c, cg_i64(c, part ? whole : 0), cg_for(c, &l, cg_i64(c, count)));
            LLVMValueRef xv = fptr(c, xb, cg_mul(c, v, per * pl->sample));
            LLVMValueRef tail = part ? lanes_below(c, W, rest * P) : NULL;
            LLVMValueRef m = tail ? LLVMBuildAnd(c->b, mask, tail, "") : mask;
            plane_vector(c, pl, xv, fptr(c, rowp, cg_mul(c, v, W)), at, m, tail);
            cg_for_end(c, &l);
        }
    } else { /* each sample's P positions in vecs vectors */
        LLVMValueRef at[8], mask[8];
        for (int64_t v = 0; v < pl->vecs; v++) plane_lanes(c, w, pl, v, k, &at[v], &mask[v]);
        CgLoop l;
        LLVMValueRef nl = cg_for(c, &l, cg_i64(c, nb));
        LLVMValueRef xv = fptr(c, xb, cg_mul(c, nl, pl->sample)), cp = fptr(c, rowp, cg_mul(c, nl, P));
        for (int64_t v = 0; v < pl->vecs; v++) {
            LLVMValueRef tail = (v + 1) * W > P ? lanes_below(c, W, P - v * W) : NULL;
            plane_vector(c, pl, xv, fptr(c, cp, cg_i64(c, v * W)), at[v], mask[v], tail);
        }
        cg_for_end(c, &l);
    }
    nest_close(c, &ns);
}

/* Walks the patch matrix of samples [n0, n0+nb) of group g of the
 * input-shaped x: element (ch*ksz + kernel offset, nl*P + p) of cols is
 * x[n0+nl, g*Cpg+ch] at the input position output p reads through that
 * offset.  Gathering (im2col) copies x into cols, writing zeros where the
 * window reads padding; scattering (col2im) adds cols into x.  Each row
 * of the matrix is walked as runs along the last output dim, whose valid
 * range is computed once per run, so the inner loops test nothing and run
 * contiguously at stride 1. */
static void patch_walk(Cg *c, const ConvShape *s, const Value *x, LLVMValueRef n0, int64_t nb, LLVMValueRef g,
                       LLVMValueRef cols, bool scatter) {
    Plane pl;
    if (plane_walk(s, nb, scatter, &pl)) {
        plane_patches(c, s, &pl, x, n0, nb, g, cols);
        return;
    }
    const Win *w = &s->w;
    int r = w->nsp;
    int64_t Cpg = s->C / s->G, P = w->out_sz, is[MAX_RANK], os[MAX_RANK];
    strides_of(w->in, r, is);
    strides_of(w->out, r, os);
    Nest ns = {.n = 0};
    LLVMValueRef nl = nest_for(c, &ns, cg_i64(c, nb)), ch = nest_for(c, &ns, cg_i64(c, Cpg));
    LLVMValueRef xi = cg_mul(c, cg_add(c, cg_mul(c, cg_add(c, n0, nl), s->C), cg_mad(c, g, Cpg, ch)), w->in_sz);
    LLVMValueRef row = ch, k[MAX_RANK];
    for (int j = 0; j < r; j++) {
        k[j] = nest_for(c, &ns, cg_i64(c, w->k[j]));
        row = cg_mad(c, row, w->k[j], k[j]);
    }
    LLVMValueRef ci = cg_add(c, cg_mul(c, row, nb * P), cg_mul(c, nl, P));
    LLVMValueRef inside = LLVMConstInt(c->t_i1, 1, 0);
    for (int j = 0; j < r - 1; j++) {
        LLVMValueRef o = nest_for(c, &ns, cg_i64(c, w->out[j])), ip = in_pos(c, w, j, o, k[j]);
        LLVMValueRef in_j = LLVMBuildAnd(c->b, LLVMBuildICmp(c->b, LLVMIntSGE, ip, cg_i64(c, 0), ""),
                                         LLVMBuildICmp(c->b, LLVMIntSLT, ip, cg_i64(c, w->in[j]), ""), "");
        inside = LLVMBuildAnd(c->b, inside, in_j, "");
        xi = cg_add(c, xi, cg_mul(c, ip, is[j]));
        ci = cg_add(c, ci, cg_mul(c, o, os[j]));
    }
    int j = r - 1;
    int64_t last = w->out[j];
    LLVMValueRef lo, hi;
    output_range(c, w, j, k[j], &lo, &hi);
    /* a run whose outer position reads padding is all padding */
    lo = LLVMBuildSelect(c->b, inside, lo, cg_i64(c, 0), "");
    hi = imax(c, LLVMBuildSelect(c->b, inside, hi, cg_i64(c, 0), ""), lo);
    xi = cg_add(c, xi, affine(c, -w->pb[j], k[j], w->d[j]));
    LLVMValueRef base = fptr(c, cols, ci);
    if (w->s[j] == 1 || (!scatter && (last + cg_vector_floats()) * w->s[j] < INT32_MAX)) {
        /* vectors, padding masked off: x's run is contiguous at stride 1,
         * gathered at other strides (col2im keeps the scalar loop there,
         * its adds being read-modify-writes of x, and so does a run too
         * long for 32-bit offsets) */
        LLVMValueRef xo = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, x), &xi, 1, "");
        vector_run(c, xo, base, lo, hi, last, w->s[j], scatter);
        nest_close(c, &ns);
        return;
    }
    if (!scatter) LLVMBuildMemSet(c->b, base, LLVMConstInt(c->t_i8, 0, 0), cg_mul(c, lo, 4), 4);
    CgLoop l;
    LLVMValueRef o = for_range(c, &l, lo, hi);
    LLVMValueRef xo = cg_add(c, xi, cg_mul(c, o, w->s[j])), p = fptr(c, base, o);
    if (scatter)
        add_to(c, x, xo, LLVMBuildLoad2(c->b, c->t_f32, p, ""));
    else
        LLVMBuildStore(c->b, cg_load(c, x, xo), p);
    cg_for_end(c, &l);
    if (!scatter)
        LLVMBuildMemSet(c->b, fptr(c, base, hi), LLVMConstInt(c->t_i8, 0, 0),
                        cg_mul(c, LLVMBuildNSWSub(c->b, cg_i64(c, last), hi, ""), 4), 4);
    nest_close(c, &ns);
}

/* ---- blocks ---- */

typedef struct Block {
    const ConvShape *s;
    LLVMValueRef n0, g; /* first sample, group */
    int64_t nb, cols;   /* samples, product columns (nb * P) */
    bool direct;        /* one sample per block: rows read and written in place */
    LLVMValueRef wp;    /* the filters, M x K (NULL where the kernel reads none) */
    LLVMValueRef blk;   /* the block's index */
    /* With the blocks on several threads (see "threads" below): this
     * thread's slice of each scratch area, out of `slots`; NULL and 1 on
     * one thread. */
    LLVMValueRef slot;
    int slots;
} Block;

/* The block's scratch area `name`, a matrix of `rows` x the block's
 * columns: on several threads a slice of its own per thread, sized for a
 * full block (the shorter last block must not reach into the next
 * thread's slice) and a multiple of 64 bytes, so that no two threads
 * write one cache line. */
static LLVMValueRef block_area(Cg *c, const Block *b, const char *name, int64_t rows) {
    if (b->slots <= 1) return area(c, name, rows * b->cols);
    int64_t slice = (rows * block_of(b->s) * b->s->w.out_sz + 15) / 16 * 16;
    return fptr(c, cg_scratch(c, name, slice * b->slots), cg_mul(c, b->slot, slice));
}

/* The block's product: on a thread of the kernel's own it must not split
 * further, and packs into the thread's slice. */
static void block_gemm(Cg *c, const Block *b, const CgGemm *gm, LLVMValueRef a, LLVMValueRef x, LLVMValueRef y) {
    if (b->slots > 1)
        cg_gemm_in_slot(c, gm, a, x, y, b->slot, b->slots);
    else
        cg_gemm(c, gm, a, x, y);
}

/* Copies the rows of output channels [g*Mpg, (g+1)*Mpg) of the
 * output-shaped v for the block's samples between v and the scratch
 * matrix rows (Mpg x cols), in either direction. */
static void regroup(Cg *c, const Block *b, const Value *v, LLVMValueRef rows, bool into_v) {
    int64_t P = b->s->w.out_sz, Mpg = mpg(b->s);
    Nest ns = {.n = 0};
    LLVMValueRef m = nest_for(c, &ns, cg_i64(c, Mpg)), nl = nest_for(c, &ns, cg_i64(c, b->nb));
    LLVMValueRef vi = cg_mul(c, cg_add(c, cg_mul(c, cg_add(c, b->n0, nl), b->s->M), cg_mad(c, b->g, Mpg, m)), P);
    LLVMValueRef vp = fptr(c, cg_buf(c, v), vi), rp = fptr(c, rows, cg_add(c, cg_mul(c, m, b->cols), cg_mul(c, nl, P)));
    if (into_v)
        LLVMBuildMemCpy(c->b, vp, 4, rp, 4, cg_i64(c, P * 4));
    else
        LLVMBuildMemCpy(c->b, rp, 4, vp, 4, cg_i64(c, P * 4));
    nest_close(c, &ns);
}

/* The block's rows of dY as a matrix: in place, or regrouped; *ld gets
 * its row stride. */
static LLVMValueRef dy_rows(Cg *c, const Block *b, const Value *dY, int64_t *ld) {
    int64_t P = b->s->w.out_sz, Mpg = mpg(b->s);
    if (b->direct) {
        *ld = P;
        return fptr(c, cg_buf(c, dY), cg_mul(c, cg_mad(c, b->n0, b->s->M, cg_mul(c, b->g, Mpg)), P));
    }
    LLVMValueRef rows = block_area(c, b, ROWS_AREA, Mpg);
    regroup(c, b, dY, rows, false);
    *ld = b->cols;
    return rows;
}

/* A pointwise convolution (1x1, stride 1, no padding: ops_nn.c flattens
 * its planes to one run) has the image itself as its patch matrix. */
static bool pointwise(const ConvShape *s) {
    const Win *w = &s->w;
    return w->nsp == 1 && w->k[0] == 1 && w->s[0] == 1 && w->pb[0] == 0 && w->in[0] == w->out[0];
}

/* The block's patch matrix and its row stride: the input planes of one
 * sample in place for a pointwise convolution, else gathered into the
 * scratch matrix. */
static LLVMValueRef patches(Cg *c, const Block *b, const Value *X, int64_t *ld) {
    int64_t Cpg = b->s->C / b->s->G;
    if (b->direct && pointwise(b->s)) {
        *ld = b->s->w.in_sz;
        return fptr(c, cg_buf(c, X), cg_mul(c, cg_mad(c, b->n0, b->s->C, cg_mul(c, b->g, Cpg)), b->s->w.in_sz));
    }
    LLVMValueRef cols = block_area(c, b, COL_AREA, k_dim(b->s));
    patch_walk(c, b->s, X, b->n0, b->nb, b->g, cols, false);
    *ld = b->cols;
    return cols;
}

/* Group g's Mpg x K rows of a filter-shaped matrix at base. */
static LLVMValueRef w_group(Cg *c, const Block *b, LLVMValueRef base) {
    return fptr(c, base, cg_mul(c, b->g, mpg(b->s) * k_dim(b->s)));
}

typedef void (*BlockFn)(Cg *c, const Block *b, const Value *const *v);

/* Calls fn for every block of samples and every group on one thread: a
 * loop over the full blocks, then the last, shorter block when N is not a
 * multiple.  wp: the filters the blocks read; epi (or NULL) runs after
 * each block's groups, when the block's samples are complete. */
static void blocks_serial(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, LLVMValueRef wp,
                          const CgEpilogue *epi) {
    int64_t nb = block_of(s), full = s->N / nb, rest = s->N % nb;
    for (int part = 0; part < 2; part++) {
        int64_t count = part ? (rest > 0) : full, size = part ? rest : nb;
        if (count == 0) continue;
        CgLoop li, lg;
        LLVMValueRef blk = cg_add(c, cg_for(c, &li, cg_i64(c, count)), cg_i64(c, part ? full : 0));
        LLVMValueRef n0 = cg_mul(c, blk, nb);
        Block b = {s, n0, cg_for(c, &lg, cg_i64(c, s->G)), size, size * s->w.out_sz, nb == 1, wp, blk, NULL, 1};
        fn(c, &b, v);
        cg_for_end(c, &lg);
        if (epi) epi->fn(c, epi->ctx, n0, size);
        cg_for_end(c, &li);
    }
}

/* ---- threads ----
 *
 * With --threads T a kernel with enough work deals its items, the (block,
 * group) pairs in the one-thread order, out to the threads in contiguous
 * runs: thread t of T' = min(T, items) takes items [t*I/T', (t+1)*I/T').
 * One call of the pool then covers the whole kernel, patch copies
 * included, where splitting each block's product would wake the threads
 * once per block for products too small to share.  Each thread has its
 * own slice of every scratch area (patches, rows, packing).  An item
 * computes exactly what it computes on one thread: the forward pass and
 * the input gradient write disjoint samples of Y and dX, and the weight
 * gradient keeps each block's float32 part apart and adds the parts into
 * the float64 sums in block order once every thread is done, the order
 * the one-thread kernel adds them in.  So the bits do not depend on T. */

/* The weight gradient's parts (blocks x filter elements) take at most
 * this many floats of scratch; a kernel that needs more stays on one
 * thread, where the blocks' products may still be split. */
enum { PARTS_MAX_FLOATS = 1 << 24 };

/* Whether a kernel's blocks run on the plan's threads: its multiply-adds
 * reach the threshold of a split product (cg_gemm.h), and it has two
 * items or more to deal out. */
static bool blocks_split(Cg *c, const ConvShape *s) {
    double macs = (double)s->N * (double)s->w.out_sz * (double)s->M * (double)k_dim(s);
    return cg_threads(c) > 1 && n_blocks(s) * s->G >= 2 && macs >= (double)cg_gemm_par_volume();
}

/* Items [lo, hi) with `slots` slices of scratch, this thread's `slot`:
 * the ones among the full blocks, then the ones of the shorter last
 * block. */
static void blocks_range(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, LLVMValueRef wp,
                         const CgEpilogue *epi, LLVMValueRef lo, LLVMValueRef hi, LLVMValueRef slot, int slots) {
    int64_t nb = block_of(s), full = s->N / nb, rest = s->N % nb, G = s->G;
    for (int part = 0; part < 2; part++) {
        int64_t size = part ? rest : nb, first = part ? full * G : 0, last = part ? (full + 1) * G : full * G;
        if (size == 0 || last == first) continue;
        LLVMValueRef a = imax(c, lo, cg_i64(c, first)), z = imin(c, hi, cg_i64(c, last));
        CgLoop l;
        LLVMValueRef i = for_range(c, &l, a, z);
        LLVMValueRef blk = LLVMBuildUDiv(c->b, i, cg_i64(c, G), ""), g = LLVMBuildURem(c->b, i, cg_i64(c, G), "");
        Block b = {s, cg_mul(c, blk, nb), g, size, size * s->w.out_sz, nb == 1, wp, blk, slot, slots};
        fn(c, &b, v);
        if (epi) epi->fn(c, epi->ctx, b.n0, size); /* one group: the item is the whole block */
        cg_for_end(c, &l);
    }
}

/* task(ctx, t, T): thread t's items.  ctx holds the kernel's buffers and
 * then wp; while the task is built, the kernel's buffers (c->args) are
 * the task's loads of them. */
static LLVMValueRef blocks_task(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, bool has_wp,
                                const CgEpilogue *epi) {
    int n = c->cur->n_bufs, slots = cg_threads(c);
    int64_t items = n_blocks(s) * s->G;
    if (items < slots) slots = (int)items;
    char name[300];
    snprintf(name, sizeof name, "%s.blocks", LLVMGetValueName(c->cur->fn));
    LLVMTypeRef ps[3] = {c->t_ptr, c->t_i64, c->t_i64};
    LLVMValueRef task = LLVMAddFunction(c->mod, name, LLVMFunctionType(c->t_void, ps, 3, 0));
    LLVMSetLinkage(task, LLVMInternalLinkage);
    LLVMAddAttributeAtIndex(task, LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(c->ctx, LLVMGetEnumAttributeKindForName("nounwind", 8), 0));
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c->ctx, task, "entry");
    LLVMBasicBlockRef work = LLVMAppendBasicBlockInContext(c->ctx, task, "work");
    LLVMBasicBlockRef idle = LLVMAppendBasicBlockInContext(c->ctx, task, "idle");
    LLVMPositionBuilderAtEnd(c->b, entry);
    LLVMValueRef ctx = LLVMGetParam(task, 0), t = LLVMGetParam(task, 1), T = LLVMGetParam(task, 2);
    LLVMValueRef saved[CG_MAX_BUFS], ptrs[CG_MAX_BUFS + 1];
    for (int i = 0; i <= n; i++) {
        LLVMValueRef idx = cg_i64(c, i);
        ptrs[i] = LLVMBuildLoad2(c->b, c->t_ptr, LLVMBuildInBoundsGEP2(c->b, c->t_ptr, ctx, &idx, 1, ""), "");
    }
    memcpy(saved, c->args, (size_t)n * sizeof *saved);
    memcpy(c->args, ptrs, (size_t)n * sizeof *ptrs);
    /* a pool of fewer threads than the plan's (a JIT run without
     * workers) deals the same items out in fewer runs */
    LLVMValueRef parts = imin(c, T, cg_i64(c, slots));
    LLVMBuildCondBr(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, t, parts, ""), work, idle);
    LLVMPositionBuilderAtEnd(c->b, idle);
    LLVMBuildRetVoid(c->b);
    LLVMPositionBuilderAtEnd(c->b, work);
    LLVMValueRef lo = LLVMBuildSDiv(c->b, cg_mul(c, t, items), parts, "");
    LLVMValueRef hi = LLVMBuildSDiv(c->b, cg_mul(c, cg_add(c, t, cg_i64(c, 1)), items), parts, "");
    blocks_range(c, s, fn, v, has_wp ? ptrs[n] : NULL, epi, lo, hi, t, slots);
    LLVMBuildRetVoid(c->b);
    memcpy(c->args, saved, (size_t)n * sizeof *saved);
    return task;
}

/* Runs fn over every block of samples and group, on the plan's threads
 * when the kernel has the work for them and `may_split`; returns whether
 * it split them.  epi (or NULL) runs after each block is complete: on the
 * block's thread when the convolution has one group, and otherwise the
 * blocks stay on one thread (a block's groups may fall to two). */
static bool for_blocks(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, LLVMValueRef wp, bool may_split,
                       const CgEpilogue *epi) {
    if (!may_split || !blocks_split(c, s) || (epi && s->G > 1)) {
        blocks_serial(c, s, fn, v, wp, epi);
        return false;
    }
    int n = c->cur->n_bufs;
    LLVMValueRef ctx = cg_alloca(c, LLVMArrayType(c->t_ptr, (unsigned)n + 1));
    for (int i = 0; i <= n; i++) {
        LLVMValueRef idx = cg_i64(c, i), p = i < n ? c->args[i] : wp ? wp : LLVMConstNull(c->t_ptr);
        LLVMBuildStore(c->b, p, LLVMBuildInBoundsGEP2(c->b, c->t_ptr, ctx, &idx, 1, ""));
    }
    LLVMBasicBlockRef resume = LLVMGetInsertBlock(c->b);
    LLVMValueRef task = blocks_task(c, s, fn, v, wp != NULL, epi);
    LLVMPositionBuilderAtEnd(c->b, resume);
    cg_parallel(c, task, ctx);
    return true;
}

/* ---- the three kernels ---- */

/* v: X, B, Y (the filters are b->wp) */
static void forward_block(Cg *c, const Block *b, const Value *const *v) {
    int64_t K = k_dim(b->s), Mpg = mpg(b->s), P = b->s->w.out_sz, ld;
    LLVMValueRef cols = patches(c, b, v[0], &ld);
    CgGemm gm = {.M = Mpg, .N = b->cols, .K = K, .a_si = K, .a_sj = 1, .b_si = ld, .b_sj = 1, .alpha = 1};
    if (b->direct) { /* the product adds to the bias, or writes Y outright */
        gm.ldy = P;
        gm.overwrite = !v[1];
        LLVMValueRef y = fptr(c, cg_buf(c, v[2]), cg_mul(c, cg_mad(c, b->n0, b->s->M, cg_mul(c, b->g, Mpg)), P));
        if (v[1]) {
            Nest ns = {.n = 0};
            LLVMValueRef m = nest_for(c, &ns, cg_i64(c, Mpg));
            LLVMValueRef init = cg_load(c, v[1], cg_mad(c, b->g, Mpg, m));
            LLVMValueRef t = nest_for(c, &ns, cg_i64(c, P));
            LLVMBuildStore(c->b, init, fptr(c, y, cg_mad(c, m, P, t)));
            nest_close(c, &ns);
        }
        block_gemm(c, b, &gm, w_group(c, b, b->wp), cols, y);
        return;
    }
    LLVMValueRef rows = block_area(c, b, ROWS_AREA, Mpg);
    CgLoop lm, lt;
    LLVMValueRef m = cg_for(c, &lm, cg_i64(c, Mpg));
    LLVMValueRef init = v[1] ? cg_load(c, v[1], cg_mad(c, b->g, Mpg, m)) : cg_f32(c, 0);
    LLVMValueRef t = cg_for(c, &lt, cg_i64(c, b->cols));
    LLVMBuildStore(c->b, init, fptr(c, rows, cg_mad(c, m, b->cols, t)));
    cg_for_end(c, &lt);
    cg_for_end(c, &lm);
    gm.ldy = b->cols;
    block_gemm(c, b, &gm, w_group(c, b, b->wp), cols, rows);
    regroup(c, b, v[2], rows, true);
}

/* The forward pass with the filters at wp (W's buffer, or the flipped
 * filters of an input gradient). */
static void forward_with(Cg *c, const ConvShape *s, const Value *X, LLVMValueRef wp, const Value *B, const Value *Y,
                         const CgEpilogue *epi) {
    const Value *v[3] = {X, B, Y};
    for_blocks(c, s, forward_block, v, wp, true, epi);
}

void conv_gemm_forward(Cg *c, const ConvShape *s, const Value *X, const Value *W, const Value *B, const Value *Y,
                       const CgEpilogue *epi) {
    forward_with(c, s, X, cg_buf(c, W), B, Y, epi);
}

/* v: dY, W, dX */
static void grad_input_block(Cg *c, const Block *b, const Value *const *v) {
    int64_t K = k_dim(b->s), Mpg = mpg(b->s), ld;
    LLVMValueRef dy = dy_rows(c, b, v[0], &ld);
    CgGemm gm = {.M = K, .N = b->cols, .K = Mpg, .a_si = 1, .a_sj = K, .b_si = ld, .b_sj = 1, .ldy = b->cols,
                 .alpha = 1};
    if (b->direct && pointwise(b->s)) { /* the product lands on dX's planes (zeroed) as is */
        gm.ldy = b->s->w.in_sz;
        int64_t Cpg = b->s->C / b->s->G;
        LLVMValueRef dx = fptr(c, cg_buf(c, v[2]), cg_mul(c, cg_mad(c, b->n0, b->s->C, cg_mul(c, b->g, Cpg)), gm.ldy));
        block_gemm(c, b, &gm, w_group(c, b, b->wp), dy, dx);
        return;
    }
    LLVMValueRef cols = block_area(c, b, COL_AREA, K);
    gm.overwrite = true;
    block_gemm(c, b, &gm, w_group(c, b, b->wp), dy, cols);
    patch_walk(c, b->s, v[2], b->n0, b->nb, b->g, cols, true);
}

/* At stride 1 the input gradient is a convolution of dY (padded by
 * d*(k-1) - pb before and d*(k-1) - pe after) with the filters flipped in
 * space and transposed to [C, M/G]: a forward pass whose product writes dX
 * directly, with nothing to scatter back.  False (and *t untouched) when
 * the convolution has another stride or pads beyond the window. */
static bool as_forward(const ConvShape *s, ConvShape *t) {
    const Win *w = &s->w;
    ConvShape f = {*w, s->N, s->M, s->C, s->G};
    for (int j = 0; j < w->nsp; j++) {
        int64_t reach = w->d[j] * (w->k[j] - 1);
        if (w->s[j] != 1 || w->pb[j] > reach || w->pe[j] > reach) return false;
        f.w.in[j] = w->out[j];
        f.w.out[j] = w->in[j];
        f.w.pb[j] = reach - w->pb[j];
        f.w.pe[j] = reach - w->pe[j];
    }
    f.w.in_sz = w->out_sz;
    f.w.out_sz = w->in_sz;
    *t = f;
    return true;
}

/* Wt[g][c][m][ksz-1-kf] = W[g*Mpg + m][c][kf] into a scratch area:
 * reversing the flat kernel index flips every spatial dim. */
static LLVMValueRef flipped_filters(Cg *c, const ConvShape *s, const Value *W) {
    int64_t Cpg = s->C / s->G, Mpg = mpg(s), ks = s->w.k_sz;
    LLVMValueRef wt = area(c, WT_AREA, value_numel(W));
    Nest ns = {.n = 0};
    LLVMValueRef g = nest_for(c, &ns, cg_i64(c, s->G)), m = nest_for(c, &ns, cg_i64(c, Mpg));
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg)), kf = nest_for(c, &ns, cg_i64(c, ks));
    LLVMValueRef src = cg_mad(c, cg_mad(c, cg_mad(c, g, Mpg, m), Cpg, ch), ks, kf);
    LLVMValueRef dst = cg_mad(c, cg_mad(c, cg_mad(c, g, Cpg, ch), Mpg, m), ks,
                              LLVMBuildNSWSub(c->b, cg_i64(c, ks - 1), kf, ""));
    LLVMBuildStore(c->b, cg_load(c, W, src), fptr(c, wt, dst));
    nest_close(c, &ns);
    return wt;
}

/* Below this many output positions over the batch, flipping the filters
 * (a strided copy of every weight, each call) costs more than the scatter
 * it saves: the late layers of a CNN keep col2im. */
enum { FLIP_MIN_POSITIONS = 512 };

void conv_gemm_grad_input(Cg *c, const ConvShape *s, const Value *dY, const Value *W, const Value *dX) {
    ConvShape t;
    if (s->N * s->w.out_sz >= FLIP_MIN_POSITIONS && as_forward(s, &t) && conv_gemm_applies(&t, dY, W, dX)) {
        forward_with(c, &t, dY, flipped_filters(c, s, W), NULL, dX, NULL);
        return;
    }
    zero_floats(c, cg_buf(c, dX), value_numel(dX));
    const Value *v[3] = {dY, W, dX};
    for_blocks(c, s, grad_input_block, v, cg_buf(c, W), true, NULL);
}

/* v: dY, X, dW, acc */
static void grad_weight_block(Cg *c, const Block *b, const Value *const *v) {
    int64_t K = k_dim(b->s), Mpg = mpg(b->s), ld, ldc;
    LLVMValueRef dy = dy_rows(c, b, v[0], &ld), cols = patches(c, b, v[1], &ldc);
    CgGemm gm = {.M = Mpg, .N = K, .K = b->cols, .a_si = ld, .a_sj = 1, .b_si = 1, .b_sj = ldc, .ldy = K,
                 .alpha = 1};
    if (!v[3]) {
        cg_gemm(c, &gm, dy, cols, w_group(c, b, cg_buf(c, v[2])));
        return;
    }
    /* the block's sum in float32, the sum over blocks in float64: a
     * filter followed by batch normalisation has a gradient orthogonal to
     * itself, a small difference of large terms that a float32 running
     * sum over the whole batch would round away */
    gm.overwrite = true;
    if (b->slots > 1) { /* every block's part kept apart, summed in order after all threads are done */
        int64_t E = b->s->M * K;
        LLVMValueRef parts = area(c, DW_AREA, n_blocks(b->s) * E);
        block_gemm(c, b, &gm, dy, cols, fptr(c, parts, cg_add(c, cg_mul(c, b->blk, E), cg_mul(c, b->g, Mpg * K))));
        return;
    }
    LLVMValueRef part = area(c, DW_AREA, Mpg * K);
    cg_gemm(c, &gm, dy, cols, part);
    LLVMValueRef acc = cg_buf(c, v[3]), base = cg_mul(c, b->g, Mpg * K);
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, Mpg * K)), ai = cg_add(c, base, i);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, c->t_f64, acc, &ai, 1, "");
    LLVMValueRef x = LLVMBuildFPExt(c->b, LLVMBuildLoad2(c->b, c->t_f32, fptr(c, part, i), ""), c->t_f64, "");
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f64, p, ""), x, ""), p);
    cg_for_end(c, &l);
}

/* acc += the blocks' parts, one block after the other: the order in
 * which the one-thread kernel adds each part as it is made. */
static void sum_parts(Cg *c, const ConvShape *s, const Value *acc) {
    int64_t E = s->M * k_dim(s);
    LLVMValueRef parts = area(c, DW_AREA, n_blocks(s) * E);
    Nest ns = {.n = 0};
    LLVMValueRef blk = nest_for(c, &ns, cg_i64(c, n_blocks(s))), i = nest_for(c, &ns, cg_i64(c, E));
    LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, c->t_f64, cg_buf(c, acc), &i, 1, "");
    LLVMValueRef x = LLVMBuildLoad2(c->b, c->t_f32, fptr(c, parts, cg_mad(c, blk, E, i)), "");
    x = LLVMBuildFPExt(c->b, x, c->t_f64, "");
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f64, p, ""), x, ""), p);
    nest_close(c, &ns);
}

void conv_gemm_grad_weight(Cg *c, const ConvShape *s, const Value *dY, const Value *X, const Value *dW,
                           const Value *acc) {
    int64_t E = value_numel(dW);
    zero_floats(c, cg_buf(c, acc ? acc : dW), acc ? 2 * E : E);
    const Value *v[4] = {dY, X, dW, acc};
    /* without float64 sums the blocks add into dW one after the other,
     * which no split can keep */
    if (for_blocks(c, s, grad_weight_block, v, NULL, acc && n_blocks(s) * E <= PARTS_MAX_FLOATS, NULL))
        sum_parts(c, s, acc);
    if (acc) {
        CgLoop l;
        LLVMValueRef i = cg_for(c, &l, cg_i64(c, E));
        LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, c->t_f64, cg_buf(c, acc), &i, 1, "");
        cg_store(c, dW, i, LLVMBuildFPTrunc(c->b, LLVMBuildLoad2(c->b, c->t_f64, p, ""), c->t_f32, ""));
        cg_for_end(c, &l);
    }
}

/* ---- which path ---- */

ConvPath conv_path(const ConvShape *s, const Value *x, const Value *f, const Value *y) {
    if (conv_depthwise_applies(s, x, f, y)) return CONV_DEPTHWISE;
    return conv_gemm_applies(s, x, f, y) ? CONV_PACKED : CONV_DIRECT;
}

void conv_fast_forward(Cg *c, ConvPath p, const ConvShape *s, const Value *X, const Value *W, const Value *B,
                       const Value *Y, const CgEpilogue *epi) {
    if (p == CONV_DEPTHWISE)
        conv_depthwise_forward(c, s, X, W, B, Y, epi);
    else
        conv_gemm_forward(c, s, X, W, B, Y, epi);
}

void conv_fast_grad_input(Cg *c, ConvPath p, const ConvShape *s, const Value *dY, const Value *W, const Value *dX) {
    if (p == CONV_DEPTHWISE)
        conv_depthwise_grad_input(c, s, dY, W, dX);
    else
        conv_gemm_grad_input(c, s, dY, W, dX);
}

void conv_fast_grad_weight(Cg *c, ConvPath p, const ConvShape *s, const Value *dY, const Value *X, const Value *dW,
                           const Value *acc) {
    if (p == CONV_DEPTHWISE)
        conv_depthwise_grad_weight(c, s, dY, X, dW, acc);
    else
        conv_gemm_grad_weight(c, s, dY, X, dW, acc);
}
