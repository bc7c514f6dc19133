#!/usr/bin/env bash
# compat.ucx: Debian's UCX (1.13) over softrdma, unmodified. `ucx_info -d` must list rc_verbs and
# ud_verbs on every softrdma device; then ucx_perftest runs tag_lat, tag_bw, ucp_put_lat, ucp_put_bw,
# ucp_get and ucp_add with UCX_TLS=rc_verbs,ud_verbs and with UCX_TLS=ud_verbs, on loopback (two
# processes) and across two network namespaces joined by a veth pair (that part needs root and
# `ip netns`; without them it is skipped and only the loopback part counts). A case passes when both
# sides exit 0 and the client printed its "Final:" result row. Short runs: a few seconds each.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

for tool in ucx_info ucx_perftest; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not installed (Debian package ucx-utils)"
    exit 77
  fi
done

# The transports and devices ucx_info -d lists, one "transport device" per line.
ucx_transports() {
  awk '/Transport:/ { t=$NF } /Device:/ && t { print t, $NF; t="" }'
}

# check_info NAME [NS_PREFIX...]: ucx_info -d, run as a program would be (inside the namespace of the
# prefix), shows rc_verbs and ud_verbs on port 1 of every softrdma device that `softrdma devices` lists
# there.
check_info() {
  local name=$1
  shift
  local log=$COMPAT_LOG_DIR/${name//[^A-Za-z0-9_.-]/_}.log devs tl d missing=""
  PAIR_SRV_LOG=/dev/null
  PAIR_CLI_LOG=$log
  "$@" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- ucx_info -d >"$log" 2>&1 || true
  devs=$("$@" "$SOFTRDMA" devices | awk '/^hca_id:/ { print $2 }')
  if [[ -z $devs ]]; then
    compat_result "$name" 0 "softrdma devices lists no device"
    return
  fi
  for d in $devs; do
    for tl in rc_verbs ud_verbs; do
      ucx_transports <"$log" | grep -qx "$tl $d:1" || missing+=" $tl/$d:1"
    done
  done
  if [[ -z $missing ]]; then
    compat_result "$name" 1
    return
  fi
  # Why: UCX says whether its IB module failed to load only at debug level.
  local why
  why=$(UCX_LOG_LEVEL=debug "$@" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- ucx_info -d 2>&1 |
    grep -m1 -o "dlopen('[^']*libuct_ib[^']*'.*failed: .*" || true)
  compat_result "$name" 0 "missing:$missing${why:+; $why}"
}

# perf NAME TLS SRV_DEV CLI_DEV HOST TEST ARGS...: one ucx_perftest pair (the server takes every
# parameter from the client); UCX_NET_DEVICES names each side's own device.
perf() {
  local name=$1 tls=$2 sdev=$3 cdev=$4 host=$5 test=$6 port
  shift 6
  port=$(compat_free_port)
  SRV=(env UCX_TLS="$tls" UCX_NET_DEVICES="$sdev:1" ucx_perftest -p "$port")
  CLI=(env UCX_TLS="$tls" UCX_NET_DEVICES="$cdev:1" ucx_perftest "$host" -p "$port" -t "$test" "$@")
  if compat_pair "$name" "$port"; then
    if grep -q '^Final:' "$PAIR_CLI_LOG"; then
      compat_result "$name" 1
    else
      compat_result "$name" 0 "the client printed no \"Final:\" result row"
    fi
  else
    compat_result "$name" 0
  fi
}

# all_cases PREFIX SRV_DEV CLI_DEV HOST
all_cases() {
  local p=$1 sdev=$2 cdev=$3 host=$4 tls
  for tls in rc_verbs,ud_verbs ud_verbs; do
    perf "$p $tls tag_lat" "$tls" "$sdev" "$cdev" "$host" tag_lat -n 1000 -w 100
    # 1 MiB: UCP's rendezvous protocol (RDMA READ on rc_verbs, fragments on ud_verbs).
    perf "$p $tls tag_bw -s 1M" "$tls" "$sdev" "$cdev" "$host" tag_bw -s 1048576 -n 50 -w 5
    perf "$p $tls ucp_put_lat" "$tls" "$sdev" "$cdev" "$host" ucp_put_lat -n 1000 -w 100
    perf "$p $tls ucp_put_bw -s 64K" "$tls" "$sdev" "$cdev" "$host" ucp_put_bw -s 65536 -n 200 -w 10
    perf "$p $tls ucp_get -s 64K" "$tls" "$sdev" "$cdev" "$host" ucp_get -s 65536 -n 200 -w 10
    perf "$p $tls ucp_add" "$tls" "$sdev" "$cdev" "$host" ucp_add -n 1000 -w 100
  done
}

check_info "loopback ucx_info -d"
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
  # UCX keeps 15 characters of a memory domain's name (UCT_MD_NAME_MAX), and softrdma names a device
  # softrdma_<interface>: the veth ends get names short enough (each namespace is private).
  compat_short_names "$nsA" "$vethA" uxa "$nsB" "$vethB" uxb
  devA=$(compat_device "$ipA" "${inA[@]}")
  devB=$(compat_device "$ipB" "${inB[@]}")
  compat_log "renamed the veth ends: devices $devA and $devB"
  check_info "netns ucx_info -d (namespace A)" "${inA[@]}"
  check_info "netns ucx_info -d (namespace B)" "${inB[@]}"
  SRV_PREFIX=("${inA[@]}")
  CLI_PREFIX=("${inB[@]}")
  all_cases netns "$devA" "$devB" "$ipA"
  compat_finish
) || netns_rc=$?
if ((netns_rc == 77)); then
  compat_log "two-namespace part skipped (needs root and ip netns)"
elif ((netns_rc != 0)); then
  compat_result "two-namespace part" 0 "see the failures above"
fi

compat_finish
