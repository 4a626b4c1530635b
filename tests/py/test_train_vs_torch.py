#!/usr/bin/python3
"""Check that programs built by `cleave compile` train exactly like PyTorch.

For each case below (a model from train_models.py, a loss, an optimizer) this
exports the model at batch 16 into --workdir, writes a numpy data set (96
rows, so 20 steps of 16 wrap around it), and runs

    CLEAVE compile MODEL.onnx -o PROG --batch 16 --loss L --optimizer O --lr LR ...
    PROG --data input=X.npy --data labels=Y.npy --steps 20 \
         --metrics metrics.jsonl --save trained.onnx

Torch trains a fresh copy of the model on the same batches (step i uses rows
(i*16 + r) mod N) with the same torch.optim settings, recording each step's
loss before the update.  Checked for every run:

- compile and the program exit 0;
- metrics.jsonl has one JSON line per step, "step" 1..K, numeric "loss",
  "samples_per_s" and "elapsed_s";
- every step's loss equals torch's (rtol 1e-4, atol 1e-6);
- trained.onnx keeps the input model's graph (nodes, inputs, outputs) and
  initializers (names, dtypes, shapes);
- every trained initializer equals torch's parameter (rtol 1e-3, atol 1e-5);
- initializers named in --freeze are unchanged bit for bit.

Extra runs of the Gemm MLP program cover --lr at run time, a data set of 90
rows (batches that straddle the end of the data), --shuffle SEED with
--epochs, and --eval-data with --predict (compared with the trained torch
model's forward).

Batch order (train_models.batch_rows, after runtime/rt_batch.c): an epoch is
ceil(N/B) steps; step s is position i = s mod that in epoch e, and takes the
rows P_e[(i*B + r) mod N], P_e the identity or, with --shuffle SEED, the
splitmix64 Fisher-Yates permutation seeded with SEED*1000003 + e.  With
N = 96 = 6*16 this is row (s*16 + r) mod 96; the 90-row run is where the
per-epoch wrap shows.

Prints PASS/FAIL lines and finally `N passed, M failed`; exits 1 on failure.
Without torch, or while the binary has no `compile` command, it prints
"SKIP: reason" and exits 77 (ctest's skip status).

    /usr/bin/python3 tests/py/test_train_vs_torch.py --cleave build/cleave --workdir /tmp/w
    /usr/bin/python3 tests/py/test_train_vs_torch.py --selftest   # torch side only
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 16
N_ROWS = 96
STEPS = 20
N_EVAL = 40          # eval rows for --predict; not a multiple of the batch

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6
W_RTOL, W_ATOL = 1e-3, 1e-5
PRED_RTOL, PRED_ATOL = 1e-3, 1e-4

# Filled in by main() once the imports succeed.
np = None
torch = None
onnx = None
numpy_helper = None
tmod = None


# -------------------------------------------------------------------- cases


@dataclass
class Run:
    name: str
    n_rows: int = N_ROWS
    steps: Optional[int] = STEPS
    epochs: Optional[int] = None          # --epochs instead of --steps
    lr: Optional[float] = None            # --lr at run time
    shuffle: Optional[int] = None         # --shuffle SEED
    predict: bool = False                 # --eval-data ... --predict

    def n_steps(self):
        if self.epochs is None:
            return self.steps
        return self.epochs * tmod.steps_per_epoch(self.n_rows, BATCH)


@dataclass
class Case:
    model: str
    loss: str
    opt: object                           # train_models.OptimConfig
    runs: List[Run] = field(default_factory=lambda: [Run("base")])

    @property
    def name(self):
        tag = self.opt.kind
        if self.opt.nesterov:
            tag = "nesterov"
        if self.opt.weight_decay:
            tag += "_wd"
        if self.opt.freeze:
            tag += "_freeze"
        return "%s_%s_%s" % (self.model, self.loss, tag)


def make_cases():
    O = tmod.OptimConfig
    return [
        Case("mlp_gemm", "ce", O("sgd", lr=0.1), runs=[
            Run("base", predict=True),
            Run("lr_at_run_time", lr=0.05),
            Run("n90_straddle", n_rows=90),
            Run("shuffle_epochs", shuffle=7, epochs=3, steps=None),
        ]),
        Case("mlp_gemm", "ce", O("momentum", lr=0.05, momentum=0.9)),
        Case("mlp_gemm", "ce", O("momentum", lr=0.05, momentum=0.9, nesterov=True)),
        Case("mlp_gemm", "ce", O("adam", lr=0.01)),
        Case("mlp_gemm", "ce", O("momentum", lr=0.05, momentum=0.9, weight_decay=0.01,
                                 freeze=["fc1.weight", "fc3.bias"])),
        Case("mlp_gemm", "mse", O("adam", lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6,
                                  custom_betas=True)),
        Case("mlp_matmul_flat", "ce", O("sgd", lr=0.2)),
        Case("mlp_matmul_flat", "mse", O("adam", lr=0.01)),
        Case("mlp_matmul_seq", "mse", O("momentum", lr=0.1, momentum=0.9, nesterov=True),
             runs=[Run("base", predict=True)]),
        Case("residual", "ce", O("adam", lr=0.005, weight_decay=0.01)),
        Case("residual", "mse", O("momentum", lr=0.05, momentum=0.9)),
        Case("act_mlp", "ce", O("momentum", lr=0.05, momentum=0.9, nesterov=True)),
        Case("act_mlp", "mse", O("sgd", lr=0.1, weight_decay=0.005)),
        Case("hard_ops13", "ce", O("sgd", lr=0.1)),
        Case("hard_ops17", "mse", O("sgd", lr=0.05)),
        Case("unet13", "ce", O("momentum", lr=0.05, momentum=0.9)),
        Case("unet17", "mse", O("sgd", lr=0.05)),
        Case("unet9", "mse", O("sgd", lr=0.05)),
        Case("ce_loss_model", "model", O("sgd", lr=0.1)),
        Case("mse_loss_model", "model", O("adam", lr=0.01)),
    ]


# ---------------------------------------------------------------- helpers


def compare_losses(got, want):
    n = min(len(got), len(want))
    for k in range(n):
        g, w = got[k], want[k]
        if not (isinstance(g, (int, float)) and math.isfinite(g)
                and abs(g - w) <= LOSS_ATOL + LOSS_RTOL * abs(w)):
            return False, "step %d: cleave %r, torch %.9g (steps 1..%d: cleave %s, torch %s)" % (
                k + 1, g, w, min(n, k + 3), got[:k + 3], ["%.7g" % v for v in want[:k + 3]])
    if len(got) != len(want):
        return False, "%d losses, expected %d" % (len(got), len(want))
    worst = max(abs(g - w) / max(abs(w), 1e-30) for g, w in zip(got, want)) if want else 0.0
    return True, "max rel err %.2g" % worst


def read_metrics(path):
    rows = []
    with open(path) as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise ValueError("line %d is not JSON (%s): %r" % (k, e, line[:200]))
    return rows


def check_metrics(rep, tag, rows, steps):
    """Checks the step records; returns their losses.

    Records with "step" are training steps.  With --eval-data the runtime also
    writes evaluation records ({"epoch": e, "eval_loss": ...}); those are
    allowed between them, and anything else is reported.
    """
    step_rows = [r for r in rows if isinstance(r, dict) and "step" in r]
    others = [r for r in rows if not (isinstance(r, dict) and ("step" in r or "epoch" in r))]
    rep.check("%s: metrics has %d step lines" % (tag, steps), len(step_rows) == steps,
              "got %d" % len(step_rows))
    problems = ["line %r is neither a step nor an eval record" % (r,) for r in others[:2]]
    for k, r in enumerate(step_rows, 1):
        if r.get("step") != k:
            problems.append("step line %d has step %r" % (k, r.get("step")))
        for key in ("loss", "samples_per_s", "elapsed_s"):
            v = r.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                problems.append("step %d: %s = %r" % (k, key, v))
        if isinstance(r.get("samples_per_s"), (int, float)) and r["samples_per_s"] <= 0:
            problems.append("step %d: samples_per_s %r <= 0" % (k, r["samples_per_s"]))
        if isinstance(r.get("elapsed_s"), (int, float)) and r["elapsed_s"] < 0:
            problems.append("step %d: elapsed_s %r < 0" % (k, r["elapsed_s"]))
    rep.check("%s: metrics lines are {step 1..%d, loss, samples_per_s, elapsed_s}" % (tag, steps),
              not problems, "; ".join(problems[:5]))
    return [r.get("loss") for r in step_rows]


def graph_summary(model):
    g = model.graph
    inits = {i.name for i in g.initializer}
    return dict(
        nodes=[(n.op_type, list(n.input), list(n.output)) for n in g.node],
        inputs=[i.name for i in g.input if i.name not in inits],
        outputs=[o.name for o in g.output],
    )


def check_saved(rep, tag, model_path, saved_path, ref, freeze):
    try:
        orig = onnx.load(model_path)
        saved = onnx.load(saved_path)
    except Exception as e:  # noqa: BLE001
        rep.check("%s: trained model %s loads" % (tag, saved_path), False,
                  "%s: %s" % (type(e).__name__, e))
        return
    rep.check("%s: trained model loads" % tag, True)

    a, b = graph_summary(orig), graph_summary(saved)
    rep.check("%s: trained model keeps the graph (nodes, inputs, outputs)" % tag, a == b,
              "inputs %s -> %s, outputs %s -> %s, %d -> %d nodes" % (
                  a["inputs"], b["inputs"], a["outputs"], b["outputs"],
                  len(a["nodes"]), len(b["nodes"])))

    oi = {i.name: i for i in orig.graph.initializer}
    si = {i.name: i for i in saved.graph.initializer}
    meta = lambda d: sorted((k, v.data_type, list(v.dims)) for k, v in d.items())  # noqa: E731
    rep.check("%s: trained model has the same initializers (names, dtypes, shapes)" % tag,
              meta(oi) == meta(si), "got %s, expected %s" % (meta(si), meta(oi)))

    for name in sorted(ref.weights):
        if name not in si:
            rep.check("%s: %s trained" % (tag, name), False, "missing from %s" % saved_path)
            continue
        got = numpy_helper.to_array(si[name])
        if name in freeze:
            want = numpy_helper.to_array(oi[name])
            same = (got.dtype == want.dtype and got.shape == want.shape
                    and got.tobytes() == want.tobytes())
            rep.check("%s: frozen %s unchanged bit for bit" % (tag, name), same,
                      "max abs change %g" % float(np.max(np.abs(got - want)))
                      if got.shape == want.shape else "shape changed")
        else:
            ok, detail = harness.compare(got, ref.weights[name], W_RTOL, W_ATOL)
            rep.check("%s: %s equals torch (rtol %g, atol %g)" % (tag, name, W_RTOL, W_ATOL),
                      ok, detail)


# --------------------------------------------------------------------- main


def save_data(folder, data):
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for k, v in data.items():
        paths[k] = os.path.join(folder, k + ".npy")
        np.save(paths[k], v)
    return paths


def torch_reference(case, run, data, dtype=None):
    spec = tmod.MODELS[case.model]
    return tmod.train_reference(spec, case.loss, case.opt, data, BATCH, run.n_steps(),
                                lr=run.lr, shuffle_seed=run.shuffle,
                                dtype=dtype or torch.float32)


def run_case(rep, cleave, workdir, case):
    spec = tmod.MODELS[case.model]
    cdir = os.path.join(workdir, case.name)
    shutil.rmtree(cdir, ignore_errors=True)
    os.makedirs(cdir)
    model_path = os.path.join(cdir, "model.onnx")
    try:
        tmod.export_onnx(spec, spec.build(), model_path, BATCH)
    except Exception as e:  # noqa: BLE001
        rep.check("%s: export" % case.name, False, "%s: %s" % (type(e).__name__, e))
        return

    prog = os.path.join(cdir, "prog")
    cmd = [cleave, "compile", model_path, "-o", prog, "--batch", str(BATCH),
           "--loss", case.loss] + case.opt.cleave_flags()
    p, dt = harness.run(cmd)
    ok = p.returncode == 0 and os.path.isfile(prog) and os.access(prog, os.X_OK)
    if not rep.check("%s: compile (%.1fs)" % (case.name, dt), ok,
                     harness.failure(cmd, p) if p.returncode else "no executable %s" % prog):
        return

    for run in case.runs:
        tag = "%s/%s" % (case.name, run.name)
        rep.guarded("%s: run" % tag, lambda: run_one(rep, tag, spec, case, run, cdir,
                                                     model_path, prog))


def run_one(rep, tag, spec, case, run, cdir, model_path, prog):
    rdir = os.path.join(cdir, run.name)
    shutil.rmtree(rdir, ignore_errors=True)
    os.makedirs(rdir)
    data = tmod.make_data(spec, case.loss, run.n_rows)
    paths = save_data(os.path.join(rdir, "data"), data)
    metrics = os.path.join(rdir, "metrics.jsonl")
    saved = os.path.join(rdir, "trained.onnx")
    pred = os.path.join(rdir, "pred.npy")

    cmd = [prog]
    for name in (tmod.INPUT, tmod.LABELS):
        cmd += ["--data", "%s=%s" % (name, paths[name])]
    if run.epochs is not None:
        cmd += ["--epochs", str(run.epochs)]
    else:
        cmd += ["--steps", str(run.steps)]
    if run.lr is not None:
        cmd += ["--lr", repr(run.lr)]
    if run.shuffle is not None:
        cmd += ["--shuffle", str(run.shuffle)]
    cmd += ["--metrics", metrics, "--save", saved]
    eval_data = None
    if run.predict:
        eval_data = tmod.make_data(spec, case.loss, N_EVAL, seed=tmod.DATA_SEED + 1)
        epaths = save_data(os.path.join(rdir, "eval"), eval_data)
        for name in (tmod.INPUT, tmod.LABELS):
            cmd += ["--eval-data", "%s=%s" % (name, epaths[name])]
        cmd += ["--predict", pred]

    ref = torch_reference(case, run, data)
    steps = run.n_steps()

    p, dt = harness.run(cmd, cwd=rdir)
    if not rep.check("%s: program runs %d steps (%.1fs)" % (tag, steps, dt), p.returncode == 0,
                     harness.failure(cmd, p)):
        return

    if rep.check("%s: metrics file written" % tag, os.path.isfile(metrics)):
        rows = rep.guarded("%s: metrics readable" % tag, lambda: read_metrics(metrics))
        if rows is not None:
            losses = check_metrics(rep, tag, rows, steps)
            ok, detail = compare_losses(losses, ref.losses)
            rep.check("%s: loss of every step equals torch (rtol %g, atol %g)" % (
                tag, LOSS_RTOL, LOSS_ATOL), ok, detail)

    if rep.check("%s: --save wrote %s" % (tag, os.path.basename(saved)), os.path.isfile(saved)):
        check_saved(rep, tag, model_path, saved, ref, set(case.opt.freeze))

    if run.predict and rep.check("%s: --predict wrote pred.npy" % tag, os.path.isfile(pred)):
        got = np.load(pred)
        want = tmod.forward(ref.model, eval_data[tmod.INPUT])
        ok, detail = harness.compare(got.astype(np.float64) if got.dtype == np.float32 else got,
                             want, PRED_RTOL, PRED_ATOL)
        rep.check("%s: predictions on %d eval rows equal the trained torch model "
                  "(float32, rtol %g, atol %g)" % (tag, N_EVAL, PRED_RTOL, PRED_ATOL),
                  ok and got.dtype == np.float32, detail or "dtype %s" % got.dtype)


# ------------------------------------------------------------------ selftest


def selftest(rep, workdir, cases):
    """The torch half alone: exports, data, batch order, reference losses.

    Each reference run is repeated in float64; the float32 run must agree
    with it within the tolerances applied to cleave, which shows they leave
    room for a correct implementation that only rounds differently.
    """
    r = tmod.SplitMix64(1234567)
    got = [r.next() for _ in range(3)]
    rep.check("splitmix64 matches the published sequence for seed 1234567",
              got == [6457827717110365317, 3203168211198807973, 9817491932198370423],
              "got %s" % got)
    perm = tmod.shuffle_permutation(N_ROWS, 7, 0)
    rep.check("shuffle permutation is a permutation of %d rows" % N_ROWS,
              sorted(perm) == list(range(N_ROWS)))
    rep.check("epochs get different permutations",
              perm != tmod.shuffle_permutation(N_ROWS, 7, 1))
    rows = tmod.batch_rows(5, BATCH, 90)
    rep.check("step 5 of 16 over 90 rows wraps: rows 80..89, 0..5",
              rows == list(range(80, 90)) + list(range(6)), "got %s" % rows)
    rows = tmod.batch_rows(6, BATCH, 90)
    rep.check("step 6 of 16 over 90 rows starts epoch 1 at row 0",
              rows == list(range(16)), "got %s" % rows)
    rows = tmod.batch_rows(7, BATCH, N_ROWS)
    rep.check("step 7 of 16 over 96 rows is rows 16..31 (epoch 1)",
              rows == list(range(16, 32)), "got %s" % rows)
    p1 = tmod.shuffle_permutation(N_ROWS, 7, 1)
    rows = tmod.batch_rows(7, BATCH, N_ROWS, shuffle_seed=7)
    rep.check("with --shuffle 7, step 7 takes P_1[16..31]", rows == p1[16:32], "got %s" % rows)

    for case in cases:
        spec = tmod.MODELS[case.model]
        path = os.path.join(workdir, case.name + ".onnx")
        if case.name == "mlp_gemm_ce_sgd":
            rep.guarded("mutants", lambda: selftest_mutants(rep, case))
        rep.guarded("%s: export" % case.name, lambda: (
            tmod.export_onnx(spec, spec.build(), path, BATCH),
            rep.check("%s: export keeps one initializer per parameter, named as "
                      "state_dict()" % case.name, True)))
        for run in case.runs:
            tag = "%s/%s" % (case.name, run.name)
            rep.guarded(tag, lambda: selftest_run(rep, tag, spec, case, run))


def selftest_mutants(rep, base):
    """The tolerances tell apart settings a wrong implementation might mix up."""
    import copy
    O = tmod.OptimConfig
    run = Run("base")

    def differs(label, a_case, a_run, b_case, b_run):
        spec = tmod.MODELS[a_case.model]
        data_a = tmod.make_data(spec, a_case.loss, a_run.n_rows)
        data_b = tmod.make_data(spec, b_case.loss, b_run.n_rows)
        ra = torch_reference(a_case, a_run, data_a)
        rb = torch_reference(b_case, b_run, data_b)
        same_loss = compare_losses(ra.losses, rb.losses)[0]
        same_w = all(harness.compare(ra.weights[k], rb.weights[k], W_RTOL, W_ATOL)[0] for k in ra.weights)
        rep.check("tolerances detect %s (losses and weights)" % label,
                  not same_loss and not same_w,
                  "losses %s, weights %s" % ("equal" if same_loss else "differ",
                                             "equal" if same_w else "differ"))

    m = Case("mlp_gemm", "ce", O("momentum", lr=0.05, momentum=0.9))
    n = Case("mlp_gemm", "ce", O("momentum", lr=0.05, momentum=0.9, nesterov=True))
    differs("nesterov vs plain momentum", m, run, n, run)
    differs("momentum 0.9 vs 0.8", m, run,
            Case("mlp_gemm", "ce", O("momentum", lr=0.05, momentum=0.8)), run)
    wd = copy.deepcopy(m)
    wd.opt.weight_decay = 0.01
    differs("weight decay 0.01 vs none", m, run, wd, run)
    a = Case("mlp_gemm", "mse", O("adam", lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6))
    differs("adam betas (0.8, 0.99) vs (0.9, 0.999)", a, run,
            Case("mlp_gemm", "mse", O("adam", lr=0.01, eps=1e-6)), run)
    differs("--lr 0.05 at run time vs the compiled 0.1", base, run, base, Run("lr", lr=0.05))
    differs("--shuffle 7 vs rows in order", base, Run("s", shuffle=7, epochs=3, steps=None),
            base, Run("o", steps=18))
    differs("--shuffle 7 vs --shuffle 8", base, Run("s", shuffle=7, epochs=3, steps=None),
            base, Run("s8", shuffle=8, epochs=3, steps=None))
    differs("90 rows (wrapping mid-batch) vs 96", base, Run("n90", n_rows=90), base, run)


def selftest_run(rep, tag, spec, case, run):
    data = tmod.make_data(spec, case.loss, run.n_rows)
    ref = torch_reference(case, run, data)
    extra = "".join([" (run: --lr %g)" % run.lr if run.lr is not None else "",
                     " (run: --shuffle %d)" % run.shuffle if run.shuffle is not None else "",
                     " (run: %d rows)" % run.n_rows if run.n_rows != N_ROWS else ""])
    print("%s [%s, %s%s]: losses %s ... step %d %.7g" % (
        tag, case.loss, case.opt.describe(), extra,
        " ".join("%.7g" % v for v in ref.losses[:3]), len(ref.losses), ref.losses[-1]))
    rep.check("%s: torch loss falls over %d steps" % (tag, len(ref.losses)),
              ref.losses[-1] < ref.losses[0],
              "first %.6g, last %.6g" % (ref.losses[0], ref.losses[-1]))
    for name in case.opt.freeze:
        rep.check("%s: torch leaves frozen %s alone" % (tag, name),
                  np.array_equal(ref.weights[name], ref.initial[name]))

    # The same training in float64, from the same initial weights.
    r64 = torch_reference(case, run, data, dtype=torch.float64)
    ok, detail = compare_losses(ref.losses, r64.losses)
    rep.check("%s: float32 losses within tolerance of float64" % tag, ok, detail)
    bad = []
    for k in ref.weights:
        okw, dw = harness.compare(ref.weights[k].astype(np.float64), r64.weights[k], W_RTOL, W_ATOL)
        if not okw:
            bad.append("%s: %s" % (k, dw))
    rep.check("%s: float32 weights within tolerance of float64" % tag, not bad, "; ".join(bad))


def main():
    global np, torch, onnx, numpy_helper, tmod
    ap = argparse.ArgumentParser(description="Compare `cleave compile` training with PyTorch.")
    ap.add_argument("--cleave", help="path to the cleave binary")
    ap.add_argument("--workdir", help="folder for models, data and programs "
                                      "(default: a temporary one)")
    ap.add_argument("--selftest", action="store_true",
                    help="run only the PyTorch half and print its losses; no cleave needed")
    ap.add_argument("--cases", nargs="+", help="only cases whose name contains one of these")
    args = ap.parse_args()
    if not args.selftest and not args.cleave:
        ap.error("--cleave is required (or use --selftest)")

    try:
        import numpy as _np
        import torch as _torch
        import onnx as _onnx
        from onnx import numpy_helper as _nh
        sys.dont_write_bytecode = True
        sys.path.insert(0, HERE)
        import train_models as _tmod
    except ImportError as e:
        return harness.skip("torch/onnx/numpy not available (%s); run with /usr/bin/python3 and "
                            "python3-torch, python3-onnx installed" % e)
    np, torch, onnx, numpy_helper, tmod = _np, _torch, _onnx, _nh, _tmod
    torch.set_num_threads(1)

    cases = make_cases()
    if args.cases:
        cases = [c for c in cases if any(s in c.name for s in args.cases)]
        if not cases:
            ap.error("no case matches %s" % args.cases)

    rep = harness.Report()
    cleave = None
    if not args.selftest:
        cleave = os.path.abspath(args.cleave)
        if not rep.executable(cleave):
            return rep.summary()
        if not harness.compile_available(cleave):
            return harness.skip("cleave compile not available (%s has no compile command yet)" % cleave)

    t0 = time.time()
    with harness.workdir(args.workdir, "cleave-train-") as workdir:
        if args.selftest:
            selftest(rep, workdir, cases)
        else:
            for case in cases:
                rep.guarded("%s" % case.name, lambda: run_case(rep, cleave, workdir, case))

    print("took %.1fs" % (time.time() - t0))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
