#!/usr/bin/env bash
# The layer check (ctest tools.layers): every #include of a project header in src/, tools/, tests/ and
# fuzz/ must follow the module graph below, which the build's per-target include paths also enforce
# (CMakeLists.txt, softrdma_module_includes). It catches what include paths cannot: "../" escapes
# (resolved relative to the including file), a target that links more than its folder may use, and
# libibverbs/librdmacm ABI headers below the ABI layers.
#   tools/check_layers.sh [ROOT]     check ROOT (default: this checkout); exit 1 on any violation
#   tools/check_layers.sh --self-test  plant violations in a scratch tree and require each be caught
#   tools/check_layers.sh --markdown   print the src/ rows of the table as docs/architecture.md shows them
#   tools/check_layers.sh --docs [FILE] fail unless FILE (default docs/architecture.md) holds that table
#                                      between its "layers:begin" and "layers:end" markers
set -u

# Folder (longest prefix wins) -> modules whose headers it may include ("-": none). Modules are the
# folders of src/; config (the table of environment variables) is a leaf every layer may include.
# Keep in step with the target_link_libraries of CMakeLists.txt and its subfolders.
read -r -d '' TABLE <<'EOF'
src/config            config
src/wire              wire config
src/net               net wire config
src/core              core config
src/transport         transport core net wire cm config
src/verbs             verbs transport core net config
src/cm                cm net wire config
src/rdmacm            rdmacm cm verbs config
src/stubs             -
tools                 core net config
tests/unit/config     config
tests/unit/wire       wire config
tests/unit/net        net config
tests/unit/core       core config
tests/unit/transport  transport core net wire config
tests/unit/verbs      verbs core config
tests/unit/cm         cm wire config
tests/verbs           core verbs
tests/faults          verbs
tests/hostile         wire net core verbs transport config
tests/rdmacm          -
tests/compat          -
tests/interop         -
tests/tools           -
fuzz                  wire transport core net config
EOF

# Folders below the ABI layers: no rdma-core ABI header (<infiniband/...>, <rdma/...>) there.
NO_ABI="src/wire src/net src/core src/transport src/cm"

INCLUDE_RE='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]*)[">]'

check() {
  local root=$1 bad=0 file rel dir best allowed line inc mod ok
  local -a modules
  mapfile -t modules < <(find "$root/src" -mindepth 1 -maxdepth 1 -type d -printf '%f\n')
  while IFS= read -r -d '' file; do
    rel=${file#"$root"/}
    dir=${rel%/*}
    best="" allowed=""
    while read -r prefix mods; do
      [[ -z $prefix ]] && continue
      if [[ $dir == "$prefix" || $dir == "$prefix"/* ]] && (( ${#prefix} > ${#best} )); then
        best=$prefix allowed=$mods
      fi
    done <<<"$TABLE"
    if [[ -z $best ]]; then
      echo "$rel: folder $dir is not in the layer table (tools/check_layers.sh)"
      bad=1
      continue
    fi
    while IFS= read -r line; do
      [[ $line =~ $INCLUDE_RE ]] || continue
      inc=${BASH_REMATCH[1]}
      if [[ $inc == ../* || $inc == */../* ]]; then
        echo "$rel: #include \"$inc\" escapes its folder; include \"module/file.h\" through the build's paths"
        bad=1
        continue
      fi
      if [[ $line =~ \<(infiniband|rdma)/ ]]; then
        for d in $NO_ABI; do
          if [[ $dir == "$d" || $dir == "$d"/* ]]; then
            echo "$rel: includes <$inc>: the rdma-core ABI belongs to src/verbs and src/rdmacm only"
            bad=1
          fi
        done
        continue
      fi
      mod=${inc%%/*}
      [[ $mod == "$inc" ]] && continue  # same-folder header
      ok=0
      for m in "${modules[@]}"; do [[ $m == "$mod" ]] && ok=1; done
      (( ok )) || continue  # a system or third-party header
      # <net/if.h> and friends are system headers: an angle include names a module only if it exists there.
      if [[ $line =~ \< && ! -e $root/src/$inc ]]; then continue; fi
      ok=0
      for m in $allowed; do [[ $m == "$mod" ]] && ok=1; done
      if (( !ok )); then
        echo "$rel: includes $inc, but $best may include only: $allowed"
        bad=1
      fi
    done < <(grep -E '^[[:space:]]*#[[:space:]]*include' "$file")
  done < <(find "$root/src" "$root/tools" "$root/tests" "$root/fuzz" -type f \
             \( -name '*.cpp' -o -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.hpp' \) -print0 2>/dev/null)
  return $bad
}

self_test() {
  local tmp fail=0 out
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$tmp"/src/{wire,net,core,transport,verbs} "$tmp"/tools "$tmp"/tests/unit/core "$tmp"/fuzz "$tmp"/tests/newdir
  echo '#include "wire/opcode.h"' >"$tmp/src/transport/ok.cpp"
  echo '#include <net/if.h>' >"$tmp/src/core/sys_ok.cpp"
  echo '#include "mr.h"' >"$tmp/src/core/local_ok.cpp"
  if ! out=$(check "$tmp"); then
    echo "self-test: a clean tree was rejected:"; echo "$out"; fail=1
  fi
  # Each planted file must be reported, by name.
  local -A planted=(
    [src/core/up.cpp]='#include "transport/engine.h"'
    [src/net/escape.cpp]='#include "../core/mr.h"'
    [src/wire/angle.cpp]='#include <net/udp_port.h>'
    [src/core/abi.h]='#include <infiniband/verbs.h>'
    [tools/t.cpp]='#include "transport/qp.h"'
    [tests/unit/core/t.cpp]='#  include "net/registry.h"'
    [tests/newdir/t.cpp]='#include <cstdio>'
  )
  : >"$tmp/src/net/udp_port.h"
  local f
  for f in "${!planted[@]}"; do echo "${planted[$f]}" >"$tmp/$f"; done
  out=$(check "$tmp") && { echo "self-test: planted violations passed the check"; fail=1; }
  for f in "${!planted[@]}"; do
    grep -q "^$f:" <<<"$out" || { echo "self-test: not caught: $f (${planted[$f]})"; fail=1; }
  done
  for f in src/transport/ok.cpp src/core/sys_ok.cpp src/core/local_ok.cpp; do
    grep -q "^$f:" <<<"$out" && { echo "self-test: wrongly reported: $f"; fail=1; }
  done
  return $fail
}

# The module rows of the table (src/ only) as a markdown table; a module's own name is left out.
markdown() {
  echo "| module | may include |"
  echo "|---|---|"
  local prefix mods m out
  while read -r prefix mods; do
    [[ $prefix == src/* ]] || continue
    out=""
    for m in $mods; do
      [[ $m == "${prefix#src/}" || $m == - ]] && continue
      out+="${out:+, }$m"
    done
    echo "| \`$prefix\` | ${out:-—} |"
  done <<<"$TABLE"
}

# FILE's lines between the markers must be exactly markdown()'s output.
check_docs() {
  local file=$1 have want
  have=$(sed -n '/<!-- layers:begin/,/<!-- layers:end/{/<!-- layers:/d;p}' "$file")
  want=$(markdown)
  if [[ $have != "$want" ]]; then
    echo "$file: its layer table differs from tools/check_layers.sh; put this between the markers:"
    echo "$want"
    return 1
  fi
  echo "layers: $file shows the table"
}

if [[ ${1:-} == --markdown ]]; then
  markdown
  exit
fi
if [[ ${1:-} == --docs ]]; then
  check_docs "${2:-$(cd "$(dirname "$0")/.." && pwd)/docs/architecture.md}"
  exit
fi
if [[ ${1:-} == --self-test ]]; then
  self_test && echo "layer check self-test: ok"
  exit
fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
if check "$root"; then
  echo "layers: every include follows the module graph"
else
  echo "layers: violations above (table in tools/check_layers.sh)"
  exit 1
fi
