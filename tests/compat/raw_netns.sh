#!/usr/bin/env bash
# compat.raw_netns: raw packet QPs on a veth rather than loopback (tests/verbs/raw_packet_test's
# RawPacket and RawRss cases on the device of a veth in a network namespace). There a frame a QP
# sends goes out of the interface and never comes back in, so another QP of the host receives it
# only through the port's local loopback (net/raw_port.h), as between the QPs of one NIC port.
# Needs root and `ip netns`; exits 77 (skip) without them. $1: the verbs_tests program.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma
VERBS_TESTS=$1

compat_netns_setup  # sets nsA nsB ipA ipB devA devB inA inB (exits 77 where impossible)

for direct in 1 0; do
  name="raw packet QPs on a veth (SOFTRDMA_DIRECT=$direct)"
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/raw-direct$direct.log
  PAIR_SRV_LOG=/dev/null
  if "${inA[@]}" env SOFTRDMA_DIRECT=$direct VT_DEVICE="$devA" timeout -k 5 "$COMPAT_TIMEOUT" \
    "$VERBS_TESTS" --gtest_filter='RawPacket.*:RawRss.*' >"$PAIR_CLI_LOG" 2>&1; then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "verbs_tests failed"
  fi
done

compat_finish
