#include "driver.h"

#include <stdio.h>

#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "ops/ops.h"

bool driver_check_supported(Graph *g, Diag *d) {
    GRAPH_FOR_NODES(g, n) {
        if (n->def) continue;
        char list[2048];
        return diag_error(d, DIAG_UNSUPPORTED, "%s: node '%s': op '%s%s%s' is not supported (supported: %s)", g->path,
                          n->name, n->domain, n->domain[0] ? "." : "", n->op_type,
                          op_supported_list(list, sizeof list));
    }
    return true;
}

Graph *driver_front_end(const DriverOptions *opt, Diag *d) {
    Graph *g = onnx_load(opt->model, d);
    if (!g) return NULL;
    ShapeOptions so = {.batch = opt->batch, .fold = true};
    bool ok = ir_verify(g, d) && (!opt->require_supported || driver_check_supported(g, d)) &&
              ir_infer_shapes(g, &so, d);
    if (ok) {
        ir_prune(g);
        ok = ir_verify(g, d);
    }
    if (ok && g->arena.failed) ok = diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    if (!ok) {
        graph_free(g);
        return NULL;
    }
    return g;
}
