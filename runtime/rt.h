/* rt.h - the runtime's internal interfaces.
 *
 * The runtime is linked into every generated program and owns main()
 * (rt_main.c).  Only rt_main.c names the symbols the generated object defines
 * (rt_abi.h); it hands them to the other files as an RtProgram, so the rest
 * of the library can be linked into unit tests that define no program at
 * all.  The other direction, the runtime functions the generated step calls
 * (cleave_rt_allreduce_start and friends), is defined by the communication
 * module (rt_comm.c and the files it names).
 *
 * Library functions never exit and never print: a failing function records
 * one line in an RtErr and returns false.  main() turns it into
 * "PROG: error: ..." (rt_die, rt_util.c). */
#ifndef CLEAVE_RT_H
#define CLEAVE_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "out_file.h"
#include "rt_abi.h"

/* .npy '<' data, ONNX raw_data and the arena slots are all little-endian and
 * copied byte for byte. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the cleave runtime assumes a little-endian host"
#endif

/* ---- errors: rt_err.c ---------------------------------------------------- */

/* How an error ends a run of several ranks (rt_die):
 *   - every == false: this rank alone found it.  It prints the message with
 *     its rank and ends the whole job through MPI_Abort, so no rank waits
 *     for it in a collective.
 *   - every == true: every rank stops here together, decided from data they
 *     all hold (a collective), so each one exits on its own with `status`
 *     and nobody aborts.  The message is printed once: by rank `origin` with
 *     its rank, or, when origin is -1 (every rank holds the same message),
 *     by rank 0 without one. */
typedef struct RtErr {
    int status; /* exit status: 0 while no error, 2 for usage, 1 otherwise */
    char msg[1024];
    bool every;
    int origin;
} RtErr;

/* Record the first error (later ones are dropped: the first is the cause) and
 * return false, so callers can write `return rt_error(e, ...)`. */
bool rt_error(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same for a bad command line: exits with status 2. */
bool rt_usage_error(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An error every rank records at the same point from the same collective
 * data (every = true, origin = -1): status 1. */
bool rt_error_all(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "[28, 28]" into buf; returns buf. */
const char *rt_shape_str(char *buf, size_t size, int ndim, const int64_t *dims);

/* ---- the program's metadata: rt_meta.c ----------------------------------- */

#define RT_MAX_DIMS 8

typedef enum { RT_F32, RT_I64 } RtDType;

/* A tensor in the arena: an input, the output or a parameter. */
typedef struct RtTensor {
    char *name;
    RtDType dtype;
    int ndim;
    int64_t shape[RT_MAX_DIMS];
    uint64_t offset;    /* bytes into the arena */
    int64_t elems;      /* whole tensor */
    int64_t row_elems;  /* per sample: elems / shape[0] (inputs and output,
                           whose shape[0] is the local batch); 0 for an
                           output without rows (loss_kind model) */
    uint64_t bytes;
    bool absent;        /* an input or parameter only another stage's
                           ranks hold (no offset here) */
    bool trainable;     /* a parameter the optimizer updates (else state or frozen) */
    bool positions;     /* an int64 input [batch] the runtime fills with
                           each row's position in the global batch (the
                           key of dropout masks), not from a file */
    int of_len;         /* optimizer state: name is PARAM.SLOT, and PARAM
                           its first of_len characters */
} RtTensor;

typedef enum { RT_LOSS_CE, RT_LOSS_MSE, RT_LOSS_MODEL } RtLossKind;

/* How the learning rate moves over a run (docs/cli.md, "Learning-rate
 * schedules"): constant, or decaying linearly or along a half cosine to 0
 * at the run's last step, each after an optional linear warmup. */
typedef enum { RT_LR_CONSTANT, RT_LR_LINEAR, RT_LR_COSINE } RtLrSchedule;

/* A gradient bucket of a program with replicas: `count` float32 values at
 * byte `offset` of the arena, summed over the replicas of this rank's
 * stage in one allreduce. */
typedef struct RtBucket {
    uint64_t offset;
    int count;
} RtBucket;

#define RT_HASH_MAX 64 /* longest "plan_hash" accepted */

/* How a program is split (rt_abi.h): D replicas of a P-stage pipeline on
 * D x P ranks, each step's rows in M micro-batches; rank replica * P +
 * stage (by stage: stage * D + replica) runs program `stage`.  A single
 * program is 1 x 1 x 1, a data-parallel one D x 1 x 1. */
typedef struct RtLayout {
    int stages, dp, microbatches;
    int stage, replica;      /* this rank's */
    bool by_stage;           /* placement: a stage's replicas on consecutive ranks (else a replica's stages) */
    int64_t micro_batch;
    int64_t tag_bound;       /* every tag the program uses is below it */
    int allreduce_node;      /* 0: gradient buckets summed over the replicas at
                                once; K: hierarchically, within nodes of K
                                ranks (rank r on node r / K) first */
    char schedule[16];
    uint64_t init_offset;    /* this program's image in cleave_init */
    int64_t peak_act_bytes;  /* planned peak of this rank's activations */
    int loss_count;          /* micro-batch losses at loss_offset (M on the
                                last stage, 0 elsewhere) */
    bool has_output, has_lr, has_step, has_seed;
    bool has_label_count;    /* ce, the stage holding the loss */
    RtTensor *all_params;    /* every parameter; offsets into the program of */
    int *param_stage;        /* ... the stage whose replica-0 rank --save reads */
    int n_all_params;
    RtTensor *all_state;     /* every optimizer state tensor, the same way */
    int *state_stage;
    int n_all_state;
} RtLayout;

typedef struct RtMeta {
    int64_t batch;       /* global: the rows of one optimizer step */
    int64_t local_batch; /* rows of each replica: batch / dp; dim 0 of the
                            inputs and output */
    int ranks;           /* ranks the program was compiled for */
    char plan_hash[RT_HASH_MAX + 1];
    RtBucket *buckets;   /* in the order the program starts them (dp > 1) */
    int n_buckets;
    uint64_t arena_bytes; /* rounded up to a multiple of 64 */
    uint64_t init_bytes;
    uint64_t loss_offset, lr_offset, step_offset;
    uint64_t seed_offset; /* int64: --seed, for dropout masks (layout.has_seed) */
    uint64_t label_count_offset; /* float32: counted labels / (D x M) (layout.has_label_count) */
    float lr;
    RtLrSchedule lr_schedule; /* "lr": "schedule" (absent: constant) */
    bool has_lr_schedule;     /* compiled with --lr-schedule */
    int64_t warmup_steps;     /* "lr": "warmup_steps" (absent: 0) */
    RtTensor *inputs;
    int n_inputs;
    RtTensor output; /* float32 */
    RtTensor *params;
    int n_params;
    RtTensor *state;  /* the optimizer state this rank holds (RtTensor.of_len) */
    int n_state;
    bool has_state;   /* the metadata lists it: checkpoints can be written */
    char *optimizer;  /* "optimizer" as compact JSON with sorted keys */
    RtLossKind loss_kind;
    int labels;       /* index of the input named "labels", -1 if none */
    int64_t classes;  /* ce: the output's last dimension */
    bool has_ignore;  /* ce: labels equal to ignore_index count for nothing */
    int64_t ignore_index;
    int threads;      /* "threads": threads per rank for the matrix products (1..RT_MAX_THREADS) */
    bool state_from_replica0; /* non-trainable parameters (running statistics) follow replica 0's */
    RtLayout layout;
} RtMeta;

const char *rt_dtype_name(RtDType t);
size_t rt_dtype_size(RtDType t);
/* The metadata as rank 0 sees it. */
bool rt_meta_parse(const char *json, size_t len, RtMeta *m, RtErr *e);
/* The same for the program that MPI rank `rank` runs; a rank beyond the
 * ranks the program was compiled for takes the place of rank % ranks. */
bool rt_meta_parse_rank(const char *json, size_t len, int rank, RtMeta *m, RtErr *e);
void rt_meta_free(RtMeta *m);
/* The MPI rank running `stage` of `replica` under l's placement. */
int rt_layout_rank(const RtLayout *l, int replica, int stage);
/* Whether l has stages or micro-batches, beyond replicas: what --help,
 * the metrics' plan line and the trace describe as a pipeline. */
bool rt_layout_pipelined(const RtLayout *l);
/* "ce", "mse" or "model", as the metadata spells it. */
const char *rt_loss_kind_name(RtLossKind k);
/* Index of the input called name, or -1. */
int rt_meta_input(const RtMeta *m, const char *name);

/* ---- utilities: rt_util.c ------------------------------------------------
 *
 * Who this process is, how it ends on an error, warnings and the hash.
 * Before rt_comm_init (and in unit tests) a process is rank 0 of 1. */

/* The program's name, for messages: argv[0] without its directory. */
void rt_set_prog_name(const char *argv0);
/* Set once by rt_comm_init. */
void rt_set_rank(int rank, int ranks);
int rt_rank(void);
int rt_ranks(void);
const char *rt_prog_name(void);
/* Prints "PROG: error: MSG" as e asks (see RtErr) and ends the program with
 * e->status: alone or for an `every` error by exiting, otherwise by aborting
 * the whole job so no rank waits for a dead one. */
_Noreturn void rt_die(const RtErr *e);
/* Ends MPI if it is up (MPI_Finalize, which waits for every rank, under
 * the watchdog) and then stops the watchdog: the last call of any run. */
void rt_end_mpi(void);
/* rt_die with an error this rank alone found (status 1): for a broken
 * program or a resource failure where no caller can take an error, such
 * as in the middle of a step, when the peers may be waiting on this rank. */
_Noreturn void rt_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "PROG: warning: ..." on stderr, from rank 0 only. */
void rt_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* FNV-1a, 64 bits, continuing from h (RT_FNV1A64_INIT to start). */
uint64_t rt_fnv1a64(uint64_t h, const void *data, size_t len);
#define RT_FNV1A64_INIT 14695981039346656037ull

/* ---- communication: rt_comm.c, rt_group.c, rt_collective.c, rt_p2p.c,
 * rt_agree.c --------------------------------------------------------------
 *
 * Everything a run says to the other ranks: start and end of MPI, the
 * groups (every rank, the replicas of each stage, the stage neighbours of
 * a replica), the in-flight requests of a step (bucket allreduces, sends)
 * and their progress, receives and stage group sums (the rt_abi.h
 * functions), the start-up checks, agreeing on failures, the run's
 * reductions and --check-replicas.  A plan is D replicas x P stages: a
 * data-parallel program is D x 1, a single one 1 x 1.  rt_comm.h says
 * which file calls which; rt_mpi.h gives the groups to the other files
 * that call MPI. */

/* MPI_Init, and the program's communicator (a duplicate of
 * MPI_COMM_WORLD); tells rt_util.c the rank. */
void rt_comm_init(int *argc, char ***argv);
void rt_comm_finalize(void);

/* What every rank must agree on before any other collective. */
typedef struct RtHello {
    const RtMeta *meta; /* NULL when the metadata was not read (an error, --help) */
    bool help;
    uint64_t options;   /* rt_args_fingerprint: the flags that shape the run */
} RtHello;

/* The first collective of every run, made by every rank whatever happened
 * before (e holds this rank's error so far).  Returns false, with an `every`
 * error in e, when any rank failed (its message), when ranks run different
 * programs (plan hashes) or different options, or when a program compiled
 * for several ranks runs on another number of them.  *any_help: some rank was asked
 * for --help; every rank then ends without training. */
bool rt_comm_startup(const RtHello *h, bool *any_help, RtErr *e);
/* Collective: true on every rank when no rank has an error in e; otherwise
 * false on every rank with an `every` error naming the first failing rank. */
bool rt_comm_agree(RtErr *e);
/* The same, also checking that every rank loaded as many training and eval
 * rows as rank 0 (the batch order depends on them). */
bool rt_comm_agree_rows(int64_t train_rows, int64_t eval_rows, RtErr *e);
/* Collective sum over the ranks of x[0..n), in place; `what` names it if
 * a rank never comes (rt_watch_begin). */
void rt_comm_sum(double *x, int n, const char *what);
/* Collective over the replicas of each stage, for programs whose metadata
 * asks (state_from_replica0: batch statistics of each replica's own rows):
 * the non-trainable parameters the rank holds (running statistics) become
 * replica 0's, as PyTorch DDP's broadcast_buffers makes them before each
 * forward pass.  Called before evaluating and at the end of training. */
void rt_comm_state_from_replica0(const RtMeta *m, char *arena);
/* Collective: rank r's `count` floats land at recv + r * count on rank 0
 * (recv is ignored elsewhere). */
void rt_comm_gather(const float *send, int count, float *recv);

/* Local, before the first collective of the run: the groups' layout, the
 * gradient buckets of a program with replicas (their allreduces run in
 * place in arena) and the sends of one with stages. */
bool rt_comm_setup(char *arena, const RtMeta *m, RtErr *e);
/* Collective over every rank, after rt_comm_agree: the stage groups of a
 * program with stages. */
void rt_comm_groups(void);
void rt_comm_free(void);

/* Communication of one train step (rank-local wall time, seconds). */
typedef struct RtStepComm {
    double wait_s;      /* blocked in waits, receives, sends and blocking collectives */
    double allreduce_s; /* sum over collectives of start -> observed completion */
} RtStepComm;

void rt_comm_step_begin(void);
/* After the step function returned: completes the step's last sends, and
 * fails if a bucket started and was never waited for (a broken program).
 * c (may be NULL) gets the step's times. */
bool rt_comm_step_end(RtStepComm *c, RtErr *e);

/* --check-replicas: collective; every rank hashes the bytes of each of its
 * parameters (FNV-1a) and compares them with those of the other replicas
 * of its stage.  Returns false on every rank, with an `every` error in e,
 * when any differ. */
bool rt_comm_check_replicas(const RtMeta *m, const char *arena, RtErr *e);

/* ---- the stages of a run: rt_stage.c ---------------------------------------
 *
 * What --save and the metrics need from the layout (RtLayout): the
 * parameters of every stage, and which rank runs which stage. */

/* Collective: every parameter reaches rank 0, packed into *buf (with one
 * stage, rank 0 copies its own); rank 0's *view is m with those
 * parameters (offsets into *buf), for --save. */
bool rt_stage_gather_params(const RtMeta *m, const char *arena, RtMeta *view, char **buf, RtErr *e);
/* Collective: rank 0 adds a line to the metrics with every rank's stage,
 * replica and planned peak activation bytes. */
struct RtLog;
void rt_stage_report(struct RtLog *l, const RtMeta *m);
/* The same for the optimizer state (layout.all_state), for checkpoints:
 * rank 0's layout.all_state offsets then point into *buf. */
void rt_stage_gather_state(const RtMeta *m, const char *arena, char **buf);
/* m with every parameter of every stage (offsets unset), for checks. */
void rt_stage_save_view(const RtMeta *m, RtMeta *view);

/* ---- threads: rt_pool.c ---------------------------------------------------
 *
 * The workers behind cleave_rt_parallel (rt_abi.h), for programs compiled
 * with --threads T ("threads" in the metadata). */

#define RT_MAX_THREADS 64

/* Starts threads - 1 workers (none for 1), once, before the first step;
 * false with an error in e when the system refuses a thread. */
bool rt_pool_start(int threads, RtErr *e);
/* Joins the workers; cleave_rt_parallel then runs everything on the caller. */
void rt_pool_stop(void);
/* Threads cleave_rt_parallel runs a task on (1 without a pool). */
int rt_pool_threads(void);

/* ---- placement: rt_bind.c -------------------------------------------------
 *
 * On a node with more ranks than CPUs, each rank's thread is pinned round
 * robin to the CPUs the node's ranks may use, as the cost model assumes. */

/* Collective over every rank; pins only when `enabled` (not --no-bind). */
void rt_bind_ranks(bool enabled);
/* The CPU this rank's thread was pinned to, or -1 when it was not. */
int rt_bind_cpu(void);

/* ---- --timeout: rt_watchdog.c ---------------------------------------------
 *
 * A thread that ends the process when the main thread has waited for other
 * ranks longer than the time-out; mpirun then ends every rank.  Every
 * blocking MPI call that waits for another rank is marked.  The marks are
 * a few stores, cheap enough for every wait of a step, and do nothing
 * while no watchdog runs. */

#define RT_TIMEOUT_DEFAULT 300.0 /* seconds, --timeout's default */

/* Whom a wait is for, when not one rank (peer >= 0). */
#define RT_WATCH_EVERY (-1)    /* every rank */
#define RT_WATCH_REPLICAS (-2) /* the replicas of this rank's stage */
#define RT_WATCH_STAGES (-3)   /* the stages of this rank's replica */

/* Starts the watchdog of a run (nothing for timeout 0, or when one runs);
 * prog and rank name the process in its message. */
bool rt_watch_start(double timeout, const char *prog, int rank, RtErr *e);
/* Stops and joins it; the marks then do nothing. */
void rt_watch_stop(void);
/* A blocking wait begins: the message reads "for WHAT[ ARG] rank PEER" or
 * "for WHAT[ ARG] over GROUP" (peer one of RT_WATCH_*); `what` must be a
 * string that outlives the wait (a literal), arg < 0 for none. */
void rt_watch_begin(const char *what, int arg, int peer);
void rt_watch_end(void);
/* Where the run is: inside 1-based step `step`, or in a phase outside the
 * steps ("start-up", "evaluation", "saving": a literal), which the message
 * names with the last step begun, if any. */
void rt_watch_step(int64_t step);
void rt_watch_phase(const char *phase);
/* The layout, to name a group by its stage or replica. */
void rt_watch_layout(int stages, int stage, int replica);

/* ---- traces: rt_trace.c ---------------------------------------------------- */

/* Event kinds; the first three are the units of cleave_rt_unit. */
enum { RT_EV_FORWARD, RT_EV_BACKWARD, RT_EV_UPDATE, RT_EV_COMPUTE, RT_EV_RECV, RT_EV_SEND, RT_EV_ALLREDUCE,
       RT_EV_STEP, RT_EV_SYNC };

/* Collective when on (a barrier sets the common time origin). */
void rt_trace_start(bool on);
void rt_trace_step_begin(int64_t step);
void rt_trace_unit(int kind, int32_t micro);
/* Around a blocking wait: returns now; the end records the wait as an
 * event of `kind` and returns its length in seconds.  Cheap when off. */
double rt_trace_wait_begin(void);
double rt_trace_wait_end(int kind, double t0);
void rt_trace_step_end(void);
/* Collective: rank 0 writes every rank's events to path. */
bool rt_trace_write(const char *path, const RtMeta *m, int64_t steps, RtErr *e);

/* ---- learning-rate schedules: rt_schedule.c ------------------------------ */

/* The factor of the base learning rate for the optimizer step that follows
 * `k` earlier steps (k = 0 for the first) of a run of `total` steps, as
 * transformers' get_{constant,linear,cosine}_schedule_with_warmup give it
 * to torch's LambdaLR, stepped after every optimizer step. */
double rt_lr_factor(RtLrSchedule s, int64_t warmup, int64_t total, int64_t k);
/* The schedule's name as the flags spell it, and its parse (false: none). */
const char *rt_lr_schedule_name(RtLrSchedule s);
bool rt_lr_schedule_parse(const char *name, RtLrSchedule *s);

/* ---- command line: rt_args.c --------------------------------------------- */

typedef struct RtNamedFile {
    const char *name; /* input name, points into argv */
    const char *path;
} RtNamedFile;

typedef struct RtArgs {
    RtNamedFile *data;
    int n_data;
    RtNamedFile *eval;
    int n_eval;
    int64_t steps;  /* > 0 with --steps */
    int64_t epochs; /* > 0 with --epochs */
    bool has_lr;
    float lr;
    bool has_lr_schedule, has_warmup; /* --lr-schedule, --warmup-steps */
    RtLrSchedule lr_schedule;
    int64_t warmup_steps;
    bool shuffle;
    uint64_t seed;      /* --shuffle's */
    bool has_mask_seed;
    uint64_t mask_seed; /* --seed: the dropout masks' key */
    const char *metrics, *save, *predict, *trace;
    int64_t log_every; /* 0: only the final line */
    bool check_replicas;
    bool no_bind; /* --no-bind: leave oversubscribed ranks unpinned (rt_bind.c) */
    double timeout; /* --timeout: seconds a rank waits for another before every
                       rank stops (rt_watchdog.c); 0: no limit */
    bool help;
    /* --calibrate-comm OUT.json (rt_calibrate.c): time messages, no
     * training; no other option may be given with it */
    const char *calibrate_comm;
    const char *checkpoint, *resume; /* --checkpoint DIR, --resume DIR */
    int64_t checkpoint_every;        /* 0: once an epoch */
    int64_t checkpoint_keep;         /* default 2 */
} RtArgs;

bool rt_args_parse(int argc, char **argv, RtArgs *a, RtErr *e);
void rt_args_free(RtArgs *a);
void rt_args_usage(FILE *out, const RtMeta *m_or_null);
/* Gives each input of m its file from `files` (given with `flag`): paths[k]
 * is the file of m->inputs[k].  Unknown, missing and repeated names fail. */
bool rt_args_bind(const RtMeta *m, const RtNamedFile *files, int n, const char *flag,
                  const char **paths, RtErr *e);
/* Fails now, before training, when `path` could not be created later. */
bool rt_args_check_writable(const char *flag, const char *path, RtErr *e);
/* Refuses an output file (--save, --predict, --metrics, --trace) that is
 * one of the --data or --eval-data files, or another output: before any
 * step runs, so that no run destroys its own input. */
bool rt_args_check_outputs(const RtArgs *a, RtErr *e);
/* A hash of the flags every rank must agree on, since they decide how many
 * steps and collectives run or what the replicas compute: --steps,
 * --epochs, --shuffle, --lr, --lr-schedule, --warmup-steps, --eval-data
 * given, --predict given, --check-replicas; and --timeout, so that no rank
 * gives up sooner than the others were told to wait. */
uint64_t rt_args_fingerprint(const RtArgs *a);

/* ---- --calibrate-comm: rt_calibrate.c ------------------------------------ */

/* Collective over every rank, in place of a run: ranks 0 and 1 time a
 * ping-pong and rank 0 writes to path {"latency_s", "bandwidth_gbps",
 * "same_node", "hosts", "ranks", "points"}.  Fails on every rank (an
 * `every` error) with fewer than 2 ranks or when path cannot be written. */
bool rt_calibrate_comm(const char *path, RtErr *e);

/* ---- data files: rt_data.c, rt_npy.c, rt_idx.c --------------------------- */

/* Element types a data file may hold. */
typedef enum {
    RT_E_F32, RT_E_F64, RT_E_I8, RT_E_I16, RT_E_I32, RT_E_I64,
    RT_E_U8, RT_E_U16, RT_E_U32, RT_E_U64, RT_E_BOOL,
} RtElem;

#define RT_FILE_MAX_DIMS 32

/* A decoded file before conversion: what the header says, and where the
 * elements are inside the file's bytes. */
typedef struct RtRaw {
    RtElem elem;
    bool idx; /* IDX unsigned bytes: scaled by 1/255 when feeding float32 */
    int ndim;
    int64_t dims[RT_FILE_MAX_DIMS];
    size_t payload_offset;
    size_t payload_bytes;
} RtRaw;

/* One input's rows, converted to the input's dtype and loaded in full. */
typedef struct RtArray {
    const char *path;
    RtDType dtype;
    int64_t rows;
    int64_t row_elems;
    size_t row_bytes;
    void *data;
} RtArray;

const char *rt_elem_name(RtElem t);
size_t rt_elem_size(RtElem t);

/* Decode the header of a whole file held in buf (path names it in errors). */
bool rt_npy_parse(const uint8_t *buf, size_t len, const char *path, RtRaw *raw, RtErr *e);
bool rt_idx_parse(const uint8_t *buf, size_t len, const char *path, RtRaw *raw, RtErr *e);
/* Writes a float32 C-order .npy file (version 1.0). */
bool rt_npy_write(const char *path, const float *data, int ndim, const int64_t *shape, RtErr *e);

/* Reads path (.npy or IDX, plain or gzip) to feed `in`: checks the row shape
 * and converts the elements to in->dtype where no information is lost. */
bool rt_data_load(const char *path, const RtTensor *in, RtArray *out, RtErr *e);
/* Converts an already read file (buf, len, owned by the callee on success
 * and on failure) the same way; rt_data_load's second half. */
bool rt_data_decode(uint8_t *buf, size_t len, const char *path, const RtTensor *in, RtArray *out,
                    RtErr *e);
void rt_array_free(RtArray *a);
/* Every label must lie in [0, classes) or, with has_ignore, equal
 * ignore_index. */
bool rt_labels_check(const RtArray *labels, const RtMeta *m, RtErr *e);

/* ---- batch order and filling the input slots: rt_batch.c ----------------- */

/* splitmix64 (Steele, Lea, Flood 2014): the one generator behind --shuffle. */
uint64_t rt_splitmix64(uint64_t *state);

/* The row order of one epoch over n rows: identity, or the documented shuffle. */
typedef struct RtOrder {
    int64_t n;
    bool shuffle;
    uint64_t seed;
    int64_t *perm; /* NULL without shuffle: row k is row k */
} RtOrder;

bool rt_order_init(RtOrder *o, int64_t n, bool shuffle, uint64_t seed, RtErr *e);
/* Sets the order of epoch `epoch` (0-based); allocates nothing. */
void rt_order_epoch(RtOrder *o, int64_t epoch);
void rt_order_free(RtOrder *o);
/* File row feeding row r (0 <= r < batch) of step `step` of the epoch. */
int64_t rt_batch_row(const RtOrder *o, int64_t batch, int64_t step, int64_t r);
/* The labels of the B-row batch `step` of order o that count: not equal to
 * m->ignore_index (every one without has_ignore). */
int64_t rt_labels_counted(const RtOrder *o, const RtArray *labels, const RtMeta *m, int64_t step);
/* Copies rows [r0, r1) of the global batch of `step` (0-based within the
 * epoch) of every data[k] into slot slots[k]; global row r lands at position
 * r - r0, so a rank that owns a share of the batch passes its own range;
 * a positions slot (RtTensor.positions) gets r itself. */
void rt_batch_fill(const RtOrder *o, const RtTensor *slots, const RtArray *data, int n,
                   int64_t batch, int64_t step, int64_t r0, int64_t r1, char *arena);

/* ---- metrics, progress and log lines: rt_metrics.c ----------------------- */

#define RT_METRICS_BUF 65536

typedef struct RtLog {
    OutFile metrics_out; /* --metrics, written beside its target until the end */
    FILE *metrics;      /* JSON Lines (metrics_out.f), rank 0 with --metrics only */
    char *metrics_buf;  /* its stdio buffer, RT_METRICS_BUF bytes */
    const char *metrics_path;
    bool quiet;         /* ranks other than 0 print nothing */
    bool tty;           /* progress bar instead of log lines */
    int64_t total, batch, log_every;
    double t_start, t_mark, t_drawn;
    int64_t step_mark;
    int64_t start;      /* steps done before this run (--resume) */
} RtLog;

/* Current time in seconds (monotonic). */
double rt_now(void);
bool rt_log_open(RtLog *l, const char *metrics_path, bool quiet, bool tty, int64_t total,
                 int64_t batch, int64_t log_every, RtErr *e);
/* loss: the global batch's mean loss; comm: the step's communication
 * times (programs of several ranks), NULL for none. */
void rt_log_step(RtLog *l, int64_t step, double loss, float lr, double step_seconds, const RtStepComm *comm);
void rt_log_eval(RtLog *l, int64_t epoch, double eval_loss, bool has_accuracy, double accuracy);
/* Closes the metrics file and puts it in place (reporting a failed write),
 * and ends the bar. */
bool rt_log_close(RtLog *l, RtErr *e);
/* On the way out of a failed run: puts the lines logged so far in place,
 * as they tell what went wrong, without reporting a failure to. */
void rt_log_discard(RtLog *l);
/* Ends an open progress bar line so an error message starts on its own line. */
void rt_log_break_line(void);

/* ---- training: rt_train.c ------------------------------------------------ */

/* What the generated object provides (rt_abi.h), gathered by main(). */
typedef struct RtProgram {
    const char *meta;
    size_t meta_len;
    const unsigned char *init;
    const unsigned char *model;
    size_t model_len;
    void (*train_step)(char *arena);
    void (*eval_step)(char *arena);
    int32_t *program; /* which stage's program of the module runs (cleave_program) */
} RtProgram;

typedef struct RtRun {
    const RtProgram *prog;
    const RtMeta *meta;
    char *arena; /* this rank computes rows [replica * local_batch, +local_batch)
                    of every global batch (meta->layout) */
    RtArray *train; /* one per meta input */
    int64_t train_rows;
    RtArray *eval;  /* NULL without --eval-data */
    int64_t eval_rows;
    RtOrder order;
    float lr; /* the base learning rate the schedule scales */
    RtLrSchedule lr_schedule;
    int64_t warmup_steps;
    int64_t total_steps;
    bool predict_on; /* --predict given (on every rank) */
    float *predict;  /* rank 0 with --predict: [eval_rows, output row] */
    float *gathered; /* rank 0 of a run on several ranks with --predict:
                        every rank's output rows of one batch,
                        [ranks * local_batch, output row] */
    float *zeros;    /* what ranks without the output send instead */
    uint64_t mask_seed;  /* --seed, which a checkpoint records */
    int64_t start_step;  /* steps done before this run: 0, or a checkpoint's */
    const struct RtCheckpoint *ckpt; /* NULL without --checkpoint */
    int stop_signal;     /* set when a SIGTERM or SIGINT stopped the run */
    RtLog log;
} RtRun;

typedef struct RtEvalResult {
    double loss;     /* mean over the full global batches */
    double accuracy; /* ce only */
    bool has_accuracy;
} RtEvalResult;

int64_t rt_steps_per_epoch(int64_t rows, int64_t batch);
/* Runs every step, and the evaluations after each epoch and at the end. */
bool rt_train_run(RtRun *r, RtErr *e);
/* One pass over the eval rows; fills r->predict (rank 0) when `predict` is
 * set.  Collective in a program of several ranks. */
void rt_eval_run(RtRun *r, bool predict, RtEvalResult *out);

/* ---- checkpoints: rt_checkpoint.c, rt_resume.c (docs/checkpoint.md) ------ */

typedef struct RtCheckpoint {
    const char *dir;     /* --checkpoint DIR, NULL for none (resume only) */
    int64_t every;       /* steps between checkpoints (and one at the end) */
    int keep;            /* checkpoints kept in DIR, the newest */
    const RtProgram *prog;
    uint64_t model_hash; /* rt_save_model_hash, rank 0 */
} RtCheckpoint;

/* Collective: every rank's tensors reach rank 0, which writes the
 * checkpoint of `step` (steps done) to c->dir.  False on every rank when
 * it could not be written; the previous checkpoints are then as they
 * were. */
bool rt_ckpt_write(const RtCheckpoint *c, const RtRun *r, int64_t step, RtErr *e);
/* Collective: rank 0 reads the checkpoint DIR/latest names (or, when it is
 * damaged, the newest intact one, with a warning), refuses one of another
 * model, batch, optimizer, learning rate or data order, and every rank
 * copies the parameters and optimizer state it holds into r->arena and
 * sets r->start_step.  Needs r's data loaded and arena initialised. */
bool rt_ckpt_resume(const RtCheckpoint *c, const char *dir, RtRun *r, RtErr *e);

/* ---- stopping on a signal: rt_signal.c ----------------------------------- */

/* SIGTERM and SIGINT set a flag rather than end the process: the run
 * stops after its current step (rt_train.c), writes a checkpoint and
 * exits.  A second one ends the process at once, as without handlers. */
void rt_signal_install(void);
/* The signal received so far (0: none). */
int rt_signal_pending(void);

/* ---- --save: rt_save.c --------------------------------------------------- */

uint16_t rt_f32_to_f16(float f);
uint16_t rt_f32_to_bf16(float f);
float rt_f16_to_f32(uint16_t h);
/* Checks that every parameter has an initializer the trained values can be
 * written into; run before training so a mismatch costs no training time. */
bool rt_save_check(const RtProgram *p, const RtMeta *m, RtErr *e);
/* Writes the embedded model with every parameter replaced by its value in
 * the arena. */
bool rt_save_write(const char *path, const RtProgram *p, const RtMeta *m, const char *arena,
                   RtErr *e);
/* The bytes rt_save_write writes, in *bytes (the caller frees them). */
bool rt_save_pack(const RtProgram *p, const RtMeta *m, const char *arena, uint8_t **bytes, size_t *len, RtErr *e);
/* FNV-1a of the embedded model without the parameters' values: the same
 * for every program compiled from one model file, whatever its plan. */
bool rt_save_model_hash(const RtProgram *p, const RtMeta *m, uint64_t *hash, RtErr *e);

#endif
