#!/usr/bin/env python3
"""Reads the trace tests/vm/departures.sh writes and shows where the departures ran over the
rate: the busiest windows, and what the packets in them were (retransmissions, a flow's first
packet after it idled, packets of flows that were sending anyway).

Usage: departures.py TRACE RATE_MBIT [WINDOW_MS]
"""

import re
import sys
from collections import defaultdict

# Ethernet + IPv4 + TCP with timestamps: what tcpdump's "length" (the payload) leaves out.
TCP_HEADERS = 14 + 20 + 32
ICMP_FRAME = 14 + 20 + 64

LINE = re.compile(
    r"^(?P<t>\d+\.\d+) IP (?P<src>[\d.]+?)(?:\.(?P<sport>\d+))? > (?P<dst>[\d.]+?)(?:\.(?P<dport>\d+))?: "
    r"(?P<rest>.*)$"
)
SEQ = re.compile(r"seq (\d+):(\d+)")
LENGTH = re.compile(r"length (\d+)")


def frames(path):
    """(time s, flow, wire bytes, seq end or None) of every frame leaving the shaped side."""
    for line in open(path):
        m = LINE.match(line)
        if not m or m["src"] != "10.9.0.1":
            continue
        rest = m["rest"]
        if "ICMP" in rest:
            yield float(m["t"]), "icmp", ICMP_FRAME, None
            continue
        length = LENGTH.search(rest)
        payload = int(length.group(1)) if length else 0
        seq = SEQ.search(rest)
        end = int(seq.group(2)) if seq else None
        yield float(m["t"]), m["sport"], payload + TCP_HEADERS, end


def main():
    path, rate_mbit = sys.argv[1], float(sys.argv[2])
    window = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.1
    rows = list(frames(path))
    if not rows:
        sys.exit("no frames in the trace")
    start = rows[0][0]
    # Classify each frame: a retransmission (its end not beyond what the flow sent before), a
    # flow's first frame after an idle gap, or a frame of a flow sending anyway. Long gaps in a
    # flow's data are TCP senders that stalled (a retransmission timeout, or the probe timer
    # after a drop that left them nothing in flight).
    highest = {}
    last_seen = {}
    kinds = []
    stalls = dict.fromkeys((0.08, 0.2, 0.4), 0)
    for t, flow, wire, end in rows:
        kind = "data"
        if flow == "icmp":
            kind = "ping"
        elif end is not None:
            gap = t - last_seen.get(flow, t)
            if flow in highest and end <= highest[flow]:
                kind = "retransmit"
            elif gap > 0.040:
                kind = "after idle"
            for threshold in stalls:
                stalls[threshold] += gap > threshold
            highest[flow] = max(highest.get(flow, 0), end)
        last_seen[flow] = t
        kinds.append(kind)
    # Sliding windows starting at each frame.
    capacity = rate_mbit * 1e6 / 8 * window
    j = 0
    total = 0
    worst = []
    for i, (t, _, wire, _) in enumerate(rows):
        while j < len(rows) and rows[j][0] < t + window:
            total += rows[j][2]
            j += 1
        worst.append((total, i, j))
        total -= wire
    worst.sort(reverse=True)
    duration = rows[-1][0] - start
    sent = sum(r[2] for r in rows)
    print(
        f"{len(rows)} frames in {duration:.2f} s, {sent * 8 / duration / 1e6:.2f} Mbit/s on average "
        f"(rate {rate_mbit} Mbit/s); windows of {window * 1000:.0f} ms hold {capacity / 1000:.1f} KB"
    )
    shown = []
    for total, i, j in worst:
        t = rows[i][0]
        if any(abs(t - s) < window for s in shown):
            continue
        shown.append(t)
        mix = defaultdict(int)
        flows = set()
        for k in range(i, j):
            mix[kinds[k]] += rows[k][2]
            flows.add(rows[k][1])
        parts = ", ".join(f"{k} {v / 1000:.1f} KB" for k, v in sorted(mix.items()))
        print(
            f"  at {t - start:6.3f} s: {total / 1000:5.1f} KB ({total / capacity * 100:3.0f} % of the rate), "
            f"{len(flows)} flows: {parts}"
        )
        if len(shown) == 8:
            break
    print(
        "gaps in a flow's data longer than "
        + ", ".join(f"{k * 1000:.0f} ms: {v}" for k, v in sorted(stalls.items()))
    )
    print("per second: Mbit/s")
    second = defaultdict(int)
    for t, _, wire, _ in rows:
        second[int(t - start)] += wire
    for s in sorted(second):
        print(f"  {s:3d}: {second[s] * 8 / 1e6:5.2f}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        pass
