/* cg_vec.c - explicit vectors over contiguous rows of float32.
 *
 * Row-wise kernels (softmax, layer normalisation and their gradients)
 * reduce along a row and then use the result on the same row; LLVM's loop
 * vectorizer leaves such loops scalar, since without fast-math it may not
 * reorder a floating-point sum.  These helpers let a kernel walk a row a
 * vector at a time and combine the lanes in an order fixed by the row's
 * length, so the results are the same bits on every run. */
#include "cg.h"
#include "cg_gemm.h"

LLVMTypeRef cg_vtype(Cg *c, int w) { return LLVMVectorType(c->t_f32, (unsigned)w); }

LLVMValueRef cg_vsplat(Cg *c, LLVMValueRef x, int w) {
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(x), (unsigned)w);
    LLVMValueRef v = LLVMBuildInsertElement(c->b, LLVMGetPoison(vt), x, LLVMConstInt(c->t_i32, 0, 0), "");
    return LLVMBuildShuffleVector(c->b, v, LLVMGetPoison(vt), LLVMConstNull(LLVMVectorType(c->t_i32, (unsigned)w)),
                                  "");
}

static LLVMValueRef lane_mask(Cg *c, int w, int lanes) {
    LLVMValueRef bits[64];
    for (int i = 0; i < w; i++) bits[i] = LLVMConstInt(c->t_i1, i < lanes, 0);
    return LLVMConstVector(bits, (unsigned)w);
}

static LLVMValueRef elem(Cg *c, const Value *v, LLVMValueRef idx) {
    return LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, v), &idx, 1, "");
}

LLVMValueRef cg_vload(Cg *c, const Value *v, LLVMValueRef idx, int w, int lanes, LLVMValueRef fill) {
    LLVMTypeRef vt = cg_vtype(c, w);
    if (lanes >= w) {
        LLVMValueRef x = LLVMBuildLoad2(c->b, vt, elem(c, v, idx), "");
        LLVMSetAlignment(x, 4);
        return x;
    }
    LLVMTypeRef over[2] = {vt, c->t_ptr};
    LLVMValueRef args[4] = {elem(c, v, idx), LLVMConstInt(c->t_i32, 4, 0), lane_mask(c, w, lanes),
                            fill ? fill : LLVMConstNull(vt)};
    return cg_intrinsic(c, "llvm.masked.load", over, 2, args, 4);
}

void cg_vstore(Cg *c, const Value *v, LLVMValueRef idx, LLVMValueRef x, int lanes) {
    LLVMTypeRef vt = LLVMTypeOf(x);
    int w = (int)LLVMGetVectorSize(vt);
    if (lanes >= w) {
        LLVMSetAlignment(LLVMBuildStore(c->b, x, elem(c, v, idx)), 4);
        return;
    }
    LLVMTypeRef over[2] = {vt, c->t_ptr};
    LLVMValueRef args[4] = {x, elem(c, v, idx), LLVMConstInt(c->t_i32, 4, 0), lane_mask(c, w, lanes)};
    cg_intrinsic(c, "llvm.masked.store", over, 2, args, 4);
}

/* Lanes [0, h) of x combined with lanes [h, 2h), halving until one is
 * left: the order depends on the width alone. */
static LLVMValueRef reduce(Cg *c, LLVMValueRef x, bool max) {
    int w = (int)LLVMGetVectorSize(LLVMTypeOf(x));
    for (int h = w / 2; h >= 1; h /= 2) {
        LLVMValueRef lo[32], hi[32];
        for (int i = 0; i < h; i++) {
            lo[i] = LLVMConstInt(c->t_i32, (unsigned)i, 0);
            hi[i] = LLVMConstInt(c->t_i32, (unsigned)(i + h), 0);
        }
        LLVMValueRef a = LLVMBuildShuffleVector(c->b, x, x, LLVMConstVector(lo, (unsigned)h), "");
        LLVMValueRef b = LLVMBuildShuffleVector(c->b, x, x, LLVMConstVector(hi, (unsigned)h), "");
        x = max ? cg_max(c, a, b) : LLVMBuildFAdd(c->b, a, b, "");
    }
    return LLVMBuildExtractElement(c->b, x, LLVMConstInt(c->t_i32, 0, 0), "");
}

LLVMValueRef cg_vsum(Cg *c, LLVMValueRef x) { return reduce(c, x, false); }
LLVMValueRef cg_vmax(Cg *c, LLVMValueRef x) { return reduce(c, x, true); }

void cg_vrow(Cg *c, int64_t len, int w, CgVecBody body, void *ctx) {
    if (len >= w) {
        CgLoop l;
        LLVMValueRef q = cg_for(c, &l, cg_i64(c, len / w));
        body(c, ctx, cg_mul(c, q, w), w);
        cg_for_end(c, &l);
    }
    if (len % w) body(c, ctx, cg_i64(c, len / w * w), (int)(len % w));
}

/* An accumulator lives in a stack slot across the loop (mem2reg keeps it
 * in a register). */
LLVMValueRef cg_vacc(Cg *c, LLVMValueRef init) {
    LLVMValueRef slot = cg_alloca(c, LLVMTypeOf(init));
    LLVMBuildStore(c->b, init, slot);
    return slot;
}
