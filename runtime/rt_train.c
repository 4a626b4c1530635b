/* rt_train.c - the step loop and the evaluation pass.
 *
 * Each step: copy the batch's rows into the input slots (with replicas,
 * this rank's replica's share of the global batch), set the step and
 * learning-rate slots (the base rate times the schedule's factor), call the generated train step (which sums the
 * gradients over the replicas through the rt_abi.h collectives), read the
 * loss slots and, on several ranks, average the loss over the replicas.
 * Nothing is allocated here: the data, the row order and the arena all
 * exist before the first step. */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <string.h>

#include "rt.h"

int64_t rt_steps_per_epoch(int64_t rows, int64_t batch) { return rows / batch + (rows % batch != 0); }

static void set_f32(char *arena, uint64_t offset, float v) { memcpy(arena + offset, &v, sizeof v); }

static float get_f32(const char *arena, uint64_t offset) {
    float v;
    memcpy(&v, arena + offset, sizeof v);
    return v;
}

/* The label_count slot (rt_abi.h) of batch `step` of order o over data:
 * the global batch's counted labels over the shares it is split into, so
 * that each share's sum over it averages to the global batch's mean. */
static void set_label_count(const RtRun *r, const RtOrder *o, const RtArray *data, int64_t step) {
    const RtMeta *m = r->meta;
    if (!m->layout.has_label_count) return;
    double shares = (double)m->layout.dp * m->layout.microbatches;
    set_f32(r->arena, m->label_count_offset, (float)((double)rt_labels_counted(o, &data[m->labels], m, step) / shares));
}

/* This rank's loss of the step just run: the mean of the micro-batches'
 * losses (equal sizes, so the batch's). */
static double step_loss(const RtRun *r) {
    const RtMeta *m = r->meta;
    double sum = 0;
    for (int k = 0; k < m->layout.loss_count; k++) sum += (double)get_f32(r->arena, m->loss_offset + 4 * (uint64_t)k);
    return sum / m->layout.loss_count;
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

/* The eval rows go through in file order, B at a time (B the global
 * batch).  Only full batches count towards eval_loss: the loss slot is a
 * mean over the batch's rows, and a padded batch would count its padding.
 * The last, partial batch is padded by wrapping around to row 0 and counts
 * in the accuracy (and --predict) for its real rows only.
 *
 * With replicas, each rank runs its replica's rows [r0, r1) of every eval
 * batch, as in training: a batch's loss is the mean of the replicas'
 * losses, so eval_loss is the sum of the loss of every rank holding one
 * over the full batches divided by (full batches) * replicas; a rank counts
 * the hits of its positions below the batch's real rows; and --predict
 * gathers every rank's output rows of a batch on rank 0, which keeps the
 * real ones of the last stage's ranks.  On several ranks one reduction at
 * the end gives every rank the same result. */
void rt_eval_run(RtRun *r, bool predict, RtEvalResult *out) {
    const RtMeta *m = r->meta;
    int64_t B = m->batch, L = m->local_batch, n = r->eval_rows;
    const RtLayout *l = &m->layout;
    int64_t r0 = (int64_t)l->replica * L, r1 = r0 + L;
    RtOrder in_order = {.n = n};
    int64_t batches = rt_steps_per_epoch(n, B);
    /* sums[0]: loss over full batches; [1] hits; [2] rows counted; [3] full
     * batches.  Doubles count exactly up to 2^53. */
    double sums[4] = {0, 0, 0, 0};
    /* The outputs, loss and labels are on the last stage. */
    bool has_out = l->has_output, has_loss = l->loss_count > 0;
    const float *logits = has_out ? (const float *)(r->arena + m->output.offset) : r->zeros;
    bool ce = m->loss_kind == RT_LOSS_CE;
    bool count_hits = ce && has_out && !m->inputs[m->labels].absent;
    int ranks = rt_ranks();
    size_t out_row = (size_t)m->output.row_elems;
    for (int64_t j = 0; j < batches; j++) {
        rt_batch_fill(&in_order, m->inputs, r->eval, m->n_inputs, B, j, r0, r1, r->arena);
        set_label_count(r, &in_order, r->eval, j);
        r->prog->eval_step(r->arena);
        rt_comm_step_end(NULL, NULL); /* its sends; an eval step starts no bucket */
        int64_t valid = n - j * B < B ? n - j * B : B;
        /* This rank's positions r0 .. r1-1 that hold real rows. */
        int64_t mine = valid <= r0 ? 0 : valid >= r1 ? L : valid - r0;
        if (valid == B && has_loss) {
            sums[0] += step_loss(r);
            sums[3] += 1;
        }
        if (count_hits) {
            const int64_t *labels = (const int64_t *)(r->arena + m->inputs[m->labels].offset);
            int64_t per_row = m->inputs[m->labels].row_elems;
            for (int64_t k = 0; k < mine * per_row; k++) {
                if (m->has_ignore && labels[k] == m->ignore_index) continue;
                sums[1] += argmax(logits + k * m->classes, m->classes) == labels[k];
                sums[2] += 1;
            }
        }
        if (!predict || !r->predict_on) continue;
        if (ranks == 1) {
            if (r->predict)
                memcpy(r->predict + (size_t)(j * B) * out_row, logits, (size_t)valid * out_row * sizeof(float));
            continue;
        }
        /* Every rank sends its L rows; rank 0 keeps those of the last
         * stage of each replica, replica by replica, which are the batch's
         * rows in order. */
        rt_comm_gather(logits, (int)((size_t)L * out_row), r->gathered);
        if (!r->predict) continue;
        for (int k = 0; k < l->dp; k++) {
            int from = rt_layout_rank(l, k, l->stages - 1);
            int64_t rows = valid - k * L < L ? valid - k * L : L;
            if (rows <= 0) break;
            memcpy(r->predict + (size_t)(j * B + k * L) * out_row, r->gathered + (size_t)from * (size_t)L * out_row,
                   (size_t)rows * out_row * sizeof(float));
        }
    }
    /* Summed over the ranks, sums[3] counts every full batch once per rank
     * holding a loss: the mean of their losses of every full batch is
     * sums[0] / sums[3].  A program of one rank on several sums nothing:
     * each rank ran every row. */
    if (m->ranks > 1) rt_comm_sum(sums, 4, "the evaluation's sums");
    out->loss = sums[3] > 0 ? sums[0] / sums[3] : NAN;
    out->has_accuracy = ce;
    out->accuracy = sums[2] > 0 ? sums[1] / sums[2] : NAN;
}

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

/* After the step that found a signal: the checkpoint, when there is a
 * folder for it and the step's is not written yet, and the error every
 * rank exits with (128 + the signal, as a shell reports a process the
 * signal killed). */
static bool stop_on_signal(RtRun *r, int64_t done, bool written, RtErr *e) {
    int sig = r->stop_signal;
    char saved[512] = "nothing saved: no --checkpoint";
    if (r->ckpt && r->ckpt->dir) {
        if (!written && !rt_ckpt_write(r->ckpt, r, done, e)) return false;
        snprintf(saved, sizeof saved, "checkpoint %s/step-%09" PRId64 " written; continue with --resume %s",
                 r->ckpt->dir, done, r->ckpt->dir);
    }
    rt_error_all(e, "stopped by %s after step %" PRId64 " of %" PRId64 ": %s", signal_name(sig), done,
                 r->total_steps, saved);
    e->status = 128 + sig;
    return false;
}

bool rt_train_run(RtRun *r, RtErr *e) {
    const RtMeta *m = r->meta;
    int64_t B = m->batch, L = m->local_batch, per_epoch = rt_steps_per_epoch(r->train_rows, B), epoch = -1;
    const RtLayout *l = &m->layout;
    int64_t r0 = (int64_t)l->replica * L, r1 = r0 + L;
    const RtCheckpoint *ck = r->ckpt && r->ckpt->dir ? r->ckpt : NULL;
    int64_t every = ck && ck->every > 0 ? ck->every : per_epoch;
    /* Whether the step's loss is a reduction over ranks: the means of the
     * last stage of each replica (the other ranks add nothing). */
    bool sharded = m->ranks > 1;
    for (int64_t s = r->start_step; s < r->total_steps; s++) {
        int64_t ep = s / per_epoch, i = s % per_epoch;
        if (ep != epoch) {
            rt_order_epoch(&r->order, ep);
            epoch = ep;
        }
        double t0 = rt_now();
        rt_batch_fill(&r->order, m->inputs, r->train, m->n_inputs, B, i, r0, r1, r->arena);
        if (l->has_step) set_f32(r->arena, m->step_offset, (float)(s + 1));
        float lr = (float)((double)r->lr * rt_lr_factor(r->lr_schedule, r->warmup_steps, r->total_steps, s));
        if (l->has_lr) set_f32(r->arena, m->lr_offset, lr);
        set_label_count(r, &r->order, r->train, i);
        RtStepComm comm;
        rt_comm_step_begin();
        rt_trace_step_begin(s + 1);
        rt_watch_step(s + 1);
        r->prog->train_step(r->arena);
        if (!rt_comm_step_end(&comm, e)) return false;
        /* The global batch's loss is the mean of the replicas' means (each
         * over L rows); a NaN or infinity anywhere reaches every rank through
         * the sum, so all stop at the same step.  So does a SIGTERM or
         * SIGINT any rank received: loss[2] and loss[3] count them. */
        int sig = rt_signal_pending();
        double loss[4] = {0, 1, sig == SIGTERM, sig == SIGINT};
        if (l->loss_count) loss[0] = step_loss(r);
        else loss[1] = 0;
        /* The step ends for every rank when the loss is known: a rank
         * that finished its own work early waits here, and the trace
         * counts that as idle time of the step. */
        double t_sync = rt_trace_wait_begin();
        if (sharded) rt_comm_sum(loss, 4, "the loss sum");
        rt_trace_wait_end(RT_EV_SYNC, t_sync);
        rt_trace_step_end();
        loss[0] /= loss[1];
        double dt = rt_now() - t0;
        if (!isfinite(loss[0])) {
            const char *what = isnan(loss[0]) ? "nan" : loss[0] > 0 ? "inf" : "-inf";
            if (sharded) return rt_error_all(e, "step %" PRId64 ": loss is %s", s + 1, what);
            return rt_error(e, "step %" PRId64 ": loss is %s", s + 1, what);
        }
        rt_log_step(&r->log, s + 1, loss[0], lr, dt, sharded ? &comm : NULL);
        bool last = s == r->total_steps - 1;
        if (r->eval && (i == per_epoch - 1 || last)) {
            RtEvalResult res;
            rt_watch_phase("evaluation");
            rt_comm_state_from_replica0(m, r->arena);
            rt_eval_run(r, last, &res);
            rt_log_eval(&r->log, ep, res.loss, res.has_accuracy, res.accuracy);
        }
        bool written = false;
        if (ck && ((s + 1) % every == 0 || last)) {
            if (!rt_ckpt_write(ck, r, s + 1, e)) return false;
            written = true;
        }
        /* A signal at the last step stops nothing: the run ends anyway. */
        if (!last && (loss[2] > 0 || loss[3] > 0)) {
            r->stop_signal = loss[2] > 0 ? SIGTERM : SIGINT;
            return stop_on_signal(r, s + 1, written, e);
        }
    }
    return true;
}
