#!/usr/bin/env python3
"""--threads T never changes the bits.

A program compiled with --threads T splits its large matrix products among
T threads by a fixed partition of the output, and its large convolutions
by blocks of samples (docs/perf.md, "Threads"), so training must give
exactly what T = 1 gives.  For samples/mlp.onnx, samples/transformer.onnx,
samples/resnet.onnx (convolutions, batch normalisation), samples/cnn.onnx
(each Conv followed by a Relu, which runs fused on the convolution's
blocks) and a CNN built here whose late convolutions run over 4x4, 2x2
and 1x1 planes (tap products, whose blocks of samples are sized by the
thread count, and kernel offsets dropped where they read only padding)
this compiles the model at --threads 1, 2 and 3, trains 12 steps
with momentum on the same data, and checks:

- every step's loss is the same float at every T (the metrics print
  float32 losses with 9 significant digits, which round-trip);
- the saved weights are the same bytes at every T;
- the generated code calls cleave_rt_parallel at T = 2 and not at T = 1
  (so the split is really exercised: for the resnet, inside the Conv,
  ConvGradInput and ConvGradWeight kernels; for the cnn, inside the
  fused Conv -> Relu kernels), and the plan records "threads";
- --plan FILE compiles the threads the file records, and --threads given
  with --plan replaces them without a note about derived fields;
- under mpirun, 2 data-parallel ranks of 2 threads each give the losses
  and weights of 2 ranks of 1 thread.

usage: test_threads.py --cleave BIN --workdir DIR
Ends with a line "N passed, M failed"; SKIP (exit 77) without numpy/onnx.
"""
import argparse
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "..", "..", "samples")
BATCH, ROWS, STEPS = 64, 192, 12


def run(cmd, timeout=300, env=None):
    p, _ = harness.run(cmd, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def taps_model(np, path):
    """1x28x28 -> 3x3 convolutions with ReLU: stride 2 to 14x14, 7x7 and
    4x4, stride 1 at 4x4, stride 2 to 2x2, stride 1 at 2x2, stride 2 to
    1x1, stride 1 at 1x1 -> global average pool -> Linear(64, 10)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    layers = [(1, 32, 2), (32, 32, 2), (32, 64, 2), (64, 64, 1), (64, 64, 2), (64, 64, 1), (64, 64, 2), (64, 64, 1)]
    nodes, inits, x = [], [], "input"
    for i, (cin, cout, stride) in enumerate(layers):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (9 * cin))).astype(np.float32)
        inits += [numpy_helper.from_array(w, "conv%d.weight" % i),
                  numpy_helper.from_array(np.zeros(cout, np.float32), "conv%d.bias" % i)]
        nodes += [helper.make_node("Conv", [x, "conv%d.weight" % i, "conv%d.bias" % i], ["c%d" % i],
                                   kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]),
                  helper.make_node("Relu", ["c%d" % i], ["r%d" % i])]
        x = "r%d" % i
    fc = (rng.standard_normal((10, 64)) * 0.125).astype(np.float32)
    inits += [numpy_helper.from_array(fc, "fc.weight"), numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "taps", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                           ["batch", 1, 28, 28])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def make_data(np, d, name):
    """The sample's training data: inputs of its input shape and labels."""
    rng = np.random.default_rng(7)
    if name in ("mlp", "resnet", "cnn", "taps"):
        x = rng.standard_normal((ROWS, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, ROWS).astype(np.int64)
    else:  # transformer: mse against targets shaped like the output
        x = rng.standard_normal((ROWS, 16, 32)).astype(np.float32)
        y = rng.standard_normal((ROWS, 16, 32)).astype(np.float32)
    files = []
    for key, arr in (("input", x), ("labels", y)):
        p = os.path.join(d, key + ".npy")
        np.save(p, arr)
        files += ["--data", "%s=%s" % (key, p)]
    return files


def weights_bytes(path):
    """Initializer name -> raw bytes of an ONNX file."""
    return {k: v.tobytes() for k, v in harness.read_weights(path).items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", default="/tmp/cleave_threads")
    args = ap.parse_args()
    rep = harness.Report()
    why = harness.missing(modules=("numpy", "onnx"))
    if why:
        return harness.skip(why)
    import numpy as np
    if not rep.executable(args.cleave):
        return rep.summary()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    taps = os.path.join(work, "taps.onnx")
    taps_model(np, taps)
    for name, loss in (("mlp", "ce"), ("transformer", "mse"), ("resnet", "ce"), ("cnn", "ce"), ("taps", "ce")):
        d = os.path.join(work, name)
        os.makedirs(d)
        model = taps if name == "taps" else os.path.join(SAMPLES, name + ".onnx")
        files = make_data(np, d, name)
        base = [args.cleave, "compile", model, "--batch", str(BATCH), "--loss", loss, "--optimizer", "momentum",
                "--lr", "0.02"]
        results = {}
        for t in (1, 2, 3):
            prog = os.path.join(d, "t%d" % t)
            plan = prog + ".plan.json"
            rc, _, err = run(base + ["-o", prog, "--threads", str(t), "--emit-plan", plan])
            if not rep.check("%s: compile --threads %d" % (name, t), rc == 0, err.strip()):
                continue
            with open(plan) as f:
                rep.equal("%s: plan of --threads %d records threads" % (name, t), json.load(f).get("threads"), t)
            rc, _, err = run([prog] + files + ["--steps", str(STEPS), "--metrics", prog + ".jsonl", "--save",
                                               prog + ".onnx"])
            if not rep.check("%s: train --threads %d" % (name, t), rc == 0, err.strip()[-500:]):
                continue
            results[t] = (harness.read_losses(prog + ".jsonl"), weights_bytes(prog + ".onnx"))
        if 1 not in results:
            continue
        ref_losses, ref_w = results[1]
        rep.equal("%s: %d loss lines" % (name, STEPS), len(ref_losses), STEPS)
        for t in (2, 3):
            if t not in results:
                continue
            losses, w = results[t]
            rep.check("%s: --threads %d losses identical to --threads 1" % (name, t), losses == ref_losses,
                      "%s vs %s" % (losses[:3], ref_losses[:3]))
            differ = sorted(k for k in ref_w if w.get(k) != ref_w[k])
            rep.check("%s: --threads %d saved weights identical to --threads 1 (%d tensors)" % (name, t, len(ref_w)),
                      not differ and len(w) == len(ref_w), "differ: %s" % differ)

    # The split is really there: the mlp's products call the pool at T = 2.
    model = os.path.join(SAMPLES, "mlp.onnx")
    d = os.path.join(work, "mlp")
    for t, want in ((1, False), (2, True)):
        ll = os.path.join(d, "t%d.ll" % t)
        rc, _, err = run([args.cleave, "compile", model, "--batch", str(BATCH), "--threads", str(t), "--emit", "llvm",
                          "-o", ll])
        if rep.check("mlp: --emit llvm --threads %d" % t, rc == 0, err.strip()):
            with open(ll) as f:
                calls = f.read().count("call void @cleave_rt_parallel")
            rep.check("mlp: --threads %d code %s cleave_rt_parallel (%d calls)" % (t, "calls" if want else
                      "does not call", calls), (calls > 0) == want)

    # ... and the resnet's convolutions split their blocks of samples: each
    # of the three kernels has a task (KERNEL.blocks) the pool runs.
    model = os.path.join(SAMPLES, "resnet.onnx")
    rd = os.path.join(work, "resnet")
    for t, want in ((1, False), (2, True)):
        ll = os.path.join(rd, "t%d.ll" % t)
        rc, _, err = run([args.cleave, "compile", model, "--batch", str(BATCH), "--threads", str(t), "--emit", "llvm",
                          "-o", ll])
        if not rep.check("resnet: --emit llvm --threads %d" % t, rc == 0, err.strip()):
            continue
        with open(ll) as f:
            text = f.read()
        for op in ("Conv", "ConvGradInput", "ConvGradWeight"):
            tasks = len(re.findall(r"call void @cleave_rt_parallel\(ptr (?:nonnull )?@k\d+_%s\.blocks\b" % op, text))
            rep.check("resnet: --threads %d %s kernels %s their blocks (%d calls)" % (t, op, "split" if want else
                      "do not split", tasks), (tasks > 0) == want)

    # ... and the cnn's Conv -> Relu pairs run fused, the Relu on each
    # block of samples on the thread that made it (the fused kernel's task)
    ll = os.path.join(work, "cnn", "t2.ll")
    rc, _, err = run([args.cleave, "compile", os.path.join(SAMPLES, "cnn.onnx"), "--batch", str(BATCH), "--threads",
                      "2", "--emit", "llvm", "-o", ll])
    if rep.check("cnn: --emit llvm --threads 2", rc == 0, err.strip()):
        with open(ll) as f:
            tasks = len(re.findall(r"call void @cleave_rt_parallel\(ptr (?:nonnull )?@f\d+_Conv_x\d+\.blocks\b",
                                   f.read()))
        rep.check("cnn: --threads 2 fused Conv chains split their blocks (%d calls)" % tasks, tasks > 0)

    # ... and so do the small-plane convolutions of the CNN built here:
    # every Conv kernel over 7x7 planes and less, the ones at 2x2 (one
    # block at T = 1) included
    ll = os.path.join(work, "taps", "t2.ll")
    rc, _, err = run([args.cleave, "compile", taps, "--batch", str(BATCH), "--threads", "2", "--emit", "llvm",
                      "-o", ll])
    if rep.check("taps: --emit llvm --threads 2", rc == 0, err.strip()):
        with open(ll) as f:
            tasks = len(re.findall(r"call void @cleave_rt_parallel\(ptr (?:nonnull )?@f\d+_Conv_x\d+\.blocks\b",
                                   f.read()))
        rep.check("taps: --threads 2 Conv chains over 4x4 and 2x2 planes split their blocks (%d calls, want 4)" % tasks,
                  tasks >= 4)

    # --plan FILE with and without --threads
    plan2 = os.path.join(d, "t2.plan.json")
    if os.path.exists(plan2):
        again = os.path.join(d, "again.plan.json")
        rc, _, err = run([args.cleave, "compile", "--plan", plan2, "-o", os.path.join(d, "from_plan"),
                          "--emit-plan", again])
        if rep.check("--plan FILE compiles", rc == 0, err.strip()):
            with open(again) as f:
                rep.equal("--plan FILE keeps the file's threads", json.load(f).get("threads"), 2)
        rc, _, err = run([args.cleave, "compile", "--plan", plan2, "--threads", "3", "-o",
                          os.path.join(d, "from_plan3"), "--emit-plan", again])
        if rep.check("--plan FILE --threads 3 compiles", rc == 0, err.strip()):
            with open(again) as f:
                rep.equal("--threads replaces the plan file's threads", json.load(f).get("threads"), 3)
            rep.check("--threads with --plan gives no note about derived fields", "note:" not in err, err.strip())

    # Ranks that own several cores: dp x2 ranks of 2 threads against 1 thread.
    if not harness.missing(programs=("mpirun",)):
        env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none",
                              OMPI_MCA_rmaps_base_oversubscribe="1")
        files = make_data(np, d, "mlp")
        got = {}
        for t in (1, 2):
            prog = os.path.join(d, "dp_t%d" % t)
            rc, _, err = run([args.cleave, "compile", model, "--batch", str(BATCH), "--ranks", "2", "--strategy",
                              "dp", "--threads", str(t), "-o", prog])
            if not rep.check("mlp: compile dp x2 --threads %d" % t, rc == 0, err.strip()):
                continue
            rc, _, err = run(harness.mpirun(2, [prog] + files + ["--steps", str(STEPS), "--metrics", prog + ".jsonl",
                                                                  "--save", prog + ".onnx"]), env=env, timeout=300)
            if rep.check("mlp: dp x2 --threads %d runs under mpirun" % t, rc == 0, err.strip()[-500:]):
                got[t] = (harness.read_losses(prog + ".jsonl"), weights_bytes(prog + ".onnx"))
        if 1 in got and 2 in got:
            rep.check("mlp: dp x2 --threads 2 losses identical to --threads 1", got[1][0] == got[2][0],
                      "%s vs %s" % (got[2][0][:3], got[1][0][:3]))
            rep.check("mlp: dp x2 --threads 2 weights identical to --threads 1", got[1][1] == got[2][1])
    else:
        rep.skip("mlp: dp x2 --threads 2 losses and weights", "mpirun not available", 2)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
