/* plan_file.c - `cleave compile --plan FILE`: a plan written by
 * `cleave plan --format json` or `--emit-plan`, perhaps edited by hand.
 *
 * A plan file holds decisions (strategy, ranks, replicas, stages and where
 * they begin, micro-batches, schedule, placement, bucket size, batch, loss and
 * optimizer) and what follows from them (every rank's steps, buffers,
 * transfers, tags).  Only the decisions are read: the rest is derived again
 * by the same planner, so a hand edit cannot produce a plan that deadlocks
 * or overlaps buffers.  Derived fields that disagree with the derivation
 * are reported, so an edit there is never silently dropped. */
#include "plan_file.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/file_util.h"
#include "plan/plan.h"

void plan_file_free(PlanFile *f) {
    json_decref(f->root);
    free(f->cuts);
    free(f->no_decay);
    *f = (PlanFile){0};
}

/* Reads integer `key` of obj into *out (lo..hi); absent is an error when
 * required, else leaves *out. */
static bool get_int(const PlanFile *f, const json_t *obj, const char *where, const char *key, bool required,
                    int64_t lo, int64_t hi, int64_t *out, Diag *d) {
    json_t *v = json_object_get(obj, key);
    if (!v) return required ? diag_error(d, DIAG_FORMAT, "%s: %s%s is missing", f->path, where, key) : true;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return diag_error(d, DIAG_FORMAT, "%s: %s%s must be an integer from %lld to %lld", f->path, where, key,
                          (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return true;
}

static bool get_str(const PlanFile *f, const json_t *obj, const char *where, const char *key, bool required,
                    const char **out, Diag *d) {
    json_t *v = json_object_get(obj, key);
    if (!v) return required ? diag_error(d, DIAG_FORMAT, "%s: %s%s is missing", f->path, where, key) : true;
    if (!json_is_string(v)) return diag_error(d, DIAG_FORMAT, "%s: %s%s must be a string", f->path, where, key);
    *out = json_string_value(v);
    return true;
}

/* optimizer.KEY, when present: a number in [lo, below) that float32
 * holds (the program's hyper-parameters are float32), as the flags. */
static bool get_num(const PlanFile *f, const json_t *obj, const char *key, double lo, double below, float *out,
                    Diag *d) {
    json_t *v = json_object_get(obj, key);
    if (!v) return true;
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || !isfinite((float)x) || x < lo || !(x < below)) {
        if (isinf(below)) return diag_error(d, DIAG_FORMAT, "%s: optimizer.%s must be a number >= %g", f->path, key, lo);
        return diag_error(d, DIAG_FORMAT, "%s: optimizer.%s must be a number in [%g, %g)", f->path, key, lo, below);
    }
    *out = (float)x;
    return true;
}

static bool one_of(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return true;
    return false;
}

/* optimizer.lr_schedule (a name, or null or absent: none given) and
 * optimizer.warmup_steps, which needs one, as --warmup-steps needs
 * --lr-schedule. */
static bool read_schedule(const PlanFile *f, const json_t *opt, TrainOptions *t, Diag *d) {
    json_t *s = json_object_get(opt, "lr_schedule");
    if (s && !json_is_null(s)) {
        if (!json_is_string(s) || !lr_schedule_parse(json_string_value(s), &t->lr_schedule))
            return diag_error(d, DIAG_FORMAT, "%s: optimizer.lr_schedule must be constant, linear, cosine or null",
                              f->path);
        t->lr_schedule_set = true;
    }
    if (!get_int(f, opt, "optimizer.", "warmup_steps", false, 0, INT64_MAX, &t->warmup_steps, d)) return false;
    if (t->warmup_steps && !t->lr_schedule_set)
        return diag_error(d, DIAG_FORMAT, "%s: optimizer.warmup_steps needs optimizer.lr_schedule", f->path);
    return true;
}

/* optimizer.no_decay: the --no-decay patterns, an array of strings. */
static bool read_no_decay(PlanFile *f, const json_t *opt, TrainOptions *t, Diag *d) {
    json_t *a = json_object_get(opt, "no_decay");
    if (!a) return true;
    if (!json_is_array(a)) return diag_error(d, DIAG_FORMAT, "%s: optimizer.no_decay must be an array of names", f->path);
    size_t n = json_array_size(a);
    f->no_decay = calloc(n + 1, sizeof *f->no_decay);
    if (!f->no_decay) return diag_error(d, DIAG_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(a, i);
        if (!json_is_string(p) || !*json_string_value(p))
            return diag_error(d, DIAG_FORMAT, "%s: optimizer.no_decay[%zu] must be a name pattern", f->path, i);
        f->no_decay[i] = json_string_value(p);
    }
    t->no_decay = f->no_decay;
    t->n_no_decay = (int)n;
    if (n && !(t->weight_decay > 0))
        return diag_error(d, DIAG_FORMAT, "%s: optimizer.no_decay needs optimizer.weight_decay above 0", f->path);
    return true;
}

static bool read_training(PlanFile *f, CompileOptions *o, Diag *d) {
    const char *loss = NULL, *name = NULL;
    if (!get_str(f, f->root, "", "loss", true, &loss, d)) return false;
    if (strcmp(loss, "ce") == 0) o->train.loss = LOSS_CE;
    else if (strcmp(loss, "mse") == 0) o->train.loss = LOSS_MSE;
    else if (strcmp(loss, "model") == 0) o->train.loss = LOSS_MODEL;
    else return diag_error(d, DIAG_FORMAT, "%s: loss must be ce, mse or model, got '%s'", f->path, loss);
    o->train.ignore_index = -100; /* plans written before ignore_index was stated */
    if (o->train.loss == LOSS_CE &&
        !get_int(f, f->root, "", "ignore_index", false, INT64_MIN, INT64_MAX, &o->train.ignore_index, d))
        return false;
    json_t *opt = json_object_get(f->root, "optimizer");
    if (!json_is_object(opt)) return diag_error(d, DIAG_FORMAT, "%s: optimizer must be an object", f->path);
    if (!get_str(f, opt, "optimizer.", "name", true, &name, d)) return false;
    TrainOptions *t = &o->train;
    if (!optimizer_parse(name, &t->optimizer))
        return diag_error(d, DIAG_FORMAT, "%s: optimizer.name must be sgd, momentum, adam or adamw, got '%s'", f->path,
                          name);
    /* AdamW decays by default, as torch.optim.AdamW and --optimizer adamw */
    if (t->optimizer == OPT_ADAMW) t->weight_decay = 0.01f;
    if (!get_num(f, opt, "lr", 0, INFINITY, &t->lr, d) || !get_num(f, opt, "momentum", 0, INFINITY, &t->momentum, d) ||
        !get_num(f, opt, "weight_decay", 0, INFINITY, &t->weight_decay, d) ||
        !get_num(f, opt, "beta1", 0, 1, &t->beta1, d) || !get_num(f, opt, "beta2", 0, 1, &t->beta2, d) ||
        !get_num(f, opt, "eps", 0, INFINITY, &t->eps, d) ||
        !get_num(f, opt, "clip_grad_norm", 0, INFINITY, &t->clip_grad_norm, d) || !read_schedule(f, opt, t, d) ||
        !read_no_decay(f, opt, t, d))
        return false;
    json_t *nes = json_object_get(opt, "nesterov");
    if (nes && !json_is_boolean(nes)) return diag_error(d, DIAG_FORMAT, "%s: optimizer.nesterov must be true or false", f->path);
    t->nesterov = json_is_true(nes);
    if (t->nesterov && t->optimizer != OPT_MOMENTUM)
        return diag_error(d, DIAG_FORMAT, "%s: optimizer.nesterov needs optimizer.name momentum", f->path);
    return true;
}

/* Stage k > 0 begins at stage_table[k].first_node: those are the cuts. */
static bool read_stages(PlanFile *f, CompileOptions *o, int64_t stages, Diag *d) {
    json_t *table = json_object_get(f->root, "stage_table");
    if (!table) return true; /* balanced again, as --strategy without --stages */
    if (!json_is_array(table) || (int64_t)json_array_size(table) != stages)
        return diag_error(d, DIAG_FORMAT, "%s: stage_table must list the %lld stages", f->path, (long long)stages);
    f->cuts = calloc((size_t)stages, sizeof *f->cuts);
    if (!f->cuts) return diag_error(d, DIAG_NOMEM, "out of memory");
    for (int64_t k = 1; k < stages; k++) {
        char where[48];
        snprintf(where, sizeof where, "stage_table[%lld].", (long long)k);
        json_t *row = json_array_get(table, (size_t)k);
        if (!json_is_object(row)) return diag_error(d, DIAG_FORMAT, "%s: stage_table[%lld] must be an object", f->path, (long long)k);
        if (!get_str(f, row, where, "first_node", true, &f->cuts[k - 1], d)) return false;
    }
    o->cuts = f->cuts;
    o->n_cuts = (int)stages - 1;
    return true;
}

bool plan_file_load(const char *path, CompileOptions *o, PlanFile *f, Diag *d) {
    *f = (PlanFile){.path = path};
    json_error_t err;
    size_t len = 0;
    uint8_t *text = file_read_all(path, &len, d);
    if (!text) return false;
    /* A key given twice is an edit gone wrong: refused, not last-one-wins. */
    f->root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!f->root) return diag_error(d, DIAG_FORMAT, "%s:%d: not JSON: %s", path, err.line, err.text);
    const char *format = NULL, *strategy = NULL, *schedule = NULL, *model = NULL;
    int64_t version = 0, batch = 0, ranks = 0, replicas = 1, stages = 0, micro = 0;
    if (!json_is_object(f->root)) return diag_error(d, DIAG_FORMAT, "%s: a plan is a JSON object", path);
    if (!get_str(f, f->root, "", "format", true, &format, d)) return false;
    if (strcmp(format, "cleave-plan"))
        return diag_error(d, DIAG_FORMAT, "%s: format is '%s', not a cleave plan (\"cleave-plan\")", path, format);
    if (!get_int(f, f->root, "", "version", true, 1, 1, &version, d) ||
        !get_str(f, f->root, "", "model", true, &model, d) ||
        !get_int(f, f->root, "", "batch", true, 1, (int64_t)1 << 31, &batch, d) ||
        !get_int(f, f->root, "", "ranks", true, 1, 1 << 20, &ranks, d) ||
        !get_str(f, f->root, "", "strategy", true, &strategy, d) ||
        !get_int(f, f->root, "", "replicas", false, 1, 1 << 20, &replicas, d))
        return false;
    Strategy st;
    if (!strategy_parse(strategy, &st))
        return diag_error(d, DIAG_FORMAT, "%s: strategy must be single, dp, layer, pipeline or hybrid, got '%s'", path,
                          strategy);
    bool staged = strategy_staged(st);
    if (staged) {
        static const char *const schedules[] = {"layer", "gpipe", "1f1b"};
        if (!get_int(f, f->root, "", "stages", true, 1, 1 << 20, &stages, d) ||
            !get_int(f, f->root, "", "microbatches", true, 1, 1 << 20, &micro, d) ||
            !get_str(f, f->root, "", "schedule", true, &schedule, d))
            return false;
        if (!one_of(schedule, schedules, 3))
            return diag_error(d, DIAG_FORMAT, "%s: schedule must be layer, gpipe or 1f1b, got '%s'", path, schedule);
        if (replicas * stages != ranks)
            return diag_error(d, DIAG_FORMAT, "%s: replicas %lld x stages %lld is not its ranks, %lld", path,
                              (long long)replicas, (long long)stages, (long long)ranks);
    } else if (st == STRATEGY_SINGLE && ranks != 1) {
        return diag_error(d, DIAG_FORMAT, "%s: strategy single runs on 1 rank, not %lld", path, (long long)ranks);
    } else if (st == STRATEGY_DP && replicas != ranks) {
        return diag_error(d, DIAG_FORMAT, "%s: strategy dp has one replica per rank: replicas %lld, ranks %lld", path,
                          (long long)replicas, (long long)ranks);
    }
    json_t *bucket = json_object_get(f->root, "bucket_mb");
    /* plans without replicas have no gradient buckets and write 0 */
    bool unbucketed = bucket && replicas == 1 && json_is_number(bucket) && json_number_value(bucket) == 0;
    if (bucket && !unbucketed && (!json_is_number(bucket) || !(json_number_value(bucket) > 0)))
        return diag_error(d, DIAG_FORMAT, "%s: bucket_mb must be a positive number", path);
    if (bucket && !unbucketed) o->bucket_mb = json_number_value(bucket);
    const char *allreduce = NULL;
    if (!get_str(f, f->root, "", "allreduce", false, &allreduce, d)) return false;
    if (allreduce && strcmp(allreduce, "flat") && strcmp(allreduce, "hierarchical"))
        return diag_error(d, DIAG_FORMAT, "%s: allreduce must be flat or hierarchical, got '%s'", path, allreduce);
    int64_t node = 0;
    bool hier = allreduce && strcmp(allreduce, "hierarchical") == 0;
    if (!get_int(f, f->root, "", "allreduce_ranks_per_node", hier, 1, 1 << 20, &node, d)) return false;
    if (hier && replicas < 2)
        return diag_error(d, DIAG_FORMAT, "%s: allreduce hierarchical needs replicas, and the plan has 1", path);
    if (!hier && json_object_get(f->root, "allreduce_ranks_per_node"))
        return diag_error(d, DIAG_FORMAT, "%s: allreduce_ranks_per_node needs allreduce hierarchical", path);
    o->allreduce_node = hier ? node : 0;
    const char *bn = NULL;
    if (!get_str(f, f->root, "", "bn_stats", false, &bn, d)) return false;
    if (bn && strcmp(bn, "global") && strcmp(bn, "local"))
        return diag_error(d, DIAG_FORMAT, "%s: bn_stats must be global or local, got '%s'", path, bn);
    o->train.bn_local = bn && strcmp(bn, "local") == 0;
    if (!read_training(f, o, d)) return false;
    /* threads is a program option the file records, not a decision the
     * plan follows from: --threads on the command line wins over it */
    int64_t threads = 1;
    if (!get_int(f, f->root, "", "threads", false, 1, 64, &threads, d)) return false;
    if (!o->threads) o->threads = threads;
    if (!o->model) o->model = model;
    /* batch and microbatches are the step's: K batches of batch / K rows,
     * as the command line's --batch and --microbatches before --accumulate */
    int64_t acc = 1;
    if (!get_int(f, f->root, "", "accumulate", false, 1, 65536, &acc, d)) return false;
    if (batch % acc || (staged && st != STRATEGY_LAYER && micro % acc))
        return diag_error(d, DIAG_FORMAT, "%s: accumulate %lld does not divide batch %lld%s", path, (long long)acc,
                          (long long)batch, staged ? " and microbatches" : "");
    if (acc > 1 && st == STRATEGY_LAYER)
        return diag_error(d, DIAG_FORMAT, "%s: accumulate needs strategy single, dp, pipeline or hybrid, not layer",
                          path);
    o->train.accumulate = acc;
    batch /= acc;
    micro /= acc;
    o->batch = batch;
    o->ranks = ranks;
    o->strategy = st;
    o->dp = st == STRATEGY_HYBRID ? replicas : 0;
    o->pp = st == STRATEGY_HYBRID ? stages : 0;
    /* layer's one micro-batch and schedule are implied, as on the command line */
    o->microbatches = staged && st != STRATEGY_LAYER ? micro : 0;
    o->schedule = staged && st != STRATEGY_LAYER ? schedule : NULL;
    if (st == STRATEGY_LAYER && (micro != 1 || strcmp(schedule, "layer")))
        return diag_error(d, DIAG_FORMAT, "%s: strategy layer has 1 micro-batch and schedule layer; use strategy "
                          "pipeline for more", path);
    if (staged && st != STRATEGY_LAYER && strcmp(schedule, "layer") == 0)
        return diag_error(d, DIAG_FORMAT, "%s: schedule layer needs strategy layer; %s takes gpipe or 1f1b", path, strategy);
    const char *placement = NULL;
    if (!get_str(f, f->root, "", "placement", false, &placement, d)) return false;
    if (placement && strcmp(placement, "by_replica") && strcmp(placement, "by_stage"))
        return diag_error(d, DIAG_FORMAT, "%s: placement must be by_replica or by_stage, got '%s'", path, placement);
    if (placement && strcmp(placement, "by_stage") == 0 && st != STRATEGY_HYBRID)
        return diag_error(d, DIAG_FORMAT, "%s: placement by_stage needs strategy hybrid", path);
    o->placement = placement && st == STRATEGY_HYBRID ? placement : NULL;
    return staged ? read_stages(f, o, stages, d) : true;
}

/* The first place where `want` (derived) and `got` (the file) differ, as a
 * JSON path in buf; false when they agree.  Fields the file leaves out are
 * not compared, so a plan trimmed to its decisions is accepted as is. */
static bool first_difference(const json_t *want, const json_t *got, char *buf, size_t len) {
    if (json_is_object(want) && json_is_object(got)) {
        const char *key;
        json_t *gv;
        size_t used = strlen(buf);
        json_object_foreach((json_t *)got, key, gv) {
            json_t *wv = json_object_get(want, key);
            if (!wv) continue; /* not derived (prediction, alternatives, notes) */
            snprintf(buf + used, len - used, "%s%s", used ? "." : "", key);
            if (first_difference(wv, gv, buf, len)) return true;
        }
        buf[used] = 0;
        return false;
    }
    if (json_is_array(want) && json_is_array(got)) {
        size_t used = strlen(buf);
        if (json_array_size(want) != json_array_size(got)) {
            snprintf(buf + used, len - used, " (%zu entries, the plan gives %zu)", json_array_size(got),
                     json_array_size(want));
            return true;
        }
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(buf + used, len - used, "[%zu]", i);
            if (first_difference(json_array_get(want, i), json_array_get(got, i), buf, len)) return true;
        }
        buf[used] = 0;
        return false;
    }
    if (json_is_number(want) && json_is_number(got)) {
        double a = json_number_value(want), b = json_number_value(got);
        return fabs(a - b) > 1e-9 * fmax(1, fabs(a));
    }
    return !json_equal((json_t *)want, (json_t *)got);
}

bool plan_file_compare(const PlanFile *f, const json_t *derived, char *where, size_t len) {
    where[0] = 0;
    const json_t *want = derived;
    if (!want) return false;
    /* the model path is where the file was planned from, not a decision */
    json_t *got = json_deep_copy(f->root);
    json_object_del(got, "model");
    /* nor is threads (--threads may replace the file's) */
    json_object_del(got, "threads");
    bool differs = got && first_difference(want, got, where, len);
    json_decref(got);
    return differs;
}

void plan_file_reword(const PlanFile *f, Diag *d) {
    /* The planner names the decisions by their command line flags; with a
     * plan file they came from its fields. */
    static const char *const flags[][2] = {{"--stages", "stage_table"}, {"--microbatches", "microbatches"},
                                           {"--batch", "batch"},         {"--ranks", "ranks"},
                                           {"--dp", "replicas"},         {"--pp", "stages"},
                                           {"--schedule", "schedule"},   {"--strategy", "strategy"}};
    char msg[sizeof d->msg];
    size_t n = 0;
    bool any = false;
    for (const char *s = d->msg; *s && n + 1 < sizeof msg;) {
        size_t k = 0;
        while (k < sizeof flags / sizeof flags[0] && strncmp(s, flags[k][0], strlen(flags[k][0]))) k++;
        const char *after = k < sizeof flags / sizeof flags[0] ? s + strlen(flags[k][0]) : NULL;
        if (after && (*after < 'a' || *after > 'z') && *after != '-') {
            n += (size_t)snprintf(msg + n, sizeof msg - n, "%s", flags[k][1]);
            s = after;
            any = true;
        } else {
            msg[n++] = *s++;
        }
        if (n >= sizeof msg) n = sizeof msg - 1;
    }
    msg[n] = 0;
    if (!any) return;
    size_t lp = strlen(f->path), lm = strlen(msg);
    if (lp + 2 + lm >= sizeof d->msg) lm = lp + 2 < sizeof d->msg ? sizeof d->msg - lp - 3 : 0;
    if (lp + 2 >= sizeof d->msg) return; /* keep the planner's words when the path alone fills the line */
    memcpy(d->msg, f->path, lp);
    memcpy(d->msg + lp, ": ", 2);
    memcpy(d->msg + lp + 2, msg, lm);
    d->msg[lp + 2 + lm] = 0;
}
