/* rt_ckpt_folder.c - the folder of checkpoints: names step-NNNNNNNNN,
 * listing them newest first, creating and removing folders, and whole
 * files written through out_file and read back (rt_ckpt.h). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rt_ckpt.h"

char *rt_ckpt_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", dir, name);
    return s;
}

/* mkdir -p: a missing folder, and its missing parents, are created. */
int rt_ckpt_make_dirs(const char *path) {
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
void rt_ckpt_remove(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char *f = rt_ckpt_join(path, ent->d_name);
        if (f) unlink(f);
        free(f);
    }
    closedir(d);
    rmdir(path);
}

/* The step of a checkpoint folder's name "step-N", or -1. */
int64_t rt_ckpt_step_of(const char *name) {
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
int64_t *rt_ckpt_list(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int cap = 16;
    int64_t *steps = malloc(sizeof *steps * (size_t)cap);
    struct dirent *ent;
    while (steps && (ent = readdir(d)) != NULL) {
        int64_t s = rt_ckpt_step_of(ent->d_name);
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

void rt_ckpt_name(char *buf, size_t size, int64_t step) { snprintf(buf, size, "step-%09" PRId64, step); }

/* Writes len bytes to dir/name through out_file (synced, renamed). */
int rt_ckpt_write_file(const char *dir, const char *name, const void *a, size_t a_len, const void *b, size_t b_len) {
    char *path = rt_ckpt_join(dir, name);
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
int rt_ckpt_read_file(const char *path, uint8_t **buf, size_t *len) {
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

uint32_t rt_ckpt_crc32(uint32_t crc, const uint8_t *p, size_t len) {
    /* zlib's crc32 takes at most UINT_MAX bytes at a time */
    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}
