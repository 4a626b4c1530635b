/* cg.h - code generation with the LLVM C API.
 *
 * Every node becomes one kernel: an LLVM function whose parameters are
 * pointers to the node's buffers (distinct buffers are `noalias`, so loops
 * vectorise without run-time overlap checks), with loops over shapes known
 * at compile time.  The step functions only call kernels with arena
 * offsets.  An op's codegen rule (OpDef.cg) builds its kernel with the
 * helpers below; element-wise ops give a scalar function and reuse the
 * generic broadcasting loop nest.
 *
 * Files: cg_kernel.c (kernel scaffolding, loops, element-wise nests),
 * cg_module.c (module, step functions, metadata, optimisation, emission),
 * cg_link.c (linking the program). */
#ifndef CLEAVE_CG_H
#define CLEAVE_CG_H

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "../ir/ir.h"
#include "../plan/plan.h"

/* Buffers one kernel takes (inputs and outputs); a node with more is
 * refused as unsupported, naming it (cg_kernel_begin_io). */
#define CG_MAX_BUFS 64

typedef struct CgKernel {
    LLVMValueRef fn;
    int n_bufs;
    const Value *bufs[CG_MAX_BUFS];
} CgKernel;

typedef struct Cg Cg;
typedef struct CgFuse CgFuse; /* cg_fuse.h */
struct Cg {
    LLVMContextRef ctx;
    LLVMModuleRef mod;
    LLVMBuilderRef b;
    LLVMTypeRef t_void, t_i1, t_i8, t_i32, t_i64, t_f32, t_f64, t_ptr;
    Graph *g;
    Diag *d;
    const Plan *plan;
    CgKernel *kernels; /* per node id */
    CgKernel *eval_kernels; /* per node id: the eval step's (OpDef.cg_eval) */
    bool eval_form;         /* cg_kernel_begin builds into eval_kernels */
    CgFuse *fuse;      /* fused element-wise chains (cg_fuse.h) */
    /* the kernel being built */
    const Node *node;
    CgKernel *cur;
    LLVMValueRef args[CG_MAX_BUFS];
};

/* ---- kernels ---- */
/* Starts the kernel of node n over the given buffers (inputs, outputs,
 * state; duplicates allowed).  Leaves the builder in its entry block. */
bool cg_kernel_begin(Cg *c, const Node *n, int n_bufs, const Value *const *bufs);
void cg_kernel_end(Cg *c);
/* The same for a kernel that is not one node's (fused chains, cg_fuse.c):
 * built into k under `name`, errors naming node n; shared[i]: buffer i may
 * overlap another in some call (no noalias); alias[i] (NULL: none): an
 * earlier buffer that buffer i is the same bytes as in every call, whose
 * pointer the kernel then uses for both, or -1. */
bool cg_kernel_begin_as(Cg *c, CgKernel *k, const char *name, const Node *n, int n_bufs, const Value *const *bufs,
                        const bool *shared, const int *alias);
/* Whether buffers a and b of node n's kernel may be the same bytes in
 * some call (then neither is noalias). */
bool cg_may_share(const Cg *c, const Node *n, const Value *a, const Value *b);
/* Whether they are the same bytes in every call (an in-place result). */
bool cg_always_same(const Cg *c, const Node *n, const Value *a, const Value *b);
/* Kernel over all present inputs then all present outputs. */
bool cg_kernel_begin_io(Cg *c, const Node *n);
/* Base pointer of v's buffer inside the current kernel. */
LLVMValueRef cg_buf(Cg *c, const Value *v);
/* Makes v one more buffer of the kernel being built, at ptr (a scratch
 * area laid out as v is), so that code addressing values through cg_buf
 * (and handing them to threads) can write there; cg_unbind_buffer drops
 * the last one bound, before the kernel ends. */
void cg_bind_buffer(Cg *c, const Value *v, LLVMValueRef ptr);
void cg_unbind_buffer(Cg *c);

/* ---- loops ---- */
typedef struct CgLoop {
    LLVMBasicBlockRef header, exit, preheader;
    LLVMValueRef iv;
} CgLoop;
/* for (iv = 0; iv < n; iv++) — returns iv (i64); body follows. */
LLVMValueRef cg_for(Cg *c, CgLoop *l, LLVMValueRef n);
void cg_for_end(Cg *c, CgLoop *l);

/* ---- values ---- */
LLVMValueRef cg_i64(Cg *c, int64_t x);
LLVMValueRef cg_f32(Cg *c, double x);
LLVMValueRef cg_add(Cg *c, LLVMValueRef a, LLVMValueRef b);        /* i64 */
LLVMValueRef cg_mul(Cg *c, LLVMValueRef a, int64_t k);             /* i64 a*k */
LLVMValueRef cg_mad(Cg *c, LLVMValueRef a, int64_t k, LLVMValueRef b); /* a*k+b */
/* Element idx of v as float32 (integers converted). */
LLVMValueRef cg_load(Cg *c, const Value *v, LLVMValueRef idx);
/* Element idx of v as i64 (integer buffers). */
LLVMValueRef cg_load_i(Cg *c, const Value *v, LLVMValueRef idx);
void cg_store(Cg *c, const Value *v, LLVMValueRef idx, LLVMValueRef x);
/* float32 math: "exp", "log", "tanh", "erf", "sqrt", "pow" (two
 * arguments), "fabs"; exp, tanh and erf inline (cg_vexp, ...), the others
 * intrinsics or libm. */
LLVMValueRef cg_math(Cg *c, const char *fn, LLVMValueRef x, LLVMValueRef y);
/* e^x, erf(x) and tanh(x) of a float32 or a vector of float32, as
 * straight-line code that vectorises: each lane gets the scalar's
 * operations, so the bits do not depend on the width (cg_math.c). */
LLVMValueRef cg_vexp(Cg *c, LLVMValueRef x);
LLVMValueRef cg_verf(Cg *c, LLVMValueRef x);
LLVMValueRef cg_vtanh(Cg *c, LLVMValueRef x);
LLVMValueRef cg_select_gt0(Cg *c, LLVMValueRef cond_x, LLVMValueRef a, LLVMValueRef b); /* x>0 ? a : b */
LLVMValueRef cg_max(Cg *c, LLVMValueRef a, LLVMValueRef b);
/* A stack slot in the current function's entry block. */
LLVMValueRef cg_alloca(Cg *c, LLVMTypeRef t);
/* A read-only array in the module holding `bytes` bytes of data (tables a
 * kernel computed at compile time), and element i of it as type t. */
LLVMValueRef cg_table(Cg *c, const void *data, size_t bytes);
LLVMValueRef cg_table_get(Cg *c, LLVMValueRef table, LLVMTypeRef t, LLVMValueRef i);
/* Element i of the integer buffer idx read as an index into an axis of
 * `len` elements, negative values counting from the end as ONNX's
 * indexing ops say: returns it in [0, len).  Any other value never reaches
 * memory: the program prints one line on stderr, "PROG: error: FILE: node
 * 'NAME' (OP): index V is out of range for axis A of size LEN", naming
 * node `who`, and exits with status 1 (under mpirun the job ends with it).
 * The check is one compare and a branch that is never taken in a correct
 * program.  A kernel using it names its node, so it keeps its own kernel
 * (OpDef.names_node). */
LLVMValueRef cg_checked_index(Cg *c, const Node *who, const Value *idx, LLVMValueRef i, int64_t axis, int64_t len);
/* Vector dot product of K contiguous floats of a and b. */
LLVMValueRef cg_dot(Cg *c, const Value *a, LLVMValueRef abase, const Value *b, LLVMValueRef bbase, int64_t K);
/* Sum over K contiguous floats of a (from abase) of a*b, a, a^2 or |a|,
 * vectorised with partial sums combined in a fixed order (b only for
 * CG_SUM_DOT). */
typedef enum { CG_SUM_PLAIN, CG_SUM_DOT, CG_SUM_SQUARES, CG_SUM_ABS } CgSumKind;
LLVMValueRef cg_row_sum(Cg *c, CgSumKind kind, const Value *a, LLVMValueRef abase, const Value *b,
                        LLVMValueRef bbase, int64_t K);
/* dst[dst_off + sum_j i_j*dst_strides[j]] = src[src_off + sum_j i_j*src_strides[j]]
 * for every index (i_0..i_rank-1) < dims: transposes, slices, broadcasts,
 * concatenation blocks. */
void cg_strided_copy(Cg *c, const Value *dst, int64_t dst_off, const int64_t *dst_strides, const Value *src,
                     int64_t src_off, const int64_t *src_strides, int rank, const int64_t *dims);
/* Fills n floats of v from index 0 with x. */
void cg_fill(Cg *c, const Value *v, int64_t n, LLVMValueRef x);
/* Copies v's bytes into w's buffer (same byte size). */
void cg_copy(Cg *c, const Value *dst, const Value *src);

/* ---- element-wise nests ---- */
/* out[i] = fn(in0[b0(i)], in1[b1(i)], ...) with numpy broadcasting of the
 * present inputs against output 0 (the op's channel_inputs read at each
 * element's channel instead, OpDef); inputs listed in order. */
typedef LLVMValueRef (*CgScalarFn)(Cg *c, const Node *n, LLVMValueRef *x);
bool cg_elementwise(Cg *c, const Node *n, CgScalarFn fn);
/* The op's channel_inputs renumbered over n's present inputs, in order. */
uint32_t cg_channel_inputs(const Node *n);
/* The broadcasting loop nest alone: loops over y's elements, and body
 * called once inside with y's element index and each input's (numpy
 * broadcasting of ins against y; bit i of `chan`: ins[i] has one value
 * per channel, y's axis 1).  cg_elementwise and fused chains use it. */
typedef void (*CgEwBody)(Cg *c, void *ctx, LLVMValueRef out_idx, const LLVMValueRef *in_idx);
void cg_ew_nest(Cg *c, const Value *y, int n_in, const Value *const *ins, uint32_t chan, CgEwBody body, void *ctx);
/* The same over the elements of y whose first index lies in [row0,
 * row0 + rows) (y of rank 1 or more). */
void cg_ew_nest_rows(Cg *c, const Value *y, LLVMValueRef row0, int64_t rows, int n_in, const Value *const *ins,
                     uint32_t chan, CgEwBody body, void *ctx);

/* ---- vectors over contiguous rows (cg_vec.c) ---- */
/* <w x float>; x splatted over w lanes (x of any scalar type). */
LLVMTypeRef cg_vtype(Cg *c, int w);
LLVMValueRef cg_vsplat(Cg *c, LLVMValueRef x, int w);
/* w floats of v from element idx, of which the first `lanes` are read
 * (masked; the others are fill's, or zero with fill NULL). */
LLVMValueRef cg_vload(Cg *c, const Value *v, LLVMValueRef idx, int w, int lanes, LLVMValueRef fill);
/* The first `lanes` lanes of x stored at element idx of v. */
void cg_vstore(Cg *c, const Value *v, LLVMValueRef idx, LLVMValueRef x, int lanes);
/* The sum or the maximum (NaN-propagating, cg_max) of x's lanes, combined
 * pairwise in an order fixed by the width (float or double lanes). */
LLVMValueRef cg_vsum(Cg *c, LLVMValueRef x);
LLVMValueRef cg_vmax(Cg *c, LLVMValueRef x);
/* A row of len floats a vector of w at a time: body(off, lanes) with the
 * element offset inside the row, lanes = w, then once with the rest (fewer
 * lanes) when w does not divide len. */
typedef void (*CgVecBody)(Cg *c, void *ctx, LLVMValueRef off, int lanes);
void cg_vrow(Cg *c, int64_t len, int w, CgVecBody body, void *ctx);
/* A stack slot holding init, for an accumulator carried across a loop. */
LLVMValueRef cg_vacc(Cg *c, LLVMValueRef init);

/* ---- epilogues ---- */
/* Work a kernel runs on its output 0 each time it finishes a block of it
 * (rows [row0, row0 + rows) of the first axis), while the block is still
 * in cache: a convolution runs the element-wise chain that follows it
 * this way (cg_fuse.c, OpDef.cg_blocks). */
typedef struct CgEpilogue {
    void (*fn)(Cg *c, void *ctx, LLVMValueRef row0, int64_t rows);
    void *ctx;
} CgEpilogue;
/* A reduction over input 0 of node n split in three, so that it can run
 * inside the kernel making that input, on each block of rows as it is
 * finished (cg_fuse.c): begin before the first block, rows on rows
 * [row0, row0 + rows) of the first axis, end after the last.  The blocks
 * come in row order, so the sums take the order of the node's own kernel
 * and the same bits.  takes(n) says whether node n's form has such a
 * split. */
typedef struct CgRows {
    bool (*takes)(const Node *n);
    void (*begin)(Cg *c, const Node *n);
    void (*rows)(Cg *c, const Node *n, LLVMValueRef row0, int64_t rows);
    void (*end)(Cg *c, const Node *n);
} CgRows;
/* Row decomposition of an axis: [outer, len, inner] of v around axis. */
void cg_axis_split(const Value *v, int axis, int64_t *outer, int64_t *len, int64_t *inner);

/* ---- module ---- */
typedef struct CgOptions {
    const char *target_cpu;  /* NULL: the host's */
    const char *emit;        /* "exe", "obj" or "llvm" */
    const char *output;
    const char *model_path;  /* embedded for --save */
    const char *meta_json;   /* embedded program description */
    const char *passes;      /* LLVM pass pipeline; NULL: "default<O3>" (tests
                                use O1 to compile hundreds of models quickly) */
    bool verbose;
    bool no_fuse;            /* every node runs its own kernel (tests compare) */
} CgOptions;

bool cg_compile_plan(const Plan *p, const CgOptions *o, Diag *d);

/* The same in steps: build the module, then emit it, or run it in this
 * process (tests): the JIT resolves cleave_train_step, cleave_eval_step,
 * cleave_init, ... by name. */
typedef struct CgModule CgModule;
typedef struct CgJit CgJit;
CgModule *cg_build(const Plan *p, const CgOptions *o, Diag *d);
bool cg_emit(CgModule *m, const CgOptions *o, Diag *d);
void cg_module_free(CgModule *m);
CgJit *cg_jit(CgModule *m, Diag *d); /* takes the module's code */
void *cg_jit_lookup(CgJit *j, const char *name, Diag *d);
void cg_jit_free(CgJit *j);
/* Links obj into the executable out with the runtime; `shown` is the
 * path the user gave (out being its temporary), for messages.  The
 * linker's own output is kept from the terminal: a failure is one line
 * quoting its first error. */
bool cg_link(const char *obj, const char *out, const char *shown, Diag *d);

#endif
