#!/usr/bin/python3
"""Data-parallel training throughput: cleave on 2 MPI ranks against PyTorch DDP.

For each model below (the models of bench_train.py, imported from it) the
script exports the ONNX file, writes a synthetic data set, compiles three
cleave programs once (one rank; --ranks 2 --strategy dp with each
--bucket-mb setting) and then alternates, --runs times:

  cleave 1    the single-rank program, run directly;
  cleave dp2  each dp program under `mpirun --oversubscribe -np 2`;
  torch 1     bench_train.py's torch worker: one process, one thread;
  torch ddp2  two processes of one thread each, DistributedDataParallel over
              gloo on 127.0.0.1, each on its half of the same global batch.

Every side reports samples of the global batch per second over the steps
after a 10% warm-up (cleave: from the metrics' elapsed_s on rank 0; torch:
time.perf_counter on rank 0).  From the dp programs' comm_wait_s and
allreduce_s the script also reports the share of the gradient allreduce
hidden behind the backward pass, 1 - sum(comm_wait_s) / sum(allreduce_s).
The table gives the medians and the scaling efficiency of each side,
(2-rank samples/s / 1-rank samples/s) / 2.  All sides start from the same
weights and see the same batches, so the global-batch loss of the first and
the last step must agree across all of them; the script checks that.

With --baseline OLD every cleave program is also compiled by the compiler
OLD, and each round runs every program of --cleave right before the same
program of OLD (new, old, new, old, ...), so that load on the machine that
comes and goes falls on both builds alike.  A further table gives, per
program, each build's median samples/s with its range over the runs, the
ratio new/old of the medians, and the range of the ratios of the two runs
of a round.  The baseline's programs must train to the same losses.

    /usr/bin/python3 bench/bench_dp.py [--cleave PATH] [--baseline OLD] [--runs 5]
        [--out results.json]

Needs Debian's /usr/bin/python3 (torch 1.13 with gloo, numpy), Open MPI's
mpirun and a built cleave (by default build-dev/cleave next to this folder).
Progress goes to stderr, the report to stdout; the exit status is 1 when the
losses differ.
"""

import argparse
import datetime
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_train as bt  # noqa: E402  (models, torch worker, machine info)

RANKS = 2
DEFAULT_BUCKETS_MB = [25.0, 1.0]   # cleave's default (as DDP's) and a small one
DDP_BUCKET_MB = 25.0               # torch.nn.parallel.DistributedDataParallel's default
BASE = "_base"                     # added to the sides and files of --baseline's programs
LOOPBACK = "127.0.0.1"

# model (a name of bench_train.MODELS), global batch, default steps.  Each of
# the two ranks gets half of the batch (64, 32 and 32 rows).  The steps keep a
# default run (5 runs of five measurements per model, plus 3 compiles per
# model) at four to six minutes on the 2-core development machine, depending
# on what else runs on it; starting the processes (Python with torch, mpirun,
# gloo's rendezvous) takes a good part of that.
DP_MODELS = [
    ("mlp_784_1024_1024_10", 128, 20),
    ("mlp_784_256_256_10", 64, 160),
    ("deep_mlp_16x512", 64, 20),
]

np = None
torch = None


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def import_torch():
    global np, torch
    bt.import_torch()
    np, torch = bt.np, bt.torch




def mpi_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def free_port():
    """A TCP port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def load_averages():
    try:
        with open("/proc/loadavg") as f:
            return [float(v) for v in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------- torch DDP


def ddp_worker(job):
    """One rank of a DDP run, started with RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT in the environment.  Rank 0 prints the result as JSON."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    model = bt.build_model(job["in_dim"], job["hidden"])
    model.load_state_dict(torch.load(job["weights"]))
    model.train()
    ddp = DistributedDataParallel(model, bucket_cap_mb=job["bucket_mb"])
    x_all = torch.from_numpy(np.load(job["x"]))
    y_all = torch.from_numpy(np.load(job["y"]))
    batch, steps, warm = job["batch"], job["steps"], job["warmup"]
    local = batch // world
    opt = torch.optim.SGD(ddp.parameters(), lr=job["lr"])
    loss_fn = torch.nn.functional.cross_entropy

    def step(i):
        # rank r trains on positions [r*L, (r+1)*L) of global batch i, as
        # the ranks of a cleave dp program do
        lo = i * batch + rank * local
        loss = loss_fn(ddp(x_all[lo:lo + local]), y_all[lo:lo + local])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    first = step(0)
    for i in range(1, warm):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(warm, steps):
        last = step(i)
    t1 = time.perf_counter()

    # after the clock: the global-batch mean loss of the first and last
    # step (the mean of the ranks' means: the halves are equal) and the
    # slowest rank's time
    losses = torch.stack([first, last]).double()
    dist.all_reduce(losses)
    losses /= world
    slowest = torch.tensor([t1 - t0], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        # DDP puts every gradient in one bucket for the first step, then
        # rebuilds the buckets in the order the gradients came (the first
        # one capped at 1 MB, the others at bucket_cap_mb)
        try:
            info = ddp._get_ddp_logging_data()
            sizes = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or "")
            bucket_bytes = [int(v) for v in sizes.replace(",", " ").split()]
        except (AttributeError, RuntimeError, ValueError):
            bucket_bytes = None
        timed = steps - warm
        json.dump({
            "samples_per_s": timed * batch / (t1 - t0),
            "timed_steps": timed,
            "timed_s": t1 - t0,
            "slowest_rank_timed_s": slowest.item(),
            "loss_first": losses[0].item(),
            "loss_last": losses[1].item(),
            "threads": torch.get_num_threads(),
            "bucket_cap_mb": job["bucket_mb"],
            "bucket_bytes": bucket_bytes,
        }, sys.stdout)
        sys.stdout.write("\n")
    # End without tearing down: in torch 1.13 the destructor of DDP's
    # process group joins a gloo worker thread while holding the GIL, and
    # that thread can be waiting for the GIL to free a tensor, which hangs
    # the process now and then.  Everything is done and written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def ddp_env(rank, port):
    """A DDP process's environment: bench_train's torch_env (one thread,
    OpenBLAS choosing its kernels, malloc keeping its memory) and the
    rendezvous."""
    env = bt.torch_env(1)
    env.update(RANK=str(rank), WORLD_SIZE=str(RANKS), MASTER_ADDR=LOOPBACK,
               MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    return env


def ddp_cmd(job_path):
    return [sys.executable, os.path.abspath(__file__), "--ddp-worker", job_path]


def run_ddp(job_path):
    """Starts the ranks of one DDP run and returns rank 0's result.  Their
    output goes to files, so neither can block on a full pipe; if a rank
    fails the other is stopped (it would wait for it in a collective)."""
    port = free_port()
    folder = os.path.dirname(job_path)
    procs, files = [], []
    for rank in range(RANKS):
        out = open(os.path.join(folder, "ddp_rank%d.out" % rank), "w+")
        err = open(os.path.join(folder, "ddp_rank%d.err" % rank), "w+")
        files.append((out, err))
        procs.append(subprocess.Popen(ddp_cmd(job_path), env=ddp_env(rank, port),
                                      stdout=out, stderr=err, text=True))
    deadline = time.monotonic() + bt.TIMEOUT
    while any(p.poll() is None for p in procs):
        failed = any(p.returncode not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            break
        time.sleep(0.05)
    texts = []
    for out, err in files:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    if any(p.returncode != 0 for p in procs):
        sys.exit("torch DDP run failed (port %d):\n%s" % (port, "\n".join(
            "rank %d: exit %s\n%s" % (r, p.returncode, texts[r][1].strip())
            for r, p in enumerate(procs))))
    return json.loads(texts[0][0].strip().splitlines()[-1])


# -------------------------------------------------------------- cleave side


def dp_compile_cmd(cleave, onnx_path, prog, batch, bucket_mb):
    cmd = bt.compile_cmd(cleave, onnx_path, prog, batch)
    if bucket_mb is not None:
        cmd += ["--ranks", str(RANKS), "--strategy", "dp", "--bucket-mb", "%g" % bucket_mb]
    return cmd


def dp_program_cmd(prog, x, y, steps, metrics, bucket_mb):
    cmd = bt.program_cmd(prog, x, y, steps, metrics)
    if bucket_mb is not None:
        cmd = ["mpirun", "--oversubscribe", "-np", str(RANKS)] + cmd
    return cmd


def compile_program(cleave, onnx_path, prog, batch, bucket_mb, plan_path):
    cmd = dp_compile_cmd(cleave, onnx_path, prog, batch, bucket_mb) + ["--emit-plan", plan_path]
    t0 = time.perf_counter()
    bt.run_checked(cmd, "cleave compile")
    compile_s = time.perf_counter() - t0
    with open(plan_path) as f:
        plan = json.load(f)
    buckets = [b["bytes"] for b in plan["rank_plans"][0].get("buckets") or []]
    return {"compile_s": compile_s, "bucket_bytes": buckets}


def run_program(prog, x, y, batch, steps, warm, metrics, bucket_mb):
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = dp_program_cmd(prog, x, y, steps, metrics, bucket_mb)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=bt.TIMEOUT,
                       env=mpi_env() if bucket_mb is not None else None)
    if p.returncode != 0:
        sys.exit("training program failed (exit %d): %s\n%s"
                 % (p.returncode, shlex.join(cmd), p.stderr))
    recs = {}
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "step" in rec:
                recs[rec["step"]] = rec
    if sorted(recs) != list(range(1, steps + 1)):
        sys.exit("%s: expected metrics for steps 1..%d, got %d lines" % (metrics, steps, len(recs)))
    timed_s = recs[steps]["elapsed_s"] - recs[warm]["elapsed_s"]
    timed = steps - warm
    out = {
        "samples_per_s": timed * batch / timed_s,
        "timed_steps": timed,
        "timed_s": timed_s,
        "loss_first": recs[1]["loss"],
        "loss_last": recs[steps]["loss"],
    }
    if bucket_mb is not None:
        measured = [recs[s] for s in range(warm + 1, steps + 1)]
        wait = sum(r["comm_wait_s"] for r in measured)
        allreduce = sum(r["allreduce_s"] for r in measured)
        out.update({
            "comm_wait_s": wait,
            "allreduce_s": allreduce,
            "hidden": 1.0 - wait / allreduce if allreduce > 0 else None,
        })
    return out


# ------------------------------------------------------------------ baseline


def baseline_compiler(ap, path):
    """--baseline as an absolute path.  Each compiler links the runtime of
    the build it comes from (its path is built in), unless
    CLEAVE_RUNTIME_DIR names one runtime for both; the comparison would
    then leave out the runtime, so that is refused."""
    if "CLEAVE_RUNTIME_DIR" in os.environ:
        ap.error("--baseline needs CLEAVE_RUNTIME_DIR unset, so that each compiler links "
                 "the runtime of its own build")
    path = os.path.abspath(path)
    if not os.access(path, os.X_OK):
        sys.exit("%s is not an executable; build the baseline or fix --baseline" % path)
    return path


def compare(new, old, key):
    """One configuration's runs of the new build against the baseline's:
    each build's median of `key` and its range, the ratio new/old of the
    medians, and the range of new/old within a round.  The two runs of a
    round follow each other, so their ratio moves least with the load."""
    a, b = [r[key] for r in new], [r[key] for r in old]
    rounds = [x / y for x, y in zip(a, b)]
    return {"new": statistics.median(a), "new_min": min(a), "new_max": max(a),
            "old": statistics.median(b), "old_min": min(b), "old_max": max(b),
            "ratio": statistics.median(a) / statistics.median(b),
            "round_ratio_min": min(rounds), "round_ratio_max": max(rounds)}


def compare_cells(c, fmt):
    """A row's cells for compare()'s result, the measure written by fmt."""
    return [fmt(c["new"]), "%s..%s" % (fmt(c["new_min"]), fmt(c["new_max"])),
            fmt(c["old"]), "%s..%s" % (fmt(c["old_min"]), fmt(c["old_max"])),
            "%.3f" % c["ratio"], "%.3f..%.3f" % (c["round_ratio_min"], c["round_ratio_max"])]


COMPARE_HEAD = ["new", "new min..max", "old", "old min..max", "new/old", "new/old in a round"]


# ---------------------------------------------------------------------- main


def cleave_programs(args):
    """(side, --bucket-mb setting or None for one rank, compiler, file tag)
    of every cleave program, in the order a round runs them: each program
    of the baseline right after the same program of --cleave."""
    settings = [("cleave_1", None, "1")] + [("cleave_dp2_b%g" % b, b, "dp2_b%g" % b)
                                            for b in args.bucket_mb]
    builds = [("", args.cleave)] + ([(BASE, args.baseline)] if args.baseline else [])
    return [(side + suffix, b, cleave, tag + suffix)
            for side, b, tag in settings for suffix, cleave in builds]


def median_of(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def bench_model(args, workdir, name, in_dim, hidden, batch, steps):
    mdir = os.path.join(workdir, name)
    os.makedirs(mdir)
    path = lambda f: os.path.join(mdir, f)  # noqa: E731
    onnx_path, weights, x_path, y_path = path("model.onnx"), path("weights.pt"), path("x.npy"), path("y.npy")

    torch.manual_seed(bt.WEIGHT_SEED)
    model = bt.build_model(in_dim, hidden)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(batch, in_dim),), onnx_path,
                          export_params=True, opset_version=bt.OPSET,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False,
                          input_names=["input"], output_names=["logits"])
    torch.save(model.state_dict(), weights)
    params = sum(p.numel() for p in model.parameters())

    rng = np.random.default_rng(bt.DATA_SEED)
    rows = steps * batch
    np.save(x_path, rng.standard_normal((rows, in_dim), dtype=np.float32))
    np.save(y_path, rng.integers(0, bt.N_CLASSES, size=rows, dtype=np.int64))

    warm = bt.warmup_steps(steps)
    job = {"in_dim": in_dim, "hidden": hidden, "weights": weights, "x": x_path, "y": y_path,
           "batch": batch, "steps": steps, "warmup": warm, "lr": bt.LR}
    ddp_job = dict(job, bucket_mb=DDP_BUCKET_MB)
    ddp_job_path = path("ddp_job.json")
    with open(ddp_job_path, "w") as f:
        json.dump(ddp_job, f)

    programs = cleave_programs(args)
    progs, compiled = {}, {}
    for n, b, cleave, tag in programs:
        progs[n] = path("prog_" + tag)
        compiled[n] = compile_program(cleave, onnx_path, progs[n], batch, b,
                                      path("plan_%s.json" % tag))
    log("[%s] %d params, global batch %d (%d per rank), %d steps (%d warm-up), %d runs; "
        "dp buckets: %s" % (name, params, batch, batch // RANKS, steps, warm, args.runs,
                            "; ".join("%g MB -> %d" % (b, len(compiled["cleave_dp2_b%g" % b]
                                                              ["bucket_bytes"]))
                                      for b in args.bucket_mb)))

    names = [p[0] for p in programs] + ["torch_1", "torch_ddp2"]
    runs = {n: [] for n in names}
    script_train = os.path.join(HERE, "bench_train.py")
    for r in range(args.runs):
        for n, b, _, _ in programs:
            res = run_program(progs[n], x_path, y_path, batch, steps, warm,
                              path("metrics_%s.jsonl" % n), b)
            runs[n].append(res)
        # the first run also probes which kernels torch's BLAS and oneDNN use
        runs["torch_1"].append(bt.run_torch(script_train, dict(job, kernels=r == 0)))
        runs["torch_ddp2"].append(run_ddp(ddp_job_path))
        log("[%s] run %d/%d samples/s: %s" % (
            name, r + 1, args.runs,
            ", ".join("%s %.1f" % (n, runs[n][-1]["samples_per_s"]) for n in names)))

    med = {n: median_of(runs[n], "samples_per_s") for n in names}
    c1, t1 = med["cleave_1"], med["torch_1"]
    dp = {}
    for b in args.bucket_mb:
        n = "cleave_dp2_b%g" % b
        dp["%g" % b] = {
            "samples_per_s": med[n],
            "efficiency": med[n] / c1 / RANKS,
            "hidden": median_of(runs[n], "hidden"),
            "allreduce_s_per_step": median_of(runs[n], "allreduce_s") / (steps - warm),
            "comm_wait_s_per_step": median_of(runs[n], "comm_wait_s") / (steps - warm),
            "buckets": len(compiled[n]["bucket_bytes"]),
            "bucket_bytes": compiled[n]["bucket_bytes"],
        }

    # every side must have trained on the same numbers
    ref = runs["cleave_1"][0]
    loss_ok = all(bt.close(ref["loss_first"], runs[n][0]["loss_first"])
                  and bt.close(ref["loss_last"], runs[n][0]["loss_last"]) for n in names)
    if not loss_ok:
        log("[%s] WARNING: losses differ: %s" % (name, ", ".join(
            "%s %.6g/%.6g" % (n, runs[n][0]["loss_first"], runs[n][0]["loss_last"]) for n in names)))

    rel = lambda p: p.replace(mdir + os.sep, "")  # noqa: E731
    commands = {"compile": {}, "run": {}}
    for n, b, cleave, _ in programs:
        commands["compile"][n] = shlex.join(dp_compile_cmd(cleave, "model.onnx", rel(progs[n]),
                                                           batch, b))
        commands["run"][n] = shlex.join(dp_program_cmd("./" + rel(progs[n]), "x.npy", "y.npy",
                                                       steps, "metrics.jsonl", b))
    thr = "env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 %s " % " ".join(
        "%s=%s" % kv for kv in sorted(bt.MALLOC_KEEP.items()))
    commands["run"]["torch_1"] = thr + shlex.join(
        [sys.executable, script_train, "--torch-worker", rel(json.dumps(job))])
    commands["run"]["torch_ddp2"] = (
        "for r in 0 1; do %sRANK=$r WORLD_SIZE=%d MASTER_ADDR=%s MASTER_PORT=PORT "
        "GLOO_SOCKET_IFNAME=lo %s & done; wait   # ddp_job.json: %s"
        % (thr, RANKS, LOOPBACK, shlex.join(ddp_cmd("ddp_job.json")), rel(json.dumps(ddp_job))))

    return {
        "model": name,
        "layers": [in_dim] + hidden + [bt.N_CLASSES],
        "params": params,
        "batch": batch,
        "local_batch": batch // RANKS,
        "steps": steps,
        "warmup_steps": warm,
        "samples_per_s": med,
        "cleave_dp2": dp,
        "torch_efficiency": med["torch_ddp2"] / t1 / RANKS,
        "cleave_over_torch_1": c1 / t1,
        "cleave_dp2_over_ddp2": {k: v["samples_per_s"] / med["torch_ddp2"] for k, v in dp.items()},
        "ddp_bucket_cap_mb": DDP_BUCKET_MB,
        "ddp_bucket_bytes": runs["torch_ddp2"][0].get("bucket_bytes"),
        "compile_s": {n: compiled[n]["compile_s"] for n, _, _, _ in programs},
        "baseline": {n: compare(runs[n], runs[n + BASE], "samples_per_s")
                     for n, _, _, _ in programs if not n.endswith(BASE)} if args.baseline else None,
        "loss_check": {"ok": loss_ok, "rtol": bt.LOSS_RTOL,
                       "first": {n: runs[n][0]["loss_first"] for n in names},
                       "last": {n: runs[n][0]["loss_last"] for n in names}},
        "commands": commands,
        "runs": runs,
        "torch_blas": runs["torch_1"][0].get("blas", []),
        "torch_kernels": runs["torch_1"][0].get("kernels"),
    }


def fmt_table(head, rows):
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join("%-" + str(w) + "s" if i == 0 else "%" + str(w) + "s"
                    for i, w in enumerate(widths))
    return [fmt % tuple(head)] + [fmt % tuple(r) for r in rows]


def print_report(report):
    m = report["machine"]
    bks = report["bucket_mb"]
    la = lambda v: "/".join("%.2f" % x for x in v) if v else "?"  # noqa: E731
    print("command: %s" % report["command"])
    print("machine: %s, %d cores (%d usable), Linux %s"
          % (m["cpu"], m["cores"], m["cores_usable"], m["kernel"]))
    print("         2 ranks (or 2 DDP processes) take both cores; mpirun binds rank r to core r")
    print("cleave:  %s (%s); %s" % (report["cleave"], report["cleave_version"], report["mpirun"]))
    if report["baseline"]:
        print("base:    %s (%s), its programs run right after the same programs of cleave"
              % (report["baseline"], report["baseline_version"]))
    print("torch:   %s, 1 thread per process, DDP over gloo on %s (bucket_cap_mb %g), BLAS %s"
          % (report["torch_version"], LOOPBACK, DDP_BUCKET_MB,
             ", ".join(report["torch_blas"]) or "?"))
    if report.get("torch_kernels"):
        for line in bt.kernels_header(report["torch_kernels"]):
            print(line)
    print("load:    load average (1/5/15 min) %s before, %s after; %.0f s in all"
          % (la(report["load_before"]), la(report["load_after"]), report["total_s"]))
    print("medians of %d alternating runs; samples/s of the global batch over the steps after "
          "a %d%% warm-up; eff = (2-rank samples/s / 1-rank samples/s) / 2"
          % (report["runs"], int(bt.WARMUP_FRACTION * 100)))
    print()

    head = ["model", "batch", "steps", "cleave 1"]
    for b in bks:
        head += ["dp2 b%g" % b, "eff"]
    head += ["torch 1", "ddp2", "eff"] + ["dp2 b%g/ddp2" % b for b in bks]
    rows = []
    for r in report["results"]:
        s = r["samples_per_s"]
        row = [r["model"], "%d=2x%d" % (r["batch"], r["local_batch"]), str(r["steps"]),
               "%.1f" % s["cleave_1"]]
        for b in bks:
            d = r["cleave_dp2"]["%g" % b]
            row += ["%.1f" % d["samples_per_s"], "%.2f" % d["efficiency"]]
        row += ["%.1f" % s["torch_1"], "%.1f" % s["torch_ddp2"], "%.2f" % r["torch_efficiency"]]
        row += ["%.2f" % r["cleave_dp2_over_ddp2"]["%g" % b] for b in bks]
        rows.append(row)
    for line in fmt_table(head, rows):
        print(line)
    print()

    if report["baseline"]:
        print("cleave against the baseline: samples/s, median and range over the %d runs of each "
              "build; new/old above 1: cleave is faster" % report["runs"])
        rows = [[r["model"], n] + compare_cells(c, lambda v: "%.1f" % v)
                for r in report["results"] for n, c in r["baseline"].items()]
        for line in fmt_table(["model", "program"] + COMPARE_HEAD, rows):
            print(line)
        print()

    print("cleave dp2 gradient allreduce, per measured step (medians over the runs):")
    head = ["model", "bucket MB", "buckets", "allreduce ms", "comm_wait ms", "hidden"]
    rows = []
    for r in report["results"]:
        for b in bks:
            d = r["cleave_dp2"]["%g" % b]
            rows.append([r["model"], "%g" % b, str(d["buckets"]),
                         "%.3f" % (1e3 * d["allreduce_s_per_step"]),
                         "%.3f" % (1e3 * d["comm_wait_s_per_step"]),
                         "%.0f%%" % (100 * d["hidden"]) if d["hidden"] is not None else "-"])
    for line in fmt_table(head, rows):
        print(line)
    print("hidden = 1 - sum(comm_wait_s) / sum(allreduce_s) over the measured steps of a run")
    def mb(sizes):
        if len(sizes) <= 4:
            return "MB " + " + ".join("%.2f" % (x / 2**20) for x in sizes)
        return "%.2f MB in all, the largest %.2f MB" % (sum(sizes) / 2**20, max(sizes) / 2**20)

    for r in report["results"]:
        for b in bks:
            d = r["cleave_dp2"]["%g" % b]
            print("%s cleave --bucket-mb %g: %d bucket(s), %s"
                  % (r["model"], b, d["buckets"], mb(d["bucket_bytes"])))
        ddp = r["ddp_bucket_bytes"]
        print("%s torch DDP bucket_cap_mb %g: %s"
              % (r["model"], DDP_BUCKET_MB, "%d bucket(s) after step 1, %s" % (len(ddp), mb(ddp))
                 if ddp else "bucket sizes unknown"))
    print()

    for r in report["results"]:
        lc = r["loss_check"]
        print("%s: global-batch loss step 1 / step %d: %s (%s)"
              % (r["model"], r["steps"],
                 ", ".join("%s %.6f/%.6f" % (n, lc["first"][n], lc["last"][n]) for n in lc["first"]),
                 "agree" if lc["ok"] else "DIFFER"))
    print()
    print("every run, samples/s in run order:")
    for r in report["results"]:
        print("  %s" % r["model"])
        width = max([16] + [len(n) for n in r["runs"]])   # the baseline's names are longer
        for n, runs in r["runs"].items():
            print("    %-*s %s" % (width, n, " ".join("%.1f" % x["samples_per_s"] for x in runs)))
    print()
    print("per model, in its work folder (the dp programs under mpirun; set "
          "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 as root):")
    for r in report["results"]:
        print("  %s:" % r["model"])
        for c in r["commands"]["compile"].values():
            print("    %s" % c)
        for c in r["commands"]["run"].values():
            print("    %s" % c)


def mpirun_version():
    try:
        p = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=60)
        return p.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError) as e:
        sys.exit("cannot run mpirun: %s" % e)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--ddp-worker":
        import_torch()
        with open(sys.argv[2]) as f:
            ddp_worker(json.load(f))
        return

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build-dev", "cleave"),
                    help="the cleave compiler (default: %(default)s)")
    ap.add_argument("--baseline", metavar="OLD",
                    help="also compile every cleave program with the compiler OLD, run the two "
                    "builds' programs in turn and compare them")
    ap.add_argument("--runs", type=int, default=5, help="runs of every side per model (default 5)")
    ap.add_argument("--steps", type=int,
                    help="steps per run for every model (default: %s)"
                    % ", ".join("%d for %s" % (m[2], m[0]) for m in DP_MODELS))
    ap.add_argument("--models", nargs="+", choices=[m[0] for m in DP_MODELS],
                    help="only these models")
    ap.add_argument("--bucket-mb", nargs="+", type=float, default=DEFAULT_BUCKETS_MB,
                    metavar="MB", help="--bucket-mb settings of the cleave dp programs "
                    "(default: %s)" % " ".join("%g" % b for b in DEFAULT_BUCKETS_MB))
    ap.add_argument("--out", help="also write the results as JSON to this file")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.steps is not None and args.steps < 2:
        ap.error("--steps must be at least 2 (one warm-up step, one timed)")
    if any(b <= 0 for b in args.bucket_mb) or len(set(args.bucket_mb)) != len(args.bucket_mb):
        ap.error("--bucket-mb takes distinct positive sizes")
    args.cleave = os.path.abspath(args.cleave)
    if not os.access(args.cleave, os.X_OK):
        sys.exit("%s is not an executable; build cleave or pass --cleave" % args.cleave)
    if args.baseline:
        args.baseline = baseline_compiler(ap, args.baseline)

    import_torch()
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        sys.exit("this torch has no torch.distributed with gloo")
    torch.set_num_threads(1)
    report = {
        "command": shlex.join([sys.executable] + sys.argv),
        "machine": bt.machine_info(),
        "cleave": args.cleave,
        "cleave_version": bt.cleave_version(args.cleave),
        "baseline": args.baseline,
        "baseline_version": bt.cleave_version(args.baseline) if args.baseline else None,
        "mpirun": mpirun_version(),
        "torch_version": torch.__version__,
        "ranks": RANKS,
        "runs": args.runs,
        "bucket_mb": args.bucket_mb,
        "ddp_bucket_cap_mb": DDP_BUCKET_MB,
        "warmup_fraction": bt.WARMUP_FRACTION,
        "lr": bt.LR,
        "load_before": load_averages(),
        "results": [],
    }
    t_start = time.perf_counter()
    layers = {m[0]: (m[1], m[2]) for m in bt.MODELS}
    with tempfile.TemporaryDirectory(prefix="cleave-bench-dp-") as workdir:
        for name, batch, steps in DP_MODELS:
            if args.models and name not in args.models:
                continue
            in_dim, hidden = layers[name]
            report["results"].append(
                bench_model(args, workdir, name, in_dim, hidden, batch, args.steps or steps))
    report["total_s"] = time.perf_counter() - t_start
    report["load_after"] = load_averages()
    report["torch_blas"] = report["results"][0]["torch_blas"]
    report["torch_kernels"] = report["results"][0]["torch_kernels"]
    log("done in %.0f s" % report["total_s"])

    print_report(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if not all(r["loss_check"]["ok"] for r in report["results"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
