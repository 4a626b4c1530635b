"""PyTorch reference models and the reference trainer for `cleave compile`.

Everything the training-equivalence tests need on the torch side lives here:

- small models (Gemm MLP, MatMul MLP on a 3-D input, a residual MLP, an
  activation variant, the hard activations with Pad, Split and Slice, a
  small U-Net, and two models whose first output already is the loss), each built
  deterministically from a fixed seed;
- export_onnx(): the export settings for these tests (opset 13 unless the
  model says otherwise, fixed batch, training mode, no constant folding)
  and a check that every initializer is exactly one parameter, named by
  its model.state_dict() key;
- make_data(): the numpy data set of a model and loss;
- batch_rows() / shuffle_permutation(): which rows each step uses, as the
  runtime defines it (plain wrap-around, or splitmix64 + Fisher-Yates);
- OptimConfig: one optimizer setting, as cleave flags and as torch.optim;
- train_reference(): trains a fresh model in torch on the same batches and
  records each step's loss before the update.

Import it with Debian's /usr/bin/python3 (torch 1.13, onnx 1.12, numpy).
"""

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 13
SEED = 0           # torch.manual_seed for the weights
DATA_SEED = 1234   # numpy seed for the data sets
LABELS = "labels"  # name of the labels graph input (added by cleave, or the model's own)
INPUT = "input"    # name of every model's data input


# ------------------------------------------------------------------- models


class MLPGemm(nn.Module):
    """[B,20] -> 32 -> ReLU -> 16 -> Tanh -> 5.  Linear on 2-D exports as Gemm."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


class MLPMatMul(nn.Module):
    """[B,4,20] -> Linear 12 -> Sigmoid -> Linear 3 -> [B,4,3].

    Linear on a 3-D input exports as Transpose(W) -> MatMul -> Add.  With
    flatten=True the result is flattened to logits [B,12] (ONNX Flatten).
    """

    def __init__(self, flatten):
        super().__init__()
        self.flatten = flatten
        self.fc1 = nn.Linear(20, 12)
        self.fc2 = nn.Linear(12, 3)

    def forward(self, x):
        y = self.fc2(torch.sigmoid(self.fc1(x)))
        return torch.flatten(y, 1) if self.flatten else y


class ResidualMLP(nn.Module):
    """[B,20] -> 24 -> ReLU, then h + fc_b(tanh(fc_a(h))), then -> 5."""

    def __init__(self):
        super().__init__()
        self.fc_in = nn.Linear(20, 24)
        self.fc_a = nn.Linear(24, 24)
        self.fc_b = nn.Linear(24, 24)
        self.fc_out = nn.Linear(24, 5)

    def forward(self, x):
        h = F.relu(self.fc_in(x))
        h = h + self.fc_b(torch.tanh(self.fc_a(h)))
        return self.fc_out(h)


class ActMLP(nn.Module):
    """[B,20] -> 24 -> LeakyReLU(0.1) -> 24 -> Sigmoid -> 5 (Gemm path)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 24)
        self.fc2 = nn.Linear(24, 24)
        self.fc3 = nn.Linear(24, 5)

    def forward(self, x):
        h = F.leaky_relu(self.fc1(x), negative_slope=0.1)
        return self.fc3(torch.sigmoid(self.fc2(h)))


class HardOpsNet(nn.Module):
    """[B,20] -> 24, scaled by 4 so that every part of the hard activations
    is reached, split into 6 | 8 | 10: Hardsigmoid, Hardswish, and ReLU6
    sliced by step 2 and by 1:-1 and flipped (Slice with step -1); the 27
    features as [B,1,3,9] padded constant (0.5), reflect and replicate,
    flattened and concatenated (36 + 48 + 44) -> 5.

    nn.ReLU6 exports as Clip with constant bounds, Hardsigmoid as
    HardSigmoid, Hardswish as HardSigmoid and Mul at opset 13 and as
    HardSwish from 14, F.pad as Pad (edge for replicate), torch.split as
    Split and the slices as Slice.
    """

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 24)
        self.hsig = nn.Hardsigmoid()
        self.hswish = nn.Hardswish()
        self.relu6 = nn.ReLU6()
        self.fc2 = nn.Linear(128, 5)

    def forward(self, x):
        a, b, c = torch.split(self.fc1(x) * 4.0, [6, 8, 10], dim=1)
        c = self.relu6(c)
        h = torch.cat([self.hsig(a), self.hswish(b), c[:, ::2], torch.flip(c[:, 1:-1], [1])], 1)
        h = h.view(-1, 1, 3, 9)
        p = [F.pad(h, (1, 2), mode="constant", value=0.5),
             F.pad(h, (2, 1, 1, 0), mode="reflect"),
             F.pad(h, (1, 1, 0, 1), mode="replicate")]
        return self.fc2(torch.cat([t.flatten(1) for t in p], 1))


class TinyUNet(nn.Module):
    """A U-Net in miniature on [B,3,8,8]: two encoder levels (Conv 3x3 +
    ReLU, a depthwise 3x3 and a grouped 3x3 on the second, MaxPool 2), a
    bottleneck at 2x2, and a decoder that upsamples with
    ConvTranspose2d(2, stride 2) and with ConvTranspose2d(3, stride 2,
    padding 1, output_padding 1, groups 4), concatenating the encoder's
    features (torch.cat skips).  Beside them the bottleneck and the first
    decoder level are brought to 8x8 with nn.Upsample(scale_factor=2,
    mode='nearest') and F.interpolate(mode='bilinear') with align_corners
    False (scale 4) and True (scale 2); everything is concatenated, mixed
    by a 1x1 Conv and read out by a Linear -> 5.

    At opset 13 and 17 the upsampling exports as Resize (asymmetric/floor,
    half_pixel, align_corners; scales constant).  With bilinear=False (no
    interpolate, which opset 9 exports as asymmetric Upsample, not what
    PyTorch computes) it is exported at opset 9, nn.Upsample as Upsample.
    """

    def __init__(self, bilinear=True):
        super().__init__()
        self.bilinear = bilinear
        self.enc1 = nn.Conv2d(3, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 12, 3, padding=1)
        self.depthwise = nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.grouped = nn.Conv2d(12, 12, 3, padding=1, groups=3)
        self.bottom = nn.Conv2d(12, 16, 3, padding=1)
        self.up1 = nn.ConvTranspose2d(16, 12, 2, stride=2)
        self.dec1 = nn.Conv2d(24, 12, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(12, 8, 3, stride=2, padding=1, output_padding=1, groups=4)
        self.nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.mix = nn.Conv2d(44 + (28 if bilinear else 0), 2, 1)
        self.fc = nn.Linear(128, 5)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))                                   # 8 x 8x8
        e2 = F.relu(self.enc2(F.max_pool2d(e1, 2)))                 # 12 x 4x4
        e2 = F.relu(self.grouped(F.relu(self.depthwise(e2))))
        b = F.relu(self.bottom(F.max_pool2d(e2, 2)))                # 16 x 2x2
        d1 = F.relu(self.dec1(torch.cat([self.up1(b), e2], 1)))     # 12 x 4x4
        parts = [self.up2(d1), e1, self.nearest(d1), self.nearest(self.nearest(b))]  # 8+8+12+16
        if self.bilinear:
            parts += [F.interpolate(b, scale_factor=4, mode="bilinear", align_corners=False),
                      F.interpolate(d1, scale_factor=2, mode="bilinear", align_corners=True)]
        h = self.mix(torch.cat(parts, 1))                           # 2 x 8x8
        return self.fc(h.flatten(1))


class CELossModel(nn.Module):
    """MLPGemm followed by nn.CrossEntropyLoss: outputs the scalar mean loss.

    torch 1.13 exports the loss as one SoftmaxCrossEntropyLoss node
    (reduction "mean") taking the int64 graph input "labels".
    """

    def __init__(self):
        super().__init__()
        self.net = MLPGemm()
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, labels):
        return self.loss(self.net(x), labels)


class MSELossModel(nn.Module):
    """ResidualMLP followed by mean((y - labels)^2) written out by hand.

    torch 1.13 cannot export aten::mse_loss, so the loss is spelled with
    Sub, Mul and ReduceMean; "labels" is a float32 graph input [B,5].
    """

    def __init__(self):
        super().__init__()
        self.net = ResidualMLP()

    def forward(self, x, labels):
        d = self.net(x) - labels
        return (d * d).mean()


@dataclass(frozen=True)
class TrainSpec:
    name: str
    cls: Callable[[], nn.Module]
    sample_shape: Tuple[int, ...]   # one input row, without the batch axis
    out_shape: Tuple[int, ...]      # one output row (logits / prediction), without batch
    losses: Tuple[str, ...]         # the --loss kinds this model is tested with
    description: str
    # For --loss model: the kind of labels the model takes itself.
    model_labels: Optional[str] = None  # "class" (int64 [B]) or "float" (like out_shape)
    opset: int = OPSET              # ONNX opset the model is exported at

    def build(self, seed=SEED):
        torch.manual_seed(seed)
        model = self.cls()
        model.train()
        return model

    @property
    def classes(self):
        """Number of classes for ce: the size of the flat logits row."""
        return int(np.prod(self.out_shape))


MODELS: Dict[str, TrainSpec] = {
    "mlp_gemm": TrainSpec(
        "mlp_gemm", MLPGemm, (20,), (5,), ("ce", "mse"),
        "Gemm MLP 20-32-16-5, ReLU and Tanh"),
    "mlp_matmul_flat": TrainSpec(
        "mlp_matmul_flat", lambda: MLPMatMul(flatten=True), (4, 20), (12,), ("ce", "mse"),
        "MatMul+Add MLP on [B,4,20], Sigmoid, flattened to [B,12]"),
    "mlp_matmul_seq": TrainSpec(
        "mlp_matmul_seq", lambda: MLPMatMul(flatten=False), (4, 20), (4, 3), ("mse",),
        "MatMul+Add MLP on [B,4,20], Sigmoid, output [B,4,3]"),
    "residual": TrainSpec(
        "residual", ResidualMLP, (20,), (5,), ("ce", "mse"),
        "residual MLP: h + fc_b(tanh(fc_a(h)))"),
    "act_mlp": TrainSpec(
        "act_mlp", ActMLP, (20,), (5,), ("ce", "mse"),
        "Gemm MLP with LeakyReLU(0.1) and Sigmoid"),
    "hard_ops13": TrainSpec(
        "hard_ops13", HardOpsNet, (20,), (5,), ("ce", "mse"),
        "ReLU6, Hardsigmoid, Hardswish, Pad (3 modes), Split, Slice; opset 13"),
    "hard_ops17": TrainSpec(
        "hard_ops17", HardOpsNet, (20,), (5,), ("ce", "mse"),
        "the same at opset 17 (HardSwish as one op)", opset=17),
    "unet13": TrainSpec(
        "unet13", TinyUNet, (3, 8, 8), (5,), ("ce", "mse"),
        "U-Net: Conv, depthwise and grouped Conv, MaxPool, ConvTranspose (stride 2, and grouped "
        "with output_padding), nearest and bilinear Resize, Concat skips; opset 13"),
    "unet17": TrainSpec(
        "unet17", TinyUNet, (3, 8, 8), (5,), ("ce", "mse"), "the same at opset 17", opset=17),
    "unet9": TrainSpec(
        "unet9", lambda: TinyUNet(bilinear=False), (3, 8, 8), (5,), ("ce", "mse"),
        "the same without bilinear interpolation at opset 9 (Upsample)", opset=9),
    "ce_loss_model": TrainSpec(
        "ce_loss_model", CELossModel, (20,), (5,), ("model",),
        "Gemm MLP + CrossEntropyLoss (SoftmaxCrossEntropyLoss node) as output",
        model_labels="class"),
    "mse_loss_model": TrainSpec(
        "mse_loss_model", MSELossModel, (20,), (5,), ("model",),
        "residual MLP + mean squared error (Sub, Mul, ReduceMean) as output",
        model_labels="float"),
}


# ------------------------------------------------------------------- export


def _example_inputs(spec, batch, seed=99):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((batch,) + spec.sample_shape, generator=g)
    if spec.model_labels == "class":
        return (x, torch.randint(0, spec.classes, (batch,), generator=g))
    if spec.model_labels == "float":
        return (x, torch.randn((batch,) + spec.out_shape, generator=g))
    return (x,)


def input_names(spec):
    return [INPUT, LABELS] if spec.model_labels else [INPUT]


def export_onnx(spec, model, path, batch, dynamic_batch=False):
    """Export `model` at a fixed batch (or a dynamic one named "batch").

    The spec's opset (13 by default), training mode, no constant folding: every parameter stays one
    initializer with its state_dict() name (Linear weights keep their [out,in]
    layout; the MatMul path transposes them with a Transpose node).  Raises
    if the initializers and the parameters do not correspond one to one.
    """
    import onnx
    from onnx import numpy_helper

    names = input_names(spec)
    out_name = "loss" if spec.model_labels else "output"
    dyn = None
    if dynamic_batch:
        dyn = {n: {0: "batch"} for n in names}
        if not spec.model_labels:
            dyn[out_name] = {0: "batch"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, _example_inputs(spec, batch), path,
            export_params=True,
            opset_version=spec.opset,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=names,
            output_names=[out_name],
            dynamic_axes=dyn,
        )

    graph = onnx.load(path).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if sorted(inits) != sorted(state):
        raise RuntimeError("%s: initializers %s do not match state_dict keys %s"
                           % (path, sorted(inits), sorted(state)))
    for k, v in state.items():
        a = inits[k]
        if a.dtype != np.float32 or a.shape != v.shape or not np.array_equal(a, v):
            raise RuntimeError("%s: initializer %s differs from parameter (%s %s vs %s %s)"
                               % (path, k, a.dtype, a.shape, v.dtype, v.shape))
    return path


# --------------------------------------------------------------------- data


def make_data(spec, loss, n, seed=DATA_SEED):
    """Inputs and labels of one data set: {graph input name: array}.

    x is standard normal.  The labels come from a fixed random linear
    "teacher" applied to the flattened row, so that there is something to
    learn: ce / class labels are its argmax, int64 [n] in [0, classes);
    mse / float labels are tanh of it, float32 [n, *out_shape].
    """
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((n,) + spec.sample_shape).astype(np.float32)
    teacher = np.random.RandomState(DATA_SEED + 7).standard_normal(
        (int(np.prod(spec.sample_shape)), spec.classes))
    z = x.reshape(n, -1).astype(np.float64) @ teacher / np.sqrt(teacher.shape[0])
    kind = spec.model_labels if loss == "model" else ("class" if loss == "ce" else "float")
    if kind == "class":
        y = np.argmax(z, axis=1).astype(np.int64)
    else:
        y = np.tanh(z).reshape((n,) + spec.out_shape).astype(np.float32)
    return {INPUT: x, LABELS: y}


# ------------------------------------------------------------- batch order

MASK64 = (1 << 64) - 1
SHUFFLE_SEED_MULT = 1000003


class SplitMix64:
    """splitmix64 (Steele, Lea, Flood) with explicit 64-bit wrap-around."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def shuffle_permutation(n, seed, epoch):
    """Row order of one epoch under --shuffle SEED.

    The generator is seeded with SEED*1000003 + epoch (epoch counted from 0,
    modulo 2^64); starting from the identity, Fisher-Yates runs for i from
    n-1 down to 1 with j = next() % (i+1) and swaps rows i and j.
    """
    rng = SplitMix64(seed * SHUFFLE_SEED_MULT + epoch)
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.next() % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def steps_per_epoch(n, batch):
    """ceil(n / batch): an epoch's last batch is completed from its start."""
    return -(-n // batch)


def batch_rows(step, batch, n, shuffle_seed=None):
    """Rows used by 0-based `step`, as runtime/rt_batch.c defines them.

    Step s lies in epoch e = s // S at position i = s % S of it, with
    S = ceil(n / B) steps per epoch; it takes the rows P_e[(i*B + r) mod n]
    for r in 0..B-1, P_e being the identity without --shuffle and
    shuffle_permutation(n, SEED, e) with it.  When B divides n this is
    simply row (s*B + r) mod n; otherwise the last batch of each epoch wraps
    around to the epoch's first rows and the next epoch starts afresh at
    P_e[0].
    """
    per_epoch = steps_per_epoch(n, batch)
    e, i = divmod(step, per_epoch)
    perm = None if shuffle_seed is None else shuffle_permutation(n, shuffle_seed, e)
    rows = []
    for r in range(batch):
        k = (i * batch + r) % n
        rows.append(k if perm is None else perm[k])
    return rows


# --------------------------------------------------------------- optimizers


@dataclass
class OptimConfig:
    kind: str                      # sgd | momentum | adam
    lr: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    freeze: List[str] = field(default_factory=list)
    custom_betas: bool = False     # pass --beta1/--beta2/--eps explicitly

    def cleave_flags(self):
        f = ["--optimizer", self.kind, "--lr", repr(self.lr)]
        if self.kind == "momentum":
            f += ["--momentum", repr(self.momentum)]
            if self.nesterov:
                f.append("--nesterov")
        if self.kind == "adam" and self.custom_betas:
            f += ["--beta1", repr(self.beta1), "--beta2", repr(self.beta2), "--eps", repr(self.eps)]
        if self.weight_decay:
            f += ["--weight-decay", repr(self.weight_decay)]
        if self.freeze:
            f += ["--freeze", ",".join(self.freeze)]
        return f

    def torch_optimizer(self, params, lr=None):
        lr = self.lr if lr is None else lr
        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=lr, weight_decay=self.weight_decay)
        if self.kind == "momentum":
            return torch.optim.SGD(params, lr=lr, momentum=self.momentum, dampening=0,
                                   nesterov=self.nesterov, weight_decay=self.weight_decay)
        if self.kind == "adam":
            return torch.optim.Adam(params, lr=lr, betas=(self.beta1, self.beta2), eps=self.eps,
                                    weight_decay=self.weight_decay)
        raise ValueError("unknown optimizer %r" % self.kind)

    def describe(self):
        s = self.kind
        if self.kind == "momentum":
            s += "(mu=%g%s)" % (self.momentum, ", nesterov" if self.nesterov else "")
        if self.kind == "adam":
            s += "(b1=%g, b2=%g, eps=%g)" % (self.beta1, self.beta2, self.eps)
        s += " lr=%g" % self.lr
        if self.weight_decay:
            s += " wd=%g" % self.weight_decay
        if self.freeze:
            s += " freeze=%s" % ",".join(self.freeze)
        return s


# ----------------------------------------------------------------- training


def loss_fn(spec, loss, model, x, y):
    if loss == "model":
        return model(x, y)
    out = model(x)
    if loss == "ce":
        return F.cross_entropy(out, y)            # mean over the batch
    if loss == "mse":
        return F.mse_loss(out, y)                 # mean over every element
    raise ValueError("unknown loss %r" % loss)


@dataclass
class Reference:
    losses: List[float]                 # loss of each step, before its update
    weights: Dict[str, np.ndarray]      # state_dict() after the last step
    initial: Dict[str, np.ndarray]      # state_dict() before training
    model: nn.Module


def train_reference(spec, loss, opt, data, batch, steps, lr=None, shuffle_seed=None,
                    dtype=torch.float32):
    """Train a fresh spec.build() in torch the way the compiled program does.

    dtype=torch.float64 repeats the same training (same initial weights) in
    double precision, to see how far float32 rounding alone moves the result.
    """
    model = spec.build().to(dtype)
    initial = {k: v.detach().clone().numpy() for k, v in model.state_dict().items()}
    named = dict(model.named_parameters())
    unknown = [n for n in opt.freeze if n not in named]
    if unknown:
        raise ValueError("--freeze names %s are not parameters of %s" % (unknown, spec.name))
    for n in opt.freeze:
        named[n].requires_grad_(False)
    trainable = [p for n, p in named.items() if n not in opt.freeze]
    optimizer = opt.torch_optimizer(trainable, lr=lr)

    x_all = torch.from_numpy(data[INPUT]).to(dtype)
    y_all = torch.from_numpy(data[LABELS])
    if y_all.is_floating_point():
        y_all = y_all.to(dtype)
    n = x_all.shape[0]
    losses = []
    for step in range(steps):
        idx = torch.tensor(batch_rows(step, batch, n, shuffle_seed), dtype=torch.long)
        optimizer.zero_grad(set_to_none=True)
        l = loss_fn(spec, loss, model, x_all[idx], y_all[idx])
        losses.append(float(l.item()))
        l.backward()
        optimizer.step()
    weights = {k: v.detach().clone().numpy() for k, v in model.state_dict().items()}
    return Reference(losses, weights, initial, model)


def forward(model, x):
    """The model's first output for every row of x (no gradient)."""
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()
