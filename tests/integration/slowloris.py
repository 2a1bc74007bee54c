#!/usr/bin/env python3
"""slowloris.py — strangers hold /metrics connections open; a scrape must still get through
(issue 17, defect 5).

    slowloris.py HOST:PORT DEADLINE_S

Opens 32 connections from 127.0.0.2 and one from each of 127.0.0.3..127.0.0.18 (all loopback on
Linux), each sending a request line and then one header byte every 0.5 s, so an idle timeout
never fires (the old server: one global limit of 16, an idle timeout reset by every byte). While
they trickle, a scrape from 127.0.0.1 must answer 200 within 5 s. Then every stranger's
connection must be closed by the server within DEADLINE_S + 3 s of its start (a total request
deadline that a trickle of bytes does not reset). Exit 0 when both hold, 1 with the reason.
"""
import socket
import sys
import time
import urllib.request


def stranger(src, host, port):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(2)
    try:
        s.connect((host, port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    except OSError:
        s.close()
        return None  # refused at once: it holds nothing
    s.setblocking(False)
    return s


def trickle(socks):
    """One byte on every open socket; returns the sockets the server has not closed."""
    alive = []
    for s in socks:
        try:
            if s.recv(1) == b"":  # EOF: the server closed it
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        try:
            s.send(b"X")
            alive.append(s)
        except OSError:
            s.close()
    return alive


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    port, deadline = int(port), float(sys.argv[2])
    t0 = time.monotonic()
    srcs = ["127.0.0.2"] * 32 + ["127.0.0.%d" % i for i in range(3, 19)]
    socks = [s for s in (stranger(a, host, port) for a in srcs) if s is not None]
    held = len(socks)
    for _ in range(4):  # 2 s of trickling: well past any accept
        time.sleep(0.5)
        socks = trickle(socks)
    print("strangers hold %d connections (of %d opened) after 2 s" % (len(socks), len(srcs)))
    ok = True
    t = time.monotonic()
    try:
        with urllib.request.urlopen("http://%s:%d/metrics" % (host, port), timeout=5) as r:
            body = r.read()
            print("a scrape while they trickle: %d, %d bytes in %.2f s" %
                  (r.status, len(body), time.monotonic() - t))
            ok = r.status == 200 and b"# TYPE" in body
    except OSError as e:
        print("FAIL: a scrape while %d strangers trickle: %s (after %.2f s)" %
              (len(socks), e, time.monotonic() - t))
        ok = False
    while socks and time.monotonic() - t0 < deadline + 3:
        time.sleep(0.5)
        socks = trickle(socks)
    if socks:
        print("FAIL: %d of %d trickling connections still open %.1f s after they began "
              "(deadline %g s)" % (len(socks), held, time.monotonic() - t0, deadline))
        ok = False
    else:
        print("every trickling connection closed by the server within %.1f s (deadline %g s)" %
              (time.monotonic() - t0, deadline))
    for s in socks:
        s.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
