#!/usr/bin/env bash
# Installs the Debian 12 packages softrdma needs to build, test and benchmark, if any is missing.
#   tools/setup-deps.sh           install only what is missing (no apt-get update when none is)
#   tools/setup-deps.sh --update  always apt-get update first (CI on a fresh machine)
#   tools/setup-deps.sh --demo    only what tools/demo.sh needs: the libraries' and the command's
#                                 build, and perftest (not the tests' MPI, UCX, gnuplot...)
# Needs root (or sudo) only when something must be installed.
set -euo pipefail

# What the libraries and the softrdma command build from (tools/demo.sh builds only these).
DEMO_BUILD_PKGS=(cmake ninja-build g++ libibverbs-dev librdmacm-dev libisal-dev libfmt-dev libcli11-dev
  libssl-dev python3)
# The demo's programs (perftest) and taskset (util-linux) to place them.
DEMO_RUN_PKGS=(perftest util-linux)
# The tests' build; dpkg-dev: dpkg-buildflags (.ci/build-types.sh) and dpkg-shlibdeps (the package).
BUILD_PKGS=("${DEMO_BUILD_PKGS[@]}" pkg-config libgtest-dev libgmock-dev libbenchmark-dev dpkg-dev)
# Wire protection's fast AES-GCM (optional in the build; the library is x86-64 only).
[[ $(dpkg --print-architecture 2>/dev/null) == amd64 ]] && BUILD_PKGS+=(libipsec-mb-dev)
# ucx-utils and libfabric-bin: the consumers tests/compat runs over softrdma and the shared-memory
# peers bench/direct.sh measures against; openmpi/mpich and python3-pyverbs: the MPI and pyverbs
# consumers; ibverbs-providers: rdma-core's real libmlx5/libefa, which the stub check compares
# ours with; iperf3 and gnuplot-nox: bench/netns.sh's TCP peer and its plot; lintian: the Debian
# package's check (.ci/deb.sh); tshark: the capture test's decoder; gdb: compat.pause holds a peer in it.
RUN_PKGS=("${DEMO_RUN_PKGS[@]}" ibverbs-utils rdmacm-utils qperf sockperf iproute2 procps ucx-utils
  libfabric-bin ibverbs-providers binutils python3-pyverbs openmpi-bin libopenmpi-dev mpich libmpich-dev
  iperf3 gnuplot-nox nftables lintian tshark gdb)

update=0
for arg in "$@"; do
  case $arg in
    --update) update=1 ;;
    --demo) BUILD_PKGS=("${DEMO_BUILD_PKGS[@]}") RUN_PKGS=("${DEMO_RUN_PKGS[@]}") ;;
    *) echo "usage: setup-deps.sh [--update] [--demo]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${BUILD_PKGS[@]}" "${RUN_PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0 && update == 0)); then
  exit 0
fi

sudo=()
if [[ $(id -u) != 0 ]]; then
  if command -v sudo >/dev/null; then
    sudo=(sudo -n)
  else
    echo "setup-deps: missing packages (${missing[*]}) and not root; install them as root" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "setup-deps: installing: ${missing[*]:-(none missing; refreshing the index)}"
"${sudo[@]}" apt-get update -q
if ((${#missing[@]})); then
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi
