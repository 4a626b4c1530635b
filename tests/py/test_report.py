#!/usr/bin/env python3
"""cleave report: a plan's prediction set against the trace of its program.

For the sample MLP (data parallel, and a 2-stage GPipe pipeline of 4
micro-batches) and the sample CNN (a 2-stage 1F1B pipeline), each on 2
ranks: compiles the program, writes the matching `cleave plan --format
json`, runs the program under mpirun with --trace, and runs `cleave report`
in text, JSON and SVG.  Every measured figure the report gives is
recomputed here from the trace (medians over the steps after the first,
per rank and per step across ranks, per micro-batch unit, per link from
the receiver's receive waits), every predicted figure is read back from
the plan file, the arena each rank allocated (recorded in the trace) must
equal its planned arena, and the SVG must be XML with a predicted and a
measured row per rank.  The plan's new prediction fields are checked
against each other (timeline against per-rank busy time) and against the
schema.  Then the errors: missing files, a plan without a prediction, a
trace of another rank count or layout, bad flags: each one line on stderr,
nothing on stdout, a non-zero status.

usage: test_report.py --cleave BIN --workdir DIR
Ends with "N passed, M failed"; SKIP (exit 77) without mpirun or numpy.
"""
import json
import os
import shutil
import statistics
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, ROWS, STEPS, SKIP = 32, 128, 6, 1
REL = 1e-9  # the report prints medians of microsecond figures in seconds

CASES = [
    ("mlp_dp", "mlp.onnx", ["--strategy", "dp"]),
    ("mlp_pipeline", "mlp.onnx", ["--strategy", "pipeline", "--microbatches", "4"]),
    ("cnn_1f1b", "cnn.onnx", ["--strategy", "pipeline", "--microbatches", "4", "--schedule", "1f1b"]),
]

BUSY = {"forward", "backward", "update", "compute"}


def near(a, b):
    return abs(a - b) <= REL * max(abs(a), abs(b), 1e-12)


def cleave(args, *argv, timeout=600):
    p, _ = harness.run([args.cleave] + list(argv), timeout=timeout)
    return p


# ---- what the trace says, recomputed --------------------------------------

def trace_steps(trace):
    """rank -> list of (step event, [events inside it]) in time order, the
    first SKIP steps left out on ranks that have more."""
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for rank in sorted({e["tid"] for e in xs}):
        mine = sorted((e for e in xs if e["tid"] == rank), key=lambda e: e["ts"])
        steps = [e for e in mine if e["cat"] == "step"]
        held = []
        for s in steps:
            inside = [e for e in mine if e["cat"] != "step" and s["ts"] <= e["ts"] + e["dur"] / 2 <= s["ts"] + s["dur"]]
            held.append((s, inside))
        out[rank] = held[SKIP:] if len(held) > SKIP else held
    return out


def median_of(steps, fn):
    return statistics.median(fn(s, inside) for s, inside in steps) / 1e6


def measured(trace):
    """What the report should measure, in seconds."""
    steps = trace_steps(trace)
    ranks = {}
    for rank, held in steps.items():
        units = {}
        for _, inside in held:
            for e in inside:
                if e["cat"] in ("forward", "backward", "update"):
                    units.setdefault(e["name"], None)
        ranks[rank] = {
            "step": median_of(held, lambda s, i: s["dur"]),
            "busy": median_of(held, lambda s, i: sum(e["dur"] for e in i if e["cat"] in BUSY)),
            "wait": median_of(held, lambda s, i: sum(e["dur"] for e in i if e["cat"] in ("wait", "allreduce"))),
            "units": {u: median_of(held, lambda s, i, u=u: sum(e["dur"] for e in i if e["name"] == u)) for u in units},
            # two ranks: every receive of a rank is from the other one
            "recv": median_of(held, lambda s, i: sum(e["dur"] for e in i if e["name"] == "recv")),
        }
    slowest = {}
    for held in steps.values():
        for s, _ in held:
            key = s["args"]["step"]
            slowest[key] = max(slowest.get(key, 0), s["dur"])
    return ranks, statistics.median(slowest.values()) / 1e6, len(slowest)


# ---- one case ---------------------------------------------------------------

def build_case(rep, args, work, name, model, flags):
    """Compiles, plans and runs one case; returns (plan path, trace path) or None."""
    model = os.path.join(ROOT, "samples", model)
    prog = os.path.join(work, name)
    common = ["--batch", str(BATCH), "--ranks", "2"] + flags
    p = cleave(args, "compile", model, "-o", prog, *common)
    if not rep.check("%s: compiles" % name, p.returncode == 0, harness.failure(["cleave compile"], p)):
        return None
    plan = os.path.join(work, name + ".plan.json")
    p = cleave(args, "plan", model, *common, "--format", "json")
    if not rep.check("%s: cleave plan --format json" % name, p.returncode == 0, harness.failure(["cleave plan"], p)):
        return None
    with open(plan, "w") as f:
        f.write(p.stdout)
    trace = os.path.join(work, name + ".trace.json")
    argv = harness.mpirun(2, [prog, "--data", "input=" + os.path.join(work, "x.npy"), "--data",
                              "labels=" + os.path.join(work, "y.npy"), "--steps", str(STEPS), "--trace", trace,
                              "--log-every", "0"])
    env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none")
    r, _ = harness.run(argv, env=env, timeout=120)
    if not rep.check("%s: runs under mpirun with --trace" % name, r.returncode == 0 and os.path.exists(trace),
                     harness.failure(argv, r)):
        return None
    return plan, trace


def check_plan_fields(rep, name, plan):
    """The prediction's new fields agree with each other and the schema."""
    pred = plan["prediction"]
    try:
        import jsonschema
        with open(os.path.join(ROOT, "schemas", "plan.schema.json")) as f:
            schema = json.load(f)
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(plan))
        rep.check("%s: plan validates against the schema" % name, not errors, "; ".join(e.message for e in errors[:3]))
    except ImportError:
        rep.skip("%s: plan validates against the schema" % name, "python3-jsonschema missing")
    rep.equal("%s: prediction.step_s is the chosen candidate's" % name, pred["step_s"], pred["chosen"]["step_s"])
    for k, r in enumerate(pred["ranks"]):
        busy = sum(e["t1"] - e["t0"] for e in pred["timeline"] if e["rank"] == k and e["kind"] != "W")
        wait = sum(e["t1"] - e["t0"] for e in pred["timeline"] if e["rank"] == k and e["kind"] == "W")
        rep.check("%s: rank %d's timeline computes for its busy_s" % (name, k), near(busy, r["busy_s"]),
                  "%r vs %r" % (busy, r["busy_s"]))
        rep.check("%s: rank %d's timeline waits for step_s - busy_s" % (name, k),
                  abs(wait - (pred["step_s"] - r["busy_s"])) < 1e-12, "%r" % wait)
        rep.equal("%s: rank %d's predicted busy is the chosen candidate's" % (name, k), r["busy_s"],
                  pred["chosen"]["ranks"][k]["busy_s"])
        rep.equal("%s: rank %d's predicted arena is its plan's" % (name, k), r["arena_bytes"],
                  plan["rank_plans"][k]["arena_bytes"])
    sends = {(r["rank"], s["peer"]) for r in plan["rank_plans"] for s in r["steps"] if s["kind"] == "send"}
    rep.equal("%s: prediction.links are the plan's send pairs" % name,
              sorted((l["from"], l["to"]) for l in pred["links"]), sorted(sends))


def check_json(rep, name, plan, trace, doc):
    pred = plan["prediction"]
    ranks, step, n_steps = measured(trace)
    rep.equal("%s: report has ranks 0 and 1" % name, [r["rank"] for r in doc["ranks"]], [0, 1])
    rep.equal("%s: steps used" % name, doc["steps_used"], n_steps)
    rep.check("%s: measured step == median over steps of the slowest rank" % name,
              near(doc["step"]["measured_s"], step), "%r vs %r" % (doc["step"]["measured_s"], step))
    rep.equal("%s: predicted step == the plan's" % name, doc["step"]["predicted_s"], pred["step_s"])
    memory = {m["rank"]: m for m in trace["otherData"]["rank_memory"]}
    for r in doc["ranks"]:
        k, want = r["rank"], ranks[r["rank"]]
        for field in ("step", "busy", "wait"):
            rep.check("%s: rank %d's measured %s == the trace's median" % (name, k, field),
                      near(r[field]["measured_s"], want[field]), "%r vs %r" % (r[field]["measured_s"], want[field]))
        rep.equal("%s: rank %d's predicted busy == the plan's" % (name, k), r["busy"]["predicted_s"],
                  pred["ranks"][k]["busy_s"])
        rep.check("%s: rank %d's predicted wait == step - busy" % (name, k),
                  near(r["wait"]["predicted_s"], pred["step_s"] - pred["ranks"][k]["busy_s"]), str(r["wait"]))
        arena = r["arena"]
        rep.equal("%s: rank %d's predicted arena == the plan's" % (name, k), arena["predicted_bytes"],
                  plan["rank_plans"][k]["arena_bytes"])
        rep.equal("%s: rank %d's measured arena == the trace's" % (name, k), arena["measured_bytes"],
                  memory[k]["arena_bytes"])
        rep.check("%s: rank %d's arena measured <= predicted" % (name, k),
                  arena["measured_bytes"] <= arena["predicted_bytes"] and arena["within_prediction"] is True, str(arena))
        rep.check("%s: rank %d's peak RSS is recorded and above its arena" % (name, k),
                  r["peak_rss_bytes"] == memory[k]["peak_rss_bytes"] and r["peak_rss_bytes"] > arena["measured_bytes"],
                  str(r["peak_rss_bytes"]))
        units = {u["unit"]: u for u in r["units"]}
        rep.equal("%s: rank %d's units are the trace's" % (name, k), sorted(u for u in units if units[u]["measured_s"]),
                  sorted(want["units"]))
        for u, m in want["units"].items():
            rep.check("%s: rank %d's unit %s measured == the trace's median" % (name, k, u),
                      near(units[u]["measured_s"], m), "%r vs %r" % (units[u]["measured_s"], m))
            pu = sum(e["t1"] - e["t0"] for e in pred["timeline"] if e["rank"] == k and
                     ("update" if e["kind"] == "U" else "%s %d" % (e["kind"], e["micro"])) == u)
            rep.check("%s: rank %d's unit %s predicted == the plan timeline's" % (name, k, u),
                      near(units[u]["predicted_s"], pu), "%r vs %r" % (units[u]["predicted_s"], pu))
    stages = {s["stage"]: s["ranks"] for s in doc["stages"]}
    rep.equal("%s: stages group the ranks as the plan does" % name, stages,
              {0: [0, 1]} if plan["strategy"] == "dp" else {0: [0], 1: [1]})
    links = {(l["from"], l["to"]): l for l in doc["links"]}
    rep.equal("%s: links are the plan's" % name, sorted(links), sorted((l["from"], l["to"]) for l in pred["links"]))
    for l in pred["links"]:
        got = links[(l["from"], l["to"])]
        rep.equal("%s: link %d->%d predicted wait == the plan's" % (name, l["from"], l["to"]),
                  got["recv_wait"]["predicted_s"], l["recv_wait_s"])
        rep.equal("%s: link %d->%d matched every step" % (name, l["from"], l["to"]), got["steps_matched"], n_steps)
        want = ranks[l["to"]]["recv"]
        rep.check("%s: link %d->%d measured == the receiver's median recv wait" % (name, l["from"], l["to"]),
                  near(got["recv_wait"]["measured_s"], want), "%r vs %r" % (got["recv_wait"]["measured_s"], want))


def check_text(rep, name, out):
    rows = [l.split() for l in out.splitlines() if len(l.split()) == 12 and l.split()[0].isdigit()]
    rep.equal("%s: text has a row per rank" % name, [r[0] for r in rows], ["0", "1"])
    rep.equal("%s: text says each rank is within its predicted arena" % name,
              out.count("within the prediction"), 2)
    rep.check("%s: text says RSS is context, not a prediction" % name, "peak RSS is the whole process" in out, out[-600:])
    rep.check("%s: text gives the step error" % name, out.splitlines()[4].startswith("step: predicted"), out[:400])


def check_svg(rep, name, path):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        rep.check("%s: SVG parses as XML" % name, False, str(e))
        return
    ns = {"s": "http://www.w3.org/2000/svg"}
    rows = [(g.get("data-rank"), g.get("data-source"), len(g.findall("s:rect", ns)))
            for g in root.findall("s:g", ns) if g.get("class") == "row"]
    rep.equal("%s: SVG has a predicted and a measured row per rank" % name, [r[:2] for r in rows],
              [("0", "predicted"), ("0", "measured"), ("1", "predicted"), ("1", "measured")])
    rep.check("%s: every SVG row draws its timeline" % name, all(r[2] > 0 for r in rows), str(rows))


def check_case(rep, args, work, name, plan_path, trace_path):
    with open(plan_path) as f:
        plan = json.load(f)
    with open(trace_path) as f:
        trace = json.load(f)
    check_plan_fields(rep, name, plan)
    p = cleave(args, "trace-stats", trace_path)
    rep.check("%s: trace-stats still reads the trace" % name, p.returncode == 0, p.stderr)
    p = cleave(args, "report", "--plan", plan_path, "--trace", trace_path, "--format", "json")
    if rep.check("%s: report --format json" % name, p.returncode == 0 and not p.stderr, p.stderr):
        rep.guarded("%s: report JSON" % name, lambda: check_json(rep, name, plan, trace, json.loads(p.stdout)))
    p = cleave(args, "report", "--plan", plan_path, "--trace", trace_path)
    if rep.check("%s: report (text)" % name, p.returncode == 0 and not p.stderr, p.stderr):
        rep.guarded("%s: report text" % name, lambda: check_text(rep, name, p.stdout))
    svg = os.path.join(work, name + ".svg")
    p = cleave(args, "report", "--plan", plan_path, "--trace", trace_path, "--format", "svg", "-o", svg)
    if rep.check("%s: report --format svg -o" % name, p.returncode == 0 and not p.stderr and not p.stdout, p.stderr):
        check_svg(rep, name, svg)


# ---- errors ---------------------------------------------------------------------

def one_line_error(rep, args, label, argv, status=None):
    p = cleave(args, "report", *argv)
    lines = p.stderr.strip().splitlines()
    ok = p.returncode != 0 and len(lines) == 1 and not p.stdout and (status is None or p.returncode == status)
    rep.check("error: %s (one line, exit %d)" % (label, p.returncode), ok,
              "status %d, stderr %r, stdout %r" % (p.returncode, p.stderr, p.stdout[:200]))
    return lines[0] if lines else ""


def check_errors(rep, args, work, built):
    dp_plan, dp_trace = built["mlp_dp"]
    pp_plan, pp_trace = built.get("mlp_pipeline", (None, None))
    missing = os.path.join(work, "missing.json")
    msg = one_line_error(rep, args, "missing plan", ["--plan", missing, "--trace", dp_trace], 1)
    rep.check("the missing plan's error names it", "missing.json" in msg, msg)
    msg = one_line_error(rep, args, "missing trace", ["--plan", dp_plan, "--trace", missing], 1)
    rep.check("the missing trace's error names it", "missing.json" in msg, msg)
    # a plan as `cleave compile --emit-plan` writes it has no prediction
    emitted = os.path.join(work, "emitted.json")
    p = cleave(args, "compile", os.path.join(ROOT, "samples", "mlp.onnx"), "-o", os.path.join(work, "e.ll"),
               "--emit", "llvm", "--batch", str(BATCH), "--ranks", "2", "--strategy", "dp", "--emit-plan", emitted)
    if rep.check("compile --emit-plan", p.returncode == 0, p.stderr):
        msg = one_line_error(rep, args, "plan without prediction", ["--plan", emitted, "--trace", dp_trace], 1)
        rep.check("it says to produce the plan with cleave plan --format json",
                  "emitted.json" in msg and "cleave plan" in msg and "--format json" in msg, msg)
    # the same trace with rank 1 taken out
    with open(dp_trace) as f:
        trace = json.load(f)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("tid") != 1]
    trace["otherData"]["ranks"] = 1
    one_rank = os.path.join(work, "one_rank.json")
    with open(one_rank, "w") as f:
        json.dump(trace, f)
    msg = one_line_error(rep, args, "ranks mismatch", ["--plan", dp_plan, "--trace", one_rank], 1)
    rep.check("the ranks mismatch names both files and both counts",
              "mlp_dp.plan.json" in msg and "one_rank.json" in msg and "2 ranks" in msg and "has 1" in msg, msg)
    if pp_trace:
        msg = one_line_error(rep, args, "layout mismatch", ["--plan", dp_plan, "--trace", pp_trace], 1)
        rep.check("the layout mismatch names both files",
                  "mlp_dp.plan.json" in msg and "mlp_pipeline.trace.json" in msg, msg)
    one_line_error(rep, args, "a trace given as the plan", ["--plan", dp_trace, "--trace", dp_trace], 1)
    one_line_error(rep, args, "unknown flag", ["--plan", dp_plan, "--trace", dp_trace, "--bogus"], 2)
    one_line_error(rep, args, "unknown format", ["--plan", dp_plan, "--trace", dp_trace, "--format", "xml"], 2)
    one_line_error(rep, args, "no --trace", ["--plan", dp_plan], 2)
    one_line_error(rep, args, "bad --skip", ["--plan", dp_plan, "--trace", dp_trace, "--skip", "-1"], 2)
    one_line_error(rep, args, "unwritable -o",
                   ["--plan", dp_plan, "--trace", dp_trace, "-o", os.path.join(work, "no", "such", "dir.svg")], 1)


def main():
    args, rep = harness.begin(modules=("numpy",), programs=("mpirun",), workdir_required=True)
    if args is None:
        return rep
    import numpy as np
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = np.random.default_rng(3)
    np.save(os.path.join(work, "x.npy"), rng.random((ROWS, 1, 28, 28), dtype=np.float32))
    np.save(os.path.join(work, "y.npy"), rng.integers(0, 10, ROWS).astype(np.int64))
    built = {}
    for name, model, flags in CASES:
        paths = build_case(rep, args, work, name, model, flags)
        if paths:
            built[name] = paths
            check_case(rep, args, work, name, *paths)
    if "mlp_dp" in built:
        check_errors(rep, args, work, built)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
