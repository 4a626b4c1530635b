/* diag.h - user-facing errors.
 *
 * Library code never exits: a failing function records the first error in a
 * Diag (later ones are dropped, as the first is usually the cause) and returns
 * false.  main() prints the message and maps the code to an exit status via
 * the single table in diag.c.  Broken compiler invariants are asserts, not
 * Diags. */
#ifndef CLEAVE_DIAG_H
#define CLEAVE_DIAG_H

#include <stdbool.h>

/* Error kinds; the exit status of each is in diag.c (grep DIAG_CODES). */
typedef enum {
    DIAG_OK = 0,
    DIAG_USAGE,       /* bad command line */
    DIAG_IO,          /* file missing or unreadable */
    DIAG_FORMAT,      /* not a valid ONNX / data file */
    DIAG_UNSUPPORTED, /* valid input that cleave cannot handle */
    DIAG_GRAPH,       /* malformed graph: cycle, undefined value, ... */
    DIAG_SHAPE,       /* shape or dtype mismatch */
    DIAG_LIMIT,       /* sizes that would overflow */
    DIAG_NOMEM,
    DIAG_INTERNAL,
} DiagCode;

typedef struct Diag {
    DiagCode code;
    char msg[1024];
} Diag;

/* Records "msg" if no error is recorded yet; always returns false so callers
 * can write `return diag_error(d, ...)`. */
bool diag_error(Diag *d, DiagCode code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool diag_failed(const Diag *d);
int diag_exit_status(DiagCode code);
const char *diag_code_name(DiagCode code);

#endif
