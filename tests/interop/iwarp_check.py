#!/usr/bin/env python3
"""Check every MPA frame and FPDU in a libpcap capture of iWARP connections, independently of both
stacks (written from RFC 5044, RFC 6581, RFC 5041 and RFC 5040).

Usage: iwarp_check.py [--crc 0|1] [--host IP] CAPTURE.pcap

Each TCP connection is reassembled per direction (by sequence number; retransmitted bytes are
taken once). The first bytes of each direction must be an MPA request (initiator) or reply
(responder): key, revision 2, Enhanced set, M clear, PD_Length >= 4, the RFC 6581 IRD/ORD words.
The CRC flag of the two frames must agree (and equal --crc if given). After the frames, the stream
must be a sequence of FPDUs without markers: MPA length, ULPDU, pad to 4, CRC. Each FPDU is
checked: CRC32c recomputed (least significant byte first on the wire) or, without CRC, all zero;
DDP version (DV) 1 and RDMAP version (RV) 1; an opcode iWARP defines; the header length the opcode
needs; untagged messages on their queue (QN 0 Send, 1 Read Request, 2 Terminate) with the MSN
starting at 1 and advancing by one per message and the MO advancing with the data. A peer-to-peer
RTR (zero-length Write or Read Request, or a Send) is recognised as the first FPDU.

Prints per source address how many FPDUs of each kind were good and bad, then up to 10 faults.
Exit status 0 when nothing is bad and FPDUs were seen from both directions of some connection
(and from --host, if given).
"""
import argparse
import struct
import sys

KEY_REQ = b"MPA ID Req Frame"
KEY_REP = b"MPA ID Rep Frame"
OPCODES = {0: "Write", 1: "Read Request", 2: "Read Response", 3: "Send", 4: "Send Invalidate",
           5: "Send SE", 6: "Send SE Invalidate", 7: "Terminate"}


def crc32c(data):
    table = crc32c.table
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


crc32c.table = _table()


def packets(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack_from("<I", data, 0)[0]
    if magic in (0xA1B2C3D4, 0xA1B23C4D):
        e = "<"
    elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
        e = ">"
    else:
        raise SystemExit(f"{path}: not a libpcap file (write it with tshark -F pcap)")
    if struct.unpack_from(e + "I", data, 20)[0] != 1:
        raise SystemExit(f"{path}: expected Ethernet link type")
    off = 24
    while off + 16 <= len(data):
        _, _, caplen, _ = struct.unpack_from(e + "IIII", data, off)
        off += 16
        yield data[off:off + caplen]
        off += caplen


def tcp_streams(path):
    """{(src, sport, dst, dport): bytes} per direction, reassembled by sequence number."""
    segs, isn = {}, {}
    for frame in packets(path):
        if len(frame) < 14 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 6:
            continue
        total = struct.unpack_from(">H", ip, 2)[0]
        src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack_from(">HHI", tcp, 0)
        doff = (tcp[12] >> 4) * 4
        flags = tcp[13]
        key = (src, sport, dst, dport)
        if flags & 0x02:  # SYN
            isn[key] = seq + 1
        payload = tcp[doff:]
        if payload:
            segs.setdefault(key, []).append((seq, payload))
    out = {}
    for key, lst in segs.items():
        base = isn.get(key, min(s for s, _ in lst))
        buf = bytearray()
        for seq, p in sorted(lst, key=lambda x: (x[0] - base) & 0xFFFFFFFF):
            rel = (seq - base) & 0xFFFFFFFF
            if rel > len(buf):
                break  # a hole: the capture lost a segment; check what is contiguous
            buf += p[len(buf) - rel:]
        out[key] = bytes(buf)
    return out


class Side:
    def __init__(self, name):
        self.name = name
        self.msn = {0: 0, 1: 0, 2: 0}
        self.mo = {0: 0, 1: 0, 2: 0}
        self.first = True


def parse_mpa(buf, want_key):
    if len(buf) < 20:
        return None, "stream shorter than an MPA frame"
    key = buf[:16]
    if key != want_key:
        return None, f"MPA key {key!r}, expected {want_key!r}"
    flags, rev, pdlen = buf[16], buf[17], struct.unpack_from(">H", buf, 18)[0]
    info = {"M": flags >> 7 & 1, "C": flags >> 6 & 1, "R": flags >> 5 & 1, "E": flags >> 4 & 1,
            "rev": rev, "pd_len": pdlen, "len": 20 + pdlen}
    if rev != 2:
        return info, f"MPA revision {rev}, expected 2"
    if not info["E"]:
        return info, "Enhanced flag clear"
    if info["M"]:
        return info, "markers requested"
    if pdlen < 4 or len(buf) < 20 + pdlen:
        return info, f"PD_Length {pdlen} (RFC 6581 needs the 4 IRD/ORD bytes)"
    ird, ord_ = struct.unpack_from(">HH", buf, 20)
    info.update(p2p=ird >> 15, ird=ird & 0x3FFF, ord=ord_ & 0x3FFF, z_write=ord_ >> 15 & 1,
                r_read=ord_ >> 14 & 1)
    return info, None


def check_fpdus(buf, crc_on, side, stats, faults, conn):
    off = 0
    while off < len(buf):
        if off + 2 > len(buf):
            break  # truncated at the end of the capture
        ulpdu = struct.unpack_from(">H", buf, off)[0]
        pad = (-(2 + ulpdu)) % 4
        end = off + 2 + ulpdu + pad + 4
        if end > len(buf):
            break  # the capture ended inside this FPDU
        fpdu = buf[off:end]
        off = end
        body, crc = fpdu[:-4], fpdu[-4:]
        kind = "?"
        fault = None
        if ulpdu < 14:
            fault = f"ULPDU length {ulpdu} < 14"
        else:
            ddp, rdmap = fpdu[2], fpdu[3]
            tagged, last, dv = ddp >> 7, ddp >> 6 & 1, ddp & 3
            rv, op = rdmap >> 6, rdmap & 0x0F
            kind = OPCODES.get(op, f"opcode {op}")
            if crc_on and crc32c(body).to_bytes(4, "little") != crc:
                fault = f"CRC {crc.hex()} != {crc32c(body).to_bytes(4, 'little').hex()}"
            elif not crc_on and crc != b"\0\0\0\0":
                fault = f"CRC field {crc.hex()} without CRC negotiated"
            elif dv != 1 or rv != 1:
                fault = f"DV {dv} RV {rv}"
            elif op not in OPCODES:
                fault = "undefined opcode"
            elif tagged != (op in (0, 2)):
                fault = f"T={tagged} for {kind}"
            elif not tagged:
                if ulpdu < 18:
                    fault = f"untagged header needs 18 bytes, ULPDU {ulpdu}"
                else:
                    qn, msn, mo = struct.unpack_from(">III", fpdu, 8)
                    want_qn = {1: 1, 7: 2}.get(op, 0)
                    if qn != want_qn:
                        fault = f"QN {qn} for {kind}"
                    elif msn != side.msn[qn] + 1:
                        fault = f"MSN {msn} on QN {qn}, expected {side.msn[qn] + 1}"
                    elif mo != side.mo[qn]:
                        fault = f"MO {mo} on QN {qn}, expected {side.mo[qn]}"
                    elif op == 1 and ulpdu != 18 + 28:
                        fault = f"Read Request ULPDU {ulpdu}, expected 46"
                    else:
                        side.mo[qn] += ulpdu - 18
                        if last:
                            side.msn[qn] += 1
                            side.mo[qn] = 0
            if fault is None and side.first and tagged and ulpdu == 14 and op == 0:
                kind = "Write (zero length, RTR)"
            if fault is None and side.first and op == 1 and struct.unpack_from(">I", fpdu, 32)[0] == 0:
                kind = "Read Request (zero length, RTR)"
        side.first = False
        s = stats.setdefault(side.name, {})
        good, bad = s.get(kind, (0, 0))
        s[kind] = (good + (fault is None), bad + (fault is not None))
        if fault:
            faults.append(f"{conn}: {kind}: {fault}")
            return  # framing after a bad FPDU cannot be trusted


def main():
    ap = argparse.ArgumentParser(description="check iWARP MPA frames and FPDUs in a pcap")
    ap.add_argument("--crc", type=int, choices=(0, 1))
    ap.add_argument("--host")
    ap.add_argument("pcap")
    a = ap.parse_args()
    streams = tcp_streams(a.pcap)
    stats, faults, conns, both = {}, [], 0, set()
    seen = set()
    for (src, sport, dst, dport), data in streams.items():
        if (dst, dport, src, sport) in seen or not data.startswith(KEY_REQ):
            continue
        seen.add((src, sport, dst, dport))
        conns += 1
        conn = f"{src}:{sport} -> {dst}:{dport}"
        rep = streams.get((dst, dport, src, sport), b"")
        req_i, f1 = parse_mpa(data, KEY_REQ)
        rep_i, f2 = parse_mpa(rep, KEY_REP)
        print(f"connection {conn}: request {req_i}; reply {rep_i}")
        if f1 or f2:
            faults += [f"{conn}: request: {f1}"] if f1 else []
            faults += [f"{conn}: reply: {f2}"] if f2 else []
            continue
        if rep_i["R"]:
            faults.append(f"{conn}: rejected")
            continue
        # A reply may set C where the request did not (a responder that requires CRC, RFC 5044
        # §7.1.3): then CRC runs both ways; the reverse (C dropped by the reply) is a fault below.
        crc_on = bool(req_i["C"] or rep_i["C"])
        if a.crc is not None and crc_on != bool(a.crc):
            faults.append(f"{conn}: CRC {'on' if crc_on else 'off'}, expected {'on' if a.crc else 'off'}")
        if req_i["C"] and not rep_i["C"]:
            faults.append(f"{conn}: the request asked for CRC and the reply did not set it")
        n_before = len(faults)
        init, resp = Side(src), Side(dst)
        check_fpdus(data[req_i["len"]:], crc_on, init, stats, faults, conn)
        check_fpdus(rep[rep_i["len"]:], crc_on, resp, stats, faults, conn + " (reverse)")
        if len(faults) == n_before and not init.first and not resp.first:
            both.update((src, dst))
    for ip in sorted(stats):
        kinds = ", ".join(f"{k} {g}" + (f" ({b} BAD)" if b else "") for k, (g, b) in sorted(stats[ip].items()))
        total = sum(g for g, _ in stats[ip].values())
        print(f"fpdus: {ip}: {total} good: {kinds}")
    for f in faults[:10]:
        print("FAULT", f)
    ok = conns > 0 and not faults and both and (a.host is None or a.host in both)
    print(f"iwarp_check: {conns} connections, {len(faults)} faults: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
