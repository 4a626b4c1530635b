/* rt_args.c - the program's command line.
 *
 * Every flag takes its value as the next argument or after '='
 * (--steps 10, --steps=10).  Mistakes are usage errors (exit status 2) and
 * name the flag and the value. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

static bool parse_count(const char *flag, const char *s, int64_t min, int64_t *out, RtErr *e) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || errno || x < min || s[0] == '+' || s[0] == ' ')
        return rt_usage_error(e, "%s needs an integer of at least %" PRId64 ", got '%s'", flag, min, s);
    *out = (int64_t)x;
    return true;
}

static bool parse_seed(const char *flag, const char *s, uint64_t *out, RtErr *e) {
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-' || s[0] == '+' || s[0] == ' ')
        return rt_usage_error(e, "%s needs a seed from 0 to %llu, got '%s'", flag, ULLONG_MAX, s);
    *out = (uint64_t)x;
    return true;
}

static bool parse_lr(const char *s, float *out, RtErr *e) {
    char *end = NULL;
    errno = 0;
    double x = strtod(s, &end);
    if (!*s || *end || errno == ERANGE || !isfinite(x) || !isfinite((float)x) || x < 0 || s[0] == ' ')
        return rt_usage_error(e, "--lr needs a non-negative float32 number, got '%s'", s);
    *out = (float)x;
    return true;
}

/* Seconds: a finite number >= 0 (strtod's forms; "inf" and "nan" are not
 * time-outs: 0 is the way to turn it off). */
static bool parse_seconds(const char *flag, const char *s, double *out, RtErr *e) {
    char *end = NULL;
    errno = 0;
    double x = strtod(s, &end);
    if (!*s || *end || errno == ERANGE || !isfinite(x) || x < 0 || s[0] == ' ')
        return rt_usage_error(e, "%s needs a number of seconds >= 0, got '%s'", flag, s);
    *out = x == 0 ? 0 : x; /* -0 too: the ranks compare its bits */
    return true;
}

static bool parse_named(const char *flag, const char *s, RtNamedFile *out, RtErr *e) {
    const char *eq = strchr(s, '=');
    if (!eq || eq == s || !eq[1])
        return rt_usage_error(e, "%s needs NAME=FILE, got '%s'", flag, s);
    /* The name is copied out of argv so argv itself is never modified. */
    char *name = strndup(s, (size_t)(eq - s));
    if (!name) return rt_error(e, "out of memory");
    out->name = name;
    out->path = eq + 1;
    return true;
}

static bool set_once(const char **slot, const char *flag, const char *value, RtErr *e) {
    if (*slot) return rt_usage_error(e, "%s given twice", flag);
    if (!*value) return rt_usage_error(e, "%s needs a file name", flag);
    *slot = value;
    return true;
}

bool rt_args_parse(int argc, char **argv, RtArgs *a, RtErr *e) {
    memset(a, 0, sizeof *a);
    a->log_every = 100;
    a->timeout = RT_TIMEOUT_DEFAULT;
    int n = argc > 0 ? argc : 1;
    a->data = calloc((size_t)n, sizeof *a->data);
    a->eval = calloc((size_t)n, sizeof *a->eval);
    if (!a->data || !a->eval) return rt_error(e, "out of memory");
    bool have_log_every = false, have_lr = false, have_keep = false, have_timeout = false;
    a->checkpoint_keep = 2;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            a->help = true;
            continue;
        }
        if (strncmp(arg, "--check-replicas", 16) == 0 && (arg[16] == 0 || arg[16] == '=')) {
            if (arg[16]) return rt_usage_error(e, "--check-replicas takes no value");
            a->check_replicas = true;
            continue;
        }
        if (strncmp(arg, "--no-bind", 9) == 0 && (arg[9] == 0 || arg[9] == '=')) {
            if (arg[9]) return rt_usage_error(e, "--no-bind takes no value");
            a->no_bind = true;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            return rt_usage_error(e, "unexpected argument '%s' (see --help)", arg);
        /* --flag=value or --flag value */
        char flag[32];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        size_t flen = eq ? (size_t)(eq - arg) : strlen(arg);
        if (flen >= sizeof flag) return rt_usage_error(e, "unknown option '%.*s' (see --help)", (int)flen, arg);
        memcpy(flag, arg, flen);
        flag[flen] = 0;
        static const char *const known[] = {"--data", "--eval-data", "--steps", "--epochs", "--lr",
                                            "--lr-schedule", "--warmup-steps", "--shuffle", "--seed",
                                            "--metrics", "--save", "--predict", "--log-every", "--trace",
                                            "--calibrate-comm", "--timeout", "--checkpoint",
                                            "--checkpoint-every", "--checkpoint-keep", "--resume"};
        bool is_known = false;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++) is_known |= strcmp(flag, known[k]) == 0;
        if (!is_known) return rt_usage_error(e, "unknown option '%s' (see --help)", flag);
        if (eq) value = eq + 1;
        else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) value = argv[++i];
        else return rt_usage_error(e, "%s needs a value", flag);

        bool ok = true;
        if (strcmp(flag, "--data") == 0) {
            ok = parse_named(flag, value, &a->data[a->n_data], e);
            a->n_data += ok;
        } else if (strcmp(flag, "--eval-data") == 0) {
            ok = parse_named(flag, value, &a->eval[a->n_eval], e);
            a->n_eval += ok;
        } else if (strcmp(flag, "--steps") == 0) {
            if (a->steps) return rt_usage_error(e, "--steps given twice");
            ok = parse_count(flag, value, 1, &a->steps, e);
        } else if (strcmp(flag, "--epochs") == 0) {
            if (a->epochs) return rt_usage_error(e, "--epochs given twice");
            ok = parse_count(flag, value, 1, &a->epochs, e);
        } else if (strcmp(flag, "--lr") == 0) {
            if (have_lr) return rt_usage_error(e, "--lr given twice");
            ok = parse_lr(value, &a->lr, e);
            have_lr = a->has_lr = true;
        } else if (strcmp(flag, "--lr-schedule") == 0) {
            if (a->has_lr_schedule) return rt_usage_error(e, "--lr-schedule given twice");
            if (!rt_lr_schedule_parse(value, &a->lr_schedule))
                return rt_usage_error(e, "--lr-schedule must be constant, linear or cosine, got '%s'", value);
            a->has_lr_schedule = true;
        } else if (strcmp(flag, "--warmup-steps") == 0) {
            if (a->has_warmup) return rt_usage_error(e, "--warmup-steps given twice");
            ok = parse_count(flag, value, 0, &a->warmup_steps, e);
            a->has_warmup = true;
        } else if (strcmp(flag, "--shuffle") == 0) {
            if (a->shuffle) return rt_usage_error(e, "--shuffle given twice");
            ok = parse_seed(flag, value, &a->seed, e);
            a->shuffle = true;
        } else if (strcmp(flag, "--seed") == 0) {
            if (a->has_mask_seed) return rt_usage_error(e, "--seed given twice");
            ok = parse_seed(flag, value, &a->mask_seed, e);
            a->has_mask_seed = true;
        } else if (strcmp(flag, "--log-every") == 0) {
            if (have_log_every) return rt_usage_error(e, "--log-every given twice");
            ok = parse_count(flag, value, 0, &a->log_every, e);
            have_log_every = true;
        } else if (strcmp(flag, "--timeout") == 0) {
            if (have_timeout) return rt_usage_error(e, "--timeout given twice");
            ok = parse_seconds(flag, value, &a->timeout, e);
            have_timeout = true;
        } else if (strcmp(flag, "--metrics") == 0) {
            ok = set_once(&a->metrics, flag, value, e);
        } else if (strcmp(flag, "--save") == 0) {
            ok = set_once(&a->save, flag, value, e);
        } else if (strcmp(flag, "--trace") == 0) {
            ok = set_once(&a->trace, flag, value, e);
        } else if (strcmp(flag, "--calibrate-comm") == 0) {
            ok = set_once(&a->calibrate_comm, flag, value, e);
        } else if (strcmp(flag, "--checkpoint") == 0) {
            ok = set_once(&a->checkpoint, flag, value, e);
        } else if (strcmp(flag, "--resume") == 0) {
            ok = set_once(&a->resume, flag, value, e);
        } else if (strcmp(flag, "--checkpoint-every") == 0) {
            if (a->checkpoint_every) return rt_usage_error(e, "--checkpoint-every given twice");
            ok = parse_count(flag, value, 1, &a->checkpoint_every, e);
        } else if (strcmp(flag, "--checkpoint-keep") == 0) {
            if (have_keep) return rt_usage_error(e, "--checkpoint-keep given twice");
            ok = parse_count(flag, value, 1, &a->checkpoint_keep, e) &&
                 (a->checkpoint_keep <= 1000000 ||
                  rt_usage_error(e, "--checkpoint-keep needs an integer from 1 to 1000000, got '%s'", value));
            have_keep = true;
        } else {
            ok = set_once(&a->predict, flag, value, e);
        }
        if (!ok) return false;
    }
    if (a->help) return true;
    /* A calibration trains nothing: a training flag with it is a mistake. */
    if (a->calibrate_comm) {
        if (a->n_data || a->n_eval || a->steps || a->epochs || a->has_lr || a->has_lr_schedule || a->has_warmup ||
            a->shuffle || a->has_mask_seed || have_log_every || have_timeout ||
            a->metrics || a->save || a->predict || a->trace || a->check_replicas || a->checkpoint || a->resume ||
            a->checkpoint_every || have_keep)
            return rt_usage_error(e, "--calibrate-comm takes no other option");
        return true;
    }
    if (a->n_data == 0) return rt_usage_error(e, "no --data given (see --help)");
    if (!a->steps && !a->epochs) return rt_usage_error(e, "give --steps K or --epochs E");
    if (a->steps && a->epochs) return rt_usage_error(e, "give --steps or --epochs, not both");
    if (a->predict && a->n_eval == 0) return rt_usage_error(e, "--predict needs --eval-data");
    if ((a->checkpoint_every || have_keep) && !a->checkpoint)
        return rt_usage_error(e, "%s needs --checkpoint DIR", a->checkpoint_every ? "--checkpoint-every" : "--checkpoint-keep");
    return true;
}

uint64_t rt_args_fingerprint(const RtArgs *a) {
    /* Fixed-width fields hashed one by one: no padding bytes get in. */
    uint64_t h = RT_FNV1A64_INIT;
    int64_t ints[] = {a->steps,        a->epochs,         a->shuffle,        a->has_lr,
                      a->n_eval > 0,   a->predict != NULL, a->check_replicas, a->trace != NULL,
                      a->has_lr_schedule ? (int64_t)a->lr_schedule : -1,
                      a->has_warmup ? a->warmup_steps : -1,
                      a->checkpoint != NULL, a->checkpoint_every, a->resume != NULL};
    h = rt_fnv1a64(h, ints, sizeof ints);
    h = rt_fnv1a64(h, &a->seed, sizeof a->seed);
    h = rt_fnv1a64(h, &a->mask_seed, sizeof a->mask_seed);
    uint32_t lr_bits = 0;
    if (a->has_lr) memcpy(&lr_bits, &a->lr, sizeof lr_bits);
    h = rt_fnv1a64(h, &lr_bits, sizeof lr_bits);
    /* A rank with a shorter --timeout would stop the job where the user
     * asked the others to wait. */
    uint64_t timeout_bits;
    memcpy(&timeout_bits, &a->timeout, sizeof timeout_bits);
    return rt_fnv1a64(h, &timeout_bits, sizeof timeout_bits);
}

void rt_args_free(RtArgs *a) {
    for (int i = 0; i < a->n_data; i++) free((char *)a->data[i].name);
    for (int i = 0; i < a->n_eval; i++) free((char *)a->eval[i].name);
    free(a->data);
    free(a->eval);
    memset(a, 0, sizeof *a);
}

bool rt_args_bind(const RtMeta *m, const RtNamedFile *files, int n, const char *flag,
                  const char **paths, RtErr *e) {
    for (int k = 0; k < m->n_inputs; k++) paths[k] = NULL;
    for (int i = 0; i < n; i++) {
        int k = rt_meta_input(m, files[i].name);
        if (k >= 0 && m->inputs[k].positions)
            return rt_usage_error(e, "%s %s=%s: input '%s' holds row positions the program fills itself", flag,
                                  files[i].name, files[i].path, files[i].name);
        if (k < 0) {
            char names[512];
            size_t len = 0;
            names[0] = 0;
            for (int j = 0; j < m->n_inputs && len < sizeof names; j++)
                if (!m->inputs[j].positions)
                    len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "",
                                            m->inputs[j].name);
            return rt_usage_error(e, "%s %s=%s: the program has no input '%s' (its inputs: %s)", flag,
                                  files[i].name, files[i].path, files[i].name, names);
        }
        if (paths[k]) return rt_usage_error(e, "%s %s given twice", flag, files[i].name);
        paths[k] = files[i].path;
    }
    for (int k = 0; k < m->n_inputs; k++)
        if (!paths[k] && !m->inputs[k].positions)
            return rt_usage_error(e, "no %s for input '%s' (give %s %s=FILE)", flag, m->inputs[k].name,
                                  flag, m->inputs[k].name);
    return true;
}

bool rt_args_check_writable(const char *flag, const char *path, RtErr *e) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return rt_error(e, "%s %s: is a folder", flag, path);
        if (access(path, W_OK) != 0) return rt_error(e, "%s %s: not writable: %s", flag, path, strerror(errno));
        return true;
    }
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return rt_error(e, "%s %s: folder %s does not exist", flag, path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return rt_error(e, "%s %s: cannot create files in %s: %s", flag, path, dir, strerror(errno));
    return true;
}

bool rt_args_check_outputs(const RtArgs *a, RtErr *e) {
    struct stat st;
    if (a->checkpoint && stat(a->checkpoint, &st) == 0 && !S_ISDIR(st.st_mode))
        return rt_usage_error(e, "--checkpoint %s: not a folder (give a folder, new or holding checkpoints)",
                              a->checkpoint);
    const char *out_flag[] = {"--save", "--predict", "--metrics", "--trace"};
    const char *out_path[] = {a->save, a->predict, a->metrics, a->trace};
    for (int i = 0; i < 4; i++) {
        /* /dev/null and pipes are no one's file to lose. */
        if (!out_path[i] || out_file_in_place(out_path[i])) continue;
        for (int j = 0; j < i; j++)
            if (out_path[j] && out_file_same(out_path[i], out_path[j]))
                return rt_usage_error(e, "%s %s: the same file as %s %s; give each output its own file",
                                      out_flag[i], out_path[i], out_flag[j], out_path[j]);
        for (int k = 0; k < a->n_data + a->n_eval; k++) {
            const RtNamedFile *in = k < a->n_data ? &a->data[k] : &a->eval[k - a->n_data];
            if (out_file_same(out_path[i], in->path))
                return rt_usage_error(e, "%s %s: the same file as %s %s=%s; an output must not overwrite an input",
                                      out_flag[i], out_path[i], k < a->n_data ? "--data" : "--eval-data",
                                      in->name, in->path);
        }
    }
    return true;
}

void rt_args_usage(FILE *out, const RtMeta *m) {
    const char *p = rt_prog_name();
    fprintf(out,
            "usage: %s --data NAME=FILE [--data NAME=FILE ...] (--steps K | --epochs E) [options]\n"
            "\n"
            "Trains the model compiled into this program.\n"
            "\n"
            "  --data NAME=FILE       training rows for input NAME; one per input, labels included.\n"
            "                         .npy (float32, float64, int8..int64, uint8..uint64, bool; C order)\n"
            "                         or IDX as MNIST ships it (unsigned bytes; plain or gzipped).\n"
            "                         IDX bytes feeding a float32 input are scaled to [0, 1].\n"
            "  --steps K              run K optimizer steps, continuing across epochs\n"
            "  --epochs E             run E passes over the rows (E * ceil(rows / batch) steps)\n"
            "  --lr LR                learning rate (default: the one compiled in); the schedule\n"
            "                         scales it\n"
            "  --lr-schedule constant|linear|cosine\n"
            "                         how the learning rate moves over the run: linear and cosine\n"
            "                         decay it to 0 at the last step (default: the one compiled in)\n"
            "  --warmup-steps W       first W steps raise it linearly from 0 (default: the compiled\n"
            "                         warmup; needs a schedule, here or compiled in)\n"
            "  --shuffle SEED         new row order every epoch (splitmix64 Fisher-Yates)\n"
            "  --seed SEED            key of the dropout masks (default 0); the same masks under every strategy\n"
            "  --metrics FILE         JSON Lines: one object per step and per evaluation\n"
            "  --eval-data NAME=FILE  evaluation rows, one per input; evaluated after every epoch\n"
            "                         and at the end\n"
            "  --predict OUT.npy      after training, the model output for every evaluation row\n"
            "  --save OUT.onnx        the model with its trained parameters\n"
            "  --checkpoint DIR       write checkpoints to DIR (created if missing): the model,\n"
            "                         the optimizer state and the run's position, after every\n"
            "                         epoch (or --checkpoint-every N steps), at the end, and when\n"
            "                         SIGTERM or SIGINT stops the run\n"
            "  --checkpoint-every N   a checkpoint every N steps\n"
            "  --checkpoint-keep K    keep the newest K checkpoints in DIR (default 2)\n"
            "  --resume DIR           continue from DIR's latest intact checkpoint; --steps and\n"
            "                         --epochs still count from the start of training\n"
            "  --log-every N          log line every N steps when stderr is not a terminal\n"
            "                         (default 100; 0: only the final line)\n"
            "  --check-replicas       at the end, check that every data-parallel replica holds\n"
            "                         the same parameters (a hash of their bytes)\n"
            "  --trace FILE           Chrome/Perfetto trace of the training steps, one track per\n"
            "                         rank (cleave trace-stats FILE sums it up)\n"
            "  --no-bind              on a node with more ranks than CPUs, do not pin each rank to\n"
            "                         one CPU round robin (the placement the cost model assumes)\n"
            "  --timeout S            a rank that waits for another rank longer than S seconds\n"
            "                         stops every rank, naming the wait (default 300; 0: wait for ever)\n"
            "  -h, --help             this text\n",
            p);
    if (!m) return;
    const RtLayout *l = &m->layout;
    if (rt_layout_pipelined(l))
        fprintf(out,
                "\nThis program runs %d pipeline stage%s x %d data-parallel replica%s (%s, %d micro-batch%s of %"
                PRId64 " rows): run it as mpirun -np %d %s ...\n",
                l->stages, l->stages > 1 ? "s" : "", l->dp, l->dp > 1 ? "s" : "", l->schedule, l->microbatches,
                l->microbatches > 1 ? "es" : "", l->micro_batch, m->ranks, p);
    else if (l->dp > 1)
        fprintf(out,
                "\nThis program is data-parallel over %d ranks: run it as mpirun -np %d %s ...\n"
                "Every rank reads the files and computes %" PRId64 " of the %" PRId64 " rows of each batch.\n",
                m->ranks, m->ranks, p, m->local_batch, m->batch);
    char schedule[96] = "";
    if (m->has_lr_schedule)
        snprintf(schedule, sizeof schedule, ", schedule %s with %" PRId64 " warmup step%s",
                 rt_lr_schedule_name(m->lr_schedule), m->warmup_steps, m->warmup_steps == 1 ? "" : "s");
    fprintf(out, "\nInputs of this program (batch %" PRId64 ", learning rate %g%s%s):\n", m->batch, (double)m->lr,
            schedule, l->dp > 1 ? "; shapes per replica" : "");
    for (int k = 0; k < m->n_inputs; k++) {
        if (m->inputs[k].positions) continue; /* filled by the program */
        char shape[256];
        fprintf(out, "  %-20s %s %s\n", m->inputs[k].name, rt_dtype_name(m->inputs[k].dtype),
                rt_shape_str(shape, sizeof shape, m->inputs[k].ndim, m->inputs[k].shape));
    }
}
