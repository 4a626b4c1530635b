/* rt_train.c - the step loop and the evaluation pass.
 *
 * Each step: copy the batch's rows into the input slots, set the step and
 * learning-rate slots, call the generated train step, read the loss slot.
 * Nothing is allocated here: the data, the row order and the arena all
 * exist before the first step. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "rt.h"

int64_t rt_steps_per_epoch(int64_t rows, int64_t batch) { return rows / batch + (rows % batch != 0); }

static void set_f32(char *arena, uint64_t offset, float v) { memcpy(arena + offset, &v, sizeof v); }

static float get_f32(const char *arena, uint64_t offset) {
    float v;
    memcpy(&v, arena + offset, sizeof v);
    return v;
}

/* Index of the largest of n values; the first one on ties, and the first NaN
 * if there is one (as numpy.argmax). */
static int64_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t c = 0; c < n; c++) {
        if (isnan(x[c])) return c;
        if (x[c] > x[best]) best = c;
    }
    return best;
}

/* The eval rows go through in file order, B at a time.  Only full batches
 * count towards eval_loss: the loss slot is a mean over B rows, and a padded
 * batch would count its padding.  The last, partial batch is padded by
 * wrapping around to row 0 and counts in the accuracy (and --predict) for
 * its real rows only. */
void rt_eval_run(RtRun *r, bool predict, RtEvalResult *out) {
    const RtMeta *m = r->meta;
    int64_t B = m->batch, n = r->eval_rows;
    RtOrder in_order = {.n = n};
    int64_t batches = rt_steps_per_epoch(n, B), full = 0, hits = 0, counted = 0;
    double loss_sum = 0;
    const float *logits = (const float *)(r->arena + m->output.offset);
    bool ce = m->loss_kind == RT_LOSS_CE;
    for (int64_t j = 0; j < batches; j++) {
        rt_batch_fill(&in_order, m->inputs, r->eval, m->n_inputs, B, j, 0, B, r->arena);
        r->prog->eval_step(r->arena);
        int64_t valid = n - j * B < B ? n - j * B : B;
        if (valid == B) {
            loss_sum += (double)get_f32(r->arena, m->loss_offset);
            full++;
        }
        if (ce) {
            const int64_t *labels = (const int64_t *)(r->arena + m->inputs[m->labels].offset);
            int64_t per_row = m->inputs[m->labels].row_elems;
            for (int64_t k = 0; k < valid * per_row; k++) {
                hits += argmax(logits + k * m->classes, m->classes) == labels[k];
                counted++;
            }
        }
        if (predict && r->predict)
            memcpy(r->predict + j * B * m->output.row_elems, logits,
                   (size_t)(valid * m->output.row_elems) * sizeof(float));
    }
    out->loss = full ? loss_sum / (double)full : NAN;
    out->has_accuracy = ce;
    out->accuracy = counted ? (double)hits / (double)counted : NAN;
}

bool rt_train_run(RtRun *r, RtErr *e) {
    const RtMeta *m = r->meta;
    int64_t B = m->batch, per_epoch = rt_steps_per_epoch(r->train_rows, B), epoch = -1;
    for (int64_t s = 0; s < r->total_steps; s++) {
        int64_t ep = s / per_epoch, i = s % per_epoch;
        if (ep != epoch) {
            rt_order_epoch(&r->order, ep);
            epoch = ep;
        }
        double t0 = rt_now();
        rt_batch_fill(&r->order, m->inputs, r->train, m->n_inputs, B, i, 0, B, r->arena);
        set_f32(r->arena, m->step_offset, (float)(s + 1));
        set_f32(r->arena, m->lr_offset, r->lr);
        r->prog->train_step(r->arena);
        float loss = get_f32(r->arena, m->loss_offset);
        double dt = rt_now() - t0;
        if (!isfinite(loss))
            return rt_error(e, "step %" PRId64 ": loss is %s", s + 1, isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf");
        rt_log_step(&r->log, s + 1, loss, dt);
        bool last = s == r->total_steps - 1;
        if (r->eval && (i == per_epoch - 1 || last)) {
            RtEvalResult res;
            rt_eval_run(r, last, &res);
            rt_log_eval(&r->log, ep, res.loss, res.has_accuracy, res.accuracy);
        }
    }
    return true;
}
