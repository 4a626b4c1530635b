#!/usr/bin/python3
"""Pipeline parallelism: the measured bubble against (P-1)/(M+P-1), and memory.

The bubble of GPipe and 1F1B schedules against GPipe's formula, and the
activation memory the two schedules plan.

Model: a deep MLP built by bench_train.build_model (768 inputs, 8 hidden
layers of 512, a 10-way head) whose two FLOP-balanced stages do equal
training work (see IN_DIM), exported once to ONNX.  Every program runs
micro-batches of MICRO_ROWS rows, so the global batch is M * MICRO_ROWS and
each micro-batch is the same work whatever M is.

Bubble.  For M = 1..8 the script compiles a 2-stage program with
--strategy pipeline --schedule gpipe and with --schedule 1f1b, plus a
--strategy layer program (one micro-batch), and then does --runs rounds
that run each of them once under `mpirun --oversubscribe -np 2` with
--trace.  `cleave trace-stats --format json` sums each run's trace, and the
script reads the trace itself for the same sums step by step.  The
bubble of a step is

    1 - (busy time of all ranks in the step) / (ranks * slowest rank's step)

that is, every rank's idle time against the pipeline's whole step, which
is what (P-1)/(M+P-1) describes.  Per run the script reports

  step median   the median of that over the steps after the first: the
                headline, as it is least moved by other jobs, which
                lengthen some steps and not others;
  trace-stats   1 - sum(busy_s) / (ranks * steps_used * mean_step_s) from
                trace-stats' totals (the same quantity over all steps), and
                trace-stats' own "bubble", idle / wall summed over the
                ranks, in which each rank's wall ends with its own last unit
                of work (the last stage's step ends before stage 0's last
                backward, so that bubble comes out lower).

Two ranks take both cores of the development machine, so any other job
stretches a rank's compute while the other rank waits, which shows up as
bubble.  Before each run the script therefore waits, briefly, for other
jobs to go quiet (--wait-quiet), and records how busy they were.

The tables give medians over the runs; a configuration misses the target
when its median step-median bubble is further than TARGET from the theory.

Memory.  For P = 2 (the programs above) and P = 4 (compiled only) and
M = 1, 2, 4, 8 the script reads each rank's planned peak of live
activations, arena, persistent bytes and sent bytes from --emit-plan,
and for P = 2 checks the peaks against the "plan" line the programs write
to --metrics.  Stage 0's peak is reported in units of its M = 1 value (one
micro-batch): GPipe's grows with M, 1F1B's stops growing at M = P.

Baseline.  With --baseline OLD every bubble program is also compiled by the
compiler OLD, and each round runs every program of --cleave right before
the same program of OLD (new, old, new, old, ...), so that load on the
machine that comes and goes falls on both builds alike.  A further table
gives, per program, each build's median step time (the step median above)
with its range over the runs, the ratio new/old of the medians, and the
range of the ratios of the two runs of a round; the baseline's programs
must train to the same losses.  The bubble and memory tables stay those of
--cleave, and the P = 4 plans, which are never run, are not compiled by OLD.

    /usr/bin/python3 bench/bench_pipeline.py [--cleave PATH] [--baseline OLD]
        [--runs 3] [--steps 20] [--wait-quiet 50] [--out results.json]

Needs Debian's /usr/bin/python3 (torch 1.13 for the export, numpy), Open
MPI's mpirun and a built cleave (by default build-dev/cleave next to this
folder).  Progress goes to stderr, the report to stdout; the exit status is
1 when a bubble misses its target, the schedules' losses differ or the
baseline's differ from cleave's.
"""

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_train as bt  # noqa: E402  (model builder, constants, machine info)
import bench_dp as bdp    # noqa: E402  (mpirun environment, load averages, tables)

# 768 inputs, not 512: the first layer computes no input gradient, so with
# 512 inputs the best cut (after the fourth of the nine layers) leaves stage
# 0 with 11 of the 12 matrix products per micro-batch that stage 1 does
# (189 against 207 training MFLOP).  With 768 the first layer's forward and
# weight gradient cost what a 512-wide layer's three products cost, and the
# two stages do equal training FLOPs (206 and 207 MFLOP per micro-batch;
# stage 1 adds the 10-way head and the loss).
IN_DIM = 768
HIDDEN = [512] * 8
MODEL_NAME = "mlp_768_8x512_10"
MICRO_ROWS = 32                  # rows of every micro-batch
PIPE_RANKS = 2                   # P of the bubble runs
BUBBLE_MS = list(range(1, 9))    # micro-batches of the bubble runs
MEMORY_MS = [1, 2, 4, 8]
MEMORY_PS = [2, 4]
SCHEDULES = ["gpipe", "1f1b"]
TARGET = 0.10                    # largest |measured - theory| accepted
RUN_TIMEOUT = 300                # seconds for one mpirun
COMPILE_TRIES = 3                # a compiler being rebuilt meanwhile gets
RETRY_WAIT = 60                  # ... this many seconds before the next try
SKIP = 1                         # warm-up steps left out (trace-stats' default --skip)
QUIET_CORES = 0.3                # "quiet": other processes use less CPU than this
QUIET_SAMPLE = 0.5               # seconds over which that is measured
QUIET_WAIT_RUN = 15              # longest wait for quiet before one run, seconds


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def theory(m, p=PIPE_RANKS):
    """GPipe's bubble (also PipeDream-Flush's, i.e. 1F1B's): the share of
    each stage's time spent idle when all stages take equal time."""
    return (p - 1) / (m + p - 1)


# ------------------------------------------------------------------ commands


def compile_cmd(cleave, onnx_path, prog, m, ranks, strategy, schedule, plan):
    cmd = bt.compile_cmd(cleave, onnx_path, prog, m * MICRO_ROWS)
    cmd += ["--ranks", str(ranks), "--strategy", strategy]
    if strategy == "pipeline":
        cmd += ["--microbatches", str(m), "--schedule", schedule]
    if plan:
        cmd += ["--emit-plan", plan]
    return cmd


def run_cmd(prog, steps, trace, metrics):
    cmd = bt.program_cmd(prog, "x.npy", "y.npy", steps, metrics) + ["--trace", trace]
    return ["mpirun", "--oversubscribe", "-np", str(PIPE_RANKS)] + cmd


def config_name(strategy, schedule, m):
    return "layer" if strategy == "layer" else "%s_m%d" % (schedule, m)


# ------------------------------------------------------------------ the model


def export_model(folder, steps):
    """The ONNX file (exported at one micro-batch; --batch rebinds it) and
    the data: enough rows for `steps` steps of the largest batch."""
    torch, np = bt.torch, bt.np
    onnx_path = os.path.join(folder, "deep.onnx")
    torch.manual_seed(bt.WEIGHT_SEED)
    model = bt.build_model(IN_DIM, HIDDEN)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(MICRO_ROWS, IN_DIM),), onnx_path,
                          export_params=True, opset_version=bt.OPSET,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False,
                          input_names=["input"], output_names=["logits"])
    rows = steps * MICRO_ROWS * max(BUBBLE_MS)
    rng = np.random.default_rng(bt.DATA_SEED)
    np.save(os.path.join(folder, "x.npy"), rng.standard_normal((rows, IN_DIM), dtype=np.float32))
    np.save(os.path.join(folder, "y.npy"), rng.integers(0, bt.N_CLASSES, size=rows, dtype=np.int64))
    return onnx_path, sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------ compiling


def run_cleave(cmd, what):
    """Runs the compiler; on a failure, waits and tries again (up to
    COMPILE_TRIES times in all), as the compiler may be in the middle of
    being rebuilt.  Returns the finished process."""
    for attempt in range(1, COMPILE_TRIES + 1):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=bt.TIMEOUT)
            if p.returncode == 0:
                return p
            failure = "exit %d: %s" % (p.returncode, p.stderr.strip())
        except OSError as e:   # the compiler is missing or being replaced
            failure = str(e)
        if attempt == COMPILE_TRIES:
            sys.exit("%s failed (%s): %s" % (what, failure, shlex.join(cmd)))
        log("%s failed (%s); trying again in %d s, in case cleave is being rebuilt"
            % (what, failure, RETRY_WAIT))
        time.sleep(RETRY_WAIT)


def compile_program(args, folder, onnx_path, m, ranks, strategy, schedule, emit="exe",
                    baseline=False):
    """Compiles one configuration with --cleave, or with --baseline into
    files of its own."""
    cleave, shown = args.cleave, args.cleave_shown
    if baseline:
        cleave, shown = args.baseline, args.baseline_shown
    name = config_name(strategy, schedule, m) + ("_p%d" % ranks if ranks != PIPE_RANKS else "")
    stem = name + (bdp.BASE if baseline else "")
    prog = os.path.join(folder, "prog_" + stem + (".o" if emit == "obj" else ""))
    plan_path = os.path.join(folder, "plan_" + stem + ".json")
    cmd = compile_cmd(cleave, onnx_path, prog, m, ranks, strategy, schedule, plan_path)
    if emit == "obj":
        cmd += ["--emit", "obj"]
    t0 = time.perf_counter()
    run_cleave(cmd, "cleave compile (%s)" % name)
    compile_s = time.perf_counter() - t0
    with open(plan_path) as f:
        plan = json.load(f)
    ranks_info = [{k: rp.get(k) for k in ("rank", "stage", "replica", "max_inflight", "arena_bytes",
                                          "persistent_bytes", "peak_activation_bytes",
                                          "send_pinned_bytes")}
                  for rp in plan["rank_plans"]]
    return {
        "name": name, "prog": prog, "strategy": strategy, "schedule": schedule,
        "microbatches": m, "ranks": ranks, "batch": m * MICRO_ROWS, "compile_s": compile_s,
        "stage_table": plan.get("stage_table"), "rank_plans": ranks_info,
        "compile_cmd": shlex.join(compile_cmd(shown, "deep.onnx", os.path.basename(prog),
                                              m, ranks, strategy, schedule, None)
                                  + (["--emit", "obj"] if emit == "obj" else [])),
    }


# -------------------------------------------------------------------- running


def cores_busy(seconds=QUIET_SAMPLE):
    """How many cores' worth of CPU time the machine used over `seconds`
    (from /proc/stat; this script sleeps meanwhile, so it is other jobs')."""
    def snap():
        with open("/proc/stat") as f:   # user nice system idle iowait irq softirq steal
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]
    try:
        t0, i0 = snap()
        time.sleep(seconds)
        t1, i1 = snap()
    except (OSError, ValueError, IndexError):
        return None
    total = t1 - t0
    return (total - (i1 - i0)) / total * (os.cpu_count() or 1) if total > 0 else 0.0


class Quiet:
    """Before each run, waits until other jobs use less than QUIET_CORES
    cores, for at most QUIET_WAIT_RUN seconds, and at most `budget`
    seconds in a round of runs; then the run starts anyway.  wait()
    returns what the last sample saw."""

    def __init__(self, budget):
        self.budget = budget
        self.left = budget
        self.waited = []          # seconds waited in each round

    def new_round(self):
        self.left = self.budget
        self.waited.append(0.0)

    def wait(self):
        start = time.monotonic()
        used = cores_busy()
        while (used is not None and used > QUIET_CORES
               and time.monotonic() - start + QUIET_SAMPLE <= min(QUIET_WAIT_RUN, self.left)):
            used = cores_busy()
        spent = time.monotonic() - start
        self.left = max(0.0, self.left - spent)
        self.waited[-1] += spent
        return used


def trace_stats(cleave, trace):
    p = run_cleave([cleave, "trace-stats", trace, "--format", "json"], "cleave trace-stats")
    return json.loads(p.stdout)


def trace_steps(path):
    """Per step of a trace (after SKIP): the slowest rank's step duration and
    the busy time of every rank, in seconds, as trace-stats counts them
    (forward, backward, update and compute events).  Programs with
    micro-batch units also write a compute event per step, for the work
    outside the units; it takes a microsecond, but milliseconds when the
    rank loses its core there, so leaving it out broke the check against
    trace-stats on a busy machine."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    busy_cats = {"forward", "backward", "update", "compute"}
    dur, busy = {}, {}
    for e in events:
        step = (e.get("args") or {}).get("step")
        if step is None:
            continue
        if e.get("cat") == "step":
            dur.setdefault(step, {})[e["tid"]] = e["dur"] * 1e-6
        elif e.get("cat") in busy_cats:
            busy.setdefault(step, {}).setdefault(e["tid"], 0.0)
            busy[step][e["tid"]] += e["dur"] * 1e-6
    out = []
    for step in sorted(dur)[SKIP:]:
        span = max(dur[step].values())
        b = sum(busy.get(step, {}).get(r, 0.0) for r in dur[step])
        out.append({"step": step, "span_s": span, "busy_s": b,
                    "bubble": 1.0 - b / (len(dur[step]) * span) if span > 0 else 0.0})
    return out


def run_program(args, folder, prog, steps, quiet):
    others = quiet.wait()
    trace = os.path.join(folder, "trace.json")
    metrics = os.path.join(folder, "metrics.jsonl")
    for f in (trace, metrics):
        if os.path.exists(f):
            os.remove(f)
    cmd = run_cmd("./" + os.path.basename(prog["prog"]), steps, "trace.json", "metrics.jsonl")
    p = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                       env=bdp.mpi_env())
    if p.returncode != 0:
        sys.exit("training program failed (exit %d): %s\n%s"
                 % (p.returncode, shlex.join(cmd), p.stderr))
    # --cleave's trace-stats reads the baseline's traces too: one tool
    # measures both builds
    ts = trace_stats(args.cleave, trace)
    plan_line, losses = None, {}
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "plan" in rec:
                plan_line = rec["plan"]
            elif "step" in rec:
                losses[rec["step"]] = rec["loss"]
    if sorted(losses) != list(range(1, steps + 1)):
        sys.exit("%s: expected metrics for steps 1..%d, got %d lines" % (metrics, steps, len(losses)))
    n, used = len(ts["ranks"]), ts["steps_used"]
    if n != PIPE_RANKS or any(r["steps"] != used for r in ts["ranks"]):
        sys.exit("%s: expected %d ranks with %d steps each in the trace" % (trace, PIPE_RANKS, used))
    busy = [r["busy_s"] for r in ts["ranks"]]
    per_step = trace_steps(trace)
    # the script's reading of the trace must add up to trace-stats' totals
    mine = sum(x["busy_s"] for x in per_step)
    if len(per_step) != used or abs(mine - sum(busy)) > 1e-3 * sum(busy) + 1e-6:
        sys.exit("%s: %d steps and %.6f s busy by the script, %d and %.6f s by trace-stats"
                 % (trace, len(per_step), mine, used, sum(busy)))
    return {
        "others_cores": others,
        "bubble": statistics.median(x["bubble"] for x in per_step),
        "span_bubble": 1.0 - sum(busy) / (n * used * ts["mean_step_s"]),
        "trace_stats_bubble": ts["bubble"],
        "steps": per_step,
        "mean_step_s": ts["mean_step_s"],
        "median_step_s": statistics.median(x["span_s"] for x in per_step),
        "steps_used": used,
        "ranks": [{k: r[k] for k in ("rank", "wall_s", "busy_s", "idle_s", "wait_s", "bubble")}
                  for r in ts["ranks"]],
        "busy_ratio": busy[-1] / busy[0] if busy[0] > 0 else None,
        "loss_first": losses[1],
        "loss_last": losses[steps],
        "metrics_plan": plan_line,
    }


# ----------------------------------------------------------------- the parts


def bench_bubble(args, folder, onnx_path):
    configs = [("pipeline", s, m) for m in BUBBLE_MS for s in SCHEDULES] + [("layer", "layer", 1)]
    progs, base = {}, {}
    for strategy, schedule, m in configs:
        c = compile_program(args, folder, onnx_path, m, PIPE_RANKS, strategy, schedule)
        progs[c["name"]] = c
        log("[compile] %-9s batch %3d: %.1f s" % (c["name"], c["batch"], c["compile_s"]))
        if args.baseline:
            b = compile_program(args, folder, onnx_path, m, PIPE_RANKS, strategy, schedule,
                                baseline=True)
            base[b["name"]] = b
            log("[compile] %-9s batch %3d: %.1f s (baseline)" % (b["name"], b["batch"],
                                                                  b["compile_s"]))
    runs = {name: [] for name in progs}
    base_runs = {name: [] for name in base}
    loads = []
    quiet = Quiet(args.wait_quiet)
    for r in range(args.runs):
        t0 = time.perf_counter()
        quiet.new_round()
        loads.append(bdp.load_averages())
        for name, c in progs.items():
            runs[name].append(run_program(args, folder, c, args.steps, quiet))
            if name in base:
                base_runs[name].append(run_program(args, folder, base[name], args.steps, quiet))
        others = [runs[n][-1]["others_cores"] for n in progs if runs[n][-1]["others_cores"] is not None]
        log("[bubble] round %d/%d (%.0f s, %.0f s of it waiting; other jobs' cores before a run: "
            "median %.2f): %s" % (r + 1, args.runs, time.perf_counter() - t0, quiet.waited[-1],
                                  statistics.median(others) if others else float("nan"),
                                  " ".join("%s %.2f" % (n, runs[n][-1]["bubble"]) for n in progs)))

    shown_run = lambda c: shlex.join(run_cmd("./" + os.path.basename(c["prog"]), args.steps,  # noqa: E731
                                             "trace.json", "metrics.jsonl"))
    rows = []
    for name, c in progs.items():
        rs = runs[name]
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        th = theory(c["microbatches"])
        bubble = med("bubble")
        rows.append({
            "name": name, "strategy": c["strategy"], "schedule": c["schedule"],
            "microbatches": c["microbatches"], "batch": c["batch"], "theory": th,
            "bubble": bubble, "span_bubble": med("span_bubble"),
            "trace_stats_bubble": med("trace_stats_bubble"),
            "diff": abs(bubble - th), "ok": abs(bubble - th) <= TARGET,
            "mean_step_s": med("mean_step_s"), "median_step_s": med("median_step_s"),
            "busy_ratio": med("busy_ratio"),
            "others_cores": statistics.median(x["others_cores"] for x in rs)
            if all(x["others_cores"] is not None for x in rs) else None,
            "rank_bubble": [statistics.median(x["ranks"][k]["bubble"] for x in rs)
                            for k in range(PIPE_RANKS)],
            "stage_table": c["stage_table"], "compile_s": c["compile_s"],
            "commands": {"compile": c["compile_cmd"], "run": shown_run(c)},
            "runs": rs,
            "baseline": dict(bdp.compare(rs, base_runs[name], "median_step_s"),
                             compile_s=base[name]["compile_s"],
                             commands={"compile": base[name]["compile_cmd"],
                                       "run": shown_run(base[name])},
                             runs=base_runs[name]) if name in base else None,
        })
    return rows, progs, {"load_before_round": loads, "quiet_waited_s": quiet.waited,
                         "quiet_budget_s_per_round": args.wait_quiet}


def loss_check(rows):
    """Same micro-batches and weights: GPipe and 1F1B (and layer at M=1)
    must train to the same losses, up to the order of float sums."""
    by = {(r["schedule"], r["microbatches"]): r["runs"][0] for r in rows}
    out = []
    for m in BUBBLE_MS:
        group = [(s, by[(s, m)]) for s in SCHEDULES + ["layer"] if (s, m) in by]
        ref = group[0][1]
        ok = all(bt.close(ref["loss_first"], g["loss_first"]) and bt.close(ref["loss_last"], g["loss_last"])
                 for _, g in group)
        out.append({"microbatches": m, "ok": ok,
                    "losses": {s: [g["loss_first"], g["loss_last"]] for s, g in group}})
    return out


def baseline_loss_check(rows):
    """The programs whose baseline trained to other losses than they did
    (first run, first and last step): there the builds do different work."""
    return [r["name"] for r in rows if r["baseline"] and not all(
        bt.close(r["runs"][0][k], r["baseline"]["runs"][0][k]) for k in ("loss_first", "loss_last"))]


def bench_memory(args, folder, onnx_path, progs):
    """Stage 0's planned memory for every P, schedule and M; P = 2 comes
    from the bubble programs, larger P from compiling an object file."""
    rows = []
    for p in MEMORY_PS:
        for schedule in SCHEDULES:
            unit = None
            for m in MEMORY_MS:
                name = config_name("pipeline", schedule, m)
                if p == PIPE_RANKS and name in progs:
                    c = progs[name]
                else:
                    c = compile_program(args, folder, onnx_path, m, p, "pipeline", schedule, emit="obj")
                    log("[compile] %-12s batch %3d: %.1f s (plan only)" % (c["name"], c["batch"], c["compile_s"]))
                r0 = next(r for r in c["rank_plans"] if r["stage"] == 0)
                if m == 1:
                    unit = r0["peak_activation_bytes"]
                st0 = (c["stage_table"] or [{}])[0]
                rows.append({
                    "ranks": p, "schedule": schedule, "microbatches": m, "batch": c["batch"],
                    "stage0": r0, "unit_bytes": unit,
                    "stage0_nodes": "%s .. %s" % (st0.get("first_node"), st0.get("last_node")),
                    "peak_units": r0["peak_activation_bytes"] / unit if unit else None,
                    "bound_units": m if schedule == "gpipe" else min(m, p),
                    "rank_plans": c["rank_plans"], "compile_cmd": c["compile_cmd"],
                })
    # 1F1B's stage 0 holds at most P micro-batches: its peak at M must be
    # GPipe's at min(M, P), where the two schedules hold the same
    peak = {(r["ranks"], r["schedule"], r["microbatches"]): r["stage0"]["peak_activation_bytes"]
            for r in rows}
    for r in rows:
        r["within_bound"] = r["peak_units"] is not None and r["peak_units"] <= r["bound_units"] + 1e-9
        if r["schedule"] == "1f1b":
            key = (r["ranks"], "gpipe", min(r["microbatches"], r["ranks"]))
            r["equals_gpipe_at_min_m_p"] = key in peak and peak[key] == peak[(r["ranks"], "1f1b",
                                                                              r["microbatches"])]
    return rows


def metrics_agree(bubble_rows, progs):
    """The plan line of --metrics against --emit-plan, rank by rank."""
    bad = []
    for r in bubble_rows:
        line = r["runs"][0]["metrics_plan"]
        planned = {x["rank"]: x["peak_activation_bytes"] for x in progs[r["name"]]["rank_plans"]}
        got = {x["rank"]: x["peak_activation_bytes"] for x in (line or {}).get("ranks", [])}
        if got != planned:
            bad.append(r["name"])
    return bad


# ------------------------------------------------------------------- report


def md_table(head, rows, align=None):
    align = align or ["r"] * len(head)
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def kib(b):
    return "%.0f" % (b / 1024)


def mib(b):
    return "%.2f" % (b / 2**20)


def print_report(rep):
    m = rep["machine"]
    la = lambda v: "/".join("%.2f" % x for x in v) if v else "?"  # noqa: E731
    print("command: `%s`" % rep["command"])
    print()
    print("- date: %s" % rep["date"])
    print("- machine: %s, %d cores (%d usable), Linux %s; 2 ranks take both cores, and other "
          "jobs share them (load average 1/5/15 min %s before, %s after; %.0f s in all)"
          % (m["cpu"], m["cores"], m["cores_usable"], m["kernel"], la(rep["load_before"]),
             la(rep["load_after"]), rep["total_s"]))
    print("- cleave: %s (%s); %s" % (rep["cleave"], rep["cleave_version"], rep["mpirun"]))
    if rep["baseline"]:
        print("- baseline: %s (%s); its programs run right after the same programs of cleave"
              % (rep["baseline"], rep["baseline_version"]))
    print("- model: %s, %d parameters; micro-batch %d rows, batch = M x %d; %d steps per run, "
          "the first skipped by trace-stats; medians of %d round%s"
          % (MODEL_NAME, rep["params"], MICRO_ROWS, MICRO_ROWS, rep["steps"], rep["runs"],
             "" if rep["runs"] == 1 else "s"))
    st = rep["bubble"][0]["stage_table"]
    if st:
        print("- stages (P = 2, balanced by training FLOPs): %s" % "; ".join(
            "%d: %s .. %s, %.0f MFLOP per micro-batch" % (s["stage"], s["first_node"], s["last_node"],
                                                          s["flops"] / 1e6)
            for s in st))
    print()

    rows = {(r["schedule"], r["microbatches"]): r for r in rep["bubble"]}
    print("### Bubble, P = 2 (median over the steps of a run, then over the runs)")
    print()
    body = []
    for mm in BUBBLE_MS:
        g, f = rows[("gpipe", mm)], rows[("1f1b", mm)]
        lay = rows.get(("layer", mm))
        diffs = [g["diff"], f["diff"]] + ([lay["diff"]] if lay else [])
        body.append([str(mm), str(mm * MICRO_ROWS), "%.3f" % theory(mm), "%.3f" % g["bubble"],
                     "%.3f" % f["bubble"], "%.3f" % lay["bubble"] if lay else "",
                     "%.3f" % max(diffs), "yes" if max(diffs) <= TARGET else "**no**"])
    for line in md_table(["M", "batch", "theory (P-1)/(M+P-1)", "gpipe", "1f1b", "layer",
                          "max abs diff", "within %.1f" % TARGET], body):
        print(line)
    print()
    print("bubble of a step = 1 - (busy time of both ranks) / (2 x the slowest rank's step)")
    print()

    print("### Details: trace-stats' totals, step time, stage balance")
    print()
    body = []
    for r in rep["bubble"]:
        body.append([r["name"], str(r["microbatches"]), "%.3f" % r["theory"], "%.3f" % r["bubble"],
                     "%.3f" % r["span_bubble"], "%.3f" % r["trace_stats_bubble"],
                     " / ".join("%.3f" % b for b in r["rank_bubble"]),
                     "%.1f" % (1e3 * r["median_step_s"]), "%.1f" % (1e3 * r["mean_step_s"]),
                     "%.1f" % (1e3 * r["median_step_s"] / (r["microbatches"] + PIPE_RANKS - 1)),
                     "%.2f" % r["busy_ratio"],
                     "%.2f" % r["others_cores"] if r["others_cores"] is not None else "?"])
    for line in md_table(["program", "M", "theory", "step median", "trace-stats span",
                          "trace-stats bubble", "its rank 0 / rank 1", "median step ms",
                          "mean step ms", "ms per slot", "busy 1 / busy 0", "others' cores"], body,
                         ["l"] + ["r"] * 11):
        print(line)
    print()
    print("trace-stats span = 1 - sum(busy_s) / (2 x steps_used x mean_step_s); trace-stats "
          "bubble = its idle / wall over the ranks, each rank's wall ending with its own step; "
          "ms per slot = median step / (M + P - 1), what one micro-batch's forward and backward "
          "on one stage would take if the schedule were ideal; busy 1 / busy 0 = stage 1's "
          "busy time over stage 0's; others' cores = CPU other jobs used in the %.1f s before "
          "a run, in cores" % QUIET_SAMPLE)
    print()
    rd = rep["rounds"]
    print("every run, step-median bubble in run order, and in brackets the cores other jobs "
          "used just before it (the script waited up to %d s before a run and %.0f s a round "
          "for them to use under %.1f: %s s in the rounds; 1-minute load average before each "
          "round: %s):"
          % (QUIET_WAIT_RUN, rd["quiet_budget_s_per_round"], QUIET_CORES,
             ", ".join("%.0f" % w for w in rd["quiet_waited_s"]),
             ", ".join("%.2f" % l[0] for l in rd["load_before_round"] if l)))
    for r in rep["bubble"]:
        print("    %-9s %s" % (r["name"], " ".join(
            "%.3f [%s]" % (x["bubble"], "%.1f" % x["others_cores"] if x["others_cores"] is not None else "?")
            for x in r["runs"])))
    print()

    if rep["baseline"]:
        print("### Step time against the baseline (median step ms of a run; median and range "
              "over the runs)")
        print()
        ms = lambda v: "%.2f" % (1e3 * v)  # noqa: E731
        body = [[r["name"], str(r["microbatches"])] + bdp.compare_cells(r["baseline"], ms)
                for r in rep["bubble"]]
        for line in md_table(["program", "M"] + bdp.COMPARE_HEAD, body, ["l"] + ["r"] * 7):
            print(line)
        print()
        print("new/old above 1: cleave's step is slower than the baseline's; every run, median "
              "step ms in run order, cleave | baseline:")
        for r in rep["bubble"]:
            print("    %-9s %s | %s" % (r["name"], " ".join(ms(x["median_step_s"]) for x in r["runs"]),
                                        " ".join(ms(x["median_step_s"]) for x in r["baseline"]["runs"])))
        print()

    print("### Activation memory of stage 0 (planned; micro-batch %d rows)" % MICRO_ROWS)
    print()
    mem = {(r["ranks"], r["schedule"], r["microbatches"]): r for r in rep["memory"]}
    body = []
    for p in MEMORY_PS:
        for mm in MEMORY_MS:
            g, f = mem[(p, "gpipe", mm)], mem[(p, "1f1b", mm)]
            body.append([str(p), str(mm), str(g["batch"]),
                         kib(g["stage0"]["peak_activation_bytes"]), "%.2f" % g["peak_units"],
                         kib(f["stage0"]["peak_activation_bytes"]), "%.2f" % f["peak_units"],
                         str(min(mm, p)), "%d" % f["stage0"]["max_inflight"]])
    for line in md_table(["P", "M", "batch", "gpipe KiB", "gpipe x", "1f1b KiB", "1f1b x",
                          "min(M, P)", "1f1b in flight"], body):
        print(line)
    print()
    print("x = stage 0's peak_activation_bytes over its value at M = 1; stage 0 is %s" % "; ".join(
        "%s for P = %d (%s KiB at M = 1)" % (mem[(p, "gpipe", 1)]["stage0_nodes"], p,
                                             kib(mem[(p, "gpipe", 1)]["unit_bytes"]))
        for p in MEMORY_PS))
    print()

    print("### Arena of stage 0 (MiB)")
    print()
    body = []
    for p in MEMORY_PS:
        for mm in MEMORY_MS:
            row = [str(p), str(mm)]
            for s in SCHEDULES:
                r0 = mem[(p, s, mm)]["stage0"]
                row += [mib(r0["arena_bytes"]), mib(r0["persistent_bytes"]),
                        mib(r0["arena_bytes"] - r0["persistent_bytes"])]
            row.append(mib(mem[(p, "1f1b", mm)]["stage0"]["send_pinned_bytes"]))
            body.append(row)
    for line in md_table(["P", "M", "gpipe arena", "persistent", "transient",
                          "1f1b arena", "persistent", "transient", "sent"], body):
        print(line)
    print()
    print("persistent: parameters, gradient accumulators (M > 1) and the fed inputs (one "
          "instance per micro-batch); transient: arena - persistent, the activations, "
          "gradients and received and sent values, sharing bytes where their lifetimes do not "
          "overlap; sent: send_pinned_bytes, the total size of the instances stage 0 sends in "
          "a step, each held until its send completes")
    print()

    print("checks:")
    for lc in rep["loss_check"]:
        print("    M = %d: loss step 1 / step %d: %s (%s)" % (
            lc["microbatches"], rep["steps"],
            ", ".join("%s %.6f/%.6f" % (s, v[0], v[1]) for s, v in lc["losses"].items()),
            "agree" if lc["ok"] else "DIFFER"))
    bad = rep["metrics_plan_mismatch"]
    print("    --metrics plan line against --emit-plan (peak_activation_bytes of every rank): %s"
          % ("agree for all %d programs" % len(rep["bubble"]) if not bad else "DIFFER for " + ", ".join(bad)))
    if rep["baseline"]:
        bad = rep["baseline_loss_mismatch"]
        print("    loss step 1 / step %d, baseline against cleave: %s" % (
            rep["steps"], "agree for all %d programs" % len(rep["bubble"]) if not bad
            else "DIFFER for " + ", ".join(bad)))
    within = [r for r in rep["memory"] if not r["within_bound"]]
    same = [r for r in rep["memory"] if r.get("equals_gpipe_at_min_m_p") is False]
    print("    stage 0's 1f1b peak at M equals its gpipe peak at min(M, P): %s"
          % ("yes, every row" if not same else "no: " + ", ".join(
              "P=%d M=%d" % (r["ranks"], r["microbatches"]) for r in same)))
    print("    stage 0 peak within its bound (gpipe M, 1f1b min(M, P)) units: %s"
          % ("yes, every row" if not within else "no: " + ", ".join(
              "P=%d %s M=%d" % (r["ranks"], r["schedule"], r["microbatches"]) for r in within)))
    missed = [r["name"] for r in rep["bubble"] if not r["ok"]]
    print("    bubble within %.1f of theory: %s" % (TARGET, "every program" if not missed
                                                    else "MISSED by " + ", ".join(missed)))
    print()

    print("commands (in the work folder; as root with OMPI_ALLOW_RUN_AS_ROOT=1 "
          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1):")
    # the baseline's programs after cleave's; cleave's trace-stats reads
    # the traces of both
    commands = [r["commands"] for r in rep["bubble"]] + [r["baseline"]["commands"]
                                                         for r in rep["bubble"] if r["baseline"]]
    for c in commands:
        print("    %s" % c["compile"])
    for c in commands:
        print("    %s && %s trace.json --format json" % (c["run"], rep["cleave_shown"] + " trace-stats"))
    for r in rep["memory"]:
        if r["ranks"] != PIPE_RANKS:
            print("    %s" % r["compile_cmd"])


# ---------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build-dev", "cleave"),
                    help="the cleave compiler (default: %(default)s)")
    ap.add_argument("--baseline", metavar="OLD",
                    help="also compile every bubble program with the compiler OLD, run the two "
                    "builds' programs in turn and compare their step times")
    ap.add_argument("--runs", type=int, default=3,
                    help="rounds of running every program (default 3); the report gives medians")
    ap.add_argument("--steps", type=int, default=20,
                    help="steps per run (default 20); trace-stats skips the first")
    ap.add_argument("--wait-quiet", type=float, default=50, metavar="SECONDS",
                    help="before each run, wait up to %d s for other jobs to use under %.1f "
                    "cores, at most SECONDS in a round of runs (default 50; 0: never wait)"
                    % (QUIET_WAIT_RUN, QUIET_CORES))
    ap.add_argument("--out", help="also write everything as JSON to this file")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.steps < 2:
        ap.error("--steps must be at least 2 (trace-stats skips the first)")
    if args.wait_quiet < 0:
        ap.error("--wait-quiet must not be negative")
    args.cleave = os.path.abspath(args.cleave)
    if not os.access(args.cleave, os.X_OK):
        sys.exit("%s is not an executable; build cleave or pass --cleave" % args.cleave)
    if args.baseline:
        args.baseline = bdp.baseline_compiler(ap, args.baseline)
    # the compilers as the printed commands name them: relative to the
    # project when inside it (the commands run in a work folder elsewhere)
    shown = lambda p: os.path.relpath(p, ROOT) if p.startswith(ROOT + os.sep) else p  # noqa: E731
    args.cleave_shown = shown(args.cleave)
    args.baseline_shown = shown(args.baseline) if args.baseline else None

    bt.import_torch()
    rep = {
        "command": shlex.join([sys.executable] + sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": bt.machine_info(),
        "cleave": args.cleave,
        "cleave_shown": args.cleave_shown,
        "cleave_version": bt.cleave_version(args.cleave),
        "baseline": args.baseline,
        "baseline_version": bt.cleave_version(args.baseline) if args.baseline else None,
        "mpirun": bdp.mpirun_version(),
        "model": {"name": MODEL_NAME, "layers": [IN_DIM] + HIDDEN + [bt.N_CLASSES]},
        "micro_batch": MICRO_ROWS,
        "pipeline_ranks": PIPE_RANKS,
        "runs": args.runs,
        "steps": args.steps,
        "target": TARGET,
        "load_before": bdp.load_averages(),
    }
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cleave-bench-pp-") as folder:
        onnx_path, rep["params"] = export_model(folder, args.steps)
        log("[model] %s, %d params, micro-batch %d rows; %d steps per run, %d rounds"
            % (MODEL_NAME, rep["params"], MICRO_ROWS, args.steps, args.runs))
        rep["bubble"], progs, rep["rounds"] = bench_bubble(args, folder, onnx_path)
        rep["memory"] = bench_memory(args, folder, onnx_path, progs)
        rep["metrics_plan_mismatch"] = metrics_agree(rep["bubble"], progs)
    rep["loss_check"] = loss_check(rep["bubble"])
    rep["baseline_loss_mismatch"] = baseline_loss_check(rep["bubble"])
    rep["total_s"] = time.perf_counter() - t_start
    rep["load_after"] = bdp.load_averages()
    rep["ok"] = (all(r["ok"] for r in rep["bubble"]) and all(lc["ok"] for lc in rep["loss_check"])
                 and not rep["baseline_loss_mismatch"])
    log("done in %.0f s" % rep["total_s"])

    print_report(rep)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=2)
            f.write("\n")
    if not rep["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
