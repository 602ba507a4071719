#!/usr/bin/env python3
"""The decode loop's metrics under abuse equal its summary. Runs the decode loop with
--metrics-port and --kv-events (and a replay socket); while it runs, sends one snapshot
and one replay request and reads both replies, subscribes to the events, and scrapes
/metrics with curl. After its JSON summary, holds 200 idle and 200 half-sent connections
open on the metrics port, scrapes once more and requires the answer within 1 s. Every
scrape is parsed with prometheus_client's parser (it rejects text that is not valid
exposition format); the final values must equal the summary's, the publisher's counters
included (events published, replay and snapshot requests: exactly the two sent here).
usage: check_metrics.py ROUTER_DIR PAGEDKV_DECODE [decode loop options...]
The options should make the run last a second or more (--min-step-ms): the requests are
sent as it starts, and must be served before its summary.
"""

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

import zmq
from prometheus_client.parser import text_string_to_metric_families

ROUTER_DIR, DECODE, OPTIONS = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, ROUTER_DIR)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_events_schema as schema  # noqa: E402
from check_metrics_abuse import hold_connections  # noqa: E402

PREFIX = "pagedkv:"
SCRAPE_DEADLINE_S = 1.0


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def scrape(url):
    """Returns ({sample name with its non-model labels: value}, seconds)."""
    start = time.monotonic()
    out = subprocess.run(["curl", "--silent", "--show-error", "--fail", "--max-time", "10", url],
                         capture_output=True, text=True, timeout=30)
    seconds = time.monotonic() - start
    if out.returncode != 0:
        fail(f"curl {url}: {out.stderr.strip()}")
    samples = {}
    for family in text_string_to_metric_families(out.stdout):
        for s in family.samples:
            if not s.name.startswith(PREFIX):
                continue  # prometheus-cpp's own exposer_* metrics
            if s.labels.get("model_name") != "pagedkv-decode":
                fail(f"{s.name}: model_name label {s.labels.get('model_name')!r}")
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                              if k != "model_name")
            samples[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    if not samples:
        fail("no samples")
    return samples, seconds


def read_json(stream):
    """Reads lines until they form one JSON document (the process keeps stdout open)."""
    text = ""
    for _ in range(10000):
        line = stream.readline()
        if not line:
            break
        text += line
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            continue
    fail(f"no JSON summary on stdout: {text[:200]!r}")


def ask(dealer, value):
    """Sends a replay (value >= 0) or snapshot request; returns the batches of the reply."""
    dealer.send_multipart([b"", schema.seq_to_bytes(value)])
    batches = 0
    while True:
        if not dealer.poll(10000):
            fail(f"no reply to request {value} within 10 s")
        _, marker, seq, _ = dealer.recv_multipart()
        if schema.seq_from_bytes(seq) == schema.END_SEQ:
            if marker:
                fail(f"request {value} answered {marker!r}")
            return batches
        batches += 1


def count_live_events(endpoint, stop, counts):
    """Subscribes and counts the events of every live batch (after the connection)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    while not stop.is_set():
        if sub.poll(50):
            _, _, payload = sub.recv_multipart()
            counts["batches"] += 1
            counts["events"] += len(schema.decoder.decode(payload).events)
    sub.close(linger=0)


def main():
    if shutil.which("curl") is None:
        print("SKIPPED: curl is not installed (scripts/install-deps.sh installs it)")
        sys.exit(77)
    proc = subprocess.Popen(
        [DECODE, *OPTIONS, "--json", "--metrics-port", "0", "--kv-events", "tcp://127.0.0.1:*",
         "--kv-events-replay", "tcp://127.0.0.1:*", "--hold-s", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr],
                     daemon=True).start()

    def wait_line(pattern):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                match = re.search(pattern, lines.get(timeout=0.05))
            except queue.Empty:
                if proc.poll() is not None:
                    fail(f"decode loop exited with {proc.returncode}")
                continue
            if match:
                return match
        fail(f"no line matching {pattern!r} on stderr")

    stop = threading.Event()
    live = dict(batches=0, events=0)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    held = []
    try:
        url = wait_line(r"(http://127\.0\.0\.1:\d+/metrics)").group(1)
        port = int(re.search(r":(\d+)/metrics", url).group(1))
        pub, replay = wait_line(r"kv events on (\S+) replay (\S+)").groups()
        subscriber = threading.Thread(target=count_live_events, args=(pub, stop, live))
        subscriber.start()
        dealer.connect(replay)
        ask(dealer, schema.SNAPSHOT_REQUEST)
        # A replay with batches in it. The first batch follows the first step, whose prefill
        # takes seconds in sanitizer builds.
        deadline = time.monotonic() + 60
        while live["batches"] < 2 and time.monotonic() < deadline:
            if proc.poll() is not None:
                fail(f"decode loop exited with {proc.returncode} before 2 batches went out")
            time.sleep(0.01)
        replayed = ask(dealer, 0)
        if replayed < 2:
            fail(f"replay from 0 returned {replayed} batches, the subscriber had seen "
                 f"{live['batches']} live")
        requests_done = time.monotonic()
        during, _ = scrape(url)
        summary = read_json(proc.stdout)
        run_end = time.monotonic()
        final_seq = int(wait_line(r"kv events: next seq (\d+)").group(1))
        events = summary["kv_events"]
        if events is None:
            fail("the summary has no kv_events")
        if events["snapshot_requests"] != 1 or events["replay_requests"] != 1:
            fail(f"the summary counts {events['snapshot_requests']} snapshot and "
                 f"{events['replay_requests']} replay requests, 1 of each was served before "
                 f"it ({run_end - requests_done:.2f} s before): the run ended too early?")

        held = hold_connections(port)
        final, seconds = scrape(url)
        print(f"scrape with {len(held)} idle or half-sent connections open: "
              f"{seconds * 1000:.1f} ms")
        if seconds > SCRAPE_DEADLINE_S:
            fail(f"the scrape took {seconds:.2f} s, more than {SCRAPE_DEADLINE_S} s")
    finally:
        stop.set()
        for s in held:
            s.close()
        dealer.close(linger=0)
        proc.kill()
        proc.wait(timeout=30)
    subscriber.join()

    expected = {
        "prefix_cache_queries_total": summary["allocator_prefix_query_tokens"],
        "prefix_cache_hits_total": summary["allocator_prefix_hit_tokens"],
        "num_preemptions_total{mode=recompute}": summary["preemptions_recompute"],
        "num_preemptions_total{mode=swap}": summary["preemptions_swap"],
        "num_evictions_total": summary["evictions"],
        "num_cow_copies_total": summary["cow_copies"],
        "num_blocks_swapped_out_total": summary["blocks_swapped_out"],
        "num_blocks_swapped_in_total": summary["blocks_swapped_in"],
        "kv_events_published_total": events["events_published"],
        "kv_events_dropped_total{reason=subscriber_hwm}": events["events_dropped_subscriber_hwm"],
        "kv_events_dropped_total{reason=publisher_queue}":
            events["events_dropped_publisher_queue"],
        "kv_events_replay_requests_total": events["replay_requests"],
        "kv_events_snapshot_requests_total": events["snapshot_requests"],
        "kv_events_requests_refused_total": events["requests_refused"],
        "kv_events_stalled_peers_dropped_total": events["stalled_peers_dropped"],
    }
    for name, want in expected.items():
        got = final.get(PREFIX + name)
        if got != want:
            fail(f"{PREFIX}{name} = {got}, the summary says {want}")
        if during.get(PREFIX + name, 0) > got:
            fail(f"{PREFIX}{name} went back from {during[PREFIX + name]} to {got}")
    usage = final[PREFIX + "kv_cache_usage_perc"]
    if not 0 <= usage <= 1:
        fail(f"kv_cache_usage_perc {usage} outside [0, 1]")
    if final[PREFIX + "prefix_cache_queries_total"] <= 0:
        fail("the run looked nothing up in the prefix cache")
    if events["next_seq"] != final_seq or events["batches_published"] != final_seq:
        fail(f"{events['batches_published']} batches published, next seq {final_seq}")
    # The subscriber joined after the first batches (the replay shows how many it missed).
    if not 0 < live["events"] <= events["events_published"]:
        fail(f"the subscriber counted {live['events']} events, the publisher sent "
             f"{events['events_published']}")
    print(f"replay from 0 returned {replayed} batches while the run went on; the subscriber "
          f"saw {live['batches']} of {final_seq} batches live")
    admission = summary["prefix_cache_hit_rate"]
    lookups = summary["allocator_prefix_cache_hit_rate"]
    print(f"prefix hit rate: {admission:.3f} at admission, {lookups:.3f} of all lookups "
          f"(the metrics' hits_total / queries_total)")
    print(f"PASS: {len(final)} samples; final values match the summary: "
          + ", ".join(f"{k}={final[PREFIX + k]:g}" for k in expected))


if __name__ == "__main__":
    main()
