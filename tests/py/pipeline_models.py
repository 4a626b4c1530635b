"""Models for the layer / pipeline / hybrid equivalence test.

Two models made to stress a stage split, next to two plain ones:

- "skip": h1 = relu(fc1(x)); h2 = relu(fc2(h1)); h3 = relu(fc3(h2)) + h1;
  out = fc4(h3).  The skip connection h1 is produced by node /Relu and read
  again by /Add, three layers later, so a split can put its producer and its
  last consumer on stages that are not neighbours;
- "tied": an embedding-style weight W = enc.weight [24,16] used twice:
  h1 = tanh(x @ W.T + b) (node /enc/Gemm), then, after a middle layer,
  h3 = h2 @ W (node /MatMul).  The exported file holds W as one initializer
  read by both nodes, so a split between them puts the two uses of one
  parameter on different stages;
- "mlp_gemm" from train_models.py and "cnn" (torch_models.CNN: two
  Conv/ReLU/MaxPool blocks and a Linear classifier on 28x28 images), split
  by the compiler's own balancing (no --stages).

STAGES gives, per model and stage count, the --stages cut list: the first
ONNX node of every stage after the first.  The node names are the ones
torch 1.13's exporter gives (module path + op, numbered _1, _2 ... when an
op repeats in one scope); stage_of_nodes(), consumers() and output_of()
read the exported file so that the test can confirm where the cuts fall.

Everything is exported and trained with train_models.py (TrainSpec,
export_onnx, make_data, OptimConfig), so the exports follow the same rules:
opset 13, fixed batch, one initializer per state_dict() entry.
"""

from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_models
import train_models as tm


class SkipMLP(nn.Module):
    """[B,20] -> 24 -> 24 -> 24 (+ skip from the first hidden layer) -> 5."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 24)
        self.fc2 = nn.Linear(24, 24)
        self.fc3 = nn.Linear(24, 24)
        self.fc4 = nn.Linear(24, 5)

    def forward(self, x):
        h1 = F.relu(self.fc1(x))
        h2 = F.relu(self.fc2(h1))
        h3 = F.relu(self.fc3(h2)) + h1
        return self.fc4(h3)


class TiedMLP(nn.Module):
    """[B,16] -> enc (W [24,16]) -> Tanh -> mid 24 -> ReLU -> @W -> Tanh -> head 5.

    enc.weight is read twice: by enc's Gemm (x @ W.T + b) and by a MatMul
    (h @ W) that projects back to 16 features.
    """

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(16, 24)
        self.mid = nn.Linear(24, 24)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h1 = torch.tanh(self.enc(x))
        h2 = F.relu(self.mid(h1))
        h3 = torch.tanh(torch.matmul(h2, self.enc.weight))
        return self.head(h3)


MODELS: Dict[str, tm.TrainSpec] = {
    "skip": tm.TrainSpec(
        "skip", SkipMLP, (20,), (5,), ("ce", "mse"),
        "Gemm MLP 20-24-24-24-5 whose first hidden layer skips to after the third"),
    "tied": tm.TrainSpec(
        "tied", TiedMLP, (16,), (5,), ("ce", "mse"),
        "MLP 16-24-24-16-5 whose first weight is used again, untransposed, by a MatMul"),
    "mlp_gemm": tm.MODELS["mlp_gemm"],
    "cnn": tm.TrainSpec(
        "cnn", torch_models.CNN, (1, 28, 28), (10,), ("ce",),
        "CNN: 2x (Conv3x3, ReLU, MaxPool2), Linear(784, 10)"),
}

# --stages per model and number of stages (absent: the compiler balances).
#
# skip, nodes in file order: /fc1/Gemm /Relu | /fc2/Gemm /Relu_1 |
#   /fc3/Gemm /Relu_2 /Add | /fc4/Gemm.  With 4 stages h1 (/Relu) is made on
#   stage 0 and read by /fc2/Gemm on stage 1 and by /Add on stage 2; with 2
#   stages (cut at /fc3/Gemm) the whole of fc2 lies between them on stage 0
#   and /Add on stage 1.
# tied, nodes in file order: /enc/Gemm /Tanh | /mid/Gemm | /Relu |
#   /MatMul /Tanh_1 /head/Gemm.  With 4 stages W is read on stages 0 and 3,
#   with 2 stages (cut at /MatMul) on stages 0 and 1.
STAGES: Dict[str, Dict[int, Tuple[str, ...]]] = {
    "skip": {2: ("/fc3/Gemm",), 4: ("/fc2/Gemm", "/fc3/Gemm", "/fc4/Gemm")},
    "tied": {2: ("/MatMul",), 4: ("/mid/Gemm", "/Relu", "/MatMul")},
}

SKIP_PRODUCER = "/Relu"   # makes h1
SKIP_CONSUMER = "/Add"    # h3 + h1
TIED_WEIGHT = "enc.weight"


def stage_of_nodes(onnx_path, cuts) -> Dict[str, int]:
    """The stage of every node of the exported file under the cut list
    `cuts` (file order, as the compiler splits): {node name: stage}.
    Raises when a cut names no node or the cuts are out of order."""
    import onnx

    names = [n.name for n in onnx.load(onnx_path).graph.node]
    starts = []
    for c in cuts:
        if c not in names:
            raise ValueError("%s: no node named %r (nodes: %s)" % (onnx_path, c, names))
        starts.append(names.index(c))
    if starts != sorted(starts) or len(set(starts)) != len(starts) or (starts and starts[0] == 0):
        raise ValueError("%s: cuts %s are out of order or leave a stage empty" % (onnx_path, list(cuts)))
    out, stage = {}, 0
    for i, n in enumerate(names):
        while stage < len(starts) and i >= starts[stage]:
            stage += 1
        out[n] = stage
    return out


def consumers(onnx_path, value) -> List[str]:
    """Names of the nodes of the file that read `value`."""
    import onnx

    return [n.name for n in onnx.load(onnx_path).graph.node if value in n.input]


def output_of(onnx_path, node) -> str:
    """The first output of node `node` of the file."""
    import onnx

    for n in onnx.load(onnx_path).graph.node:
        if n.name == node:
            return n.output[0]
    raise ValueError("%s: no node named %r" % (onnx_path, node))
