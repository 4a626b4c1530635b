/* train.c - loss construction, the backward sweep and optimizer updates. */
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad.h"
#include "../cost/node_cost.h"
#include "../ops/ops.h"

const char *loss_kind_name(LossKind k) {
    return k == LOSS_CE ? "ce" : k == LOSS_MSE ? "mse" : "model";
}

static const char *const optimizer_names[] = {"sgd", "momentum", "adam", "adamw"};
static const char *const lr_schedule_names[] = {"constant", "linear", "cosine"};

const char *optimizer_name(OptKind k) { return optimizer_names[k]; }

/* The position of name among n names (the enum's value), or -1. */
static int name_index(const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

bool optimizer_parse(const char *name, OptKind *k) {
    int i = name_index(name, optimizer_names, (int)(sizeof optimizer_names / sizeof *optimizer_names));
    if (i >= 0) *k = (OptKind)i;
    return i >= 0;
}

const char *lr_schedule_name(LrSchedule s) { return lr_schedule_names[s]; }

bool lr_schedule_parse(const char *name, LrSchedule *s) {
    int i = name_index(name, lr_schedule_names, (int)(sizeof lr_schedule_names / sizeof *lr_schedule_names));
    if (i >= 0) *s = (LrSchedule)i;
    return i >= 0;
}

/* The pattern's pieces between stars, each found at or after the end of
 * the previous one: the leftmost place of each is as good as any, since
 * what follows the last piece is free. */
bool train_name_matches(const char *pattern, const char *name) {
    const char *at = name;
    while (*pattern) {
        size_t len = strcspn(pattern, "*");
        if (len) {
            const char *hit = NULL;
            for (const char *q = at; *q && !hit; q++)
                if (strncmp(q, pattern, len) == 0) hit = q;
            if (!hit) return false;
            at = hit + len;
        }
        pattern += len;
        if (*pattern == '*') pattern++;
    }
    return true;
}

static Value *add_input(Graph *g, const char *name, DType t, int rank, const Dim *dims, Diag *d) {
    if (graph_find_value(g, name)) {
        diag_error(d, DIAG_GRAPH, "%s: the model already has a value named '%s'; the loss needs that name for its labels",
                   g->path, name);
        return NULL;
    }
    Value *v = graph_add_value(g, name);
    Value **ins = ARENA_ARRAY(&g->arena, Value *, g->n_inputs + 1);
    if (!v || !ins) {
        diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
        return NULL;
    }
    memcpy(ins, g->inputs, sizeof *ins * (size_t)g->n_inputs);
    ins[g->n_inputs++] = v;
    g->inputs = ins;
    v->kind = VAL_INPUT;
    v->dtype = t;
    value_set_shape(v, rank, dims);
    return v;
}

static Value *add_state_scalar(Graph *g, const char *name, DType t, Diag *d) {
    Value *v = graph_add_value(g, name);
    if (!v || !(v->konst = const_new(g, t, 1))) {
        diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
        return NULL;
    }
    v->kind = VAL_STATE;
    v->dtype = t;
    v->rank = 0;
    return v;
}

Value *train_positions(GradCtx *c) {
    TrainGraph *t = c->train;
    if (t->positions || diag_failed(c->d)) return t->positions;
    /* as many rows as the graph's inputs have: the rows a step computes at once */
    Dim rows = c->g->n_inputs > 0 && c->g->inputs[0]->rank > 0 ? c->g->inputs[0]->dims[0] : dim_const(1);
    return t->positions = add_input(c->g, "cleave.positions", DT_INT64, 1, &rows, c->d);
}

Value *train_seed(GradCtx *c) {
    TrainGraph *t = c->train;
    if (!t->seed && !diag_failed(c->d)) t->seed = add_state_scalar(c->g, "cleave.seed", DT_INT64, c->d);
    return t->seed;
}

static bool build_loss(GradCtx *c, const TrainOptions *o, TrainGraph *t) {
    Graph *g = c->g;
    if (g->n_outputs < 1) return diag_error(c->d, DIAG_GRAPH, "%s: the model has no output", g->path);
    Value *y = t->output = g->outputs[0];
    if (!value_shape_known(y) || y->dtype != DT_FLOAT)
        return diag_error(c->d, DIAG_SHAPE, "%s: output '%s' must be float32 with a known shape to train", g->path,
                          y->name);
    c->phase = PHASE_LOSS;
    switch (o->loss) {
    case LOSS_CE: {
        /* Logits [B, ..., C] against int64 labels [B, ...]: the positions
         * flatten into rows of C classes, as torch's cross_entropy over
         * logits.view(-1, C).  The mean is over the labels that count
         * (not --ignore-index) in the whole global batch, so the loss is a
         * sum divided by the runtime's count of them (label_count): with R
         * shares of the batch (replicas x micro-batches) the slot holds
         * that count / R, and the mean of the shares' losses, which the
         * seed 1/R of the backward pass and the runtime's loss both take,
         * is the global batch's mean however the labels fall. */
        if (y->rank < 2)
            return diag_error(c->d, DIAG_SHAPE, "%s: --loss ce needs logits [B,...,C]; output '%s' has rank %d",
                              g->path, y->name, y->rank);
        t->labels = add_input(g, "labels", DT_INT64, y->rank - 1, y->dims, c->d);
        t->label_count = add_state_scalar(g, "cleave.label_count", DT_FLOAT, c->d);
        if (!t->labels || !t->label_count) return false;
        int64_t classes = y->dims[y->rank - 1].k, rows = value_numel(y) / classes;
        Value *scores = y, *labels = t->labels;
        if (y->rank > 2) {
            int64_t shape[2] = {rows, classes};
            scores = gb_op2(c, "Reshape", y, gb_const_ints(c, shape, 2));
            labels = gb_op2(c, "Reshape", t->labels, gb_const_ints(c, &rows, 1));
        }
        Value *in[2] = {scores, labels};
        Node *n = gb_start(c, "", "SoftmaxCrossEntropyLoss", 2, in, 1);
        gb_attr_s(c, n, "reduction", "sum");
        gb_attr_i(c, n, "ignore_index", o->ignore_index);
        t->loss = gb_op2(c, "Div", gb_finish(c, n), t->label_count);
        break;
    }
    case LOSS_MSE: {
        t->labels = add_input(g, "labels", DT_FLOAT, y->rank, y->dims, c->d);
        if (!t->labels) return false;
        Value *diff = gb_op2(c, "Sub", y, t->labels);
        Value *sq = gb_op2(c, "Mul", diff, diff);
        Value *in[1] = {sq};
        Node *n = gb_start(c, "", "ReduceMean", 1, in, 1);
        gb_attr_i(c, n, "keepdims", 0);
        t->loss = gb_finish(c, n);
        break;
    }
    case LOSS_MODEL:
        if (value_numel(y) != 1)
            return diag_error(c->d, DIAG_SHAPE, "%s: --loss model needs a scalar first output; '%s' has %lld elements",
                              g->path, y->name, (long long)value_numel(y));
        t->loss = y;
        break;
    }
    return t->loss != NULL;
}

static bool frozen(const TrainOptions *o, const char *name) {
    for (int i = 0; i < o->n_freeze; i++)
        if (strcmp(o->freeze[i], name) == 0) return true;
    return false;
}

/* An initializer a node updates in place (batch normalisation's running
 * statistics): state the trained model saves with its parameters. */
static bool is_updated_state(const Graph *g, const Value *v) {
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in && i < 32; i++)
            if (n->in[i] == v && n->def && (n->def->mutates_inputs >> i) & 1) return true;
    }
    return false;
}

static bool collect_params(Graph *g, const TrainOptions *o, TrainGraph *t, bool *requires, Diag *d) {
    for (int i = 0; i < o->n_freeze; i++) {
        Value *v = graph_find_value(g, o->freeze[i]);
        if (!v || v->kind != VAL_INITIALIZER || !dtype_is_float(v->dtype))
            return diag_error(d, DIAG_USAGE, "%s: --freeze: '%s' is not a float initializer of the model", g->path,
                              o->freeze[i]);
    }
    t->params = ARENA_ARRAY(&g->arena, Value *, g->n_values);
    t->grads = ARENA_ARRAY(&g->arena, Value *, g->n_values);
    if (!t->params || !t->grads) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    for (int i = 0; i < g->n_values; i++) {
        Value *v = g->values[i];
        if (v->kind != VAL_INITIALIZER || !dtype_is_float(v->dtype)) continue;
        bool weight = value_is_trainable(g, v);
        if (!weight && !is_updated_state(g, v)) continue;
        if (v->dtype != DT_FLOAT)
            return diag_error(d, DIAG_UNSUPPORTED, "%s: parameter '%s' is %s; training supports float32 parameters",
                              g->path, v->name, dtype_name(v->dtype));
        t->params[t->n_params++] = v;
        if (weight && !frozen(o, v->name)) requires[v->id] = true;
    }
    return true;
}

/* Accumulates a gradient contribution for value v. */
static void accumulate(GradCtx *c, Value **gm, Value *v, Value *dv) {
    if (!dv) return;
    gm[v->id] = gm[v->id] ? gb_op2(c, "Add", gm[v->id], dv) : dv;
}

static bool backward(GradCtx *c, TrainGraph *t, bool *requires, Node **order, int count) {
    Graph *g = c->g;
    int n_vals = g->n_values + 1;
    /* requires: forward propagation from trainable parameters */
    for (int i = 0; i < count; i++) {
        Node *n = order[i];
        bool any = false;
        for (int k = 0; k < n->n_in; k++) any |= n->in[k] && n->in[k]->id < n_vals && requires[n->in[k]->id];
        if (!any) continue;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k]) requires[n->out[k]->id] = true;
    }
    Value **gm = calloc((size_t)g->n_values * 16 + 256, sizeof *gm); /* grows with built values */
    if (!gm) return diag_error(c->d, DIAG_NOMEM, "%s: out of memory", g->path);
    int gm_cap = g->n_values * 16 + 256;
    /* A rule's arguments, one slot per output gradient and per input of
     * the widest node: Concat and Max take any number of inputs. */
    int max_in = 1, max_out = 1;
    for (int i = 0; i < count; i++) {
        if (order[i]->n_in > max_in) max_in = order[i]->n_in;
        if (order[i]->n_out > max_out) max_out = order[i]->n_out;
    }
    Value **dy = calloc((size_t)max_out, sizeof *dy);
    Value **dx = calloc((size_t)max_in, sizeof *dx);
    bool *need = calloc((size_t)max_in, sizeof *need);
    if (!dy || !dx || !need) {
        free(gm);
        free(dy);
        free(dx);
        free(need);
        return diag_error(c->d, DIAG_NOMEM, "%s: out of memory", g->path);
    }
    c->phase = PHASE_BACKWARD;
    gm[t->loss->id] = gb_const_f(c, c->replicas > 1 ? 1.0f / (float)c->replicas : 1.0f);
    bool ok = true;
    int used_in = 0, used_out = 0; /* slots from here on are clear */
    for (int i = count - 1; i >= 0 && ok; i--) {
        Node *n = order[i];
        /* Slots past this node's arity stay clear for rules that look. */
        for (int k = n->n_out; k < used_out; k++) dy[k] = NULL;
        for (int k = n->n_in; k < used_in; k++) dx[k] = NULL, need[k] = false;
        used_out = n->n_out;
        used_in = n->n_in;
        bool have = false;
        for (int k = 0; k < n->n_out; k++) {
            dy[k] = NULL;
            if (n->out[k] && n->out[k]->id < gm_cap && gm[n->out[k]->id]) {
                dy[k] = gm[n->out[k]->id];
                have = true;
            }
        }
        bool any_need = false;
        for (int k = 0; k < n->n_in; k++) {
            dx[k] = NULL;
            need[k] = n->in[k] && requires[n->in[k]->id];
            any_need |= need[k];
        }
        if (!have || !any_need) continue;
        if (!n->def->grad) {
            ok = diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s) has no gradient rule", g->path, n->name,
                            n->op_type);
            break;
        }
        c->origin = n;
        if (!n->def->grad(c, n, dy, dx, need) || diag_failed(c->d)) {
            ok = diag_error(c->d, DIAG_INTERNAL, "%s: node '%s' (%s): gradient construction failed", g->path, n->name,
                            n->op_type);
            break;
        }
        if (g->n_values >= gm_cap) {
            ok = diag_error(c->d, DIAG_LIMIT, "%s: training graph grew beyond its bound", g->path);
            break;
        }
        /* Sums of contributions belong with the value's producer, where
         * the gradient is consumed next. */
        for (int k = 0; k < n->n_in; k++) {
            if (!need[k]) continue;
            c->origin = n->in[k]->producer ? n->in[k]->producer : n;
            accumulate(c, gm, n->in[k], dx[k]);
        }
        c->origin = NULL;
    }
    free(dy);
    free(dx);
    free(need);
    for (int i = 0; ok && i < t->n_params; i++)
        if (requires[t->params[i]->id]) t->grads[i] = gm[t->params[i]->id];
    free(gm);
    return ok && !diag_failed(c->d);
}

/* The optimizer state `suffix` of parameter i, zero to start with, as
 * torch.optim creates it on the first step. */
static Value *add_moment(Graph *g, TrainGraph *t, int i, const char *suffix, Diag *d) {
    const Value *like = t->params[i];
    char name[512];
    snprintf(name, sizeof name, "%s.%s", like->name, suffix);
    Value *v = graph_add_value(g, name);
    if (!v || !(v->konst = const_new(g, DT_FLOAT, value_numel(like)))) {
        diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
        return NULL;
    }
    v->kind = VAL_STATE;
    v->dtype = DT_FLOAT;
    value_set_shape(v, like->rank, like->dims);
    t->state[t->n_state] = v;
    t->state_param[t->n_state++] = i;
    return v;
}

/* Copies each gradient that another node also reads, or that serves two
 * parameters, into a value of its own: collectives then update it in place
 * without disturbing the rest of the backward pass. */
static void private_grads(GradCtx *c, TrainGraph *t) {
    Graph *g = c->g;
    int *readers = calloc((size_t)g->n_values, sizeof *readers);
    if (!readers) return;
    GRAPH_FOR_NODES(g, n) {
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]) readers[n->in[k]->id]++;
    }
    for (int i = 0; i < t->n_params; i++) {
        Value *gw = t->grads[i];
        if (!gw) continue;
        bool shared = readers[gw->id] > 0 || !gw->producer;
        for (int j = 0; j < i && !shared; j++) shared = t->grads[j] == gw;
        if (shared) t->grads[i] = gb_op1(c, "Identity", gw);
    }
    free(readers);
}

/* --no-decay names patterns, not parameters: one that matches none of the
 * parameters the optimizer updates is almost surely a typo, and training
 * would quietly decay what it meant to spare. */
static bool check_no_decay(const Graph *g, const TrainOptions *o, const TrainGraph *t, Diag *d) {
    for (int k = 0; k < o->n_no_decay; k++) {
        bool hit = false;
        for (int i = 0; i < t->n_params && !hit; i++)
            hit = t->grads[i] && train_name_matches(o->no_decay[k], t->params[i]->name);
        if (hit) continue;
        char names[400];
        size_t len = 0;
        names[0] = 0;
        for (int i = 0; i < t->n_params && len < sizeof names - 1; i++)
            if (t->grads[i])
                len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", t->params[i]->name);
        return diag_error(d, DIAG_USAGE, "%s: --no-decay: '%s' matches no trained parameter (they are: %s)", g->path,
                          o->no_decay[k], names);
    }
    return true;
}

static float decay_of(const TrainOptions *o, const Value *w) {
    for (int k = 0; k < o->n_no_decay; k++)
        if (train_name_matches(o->no_decay[k], w->name)) return 0;
    return o->weight_decay;
}

/* The forward node an update (and what serves it) goes with: the one whose
 * backward produced its gradient, so that with stages it runs where the
 * gradient is. */
static Node *update_origin(const Value *gw) { return gw->producer ? gw->producer->origin : NULL; }

/* --clip-grad-norm: each gradient's sum of squares is added into one
 * scalar (GradNormSq: with stages each stage adds its own, and the plan
 * sums the scalar over the stages), and ClipCoef turns the total into the
 * factor min(1, C / (norm + 1e-6)) that every update multiplies its
 * gradient by, as torch.nn.utils.clip_grad_norm_ scales p.grad before
 * optimizer.step().  NULL without clipping. */
static Value *build_clip(GradCtx *c, const TrainOptions *o, TrainGraph *t) {
    bool any = false;
    for (int i = 0; i < t->n_params; i++) any |= t->grads[i] != NULL;
    if (!(o->clip_grad_norm > 0) || !any) return NULL;
    Value *sq = add_state_scalar(c->g, "cleave.grad_sq_sum", DT_FLOAT, c->d);
    if (!sq) return NULL;
    for (int i = 0; i < t->n_params; i++) {
        if (!t->grads[i]) continue;
        c->origin = update_origin(t->grads[i]);
        Value *in[2] = {t->grads[i], sq};
        gb_finish(c, gb_start(c, "cleave", "GradNormSq", 2, in, 0));
    }
    c->origin = NULL;
    Value *in[1] = {sq};
    Node *n = gb_start(c, "cleave", "ClipCoef", 1, in, 1);
    gb_attr_f(c, n, "max_norm", o->clip_grad_norm);
    return gb_finish(c, n);
}

static bool build_optimizer(GradCtx *c, const TrainOptions *o, TrainGraph *t) {
    Graph *g = c->g;
    if (!check_no_decay(g, o, t, c->d)) return false;
    c->phase = PHASE_BACKWARD;
    if (o->replicas > 1) private_grads(c, t);
    if (diag_failed(c->d)) return false;
    c->phase = PHASE_OPTIMIZER;
    Value *coef = build_clip(c, o, t);
    if (diag_failed(c->d)) return false;
    bool adam = o->optimizer == OPT_ADAM || o->optimizer == OPT_ADAMW;
    t->state = ARENA_ARRAY(&g->arena, Value *, 2 * t->n_params + 1);
    t->state_param = ARENA_ARRAY(&g->arena, int, 2 * t->n_params + 1);
    if (!t->state || !t->state_param) {
        diag_error(c->d, DIAG_NOMEM, "%s: out of memory", g->path);
        return false;
    }
    for (int i = 0; i < t->n_params; i++) {
        Value *w = t->params[i], *gw = t->grads[i];
        if (!gw) continue;
        c->origin = update_origin(gw);
        Node *n;
        /* The clipping factor is the last input, after the optional
         * momentum buffer's slot (left empty without momentum). */
        if (adam) {
            Value *avg = add_moment(g, t, i, "exp_avg", c->d);
            Value *avg_sq = add_moment(g, t, i, "exp_avg_sq", c->d);
            Value *in[7] = {w, gw, avg, avg_sq, t->lr, t->step, coef};
            if (!in[2] || !in[3]) return false;
            n = gb_start(c, "cleave", "Adam", coef ? 7 : 6, in, 0);
            gb_attr_f(c, n, "beta1", o->beta1);
            gb_attr_f(c, n, "beta2", o->beta2);
            gb_attr_f(c, n, "eps", o->eps);
            if (o->optimizer == OPT_ADAMW) gb_attr_i(c, n, "decoupled", 1);
        } else if (o->optimizer == OPT_MOMENTUM) {
            Value *in[5] = {w, gw, t->lr, add_moment(g, t, i, "momentum_buffer", c->d), coef};
            if (!in[3]) return false;
            n = gb_start(c, "cleave", "SGD", coef ? 5 : 4, in, 0);
            gb_attr_f(c, n, "momentum", o->momentum);
            gb_attr_i(c, n, "nesterov", o->nesterov);
        } else {
            Value *in[5] = {w, gw, t->lr, NULL, coef};
            n = gb_start(c, "cleave", "SGD", coef ? 5 : 3, in, 0);
        }
        gb_attr_f(c, n, "weight_decay", decay_of(o, w));
        gb_finish(c, n);
        if (diag_failed(c->d)) return false;
    }
    return true;
}

/* Nodes whose training differs from their inference (OpDef.train_form)
 * are replaced by the nodes that train them, before anything reads the
 * graph as a training graph. */
static bool training_forms(GradCtx *c) {
    int n = c->g->n_nodes; /* the nodes the rules add need no replacing */
    for (int i = 0; i < n && !diag_failed(c->d); i++) {
        Node *node = c->g->nodes[i];
        if (!node->dead && node->def && node->def->train_form && !node->def->train_form(c, node)) return false;
    }
    return !diag_failed(c->d);
}

bool train_build(Graph *g, const TrainOptions *o, TrainGraph *t, Diag *d) {
    memset(t, 0, sizeof *t);
    GradCtx c = {.g = g, .d = d, .phase = PHASE_LOSS, .replicas = o->replicas,
                 .stat_replicas = o->stat_replicas > 1 ? o->stat_replicas : 1,
                 .microbatches = o->microbatches > 1 ? o->microbatches : 1, .train = t};
    t->lr = add_state_scalar(g, "cleave.lr", DT_FLOAT, d);
    t->step = add_state_scalar(g, "cleave.step", DT_FLOAT, d);
    if (!t->lr || !t->step) return false;
    const_set_f(t->lr->konst, 0, o->lr);
    if (!training_forms(&c) || !build_loss(&c, o, t)) return false;
    bool *requires = calloc((size_t)g->n_values * 8 + 64, sizeof *requires);
    if (!requires) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    int count;
    Node **order = NULL;
    bool ok = collect_params(g, o, t, requires, d) && (order = ir_topo_order(g, &count, d)) != NULL &&
              backward(&c, t, requires, order, count) && build_optimizer(&c, o, t);
    free(requires);
    return ok;
}
