#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int cli_fail(const Diag *d) {
    if (d->code == DIAG_INTERNAL)
        fprintf(stderr, "cleave: internal error: %s (please report)\n", d->msg);
    else
        fprintf(stderr, "cleave: error: %s\n", d->msg);
    return diag_exit_status(d->code);
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cleave %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'cleave %s --help')\n", cmd);
    va_end(ap);
    return diag_exit_status(DIAG_USAGE);
}

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}
