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

static LLVMValueRef area(Cg *c, const char *name, int64_t n) { return fptr(c, cg_scratch(c, name, n), cg_i64(c, 0)); }

static void zero_floats(Cg *c, LLVMValueRef p, int64_t n) {
    LLVMBuildMemSet(c->b, p, LLVMConstInt(c->t_i8, 0, 0), cg_i64(c, n * 4), 16);
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
    conv_patch_walk(c, b->s, X, b->n0, b->nb, b->g, cols, false);
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
    conv_patch_walk(c, b->s, v[2], b->n0, b->nb, b->g, cols, true);
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
