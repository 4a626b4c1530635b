/* rt_agree.c - the ranks comparing what they hold: the start-up exchange,
 * agreeing on failures and on the rows loaded, and --check-replicas.
 *
 * A program runs alone or under mpirun.  Two rules keep a run of several
 * ranks from hanging:
 *   - a rank that fails on its own (a file only it cannot read, an internal
 *     error) either reaches the next agreement point (rt_comm_agree), where
 *     every rank learns of it and all exit together, or aborts the whole job
 *     with MPI_Abort (rt_die);
 *   - every collective is reached by every rank: the start-up exchange
 *     (rt_comm_startup) makes sure all ranks run the same program with the
 *     same options and the row counts are compared after loading, so the
 *     number of steps and collectives is the same everywhere. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "rt_comm.h"

/* What one rank tells the others at an agreement point. */
typedef struct Report {
    int64_t status; /* the rank's error so far, 0 for none */
    uint64_t msg;   /* hash of its message */
    int64_t help;
    int64_t train_rows, eval_rows;
    uint64_t options;
    char hash[RT_HASH_MAX + 8]; /* NUL-padded */
} Report;

/* Gathers every rank's report (`what` names the exchange to the
 * watchdog).  Out of memory, which this rank cannot tell the others,
 * aborts the job. */
static Report *gather(const Report *mine, const char *what) {
    Report *all = calloc((size_t)rt_ranks(), sizeof *all);
    if (!all) rt_fatal("out of memory for %d ranks' reports", rt_ranks());
    rt_watch_begin(what, -1, RT_WATCH_EVERY);
    MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, rt_comm_world());
    rt_watch_end();
    return all;
}

/* This rank's part of a report: its error so far. */
static Report report(const RtErr *e) {
    Report mine = {.status = e->status};
    if (e->status) mine.msg = rt_fnv1a64(RT_FNV1A64_INIT, e->msg, strlen(e->msg));
    return mine;
}

/* The first rank that reported an error: every rank then fails with that
 * rank's status and it alone prints its message, naming itself; when every
 * rank failed the same way (the same flags, the same missing file), rank 0
 * prints the message without a rank. */
static bool settle(const Report *all, RtErr *e) {
    int ranks = rt_ranks();
    for (int r = 0; r < ranks; r++) {
        if (!all[r].status) continue;
        if (ranks == 1) return false; /* e holds it; rt_die prints it */
        bool same = true;
        for (int q = 0; q < ranks && same; q++) same = all[q].status == all[r].status && all[q].msg == all[r].msg;
        if (r != rt_rank() && !same) {
            memset(e, 0, sizeof *e);
            snprintf(e->msg, sizeof e->msg, "rank %d failed", r);
        }
        e->status = (int)all[r].status;
        e->every = true;
        e->origin = same ? -1 : r;
        return false;
    }
    return true;
}

bool rt_comm_startup(const RtHello *h, bool *any_help, RtErr *e) {
    Report mine = report(e);
    mine.help = h->help;
    mine.options = h->options;
    const RtMeta *m = h->meta;
    if (m) snprintf(mine.hash, sizeof mine.hash, "%s", m->plan_hash);
    Report *all = gather(&mine, "the start-up exchange");
    bool ok = settle(all, e);
    int ranks = rt_ranks();
    *any_help = false;
    for (int r = 0; ok && r < ranks; r++) *any_help |= all[r].help != 0;
    if (!ok || *any_help) {
        free(all);
        return ok;
    }
    /* No rank failed and none asked for help: each has its metadata. */
    for (int r = 1; r < ranks && ok; r++) {
        if (strcmp(all[r].hash, all[0].hash) != 0)
            ok = rt_error_all(e, "ranks run different programs (plan hash %s on rank 0, %s on rank %d): start the same "
                              "program on every rank", all[0].hash, all[r].hash, r);
        else if (all[r].options != all[0].options)
            ok = rt_error_all(e, "rank %d was started with other options than rank 0 (--steps, --epochs, --shuffle, "
                              "--lr, --eval-data, --predict, --check-replicas, --trace and --timeout must be the same on "
                              "every rank)", r);
    }
    free(all);
    if (!ok) return false;
    /* A program of one rank may run on several, each training alone
     * (rt_main.c warns); one of several needs exactly its ranks. */
    if (m->ranks > 1 && m->ranks != ranks) {
        const char *prog = rt_prog_name();
        if (ranks == 1)
            return rt_error_all(e, "%s was compiled for %d ranks but runs alone; start it with mpirun -np %d %s ...",
                                prog, m->ranks, m->ranks, prog);
        return rt_error_all(e, "%s was compiled for %d ranks but runs on %d (mpirun -np %d); start it with mpirun "
                            "-np %d", prog, m->ranks, ranks, ranks, m->ranks);
    }
    return true;
}

/* rt_comm_agree_rows; `what` names the agreement to the watchdog. */
static bool agree_rows(int64_t train_rows, int64_t eval_rows, const char *what, RtErr *e) {
    Report mine = report(e);
    mine.train_rows = train_rows;
    mine.eval_rows = eval_rows;
    Report *all = gather(&mine, what);
    bool ok = settle(all, e);
    for (int r = 1; r < rt_ranks() && ok; r++) {
        if (all[r].train_rows != all[0].train_rows)
            ok = rt_error_all(e, "rank %d's --data files have %" PRId64 " rows but rank 0's have %" PRId64
                              ": every rank must read the same data", r, all[r].train_rows, all[0].train_rows);
        else if (all[r].eval_rows != all[0].eval_rows)
            ok = rt_error_all(e, "rank %d's --eval-data files have %" PRId64 " rows but rank 0's have %" PRId64
                              ": every rank must read the same data", r, all[r].eval_rows, all[0].eval_rows);
    }
    free(all);
    return ok;
}

bool rt_comm_agree_rows(int64_t train_rows, int64_t eval_rows, RtErr *e) {
    return agree_rows(train_rows, eval_rows, "the agreement after loading the data", e);
}

bool rt_comm_agree(RtErr *e) { return agree_rows(0, 0, "the agreement on the run's outcome", e); }

/* ---- --check-replicas ---------------------------------------------------- */

/* Every rank hashes each of its parameters, and the hashes, and compares
 * them within the replicas of its stage (all the ranks of a program with
 * one stage); every rank then learns the first stage whose replicas
 * differ.  With one stage every rank knows the first differing rank and
 * parameter, which the message names; with several, the stage. */
bool rt_comm_check_replicas(const RtMeta *m, const char *arena, RtErr *e) {
    MPI_Comm replicas = rt_comm_replicas();
    int n = m->n_params, size = 1;
    MPI_Comm_size(replicas, &size);
    uint64_t *mine = malloc((size_t)(n + 1) * sizeof *mine);
    uint64_t *all = malloc((size_t)(n + 1) * (size_t)size * sizeof *all);
    if (!mine || !all) rt_fatal("--check-replicas: out of memory for %d parameters", n);
    for (int i = 0; i < n; i++)
        mine[i] = rt_fnv1a64(RT_FNV1A64_INIT, arena + m->params[i].offset, (size_t)m->params[i].bytes);
    mine[n] = rt_fnv1a64(RT_FNV1A64_INIT, mine, (size_t)n * sizeof *mine);
    rt_watch_begin("the exchange of --check-replicas hashes", -1, RT_WATCH_REPLICAS);
    MPI_Allgather(mine, n + 1, MPI_UINT64_T, all, n + 1, MPI_UINT64_T, replicas);
    rt_watch_end();
    int differ = -1, param = 0;
    for (int r = 1; r < size && differ < 0; r++) {
        const uint64_t *theirs = all + (size_t)r * (size_t)(n + 1);
        if (theirs[n] == all[n]) continue;
        differ = r;
        while (param < n - 1 && theirs[param] == all[param]) param++;
    }
    free(mine);
    free(all);
    int bad = differ >= 0 ? rt_group_stage() : INT_MAX, first = INT_MAX;
    rt_watch_begin("the outcome of --check-replicas", -1, RT_WATCH_EVERY);
    MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, rt_comm_world());
    rt_watch_end();
    if (first == INT_MAX) return true;
    if (m->layout.stages > 1)
        return rt_error_all(e, "replicas diverged: the replicas of stage %d hold different parameters", first);
    return rt_error_all(e, "replicas diverged: rank %d's parameters differ from rank 0's (first differing "
                        "parameter %s)", differ, n ? m->params[param].name : "?");
}
