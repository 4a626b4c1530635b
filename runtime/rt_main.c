/* rt_main.c - main() of every generated training program.
 *
 * The order is chosen so that mistakes surface before any training time is
 * spent: command line, metadata, the ranks' start-up exchange (same program,
 * same options, as many ranks as the program is compiled for), which file
 * feeds which input, whether the output files can be written, then every
 * data file is loaded in full and checked.  Only then is the arena
 * allocated, every rank confirms it got this far, and the step loop runs.
 *
 * This is the one file that names the symbols of rt_abi.h. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

/* Loads the file of every input (paths[k] feeds inputs[k]): all with the
 * same number of rows, at least one batch of them, labels in range. */
/* A rank loads the inputs its stage reads, and a stage reading none the
 * first one, to count the rows; the row positions come from no file. */
static bool load_inputs(const RtMeta *m, const char **paths, const char *flag, RtArray *arrays,
                        int64_t *rows, RtErr *e) {
    bool any_held = false;
    int first_file = -1, first = -1;
    for (int k = 0; k < m->n_inputs; k++) {
        if (m->inputs[k].positions) continue;
        any_held |= !m->inputs[k].absent;
        if (first_file < 0) first_file = k;
    }
    for (int k = 0; k < m->n_inputs; k++) {
        if (m->inputs[k].positions || (m->inputs[k].absent && (any_held || k != first_file))) continue;
        if (!rt_data_load(paths[k], &m->inputs[k], &arrays[k], e)) return false;
        if (first < 0) first = k;
        if (arrays[k].rows != arrays[first].rows)
            return rt_error(e, "%s: %" PRId64 " rows, but %s (%s %s) has %" PRId64 "; every input needs one row "
                            "per sample", paths[k], arrays[k].rows, paths[first], flag, m->inputs[first].name,
                            arrays[first].rows);
    }
    *rows = arrays[first].rows;
    if (*rows < m->batch)
        return rt_error(e, "%s: %" PRId64 " rows, fewer than the batch size %" PRId64 " (%s %s)", paths[first], *rows,
                        m->batch, flag, m->inputs[first].name);
    if (m->loss_kind == RT_LOSS_CE && !m->inputs[m->labels].absent &&
        !rt_labels_check(&arrays[m->labels], m, e))
        return false;
    return true;
}

static void free_arrays(RtArray *arrays, int n) {
    if (!arrays) return;
    for (int k = 0; k < n; k++) rt_array_free(&arrays[k]);
    free(arrays);
}

/* Everything before the first step that can fail on one rank alone: the
 * file bindings, the output files (rank 0), loading and checking the data,
 * and the allocations.  The caller makes every rank agree on the outcome
 * before any collective of the run. */
static bool prepare(const RtProgram *prog, const RtArgs *args, const RtMeta *meta, RtRun *r,
                    const char **train_paths, const char **eval_paths, RtErr *e) {
    bool rank0 = rt_rank() == 0;
    int n = meta->n_inputs;
    r->train = calloc((size_t)n, sizeof *r->train);
    if (args->n_eval) r->eval = calloc((size_t)n, sizeof *r->eval);
    if (!r->train || (args->n_eval && !r->eval)) return rt_error(e, "out of memory");
    if (args->predict && meta->output.row_elems == 0) {
        char shape[160];
        return rt_usage_error(e, "--predict: the program's output '%s' has shape %s, not one row per sample",
                              meta->output.name,
                              rt_shape_str(shape, sizeof shape, meta->output.ndim, meta->output.shape));
    }
    /* A warmup given at run time warms up a schedule named there or
     * compiled in, as at compile time it needs --lr-schedule. */
    if (args->has_warmup && !args->has_lr_schedule && !meta->has_lr_schedule)
        return rt_usage_error(e, "--warmup-steps needs --lr-schedule: the program was compiled without a schedule");
    r->lr_schedule = args->has_lr_schedule ? args->lr_schedule : meta->lr_schedule;
    r->warmup_steps = args->has_warmup ? args->warmup_steps : meta->warmup_steps;
    if (!rt_args_bind(meta, args->data, args->n_data, "--data", train_paths, e)) return false;
    if (args->n_eval && !rt_args_bind(meta, args->eval, args->n_eval, "--eval-data", eval_paths, e)) return false;
    if (rank0) {
        if (!rt_args_check_outputs(args, e)) return false;
        RtMeta all;
        rt_stage_save_view(meta, &all);
        if (args->save && (!rt_args_check_writable("--save", args->save, e) || !rt_save_check(prog, &all, e)))
            return false;
        if (args->predict && !rt_args_check_writable("--predict", args->predict, e)) return false;
        if (args->trace && !rt_args_check_writable("--trace", args->trace, e)) return false;
    }

    if (!load_inputs(meta, train_paths, "--data", r->train, &r->train_rows, e)) return false;
    if (args->n_eval && !load_inputs(meta, eval_paths, "--eval-data", r->eval, &r->eval_rows, e)) return false;

    int64_t per_epoch = rt_steps_per_epoch(r->train_rows, meta->batch);
    r->total_steps = args->steps;
    if (args->epochs && __builtin_mul_overflow(args->epochs, per_epoch, &r->total_steps))
        return rt_usage_error(e, "--epochs %" PRId64 " is too many", args->epochs);
    r->lr = args->has_lr ? args->lr : meta->lr;
    if (!rt_order_init(&r->order, r->train_rows, args->shuffle, args->seed, e)) return false;
    r->predict_on = args->predict != NULL;
    if (r->predict_on) {
        size_t row = (size_t)meta->output.row_elems, bytes;
        if (rt_ranks() > 1 && (uint64_t)meta->local_batch * row * (uint64_t)rt_ranks() > INT32_MAX)
            return rt_error(e, "--predict: %" PRId64 " output values per rank and batch, more than one MPI call "
                            "can gather", meta->local_batch * (int64_t)row);
        if (rank0) {
            bool overflow = __builtin_mul_overflow((size_t)r->eval_rows, row, &bytes) ||
                            __builtin_mul_overflow(bytes, sizeof(float), &bytes);
            r->predict = overflow ? NULL : malloc(bytes ? bytes : 1);
            if (!r->predict) return rt_error(e, "--predict: out of memory for %" PRId64 " rows", r->eval_rows);
            if (rt_ranks() > 1) {
                r->gathered = malloc((size_t)meta->local_batch * (size_t)rt_ranks() * row * sizeof(float) + 1);
                if (!r->gathered) return rt_error(e, "--predict: out of memory for a batch of outputs");
            }
        }
    }
    r->arena = aligned_alloc(64, (size_t)meta->arena_bytes);
    if (!r->arena) return rt_error(e, "out of memory for the arena of %" PRIu64 " bytes", meta->arena_bytes);
    memset(r->arena, 0, (size_t)meta->arena_bytes);
    memcpy(r->arena, prog->init + meta->layout.init_offset, (size_t)meta->init_bytes);
    if (meta->layout.has_seed) memcpy(r->arena + meta->seed_offset, &args->mask_seed, sizeof args->mask_seed);
    r->mask_seed = args->mask_seed;
    if (!rt_comm_setup(r->arena, meta, e)) return false;
    *prog->program = meta->layout.stage;
    /* Ranks of stages without the output still take part in gathering
     * --predict rows: they send zeros. */
    if (r->predict_on && !meta->layout.has_output) {
        r->zeros = calloc((size_t)meta->local_batch * (size_t)meta->output.row_elems + 1, sizeof(float));
        if (!r->zeros) return rt_error(e, "out of memory");
    }

    return rt_log_open(&r->log, args->metrics, !rank0, isatty(STDERR_FILENO) == 1, r->total_steps, meta->batch,
                       args->log_every, e);
}

/* Checkpoints need the optimizer state listed in the metadata, and rank 0
 * the model's identity, which a checkpoint records and resuming checks. */
static bool prepare_checkpoints(const RtProgram *prog, const RtMeta *meta, RtCheckpoint *c, RtRun *r, RtErr *e) {
    const char *flag = c->dir ? "--checkpoint" : "--resume";
    if (!meta->has_state)
        return rt_usage_error(e, "%s: this program's metadata lists no optimizer state (compiled by an older "
                              "cleave): recompile it", flag);
    if (rt_rank() == 0) {
        RtMeta all;
        rt_stage_save_view(meta, &all);
        if (!rt_save_check(prog, &all, e) || !rt_save_model_hash(prog, meta, &c->model_hash, e)) return false;
    }
    r->ckpt = c;
    return true;
}

static bool run(const RtProgram *prog, const RtArgs *args, const RtMeta *meta, RtErr *e) {
    bool rank0 = rt_rank() == 0, ok = false;
    int n = meta->n_inputs, ranks = rt_ranks();
    if (meta->ranks == 1 && ranks > 1)
        rt_warn("%s was compiled for one rank but runs on %d: each rank trains on the whole of every batch, all "
                "the same (compile with --ranks %d --strategy dp to share the batch among them)",
                rt_prog_name(), ranks, ranks);
    const char **train_paths = calloc((size_t)n, sizeof *train_paths);
    const char **eval_paths = calloc((size_t)n, sizeof *eval_paths);
    RtRun r = {.prog = prog, .meta = meta};
    RtCheckpoint ckpt = {.dir = args->checkpoint, .every = args->checkpoint_every, .keep = (int)args->checkpoint_keep,
                         .prog = prog};
    if (!train_paths || !eval_paths) rt_error(e, "out of memory");
    else prepare(prog, args, meta, &r, train_paths, eval_paths, e);
    if (!e->status && (args->checkpoint || args->resume)) prepare_checkpoints(prog, meta, &ckpt, &r, e);
    /* The workers of a program compiled with --threads, once for the run. */
    if (!e->status) rt_pool_start(meta->threads, e);
    /* The first collective after start-up: a rank that failed above (a file
     * only it cannot read) stops every rank here, with its message. */
    if (!rt_comm_agree_rows(r.train_rows, r.eval_rows, e)) goto out;
    rt_bind_ranks(!args->no_bind);
    rt_comm_groups();
    if (rt_layout_pipelined(&meta->layout)) rt_stage_report(&r.log, meta);
    if (args->resume && !rt_ckpt_resume(&ckpt, args->resume, &r, e)) goto out;
    r.log.start = r.log.step_mark = r.start_step;
    rt_signal_install();
    rt_trace_start(args->trace != NULL);

    if (!rt_train_run(&r, e)) goto out;
    rt_watch_phase("the end of the run");
    rt_comm_state_from_replica0(meta, r.arena);
    /* A failed log write (--trace, --metrics) is reported at the end but
     * never costs the trained model: it goes to its own RtErr, and the
     * save below runs whatever it says. */
    RtErr log_e = {0};
    if (args->trace) rt_trace_write(args->trace, meta, r.total_steps - r.start_step, &log_e);
    if (args->check_replicas) {
        if (!rt_comm_check_replicas(meta, r.arena, e)) goto out;
        if (rank0) {
            rt_log_break_line();
            fprintf(stderr, "%s: replicas identical (%d rank%s)\n", rt_prog_name(), ranks, ranks > 1 ? "s" : "");
            fflush(stderr);
        }
    }
    /* Rank 0 writes the files (the replicas hold the same parameters); the
     * others wait for the outcome so that every rank exits the same way. */
    rt_log_close(&r.log, &log_e);
    if (args->save) {
        RtMeta all;
        char *params = NULL;
        rt_watch_phase("saving");
        rt_stage_gather_params(meta, r.arena, &all, &params, e);
        if (rank0 && !e->status) rt_save_write(args->save, prog, &all, params, e);
        free(params);
    }
    if (!e->status && r.predict) {
        int64_t shape[RT_MAX_DIMS];
        memcpy(shape, meta->output.shape, sizeof shape);
        shape[0] = r.eval_rows;
        rt_npy_write(args->predict, r.predict, meta->output.ndim, shape, e);
    }
    /* The log's failure is the run's when nothing worse happened; when
     * something did, it is still said. */
    if (log_e.status && e->status) {
        rt_warn("%s", log_e.msg);
    } else if (log_e.status) {
        size_t len = strlen(log_e.msg);
        if (args->save && len < sizeof log_e.msg)
            snprintf(log_e.msg + len, sizeof log_e.msg - len, " (the trained model is saved in %s)", args->save);
        *e = log_e;
    }
    rt_watch_phase("the end of the run");
    if (!rt_comm_agree(e)) goto out;
    ok = true;
out:
    rt_pool_stop();
    rt_log_discard(&r.log);
    rt_comm_free();
    free(r.arena);
    free(r.zeros);
    free(r.predict);
    free(r.gathered);
    rt_order_free(&r.order);
    free_arrays(r.train, n);
    free_arrays(r.eval, n);
    free(train_paths);
    free(eval_paths);
    return ok;
}

int main(int argc, char **argv) {
    rt_set_prog_name(argc > 0 ? argv[0] : NULL);
    rt_comm_init(&argc, &argv);
    const RtProgram prog = {
        .meta = cleave_meta,
        .meta_len = (size_t)cleave_meta_len,
        .init = cleave_init,
        .model = cleave_model,
        .model_len = (size_t)cleave_model_len,
        .train_step = cleave_train_step,
        .eval_step = cleave_eval_step,
        .program = &cleave_program,
    };
    RtErr e = {0};
    RtArgs args;
    RtMeta meta;
    bool ok = rt_args_parse(argc, argv, &args, &e);
    /* The watchdog covers every wait for other ranks from the start-up
     * exchange on; a calibration (--calibrate-comm) runs without one.  A
     * rank whose command line is wrong watches that exchange with the
     * default time-out. */
    if (rt_ranks() > 1 && !(ok && args.calibrate_comm) &&
        !rt_watch_start(ok ? args.timeout : RT_TIMEOUT_DEFAULT, rt_prog_name(), rt_rank(), &e))
        ok = false;
    /* A calibration runs on any number of ranks, whatever the program was
     * compiled for, so it skips the start-up checks of a training run. */
    if (ok && !args.help && args.calibrate_comm) {
        ok = rt_calibrate_comm(args.calibrate_comm, &e);
        rt_args_free(&args);
        if (!ok) rt_die(&e);
        rt_comm_finalize();
        return 0;
    }
    bool help = ok && args.help;
    bool have_meta = ok && !help && rt_meta_parse_rank(prog.meta, prog.meta_len, rt_rank(), &meta, &e);
    /* Every rank gets here, whatever went wrong so far: the ranks compare
     * programs and options, and stop together if any of them failed. */
    RtHello hello = {.meta = have_meta ? &meta : NULL, .help = help, .options = ok ? rt_args_fingerprint(&args) : 0};
    bool any_help = false;
    ok = rt_comm_startup(&hello, &any_help, &e);
    if (ok && any_help) {
        if (rt_rank() == 0) {
            /* A program whose metadata is broken still explains its flags. */
            RtMeta help_meta;
            RtErr ignored = {0};
            bool have_help_meta = rt_meta_parse(prog.meta, prog.meta_len, &help_meta, &ignored);
            rt_args_usage(stdout, have_help_meta ? &help_meta : NULL);
            if (have_help_meta) rt_meta_free(&help_meta);
        }
    } else if (ok) {
        ok = run(&prog, &args, &meta, &e);
    }
    if (have_meta) rt_meta_free(&meta);
    rt_args_free(&args);
    if (!ok) rt_die(&e);
    rt_comm_finalize();
    return 0;
}

/* Under AddressSanitizer (the project's sanitizer test build), programs
 * end with Open MPI's allocations from MPI_Init still reachable only
 * through its own globals.  These hooks, which the sanitizer runtime calls
 * when present and nothing calls otherwise, name those libraries, and ask
 * for full unwinding on malloc so their frames appear on the stacks the
 * suppressions match. */
const char *__asan_default_options(void);
const char *__lsan_default_suppressions(void);

const char *__asan_default_options(void) { return "fast_unwind_on_malloc=0"; }

const char *__lsan_default_suppressions(void) {
    return "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libhwloc.so\nleak:libevent\n"
           "leak:libpmix.so\n";
}
