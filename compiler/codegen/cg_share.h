/* cg_share.h - one kernel for nodes that would generate the same code
 * (cg_share.c). */
#ifndef CLEAVE_CG_SHARE_H
#define CLEAVE_CG_SHARE_H

#include "cg.h"

typedef struct CgShare CgShare;

CgShare *cg_share_new(void);
void cg_share_free(CgShare *s);
/* When a node with n's signature already has a kernel, gives n that
 * kernel's function over n's own buffers and returns true; false: build
 * n's kernel, then cg_share_add it. */
bool cg_share_reuse(Cg *c, CgShare *s, const Node *n);
void cg_share_add(Cg *c, CgShare *s, const Node *n);
/* Nodes that reused another's kernel (for --verbose). */
int cg_share_count(const CgShare *s);

#endif
