/* tensor_data.h - TensorProto contents into normalised Const storage. */
#ifndef CLEAVE_TENSOR_DATA_H
#define CLEAVE_TENSOR_DATA_H

#include "onnx.pb-c.h"
#include "../ir/ir.h"

/* Fills v's dtype, shape and konst from t.  `model_dir` anchors external
 * data; `what` names the tensor's owner in messages ("initializer 'w'"). */
bool tensor_to_value(Graph *g, const Onnx__TensorProto *t, const char *model_dir, const char *what,
                     Value *v, Diag *d);

#endif
