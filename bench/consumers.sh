#!/usr/bin/env bash
# Consumers between "hosts" (issue 27): UCX, libfabric, Open MPI, event-driven perftest and qperf,
# polled perftest and the protected wire, each over softrdma and right beside it (same sitting, same
# namespaces, same placement) over the peer a user would otherwise take: the same library's own TCP
# transport, kernel TCP or UDP, or softrdma's own unprotected wire. Two network namespaces joined by
# a veth, per veth MTU and CPU placement; one row (UCX on one host, over softrdma's loopback device
# and the direct path) needs no namespaces. Prints a markdown table of ratios (softrdma / peer) with
# issue 27's target for each and whether it is met, and draws the ratios with gnuplot. Needs root
# (network namespaces) and 2 CPUs.
#
#   bench/consumers.sh                                       (after a build in build/; ~9 minutes)
#   BENCH_QUICK=1 SOFTRDMA_BIN=<build>/bin bench/consumers.sh   (checks the script, 1-2 minutes)
#   BENCH_MTUS=1500 BENCH_PLACEMENTS=unpinned bench/consumers.sh
#   BENCH_DOCS=1 bench/consumers.sh          (also copies table and plot into docs/)
#
# Environment (defaults in brackets):
#   BENCH_QUICK [0]           1: first MTU only, pinned, shorter runs (the iteration counts below
#                             still apply when set)
#   BENCH_MTUS ["9000 1500"]  veth MTUs
#   BENCH_PLACEMENTS ["pinned unpinned"]  pinned: server (and namespace A's MPI ranks) `taskset -c 0`,
#                             client (namespace B's ranks) `taskset -c 1`; unpinned: no taskset
#   BENCH_SECONDS [2]         seconds of each timed run (perftest -D, qperf -t, sockperf -t)
#   BENCH_LAT_ITERS [10000]   iterations of each latency run (ucx_perftest, fi_pingpong, perftest,
#                             MPI ping-pong)
#   BENCH_BW_ITERS [10000]    iterations of the 64 KiB bandwidth runs (ucx_perftest, fi_pingpong);
#                             1 MiB runs take a tenth of it
#   BENCH_MPI_BW_ROUNDS [40]  windows of 16 x 1 MiB in the MPI bandwidth test
#   BENCH_MPI_AR_ITERS [200]  8 B allreduces (64 KiB: a quarter of it)
#   BENCH_TIMEOUT [60]        seconds any one process (or MPI launch) may run
#   BENCH_DIRECT [0]          SOFTRDMA_DIRECT in the namespaces (see below; the one-host row always
#                             runs with softrdma's default)
#   BENCH_OUT [build/bench]   consumers.md (the table), consumers.dat (raw numbers), consumers.png,
#                             consumers.gp (the plot's gnuplot script)
#   BENCH_DOCS [0]            1: copy the table to docs/performance-consumers-table.md and the plot
#                             to docs/performance-consumers.png
#   SOFTRDMA_BIN [<repo>/build/bin]  the softrdma build to measure
#
# What runs (softrdma first, its peer right after it):
#   UCX ucx_perftest   UCX_TLS=rc_verbs,ud_verbs (ud_verbs only as UCX's wire-up transport: rc_verbs
#                      alone has none, "no auxiliary transport"; every lane of the endpoint is rc_verbs)
#                      and UCX_TLS=ud_verbs, UCX_NET_DEVICES=the veth's softrdma device, against
#                      UCX_TLS=tcp on the veth: tag_lat, ucp_put_lat (p50), tag_bw, ucp_put_bw
#   libfabric          fi_pingpong -e rdm -p "verbs;ofi_rxm" against -p "tcp;ofi_rxm" (both with
#                      FI_OFI_RXM_USE_SRX=1: see tests/compat/libfabric.sh for libfabric 1.17's
#                      teardown crash without it)
#   Open MPI           bench/consumers_mpi.c (built here with mpicc.openmpi): 2 ranks (one per
#                      namespace) ping-pong 8 B and 1 MiB bandwidth, 8 ranks (4 per namespace)
#                      MPI_Allreduce of 8 B and 64 KiB; pml ucx (UCX_TLS=rc_verbs,ud_verbs, every
#                      rank under `softrdma run`) against pml ob1 with btl tcp,self. The 8-rank
#                      launches set mpi_yield_when_idle (8 spinning ranks on 2 CPUs, both sides).
#   event mode         ib_send_lat -e and qperf -cm1 rc_lat against qperf tcp_lat
#   polled             ib_write_lat, ib_send_lat (p50) against sockperf's spinning UDP ping-pong
#   protected wire     ib_write_bw -R and ib_send_lat -R with SOFTRDMA_WIRE_PROTECT=auth / encrypt
#                      against the same unprotected; `openssl speed -evp aes-128-gcm` on one core
#                      is printed as the ceiling
#   one host           UCX tag_lat over softrdma_lo (direct path on, as by default) against UCX
#                      posix,cma; once per placement (no veth, so not per MTU)
# In the namespaces SOFTRDMA_DIRECT=0 (BENCH_DIRECT), as in bench/netns.sh: the packet path is what
# a second host would see (the 8-rank MPI runs have 4 ranks per namespace; with it those would meet
# on the direct path, while ob1 there goes through kernel TCP).
#
# Latency is one-way (half the round trip) where the tool reports it so (perftest, qperf, sockperf,
# ucx_perftest, the MPI ping-pong); fi_pingpong's usec/xfer as it prints it. GB/s = 1e9 B/s.
# Every process runs under `timeout`; a measurement that fails shows as "fail", its reason goes
# under the table, and the run goes on.
# shellcheck disable=SC2054,SC2016 # commas inside words (UCX_TLS=a,b); single-quoted awk and sh programs
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SOFTRDMA_BIN=${SOFTRDMA_BIN:-$root/build/bin}
export COMPAT_TIMEOUT=${BENCH_TIMEOUT:-60}
# shellcheck source=tests/compat/compat_lib.sh
. "$root/tests/compat/compat_lib.sh"
compat_require_softrdma

# Progress goes to stderr; stdout carries only the markdown.
exec 3>&1 1>&2

QUICK=${BENCH_QUICK:-0}
if [[ $QUICK == 1 ]]; then
  # shellcheck disable=SC2206 # word lists on purpose
  MTUS=(${BENCH_MTUS:-9000})
  MTUS=("${MTUS[0]}")
  PLACEMENTS=(pinned)
  SECONDS_RUN=${BENCH_SECONDS:-1}
  LAT_ITERS=${BENCH_LAT_ITERS:-3000}
  BW_ITERS=${BENCH_BW_ITERS:-3000}
  MPI_BW_ROUNDS=${BENCH_MPI_BW_ROUNDS:-10}
  MPI_AR_ITERS=${BENCH_MPI_AR_ITERS:-50}
else
  # shellcheck disable=SC2206
  MTUS=(${BENCH_MTUS:-9000 1500})
  # shellcheck disable=SC2206
  PLACEMENTS=(${BENCH_PLACEMENTS:-pinned unpinned})
  SECONDS_RUN=${BENCH_SECONDS:-2}
  LAT_ITERS=${BENCH_LAT_ITERS:-10000}
  BW_ITERS=${BENCH_BW_ITERS:-10000}
  MPI_BW_ROUNDS=${BENCH_MPI_BW_ROUNDS:-40}
  MPI_AR_ITERS=${BENCH_MPI_AR_ITERS:-200}
fi
for p in "${PLACEMENTS[@]}"; do
  [[ $p == pinned || $p == unpinned ]] || { echo "bench: BENCH_PLACEMENTS: pinned and/or unpinned, not $p" >&2; exit 2; }
done
T=$COMPAT_TIMEOUT
OUT=${BENCH_OUT:-$root/build/bench}
mkdir -p "$OUT"
WORK=$COMPAT_LOG_DIR
KEY=000102030405060708090a0b0c0d0e0f  # SOFTRDMA_AUTH_KEY of the protected rows

for t in ip taskset timeout pgrep unshare; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 1; }
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

# ---- teardown (as bench/netns.sh) -----------------------------------------------------------------
# Our background jobs, then every process left in the namespaces and the namespaces themselves
# (compat's cleanup), then softrdma's per-namespace QPN registries and the stats pages of processes
# that were killed. The traps are set again after each compat_netns_setup, which installs its own.
nsA="" nsB=""
NS_INODES=()
# shellcheck disable=SC2120 # the EXIT trap passes "exit"
teardown() {
  local p i
  trap '' INT TERM
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  if [[ -n $nsA ]]; then
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
  # Stats pages of our processes that are gone (a killed process leaves its page behind).
  for p in /dev/shm/softrdma-stats-*; do
    [[ -e $p ]] || continue
    i=${p#/dev/shm/softrdma-stats-}
    i=${i%%-*}
    [[ -n ${OUR_PIDS[$i]+set} ]] && ! kill -0 "$i" 2>/dev/null && rm -f "$p"
  done
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
declare -A OUR_PIDS=()  # softrdma processes we started (their stats pages)

exec {nofork_fd}<> <(:)
nap() { read -r -t "$1" -u "$nofork_fd" _ 2>/dev/null; }

# ---- placement probe (bench/c2c_probe.cpp) ------------------------------------------------------
probe_bin=${TMPDIR:-/tmp}/softrdma-c2c-probe
[[ -x $probe_bin ]] || c++ -O2 -std=c++20 -pthread -o "$probe_bin" "$root/bench/c2c_probe.cpp" 2>/dev/null
probe() { [[ -x $probe_bin ]] && timeout 10 "$probe_bin" 100000; }
probe_start=$(probe)
compat_log "c2c probe CPU 0 <-> 1: ${probe_start:-?} ns (near ~60, far ~330)"

# ---- the crypto ceiling --------------------------------------------------------------------------
# One core (CPU 0), 8 KiB buffers: the most AES-128-GCM one core does here, whatever softrdma does.
OPENSSL_GBS=""
if command -v openssl >/dev/null; then
  compat_log "openssl speed -evp aes-128-gcm -bytes 8192 -seconds 1 (CPU 0)"
  # Its last line: "AES-128-GCM  4137443.33k" (1000s of bytes per second).
  OPENSSL_GBS=$(timeout 30 taskset -c 0 openssl speed -evp aes-128-gcm -bytes 8192 -seconds 1 2>/dev/null |
    awk 'toupper($1) ~ /^AES-128-GCM$/ { v=$NF; sub(/k$/, "", v); printf "%.3f", v * 1000 / 1e9 }')
fi
compat_log "openssl AES-128-GCM, 8 KiB, one core: ${OPENSSL_GBS:-?} GB/s"

# ---- the MPI program ------------------------------------------------------------------------------
MPI_BIN="" MPI_WHY=""
if ! command -v mpirun.openmpi >/dev/null || ! command -v mpicc.openmpi >/dev/null; then
  MPI_WHY="Open MPI (openmpi-bin, libopenmpi-dev) is not installed"
elif timeout 120 mpicc.openmpi -O2 -Wall -o "$WORK/consumers_mpi" "$root/bench/consumers_mpi.c" >"$WORK/mpicc.log" 2>&1; then
  MPI_BIN=$WORK/consumers_mpi
else
  MPI_WHY="mpicc.openmpi failed: $(head -c 300 "$WORK/mpicc.log" | tr '\n' ' ')"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ---- helpers ----------------------------------------------------------------------------------
fmtnum() { if [[ -z $1 ]]; then echo fail; else awk -v x="$1" 'BEGIN { printf (x < 0.1 ? "%.4f" : x < 10 ? "%.3f" : "%.1f"), x }'; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print ""; else printf "%.3f", a / b }'; }
# met RATIO TARGET: yes / no / "-" (TARGET "<=0.8" or ">=1.5").
met() {
  [[ -n $1 ]] || { echo -; return; }
  awk -v r="$1" -v t="$2" 'BEGIN { op = substr(t, 1, 2); v = substr(t, 3) + 0
    print ((op == "<=" && r <= v) || (op == ">=" && r >= v)) ? "yes" : "no" }'
}
num() { [[ $1 =~ ^[0-9.eE+-]+$ ]]; }
pretty_target() { local t=${1/<=/≤ }; t=${t/>=/≥ }; echo "$t"; }

PORT=$((20000 + RANDOM % 20000))
next_port() { PORT=$((PORT + 1)); echo "$PORT"; }  # fresh namespaces: a counter is enough

# ---- the measures ---------------------------------------------------------------------------------
# ID|softrdma side|peer|unit|target|short name (plot)
MEASURES=(
  "ucx_tag_lat|UCX tag_lat 8 B, p50 (rc_verbs)|UCX tcp|µs|<=0.8|UCX tag_lat 8B"
  "ucx_put_lat|UCX ucp_put_lat 8 B, p50 (rc_verbs)|UCX tcp|µs|<=0.8|UCX put_lat 8B"
  "ucx_tag_bw64k|UCX tag_bw 64 KiB (rc_verbs)|UCX tcp|GB/s|>=1.5|UCX tag_bw 64K"
  "ucx_tag_bw1m|UCX tag_bw 1 MiB (rc_verbs)|UCX tcp|GB/s|>=1.5|UCX tag_bw 1M"
  "ucx_put_bw1m|UCX ucp_put_bw 1 MiB (rc_verbs)|UCX tcp|GB/s|>=1.5|UCX put_bw 1M"
  "ucx_ud_bw64k|UCX tag_bw 64 KiB (ud_verbs)|UCX tcp|GB/s|>=1.0|UCX ud tag_bw 64K"
  "fi_lat|fi_pingpong -e rdm 8 B (verbs;ofi_rxm)|tcp;ofi_rxm|µs/xfer|<=0.8|fi rdm 8B"
  "fi_bw|fi_pingpong -e rdm 64 KiB (verbs;ofi_rxm)|tcp;ofi_rxm|GB/s|>=1.5|fi rdm 64K"
  "mpi_pp8|Open MPI 2 ranks ping-pong 8 B (pml ucx)|pml ob1, btl tcp,self|µs|<=0.8|MPI pingpong 8B"
  "mpi_bw1m|Open MPI 2 ranks bandwidth 1 MiB (pml ucx)|pml ob1, btl tcp,self|GB/s|>=1.5|MPI bw 1M"
  "mpi_ar8|Open MPI 8 ranks MPI_Allreduce 8 B (pml ucx)|pml ob1, btl tcp,self|µs|<=0.8|MPI allreduce 8B"
  "mpi_ar64k|Open MPI 8 ranks MPI_Allreduce 64 KiB (pml ucx)|pml ob1, btl tcp,self|µs|<=0.8|MPI allreduce 64K"
  "ev_send_lat|ib_send_lat -e 8 B, p50 (event mode)|qperf tcp_lat 8 B|µs|<=1.0|ib_send_lat -e"
  "ev_qperf|qperf -cm1 rc_lat 8 B (event mode)|qperf tcp_lat 8 B|µs|<=1.0|qperf rc_lat"
  "write_lat|ib_write_lat 8 B, p50|sockperf pp UDP spin 14 B, p50|µs|<=1.5|ib_write_lat"
  "send_lat|ib_send_lat 8 B, p50|sockperf pp UDP spin 14 B, p50|µs|<=1.25|ib_send_lat"
  "prot_auth_bw|ib_write_bw -R 64 KiB, wire auth|the same, wire off|GB/s|>=0.8|auth write_bw"
  "prot_enc_bw|ib_write_bw -R 64 KiB, wire encrypt|the same, wire off|GB/s|>=0.55|encrypt write_bw"
  "prot_auth_lat|ib_send_lat -R 8 B p50, wire auth|the same, wire off|µs|<=1.1|auth send_lat"
  "prot_enc_lat|ib_send_lat -R 8 B p50, wire encrypt|the same, wire off|µs|<=1.1|encrypt send_lat"
  "host_ucx_lat|one host: UCX tag_lat 8 B p50, rc_verbs on softrdma_lo (direct path)|UCX posix,cma|µs|<=1.5|1 host UCX tag_lat"
)
declare -A SV=() PV=()  # "GROUP|ID" -> softrdma value, peer value
NOTES=()
GROUPS_RUN=()  # "MTU placement"
GROUP=""       # the current one
GROUP_SLUG=""
declare -A GROUP_INFO=()  # "GROUP" -> c2c probe at its start

# note ID WHY: a failed measurement of the current group.
note() { NOTES+=("MTU ${GROUP/ /, }: $1: $2"); compat_log "FAIL $1: $2"; }

# ---- running one pair -----------------------------------------------------------------------------
# Where the server and the client run: namespace prefixes (empty on one host) and the placement.
NS_SRV=() NS_CLI=() SP=() CP=()

# spawn srv|cli LOG CMD...: CMD under the side's namespace, taskset and `timeout`; SPAWNED = its PID.
spawn() {
  local side=$1 log=$2
  shift 2
  local -a pre
  if [[ $side == srv ]]; then pre=("${NS_SRV[@]+"${NS_SRV[@]}"}" "${SP[@]+"${SP[@]}"}")
  else pre=("${NS_CLI[@]+"${NS_CLI[@]}"}" "${CP[@]+"${CP[@]}"}"); fi
  "${pre[@]}" timeout -k 5 "$T" "$@" >"$log" 2>&1 &
  SPAWNED=$!
}

# wait_ready tcp|udp PORT PID: a TCP listener, or any UDP socket (a RoCE rdma_cm server, sockperf),
# on PORT in the server's namespace; fails when PID exits first or after 30 s.
wait_ready() {
  local kind=$1 port=$2 pid=$3 hex i
  if [[ $kind == tcp ]]; then
    compat_wait_listen "$port" "$pid" "${NS_SRV[@]+"${NS_SRV[@]}"}"
    return
  fi
  hex=$(printf '%04X' "$port")
  for ((i = 0; i < 300; i++)); do
    "${NS_SRV[@]+"${NS_SRV[@]}"}" awk -v p=":$hex" 'NR>1 && substr($2, length($2)-4)==p { f=1 } END { exit !f }' \
      /proc/net/udp /proc/net/udp6 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    nap 0.1
  done
  return 1
}

# errline LOG...: the first line of the logs that says what went wrong.
errline() {
  grep -h -m1 -E "ERROR|[Ee]rror|Failed|failed|[Cc]ouldn't|[Uu]nable|[Ss]egmentation|[Aa]bort|refused|unreachable|timed out|[Ii]nvalid" \
    "$@" 2>/dev/null | head -n1 | tr -s ' \t' ' ' | cut -c1-240
}

# pair NAME KIND PORT KEEP SERVER... ::: CLIENT...: the server (namespace A), wait until it is ready
# (KIND tcp|udp on PORT), then the client (B). KEEP=1: the server serves until killed (qperf,
# sockperf). Sets CLOG / SLOG; returns 0 when both exited 0, else sets WHY.
pair() {
  local name=$1 kind=$2 port=$3 keep=$4 slug spid crc=0 src=0
  shift 4
  local -a srv=() cli=()
  while (($#)) && [[ $1 != ::: ]]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  slug=${name//[^A-Za-z0-9_.-]/_}
  SLOG=$WORK/$GROUP_SLUG.$slug.server.log
  CLOG=$WORK/$GROUP_SLUG.$slug.client.log
  WHY=""
  compat_log "$name"
  spawn srv "$SLOG" "${srv[@]}"
  spid=$SPAWNED
  if ! wait_ready "$kind" "$port" "$spid"; then
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    WHY="server never became ready ($kind port $port)"
    local e
    e=$(errline "$SLOG")
    [[ -n $e ]] && WHY+=": \"$e\""
    WHY+="; log $SLOG"
    return 1
  fi
  track "$spid"
  spawn cli "$CLOG" "${cli[@]}"
  track "$SPAWNED"
  wait "$SPAWNED" || crc=$?
  if ((keep)); then
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
  else
    ((crc == 0)) || kill "$spid" 2>/dev/null  # it may wait for a peer that is gone
    wait "$spid" || src=$?
    ((crc != 0 && src == 143)) && src=0        # killed by us just now
  fi
  ((crc == 0 && src == 0)) && return 0
  WHY="client exit $crc, server exit $src"
  ((crc == 124 || src == 124)) && WHY+=" (124: killed by timeout after ${T} s)"
  local e
  e=$(errline "$CLOG" "$SLOG")
  [[ -n $e ]] && WHY+=": \"$e\""
  WHY+="; logs $CLOG, $SLOG"
  return 1
}

# track PID: remembers the softrdma process under `timeout` PID (for the stats pages at teardown).
track() {
  local c
  nap 0.05
  for c in $(pgrep -P "$1" 2>/dev/null); do OUR_PIDS[$c]=1; done
}

# measured ID VALUE: a value parsed from CLOG; empty means failed (WHY or "no result" goes to notes).
# ours ID VALUE / peer ID VALUE.
ours() { SV[$GROUP|$1]=$2; }
peer() { PV[$GROUP|$1]=$2; }

# ---- the tools ----------------------------------------------------------------------------------------
# Each runs one pair and sets V (empty on failure, with a note under NOTE_ID).

# ucx WHO TEST SIZE ITERS: ucx_perftest; WHO: rc | ud | tcp (namespaces) | lo | shm (one host).
# Latency tests: the p50 (µs, one-way); bandwidth: the overall MB/s (2^20 B) in GB/s.
ucx() {
  local who=$1 test=$2 size=$3 n=$4 port
  local -a e=(env UCX_WARN_UNUSED_ENV_VARS=n) pre=()
  V=""
  command -v ucx_perftest >/dev/null || { WHY="ucx_perftest is not installed (ucx-utils)"; return 1; }
  case $who in
    rc) e+=(UCX_TLS=rc_verbs,ud_verbs "UCX_NET_DEVICES=$DEV:1"); pre=("$SOFTRDMA" run --) ;;
    ud) e+=(UCX_TLS=ud_verbs "UCX_NET_DEVICES=$DEV:1"); pre=("$SOFTRDMA" run --) ;;
    tcp) e+=(UCX_TLS=tcp "UCX_NET_DEVICES=$IFNAME") ;;
    lo) e+=(UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=softrdma_lo:1); pre=("$SOFTRDMA" run --) ;;
    shm) e+=(UCX_TLS=posix,cma) ;;
  esac
  port=$(next_port)
  pair "ucx $who $test $size" tcp "$port" 0 \
    "${pre[@]+"${pre[@]}"}" "${e[@]}" ucx_perftest -p "$port" ::: \
    "${pre[@]+"${pre[@]}"}" "${e[@]}" ucx_perftest "$HOST" -p "$port" -t "$test" -s "$size" -n "$n" -w $((n / 10 + 1)) ||
    return 1
  V=$(awk -v t="$test" '/^Final:/ { if (t ~ /lat$/) print $3; else printf "%.6f", $7 * 1048576 / 1e9 }' "$CLOG")
  num "$V" || { V=""; WHY="no \"Final:\" row in $CLOG"; return 1; }
}

# fab WHO SIZE ITERS lat|bw: fi_pingpong -e rdm, WHO verbs ("verbs;ofi_rxm" under softrdma) or tcp
# ("tcp;ofi_rxm"); lat: usec/xfer, bw: GB/s (its MB/sec is 1e6 B/s).
fab() {
  local who=$1 size=$2 n=$3 what=$4 port
  local -a pre=()
  V=""
  command -v fi_pingpong >/dev/null || { WHY="fi_pingpong is not installed (libfabric-bin)"; return 1; }
  [[ $who == verbs ]] && pre=("$SOFTRDMA" run --)
  port=$(next_port)
  pair "fi_pingpong $who;ofi_rxm $size" tcp "$port" 0 \
    "${pre[@]+"${pre[@]}"}" env FI_OFI_RXM_USE_SRX=1 fi_pingpong -p "$who;ofi_rxm" -e rdm -I "$n" -S "$size" -B "$port" ::: \
    "${pre[@]+"${pre[@]}"}" env FI_OFI_RXM_USE_SRX=1 fi_pingpong -p "$who;ofi_rxm" -e rdm -I "$n" -S "$size" -P "$port" "$HOST" ||
    return 1
  # "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec"
  V=$(awk -v w="$what" '$1 ~ /^[0-9]+[kmg]?$/ && $3 ~ /^=/ && NF >= 8 { if (w == "lat") print $7; else printf "%.6f", $6 / 1000; exit }' "$CLOG")
  num "$V" || { V=""; WHY="no result row in $CLOG"; return 1; }
}

# perftest TOOL ARGS...: softrdma perftest pair on the veth's device (TCP exchange), or with -R as
# the first argument over rdma_cm (a UDP port); latency tools: t_typical (µs), bandwidth tools:
# BW average (MiB/s) in GB/s. PT_ENV: words put before `softrdma run` (the wire protection).
perftest() {
  local tool=$1 port kind=tcp
  shift
  local -a dev=(-d "$DEV")
  if [[ ${1:-} == -R ]]; then kind=udp dev=(-R); shift; fi
  V=""
  command -v "$tool" >/dev/null || { WHY="$tool is not installed (perftest)"; return 1; }
  port=$(next_port)
  pair "${PT_TAG:-}$tool ${dev[*]} $*" "$kind" "$port" 0 \
    env "${PT_ENV[@]+"${PT_ENV[@]}"}" "$SOFTRDMA" run -- "$tool" "${dev[@]}" -F -p "$port" "$@" ::: \
    env "${PT_ENV[@]+"${PT_ENV[@]}"}" "$SOFTRDMA" run -- "$tool" "${dev[@]}" -F -p "$port" "$@" "$HOST" ||
    return 1
  local row
  row=$(awk '/#bytes/ { t=1; next } t && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+/ { print; exit }' "$CLOG")
  if [[ $tool == *_lat ]]; then V=$(awk '{ print $5 }' <<<"$row")
  else V=$(awk '{ printf "%.6f", $4 * 1048576 / 1e9 }' <<<"$row"); fi
  num "$V" || { V=""; WHY="no result row in $CLOG"; return 1; }
}
PT_ENV=() PT_TAG=""

# qperf_lat tcp|rc: qperf tcp_lat (plain qperf) or -cm1 rc_lat (both under softrdma), 8 B, mean µs.
qperf_lat() {
  local who=$1 port test=tcp_lat
  local -a pre=() cm=()
  V=""
  command -v qperf >/dev/null || { WHY="qperf is not installed"; return 1; }
  [[ $who == rc ]] && pre=("$SOFTRDMA" run --) cm=(-cm1) test=rc_lat
  port=$(next_port)
  pair "qperf $test" tcp "$port" 1 "${pre[@]+"${pre[@]}"}" qperf -lp "$port" ::: \
    "${pre[@]+"${pre[@]}"}" qperf "$HOST" -lp "$port" "${cm[@]+"${cm[@]}"}" -uu -t "$SECONDS_RUN" -m 8 "$test" ||
    return 1
  V=$(awk -v t="$test:" '$1 == t { s=1; next } s && $1 == "latency" && $2 == "=" { printf "%.4f", $3 / 1000; exit }' "$CLOG")
  num "$V" || { V=""; WHY="no latency in $CLOG"; return 1; }
}

# sockperf_pp: spinning UDP ping-pong, 14 B (its smallest), p50 µs one-way (as bench/netns.sh).
sockperf_pp() {
  local port
  V=""
  command -v sockperf >/dev/null || { WHY="sockperf is not installed"; return 1; }
  port=$(next_port)
  pair "sockperf pp udp spin" udp "$port" 1 sockperf sr -i "$HOST" -p "$port" --nonblocked ::: \
    sockperf pp -i "$HOST" -p "$port" -m 14 -t "$SECONDS_RUN" --nonblocked || return 1
  V=$(awk '/percentile 50.000/ { print $NF; exit }' "$CLOG")
  num "$V" || { V=""; WHY="no p50 in $CLOG"; return 1; }
}

# mpi WHO NP TESTS...: one Open MPI launch across the namespaces (NP/2 ranks in each), WHO ucx (pml
# ucx over softrdma) or tcp (pml ob1, btl tcp,self); sets MPIV[NAME.SIZE] from the "result" lines.
declare -A MPIV=()
mpi() {
  local who=$1 np=$2 half=$(($2 / 2)) rc=0 log hostfile agent
  shift 2
  MPIV=()
  [[ -n $MPI_BIN ]] || { WHY=$MPI_WHY; return 1; }
  log=$WORK/$GROUP_SLUG.mpi.$who.$np.log
  hostfile=$WORK/hostfile.$np
  agent=$WORK/netns-agent.sh
  printf '%s slots=%d\n%s slots=%d\n' "$ipA" "$half" "$ipB" "$half" >"$hostfile"
  # ssh stand-in (as tests/compat/mpi.sh): runs the command in the namespace (and UTS namespace:
  # one host name per "host") that owns the address, on that side's CPU when pinned.
  local cpuA="" cpuB=""
  [[ $PLACEMENT == pinned ]] && cpuA="taskset -c 0" cpuB="taskset -c 1"
  cat >"$agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case \$host in
  $ipA) ns=$nsA name=$hostA pin="$cpuA" ;;
  $ipB) ns=$nsB name=$hostB pin="$cpuB" ;;
  *) echo "netns-agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts \$pin /bin/sh -c 'hostname "\$1" && exec /bin/sh -c "\$2"' sh "\$name" "\$*"
EOF
  chmod +x "$agent"
  local -a mca=(--bind-to none --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include 10.77.0.0/24
    --mca orte_base_help_aggregate 0) x=() pre=()
  # 8 ranks on 2 CPUs: ranks that spin in MPI take the CPU from the ones that have work.
  ((np > 2)) && mca+=(--mca mpi_yield_when_idle 1)
  if [[ $who == ucx ]]; then
    # Debian's openmpi-mca-params.conf disables pml ucx: naming it turns it on.
    mca+=(--mca pml ucx --mca btl self --mca osc ^ucx --mca opal_common_ucx_devices any)
    x=(-x UCX_TLS=rc_verbs,ud_verbs -x "UCX_NET_DEVICES=$DEV:1" -x UCX_WARN_UNUSED_ENV_VARS=n -x "SOFTRDMA_DIRECT=$SOFTRDMA_DIRECT")
    pre=("$SOFTRDMA" run --)
  else
    mca+=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24)
  fi
  compat_log "mpi $who $np ranks: $*"
  # The launcher runs in namespace A (A's ranks are its own children), on CPU 0 when pinned.
  "${inA[@]}" unshare --uts "${SP[@]+"${SP[@]}"}" /bin/sh -c 'hostname "$0" && exec "$@"' "$hostA" \
    timeout -k 5 "$T" mpirun.openmpi --hostfile "$hostfile" -np "$np" "${mca[@]}" "${x[@]+"${x[@]}"}" \
    "${pre[@]+"${pre[@]}"}" "$MPI_BIN" "$@" >"$log" 2>&1 || rc=$?
  local name size v
  if ((rc == 0)); then
    while read -r _ name size v; do num "$v" && MPIV[$name.$size]=$v; done < <(grep '^result ' "$log")
    local t
    for t in "$@"; do
      t=${t%:*}
      [[ -n ${MPIV[${t/:/.}]:-} ]] || { WHY="no result line for ${t/:/ } in $log"; return 1; }
    done
    return 0
  fi
  # A launch that did not end well counts as failed, whatever it printed before.
  WHY="mpirun exit $rc"
  ((rc == 124)) && WHY+=" (killed by timeout after ${T} s)"
  local e
  e=$(grep -v ' WARN ' "$log" | errline /dev/stdin)
  [[ -n $e ]] && WHY+=": \"$e\""
  WHY+="; log $log"
  return 1
}

# mpi_pair ID_NAME_SIZE...: the values of one launch into SV (ucx) or PV (tcp); failures as notes.
# run_ours ID CMD... / run_peer ID CMD...: one measurement; its value, or a note.
run_ours() { local id=$1; shift; if "$@"; then ours "$id" "$V"; else ours "$id" ""; note "$id (softrdma)" "$WHY"; fi; }
run_peer() { local id=$1; shift; if "$@"; then peer "$id" "$V"; else peer "$id" ""; note "$id (peer)" "$WHY"; fi; }

# ---- one group: MTU x placement, in the namespaces ------------------------------------------------
run_group() {
  local mtu=$1
  PLACEMENT=$2
  GROUP="$mtu $PLACEMENT"
  GROUP_SLUG="mtu$mtu-$PLACEMENT"
  GROUPS_RUN+=("$GROUP")
  GROUP_INFO[$GROUP]=$(probe || echo ?)
  if [[ $PLACEMENT == pinned ]]; then SP=(taskset -c 0) CP=(taskset -c 1); else SP=() CP=(); fi
  NS_SRV=("${inA[@]}") NS_CLI=("${inB[@]}") HOST=$ipA DEV=$devA
  compat_log "== MTU $mtu, $PLACEMENT (c2c probe ${GROUP_INFO[$GROUP]} ns)"
  local v

  # -- UCX --
  run_ours ucx_tag_lat ucx rc tag_lat 8 "$LAT_ITERS"
  run_peer ucx_tag_lat ucx tcp tag_lat 8 "$LAT_ITERS"
  run_ours ucx_put_lat ucx rc ucp_put_lat 8 "$LAT_ITERS"
  run_peer ucx_put_lat ucx tcp ucp_put_lat 8 "$LAT_ITERS"
  run_ours ucx_tag_bw64k ucx rc tag_bw 65536 "$BW_ITERS"
  run_peer ucx_tag_bw64k ucx tcp tag_bw 65536 "$BW_ITERS"
  run_ours ucx_ud_bw64k ucx ud tag_bw 65536 $((BW_ITERS / 2))
  peer ucx_ud_bw64k "${PV[$GROUP|ucx_tag_bw64k]}"  # the same UCX tcp run, just before
  run_ours ucx_tag_bw1m ucx rc tag_bw 1048576 $((BW_ITERS / 10))
  run_peer ucx_tag_bw1m ucx tcp tag_bw 1048576 $((BW_ITERS / 10))
  # UCX tcp emulates put with active messages (~0.3 GB/s): fewer iterations keep it short.
  run_ours ucx_put_bw1m ucx rc ucp_put_bw 1048576 $((BW_ITERS / 20))
  run_peer ucx_put_bw1m ucx tcp ucp_put_bw 1048576 $((BW_ITERS / 20))

  # -- libfabric --
  run_ours fi_lat fab verbs 8 "$LAT_ITERS" lat
  run_peer fi_lat fab tcp 8 "$LAT_ITERS" lat
  run_ours fi_bw fab verbs 65536 $((BW_ITERS / 2)) bw
  run_peer fi_bw fab tcp 65536 $((BW_ITERS / 2)) bw

  # -- Open MPI --
  local who
  for who in ucx tcp; do
    local store=ours
    [[ $who == tcp ]] && store=peer
    mpi "$who" 2 "pingpong:8:$LAT_ITERS" "bandwidth:1048576:$MPI_BW_ROUNDS" || note "mpi 2 ranks ($who)" "$WHY"
    $store mpi_pp8 "${MPIV[pingpong.8]:-}"
    v=${MPIV[bandwidth.1048576]:-}
    $store mpi_bw1m "$([[ -n $v ]] && awk -v x="$v" 'BEGIN { printf "%.6f", x / 1000 }')"
    mpi "$who" 8 "allreduce:8:$MPI_AR_ITERS" "allreduce:65536:$((MPI_AR_ITERS / 4 > 5 ? MPI_AR_ITERS / 4 : 5))" ||
      note "mpi 8 ranks ($who)" "$WHY"
    $store mpi_ar8 "${MPIV[allreduce.8]:-}"
    $store mpi_ar64k "${MPIV[allreduce.65536]:-}"
  done

  # -- event mode, and its peer qperf tcp_lat --
  run_ours ev_send_lat perftest ib_send_lat -e -s 8 -n "$LAT_ITERS"
  run_ours ev_qperf qperf_lat rc
  run_peer ev_qperf qperf_lat tcp
  peer ev_send_lat "${PV[$GROUP|ev_qperf]}"

  # -- polled, against sockperf --
  run_ours write_lat perftest ib_write_lat -s 8 -n "$LAT_ITERS"
  run_ours send_lat perftest ib_send_lat -s 8 -n "$LAT_ITERS"
  run_peer write_lat sockperf_pp
  peer send_lat "${PV[$GROUP|write_lat]}"

  # -- the protected wire: plain, auth, encrypt, one after the other --
  local mode bw_off lat_off
  local -A PB=() PL=()
  for mode in off auth encrypt; do
    PT_ENV=()
    [[ $mode != off ]] && PT_ENV=("SOFTRDMA_WIRE_PROTECT=$mode" "SOFTRDMA_AUTH_KEY=$KEY")
    PT_TAG="wire $mode: "
    if perftest ib_write_bw -R -s 65536 -D "$SECONDS_RUN"; then PB[$mode]=$V; else PB[$mode]=""; note "wire $mode ib_write_bw -R" "$WHY"; fi
  done
  for mode in off auth encrypt; do
    PT_ENV=()
    [[ $mode != off ]] && PT_ENV=("SOFTRDMA_WIRE_PROTECT=$mode" "SOFTRDMA_AUTH_KEY=$KEY")
    PT_TAG="wire $mode: "
    if perftest ib_send_lat -R -s 8 -n "$LAT_ITERS"; then PL[$mode]=$V; else PL[$mode]=""; note "wire $mode ib_send_lat -R" "$WHY"; fi
  done
  PT_ENV=() PT_TAG=""
  bw_off=${PB[off]} lat_off=${PL[off]}
  ours prot_auth_bw "${PB[auth]}"; peer prot_auth_bw "$bw_off"
  ours prot_enc_bw "${PB[encrypt]}"; peer prot_enc_bw "$bw_off"
  ours prot_auth_lat "${PL[auth]}"; peer prot_auth_lat "$lat_off"
  ours prot_enc_lat "${PL[encrypt]}"; peer prot_enc_lat "$lat_off"
}

# ---- one host: UCX over softrdma_lo (direct path on, the default) against UCX posix,cma ------------
run_host() {
  NS_SRV=() NS_CLI=() HOST=127.0.0.1
  compat_log "== one host, $PLACEMENT"
  local saved=$SOFTRDMA_DIRECT
  unset SOFTRDMA_DIRECT
  run_ours host_ucx_lat ucx lo tag_lat 8 "$LAT_ITERS"
  run_peer host_ucx_lat ucx shm tag_lat 8 "$LAT_ITERS"
  export SOFTRDMA_DIRECT=$saved
}

# ---- the run ------------------------------------------------------------------------------------
# The packet path, as between two hosts (the direct path's registry is per namespace anyway).
export SOFTRDMA_DIRECT=${BENCH_DIRECT:-0}
first_mtu=1
for mtu in "${MTUS[@]}"; do
  export COMPAT_NETNS_MTU=$mtu
  compat_netns_setup  # exits 77 where namespaces cannot be made
  set_traps
  mapfile -t NS_INODES < <(stat -L -c %i "/run/netns/$nsA" "/run/netns/$nsB" 2>/dev/null)
  # UCX keeps 15 characters of a device name (UCT_MD_NAME_MAX) and softrdma names a device
  # softrdma_<interface>: both veth ends become "cxv", each in its own namespace, so one
  # UCX_NET_DEVICES (softrdma_cxv:1, or cxv for UCX tcp) serves both sides and every MPI rank.
  IFNAME=cxv
  for side in A B; do
    ns_var=ns$side veth_var=veth$side
    ip -n "${!ns_var}" link set "${!veth_var}" down
    ip -n "${!ns_var}" link set "${!veth_var}" name "$IFNAME"
    ip -n "${!ns_var}" link set "$IFNAME" up
  done
  for ((i = 0; i < 50; i++)); do
    ip -n "$nsA" link show "$IFNAME" | grep -q 'state UP' && ip -n "$nsB" link show "$IFNAME" | grep -q 'state UP' && break
    nap 0.1
  done
  devA=$(compat_device "$ipA" "${inA[@]}")
  devB=$(compat_device "$ipB" "${inB[@]}")
  hostA=cx-a-$tag hostB=cx-b-$tag
  compat_log "veths renamed $IFNAME: devices $devA (A), $devB (B)"
  for placement in "${PLACEMENTS[@]}"; do
    if [[ -z $devA || -z $devB || $devA != "$devB" ]]; then
      GROUP="$mtu $placement"
      GROUPS_RUN+=("$GROUP")
      note "setup" "no softrdma device on the veth in the namespaces (A: '${devA:-}', B: '${devB:-}')"
      continue
    fi
    run_group "$mtu" "$placement"
    ((first_mtu)) && run_host
  done
  first_mtu=0
  teardown
done
probe_end=$(probe)
elapsed=$(($(date +%s) - started))

# ---- raw numbers ------------------------------------------------------------------------------------
DAT=$OUT/consumers.dat
{
  printf '# bench/consumers.sh raw numbers, %s; "-" = failed or not run\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "# mtu placement measure softrdma peer unit ratio target met"
  for g in "${GROUPS_RUN[@]}"; do
    for m in "${MEASURES[@]}"; do
      IFS='|' read -r id _ _ unit target _ <<<"$m"
      s=${SV[$g|$id]:-} p=${PV[$g|$id]:-}
      [[ -z ${SV[$g|$id]+set} && -z ${PV[$g|$id]+set} ]] && continue
      r=$(ratio "$s" "$p")
      echo "$g $id ${s:--} ${p:--} ${unit// /} ${r:--} $target $(met "$r" "$target")"
    done
  done
} >"$DAT"

# ---- the plot ---------------------------------------------------------------------------------------
# Bars: ratio per measure, one per MTU/placement group, log scale; a black dash at each target.
plot_made=0
if command -v gnuplot >/dev/null; then
  gp=$OUT/consumers.gp
  term=pngcairo
  gnuplot -e 'set terminal' 2>&1 | grep -qw pngcairo || term=png
  ng=${#GROUPS_RUN[@]}
  nm=${#MEASURES[@]}
  lo=1 hi=1
  {
    echo "# bench/consumers.sh: ratio softrdma / peer per measure, with issue 27's targets"
    echo "set terminal $term noenhanced size 1400,720"
    echo "set output '$OUT/consumers.png'"
    printf 'set title "%s\\n%s"\n' "softrdma / peer (the same consumer over TCP, kernel TCP/UDP, or the unprotected wire), two namespaces over a veth, $(date -u '+%Y-%m-%d')" \
      "latency and time (<=): below the dash meets the target; bandwidth (>=): above it"
    echo "set logscale y"
    echo "set ylabel 'ratio softrdma / peer (log)'"
    echo "set grid ytics"
    echo "set key top center horizontal"
    echo "set style fill solid 0.8 border -1"
    echo "set xrange [-0.7:$((nm - 1)).7]"
    tics=()
    for ((k = 0; k < nm; k++)); do
      IFS='|' read -r _ _ _ _ target short <<<"${MEASURES[k]}"
      tics+=("\"$short ($(pretty_target "$target" | tr -d ' '))\" $k")
    done
    (IFS=,; echo "set xtics rotate by 35 right (${tics[*]})")
    echo "set bmargin 9"
    echo "set lmargin 16"
    colors=("#d62728" "#ff9896" "#1f77b4" "#aec7e8" "#2ca02c" "#98df8a")
    w=$(awk -v g="$ng" 'BEGIN { printf "%.4f", 0.8 / (g > 0 ? g : 1) }')
    plots=()
    for ((gi = 0; gi < ng; gi++)); do
      g=${GROUPS_RUN[gi]}
      echo "\$g$gi << EOD"
      for ((k = 0; k < nm; k++)); do
        IFS='|' read -r id _ _ _ _ _ <<<"${MEASURES[k]}"
        r=$(ratio "${SV[$g|$id]:-}" "${PV[$g|$id]:-}")
        num "$r" || continue
        xpos=$(awk -v k="$k" -v gi="$gi" -v g="$ng" -v w="$w" 'BEGIN { printf "%.4f", k + (gi - (g - 1) / 2) * w }')
        echo "$xpos $r"
        lo=$(awk -v a="$lo" -v b="$r" 'BEGIN { print (b < a ? b : a) }')
        hi=$(awk -v a="$hi" -v b="$r" 'BEGIN { print (b > a ? b : a) }')
      done
      echo "EOD"
      plots+=("\$g$gi using 1:2:(\$1-$w/2):(\$1+$w/2):(YLO):2 with boxxyerrorbars lc rgb '${colors[gi % ${#colors[@]}]}' title 'MTU ${g/ /, }'")
    done
    echo "\$targets << EOD"
    for ((k = 0; k < nm; k++)); do
      IFS='|' read -r _ _ _ _ target _ <<<"${MEASURES[k]}"
      echo "$k ${target:2}"
    done
    echo "EOD"
    ylo=$(awk -v a="$lo" 'BEGIN { printf "%.4f", (a < 0.5 ? a : 0.5) / 1.5 }')
    yhi=$(awk -v a="$hi" 'BEGIN { printf "%.4f", (a > 2 ? a : 2) * 4 }')  # room for the key
    echo "YLO = $ylo"
    echo "set yrange [$ylo:$yhi]"
    plots+=("\$targets using (\$1-0.45):2:(0.9):(0) with vectors nohead lw 3 lc rgb 'black' title 'target'")
    plots+=("1 with lines dt 2 lc rgb 'gray40' title 'ratio 1'")
    printf 'plot '
    for ((k = 0; k < ${#plots[@]}; k++)); do
      ((k)) && printf ', \\\n     '
      printf '%s' "${plots[k]}"
    done
    echo
  } >"$gp"
  if timeout 60 gnuplot "$gp" 2>"$WORK/gnuplot.log"; then
    plot_made=1
  else
    echo "bench: gnuplot failed: $(head -5 "$WORK/gnuplot.log")" >&2
  fi
else
  echo "bench: gnuplot missing (gnuplot-nox): no plot" >&2
fi

# ---- the table ----------------------------------------------------------------------------------
cell() {  # cell GROUP ID: "0.72 yes" for the summary
  local r
  if [[ -z ${SV[$1|$2]+set} && -z ${PV[$1|$2]+set} ]]; then echo "not run"; return; fi
  r=$(ratio "${SV[$1|$2]:-}" "${PV[$1|$2]:-}")
  [[ -n $r ]] || { echo fail; return; }
  if [[ $(met "$r" "$3") == yes ]]; then printf '%.2f ✓' "$r"; else printf '%.2f ✗' "$r"; fi
}
{
  echo "## softrdma under its consumers, between two network namespaces (bench/consumers.sh)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), kernel $(uname -r), $(nproc) CPUs, c2c probe CPU 0 <-> 1:" \
    "${probe_start:-?} ns at start, ${probe_end:-?} ns at end (near ~60, far ~330); bench/consumers.sh at" \
    "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?), softrdma from $SOFTRDMA_BIN; ${elapsed} s$([[ $QUICK == 1 ]] && echo ", QUICK mode")."
  echo
  echo "Server in namespace A, client in B, joined by a veth; pinned = server (A's MPI ranks) on CPU 0,"
  echo "client (B's ranks) on CPU 1. Ratio = softrdma / peer, each pair run right after the other:"
  echo "for latency and time (target ≤) lower is better, for bandwidth (target ≥) higher. Latency p50"
  echo "one-way, except qperf (mean), fi_pingpong (usec/xfer) and the MPI rows (median of 5 rounds);"
  echo "GB/s = 1e9 B/s. UCX over softrdma: UCX_TLS=rc_verbs,ud_verbs (ud_verbs only for wire-up;"
  echo "rc_verbs alone has no auxiliary transport), UCX_NET_DEVICES=the veth's device. MPI allreduce: 8"
  echo "ranks, 4 per namespace, 8 B and 64 KiB of int64 (mpi_yield_when_idle, both sides). Namespaces"
  echo "run with SOFTRDMA_DIRECT=$SOFTRDMA_DIRECT$([[ $SOFTRDMA_DIRECT == 0 ]] && echo " (the packet path, as between hosts)"); the one-host row with softrdma's default."
  echo "Runs: latency $LAT_ITERS iterations, 64 KiB bandwidth $BW_ITERS, perftest/qperf/sockperf -D/-t $SECONDS_RUN s."
  echo
  echo "Crypto ceiling: \`openssl speed -evp aes-128-gcm -bytes 8192 -seconds 1\` on one core (CPU 0):" \
    "${OPENSSL_GBS:-?} GB/s."
  echo
  echo "### Ratios against targets (issue 27)"
  echo
  hdr="| measure | target |"
  sep="|---|---|"
  for g in "${GROUPS_RUN[@]}"; do hdr+=" MTU ${g/ /, } |"; sep+="---:|"; done
  echo "$hdr"
  echo "$sep"
  for m in "${MEASURES[@]}"; do
    IFS='|' read -r id label _ _ target _ <<<"$m"
    line="| $label | $(pretty_target "$target") |"
    for g in "${GROUPS_RUN[@]}"; do line+=" $(cell "$g" "$id" "$target") |"; done
    echo "$line"
  done
  for g in "${GROUPS_RUN[@]}"; do
    echo
    echo "### MTU ${g% *}, ${g#* } (c2c probe ${GROUP_INFO[$g]:-?} ns)"
    echo
    echo "| measure | softrdma | peer | peer value | unit | ratio | target | met |"
    echo "|---|---:|---|---:|---|---:|---|---|"
    for m in "${MEASURES[@]}"; do
      IFS='|' read -r id label peername unit target _ <<<"$m"
      [[ -z ${SV[$g|$id]+set} && -z ${PV[$g|$id]+set} ]] && continue
      s=${SV[$g|$id]:-} p=${PV[$g|$id]:-}
      r=$(ratio "$s" "$p")
      rr=-
      [[ -n $r ]] && rr=$(printf '%.2f' "$r")
      echo "| $label | $(fmtnum "$s") | $peername | $(fmtnum "$p") | $unit | $rr | $(pretty_target "$target") | $(met "$r" "$target") |"
    done
  done
  echo
  if ((${#NOTES[@]})); then
    echo "Failures:"
    echo
    printf -- '- %s\n' "${NOTES[@]//|/\\|}"
    echo
  fi
  ((plot_made)) && echo "Plot: consumers.png (ratio per measure and group, log scale, targets as black dashes)."
} >"$OUT/consumers.md"
cat "$OUT/consumers.md" >&3
compat_log "table: $OUT/consumers.md, raw: $DAT$( ((plot_made)) && echo ", plot: $OUT/consumers.png"), logs: $WORK"
if [[ ${BENCH_DOCS:-0} == 1 ]]; then
  cp "$OUT/consumers.md" "$root/docs/performance-consumers-table.md"
  ((plot_made)) && cp "$OUT/consumers.png" "$root/docs/performance-consumers.png"
  compat_log "copied into docs/: performance-consumers-table.md$( ((plot_made)) && echo ", performance-consumers.png")"
fi
