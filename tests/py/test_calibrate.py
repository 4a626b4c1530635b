#!/usr/bin/env python3
"""`cleave calibrate --quick` writes a cluster file that validates against
schemas/cluster.schema.json, says it is calibrated, holds measured rates,
and that `cleave plan --cluster` reads; its usage and I/O errors are one
line with a non-zero exit.  The runtime's --calibrate-comm refuses one rank
and an unwritable file in one line.

usage: test_calibrate.py --cleave BIN --workdir DIR
"""
import argparse
import json
import math
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "samples", "mlp.onnx")


def error_lines(text, under_mpirun):
    """The lines of an error; under mpirun, without mpirun's own banner
    (dashes and its explanation), only the program's "PROG: error:" lines."""
    lines = [line for line in text.splitlines() if line.strip()]
    return [line for line in lines if ": error: " in line] if under_mpirun else lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    rep = harness.Report()
    if not rep.executable(args.cleave):
        return rep.summary()
    os.makedirs(args.workdir, exist_ok=True)
    out = os.path.join(args.workdir, "calibrated.json")
    if os.path.exists(out):
        os.remove(out)

    cmd = [args.cleave, "calibrate", "-o", out, "--quick", "--ranks-per-node", "2"]
    p, secs = harness.run(cmd, env=harness.mpi_env(), timeout=120)
    rep.check("cleave calibrate --quick exits 0", p.returncode == 0, harness.failure(cmd, p))
    rep.check("cleave calibrate --quick takes under 30 s", secs < 30, "%.1f s" % secs)
    rep.check("the summary says what is measured and what is default",
              "measured" in p.stderr and "inter_node" in p.stderr and "default" in p.stderr, p.stderr)
    doc = rep.guarded("calibrated.json is JSON", lambda: json.load(open(out)))
    if doc is None:
        return rep.summary()

    try:
        import jsonschema
        with open(os.path.join(ROOT, "schemas", "cluster.schema.json")) as f:
            validator = jsonschema.Draft202012Validator(json.load(f))
        errors = sorted(validator.iter_errors(doc), key=str)
        rep.check("calibrated.json validates against schemas/cluster.schema.json", not errors,
                  "; ".join(e.message for e in errors[:3]))
    except ImportError:
        rep.skip("calibrated.json validates against schemas/cluster.schema.json", "python3-jsonschema not installed")
    rep.equal("source", doc.get("source"), "calibrated")
    rep.equal("ranks_per_node", doc.get("ranks_per_node"), 2)
    rep.equal("cores_per_node (this machine's CPUs)", doc.get("cores_per_node"), os.cpu_count())
    curve = doc["compute"]["gemm_gflops"]
    rep.check("the GEMM curve has a point per --quick size", len(curve) >= 2, curve)
    rep.check("GEMM sizes ascend", all(a[0] < b[0] for a, b in zip(curve, curve[1:])), curve)
    # Positive and below any CPU core's reach: a rate of 0 or 1e6 is a
    # timing bug.  Whether larger products run faster depends on the
    # machine (the generated kernels are not cache-blocked), so the order
    # of the rates is not checked.
    rep.check("GEMM rates are positive and plausible",
              all(0 < r < 1e4 and math.isfinite(r) for _, r in curve), curve)
    rep.check("elementwise_gbps is positive", 0 < doc["compute"]["elementwise_gbps"] < 1e4, doc["compute"])
    rep.check("kernel_overhead_s is under a millisecond", 0 <= doc["compute"]["kernel_overhead_s"] < 1e-3,
              doc["compute"])
    if shutil.which("mpirun"):
        rep.check("intra_node is measured with mpirun", "intra_node        measured" in p.stderr, p.stderr)
    else:
        rep.skip("intra_node is measured with mpirun", "mpirun not available")

    cmd = [args.cleave, "plan", MLP, "--batch", "32", "--ranks", "2", "--cluster", out]
    p, _ = harness.run(cmd, timeout=120)
    rep.check("cleave plan --cluster calibrated.json exits 0", p.returncode == 0, harness.failure(cmd, p))
    rep.check("the plan report names the calibrated file", "calibrated.json" in p.stdout + p.stderr,
              p.stdout[-800:])

    # --cache: this machine's calibration, used when no --cluster is given.
    cache = os.path.join(args.workdir, "cache", "nested", "cluster.json")
    shutil.rmtree(os.path.join(args.workdir, "cache"), ignore_errors=True)
    env = harness.mpi_env(CLEAVE_CLUSTER_CACHE=cache)
    cmd = [args.cleave, "calibrate", "--quick", "--cache", "--ranks-per-node", "2"]
    p, _ = harness.run(cmd, env=env, timeout=120)
    rep.check("calibrate --cache writes $CLEAVE_CLUSTER_CACHE, creating its folders",
              p.returncode == 0 and os.path.exists(cache), harness.failure(cmd, p))
    plan = [args.cleave, "plan", MLP, "--batch", "32", "--ranks", "2"]
    p, _ = harness.run(plan, env=env, timeout=120)
    rep.check("without --cluster, plan uses the cached calibration and says so",
              p.returncode == 0 and "this machine's calibration (%s)" % cache in p.stdout, p.stdout[:400] + p.stderr)
    p, _ = harness.run(plan + ["--ranks", "4"], env=env, timeout=120)
    rep.check("more ranks than the calibration's share its node", p.returncode == 0, p.stderr[-300:])
    p, _ = harness.run(plan, env=harness.mpi_env(CLEAVE_CLUSTER_CACHE=cache + ".absent"), timeout=120)
    rep.check("without a cache, plan says it uses the stated defaults",
              p.returncode == 0 and "stated defaults" in p.stdout and "no calibration cached" in p.stdout,
              p.stdout[:400])
    with open(cache, "w") as f:
        f.write("{ not json")
    p, _ = harness.run(plan, env=env, timeout=120)
    lines = p.stderr.strip().splitlines()
    rep.check("a broken cache is one line naming it and what to do",
              p.returncode != 0 and len(lines) == 1 and cache in p.stderr and "calibrate --cache" in p.stderr,
              p.stderr[-400:])

    def one_line_error(label, cmd, env=None, want_status=None):
        p, _ = harness.run(cmd, env=env, timeout=60)
        lines = error_lines(p.stderr, env is not None)
        ok = p.returncode != 0 and len(lines) == 1 and (want_status is None or p.returncode == want_status)
        rep.check(label, ok, "status %d: %r" % (p.returncode, p.stderr[-600:]))
        return p

    one_line_error("calibrate without -o: one line, status 2", [args.cleave, "calibrate", "--quick"],
                   want_status=2)
    one_line_error("calibrate with -o and --cache: one line, status 2",
                   [args.cleave, "calibrate", "--quick", "--cache", "-o", out], want_status=2)
    one_line_error("calibrate -o into a missing folder: one line",
                   [args.cleave, "calibrate", "--quick", "-o", os.path.join(args.workdir, "no", "such", "x.json")])
    one_line_error("calibrate -o a folder: one line", [args.cleave, "calibrate", "--quick", "-o", args.workdir])
    one_line_error("calibrate with an unknown option: one line, status 2",
                   [args.cleave, "calibrate", "-o", out, "--fast"], want_status=2)

    # The runtime's flag, on a program compiled for one rank.
    prog = os.path.join(args.workdir, "mlp")
    cmd = [args.cleave, "compile", MLP, "--batch", "1", "-o", prog]
    p, _ = harness.run(cmd, timeout=300)
    if not rep.check("compile samples/mlp.onnx for --calibrate-comm", p.returncode == 0, harness.failure(cmd, p)):
        return rep.summary()
    comm = os.path.join(args.workdir, "comm.json")
    p = one_line_error("--calibrate-comm on one rank: one line", [prog, "--calibrate-comm", comm])
    rep.check("... saying to use mpirun -np 2", "mpirun -np 2" in p.stderr, p.stderr)
    one_line_error("--calibrate-comm with --steps: one line, status 2",
                   [prog, "--calibrate-comm", comm, "--steps", "1"], want_status=2)
    if shutil.which("mpirun"):
        bad = os.path.join(args.workdir, "no", "such", "comm.json")
        p = one_line_error("--calibrate-comm to an unwritable path: one program error line",
                           harness.mpirun(2, [prog, "--calibrate-comm", bad]), env=harness.mpi_env())
        cmd = harness.mpirun(2, [prog, "--calibrate-comm", comm])
        p, _ = harness.run(cmd, env=harness.mpi_env(), timeout=120)
        if rep.check("--calibrate-comm under mpirun -np 2 exits 0", p.returncode == 0, harness.failure(cmd, p)):
            res = json.load(open(comm))
            rep.check("it writes a latency, a bandwidth and same_node",
                      res["latency_s"] >= 0 and res["bandwidth_gbps"] > 0 and res["same_node"] is True, res)
    else:
        rep.skip("--calibrate-comm under mpirun -np 2", "mpirun not available")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
