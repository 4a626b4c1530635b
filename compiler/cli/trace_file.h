/* trace_file.h - reading the Chrome trace a training program writes with
 * --trace (runtime/rt_trace.c), for the commands that measure from it
 * (trace-stats, report), so that both read and check it the same way.
 *
 * Only complete ("ph": "X") events are kept; each is checked (numeric ts
 * and dur, dur >= 0, both within TRACE_MAX_US, an integer tid) and an
 * error names the file and the event's index.  A trace without any step
 * event is refused: nothing can be measured from it. */
#ifndef CLEAVE_TRACE_FILE_H
#define CLEAVE_TRACE_FILE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "../util/diag.h"

/* Microseconds beyond which a ts or dur is garbage (about 30 years); the
 * bound also keeps every sum finite, which JSON output needs. */
#define TRACE_MAX_US 1e15

/* What an event's category ("cat") says the rank was doing. */
typedef enum { TRACE_STEP, TRACE_BUSY, TRACE_WAIT, TRACE_ALLREDUCE, TRACE_OTHER } TraceKind;

typedef struct TraceEvent {
    long long rank, step; /* tid; args.step, or -1 */
    size_t index;         /* position in traceEvents: a stable sort order */
    TraceKind kind;
    double ts, dur;       /* microseconds */
    const char *name;     /* borrowed from the document; "" when absent */
} TraceEvent;

typedef struct Trace {
    const char *path;
    json_t *root;
    const json_t *other; /* otherData, borrowed; may be NULL */
    TraceEvent *ev;      /* the X events, sorted by rank, then ts, then index */
    int n, n_steps;
    bool numbered;       /* every step event has args.step: steps match across ranks by it */
} Trace;

/* One step event of a rank. */
typedef struct TraceStep {
    long long key; /* args.step, or the step's position on its rank */
    double ts, dur;
} TraceStep;

/* The JSON document at path; NULL with a Diag naming the file (and the
 * line and column of a syntax error). */
json_t *cli_read_json(const char *path, Diag *d);

bool trace_read(const char *path, Trace *t, Diag *d);
void trace_free(Trace *t);

/* The end of the rank whose events start at t->ev[lo]. */
int trace_rank_end(const Trace *t, int lo);

/* ev[0..n) are one rank's events (sorted by ts).  Its step events go to
 * steps[] in order, keyed by args.step when `numbered`, else by position;
 * owner[i] becomes the index in steps[] of the step holding ev[i] (by the
 * event's midpoint, so that rounding at a step's edges does not push an
 * event out of it), or -1 for step events and events outside every step.
 * Returns the number of steps. */
int trace_rank_steps(const TraceEvent *ev, int n, bool numbered, TraceStep *steps, int *owner);

#endif
