/* rt_calibrate.c - --calibrate-comm OUT.json: instead of training, ranks 0
 * and 1 time a ping-pong of messages from 8 B to 4 MiB (powers of two) and rank 0 writes
 * the point-to-point cost it fits, for `cleave calibrate` (the compiler is
 * not an MPI program, so it measures MPI through a generated one).
 *
 * The fit is the cost model's own: one message of B bytes takes
 * latency + B / bandwidth (docs/cluster.md).  It is a least-squares fit in
 * relative error, so that the 8-byte points (which decide the latency) and
 * the megabyte points (which decide the bandwidth) weigh the same. */
#include <errno.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "rt_mpi.h"

#define CAL_MIN_BYTES 8
#define CAL_MAX_BYTES (4 << 20)
#define CAL_MAX_POINTS 32
#define CAL_REPEATS 3 /* best of: the least disturbed run of each size */

typedef struct Point {
    double bytes, seconds; /* one-way time of one message */
} Point;

/* Enough round trips that a size moves about 32 MiB, at least 20 and at
 * most 2000: small messages need many to rise above the timer's grain.
 * Both ranks compute the same count, so no message has to agree on it. */
static int round_trips(int bytes) {
    int n = (32 << 20) / bytes;
    return n < 20 ? 20 : n > 2000 ? 2000 : n;
}

/* Rank 0's one-way time of a `bytes` message; rank 1 echoes. */
static double ping_pong(MPI_Comm c, int rank, char *buf, int bytes) {
    int n = round_trips(bytes);
    double best = 0;
    for (int rep = 0; rep < CAL_REPEATS; rep++) {
        MPI_Barrier(c);
        double t0 = MPI_Wtime();
        for (int i = 0; i < n; i++) {
            if (rank == 0) {
                MPI_Send(buf, bytes, MPI_BYTE, 1, 0, c);
                MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, c, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, c, MPI_STATUS_IGNORE);
                MPI_Send(buf, bytes, MPI_BYTE, 0, 0, c);
            }
        }
        double t = (MPI_Wtime() - t0) / n / 2;
        if (rep == 0 || t < best) best = t;
    }
    return best;
}

/* Minimises sum ((alpha + beta B - t) / t)^2.  Falls back to the smallest
 * message's time as alpha and the largest's rate as 1 / beta when the fit
 * gives a negative term (noise on a link whose latency is near zero). */
static void fit(const Point *p, int n, double *alpha, double *beta) {
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

static bool write_result(const char *path, const Point *p, int n, double alpha, double beta, bool same_node,
                         const char *host0, const char *host1, RtErr *e) {
    OutFile out;
    int err = out_file_open(&out, path);
    if (err) return rt_error(e, "--calibrate-comm %s: cannot write: %s", path, out_file_why(err));
    FILE *f = out.f;
    fprintf(f, "{\"latency_s\": %.6e, \"bandwidth_gbps\": %.6g, \"same_node\": %s,\n", alpha, 1e-9 / beta,
            same_node ? "true" : "false");
    /* Host names are what MPI reports: letters, digits, dots and dashes. */
    fprintf(f, " \"hosts\": [\"%s\", \"%s\"], \"ranks\": %d,\n \"points\": [", host0, host1, rt_ranks());
    for (int i = 0; i < n; i++) fprintf(f, "%s[%.0f, %.6e]", i ? ", " : "", p[i].bytes, p[i].seconds);
    fprintf(f, "]}\n");
    err = out_file_finish(&out);
    if (err) return rt_error(e, "--calibrate-comm %s: write failed: %s", path, out_file_why(err));
    return true;
}

bool rt_calibrate_comm(const char *path, RtErr *e) {
    if (rt_ranks() < 2)
        return rt_error_all(e, "--calibrate-comm times messages between ranks 0 and 1: run it under mpirun -np 2 "
                               "(it runs on 1 rank)");
    int rank = rt_rank();
    if (rank == 0) rt_args_check_writable("--calibrate-comm", path, e);
    if (!rt_comm_agree(e)) return false;

    MPI_Comm c = rt_comm_world();
    char names[2][MPI_MAX_PROCESSOR_NAME + 1];
    memset(names, 0, sizeof names);
    int len = 0;
    MPI_Get_processor_name(names[rank < 2 ? rank : 0], &len);
    /* Rank 1 tells rank 0 where it runs; ranks past 1 only wait. */
    if (rank == 1) MPI_Send(names[1], MPI_MAX_PROCESSOR_NAME + 1, MPI_CHAR, 0, 1, c);
    if (rank == 0) MPI_Recv(names[1], MPI_MAX_PROCESSOR_NAME + 1, MPI_CHAR, 1, 1, c, MPI_STATUS_IGNORE);

    char *buf = calloc(CAL_MAX_BYTES, 1);
    if (!buf) rt_error(e, "out of memory for a %d-byte message", CAL_MAX_BYTES);
    if (!rt_comm_agree(e)) {
        free(buf);
        return false;
    }
    Point p[CAL_MAX_POINTS];
    int n = 0;
    for (int bytes = CAL_MIN_BYTES; bytes <= CAL_MAX_BYTES; bytes *= 2) {
        double t = rank < 2 ? ping_pong(c, rank, buf, bytes) : 0;
        if (rank >= 2) { /* keep the barriers of ranks 0 and 1 company */
            for (int rep = 0; rep < CAL_REPEATS; rep++) MPI_Barrier(c);
        }
        p[n++] = (Point){bytes, t};
    }
    free(buf);
    if (rank == 0) {
        double alpha, beta;
        fit(p, n, &alpha, &beta);
        write_result(path, p, n, alpha, beta, strcmp(names[0], names[1]) == 0, names[0], names[1], e);
    }
    return rt_comm_agree(e);
}
