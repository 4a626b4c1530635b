#!/usr/bin/env bash
# A test cluster on one machine: N hosts as Linux network namespaces, each
# joined by a veth pair to a bridge in a namespace of its own, where mpirun
# runs.  Open MPI's rsh launcher starts the ranks inside the hosts through
# scripts/testcluster-agent, so ranks on different hosts talk TCP over the
# veths, whose bandwidth --rate shapes.  docs/testcluster.md explains the
# settings.
#
#   testcluster.sh up N [--rate RATE] [--slots K]   make N hosts (1..64)
#   testcluster.sh down                             remove everything up made
#   testcluster.sh status                           list the hosts and links
#   testcluster.sh env                              the Open MPI settings, as export lines
#   testcluster.sh exec CMD [ARG...]                run CMD in the bridge namespace with them
#   testcluster.sh mpirun [ARG...]                  exec mpirun --hostfile HOSTFILE ARG...
#
# CLEAVE_TESTCLUSTER_PREFIX (default "cleave") names the namespaces
# (PREFIX-net, PREFIX-h0, PREFIX-h1, ...), so that clusters of different
# prefixes (a user's and the tests') never meet; CLEAVE_TESTCLUSTER_DIR
# (default /tmp/PREFIX-testcluster) holds the hostfile.  Every cluster has
# its own bridge namespace, so their equal addresses never meet either.
#
# Addresses come from 198.18.0.0/15 (RFC 2544's range for network tests):
# the bridge namespace is 198.18.0.1, host i is 198.18.0.(10+i), on one /24
# with no other route, so nothing sent in the cluster can leave it.
set -Eeuo pipefail # -E: up's ERR trap also fires inside the functions it calls

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=${CLEAVE_TESTCLUSTER_PREFIX:-cleave}
state=${CLEAVE_TESTCLUSTER_DIR:-/tmp/$prefix-testcluster}
agent=$here/testcluster-agent
net=$prefix-net
subnet=198.18.0.0/24
bridge_addr=198.18.0.1
max_hosts=64

die() { echo "testcluster: $*" >&2; exit 1; }

host_name() { echo "$prefix-h$1"; }
host_addr() { echo "198.18.0.$((10 + $1))"; }

# The namespaces of this prefix that exist now, hosts in numeric order.
hosts_up() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-h[0-9]+\$" | sort -V || true
}
net_up() { [ -e "/run/netns/$net" ]; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces (run it with sudo)"
    command -v ip >/dev/null || die "the 'ip' command (iproute2) is missing"
}

# "100mbit", "1gbit", "2.5gbit", "500kbit" -> bits per second (tc's units).
rate_bps() {
    local r=$1
    [[ $r =~ ^([0-9]+(\.[0-9]+)?)(kbit|mbit|gbit)$ ]] ||
        die "--rate '$r' is not a rate like 100mbit, 1gbit or 500kbit"
    local mult
    case ${BASH_REMATCH[3]} in
        kbit) mult=1000 ;;
        mbit) mult=1000000 ;;
        gbit) mult=1000000000 ;;
    esac
    local bps
    bps=$(awk -v n="${BASH_REMATCH[1]}" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m }')
    [ "$bps" -ge 8000 ] || die "--rate '$r' is below 8kbit, too slow for a link"
    echo "$bps"
}

# Shapes the egress of one veth end to bps bits per second.  Both ends of a
# host's pair are shaped, so its link is limited both ways, like a host's
# cable to a switch.
#
# The veths hand the qdisc GSO packets of up to 64 KiB, far larger than a
# frame, and a token bucket lets a packet through on less credit than its
# size: with them, htb and tbf were seen to pass mid-size messages at about
# twice the rate.  GSO is cut to about 128 us of the link (16 KiB at
# 1 Gbit/s; the whole 64 KiB from 4 Gbit/s) and off (one segment per
# packet) below 200 Mbit/s, where 128 us is about a frame, so that no packet
# borrows much.  (With the bucket below, this machine held the rate with
# GSO on as well; docs/testcluster.md has the figures.)
shape() {
    local ns=$1 dev=$2 bps=$3
    local gso=$((bps * 16 / 1000000)) # bytes in 128 us
    if [ "$gso" -lt 3000 ]; then
        ip -n "$ns" link set dev "$dev" gso_max_segs 1
        gso=1514
    elif [ "$gso" -lt 65536 ]; then
        ip -n "$ns" link set dev "$dev" gso_max_size "$gso"
    else
        gso=65536
    fi
    # The bucket holds 1 ms of the link and at least two packets; the queue
    # 20 ms and at least three buckets, so that a burst of TCP segments is
    # delayed rather than dropped.
    local burst=$((bps / 8 / 1000))
    [ "$burst" -ge $((2 * gso)) ] || burst=$((2 * gso))
    local limit=$((bps / 8 / 50))
    [ "$limit" -ge $((3 * burst)) ] || limit=$((3 * burst))
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$bps"bit burst "$burst" limit "$limit"
}

# Whether the kernel has netem (delay, loss); asked of the bridge
# namespace's loopback, which nothing uses yet.
netem_note() {
    if tc -n "$net" qdisc add dev lo root netem delay 0ms 2>/dev/null; then
        tc -n "$net" qdisc del dev lo root
        echo "netem is available (delay and loss are not set by this script)"
    else
        echo "netem is not available in this kernel: links are shaped for bandwidth only, with no added delay or loss"
    fi
}

# IPv6 off in a namespace before its links exist, so that they have no
# link-local addresses and send no neighbour discovery: the cluster's only
# addresses are its 198.18.0.x.
no_ipv6() {
    [ -d /proc/sys/net/ipv6 ] || return 0
    ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
}

cmd_up() {
    local n="" rate="" slots=1
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) [ $# -ge 2 ] || die "--rate needs a value (e.g. 100mbit)"; rate=$2; shift 2 ;;
            --rate=*) rate=${1#--rate=}; shift ;;
            --slots) [ $# -ge 2 ] || die "--slots needs a value"; slots=$2; shift 2 ;;
            --slots=*) slots=${1#--slots=}; shift ;;
            -*) die "up: unknown option '$1'" ;;
            *) [ -z "$n" ] || die "up: one host count, got '$n' and '$1'"; n=$1; shift ;;
        esac
    done
    if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt $max_hosts ]; then
        die "up: the host count '${n}' is not a number from 1 to $max_hosts"
    fi
    if ! [[ $slots =~ ^[0-9]+$ ]] || [ "$slots" -lt 1 ]; then
        die "--slots '$slots' is not a positive number"
    fi
    local bps=""
    [ -z "$rate" ] || bps=$(rate_bps "$rate")
    need_root
    if net_up || [ -n "$(hosts_up)" ]; then
        die "a cluster named '$prefix' is already up ($(hosts_up | wc -l) hosts); run '$0 down' first"
    fi
    command -v unshare >/dev/null || die "the 'unshare' command (util-linux) is missing; the agent needs it"

    # Anything that fails from here on takes down what was made.
    trap 'echo "testcluster: up failed at: $BASH_COMMAND; removing what it made" >&2; cmd_down >/dev/null 2>&1 || true' ERR
    local err
    err=$(ip netns add "$net" 2>&1) || { trap - ERR; die "cannot create network namespace $net: ${err:-ip netns add failed}"; }
    no_ipv6 "$net"
    ip -n "$net" link set lo up
    ip -n "$net" link add br0 type bridge
    ip -n "$net" addr add "$bridge_addr/24" dev br0
    ip -n "$net" link set br0 up

    mkdir -p "$state"
    : >"$state/hostfile"
    local i h
    for ((i = 0; i < n; i++)); do
        h=$(host_name "$i")
        ip netns add "$h"
        no_ipv6 "$h"
        ip -n "$h" link set lo up
        # Made directly in the two namespaces: no name is ever taken in the
        # root namespace.  The bridge's port for host i is "hI".
        ip link add eth0 netns "$h" type veth peer name "h$i" netns "$net"
        ip -n "$net" link set "h$i" master br0
        ip -n "$h" addr add "$(host_addr "$i")/24" dev eth0
        if [ -n "$bps" ]; then
            shape "$h" eth0 "$bps"
            shape "$net" "h$i" "$bps"
        fi
        ip -n "$net" link set "h$i" up
        ip -n "$h" link set eth0 up
        echo "$h slots=$slots" >>"$state/hostfile"
    done
    {
        echo "prefix=$prefix"
        echo "hosts=$n"
        echo "slots=$slots"
        echo "rate=${rate:-unshaped}"
    } >"$state/cluster.env"
    trap - ERR

    echo "testcluster: $n hosts up: $(hosts_up | tr '\n' ' ')(198.18.0.10..$((9 + n))), bridge namespace $net ($bridge_addr)"
    if [ -n "$rate" ]; then
        echo "testcluster: each host's link shaped to $rate both ways (tbf)"
    else
        echo "testcluster: links unshaped"
    fi
    echo "testcluster: $(netem_note)"
    echo "testcluster: hostfile $state/hostfile ($slots slots per host); run programs with"
    echo "  $0 mpirun -np $n --map-by node ./model.train --data input=\$PWD/x.npy ..."
    echo "  (or '$0 exec CMD' for any command in the bridge namespace; '$0 down' removes it all)"
}

# Ends the processes left inside a namespace (orteds or ranks of a run that
# was stopped), which would keep it and its links alive after `ip netns del`.
end_processes() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ') || true
    [ -n "${pids// /}" ] || return 0
    echo "testcluster: ending processes left in $ns: $pids"
    # shellcheck disable=SC2086 # one argument per pid
    kill -TERM $pids 2>/dev/null || true
    sleep 1
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ') || true
    # shellcheck disable=SC2086
    [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null || true
}

cmd_down() {
    need_root
    local ns removed=0
    # Deleting a namespace destroys its veth ends, and with them their peers
    # and the bridge.
    for ns in $(hosts_up) $(net_up && echo "$net"); do
        end_processes "$ns"
        ip netns del "$ns"
        removed=$((removed + 1))
    done
    rm -f "$state/hostfile" "$state/cluster.env"
    [ ! -d "$state" ] || rmdir "$state" 2>/dev/null || echo "testcluster: left $state, which holds files of others"
    echo "testcluster: '$prefix' down ($removed namespaces removed)"
}

cmd_status() {
    need_root
    if ! net_up; then
        echo "testcluster: '$prefix' is not up"
        [ -z "$(hosts_up)" ] || echo "testcluster: but host namespaces are left: $(hosts_up | tr '\n' ' ')(run '$0 down')"
        return 0
    fi
    [ ! -f "$state/cluster.env" ] || echo "testcluster: $(tr '\n' ' ' <"$state/cluster.env")"
    echo "bridge namespace $net: $bridge_addr on br0"
    local h dev
    for h in $(hosts_up); do
        dev=h${h##*-h}
        printf '%-14s %-14s tx %s rx %s bytes; %s\n' "$h" \
            "$(ip -n "$h" -4 -o addr show dev eth0 | awk '{print $4}')" \
            "$(ip netns exec "$h" cat /sys/class/net/eth0/statistics/tx_bytes)" \
            "$(ip netns exec "$h" cat /sys/class/net/eth0/statistics/rx_bytes)" \
            "$(tc -n "$net" qdisc show dev "$dev" | awk '/tbf/ {for (i = 1; i < NF; i++) if ($i == "rate") print "shaped to " $(i + 1); f = 1}
                      END {if (!f) print "unshaped"}')"
    done
    echo "hostfile: $state/hostfile"
}

# The environment mpirun needs in the bridge namespace (docs/testcluster.md):
#   the agent that starts each orted inside its host's namespace, all from
#   mpirun (a tree spawn would have orteds call the agent from inside hosts);
#   TCP for the launch and for messages restricted to the cluster's subnet;
#   shared memory within a host, TCP between hosts;
#   no binding: each host's orted would bind its first rank to core 0, and
#   the hosts share this machine's cores;
#   no single-copy mechanism, which containers often forbid;
#   root accepted, since creating the namespaces needed it.
ompi_env() {
    cat <<EOF
OMPI_MCA_plm_rsh_agent=$agent
OMPI_MCA_plm_rsh_no_tree_spawn=1
OMPI_MCA_oob_tcp_if_include=$subnet
OMPI_MCA_btl_tcp_if_include=$subnet
OMPI_MCA_btl=self,vader,tcp
OMPI_MCA_hwloc_base_binding_policy=none
OMPI_MCA_btl_vader_single_copy_mechanism=none
OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
}

cmd_exec() {
    [ $# -ge 1 ] || die "exec needs a command"
    need_root
    net_up || die "the cluster '$prefix' is not up (run '$0 up N')"
    local -a env_args
    mapfile -t env_args < <(ompi_env)
    exec ip netns exec "$net" env "${env_args[@]}" "$@"
}

main() {
    [ $# -ge 1 ] || die "usage: $0 up N [--rate RATE] [--slots K] | down | status | env | exec CMD... | mpirun ARG..."
    local cmd=$1
    shift
    # The prefix goes into namespace names and patterns that find them.
    [[ $prefix =~ ^[a-z][a-z0-9]{0,23}$ ]] ||
        die "CLEAVE_TESTCLUSTER_PREFIX '$prefix' must be a lower-case letter and up to 23 letters or digits"
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        env) ompi_env | sed 's/^/export /' ;;
        exec) cmd_exec "$@" ;;
        mpirun)
            [ -f "$state/hostfile" ] || die "no hostfile at $state/hostfile (run '$0 up N')"
            cmd_exec mpirun --hostfile "$state/hostfile" "$@" ;;
        -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' ;;
        *) die "unknown command '$cmd' (up, down, status, env, exec, mpirun)" ;;
    esac
}

main "$@"
