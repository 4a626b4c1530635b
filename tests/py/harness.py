"""What the Python test scripts share: PASS/FAIL reporting, running commands,
comparing arrays, MPI's environment and the work folder.

A script makes one Report, calls rep.check(label, ok, detail) per check (a
line "PASS label" or "FAIL label: detail"), and ends with rep.summary(),
which prints "N passed, M failed" and returns the exit status.

Skips are visible: ctest runs these scripts with SKIP_RETURN_CODE 77
(SKIP_STATUS), and reports a test that exits so as skipped, not passed.  A
script that cannot run at all (a missing module or program) returns
skip(why); one that runs some checks but not others calls rep.skip(label,
why) for those, and rep.summary() then closes "N passed, M failed, K
skipped" (and exits 77 when nothing else ran).

CLEAVE_TEST_HIDE=torch,mpirun (names separated by commas) makes the named
Python modules fail to import, and missing() report the named modules and
programs as absent, so the skip paths can be tried on a machine that has
them all.

Scripts in tests/py import it directly; others put this folder on sys.path
first.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TIMEOUT = 300  # seconds per command unless the caller says otherwise
SKIP_STATUS = 77  # the SKIP_RETURN_CODE tests/CMakeLists.txt gives every test

HIDDEN = frozenset(n.strip() for n in os.environ.get("CLEAVE_TEST_HIDE", "").split(",") if n.strip())


class _HiddenModules:
    """An import hook refusing the modules CLEAVE_TEST_HIDE names (and their
    submodules), as if they were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ImportError("%s hidden by CLEAVE_TEST_HIDE" % name)
        return None


if HIDDEN:
    sys.meta_path.insert(0, _HiddenModules())


def skip(why):
    """Says why the whole script cannot run; returns the skip status, for
    `return harness.skip(...)` from main()."""
    print("SKIP: %s" % why)
    sys.stdout.flush()
    return SKIP_STATUS


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def check(self, label, ok, detail=""):
        """One PASS/FAIL line; the detail is printed on failure only."""
        if ok:
            self.passed += 1
            print("PASS %s" % label)
        else:
            self.failed += 1
            print("FAIL %s%s" % (label, ": " + str(detail) if detail else ""))
        sys.stdout.flush()
        return ok

    def equal(self, label, got, want):
        return self.check("%s == %r" % (label, want), got == want,
                          "got %r, expected %r" % (got, want))

    def guarded(self, label, fn):
        """Run fn() and return its result; a Python error inside it counts
        as a failed check (and gives None)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any error is a test failure
            self.check(label, False, "%s: %s" % (type(e).__name__, e))
            return None

    def executable(self, path):
        """Checks that the binary under test can be run."""
        return self.check("cleave binary %s is executable" % path,
                          os.path.isfile(path) and os.access(path, os.X_OK))

    def skip(self, label, why, count=1):
        """`count` checks that cannot run here: a line "SKIP label: why";
        counted apart, never as passed."""
        self.skipped += count
        print("SKIP %s: %s" % (label, why))
        sys.stdout.flush()

    def summary(self):
        """Prints "N passed, M failed" (", K skipped" when some were);
        returns the exit status: 1 on failure, SKIP_STATUS when every check
        was skipped, else 0."""
        line = "%d passed, %d failed" % (self.passed, self.failed)
        if self.skipped:
            line += ", %d skipped" % self.skipped
        print(line)
        if self.failed:
            return 1
        return SKIP_STATUS if self.skipped and not self.passed else 0


def run(cmd, cwd=None, env=None, timeout=TIMEOUT):
    """Runs cmd with stdout and stderr captured as text; returns the
    CompletedProcess and the seconds it took."""
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=timeout, cwd=cwd, env=env)
    return p, time.time() - t0


def run_group(cmd, env=None, timeout=TIMEOUT):
    """(exit status, stdout, stderr) of cmd run in a process group of its
    own; the status is None when it could not start or ran past
    `timeout`.  Past it, or when the wait is interrupted (Ctrl-C, a
    signal), the whole group, mpirun and the ranks it started included,
    is stopped with SIGTERM and 5 s later SIGKILL, so that nothing
    outlives the test; an interruption is then raised again."""
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                             env=env, start_new_session=True)
    except OSError as e:
        return None, "", "cannot start %s: %s" % (cmd[0], e)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except BaseException as e:
        out, err = "", ""
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = p.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        return None, out or "", "timed out after %d s; %s" % (timeout, (err or "").strip()[-300:])


def failure(cmd, p):
    """A failed command in one line: the command, its status and the end of
    what it printed."""
    return "%s exited %d: %s" % (" ".join(cmd), p.returncode,
                                 (p.stderr.strip() or p.stdout.strip())[-1500:])


def missing(modules=(), programs=()):
    """The first of the Python modules and programs on PATH a script needs
    that is not there, as a SKIP reason; None when all are."""
    import importlib
    for m in modules:
        if m in HIDDEN:  # it may have been imported before this module
            return "%s not available" % m
        try:
            importlib.import_module(m)
        except ImportError:
            return "%s not available" % m
    for p in programs:
        if p in HIDDEN or not shutil.which(p):
            return "%s not available" % p
    return None


def compile_available(cleave):
    """False while the binary has no `compile` command."""
    p, _ = run([cleave, "compile", "--help"], timeout=60)
    return "unknown command" not in p.stdout + p.stderr


def compare(got, want, rtol, atol):
    """(ok, detail) for two arrays of the same shape: |got - want| <= atol +
    rtol |want| everywhere, and got finite."""
    import numpy as np  # not at the top: scripts import this module before they know numpy is there

    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return False, "shape %s, expected %s" % (list(got.shape), list(want.shape))
    if not np.all(np.isfinite(got)):
        return False, "non-finite values in result"
    bad = np.abs(got - want) > atol + rtol * np.abs(want)
    if not bad.any():
        return True, ""
    err = np.abs(got - want)
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    first = tuple(int(v) for v in np.argwhere(bad)[0])
    return False, ("%d of %d elements differ; worst at %s: got %.9g, expected %.9g "
                   "(abs err %.3g); first at %s: got %.9g, expected %.9g" % (
                       int(bad.sum()), bad.size, tuple(int(v) for v in i), got[i], want[i],
                       err[i], first, got[first], want[first]))


def mpi_env(**extra):
    """This environment for mpirun, which refuses root unless told, plus
    `extra` (MCA settings)."""
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(extra)
    return env


def mpirun(ranks, argv):
    """The command line that starts argv on `ranks` processes."""
    return ["mpirun", "--oversubscribe", "-np", str(ranks)] + list(argv)


def run_mpi(ranks, argv, timeout=TIMEOUT):
    """run() of argv under mpirun on `ranks` processes, with the MCA
    settings of a shared machine (no single-copy mechanism: containers
    often forbid it).  Open MPI's launcher sometimes fails to set up its
    session folder when other mpirun jobs come and go at the same moment
    ("orte_session_dir failed", before any rank starts): that launch is
    tried again, twice at most."""
    env = mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
    for _ in range(3):
        p, secs = run(mpirun(ranks, argv), env=env, timeout=timeout)
        if p.returncode == 0 or "orte_session_dir failed" not in p.stderr:
            break
        time.sleep(1)
    return p, secs


@contextlib.contextmanager
def workdir(path, prefix):
    """The folder a script writes into: `path` (created when missing and
    kept), or without it a temporary folder removed at the end."""
    if path:
        path = os.path.abspath(path)
        os.makedirs(path, exist_ok=True)
        yield path
        return
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def image_data(work, rows, seed):
    """Writes x.npy (rows of 1x28x28 standard normals) and y.npy (labels
    0..9) into work; returns the --data flags feeding them to the inputs
    "input" and "labels"."""
    import numpy as np
    rng = np.random.default_rng(seed)
    np.save(os.path.join(work, "x.npy"), rng.standard_normal((rows, 1, 28, 28)).astype(np.float32))
    np.save(os.path.join(work, "y.npy"), rng.integers(0, 10, rows).astype(np.int64))
    return ["--data", "input=" + os.path.join(work, "x.npy"), "--data", "labels=" + os.path.join(work, "y.npy")]


def read_losses(path):
    """The per-step losses of a program's --metrics file."""
    out = []
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "step" in o:
                out.append(o["loss"])
    return out


def read_weights(path):
    """Initializer name -> numpy array of an ONNX file."""
    import onnx
    from onnx import numpy_helper
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


def run_models(models, known, path, prefix, run):
    """Runs run(report, name, workdir) for each name of the comma-separated
    `models`, which must all be in `known`, in one workdir(path, prefix);
    returns the exit status (2 for an unknown name)."""
    names = [m for m in models.split(",") if m]
    unknown = [m for m in names if m not in known]
    if unknown:
        print("unknown models %s (known: %s)" % (unknown, ", ".join(known)))
        return 2
    rep = Report()
    with workdir(path, prefix) as work:
        for name in names:
            run(rep, name, work)
    return rep.summary()


def train_against(rep, tag, argv, ranks, metrics, ref_losses, rtol, atol):
    """Runs a compiled program (argv, writing --metrics to `metrics`) on
    `ranks` processes and checks that it trains and that its per-step
    losses are ref_losses; returns whether it trained."""
    if ranks > 1:
        argv = mpirun(ranks, argv)
    p, _ = run(argv, env=mpi_env(), timeout=900)
    if not rep.check("%s: trains" % tag, p.returncode == 0, failure(argv, p)):
        return False
    losses = read_losses(metrics)
    ok, detail = compare(losses, ref_losses, rtol, atol)
    rep.check("%s: %d losses match PyTorch's (float64)" % (tag, len(ref_losses)),
              ok and len(losses) == len(ref_losses), detail)
    return True


def begin(workdir=None, modules=(), programs=(), workdir_required=False):
    """The opening of a script's main(): parses --cleave and --workdir
    (default `workdir`, or required), says SKIP when a
    module or program it needs is missing, and checks that the compiler
    can be run.  Returns (args, rep) to go on with, or (None, status) for
    main() to return."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", default=workdir, required=workdir_required)
    args = ap.parse_args()
    why = missing(modules, programs)
    if why:
        return None, skip(why)
    rep = Report()
    if not rep.executable(args.cleave):
        return None, rep.summary()
    return args, rep


def model_args(env, default):
    """The arguments of a script that trains models: --cleave, --workdir
    and --models (default: the environment variable env, else default)."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir")
    ap.add_argument("--models", default=os.environ.get(env, default))
    return ap.parse_args()
