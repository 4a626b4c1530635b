/* ops.h - the op table.
 *
 * Each supported operator is ONE OpDef: its name, domain, opset range,
 * arity, attribute defaults, and the rules passes call (shape inference,
 * constant evaluation, FLOP count, gradient, code generation, in-place
 * legality).  The entries live in the ops_*.c files by family and are
 * listed once in ops_list.h.  Adding an op means writing its entry and
 * adding it to that list. */
#ifndef CLEAVE_OPS_H
#define CLEAVE_OPS_H

#include "../ir/ir.h"

typedef struct AttrSpec {
    const char *name;
    AttrKind kind;
    int64_t i;
    float f;
    const char *s;
    bool required;
} AttrSpec;

/* Context handed to an op's rules. */
typedef struct OpCtx {
    Graph *g;
    Diag *d;
    int64_t opset; /* version of the node's domain imported by the model */
} OpCtx;

typedef struct GradCtx GradCtx; /* autodiff/grad.h */
typedef struct Cg Cg;           /* codegen/cg.h */
struct CgEpilogue;              /* codegen/cg.h */
struct CgRows;

/* Result of a fold rule. */
typedef enum { FOLD_NO = 0, FOLD_DONE = 1, FOLD_ERROR = 2 } FoldResult;

typedef struct OpDef {
    const char *name;
    const char *domain; /* "" = ai.onnx */
    int since, until;   /* supported opset versions, inclusive; until 0 = open */
    int min_in, max_in, min_out, max_out;
    const AttrSpec *attrs; /* terminated by an entry with name NULL */
    /* Input slots holding state rather than trainable weights (for example
     * BatchNormalization's running statistics): bit i = input i. */
    uint32_t state_inputs;
    /* Sets dtype and shape of every output from the inputs.  Inputs are
     * guaranteed to have a known rank when the rule is called.  Returns
     * false with a Diag on a mismatch. */
    bool (*infer)(OpCtx *c, Node *n);
    /* Evaluates the node when its inputs are constant (or, for Shape, have
     * known shapes), storing the outputs' Const.  NULL: never folded. */
    FoldResult (*fold)(OpCtx *c, Node *n);
    /* Forward floating-point operations of the node at its inferred shapes.
     * NULL: one per output element. */
    double (*flops)(const Node *n);
    /* Reverse-mode rule: given dy[k], the gradient of each output (NULL when
     * output k gets none), sets dx[i] for every input i with need[i], built
     * from graph ops with the autodiff/grad.h builders.  NULL: the op has
     * no gradient. */
    bool (*grad)(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need);
    /* Emits the node's kernel (codegen/cg.h).  NULL: no code generation. */
    bool (*cg)(Cg *c, const Node *n);
    /* Bit i: input i's buffer is updated in place (optimizer state). */
    uint32_t mutates_inputs;
    /* The kernel reads element i of input 0 before writing element i of
     * output 0 and touches no other element of either, so the output may
     * take input 0's buffer when the two have the same size and input 0
     * dies here (memory planning does this). */
    bool inplace;
    /* Compute-bound: the cost model times the node by its FLOPs at the
     * measured rate of its kind of kernel (DENSE_GEMM: matrix products;
     * DENSE_CONV: convolutions and their gradients); other ops (0) by the
     * bytes they read and write. */
    unsigned char dense;
    /* Element-wise ops whose kernel is cg_elementwise over this scalar
     * function: codegen may fuse a chain of such nodes into one loop
     * (codegen/cg_fuse.c).  NULL: the node's kernel always runs alone. */
    struct LLVMOpaqueValue *(*scalar)(Cg *c, const Node *n, struct LLVMOpaqueValue **x);
    /* The eval step's kernel (cg_eval) as cg_elementwise over this scalar
     * function, so that the eval step's chains fuse the node as they fuse
     * `scalar` ops: BatchNormTrain on the running statistics, which then
     * runs in the epilogue of the convolution before it.  NULL: the eval
     * kernel always runs alone. */
    struct LLVMOpaqueValue *(*eval_scalar)(Cg *c, const Node *n, struct LLVMOpaqueValue **x);
    /* Bit i: input i of an element-wise op (scalar, eval_scalar) holds one
     * value per channel, axis 1 of output 0, and the element nests read it
     * at each element's channel instead of broadcasting it numpy's way:
     * batch normalisation's statistics and affine terms. */
    uint32_t channel_inputs;
    /* Kernels that finish their output a block of rows (samples) at a
     * time, as Conv's fast paths do: emits the kernel's work inside an
     * open kernel, running epi after each block, so that a chain of
     * element-wise nodes reading the output runs while the block is in
     * cache (codegen/cg_fuse.c).  With epi NULL it only answers, emitting
     * nothing.  false: this node's kernel has no such blocks (it heads no
     * chain).  NULL: none of the op's kernels do. */
    bool (*cg_blocks)(Cg *c, const Node *n, const struct CgEpilogue *epi);
    /* Reductions that can take the output of a cg_blocks kernel block by
     * block, while each block is in cache (BatchNormStats' sums after a
     * convolution, cg_fuse.c).  NULL: the node always reads its input in
     * its own kernel. */
    const struct CgRows *cg_rows;
    /* Ops that compute differently in training (BatchNormalization with
     * batch statistics, Dropout): replaces node n, before the backward
     * sweep, with the nodes that train it (built with the grad.h
     * builders; n itself may be turned into one of them).  NULL: the
     * node trains as it is. */
    bool (*train_form)(GradCtx *c, Node *n);
    /* The kernel the eval step runs for the node (running statistics
     * instead of the batch's, no dropout).  NULL: the same kernel as the
     * train step.  A rule that emits nothing leaves the node out of the
     * eval step. */
    bool (*cg_eval)(Cg *c, const Node *n);
    /* Input slots the shape rule reads at compile time (Resize's roi and
     * scales): bit i = input i.  A float initializer there is a constant
     * operand, not a trainable weight. */
    uint32_t const_inputs;
    /* Bit k: output k is a sum over this replica's rows that the plan sums
     * over the replicas of the stage (STEP_ALLREDUCE, right after the
     * node) when the node's "replicas" attribute is above 1: batch
     * statistics computed over the global batch. */
    uint32_t replica_sums;
    /* The kernel names its node in a run-time error (an index out of
     * range, cg_checked_index), so the node never runs another node's
     * kernel (codegen/cg_share.c), whose message would name that one. */
    bool names_node;
    /* Bit i: input i is a once-per-step sum the node adds into (it is
     * also in mutates_inputs) over what its own stage holds.  With stages,
     * the plan runs every such node of a stage before the stage's other
     * once-per-step work, then sums input i over the stages of the replica
     * (STEP_ALLREDUCE over the replica's group), and runs every
     * once-per-step node that reads the sum on every stage.  Gradient
     * clipping's sum of squares (GradNormSq). */
    uint32_t stage_sums;
} OpDef;

enum { DENSE_GEMM = 1, DENSE_CONV = 2 };

/* Table lookup by (domain, name); NULL if unknown. */
const OpDef *op_lookup(const char *domain, const char *name);
/* The whole table, for listings ("what is supported"). */
const OpDef *const *op_table(int *count);
const AttrSpec *op_attr_spec(const OpDef *def, const char *name);
/* "Add, Concat, Conv, ..." into buf, for error messages. */
const char *op_supported_list(char *buf, size_t len);
/* In a training graph, matrix products (MatMul, MatMulT) whose 2-D
 * operand is a float32 Transpose's output read the Transpose's input in
 * place instead (MatMulT's permA/permB), a Transpose of a weight
 * gradient's fold product becomes the product with its operands swapped,
 * and Transposes nobody reads any more are removed: the exporter's W^T of
 * every Linear layer over 3-D inputs then costs no copy, forward or
 * backward.  Returns the Transposes folded, or -1 when out of memory
 * (ops_linalg.c). */
int matmul_fold_transposes(Graph *g);

#endif
