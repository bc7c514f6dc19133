#!/usr/bin/env bash
# Intra-host direct path benchmark (issue 7): unmodified perftest over softrdma with the direct path
# (SOFTRDMA_DIRECT=1, the default) and without it (=0), side by side in one run with UCX ucx_perftest
# (UCX_TLS=posix and cma) and libfabric fi_pingpong -p shm when they are installed. Server on CPU 0,
# client on CPU 1. Prints a markdown table; "ratio" = softrdma direct / peer (latency: < 1 is faster;
# bandwidth and rates: > 1 is faster). Only ratios from one run count: the host moves this VM's
# vCPUs between placements (../shared/reference/peer-performance.md).
#
#   bench/direct.sh                               (after a build in build/)
#   SOFTRDMA_BIN=<build>/bin bench/direct.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${SOFTRDMA_BIN:-$root/build/bin}
dev=${BENCH_DEVICE:-softrdma_lo}
T=${BENCH_TIMEOUT:-60}
port=$((20000 + RANDOM % 20000))
rows=()

# perftest MODE TOOL ARGS...: prints the client's result row.
perftest() {
  local mode=$1 tool=$2
  shift 2
  port=$((port + 1))
  SOFTRDMA_DIRECT=$mode taskset -c 0 timeout "$T" "$bin/softrdma" run "$tool" -d "$dev" -F -p "$port" "$@" \
    >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  SOFTRDMA_DIRECT=$mode taskset -c 1 timeout "$T" "$bin/softrdma" run "$tool" -d "$dev" -F -p "$port" "$@" \
    127.0.0.1 2>/dev/null | awk '/#bytes/ { t=1; next } t && /^[[:space:]]*[0-9]/ { print; exit }'
  wait "$srv" 2>/dev/null
}
lat() { perftest "$@" | awk '{ print $5 }'; }                 # t_typical (median), us one-way
bw() { perftest "$@" | awk '{ printf "%.3f", $4 * 1048576 / 1e9 }'; }  # BW average, GB/s
mrate() { perftest "$@" | awk '{ print $5 }'; }               # Mpps

# ucx TLS TEST SIZE ITERS [UCT ARGS...]: p50 latency (us) for *lat tests, message rate (Mmsg/s) for
# 8 B bandwidth tests and atomics, otherwise bandwidth (GB/s). TLS "uct" runs a UCT test (no UCX_TLS) with
# the given transport arguments, e.g. -x cma -d memory -D zcopy (the cma rows: UCP over cma alone has no
# active-message transport and fails).
ucx() {
  command -v ucx_perftest >/dev/null || return 0
  local tls=$1 test=$2 size=$3 n=$4 out
  shift 4
  local -a env=(UCX_WARN_UNUSED_ENV_VARS=n)
  [[ $tls != uct ]] && env+=(UCX_TLS="$tls")
  port=$((port + 1))
  env "${env[@]}" taskset -c 0 timeout "$T" ucx_perftest -p "$port" -c 0 >/dev/null 2>&1 &
  sleep 0.5
  out=$(env "${env[@]}" taskset -c 1 timeout "$T" ucx_perftest 127.0.0.1 -p "$port" -c 1 \
    -t "$test" -s "$size" -n "$n" -w $((n / 10 + 1)) "$@" 2>/dev/null | awk '/Final:/ { print }')
  wait 2>/dev/null
  # Final: iterations, p50/avg/overall latency (us), bandwidth avg/overall (MiB/s), msgrate avg/overall
  case $test in
    *lat) awk '{ print $3 }' <<<"$out" ;;
    *fadd | *add | *swap | add_mr) awk '{ printf "%.3f", $9 / 1e6 }' <<<"$out" ;;
    *) awk -v s="$size" '{ if (s == 8) printf "%.3f", $9 / 1e6; else printf "%.3f", $7 * 1048576 / 1e9 }' <<<"$out" ;;
  esac
}
fi_lat() {
  command -v fi_pingpong >/dev/null || return 0
  port=$((port + 1))
  taskset -c 0 timeout "$T" fi_pingpong -p shm -e rdm -I 100000 -S 8 -B "$port" >/dev/null 2>&1 &
  sleep 0.5
  taskset -c 1 timeout "$T" fi_pingpong -p shm -e rdm -I 100000 -S 8 -P "$port" 127.0.0.1 2>/dev/null |
    awk '$1 ~ /^8$/ || $1 ~ /^8B/ { print $(NF-1) / 2 }' | head -1  # round trip usec/xfer -> one-way
  wait 2>/dev/null
}

# Cache-line round trip between CPU 0 and 1 (ns): the placement this run had (near ~60, far ~330).
probe_bin=${TMPDIR:-/tmp}/softrdma-c2c-probe
[[ -x $probe_bin ]] || c++ -O2 -std=c++20 -pthread -o "$probe_bin" "$root/bench/c2c_probe.cpp" 2>/dev/null
probe() { [[ -x $probe_bin ]] && timeout 10 "$probe_bin" 100000; }
probe_before=$(probe)

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
# A row: test, direct, packets, peer name, peer value; the cache-line probe taken right before the
# direct and the peer measurement (pd, pp) says whether both saw the same placement.
row() { rows+=("| $1 | ${2:-fail} | ${3:-fail} | $4 | ${5:--} | $(ratio "$2" "$5") | ${pd:-?} / ${pp:-?} |"); }
peer() { pp=$(probe); pv=$("$@"); }  # sets pp and pv here, not in a subshell

pd=$(probe); d=$(lat 1 ib_write_lat -s 8 -n 50000); p=$(lat 0 ib_write_lat -s 8 -n 20000)
peer ucx posix ucp_put_lat 8 200000
row "ib_write_lat 8 B (us, p50)" "$d" "$p" "UCX ucp_put_lat posix" "$pv"
peer fi_lat
row "ib_write_lat 8 B (us, p50)" "$d" "$p" "fi_pingpong shm (mean)" "$pv"
pd=$(probe); d=$(lat 1 ib_send_lat -s 8 -n 50000); p=$(lat 0 ib_send_lat -s 8 -n 20000)
peer ucx posix tag_lat 8 200000
row "ib_send_lat 8 B (us, p50)" "$d" "$p" "UCX tag_lat posix" "$pv"
for s in 65536 1048576; do
  n=$((s == 65536 ? 20000 : 2000))
  pd=$(probe); d=$(bw 1 ib_write_bw -s $s -n $n); p=$(bw 0 ib_write_bw -s $s -n $((n / 4)))
  peer ucx posix ucp_put_bw $s $n
  row "ib_write_bw $s B (GB/s)" "$d" "$p" "UCX ucp_put_bw posix" "$pv"
  peer ucx uct put_bw $s $n -x cma -d memory -D zcopy
  row "ib_write_bw $s B (GB/s)" "$d" "$p" "UCX UCT put_bw cma zcopy" "$pv"
done
pd=$(probe); d=$(mrate 1 ib_write_bw -s 8 -n 1000000); p=$(mrate 0 ib_write_bw -s 8 -n 100000)
peer ucx posix ucp_put_bw 8 1000000
row "ib_write_bw 8 B (Mmsg/s)" "$d" "$p" "UCX ucp_put_bw posix" "$pv"
pd=$(probe); d=$(bw 1 ib_read_bw -s 65536 -n 20000); p=$(bw 0 ib_read_bw -s 65536 -n 5000)
peer ucx posix ucp_get 65536 20000
row "ib_read_bw 64 KiB (GB/s)" "$d" "$p" "UCX ucp_get posix" "$pv"
peer ucx uct get 65536 20000 -x cma -d memory -D zcopy
row "ib_read_bw 64 KiB (GB/s)" "$d" "$p" "UCX UCT get cma zcopy" "$pv"
pd=$(probe); d=$(mrate 1 ib_atomic_bw -n 200000); p=$(mrate 0 ib_atomic_bw -n 20000)
peer ucx posix ucp_fadd 8 200000
row "ib_atomic_bw 8 B (Mmsg/s)" "$d" "$p" "UCX ucp_fadd posix" "$pv"

probe_after=$(probe)
echo "cache-line round trip CPU 0 <-> 1: ${probe_before:-?} ns before, ${probe_after:-?} ns after (near ~60, far ~330)"
echo
echo "| test | softrdma direct | softrdma packets | peer | peer | ratio direct/peer | c2c ns before direct / peer |"
echo "|---|---:|---:|---|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
