/* comm_check.c - proving at compile time that the ranks' communication
 * matches up: the ranks' step sequences are walked against each other
 * (walk.h: buffered sends, blocking receives and blocking collectives),
 * and the first step that could never complete, or that completes against
 * the wrong message, is reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "walk.h"

static const char *vname(const PlanStep *s) { return s->value && s->value->name ? s->value->name : NULL; }

/* "recv 'h' from rank 0 (tag 5, 400 bytes)" and the like. */
static const char *describe(const PlanStep *s, char *buf, size_t len) {
    const char *v = vname(s);
    char named[300] = "";
    if (v) snprintf(named, sizeof named, "'%s' ", v);
    switch (s->kind) {
    case STEP_SEND:
        snprintf(buf, len, "send %sto rank %d (tag %d, %lld bytes)", named, s->peer, s->tag, (long long)s->bytes);
        break;
    case STEP_RECV:
        snprintf(buf, len, "recv %sfrom rank %d (tag %d, %lld bytes)", named, s->peer, s->tag, (long long)s->bytes);
        break;
    case STEP_ALLREDUCE:
        snprintf(buf, len, "allreduce %sover group %d (%lld bytes)", named, s->group, (long long)s->bytes);
        break;
    case STEP_SEND_WAIT:
        snprintf(buf, len, "completion of its send %sto rank %d (tag %d)", named, s->peer, s->tag);
        break;
    case STEP_ALLREDUCE_START:
        if (s->group < 0) snprintf(buf, len, "allreduce of bucket %d over all ranks", s->bucket);
        else snprintf(buf, len, "allreduce of bucket %d over group %d", s->bucket, s->group);
        break;
    default:
        snprintf(buf, len, "local step");
    }
    return buf;
}

/* The first unreceived message to rank `to` from `src` (NULL: none). */
static const WalkMsg *pending_from(const Walk *w, int to, int src) {
    for (int i = 0; i < w->box[to].n; i++) {
        const WalkMsg *m = &w->box[to].m[i];
        if (!m->received && m->src == src) return m;
    }
    return NULL;
}

/* A receive of rank r whose message went to another rank, and that its
 * sender will not send again: reported (true) when there is one. */
static bool misrouted(const Walk *w, const char *what, Diag *d) {
    char a[400];
    int n = w->n_ranks;
    for (int r = 0; r < n; r++) {
        const PlanStep *s = walk_at(w, r);
        if (!s || s->kind != STEP_RECV || s->peer < 0 || s->peer >= n) continue;
        bool later = false;
        for (int i = w->pc[s->peer]; i < w->len[s->peer] && !later; i++) {
            const PlanStep *o = &w->seq[s->peer][i];
            later = o->kind == STEP_SEND && o->peer == r && o->tag == s->tag;
        }
        if (later) continue;
        for (int q = 0; q < n; q++)
            for (int i = 0; q != r && i < w->box[q].n; i++) {
                const WalkMsg *m = &w->box[q].m[i];
                if (m->received || m->src != s->peer || m->tag != s->tag) continue;
                diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d step %d sent tag %d to rank %d instead",
                           what, r, w->pc[r], describe(s, a, sizeof a), m->src, m->step, m->tag, q);
                return true;
            }
    }
    return false;
}

/* Rank `cur` waits at s for rank `next`, which has ended. */
static void ended_peer(const Walk *w, int cur, const PlanStep *s, int next, const char *what, Diag *d) {
    char a[400];
    if (s->kind == STEP_RECV) {
        /* a message from that rank under another tag? */
        char hint[300] = "";
        const WalkMsg *m = pending_from(w, cur, next);
        if (m)
            snprintf(hint, sizeof hint, "; its unreceived message to rank %d from step %d has tag %d", cur, m->step,
                     m->tag);
        diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d finished without sending it%s",
                   what, cur, w->pc[cur], describe(s, a, sizeof a), next, hint);
    } else if (s->kind == STEP_SEND_WAIT) {
        diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d finished without receiving its message",
                   what, cur, w->pc[cur], describe(s, a, sizeof a), next);
    } else {
        diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d finished without joining it",
                   what, cur, w->pc[cur], describe(s, a, sizeof a), next);
    }
}

/* The ranks path[from .. len) wait for each other and the last for
 * path[from] (= next) again. */
static void deadlock(const Walk *w, const int *path, int from, int len, int next, const char *what, Diag *d) {
    char line[900], b[400];
    size_t o = 0;
    line[0] = '\0';
    for (int i = from; i < len && o < sizeof line - 1; i++) {
        int q = path[i];
        int n = snprintf(line + o, sizeof line - o, "rank %d step %d (%s) waits for ", q, w->pc[q],
                         describe(walk_at(w, q), b, sizeof b));
        if (n < 0) break;
        o += (size_t)n < sizeof line - o ? (size_t)n : sizeof line - o - 1;
    }
    /* a message under another tag is the usual cause */
    char hint[200] = "";
    for (int i = from; i < len && !hint[0]; i++) {
        int q = path[i];
        const PlanStep *s = walk_at(w, q);
        const WalkMsg *m = s->kind == STEP_RECV ? pending_from(w, q, s->peer) : NULL;
        if (m)
            snprintf(hint, sizeof hint, " (rank %d has an unreceived message from rank %d with tag %d, sent at step %d)",
                     q, s->peer, m->tag, m->step);
    }
    diag_error(d, DIAG_INTERNAL, "%s: deadlock: %srank %d%s", what, line, next, hint);
}

/* No rank can move: follow who waits for whom from the first stuck rank
 * r0 to a rank that finished (a message or member that never comes) or
 * around a cycle (a deadlock). */
static bool report_stuck(const Walk *w, int r0, const char *what, Diag *d) {
    if (misrouted(w, what, d)) return false;
    int n = w->n_ranks;
    int *seen = malloc(sizeof *seen * (size_t)n), *path = malloc(sizeof *path * (size_t)n);
    if (!seen || !path) {
        free(seen);
        free(path);
        return diag_error(d, DIAG_NOMEM, "out of memory checking communication");
    }
    for (int i = 0; i < n; i++) seen[i] = -1;
    for (int len = 0, cur = r0;;) {
        seen[cur] = len;
        path[len++] = cur;
        const PlanStep *s = walk_at(w, cur);
        int next = walk_waits_for(w, cur);
        char a[400];
        if (next < 0) {
            diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d (%s) is stuck", what, cur, w->pc[cur],
                       describe(s, a, sizeof a));
            break;
        }
        if (!walk_at(w, next)) {
            ended_peer(w, cur, s, next, what, d);
            break;
        }
        if (seen[next] >= 0) {
            deadlock(w, path, seen[next], len, next, what, d);
            break;
        }
        cur = next;
    }
    free(seen);
    free(path);
    return false;
}

/* The Diag of a walk's fault (comm_check's words for each). */
static bool report(const Walk *w, const WalkFault *f, const char *what, Diag *d) {
    const PlanStep *s = f->s;
    const WalkMsg *m = f->msg;
    char a[400], b[400];
    switch (f->kind) {
    case WALK_NO_PEER:
        return diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d: %s: %s", what, f->rank, f->step,
                          describe(s, a, sizeof a),
                          s->peer != f->rank ? "no such rank"
                          : s->kind == STEP_SEND ? "a rank cannot send to itself"
                                                 : "a rank cannot receive from itself");
    case WALK_TAG_IN_FLIGHT:
        return diag_error(d, DIAG_INTERNAL,
                          "%s: rank %d step %d sends tag %d to rank %d while its message with that tag from step %d is still unreceived (tags must be unique per micro-batch, tensor and direction)",
                          what, f->rank, f->step, s->tag, s->peer, m->step);
    case WALK_SIZE_MISMATCH:
        return diag_error(d, DIAG_INTERNAL,
                          "%s: size mismatch: rank %d step %d receives %lld bytes from rank %d (tag %d%s%s%s) but rank %d step %d sends %lld bytes%s%s%s",
                          what, f->rank, f->step, (long long)s->bytes, s->peer, s->tag, vname(s) ? ", '" : "",
                          vname(s) ? vname(s) : "", vname(s) ? "'" : "", m->src, m->step, (long long)m->bytes,
                          m->value ? " of '" : "", m->value ? m->value->name : "", m->value ? "'" : "");
    case WALK_NO_GROUP:
        return diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d allreduces over group %d, but there are %d groups", what,
                          f->rank, f->step, s->group, w->n_groups);
    case WALK_BAD_MEMBER:
        return diag_error(d, DIAG_INTERNAL, "%s: group %d names rank %d, but there are %d ranks", what, s->group,
                          f->other, w->n_ranks);
    case WALK_NOT_MEMBER:
        return diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d allreduces over group %d, which it is not a member of",
                          what, f->rank, f->step, s->group);
    case WALK_COLLECTIVE_MISMATCH:
        return diag_error(d, DIAG_INTERNAL, "%s: collective mismatch: rank %d step %d does %s but rank %d step %d does %s",
                          what, f->rank, f->step, describe(s, a, sizeof a), f->other, f->other_step,
                          describe(f->other_s, b, sizeof b));
    case WALK_STUCK: return report_stuck(w, f->rank, what, d);
    case WALK_UNRECEIVED:
        return diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d sends %s%s%s(tag %d, %lld bytes) to rank %d, which never receives it",
                          what, m->src, m->step, m->value ? "'" : "", m->value ? m->value->name : "",
                          m->value ? "' " : "", m->tag, (long long)m->bytes, m->dst);
    case WALK_OK:
    case WALK_NOMEM:
    case WALK_ABORTED: break;
    }
    return diag_error(d, DIAG_NOMEM, "out of memory checking communication");
}

static bool check(Walk *w, const char *what, Diag *d) {
    WalkFault f;
    return walk_run(w, NULL, NULL, &f) || report(w, &f, what, d);
}

bool comm_check(int n_ranks, const PlanStep *const *seq, const int *n_steps, const PlanGroup *groups, int n_groups,
                const char *what, Diag *d) {
    Walk w;
    bool ok = walk_init(&w, n_ranks, seq, n_steps, groups, n_groups) ||
              diag_error(d, DIAG_NOMEM, "out of memory checking communication");
    ok = ok && check(&w, what ? what : "plan", d);
    walk_free(&w);
    return ok;
}

bool comm_check_plan(const Plan *p, Diag *d) {
    const char *kind = p->n_stages > 0 ? "pipeline plan" : "plan";
    char what[128];
    bool ok = true;
    for (int pass = 0; pass < 2 && ok; pass++) {
        Walk w;
        ok = walk_init_plan(&w, p, pass == 1) || diag_error(d, DIAG_NOMEM, "out of memory checking communication");
        snprintf(what, sizeof what, "%s (%s), %s step", kind, strategy_name(p->strategy),
                 pass == 0 ? "train" : "eval");
        ok = ok && check(&w, what, d);
        walk_free(&w);
    }
    return ok;
}
