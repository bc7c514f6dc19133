#!/usr/bin/env python3
"""tools.capture's checker: a pcapng of capture_writer (tests/tools/capture_writer.cpp), decoded by tshark.

Usage: capture_check.py CAPTURE.pcapng 'a_qpn=0x.. b_qpn=0x.. a_psn=0x.. write_len=N send_text=T' packets|direct

Checks, against what the program says it sent:
- every frame decodes as RoCEv2 (InfiniBand BTH), none malformed;
- the requests to QP b, first copy of each PSN: RC RDMA WRITE FIRST, MIDDLE, LAST (opcodes 6, 7, 8) then
  SEND ONLY (4); by packets their PSNs run a_psn .. a_psn+3, the direct path's synthetic frames each start
  at a_psn (it consumes no PSN) and carry its note;
- the WRITE's payload bytes are the pattern (i * 7 + 3) & 0xff, its RETH DMA length write_len, the SEND's
  payload send_text;
- by packets, QP a received ACKs (opcode 17) and no frame carries the direct path's note.
The ICRCs are recomputed by tests/interop/icrc_check.py (the caller runs it).
"""
import subprocess
import sys

WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, SEND_ONLY, ACK = 6, 7, 8, 4, 17
DIRECT_NOTE = "softrdma direct path"


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def main():
    path, said, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    sent = dict(kv.split("=", 1) for kv in said.split())
    a_qpn, b_qpn, a_psn = int(sent["a_qpn"], 16), int(sent["b_qpn"], 16), int(sent["a_psn"], 16)
    write_len, send_text = int(sent["write_len"]), sent["send_text"].encode()
    fields = ["frame.number", "infiniband.bth.opcode", "infiniband.bth.psn", "infiniband.bth.destqp",
              "infiniband.reth.dmalen", "data.data", "frame.comment", "_ws.malformed"]
    out = subprocess.run(["tshark", "-r", path, "-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]
                         + [a for f in fields for a in ("-e", f)], capture_output=True, text=True, check=True).stdout
    frames = [dict(zip(fields, line.split("|"))) for line in out.splitlines()]
    if not frames:
        fail("no frames")
    for f in frames:
        if not f["infiniband.bth.opcode"] or f["_ws.malformed"]:
            fail(f"frame {f['frame.number']} does not decode as RoCEv2: {f}")
    to_b = [f for f in frames if int(f["infiniband.bth.destqp"], 16) == b_qpn]
    requests, seen = [], set()
    for f in to_b:
        key = (int(f["infiniband.bth.opcode"]), int(f["infiniband.bth.psn"]), f["data.data"])
        if key not in seen:  # a retransmission repeats its packet
            seen.add(key)
            requests.append(f)
    opcodes = [int(f["infiniband.bth.opcode"]) for f in requests]
    if opcodes != [WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, SEND_ONLY]:
        fail(f"requests to QP {b_qpn:#x}: opcodes {opcodes}, expected WRITE FIRST/MIDDLE/LAST, SEND ONLY")
    psns = [int(f["infiniband.bth.psn"]) for f in requests]
    want_psns = [a_psn + i for i in range(4)] if mode == "packets" else [a_psn, a_psn + 1, a_psn + 2, a_psn]
    if psns != want_psns:
        fail(f"PSNs {[hex(p) for p in psns]}, expected {[hex(p) for p in want_psns]}")
    if int(requests[0]["infiniband.reth.dmalen"] or -1) != write_len:
        fail(f"RETH DMA length {requests[0]['infiniband.reth.dmalen']}, expected {write_len}")
    written = b"".join(bytes.fromhex(f["data.data"]) for f in requests[:3])
    if written != bytes((i * 7 + 3) & 0xFF for i in range(write_len)):
        fail(f"the WRITE's {len(written)} payload bytes are not the program's {write_len}")
    if bytes.fromhex(requests[3]["data.data"]) != send_text:
        fail(f"the SEND's payload is {requests[3]['data.data']}, expected {send_text.hex()}")
    noted = [DIRECT_NOTE in f["frame.comment"] for f in requests]
    if mode == "direct" and not all(noted):
        fail("a direct-path frame lacks its note")
    if mode == "packets":
        if any(DIRECT_NOTE in f["frame.comment"] for f in frames):
            fail("a frame by packets carries the direct path's note")
        acks = [f for f in frames if int(f["infiniband.bth.destqp"], 16) == a_qpn
                and int(f["infiniband.bth.opcode"]) == ACK]
        if not acks:
            fail(f"no ACK to QP {a_qpn:#x}")
    print(f"capture ({mode}): {len(frames)} frames, requests {opcodes} at PSNs {[hex(p) for p in psns]}, "
          f"{write_len} WRITE bytes and the SEND's {len(send_text)} as sent")


if __name__ == "__main__":
    main()
