/* cmd_compile.c - `cleave compile`: an ONNX model into a training program.
 * This file reads flags (their strategy flags checked together in
 * compile_options.c), asks the search for the layout when --strategy auto
 * leaves it open (search.c), and runs the pipeline (driver.c) on it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "../driver.h"
#include "../plan_file.h"
#include "../search.h"
#include "compile_options.h"
#include "out_file.h"
#include "plan_report.h"

static const char compile_help[] =
    "usage: cleave compile MODEL.onnx -o PROG --batch B [options]\n"
    "\n"
    "Compiles the model into a native training program (forward, loss,\n"
    "gradients and optimizer, generated with LLVM for this CPU).\n"
    "\n"
    "  -o PROG              output file\n"
    "  --batch B            global batch size (binds dim 0 of every input)\n"
    "  --loss ce|mse|model  ce: mean softmax cross-entropy of the first output\n"
    "                       (logits [B,...,C], classes last) against an added int64\n"
    "                       input 'labels' [B,...], over every label of the batch\n"
    "                       but those equal to --ignore-index;\n"
    "                       mse: mean of (output - labels)^2, labels shaped like the\n"
    "                       output; model: the first output already is the loss\n"
    "                       (default ce)\n"
    "  --ignore-index I     --loss ce: labels equal to I count for nothing (default\n"
    "                       -100, as PyTorch's cross_entropy)\n"
    "  --accumulate K       each optimizer step sums the gradients of K batches of B\n"
    "                       rows, one after another (K x B rows a step, trained as\n"
    "                       one batch of K x B would be; not with --strategy auto)\n"
    "  --optimizer sgd|momentum|adam|adamw   (default sgd)\n"
    "  --lr LR              learning rate (default 0.01; the program's --lr overrides)\n"
    "  --lr-schedule constant|linear|cosine  the learning rate over the run: linear\n"
    "                       and cosine decay it to 0 at the run's last step (default\n"
    "                       constant; the program's --lr-schedule overrides)\n"
    "  --warmup-steps W     with --lr-schedule: the first W steps raise the learning rate\n"
    "                       linearly from 0 (default 0)\n"
    "  --momentum MU        momentum (default 0.9 with --optimizer momentum)\n"
    "  --nesterov           Nesterov momentum\n"
    "  --weight-decay WD    sgd, momentum, adam: L2 penalty added to the gradient, as\n"
    "                       torch.optim does; adamw: decoupled, w *= 1 - lr*WD before\n"
    "                       the step (default 0.01 for adamw, as torch.optim.AdamW; 0\n"
    "                       for the others)\n"
    "  --no-decay PATTERN,...  no weight decay for the parameters whose names contain a\n"
    "                       pattern ('*' matches any run of characters): bias,norm\n"
    "  --clip-grad-norm C   scale the gradients so that their global 2-norm is at most\n"
    "                       C, as torch.nn.utils.clip_grad_norm_ (over every replica\n"
    "                       and stage)\n"
    "  --beta1 B1 --beta2 B2 --eps E   Adam's and AdamW's constants (0.9, 0.999, 1e-8)\n"
    "  --freeze NAME,...    initializers to keep fixed\n"
    "  --emit exe|obj|llvm  executable (default), object file, or readable LLVM IR\n"
    "  --emit-plan FILE     also write the plan (JSON, see docs/plan.md)\n"
    "  --target-cpu CPU     generate code for CPU instead of this machine's\n"
    "  --threads T          threads per rank for the large matrix products, 1 to 64\n"
    "                       (default 1); the program computes the same bits for any T\n"
    "  --ranks N            number of MPI ranks (default 1)\n"
    "  --strategy S          how N ranks share the work (default single, one rank):\n"
    "                       dp: every rank holds the model and computes B/N rows of\n"
    "                         each batch; gradients are averaged by bucketed allreduce\n"
    "                         overlapped with the backward pass\n"
    "                       layer: the layers are cut into N stages, one per rank;\n"
    "                         the batch flows through them in turn\n"
    "                       pipeline: N stages fed with micro-batches (--microbatches,\n"
    "                         --schedule) so that the stages work at once\n"
    "                       hybrid: --dp D replicas of a --pp P stage pipeline\n"
    "  --bucket-mb MB       gradient bucket size for dp (default 25, as PyTorch DDP)\n"
    "  --allreduce flat|hierarchical:K  dp, hybrid: sum gradient buckets over all\n"
    "                       replicas at once (default), or within nodes of K ranks,\n"
    "                       then among one rank per node, then back within nodes\n"
    "  --bn-stats global|local  batch normalisation under dp and hybrid: global (the\n"
    "                       default) normalises with the statistics of the global\n"
    "                       batch, summed over the replicas, and trains as one\n"
    "                       process; local with each replica's own rows', as\n"
    "                       PyTorch DDP without SyncBatchNorm\n"
    "  --microbatches M     micro-batches per batch (pipeline, hybrid; default 4 per\n"
    "                       stage, or the most below that dividing the batch)\n"
    "  --schedule gpipe|1f1b  gpipe: every forward, then every backward; 1f1b: one\n"
    "                       forward and one backward in turn, so stage s keeps at most\n"
    "                       P - s micro-batches of activations (default gpipe)\n"
    "  --stages NODE,...    the first node of every stage after the first (default:\n"
    "                       stages balanced by FLOPs)\n"
    "  --dp D --pp P        hybrid: replicas and stages (D x P = --ranks)\n"
    "  --placement by_replica|by_stage  hybrid: rank = replica x P + stage (default:\n"
    "                       pipeline neighbours on consecutive ranks) or stage x D +\n"
    "                       replica (a stage's replicas together)\n"
    "  --balance flops|time stages balanced by FLOPs (default) or by the time the cost\n"
    "                       model predicts for their nodes on --cluster (what auto does)\n"
    "  --strategy auto      plan every strategy, predict each on the cluster, compile\n"
    "                       the fastest that fits (see cleave plan)\n"
    "  --profile            auto and --balance time: time the model's own kernels here and\n"
    "                       price them at those times instead of the cluster's rates\n"
    "  --cluster FILE       the cluster auto plans for (docs/cluster.md; default: stated\n"
    "                       defaults for one node of N ranks)\n"
    "  --plan FILE          compile the plan in FILE (cleave plan --format json or\n"
    "                       --emit-plan, perhaps edited): its strategy, stages,\n"
    "                       micro-batches, schedule, batch, loss and optimizer replace\n"
    "                       the flags that set them (MODEL defaults to the plan's)\n"
    "  --no-fuse            run every element-wise node as its own loop (fused chains\n"
    "                       give the same bits; this is for comparing)\n"
    "  -v, --verbose        report the stages and the planned memory\n";

static const char plan_help[] =
    "usage: cleave plan MODEL.onnx --batch B --ranks N [--cluster FILE] [--format text|json|dot|svg]\n"
    "                  [training and strategy options of cleave compile]\n"
    "\n"
    "Plans every way to split the training of the model over N ranks (data,\n"
    "layer, pipeline and hybrid parallelism, micro-batch counts and schedules),\n"
    "predicts each one's step time, bubble, communication and memory per rank on\n"
    "the cluster (FILE, see docs/cluster.md; without it, stated defaults for one\n"
    "node), and shows the one --strategy auto would compile and why the others\n"
    "lost.  Giving --strategy other than auto shows that plan's prediction only.\n"
    "json: the chosen plan in the plan format with the predictions; dot: its\n"
    "forward graph cut into stages (Graphviz); svg: its simulated per-rank timeline.\n";

typedef struct CompileFlags {
    CompileOptions o;
    const char *format;
    char *freeze_copy, *stages_copy, *no_decay_copy;
    const char *plan_in;  /* --plan FILE */
    const char *decision; /* the first flag given that a plan file also decides */
} CompileFlags;

/* Flags whose value a plan file states (plan_file.c reads them there). */
static bool plan_decides(const char *flag) {
    static const char *const names[] = {"--batch", "--loss", "--optimizer", "--lr", "--momentum", "--weight-decay",
                                        "--beta1", "--beta2", "--eps", "--nesterov", "--ignore-index", "--accumulate",
                                        "--no-decay", "--clip-grad-norm", "--lr-schedule", "--warmup-steps", "--ranks", "--strategy",
                                        "--microbatches", "--dp", "--pp", "--schedule", "--stages", "--bucket-mb", "--bn-stats", "--placement", "--allreduce",
                                        "--balance", "--cluster"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(flag, names[i]) == 0) return true;
    return false;
}

static bool parse_f(const char *s, float *out) {
    if (!s || !*s) return false;
    char *end;
    double v = strtod(s, &end);
    /* Hyper-parameters are float32 in the program: inf, nan and values
     * that round to infinity there (1e39) would train to NaN. */
    if (*end || !isfinite(v) || !isfinite((float)v)) return false;
    *out = (float)v;
    return true;
}

/* Splits "a,b,c" into a malloc'd array of pointers into a copy of s. */
static int split_names(char *s, const char ***out) {
    int n = 1;
    for (char *p = s; *p; p++) n += *p == ',';
    const char **arr = calloc((size_t)n, sizeof *arr);
    if (!arr) return -1;
    int k = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ","))
        if (*tok) arr[k++] = tok;
    *out = arr;
    return k;
}

/* A flag naming things, NAME,...: *copy gets the text the names point
 * into and *names (malloc'd) the names, both replaced when the flag comes
 * again.  Returns how many, -1 when out of memory. */
static int take_names(const char *v, char **copy, const char *const **names) {
    free((void *)*names);
    free(*copy);
    *names = NULL;
    const char **arr = NULL;
    *copy = strdup(v);
    int n = *copy ? split_names(*copy, &arr) : -1;
    *names = arr;
    return n;
}

/* The flags `cleave compile` and `cleave plan` share.  Returns -1 when
 * the command should go on, else the exit status (after --help or a
 * usage error).  For plan, -o is not needed and --format is read. */
static int parse_flags(const char *cmd, int argc, char **argv, CompileFlags *f) {
    bool plan = strcmp(cmd, "plan") == 0;
    CompileOptions o = {.emit = "exe", .strategy = STRATEGY_SINGLE, .strategy_auto = plan, .ranks = 1,
                        .bucket_mb = 25};
    TrainOptions *t = &o.train;
    *t = (TrainOptions){.loss = LOSS_CE, .optimizer = OPT_SGD, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
                        .eps = 1e-8f, .ignore_index = -100};
    bool momentum_set = false, decay_set = false, warmup_set = false;
    char *freeze_copy = NULL, *stages_copy = NULL, *no_decay_copy = NULL;
    int64_t ranks = 1;
    int status = -1;
    for (int i = 0; i < argc && status < 0; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                        \
    if (!v) { status = cli_usage(cmd, "%s needs a value", a); break; } \
    i++;
        if (!f->decision && plan_decides(a)) f->decision = a;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(plan ? plan_help : compile_help, stdout);
            status = 0;
        } else if (strcmp(a, "--cluster") == 0) {
            NEED_VALUE();
            o.cluster = v;
        } else if (strcmp(a, "--balance") == 0) {
            NEED_VALUE();
            if (strcmp(v, "time") && strcmp(v, "flops"))
                status = cli_usage(cmd, "--balance must be time or flops, got '%s'", v);
            o.balance_time = strcmp(v, "time") == 0;
        } else if (plan && strcmp(a, "--format") == 0) {
            NEED_VALUE();
            if (strcmp(v, "text") && strcmp(v, "json") && strcmp(v, "dot") && strcmp(v, "svg"))
                status = cli_usage(cmd, "--format must be text, json, dot or svg, got '%s'", v);
            f->format = v;
        } else if (!plan && strcmp(a, "--plan") == 0) {
            NEED_VALUE();
            f->plan_in = v;
        } else if (strcmp(a, "-o") == 0) {
            NEED_VALUE();
            o.output = v;
        } else if (strcmp(a, "--batch") == 0) {
            NEED_VALUE();
            if (!cli_parse_i64(v, 1, (int64_t)1 << 31, &o.batch)) status = cli_usage(cmd, "--batch needs a positive integer, got '%s'", v);
        } else if (strcmp(a, "--loss") == 0) {
            NEED_VALUE();
            if (strcmp(v, "ce") == 0) t->loss = LOSS_CE;
            else if (strcmp(v, "mse") == 0) t->loss = LOSS_MSE;
            else if (strcmp(v, "model") == 0) t->loss = LOSS_MODEL;
            else status = cli_usage(cmd, "--loss must be ce, mse or model, got '%s'", v);
        } else if (strcmp(a, "--accumulate") == 0) {
            NEED_VALUE();
            if (!cli_parse_i64(v, 1, 65536, &t->accumulate))
                status = cli_usage(cmd, "--accumulate needs an integer from 1 to 65536, got '%s'", v);
        } else if (strcmp(a, "--ignore-index") == 0) {
            NEED_VALUE();
            if (!cli_parse_i64(v, INT64_MIN, INT64_MAX, &t->ignore_index))
                status = cli_usage(cmd, "--ignore-index needs an integer, got '%s'", v);
        } else if (strcmp(a, "--optimizer") == 0) {
            NEED_VALUE();
            if (!optimizer_parse(v, &t->optimizer))
                status = cli_usage(cmd, "--optimizer must be sgd, momentum, adam or adamw, got '%s'", v);
        } else if (strcmp(a, "--lr-schedule") == 0) {
            NEED_VALUE();
            if (!lr_schedule_parse(v, &t->lr_schedule))
                status = cli_usage(cmd, "--lr-schedule must be constant, linear or cosine, got '%s'", v);
            t->lr_schedule_set = true;
        } else if (strcmp(a, "--warmup-steps") == 0) {
            NEED_VALUE();
            if (!cli_parse_i64(v, 0, INT64_MAX, &t->warmup_steps))
                status = cli_usage(cmd, "--warmup-steps needs a non-negative integer, got '%s'", v);
            warmup_set = true;
        } else if (strcmp(a, "--clip-grad-norm") == 0) {
            NEED_VALUE();
            if (!parse_f(v, &t->clip_grad_norm) || !(t->clip_grad_norm > 0) || isinf(t->clip_grad_norm))
                status = cli_usage(cmd, "--clip-grad-norm needs a positive number, got '%s'", v);
        } else if (strcmp(a, "--no-decay") == 0) {
            NEED_VALUE();
            t->n_no_decay = take_names(v, &no_decay_copy, &t->no_decay);
            if (t->n_no_decay < 0) status = cli_usage(cmd, "out of memory");
            else if (t->n_no_decay == 0) status = cli_usage(cmd, "--no-decay needs name patterns, got '%s'", v);
        } else if (strcmp(a, "--lr") == 0 || strcmp(a, "--momentum") == 0 || strcmp(a, "--weight-decay") == 0 ||
                   strcmp(a, "--beta1") == 0 || strcmp(a, "--beta2") == 0 || strcmp(a, "--eps") == 0) {
            NEED_VALUE();
            float x;
            if (!parse_f(v, &x) || x < 0) {
                status = cli_usage(cmd, "%s needs a finite non-negative float32 number, got '%s'", a, v);
                break;
            }
            /* As torch.optim.Adam checks them: a beta of 1 or more never
             * forgets, and its bias correction divides by zero or flips sign. */
            if ((strcmp(a, "--beta1") == 0 || strcmp(a, "--beta2") == 0) && !(x < 1)) {
                status = cli_usage(cmd, "%s needs a number in [0, 1), got '%s'", a, v);
                break;
            }
            if (strcmp(a, "--lr") == 0) t->lr = x;
            else if (strcmp(a, "--momentum") == 0) t->momentum = x, momentum_set = true;
            else if (strcmp(a, "--weight-decay") == 0) t->weight_decay = x, decay_set = true;
            else if (strcmp(a, "--beta1") == 0) t->beta1 = x;
            else if (strcmp(a, "--beta2") == 0) t->beta2 = x;
            else t->eps = x;
        } else if (strcmp(a, "--nesterov") == 0) {
            t->nesterov = true;
        } else if (strcmp(a, "--freeze") == 0) {
            NEED_VALUE();
            t->n_freeze = take_names(v, &freeze_copy, &t->freeze);
            if (t->n_freeze < 0) status = cli_usage(cmd, "out of memory");
        } else if (strcmp(a, "--emit") == 0) {
            NEED_VALUE();
            if (strcmp(v, "exe") && strcmp(v, "obj") && strcmp(v, "llvm"))
                status = cli_usage(cmd, "--emit must be exe, obj or llvm, got '%s'", v);
            o.emit = v;
        } else if (strcmp(a, "--emit-plan") == 0) {
            NEED_VALUE();
            o.plan_out = v;
        } else if (strcmp(a, "--target-cpu") == 0) {
            NEED_VALUE();
            o.target_cpu = v;
        } else if (strcmp(a, "--threads") == 0) {
            NEED_VALUE();
            if (!cli_parse_i64(v, 1, 64, &o.threads))
                status = cli_usage(cmd, "--threads needs an integer from 1 to 64, got '%s'", v);
        } else if (strcmp(a, "--ranks") == 0) {
            NEED_VALUE();
            if (!cli_parse_i64(v, 1, 1 << 20, &ranks)) status = cli_usage(cmd, "--ranks needs a positive integer");
            o.ranks = ranks;
        } else if (strcmp(a, "--strategy") == 0) {
            NEED_VALUE();
            o.strategy_auto = strcmp(v, "auto") == 0;
            if (!o.strategy_auto && !strategy_parse(v, &o.strategy))
                status = cli_usage(cmd, "--strategy must be single, dp, layer, pipeline, hybrid or auto, got '%s'", v);
        } else if (strcmp(a, "--microbatches") == 0 || strcmp(a, "--dp") == 0 || strcmp(a, "--pp") == 0) {
            NEED_VALUE();
            int64_t x;
            if (!cli_parse_i64(v, 1, 1 << 20, &x)) {
                status = cli_usage(cmd, "%s needs a positive integer, got '%s'", a, v);
                break;
            }
            if (strcmp(a, "--microbatches") == 0) o.microbatches = x;
            else if (strcmp(a, "--dp") == 0) o.dp = x;
            else o.pp = x;
        } else if (strcmp(a, "--bn-stats") == 0) {
            NEED_VALUE();
            if (strcmp(v, "global") && strcmp(v, "local"))
                status = cli_usage(cmd, "--bn-stats must be global or local, got '%s'", v);
            t->bn_local = strcmp(v, "local") == 0;
        } else if (strcmp(a, "--placement") == 0) {
            NEED_VALUE();
            if (strcmp(v, "by_replica") && strcmp(v, "by_stage"))
                status = cli_usage(cmd, "--placement must be by_replica or by_stage, got '%s'", v);
            o.placement = v;
        } else if (strcmp(a, "--schedule") == 0) {
            NEED_VALUE();
            if (strcmp(v, "gpipe") && strcmp(v, "1f1b"))
                status = cli_usage(cmd, "--schedule must be gpipe or 1f1b, got '%s'", v);
            o.schedule = v;
        } else if (strcmp(a, "--stages") == 0) {
            NEED_VALUE();
            o.n_cuts = take_names(v, &stages_copy, &o.cuts);
            if (o.n_cuts < 0) status = cli_usage(cmd, "out of memory");
            else if (o.n_cuts == 0) status = cli_usage(cmd, "--stages needs node names, got '%s'", v);
        } else if (strcmp(a, "--allreduce") == 0) {
            NEED_VALUE();
            int64_t k = 0;
            if (strcmp(v, "flat") == 0) o.allreduce_node = 0;
            else if (strncmp(v, "hierarchical:", 13) == 0 && cli_parse_i64(v + 13, 1, 1 << 20, &k)) o.allreduce_node = k;
            else status = cli_usage(cmd, "--allreduce must be flat or hierarchical:K (K ranks per node), got '%s'", v);
        } else if (strcmp(a, "--bucket-mb") == 0) {
            NEED_VALUE();
            float mb = 0;
            if (!parse_f(v, &mb) || !(mb > 0)) status = cli_usage(cmd, "--bucket-mb needs a positive number, got '%s'", v);
            o.bucket_mb = mb;
        } else if (strcmp(a, "--profile") == 0) {
            o.profile = true;
        } else if (strcmp(a, "--no-fuse") == 0) {
            o.no_fuse = true;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o.verbose = true;
        } else if (a[0] == '-') {
            status = cli_usage(cmd, "unknown flag '%s'", a);
        } else if (o.model) {
            status = cli_usage(cmd, "one model at a time ('%s' and '%s')", o.model, a);
        } else {
            o.model = a;
        }
#undef NEED_VALUE
    }
    if (status < 0 && f->plan_in) {
        if (f->decision)
            status = cli_usage(cmd, "%s does not go with --plan: the plan file decides it (edit the file)", f->decision);
        else if (!o.output)
            status = cli_usage(cmd, "no output given (-o PROG)");
    } else if (status < 0) {
        if (!o.model) status = cli_usage(cmd, "no model given");
        else if (!o.output && !plan) status = cli_usage(cmd, "no output given (-o PROG)");
        else if (!o.batch) status = cli_usage(cmd, "--batch is required");
        else if (t->nesterov && t->optimizer != OPT_MOMENTUM)
            status = cli_usage(cmd, "--nesterov needs --optimizer momentum");
        else if (t->accumulate > 1 && o.strategy_auto)
            status = cli_usage(cmd, "--accumulate does not go with --strategy auto yet: choose the strategy");
        else if (t->accumulate > 1 && o.batch > ((int64_t)1 << 31) / t->accumulate)
            status = cli_usage(cmd, "--batch %lld x --accumulate %lld is above 2^31 rows a step", (long long)o.batch,
                               (long long)t->accumulate);
        else if (warmup_set && !t->lr_schedule_set)
            status = cli_usage(cmd, "--warmup-steps needs --lr-schedule (constant, linear or cosine)");
    }
    if (status < 0 && t->optimizer == OPT_MOMENTUM && !momentum_set) t->momentum = 0.9f;
    /* torch.optim.AdamW's default; the others', 0 */
    if (status < 0 && t->optimizer == OPT_ADAMW && !decay_set) t->weight_decay = 0.01f;
    if (status < 0 && t->n_no_decay > 0 && !(t->weight_decay > 0))
        status = cli_usage(cmd, "--no-decay needs weight decay (--weight-decay, or --optimizer adamw)");
    f->o = o;
    f->freeze_copy = freeze_copy;
    f->stages_copy = stages_copy;
    f->no_decay_copy = no_decay_copy;
    return status;
}

static void free_flags(CompileFlags *f) {
    free((void *)f->o.train.freeze);
    free(f->freeze_copy);
    free((void *)f->o.train.no_decay);
    free(f->no_decay_copy);
    free((void *)f->o.cuts);
    free(f->stages_copy);
}

/* The layout to compile: with --strategy auto the search's choice, else
 * o's own.  With --profile and --balance time o's own is priced first as
 * `cleave plan` prices it (its kernels timed, then refined), so that its
 * stages are cut where `cleave plan` cuts them; s keeps that profile. */
static bool compile_layout(const CompileOptions *o, Search *s, Layout *l, Diag *d) {
    if (o->strategy_auto) {
        if (o->n_cuts)
            return diag_error(d, DIAG_USAGE, "--stages chooses the stages by hand; it does not go with --strategy auto");
        return search_choose(o, s, l, d);
    }
    if (!compile_options_layout(o, l, d)) {
        if (o->plan_file) plan_file_reword(o->plan_file, d);
        return false;
    }
    return !(o->profile && l->balance_time) || search_one(o, l, s, d);
}

/* The files compile writes (-o, --emit-plan) must be neither a folder nor
 * one of the files it reads (the model, --plan, --cluster), nor each
 * other: refused before any work, so that no command replaces its own
 * input.  Devices and pipes (/dev/null) are written in place and are no
 * one's file to lose. */
static bool check_outputs(const CompileFlags *f, Diag *d) {
    const CompileOptions *o = &f->o;
    const char *out_flag[] = {"-o", "--emit-plan"}, *out_path[] = {o->output, o->plan_out};
    const char *in_flag[] = {"the model", "--plan", "--cluster"}, *in_path[] = {o->model, f->plan_in, o->cluster};
    for (int i = 0; i < 2; i++) {
        const char *path = out_path[i];
        if (!path) continue;
        /* A program is run and relinked by path: never a device. */
        if (i == 0 && out_file_in_place(path))
            return diag_error(d, DIAG_USAGE, "-o %s: %s", path, out_file_why(ENOTSUP));
        if (out_file_in_place(path)) continue;
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return diag_error(d, DIAG_USAGE, "%s %s: is a folder; name the file to write", out_flag[i], path);
        for (int k = 0; k < 3; k++)
            if (in_path[k] && out_file_same(path, in_path[k]))
                return diag_error(d, DIAG_USAGE, "%s %s: the same file as %s %s; an output must not overwrite an input",
                                  out_flag[i], path, in_flag[k], in_path[k]);
        if (i == 1 && out_path[0] && out_file_same(path, out_path[0]))
            return diag_error(d, DIAG_USAGE, "--emit-plan %s: the same file as -o %s; give each output its own file",
                              path, out_path[0]);
    }
    return true;
}

int cmd_compile(int argc, char **argv) {
    CompileFlags f = {0};
    int status = parse_flags("compile", argc, argv, &f);
    PlanFile pf = {0};
    if (status < 0) {
        Diag d = {0};
        Search s = {0};
        Layout l;
        bool ok = !f.plan_in || plan_file_load(f.plan_in, &f.o, &pf, &d);
        if (ok && f.plan_in) f.o.plan_file = &pf;
        ok = ok && check_outputs(&f, &d);
        ok = ok && compile_layout(&f.o, &s, &l, &d) && driver_compile(&f.o, &l, s.profile, &d);
        search_free(&s);
        status = ok ? 0 : cli_fail(&d);
    }
    if (pf.cuts) f.o.cuts = NULL; /* the plan file's, freed with it (--stages cannot come with --plan) */
    if (pf.no_decay) f.o.train.no_decay = NULL; /* the same, and --no-decay */
    plan_file_free(&pf);
    free_flags(&f);
    return status;
}

int cmd_plan(int argc, char **argv) {
    CompileFlags f = {.format = "text"};
    int status = parse_flags("plan", argc, argv, &f);
    if (status < 0) status = plan_report(&f.o, f.format);
    free_flags(&f);
    return status;
}
