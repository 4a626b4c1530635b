/* walk.c - the ranks' step sequences run against each other (walk.h). */
#include "walk.h"

#include <stdlib.h>
#include <string.h>

static bool is_collective(const PlanStep *s) { return s->kind == STEP_ALLREDUCE || s->kind == STEP_ALLREDUCE_START; }

const PlanStep *walk_at(const Walk *w, int r) { return w->pc[r] < w->len[r] ? &w->seq[r][w->pc[r]] : NULL; }

/* The groups of each rank (Walk.first, .member) and each group's first
 * member out of range (Walk.bad), counted and then placed. */
static bool list_members(Walk *w) {
    size_t total = 0;
    for (int g = 0; g < w->n_groups; g++) total += (size_t)w->groups[g].n;
    w->first = calloc((size_t)w->n_ranks + 2, sizeof *w->first);
    w->member = malloc(sizeof *w->member * (total + 1));
    w->bad = malloc(sizeof *w->bad * ((size_t)w->n_groups + 1));
    if (!w->first || !w->member || !w->bad) return false;
    for (int g = 0; g < w->n_groups; g++) {
        w->bad[g] = -1;
        for (int i = 0; i < w->groups[g].n; i++) {
            int m = w->groups[g].ranks[i];
            if (m < 0 || m >= w->n_ranks) {
                if (w->bad[g] < 0) w->bad[g] = m;
            } else {
                w->first[m + 2]++;
            }
        }
    }
    /* first[r + 2] counts, then first[r + 1] is where r's list starts
     * and, once filled, first[r] where it starts and first[r + 1] ends. */
    for (int r = 0; r < w->n_ranks; r++) w->first[r + 2] += w->first[r + 1];
    for (int g = 0; g < w->n_groups; g++)
        for (int i = 0; i < w->groups[g].n; i++) {
            int m = w->groups[g].ranks[i];
            if (m >= 0 && m < w->n_ranks) w->member[w->first[m + 1]++] = g;
        }
    return true;
}

static bool is_member(const Walk *w, int r, int g) {
    for (int i = w->first[r]; i < w->first[r + 1]; i++)
        if (w->member[i] == g) return true;
    return false;
}

bool walk_init(Walk *w, int n_ranks, const PlanStep *const *seq, const int *n_steps, const PlanGroup *groups,
               int n_groups) {
    size_t n = (size_t)n_ranks + 1;
    *w = (Walk){.n_ranks = n_ranks, .groups = groups, .n_groups = n_groups};
    w->seq = malloc(sizeof *w->seq * n);
    w->len = malloc(sizeof *w->len * n);
    w->pc = calloc(n, sizeof *w->pc);
    w->box = calloc(n, sizeof *w->box);
    w->scan = calloc((size_t)n_groups + 1, sizeof *w->scan);
    w->all = malloc(sizeof *w->all * n);
    if (!w->seq || !w->len || !w->pc || !w->box || !w->scan || !w->all) return false;
    for (int r = 0; r < n_ranks; r++) {
        w->seq[r] = seq[r];
        w->len[r] = n_steps[r];
        w->all[r] = r;
    }
    return list_members(w);
}

bool walk_init_plan(Walk *w, const Plan *p, bool eval) {
    int n = p->n_ranks;
    const PlanStep **seq = malloc(sizeof *seq * ((size_t)n + 1));
    int *len = malloc(sizeof *len * ((size_t)n + 1));
    for (int r = 0; seq && len && r < n; r++) {
        seq[r] = eval ? p->ranks[r].eval : p->ranks[r].train;
        len[r] = eval ? p->ranks[r].n_eval : p->ranks[r].n_train;
    }
    bool ok = seq && len && walk_init(w, n, seq, len, p->groups, p->n_groups);
    if (!seq || !len) *w = (Walk){0};
    free(seq);
    free(len);
    return ok;
}

void walk_free(Walk *w) {
    if (w->box)
        for (int r = 0; r < w->n_ranks; r++) free(w->box[r].m);
    free(w->seq);
    free(w->len);
    free(w->pc);
    free(w->box);
    free(w->first);
    free(w->member);
    free(w->bad);
    free(w->scan);
    free(w->all);
    *w = (Walk){0};
}

/* Records a fault at rank r's current step; returns -1 for the caller. */
static int fault(const Walk *w, WalkFault *f, WalkFaultKind k, int r, int other, const WalkMsg *m) {
    *f = (WalkFault){k, r, w->pc[r], walk_at(w, r), other, -1, NULL, m};
    if (other >= 0 && other < w->n_ranks) {
        f->other_step = w->pc[other];
        f->other_s = walk_at(w, other);
    }
    return -1;
}

/* Members of rank r's collective s: members[0 .. *n); -1 with a fault
 * when the group is invalid or r is not in it. */
static int group_of(Walk *w, int r, const PlanStep *s, int *n, const int **members, WalkFault *f) {
    if (s->kind == STEP_ALLREDUCE_START && s->group < 0) {
        *n = w->n_ranks;
        *members = w->all;
        return 0;
    }
    if (s->group < 0 || s->group >= w->n_groups) return fault(w, f, WALK_NO_GROUP, r, -1, NULL);
    const PlanGroup *g = &w->groups[s->group];
    *n = g->n;
    *members = g->ranks;
    if (w->bad[s->group] != -1) return fault(w, f, WALK_BAD_MEMBER, r, w->bad[s->group], NULL);
    if (!is_member(w, r, s->group)) return fault(w, f, WALK_NOT_MEMBER, r, -1, NULL);
    return 0;
}

/* Does rank m stand at a collective of s's kind over s's group? */
static bool same_collective(const Walk *w, int m, const PlanStep *s) {
    const PlanStep *o = walk_at(w, m);
    return o && o->kind == s->kind && o->group == s->group;
}

static bool bad_peer(const Walk *w, int r, const PlanStep *s) {
    return s->peer < 0 || s->peer >= w->n_ranks || s->peer == r;
}

/* The last message from src with `tag` in box b, or NULL; unreceived only
 * when `unreceived`, then the first. */
static WalkMsg *find(WalkBox *b, int src, int tag, bool unreceived) {
    WalkMsg *last = NULL;
    for (int i = 0; i < b->n; i++) {
        WalkMsg *m = &b->m[i];
        if (m->src != src || m->tag != tag) continue;
        if (!unreceived) last = m;
        else if (!m->received) return m;
    }
    return last;
}

/* 1: posted, -1: fault. */
static int post(Walk *w, int r, const PlanStep *s, WalkMsg **out, WalkFault *f) {
    if (bad_peer(w, r, s)) return fault(w, f, WALK_NO_PEER, r, -1, NULL);
    WalkBox *b = &w->box[s->peer];
    const WalkMsg *dup = find(b, r, s->tag, true);
    if (dup) return fault(w, f, WALK_TAG_IN_FLIGHT, r, s->peer, dup);
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 16;
        WalkMsg *m = realloc(b->m, sizeof *m * (size_t)cap);
        if (!m) return fault(w, f, WALK_NOMEM, r, -1, NULL);
        b->m = m;
        b->cap = cap;
    }
    *out = &b->m[b->n++];
    **out = (WalkMsg){r, s->peer, s->tag, w->pc[r], s->bytes, s->value, false, {0, 0}};
    return 1;
}

/* 1: received, 0: blocked, -1: fault. */
static int take(Walk *w, int r, const PlanStep *s, WalkMsg **out, WalkFault *f) {
    if (bad_peer(w, r, s)) return fault(w, f, WALK_NO_PEER, r, -1, NULL);
    WalkMsg *m = find(&w->box[r], s->peer, s->tag, true);
    if (!m) return 0;
    if (m->bytes != s->bytes) return fault(w, f, WALK_SIZE_MISMATCH, r, s->peer, m);
    m->received = true;
    *out = m;
    return 1;
}

/* 1: the send is complete, 0: blocked.  A peer out of range is the send's
 * fault, reported when it was posted. */
static int send_done(Walk *w, int r, const PlanStep *s, WalkMsg **out) {
    if (s->peer < 0 || s->peer >= w->n_ranks) return 1;
    WalkMsg *m = find(&w->box[s->peer], r, s->tag, false);
    if (m && !m->received) return 0;
    *out = m;
    return 1;
}

/* 1: every member stood at it and all advanced, 0: blocked, -1: fault. */
static int collective(Walk *w, int r, const PlanStep *s, const WalkHooks *h, void *ctx, WalkFault *f) {
    int n;
    const int *members;
    if (group_of(w, r, s, &n, &members, f) < 0) return -1;
    /* members before *scan stand at this collective already: a member
     * that has arrived stays until the collective completes */
    int *scan = s->group >= 0 ? &w->scan[s->group] : &w->scan_all;
    for (; *scan < n; (*scan)++)
        if (!same_collective(w, members[*scan], s)) return 0;
    *scan = 0;
    for (int i = 0; i < n; i++) {
        const PlanStep *o = walk_at(w, members[i]);
        bool differ = o->kind != s->kind ||
                      (s->kind == STEP_ALLREDUCE_START ? o->bucket != s->bucket : o->bytes != s->bytes);
        if (differ) return fault(w, f, WALK_COLLECTIVE_MISMATCH, r, members[i], NULL);
    }
    if (h && h->collective && !h->collective(ctx, s, members, n)) return fault(w, f, WALK_ABORTED, r, -1, NULL);
    for (int i = 0; i < n; i++) w->pc[members[i]]++;
    return 1;
}

/* Rank r's next step s: 1 done, 0 blocked, -1 fault. */
static int advance(Walk *w, int r, const PlanStep *s, const WalkHooks *h, void *ctx, WalkFault *f) {
    if (is_collective(s)) return collective(w, r, s, h, ctx, f);
    WalkMsg *m = NULL;
    int res = 1;
    if (s->kind == STEP_SEND) res = post(w, r, s, &m, f);
    else if (s->kind == STEP_RECV) res = take(w, r, s, &m, f);
    else if (s->kind == STEP_SEND_WAIT) res = send_done(w, r, s, &m);
    if (res <= 0) return res;
    if (h && h->step && !h->step(ctx, r, s, m)) return fault(w, f, WALK_ABORTED, r, -1, NULL);
    w->pc[r]++;
    return 1;
}

/* After the walk: the lowest sending rank's earliest unreceived message. */
static const WalkMsg *unreceived(const Walk *w) {
    const WalkMsg *first = NULL;
    for (int q = 0; q < w->n_ranks; q++)
        for (int i = 0; i < w->box[q].n; i++) {
            const WalkMsg *m = &w->box[q].m[i];
            if (m->received) continue;
            if (!first || m->src < first->src || (m->src == first->src && m->step < first->step)) first = m;
        }
    return first;
}

bool walk_run(Walk *w, const WalkHooks *h, void *ctx, WalkFault *f) {
    *f = (WalkFault){.kind = WALK_OK, .rank = -1, .step = -1, .other = -1, .other_step = -1};
    for (int r = 0; r < w->n_ranks; r++) {
        w->pc[r] = 0;
        w->box[r].n = 0;
    }
    memset(w->scan, 0, sizeof *w->scan * ((size_t)w->n_groups + 1));
    w->scan_all = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < w->n_ranks; r++) {
            const PlanStep *s;
            int res = 0;
            while ((s = walk_at(w, r)) != NULL && (res = advance(w, r, s, h, ctx, f)) > 0) moved = true;
            if (res < 0) return false;
        }
    }
    for (int r = 0; r < w->n_ranks; r++)
        if (walk_at(w, r)) {
            fault(w, f, WALK_STUCK, r, -1, NULL);
            return false;
        }
    const WalkMsg *m = unreceived(w);
    if (m) {
        *f = (WalkFault){WALK_UNRECEIVED, m->src, m->step, &w->seq[m->src][m->step], m->dst, -1, NULL, m};
        return false;
    }
    return true;
}

int walk_waits_for(const Walk *w, int r) {
    const PlanStep *s = walk_at(w, r);
    if (!s) return -1;
    if (s->kind == STEP_RECV || s->kind == STEP_SEND_WAIT) return s->peer;
    if (!is_collective(s)) return -1;
    int n = w->n_ranks;
    const int *members = w->all;
    if (s->group >= 0) {
        if (s->group >= w->n_groups) return -1;
        n = w->groups[s->group].n;
        members = w->groups[s->group].ranks;
    }
    for (int i = 0; i < n; i++)
        if (!same_collective(w, members[i], s)) return members[i];
    return -1;
}

const char *walk_fault_name(WalkFaultKind k) {
    switch (k) {
    case WALK_OK: return "no fault";
    case WALK_NO_PEER: return "a send or receive names no other rank";
    case WALK_TAG_IN_FLIGHT: return "a tag reused while its message is in flight";
    case WALK_SIZE_MISMATCH: return "size mismatch";
    case WALK_NO_GROUP: return "a collective names no group";
    case WALK_BAD_MEMBER: return "a group names no rank";
    case WALK_NOT_MEMBER: return "a collective over a group the rank is not in";
    case WALK_COLLECTIVE_MISMATCH: return "collective mismatch";
    case WALK_STUCK: return "ranks that cannot finish";
    case WALK_UNRECEIVED: return "a message never received";
    case WALK_NOMEM: return "out of memory";
    case WALK_ABORTED: return "stopped";
    }
    return "?";
}
