/* comm_check.c - proving at compile time that the ranks' communication
 * matches up: the ranks' step sequences are run against each other with
 * buffered sends, blocking receives and blocking collectives, and the
 * first step that could never complete, or that completes against the
 * wrong message, is reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

typedef struct Msg {
    int src, tag, step;
    int64_t bytes;
    const Value *value;
} Msg;

/* Messages sent to one rank and not yet received, in sending order. */
typedef struct Box {
    Msg *m;
    int n, cap;
} Box;

typedef struct Sim {
    int n_ranks;
    const PlanStep *const *seq;
    const int *len;
    const PlanGroup *groups;
    int n_groups;
    const char *what;
    int *pc;
    Box *box;
    Diag *d;
    /* Thousands of replicas meet in one collective, so the work per rank
     * must not grow with the group: each rank's membership of a group is
     * checked once (checked[r], the group it was found in), and a group's
     * members are scanned from where the last look stopped (scan[g], the
     * first member not yet there; scan_all for every rank). */
    int *checked, *scan, scan_all;
} Sim;

static bool is_collective(const PlanStep *s) { return s->kind == STEP_ALLREDUCE || s->kind == STEP_ALLREDUCE_START; }

static const PlanStep *at(const Sim *S, int r) { return S->pc[r] < S->len[r] ? &S->seq[r][S->pc[r]] : NULL; }

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

/* Members of a collective step's group (ranks NULL: all); false with a
 * Diag when the group is invalid or r is not in it. */
static bool group_of(Sim *S, int r, const PlanStep *s, int *n, const int **ranks) {
    if (s->kind == STEP_ALLREDUCE_START && s->group < 0) {
        *n = S->n_ranks;
        *ranks = NULL; /* every rank */
        return true;
    }
    if (s->group < 0 || s->group >= S->n_groups)
        return diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d allreduces over group %d, but there are %d groups",
                          S->what, r, S->pc[r], s->group, S->n_groups);
    const PlanGroup *g = &S->groups[s->group];
    if (S->checked[r] == s->group) {
        *n = g->n;
        *ranks = g->ranks;
        return true;
    }
    bool member = false;
    for (int i = 0; i < g->n; i++) {
        if (g->ranks[i] < 0 || g->ranks[i] >= S->n_ranks)
            return diag_error(S->d, DIAG_INTERNAL, "%s: group %d names rank %d, but there are %d ranks", S->what,
                              s->group, g->ranks[i], S->n_ranks);
        member |= g->ranks[i] == r;
    }
    if (!member)
        return diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d allreduces over group %d, which it is not a member of",
                          S->what, r, S->pc[r], s->group);
    S->checked[r] = s->group;
    *n = g->n;
    *ranks = g->ranks;
    return true;
}

static int member(const int *ranks, int i) { return ranks ? ranks[i] : i; }

/* Does rank m stand at a collective over the same group as s? */
static bool same_collective(const Sim *S, int m, const PlanStep *s) {
    const PlanStep *o = at(S, m);
    if (!o || o->kind != s->kind) return false;
    return o->group == s->group;
}

static bool push(Sim *S, int r, const PlanStep *s) {
    if (s->peer < 0 || s->peer >= S->n_ranks || s->peer == r) {
        char b[400];
        return diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d: %s: %s", S->what, r, S->pc[r],
                          describe(s, b, sizeof b), s->peer == r ? "a rank cannot send to itself" : "no such rank");
    }
    Box *bx = &S->box[s->peer];
    for (int i = 0; i < bx->n; i++)
        if (bx->m[i].src == r && bx->m[i].tag == s->tag)
            return diag_error(S->d, DIAG_INTERNAL,
                              "%s: rank %d step %d sends tag %d to rank %d while its message with that tag from step %d is still unreceived (tags must be unique per micro-batch, tensor and direction)",
                              S->what, r, S->pc[r], s->tag, s->peer, bx->m[i].step);
    if (bx->n == bx->cap) {
        int cap = bx->cap ? 2 * bx->cap : 16;
        Msg *m = realloc(bx->m, sizeof *m * (size_t)cap);
        if (!m) return diag_error(S->d, DIAG_NOMEM, "out of memory checking communication");
        bx->m = m;
        bx->cap = cap;
    }
    bx->m[bx->n++] = (Msg){r, s->tag, S->pc[r], s->bytes, s->value};
    return true;
}

/* 1: received, 0: blocked, -1: error. */
static int take(Sim *S, int r, const PlanStep *s) {
    if (s->peer < 0 || s->peer >= S->n_ranks || s->peer == r) {
        char b[400];
        diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d: %s: %s", S->what, r, S->pc[r], describe(s, b, sizeof b),
                   s->peer == r ? "a rank cannot receive from itself" : "no such rank");
        return -1;
    }
    Box *bx = &S->box[r];
    for (int i = 0; i < bx->n; i++) {
        Msg *m = &bx->m[i];
        if (m->src != s->peer || m->tag != s->tag) continue;
        if (m->bytes != s->bytes) {
            diag_error(S->d, DIAG_INTERNAL,
                       "%s: size mismatch: rank %d step %d receives %lld bytes from rank %d (tag %d%s%s%s) but rank %d step %d sends %lld bytes%s%s%s",
                       S->what, r, S->pc[r], (long long)s->bytes, s->peer, s->tag, vname(s) ? ", '" : "",
                       vname(s) ? vname(s) : "", vname(s) ? "'" : "", m->src, m->step, (long long)m->bytes,
                       m->value ? " of '" : "", m->value ? m->value->name : "", m->value ? "'" : "");
            return -1;
        }
        memmove(m, m + 1, sizeof *m * (size_t)(bx->n - i - 1));
        bx->n--;
        return 1;
    }
    return 0;
}

/* Has rank r's message with s's tag reached s->peer's receive? */
static bool send_taken(const Sim *S, int r, const PlanStep *s) {
    if (s->peer < 0 || s->peer >= S->n_ranks) return true; /* push reported it */
    const Box *bx = &S->box[s->peer];
    for (int i = 0; i < bx->n; i++)
        if (bx->m[i].src == r && bx->m[i].tag == s->tag) return false;
    return true;
}

/* 1: every member joined and all advanced, 0: blocked, -1: error. */
static int collective(Sim *S, int r, const PlanStep *s) {
    int n;
    const int *ranks;
    if (!group_of(S, r, s, &n, &ranks)) return -1;
    /* members before *scan stand at this collective already: a member
     * that has arrived stays until the collective completes */
    int *scan = ranks ? &S->scan[s->group] : &S->scan_all;
    for (; *scan < n; (*scan)++)
        if (!same_collective(S, member(ranks, *scan), s)) return 0;
    *scan = 0;
    for (int i = 0; i < n; i++) {
        int m = member(ranks, i);
        const PlanStep *o = at(S, m);
        bool differ = s->kind == STEP_ALLREDUCE_START ? o->bucket != s->bucket : o->bytes != s->bytes;
        if (differ) {
            char a[400], b[400];
            diag_error(S->d, DIAG_INTERNAL, "%s: collective mismatch: rank %d step %d does %s but rank %d step %d does %s",
                       S->what, r, S->pc[r], describe(s, a, sizeof a), m, S->pc[m], describe(o, b, sizeof b));
            return -1;
        }
    }
    for (int i = 0; i < n; i++) S->pc[member(ranks, i)]++;
    return 1;
}

/* No rank can move: follow who waits for whom from the first stuck rank
 * to a rank that finished (a message or member that never comes) or
 * around a cycle (a deadlock). */
static bool report_stuck(Sim *S) {
    int n = S->n_ranks, r0 = 0;
    while (r0 < n && !at(S, r0)) r0++;
    int *seen = malloc(sizeof *seen * (size_t)n), *path = malloc(sizeof *path * (size_t)(n + 1));
    if (!seen || !path) {
        free(seen);
        free(path);
        return diag_error(S->d, DIAG_NOMEM, "out of memory checking communication");
    }
    for (int i = 0; i < n; i++) seen[i] = -1;
    int len = 0, cur = r0;
    char a[400], b[400];
    /* a receive whose message went to another rank, and that its sender
     * will not send again */
    for (int r = 0; r < n; r++) {
        const PlanStep *s = at(S, r);
        if (!s || s->kind != STEP_RECV || s->peer < 0 || s->peer >= n) continue;
        bool later = false;
        for (int i = S->pc[s->peer]; i < S->len[s->peer] && !later; i++) {
            const PlanStep *o = &S->seq[s->peer][i];
            later = o->kind == STEP_SEND && o->peer == r && o->tag == s->tag;
        }
        if (later) continue;
        for (int q = 0; q < n; q++)
            for (int i = 0; q != r && i < S->box[q].n; i++) {
                const Msg *m = &S->box[q].m[i];
                if (m->src != s->peer || m->tag != s->tag) continue;
                diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d step %d sent tag %d to rank %d instead",
                           S->what, r, S->pc[r], describe(s, a, sizeof a), m->src, m->step, m->tag, q);
                free(seen);
                free(path);
                return false;
            }
    }
    for (;;) {
        seen[cur] = len;
        path[len++] = cur;
        const PlanStep *s = at(S, cur);
        int next = -1;
        if (s->kind == STEP_RECV) {
            next = s->peer;
        } else if (s->kind == STEP_SEND_WAIT) {
            next = s->peer;
        } else {
            int gn;
            const int *ranks;
            if (!group_of(S, cur, s, &gn, &ranks)) break;
            for (int i = 0; i < gn && next < 0; i++)
                if (!same_collective(S, member(ranks, i), s)) next = member(ranks, i);
        }
        if (next < 0) {
            diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d (%s) is stuck", S->what, cur, S->pc[cur],
                       describe(s, a, sizeof a));
            break;
        }
        if (!at(S, next)) {
            if (s->kind == STEP_RECV) {
                /* a message from that rank under another tag? */
                char hint[300] = "";
                for (int i = 0; i < S->box[cur].n && !hint[0]; i++) {
                    const Msg *m = &S->box[cur].m[i];
                    if (m->src == next)
                        snprintf(hint, sizeof hint, "; its unreceived message to rank %d from step %d has tag %d", cur,
                                 m->step, m->tag);
                }
                diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d finished without sending it%s",
                           S->what, cur, S->pc[cur], describe(s, a, sizeof a), next, hint);
            } else if (s->kind == STEP_SEND_WAIT) {
                diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d finished without receiving its message",
                           S->what, cur, S->pc[cur], describe(s, a, sizeof a), next);
            } else {
                diag_error(S->d, DIAG_INTERNAL, "%s: rank %d step %d (%s) never completes: rank %d finished without joining it",
                           S->what, cur, S->pc[cur], describe(s, a, sizeof a), next);
            }
            break;
        }
        if (seen[next] >= 0) {
            char line[900];
            size_t o = 0;
            line[0] = '\0';
            for (int i = seen[next]; i < len && o < sizeof line - 1; i++) {
                int q = path[i];
                int w = snprintf(line + o, sizeof line - o, "rank %d step %d (%s) waits for ", q, S->pc[q],
                                 describe(at(S, q), b, sizeof b));
                if (w < 0) break;
                o += (size_t)w < sizeof line - o ? (size_t)w : sizeof line - o - 1;
            }
            /* a message under another tag is the usual cause */
            char hint[200] = "";
            for (int i = seen[next]; i < len && !hint[0]; i++) {
                int q = path[i];
                const PlanStep *w = at(S, q);
                for (int j = 0; w->kind == STEP_RECV && j < S->box[q].n && !hint[0]; j++)
                    if (S->box[q].m[j].src == w->peer)
                        snprintf(hint, sizeof hint, " (rank %d has an unreceived message from rank %d with tag %d, sent at step %d)",
                                 q, w->peer, S->box[q].m[j].tag, S->box[q].m[j].step);
            }
            diag_error(S->d, DIAG_INTERNAL, "%s: deadlock: %srank %d%s", S->what, line, next, hint);
            break;
        }
        cur = next;
    }
    free(seen);
    free(path);
    return false;
}

bool comm_check(int n_ranks, const PlanStep *const *seq, const int *n_steps, const PlanGroup *groups, int n_groups,
                const char *what, Diag *d) {
    Sim S = {n_ranks, seq, n_steps, groups, n_groups, what ? what : "plan", NULL, NULL, d};
    S.pc = calloc((size_t)n_ranks + 1, sizeof *S.pc);
    S.box = calloc((size_t)n_ranks + 1, sizeof *S.box);
    S.checked = malloc(sizeof *S.checked * ((size_t)n_ranks + 1));
    S.scan = calloc((size_t)n_groups + 1, sizeof *S.scan);
    bool ok = S.pc && S.box && S.checked && S.scan;
    for (int r = 0; ok && r < n_ranks; r++) S.checked[r] = -1;
    if (!ok) diag_error(d, DIAG_NOMEM, "out of memory checking communication");
    for (bool moved = true; ok && moved;) {
        moved = false;
        for (int r = 0; r < n_ranks && ok; r++) {
            const PlanStep *s;
            while (ok && (s = at(&S, r)) != NULL) {
                int res = 1;
                if (s->kind == STEP_SEND) res = push(&S, r, s) ? 1 : -1;
                else if (s->kind == STEP_RECV) res = take(&S, r, s);
                else if (s->kind == STEP_SEND_WAIT) res = send_taken(&S, r, s);
                else if (is_collective(s)) res = collective(&S, r, s);
                if (res < 0) ok = false;
                if (res <= 0) break;
                if (!is_collective(s)) S.pc[r]++;
                moved = true;
            }
        }
    }
    if (ok) {
        for (int r = 0; r < n_ranks && ok; r++)
            if (at(&S, r)) ok = report_stuck(&S);
    }
    /* every rank finished: every message must have been received; the
     * lowest sending rank's earliest leftover message is reported */
    const Msg *first = NULL;
    int to = -1;
    for (int q = 0; q < n_ranks && ok; q++)
        for (int i = 0; i < S.box[q].n; i++) {
            const Msg *m = &S.box[q].m[i];
            if (!first || m->src < first->src || (m->src == first->src && m->step < first->step)) {
                first = m;
                to = q;
            }
        }
    if (ok && first) {
        ok = diag_error(d, DIAG_INTERNAL, "%s: rank %d step %d sends %s%s%s(tag %d, %lld bytes) to rank %d, which never receives it",
                        S.what, first->src, first->step, first->value ? "'" : "", first->value ? first->value->name : "",
                        first->value ? "' " : "", first->tag, (long long)first->bytes, to);
    }
    if (S.box)
        for (int r = 0; r < n_ranks; r++) free(S.box[r].m);
    free(S.box);
    free(S.pc);
    free(S.checked);
    free(S.scan);
    return ok;
}

bool comm_check_plan(const Plan *p, Diag *d) {
    int n = p->n_ranks;
    const PlanStep **seq = malloc(sizeof *seq * (size_t)(n + 1));
    int *len = malloc(sizeof *len * (size_t)(n + 1));
    bool ok = seq && len;
    if (!ok) diag_error(d, DIAG_NOMEM, "out of memory checking communication");
    const char *kind = p->n_stages > 0 ? "pipeline plan" : "plan";
    char what[128];
    for (int pass = 0; pass < 2 && ok; pass++) {
        for (int r = 0; r < n; r++) {
            seq[r] = pass == 0 ? p->ranks[r].train : p->ranks[r].eval;
            len[r] = pass == 0 ? p->ranks[r].n_train : p->ranks[r].n_eval;
        }
        snprintf(what, sizeof what, "%s (%s), %s step", kind, p->strategy ? p->strategy : "?",
                 pass == 0 ? "train" : "eval");
        ok = comm_check(n, seq, len, p->groups, p->n_groups, what, d);
    }
    free(seq);
    free(len);
    return ok;
}
