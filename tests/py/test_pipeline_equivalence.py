#!/usr/bin/env python3
"""Layer, pipeline and hybrid parallelism never change the mathematics.

For the models of pipeline_models.py - a skip connection crossing stage
boundaries, a weight tied across stages, the plain Gemm MLP and the CNN -
every parallel program of PARALLEL below (layer on 2 ranks; pipeline on 2
and 4 ranks with 1, 4 and 8 micro-batches under gpipe and 1f1b; hybrid
--dp 2 --pp 2), run under mpirun, must give the same per-step losses
(rtol 1e-5) and final weights (rtol 1e-4) as the single-process program
compiled from the same model with the same options and no --strategy.  The
single-process program is itself held against PyTorch, as in
test_train_vs_torch.py, and trains with Adam or momentum for a few steps so
that optimizer state carried between steps matters.

Also checked: that the exported files are what the cases assume (the tied
weight is one initializer read by two nodes, `cleave inspect` counts it
once; the --stages cuts put the skip connection's ends and the tied
weight's two uses on different stages, and the emitted plans say so); the
tied weight in the saved model; --check-replicas under hybrid; and the
guard rails: --microbatches not dividing the batch, --stages naming an
unknown node, hybrid with --dp * --pp != --ranks (each refused with exit
status > 0 and one line naming the flag) and a program launched with the
wrong -np.

usage: test_pipeline_equivalence.py --cleave BIN --workdir DIR
Prints one line per check and ends with "N passed, M failed"; exits 1 on
a failure; SKIP (exit 77) without torch or mpirun.
"""
import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

B, N, STEPS = 16, 96, 6          # global batch (divisible by 8 micro-batches x 2 replicas), rows, steps
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-7  # parallel vs single process
W_RTOL, W_ATOL = 1e-4, 1e-6
TORCH_LOSS_RTOL, TORCH_LOSS_ATOL = 1e-4, 1e-6  # single process vs torch, as test_train_vs_torch.py
TORCH_W_RTOL, TORCH_W_ATOL = 1e-3, 1e-5
COMPILE_TIMEOUT = 300
RUN_TIMEOUT = 90                 # a run takes about a second; more means a hang


@dataclass(frozen=True)
class Par:
    """One parallel configuration: what goes on the compile line."""
    strategy: str                  # layer | pipeline | hybrid | dp
    stages: int                    # P
    micro: Optional[int] = None    # --microbatches (None: not given, the default)
    schedule: Optional[str] = None  # --schedule (None: not given, the default gpipe)
    dp: int = 1                    # hybrid: --dp
    give_ranks: bool = True        # hybrid: also pass --ranks D*P
    check_plan: bool = False       # emit the plan and check the stages and transfers
    placement: Optional[str] = None  # hybrid: --placement (None: the default, by_replica)

    @property
    def ranks(self):
        return self.dp * self.stages

    def label(self):
        if self.strategy == "dp":
            return "dp D=%d" % self.dp
        s = self.strategy
        if self.strategy == "hybrid":
            s += " D=%d" % self.dp
        s += " P=%d" % self.stages
        if self.placement:
            s += " " + self.placement
        if self.strategy != "layer":
            s += " M=%s %s" % (self.micro if self.micro else "default", self.schedule or "default")
        return s

    def flags(self, cuts):
        f = ["--strategy", self.strategy]
        if self.strategy == "dp":
            return f + ["--ranks", str(self.ranks)]
        if self.strategy == "hybrid":
            f += ["--dp", str(self.dp), "--pp", str(self.stages)]
            if self.give_ranks:
                f += ["--ranks", str(self.ranks)]
            if self.placement:
                f += ["--placement", self.placement]
        else:
            f += ["--ranks", str(self.ranks)]
        if self.micro is not None:
            f += ["--microbatches", str(self.micro)]
        if self.schedule is not None:
            f += ["--schedule", self.schedule]
        if cuts:
            f += ["--stages", ",".join(cuts)]
        return f


PARALLEL = (
    [Par("layer", 2, check_plan=True)]
    + [Par("pipeline", p, m, s, check_plan=(p == 4 and m == 4 and s == "1f1b"))
       for p in (2, 4) for m in (1, 4, 8) for s in ("gpipe", "1f1b")]
    + [Par("hybrid", 2, dp=2, give_ranks=False),                  # --microbatches, --schedule defaulted
       Par("hybrid", 2, 4, "1f1b", dp=2, check_plan=True),
       Par("hybrid", 2, 8, "gpipe", dp=2),                          # one row per micro-batch
       Par("hybrid", 2, 4, "1f1b", dp=2, placement="by_stage", check_plan=True)]     # a stage's replicas on consecutive ranks
    # data parallelism on the same models: the tied weight's gradient sum
    # must land in its bucket, not in place over one of its terms
    + [Par("dp", 1, dp=2)]
)


def run(cmd, timeout=COMPILE_TIMEOUT, env=None):
    """harness.run_group with this script's default time limit."""
    return harness.run_group(cmd, env=env, timeout=timeout)


def mpirun(np_, argv, timeout=RUN_TIMEOUT):
    """run() under mpirun -np np_.  Open MPI's launcher sometimes fails to
    set up its session folder in /tmp when other mpirun jobs come and go at
    the same moment ("orte_session_dir failed", before any rank starts);
    that launch is tried again, twice at most."""
    env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none",
                          OMPI_MCA_rmaps_base_oversubscribe="1")
    for attempt in range(3):
        rc, out, err = run(harness.mpirun(np_, argv), timeout=timeout, env=env)
        if rc == 0 or "orte_session_dir failed" not in err:
            break
        time.sleep(1)
    return rc, out, err


def tail(err, n=400):
    """What a failed command printed, on one line: its last three lines
    joined with " | " and cut to the last n characters."""
    lines = [l.strip() for l in err.splitlines() if l.strip()]
    return " | ".join(lines[-3:])[-n:]


read_losses = harness.read_losses
read_weights = harness.read_weights


def initializer_names(path):
    import onnx
    return [i.name for i in onnx.load(path).graph.initializer]


def same_losses(got, want, rtol, atol):
    import numpy as np
    if len(got) != len(want):
        return False, "%d losses, expected %d" % (len(got), len(want))
    ok = bool(np.allclose(got, want, rtol=rtol, atol=atol))
    return ok, "" if ok else "%s vs %s" % (got, want)


def same_weights(got, want, rtol, atol):
    """(ok, detail): the same initializer names, every one within tolerance."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        return False, "missing %s, unexpected %s" % (missing, extra)
    for k in sorted(want):
        ok, detail = harness.compare(got[k], want[k], rtol, atol)
        if not ok:
            return False, "%s: %s" % (k, detail)
    return True, ""


def one_line_naming(rc, err, flags, also=()):
    """A refused command line: exit status > 0 and one line on stderr naming
    one of `flags` and every string of `also`."""
    lines = [l for l in err.splitlines() if l.strip()]
    return (rc is not None and rc > 0 and len(lines) == 1 and any(f in lines[0] for f in flags)
            and all(a in lines[0] for a in also))


# ------------------------------------------------------------ the model


class ModelCase:
    """One model with its loss and optimizer: its folder, exported file,
    data set and single-process reference."""

    def __init__(self, work, name, loss, opt):
        import numpy as np
        import pipeline_models as pm
        import train_models as tm

        self.name, self.loss, self.opt = name, loss, opt
        self.spec = pm.MODELS[name]
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        self.model_path = tm.export_onnx(self.spec, self.spec.build(), os.path.join(self.dir, "model.onnx"), B)
        self.data = tm.make_data(self.spec, loss, N)
        self.files = []
        for k, v in self.data.items():
            p = os.path.join(self.dir, k + ".npy")
            np.save(p, v)
            self.files += ["--data", "%s=%s" % (k, p)]
        self.cuts = pm.STAGES.get(name, {})
        self.ref_losses = None
        self.ref_weights = None

    def compile_cmd(self, out):
        return ([ARGS.cleave, "compile", self.model_path, "-o", out, "--batch", str(B), "--loss", self.loss]
                + self.opt.cleave_flags())

    def run_args(self, prog):
        return [prog] + self.files + ["--steps", str(STEPS), "--metrics", prog + ".jsonl", "--save", prog + ".onnx"]


def check_exports(rep, mc):
    """What the cases assume of the exported files and the cut lists."""
    import pipeline_models as pm

    path = mc.model_path
    if mc.name == "tied":
        w = pm.TIED_WEIGHT
        n_init = initializer_names(path).count(w)
        users = pm.consumers(path, w)
        rep.check("tied: %s is one initializer read by two nodes %s" % (w, users), n_init == 1 and len(users) == 2,
                  "%d initializers, read by %s" % (n_init, users))
        rc, out, err = run([ARGS.cleave, "inspect", path, "--batch", str(B), "--format", "json"])
        params = sum(p.numel() for p in mc.spec.build().parameters())  # torch counts a shared parameter once
        got = None
        if rc == 0:
            got = json.loads(out).get("totals", {}).get("params")
        rep.check("tied: cleave inspect counts the tied weight once (%d parameters)" % params, got == params,
                  "inspect exited %s, params %s: %s" % (rc, got, tail(err)))
        for p, cuts in sorted(mc.cuts.items()):
            st = pm.stage_of_nodes(path, cuts)
            where = sorted(st[u] for u in users)
            rep.check("tied: --stages %s puts the uses of %s on stages %s" % (",".join(cuts), w, where),
                      len(set(where)) == 2, "both on stage %s" % where)
    if mc.name == "skip":
        h1 = pm.output_of(path, pm.SKIP_PRODUCER)
        users = pm.consumers(path, h1)
        rep.check("skip: h1 (%s) is read by %s" % (h1, users), pm.SKIP_CONSUMER in users and len(users) == 2,
                  str(users))
        for p, cuts in sorted(mc.cuts.items()):
            st = pm.stage_of_nodes(path, cuts)
            a, b = st[pm.SKIP_PRODUCER], st[pm.SKIP_CONSUMER]
            want = (0, 2) if p >= 3 else (0, p - 1)
            rep.check("skip: --stages %s makes h1 on stage %d and adds it on stage %d" % (",".join(cuts), a, b),
                      (a, b) == want, "expected %s" % (want,))


def baseline(rep, mc):
    """Compiles and runs the single-process program, holds it against torch,
    and keeps its losses and weights as the reference; False when that fails."""
    import train_models as tm

    prog = os.path.join(mc.dir, "single")
    rc, _, err = run(mc.compile_cmd(prog))
    if not rep.check("%s: compile single (%s, %s)" % (mc.name, mc.loss, mc.opt.describe()), rc == 0, tail(err)):
        return False
    rc, _, err = run(mc.run_args(prog), timeout=RUN_TIMEOUT)
    if not rep.check("%s: run single" % mc.name, rc == 0, tail(err)):
        return False
    mc.ref_losses = read_losses(prog + ".jsonl")
    mc.ref_weights = read_weights(prog + ".onnx")
    if not rep.check("%s: single wrote %d loss lines" % (mc.name, STEPS), len(mc.ref_losses) == STEPS,
                     str(len(mc.ref_losses))):
        return False
    ref = tm.train_reference(mc.spec, mc.loss, mc.opt, mc.data, B, STEPS)
    ok, detail = same_losses(mc.ref_losses, ref.losses, TORCH_LOSS_RTOL, TORCH_LOSS_ATOL)
    rep.check("%s: single losses equal torch (rtol %g)" % (mc.name, TORCH_LOSS_RTOL), ok, detail)
    ok, detail = same_weights(mc.ref_weights, ref.weights, TORCH_W_RTOL, TORCH_W_ATOL)
    rep.check("%s: single final weights equal torch (rtol %g)" % (mc.name, TORCH_W_RTOL), ok, detail)
    return True


def check_plan(rep, tag, mc, par, cuts, plan_path):
    """The emitted plan has the strategy, ranks and stages asked for, cuts
    where --stages says, and sends the skip connection straight to its
    consumer's stage / sums the tied weight's gradient across its stages.
    Fields: strategy, ranks, stages, microbatches, stage_table[].first_node,
    transfers[] {value, direction, from_stage, to_stage}."""
    import pipeline_models as pm

    def body():
        with open(plan_path) as f:
            plan = json.load(f)
        want = {"strategy": par.strategy, "ranks": par.ranks, "stages": par.stages}
        if par.micro:
            want["microbatches"] = par.micro
        got = {k: plan.get(k) for k in want}
        rep.check("%s: plan has %s" % (tag, want), got == want, "got %s" % got)
        if par.strategy == "hybrid":
            # rank = replica * P + stage, or stage * D + replica by stage
            P, D = par.stages, par.dp
            by_stage = par.placement == "by_stage"
            want_groups = [[s * D + r if by_stage else r * P + s for r in range(D)] for s in range(P)]
            rep.check("%s: plan places %s, groups %s" % (tag, par.placement or "by_replica", want_groups),
                      plan.get("placement") == (par.placement or "by_replica") and plan.get("groups") == want_groups,
                      "got %s, %s" % (plan.get("placement"), plan.get("groups")))
            stages = [rp["stage"] for rp in sorted(plan["rank_plans"], key=lambda rp: rp["rank"])]
            rep.check("%s: rank_plans' stages by rank" % tag,
                      stages == [(k // D if by_stage else k % P) for k in range(D * P)], stages)
        if not cuts:
            return
        table = sorted(plan["stage_table"], key=lambda s: s["stage"])
        firsts = [s["first_node"] for s in table[1:]]
        rep.check("%s: plan's stages start at %s" % (tag, list(cuts)), firsts == list(cuts), "got %s" % firsts)
        st = pm.stage_of_nodes(mc.model_path, cuts)
        xfers = plan["transfers"]
        if mc.name == "skip":
            h1 = pm.output_of(mc.model_path, pm.SKIP_PRODUCER)
            a, b = st[pm.SKIP_PRODUCER], st[pm.SKIP_CONSUMER]
            ok = any(x["value"] == h1 and x["direction"] == "activation" and x["from_stage"] == a
                     and x["to_stage"] == b for x in xfers)
            rep.check("%s: plan sends h1 straight from stage %d to stage %d" % (tag, a, b), ok,
                      [x for x in xfers if x["value"] == h1])
        if mc.name == "tied":
            ends = {st[u] for u in pm.consumers(mc.model_path, pm.TIED_WEIGHT)}
            ok = any(x["direction"] == "gradient_sum" and {x["from_stage"], x["to_stage"]} == ends for x in xfers)
            rep.check("%s: plan sums %s's gradient between stages %s" % (tag, pm.TIED_WEIGHT, sorted(ends)), ok,
                      [x for x in xfers if x["direction"] == "gradient_sum"])

    rep.guarded("%s: plan readable" % tag, body)


def parallel_case(rep, mc, par):
    """Compiles and runs one parallel configuration of a model and holds its
    losses and weights against the single-process program."""
    import numpy as np
    import pipeline_models as pm

    tag = "%s: %s" % (mc.name, par.label())
    cuts = mc.cuts.get(par.stages, ())
    slug = par.label().replace(" ", "_").replace("=", "")
    prog = os.path.join(mc.dir, slug)
    cmd = mc.compile_cmd(prog) + par.flags(cuts)
    if par.check_plan:
        cmd += ["--emit-plan", prog + ".plan.json"]
    rc, _, err = run(cmd)
    compiled = rep.check("%s: compile%s" % (tag, " --stages " + ",".join(cuts) if cuts else ""), rc == 0, tail(err))
    if par.check_plan and os.path.exists(prog + ".plan.json"):  # written before linking: checked even if that fails
        check_plan(rep, tag, mc, par, cuts, prog + ".plan.json")
    if not compiled:
        return
    argv = mc.run_args(prog)
    replicated = par.strategy in ("hybrid", "dp")
    if replicated:
        argv.append("--check-replicas")
    t0 = time.time()
    rc, out, err = mpirun(par.ranks, argv)
    if not rep.check("%s: runs under mpirun -np %d%s (%.1fs)" % (
            tag, par.ranks, " with --check-replicas" if replicated else "", time.time() - t0),
            rc == 0, tail(err)):
        return
    if replicated:
        rep.check("%s: --check-replicas found the replicas identical" % tag, "replicas identical" in out + err,
                  tail(out + err))
    if par.placement:
        def placed():
            with open(prog + ".jsonl") as f:
                head = json.loads(f.readline())
            return [(x["stage"], x["replica"]) for x in head["plan"]["ranks"]]
        got = rep.guarded("%s: metrics' plan line readable" % tag, placed)
        D, P = par.dp, par.stages
        want = [((k // D, k % D) if par.placement == "by_stage" else (k % P, k // P)) for k in range(D * P)]
        rep.check("%s: each rank runs the (stage, replica) its placement gives" % tag, got == want, got)
    losses = rep.guarded("%s: metrics readable" % tag, lambda: read_losses(prog + ".jsonl"))
    if losses is not None:
        ok, detail = same_losses(losses, mc.ref_losses, LOSS_RTOL, LOSS_ATOL)
        rep.check("%s: %d per-step losses equal single-process (rtol %g)" % (tag, STEPS, LOSS_RTOL), ok, detail)
    w = rep.guarded("%s: saved model readable" % tag, lambda: read_weights(prog + ".onnx"))
    if w is None:
        return
    ok, detail = same_weights(w, mc.ref_weights, W_RTOL, W_ATOL)
    rep.check("%s: final weights equal single-process (rtol %g)" % (tag, W_RTOL), ok, detail)
    if mc.name == "tied":
        t = pm.TIED_WEIGHT
        n = initializer_names(prog + ".onnx").count(t)
        users = pm.consumers(prog + ".onnx", t)
        ok = n == 1 and len(users) == 2 and t in w and np.allclose(w[t], mc.ref_weights[t], rtol=W_RTOL, atol=W_ATOL)
        rep.check("%s: saved model has one %s, read by %s, equal to single-process" % (tag, t, users), ok,
                  "%d initializers named %s" % (n, t))


# -------------------------------------------------------------- guard rails


def guard_rails(rep, mc):
    """Refused command lines and a program launched on the wrong number of
    ranks, on the skip model."""
    bad = os.path.join(mc.dir, "refused")
    base = mc.compile_cmd(bad)
    cases = [
        ("--microbatches 3 with --batch %d" % B, ["--strategy", "pipeline", "--ranks", "2", "--microbatches", "3"],
         ["--microbatches"], ["3", str(B)]),
        ("hybrid --dp 2 --microbatches 16 with --batch %d" % B,
         ["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "16"], ["--microbatches"], []),
        ("--stages naming an unknown node", ["--strategy", "pipeline", "--ranks", "2", "--stages", "/no/such/Gemm"],
         ["--stages"], ["/no/such/Gemm"]),
        ("hybrid --dp 2 --pp 2 with --ranks 3", ["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--ranks", "3"],
         ["--ranks", "--dp", "--pp"], ["3"]),
    ]
    for label, flags, named, also in cases:
        rc, _, err = run(base + flags)
        rep.check("%s is refused: status > 0, one line naming %s" % (label, " or ".join(named)),
                  one_line_naming(rc, err, named, also), "exit %s: %s" % (rc, tail(err)))

    prog = os.path.join(mc.dir, "pipeline_P2_M4_gpipe")
    if not os.path.exists(prog):
        rep.check("a 2-rank pipeline program to launch on the wrong -np", False, "%s was not built" % prog)
        return
    for np_ in (3, 1):
        t0 = time.time()
        rc, _, err = mpirun(np_, [prog] + mc.files + ["--steps", "2"], timeout=60)
        said = [l for l in err.splitlines() if "error" in l.lower() and "rank" in l.lower() and "2" in l]
        rep.check("a 2-rank pipeline program launched with -np %d refuses to run, naming its 2 ranks (%.1fs)"
                  % (np_, time.time() - t0), rc is not None and rc != 0 and bool(said), "exit %s: %s" % (rc, tail(err)))


# ---------------------------------------------------------------------- main

ARGS = None


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", default="/tmp/cleave_pipeline")
    ARGS = ap.parse_args()
    ARGS.cleave = os.path.abspath(ARGS.cleave)
    rep = harness.Report()
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        import onnx  # noqa: F401
        import train_models as tm
        import pipeline_models  # noqa: F401
    except Exception as e:  # pragma: no cover
        return harness.skip("torch not available (%s)" % e)
    if harness.missing(programs=("mpirun",)):
        return harness.skip("mpirun not available")
    if not rep.executable(ARGS.cleave):
        return rep.summary()
    work = os.path.abspath(ARGS.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    models = [("skip", "ce", tm.OptimConfig("adam", 0.01)),
              ("tied", "mse", tm.OptimConfig("adam", 0.01, weight_decay=0.01)),
              ("mlp_gemm", "ce", tm.OptimConfig("momentum", 0.05, momentum=0.9)),
              ("cnn", "ce", tm.OptimConfig("momentum", 0.02, momentum=0.9, nesterov=True))]
    t_start = time.time()
    cases = {}
    for name, loss, opt in models:
        mc = rep.guarded("%s: export and data" % name, lambda: ModelCase(work, name, loss, opt))
        if mc is None:
            continue
        cases[name] = mc
        rep.guarded("%s: export checks" % name, lambda: check_exports(rep, mc))
        if not rep.guarded("%s: single-process reference" % name, lambda: baseline(rep, mc)):
            continue
        for par in PARALLEL:
            rep.guarded("%s: %s" % (name, par.label()), lambda: parallel_case(rep, mc, par))
    if "skip" in cases:
        rep.guarded("guard rails", lambda: guard_rails(rep, cases["skip"]))
    print("(%.0f s)" % (time.time() - t_start))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
