#!/usr/bin/env python3
"""Fused element-wise chains, and kernels shared by twin nodes, change no bit.

cleave compiles chains of element-wise nodes into one loop (compiler/
codegen/cg_fuse.c), and runs a chain that follows a convolution on each
block of samples the convolution finishes; `--no-fuse` runs every node as
its own loop.  For the transformer sample (layer norms written out as
Sub/Pow/Div/Mul/Add), a model made of activation chains with a broadcast
parameter, and a small CNN whose packed and depthwise convolutions are
followed by chains (ReLU; a per-channel scale, Clip and a residual Add; a
leaky ReLU after a convolution whose batch does not split into whole
blocks), and a CNN trained with batch normalisation (the first sum of
its statistics taken in the blocks of the convolution before it; in the
eval step, the normalisation on the running statistics and the ReLU
after it run in the convolution's blocks), and one whose batch norm is
frozen in its inference form (fused in both steps), each under
single-process,
data-parallel and pipeline plans, this checks that the fused program
reports fused chains (for the CNNs, chains run on a convolution's blocks
or statistics summed there; and nodes reusing a twin's kernel,
cg_share.c), and that it trains to exactly the losses and the weights of
the unfused one, and predicts (the eval step, --predict) exactly its
outputs.

usage: test_fusion.py --cleave BIN [--workdir DIR]
Ends with "N passed, M failed"; SKIP (exit 77) without numpy, onnx, torch
or mpirun.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 16
STEPS = 4

LAYOUTS = {
    "single": [],
    "dp2": ["--ranks", "2", "--strategy", "dp"],
    "pipeline2": ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "4", "--schedule", "1f1b"],
}


def export_chains(path):
    """A model whose hidden layer is a long element-wise chain: GELU by erf,
    tanh scaled by a per-feature parameter (broadcast), a sigmoid gate, a
    division by sqrt, exp, and a leaky ReLU."""
    import torch
    from torch import nn

    class Chains(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(24, 32)
            self.b = nn.Linear(32, 10)
            self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 32))

        def forward(self, x):
            h = self.a(x)
            g = h * 0.5 * (1.0 + torch.erf(h / 1.4142135))
            g = torch.tanh(g) * self.scale + torch.sigmoid(-h)
            g = g / torch.sqrt(h * h + 1.0) - torch.exp(-(h * h))
            return self.b(nn.functional.leaky_relu(g, 0.2))

    torch.manual_seed(0)
    torch.onnx.export(Chains(), torch.randn(BATCH, 24), path, input_names=["input"], output_names=["output"],
                      opset_version=13, do_constant_folding=False,
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def export_convs(path):
    """Convolutions heading chains: a packed 3x3 convolution then ReLU; a
    depthwise one then a per-channel scale, Clip and a residual Add (whose
    other operand a later node reads too); a strided one without bias at
    5x5 outputs (blocks of 11 samples: a batch of 16 ends in a short
    block) then a leaky ReLU."""
    import torch
    from torch import nn

    class Convs(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 16, 3, padding=1)
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 16).view(16, 1, 1))
            self.c2 = nn.Conv2d(16, 24, 3, stride=2, padding=1, bias=False)
            self.fc = nn.Linear(24 * 25, 10)

        def forward(self, x):
            h = torch.relu(self.c1(x))
            h = torch.clamp(self.dw(h) * self.scale, -1.0, 1.0) + h
            h = nn.functional.leaky_relu(self.c2(h), 0.1)
            return self.fc(h.flatten(1))

    torch.manual_seed(0)
    torch.onnx.export(Convs(), torch.randn(BATCH, 3, 10, 10), path, input_names=["input"], output_names=["output"],
                      opset_version=13, do_constant_folding=False,
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def export_batchnorm(path):
    """Batch normalisation in training mode after a packed 3x3
    convolution, a depthwise one and a strided one without bias (whose
    batch of 16 ends in a short block), each followed by ReLU."""
    import torch
    from torch import nn

    class Norms(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 16, 3, padding=1)
            self.b1 = nn.BatchNorm2d(16)
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.b2 = nn.BatchNorm2d(16)
            self.c2 = nn.Conv2d(16, 24, 3, stride=2, padding=1, bias=False)
            self.b3 = nn.BatchNorm2d(24)
            self.fc = nn.Linear(24 * 25, 10)

        def forward(self, x):
            h = torch.relu(self.b1(self.c1(x)))
            h = torch.relu(self.b2(self.dw(h)))
            h = torch.relu(self.b3(self.c2(h)))
            return self.fc(h.flatten(1))

    torch.manual_seed(0)
    torch.onnx.export(Norms().train(), torch.randn(BATCH, 3, 10, 10), path, input_names=["input"],
                      output_names=["output"], opset_version=15, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def export_frozen(path):
    """Batch normalisation in its inference form, frozen on running
    statistics (an eval-mode model exported with TrainingMode.PRESERVE,
    which keeps the BatchNormalization node instead of folding it into the
    convolution), between each of three 3x3 convolutions (the last two
    twins) and a ReLU."""
    import torch
    from torch import nn

    class Frozen(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList([nn.Conv2d(3, 16, 3, padding=1)] +
                                       [nn.Conv2d(16, 16, 3, padding=1) for _ in range(2)])
            self.norms = nn.ModuleList([nn.BatchNorm2d(16) for _ in range(3)])
            self.fc = nn.Linear(16 * 100, 10)

        def forward(self, x):
            for conv, norm in zip(self.convs, self.norms):
                x = torch.relu(norm(conv(x)))
            return self.fc(x.flatten(1))

    torch.manual_seed(0)
    m = Frozen()
    with torch.no_grad():  # running statistics away from 0 and 1
        for norm in m.norms:
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
    torch.onnx.export(m.eval(), torch.randn(BATCH, 3, 10, 10), path, input_names=["input"], output_names=["output"],
                      opset_version=15, do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE,
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def data(work, name, x_shape, y):
    import numpy as np
    rng = np.random.default_rng(7)
    x = rng.standard_normal((BATCH * STEPS,) + x_shape).astype(np.float32)
    xp = os.path.join(work, name + "_x.npy")
    yp = os.path.join(work, name + "_y.npy")
    np.save(xp, x)
    if y == "ce":
        np.save(yp, rng.integers(0, 10, size=BATCH * STEPS).astype(np.int64))
    else:
        np.save(yp, rng.standard_normal((BATCH * STEPS,) + x_shape).astype(np.float32))
    return xp, yp


def train(rep, args, work, label, model, loss, flags, fuse, xp, yp):
    """Compiles, trains and predicts; (losses, weights, fused chain count,
    chains run on a convolution's blocks, statistics summed in them,
    predictions) or None."""
    tag = "%s_%s" % (label, "fused" if fuse else "apart")
    prog = os.path.join(work, tag + ".train")
    cmd = [args.cleave, "compile", model, "--batch", str(BATCH), "--loss", loss, "--optimizer", "adam",
           "--lr", "0.01", "-o", prog, "-v"] + flags + ([] if fuse else ["--no-fuse"])
    p, _ = harness.run(cmd, timeout=600)
    if not rep.check("%s: compiles" % tag, p.returncode == 0, harness.failure(cmd, p)):
        return None
    m = re.search(r"fused (\d+) element-wise chains \(\d+ nodes; (\d+) run on a convolution's blocks\)", p.stderr)
    chains, headed = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    m = re.search(r"and (\d+) batch statistics into a convolution's blocks", p.stderr)
    tails = int(m.group(1)) if m else -1
    m = re.search(r"(\d+) nodes share a twin's kernel", p.stderr)
    rep.check("%s: repeated layers share kernels (%s)" % (tag, m.group(1) if m else "?"), m and int(m.group(1)) > 0,
              p.stderr.strip()[-300:])
    metrics = os.path.join(work, tag + ".jsonl")
    saved = os.path.join(work, tag + ".onnx")
    pred = os.path.join(work, tag + ".pred.npy")
    run = [prog, "--data", "input=" + xp, "--data", "labels=" + yp, "--steps", str(STEPS), "--metrics", metrics,
           "--save", saved, "--eval-data", "input=" + xp, "--eval-data", "labels=" + yp, "--predict", pred]
    ranks = int(flags[flags.index("--ranks") + 1]) if "--ranks" in flags else 1
    if ranks > 1:
        run = harness.mpirun(ranks, run)
    p, _ = harness.run(run, env=harness.mpi_env(), timeout=600)
    if not rep.check("%s: trains" % tag, p.returncode == 0, harness.failure(run, p)):
        return None
    import numpy as np
    return harness.read_losses(metrics), harness.read_weights(saved), chains, headed, tails, np.load(pred)


def check_model(rep, args, work, name, model, loss, x_shape, headed=0, tails=0):
    import numpy as np
    xp, yp = data(work, name, x_shape, loss)
    for layout, flags in LAYOUTS.items():
        label = "%s %s" % (name, layout)
        fused = train(rep, args, work, label.replace(" ", "_"), model, loss, flags, True, xp, yp)
        apart = train(rep, args, work, label.replace(" ", "_"), model, loss, flags, False, xp, yp)
        if not fused or not apart:
            continue
        rep.check("%s: chains fused (%d)" % (label, fused[2] + fused[4]), fused[2] + fused[4] > 0,
                  "verbose output reports none")
        need = headed.get(layout, 0) if isinstance(headed, dict) else headed
        if need:
            rep.check("%s: at least %d chains run on a convolution's blocks (%d)" % (label, need, fused[3]),
                      fused[3] >= need, "verbose output reports fewer")
        if tails:
            rep.check("%s: %d statistics summed in a convolution's blocks (%d)" % (label, tails, fused[4]),
                      fused[4] == tails, "verbose output reports otherwise")
        rep.equal("%s: --no-fuse fuses nothing" % label, (apart[2], apart[4]), (0, 0))
        rep.check("%s: the same %d losses, bit for bit" % (label, STEPS),
                  len(fused[0]) == STEPS and fused[0] == apart[0], "fused %r, apart %r" % (fused[0], apart[0]))
        wf, wa = fused[1], apart[1]
        same = sorted(wf) == sorted(wa) and all(
            wf[k].shape == wa[k].shape and np.array_equal(wf[k].view(np.uint8), wa[k].view(np.uint8)) for k in wf)
        diff = [k for k in wf if k in wa and not np.array_equal(wf[k], wa[k])]
        rep.check("%s: the same trained weights, bit for bit" % label, same, "differ: %s" % diff[:5])
        pf, pa = fused[5], apart[5]
        rep.check("%s: the same predictions, bit for bit" % label,
                  pf.shape == pa.shape and np.array_equal(pf.view(np.uint8), pa.view(np.uint8)),
                  "largest difference %s" % (np.abs(pf - pa).max() if pf.shape == pa.shape else "(shapes differ)"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    why = harness.missing(("numpy", "onnx", "torch"), ("mpirun",))
    if why:
        return harness.skip(why)
    rep = harness.Report()
    if not rep.executable(args.cleave):
        return rep.summary()
    with harness.workdir(args.workdir, "cleave_fusion_") as work:
        chains = os.path.join(work, "chains.onnx")
        if rep.guarded("export the chains model", lambda: export_chains(chains) or True):
            check_model(rep, args, work, "chains", chains, "ce", (24,))
        convs = os.path.join(work, "convs.onnx")
        if rep.guarded("export the convolutions model", lambda: export_convs(convs) or True):
            check_model(rep, args, work, "convs", convs, "ce", (3, 10, 10), headed=2)
        norms = os.path.join(work, "norms.onnx")
        if rep.guarded("export the batch-norm model", lambda: export_batchnorm(norms) or True):
            # the eval step's Conv -> BatchNorm -> ReLU, each in the
            # convolution's blocks; on two stages the statistics crossing
            # from the first come between the strided convolution and its
            # batch norm, and that one runs apart
            check_model(rep, args, work, "norms", norms, "ce", (3, 10, 10),
                        headed={"single": 3, "dp2": 3, "pipeline2": 2}, tails=3)
        frozen = os.path.join(work, "frozen.onnx")
        if rep.guarded("export the frozen batch-norm model", lambda: export_frozen(frozen) or True):
            check_model(rep, args, work, "frozen", frozen, "ce", (3, 10, 10), headed=2)
        check_model(rep, args, work, "transformer", os.path.join(ROOT, "samples", "transformer.onnx"), "mse",
                    (16, 32))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
