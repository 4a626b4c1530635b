/* rt_checkpoint.c - --checkpoint DIR and --resume DIR (docs/checkpoint.md).
 *
 * A checkpoint is a folder DIR/step-NNNNNNNNN holding model.onnx (the
 * trained model, as --save writes it) and state.bin: every parameter and
 * every optimizer state tensor in float32, keyed by name, behind a JSON
 * header that records what the run was (step, batch, optimizer, learning
 * rate, data order, the model's identity) and ahead of a CRC-32 of it all.
 * Nothing in it depends on the layout: rank 0 gathers every tensor by name
 * to write it, and on resume reads it and sends it to every rank, which
 * copies what its own stage holds.
 *
 * Writing never touches the previous checkpoint: the files go to a fresh
 * DIR/.tmp-step-N-XXXXXX, each synced, the folder is renamed to its name
 * and DIR synced; only then is DIR/latest replaced (out_file: a temporary
 * renamed over it) and the checkpoints beyond the newest `keep` removed.
 * A kill at any point leaves `latest` naming a whole checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rt.h"
#include "rt_mpi.h"

/* state.bin: MAGIC, u32 version, u32 0, u64 header bytes, the header (JSON),
 * zeros to a multiple of 64, the payload, u32 CRC-32 of every byte before
 * it, u32 0.  Little-endian. */
static const char MAGIC[8] = {'C', 'L', 'E', 'A', 'V', 'E', 'C', 'K'};
enum { VERSION = 1, HEAD = 24, TAIL = 8 };

/* ---- files and folders ---------------------------------------------------- */

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", dir, name);
    return s;
}

/* mkdir -p: a missing folder, and its missing parents, are created. */
static int make_dirs(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    char *copy = strdup(path);
    if (!copy) return ENOMEM;
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(copy, 0777) != 0 && errno != EEXIST) {
            int err = errno;
            free(copy);
            return err;
        }
        *p = '/';
    }
    int err = mkdir(copy, 0777) != 0 && errno != EEXIST ? errno : 0;
    free(copy);
    return err;
}

/* Removes a checkpoint folder: its files (model.onnx, state.bin and any
 * temporaries beside them) and then itself.  Checkpoint folders hold no
 * folders. */
static void remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char *f = join(path, ent->d_name);
        if (f) unlink(f);
        free(f);
    }
    closedir(d);
    rmdir(path);
}

/* The step of a checkpoint folder's name "step-N", or -1. */
static int64_t step_of_name(const char *name) {
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
    int64_t step = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9' || step > (INT64_MAX - 9) / 10) return -1;
        step = step * 10 + (*c - '0');
    }
    return step;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of DIR's checkpoint folders, newest first; *n of them. */
static int64_t *list_steps(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int cap = 16;
    int64_t *steps = malloc(sizeof *steps * (size_t)cap);
    struct dirent *ent;
    while (steps && (ent = readdir(d)) != NULL) {
        int64_t s = step_of_name(ent->d_name);
        if (s < 0) continue;
        if (*n == cap) {
            int64_t *more = realloc(steps, sizeof *steps * (size_t)(cap *= 2));
            if (!more) break;
            steps = more;
        }
        steps[(*n)++] = s;
    }
    closedir(d);
    if (steps) qsort(steps, (size_t)*n, sizeof *steps, cmp_desc);
    return steps;
}

static void step_name(char *buf, size_t size, int64_t step) { snprintf(buf, size, "step-%09" PRId64, step); }

/* Writes len bytes to dir/name through out_file (synced, renamed). */
static int write_file(const char *dir, const char *name, const void *a, size_t a_len, const void *b, size_t b_len) {
    char *path = join(dir, name);
    if (!path) return ENOMEM;
    OutFile out;
    int err = out_file_open(&out, path);
    if (!err) {
        out_file_write(&out, a, a_len);
        out_file_write(&out, b, b_len);
        err = out_file_finish(&out);
    }
    free(path);
    return err;
}

/* A whole regular file, read into *buf (NULL on failure, errno-style
 * code returned). */
static int read_file(const char *path, uint8_t **buf, size_t *len) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return errno;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return EINVAL;
    }
    *len = (size_t)st.st_size;
    *buf = malloc(*len ? *len : 1);
    int err = !*buf ? ENOMEM : fread(*buf, 1, *len, f) != *len ? EIO : 0;
    fclose(f);
    if (err) {
        free(*buf);
        *buf = NULL;
    }
    return err;
}

static uint32_t crc32_of(uint32_t crc, const uint8_t *p, size_t len) {
    /* zlib's crc32 takes at most UINT_MAX bytes at a time */
    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}

/* ---- what a checkpoint records ------------------------------------------- */

static const char *loss_name(RtLossKind k) { return k == RT_LOSS_CE ? "ce" : k == RT_LOSS_MSE ? "mse" : "model"; }

static json_t *shape_json(const RtTensor *t) {
    json_t *a = json_array();
    for (int i = 0; i < t->ndim; i++) json_array_append_new(a, json_integer(t->shape[i]));
    return a;
}

/* Seeds are 64-bit unsigned: JSON integers stop at 2^63, so they are
 * written as decimal strings. */
static json_t *u64_json(uint64_t x) {
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, x);
    return json_string(buf);
}

/* Everything but the tensors: what a resumed run must match, and where
 * it starts. */
static json_t *run_json(const RtRun *r, int64_t step, uint64_t model_hash) {
    const RtMeta *m = r->meta;
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, model_hash);
    json_t *opt = json_loads(m->optimizer, 0, NULL);
    json_t *lr = json_pack("{s:f, s:s, s:I}", "base", (double)r->lr, "schedule", rt_lr_schedule_name(r->lr_schedule),
                           "warmup_steps", (json_int_t)r->warmup_steps);
    json_t *data = json_pack("{s:I, s:b, s:o}", "rows", (json_int_t)r->train_rows, "shuffle", r->order.shuffle,
                             "shuffle_seed", u64_json(r->order.seed));
    return json_pack("{s:s, s:i, s:I, s:I, s:I, s:s, s:s, s:o, s:o, s:o, s:o, s:{s:i, s:s}}", "format",
                     "cleave-checkpoint", "version", VERSION, "step", (json_int_t)step, "total_steps",
                     (json_int_t)r->total_steps, "batch", (json_int_t)m->batch, "model_hash", hash, "loss_kind",
                     loss_name(m->loss_kind), "optimizer", opt ? opt : json_object(), "lr", lr, "data", data,
                     "dropout_seed", u64_json(r->mask_seed), "written_by", "ranks", rt_ranks(), "strategy",
                     rt_layout_pipelined(&m->layout) ? "pipelined" : m->layout.dp > 1 ? "dp" : "single");
}

/* ---- writing ------------------------------------------------------------- */

/* Appends the tensors of list (offsets into buf) to the payload and their
 * entries to arr; kind "param" or "state". */
static bool add_tensors(json_t *arr, const RtTensor *list, int n, const char *kind, const char *buf, char **payload,
                        uint64_t *at, uint64_t *cap) {
    for (int i = 0; i < n; i++) {
        const RtTensor *t = &list[i];
        uint64_t need = *at + (t->bytes + 63) / 64 * 64;
        if (need > *cap) {
            uint64_t grown = need * 2;
            char *more = realloc(*payload, grown);
            if (!more) return false;
            *payload = more;
            *cap = grown;
        }
        memcpy(*payload + *at, buf + t->offset, t->bytes);
        memset(*payload + *at + t->bytes, 0, need - *at - t->bytes);
        json_t *o = json_pack("{s:s, s:s, s:s, s:o, s:I, s:I}", "name", t->name, "kind", kind, "dtype", "float32",
                              "shape", shape_json(t), "offset", (json_int_t)*at, "bytes", (json_int_t)t->bytes);
        if (o && !strcmp(kind, "state")) {
            json_object_set_new(o, "param", json_stringn(t->name, (size_t)t->of_len));
            json_object_set_new(o, "slot", json_string(t->name + t->of_len + 1));
        }
        if (!o || json_array_append_new(arr, o) != 0) return false;
        *at = need;
    }
    return true;
}

/* Rank 0: the checkpoint of `step` in a temporary folder, then renamed. */
static bool write_folder(const RtCheckpoint *c, const RtRun *r, int64_t step, const RtMeta *view, const char *params,
                         const char *state, RtErr *e) {
    const RtMeta *m = r->meta;
    const char *dir = c->dir;
    int err = make_dirs(dir);
    if (err) return rt_error(e, "--checkpoint %s: cannot create the folder: %s", dir, strerror(err));
    char name[40], tmpl[64];
    step_name(name, sizeof name, step);
    snprintf(tmpl, sizeof tmpl, ".tmp-%s-XXXXXX", name);
    char *tmp = join(dir, tmpl), *final = join(dir, name);
    uint8_t *model = NULL;
    char *payload = NULL, *head = NULL;
    json_t *root = NULL;
    bool ok = false;
    size_t model_len = 0;
    if (!tmp || !final) {
        rt_error(e, "--checkpoint: out of memory");
        goto out;
    }
    if (!mkdtemp(tmp)) {
        rt_error(e, "--checkpoint %s: cannot create a folder in it: %s", dir, strerror(errno));
        free(tmp);
        tmp = NULL;
        goto out;
    }
    /* mkdtemp makes it private; a checkpoint is as readable as any file
     * the run writes */
    mode_t mask = umask(0);
    umask(mask);
    chmod(tmp, 0777 & ~mask);
    if (!rt_save_pack(c->prog, view, params, &model, &model_len, e)) goto out;
    root = run_json(r, step, c->model_hash);
    json_t *tensors = json_array();
    uint64_t at = 0, cap = 64;
    payload = malloc(cap);
    if (!root || !tensors || !payload ||
        !add_tensors(tensors, view->params, view->n_params, "param", params, &payload, &at, &cap) ||
        !add_tensors(tensors, m->layout.all_state, m->layout.n_all_state, "state", state, &payload, &at, &cap)) {
        json_decref(tensors);
        rt_error(e, "--checkpoint: out of memory for %" PRIu64 " bytes of tensors", at);
        goto out;
    }
    json_object_set_new(root, "tensors", tensors);
    json_object_set_new(root, "model_file", json_pack("{s:s, s:I, s:I}", "name", "model.onnx", "bytes",
                                                      (json_int_t)model_len, "crc32",
                                                      (json_int_t)crc32_of(0, model, model_len)));
    head = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (!head) {
        rt_error(e, "--checkpoint: out of memory");
        goto out;
    }
    size_t head_len = strlen(head), padded = (HEAD + head_len + 63) / 64 * 64 - HEAD;
    size_t front_len = HEAD + padded;
    uint8_t *front = calloc(1, front_len);
    if (!front) {
        rt_error(e, "--checkpoint: out of memory");
        goto out;
    }
    uint32_t version = VERSION;
    uint64_t hl = head_len;
    memcpy(front, MAGIC, 8);
    memcpy(front + 8, &version, 4);
    memcpy(front + 16, &hl, 8);
    memcpy(front + HEAD, head, head_len);
    uint32_t crc = crc32_of(crc32_of(0, front, front_len), (const uint8_t *)payload, at);
    uint8_t tail[TAIL] = {0};
    memcpy(tail, &crc, 4);
    /* payload and tail go out together: one more buffer is not needed */
    char *body = realloc(payload, at + TAIL);
    if (body) {
        payload = body;
        memcpy(payload + at, tail, TAIL);
    }
    err = !body ? ENOMEM : write_file(tmp, "model.onnx", model, model_len, NULL, 0);
    if (!err) err = write_file(tmp, "state.bin", front, front_len, payload, at + TAIL);
    free(front);
    if (err) {
        rt_error(e, "--checkpoint %s: cannot write step %" PRId64 ": %s", dir, step, out_file_why(err));
        goto out;
    }
    /* A checkpoint of this step from an earlier run is replaced whole:
     * moved aside, then removed once the new one stands. */
    char *old = NULL;
    struct stat st;
    if (stat(final, &st) == 0) {
        char aside[64];
        snprintf(aside, sizeof aside, ".old-%s-XXXXXX", name);
        old = join(dir, aside);
        if (!old || !mkdtemp(old) || rename(final, old) != 0) {
            rt_error(e, "--checkpoint %s: cannot replace %s: %s", dir, name, strerror(errno));
            free(old);
            goto out;
        }
    }
    if (rename(tmp, final) != 0) {
        rt_error(e, "--checkpoint %s: cannot rename the new checkpoint to %s: %s", dir, name, strerror(errno));
        free(old);
        goto out;
    }
    free(tmp);
    tmp = NULL;
    out_file_sync_dir(final);
    if (old) remove_dir(old);
    free(old);
    char line[48];
    snprintf(line, sizeof line, "%s\n", name);
    err = write_file(dir, "latest", line, strlen(line), NULL, 0);
    if (err) {
        rt_error(e, "--checkpoint %s: %s is written but 'latest' could not be updated: %s", dir, name,
                 out_file_why(err));
        goto out;
    }
    ok = true;
out:
    if (tmp) remove_dir(tmp);
    free(tmp);
    free(final);
    free(model);
    free(payload);
    free(head);
    json_decref(root);
    return ok;
}

/* Rank 0: keeps the newest c->keep checkpoints and removes the rest, and
 * the temporaries of writes that were cut off. */
static void prune(const RtCheckpoint *c) {
    int n;
    int64_t *steps = list_steps(c->dir, &n);
    for (int i = c->keep; steps && i < n; i++) {
        char name[40];
        step_name(name, sizeof name, steps[i]);
        char *path = join(c->dir, name);
        if (path) remove_dir(path);
        free(path);
    }
    free(steps);
    DIR *d = opendir(c->dir);
    struct dirent *ent;
    while (d && (ent = readdir(d)) != NULL) {
        if (strncmp(ent->d_name, ".tmp-step-", 10) != 0 && strncmp(ent->d_name, ".old-step-", 10) != 0) continue;
        char *path = join(c->dir, ent->d_name);
        if (path) remove_dir(path);
        free(path);
    }
    if (d) closedir(d);
}

bool rt_ckpt_write(const RtCheckpoint *c, const RtRun *r, int64_t step, RtErr *e) {
    const RtMeta *m = r->meta;
    RtMeta view;
    char *params = NULL, *state = NULL;
    rt_watch_phase("writing a checkpoint");
    rt_stage_gather_params(m, r->arena, &view, &params, e);
    rt_stage_gather_state(m, r->arena, &state);
    if (rt_rank() == 0 && write_folder(c, r, step, &view, params, state, e)) prune(c);
    free(params);
    free(state);
    return rt_comm_agree(e);
}

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
    if (len < HEAD + TAIL || memcmp(bytes, MAGIC, 8) != 0)
        return snprintf(why, why_size, "state.bin is not a cleave checkpoint (%zu bytes)", len), false;
    uint32_t version, crc;
    uint64_t head_len;
    memcpy(&version, bytes + 8, 4);
    memcpy(&head_len, bytes + 16, 8);
    if (version != VERSION)
        return snprintf(why, why_size, "state.bin has version %u, this program reads %d", version, VERSION), false;
    memcpy(&crc, bytes + len - TAIL, 4);
    if (crc32_of(0, bytes, len - TAIL) != crc)
        return snprintf(why, why_size, "state.bin fails its checksum (damaged or cut short)"), false;
    if (head_len > len - HEAD - TAIL)
        return snprintf(why, why_size, "state.bin's header runs past its end"), false;
    json_error_t jerr;
    l->head = json_loadb((const char *)bytes + HEAD, (size_t)head_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(l->head))
        return snprintf(why, why_size, "state.bin's header is not a JSON object: %s", jerr.text), false;
    l->payload = (HEAD + (size_t)head_len + 63) / 64 * 64;
    if (l->payload > len - TAIL) return snprintf(why, why_size, "state.bin has no payload"), false;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(l->head, "tensors"), i, t) {
        json_int_t off = json_integer_value(json_object_get(t, "offset"));
        json_int_t bytes_n = json_integer_value(json_object_get(t, "bytes"));
        if (!json_is_string(json_object_get(t, "name")) || off < 0 || bytes_n < 0 ||
            (uint64_t)off + (uint64_t)bytes_n > len - TAIL - l->payload)
            return snprintf(why, why_size, "state.bin's tensors[%zu] lies outside its payload", i), false;
    }
    return true;
}

/* Rank 0: reads DIR/name and checks both files against their checksums. */
static bool load_one(const char *dir, const char *name, Loaded *l, char *why, size_t why_size) {
    *l = (Loaded){0};
    char *folder = join(dir, name);
    char *state = folder ? join(folder, "state.bin") : NULL, *model = folder ? join(folder, "model.onnx") : NULL;
    bool ok = false;
    uint8_t *mbytes = NULL;
    size_t mlen = 0;
    int err;
    if (!state || !model) {
        snprintf(why, why_size, "out of memory");
    } else if ((err = read_file(state, &l->bytes, &l->len)) != 0) {
        snprintf(why, why_size, "state.bin: %s", err == EINVAL ? "not a regular file" : strerror(err));
    } else if (parse_state(l->bytes, l->len, l, why, why_size)) {
        json_t *mf = json_object_get(l->head, "model_file");
        if ((err = read_file(model, &mbytes, &mlen)) != 0)
            snprintf(why, why_size, "model.onnx: %s", err == EINVAL ? "not a regular file" : strerror(err));
        else if ((json_int_t)mlen != json_integer_value(json_object_get(mf, "bytes")) ||
                 (json_int_t)crc32_of(0, mbytes, mlen) != json_integer_value(json_object_get(mf, "crc32")))
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
    char *latest_path = join(dir, "latest");
    uint8_t *latest = NULL;
    size_t latest_len = 0;
    char first[64] = "";
    if (latest_path && read_file(latest_path, &latest, &latest_len) == 0 && latest_len < sizeof first) {
        memcpy(first, latest, latest_len);
        first[latest_len] = 0;
        first[strcspn(first, "\n")] = 0;
        if (step_of_name(first) < 0) first[0] = 0;
    }
    free(latest);
    free(latest_path);
    int n;
    int64_t *steps = list_steps(dir, &n);
    char why[256] = "", damaged[1024] = "";
    bool ok = false;
    for (int i = -1; !ok && i < n; i++) {
        char name[sizeof first];
        if (i < 0) {
            if (!first[0]) continue;
            snprintf(name, sizeof name, "%s", first);
        } else {
            step_name(name, sizeof name, steps[i]);
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
            size_t j;
            json_t *o, *found = NULL;
            json_array_foreach(tensors, j, o) if (!strcmp(json_string_value(json_object_get(o, "name")), t->name))
                found = o;
            const char *what = k ? "optimizer state" : "parameter";
            if (!found)
                return rt_error(e, "%s has no %s '%s': it was written by a program of another model or optimizer",
                                where, what, t->name);
            json_t *shape = shape_json(t);
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
    if (!loss || strcmp(loss, loss_name(m->loss_kind)) != 0)
        return rt_error(e, "%s was written with --loss %s, this program has --loss %s", where, loss ? loss : "?",
                        loss_name(m->loss_kind));
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
            size_t j;
            json_t *o;
            json_array_foreach(tensors, j, o) {
                if (strcmp(json_string_value(json_object_get(o, "name")), t->name) != 0) continue;
                if ((uint64_t)json_integer_value(json_object_get(o, "bytes")) != t->bytes)
                    rt_fatal("--resume: %s has %" PRId64 " bytes in the checkpoint, %" PRIu64 " here", t->name,
                             (int64_t)json_integer_value(json_object_get(o, "bytes")), t->bytes);
                memcpy(arena + t->offset, l->bytes + l->payload + json_integer_value(json_object_get(o, "offset")),
                       t->bytes);
                break;
            }
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
