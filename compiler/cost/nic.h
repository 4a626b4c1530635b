/* nic.h - the links of the nodes as resources the simulator books
 * transfers on, so that messages sharing a link share its bandwidth.
 *
 * Requires: nothing.  Provides: for every node, two timelines of busy
 * intervals, one for what leaves the node (tx) and one for what enters it
 * (rx).  A transfer between two nodes holds the sender's tx and the
 * receiver's rx at once, for bytes / bandwidth of their link; a transfer
 * posted while either is busy starts in the first gap long enough on
 * both.  Two ranks of node A each sending B bytes to node B at the same
 * time therefore take 2 B / bandwidth, not B / bandwidth: the link is
 * shared by serving its transfers one after another, which finishes the
 * pair at the time fair sharing would (the first one earlier).
 *
 * The simulator walks ranks in turn, not in time order, so a transfer
 * booked later may start earlier: it takes a gap before the transfers
 * already booked rather than queueing behind them all.
 *
 * Transfers within a node do not touch these timelines: shared-memory
 * copies have their own model (cluster.h). */
#ifndef CLEAVE_NIC_H
#define CLEAVE_NIC_H

#include <stdbool.h>

typedef struct NicLine {
    double *t0, *t1; /* busy intervals, sorted, disjoint */
    int n, cap;
} NicLine;

typedef struct Nics {
    int nodes;
    NicLine *tx, *rx; /* per node */
    bool failed;      /* out of memory booking: the caller reports it */
} Nics;

/* Timelines for `nodes` nodes, all free; false when out of memory. */
bool nics_init(Nics *x, int nodes);
/* Every timeline free again (a new walk of the step). */
void nics_clear(Nics *x);
void nics_free(Nics *x);
/* Books a transfer of `dur` seconds of bandwidth from node `src` to node
 * `dst` (src != dst) posted at t: the earliest start >= t at which src's
 * tx and dst's rx are both free for dur; returns that start. */
double nics_book(Nics *x, int src, int dst, double t, double dur);
/* Books `dur` seconds on node `node`'s tx (rx false) or rx (rx true)
 * alone, from the first gap at or after t; returns when it ends.  A
 * collective books each node's share of its traffic so. */
double nics_book_one(Nics *x, int node, bool rx, double t, double dur);

#endif
