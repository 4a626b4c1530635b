#!/usr/bin/python3
"""Check `cleave inspect --format json` against numbers computed from PyTorch.

For every model in torch_models.py this exports a fresh ONNX file into
--workdir (same settings as samples/export_samples.py), takes the committed
samples/<name>.onnx as well, runs

    CLEAVE inspect MODEL --batch 4 --format json
    CLEAVE inspect MODEL --format json

and compares the report with values obtained independently from torch:
parameter count, input/output shapes, the FLOPs of the Gemm/MatMul/Conv
nodes (derived analytically from the nn.Linear / nn.Conv2d modules and the
attention shapes seen during a forward pass), and the per-sample FLOPs.

Prints one PASS/FAIL line per check and finally `N passed, M failed`; the exit
status is 1 if anything failed.  Without torch it prints "SKIP: torch not
available" and exits 77 (ctest's skip status).

    /usr/bin/python3 tests/py/test_inspect_vs_torch.py --cleave build/cleave --workdir /tmp/w
    /usr/bin/python3 tests/py/test_inspect_vs_torch.py --selftest   # torch side only
"""

import argparse
import json
import math
import os
import sys

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))
SAMPLES = os.path.join(REPO, "samples")
BATCH = 4

# Filled in by main() once the imports succeed.
torch = None
nn = None
tm = None
onnx = None
numpy_helper = None


# ---------------------------------------------------------------- torch side


class Expected:
    """What torch says about one model at a given batch size."""

    def __init__(self, spec, batch):
        self.spec = spec
        self.batch = batch
        model = spec.build()
        self.params = sum(p.numel() for p in model.parameters())
        # float buffers (batch norm's running statistics) are initializers too
        self.buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
        self.input_shape = [batch] + list(spec.sample_shape)

        self.layers = []  # one dict per Linear / Conv2d / attention call
        hooks = []
        for name, mod in model.named_modules():
            if isinstance(mod, (nn.Linear, nn.Conv2d, tm.SelfAttention)):
                hooks.append(mod.register_forward_hook(self._hook(name)))
        try:
            with torch.no_grad():
                y = model(torch.randn(*self.input_shape))
        finally:
            for h in hooks:
                h.remove()
        self.output_shape = list(y.shape)
        self.output_dtype = str(y.dtype)

        n_mods = sum(isinstance(m, (nn.Linear, nn.Conv2d)) for m in model.modules())
        n_seen = sum(l["kind"] in ("linear", "conv") for l in self.layers)
        assert n_mods == n_seen, "%d Linear/Conv2d modules but %d calls" % (n_mods, n_seen)

        self.mac_flops = sum(l["mac"] for l in self.layers)
        self.fused_bias_flops = sum(l["bias"] for l in self.layers if l["fused"])
        self.unfused_bias_flops = sum(l["bias"] for l in self.layers if not l["fused"])
        # What the Gemm/MatMul/Conv nodes should add up to: every multiply-add,
        # plus the bias of layers whose ONNX node takes the bias itself.
        self.matmul_node_flops = self.mac_flops + self.fused_bias_flops

    def _hook(self, name):
        def hook(mod, inputs, output):
            x = inputs[0]
            if isinstance(mod, nn.Linear):
                rows = math.prod(x.shape[:-1])
                k, n = mod.in_features, mod.out_features
                has_bias = mod.bias is not None
                self.layers.append(dict(
                    name=name, kind="linear", in_shape=list(x.shape),
                    mac=2 * rows * k * n,
                    bias=rows * n if has_bias else 0,
                    # torch exports Linear on a 2-D input as Gemm(A, W, b);
                    # on higher ranks as MatMul followed by a separate Add.
                    fused=(x.dim() == 2 and has_bias),
                    onnx=("Gemm" if x.dim() == 2 else "MatMul"),
                ))
            elif isinstance(mod, nn.Conv2d):
                n_, cout, hout, wout = output.shape
                kh, kw = mod.kernel_size
                cin_g = mod.in_channels // mod.groups
                has_bias = mod.bias is not None
                self.layers.append(dict(
                    name=name, kind="conv", in_shape=list(x.shape),
                    mac=2 * n_ * cout * hout * wout * cin_g * kh * kw,
                    bias=n_ * cout * hout * wout if has_bias else 0,
                    fused=has_bias,  # Conv takes the bias as its third input
                    onnx="Conv",
                ))
            else:  # SelfAttention: q @ k^T and attn @ v
                b, t, _ = x.shape
                h, d = mod.num_heads, mod.head_dim
                for what in ("q@k^T", "attn@v"):
                    self.layers.append(dict(
                        name="%s %s" % (name, what), kind="attn",
                        in_shape=[b, h, t, d], mac=2 * b * h * t * t * d,
                        bias=0, fused=False, onnx="MatMul",
                    ))
        return hook

    def node_counts(self):
        """Expected ONNX node counts: Gemm/Conv carrying a bias, and MatMul."""
        with_bias = sum(1 for l in self.layers if l["fused"])
        matmul = sum(1 for l in self.layers if l["onnx"] == "MatMul")
        gemm_conv = sum(1 for l in self.layers if l["onnx"] in ("Gemm", "Conv"))
        return dict(gemm_conv=gemm_conv, gemm_conv_with_bias=with_bias, matmul=matmul)

    def describe(self):
        print("%s: params %d, input %s, output %s (%s)" % (
            self.spec.name, self.params, self.input_shape, self.output_shape, self.output_dtype))
        for l in self.layers:
            print("    %-18s %-6s in %-16s mac %10d  bias %7d  %s" % (
                l["name"], l["onnx"], l["in_shape"], l["mac"], l["bias"],
                "bias in node" if l["fused"] else ("bias in Add" if l["bias"] else "")))
        print("    batch %d: multiply-add FLOPs %d, bias in Gemm/Conv %d, bias in Add %d" % (
            self.batch, self.mac_flops, self.fused_bias_flops, self.unfused_bias_flops))
        print("    expected sum over Gemm/MatMul/Conv nodes: %d (%d per sample)" % (
            self.matmul_node_flops, self.matmul_node_flops // self.batch))


def check_onnx_file(rep, exp, path, tag):
    """ONNX-side sanity checks of an exported file (needs the onnx package)."""
    if onnx is None:
        print("NOTE %s: onnx package missing, graph structure not checked" % tag)
        return
    model = onnx.load(path)
    g = model.graph
    init_names = {i.name for i in g.initializer}
    n_elems = sum(math.prod(i.dims) for i in g.initializer if i.data_type == onnx.TensorProto.FLOAT)
    rep.equal("%s: float initializer elements (torch parameters and float buffers)" % tag, n_elems,
              exp.params + exp.buffers)

    want = exp.node_counts()
    got = dict(gemm_conv=0, gemm_conv_with_bias=0, matmul=0)
    for node in g.node:
        if node.op_type in ("Gemm", "Conv"):
            got["gemm_conv"] += 1
            if len(node.input) >= 3 and node.input[2]:
                got["gemm_conv_with_bias"] += 1
        elif node.op_type == "MatMul":
            got["matmul"] += 1
    rep.check("%s: graph has Gemm/Conv %d (with bias %d), MatMul %d as assumed for FLOPs" % (
        tag, want["gemm_conv"], want["gemm_conv_with_bias"], want["matmul"]),
        got == want, "got %r" % got)

    dim0 = [d.dim_param or d.dim_value for d in (g.input[0].type.tensor_type.shape.dim[:1]
                                                  if len(g.input) else [])]
    extra = [i.name for i in g.input if i.name not in init_names][1:]
    rep.check("%s: one graph input with dim 0 'batch'" % tag,
              dim0 == ["batch"] and not extra, "dim0 %r, extra inputs %r" % (dim0, extra))


def check_sample_matches(rep, fresh_path, sample_path, tag):
    """The committed sample holds the same weights as a fresh export."""
    if onnx is None:
        return
    a = {i.name: numpy_helper.to_array(i) for i in onnx.load(fresh_path).graph.initializer}
    b = {i.name: numpy_helper.to_array(i) for i in onnx.load(sample_path).graph.initializer}
    same = a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and (a[k] == b[k]).all() for k in a)
    rep.check("%s: weights equal a fresh export from torch_models.py" % tag, same,
              "sample is stale; rerun /usr/bin/python3 samples/export_samples.py")


# ---------------------------------------------------------------- cleave side


def run_inspect(cleave, model_path, batch):
    cmd = [cleave, "inspect", model_path]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    cmd += ["--format", "json"]
    p, _ = harness.run(cmd)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d; stderr: %s" % (
            " ".join(cmd), p.returncode, p.stderr.strip()[-2000:]))
    try:
        return json.loads(p.stdout)
    except ValueError as e:
        raise RuntimeError("output of %s is not JSON (%s): %r" % (
            " ".join(cmd), e, p.stdout[:500]))


def check_with_batch(rep, exp, cleave, path, tag):
    try:
        j = run_inspect(cleave, path, BATCH)
    except Exception as e:  # noqa: BLE001
        rep.check("%s: inspect --batch %d --format json" % (tag, BATCH), False, str(e))
        return None
    rep.check("%s: inspect --batch %d --format json" % (tag, BATCH), True)

    rep.guarded("%s: batch" % tag, lambda: rep.equal("%s: batch" % tag, j["batch"], BATCH))
    rep.guarded("%s: inputs[0].shape" % tag, lambda: rep.equal(
        "%s: inputs[0].shape" % tag, j["inputs"][0]["shape"], exp.input_shape))
    rep.guarded("%s: outputs[0].shape" % tag, lambda: rep.equal(
        "%s: outputs[0].shape" % tag, j["outputs"][0]["shape"], exp.output_shape))
    rep.guarded("%s: outputs[0].dtype" % tag, lambda: rep.equal(
        "%s: outputs[0].dtype" % tag, j["outputs"][0]["dtype"], "float32"))
    rep.guarded("%s: totals.params" % tag, lambda: rep.equal(
        "%s: totals.params" % tag, j["totals"]["params"], exp.params))

    def flops():
        nodes = [n for n in j["nodes"] if n.get("op") in ("Gemm", "MatMul", "Conv")]
        missing = [n.get("name") for n in nodes if not isinstance(n.get("flops"), int)]
        got = sum(n["flops"] for n in nodes if isinstance(n.get("flops"), int))
        label = "%s: sum of Gemm/MatMul/Conv node flops == %d" % (tag, exp.matmul_node_flops)
        detail = "got %d from %s" % (got, [(n.get("op"), n.get("flops")) for n in nodes])
        if missing:
            detail += "; no integer flops on %s" % missing
        rep.check(label, got == exp.matmul_node_flops and not missing, detail)
    rep.guarded("%s: Gemm/MatMul/Conv flops" % tag, flops)

    def per_sample():
        t = j["totals"]
        f, fps = t["flops"], t["flops_per_sample"]
        rep.check("%s: totals.flops_per_sample == totals.flops / %d" % (tag, BATCH),
                  isinstance(f, int) and f > 0 and f % BATCH == 0 and fps == f // BATCH,
                  "flops %r, flops_per_sample %r" % (f, fps))
    rep.guarded("%s: flops_per_sample" % tag, per_sample)
    return j


def check_without_batch(rep, exp, cleave, path, tag):
    label = "%s: inspect --format json (no --batch)" % tag
    try:
        j = run_inspect(cleave, path, None)
    except Exception as e:  # noqa: BLE001
        rep.check(label, False, str(e))
        return
    rep.check(label, True)
    rep.guarded("%s: symbolic inputs[0].shape[0]" % tag, lambda: rep.equal(
        "%s: no --batch: inputs[0].shape[0]" % tag, j["inputs"][0]["shape"][0], "batch"))
    rep.guarded("%s: no --batch: totals.params" % tag, lambda: rep.equal(
        "%s: no --batch: totals.params" % tag, j["totals"]["params"], exp.params))


# ---------------------------------------------------------------------- main


def main():
    global torch, nn, tm, onnx, numpy_helper
    ap = argparse.ArgumentParser(description="Compare `cleave inspect` with PyTorch.")
    ap.add_argument("--cleave", help="path to the cleave binary")
    ap.add_argument("--workdir", help="folder for fresh exports (default: a temporary one)")
    ap.add_argument("--selftest", action="store_true",
                    help="only print and check the torch-side expectations; no cleave needed")
    ap.add_argument("--models", nargs="+", help="restrict to these model names")
    args = ap.parse_args()
    if not args.selftest and not args.cleave:
        ap.error("--cleave is required (or use --selftest)")

    try:
        import torch as _torch
        import torch.nn as _nn
        sys.dont_write_bytecode = True
        sys.path.insert(0, HERE)
        import torch_models as _tm
    except ImportError as e:
        return harness.skip("torch not available (%s); run with /usr/bin/python3 and python3-torch "
                            "installed to compare cleave inspect against torch" % e)
    torch, nn, tm = _torch, _nn, _tm
    try:
        import onnx as _onnx
        from onnx import numpy_helper as _nh
        onnx, numpy_helper = _onnx, _nh
    except ImportError:
        print("NOTE: onnx package not available; exported graph structure is not checked")

    names = args.models or list(tm.MODELS)
    unknown = [n for n in names if n not in tm.MODELS]
    if unknown:
        ap.error("unknown model(s) %s; known: %s" % (unknown, sorted(tm.MODELS)))

    rep = harness.Report()
    cleave = None
    if not args.selftest:
        cleave = os.path.abspath(args.cleave)
        if not rep.executable(cleave):
            return rep.summary()

    with harness.workdir(args.workdir, "cleave-inspect-") as workdir:
        for name in names:
            spec = tm.MODELS[name]
            try:
                exp = Expected(spec, BATCH)
            except Exception as e:  # noqa: BLE001
                rep.check("%s: torch forward pass" % name, False, "%s: %s" % (type(e).__name__, e))
                continue
            if args.selftest:
                exp.describe()

            fresh = os.path.join(workdir, name + ".onnx")
            try:
                tm.export_onnx(spec, spec.build(), fresh)
            except Exception as e:  # noqa: BLE001
                rep.check("%s: export to %s" % (name, fresh), False, "%s: %s" % (type(e).__name__, e))
                fresh = None
            sample = os.path.join(SAMPLES, name + ".onnx")
            if not rep.check("%s: committed sample %s exists" % (name, os.path.relpath(sample)),
                             os.path.isfile(sample)):
                sample = None

            targets = [(p, "%s/%s" % (name, kind))
                       for p, kind in ((fresh, "fresh"), (sample, "sample")) if p]
            for path, tag in targets:
                rep.guarded("%s: onnx graph" % tag, lambda: check_onnx_file(rep, exp, path, tag))
            if fresh and sample:
                rep.guarded("%s: sample up to date" % name,
                            lambda: check_sample_matches(rep, fresh, sample, "%s/sample" % name))
            if args.selftest:
                continue
            for path, tag in targets:
                check_with_batch(rep, exp, cleave, path, tag)
                check_without_batch(rep, exp, cleave, path, tag)

    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
