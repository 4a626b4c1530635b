#!/usr/bin/python3
"""GFLOP/s of cleave's convolution kernels against PyTorch's, layer by layer.

The shapes: every distinct convolution of torchvision's resnet18
(num_classes=10) on a batch of 32 inputs of 3x32x32, found by running the
model once with a forward hook on each Conv2d (input size, channels, kernel,
stride, padding).  For each shape and each of the three kernels a training
step runs for it (forward; gradient of the input, which the first layer does
not need and is not measured for; gradient of the weights) the script
measures, one thread on both sides:

  cleave  the kernel cleave generates for that node, compiled alone: a
          one-node ONNX model (Conv, or cleave's own ConvGradInput or
          ConvGradWeight with the attributes its gradient pass gives them)
          whose inputs are frozen initializers, compiled with `cleave
          compile --loss model --emit obj --emit-plan`, linked into a shared
          library and called through ctypes (`cleave_eval_step` on an arena
          laid out as the plan says), as bench_gemm.py does for products
          and as `cleave plan --profile` times a node alone.  That these
          are the kernels a training program runs is checked for every
          shape: a one-convolution training model is compiled with
          --emit-plan and its steps must hold exactly this Conv,
          ConvGradInput and ConvGradWeight (the script stops otherwise),
          and its program's step (--check-steps steps, median) is
          reported beside the sum of the kernels timed alone;
  torch   torch.nn.functional.conv2d for the forward pass and
          torch.ops.aten.convolution_backward with the output mask of one
          gradient for each gradient, the calls autograd makes, on the same
          arrays.

Each measurement repeats the call until --min-time seconds have passed
(warm caches on both sides: the same data again and again); the two sides
alternate, --runs rounds, and the table gives medians.  GFLOP/s =
2*N*M*(C/G)*kh*kw*OH*OW / time for all three kernels (the nominal count,
which includes the taps that fall on padding).  Before timing, the outputs
of both sides are checked against PyTorch in float64.

PyTorch runs in a worker process with OMP_NUM_THREADS=1 and
OPENBLAS_CORETYPE removed; the report names its kernels (bench_train.py's
torch_kernels: BLAS core, oneDNN build and ISA) and, per row, the oneDNN
implementation that ran the call (from oneDNN's verbose mode, one extra call
outside the timing).  The peak is bench/gemm_peak.c's (via bench_gemm.py):
floats per vector x 2 FMA units x 2 flops x the measured clock, one core.

    /usr/bin/python3 bench/bench_conv.py [--cleave PATH] [--runs 5] [--min-time 0.2]
                                         [--only TEXT] [--check-steps 6] [--out results.json]
"""

import argparse
import ctypes
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_gemm as bg   # noqa: E402  (the peak: gemm_peak.c, cpuinfo)
import bench_train as bt  # noqa: E402  (torch's kernels, its environment, machine info)

OPSET = 13
SEED = 11
BATCH = 32
SAMPLE = (3, 32, 32)
TIMEOUT = 600
ERR_MAX = 1e-4            # largest |got - want| / largest |want|, against float64
DIRECTIONS = ("forward", "grad input", "grad weight")
OPS = {"forward": "Conv", "grad input": "ConvGradInput", "grad weight": "ConvGradWeight"}

np = None
torch = None


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_checked(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if p.returncode != 0:
        sys.exit("%s failed (exit %d): %s\n%s" % (what, p.returncode, shlex.join(cmd), p.stderr))
    return p


# ------------------------------------------------------------------ shapes


def resnet18_shapes():
    """Distinct convolutions of resnet18 at BATCH x SAMPLE, in the order the
    forward pass meets them, each with the modules that have it and whether
    its input is the model's input (whose gradient training skips)."""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=bt.N_CLASSES)
    x = torch.zeros((BATCH,) + SAMPLE)
    seen, order = {}, []

    def hook(name):
        def f(mod, args, out):
            inp = args[0]
            key = (tuple(inp.shape), mod.out_channels, tuple(mod.kernel_size), tuple(mod.stride),
                   tuple(mod.padding), tuple(mod.dilation), mod.groups, mod.bias is not None)
            if key not in seen:
                seen[key] = {"input": list(inp.shape), "out_channels": mod.out_channels,
                             "kernel": list(mod.kernel_size), "stride": list(mod.stride),
                             "padding": list(mod.padding), "dilation": list(mod.dilation),
                             "groups": mod.groups, "bias": mod.bias is not None,
                             "output": list(out.shape), "modules": [], "first_layer": inp is x}
                order.append(key)
            seen[key]["modules"].append(name)
        return f

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(hook(name))
    with torch.no_grad():
        model.eval()(x)
    return [seen[k] for k in order]


def label(s):
    n, c, h, w = s["input"]
    k, st, p = s["kernel"], s["stride"], s["padding"]
    return "%d->%d %dx%d s%d p%d @%dx%d" % (c, s["out_channels"], k[0], k[1], st[0], p[0], h, w)


def flops(s):
    n, c = s["input"][0], s["input"][1]
    _, m, oh, ow = s["output"]
    return 2.0 * n * m * (c // s["groups"]) * s["kernel"][0] * s["kernel"][1] * oh * ow


# ---------------------------------------------------------------- cleave side


def conv_attrs(s):
    """Conv's attributes as PyTorch exports them (explicit, no auto_pad)."""
    p = s["padding"]
    return {"kernel_shape": s["kernel"], "strides": s["stride"], "pads": [p[0], p[1], p[0], p[1]],
            "dilations": s["dilation"], "group": s["groups"]}


def write_training_model(path, s, rng):
    """One convolution trained on the sum of its output: input -> Conv(W)
    -> ReduceSum for the model's first layer, whose input gradient
    training skips; input + P -> Conv(W) -> ReduceSum for the others,
    where the trainable initializer P makes the convolution's input need
    its gradient, as any layer's but the first does."""
    import onnx
    from onnx import helper, numpy_helper, TensorProto
    c, g = s["input"][1], s["groups"]
    w = rng.standard_normal([s["out_channels"], c // g] + s["kernel"]).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    nodes = [helper.make_node("Conv", ["xp", "W"], ["Y"], **conv_attrs(s)),
             helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0)]
    if s["first_layer"]:
        nodes[0].input[0] = "input"
    else:
        nodes.insert(0, helper.make_node("Add", ["input", "P"], ["xp"]))
        inits.append(numpy_helper.from_array(np.zeros(s["input"], np.float32), "P"))
    gr = helper.make_graph(nodes, "conv_train",
                           [helper.make_tensor_value_info("input", TensorProto.FLOAT, s["input"])],
                           [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
    onnx.save(helper.make_model(gr, opset_imports=[helper.make_opsetid("", OPSET)]), path)


class TrainingProgram:
    """The one-convolution training program of a shape: the ops its plan
    runs for the convolution ({op: outputs}, leaving out the Add, the
    loss, its gradient and the optimizer), and its step time."""

    def __init__(self, cleave, workdir, tag, s, rng):
        base = os.path.join(workdir, tag + "_train")
        self.prog, self.data = base, base + "_x.npy"
        plan = base + ".plan.json"
        write_training_model(base + ".onnx", s, rng)
        cmd = [cleave, "compile", base + ".onnx", "-o", self.prog, "--batch", str(s["input"][0]),
               "--loss", "model", "--emit-plan", plan]
        run_checked(cmd, "cleave compile (training model)")
        self.commands = [shlex.join([os.path.relpath(cleave) if x == cleave else os.path.basename(x)
                                     for x in cmd])]
        steps = json.load(open(plan))["rank_plans"][0]["steps"]
        skip = {"Add", "ReduceSum", "ReduceGrad", "SGD"}
        self.ops = {st["op"]: len(st["outputs"]) for st in steps
                    if st.get("kind") == "compute" and st["op"] not in skip}
        self.shape = s["input"]

    def step_seconds(self, steps, rng):
        """Median time of the program's steps after the first, from the
        elapsed_s of its metrics (bench_train.py's measure)."""
        rows = self.shape[0] * steps
        np.save(self.data, rng.standard_normal([rows] + self.shape[1:]).astype(np.float32))
        metrics = self.prog + ".jsonl"
        cmd = [self.prog, "--data", "input=" + self.data, "--steps", str(steps), "--metrics", metrics,
               "--log-every", "0"]
        run_checked(cmd, "one-convolution training program")
        name = os.path.basename(self.prog)
        self.commands.append(shlex.join(["./" + name, "--data", "input=%s_x.npy" % name, "--steps", str(steps),
                                         "--metrics", name + ".jsonl", "--log-every", "0"]))
        el = [json.loads(line)["elapsed_s"] for line in open(metrics) if '"step"' in line]
        return statistics.median(b - a for a, b in zip(el, el[1:]))


class Kernel:
    """One of cleave's kernels compiled alone: a one-node model (plus the
    one-float ReduceSum `--loss model` wants) with frozen initializers as
    inputs, linked into a shared library, its arena laid out by the plan."""

    def __init__(self, cleave, workdir, tag, op, inputs, attrs, out_name, n_out):
        import onnx
        from onnx import helper, numpy_helper, TensorProto
        self.tag = tag
        base = os.path.join(workdir, tag)
        onnx_path, obj, so, plan = base + ".onnx", base + ".o", base + ".so", base + ".plan.json"
        names = [n for n, _ in inputs]
        outs = [out_name] + ["scratch%d" % i for i in range(1, n_out)]
        domain = "" if op == "Conv" else "cleave"
        nodes = [helper.make_node("ReduceSum", ["z"], ["loss"], keepdims=0),
                 helper.make_node(op, names, outs, domain=domain, **attrs)]
        g = helper.make_graph(nodes, tag, [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(a, n) for n, a in inputs])
        opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("cleave", 1)] if domain else [])
        onnx.save(helper.make_model(g, opset_imports=opsets), onnx_path)
        self.compile_cmd = [cleave, "compile", onnx_path, "-o", obj, "--batch", "1", "--loss", "model",
                            "--freeze", ",".join(names), "--emit", "obj", "--emit-plan", plan]
        run_checked(self.compile_cmd, "cleave compile (%s)" % op)
        self.compile_cmd = [os.path.relpath(cleave) if x == cleave else os.path.basename(x)
                            for x in self.compile_cmd]
        # packed products are functions of their own (cg_gemm.c), named
        # cleave.gemm.*; without one the kernel is cleave's direct loops
        syms = run_checked(["nm", obj], "nm").stdout
        self.code = "packed GEMM" if re.search(r"cleave\.gemm\.", syms) else "loops"
        self.lib, self.raw, self.arena, rp = bg.load_program(obj, so, plan)
        b = next(b for b in rp["buffers"] if b["name"] == out_name)
        self.out = self.arena[b["offset"]:b["offset"] + b["bytes"]].view(np.float32).reshape(b["shape"])
        self.step = self.lib.cleave_eval_step
        self.step.argtypes = [ctypes.c_void_p]
        self.step.restype = None
        self.ptr = self.arena.ctypes.data

    def __call__(self):
        self.step(self.ptr)


# ----------------------------------------------------------------- torch side


def torch_calls(s, x, w, dy):
    """The three calls PyTorch makes for this convolution in a training
    step (autograd's backward is aten.convolution_backward)."""
    F = torch.nn.functional
    st, p, d, g = s["stride"], s["padding"], s["dilation"], s["groups"]
    back = torch.ops.aten.convolution_backward

    def fwd():
        return F.conv2d(x, w, None, st, p, d, g)

    def gin():
        return back(dy, x, w, None, st, p, d, False, [0, 0], g, [True, False, False])[0]

    def gw():
        return back(dy, x, w, None, st, p, d, False, [0, 0], g, [False, True, False])[1]
    return {"forward": fwd, "grad input": gin, "grad weight": gw}


def onednn_impl(fn):
    """The oneDNN convolution implementation(s) one call ran, or what ran
    instead when oneDNN ran no convolution."""
    _, prims = bt.onednn_summary(bt.onednn_verbose(fn))
    impls = []
    for p in prims:
        if p["primitive"] == "convolution" and p["implementation"] not in impls:
            impls.append(p["implementation"])
    return "+".join(impls) if impls else "PyTorch native"


def rel_err(got, want):
    return float(np.max(np.abs(got.astype(np.float64) - want)) / (np.max(np.abs(want)) + 1e-30))


# ------------------------------------------------------------------ worker


def worker(job):
    """Runs in its own process (torch_env: one thread, OPENBLAS_CORETYPE
    removed): both sides of every shape, printed as JSON."""
    global np, torch
    bt.import_torch()
    np, torch = bt.np, bt.torch
    torch.set_num_threads(1)
    shapes = resnet18_shapes()
    if job["only"]:
        shapes = [s for s in shapes if job["only"] in label(s)]
    rng = np.random.default_rng(SEED)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_conv_") as workdir:
        for i, s in enumerate(shapes):
            tag = "c%d" % i
            log("  %s (%s)" % (label(s), ", ".join(s["modules"])))
            train = TrainingProgram(job["cleave"], workdir, tag, s, rng)
            ops = train.ops
            want_ops = {OPS[d] for d in DIRECTIONS if not (d == "grad input" and s["first_layer"])}
            if set(ops) != want_ops:
                sys.exit("%s: a training program runs %s for this convolution, not %s: the kernels this "
                         "script builds alone would not be the ones training runs"
                         % (label(s), sorted(ops), sorted(want_ops)))
            c, g = s["input"][1], s["groups"]
            x = rng.standard_normal(s["input"]).astype(np.float32)
            w = (rng.standard_normal([s["out_channels"], c // g] + s["kernel"]) /
                 np.sqrt(c // g * s["kernel"][0] * s["kernel"][1])).astype(np.float32)
            dy = rng.standard_normal(s["output"]).astype(np.float32)
            tx, tw, tdy = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy)
            calls = torch_calls(s, tx, tw, tdy)
            ref = torch_calls(s, tx.double(), tw.double(), tdy.double())
            attrs = conv_attrs(s)
            kernels = {
                "forward": Kernel(job["cleave"], workdir, tag + "f", "Conv", [("X", x), ("W", w)], attrs,
                                  "Y", ops["Conv"]),
                "grad weight": Kernel(job["cleave"], workdir, tag + "w", "ConvGradWeight",
                                      [("dY", dy), ("X", x)], attrs, "dW", ops["ConvGradWeight"]),
            }
            if "ConvGradInput" in ops:
                kernels["grad input"] = Kernel(job["cleave"], workdir, tag + "i", "ConvGradInput",
                                               [("dY", dy), ("W", w)], dict(attrs, spatial=s["input"][2:]),
                                               "dX", ops["ConvGradInput"])
            fl = flops(s)
            shape_rows = []
            for d in DIRECTIONS:
                row = {"shape": label(s), "modules": s["modules"], "direction": d, "op": OPS[d],
                       "input": s["input"], "output": s["output"], "out_channels": s["out_channels"],
                       "kernel": s["kernel"], "stride": s["stride"], "padding": s["padding"],
                       "groups": s["groups"], "flops": fl}
                if d not in kernels:
                    row["skipped"] = "the model's input needs no gradient"
                    results.append(row)
                    continue
                k = kernels[d]
                k()
                want = ref[d]().numpy()
                got_t = calls[d]().numpy()
                row["cleave_err"], row["torch_err"] = rel_err(k.out, want), rel_err(got_t, want)
                if row["cleave_err"] > ERR_MAX or row["torch_err"] > ERR_MAX:
                    sys.exit("%s %s: results differ from float64 (cleave %.3g, torch %.3g)"
                             % (label(s), d, row["cleave_err"], row["torch_err"]))
                row["torch_kernel"] = onednn_impl(calls[d])
                row["cleave_code"] = k.code
                row["compile_cmd"] = shlex.join(k.compile_cmd)
                row["tag"] = k.tag
                row["cleave_gflops"], row["torch_gflops"] = [], []
                for _ in range(job["runs"]):
                    row["cleave_gflops"].append(bg.rate(k, fl, job["min_time"]))
                    row["torch_gflops"].append(bg.rate(calls[d], fl, job["min_time"]))
                results.append(row)
                shape_rows.append(row)
            # The same kernels inside a training step: the one-convolution
            # program's step against the sum of its kernels timed alone
            # (the step also holds the Add, the loss, its gradient and two
            # SGD updates, all element-wise and small beside them).
            shape_rows[0]["program_step_s"] = train.step_seconds(job["check_steps"], rng)
            shape_rows[0]["program_commands"] = train.commands
            shape_rows[0]["kernels_s"] = sum(fl / (statistics.median(r["cleave_gflops"]) * 1e9)
                                             for r in shape_rows)
        kern = bt.torch_kernels()
    json.dump({"results": results, "torch_kernels": kern, "torch_version": torch.__version__}, sys.stdout)
    sys.stdout.write("\n")


# ------------------------------------------------------------------ report


def med(xs):
    return statistics.median(xs)


def print_report(rep):
    m = rep["machine"]
    print("command: %s" % rep["command"])
    print("machine: %s, %d cores (%d usable), Linux %s" % (m["cpu"], m["cores"], m["cores_usable"], m["kernel"]))
    print("cleave:  %s (%s)" % (rep["cleave"], rep["cleave_version"]))
    print("torch:   %s, 1 thread" % rep["torch_version"])
    for line in bt.kernels_header(rep["torch_kernels"]):
        print(line)
    print("load:    1-minute load average %s before, %s after; %.0f s in all"
          % (rep["load_before"], rep["load_after"], rep["seconds"]))
    pk = rep["peak"]
    print("peak:    %d floats x 2 FMA units x 2 flops x %.2f GHz = %.1f GFLOP/s on one core "
          "(gemm_peak.c: measured clock, best of %s GHz; its FMA loop reached %.1f GFLOP/s)"
          % (pk["vector_floats"], pk["clock_ghz"], pk["core_gflops"],
             " and ".join("%.2f" % t["clock_ghz"] for t in pk["tries"]), pk["fma_gflops"]))
    print()
    print("resnet18 (num_classes=10) at batch %d x %s; medians of %d alternating runs, one thread on both "
          "sides, GFLOP/s = 2*N*M*(C/G)*kh*kw*OH*OW / time; %% peak of the one-core peak"
          % (BATCH, "x".join(map(str, SAMPLE)), rep["runs"]))
    print()
    head = ("shape", "uses", "direction", "cleave GFLOP/s", "torch GFLOP/s", "cleave/torch",
            "cleave % peak", "torch % peak", "torch kernel", "cleave code")
    rows = []
    for r in rep["results"]:
        if "skipped" in r:
            rows.append((r["shape"], str(len(r["modules"])), r["direction"], "-", "-", "-", "-", "-",
                         "not measured: %s" % r["skipped"], ""))
            continue
        c, t = med(r["cleave_gflops"]), med(r["torch_gflops"])
        rows.append((r["shape"], str(len(r["modules"])), r["direction"], "%.1f" % c, "%.1f" % t, "%.2f" % (c / t),
                     "%.1f" % (100 * c / pk["core_gflops"]), "%.1f" % (100 * t / pk["core_gflops"]),
                     r["torch_kernel"], r["cleave_code"]))
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" if 3 <= i <= 7 else "---" for i in range(len(head))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    done = [r for r in rep["results"] if "skipped" not in r]
    if done:
        print()
        # the time of the convolutions of one training step: every row's
        # kernel once per module that has its shape
        tot_c = sum(len(r["modules"]) * r["flops"] / med(r["cleave_gflops"]) for r in done)
        tot_t = sum(len(r["modules"]) * r["flops"] / med(r["torch_gflops"]) for r in done)
        print("the rows' kernels once per module using them (a training step's convolutions%s): "
              "cleave %.1f ms, torch %.1f ms, cleave/torch %.2f"
              % ("" if not rep.get("only") else ", of the shapes measured",
                 tot_c * 1e-6, tot_t * 1e-6, tot_t / tot_c))
        print("largest error against float64, relative to the largest value: cleave %.2g, torch %.2g"
              % (max(r["cleave_err"] for r in done), max(r["torch_err"] for r in done)))
    checked = [r for r in done if "program_step_s" in r]
    if checked:
        print()
        print("cleave's kernels inside a training step: each shape's one-convolution training program "
              "(the median of its steps after the first, of %d), against the sum of its kernels above"
              % rep["check_steps"])
        print()
        print("| shape | kernels alone ms | program step ms | step / kernels |")
        print("|---|---:|---:|---:|")
        for r in checked:
            print("| %s | %.2f | %.2f | %.2f |" % (r["shape"], 1e3 * r["kernels_s"], 1e3 * r["program_step_s"],
                                                  r["program_step_s"] / r["kernels_s"]))
    print()
    print("modules of each shape:")
    for r in rep["results"]:
        if r["direction"] == "forward":
            print("  %-26s %s" % (r["shape"], ", ".join(r["modules"])))
    print()
    print("every run, GFLOP/s in run order (cleave | torch):")
    for r in done:
        print("  %-26s %-11s %s | %s" % (r["shape"], r["direction"],
                                         " ".join("%.1f" % v for v in r["cleave_gflops"]),
                                         " ".join("%.1f" % v for v in r["torch_gflops"])))
    if done:
        print()
        print("each kernel is compiled as (in a temporary folder; cNf, cNi, cNw: shape N's forward, grad "
              "input, grad weight):")
        for d in DIRECTIONS:
            r = next((r for r in done if r["direction"] == d), None)
            if r:
                print("  %s; cc -shared -o %s.so %s.o" % (r["compile_cmd"], r["tag"], r["tag"]))
        if checked:
            print("and each shape's one-convolution training program as:")
            for c in checked[-1]["program_commands"]:
                print("  %s" % c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build-dev", "cleave"),
                    help="the cleave compiler (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5, help="alternating runs of each side per kernel (default 5)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per measurement (default 0.2)")
    ap.add_argument("--only", help="only shapes whose label (as in the table) contains this text")
    ap.add_argument("--check-steps", type=int, default=6,
                    help="steps of each shape's one-convolution training program (default 6)")
    ap.add_argument("--out", help="also write everything as JSON to this file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.runs < 1 or args.min_time <= 0 or args.check_steps < 2:
        ap.error("--runs must be at least 1, --min-time positive and --check-steps at least 2")
    cleave = os.path.abspath(args.cleave)
    if not os.access(cleave, os.X_OK):
        sys.exit("%s is not an executable; build cleave or pass --cleave" % cleave)

    t_start = time.perf_counter()
    load_before = bt.load_average()
    peak_dir = tempfile.TemporaryDirectory(prefix="bench_conv_peak_")
    peaks = [bg.measure_peak(peak_dir.name)]
    job = {"cleave": cleave, "runs": args.runs, "min_time": args.min_time, "only": args.only,
           "check_steps": args.check_steps}
    log("convolutions of resnet18 (cleave and torch alternating, %d runs):" % args.runs)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(job)],
                       env=bt.torch_env(1), stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("the worker failed (exit %d)" % p.returncode)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # once more at the end: other jobs on the machine only ever lower them
    peaks.append(bg.measure_peak(peak_dir.name))
    peak_dir.cleanup()
    peak = {"clock_ghz": max(x["clock_ghz"] for x in peaks), "fma_gflops": max(x["fma_gflops"] for x in peaks),
            "vector_floats": peaks[0]["vector_floats"], "tries": peaks, "cpuinfo_mhz": bg.cpuinfo_mhz()}
    peak["core_gflops"] = peak["vector_floats"] * 2 * 2 * peak["clock_ghz"]
    rep = {
        "command": shlex.join(["/usr/bin/python3", os.path.relpath(os.path.abspath(__file__))] + sys.argv[1:]),
        "machine": bt.machine_info(),
        "cleave": os.path.relpath(cleave),
        "cleave_version": bt.cleave_version(cleave),
        "torch_version": out["torch_version"],
        "torch_kernels": out["torch_kernels"],
        "model": "torchvision resnet18(num_classes=10)", "batch": BATCH, "sample": list(SAMPLE),
        "runs": args.runs, "min_time": args.min_time, "only": args.only, "check_steps": args.check_steps,
        "load_before": load_before, "load_after": bt.load_average(),
        "seconds": time.perf_counter() - t_start,
        "peak": peak,
        "results": out["results"],
    }
    print_report(rep)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
