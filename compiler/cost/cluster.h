/* cluster.h - the machine the cost model prices a plan on: how many nodes
 * and ranks, how much memory each rank has, how fast a rank computes, and
 * what a message costs within a node and between nodes.
 *
 * Requires: nothing but the cluster file itself (docs/cluster.md, JSON
 * Schema schemas/cluster.schema.json) or, without one, the stated defaults
 * below.
 * Provides: the loaded description and the few formulas every cost
 * estimate is built from, so that all of them price compute and messages
 * the same way:
 *   - a matrix product of F FLOPs on rank r: F / (rate(F) * 1e9) /
 *     rank_speed[r], rate(F) read off the measured GEMM curve;
 *   - a memory-bound kernel moving B bytes: B / (elementwise_gbps * 1e9) /
 *     rank_speed[r];
 *   - a message of B bytes from a to b: latency + B / (bandwidth * 1e9)
 *     of the intra-node link when a and b share a node, else of the link
 *     between their two nodes: its own entry of `links` when the file
 *     gives one, the inter-node default otherwise (alpha + B / beta);
 *   - a ring allreduce of B bytes over n ranks: 2 (n - 1) steps, each a
 *     message of B / n bytes over the slowest link of the ring, and n - 1
 *     additions of B / n bytes.
 * The fixed cost of a kernel call (kernel_overhead_s) is not part of these
 * helpers: the model adds it once per kernel it counts, whatever the
 * kernel's kind.
 *
 * Ranks are numbered node by node: rank r lives on node
 * r / ranks_per_node, as mpirun places them by default given a host file
 * with ranks_per_node slots per node. */
#ifndef CLEAVE_CLUSTER_H
#define CLEAVE_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../util/diag.h"

/* Points of the GEMM curve a file may give; a curve is a handful of
 * measured sizes, so anything near this is a mistake. */
#define CLUSTER_MAX_GEMM_POINTS 64
/* nodes * ranks_per_node at most: keeps rank numbers, and per-rank arrays
 * of the cost model, well inside int. */
#define CLUSTER_MAX_RANKS (1 << 20)

/* One kind of point-to-point link. */
typedef struct ClusterLink {
    double latency_s;      /* alpha: seconds per message, >= 0 */
    double bandwidth_gbps; /* 1 / beta, in 1e9 bytes per second, > 0 */
    /* What an allreduce's ring gets of the link between two nodes, in the
     * same units: the bytes each rank sends over the time they take (the
     * file's optional "allreduce_gbps", which cleave calibrate measures);
     * 0: not given, and a ring moves at bandwidth_gbps.  Over TCP the two
     * directions of a sum's exchange slow each other, which one message
     * at a time never shows (docs/cluster.md). */
    double allreduce_gbps;
    /* The sender's own CPU time for one message, beyond the latency and
     * bandwidth that say when it arrives: send_overhead_s + bytes /
     * (send_gbps 1e9), spent inside the send call (the file's optional
     * "send_overhead_s" and "send_gbps", which cleave calibrate measures
     * for the links between nodes; 0: not given, nothing charged).  Over
     * TCP the send call writes the message into the socket, and between
     * two hosts on one machine the kernel delivers it to the receiver's
     * socket inside that call too: on the test cluster, tens of
     * microseconds of the sender's core per 16 KiB. */
    double send_overhead_s, send_gbps;
} ClusterLink;

/* The link between two particular nodes, replacing inter_node for the
 * messages between them (both directions). */
typedef struct ClusterPairLink {
    int a, b; /* node numbers, a < b */
    ClusterLink link;
} ClusterPairLink;

typedef struct Cluster {
    /* "user" (written by hand), "calibrated" (measured on this machine and
     * cached) or "defaults" (cluster_defaults); a file without "source"
     * counts as "user". */
    char source[16];
    /* Where it came from, for messages: the file's path (cut at 255
     * bytes), or "defaults". */
    char origin[256];
    char *name; /* malloc'd; NULL when not given */
    int nodes;
    int ranks_per_node;
    /* Cores each node gives its ranks; 0 (not stated) means one core per
     * rank.  Fewer cores than ranks time-share them, each rank pinned to
     * one core round robin as the runtime does (cluster_core_of). */
    int cores_per_node;
    int64_t memory_per_rank_bytes;
    /* GEMM rate by problem size: gemm_gflops[i] GFLOP/s for one product of
     * gemm_flops[i] FLOPs; sizes strictly ascending, 1..64 points. */
    int n_gemm;
    double gemm_flops[CLUSTER_MAX_GEMM_POINTS];
    double gemm_gflops[CLUSTER_MAX_GEMM_POINTS];
    /* The same for convolutions (and their gradients), whose generated
     * kernels are not the matrix-product kernels; n_conv 0: not given, and
     * convolutions are priced on the GEMM curve. */
    int n_conv;
    double conv_flops[CLUSTER_MAX_GEMM_POINTS];
    double conv_gflops[CLUSTER_MAX_GEMM_POINTS];
    double elementwise_gbps;  /* bytes a memory-bound kernel moves per second / 1e9 */
    double kernel_overhead_s; /* fixed cost of one kernel call, >= 0 */
    double step_overhead_s;   /* fixed cost of one training step on each rank (the runtime's batch and loss), >= 0 */
    ClusterLink intra_node;
    ClusterLink inter_node;
    /* Links between particular pairs of nodes (the file's "links",
     * malloc'd, sorted by (a, b), no pair twice); other pairs of nodes
     * take inter_node.  n_links 0: none. */
    int n_links;
    ClusterPairLink *links;
    /* Compute multiplier of each rank (cluster_ranks entries, > 0; 0.5 is
     * half as fast), malloc'd; NULL means all 1. */
    double *rank_speed;
    /* --profile: the model's kernels timed on this machine (profile.h),
     * charged instead of the rates above; not owned, not in the file. */
    struct KernelProfile *profile;
} Cluster;

/* Reads a cluster file.  On failure *c is left holding nothing (no need
 * to cluster_free it) and d has one line naming the file and the field:
 * DIAG_IO when the file cannot be read, DIAG_FORMAT for bad JSON (with its
 * line and column) or a field that is missing, of the wrong type, out of
 * range or unknown (so a misspelt key is not silently ignored),
 * DIAG_UNSUPPORTED for another "version", DIAG_LIMIT for counts cleave
 * cannot hold (more than CLUSTER_MAX_RANKS ranks, 2^63 bytes or more of
 * memory), DIAG_NOMEM. */
bool cluster_load(const char *path, Cluster *c, Diag *d);
/* The same on text in memory; `path` names it in messages and becomes
 * Cluster.origin.  text need not be NUL-terminated. */
bool cluster_parse(const char *text, size_t len, const char *path, Cluster *c, Diag *d);

/* Stated defaults for one node of `ranks` (>= 1) ranks, for when there is
 * neither a cluster file nor a calibration of this machine.  They are
 * deliberately conservative figures for one core of an ordinary x86-64
 * machine running cleave's generated code, so that a plan chosen on them
 * does not count on speed it may not get:
 *   - GEMM: 2 GFLOP/s for a product of about 1e3 FLOPs (8x8x8: loop
 *     set-up and edges dominate), 10 at 1e5, 30 at 1e7, 40 from 1e9 up
 *     (the packed kernels reach over half of a core's peak on AVX-512;
 *     an AVX2 core has half the width, and the figures leave room);
 *   - convolutions with both gradients: 4.6 GFLOP/s up to 1.35e6 FLOPs,
 *     86 at 2.17e7, 125 from 3.47e8 up: not conservative, but what
 *     `cleave calibrate` measured on the development machine (AVX-512),
 *     where the packed kernels run them as products (cluster.c);
 *   - memory-bound kernels: 5 GB/s, what one core streams from DRAM once
 *     tensors outgrow the caches;
 *   - kernel overhead: 0.3 us per call (call, loop set-up, a cache miss
 *     or two); step overhead: 10 us per step (the runtime fills the
 *     batch, reads the loss, times the step);
 *   - within the node: 1 us + 5 GB/s per message, shared-memory MPI
 *     (a copy through a shared segment);
 *   - between nodes (unused on one node, but filled in): 5 us + 1.25 GB/s,
 *     10 Gb/s Ethernet over TCP;
 *   - memory: 2 GiB per rank, which a laptop or a CI runner can give a
 *     few ranks each.
 * source and origin are "defaults"; name is NULL.  Allocates nothing. */
void cluster_defaults(Cluster *c, int ranks);
/* ---- this machine (cluster_machine.c) ---- */

/* Where `cleave calibrate --cache` stores this machine's calibration:
 * $CLEAVE_CLUSTER_CACHE, else $XDG_CACHE_HOME/cleave/cluster.json, else
 * $HOME/.cache/cleave/cluster.json.  False when none can be formed. */
bool cluster_cache_path(char *buf, size_t len);
/* Creates the folders leading to path. */
bool cluster_cache_dir(const char *path, Diag *d);
/* The cluster to assume without a cluster file: the cached calibration
 * (with at least `ranks` ranks on its one node), else cluster_defaults;
 * `which` says which, for people.  Fails only on a cached file that does
 * not load. */
bool cluster_machine(Cluster *c, int ranks, char *which, size_t which_len, Diag *d);

/* The cluster a command plans on: the file at path, or without one (NULL)
 * cluster_machine's; `which` says which, for people. */
bool cluster_open(const char *path, int ranks, Cluster *c, char *which, size_t which_len, Diag *d);

/* Frees rank_speed, links and name; c may be zeroed or already freed. */
void cluster_free(Cluster *c);

/* JSON text of c in the cluster file format (malloc'd; NULL when out of
 * memory): cluster_parse reads it back to the same numbers. */
char *cluster_to_json(const Cluster *c);

/* ---- what the cost model builds on; rank numbers must be in range ---- */

int cluster_ranks(const Cluster *c);
/* rank_speed[rank], or 1 without rank_speed. */
double cluster_rank_speed(const Cluster *c, int rank);
/* GEMM rate in GFLOP/s for one product of `flops` FLOPs at speed 1: linear
 * in log(flops) between the curve's points, the end points' rates beyond
 * them (a curve measured up to 1e9 FLOPs says nothing better about 1e12). */
double cluster_gemm_gflops(const Cluster *c, double flops);
/* The convolution rate (conv_gflops, or the GEMM curve without one) and
 * the seconds of a convolution of `flops` FLOPs on `rank`. */
double cluster_conv_gflops(const Cluster *c, double flops);
double cluster_conv_seconds(const Cluster *c, int rank, double flops);
/* Seconds of a matrix product of `flops` FLOPs on `rank` (0 for flops <= 0). */
double cluster_gemm_seconds(const Cluster *c, int rank, double flops);
/* Seconds of a memory-bound kernel moving `bytes` bytes (read and written)
 * on `rank` (0 for bytes <= 0). */
double cluster_mem_seconds(const Cluster *c, int rank, double bytes);
/* The part of a core rank `rank` gets when ranks 0 .. used - 1 all
 * compute at once: 1 while its node has a core for each of them, else
 * cores / ranks on the node.  The simulator (simulate.c) uses it to tell
 * whether a node is oversubscribed, then shares each core among the ranks
 * pinned to it that compute at the same time. */
double cluster_core_share(const Cluster *c, int rank, int used);
/* The core of its node that rank `rank` is pinned to when ranks 0 .. used
 * - 1 run and its node has fewer cores than ranks: the k-th rank of the
 * node on core k mod cores (runtime/rt_bind.c pins them so); -1 when the
 * node has a core for each rank. */
int cluster_core_of(const Cluster *c, int rank, int used);
bool cluster_same_node(const Cluster *c, int a, int b);
/* The node rank `rank` runs on. */
int cluster_node_of(const Cluster *c, int rank);
/* The link a message from a to b takes: intra_node within a node, else
 * the pair's entry of `links`, else inter_node. */
const ClusterLink *cluster_link(const Cluster *c, int a, int b);
/* The link between nodes x and y (x != y). */
const ClusterLink *cluster_node_link(const Cluster *c, int x, int y);
/* Seconds of one message of `bytes` bytes from a to b: latency + bytes /
 * bandwidth of their link; 0 when a == b (no message is sent). */
double cluster_p2p_seconds(const Cluster *c, int a, int b, double bytes);
/* Seconds of the sender's CPU for one message from a to b: its link's
 * send_overhead_s + bytes / send_gbps, each when given (calibrate gives
 * them for links between nodes only); 0 when a == b. */
double cluster_send_cpu_seconds(const Cluster *c, int a, int b, double bytes);
/* Seconds of one step of an allreduce's ring from a to b carrying `bytes`:
 * p2p, except between nodes whose link states allreduce_gbps, which then
 * takes the place of its bandwidth. */
double cluster_ring_seconds(const Cluster *c, int a, int b, double bytes);
/* Seconds of a ring allreduce of `bytes` bytes over ranks[0..n), in that
 * ring order: a reduce-scatter and an allgather of n - 1 steps each, in
 * every step each rank sends bytes / n to the next (ranks[i] to
 * ranks[(i + 1) % n]), and a step lasts as long as its slowest link:
 * 2 (n - 1) * max_i ring(ranks[i], ranks[i + 1], bytes / n); plus the
 * reduce-scatter's n - 1 additions of bytes / n at the memory rate
 * (3 bytes / n moved each, speed 1).  0 for n <= 1.
 * Rings that keep each node's ranks together cross nodes as few times as
 * possible, but with more than one node some step is still inter-node,
 * and that bounds every step. */
double cluster_allreduce_seconds(const Cluster *c, const int *ranks, int n, double bytes);

#endif
