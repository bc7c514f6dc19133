#!/usr/bin/env bash
# compat.mpi: Debian's Open MPI (and MPICH where it works) run tests/compat/mpi/mpi_check.c, this
# project's own checked ping-pong, bandwidth and allreduce, with 2 and 8 ranks split over two
# network namespaces ("hosts"), every rank under `softrdma run`:
#   ompi.tcp   pml ob1 + btl tcp (the baseline; no RDMA)
#   ompi.ucx   pml ucx, UCX_TLS=rc_verbs,ud_verbs (no tcp, no shared memory)
#   ompi.ofi_rxm  pml cm + mtl ofi, FI_PROVIDER="verbs;ofi_rxm" (RDM over verbs FI_EP_MSG, RC)
#   ompi.ofi_rxd  pml cm + mtl ofi, FI_PROVIDER="verbs;ofi_rxd" (RDM over verbs FI_EP_DGRAM, UD)
#   ompi.btlofi_rxm, ompi.btlofi_rxd  pml ob1 + btl ofi over the same (not run by default: btl ofi
#              opens no module over verbs, so the ranks cannot reach each other)
#   mpich.ucx  MPICH ch4:ucx (Debian builds MPICH 4.0.2 with ucx only), UCX_TLS as ompi.ucx
# A case passes when the launcher exits 0, rank 0 printed "mpi_check: PASS ranks=N netns=2" and
# its result rows; the RDMA cases also need softrdma's own counters to show the traffic: ranks 0
# and N-1 (one in each namespace) each moved at least MPI_MIN_MIB MiB as packets, and for UCX its
# log names only rc_verbs/ud_verbs lanes. A first case proves that mpi_check catches a corrupted
# message.
#
# Usage: mpi.sh [CASE...]   cases as above, or NAME.NP (e.g. ompi.ucx.8); default all, 2 and 8 ranks
# Environment (besides compat_lib.sh's):
#   MPI_ITERS        ping-pong iterations per size (default 20)
#   MPI_MAX_SIZE     largest message (default 1048576)
#   MPI_MIN_MIB      packet MiB each cross-namespace rank must have moved (default 16)
#   MPI_LIB_DIR      a softrdma lib directory to run the ranks with (SOFTRDMA_LIB_DIR of softrdma run)
#   MPI_RANK_WRAP    words put before each rank's program, e.g. "gdb -q -batch -ex run -ex bt --args"
#
# The program is built here with each MPI's own mpicc, into the log directory: Open MPI and MPICH
# have different ABIs, so no one binary serves both, and the build needs no MPI at configure time.
set -euo pipefail
# A launch takes seconds; ten of them under ctest's 600 s even when every one hangs.
COMPAT_TIMEOUT=${COMPAT_TIMEOUT:-50}
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

MPI_ITERS=${MPI_ITERS:-20}
MPI_MAX_SIZE=${MPI_MAX_SIZE:-1048576}
MPI_MIN_MIB=${MPI_MIN_MIB:-16}
[[ -n ${MPI_LIB_DIR:-} ]] && export SOFTRDMA_LIB_DIR=$MPI_LIB_DIR
src=$(compat_repo_root)/tests/compat/mpi/mpi_check.c

if ! command -v mpirun.openmpi >/dev/null || ! command -v mpicc.openmpi >/dev/null; then
  echo "SKIP: Open MPI (openmpi-bin, libopenmpi-dev) is not installed"
  exit 77
fi
# Which cases run.
cases=()
if (($#)); then
  for c in "$@"; do
    if [[ $c =~ \.[0-9]+$ ]]; then cases+=("$c"); else cases+=("$c.2" "$c.8"); fi
  done
else
  for c in ompi.tcp ompi.ucx ompi.ofi_rxm ompi.ofi_rxd mpich.ucx; do cases+=("$c.2" "$c.8"); done
fi

bindir=$COMPAT_LOG_DIR/bin
mkdir -p "$bindir"
compat_log "building mpi_check with mpicc.openmpi"
mpicc.openmpi -O2 -Wall -Wextra -Werror -o "$bindir/mpi_check.openmpi" "$src"
have_mpich=0
if command -v mpicc.mpich >/dev/null && command -v mpiexec.hydra >/dev/null; then
  compat_log "building mpi_check with mpicc.mpich"
  mpicc.mpich -O2 -Wall -Wextra -Werror -o "$bindir/mpi_check.mpich" "$src" && have_mpich=1
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's orted and MPICH's proxies do not reach here through ssh: this agent runs the command
# it is given in the namespace that owns the address it is given (ssh's calling convention: options
# first, then the host, then the command words, which a shell on the "remote" side joins).
agent=$COMPAT_LOG_DIR/netns-agent.sh

# --- the checker can fail: one corrupted pong must fail the run (shared memory, one namespace) ---
name="mpi_check catches a corrupted message"
log=$COMPAT_LOG_DIR/corrupt.log
rc=0
timeout -k 5 60 mpirun.openmpi --oversubscribe -np 2 --mca pml ob1 --mca btl self,vader \
  "$bindir/mpi_check.openmpi" --iters 4 --max-size 4096 --corrupt >"$log" 2>&1 || rc=$?
PAIR_CLI_LOG=$log PAIR_SRV_LOG=/dev/null
if ((rc != 0)) && grep -q "mpi_check: FAIL ranks=2: 1 mismatches" "$log" && grep -q "size 8 iteration .*: byte 4 differs" "$log"; then
  compat_result "$name" 1
else
  compat_result "$name" 0 "exit $rc; expected a nonzero exit, one mismatch and the byte that differs"
fi

compat_netns_setup
# UCX keeps 15 characters of an IB device's name (UCT_MD_NAME_MAX) and then cannot find the
# device: softrdma_<veth> must be short, and compat_netns_setup's veth names are unique per run,
# hence long. Inside its own namespace a veth needs no unique name.
for side in A B; do
  ns_var=ns$side veth_var=veth$side
  ip -n "${!ns_var}" link set "${!veth_var}" down
  ip -n "${!ns_var}" link set "${!veth_var}" name "mpi$side"
  ip -n "${!ns_var}" link set "mpi$side" up
done
for ((i = 0; i < 50; i++)); do
  ip -n "$nsA" link show mpiA | grep -q 'state UP' && ip -n "$nsB" link show mpiB | grep -q 'state UP' && break
  sleep 0.1
done
devA=$(compat_device "$ipA" "${inA[@]}")
devB=$(compat_device "$ipB" "${inB[@]}")
compat_log "veths renamed: devices $devA, $devB"
# Each "host" has its own UTS namespace and host name as well: Open MPI and MPICH take ranks with
# one host name for ranks of one node (and use shared memory between them, across the netns).
hostA=mpi-a-$tag hostB=mpi-b-$tag
cat >"$agent" <<EOF
#!/bin/sh
# ssh stand-in for mpirun/mpiexec of tests/compat/mpi.sh: runs the command in the host's namespaces.
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case \$host in
  $ipA) ns=$nsA name=$hostA ;;
  $ipB) ns=$nsB name=$hostB ;;
  *) echo "netns-agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c 'hostname "\$1" && exec /bin/sh -c "\$2"' sh "\$name" "\$*"
EOF
chmod +x "$agent"

# stat_sampler FILE: `softrdma stat` every 0.3 s until killed, each sample after a "@@" line. The
# ranks' counter pages live only as long as they do; the program lingers at the end so the last
# sample holds the totals.
stat_sampler() {
  while :; do
    echo "@@ $(date +%s.%N)"
    "$SOFTRDMA" stat 2>/dev/null || true
    sleep 0.3
  done >"$1"
}

# packet_mib STATFILE PID: the most packet bytes (rx+tx, all links but loopback) any sample shows
# for PID, in MiB.
packet_mib() {
  awk -v pid="$2" '
    /^@@/ { if (cur > best) best = cur; cur = 0; next }
    $1 == "pid" && $2 == pid && $4 !~ /^softrdma_lo\// {
      for (i = 5; i < NF; i++) if ($i == "rx_bytes" || $i == "tx_bytes") cur += $(i + 1)
    }
    END { if (cur > best) best = cur; printf "%d\n", best / 1048576 }' "$1"
}

# run_case NAME NP: one launch; sets why on failure.
run_case() {
  local name=$1 np=$2 kind=${1%.*} transport=${1#*.}
  local half=$((np / 2)) log=$COMPAT_LOG_DIR/$1.$2.log stats=$COMPAT_LOG_DIR/$1.$2.stat
  local -a launch env_args=() args wrap
  # shellcheck disable=SC2206 # MPI_RANK_WRAP is words on purpose
  wrap=(${MPI_RANK_WRAP:-})
  args=(--iters "$MPI_ITERS" --max-size "$MPI_MAX_SIZE" --netns 2 --linger-ms 1500)
  # softrdma_lo has the GID ::ffff:127.0.0.1 in every namespace, so UCX would take it for a path
  # between the hosts: UCX_NET_DEVICES names each side's veth device (only one exists on each).
  local -a ucx_env=(UCX_TLS=rc_verbs,ud_verbs "UCX_NET_DEVICES=$devA:1,$devB:1" UCX_LOG_LEVEL=info
    UCX_WARN_UNUSED_ENV_VARS=n)
  why=""
  PAIR_CLI_LOG=/dev/null PAIR_SRV_LOG=/dev/null
  # Say so when the consumer cannot even see softrdma, rather than after a launch's timeout.
  if [[ $transport == *ucx* ]] && ! grep -q 'Transport: rc_verbs' "$COMPAT_LOG_DIR/ucx_info.log"; then
    why="ucx_info -d under softrdma run lists no rc_verbs (does libuct_ib load over our lib dir?)"
    PAIR_CLI_LOG=$COMPAT_LOG_DIR/ucx_info.log
    return 1
  fi
  if [[ $transport == *ofi* ]] && ! grep -q 'provider: verbs' "$COMPAT_LOG_DIR/fi_info.log"; then
    why="fi_info -p verbs under softrdma run lists nothing (does libfabric load over our lib dir?)"
    PAIR_CLI_LOG=$COMPAT_LOG_DIR/fi_info.log
    return 1
  fi
  case $kind in
    ompi)
      local hostfile=$COMPAT_LOG_DIR/hostfile.$np
      printf '%s slots=%d\n%s slots=%d\n' "$ipA" "$half" "$ipB" "$half" >"$hostfile"
      # Debian's openmpi-mca-params.conf disables pml ucx, mtl ofi and btl ofi; these name them.
      # --bind-to none: each "host's" daemon would bind its first rank to core 0, the same core.
      local -a mca=(--bind-to none --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include 10.77.0.0/24
        --mca btl_tcp_if_include 10.77.0.0/24 --mca orte_base_help_aggregate 0)
      case $transport in
        tcp) mca+=(--mca pml ob1 --mca btl tcp,self,vader) ;;
        ucx)
          mca+=(--mca pml ucx --mca btl self --mca osc ^ucx --mca opal_common_ucx_devices any)
          env_args=("${ucx_env[@]}") ;;
        ofi_rxm | ofi_rxd)
          # libfabric's verbs provider under a utility provider that gives MPI its FI_EP_RDM:
          # ofi_rxm over verbs FI_EP_MSG (RC), or ofi_rxd over verbs FI_EP_DGRAM (UD).
          mca+=(--mca pml cm --mca mtl ofi --mca btl self --mca mtl_ofi_provider_include "verbs;$transport"
            --mca mtl_base_verbose 100)
          env_args=("FI_PROVIDER=verbs;$transport" FI_LOG_LEVEL=warn) ;;
        btlofi_rxd | btlofi_rxm)
          mca+=(--mca pml ob1 --mca btl ofi,self --mca btl_ofi_provider_include "verbs;ofi_${transport#btlofi_}"
            --mca btl_base_verbose 100)
          env_args=("FI_PROVIDER=verbs;ofi_${transport#btlofi_}" FI_LOG_LEVEL=warn) ;;
      esac
      local -a x=()
      local e
      for e in "${env_args[@]+"${env_args[@]}"}"; do x+=(-x "$e"); done
      launch=(mpirun.openmpi --hostfile "$hostfile" -np "$np" "${mca[@]}" "${x[@]+"${x[@]}"}"
        "$SOFTRDMA" run -- "${wrap[@]+"${wrap[@]}"}" "$bindir/mpi_check.openmpi" "${args[@]}")
      ;;
    mpich)
      if ((!have_mpich)); then
        why="MPICH (mpich, libmpich-dev) is not installed"
        return 1
      fi
      env_args=("${ucx_env[@]}")
      local -a genv=()
      local e
      for e in "${env_args[@]}"; do genv+=(-genv "${e%%=*}" "${e#*=}"); done
      launch=(mpiexec.hydra -launcher ssh -launcher-exec "$agent" -hosts "$ipA:$half,$ipB:$half"
        -localhost "$ipA" -n "$np" "${genv[@]}" "$SOFTRDMA" run -- "${wrap[@]+"${wrap[@]}"}" "$bindir/mpi_check.mpich" "${args[@]}")
      ;;
  esac
  compat_log "$name.$np: ${launch[*]}"
  stat_sampler "$stats" &
  local sampler=$! rc=0
  # The launcher runs in namespace A, so A's ranks are its local ones and B's come via the agent.
  env "${env_args[@]+"${env_args[@]}"}" "${inA[@]}" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$hostA" timeout -k 5 "$COMPAT_TIMEOUT" "${launch[@]}" >"$log" 2>&1 || rc=$?
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  PAIR_CLI_LOG=$log
  PAIR_SRV_LOG=/dev/null
  if ((rc != 0)); then
    why="launcher exit $rc"
    ((rc == 124)) && why+=" (killed by timeout after ${COMPAT_TIMEOUT}s)"
    return 1
  fi
  if ! grep -q "^mpi_check: PASS ranks=$np netns=2" "$log"; then
    why="no 'mpi_check: PASS ranks=$np netns=2' line"
    return 1
  fi
  local rows
  rows=$(grep -cE '^(pingpong|bandwidth) +[0-9]+ +[0-9.]+ +[0-9.]+$' "$log" || true)
  if ((rows < 5)) || ! grep -qE "^pingpong +$MPI_MAX_SIZE " "$log" ||
    (($(grep -c '^allreduce .* checked$' "$log") != 3)); then
    why="result rows missing (ping-pong up to $MPI_MAX_SIZE, bandwidth, 3 allreduce lines)"
    return 1
  fi
  [[ $transport == tcp ]] && return 0

  # Proof that the traffic went over softrdma: ranks 0 and N-1 sit in different namespaces, and
  # each must have moved data as RoCE packets on its veth device.
  local pids p mib
  pids=$(sed -n 's/^pids of ranks: //p' "$log")
  local first=${pids%% *} last=${pids##* }
  for p in "$first" "$last"; do
    mib=$(packet_mib "$stats" "$p")
    compat_log "$name.$np: pid $p moved $mib MiB as softrdma packets"
    if ((mib < MPI_MIN_MIB)); then
      why="softrdma counters: rank pid $p moved $mib MiB as packets, expected at least $MPI_MIN_MIB (stat samples: $stats)"
      return 1
    fi
  done
  if [[ $transport == ucx ]]; then
    # UCX (log level info) prints each endpoint configuration's lanes as tag(TL/DEV) etc.
    if ! grep -qE '(rc|ud)_verbs/softrdma' "$log"; then
      why="the UCX log names no rc_verbs/ud_verbs lane on a softrdma device"
      return 1
    fi
    local other
    if other=$(grep -oE '\((tcp|posix|sysv|cma|knem|xpmem)/[^)]*\)' "$log" | sort -u | head -5) && [[ -n $other ]]; then
      why="UCX used other transports: $other"
      return 1
    fi
  fi
  if [[ $transport == *ofi* ]]; then
    # Open MPI (mtl/btl verbose) names the libfabric domain each rank opened: verbs' are ours.
    if ! grep -qE 'ofi.*provider: softrdma_' "$log"; then
      why="Open MPI's log names no libfabric verbs domain on a softrdma device"
      return 1
    fi
  fi
  return 0
}

"${inB[@]}" timeout 60 "$SOFTRDMA" run -- ucx_info -d >"$COMPAT_LOG_DIR/ucx_info.log" 2>&1 || true
"${inB[@]}" timeout 60 "$SOFTRDMA" run -- fi_info -p verbs >"$COMPAT_LOG_DIR/fi_info.log" 2>&1 || true
for c in "${cases[@]}"; do
  name=${c%.*} np=${c##*.}
  if run_case "$name" "$np"; then
    compat_result "$name.$np" 1
    grep -E '^(pingpong|bandwidth) ' "$COMPAT_LOG_DIR/$name.$np.log" | tr -s ' ' | paste -sd ';' |
      sed "s/^/[results] $name.$np: /"
  else
    compat_result "$name.$np" 0 "$why"
  fi
done
compat_finish
