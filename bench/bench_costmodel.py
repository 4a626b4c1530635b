#!/usr/bin/python3
"""The cost model against measurement: predicted and measured step times.

For each model (samples/mlp.onnx, samples/cnn.onnx, samples/resnet.onnx
and bench_train's deep MLP, 512 inputs and 16 hidden layers of 512) and each rank count N in
1, 2, 4, the script asks `cleave plan --format json` for every candidate
the search enumerated on --plan-cluster (default: the stated defaults),
compiles each of them with `cleave compile --strategy S ... --stages CUTS`
(the stages where the search cut them, so the program is the plan that
was priced; and --emit-plan), runs it under `mpirun --oversubscribe -np
N` with --metrics, and takes

    measured step = median of the per-step durations (differences of the
                    metrics' cumulative elapsed_s) after --warmup steps,

then the median of that over --runs rounds.  It reports per model and N
predicted against measured (ms) and the relative error pred/meas - 1, the
median absolute error over every run configuration, and for N = 2 and 4
the regret of the plan auto chose: measured(chosen) / min(measured) - 1.

Candidates: when the search has more than --max-candidates feasible ones,
the fastest predicted --max-candidates are measured, plus the chosen one
(which is the fastest predicted, so normally among them); 0 measures all.
Every program's arena (the one allocation that scales with the model) is
compared with the prediction: the arena_bytes of each rank in
`cleave plan`'s alternative must equal the arena_bytes of --emit-plan.

The same programs are also scored against the predictions for every
--cluster FILE given (default samples/clusters/laptop.json), for the rank
counts that cluster has: the candidates are the same strategies, only
the predicted times change, so nothing is run again (another cluster may
cut a staged candidate elsewhere; the programs are --plan-cluster's).

Steps per run: enough for about --target-s seconds at the predicted rate,
between --min-steps and --max-steps.  The machine the numbers come from
has 2 cores and other jobs: N = 4 runs 4 ranks on 2 cores (oversubscribed;
the programs pin rank k to core k mod 2, which the cost model knows when
the cluster states its cores, as calibrations do), marked as such.
Before each run the script waits briefly for other jobs to go
quiet (bench_pipeline's Quiet, --wait-quiet seconds per round at most).

    /usr/bin/python3 bench/bench_costmodel.py [--cleave PATH] [--models mlp,cnn,resnet,deep]
        [--ranks 1,2,4] [--batch 64] [--runs 1] [--max-candidates 10]
        [--plan-cluster SPEC] [--cluster SPEC ...] [--out results.json]

Needs Debian's /usr/bin/python3 (torch 1.13 to export the deep MLP, numpy),
Open MPI's mpirun and a built cleave (by default build-dev/cleave next to
this folder).  Progress goes to stderr, the report (markdown) to stdout.
Exit status 1 when an arena differs from its prediction.
"""

import argparse
import datetime
import json
import math
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

import bench_train as bt      # noqa: E402  (model builder, compile/run commands, machine info)
import bench_dp as bdp        # noqa: E402  (mpirun environment, load averages, tables)
import bench_pipeline as bp   # noqa: E402  (compiler retries, waiting for quiet)

DEEP = [m for m in bt.MODELS if m[0] == "deep_mlp_16x512"][0]   # name, in, hidden, batch, steps
MODELS = {
    # key: (ONNX file or None to export, input shape after the batch, description)
    "mlp": (os.path.join(ROOT, "samples", "mlp.onnx"), (1, 28, 28), "samples/mlp.onnx"),
    "cnn": (os.path.join(ROOT, "samples", "cnn.onnx"), (1, 28, 28), "samples/cnn.onnx"),
    "resnet": (os.path.join(ROOT, "samples", "resnet.onnx"), (1, 28, 28), "samples/resnet.onnx"),
    "deep": (None, (DEEP[1],), "bench_train's %s (%d -> %d x %d -> %d)"
             % (DEEP[0], DEEP[1], len(DEEP[2]), DEEP[2][0], bt.N_CLASSES)),
}
DEFAULT_CLUSTERS = [os.path.join(ROOT, "samples", "clusters", "laptop.json")]
ERROR_TARGET = 0.20       # median |pred/meas - 1|
REGRET_TARGET = 0.10      # measured(chosen) / min(measured) - 1
RUN_TIMEOUT = 600


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ms(s):
    return "%.3f" % (s * 1e3) if s is not None else "-"


def pct(x):
    return "%+.0f%%" % (x * 100) if x is not None else "-"


# ------------------------------------------------------------------- models


def prepare_model(key, folder, batch, rows):
    """The ONNX file and data (rows of random input, int64 labels in
    [0, 10)) of one model."""
    np = bt.np
    path, shape, _ = MODELS[key]
    mdir = os.path.join(folder, key)
    os.makedirs(mdir, exist_ok=True)
    if path is None:
        torch = bt.torch
        path = os.path.join(mdir, "model.onnx")
        torch.manual_seed(bt.WEIGHT_SEED)
        model = bt.build_model(DEEP[1], DEEP[2])
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.zeros(batch, DEEP[1]),), path,
                              export_params=True, opset_version=bt.OPSET,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False,
                              input_names=["input"], output_names=["logits"])
    rng = np.random.default_rng(bt.DATA_SEED)
    np.save(os.path.join(mdir, "x.npy"), rng.standard_normal((rows,) + shape, dtype=np.float32))
    np.save(os.path.join(mdir, "y.npy"), rng.integers(0, bt.N_CLASSES, size=rows, dtype=np.int64))
    return path, mdir


# --------------------------------------------------------------- candidates


def cand_key(c):
    return (c["strategy"], c["dp"], c["stages"], c["microbatches"], c["schedule"],
            c.get("placement") or "by_replica")


def cand_name(c):
    s = c["strategy"]
    if s in ("single", "dp", "layer"):
        return "%s D%d P%d" % (s, c["dp"], c["stages"])
    return "%s D%d P%d M%d %s%s" % (s, c["dp"], c["stages"], c["microbatches"], c["schedule"],
                                    " bystage" if c.get("placement") == "by_stage" else "")


def strategy_flags(c, n):
    s = c["strategy"]
    flags = ["--ranks", str(n), "--strategy", s]
    if s == "pipeline":
        flags += ["--microbatches", str(c["microbatches"]), "--schedule", c["schedule"]]
    elif s == "hybrid":
        flags += ["--dp", str(c["dp"]), "--pp", str(c["stages"]),
                  "--microbatches", str(c["microbatches"]), "--schedule", c["schedule"],
                  "--placement", c.get("placement") or "by_replica"]
    return flags


def cluster_flags(cluster):
    """cleave's flags for a cluster spec: "profile" (this machine's times
    of the model's own kernels), "profile:FILE" (those, with FILE's links,
    cores and memory), a cluster file, or None (the stated defaults)."""
    if not cluster:
        return []
    if cluster == "profile":
        return ["--profile"]
    if cluster.startswith("profile:"):
        return ["--profile", "--cluster", cluster[len("profile:"):]]
    return ["--cluster", cluster]


def plan_json(cleave, onnx_path, batch, n, cluster):
    """`cleave plan --format json` with the training options the programs
    are compiled with; None when the cluster cannot hold n ranks."""
    cmd = bt.compile_cmd(cleave, onnx_path, "unused", batch)
    cmd = [cleave, "plan"] + cmd[2:]
    del cmd[cmd.index("-o"):cmd.index("-o") + 2]
    cmd += ["--ranks", str(n), "--format", "json"] + cluster_flags(cluster)
    if cluster:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=bt.TIMEOUT)
        if p.returncode != 0:
            if "the cluster" in p.stderr and "ranks" in p.stderr:   # too few ranks
                return None, p.stderr.strip()
            sys.exit("cleave plan failed: %s\n%s" % (shlex.join(cmd), p.stderr))
    else:
        p = bp.run_cleave(cmd, "cleave plan")
    return json.loads(p.stdout), shlex.join(cmd)


def select(alternatives, limit):
    """The feasible candidates, fastest predicted first, at most `limit`
    of them (0: all) plus the chosen one."""
    feas = sorted((a for a in alternatives if a["feasible"]), key=lambda a: a["step_s"])
    chosen = [a for a in alternatives if a.get("why") == "fastest"]
    pick = feas if limit <= 0 else feas[:limit]
    for c in chosen:
        if c not in pick:
            pick.append(c)
    return pick, chosen[0] if chosen else None


# ------------------------------------------------------- compiling, running


def compile_candidate(args, onnx_path, mdir, c, n, batch, idx):
    prog = os.path.join(mdir, "prog_n%d_%02d" % (n, idx))
    plan_path = prog + ".plan.json"
    # the plan the search priced, its stages cut where the search cut them
    cmd = bt.compile_cmd(args.cleave, onnx_path, prog, batch) + strategy_flags(c, n) + \
        (["--stages", c["cuts"]] if c.get("cuts") else [])
    t0 = time.perf_counter()
    bp.run_cleave(cmd + ["--emit-plan", plan_path], "cleave compile (%s)" % cand_name(c))
    compile_s = time.perf_counter() - t0
    with open(plan_path) as f:
        plan = json.load(f)
    emitted = {rp["rank"]: rp["arena_bytes"] for rp in plan["rank_plans"]}
    predicted = {r["rank"]: r["arena_bytes"] for r in c["ranks"]}
    return {"prog": prog, "compile_s": compile_s, "compile_cmd": shlex.join(cmd),
            "plan_strategy": plan.get("strategy"),
            "arena_emitted": [emitted.get(r) for r in sorted(predicted)],
            "arena_predicted": [predicted[r] for r in sorted(predicted)],
            "arena_equal": emitted == predicted}


def steps_for(args, predicted_s):
    return max(args.min_steps, min(args.max_steps, int(math.ceil(args.target_s / predicted_s))))



def step_durations(metrics, steps):
    """Each step's seconds from a program's --metrics file (elapsed_s of
    steps 1..steps, the first from the start), or a one-line error when
    a step is missing.  bench_cluster.py shares it."""
    elapsed = {}
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "step" in rec:
                elapsed[rec["step"]] = rec["elapsed_s"]
    if sorted(elapsed) != list(range(1, steps + 1)):
        return "expected metrics for steps 1..%d, got %d" % (steps, len(elapsed))
    return [elapsed[1]] + [elapsed[k] - elapsed[k - 1] for k in range(2, steps + 1)]

def run_candidate(args, mdir, prog, n, steps, quiet):
    others = quiet.wait()
    metrics = os.path.join(mdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = bt.program_cmd("./" + os.path.basename(prog), "x.npy", "y.npy", steps, "metrics.jsonl")
    if n > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(n)] + cmd
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=mdir, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                       env=bdp.mpi_env())
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": "exit %d: %s" % (p.returncode, p.stderr.strip()[-500:]), "cmd": shlex.join(cmd)}
    durs = step_durations(metrics, steps)
    if isinstance(durs, str):
        return {"error": durs, "cmd": shlex.join(cmd)}
    used = durs[args.warmup:]
    return {"median_step_s": statistics.median(used), "min_step_s": min(used),
            "steps": steps, "steps_used": len(used), "wall_s": wall, "others_cores": others,
            "cmd": shlex.join(cmd)}


# ----------------------------------------------------------------- the bench


def bench_model(args, folder, key, quiet):
    batch = args.batch
    onnx_path, mdir = prepare_model(key, folder, batch, args.max_steps * batch)
    out = []
    for n in args.ranks:
        plan, plan_cmd = plan_json(args.cleave, onnx_path, batch, n, args.plan_cluster)
        alts = plan["alternatives"]
        cands, chosen = select(alts, args.max_candidates)
        log("[%s N=%d] %d candidates enumerated, %d feasible, measuring %d; chosen %s"
            % (key, n, len(alts), sum(a["feasible"] for a in alts), len(cands),
               cand_name(chosen) if chosen else "?"))
        # the same candidates under the other clusters
        other = {}
        for cl in args.cluster:
            pj, why = plan_json(args.cleave, onnx_path, batch, n, cl)
            if pj is None:
                log("[%s N=%d] cluster %s skipped: %s" % (key, n, os.path.basename(cl), why))
                continue
            other[cl] = {"by_key": {cand_key(a): a for a in pj["alternatives"]},
                         "chosen": [cand_key(a) for a in pj["alternatives"] if a.get("why") == "fastest"],
                         "name": pj["prediction"]["cluster"]}
        rows = []
        for i, c in enumerate(cands):
            comp = compile_candidate(args, onnx_path, mdir, c, n, batch, i)
            row = {"candidate": cand_name(c), "key": list(cand_key(c)), "chosen": c is chosen,
                   "predicted_s": c["step_s"], "bubble": c["bubble"], "comm_bytes": c["comm_bytes"],
                   "steps": steps_for(args, c["step_s"]), "runs": [],
                   "predicted_by_cluster": {cl: (o["by_key"].get(cand_key(c)) or {}).get("step_s")
                                            for cl, o in other.items()}}
            row.update(comp)
            rows.append(row)
            if not comp["arena_equal"]:
                log("[%s N=%d] %s: arena predicted %s, --emit-plan %s" % (
                    key, n, row["candidate"], comp["arena_predicted"], comp["arena_emitted"]))
        for r in range(args.runs):
            quiet.new_round()
            for row in rows:
                res = run_candidate(args, mdir, row["prog"], n, row["steps"], quiet)
                row["runs"].append(res)
                if "error" in res:
                    log("[%s N=%d] %s failed: %s" % (key, n, row["candidate"], res["error"]))
                else:
                    log("[%s N=%d] run %d/%d %-28s predicted %8s ms measured %8s ms (%d steps, %.1f s)"
                        % (key, n, r + 1, args.runs, row["candidate"], ms(row["predicted_s"]),
                           ms(res["median_step_s"]), res["steps"], res["wall_s"]))
        for row in rows:
            ok = [x["median_step_s"] for x in row["runs"] if "error" not in x]
            row["measured_s"] = statistics.median(ok) if ok else None
            row["error"] = row["predicted_s"] / row["measured_s"] - 1 if ok else None
            row["error_by_cluster"] = {
                cl: (p / row["measured_s"] - 1 if p is not None and ok else None)
                for cl, p in row["predicted_by_cluster"].items()}
        measured = [r for r in rows if r["measured_s"] is not None]
        best = min(measured, key=lambda r: r["measured_s"]) if measured else None
        ch = [r for r in rows if r["chosen"]]
        regret = (ch[0]["measured_s"] / best["measured_s"] - 1
                  if ch and best and ch[0]["measured_s"] is not None else None)
        regret_cl = {}
        for cl, o in other.items():
            keyed = [r for r in measured if tuple(r["key"]) in o["chosen"]]
            regret_cl[cl] = (keyed[0]["measured_s"] / best["measured_s"] - 1) if keyed and best else None
        out.append({"model": key, "ranks": n, "batch": batch, "plan_cmd": plan_cmd,
                    "enumerated": len(alts), "feasible": sum(a["feasible"] for a in alts),
                    "measured_count": len(measured), "rows": rows,
                    "chosen": cand_name(chosen) if chosen else None,
                    "fastest_measured": best["candidate"] if best else None,
                    "regret": regret, "regret_by_cluster": regret_cl,
                    "clusters": {cl: o["name"] for cl, o in other.items()},
                    "oversubscribed": n > (os.cpu_count() or 1)})
    return out


# ------------------------------------------------------------------- report


def summary(groups, cluster=None):
    """Median |error| over all measured configurations (optionally under
    another cluster), and the same after one scale factor fitted to them
    (the median of measured / predicted): what a calibration of a single
    speed would leave."""
    pairs = []
    for g in groups:
        for r in g["rows"]:
            p = r["predicted_s"] if cluster is None else r["predicted_by_cluster"].get(cluster)
            if p is not None and r["measured_s"] is not None:
                pairs.append((p, r["measured_s"], g["ranks"]))
    if not pairs:
        return None
    errs = [abs(p / m - 1) for p, m, _ in pairs]
    k = statistics.median(m / p for p, m, _ in pairs)
    errs_k = [abs(k * p / m - 1) for p, m, _ in pairs]
    by_n = {}
    for p, m, n in pairs:
        by_n.setdefault(n, []).append(abs(p / m - 1))
    return {"count": len(pairs), "median_abs_error": statistics.median(errs),
            "scale": k, "median_abs_error_scaled": statistics.median(errs_k),
            "median_abs_error_by_ranks": {n: statistics.median(v) for n, v in sorted(by_n.items())},
            "underpredicted": sum(p < m for p, m, _ in pairs)}


def plan_cluster_name(spec):
    return "the stated defaults" if not spec else spec if spec == "profile" else \
        "profile:" + os.path.relpath(spec[8:], ROOT) if spec.startswith("profile:") else os.path.relpath(spec, ROOT)


def print_report(rep):
    m = rep["machine"]
    print("# Cost model: predicted against measured step time\n")
    print("- command: `%s`" % rep["command"])
    print("- date: %s" % rep["date"])
    print("- machine: %s, %d cores (%d usable), Linux %s; load average before %s, after %s"
          % (m["cpu"], m["cores"], m["cores_usable"], m["kernel"],
             "/".join("%.2f" % x for x in rep["load_before"] or []),
             "/".join("%.2f" % x for x in rep["load_after"] or [])))
    print("- N = 4 runs 4 ranks on %d cores (mpirun --oversubscribe; each rank pinned to core rank mod %d)."
          % (m["cores"], m["cores"]))
    print("- cleave: %s (%s); %s" % (rep["cleave"], rep["cleave_version"], rep["mpirun"]))
    print("- batch %d; measured = median per-step time after %d warm-up steps (median over %d run(s)); "
          "error = predicted / measured - 1; candidates enumerated, chosen and cut on %s"
          % (rep["batch"], rep["warmup"], rep["runs"], plan_cluster_name(rep["plan_cluster"])))
    print("- %.0f s in all" % rep["total_s"])
    print()
    for g in rep["groups"]:
        print("## %s, N = %d%s\n" % (MODELS[g["model"]][2], g["ranks"],
                                     " (oversubscribed)" if g["oversubscribed"] else ""))
        print("%d candidates enumerated, %d feasible, %d measured; chosen: %s; fastest measured: %s; "
              "regret %s\n" % (g["enumerated"], g["feasible"], g["measured_count"], g["chosen"],
                               g["fastest_measured"],
                               pct(g["regret"]) if g["regret"] is not None else "-"))
        cls = list(g["clusters"])
        head = ["candidate", "pred ms", "meas ms", "error"] + \
            ["%s ms" % os.path.splitext(os.path.basename(c))[0] for c in cls] + \
            ["%s err" % os.path.splitext(os.path.basename(c))[0] for c in cls] + \
            ["arena (pred = emitted)", "steps"]
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
        for r in g["rows"]:
            arena = "/".join("%.2f" % (b / 1e6) for b in r["arena_predicted"]) + " MB " + \
                ("yes" if r["arena_equal"] else "NO: " + "/".join(str(b) for b in r["arena_emitted"]))
            cells = [r["candidate"] + (" **chosen**" if r["chosen"] else ""),
                     ms(r["predicted_s"]), ms(r["measured_s"]), pct(r["error"])] + \
                [ms(r["predicted_by_cluster"].get(c)) for c in cls] + \
                [pct(r["error_by_cluster"].get(c)) for c in cls] + [arena, str(r["steps"])]
            print("| " + " | ".join(cells) + " |")
        print()
    print("## Summary\n")
    s = rep["summary"]
    if s:
        print("- %s: median |error| **%.0f%%** over %d configurations (target <= %.0f%%); "
              "%d of %d predicted faster than measured; by N: %s"
              % (plan_cluster_name(rep["plan_cluster"]), s["median_abs_error"] * 100, s["count"], ERROR_TARGET * 100, s["underpredicted"], s["count"],
                 ", ".join("N=%d %.0f%%" % (n, e * 100) for n, e in s["median_abs_error_by_ranks"].items())))
        print("- one speed factor fitted to them (measured = %.2f x predicted): median |error| %.0f%%"
              % (s["scale"], s["median_abs_error_scaled"] * 100))
    for cl, cs in rep["summary_by_cluster"].items():
        if cs:
            print("- %s: median |error| %.0f%% over %d configurations (N it holds only); "
                  "fitted factor %.2f leaves %.0f%%" % (os.path.relpath(cl, ROOT), cs["median_abs_error"] * 100,
                                                        cs["count"], cs["scale"],
                                                        cs["median_abs_error_scaled"] * 100))
    print("- arenas: %s" % ("every rank's predicted arena equals --emit-plan's"
                            if rep["arenas_equal"] else "SOME DIFFER (see the tables)"))
    print()
    print("| model | N | chosen | fastest measured | regret | regret (%s) |" %
          ", ".join(os.path.basename(c) for c in rep["clusters"]) if rep["clusters"] else
          "| model | N | chosen | fastest measured | regret | - |")
    print("|---|---:|---|---|---:|---:|")
    for g in rep["groups"]:
        if g["ranks"] < 2:
            continue
        rc = ", ".join(pct(v) for v in g["regret_by_cluster"].values()) or "-"
        print("| %s | %d | %s | %s | %s | %s |" % (g["model"], g["ranks"], g["chosen"], g["fastest_measured"],
                                                  pct(g["regret"]), rc))
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build-dev", "cleave"))
    ap.add_argument("--models", default="mlp,cnn,deep", help="of mlp, cnn, resnet, deep (default: mlp,cnn,deep)")
    ap.add_argument("--ranks", default="1,2,4", help="rank counts (default 1,2,4)")
    ap.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    ap.add_argument("--runs", type=int, default=1, help="rounds over the candidates (default 1)")
    ap.add_argument("--max-candidates", type=int, default=10,
                    help="fastest predicted candidates measured per model and N, plus the chosen "
                         "one; 0 = all (default 10)")
    ap.add_argument("--plan-cluster", default=None,
                    help="the cluster the candidates are enumerated, chosen and cut on: a cluster file, "
                         "'profile' or 'profile:FILE' (default: cleave's stated defaults)")
    ap.add_argument("--cluster", action="append",
                    help="also score against this cluster file's predictions ('profile': cleave plan "
                    "--profile's, this machine's kernel times) (repeatable; default "
                         "samples/clusters/laptop.json; 'none' for none)")
    ap.add_argument("--target-s", type=float, default=1.0,
                    help="seconds of steps per run at the predicted rate (default 1.0)")
    ap.add_argument("--min-steps", type=int, default=15)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median (default 3)")
    ap.add_argument("--wait-quiet", type=float, default=30,
                    help="seconds per round spent at most waiting for other jobs to go quiet (default 30)")
    ap.add_argument("--out", help="write every number to this JSON file")
    args = ap.parse_args()
    args.cleave = os.path.abspath(args.cleave)
    args.models = [m for m in args.models.split(",") if m]
    args.ranks = [int(n) for n in args.ranks.split(",") if n]
    if args.cluster is None:
        args.cluster = list(DEFAULT_CLUSTERS)
    absolute = lambda c: (c if c == "profile" else "profile:" + os.path.abspath(c[8:]) if c.startswith("profile:")
                          else os.path.abspath(c))
    args.cluster = [absolute(c) for c in args.cluster if c != "none"]
    if args.plan_cluster:
        args.plan_cluster = absolute(args.plan_cluster)
    # "stated defaults" means them, not a calibration cached on this machine
    os.environ["CLEAVE_CLUSTER_CACHE"] = os.path.join(tempfile.gettempdir(), "cleave-bench-no-calibration.json")
    for mname in args.models:
        if mname not in MODELS:
            sys.exit("unknown model %s (known: %s)" % (mname, ", ".join(MODELS)))
    if args.min_steps <= args.warmup:
        sys.exit("--min-steps must be above --warmup")
    if "deep" in args.models:
        bt.import_torch()
    else:
        import numpy
        bt.np = numpy

    t0 = time.perf_counter()
    load_before = bdp.load_averages()
    groups = []
    quiet = bp.Quiet(args.wait_quiet)
    with tempfile.TemporaryDirectory(prefix="cleave-costmodel-") as folder:
        for key in args.models:
            groups += bench_model(args, folder, key, quiet)
    rep = {
        "command": shlex.join([sys.executable] + [os.path.relpath(sys.argv[0], ROOT)
                                                 if os.path.exists(sys.argv[0]) else sys.argv[0]]
                              + sys.argv[1:]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": bt.machine_info(), "cleave": args.cleave,
        "cleave_version": bt.cleave_version(args.cleave), "mpirun": bdp.mpirun_version(),
        "batch": args.batch, "warmup": args.warmup, "runs": args.runs, "plan_cluster": args.plan_cluster,
        "max_candidates": args.max_candidates, "clusters": args.cluster,
        "load_before": load_before, "load_after": bdp.load_averages(),
        "total_s": time.perf_counter() - t0, "groups": groups,
        "summary": summary(groups),
        "summary_by_cluster": {cl: summary(groups, cl) for cl in args.cluster},
        "arenas_equal": all(r["arena_equal"] for g in groups for r in g["rows"]),
    }
    print_report(rep)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)
    return 0 if rep["arenas_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
