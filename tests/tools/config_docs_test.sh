#!/usr/bin/env bash
# tools.config_docs: the table of environment variables in docs/debugging.md is the configuration
# table's own (`softrdma config --markdown`, src/config/config.cpp), and every SOFTRDMA_* variable the
# sources, tests and scripts read is in that table.
#   tests/tools/config_docs_test.sh SOFTRDMA           check
#   tests/tools/config_docs_test.sh SOFTRDMA --write   rewrite the block in docs/debugging.md
set -euo pipefail
softrdma=${1:?usage: config_docs_test.sh SOFTRDMA [--write]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
doc=$root/docs/debugging.md
begin='<!-- BEGIN softrdma config --markdown -->'
end='<!-- END softrdma config --markdown -->'
fail=0

want=$("$softrdma" config --markdown)
if [[ ${2:-} == --write ]]; then
  awk -v b="$begin" -v e="$end" -v t="$want" '
    $0 == b { print; print t; skip = 1; next }
    $0 == e { skip = 0 }
    !skip' "$doc" >"$doc.new"
  mv "$doc.new" "$doc"
  echo "wrote the table into $doc"
  exit 0
fi

grep -qxF "$begin" "$doc" && grep -qxF "$end" "$doc" || { echo "FAIL: $doc lacks the markers $begin / $end"; exit 1; }
got=$(awk -v b="$begin" -v e="$end" '$0 == e { on = 0 } on; $0 == b { on = 1 }' "$doc")
if [[ $got != "$want" ]]; then
  echo "FAIL: docs/debugging.md's table differs from \`softrdma config --markdown\` (< doc, > table);"
  echo "      rewrite it with: tests/tools/config_docs_test.sh build/bin/softrdma --write"
  diff <(echo "$got") <(echo "$want") || true
  fail=1
fi

# Every variable read anywhere: getenv/setenv/unsetenv in C++, $VAR, ${VAR and VAR= in scripts.
listed=$(grep -o '^| `SOFTRDMA_[A-Z0-9_]*`' <<<"$want" | tr -d '|` ' | sort -u)
read_c=$(grep -rhoE '(getenv|setenv|unsetenv)\("SOFTRDMA_[A-Z0-9_]+"' "$root"/src "$root"/tools "$root"/tests \
  "$root"/fuzz 2>/dev/null | grep -oE 'SOFTRDMA_[A-Z0-9_]+' || true)
read_sh=$(find "$root"/tools "$root"/tests "$root"/bench -name '*.sh' -print0 2>/dev/null |
  xargs -0 grep -hoE '(\$\{?SOFTRDMA_[A-Z0-9_]+|\bSOFTRDMA_[A-Z0-9_]+=)' | grep -oE 'SOFTRDMA_[A-Z0-9_]+' || true)
for v in $(printf '%s\n%s\n' "$read_c" "$read_sh" | sort -u); do
  grep -qxF "$v" <<<"$listed" || { echo "FAIL: $v is read but not in the table (src/config/config.cpp)"; fail=1; }
done
(( fail == 0 )) && echo "config docs: docs/debugging.md matches the table; every variable read is listed"
exit $fail
