/* profile.h - the kernels of the model being planned, timed here.
 *
 * Requires: nodes of a graph with static shapes (a training graph built at
 * a plan's rows).  Provides: the seconds one call of a node's generated
 * kernel takes on this machine, compiled alone at the node's shapes and
 * attributes and run on cold caches (kernel_run.h), remembered by what makes two
 * kernels the same.  A cluster carrying a profile (Cluster.profile)
 * charges these times instead of its rates (cost/simulate.h); rank_speed
 * and shared cores still apply, so the profile stands for one core of
 * this machine. */
#ifndef CLEAVE_PROFILE_H
#define CLEAVE_PROFILE_H

#include "../ir/ir.h"

typedef struct KernelProfile KernelProfile;

KernelProfile *profile_new(void);
void profile_free(KernelProfile *p);
/* The graph whose nodes are asked about next (their opsets). */
void profile_bind(KernelProfile *p, const Graph *g);
/* Where a kernel finds its data when it is called, which the simulator
 * tells by the bytes its rank touched since the kernel's previous call:
 * PROFILE_WARM   still in the L2 cache (called again at once, as a node
 *                is for a later micro-batch of a step);
 * PROFILE_COLD   evicted from the L2 by the kernels in between, still in
 *                the last-level cache;
 * PROFILE_MEMORY evicted from every cache: a rank that touches more than
 *                the last-level cache holds in a step reads its weights
 *                from memory again in every step (the 16-layer MLP's 16
 *                MB of weights, gradients and momenta: its steps took 36%
 *                longer than its kernels timed PROFILE_COLD). */
typedef enum { PROFILE_COLD, PROFILE_WARM, PROFILE_MEMORY } ProfileCache;
/* Seconds per call of n's kernel, measured on first use (all three ways);
 * < 0 when n has no kernel or could not be built alone (the caller prices
 * it then). */
double profile_node_seconds(KernelProfile *p, const Node *n, ProfileCache where);
/* The bytes a PROFILE_WARM call may have touched since its kernel's last
 * call and still find its data in cache: the L2 cache the cold timings
 * evict (kernel_run.h), on the machine the profile times. */
size_t profile_cache_bytes(void);
/* The same for PROFILE_COLD: the last-level cache, shared by the cores
 * of the machine. */
size_t profile_llc_bytes(void);
/* Seconds of adding a micro-batch's gradient v into its accumulator. */
double profile_accumulate_seconds(KernelProfile *p, const Value *v, ProfileCache where);
/* Times every kernel measured so far `passes` more times, one pass over
 * all of them after another, and keeps for each the median of its
 * timings.  A kernel is timed in a few milliseconds; a burst of other
 * work on the machine lasting longer spoils every timing it covers, and
 * the passes, a second or so apart, rarely all fall in one.  The callers
 * (the search) then price their candidates again.  Kernels are kept
 * built for this up to a memory budget; those beyond it keep their first
 * timing.  Afterwards no kernel stays built. */
void profile_refine(KernelProfile *p, int passes);
/* Kernels measured and kernels that could not be, so far. */
void profile_counts(const KernelProfile *p, int *measured, int *failed);

#endif
