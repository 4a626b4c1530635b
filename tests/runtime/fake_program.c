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
 * and nothing for --predict. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* rt_abi.h's opening comment contains "runtime/" followed by "*.c", which
 * -Wcomment reports as a nested comment; the header is not ours to edit. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcomment"
#include "rt_abi.h"
#pragma GCC diagnostic pop

enum { B = 8, D = 4, C = 3 };

/* Arena layout (offsets aligned to 64): W [4, 3] at 0 (the 48 init bytes),
 * loss 64, lr 128, step 192, input 256, labels 384, logits 448, end 576. */
enum { OFF_W = 0, OFF_LOSS = 64, OFF_LR = 128, OFF_STEP = 192, OFF_X = 256, OFF_Y = 384, OFF_OUT = 448 };

#ifdef FAKE_BAD_ABI
#define ABI "2"
#else
#define ABI "1"
#endif
#ifdef FAKE_MODEL_LOSS
#define OUTPUT "{\"name\": \"loss\", \"offset\": 64, \"shape\": []}"
#define LOSS_KIND "model"
#else
#define OUTPUT "{\"name\": \"logits\", \"offset\": 448, \"shape\": [8, 3]}"
#define LOSS_KIND "ce"
#endif

const char cleave_meta[] =
    "{\"abi\": " ABI ", \"plan_hash\": \"0123456789abcdef\", \"ranks\": 1, \"rank_programs\": 1,"
    " \"batch\": 8, \"arena_bytes\": 576, \"init_bytes\": 48,"
    " \"loss\": {\"offset\": 64}, \"lr\": {\"offset\": 128, \"value\": 0.1}, \"step\": {\"offset\": 192},"
    " \"inputs\": [{\"name\": \"input\", \"dtype\": \"float32\", \"shape\": [8, 4], \"offset\": 256},"
    "              {\"name\": \"labels\", \"dtype\": \"int64\", \"shape\": [8], \"offset\": 384}],"
    " \"output\": " OUTPUT ","
    " \"params\": [{\"name\": \"W\", \"dtype\": \"float32\", \"shape\": [4, 3], \"offset\": 0, \"trainable\": true}],"
    " \"loss_kind\": \"" LOSS_KIND "\", \"optimizer\": {\"name\": \"sgd\"}}";
const uint64_t cleave_meta_len = sizeof cleave_meta - 1;

static float get_f(const char *arena, int off) {
    float v;
    memcpy(&v, arena + off, 4);
    return v;
}

static void put_f(char *arena, int off, float v) { memcpy(arena + off, &v, 4); }

/* Forward pass and loss; with grad != NULL also dLoss/dW. */
static void forward(char *arena, double grad[D * C]) {
    float w[D * C], x[B * D];
    int64_t y[B];
    memcpy(w, arena + OFF_W, sizeof w);
    memcpy(x, arena + OFF_X, sizeof x);
    memcpy(y, arena + OFF_Y, sizeof y);
    double loss = 0;
    if (grad) memset(grad, 0, sizeof(double) * D * C);
    for (int b = 0; b < B; b++) {
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
    put_f(arena, OFF_LOSS, (float)(loss / B));
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
    for (int k = 0; k < D * C; k++) put_f(arena, OFF_W + 4 * k, (float)((double)get_f(arena, OFF_W + 4 * k) - lr * grad[k]));
}

void cleave_eval_step(char *arena) { forward(arena, NULL); }
