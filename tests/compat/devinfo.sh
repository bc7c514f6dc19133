#!/usr/bin/env bash
# compat.devinfo: unmodified ibv_devinfo / ibv_devices see the loopback device as an active RoCE
# port, and agree with `softrdma devices` on the device list.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

check() { # NAME CONDITION-DESCRIPTION COMMAND...
  local name=$1 why=$2
  shift 2
  if "$@"; then compat_result "$name" 1; else compat_result "$name" 0 "$why"; fi
}

dev=$(compat_device 127.0.0.1)
compat_log "loopback device: $dev"

PAIR_SRV_LOG=/dev/null
PAIR_CLI_LOG=$COMPAT_LOG_DIR/ibv_devinfo_v.log
rc=0
timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run ibv_devinfo -v >"$PAIR_CLI_LOG" 2>&1 || rc=$?
check "ibv_devinfo -v exits 0" "exit code $rc" test "$rc" -eq 0
check "ibv_devinfo -v lists $dev" "no hca_id: $dev" grep -qE "hca_id:[[:space:]]+$dev\$" "$PAIR_CLI_LOG"
# The port lines of our device: from its hca_id up to the next one.
awk -v d="$dev" '/hca_id:/ { on = ($2 == d) } on' "$PAIR_CLI_LOG" >"$COMPAT_LOG_DIR/dev_section.log"
PAIR_CLI_LOG=$COMPAT_LOG_DIR/dev_section.log
check "$dev port is PORT_ACTIVE" "no PORT_ACTIVE" grep -qE "state:[[:space:]]+PORT_ACTIVE" "$PAIR_CLI_LOG"
check "$dev link_layer is Ethernet" "no link_layer Ethernet" grep -qE "link_layer:[[:space:]]+Ethernet" "$PAIR_CLI_LOG"
# -v prints the device limits; a QP that can do nothing would make every other test pointless.
check "$dev reports max_qp > 0" "max_qp missing or 0" \
  awk '/max_qp:/ { if ($2 + 0 > 0) f = 1 } END { exit !f }' "$PAIR_CLI_LOG"
# ibv_devinfo prints an IPv4-mapped RoCE v2 GID as ::ffff:a.b.c.d (older ones: in hex).
check "$dev reports a RoCE v2 GID of 127.0.0.1" "no RoCE v2 GID ::ffff:127.0.0.1" \
  grep -qE "GID\[[[:space:]]*[0-9]+\]:[[:space:]]+(::ffff:127\.0\.0\.1|(0000:){5}ffff:7f00:0001), RoCE v2" "$PAIR_CLI_LOG"

# ibv_devices and `softrdma devices` must list the same devices.
PAIR_CLI_LOG=$COMPAT_LOG_DIR/ibv_devices.log
rc=0
timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run ibv_devices >"$PAIR_CLI_LOG" 2>&1 || rc=$?
theirs=$(awk 'NR > 2 && NF >= 1 { print $1 }' "$PAIR_CLI_LOG" | sort)
ours=$("$SOFTRDMA" devices 2>/dev/null | awk '/^hca_id:/ { print $2 }' | sort)
check "ibv_devices exits 0" "exit code $rc" test "$rc" -eq 0
check "ibv_devices and softrdma devices agree" "ibv_devices: [$theirs] softrdma: [$ours]" \
  test "$theirs" = "$ours" -a -n "$ours"

compat_finish
