/* ops_list.h - every supported op, once.  X(name) expands to the entry
 * op_<name> defined in one of the ops_*.c files; ops.c builds the lookup
 * table from this list and ops_families.h declares the entries from it. */
X(Abs) X(Add) X(And) X(AveragePool) X(BatchNormalization) X(Cast) X(CastLike)
X(Clip) X(Concat) X(Constant) X(ConstantOfShape) X(Conv) X(ConvTranspose) X(Div)
X(Dropout) X(Equal) X(Erf) X(Exp) X(Expand) X(Flatten) X(Gather) X(Gemm)
X(GlobalAveragePool) X(Greater) X(GreaterOrEqual) X(HardSigmoid) X(HardSwish)
X(Identity) X(LayerNormalization) X(LeakyRelu) X(Less) X(LessOrEqual) X(Log)
X(LogSoftmax) X(MatMul) X(Max) X(MaxPool) X(Min) X(Mod) X(Mul) X(Neg) X(Not)
X(Or) X(Pad) X(Pow) X(Range) X(Reciprocal) X(ReduceL1) X(ReduceL2) X(ReduceLogSum)
X(ReduceLogSumExp) X(ReduceMax) X(ReduceMean) X(ReduceMin) X(ReduceProd)
X(ReduceSum) X(ReduceSumSquare) X(Sum) X(Mean) X(Relu) X(Reshape) X(Resize) X(Shape)
X(Sigmoid) X(Size) X(Slice) X(Softmax) X(Split) X(Sqrt) X(Squeeze) X(Sub)
X(Tanh) X(Transpose) X(Trilu) X(Unsqueeze) X(Upsample) X(Where) X(Xor)
X(SoftmaxCrossEntropyLoss)
/* cleave's own ops (domain "cleave"): gradients and optimizer updates */
X(SoftmaxCrossEntropyLossGrad) X(SumTo) X(ReluGrad) X(LeakyReluGrad) X(SigmoidGrad)
X(TanhGrad) X(SoftmaxGrad) X(LogSoftmaxGrad) X(ReduceGrad) X(SGD) X(Adam) X(MatMulT)
/* gradients of convolution and normalisation (ops_nn.c, ops_batchnorm.c) and
 * of the pools (ops_pool.c) */
X(ConvGradInput) X(ConvGradWeight) X(ConvGradBias) X(MaxPoolGrad) X(AveragePoolGrad) X(BatchNormGrad) X(LayerNormGrad)
/* gradients of Clip, HardSigmoid and HardSwish (ops_elementwise.c), Slice
 * and Pad (ops_shape.c) */
X(ClipGrad) X(HardSigmoidGrad) X(HardSwishGrad) X(SliceGrad) X(PadGrad)
/* batch normalisation's training form (ops_batchnorm.c) */
X(BatchNormStats) X(BatchNormTrain) X(BatchNormMoment) X(BatchNormRunning) X(BatchNormGradStats) X(BatchNormGradInput)
/* dropout's training form (ops_dropout.c) */
X(DropoutTrain)
/* the gradient of Resize and Upsample (ops_resize.c) */
X(ResizeGrad)
/* the gradient of Gather (ops_gather.c) */
X(GatherGrad)
/* gradient clipping (ops_train.c) */
X(GradNormSq) X(ClipCoef)
