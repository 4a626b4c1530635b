/* ops_cg.h - small code-generation helpers the kernels of the layer ops
 * (ops_nn.c, ops_batchnorm.c, ops_resize.c) share: nested loops and
 * float32 arithmetic on LLVM values. */
#ifndef CLEAVE_OPS_CG_H
#define CLEAVE_OPS_CG_H

#include "../codegen/cg.h"

/* for (iv = lo; iv < hi; iv++); no iterations when hi <= lo. */
static inline LLVMValueRef for_range(Cg *c, CgLoop *l, LLVMValueRef lo, LLVMValueRef hi) {
    return cg_add(c, lo, cg_for(c, l, LLVMBuildNSWSub(c->b, hi, lo, "")));
}

/* A stack of open loops, closed innermost first. */
typedef struct Nest {
    CgLoop l[2 * MAX_RANK + 2];
    int n;
} Nest;

static inline LLVMValueRef nest_for(Cg *c, Nest *ns, LLVMValueRef n) { return cg_for(c, &ns->l[ns->n++], n); }
static inline LLVMValueRef nest_range(Cg *c, Nest *ns, LLVMValueRef lo, LLVMValueRef hi) {
    return for_range(c, &ns->l[ns->n++], lo, hi);
}
static inline void nest_close(Cg *c, Nest *ns) {
    while (ns->n > 0) cg_for_end(c, &ns->l[--ns->n]);
}

/* &base[i] for a float32 base pointer. */
static inline LLVMValueRef fptr(Cg *c, LLVMValueRef base, LLVMValueRef i) {
    return LLVMBuildInBoundsGEP2(c->b, c->t_f32, base, &i, 1, "");
}

static inline LLVMValueRef f_add(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(c->b, a, b, ""); }
static inline LLVMValueRef f_sub(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFSub(c->b, a, b, ""); }
static inline LLVMValueRef f_mul(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(c->b, a, b, ""); }
static inline LLVMValueRef f_div(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFDiv(c->b, a, b, ""); }
static inline LLVMValueRef load_f(Cg *c, LLVMValueRef slot) { return LLVMBuildLoad2(c->b, c->t_f32, slot, ""); }

/* v[i] += x */
static inline void add_to(Cg *c, const Value *v, LLVMValueRef i, LLVMValueRef x) {
    cg_store(c, v, i, f_add(c, cg_load(c, v, i), x));
}

/* 1 / sqrt(var + eps) in float32. */
static inline LLVMValueRef inv_std(Cg *c, LLVMValueRef var, float eps) {
    return f_div(c, cg_f32(c, 1), cg_math(c, "sqrt", f_add(c, var, cg_f32(c, eps)), NULL));
}

#endif
