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
 * Where the planes are small against the window, some kernel offsets read
 * padding at every output position (a 3x3 window with padding 1 over a
 * 1x1 plane reads only its centre): their rows of the patch matrix are
 * all zeros, and the kernels drop them (see "taps" below).
 *
 * Every sum has a fixed order (cg_gemm's, then the blocks in order), so the
 * bits depend on the shapes alone, as everywhere else. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../codegen/cg_gemm.h"
#include "op_util.h"
#include "ops_cg.h"
#include "ops_conv.h"

/* Scratch areas (cg_scratch): the patch matrix, a block's output-channel
 * rows, one group's weight gradient before its float64 sum, the flipped
 * filters of an input gradient at stride 1 (or the kept offsets of
 * trimmed filters), and the product of one kernel offset (tap products). */
#define COL_AREA "cleave.conv.cols"
#define ROWS_AREA "cleave.conv.rows"
#define DW_AREA "cleave.conv.dw"
#define WT_AREA "cleave.conv.wt"
#define TAP_AREA "cleave.conv.tap"
#define LAST_AREA "cleave.conv.last"
#define APACK_AREA "cleave.conv.apack"
#define PHASE_AREA "cleave.conv.phases"
#define DXPH_AREA "cleave.conv.dxphases" /* a block's phase planes of dX, before they are copied onto it */
#define ZERO_AREA "cleave.conv.zero" /* a vector of zeros, never written */

/* Products at least this wide fill the micro-kernel's vectors (its tiles
 * are 48 or 64 columns wide) several times over. */
enum { MIN_COLS = 256 };

static int64_t k_dim(const ConvShape *s) { return s->C / s->G * s->w.k_sz; }
static int64_t mpg(const ConvShape *s) { return s->M / s->G; }

/* Tap products want products at least this deep (channels per group). */
enum { TAPS_MIN_CHANNELS = 32 };

/* Output positions [lo, hi) of axis j at which offset k reads inside. */
static void tap_span(const Win *w, int j, int64_t k, int64_t *lo, int64_t *hi) {
    int64_t a = w->pb[j] - k * w->d[j], z = w->in[j] - 1 + w->pb[j] - k * w->d[j], st = w->s[j];
    *lo = a <= 0 ? 0 : (a + st - 1) / st;
    *hi = z < 0 ? 0 : z / st + 1;
    if (*hi > w->out[j]) *hi = w->out[j];
    if (*lo > *hi) *lo = *hi;
}

/* Flat offset t's offset k[] along each axis. */
static void tap_offsets(const Win *w, int64_t t, int64_t *k) {
    for (int j = w->nsp - 1; j >= 0; j--) {
        k[j] = t % w->k[j];
        t /= w->k[j];
    }
}

/* Flat offset t's offset k[] along each axis and its box [lo, hi) of
 * output positions; returns the box's positions. */
static int64_t tap_box(const Win *w, int64_t t, int64_t *k, int64_t *lo, int64_t *hi) {
    int64_t n = 1;
    tap_offsets(w, t, k);
    for (int j = 0; j < w->nsp; j++) {
        tap_span(w, j, k[j], &lo[j], &hi[j]);
        n *= hi[j] - lo[j];
    }
    return n;
}

/* Whether the forward pass takes tap products ("tap products" below):
 * small planes, deep enough products, and a quarter or more of the patch
 * matrix reading padding, or a tenth at strides above 1 whose patches
 * the product path gathers lane by lane (tap products copy rows instead).
 * Strided convolutions whose patches come from phase planes
 * (ops_conv_phases.c) are read with plain loads and keep the product:
 * resnet18's 64->128 stride-2 layer at 8x8 ran at 226 GFLOP/s that way
 * against 192 in tap products (one kernel, process CPU time, best of 5,
 * 2026-12-04; before phase planes the gathers lost, 138 against 165).
 * At stride 1 and 8x8 tap products lost, 134 against 160. */
static bool taps_pay(const ConvShape *s) {
    bool strided = false;
    for (int j = 0; j < s->w.nsp; j++) strided |= s->w.s[j] > 1;
    if (s->w.out_sz >= MIN_COLS || s->C / s->G < TAPS_MIN_CHANNELS || mpg(s) < 16) return false;
    int64_t valid = 0, k[MAX_RANK], lo[MAX_RANK], hi[MAX_RANK];
    for (int64_t t = 0; t < s->w.k_sz; t++) valid += tap_box(&s->w, t, k, lo, hi);
    ConvPhases ph;
    if (strided && conv_phases_of(s, &ph)) return false;
    return (strided ? 10 * valid <= 9 * s->w.out_sz * s->w.k_sz : 4 * valid <= 3 * s->w.out_sz * s->w.k_sz);
}

/* Tap products run one product per kernel offset over a block's positions
 * where it reads inside, a fraction of the block: their blocks are larger.
 * (On the development machine, 128 channels over 4x4 planes at batch 32:
 * the forward pass at 160 GFLOP/s in blocks of 16 samples, 180 in one of
 * 32.) */
enum { TAPS_COLS = 512 };

/* Samples per block; per_tap: 0, or the threads of a kernel running tap
 * products.  Those make at least one block per thread where the batch
 * allows: their sums do not depend on the block's size (each product
 * sums one offset's channels, blocked by its own sizes alone, and the
 * offsets add in order), so the bits stay those of one thread. */
static int64_t block_of(const ConvShape *s, int per_tap) {
    int64_t P = s->w.out_sz, cols = per_tap ? TAPS_COLS : MIN_COLS, nb = (cols + P - 1) / P;
    nb = nb > s->N ? s->N : nb < 1 ? 1 : nb;
    if (per_tap > 1 && (s->N + nb - 1) / nb < per_tap) nb = (s->N + per_tap - 1) / per_tap;
    return nb;
}

static int64_t n_blocks(const ConvShape *s, int per_tap) {
    return (s->N + block_of(s, per_tap) - 1) / block_of(s, per_tap);
}

bool conv_gemm_applies(const ConvShape *s, const Value *x, const Value *f, const Value *y) {
    /* a product with fewer than 8 rows (depthwise and narrow grouped
     * convolutions) wastes most of the micro-kernel; the direct kernels
     * serve those better */
    if (s->w.out_sz < 1 || s->N < 1) return false;
    if (cg_gemm_forced() == 0 && (mpg(s) < 8 || k_dim(s) < 8)) return false;
    return cg_gemm_applies(x, f, y, mpg(s), block_of(s, 0) * s->w.out_sz, k_dim(s));
}

/* ---- pointers ---- */

static LLVMValueRef area(Cg *c, const char *name, int64_t n) { return fptr(c, cg_scratch(c, name, n), cg_i64(c, 0)); }

static void zero_floats(Cg *c, LLVMValueRef p, int64_t n) {
    LLVMBuildMemSet(c->b, p, LLVMConstInt(c->t_i8, 0, 0), cg_i64(c, n * 4), 16);
}

/* ---- taps ----
 *
 * Along spatial axis j, kernel offset k reads inside the input at some
 * output position only for k in [lo, hi]; outside that range its products
 * add zeros alone.  When some axis's range is narrower than the kernel,
 * the kernels run the convolution over the kept offsets instead: the
 * window of hi-lo+1 offsets with lo*d less padding before and (k-1-hi)*d
 * less after reads exactly the inputs the full window reads, and the
 * products lose only zero terms.  A 3x3 window with padding 1 keeps one
 * offset of nine over a 1x1 plane and four over a 2x2 plane at stride 2:
 * the last layers of a CNN on small images. */

/* Kernels with more kept offsets than this keep the whole window. */
enum { MAX_KEPT = 64 };

typedef struct Taps {
    ConvShape t;            /* the convolution over the kept offsets */
    int64_t k_full;         /* offsets of the whole window */
    int64_t kept[MAX_KEPT]; /* kept offset (flat, row-major) -> offset in the whole window */
} Taps;

/* Fills tp and returns true when some offsets read only padding and the
 * rest can stand as a window of their own. */
static bool trim_taps(const ConvShape *s, Taps *tp) {
    const Win *w = &s->w;
    Win t = *w;
    int64_t lo[MAX_RANK];
    bool narrower = false;
    for (int j = 0; j < w->nsp; j++) {
        int64_t a = w->k[j], z = -1;
        for (int64_t k = 0; k < w->k[j]; k++) {
            int64_t o0, o1;
            tap_span(w, j, k, &o0, &o1);
            if (o0 < o1) {
                a = k < a ? k : a;
                z = k;
            }
        }
        if (z < 0) return false; /* every output reads padding alone: nothing worth a special case */
        t.k[j] = z - a + 1;
        t.pb[j] = w->pb[j] - a * w->d[j];
        t.pe[j] = w->pe[j] - (w->k[j] - 1 - z) * w->d[j];
        if (t.pb[j] < 0 || t.pe[j] < 0) return false; /* dilation can leave the first kept offset past the padding */
        lo[j] = a;
        narrower |= t.k[j] < w->k[j];
    }
    t.k_sz = 1;
    for (int j = 0; j < w->nsp; j++) t.k_sz *= t.k[j];
    if (!narrower || t.k_sz > MAX_KEPT) return false;
    int64_t st[MAX_RANK];
    strides_of(w->k, w->nsp, st);
    for (int64_t f = 0; f < t.k_sz; f++) {
        int64_t rest = f, full = 0;
        for (int j = w->nsp - 1; j >= 0; j--) {
            full += (lo[j] + rest % t.k[j]) * st[j];
            rest /= t.k[j];
        }
        tp->kept[f] = full;
    }
    win_flatten_pointwise(&t);
    tp->t = *s;
    tp->t.w = t;
    tp->k_full = w->k_sz;
    return true;
}

/* Where a kernel finds the filters it reads: element (output channel m,
 * input channel c, kernel offset t) of group g at
 * g*gs + m*ms + c*cs + t'*ts, t' = t, or kt-1-t when flip (an input
 * gradient's filters, read in place); taps: the kept offsets of a trimmed
 * convolution (NULL for the whole window), which the weight gradient
 * writes back into the whole filters.  It travels with the kernel's
 * blocks, and so says as well whether they run tap products. */
struct PhaseSet;
typedef struct Layout {
    int64_t gs, ms, cs, ts;
    bool flip;
    const Taps *taps;
    int per_tap; /* the kernel runs tap products (below): the threads it may use (else 0) */
    bool packed; /* each group's filters already in the packed products' panels (gs apart; pack_filters) */
    bool last;   /* a weight gradient's patches channels-last, offset-major (grad_weight_last) */
    const struct PhaseSet *phases; /* a strided input gradient's phases (phases_block), or NULL */
} Layout;

/* The stride of k = c*kt + t in the products that take (c, t) as one
 * dimension, which only unflipped layouts with the offsets of a channel
 * adjacent allow. */
static int64_t k_stride(const Layout *lay, int64_t kt) {
    if (kt == 1) return lay->cs;
    if (lay->flip || lay->cs != kt * lay->ts) {
        fprintf(stderr, "cleave: internal error: a convolution's filters laid out for tap products only\n");
        abort();
    }
    return lay->ts;
}

/* dst[e*to + f] = src[e*from + pick[f]], or 0 where pick[f] < 0, for
 * e < rows (filter row, channel) pairs: the kept offsets of trimmed
 * filters picked out of the whole window, or spread back into it with
 * zeros between.  Vector shuffles over a vector's count of rows at a
 * time (conv_map_copy), the rows left over by one more copy; resnet18's
 * 256->512 layer at 2x2 moves 4 of 9 offsets of 1.2 M floats.  (A loop
 * of scalar copies, and a memset and scattered adds for the weight
 * gradient, held its kernels to 142 and 173 GFLOP/s.) */
static void move_taps(Cg *c, LLVMValueRef dst, LLVMValueRef src, int64_t rows, int64_t from, int64_t to,
                      const int64_t *pick) {
    int64_t R = cg_vector_floats(), rest = rows % R;
    int64_t *map = malloc(sizeof *map * (size_t)(R * to));
    CLEAVE_CHECK(map != NULL, "out of memory for a map of %lld floats", (long long)(R * to));
    for (int64_t e = 0; e < R * to; e++) map[e] = pick[e % to] < 0 ? -1 : e / to * from + pick[e % to];
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, rows / R));
    conv_map_copy(c, map, R * to, fptr(c, src, cg_mul(c, i, R * from)), R * from, fptr(c, dst, cg_mul(c, i, R * to)));
    cg_for_end(c, &l);
    if (rest)
        conv_map_copy(c, map, rest * to, fptr(c, src, cg_i64(c, (rows - rest) * from)), rest * from,
                      fptr(c, dst, cg_i64(c, (rows - rest) * to)));
    free(map);
}

/* The filters W of the convolution over tp's kept offsets: with one kept
 * offset, W itself read at a stride (no copy); else a copy of the kept
 * offsets into a scratch area. */
static LLVMValueRef kept_filters(Cg *c, const ConvShape *s, const Taps *tp, const Value *W, Layout *lay) {
    int64_t kt = tp->t.w.k_sz, rows = s->M * (s->C / s->G);
    int64_t ks = kt == 1 ? tp->k_full : kt; /* one offset: W's own strides */
    *lay = (Layout){s->M / s->G * (s->C / s->G) * ks, s->C / s->G * ks, ks, 1, false, tp};
    if (kt == 1) return fptr(c, cg_buf(c, W), cg_i64(c, tp->kept[0]));
    LLVMValueRef wk = area(c, WT_AREA, rows * kt);
    move_taps(c, wk, cg_buf(c, W), rows, tp->k_full, kt, tp->kept);
    return wk;
}

/* dst += src over `rows` (filter row, channel) pairs, src holding the
 * kept offsets of tp (the whole window when tp is NULL) and dst the whole
 * window; dst float64 (widened sums) when wide, else float32. */
static void add_filters(Cg *c, LLVMValueRef dst, bool wide, LLVMValueRef src, int64_t rows, int64_t ksz,
                        const Taps *tp) {
    int64_t kt = tp ? tp->t.w.k_sz : ksz;
    CgLoop l;
    LLVMValueRef e = cg_for(c, &l, cg_i64(c, tp ? rows : rows * ksz));
    for (int64_t f = 0; f < (tp ? kt : 1); f++) {
        LLVMValueRef si = tp ? cg_mad(c, e, kt, cg_i64(c, f)) : e;
        LLVMValueRef di = tp ? cg_mad(c, e, ksz, cg_i64(c, tp->kept[f])) : e;
        LLVMValueRef x = LLVMBuildLoad2(c->b, c->t_f32, fptr(c, src, si), "");
        LLVMTypeRef ty = wide ? c->t_f64 : c->t_f32;
        LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, ty, dst, &di, 1, "");
        if (wide) x = LLVMBuildFPExt(c->b, x, c->t_f64, "");
        LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, ty, p, ""), x, ""), p);
    }
    cg_for_end(c, &l);
}

/* ---- blocks ---- */

typedef struct Block {
    const ConvShape *s;
    LLVMValueRef n0, g; /* first sample, group */
    int64_t nb, cols;   /* samples, product columns (nb * P) */
    bool direct;        /* one sample per block: rows read and written in place */
    LLVMValueRef wp;    /* the filters (NULL where the kernel reads none) */
    const Layout *lay;  /* their layout; the kept offsets */
    LLVMValueRef blk;   /* the block's index */
    /* With the blocks on several threads (see "threads" below): this
     * thread's slice of each scratch area, out of `slots`; NULL and 1 on
     * one thread. */
    LLVMValueRef slot;
    int slots;
} Block;

/* The block's scratch area `name`, per_sample floats for each of its
 * samples (block_area: a matrix of `rows` x the block's columns).  On
 * several threads each thread has a slice of its own, sized for a full
 * block (the shorter last block must not reach into the next thread's
 * slice) and a multiple of 64 bytes, so that no two threads write one
 * cache line. */
static LLVMValueRef sample_area(Cg *c, const Block *b, const char *name, int64_t per_sample) {
    if (b->slots <= 1) return area(c, name, per_sample * b->nb);
    int64_t slice = (per_sample * block_of(b->s, b->lay->per_tap) + 15) / 16 * 16;
    return fptr(c, cg_scratch(c, name, slice * b->slots), cg_mul(c, b->slot, slice));
}

static LLVMValueRef block_area(Cg *c, const Block *b, const char *name, int64_t rows) {
    return sample_area(c, b, name, rows * b->s->w.out_sz);
}

/* The block's scratch area `name` of `full` floats for a full block (a
 * multiple of 64 bytes per thread); NULL when full is 0. */
static LLVMValueRef block_scratch(Cg *c, const Block *b, const char *name, int64_t full) {
    if (full <= 0) return NULL;
    full = (full + 15) / 16 * 16;
    if (b->slots <= 1) return area(c, name, full);
    return fptr(c, cg_scratch(c, name, full * b->slots), cg_mul(c, b->slot, full));
}

/* Scratch for the block's phase planes, where its patch walk takes them. */
static LLVMValueRef phase_area(Cg *c, const Block *b) {
    return block_scratch(c, b, PHASE_AREA, conv_phase_floats(b->s, block_of(b->s, 0)));
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
 * matrix rows (Mpg x cols), in either direction, walking the destination
 * in order: over small planes the other order stores P floats a sample
 * apart (4 KiB for resnet18's 256 channels at 2x2), lines that all fall
 * in one set of the L1 and evict each other (its 128->256 1x1 stride-2
 * forward pass spent most of its time here). */
static void regroup(Cg *c, const Block *b, const Value *v, LLVMValueRef rows, bool into_v) {
    int64_t P = b->s->w.out_sz, Mpg = mpg(b->s);
    Nest ns = {.n = 0};
    LLVMValueRef m, nl;
    if (into_v) {
        nl = nest_for(c, &ns, cg_i64(c, b->nb));
        m = nest_for(c, &ns, cg_i64(c, Mpg));
    } else {
        m = nest_for(c, &ns, cg_i64(c, Mpg));
        nl = nest_for(c, &ns, cg_i64(c, b->nb));
    }
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

/* The block's patch matrix, in panels or not: each thread's slice of the
 * area holds `room` rows (at least K) of a full block's columns.  All
 * products of a kernel's blocks must ask for the same room, or the
 * threads' slices would overlap (phases_block's differ in K). */
static LLVMValueRef col_area(Cg *c, const Block *b, int64_t room) {
    return block_scratch(c, b, COL_AREA,
                         cg_gemm_packed_b_floats(room, block_of(b->s, b->lay->per_tap) * b->s->w.out_sz));
}

/* The block's patch matrix and its row stride: the input planes of one
 * sample in place for a pointwise convolution, else gathered into the
 * scratch matrix (room: col_area). */
static LLVMValueRef patches(Cg *c, const Block *b, const Value *X, int64_t *ld, int64_t room) {
    int64_t Cpg = b->s->C / b->s->G;
    if (b->direct && pointwise(b->s)) {
        *ld = b->s->w.in_sz;
        return fptr(c, cg_buf(c, X), cg_mul(c, cg_mad(c, b->n0, b->s->C, cg_mul(c, b->g, Cpg)), b->s->w.in_sz));
    }
    LLVMValueRef cols = col_area(c, b, room);
    conv_patch_walk(c, b->s, X, b->n0, b->nb, b->g, cols, false, 0, phase_area(c, b));
    *ld = b->cols;
    return cols;
}

/* Group g's filter matrix (b->lay). */
static LLVMValueRef w_group(Cg *c, const Block *b) { return fptr(c, b->wp, cg_mul(c, b->g, b->lay->gs)); }

typedef void (*BlockFn)(Cg *c, const Block *b, const Value *const *v);

/* Calls fn for every block of samples and every group on one thread: a
 * loop over the full blocks, then the last, shorter block when N is not a
 * multiple.  wp: the filters the blocks read; epi (or NULL) runs after
 * each block's groups, when the block's samples are complete. */
static void blocks_serial(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, LLVMValueRef wp,
                          const Layout *lay, const CgEpilogue *epi) {
    int64_t nb = block_of(s, lay->per_tap), full = s->N / nb, rest = s->N % nb;
    for (int part = 0; part < 2; part++) {
        int64_t count = part ? (rest > 0) : full, size = part ? rest : nb;
        if (count == 0) continue;
        CgLoop li, lg;
        LLVMValueRef blk = cg_add(c, cg_for(c, &li, cg_i64(c, count)), cg_i64(c, part ? full : 0));
        LLVMValueRef n0 = cg_mul(c, blk, nb);
        Block b = {s, n0, cg_for(c, &lg, cg_i64(c, s->G)), size, size * s->w.out_sz, nb == 1, wp, lay, blk, NULL, 1};
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
static double macs_of(const ConvShape *s) {
    return (double)s->N * (double)s->w.out_sz * (double)s->M * (double)k_dim(s);
}

static double kernel_macs(const ConvShape *s, const Layout *lay);

static bool blocks_split(Cg *c, const ConvShape *s, const Layout *lay) {
    return cg_threads(c) > 1 && n_blocks(s, lay->per_tap) * s->G >= 2 &&
           kernel_macs(s, lay) >= (double)cg_gemm_par_volume();
}

/* Items [lo, hi) with `slots` slices of scratch, this thread's `slot`:
 * the ones among the full blocks, then the ones of the shorter last
 * block. */
static void blocks_range(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, LLVMValueRef wp,
                         const Layout *lay, const CgEpilogue *epi, LLVMValueRef lo, LLVMValueRef hi, LLVMValueRef slot,
                         int slots) {
    int64_t nb = block_of(s, lay->per_tap), full = s->N / nb, rest = s->N % nb, G = s->G;
    for (int part = 0; part < 2; part++) {
        int64_t size = part ? rest : nb, first = part ? full * G : 0, last = part ? (full + 1) * G : full * G;
        if (size == 0 || last == first) continue;
        LLVMValueRef a = imax(c, lo, cg_i64(c, first)), z = imin(c, hi, cg_i64(c, last));
        CgLoop l;
        LLVMValueRef i = for_range(c, &l, a, z);
        LLVMValueRef blk = LLVMBuildUDiv(c->b, i, cg_i64(c, G), ""), g = LLVMBuildURem(c->b, i, cg_i64(c, G), "");
        Block b = {s, cg_mul(c, blk, nb), g, size, size * s->w.out_sz, nb == 1, wp, lay, blk, slot, slots};
        fn(c, &b, v);
        if (epi) epi->fn(c, epi->ctx, b.n0, size); /* one group: the item is the whole block */
        cg_for_end(c, &l);
    }
}

/* task(ctx, t, T): thread t's items.  ctx holds the kernel's buffers and
 * then wp; while the task is built, the kernel's buffers (c->args) are
 * the task's loads of them. */
static LLVMValueRef blocks_task(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, bool has_wp,
                                const Layout *lay, const CgEpilogue *epi) {
    int n = c->cur->n_bufs, slots = cg_threads(c);
    int64_t items = n_blocks(s, lay->per_tap) * s->G;
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
    blocks_range(c, s, fn, v, has_wp ? ptrs[n] : NULL, lay, epi, lo, hi, t, slots);
    LLVMBuildRetVoid(c->b);
    memcpy(c->args, saved, (size_t)n * sizeof *saved);
    return task;
}

/* Runs fn over every block of samples and group, on the plan's threads
 * when the kernel has the work for them and `may_split`; returns whether
 * it split them.  epi (or NULL) runs after each block is complete: on the
 * block's thread when the convolution has one group, and otherwise the
 * blocks stay on one thread (a block's groups may fall to two). */
static bool for_blocks(Cg *c, const ConvShape *s, BlockFn fn, const Value *const *v, LLVMValueRef wp,
                       const Layout *lay, bool may_split, const CgEpilogue *epi) {
    if (!may_split || !blocks_split(c, s, lay) || (epi && s->G > 1)) {
        blocks_serial(c, s, fn, v, wp, lay, epi);
        return false;
    }
    int n = c->cur->n_bufs;
    LLVMValueRef ctx = cg_alloca(c, LLVMArrayType(c->t_ptr, (unsigned)n + 1));
    for (int i = 0; i <= n; i++) {
        LLVMValueRef idx = cg_i64(c, i), p = i < n ? c->args[i] : wp ? wp : LLVMConstNull(c->t_ptr);
        LLVMBuildStore(c->b, p, LLVMBuildInBoundsGEP2(c->b, c->t_ptr, ctx, &idx, 1, ""));
    }
    LLVMBasicBlockRef resume = LLVMGetInsertBlock(c->b);
    LLVMValueRef task = blocks_task(c, s, fn, v, wp != NULL, lay, epi);
    LLVMPositionBuilderAtEnd(c->b, resume);
    cg_parallel(c, task, ctx);
    return true;
}

/* ---- the three kernels ---- */

/* The block's patches of X as the B operand of gm (b->s's product over
 * the block): im2col straight into the product's panels where the walk
 * can write them, with no second copy, else patches() (room: col_area). */
static LLVMValueRef block_patches(Cg *c, const Block *b, const Value *X, CgGemm *gm, int64_t room) {
    int64_t nr = cg_gemm_panel_cols(), ld = 0;
    if (!(b->direct && pointwise(b->s)) && conv_patches_in_panels(b->s, b->nb, nr)) {
        LLVMValueRef cols = col_area(c, b, room);
        conv_patch_walk(c, b->s, X, b->n0, b->nb, b->g, cols, false, nr, phase_area(c, b));
        gm->b_packed = true;
        return cols;
    }
    LLVMValueRef cols = patches(c, b, X, &ld, room);
    gm->b_si = ld;
    gm->b_sj = 1;
    return cols;
}

/* v: X, B, Y (the filters are b->wp) */
static void forward_block(Cg *c, const Block *b, const Value *const *v) {
    int64_t Mpg = mpg(b->s), P = b->s->w.out_sz;
    CgGemm gm = {.M = Mpg, .N = b->cols, .K = k_dim(b->s), .alpha = 1};
    LLVMValueRef cols = block_patches(c, b, v[0], &gm, gm.K);
    if (b->lay->packed)
        gm.a_packed = true;
    else
        gm.a_si = b->lay->ms, gm.a_sj = k_stride(b->lay, b->s->w.k_sz);
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
        block_gemm(c, b, &gm, w_group(c, b), cols, y);
        return;
    }
    LLVMValueRef rows = block_area(c, b, ROWS_AREA, Mpg);
    if (v[1]) { /* the product adds to the bias, or writes the rows outright */
        CgLoop lm, lt;
        LLVMValueRef m = cg_for(c, &lm, cg_i64(c, Mpg));
        LLVMValueRef init = cg_load(c, v[1], cg_mad(c, b->g, Mpg, m));
        LLVMValueRef t = cg_for(c, &lt, cg_i64(c, b->cols));
        LLVMBuildStore(c->b, init, fptr(c, rows, cg_mad(c, m, b->cols, t)));
        cg_for_end(c, &lt);
        cg_for_end(c, &lm);
    }
    gm.overwrite = !v[1];
    gm.ldy = b->cols;
    block_gemm(c, b, &gm, w_group(c, b), cols, rows);
    regroup(c, b, v[2], rows, true);
}

/* ---- tap products ----
 *
 * Over planes small against the window, many (offset, position) pairs of
 * the patch matrix read padding: with a 3x3 window and padding 1, 31% of
 * them over a 4x4 plane and 56% over a 2x2 one, and the product above
 * multiplies those zeros.  There the forward pass runs one product per
 * kernel offset t instead, over just the output positions at which t
 * reads inside (a box of the plane):
 *
 *     tmp (box*nb x Mpg) = Xt (box*nb x Cpg) * W_t^T (Cpg x Mpg)
 *
 * Row (q, n) of Xt holds sample n's input channels at the position that
 * output q reads through t, gathered.  Each tmp is added into the
 * block's sums (P*nb x Mpg, row (p, n), set to the bias first), which end
 * transposed into Y.  The products read W_t in place at its strides, the
 * flipped filters of an input gradient included. */

/* The block's input planes of group g channels-last into xl: element
 * (n, position i, channel c) at (n*inP + i)*Cpg + c. */
static void channels_last(Cg *c, const Block *b, const Value *X, LLVMValueRef xl) {
    int64_t Cpg = b->s->C / b->s->G, inP = b->s->w.in_sz;
    CgLoop l;
    LLVMValueRef n = cg_for(c, &l, cg_i64(c, b->nb));
    LLVMValueRef src = cg_mul(c, cg_mad(c, cg_add(c, b->n0, n), b->s->C, cg_mul(c, b->g, Cpg)), inP);
    cg_transpose(c, fptr(c, xl, cg_mul(c, n, inP * Cpg)), Cpg, fptr(c, cg_buf(c, X), src), inP, Cpg, inP);
    cg_for_end(c, &l);
}

/* A position of offset k's box [lo, hi) of output positions: its index
 * in the box (row-major), in the output plane, and the input position it
 * reads through k. */
typedef struct BoxPos {
    LLVMValueRef q, p, at;
} BoxPos;

/* Opens loops (in ns) over the box's positions. */
static BoxPos box_walk(Cg *c, const Win *w, const int64_t *k, const int64_t *lo, const int64_t *hi, Nest *ns) {
    int64_t ist[MAX_RANK], ost[MAX_RANK], bst[MAX_RANK], box[MAX_RANK];
    strides_of(w->in, w->nsp, ist);
    strides_of(w->out, w->nsp, ost);
    for (int j = 0; j < w->nsp; j++) box[j] = hi[j] - lo[j];
    strides_of(box, w->nsp, bst);
    BoxPos r = {cg_i64(c, 0), cg_i64(c, 0), cg_i64(c, 0)};
    for (int j = 0; j < w->nsp; j++) {
        LLVMValueRef o = nest_range(c, ns, cg_i64(c, lo[j]), cg_i64(c, hi[j]));
        r.q = cg_add(c, r.q, cg_mul(c, cg_add(c, o, cg_i64(c, -lo[j])), bst[j]));
        r.p = cg_add(c, r.p, cg_mul(c, o, ost[j]));
        r.at = cg_add(c, r.at, cg_mul(c, cg_add(c, cg_mul(c, o, w->s[j]), cg_i64(c, k[j] * w->d[j] - w->pb[j])),
                                      ist[j]));
    }
    return r;
}

/* Xt of offset k into rows (q*nb + n) of xt: a copy of Cpg floats from
 * the channels-last planes xl per row. */
static void gather_tap(Cg *c, const Block *b, LLVMValueRef xl, const int64_t *k, const int64_t *lo,
                       const int64_t *hi, LLVMValueRef xt) {
    int64_t Cpg = b->s->C / b->s->G;
    Nest ns = {.n = 0};
    BoxPos bp = box_walk(c, &b->s->w, k, lo, hi, &ns);
    LLVMValueRef n = nest_for(c, &ns, cg_i64(c, b->nb));
    LLVMValueRef src = fptr(c, xl, cg_mul(c, cg_mad(c, n, b->s->w.in_sz, bp.at), Cpg));
    LLVMValueRef dst = fptr(c, xt, cg_mul(c, cg_mad(c, bp.q, b->nb, n), Cpg));
    LLVMBuildMemCpy(c->b, dst, 4, src, 4, cg_i64(c, Cpg * 4));
    nest_close(c, &ns);
}

/* sums rows (p*nb + n) += tmp rows (q*nb + n) over offset k's box. */
static void add_tap(Cg *c, const Block *b, const int64_t *k, const int64_t *lo, const int64_t *hi, LLVMValueRef sums,
                    LLVMValueRef tmp) {
    Nest ns = {.n = 0};
    BoxPos bp = box_walk(c, &b->s->w, k, lo, hi, &ns);
    int64_t run = b->nb * mpg(b->s);
    LLVMValueRef d = fptr(c, sums, cg_mul(c, bp.p, run)), s = fptr(c, tmp, cg_mul(c, bp.q, run));
    LLVMValueRef i = nest_for(c, &ns, cg_i64(c, run));
    LLVMValueRef pd = fptr(c, d, i);
    LLVMValueRef x = LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, pd, ""),
                                   LLVMBuildLoad2(c->b, c->t_f32, fptr(c, s, i), ""), "");
    LLVMBuildStore(c->b, x, pd);
    nest_close(c, &ns);
}

/* v: X, B, Y (the filters are b->wp) */
static void taps_block(Cg *c, const Block *b, const Value *const *v) {
    const Win *w = &b->s->w;
    int64_t Cpg = b->s->C / b->s->G, Mpg = mpg(b->s), P = w->out_sz, nb = b->nb;
    const Layout *lay = b->lay;
    LLVMValueRef sums = block_area(c, b, ROWS_AREA, Mpg), xt = block_area(c, b, COL_AREA, Cpg);
    LLVMValueRef tmp = block_area(c, b, TAP_AREA, Mpg), wg = w_group(c, b);
    LLVMValueRef xl = sample_area(c, b, LAST_AREA, w->in_sz * Cpg);
    channels_last(c, b, v[0], xl);
    Nest ns = {.n = 0};
    LLVMValueRef r = nest_for(c, &ns, cg_i64(c, P * nb)), m = nest_for(c, &ns, cg_i64(c, Mpg));
    LLVMValueRef init = v[1] ? cg_load(c, v[1], cg_mad(c, b->g, Mpg, m)) : cg_f32(c, 0);
    LLVMBuildStore(c->b, init, fptr(c, sums, cg_mad(c, r, Mpg, m)));
    nest_close(c, &ns);
    for (int64_t t = 0; t < w->k_sz; t++) {
        int64_t k[MAX_RANK], lo[MAX_RANK], hi[MAX_RANK], cnt = tap_box(w, t, k, lo, hi);
        if (cnt == 0) continue;
        gather_tap(c, b, xl, k, lo, hi, xt);
        int64_t tf = lay->flip ? w->k_sz - 1 - t : t;
        /* a box whole along every axis but the first is a run of the
         * sums' rows: the product adds into them directly */
        bool run = true;
        for (int j = 1; j < w->nsp; j++) run &= lo[j] == 0 && hi[j] == w->out[j];
        CgGemm gm = {.M = cnt * nb, .N = Mpg, .K = Cpg, .a_si = Cpg, .a_sj = 1, .b_si = lay->cs, .b_sj = lay->ms,
                     .ldy = Mpg, .alpha = 1, .overwrite = !run};
        LLVMValueRef wt = fptr(c, wg, cg_i64(c, tf * lay->ts));
        if (run) {
            block_gemm(c, b, &gm, xt, wt, fptr(c, sums, cg_i64(c, lo[0] * (P / w->out[0]) * nb * Mpg)));
            continue;
        }
        block_gemm(c, b, &gm, xt, wt, tmp);
        add_tap(c, b, k, lo, hi, sums, tmp);
    }
    /* Y[n0+n][g*Mpg + m][p] = sums[(p*nb + n)*Mpg + m] */
    CgLoop l;
    LLVMValueRef n = cg_for(c, &l, cg_i64(c, nb));
    LLVMValueRef yi = cg_mul(c, cg_mad(c, cg_add(c, b->n0, n), b->s->M, cg_mul(c, b->g, Mpg)), P);
    cg_transpose(c, fptr(c, cg_buf(c, v[2]), yi), P, fptr(c, sums, cg_mul(c, n, Mpg)), nb * Mpg, P, Mpg);
    cg_for_end(c, &l);
}

/* The filters at wp, laid out as *lay says, copied into the packed
 * products' panels once per call (each group's Mpg x K matrix as
 * cg_gemm_pack_a writes it); *lay then says so.  Without it every block
 * of samples packs them again: resnet18's 64-channel layers at 8x8 run 8
 * blocks per call. */
static LLVMValueRef pack_filters(Cg *c, const ConvShape *s, LLVMValueRef wp, Layout *lay) {
    int64_t K = k_dim(s), Mpg = mpg(s), per = cg_gemm_packed_a_floats(Mpg, K);
    LLVMValueRef dst = area(c, APACK_AREA, s->G * per);
    CgGemm gm = {.M = Mpg, .K = K, .a_si = lay->ms, .a_sj = k_stride(lay, s->w.k_sz)};
    CgLoop l;
    LLVMValueRef g = cg_for(c, &l, cg_i64(c, s->G));
    cg_gemm_pack_a(c, &gm, fptr(c, wp, cg_mul(c, g, lay->gs)), fptr(c, dst, cg_mul(c, g, per)));
    cg_for_end(c, &l);
    lay->gs = per;
    lay->packed = true;
    return dst;
}

/* The forward pass with the filters at wp (W's buffer, its kept offsets,
 * or the flipped filters of an input gradient) laid out as lay says. */
static void forward_with(Cg *c, const ConvShape *s, const Value *X, LLVMValueRef wp, const Layout *lay,
                         const Value *B, const Value *Y, const CgEpilogue *epi) {
    const Value *v[3] = {X, B, Y};
    Layout run = *lay;
    run.per_tap = taps_pay(s) ? cg_threads(c) : 0;
    if (!run.per_tap && n_blocks(s, 0) > 1) wp = pack_filters(c, s, wp, &run);
    for_blocks(c, s, run.per_tap ? taps_block : forward_block, v, wp, &run, true, epi);
}

/* The filters as they are: rows of K contiguous elements. */
static Layout whole(const ConvShape *s) {
    return (Layout){mpg(s) * k_dim(s), k_dim(s), s->w.k_sz, 1, false, NULL};
}

void conv_gemm_forward(Cg *c, const ConvShape *s, const Value *X, const Value *W, const Value *B, const Value *Y,
                       const CgEpilogue *epi) {
    Taps tp;
    Layout lay = whole(s);
    if (trim_taps(s, &tp)) {
        LLVMValueRef wk = kept_filters(c, s, &tp, W, &lay);
        forward_with(c, &tp.t, X, wk, &lay, B, Y, epi);
        return;
    }
    forward_with(c, s, X, cg_buf(c, W), &lay, B, Y, epi);
}

/* Whether the input gradient's col2im adds into phase planes (ph), which
 * then overwrite dX (conv_phase_scatter): not over trimmed offsets. */
static bool col2im_phased(const ConvShape *s, const Layout *lay, ConvPhases *ph) {
    return !lay->taps && conv_phase_scatters(s, ph);
}

/* v: dY, W, dX */
static void grad_input_block(Cg *c, const Block *b, const Value *const *v) {
    int64_t K = k_dim(b->s), Mpg = mpg(b->s), ld;
    LLVMValueRef dy = dy_rows(c, b, v[0], &ld);
    CgGemm gm = {.M = K, .N = b->cols, .K = Mpg, .a_si = k_stride(b->lay, b->s->w.k_sz), .a_sj = b->lay->ms,
                 .b_si = ld, .b_sj = 1, .ldy = b->cols, .alpha = 1};
    if (b->direct && pointwise(b->s)) { /* the product lands on dX's planes (zeroed) as is */
        gm.ldy = b->s->w.in_sz;
        int64_t Cpg = b->s->C / b->s->G;
        LLVMValueRef dx = fptr(c, cg_buf(c, v[2]), cg_mul(c, cg_mad(c, b->n0, b->s->C, cg_mul(c, b->g, Cpg)), gm.ldy));
        block_gemm(c, b, &gm, w_group(c, b), dy, dx);
        return;
    }
    LLVMValueRef cols = block_area(c, b, COL_AREA, K);
    gm.overwrite = true;
    block_gemm(c, b, &gm, w_group(c, b), dy, cols);
    ConvPhases ph;
    if (col2im_phased(b->s, b->lay, &ph)) { /* whole vectors into the block's phase planes */
        int64_t Cpg = b->s->C / b->s->G;
        LLVMValueRef acc = block_area(c, b, DXPH_AREA, ph.S * Cpg);
        zero_floats(c, acc, ph.S * Cpg * b->cols);
        conv_phase_scatter(c, b->s, &ph, cols, b->cols, acc);
        ConvPhaseLayout pl = {ph.plane, b->cols, Cpg * b->cols};
        conv_phase_back(c, b->s, &ph, acc, &pl, v[2], b->n0, b->nb, b->g);
        return;
    }
    conv_patch_walk(c, b->s, v[2], b->n0, b->nb, b->g, cols, true, 0, NULL);
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

/* Wt[g][c][m][ks-1-kf] = W[g*Mpg + m][c][kf] into a scratch area, over
 * the offsets of s's window (the kept offsets of tp when given, the
 * whole window's with tp NULL): reversing the flat kernel index flips
 * every spatial dim. */
static LLVMValueRef flipped_filters(Cg *c, const ConvShape *s, const Taps *tp, const Value *W) {
    int64_t Cpg = s->C / s->G, Mpg = mpg(s), ks = s->w.k_sz, kw = tp ? tp->k_full : ks;
    LLVMValueRef wt = area(c, WT_AREA, s->M * Cpg * ks);
    Nest ns = {.n = 0};
    LLVMValueRef g = nest_for(c, &ns, cg_i64(c, s->G)), m = nest_for(c, &ns, cg_i64(c, Mpg));
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg));
    LLVMValueRef src = cg_mul(c, cg_mad(c, cg_mad(c, g, Mpg, m), Cpg, ch), kw);
    LLVMValueRef dst = cg_mul(c, cg_mad(c, cg_mad(c, g, Cpg, ch), Mpg, m), ks);
    if (tp) { /* few offsets: one copy each */
        for (int64_t f = 0; f < ks; f++)
            LLVMBuildStore(c->b, cg_load(c, W, cg_add(c, src, cg_i64(c, tp->kept[f]))),
                           fptr(c, wt, cg_add(c, dst, cg_i64(c, ks - 1 - f))));
    } else {
        LLVMValueRef kf = nest_for(c, &ns, cg_i64(c, ks));
        LLVMBuildStore(c->b, cg_load(c, W, cg_add(c, src, kf)),
                       fptr(c, wt, cg_add(c, dst, LLVMBuildNSWSub(c->b, cg_i64(c, ks - 1), kf, ""))));
    }
    nest_close(c, &ns);
    return wt;
}

/* ---- strided input gradients, a phase at a time ----
 *
 * At stride s the input positions i = q*s + f of phase f (per axis) take
 * the products of just the kernel offsets k with k*d - pb = f (mod s), at
 * q = o + floor((k*d - pb) / s) for output o.  So each phase's planes are
 * a stride-1 convolution of dY by those offsets' filters, flipped and
 * transposed: a 3x3 window of stride 2 splits into 1x1, 1x2, 2x1 and 2x2
 * ones (dilation d' between a phase's offsets where d is not 1).  Every
 * block of samples runs each phase's product in turn, patches of dY into
 * packed panels, into a scratch matrix of the block's phases, and
 * conv_phase_back's shuffles then copy those onto the block's planes of
 * dX while they are still in cache.  The filters of all phases are packed
 * once per call, straight out of W (phase_packs).  Against the product of
 * all offsets followed by col2im, no sums go through memory a float at a
 * time. */

typedef struct PhaseConv {
    ConvShape t;            /* dY -> the phase's planes, stride 1 */
    int64_t kt;             /* its offsets */
    int64_t taps[MAX_KEPT]; /* its flat offset -> W's (flipped: its first is the phase's last) */
} PhaseConv;

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* Phase f's convolution (f: the phases' row-major index, as ConvPhases
 * orders them); false when some axis gives it no offsets or padding it
 * cannot take. */
static bool phase_conv(const ConvShape *s, const ConvPhases *ph, int64_t f, PhaseConv *pc) {
    const Win *w = &s->w;
    int r = w->nsp;
    Win t = *w;
    int64_t fs[MAX_RANK], ks[MAX_RANK], list[MAX_RANK][MAX_KEPT], cnt[MAX_RANK];
    strides_of(w->s, r, fs);
    strides_of(w->k, r, ks);
    for (int j = 0; j < r; j++) {
        int64_t st = w->s[j], fj = f / fs[j] % st;
        cnt[j] = 0;
        for (int64_t k = 0; k < w->k[j] && cnt[j] < MAX_KEPT; k++)
            if (((k * w->d[j] - w->pb[j]) % st + st) % st == fj) list[j][cnt[j]++] = k;
        if (cnt[j] == 0) return false;
        int64_t q0 = floor_div(list[j][0] * w->d[j] - w->pb[j], st), dd = 1;
        int64_t q1 = floor_div(list[j][cnt[j] - 1] * w->d[j] - w->pb[j], st);
        if (cnt[j] > 1) dd = floor_div(list[j][1] * w->d[j] - w->pb[j], st) - q0;
        if (dd < 1 || q1 - q0 != dd * (cnt[j] - 1)) return false;
        t.in[j] = w->out[j];
        t.out[j] = ph->w.in[j];
        t.k[j] = cnt[j];
        t.s[j] = 1;
        t.d[j] = dd;
        t.pb[j] = q1;
        t.pe[j] = t.out[j] - t.in[j] - q1 + dd * (cnt[j] - 1);
        if (t.pb[j] < 0 || t.pe[j] < 0) return false;
    }
    t.in_sz = w->out_sz;
    t.out_sz = ph->plane;
    t.k_sz = 1;
    for (int j = 0; j < r; j++) t.k_sz *= t.k[j];
    if (t.k_sz > MAX_KEPT) return false;
    for (int64_t e = 0; e < t.k_sz; e++) { /* e's offsets, each axis's list read backwards */
        int64_t rest = e, full = 0;
        for (int j = r - 1; j >= 0; j--) {
            full += list[j][cnt[j] - 1 - rest % cnt[j]] * ks[j];
            rest /= cnt[j];
        }
        pc->taps[e] = full;
    }
    pc->kt = t.k_sz;
    win_flatten_pointwise(&t);
    pc->t = (ConvShape){t, s->N, s->M, s->C, s->G};
    return true;
}

/* A strided input gradient's phases: the convolution, its phase planes,
 * each phase's convolution, and where its packed filters lie in the area
 * phase_packs fills (group g's at at[f] + g*per[f]). */
typedef struct PhaseSet {
    const ConvShape *s;
    ConvPhases ph;
    PhaseConv pc[16];
    int64_t at[16], per[16];
} PhaseSet;

static double kernel_macs(const ConvShape *s, const Layout *lay) {
    if (!lay->phases) return macs_of(s);
    double sum = 0;
    for (int64_t f = 0; f < lay->phases->ph.S; f++) sum += macs_of(&lay->phases->pc[f].t);
    return sum;
}

/* Every phase's filters in the packed products' layout (CgGemm.a_packed)
 * in one pass over W: row c of phase f's matrix (Cpg x Mpg*kt) holds
 * W[g*Mpg + m][c][taps[e]] at column m*kt + e.  A panel's MR floats of
 * one column are MR channels of one filter row, ks floats apart in W, so
 * the MR channels' filters of row m (MR*ks floats in a row of W) give
 * phase f's kt columns m*kt.. of the panel, a run of kt*MR floats, by
 * shuffles (conv_map_copy).  (Copying each phase's filters out and
 * packing the copy, two strided passes per phase, took a third of the
 * kernel's time outside its products on resnet18's 64->128 layer, and a
 * gather of each column as much: some 11 cycles a gather here.) */
static LLVMValueRef phase_packs(Cg *c, const PhaseSet *ps, const Value *W) {
    const ConvShape *s = ps->s;
    int64_t Cpg = s->C / s->G, Mpg = mpg(s), ks = s->w.k_sz, MR = cg_gemm_panel_rows(), total = 0;
    for (int64_t f = 0; f < ps->ph.S; f++) total += s->G * ps->per[f];
    LLVMValueRef dst = area(c, APACK_AREA, total);
    int64_t *map = malloc(sizeof *map * (size_t)(MAX_KEPT * MR));
    CLEAVE_CHECK(map != NULL, "out of memory for a map of %lld floats", (long long)(MAX_KEPT * MR));
    for (int part = 0; part < 2; part++) { /* the full panels, then the last one's rows */
        int64_t rows = part ? Cpg % MR : MR, count = part ? rows > 0 : Cpg / MR;
        if (count == 0) continue;
        Nest ns = {.n = 0};
        LLVMValueRef g = nest_for(c, &ns, cg_i64(c, s->G));
        LLVMValueRef p = cg_add(c, nest_for(c, &ns, cg_i64(c, count)), cg_i64(c, part ? Cpg / MR : 0));
        LLVMValueRef m = nest_for(c, &ns, cg_i64(c, Mpg));
        LLVMValueRef src = fptr(c, cg_buf(c, W), cg_mul(c, cg_mad(c, cg_mad(c, g, Mpg, m), Cpg, cg_mul(c, p, MR)), ks));
        for (int64_t f = 0; f < ps->ph.S; f++) {
            const PhaseConv *pc = &ps->pc[f];
            for (int64_t e = 0; e < pc->kt * MR; e++) map[e] = e % MR < rows ? e % MR * ks + pc->taps[e / MR] : -1;
            int64_t run = pc->kt * MR; /* the phase's columns of filter row m in one panel */
            LLVMValueRef panel = cg_add(c, cg_mad(c, g, ps->per[f], cg_i64(c, ps->at[f])), cg_mul(c, p, Mpg * run));
            conv_map_copy(c, map, run, src, rows * ks, fptr(c, dst, cg_add(c, panel, cg_mul(c, m, run))));
        }
        nest_close(c, &ns);
    }
    free(map);
    return dst;
}

/* v: dY, W, dX (the packed filters are b->wp; b->s is phase 0's
 * convolution, whose blocks every phase shares). */
static void phases_block(Cg *c, const Block *b, const Value *const *v) {
    const PhaseSet *ps = b->lay->phases;
    int64_t Cpg = ps->s->C / ps->s->G, rows = Cpg * b->cols, room = 0;
    for (int64_t f = 0; f < ps->ph.S; f++) room = k_dim(&ps->pc[f].t) > room ? k_dim(&ps->pc[f].t) : room;
    LLVMValueRef out = block_area(c, b, DXPH_AREA, ps->ph.S * Cpg);
    for (int64_t f = 0; f < ps->ph.S; f++) {
        Block bf = *b;
        bf.s = &ps->pc[f].t;
        CgGemm gm = {.M = Cpg, .N = b->cols, .K = k_dim(bf.s), .ldy = b->cols, .alpha = 1, .overwrite = true,
                     .a_packed = true};
        LLVMValueRef cols = block_patches(c, &bf, v[0], &gm, room);
        LLVMValueRef a = fptr(c, b->wp, cg_mad(c, b->g, ps->per[f], cg_i64(c, ps->at[f])));
        block_gemm(c, &bf, &gm, a, cols, fptr(c, out, cg_i64(c, f * rows)));
    }
    ConvPhaseLayout pl = {ps->ph.plane, b->cols, rows}; /* row ch, column nl*plane + q of each phase's product */
    conv_phase_back(c, ps->s, &ps->ph, out, &pl, v[2], b->n0, b->nb, b->g);
}

/* The input gradient by phases (above); false, with nothing emitted,
 * where it does not apply: phase planes (ops_conv_phases.c) of a vector
 * or more, and every phase's convolution a packed product.  Over smaller
 * planes the phases' products are too small: resnet18's 128->256
 * stride-2 layer at 4x4 (2x2 phase planes) ran at 130 GFLOP/s this way
 * against 204 with col2im, where the 64->128 layer at 8x8 went from 188
 * to 201 (one kernel, 2026-12-05). */
static bool grad_input_phases(Cg *c, const ConvShape *s, const Value *dY, const Value *W, const Value *dX) {
    PhaseSet ps = {.s = s};
    if (!conv_phases_of(s, &ps.ph) || ps.ph.S > 16 || ps.ph.plane < cg_vector_floats()) return false;
    int64_t used = 0;
    for (int64_t f = 0; f < ps.ph.S; f++) {
        PhaseConv *pc = &ps.pc[f];
        if (!phase_conv(s, &ps.ph, f, pc) || !conv_gemm_applies(&pc->t, dY, W, dX) || taps_pay(&pc->t))
            return false;
        ps.at[f] = used;
        ps.per[f] = cg_gemm_packed_a_floats(s->C / s->G, k_dim(&pc->t));
        used += s->G * ps.per[f];
    }
    const Value *v[3] = {dY, W, dX};
    Layout lay = {.packed = true, .phases = &ps};
    for_blocks(c, &ps.pc[0].t, phases_block, v, phase_packs(c, &ps, W), &lay, true, NULL);
    return true;
}

/* Below this many output positions over the batch, flipping the filters
 * (a strided copy of every weight, each call) costs more than the scatter
 * it saves: the late layers of a CNN keep col2im. */
enum { FLIP_MIN_POSITIONS = 512 };

void conv_gemm_grad_input(Cg *c, const ConvShape *s, const Value *dY, const Value *W, const Value *dX) {
    Taps tp;
    const Taps *kept = trim_taps(s, &tp) ? &tp : NULL;
    const ConvShape *u = kept ? &tp.t : s; /* the convolution that runs */
    ConvShape t;
    if (as_forward(u, &t) && conv_gemm_applies(&t, dY, W, dX) &&
        (u->N * u->w.out_sz >= FLIP_MIN_POSITIONS || taps_pay(&t))) {
        if (!kept && taps_pay(&t)) { /* the filters read in place, flipped */
            int64_t Cpg = s->C / s->G, kt = s->w.k_sz;
            Layout lay = {mpg(s) * Cpg * kt, kt, Cpg * kt, 1, true, NULL};
            forward_with(c, &t, dY, cg_buf(c, W), &lay, NULL, dX, NULL);
            return;
        }
        Layout lay = whole(&t);
        forward_with(c, &t, dY, flipped_filters(c, u, kept, W), &lay, NULL, dX, NULL);
        return;
    }
    if (!kept && grad_input_phases(c, s, dY, W, dX)) return;
    const Value *v[3] = {dY, W, dX};
    Layout lay = whole(s);
    LLVMValueRef wp = kept ? kept_filters(c, s, kept, W, &lay) : cg_buf(c, W);
    ConvPhases ph;
    if (!col2im_phased(u, &lay, &ph)) zero_floats(c, cg_buf(c, dX), value_numel(dX)); /* else overwritten */
    for_blocks(c, u, grad_input_block, v, wp, &lay, true, NULL);
}

/* ---- weight gradients from channels-last patches ----
 *
 * The weight gradient's product reads the patches transposed (positions
 * x K), and its packing transposes them a 16 x 16 tile at a time, each
 * float packed serving only 2 * Mpg flops: resnet18's 64-channel layers
 * at 8x8 spent about an eighth of the kernel there.  With the block's
 * input planes channels-last and K taken offset-major (column t*Cpg + c),
 * a row of the transposed matrix is, per offset, a run of Cpg
 * consecutive floats at one input position.  When whole vectors divide
 * both Cpg and the panel width NR, every panel row is one or two pieces
 * of such runs, and the walk below copies them straight into the
 * product's panels (CgGemm.b_packed), zeros where the offset reads
 * padding.  The product then leaves each dW row offset-major; the float64
 * sums keep that order, and rounding them into dW puts the elements back
 * in W's order once per call.  Each element's sum runs over the same
 * positions in the same order as before, so the bits do not change. */

static bool grad_weight_last(const ConvShape *s, const Taps *tp, const Value *acc) {
    int64_t Cpg = s->C / s->G, W = cg_vector_floats(), nr = cg_gemm_panel_cols();
    return acc && !tp && !pointwise(s) && n_blocks(s, 0) > 1 && Cpg % W == 0 && nr % W == 0;
}

/* The block's transposed patches, offset-major, into panels of nr
 * columns: row nl*P + p, column t*Cpg + c holds x[n0 + nl, g*Cpg + c] at
 * the input position that output p reads through offset t, or 0 where
 * that is padding.  xl: the block's input planes channels-last
 * (channels_last). */
static void last_panels(Cg *c, const Block *b, LLVMValueRef xl, LLVMValueRef dst) {
    const Win *w = &b->s->w;
    int64_t Cpg = b->s->C / b->s->G, K = k_dim(b->s), nr = cg_gemm_panel_cols(), W = cg_vector_floats();
    int64_t ist[MAX_RANK], ost[MAX_RANK];
    strides_of(w->in, w->nsp, ist);
    strides_of(w->out, w->nsp, ost);
    LLVMValueRef zero = area(c, ZERO_AREA, W);
    for (int64_t j0 = 0; j0 < K; j0 += nr) {
        LLVMValueRef pan = fptr(c, dst, cg_i64(c, j0 / nr * b->cols * nr));
        Nest ns = {.n = 0};
        LLVMValueRef nl = nest_for(c, &ns, cg_i64(c, b->nb)), p = cg_i64(c, 0), o[MAX_RANK];
        for (int j = 0; j < w->nsp; j++) {
            o[j] = nest_for(c, &ns, cg_i64(c, w->out[j]));
            p = cg_add(c, p, cg_mul(c, o[j], ost[j]));
        }
        LLVMValueRef row = fptr(c, pan, cg_mul(c, cg_mad(c, nl, w->out_sz, p), nr));
        /* the panel's columns [j0, end), a vector at a time, in runs of
         * one offset each */
        int64_t end = j0 + nr < K ? j0 + nr : K;
        for (int64_t j = j0; j < end;) {
            int64_t t = j / Cpg, c0 = j % Cpg, len = Cpg - c0 < end - j ? Cpg - c0 : end - j, k[MAX_RANK];
            tap_offsets(w, t, k);
            LLVMValueRef at = cg_i64(c, 0), inside = LLVMConstInt(c->t_i1, 1, 0);
            for (int a = 0; a < w->nsp; a++) {
                LLVMValueRef i = cg_add(c, cg_mul(c, o[a], w->s[a]), cg_i64(c, k[a] * w->d[a] - w->pb[a]));
                /* unsigned: a negative coordinate is outside too */
                inside = LLVMBuildAnd(c->b, inside, LLVMBuildICmp(c->b, LLVMIntULT, i, cg_i64(c, w->in[a]), ""), "");
                at = cg_add(c, at, cg_mul(c, i, ist[a]));
            }
            at = LLVMBuildSelect(c->b, inside, at, cg_i64(c, 0), "");
            LLVMValueRef src = fptr(c, xl, cg_add(c, cg_mul(c, cg_mad(c, nl, w->in_sz, at), Cpg), cg_i64(c, c0)));
            for (int64_t v = 0; v < len; v += W) {
                LLVMValueRef from = LLVMBuildSelect(c->b, inside, fptr(c, src, cg_i64(c, v)), zero, "");
                LLVMBuildMemCpy(c->b, fptr(c, row, cg_i64(c, j - j0 + v)), 4, from, 4, cg_i64(c, W * 4));
            }
            j += len;
        }
        nest_close(c, &ns);
    }
}

/* v: dY, X, dW, acc */
static void grad_weight_block(Cg *c, const Block *b, const Value *const *v) {
    int64_t K = k_dim(b->s), Mpg = mpg(b->s), Cpg = b->s->C / b->s->G, ld, ldc;
    const Taps *tp = b->lay->taps;
    LLVMValueRef dy = dy_rows(c, b, v[0], &ld), cols;
    CgGemm gm = {.M = Mpg, .N = K, .K = b->cols, .a_si = ld, .a_sj = 1, .ldy = K, .alpha = 1};
    if (b->lay->last) {
        LLVMValueRef xl = sample_area(c, b, LAST_AREA, b->s->w.in_sz * Cpg);
        channels_last(c, b, v[1], xl);
        cols = block_scratch(c, b, COL_AREA, cg_gemm_packed_b_floats(block_of(b->s, 0) * b->s->w.out_sz, K));
        last_panels(c, b, xl, cols);
        gm.b_packed = true;
    } else {
        cols = patches(c, b, v[1], &ldc, K);
        gm.b_si = 1;
        gm.b_sj = ldc;
    }
    if (!v[3] && !tp) { /* into dW: the one block's sum, or the blocks' sums one after the other onto zeros */
        gm.overwrite = n_blocks(b->s, 0) == 1;
        block_gemm(c, b, &gm, dy, cols, fptr(c, cg_buf(c, v[2]), cg_mul(c, b->g, Mpg * K)));
        return;
    }
    gm.overwrite = true;
    if (b->slots > 1) { /* every block's part kept apart, summed in order after all threads are done */
        int64_t E = b->s->M * K;
        LLVMValueRef parts = area(c, DW_AREA, n_blocks(b->s, 0) * E);
        block_gemm(c, b, &gm, dy, cols, fptr(c, parts, cg_add(c, cg_mul(c, b->blk, E), cg_mul(c, b->g, Mpg * K))));
        return;
    }
    LLVMValueRef part = area(c, DW_AREA, Mpg * K);
    cg_gemm(c, &gm, dy, cols, part);
    if (!v[3]) { /* the kept offsets into dW's whole window: as they are, zeros between, from one block */
        LLVMValueRef dst = fptr(c, cg_buf(c, v[2]), cg_mul(c, b->g, Mpg * Cpg * tp->k_full));
        if (n_blocks(b->s, 0) > 1) {
            add_filters(c, dst, false, part, Mpg * Cpg, tp->k_full, tp);
            return;
        }
        int64_t *pick = malloc(sizeof *pick * (size_t)tp->k_full);
        CLEAVE_CHECK(pick != NULL, "out of memory for %lld offsets", (long long)tp->k_full);
        for (int64_t f = 0; f < tp->k_full; f++) pick[f] = -1;
        for (int64_t f = 0; f < tp->t.w.k_sz; f++) pick[tp->kept[f]] = f;
        move_taps(c, dst, part, Mpg * Cpg, tp->t.w.k_sz, tp->k_full, pick);
        free(pick);
        return;
    }
    LLVMValueRef base = cg_mul(c, b->g, Mpg * K);
    add_filters(c, LLVMBuildInBoundsGEP2(c->b, c->t_f64, cg_buf(c, v[3]), &base, 1, ""), true, part, Mpg * Cpg,
                b->s->w.k_sz, NULL);
}

/* acc += the blocks' parts, one block after the other: the order in
 * which the one-thread kernel adds each part as it is made. */
static void sum_parts(Cg *c, const ConvShape *s, const Value *acc) {
    int64_t E = s->M * k_dim(s);
    LLVMValueRef parts = area(c, DW_AREA, n_blocks(s, 0) * E);
    CgLoop l;
    LLVMValueRef blk = cg_for(c, &l, cg_i64(c, n_blocks(s, 0)));
    add_filters(c, cg_buf(c, acc), true, fptr(c, parts, cg_mul(c, blk, E)), s->M * (s->C / s->G), s->w.k_sz, NULL);
    cg_for_end(c, &l);
}

/* dW = the float64 sums acc (over the running convolution s's offsets),
 * rounded; with tp, zeros at the offsets it dropped.  With last, acc's
 * rows are offset-major (grad_weight_last): element (m, t, c) goes to
 * dW's (m, c, t). */
static void sums_to_filters(Cg *c, const ConvShape *s, const Value *acc, const Value *dW, const Taps *tp, bool last) {
    int64_t kt = s->w.k_sz, kw = tp ? tp->k_full : kt, Cpg = s->C / s->G, rows = s->M * Cpg;
    if (last) {
        Nest ns = {.n = 0};
        LLVMValueRef m = nest_for(c, &ns, cg_i64(c, s->M)), t = nest_for(c, &ns, cg_i64(c, kt));
        LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg));
        LLVMValueRef si = cg_mad(c, cg_mad(c, m, kt, t), Cpg, ch), di = cg_mad(c, cg_mad(c, m, Cpg, ch), kt, t);
        LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, c->t_f64, cg_buf(c, acc), &si, 1, "");
        cg_store(c, dW, di, LLVMBuildFPTrunc(c->b, LLVMBuildLoad2(c->b, c->t_f64, p, ""), c->t_f32, ""));
        nest_close(c, &ns);
        return;
    }
    if (tp) zero_floats(c, cg_buf(c, dW), value_numel(dW));
    CgLoop l;
    LLVMValueRef e = cg_for(c, &l, cg_i64(c, tp ? rows : rows * kt));
    for (int64_t f = 0; f < (tp ? kt : 1); f++) {
        LLVMValueRef si = tp ? cg_mad(c, e, kt, cg_i64(c, f)) : e, di = tp ? cg_mad(c, e, kw, cg_i64(c, tp->kept[f])) : e;
        LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, c->t_f64, cg_buf(c, acc), &si, 1, "");
        cg_store(c, dW, di, LLVMBuildFPTrunc(c->b, LLVMBuildLoad2(c->b, c->t_f64, p, ""), c->t_f32, ""));
    }
    cg_for_end(c, &l);
}

/* With one block of samples the block's float32 sum is the whole sum
 * (float64 would round it back to itself), so the products write dW
 * directly, each group its own rows: they may split among threads.  With
 * several blocks, each block's float32 sum adds into float64 sums (acc):
 * a filter followed by batch normalisation has a gradient orthogonal to
 * itself, a small difference of large terms that a float32 running sum
 * over the whole batch would round away.  acc holds only the offsets the
 * running convolution keeps. */
void conv_gemm_grad_weight(Cg *c, const ConvShape *s, const Value *dY, const Value *X, const Value *dW,
                           const Value *acc) {
    Taps tp;
    const Taps *kept = trim_taps(s, &tp) ? &tp : NULL;
    const ConvShape *u = kept ? &tp.t : s; /* the convolution that runs; the offsets it drops get zeros */
    int64_t E = u->M * k_dim(u);
    bool one = n_blocks(u, 0) == 1;
    if (one) acc = NULL;
    if (acc)
        zero_floats(c, cg_buf(c, acc), 2 * E);
    else if (!one) /* one block of trimmed filters writes their zeros too */
        zero_floats(c, cg_buf(c, dW), value_numel(dW));
    const Value *v[4] = {dY, X, dW, acc};
    Layout lay = whole(u);
    lay.taps = kept;
    lay.last = grad_weight_last(u, kept, acc);
    /* without float64 sums several blocks add into dW one after the other,
     * which no split can keep */
    bool split = acc ? n_blocks(u, 0) * E <= PARTS_MAX_FLOATS : one && !kept;
    if (for_blocks(c, u, grad_weight_block, v, NULL, &lay, split, NULL) && acc) sum_parts(c, u, acc);
    if (acc) sums_to_filters(c, u, acc, dW, kept, lay.last);
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
