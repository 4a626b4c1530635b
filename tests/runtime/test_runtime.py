#!/usr/bin/python3
"""End-to-end tests of the runtime through fake_program (fake_program.c).

fake_program_<variant> is the runtime linked with a hand-written stand-in for
a generated program: a linear layer W [4, 3] trained with softmax
cross-entropy and SGD on batches of 8.  This script writes data files
(.npy, IDX, gzipped), runs the programs, and compares what they report with
the same model replayed here in numpy: the loss of every step (so the row
order, --shuffle and data loading are checked), the trained W that --save
writes, the evaluation metrics and --predict.  It also checks the log lines,
the progress bar (under a pseudo-terminal), every error case (non-zero exit,
one clear line on stderr) and runs under `mpirun -np 2`, also as a 2-rank
data-parallel program (fake_program_dp) with its guard rails.

    /usr/bin/python3 tests/runtime/test_runtime.py --bin-dir build/tests/runtime --workdir /tmp/w

Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
Without numpy or onnx it prints "SKIP: ..." and exits 77 (ctest's skip
status).
"""

import argparse
import gzip
import hashlib
import json
import math
import os
import pty
import re
import select
import shutil
import stat
import struct
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:  # reported by main()
    np = None

# The shared test harness lives in tests/py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "py"))
import harness  # noqa: E402

B, D, C = 8, 4, 3
M64 = (1 << 64) - 1
TIMEOUT = 60

onnx = None
numpy_helper = None


# ---- the model, replayed --------------------------------------------------


def w_initial():
    """W0[k] = ((k % 5) - 2) / 8, as make_fake_model.c writes it."""
    k = np.arange(D * C)
    return (((k % 5) - 2) / 8.0).astype(np.float32).reshape(D, C)


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def epoch_order(n, seed, epoch):
    """P_e as runtime/README.md documents it."""
    p = list(range(n))
    if seed is None:
        return p
    state = (seed * 1000003 + epoch) & M64
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def forward(w, x, y):
    """Mean cross-entropy, logits and dLoss/dW in float64, as the fake does."""
    x64 = x.astype(np.float64)
    z = x64 @ w.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(z - m).sum(axis=1, keepdims=True))
    loss = float(np.mean(lse[:, 0] - z[np.arange(len(y)), y]))
    p = np.exp(z - lse)
    p[np.arange(len(y)), y] -= 1.0
    return loss, z, x64.T @ p / len(y)


def evaluate(w, xe, ye):
    """Eval pass: full batches give eval_loss; all rows give accuracy and
    the predictions; the last batch wraps to row 0."""
    n = len(xe)
    losses, logits = [], np.zeros((n, C), np.float32)
    for j in range(math.ceil(n / B)):
        rows = [(j * B + r) % n for r in range(B)]
        loss, z, _ = forward(w, xe[rows], ye[rows])
        valid = min(B, n - j * B)
        if valid == B:
            losses.append(float(np.float32(loss)))
        logits[j * B:j * B + valid] = z[:valid].astype(np.float32)
    acc = float(np.mean(np.argmax(logits, axis=1) == ye))
    return float(np.mean(losses)), acc, logits


def train(x, y, steps, lr, seed=None, eval_set=None):
    """Returns the float32 loss of every step, W after the last, and the
    evaluations (epoch, eval_loss, accuracy, logits) the program makes."""
    n = len(x)
    per_epoch = math.ceil(n / B)
    w = w_initial()
    losses, evals, order, order_epoch = [], [], None, -1
    lr64 = float(np.float32(lr))
    for s in range(steps):
        e, i = divmod(s, per_epoch)
        if e != order_epoch:
            order, order_epoch = epoch_order(n, seed, e), e
        rows = [order[(i * B + r) % n] for r in range(B)]
        loss, _, grad = forward(w, x[rows], y[rows])
        losses.append(float(np.float32(loss)))
        w = (w.astype(np.float64) - lr64 * grad).astype(np.float32)
        if eval_set is not None and (i == per_epoch - 1 or s == steps - 1):
            evals.append((e,) + evaluate(w, *eval_set))
    return losses, w, evals


# ---- data files ------------------------------------------------------------


def write_idx(path, array, compress=False):
    a = np.ascontiguousarray(array, dtype=np.uint8)
    head = struct.pack(">BBBB", 0, 0, 8, a.ndim) + b"".join(struct.pack(">I", d) for d in a.shape)
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(head + a.tobytes())


def make_data(work):
    rng = np.random.default_rng(20240601)
    teacher = rng.normal(size=(D, C))
    x = rng.random((50, D), dtype=np.float32)
    y = np.argmax(x @ teacher - (x @ teacher).mean(axis=0), axis=1).astype(np.int64)
    xe = rng.random((13, D), dtype=np.float32)
    ye = np.argmax(xe @ teacher - (x @ teacher).mean(axis=0), axis=1).astype(np.int64)
    files = {}

    def save(name, array):
        files[name] = os.path.join(work, name)
        np.save(files[name], array)

    save("x.npy", x)
    save("y.npy", y)
    save("xe.npy", xe)
    save("ye.npy", ye)
    save("y_i4.npy", y.astype(np.int32))
    save("y_u1.npy", y.astype(np.uint8))
    save("x_f8.npy", x.astype(np.float64))
    save("x_i4.npy", (x * 100).astype(np.int32))
    save("y_f8.npy", y.astype(np.float64))
    save("x_wide.npy", np.concatenate([x, x[:, :1]], axis=1))
    save("x_few.npy", x[:5])
    save("y_few.npy", y[:5])
    save("x_40.npy", x[:40])
    save("x_20.npy", x[:20])
    save("y_20.npy", y[:20])
    save("x_2x2.npy", x.reshape(50, 2, 2))
    save("x_fortran.npy", np.asfortranarray(x))
    save("x_big_endian.npy", x.astype(">f4"))
    save("scalar.npy", np.float32(1.0))
    bad = y.copy()
    bad[17] = 3
    save("y_bad.npy", bad)
    neg = y.copy()
    neg[4] = -1
    save("y_neg.npy", neg)
    ye_bad = ye.copy()
    ye_bad[12] = 7
    save("ye_bad.npy", ye_bad)
    pixels = rng.integers(0, 256, size=(50, 2, 2), dtype=np.uint8)
    files["pixels"] = pixels
    files["img.gz"] = os.path.join(work, "train-images-idx3-ubyte.gz")
    write_idx(files["img.gz"], pixels, compress=True)
    files["lab.idx"] = os.path.join(work, "train-labels-idx1-ubyte")
    write_idx(files["lab.idx"], y)
    files["x.npy.gz"] = os.path.join(work, "x.npy.gz")
    with open(files["x.npy"], "rb") as src, gzip.open(files["x.npy.gz"], "wb") as dst:
        dst.write(src.read())
    # Broken files.
    files["bad_header.npy"] = os.path.join(work, "bad_header.npy")
    with open(files["bad_header.npy"], "wb") as f:
        head = b"{'descr': '<f4', 'fortran_order': False, 'shape': (50 4), }"
        head += b" " * (64 - 10 - len(head) - 1) + b"\n"
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + x.tobytes())
    files["not_npy.npy"] = os.path.join(work, "not_npy.npy")
    with open(files["not_npy.npy"], "w") as f:
        f.write("1,2,3,4\n")
    files["truncated.npy"] = os.path.join(work, "truncated.npy")
    with open(files["x.npy"], "rb") as f:
        whole = f.read()
    with open(files["truncated.npy"], "wb") as f:
        f.write(whole[:-10])
    files["truncated.gz"] = os.path.join(work, "truncated-idx3-ubyte.gz")
    with open(files["img.gz"], "rb") as f:
        gz = f.read()
    with open(files["truncated.gz"], "wb") as f:
        f.write(gz[: len(gz) // 2])
    files["idx_int.idx"] = os.path.join(work, "ints-idx1")
    with open(files["idx_int.idx"], "wb") as f:
        f.write(struct.pack(">BBBBI", 0, 0, 0x0C, 1, 50) + np.arange(50, dtype=">i4").tobytes())
    return x, y, xe, ye, files


# ---- running programs --------------------------------------------------------


class Programs:
    def __init__(self, bin_dir, work, lsan_supp):
        self.bin_dir = bin_dir
        self.work = work
        env = harness.mpi_env()
        if lsan_supp and os.path.exists(lsan_supp):
            # Under LeakSanitizer: Open MPI keeps memory until exit, and its
            # stacks are only recognised with the slow unwinder (lsan.supp).
            opts = env.get("LSAN_OPTIONS", "")
            env["LSAN_OPTIONS"] = (opts + ":" if opts else "") + "suppressions=%s:print_suppressions=0" % lsan_supp
            opts = env.get("ASAN_OPTIONS", "")
            env["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "fast_unwind_on_malloc=0"
        self.env = env

    def path(self, variant="f32"):
        return os.path.join(self.bin_dir, "fake_program_" + variant)

    def run(self, args, variant="f32", mpi_ranks=0, timeout=TIMEOUT, stderr_fd=None):
        cmd = [self.path(variant)] + args
        if mpi_ranks:
            cmd = harness.mpirun(mpi_ranks, cmd)
        start = time.monotonic()
        try:
            p = subprocess.run(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=stderr_fd if stderr_fd is not None else subprocess.PIPE,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, "", "timed out after %ss" % timeout, timeout
        err = p.stderr.decode("utf-8", "replace") if p.stderr is not None else ""
        return p.returncode, p.stdout.decode("utf-8", "replace"), err, time.monotonic() - start


def read_metrics(path):
    steps, evals = [], []
    with open(path) as f:
        for line in f:
            obj = json.loads(line)
            (steps if "step" in obj else evals).append(obj)
    return steps, evals


def close(a, b, rel=2e-5, abs_=1e-6):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= abs_ + rel * np.abs(b)))


def data_args(files, x="x.npy", y="y.npy", flag="--data"):
    return [flag, "input=" + files.get(x, x), flag, "labels=" + files.get(y, y)]


def saved_initializers(path):
    model = onnx.load(path)
    onnx.checker.check_model(model)
    return {t.name: t for t in model.graph.initializer}


# ---- the checks ------------------------------------------------------------


def check_help(rep, progs):
    rc, out, err, _ = progs.run(["--help"])
    rep.check("--help exits 0 and lists the flags and inputs",
              rc == 0 and out.startswith("usage: fake_program_f32 --data NAME=FILE") and "--shuffle SEED" in out
              and re.search(r"labels\s+int64 \[8\]", out) is not None and err == "", (rc, out[:200], err))
    rc, out, err, _ = progs.run(["-h"], variant="bad_abi")
    rep.check("--help works even when the metadata is broken",
              rc == 0 and "usage:" in out and "Inputs of this program" not in out, (rc, err))


def check_training(rep, progs, x, y, xe, ye, files, work):
    metrics = os.path.join(work, "train.jsonl")
    saved = os.path.join(work, "trained.onnx")
    steps, lr = 60, 0.5
    rc, _, err, _ = progs.run(data_args(files) + ["--steps", str(steps), "--lr", str(lr), "--metrics", metrics,
                                                  "--save", saved, "--log-every", "0"])
    if not rep.check("train 60 steps exits 0", rc == 0, err):
        return
    ref_losses, ref_w, _ = train(x, y, steps, lr)
    lines, evals = read_metrics(metrics)
    rep.check("one metrics line per step, numbered from 1",
              [m["step"] for m in lines] == list(range(1, steps + 1)) and not evals, len(lines))
    rep.check("metrics lines have exactly step, loss, lr (the compiled one, no schedule), samples_per_s, elapsed_s",
              all(set(m) == {"step", "loss", "lr", "samples_per_s", "elapsed_s"} for m in lines)
              and all(isinstance(m["samples_per_s"], (int, float)) and m["samples_per_s"] > 0 for m in lines)
              and all(m["lr"] == float(np.float32(lr)) for m in lines),
              lines[0])
    elapsed = [m["elapsed_s"] for m in lines]
    rep.check("elapsed_s never decreases", all(b >= a for a, b in zip(elapsed, elapsed[1:])), elapsed[:5])
    got = [m["loss"] for m in lines]
    rep.check("step 1 loss equals numpy", close(got[0], ref_losses[0]), (got[0], ref_losses[0]))
    rep.check("every step's loss equals numpy (order wraps across epochs)", close(got, ref_losses),
              [(i + 1, a, b) for i, (a, b) in enumerate(zip(got, ref_losses)) if not close(a, b)][:3])
    rep.check("loss decreases", np.mean(got[-10:]) < np.mean(got[:10]) - 0.05, (got[:3], got[-3:]))

    inits = saved_initializers(saved)
    w = inits.get("W")
    w32 = numpy_helper.to_array(w) if w is not None else None
    rep.check("--save writes W as float32 raw_data equal to numpy-trained W",
              w is not None and w.data_type == 1 and list(w.dims) == [4, 3] and len(w.float_data) == 0
              and len(w.raw_data) == 48 and close(numpy_helper.to_array(w), ref_w),
              None if w is None else (numpy_helper.to_array(w), ref_w))
    b = inits.get("b")
    rep.check("--save leaves other initializers as they were",
              b is not None and list(b.float_data) == [0.0, 0.0, 0.0] and len(b.raw_data) == 0, b)

    for variant, dtype, tol in (("f16", 10, 1e-3), ("ext", 11, 1e-5)):
        out = os.path.join(work, "trained_%s.onnx" % variant)
        rc, _, err, _ = progs.run(data_args(files) + ["--steps", str(steps), "--lr", str(lr), "--save", out,
                                                      "--log-every", "0"], variant=variant)
        if not rep.check("train and save (W stored as %s) exits 0" % variant, rc == 0, err):
            continue
        w = saved_initializers(out).get("W")
        arr = numpy_helper.to_array(w) if w is not None else None
        rep.check("--save converts W to its own dtype %d and drops external data (%s)" % (dtype, variant),
                  w is not None and w.data_type == dtype and len(w.external_data) == 0
                  and w.data_location == 0 and len(w.raw_data) == 12 * (2 if dtype == 10 else 8)
                  and close(arr.astype(np.float64), ref_w, rel=tol, abs_=tol), (arr, ref_w))
        # Same training, same float32 W: the conversion alone must match numpy.
        if w32 is not None and arr is not None:
            want = np.float16(w32) if dtype == 10 else w32.astype(np.float64)
            rep.check("--save %s: W is exactly numpy's conversion of the float32 W" % variant,
                      arr.dtype == want.dtype and np.array_equal(arr, want), (arr, want))


def check_shuffle(rep, progs, x, y, files, work):
    for seed in (7, 123456789):
        metrics = os.path.join(work, "shuffle.jsonl")
        steps = 20  # three epochs of 7 steps, crossing two boundaries
        rc, _, err, _ = progs.run(data_args(files) + ["--steps", str(steps), "--lr", "0.3", "--shuffle", str(seed),
                                                      "--metrics", metrics])
        if not rep.check("--shuffle %d run exits 0" % seed, rc == 0, err):
            continue
        got = [m["loss"] for m in read_metrics(metrics)[0]]
        ref, _, _ = train(x, y, steps, 0.3, seed=seed)
        plain, _, _ = train(x, y, steps, 0.3)
        rep.check("--shuffle %d: every step's loss equals the documented permutation in numpy" % seed,
                  close(got, ref), [(i + 1, a, b) for i, (a, b) in enumerate(zip(got, ref)) if not close(a, b)][:3])
        rep.check("--shuffle %d changes the order" % seed, not close(got, plain))


def check_eval_and_predict(rep, progs, x, y, xe, ye, files, work):
    metrics = os.path.join(work, "eval.jsonl")
    pred = os.path.join(work, "pred.npy")
    rc, _, err, _ = progs.run(data_args(files) + data_args(files, "xe.npy", "ye.npy", "--eval-data")
                              + ["--steps", "10", "--lr", "0.5", "--metrics", metrics, "--predict", pred])
    if not rep.check("--eval-data --predict run exits 0", rc == 0, err):
        return
    _, ref_w, ref_evals = train(x, y, 10, 0.5, eval_set=(xe, ye))
    with open(metrics) as f:
        kinds = ["step" if "step" in json.loads(line) else "eval" for line in f]
    rep.check("evaluations follow step 7 (end of epoch 0) and step 10 (the end)",
              kinds == ["step"] * 7 + ["eval"] + ["step"] * 3 + ["eval"], kinds)
    _, evals = read_metrics(metrics)
    rep.check("eval lines have exactly epoch, eval_loss, accuracy",
              all(set(e) == {"epoch", "eval_loss", "accuracy"} for e in evals) and [e["epoch"] for e in evals] == [0, 1],
              evals)
    ok = len(evals) == len(ref_evals) and all(
        close(e["eval_loss"], r[1]) and abs(e["accuracy"] - r[2]) < 1e-9 for e, r in zip(evals, ref_evals))
    rep.check("eval_loss (full batches) and accuracy (all 13 rows) equal numpy", ok,
              (evals, [(r[0], r[1], r[2]) for r in ref_evals]))
    with open(pred, "rb") as f:
        head = f.read(10)
    arr = np.load(pred)
    rep.check("--predict writes a version 1.0 float32 .npy of shape (13, 3)",
              head[:8] == b"\x93NUMPY\x01\x00" and arr.dtype == np.float32 and arr.shape == (13, 3), (head, arr.dtype, arr.shape))
    rep.check("--predict rows equal numpy logits with the trained W", close(arr, ref_evals[-1][3]),
              (arr[:2], ref_evals[-1][3][:2]))

    metrics = os.path.join(work, "epochs.jsonl")
    rc, _, err, _ = progs.run(data_args(files) + data_args(files, "xe.npy", "ye.npy", "--eval-data")
                              + ["--epochs", "3", "--lr", "0.5", "--metrics", metrics])
    if rep.check("--epochs 3 run exits 0", rc == 0, err):
        steps, evals = read_metrics(metrics)
        _, _, ref_evals = train(x, y, 21, 0.5, eval_set=(xe, ye))
        rep.check("--epochs 3 runs 3 * ceil(50 / 8) = 21 steps and 3 evaluations",
                  len(steps) == 21 and [e["epoch"] for e in evals] == [0, 1, 2], (len(steps), evals))
        rep.check("--epochs 3 evaluations equal numpy",
                  all(close(e["eval_loss"], r[1]) for e, r in zip(evals, ref_evals)), (evals, ref_evals))


def check_model_loss(rep, progs, x, y, xe, ye, files, work):
    """loss_kind model: the output is the scalar loss, as the compiler emits
    it; evaluations carry no accuracy and --predict is refused."""
    metrics = os.path.join(work, "model_loss.jsonl")
    rc, _, err, _ = progs.run(data_args(files) + data_args(files, "xe.npy", "ye.npy", "--eval-data")
                              + ["--steps", "7", "--lr", "0.5", "--metrics", metrics], variant="model_loss")
    if rep.check("loss_kind model with a scalar output trains", rc == 0, err):
        steps, evals = read_metrics(metrics)
        ref, _, ref_evals = train(x, y, 7, 0.5, eval_set=(xe, ye))
        rep.check("loss_kind model: losses equal numpy", close([m["loss"] for m in steps], ref))
        rep.check("loss_kind model: evaluation lines carry epoch and eval_loss only",
                  len(evals) == 1 and set(evals[0]) == {"epoch", "eval_loss"} and close(evals[0]["eval_loss"], ref_evals[0][1]),
                  evals)
    expect_error(rep, progs, "--predict with a scalar output",
                 data_args(files) + data_args(files, "xe.npy", "ye.npy", "--eval-data")
                 + ["--steps", "1", "--predict", os.path.join(work, "p.npy")],
                 r"--predict: the program's output 'loss' has shape \[\], not one row per sample", status=2,
                 variant="model_loss")


def check_formats(rep, progs, x, y, files, work):
    pixels = files["pixels"].reshape(50, 4).astype(np.float32) / np.float32(255)
    metrics = os.path.join(work, "idx.jsonl")
    rc, _, err, _ = progs.run(["--data", "input=" + files["img.gz"], "--data", "labels=" + files["lab.idx"],
                               "--steps", "10", "--metrics", metrics])
    if rep.check("IDX images (gzip, 2x2 rows into a 4-wide input) and IDX labels load", rc == 0, err):
        got = [m["loss"] for m in read_metrics(metrics)[0]]
        ref, _, _ = train(pixels, y, 10, 0.1)  # the compiled-in lr
        rep.check("IDX images are scaled by 1/255 and labels widened: losses equal numpy", close(got, ref), (got[:2], ref[:2]))

    ref, _, _ = train(x, y, 5, 0.1)
    cases = [("x.npy.gz", "y.npy", "gzipped .npy"), ("x.npy", "y_i4.npy", "int32 labels"),
             ("x.npy", "y_u1.npy", "uint8 labels"), ("x_2x2.npy", "y.npy", "2x2 rows into a 4-wide input")]
    for xs, ys, what in cases:
        rc, _, err, _ = progs.run(data_args(files, xs, ys) + ["--steps", "5", "--metrics", metrics])
        ok = rc == 0 and close([m["loss"] for m in read_metrics(metrics)[0]], ref)
        rep.check("%s: same losses as the float32/int64 files" % what, ok, err)

    u1 = os.path.join(work, "x_u1.npy")
    np.save(u1, (x * 3).astype(np.uint8))
    rc, _, err, _ = progs.run(["--data", "input=" + u1, "--data", "labels=" + files["y.npy"], "--steps", "3",
                               "--metrics", metrics])
    ref, _, _ = train((x * 3).astype(np.uint8).astype(np.float32), y, 3, 0.1)
    rep.check("uint8 .npy into float32 is not scaled",
              rc == 0 and close([m["loss"] for m in read_metrics(metrics)[0]], ref), err)


def check_output(rep, progs, files, work):
    rc, _, err, _ = progs.run(data_args(files) + ["--steps", "30", "--log-every", "10"])
    lines = err.splitlines()
    pattern = re.compile(r"^step (\d+)/30 loss \d+\.\d{4} \d+\.\d samples/s$")
    rep.check("--log-every 10: plain lines at steps 10, 20, 30",
              rc == 0 and [int(pattern.match(l).group(1)) if pattern.match(l) else l for l in lines] == [10, 20, 30],
              lines)
    rc, _, err, _ = progs.run(data_args(files) + ["--steps", "30"])
    rep.check("default --log-every 100: only the final line on 30 steps",
              rc == 0 and len(err.splitlines()) == 1 and err.startswith("step 30/30 loss"), err)
    rc, _, err, _ = progs.run(data_args(files) + data_args(files, "xe.npy", "ye.npy", "--eval-data")
                              + ["--steps", "7", "--log-every", "0"])
    rep.check("evaluations are logged as lines too",
              rc == 0 and re.search(r"^epoch 0 eval_loss \d+\.\d{4} accuracy \d\.\d{4}$", err, re.M) is not None, err)

    # A terminal gets a bar redrawn with \r, ending in a newline.
    master, slave = pty.openpty()
    rc, _, _, _ = progs.run(data_args(files) + ["--steps", "200"], stderr_fd=slave)
    os.close(slave)
    chunks = []
    while True:
        r, _, _ = select.select([master], [], [], 1.0)
        if not r:
            break
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    rep.check("on a terminal: a progress bar with step, loss, samples/s and ETA, redrawn with \\r",
              rc == 0 and "\r" in text and "step 200/200 [########################] loss" in text
              and "samples/s ETA" in text and text.rstrip("\r\n").count("\n") == 0 and text.endswith("\n"),
              repr(text[-300:]))


def expect_error(rep, progs, label, args, pattern, status=1, variant="f32"):
    rc, _, err, _ = progs.run(args, variant=variant)
    lines = err.splitlines()
    prefix = "fake_program_%s: error: " % variant
    ok = (rc == status and len(lines) == 1 and lines[0].startswith(prefix)
          and re.search(pattern, lines[0][len(prefix):]) is not None)
    rep.check("error: %s -> exit %d, one line" % (label, status), ok, (rc, err))


def check_errors(rep, progs, files, work):
    f = files
    d = data_args
    missing = os.path.join(work, "missing.npy")
    expect_error(rep, progs, "missing file", ["--data", "input=" + missing, "--data", "labels=" + f["y.npy"],
                                              "--steps", "1"], re.escape(missing) + ": cannot open: No such file")
    expect_error(rep, progs, "bad .npy header", d(f, "bad_header.npy") + ["--steps", "1"],
                 r"bad_header\.npy: bad \.npy header: expected ',' or '\)' in 'shape'")
    expect_error(rep, progs, "text file named .npy", d(f, "not_npy.npy") + ["--steps", "1"], r"not a \.npy file")
    expect_error(rep, progs, "truncated .npy", d(f, "truncated.npy") + ["--steps", "1"],
                 r"truncated\.npy: truncated: the header announces 800 bytes of data, the file has 790")
    expect_error(rep, progs, "float64 data", d(f, "x_f8.npy") + ["--steps", "1"],
                 r"x_f8\.npy: float64 data cannot feed float32 input 'input' without losing precision; "
                 r"convert it with numpy: np\.save\(path, a\.astype\(np\.float32\)\)")
    expect_error(rep, progs, "int32 data into float32", d(f, "x_i4.npy") + ["--steps", "1"],
                 r"int32 data cannot feed float32 input 'input' exactly")
    expect_error(rep, progs, "float labels", d(f, "x.npy", "y_f8.npy") + ["--steps", "1"],
                 r"float64 data cannot feed int64 input 'labels'.*astype\(np\.int64\)")
    expect_error(rep, progs, "Fortran order", d(f, "x_fortran.npy") + ["--steps", "1"], r"Fortran-order")
    expect_error(rep, progs, "big-endian", d(f, "x_big_endian.npy") + ["--steps", "1"], r"big-endian")
    expect_error(rep, progs, "0-d array", d(f, "scalar.npy") + ["--steps", "1"], r"0-d array")
    expect_error(rep, progs, "wrong row shape", d(f, "x_wide.npy") + ["--steps", "1"],
                 r"x_wide\.npy: each row holds 5 values \(shape \[5\]\) but input 'input' takes 4 per sample")
    expect_error(rep, progs, "too few rows", d(f, "x_few.npy", "y_few.npy") + ["--steps", "1"],
                 r"x_few\.npy: 5 rows, fewer than the batch size 8")
    expect_error(rep, progs, "row counts differ", d(f, "x_40.npy") + ["--steps", "1"],
                 r"y\.npy: 50 rows, but .*x_40\.npy \(--data input\) has 40")
    expect_error(rep, progs, "label out of range", d(f, "x.npy", "y_bad.npy") + ["--steps", "1"],
                 r"y_bad\.npy: row 17: label 3 is out of range \[0, 3\)$")
    expect_error(rep, progs, "negative label", d(f, "x.npy", "y_neg.npy") + ["--steps", "1"],
                 r"y_neg\.npy: row 4: label -1 is out of range \[0, 3\)$")
    expect_error(rep, progs, "eval label out of range",
                 d(f) + d(f, "xe.npy", "ye_bad.npy", "--eval-data") + ["--steps", "1"],
                 r"ye_bad\.npy: row 12: label 7 is out of range \[0, 3\)$")
    expect_error(rep, progs, "truncated gzip", ["--data", "input=" + f["truncated.gz"], "--data",
                                                "labels=" + f["lab.idx"], "--steps", "1"], r"truncated gzip data|read error")
    expect_error(rep, progs, "IDX of int32", ["--data", "input=" + f["x.npy"], "--data", "labels=" + f["idx_int.idx"],
                                              "--steps", "1"], r"IDX element type 0x0c is not supported")
    expect_error(rep, progs, "unknown --data name", d(f) + ["--data", "image=" + f["x.npy"], "--steps", "1"],
                 r"--data image=.*: the program has no input 'image' \(its inputs: input, labels\)", status=2)
    expect_error(rep, progs, "missing --data", ["--data", "input=" + f["x.npy"], "--steps", "1"],
                 r"no --data for input 'labels'", status=2)
    expect_error(rep, progs, "duplicate --data", d(f) + ["--data", "input=" + f["x.npy"], "--steps", "1"],
                 r"--data input given twice", status=2)
    expect_error(rep, progs, "eval data missing an input", d(f) + ["--eval-data", "input=" + f["xe.npy"], "--steps", "1"],
                 r"no --eval-data for input 'labels'", status=2)
    expect_error(rep, progs, "NaN loss from a huge --lr", d(f) + ["--steps", "100", "--lr", "3e38"],
                 r"^step \d+: loss is (nan|inf)$")
    expect_error(rep, progs, "unknown flag", d(f) + ["--steps", "1", "--frob"], r"unknown option '--frob'", status=2)
    expect_error(rep, progs, "no arguments", [], r"no --data given", status=2)
    expect_error(rep, progs, "--steps 0", d(f) + ["--steps", "0"], r"--steps needs an integer of at least 1", status=2)
    expect_error(rep, progs, "--steps and --epochs", d(f) + ["--steps", "1", "--epochs", "1"], r"not both", status=2)
    expect_error(rep, progs, "no --steps", d(f), r"give --steps K or --epochs E", status=2)
    expect_error(rep, progs, "bad --lr", d(f) + ["--steps", "1", "--lr", "fast"], r"--lr needs a non-negative", status=2)
    expect_error(rep, progs, "bad --shuffle", d(f) + ["--steps", "1", "--shuffle", "x"], r"--shuffle needs a seed",
                 status=2)
    expect_error(rep, progs, "--predict without --eval-data", d(f) + ["--steps", "1", "--predict", "p.npy"],
                 r"--predict needs --eval-data", status=2)
    metrics = os.path.join(work, "never.jsonl")
    expect_error(rep, progs, "--save into a missing folder",
                 d(f) + ["--steps", "1", "--metrics", metrics, "--save", "/nonexistent-dir/m.onnx"],
                 r"--save /nonexistent-dir/m\.onnx: folder /nonexistent-dir does not exist")
    rep.check("an unwritable --save fails before training (no metrics written)", not os.path.exists(metrics))
    expect_error(rep, progs, "--save onto a folder", d(f) + ["--steps", "1", "--save", work], r"is a folder")
    expect_error(rep, progs, "--metrics into a missing folder",
                 d(f) + ["--steps", "1", "--metrics", "/nonexistent-dir/m.jsonl"],
                 r"--metrics /nonexistent-dir/m\.jsonl: cannot write: No such file")
    expect_error(rep, progs, "--predict into a missing folder",
                 d(f) + d(f, "xe.npy", "ye.npy", "--eval-data") + ["--steps", "1", "--predict", "/nonexistent-dir/p.npy"],
                 r"--predict /nonexistent-dir/p\.npy: folder /nonexistent-dir does not exist")
    expect_error(rep, progs, "metadata with a foreign abi version", d(f) + ["--steps", "1"],
                 r"program metadata has abi version 1 but this runtime implements 2", variant="bad_abi")


def still_running(token):
    p = subprocess.run(["pgrep", "-f", token], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return p.stdout.decode().split()


def check_mpi(rep, progs, x, y, files, work):
    if shutil.which("mpirun") is None:
        rep.check("mpirun available", False, "mpirun not found")
        return
    metrics = os.path.join(work, "mpi.jsonl")
    saved = os.path.join(work, "mpi.onnx")
    rc, _, err, _ = progs.run(data_args(files) + ["--steps", "12", "--lr", "0.5", "--metrics", metrics,
                                                  "--save", saved, "--log-every", "0"], mpi_ranks=2)
    if rep.check("mpirun -np 2 runs to the end", rc == 0, (rc, err)):
        steps, _ = read_metrics(metrics)
        ref, ref_w, _ = train(x, y, 12, 0.5)
        rep.check("under mpirun only rank 0 writes metrics (12 lines) and they equal numpy",
                  len(steps) == 12 and close([m["loss"] for m in steps], ref), len(steps))
        rep.check("under mpirun only rank 0 logs", err.count("step 12/12") == 1, err)
        rep.check("under mpirun --save equals numpy", close(numpy_helper.to_array(saved_initializers(saved)["W"]), ref_w))

    token = os.path.join(work, "mpi-missing-file-%d.npy" % os.getpid())
    rc, _, err, took = progs.run(["--data", "input=" + token, "--data", "labels=" + files["y.npy"], "--steps", "5"],
                                 mpi_ranks=2)
    rep.check("mpirun -np 2 with a missing file exits non-zero within the timeout",
              rc is not None and rc != 0 and took < TIMEOUT, (rc, took))
    # Every rank fails the same way: one line, without a rank.
    rep.check("... and names the error on one line",
              re.search(r"fake_program_f32: error: .*mpi-missing-file-\d+\.npy: cannot open", err) is not None
              and err.count("error:") == 1, err)
    rep.check("... and leaves no rank running", not still_running(token))

    rc, _, err, took = progs.run(data_args(files) + ["--steps", "100", "--lr", "3e38", "--shuffle", "1"], mpi_ranks=2)
    rep.check("mpirun -np 2 with a NaN loss aborts every rank, non-zero, without hanging",
              rc is not None and rc != 0 and took < TIMEOUT and "loss is" in err, (rc, took, err[-400:]))

    rc, _, err, _ = progs.run(data_args(files) + ["--steps", "3", "--log-every", "0", "--check-replicas"], mpi_ranks=2)
    rep.check("a one-rank program under mpirun -np 2 warns once that every rank trains alone",
              rc == 0 and err.count("fake_program_f32: warning: fake_program_f32 was compiled for one rank but runs on 2")
              == 1 and "--ranks 2 --strategy dp" in err, err)
    rep.check("... and --check-replicas finds its replicas identical",
              "fake_program_f32: replicas identical (2 ranks)" in err, err)


def check_dp(rep, progs, x, y, xe, ye, files, work):
    """fake_program_dp: the same model as a 2-rank data-parallel program
    (each rank computes 4 of the 8 rows, gradients summed in two buckets by
    the runtime's collectives).  Everything must equal the one-rank numpy
    replay: the row sharding, the loss reduction, eval and --predict."""
    metrics = os.path.join(work, "dp.jsonl")
    saved = os.path.join(work, "dp.onnx")
    pred = os.path.join(work, "dp_pred.npy")
    args = data_args(files) + data_args(files, "xe.npy", "ye.npy", "--eval-data") + [
        "--steps", "10", "--lr", "0.5", "--shuffle", "3", "--metrics", metrics, "--save", saved, "--predict", pred,
        "--log-every", "0", "--check-replicas"]
    rc, _, err, _ = progs.run(args, variant="dp", mpi_ranks=2)
    if rep.check("dp: mpirun -np 2 runs to the end", rc == 0, (rc, err)):
        steps, evals = read_metrics(metrics)
        ref, ref_w, ref_evals = train(x, y, 10, 0.5, seed=3, eval_set=(xe, ye))
        rep.check("dp: 10 step lines whose losses (mean of the ranks' means) equal numpy's global batch",
                  len(steps) == 10 and close([m["loss"] for m in steps], ref), ([m["loss"] for m in steps], ref))
        rep.check("dp: step lines carry comm_wait_s <= allreduce_s, both >= 0",
                  all(set(m) == {"step", "loss", "lr", "samples_per_s", "elapsed_s", "comm_wait_s", "allreduce_s"}
                      and 0 <= m["comm_wait_s"] <= m["allreduce_s"] for m in steps), steps[:2])
        rep.check("dp: --save (rank 0) equals numpy's W",
                  close(numpy_helper.to_array(saved_initializers(saved)["W"]), ref_w))
        ok = len(evals) == len(ref_evals) and all(
            close(e["eval_loss"], r[1]) and abs(e["accuracy"] - r[2]) < 1e-9 for e, r in zip(evals, ref_evals))
        rep.check("dp: sharded eval_loss and accuracy (13 rows, the last batch padded) equal numpy", ok,
                  (evals, [(r[0], r[1], r[2]) for r in ref_evals]))
        arr = np.load(pred)
        rep.check("dp: --predict gathers every rank's rows in order and equals numpy",
                  arr.shape == (13, 3) and close(arr, ref_evals[-1][3]), arr.shape)
        rep.check("dp: --check-replicas reports identical replicas once",
                  err.count("fake_program_dp: replicas identical (2 ranks)") == 1, err)

    rc, out, _, _ = progs.run(["--help"], variant="dp")
    rep.check("dp: --help tells how to start it and the per-rank shapes",
              rc == 0 and "data-parallel over 2 ranks: run it as mpirun -np 2" in out
              and re.search(r"input\s+float32 \[4, 4\]", out) is not None, out[-400:])

    def refused(label, rc, err, took, pattern):
        rep.check(label, rc is not None and rc == 1 and took < TIMEOUT and re.search(pattern, err) is not None
                  and err.count("error:") == 1, (rc, took, err[-500:]))

    short = data_args(files) + ["--steps", "3"]
    rc, _, err, took = progs.run(short, variant="dp")
    refused("dp: a 2-rank program started alone refuses", rc, err, took,
            r"^fake_program_dp: error: fake_program_dp was compiled for 2 ranks but runs alone; start it with "
            r"mpirun -np 2")
    rc, _, err, took = progs.run(short, variant="dp", mpi_ranks=3)
    refused("dp: a 2-rank program under -np 3 refuses on every rank, one line from rank 0", rc, err, took,
            r"^fake_program_dp: error: fake_program_dp was compiled for 2 ranks but runs on 3 \(mpirun -np 3\)")

    def mpmd(left, right, env=None):
        cmd = harness.mpirun(1, left) + [":", "-np", "1"] + right
        start = time.monotonic()
        try:
            p = subprocess.run(cmd, env=dict(progs.env, **(env or {})), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return None, "timed out", TIMEOUT
        return p.returncode, p.stderr.decode("utf-8", "replace"), time.monotonic() - start

    rc, err, took = mpmd([progs.path("dp")] + short, [progs.path("dp_other")] + short)
    refused("dp: ranks running different programs refuse, naming both plan hashes", rc, err, took,
            r"error: ranks run different programs \(plan hash 00112233445566dd on rank 0, fedcba9876543210 on rank 1\)")
    rc, err, took = mpmd([progs.path("dp")] + short, [progs.path("dp")] + data_args(files) + ["--steps", "4"])
    refused("dp: ranks started with different --steps refuse", rc, err, took,
            r"error: rank 1 was started with other options than rank 0")
    rc, err, took = mpmd([progs.path("dp")] + short, [progs.path("dp")] + data_args(files, "x_20.npy", "y_20.npy")
                         + ["--steps", "3"])
    refused("dp: ranks reading files of different lengths refuse", rc, err, took,
            r"error: rank 1's --data files have 20 rows but rank 0's have 50")

    missing = os.path.join(work, "dp-missing-%d.npy" % os.getpid())
    rc, err, took = mpmd([progs.path("dp")] + short, [progs.path("dp"), "--data", "input=" + missing, "--data",
                                                      "labels=" + files["y.npy"], "--steps", "3"])
    refused("dp: a file only rank 1 cannot read stops both ranks with rank 1's message", rc, err, took,
            r"fake_program_dp: error: rank 1: .*dp-missing-\d+\.npy: cannot open")
    rep.check("... and leaves no rank running", not still_running(missing))

    rc, _, err, took = progs.run(data_args(files) + ["--steps", "100", "--lr", "3e38", "--shuffle", "1"],
                                 variant="dp", mpi_ranks=2)
    refused("dp: a NaN loss (reduced over the ranks) stops every rank at the same step, reported once", rc, err, took,
            r"^fake_program_dp: error: step \d+: loss is (nan|inf)")

    rc, err, took = mpmd([progs.path("dp")] + short + ["--check-replicas"],
                         [progs.path("dp")] + short + ["--check-replicas"], env={"FAKE_PERTURB_RANK": "1"})
    refused("dp: --check-replicas finds a diverged replica and names it and the parameter", rc, err, took,
            r"error: replicas diverged: rank 1's parameters differ from rank 0's \(first differing parameter W\)")


def file_digest(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def temporaries(folder):
    return [n for n in os.listdir(folder) if ".tmp-" in n]


def check_outputs_kept(rep, progs, files, work):
    """Outputs never destroy inputs or finished work (common/out_file.c)."""
    f, d = files, data_args
    before = file_digest(f["x.npy"])
    for flag in ("--save", "--metrics", "--trace"):
        expect_error(rep, progs, "%s naming a --data file" % flag, d(f) + ["--steps", "1", flag, f["x.npy"]],
                     r"%s .*x\.npy: the same file as --data input=.*x\.npy; an output must not overwrite an input"
                     % flag, status=2)
    rep.check("... and the data file is unchanged", file_digest(f["x.npy"]) == before)
    same = os.path.join(work, "same.out")
    expect_error(rep, progs, "--metrics and --save naming one file",
                 d(f) + ["--steps", "1", "--save", same, "--metrics", os.path.join(work, ".", "same.out")],
                 r"--metrics .*same\.out: the same file as --save .*same\.out", status=2)
    rc, _, err, _ = progs.run(d(f) + ["--steps", "2", "--save", "/dev/null", "--metrics", "/dev/null",
                                      "--log-every", "0"])
    rep.check("/dev/null for two outputs is written in place, and stays a device",
              rc == 0 and os.path.exists("/dev/null") and stat.S_ISCHR(os.stat("/dev/null").st_mode), (rc, err))
    saved = os.path.join(work, "kept.onnx")
    rc, _, err, _ = progs.run(d(f) + ["--steps", "2", "--save", saved, "--metrics", os.path.join(work, "k.jsonl")])
    rep.check("a run leaves no temporaries beside its outputs", rc == 0 and not temporaries(work), temporaries(work))

    # A full disk: a tmpfs of 64 KiB filled up (root only).
    disk = os.path.join(work, "full")
    os.makedirs(disk, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", disk],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        rep.skip("outputs on a full disk", "cannot mount a tmpfs here (needs root)")
        return
    try:
        model = os.path.join(disk, "model.onnx")
        shutil.copy(saved, model)
        subprocess.run(["dd", "if=/dev/zero", "of=" + os.path.join(disk, "fill"), "bs=4k", "count=1000"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kept = file_digest(model)
        rc, _, err, _ = progs.run(d(f) + ["--steps", "2", "--save", model, "--log-every", "0"])
        rep.check("--save onto a full disk exits 1 with one error line",
                  rc == 1 and re.search(r"^fake_program_f32: error: --save .*model\.onnx: write failed, the file is as "
                                        r"it was: No space left on device$", err, re.M) is not None
                  and err.count("error:") == 1, (rc, err))
        rep.check("... and the previous model there is whole", file_digest(model) == kept)
        rep.check("... and no temporary is left", not temporaries(disk), temporaries(disk))
        after = os.path.join(work, "after_metrics_failed.onnx")
        rc, _, err, _ = progs.run(d(f) + ["--steps", "2", "--metrics", os.path.join(disk, "m.jsonl"),
                                          "--save", after, "--log-every", "0"])
        rep.check("a failed --metrics write exits 1 naming it, and says the model is saved",
                  rc == 1 and re.search(r"error: --metrics .*m\.jsonl: write failed: No space left on device "
                                        r"\(the trained model is saved in .*after_metrics_failed\.onnx\)", err)
                  is not None, (rc, err))
        rep.check("... and the trained model is saved", os.path.exists(after) and
                  "W" in saved_initializers(after))
        rep.check("... and no temporary is left", not temporaries(disk), temporaries(disk))
    finally:
        subprocess.run(["umount", disk], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def check_gzip_bounded(rep, progs, files, work):
    """A gzip file inflating past its header's size is not inflated in full."""
    with open(files["x.npy"], "rb") as fh:
        whole = fh.read()
    bomb = os.path.join(work, "bomb.npy.gz")
    with gzip.open(bomb, "wb", compresslevel=1) as fh:
        fh.write(whole)
        zeros = bytes(1 << 20)
        for _ in range(256):  # 256 MiB past the announced data
            fh.write(zeros)
    rc, _, err, _ = progs.run(["--data", "input=" + bomb, "--data", "labels=" + files["y.npy"], "--steps", "1",
                               "--log-every", "0"])
    rep.check("a gzip file inflating past its header stops there, one line naming it",
              rc == 1 and re.search(r"bomb\.npy\.gz: inflates to more than the %d bytes its header announces"
                                    % len(whole), err) is not None and err.count("\n") == 1, (rc, err))


def main():
    global onnx, numpy_helper
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", required=True, help="folder holding fake_program_*")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--lsan-suppressions", default=None)
    args = ap.parse_args()
    try:
        import onnx as onnx_module
        from onnx import numpy_helper as nh
    except ImportError:
        onnx_module = None
    why = harness.missing(("numpy", "onnx"))
    if np is None or onnx_module is None or why:
        return harness.skip("numpy and onnx are needed (scripts/setup.sh installs them): %s" % why)
    onnx, numpy_helper = onnx_module, nh

    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    progs = Programs(os.path.abspath(args.bin_dir), work, args.lsan_suppressions)
    x, y, xe, ye, files = make_data(work)
    rep = harness.Report()
    check_help(rep, progs)
    check_training(rep, progs, x, y, xe, ye, files, work)
    check_shuffle(rep, progs, x, y, files, work)
    check_eval_and_predict(rep, progs, x, y, xe, ye, files, work)
    check_model_loss(rep, progs, x, y, xe, ye, files, work)
    check_formats(rep, progs, x, y, files, work)
    check_output(rep, progs, files, work)
    check_errors(rep, progs, files, work)
    check_outputs_kept(rep, progs, files, work)
    check_gzip_bounded(rep, progs, files, work)
    check_mpi(rep, progs, x, y, files, work)
    if shutil.which("mpirun") is not None:
        check_dp(rep, progs, x, y, xe, ye, files, work)
    else:
        rep.skip("data-parallel runs", "mpirun not available")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
