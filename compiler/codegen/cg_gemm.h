/* cg_gemm.h - packed, cache-blocked float32 matrix products.
 *
 * For a product whose shapes, strides and alpha are known at compile time,
 * cg_gemm emits (once per distinct product in a module) a function that
 * computes
 *
 *     y[i*ldy + j] += alpha * sum_k a[i*a_si + k*a_sj] * b[k*b_si + j*b_sj]
 *
 * (= instead of += with CgGemm.overwrite) for 0 <= i < M, 0 <= j < N, 0 <= k < K, and calls it.  The function
 * copies blocks of a and b into a scratch area in the layout its
 * register-blocked micro-kernel reads (transposed operands are transposed
 * while they are copied), then runs the micro-kernel over the blocks.  The
 * scratch area is one zero-initialised module global, sized at compile
 * time for the largest product of the module: nothing is allocated when
 * the program runs.  The summation order is fixed by the shapes alone, so
 * every run gives the same bits.  docs/perf.md explains the blocking.
 *
 * With --threads T > 1 (Plan.threads) a large product is split among T
 * threads by a fixed partition of y's column panels (or row panels when
 * y is narrow), each thread packing into its own slice of the scratch
 * area; every element gets the same operations in the same order as with
 * one thread, so the bits do not depend on T.
 *
 * The caller decides with cg_gemm_applies whether a product takes this
 * path; integer and 16-bit float products, and products too small for the
 * copies to pay, keep gemm_block's loops (ops/ops_linalg.c). */
#ifndef CLEAVE_CG_GEMM_H
#define CLEAVE_CG_GEMM_H

#include "cg.h"

typedef struct CgGemm {
    int64_t M, N, K;
    int64_t a_si, a_sj; /* element (i, k) of op(A) at a + i*a_si + k*a_sj */
    int64_t b_si, b_sj; /* element (k, j) of op(B) at b + k*b_si + j*b_sj */
    int64_t ldy;        /* element (i, j) of y at y + i*ldy + j */
    float alpha;
    bool overwrite;     /* y = alpha * op(A) op(B): y's old values are not read */
    /* Operands already in the packed layouts (a_si ... b_sj unused):
     * element (i, k) of A at a[(i / MR) * K * MR + k * MR + i % MR], as
     * cg_gemm_pack_a writes it, so that a product run once per block of
     * a convolution packs its filters once per call; element (k, j) of B
     * at b[(j / NR) * K * NR + k * NR + j % NR] (cg_gemm_panel_cols), so
     * that a convolution's patches go straight into the panels.  The
     * columns of B's last panel past N are read but never used. */
    bool a_packed, b_packed;
} CgGemm;

/* Whether a product of these float buffers with these sizes takes the
 * packed path: all three float32, M, N, K >= 1, and M*N*K at least
 * CG_GEMM_MIN_VOLUME (unless cg_gemm_configure forces a choice). */
bool cg_gemm_applies(const Value *a, const Value *b, const Value *y, int64_t M, int64_t N, int64_t K);

/* Emits the call at the builder's position (inside a kernel); a, b and y
 * are pointers to the first element of each matrix. */
void cg_gemm(Cg *c, const CgGemm *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef y);

/* cg_gemm for callers that run several products at once on threads of
 * their own (a convolution's blocks of samples, ops/ops_conv_gemm.c):
 * the product stays on the calling thread and packs into slice `slot` (an
 * i64 value below `slots`) of the packing area, so that products running
 * together never share scratch.  Same bits as cg_gemm. */
void cg_gemm_in_slot(Cg *c, const CgGemm *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef y, LLVMValueRef slot,
                     int slots);

/* NR, the columns of a packed B panel, and MR, the rows of a packed A
 * panel, of the products this module builds. */
int cg_gemm_panel_cols(void);
int cg_gemm_panel_rows(void);

/* Floats of A (M x K) and B (K x N) in the packed layouts of CgGemm
 * (whole panels). */
int64_t cg_gemm_packed_a_floats(int64_t M, int64_t K);
int64_t cg_gemm_packed_b_floats(int64_t K, int64_t N);

/* Emits the copy of op(A) (g's M, K, a_si, a_sj) from a into dst in the
 * packed layout (CgGemm.a_packed). */
void cg_gemm_pack_a(Cg *c, const CgGemm *g, LLVMValueRef a, LLVMValueRef dst);

/* The threads the plan's products may use (--threads; 1 without). */
int cg_threads(const Cg *c);

/* Emits cleave_rt_parallel(task, ctx) (runtime/rt_abi.h), which runs
 * task(ctx, t, T) for t = 0..T-1 on the program's threads and returns
 * when all are done. */
void cg_parallel(Cg *c, LLVMValueRef task, LLVMValueRef ctx);

/* The module's scratch area `name`, with room for at least n floats: a
 * zero-initialised internal global, 64-byte aligned, shared by every
 * kernel that asks for the same name (kernels run one at a time).  When a
 * kernel needs more than an earlier one, the area is replaced by a larger
 * one for all of them.  The packed products use "cleave.gemm.pack"; the
 * convolutions' patch matrices have areas of their own. */
LLVMValueRef cg_scratch(Cg *c, const char *name, int64_t n);

/* Below this many multiply-adds the packing does not pay for itself (see
 * docs/perf.md for the measurement). */
#define CG_GEMM_MIN_VOLUME (16 * 16 * 32)

/* With --threads T > 1, packed products (and packed convolution kernels,
 * counting all their blocks, ops/ops_conv_gemm.c) of at least this many
 * multiply-adds (about 150 us on one core here) are split among the T
 * threads (cleave_rt_parallel, runtime/rt_abi.h).  Below it, waking and
 * waiting for the workers cost more than the split saved in training on
 * the development machine: with 2^19, the 784-256-256-10 MLP at batch 32
 * (products of 2 and 6 million) ran at 0.7 to 0.8 times one thread.
 * See docs/perf.md, "Threads". */
#define CG_GEMM_PAR_MIN_VOLUME ((int64_t)1 << 23)

/* ---- settings for tests and measurements ---- */

typedef struct CgGemmConfig {
    int force;       /* 0: by volume; 1: every float32 product; -1: none */
    int w;           /* floats per vector, 4, 8 or 16 (0: the target's) */
    int mr, nv;      /* micro-tile rows and vectors (0: from the width) */
    int64_t kc, nc;  /* largest K and N blocks (0: from the caches) */
    int64_t par_volume; /* smallest product split among threads (0: CG_GEMM_PAR_MIN_VOLUME) */
} CgGemmConfig;

/* Replaces the settings (NULL restores the defaults).  Not thread-safe:
 * call it before building modules. */
void cg_gemm_configure(const CgGemmConfig *cfg);

/* The `force` setting in effect: 1 when tests force the packed path on
 * every float32 product (convolutions of any size included), -1 when
 * they keep it off (and with it the vector kernels of depthwise
 * convolutions and of MaxPool, so that their scalar loops run), 0 by
 * default. */
int cg_gemm_forced(void);

/* The smallest work split among threads, in multiply-adds: the
 * par_volume setting, else CG_GEMM_PAR_MIN_VOLUME.  Convolutions split
 * their blocks of samples above it (ops/ops_conv_gemm.c). */
int64_t cg_gemm_par_volume(void);

/* Floats per vector register of the products (16 with AVX-512, 8 with
 * AVX): the width other kernels built around them should use. */
int cg_vector_floats(void);

/* dst[j*ldd + i] = src[i*lds + j] for i < rows, j < cols: whole tiles of
 * cg_vector_floats() square through the registers (loads, log2(W) rounds
 * of shuffles, stores), the edges one float at a time.  Where LLVM
 * vectorises the plain loop it gathers a lane at a time. */
void cg_transpose(Cg *c, LLVMValueRef dst, int64_t ldd, LLVMValueRef src, int64_t lds, int64_t rows, int64_t cols);

/* A call of the LLVM intrinsic `name` ("llvm.masked.load"), overloaded on
 * the types over[0..n_over). */
LLVMValueRef cg_intrinsic(Cg *c, const char *name, LLVMTypeRef *over, unsigned n_over, LLVMValueRef *args,
                          unsigned n_args);

/* What the generator would use for a product of this size, as one line
 * ("W=16 MR=8 NR=48 KC=272 NC=960 L1=49152 L2=2097152"). */
void cg_gemm_describe(int64_t M, int64_t N, int64_t K, char *out, size_t len);

#endif
