#!/usr/bin/env python3
"""Idle and half-sent connections cannot block a scrape: opens 200 connections that send
nothing and 200 that send part of a request to the metrics endpoint of
pagedkv-metrics-server (loopback), then scrapes /metrics and requires an answer within
1 s. Holds every connection open until the scrape is done, then closes them.
usage: check_metrics_abuse.py PAGEDKV_METRICS_SERVER [NUM_THREADS REQUEST_TIMEOUT_MS]
"""

import socket
import subprocess
import sys
import time

IDLE, HALF_SENT, DEADLINE_S = 200, 200, 1.0


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def scrape(port, timeout_s):
    """Returns (seconds, the response's status line) of one GET /metrics."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        response = b""
        while chunk := s.recv(65536):
            response += chunk
    return time.monotonic() - start, response.split(b"\r\n", 1)[0].decode()


def hold_connections(port):
    """Opens IDLE connections that send nothing and HALF_SENT that send part of a request;
    returns the sockets, to be closed by the caller."""
    held = []
    for _ in range(IDLE):
        held.append(socket.create_connection(("127.0.0.1", port)))
    for _ in range(HALF_SENT):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0")
        held.append(s)
    return held


def main():
    server = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    held = []
    try:
        port = int(server.stdout.readline())
        seconds, status = scrape(port, timeout_s=10)
        print(f"baseline scrape: {seconds * 1000:.1f} ms, {status}")
        held = hold_connections(port)
        try:
            seconds, status = scrape(port, timeout_s=60)
        except OSError as e:
            fail(f"scrape with {IDLE} idle and {HALF_SENT} half-sent connections open: {e}")
        print(f"scrape with {IDLE} idle and {HALF_SENT} half-sent connections open: "
              f"{seconds * 1000:.1f} ms, {status}")
        if not status.endswith("200 OK"):
            fail(f"status {status!r}")
        if seconds > DEADLINE_S:
            fail(f"the scrape took {seconds:.2f} s, more than {DEADLINE_S} s")
        print("OK")
    finally:
        for s in held:
            s.close()
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            fail("the server did not stop within 30 s of its stdin closing")


if __name__ == "__main__":
    main()
