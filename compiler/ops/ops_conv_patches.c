/* ops_conv_patches.c - the patch matrices of the packed convolutions
 * (ops_conv_gemm.c): im2col, gathering a block of samples' patches from
 * the image into the scratch matrix, and col2im, adding them back.
 *
 * Row (c, kernel offset) of the matrix holds, for every column (sample,
 * output position), the input element that output reads through that
 * offset, zero where it reads padding.  Rows are walked as runs along the
 * last output dim, in vectors whose masks cover the padding; planes
 * narrower than a vector are walked a whole plane (or several samples) per
 * vector ("small planes" below). */
#include <stdint.h>
#include <stdlib.h>

#include "../codegen/cg_gemm.h"
#include "ops_cg.h"
#include "ops_conv.h"

/* x splatted over the lanes of a vector of w elements. */
static LLVMValueRef splat(Cg *c, LLVMValueRef x, int w) {
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(x), (unsigned)w);
    LLVMValueRef v = LLVMBuildInsertElement(c->b, LLVMGetUndef(vt), x, LLVMConstInt(c->t_i32, 0, 0), "");
    return LLVMBuildShuffleVector(c->b, v, LLVMGetUndef(vt), LLVMConstNull(LLVMVectorType(c->t_i32, (unsigned)w)),
                                  "");
}

static LLVMValueRef i32k(Cg *c, int v) { return LLVMConstInt(c->t_i32, (unsigned long long)v, 0); }

/* Where a run of the patch matrix goes: row `row` from column `col` on.
 * With rows of ncols floats (nr = 0) that is one pointer, base; in
 * panels of nr columns over K rows, column col + o of the row lies at
 * ((col + o) / nr) * K * nr + row * nr + (col + o) % nr, and the walk
 * only stores vectors that start at whole vectors' columns, which stay
 * inside one panel (conv_patches_in_panels). */
typedef struct Dst {
    LLVMValueRef base; /* cols, or with nr = 0 the run's first element */
    LLVMValueRef row, col;
    int64_t nr, K;
} Dst;

static Dst dst_rows(Cg *c, LLVMValueRef cols, int64_t ncols, LLVMValueRef row, LLVMValueRef col, int64_t nr,
                    int64_t K) {
    if (nr) return (Dst){cols, row, col, nr, K};
    return (Dst){fptr(c, cols, cg_add(c, cg_mul(c, row, ncols), col)), NULL, NULL, 0, K};
}

/* The same run from `o` columns further on. */
static Dst dst_skip(Cg *c, const Dst *d, LLVMValueRef o) {
    Dst e = *d;
    if (d->nr)
        e.col = cg_add(c, d->col, o);
    else
        e.base = fptr(c, d->base, o);
    return e;
}

/* The element o columns into the run. */
static LLVMValueRef dst_at(Cg *c, const Dst *d, LLVMValueRef o) {
    if (!d->nr) return fptr(c, d->base, o);
    LLVMValueRef col = cg_add(c, d->col, o), nr = cg_i64(c, d->nr);
    LLVMValueRef q = LLVMBuildUDiv(c->b, col, nr, ""), r = LLVMBuildURem(c->b, col, nr, "");
    return fptr(c, d->base, cg_add(c, cg_mul(c, q, d->K * d->nr), cg_add(c, cg_mul(c, d->row, d->nr), r)));
}

/* The vector of W floats at element o0 of a run: gathered from x into
 * cols, or added from cols into x.  Lanes outside [lo, hi) are padding:
 * masked loads and stores do not touch them (so x's address may lie
 * outside its buffer there); tail, when set, masks the lanes past the
 * run's end. */
static void vector_at(Cg *c, LLVMValueRef xp, const Dst *cp, LLVMValueRef vlo, LLVMValueRef vhi, int64_t o0,
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
    LLVMValueRef xa = LLVMBuildGEP2(c->b, c->t_f32, xp, &o, 1, ""), ca = dst_at(c, cp, o);
    LLVMValueRef align = LLVMConstInt(c->t_i32, 4, 0), zero = LLVMConstNull(vt);
    LLVMValueRef xv;
    if (stride == 1) {
        xv = cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){xa, align, m, zero}, 4);
    } else if (stride <= 4) { /* gathering only: the span's floats in `stride` masked loads (only the
                               * lanes read), every stride-th kept by shuffles: the 7x7 stride-2
                               * stem of resnet18 ran its patches at twice the speed of gathers */
        LLVMTypeRef bt = LLVMVectorType(c->t_i1, (unsigned)W);
        LLVMValueRef parts[4], no = LLVMConstNull(bt);
        for (int s = 0; s < 4; s++) {
            if (s >= stride) {
                parts[s] = LLVMGetUndef(vt);
                continue;
            }
            LLVMValueRef pick[16];
            for (int i = 0; i < W; i++) {
                int e = s * W + i;
                pick[i] = i32k(c, e % stride == 0 ? e / (int)stride : W); /* W: a lane of `no` */
            }
            LLVMValueRef pm = LLVMBuildShuffleVector(c->b, m, no, LLVMConstVector(pick, (unsigned)W), "");
            LLVMValueRef at = cg_add(c, cg_mul(c, o, stride), cg_i64(c, s * W));
            LLVMValueRef pa = LLVMBuildGEP2(c->b, c->t_f32, xp, &at, 1, "");
            parts[s] = cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){pa, align, pm, zero}, 4);
        }
        LLVMValueRef idx2[32], idx4[64], keep[16];
        for (int i = 0; i < 2 * W; i++) idx2[i] = i32k(c, i);
        for (int i = 0; i < 4 * W; i++) idx4[i] = i32k(c, i);
        for (int i = 0; i < W; i++) keep[i] = i32k(c, i * (int)stride);
        LLVMValueRef lo2 = LLVMBuildShuffleVector(c->b, parts[0], parts[1], LLVMConstVector(idx2, 2u * W), "");
        LLVMValueRef hi2 = LLVMBuildShuffleVector(c->b, parts[2], parts[3], LLVMConstVector(idx2, 2u * W), "");
        LLVMValueRef all = LLVMBuildShuffleVector(c->b, lo2, hi2, LLVMConstVector(idx4, 4u * W), "");
        xv = LLVMBuildShuffleVector(c->b, all, LLVMGetUndef(LLVMTypeOf(all)), LLVMConstVector(keep, (unsigned)W), "");
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
static void vector_run(Cg *c, LLVMValueRef xp, const Dst *cp, LLVMValueRef lo, LLVMValueRef hi, int64_t last,
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

/* Where a patch row reads: x itself, or the block's phase planes
 * (ops_conv_phases.c).  Channel ch of sample nl of the block starts at
 * first + nl*sample + ch*chan; kernel offset k reads positions as the
 * window w says at offsets kq (k itself, or its shift in the phase
 * planes), from off further on (its phase plane). */
typedef struct Src {
    LLVMValueRef buf, first;
    int64_t chan, sample;
    const Win *w;
    const ConvShape *s;
    const ConvPhases *ph;
} Src;

static void src_offsets(Cg *c, const Src *x, const LLVMValueRef *k, LLVMValueRef *kq, LLVMValueRef *off) {
    if (x->ph) {
        conv_phase_offset(c, x->s, x->ph, k, kq, off);
        return;
    }
    for (int j = 0; j < x->w->nsp; j++) kq[j] = k[j];
    *off = cg_i64(c, 0);
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
static bool plane_walk(const ConvShape *s, const Win *w, int64_t sample, int64_t nb, Plane *pl) {
    int W = cg_vector_floats();
    int r = w->nsp;
    int64_t P = w->out_sz;
    bool contig = true;
    for (int j = 0; j < r; j++) contig &= w->s[j] == 1 && (j == 0 || w->in[j] == w->out[j]);
    /* 1x1 planes (2x1 too): a gather of 16 samples beats 16 one-lane
     * loads at any stride (resnet18's 512-channel layer: forward 148 ->
     * 163 GFLOP/s, weight gradient 56 -> 74; at 2x2 the runs stay ahead) */
    bool tiny = 8 * P <= W && W % P == 0;
    if (tiny) contig = false;
    /* contiguous 2x2 planes ran 10% slower than their runs of 2 */
    if ((!contig && !tiny && w->s[r - 1] == 1) || (contig && 2 * P < W))
        return false;
    if (w->out[r - 1] >= W || P > 8 * W || nb * sample >= INT32_MAX) return false;
    pl->W = W;
    pl->contig = contig;
    pl->spans = !contig && W % P == 0;
    pl->vecs = pl->spans ? 1 : (P + W - 1) / W;
    pl->sample = sample;
    (void)s;
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
static void plane_vector(Cg *c, const Plane *pl, LLVMValueRef xb, const Dst *d, LLVMValueRef at,
                         LLVMValueRef mask, LLVMValueRef store_mask) {
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, (unsigned)pl->W), over[2] = {vt, c->t_ptr};
    LLVMValueRef align = LLVMConstInt(c->t_i32, 4, 0), zero = LLVMConstNull(vt);
    LLVMValueRef ps = LLVMBuildGEP2(c->b, c->t_f32, xb, &at, 1, ""), xv, cp = dst_at(c, d, cg_i64(c, 0));
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
static void plane_patches(Cg *c, const ConvShape *s, const Plane *pl, const Src *x, int64_t nb, LLVMValueRef cols,
                          int64_t nr) {
    const Win *w = x->w;
    int r = w->nsp, W = pl->W;
    int64_t Cpg = s->C / s->G, P = w->out_sz;
    Nest ns = {.n = 0};
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg)), row = ch, k[MAX_RANK];
    for (int j = 0; j < r; j++) {
        k[j] = nest_for(c, &ns, cg_i64(c, w->k[j]));
        row = cg_mad(c, row, w->k[j], k[j]);
    }
    LLVMValueRef kq[MAX_RANK], off;
    src_offsets(c, x, k, kq, &off);
    LLVMValueRef xi = cg_add(c, cg_add(c, x->first, cg_mul(c, ch, x->chan)), off);
    LLVMValueRef xb = LLVMBuildGEP2(c->b, c->t_f32, x->buf, &xi, 1, "");
    Dst rowp = dst_rows(c, cols, nb * P, row, cg_i64(c, 0), nr, Cpg * w->k_sz);
    if (pl->spans) { /* every vector of the row: W/P samples, one pattern */
        int64_t per = W / P, whole = nb / per, rest = nb % per;
        LLVMValueRef at, mask;
        plane_lanes(c, w, pl, 0, kq, &at, &mask);
        for (int part = 0; part < 2; part++) {
            int64_t count = part ? (rest > 0) : whole;
            if (count == 0) continue;
            CgLoop l;
            LLVMValueRef v = cg_add(c, cg_i64(c, part ? whole : 0), cg_for(c, &l, cg_i64(c, count)));
            LLVMValueRef xv = fptr(c, xb, cg_mul(c, v, per * pl->sample));
            LLVMValueRef tail = part ? lanes_below(c, W, rest * P) : NULL;
            LLVMValueRef m = tail ? LLVMBuildAnd(c->b, mask, tail, "") : mask;
            Dst d = dst_skip(c, &rowp, cg_mul(c, v, W));
            plane_vector(c, pl, xv, &d, at, m, tail);
            cg_for_end(c, &l);
        }
    } else { /* each sample's P positions in vecs vectors */
        LLVMValueRef at[8], mask[8];
        for (int64_t v = 0; v < pl->vecs; v++) plane_lanes(c, w, pl, v, kq, &at[v], &mask[v]);
        CgLoop l;
        LLVMValueRef nl = cg_for(c, &l, cg_i64(c, nb));
        LLVMValueRef xv = fptr(c, xb, cg_mul(c, nl, pl->sample));
        Dst cp = dst_skip(c, &rowp, cg_mul(c, nl, P));
        for (int64_t v = 0; v < pl->vecs; v++) {
            LLVMValueRef tail = (v + 1) * W > P ? lanes_below(c, W, P - v * W) : NULL;
            Dst d = dst_skip(c, &cp, cg_i64(c, v * W));
            plane_vector(c, pl, xv, &d, at[v], mask[v], tail);
        }
        cg_for_end(c, &l);
    }
    nest_close(c, &ns);
}

/* The walk of ops_conv.h: small planes as above; otherwise each row of
 * the matrix as runs along the last output dim, whose valid range is
 * computed once per run, so the inner loops test nothing and run
 * contiguously at stride 1. */
/* The general walk stores vectors (rather than one float at a time)
 * along its runs: always at stride 1, at other strides while 32-bit
 * offsets reach. */
static bool runs_in_vectors(const Win *w, bool scatter) {
    int j = w->nsp - 1;
    return w->s[j] == 1 || (!scatter && (w->out[j] + cg_vector_floats()) * w->s[j] < INT32_MAX);
}

bool conv_patches_in_panels(const ConvShape *s, int64_t nb, int64_t nr) {
    const Win *w = &s->w;
    int64_t W = cg_vector_floats(), P = w->out_sz, last = w->out[w->nsp - 1];
    if (nr % W || nb * s->C * w->in_sz >= INT32_MAX) return false;
    bool samples_whole = P % W == 0 || nb == 1; /* each sample starts at a whole vector */
    Plane pl;
    ConvPhases ph;
    bool phased = conv_phases_of(s, &ph);
    if (plane_walk(s, phased ? &ph.w : w, phased ? (s->C / s->G) * ph.S * ph.plane : s->C * w->in_sz, nb, &pl))
        return pl.spans || samples_whole;
    /* runs start at whole vectors: each a whole number of them, or the
     * run a whole sample */
    return runs_in_vectors(phased ? &ph.w : w, false) && (last % W == 0 || (last == P && samples_whole));
}

void conv_patch_walk(Cg *c, const ConvShape *s, const Value *x, LLVMValueRef n0, int64_t nb, LLVMValueRef g,
                     LLVMValueRef cols, bool scatter, int64_t nr, LLVMValueRef phases) {
    Plane pl;
    CLEAVE_CHECK(!nr || (!scatter && conv_patches_in_panels(s, nb, nr)), "patches in panels of %lld", (long long)nr);
    CLEAVE_CHECK(!scatter || !phases, "col2im into phase planes");
    int64_t Cpg = s->C / s->G;
    Src src = {cg_buf(c, x), cg_mul(c, cg_add(c, cg_mul(c, n0, s->C), cg_mul(c, g, Cpg)), s->w.in_sz), s->w.in_sz,
               s->C * s->w.in_sz, &s->w, s, NULL};
    ConvPhases ph;
    if (phases && conv_phases_of(s, &ph)) { /* the block's phase planes instead of x */
        conv_phase_copy(c, s, &ph, x, n0, nb, g, phases);
        src = (Src){phases, cg_i64(c, 0), ph.S * ph.plane, Cpg * ph.S * ph.plane, &ph.w, s, &ph};
    }
    if (!scatter && plane_walk(s, src.w, src.sample, nb, &pl)) {
        plane_patches(c, s, &pl, &src, nb, cols, nr);
        return;
    }
    const Win *w = src.w;
    int r = w->nsp;
    int64_t P = w->out_sz, is[MAX_RANK], os[MAX_RANK];
    strides_of(w->in, r, is);
    strides_of(w->out, r, os);
    Nest ns = {.n = 0};
    LLVMValueRef nl = nest_for(c, &ns, cg_i64(c, nb)), ch = nest_for(c, &ns, cg_i64(c, Cpg));
    LLVMValueRef row = ch, k[MAX_RANK], kq[MAX_RANK], off;
    for (int j = 0; j < r; j++) {
        k[j] = nest_for(c, &ns, cg_i64(c, w->k[j]));
        row = cg_mad(c, row, w->k[j], k[j]);
    }
    src_offsets(c, &src, k, kq, &off);
    LLVMValueRef xi = cg_add(c, cg_add(c, src.first, cg_add(c, cg_mul(c, nl, src.sample), cg_mul(c, ch, src.chan))), off);
    LLVMValueRef ci = cg_mul(c, nl, P); /* the run's first column */
    LLVMValueRef inside = LLVMConstInt(c->t_i1, 1, 0);
    for (int j = 0; j < r - 1; j++) {
        LLVMValueRef o = nest_for(c, &ns, cg_i64(c, w->out[j])), ip = in_pos(c, w, j, o, kq[j]);
        LLVMValueRef in_j = LLVMBuildAnd(c->b, LLVMBuildICmp(c->b, LLVMIntSGE, ip, cg_i64(c, 0), ""),
                                         LLVMBuildICmp(c->b, LLVMIntSLT, ip, cg_i64(c, w->in[j]), ""), "");
        inside = LLVMBuildAnd(c->b, inside, in_j, "");
        xi = cg_add(c, xi, cg_mul(c, ip, is[j]));
        ci = cg_add(c, ci, cg_mul(c, o, os[j]));
    }
    int j = r - 1;
    int64_t last = w->out[j];
    LLVMValueRef lo, hi;
    output_range(c, w, j, kq[j], &lo, &hi);
    /* a run whose outer position reads padding is all padding */
    lo = LLVMBuildSelect(c->b, inside, lo, cg_i64(c, 0), "");
    hi = imax(c, LLVMBuildSelect(c->b, inside, hi, cg_i64(c, 0), ""), lo);
    xi = cg_add(c, xi, affine(c, -w->pb[j], kq[j], w->d[j]));
    Dst run = dst_rows(c, cols, nb * P, row, ci, nr, Cpg * w->k_sz);
    if (runs_in_vectors(w, scatter)) {
        /* vectors, padding masked off: x's run is contiguous at stride 1,
         * gathered at other strides (col2im keeps the scalar loop there,
         * its adds being read-modify-writes of x, and so does a run too
         * long for 32-bit offsets) */
        LLVMValueRef xo = LLVMBuildGEP2(c->b, c->t_f32, src.buf, &xi, 1, "");
        vector_run(c, xo, &run, lo, hi, last, w->s[j], scatter);
        nest_close(c, &ns);
        return;
    }
    LLVMValueRef base = run.base;
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

