#!/usr/bin/env bash
# compat.loader: can every unmodified Debian RDMA binary load softrdma's libraries?
#
# All of them are linked BIND_NOW, so one missing symbol or version node in our libibverbs.so.1
# (or in the libmlx5/libefa stubs, or in what the system librdmacm imports from us) aborts the
# program before main(). This test runs each binary with `-h` under LD_LIBRARY_PATH=$SOFTRDMA_LIB
# and checks the loader's verdict and which copies of the libraries were mapped. It also checks
# the export table of libibverbs.so.1 against the system one, and the pure helpers against the
# system library's answers.
#
# Environment: SOFTRDMA_LIB = the build's lib/ directory (set by ctest).
# Exit: 0 pass, 1 fail (each problem is printed with the binary and the reason), 77 skip.

set -u
# shellcheck source=abi_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/abi_lib.sh"

lib_dir=${SOFTRDMA_LIB:?SOFTRDMA_LIB must name the directory holding our libibverbs.so.1}
lib_dir=$(realpath "$lib_dir")
sys_verbs=/usr/lib/x86_64-linux-gnu/libibverbs.so.1
run_timeout=${SOFTRDMA_LOADER_TIMEOUT:-5}

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

if [[ ! -e $lib_dir/libibverbs.so.1 ]]; then
  echo "FAIL: $lib_dir/libibverbs.so.1 not built"
  exit 1
fi
if ! command -v dpkg > /dev/null; then
  echo "SKIP: no dpkg, cannot find the Debian binaries"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A sanitizer build of our libraries needs its runtime first in the process (the Debian
# binaries are not instrumented), and leak reports from `-h` runs are noise.
preload=$(abi_sanitizer_preload "$lib_dir/libibverbs.so.1")
run_env=(env LD_LIBRARY_PATH="$lib_dir")
if [[ -n $preload ]]; then
  run_env+=(LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0)
fi

# ---- 1. export table: every default symbol@version of the system libibverbs, nothing more ----
exports() {  # default versions only
  abi_exports "$1" | grep -v '^('
}
if [[ -e $sys_verbs ]]; then
  exports "$sys_verbs" > "$work/sys.exports"
  exports "$lib_dir/libibverbs.so.1" > "$work/our.exports"
  # ibv_register_driver is a hidden compat symbol in rdma-core; we export it as IBVERBS_1.1.
  while read -r line; do
    fail "libibverbs.so.1 does not export $line (the system library does)"
  done < <(comm -23 "$work/sys.exports" "$work/our.exports")
  while read -r line; do
    [[ $line == "IBVERBS_1.1 ibv_register_driver" ]] && continue
    # Our own node, between our librdmacm and libibverbs (src/verbs/private_abi.h).
    [[ $line == SOFTRDMA_PRIVATE_1\ * ]] && continue
    fail "libibverbs.so.1 exports $line, which the system library does not"
  done < <(comm -13 "$work/sys.exports" "$work/our.exports")
else
  echo "note: $sys_verbs absent, export table not compared"
fi

# ---- 2. pure helpers answer exactly as the system library does ----
if command -v python3 > /dev/null && [[ -e $sys_verbs ]]; then
  cat > "$work/helpers.py" << 'EOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
for name in ("ibv_wc_status_str", "ibv_event_type_str", "ibv_node_type_str", "ibv_port_state_str"):
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int]
    for v in range(-3, 40):
        print(name, v, fn(v).decode())
mbps = [2500, 5000, 10000, 14062, 20000, 25781, 28125, 30000, 40000, 53125, 56250, 60000, 80000,
        103125, 112500, 120000, 168750, 206250, 309375, 425000, 637500, 850000, 1275000,
        0, -1, 14000, 25000, 50000, 100000]
for name, values in (("ibv_rate_to_mult", range(-3, 40)), ("mult_to_ibv_rate", range(-3, 600)),
                     ("ibv_rate_to_mbps", range(-3, 40)), ("mbps_to_ibv_rate", mbps)):
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    for v in values:
        print(name, v, fn(v))
# Kernel-struct translations: same random source, same pre-filled destination, same bytes out.
import random
rng = random.Random(4791)
for name in ("ibv_copy_ah_attr_from_kern", "ibv_copy_qp_attr_from_kern",
             "ibv_copy_path_rec_from_kern", "ibv_copy_path_rec_to_kern"):
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
    for _ in range(4):
        src = ctypes.create_string_buffer(bytes(rng.randrange(256) for _ in range(512)))
        dst = ctypes.create_string_buffer(b"\xa5" * 512)
        fn(dst, src)
        print(name, dst.raw.hex())
EOF
  python3 "$work/helpers.py" "$sys_verbs" > "$work/sys.helpers" 2>&1 ||
    fail "helpers: python could not query the system library: $(tail -1 "$work/sys.helpers")"
  "${run_env[@]}" python3 "$work/helpers.py" "$lib_dir/libibverbs.so.1" > "$work/our.helpers" 2>&1 ||
    fail "helpers: python could not query our library: $(tail -1 "$work/our.helpers")"
  while read -r line; do
    fail "helpers: ours differs from the system library: $line"
  done < <(diff "$work/sys.helpers" "$work/our.helpers" | grep '^[<>]' | head -20)
else
  echo "note: python3 or $sys_verbs absent, helpers not compared"
fi

# ---- 3. every binary of the packages that links libibverbs/librdmacm loads our libraries ----
have_rdmacm=0
[[ -e $lib_dir/librdmacm.so.1 ]] && have_rdmacm=1
checked=0
skipped=()

for pkg in ibverbs-utils perftest rdmacm-utils qperf; do
  if ! files=$(dpkg -L "$pkg" 2> /dev/null); then
    echo "note: package $pkg not installed"
    continue
  fi
  for bin in $(grep -E '^/usr/s?bin/' <<< "$files"); do
    [[ -f $bin && -x $bin ]] || continue
    needed=$(readelf -d "$bin" 2> /dev/null | awk '/\(NEEDED\)/ {gsub(/[][]/, "", $NF); print $NF}')
    # rsocket tools (rstream, rcopy, ...) reach libibverbs only through librdmacm.
    grep -qxE 'lib(ibverbs|rdmacm)\.so\.1' <<< "$needed" || continue  # scripts, non-RDMA tools
    name=$(basename "$bin")
    links_rdmacm=0
    grep -qx 'librdmacm.so.1' <<< "$needed" && links_rdmacm=1
    # Without our librdmacm the system one would load; only perftest is run that way, because
    # the system librdmacm's imports from our libibverbs are worth checking.
    if ((links_rdmacm && !have_rdmacm)) && [[ $pkg != perftest ]]; then
      skipped+=("$name")
      continue
    fi
    checked=$((checked + 1))

    out=$work/$name.out
    dbg=$work/$name.ld
    (cd "$work" && timeout -k 2 "$run_timeout" "${run_env[@]}" LD_DEBUG=libs LD_DEBUG_OUTPUT="$dbg" \
      "$bin" -h < /dev/null > "$out" 2>&1)
    rc=$?
    cat "$dbg".* > "$dbg" 2> /dev/null

    # The loader's own complaints: a missing node, a missing symbol, an unversioned library.
    loader_msgs=$(grep -E "version .* not found|symbol lookup error|no version information available|error while loading shared libraries" "$out" | sort -u | head -5)
    if [[ -n $loader_msgs ]]; then
      while read -r msg; do
        fail "$name: $msg"
      done <<< "$loader_msgs"
      continue  # nothing below would add information
    fi
    if ((rc == 127)); then
      fail "$name: exit 127 (loader failure?): $(head -c 300 "$out" | tr '\n' ' ')"
      continue
    fi

    # Which copy of each library ran its initialisers: ours, from $lib_dir, or a system one.
    inits=$(sed -n 's/.*calling init: //p' "$dbg" | sort -u)
    expect=(libibverbs.so.1)
    grep -qx 'libmlx5.so.1' <<< "$needed" && expect+=(libmlx5.so.1)
    grep -qx 'libefa.so.1' <<< "$needed" && expect+=(libefa.so.1)
    ((links_rdmacm && have_rdmacm)) && expect+=(librdmacm.so.1)
    for soname in "${expect[@]}"; do
      path=$(grep -E "/$soname\$" <<< "$inits" | head -1)
      if [[ -z $path ]]; then
        fail "$name: $soname was not loaded (exit $rc; $(head -c 300 "$out" | tr '\n' ' '))"
      elif [[ $(realpath "$path") != "$lib_dir"/* ]]; then
        fail "$name: loaded $path instead of ours from $lib_dir"
      fi
    done
    # No rdma-core provider may come in behind our back (dlopen'ed from libibverbs/, or a
    # provider library some other dependency needs).
    while read -r path; do
      fail "$name: loaded rdma-core provider $path"
    done < <(grep -E '/libibverbs/|/lib[a-z0-9_]+-rdmav[0-9]+\.so|/libmlx4\.so' <<< "$inits")
  done
done

if ((${#skipped[@]})); then
  echo "skipped (link librdmacm.so.1, which $lib_dir does not have yet): ${skipped[*]}"
fi
if ((checked == 0)); then
  echo "SKIP: none of ibverbs-utils, perftest, rdmacm-utils, qperf is installed"
  exit 77
fi
echo "checked $checked binaries against $lib_dir"
if ((failures)); then
  echo "compat.loader: $failures problem(s)"
  exit 1
fi
echo "compat.loader: PASS"
