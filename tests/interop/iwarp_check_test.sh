#!/usr/bin/env bash
# interop.iwarp_check: iwarp_check.py accepts the siw captures in siw-frames/ (siw <-> siw, stock,
# CRC, peer-to-peer, multi-FPDU messages) and finds a flipped byte, a wrong CRC flag and a hole.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHECK=$HERE/iwarp_check.py
fail=0
expect() { # WANT_RC DESCRIPTION ARGS...
  local want=$1 what=$2 rc=0
  shift 2
  python3 "$CHECK" "$@" >/tmp/iwarp_check_test.$$ 2>&1 || rc=$?
  if ((rc == want)); then echo "ok: $what"; else echo "FAIL: $what (exit $rc, wanted $want)"; cat /tmp/iwarp_check_test.$$; fail=1; fi
}
expect 0 "rping stock" --crc 0 "$HERE/siw-frames/rping-stock.pcap"
expect 0 "rping crc" --crc 1 "$HERE/siw-frames/rping-crc.pcap"
expect 0 "rping p2p (zero-length WRITE RTR)" --crc 0 "$HERE/siw-frames/rping-p2p.pcap"
expect 0 "rping 9000 B (multi-FPDU)" --crc 0 "$HERE/siw-frames/rping-9000B.pcap"
expect 1 "CRC expected but off" --crc 1 "$HERE/siw-frames/rping-stock.pcap"
expect 1 "--host with no such peer" --host 10.9.9.9 "$HERE/siw-frames/rping-stock.pcap"
# Flip one payload byte of the last frame of the CRC capture (a Send, inside its FPDU): CRC fault.
tmp=$(mktemp)
python3 - "$HERE/siw-frames/rping-crc.pcap" "$tmp" <<'PY'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
# the last data-carrying frame: walk the records, remember the last with TCP payload
off, last = 24, None
while off + 16 <= len(d):
    caplen = int.from_bytes(d[off + 8:off + 12], "little")
    rec = off + 16
    ihl = (d[rec + 14] & 15) * 4
    tcp = rec + 14 + ihl
    doff = (d[tcp + 12] >> 4) * 4
    if caplen > 14 + ihl + doff + 20:
        last = tcp + doff
    off = rec + caplen
d[last + 20] ^= 0x01
open(sys.argv[2], "wb").write(d)
PY
expect 1 "one flipped byte under CRC" "$tmp"
rm -f "$tmp" /tmp/iwarp_check_test.$$
exit $fail
