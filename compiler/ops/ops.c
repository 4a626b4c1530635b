/* ops.c - the op table assembled from ops_list.h, and its queries. */
#include "ops.h"

#include <stdio.h>
#include <string.h>

#include "ops_families.h"

static const OpDef *const table[] = {
#define X(name) &op_##name,
#include "ops_list.h"
#undef X
};

enum { N_OPS = sizeof table / sizeof *table };

static bool same_domain(const char *a, const char *b) {
    if (strcmp(a, "ai.onnx") == 0) a = "";
    if (strcmp(b, "ai.onnx") == 0) b = "";
    return strcmp(a, b) == 0;
}

const OpDef *op_lookup(const char *domain, const char *name) {
    for (int i = 0; i < N_OPS; i++)
        if (strcmp(table[i]->name, name) == 0 && same_domain(table[i]->domain, domain ? domain : ""))
            return table[i];
    return NULL;
}

const OpDef *const *op_table(int *count) {
    *count = N_OPS;
    return table;
}

const AttrSpec *op_attr_spec(const OpDef *def, const char *name) {
    if (!def || !def->attrs) return NULL;
    for (const AttrSpec *s = def->attrs; s->name; s++)
        if (strcmp(s->name, name) == 0) return s;
    return NULL;
}

const char *op_supported_list(char *buf, size_t len) {
    size_t pos = 0;
    buf[0] = 0;
    for (int i = 0; i < N_OPS && pos < len; i++)
        pos += (size_t)snprintf(buf + pos, len - pos, "%s%s", i ? ", " : "", table[i]->name);
    return buf;
}
