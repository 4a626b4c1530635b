/* rt_err.c - recording the first error of a failing call. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "rt.h"

static bool record(RtErr *e, int status, const char *fmt, va_list ap) {
    if (!e || e->status != 0) return false;
    e->status = status;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    /* One line per error: fold any newline that came in with a file name. */
    for (char *p = e->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return false;
}

bool rt_error(RtErr *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(e, 1, fmt, ap);
    va_end(ap);
    return false;
}

bool rt_usage_error(RtErr *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(e, 2, fmt, ap);
    va_end(ap);
    return false;
}

bool rt_error_all(RtErr *e, const char *fmt, ...) {
    if (!e || e->status != 0) return false;
    va_list ap;
    va_start(ap, fmt);
    record(e, 1, fmt, ap);
    va_end(ap);
    e->every = true;
    e->origin = -1;
    return false;
}

const char *rt_shape_str(char *buf, size_t size, int ndim, const int64_t *dims) {
    size_t n = 0;
    n += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%" PRId64, i ? ", " : "", dims[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}
