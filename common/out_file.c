/* out_file.c - output files that appear whole or not at all (out_file.h). */
#include "out_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The directory part of path ("." for a bare name), in a new string. */
static char *dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return NULL;
    char *dir = strdup(dirname(copy));
    free(copy);
    return dir;
}

int out_file_open(OutFile *o, const char *target) {
    memset(o, 0, sizeof *o);
    char *copy = strdup(target), *dir = dir_of(target);
    if (!copy || !dir) {
        free(copy);
        free(dir);
        return ENOMEM;
    }
    const char *base = basename(copy);
    size_t len = strlen(dir) + strlen(base) + 16;
    o->tmp = malloc(len);
    o->target = strdup(target);
    int err = 0;
    if (!o->tmp || !o->target) err = ENOMEM;
    else {
        snprintf(o->tmp, len, "%s/.%s.tmp-XXXXXX", dir, base);
        int fd = mkstemp(o->tmp);
        if (fd < 0) err = errno;
        else {
            /* mkstemp makes 0600; an output gets what fopen would give. */
            mode_t mask = umask(0);
            umask(mask);
            if (fchmod(fd, 0666 & ~mask) != 0 || !(o->f = fdopen(fd, "wb"))) {
                err = errno;
                close(fd);
                unlink(o->tmp);
            }
        }
    }
    free(copy);
    free(dir);
    if (err) {
        free(o->tmp);
        free(o->target);
        memset(o, 0, sizeof *o);
    }
    return err;
}

int out_file_sync_dir(const char *path) {
    char *dir = dir_of(path);
    if (!dir) return ENOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
    free(dir);
    if (fd < 0) return errno;
    /* Some file systems cannot sync a directory; the rename stands. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) err = errno;
    close(fd);
    return err;
}

int out_file_commit(OutFile *o) {
    if (!o->f) return EBADF;
    int err = 0;
    if (fflush(o->f) != 0 || ferror(o->f)) err = errno ? errno : EIO;
    if (!err && fsync(fileno(o->f)) != 0 && errno != EINVAL) err = errno;
    if (fclose(o->f) != 0 && !err) err = errno ? errno : EIO;
    o->f = NULL;
    if (!err && rename(o->tmp, o->target) != 0) err = errno;
    if (err) {
        out_file_abort(o);
        return err;
    }
    free(o->tmp);
    o->tmp = NULL;
    err = out_file_sync_dir(o->target);
    free(o->target);
    o->target = NULL;
    return err;
}

void out_file_abort(OutFile *o) {
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->target);
    memset(o, 0, sizeof *o);
}

/* The canonical form of a path that may not exist yet: its directory
 * resolved, then its last component. */
static char *canonical(const char *path) {
    char *real = realpath(path, NULL);
    if (real) return real;
    char *copy = strdup(path), *dir = dir_of(path);
    char *rdir = dir ? realpath(dir, NULL) : NULL, *out = NULL;
    if (copy && rdir) {
        const char *base = basename(copy);
        size_t len = strlen(rdir) + strlen(base) + 2;
        out = malloc(len);
        if (out) snprintf(out, len, "%s/%s", rdir, base);
    }
    free(copy);
    free(dir);
    free(rdir);
    return out;
}

bool out_file_same(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char *ca = canonical(a), *cb = canonical(b);
    bool same = ca && cb ? strcmp(ca, cb) == 0 : strcmp(a, b) == 0;
    free(ca);
    free(cb);
    return same;
}
