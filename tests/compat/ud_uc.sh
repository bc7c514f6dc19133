#!/usr/bin/env bash
# compat.ud_uc: the unreliable services with unmodified binaries: ibv_ud_pingpong and ibv_uc_pingpong
# (payload validation with -c), perftest's ib_send_bw -c UD (also to a multicast group, --mcg),
# ib_send_lat -c UD and ib_write_bw -c UC;
# each on loopback (two processes) and across two network namespaces joined by a veth pair (that
# part needs root and `ip netns`; without them it is skipped and only the loopback part counts).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

# pingpong NAME ITERS SRV_DEV CLI_DEV HOST TOOL ARGS...: both sides must report ITERS iterations and
# nothing that looks like an error (-c makes a side complain about a corrupt payload).
pingpong() {
  local name=$1 iters=$2 sdev=$3 cdev=$4 host=$5 tool=$6 port
  shift 6
  port=$(compat_free_port)
  SRV=("$tool" -d "$sdev" -g 0 -c -p "$port" -n "$iters" "$@")
  CLI=("$tool" -d "$cdev" -g 0 -c -p "$port" -n "$iters" "$@" "$host")
  if compat_pair "$name" "$port"; then
    if ! grep -q "$iters iters in" "$PAIR_SRV_LOG" || ! grep -q "$iters iters in" "$PAIR_CLI_LOG"; then
      compat_result "$name" 0 "no \"$iters iters in\" summary on both sides"
    elif grep -qiE "fail|error|invalid" "$PAIR_SRV_LOG" "$PAIR_CLI_LOG"; then
      compat_result "$name" 0 "a side reported an error"
    else
      compat_result "$name" 1
    fi
  else
    compat_result "$name" 0
  fi
}

# perf NAME SRV_DEV CLI_DEV HOST TOOL ARGS...: one perftest pair with a result table.
perf() {
  local name=$1 sdev=$2 cdev=$3 host=$4 tool=$5
  shift 5
  compat_perftest "$name" 1 "$tool" -d "$sdev" -F "$@" -- "$tool" -d "$cdev" -F "$@" "$host"
}

# all_cases PREFIX SRV_DEV CLI_DEV HOST [MTU_MAX]
all_cases() {
  local p=$1 sdev=$2 cdev=$3 host=$4 mtu_max=${5:-4096} size
  # A UD message is at most one packet of the port's MTU.
  for size in 1 $((mtu_max / 4)) "$mtu_max"; do
    pingpong "$p ud_pingpong -s $size" 500 "$sdev" "$cdev" "$host" ibv_ud_pingpong -s "$size"
  done
  for size in 1 4096 65536; do
    pingpong "$p uc_pingpong -s $size -m 1024" 500 "$sdev" "$cdev" "$host" ibv_uc_pingpong -s "$size" -m 1024
  done
  perf "$p ib_send_bw -c UD" "$sdev" "$cdev" "$host" ib_send_bw -c UD
  perf "$p ib_send_lat -c UD" "$sdev" "$cdev" "$host" ib_send_lat -c UD
  perf "$p ib_write_bw -c UC" "$sdev" "$cdev" "$host" ib_write_bw -c UC
  # UD multicast: the server's QP joins an IPv4 group (a RoCE v2 GID ::ffff:239.x.y.z of this run's
  # own), the client sends to it.
  local mgid
  mgid=$(printf '00:00:00:00:00:00:00:00:00:00:255:255:239:%02d:%02d:%02d' $((RANDOM % 100)) $((RANDOM % 100)) $((RANDOM % 100)))
  perf "$p ib_send_bw -c UD --mcg" "$sdev" "$cdev" "$host" ib_send_bw -c UD --mcg --MGID="$mgid"
}

dev=$(compat_device 127.0.0.1)
compat_log "loopback device: $dev"
all_cases loopback "$dev" "$dev" 127.0.0.1

# The two-namespace part in a subshell: compat_netns_setup exits 77 where namespaces are impossible,
# which must not discard the loopback results above.
netns_rc=0
(
  COMPAT_PASSED=0
  COMPAT_FAILED=0
  COMPAT_FAILURES=()
  compat_netns_setup
  SRV_PREFIX=("${inA[@]}")
  CLI_PREFIX=("${inB[@]}")
  # The veth's MTU (1500) allows IBTA MTU 1024: the UD size limit there.
  all_cases netns "$devA" "$devB" "$ipA" 1024
  compat_finish
) || netns_rc=$?
if ((netns_rc == 77)); then
  compat_log "two-namespace part skipped (needs root and ip netns)"
elif ((netns_rc != 0)); then
  compat_result "two-namespace part" 0 "see the failures above"
fi

compat_finish
