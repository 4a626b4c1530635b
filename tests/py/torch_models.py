"""Reference PyTorch models for cleave's samples and tests.

Each model is described by a ModelSpec: how to build it (deterministically,
from a fixed seed), the shape of one input sample (without the batch axis),
and the names used for the ONNX graph input and output.  export_onnx() holds
the single set of export settings used both by samples/export_samples.py and
by the tests, so a freshly exported model matches the committed samples.
"""

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 13
BATCH_AXIS = "batch"
SEED = 0


class MLP(nn.Module):
    """28x28 image -> 10 logits through two hidden ReLU layers."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.flatten(x)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    """Two conv/ReLU/max-pool stages followed by a linear classifier."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        return self.fc(self.flatten(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention built from Linear, matmul and softmax.

    The head split and merge reshape with sizes read from x.shape, so the
    exported graph computes them at run time (Shape -> Gather -> Unsqueeze ->
    Concat -> Reshape) rather than baking them in.
    """

    def __init__(self, dim, num_heads):
        super().__init__()
        assert dim % num_heads == 0
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        B, T = x.shape[0], x.shape[1]
        H, D = self.num_heads, self.head_dim
        # [B, T, C] -> [B, H, T, D]
        q = self.q(x).reshape(B, T, H, D).transpose(1, 2)
        k = self.k(x).reshape(B, T, H, D).transpose(1, 2)
        v = self.v(x).reshape(B, T, H, D).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # [B, H, T, T]
        attn = torch.softmax(scores, dim=-1)
        y = attn @ v  # [B, H, T, D]
        y = y.transpose(1, 2).reshape(B, T, H * D)
        return self.out(y)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm transformer block: attention and MLP, each residual."""

    def __init__(self, dim=32, num_heads=2, hidden=64):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = F.gelu(self.fc1(self.ln2(x)))  # exact (erf) GELU
        return x + self.fc2(h)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, and a
    1x1 projection on the shortcut when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNet(nn.Module):
    """A small ResNet for 28x28 images: a 3x3 stem and three basic blocks
    of 16, 32 and 64 channels (the last two halving the resolution), global
    average pooling and a linear classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    cls: Callable[[], nn.Module]
    sample_shape: Tuple[int, ...]  # one input sample, without the batch axis
    input_name: str
    output_name: str
    description: str

    def build(self, seed=SEED):
        """The model with weights fixed by `seed`, in eval mode."""
        torch.manual_seed(seed)
        model = self.cls()
        model.eval()
        return model

    def example_input(self, batch, seed=1234):
        gen = torch.Generator().manual_seed(seed)
        return torch.randn((batch,) + tuple(self.sample_shape), generator=gen)


MODELS = {
    "mlp": ModelSpec(
        name="mlp",
        cls=MLP,
        sample_shape=(1, 28, 28),
        input_name="input",
        output_name="logits",
        description="MLP 784-256-128-10 with ReLU for 28x28 images",
    ),
    "cnn": ModelSpec(
        name="cnn",
        cls=CNN,
        sample_shape=(1, 28, 28),
        input_name="input",
        output_name="logits",
        description="CNN: 2x (Conv3x3, ReLU, MaxPool2), Linear(784, 10)",
    ),
    "resnet": ModelSpec(
        name="resnet",
        cls=ResNet,
        sample_shape=(1, 28, 28),
        input_name="input",
        output_name="logits",
        description="ResNet: 3x3 stem and basic blocks of 16, 32, 64 channels with batch norm, for 28x28 images",
    ),
    "transformer": ModelSpec(
        name="transformer",
        cls=TransformerBlock,
        sample_shape=(16, 32),
        input_name="input",
        output_name="output",
        description="pre-LN transformer block: 2-head attention + GELU MLP, 16 tokens x 32 dims",
    ),
}


def param_count(model):
    return sum(p.numel() for p in model.parameters())


def export_onnx(spec, model, path, trace_batch=2):
    """Export `model` to `path` with the settings used for all samples.

    Traced with a batch of 2 (not 1) so no size-1 batch gets specialised; the
    batch axis is then declared dynamic under the name "batch".

    The export runs in training mode.  In eval mode torch's exporter merges
    initializers that merely hold equal values (e.g. two freshly built
    LayerNorms, all ones and all zeros), which would tie parameters that must
    train separately, and folds batch norm into the convolutions.  The
    resnet's batch norms export in their training form (docs/export.md);
    the other models have neither dropout nor batch norm.  Constant folding only
    pre-transposes Linear weights that feed MatMul, which keeps them trainable
    (stored as W^T); torch's warning about it is silenced here.
    """
    dummy = spec.example_input(trace_batch)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*constant folding be turned off.*")
        # batch norm's num_batches_tracked counter is not part of the graph
        warnings.filterwarnings("ignore", message=".*Removing mutation from node aten::add_.*")
        torch.onnx.export(
            model,
            (dummy,),
            path,
            export_params=True,
            training=torch.onnx.TrainingMode.TRAINING,
            opset_version=OPSET,
            do_constant_folding=True,
            input_names=[spec.input_name],
            output_names=[spec.output_name],
            dynamic_axes={
                spec.input_name: {0: BATCH_AXIS},
                spec.output_name: {0: BATCH_AXIS},
            },
        )
    return path
