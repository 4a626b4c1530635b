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

The workloads are the MLPs of MODELS, the CNNs of CNN_MODELS (a small
VGG-style net, torchvision's resnet18 and mobilenet_v2 at 3x32x32) and the
transformers of LM_MODELS (a two-layer encoder block tagging every token of
float features, and a GPT-style decoder over tokens, both trained on the
cross-entropy of every position); --models picks some of them by name, or
all of a family with "mlp", "cnn" or "lm".

The table gives the medians.  Both sides train on identical weights and
batches, so the loss of the first and of the last step must agree: the script
checks that, to be sure both sides do the same work.  For the nets with batch
normalisation only the first step's loss is compared (see CNN_MODELS).

Next to the figures the report says which kernels PyTorch ran: the BLAS
library it mapped and, for OpenBLAS, the core it dispatched to; whether
oneDNN is built in and enabled, the ISA it reports, and which oneDNN
implementation ran each kind of convolution in one training step of the
model (torch_kernels below, which bench_conv.py shares).  The torch process
runs with OPENBLAS_CORETYPE removed from its environment, so that OpenBLAS
picks its kernels for this CPU itself, and with glibc's malloc keeping the
memory PyTorch frees (MALLOC_KEEP below), as an allocator such as jemalloc
would.

    /usr/bin/python3 bench/bench_train.py [--cleave PATH] [--runs 5] [--steps N]
                                          [--models NAME|mlp|cnn|lm ...]
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

# name, sample shape, batch, default steps, loss check.  cleave's convolution
# kernels are far slower than oneDNN's, so the CNNs get a few tens of steps:
# enough for a 10% warm-up of two steps, little enough that a default run of
# all three stays within several minutes.  The loss check is "first last" or
# "first".  The nets with batch normalisation, trained from a random init at
# lr 0.01 on random labels, are chaotic in float32: PyTorch's own float32 run
# leaves its float64 run of the same steps by 1% within four steps (resnet18)
# or five (mobilenet_v2), and cleave's float32 leaves both.  For them only
# the first step's loss is compared, which proves the same forward pass on
# the same weights and batch; tests/py/test_cnn_train.py checks their
# training step by step (warmed-up weights, small learning rates, against
# float64).
CNN_MODELS = [
    ("vgg_cnn", (3, 32, 32), 32, 20, "first last"),
    ("resnet18", (3, 32, 32), 32, 20, "first"),
    ("mobilenet_v2", (3, 32, 32), 32, 20, "first"),
]

# name, batch, default steps, opset.  Transformers as PyTorch users write
# them, exported at opset 17 (LayerNormalization is one node there; GELU
# stays a chain of element-wise ops, erf or tanh form, as the exporter
# writes it).  Both are trained on the mean cross-entropy over every
# position of the batch (cleave: --loss ce over logits [B, T, C] and
# labels [B, T]; torch: cross_entropy over the flattened positions).
#
# transformer_block: per-token tagging, chosen over pooled classification
#   so that the loss is the same per-position cross-entropy as the
#   language model's and nothing but the block sits between the input and
#   it.  Float features [B, 64, 128], two pre-norm layers (LayerNorm ->
#   self-attention with 4 heads of 32, one Linear making q, k and v, no
#   mask -> residual; LayerNorm -> Linear 128->512, GELU (erf), Linear
#   512->128 -> residual), a final LayerNorm and a Linear head to 10
#   classes per token.
# gpt_mini: tests/py/lm_models.py's Gpt (the model py_lm_train checks)
#   at 4 layers, width 256, 4 heads, 128 tokens and a vocabulary of 100:
#   token and position embeddings (Gather), causal mask, GELU (tanh), LM
#   head tied to the token embedding; logits [B, 128, 100], each position
#   labelled with the next token.
LM_MODELS = [
    ("transformer_block", 16, 40, 17),
    ("gpt_mini", 8, 20, 17),
]
LM_SHAPES = {
    # name: (input sample shape, classes), the input's dtype from the kind of model
    "transformer_block": ((64, 128), 10),
    "gpt_mini": ((128,), 100),
}
FAMILIES = {"mlp": [m[0] for m in MODELS], "cnn": [m[0] for m in CNN_MODELS], "lm": [m[0] for m in LM_MODELS]}

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


def build_cnn(name):
    """One of CNN_MODELS, freshly initialised from torch's current seed.

    vgg_cnn: four 3x3 convolutions (3->32, 32->32, pool, 32->64, 64->64,
    pool) with ReLU, then a Linear head over the 64x8x8 features.  The
    torchvision nets are built with 10 classes; mobilenet_v2's Dropout gets
    p = 0, since cleave's dropout masks (keyed by step and row so that every
    partitioning draws the same ones) cannot be PyTorch's, and the two sides
    would then train different nets."""
    nn = torch.nn
    if name == "vgg_cnn":
        def conv(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
        return nn.Sequential(*conv(3, 32), *conv(32, 32), nn.MaxPool2d(2),
                             *conv(32, 64), *conv(64, 64), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(64 * 8 * 8, N_CLASSES))
    import torchvision
    model = getattr(torchvision.models, name)(num_classes=N_CLASSES)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


def build_lm(name):
    """One of LM_MODELS, freshly initialised from torch's current seed (see
    LM_MODELS for what they are)."""
    nn = torch.nn
    if name == "gpt_mini":
        sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
        import lm_models
        return lm_models.Gpt(vocab=100, seq=128, d=256, heads=4, layers=4)

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5), dim=-1)
            return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))

    class Layer(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
            self.ln2, self.fc, self.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))

    (_, d), classes = LM_SHAPES[name]
    return nn.Sequential(Layer(d, 4), Layer(d, 4), nn.LayerNorm(d), nn.Linear(d, classes))


def build_job_model(job):
    """The model a torch worker job describes: a CNN or transformer by name,
    or an MLP by its widths (bench_dp.py's jobs name no kind)."""
    if job.get("kind") == "cnn":
        return build_cnn(job["model"])
    if job.get("kind") == "lm":
        return build_lm(job["model"])
    return build_model(job["in_dim"], job["hidden"])


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


def openblas_info():
    """The OpenBLAS among blas_libraries(), asked which kernels it runs:
    openblas_get_corename() names the core a DYNAMIC_ARCH build dispatched
    to (what it recognised of this CPU, or what OPENBLAS_CORETYPE forced),
    openblas_get_config() the build.  Loading a mapped library again
    returns the handle already open, so this is the instance torch calls.
    None when no mapped BLAS library is OpenBLAS."""
    import ctypes
    # Debian's libblas.so.3 of the OpenBLAS alternative is a second library
    # with the same symbols: name the one called OpenBLAS first
    for path in sorted(blas_libraries(), key=lambda p: "openblas" not in os.path.basename(p).lower()):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if not hasattr(lib, "openblas_get_corename"):
            continue
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        return {"library": path,
                "core": lib.openblas_get_corename().decode(),
                "config": lib.openblas_get_config().decode()}
    return None


ONEDNN_PREFIXES = ("onednn_verbose,", "dnnl_verbose,")
# oneDNN prints its info lines (the ISA among them) once per process, with
# the first verbose line: the ISA is kept here for the callers after that one
ONEDNN_SEEN = {"isa": None}


def onednn_verbose(fn):
    """Runs fn() once with oneDNN's verbose mode switched on and returns
    the lines oneDNN printed.  Only this call is verbose (the timed steps
    never are); oneDNN writes with C stdio to file descriptor 1, which is
    pointed at a temporary file meanwhile, so the lines reach neither the
    terminal nor a worker's JSON on stdout."""
    import ctypes
    import tempfile as tf
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    with tf.TemporaryFile() as f:
        os.dup2(f.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                fn()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if line.startswith(ONEDNN_PREFIXES)]


def onednn_summary(lines):
    """From oneDNN's verbose lines: the ISA it reports, and every primitive
    it executed as {"primitive", "implementation", "prop_kind", "problem",
    "count"} in first-seen order.  An exec line is
    prefix,exec,engine,primitive,implementation,prop_kind,memory
    descriptors,attributes,auxiliary,problem,time (oneDNN 2.x)."""
    isa, seen = None, {}
    for line in lines:
        f = line.split(",")
        if len(f) >= 4 and f[1] == "info" and f[3].startswith("isa:"):
            isa = ONEDNN_SEEN["isa"] = f[3][len("isa:"):]
        elif len(f) >= 10 and f[1] == "exec":
            key = (f[3], f[4], f[5], f[-2])
            seen[key] = seen.get(key, 0) + 1
    return isa, [{"primitive": k[0], "implementation": k[1], "prop_kind": k[2], "problem": k[3], "count": n}
                 for k, n in seen.items()]


def torch_build_info():
    """What torch.__config__.show() says of oneDNN and of ATen's own vector
    kernels, with whether oneDNN is available and enabled."""
    text = torch.__config__.show()
    version = next((ln.strip(" -") for ln in text.splitlines() if "MKL-DNN" in ln or "oneDNN" in ln), None)
    capability = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                       if "CPU capability usage" in ln), None)
    return {"mkldnn_available": torch.backends.mkldnn.is_available(),
            "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
            "onednn_version": version, "aten_cpu_capability": capability}


def torch_kernels(probe=None, convolutions=0):
    """Which kernels this torch process runs: BLAS (libraries, OpenBLAS's
    core and build, the OPENBLAS_* variables it saw), oneDNN (build,
    enabled, ISA) and, when probe is given, the oneDNN primitives one call
    of it executed.  convolutions: how many convolutions the probe runs
    forward, so that the report can say how many of them oneDNN ran (the
    others went to PyTorch's own kernels)."""
    out = {"blas": blas_libraries(), "openblas": openblas_info(),
           "openblas_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("OPENBLAS_")},
           "threads": torch.get_num_threads()}
    out.update(torch_build_info())
    out["onednn_isa"], out["onednn_primitives"] = None, []
    if out["mkldnn_available"]:
        try:
            if probe is not None:
                out["onednn_isa"], out["onednn_primitives"] = onednn_summary(onednn_verbose(probe))
            if out["onednn_isa"] is None and ONEDNN_SEEN["isa"] is None:
                # oneDNN prints its ISA with the first primitive it runs
                # verbosely; a probe without convolutions runs none
                x = torch.zeros(2, 16, 8, 8)  # at batch 1 torch may skip oneDNN
                onednn_summary(onednn_verbose(
                    lambda: torch.nn.functional.conv2d(x, torch.zeros(16, 16, 3, 3), padding=1)))
            out["onednn_isa"] = out["onednn_isa"] or ONEDNN_SEEN["isa"]
        except (AssertionError, RuntimeError, OSError) as e:
            out["onednn_error"] = str(e)
    out["convolutions"] = convolutions
    return out


def conv_implementations(k):
    """{prop_kind: {implementation: executions}} of the convolutions in a
    torch_kernels() probe."""
    out = {}
    for p in k.get("onednn_primitives", []):
        if p["primitive"] == "convolution":
            impls = out.setdefault(p["prop_kind"], {})
            impls[p["implementation"]] = impls.get(p["implementation"], 0) + p["count"]
    return out


def kernels_header(k):
    """One line on the BLAS and one on oneDNN, from torch_kernels()."""
    ob = k.get("openblas")
    if ob:
        blas = "OpenBLAS core %s (%s; %s)" % (ob["core"], ob["config"], ob["library"])
    else:
        blas = ", ".join(k["blas"]) or "no BLAS library mapped"
    env = k.get("openblas_env", {})
    blas += "; OPENBLAS_CORETYPE %s" % (("=" + env["OPENBLAS_CORETYPE"]) if "OPENBLAS_CORETYPE" in env
                                        else "unset")
    others = ["%s=%s" % (n, v) for n, v in env.items() if n != "OPENBLAS_CORETYPE"]
    if others:
        blas += ", " + ", ".join(others)
    dnn = "%s, %s" % (k["onednn_version"] or "oneDNN not in torch's build",
                      "enabled" if k["mkldnn_available"] and k["mkldnn_enabled"] else "NOT used")
    if k.get("onednn_isa"):
        dnn += ", ISA %s" % k["onednn_isa"]
    if k.get("onednn_error"):
        dnn += " (verbose mode failed: %s)" % k["onednn_error"]
    dnn += "; ATen's own kernels: %s" % (k["aten_cpu_capability"] or "?")
    return ["BLAS:    " + blas, "oneDNN:  " + dnn]


def kernels_convs(k):
    """The convolutions of a probe in a few words: which oneDNN
    implementation ran each direction, and how many forward convolutions
    were left to PyTorch's own kernels."""
    impl = conv_implementations(k)
    if not k.get("convolutions"):
        return "no convolutions"
    if not impl:
        return "%d convolutions, none in oneDNN (PyTorch's own kernels)" % k["convolutions"]
    words = []
    for prop in ("forward_training", "forward_inference", "backward_data", "backward_weights"):
        if prop in impl:
            words.append("%s %s" % (prop.replace("_training", ""),
                                    " + ".join("%s x%d" % kv for kv in impl[prop].items())))
    fwd = sum(sum(impl.get(p, {}).values()) for p in ("forward_training", "forward_inference"))
    rest = k["convolutions"] - fwd
    if rest > 0:
        words.append("%d of %d forward convolutions outside oneDNN" % (rest, k["convolutions"]))
    return "oneDNN " + "; ".join(words)


# glibc's malloc hands large freed blocks back to the kernel (munmap, and
# trimming the heap's top) and the next step faults them in again, page by
# page.  PyTorch allocates its activations and gradients afresh every step,
# so on a machine where page faults are dear (a virtual machine) its steps
# took up to twice as long and varied from run to run; cleave's programs
# plan one arena and fault nothing after their first step.  PyTorch's CPU
# tuning advice is an allocator that keeps its memory (jemalloc, tcmalloc);
# these glibc settings do the same, so the PyTorch side runs at its best.
MALLOC_KEEP = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}


def torch_env(threads, base=None):
    """The environment of a torch worker: T threads for torch's OpenMP and
    the BLAS libraries, OPENBLAS_CORETYPE removed so that OpenBLAS chooses
    the kernels for this CPU, malloc keeping its memory (MALLOC_KEEP), and
    oneDNN's verbose switches removed so that no timed step prints.  base:
    the environment to start from (default os.environ)."""
    t = str(threads)
    env = dict(os.environ if base is None else base, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t,
               OPENBLAS_NUM_THREADS=t, **MALLOC_KEEP)
    for k in ("OPENBLAS_CORETYPE", "ONEDNN_VERBOSE", "DNNL_VERBOSE", "MKLDNN_VERBOSE"):
        env.pop(k, None)
    return env


def torch_worker(job):
    """Runs in its own process: one timed torch training run, result as JSON."""
    torch.set_num_threads(job.get("threads", 1))
    model = build_job_model(job)
    model.load_state_dict(torch.load(job["weights"]))
    model.train()
    x_all = torch.from_numpy(np.load(job["x"]))
    y_all = torch.from_numpy(np.load(job["y"]))
    batch, steps, warm = job["batch"], job["steps"], job["warmup"]
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"])
    if job.get("kind") == "lm":
        # logits [B, T, C] and labels [B, T]: the mean over every position
        def loss_fn(out, y):
            return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    else:
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
    out = {
        "samples_per_s": timed * batch / (t1 - t0),
        "timed_steps": timed,
        "timed_s": t1 - t0,
        "loss_first": first,
        "loss_last": loss.item(),
        "threads": torch.get_num_threads(),
        "blas": blas_libraries(),
    }
    if job.get("kernels"):
        # after the timed steps, so that they run as they always do; one
        # more forward and backward on the first batch, no update
        convs = sum(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
        out["kernels"] = torch_kernels(lambda: loss_fn(model(x_all[:batch]), y_all[:batch]).backward(),
                                       convs)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


def run_torch(script, job, env=None):
    """One torch worker in the environment env (default torch_env() for the
    job's thread count, as bench_dp.py's single process and DDP processes
    get it)."""
    if env is None:
        env = torch_env(job.get("threads", 1))  # bench_dp.py's jobs say nothing: 1
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


def workloads(names, steps):
    """The chosen models as dicts, MLPs first, in the order of MODELS and
    CNN_MODELS; steps overrides every default when given."""
    out = []
    for name, in_dim, hidden, batch, k in MODELS:
        if name in names:
            out.append({"name": name, "kind": "mlp", "in_dim": in_dim, "hidden": hidden,
                        "sample": (in_dim,), "batch": batch, "steps": steps or k, "check": "first last"})
    for name, sample, batch, k, check in CNN_MODELS:
        if name in names:
            out.append({"name": name, "kind": "cnn", "sample": sample, "batch": batch,
                        "steps": steps or k, "check": check})
    for name, batch, k, opset in LM_MODELS:
        if name in names:
            sample, classes = LM_SHAPES[name]
            out.append({"name": name, "kind": "lm", "sample": sample, "batch": batch, "classes": classes,
                        "tokens": name == "gpt_mini", "opset": opset, "steps": steps or k,
                        "check": "first last"})
    return out


def export_model(w, onnx_path, weights):
    """Builds the model from WEIGHT_SEED, saves its state for the torch
    side and exports it for training; returns (parameter count, layers)."""
    torch.manual_seed(WEIGHT_SEED)
    if w["kind"] == "mlp":
        model = build_model(w["in_dim"], w["hidden"])
        layers = [w["in_dim"]] + w["hidden"] + [N_CLASSES]
    elif w["kind"] == "lm":
        model = build_lm(w["name"])
        layers = None
    else:
        model = build_cnn(w["name"])
        layers = None
    shape = (w["batch"],) + tuple(w["sample"])
    x = torch.zeros(shape, dtype=torch.int64) if w.get("tokens") else torch.zeros(shape)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.train(), (x,), onnx_path,
                          export_params=True, opset_version=w.get("opset", OPSET),
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False,
                          input_names=["input"], output_names=["logits"])
    # Saved after the export: tracing runs the model once in training mode,
    # which moves batch norm's running statistics, and the file holds the
    # moved ones (they do not enter a training step's loss, but both sides
    # start from one state).
    torch.save(model.state_dict(), weights)
    return sum(p.numel() for p in model.parameters()), layers


def bench_model(args, workdir, w):
    name, batch, steps = w["name"], w["batch"], w["steps"]
    mdir = os.path.join(workdir, name)
    os.makedirs(mdir)
    onnx_path = os.path.join(mdir, "model.onnx")
    weights = os.path.join(mdir, "weights.pt")
    x_path = os.path.join(mdir, "x.npy")
    y_path = os.path.join(mdir, "y.npy")
    prog = os.path.join(mdir, "prog")
    metrics = os.path.join(mdir, "metrics.jsonl")

    params, layers = export_model(w, onnx_path, weights)

    # One distinct batch per step: rows = steps * batch, no wrap-around.
    rng = np.random.default_rng(DATA_SEED)
    rows = steps * batch
    if w.get("tokens"):
        # token windows one longer than the input: each position's label is
        # the next token
        seq = rng.integers(0, w["classes"], size=(rows, w["sample"][0] + 1), dtype=np.int64)
        np.save(x_path, np.ascontiguousarray(seq[:, :-1]))
        np.save(y_path, np.ascontiguousarray(seq[:, 1:]))
    else:
        np.save(x_path, rng.standard_normal((rows,) + tuple(w["sample"]), dtype=np.float32))
        labels = (rows, w["sample"][0]) if w["kind"] == "lm" else rows  # a class per token
        np.save(y_path, rng.integers(0, w.get("classes", N_CLASSES), size=labels, dtype=np.int64))

    warm = warmup_steps(steps)
    job = {"kind": w["kind"], "model": name, "in_dim": w.get("in_dim"), "hidden": w.get("hidden"),
           "weights": weights, "x": x_path, "y": y_path,
           "batch": batch, "steps": steps, "warmup": warm, "lr": LR, "threads": args.threads}
    log("[%s] %d params, batch %d, %d steps (%d warm-up), %d runs"
        % (name, params, batch, steps, warm, args.runs))

    cl_runs, th_runs = [], []
    env = torch_env(args.threads)
    for r in range(args.runs):
        c = run_cleave(args.cleave, onnx_path, prog, x_path, y_path, batch, steps, warm, metrics, args.threads)
        cl_runs.append(c)
        log("[%s] run %d/%d cleave: compile %.2f s, %.1f samples/s"
            % (name, r + 1, args.runs, c["compile_s"], c["samples_per_s"]))
        # the first run also reports the kernels (after its timed steps)
        t = run_torch(os.path.abspath(__file__), dict(job, kernels=(r == 0)), env)
        th_runs.append(t)
        log("[%s] run %d/%d torch:  %.1f samples/s" % (name, r + 1, args.runs, t["samples_per_s"]))

    c0, t0 = cl_runs[0], th_runs[0]
    first_ok = close(c0["loss_first"], t0["loss_first"])
    last_ok = close(c0["loss_last"], t0["loss_last"])
    loss_ok = first_ok and (last_ok or w["check"] == "first")
    if not loss_ok:
        log("[%s] WARNING: losses differ: cleave first/last %.6g/%.6g, torch %.6g/%.6g"
            % (name, c0["loss_first"], c0["loss_last"], t0["loss_first"], t0["loss_last"]))

    cl_med = statistics.median(c["samples_per_s"] for c in cl_runs)
    th_med = statistics.median(t["samples_per_s"] for t in th_runs)
    return {
        "model": name,
        "kind": w["kind"],
        "layers": layers,
        "sample_shape": list(w["sample"]),
        "params": params,
        "batch": batch,
        "steps": steps,
        "warmup_steps": warm,
        "cleave_samples_per_s": cl_med,
        "torch_samples_per_s": th_med,
        "ratio": cl_med / th_med,
        "cleave_compile_s": statistics.median(c["compile_s"] for c in cl_runs),
        "loss_check": {"ok": loss_ok, "rtol": LOSS_RTOL, "checked": w["check"].split(),
                       "first_agree": first_ok, "last_agree": last_ok,
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
        "torch_kernels": th_runs[0].get("kernels"),
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
    if report.get("torch_kernels"):
        for line in kernels_header(report["torch_kernels"]):
            print(line)
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
    print("torch's kernels per model (one more forward and backward after the first run's timed steps):")
    for r in report["results"]:
        k = r.get("torch_kernels")
        print("  %-*s %s" % (widths[0], r["model"], kernels_convs(k) if k else "?"))
    print()
    for r in report["results"]:
        lc = r["loss_check"]
        if "last" in lc["checked"]:
            verdict = "agree" if lc["ok"] else "DIFFER"
        else:
            verdict = "step 1 %s; step %d not compared: batch norm from a random init" % (
                "agrees" if lc["first_agree"] else "DIFFERS", r["steps"])
        print("%s: loss step 1 cleave %.6f torch %.6f, step %d cleave %.6f torch %.6f (%s)"
              % (r["model"], lc["cleave_first"], lc["torch_first"], r["steps"],
                 lc["cleave_last"], lc["torch_last"], verdict))
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

    names = [m[0] for m in MODELS] + [m[0] for m in CNN_MODELS] + [m[0] for m in LM_MODELS]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", default=os.path.join(ROOT, "build-dev", "cleave"),
                    help="the cleave compiler (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each side per model (default 5)")
    ap.add_argument("--steps", type=int,
                    help="steps per run for every model (default: %s)"
                    % ", ".join("%d for %s" % (m[4], m[0]) for m in MODELS)
                    + ", %s" % ", ".join("%d for %s" % (m[3], m[0]) for m in CNN_MODELS)
                    + ", %s" % ", ".join("%d for %s" % (m[2], m[0]) for m in LM_MODELS))
    ap.add_argument("--models", nargs="+", choices=names + sorted(FAMILIES),
                    help="only these models; mlp, cnn or lm for all of a family (default: all)")
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
    chosen = set()
    for n in args.models or names:
        chosen.update(FAMILIES.get(n, [n]))

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
        for w in workloads(chosen, args.steps):
            report["results"].append(bench_model(args, workdir, w))
    report["total_s"] = time.perf_counter() - t_start
    report["load_after"] = load_average()
    report["torch_threads"] = report["results"][0]["torch_threads"]
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
