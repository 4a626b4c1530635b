#!/usr/bin/env python3
"""--timeout S: a rank that waits for a stopped rank stops every rank.

samples/mlp.onnx is compiled as a data-parallel program on 2 ranks and as
a 2-stage pipeline; each trains under mpirun with --timeout 3 and enough
steps to run for minutes.  Once training runs, one rank is stopped with
SIGSTOP (found among mpirun's children by OMPI_COMM_WORLD_RANK).  Then,
within 15 s, mpirun and every rank must be gone (a zombie counts as gone:
a container's PID 1 may never reap it), mpirun must exit non-zero, and
stderr must hold exactly one time-out line naming the waiting rank, the
stopped rank or the group, the step, the operation and "--timeout 3".
The only other error line allowed is the stopped rank's own "stopped by
SIGTERM": mpirun ends it with SIGCONT then SIGTERM, and a rank slow to die
(under ASan, say) may finish its step and report the signal.
Whatever happens, everything the test started is continued and killed at
the end of each case.

Also: --timeout 0 and a fractional time-out are accepted and train; -1,
abc, inf, nan, an empty value and the flag given twice are usage errors
(exit 2); and ranks given different time-outs stop at start-up naming
the flag.  (What the watchdog costs a step is a speed, measured outside
the tests: timed checks fail on a loaded machine.)

usage: test_watchdog.py --cleave BIN --workdir DIR
Ends with a line "N passed, M failed"; SKIP (exit 77) without numpy or
mpirun.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "..", "samples", "mlp.onnx")
BATCH, ROWS = 32, 256
GONE_WITHIN = 15.0  # seconds from SIGSTOP until mpirun and every rank are gone
LINE = re.compile(r"^(\S+): error: rank (\d+): waited 3 s for (.+?)(?: rank (\d+)| over (.+?)) \((.+?)\); "
                  r"stopping every rank \(--timeout 3\)$")


def gone(pid):
    """True when pid no longer runs: absent, or a zombie nobody reaped."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def ranks_of(parent):
    """{MPI rank: pid} of the processes whose parent is `parent` and that
    carry OMPI_COMM_WORLD_RANK (Open MPI starts the ranks of a local job
    itself)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for v in env:
            if v.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(v.split(b"=", 1)[1])] = int(d)
    return out


def kill_all(pids):
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def stop_one(rep, label, prog, files, victim, work):
    """Runs prog on 2 ranks with --timeout 3, SIGSTOPs rank `victim` once
    training runs and checks how the job ends.  Returns the error line's
    match, or None."""
    err_path = os.path.join(work, label.replace(" ", "_") + ".stderr")
    env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
    argv = [prog] + files + ["--steps", "100000000", "--log-every", "200", "--timeout", "3"]
    ranks = {}
    with open(err_path, "w") as err:
        mpirun = subprocess.Popen(harness.mpirun(2, argv), stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        # Training runs once rank 0 logs a step; both ranks are up by then.
        deadline = time.time() + 120
        while time.time() < deadline and mpirun.poll() is None:
            with open(err_path) as f:
                if re.search(r"^step \d+", f.read(), re.M):
                    break
            time.sleep(0.1)
        ranks = ranks_of(mpirun.pid)
        if not rep.check("%s: training runs on ranks 0 and 1" % label,
                         mpirun.poll() is None and sorted(ranks) == [0, 1],
                         "mpirun status %s, ranks %s: %s" % (mpirun.poll(), ranks, open(err_path).read()[-800:])):
            return None
        os.kill(ranks[victim], signal.SIGSTOP)
        t0 = time.time()
        while time.time() - t0 < GONE_WITHIN:
            if mpirun.poll() is not None and all(gone(p) for p in ranks.values()):
                break
            time.sleep(0.05)
        secs = time.time() - t0
        rc = mpirun.poll()
        alive = [r for r, p in ranks.items() if not gone(p)]
        rep.check("%s: mpirun and every rank gone within %g s of SIGSTOP (took %.1f s)" % (label, GONE_WITHIN, secs),
                  rc is not None and not alive, "mpirun status %s, ranks still running: %s" % (rc, alive))
        if rc is None:
            return None
        rep.check("%s: mpirun exits non-zero" % label, rc != 0, "status %d" % rc)
        with open(err_path) as f:
            lines = [ln for ln in f.read().splitlines() if ": error:" in ln]
        errors = [ln for ln in lines if "stopping every rank" in ln]
        others = [ln for ln in lines if ln not in errors and not re.search(r": error: stopped by SIGTERM after step", ln)]
        rep.check("%s: one time-out line, no other error but the stopped rank's SIGTERM" % label,
                  len(errors) == 1 and not others, lines)
        m = LINE.match(errors[0]) if errors else None
        rep.check("%s: the line names the rank, the wait, the step and --timeout 3" % label, m is not None, errors)
        if m:
            rep.equal("%s: the waiting rank" % label, int(m.group(2)), 1 - victim)
            rep.check("%s: the step" % label, re.fullmatch(r"step [1-9]\d*", m.group(6)) is not None, m.group(6))
        return m
    finally:
        kill_all(ranks.values())
        if mpirun.poll() is None:
            mpirun.kill()
        mpirun.wait()


def main():
    args, rep = harness.begin("/tmp/cleave_watchdog", modules=("numpy",), programs=("mpirun",))
    if args is None:
        return rep
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    files = harness.image_data(work, ROWS, 5)

    def compile_(name, flags):
        prog = os.path.join(work, name)
        p, _ = harness.run([args.cleave, "compile", MODEL, "-o", prog, "--batch", str(BATCH), "--loss", "ce",
                            "--ranks", "2"] + flags)
        return prog if rep.check("compile %s" % name, p.returncode == 0, p.stderr.strip()[-400:]) else None

    dp = compile_("dp2", ["--strategy", "dp"])
    pipe = compile_("pipe2", ["--strategy", "pipeline", "--microbatches", "2"])

    if dp:
        m = stop_one(rep, "dp2, rank 1 stopped", dp, files, 1, work)
        if m:
            rep.check("dp2: the wait is a sum over every rank",
                      m.group(5) == "every rank" and re.match(r"the allreduce of gradient bucket \d+$|the loss sum$",
                                                              m.group(3)) is not None, m.group(0))
    if pipe:
        for victim in (0, 1):
            m = stop_one(rep, "pipeline2, rank %d stopped" % victim, pipe, files, victim, work)
            if m:
                rep.check("pipeline2, rank %d stopped: a transfer with rank %d or the loss sum" % (victim, victim),
                          (m.group(4) == str(victim) and re.match(r"a receive from$|a send to$|the step's last "
                                                                   r"sends to$", m.group(3)) is not None)
                          or (m.group(3) == "the loss sum" and m.group(5) == "every rank"), m.group(0))

    if dp:
        # Usage errors, checked before any rank talks to another.
        for bad in ("-1", "abc", "inf", "nan", "", "3s"):
            p, _ = harness.run([dp] + files + ["--steps", "1", "--timeout=" + bad], timeout=60)
            rep.check("--timeout '%s': usage error, exit 2" % bad, p.returncode == 2 and
                      "--timeout needs a number of seconds >= 0, got '%s'" % bad in p.stderr,
                      harness.failure([dp, "--timeout=" + bad], p))
        p, _ = harness.run([dp] + files + ["--steps", "1", "--timeout", "3", "--timeout", "4"], timeout=60)
        rep.check("--timeout twice: usage error, exit 2", p.returncode == 2 and "--timeout given twice" in p.stderr,
                  harness.failure([dp, "--timeout", "3", "--timeout", "4"], p))
        for ok in ("0", "2.5", "7"):
            argv = [dp] + files + ["--steps", "20", "--log-every", "0", "--timeout", ok]
            p, _ = harness.run_mpi(2, argv, timeout=120)
            rep.check("--timeout %s: trains" % ok, p.returncode == 0, harness.failure(argv, p))
        # Every rank must have the same time-out (MPMD: one rank each).
        env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none")
        cmd = (["mpirun", "--oversubscribe", "-np", "1", dp] + files + ["--steps", "2", "--timeout", "3", ":",
                                                                        "-np", "1", dp] + files +
               ["--steps", "2", "--timeout", "4"])
        p, _ = harness.run(cmd, env=env, timeout=120)
        rep.check("ranks with different --timeout stop at start-up", p.returncode == 1 and
                  "rank 1 was started with other options than rank 0" in p.stderr and "--timeout" in p.stderr,
                  harness.failure(cmd, p))

    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
