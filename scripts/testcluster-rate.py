#!/usr/bin/env python3
"""TCP rates between two test hosts of scripts/testcluster.sh.

Runs a receiver inside one host's namespace and a sender inside another's,
and prints the sender's figures: the sustained rate of one stream, and the
rate of single messages of a few sizes, each sent whole and acknowledged
before the next (so a message's time includes its round trip, as a rendezvous
MPI message of that size does).

    scripts/testcluster-rate.py [--from cleave-h0] [--to cleave-h1] [--seconds 3] [--idle MS]

--idle rests the link MS milliseconds before each single message, as a
training step's computation does between its messages; a rested token
bucket lets a message smaller than the bucket through faster than the rate.

Needs root and a cluster that is up.  Only the hosts' addresses are used.
"""
import argparse
import os
import socket
import struct
import subprocess
import sys
import time

PORT = 5201
SIZES = (64 << 10, 256 << 10, 1 << 20, 16 << 20)
CHUNK = 1 << 20


def recv_exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        got = conn.recv(min(CHUNK, n - len(buf)))
        if not got:
            raise ConnectionError("peer closed after %d of %d bytes" % (len(buf), n))
        buf += got
    return bytes(buf)


def serve(addr):
    """Each request is an 8-byte length L followed by L bytes (L = 0 ends);
    answered with one byte once all have arrived."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, PORT))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    sink = bytearray(CHUNK)
    while True:
        (n,) = struct.unpack("!Q", recv_exact(conn, 8))
        if n == 0:
            break
        left = n
        while left:
            got = conn.recv_into(sink, min(CHUNK, left))
            if not got:
                raise ConnectionError("peer closed mid-message")
            left -= got
        conn.sendall(b"k")
    conn.close()


def one_message(conn, payload):
    t0 = time.perf_counter()
    conn.sendall(struct.pack("!Q", len(payload)))
    conn.sendall(payload)
    recv_exact(conn, 1)
    return time.perf_counter() - t0


def send(addr, seconds, idle):
    conn = socket.create_connection((addr, PORT), timeout=60)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    block = os.urandom(16 << 20)
    one_message(conn, block[:1 << 20])  # opens the congestion window
    sent, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        one_message(conn, block)
        sent += len(block)
    secs = time.perf_counter() - t0
    print("stream: %d MB in %.2f s = %.0f Mbit/s" % (sent / 1e6, secs, sent * 8 / secs / 1e6))
    for size in SIZES:
        reps = max(3, min(50, (32 << 20) // size))
        times = []
        for _ in range(reps):
            time.sleep(idle)
            times.append(one_message(conn, block[:size]))
        times.sort()
        med = times[len(times) // 2]
        print("message %8d B: median %.3f ms over %d = %.0f Mbit/s" % (size, med * 1e3, reps, size * 8 / med / 1e6))
    conn.sendall(struct.pack("!Q", 0))
    conn.close()


def host_addr(ns):
    out = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout.split()
    return out[3].split("/")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", default="cleave-h0")
    ap.add_argument("--to", dest="dst", default="cleave-h1")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--idle", type=float, default=0.0, help="milliseconds the link rests before each message")
    ap.add_argument("--role", choices=("serve", "send"), help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "serve":
        return serve(a.addr)
    if a.role == "send":
        return send(a.addr, a.seconds, a.idle / 1e3)
    for ns in (a.src, a.dst):
        if not os.path.exists("/run/netns/" + ns):
            sys.exit("testcluster-rate: no test host %s (scripts/testcluster.sh status)" % ns)
    addr = host_addr(a.dst)
    me = os.path.abspath(__file__)
    srv = subprocess.Popen(["ip", "netns", "exec", a.dst, sys.executable, me, "--role", "serve", "--addr", addr],
                           stdout=subprocess.PIPE, universal_newlines=True)
    try:
        if srv.stdout.readline().strip() != "ready":
            sys.exit("testcluster-rate: the receiver in %s did not start" % a.dst)
        print("%s -> %s (%s)" % (a.src, a.dst, addr))
        subprocess.run(["ip", "netns", "exec", a.src, sys.executable, me, "--role", "send", "--addr", addr,
                        "--seconds", str(a.seconds), "--idle", str(a.idle)], check=True)
    finally:
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


if __name__ == "__main__":
    sys.exit(main())
