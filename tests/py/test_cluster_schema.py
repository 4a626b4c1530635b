#!/usr/bin/env python3
"""The sample cluster files, and the clusters cleave writes (the stated
defaults and re-written samples, left by the unit test test_cluster in
$CLEAVE_CLUSTER_DUMP), validate against schemas/cluster.schema.json; the
schema refuses what cleave refuses that a schema can express.

usage: test_cluster_schema.py --cleave BIN --workdir DIR
"""
import argparse
import copy
import glob
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
    with open(os.path.join(ROOT, "schemas", "cluster.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rep = harness.Report()

    def validates(label, doc):
        errors = sorted(validator.iter_errors(doc), key=str)
        return rep.check(label, not errors, "; ".join(e.message for e in errors[:3]))

    samples = sorted(glob.glob(os.path.join(ROOT, "samples", "clusters", "*.json")))
    rep.equal("sample cluster files", sorted(os.path.basename(s) for s in samples),
              ["512x8.json", "64x8.json", "8x8.json", "laptop.json"])
    docs = {}
    for path in samples:
        with open(path) as f:
            doc = json.load(f)
        docs[os.path.basename(path)] = doc
        name = "samples/clusters/" + os.path.basename(path)
        validates("%s validates against schemas/cluster.schema.json" % name, doc)
        rep.check("%s is a user file with a name" % name, doc.get("source") == "user" and bool(doc.get("name")))
        if "rank_speed" in doc:
            rep.equal("%s: rank_speed entries" % name, len(doc["rank_speed"]),
                      doc["nodes"] * doc["ranks_per_node"])

    dumps = os.environ.get("CLEAVE_CLUSTER_DUMP") or os.path.join(os.path.dirname(args.workdir), "cluster_dumps")
    want = ["defaults-1.json", "defaults-4.json", "links.json", "send-cpu.json"] + \
        ["rewritten-" + os.path.basename(s) for s in samples]
    for name in want:
        path = os.path.join(dumps, name)
        if not rep.check("test_cluster wrote %s" % name, os.path.isfile(path),
                         "missing in %s: run test_cluster first (ctest does, as the fixture cluster_dumps)" % dumps):
            continue
        with open(path) as f:
            doc = json.load(f)
        validates("%s written by cleave validates" % name, doc)
        if name.startswith("defaults-"):
            rep.equal("%s: source" % name, doc["source"], "defaults")
            rep.equal("%s: one node" % name, doc["nodes"], 1)
            rep.equal("%s: ranks" % name, doc["ranks_per_node"], int(name[len("defaults-"):-len(".json")]))
        elif name == "links.json":
            rep.equal("%s: the node pairs" % name, [link["nodes"] for link in doc.get("links", [])], [[0, 1], [1, 2]])
        elif name == "send-cpu.json":
            first = doc.get("links", [{}])[0]
            rep.equal("%s: the sender's CPU of the first link" % name,
                      (first.get("send_overhead_s"), first.get("send_gbps")), (2e-5, 0.5))
        else:
            rep.equal("%s: the sample's contents" % name, doc, docs[name[len("rewritten-"):]])

    base = docs["8x8.json"]

    def broken(label, change, ok=False):
        doc = copy.deepcopy(base)
        change(doc)
        rep.check("the schema %s %s" % ("accepts" if ok else "rejects", label), validator.is_valid(doc) == ok)

    broken("an unknown top-level field", lambda d: d.update(nodse=8))
    broken("an unknown field in a link", lambda d: d["intra_node"].update(bandwith_gbps=1))
    broken("an unknown field in compute", lambda d: d["compute"].update(elementwise_gpbs=1))
    broken("a missing inter_node", lambda d: d.pop("inter_node"))
    broken("a missing memory_per_rank_bytes", lambda d: d.pop("memory_per_rank_bytes"))
    broken("a bandwidth of 0", lambda d: d["intra_node"].update(bandwidth_gbps=0))
    broken("a negative latency", lambda d: d["inter_node"].update(latency_s=-1e-6))
    broken("a latency of 0", lambda d: d["inter_node"].update(latency_s=0), ok=True)
    broken("a kernel overhead of 0", lambda d: d["compute"].update(kernel_overhead_s=0), ok=True)
    broken("an empty GEMM curve", lambda d: d["compute"].update(gemm_gflops=[]))
    broken("a GEMM point of three numbers", lambda d: d["compute"]["gemm_gflops"].__setitem__(0, [1e3, 2, 3]))
    broken("a GEMM point of one number", lambda d: d["compute"]["gemm_gflops"].__setitem__(0, [1e3]))
    broken("65 GEMM points", lambda d: d["compute"].update(gemm_gflops=[[i + 1, 1] for i in range(65)]))
    broken("a fractional node count", lambda d: d.update(nodes=2.5))
    broken("a node count written 8.0", lambda d: d.update(nodes=8.0), ok=True)
    broken("version 2", lambda d: d.update(version=2))
    broken("another format", lambda d: d.update(format="cleave-plan"))
    broken("an unknown source", lambda d: d.update(source="measured"))
    broken("a rank speed of 0", lambda d: d["rank_speed"].__setitem__(3, 0))
    broken("no rank_speed", lambda d: d.pop("rank_speed"), ok=True)
    link = {"nodes": [0, 1], "latency_s": 1e-4, "bandwidth_gbps": 0.0125}
    broken("a link between two nodes", lambda d: d.update(links=[link]), ok=True)
    broken("a link of one node", lambda d: d.update(links=[dict(link, nodes=[0])]))
    broken("a link to a negative node", lambda d: d.update(links=[dict(link, nodes=[-1, 0])]))
    broken("a link without a bandwidth", lambda d: d.update(links=[{"nodes": [0, 1], "latency_s": 0}]))
    broken("a link with an unknown field", lambda d: d.update(links=[dict(link, rate=1)]))
    broken("a link with the sender's CPU", lambda d: d.update(links=[dict(link, send_overhead_s=2e-5, send_gbps=0.5)]),
           ok=True)
    broken("a send overhead of 0", lambda d: d["inter_node"].update(send_overhead_s=0), ok=True)
    broken("a negative send overhead", lambda d: d["inter_node"].update(send_overhead_s=-1e-6))
    broken("a send rate of 0", lambda d: d.update(links=[dict(link, send_gbps=0)]))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
