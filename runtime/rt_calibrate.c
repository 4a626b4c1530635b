/* rt_calibrate.c - --calibrate-comm OUT.json: instead of training, every
 * pair of ranks in turn times a ping-pong of messages and rank 0 writes
 * the point-to-point cost it fits for each pair, for `cleave calibrate`
 * (the compiler is not an MPI program, so it measures MPI through a
 * generated one).  Under `mpirun --map-by node` with one rank per node,
 * the pairs are the links between the nodes.
 *
 * The probe is sized by the link it measures: small messages (8 B to
 * 4 KiB) set the latency; then messages from 64 KiB double while one
 * takes less than CAL_TARGET_S, up to CAL_MAX_BYTES, each size repeated
 * about CAL_SIZE_S worth (at least CAL_MIN_TRIPS round trips).  A
 * shared-memory link reaches the largest size in a fraction of a second;
 * a 100 Mbit/s link stops at 1 MiB after about five seconds, where a
 * fixed probe of 2 GB would take minutes.  The first rank of a pair
 * decides each size and tells the second, so the two never disagree.
 *
 * The fit is the cost model's own: one message of B bytes takes
 * latency + B / bandwidth (docs/cluster.md); fit_relative (within a node)
 * and fit_link (between nodes) say how each is read.
 *
 * Then the pair sums a buffer together, as the gradient allreduces do:
 * MPI_Allreduce and MPI_Iallreduce + MPI_Wait over a communicator of the
 * two, of a buffer of about CAL_AR_S at the bandwidth just fitted.  Two
 * ranks that sum send the buffer both ways at once, which a ping-pong
 * never does, and over TCP each direction's acknowledgements then queue
 * behind the other's data: on two test hosts at 100 Mbit/s a sum of 1 MB
 * took from 1.0 to 1.5 times what its bytes need at the ping-pong's rate.
 * The slower of the two calls' medians (the programs use both) gives the
 * link's allreduce bandwidth.
 *
 * Last, the first rank times its MPI_Isend calls alone, of a small and of
 * a large message, each sent after the one before was received, on
 * caches a walk has just evicted, to a receiver busy outside MPI when it
 * comes: Open MPI's TCP transport writes a
 * message below its eager limit into the socket inside the call, and
 * between two hosts of one machine the kernel carries it into the
 * receiver's socket there as well, which is time the sender's core does
 * not compute (send_overhead_s and send_gbps of the link, docs/cluster.md).
 * The ping-pong's one-way time holds it too, but cannot tell the
 * sender's part from the receiver's. */
#include <errno.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"
#include "rt_mpi.h"

#define CAL_MIN_BYTES 8
#define CAL_SMALL_BYTES 4096          /* the latency's sizes: 8 B .. 4 KiB */
#define CAL_LARGE_BYTES (64 << 10)    /* the bandwidth's sizes start here */
#define CAL_MAX_BYTES (16 << 20)
#define CAL_MAX_POINTS 32
#define CAL_REPEATS 3                 /* best of: the least disturbed run of each size */
#define CAL_TARGET_S 0.05             /* a message this long times the bandwidth well */
#define CAL_SIZE_S 0.05               /* round trips of one size take about this */
#define CAL_MIN_TRIPS 4
#define CAL_AR_S 0.1                  /* an allreduce of about this long ... */
#define CAL_AR_MIN_BYTES (256 << 10)  /* ... and of at least this many bytes */
#define CAL_AR_REPEATS 7              /* median of */
#define CAL_SEND_SMALL 64             /* the send call's fixed cost: a message of this size ... */
#define CAL_SEND_LARGE (60 << 10)     /* ... and its cost per byte, up to this (below TCP's eager limit) */
#define CAL_SEND_REPEATS 31           /* median of */
#define CAL_SEND_BUSY_S 1e-3          /* the receiver computes this long around each send */

typedef struct Point {
    double bytes, seconds; /* one-way time of one message */
} Point;

/* One pair's measurement. */
typedef struct PairResult {
    int a, b;
    double alpha, beta;
    bool same_node;
    Point p[CAL_MAX_POINTS];
    int n;
    /* the pair's allreduce: its bytes, and the median seconds of
     * MPI_Allreduce and of MPI_Iallreduce + MPI_Wait */
    double ar_bytes, ar_s, iar_s;
    /* the sender's time inside MPI_Isend: send_o + B send_beta */
    double send_o, send_beta;
} PairResult;

/* Rank a's one-way time of a `bytes` message to b and back, the best of
 * CAL_REPEATS runs of `trips` round trips; b echoes (and gets 0).  A run
 * ends early once it has taken 2 CAL_SIZE_S: the first byte of each
 * message says whether another follows.  The trips are sized on a first
 * look, and two ranks that come to share one core (mpirun's ranks are not
 * bound on the test cluster, and the machine may be busy) can find each
 * round trip a scheduler tick (4 ms) long after a first look of
 * microseconds: 2000 trips of every size then took the intra-node probe
 * past its time limit. */
static double ping_pong(MPI_Comm c, int me, int a, int b, char *buf, int bytes, int trips) {
    double best = 0;
    for (int rep = 0; rep < CAL_REPEATS; rep++) {
        double t0 = MPI_Wtime();
        int done = 0;
        if (me == a) {
            for (bool more = true; more;) {
                more = ++done < trips && MPI_Wtime() - t0 < 2 * CAL_SIZE_S;
                buf[0] = more;
                MPI_Send(buf, bytes, MPI_BYTE, b, 0, c);
                MPI_Recv(buf, bytes, MPI_BYTE, b, 0, c, MPI_STATUS_IGNORE);
            }
        } else {
            do {
                MPI_Recv(buf, bytes, MPI_BYTE, a, 0, c, MPI_STATUS_IGNORE);
                MPI_Send(buf, bytes, MPI_BYTE, a, 0, c);
            } while (buf[0]);
        }
        double t = me == a ? (MPI_Wtime() - t0) / done / 2 : 0;
        if (rep == 0 || t < best) best = t;
    }
    return best;
}

/* Round trips that take about CAL_SIZE_S at `seconds` one way. */
static int trips_for(double seconds) {
    double n = seconds > 0 ? CAL_SIZE_S / (2 * seconds) : 2000;
    return n < CAL_MIN_TRIPS ? CAL_MIN_TRIPS : n > 2000 ? 2000 : (int)n;
}
/* Between ranks of one node: minimises sum ((alpha + beta B - t) / t)^2,
 * a least-squares fit in relative error, so that the 8-byte points (which
 * decide the latency) and the megabyte points (which decide the
 * bandwidth) weigh the same; shared memory's rate changes with the size
 * (messages in cache or not), and this weighs all the sizes a step's
 * messages have.  Falls back to the smallest
 * message's time as alpha and the largest's rate as 1 / beta when the fit
 * gives a negative term (noise on a link whose latency is near zero). */
static void fit_relative(const Point *p, int n, double *alpha, double *beta) {
    double s0 = 0, s1 = 0, s2 = 0, r0 = 0, r1 = 0;
    for (int i = 0; i < n; i++) {
        double w = 1 / (p[i].seconds * p[i].seconds);
        s0 += w;
        s1 += w * p[i].bytes;
        s2 += w * p[i].bytes * p[i].bytes;
        r0 += w * p[i].seconds;
        r1 += w * p[i].seconds * p[i].bytes;
    }
    double det = s0 * s2 - s1 * s1;
    *alpha = det > 0 ? (r0 * s2 - r1 * s1) / det : -1;
    *beta = det > 0 ? (s0 * r1 - s1 * r0) / det : -1;
    if (*alpha < 0 || *beta <= 0) {
        *alpha = p[0].seconds;
        double extra = p[n - 1].seconds - p[0].seconds;
        *beta = (extra > 0 ? extra : p[n - 1].seconds) / p[n - 1].bytes;
    }
}

/* Between nodes: alpha the least time of the tiny messages (up to 64 B,
 * whose bytes take no time to speak of), beta the time per byte between
 * the two largest messages (each of the bandwidth's sizes is twice the one
 * before).  A slope between large messages leaves out what sets a
 * message's first bytes apart from the rest: a link shaped by a token
 * bucket passes the bucket's credit at once, and a ping-pong of messages
 * smaller than the bucket finds it refilled during the reply, so that on
 * the test cluster 4 KiB messages seemed to cross a 100 Mbit/s link at
 * 190 Mbit/s, and the relative fit through all the points said 182
 * (docs/testcluster.md).  Falls back to the largest message's rate when
 * the slope is not positive (noise on large messages that take the same
 * time). */
static void fit_link(const Point *p, int n, double *alpha, double *beta) {
    *alpha = p[0].seconds;
    for (int i = 1; i < n && p[i].bytes <= 64; i++)
        if (p[i].seconds < *alpha) *alpha = p[i].seconds;
    *beta = 0;
    if (n >= 2 && p[n - 2].bytes >= CAL_LARGE_BYTES)
        *beta = (p[n - 1].seconds - p[n - 2].seconds) / (p[n - 1].bytes - p[n - 2].bytes);
    if (!(*beta > 0)) *beta = p[n - 1].seconds / p[n - 1].bytes;
}

static double allreduce_gbps(const PairResult *r);

/* A pair's point list, as JSON. */
static void write_points(FILE *f, const PairResult *r) {
    fprintf(f, "[");
    for (int i = 0; i < r->n; i++) fprintf(f, "%s[%.0f, %.6e]", i ? ", " : "", r->p[i].bytes, r->p[i].seconds);
    fprintf(f, "]");
}

/* Rank 0's file: the pair of ranks 0 and 1 at the top level, as it has
 * always been, and every pair under "pairs". */
static bool write_result(const char *path, const PairResult *r, int n_pairs, char (*names)[MPI_MAX_PROCESSOR_NAME + 1],
                         RtErr *e) {
    OutFile out;
    int err = out_file_open(&out, path);
    if (err) return rt_error(e, "--calibrate-comm %s: cannot write: %s", path, out_file_why(err));
    FILE *f = out.f;
    fprintf(f, "{\"latency_s\": %.6e, \"bandwidth_gbps\": %.6g, \"same_node\": %s,\n", r[0].alpha, 1e-9 / r[0].beta,
            r[0].same_node ? "true" : "false");
    /* Host names are what MPI reports: letters, digits, dots and dashes. */
    fprintf(f, " \"hosts\": [\"%s\", \"%s\"], \"ranks\": %d,\n \"points\": ", names[0], names[1], rt_ranks());
    write_points(f, &r[0]);
    fprintf(f, ",\n \"pairs\": [");
    for (int i = 0; i < n_pairs; i++) {
        fprintf(f, "%s\n  {\"ranks\": [%d, %d], \"hosts\": [\"%s\", \"%s\"], \"same_node\": %s, \"latency_s\": %.6e, "
                "\"bandwidth_gbps\": %.6g,\n   \"allreduce\": {\"bytes\": %.0f, \"allreduce_s\": %.6e, "
                "\"iallreduce_s\": %.6e}, \"allreduce_gbps\": %.6g,\n   \"send_overhead_s\": %.6e, \"send_gbps\": %.6g, "
                "\"points\": ", i ? "," : "", r[i].a, r[i].b, names[r[i].a], names[r[i].b],
                r[i].same_node ? "true" : "false", r[i].alpha, 1e-9 / r[i].beta, r[i].ar_bytes, r[i].ar_s, r[i].iar_s,
                allreduce_gbps(&r[i]), r[i].send_o, r[i].send_beta > 0 ? 1e-9 / r[i].send_beta : 0.0);
        write_points(f, &r[i]);
        fprintf(f, "}");
    }
    fprintf(f, "\n ]}\n");
    err = out_file_finish(&out);
    if (err) return rt_error(e, "--calibrate-comm %s: write failed: %s", path, out_file_why(err));
    return true;
}

/* Ranks a and b time their link (every other rank returns at once); on
 * rank a, r gets the points and the fit.  a picks each size and sends it
 * to b first (0: done). */
static void measure_pair(MPI_Comm c, int me, int a, int b, bool same_node, char *buf, PairResult *r) {
    if (me != a && me != b) return;
    r->n = 0;
    for (int bytes = CAL_MIN_BYTES;;) {
        int next = bytes;
        if (me == a) MPI_Send(&next, 1, MPI_INT, b, 1, c);
        else MPI_Recv(&next, 1, MPI_INT, a, 1, c, MPI_STATUS_IGNORE);
        if (next == 0) break;
        /* a first look with a few round trips sizes the timed run */
        double guess = ping_pong(c, me, a, b, buf, next, 1);
        int trips = 0;
        if (me == a) trips = trips_for(guess);
        if (me == a) MPI_Send(&trips, 1, MPI_INT, b, 2, c);
        else MPI_Recv(&trips, 1, MPI_INT, a, 2, c, MPI_STATUS_IGNORE);
        double t = ping_pong(c, me, a, b, buf, next, trips);
        if (me != a) continue;
        r->p[r->n++] = (Point){next, t};
        /* the next size: double the small ones up to 4 KiB, then jump to
         * the large ones, doubling while a message is quicker than the
         * target and the points and the buffer allow */
        if (next < CAL_SMALL_BYTES) bytes = next * 2;
        else if (next < CAL_LARGE_BYTES) bytes = CAL_LARGE_BYTES;
        else bytes = t < CAL_TARGET_S && next < CAL_MAX_BYTES && r->n < CAL_MAX_POINTS ? next * 2 : 0;
        if (bytes == 0) {
            int stop = 0;
            MPI_Send(&stop, 1, MPI_INT, b, 1, c);
            break;
        }
    }
    if (me == a && same_node) fit_relative(r->p, r->n, &r->alpha, &r->beta);
    else if (me == a) fit_link(r->p, r->n, &r->alpha, &r->beta);
}

static int by_seconds(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Ranks a and b sum a buffer over pc, their own communicator (every other
 * rank returns at once): a picks the size from the bandwidth it fitted
 * and tells b; on rank a, r gets the medians. */
static void measure_allreduce(MPI_Comm c, MPI_Comm pc, int me, int a, int b, char *buf, PairResult *r) {
    if (me != a && me != b) return;
    int count = 0;
    if (me == a) {
        double bytes = CAL_AR_S * (r->beta > 0 ? 1 / r->beta : 1e9);
        if (bytes < CAL_AR_MIN_BYTES) bytes = CAL_AR_MIN_BYTES;
        if (bytes > CAL_MAX_BYTES) bytes = CAL_MAX_BYTES;
        count = (int)(bytes / sizeof(float));
        MPI_Send(&count, 1, MPI_INT, b, 4, c);
    } else {
        MPI_Recv(&count, 1, MPI_INT, a, 4, c, MPI_STATUS_IGNORE);
    }
    /* zeros, the same in every run: the ping-pong left its flags in the
     * buffer (denormal floats, which some cores add slowly) */
    memset(buf, 0, (size_t)count * sizeof(float));
    double t[2][CAL_AR_REPEATS];
    /* the first sum of each call sets up its connections and buffers */
    for (int rep = -1; rep < CAL_AR_REPEATS; rep++)
        for (int k = 0; k < 2; k++) {
            MPI_Barrier(pc);
            double t0 = MPI_Wtime();
            if (k == 0) {
                MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, pc);
            } else {
                MPI_Request q;
                MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, pc, &q);
                MPI_Wait(&q, MPI_STATUS_IGNORE);
            }
            if (rep >= 0) t[k][rep] = MPI_Wtime() - t0;
        }
    for (int k = 0; k < 2; k++) qsort(t[k], CAL_AR_REPEATS, sizeof t[k][0], by_seconds);
    r->ar_bytes = (double)count * sizeof(float);
    r->ar_s = t[0][CAL_AR_REPEATS / 2];
    r->iar_s = t[1][CAL_AR_REPEATS / 2];
}

/* Walks a buffer four times this core's L2 cache (8 MiB when it cannot be
 * told), as a step's kernels between two sends do. */
static void evict_caches(void) {
    static unsigned char *junk;
    static size_t n;
    if (!junk) {
        long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        n = l2 > 0 && l2 <= (32L << 20) ? 4 * (size_t)l2 : (size_t)8 << 20;
        junk = calloc(n, 1);
        if (!junk) return;
    }
    for (size_t i = 0; i < n; i += 64) junk[i]++;
}

/* Rank a's median seconds inside MPI_Isend of `bytes` to b, each message
 * sent once b has received the one before (b answers each with an empty
 * message), so that every call finds the link idle, and after walking a
 * buffer that evicts the caches: in a step a send follows kernels that
 * have, and the system call's code and data then come from memory.  On
 * the test cluster (unshaped) a 16 KiB send took 6 us called again and
 * again to a receiver waiting in MPI, 13-15 us as here, and 40-80 us
 * inside the 16-layer MLP's pipeline steps, which this probe does not
 * reproduce (docs/costmodel.md). */
static double send_call_seconds(MPI_Comm c, int me, int a, int b, char *buf, int bytes) {
    double t[CAL_SEND_REPEATS];
    /* the first calls set up the connection's buffers */
    for (int rep = -3; rep < CAL_SEND_REPEATS; rep++) {
        if (me == a) {
            MPI_Request q;
            evict_caches();
            double t0 = MPI_Wtime();
            MPI_Isend(buf, bytes, MPI_BYTE, b, 6, c, &q);
            double dt = MPI_Wtime() - t0;
            MPI_Wait(&q, MPI_STATUS_IGNORE);
            MPI_Recv(NULL, 0, MPI_BYTE, b, 7, c, MPI_STATUS_IGNORE);
            if (rep >= 0) t[rep] = dt;
        } else {
            /* busy outside MPI while the message comes, as a stage computing
             * its micro-batch is (then the sender's kernel also hands the
             * message to b's socket and takes its acknowledgement) */
            for (double t0 = MPI_Wtime(); MPI_Wtime() - t0 < CAL_SEND_BUSY_S;) evict_caches();
            MPI_Recv(buf, bytes, MPI_BYTE, a, 6, c, MPI_STATUS_IGNORE);
            MPI_Send(NULL, 0, MPI_BYTE, a, 7, c);
        }
    }
    if (me != a) return 0;
    qsort(t, CAL_SEND_REPEATS, sizeof t[0], by_seconds);
    return t[CAL_SEND_REPEATS / 2];
}

/* The sender's cost per message and per byte on the pair's link (every
 * other rank returns at once); on rank a, in r.  A per-byte cost that
 * comes out negative (noise) is taken as none. */
static void measure_send(MPI_Comm c, int me, int a, int b, char *buf, PairResult *r) {
    if (me != a && me != b) return;
    double small = send_call_seconds(c, me, a, b, buf, CAL_SEND_SMALL);
    double large = send_call_seconds(c, me, a, b, buf, CAL_SEND_LARGE);
    if (me != a) return;
    r->send_o = small;
    r->send_beta = large > small ? (large - small) / (CAL_SEND_LARGE - CAL_SEND_SMALL) : 0;
}

/* The bandwidth a pair's allreduce reached, as the cost model prices a
 * ring of two: 2 (alpha + B / 2 / bw) for B bytes; the slower call. */
static double allreduce_gbps(const PairResult *r) {
    double s = r->ar_s > r->iar_s ? r->ar_s : r->iar_s, moving = s - 2 * r->alpha;
    return moving > 0 ? r->ar_bytes / moving / 1e9 : 1e-9 / r->beta;
}

bool rt_calibrate_comm(const char *path, RtErr *e) {
    if (rt_ranks() < 2)
        return rt_error_all(e, "--calibrate-comm times messages between ranks: run it under mpirun -np 2 or more "
                               "(it runs on 1 rank)");
    int rank = rt_rank(), n = rt_ranks();
    if (rank == 0) rt_args_check_writable("--calibrate-comm", path, e);
    if (!rt_comm_agree(e)) return false;

    MPI_Comm c = rt_comm_world();
    char (*names)[MPI_MAX_PROCESSOR_NAME + 1] = calloc((size_t)n, sizeof *names);
    char *buf = calloc(CAL_MAX_BYTES, 1);
    int n_pairs = n * (n - 1) / 2;
    PairResult *r = calloc((size_t)n_pairs, sizeof *r);
    if (!names || !buf || !r) rt_error(e, "out of memory for a %d-byte message and %d pairs", CAL_MAX_BYTES, n_pairs);
    if (!rt_comm_agree(e)) {
        free(names);
        free(buf);
        free(r);
        return false;
    }
    int len = 0;
    char mine[MPI_MAX_PROCESSOR_NAME + 1] = "";
    MPI_Get_processor_name(mine, &len);
    /* every rank learns the names: a pair's first rank fits its link by
     * whether the two share a node */
    MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME + 1, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME + 1, MPI_CHAR, c);
    /* Pairs one after another, so that no other traffic shares a link;
     * rank 0 collects each pair's result from its first rank. */
    int k = 0;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++, k++) {
            MPI_Barrier(c);
            PairResult x = {.a = a, .b = b};
            measure_pair(c, rank, a, b, strcmp(names[a], names[b]) == 0, buf, &x);
            /* MPI_Comm_create_group involves the pair only */
            MPI_Group world, two;
            MPI_Comm pc = MPI_COMM_NULL;
            if (rank == a || rank == b) {
                int members[2] = {a, b};
                MPI_Comm_group(c, &world);
                MPI_Group_incl(world, 2, members, &two);
                MPI_Comm_create_group(c, two, 5, &pc);
                MPI_Group_free(&two);
                MPI_Group_free(&world);
                measure_allreduce(c, pc, rank, a, b, buf, &x);
                MPI_Comm_free(&pc);
                measure_send(c, rank, a, b, buf, &x);
            }
            if (a != 0 && rank == a) MPI_Send(&x, (int)sizeof x, MPI_BYTE, 0, 3, c);
            if (a != 0 && rank == 0) MPI_Recv(&x, (int)sizeof x, MPI_BYTE, a, 3, c, MPI_STATUS_IGNORE);
            if (rank == 0) {
                x.a = a;
                x.b = b;
                x.same_node = strcmp(names[a], names[b]) == 0;
                r[k] = x;
            }
        }
    free(buf);
    if (rank == 0) write_result(path, r, n_pairs, names, e);
    free(names);
    free(r);
    return rt_comm_agree(e);
}
