/* rt_checkpoint.c - --checkpoint DIR: the format and writing (docs/checkpoint.md);
 * rt_resume.c reads a checkpoint back.
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
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rt_ckpt.h"

/* ---- what a checkpoint records ------------------------------------------- */

json_t *rt_ckpt_shape_json(const RtTensor *t) {
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
                     "cleave-checkpoint", "version", RT_CKPT_VERSION, "step", (json_int_t)step, "total_steps",
                     (json_int_t)r->total_steps, "batch", (json_int_t)m->batch, "model_hash", hash, "loss_kind",
                     rt_loss_kind_name(m->loss_kind), "optimizer", opt ? opt : json_object(), "lr", lr, "data", data,
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
                              "shape", rt_ckpt_shape_json(t), "offset", (json_int_t)*at, "bytes", (json_int_t)t->bytes);
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
    int err = rt_ckpt_make_dirs(dir);
    if (err) return rt_error(e, "--checkpoint %s: cannot create the folder: %s", dir, strerror(err));
    char name[40], tmpl[64];
    rt_ckpt_name(name, sizeof name, step);
    snprintf(tmpl, sizeof tmpl, ".tmp-%s-XXXXXX", name);
    char *tmp = rt_ckpt_join(dir, tmpl), *final = rt_ckpt_join(dir, name);
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
                                                      (json_int_t)rt_ckpt_crc32(0, model, model_len)));
    head = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (!head) {
        rt_error(e, "--checkpoint: out of memory");
        goto out;
    }
    size_t head_len = strlen(head), padded = (RT_CKPT_HEAD + head_len + 63) / 64 * 64 - RT_CKPT_HEAD;
    size_t front_len = RT_CKPT_HEAD + padded;
    uint8_t *front = calloc(1, front_len);
    if (!front) {
        rt_error(e, "--checkpoint: out of memory");
        goto out;
    }
    uint32_t version = RT_CKPT_VERSION;
    uint64_t hl = head_len;
    memcpy(front, RT_CKPT_MAGIC, 8);
    memcpy(front + 8, &version, 4);
    memcpy(front + 16, &hl, 8);
    memcpy(front + RT_CKPT_HEAD, head, head_len);
    uint32_t crc = rt_ckpt_crc32(rt_ckpt_crc32(0, front, front_len), (const uint8_t *)payload, at);
    uint8_t tail[RT_CKPT_TAIL] = {0};
    memcpy(tail, &crc, 4);
    /* payload and tail go out together: one more buffer is not needed */
    char *body = realloc(payload, at + RT_CKPT_TAIL);
    if (body) {
        payload = body;
        memcpy(payload + at, tail, RT_CKPT_TAIL);
    }
    err = !body ? ENOMEM : rt_ckpt_write_file(tmp, "model.onnx", model, model_len, NULL, 0);
    if (!err) err = rt_ckpt_write_file(tmp, "state.bin", front, front_len, payload, at + RT_CKPT_TAIL);
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
        old = rt_ckpt_join(dir, aside);
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
    if (old) rt_ckpt_remove(old);
    free(old);
    char line[48];
    snprintf(line, sizeof line, "%s\n", name);
    err = rt_ckpt_write_file(dir, "latest", line, strlen(line), NULL, 0);
    if (err) {
        rt_error(e, "--checkpoint %s: %s is written but 'latest' could not be updated: %s", dir, name,
                 out_file_why(err));
        goto out;
    }
    ok = true;
out:
    if (tmp) rt_ckpt_remove(tmp);
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
    int64_t *steps = rt_ckpt_list(c->dir, &n);
    for (int i = c->keep; steps && i < n; i++) {
        char name[40];
        rt_ckpt_name(name, sizeof name, steps[i]);
        char *path = rt_ckpt_join(c->dir, name);
        if (path) rt_ckpt_remove(path);
        free(path);
    }
    free(steps);
    DIR *d = opendir(c->dir);
    struct dirent *ent;
    while (d && (ent = readdir(d)) != NULL) {
        if (strncmp(ent->d_name, ".tmp-step-", 10) != 0 && strncmp(ent->d_name, ".old-step-", 10) != 0) continue;
        char *path = rt_ckpt_join(c->dir, ent->d_name);
        if (path) rt_ckpt_remove(path);
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
