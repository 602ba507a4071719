#!/usr/bin/env python3
"""End-to-end test of KV events on the wire: mock engines (pagedkv-mock-engine) publish
with KvEventPublisher, the reference router (examples/kv_router/kv_router.py) follows them,
and each engine's index as the router rebuilt it must equal the manager's own prefix index
at the end of the run.

Scenarios (engines with --host-blocks have a host tier: their indexes hold GPU and CPU
blocks, and the router must track both):
  full     two engines, the router in this process from before the first step: every
           batch decoded live or replayed; route() answers from the rebuilt indexes.
  restart  the router (a process that saves its state) is killed with SIGKILL mid-run and
           restarted from its state: it fills the gap by replay.
  late     a replay buffer of 8 steps; the router joins late (snapshot), then is killed and
           restarted after the buffer has moved on: it resynchronises by snapshot.
  hybrid   two engines serving a hybrid model (layer groups): one with a sliding-window and
           a chunked-local group beside the full one, one with a sliding-window group and a
           host tier. Every event names its group; the rebuilt indexes equal the managers'
           per (block, group, medium); and for every chain the router holds, its prefix
           match equals the engine's own match_prefix() (the engine's "probe" command).
  late-hybrid  "late" with a hybrid engine (a sliding-window and a chunked-local group, a
           host tier): snapshots and the router's saved state keep every group.
  curve    the engine publishes with ZeroMQ CURVE (its key pair from pagedkv-curve-keygen,
           the router's from pyzmq's zmq.auth): the router process, given its secret
           certificate and the engine's public one, decodes every batch and rebuilds the
           index; a subscriber without keys, one whose key is not allowed, one that expects
           another server key, and a DEALER without keys receive nothing during the run.
usage: kv_events_e2e.py MOCK_ENGINE ROUTER_DIR {tcp,ipc}
       {full,restart,late,hybrid,late-hybrid,curve} [KEYGEN]
Every wait is bounded; a hang fails the test. Exits 77 (skipped) when CURVE is missing.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MOCK, ROUTER_DIR, TRANSPORT, SCENARIO = sys.argv[1:5]
KEYGEN = sys.argv[5] if len(sys.argv) > 5 else None
sys.path.insert(0, ROUTER_DIR)
import kv_router  # noqa: E402
import zmq  # noqa: E402
import zmq.auth  # noqa: E402

WORK = tempfile.mkdtemp(prefix="pagedkv-kv-events-")
BLOCK_SIZE = 4


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def endpoints(name):
    if TRANSPORT == "ipc":
        return [f"ipc://{WORK}/{name}-pub", f"ipc://{WORK}/{name}-replay"]
    return ["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"]


class Engine:
    def __init__(self, name, seed, *extra):
        self.name = name
        self.host_tier = "--host-blocks" in extra
        self.index_file = os.path.join(WORK, f"{name}-index.txt")
        pub, replay = endpoints(name)
        self.proc = subprocess.Popen(
            [MOCK, "--endpoint", pub, "--replay-endpoint", replay, "--seed", str(seed),
             "--block-size", str(BLOCK_SIZE), "--index-out", self.index_file, "--linger-s",
             "60", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        words = self.proc.stdout.readline().split()
        if len(words) != 3 or words[0] != "endpoints":
            error = self.proc.stderr.read() if self.proc.wait(timeout=30) is not None else ""
            if "this libzmq has none" in error:
                print("SKIPPED:", error.strip())
                sys.exit(77)
            fail(f"{name}: no endpoints line, got {words}; stderr: {error.strip()}")
        self.pub, self.replay = words[1], words[2]
        self.final_seq = None

    def go(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait_done(self):
        words = self.proc.stdout.readline().split()
        if len(words) != 2 or words[0] != "done":
            fail(f"{self.name}: expected 'done SEQ', got {words} (rc {self.proc.poll()})")
        self.final_seq = int(words[1])

    def probe(self, tokens, extra):
        """The tokens the engine's match_prefix() finds for a new request: after the run."""
        key = extra[0] if extra else -1
        self.proc.stdin.write(f"probe {key} {' '.join(map(str, tokens))}\n")
        self.proc.stdin.flush()
        words = self.proc.stdout.readline().split()
        if len(words) != 2 or words[0] != "hit" or int(words[1]) < 0:
            fail(f"{self.name}: probe answered {words}")
        return int(words[1])

    def own_index(self):
        with open(self.index_file) as f:
            return sorted(line.strip() for line in f)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        if self.proc.wait(timeout=30) != 0:
            fail(f"{self.name}: exit status {self.proc.returncode}")


def check_index(name, router_hashes, engine):
    """router_hashes and the engine's index file: one "HASH MEDIUM" entry per cached block."""
    mine = engine.own_index()
    if router_hashes != mine:
        fail(f"{name}: router holds {len(router_hashes)} hashes, manager {len(mine)}; "
             f"{len(set(router_hashes) ^ set(mine))} differ")
    if not mine:
        fail(f"{name}: empty index, the workload cached nothing")
    host = sum(1 for entry in mine if entry.split()[1] == kv_router.HOST_MEDIUM)
    if engine.host_tier and host == 0:
        fail(f"{name}: a host tier, but no block in it at the end")
    print(f"{name}: router index == manager index ({len(mine)} blocks, {host} in the host "
          f"tier, {engine.final_seq} batches)")


def deepest_prefix(index):
    """Tokens and extra keys of the longest chain of blocks in an EngineIndex."""
    def chain(h):
        keys = []
        while h is not None and h in index.blocks:
            keys.append(index.blocks[h])
            h = index.blocks[h][0]
        return keys[::-1]
    best = max((chain(h) for h in index.blocks), key=len)
    tokens = [t for key in best for t in key[1]]
    return tokens, best[0][2], len(best)


def scenario_full():
    # e1 has a host tier: its evictions are demotions (GPU -> CPU events) and its host hits
    # promotions (CPU -> GPU).
    engines = [Engine("e0", 1),
               Engine("e1", 2, "--reset-at-step", "150", "--host-blocks", "64")]
    router = kv_router.KvRouter([(e.name, e.pub, e.replay) for e in engines])
    for feed in router.feeds:
        feed.sync()  # first contact: an empty snapshot at seq 0
    for e in engines:
        e.go()
    for e in engines:
        e.wait_done()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        router.poll(timeout_ms=20)
        if all(f.next_seq >= e.final_seq for f, e in zip(router.feeds, engines)):
            break
    for feed, e in zip(router.feeds, engines):
        feed.catch_up(e.final_seq)
        c = feed.counters
        if c["live"] + c["replayed"] != e.final_seq or c["snapshots"] != 1:
            fail(f"{e.name}: {c} for {e.final_seq} batches: not every batch was decoded")
        check_index(e.name, feed.index.entries(), e)
    # Routing: each engine's longest cached chain routes to an engine holding all of it.
    for feed in router.feeds:
        tokens, extra, depth = deepest_prefix(feed.index)
        name, blocks = router.route(tokens + [0], BLOCK_SIZE, extra)
        if blocks < depth:
            fail(f"route(): {name} with {blocks} blocks, but {feed.name} holds {depth}")
        print(f"route(): {len(tokens)} tokens -> {name}, {blocks} cached blocks")
    if router.route([99999] * 16, BLOCK_SIZE)[1] != 0:
        fail("route(): unknown tokens matched")
    router.close()
    for e in engines:
        e.stop()


def chains(index):
    """(tokens, extra keys, from the first block) of every block's chain in group 0 of an
    EngineIndex, from the first block whose parent it does not hold."""
    found = []
    for h in index.blocks:
        keys = []
        while h is not None and h in index.blocks:
            keys.append(index.blocks[h])
            h = index.blocks[h][0]
        found.append(([t for key in reversed(keys) for t in key[1]], keys[0][2], h is None))
    return found


def scenario_hybrid():
    # e0: full + sliding window 8 + chunked local 12 (probed: no host tier, whose promotions
    # depend on free blocks the router cannot see); e1: full + sliding window 8, host tier.
    engines = [Engine("e0", 7, "--sliding-window", "8", "--chunked-local", "12"),
               Engine("e1", 8, "--sliding-window", "8", "--host-blocks", "32")]
    # vLLM's events carry no chunk size: the router is told (group 2 of e0; e1 has none).
    router = kv_router.KvRouter([(e.name, e.pub, e.replay) for e in engines],
                                chunk_sizes={2: 12})
    for feed in router.feeds:
        feed.sync()
    for e in engines:
        e.go()
    for e in engines:
        e.wait_done()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        router.poll(timeout_ms=20)
        if all(f.next_seq >= e.final_seq for f, e in zip(router.feeds, engines)):
            break
    expected_specs = [{0: ("full_attention", None), 1: ("sliding_window", 8),
                       2: ("chunked_local_attention", None)},
                      {0: ("full_attention", None), 1: ("sliding_window", 8)}]
    for feed, e, specs in zip(router.feeds, engines, expected_specs):
        feed.catch_up(e.final_seq)
        if feed.index.specs != specs:
            fail(f"{e.name}: groups {feed.index.specs}, expected {specs}")
        if not {kind for kind, _ in specs.values()} <= kv_router.schema.KV_CACHE_SPEC_KINDS:
            fail(f"{e.name}: a kind that is not one of vLLM's KVCacheSpecKind values")
        if not all(len(entry.split()) == 3 for entry in e.own_index()):
            fail(f"{e.name}: the engine's index has no group column")
        check_index(e.name, feed.index.entries(), e)
    # The router's prefix match against the engine's own, for every chain it holds and each
    # of its prefixes: equal, in tokens.
    feed, engine = router.feeds[0], engines[0]
    probes = hits = cut = 0
    for tokens, extra, rooted in chains(feed.index):
        for n in range(BLOCK_SIZE, len(tokens) + 1, BLOCK_SIZE):
            prompt = tokens[:n] + [0]  # the last token is never matched
            predicted = feed.index.prefix_blocks(prompt, BLOCK_SIZE, extra) * BLOCK_SIZE
            actual = engine.probe(prompt, extra)
            if predicted != actual:
                fail(f"router predicts {predicted} tokens, the engine finds {actual}, for "
                     f"{prompt} (extra keys {extra})")
            probes += 1
            hits += actual > 0
            cut += rooted and actual < n  # group 0 holds all n tokens: another group cut it
    if hits == 0 or cut == 0:
        fail(f"{probes} probes, {hits} hits, {cut} cut by a windowed group: the workload "
             "exercised too little")
    print(f"{probes} probes of e0: router == engine, {hits} hits, {cut} cut by a windowed "
          "group")
    router.close()
    for e in engines:
        e.stop()


def start_follower(engine, state, *extra):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROUTER_DIR, "kv_router.py"), "follow", "--engine",
         engine.name, engine.pub, engine.replay, "--state", state, "--until-seq-file",
         os.path.join(WORK, "until"), "--index-out", os.path.join(WORK, "router-"),
         "--timeout-s", "90", *extra],
        stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "synced":
        fail("router did not synchronise")
    return proc


def scenario_kill_restart(late, hybrid=False):
    # 3 s of steps: the router's kill and restart (a second in) fall within them even on a
    # loaded machine, where starting a Python process takes a good part of a second.
    extra = ["--steps", "1500", "--step-us", "2000", "--host-blocks", "64"]
    if hybrid:  # every group's blocks in the snapshot, the saved state and the index
        extra += ["--sliding-window", "8", "--chunked-local", "12"]
    if late:
        extra += ["--replay-steps", "8"]
    engine = Engine("e0", 3, *extra)
    state = os.path.join(WORK, "router-state.pickle")
    engine.go()
    if late:
        time.sleep(0.3)  # the engine is dozens of steps in: the router joins by snapshot
    follower = start_follower(engine, state)
    time.sleep(0.3)
    follower.send_signal(signal.SIGKILL)
    follower.wait(timeout=10)
    time.sleep(0.3)  # about 100 steps pass without the router
    follower = start_follower(engine, state)
    engine.wait_done()
    with open(os.path.join(WORK, "until"), "w") as f:
        f.write(f"{engine.name} {engine.final_seq}\n")
    if follower.wait(timeout=90) != 0:
        fail(f"router exit status {follower.returncode}")
    with open(os.path.join(WORK, f"router-{engine.name}.json")) as f:
        result = json.load(f)
    c = result["counters"]
    print("router counters:", c)
    if late:
        if c["snapshots"] < 2 or c["snapshot_blocks"] == 0:
            fail("expected a late-join snapshot and a snapshot resync after the restart")
    elif c["replays"] < 1 or c["replayed"] == 0 or c["snapshots"] != 1:
        fail("expected the restart's gap to be filled by replay alone")
    check_index(engine.name, result["hashes"], engine)
    engine.stop()


def scenario_curve():
    if not zmq.has("curve"):
        print("SKIPPED: pyzmq's libzmq has no CURVE")
        sys.exit(77)
    keys = os.path.join(WORK, "keys")
    clients = os.path.join(WORK, "clients")
    others = os.path.join(WORK, "others")
    for d in (keys, clients, others):
        os.makedirs(d)
    # The engine's pair from the C++ tool, the clients' from pyzmq: each side reads the
    # other's certificates.
    out = subprocess.run([KEYGEN, keys, "engine"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        fail(f"pagedkv-curve-keygen: {out.stderr.strip()}")
    router_public, router_secret = zmq.auth.create_certificates(clients, "router")
    _, stranger_secret = zmq.auth.create_certificates(others, "stranger")
    impostor_public, _ = zmq.auth.create_certificates(others, "impostor")
    engine_public = os.path.join(keys, "engine.key")
    engine = Engine("e0", 5, "--steps", "300", "--host-blocks", "32", "--curve-secret-key",
                    os.path.join(keys, "engine.key_secret"), "--curve-clients", clients)

    ctx = zmq.Context()
    eavesdroppers = []
    for client_secret, server_public in [(None, None), (stranger_secret, engine_public),
                                         (router_secret, impostor_public)]:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        if client_secret:
            kv_router.CurveKeys.load(client_secret, server_public).apply(sub)
        sub.connect(engine.pub)
        eavesdroppers.append(sub)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDTIMEO, 100)
    dealer.connect(engine.replay)
    try:
        dealer.send_multipart([b"", kv_router.schema.seq_to_bytes(kv_router.schema.SNAPSHOT_REQUEST)])
    except zmq.Again:
        pass  # no handshake ever completes: nothing to queue the request for
    eavesdroppers.append(dealer)

    state = os.path.join(WORK, "router-state.pickle")
    follower = start_follower(engine, state, "--client-cert", router_secret, "--engine-cert",
                              engine.name, engine_public)
    engine.go()
    engine.wait_done()
    with open(os.path.join(WORK, "until"), "w") as f:
        f.write(f"{engine.name} {engine.final_seq}\n")
    if follower.wait(timeout=90) != 0:
        fail(f"router exit status {follower.returncode}")
    with open(os.path.join(WORK, f"router-{engine.name}.json")) as f:
        result = json.load(f)
    c = result["counters"]
    print("keyed router counters:", c)
    if c["live"] + c["replayed"] != engine.final_seq:
        fail(f"the keyed router decoded {c['live'] + c['replayed']} of {engine.final_seq} batches")
    check_index(engine.name, result["hashes"], engine)
    names = ["no keys", "a key not allowed", "another server key", "a DEALER without keys"]
    for name, s in zip(names, eavesdroppers):
        if s.poll(200):
            fail(f"the subscriber with {name} received {s.recv_multipart()[:2]}")
    print(f"nothing reached the {len(eavesdroppers)} subscribers without allowed keys")
    ctx.destroy(linger=0)
    engine.stop()


if SCENARIO == "full":
    scenario_full()
elif SCENARIO == "restart":
    scenario_kill_restart(late=False)
elif SCENARIO == "late":
    scenario_kill_restart(late=True)
elif SCENARIO == "hybrid":
    scenario_hybrid()
elif SCENARIO == "late-hybrid":
    scenario_kill_restart(late=True, hybrid=True)
elif SCENARIO == "curve":
    scenario_curve()
else:
    fail(f"unknown scenario {SCENARIO}")
print("PASS")
