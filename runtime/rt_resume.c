/* rt_resume.c - --resume DIR: rank 0 reads the checkpoint DIR/latest names,
 * checks it against its checksums and against this run, and sends it to
 * every rank, which copies what its own stage holds (docs/checkpoint.md). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rt_ckpt.h"
#include "rt_mpi.h"

/* ---- reading ------------------------------------------------------------- */

/* A checkpoint read and checked: the bytes of state.bin, its header and
 * where the payload starts. */
typedef struct Loaded {
    uint8_t *bytes;
    size_t len;
    json_t *head;
    size_t payload;
} Loaded;

static void loaded_free(Loaded *l) {
    free(l->bytes);
    json_decref(l->head);
    *l = (Loaded){0};
}

/* The header of a state.bin held whole in bytes[0..len): false, with why,
 * when it is not one or is damaged. */
static bool parse_state(const uint8_t *bytes, size_t len, Loaded *l, char *why, size_t why_size) {
    if (len < RT_CKPT_HEAD + RT_CKPT_TAIL || memcmp(bytes, RT_CKPT_MAGIC, 8) != 0)
        return snprintf(why, why_size, "state.bin is not a cleave checkpoint (%zu bytes)", len), false;
    uint32_t version, crc;
    uint64_t head_len;
    memcpy(&version, bytes + 8, 4);
    memcpy(&head_len, bytes + 16, 8);
    if (version != RT_CKPT_VERSION)
        return snprintf(why, why_size, "state.bin has version %u, this program reads %d", version, RT_CKPT_VERSION), false;
    memcpy(&crc, bytes + len - RT_CKPT_TAIL, 4);
    if (rt_ckpt_crc32(0, bytes, len - RT_CKPT_TAIL) != crc)
        return snprintf(why, why_size, "state.bin fails its checksum (damaged or cut short)"), false;
    if (head_len > len - RT_CKPT_HEAD - RT_CKPT_TAIL)
        return snprintf(why, why_size, "state.bin's header runs past its end"), false;
    json_error_t jerr;
    l->head = json_loadb((const char *)bytes + RT_CKPT_HEAD, (size_t)head_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(l->head))
        return snprintf(why, why_size, "state.bin's header is not a JSON object: %s", jerr.text), false;
    l->payload = (RT_CKPT_HEAD + (size_t)head_len + 63) / 64 * 64;
    if (l->payload > len - RT_CKPT_TAIL) return snprintf(why, why_size, "state.bin has no payload"), false;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(l->head, "tensors"), i, t) {
        json_int_t off = json_integer_value(json_object_get(t, "offset"));
        json_int_t bytes_n = json_integer_value(json_object_get(t, "bytes"));
        if (!json_is_string(json_object_get(t, "name")) || off < 0 || bytes_n < 0 ||
            (uint64_t)off + (uint64_t)bytes_n > len - RT_CKPT_TAIL - l->payload)
            return snprintf(why, why_size, "state.bin's tensors[%zu] lies outside its payload", i), false;
    }
    return true;
}

/* Rank 0: reads DIR/name and checks both files against their checksums. */
static bool load_one(const char *dir, const char *name, Loaded *l, char *why, size_t why_size) {
    *l = (Loaded){0};
    char *folder = rt_ckpt_join(dir, name);
    char *state = folder ? rt_ckpt_join(folder, "state.bin") : NULL, *model = folder ? rt_ckpt_join(folder, "model.onnx") : NULL;
    bool ok = false;
    uint8_t *mbytes = NULL;
    size_t mlen = 0;
    int err;
    if (!state || !model) {
        snprintf(why, why_size, "out of memory");
    } else if ((err = rt_ckpt_read_file(state, &l->bytes, &l->len)) != 0) {
        snprintf(why, why_size, "state.bin: %s", err == EINVAL ? "not a regular file" : strerror(err));
    } else if (parse_state(l->bytes, l->len, l, why, why_size)) {
        json_t *mf = json_object_get(l->head, "model_file");
        if ((err = rt_ckpt_read_file(model, &mbytes, &mlen)) != 0)
            snprintf(why, why_size, "model.onnx: %s", err == EINVAL ? "not a regular file" : strerror(err));
        else if ((json_int_t)mlen != json_integer_value(json_object_get(mf, "bytes")) ||
                 (json_int_t)rt_ckpt_crc32(0, mbytes, mlen) != json_integer_value(json_object_get(mf, "crc32")))
            snprintf(why, why_size, "model.onnx fails its checksum (damaged or cut short)");
        else
            ok = true;
    }
    free(mbytes);
    free(folder);
    free(state);
    free(model);
    if (!ok) loaded_free(l);
    return ok;
}

/* Rank 0: the checkpoint `latest` names or, when it is damaged, the newest
 * intact one, saying so. */
static bool load_latest(const char *dir, Loaded *l, char *used, size_t used_size, RtErr *e) {
    struct stat st;
    if (stat(dir, &st) != 0) return rt_usage_error(e, "--resume %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return rt_usage_error(e, "--resume %s: not a folder", dir);
    char *latest_path = rt_ckpt_join(dir, "latest");
    uint8_t *latest = NULL;
    size_t latest_len = 0;
    char first[64] = "";
    if (latest_path && rt_ckpt_read_file(latest_path, &latest, &latest_len) == 0 && latest_len < sizeof first) {
        memcpy(first, latest, latest_len);
        first[latest_len] = 0;
        first[strcspn(first, "\n")] = 0;
        if (rt_ckpt_step_of(first) < 0) first[0] = 0;
    }
    free(latest);
    free(latest_path);
    int n;
    int64_t *steps = rt_ckpt_list(dir, &n);
    char why[256] = "", damaged[1024] = "";
    bool ok = false;
    for (int i = -1; !ok && i < n; i++) {
        char name[sizeof first];
        if (i < 0) {
            if (!first[0]) continue;
            snprintf(name, sizeof name, "%s", first);
        } else {
            rt_ckpt_name(name, sizeof name, steps[i]);
            if (!strcmp(name, first)) continue;
        }
        ok = load_one(dir, name, l, why, sizeof why);
        if (ok) snprintf(used, used_size, "%s", name);
        else if (!damaged[0]) snprintf(damaged, sizeof damaged, "%s/%s: %s", dir, name, why);
    }
    free(steps);
    if (!ok) {
        if (damaged[0]) return rt_error(e, "--resume %s: no intact checkpoint; the newest, %s", dir, damaged);
        return rt_usage_error(e, "--resume %s: no checkpoint in this folder", dir);
    }
    if (damaged[0]) rt_warn("%s; resuming from %s/%s", damaged, dir, used);
    return true;
}

/* The entry of the header's "tensors" named `name`, or NULL (parse_state
 * checked that every entry has a name). */
static json_t *entry(const json_t *tensors, const char *name) {
    size_t i;
    json_t *o;
    json_array_foreach(tensors, i, o) if (!strcmp(json_string_value(json_object_get(o, "name")), name)) return o;
    return NULL;
}

/* Rank 0: the checkpoint's run against this one; false with a line
 * naming the first difference. */
static bool check_compatible(const json_t *h, const RtRun *r, const RtCheckpoint *c, const char *where, RtErr *e) {
    const RtMeta *m = r->meta;
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, c->model_hash);
    const char *fmt = json_string_value(json_object_get(h, "format"));
    if (!fmt || strcmp(fmt, "cleave-checkpoint") != 0) return rt_error(e, "%s: not a cleave checkpoint", where);
    /* tensors first: a missing or reshaped parameter says more than a hash */
    json_t *tensors = json_object_get(h, "tensors");
    const RtTensor *lists[2] = {m->layout.all_params, m->layout.all_state};
    int counts[2] = {m->layout.n_all_params, m->layout.n_all_state};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < counts[k]; i++) {
            const RtTensor *t = &lists[k][i];
            json_t *found = entry(tensors, t->name);
            const char *what = k ? "optimizer state" : "parameter";
            if (!found)
                return rt_error(e, "%s has no %s '%s': it was written by a program of another model or optimizer",
                                where, what, t->name);
            json_t *shape = rt_ckpt_shape_json(t);
            bool same = json_equal(shape, json_object_get(found, "shape"));
            char *theirs = json_dumps(json_object_get(found, "shape"), 0);
            char *ours = json_dumps(shape, 0);
            json_decref(shape);
            if (!same)
                rt_error(e, "%s: %s '%s' has shape %s there, %s in this program", where, what, t->name,
                         theirs ? theirs : "?", ours ? ours : "?");
            free(theirs);
            free(ours);
            if (!same) return false;
        }
    const char *their_hash = json_string_value(json_object_get(h, "model_hash"));
    if (!their_hash || strcmp(their_hash, hash) != 0)
        return rt_error(e, "%s was written by a program of another model (its graph differs: model hash %s there, "
                        "%s here)", where, their_hash ? their_hash : "none", hash);
    json_int_t batch = json_integer_value(json_object_get(h, "batch"));
    if (batch != m->batch)
        return rt_error(e, "%s was written with batch %" PRId64 ", this program trains with batch %" PRId64, where,
                        (int64_t)batch, m->batch);
    const char *loss = json_string_value(json_object_get(h, "loss_kind"));
    if (!loss || strcmp(loss, rt_loss_kind_name(m->loss_kind)) != 0)
        return rt_error(e, "%s was written with --loss %s, this program has --loss %s", where, loss ? loss : "?",
                        rt_loss_kind_name(m->loss_kind));
    json_t *ours = json_loads(m->optimizer, 0, NULL), *theirs = json_object_get(h, "optimizer");
    const char *key;
    json_t *v;
    char diff[200] = "";
    json_object_foreach(ours, key, v) {
        json_t *w = json_object_get(theirs, key);
        if (w && json_equal(v, w)) continue;
        char *a = w ? json_dumps(w, JSON_ENCODE_ANY) : NULL, *b = json_dumps(v, JSON_ENCODE_ANY);
        snprintf(diff, sizeof diff, "optimizer %s %s there, %s in this program", key, a ? a : "absent", b ? b : "?");
        free(a);
        free(b);
        break;
    }
    json_decref(ours);
    if (diff[0]) return rt_error(e, "%s was written with another optimizer: %s", where, diff);
    json_t *lr = json_object_get(h, "lr");
    const char *sched = json_string_value(json_object_get(lr, "schedule"));
    if ((float)json_number_value(json_object_get(lr, "base")) != r->lr)
        return rt_error(e, "%s was written with learning rate %g, this run has %g (--lr)", where,
                        json_number_value(json_object_get(lr, "base")), (double)r->lr);
    if (!sched || strcmp(sched, rt_lr_schedule_name(r->lr_schedule)) != 0 ||
        json_integer_value(json_object_get(lr, "warmup_steps")) != r->warmup_steps)
        return rt_error(e, "%s was written with --lr-schedule %s --warmup-steps %" PRId64 ", this run has %s and %"
                        PRId64, where, sched ? sched : "?", (int64_t)json_integer_value(json_object_get(lr,
                        "warmup_steps")), rt_lr_schedule_name(r->lr_schedule), r->warmup_steps);
    json_t *data = json_object_get(h, "data");
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, r->order.seed);
    if (json_integer_value(json_object_get(data, "rows")) != r->train_rows)
        return rt_error(e, "%s was written training on %" PRId64 " rows, this run has %" PRId64 " (--data)", where,
                        (int64_t)json_integer_value(json_object_get(data, "rows")), r->train_rows);
    bool shuffled = json_is_true(json_object_get(data, "shuffle"));
    const char *their_seed = json_string_value(json_object_get(data, "shuffle_seed"));
    if (shuffled != r->order.shuffle || (shuffled && (!their_seed || strcmp(their_seed, seed) != 0)))
        return rt_error(e, "%s was written with %s%s, this run has %s%s: the batches would differ", where,
                        shuffled ? "--shuffle " : "no --shuffle", shuffled && their_seed ? their_seed : "",
                        r->order.shuffle ? "--shuffle " : "no --shuffle", r->order.shuffle ? seed : "");
    snprintf(seed, sizeof seed, "%" PRIu64, r->mask_seed);
    const char *their_mask = json_string_value(json_object_get(h, "dropout_seed"));
    if (m->layout.has_seed && (!their_mask || strcmp(their_mask, seed) != 0))
        return rt_error(e, "%s was written with --seed %s, this run has --seed %s: the dropout masks would differ",
                        where, their_mask ? their_mask : "?", seed);
    json_int_t step = json_integer_value(json_object_get(h, "step"));
    if (step < 1) return rt_error(e, "%s: its step %" PRId64 " is not a step", where, (int64_t)step);
    if (step >= r->total_steps)
        return rt_usage_error(e, "%s is at step %" PRId64 ": a run of %" PRId64 " steps (--steps and --epochs count "
                              "from the start) has nothing left to train", where, (int64_t)step, r->total_steps);
    return true;
}

/* Every rank: copies the tensors it holds from the checkpoint's payload. */
static void restore(const Loaded *l, const RtMeta *m, char *arena) {
    json_t *tensors = json_object_get(l->head, "tensors");
    const RtTensor *lists[2] = {m->params, m->state};
    int counts[2] = {m->n_params, m->n_state};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < counts[k]; i++) {
            const RtTensor *t = &lists[k][i];
            json_t *o = entry(tensors, t->name);
            if (!o) continue; /* rank 0 found every tensor of the program there */
            if ((uint64_t)json_integer_value(json_object_get(o, "bytes")) != t->bytes)
                rt_fatal("--resume: %s has %" PRId64 " bytes in the checkpoint, %" PRIu64 " here", t->name,
                         (int64_t)json_integer_value(json_object_get(o, "bytes")), t->bytes);
            memcpy(arena + t->offset, l->bytes + l->payload + json_integer_value(json_object_get(o, "offset")),
                   t->bytes);
        }
}

/* Rank 0's bytes to every rank, in pieces one MPI call carries. */
static void broadcast(uint8_t **bytes, size_t *len) {
    uint64_t n = *len;
    rt_watch_begin("the checkpoint's broadcast", -1, RT_WATCH_EVERY);
    MPI_Bcast(&n, 1, MPI_UINT64_T, 0, rt_comm_world());
    if (rt_rank() != 0) {
        *len = (size_t)n;
        *bytes = malloc(n ? n : 1);
        if (!*bytes) rt_fatal("--resume: out of memory for the checkpoint's %" PRIu64 " bytes", n);
    }
    for (uint64_t at = 0; at < n; at += 1u << 30) {
        uint64_t piece = n - at < (1u << 30) ? n - at : (1u << 30);
        MPI_Bcast(*bytes + at, (int)piece, MPI_BYTE, 0, rt_comm_world());
    }
    rt_watch_end();
}

bool rt_ckpt_resume(const RtCheckpoint *c, const char *dir, RtRun *r, RtErr *e) {
    Loaded l = {0};
    char used[64] = "";
    rt_watch_phase("resuming");
    if (rt_rank() == 0 && load_latest(dir, &l, used, sizeof used, e)) {
        char where[PATH_MAX + 80];
        snprintf(where, sizeof where, "--resume: checkpoint %s/%s", dir, used);
        check_compatible(l.head, r, c, where, e);
    }
    if (!rt_comm_agree(e)) {
        loaded_free(&l);
        return false;
    }
    /* The others parse what rank 0 checked. */
    if (rt_ranks() > 1) broadcast(&l.bytes, &l.len);
    char why[256];
    if (rt_rank() != 0 && !parse_state(l.bytes, l.len, &l, why, sizeof why)) rt_fatal("--resume: %s", why);
    restore(&l, r->meta, r->arena);
    r->start_step = json_integer_value(json_object_get(l.head, "step"));
    if (rt_rank() == 0) {
        rt_log_break_line();
        fprintf(stderr, "%s: resuming from %s/%s at step %" PRId64 " of %" PRId64 "\n", rt_prog_name(), dir, used,
                r->start_step, r->total_steps);
        fflush(stderr);
    }
    loaded_free(&l);
    return true;
}
