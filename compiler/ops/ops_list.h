/* ops_list.h - every supported op, once.  X(name) expands to the entry
 * op_<name> defined in one of the ops_*.c files; ops.c builds the lookup
 * table from this list and ops_families.h declares the entries from it. */
X(Abs) X(Add) X(AveragePool) X(BatchNormalization) X(Cast) X(Concat) X(Constant)
X(ConstantOfShape) X(Conv) X(Div) X(Dropout) X(Equal) X(Erf) X(Exp) X(Expand)
X(Flatten) X(Gather) X(Gemm) X(GlobalAveragePool) X(Greater) X(Identity)
X(LayerNormalization) X(LeakyRelu) X(Less) X(Log) X(LogSoftmax) X(MatMul)
X(MaxPool) X(Mul) X(Neg) X(Not) X(Pow) X(Range) X(Reciprocal) X(ReduceMax)
X(ReduceMean) X(ReduceSum) X(Relu) X(Reshape) X(Shape) X(Sigmoid) X(Slice)
X(Softmax) X(Sqrt) X(Squeeze) X(Sub) X(Tanh) X(Transpose) X(Unsqueeze) X(Where)
