#!/usr/bin/env bash
# Cross-"host" benchmark (issue 13; iWARP rows, issue 16): unmodified perftest over softrdma between
# two network namespaces joined by a veth, on RoCEv2 and on iWARP, side by side in one run with the kernel's TCP and UDP between the same
# namespaces (qperf, sockperf, iperf3). For each veth MTU and each CPU placement it measures
# bandwidth, message rate, latency, CPU seconds per GB on both sides, and many QP-owning processes
# at once; it prints a markdown table (ratio = softrdma / peer) and draws bandwidth against message
# size with gnuplot. Needs root (network namespaces) and 2 CPUs.
#
#   bench/netns.sh                                   (after a build in build/; about 7 minutes)
#   BENCH_QUICK=1 SOFTRDMA_BIN=<build>/bin bench/netns.sh   (checks the script itself, about 1 minute)
#   BENCH_MTUS=1500 BENCH_PLACEMENTS=pinned BENCH_PROCS="1 4" bench/netns.sh
#   BENCH_DOCS=1 bench/netns.sh                      (also copies table and plot into docs/)
#
# Environment (defaults in brackets):
#   BENCH_QUICK [0]           1: first MTU only, pinned, plot sizes 4096 65536 1048576, 1 s runs,
#                             fewer iterations, N = 1 4 (BENCH_PROCS, BENCH_CURVE_SIZES, BENCH_SECONDS
#                             and the iteration counts still apply when set)
#   BENCH_MTUS ["9000 1500"]  veth MTUs; softrdma picks the RoCE path MTU itself (4096 at 9000,
#                             1024 at 1500), so perftest gets no -m
#   BENCH_PLACEMENTS ["pinned unpinned"]  pinned: server `taskset -c 0`, client `taskset -c 1`
#   BENCH_PROCS ["1 4 16"]    process pairs at once for the many-processes rows (latency pairs run
#                             BENCH_LAT_ITERS / N iterations each, at least 200: they spin on 2 CPUs)
#   BENCH_MULTI_ALL [0]       1: many-processes rows in every MTU/placement, not only the first
#   BENCH_TRANSPORTS ["roce roce6 iwarp"]  softrdma's rows: RoCEv2 (perftest's TCP exchange, -d device),
#                             RoCEv2 over IPv6 (the veth also gets fd77:5eed::1/2, perftest on their
#                             softrdma6_* devices; its TCP exchange stays on IPv4; each row also as a
#                             ratio to IPv4's, which needs roce too) and iWARP (`softrdma run --iwarp`,
#                             perftest -R: connected through rdma_cm, FPDUs on a TCP connection over the
#                             veth), the same programs and sizes
#   BENCH_PROTECT ["auth encrypt"]  wire protection rows (RoCEv2 over rdma_cm, perftest -R, as a ratio to
#                             the same run unprotected); "" for none
#   BENCH_CURVE_SIZES ["256 1024 4096 16384 65536 262144 1048576"]  sizes of the plot (pinned only)
#   BENCH_SECONDS [2]         seconds of each timed run (perftest -D, qperf -t, sockperf -t, iperf3 -t)
#   BENCH_LAT_ITERS [5000]    iterations of each perftest latency run (t_typical needs iteration mode)
#   BENCH_CPU_ITERS [30000]   iterations of the 64 KiB ib_write_bw/ib_read_bw runs the CPU rows use
#   BENCH_TIMEOUT [60]        seconds any one process may run
#   BENCH_OUT [build/bench]   netns.md (the table), netns.dat (raw numbers), netns.png, netns.gp
#   BENCH_DOCS [0]            1: copy the table to docs/performance-netns-table.md and the plot to
#                             docs/performance-netns.png
#
# Latency is one-way (half the round trip), as perftest, qperf and sockperf report it. Bandwidth is
# GB/s = 1e9 B/s (perftest reports MiB/s; converted). CPU s/GB: utime+stime of the process from
# /proc/PID/stat (all its threads), read until it exits, over the bytes it moved. Every process
# runs under `timeout`; a measurement that fails shows as "fail", its reason goes under the table,
# and the run goes on. sockperf's smallest message is 14 B, so its rows stand for perftest's 8 B.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SOFTRDMA_BIN=${SOFTRDMA_BIN:-$root/build/bin}
export COMPAT_TIMEOUT=${BENCH_TIMEOUT:-60}
. "$root/tests/compat/compat_lib.sh"
compat_require_softrdma
# The packet path is what a second host would see. Processes in different namespaces do not find
# each other for the intra-host direct path anyway (its registry is per namespace); this keeps it so.
export SOFTRDMA_DIRECT=0

# Progress goes to stderr; stdout carries only the markdown.
exec 3>&1 1>&2

QUICK=${BENCH_QUICK:-0}
if [[ $QUICK == 1 ]]; then
  # One MTU, pinned, few sizes, short runs: checks the script, not softrdma.
  MTUS=(${BENCH_MTUS:-9000})
  MTUS=("${MTUS[0]}")
  PLACEMENTS=(pinned)
  PROCS=(${BENCH_PROCS:-1 4})
  CURVE_SIZES=(${BENCH_CURVE_SIZES:-4096 65536 1048576})
  SECONDS_RUN=${BENCH_SECONDS:-1}
  LAT_ITERS=${BENCH_LAT_ITERS:-1000}
  CPU_ITERS=${BENCH_CPU_ITERS:-5000}
else
  MTUS=(${BENCH_MTUS:-9000 1500})
  PLACEMENTS=(${BENCH_PLACEMENTS:-pinned unpinned})
  PROCS=(${BENCH_PROCS:-1 4 16})
  CURVE_SIZES=(${BENCH_CURVE_SIZES:-256 1024 4096 16384 65536 262144 1048576})
  SECONDS_RUN=${BENCH_SECONDS:-2}
  LAT_ITERS=${BENCH_LAT_ITERS:-5000}
  CPU_ITERS=${BENCH_CPU_ITERS:-30000}
fi
MULTI_ALL=${BENCH_MULTI_ALL:-0}
PROTECT=(${BENCH_PROTECT-auth encrypt})
for p in "${PROTECT[@]}"; do
  [[ $p == auth || $p == encrypt ]] || { echo "bench: BENCH_PROTECT: auth and/or encrypt, not $p" >&2; exit 2; }
done
TRANSPORTS=(${BENCH_TRANSPORTS:-roce roce6 iwarp})
for t in "${TRANSPORTS[@]}"; do
  [[ $t == roce || $t == roce6 || $t == iwarp ]] || { echo "bench: BENCH_TRANSPORTS: roce, roce6 and/or iwarp, not $t" >&2; exit 2; }
done
# The IPv6 addresses of the veth's ends (roce6).
ip6A=fd77:5eed::1
ip6B=fd77:5eed::2
T=$COMPAT_TIMEOUT
OUT=${BENCH_OUT:-$root/build/bench}
mkdir -p "$OUT"
TCK=$(getconf CLK_TCK)

for t in ip qperf sockperf iperf3 taskset pgrep ib_write_bw ib_write_lat; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (tools/setup-deps.sh installs it)" >&2; exit 1; }
done
if [[ $(id -u) != 0 ]]; then
  echo "bench: needs root (it creates network namespaces)" >&2
  exit 1
fi
if (($(nproc) < 2)); then
  echo "bench: needs 2 CPUs (server on CPU 0, client on CPU 1 when pinned)" >&2
  exit 1
fi
started=$(date +%s)

# ---- teardown ---------------------------------------------------------------------------------
# Our background jobs still running (bash's own list, so no PID that was reaped and reused), then
# every process left in the namespaces and the namespaces themselves (compat's cleanup). The traps
# are set again after each compat_netns_setup: it installs its own, which would not exit on INT.
# softrdma keeps a QPN registry per namespace in /dev/shm (named by the namespace's inode), and a
# stats page per process that stays behind when the process is killed or exits on an error: ours
# go with the namespaces (PIDS_FILE: every softrdma process we started).
nsA="" nsB=""
NS_INODES=()
PIDS_FILE=$COMPAT_LOG_DIR/softrdma.pids
: >"$PIDS_FILE"
# teardown [exit]: a second Ctrl-C (or timeout's signal to the group after the one to us) must not cut
# it short, so INT and TERM wait until it is done.
teardown() {
  local p i
  trap '' INT TERM
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  if [[ -n $nsA ]]; then
    # Let the namespaces' processes finish exiting first (they may still touch the registry), then
    # KILL what is left; compat's cleanup deletes the namespaces.
    local -a left
    for ((i = 0; i < 50; i++)); do
      mapfile -t left < <(ip netns pids "$nsA" 2>/dev/null; ip netns pids "$nsB" 2>/dev/null)
      ((${#left[@]})) || break
      ((i == 0)) && kill "${left[@]}" 2>/dev/null
      ((i == 40)) && kill -9 "${left[@]}" 2>/dev/null
      nap 0.1
    done
    cleanup
  fi
  for p in "${NS_INODES[@]+"${NS_INODES[@]}"}"; do rm -f "/dev/shm/softrdma-registry-$p"-u*; done
  while read -r p; do
    for ((i = 0; i < 20; i++)); do kill -0 "$p" 2>/dev/null || break; nap 0.1; done
    kill -0 "$p" 2>/dev/null || rm -f /dev/shm/softrdma-stats-"$p"-*
  done <"$PIDS_FILE"
  : >"$PIDS_FILE"
  nsA="" nsB=""
  NS_INODES=()
  [[ ${1:-} == exit ]] || set_traps
}
set_traps() {
  trap 'teardown exit' EXIT
  trap 'echo "bench: interrupted" >&2; exit 130' INT
  trap 'exit 143' TERM
}
set_traps

# A sleep without forking (the CPU watchers poll often): read with a timeout on a pipe nobody writes.
exec {nofork_fd}<> <(:)
nap() { read -r -t "$1" -u "$nofork_fd" _ 2>/dev/null; }

# ---- placement probe --------------------------------------------------------------------------
# Cache-line round trip between CPU 0 and 1 (ns), bench/c2c_probe.cpp: the host moves this VM's
# vCPUs between a near (~60 ns) and a far (~330 ns) placement, which moves every figure.
probe_bin=${TMPDIR:-/tmp}/softrdma-c2c-probe
[[ -x $probe_bin ]] || c++ -O2 -std=c++20 -pthread -o "$probe_bin" "$root/bench/c2c_probe.cpp" 2>/dev/null
probe() { [[ -x $probe_bin ]] && timeout 10 "$probe_bin" 100000; }
probe_start=$(probe)
compat_log "c2c probe CPU 0 <-> 1: ${probe_start:-?} ns (near ~60, far ~330)"

# ---- helpers ----------------------------------------------------------------------------------
fmtnum() { [[ -z $1 ]] && echo fail || awk -v x="$1" 'BEGIN { printf (x < 0.1 ? "%.4f" : x < 10 ? "%.3f" : "%.1f"), x }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
sizename() { awk -v s="$1" 'BEGIN { if (s >= 1048576 && s % 1048576 == 0) printf "%d MiB", s / 1048576; else if (s >= 1024 && s % 1024 == 0) printf "%d KiB", s / 1024; else printf "%d B", s }'; }
num() { [[ $1 =~ ^[0-9.eE+-]+$ ]]; }

ROWS=()   # markdown lines, in order
NOTES=()  # why a measurement failed, printed under the tables
GROUP=""  # e.g. "9000 pinned": the first two fields of every netns.dat line
DAT=$OUT/netns.dat
printf '# bench/netns.sh raw numbers, %s; "-" = failed\n# mtu placement measurement size_bytes value unit\n' \
  "$(date -u '+%Y-%m-%d %H:%M UTC')" >"$DAT"
record() { echo "$GROUP $1 $2 ${3:--} $4" >>"$DAT"; }  # NAME SIZE VALUE UNIT
row() { # TEST SIZE OURS PEER_NAME PEER UNIT
  ROWS+=("| $1 | $2 | $(fmtnum "$3") | $4 | $(fmtnum "$5") | $6 | $(ratio "$3" "$5") |")
}

PORT=$((20000 + RANDOM % 20000))
next_ports() { echo "$PORT"; PORT=$((PORT + $1)); }  # fresh namespaces: a counter is enough

# spawn SIDE LOG CMD...: starts CMD in namespace A (SIDE=srv) or B (cli) with the placement's taskset
# and a timeout; SPAWNED is the PID of `timeout`, whose only child is CMD.
spawn() {
  local side=$1 log=$2
  shift 2
  local -a pre
  if [[ $side == srv ]]; then pre=("${inA[@]}" "${SP[@]+"${SP[@]}"}"); else pre=("${inB[@]}" "${CP[@]+"${CP[@]}"}"); fi
  "${pre[@]}" timeout -k 5 "$T" "$@" >"$log" 2>&1 &
  SPAWNED=$!
}

# child_of PID NAME: the child of `timeout` PID once it runs NAME (`softrdma run` execs the
# program, so the perftest process is timeout's child); empty after 5 s without it.
child_of() {
  local parent=$1 name=$2 c i comm
  for ((i = 0; i < 250; i++)); do
    for c in $(pgrep -P "$parent" 2>/dev/null); do
      if read -r comm 2>/dev/null <"/proc/$c/comm" && [[ $comm == "${name:0:15}" ]]; then
        echo "$c" >>"$PIDS_FILE"
        echo "$c"
        return 0
      fi
    done
    kill -0 "$parent" 2>/dev/null || return 1
    nap 0.02
  done
  return 1
}

# cpu_follow PID FILE: in the background, reads utime+stime (ticks, every thread) of PID until it
# exits and writes the last value to FILE; "" when PID is empty or never seen.
cpu_follow() {
  local pid=$1 out=$2
  (
    local line best=0 seen=0 rest
    local -a f
    if [[ -n $pid ]]; then
      while { read -r line <"/proc/$pid/stat"; } 2>/dev/null; do
        rest=${line##*) }  # the command name may hold spaces; fields after it do not
        read -r -a f <<<"$rest"
        # f[0] is field 3 (state): utime is field 14, stime 15.
        ((f[11] + f[12] > best)) && best=$((f[11] + f[12]))
        seen=1
        nap 0.02
      done
    fi
    if ((seen)); then echo "$best" >"$out"; else : >"$out"; fi
  ) &
  FOLLOWED=$!
}

# s_per_gb TICKS BYTES: CPU seconds per 1e9 bytes.
s_per_gb() { awk -v t="$1" -v b="$2" -v hz="$TCK" 'BEGIN { if (t == "" || b == "" || b + 0 == 0) exit; printf "%.4f", t / hz / (b / 1e9) }'; }

# perftest_pairs N TOOL ARGS...: N server/client pairs of one perftest tool at once, server i in A
# on devA, client i in B on devB connecting to ipA. Sets PT_ROW[i] (the client's result row),
# PT_STICKS[i] / PT_CTICKS[i] (CPU ticks of server / client). Returns 0 when every pair passed.
# (compat_pair runs one pair and does not expose the PIDs the CPU figures need.)
perftest_pairs() {
  local n=$1 tool=$2
  shift 2
  local base i ok=0 port slug rc
  local -a spid cpid sw cw slog clog
  # RoCEv2: perftest's own TCP exchange, on the veth's device. iWARP: rdma_cm only (-R), which picks
  # the iWARP device of the address.
  local -a PT_RUN=(run --) PT_SRV=(-d "$devA") PT_CLI=(-d "$devB")
  [[ ${PT_MODE:-roce} == iwarp ]] && PT_RUN=(run --iwarp --) PT_SRV=(-R) PT_CLI=(-R)
  # IPv6: the softrdma6_* devices (GID 0 the IPv6 address); perftest's exchange still reaches ipA.
  [[ ${PT_MODE:-roce} == roce6 ]] && PT_SRV=(-d "$dev6A") PT_CLI=(-d "$dev6B")
  # Wire protection rows: keys are agreed in the rdma_cm exchange, so rdma_cm (-R) it is.
  [[ ${PT_MODE:-roce} == protect.* ]] && PT_SRV=(-R) PT_CLI=(-R)
  base=$(next_ports "$n")
  slug=${PT_MODE:-roce}.${tool}_${*// /_}
  slug=${slug//[^A-Za-z0-9_.-]/}
  PT_ROW=() PT_STICKS=() PT_CTICKS=()
  for ((i = 0; i < n; i++)); do
    port=$((base + i))
    slog[i]=$COMPAT_LOG_DIR/$GROUP_SLUG.$slug.$n.$i.server.log
    clog[i]=$COMPAT_LOG_DIR/$GROUP_SLUG.$slug.$n.$i.client.log
    spawn srv "${slog[i]}" "$SOFTRDMA" "${PT_RUN[@]}" "$tool" "${PT_SRV[@]}" -F -p "$port" "$@"
    spid[i]=$SPAWNED
  done
  for ((i = 0; i < n; i++)); do
    if ((ok == 0)) && ! ${PT_WAIT:-compat_wait_listen} $((base + i)) "${spid[i]}" "${inA[@]}"; then
      echo "bench: $tool $* server $i never listened; log ${slog[i]}" >&2
      ok=1
    fi
  done
  if ((ok == 0)); then
    for ((i = 0; i < n; i++)); do
      cpu_follow "$(child_of "${spid[i]}" "$tool")" "${slog[i]}.ticks"
      sw[i]=$FOLLOWED
    done
    for ((i = 0; i < n; i++)); do
      spawn cli "${clog[i]}" "$SOFTRDMA" "${PT_RUN[@]}" "$tool" "${PT_CLI[@]}" -F -p $((base + i)) "$@" "$ipA"
      cpid[i]=$SPAWNED
    done
    for ((i = 0; i < n; i++)); do
      cpu_follow "$(child_of "${cpid[i]}" "$tool")" "${clog[i]}.ticks"
      cw[i]=$FOLLOWED
    done
    for ((i = 0; i < n; i++)); do
      wait "${cpid[i]}" || { rc=$?; ok=1; echo "bench: $tool $* client $i failed (exit $rc); log ${clog[i]}" >&2; }
    done
  fi
  # After a failure the servers may wait for a peer that never comes.
  if ((ok)); then for ((i = 0; i < n; i++)); do kill "${spid[i]}" 2>/dev/null; done; fi
  for ((i = 0; i < n; i++)); do
    wait "${spid[i]}" || { rc=$?; ((ok)) || echo "bench: $tool $* server $i failed (exit $rc); log ${slog[i]}" >&2; ok=1; }
  done
  if ((ok)); then
    # perftest's own words, e.g. "Failed status 12" (IBV_WC_RETRY_EXC_ERR), for the notes.
    local why failed=0
    for ((i = 0; i < n; i++)); do
      why=$(grep -h -m1 -E "Failed status|unknown option|[Cc]ouldn't|[Uu]nable|[Ff]ailed to|exited with Error" "${clog[i]}" "${slog[i]}" 2>/dev/null | head -n1)
      [[ -n $why ]] && failed=$((failed + 1)) && NOTE_WHY=$why
    done
    NOTES+=("MTU ${GROUP/ /, }: $n x $([[ ${PT_MODE:-roce} == iwarp ]] && echo "iWARP ")$([[ ${PT_MODE:-roce} == roce6 ]] && echo "IPv6 ")$tool $*: failed (${failed} of $n pairs reported an error${NOTE_WHY:+, e.g. \"${NOTE_WHY# }\"}); logs ${COMPAT_LOG_DIR}/$GROUP_SLUG.$slug.$n.*")
    NOTE_WHY=""
    return 1
  fi
  for ((i = 0; i < n; i++)); do
    wait "${sw[i]}" "${cw[i]}" 2>/dev/null
    PT_ROW[i]=$(awk '/#bytes/ { t=1; next } t && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+/ { print; exit }' "${clog[i]}")
    PT_STICKS[i]=$(cat "${slog[i]}.ticks" 2>/dev/null)
    PT_CTICKS[i]=$(cat "${clog[i]}.ticks" 2>/dev/null)
    [[ -n ${PT_ROW[i]} ]] || { echo "bench: $tool $*: no result row in ${clog[i]}" >&2; return 1; }
  done
  return 0
}
# Result rows: bandwidth tests "#bytes #iterations BW_peak BW_average[MiB/s] MsgRate[Mpps]",
# latency tests "#bytes #iterations t_min t_max t_typical t_avg ...".
bw_gbs() { awk '{ printf "%.6f", $4 * 1048576 / 1e9 }' <<<"$1"; }
mpps() { awk '{ print $5 }' <<<"$1"; }
t_typ() { awk '{ print $5 }' <<<"$1"; }
t_avg() { awk '{ print $6 }' <<<"$1"; }

# One perftest pair; PT1 = the client's result row, empty on failure (no subshell: NOTES must stay).
perftest1() { PT1=""; perftest_pairs 1 "$@" && PT1=${PT_ROW[0]}; }

# iperf3_pairs N SECONDS: N iperf3 pairs at once, receiver (server) in A. Sets IP_GBS (sum of
# receiver bandwidths), IP_RX_SPG / IP_TX_SPG (CPU s/GB of receiver / sender, pair 0).
iperf3_pairs() {
  local n=$1 secs=$2 base i ok=0
  local -a spid cpid sw cw slog clog
  base=$(next_ports "$n")
  IP_GBS="" IP_RX_SPG="" IP_TX_SPG=""
  for ((i = 0; i < n; i++)); do
    slog[i]=$COMPAT_LOG_DIR/$GROUP_SLUG.iperf3.$n.$i.server.json
    clog[i]=$COMPAT_LOG_DIR/$GROUP_SLUG.iperf3.$n.$i.client.json
    spawn srv "${slog[i]}" iperf3 -s -1 -J -p $((base + i))
    spid[i]=$SPAWNED
  done
  for ((i = 0; i < n; i++)); do
    ((ok == 0)) || break
    compat_wait_listen $((base + i)) "${spid[i]}" "${inA[@]}" || { ok=1; echo "bench: iperf3 server $i never listened" >&2; }
  done
  if ((ok == 0)); then
    for ((i = 0; i < n; i++)); do
      cpu_follow "$(child_of "${spid[i]}" iperf3)" "${slog[i]}.ticks"
      sw[i]=$FOLLOWED
    done
    # 64 KiB writes, the size the softrdma CPU rows use.
    for ((i = 0; i < n; i++)); do
      spawn cli "${clog[i]}" iperf3 -c "$ipA" -p $((base + i)) -t "$secs" -l 64K -J
      cpid[i]=$SPAWNED
    done
    for ((i = 0; i < n; i++)); do
      cpu_follow "$(child_of "${cpid[i]}" iperf3)" "${clog[i]}.ticks"
      cw[i]=$FOLLOWED
    done
    for ((i = 0; i < n; i++)); do wait "${cpid[i]}" || { ok=1; echo "bench: iperf3 client $i failed; ${clog[i]}" >&2; }; done
  fi
  if ((ok)); then for ((i = 0; i < n; i++)); do kill "${spid[i]}" 2>/dev/null; done; fi
  for ((i = 0; i < n; i++)); do wait "${spid[i]}" || { ((ok)) || echo "bench: iperf3 server $i failed; ${slog[i]}" >&2; ok=1; }; done
  ((ok == 0)) || { NOTES+=("MTU ${GROUP/ /, }: $n x iperf3: failed; logs $COMPAT_LOG_DIR/$GROUP_SLUG.iperf3.$n.*"); return 1; }
  # iperf3's JSON is pretty-printed: the first "bytes" / "bits_per_second" after the sum's key.
  jfield() { awk -v k="\"$2\"" -v f="\"$3\"" 'index($0, k) { t=1 } t && index($0, f) { gsub(/[^0-9.]/, "", $2); print $2; exit }' "$1"; }
  local sum=0 v rxb txb
  for ((i = 0; i < n; i++)); do
    wait "${sw[i]}" "${cw[i]}" 2>/dev/null
    v=$(jfield "${slog[i]}" sum_received bits_per_second)
    num "$v" || { echo "bench: iperf3 pair $i: no result in ${slog[i]}" >&2; return 1; }
    sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { printf "%.6f", a + b / 8 / 1e9 }')
  done
  IP_GBS=$sum
  rxb=$(jfield "${slog[0]}" sum_received bytes)
  txb=$(jfield "${clog[0]}" sum_sent bytes)
  IP_RX_SPG=$(s_per_gb "$(cat "${slog[0]}.ticks" 2>/dev/null)" "$rxb")
  IP_TX_SPG=$(s_per_gb "$(cat "${clog[0]}.ticks" 2>/dev/null)" "$txb")
  return 0
}

# sockperf_pairs N SECONDS: N spinning UDP ping-pong pairs at once (server in A); SP_P50 = mean of
# their p50 (µs, one-way: sockperf reports half the round trip). 14 B: sockperf's smallest message.
sockperf_pairs() {
  local n=$1 secs=$2 base i ok=0 v sum=0
  local -a spid cpid clog
  base=$(next_ports "$n")
  SP_P50=""
  for ((i = 0; i < n; i++)); do
    spawn srv "$COMPAT_LOG_DIR/$GROUP_SLUG.sockperf.$n.$i.server.log" sockperf sr -i "$ipA" -p $((base + i)) --nonblocked
    spid[i]=$SPAWNED
  done
  nap 0.5  # UDP: no listening socket to wait for
  for ((i = 0; i < n; i++)); do
    clog[i]=$COMPAT_LOG_DIR/$GROUP_SLUG.sockperf.$n.$i.client.log
    spawn cli "${clog[i]}" sockperf pp -i "$ipA" -p $((base + i)) -m 14 -t "$secs" --nonblocked
    cpid[i]=$SPAWNED
  done
  for ((i = 0; i < n; i++)); do wait "${cpid[i]}" || ok=1; done
  # The spinning servers never end by themselves.
  for ((i = 0; i < n; i++)); do kill "${spid[i]}" 2>/dev/null; wait "${spid[i]}" 2>/dev/null; done
  for ((i = 0; i < n; i++)); do
    v=$(awk '/percentile 50.000/ { print $NF; exit }' "${clog[i]}")
    num "$v" || { echo "bench: sockperf pair $i failed; ${clog[i]}" >&2; NOTES+=("MTU ${GROUP/ /, }: $n x sockperf: pair $i failed; ${clog[i]}"); return 1; }
    sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { print a + b }')
  done
  ((ok == 0)) || return 1
  SP_P50=$(awk -v s="$sum" -v n="$n" 'BEGIN { printf "%.4f", s / n }')
}

# qperf CLIENT_ARGS... against the group's qperf server; prints its output (-uu: bytes/s and ns).
QPERF_PORT=""
qperf_c() {
  local -a pre=("${inB[@]}" "${CP[@]+"${CP[@]}"}")
  "${pre[@]}" timeout -k 5 "$T" qperf "$ipA" -lp "$QPERF_PORT" -uu -t "$SECONDS_RUN" "$@" 2>&1
}
# qfield OUTPUT TEST FIELD: FIELD's value in TEST's section (e.g. tcp_bw bw, udp_bw recv_bw).
qfield() { awk -v t="$2:" -v f="$3" '$1 == t { s=1; next } /^[a-z_]+:$/ { s=0 } s && $1 == f && $2 == "=" { print $3; exit }' <<<"$1"; }

declare -A CURVE  # "MTU|series|size" -> GB/s, for the plot
declare -A MPEER  # the many-processes peers of the current group ("bwN", "latN"), shared by the transports
declare -A V4     # the RoCEv2-over-IPv4 figures of the current group, for the IPv6 rows' second ratio

# ---- one MTU / placement group -------------------------------------------------------------------
run_group() {
  local mtu=$1 placement=$2 multi=$3
  GROUP="$mtu $placement"
  GROUP_SLUG="mtu$mtu-$placement"
  local s r out pmtu
  local -a tests
  if [[ $placement == pinned ]]; then SP=(taskset -c 0); CP=(taskset -c 1); else SP=(); CP=(); fi
  pmtu=$("${inA[@]}" timeout 20 "$SOFTRDMA" run ibv_devinfo -d "$devA" -v 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
  local where="server CPU 0, client CPU 1"
  [[ $placement == pinned ]] || where="no taskset"
  ROWS+=("" "### MTU $mtu, $placement ($where), RoCE path MTU ${pmtu:-?}, c2c probe $(probe || echo ?) ns" "")
  ROWS+=("| test | size | softrdma | peer | peer value | unit | ratio softrdma/peer |" "|---|---|---:|---|---:|---|---:|")
  compat_log "== MTU $mtu $placement (RoCE path MTU ${pmtu:-?})"

  # -- peers first ---------------------------------------------------------------------------
  local -A Q=()
  QPERF_PORT=$(next_ports 1)
  spawn srv "$COMPAT_LOG_DIR/$GROUP_SLUG.qperf.server.log" qperf -lp "$QPERF_PORT"
  local qpid=$SPAWNED
  if compat_wait_listen "$QPERF_PORT" "$qpid" "${inA[@]}"; then
    for s in 65536 1048576; do
      compat_log "qperf tcp_bw -m $s"
      out=$(qperf_c -m "$s" tcp_bw)
      Q[bw$s]=$(awk -v x="$(qfield "$out" tcp_bw bw)" 'BEGIN { if (x != "") printf "%.6f", x / 1e9 }')
    done
    compat_log "qperf tcp_bw -m 8, tcp_lat -m 8"
    out=$(qperf_c -m 8 tcp_bw tcp_lat)
    # 8 B messages: bytes/s / 8 = messages/s, shown in millions next to perftest's Mpps.
    Q[rate8]=$(awk -v x="$(qfield "$out" tcp_bw bw)" 'BEGIN { if (x != "") printf "%.6f", x / 8 / 1e6 }')
    Q[lat8]=$(awk -v x="$(qfield "$out" tcp_lat latency)" 'BEGIN { if (x != "") printf "%.4f", x / 1000 }')
    if [[ $placement == pinned ]]; then
      for s in "${CURVE_SIZES[@]}"; do
        tests=()
        [[ -n ${Q[bw$s]:-} ]] || tests+=(tcp_bw)
        ((s <= 65507)) && tests+=(udp_bw)  # UDP datagrams stop at 65507 B: no UDP point above
        ((${#tests[@]})) || { CURVE[$mtu|tcp|$s]=${Q[bw$s]}; continue; }
        compat_log "curve: qperf ${tests[*]} -m $s"
        out=$(qperf_c -m "$s" "${tests[@]}")
        CURVE[$mtu|tcp|$s]=${Q[bw$s]:-$(awk -v x="$(qfield "$out" tcp_bw bw)" 'BEGIN { if (x != "") printf "%.6f", x / 1e9 }')}
        ((s <= 65507)) && CURVE[$mtu|udp|$s]=$(awk -v x="$(qfield "$out" udp_bw recv_bw)" 'BEGIN { if (x != "") printf "%.6f", x / 1e9 }')
      done
    fi
  else
    echo "bench: qperf server did not start" >&2
  fi
  kill "$qpid" 2>/dev/null
  wait "$qpid" 2>/dev/null

  compat_log "sockperf pp udp spin 14 B"
  sockperf_pairs 1 "$SECONDS_RUN"
  local sp50=$SP_P50
  compat_log "iperf3 -t $SECONDS_RUN -l 64K"
  iperf3_pairs 1 "$SECONDS_RUN"
  local ipgbs=$IP_GBS iprx=$IP_RX_SPG iptx=$IP_TX_SPG
  record qperf.tcp_bw 65536 "${Q[bw65536]:-}" GB/s
  record qperf.tcp_bw 1048576 "${Q[bw1048576]:-}" GB/s
  record qperf.tcp_bw.msgrate 8 "${Q[rate8]:-}" Mmsg/s
  record qperf.tcp_lat 8 "${Q[lat8]:-}" us
  record sockperf.pp.udp.spin.p50 14 "$sp50" us
  record iperf3 65536 "$ipgbs" GB/s
  record iperf3.receiver.cpu 65536 "$iprx" s/GB
  record iperf3.sender.cpu 65536 "$iptx" s/GB

  local tr
  MPEER=() V4=()
  for tr in "${TRANSPORTS[@]}"; do softrdma_rows "$tr"; done
  ((${#PROTECT[@]})) && protect_rows
}

# protect_rows: RoCEv2 over rdma_cm (perftest -R) with SOFTRDMA_WIRE_PROTECT off, auth and encrypt
# (docs/security.md): bandwidth and latency (ib_write_lat, ib_send_lat), each as a ratio to the
# unprotected run, and `openssl speed` AES-GCM in the notes as the ceiling. Recorded as
# "protect.MODE.NAME" in netns.dat.
# A RoCE rdma_cm server holds a UDP port, not a TCP one: wait for that.
wait_udp_bound() {
  local port=$1 pid=$2 hex i
  shift 2
  hex=$(printf '%04X' "$port")
  for ((i = 0; i < 300; i++)); do
    "$@" awk -v p=":$hex" 'NR>1 && substr($2, length($2)-4)==p { f=1 } END { exit !f }' /proc/net/udp 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

protect_rows() {
  local mode r key=000102030405060708090a0b0c0d0e0f
  local -A PB=() PL=() PS=()
  PT_WAIT=wait_udp_bound
  for mode in off "${PROTECT[@]}"; do
    [[ -n ${PB[$mode]+set} ]] && continue
    PT_MODE=protect.$mode  # also names the logs
    if [[ $mode == off ]]; then unset SOFTRDMA_WIRE_PROTECT SOFTRDMA_AUTH_KEY
    else export SOFTRDMA_WIRE_PROTECT=$mode SOFTRDMA_AUTH_KEY=$key; fi
    compat_log "wire $mode: ib_write_bw -R -s 65536 -D $SECONDS_RUN"
    perftest1 ib_write_bw -s 65536 -D "$SECONDS_RUN"; r=$PT1
    PB[$mode]=$([[ -n $r ]] && bw_gbs "$r")
    compat_log "wire $mode: ib_write_lat -R -s 8 -n $LAT_ITERS"
    perftest1 ib_write_lat -s 8 -n "$LAT_ITERS"; r=$PT1
    PL[$mode]=$([[ -n $r ]] && t_typ "$r")
    compat_log "wire $mode: ib_send_lat -R -s 8 -n $LAT_ITERS"
    perftest1 ib_send_lat -s 8 -n "$LAT_ITERS"; r=$PT1
    PS[$mode]=$([[ -n $r ]] && t_typ "$r")
    record "protect.$mode.ib_write_bw" 65536 "${PB[$mode]}" GB/s
    record "protect.$mode.ib_write_lat.t_typical" 8 "${PL[$mode]}" us
    record "protect.$mode.ib_send_lat.t_typical" 8 "${PS[$mode]}" us
  done
  # The ceiling: AES-GCM on one core of this machine, as OpenSSL computes it.
  r=$(timeout 30 openssl speed -evp aes-128-gcm -bytes 8192 -seconds 1 2>/dev/null |
    awk 'tolower($1) == "aes-128-gcm" { v = $NF; sub(/k$/, "", v); printf "%.2f", v * 1000 / 1e9 }')
  [[ -n $r ]] && NOTES+=("wire protection's ceiling: \`openssl speed -evp aes-128-gcm -bytes 8192\` on one core: $r GB/s (OpenSSL's AES-GCM; softrdma uses libIPSec_MB's where built, docs/security.md)")
  unset SOFTRDMA_WIRE_PROTECT SOFTRDMA_AUTH_KEY PT_WAIT
  for mode in "${PROTECT[@]}"; do
    [[ $mode == off ]] && continue
    row "ib_write_bw -R, wire $mode (BW average)" "64 KiB" "${PB[$mode]}" "ib_write_bw -R, wire off" "${PB[off]}" "GB/s"
    row "ib_write_lat -R, wire $mode (t_typical)" "8 B" "${PL[$mode]}" "ib_write_lat -R, wire off" "${PL[off]}" "us one-way"
    row "ib_send_lat -R, wire $mode (t_typical)" "8 B" "${PS[$mode]}" "ib_send_lat -R, wire off" "${PS[off]}" "us one-way"
  done
  PT_MODE=roce
}

# softrdma_rows roce|roce6|iwarp: the softrdma rows of one group, on RoCEv2 (perftest's own TCP
# exchange, -d device), RoCEv2 over IPv6 (the softrdma6_* devices) or on iWARP (`softrdma run
# --iwarp`, perftest -R: iWARP connects only through rdma_cm). Runs inside run_group and uses its
# locals (Q, sp50, ipgbs, iprx, iptx, multi, placement, mtu). iWARP rows read "iWARP TOOL -R ..." and
# record as "iwarp.NAME" in netns.dat; IPv6 rows "IPv6 TOOL" and "ipv6.NAME", each bandwidth and
# latency row followed by one against the same measure over IPv4 (V4, from the roce rows).
softrdma_rows() {
  PT_MODE=$1
  local L="" R="" tag=rdma
  if [[ $PT_MODE == iwarp ]]; then L="iWARP " R="iwarp." tag=iwarp; fi
  if [[ $PT_MODE == roce6 ]]; then L="IPv6 " R="ipv6." tag=rdma6; fi
  # A tool's name in the rows: "ib_write_bw", "IPv6 ib_write_bw" or "iWARP ib_write_bw -R".
  tn() { case $PT_MODE in iwarp) echo "iWARP $1 -R" ;; roce6) echo "IPv6 $1" ;; *) echo "$1" ;; esac; }
  # v4row NAME SIZE VALUE UNIT KEY: IPv4's figure under KEY kept (roce), or an IPv6 row against it (roce6).
  v4row() {
    if [[ $PT_MODE == roce ]]; then V4[$5]=$3; fi
    if [[ $PT_MODE == roce6 && " ${TRANSPORTS[*]} " == *" roce "* ]]; then
      row "$1, IPv6 against IPv4" "$2" "$3" "${1#IPv6 } over IPv4" "${V4[$5]:-}" "$4"
    fi
  }
  local tool v typ avg gb
  local -A BW=() RATE=()
  if [[ $PT_MODE == roce6 && ( -z $dev6A || -z $dev6B ) ]]; then
    NOTES+=("MTU ${GROUP/ /, }: IPv6 rows: no softrdma6 device for $ip6A / $ip6B in the namespaces")
    return
  fi
  for tool in ib_write_bw ib_read_bw; do
    # Iteration mode: exact bytes for the CPU rows (iterations x size); the run's bandwidth too.
    compat_log "${L}$tool -s 65536 -n $CPU_ITERS (CPU)"
    if perftest_pairs 1 "$tool" -s 65536 -n "$CPU_ITERS"; then
      BW[$tool.65536]=$(bw_gbs "${PT_ROW[0]}")
      gb=$((CPU_ITERS * 65536))
      BW[$tool.spas]=$(s_per_gb "${PT_STICKS[0]}" "$gb")
      BW[$tool.sact]=$(s_per_gb "${PT_CTICKS[0]}" "$gb")
    fi
  done
  for tool in ib_write_bw ib_read_bw ib_send_bw; do
    for s in 65536 1048576 8; do
      [[ -n ${BW[$tool.$s]:-} ]] && continue
      compat_log "${L}$tool -s $s -D $SECONDS_RUN"
      perftest1 "$tool" -s "$s" -D "$SECONDS_RUN"; r=$PT1
      [[ -n $r ]] || continue
      BW[$tool.$s]=$(bw_gbs "$r")
      RATE[$tool.$s]=$(mpps "$r")
    done
  done
  for tool in ib_write_bw ib_read_bw ib_send_bw; do
    for s in 65536 1048576; do
      row "$(tn "$tool") (BW average)" "$(sizename $s)" "${BW[$tool.$s]:-}" "qperf tcp_bw" "${Q[bw$s]:-}" "GB/s"
      v4row "$(tn "$tool") (BW average)" "$(sizename $s)" "${BW[$tool.$s]:-}" "GB/s" "$tool.$s"
      record "$R$tool" "$s" "${BW[$tool.$s]:-}" GB/s
    done
  done
  row "$(tn ib_write_bw) (BW average)" "64 KiB" "${BW[ib_write_bw.65536]:-}" "iperf3 TCP, 1 stream, 64 KiB writes" "$ipgbs" "GB/s"
  for tool in ib_write_bw ib_read_bw ib_send_bw; do
    row "$(tn "$tool") (MsgRate)" "8 B" "${RATE[$tool.8]:-}" "qperf tcp_bw -m 8 (bytes/s / 8)" "${Q[rate8]:-}" "M msg/s"
    v4row "$(tn "$tool") (MsgRate)" "8 B" "${RATE[$tool.8]:-}" "M msg/s" "$tool.rate8"
    record "$R$tool.msgrate" 8 "${RATE[$tool.8]:-}" Mmsg/s
  done
  for tool in ib_write_lat ib_read_lat ib_send_lat; do
    compat_log "${L}$tool -s 8 -n $LAT_ITERS"
    perftest1 "$tool" -s 8 -n "$LAT_ITERS"; r=$PT1
    typ="" avg=""
    [[ -n $r ]] && typ=$(t_typ "$r") && avg=$(t_avg "$r")
    row "$(tn "$tool") (t_typical)" "8 B" "$typ" "sockperf pp udp spin, 14 B (p50)" "$sp50" "us one-way"
    row "$(tn "$tool") (t_avg)" "8 B" "$avg" "qperf tcp_lat (mean)" "${Q[lat8]:-}" "us one-way"
    v4row "$(tn "$tool") (t_typical)" "8 B" "$typ" "us one-way" "$tool.typ"
    record "$R$tool.t_typical" 8 "$typ" us
    record "$R$tool.t_avg" 8 "$avg" us
  done
  for tool in ib_write_bw ib_read_bw; do
    row "$(tn "$tool") passive side (server) CPU" "64 KiB" "${BW[$tool.spas]:-}" "iperf3 receiver CPU" "$iprx" "s/GB"
    row "$(tn "$tool") active side (client) CPU" "64 KiB" "${BW[$tool.sact]:-}" "iperf3 sender CPU" "$iptx" "s/GB"
    record "$R$tool.passive.cpu" 65536 "${BW[$tool.spas]:-}" s/GB
    record "$R$tool.active.cpu" 65536 "${BW[$tool.sact]:-}" s/GB
  done

  # -- many processes (not again over IPv6: the same sockets, the same code) --------------------
  if ((multi)) && [[ $PT_MODE != roce6 ]]; then
    local n i sum iters
    for n in "${PROCS[@]}"; do
      compat_log "${L}$n x ib_write_bw -s 65536 -D $SECONDS_RUN at once"
      sum=""
      # Longer than the single runs: the N clients start one after the other.
      if perftest_pairs "$n" ib_write_bw -s 65536 -D $((SECONDS_RUN + n / 4)); then
        sum=0
        for ((i = 0; i < n; i++)); do sum=$(awk -v a="$sum" -v b="$(bw_gbs "${PT_ROW[i]}")" 'BEGIN { printf "%.6f", a + b }'); done
      fi
      # The peers once per group: the second transport's rows reuse them.
      if [[ -z ${MPEER[bw$n]+set} ]]; then
        compat_log "$n x iperf3 at once"
        iperf3_pairs "$n" $((SECONDS_RUN + n / 4))
        MPEER[bw$n]=$IP_GBS
        record "multi$n.iperf3.sum" 65536 "$IP_GBS" GB/s
      fi
      row "$n x $(tn ib_write_bw) processes, sum" "64 KiB" "$sum" "$n x iperf3 processes, sum" "${MPEER[bw$n]}" "GB/s"
      record "${R}multi$n.ib_write_bw.sum" 65536 "$sum" GB/s
    done
    for n in "${PROCS[@]}"; do
      # Spinning pairs share 2 CPUs: fewer iterations each as N grows, so the run stays bounded.
      iters=$((LAT_ITERS / n > 200 ? LAT_ITERS / n : 200))
      compat_log "${L}$n x ib_write_lat -s 8 -n $iters at once"
      sum=""
      if perftest_pairs "$n" ib_write_lat -s 8 -n "$iters"; then
        sum=0
        for ((i = 0; i < n; i++)); do sum=$(awk -v a="$sum" -v b="$(t_typ "${PT_ROW[i]}")" 'BEGIN { print a + b }'); done
        sum=$(awk -v s="$sum" -v n="$n" 'BEGIN { printf "%.4f", s / n }')
      fi
      if [[ -z ${MPEER[lat$n]+set} ]]; then
        compat_log "$n x sockperf pp at once"
        sockperf_pairs "$n" "$SECONDS_RUN"
        MPEER[lat$n]=$SP_P50
        record "multi$n.sockperf.p50.mean" 14 "$SP_P50" us
      fi
      row "$n x $(tn ib_write_lat) processes, mean of t_typical" "8 B" "$sum" "$n x sockperf pp udp spin, mean of p50" "${MPEER[lat$n]}" "us one-way"
      record "${R}multi$n.ib_write_lat.t_typical.mean" 8 "$sum" us
    done
  fi

  # -- the plot's softrdma line ------------------------------------------------------------
  if [[ $placement == pinned ]]; then
    for s in "${CURVE_SIZES[@]}"; do
      v=${BW[ib_write_bw.$s]:-}
      if [[ -z $v ]]; then
        compat_log "${L}curve: ib_write_bw -s $s -D $SECONDS_RUN"
        perftest1 ib_write_bw -s "$s" -D "$SECONDS_RUN"; r=$PT1
        [[ -n $r ]] && v=$(bw_gbs "$r")
      fi
      CURVE[$mtu|$tag|$s]=$v
      record "${R}curve.ib_write_bw" "$s" "$v" GB/s
      [[ $PT_MODE == "${TRANSPORTS[0]}" ]] || continue  # the peers' points once per group
      record curve.qperf.tcp_bw "$s" "${CURVE[$mtu|tcp|$s]:-}" GB/s
      ((s <= 65507)) && record curve.qperf.udp_bw.recv "$s" "${CURVE[$mtu|udp|$s]:-}" GB/s
    done
  fi
}

# ---- the run ------------------------------------------------------------------------------------
first=1
for mtu in "${MTUS[@]}"; do
  export COMPAT_NETNS_MTU=$mtu
  compat_netns_setup  # exits 77 where namespaces cannot be made
  set_traps
  mapfile -t NS_INODES < <(stat -L -c %i "/run/netns/$nsA" "/run/netns/$nsB" 2>/dev/null)
  dev6A="" dev6B=""
  if [[ " ${TRANSPORTS[*]} " == *" roce6 "* ]]; then
    ip -n "$nsA" addr add "$ip6A/64" dev "$vethA" nodad
    ip -n "$nsB" addr add "$ip6B/64" dev "$vethB" nodad
    dev6A=$(compat_device "$ip6A" "${inA[@]}")
    dev6B=$(compat_device "$ip6B" "${inB[@]}")
    compat_log "IPv6: $ip6A device ${dev6A:-none}, $ip6B device ${dev6B:-none}"
  fi
  if [[ -z ${devA:-} || -z ${devB:-} ]]; then
    echo "bench: no softrdma device in the namespaces at MTU $mtu" >&2
    ROWS+=("" "### MTU $mtu: no softrdma device in the namespaces (fail)")
    teardown
    continue
  fi
  for placement in "${PLACEMENTS[@]}"; do
    multi=0
    ((first || MULTI_ALL)) && multi=1
    run_group "$mtu" "$placement" "$multi"
    first=0
  done
  teardown
done
probe_end=$(probe)
elapsed=$(($(date +%s) - started))

# ---- the plot -----------------------------------------------------------------------------------
# A self-contained gnuplot script (data inline), kept next to the PNG so the plot can be redone.
plot_made=0
if [[ " ${PLACEMENTS[*]} " == *" pinned "* ]] && ((${#CURVE_SIZES[@]})); then
  if command -v gnuplot >/dev/null; then
    gp=$OUT/netns.gp
    term=pngcairo
    gnuplot -e 'set terminal' 2>&1 | grep -qw pngcairo || term=png
    {
      echo "# bench/netns.sh: bandwidth against message size, pinned placement"
      echo "set terminal $term noenhanced size 1000,620"
      echo "set output '$OUT/netns.png'"
      echo "set title 'softrdma vs kernel TCP/UDP between two network namespaces (veth), pinned, $(date -u '+%Y-%m-%d')'"
      echo "set logscale x 2"
      echo "set xlabel 'message size (bytes)'"
      echo "set ylabel 'GB/s (1e9 B/s)'"
      echo "set yrange [0:*]"
      echo "set grid"
      echo "set key top left"
      tics=()
      for s in "${CURVE_SIZES[@]}"; do tics+=("\"$(sizename "$s")\" $s"); done
      (IFS=,; echo "set xtics (${tics[*]})")
      plots=()
      mi=0
      for mtu in "${MTUS[@]}"; do
        mi=$((mi + 1))
        for series in rdma rdma6 iwarp tcp udp; do
          case $series in
            rdma) title="softrdma ib_write_bw" color="#d62728" ;;
            rdma6) title="softrdma ib_write_bw over IPv6" color="#ff7f0e" ;;
            iwarp) title="softrdma iWARP ib_write_bw -R" color="#9467bd" ;;
            tcp) title="qperf tcp_bw" color="#1f77b4" ;;
            udp) title="qperf udp_bw (received)" color="#2ca02c" ;;
          esac
          block="\$${series}${mtu}"
          pts=()
          for s in "${CURVE_SIZES[@]}"; do
            v=${CURVE[$mtu|$series|$s]:-}
            num "$v" && pts+=("$s $v")
          done
          ((${#pts[@]})) || continue  # no line for a series without a point (UDP above 64 KiB)
          echo "$block << EOD"
          printf '%s\n' "${pts[@]}"
          echo "EOD"
          plots+=("$block using 1:2 with linespoints lw 2 dt $mi pt $((mi * 2 + 3)) lc rgb '$color' title '$title, MTU $mtu'")
        done
      done
      printf 'plot '
      for ((k = 0; k < ${#plots[@]}; k++)); do
        ((k)) && printf ', \\\n     '
        printf '%s' "${plots[k]}"
      done
      echo
    } >"$gp"
    if timeout 60 gnuplot "$gp" 2>"$COMPAT_LOG_DIR/gnuplot.log"; then
      plot_made=1
    else
      echo "bench: gnuplot failed: $(head -5 "$COMPAT_LOG_DIR/gnuplot.log")" >&2
    fi
  else
    echo "bench: gnuplot missing (gnuplot-nox): no plot" >&2
  fi
fi

# ---- the table ----------------------------------------------------------------------------------
{
  echo "## softrdma between two network namespaces (bench/netns.sh)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), kernel $(uname -r), $(nproc) CPUs, c2c probe CPU 0 <-> 1:" \
    "${probe_start:-?} ns at start, ${probe_end:-?} ns at end (near ~60, far ~330); softrdma" \
    "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?); ${elapsed} s$([[ $QUICK == 1 ]] && echo ", QUICK mode")"
  echo
  echo "Server in namespace A, client in B, joined by a veth. Ratio = softrdma / peer: latency and s/GB"
  echo "below 1 and bandwidth above 1 mean softrdma is better. perftest bandwidth: -D $SECONDS_RUN"
  echo "(64 KiB write/read: -n $CPU_ITERS, whose CPU time the s/GB rows use); latency -n $LAT_ITERS."
  [[ " ${TRANSPORTS[*]} " == *" iwarp "* ]] &&
    echo "iWARP rows: \`softrdma run --iwarp\`, perftest -R (rdma_cm), FPDUs on one TCP connection per QP."
  [[ " ${TRANSPORTS[*]} " == *" roce6 "* ]] &&
    echo "IPv6 rows: RoCEv2 over UDP/IPv6 between $ip6A and $ip6B (softrdma6_* devices), each also as a ratio to IPv4's."
  echo "s/GB: utime+stime of the whole process over its life (setup included) / bytes moved. The kernel"
  echo "does part of a veth receive in the sender's softirq, so it counts for neither side's"
  echo "process on either path."
  printf '%s\n' "${ROWS[@]}"
  echo
  if ((${#NOTES[@]})); then
    echo "Failures:"
    echo
    printf -- '- %s\n' "${NOTES[@]}"
    echo
  fi
  ((plot_made)) && echo "Plot: netns.png (bandwidth against message size, pinned)."
} >"$OUT/netns.md"
cat "$OUT/netns.md" >&3
compat_log "table: $OUT/netns.md, raw: $DAT$( ((plot_made)) && echo ", plot: $OUT/netns.png"), logs: $COMPAT_LOG_DIR"
if [[ ${BENCH_DOCS:-0} == 1 ]]; then
  cp "$OUT/netns.md" "$root/docs/performance-netns-table.md"
  ((plot_made)) && cp "$OUT/netns.png" "$root/docs/performance-netns.png"
  compat_log "copied into docs/: performance-netns-table.md$( ((plot_made)) && echo ", performance-netns.png")"
fi
