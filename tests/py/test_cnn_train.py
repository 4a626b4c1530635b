#!/usr/bin/python3
"""Check that the CNNs people train, exported from PyTorch in training mode,
train in cleave as in PyTorch, under every strategy.

For each architecture below (torchvision's, two of the test's own and
train_models' U-Net) at
a small input size:

1. Build it from a fixed seed; set every nn.Dropout's p to 0 (cleave's
   masks are keyed for partitioning and cannot be PyTorch's;
   test_dropout.py checks them).
2. Warm it up in PyTorch for WARMUP SGD steps on the test's data: fine-tuning
   starts from trained weights, and from a random init batch-norm nets at
   batch 8 drift apart in float32 itself within a step or two.
3. Export it as a user would for training:
       torch.onnx.export(model.train(), x, f, training=TrainingMode.TRAINING,
                         opset_version=OPSET, do_constant_folding=False)
   (no folding, so that initializers map one to one onto the parameters and
   buffers).
4. The reference: the warmed-up model continued for STEPS SGD steps in
   float64, in PyTorch, on batches i*B mod N.  PyTorch's own float32 run is
   printed beside it: for some of these nets (shufflenet at lr 1e-3) it
   leaves the float64 path faster than cleave does.
5. For each strategy (single; dp 2, whose replicas compute batch
   statistics over the global batch; layer 2; pipeline 2 x 2 micro-batches
   for the nets without batch norm, and for those with it dp 2 with
   --bn-stats local, against PyTorch DDP without SyncBatchNorm, emulated in
   float64 in one process): compile, train STEPS steps, and check
   every step's loss (rtol 1e-4) and every saved initializer: parameters
   and running variances rtol 1e-3, atol 1e-5; running means rtol 1e-3 of
   |mean| + std (the channel's spread, from the running variance: a mean
   near 0 is a difference of large terms, whose float32 rounding is
   relative to them).  And each parameter's change over the run, which
   small learning rates keep well inside rtol, must be the reference's
   within 1% or within twice the error of PyTorch's own float32 run (the
   2-norm of the difference over the 2-norm of the change): cleave's
   float32 is held to PyTorch's accuracy.

Prints PASS/FAIL lines and `N passed, M failed`; exits 1 on failure, 77
(skip) without torch, torchvision or mpirun.  --models picks some
architectures (the sanitizer build runs two).

    /usr/bin/python3 tests/py/test_cnn_train.py --cleave build/cleave --workdir /tmp/w [--models resnet18,cnn1d]
"""

import copy
import json
import os
import sys
import warnings

import harness

BATCH, N_ROWS, STEPS, WARMUP, WARMUP_LR = 8, 64, 8, 30, 0.01
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6
W_RTOL, W_ATOL = 1e-3, 1e-5
STEP_RTOL = 1e-2  # a parameter's change over the run, or twice PyTorch float32's own error

torch = None
np = None


def cnn1d():
    nn = torch.nn
    return nn.Sequential(nn.Conv1d(4, 16, 5, padding=2), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Conv1d(16, 32, 3, padding=1), nn.BatchNorm1d(32), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                         nn.Flatten(), nn.Linear(32, 10))


def densenet_small():
    import torchvision
    return torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2,
                                       num_classes=10)


def unet():
    """train_models' U-Net (ConvTranspose, Resize, Concat skips), over 10 classes."""
    import train_models
    m = train_models.TinyUNet()
    m.fc = torch.nn.Linear(m.fc.in_features, 10)
    return m


def tv(name):
    def make():
        import torchvision
        return getattr(torchvision.models, name)(num_classes=10)
    return make


# name: (constructor, sample shape, opset, lr, warm-up steps, has batch
# norm, batch axis dynamic).  The learning rates keep PyTorch's float32 and
# float64 runs within a small share of the tolerances over STEPS steps
# (mobilenet_v2's and shufflenet's BN-scaled gradients are in the
# hundreds).  squeezenet, without batch norm, needs no warm-up, and its
# last ReLU dies within a few dozen steps on random labels.  shufflenet's
# channel shuffle reshapes to x.size(0): exported at a fixed batch, that
# size is a constant, and a replica's rows would not fit it.
MODELS = {
    "resnet18": (tv("resnet18"), (3, 32, 32), 13, 1e-3, WARMUP, True, False),
    "mobilenet_v2": (tv("mobilenet_v2"), (3, 32, 32), 13, 1e-5, WARMUP, True, False),
    "mobilenet_v3_small": (tv("mobilenet_v3_small"), (3, 32, 32), 17, 1e-3, WARMUP, True, False),
    "shufflenet_v2_x0_5": (tv("shufflenet_v2_x0_5"), (3, 32, 32), 13, 1e-5, WARMUP, True, True),
    "squeezenet1_1": (tv("squeezenet1_1"), (3, 32, 32), 13, 1e-3, 0, False, False),
    "densenet_small": (densenet_small, (3, 32, 32), 13, 1e-3, WARMUP, True, False),
    "cnn1d": (cnn1d, (4, 64), 13, 1e-2, WARMUP, True, False),
    "unet": (unet, (3, 8, 8), 17, 1e-2, 0, False, False),
}


def make_data(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((N_ROWS,) + shape, generator=g)
    y = torch.randint(0, 10, (N_ROWS,), generator=g)
    return x, y


def deferred_running_stats(inputs, momentum):
    """torchgpipe's deferred batch norm: each BatchNorm's running
    statistics take one update from the whole batch, its micro-batches'
    inputs (captured in `inputs`) together, with its own momentum."""
    for bn, xs in inputs.items():
        x = torch.cat(xs).transpose(0, 1).reshape(bn.num_features, -1)
        m = momentum[bn]
        with torch.no_grad():
            bn.running_mean.mul_(1 - m).add_(x.mean(1), alpha=m)
            bn.running_var.mul_(1 - m).add_(x.var(1, unbiased=True), alpha=m)


def sgd_steps(model, x, y, lr, steps, dtype, replicas=1, micro=1):
    """Steps of SGD on batches i*B mod N; the losses before each update.
    With replicas > 1, PyTorch DDP without SyncBatchNorm in one process:
    each replica's rows normalised with their own statistics, the gradients
    and losses averaged, and the running statistics replica 0's (DDP's
    broadcast_buffers hands them to every replica before each forward).
    With micro > 1, GPipe's batch norm: each micro-batch normalised with
    its own statistics, the gradients summed, the running statistics
    updated once per step from the whole batch's (deferred_running_stats)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momentum = {bn: bn.momentum for bn in bns}  # mobilenet_v3's are 0.01
    inputs = {bn: [] for bn in bns}
    hooks = [bn.register_forward_pre_hook(lambda m, a: inputs[m].append(a[0].detach())) for bn in bns] \
        if micro > 1 else []
    losses = []
    parts = replicas * micro
    rows = BATCH // parts
    for s in range(steps):
        i = (s * BATCH) % N_ROWS
        opt.zero_grad()
        total, buffers = 0.0, None
        for bn in bns:
            inputs[bn].clear()
            if micro > 1:
                bn.momentum = 0.0  # running statistics wait for the whole batch
        for r in range(parts):
            lo = i + r * rows
            loss = torch.nn.functional.cross_entropy(model(x[lo:lo + rows].to(dtype)), y[lo:lo + rows]) / parts
            loss.backward()
            total += loss.item()
            if r == 0:
                buffers = {k: v.clone() for k, v in model.named_buffers()}
        if replicas > 1:
            for k, v in model.named_buffers():
                v.copy_(buffers[k])
        if micro > 1:
            for bn in bns:
                bn.momentum = momentum[bn]
            deferred_running_stats(inputs, momentum)
        opt.step()
        losses.append(total)
    for h in hooks:
        h.remove()
    return losses


def reference(model, x, y, lr, **split):
    """(float64 losses, float64 state, float32 losses) of a copy of model."""
    ref, f32 = copy.deepcopy(model).double(), copy.deepcopy(model)
    losses = sgd_steps(ref, x, y, lr, STEPS, torch.float64, **split)
    return (losses, {k: v.numpy() for k, v in ref.state_dict().items() if v.is_floating_point()},
            sgd_steps(f32, x, y, lr, STEPS, torch.float32, **split))


def prepare(name, work):
    """Exports the warmed-up model; returns (onnx path, reference losses,
    reference state in float64, float32 losses, lr, has_bn)."""
    make, shape, opset, lr, warmup, has_bn, dynamic = MODELS[name]
    torch.manual_seed(0)
    model = make()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x, y = make_data(shape)
    model.train()
    sgd_steps(model, x, y, WARMUP_LR, warmup, torch.float32)
    path = os.path.join(work, name + ".onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x[:BATCH], path, training=torch.onnx.TrainingMode.TRAINING, opset_version=opset,
                          do_constant_folding=False, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}} if dynamic else None)
    np.save(os.path.join(work, name + "_x.npy"), x.numpy())
    np.save(os.path.join(work, name + "_y.npy"), y.numpy().astype(np.int64))
    warm = copy.deepcopy(model)
    ref = copy.deepcopy(model).double()
    ref_losses = sgd_steps(ref, x, y, lr, STEPS, torch.float64)
    f32_losses = sgd_steps(model, x, y, lr, STEPS, torch.float32)
    state = {k: v.numpy() for k, v in ref.state_dict().items() if v.is_floating_point()}
    f32_state = {k: v.numpy() for k, v in model.state_dict().items() if v.is_floating_point()}
    params = {k for k, _ in model.named_parameters()}
    local = micro = None
    if has_bn:  # dp 2 with --bn-stats local: DDP without SyncBatchNorm; a pipeline's micro-batches
        local, micro = (reference(warm, x, y, lr, replicas=2), reference(warm, x, y, lr, micro=2))
    return path, (ref_losses, state), f32_losses, f32_state, params, lr, has_bn, local, micro


def strategies(has_bn):
    """(label, ranks, flags, reference): "global" the one process's
    float64 run, "local" DDP's without SyncBatchNorm, "micro" GPipe's batch
    norm over 2 micro-batches."""
    out = [("single", 1, [], "global"), ("dp2", 2, ["--ranks", "2", "--strategy", "dp"], "global"),
           ("layer2", 2, ["--ranks", "2", "--strategy", "layer"], "global")]
    pipeline = ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "2"]
    if has_bn:
        out.append(("dp2_bn_local", 2, ["--ranks", "2", "--strategy", "dp", "--bn-stats", "local"], "local"))
    out.append(("pipeline2", 2, pipeline, "micro" if has_bn else "global"))
    return out


def tolerance(key, state):
    want = np.abs(state[key])
    if key.endswith("running_mean"):
        var = state.get(key[:-len("running_mean")] + "running_var")
        if var is not None:
            return W_RTOL * (want + np.sqrt(np.maximum(var, 0))) + W_ATOL
    return W_RTOL * want + W_ATOL


def worst_error(saved, state):
    """(largest share of the tolerance, its tensor, a shape mismatch or None)."""
    worst, worst_key = 0.0, None
    for k, want in state.items():
        if k not in saved:
            continue
        got = saved[k].astype(np.float64)
        if got.shape != want.shape:
            return 0.0, k, "%s has shape %s, expected %s" % (k, got.shape, want.shape)
        r = float(np.max(np.abs(got - want) / tolerance(k, state))) if want.size else 0.0
        if r > worst:
            worst, worst_key = r, k
    return worst, worst_key, None


def worst_step(saved, state, start):
    """(largest relative error of a parameter's change over the run, |got -
    want| / |want| in the 2-norm, and its name), over the parameters in
    `start` that changed: where small learning rates keep the weights
    within rtol of where they started, their changes still show every
    step's gradient."""
    worst, worst_key = 0.0, None
    for k, want in state.items():
        if k not in saved or k not in start:
            continue
        d_want = want - start[k]
        scale = float(np.linalg.norm(d_want))
        if scale <= 1e-6 * (float(np.linalg.norm(want)) + 1e-30):
            continue
        r = float(np.linalg.norm((saved[k].astype(np.float64) - start[k]) - d_want)) / scale
        if r > worst:
            worst, worst_key = r, k
    return worst, worst_key


def check_weights(rep, label, saved, state, start, torch_step_err):
    missing = [k for k in state if k not in saved and not k.endswith("num_batches_tracked")]
    if not rep.check("%s: every parameter and buffer saved" % label, not missing, "missing %s" % missing[:5]):
        return
    worst, key, mismatch = worst_error(saved, state)
    rep.check("%s: weights and running statistics match (worst %.3g of the tolerance, %s)" % (label, worst, key),
              worst <= 1.0 and not mismatch, mismatch)
    worst, key = worst_step(saved, state, start)
    bound = max(STEP_RTOL, 2 * torch_step_err)
    rep.check("%s: every parameter's change over the run within %.3g of the reference's (worst %.3g, %s)" %
              (label, bound, worst, key), worst <= bound)


def inspect_json(cleave, path, *flags):
    p, _ = harness.run([cleave, "inspect", path, "--format", "json"] + list(flags))
    if p.returncode:
        return None, harness.failure([cleave, "inspect", path], p)
    return json.loads(p.stdout), ""


def check_inspect(rep, cleave, name, path, work):
    """inspect's training check agrees with compile, and its eval-mode
    warnings fire on eval-mode exports only."""
    doc, err = inspect_json(cleave, path)
    if rep.check("%s: inspect runs" % name, doc is not None, err):
        rep.check("%s: inspect says compile accepts the training export, without warnings" % name,
                  doc["training"]["ok"] and not doc["warnings"], json.dumps([doc["training"], doc["warnings"]]))
    if name != "resnet18":
        return
    # Eval mode: the exporter folds batch norm into the convolutions before
    # it, and with constant folding merges parameters of equal values;
    # batch norm after a ReLU stays, in inference form.
    nn = torch.nn
    bn_after_relu = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))
    torch.manual_seed(0)
    for label, model, want in (("resnet18", MODELS[name][0](), "do_constant_folding=False"),
                               ("conv, relu, batch norm", bn_after_relu, "inference form")):
        out = os.path.join(work, "eval_%d.onnx" % len(label))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model.eval(), torch.zeros(2, 3, 32, 32), out, opset_version=13)
        doc, err = inspect_json(cleave, out)
        rep.check("%s: inspect of an eval-mode export warns '%s'" % (label, want),
                  doc is not None and any(want in w for w in doc["warnings"]), err or doc["warnings"])
    # A loss the output does not fit: inspect says what compile says.
    doc, err = inspect_json(cleave, path, "--loss", "model")
    cmd = [cleave, "compile", path, "-o", os.path.join(work, "refused"), "--batch", "2", "--loss", "model"]
    p, _ = harness.run(cmd)
    said = p.stderr.strip().replace("cleave: error: ", "")
    rep.check("%s: inspect --loss model gives compile's error" % name,
              doc is not None and not doc["training"]["ok"] and p.returncode == 1 and doc["training"]["error"] == said,
              "inspect %s, compile %r" % (doc and doc["training"], said))


def run_model(rep, cleave, name, work):
    path, (ref_losses, state), f32_losses, f32_state, params, lr, has_bn, local, micro = prepare(name, work)
    refs = {"global": (ref_losses, state, f32_losses), "local": local, "micro": micro}
    check_inspect(rep, cleave, name, path, work)
    drift = max(abs(a - b) / abs(b) for a, b in zip(f32_losses, ref_losses))
    worst, key, _ = worst_error(f32_state, state)
    print("%s: PyTorch in float32 against float64: losses up to %.2g apart (relative), weights %.3g of the "
          "tolerance (%s)" % (name, drift, worst, key))
    start = {k: v.astype(np.float64) for k, v in harness.read_weights(path).items() if k in params}
    torch_step_err, key = worst_step(f32_state, state, start)
    print("%s: PyTorch in float32 against float64: changes over the run, worst relative error %.3g (%s)" %
          (name, torch_step_err, key))
    for label, ranks, flags, which in strategies(has_bn):
        tag = "%s %s" % (name, label)
        ref_losses, state, ref_f32 = refs[which]
        own = max(abs(a - b) / abs(b) for a, b in zip(ref_f32, ref_losses))
        if own > LOSS_RTOL:
            rep.skip(tag, "PyTorch's own float32 losses leave its float64 ones by %.2g here: no reference" % own)
            continue
        prog = os.path.join(work, "%s_%s" % (name, label))
        metrics, saved = prog + ".jsonl", prog + ".trained.onnx"
        cmd = [cleave, "compile", path, "-o", prog, "--batch", str(BATCH), "--loss", "ce", "--lr", repr(lr)] + flags
        p, _ = harness.run(cmd, timeout=900)
        if not rep.check("%s: compiles" % tag, p.returncode == 0, harness.failure(cmd, p)):
            continue
        argv = [prog, "--data", "input=" + os.path.join(work, name + "_x.npy"),
                "--data", "labels=" + os.path.join(work, name + "_y.npy"), "--steps", str(STEPS),
                "--metrics", metrics, "--save", saved]
        if harness.train_against(rep, tag, argv, ranks, metrics, ref_losses, LOSS_RTOL, LOSS_ATOL):
            check_weights(rep, tag, harness.read_weights(saved), state, start, torch_step_err)


def main():
    global torch, np
    args = harness.model_args("CLEAVE_CNN_MODELS", ",".join(MODELS))
    why = harness.missing(modules=("torch", "torchvision", "onnx", "numpy"), programs=("mpirun",))
    if why:
        return harness.skip(why)
    import numpy
    import torch as t
    torch, np = t, numpy
    torch.set_num_threads(1)
    return harness.run_models(args.models, MODELS, args.workdir, "cleave_cnn_",
                              lambda rep, name, work: run_model(rep, args.cleave, name, work))


if __name__ == "__main__":
    sys.exit(main())
