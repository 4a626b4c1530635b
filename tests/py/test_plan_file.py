#!/usr/bin/env python3
"""cleave compile --plan FILE: compiling a plan file, as written or edited.

Checks that a plan written by --emit-plan compiles back to the same plan
(dp, layer, pipeline 1f1b, hybrid); that `cleave plan --format json`'s
chosen plan compiles to the program --strategy auto builds; that editing
a plan's decisions (micro-batches, schedule, where a stage begins)
compiles the edited plan, says which derived field it recomputed, and
trains to the single-process losses like any other plan; that a plan
trimmed to its decisions compiles silently; and that broken plans and
conflicting flags give one line naming the file and field.

usage: test_plan_file.py --cleave BIN [--workdir DIR]
Ends with "N passed, M failed"; SKIP (exit 77) without mpirun or numpy.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "samples", "mlp.onnx")
BATCH = 32
TRAIN = ["--batch", str(BATCH), "--optimizer", "adam", "--lr", "0.001"]


def cleave(args, *extra):
    p, _ = harness.run([args.cleave] + list(extra), timeout=600)
    return p


def load(path):
    with open(path) as f:
        return json.load(f)


def save(doc, path):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def check_round_trip(rep, args, work):
    """--emit-plan, then --plan of that file: the same plan, no note."""
    layouts = {
        "dp": ["--ranks", "2", "--strategy", "dp", "--bucket-mb", "0.5"],
        "layer": ["--ranks", "2", "--strategy", "layer"],
        "pipeline": ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "4", "--schedule", "1f1b"],
        "hybrid": ["--ranks", "4", "--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "2"],
        "hybrid by stage": ["--ranks", "4", "--strategy", "hybrid", "--dp", "2", "--pp", "2", "--placement",
                            "by_stage"],
    }
    for name, flags in layouts.items():
        slug = name.replace(" ", "_")
        first = os.path.join(work, "rt_%s.json" % slug)
        again = os.path.join(work, "rt_%s_again.json" % slug)
        p = cleave(args, "compile", MODEL, "-o", os.path.join(work, "rt_" + slug), "--emit-plan", first, *(TRAIN + flags))
        if not rep.check("%s: compiles with --emit-plan" % name, p.returncode == 0, p.stderr[-300:]):
            continue
        p = cleave(args, "compile", "--plan", first, "-o", os.path.join(work, "rt_%s_again" % slug), "--emit-plan",
                   again)
        if not rep.check("%s: compiles from its plan file" % name, p.returncode == 0, p.stderr[-300:]):
            continue
        rep.check("%s: no note for an unedited plan" % name, "note:" not in p.stderr, p.stderr[-300:])
        rep.check("%s: the plan compiled is the plan given" % name, load(first) == load(again))


def train(args, work, prog, ranks, steps=6):
    """Per-step losses of prog on `ranks` ranks, or a failure message."""
    metrics = prog + ".jsonl"
    argv = [prog, "--data", "input=" + os.path.join(work, "x.npy"), "--data", "labels=" + os.path.join(work, "y.npy"),
            "--steps", str(steps), "--metrics", metrics, "--log-every", "0"]
    p, _ = harness.run(harness.mpirun(ranks, argv), env=harness.mpi_env(OMPI_MCA_rmaps_base_oversubscribe="1"),
                       timeout=300)
    if p.returncode != 0:
        return None, harness.failure(argv, p)
    return harness.read_losses(metrics), ""


def check_edits(rep, args, work):
    """Edited decisions compile as edited and train like one process."""
    import numpy as np
    rng = np.random.default_rng(11)
    np.save(os.path.join(work, "x.npy"), rng.random((128, 1, 28, 28), dtype=np.float32))
    np.save(os.path.join(work, "y.npy"), rng.integers(0, 10, 128).astype(np.int64))
    single = os.path.join(work, "single")
    p = cleave(args, "compile", MODEL, "-o", single, *TRAIN)
    if not rep.check("single-process program compiles", p.returncode == 0, p.stderr[-300:]):
        return
    want, why = train(args, work, single, 1)
    if not rep.check("single-process program trains", want is not None, why):
        return

    base = os.path.join(work, "base.json")
    p = cleave(args, "compile", MODEL, "-o", os.path.join(work, "base"), "--emit-plan", base, "--ranks", "2",
               "--strategy", "pipeline", "--microbatches", "4", "--schedule", "1f1b", *TRAIN)
    if not rep.check("pipeline plan to edit is written", p.returncode == 0, p.stderr[-300:]):
        return
    doc = load(base)
    nodes = [s["node"] for s in doc["rank_plans"][0]["steps"] if s["kind"] == "compute" and s["phase"] == "forward"]
    moved = nodes[1]  # stage 1 now begins right after the first node
    edits = {
        "microbatches 8, gpipe": lambda d: d.update(microbatches=8, schedule="gpipe"),
        "stage 1 begins at %s" % moved: lambda d: d["stage_table"][1].update(first_node=moved),
    }
    for label, edit in edits.items():
        d = load(base)
        edit(d)
        path = save(d, os.path.join(work, "edited.json"))
        prog = os.path.join(work, "edited")
        out = os.path.join(work, "edited_out.json")
        p = cleave(args, "compile", "--plan", path, "-o", prog, "--emit-plan", out)
        if not rep.check("%s: compiles" % label, p.returncode == 0, p.stderr[-300:]):
            continue
        notes = [l for l in p.stderr.splitlines() if "note:" in l]
        rep.check("%s: one note names the recomputed field" % label,
                  len(notes) == 1 and "edited.json:" in notes[0] and "recomputed" in notes[0], p.stderr[-400:])
        got = load(out)
        if "microbatches" in label:
            rep.check("%s: the compiled plan has them" % label,
                      (got["microbatches"], got["schedule"]) == (8, "gpipe"), (got["microbatches"], got["schedule"]))
        else:
            rep.check("%s: the compiled plan cuts there" % label, got["stage_table"][1]["first_node"] == moved and
                      got["stage_table"][0]["forward_nodes"] == 1, got["stage_table"])
        losses, why = train(args, work, prog, 2)
        if rep.check("%s: trains on 2 ranks" % label, losses is not None, why):
            ok, detail = harness.compare(losses, want, 1e-5, 1e-7)
            rep.check("%s: trains to the single-process losses" % label, ok, detail)

    # trimmed to its decisions: nothing to compare, nothing to say
    d = load(base)
    for k in ("rank_plans", "transfers", "groups", "tag_bound", "micro_batch", "local_batch"):
        d.pop(k, None)
    for row in d["stage_table"]:
        for k in ("last_node", "forward_nodes", "flops"):
            row.pop(k, None)
    p = cleave(args, "compile", "--plan", save(d, os.path.join(work, "trimmed.json")), "-o",
               os.path.join(work, "trimmed"), "--emit-plan", os.path.join(work, "trimmed_out.json"))
    rep.check("a plan trimmed to its decisions compiles without a note", p.returncode == 0 and "note:" not in p.stderr,
              p.stderr[-300:])
    if p.returncode == 0:
        rep.check("... to the plan it was trimmed from", load(os.path.join(work, "trimmed_out.json")) == doc)


def check_auto_plan(rep, args, work):
    """cleave plan's JSON (with predictions) compiles to what auto compiles."""
    plan = os.path.join(work, "auto_plan.json")
    p = cleave(args, "plan", MODEL, "--ranks", "2", "--format", "json", *TRAIN)
    if not rep.check("plan --format json exits 0", p.returncode == 0, p.stderr[-300:]):
        return
    with open(plan, "w") as f:
        f.write(p.stdout)
    a, b = os.path.join(work, "auto_a.json"), os.path.join(work, "auto_b.json")
    p1 = cleave(args, "compile", MODEL, "-o", os.path.join(work, "auto_a"), "--ranks", "2", "--strategy", "auto",
                "--emit-plan", a, *TRAIN)
    p2 = cleave(args, "compile", "--plan", plan, "-o", os.path.join(work, "auto_b"), "--emit-plan", b)
    if rep.check("auto and --plan of cleave plan's choice compile", p1.returncode == 0 and p2.returncode == 0,
                 p1.stderr[-200:] + p2.stderr[-200:]):
        rep.check("they compile the same plan", load(a) == load(b))
        rep.check("the predictions in the file are not taken for derived fields", "note:" not in p2.stderr,
                  p2.stderr[-300:])


def check_errors(rep, args, work):
    base = load(os.path.join(work, "rt_pipeline.json"))

    def mutated(name, fn):
        d = json.loads(json.dumps(base))
        fn(d)
        return save(d, os.path.join(work, "bad_%s.json" % name))

    not_json = os.path.join(work, "bad_text.json")
    with open(not_json, "w") as f:
        f.write('{"format": "cleave-plan",\n "batch": }\n')
    # A key twice: the text of the plan with its batch given again at the end.
    dup_key = os.path.join(work, "bad_dup.json")
    with open(dup_key, "w") as f:
        f.write(json.dumps(base)[:-1] + ', "batch": 64}')
    fifo = os.path.join(work, "plan.fifo")
    if os.path.exists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo)
    cases = [
        ([os.path.join(work, "missing.json")], "missing.json: cannot open: No such file", 1),
        ([not_json], "bad_text.json:2: not JSON", 1),
        ([dup_key], "bad_dup.json:1: not JSON: duplicate object key near '\"batch\"'", 1),
        ([fifo], "plan.fifo: not a regular file (a FIFO)", 1),
        ([mutated("format", lambda d: d.update(format="other"))], "format is 'other', not a cleave plan", 1),
        ([mutated("strategy", lambda d: d.update(strategy="tensor"))],
         "bad_strategy.json: strategy must be single, dp, layer, pipeline or hybrid, got 'tensor'", 1),
        ([mutated("batch", lambda d: d.update(batch="32"))], "bad_batch.json: batch must be an integer", 1),
        ([mutated("nobatch", lambda d: d.pop("batch"))], "bad_nobatch.json: batch is missing", 1),
        ([mutated("ranks", lambda d: d.update(ranks=3))], "replicas 1 x stages 2 is not its ranks, 3", 1),
        ([mutated("sched", lambda d: d.update(schedule="zigzag"))], "schedule must be layer, gpipe or 1f1b", 1),
        ([mutated("micro", lambda d: d.update(microbatches=5))],
         "bad_micro.json: microbatches 5 does not divide the 32 rows of batch", 2),
        ([mutated("node", lambda d: d["stage_table"][1].update(first_node="no_such_node"))],
         "stage_table: the model has no node named 'no_such_node'", 2),
        ([mutated("table", lambda d: d["stage_table"].pop())], "bad_table.json: stage_table must list the 2 stages", 1),
        ([mutated("opt", lambda d: d["optimizer"].update(name="lbfgs"))],
         "optimizer.name must be sgd, momentum, adam or adamw, got 'lbfgs'", 1),
        ([mutated("lr", lambda d: d["optimizer"].update(lr=-1))], "optimizer.lr must be a number >= 0", 1),
        ([mutated("lr_big", lambda d: d["optimizer"].update(lr=1e39))], "optimizer.lr must be a number >= 0", 1),
        ([mutated("beta1", lambda d: d["optimizer"].update(beta1=2))], "optimizer.beta1 must be a number in [0, 1)", 1),
        ([mutated("loss", lambda d: d.update(loss="hinge"))], "loss must be ce, mse or model, got 'hinge'", 1),
        ([mutated("place", lambda d: d.update(placement="by_stage"))], "placement by_stage needs strategy hybrid", 1),
        ([mutated("place2", lambda d: d.update(placement="diagonal"))],
         "placement must be by_replica or by_stage, got 'diagonal'", 1),
        ([base_path(work), "--batch", "64"], "--batch does not go with --plan", 2),
        ([base_path(work), "--strategy", "dp"], "--strategy does not go with --plan", 2),
    ]
    for extra, want, status in cases:
        p = cleave(args, "compile", "--plan", *extra, "-o", os.path.join(work, "never"))
        lines = p.stderr.strip().splitlines()
        rep.check("error (exit %d): %s" % (status, want), p.returncode == status and len(lines) == 1 and
                  want in p.stderr and not os.path.exists(os.path.join(work, "never")),
                  "exit %d: %s" % (p.returncode, p.stderr[-300:]))


def base_path(work):
    return os.path.join(work, "rt_pipeline.json")


def main():
    args, rep = harness.begin(modules=("numpy",), programs=("mpirun",))
    if args is None:
        return rep
    with harness.workdir(args.workdir, "cleave_plan_file_") as work:
        os.environ["CLEAVE_CLUSTER_CACHE"] = os.path.join(work, "no-calibration.json")
        rep.guarded("round trip", lambda: check_round_trip(rep, args, work))
        rep.guarded("edits", lambda: check_edits(rep, args, work))
        rep.guarded("auto plan", lambda: check_auto_plan(rep, args, work))
        rep.guarded("errors", lambda: check_errors(rep, args, work))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
