#!/usr/bin/env python3
"""Recompute the RoCEv2 ICRC of every packet in a libpcap capture, independently of both stacks.

Usage: icrc_check.py CAPTURE.pcap
Prints, per IPv4 source address, how many RoCEv2 packets (UDP dst 4791) carry a correct ICRC and
how many do not, then one line per bad packet (at most 10). Exit status 0 when every packet is
correct and at least one was seen.

The ICRC (IBTA Vol 1 Annex A17.3.3) is the Ethernet CRC-32 over: 8 bytes of ones standing in for
the LRH, the IPv4 header with TOS, TTL and header checksum set to ones, the UDP header with the
checksum set to ones, the BTH with its reserved byte 4 (FECN/BECN) set to ones, and the rest of
the packet up to the ICRC, which is stored least significant byte first. Written from the spec so
that it checks softrdma and the kernel alike (the kernel sets the IP identification, softrdma
sends 0; the CRC covers it either way).
"""
import struct
import sys
import zlib


def packets(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack_from("<I", data, 0)[0]
    if magic in (0xA1B2C3D4, 0xA1B23C4D):
        endian = "<"
    elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
        endian = ">"
    else:
        raise SystemExit(f"{path}: not a libpcap file (write it with tshark -F pcap)")
    linktype = struct.unpack_from(endian + "I", data, 20)[0]
    if linktype != 1:
        raise SystemExit(f"{path}: link type {linktype}, expected Ethernet (1)")
    off = 24
    n = 0
    while off + 16 <= len(data):
        _, _, caplen, origlen = struct.unpack_from(endian + "IIII", data, off)
        off += 16
        n += 1
        yield n, data[off:off + caplen], caplen == origlen
        off += caplen


def expected_icrc(ip, udp, ib_without_icrc):
    ip = bytearray(ip)
    ip[1] = 0xFF           # TOS: DSCP/ECN may change in flight
    ip[8] = 0xFF           # TTL
    ip[10:12] = b"\xff\xff"  # header checksum
    udp = bytearray(udp)
    udp[6:8] = b"\xff\xff"   # UDP checksum
    bth = bytearray(ib_without_icrc[:12])
    bth[4] = 0xFF            # resv8a (FECN/BECN)
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth) + ib_without_icrc[12:])


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    stats = {}
    bad = []
    for n, frame, complete in packets(sys.argv[1]):
        if len(frame) < 14 or struct.unpack_from(">H", frame, 12)[0] != 0x0800:
            continue
        ihl = (frame[14] & 0x0F) * 4
        ip = frame[14:14 + ihl]
        if ip[9] != 17:
            continue
        udp = frame[14 + ihl:14 + ihl + 8]
        if struct.unpack_from(">H", udp, 2)[0] != 4791:
            continue
        src = ".".join(str(b) for b in ip[12:16])
        ok_bad = stats.setdefault(src, [0, 0])
        total_len = struct.unpack_from(">H", ip, 2)[0]
        ib = frame[14 + ihl + 8:14 + total_len]  # Ethernet padding excluded
        if not complete or len(ib) < 16:
            ok_bad[1] += 1
            bad.append(f"frame {n} from {src}: truncated")
            continue
        stored = struct.unpack_from("<I", ib, len(ib) - 4)[0]
        want = expected_icrc(ip, udp, ib[:-4])
        if stored == want:
            ok_bad[0] += 1
        else:
            ok_bad[1] += 1
            bad.append(f"frame {n} from {src}: ICRC 0x{stored:08x}, expected 0x{want:08x} "
                       f"(opcode 0x{ib[0]:02x}, IP id 0x{struct.unpack_from('>H', ip, 4)[0]:04x})")
    for src, (ok, nbad) in sorted(stats.items()):
        print(f"icrc: {src}: {ok} correct, {nbad} wrong")
    for line in bad[:10]:
        print("icrc: BAD " + line)
    seen = sum(a + b for a, b in stats.values())
    sys.exit(0 if seen and not bad else 1)


if __name__ == "__main__":
    main()
