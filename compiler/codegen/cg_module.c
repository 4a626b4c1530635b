/* cg_module.c - one LLVM module per program: the kernels of every planned
 * node, the step functions that call them, the embedded metadata, initial
 * arena image and source model (see runtime/rt_abi.h, grep RT_ABI), then
 * verification, O3 for the target CPU, and emission. */
#include <llvm-c/Analysis.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
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
#include "../frontend/file_util.h"
#include "../ops/ops.h"

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

/* A runtime entry point taking one i32 (or none): RT_ABI collectives. */
static void call_rt(Cg *c, const char *name, int arg) {
    LLVMTypeRef pt = c->t_i32;
    LLVMTypeRef fty = LLVMFunctionType(c->t_void, &pt, arg >= 0 ? 1 : 0, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(c->mod, name);
    if (!fn) fn = LLVMAddFunction(c->mod, name, fty);
    LLVMValueRef a = LLVMConstInt(c->t_i32, (unsigned long long)(arg >= 0 ? arg : 0), 0);
    LLVMBuildCall2(c->b, fty, fn, &a, arg >= 0 ? 1 : 0, "");
}

/* Calls node kernels from a step function in plan order; collectives call
 * the runtime, which also gets a chance to progress outstanding ones after
 * every kernel while any is in flight. */
static void build_step_fn(Cg *c, const char *name, const PlanStep *steps, int n) {
    LLVMTypeRef pt = c->t_ptr;
    LLVMValueRef fn = LLVMAddFunction(c->mod, name, LLVMFunctionType(c->t_void, &pt, 1, 0));
    LLVMPositionBuilderAtEnd(c->b, LLVMAppendBasicBlockInContext(c->ctx, fn, "entry"));
    LLVMValueRef arena = LLVMGetParam(fn, 0);
    int in_flight = 0;
    for (int s = 0; s < n; s++) {
        if (steps[s].kind == STEP_ALLREDUCE_START) {
            call_rt(c, "cleave_rt_allreduce_start", steps[s].bucket);
            in_flight++;
            continue;
        }
        if (steps[s].kind == STEP_ALLREDUCE_WAIT) {
            call_rt(c, "cleave_rt_allreduce_wait", steps[s].bucket);
            in_flight--;
            continue;
        }
        const CgKernel *k = &c->kernels[steps[s].node->id];
        if (!k->fn) continue; /* views: nothing to run */
        LLVMValueRef args[CG_MAX_BUFS];
        LLVMTypeRef types[CG_MAX_BUFS];
        for (int i = 0; i < k->n_bufs; i++) {
            LLVMValueRef off = cg_i64(c, c->rp->offset[k->bufs[i]->id]);
            args[i] = LLVMBuildInBoundsGEP2(c->b, c->t_i8, arena, &off, 1, "");
            types[i] = c->t_ptr;
        }
        LLVMBuildCall2(c->b, LLVMFunctionType(c->t_void, types, (unsigned)k->n_bufs, 0), k->fn, args,
                       (unsigned)k->n_bufs, "");
        if (in_flight > 0) call_rt(c, "cleave_rt_progress", -1);
    }
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

static bool generate_kernels(Cg *c, const RankPlan *rp) {
    for (int s = 0; s < rp->n_train; s++) {
        if (rp->train[s].kind != STEP_COMPUTE) continue;
        const Node *n = rp->train[s].node;
        if (!n->def || !n->def->cg)
            return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): no code generation rule", c->g->path,
                              n->name, n->op_type);
        if (!n->def->cg(c, n) || diag_failed(c->d))
            return diag_error(c->d, DIAG_INTERNAL, "%s: node '%s' (%s): code generation failed", c->g->path, n->name,
                              n->op_type);
    }
    return true;
}

static bool emit(Cg *c, LLVMTargetMachineRef tm, const CgOptions *o) {
    char *err = NULL;
    if (strcmp(o->emit, "llvm") == 0) {
        if (LLVMPrintModuleToFile(c->mod, o->output, &err)) {
            diag_error(c->d, DIAG_IO, "%s: cannot write: %s", o->output, err);
            LLVMDisposeMessage(err);
            return false;
        }
        return true;
    }
    char obj[4096];
    if (strcmp(o->emit, "obj") == 0) snprintf(obj, sizeof obj, "%s", o->output);
    else snprintf(obj, sizeof obj, "%s.o", o->output);
    if (LLVMTargetMachineEmitToFile(tm, c->mod, obj, LLVMObjectFile, &err)) {
        diag_error(c->d, DIAG_IO, "%s: cannot write object: %s", obj, err);
        LLVMDisposeMessage(err);
        return false;
    }
    if (strcmp(o->emit, "exe") != 0) return true;
    bool ok = cg_link(obj, o->output, c->d);
    unlink(obj);
    return ok;
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
    free(m);
}

CgModule *cg_build(const Plan *p, const CgOptions *o, Diag *d) {
    const RankPlan *rp = &p->ranks[0];
    CgModule *m = calloc(1, sizeof *m);
    if (!m) {
        diag_error(d, DIAG_NOMEM, "out of memory");
        return NULL;
    }
    m->passes = o->passes ? o->passes : "default<O3>";
    Cg *c = &m->c;
    c->g = p->g;
    c->d = d;
    c->rp = rp;
    c->kernels = calloc((size_t)p->g->n_nodes + 1, sizeof *c->kernels);
    size_t model_len = 0;
    uint8_t *model = o->model_path ? file_read_all(o->model_path, &model_len, d) : calloc(1, 1);
    unsigned char *img = init_image(p, rp);
    m->tm = model && img && c->kernels ? make_target(o, d) : NULL;
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
    bool ok = generate_kernels(c, rp);
    if (ok) {
        const char *meta = o->meta_json ? o->meta_json : "{}";
        build_step_fn(c, "cleave_train_step", rp->train, rp->n_train);
        build_step_fn(c, "cleave_eval_step", rp->eval, rp->n_eval);
        add_bytes(c, "cleave_meta", meta, strlen(meta));
        add_u64(c, "cleave_meta_len", strlen(meta));
        add_bytes(c, "cleave_init", img, (size_t)(rp->init_bytes ? rp->init_bytes : 1));
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
