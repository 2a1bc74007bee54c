#!/usr/bin/env python3
"""fault_numbers.py — the four numbers fault-tolerant MoE serving is compared by (EEP's), from
the fault suite's client timelines (client.sh writes "<ms> <kind>" per request to LOG.t):

  pause    the longest time with no request answered, from the last answer before the fault
           to the end of the case
  back95   from the fault until the first WINDOW_MS window whose answers reach 95 % of the
           rate before the fault (the PRE_MS before it); "-" when none does before the end
  reint    the longest time with no answer from the last answer before the lost process came
           back (RESTORE) until the end of the case; "-" without RESTORE
  rate     answers per second before the fault (the baseline of back95)

  fault_numbers.py T0 RESTORE END TIMELINE...     (ms since the Unix epoch; RESTORE may be -)

Prints "pause_ms back95_ms reint_ms rate_per_s". Only OK answers count: a failed request is
no completion.
"""
import sys

PRE_MS = 5000
WINDOW_MS = 2000


def load(paths):
    t = []
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 2 and parts[1] == "OK":
                        t.append(int(parts[0]))
        except FileNotFoundError:
            pass
    return sorted(t)


def longest_gap(t, start, end):
    """The longest run with no answer in [start, end], counted from the last answer before."""
    before = [x for x in t if x <= start]
    pts = [before[-1] if before else start] + [x for x in t if start < x <= end] + [end]
    return max(b - a for a, b in zip(pts, pts[1:]))


def back95(t, t0, end, rate):
    need = 0.95 * rate * WINDOW_MS / 1000.0
    for s in [t0] + [x for x in t if t0 < x <= end - WINDOW_MS]:
        if sum(1 for x in t if s <= x < s + WINDOW_MS) >= need:
            return s - t0
    return None


def main():
    t0, restore, end = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    t = load(sys.argv[4:])
    pre = [x for x in t if t0 - PRE_MS <= x < t0]
    rate = len(pre) * 1000.0 / PRE_MS
    pause = longest_gap(t, t0, end)
    b = back95(t, t0, end, rate) if rate > 0 else None
    r = longest_gap(t, int(restore), end) if restore != "-" else None
    print(pause, "-" if b is None else b, "-" if r is None else r, "%.1f" % rate)


if __name__ == "__main__":
    main()
