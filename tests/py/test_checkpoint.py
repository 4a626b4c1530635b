#!/usr/bin/env python3
"""Checkpoints, resuming and preemption lose no work and change no numbers.

The model is an MLP with batch norm (running statistics) and dropout,
trained with AdamW (two moments per weight), a cosine schedule with
warmup, --shuffle and --seed: every kind of state a checkpoint must hold.

- Writing checkpoints changes no loss; `latest` names the newest.
- Resuming from step 10 of 24 gives the uninterrupted run's losses 11..24,
  the same bits on the same program, and rtol 1e-5 under other layouts
  (dp 2, pipeline 2, hybrid 2x2), also from a checkpoint dp 2 wrote.
- A damaged or cut-short checkpoint is caught by its checksum and the
  previous one used, with a warning; none intact is an error.
- A checkpoint of another batch, optimizer, model or data order is refused
  with a line naming the difference; one at or past --steps too.
- kill -9 while checkpoints are written leaves `latest` naming an intact
  checkpoint, and resuming from it gives the uninterrupted run's bits;
  kill -9 during --save leaves the previous model or the new one, whole.
- SIGTERM to mpirun, and SIGINT to a one-rank program: the run stops after
  a step, writes a checkpoint, says so and exits non-zero (143, 130); the
  resumed run ends with the uninterrupted run's losses.
- A full file system (a small tmpfs; SKIP without root): a clear error,
  and the previous checkpoint stays the latest and intact.

usage: test_checkpoint.py --cleave BIN [--workdir DIR]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

BATCH, ROWS, STEPS = 16, 128, 24
TRAIN = ["--loss", "ce", "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.01",
         "--lr-schedule", "cosine", "--warmup-steps", "3"]
LAYOUTS = [("single", 1, []),
           ("dp2", 2, ["--ranks", "2", "--strategy", "dp"]),
           ("pipeline2", 2, ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "1"]),
           ("hybrid2x2", 4, ["--ranks", "4", "--strategy", "hybrid", "--dp", "2", "--microbatches", "1"])]


def export(torch, path, hidden=64):
    nn = torch.nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(20, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.3),
                      nn.Linear(hidden, 64), nn.ReLU(), nn.Linear(64, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m.train(), torch.zeros(BATCH, 20), path, training=torch.onnx.TrainingMode.TRAINING,
                          opset_version=13, do_constant_folding=False, input_names=["input"],
                          output_names=["logits"])


class Run:
    """Compiles programs and runs them in one folder."""

    def __init__(self, rep, cleave, work):
        self.rep, self.cleave, self.work = rep, cleave, work
        self.files = ["--data", "input=" + self.path("x.npy"), "--data", "labels=" + self.path("y.npy")]

    def path(self, *names):
        return os.path.join(self.work, *names)

    def compile(self, name, model, flags, train=TRAIN, batch=BATCH):
        prog = self.path(name)
        cmd = [self.cleave, "compile", model, "-o", prog, "--batch", str(batch)] + train + flags
        p, _ = harness.run(cmd)
        self.rep.check("%s: compiles" % name, p.returncode == 0, harness.failure(cmd, p))
        return prog

    def argv(self, prog, ranks, extra, shuffle):
        argv = [prog] + self.files + ["--shuffle", shuffle, "--seed", "3", "--log-every", "0"] + list(extra)
        return harness.mpirun(ranks, argv) if ranks > 1 else argv

    def run(self, prog, ranks, extra, timeout=300, shuffle="5"):
        """(status, stderr) of a run."""
        argv = self.argv(prog, ranks, extra, shuffle)
        env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none")
        p, _ = harness.run(argv, env=env, timeout=timeout)
        return p.returncode, p.stderr

    def start(self, prog, ranks, extra):
        """The run as a process of its own session, for signals."""
        env = harness.mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none")
        return subprocess.Popen(self.argv(prog, ranks, extra, "5"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                universal_newlines=True, env=env, start_new_session=True)


def losses(path):
    """step -> loss of a --metrics file."""
    out = {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "step" in o:
                out[o["step"]] = o["loss"]
    return out


def latest(ck):
    try:
        with open(os.path.join(ck, "latest")) as f:
            return f.read().strip()
    except OSError:
        return None


def step_of(name):
    return int(name.split("-")[1]) if name else None


def same_tail(got, ref, rtol):
    """(ok, detail): got's steps are ref's from got's first step on."""
    if not got:
        return False, "no steps"
    steps = sorted(got)
    want = [ref[s] for s in range(steps[0], max(ref) + 1)]
    have = [got[s] for s in steps]
    if len(have) != len(want):
        return False, "steps %d..%d, expected %d..%d" % (steps[0], steps[-1], steps[0], max(ref))
    if rtol == 0:
        bad = [(s, a, b) for s, a, b in zip(steps, have, want) if a != b]
        return not bad, "first difference %s" % (bad[:1],)
    return harness.compare(have, want, rtol, 1e-7)


def set_latest(src, dst, step):
    """A copy of checkpoint folder src whose `latest` names `step`."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "latest"), "w") as f:
        f.write("step-%09d\n" % step)


def check_resume(rep, r, progs, ref, ref_dp2):
    single = progs["single"]
    ck = r.path("ck")
    rc, err = r.run(single, 1, ["--steps", str(STEPS), "--metrics", r.path("ck.jsonl"), "--checkpoint", ck,
                                "--checkpoint-every", "5", "--checkpoint-keep", "10"])
    rep.check("a run writing checkpoints trains", rc == 0, err[-800:])
    ok, detail = same_tail(losses(r.path("ck.jsonl")), ref, 0)
    rep.check("... with the losses of a run writing none, bit for bit", ok, detail)
    names = sorted(n for n in os.listdir(ck) if n.startswith("step-"))
    rep.equal("... a checkpoint every 5 steps and one at the end", names,
              ["step-%09d" % s for s in (5, 10, 15, 20, 24)])
    rep.equal("... 'latest' names the last", latest(ck), "step-000000024")
    rep.check("... nothing else is left in the folder", set(os.listdir(ck)) == set(names) | {"latest"},
              os.listdir(ck))
    import onnx
    saved = onnx.load(os.path.join(ck, "step-000000010", "model.onnx"))
    onnx.checker.check_model(saved)
    rep.check("a checkpoint's model.onnx passes onnx.checker and holds every initializer of the model",
              {i.name for i in saved.graph.initializer} >= {"0.weight", "1.running_mean", "4.weight"},
              [i.name for i in saved.graph.initializer])
    try:
        import onnxruntime as ort
        import numpy as np
        sess = ort.InferenceSession(os.path.join(ck, "step-000000010", "model.onnx"))
        out = sess.run(None, {"input": np.load(r.path("x.npy"))[:BATCH]})
        rep.check("a checkpoint's model.onnx loads and runs in ONNX Runtime", out[0].shape == (BATCH, 10))
    except ImportError:
        rep.skip("a checkpoint's model.onnx loads in ONNX Runtime", "onnxruntime not available")

    at10 = r.path("at10")
    set_latest(ck, at10, 10)
    rc, err = r.run(single, 1, ["--steps", str(STEPS), "--metrics", r.path("res.jsonl"), "--resume", at10])
    rep.check("resume from step 10 runs, and says where it starts",
              rc == 0 and "resuming from %s/step-000000010 at step 10 of 24" % at10 in err, err[-800:])
    ok, detail = same_tail(losses(r.path("res.jsonl")), ref, 0)
    rep.check("... steps 11..24 numbered as before, with the uninterrupted run's losses, bit for bit", ok, detail)
    for name, ranks, _ in LAYOUTS[1:]:
        rc, err = r.run(progs[name], ranks, ["--steps", str(STEPS), "--metrics", r.path(name + ".jsonl"),
                                             "--resume", at10])
        ok, detail = same_tail(losses(r.path(name + ".jsonl")), ref, 1e-5) if rc == 0 else (False, err[-800:])
        rep.check("a checkpoint of one process resumes under %s: losses 11..24 within rtol 1e-5" % name, ok, detail)

    # Written under dp 2, resumed by one process.
    ck2 = r.path("ck_dp2")
    shutil.rmtree(ck2, ignore_errors=True)
    proc = r.start(progs["dp2"], 2, ["--steps", str(STEPS), "--checkpoint", ck2, "--checkpoint-every", "10",
                                     "--checkpoint-keep", "5"])
    out, err = proc.communicate(timeout=300)
    rep.check("dp 2 writes checkpoints", proc.returncode == 0 and latest(ck2) == "step-000000024", err[-800:])
    set_latest(ck2, r.path("dp2_at10"), 10)
    rc, err = r.run(single, 1, ["--steps", str(STEPS), "--metrics", r.path("from_dp2.jsonl"),
                                "--resume", r.path("dp2_at10")])
    ok, detail = same_tail(losses(r.path("from_dp2.jsonl")), ref, 1e-5) if rc == 0 else (False, err[-800:])
    rep.check("a checkpoint dp 2 wrote resumes in one process: losses within rtol 1e-5", ok, detail)
    rc, err = r.run(progs["dp2"], 2, ["--steps", str(STEPS), "--metrics", r.path("dp2_again.jsonl"),
                                      "--resume", r.path("dp2_at10")])
    ok, detail = same_tail(losses(r.path("dp2_again.jsonl")), ref_dp2, 0) if rc == 0 else (False, err[-800:])
    rep.check("... and in dp 2 again, bit for bit", ok, detail)
    return ck


def damage(path, how):
    with open(path, "r+b") as f:
        if how == "flip":
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x40]))
        else:
            f.truncate(os.path.getsize(path) - 100)


def check_damaged(rep, r, prog, ck, ref):
    for what, how in (("state.bin", "flip"), ("model.onnx", "truncate")):
        d = r.path("damaged_" + what)
        set_latest(ck, d, 20)
        damage(os.path.join(d, "step-000000020", what), how)
        # the newest before the damaged one is then 15
        shutil.rmtree(os.path.join(d, "step-000000024"))
        rc, err = r.run(prog, 1, ["--steps", str(STEPS), "--metrics", r.path("dmg.jsonl"), "--resume", d])
        said = ("%s/step-000000020: %s fails its checksum (damaged or cut short); resuming from %s/step-000000015"
                % (d, what, d)) in err
        rep.check("a %s latest checkpoint (%s) is caught and the previous intact one used, with a warning"
                  % ("flipped bit in" if how == "flip" else "cut-short", what), rc == 0 and said, err[-800:])
        ok, detail = same_tail(losses(r.path("dmg.jsonl")), ref, 0)
        rep.check("... and the run goes on from step 15 with the uninterrupted run's losses", ok, detail)
    d = r.path("all_damaged")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copytree(os.path.join(ck, "step-000000010"), os.path.join(d, "step-000000010"))
    damage(os.path.join(d, "step-000000010", "state.bin"), "truncate")
    rc, err = r.run(prog, 1, ["--steps", str(STEPS), "--resume", d])
    rep.check("no intact checkpoint: exit 1 naming the damage",
              rc == 1 and "no intact checkpoint" in err and "step-000000010: state.bin fails its checksum" in err,
              (rc, err[-500:]))


def check_refused(rep, r, model, other_model, progs):
    at10 = r.path("at10")
    sgd = ["--loss", "ce", "--optimizer", "sgd", "--lr", "0.01"]
    cases = [  # what differs, the program, the line, flags, --shuffle
        ("another batch", r.compile("batch32", model, [], batch=32),
         "was written with batch 16, this program trains with batch 32", [], "5"),
        ("another optimizer", r.compile("sgd", model, [], train=sgd),
         'another optimizer: optimizer name "adamw" there, "sgd" in this program', [], "5"),
        ("another model", r.compile("wider", other_model, []),
         "parameter '0.weight' has shape [64, 20] there, [96, 20] in this program", [], "5"),
        ("another --shuffle seed", progs["single"], "was written with --shuffle 5, this run has --shuffle 6", [], "6"),
        ("another --lr", progs["single"], "was written with learning rate 0.01, this run has 0.02",
         ["--lr", "0.02"], "5"),
    ]
    for label, prog, want, extra, shuffle in cases:
        rc, err = r.run(prog, 1, ["--steps", str(STEPS), "--resume", at10] + extra, shuffle=shuffle)
        rep.check("a checkpoint of %s is refused, naming the difference" % label,
                  rc == 1 and want in err and err.count("\n") == 1, (rc, err))
    rc, err = r.run(progs["single"], 1, ["--steps", "10", "--resume", at10])
    rep.check("a checkpoint at --steps is refused (exit 2): --steps counts from the start",
              rc == 2 and "is at step 10: a run of 10 steps" in err, (rc, err))
    rc, err = r.run(progs["single"], 1, ["--steps", "10", "--resume", r.path("nowhere")])
    rep.check("--resume of a missing folder: exit 2", rc == 2 and "nowhere: No such file" in err, (rc, err))
    for flags, want in ((["--checkpoint-every", "3"], "--checkpoint-every needs --checkpoint DIR"),
                        (["--checkpoint", r.path("x.npy")], "not a folder"),
                        (["--checkpoint", r.path("c"), "--checkpoint-keep", "0"], "--checkpoint-keep needs an integer"),
                        (["--checkpoint", r.path("c"), "--checkpoint-every", "x"], "--checkpoint-every needs an")):
        rc, err = r.run(progs["single"], 1, ["--steps", "2"] + flags)
        rep.check("%s: exit 2, '%s'" % (" ".join(flags).replace(r.work + "/", ""), want), rc == 2 and want in err,
                  (rc, err))


def check_kill(rep, r, prog, ref_const):
    """kill -9 at random moments while a checkpoint is written every step."""
    rng = random.Random(11)
    for trial in range(4):
        ck = r.path("kill%d" % trial)
        shutil.rmtree(ck, ignore_errors=True)
        proc = r.start(prog, 1, ["--steps", "3000", "--lr-schedule", "constant", "--warmup-steps", "0",
                                 "--checkpoint", ck, "--checkpoint-every", "1"])
        t_end = time.time() + 60
        while (latest(ck) is None or step_of(latest(ck)) < 3) and time.time() < t_end and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.05))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        name = latest(ck)
        rc, err = r.run(prog, 1, ["--steps", "3000", "--lr-schedule", "constant", "--warmup-steps", "0",
                                  "--resume", ck, "--metrics", r.path("kill.jsonl")], timeout=600)
        left = [n for n in os.listdir(ck) if n.startswith(".")]
        ok, detail = same_tail(losses(r.path("kill.jsonl")), ref_const, 0) if rc == 0 else (False, err[-500:])
        rep.check("kill -9 during checkpoints (trial %d, at %s, %d temporaries left): resumes with no warning, "
                  "bit for bit" % (trial, name, len(left)), ok and "warning" not in err, detail)


def check_kill_save(rep, r, prog):
    """kill -9 around --save: the file is the old model or the new one."""
    import onnx
    target = r.path("kept.onnx")
    rc, err = r.run(prog, 1, ["--steps", "2", "--save", target])
    with open(target, "rb") as f:
        old = f.read()
    rng = random.Random(5)
    outcomes = []
    for trial in range(6):
        with open(target, "wb") as f:
            f.write(old)
        proc = r.start(prog, 1, ["--steps", "200", "--save", target])
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        with open(target, "rb") as f:
            now = f.read()
        if now == old:
            outcomes.append("old")
            continue
        try:
            onnx.checker.check_model(onnx.load_from_string(now))
            outcomes.append("new")
        except Exception as e:  # noqa: BLE001
            outcomes.append("broken: %s" % e)
    rep.check("kill -9 at 6 moments of a run with --save: the old model or the new one, whole (%s)"
              % ", ".join(outcomes), all(o in ("old", "new") for o in outcomes), outcomes)


def check_signals(rep, r, progs, ref):
    for label, prog, ranks, sig, code in (("SIGTERM to mpirun (dp 2)", progs["dp2"], 2, signal.SIGTERM, 143),
                                          ("SIGINT to one process", progs["single"], 1, signal.SIGINT, 130)):
        ck = r.path("sig%d" % ranks)
        shutil.rmtree(ck, ignore_errors=True)
        proc = r.start(prog, ranks, ["--steps", "2000000", "--lr-schedule", "constant", "--warmup-steps", "0",
                                     "--checkpoint", ck, "--checkpoint-every", "1000000"])
        time.sleep(3)
        t0 = time.time()
        os.kill(proc.pid, sig)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
        secs = time.time() - t0
        name = latest(ck)
        said = name and ("stopped by %s after step %d of 2000000: checkpoint %s/%s written; continue with "
                         "--resume %s" % (signal.Signals(sig).name, step_of(name), ck, name, ck)) in err
        want_rc = code if ranks == 1 else None
        rep.check("%s: a checkpoint, the message and a non-zero exit (%s) in %.1f s" % (label, proc.returncode, secs),
                  bool(said) and proc.returncode != 0 and (want_rc is None or proc.returncode == want_rc)
                  and secs < 15, (proc.returncode, name, err[-600:]))
        if not name:
            continue
        stop = step_of(name)
        rc, err = r.run(prog, ranks, ["--steps", str(stop + 5), "--lr-schedule", "constant", "--warmup-steps", "0",
                                      "--resume", ck, "--metrics", r.path("sig.jsonl")])
        rep.check("... and resumes at step %d" % (stop + 1),
                  rc == 0 and sorted(losses(r.path("sig.jsonl"))) == list(range(stop + 1, stop + 6)), err[-500:])


def check_full_disk(rep, r, prog):
    disk = r.path("disk")
    os.makedirs(disk, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", disk], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        rep.skip("checkpoints on a full disk", "cannot mount a tmpfs here (needs root)")
        return
    try:
        ck = os.path.join(disk, "ck")
        rc, err = r.run(prog, 1, ["--steps", str(STEPS), "--checkpoint", ck, "--checkpoint-every", "5"])
        rep.check("a full disk at the second checkpoint: exit 1 with one line naming it",
                  rc == 1 and "--checkpoint %s: cannot write step 10: No space left on device" % ck in err
                  and err.count("error:") == 1, (rc, err[-600:]))
        rep.equal("... 'latest' still names the first", latest(ck), "step-000000005")
        rep.check("... and nothing half-written is left", sorted(os.listdir(ck)) == ["latest", "step-000000005"],
                  os.listdir(ck))
        rc, err = r.run(prog, 1, ["--steps", str(STEPS), "--resume", ck])
        rep.check("... and the first resumes", rc == 0 and "warning" not in err, err[-500:])
    finally:
        subprocess.run(["umount", disk], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    why = harness.missing(modules=("torch", "onnx", "numpy"), programs=("mpirun",))
    if why:
        return harness.skip(why)
    import numpy as np
    import torch
    rep = harness.Report()
    with harness.workdir(args.workdir, "cleave_checkpoint_") as work:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        r = Run(rep, args.cleave, work)
        g = torch.Generator().manual_seed(1)
        np.save(r.path("x.npy"), torch.randn(ROWS, 20, generator=g).numpy())
        np.save(r.path("y.npy"), torch.randint(0, 10, (ROWS,), generator=g).numpy().astype(np.int64))
        model, wider = r.path("bn.onnx"), r.path("wider.onnx")
        export(torch, model)
        export(torch, wider, hidden=96)
        progs = {name: r.compile(name, model, flags) for name, _, flags in LAYOUTS}
        rc, err = r.run(progs["single"], 1, ["--steps", str(STEPS), "--metrics", r.path("ref.jsonl")])
        rc2, err2 = r.run(progs["dp2"], 2, ["--steps", str(STEPS), "--metrics", r.path("ref_dp2.jsonl")])
        rc3, err3 = r.run(progs["single"], 1, ["--steps", "3000", "--lr-schedule", "constant", "--warmup-steps", "0",
                                               "--metrics", r.path("ref_const.jsonl")], timeout=600)
        if not rep.check("the uninterrupted runs train", rc == 0 and rc2 == 0 and rc3 == 0, err + err2 + err3):
            return rep.summary()
        ref, ref_dp2 = losses(r.path("ref.jsonl")), losses(r.path("ref_dp2.jsonl"))
        ck = check_resume(rep, r, progs, ref, ref_dp2)
        check_damaged(rep, r, progs["single"], ck, ref)
        check_refused(rep, r, model, wider, progs)
        check_kill(rep, r, progs["single"], losses(r.path("ref_const.jsonl")))
        check_kill_save(rep, r, progs["single"])
        check_signals(rep, r, progs, ref)
        check_full_disk(rep, r, progs["single"])
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
