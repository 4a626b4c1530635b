/* ops_pool.h - what ops_pool.c tells other files about its kernels. */
#ifndef CLEAVE_OPS_POOL_H
#define CLEAVE_OPS_POOL_H

#include "../ir/ir.h"

/* Whether MaxPool or MaxPoolGrad node n (shapes inferred) runs the vector
 * kernels rather than the scalar loops.  Tests ask, so that a comparison
 * of the two paths cannot pass by comparing one with itself. */
bool maxpool_vectorised(const Node *n);

#endif
