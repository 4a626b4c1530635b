#!/usr/bin/python3
"""The cost model across hosts: every candidate of `cleave plan`, predicted
and measured on a test cluster of network namespaces at several link rates.

For each link rate (--rates, default "unshaped,100mbit"; tc's units) the
script brings up a test cluster of 2 hosts with one slot each
(scripts/testcluster.sh, docs/testcluster.md; its own namespace prefix,
always taken down, also on Ctrl-C or SIGTERM), and on it:

1. runs `cleave calibrate --hostfile` (with --quick unless --full-calibrate)
   through the cluster, which writes the cluster file: this machine's
   compute rates, and the link between the two hosts as it measured it
   (latency, bandwidth, allreduce rate);
2. for each model (--models: bench_train's 16-layer MLP "deep" and its
   GPT-style decoder "gpt", gpt_mini, exported with a dynamic batch so
   that it can be split) asks `cleave plan --profile --cluster FILE
   --ranks 2 --format json` for every candidate (the model's own kernels
   timed on this machine, the calibrated links; --no-profile: the file's
   rates instead), compiles each with
   `cleave compile` and the candidate's flags and stages (`--stages CUTS`,
   so the program is the plan that was priced; compiled once per
   distinct command across rates), and runs it across the two hosts
   (`testcluster.sh mpirun -np 2 --map-by node`) with --metrics;

       measured step = median of the per-step durations (differences of
                       the metrics' elapsed_s) after --warmup steps,

   the median over --runs rounds;
3. reports per candidate predicted against measured, the cost model's
   median |predicted / measured - 1| per rate, auto's choice (the
   candidate `cleave plan` chose, which is what `cleave compile --strategy
   auto --profile --cluster FILE` compiles) and its regret, measured(chosen) /
   min(measured) - 1, and whether auto chose differently at each rate.

It also prices the same candidates with the file's rates alone (`rates`)
and on a copy of the file without the links' allreduce_gbps (`links
only`): what the prediction was before calibrate measured allreduces.

The two hosts are namespaces of one machine: they share its cores (2 on
the development machine), so 2 hosts x 1 rank is all that gives each rank
a core; the links between them are the shaped veths.

    sudo /usr/bin/python3 bench/bench_cluster.py [--cleave PATH] [--rates unshaped,100mbit]
        [--models deep,gpt] [--runs 1] [--target-s 4] [--out results.json]

Needs root (namespaces), Open MPI's mpirun, iproute2, Debian's
/usr/bin/python3 with torch 1.13 (to export the models) and numpy, and a
built cleave (default: build/cleave next to this folder).  While it runs
it holds /tmp/cleave-quiet-helper, and before each step it waits while
/tmp/cleave-quiet exists (another session's benchmark).  Progress goes
to stderr, the report (markdown) to stdout.
"""

import argparse
import datetime
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_train as bt      # noqa: E402  (models, compile command, machine info)
import bench_dp as bdp        # noqa: E402  (load averages, mpirun version)
import bench_costmodel as bc  # noqa: E402  (candidates: names, flags, plan json)
import bench_pipeline as bp   # noqa: E402  (compiler retries)

SCRIPT = os.path.join(ROOT, "scripts", "testcluster.sh")
HOSTS = 2
QUIET = "/tmp/cleave-quiet"            # another session's benchmark runs: wait
HELPER = "/tmp/cleave-quiet-helper"    # this one runs: others wait
ERROR_TARGET = 0.20
REGRET_TARGET = 0.10
RUN_TIMEOUT = 900
CAL_TIMEOUT = 400

DEEP = bc.DEEP   # name, in, hidden, batch, steps
MODELS = {
    # key: (description, batch)
    "deep": ("bench_train's %s (%d -> %d x %d -> %d)" % (DEEP[0], DEEP[1], len(DEEP[2]), DEEP[2][0],
                                                          bt.N_CLASSES), DEEP[3]),
    "gpt": ("bench_train's gpt_mini (4 layers, width 256, 4 heads, 128 tokens, vocabulary 100)", 8),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Stop(BaseException):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so the cluster comes down."""


def on_signal(signum, _frame):
    raise Stop("signal %d" % signum)


def wait_quiet():
    waited = 0
    while os.path.exists(QUIET):
        if waited == 0:
            log("waiting while %s exists" % QUIET)
        time.sleep(10)
        waited += 10
    return waited


def run(cmd, env=None, timeout=RUN_TIMEOUT, cwd=None):
    """(status, stdout, stderr); the process group is ended on a timeout or
    an interruption."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except BaseException as e:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
                p.communicate(timeout=5)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        if isinstance(e, subprocess.TimeoutExpired):
            return None, "", "timed out after %d s" % timeout
        raise


# ------------------------------------------------------------------- cluster


class Cluster:
    """The test cluster of HOSTS hosts at one rate, up for a `with` block."""

    def __init__(self, prefix, work, rate):
        self.rate = rate
        self.dir = os.path.join(work, "cluster-%s" % rate)
        self.env = dict(os.environ, CLEAVE_TESTCLUSTER_PREFIX=prefix, CLEAVE_TESTCLUSTER_DIR=self.dir)
        self.hostfile = os.path.join(self.dir, "hostfile")

    def script(self, *args, timeout=RUN_TIMEOUT, cwd=None):
        return run([SCRIPT] + list(args), env=self.env, timeout=timeout, cwd=cwd)

    def __enter__(self):
        args = ["up", str(HOSTS)] + ([] if self.rate == "unshaped" else ["--rate", self.rate])
        rc, out, err = self.script(*args, timeout=120)
        if rc != 0:
            self.down()
            sys.exit("testcluster.sh %s failed: %s" % (" ".join(args), (err or out).strip()))
        return self

    def down(self):
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            rc, _, err = self.script("down", timeout=120)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        if rc != 0:
            log("testcluster.sh down failed: %s" % err.strip())

    def __exit__(self, *exc):
        self.down()
        return False


def calibrate(args, cl, work):
    out = os.path.join(work, "cluster-%s.json" % cl.rate)
    cmd = [args.cleave, "calibrate", "-o", out, "--hostfile", cl.hostfile, "--ranks-per-node", "1"]
    if not args.full_calibrate:
        cmd.append("--quick")
    wait_quiet()
    t0 = time.perf_counter()
    rc, _, err = cl.script("exec", *cmd, timeout=CAL_TIMEOUT)
    secs = time.perf_counter() - t0
    if rc != 0:
        sys.exit("cleave calibrate failed at %s: %s" % (cl.rate, err.strip()[-800:]))
    with open(out) as f:
        c = json.load(f)
    summary = [l.strip() for l in err.splitlines() if l.strip().startswith(("inter_node", "link ", "intra_node"))]
    log("[%s] calibrated in %.0f s: %s" % (cl.rate, secs, "; ".join(summary)))
    # the same file without the allreduce rates: the model before they were measured
    bare = dict(c)
    bare["inter_node"] = {k: v for k, v in c["inter_node"].items() if k != "allreduce_gbps"}
    bare["links"] = [{k: v for k, v in l.items() if k != "allreduce_gbps"} for l in c.get("links", [])]
    bare_path = out[:-5] + "-links-only.json"
    with open(bare_path, "w") as f:
        json.dump(bare, f, indent=1)
    return {"file": out, "links_only_file": bare_path, "seconds": secs, "cmd": shlex.join(cmd),
            "inter_node": c["inter_node"], "links": c.get("links"), "summary": summary}


# -------------------------------------------------------------------- models


def prepare_model(key, folder, rows):
    """The ONNX file and data of one model, in folder/key."""
    mdir = os.path.join(folder, key)
    os.makedirs(mdir, exist_ok=True)
    if key == "deep":
        path, _ = bc.prepare_model("deep", folder, MODELS[key][1], rows)
        return path, mdir
    w = bt.workloads(["gpt_mini"], None)[0]
    path = os.path.join(mdir, "model.onnx")
    torch = bt.torch
    torch.manual_seed(bt.WEIGHT_SEED)
    model = bt.build_lm("gpt_mini")
    x = torch.zeros((MODELS[key][1],) + tuple(w["sample"]), dtype=torch.int64)
    # a dynamic batch: its attention's reshapes then follow the rows a
    # replica or micro-batch runs, which data and pipeline parallelism need
    with torch.no_grad(), bc.warnings.catch_warnings():
        bc.warnings.simplefilter("ignore")
        torch.onnx.export(model.train(), (x,), path, export_params=True, opset_version=w["opset"],
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    rng = bt.np.random.default_rng(bt.DATA_SEED)
    seq = rng.integers(0, w["classes"], size=(rows, w["sample"][0] + 1), dtype=bt.np.int64)
    bt.np.save(os.path.join(mdir, "x.npy"), bt.np.ascontiguousarray(seq[:, :-1]))
    bt.np.save(os.path.join(mdir, "y.npy"), bt.np.ascontiguousarray(seq[:, 1:]))
    return path, mdir


def compile_candidate(args, onnx_path, mdir, c, batch, cache):
    """The program of candidate c, compiled once per distinct command."""
    flags = bc.strategy_flags(c, HOSTS) + (["--stages", c["cuts"]] if c.get("cuts") else [])
    key = tuple(flags)
    if key in cache:
        return cache[key]
    prog = os.path.join(mdir, "prog%02d" % len(cache))
    cmd = bt.compile_cmd(args.cleave, onnx_path, prog, batch) + flags
    wait_quiet()
    t0 = time.perf_counter()
    bp.run_cleave(cmd, "cleave compile (%s)" % bc.cand_name(c))
    cache[key] = {"prog": prog, "compile_s": time.perf_counter() - t0, "compile_cmd": shlex.join(cmd)}
    return cache[key]


def run_candidate(args, cl, mdir, prog, steps):
    wait_quiet()
    metrics = os.path.join(mdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    argv = ["-np", str(HOSTS), "--map-by", "node", prog] + \
        bt.program_cmd(prog, os.path.join(mdir, "x.npy"), os.path.join(mdir, "y.npy"), steps, metrics)[1:]
    t0 = time.perf_counter()
    rc, _, err = cl.script("mpirun", *argv, timeout=RUN_TIMEOUT, cwd=mdir)
    wall = time.perf_counter() - t0
    cmd = "testcluster.sh mpirun " + shlex.join(argv)
    if rc != 0:
        return {"error": "exit %s: %s" % (rc, err.strip()[-500:]), "cmd": cmd}
    durs = bc.step_durations(metrics, steps)
    if isinstance(durs, str):
        return {"error": durs, "cmd": cmd}
    used = durs[args.warmup:]
    return {"median_step_s": statistics.median(used), "min_step_s": min(used), "max_step_s": max(used),
            "steps": steps, "wall_s": wall, "cmd": cmd}


def pricings(args, cal):
    """The ways candidates are priced, the first the one whose plans are
    compiled and whose choice is auto's: name -> cleave plan cluster spec
    (bench_costmodel.cluster_flags)."""
    out = {}
    if not args.no_profile:
        out["profile"] = "profile:" + cal["file"]
    out["rates"] = cal["file"]
    out["links only"] = ("profile:" if not args.no_profile else "") + cal["links_only_file"]
    return out


def bench_model(args, cl, cal, key, onnx_path, mdir, cache):
    batch = MODELS[key][1]
    specs = pricings(args, cal)
    plans = {}
    for name, spec in specs.items():
        pj, cmd = bc.plan_json(args.cleave, onnx_path, batch, HOSTS, spec)
        plans[name] = {"cmd": cmd, "by_key": {bc.cand_key(a): a for a in pj["alternatives"]},
                       "chosen": [bc.cand_key(a) for a in pj["alternatives"] if a.get("why") == "fastest"],
                       "json": pj}
    primary = next(iter(specs))
    plan = plans[primary]["json"]
    alts = plan["alternatives"]
    cands, chosen = bc.select(alts, args.max_candidates)
    log("[%s %s] %d candidates, %d feasible, measuring %d; auto chose %s"
        % (cl.rate, key, len(alts), sum(a["feasible"] for a in alts), len(cands), bc.cand_name(chosen)))
    rows = []
    for c in cands:
        comp = compile_candidate(args, onnx_path, mdir, c, batch, cache)
        steps = max(args.min_steps, min(args.max_steps, int(math.ceil(args.target_s / c["step_s"])) + args.warmup))
        rows.append({"candidate": bc.cand_name(c), "key": list(bc.cand_key(c)), "chosen": c is chosen,
                     "predicted_s": c["step_s"], "comm_bytes": c["comm_bytes"],
                     "predicted_by": {n: (p["by_key"].get(bc.cand_key(c)) or {}).get("step_s")
                                      for n, p in plans.items()},
                     "steps": steps, "runs": [], **comp})
    for r in range(args.runs):
        for row in rows:
            res = run_candidate(args, cl, mdir, row["prog"], row["steps"])
            row["runs"].append(res)
            if "error" in res:
                log("[%s %s] %s failed: %s" % (cl.rate, key, row["candidate"], res["error"]))
            else:
                log("[%s %s] run %d/%d %-26s predicted %9s ms measured %9s ms (%d steps, %.1f s)"
                    % (cl.rate, key, r + 1, args.runs, row["candidate"], bc.ms(row["predicted_s"]),
                       bc.ms(res["median_step_s"]), res["steps"], res["wall_s"]))
    for row in rows:
        ok = [x["median_step_s"] for x in row["runs"] if "error" not in x]
        row["measured_s"] = statistics.median(ok) if ok else None
        row["error_by"] = {n: (p / row["measured_s"] - 1 if ok and p else None)
                           for n, p in row["predicted_by"].items()}
        row["error"] = row["error_by"][primary]
    measured = [r for r in rows if r["measured_s"] is not None]
    best = min(measured, key=lambda r: r["measured_s"]) if measured else None
    choice = {}
    for n, p in plans.items():
        picked = [r for r in measured if tuple(r["key"]) in p["chosen"]]
        choice[n] = {"chosen": picked[0]["candidate"] if picked else "(not measured)",
                     "regret": picked[0]["measured_s"] / best["measured_s"] - 1 if picked and best else None}
    return {"model": key, "batch": batch, "plan_cmd": plans[primary]["cmd"], "primary": primary,
            "cluster": plan["prediction"]["cluster"], "pricings": list(plans),
            "enumerated": len(alts), "feasible": sum(a["feasible"] for a in alts), "rows": rows,
            "chosen": bc.cand_name(chosen), "fastest_measured": best["candidate"] if best else None,
            "regret": choice[primary]["regret"], "choice_by": choice}


# -------------------------------------------------------------------- report


PRICING_NOTE = {
    "profile": "`--profile --cluster FILE`: the model's own kernels timed on this machine, the calibrated links",
    "rates": "`--cluster FILE`: the calibrated file's compute rates and links",
    "links only": "as the first, on the file without the links' allreduce_gbps (the model before calibrate "
                  "measured allreduces)",
}


def median_abs(xs):
    xs = [abs(x) for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def print_report(rep):
    m = rep["machine"]
    names = rep["pricings"]
    print("## Cost model across hosts (bench/bench_cluster.py)\n")
    print("- date: %s UTC; command: `%s`" % (rep["date"], rep["command"]))
    print("- machine: %s, %d cores (%d usable), kernel %s; %s; %s"
          % (m["cpu"], m["cores"], m["cores_usable"], m["kernel"], rep["mpirun"], rep["cleave"]))
    print("- cluster: %d test hosts (network namespaces, scripts/testcluster.sh) x 1 rank, `--map-by node`; "
          "the hosts share this machine's %d cores, so one rank per host is all that gives each rank a "
          "core of its own" % (HOSTS, m["cores"]))
    print("- load average (1, 5, 15 min): before %s, after %s" % (rep["load_before"], rep["load_after"]))
    print("- measured step: median of per-step durations after %d warm-up steps, median of %d round(s); "
          "error = predicted / measured - 1; regret = measured(auto's choice) / fastest measured - 1"
          % (rep["warmup"], rep["runs"]))
    print("- predictions: %s" % "; ".join("**%s**: %s" % (n, PRICING_NOTE[n]) for n in names))
    for r in rep["rates"]:
        cal = r["calibration"]
        print("\n### Links %s\n" % r["rate"])
        print("`%s` (%.0f s):\n\n```\n%s\n```\n" % (cal["cmd"], cal["seconds"], "\n".join(cal["summary"])))
        for g in r["models"]:
            print("**%s**, batch %d, %d candidates (%d feasible); auto (%s) chose %s, fastest measured %s, "
                  "regret **%s**\n" % (MODELS[g["model"]][0], g["batch"], g["enumerated"], g["feasible"],
                                       g["primary"], g["chosen"], g["fastest_measured"], bc.pct(g["regret"])))
            print("| candidate | measured ms | steps | %s |" % " | ".join("%s ms | error" % n for n in names))
            print("|---|---:|---:|%s" % ("---:|---:|" * len(names)))
            for row in sorted(g["rows"], key=lambda x: x["predicted_s"]):
                cells = []
                for n in names:
                    cells += [bc.ms(row["predicted_by"].get(n)), bc.pct(row["error_by"].get(n))]
                print("| %s%s | %s | %d | %s |" % (row["candidate"], " (auto)" if row["chosen"] else "",
                                                  bc.ms(row["measured_s"]), row["steps"], " | ".join(cells)))
            print("\nauto's choice by pricing: %s\n" % "; ".join(
                "%s: %s (%s)" % (n, c["chosen"], bc.pct(c["regret"])) for n, c in g["choice_by"].items()))
    print("### Summary\n")
    print("| links | %s | %s |" % (" | ".join("median \\|error\\| %s" % n for n in names),
                                  " | ".join("%s: auto (regret)" % g for g in rep["model_keys"])))
    print("|---|%s%s" % ("---:|" * len(names), "---|" * len(rep["model_keys"])))
    for r in rep["rates"]:
        cells = ["%s (%s)" % (g["chosen"], bc.pct(g["regret"])) for g in r["models"]]
        errs = [bc.pct(r["median_error_by"].get(n)).lstrip("+") for n in names]
        print("| %s | %s | %s |" % (r["rate"], " | ".join(errs), " | ".join(cells)))
    print()
    for key in rep["model_keys"]:
        picks = [(r["rate"], g["chosen"], g["fastest_measured"]) for r in rep["rates"] for g in r["models"]
                 if g["model"] == key]
        print("- %s: auto chose %s: %s across rates; fastest measured %s"
              % (key, ", ".join("%s at %s" % (p[1], p[0]) for p in picks),
                 "differently" if len({p[1] for p in picks}) > 1 else "the same",
                 ", ".join("%s at %s" % (p[2], p[0]) for p in picks)))
    ok_err = all(r["median_error"] is not None and r["median_error"] <= ERROR_TARGET for r in rep["rates"])
    ok_reg = all(g["regret"] is not None and g["regret"] <= REGRET_TARGET for r in rep["rates"] for g in r["models"])
    print("- targets (%s): median |error| <= %d%% at every rate: %s; regret <= %d%% everywhere: %s"
          % (names[0], ERROR_TARGET * 100, "met" if ok_err else "missed", REGRET_TARGET * 100,
             "met" if ok_reg else "missed"))


# ---------------------------------------------------------------------- main


def git_head():
    p = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD"]).returncode != 0
    return (p.stdout.strip() or "?") + (" with local changes" if dirty else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build", "cleave"))
    ap.add_argument("--rates", default="unshaped,100mbit", help="link rates, tc's units or 'unshaped'")
    ap.add_argument("--models", default="deep,gpt")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--target-s", type=float, default=4.0, help="seconds per run at the predicted step")
    ap.add_argument("--min-steps", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=80)
    ap.add_argument("--max-candidates", type=int, default=0, help="0: every feasible candidate")
    ap.add_argument("--full-calibrate", action="store_true", help="calibrate without --quick")
    ap.add_argument("--no-profile", action="store_true",
                    help="price and choose on the calibrated file's rates, not --profile with its links")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=None, help="also write the results as JSON")
    args = ap.parse_args()
    args.cleave = os.path.abspath(args.cleave)
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    for k in keys:
        if k not in MODELS:
            sys.exit("--models: unknown model '%s' (known: %s)" % (k, ", ".join(MODELS)))
    if os.geteuid() != 0:
        sys.exit("bench_cluster.py needs root to create the test cluster's network namespaces")
    if not os.access(args.cleave, os.X_OK):
        sys.exit("--cleave %s: not an executable" % args.cleave)
    bt.import_torch()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    work = args.workdir or tempfile.mkdtemp(prefix="cleave-bench-cluster-")
    os.makedirs(work, exist_ok=True)
    prefix = "cleavebench%d" % (os.getpid() % 100000)
    rep = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
           "command": shlex.join([sys.executable] + sys.argv), "machine": bt.machine_info(),
           "mpirun": bdp.mpirun_version(), "cleave": "%s at %s" % (bt.cleave_version(args.cleave), git_head()),
           "warmup": args.warmup, "runs": args.runs, "model_keys": keys, "rates": []}
    wait_quiet()
    rep["load_before"] = bdp.load_averages()
    open(HELPER, "w").close()
    try:
        models = {k: prepare_model(k, work, 64 * MODELS[k][1]) for k in keys}
        cache = {k: {} for k in keys}
        for rate in rates:
            with Cluster(prefix, work, rate) as cl:
                cal = calibrate(args, cl, work)
                groups = [bench_model(args, cl, cal, k, models[k][0], models[k][1], cache[k]) for k in keys]
            rows = [row for g in groups for row in g["rows"]]
            by = {n: median_abs(r["error_by"].get(n) for r in rows) for n in groups[0]["pricings"]}
            rep["pricings"] = groups[0]["pricings"]
            rep["rates"].append({"rate": rate, "calibration": cal, "models": groups,
                                 "median_error": by[groups[0]["primary"]], "median_error_by": by})
    except (KeyboardInterrupt, Stop) as e:
        sys.exit("stopped (%s); the test cluster is down" % (str(e) or "Ctrl-C"))
    finally:
        if os.path.exists(HELPER):
            os.remove(HELPER)
    rep["load_after"] = bdp.load_averages()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)
    print_report(rep)


if __name__ == "__main__":
    main()
