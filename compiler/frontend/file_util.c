#include "file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint8_t *file_read_all(const char *path, size_t *len, Diag *d) {
    /* O_NONBLOCK: opening a FIFO to read would wait for a writer, and
     * reading it for its end; it is refused below before either. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        diag_error(d, DIAG_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        diag_error(d, DIAG_IO, "%s: not a regular file%s", path,
                   S_ISFIFO(st.st_mode) ? " (a FIFO): give a file" : S_ISDIR(st.st_mode) ? " (a folder)" : "");
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        fclose(f);
        diag_error(d, DIAG_NOMEM, "%s: out of memory reading %zu bytes", path, size);
        return NULL;
    }
    size_t got = fread(buf, 1, size, f);
    bool bad = ferror(f);
    fclose(f);
    if (bad || got != size) {
        free(buf);
        diag_error(d, DIAG_IO, "%s: read error", path);
        return NULL;
    }
    *len = size;
    return buf;
}

char *path_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    size_t n = (size_t)(slash - path);
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, path, n);
    s[n] = 0;
    return s;
}
