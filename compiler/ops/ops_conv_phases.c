/* ops_conv_phases.c - phase planes: a strided convolution's input split
 * by position modulo the stride, so that its patches are read with plain
 * vector loads (ops_conv_patches.c) instead of gathers and shuffles.
 *
 * Along an axis of stride s, input position i = q*s + f lies in phase f
 * at index q.  The output at o reads, through kernel offset k,
 * i = o*s - pb + k*d: phase f(k) = (k*d - pb) mod s at index o + q(k),
 * q(k) = floor((k*d - pb) / s).  So within one phase plane the positions
 * one kernel offset reads are the output positions shifted by q(k), a
 * stride-1 pattern: where the phase planes have the output's inner sizes
 * (a 3x3 window of stride 2 padded by 1, and the 7x7 stem of stride 2
 * padded by 3), a sample's positions are contiguous and a patch row is
 * one masked load per vector.  Each plane is copied into its phases once
 * per block of samples, by vector shuffles whose patterns are fixed at
 * compile time; a kernel of k_sz offsets then reads it k_sz times. */
#include <stdint.h>
#include <stdlib.h>

#include "../codegen/cg_gemm.h"
#include "ops_cg.h"
#include "ops_conv.h"

/* Planes up to this many floats are copied by unrolled shuffles (the
 * 32x32 stem: 64 vectors). */
enum { PHASE_MAX_PLANE = 4096 };

bool conv_phases_of(const ConvShape *s, ConvPhases *ph) {
    const Win *w = &s->w;
    int r = w->nsp;
    bool strided = false;
    ConvPhases p = {.w = *w, .S = 1, .plane = 1};
    for (int j = 0; j < r; j++) {
        int64_t st = w->s[j];
        if (st < 1 || st > 4) return false;
        strided |= st > 1;
        /* every phase must be read, or the copy moves floats nobody reads
         * (a 1x1 window of stride 2 reads one phase in four) */
        bool seen[4] = {false, false, false, false};
        for (int64_t k = 0; k < w->k[j]; k++) seen[((k * w->d[j] - w->pb[j]) % st + st) % st] = true;
        for (int64_t f = 0; f < st; f++)
            if (!seen[f]) return false;
        p.w.in[j] = (w->in[j] + st - 1) / st;
        p.w.s[j] = 1;
        p.w.d[j] = 1;
        p.w.pb[j] = p.w.pe[j] = 0;
        p.S *= st;
        p.plane *= p.w.in[j];
    }
    p.w.in_sz = p.plane;
    if (!strided || w->in_sz > PHASE_MAX_PLANE) return false;
    /* the phase planes must give whole runs of positions: contiguous
     * samples of small planes (inner sizes equal to the output's), or
     * rows of at least a vector */
    bool contig = true;
    for (int j = 1; j < r; j++) contig &= p.w.in[j] == w->out[j];
    if (!contig && w->out[r - 1] < cg_vector_floats()) return false;
    *ph = p;
    return true;
}

int64_t conv_phase_floats(const ConvShape *s, int64_t nb) {
    ConvPhases ph;
    if (!conv_phases_of(s, &ph)) return 0;
    return nb * (s->C / s->G) * ph.S * ph.plane;
}

void conv_phase_offset(Cg *c, const ConvShape *s, const ConvPhases *ph, const LLVMValueRef *k, LLVMValueRef *kq,
                       LLVMValueRef *off) {
    const Win *w = &s->w;
    LLVMValueRef f = cg_i64(c, 0);
    for (int j = 0; j < w->nsp; j++) {
        int64_t st = w->s[j], lift = (w->pb[j] + st - 1) / st; /* keeps k*d - pb + lift*s >= 0 */
        LLVMValueRef a = cg_add(c, cg_mul(c, k[j], w->d[j]), cg_i64(c, lift * st - w->pb[j]));
        kq[j] = LLVMBuildNSWSub(c->b, LLVMBuildUDiv(c->b, a, cg_i64(c, st), ""), cg_i64(c, lift), "");
        f = cg_mad(c, f, st, LLVMBuildURem(c->b, a, cg_i64(c, st), ""));
    }
    *off = cg_mul(c, f, ph->plane);
}

/* Source vectors one output vector of a map copy may pick its lanes
 * from, zeros counted as one: a tree of two-vector shuffles joins them
 * (a stride-9 pick of 8 floats, one kernel offset of 8 channels' 3x3
 * filters, spans 5). */
enum { MAP_MAX_SOURCES = 8 };

/* One output vector of a map copy: lane t takes source float src[t] (-1:
 * zero, a phase position past the input's end, say), picked by one
 * shuffle out of the few source vectors it needs, loaded once per copy
 * (vec[]); NULL when it needs more than MAP_MAX_SOURCES. */
static LLVMValueRef map_vector(Cg *c, const int64_t *src, int W, LLVMValueRef xb, int64_t in_sz, LLVMValueRef *vec) {
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, (unsigned)W), over[2] = {vt, c->t_ptr};
    int64_t used[MAP_MAX_SOURCES];
    int n = 0;
    bool zero = false;
    for (int t = 0; t < W; t++) {
        if (src[t] < 0) {
            zero = true;
            continue;
        }
        int64_t v = src[t] / W;
        int u = 0;
        while (u < n && used[u] != v) u++;
        if (u == n) {
            if (n == MAP_MAX_SOURCES) return NULL; /* too scattered: the caller gathers */
            used[n++] = v;
        }
    }
    if (zero && n == MAP_MAX_SOURCES) return NULL;
    LLVMValueRef part[MAP_MAX_SOURCES];
    for (int u = 0; u < n; u++) {
        int64_t v = used[u];
        if (!vec[v]) { /* whole vectors as plain loads, the plane's last one masked */
            LLVMValueRef idx = cg_i64(c, v * W), p = LLVMBuildGEP2(c->b, c->t_f32, xb, &idx, 1, "");
            int64_t lanes = in_sz - v * W < W ? in_sz - v * W : W;
            if (lanes == W) {
                vec[v] = LLVMBuildLoad2(c->b, vt, p, "");
                LLVMSetAlignment(vec[v], 4);
            } else {
                LLVMValueRef bits[16];
                for (int t = 0; t < W; t++) bits[t] = LLVMConstInt(c->t_i1, t < lanes, 0);
                vec[v] = cg_intrinsic(c, "llvm.masked.load", over, 2,
                                      (LLVMValueRef[]){p, LLVMConstInt(c->t_i32, 4, 0),
                                                       LLVMConstVector(bits, (unsigned)W), LLVMConstNull(vt)}, 4);
            }
        }
        part[u] = vec[v];
    }
    int m = n + zero, width = W;
    while (m & (m - 1)) m++; /* the tree joins a power of two of vectors */
    for (int u = n; u < m; u++) part[u] = LLVMConstNull(vt); /* lanes u*W..: zeros */
    LLVMValueRef mask[16], cat[MAP_MAX_SOURCES * 16];
    for (int t = 0; t < W; t++) {
        int u = 0;
        if (src[t] >= 0)
            while (used[u] != src[t] / W) u++;
        else
            u = n;
        mask[t] = LLVMConstInt(c->t_i32, (unsigned long long)(u * W + (src[t] >= 0 ? src[t] % W : 0)), 0);
    }
    for (; m > 1; m /= 2, width *= 2) { /* pairs joined in order: part u's lanes at u*W.. of the whole */
        for (int i = 0; i < 2 * width; i++) cat[i] = LLVMConstInt(c->t_i32, (unsigned long long)i, 0);
        for (int u = 0; u < m / 2; u++)
            part[u] = LLVMBuildShuffleVector(c->b, part[2 * u], part[2 * u + 1], LLVMConstVector(cat, 2u * width), "");
    }
    return LLVMBuildShuffleVector(c->b, part[0], LLVMGetUndef(LLVMVectorType(c->t_f32, (unsigned)width)),
                                  LLVMConstVector(mask, (unsigned)W), "");
}

void conv_map_copy(Cg *c, const int64_t *map, int64_t dst_n, LLVMValueRef from, int64_t src_n, LLVMValueRef to) {
    int W = cg_vector_floats();
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, (unsigned)W), gover[2] = {vt, LLVMVectorType(c->t_ptr, (unsigned)W)};
    LLVMValueRef *vec = calloc((size_t)(src_n / W + 1), sizeof *vec);
    CLEAVE_CHECK(vec != NULL, "out of memory for %lld vectors", (long long)(src_n / W + 1));
    for (int64_t v0 = 0; v0 < dst_n; v0 += W) {
        int64_t src[16];
        for (int t = 0; t < W; t++) src[t] = v0 + t < dst_n ? map[v0 + t] : -1;
        LLVMValueRef out = map_vector(c, src, W, from, src_n, vec);
        if (!out) { /* lanes from too many vectors: a gather */
            LLVMValueRef offs[16], bits[16];
            for (int t = 0; t < W; t++) {
                offs[t] = LLVMConstInt(c->t_i32, (unsigned long long)(src[t] < 0 ? 0 : src[t]), 0);
                bits[t] = LLVMConstInt(c->t_i1, src[t] >= 0, 0);
            }
            LLVMValueRef ptrs = LLVMBuildGEP2(c->b, c->t_f32, from,
                                              (LLVMValueRef[]){LLVMConstVector(offs, (unsigned)W)}, 1, "");
            out = cg_intrinsic(c, "llvm.masked.gather", gover, 2,
                               (LLVMValueRef[]){ptrs, LLVMConstInt(c->t_i32, 4, 0), LLVMConstVector(bits, (unsigned)W),
                                                LLVMConstNull(vt)}, 4);
        }
        LLVMValueRef p = fptr(c, to, cg_i64(c, v0));
        if (v0 + W <= dst_n) {
            LLVMSetAlignment(LLVMBuildStore(c->b, out, p), 4);
        } else {
            LLVMValueRef bits[16];
            for (int t = 0; t < W; t++) bits[t] = LLVMConstInt(c->t_i1, v0 + t < dst_n, 0);
            LLVMTypeRef over[2] = {vt, c->t_ptr};
            cg_intrinsic(c, "llvm.masked.store", over, 2,
                         (LLVMValueRef[]){out, p, LLVMConstInt(c->t_i32, 4, 0), LLVMConstVector(bits, (unsigned)W)}, 4);
        }
    }
    free(vec);
}

/* Copies each of group g's channel planes of samples [n0, n0+nb) between
 * x and the phase planes at ph_buf, one vector of the destination at a
 * time: into the phase planes (back = false) or back into x's planes
 * (back = true, overwriting them), laid out as pl says. */
static void copy_planes(Cg *c, const ConvShape *s, const ConvPhases *ph, const Value *x, LLVMValueRef n0, int64_t nb,
                        LLVMValueRef g, LLVMValueRef ph_buf, const ConvPhaseLayout *pl, bool back) {
    const Win *w = &s->w;
    int r = w->nsp;
    int64_t Cpg = s->C / s->G, total = ph->S * ph->plane, is[MAX_RANK], ps[MAX_RANK], fs[MAX_RANK];
    strides_of(w->in, r, is);
    strides_of(ph->w.in, r, ps);
    strides_of(w->s, r, fs);
    /* map[e]: the source float of destination float e of one plane, or -1
     * (a phase position past the input's end, zero) */
    int64_t gap = pl->gap, span = (ph->S - 1) * gap + ph->plane; /* floats from a channel's first phase to its last's end */
    int64_t dst_n = back ? w->in_sz : span, src_n = back ? span : w->in_sz;
    int64_t *map = malloc(sizeof *map * (size_t)dst_n);
    CLEAVE_CHECK(map != NULL, "out of memory for a phase map of %lld floats", (long long)dst_n);
    for (int64_t e = 0; e < dst_n; e++) map[e] = -1;
    for (int64_t e = 0; e < total; e++) { /* phase float e and the input float it holds */
        int64_t f = e / ph->plane, q = e % ph->plane, at = 0, pe = f * gap + q;
        bool in = true;
        for (int j = 0; j < r; j++) {
            int64_t i = (q / ps[j]) % ph->w.in[j] * w->s[j] + (f / fs[j]) % w->s[j];
            in &= i < w->in[j];
            at += i * is[j];
        }
        if (!in) continue;
        if (back)
            map[at] = pe;
        else
            map[pe] = at;
    }
    Nest ns = {.n = 0};
    LLVMValueRef nl = nest_for(c, &ns, cg_i64(c, nb)), ch = nest_for(c, &ns, cg_i64(c, Cpg));
    LLVMValueRef xi = cg_mul(c, cg_add(c, cg_mul(c, cg_add(c, n0, nl), s->C), cg_mad(c, g, Cpg, ch)), w->in_sz);
    LLVMValueRef xb = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, x), &xi, 1, "");
    LLVMValueRef pb = fptr(c, ph_buf, cg_add(c, cg_mul(c, nl, pl->sample), cg_mul(c, ch, pl->chan)));
    conv_map_copy(c, map, dst_n, back ? pb : xb, src_n, back ? xb : pb);
    free(map);
    nest_close(c, &ns);
}

void conv_phase_copy(Cg *c, const ConvShape *s, const ConvPhases *ph, const Value *x, LLVMValueRef n0, int64_t nb,
                     LLVMValueRef g, LLVMValueRef dst) {
    ConvPhaseLayout pl = {s->C / s->G * ph->S * ph->plane, ph->S * ph->plane, ph->plane};
    copy_planes(c, s, ph, x, n0, nb, g, dst, &pl, false);
}

void conv_phase_back(Cg *c, const ConvShape *s, const ConvPhases *ph, LLVMValueRef src, const ConvPhaseLayout *pl,
                     const Value *x, LLVMValueRef n0, int64_t nb, LLVMValueRef g) {
    copy_planes(c, s, ph, x, n0, nb, g, src, pl, true);
}

bool conv_phase_scatters(const ConvShape *s, ConvPhases *ph) {
    const Win *w = &s->w;
    if (!conv_phases_of(s, ph) || cg_vector_floats() % ph->plane != 0) return false;
    for (int j = 0; j < w->nsp; j++)
        if (ph->w.in[j] != w->out[j]) return false;
    return true;
}

void conv_phase_scatter(Cg *c, const ConvShape *s, const ConvPhases *ph, LLVMValueRef cols, int64_t ncols,
                        LLVMValueRef acc) {
    const Win *w = &s->w;
    int r = w->nsp, W = cg_vector_floats();
    int64_t Cpg = s->C / s->G, P = ph->plane, os[MAX_RANK], ks[MAX_RANK], full = ncols / W, tail = ncols % W;
    strides_of(w->out, r, os);
    strides_of(w->k, r, ks);
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, (unsigned)W), over[2] = {vt, c->t_ptr};
    LLVMValueRef zero = LLVMConstNull(vt), tail_mask = NULL;
    if (tail) {
        LLVMValueRef bits[16];
        for (int t = 0; t < W; t++) bits[t] = LLVMConstInt(c->t_i1, t < tail, 0);
        tail_mask = LLVMConstVector(bits, (unsigned)W);
    }
    CgLoop lc;
    LLVMValueRef ch = cg_for(c, &lc, cg_i64(c, Cpg));
    for (int64_t k = 0; k < w->k_sz; k++) { /* offsets in order: each element's sum in col2im's order */
        /* offset k reads phase f at the output positions shifted by q:
         * lane (sample, position y) of the phase takes lane (sample, y - q)
         * of the row, zero where that lies outside the plane */
        int64_t f = 0, q[MAX_RANK];
        for (int j = 0; j < r; j++) {
            int64_t kj = k / ks[j] % w->k[j], st = w->s[j], a = kj * w->d[j] - w->pb[j];
            int64_t fj = (a % st + st) % st;
            q[j] = (a - fj) / st;
            f = f * st + fj;
        }
        LLVMValueRef idx[16];
        for (int t = 0; t < W; t++) {
            int64_t p = t % P, from = t - p;
            bool in = true;
            for (int j = 0; j < r; j++) {
                int64_t y = p / os[j] % w->out[j] - q[j];
                in &= y >= 0 && y < w->out[j];
                from += y * os[j];
            }
            idx[t] = LLVMConstInt(c->t_i32, (unsigned long long)(in ? from : W), 0); /* W: a lane of zero */
        }
        LLVMValueRef perm = LLVMConstVector(idx, (unsigned)W);
        LLVMValueRef src = fptr(c, cols, cg_mul(c, cg_mad(c, ch, w->k_sz, cg_i64(c, k)), ncols));
        LLVMValueRef dst = fptr(c, acc, cg_mul(c, cg_add(c, ch, cg_i64(c, f * Cpg)), ncols));
        for (int part = 0; part < 2; part++) {
            if (part ? !tail : !full) continue;
            CgLoop lv;
            LLVMValueRef v = part ? cg_i64(c, full) : cg_for(c, &lv, cg_i64(c, full));
            LLVMValueRef sp = fptr(c, src, cg_mul(c, v, W)), dp = fptr(c, dst, cg_mul(c, v, W)), x, a;
            if (part) {
                LLVMValueRef four = LLVMConstInt(c->t_i32, 4, 0);
                x = cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){sp, four, tail_mask, zero}, 4);
                a = cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){dp, four, tail_mask, zero}, 4);
                a = LLVMBuildFAdd(c->b, a, LLVMBuildShuffleVector(c->b, x, zero, perm, ""), "");
                cg_intrinsic(c, "llvm.masked.store", over, 2, (LLVMValueRef[]){a, dp, four, tail_mask}, 4);
            } else {
                x = LLVMBuildLoad2(c->b, vt, sp, "");
                a = LLVMBuildLoad2(c->b, vt, dp, "");
                LLVMSetAlignment(x, 4);
                LLVMSetAlignment(a, 4);
                a = LLVMBuildFAdd(c->b, a, LLVMBuildShuffleVector(c->b, x, zero, perm, ""), "");
                LLVMSetAlignment(LLVMBuildStore(c->b, a, dp), 4);
                cg_for_end(c, &lv);
            }
        }
    }
    cg_for_end(c, &lc);
}
