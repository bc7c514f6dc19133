#!/usr/bin/env bash
# compat.stubs: do softrdma's libraries cover everything Debian's RDMA consumers import?
#
#  1. The libmlx5.so.1 / libefa.so.1 stubs export exactly what Debian's (rdma-core 44) do: every
#     symbol@version, compat versions included, and every version node with its parent; they
#     link no RDMA library.
#  2. A few stubs, called, fail as documented (src/stubs/gen_stubs.py); none crashes on NULLs.
#  3. Every ELF file of the consumer packages (UCX and its plugins, libfabric, Open MPI's
#     components, pyverbs' modules, perftest, qperf, rdmacm-utils, ibverbs-utils, ...): each
#     DT_NEEDED RDMA library and each symbol@version and version node imported from
#     libibverbs/librdmacm/libmlx5/libefa must be in our build. Other RDMA libraries they link
#     (libibumad, libpsm2, ...) are listed, and checked in turn if they import from ours.
#
# (compat.loader runs the binaries of four of these packages and compares libibverbs' export
# table with the system's; this test reads ELF files only.)
#
# Environment: SOFTRDMA_LIB = the build's lib/ directory (default: SOFTRDMA_BIN/../lib).
# Exit: 0 pass, 1 fail (each problem printed with the file and the symbol), 77 skip.

set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=abi_lib.sh
source "$here/abi_lib.sh"

lib_dir=${SOFTRDMA_LIB:-${SOFTRDMA_BIN:-$here/../../build/bin}/../lib}
lib_dir=$(realpath "$lib_dir")
sys_dir=/usr/lib/x86_64-linux-gnu
ours=(libibverbs.so.1 librdmacm.so.1 libmlx5.so.1 libefa.so.1)
# Sonames of RDMA libraries: rdma-core's, its providers', and the other fabrics' user libraries.
rdma_re='^lib(ibverbs|rdmacm|mlx[45]|efa|mana|hns|bnxt_re|cxgb4|erdma|hfi1verbs|ipathverbs|irdma|ocrdma|qedr|rxe|siw|vmw_pvrdma|ibumad|ibmad|ibnetdisc|osmcomp|opensm|psm2|psm_infinipath|infinipath)[-.]'
consumer_pkgs=(libfabric1 libfabric-bin libucx0 ucx-utils openmpi-bin libopenmpi3 python3-pyverbs
  perftest qperf rdmacm-utils ibverbs-utils mpich libmpich12)

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
checked_parts=0

for so in "${ours[@]}"; do
  [[ -e $lib_dir/$so ]] || fail "$lib_dir/$so not built"
done
((failures)) && exit 1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- 1. the stubs' export tables against Debian's libraries ----
for so in libmlx5.so.1 libefa.so.1; do
  real=$sys_dir/$so
  if [[ ! -e $real ]]; then
    echo "note: $real absent (package ibverbs-providers), $so not compared"
    continue
  fi
  checked_parts=$((checked_parts + 1))
  abi_exports "$real" > "$work/$so.real"
  abi_exports "$lib_dir/$so" > "$work/$so.ours"
  while read -r line; do
    fail "$so does not export $line (Debian's does)"
  done < <(comm -23 "$work/$so.real" "$work/$so.ours")
  while read -r line; do
    fail "$so exports $line, which Debian's does not"
  done < <(comm -13 "$work/$so.real" "$work/$so.ours")
  while read -r line; do
    fail "$so: version node (and parent) differs: $line"
  done < <(diff <(abi_version_nodes "$real") <(abi_version_nodes "$lib_dir/$so") | grep '^[<>]')
  soname=$(objdump -p "$lib_dir/$so" | awk '$1 == "SONAME" {print $2}')
  [[ $soname == "$so" ]] || fail "$so: SONAME is '$soname'"
  while read -r dep; do
    fail "$so links $dep: the stubs must load no RDMA library (no provider code may run)"
  done < <(abi_needed "$lib_dir/$so" | grep -E "$rdma_re")
  echo "$so: $(awk '{v = $1; gsub(/[()]/, "", v)} v != $2' "$work/$so.ours" | wc -l) symbol versions," \
    "$(abi_version_nodes "$lib_dir/$so" | wc -l) version nodes, as Debian's"
done

# ---- 2. the stubs fail as documented ----
if command -v python3 > /dev/null; then
  checked_parts=$((checked_parts + 1))
  cat > "$work/behaviour.py" << 'EOF'
import ctypes, errno, sys
EOPNOTSUPP = errno.EOPNOTSUPP
bad = []
libc = ctypes.CDLL(None)
libc.dlvsym.restype = ctypes.c_void_p
libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]

def check(lib, name, restype, args, want, want_errno, version=None):
    if version:
        addr = libc.dlvsym(lib._handle, name.encode(), version.encode())
        if not addr:
            bad.append(f"{name}@{version}: not found by dlvsym")
            return
        fn = ctypes.CFUNCTYPE(restype, *[type(a) for a in args], use_errno=True)(addr)
    else:
        fn = getattr(lib, name)
        fn.restype = restype
    ctypes.set_errno(0)
    got = fn(*args)
    got_errno = ctypes.get_errno()
    if restype == ctypes.c_void_p:
        got = "NULL" if got is None else hex(got)
    label = name + (f"@{version}" if version else "")
    if got != want or (want_errno is not None and got_errno != want_errno):
        bad.append(f"{label} returned {got} with errno {got_errno}; expected {want}"
                   + (f" with errno {want_errno}" if want_errno is not None else ""))
    else:
        print(f"ok: {label} -> {got}" + (f", errno {got_errno}" if want_errno is not None else ""))

mlx5 = ctypes.CDLL(sys.argv[1], use_errno=True)
efa = ctypes.CDLL(sys.argv[2], use_errno=True)
null, zero = ctypes.c_void_p(), ctypes.c_uint64(0)
check(mlx5, "mlx5dv_is_supported", ctypes.c_bool, [null], False, None)
check(mlx5, "mlx5dv_open_device", ctypes.c_void_p, [null, null], "NULL", EOPNOTSUPP)
check(mlx5, "mlx5dv_query_device", ctypes.c_int, [null, null], EOPNOTSUPP, EOPNOTSUPP)
check(mlx5, "mlx5dv_devx_general_cmd", ctypes.c_int, [null, null, zero, null, zero], EOPNOTSUPP, EOPNOTSUPP)
check(mlx5, "mlx5dv_dump_dr_domain", ctypes.c_int, [null, null], -EOPNOTSUPP, EOPNOTSUPP)
check(mlx5, "mlx5dv_qp_cancel_posted_send_wrs", ctypes.c_int, [null, zero], -EOPNOTSUPP, EOPNOTSUPP)
check(mlx5, "mlx5dv_devx_get_event", ctypes.c_ssize_t, [null, null, zero], -1, EOPNOTSUPP)
check(mlx5, "mlx5dv_vfio_get_events_fd", ctypes.c_int, [null], -1, EOPNOTSUPP)
check(mlx5, "mlx5dv_devx_free_uar", None, [null], None, 0)  # void: errno untouched
for v in ("MLX5_1.0", "MLX5_1.2"):
    check(mlx5, "mlx5dv_init_obj", ctypes.c_int, [null, zero], EOPNOTSUPP, EOPNOTSUPP, version=v)
check(efa, "efadv_query_device", ctypes.c_int, [null, null, ctypes.c_uint32(0)], EOPNOTSUPP, EOPNOTSUPP)
check(efa, "efadv_create_cq", ctypes.c_void_p, [null, null, null, ctypes.c_uint32(0)], "NULL", EOPNOTSUPP)
check(efa, "efadv_cq_from_ibv_cq_ex", ctypes.c_void_p, [null], "NULL", EOPNOTSUPP)

# Every other export, called with zeros: none may crash (they never touch their arguments), and
# errno is EOPNOTSUPP, or untouched (void and bool ones).
for lib, names in ((mlx5, sys.argv[3].split()), (efa, sys.argv[4].split())):
    for name in names:
        fn = getattr(lib, name)
        fn.restype = ctypes.c_long
        ctypes.set_errno(0)
        sys.stdout.flush()  # a crash is then reported after the last name printed
        fn(*[null] * 6)
        if ctypes.get_errno() not in (0, EOPNOTSUPP):
            bad.append(f"{name}(NULL...) left errno {ctypes.get_errno()}")
    print(f"ok: {len(names)} stubs called with NULL arguments")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
EOF
  names() { abi_exports "$lib_dir/$1" | awk '$1 !~ /^\(/ && $1 != $2 {print $2}' | tr '\n' ' '; }
  preload=$(abi_sanitizer_preload "$lib_dir/libmlx5.so.1")
  env ${preload:+LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0} \
    python3 "$work/behaviour.py" "$lib_dir/libmlx5.so.1" "$lib_dir/libefa.so.1" \
    "$(names libmlx5.so.1)" "$(names libefa.so.1)" > "$work/behaviour.out" 2>&1
  rc=$?
  grep -v '^FAIL: ' "$work/behaviour.out" | sed 's/^/  /'
  while read -r line; do fail "stub behaviour: $line"; done < <(sed -n 's/^FAIL: //p' "$work/behaviour.out")
  if ((rc != 0)) && ! grep -q '^FAIL: ' "$work/behaviour.out"; then
    fail "stub behaviour: python exited $rc (a stub crashed?): $(tail -3 "$work/behaviour.out" | tr '\n' ' ')"
  fi
else
  echo "note: no python3, stub behaviour not checked"
fi

# ---- 3. what the consumers import ----
declare -A exported  # "SONAME VERSION symbol" and "SONAME VERSION -" (the node) of ours
for so in "${ours[@]}"; do
  while read -r ver sym; do
    exported["$so $ver $sym"]=1
  done < <(abi_exports "$lib_dir/$so" | awk '{v = $1; gsub(/[()]/, "", v); print v, (v == $2 ? "-" : $2)}')
done
is_ours() { [[ " ${ours[*]} " == *" $1 "* ]]; }

declare -A other_users  # other RDMA library -> consumers that link it
queue=()
if command -v dpkg > /dev/null; then
  for pkg in "${consumer_pkgs[@]}"; do
    if ! files=$(dpkg -L "$pkg" 2> /dev/null); then
      echo "note: package $pkg not installed"
      continue
    fi
    while read -r f; do
      [[ -f $f && ! -L $f ]] || continue
      [[ $(head -c 4 "$f" 2> /dev/null | od -An -c | tr -d ' ') == 177ELF ]] || continue
      queue+=("$pkg:$f")
    done <<< "$files"
  done
else
  echo "note: no dpkg, consumer packages not scanned"
fi

declare -A seen
consumers=0
imports=0
for ((i = 0; i < ${#queue[@]}; i++)); do
  pkg=${queue[i]%%:*}
  f=${queue[i]#*:}
  [[ -n ${seen[$f]:-} ]] && continue
  seen[$f]=1
  needed=$(abi_needed "$f" | grep -E "$rdma_re")
  [[ -n $needed ]] || continue
  consumers=$((consumers + 1))
  name=${f#/usr/}
  for dep in $needed; do
    if is_ours "$dep"; then
      continue
    fi
    other_users[$dep]+=" $(basename "$f")"
    # A system RDMA library that itself imports from ours is a consumer too.
    path=$(ldconfig -p | awk -v d="$dep" '$1 == d && /x86-64/ {print $NF; exit}')
    if [[ -z $path ]]; then
      fail "$name needs $dep, which neither $lib_dir nor the system has"
    elif abi_needed "$path" | grep -qE '^lib(ibverbs|rdmacm|mlx5|efa)\.so\.1$'; then
      queue+=("$dep:$(realpath "$path")")
    fi
  done
  abi_imports "$f" > "$work/imports"
  n=$(awk '$3 != "-" && ($1 == "libibverbs.so.1" || $1 == "librdmacm.so.1" || $1 == "libmlx5.so.1" || $1 == "libefa.so.1")' "$work/imports" | wc -l)
  echo "  $name: needs $(echo $needed); imports $n symbols from ours"
  while read -r so ver sym; do
    is_ours "$so" || continue
    imports=$((imports + 1))
    if [[ -z ${exported["$so $ver $sym"]:-} ]]; then
      if [[ $sym == - ]]; then
        fail "$name ($pkg) needs version node $ver of $so, which ours lacks"
      else
        fail "$name ($pkg) imports $sym@$ver from $so, which ours does not export"
      fi
    fi
  done < "$work/imports"
done
if ((consumers)); then
  checked_parts=$((checked_parts + 1))
  echo "consumers: $consumers ELF files link RDMA libraries; $imports imports (symbols and version nodes) from ours checked"
fi
for dep in $(printf '%s\n' "${!other_users[@]}" | sort); do
  path=$(ldconfig -p | awk -v d="$dep" '$1 == d && /x86-64/ {print $NF; exit}')
  links=$(abi_needed "${path:-/nonexistent}" | grep -E '^lib(ibverbs|rdmacm|mlx5|efa)\.so\.1$' | tr '\n' ' ')
  echo "other RDMA library $dep (${path:-missing}; links ${links:-none of ours}), needed by:${other_users[$dep]}"
done

if ((checked_parts == 0)); then
  echo "SKIP: neither Debian's provider libraries, python3 nor the consumer packages are here"
  exit 77
fi
if ((failures)); then
  echo "compat.stubs: $failures problem(s)"
  exit 1
fi
echo "compat.stubs: PASS"
