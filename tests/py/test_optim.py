#!/usr/bin/python3
"""What transformer training asks of the optimizer, held against PyTorch.

Three models, exported at batch 16 and trained for 8 steps on 96 rows
(train_models.make_data): the Gemm MLP 20-32-16-5 of train_models.py; a
net with a LayerNorm (fc1 -> LayerNorm -> ReLU -> fc2 -> Tanh -> fc3,
opset 17: one LayerNormalization node) so that --no-decay has biases and
a norm's scale and shift to spare; and pipeline_models' tied MLP, cut at
/MatMul so that its tied weight is read, and updated, on both stages while
its gradient must count once in the norm.  Each case compiles one
optimizer setting and trains it under the layouts it lists:

  single, dp 2, pipeline 2 (1F1B, 2 micro-batches), hybrid 2 x 2
  (1F1B, 2 micro-batches), the last three under mpirun;

and torch trains a fresh copy on the same batches with:

  - torch.optim.SGD / Adam / AdamW with two parameter groups, the
    parameters --no-decay's patterns should spare (named here one by one,
    so the patterns' matching is checked too) at weight_decay 0;
    AdamW's decay left at torch's default when the case gives none;
  - torch.nn.utils.clip_grad_norm_(model.parameters(), C) after
    backward() and before optimizer.step(), with C below the norm of some
    steps (checked): of every step under SGD, and not of every step under
    Adam and AdamW, whose update a factor common to every step would not
    change;
  - the learning-rate schedule as torch.optim.lr_scheduler computes it,
    scheduler.step() after each optimizer.step(): CosineAnnealingLR(T_max
    = T - W), LinearLR(1 -> 0 over T - W) or ConstantLR(1), after W
    warmup steps with factor k / W (LambdaLR; torch's LinearLR cannot
    start from 0), chained by SequentialLR: transformers'
    get_{cosine,linear,constant}_schedule_with_warmup.

Checked per run: every step's loss (rtol 1e-4) and the trained weights
(rtol 1e-3) equal torch's; the learning rate each step used (the metrics'
"lr") equals the scheduler's; with replicas, --check-replicas.  The plans
of dp, pipeline and hybrid must compute the clipping factor after every
gradient is final (its bucket awaited) and before any update, and with
stages sum the squares over the stages in one allreduce per rank between
the two.

The schedule alone, on one single-process program compiled with cosine
and 2 warmup steps: its "lr" per step against torch's scheduler when run
as compiled, with --lr-schedule linear / cosine / constant and
--warmup-steps at run time, with --lr, and with --epochs (whose total
steps the decay spans).  Bad program flags: one line naming the flag,
exit status 2.

usage: test_optim.py --cleave BIN --workdir DIR
Prints PASS/FAIL lines and "N passed, M failed"; SKIP (77) without torch;
the layouts under mpirun are skipped (and say so) without mpirun.
"""
import argparse
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import List, Optional

import harness

B, N, STEPS = 16, 96, 8
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6
W_RTOL, W_ATOL = 1e-3, 1e-5
LR_RTOL, LR_ATOL = 1e-6, 1e-12  # the program's float32 lr against torch's double
RUN_TIMEOUT = 120

LAYOUTS = {
    "single": ([], 1),
    "dp2": (["--ranks", "2", "--strategy", "dp"], 2),
    "pipeline2": (["--ranks", "2", "--strategy", "pipeline", "--microbatches", "2", "--schedule", "1f1b"], 2),
    "hybrid2x2": (["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "2", "--schedule", "1f1b"], 4),
}

np = torch = tm = None  # imported by main()
ARGS = None


@dataclass
class Case:
    name: str
    model: str                      # "mlp" or "ln"
    optimizer: str                  # sgd | momentum | adam | adamw
    lr: float
    layouts: List[str]
    weight_decay: Optional[float] = None  # None: the flag is not given (adamw: torch's default)
    no_decay: List[str] = field(default_factory=list)  # --no-decay patterns
    spared: List[str] = field(default_factory=list)    # the parameters they must match
    clip: Optional[float] = None
    schedule: Optional[str] = None
    warmup: int = 0
    momentum: float = 0.9
    cuts: List[str] = field(default_factory=list)  # --stages of the staged layouts

    def flags(self):
        f = ["--optimizer", self.optimizer, "--lr", repr(self.lr)]
        if self.optimizer == "momentum":
            f += ["--momentum", repr(self.momentum)]
        if self.weight_decay is not None:
            f += ["--weight-decay", repr(self.weight_decay)]
        if self.no_decay:
            f += ["--no-decay", ",".join(self.no_decay)]
        if self.clip is not None:
            f += ["--clip-grad-norm", repr(self.clip)]
        if self.schedule:
            f += ["--lr-schedule", self.schedule, "--warmup-steps", str(self.warmup)]
        return f

    def torch_optimizer(self, model):
        named = list(model.named_parameters())
        unknown = sorted(set(self.spared) - {n for n, _ in named})
        if unknown:
            raise ValueError("%s spares %s, which the model does not have" % (self.name, unknown))
        decayed = {"params": [p for n, p in named if n not in self.spared]}
        if self.weight_decay is not None:
            decayed["weight_decay"] = self.weight_decay
        groups = [decayed]
        if self.spared:
            groups.append({"params": [p for n, p in named if n in self.spared], "weight_decay": 0.0})
        if self.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=self.lr)
        if self.optimizer == "momentum":
            return torch.optim.SGD(groups, lr=self.lr, momentum=self.momentum)
        if self.optimizer == "adam":
            return torch.optim.Adam(groups, lr=self.lr)
        return torch.optim.AdamW(groups, lr=self.lr)


CASES = [
    # the transformer recipe: AdamW at its default decay, biases and the
    # norm spared, cosine with warmup, clipped
    Case("adamw", "ln", "adamw", 0.02, ["single", "dp2", "pipeline2", "hybrid2x2"],
         no_decay=["bias", "ln"], spared=["fc1.bias", "ln.weight", "ln.bias", "fc2.bias", "fc3.bias"],
         clip=0.8, schedule="cosine", warmup=2),
    # the SGD kernel with a momentum buffer and the clipping factor, and a
    # pattern with a star
    Case("momentum", "mlp", "momentum", 0.05, ["single", "pipeline2"], weight_decay=0.05,
         no_decay=["fc*.bias"], spared=["fc1.bias", "fc2.bias", "fc3.bias"], clip=0.3, schedule="linear", warmup=3),
    # plain SGD: the factor after an empty momentum slot
    Case("sgd", "mlp", "sgd", 0.1, ["single", "dp2"], weight_decay=0.01, clip=0.2),
    # Adam's weight decay added to the (clipped) gradient, spared for one
    # named parameter; a warmed-up constant schedule
    Case("adam", "ln", "adam", 0.01, ["single"], weight_decay=0.05, no_decay=["ln.weight"], spared=["ln.weight"],
         clip=0.85, schedule="constant", warmup=3),
    # a weight read on both stages: its gradient counts once in the norm,
    # though both stages update it
    Case("tied", "tied", "momentum", 0.05, ["single", "pipeline2", "hybrid2x2"], clip=0.2, cuts=["/MatMul"]),
]


def model_specs():
    """The models by name: the MLP of train_models and the LayerNorm net."""
    import pipeline_models
    nn, F = torch.nn, torch.nn.functional

    class LNNet(nn.Module):
        """[B,20] -> 32 -> LayerNorm -> ReLU -> 16 -> Tanh -> 5."""

        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(20, 32)
            self.ln = nn.LayerNorm(32)
            self.fc2 = nn.Linear(32, 16)
            self.fc3 = nn.Linear(16, 5)

        def forward(self, x):
            return self.fc3(torch.tanh(self.fc2(F.relu(self.ln(self.fc1(x))))))

    return {"mlp": tm.MODELS["mlp_gemm"],
            "ln": tm.TrainSpec("ln_net", LNNet, (20,), (5,), ("ce",), "Gemm MLP with a LayerNorm", opset=17),
            "tied": pipeline_models.MODELS["tied"]}


def torch_scheduler(opt, kind, warmup, total):
    """transformers' get_<kind>_schedule_with_warmup, from torch's own
    schedulers: the decay over the T - W steps after the warmup."""
    S = torch.optim.lr_scheduler
    if kind is None:
        return None
    if kind == "cosine":
        decay = S.CosineAnnealingLR(opt, T_max=total - warmup)
    elif kind == "linear":
        decay = S.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=total - warmup)
    else:
        decay = S.ConstantLR(opt, factor=1.0, total_iters=0)
    if warmup == 0:
        return decay
    warm = S.LambdaLR(opt, lambda k: k / warmup)
    return S.SequentialLR(opt, [warm, decay], milestones=[warmup])


def schedule_lrs(lr, kind, warmup, total):
    """The learning rate of each of `total` steps under torch's scheduler."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = torch_scheduler(opt, kind, warmup, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched:
            sched.step()
    return out


def train_torch(spec, case, data, steps):
    """Losses, learning rates, clipped norms and final weights of torch's run."""
    model = spec.build()
    opt = case.torch_optimizer(model)
    sched = torch_scheduler(opt, case.schedule, case.warmup, steps)
    x_all, y_all = torch.from_numpy(data[tm.INPUT]), torch.from_numpy(data[tm.LABELS])
    losses, lrs, norms = [], [], []
    for step in range(steps):
        idx = torch.tensor(tm.batch_rows(step, B, N), dtype=torch.long)
        opt.zero_grad(set_to_none=True)
        loss = tm.loss_fn(spec, "ce", model, x_all[idx], y_all[idx])
        losses.append(float(loss.item()))
        loss.backward()
        if case.clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), case.clip)))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched:
            sched.step()
    weights = {k: v.detach().clone().numpy() for k, v in model.state_dict().items()}
    return losses, lrs, norms, weights


def read_metrics(path):
    with open(path) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    return [l for l in lines if "step" in l]


def compare_list(got, want, rtol, atol):
    if len(got) != len(want):
        return False, "%d values, expected %d" % (len(got), len(want))
    return harness.compare(np.array(got, dtype=np.float64), np.array(want, dtype=np.float64), rtol, atol)


def compare_weights(got, want):
    if sorted(got) != sorted(want):
        return False, "initializers %s, expected %s" % (sorted(got), sorted(want))
    for k in sorted(want):
        ok, detail = harness.compare(got[k], want[k], W_RTOL, W_ATOL)
        if not ok:
            return False, "%s: %s" % (k, detail)
    return True, ""


def run_program(ranks, argv):
    """(ok, detail, seconds) of a program run alone or under mpirun."""
    try:
        if ranks == 1:
            p, secs = harness.run(argv, timeout=RUN_TIMEOUT)
        else:
            p, secs = harness.run_mpi(ranks, argv, timeout=RUN_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - a hang or a launch failure fails the check
        return False, "%s: %s" % (type(e).__name__, e), 0
    return p.returncode == 0, harness.failure(argv, p) if p.returncode else "", secs


def step_index(steps, pred):
    return [i for i, s in enumerate(steps) if pred(s)]


def check_plan(rep, tag, path, stages):
    """Where the plan clips: every rank computes the factor after each of
    its gradient buckets is awaited and its squares summed (over the
    stages, with stages), and before its first update."""
    with open(path) as f:
        plan = json.load(f)
    problems = []
    for rp in plan["rank_plans"]:
        st = rp["steps"]
        coef = step_index(st, lambda s: s.get("op") == "ClipCoef")
        squares = step_index(st, lambda s: s.get("op") == "GradNormSq")
        updates = step_index(st, lambda s: s.get("op") in ("SGD", "Adam"))
        waits = step_index(st, lambda s: s["kind"] in ("allreduce_wait", "allreduce_start"))
        summed = step_index(st, lambda s: s["kind"] == "allreduce" and s["value"] == "cleave.grad_sq_sum")
        r = rp["rank"]
        if len(coef) != 1 or not updates or not squares:
            problems.append("rank %d: %d ClipCoef, %d GradNormSq, %d updates" % (r, len(coef), len(squares),
                                                                                  len(updates)))
            continue
        if max(squares + waits) > coef[0] or coef[0] > min(updates):
            problems.append("rank %d: ClipCoef at step %d, squares up to %d, bucket waits up to %d, first update %d"
                            % (r, coef[0], max(squares), max(waits or [-1]), min(updates)))
        if stages > 1:
            group = plan["groups"][st[summed[0]]["group"]] if len(summed) == 1 else []
            if len(summed) != 1 or not max(squares) < summed[0] < coef[0] or len(group) != stages or r not in group:
                problems.append("rank %d: sum over the stages at %s (group %s), squares up to %d, ClipCoef at %d"
                                % (r, summed, group, max(squares), coef[0]))
        elif summed:
            problems.append("rank %d: a sum over the stages without stages" % r)
    rep.check("%s: the plan clips after every gradient and before every update%s" % (
        tag, ", summing the squares over the stages" if stages > 1 else ""), not problems, "; ".join(problems))


class Model:
    """A model's folder, exported file and data."""

    def __init__(self, work, name, spec):
        self.spec = spec
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.path = tm.export_onnx(spec, spec.build(), os.path.join(self.dir, "model.onnx"), B)
        self.data = tm.make_data(spec, "ce", N)
        self.files = []
        for k, v in self.data.items():
            p = os.path.join(self.dir, k + ".npy")
            np.save(p, v)
            self.files += ["--data", "%s=%s" % (k, p)]

    def compile(self, out, flags):
        cmd = [ARGS.cleave, "compile", self.path, "-o", out, "--batch", str(B), "--loss", "ce"] + flags
        p, _ = harness.run(cmd)
        return p.returncode == 0, harness.failure(cmd, p) if p.returncode else ""


def run_case(rep, models, case, have_mpi):
    m = models[case.model]
    losses, lrs, norms, weights = train_torch(m.spec, case, m.data, STEPS)
    if case.clip is not None:
        clipped = sum(n > case.clip for n in norms)
        scale_free = case.optimizer in ("adam", "adamw")
        rep.check("%s: torch clips %s steps (norms %s, C %g)" % (
            case.name, "some, not all," if scale_free else "all", ["%.3g" % n for n in norms], case.clip),
            0 < clipped < len(norms) if scale_free else clipped == len(norms))
    for layout in case.layouts:
        flags, ranks = LAYOUTS[layout]
        if case.cuts and layout in ("pipeline2", "hybrid2x2"):
            flags = flags + ["--stages", ",".join(case.cuts)]
        tag = "%s %s" % (case.name, layout)
        if ranks > 1 and not have_mpi:
            rep.skip(tag, "mpirun not available")
            continue
        prog = os.path.join(m.dir, "%s_%s" % (case.name, layout))
        plan = prog + ".plan.json"
        ok, detail = m.compile(prog, case.flags() + flags + ["--emit-plan", plan])
        if not rep.check("%s: compile %s" % (tag, " ".join(case.flags() + flags)), ok, detail):
            continue
        if ranks > 1 and case.clip is not None:
            check_plan(rep, tag, plan, 2 if layout != "dp2" else 1)
        argv = [prog] + m.files + ["--steps", str(STEPS), "--metrics", prog + ".jsonl", "--save", prog + ".onnx"]
        if layout != "single":
            argv.append("--check-replicas")
        ok, detail, secs = run_program(ranks, argv)
        if not rep.check("%s: runs (%.1fs)" % (tag, secs), ok, detail):
            continue
        steps = read_metrics(prog + ".jsonl")
        ok, detail = compare_list([s["loss"] for s in steps], losses, LOSS_RTOL, LOSS_ATOL)
        rep.check("%s: %d losses equal torch's (rtol %g)" % (tag, STEPS, LOSS_RTOL), ok, detail)
        ok, detail = compare_list([s["lr"] for s in steps], lrs, LR_RTOL, LR_ATOL)
        rep.check("%s: each step's learning rate equals torch's scheduler's" % tag, ok, detail)
        ok, detail = compare_weights(harness.read_weights(prog + ".onnx"), weights)
        rep.check("%s: trained weights equal torch's (rtol %g)" % (tag, W_RTOL), ok, detail)


def run_schedules(rep, models):
    """One program compiled with a cosine schedule and 2 warmup steps, run
    with the schedule flags of programs; its "lr" against torch's."""
    m = models["mlp"]
    prog = os.path.join(m.dir, "schedule")
    base = 0.05
    ok, detail = m.compile(prog, ["--optimizer", "adam", "--lr", repr(base), "--lr-schedule", "cosine",
                                  "--warmup-steps", "2"])
    if not rep.check("schedule: compile with --lr-schedule cosine --warmup-steps 2", ok, detail):
        return
    per_epoch = -(-N // B)
    runs = [
        ("as compiled", [], base, "cosine", 2, STEPS),
        ("--lr-schedule linear --warmup-steps 0", ["--lr-schedule", "linear", "--warmup-steps", "0"], base,
         "linear", 0, STEPS),
        ("--lr-schedule cosine --warmup-steps 0", ["--lr-schedule", "cosine", "--warmup-steps", "0"], base,
         "cosine", 0, STEPS),
        ("--lr-schedule constant --warmup-steps 3", ["--lr-schedule", "constant", "--warmup-steps", "3"], base,
         "constant", 3, STEPS),
        ("--warmup-steps 4 (the compiled cosine)", ["--warmup-steps", "4"], base, "cosine", 4, STEPS),
        ("--lr 0.2", ["--lr", "0.2"], 0.2, "cosine", 2, STEPS),
    ]
    for label, extra, lr, kind, warmup, total in runs + [("--epochs 2", None, base, "cosine", 2, 2 * per_epoch)]:
        length = ["--epochs", "2"] if extra is None else ["--steps", str(total)]
        metrics = "%s.%d.jsonl" % (prog, len(extra or []) + 10 * warmup + total)
        argv = [prog] + m.files + length + (extra or []) + ["--metrics", metrics]
        ok, detail, _ = run_program(1, argv)
        if not rep.check("schedule %s: runs" % label, ok, detail):
            continue
        got = [s["lr"] for s in read_metrics(metrics)]
        ok, detail = compare_list(got, schedule_lrs(lr, kind, warmup, total), LR_RTOL, LR_ATOL)
        rep.check("schedule %s: %d learning rates equal torch's %s scheduler with %d warmup steps" % (
            label, total, kind, warmup), ok, detail)
    bad = [
        (["--lr-schedule", "step"], "--lr-schedule must be constant, linear or cosine, got 'step'"),
        (["--warmup-steps", "-1"], "--warmup-steps needs an integer of at least 0, got '-1'"),
        (["--lr-schedule", "linear", "--lr-schedule", "cosine"], "--lr-schedule given twice"),
    ]
    plain = os.path.join(m.dir, "plain")
    ok, detail = m.compile(plain, ["--optimizer", "adam", "--lr", repr(base)])
    if rep.check("schedule: compile without a schedule", ok, detail):
        bad.append((["--warmup-steps", "2"], "--warmup-steps needs --lr-schedule", plain))
    for entry in bad:
        flags, want = entry[0], entry[1]
        target = entry[2] if len(entry) > 2 else prog
        argv = [target] + m.files + ["--steps", "2"] + flags
        p, _ = harness.run(argv)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        rep.check("program %s: exit 2 and one line naming the flag" % " ".join(flags),
                  p.returncode == 2 and len(lines) == 1 and want in lines[0],
                  "exit %d: %s" % (p.returncode, p.stderr.strip()))


def main():
    global np, torch, tm, ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir")
    ARGS = ap.parse_args()
    why = harness.missing(modules=("torch", "onnx", "numpy"))
    if why:
        return harness.skip(why)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy
    import torch as torch_
    import train_models
    np, torch, tm = numpy, torch_, train_models
    # SequentialLR steps its schedulers with an epoch at the milestones, which
    # torch 1.13 warns about every time
    warnings.filterwarnings("ignore", message="The epoch parameter", category=UserWarning)
    rep = harness.Report()
    if not rep.executable(ARGS.cleave):
        return rep.summary()
    have_mpi = harness.missing(programs=("mpirun",)) is None
    with harness.workdir(ARGS.workdir, "cleave_optim_") as work:
        specs = model_specs()
        models = {name: Model(work, name, spec) for name, spec in specs.items()}
        for case in CASES:
            run_case(rep, models, case, have_mpi)
        run_schedules(rep, models)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
