#!/usr/bin/env python3
"""Ranks that outnumber their node's CPUs are pinned round robin.

A program whose node runs more of its ranks than the CPUs they may use
pins each rank's thread to one CPU, the k-th rank of the node to the
(k mod C)-th allowed CPU (runtime/rt_bind.c), the placement the cost
model assumes (docs/costmodel.md).  The trace records each rank's CPU
(otherData.rank_memory[k].cpu, -1 when not pinned).  With
samples/mlp.onnx compiled as a 4-stage pipeline and run under `taskset`
on two CPUs, this checks:

- 4 ranks on 2 CPUs: ranks 0..3 are pinned to the first, second, first
  and second allowed CPU;
- with --no-bind, no rank is pinned, and the losses are the same floats
  (placement never changes the mathematics);
- 2 ranks (dp) on 2 CPUs: each has a CPU of its own; no rank is pinned;
- --no-bind=1 is a usage error (exit 2) naming the flag.

usage: test_bind.py --cleave BIN --workdir DIR
Ends with a line "N passed, M failed"; SKIP (exit 77) without numpy, onnx,
mpirun or taskset, or on a machine that lets this process use fewer than
2 CPUs.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "..", "samples", "mlp.onnx")
BATCH, ROWS, STEPS = 32, 96, 4


def cpus_of(trace):
    with open(trace) as f:
        mem = json.load(f)["otherData"]["rank_memory"]
    return [m["cpu"] for m in sorted(mem, key=lambda m: m["rank"])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", default="/tmp/cleave_bind")
    args = ap.parse_args()
    why = harness.missing(modules=("numpy", "onnx"), programs=("mpirun", "taskset"))
    allowed = sorted(os.sched_getaffinity(0))
    if not why and len(allowed) < 2:
        why = "this process may use %d CPU" % len(allowed)
    if why:
        return harness.skip(why)
    rep = harness.Report()
    if not rep.executable(args.cleave):
        return rep.summary()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    files = harness.image_data(work, ROWS, 3)
    two = ",".join(str(c) for c in allowed[:2])
    env = harness.mpi_env()

    def compile_(name, flags):
        prog = os.path.join(work, name)
        p, _ = harness.run([args.cleave, "compile", MODEL, "-o", prog, "--batch", str(BATCH), "--loss", "ce"] + flags)
        return prog if rep.check("compile %s" % name, p.returncode == 0, p.stderr.strip()[-400:]) else None

    def train(prog, ranks, tag, extra=()):
        trace, metrics = prog + tag + ".trace.json", prog + tag + ".jsonl"
        argv = [prog] + files + ["--steps", str(STEPS), "--trace", trace, "--metrics", metrics,
                                 "--log-every", "0"] + list(extra)
        p, _ = harness.run(["taskset", "-c", two] + harness.mpirun(ranks, argv), env=env, timeout=300)
        if not rep.check("%s%s: %d ranks on CPUs %s train" % (os.path.basename(prog), tag, ranks, two),
                         p.returncode == 0, harness.failure(argv, p)):
            return None, None
        return cpus_of(trace), harness.read_losses(metrics)

    pipe = compile_("pipe4", ["--ranks", "4", "--strategy", "pipeline", "--microbatches", "2"])
    if pipe:
        cpus, losses = train(pipe, 4, "")
        if cpus is not None:
            rep.equal("4 ranks on 2 CPUs: pinned round robin", cpus, [allowed[0], allowed[1], allowed[0], allowed[1]])
        cpus_nb, losses_nb = train(pipe, 4, "-nobind", ["--no-bind"])
        if cpus_nb is not None:
            rep.equal("--no-bind: no rank pinned", cpus_nb, [-1] * 4)
        if losses is not None and losses_nb is not None:
            rep.check("pinned and unpinned ranks train to the same losses", list(losses) == list(losses_nb),
                      "%s vs %s" % (list(losses), list(losses_nb)))
        p, _ = harness.run(harness.mpirun(4, [pipe] + files + ["--steps", "1", "--no-bind=1"]), env=env, timeout=120)
        rep.check("--no-bind=1: usage error naming the flag", p.returncode == 2 and "--no-bind takes no value" in
                  p.stderr, harness.failure([pipe, "--no-bind=1"], p))
    dp = compile_("dp2", ["--ranks", "2", "--strategy", "dp"])
    if dp:
        cpus, _ = train(dp, 2, "")
        if cpus is not None:
            rep.equal("2 ranks on 2 CPUs: a CPU each, none pinned", cpus, [-1, -1])
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
