/* cg_module.c - one LLVM module per program: the kernels of every planned
 * node, the step functions that call them, the embedded metadata, initial
 * arena image and source model (see runtime/rt_abi.h, grep RT_ABI), then
 * verification, O3 for the target CPU, and emission. */
#include <llvm-c/Analysis.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Support.h>
#include <llvm-c/Target.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cg.h"
#include "cg_fuse.h"
#include "cg_share.h"
#include "../frontend/file_util.h"
#include "out_file.h"
#include "../ops/ops.h"
#include "../plan/pipeline.h"

static void init_types(Cg *c) {
    c->t_void = LLVMVoidTypeInContext(c->ctx);
    c->t_i1 = LLVMInt1TypeInContext(c->ctx);
    c->t_i8 = LLVMInt8TypeInContext(c->ctx);
    c->t_i32 = LLVMInt32TypeInContext(c->ctx);
    c->t_i64 = LLVMInt64TypeInContext(c->ctx);
    c->t_f32 = LLVMFloatTypeInContext(c->ctx);
    c->t_f64 = LLVMDoubleTypeInContext(c->ctx);
    c->t_ptr = LLVMPointerTypeInContext(c->ctx, 0);
}

/* A constant byte array global with external linkage. */
static void add_bytes(Cg *c, const char *name, const void *data, size_t len) {
    LLVMValueRef init = LLVMConstStringInContext(c->ctx, data, (unsigned)len, 1);
    LLVMValueRef gv = LLVMAddGlobal(c->mod, LLVMTypeOf(init), name);
    LLVMSetInitializer(gv, init);
    LLVMSetGlobalConstant(gv, 1);
    LLVMSetAlignment(gv, 64);
}

static void add_u64(Cg *c, const char *name, uint64_t x) {
    LLVMValueRef gv = LLVMAddGlobal(c->mod, c->t_i64, name);
    LLVMSetInitializer(gv, LLVMConstInt(c->t_i64, x, 0));
    LLVMSetGlobalConstant(gv, 1);
}

/* Persistent region's initial contents: initializers, constants, state. */
static unsigned char *init_image(const Plan *p, const RankPlan *rp) {
    unsigned char *img = calloc(1, (size_t)(rp->init_bytes ? rp->init_bytes : 1));
    if (!img) return NULL;
    const Graph *g = p->g;
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = g->values[i];
        if (rp->offset[i] < 0 || rp->offset[i] >= rp->init_bytes || !v->konst) continue;
        unsigned char *dst = img + rp->offset[i];
        int64_t bytes = plan_value_bytes(v);
        for (int64_t e = 0; e < v->konst->n; e++) {
            if (dtype_is_float(v->dtype)) {
                float f = (float)const_get_f(v->konst, e);
                memcpy(dst + e * 4, &f, 4);
            } else if (bytes == v->konst->n) {
                dst[e] = (unsigned char)const_get_i(v->konst, e);
            } else {
                int64_t x = const_get_i(v->konst, e);
                memcpy(dst + e * 8, &x, 8);
            }
        }
    }
    return img;
}

/* Calls runtime function `name` (RT_ABI), declared on first use. */
static void call_ext(Cg *c, const char *name, LLVMTypeRef *pts, LLVMValueRef *args, int n) {
    LLVMTypeRef fty = LLVMFunctionType(c->t_void, pts, (unsigned)n, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(c->mod, name);
    if (!fn) fn = LLVMAddFunction(c->mod, name, fty);
    LLVMBuildCall2(c->b, fty, fn, args, (unsigned)n, "");
}

static LLVMValueRef at_offset(Cg *c, LLVMValueRef arena, int64_t offset) {
    LLVMValueRef off = cg_i64(c, offset);
    return LLVMBuildInBoundsGEP2(c->b, c->t_i8, arena, &off, 1, "");
}

/* Calls a runtime entry point (RT_ABI): n i32 arguments, then, when buf is
 * not NULL, a pointer and an i64 (a buffer and its size). */
static void call_rt(Cg *c, const char *name, int n, const int *ints, LLVMValueRef buf, int64_t size) {
    LLVMTypeRef pts[4];
    LLVMValueRef args[4];
    for (int i = 0; i < n; i++) {
        pts[i] = c->t_i32;
        args[i] = LLVMConstInt(c->t_i32, (unsigned long long)(int64_t)ints[i], 1);
    }
    if (buf) {
        pts[n] = c->t_ptr, args[n++] = buf;
        pts[n] = c->t_i64, args[n++] = cg_i64(c, size);
    }
    call_ext(c, name, pts, args, n);
}

static void call_kernel(Cg *c, const CgKernel *k, LLVMValueRef *args) {
    LLVMTypeRef types[CG_MAX_BUFS];
    for (int i = 0; i < k->n_bufs; i++) types[i] = c->t_ptr;
    LLVMBuildCall2(c->b, LLVMFunctionType(c->t_void, types, (unsigned)k->n_bufs, 0), k->fn, args,
                   (unsigned)k->n_bufs, "");
}

/* Whether step s starts a bucket that step s + 1 waits for: nothing to
 * overlap, so one blocking allreduce (cleave_rt_allreduce) does both. */
static bool waited_next(const PlanStep *steps, int n, int s) {
    return s + 1 < n && steps[s].kind == STEP_ALLREDUCE_START && steps[s + 1].kind == STEP_ALLREDUCE_WAIT &&
           steps[s + 1].bucket == steps[s].bucket;
}

/* acc = x (first) or acc += x over n floats: a gradient's accumulator
 * over micro-batches.  One function per accumulated value, made on first
 * use. */
static LLVMValueRef accumulate_fn(Cg *c, LLVMValueRef *cache, const Value *v) {
    if (cache[v->id]) return cache[v->id];
    LLVMTypeRef pts[3] = {c->t_ptr, c->t_ptr, c->t_i1};
    char name[64];
    snprintf(name, sizeof name, "acc%d", v->id);
    LLVMValueRef fn = LLVMAddFunction(c->mod, name, LLVMFunctionType(c->t_void, pts, 3, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    for (unsigned i = 1; i <= 2; i++) LLVMAddAttributeAtIndex(fn, i, LLVMCreateEnumAttribute(c->ctx, noalias, 0));
    LLVMBasicBlockRef saved = LLVMGetInsertBlock(c->b);
    LLVMPositionBuilderAtEnd(c->b, LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"));
    LLVMValueRef dst = LLVMGetParam(fn, 0), src = LLVMGetParam(fn, 1), first = LLVMGetParam(fn, 2);
    CgLoop l;
    LLVMValueRef i = cg_for(c, &l, cg_i64(c, plan_value_bytes(v) / 4));
    LLVMValueRef ps = LLVMBuildInBoundsGEP2(c->b, c->t_f32, src, &i, 1, "");
    LLVMValueRef pd = LLVMBuildInBoundsGEP2(c->b, c->t_f32, dst, &i, 1, "");
    LLVMValueRef x = LLVMBuildLoad2(c->b, c->t_f32, ps, "");
    LLVMValueRef sum = LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, c->t_f32, pd, ""), x, "");
    LLVMBuildStore(c->b, LLVMBuildSelect(c->b, first, x, sum, ""), pd);
    cg_for_end(c, &l);
    LLVMBuildRetVoid(c->b);
    LLVMPositionBuilderAtEnd(c->b, saved);
    cache[v->id] = fn;
    return fn;
}

/* The step function of one stage's program: kernels on each step's
 * micro-batch instances (pipeline_buffer), transfers and collectives
 * through the runtime, and (with stages or micro-batches) a cleave_rt_unit
 * call wherever the unit of work changes, which the runtime's traces use. */
static bool build_step_fn(Cg *c, const char *name, int prog, int pass, const RankPlan *rp,
                                 const PlanStep *steps, int n, LLVMValueRef *acc_cache) {
    const Plan *p = c->plan;
    LLVMTypeRef pt = c->t_ptr;
    LLVMValueRef fn = LLVMAddFunction(c->mod, name, LLVMFunctionType(c->t_void, &pt, 1, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    LLVMPositionBuilderAtEnd(c->b, LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"));
    LLVMValueRef arena = LLVMGetParam(fn, 0);
    int unit = -1, unit_micro = -2;
    int in_flight = 0; /* sends and bucket sums started and not yet waited for */
    /* Traces tell forward, backward and update apart where stages or
     * micro-batches make them interleave; elsewhere a step is "compute". */
    bool units = p->n_stages > 1 || p->microbatches > 1;
    for (int s = 0; s < n; s++) {
        const PlanStep *st = &steps[s];
        /* A stage's program serves every replica: it names its peers by
         * stage, and the runtime finds their ranks (rt_group.c). */
        bool p2p = st->kind == STEP_SEND || st->kind == STEP_RECV || st->kind == STEP_SEND_WAIT;
        int peer_tag[2] = {p2p ? p->ranks[st->peer].stage : st->peer, st->tag};
        if (st->kind == STEP_SEND_WAIT) { /* between units: not part of either */
            call_rt(c, "cleave_rt_send_wait", 2, peer_tag, NULL, 0);
            in_flight--;
            continue;
        }
        int u = (int)plan_step_unit(p, st);
        if (units && (u != unit || st->micro != unit_micro)) {
            int unit_args[2] = {u, st->micro};
            call_rt(c, "cleave_rt_unit", 2, unit_args, NULL, 0);
            unit = u;
            unit_micro = st->micro;
        }
        if (st->kind == STEP_ALLREDUCE_START || st->kind == STEP_ALLREDUCE_WAIT) {
            /* dp and hybrid: a gradient bucket summed over the stage's replicas */
            bool both = waited_next(steps, n, s);
            call_rt(c, both ? "cleave_rt_allreduce"
                    : st->kind == STEP_ALLREDUCE_START ? "cleave_rt_allreduce_start" : "cleave_rt_allreduce_wait",
                    1, &st->bucket, NULL, 0);
            in_flight += both ? 0 : st->kind == STEP_ALLREDUCE_START ? 1 : -1;
            s += both;
            continue;
        }
        if (st->kind == STEP_COMPUTE) {
            int span = 1;
            const CgKernel *k = cg_fused_at(c, prog, pass, s, &span);
            if (!k) k = pass == 1 && st->node->def->cg_eval ? &c->eval_kernels[st->node->id] : &c->kernels[st->node->id];
            s += span - 1; /* a fused chain stands for its steps, all in this unit */
            if (!k->fn) continue;
            LLVMValueRef args[CG_MAX_BUFS];
            for (int i = 0; i < k->n_bufs; i++) {
                int64_t off = pipeline_buffer(p, rp, k->bufs[i], st->micro);
                if (off < 0)
                    return diag_error(c->d, DIAG_INTERNAL, "rank %d: node '%s' reads '%s' (micro-batch %d) without a "
                                      "buffer", rp->rank, st->node->name, k->bufs[i]->name, st->micro);
                args[i] = at_offset(c, arena, off);
            }
            call_kernel(c, k, args);
            /* Open MPI has no progress thread: what is in flight moves
             * between kernels */
            if (in_flight > 0) call_rt(c, "cleave_rt_progress", 0, NULL, NULL, 0);
            continue;
        }
        int64_t off = pipeline_buffer(p, rp, st->value, st->micro);
        if (off < 0)
            return diag_error(c->d, DIAG_INTERNAL, "rank %d: step %d on '%s' (micro-batch %d) has no buffer", rp->rank,
                              s, st->value->name, st->micro);
        switch (st->kind) {
        case STEP_SEND:
            call_rt(c, "cleave_rt_send", 2, peer_tag, at_offset(c, arena, off), st->bytes);
            in_flight++;
            break;
        case STEP_RECV:
            call_rt(c, "cleave_rt_recv", 2, peer_tag, at_offset(c, arena, off), st->bytes);
            break;
        case STEP_ALLREDUCE: {
            /* Groups past the stages' are each replica's stages: the one
             * program of a stage names its own replica's as group P, and
             * the runtime knows which replica that is (rt_abi.h). */
            int group = st->group < p->n_stages ? st->group : p->n_stages;
            call_rt(c, "cleave_rt_group_allreduce", 1, &group, at_offset(c, arena, off), st->bytes / 4);
            break;
        }
        case STEP_ACCUMULATE: {
            int64_t acc = pipeline_buffer(p, rp, st->value, -1);
            LLVMValueRef f = accumulate_fn(c, acc_cache, st->value);
            LLVMTypeRef pts[3] = {c->t_ptr, c->t_ptr, c->t_i1};
            LLVMValueRef a[3] = {at_offset(c, arena, acc), at_offset(c, arena, off),
                                 LLVMConstInt(c->t_i1, st->micro == 0, 0)};
            LLVMBuildCall2(c->b, LLVMFunctionType(c->t_void, pts, 3, 0), f, a, 3, "");
            break;
        }
        default:
            return diag_error(c->d, DIAG_INTERNAL, "rank %d: step %d: kind %d has no code generation", rp->rank, s,
                              (int)st->kind);
        }
    }
    LLVMBuildRetVoid(c->b);
    return true;
}

/* cleave_train_step / cleave_eval_step of a module holding one program per
 * stage: calls the program the runtime selected in cleave_program. */
static void build_dispatch(Cg *c, const char *name, LLVMValueRef program, LLVMValueRef *fns, int n) {
    LLVMTypeRef pt = c->t_ptr, fty = LLVMFunctionType(c->t_void, &pt, 1, 0);
    LLVMValueRef fn = LLVMAddFunction(c->mod, name, fty);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c->ctx, fn, "entry");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c->ctx, fn, "done");
    LLVMPositionBuilderAtEnd(c->b, entry);
    LLVMValueRef sel = LLVMBuildLoad2(c->b, c->t_i32, program, "");
    LLVMValueRef sw = LLVMBuildSwitch(c->b, sel, done, (unsigned)n);
    LLVMValueRef arena = LLVMGetParam(fn, 0);
    for (int k = 0; k < n; k++) {
        LLVMBasicBlockRef bb = LLVMAppendBasicBlockInContext(c->ctx, fn, "program");
        LLVMAddCase(sw, LLVMConstInt(c->t_i32, (unsigned long long)k, 0), bb);
        LLVMPositionBuilderAtEnd(c->b, bb);
        LLVMBuildCall2(c->b, fty, fns[k], &arena, 1, "");
        LLVMBuildBr(c->b, done);
    }
    LLVMPositionBuilderAtEnd(c->b, done);
    LLVMBuildRetVoid(c->b);
}

/* LLVM only warns about an unknown CPU name and then aborts the process
 * when it generates code, and its C API cannot ask whether a name is valid:
 * try it in a child process with an empty module. */
static bool cpu_name_works(LLVMTargetRef target, const char *triple, const char *cpu) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return true; /* cannot tell; let code generation report */
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDERR_FILENO);
        LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, "", LLVMCodeGenLevelNone,
                                                          LLVMRelocPIC, LLVMCodeModelDefault);
        LLVMModuleRef m = LLVMModuleCreateWithName("probe");
        LLVMSetTarget(m, triple);
        /* a function, so that the subtarget is really instantiated */
        LLVMValueRef f = LLVMAddFunction(m, "probe", LLVMFunctionType(LLVMVoidType(), NULL, 0, 0));
        LLVMBuilderRef b = LLVMCreateBuilder();
        LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlock(f, "entry"));
        LLVMBuildRetVoid(b);
        char *err = NULL;
        LLVMMemoryBufferRef buf = NULL;
        bool ok = tm && !LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &err, &buf);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static LLVMTargetMachineRef make_target(const CgOptions *o, Diag *d) {
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
#if defined(__x86_64__)
    /* x86's back end turns conditional moves inside loops into branches
     * when it guesses them predictable.  The kernels' selects depend on
     * the data (a pooling window's maximum, a ReLU's sign), where a
     * branch mispredicts about half the time: MaxPool's gradient ran 10x
     * slower than the forward pass with them.  Options are parsed once
     * per process. */
    static bool options_set;
    if (!options_set) {
        const char *argv[] = {"cleave", "-x86-cmov-converter=false"};
        LLVMParseCommandLineOptions(2, argv, NULL);
        options_set = true;
    }
#endif
    char *triple = LLVMGetDefaultTargetTriple(), *err = NULL;
    LLVMTargetRef target;
    if (LLVMGetTargetFromTriple(triple, &target, &err)) {
        diag_error(d, DIAG_INTERNAL, "LLVM target for %s: %s", triple, err);
        LLVMDisposeMessage(err);
        LLVMDisposeMessage(triple);
        return NULL;
    }
    if (o->target_cpu && !cpu_name_works(target, triple, o->target_cpu)) {
        diag_error(d, DIAG_USAGE, "--target-cpu '%s' is not a processor LLVM knows for %s (for example x86-64-v3, skylake, znver3)",
                   o->target_cpu, triple);
        LLVMDisposeMessage(triple);
        return NULL;
    }
    char *cpu = o->target_cpu ? NULL : LLVMGetHostCPUName();
    char *features = o->target_cpu ? NULL : LLVMGetHostCPUFeatures();
    LLVMTargetMachineRef tm =
        LLVMCreateTargetMachine(target, triple, o->target_cpu ? o->target_cpu : cpu, features ? features : "",
                                LLVMCodeGenLevelAggressive, LLVMRelocPIC, LLVMCodeModelDefault);
    LLVMDisposeMessage(triple);
    if (cpu) LLVMDisposeMessage(cpu);
    if (features) LLVMDisposeMessage(features);
    return tm;
}

/* The eval step's own kernels (OpDef.cg_eval), one per node. */
static bool generate_eval_kernels(Cg *c, const RankPlan *rp) {
    for (int s = 0; s < rp->n_eval; s++) {
        const Node *n = rp->eval[s].node;
        if (rp->eval[s].kind != STEP_COMPUTE || !n->def || !n->def->cg_eval || c->eval_kernels[n->id].n_bufs) continue;
        c->eval_form = true;
        bool ok = n->def->cg_eval(c, n) && !diag_failed(c->d);
        c->eval_form = false;
        if (!ok)
            return diag_error(c->d, DIAG_INTERNAL, "%s: node '%s' (%s): code generation of the eval kernel failed",
                              c->g->path, n->name, n->op_type);
    }
    return true;
}

static bool generate_kernels(Cg *c, const RankPlan *rp, CgShare *share) {
    if (!generate_eval_kernels(c, rp)) return false;
    for (int s = 0; s < rp->n_train; s++) {
        if (rp->train[s].kind != STEP_COMPUTE) continue;
        const Node *n = rp->train[s].node;
        if (c->kernels[n->id].fn || c->kernels[n->id].n_bufs) continue; /* another micro-batch or stage made it */
        if (!n->def || !n->def->cg)
            return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): no code generation rule", c->g->path,
                              n->name, n->op_type);
        if (share && cg_share_reuse(c, share, n)) continue; /* a twin's kernel */
        if (!n->def->cg(c, n) || diag_failed(c->d))
            return diag_error(c->d, DIAG_INTERNAL, "%s: node '%s' (%s): code generation failed", c->g->path, n->name,
                              n->op_type);
        if (share) cg_share_add(c, share, n);
    }
    return true;
}

/* Programs in the module: one per stage (as its replica-0 rank runs it),
 * the one stage of a single or dp plan included. */
static int n_programs(const Plan *p) { return p->n_stages; }

/* The initial images of every program, back to back (plan_init_offset). */
static unsigned char *all_images(const Plan *p, size_t *len, Diag *d) {
    int n = n_programs(p);
    const RankPlan *last = plan_stage_rank(p, n - 1);
    int64_t total = plan_init_offset(p, n - 1) + last->init_bytes;
    /* Embedded as one constant: past 2 GiB neither LLVM's default code
     * model nor the linker takes it. */
    if (total > ((int64_t)2 << 30)) {
        diag_error(d, DIAG_LIMIT, "%s: the programs' initial arena images (inputs at this batch, parameters, state) "
                   "take %.1f GiB; a program embeds at most 2 GiB", p->g->path, (double)total / (1 << 30));
        return NULL;
    }
    *len = (size_t)total;
    unsigned char *all = calloc(1, *len ? *len : 1);
    for (int k = 0; all && k < n; k++) {
        const RankPlan *rp = plan_stage_rank(p, k);
        unsigned char *img = init_image(p, rp);
        if (!img) {
            free(all);
            return NULL;
        }
        memcpy(all + plan_init_offset(p, k), img, (size_t)rp->init_bytes);
        free(img);
    }
    return all;
}

/* Step functions of every program, and the selector the runtime sets. */
static bool build_steps(Cg *c, const Plan *p) {
    LLVMValueRef program = LLVMAddGlobal(c->mod, c->t_i32, "cleave_program");
    LLVMSetInitializer(program, LLVMConstInt(c->t_i32, 0, 0));
    int n = p->n_stages;
    LLVMValueRef *train = calloc((size_t)n, sizeof *train), *eval = calloc((size_t)n, sizeof *eval);
    LLVMValueRef *acc = calloc((size_t)p->g->n_values + 1, sizeof *acc);
    bool ok = train && eval && acc;
    if (!ok) diag_error(c->d, DIAG_NOMEM, "out of memory");
    for (int k = 0; ok && k < n; k++) {
        const RankPlan *rp = plan_stage_rank(p, k);
        char name[64];
        snprintf(name, sizeof name, "cleave_train_step_%d", k);
        ok = build_step_fn(c, name, k, 0, rp, rp->train, rp->n_train, acc);
        train[k] = LLVMGetNamedFunction(c->mod, name);
        snprintf(name, sizeof name, "cleave_eval_step_%d", k);
        ok = ok && build_step_fn(c, name, k, 1, rp, rp->eval, rp->n_eval, acc);
        eval[k] = LLVMGetNamedFunction(c->mod, name);
    }
    if (ok) {
        build_dispatch(c, "cleave_train_step", program, train, n);
        build_dispatch(c, "cleave_eval_step", program, eval, n);
    }
    free(train);
    free(eval);
    free(acc);
    return ok;
}

/* Writes the module as o->emit says.  Every file is written under a
 * temporary name beside -o's target and renamed over it only when whole;
 * the object of an executable is a temporary too, never "PROG.o", so that
 * nothing but the target is touched (out_file.h). */
static bool emit(Cg *c, LLVMTargetMachineRef tm, const CgOptions *o) {
    char *err = NULL;
    bool exe = strcmp(o->emit, "exe") == 0, ok = true;
    OutFile out, obj = {0};
    int e = out_file_reserve(&out, o->output);
    if (!e && exe) e = out_file_reserve(&obj, o->output);
    if (e) {
        out_file_abort(&out);
        return diag_error(c->d, DIAG_IO, "-o %s: cannot write: %s", o->output, out_file_why(e));
    }
    if (strcmp(o->emit, "llvm") == 0) {
        if (LLVMPrintModuleToFile(c->mod, out.tmp, &err)) ok = diag_error(c->d, DIAG_IO, "-o %s: cannot write: %s", o->output, err);
    } else if (LLVMTargetMachineEmitToFile(tm, c->mod, exe ? obj.tmp : out.tmp, LLVMObjectFile, &err)) {
        ok = diag_error(c->d, DIAG_IO, "-o %s: cannot write the object: %s", o->output, err);
    }
    if (err) LLVMDisposeMessage(err);
    if (ok && exe) ok = cg_link(obj.tmp, out.tmp, o->output, c->d);
    out_file_abort(&obj);
    if (!ok) {
        out_file_abort(&out);
        return false;
    }
    e = out_file_commit(&out);
    return !e || diag_error(c->d, DIAG_IO, "-o %s: write failed: %s", o->output, out_file_why(e));
}

struct CgModule {
    const char *passes;
    LLVMOrcThreadSafeContextRef tsc;
    Cg c;
    LLVMTargetMachineRef tm;
    bool optimized;
};

void cg_module_free(CgModule *m) {
    if (!m) return;
    if (m->c.b) LLVMDisposeBuilder(m->c.b);
    if (m->c.mod) LLVMDisposeModule(m->c.mod);
    if (m->tsc) LLVMOrcDisposeThreadSafeContext(m->tsc);
    if (m->tm) LLVMDisposeTargetMachine(m->tm);
    free(m->c.kernels);
    free(m->c.eval_kernels);
    cg_fuse_free(m->c.fuse);
    free(m);
}

CgModule *cg_build(const Plan *p, const CgOptions *o, Diag *d) {
    CgModule *m = calloc(1, sizeof *m);
    if (!m) {
        diag_error(d, DIAG_NOMEM, "out of memory");
        return NULL;
    }
    m->passes = o->passes ? o->passes : "default<O3>";
    Cg *c = &m->c;
    c->g = p->g;
    c->d = d;
    c->plan = p;
    c->kernels = calloc((size_t)p->g->n_nodes + 1, sizeof *c->kernels);
    c->eval_kernels = calloc((size_t)p->g->n_nodes + 1, sizeof *c->eval_kernels);
    size_t model_len = 0;
    uint8_t *model = o->model_path ? file_read_all(o->model_path, &model_len, d) : calloc(1, 1);
    size_t img_len = 0;
    unsigned char *img = model ? all_images(p, &img_len, d) : NULL;
    m->tm = model && img && c->kernels && c->eval_kernels ? make_target(o, d) : NULL;
    if (!m->tm) {
        if (!diag_failed(d)) diag_error(d, DIAG_NOMEM, "out of memory");
        free(model);
        free(img);
        cg_module_free(m);
        return NULL;
    }
    m->tsc = LLVMOrcCreateNewThreadSafeContext();
    c->ctx = LLVMOrcThreadSafeContextGetContext(m->tsc);
    c->mod = LLVMModuleCreateWithNameInContext("cleave_program", c->ctx);
    c->b = LLVMCreateBuilderInContext(c->ctx);
    init_types(c);
    char *triple = LLVMGetTargetMachineTriple(m->tm);
    LLVMSetTarget(c->mod, triple);
    LLVMDisposeMessage(triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(m->tm);
    LLVMSetModuleDataLayout(c->mod, layout);
    LLVMDisposeTargetData(layout);
    bool ok = true;
    CgShare *share = cg_share_new(); /* NULL (no memory): every node builds its own */
    for (int k = 0; ok && k < n_programs(p); k++) ok = generate_kernels(c, plan_stage_rank(p, k), share);
    if (ok && o->verbose)
        fprintf(stderr, "cleave: %d nodes share a twin's kernel\n", cg_share_count(share));
    cg_share_free(share);
    ok = ok && (o->no_fuse || cg_fuse_scan(c, n_programs(p))) && build_steps(c, p);
    if (ok && o->verbose) {
        int chains, nodes, headed, tails, unfused;
        cg_fuse_stats(c, &chains, &nodes, &headed, &tails, &unfused);
        fprintf(stderr,
                "cleave: fused %d element-wise chains (%d nodes; %d run on a convolution's blocks) and %d batch "
                "statistics into a convolution's blocks; %d left apart, their buffers overlapping\n",
                chains, nodes, headed, tails, unfused);
    }
    if (ok) {
        const char *meta = o->meta_json ? o->meta_json : "{}";
        add_bytes(c, "cleave_meta", meta, strlen(meta));
        add_u64(c, "cleave_meta_len", strlen(meta));
        add_bytes(c, "cleave_init", img, img_len ? img_len : 1);
        add_bytes(c, "cleave_model", model, model_len ? model_len : 1);
        add_u64(c, "cleave_model_len", model_len);
    }
    free(model);
    free(img);
    if (!ok) {
        cg_module_free(m);
        return NULL;
    }
    return m;
}

/* Verifies the module and runs the O3 pipeline for the target machine. */
static bool optimize(CgModule *m, Diag *d) {
    if (m->optimized) return true;
    char *err = NULL;
    if (LLVMVerifyModule(m->c.mod, LLVMReturnStatusAction, &err)) {
        diag_error(d, DIAG_INTERNAL, "generated module is invalid: %.400s", err);
        LLVMDisposeMessage(err);
        return false;
    }
    LLVMDisposeMessage(err);
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMErrorRef e = LLVMRunPasses(m->c.mod, m->passes, m->tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
        char *msg = LLVMGetErrorMessage(e);
        diag_error(d, DIAG_INTERNAL, "optimisation failed: %s", msg);
        LLVMDisposeErrorMessage(msg);
        return false;
    }
    m->optimized = true;
    return true;
}

bool cg_emit(CgModule *m, const CgOptions *o, Diag *d) {
    m->c.d = d;
    return optimize(m, d) && emit(&m->c, m->tm, o);
}

struct CgJit {
    LLVMOrcLLJITRef jit;
};

static bool jit_error(LLVMErrorRef e, Diag *d, const char *what) {
    if (!e) return true;
    char *msg = LLVMGetErrorMessage(e);
    diag_error(d, DIAG_INTERNAL, "JIT %s: %s", what, msg);
    LLVMDisposeErrorMessage(msg);
    return false;
}

CgJit *cg_jit(CgModule *m, Diag *d) {
    if (!optimize(m, d)) return NULL;
    CgJit *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (!jit_error(LLVMOrcCreateLLJIT(&j->jit, NULL), d, "creation")) {
        free(j);
        return NULL;
    }
    LLVMOrcDefinitionGeneratorRef gen;
    if (!jit_error(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(j->jit),
                                                                        NULL, NULL), d, "symbol search")) {
        cg_jit_free(j);
        return NULL;
    }
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j->jit), gen);
    /* The JIT takes the module and its context. */
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(m->c.mod, m->tsc);
    m->c.mod = NULL;
    if (!jit_error(LLVMOrcLLJITAddLLVMIRModule(j->jit, LLVMOrcLLJITGetMainJITDylib(j->jit), tsm), d, "add module")) {
        cg_jit_free(j);
        return NULL;
    }
    return j;
}

void *cg_jit_lookup(CgJit *j, const char *name, Diag *d) {
    LLVMOrcExecutorAddress addr = 0;
    if (!jit_error(LLVMOrcLLJITLookup(j->jit, &addr, name), d, name)) return NULL;
    return (void *)(uintptr_t)addr;
}

void cg_jit_free(CgJit *j) {
    if (!j) return;
    if (j->jit) LLVMOrcDisposeLLJIT(j->jit);
    free(j);
}

bool cg_compile_plan(const Plan *p, const CgOptions *o, Diag *d) {
    CgModule *m = cg_build(p, o, d);
    if (!m) return false;
    bool ok = cg_emit(m, o, d);
    cg_module_free(m);
    return ok;
}
