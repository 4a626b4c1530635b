/* profile.c - a model's own kernels timed on this machine (profile.h).
 *
 * Rates read off a curve say how fast a kernel of some size is; the
 * kernel cleave generates for a particular node (a transposed product, a
 * convolution's weight gradient over 14x14 planes) can be several times
 * off that curve.  Here every distinct node of the plans the search
 * considers is compiled alone, at its own shapes and attributes, and run:
 * its median time is what the simulator charges for it. */
#include "profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_run.h"
#include "../ir/node_key.h"
#include "../ops/ops.h"
#include "../util/sort.h"

/* At most this many timings of a kernel (the first and profile_refine's). */
#define PROFILE_MAX_TIMINGS 8
/* Memory that kernels kept built for profile_refine may hold in all. */
#define PROFILE_KEEP_BYTES ((size_t)256 << 20)

typedef struct Entry {
    char *key;
    double seconds; /* cold; < 0: could not be measured */
    double warm;    /* run again at once, its data still in cache */
    double memory;  /* its data in no cache */
    KernelRun k;    /* built, while kept for profile_refine */
    bool kept;
    double timing[PROFILE_MAX_TIMINGS], warm_timing[PROFILE_MAX_TIMINGS], memory_timing[PROFILE_MAX_TIMINGS];
    int n_timing;
} Entry;

struct KernelProfile {
    Entry *e;
    int n, cap;
    int measured, failed;
    size_t kept_bytes; /* arenas of the kernels kept built */
    const Graph *g;    /* whose opsets node graphs take (profile_bind) */
};

void profile_bind(KernelProfile *p, const Graph *g) {
    if (p) p->g = g;
}

KernelProfile *profile_new(void) { return calloc(1, sizeof(KernelProfile)); }

void profile_free(KernelProfile *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        free(p->e[i].key);
        if (p->e[i].kept) kernel_run_free(&p->e[i].k);
    }
    free(p->e);
    free(p);
}

void profile_counts(const KernelProfile *p, int *measured, int *failed) {
    *measured = p ? p->measured : 0;
    *failed = p ? p->failed : 0;
}

/* n alone in a graph of its own: its inputs fed at run time, except
 * integer constants (shapes, axes), which shape inference needs. */
static Graph *node_graph(const Graph *src, const Node *n) {
    Graph *g = graph_new("profile");
    if (!g) return NULL;
    g->opsets = ARENA_ARRAY(&g->arena, Opset, src->n_opsets ? src->n_opsets : 1);
    g->inputs = ARENA_ARRAY(&g->arena, Value *, n->n_in ? n->n_in : 1);
    g->outputs = ARENA_ARRAY(&g->arena, Value *, n->n_out ? n->n_out : 1);
    Node *m = graph_add_node(g, n->name, n->op_type, n->domain, n->n_in, n->n_out);
    if (!g->opsets || !g->inputs || !g->outputs || !m) goto fail;
    for (int i = 0; i < src->n_opsets; i++) g->opsets[i] = src->opsets[i];
    g->n_opsets = src->n_opsets;
    m->def = n->def;
    /* the attributes' contents stay in src's arena, which outlives g; the
     * array is copied so that a batch statistic summed over replicas
     * (OpDef.replica_sums, "replicas") runs alone as one replica's, the
     * same kernel, in a plan of one */
    m->attrs = ARENA_ARRAY(&g->arena, Attr, n->n_attr ? n->n_attr : 1);
    if (!m->attrs) goto fail;
    m->n_attr = n->n_attr;
    for (int i = 0; i < n->n_attr; i++) {
        m->attrs[i] = n->attrs[i];
        if (n->def && n->def->replica_sums && strcmp(n->attrs[i].name, "replicas") == 0) m->attrs[i].i = 1;
    }
    for (int i = 0; i < n->n_in; i++) {
        const Value *v = n->in[i];
        if (!v) continue;
        int same = 0; /* x * x reads one value twice: one input */
        while (same < i && n->in[same] != v) same++;
        if (same < i) {
            m->in[i] = m->in[same];
            continue;
        }
        Value *w = graph_add_value(g, v->name);
        if (!w) goto fail;
        w->dtype = v->dtype;
        w->file_dtype = v->file_dtype;
        w->rank = v->rank;
        for (int k = 0; k < v->rank; k++) w->dims[k] = v->dims[k];
        if (v->konst && !dtype_is_float(v->dtype)) {
            w->kind = VAL_CONSTANT;
            w->konst = v->konst;
        } else {
            w->kind = VAL_INPUT;
            g->inputs[g->n_inputs++] = w;
        }
        m->in[i] = w;
    }
    for (int k = 0; k < n->n_out; k++) {
        if (!n->out[k]) continue;
        Value *y = graph_add_value(g, n->out[k]->name);
        if (!y) goto fail;
        y->producer = m;
        y->producer_slot = k;
        y->is_output = true;
        m->out[k] = y;
        g->outputs[g->n_outputs++] = y;
    }
    return g;
fail:
    graph_free(g);
    return NULL;
}

/* An Add of two values shaped like v: what adding a micro-batch's
 * gradient into its accumulator costs (the generated accumulation is the
 * same loop over the same bytes). */
static Graph *add_graph(const Value *v) {
    Graph *g = graph_new("profile");
    if (!g) return NULL;
    g->opsets = ARENA_NEW(&g->arena, Opset);
    g->inputs = ARENA_ARRAY(&g->arena, Value *, 2);
    g->outputs = ARENA_ARRAY(&g->arena, Value *, 1);
    Node *m = graph_add_node(g, "accumulate", "Add", "", 2, 1);
    Value *a = graph_add_value(g, "acc"), *b = graph_add_value(g, "grad"), *y = graph_add_value(g, "sum");
    if (!g->opsets || !g->inputs || !g->outputs || !m || !a || !b || !y) {
        graph_free(g);
        return NULL;
    }
    g->opsets[0] = (Opset){"", 13};
    g->n_opsets = 1;
    m->def = op_lookup("", "Add");
    Value *in[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        in[i]->kind = VAL_INPUT;
        in[i]->dtype = in[i]->file_dtype = v->dtype;
        in[i]->rank = v->rank;
        for (int k = 0; k < v->rank; k++) in[i]->dims[k] = v->dims[k];
        g->inputs[g->n_inputs++] = in[i];
        m->in[i] = in[i];
    }
    y->producer = m;
    y->is_output = true;
    m->out[0] = y;
    g->outputs[g->n_outputs++] = y;
    return g;
}

/* One more cold, memory and warm timing of e's kernel.  Warm: as many
 * calls back to back as fill PROFILE_WARM_S, the first not counted. */
#define PROFILE_WARM_S 1e-3
static void time_entry(Entry *e) {
    e->timing[e->n_timing] = kernel_run_time_cold(&e->k, 8, 1, false);
    e->memory_timing[e->n_timing] = kernel_run_time_cold(&e->k, 8, 1, true);
    e->warm_timing[e->n_timing++] = kernel_run_time(&e->k, PROFILE_WARM_S, 1);
}

size_t profile_cache_bytes(void) { return kernel_run_cache_bytes(); }
size_t profile_llc_bytes(void) { return kernel_run_llc_bytes(); }

static double seconds_of(const Entry *e, ProfileCache where) {
    if (e->seconds < 0) return e->seconds;
    return where == PROFILE_WARM ? e->warm : where == PROFILE_MEMORY ? e->memory : e->seconds;
}

/* The remembered time of `key`, or the one timing g (taken over) gives. */
static double lookup_or_time(KernelProfile *p, const char *key, Graph *(*make)(const void *), const void *arg,
                             ProfileCache where) {
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->e[i].key, key) == 0) return seconds_of(&p->e[i], where);
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        Entry *e = realloc(p->e, sizeof *e * (size_t)cap);
        if (!e) return -1;
        p->e = e;
        p->cap = cap;
    }
    char *copy = strdup(key);
    if (!copy) return -1;
    Entry *e = &p->e[p->n++];
    *e = (Entry){.key = copy, .seconds = -1};
    Diag d = {0};
    /* Timed on cold caches: inside a step, the kernels before this one
     * have evicted its weights and inputs (timed warm, in a loop, the
     * MLP's kernels ran about a third faster than in its steps). */
    if (kernel_run_build(make(arg), &e->k, &d)) {
        time_entry(e);
        e->seconds = e->timing[0];
        e->warm = e->warm_timing[0];
        e->memory = e->memory_timing[0];
        e->kept = p->kept_bytes + e->k.arena_bytes <= PROFILE_KEEP_BYTES;
        if (e->kept) p->kept_bytes += e->k.arena_bytes;
    }
    if (!e->kept) kernel_run_free(&e->k);
    if (e->seconds >= 0) p->measured++;
    else p->failed++;
    return seconds_of(e, where);
}

/* The lower middle of x[0 .. n): of two timings, the one a burst did
 * not slow. */
static double median(const double *x, int n) {
    double t[PROFILE_MAX_TIMINGS];
    memcpy(t, x, sizeof *t * (size_t)n);
    sort_doubles(t, (size_t)n);
    return t[(n - 1) / 2];
}

void profile_refine(KernelProfile *p, int passes) {
    if (!p) return;
    for (int pass = 0; pass < passes; pass++)
        for (int i = 0; i < p->n; i++) {
            Entry *e = &p->e[i];
            if (e->kept && e->n_timing < PROFILE_MAX_TIMINGS) time_entry(e);
        }
    for (int i = 0; i < p->n; i++) {
        Entry *e = &p->e[i];
        if (!e->kept) continue;
        e->seconds = median(e->timing, e->n_timing);
        e->warm = median(e->warm_timing, e->n_timing);
        e->memory = median(e->memory_timing, e->n_timing);
        kernel_run_free(&e->k);
        e->kept = false;
    }
    p->kept_bytes = 0;
}

static Graph *make_add(const void *v) { return add_graph(v); }

double profile_accumulate_seconds(KernelProfile *p, const Value *v, ProfileCache where) {
    if (!p || !v) return -1;
    Text key = {0};
    text_put(&key, "accumulate|");
    value_key(&key, v);
    double s = key.failed ? -1 : lookup_or_time(p, key.s, make_add, v, where);
    free(key.s);
    return s;
}

typedef struct NodeArg {
    const Graph *g;
    const Node *n;
} NodeArg;

static Graph *make_node(const void *arg) {
    const NodeArg *a = arg;
    return node_graph(a->g, a->n);
}

double profile_node_seconds(KernelProfile *p, const Node *n, ProfileCache where) {
    if (!p || !p->g || !n->def || !n->def->cg) return -1;
    Text key = {0};
    node_key(&key, n);
    NodeArg arg = {p->g, n};
    double s = key.failed ? -1 : lookup_or_time(p, key.s, make_node, &arg, where);
    free(key.s);
    return s;
}
