#!/usr/bin/env bash
# compat.ipv6: RoCEv2 over UDP/IPv6 between two "hosts" (network namespaces joined by a veth pair),
# with unmodified programs on the devices of the veths' IPv6 addresses (softrdma6_<veth>, GID index 0
# the IPv6 address): ibv_*_pingpong with their data check (-c), and perftest's write/read/send/atomic,
# also through the 4791 holder, and the direct path between two processes of one namespace; rdma_cm
# over IPv6 (rping -v, also from "::", ucmatose, udaddy), UD multicast (mckey), iWARP over TCP/IPv6
# (rping -v, ucmatose),
# UCX and libfabric.
# The veths also carry IPv4 addresses, for the programs' own TCP connection only (ibv_*_pingpong and
# Debian 12's perftest reach their peer over IPv4); the RDMA traffic is the IPv6 devices' (an IPv6
# socket each), and the pingpongs print the peer's IPv6 GID. Needs root and `ip netns`; exits 77
# (skip) without them.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

compat_netns_setup  # sets nsA nsB ipA ipB (IPv4) inA inB (exits 77 where impossible)

# Short names: UCX keeps 15 characters of a device name (softrdma6_<interface>).
compat_short_names "$nsA" "$vethA" v6a "$nsB" "$vethB" v6b
vethA=v6a
vethB=v6b
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

# rdma_cm over IPv6 between the namespaces: the CM's MADs go over UDP/IPv6 (to the 4791 holder of
# the server's address, then to its rdma_cm port), the QPs over the IPv6 devices.
export SOFTRDMA_CM_TIMEOUT_MS=${SOFTRDMA_CM_TIMEOUT_MS:-200}
CLI_PREFIX=("${inB[@]}")
rping_pair "ipv6 rping -v" "$ip6A" "$ip6A" 500
rping_pair "ipv6 rping -v, server on ::" :: "$ip6A" 100

port=$(cm_free_port)
SRV=(ucmatose -b "$ip6A" -p "$port" -c 4)
CLI=(ucmatose -s "$ip6A" -p "$port" -c 4)
if cm_pair "ipv6 ucmatose" "$port" && grep -q 'return status 0' "$PAIR_CLI_LOG"; then
  compat_result "ipv6 ucmatose" 1
else
  compat_result "ipv6 ucmatose" 0 "${PAIR_WHY:-no 'return status 0'}"
fi
if udp_bound 7174 "${inA[@]}"; then
  compat_result "ipv6 udaddy" 0 "UDP port 7174 (udaddy's) is taken in namespace A"
else
  SRV=(udaddy -b "$ip6A" -c 2 -C 10)
  CLI=(udaddy -s "$ip6A" -c 2 -C 10)
  if cm_pair "ipv6 udaddy" 7174 && grep -q 'return status 0' "$PAIR_CLI_LOG"; then
    compat_result "ipv6 udaddy" 1
  else
    compat_result "ipv6 udaddy" 0 "${PAIR_WHY:-no 'return status 0'}"
  fi
fi
# UD multicast over IPv6: mckey's receiver in A joins ff0e::1:<n> (its context's socket joins the
# group on the veth), then a sender in B joins and sends 10 datagrams; all 10 must arrive.
mckey_pair ipv6 "$ip6A" "$ip6B"

# iWARP over TCP/IPv6 (SOFTRDMA_TRANSPORT=iwarp: the softrdma_iw6_* devices): rping -v between the
# namespaces (FPDUs on the TCP connection), from "::" too, and ucmatose; then rping -v between two
# processes of one namespace (the QPs find each other in the host's tuple table, keyed by the IPv6
# addresses, and take the direct path).
iw_dev=$("${inA[@]}" "$SOFTRDMA" devices --iwarp --ip "$ip6A" 2>/dev/null || true)
if [[ $iw_dev == softrdma_iw6_* ]]; then compat_result "iWARP device of $ip6A is $iw_dev" 1
else compat_result "iWARP device of $ip6A" 0 "got '$iw_dev'"; fi
iw_rping() { # NAME SERVER_ADDR CLIENT_ADDR COUNT
  local port n
  port=$(cm_free_port)
  SRV=(env SOFTRDMA_TRANSPORT=iwarp rping -s -a "$2" -p "$port" -v -C "$4")
  CLI=(env SOFTRDMA_TRANSPORT=iwarp rping -c -a "$3" -p "$port" -v -C "$4")
  if compat_pair "$1" "$port"; then
    n=$(grep -o 'rdma-ping-[0-9]*: ' "$PAIR_CLI_LOG" | sort -u | wc -l)
    if ((n == $4)); then compat_result "$1" 1; else compat_result "$1" 0 "client verified $n of $4 pings"; fi
  else
    compat_result "$1" 0
  fi
}
iw_rping "ipv6 iwarp rping -v" "$ip6A" "$ip6A" 300
iw_rping "ipv6 iwarp rping -v, server on ::" :: "$ip6A" 100
port=$(cm_free_port)
SRV=(env SOFTRDMA_TRANSPORT=iwarp ucmatose -b "$ip6A" -p "$port" -c 4)
CLI=(env SOFTRDMA_TRANSPORT=iwarp ucmatose -s "$ip6A" -p "$port" -c 4)
if compat_pair "ipv6 iwarp ucmatose" "$port" && grep -q 'return status 0' "$PAIR_CLI_LOG"; then
  compat_result "ipv6 iwarp ucmatose" 1
else
  compat_result "ipv6 iwarp ucmatose" 0 "${PAIR_WHY:-no 'return status 0'}"
fi
CLI_PREFIX=("${inA[@]}")
iw_rping "ipv6 iwarp rping -v, one namespace" "$ip6A" "$ip6A" 300
CLI_PREFIX=("${inB[@]}")

# rsockets over IPv6: rstream's data check (-T v), and its default series.
for opts in "-T v -S 65536 -C 200" ""; do
  port=$(compat_free_port)
  # shellcheck disable=SC2206
  SRV=(rstream -b "$ip6A" -p "$port" $opts)
  # shellcheck disable=SC2206
  CLI=(rstream -s "$ip6A" -p "$port" $opts)
  if cm_pair "ipv6 rstream${opts:+ $opts}" "$port" && grep -qE '^(1m_(bw|lat)|custom) ' "$PAIR_CLI_LOG"; then
    compat_result "ipv6 rstream${opts:+ $opts}" 1
  else
    compat_result "ipv6 rstream${opts:+ $opts}" 0 "${PAIR_WHY:-no result row}"
  fi
done

# UCX (rc_verbs, wired up over ud_verbs) on the IPv6 devices; ucx_perftest's own connection is IPv4.
for t in tag_lat ucp_put_bw; do
  port=$(compat_free_port)
  SRV=(env UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES="$dev6A:1" ucx_perftest -p "$port")
  CLI=(env UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES="$dev6B:1" ucx_perftest -p "$port" -t "$t" -n 2000 "$ipA")
  if compat_pair "ipv6 ucx_perftest -t $t" "$port" && grep -q '^Final:' "$PAIR_CLI_LOG"; then
    compat_result "ipv6 ucx_perftest -t $t" 1
  else
    compat_result "ipv6 ucx_perftest -t $t" 0 "${PAIR_WHY:-no Final: line}"
  fi
done

# libfabric's verbs provider: MSG endpoints (rdma_cm over IPv6) and RDM over them (ofi_rxm), data
# checked (-c); fi_pingpong -6 takes the IPv6 address for its own connection too.
for pe in "verbs msg" "verbs;ofi_rxm rdm"; do
  read -r prov ep <<<"$pe"
  port=$(compat_free_port)
  SRV=(fi_pingpong -6 -p "$prov" -e "$ep" -I 500 -c -B "$port")
  CLI=(fi_pingpong -6 -p "$prov" -e "$ep" -I 500 -c -P "$port" "$ip6A")
  rows=0
  compat_pair "ipv6 fi_pingpong -p $prov -e $ep" "$port" &&
    rows=$(awk '$1 ~ /^[0-9]+[kmg]?$/ && $3 ~ /^=[0-9]+$/ && ("=" $2) == $3 { n++ } END { print n+0 }' "$PAIR_CLI_LOG")
  if ((rows >= 3)); then
    compat_result "ipv6 fi_pingpong -p $prov -e $ep" 1
  else
    compat_result "ipv6 fi_pingpong -p $prov -e $ep" 0 "${PAIR_WHY:-$rows complete result rows}"
  fi
done

# perftest -R is not run: Debian 12's perftest resolves its peer's name in AF_INET only
# ("Address family for hostname not supported" for an IPv6 address, with or without --ipv6).

compat_finish
