/* plan_file.h - reading a plan file back for `cleave compile --plan`.
 *
 * Requires: a JSON plan in the format of docs/plan.md.  Provides: the
 * compile options its decisions stand for (strategy, ranks, replicas,
 * stages and their first nodes, micro-batches, schedule, placement, bucket size,
 * batch, loss, optimizer), and a check of its derived fields against the
 * plan those options give. */
#ifndef CLEAVE_PLAN_FILE_H
#define CLEAVE_PLAN_FILE_H

#include <stddef.h>

#include "driver.h"

typedef struct PlanFile {
    const char *path;
    struct json_t *root;  /* owns every string the options point to */
    const char **cuts;    /* stage k + 1's first node, k = 0 .. stages - 2 */
    const char **no_decay; /* optimizer.no_decay's patterns */
} PlanFile;

/* Sets o's decisions from the plan at path (o->model only when NULL);
 * one line naming the file and field on failure.  Free f after o's use. */
bool plan_file_load(const char *path, CompileOptions *o, PlanFile *f, Diag *d);
/* True when a field the file states differs from the derived plan (its
 * plan_json); `where` gets its path, e.g. "rank_plans[1].steps[12].node". */
struct json_t;
bool plan_file_compare(const PlanFile *f, const struct json_t *derived, char *where, size_t len);
/* A planner error about flags, reworded to name the plan file's fields. */
void plan_file_reword(const PlanFile *f, Diag *d);
void plan_file_free(PlanFile *f);

#endif
