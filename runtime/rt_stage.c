/* rt_stage.c - the ends of a run that depend on its stages: gathering
 * every stage's parameters on rank 0 for --save (with one stage, rank 0
 * holds them all), and the metrics line that says which rank runs which
 * stage.  The transfers of a step are in rt_p2p.c, the stage group sums
 * in rt_collective.c. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "rt_mpi.h"

/* A tensor's bytes as the count of one MPI message. */
static int message_bytes(const RtTensor *t) {
    if (t->bytes > INT_MAX) rt_fatal("%s of %" PRIu64 " bytes is too large to send", t->name, t->bytes);
    return (int)t->bytes;
}

/* Rank 0 copies the tensors of stage 0 and receives every other from the
 * replica-0 rank of the stage that holds it, which sends it. */
static void gather(const RtMeta *m, const char *arena, const RtTensor *held_list, int n_held, RtTensor *all,
                   const int *stage_of, int n_all, char **buf) {
    const RtLayout *st = &m->layout;
    bool rank0 = rt_rank() == 0;
    uint64_t total = 0;
    for (int i = 0; i < n_all; i++) total += (all[i].bytes + 63) / 64 * 64;
    *buf = NULL;
    if (rank0 && !(*buf = malloc(total ? total : 1)))
        rt_fatal("out of memory for %" PRIu64 " bytes of parameters and optimizer state", total);
    uint64_t at = 0;
    for (int i = 0; i < n_all; i++) {
        RtTensor *t = &all[i];
        int owner = stage_of[i];
        const RtTensor *held = NULL;
        for (int k = 0; k < n_held && !held; k++)
            if (strcmp(held_list[k].name, t->name) == 0) held = &held_list[k];
        if (rank0) {
            t->offset = at;
            if (owner == 0 && held) memcpy(*buf + at, arena + held->offset, t->bytes);
            else {
                int from = rt_layout_rank(st, 0, owner);
                rt_watch_begin("the receive of parameters for --save or a checkpoint from", -1, from);
                MPI_Recv(*buf + at, message_bytes(t), MPI_BYTE, from, i % 32768, rt_comm_world(), MPI_STATUS_IGNORE);
                rt_watch_end();
            }
            at += (t->bytes + 63) / 64 * 64;
        } else if (st->replica == 0 && st->stage == owner && owner != 0) {
            if (!held) rt_fatal("stage %d does not hold %s", owner, t->name);
            rt_watch_begin("the send of parameters for --save or a checkpoint to", -1, 0);
            MPI_Send(arena + held->offset, message_bytes(t), MPI_BYTE, 0, i % 32768, rt_comm_world());
            rt_watch_end();
        }
    }
}

bool rt_stage_gather_params(const RtMeta *m, const char *arena, RtMeta *view, char **buf, RtErr *e) {
    const RtLayout *st = &m->layout;
    gather(m, arena, m->params, m->n_params, st->all_params, st->param_stage, st->n_all_params, buf);
    if (rt_rank() == 0) rt_stage_save_view(m, view);
    (void)e;
    return true;
}

void rt_stage_gather_state(const RtMeta *m, const char *arena, char **buf) {
    const RtLayout *st = &m->layout;
    gather(m, arena, m->state, m->n_state, st->all_state, st->state_stage, st->n_all_state, buf);
}

void rt_stage_save_view(const RtMeta *m, RtMeta *view) {
    *view = *m;
    view->params = m->layout.all_params;
    view->n_params = m->layout.n_all_params;
}

void rt_stage_report(RtLog *l, const RtMeta *m) {
    const RtLayout *st = &m->layout;
    int ranks = rt_ranks();
    long long mine[3] = {st->stage, st->replica, (long long)st->peak_act_bytes};
    long long *all = rt_rank() == 0 ? malloc(sizeof *all * 3 * (size_t)ranks) : NULL;
    if (rt_rank() == 0 && !all) rt_fatal("out of memory for the report of %d ranks", ranks);
    rt_watch_begin("the gather of the stages' layout for --metrics", -1, RT_WATCH_EVERY);
    MPI_Gather(mine, 3, MPI_LONG_LONG, all, 3, MPI_LONG_LONG, 0, rt_comm_world());
    rt_watch_end();
    if (all && l->metrics) {
        fprintf(l->metrics, "{\"plan\": {\"schedule\": \"%s\", \"stages\": %d, \"dp\": %d, \"microbatches\": %d, "
                "\"ranks\": [", st->schedule, st->stages, st->dp, st->microbatches);
        for (int r = 0; r < ranks; r++)
            fprintf(l->metrics, "%s{\"rank\": %d, \"stage\": %lld, \"replica\": %lld, \"peak_activation_bytes\": %lld}",
                    r ? ", " : "", r, all[3 * r], all[3 * r + 1], all[3 * r + 2]);
        fprintf(l->metrics, "]}}\n");
    }
    free(all);
}
