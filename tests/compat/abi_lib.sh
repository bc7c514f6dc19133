# ELF helpers of the ABI tests (loader_test.sh, stubs_test.sh): what a library exports and what a
# binary imports, as binutils' objdump and readelf see them. Sourced, not run.

# abi_exports LIB: "VERSION symbol" for each defined dynamic symbol, the version in parentheses
# for a compat (non-default) version, e.g. "(MLX5_1.0) mlx5dv_init_obj"; each version node also
# appears as its own absolute symbol, "MLX5_1.0 MLX5_1.0". Sorted.
abi_exports() {
  objdump -T "$1" | awk '/^[0-9a-f]+ / && $0 !~ /\*UND\*/ {print $(NF-1), $NF}' | sort -u
}

# abi_version_nodes LIB: "NODE PARENT..." for each version node LIB defines, in file order (the
# file's own base definition, named after its soname, left out).
abi_version_nodes() {
  objdump -p "$1" | awk '
    /^Version definitions:/ { d = 1; next }
    d && /^$/ { exit }
    d && $2 == "0x01" { next }                       # VER_FLG_BASE: the soname itself
    d && /^[0-9]+ / { if (line) print line; line = $4; next }
    d && NF { line = line " " $1 }
    END { if (line) print line }'
}

# abi_needed FILE: its DT_NEEDED entries, one a line.
abi_needed() {
  readelf -d "$1" 2>/dev/null | awk '/\(NEEDED\)/ {gsub(/[][]/, "", $NF); print $NF}'
}

# abi_imports FILE: "SONAME VERSION symbol" for each versioned undefined dynamic symbol, SONAME
# being the library its version reference names ("required from"); then "SONAME VERSION -" for
# each version reference, which the loader checks even when no symbol uses it. Sorted.
abi_imports() {
  {
    objdump -p "$1" | awk '
      /^Version References:/ { r = 1; next }
      r && /required from/ { lib = $3; sub(/:$/, "", lib); next }
      r && /^ +0x/ { print "REF", lib, $4; next }
      r && !NF { exit }'
    objdump -T "$1" | awk '/\*UND\*/ && $(NF-1) ~ /^\(.*\)$/ { v = $(NF-1); gsub(/[()]/, "", v); print "UND", v, $NF }'
  } | awk '
    $1 == "REF" { lib[$3] = $2; print $2, $3, "-"; next }
    $1 == "UND" && ($2 in lib) { print lib[$2], $2, $3 }' | sort -u
}

# abi_sanitizer_preload LIB: the sanitizer runtimes LIB links (an ASan/UBSan build), ':'-separated;
# a program that is not instrumented must load them first. Empty for a plain build.
abi_sanitizer_preload() {
  ldd "$1" 2>/dev/null | awk '/lib(asan|ubsan)\.so/ {printf "%s%s", sep, $3; sep = ":"}'
}
