/* rt_main.c - main() of every generated training program.
 *
 * The order is chosen so that mistakes surface before any training time is
 * spent: command line, metadata, which file feeds which input, whether the
 * output files can be written, then every data file is loaded in full and
 * checked.  Only then is the arena allocated and the step loop run.
 *
 * This is the one file that names the symbols of rt_abi.h. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

/* Loads the file of every input (paths[k] feeds inputs[k]): all with the
 * same number of rows, at least one batch of them, labels in range. */
static bool load_inputs(const RtMeta *m, const char **paths, const char *flag, RtArray *arrays,
                        int64_t *rows, RtErr *e) {
    for (int k = 0; k < m->n_inputs; k++) {
        if (!rt_data_load(paths[k], &m->inputs[k], &arrays[k], e)) return false;
        if (arrays[k].rows != arrays[0].rows)
            return rt_error(e, "%s: %" PRId64 " rows, but %s (%s %s) has %" PRId64 "; every input needs one row "
                            "per sample", paths[k], arrays[k].rows, paths[0], flag, m->inputs[0].name,
                            arrays[0].rows);
    }
    *rows = arrays[0].rows;
    if (*rows < m->batch)
        return rt_error(e, "%s: %" PRId64 " rows, fewer than the batch size %" PRId64 " (%s %s)", paths[0], *rows,
                        m->batch, flag, m->inputs[0].name);
    if (m->loss_kind == RT_LOSS_CE && !rt_labels_check(&arrays[m->labels], m->classes, e)) return false;
    return true;
}

static void free_arrays(RtArray *arrays, int n) {
    if (!arrays) return;
    for (int k = 0; k < n; k++) rt_array_free(&arrays[k]);
    free(arrays);
}

static bool run(const RtProgram *prog, const RtArgs *args, RtErr *e) {
    RtMeta meta;
    if (!rt_meta_parse(prog->meta, prog->meta_len, &meta, e)) return false;
    bool rank0 = rt_rank() == 0, ok = false;
    int n = meta.n_inputs;
    const char **train_paths = calloc((size_t)n, sizeof *train_paths);
    const char **eval_paths = calloc((size_t)n, sizeof *eval_paths);
    RtRun r = {.prog = prog, .meta = &meta};
    r.train = calloc((size_t)n, sizeof *r.train);
    if (args->n_eval) r.eval = calloc((size_t)n, sizeof *r.eval);
    if (!train_paths || !eval_paths || !r.train || (args->n_eval && !r.eval)) {
        rt_error(e, "out of memory");
        goto out;
    }
    if (args->predict && meta.output.row_elems == 0) {
        char shape[160];
        rt_usage_error(e, "--predict: the program's output '%s' has shape %s, not one row per sample",
                       meta.output.name, rt_shape_str(shape, sizeof shape, meta.output.ndim, meta.output.shape));
        goto out;
    }
    if (!rt_args_bind(&meta, args->data, args->n_data, "--data", train_paths, e)) goto out;
    if (args->n_eval && !rt_args_bind(&meta, args->eval, args->n_eval, "--eval-data", eval_paths, e)) goto out;
    if (rank0) {
        if (args->save && (!rt_args_check_writable("--save", args->save, e) || !rt_save_check(prog, &meta, e)))
            goto out;
        if (args->predict && !rt_args_check_writable("--predict", args->predict, e)) goto out;
    }

    if (!load_inputs(&meta, train_paths, "--data", r.train, &r.train_rows, e)) goto out;
    if (args->n_eval && !load_inputs(&meta, eval_paths, "--eval-data", r.eval, &r.eval_rows, e)) goto out;

    int64_t per_epoch = rt_steps_per_epoch(r.train_rows, meta.batch);
    r.total_steps = args->steps;
    if (args->epochs && __builtin_mul_overflow(args->epochs, per_epoch, &r.total_steps)) {
        rt_usage_error(e, "--epochs %" PRId64 " is too many", args->epochs);
        goto out;
    }
    r.lr = args->has_lr ? args->lr : meta.lr;
    if (!rt_order_init(&r.order, r.train_rows, args->shuffle, args->seed, e)) goto out;
    if (args->predict && rank0) {
        size_t bytes;
        bool overflow = __builtin_mul_overflow((size_t)r.eval_rows, (size_t)meta.output.row_elems, &bytes) ||
                        __builtin_mul_overflow(bytes, sizeof(float), &bytes);
        r.predict = overflow ? NULL : malloc(bytes ? bytes : 1);
        if (!r.predict) {
            rt_error(e, "--predict: out of memory for %" PRId64 " rows", r.eval_rows);
            goto out;
        }
    }
    r.arena = aligned_alloc(64, (size_t)meta.arena_bytes);
    if (!r.arena) {
        rt_error(e, "out of memory for the arena of %" PRIu64 " bytes", meta.arena_bytes);
        goto out;
    }
    memset(r.arena, 0, (size_t)meta.arena_bytes);
    memcpy(r.arena, prog->init, (size_t)meta.init_bytes);

    if (!rt_log_open(&r.log, args->metrics, !rank0, isatty(STDERR_FILENO) == 1, r.total_steps, meta.batch,
                     args->log_every, e))
        goto out;
    if (!rt_train_run(&r, e)) goto out;
    if (!rt_log_close(&r.log, e)) goto out;
    if (rank0 && args->save && !rt_save_write(args->save, prog, &meta, r.arena, e)) goto out;
    if (r.predict) {
        int64_t shape[RT_MAX_DIMS];
        memcpy(shape, meta.output.shape, sizeof shape);
        shape[0] = r.eval_rows;
        if (!rt_npy_write(args->predict, r.predict, meta.output.ndim, shape, e)) goto out;
    }
    ok = true;
out:
    rt_log_discard(&r.log);
    free(r.arena);
    free(r.predict);
    rt_order_free(&r.order);
    free_arrays(r.train, n);
    free_arrays(r.eval, n);
    free(train_paths);
    free(eval_paths);
    rt_meta_free(&meta);
    return ok;
}

int main(int argc, char **argv) {
    rt_comm_init(&argc, &argv);
    const RtProgram prog = {
        .meta = cleave_meta,
        .meta_len = (size_t)cleave_meta_len,
        .init = cleave_init,
        .model = cleave_model,
        .model_len = (size_t)cleave_model_len,
        .train_step = cleave_train_step,
        .eval_step = cleave_eval_step,
    };
    RtErr e = {0};
    RtArgs args;
    bool ok = rt_args_parse(argc, argv, &args, &e);
    if (ok && args.help) {
        if (rt_rank() == 0) {
            /* A program whose metadata is broken still explains its flags. */
            RtMeta meta;
            RtErr ignored = {0};
            bool have_meta = rt_meta_parse(prog.meta, prog.meta_len, &meta, &ignored);
            rt_args_usage(stdout, have_meta ? &meta : NULL);
            if (have_meta) rt_meta_free(&meta);
        }
    } else if (ok) {
        ok = run(&prog, &args, &e);
    }
    rt_args_free(&args);
    if (!ok) rt_die(&e);
    rt_comm_finalize();
    return 0;
}
