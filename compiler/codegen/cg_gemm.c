/* cg_gemm.c - packed, cache-blocked float32 matrix products (cg_gemm.h).
 *
 * The product y += alpha * A B (A is M x K, B is K x N, any strides) is
 * computed in blocks:
 *
 *   for each block of NC columns of B and y                    (jc)
 *     for each block of KC rows of B / columns of A            (pc)
 *       copy B[pc.., jc..] (KC x NC) into panels of NR columns   -> stays in L2
 *       for each panel of MR rows of A                         (ir)
 *         copy A[ir.., pc..] (MR x KC) k-major                   -> stays in L1
 *         for each panel of B                                  (jr)
 *           micro-kernel: the MR x NR tile of y += alpha * A-panel B-panel
 *
 * The micro-kernel holds the MR x NR tile in MR * NR/W vector registers
 * (W floats each, the widest the target has) for the whole KC loop; per k
 * it loads NR/W vectors of the B panel, broadcasts MR scalars of the A
 * panel and issues MR * NR/W fused multiply-adds.  Only then is y read and
 * written, once per tile and KC block.  The A panel is reused from L1 by
 * every B panel of the block; the B block is reused from L2 by every A
 * panel.
 *
 * The copies put each operand in the order the micro-kernel reads it, so
 * A and B may have any strides: a transposed operand (Gemm's transA /
 * transB, the gradient products) is transposed in registers as it is
 * copied, and never materialised.  Panels at the right and bottom edges
 * are narrower: the copies zero-fill B's last vector, and dedicated
 * micro-kernels compute fewer rows or vectors and store the last vector
 * under a mask, so any M, N, K >= 1 works.
 *
 * Everything about a product is known when the program is compiled, so the
 * block sizes, loop counts and edge kernels are constants of the
 * generated code; only the last block of each loop is shorter, and its
 * length is computed with a min at run time.  Each k of each element of y
 * is added in the same order in every run (within a KC block in k order,
 * the blocks in order), so results are reproducible bit for bit.
 *
 * With --threads T (Plan.threads) a large product is split among T
 * threads: the panels of NR columns of y (or of MR rows, when y is too
 * narrow to share) are dealt out in fixed contiguous runs, and each
 * thread runs the loop nest above over its own columns (rows) with its
 * own slice of the scratch area.  The K blocking, the micro-kernels and
 * the order of the multiply-adds of every element stay those of T = 1, so
 * the bits do not depend on T; no sum is ever split between threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cg_gemm.h"

/* ---- the target ---- */

typedef struct GemmTarget {
    int w;          /* floats in the widest vector register */
    int regs;       /* vector registers */
    int64_t l1, l2; /* data cache bytes per core */
} GemmTarget;

/* Whether LLVM's feature string ("+avx2,-avx512f,+fma,...") enables name. */
static bool has_feature(const char *features, const char *name) {
    size_t n = strlen(name);
    for (const char *p = features; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n + 1 && p[0] == '+' && strncmp(p + 1, name, n) == 0) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

/* A cache size from /sys when sysconf does not know it (0: unknown). */
static int64_t sys_cache(int level) {
    for (int idx = 0; idx < 8; idx++) {
        char path[128], buf[64];
        int lv = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &lv) != 1) lv = 0;
        fclose(f);
        if (lv != level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", idx);
        f = fopen(path, "r");
        if (!f) continue;
        bool data = fgets(buf, sizeof buf, f) && strncmp(buf, "Instruction", 11) != 0;
        fclose(f);
        if (!data) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        f = fopen(path, "r");
        if (!f) continue;
        long kb = 0;
        char unit = 0;
        int got = fscanf(f, "%ld%c", &kb, &unit);
        fclose(f);
        if (got >= 1 && kb > 0) return unit == 'M' ? kb << 20 : kb << 10;
    }
    return 0;
}

static int64_t cache_bytes(int level, int64_t fallback, int64_t lo, int64_t hi) {
    long s = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : _SC_LEVEL2_CACHE_SIZE);
    int64_t b = s > 0 ? (int64_t)s : sys_cache(level);
    if (b <= 0) b = fallback;
    return b < lo ? lo : b > hi ? hi : b;
}

/* The code runs on the machine that compiles it unless --target-cpu says
 * otherwise, and the host's features are what cg_module.c gives LLVM in
 * that case; vectors wider than another target has are still correct
 * there (LLVM splits them), only not as fast. */
static const GemmTarget *target(void) {
    static GemmTarget t;
    static bool done;
    if (done) return &t;
    char *f = LLVMGetHostCPUFeatures();
    if (has_feature(f, "avx512f")) t.w = 16, t.regs = 32;
    else if (has_feature(f, "avx")) t.w = 8, t.regs = 16;
    else if (has_feature(f, "neon")) t.w = 4, t.regs = 32;
    else t.w = 4, t.regs = 16;
    LLVMDisposeMessage(f);
    /* safe defaults: the smallest caches of current x86 and Arm cores */
    t.l1 = cache_bytes(1, 32 << 10, 16 << 10, 256 << 10);
    t.l2 = cache_bytes(2, 256 << 10, 128 << 10, 8 << 20);
    done = true;
    return &t;
}

/* ---- settings ---- */

static CgGemmConfig config;

void cg_gemm_configure(const CgGemmConfig *cfg) {
    if (cfg) config = *cfg;
    else memset(&config, 0, sizeof config);
}

int cg_gemm_forced(void) { return config.force; }

int64_t cg_gemm_par_volume(void) { return config.par_volume > 0 ? config.par_volume : CG_GEMM_PAR_MIN_VOLUME; }

int cg_vector_floats(void) {
    return config.w == 4 || config.w == 8 || config.w == 16 ? config.w : target()->w;
}

bool cg_gemm_applies(const Value *a, const Value *b, const Value *y, int64_t M, int64_t N, int64_t K) {
    if (a->dtype != DT_FLOAT || b->dtype != DT_FLOAT || y->dtype != DT_FLOAT) return false;
    if (M < 1 || N < 1 || K < 1 || config.force < 0) return false;
    if (config.force > 0) return true;
    return (double)M * (double)N * (double)K >= (double)CG_GEMM_MIN_VOLUME;
}

/* ---- blocking ---- */

typedef struct Blocking {
    int w, mr, nv, nr; /* vector width, micro-tile MR x NR = MR x (NV * W) */
    int u;             /* k steps per iteration of the micro-kernel's loop */
    int64_t kc, nc;    /* block sizes actually used (nc a multiple of nr) */
    int64_t nkb, nnb;  /* number of K and N blocks */
} Blocking;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

static Blocking blocking(int64_t N, int64_t K) {
    const GemmTarget *t = target();
    Blocking k = {.w = t->w, .u = 4};
    int regs = t->regs;
    if (config.w == 4 || config.w == 8 || config.w == 16) k.w = config.w, regs = config.w == 16 ? 32 : 16;
    /* MR x NV accumulators, NV vectors of B and one broadcast of A must fit
     * in the registers: 8 x 3 (24 + 3 + 1 of 32) with AVX-512's 32, 6 x 2
     * (12 + 2 + 1 of 16) with AVX's 16.  MR = 8 is a power of two, which the
     * in-register transpose of a row-major A wants. */
    k.mr = regs >= 32 ? 8 : 6;
    k.nv = regs >= 32 ? 3 : 2;
    if (config.mr > 0) k.mr = config.mr < 16 ? config.mr : 16;
    if (config.nv > 0) k.nv = config.nv < 4 ? config.nv : 4;
    k.nr = k.nv * k.w;
    /* KC: the A panel (MR x KC floats) is read by every micro-kernel of a
     * block and must stay in L1 while the B panels stream through it; a
     * quarter of L1 leaves room for them.  K is cut into equal blocks,
     * rounded to whole vectors so that only the last block has a
     * remainder for the in-register transposes. */
    int64_t kc_max = config.kc > 0 ? config.kc : t->l1 / 4 / (k.mr * 4);
    if (kc_max < k.w) kc_max = k.w;
    k.nkb = ceil_div(K, kc_max);
    k.kc = ceil_div(K, k.nkb);
    if (k.nkb > 1) k.kc = round_up(k.kc, k.w);
    if (k.kc > K) k.kc = K;
    k.nkb = ceil_div(K, k.kc);
    /* NC: the packed B block (KC x NC floats) is read by every A panel and
     * must stay in L2; half of it leaves room for the A panels, y's tiles
     * and whatever else the core runs. */
    int64_t nc_max = config.nc > 0 ? config.nc : t->l2 / 2 / (k.kc * 4);
    nc_max = nc_max / k.nr * k.nr;
    if (nc_max < k.nr) nc_max = k.nr;
    k.nnb = ceil_div(N, nc_max);
    k.nc = round_up(ceil_div(N, k.nnb), k.nr);
    k.nnb = ceil_div(N, k.nc);
    return k;
}

void cg_gemm_describe(int64_t M, int64_t N, int64_t K, char *out, size_t len) {
    (void)M;
    const GemmTarget *t = target();
    Blocking k = blocking(N, K);
    snprintf(out, len, "W=%d MR=%d NR=%d KC=%lld NC=%lld L1=%lld L2=%lld", k.w, k.mr, k.nr,
             (long long)k.kc, (long long)k.nc, (long long)t->l1, (long long)t->l2);
}

/* ---- IR helpers ---- */

static LLVMTypeRef vec(Cg *c, int n) { return LLVMVectorType(c->t_f32, (unsigned)n); }

static LLVMValueRef at(Cg *c, LLVMValueRef p, LLVMValueRef idx) {
    return LLVMBuildInBoundsGEP2(c->b, c->t_f32, p, &idx, 1, "");
}

static LLVMValueRef load(Cg *c, LLVMTypeRef t, LLVMValueRef p, unsigned align) {
    LLVMValueRef x = LLVMBuildLoad2(c->b, t, p, "");
    LLVMSetAlignment(x, align);
    return x;
}

static void store(Cg *c, LLVMValueRef x, LLVMValueRef p, unsigned align) {
    LLVMSetAlignment(LLVMBuildStore(c->b, x, p), align);
}

static LLVMValueRef mul(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildNSWMul(c->b, a, b, ""); }

static LLVMValueRef min_i64(Cg *c, LLVMValueRef a, int64_t b) {
    LLVMValueRef bv = cg_i64(c, b);
    return LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, a, bv, ""), a, bv, "");
}

LLVMValueRef cg_intrinsic(Cg *c, const char *name, LLVMTypeRef *over, unsigned n_over, LLVMValueRef *args,
                          unsigned n_args) {
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(c->mod, id, over, n_over);
    LLVMTypeRef ty = LLVMIntrinsicGetType(c->ctx, id, over, n_over);
    return LLVMBuildCall2(c->b, ty, fn, args, n_args, "");
}

/* x splatted over a vector of w lanes. */
static LLVMValueRef splat(Cg *c, LLVMValueRef x, int w) {
    LLVMValueRef v = LLVMBuildInsertElement(c->b, LLVMGetPoison(vec(c, w)), x, LLVMConstInt(c->t_i32, 0, 0), "");
    LLVMValueRef zeros[64];
    for (int i = 0; i < w; i++) zeros[i] = LLVMConstInt(c->t_i32, 0, 0);
    return LLVMBuildShuffleVector(c->b, v, LLVMGetPoison(vec(c, w)), LLVMConstVector(zeros, (unsigned)w), "");
}

static LLVMValueRef lane_mask(Cg *c, int w, int lanes) {
    LLVMValueRef bits[64];
    for (int i = 0; i < w; i++) bits[i] = LLVMConstInt(c->t_i1, i < lanes, 0);
    return LLVMConstVector(bits, (unsigned)w);
}

/* The kernels' functions state the vector width they need.  LLVM splits
 * 512-bit operations in two in a function that prefers 256-bit vectors
 * (its tuning for Skylake-X and later; clang marks every function so)
 * unless the function also gives 512 as its minimum legal width; with
 * both set the kernels keep full-width registers whatever else the module
 * says, and the copy loops LLVM vectorises itself use that width too. */
static void set_attrs(Cg *c, LLVMValueRef fn, int w, bool noinline) {
    char bits[16];
    snprintf(bits, sizeof bits, "%d", w * 32);
    const char *keys[2] = {"min-legal-vector-width", "prefer-vector-width"};
    for (int i = 0; i < 2; i++)
        LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                                LLVMCreateStringAttribute(c->ctx, keys[i], (unsigned)strlen(keys[i]), bits,
                                                          (unsigned)strlen(bits)));
    const char *kinds[2] = {"nounwind", "noinline"};
    for (int i = 0; i < (noinline ? 2 : 1); i++)
        LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                                LLVMCreateEnumAttribute(c->ctx, LLVMGetEnumAttributeKindForName(kinds[i], strlen(kinds[i])), 0));
}

/* An internal function `name` of pointer (and i64) parameters, with the
 * builder in its entry block; NULL when the module already has it. */
static LLVMValueRef begin_fn(Cg *c, const char *name, int n_ptr, int n_i64, const Blocking *k, bool noinline) {
    if (LLVMGetNamedFunction(c->mod, name)) return NULL;
    LLVMTypeRef ps[8];
    int n = 0;
    for (int i = 0; i < n_ptr; i++) ps[n++] = c->t_ptr;
    for (int i = 0; i < n_i64; i++) ps[n++] = c->t_i64;
    LLVMValueRef fn = LLVMAddFunction(c->mod, name, LLVMFunctionType(c->t_void, ps, (unsigned)n, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    set_attrs(c, fn, k->w, noinline);
    LLVMPositionBuilderAtEnd(c->b, LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"));
    return fn;
}

/* ---- scratch areas ---- */

/* One packing area serves every product (a product split among threads
 * takes one slice per thread). */
#define PACK_GLOBAL "cleave.gemm.pack"

LLVMValueRef cg_scratch(Cg *c, const char *name, int64_t n) {
    LLVMValueRef old = LLVMGetNamedGlobal(c->mod, name);
    if (old && (int64_t)LLVMGetArrayLength(LLVMGlobalGetValueType(old)) >= n) return old;
    LLVMTypeRef t = LLVMArrayType(c->t_f32, (unsigned)n);
    LLVMValueRef g = LLVMAddGlobal(c->mod, t, "cleave.scratch.grown");
    LLVMSetInitializer(g, LLVMConstNull(t));
    LLVMSetLinkage(g, LLVMInternalLinkage);
    LLVMSetAlignment(g, 64);
    if (old) {
        LLVMReplaceAllUsesWith(old, g);
        LLVMDeleteGlobal(old);
    }
    LLVMSetValueName2(g, name, strlen(name));
    return g;
}

/* ---- copies into the packed layouts ---- */

/* Transposes R rows of W floats held in v[0..R): afterwards the R*W
 * floats of v, read in order, are the columns of the input one after the
 * other (element k of row t lands at k*R + t).  Each round interleaves
 * the first half of the rows with the second half, which rotates the bits
 * of every element's position by one; log2(R) rounds move the row bits
 * below the column bits. */
static void transpose_rows(Cg *c, LLVMValueRef *v, int R, int W) {
    LLVMValueRef lo[64], hi[64];
    for (int l = 0; l < W; l++) {
        lo[l] = LLVMConstInt(c->t_i32, (unsigned)((l % 2 ? W : 0) + l / 2), 0);
        hi[l] = LLVMConstInt(c->t_i32, (unsigned)((l % 2 ? W : 0) + W / 2 + l / 2), 0);
    }
    LLVMValueRef mlo = LLVMConstVector(lo, (unsigned)W), mhi = LLVMConstVector(hi, (unsigned)W);
    for (int step = 1; step < R; step *= 2) {
        LLVMValueRef next[64];
        for (int i = 0; i < R / 2; i++) {
            next[2 * i] = LLVMBuildShuffleVector(c->b, v[i], v[i + R / 2], mlo, "");
            next[2 * i + 1] = LLVMBuildShuffleVector(c->b, v[i], v[i + R / 2], mhi, "");
        }
        memcpy(v, next, sizeof(LLVMValueRef) * (size_t)R);
    }
}

void cg_transpose(Cg *c, LLVMValueRef dst, int64_t ldd, LLVMValueRef src, int64_t lds, int64_t rows, int64_t cols) {
    int W = cg_vector_floats();
    int64_t rt = rows / W * W, ct = cols / W * W;
    if (rt > 0 && ct > 0) { /* whole W x W tiles through the registers */
        CgLoop li, lj;
        LLVMValueRef i0 = cg_mul(c, cg_for(c, &li, cg_i64(c, rt / W)), W);
        LLVMValueRef j0 = cg_mul(c, cg_for(c, &lj, cg_i64(c, ct / W)), W);
        LLVMValueRef v[64];
        for (int t = 0; t < W; t++)
            v[t] = load(c, vec(c, W), at(c, src, cg_add(c, cg_mul(c, cg_add(c, i0, cg_i64(c, t)), lds), j0)), 4);
        transpose_rows(c, v, W, W); /* v[k]: column k of the tile */
        for (int k = 0; k < W; k++)
            store(c, v[k], at(c, dst, cg_add(c, cg_mul(c, cg_add(c, j0, cg_i64(c, k)), ldd), i0)), 4);
        cg_for_end(c, &lj);
        cg_for_end(c, &li);
    }
    /* the rest one float at a time: columns past the tiles for every row,
     * then rows past the tiles for the tiles' columns */
    for (int part = 0; part < 2; part++) {
        int64_t r0 = part ? rt : 0, nr = part ? rows - rt : rows, c0 = part ? 0 : ct, nc = part ? ct : cols - ct;
        if (nr <= 0 || nc <= 0) continue;
        CgLoop li, lj;
        LLVMValueRef i = cg_add(c, cg_for(c, &li, cg_i64(c, nr)), cg_i64(c, r0));
        LLVMValueRef j = cg_add(c, cg_for(c, &lj, cg_i64(c, nc)), cg_i64(c, c0));
        LLVMValueRef x = load(c, c->t_f32, at(c, src, cg_add(c, cg_mul(c, i, lds), j)), 4);
        store(c, x, at(c, dst, cg_add(c, cg_mul(c, j, ldd), i)), 4);
        cg_for_end(c, &lj);
        cg_for_end(c, &li);
    }
}

/* dst[k*ld + j] = src[k*si + j*sj] for k in [k0, k1), j in [0, cols). */
static void copy_scalar(Cg *c, LLVMValueRef dst, int64_t ld, LLVMValueRef src, int64_t si, int64_t sj, LLVMValueRef k0,
                        LLVMValueRef k1, int64_t cols) {
    CgLoop lk, lj;
    LLVMValueRef i = cg_for(c, &lk, LLVMBuildNSWSub(c->b, k1, k0, ""));
    LLVMValueRef k = cg_add(c, i, k0);
    LLVMValueRef j = cg_for(c, &lj, cg_i64(c, cols));
    LLVMValueRef x = load(c, c->t_f32, at(c, src, cg_add(c, cg_mul(c, k, si), cg_mul(c, j, sj))), 4);
    store(c, x, at(c, dst, cg_add(c, cg_mul(c, k, ld), j)), 4);
    cg_for_end(c, &lj);
    cg_for_end(c, &lk);
}

/* dst[k*ld + j] = src[k*si + j*sj] for k < kc and j < n*lanes, n
 * vectors of `lanes` floats gathered per k, through 32-bit offsets, the
 * lanes j >= cols zero: an operand with neither stride 1 (the filters of
 * a convolution's tap products, W[m][c][t] read at one t).  One gather of
 * 16 floats against 16 scalar copies. */
static void copy_gathered(Cg *c, LLVMValueRef dst, int64_t ld, LLVMValueRef src, int64_t si, int64_t sj,
                          LLVMValueRef kc, int64_t cols, int n, int lanes) {
    LLVMTypeRef vt = vec(c, lanes), over[2] = {vt, LLVMVectorType(c->t_ptr, (unsigned)lanes)};
    CgLoop l;
    LLVMValueRef k = cg_for(c, &l, kc), row = at(c, src, cg_mul(c, k, si));
    for (int v = 0; v < n; v++) {
        LLVMValueRef offs[64], bits[64];
        for (int t = 0; t < lanes; t++) {
            int64_t j = (int64_t)v * lanes + t;
            offs[t] = LLVMConstInt(c->t_i32, (unsigned long long)(j < cols ? j * sj : 0), 0);
            bits[t] = LLVMConstInt(c->t_i1, j < cols, 0);
        }
        LLVMValueRef idx = LLVMConstVector(offs, (unsigned)lanes);
        LLVMValueRef ptrs = LLVMBuildGEP2(c->b, c->t_f32, row, &idx, 1, "");
        LLVMValueRef args[4] = {ptrs, LLVMConstInt(c->t_i32, 4, 0), LLVMConstVector(bits, (unsigned)lanes),
                                LLVMConstNull(vt)};
        LLVMValueRef x = cg_intrinsic(c, "llvm.masked.gather", over, 2, args, 4);
        store(c, x, at(c, dst, cg_add(c, cg_mul(c, k, ld), cg_i64(c, (int64_t)v * lanes))), 4);
    }
    cg_for_end(c, &l);
}

/* Whether copy_gathered's 32-bit offsets reach n*lanes elements sj apart. */
static bool gather_reaches(int64_t sj, int64_t n) { return sj > 0 && n * sj < INT32_MAX; }

/* dst[k*ld + j] = 0 for k in [k0, k1), j in [j0, j1). */
static void zero_cols(Cg *c, LLVMValueRef dst, int64_t ld, LLVMValueRef k0, LLVMValueRef k1, int64_t j0, int64_t j1) {
    if (j1 <= j0) return;
    CgLoop lk, lj;
    LLVMValueRef k = cg_add(c, cg_for(c, &lk, LLVMBuildNSWSub(c->b, k1, k0, "")), k0);
    LLVMValueRef j = cg_for(c, &lj, cg_i64(c, j1 - j0));
    store(c, cg_f32(c, 0), at(c, dst, cg_add(c, cg_mul(c, k, ld), cg_add(c, j, cg_i64(c, j0)))), 4);
    cg_for_end(c, &lj);
    cg_for_end(c, &lk);
}

/* A vector of n floats at p whose first `lanes` lanes are read (the rest
 * zero, and not touched in memory). */
static LLVMValueRef load_lanes(Cg *c, LLVMValueRef p, int n, int lanes) {
    LLVMTypeRef vt = vec(c, n);
    if (lanes >= n) return load(c, vt, p, 4);
    LLVMTypeRef over[2] = {vt, c->t_ptr};
    LLVMValueRef args[4] = {p, LLVMConstInt(c->t_i32, 4, 0), lane_mask(c, n, lanes), LLVMConstNull(vt)};
    return cg_intrinsic(c, "llvm.masked.load", over, 2, args, 4);
}

/* Rows t < R of an operand whose rows are contiguous in k, transposed into
 * a panel: dst[k*ld + g0 + t] = src[t*s_row + k] for k in [0, kq*W), W k's
 * at a time: R vector loads (zeros for rows t >= valid, which do not
 * exist), log2(R) rounds of shuffles, stores of R floats per k (whole
 * vectors when R == ld).  R is a power of two <= W. */
static void copy_transposed(Cg *c, const Blocking *k, LLVMValueRef dst, int64_t ld, int64_t g0, LLVMValueRef src,
                            int64_t s_row, int R, int valid, LLVMValueRef kq) {
    int W = k->w;
    LLVMTypeRef vt = vec(c, W);
    CgLoop lq;
    LLVMValueRef q = cg_for(c, &lq, kq);
    LLVMValueRef k0 = cg_mul(c, q, W);
    LLVMValueRef v[64];
    for (int t = 0; t < R; t++)
        v[t] = t < valid ? load(c, vt, at(c, src, cg_add(c, cg_i64(c, t * s_row), k0)), 4) : LLVMConstNull(vt);
    transpose_rows(c, v, R, W);
    int per = W / R; /* k's per output vector */
    for (int o = 0; o < R; o++) {
        LLVMValueRef kk = cg_add(c, k0, cg_i64(c, o * per));
        if (R == ld) {
            store(c, v[o], at(c, dst, cg_mul(c, kk, ld)), 4);
            continue;
        }
        for (int s = 0; s < per; s++) {
            LLVMValueRef idx[64];
            for (int l = 0; l < R; l++) idx[l] = LLVMConstInt(c->t_i32, (unsigned)(s * R + l), 0);
            LLVMValueRef part = R == W ? v[o]
                                       : LLVMBuildShuffleVector(c->b, v[o], LLVMGetPoison(vt),
                                                                LLVMConstVector(idx, (unsigned)R), "");
            LLVMValueRef p = at(c, dst, cg_add(c, cg_mul(c, cg_add(c, kk, cg_i64(c, s)), ld), cg_i64(c, g0)));
            store(c, part, p, 4);
        }
    }
    cg_for_end(c, &lq);
}

/* A panel of B: dst[k*NR + j] = B(k, j) for k < kc, j < cols (NR, or
 * fewer in the last panel), then zeros up to a whole vector. */
static void pack_b_panel(Cg *c, const CgGemm *g, const Blocking *k, LLVMValueRef src, LLVMValueRef dst,
                         LLVMValueRef kc, int64_t cols) {
    int W = k->w, nvec = (int)ceil_div(cols, W);
    if (g->b_sj == 1) { /* rows of B are contiguous: vector copies */
        CgLoop l;
        LLVMValueRef kk = cg_for(c, &l, kc);
        for (int v = 0; v < nvec; v++) {
            LLVMValueRef p = at(c, src, cg_add(c, cg_mul(c, kk, g->b_si), cg_i64(c, v * W)));
            LLVMValueRef x = load_lanes(c, p, W, (int)(cols - (int64_t)v * W));
            store(c, x, at(c, dst, cg_add(c, cg_mul(c, kk, k->nr), cg_i64(c, v * W))), (unsigned)W * 4);
        }
        cg_for_end(c, &l);
    } else if (g->b_si == 1) { /* columns contiguous (transB): W x W transposes */
        LLVMValueRef kq = LLVMBuildUDiv(c->b, kc, cg_i64(c, W), "");
        for (int v = 0; v < nvec; v++) {
            int valid = (int)(cols - (int64_t)v * W < W ? cols - (int64_t)v * W : W);
            copy_transposed(c, k, dst, k->nr, v * W, at(c, src, cg_i64(c, v * W * g->b_sj)), g->b_sj, W, valid, kq);
        }
        LLVMValueRef k0 = cg_mul(c, kq, W);
        copy_scalar(c, dst, k->nr, src, 1, g->b_sj, k0, kc, cols);
        zero_cols(c, dst, k->nr, k0, kc, cols, (int64_t)nvec * W);
    } else if (gather_reaches(g->b_sj, (int64_t)nvec * W)) {
        copy_gathered(c, dst, k->nr, src, g->b_si, g->b_sj, kc, cols, nvec, W);
    } else {
        copy_scalar(c, dst, k->nr, src, g->b_si, g->b_sj, cg_i64(c, 0), kc, cols);
        zero_cols(c, dst, k->nr, cg_i64(c, 0), kc, cols, (int64_t)nvec * W);
    }
}

/* A panel of A: dst[k*MR + i] = A(i, k) for k < kc, i < rows (MR, or fewer
 * in the last panel; the micro-kernel of that panel reads no more). */
static void pack_a_panel(Cg *c, const CgGemm *g, const Blocking *k, LLVMValueRef src, LLVMValueRef dst,
                         LLVMValueRef kc, int64_t rows) {
    int W = k->w, R = 1;
    while (R * 2 <= W && k->mr % (R * 2) == 0) R *= 2;
    if (g->a_si == 1) { /* columns of A contiguous (transA): vector copies */
        CgLoop l;
        LLVMValueRef kk = cg_for(c, &l, kc);
        LLVMValueRef x = load_lanes(c, at(c, src, cg_mul(c, kk, g->a_sj)), k->mr, (int)rows);
        store(c, x, at(c, dst, cg_mul(c, kk, k->mr)), 4);
        cg_for_end(c, &l);
    } else if (g->a_sj == 1 && R >= 4) { /* rows contiguous: R-row transposes */
        LLVMValueRef kq = LLVMBuildUDiv(c->b, kc, cg_i64(c, W), "");
        for (int g0 = 0; g0 < rows; g0 += R) {
            int valid = (int)(rows - g0 < R ? rows - g0 : R);
            copy_transposed(c, k, dst, k->mr, g0, at(c, src, cg_i64(c, g0 * g->a_si)), g->a_si, R, valid, kq);
        }
        copy_scalar(c, dst, k->mr, src, 1, g->a_si, cg_mul(c, kq, W), kc, rows);
    } else if (gather_reaches(g->a_si, k->mr) && (k->mr & (k->mr - 1)) == 0) {
        copy_gathered(c, dst, k->mr, src, g->a_sj, g->a_si, kc, rows, 1, k->mr);
    } else {
        copy_scalar(c, dst, k->mr, src, g->a_sj, g->a_si, cg_i64(c, 0), kc, rows);
    }
}

/* ---- the micro-kernel ---- */

/* llvm.fmuladd rather than llvm.fma: LLVM makes it one FMA instruction
 * wherever the target has one (vfmadd231ps here), and a multiply and an
 * add where it has none, where llvm.fma would become a call to fmaf for
 * every lane (a program built with --target-cpu for an older CPU).  The
 * choice is made once, when the program is compiled. */
#define FMA "llvm.fmuladd"

/* One k step of a rows x nv micro-kernel on the accumulators acc: nv
 * vectors of the B panel, each of `rows` floats of the A panel broadcast
 * and multiplied into them. */
static void k_step(Cg *c, const Blocking *k, LLVMValueRef ap, LLVMValueRef bp, LLVMValueRef kk, int rows, int nv,
                   LLVMValueRef *acc) {
    int W = k->w;
    LLVMTypeRef vt = vec(c, W);
    LLVMValueRef bv[8];
    for (int v = 0; v < nv; v++)
        bv[v] = load(c, vt, at(c, bp, cg_add(c, cg_mul(c, kk, k->nr), cg_i64(c, v * W))), (unsigned)W * 4);
    for (int r = 0; r < rows; r++) {
        LLVMValueRef a = load(c, c->t_f32, at(c, ap, cg_add(c, cg_mul(c, kk, k->mr), cg_i64(c, r))), 4);
        a = splat(c, a, W);
        for (int v = 0; v < nv; v++) {
            LLVMValueRef args[3] = {a, bv[v], acc[r * nv + v]};
            acc[r * nv + v] = cg_intrinsic(c, FMA, &vt, 1, args, 3);
        }
    }
}

/* uk(ap, bp, cp, kc): the rows x (nv*W) tile at cp (rows ldy apart) +=
 * alpha * sum over k < kc of ap[k*MR + i] * bp[k*NR + j] (= with
 * overwrite, y's old values unread); the last vector stores only `lanes`
 * lanes.  The loop runs u k's per iteration with the
 * accumulators in registers (phis), then the k's left over one at a time. */
static LLVMValueRef micro_kernel(Cg *c, const CgGemm *g, const Blocking *k, int rows, int nv, int lanes,
                                 bool overwrite) {
    uint32_t abits;
    memcpy(&abits, &g->alpha, 4);
    char name[160];
    snprintf(name, sizeof name, "cleave.gemm.uk.%dx%dx%d.l%d.mr%d.nr%d.ld%lld.a%08x%s", rows, nv, k->w, lanes, k->mr,
             k->nr, (long long)g->ldy, abits, overwrite ? ".ow" : "");
    LLVMValueRef fn = LLVMGetNamedFunction(c->mod, name);
    if (fn) return fn;
    fn = begin_fn(c, name, 3, 1, k, true);
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    for (unsigned i = 1; i <= 2; i++) LLVMAddAttributeAtIndex(fn, i, LLVMCreateEnumAttribute(c->ctx, noalias, 0));
    LLVMValueRef ap = LLVMGetParam(fn, 0), bp = LLVMGetParam(fn, 1), cp = LLVMGetParam(fn, 2), kc = LLVMGetParam(fn, 3);
    int W = k->w, n_acc = rows * nv;
    LLVMTypeRef vt = vec(c, W);

    /* Ask for y's tile now, so that its lines are in cache when the loop
     * ends (the tile is written once per KC block, often after a long time
     * away). */
    for (int r = 0; r < rows; r++)
        for (int64_t off = 0; off < (int64_t)nv * W + 16; off += 16) {
            int64_t e = off < (int64_t)nv * W ? off : (int64_t)nv * W - 1;
            LLVMTypeRef pt = c->t_ptr;
            LLVMValueRef args[4] = {at(c, cp, cg_i64(c, r * g->ldy + e)), LLVMConstInt(c->t_i32, 1, 0),
                                    LLVMConstInt(c->t_i32, 3, 0), LLVMConstInt(c->t_i32, 1, 0)};
            cg_intrinsic(c, "llvm.prefetch", &pt, 1, args, 4);
            if (e != off) break;
        }

    LLVMBasicBlockRef entry = LLVMGetInsertBlock(c->b);
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(c->ctx, fn, "k4");
    LLVMBasicBlockRef mid = LLVMAppendBasicBlockInContext(c->ctx, fn, "rest");
    LLVMBasicBlockRef body1 = LLVMAppendBasicBlockInContext(c->ctx, fn, "k1");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c->ctx, fn, "tile");
    LLVMValueRef zero = LLVMConstNull(vt);
    LLVMValueRef kmain = LLVMBuildAnd(c->b, kc, cg_i64(c, -(int64_t)k->u), "");
    LLVMBuildCondBr(c->b, LLVMBuildICmp(c->b, LLVMIntSGT, kmain, cg_i64(c, 0), ""), body, mid);

    LLVMValueRef acc[64], phi[64], phi_mid[64], phi1[64];

    /* main loop: u k's per iteration */
    LLVMPositionBuilderAtEnd(c->b, body);
    LLVMValueRef kv = LLVMBuildPhi(c->b, c->t_i64, "k");
    for (int i = 0; i < n_acc; i++) acc[i] = phi[i] = LLVMBuildPhi(c->b, vt, "");
    for (int s = 0; s < k->u; s++) k_step(c, k, ap, bp, cg_add(c, kv, cg_i64(c, s)), rows, nv, acc);
    LLVMValueRef knext = LLVMBuildNUWAdd(c->b, kv, cg_i64(c, k->u), "");
    LLVMBasicBlockRef body_end = LLVMGetInsertBlock(c->b);
    LLVMBuildCondBr(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, knext, kmain, ""), body, mid);
    LLVMValueRef z64 = cg_i64(c, 0);
    LLVMAddIncoming(kv, &z64, &entry, 1);
    LLVMAddIncoming(kv, &knext, &body_end, 1);
    for (int i = 0; i < n_acc; i++) {
        LLVMAddIncoming(phi[i], &zero, &entry, 1);
        LLVMAddIncoming(phi[i], &acc[i], &body_end, 1);
    }

    /* the k's left over */
    LLVMPositionBuilderAtEnd(c->b, mid);
    LLVMValueRef kr = LLVMBuildPhi(c->b, c->t_i64, "kr");
    LLVMAddIncoming(kr, &z64, &entry, 1);
    LLVMAddIncoming(kr, &knext, &body_end, 1);
    for (int i = 0; i < n_acc; i++) {
        phi_mid[i] = LLVMBuildPhi(c->b, vt, "");
        LLVMAddIncoming(phi_mid[i], &zero, &entry, 1);
        LLVMAddIncoming(phi_mid[i], &acc[i], &body_end, 1);
    }
    LLVMBuildCondBr(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, kr, kc, ""), body1, done);
    LLVMPositionBuilderAtEnd(c->b, body1);
    LLVMValueRef k1 = LLVMBuildPhi(c->b, c->t_i64, "k1");
    for (int i = 0; i < n_acc; i++) acc[i] = phi1[i] = LLVMBuildPhi(c->b, vt, "");
    k_step(c, k, ap, bp, k1, rows, nv, acc);
    LLVMValueRef k1next = LLVMBuildNUWAdd(c->b, k1, cg_i64(c, 1), "");
    LLVMBasicBlockRef body1_end = LLVMGetInsertBlock(c->b);
    LLVMBuildCondBr(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, k1next, kc, ""), body1, done);
    LLVMAddIncoming(k1, &kr, &mid, 1);
    LLVMAddIncoming(k1, &k1next, &body1_end, 1);
    for (int i = 0; i < n_acc; i++) {
        LLVMAddIncoming(phi1[i], &phi_mid[i], &mid, 1);
        LLVMAddIncoming(phi1[i], &acc[i], &body1_end, 1);
    }

    /* y's tile += alpha * acc */
    LLVMPositionBuilderAtEnd(c->b, done);
    for (int i = 0; i < n_acc; i++) {
        LLVMValueRef s = LLVMBuildPhi(c->b, vt, "");
        LLVMAddIncoming(s, &phi_mid[i], &mid, 1);
        LLVMAddIncoming(s, &acc[i], &body1_end, 1);
        acc[i] = s;
    }
    LLVMValueRef alpha = g->alpha != 1.0f ? splat(c, cg_f32(c, g->alpha), W) : NULL;
    LLVMValueRef mask = lanes < W ? lane_mask(c, W, lanes) : NULL;
    LLVMTypeRef over[2] = {vt, c->t_ptr};
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++) {
            LLVMValueRef p = at(c, cp, cg_i64(c, r * g->ldy + v * W));
            bool part = mask && v == nv - 1;
            LLVMValueRef y, s = acc[r * nv + v];
            if (overwrite) { /* the first K block of a product that replaces y */
                y = alpha ? LLVMBuildFMul(c->b, alpha, s, "") : s;
            } else {
                if (part) {
                    LLVMValueRef args[4] = {p, LLVMConstInt(c->t_i32, 4, 0), mask, zero};
                    y = cg_intrinsic(c, "llvm.masked.load", over, 2, args, 4);
                } else {
                    y = load(c, vt, p, 4);
                }
                if (alpha) {
                    LLVMValueRef args[3] = {alpha, s, y};
                    y = cg_intrinsic(c, FMA, &vt, 1, args, 3);
                } else {
                    y = LLVMBuildFAdd(c->b, y, s, "");
                }
            }
            if (part) {
                LLVMValueRef args[4] = {y, p, LLVMConstInt(c->t_i32, 4, 0), mask};
                cg_intrinsic(c, "llvm.masked.store", over, 2, args, 4);
            } else {
                store(c, y, p, 4);
            }
        }
    LLVMBuildRetVoid(c->b);
    return fn;
}

/* ---- the product ---- */

static void call(Cg *c, LLVMValueRef fn, LLVMValueRef *args, unsigned n) {
    LLVMTypeRef ps[4] = {c->t_ptr, c->t_ptr, c->t_ptr, c->t_i64};
    LLVMBuildCall2(c->b, LLVMFunctionType(c->t_void, ps, n, 0), fn, args, n, "");
}

/* Code run only when n is not a multiple of k (an edge panel): if_partial
 * leaves the builder inside, end_partial joins the paths again. */
static LLVMBasicBlockRef if_partial(Cg *c, LLVMValueRef n, int64_t k) {
    LLVMValueRef f = LLVMGetBasicBlockParent(LLVMGetInsertBlock(c->b));
    LLVMBasicBlockRef yes = LLVMAppendBasicBlockInContext(c->ctx, f, "edge");
    LLVMBasicBlockRef after = LLVMAppendBasicBlockInContext(c->ctx, f, "after");
    LLVMValueRef rem = LLVMBuildURem(c->b, n, cg_i64(c, k), "");
    LLVMBuildCondBr(c->b, LLVMBuildICmp(c->b, LLVMIntNE, rem, cg_i64(c, 0), ""), yes, after);
    LLVMPositionBuilderAtEnd(c->b, yes);
    return after;
}

static void end_partial(Cg *c, LLVMBasicBlockRef after) {
    LLVMBuildBr(c->b, after);
    LLVMPositionBuilderAtEnd(c->b, after);
}

/* Micro-kernels along one row of tiles: full B panels (`panel` floats
 * apart), then the narrow last one when this N block has it. */
static void row_of_tiles(Cg *c, const Blocking *k, LLVMValueRef uk_full, LLVMValueRef uk_edge, LLVMValueRef ap,
                         LLVMValueRef bp, LLVMValueRef panel, LLVMValueRef crow, LLVMValueRef kc, LLVMValueRef nc) {
    LLVMValueRef np = LLVMBuildUDiv(c->b, nc, cg_i64(c, k->nr), "");
    CgLoop l;
    LLVMValueRef jp = cg_for(c, &l, np);
    LLVMValueRef args[4] = {ap, at(c, bp, mul(c, jp, panel)), at(c, crow, cg_mul(c, jp, k->nr)), kc};
    call(c, uk_full, args, 4);
    cg_for_end(c, &l);
    if (!uk_edge) return;
    LLVMBasicBlockRef after = if_partial(c, nc, k->nr);
    LLVMValueRef eargs[4] = {ap, at(c, bp, mul(c, np, panel)), at(c, crow, cg_mul(c, np, k->nr)), kc};
    call(c, uk_edge, eargs, 4);
    end_partial(c, after);
}

/* The micro-kernels of a product: full tiles, the narrow last column of
 * tiles, the short last row, and the corner (NULL where N or M has no
 * remainder). */
typedef struct Kernels {
    LLVMValueRef full, n_edge, m_edge, corner;
} Kernels;

/* The micro-kernels of a product (overwrite: the variants that replace
 * y's tile rather than add to it). */
static Kernels kernels_of(Cg *c, const CgGemm *g, const Blocking *k, bool overwrite) {
    const int64_t em = g->M % k->mr, en = g->N % k->nr;
    const int nv_e = (int)ceil_div(en, k->w), lanes_e = (int)(en - (int64_t)(nv_e - 1) * k->w);
    Kernels uk = {.full = micro_kernel(c, g, k, k->mr, k->nv, k->w, overwrite)};
    uk.n_edge = en ? micro_kernel(c, g, k, k->mr, nv_e, lanes_e, overwrite) : NULL;
    uk.m_edge = em ? micro_kernel(c, g, k, (int)em, k->nv, k->w, overwrite) : NULL;
    uk.corner = em && en ? micro_kernel(c, g, k, (int)em, nv_e, lanes_e, overwrite) : NULL;
    return uk;
}

/* The kernels of K block kb: with an overwriting product, block 0 takes
 * the overwriting variants (a select between function pointers). */
static Kernels kernels_at(Cg *c, const Kernels *uk, LLVMValueRef kb) {
    if (!uk[1].full) return uk[0];
    LLVMValueRef first = LLVMBuildICmp(c->b, LLVMIntEQ, kb, cg_i64(c, 0), "");
    Kernels r;
    LLVMValueRef *out[4] = {&r.full, &r.n_edge, &r.m_edge, &r.corner};
    const LLVMValueRef add[4] = {uk[0].full, uk[0].n_edge, uk[0].m_edge, uk[0].corner};
    const LLVMValueRef ow[4] = {uk[1].full, uk[1].n_edge, uk[1].m_edge, uk[1].corner};
    for (int i = 0; i < 4; i++) *out[i] = add[i] ? LLVMBuildSelect(c->b, first, ow[i], add[i], "") : NULL;
    return r;
}

/* Rows [0, m) and columns [0, n) of the product, with a, b and y already
 * pointing at the part's first row and column, packing into ap and bp.
 * m and n are i64 values: the constants M and N for a whole product, run
 * time values for one thread's part.  A part's rows other than the
 * last are whole panels of MR, and its columns whole panels of NR (the
 * split deals out panels), so only a part that ends at M or N has the
 * product's edge tiles. */
static void emit_part(Cg *c, const CgGemm *g, const Blocking *k, const Kernels *uks, LLVMValueRef A, LLVMValueRef B,
                      LLVMValueRef Y, LLVMValueRef ap, LLVMValueRef bp, LLVMValueRef m, LLVMValueRef n) {
    const int64_t K = g->K;
    const int64_t em = g->M % k->mr, en = g->N % k->nr; /* rows of the last A panel, columns of the last B panel */
    LLVMValueRef nnb = LLVMBuildUDiv(c->b, cg_add(c, n, cg_i64(c, k->nc - 1)), cg_i64(c, k->nc), "");
    CgLoop ljb, lkb, lip;
    LLVMValueRef jb = cg_for(c, &ljb, nnb);
    LLVMValueRef jc = cg_mul(c, jb, k->nc);
    LLVMValueRef nc = min_i64(c, LLVMBuildNSWSub(c->b, n, jc, ""), k->nc);
    LLVMValueRef kb = cg_for(c, &lkb, cg_i64(c, k->nkb));
    LLVMValueRef pc = cg_mul(c, kb, k->kc);
    const Kernels at_kb = kernels_at(c, uks, kb), *uk = &at_kb;
    LLVMValueRef kc = min_i64(c, LLVMBuildNSWSub(c->b, cg_i64(c, K), pc, ""), k->kc);

    /* B[pc.., jc..] into panels of NR columns, unless the caller packed
     * it: then its panels are K*NR floats apart, this block's k's at
     * pc*NR into each */
    LLVMValueRef panel = g->b_packed ? cg_i64(c, K * k->nr) : cg_mul(c, kc, k->nr);
    if (g->b_packed) {
        bp = at(c, B, cg_add(c, cg_mul(c, jc, K), cg_mul(c, pc, k->nr)));
    } else {
        LLVMValueRef bsrc = at(c, B, cg_add(c, cg_mul(c, pc, g->b_si), cg_mul(c, jc, g->b_sj)));
        LLVMValueRef np = LLVMBuildUDiv(c->b, nc, cg_i64(c, k->nr), "");
        CgLoop lp;
        LLVMValueRef p = cg_for(c, &lp, np);
        pack_b_panel(c, g, k, at(c, bsrc, cg_mul(c, p, k->nr * g->b_sj)), at(c, bp, mul(c, p, panel)), kc, k->nr);
        cg_for_end(c, &lp);
        if (en) { /* the last panel: en columns */
            LLVMBasicBlockRef after = if_partial(c, nc, k->nr);
            pack_b_panel(c, g, k, at(c, bsrc, cg_mul(c, np, k->nr * g->b_sj)), at(c, bp, mul(c, np, panel)), kc, en);
            end_partial(c, after);
        }
    }

    /* panels of MR rows of A, each against every B panel; a packed A's
     * panel of rows [row, row + MR) starts at row*K, its k's at pc*MR */
    LLVMValueRef asrc = at(c, A, cg_mul(c, pc, g->a_packed ? k->mr : g->a_sj));
    LLVMValueRef ycol = at(c, Y, jc);
    LLVMValueRef ip = cg_for(c, &lip, LLVMBuildUDiv(c->b, m, cg_i64(c, k->mr), ""));
    LLVMValueRef row = cg_mul(c, ip, k->mr);
    LLVMValueRef a_row = g->a_packed ? at(c, asrc, cg_mul(c, row, K)) : ap;
    if (!g->a_packed) pack_a_panel(c, g, k, at(c, asrc, cg_mul(c, row, g->a_si)), ap, kc, k->mr);
    row_of_tiles(c, k, uk->full, uk->n_edge, a_row, bp, panel, at(c, ycol, cg_mul(c, row, g->ldy)), kc, nc);
    cg_for_end(c, &lip);
    if (em) { /* the last panel: em rows, in the part that ends at M */
        LLVMBasicBlockRef after = if_partial(c, m, k->mr);
        LLVMValueRef last = LLVMBuildNSWSub(c->b, m, cg_i64(c, em), "");
        LLVMValueRef a_last = g->a_packed ? at(c, asrc, cg_mul(c, last, K)) : ap;
        if (!g->a_packed) pack_a_panel(c, g, k, at(c, asrc, cg_mul(c, last, g->a_si)), ap, kc, em);
        row_of_tiles(c, k, uk->m_edge, uk->corner, a_last, bp, panel, at(c, ycol, cg_mul(c, last, g->ldy)), kc, nc);
        end_partial(c, after);
    }
    cg_for_end(c, &lkb);
    cg_for_end(c, &ljb);
}

/* ---- threads ---- */

/* How a product is shared among threads.  The panels of one dimension of
 * y are dealt out in contiguous runs: thread t of T takes panels
 * [t*P/T, (t+1)*P/T).  Each element of y is still computed by one thread
 * with the same K blocks, the same micro-kernel and the same order of
 * multiply-adds as without threads, so the bits do not depend on T. */
typedef struct Split {
    int threads;    /* parts, each with its own packing scratch; 1: not split */
    bool rows;      /* panels of MR rows of y, else of NR columns */
    int64_t panels; /* panels of the split dimension */
} Split;

/* Columns are preferred: each thread then copies only its share of B (the
 * weights, in a forward product), and only A is copied by every thread.
 * Rows are taken when they balance clearly better (15%), which is what
 * the narrow products need (an output layer's 10 columns are one panel).
 * A product no split would speed up by 1.5 stays on one thread. */
static Split split_of(const CgGemm *g, const Blocking *k, int threads) {
    Split s = {.threads = 1};
    int64_t min_volume = cg_gemm_par_volume();
    if (threads <= 1 || (double)g->M * (double)g->N * (double)g->K < (double)min_volume) return s;
    int64_t pn = ceil_div(g->N, k->nr), pm = ceil_div(g->M, k->mr);
    int tn = pn < threads ? (int)pn : threads, tm = pm < threads ? (int)pm : threads;
    /* speed-up over one thread: panels over the most any thread gets */
    double sn = (double)pn / (double)ceil_div(pn, tn), sm = (double)pm / (double)ceil_div(pm, tm);
    if (sn < 1.5 && sm < 1.5) return s;
    s.rows = sm > sn * 1.15;
    s.threads = s.rows ? tm : tn;
    s.panels = s.rows ? pm : pn;
    return s;
}

/* task(ctx, t, T): thread t's part of the product, ctx holding a, b and y.
 * With T larger than the split's parts, the extra threads return; with T
 * smaller (no pool), each thread takes several parts' panels. */
static LLVMValueRef task_fn(Cg *c, const CgGemm *g, const Blocking *k, const Split *s, const Kernels *uk,
                            LLVMValueRef area, int64_t slice, int64_t a_area, const char *name) {
    LLVMTypeRef ps[3] = {c->t_ptr, c->t_i64, c->t_i64};
    LLVMValueRef fn = LLVMAddFunction(c->mod, name, LLVMFunctionType(c->t_void, ps, 3, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    set_attrs(c, fn, k->w, true);
    LLVMPositionBuilderAtEnd(c->b, LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"));
    LLVMValueRef ctx = LLVMGetParam(fn, 0), t = LLVMGetParam(fn, 1), T = LLVMGetParam(fn, 2);
    LLVMValueRef ops[3];
    for (int i = 0; i < 3; i++) {
        LLVMValueRef idx = cg_i64(c, i);
        ops[i] = LLVMBuildLoad2(c->b, c->t_ptr, LLVMBuildInBoundsGEP2(c->b, c->t_ptr, ctx, &idx, 1, ""), "");
    }
    LLVMValueRef parts = min_i64(c, T, s->threads);
    LLVMBasicBlockRef work = LLVMAppendBasicBlockInContext(c->ctx, fn, "work");
    LLVMBasicBlockRef idle = LLVMAppendBasicBlockInContext(c->ctx, fn, "idle");
    LLVMBuildCondBr(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, t, parts, ""), work, idle);
    LLVMPositionBuilderAtEnd(c->b, idle);
    LLVMBuildRetVoid(c->b);
    LLVMPositionBuilderAtEnd(c->b, work);
    LLVMValueRef p0 = LLVMBuildSDiv(c->b, cg_mul(c, t, s->panels), parts, "");
    LLVMValueRef p1 = LLVMBuildSDiv(c->b, cg_mul(c, cg_add(c, t, cg_i64(c, 1)), s->panels), parts, "");
    int64_t width = s->rows ? k->mr : k->nr, extent = s->rows ? g->M : g->N;
    LLVMValueRef lo = cg_mul(c, p0, width), hi = min_i64(c, cg_mul(c, p1, width), extent);
    LLVMValueRef len = LLVMBuildNSWSub(c->b, hi, lo, "");
    LLVMValueRef A = ops[0], B = ops[1], Y = ops[2], m = cg_i64(c, g->M), n = cg_i64(c, g->N);
    if (s->rows) { /* lo is a multiple of MR, and of NR below */
        A = at(c, A, cg_mul(c, lo, g->a_packed ? g->K : g->a_si));
        Y = at(c, Y, cg_mul(c, lo, g->ldy));
        m = len;
    } else {
        B = at(c, B, cg_mul(c, lo, g->b_packed ? g->K : g->b_sj));
        Y = at(c, Y, lo);
        n = len;
    }
    LLVMValueRef ap = at(c, area, cg_mul(c, t, slice));
    emit_part(c, g, k, uk, A, B, Y, ap, at(c, ap, cg_i64(c, a_area)), m, n);
    LLVMBuildRetVoid(c->b);
    return fn;
}

void cg_parallel(Cg *c, LLVMValueRef task, LLVMValueRef ctx) {
    LLVMTypeRef ps[2] = {c->t_ptr, c->t_ptr};
    LLVMTypeRef fty = LLVMFunctionType(c->t_void, ps, 2, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(c->mod, "cleave_rt_parallel");
    if (!fn) fn = LLVMAddFunction(c->mod, "cleave_rt_parallel", fty);
    LLVMValueRef args[2] = {task, ctx};
    LLVMBuildCall2(c->b, fty, fn, args, 2, "");
}

int cg_threads(const Cg *c) { return c->plan && c->plan->threads > 1 ? c->plan->threads : 1; }

/* Floats of one slot of the packing area (cg_gemm_in_slot): the most any
 * product's A panel and B block take under blocking() (KC at most the
 * L1 bound rounded to a vector, NC x KC at most half of L2 or one panel
 * of NR), so that every product of the module can use the same slices:
 * the products one thread runs take different shapes (a convolution's
 * shorter last block), and slices sized for one of them would reach into
 * the next thread's. */
static int64_t slot_floats(const Blocking *k) {
    const GemmTarget *t = target();
    int64_t kc_max = config.kc > 0 ? config.kc : t->l1 / 4 / (k->mr * 4);
    if (kc_max < k->w) kc_max = k->w;
    kc_max = round_up(kc_max, k->w);
    int64_t b_max = t->l2 / 2 / 4, nc_cfg = config.nc > 0 ? round_up(config.nc, k->nr) : 0;
    if (b_max < kc_max * k->nr) b_max = kc_max * k->nr;
    if (nc_cfg > 0 && b_max < kc_max * nc_cfg) b_max = kc_max * nc_cfg;
    return round_up(round_up((int64_t)k->mr * kc_max, 16) + b_max, 16);
}

/* The product's function.  slots = 0: the product as cg_gemm emits it,
 * split among threads when it is large; slots > 0: one thread's product
 * (cg_gemm_in_slot), which takes a fourth parameter, the slot, and packs
 * into that slice of `slots`. */
static LLVMValueRef gemm_fn(Cg *c, const CgGemm *g, const Blocking *k, int slots) {
    Split s = split_of(g, k, slots > 0 ? 1 : cg_threads(c));
    uint32_t abits;
    memcpy(&abits, &g->alpha, 4);
    char name[256], split[32] = "";
    if (s.threads > 1) snprintf(split, sizeof split, ".t%d%s", s.threads, s.rows ? "r" : "c");
    if (slots > 0) snprintf(split, sizeof split, ".slot");
    snprintf(name, sizeof name,
             "cleave.gemm.%lldx%lldx%lld.a%lld_%lld.b%lld_%lld.y%lld.al%08x.%dx%dx%d.kc%lld.nc%lld%s%s", (long long)g->M,
             (long long)g->N, (long long)g->K, (long long)g->a_si, (long long)g->a_sj, (long long)g->b_si,
             (long long)g->b_sj, (long long)g->ldy, abits, k->mr, k->nv, k->w, (long long)k->kc, (long long)k->nc,
             g->overwrite ? ".ow" : "", split);
    if (g->a_packed || g->b_packed)
        snprintf(name + strlen(name), sizeof name - strlen(name), ".p%s%s", g->a_packed ? "a" : "", g->b_packed ? "b" : "");
    int64_t a_area = round_up((int64_t)k->mr * k->kc, 16);
    /* one slice of scratch per part, 64-byte aligned so the B panels stay
     * aligned and no two threads write the same cache line */
    int64_t slice = round_up(a_area + k->kc * k->nc, 16);
    if (slots > 0) {
        int64_t stride = slot_floats(k);
        CLEAVE_CHECK(slice <= stride, "a packed product of %lld floats in slots of %lld", (long long)slice,
                     (long long)stride);
        slice = stride;
    }
    int parts = slots > 0 ? slots : s.threads;
    LLVMValueRef area = cg_scratch(c, PACK_GLOBAL, parts > 1 ? parts * slice : a_area + k->kc * k->nc);
    LLVMValueRef fn = LLVMGetNamedFunction(c->mod, name);
    if (fn) return fn;

    const int64_t M = g->M, N = g->N;
    /* micro-kernels first: each is a function of its own */
    Kernels uk[2] = {kernels_of(c, g, k, false), {0}};
    if (g->overwrite) uk[1] = kernels_of(c, g, k, true);

    if (s.threads > 1) {
        char tname[300];
        snprintf(tname, sizeof tname, "%s.task", name);
        LLVMValueRef task = task_fn(c, g, k, &s, uk, area, slice, a_area, tname);
        /* the product hands a, b and y to its task through the stack */
        fn = begin_fn(c, name, 3, 0, k, true);
        LLVMValueRef ctx = LLVMBuildAlloca(c->b, LLVMArrayType(c->t_ptr, 3), "ctx");
        for (int i = 0; i < 3; i++) {
            LLVMValueRef idx = cg_i64(c, i);
            store(c, LLVMGetParam(fn, (unsigned)i), LLVMBuildInBoundsGEP2(c->b, c->t_ptr, ctx, &idx, 1, ""), 8);
        }
        cg_parallel(c, task, ctx);
        LLVMBuildRetVoid(c->b);
        return fn;
    }
    fn = begin_fn(c, name, 3, slots > 0, k, true);
    LLVMValueRef ap = at(c, area, slots > 0 ? mul(c, LLVMGetParam(fn, 3), cg_i64(c, slice)) : cg_i64(c, 0));
    emit_part(c, g, k, uk, LLVMGetParam(fn, 0), LLVMGetParam(fn, 1), LLVMGetParam(fn, 2), ap,
              at(c, ap, cg_i64(c, a_area)), cg_i64(c, M), cg_i64(c, N));
    LLVMBuildRetVoid(c->b);
    return fn;
}

void cg_gemm(Cg *c, const CgGemm *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef y) {
    LLVMBasicBlockRef saved = LLVMGetInsertBlock(c->b);
    Blocking k = blocking(g->N, g->K);
    LLVMValueRef fn = gemm_fn(c, g, &k, 0);
    LLVMPositionBuilderAtEnd(c->b, saved);
    LLVMValueRef args[3] = {a, b, y};
    call(c, fn, args, 3);
}

int cg_gemm_panel_cols(void) { return blocking(1, 1).nr; }
int cg_gemm_panel_rows(void) { return blocking(1, 1).mr; }

int64_t cg_gemm_packed_a_floats(int64_t M, int64_t K) { return round_up(M, cg_gemm_panel_rows()) * K; }
int64_t cg_gemm_packed_b_floats(int64_t K, int64_t N) { return round_up(N, cg_gemm_panel_cols()) * K; }

/* Whole panels of MR rows over all of K, each as pack_a_panel writes one
 * K block: the layouts agree, a K block's panel being the rows k0.. of
 * the whole one. */
void cg_gemm_pack_a(Cg *c, const CgGemm *g, LLVMValueRef a, LLVMValueRef dst) {
    Blocking k = blocking(1, g->K);
    int64_t full = g->M / k.mr, em = g->M % k.mr;
    if (full > 0) {
        CgLoop l;
        LLVMValueRef row = cg_mul(c, cg_for(c, &l, cg_i64(c, full)), k.mr);
        pack_a_panel(c, g, &k, at(c, a, cg_mul(c, row, g->a_si)), at(c, dst, cg_mul(c, row, g->K)), cg_i64(c, g->K),
                     k.mr);
        cg_for_end(c, &l);
    }
    if (em)
        pack_a_panel(c, g, &k, at(c, a, cg_i64(c, full * k.mr * g->a_si)), at(c, dst, cg_i64(c, full * k.mr * g->K)),
                     cg_i64(c, g->K), em);
}

void cg_gemm_in_slot(Cg *c, const CgGemm *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef y, LLVMValueRef slot,
                     int slots) {
    CLEAVE_CHECK(slots >= 1, "a product packing into %d slots", slots);
    LLVMBasicBlockRef saved = LLVMGetInsertBlock(c->b);
    Blocking k = blocking(g->N, g->K);
    LLVMValueRef fn = gemm_fn(c, g, &k, slots);
    LLVMPositionBuilderAtEnd(c->b, saved);
    LLVMValueRef args[4] = {a, b, y, slot};
    call(c, fn, args, 4);
}
