#!/usr/bin/python3
"""GFLOP/s of cleave's generated GEMM against OpenBLAS on one core, and
against the machine's peak.

For every product below the script writes a one-node ONNX model (Gemm with
the product's transA/transB; A and B are initializers, frozen), compiles it
with `cleave compile --emit obj --emit-plan`, links the object into a
shared library (`cc -shared`, no runtime: a forward-only program calls
nothing outside itself) and calls the program's `cleave_eval_step` through
ctypes on an arena laid out as the plan says.  The eval step is the Gemm
(without C the packed product writes Y outright, reading nothing of it)
plus a ReduceSum over one float, the scalar loss `--loss model` wants.  OpenBLAS is called
through `cblas_sgemm` (row-major, beta 0) on the same matrices from the
same process, after `openblas_set_num_threads(1)`.

Each measurement repeats the call until --min-time seconds have passed and
gives 2*M*N*K * calls / seconds; the two sides alternate, --runs rounds, and
the tables show medians.  Before timing, the generated result is checked
against numpy in float64.

    /usr/bin/python3 bench/bench_gemm.py [--cleave PATH] [--runs 5] [--min-time 0.3]
        [--shapes squares,models] [--coretype AUTO,Cooperlake] [--out results.json]

Peak: `bench/gemm_peak.c` (built here with `cc -O2 -march=native`) measures
the core's clock with a chain of dependent adds and the float32 rate of a
loop of independent FMAs; the computed peak is cores x floats per vector x
2 FMA units x 2 flops x clock, and the report says where every factor came
from.
"""

import argparse
import ctypes
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so"
OPSET = 13
SEED = 7

np = None


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ shapes


def square_shapes():
    return [("square %d" % n, n, n, n, False, False) for n in (256, 512, 1024, 2048)]


def model_shapes():
    """The products bench_train.py's models compute in one training step.

    PyTorch exports Linear(in, out) as Gemm(X, W, transB=1) with X [B, in]
    and W [out, in]; Gemm's gradient rule (ops_linalg.c, g_gemm) turns it
    into dX = Gemm(dY, W) and dW = Gemm(dY, X, transA=1)."""
    sys.path.insert(0, HERE)
    import bench_train
    seen, out = set(), []
    for name, in_dim, hidden, batch, _ in bench_train.MODELS:
        widths = [in_dim] + list(hidden) + [bench_train.N_CLASSES]
        for i in range(len(widths) - 1):
            fi, fo = widths[i], widths[i + 1]
            for what, m, n, k, ta, tb in (("fwd", batch, fo, fi, False, True),
                                          ("dX", batch, fi, fo, False, False),
                                          ("dW", fo, fi, batch, True, False)):
                if what == "dX" and i == 0:
                    continue  # the input needs no gradient
                key = (m, n, k, ta, tb)
                if key in seen:
                    continue
                seen.add(key)
                out.append(("%s %s %d->%d" % (name, what, fi, fo), m, n, k, ta, tb))
    return out


# ---------------------------------------------------------------- cleave side


def write_model(path, m, n, k, ta, tb, rng):
    import onnx
    from onnx import helper, numpy_helper, TensorProto
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])
    nodes = [helper.make_node("ReduceSum", ["z"], ["loss"], keepdims=0),
             helper.make_node("Gemm", ["A", "B"], ["Y"], transA=int(ta), transB=int(tb))]
    g = helper.make_graph(nodes, "gemm", [z], [loss, y],
                          initializer=[numpy_helper.from_array(a, "A"), numpy_helper.from_array(b, "B")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)]), path)
    return a, b


def run_checked(cmd, what, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("%s failed (exit %d): %s\n%s" % (what, p.returncode, shlex.join(cmd), p.stderr))
    return p



def load_program(obj, so, plan):
    """Links the program object obj into the shared library so and loads
    it with its arena: (library, the numpy buffer, its 64-byte aligned
    arena, the rank's plan), the arena's persistent part initialised from
    the program's cleave_init as the runtime does.  bench_conv.py shares
    it."""
    import numpy  # the caller's process may not have run this module's worker
    run_checked(["cc", "-shared", "-o", so, obj], "cc -shared")
    rp = json.load(open(plan))["rank_plans"][0]
    lib = ctypes.CDLL(so)
    size = rp["arena_bytes"]
    raw = numpy.zeros(size + 128, numpy.uint8)
    arena = raw[(-raw.ctypes.data) % 64:][:size]
    init = (ctypes.c_ubyte * rp["persistent_bytes"]).in_dll(lib, "cleave_init")
    arena[:rp["persistent_bytes"]] = numpy.frombuffer(init, numpy.uint8)
    return lib, raw, arena, rp

class Generated:
    """A compiled one-Gemm program, loaded, with its arena."""

    def __init__(self, cleave, workdir, tag, m, n, k, ta, tb, rng):
        base = os.path.join(workdir, tag)
        onnx_path, obj, so, plan = base + ".onnx", base + ".o", base + ".so", base + ".plan.json"
        self.a, self.b = write_model(onnx_path, m, n, k, ta, tb, rng)
        self.compile_cmd = [cleave, "compile", onnx_path, "-o", obj, "--batch", "1", "--loss", "model",
                            "--freeze", "A,B", "--emit", "obj", "--emit-plan", plan]
        t0 = time.perf_counter()
        run_checked(self.compile_cmd, "cleave compile")
        self.compile_cmd = [os.path.relpath(cleave) if x == cleave else os.path.basename(x)
                            for x in self.compile_cmd]
        self.compile_s = time.perf_counter() - t0
        syms = run_checked(["nm", obj], "nm").stdout
        # The packed path is a function of its own (cg_gemm.c) whose name
        # ends in its blocking: ...MRxNVxW.kcKC.ncNC; loops otherwise.
        blk = re.search(r"cleave\.gemm\.\d+x\d+x\d+\.\S*\.(\d+)x(\d+)x(\d+)\.kc(\d+)\.nc(\d+)", syms)
        if blk:
            mr, nv, w, kc, nc = map(int, blk.groups())
            self.path = "packed %dx%d KC %d NC %d" % (mr, nv * w, kc, nc)
        else:
            self.path = "loops"
        self.lib, self.raw, self.arena, rp = load_program(obj, so, plan)
        y = next(b for b in rp["buffers"] if b["name"] == "Y")
        self.y = self.arena[y["offset"]:y["offset"] + y["bytes"]].view(np.float32).reshape(m, n)
        self.step = self.lib.cleave_eval_step
        self.step.argtypes = [ctypes.c_void_p]
        self.step.restype = None
        self.ptr = self.arena.ctypes.data

    def __call__(self):
        self.step(self.ptr)


class OpenBLAS:
    def __init__(self):
        self.lib = ctypes.CDLL(OPENBLAS)
        self.lib.openblas_set_num_threads(1)
        self.lib.openblas_get_config.restype = ctypes.c_char_p
        self.lib.openblas_get_corename.restype = ctypes.c_char_p
        f = self.lib.cblas_sgemm
        f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                           ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
        f.restype = None
        self.sgemm = f

    def bind(self, a, b, m, n, k, ta, tb):
        c = np.zeros((m, n), np.float32)
        args = (101, 112 if ta else 111, 112 if tb else 111, m, n, k, 1.0, a.ctypes.data, a.shape[1],
                b.ctypes.data, b.shape[1], 0.0, c.ctypes.data, n)
        f = self.sgemm
        return c, lambda: f(*args)


def rate(fn, flops, min_time):
    fn()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        t = time.perf_counter() - t0
        if t >= min_time:
            return flops * calls / t * 1e-9


# ------------------------------------------------------------------ worker


def worker(job):
    """One OpenBLAS core type per process (OPENBLAS_CORETYPE is read when
    the library loads): measures every shape, prints JSON."""
    global np
    import numpy
    np = numpy
    rng = np.random.default_rng(SEED)
    blas = OpenBLAS()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_gemm_") as workdir:
        for i, (tag, m, n, k, ta, tb) in enumerate(job["shapes"]):
            log("  %s: %dx%dx%d%s%s" % (tag, m, n, k, " transA" if ta else "", " transB" if tb else ""))
            gen = Generated(job["cleave"], workdir, "g%d" % i, m, n, k, ta, tb, rng)
            gen()
            a64 = (gen.a.T if ta else gen.a).astype(np.float64)
            b64 = (gen.b.T if tb else gen.b).astype(np.float64)
            want = a64 @ b64
            # float32 sums of k products: a few ulps times sqrt(k) of the scale
            scale = np.sqrt(np.abs(a64) ** 2 @ np.abs(b64) ** 2)
            err = float(np.max(np.abs(gen.y - want) / (scale + 1e-30)))
            if err > 1e-5:
                sys.exit("%s: generated GEMM differs from numpy (relative error %.3g)" % (tag, err))
            c, ob = blas.bind(gen.a, gen.b, m, n, k, ta, tb)
            ob()
            ob_err = float(np.max(np.abs(c - want) / (scale + 1e-30)))
            flops = 2.0 * m * n * k
            gr, br = [], []
            for _ in range(job["runs"]):
                gr.append(rate(gen, flops, job["min_time"]))
                br.append(rate(ob, flops, job["min_time"]))
            results.append({"tag": tag, "m": m, "n": n, "k": k, "transA": ta, "transB": tb, "path": gen.path,
                            "generated_gflops": gr, "openblas_gflops": br, "rel_err": err,
                            "openblas_rel_err": ob_err, "compile_s": gen.compile_s,
                            "compile_cmd": shlex.join(gen.compile_cmd)})
    json.dump({"openblas_config": blas.lib.openblas_get_config().decode(),
               "openblas_core": blas.lib.openblas_get_corename().decode(),
               "results": results}, sys.stdout)
    sys.stdout.write("\n")


# ------------------------------------------------------------------ machine


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpuinfo_mhz():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def measure_peak(workdir):
    exe = os.path.join(workdir, "gemm_peak")
    src = os.path.join(HERE, "gemm_peak.c")
    run_checked(["cc", "-O2", "-march=native", "-o", exe, src], "cc gemm_peak.c")
    return json.loads(run_checked([exe], "gemm_peak").stdout)


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# ------------------------------------------------------------------ report


def med(xs):
    return statistics.median(xs)


def print_report(rep):
    print("command: %s" % rep["command"])
    print("machine: %s, %d cores (%d usable), Linux %s" % (rep["cpu"], rep["cores"], rep["usable"], rep["kernel"]))
    print("cleave:  %s" % rep["cleave"])
    print("load:    1-minute load average %.2f before, %.2f after; %.0f s in all" %
          (rep["load_before"], rep["load_after"], rep["seconds"]))
    pk = rep["peak"]
    print()
    print("peak (what it is made of, and where each number comes from):")
    print("  clock          %.2f GHz  measured: dependent register adds, 1 cycle each (gemm_peak.c, best of the "
          "runs before and after: %s GHz); /proc/cpuinfo says %s MHz (the TSC's rate in this VM)" %
          (pk["clock_ghz"], " and ".join("%.2f" % t["clock_ghz"] for t in pk["tries"]), pk["cpuinfo_mhz"]))
    print("  vector width   %d floats  the widest vectors the compiler targets here (AVX-512: 512 bits)" %
          pk["vector_floats"])
    print("  FMA units      2          per core, as Intel documents for Xeon Scalable cores with AVX-512; "
          "the FMA loop below checks it")
    print("  flops per FMA  2")
    print("  one core:  %d x 2 x 2 x %.2f GHz = %.1f GFLOP/s" %
          (pk["vector_floats"], pk["clock_ghz"], pk["core_gflops"]))
    print("  machine:   %d cores x %.1f = %.1f GFLOP/s" % (rep["cores"], pk["core_gflops"], pk["machine_gflops"]))
    print("  measured:  a loop of 12 independent %d-float FMAs on one core: %.1f GFLOP/s (%.0f%% of the "
          "computed one-core peak; %s before and after)" %
          (pk["vector_floats"], pk["fma_gflops"], 100 * pk["fma_gflops"] / pk["core_gflops"],
           " and ".join("%.1f" % t["fma_gflops"] for t in pk["tries"])))
    print()
    print("medians of %d alternating runs, GFLOP/s = 2*M*N*K / time; one thread on both sides; "
          "peak%% of the one-core peak" % rep["runs"])
    for ct in rep["coretypes"]:
        sec = rep["by_coretype"][ct]
        print()
        print("OpenBLAS %s (OPENBLAS_CORETYPE=%s): %s" % (sec["openblas_core"], ct, sec["openblas_config"]))
        print()
        print("| product | M | N | K | op | generated code | generated | OpenBLAS | gen/OpenBLAS | gen % peak | "
              "OpenBLAS % peak |")
        print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
        for r in sec["results"]:
            g, b = med(r["generated_gflops"]), med(r["openblas_gflops"])
            op = ("T" if r["transA"] else "N") + ("T" if r["transB"] else "N")
            print("| %s | %d | %d | %d | %s | %s | %.1f | %.1f | %.2f | %.0f | %.0f |" %
                  (r["tag"], r["m"], r["n"], r["k"], op, r["path"], g, b, g / b,
                   100 * g / pk["core_gflops"], 100 * b / pk["core_gflops"]))
    print()
    print("every run, GFLOP/s in run order (generated | OpenBLAS):")
    for ct in rep["coretypes"]:
        for r in rep["by_coretype"][ct]["results"]:
            print("  %-10s %-40s %s | %s" % (ct, r["tag"], " ".join("%.1f" % x for x in r["generated_gflops"]),
                                           " ".join("%.1f" % x for x in r["openblas_gflops"])))
    print()
    print("largest error against numpy (float64), relative to sqrt(sum_k (a*b)^2): generated %.2g, OpenBLAS %.2g" %
          (max(r["rel_err"] for ct in rep["coretypes"] for r in rep["by_coretype"][ct]["results"]),
           max(r["openblas_rel_err"] for ct in rep["coretypes"] for r in rep["by_coretype"][ct]["results"])))
    print("each product is compiled as (in a temporary folder, tag = g0, g1, ...):")
    print("  %s; cc -shared -o g0.so g0.o" % rep["by_coretype"][rep["coretypes"][0]]["results"][0]["compile_cmd"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build-dev", "cleave"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    ap.add_argument("--shapes", default="squares,models", help="squares, models, or both (comma-separated)")
    ap.add_argument("--only", help="only products whose label contains this text")
    ap.add_argument("--coretype", default="AUTO,Cooperlake",
                    help="OpenBLAS core types to compare against, comma-separated; AUTO lets OpenBLAS choose")
    ap.add_argument("--out", help="also write everything as JSON")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    t_start = time.perf_counter()
    shapes = []
    for s in args.shapes.split(","):
        shapes += {"squares": square_shapes, "models": model_shapes}[s.strip()]()
    if args.only:
        shapes = [s for s in shapes if args.only in s[0]]
    cleave = os.path.abspath(args.cleave)
    load_before = load_average()
    peak_dir = tempfile.TemporaryDirectory(prefix="bench_gemm_peak_")
    peaks = [measure_peak(peak_dir.name)]
    by_ct = {}
    coretypes = [c.strip() for c in args.coretype.split(",") if c.strip()]
    for ct in coretypes:
        log("OpenBLAS core type %s:" % ct)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env.pop("OPENBLAS_CORETYPE", None)
        if ct != "AUTO":
            env["OPENBLAS_CORETYPE"] = ct
        job = {"cleave": cleave, "shapes": shapes, "runs": args.runs, "min_time": args.min_time}
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(job)], env=env,
                           stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit("worker for OPENBLAS_CORETYPE=%s failed (exit %d)" % (ct, p.returncode))
        by_ct[ct] = json.loads(p.stdout.strip().splitlines()[-1])
    # once more at the end: the best of both, since other jobs only lower them
    peaks.append(measure_peak(peak_dir.name))
    peak_dir.cleanup()
    peak = {"clock_ghz": max(p["clock_ghz"] for p in peaks), "fma_gflops": max(p["fma_gflops"] for p in peaks),
            "vector_floats": peaks[0]["vector_floats"], "tries": peaks}
    cores = os.cpu_count() or 1
    peak["cpuinfo_mhz"] = cpuinfo_mhz()
    peak["core_gflops"] = peak["vector_floats"] * 2 * 2 * peak["clock_ghz"]
    peak["machine_gflops"] = cores * peak["core_gflops"]
    p = subprocess.run([cleave, "--version"], capture_output=True, text=True)
    desc = p.stdout.strip() or p.stderr.strip()
    rep = {
        "command": shlex.join(["/usr/bin/python3", os.path.relpath(os.path.abspath(__file__), os.getcwd())] +
                              sys.argv[1:]),
        "cpu": cpu_model(), "cores": cores, "usable": len(os.sched_getaffinity(0)), "kernel": platform.release(),
        "cleave": "%s (%s)" % (os.path.relpath(cleave, os.getcwd()), desc),
        "load_before": load_before, "load_after": load_average(), "seconds": time.perf_counter() - t_start,
        "runs": args.runs, "peak": peak, "coretypes": coretypes, "by_coretype": by_ct,
    }
    print_report(rep)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
