#!/usr/bin/env python3
"""The plans cleave writes (--emit-plan) validate against
schemas/plan.schema.json, for single-process and data-parallel programs,
and the schema rejects a plan with an unknown step kind.

usage: test_plan_schema.py --cleave BIN --workdir DIR
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    try:
        import jsonschema
    except ImportError:
        return harness.skip("python3-jsonschema not installed")
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(ROOT, "schemas", "plan.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    rep = harness.Report()
    model = os.path.join(ROOT, "samples", "mlp.onnx")
    cases = {"single": [], "dp": ["--ranks", "2", "--strategy", "dp", "--bucket-mb", "0.5"],
             "layer": ["--ranks", "2", "--strategy", "layer"],
             "pipeline": ["--ranks", "2", "--strategy", "pipeline", "--microbatches", "4", "--schedule", "1f1b"],
             "hybrid": ["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "2"],
             # the optimizer's transformer settings, and the groups of each
             # replica's stages that clipping sums its squares over
             "hybrid_clipped": ["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches", "2",
                                "--optimizer", "adamw", "--no-decay", "bias", "--clip-grad-norm", "1",
                                "--lr-schedule", "cosine", "--warmup-steps", "3"]}
    for name, extra in cases.items():
        plan = os.path.join(args.workdir, name + ".json")
        out = os.path.join(args.workdir, name + ".ll")
        p, _ = harness.run([args.cleave, "compile", model, "-o", out, "--emit", "llvm", "--batch", "16",
                            "--emit-plan", plan] + extra)
        if not rep.check("%s: compile with --emit-plan" % name, p.returncode == 0, p.stderr.strip()):
            continue
        with open(plan) as f:
            doc = json.load(f)
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
        rep.check("%s plan validates against schemas/plan.schema.json" % name, not errors,
                  "; ".join(e.message for e in errors[:3]))
        rep.equal("%s plan's strategy" % name, doc["strategy"], name.split("_")[0])
        if name == "hybrid_clipped":
            rep.equal("hybrid_clipped plan's groups (2 stages' replicas, then 2 replicas' stages)",
                      len(doc["groups"]), 4)
        if name == "dp":
            kinds = {s["kind"] for s in doc["rank_plans"][0]["steps"]}
            rep.check("dp plan records buckets and allreduce steps",
                      {"allreduce_start", "allreduce_wait"} <= kinds and bool(doc["rank_plans"][0]["buckets"]),
                      str(kinds))
            broken = json.loads(json.dumps(doc))
            broken["rank_plans"][0]["steps"][0]["kind"] = "teleport"
            rep.check("the schema rejects an unknown step kind",
                      not jsonschema.Draft202012Validator(schema).is_valid(broken))
        if name in ("pipeline", "hybrid"):
            kinds = {s["kind"] for r in doc["rank_plans"] for s in r["steps"]}
            want = {"send", "recv", "accumulate"} | ({"allreduce_start", "allreduce_wait"} if name == "hybrid" else set())
            rep.check("%s plan records its transfers and gradient steps" % name, want <= kinds, str(kinds))
            rep.equal("%s plan's ranks" % name, len(doc["rank_plans"]), doc["ranks"])
            broken = json.loads(json.dumps(doc))
            send = next(s for s in broken["rank_plans"][0]["steps"] if s["kind"] == "send")
            del send["tag"]
            rep.check("the schema rejects a send without its tag",
                      not jsonschema.Draft202012Validator(schema).is_valid(broken))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
