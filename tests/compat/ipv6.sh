#!/usr/bin/env bash
# compat.ipv6: RoCEv2 over UDP/IPv6 between two "hosts" (network namespaces joined by a veth pair),
# with unmodified programs on the devices of the veths' IPv6 addresses (softrdma6_<veth>, GID index 0
# the IPv6 address): ibv_*_pingpong with their data check (-c), and perftest's write/read/send/atomic,
# also through the 4791 holder, and the direct path between two processes of one namespace.
# The veths also carry IPv4 addresses, for the programs' own TCP connection only (ibv_*_pingpong and
# Debian 12's perftest reach their peer over IPv4); the RDMA traffic is the IPv6 devices' (an IPv6
# socket each), and the pingpongs print the peer's IPv6 GID. Needs root and `ip netns`; exits 77
# (skip) without them.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

compat_netns_setup  # sets nsA nsB ipA ipB (IPv4) inA inB (exits 77 where impossible)

ip6A=fd77:5eed::1
ip6B=fd77:5eed::2
ip -n "$nsA" addr add "$ip6A/64" dev "$vethA" nodad
ip -n "$nsB" addr add "$ip6B/64" dev "$vethB" nodad
dev6A=$(compat_device "$ip6A" "${inA[@]}")
dev6B=$(compat_device "$ip6B" "${inB[@]}")
[[ $dev6A == softrdma6_* && $dev6B == softrdma6_* ]] || { echo "FAIL: IPv6 devices $dev6A $dev6B"; exit 1; }

SRV_PREFIX=("${inA[@]}")
CLI_PREFIX=("${inB[@]}")

# The GID a device reports at index 0 (from `softrdma devices -d`).
gid0() { "${@:2}" "$SOFTRDMA" devices -d "$1" | sed -n 's/.*GID\[  0\]:[[:space:]]*\([0-9a-f:.]*\),.*/\1/p'; }
g=$(gid0 "$dev6A" "${inA[@]}")
if [[ $g == "$ip6A" ]]; then compat_result "$dev6A: GID 0 is $ip6A" 1; else compat_result "$dev6A: GID 0 is $ip6A" 0 "got $g"; fi

pingpong() { # TOOL ARGS...
  local tool=$1 port name
  shift
  name="ipv6 $tool${*:+ $*}"
  port=$(compat_free_port)
  SRV=("$tool" -d "$dev6A" -g 0 -p "$port" -c "$@")
  CLI=("$tool" -d "$dev6B" -g 0 -p "$port" -c "$@" "$ipA")
  if compat_pair "$name" "$port" && grep -q "iters in" "$PAIR_CLI_LOG" && grep -q "GID $ip6A" "$PAIR_CLI_LOG"; then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "${PAIR_WHY:-no result, or the peer GID is not $ip6A}"
  fi
}

perftest() { # TOOL ARGS...
  local tool=$1 port name
  shift
  name="ipv6 $tool${*:+ $*}"
  port=$(compat_free_port)
  SRV=("$tool" -d "$dev6A" -x 0 -F -p "$port" "$@")
  CLI=("$tool" -d "$dev6B" -x 0 -F -p "$port" "$@" "$ipA")
  if compat_pair "$name" "$port" && (($(compat_perftest_rows "$PAIR_CLI_LOG") >= 1)); then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "${PAIR_WHY:-no result table}"
  fi
}

pingpong ibv_rc_pingpong -n 2000 -s 4096
pingpong ibv_uc_pingpong -n 500 -s 1024
pingpong ibv_ud_pingpong -n 500 -s 1024
pingpong ibv_srq_pingpong -n 500 -s 1024
perftest ib_write_bw -D 2 -s 65536
perftest ib_read_bw -D 2 -s 65536
perftest ib_send_bw -D 2 -s 65536
perftest ib_atomic_bw -n 2000
perftest ib_send_lat -n 2000
perftest ib_send_lat -c UD -n 1000

# Through the 4791 holder: the first process of A on the device binds UDP 4791 of [fd77:5eed::1],
# so B's first packets for the next one's QPs arrive there and are handed over (with the 16-byte
# original source in the trailer).
squat_port=$(compat_free_port)
"${inA[@]}" timeout -k 5 120 "$SOFTRDMA" run ib_write_bw -d "$dev6A" -x 0 -p "$squat_port" \
  >"$COMPAT_LOG_DIR/squatter.log" 2>&1 &
squatter=$!
compat_wait_listen "$squat_port" "$squatter" "${inA[@]}"
if "${inA[@]}" ss -6 -uln | grep -q "\[$ip6A\]:4791 "; then
  perftest ib_write_bw -n 2000
  perftest ib_send_lat -c UD -n 500
  pingpong ibv_rc_pingpong -n 500 -s 4096
else
  compat_result "a second process in A holds UDP 4791 of $ip6A" 0 "nobody bound [$ip6A]:4791 in namespace A"
fi
kill "$squatter" 2>/dev/null || true
wait "$squatter" 2>/dev/null || true

# One namespace, two processes: the direct path (the default) between contexts of an IPv6 device.
# Its counters are sampled while ib_write_bw runs (softrdma stat reads live contexts only).
CLI_PREFIX=("${inA[@]}")
port=$(compat_free_port)
SRV=(ib_write_bw -d "$dev6A" -x 0 -F -p "$port" -D 4 -s 65536)
CLI=(ib_write_bw -d "$dev6A" -x 0 -F -p "$port" -D 4 -s 65536 127.0.0.1)
(sleep 2.5 && "${inA[@]}" "$SOFTRDMA" stat >"$COMPAT_LOG_DIR/direct.stat.log" 2>&1) &
sampler=$!
ok=0
compat_pair "ipv6 direct path" "$port" && (($(compat_perftest_rows "$PAIR_CLI_LOG") >= 1)) && ok=1
wait "$sampler" || true
direct=$(awk -v d="$dev6A/1:" '$4 == d { for (i = 5; i < NF; i++) if ($i == "direct_ops") n += $(i + 1) } END { print n + 0 }' \
  "$COMPAT_LOG_DIR/direct.stat.log")
if ((ok && direct > 0)); then
  compat_result "ipv6 direct path" 1
else
  compat_result "ipv6 direct path" 0 "${PAIR_WHY:-direct_ops $direct during the run (stat: $COMPAT_LOG_DIR/direct.stat.log)}"
fi

compat_finish
