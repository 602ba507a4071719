#!/usr/bin/env python3
"""Runs the decode loop with --kv-events, follows its KV events with the reference router
(examples/kv_router/kv_router.py) from its first batch, decodes every batch (live, or by
replay when the router connected after the loop had started), and checks that the index
the router rebuilt equals the manager's own prefix index written with --kv-index-out (both
tiers, per medium, when the options include --host-cache-mb; per layer group when the
manager has several: lines "HASH MEDIUM GROUP", and the router's index keeps each group).
usage: check_decode_loop_events.py ROUTER_DIR PAGEDKV_DECODE [decode loop options...]
"""

import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time

ROUTER_DIR, DECODE, OPTIONS = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, ROUTER_DIR)
import kv_router  # noqa: E402


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


work = tempfile.mkdtemp(prefix="pagedkv-decode-events-")
index_file = os.path.join(work, "index.txt")
proc = subprocess.Popen(
    [DECODE, *OPTIONS, "--json", "--kv-events", "tcp://127.0.0.1:*", "--kv-events-replay",
     "tcp://127.0.0.1:*", "--kv-index-out", index_file, "--hold-s", "60"],
    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
lines = queue.Queue()
threading.Thread(target=lambda: [lines.put(l) for l in proc.stderr], daemon=True).start()


def wait_line(pattern, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.05)
        except queue.Empty:
            if proc.poll() is not None:
                fail(f"decode loop exited with {proc.returncode}")
            continue
        match = re.search(pattern, line)
        if match:
            return match
    fail(f"no line matching {pattern!r} on stderr")


try:
    pub, replay = wait_line(r"kv events on (\S+) replay (\S+)", 60).groups()
    router = kv_router.KvRouter([("decode", pub, replay)])
    feed = router.feeds[0]
    feed.next_seq = 0  # the engine has just started: take everything from seq 0
    final_seq = None
    deadline = time.monotonic() + 600
    while final_seq is None and time.monotonic() < deadline:
        router.poll(timeout_ms=20)
        try:
            match = re.search(r"kv events: next seq (\d+)", lines.get_nowait())
            final_seq = int(match.group(1)) if match else None
        except queue.Empty:
            pass
    if final_seq is None:
        fail("the decode loop did not finish")
    feed.catch_up(final_seq)
    c = feed.counters
    print("router counters:", c, "batches:", final_seq)
    if c["live"] + c["replayed"] != final_seq or c["snapshots"] != 0:
        fail("not every batch was decoded")
    with open(index_file) as f:
        mine = sorted(line.strip() for line in f)
    got = feed.index.entries()
    if got != mine:
        fail(f"router holds {len(got)} hashes, the manager {len(mine)}")
    if not mine:
        fail("the run cached nothing")
    host = sum(1 for entry in mine if entry.split()[1] == kv_router.HOST_MEDIUM)
    if "--host-cache-mb" in OPTIONS and host == 0:
        fail("a host tier, but no block in it at the end")
    groups = {}
    for entry in mine:
        if len(entry.split()) == 3:
            groups[entry.split()[2]] = groups.get(entry.split()[2], 0) + 1
    if groups and not feed.index.hybrid:
        fail("the manager's index has layer groups, but no event named one")
    per_group = f", per group {dict(sorted(groups.items()))}" if groups else ""
    print(f"PASS: router index == manager index ({len(mine)} blocks, {host} in the host tier"
          f"{per_group}, {final_seq} batches)")
    router.close()
finally:
    proc.kill()
    proc.wait(timeout=30)
