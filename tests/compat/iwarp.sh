#!/usr/bin/env bash
# compat.iwarp.<part>: unmodified rdmacm-utils, perftest -R and qperf -cm1 binaries over softrdma's
# iWARP devices (`softrdma run --iwarp`: RDMA over TCP, connections only through rdma_cm), as on a
# host with the kernel's siw. Parts (one ctest entry each):
#   loopback  two processes on lo: on the intra-host direct path, then with SOFTRDMA_DIRECT=0 (FPDUs
#             on the TCP connection; only this half when the caller already set SOFTRDMA_DIRECT=0). As root it runs on the lo of a fresh network namespace, where
#             nftables counts what crossed lo: the direct path must leave the data off TCP, the other
#             mode must put it there. Without root it runs on the host's lo, uncounted.
#   netns     server in namespace A, client in B, joined by a veth (SOFTRDMA_DIRECT=0: FPDUs on TCP,
#             counted on the veth). Root only (77 without).
#   loss      as netns, with nftables in A dropping 5 % of the veth's TCP data and ACK segments, both
#             ways (not SYN/FIN/RST: connection setup is not what is tested); rping with 64 KiB pings
#             whose every byte is checked on both sides (once more with SOFTRDMA_MPA_CRC=1), and
#             perftest runs that must still complete; the drop counter must show drops. Root only.
# Each case asserts exit codes and what the program prints; nothing asserts a time.
#
# IWARP_COMPAT_TRANSPORT=roce runs the same cases over the RoCE devices (no --iwarp, rdma_cm ports
# are UDP, the loss rules drop UDP): a check of this script against a transport known to work.
# IWARP_LOSS_PCT (5), IWARP_LOSS_PINGS (100): the loss part's drop rate and 64 KiB pings.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

part=${1:?usage: iwarp.sh loopback|netns|loss}
TRANSPORT=${IWARP_COMPAT_TRANSPORT:-iwarp}
# Every run here takes seconds; a hang must not cost the default two minutes per process.
COMPAT_TIMEOUT=${IWARP_COMPAT_TIMEOUT:-30}
# After this many failed cases in a row a suite stops (one FAIL says so), so a transport that does
# not work fails in a minute or two, not after every case's timeout.
MAX_FAILS_IN_ROW=4
FAILS_IN_ROW=0
LOSS_PCT=${IWARP_LOSS_PCT:-5}
LOSS_PINGS=${IWARP_LOSS_PINGS:-100}
case $TRANSPORT in
  iwarp) RUN=(run --iwarp --) PROTO=tcp DEVPREFIX=softrdma_iw_ WANT_TRANSPORT='iWARP (1)' ;;
  roce) RUN=(run --) PROTO=udp DEVPREFIX=softrdma_ WANT_TRANSPORT='InfiniBand (0)' ;;
  *) echo "IWARP_COMPAT_TRANSPORT must be iwarp or roce" >&2; exit 2 ;;
esac
export SOFTRDMA_CM_TIMEOUT_MS=${SOFTRDMA_CM_TIMEOUT_MS:-200}  # RoCE CM retries (roce mode only)

SP=() CP=()  # `ip netns exec X` of the server and client side (empty: this namespace)
ENVV=()      # VAR=VALUE for both sides (SOFTRDMA_DIRECT)
NFT=()       # nft in the namespace that counts the suite's link, empty: no counters
WHERE=""     # the suite's name, first word of every case

# ---- ports ---------------------------------------------------------------------------------------
# A port free for TCP and UDP alike: an iWARP rdma_cm port is a TCP listener, a RoCE one a UDP
# socket, and other softrdma processes hold ephemeral UDP ports.
udp_bound() { # PORT PREFIX...
  local hex
  hex=$(printf '%04X' "$1")
  shift
  "$@" awk -v p=":$hex" 'NR>1 && substr($2, length($2)-4)==p { f=1 } END { exit !f }' /proc/net/udp /proc/net/udp6 2>/dev/null
}
cm_free_port() {
  local port
  while :; do
    port=$(compat_free_port)
    udp_bound "$port" "${SP[@]+"${SP[@]}"}" || { echo "$port"; return; }
  done
}
tcp_listening() { # PORT PREFIX...
  local hex
  hex=$(printf '%04X' "$1")
  shift
  "$@" awk -v p=":$hex" 'NR>1 && $4=="0A" && substr($2, length($2)-4)==p { f=1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
# cm_wait PORT PID: the server's rdma_cm id listens on PORT (TCP LISTEN for iWARP, UDP for RoCE),
# within 10 s (it takes milliseconds). Sets PAIR_WHY when not.
cm_wait() {
  local port=$1 pid=$2 i
  local -a sp=("${SP[@]+"${SP[@]}"}")
  for ((i = 0; i < 100; i++)); do
    if [[ $TRANSPORT == iwarp ]]; then tcp_listening "$port" "${sp[@]}" && return 0
    else udp_bound "$port" "${sp[@]}" && return 0; fi
    kill -0 "$pid" 2>/dev/null || { PAIR_WHY="server exited before its rdma_cm port $port was open"; return 1; }
    sleep 0.1
  done
  PAIR_WHY="no rdma_cm listener on port $port after 10 s"
  if [[ $TRANSPORT == iwarp ]] && udp_bound "$port" "${sp[@]}"; then
    PAIR_WHY+=" (a UDP socket holds the port: RoCE's CM, not a TCP listener)"
  fi
  return 1
}

# ---- link counters (nftables) -------------------------------------------------------------------
# nft_setup IFNAME [LOSS_PCT]: a table in the suite's namespace counting the bytes of TCP and UDP that
# leave or enter IFNAME; with LOSS_PCT, that share of PROTO's segments is dropped both ways
# (counter "dropped"). NFT must be set.
nft_setup() {
  local ifn=$1 pct=${2:-} loss="" flags=""
  if [[ -n $pct ]]; then
    [[ $PROTO == tcp ]] && flags="tcp flags & (fin|syn|rst) == 0"
    loss="
  chain lossin { type filter hook input priority 10; iifname \"$ifn\" meta l4proto $PROTO $flags numgen random mod 100 < $pct counter name dropped drop; }
  chain lossout { type filter hook output priority 10; oifname \"$ifn\" meta l4proto $PROTO $flags numgen random mod 100 < $pct counter name dropped drop; }"
  fi
  "${NFT[@]}" -f - <<EOF
table inet softrdma_iwarp {
  counter tcp_bytes {}
  counter udp_bytes {}
  counter dropped {}
  chain cin { type filter hook input priority 0; iifname "$ifn" meta l4proto tcp counter name tcp_bytes; iifname "$ifn" meta l4proto udp counter name udp_bytes; }
  chain cout { type filter hook output priority 0; oifname "$ifn" meta l4proto tcp counter name tcp_bytes; oifname "$ifn" meta l4proto udp counter name udp_bytes; }$loss
}
EOF
}
# On lo a packet passes output and input: both count it. On a veth each direction passes one of them.
nft_reset() { ((${#NFT[@]})) && "${NFT[@]}" reset counters table inet softrdma_iwarp >/dev/null; return 0; }
nft_read() { # COUNTER FIELD(packets|bytes)
  "${NFT[@]}" list counter inet softrdma_iwarp "$1" | awk -v f="$2" '{ for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }'
}

# ---- one server/client pair ----------------------------------------------------------------------
# pair NAME PORT WAIT: SRV and CLI (arrays) under `softrdma run [--iwarp]`, each with its stdout in
# NAME.{server,client}.log and its stderr in .err (rping's two streams interleave mid-line in one
# file). WAIT: cm (the rdma_cm port PORT) or tcp (a plain TCP listener on PORT, qperf's). KEEP=1:
# the server serves until killed (qperf), so it is killed after the client. Both must exit 0.
pair() {
  local name=$1 port=$2 how=$3 slug spid crc=0 src=0 ok
  slug=${name//[^A-Za-z0-9_.-]/_}
  PAIR_SRV_LOG=$COMPAT_LOG_DIR/$slug.server.log
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/$slug.client.log
  PAIR_WHY=""
  local -a e=(env "${ENVV[@]+"${ENVV[@]}"}")
  compat_log "$name: server: ${SRV[*]}"
  "${SP[@]+"${SP[@]}"}" "${e[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" "${RUN[@]}" "${SRV[@]}" \
    >"$PAIR_SRV_LOG" 2>"${PAIR_SRV_LOG%.log}.err" &
  spid=$!
  if [[ $how == cm ]]; then cm_wait "$port" "$spid" && ok=1 || ok=0
  else compat_wait_listen "$port" "$spid" "${SP[@]+"${SP[@]}"}" && ok=1 || ok=0; fi
  if ((!ok)); then
    [[ -n $PAIR_WHY ]] || PAIR_WHY="server never listened on TCP port $port"
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    return 1
  fi
  compat_log "$name: client: ${CLI[*]}"
  "${CP[@]+"${CP[@]}"}" "${e[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" "${RUN[@]}" "${CLI[@]}" \
    >"$PAIR_CLI_LOG" 2>"${PAIR_CLI_LOG%.log}.err" || crc=$?
  if [[ ${KEEP:-0} == 1 ]]; then
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
  else
    wait "$spid" || src=$?
  fi
  if ((crc != 0 || src != 0)); then
    PAIR_WHY="exit codes: server $src, client $crc"
    ((crc == 124 || src == 124)) && PAIR_WHY+=" (124: killed by timeout after ${COMPAT_TIMEOUT}s)"
    return 1
  fi
  return 0
}

# result NAME OK [WHY]: compat_result; a failure shows the ends of both sides' stdout and stderr,
# cut to 300 columns (rping -v prints each 64 KiB ping on one line).
result() {
  if [[ $2 != 1 ]]; then
    local f
    for f in "$PAIR_SRV_LOG" "${PAIR_SRV_LOG%.log}.err" "$PAIR_CLI_LOG" "${PAIR_CLI_LOG%.log}.err"; do
      [[ -s $f ]] || continue
      echo "----- $(basename "$f") (last 20 lines) -----"
      tail -n 20 "$f" | cut -c1-300
    done
  fi
  PAIR_SRV_LOG=/dev/null PAIR_CLI_LOG=/dev/null compat_result "$@"
  if [[ $2 == 1 ]]; then FAILS_IN_ROW=0; else FAILS_IN_ROW=$((FAILS_IN_ROW + 1)); fi
}

# go: 0 while the suite may go on; counts the cases it stops.
NOT_RUN=0
go() {
  ((FAILS_IN_ROW < MAX_FAILS_IN_ROW)) && return 0
  NOT_RUN=$((NOT_RUN + 1))
  return 1
}

# ---- the checks of what the programs print ------------------------------------------------------
# rping_check LOG PREFIX COUNT SIZE: "GOOD BAD": pings 0..COUNT-1 that LOG shows once each, exactly
# as rping fills them ("rdma-ping-N: " then letters from 'A'+N%58 on, cycling 'A'..'z', SIZE-1 bytes
# in all), and lines with the prefix that are not that.
rping_check() {
  awk -v pre="$2" -v count="$3" -v size="$4" '
    BEGIN {
      for (i = 65; i <= 122; i++) alpha = alpha sprintf("%c", i)
      rep = alpha
      while (length(rep) < size + 60) rep = rep alpha
    }
    index($0, pre) == 1 {
      s = substr($0, length(pre) + 1)
      if (!match(s, /^rdma-ping-[0-9]+: /)) { bad++; next }
      n = substr(s, 11, RLENGTH - 12) + 0
      want = substr(s, 1, RLENGTH) substr(rep, n % 58 + 1, size - 1 - RLENGTH)
      if (s == want && n < count && !(n in seen)) { seen[n] = 1; good++ } else bad++
    }
    END { print good + 0, bad + 0 }' "$1"
}

# rping_case NAME COUNT SIZE: rping -v -V; both sides must print every ping, byte for byte (the
# server what it READ from the client, the client what the server WROTE back), and the client's -V
# compares the two buffers itself.
rping_case() {
  local name=$1 count=$2 size=$3 port g b why=""
  port=$(cm_free_port)
  local -a sz=()
  ((size != 64)) && sz=(-S "$size")
  SRV=(rping -s -a "$SRV_IP" -p "$port" -v -V "${sz[@]+"${sz[@]}"}" -C "$count")
  CLI=(rping -c -a "$SRV_IP" -p "$port" -v -V "${sz[@]+"${sz[@]}"}" -C "$count")
  if ! pair "$name" "$port" cm; then result "$name" 0; return 1; fi
  read -r g b < <(rping_check "$PAIR_SRV_LOG" "server ping data: " "$count" "$size")
  ((g == count && b == 0)) || why="server printed $g of $count pings as sent ($b wrong lines)"
  read -r g b < <(rping_check "$PAIR_CLI_LOG" "ping data: " "$count" "$size")
  ((g == count && b == 0)) || why+="${why:+; }client printed $g of $count pings as sent ($b wrong lines)"
  grep -q 'data mismatch' "${PAIR_CLI_LOG%.log}.err" && why+="${why:+; }client: data mismatch"
  if [[ -z $why ]]; then result "$name" 1; return 0; fi
  result "$name" 0 "$why"
  return 1
}

# perftest_case TOOL ARGS...: TOOL -R (rdma_cm) ARGS; the client must print its result table.
perftest_case() {
  local tool=$1 port name
  shift
  name="$WHERE $tool -R${*:+ $*}"
  port=$(cm_free_port)
  SRV=("$tool" -R -F -p "$port" "$@")
  CLI=("$tool" -R -F -p "$port" "$@" "$SRV_IP")
  if pair "$name" "$port" cm; then
    if (($(compat_perftest_rows "$PAIR_CLI_LOG") >= 1)); then result "$name" 1; return 0; fi
    result "$name" 0 "no result table"
  else
    result "$name" 0
  fi
  return 1
}

# traffic_case BYTES DIRECT TOOL ARGS...: a perftest case that moves BYTES of payload, with the link
# counted: on the direct path (DIRECT=1) less than 1 MiB of it may cross the link (rdma_cm's TCP
# connection, MPA and perftest's exchange); otherwise at least BYTES must cross it as PROTO.
traffic_case() {
  local bytes=$1 direct=$2 t u name
  shift 2
  if ((${#NFT[@]} == 0)); then perftest_case "$@" || true; return; fi
  nft_reset
  perftest_case "$@" || return 0
  t=$(nft_read tcp_bytes bytes) u=$(nft_read udp_bytes bytes)
  compat_log "$WHERE $1: $t TCP and $u UDP bytes on the link for $bytes bytes of payload"
  name="$WHERE $1 -R: the data took the $( ((direct)) && echo "direct path" || echo "$PROTO link")"
  if ((direct)); then
    if ((t + u < 1048576)); then result "$name" 1
    else result "$name" 0 "$t TCP + $u UDP bytes crossed the link for $bytes bytes of payload"; fi
  else
    local got=$t
    [[ $PROTO == udp ]] && got=$u
    if ((got >= bytes)); then result "$name" 1
    else result "$name" 0 "$got $PROTO bytes on the link ($t TCP, $u UDP) for $bytes bytes of payload"; fi
  fi
}

# qperf_case: rc_bw rc_lat rc_rdma_read_bw (and, on RoCE, rc_rdma_write_bw), one qperf client
# each against one qperf server, one rdma_cm connection per test; each must print its figure.
# Debian's qperf 0.4.11 server sends its rdma_cm port to the client before it calls rdma_listen (strace:
# the port's write, then listen(2); upstream qperf has since moved rdma_listen first). RoCE's CM
# resends a REQ that came too early; on iWARP the client's TCP SYN can meet no listener yet and get a
# RST, so rdma_connect ends REJECTED ("unexpected event from RDMA CM: Event rejected"), as it would
# over siw. Such a test is run again, up to 3 times; any other failure counts at once.
# qperf's rc_rdma_write_bw (and rc_rdma_write_lat) post RDMA WRITE with immediate data, which iWARP
# does not have: siw's post_send refuses the opcode (EINVAL), and so do we. On iWARP that test must
# fail exactly so.
qperf_case() {
  local port name="$WHERE qperf -cm1" t try spid ok why="" retries=0 crc
  local -a tests=(rc_bw rc_lat rc_rdma_read_bw)
  [[ $TRANSPORT == roce ]] && tests+=(rc_rdma_write_bw)
  [[ $TRANSPORT == iwarp ]] && tests+=(rc_rdma_write_bw:refused)
  local -a e=(env "${ENVV[@]+"${ENVV[@]}"}")
  port=$(cm_free_port)
  PAIR_SRV_LOG=$COMPAT_LOG_DIR/${WHERE// /_}_qperf.server.log
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/${WHERE// /_}_qperf.client.log
  : >"$PAIR_CLI_LOG"
  compat_log "$name: server: qperf -lp $port"
  "${SP[@]+"${SP[@]}"}" "${e[@]}" timeout -k 5 $((COMPAT_TIMEOUT * 4)) "$SOFTRDMA" "${RUN[@]}" qperf -lp "$port" \
    >"$PAIR_SRV_LOG" 2>"${PAIR_SRV_LOG%.log}.err" &
  spid=$!
  if ! compat_wait_listen "$port" "$spid" "${SP[@]+"${SP[@]}"}"; then
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    result "$name" 0 "qperf server never listened on TCP port $port"
    return
  fi
  local out=$COMPAT_LOG_DIR/${WHERE// /_}_qperf.one.log
  for t in "${tests[@]}"; do
    for ((try = 1; try <= 3; try++)); do
      compat_log "$name: client: qperf -lp $port -cm1 $SRV_IP -t 1 ${t%:*} (try $try)"
      crc=0
      "${CP[@]+"${CP[@]}"}" "${e[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" "${RUN[@]}" \
        qperf -lp "$port" -cm1 "$SRV_IP" -t 1 "${t%:*}" >"$out" 2>&1 || crc=$?
      cat "$out" >>"$PAIR_CLI_LOG"
      ((crc != 0)) && grep -q 'unexpected event from RDMA CM: Event rejected' "$out" || break
      retries=$((retries + 1))
    done
    if [[ $t == *:refused ]]; then
      if ((crc != 0)) && grep -q 'failed to post rdma write with immediate' "$out"; then
        result "$name ${t%:*} refused (WRITE with immediate, as on siw)" 1
      else
        result "$name ${t%:*} refused (WRITE with immediate, as on siw)" 0 \
          "client exit $crc, not \"failed to post rdma write with immediate\""
      fi
      continue
    fi
    # The test prints "NAME:" and its figure ("bw = X GB/sec", "latency = X us") under it.
    ok=0
    ((crc == 0)) && awk -v t="$t:" '$1 == t { s=1; next } s && /^ +(latency|bw) += +[0-9.]+ / { f=1 } END { exit !f }' "$out" && ok=1
    ((ok)) || why+="${why:+; }$t: client exit $crc$( ((try > 3)) && echo ", rejected 3 times")"
  done
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  ((retries)) && compat_log "$name: $retries connection(s) rejected and run again (qperf's port-before-listen race)"
  local -a plain=()
  for t in "${tests[@]}"; do [[ $t == *:refused ]] || plain+=("$t"); done
  if [[ -z $why ]]; then result "$name ${plain[*]}" 1; else result "$name ${plain[*]}" 0 "$why"; fi
}

ucmatose_case() {
  local port name="$WHERE ucmatose -c 4 -C 20"
  port=$(cm_free_port)
  # The server listens on the wildcard address.
  SRV=(ucmatose -p "$port" -c 4 -C 20)
  CLI=(ucmatose -s "$SRV_IP" -p "$port" -c 4 -C 20)
  if pair "$name" "$port" cm; then
    if grep -q 'return status 0' "$PAIR_CLI_LOG" && grep -q 'return status 0' "$PAIR_SRV_LOG" &&
      grep -q 'data transfers complete' "$PAIR_CLI_LOG"; then
      result "$name" 1
    else
      result "$name" 0 "no \"data transfers complete\" and \"return status 0\" on both sides"
    fi
  else
    result "$name" 0
  fi
}

# preflight DEVICE [PREFIX...]: `softrdma run` shows DEVICE (in the namespace of PREFIX), with the
# transport this run is about. Everything else would run on the wrong devices (or not at all): stop.
preflight() {
  local dev=$1 out
  shift
  out=$("$@" timeout 30 "$SOFTRDMA" "${RUN[@]}" ibv_devinfo -v -d "$dev" 2>&1) || true
  if grep -q "hca_id:[[:space:]]*$dev\$" <<<"$out" && grep -qF "transport:			$WANT_TRANSPORT" <<<"$out" &&
    grep -q 'link_layer:[[:space:]]*Ethernet' <<<"$out"; then
    compat_result "$WHERE: $dev has transport $WANT_TRANSPORT" 1
    return 0
  fi
  compat_result "$WHERE: $dev has transport $WANT_TRANSPORT" 0 \
    "\`softrdma ${RUN[*]} ibv_devinfo -v -d $dev\` says: $(head -c 600 <<<"$out" | tr '\n\t' '  ' | tr -s ' ')"
  compat_log "no $TRANSPORT device: the other cases of $WHERE are not run"
  return 1
}

# suite: every program once between SP and CP, the server at SRV_IP. DIRECT: what traffic_case
# expects of the data's path.
suite() {
  local direct=$1
  FAILS_IN_ROW=0 NOT_RUN=0
  go && { rping_case "$WHERE rping -v -V -C 20" 20 64 || true; }
  go && traffic_case $((500 * 65536)) "$direct" ib_write_bw -s 65536 -n 500
  go && traffic_case $((500 * 65536)) "$direct" ib_read_bw -s 65536 -n 500
  go && { perftest_case ib_send_bw -n 500 || true; }
  go && { perftest_case ib_write_lat -n 500 || true; }
  go && { perftest_case ib_read_lat -n 500 || true; }
  go && { perftest_case ib_send_lat -n 500 || true; }
  go && qperf_case
  go && ucmatose_case
  suite_end
}
suite_end() {
  if ((NOT_RUN)); then
    PAIR_SRV_LOG=/dev/null PAIR_CLI_LOG=/dev/null
    compat_result "$WHERE: $NOT_RUN more cases" 0 "not run after $MAX_FAILS_IN_ROW failures in a row"
  fi
  return 0
}

# ---- the parts -----------------------------------------------------------------------------------
have_netns() { [[ $(id -u) == 0 ]] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1; }
need_nft() {
  if ! command -v nft >/dev/null; then
    echo "FAIL: nft is missing (Debian package nftables)" >&2
    exit 1
  fi
}

run_loopback() {
  SRV_IP=127.0.0.1
  if have_netns; then
    need_nft
    ns=softrdma-iwl-$$$RANDOM inode=""  # global: the trap runs after this function returned
    cleanup_lo() {
      ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
      [[ -n $inode ]] && rm -f "/dev/shm/softrdma-registry-$inode"-u*
      return 0
    }
    trap cleanup_lo EXIT INT TERM
    ip netns add "$ns"
    inode=$(stat -L -c %i "/run/netns/$ns")
    ip -n "$ns" link set lo up
    SP=(ip netns exec "$ns") CP=(ip netns exec "$ns") NFT=(ip netns exec "$ns" nft)
    nft_setup lo
    compat_log "loopback in namespace $ns (its lo counted by nftables)"
  else
    compat_log "loopback on this host's lo (not root: nothing counts the link)"
  fi
  WHERE="loopback"
  preflight "${DEVPREFIX}lo" "${SP[@]+"${SP[@]}"}" || return 0
  # A caller's SOFTRDMA_DIRECT=0 (tools/test.sh runs compat so once more) leaves only the half
  # without the direct path.
  if [[ ${SOFTRDMA_DIRECT:-1} == 0 ]]; then
    compat_log "SOFTRDMA_DIRECT=0 in the environment: the direct-path half is not run"
  else
    WHERE="loopback direct"
    ENVV=(SOFTRDMA_DIRECT=1)
    suite 1
  fi
  WHERE="loopback DIRECT=0"
  ENVV=(SOFTRDMA_DIRECT=0)
  suite 0
}

netns_common() { # MTU tweak, devices, counters, direct path off
  compat_netns_setup  # nsA nsB ipA ipB vethA vethB inA inB; exits 77 without root/netns
  need_nft
  local -a inodes
  mapfile -t inodes < <(stat -L -c %i "/run/netns/$nsA" "/run/netns/$nsB")
  # compat's cleanup, then the namespaces' QPN registries.
  trap 'cleanup; for i in '"${inodes[*]}"'; do rm -f /dev/shm/softrdma-registry-$i-u*; done' EXIT INT TERM
  SP=("${inA[@]}") CP=("${inB[@]}") NFT=("${inA[@]}" nft)
  SRV_IP=$ipA
  # Two namespaces stand for two hosts: the data goes over the veth (FPDUs on TCP for iWARP).
  ENVV=(SOFTRDMA_DIRECT=0)
}

run_netns() {
  netns_common
  nft_setup "$vethA"
  WHERE="netns"
  preflight "${DEVPREFIX}$vethA" "${inA[@]}" || return 0
  preflight "${DEVPREFIX}$vethB" "${inB[@]}" || return 0
  suite 0
}

run_loss() {
  netns_common
  # TCP's recovery at 5 % takes its time (retransmission timers): more than the other parts' cases.
  COMPAT_TIMEOUT=${IWARP_COMPAT_TIMEOUT:-60}
  # MSS-sized segments on the veth (no GSO super-packets), so a drop is one segment as on a wire.
  ip -n "$nsA" link set "$vethA" gso_max_segs 1 2>/dev/null || true
  ip -n "$nsB" link set "$vethB" gso_max_segs 1 2>/dev/null || true
  nft_setup "$vethA" "$LOSS_PCT"
  WHERE="loss"
  preflight "${DEVPREFIX}$vethA" "${inA[@]}" || return 0
  preflight "${DEVPREFIX}$vethB" "${inB[@]}" || return 0
  local d
  nft_reset
  rping_case "loss $LOSS_PCT% rping -v -V -S 65535 -C $LOSS_PINGS" "$LOSS_PINGS" 65535 || true
  d=$(nft_read dropped packets)
  if ((d > 0)); then compat_result "loss: nftables dropped $PROTO segments during the rping run" 1
  else compat_result "loss: nftables dropped $PROTO segments during the rping run" 0 "counter says $d"; fi
  compat_log "loss: $d $PROTO segments dropped, $(nft_read "${PROTO}_bytes" bytes) $PROTO bytes on $vethA"
  if [[ $TRANSPORT == iwarp ]]; then
    # With MPA CRCs (requested by both sides): every FPDU checked at the receiver too.
    ENVV=(SOFTRDMA_DIRECT=0 SOFTRDMA_MPA_CRC=1)
    rping_case "loss $LOSS_PCT% rping -S 65535 -C 30, SOFTRDMA_MPA_CRC=1" 30 65535 || true
    ENVV=(SOFTRDMA_DIRECT=0)
  fi
  nft_reset
  perftest_case ib_write_bw -s 65536 -n 300 || true
  perftest_case ib_read_bw -s 65536 -n 300 || true
  compat_log "loss: $(nft_read dropped packets) $PROTO segments dropped during the perftest runs"
}

case $part in
  loopback) run_loopback ;;
  netns) run_netns ;;
  loss) run_loss ;;
  *) echo "usage: iwarp.sh loopback|netns|loss" >&2; exit 2 ;;
esac
compat_finish
