#!/usr/bin/env python3
"""Data parallelism never changes the mathematics.

For the PyTorch-exported test models, a program compiled with
--strategy dp on 2 and 4 ranks (run under mpirun), and on 4 ranks with
the hierarchical gradient allreduce over nodes of 2, 3 and 1 ranks
(--allreduce hierarchical:K; on one host the nodes are the plan's, not
real ones), must give the same
per-step losses (rtol 1e-5) and final weights (rtol 1e-4) as the
single-process program, and the single-process program matches PyTorch
(test_train_vs_torch.py).  Also checks the guard rails of dp: a batch that
does not divide, a program launched with the wrong -np, --check-replicas,
and a failure on one rank ending every rank.

usage: test_dp_equivalence.py --cleave BIN --workdir DIR
Ends with a line "N passed, M failed"; SKIP (exit 77) without torch or
mpirun.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402


def run(cmd, timeout=300, env=None):
    p, _ = harness.run(cmd, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def mpirun(np_, argv, timeout=300):
    env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none",
                          OMPI_MCA_rmaps_base_oversubscribe="1")
    return run(harness.mpirun(np_, argv), timeout=timeout, env=env)


read_losses = harness.read_losses
read_weights = harness.read_weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", default="/tmp/cleave_dp")
    args = ap.parse_args()
    rep = harness.Report()
    try:
        import numpy as np
        import torch  # noqa: F401
        import train_models as tm
    except Exception as e:  # pragma: no cover
        return harness.skip("torch not available (%s)" % e)
    if harness.missing(programs=("mpirun",)):
        return harness.skip("mpirun not available")
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    B, N, STEPS = 16, 96, 12

    cases = [("mlp_gemm", "ce", ["--optimizer", "momentum", "--lr", "0.05"]),
             ("residual", "mse", ["--optimizer", "adam", "--lr", "0.01"]),
             ("mlp_matmul_flat", "ce", ["--optimizer", "sgd", "--lr", "0.1", "--weight-decay", "0.01"])]
    for name, loss, opt in cases:
        spec = tm.MODELS[name]
        d = os.path.join(work, name)
        os.makedirs(d)
        model_path = tm.export_onnx(spec, spec.build(), os.path.join(d, "model.onnx"), B)
        data = tm.make_data(spec, loss, N)
        files = []
        for k, v in data.items():
            p = os.path.join(d, k + ".npy")
            np.save(p, v)
            files += ["--data", "%s=%s" % (k, p)]
        base = [args.cleave, "compile", model_path, "--batch", str(B), "--loss", loss] + opt
        rc, _, err = run(base + ["-o", os.path.join(d, "single")])
        if not rep.check("%s: compile single" % name, rc == 0, err.strip()):
            continue
        rc, _, err = run([os.path.join(d, "single")] + files + ["--steps", str(STEPS), "--metrics",
                         os.path.join(d, "single.jsonl"), "--save", os.path.join(d, "single.onnx")])
        if not rep.check("%s: run single" % name, rc == 0, err.strip()):
            continue
        ref_losses = read_losses(os.path.join(d, "single.jsonl"))
        ref_w = read_weights(os.path.join(d, "single.onnx"))
        # hierarchical allreduce over 4 ranks: nodes of 2 (2 x 2), of 3 (an
        # uneven last node) and of 1 (every rank leads its node)
        for ranks, node in ((2, 0), (4, 0), (4, 2), (4, 3), (4, 1)):
            prog = os.path.join(d, "dp%d" % ranks + ("h%d" % node if node else ""))
            hier = ["--allreduce", "hierarchical:%d" % node] if node else []
            label = "%s: dp x%d%s" % (name, ranks, ", hierarchical over nodes of %d" % node if node else "")
            rc, _, err = run(base + ["-o", prog, "--ranks", str(ranks), "--strategy", "dp", "--bucket-mb", "0.001"] +
                             hier)
            if not rep.check("%s: compile" % label, rc == 0, err.strip()):
                continue
            m = prog + ".jsonl"
            t0 = time.time()
            rc, _, err = mpirun(ranks, [prog] + files + ["--steps", str(STEPS), "--metrics", m, "--save",
                                prog + ".onnx", "--check-replicas"])
            if not rep.check("%s runs under mpirun (%.1fs)" % (label, time.time() - t0), rc == 0,
                             err.strip()[-500:]):
                continue
            losses = read_losses(m)
            rep.check("%s wrote %d loss lines" % (label, STEPS), len(losses) == STEPS, str(len(losses)))
            ok = len(losses) == len(ref_losses) and np.allclose(losses, ref_losses, rtol=1e-5, atol=1e-7)
            rep.check("%s per-step losses equal single-process (rtol 1e-5)" % label, ok,
                      "%s vs %s" % (losses[:4], ref_losses[:4]))
            w = read_weights(prog + ".onnx")
            bad = [k for k in ref_w if k not in w or not np.allclose(w[k], ref_w[k], rtol=1e-4, atol=1e-6)]
            rep.check("%s final weights equal single-process (rtol 1e-4)" % label, not bad, "differ: %s" % bad)

    # guard rails
    spec = tm.MODELS["mlp_gemm"]
    d = os.path.join(work, "mlp_gemm")
    model_path = os.path.join(d, "model.onnx")
    rc, _, err = run([args.cleave, "compile", model_path, "--batch", "15", "--ranks", "2", "--strategy", "dp",
                      "-o", os.path.join(d, "bad")])
    rep.check("batch not divisible by ranks is refused naming both", rc == 2 and "15" in err and "2" in err,
              err.strip())
    prog = os.path.join(d, "dp2")
    if os.path.exists(prog):
        files = ["--data", "input=%s" % os.path.join(d, "input.npy"), "--data",
                 "labels=%s" % os.path.join(d, "labels.npy")]
        t0 = time.time()
        rc, _, err = mpirun(3, [prog] + files + ["--steps", "2"], timeout=120)
        rep.check("a 2-rank program launched with -np 3 refuses to run (%.1fs)" % (time.time() - t0),
                  rc != 0 and "rank" in err.lower(), err.strip()[-300:])
        # a file that only rank 1 cannot read: every rank must stop, quickly
        bad_dir = os.path.join(d, "rank_fail")
        os.makedirs(bad_dir, exist_ok=True)
        script = os.path.join(bad_dir, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then x=/nonexistent/input.npy; "
                    "else x=%s; fi\nexec %s --data input=$x --data labels=%s --steps 5\n"
                    % (os.path.join(d, "input.npy"), prog, os.path.join(d, "labels.npy")))
        os.chmod(script, 0o755)
        t0 = time.time()
        try:
            rc, _, err = mpirun(2, [script], timeout=60)
            elapsed = time.time() - t0
            rep.check("a file unreadable on one rank stops every rank with its message (%.1fs)" % elapsed,
                      rc != 0 and "nonexistent" in err and elapsed < 30, err.strip()[-300:])
        except subprocess.TimeoutExpired:
            rep.check("a file unreadable on one rank stops every rank", False, "hung for 60 s")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
