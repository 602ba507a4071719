#!/usr/bin/env python3
"""Replay and snapshot requests cannot starve live publishing, and peers that never read
cannot grow the publisher's memory beyond its documented bound.

Two targets:
  decode     the decode loop (pagedkv-decode --kv-events, paced with --min-step-ms so that
             it publishes for the whole test), its rebuilt index compared at the end;
  publisher  pagedkv-publisher-load: a 1-block step every millisecond, the publisher alone.
After 2 s of live batches, while a SUB socket timestamps every live message:
  - one DEALER sends 10,000 replay-from-0 and 10,000 snapshot requests, interleaved;
  - 300 DEALERs send one request each (replay of the last ~100 batches, or snapshot, in
    turn) and read the reply (asking again when answered busy);
  - 100 DEALERs send a replay-from-0 request each and never read (receive HWM 1).
Requires, over the 6 s of abuse: no live message held back 100 ms or more by the
publisher (below), no sequence-number gap, every one of the 300 replies complete and the
flood's peer answered (within a grace after the abuse for replies still being read; the
gaps count there too), and the memory bound; for the decode loop also that the run
outlasted the abuse and that the index rebuilt from the stream (live, replay for what the
subscriber missed) equals the manager's (--kv-index-out). Memory: the publisher's peak RSS
under MAX_PEAK_RSS_MB; the decode loop's RSS growth during the abuse under the
docs/events.md formula evaluated for this run (its batch and snapshot sizes, the peers
connected).

What the live bound proves is the fairness rule ("live batches first", docs/events.md
"Bounds under load"): requests never hold a live batch back for more than one turn of
replies, a few ms; before the rule a publisher serving this abuse held them back 5.9 s.
So the bound is on the publisher's share of each gap between two live messages a and b as
they arrive here, which is the gap less what the machine, not the publisher, took:
  - the steps' own gap (b's step ended that much after a's: the step loop's pace);
  - the time this client could not run within the gap (a thread of ours that sleeps 1 ms
    at a time records each late wake-up: descheduled, or the GIL held elsewhere);
  - the longest time one of the publisher's other threads (its sending thread, ZeroMQ's
    I/O threads) was runnable but waited for a CPU, from the kernel's schedstat sampled
    every 10 ms. A publisher busy sending replies runs: it does not wait.
The raw gap and each of these are printed. On an idle machine the raw gap stayed under
50 ms; on a loaded 2-core machine the client, the step loop and the publisher's threads
wait tens of ms at a time for a CPU, and the raw gap failed a 100 ms bound (103.0 ms; 125.8
ms in a rerun beside two compilers, of which the publisher's share was 40.6 ms).
usage: check_replay_abuse.py publisher PAGEDKV_PUBLISHER_LOAD MAX_PEAK_RSS_MB
       check_replay_abuse.py decode ROUTER_DIR PAGEDKV_DECODE [decode loop options...]
"""

import bisect
import json
import os
import queue
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time

import msgspec
import zmq

WARMUP_S, ABUSE_S, MAX_GAP_S = 2.0, 6.0, 0.100
# A wake-up of the client's 1 ms sleeper this much late counts as a stall of this process
# (Python's GIL switch interval is 5 ms: shorter waits are ordinary and not discounted).
CLIENT_STALL_S = 0.005
# The 300 replies are read by this one Python process, which shares two cores with the
# publisher on a small CI machine: a reply still being read when the abuse ends may finish
# in this grace (the live gaps are measured over it too). Starvation would outlast it.
REPLY_GRACE_S = 10.0
FLOOD_REQUESTS, PEERS, SILENT_PEERS = 10_000, 300, 100
END, SNAPSHOT = -1, -2
BUSY = b"busy"
# KvEventPublisher::Options defaults the decode loop runs with.
REPLY_HWM, MAX_PENDING_REQUESTS, REPLAY_BUFFER_STEPS = 64, 1024, 10_000
# docs/events.md, "Bounds under load": per pending reply, per kept step, and ZeroMQ's own
# cost of one connected peer (session, pipes, engine buffers; measured there).
PENDING_REPLY_BYTES, STEP_BYTES, CONNECTION_BYTES = 200, 64, 40 << 10


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def request(seq):
    return struct.pack(">q", seq)


def is_end(frames):
    """(END, busy) for a reply message [, marker, seq, payload]."""
    return struct.unpack(">q", frames[-2])[0] == END, frames[-3] == BUSY


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class PublisherLoad:
    """pagedkv-publisher-load: endpoints on its first line, stats after stdin closes."""

    def __init__(self, binary):
        self.proc = subprocess.Popen([binary, "60"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pub, self.replay = self.proc.stdout.readline().split()

    def running(self):
        return self.proc.poll() is None

    def finish(self):
        self.proc.stdin.close()
        stats = dict(line.split(" ", 1) for line in self.proc.stdout.read().splitlines()
                     if " " in line)
        self.proc.wait(timeout=30)
        return stats


class DecodeLoop:
    """pagedkv-decode with --kv-events: endpoints and the final seq on stderr, the JSON
    summary on stdout."""

    def __init__(self, binary, options):
        self.work = tempfile.mkdtemp(prefix="pagedkv-abuse-")
        self.index_file = os.path.join(self.work, "index.txt")
        self.proc = subprocess.Popen(
            [binary, *options, "--json", "--kv-events", "tcp://127.0.0.1:*",
             "--kv-events-replay", "tcp://127.0.0.1:*", "--kv-index-out", self.index_file,
             "--hold-s", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.final_seq = None
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.pub, self.replay = self._wait(r"kv events on (\S+) replay (\S+)", 60).groups()

    def _read_stderr(self):
        for line in self.proc.stderr:
            match = re.search(r"kv events: next seq (\d+)", line)
            if match:
                self.final_seq = int(match.group(1))
            self.lines.put(line)

    def _wait(self, pattern, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                match = re.search(pattern, self.lines.get(timeout=0.05))
            except queue.Empty:
                if self.proc.poll() is not None:
                    fail(f"decode loop exited with {self.proc.returncode}")
                continue
            if match:
                return match
        fail(f"no line matching {pattern!r} from the decode loop within {timeout_s} s")

    def running(self):
        return self.final_seq is None

    def finish(self):
        deadline = time.monotonic() + 300
        while self.final_seq is None and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"decode loop exited with {self.proc.returncode}")
            time.sleep(0.05)
        if self.final_seq is None:
            fail("the decode loop did not finish within 300 s")
        return json.loads(self._summary())

    def _summary(self):
        text = ""
        for _ in range(100000):
            line = self.proc.stdout.readline()
            if not line:
                break
            text += line
            try:
                json.loads(text)
                return text
            except json.JSONDecodeError:
                continue
        fail(f"no JSON summary on stdout: {text[:200]!r}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def follow_live(ctx, endpoint, stop, arrivals):
    """Records (arrival, seq, seconds since its step ended, payload) of every live message."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    while not stop.is_set():
        if sub.poll(100):
            frames = sub.recv_multipart()
            # A stalled publisher makes the delay grow; a stalled step loop or a
            # descheduled process only the gap.
            step_ts = msgspec.msgpack.decode(frames[2])[0]
            arrivals.append((time.monotonic(), struct.unpack(">q", frames[1])[0],
                             time.time() - step_ts, frames[2]))
    sub.close(linger=0)


def watch_client(stop, stalls):
    """This process's own stalls: sleeps 1 ms at a time and records each wake-up later than
    CLIENT_STALL_S as (since, until), the span in which no thread of ours could have run
    (the live subscriber's included: same scheduler, same GIL)."""
    last = time.monotonic()
    while not stop.is_set():
        time.sleep(0.001)
        now = time.monotonic()
        if now - last > 0.001 + CLIENT_STALL_S:
            stalls.append((last + 0.001, now))
        last = now


def overlap(since, until, stalls):
    """Seconds of (since, until) covered by the recorded stalls."""
    return sum(max(0.0, min(until, b) - max(since, a)) for a, b in stalls)


def run_delays(pid):
    """{tid: ns spent runnable but waiting for a CPU} of the target's threads other than its
    main one (the step loop, whose own pace the steps' timestamps measure): the publisher
    thread and ZeroMQ's I/O threads. Empty where the kernel keeps no schedstat."""
    delays = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        if int(tid) == pid:
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                delays[tid] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return delays


def sample_target(pid, stop, samples, waits):
    """Every 10 ms: the target's RSS into samples, its threads' run delays into waits."""
    while not stop.is_set():
        try:
            now = time.monotonic()
            samples.append((now, rss_kb(pid)))
            waits.append((now, run_delays(pid)))
        except OSError:
            return
        time.sleep(0.01)


def runqueue_wait(since, until, waits):
    """The longest any one of the target's sending threads waited for a CPU within the
    samples that bracket (since, until), at most until - since."""
    i = bisect.bisect_right(waits, since, key=lambda w: w[0]) - 1
    j = bisect.bisect_left(waits, until, key=lambda w: w[0])
    if i < 0 or j >= len(waits):
        return 0.0
    first, last = waits[i][1], waits[j][1]
    longest = max((last[tid] - first[tid] for tid in last if tid in first), default=0)
    return min(until - since, longest / 1e9)


def flood(ctx, endpoint, answered):
    """FLOOD_REQUESTS replay-from-0 and as many snapshot requests from one peer; then
    reads what comes back (past the abuse, in the grace, until one reply completed):
    answered counts complete replies and busy answers."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    for _ in range(FLOOD_REQUESTS):
        dealer.send_multipart([b"", request(0)])
        dealer.send_multipart([b"", request(SNAPSHOT)])
    start = time.monotonic()
    while (time.monotonic() < start + ABUSE_S - 1 or
           (answered["complete"] == 0 and time.monotonic() < start + ABUSE_S + REPLY_GRACE_S)):
        if dealer.poll(100):
            end, busy = is_end(dealer.recv_multipart())
            if end:
                answered["busy" if busy else "complete"] += 1
    dealer.close(linger=0)


def abuse(ctx, target, recent):
    """The 400 peers and the flood for ABUSE_S; returns (start, replies complete, sizes
    {replay, snapshot}: the largest reply of each kind in bytes, busy answers, flood, the
    seconds into the abuse when the last reply completed)."""
    abuse_start = time.monotonic()
    silent = []
    for _ in range(SILENT_PEERS):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.connect(target.replay)
        s.send_multipart([b"", request(0)])
        silent.append(s)
    flood_answered = dict(complete=0, busy=0)
    flooder = threading.Thread(target=flood, args=(ctx, target.replay, flood_answered))
    flooder.start()
    peers, asked = [], {}
    poller = zmq.Poller()
    for i in range(PEERS):
        s = ctx.socket(zmq.DEALER)
        s.connect(target.replay)
        asked[s] = recent if i % 2 == 0 else SNAPSHOT
        s.send_multipart([b"", request(asked[s])])
        poller.register(s, zmq.POLLIN)
        peers.append(s)
    done, busy_answers = set(), 0
    largest = dict(replay=0, snapshot=0)
    received = {s: 0 for s in peers}
    last_done = 0.0
    while len(done) < PEERS and time.monotonic() < abuse_start + ABUSE_S + REPLY_GRACE_S:
        for s, _ in poller.poll(100):
            while s.poll(0) and s not in done:
                frames = s.recv_multipart()
                end, busy = is_end(frames)
                received[s] += len(frames[-1])
                kind = "snapshot" if asked[s] == SNAPSHOT else "replay"
                largest[kind] = max(largest[kind], received[s])
                if busy:  # refused: ask again
                    busy_answers += 1
                    s.send_multipart([b"", request(asked[s])])
                elif end:
                    done.add(s)
                    last_done = time.monotonic() - abuse_start
    time.sleep(max(0.0, abuse_start + ABUSE_S - time.monotonic()))
    flooder.join()
    for s in silent + peers:
        s.close(linger=0)
    return abuse_start, len(done), largest, busy_answers, flood_answered, last_done


def check_index(target, arrivals, ctx):
    """Rebuilds the engine's index from the recorded live messages (replaying what the
    subscriber missed) and compares it with the manager's own."""
    sys.path.insert(0, ROUTER_DIR)
    import kv_router  # noqa: E402
    feed = kv_router.EngineFeed("decode", target.pub, target.replay, ctx, timeout_ms=30000)
    feed.next_seq = 0  # from the first batch: the subscriber's first messages may be missing
    for _, seq, _, payload in arrivals:
        feed.receive(seq, payload)
    feed.catch_up(target.final_seq)
    feed.close()
    with open(target.index_file) as f:
        mine = sorted(line.strip() for line in f)
    got = feed.index.entries()
    print(f"router: {feed.counters}; {len(mine)} blocks in the manager's index")
    if got != mine:
        fail(f"rebuilt index holds {len(got)} hashes, the manager's {len(mine)}; "
             f"{len(set(got) ^ set(mine))} differ")
    if not mine:
        fail("the run cached nothing")


def main():
    global ROUTER_DIR
    mode = sys.argv[1]
    if mode == "publisher":
        target = PublisherLoad(sys.argv[2])
        max_rss_mb = float(sys.argv[3])
    elif mode == "decode":
        ROUTER_DIR = sys.argv[2]
        target = DecodeLoop(sys.argv[3], sys.argv[4:])
    else:
        fail(f"unknown target {mode}")
    ctx = zmq.Context()
    stop = threading.Event()
    arrivals, rss, stalls, waits = [], [], [], []
    threads = [threading.Thread(target=follow_live, args=(ctx, target.pub, stop, arrivals)),
               threading.Thread(target=sample_target,
                                args=(target.proc.pid, stop, rss, waits)),
               threading.Thread(target=watch_client, args=(stop, stalls))]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while not arrivals and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(WARMUP_S)
        if not arrivals:
            fail(f"no live message in the first {WARMUP_S} s")
        before = [kb for t, kb in rss if t >= time.monotonic() - 1.0]
        baseline_kb = max(before) if before else rss_kb(target.proc.pid)
        recent = arrivals[-1][1] - 100
        abuse_start, complete, largest, busy_answers, flood_answered, last_done = abuse(
            ctx, target, recent)
        abuse_end = time.monotonic()
        outlasted = target.running()
        peak_kb = max(kb for t, kb in rss if t >= abuse_start)
        result = target.finish()
        stop.set()
        for t in threads:
            t.join()
    finally:
        stop.set()
        if mode == "decode":
            target.stop()
        elif target.running():
            target.proc.kill()

    during = [a for a in arrivals if abuse_start <= a[0] <= abuse_end]
    gaps = [b[0] - a[0] for a, b in zip(during, during[1:])]
    max_gap = max(gaps) if gaps else float("inf")
    if gaps:
        after_gap = during[gaps.index(max_gap) + 1]
        print(f"largest gap ends {after_gap[0] - abuse_start:.3f} s into the abuse, with a "
              f"message sent {after_gap[2] * 1000:.1f} ms after its step ended; largest "
              f"such delay {max(a[2] for a in during) * 1000:.1f} ms")
    # The engine's own pace: the gaps between the steps' timestamps (set at end_step()), on
    # this process's monotonic clock (arrival less the delay since the step ended).
    step_ts = [a[0] - a[2] for a in during]
    source_gap = max((b - a for a, b in zip(step_ts, step_ts[1:])), default=0.0)
    # The publisher's share of each gap (module docstring): the gap less the steps' own gap,
    # this client's stalls within it and the publisher's threads' wait for a CPU.
    shares = [(b[0] - a[0]) - (sb - sa) - overlap(a[0], b[0], stalls)
              - runqueue_wait(a[0], b[0], waits)
              for a, b, sa, sb in zip(during, during[1:], step_ts, step_ts[1:])]
    held = max(shares) if shares else float("inf")
    worst_gap = (during[shares.index(held) + 1][0] - during[shares.index(held)][0]
                 if shares else float("inf"))
    client_stall = max((b - a for a, b in stalls if b >= abuse_start), default=0.0)
    cpu_wait = max((runqueue_wait(a[0], b[0], waits) for a, b in zip(during, during[1:])),
                   default=0.0)
    seq_gaps = [(a[1], b[1]) for a, b in zip(arrivals, arrivals[1:]) if b[1] != a[1] + 1]
    print(f"{len(during)} live messages in {ABUSE_S} s of abuse; largest gap "
          f"{max_gap * 1000:.1f} ms (between the steps themselves at most "
          f"{source_gap * 1000:.1f} ms; this client's longest stall "
          f"{client_stall * 1000:.1f} ms, the publisher's threads' longest wait for a CPU "
          f"within a gap {cpu_wait * 1000:.1f} ms); largest held back by the publisher "
          f"{held * 1000:.1f} ms (in a gap of {worst_gap * 1000:.1f} ms); {len(seq_gaps)} "
          f"sequence gaps; {complete}/{PEERS} replies complete (the last {last_done:.2f} s "
          f"into the abuse), {busy_answers} busy answers asked again; flood peer: "
          f"{flood_answered['complete']} replies complete, {flood_answered['busy']} busy")
    if held >= MAX_GAP_S:
        fail(f"a live message held back {held * 1000:.1f} ms by the publisher (in a gap of "
             f"{worst_gap * 1000:.1f} ms), not under {MAX_GAP_S * 1000:.0f} ms")
    if seq_gaps:
        fail(f"sequence gaps {seq_gaps[:5]}")
    if complete < PEERS:
        fail(f"only {complete} of {PEERS} replay replies complete within "
             f"{ABUSE_S + REPLY_GRACE_S} s")
    if flood_answered["complete"] == 0:
        fail("the flooding peer got no complete reply")

    if mode == "publisher":
        print("publisher:", result)
        peak_rss_mb = int(result["peak_rss_kb"]) / 1024
        print(f"peak RSS {peak_rss_mb:.1f} MB (bound {max_rss_mb} MB)")
        if peak_rss_mb >= max_rss_mb:
            fail(f"peak RSS {peak_rss_mb:.1f} MB, not under {max_rss_mb} MB")
        print("OK")
        return

    if not outlasted:
        fail("the decode loop finished before the abuse did: make the run longer")
    print("decode loop kv_events:", result["kv_events"])
    # docs/events.md's memory formula for what can grow while the abuse lasts: the batches
    # published meanwhile (replay buffer, ~64 bytes each), the snapshot mirror and one
    # encoded snapshot, the pending replies, and per connected peer its reply queue and
    # ZeroMQ's connection. (The queue terms are empty: no delay, no drop, one subscriber
    # that keeps up.)
    batch_bytes = max(len(a[3]) for a in arrivals)
    window = [a for a in arrivals if a[0] >= abuse_start]
    # A snapshot of this run fits one message (1,024 blocks each), so M is its size.
    snapshot_bytes = largest["snapshot"]
    peers = 1 + PEERS + SILENT_PEERS
    per_peer = {"replay": REPLY_HWM * batch_bytes,
                "snapshot": REPLY_HWM * max(batch_bytes, snapshot_bytes)}
    bound = (sum(len(a[3]) + STEP_BYTES for a in window) + 2 * snapshot_bytes
             + MAX_PENDING_REQUESTS * PENDING_REPLY_BYTES
             + (SILENT_PEERS + PEERS // 2) * per_peer["replay"]
             + (1 + PEERS // 2) * per_peer["snapshot"] + peers * CONNECTION_BYTES)
    growth = (peak_kb - baseline_kb) * 1024
    print(f"RSS {baseline_kb / 1024:.1f} MB before the abuse, peak {peak_kb / 1024:.1f} MB: "
          f"+{growth / 2**20:.1f} MB; the formula's bound for this run "
          f"{bound / 2**20:.1f} MB (largest batch {batch_bytes} B, snapshot message "
          f"{snapshot_bytes} B, {peers} peers)")
    if result["kv_cache"]["num_blocks"] > 1024:
        fail("the formula here assumes one snapshot message: at most 1,024 blocks")
    if growth >= bound:
        fail(f"RSS grew {growth / 2**20:.1f} MB, not under the bound {bound / 2**20:.1f} MB")
    check_index(target, arrivals, ctx)
    ctx.destroy(linger=0)
    print("OK")


if __name__ == "__main__":
    main()
