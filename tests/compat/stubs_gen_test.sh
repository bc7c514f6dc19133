#!/usr/bin/env bash
# compat.stubs_gen: src/stubs/gen_stubs.py on a small made-up library. The generated stubs build
# into a library with the map's symbol versions (a symbol in two nodes: default and compat) and
# the documented failures; inputs it cannot handle fail the build with a message naming the symbol.
#
# Environment: CXX (default c++), CC (default cc). Exit: 0 pass, 1 fail, 77 skip (no python3).

set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gen=$here/../../src/stubs/gen_stubs.py
cxx=${CXX:-c++}
cc=${CC:-cc}
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

mkdir -p "$work/inc/fake"
cat > "$work/inc/fake/fakedv.h" << 'EOF'
#include <stdbool.h>
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
struct fake_obj { int x; };
int fakedv_query(void *ctx, size_t len);
struct fake_obj *fakedv_create(void *ctx,
                               unsigned flags);
void fakedv_free(struct fake_obj *obj) __attribute__((nonnull));
bool fakedv_is_supported(void *dev);
long fakedv_count(void);
static inline int fakedv_inline(void) { return 1; }
#ifdef __cplusplus
}
#endif
EOF
cat > "$work/good.map" << 'EOF'
FAKE_1.0 {
  global:
    fakedv_query;
    fakedv_create;
  local: *;
};
FAKE_1.1 {
  global:
    fakedv_query;
    fakedv_free;
    fakedv_is_supported;
    fakedv_count;  /* stub: -7 */
} FAKE_1.0;
EOF

# generate NAME MAP: runs the generator; its messages land in $work/NAME.err.
generate() {
  CPATH=$work/inc python3 "$gen" --map "$2" --header fake/fakedv.h --cc "$cc" --out "$work/$1.cpp" \
    2> "$work/$1.err"
}

# ---- a good library: builds, versions as the map says, documented failures ----
if ! generate good "$work/good.map"; then
  fail "generator rejected a valid map: $(cat "$work/good.err")"
elif ! "$cxx" -std=c++20 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -shared -I"$work/inc" \
  -o "$work/libfake.so.1" "$work/good.cpp" -Wl,--version-script="$work/good.map" -Wl,-z,defs \
  -Wl,-soname,libfake.so.1 2> "$work/good.build"; then
  fail "generated source does not build: $(head -5 "$work/good.build")"
else
  got=$(objdump -T "$work/libfake.so.1" | awk '/^[0-9a-f]+ / && !/\*UND\*/ && $(NF-1) != $NF {print $(NF-1), $NF}' | sort)
  want=$(printf '%s\n' "(FAKE_1.0) fakedv_query" "FAKE_1.0 fakedv_create" "FAKE_1.1 fakedv_count" \
    "FAKE_1.1 fakedv_free" "FAKE_1.1 fakedv_is_supported" "FAKE_1.1 fakedv_query" | sort)
  [[ $got == "$want" ]] || fail "exports differ from the map: got [$(echo $got)], want [$(echo $want)]"
  python3 - "$work/libfake.so.1" > "$work/calls" 2>&1 << 'EOF' || fail "stub calls: $(cat "$work/calls")"
import ctypes, errno, sys
lib = ctypes.CDLL(sys.argv[1], use_errno=True)
libc = ctypes.CDLL(None)
libc.dlvsym.restype, libc.dlvsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
def call(restype, name, version=None):
    if version:
        fn = ctypes.CFUNCTYPE(restype, use_errno=True)(libc.dlvsym(lib._handle, name, version))
    else:
        fn = getattr(lib, name.decode()); fn.restype = restype
    ctypes.set_errno(0)
    return fn(), ctypes.get_errno()
results = {
    "query@FAKE_1.0": (call(ctypes.c_int, b"fakedv_query", b"FAKE_1.0"), (errno.EOPNOTSUPP, errno.EOPNOTSUPP)),
    "query@@FAKE_1.1": (call(ctypes.c_int, b"fakedv_query", b"FAKE_1.1"), (errno.EOPNOTSUPP, errno.EOPNOTSUPP)),
    "create": (call(ctypes.c_void_p, b"fakedv_create"), (None, errno.EOPNOTSUPP)),
    "is_supported": (call(ctypes.c_bool, b"fakedv_is_supported"), (False, 0)),
    "count (stub: -7)": (call(ctypes.c_long, b"fakedv_count"), (-7, errno.EOPNOTSUPP)),
    "free (void)": (call(None, b"fakedv_free"), (None, 0)),
}
bad = [f"{k}: got {g}, want {w}" for k, (g, w) in results.items() if g != w]
print("; ".join(bad))
sys.exit(1 if bad else 0)
EOF
fi

# ---- inputs the generator must refuse, naming the culprit ----
# refuse NAME EXPECTED_MESSAGE_PART MAP_TEXT
refuse() {
  printf '%s\n' "$3" > "$work/$1.map"
  if generate "$1" "$work/$1.map"; then
    fail "$1: the generator accepted it"
  elif ! grep -qF -- "$2" "$work/$1.err"; then
    fail "$1: message lacks '$2': $(cat "$work/$1.err")"
  fi
}
refuse undeclared "not declared in <fake/fakedv.h>: fakedv_nowhere" \
  'FAKE_1.0 { global: fakedv_query; fakedv_nowhere; local: *; };'
refuse inline "fakedv_inline is defined inline" 'FAKE_1.0 { global: fakedv_inline; local: *; };'
refuse no_default "fakedv_count returns long: no default failure" \
  'FAKE_1.0 { global: fakedv_count; local: *; };'
refuse pattern "'fakedv_*' is a pattern" 'FAKE_1.0 { global: fakedv_*; local: *; };'
refuse parent "FAKE_1.1 inherits FAKE_0.9" 'FAKE_1.1 { global: fakedv_query; local: *; } FAKE_0.9;'
refuse void_value "fakedv_free returns void" \
  'FAKE_1.0 { global: fakedv_free; /* stub: 1 */ local: *; };'

if ((failures)); then
  echo "compat.stubs_gen: $failures problem(s)"
  exit 1
fi
echo "compat.stubs_gen: PASS"
