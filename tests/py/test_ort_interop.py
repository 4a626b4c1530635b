#!/usr/bin/python3
"""ONNX Runtime interop: models trained by cleave run the same in ONNX Runtime.

Part 1, the harness itself (needs torch, node and onnxruntime-node only):
every model of train_models.py is exported to --workdir and run with ONNX
Runtime through tests/js/ort_run.js on 40 rows (in batches of 16 for models
exported at a fixed batch, all at once for a dynamic-batch export); ORT's
output must equal torch's forward (rtol 1e-4, atol 1e-5).  For the models
whose output is the loss, ORT's loss must equal torch's.

Part 2, cleave (needs `cleave compile`): two models are compiled and trained
10 steps,

    CLEAVE compile MODEL.onnx -o PROG --batch 16 --loss L --optimizer O --lr LR
    PROG --data input=X.npy --data labels=Y.npy --steps 10 --save trained.onnx \
         --eval-data input=XE.npy --eval-data labels=YE.npy --predict pred.npy

(the runtime wants an --eval-data file for every input, labels included)

then trained.onnx must pass onnx.checker, ORT must load and run it on XE, and
ORT's output must equal cleave's pred.npy (rtol 1e-4, atol 1e-5) and differ
from the untrained model's output (training changed the weights).  One model
is exported at a fixed batch (Gemm MLP, ce, SGD), the other with a dynamic
batch axis (MatMul MLP with a [B,4,3] output, mse, Adam).

Prints PASS/FAIL lines and finally `N passed, M failed`; exits 1 on failure.
Prints "SKIP: reason" and exits 77 (ctest's skip status) without torch, node
or onnxruntime-node (install it with scripts/setup_node.sh).  When only
`cleave compile` is missing, part 1 still runs and part 2 is counted skipped.

    /usr/bin/python3 tests/py/test_ort_interop.py --cleave build/cleave --workdir /tmp/w
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))
JS_DIR = os.path.join(REPO, "tests", "js")
ORT_RUN = os.path.join(JS_DIR, "ort_run.js")
BATCH = 16
N_TRAIN = 96
N_EVAL = 40
STEPS = 10
RTOL, ATOL = 1e-4, 1e-5

np = None
torch = None
onnx = None
tmod = None


class Ort:
    def __init__(self, node):
        self.node = node

    def run(self, model, x_path, out_path, extra=()):
        """ORT's first output of `model` on input=x_path (+ NAME=FILE extras)."""
        if os.path.exists(out_path):
            os.remove(out_path)
        cmd = [self.node, ORT_RUN, model, tmod.INPUT, x_path, out_path] + list(extra)
        p, _ = harness.run(cmd)
        if p.returncode != 0:
            raise RuntimeError(harness.failure(cmd, p))
        y = np.load(out_path)
        if y.dtype != np.float32:
            raise RuntimeError("%s holds %s, not float32" % (out_path, y.dtype))
        return y


def ort_available(node):
    """(True, version) or (False, reason)."""
    if not node:
        return False, "node not found"
    if not os.path.isdir(os.path.join(JS_DIR, "node_modules", "onnxruntime-node")):
        return False, "onnxruntime-node not installed in tests/js (run scripts/setup_node.sh)"
    try:
        p, _ = harness.run([node, ORT_RUN, "--check"])
    except (OSError, subprocess.SubprocessError) as e:
        return False, "%s: %s" % (node, e)
    if p.returncode != 0:
        return False, "onnxruntime-node does not load: %s" % (p.stderr.strip() or p.stdout.strip())
    return True, p.stdout.strip()


# ------------------------------------------------------ part 1: ORT vs torch


def check_ort_vs_torch(rep, ort, workdir):
    d = os.path.join(workdir, "ort_vs_torch")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name, spec in tmod.MODELS.items():
        for dynamic in (False, True):
            tag = "%s (%s batch)" % (name, "dynamic" if dynamic else "fixed %d" % BATCH)
            rep.guarded("ORT %s" % tag, lambda: ort_vs_torch_one(rep, ort, d, spec, dynamic, tag))


def ort_vs_torch_one(rep, ort, d, spec, dynamic, tag):
    base = os.path.join(d, "%s_%s" % (spec.name, "dyn" if dynamic else "fixed"))
    model = spec.build()
    tmod.export_onnx(spec, model, base + ".onnx", BATCH, dynamic_batch=dynamic)
    if spec.model_labels:
        # The output is the mean loss over one batch of 16 rows.
        data = tmod.make_data(spec, "model", BATCH, seed=tmod.DATA_SEED + 2)
        np.save(base + "_x.npy", data[tmod.INPUT])
        np.save(base + "_y.npy", data[tmod.LABELS])
        got = ort.run(base + ".onnx", base + "_x.npy", base + "_out.npy",
                      ["%s=%s" % (tmod.LABELS, base + "_y.npy")])
        with torch.no_grad():
            want = model(torch.from_numpy(data[tmod.INPUT]),
                         torch.from_numpy(data[tmod.LABELS])).numpy()
        ok, detail = harness.compare(got, want, RTOL, ATOL)
        rep.check("ORT %s: loss of one batch equals torch (%.7g)" % (tag, float(want)), ok, detail)
        return
    x = tmod.make_data(spec, "mse", N_EVAL, seed=tmod.DATA_SEED + 2)[tmod.INPUT]
    np.save(base + "_x.npy", x)
    got = ort.run(base + ".onnx", base + "_x.npy", base + "_out.npy")
    want = tmod.forward(model, x)
    ok, detail = harness.compare(got, want, RTOL, ATOL)
    rep.check("ORT %s: output on %d rows equals torch forward (rtol %g, atol %g)" % (
        tag, N_EVAL, RTOL, ATOL), ok, detail)


# ------------------------------------------------- part 2: cleave-trained models


CASES = [
    # (model, dynamic batch export, loss, optimizer flags)
    ("mlp_gemm", False, "ce", ["--optimizer", "sgd", "--lr", "0.1"]),
    ("mlp_matmul_seq", True, "mse", ["--optimizer", "adam", "--lr", "0.01"]),
]


def check_cleave_case(rep, ort, cleave, workdir, model_name, dynamic, loss, flags):
    spec = tmod.MODELS[model_name]
    tag = "%s/%s (%s batch)" % (model_name, loss, "dynamic" if dynamic else "fixed")
    d = os.path.join(workdir, "cleave_%s_%s" % (model_name, loss))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model_path = os.path.join(d, "model.onnx")
    tmod.export_onnx(spec, spec.build(), model_path, BATCH, dynamic_batch=dynamic)

    data = tmod.make_data(spec, loss, N_TRAIN)
    paths = {}
    for k, v in data.items():
        paths[k] = os.path.join(d, "train_%s.npy" % k)
        np.save(paths[k], v)
    eval_data = tmod.make_data(spec, loss, N_EVAL, seed=tmod.DATA_SEED + 1)
    xe = os.path.join(d, "eval_input.npy")
    ye = os.path.join(d, "eval_labels.npy")
    np.save(xe, eval_data[tmod.INPUT])
    np.save(ye, eval_data[tmod.LABELS])

    prog = os.path.join(d, "prog")
    cmd = [cleave, "compile", model_path, "-o", prog, "--batch", str(BATCH), "--loss", loss] + flags
    p, dt = harness.run(cmd)
    if not rep.check("%s: cleave compile (%.1fs)" % (tag, dt), p.returncode == 0, harness.failure(cmd, p)):
        return

    trained = os.path.join(d, "trained.onnx")
    pred = os.path.join(d, "pred.npy")
    cmd = [prog, "--data", "%s=%s" % (tmod.INPUT, paths[tmod.INPUT]),
           "--data", "%s=%s" % (tmod.LABELS, paths[tmod.LABELS]),
           "--steps", str(STEPS), "--save", trained,
           "--eval-data", "%s=%s" % (tmod.INPUT, xe),
           "--eval-data", "%s=%s" % (tmod.LABELS, ye), "--predict", pred]
    p, dt = harness.run(cmd, cwd=d)
    if not rep.check("%s: program trains %d steps, saves and predicts (%.1fs)" % (tag, STEPS, dt),
                     p.returncode == 0, harness.failure(cmd, p)):
        return
    if not rep.check("%s: --save wrote trained.onnx" % tag, os.path.isfile(trained)):
        return
    rep.guarded("%s: onnx.checker" % tag, lambda: (
        onnx.checker.check_model(onnx.load(trained)),
        rep.check("%s: trained.onnx passes onnx.checker" % tag, True)))

    got = rep.guarded("%s: ORT runs trained.onnx" % tag, lambda: ort.run(
        trained, xe, os.path.join(d, "ort_trained.npy")))
    if got is None:
        return
    rep.check("%s: ORT runs trained.onnx on %d rows" % (tag, N_EVAL), True)
    before = ort.run(model_path, xe, os.path.join(d, "ort_untrained.npy"))
    rep.check("%s: trained.onnx computes something else than the untrained model" % tag,
              got.shape != before.shape or not np.allclose(got, before, rtol=RTOL, atol=ATOL),
              "ORT outputs of trained.onnx and model.onnx agree; were the weights saved?")

    if not rep.check("%s: --predict wrote pred.npy" % tag, os.path.isfile(pred)):
        return
    cp = np.load(pred)
    rep.check("%s: pred.npy is float32 [%d, %s]" % (
        tag, N_EVAL, ", ".join(str(s) for s in spec.out_shape)),
        cp.dtype == np.float32 and list(cp.shape) == [N_EVAL] + list(spec.out_shape),
        "got %s %s" % (cp.dtype, list(cp.shape)))
    ok, detail = harness.compare(got, cp, RTOL, ATOL)
    rep.check("%s: ORT on trained.onnx equals cleave's --predict (rtol %g, atol %g)" % (
        tag, RTOL, ATOL), ok, detail)


# ---------------------------------------------------------------------- main


def main():
    global np, torch, onnx, tmod
    ap = argparse.ArgumentParser(description="Run cleave-trained models in ONNX Runtime.")
    ap.add_argument("--cleave", help="path to the cleave binary (without it only part 1 runs)")
    ap.add_argument("--workdir", help="folder for models and arrays (default: a temporary one)")
    ap.add_argument("--node", default=shutil.which("node"), help="node executable")
    args = ap.parse_args()

    try:
        import numpy as _np
        import torch as _torch
        import onnx as _onnx
        sys.dont_write_bytecode = True
        sys.path.insert(0, HERE)
        import train_models as _tmod
    except ImportError as e:
        return harness.skip("torch/onnx/numpy not available (%s); run with /usr/bin/python3" % e)
    np, torch, onnx, tmod = _np, _torch, _onnx, _tmod
    torch.set_num_threads(1)

    ok, info = ort_available(args.node)
    if not ok:
        return harness.skip("ONNX Runtime not available: %s" % info)
    print("using %s (%s)" % (info, args.node))
    ort = Ort(args.node)

    rep = harness.Report()
    t0 = time.time()
    with harness.workdir(args.workdir, "cleave-ort-") as workdir:
        check_ort_vs_torch(rep, ort, workdir)

        cleave = os.path.abspath(args.cleave) if args.cleave else None
        if cleave is None:
            rep.skip("cleave-trained models", "no --cleave given", len(CASES))
        elif not rep.executable(cleave):
            pass
        elif not harness.compile_available(cleave):
            rep.skip("cleave-trained models", "cleave compile not available", len(CASES))
        else:
            for model_name, dynamic, loss, flags in CASES:
                rep.guarded("%s/%s" % (model_name, loss), lambda: check_cleave_case(
                    rep, ort, cleave, workdir, model_name, dynamic, loss, flags))

    print("took %.1fs" % (time.time() - t0))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
