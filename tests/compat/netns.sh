#!/usr/bin/env bash
# compat.netns: two "hosts" (network namespaces joined by a veth pair), so traffic really crosses
# an Ethernet link as RoCEv2 over UDP instead of the same-host path. Server in namespace A, client
# in namespace B, each on the softrdma device bound to its veth address.
# Needs root and `ip netns`; exits 77 (skip) without them.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

if [[ $(id -u) != 0 ]]; then
  echo "SKIP: compat.netns needs root (to create network namespaces)"
  exit 77
fi
if ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
  echo "SKIP: compat.netns needs iproute2's \`ip netns\`"
  exit 77
fi

# Unique per run, so parallel or aborted runs never collide; veth names fit IFNAMSIZ (15).
tag=$$$RANDOM
nsA=softrdma-a-$tag
nsB=softrdma-b-$tag
vethA=srA$tag
vethB=srB$tag
vethA=${vethA:0:15}
vethB=${vethB:0:15}
ipA=10.77.0.1
ipB=10.77.0.2

cleanup() {
  ip netns pids "$nsA" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$nsB" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$nsA" 2>/dev/null || true
  ip netns del "$nsB" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

if ! ip netns add "$nsA" || ! ip netns add "$nsB"; then
  echo "SKIP: cannot create network namespaces here (container without CAP_SYS_ADMIN?)"
  exit 77
fi
if ! ip link add "$vethA" netns "$nsA" type veth peer name "$vethB" netns "$nsB"; then
  echo "SKIP: cannot create a veth pair here (no veth support or CAP_NET_ADMIN)"
  exit 77
fi
ip -n "$nsA" addr add "$ipA/24" dev "$vethA"
ip -n "$nsB" addr add "$ipB/24" dev "$vethB"
for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up; done
ip -n "$nsA" link set "$vethA" up
ip -n "$nsB" link set "$vethB" up
# Wait for the veth link to come up (it needs both ends up) and its addresses to be usable.
for ((i = 0; i < 50; i++)); do
  if ip -n "$nsA" link show "$vethA" | grep -q 'state UP' &&
    ip -n "$nsB" link show "$vethB" | grep -q 'state UP' &&
    ! ip -n "$nsA" addr show "$vethA" | grep -q tentative; then
    break
  fi
  sleep 0.1
done

inA=(ip netns exec "$nsA")
inB=(ip netns exec "$nsB")
devA=$(compat_device "$ipA" "${inA[@]}")
devB=$(compat_device "$ipB" "${inB[@]}")
compat_log "namespace A: $nsA $vethA $ipA device $devA"
compat_log "namespace B: $nsB $vethB $ipB device $devB"

SRV_PREFIX=("${inA[@]}")
CLI_PREFIX=("${inB[@]}")

netns_pair() { # TOOL ARGS...
  local tool=$1 port name
  shift
  name="netns $tool${*:+ $*}"
  port=$(compat_free_port)
  SRV=("$tool" -d "$devA" -F -p "$port" "$@")
  CLI=("$tool" -d "$devB" -F -p "$port" "$@" "$ipA")
  if compat_pair "$name" "$port"; then
    local rows
    rows=$(compat_perftest_rows "$PAIR_CLI_LOG")
    if ((rows >= 1)); then compat_result "$name" 1; else compat_result "$name" 0 "no result table"; fi
  else
    compat_result "$name" 0
  fi
}

netns_pair ib_write_bw
netns_pair ib_read_bw
netns_pair ib_send_bw
netns_pair ib_atomic_bw
netns_pair ib_write_lat

# Two processes in namespace A: the first to open the device holds UDP 4791 for its address, so
# packets from B for the second one's QP arrive at the first and are handed over (DESIGN §4).
squat_port=$(compat_free_port)
"${inA[@]}" timeout -k 5 120 "$SOFTRDMA" run ib_write_bw -d "$devA" -p "$squat_port" \
  >"$COMPAT_LOG_DIR/squatter.log" 2>&1 &
squatter=$!
compat_wait_listen "$squat_port" "$squatter" "${inA[@]}"
if "${inA[@]}" ss -uln | grep -q ":4791 "; then
  netns_pair ib_write_bw -n 2000
  netns_pair ib_read_bw -n 2000
  netns_pair ib_send_lat -n 500
else
  compat_result "a second process in A holds UDP 4791" 0 "nobody bound 4791 in namespace A"
fi
kill "$squatter" 2>/dev/null || true
wait "$squatter" 2>/dev/null || true
# With the holder gone, the next process takes the port over.
netns_pair ib_write_bw -n 2000

compat_finish
