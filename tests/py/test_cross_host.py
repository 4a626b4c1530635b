#!/usr/bin/env python3
"""Programs train the same across hosts, and their messages cross the links.

Brings up a test cluster of network namespaces (scripts/testcluster.sh,
docs/testcluster.md) of 2 hosts and then of 4, and runs on it, through
Open MPI's rsh launcher and the cluster's agent:

- on 2 hosts (2 slots each): dp D=2 and pipeline P=2 with one rank per
  host, and hybrid D=2 x P=2 with two ranks per host (a replica's two
  stages on one host, so the gradient allreduces cross the link);
- on 4 hosts (1 slot each): dp D=4, pipeline P=4 and hybrid D=2 x P=2,
  one rank per host.

The model is the CNN of test_pipeline_equivalence.py with its loss and
optimizer; every run must give the single-process program's per-step
losses (rtol 1e-5) and final weights (rtol 1e-4), as there.  Each rank
records the host it ran on, which must be the one its placement gives.

The hosts' veth byte counters, read before and after each run, must show
at least the bytes the plan (--emit-plan) sends between ranks on different
hosts: every send to a rank elsewhere, and for every allreduce whose group
spans hosts, the reduced bytes out of and into each host taking part (no
algorithm does with less: the sum needs each host's part and every host
needs the sum).  A run over shared memory between hosts would fall short.
Each host namespace must hold only its loopback and its veth, with no
route but the cluster's subnet.

Last, on 2 hosts whose links are shaped to 100 Mbit/s, `cleave calibrate
--quick --hostfile` must finish well within its time limit and write the
link between the two nodes (`links`, and the same as `inter_node`) with a
bandwidth within 20% of the shaping rate and an allreduce rate it measured.

The cluster's namespaces are named cleavetest<pid>-..., never a user's
cluster; they are removed at the end, on failure and on SIGINT/SIGTERM,
and a killed run's are removed by the next one.

usage: test_cross_host.py --cleave BIN --workdir DIR
Ends with "N passed, M failed"; SKIP (exit 77) without root, without
permission to create network namespaces, or without torch or mpirun.
"""
import argparse
import collections
import json
import os
import re
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "testcluster.sh")
PREFIX = "cleavetest%d" % os.getpid()
STALE = re.compile(r"^cleavetest(\d+)-(net|h\d+)$")
CANNOT = re.compile(r"needs root|cannot create network namespace")  # testcluster.sh's refusals

B, N, STEPS = 16, 96, 6            # as test_pipeline_equivalence.py
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-7
W_RTOL, W_ATOL = 1e-4, 1e-6
RUN_TIMEOUT = 180                  # a run takes a few seconds; more means a hang
# calibrate --hostfile on 2 hosts shaped to CAL_RATE (CAL_GBPS in GB/s):
# about 25 s here, of which 10 s time the link; its own limit for the
# hosts' probe is 80 s, and the test wants it well inside that
CAL_RATE, CAL_GBPS = "100mbit", 0.0125
CAL_SECONDS, CAL_TIMEOUT = 75, 300
CAL_CHECKS = 8                     # the checks calibrate_links makes, counted as skipped without shaping
NO_SHAPING = re.compile(r"qdisc|\btc\b")  # testcluster.sh failing at its tc command

# label, compile flags, ranks
PROGRAMS = {
    "dp2": ("dp D=2", ["--strategy", "dp", "--ranks", "2", "--bucket-mb", "0.01"], 2),
    "pp2": ("pipeline P=2 M=4 1f1b", ["--strategy", "pipeline", "--ranks", "2", "--microbatches", "4",
                                      "--schedule", "1f1b"], 2),
    "hybrid": ("hybrid D=2 P=2 M=4 1f1b", ["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--ranks", "4",
                                           "--microbatches", "4", "--schedule", "1f1b"], 4),
    "dp4": ("dp D=4", ["--strategy", "dp", "--ranks", "4", "--bucket-mb", "0.01"], 4),
    "pp4": ("pipeline P=4 M=4 gpipe", ["--strategy", "pipeline", "--ranks", "4", "--microbatches", "4",
                                       "--schedule", "gpipe"], 4),
}

# hosts, slots per host, and the programs run there with mpirun's --map-by:
# `node` deals ranks round robin over the hosts, `slot` fills each host's
# slots before the next, so rank r runs on host r % hosts or r // slots.
CLUSTERS = [
    (2, 2, [("dp2", "node"), ("pp2", "node"), ("hybrid", "slot")]),
    (4, 1, [("dp4", "node"), ("pp4", "node"), ("hybrid", "node")]),
]

# Records the host each rank runs on, then becomes the program.
WHERE_SH = """#!/bin/sh
dir=$1
shift
hostname >"$dir/rank$OMPI_COMM_WORLD_RANK"
exec "$@"
"""


class Stop(BaseException):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so the cluster comes down
    (a BaseException, as KeyboardInterrupt, so that no check's guard takes
    it for a failed check)."""


def on_signal(signum, _frame):
    raise Stop("signal %d" % signum)


def run(cmd, env=None, timeout=120):
    """harness.run_group: mpirun and what it started end with the test."""
    return harness.run_group(cmd, env=env, timeout=timeout)


def tail(text, n=400):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return " | ".join(lines[-3:])[-n:]


class Cluster:
    """A test cluster of `hosts` namespaces, up for the `with` block."""

    def __init__(self, work, hosts, slots, rate=None):
        self.hosts, self.slots, self.rate = hosts, slots, rate
        self.env = dict(os.environ, CLEAVE_TESTCLUSTER_PREFIX=PREFIX,
                        CLEAVE_TESTCLUSTER_DIR=os.path.join(work, "cluster%d" % hosts))
        self.names = ["%s-h%d" % (PREFIX, i) for i in range(hosts)]
        self.up_error = None

    def script(self, *args, timeout=120):
        return run([SCRIPT] + list(args), env=self.env, timeout=timeout)

    def __enter__(self):
        rc, out, err = self.script("up", str(self.hosts), "--slots", str(self.slots),
                                   *(["--rate", self.rate] if self.rate else []))
        if rc != 0:
            self.up_error = (err.strip() or out.strip() or "exit %s" % rc)
        return self

    def __exit__(self, *exc):
        # A second Ctrl-C or SIGTERM waits until the cluster is down.
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            rc, _, err = self.script("down")
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        if rc != 0:
            print("FAIL cluster %s down: %s" % (PREFIX, tail(err)))
        return False

    def counters(self):
        """host -> (tx bytes, rx bytes) of its veth."""
        out = {}
        for h in self.names:
            rc, text, err = run(["ip", "-n", h, "-j", "-s", "link", "show", "dev", "eth0"])
            if rc != 0:
                raise RuntimeError("ip -n %s link: %s" % (h, tail(err)))
            s = json.loads(text)[0]["stats64"]
            out[h] = (s["tx"]["bytes"], s["rx"]["bytes"])
        return out

    def mpirun(self, ranks, map_by, argv):
        """mpirun in the bridge namespace.  Open MPI's launcher sometimes
        fails to make its session folder when other mpirun jobs come and go
        at the same moment ("orte_session_dir failed", before any rank
        starts): such a launch is tried again, twice at most."""
        for _ in range(3):
            rc, out, err = self.script("mpirun", "-np", str(ranks), "--map-by", map_by, *argv, timeout=RUN_TIMEOUT)
            if rc == 0 or "orte_session_dir failed" not in err:
                break
            time.sleep(1)
        return rc, out, err


def remove_stale():
    """Removes the clusters of earlier runs of this test that were killed
    before they could (their process is gone)."""
    rc, out, _ = run(["ip", "netns", "list"])
    prefixes = set()
    for line in (out if rc == 0 else "").splitlines():
        m = STALE.match(line.split(" ")[0])
        if m and not os.path.exists("/proc/%s" % m.group(1)):
            prefixes.add("cleavetest" + m.group(1))
    for p in sorted(prefixes):
        print("removing a stale test cluster %s" % p)
        run([SCRIPT, "down"], env=dict(os.environ, CLEAVE_TESTCLUSTER_PREFIX=p,
                                         CLEAVE_TESTCLUSTER_DIR="/tmp/%s-testcluster" % p))


# ------------------------------------------------------------ the plan's bytes


def cross_host_bytes(plan, host_of):
    """host -> [bytes out, bytes in] that one training step must move
    across that host's link, by the plan: sends between ranks on different
    hosts, and each allreduce over a group spanning hosts (its bytes out of
    and into every host of the group)."""
    need = collections.defaultdict(lambda: [0, 0])
    groups = plan.get("groups") or []
    spans = {}  # one collective instance -> (hosts taking part, bytes)
    for rp in plan["rank_plans"]:
        r = rp["rank"]
        sizes = {}
        for b in rp.get("buffers", []):
            sizes.setdefault(b["name"], b["bytes"])
        seen = collections.Counter()
        for s in rp["steps"]:
            kind = s["kind"]
            if kind == "send" and host_of[s["peer"]] != host_of[r]:
                need[host_of[r]][0] += s["bytes"]
                need[host_of[s["peer"]]][1] += s["bytes"]
            elif kind in ("allreduce_start", "allreduce"):
                what = s["bucket"] if kind == "allreduce_start" else s["value"]
                nbytes = rp["buckets"][what]["bytes"] if kind == "allreduce_start" else sizes[what]
                key = (s["group"], kind, what, s.get("micro", -1))
                seen[key] += 1
                spans[key + (seen[key],)] = ({host_of[m] for m in groups[s["group"]]}, nbytes)
    for hosts, nbytes in spans.values():
        if len(hosts) > 1:
            for h in hosts:
                need[h][0] += nbytes
                need[h][1] += nbytes
    return need


# ------------------------------------------------------------------ the runs


def compile_programs(rep, work, cleave, model, opt_flags, files):
    """The single-process reference and the parallel programs; returns
    (reference losses, reference weights, {key: program}) or None."""
    base = [cleave, "compile", model, "--batch", str(B), "--loss", "ce"] + opt_flags
    single = os.path.join(work, "single")
    rc, _, err = run(base + ["-o", single], timeout=300)
    if not rep.check("compile single", rc == 0, tail(err)):
        return None
    rc, _, err = run([single] + files + ["--steps", str(STEPS), "--metrics", single + ".jsonl",
                                         "--save", single + ".onnx"], timeout=RUN_TIMEOUT)
    if not rep.check("run single", rc == 0, tail(err)):
        return None
    ref_losses = harness.read_losses(single + ".jsonl")
    ref_w = harness.read_weights(single + ".onnx")
    progs = {}
    for key, (label, flags, _) in PROGRAMS.items():
        prog = os.path.join(work, key)
        rc, _, err = run(base + flags + ["-o", prog, "--emit-plan", prog + ".plan.json"], timeout=300)
        if rep.check("compile %s" % label, rc == 0, tail(err)):
            progs[key] = prog
    return ref_losses, ref_w, progs


def check_isolation(rep, cl):
    """Each host holds only lo and eth0, with 127.0.0.1 and its one address
    in the subnet (no IPv6, not even link-local), and routes only to the
    subnet."""
    for i, h in enumerate(cl.names):
        rc, out, err = run(["ip", "-n", h, "-j", "addr", "show"])
        got = sorted((l["ifname"], a["family"], "%s/%d" % (a["local"], a["prefixlen"]))
                     for l in json.loads(out) for a in l.get("addr_info", [])) if rc == 0 else err
        want = [("eth0", "inet", "198.18.0.%d/24" % (10 + i)), ("lo", "inet", "127.0.0.1/8")]
        rep.check("%s has only lo and eth0, addressed %s" % (h, [w[2] for w in want]), got == want, got)
        rc, out, err = run(["ip", "-n", h, "-j", "-4", "route", "show", "table", "all"])
        dests = sorted({r["dst"] for r in json.loads(out) if r.get("type", "unicast") == "unicast"}
                       ) if rc == 0 else err
        rep.check("%s routes only to 198.18.0.0/24" % h, dests == ["198.18.0.0/24"], dests)
    # and the bridge's namespace has no link out either: its loopback, the
    # bridge and one port per host
    net = PREFIX + "-net"
    rc, out, err = run(["ip", "-n", net, "-j", "link", "show"])
    got = sorted(l["ifname"] for l in json.loads(out)) if rc == 0 else err
    want = sorted(["lo", "br0"] + ["h%d" % i for i in range(cl.hosts)])
    rep.check("%s holds only %s" % (net, want), got == want, got)


def run_case(rep, cl, work, key, map_by, files, ref_losses, ref_w):
    label, _, ranks = PROGRAMS[key]
    tag = "%d hosts: %s" % (cl.hosts, label)
    prog = os.path.join(work, key)
    out_dir = os.path.join(work, "h%d_%s" % (cl.hosts, key))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    where = os.path.join(work, "where.sh")
    argv = [where, out_dir, prog] + files + ["--steps", str(STEPS), "--metrics", os.path.join(out_dir, "m.jsonl"),
                                            "--save", os.path.join(out_dir, "w.onnx")]
    replicated = key != "pp2" and key != "pp4"
    if replicated:
        argv.append("--check-replicas")
    before = cl.counters()
    t0 = time.time()
    rc, out, err = cl.mpirun(ranks, map_by, argv)
    secs = time.time() - t0
    after = cl.counters()
    if not rep.check("%s: runs across the hosts, --map-by %s (%.1f s)" % (tag, map_by, secs), rc == 0,
                     tail(err + out)):
        return
    # where each rank ran
    host_of = [cl.names[r % cl.hosts] if map_by == "node" else cl.names[r // cl.slots] for r in range(ranks)]

    def ran_on():
        got = []
        for r in range(ranks):
            with open(os.path.join(out_dir, "rank%d" % r)) as f:
                got.append(f.read().strip())
        return got
    got = rep.guarded("%s: ranks' hosts recorded" % tag, ran_on)
    if got is not None:
        rep.check("%s: rank r ran on %s" % (tag, host_of), got == host_of, got)
    if replicated:
        rep.check("%s: --check-replicas found the replicas identical" % tag, "replicas identical" in out + err,
                  tail(out + err))
    losses = rep.guarded("%s: metrics readable" % tag, lambda: harness.read_losses(os.path.join(out_dir, "m.jsonl")))
    if losses is not None:
        ok, detail = harness.compare(losses, ref_losses, LOSS_RTOL, LOSS_ATOL)
        rep.check("%s: %d per-step losses equal single-process (rtol %g)" % (tag, STEPS, LOSS_RTOL),
                  ok and len(losses) == STEPS, detail or "%d losses" % len(losses))
    w = rep.guarded("%s: saved model readable" % tag, lambda: harness.read_weights(os.path.join(out_dir, "w.onnx")))
    if w is not None:
        bad = sorted(set(ref_w) ^ set(w))
        detail = "names differ: %s" % bad if bad else ""
        for k in sorted(ref_w) if not bad else ():
            ok, d = harness.compare(w[k], ref_w[k], W_RTOL, W_ATOL)
            if not ok:
                detail = "%s: %s" % (k, d)
                break
        rep.check("%s: final weights equal single-process (rtol %g)" % (tag, W_RTOL), not detail, detail)

    def crossed():
        with open(prog + ".plan.json") as f:
            need = cross_host_bytes(json.load(f), host_of)
        short = []
        for h in cl.names:
            want_tx, want_rx = need[h][0] * STEPS, need[h][1] * STEPS
            tx, rx = after[h][0] - before[h][0], after[h][1] - before[h][1]
            print("  %s %s: sent %d bytes (plan %d), received %d (plan %d)" % (tag, h, tx, want_tx, rx, want_rx))
            if tx < want_tx or rx < want_rx:
                short.append("%s sent %d of %d, received %d of %d" % (h, tx, want_tx, rx, want_rx))
        total = sum(v[0] for v in need.values()) * STEPS
        rep.check("%s: each host's link carried at least the plan's %d cross-host bytes" % (tag, total),
                  total > 0 and not short, "; ".join(short) or "the plan sends nothing across hosts")
    rep.guarded("%s: link bytes" % tag, crossed)


def calibrate_links(rep, cl, work, cleave):
    """cleave calibrate --hostfile on shaped hosts: it finishes well within
    its time limit and writes the link it measured, within 20% of the
    shaping rate, with the allreduce rate and the sender's CPU it measured
    on it."""
    out = os.path.join(work, "calibrated.json")
    hostfile = os.path.join(cl.env["CLEAVE_TESTCLUSTER_DIR"], "hostfile")
    t0 = time.time()
    rc, _, err = cl.script("exec", cleave, "calibrate", "--quick", "-o", out, "--hostfile", hostfile,
                           "--ranks-per-node", "1", timeout=CAL_TIMEOUT)
    secs = time.time() - t0
    if not rep.check("calibrate --hostfile at %s finishes (%.0f s)" % (CAL_RATE, secs), rc == 0, tail(err)):
        return
    print("  " + "\n  ".join(l for l in err.splitlines() if "node" in l or "link" in l))
    rep.check("calibrate --hostfile at %s takes under %d s" % (CAL_RATE, CAL_SECONDS), secs < CAL_SECONDS,
              "%.0f s" % secs)
    with open(out) as f:
        c = json.load(f)
    rep.check("the file says nothing was left unmeasured", "not measured" not in c.get("name", ""), c.get("name"))
    rep.check("the file has 2 nodes of 1 rank", (c["nodes"], c["ranks_per_node"]) == (2, 1),
              (c["nodes"], c["ranks_per_node"]))
    links = c.get("links") or []
    if not rep.check("the file has one link, between nodes 0 and 1",
                     len(links) == 1 and sorted(links[0]["nodes"]) == [0, 1], links):
        return
    link, want = links[0], CAL_GBPS
    rep.check("the link's bandwidth %.4g GB/s is within 20%% of %s (%.4g GB/s)" % (link["bandwidth_gbps"], CAL_RATE,
                                                                                  want),
              abs(link["bandwidth_gbps"] / want - 1) <= 0.20, link)
    ar = link.get("allreduce_gbps")
    # a sum of two ranks moves no faster than the link, and over TCP was
    # seen at 0.6 to 1.0 of it
    rep.check("the link's allreduce rate %s GB/s is measured, at most 1.2 x the link" % ar,
              isinstance(ar, (int, float)) and 0 < ar <= 1.2 * want, link)
    # the sender's time in the send call: measured, and short of the
    # message's time on the shaped link (the call writes into the socket,
    # it does not wait for the link)
    so, sg = link.get("send_overhead_s"), link.get("send_gbps", 0)
    big = 60 << 10
    sender = (so or 0) + (big / (sg * 1e9) if sg else 0)
    rep.check("the link's sender's CPU is measured (send_overhead_s %s s, send_gbps %s)" % (so, sg),
              isinstance(so, (int, float)) and so >= 0, link)
    rep.check("a 60 KiB send takes the sender %.3g s, less than the message takes on the link (%.3g s)"
              % (sender, link["latency_s"] + big / (link["bandwidth_gbps"] * 1e9)),
              sender < link["latency_s"] + big / (link["bandwidth_gbps"] * 1e9), link)
    rep.check("inter_node is the one link's", c["inter_node"] == {k: link[k] for k in link if k != "nodes"},
              c["inter_node"])


def checks(cleave, workdir):
    """Everything after the skips; the clusters it brings up are down when
    it returns or raises."""
    import numpy as np
    import pipeline_models as pm
    import train_models as tm

    rep = harness.Report()
    if not rep.executable(cleave):
        return rep.summary()
    work = os.path.abspath(workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    remove_stale()
    # Whether namespaces can be made here at all (a container may forbid
    # them even to root), before anything is compiled.
    with Cluster(work, 1, 1) as probe:
        if probe.up_error and CANNOT.search(probe.up_error):
            return harness.skip(probe.up_error)

    spec = pm.MODELS["cnn"]
    model = tm.export_onnx(spec, spec.build(), os.path.join(work, "cnn.onnx"), B)
    files = []
    for k, v in tm.make_data(spec, "ce", N).items():
        path = os.path.join(work, k + ".npy")  # the hosts share this file system: one path serves them all
        np.save(path, v)
        files += ["--data", "%s=%s" % (k, path)]
    opt = tm.OptimConfig("momentum", 0.02, momentum=0.9, nesterov=True)
    built = compile_programs(rep, work, cleave, model, opt.cleave_flags(), files)
    if built is None:
        return rep.summary()
    ref_losses, ref_w, progs = built
    with open(os.path.join(work, "where.sh"), "w") as f:
        f.write(WHERE_SH)
    os.chmod(os.path.join(work, "where.sh"), 0o755)

    t_start = time.time()
    for hosts, slots, cases in CLUSTERS:
        with Cluster(work, hosts, slots) as cl:
            if not rep.check("%d hosts up" % hosts, not cl.up_error, cl.up_error):
                continue
            check_isolation(rep, cl)
            for key, map_by in cases:
                if key in progs:
                    rep.guarded("%d hosts: %s" % (hosts, key),
                                lambda: run_case(rep, cl, work, key, map_by, files, ref_losses, ref_w))
    with Cluster(work, 2, 1, CAL_RATE) as cl:
        if cl.up_error and NO_SHAPING.search(cl.up_error):  # a kernel without tbf: nothing to calibrate against
            rep.skip("calibrate --hostfile at %s" % CAL_RATE, "links cannot be shaped here: %s" % cl.up_error.strip(),
                     CAL_CHECKS)
        elif rep.check("2 hosts up at %s" % CAL_RATE, not cl.up_error, cl.up_error):
            rep.guarded("calibrate --hostfile", lambda: calibrate_links(rep, cl, work, cleave))
    rc, out, _ = run(["ip", "netns", "list"])
    left = [l for l in out.splitlines() if l.startswith(PREFIX + "-")]
    rep.check("no namespace of this test left", rc == 0 and not left, left)
    print("(%.0f s)" % (time.time() - t_start))
    return rep.summary()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--workdir", default="/tmp/cleave_cross_host")
    args = ap.parse_args()
    cleave = os.path.abspath(args.cleave)
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
        import torch  # noqa: F401
        import pipeline_models  # noqa: F401
        import train_models  # noqa: F401
    except Exception as e:  # pragma: no cover
        return harness.skip("torch not available (%s)" % e)
    why = harness.missing(programs=("mpirun", "ip", "tc", "unshare"))
    if why:
        return harness.skip(why)
    if os.geteuid() != 0:
        return harness.skip("needs root to create network namespaces")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        return checks(cleave, args.workdir)
    except (KeyboardInterrupt, Stop) as e:
        print("stopped (%s); every cluster of this test is down" % (str(e) or "Ctrl-C"))
        return 1


if __name__ == "__main__":
    sys.exit(main())
