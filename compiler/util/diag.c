#include "diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DIAG_CODES: name and exit status of each kind.  Usage errors exit 2, bad
 * input 1 and compiler bugs 70, so scripts can tell "you called me wrong"
 * from "your input is wrong" from "cleave is wrong". */
static const struct {
    const char *name;
    int status;
} diag_table[] = {
    [DIAG_OK] = {"ok", 0},
    [DIAG_USAGE] = {"usage", 2},
    [DIAG_IO] = {"io", 1},
    [DIAG_FORMAT] = {"format", 1},
    [DIAG_UNSUPPORTED] = {"unsupported", 1},
    [DIAG_GRAPH] = {"graph", 1},
    [DIAG_SHAPE] = {"shape", 1},
    [DIAG_LIMIT] = {"limit", 1},
    [DIAG_NOMEM] = {"out of memory", 1},
    [DIAG_INTERNAL] = {"internal", DIAG_INTERNAL_STATUS},
};

bool diag_error(Diag *d, DiagCode code, const char *fmt, ...) {
    if (!d || d->code != DIAG_OK) return false;
    d->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    va_end(ap);
    /* One line per error: fold any newline that slipped into a name. */
    for (char *p = d->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return false;
}

bool diag_failed(const Diag *d) { return d->code != DIAG_OK; }

int diag_exit_status(DiagCode code) { return diag_table[code].status; }

const char *diag_code_name(DiagCode code) { return diag_table[code].name; }

void diag_bug(const char *file, int line, const char *fmt, ...) {
    /* The path from the source tree's root, wherever it was built. */
    const char *rel = strstr(file, "compiler/");
    if (rel) file = rel;
    fflush(stdout);
    fprintf(stderr, "cleave: internal error: %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (please report)\n");
    exit(DIAG_INTERNAL_STATUS);
}
