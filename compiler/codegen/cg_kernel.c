/* cg_kernel.c - kernel scaffolding, loops, loads and stores, and the
 * broadcasting element-wise loop nest shared by every element-wise op. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cg.h"
#include "../ops/ops.h"
#include "../plan/pipeline.h"

/* Whether two buffers of node n's kernel may be the same bytes in some
 * call: a node runs once per micro-batch, each time on that micro-batch's
 * instances, and its kernel is shared by every call. */
bool cg_may_share(const Cg *c, const Node *n, const Value *a, const Value *b) {
    const Plan *p = c->plan;
    for (int r = 0; r < p->n_stages; r++) {
        const RankPlan *rp = plan_stage_rank(p, r);
        for (int pass = 0; pass < 2; pass++) {
            const PlanStep *st = pass ? rp->eval : rp->train;
            int n_st = pass ? rp->n_eval : rp->n_train;
            for (int i = 0; i < n_st; i++)
                if (st[i].kind == STEP_COMPUTE && st[i].node == n &&
                    pipeline_buffer(p, rp, a, st[i].micro) == pipeline_buffer(p, rp, b, st[i].micro))
                    return true;
        }
    }
    return false;
}

/* Whether buffers a and b of node n's kernel are the same bytes (same
 * offset and size) in every call of it. */
bool cg_always_same(const Cg *c, const Node *n, const Value *a, const Value *b) {
    if (plan_value_bytes(a) != plan_value_bytes(b)) return false;
    const Plan *p = c->plan;
    int calls = 0;
    for (int r = 0; r < p->n_stages; r++) {
        const RankPlan *rp = plan_stage_rank(p, r);
        for (int pass = 0; pass < 2; pass++) {
            const PlanStep *st = pass ? rp->eval : rp->train;
            int n_st = pass ? rp->n_eval : rp->n_train;
            for (int i = 0; i < n_st; i++) {
                if (st[i].kind != STEP_COMPUTE || st[i].node != n) continue;
                int64_t oa = pipeline_buffer(p, rp, a, st[i].micro);
                if (oa < 0 || oa != pipeline_buffer(p, rp, b, st[i].micro)) return false;
                calls++;
            }
        }
    }
    return calls > 0;
}

bool cg_kernel_begin_as(Cg *c, CgKernel *k, const char *name, const Node *n, int n_bufs, const Value *const *bufs,
                        const bool *shared, const int *alias) {
    if (n_bufs > CG_MAX_BUFS)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): more than %d inputs and outputs are not compiled",
                          c->g->path, n->name, n->op_type, CG_MAX_BUFS);
    k->n_bufs = n_bufs;
    LLVMTypeRef params[CG_MAX_BUFS];
    for (int i = 0; i < n_bufs; i++) {
        k->bufs[i] = bufs[i];
        params[i] = c->t_ptr;
    }
    LLVMTypeRef fty = LLVMFunctionType(c->t_void, params, (unsigned)n_bufs, 0);
    k->fn = LLVMAddFunction(c->mod, name, fty);
    LLVMSetLinkage(k->fn, LLVMInternalLinkage);
    /* A kernel runs long enough that a call costs nothing, and inlining
     * every kernel into one step function made the optimiser's and code
     * generator's work grow with the model rather than with its distinct
     * kernels (cg_share.c). */
    LLVMAddAttributeAtIndex(k->fn, LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(c->ctx, LLVMGetEnumAttributeKindForName("noinline", 8), 0));
    /* Distinct buffers never overlap: tell LLVM so it can vectorise. */
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    for (int i = 0; i < n_bufs; i++) {
        if (!shared[i])
            LLVMAddAttributeAtIndex(k->fn, (unsigned)i + 1, LLVMCreateEnumAttribute(c->ctx, noalias, 0));
        c->args[i] = LLVMGetParam(k->fn, (unsigned)i);
    }
    /* A buffer that is another's bytes in every call (an element-wise
     * result computed in place) is addressed through the other's
     * pointer: with one base for the load and the store of element i,
     * LLVM's loop vectorizer sees that they meet only within an iteration,
     * where with two pointers its run-time overlap check sent every
     * in-place call to the scalar loop. */
    for (int i = 0; alias && i < n_bufs; i++)
        if (alias[i] >= 0) c->args[i] = c->args[alias[i]];
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c->ctx, k->fn, "entry");
    LLVMPositionBuilderAtEnd(c->b, entry);
    c->node = n;
    c->cur = k;
    return true;
}

bool cg_kernel_begin(Cg *c, const Node *n, int n_bufs, const Value *const *bufs) {
    if (n_bufs > CG_MAX_BUFS) return diag_error(c->d, DIAG_INTERNAL, "node '%s': too many buffers", n->name);
    bool shared[CG_MAX_BUFS];
    int alias[CG_MAX_BUFS];
    for (int i = 0; i < n_bufs; i++) {
        shared[i] = false;
        alias[i] = -1;
        for (int j = 0; j < n_bufs; j++)
            if (j != i && (bufs[j] == bufs[i] || cg_may_share(c, n, bufs[i], bufs[j]))) shared[i] = true;
        for (int j = 0; j < i && alias[i] < 0; j++)
            if (bufs[j] != bufs[i] && cg_always_same(c, n, bufs[i], bufs[j])) alias[i] = j;
    }
    char name[64];
    snprintf(name, sizeof name, "k%d_%s%s", n->id, n->op_type, c->eval_form ? "_eval" : "");
    CgKernel *k = c->eval_form ? &c->eval_kernels[n->id] : &c->kernels[n->id];
    return cg_kernel_begin_as(c, k, name, n, n_bufs, bufs, shared, alias);
}

bool cg_kernel_begin_io(Cg *c, const Node *n) {
    const Value *bufs[CG_MAX_BUFS];
    int nb = 0;
    for (int i = 0; i < n->n_in + n->n_out; i++) {
        const Value *v = i < n->n_in ? n->in[i] : n->out[i - n->n_in];
        if (!v) continue;
        if (nb == CG_MAX_BUFS)
            return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): more than %d inputs and outputs are not "
                              "compiled", c->g->path, n->name, n->op_type, CG_MAX_BUFS);
        bufs[nb++] = v;
    }
    return cg_kernel_begin(c, n, nb, bufs);
}

void cg_kernel_end(Cg *c) {
    LLVMBuildRetVoid(c->b);
    c->node = NULL;
    c->cur = NULL;
}

LLVMValueRef cg_buf(Cg *c, const Value *v) {
    for (int i = 0; i < c->cur->n_bufs; i++)
        if (c->cur->bufs[i] == v) return c->args[i];
    diag_error(c->d, DIAG_INTERNAL, "kernel of '%s' reads '%s' without a buffer", c->node->name, v->name);
    return LLVMGetUndef(c->t_ptr);
}

void cg_bind_buffer(Cg *c, const Value *v, LLVMValueRef ptr) {
    CLEAVE_CHECK(c->cur->n_bufs < CG_MAX_BUFS, "kernel of '%s': no room to bind '%s'", c->node->name, v->name);
    c->cur->bufs[c->cur->n_bufs] = v;
    c->args[c->cur->n_bufs++] = ptr;
}

void cg_unbind_buffer(Cg *c) { c->cur->n_bufs--; }

LLVMValueRef cg_for(Cg *c, CgLoop *l, LLVMValueRef n) {
    LLVMValueRef fn = LLVMGetBasicBlockParent(LLVMGetInsertBlock(c->b));
    l->preheader = LLVMGetInsertBlock(c->b);
    l->header = LLVMAppendBasicBlockInContext(c->ctx, fn, "loop");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(c->ctx, fn, "body");
    l->exit = LLVMAppendBasicBlockInContext(c->ctx, fn, "done");
    LLVMBuildBr(c->b, l->header);
    LLVMPositionBuilderAtEnd(c->b, l->header);
    l->iv = LLVMBuildPhi(c->b, c->t_i64, "i");
    LLVMValueRef zero = cg_i64(c, 0);
    LLVMAddIncoming(l->iv, &zero, &l->preheader, 1);
    LLVMValueRef more = LLVMBuildICmp(c->b, LLVMIntSLT, l->iv, n, "");
    LLVMBuildCondBr(c->b, more, body, l->exit);
    LLVMPositionBuilderAtEnd(c->b, body);
    return l->iv;
}

void cg_for_end(Cg *c, CgLoop *l) {
    LLVMValueRef next = LLVMBuildNUWAdd(c->b, l->iv, cg_i64(c, 1), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(c->b);
    LLVMBuildBr(c->b, l->header);
    LLVMAddIncoming(l->iv, &next, &latch, 1);
    LLVMPositionBuilderAtEnd(c->b, l->exit);
}

LLVMValueRef cg_i64(Cg *c, int64_t x) { return LLVMConstInt(c->t_i64, (unsigned long long)x, 1); }
LLVMValueRef cg_f32(Cg *c, double x) { return LLVMConstReal(c->t_f32, x); }
LLVMValueRef cg_add(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildNSWAdd(c->b, a, b, ""); }
LLVMValueRef cg_mul(Cg *c, LLVMValueRef a, int64_t k) {
    return k == 1 ? a : LLVMBuildNSWMul(c->b, a, cg_i64(c, k), "");
}
LLVMValueRef cg_mad(Cg *c, LLVMValueRef a, int64_t k, LLVMValueRef b) { return cg_add(c, cg_mul(c, a, k), b); }

static LLVMTypeRef elem_type(Cg *c, const Value *v) {
    if (dtype_is_float(v->dtype)) return c->t_f32;
    return plan_value_bytes(v) == value_numel(v) ? c->t_i8 : c->t_i64;
}

static LLVMValueRef elem_ptr(Cg *c, const Value *v, LLVMValueRef idx) {
    LLVMValueRef base = cg_buf(c, v);
    return LLVMBuildInBoundsGEP2(c->b, elem_type(c, v), base, &idx, 1, "");
}

/* Integer types whose stored bits read as unsigned (bool is 0 or 1). */
static bool unsigned_int(DType t) {
    return t == DT_BOOL || t == DT_UINT8 || t == DT_UINT16 || t == DT_UINT32 || t == DT_UINT64;
}

LLVMValueRef cg_load(Cg *c, const Value *v, LLVMValueRef idx) {
    LLVMTypeRef t = elem_type(c, v);
    LLVMValueRef x = LLVMBuildLoad2(c->b, t, elem_ptr(c, v, idx), "");
    if (t == c->t_f32) return x;
    /* one-byte buffers hold bool and uint8 unsigned; uint64 uses all bits */
    if ((t == c->t_i8 && unsigned_int(v->dtype)) || v->dtype == DT_UINT64)
        return LLVMBuildUIToFP(c->b, x, c->t_f32, "");
    return LLVMBuildSIToFP(c->b, x, c->t_f32, "");
}

LLVMValueRef cg_load_i(Cg *c, const Value *v, LLVMValueRef idx) {
    LLVMTypeRef t = elem_type(c, v);
    LLVMValueRef x = LLVMBuildLoad2(c->b, t, elem_ptr(c, v, idx), "");
    if (t == c->t_i64) return x;
    if (t == c->t_f32) return LLVMBuildFPToSI(c->b, x, c->t_i64, "");
    if (unsigned_int(v->dtype)) return LLVMBuildZExt(c->b, x, c->t_i64, "");
    return LLVMBuildSExt(c->b, x, c->t_i64, "");
}

/* x (float32) rounded to the nearest float16 (ties to even), as float32:
 * the arena keeps float16 values in float32, so every store of one rounds
 * as float16 arithmetic would. */
static LLVMValueRef round_to_f16(Cg *c, LLVMValueRef x) {
    LLVMTypeRef i32 = c->t_i32;
    /* normal range: keep 10 of the 23 mantissa bits, rounding to even */
    LLVMValueRef bits = LLVMBuildBitCast(c->b, x, i32, "");
    LLVMValueRef odd = LLVMBuildAnd(c->b, LLVMBuildLShr(c->b, bits, LLVMConstInt(i32, 13, 0), ""),
                                    LLVMConstInt(i32, 1, 0), "");
    LLVMValueRef r = LLVMBuildAdd(c->b, bits, LLVMBuildAdd(c->b, odd, LLVMConstInt(i32, 0xFFF, 0), ""), "");
    r = LLVMBuildAnd(c->b, r, LLVMConstInt(i32, ~0x1FFFu, 0), "");
    LLVMValueRef normal = LLVMBuildBitCast(c->b, r, c->t_f32, "");
    /* subnormal range (|x| < 2^-14): multiples of 2^-24 */
    LLVMValueRef rint = LLVMGetNamedFunction(c->mod, "llvm.rint.f32");
    LLVMTypeRef fty = LLVMFunctionType(c->t_f32, &c->t_f32, 1, 0);
    if (!rint) rint = LLVMAddFunction(c->mod, "llvm.rint.f32", fty);
    LLVMValueRef scaled = LLVMBuildFMul(c->b, x, cg_f32(c, 16777216.0), "");
    LLVMValueRef sub = LLVMBuildCall2(c->b, fty, rint, &scaled, 1, "");
    sub = LLVMBuildFMul(c->b, sub, cg_f32(c, 1.0 / 16777216.0), "");
    LLVMValueRef ax = cg_math(c, "fabs", x, NULL);
    LLVMValueRef y = LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealOLT, ax, cg_f32(c, 1.0 / 16384.0), ""), sub,
                                     normal, "");
    /* from 65520 on, float16 rounds to infinity; NaN stays NaN */
    LLVMValueRef inf = LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealOLT, x, cg_f32(c, 0), ""),
                                       cg_f32(c, -INFINITY), cg_f32(c, INFINITY), "");
    y = LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealOGE, ax, cg_f32(c, 65520.0), ""), inf, y, "");
    return LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealUNO, x, x, ""), x, y, "");
}

/* x rounded to the nearest bfloat16 (ties to even), as float32. */
static LLVMValueRef round_to_bf16(Cg *c, LLVMValueRef x) {
    LLVMTypeRef i32 = c->t_i32;
    LLVMValueRef bits = LLVMBuildBitCast(c->b, x, i32, "");
    LLVMValueRef odd = LLVMBuildAnd(c->b, LLVMBuildLShr(c->b, bits, LLVMConstInt(i32, 16, 0), ""),
                                    LLVMConstInt(i32, 1, 0), "");
    LLVMValueRef r = LLVMBuildAdd(c->b, bits, LLVMBuildAdd(c->b, odd, LLVMConstInt(i32, 0x7FFF, 0), ""), "");
    r = LLVMBuildAnd(c->b, r, LLVMConstInt(i32, 0xFFFF0000u, 0), "");
    LLVMValueRef y = LLVMBuildBitCast(c->b, r, c->t_f32, "");
    return LLVMBuildSelect(c->b, LLVMBuildFCmp(c->b, LLVMRealUNO, x, x, ""), x, y, "");
}

/* An int64 reduced to the values of the declared integer type (two's
 * complement wrap-around, as numpy casts), kept in an int64. */
static LLVMValueRef wrap_int(Cg *c, LLVMValueRef x, DType t) {
    unsigned bits = t == DT_INT8 || t == DT_UINT8 ? 8 : t == DT_INT16 || t == DT_UINT16 ? 16
                    : t == DT_INT32 || t == DT_UINT32 ? 32 : 64;
    if (bits == 64) return x;
    LLVMValueRef n = LLVMBuildTrunc(c->b, x, LLVMIntTypeInContext(c->ctx, bits), "");
    return unsigned_int(t) ? LLVMBuildZExt(c->b, n, c->t_i64, "") : LLVMBuildSExt(c->b, n, c->t_i64, "");
}

/* Stores convert to the buffer's element type as ONNX's Cast does: floats
 * to integers truncate toward zero, anything to bool tests for nonzero,
 * integers wrap to their declared width, float16 and bfloat16 round to
 * their precision.  Integer values of other widths (i1, i8, i32) are taken
 * as signed. */
void cg_store(Cg *c, const Value *v, LLVMValueRef idx, LLVMValueRef x) {
    LLVMTypeRef t = elem_type(c, v);
    LLVMTypeRef xt = LLVMTypeOf(x);
    if (t == c->t_f32) {
        if (xt != c->t_f32) x = LLVMBuildSIToFP(c->b, x, t, "");
        if (v->dtype == DT_FLOAT16) x = round_to_f16(c, x);
        else if (v->dtype == DT_BFLOAT16) x = round_to_bf16(c, x);
    } else if (v->dtype == DT_BOOL) {
        LLVMValueRef nz = xt == c->t_f32 ? LLVMBuildFCmp(c->b, LLVMRealUNE, x, cg_f32(c, 0), "")
                                         : LLVMBuildICmp(c->b, LLVMIntNE, x, LLVMConstNull(xt), "");
        x = LLVMBuildZExt(c->b, nz, t, "");
    } else {
        if (xt == c->t_f32) x = LLVMBuildFPToSI(c->b, x, c->t_i64, "");
        else if (xt != c->t_i64) x = LLVMBuildIntCast2(c->b, x, c->t_i64, 1, "");
        x = wrap_int(c, x, v->dtype);
        if (t != c->t_i64) x = LLVMBuildTrunc(c->b, x, t, "");
    }
    LLVMBuildStore(c->b, x, elem_ptr(c, v, idx));
}

static LLVMValueRef declare_math(Cg *c, const char *name, int arity) {
    LLVMValueRef f = LLVMGetNamedFunction(c->mod, name);
    if (f) return f;
    LLVMTypeRef ps[2] = {c->t_f32, c->t_f32};
    f = LLVMAddFunction(c->mod, name, LLVMFunctionType(c->t_f32, ps, (unsigned)arity, 0));
    return f;
}

LLVMValueRef cg_math(Cg *c, const char *fn, LLVMValueRef x, LLVMValueRef y) {
    /* exp, tanh and erf inline, since a call to libm keeps the loop around
     * it scalar (cg_math.c); intrinsics where LLVM has them (they
     * vectorise); libm otherwise. */
    if (strcmp(fn, "exp") == 0) return cg_vexp(c, x);
    if (strcmp(fn, "tanh") == 0) return cg_vtanh(c, x);
    if (strcmp(fn, "erf") == 0) return cg_verf(c, x);
    static const struct { const char *op, *sym; int arity; } table[] = {
        {"sqrt", "llvm.sqrt.f32", 1}, {"fabs", "llvm.fabs.f32", 1}, {"log", "logf", 1}, {"pow", "powf", 2},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strcmp(table[i].op, fn)) continue;
        LLVMValueRef f = declare_math(c, table[i].sym, table[i].arity);
        LLVMTypeRef ps[2] = {c->t_f32, c->t_f32};
        LLVMValueRef args[2] = {x, y};
        return LLVMBuildCall2(c->b, LLVMFunctionType(c->t_f32, ps, (unsigned)table[i].arity, 0), f, args,
                              (unsigned)table[i].arity, "");
    }
    diag_error(c->d, DIAG_INTERNAL, "unknown math function %s", fn);
    return x;
}

LLVMValueRef cg_select_gt0(Cg *c, LLVMValueRef cond_x, LLVMValueRef a, LLVMValueRef b) {
    LLVMValueRef gt = LLVMBuildFCmp(c->b, LLVMRealOGT, cond_x, cg_f32(c, 0), "");
    return LLVMBuildSelect(c->b, gt, a, b, "");
}

LLVMValueRef cg_max(Cg *c, LLVMValueRef a, LLVMValueRef b) {
    /* NaN-propagating max, as torch.max and numpy.maximum: a NaN in either
     * operand gives NaN (a > b, or a is NaN: a; else b, NaN or not) */
    LLVMValueRef gt = LLVMBuildFCmp(c->b, LLVMRealOGT, a, b, "");
    LLVMValueRef nan = LLVMBuildFCmp(c->b, LLVMRealUNO, a, a, "");
    return LLVMBuildSelect(c->b, LLVMBuildOr(c->b, gt, nan, ""), a, b, "");
}

void cg_fill(Cg *c, const Value *v, int64_t n, LLVMValueRef x) {
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, n));
    cg_store(c, v, i, x);
    cg_for_end(c, &l);
}

void cg_copy(Cg *c, const Value *dst, const Value *src) {
    int64_t bytes = plan_value_bytes(src);
    LLVMBuildMemCpy(c->b, cg_buf(c, dst), 16, cg_buf(c, src), 16, cg_i64(c, bytes));
}

void cg_axis_split(const Value *v, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = *inner = 1;
    for (int j = 0; j < axis; j++) *outer *= v->dims[j].k;
    *len = v->dims[axis].k;
    for (int j = axis + 1; j < v->rank; j++) *inner *= v->dims[j].k;
}

/* Element-wise nest.  The output's dims are walked with one loop each,
 * after merging neighbouring dims that every input either spans fully or
 * broadcasts over alike; each input's index is the sum of loop counters
 * times its strides (0 along broadcast dims).
 *
 * When every input is an integer (or bool) tensor, the scalar function
 * receives the elements as i64 (cg_load_i) and must build integer
 * instructions, so int64 arithmetic stays exact; otherwise it receives
 * float32 (cg_load).  Its result is converted by cg_store. */
void cg_ew_nest(Cg *c, const Value *y, int n_in, const Value *const *ins, uint32_t chan, CgEwBody body, void *ctx) {
    if (y->rank == 0) {
        LLVMValueRef zero[CG_MAX_BUFS];
        for (int i = 0; i < n_in; i++) zero[i] = cg_i64(c, 0);
        body(c, ctx, cg_i64(c, 0), zero);
        return;
    }
    cg_ew_nest_rows(c, y, cg_i64(c, 0), y->dims[0].k, n_in, ins, chan, body, ctx);
}

void cg_ew_nest_rows(Cg *c, const Value *y, LLVMValueRef row0, int64_t rows, int n_in, const Value *const *ins,
                     uint32_t chan, CgEwBody body, void *ctx) {
    enum { MAXIN = CG_MAX_BUFS };
    int r = y->rank;
    /* strides[i][j]: input i's stride along output dim j */
    int64_t strides[MAXIN][MAX_RANK], ydims[MAX_RANK];
    for (int j = 0; j < r; j++) ydims[j] = y->dims[j].k;
    for (int i = 0; i < n_in; i++) {
        int64_t s = 1;
        if (chan >> i & 1) { /* one value per channel: stride 1 along axis 1 alone */
            for (int j = 0; j < r; j++) strides[i][j] = j == 1 && ydims[1] > 1 ? 1 : 0;
            continue;
        }
        for (int j = r - 1; j >= 0; j--) {
            int ij = j - (r - ins[i]->rank);
            int64_t dk = ij >= 0 ? ins[i]->dims[ij].k : 1;
            strides[i][j] = dk == 1 ? 0 : s;
            s *= dk;
        }
    }
    /* merge dim j into j+1 when every input's strides are compatible */
    int64_t md[MAX_RANK], ms[MAXIN][MAX_RANK];
    int mr = 0;
    for (int j = 0; j < r; j++) {
        bool merge = mr > 0;
        for (int i = 0; i < n_in && merge; i++)
            merge = ms[i][mr - 1] == strides[i][j] * ydims[j];
        if (merge) {
            md[mr - 1] *= ydims[j];
            for (int i = 0; i < n_in; i++) ms[i][mr - 1] = strides[i][j];
        } else {
            md[mr] = ydims[j];
            for (int i = 0; i < n_in; i++) ms[i][mr] = strides[i][j];
            mr++;
        }
    }
    CgLoop loops[MAX_RANK];
    LLVMValueRef out_idx = cg_i64(c, 0), in_idx[MAXIN];
    for (int i = 0; i < n_in; i++) in_idx[i] = cg_i64(c, 0);
    for (int j = 0; j < mr; j++) {
        LLVMValueRef iv;
        if (j == 0) { /* the rows asked for: dims merged into the first scale them */
            int64_t inner = ydims[0] ? md[0] / ydims[0] : 0;
            iv = cg_add(c, cg_mul(c, row0, inner), cg_for(c, &loops[0], cg_i64(c, rows * inner)));
        } else {
            iv = cg_for(c, &loops[j], cg_i64(c, md[j]));
        }
        out_idx = cg_mad(c, out_idx, md[j], iv);
        for (int i = 0; i < n_in; i++)
            if (ms[i][j]) in_idx[i] = cg_add(c, in_idx[i], cg_mul(c, iv, ms[i][j]));
    }
    body(c, ctx, out_idx, in_idx);
    for (int j = mr - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
}

typedef struct EwOne {
    const Node *n;
    CgScalarFn fn;
    int n_in;
    const Value *const *ins;
    bool ints;
} EwOne;

static void ew_one_body(Cg *c, void *ctx, LLVMValueRef out_idx, const LLVMValueRef *in_idx) {
    EwOne *e = ctx;
    LLVMValueRef x[CG_MAX_BUFS];
    for (int i = 0; i < e->n_in; i++)
        x[i] = e->ints ? cg_load_i(c, e->ins[i], in_idx[i]) : cg_load(c, e->ins[i], in_idx[i]);
    cg_store(c, e->n->out[0], out_idx, e->fn(c, e->n, x));
}

uint32_t cg_channel_inputs(const Node *n) {
    uint32_t bits = 0;
    int k = 0;
    for (int i = 0; i < n->n_in; i++) {
        if (!n->in[i]) continue;
        if (n->def && (n->def->channel_inputs >> i & 1)) bits |= 1u << k;
        k++;
    }
    return bits;
}

bool cg_elementwise(Cg *c, const Node *n, CgScalarFn fn) {
    enum { MAXIN = CG_MAX_BUFS - 1 };
    const Value *ins[MAXIN];
    int n_in = 0;
    for (int i = 0; i < n->n_in; i++) {
        if (!n->in[i]) continue;
        if (n_in == MAXIN)
            return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): more than %d inputs are not compiled",
                              c->g->path, n->name, n->op_type, MAXIN);
        ins[n_in++] = n->in[i];
    }
    bool ints = n_in > 0;
    for (int i = 0; i < n_in; i++)
        if (!dtype_is_int(ins[i]->dtype)) ints = false;
    if (!cg_kernel_begin_io(c, n)) return false;
    EwOne e = {n, fn, n_in, ins, ints};
    cg_ew_nest(c, n->out[0], n_in, ins, cg_channel_inputs(n), ew_one_body, &e);
    cg_kernel_end(c);
    return true;
}

LLVMValueRef cg_alloca(Cg *c, LLVMTypeRef t) {
    /* Allocas belong in the entry block, where mem2reg promotes them and
     * loops do not grow the stack. */
    LLVMValueRef fn = LLVMGetBasicBlockParent(LLVMGetInsertBlock(c->b));
    LLVMBasicBlockRef entry = LLVMGetEntryBasicBlock(fn);
    LLVMBuilderRef tb = LLVMCreateBuilderInContext(c->ctx);
    LLVMValueRef first = LLVMGetFirstInstruction(entry);
    if (first) LLVMPositionBuilderBefore(tb, first);
    else LLVMPositionBuilderAtEnd(tb, entry);
    LLVMValueRef a = LLVMBuildAlloca(tb, t, "");
    LLVMDisposeBuilder(tb);
    return a;
}

LLVMValueRef cg_table(Cg *c, const void *data, size_t bytes) {
    LLVMValueRef init = LLVMConstStringInContext(c->ctx, data, (unsigned)bytes, 1);
    LLVMValueRef gv = LLVMAddGlobal(c->mod, LLVMTypeOf(init), "table");
    LLVMSetInitializer(gv, init);
    LLVMSetGlobalConstant(gv, 1);
    LLVMSetLinkage(gv, LLVMPrivateLinkage);
    LLVMSetUnnamedAddr(gv, 1);
    LLVMSetAlignment(gv, 8);
    return gv;
}

LLVMValueRef cg_table_get(Cg *c, LLVMValueRef table, LLVMTypeRef t, LLVMValueRef i) {
    return LLVMBuildLoad2(c->b, t, LLVMBuildInBoundsGEP2(c->b, t, table, &i, 1, ""), "");
}

static void add_fn_attr(Cg *c, LLVMValueRef fn, const char *name) {
    unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(c->ctx, kind, 0));
}

/* The module's one reporter of bad indices:
 *   cleave.index_error(file, node, op, index, axis, len)
 * prints the line cg_checked_index promises and exits with status 1.  It
 * uses libc alone (dprintf, exit and glibc's name of the program, which is
 * argv[0]'s last component, as the runtime's own messages use): the
 * runtime's ABI (runtime/rt_abi.h) has no error call, and the programs
 * tests run in-process through the JIT have no runtime at all.  dprintf
 * writes straight to the descriptor, so the line is out before exit
 * flushes the runtime's buffered output. */
static LLVMValueRef index_error_fn(Cg *c, LLVMTypeRef *fty) {
    LLVMTypeRef ps[6] = {c->t_ptr, c->t_ptr, c->t_ptr, c->t_i64, c->t_i64, c->t_i64};
    *fty = LLVMFunctionType(c->t_void, ps, 6, 0);
    LLVMValueRef f = LLVMGetNamedFunction(c->mod, "cleave.index_error");
    if (f) return f;
    f = LLVMAddFunction(c->mod, "cleave.index_error", *fty);
    LLVMSetLinkage(f, LLVMInternalLinkage);
    add_fn_attr(c, f, "noreturn");
    add_fn_attr(c, f, "cold");
    add_fn_attr(c, f, "noinline");
    LLVMBuilderRef b = LLVMCreateBuilderInContext(c->ctx);
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(c->ctx, f, "entry"));
    LLVMValueRef prog = LLVMGetNamedGlobal(c->mod, "program_invocation_short_name");
    if (!prog) prog = LLVMAddGlobal(c->mod, c->t_ptr, "program_invocation_short_name");
    LLVMTypeRef pf[2] = {c->t_i32, c->t_ptr};
    LLVMTypeRef printf_ty = LLVMFunctionType(c->t_i32, pf, 2, 1);
    LLVMValueRef dprintf_fn = LLVMGetNamedFunction(c->mod, "dprintf");
    if (!dprintf_fn) dprintf_fn = LLVMAddFunction(c->mod, "dprintf", printf_ty);
    LLVMValueRef args[9] = {
        LLVMConstInt(c->t_i32, 2, 0),
        LLVMBuildGlobalStringPtr(b, "%s: error: %s: node '%s' (%s): index %lld is out of range for axis %lld of size "
                                    "%lld\n", "index_error_fmt"),
        LLVMBuildLoad2(b, c->t_ptr, prog, "")};
    for (unsigned i = 0; i < 6; i++) args[3 + i] = LLVMGetParam(f, i);
    LLVMBuildCall2(b, printf_ty, dprintf_fn, args, 9, "");
    LLVMTypeRef exit_ty = LLVMFunctionType(c->t_void, &c->t_i32, 1, 0);
    LLVMValueRef exit_fn = LLVMGetNamedFunction(c->mod, "exit");
    if (!exit_fn) {
        exit_fn = LLVMAddFunction(c->mod, "exit", exit_ty);
        add_fn_attr(c, exit_fn, "noreturn");
    }
    LLVMValueRef one = LLVMConstInt(c->t_i32, 1, 0);
    LLVMBuildCall2(b, exit_ty, exit_fn, &one, 1, "");
    LLVMBuildUnreachable(b);
    LLVMDisposeBuilder(b);
    return f;
}

LLVMValueRef cg_checked_index(Cg *c, const Node *who, const Value *idx, LLVMValueRef i, int64_t axis, int64_t len) {
    LLVMValueRef v = cg_load_i(c, idx, i);
    /* v in [-len, len) exactly when v + len, wrapping, read unsigned, is
     * below 2 len: one compare for both ends, and no overflow trap */
    LLVMValueRef shifted = LLVMBuildAdd(c->b, v, cg_i64(c, len), "");
    LLVMValueRef ok = LLVMBuildICmp(c->b, LLVMIntULT, shifted, cg_i64(c, 2 * len), "");
    LLVMValueRef fn = LLVMGetBasicBlockParent(LLVMGetInsertBlock(c->b));
    LLVMBasicBlockRef bad = LLVMAppendBasicBlockInContext(c->ctx, fn, "bad_index");
    LLVMBasicBlockRef good = LLVMAppendBasicBlockInContext(c->ctx, fn, "index_ok");
    LLVMBuildCondBr(c->b, ok, good, bad);
    LLVMPositionBuilderAtEnd(c->b, bad);
    LLVMTypeRef fty;
    LLVMValueRef report = index_error_fn(c, &fty);
    LLVMValueRef args[6] = {LLVMBuildGlobalStringPtr(c->b, c->g->path ? c->g->path : "model", ""),
                            LLVMBuildGlobalStringPtr(c->b, who->name ? who->name : "", ""),
                            LLVMBuildGlobalStringPtr(c->b, who->op_type, ""), v, cg_i64(c, axis), cg_i64(c, len)};
    LLVMBuildCall2(c->b, fty, report, args, 6, "");
    LLVMBuildUnreachable(c->b);
    LLVMPositionBuilderAtEnd(c->b, good);
    LLVMValueRef neg = LLVMBuildICmp(c->b, LLVMIntSLT, v, cg_i64(c, 0), "");
    return LLVMBuildSelect(c->b, neg, shifted, v, "");
}

/* Term k of a row sum: a[k] * b[k], a[k], a[k]^2 or |a[k]| (vectors or
 * scalars alike). */
static LLVMValueRef sum_term(Cg *c, CgSumKind kind, LLVMValueRef a, LLVMValueRef b) {
    switch (kind) {
    case CG_SUM_DOT: return LLVMBuildFMul(c->b, a, b, "");
    case CG_SUM_SQUARES: return LLVMBuildFMul(c->b, a, a, "");
    case CG_SUM_ABS: {
        LLVMTypeRef t = LLVMTypeOf(a);
        char name[32];
        snprintf(name, sizeof name, "llvm.fabs.%s", LLVMGetTypeKind(t) == LLVMVectorTypeKind ? "v8f32" : "f32");
        LLVMValueRef f = LLVMGetNamedFunction(c->mod, name);
        LLVMTypeRef fty = LLVMFunctionType(t, &t, 1, 0);
        if (!f) f = LLVMAddFunction(c->mod, name, fty);
        return LLVMBuildCall2(c->b, fty, f, &a, 1, "");
    }
    default: return a;
    }
}

/* The row sum with 8-wide vector partial sums combined in a fixed order
 * (pairwise over the lanes, then the scalar tail), so the result depends
 * on nothing but K: vectorised, and the same bits on every run. */
LLVMValueRef cg_row_sum(Cg *c, CgSumKind kind, const Value *a, LLVMValueRef abase, const Value *b,
                        LLVMValueRef bbase, int64_t K) {
    enum { W = 8 };
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, W);
    LLVMValueRef acc = cg_alloca(c, vt), tail = cg_alloca(c, c->t_f32);
    LLVMBuildStore(c->b, LLVMConstNull(vt), acc);
    LLVMBuildStore(c->b, cg_f32(c, 0), tail);
    int64_t kv = K / W;
    if (kv > 0) {
        CgLoop l;
        LLVMValueRef i = cg_for(c, &l, cg_i64(c, kv));
        LLVMValueRef off = cg_mul(c, i, W);
        LLVMValueRef ia = cg_add(c, abase, off);
        LLVMValueRef pa = LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, a), &ia, 1, "");
        LLVMValueRef va = LLVMBuildLoad2(c->b, vt, pa, ""), vb = NULL;
        LLVMSetAlignment(va, 4);
        if (kind == CG_SUM_DOT) {
            LLVMValueRef ib = cg_add(c, bbase, off);
            LLVMValueRef pb = LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, b), &ib, 1, "");
            vb = LLVMBuildLoad2(c->b, vt, pb, "");
            LLVMSetAlignment(vb, 4);
        }
        LLVMValueRef sum = LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, vt, acc, ""), sum_term(c, kind, va, vb), "");
        LLVMBuildStore(c->b, sum, acc);
        cg_for_end(c, &l);
    }
    if (K % W) {
        CgLoop l;
        LLVMValueRef i = cg_for(c, &l, cg_i64(c, K % W));
        LLVMValueRef k = cg_add(c, i, cg_i64(c, kv * W));
        LLVMValueRef x = cg_load(c, a, cg_add(c, abase, k));
        LLVMValueRef y = kind == CG_SUM_DOT ? cg_load(c, b, cg_add(c, bbase, k)) : NULL;
        LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, tail, ""), sum_term(c, kind, x, y), ""),
                       tail);
        cg_for_end(c, &l);
    }
    LLVMValueRef v = LLVMBuildLoad2(c->b, vt, acc, "");
    LLVMValueRef lanes[W];
    for (int i = 0; i < W; i++) lanes[i] = LLVMBuildExtractElement(c->b, v, LLVMConstInt(c->t_i32, (unsigned)i, 0), "");
    for (int w = W; w > 1; w /= 2)
        for (int i = 0; i < w / 2; i++) lanes[i] = LLVMBuildFAdd(c->b, lanes[2 * i], lanes[2 * i + 1], "");
    return LLVMBuildFAdd(c->b, lanes[0], LLVMBuildLoad2(c->b, c->t_f32, tail, ""), "");
}

LLVMValueRef cg_dot(Cg *c, const Value *a, LLVMValueRef abase, const Value *b, LLVMValueRef bbase, int64_t K) {
    return cg_row_sum(c, CG_SUM_DOT, a, abase, b, bbase, K);
}

void cg_strided_copy(Cg *c, const Value *dst, int64_t dst_off, const int64_t *dst_strides, const Value *src,
                     int64_t src_off, const int64_t *src_strides, int rank, const int64_t *dims) {
    CgLoop loops[MAX_RANK];
    LLVMValueRef di = cg_i64(c, dst_off), si = cg_i64(c, src_off);
    for (int j = 0; j < rank; j++) {
        LLVMValueRef iv = cg_for(c, &loops[j], cg_i64(c, dims[j]));
        if (dst_strides[j]) di = cg_add(c, di, cg_mul(c, iv, dst_strides[j]));
        if (src_strides[j]) si = cg_add(c, si, cg_mul(c, iv, src_strides[j]));
    }
    /* integer buffers keep their exact values */
    if (dtype_is_float(src->dtype)) cg_store(c, dst, di, cg_load(c, src, si));
    else cg_store(c, dst, di, cg_load_i(c, src, si));
    for (int j = rank - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
}
