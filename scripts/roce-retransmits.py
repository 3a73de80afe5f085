#!/usr/bin/env python3
"""Retransmitted RoCEv2 requests in a pcap (Ethernet or raw IPv4 link type), per sender.

  roce-retransmits.py FILE.pcap...

For each file prints one line: the packets, and per source address how many request packets
(BTH opcode other than ACKNOWLEDGE) repeat a (source, destination QP, PSN) already seen, i.e.
were retransmitted (go-back-N after a timeout or a NAK, or a duplicate on the wire). A
diagnostic for the softverbs <-> rxe runs; it decodes nothing beyond the BTH.
"""
import collections
import struct
import sys

ACK = 0x11
ROCE_PORT = 4791


def packets(path):
    """The link type and the frames of a classic pcap file (micro- or nanosecond)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return 1, []
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    link = struct.unpack(endian + "I", data[20:24])[0]
    frames, off = [], 24
    while off + 16 <= len(data):
        caplen = struct.unpack(endian + "I", data[off + 8:off + 12])[0]
        frames.append(data[off + 16:off + 16 + caplen])
        off += 16 + caplen
    return link, frames


def bth(link, frame):
    """(source IPv4, opcode, destination QP, PSN) of a RoCEv2 frame, or None."""
    ip = 14 if link == 1 else 0
    if link == 1 and frame[12:14] != b"\x08\x00":
        return None
    if len(frame) < ip + 20 or frame[ip] >> 4 != 4 or frame[ip + 9] != 17:
        return None
    udp = ip + (frame[ip] & 15) * 4
    if len(frame) < udp + 20 or struct.unpack(">H", frame[udp + 2:udp + 4])[0] != ROCE_PORT:
        return None
    b = udp + 8
    src = ".".join(str(x) for x in frame[ip + 12:ip + 16])
    qp = struct.unpack(">I", frame[b + 4:b + 8])[0] & 0xFFFFFF
    psn = struct.unpack(">I", frame[b + 8:b + 12])[0] & 0xFFFFFF
    return src, frame[b], qp, psn


def summary(path):
    link, frames = packets(path)
    seen, repeats, sent = set(), collections.Counter(), collections.Counter()
    for frame in frames:
        got = bth(link, frame)
        if got is None or got[1] == ACK:
            continue
        src, _, qp, psn = got
        sent[src] += 1
        if (src, qp, psn) in seen:
            repeats[src] += 1
        seen.add((src, qp, psn))
    per = ", ".join(f"{s}: {repeats[s]} of {sent[s]} requests retransmitted" for s in sorted(sent))
    return f"{path}: {len(frames)} packets; {per or 'no requests'}"


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for path in argv[1:]:
        print(summary(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
