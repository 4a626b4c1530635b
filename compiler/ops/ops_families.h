/* ops_families.h - declarations of the op entries listed in ops_list.h. */
#ifndef CLEAVE_OPS_FAMILIES_H
#define CLEAVE_OPS_FAMILIES_H

#include "ops.h"

#define X(name) extern const OpDef op_##name;
#include "ops_list.h"
#undef X

#endif
