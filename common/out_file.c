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

/* What the target is now: 0 for a regular file or none (write beside it
 * and rename), 1 for a device or FIFO (write in place), or an errno. */
static int target_kind(const char *target) {
    struct stat st;
    if (stat(target, &st) != 0) return errno == ENOENT ? 0 : errno;
    if (S_ISREG(st.st_mode)) return 0;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return 1;
    return EINVAL;
}

static int open_direct(OutFile *o, const char *target) {
    o->target = strdup(target);
    if (!o->target) return ENOMEM;
    /* O_NONBLOCK: a FIFO nobody reads fails with ENXIO instead of
     * blocking the program forever. */
    int fd = open(target, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        free(o->target);
        memset(o, 0, sizeof *o);
        return err;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int err = errno;
        close(fd);
        free(o->target);
        memset(o, 0, sizeof *o);
        return err;
    }
    o->direct = true;
    return 0;
}

int out_file_open(OutFile *o, const char *target) {
    memset(o, 0, sizeof *o);
    int kind = target_kind(target);
    if (kind == 1) return open_direct(o, target);
    if (kind != 0) return kind;
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

int out_file_reserve(OutFile *o, const char *target) {
    memset(o, 0, sizeof *o);
    int kind = target_kind(target);
    if (kind == 1) return ENOTSUP;
    int err = out_file_open(o, target);
    if (err) return err;
    err = fclose(o->f) == 0 ? 0 : errno;
    o->f = NULL;
    if (err) out_file_abort(o);
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

/* Syncs a file a writer other than this one wrote by name. */
static int sync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = fsync(fd) != 0 && errno != EINVAL ? errno : 0;
    close(fd);
    return err;
}

int out_file_commit(OutFile *o) {
    if (!o->f && !o->tmp) return EBADF;
    int err = 0;
    if (o->f) {
        if (fflush(o->f) != 0 || ferror(o->f)) err = errno ? errno : EIO;
        /* Devices and pipes cannot be synced, and need not be. */
        if (!err && !o->direct && fsync(fileno(o->f)) != 0 && errno != EINVAL) err = errno;
        if (fclose(o->f) != 0 && !err) err = errno ? errno : EIO;
        o->f = NULL;
    } else {
        err = sync_path(o->tmp);
    }
    if (o->direct) {
        out_file_abort(o);
        return err;
    }
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

void out_file_write(OutFile *o, const void *data, size_t len) {
    if (len && fwrite(data, 1, len, o->f) != len && !o->err) o->err = errno ? errno : EIO;
}

int out_file_finish(OutFile *o) {
    if (o->err || (o->f && ferror(o->f))) {
        int err = o->err ? o->err : EIO;
        out_file_abort(o);
        return err;
    }
    return out_file_commit(o);
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

bool out_file_in_place(const char *path) { return target_kind(path) == 1; }

const char *out_file_why(int err) {
    switch (err) {
    case EISDIR: return "is a folder";
    case EINVAL: return "not a regular file, device or FIFO";
    case ENXIO: return "a FIFO with no reader";
    case ENOTSUP: return "a device or FIFO, where only a regular file will do";
    default: return strerror(err);
    }
}
