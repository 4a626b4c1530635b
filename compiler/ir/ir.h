/* ir.h - cleave's graph IR: values (typed tensors with possibly symbolic
 * shapes) and nodes (ONNX-style operations), all allocated in the graph's
 * arena and freed together with it.
 *
 * A value is defined exactly once: by a node output, a graph input, an
 * initializer (a trainable or fixed tensor from the model file), or a folded
 * constant.  Node inputs that ONNX marks as omitted are NULL. */
#ifndef CLEAVE_IR_H
#define CLEAVE_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../util/arena.h"
#include "../util/diag.h"

/* Element types, numbered as ONNX's TensorProto.DataType so that files map
 * directly. */
typedef enum {
    DT_UNDEFINED = 0,
    DT_FLOAT = 1,
    DT_UINT8 = 2,
    DT_INT8 = 3,
    DT_UINT16 = 4,
    DT_INT16 = 5,
    DT_INT32 = 6,
    DT_INT64 = 7,
    DT_STRING = 8,
    DT_BOOL = 9,
    DT_FLOAT16 = 10,
    DT_DOUBLE = 11,
    DT_UINT32 = 12,
    DT_UINT64 = 13,
    DT_BFLOAT16 = 16,
} DType;

const char *dtype_name(DType t);
size_t dtype_size(DType t); /* bytes per element in a model file; 0 if unknown */
bool dtype_is_float(DType t);
bool dtype_is_int(DType t); /* integers and bool */

/* One dimension.  sym == 0: the constant k.  sym > 0: k times the symbol
 * graph->syms[sym] (so a flattened [N,1,28,28] -> [N*784/784...] stays
 * expressible as k*N).  sym == DIM_UNKNOWN: nothing is known. */
#define DIM_UNKNOWN (-1)
typedef struct Dim {
    int64_t k;
    int32_t sym;
} Dim;

static inline Dim dim_const(int64_t k) { return (Dim){k, 0}; }
static inline Dim dim_unknown(void) { return (Dim){0, DIM_UNKNOWN}; }
static inline bool dim_is_const(Dim d) { return d.sym == 0; }
static inline bool dim_eq(Dim a, Dim b) { return a.sym == b.sym && a.sym != DIM_UNKNOWN && a.k == b.k; }

#define MAX_RANK 8

/* Constant tensor contents.  Storage is normalised so passes handle few
 * types: float/float16/bfloat16 as float32, double as double, every integer
 * type and bool as int64.  The value's DType keeps the declared type. */
typedef struct Const {
    DType store; /* DT_FLOAT, DT_DOUBLE or DT_INT64 */
    int64_t n;   /* element count */
    void *data;
    /* Integer constants computed from shapes with symbolic dims (Shape of an
     * input whose batch is not bound) hold element i = data[i] * sym[i] when
     * sym[i] > 0.  NULL when every element is concrete. */
    int32_t *sym;
} Const;

typedef struct Node Node;

typedef enum {
    VAL_INTERMEDIATE = 0, /* produced by a node */
    VAL_INPUT,            /* fed at run time */
    VAL_INITIALIZER,      /* tensor from the model file */
    VAL_CONSTANT,         /* produced by folding or a Constant node */
    VAL_STATE,            /* runtime state: optimizer moments, lr, step */
} ValueKind;

typedef struct Value {
    int id;
    const char *name;
    ValueKind kind;
    DType dtype;
    int rank; /* -1: unknown rank */
    Dim dims[MAX_RANK];
    Node *producer; /* NULL for inputs, initializers and constants */
    int producer_slot;
    bool is_output;
    Const *konst; /* contents, for initializers and constants */
    DType file_dtype; /* dtype as stored in the file, for byte counts */
} Value;

typedef enum {
    ATTR_UNDEFINED = 0,
    ATTR_FLOAT = 1,
    ATTR_INT = 2,
    ATTR_STRING = 3,
    ATTR_TENSOR = 4,
    ATTR_GRAPH = 5,
    ATTR_FLOATS = 6,
    ATTR_INTS = 7,
    ATTR_STRINGS = 8,
    ATTR_TENSORS = 11,
    ATTR_GRAPHS = 12,
    ATTR_SPARSE_TENSOR = 13,
    ATTR_SPARSE_TENSORS = 14,
    ATTR_TYPE_PROTO = 9,
    ATTR_TYPE_PROTOS = 10,
} AttrKind;

typedef struct Attr {
    const char *name;
    AttrKind kind;
    float f;
    int64_t i;
    const char *s;
    int n; /* element count of the list kinds */
    float *floats;
    int64_t *ints;
    const char **strings;
    Value *tensor; /* ATTR_TENSOR: a detached constant value */
} Attr;

struct OpDef;

/* Which part of a training step a node belongs to; eval steps run the
 * forward and loss phases only. */
typedef enum { PHASE_FORWARD = 0, PHASE_LOSS, PHASE_BACKWARD, PHASE_OPTIMIZER } NodePhase;

struct Node {
    int id;
    NodePhase phase;
    /* For nodes the training graph adds: the forward node whose gradient
     * (or, for optimizer updates, whose parameter) they serve; partitioning
     * places them with it.  NULL for forward nodes and the loss. */
    struct Node *origin;
    const char *name;
    const char *op_type;
    const char *domain; /* "" for the default ONNX domain */
    const struct OpDef *def; /* NULL when unsupported */
    int n_in, n_out, n_attr;
    Value **in;
    Value **out;
    Attr *attrs;
    bool dead; /* removed by a pass; skipped by iteration */
};

typedef struct Opset {
    const char *domain;
    int64_t version;
} Opset;

typedef struct Graph {
    Arena arena;
    const char *path; /* model file, for messages */
    /* model metadata */
    int64_t ir_version, model_version;
    const char *producer_name, *producer_version, *graph_name, *doc;
    int n_opsets;
    Opset *opsets;
    /* contents; arrays grow in the arena */
    int n_values, cap_values;
    Value **values;
    int n_nodes, cap_nodes;
    Node **nodes;
    int n_inputs, n_outputs;
    Value **inputs; /* runtime inputs, initializers excluded */
    Value **outputs;
    int n_syms;
    const char **syms; /* syms[0] unused */
    /* Dimension 0 of the inputs as the file fixed it, when --batch bound
     * other rows in its place (0: symbolic or unchanged), for messages. */
    int64_t file_batch, bound_batch;
} Graph;

Graph *graph_new(const char *path);
void graph_free(Graph *g);
Value *graph_add_value(Graph *g, const char *name);
Node *graph_add_node(Graph *g, const char *name, const char *op_type, const char *domain, int n_in, int n_out);
Value *graph_find_value(const Graph *g, const char *name);
int graph_symbol(Graph *g, const char *name); /* id of a named symbol, created if new */
int64_t graph_opset(const Graph *g, const char *domain);

/* Attributes */
const Attr *node_attr(const Node *n, const char *name);
/* Attribute value, falling back to the op table's default, then `dflt`. */
int64_t node_attr_i(const Node *n, const char *name, int64_t dflt);
float node_attr_f(const Node *n, const char *name, float dflt);
const char *node_attr_s(const Node *n, const char *name, const char *dflt);
/* Integer list: count, or -1 when absent. */
int node_attr_ints(const Node *n, const char *name, const int64_t **out);

/* Shapes */
int64_t value_numel(const Value *v); /* -1 unless every dim is constant */
bool value_shape_known(const Value *v); /* rank known and every dim constant */
void value_set_shape(Value *v, int rank, const Dim *dims);
/* "[N,1,28,28]"-style text into buf. */
const char *shape_str(const Graph *g, const Value *v, char *buf, size_t len);
const char *dim_str(const Graph *g, Dim d, char *buf, size_t len);

/* Constants */
Const *const_new(Graph *g, DType store, int64_t n);
double const_get_f(const Const *c, int64_t i);
int64_t const_get_i(const Const *c, int64_t i);
void const_set_f(Const *c, int64_t i, double x);
void const_set_i(Const *c, int64_t i, int64_t x);
DType dtype_store(DType t); /* storage type a dtype uses in a Const */
/* Element i as a dimension (symbolic elements keep their symbol). */
Dim const_get_dim(const Const *c, int64_t i);
/* Copies element si of src to element di of dst, symbol included. */
bool const_copy_elem(Graph *g, Const *dst, int64_t di, const Const *src, int64_t si);
/* True for values whose contents are fixed at compile time.  Float
 * initializers are trainable parameters and so never count as constant. */
bool value_is_const(const Value *v);

/* Iteration over live nodes in storage order. */
#define GRAPH_FOR_NODES(g, n)                                                  \
    for (int n##_i = 0; n##_i < (g)->n_nodes; n##_i++)                         \
        for (Node *n = (g)->nodes[n##_i]; n && !n->dead; n = NULL)

/* Verifier: every value defined once, every input defined, acyclic, types
 * agree across uses.  Returns false with a Diag naming the node. */
bool ir_verify(Graph *g, Diag *d);
/* Live nodes in a topological order (arena array of g->n_nodes entries;
 * *count gets the number of live nodes).  Fails on a cycle. */
Node **ir_topo_order(Graph *g, int *count, Diag *d);
/* Replace every use of `from` (node inputs and graph outputs) with `to`. */
void ir_replace_uses(Graph *g, Value *from, Value *to);

#endif
