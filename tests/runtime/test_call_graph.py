"""The runtime's files call each other without a cycle (runtime/README.md,
"Communication"): reads which object of libcleave_rt.a defines and which
uses each symbol (nm), draws the file graph and looks for a cycle.  Also
checks that the utilities (rt_util.c) call no file of the communication
module, and that the module's face (rt_comm.c) is called by none of its
other files.

usage: test_call_graph.py NM libcleave_rt.a
"""

import collections
import re
import subprocess
import sys

MODULE = {"rt_comm.c", "rt_group.c", "rt_collective.c", "rt_p2p.c", "rt_agree.c"}


def file_graph(nm, lib):
    """{file: set of files it calls} from `nm -A lib`."""
    out = subprocess.run([nm, "-A", lib], stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    defined, used = {}, collections.defaultdict(set)
    # "LIB:OBJ.o: U sym" or "LIB:OBJ.o:0000000000000040 T sym"
    line_re = re.compile(r"^.*:([^:/]+?)(?:\.c)?\.o:\s*[0-9a-fA-F]*\s+(\w)\s+(\S+)$")
    for line in out.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        name, kind, sym = m.group(1) + ".c", m.group(2), m.group(3)
        if kind == "U":
            used[name].add(sym)
        elif kind in "TDBRCV":
            defined[sym] = name
    graph = {f: set() for f in set(used) | set(defined.values())}
    for f, syms in used.items():
        graph[f] |= {defined[s] for s in syms if s in defined and defined[s] != f}
    return graph


def find_cycle(graph):
    """One cycle as a list of files, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if not state.get(m):
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if not state.get(n):
            found = visit(n)
            if found:
                return found
    return None


def main():
    nm, lib = sys.argv[1], sys.argv[2]
    graph = file_graph(nm, lib)
    failed = 0

    def check(label, ok, detail=""):
        nonlocal failed
        print("PASS %s" % label if ok else "FAIL %s: %s" % (label, detail))
        failed += not ok

    check("the library's files are found", {"rt_main.c", "rt_util.c"} <= set(graph) and MODULE <= set(graph),
          sorted(graph))
    cycle = find_cycle(graph)
    check("no cycle between runtime files", cycle is None, " -> ".join(cycle or []))
    util_calls = graph.get("rt_util.c", set()) & MODULE
    check("rt_util.c calls no file of the communication module", not util_calls, sorted(util_calls))
    callers = sorted(f for f in MODULE - {"rt_comm.c"} if "rt_comm.c" in graph.get(f, set()))
    check("no file of the module calls rt_comm.c", not callers, callers)
    for f in sorted(graph):
        print("  %s -> %s" % (f, " ".join(sorted(graph[f])) or "-"))
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
