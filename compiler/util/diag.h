/* diag.h - errors: the user's, and the compiler's own.
 *
 * Library code never exits: a failing function records the first error in a
 * Diag (later ones are dropped, as the first is usually the cause) and returns
 * false.  main() prints the message and maps the code to an exit status via
 * the single table in diag.c: 2 for a bad command line, 1 for bad input.
 *
 * A broken invariant is a compiler bug, never the user's fault: a function
 * that can return a Diag records DIAG_INTERNAL (printed as "cleave: internal
 * error: ... (please report)", exit 70); one that cannot (a constructor
 * handed an impossible argument) stops at once with CLEAVE_CHECK, which
 * prints the same line with the file and line and exits 70.  No input,
 * however malformed, may reach either: the fuzzer and tests/cli check that. */
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
    DIAG_INTERNAL,    /* a broken invariant: a compiler bug, exit 70 */
} DiagCode;

/* Exit status of an internal error (EX_SOFTWARE of sysexits.h). */
#define DIAG_INTERNAL_STATUS 70

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

/* Prints "cleave: internal error: FILE:LINE: msg (please report)" on stderr
 * and exits DIAG_INTERNAL_STATUS; for invariants where no Diag can be
 * returned.  Use through CLEAVE_CHECK. */
_Noreturn void diag_bug(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Stops with diag_bug unless cond holds; unlike assert() it is checked in
 * release builds too. */
#define CLEAVE_CHECK(cond, ...)                                 \
    do {                                                        \
        if (!(cond)) diag_bug(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#endif
