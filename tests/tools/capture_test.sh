#!/usr/bin/env bash
# tools.capture: `softrdma capture` of capture_writer (an RDMA WRITE and a SEND between two QPs, known
# PSNs and bytes), once by packets (SOFTRDMA_DIRECT=0) and once by the direct path, read back by tshark
# (capture_check.py: opcodes, PSNs, payload bytes, the direct path's synthetic frames) and every ICRC
# recomputed (tests/interop/icrc_check.py); then rping over the encrypted wire, whose frames must all
# be the unsealed packets, noted as such.
#   tests/tools/capture_test.sh SOFTRDMA CAPTURE_WRITER
set -euo pipefail
softrdma=${1:?usage: capture_test.sh SOFTRDMA CAPTURE_WRITER}
writer=${2:?usage: capture_test.sh SOFTRDMA CAPTURE_WRITER}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v tshark >/dev/null || { echo "SKIP: tshark is not installed (tools/setup-deps.sh)"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-capture.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dev=$("$softrdma" devices --ip 127.0.0.1 | head -n1)

for mode in packets direct; do
  direct=1
  [[ $mode == packets ]] && direct=0
  said=$(SOFTRDMA_DIRECT=$direct "$softrdma" capture -w "$tmp/$mode.pcapng" -- "$writer" "$dev")
  echo "$mode: capture_writer: $said"
  python3 "$here/capture_check.py" "$tmp/$mode.pcapng" "$said" "$mode"
  tshark -r "$tmp/$mode.pcapng" -F pcap -w "$tmp/$mode.pcap" 2>/dev/null
  python3 "$here/../interop/icrc_check.py" "$tmp/$mode.pcap"
done
# The protected wire (encrypted): rping through librdmacm, whose connection sets up the keys. Every
# frame must be the unsealed form, so the ping text shows in the clear, with its ICRC.
if command -v rping >/dev/null; then
  bound() { awk -v p=":$(printf '%04X' "$1")" 'NR>1 && substr($2, length($2)-4)==p { f=1 } END { exit !f }' /proc/net/udp; }
  port=$((20000 + RANDOM % 20000))
  while bound "$port"; do port=$((port + 1)); done
  hex=$(printf '%04X' "$port")
  cat >"$tmp/pair.sh" <<PAIR
rping -s -a 127.0.0.1 -p $port -C 1 -v & srv=\$!
# The server is ready once its CM socket holds UDP $port.
for i in \$(seq 300); do
  awk 'NR>1 && substr(\$2, length(\$2)-4)==":$hex" { f=1 } END { exit !f }' /proc/net/udp && break
  sleep 0.1
done
rping -c -a 127.0.0.1 -p $port -C 1 -v; cli=\$?
wait \$srv; exit \$((cli | \$?))
PAIR
  SOFTRDMA_DIRECT=0 SOFTRDMA_WIRE_PROTECT=encrypt SOFTRDMA_AUTH_KEY=00112233445566778899aabbccddeeff \
    timeout 60 "$softrdma" capture -w "$tmp/protected.pcapng" -- bash "$tmp/pair.sh"
  all=$(tshark -r "$tmp/protected.pcapng" 2>/dev/null | wc -l)
  noted=$(tshark -r "$tmp/protected.pcapng" -Y 'frame.comment contains "protected wire: sent sealed"' 2>/dev/null | wc -l)
  ((all > 0 && noted == all)) || { echo "FAIL: protected: $noted of $all frames carry the protected note"; exit 1; }
  ping=$(python3 -c 'print(b"rdma-ping-0: ABCDEFGH".hex())')
  tshark -r "$tmp/protected.pcapng" -T fields -e data.data 2>/dev/null | grep -q "$ping" \
    || { echo "FAIL: protected: no frame shows the ping in the clear"; exit 1; }
  tshark -r "$tmp/protected.pcapng" -F pcap -w "$tmp/protected.pcap" 2>/dev/null
  python3 "$here/../interop/icrc_check.py" "$tmp/protected.pcap"
  echo "protected: $all frames, each unsealed and noted, the ping in the clear"
else
  echo "protected: skipped (no rping: rdmacm-utils)"
fi
echo "PASS: the captures decode as sent, every ICRC correct"
