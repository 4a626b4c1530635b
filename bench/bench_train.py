#!/usr/bin/python3
"""Training throughput of cleave-compiled programs against PyTorch at the same thread count.

For each model below the script exports an ONNX file (opset 13, fixed batch,
training mode, no constant folding), writes a synthetic data set, and then
alternates, --runs times:

  cleave  `cleave compile` (timed), then the program for K steps with
          --metrics; samples/s over the steps after the warm-up, from the
          metrics' elapsed_s (so loading the data is not counted);
  torch   a fresh process (OMP_NUM_THREADS=T, torch.set_num_threads(T)) that
          trains the same model from the same initial weights on the same
          batches with torch.optim.SGD and cross-entropy; samples/s from
          time.perf_counter around the steps after the same warm-up.

T is --threads (default 1): cleave compiles with --threads T, and torch
gets T intra-op threads, with OMP_NUM_THREADS, MKL_NUM_THREADS and
OPENBLAS_NUM_THREADS set to T for its BLAS.

The table gives the medians.  Both sides train on identical weights and
batches, so the loss of the first and of the last step must agree: the script
checks that, to be sure both sides do the same work.

    /usr/bin/python3 bench/bench_train.py [--cleave PATH] [--runs 5] [--steps N]
                                          [--threads T] [--out results.json]

Needs Debian's /usr/bin/python3 (torch 1.13, numpy); the default --cleave is
build-dev/cleave next to this folder.  Progress goes to stderr, the table to
stdout.
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LR = 0.01
OPSET = 13
WEIGHT_SEED = 0
DATA_SEED = 1234
N_CLASSES = 10
WARMUP_FRACTION = 0.10
TIMEOUT = 900            # seconds for any one compile or training process
LOSS_RTOL = 1e-3         # first/last step loss, cleave against torch

# name, input width, hidden widths, batch, default steps.  Torch's side
# dominates the run time (its BLAS is the slow part on the development
# machine), so the two big models get few steps: the defaults keep a full run
# of 5 runs per side at about four minutes on the 2-core development machine.
MODELS = [
    ("mlp_784_1024_1024_10", 784, [1024, 1024], 128, 16),
    ("mlp_784_256_256_10", 784, [256, 256], 32, 200),
    ("deep_mlp_16x512", 512, [512] * 16, 64, 12),
]

np = None
torch = None


def import_torch():
    global np, torch
    try:
        import numpy
        import torch as t
    except ImportError as e:
        sys.exit("bench_train.py needs torch and numpy (%s); run it with /usr/bin/python3" % e)
    np, torch = numpy, t


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build_model(in_dim, hidden):
    """Linear+ReLU for every hidden width, then a Linear head to N_CLASSES."""
    nn = torch.nn
    layers = []
    width = in_dim
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, N_CLASSES))
    return nn.Sequential(*layers)


def warmup_steps(steps):
    return max(1, int(round(steps * WARMUP_FRACTION)))


# ----------------------------------------------------------------- torch side


def blas_libraries():
    """Shared libraries mapped into this process whose name mentions BLAS,
    resolved through symlinks (Debian picks libblas.so.3 by alternatives)."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "blas" in os.path.basename(parts[5]).lower():
                    found.add(os.path.realpath(parts[5]))
    except OSError:
        pass
    return sorted(found)


def torch_worker(job):
    """Runs in its own process: one timed torch training run, result as JSON."""
    torch.set_num_threads(job.get("threads", 1))
    model = build_model(job["in_dim"], job["hidden"])
    model.load_state_dict(torch.load(job["weights"]))
    model.train()
    x_all = torch.from_numpy(np.load(job["x"]))
    y_all = torch.from_numpy(np.load(job["y"]))
    batch, steps, warm = job["batch"], job["steps"], job["warmup"]
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"])
    loss_fn = torch.nn.functional.cross_entropy

    def step(i):
        x = x_all[i * batch:(i + 1) * batch]
        y = y_all[i * batch:(i + 1) * batch]
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first = step(0).item()
    for i in range(1, warm):
        step(i)
    t0 = time.perf_counter()
    for i in range(warm, steps):
        loss = step(i)
    t1 = time.perf_counter()
    timed = steps - warm
    json.dump({
        "samples_per_s": timed * batch / (t1 - t0),
        "timed_steps": timed,
        "timed_s": t1 - t0,
        "loss_first": first,
        "loss_last": loss.item(),
        "threads": torch.get_num_threads(),
        "blas": blas_libraries(),
    }, sys.stdout)
    sys.stdout.write("\n")


def run_torch(script, job):
    t = str(job.get("threads", 1))  # bench_dp.py's jobs say nothing: 1
    env = dict(os.environ, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t)
    cmd = [sys.executable, script, "--torch-worker", json.dumps(job)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if p.returncode != 0:
        sys.exit("torch run failed (exit %d):\n%s" % (p.returncode, p.stderr))
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- cleave side


def compile_cmd(cleave, onnx_path, prog, batch, threads=1):
    """The compile command; the other benchmarks call it with 4 arguments."""
    cmd = [cleave, "compile", onnx_path, "-o", prog, "--batch", str(batch),
           "--loss", "ce", "--optimizer", "sgd", "--lr", repr(LR)]
    return cmd + ["--threads", str(threads)] if threads != 1 else cmd


def program_cmd(prog, x, y, steps, metrics):
    return [prog, "--data", "input=" + x, "--data", "labels=" + y, "--steps", str(steps),
            "--metrics", metrics, "--log-every", "0"]


def run_checked(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if p.returncode != 0:
        sys.exit("%s failed (exit %d): %s\n%s" % (what, p.returncode, shlex.join(cmd), p.stderr))
    return p


def run_cleave(cleave, onnx_path, prog, x, y, batch, steps, warm, metrics, threads):
    t0 = time.perf_counter()
    run_checked(compile_cmd(cleave, onnx_path, prog, batch, threads), "cleave compile")
    compile_s = time.perf_counter() - t0

    if os.path.exists(metrics):
        os.remove(metrics)
    run_checked(program_cmd(prog, x, y, steps, metrics), "training program")
    elapsed, losses = {}, {}
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "step" in rec:
                elapsed[rec["step"]] = rec["elapsed_s"]
                losses[rec["step"]] = rec["loss"]
    if sorted(elapsed) != list(range(1, steps + 1)):
        sys.exit("%s: expected metrics for steps 1..%d, got %d lines" % (metrics, steps, len(elapsed)))
    # elapsed_s of step s is the time from the start of training to the end
    # of step s, so steps warm+1..K take elapsed[K] - elapsed[warm].
    timed_s = elapsed[steps] - elapsed[warm]
    timed = steps - warm
    return {
        "samples_per_s": timed * batch / timed_s,
        "timed_steps": timed,
        "timed_s": timed_s,
        "compile_s": compile_s,
        "loss_first": losses[1],
        "loss_last": losses[steps],
    }


# ------------------------------------------------------------------- machine


def machine_info():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu": cpu, "cores": os.cpu_count(), "cores_usable": usable,
            "kernel": platform.release(), "python": platform.python_version()}


def load_average():
    """The 1-minute load average: how busy the machine was around the run."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cleave_version(cleave):
    try:
        p = subprocess.run([cleave, "--version"], capture_output=True, text=True, timeout=60)
        return p.stdout.strip() or p.stderr.strip()
    except OSError as e:
        sys.exit("cannot run %s: %s" % (cleave, e))


# ---------------------------------------------------------------------- main


def close(a, b):
    return abs(a - b) <= LOSS_RTOL * max(abs(a), abs(b), 1e-12)


def bench_model(args, workdir, name, in_dim, hidden, batch, steps):
    mdir = os.path.join(workdir, name)
    os.makedirs(mdir)
    onnx_path = os.path.join(mdir, "model.onnx")
    weights = os.path.join(mdir, "weights.pt")
    x_path = os.path.join(mdir, "x.npy")
    y_path = os.path.join(mdir, "y.npy")
    prog = os.path.join(mdir, "prog")
    metrics = os.path.join(mdir, "metrics.jsonl")

    torch.manual_seed(WEIGHT_SEED)
    model = build_model(in_dim, hidden)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(batch, in_dim),), onnx_path,
                          export_params=True, opset_version=OPSET,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False,
                          input_names=["input"], output_names=["logits"])
    torch.save(model.state_dict(), weights)
    params = sum(p.numel() for p in model.parameters())

    # One distinct batch per step: rows = steps * batch, no wrap-around.
    rng = np.random.default_rng(DATA_SEED)
    rows = steps * batch
    np.save(x_path, rng.standard_normal((rows, in_dim), dtype=np.float32))
    np.save(y_path, rng.integers(0, N_CLASSES, size=rows, dtype=np.int64))

    warm = warmup_steps(steps)
    job = {"in_dim": in_dim, "hidden": hidden, "weights": weights, "x": x_path, "y": y_path,
           "batch": batch, "steps": steps, "warmup": warm, "lr": LR, "threads": args.threads}
    log("[%s] %d params, batch %d, %d steps (%d warm-up), %d runs"
        % (name, params, batch, steps, warm, args.runs))

    cl_runs, th_runs = [], []
    for r in range(args.runs):
        c = run_cleave(args.cleave, onnx_path, prog, x_path, y_path, batch, steps, warm, metrics, args.threads)
        cl_runs.append(c)
        log("[%s] run %d/%d cleave: compile %.2f s, %.1f samples/s"
            % (name, r + 1, args.runs, c["compile_s"], c["samples_per_s"]))
        t = run_torch(os.path.abspath(__file__), job)
        th_runs.append(t)
        log("[%s] run %d/%d torch:  %.1f samples/s" % (name, r + 1, args.runs, t["samples_per_s"]))

    c0, t0 = cl_runs[0], th_runs[0]
    loss_ok = close(c0["loss_first"], t0["loss_first"]) and close(c0["loss_last"], t0["loss_last"])
    if not loss_ok:
        log("[%s] WARNING: losses differ: cleave first/last %.6g/%.6g, torch %.6g/%.6g"
            % (name, c0["loss_first"], c0["loss_last"], t0["loss_first"], t0["loss_last"]))

    cl_med = statistics.median(c["samples_per_s"] for c in cl_runs)
    th_med = statistics.median(t["samples_per_s"] for t in th_runs)
    return {
        "model": name,
        "layers": [in_dim] + hidden + [N_CLASSES],
        "params": params,
        "batch": batch,
        "steps": steps,
        "warmup_steps": warm,
        "cleave_samples_per_s": cl_med,
        "torch_samples_per_s": th_med,
        "ratio": cl_med / th_med,
        "cleave_compile_s": statistics.median(c["compile_s"] for c in cl_runs),
        "loss_check": {"ok": loss_ok, "rtol": LOSS_RTOL,
                       "cleave_first": c0["loss_first"], "torch_first": t0["loss_first"],
                       "cleave_last": c0["loss_last"], "torch_last": t0["loss_last"]},
        "commands": {
            "compile": shlex.join(compile_cmd(args.cleave, "model.onnx", "prog", batch, args.threads)),
            "program": shlex.join(program_cmd("./prog", "x.npy", "y.npy", steps, "metrics.jsonl")),
        },
        "cleave_runs": cl_runs,
        "torch_runs": th_runs,
        "torch_threads": th_runs[0]["threads"],
        "torch_blas": th_runs[0]["blas"],
    }


def print_report(report):
    m = report["machine"]
    print("command: %s" % report["command"])
    print("machine: %s, %d cores (%d usable), Linux %s"
          % (m["cpu"], m["cores"], m["cores_usable"], m["kernel"]))
    print("cleave:  %s (%s)" % (report["cleave"], report["cleave_version"]))
    print("threads: cleave --threads %d; torch %d intra-op thread%s, BLAS %s"
          % (report["threads"], report["torch_threads"], "s" if report["torch_threads"] > 1 else "",
             ", ".join(report["torch_blas"]) or "?"))
    print("torch:   %s" % report["torch_version"])
    print("load:    1-minute load average %s before, %s after; %.0f s in all"
          % (report["load_before"], report["load_after"], report["total_s"]))
    print("medians of %d alternating runs; samples/s over the steps after a %d%% warm-up"
          % (report["runs"], int(WARMUP_FRACTION * 100)))
    print()
    head = ("model", "batch", "steps", "cleave samples/s", "torch samples/s", "cleave/torch",
            "compile s")
    rows = [(r["model"], str(r["batch"]), str(r["steps"]), "%.1f" % r["cleave_samples_per_s"],
             "%.1f" % r["torch_samples_per_s"], "%.2f" % r["ratio"], "%.2f" % r["cleave_compile_s"])
            for r in report["results"]]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join("%-" + str(w) + "s" if i == 0 else "%" + str(w) + "s"
                    for i, w in enumerate(widths))
    print(fmt % head)
    for row in rows:
        print(fmt % row)
    print()
    for r in report["results"]:
        lc = r["loss_check"]
        print("%s: loss step 1 cleave %.6f torch %.6f, step %d cleave %.6f torch %.6f (%s)"
              % (r["model"], lc["cleave_first"], lc["torch_first"], r["steps"],
                 lc["cleave_last"], lc["torch_last"], "agree" if lc["ok"] else "DIFFER"))
    print()
    print("every run, samples/s in run order (cleave | torch):")
    for r in report["results"]:
        print("  %-*s %s | %s" % (widths[0], r["model"],
                                  " ".join("%.1f" % c["samples_per_s"] for c in r["cleave_runs"]),
                                  " ".join("%.1f" % t["samples_per_s"] for t in r["torch_runs"])))
    print()
    print("per model, in its work folder:")
    for r in report["results"]:
        print("  %s:" % r["model"])
        print("    %s" % r["commands"]["compile"])
        print("    %s" % r["commands"]["program"])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-worker":
        import_torch()
        torch_worker(json.loads(sys.argv[2]))
        return

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build-dev", "cleave"),
                    help="the cleave compiler (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each side per model (default 5)")
    ap.add_argument("--steps", type=int,
                    help="steps per run for every model (default: %s)"
                    % ", ".join("%d for %s" % (m[4], m[0]) for m in MODELS))
    ap.add_argument("--models", nargs="+", choices=[m[0] for m in MODELS],
                    help="only these models")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads per side: cleave --threads T, torch.set_num_threads(T) (default 1)")
    ap.add_argument("--out", help="also write the results as JSON to this file")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if not 1 <= args.threads <= 64:
        ap.error("--threads must be from 1 to 64")
    if args.steps is not None and args.steps < 2:
        ap.error("--steps must be at least 2 (one warm-up step, one timed)")
    args.cleave = os.path.abspath(args.cleave)
    if not os.access(args.cleave, os.X_OK):
        sys.exit("%s is not an executable; build cleave or pass --cleave" % args.cleave)

    import_torch()
    torch.set_num_threads(args.threads)
    report = {
        "command": shlex.join([sys.executable] + sys.argv),
        "machine": machine_info(),
        "cleave": args.cleave,
        "cleave_version": cleave_version(args.cleave),
        "torch_version": torch.__version__,
        "runs": args.runs,
        "threads": args.threads,
        "warmup_fraction": WARMUP_FRACTION,
        "lr": LR,
        "load_before": load_average(),
        "results": [],
    }
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cleave-bench-") as workdir:
        for name, in_dim, hidden, batch, steps in MODELS:
            if args.models and name not in args.models:
                continue
            report["results"].append(
                bench_model(args, workdir, name, in_dim, hidden, batch, args.steps or steps))
    report["total_s"] = time.perf_counter() - t_start
    report["load_after"] = load_average()
    report["torch_threads"] = report["results"][0]["torch_threads"]
    report["torch_blas"] = report["results"][0]["torch_blas"]
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
