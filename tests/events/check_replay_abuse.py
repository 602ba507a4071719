#!/usr/bin/env python3
"""Replay and snapshot requests cannot starve live publishing, and peers that never read
cannot grow the publisher's memory. pagedkv-publisher-load publishes a step every
millisecond (loopback); after 2 s, while a SUB socket timestamps every live message:
  - one DEALER sends 10,000 replay-from-0 and 10,000 snapshot requests, interleaved;
  - 300 DEALERs send one request each (replay of the last ~100 steps, or snapshot, in
    turn) and read the reply;
  - 100 DEALERs send a replay-from-0 request each and never read (receive HWM 1).
Requires: the largest gap between live messages under 100 ms, no sequence-number gap,
every one of the 300 replies complete, the flood's peer answered, and the publisher's
peak RSS under the bound given on the command line.
usage: check_replay_abuse.py PAGEDKV_PUBLISHER_LOAD MAX_PEAK_RSS_MB
"""

import struct
import subprocess
import sys
import threading
import time

import msgspec
import zmq

WARMUP_S, ABUSE_S, MAX_GAP_S = 2.0, 6.0, 0.100
FLOOD_REQUESTS, PEERS, SILENT_PEERS = 10_000, 300, 100
END, SNAPSHOT = -1, -2


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def request(seq):
    return struct.pack(">q", seq)


def reply_seq(frames):
    return struct.unpack(">q", frames[-2])[0]


def follow_live(ctx, endpoint, stop, arrivals):
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    while not stop.is_set():
        if sub.poll(100):
            frames = sub.recv_multipart()
            # (arrival, seq, seconds since its step ended: a stalled publisher makes that
            # grow, a stalled step loop or a descheduled process only the gap)
            step_ts = msgspec.msgpack.decode(frames[2])[0]
            arrivals.append((time.monotonic(), struct.unpack(">q", frames[1])[0],
                             time.time() - step_ts))
    sub.close(linger=0)


def flood(ctx, endpoint, answered):
    """FLOOD_REQUESTS replay-from-0 and as many snapshot requests from one peer; then
    reads what comes back for a while."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    for _ in range(FLOOD_REQUESTS):
        dealer.send_multipart([b"", request(0)])
        dealer.send_multipart([b"", request(SNAPSHOT)])
    deadline = time.monotonic() + ABUSE_S - 1
    while time.monotonic() < deadline:
        if dealer.poll(100) and reply_seq(dealer.recv_multipart()) == END:
            answered.append(1)
    dealer.close(linger=0)


def main():
    driver = subprocess.Popen([sys.argv[1], "60"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    max_rss_mb = float(sys.argv[2])
    ctx = zmq.Context()
    stop = threading.Event()
    arrivals, flood_answered = [], []
    try:
        pub_endpoint, router_endpoint = driver.stdout.readline().split()
        live = threading.Thread(target=follow_live, args=(ctx, pub_endpoint, stop, arrivals))
        live.start()
        time.sleep(WARMUP_S)
        if not arrivals:
            fail(f"no live message in the first {WARMUP_S} s")
        abuse_start = time.monotonic()
        recent = arrivals[-1][1] - 100

        silent = []
        for _ in range(SILENT_PEERS):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)
            s.connect(router_endpoint)
            s.send_multipart([b"", request(0)])
            silent.append(s)
        flooder = threading.Thread(target=flood, args=(ctx, router_endpoint, flood_answered))
        flooder.start()
        peers = []
        poller = zmq.Poller()
        for i in range(PEERS):
            s = ctx.socket(zmq.DEALER)
            s.connect(router_endpoint)
            s.send_multipart([b"", request(recent if i % 2 == 0 else SNAPSHOT)])
            poller.register(s, zmq.POLLIN)
            peers.append(s)
        done = set()
        while len(done) < PEERS and time.monotonic() < abuse_start + ABUSE_S:
            for s, _ in poller.poll(100):
                while s.poll(0) and s not in done:
                    if reply_seq(s.recv_multipart()) == END:
                        done.add(s)
        time.sleep(max(0.0, abuse_start + ABUSE_S - time.monotonic()))
        flooder.join()
        stop.set()
        live.join()
        for s in silent + peers:
            s.close(linger=0)

        driver.stdin.close()
        stats = dict(line.split(" ", 1) for line in driver.stdout.read().splitlines()
                     if " " in line)
        driver.wait(timeout=30)
        print("publisher:", stats)
        during = [a for a in arrivals if a[0] >= abuse_start]
        gaps = [b[0] - a[0] for a, b in zip(during, during[1:])]
        max_gap = max(gaps) if gaps else float("inf")
        if gaps:
            after_gap = during[gaps.index(max_gap) + 1]
            print(f"largest gap ends {after_gap[0] - abuse_start:.3f} s into the abuse, with a "
                  f"message sent {after_gap[2] * 1000:.1f} ms after its step ended; largest "
                  f"such delay {max(a[2] for a in during) * 1000:.1f} ms")
        seq_gaps = [(a[1], b[1]) for a, b in zip(arrivals, arrivals[1:]) if b[1] != a[1] + 1]
        peak_rss_mb = int(stats["peak_rss_kb"]) / 1024
        print(f"{len(during)} live messages in {ABUSE_S} s of abuse; largest gap "
              f"{max_gap * 1000:.1f} ms; {len(seq_gaps)} sequence gaps; {len(done)}/{PEERS} "
              f"replies complete; flood peer answered {len(flood_answered)} times; peak RSS "
              f"{peak_rss_mb:.1f} MB (bound {max_rss_mb} MB)")
        if max_gap >= MAX_GAP_S:
            fail(f"largest live gap {max_gap * 1000:.1f} ms, not under {MAX_GAP_S * 1000:.0f} ms")
        if seq_gaps:
            fail(f"sequence gaps {seq_gaps[:5]}")
        if len(done) < PEERS:
            fail(f"only {len(done)} of {PEERS} replay replies complete within {ABUSE_S} s")
        if not flood_answered:
            fail("the flooding peer got no reply")
        if peak_rss_mb >= max_rss_mb:
            fail(f"peak RSS {peak_rss_mb:.1f} MB, not under {max_rss_mb} MB")
        print("OK")
    finally:
        stop.set()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
