#!/usr/bin/env bash
# compat.stat: `softrdma stat` shows live counters of running programs (an unmodified ib_write_bw
# pair, from another process), per device and per QP, and forgets the processes once they exit.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

dev=$(compat_device 127.0.0.1)
port=$(compat_free_port)
srv_log=$COMPAT_LOG_DIR/stat_server.log
cli_log=$COMPAT_LOG_DIR/stat_client.log
stat_log=$COMPAT_LOG_DIR/stat.log
# A long run, stopped by this script once the counters have been seen: no duration mode (-D),
# whose SIGALRM handling made runs end early under ASan now and then.
timeout -k 5 60 "$SOFTRDMA" run ib_write_bw -d "$dev" -p "$port" -n 100000000 >"$srv_log" 2>&1 &
srv=$!
compat_wait_listen "$port" "$srv"
timeout -k 5 60 "$SOFTRDMA" run ib_write_bw -d "$dev" -p "$port" -n 100000000 127.0.0.1 >"$cli_log" 2>&1 &
cli=$!
# The two ib_write_bw processes of this test (`softrdma run` execs in place, so their command
# lines start with the program name; the wrappers' start with timeout/softrdma).
pair_pids=""
for ((i = 0; i < 40; i++)); do
  sleep 0.5
  pair_pids=$(pgrep -f "^ib_write_bw .*-p $port( |\$)" || true)
  "$SOFTRDMA" stat --qp >"$stat_log" 2>&1 || true
  if (($(wc -w <<<"$pair_pids") == 2)) && grep -qE "(rx_bytes|direct_bytes) [1-9][0-9]{6,}" "$stat_log"; then break; fi
done
for p in $pair_pids; do kill "$p" 2>/dev/null || true; done
wait "$cli" || true
wait "$srv" || true

# Both processes appear, each with a device line and a QP line, and the writer's QP has sent data: as
# packets, or on the intra-host direct path (docs/direct-path.md), which the writer alone counts.
check_line() { # NAME REGEX
  if grep -qE "$2" "$stat_log"; then compat_result "$1" 1; else compat_result "$1" 0 "no line matching: $2"; fi
}
check_line "the writer has device counters" "^pid [0-9]+ link $dev/1: .*(tx_packets|direct_ops) [1-9]"
check_line "a QP line with counters" "^pid [0-9]+ link $dev/1 qpn 0x[0-9a-f]+ dest_qpn 0x[0-9a-f]+: .*((rx|tx)_packets|direct_ops) [1-9]"
check_line "data arrived (the reader's rx_bytes or the writer's direct_bytes)" "link $dev/1 qpn .* (rx_bytes|direct_bytes) [1-9][0-9]{6,}"
listed=0
for p in $pair_pids; do grep -qE "^pid $p link $dev/1:" "$stat_log" && listed=$((listed + 1)); done
if ((listed == 2)); then compat_result "both processes listed" 1; else compat_result "both processes listed" 0 "$listed of: $pair_pids"; fi

# Once they have exited, their stats pages are gone (other softrdma programs may be running).
after=$("$SOFTRDMA" stat 2>&1)
gone=1
for p in $pair_pids; do grep -q "^pid $p " <<<"$after" && gone=0; done
if ((gone)); then compat_result "exited processes are no longer listed" 1; else compat_result "exited processes are no longer listed" 0 "$after"; fi
compat_finish
