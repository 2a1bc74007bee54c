#!/usr/bin/env python3
"""client_slowloris.py — strangers at a worker's client endpoint announce big frames and stall
(issue 26, defect 6: the old bound was 1 GiB whatever the model, with no idle timeout, so three
connections announcing 1 GiB and sending 300 MiB each held +900 MB for as long as they stayed).

    client_slowloris.py tcp://HOST:PORT WORKER_PID HIDDEN

Speaks ZMTP 3.0 (NULL mechanism) by hand, as a DEALER, so a frame can be announced and never
finished. With the model's bound B = 65536 x HIDDEN x 2 (srv_max_frame) and the stall limit
S = 10 s + B at 16 MiB/s (srv_stall_ms):
  1. 3 connections announce a frame of 1 GiB (above B) and send 24 MiB each: each must be
     closed at once, and the worker's resident memory must not grow by more than 8 MiB;
  2. 3 connections announce a frame of B - 1 bytes (within the bound) and send B / 2 each, then
     stall: the worker holds what they sent (printed), and must close every one within S + 3 s
     of its stall (the resident memory after is printed: libzmq frees the frames, whether the
     allocator returns them to the system is its own affair).
Exit 0 when all hold, 1 with the reason.
"""
import socket
import struct
import sys
import time

GREETING = bytes([0xFF] + [0] * 8 + [0x7F, 3, 0]) + b"NULL" + bytes(16) + bytes([0]) + bytes(31)
READY = bytes([0x04, 28, 5]) + b"READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"DEALER"
CHUNK = bytes(1 << 20)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stranger(host, port, announce, send):
    """A connection that announced a frame of `announce` bytes and sent `send` of it."""
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(GREETING + READY + bytes([0x02]) + struct.pack(">Q", announce))
    sent = 0
    try:
        while sent < send:
            n = min(len(CHUNK), send - sent)
            s.sendall(CHUNK[:n])
            sent += n
    except OSError:
        pass  # closed by the worker
    return s, sent


def closed(s):
    """Whether the worker closed s (what it sends, pings, is read and ignored)."""
    s.setblocking(False)
    try:
        while True:
            b = s.recv(65536)
            if b == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def main():
    ep, pid, hidden = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    host, port = ep[len("tcp://"):].rsplit(":", 1)
    port = int(port)
    bound = 65536 * hidden * 2
    stall = 10.0 + bound / float(16 << 20)
    ok = True

    base = rss_kib(pid)
    above = [stranger(host, port, 1 << 30, 24 << 20) for _ in range(3)]
    time.sleep(1.0)
    grown = rss_kib(pid) - base
    n_closed = sum(closed(s) for s, _ in above)
    print("3 frames of 1 GiB announced (bound %d MiB), %s MiB sent: %d closed, worker %+d KiB" %
          (bound >> 20, "/".join(str(n >> 20) for _, n in above), n_closed, grown))
    if n_closed != 3 or grown > 8 * 1024:
        print("FAIL: a frame above the model's bound must be refused before it is buffered")
        ok = False
    for s, _ in above:
        s.close()

    base = rss_kib(pid)
    t0 = time.monotonic()
    within = [stranger(host, port, bound - 1, bound // 2) for _ in range(3)]
    time.sleep(1.0)
    print("3 frames of %d MiB announced, %d MiB sent each, stalled: worker %+d KiB" %
          ((bound - 1) >> 20, bound // 2 >> 20, rss_kib(pid) - base))
    alive = [s for s, _ in within]
    while alive and time.monotonic() - t0 < stall + 3:
        time.sleep(0.25)
        alive = [s for s in alive if not closed(s)]
    took = time.monotonic() - t0
    time.sleep(0.5)
    left = rss_kib(pid) - base
    print("stalled connections: %d of 3 closed after %.1f s (limit %.1f s); worker %+d KiB" %
          (3 - len(alive), took, stall, left))
    if alive:
        print("FAIL: connections stalled mid-frame must be closed within %.1f s" % stall)
        ok = False
    for s, _ in within:
        s.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
