#!/usr/bin/env bash
# Loopback benchmark: unmodified perftest over softrdma, side by side in one run with kernel TCP
# (qperf) and spinning UDP (sockperf) on the same machine, server on CPU 0 and client on CPU 1.
# Prints a markdown table with the ratio softrdma / peer (latency: lower is better, so a ratio
# below 1 means softrdma is faster; bandwidth: above 1 means softrdma is faster).
#
#   bench/loopback.sh                 (after a build in build/)
#   SOFTRDMA_BIN=<build>/bin bench/loopback.sh
#   BENCH_SIZES="8 4096" BENCH_TIMEOUT=30 bench/loopback.sh
#
# Latency is one-way (half the round trip), as perftest, qperf and sockperf all report it.
# perftest's t_avg is compared with qperf's mean; perftest's t_typical (median) with sockperf's
# p50. Bandwidth is GB/s = 1e9 B/s (perftest reports MiB/s; converted). Every process has a
# timeout, so the whole run is bounded; a run that fails shows as "fail" in the table.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SOFTRDMA_BIN=${SOFTRDMA_BIN:-$root/build/bin}
export COMPAT_TIMEOUT=${BENCH_TIMEOUT:-60}
. "$root/tests/compat/compat_lib.sh"
compat_require_softrdma

SIZES=(${BENCH_SIZES:-8 4096 65536 1048576})
QPERF_SECONDS=${BENCH_QPERF_SECONDS:-2}
for t in qperf sockperf taskset ib_write_lat; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (tools/setup-deps.sh installs it)" >&2; exit 1; }
done
if (($(nproc) < 2)); then
  echo "bench: needs 2 CPUs (server on CPU 0, client on CPU 1)" >&2
  exit 1
fi

dev=$(compat_device 127.0.0.1)
SRV_PREFIX=(taskset -c 0)
CLI_PREFIX=(taskset -c 1)
rows=()

# Iterations per size: enough for a stable figure, few enough to stay within seconds.
lat_iters() { case $1 in 8 | 4096) echo 5000 ;; 65536) echo 1000 ;; *) echo 200 ;; esac; }
bw_iters() { case $1 in 8 | 4096) echo 20000 ;; 65536) echo 5000 ;; *) echo 500 ;; esac; }

# perftest TOOL SIZE ITERS: runs one pair; prints the client's result row, or nothing on failure.
perftest() {
  local tool=$1 size=$2 iters=$3 port
  port=$(compat_free_port)
  SRV=("$tool" -d "$dev" -F -s "$size" -n "$iters" -p "$port")
  CLI=("${SRV[@]}" 127.0.0.1)
  if compat_pair "$tool -s $size" "$port" >/dev/null; then
    awk '/#bytes/ { t=1; next } t && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+/ { print; exit }' "$PAIR_CLI_LOG"
  else
    echo "bench: $tool -s $size failed ($PAIR_WHY); logs in $COMPAT_LOG_DIR" >&2
  fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
fmtnum() { [[ -z $1 ]] && echo fail || awk -v x="$1" 'BEGIN { printf (x < 0.1 ? "%.4f" : x < 10 ? "%.3f" : "%.1f"), x }'; }
row() { # TEST SIZE OURS PEER_NAME PEER UNIT
  rows+=("| $1 | $2 | $(fmtnum "$3") | $4 | $(fmtnum "$5") | $6 | $(ratio "$3" "$5") |")
}

# ---- peers first, while nothing of ours runs -------------------------------------------------
declare -A QLAT QBW SPP50
qport=$(compat_free_port)
taskset -c 0 qperf -lp "$qport" >"$COMPAT_LOG_DIR/qperf.server.log" 2>&1 &
qpid=$!
trap 'kill $qpid 2>/dev/null || true' EXIT
compat_wait_listen "$qport" "$qpid" || { echo "bench: qperf server did not start" >&2; exit 1; }
for s in "${SIZES[@]}"; do
  compat_log "qperf tcp_lat tcp_bw -m $s"
  # -uu: plain units (ns, bytes/sec), so no unit parsing is needed.
  out=$(taskset -c 1 timeout "$COMPAT_TIMEOUT" qperf 127.0.0.1 -lp "$qport" -uu -t "$QPERF_SECONDS" -m "$s" tcp_lat tcp_bw 2>&1) || true
  QLAT[$s]=$(awk '$1 == "latency" && $2 == "=" { print $3 / 1000; exit }' <<<"$out")
  QBW[$s]=$(awk '$1 == "bw" && $2 == "=" { print $3 / 1e9; exit }' <<<"$out")
done
kill "$qpid" 2>/dev/null || true
wait "$qpid" 2>/dev/null || true

# The sockperf server spins (--nonblocked), so it runs only while it is measured.
sport=$(compat_free_port)
taskset -c 0 sockperf sr -i 127.0.0.1 -p "$sport" --nonblocked >"$COMPAT_LOG_DIR/sockperf.server.log" 2>&1 &
spid=$!
trap 'kill $spid 2>/dev/null || true' EXIT
sleep 0.5 # a UDP server: no listening socket to poll for, give it a moment.
for s in 14 4096; do
  compat_log "sockperf pp udp spin -m $s"
  out=$(taskset -c 1 timeout "$COMPAT_TIMEOUT" sockperf pp -i 127.0.0.1 -p "$sport" -m "$s" -t 2 --nonblocked 2>&1) || true
  SPP50[$s]=$(awk '/percentile 50.000/ { print $NF; exit }' <<<"$out")
done
kill "$spid" 2>/dev/null || true
wait "$spid" 2>/dev/null || true
trap - EXIT

# ---- softrdma --------------------------------------------------------------------------------
for tool in ib_write_lat ib_send_lat; do
  for s in "${SIZES[@]}"; do
    compat_log "$tool -s $s"
    r=$(perftest "$tool" "$s" "$(lat_iters "$s")")
    # columns: #bytes #iterations t_min t_max t_typical t_avg ...
    avg=$(awk '{ print $6 }' <<<"$r")
    typ=$(awk '{ print $5 }' <<<"$r")
    row "$tool (t_avg)" "$s B" "$avg" "qperf tcp_lat (mean)" "${QLAT[$s]:-}" "us one-way"
    if [[ $s == 8 ]]; then
      row "$tool (t_typical)" "$s B" "$typ" "sockperf pp udp spin, 14 B (p50)" "${SPP50[14]:-}" "us one-way"
    elif [[ $s == 4096 ]]; then
      row "$tool (t_typical)" "$s B" "$typ" "sockperf pp udp spin (p50)" "${SPP50[4096]:-}" "us one-way"
    fi
  done
done
for tool in ib_write_bw ib_read_bw ib_send_bw; do
  for s in "${SIZES[@]}"; do
    compat_log "$tool -s $s"
    r=$(perftest "$tool" "$s" "$(bw_iters "$s")")
    # columns: #bytes #iterations BW_peak BW_average[MiB/s] MsgRate
    gbs=$(awk '{ if ($4 != "") printf "%.6f", $4 * 1048576 / 1e9 }' <<<"$r")
    row "$tool (BW average)" "$s B" "$gbs" "qperf tcp_bw" "${QBW[$s]:-}" "GB/s"
  done
done

echo
echo "## softrdma loopback ($dev), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, server CPU 0, client CPU 1"
echo
echo "| test | size | softrdma | peer | peer figure | unit | ratio softrdma/peer |"
echo "|---|---|---:|---|---:|---|---:|"
printf '%s\n' "${rows[@]}"
echo
echo "Latency ratio < 1: softrdma faster. Bandwidth ratio > 1: softrdma faster. Logs: $COMPAT_LOG_DIR"
