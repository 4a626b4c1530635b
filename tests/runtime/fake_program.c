/* fake_program.c - a stand-in for a program the compiler would generate,
 * for testing the runtime before the compiler can emit one.
 *
 * It defines the symbols of rt_abi.h for a tiny classifier: input "input"
 * float32 [8, 4], "labels" int64 [8], a linear layer W [4, 3] (the only
 * parameter) giving logits [8, 3], mean softmax cross-entropy, and plain SGD
 * with the learning-rate slot.  The math is done in double and stored as
 * float32, which test_runtime.py replays in numpy.  (The embedded ONNX model
 * also adds a bias b that is zero and not a parameter, so --save has an
 * initializer to leave alone.)
 *
 * cleave_model and cleave_init come from fake_model_<variant>.c, written at
 * build time by make_fake_model.c.
 *
 * FAKE_BAD_ABI, when defined, gives the metadata an abi version the runtime
 * does not implement: a program whose metadata is broken must say so.
 * FAKE_MODEL_LOSS describes the same program as loss_kind "model", whose
 * output is the scalar loss itself (as the compiler emits it): no accuracy,
 * and nothing for --predict.
 *
 * FAKE_DP makes it a data-parallel program for 2 ranks, as the compiler
 * would with --ranks 2 --strategy dp: each rank gets 4 of the 8 rows of a
 * batch, its gradient is scaled by 1/8 (the 1/N seed of the compiler times
 * its local mean), and the gradient of W is summed over the ranks in two
 * buckets (W's first 6 values and its last 6) through the runtime's
 * collectives before the update, so the trained W is the single-rank one.
 * With the environment variable FAKE_PERTURB_RANK=R, rank R
 * (OMPI_COMM_WORLD_RANK) nudges its W after every update, so that its
 * replica diverges.  FAKE_DP_OTHER is the same program with another plan
 * hash. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* rt_abi.h's opening comment contains "runtime/" followed by "*.c", which
 * -Wcomment reports as a nested comment; the header is not ours to edit. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcomment"
#include "rt_abi.h"
#pragma GCC diagnostic pop

#ifdef FAKE_DP_OTHER
#define FAKE_DP
#endif

#ifdef FAKE_DP
enum { RANKS = 2 };
#else
enum { RANKS = 1 };
#endif
/* B: the global batch; ROWS: the rows of one rank. */
enum { B = 8, ROWS = B / RANKS, D = 4, C = 3 };

/* Arena layout (offsets aligned to 64): W [4, 3] at 0 (the 48 init bytes),
 * loss 64, lr 128, step 192, input 256, labels 384, logits 448, and under
 * FAKE_DP the gradient of W at 512 (buckets of 6 values at 512 and 536);
 * end 576. */
enum { OFF_W = 0, OFF_LOSS = 64, OFF_LR = 128, OFF_STEP = 192, OFF_X = 256, OFF_Y = 384, OFF_OUT = 448,
       OFF_GRAD = 512 };

#ifdef FAKE_BAD_ABI
#define ABI "1" /* the version before every plan had one form */
#else
#define ABI "2"
#endif
/* OUTPUT: the output's name and shape; OUTPUT_AT: its offset. */
#ifdef FAKE_MODEL_LOSS
#define OUTPUT "{\"name\": \"loss\", \"shape\": []}"
#define OUTPUT_AT "64"
#define LOSS_KIND "model"
#elif defined FAKE_DP
#define OUTPUT "{\"name\": \"logits\", \"shape\": [4, 3]}"
#define OUTPUT_AT "448"
#define LOSS_KIND "ce"
#else
#define OUTPUT "{\"name\": \"logits\", \"shape\": [8, 3]}"
#define OUTPUT_AT "448"
#define LOSS_KIND "ce"
#endif

#ifdef FAKE_DP_OTHER
#define HEAD "\"plan_hash\": \"fedcba9876543210\", \"ranks\": 2, \"strategy\": \"dp\","
#elif defined FAKE_DP
#define HEAD "\"plan_hash\": \"00112233445566dd\", \"ranks\": 2, \"strategy\": \"dp\","
#else
#define HEAD "\"plan_hash\": \"0123456789abcdef\", \"ranks\": 1, \"strategy\": \"single\","
#endif
#ifdef FAKE_DP
#define ROWS_S "4"
#define RANKS_S "2"
#define BUCKETS "[{\"offset\": 512, \"count\": 6}, {\"offset\": 536, \"count\": 6}]"
#else
#define ROWS_S "8"
#define RANKS_S "1"
#define BUCKETS "[]"
#endif

/* One stage, RANKS replicas, one micro-batch of ROWS rows. */
const char cleave_meta[] =
    "{\"abi\": " ABI ", " HEAD " \"rank_programs\": 1, \"batch\": 8, \"local_batch\": " ROWS_S ","
    " \"stages\": 1, \"dp\": " RANKS_S ", \"microbatches\": 1, \"micro_batch\": " ROWS_S ","
    " \"schedule\": \"layer\", \"tag_bound\": 0, \"placement\": \"by_replica\", \"lr\": {\"value\": 0.1},"
    " \"inputs\": [{\"name\": \"input\", \"dtype\": \"float32\", \"shape\": [" ROWS_S ", 4]},"
    "              {\"name\": \"labels\", \"dtype\": \"int64\", \"shape\": [" ROWS_S "]}],"
    " \"output\": " OUTPUT ","
    " \"params\": [{\"name\": \"W\", \"dtype\": \"float32\", \"shape\": [4, 3], \"trainable\": true, \"stage\": 0}],"
    " \"loss_kind\": \"" LOSS_KIND "\", \"optimizer\": {\"name\": \"sgd\"}, \"threads\": 1,"
    " \"programs\": [{\"stage\": 0, \"arena_bytes\": 576, \"init_bytes\": 48, \"init_offset\": 0,"
    "   \"peak_activation_bytes\": 0,"
    "   \"inputs\": [{\"name\": \"input\", \"offset\": 256}, {\"name\": \"labels\", \"offset\": 384}],"
    "   \"params\": [{\"name\": \"W\", \"offset\": 0}], \"buckets\": " BUCKETS ","
    "   \"loss\": {\"offset\": 64, \"count\": 1}, \"output\": {\"offset\": " OUTPUT_AT "},"
    "   \"lr\": {\"offset\": 128}, \"step\": {\"offset\": 192}}]}";
const uint64_t cleave_meta_len = sizeof cleave_meta - 1;

static float get_f(const char *arena, int off) {
    float v;
    memcpy(&v, arena + off, 4);
    return v;
}

static void put_f(char *arena, int off, float v) { memcpy(arena + off, &v, 4); }

/* Forward pass over this rank's ROWS rows and their mean loss; with
 * grad != NULL also their part of dLoss/dW of the global batch's mean loss
 * (summed over the ranks, it is the whole gradient). */
static void forward(char *arena, double grad[D * C]) {
    float w[D * C], x[ROWS * D];
    int64_t y[ROWS];
    memcpy(w, arena + OFF_W, sizeof w);
    memcpy(x, arena + OFF_X, sizeof x);
    memcpy(y, arena + OFF_Y, sizeof y);
    double loss = 0;
    if (grad) memset(grad, 0, sizeof(double) * D * C);
    for (int b = 0; b < ROWS; b++) {
        double z[C], m = -INFINITY;
        for (int c = 0; c < C; c++) {
            z[c] = 0;
            for (int d = 0; d < D; d++) z[c] += (double)x[b * D + d] * (double)w[d * C + c];
            put_f(arena, OFF_OUT + 4 * (b * C + c), (float)z[c]);
            if (z[c] > m) m = z[c];
        }
        double s = 0;
        for (int c = 0; c < C; c++) s += exp(z[c] - m);
        double lse = m + log(s);
        loss += lse - z[y[b]];
        if (!grad) continue;
        for (int c = 0; c < C; c++) {
            double g = (exp(z[c] - lse) - (c == y[b])) / B;
            for (int d = 0; d < D; d++) grad[d * C + c] += (double)x[b * D + d] * g;
        }
    }
    put_f(arena, OFF_LOSS, (float)(loss / ROWS));
}

void cleave_train_step(char *arena) {
    double grad[D * C];
    forward(arena, grad);
    double lr = get_f(arena, OFF_LR);
    /* The step slot must count 1, 2, 3, ...; a runtime that got it wrong
     * shows up as a NaN loss. */
    static float last_step = 0;
    float step = get_f(arena, OFF_STEP);
    if (step != last_step + 1) put_f(arena, OFF_LOSS, NAN);
    last_step = step;
#ifdef FAKE_DP
    /* As a generated step would: each bucket starts once its gradients are
     * written, the runtime may progress it between kernels, and the update
     * waits for it.  The sum is in float32. */
    for (int k = D * C / 2; k < D * C; k++) put_f(arena, OFF_GRAD + 4 * k, (float)grad[k]);
    cleave_rt_allreduce_start(1);
    cleave_rt_progress();
    for (int k = 0; k < D * C / 2; k++) put_f(arena, OFF_GRAD + 4 * k, (float)grad[k]);
    cleave_rt_allreduce_start(0);
    cleave_rt_progress();
    cleave_rt_allreduce_wait(0);
    cleave_rt_allreduce_wait(1);
    for (int k = 0; k < D * C; k++) grad[k] = get_f(arena, OFF_GRAD + 4 * k);
    const char *perturb = getenv("FAKE_PERTURB_RANK"), *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (perturb && rank && strcmp(perturb, rank) == 0) grad[D * C - 1] += 1e-3 / lr;
#endif
    for (int k = 0; k < D * C; k++) put_f(arena, OFF_W + 4 * k, (float)((double)get_f(arena, OFF_W + 4 * k) - lr * grad[k]));
}

void cleave_eval_step(char *arena) { forward(arena, NULL); }

/* A single program: the runtime sets this to 0. */
int32_t cleave_program;
