#!/usr/bin/env python3
"""A reference KV-aware router: follows the KV events of several engines and answers
"which engine holds the longest cached prefix of these tokens".

It speaks vLLM's KV event protocol (docs/events.md) with pyzmq and msgspec:
  - a SUB socket per engine receives (topic, seq, KVEventBatch) messages;
  - a gap in the sequence numbers is filled by a replay request on the engine's ROUTER
    socket (a DEALER here): 8-byte big-endian start seq, answered by the buffered batches
    from there and an END marker (seq -1); a busy engine answers END with the marker
    "busy" instead, and the request is sent again after a pause;
  - when the gap is older than the engine's replay buffer, or on first contact, a snapshot
    request (seq -2, pagedkv's addition) returns AllBlocksCleared plus every cached block
    as BlockStored events, all tagged with the seq S they are consistent with; live
    batches from S on are then applied on top.

The index is keyed by content, not by recomputing hashes: each BlockStored block says
(parent hash, its tokens, its extra keys) -> hash, so a query walks its tokens block by
block through that map, whatever hash function the engine uses. A hybrid model's engine
(layer groups: full attention beside sliding-window or chunked-local layers) names the
group of every event (group_idx, kv_cache_spec_kind): the index keeps each group apart,
and a prefix counts where every group holds what the engine's hit rule needs.

Engines that publish with CURVE (docs/events.md, "Authenticated events") need the
router's own secret certificate and each engine's public certificate: CurveKeys.load().

As a program it follows engines and writes their indexes (used by the tests):
  kv_router.py follow --engine NAME PUB_ENDPOINT REPLAY_ENDPOINT [--engine ...]
      [--client-cert SECRET_CERT --engine-cert NAME PUBLIC_CERT ...]
      [--state FILE] [--until-seq-file FILE] [--index-out PREFIX] [--timeout-s N]
"""

import argparse
import json
import os
import pickle
import sys
import time
from typing import NamedTuple

import zmq
import zmq.auth

import kv_events_schema as schema


# The "medium" of a block on the wire: device memory, or the host tier of the prefix cache
# (an evicted device block demoted to host memory). An event without one is a device event.
DEVICE_MEDIUM = "GPU"
HOST_MEDIUM = "CPU"
# What a host-tier hit is worth against a device hit when routing: it saves the prefill as
# a device hit does, but the engine first copies the block back to the device. Over PCIe
# 5.0 that takes about 1/21 of recomputing the block (docs/results.md, tier table).
HOST_HIT_WEIGHT = 0.95
# The frame an engine puts before END's seq when it refuses a request (too many pending).
BUSY_MARKER = b"busy"


class CurveKeys(NamedTuple):
    """A CURVE client's keys for one engine, Z85 bytes as zmq.auth loads them."""
    public: bytes  # the router's own
    secret: bytes
    server: bytes  # the engine's public key

    @staticmethod
    def load(client_secret_cert, server_public_cert):
        """From the router's NAME.key_secret and the engine's NAME.key (ZeroMQ
        certificates, as zmq.auth.create_certificates() or pagedkv-curve-keygen write)."""
        public, secret = zmq.auth.load_certificate(client_secret_cert)
        if secret is None:
            raise ValueError(f"{client_secret_cert}: no secret-key (the NAME.key_secret file?)")
        server, _ = zmq.auth.load_certificate(server_public_cert)
        return CurveKeys(public, secret, server)

    def apply(self, socket):
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
        socket.curve_serverkey = self.server


# vLLM's KVCacheSpecKind values (kv_cache_spec_kind on BlockStored) and how the hit rule
# treats them: a full group needs every block of a hit, a sliding-window group the blocks
# its window reaches back to, a chunked-local group those of the current chunk, a state
# group (mamba: state-space layers) a checkpoint at exactly the hit's end, which its
# BlockStored of the hit's last block announces. Kinds not listed here (cross attention,
# unknown) count as full: the router then asks more than the engine does, never less.
FULL_KINDS = {"full_attention", "mla_attention", "sink_full_attention"}
SLIDING_KINDS = {"sliding_window", "sliding_window_mla"}
CHUNKED_KIND = "chunked_local_attention"
STATE_KIND = "mamba"


class GroupIndex:
    """The blocks of one layer group, per medium, as its events describe them.

    A block lives in one medium or, for a moment, in both: demotion is BlockRemoved on
    the device and BlockStored on the host, promotion the reverse. It leaves the index
    only when no medium holds it.
    """

    def __init__(self):
        self.blocks = {}  # hash -> (parent hash, tokens, extra keys)
        self.by_content = {}  # (parent hash, tokens, extra keys) -> hash
        self.media = {}  # hash -> set of media holding it

    def clear(self):
        self.blocks.clear()
        self.by_content.clear()
        self.media.clear()

    def store(self, event):
        bs = event.block_size
        parent = event.parent_block_hash
        medium = event.medium or DEVICE_MEDIUM
        for i, h in enumerate(event.block_hashes):
            extra = event.extra_keys[i] if event.extra_keys else None
            key = (parent, tuple(event.token_ids[i * bs:(i + 1) * bs]),
                   tuple(extra) if extra else None)
            old = self.blocks.get(h)
            if old is not None and self.by_content.get(old) == h:
                del self.by_content[old]
            self.blocks[h] = key
            self.by_content[key] = h
            self.media.setdefault(h, set()).add(medium)
            parent = h

    def remove(self, h, medium):
        media = self.media.get(h)
        if media is None:
            return
        media.discard(medium)
        if media:
            return
        del self.media[h]
        key = self.blocks.pop(h)
        if self.by_content.get(key) == h:
            del self.by_content[key]

    def chain(self, tokens, block_size, extra):
        """[(hash, content key)] of the leading full blocks of `tokens` this group holds."""
        parent, found = None, []
        for i in range(len(tokens) // block_size):
            key = (parent, tuple(tokens[i * block_size:(i + 1) * block_size]), extra)
            h = self.by_content.get(key)
            if h is None:
                break
            found.append((h, key))
            parent = h
        return found


class EngineIndex:
    """The blocks one engine holds, per layer group and medium, as its events describe them.

    An engine serving a model with one layer group (every pagedkv manager without
    layer_groups, and vLLM with one KV cache group) sends group_idx 0 or none: the index
    then has group 0 only, and blocks, by_content and media are that group's maps. A
    hybrid model's engine (full attention beside sliding-window or chunked-local layers)
    caches each block in every group's pools, evicts it from each on its own, and names the
    group and its kind on every event (group_idx, kv_cache_spec_kind,
    kv_cache_spec_sliding_window): the index keeps one GroupIndex per group, and a prefix
    counts as cached only where every group holds what the engine's hit rule needs
    (prefix_media()).

    chunk_sizes: {group_idx: chunk tokens} for chunked-local groups. vLLM's events carry a
    sliding window but no chunk size (kv_cache_spec_sliding_window is set for sliding
    windows only), so the router takes it from the model's config (Llama 4's
    attention_chunk_size); without it a chunked group counts as full.
    """

    def __init__(self, chunk_sizes=None):
        self.groups = {0: GroupIndex()}  # group_idx -> GroupIndex
        self.specs = {}  # group_idx -> (kv_cache_spec_kind, kv_cache_spec_sliding_window)
        self.hybrid = False  # an event named a group other than 0, or a spec kind
        self.chunk_sizes = dict(chunk_sizes or {})

    # Group 0's maps: the whole index of an engine with one layer group.
    @property
    def blocks(self):
        return self.groups[0].blocks

    @property
    def by_content(self):
        return self.groups[0].by_content

    @property
    def media(self):
        return self.groups[0].media

    def group(self, group_idx):
        g = self.groups.get(group_idx)
        if g is None:
            g = self.groups[group_idx] = GroupIndex()
        return g

    def apply(self, batch):
        for event in batch.events:
            if isinstance(event, schema.BlockStored):
                g = event.group_idx or 0
                if g != 0 or event.kv_cache_spec_kind is not None:
                    self.hybrid = True
                    self.specs[g] = (event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window)
                self.group(g).store(event)
            elif isinstance(event, schema.BlockRemoved):
                g = event.group_idx or 0
                self.hybrid |= g != 0
                for h in event.block_hashes:
                    self.group(g).remove(h, event.medium or DEVICE_MEDIUM)
            else:
                for g in self.groups.values():
                    g.clear()

    def entries(self):
        """Sorted "HASHHEX MEDIUM" strings, one per block and medium holding it; for a
        hybrid engine "HASHHEX MEDIUM GROUP", one per block, group and medium."""
        if not self.hybrid:
            return sorted(f"{h.hex()} {m}" for h, media in self.media.items() for m in media)
        return sorted(f"{h.hex()} {m} {g}" for g, index in self.groups.items()
                      for h, media in index.media.items() for m in media)

    def _first_needed(self, group_idx, blocks, block_size):
        """The first block that a hit of `blocks` blocks needs in a group: 0 for a full
        group; a windowed group's blocks before the window of the token at the hit's end
        are not needed (the engine releases them); a state group needs the checkpoint after
        the hit's last block only. None: the group counts as full."""
        kind, window = self.specs.get(group_idx, (None, None))
        pos = blocks * block_size
        if kind == STATE_KIND:
            return max(0, blocks - 1)
        if kind in SLIDING_KINDS and window:
            return max(0, pos - window + 1) // block_size
        if kind == CHUNKED_KIND and self.chunk_sizes.get(group_idx):
            return (pos - pos % self.chunk_sizes[group_idx]) // block_size
        return None

    def prefix_media(self, tokens, block_size, extra_keys=None):
        """The media holding each leading full block of `tokens` that a prefix hit on this
        engine can use. One group: the blocks of group 0's chain. A hybrid engine: the
        longest prefix of p blocks that every group can serve, as pagedkv's match_prefix()
        and vLLM's hybrid coordinator find it: every full group holds blocks [0, p), every
        windowed group the blocks from the first one its window needs at p to p - 1, every
        state group block p - 1 (its checkpoint at p) (a shorter p needs others, so the
        groups are asked until all agree); block i's media then hold "GPU" when every group
        that needs it has it on the device."""
        extra = tuple(extra_keys) if extra_keys else None
        if not self.hybrid:
            return [self.media[h] for h, _ in self.groups[0].chain(tokens, block_size, extra)]
        full = [g for g in sorted(self.groups) if self._first_needed(g, 1, block_size) is None]
        windowed = [g for g in sorted(self.groups) if g not in full]
        if not full:
            return []  # pagedkv refuses windowed groups without a full one
        chains = {g: self.groups[g].chain(tokens, block_size, extra) for g in full}
        p = min(len(c) for c in chains.values())
        anchor = chains[full[0]]  # the keys every group's blocks are checked against

        def held(g, i):
            h, key = anchor[i]
            return self.groups[g].blocks.get(h) == key

        def window_hit(g, p):
            q = p
            while q > 0:
                missing = next((i for i in range(q - 1, self._first_needed(g, q, block_size) - 1,
                                                 -1) if not held(g, i)), None)
                if missing is None:
                    return q
                q = missing  # a hit past a missing block would need it
            return 0

        changed = True
        while changed and p > 0:
            changed = False
            for g in windowed:
                q = window_hit(g, p)
                changed |= q < p
                p = q
        media = []
        for i in range(p):
            needing = full + [g for g in windowed if i >= self._first_needed(g, p, block_size)]
            sets = [self.groups[g].media[anchor[i][0]] for g in needing]
            union = set().union(*sets)
            if not all(DEVICE_MEDIUM in m for m in sets):
                union.discard(DEVICE_MEDIUM)
            media.append(union)
        return media

    def prefix_blocks(self, tokens, block_size, extra_keys=None):
        """Number of leading full blocks of `tokens` a prefix hit on this engine can use,
        in any medium."""
        return len(self.prefix_media(tokens, block_size, extra_keys))

    def prefix_score(self, tokens, block_size, extra_keys=None, host_weight=HOST_HIT_WEIGHT):
        """The cached prefix's worth: 1 per leading block on the device, host_weight per
        leading block that needs a host-tier copy."""
        return sum(1.0 if DEVICE_MEDIUM in media else host_weight
                   for media in self.prefix_media(tokens, block_size, extra_keys))


class EngineFeed:
    """One engine's event stream, kept gap-free by replay and snapshot requests."""

    def __init__(self, name, pub_endpoint, replay_endpoint, context, timeout_ms=5000,
                 curve=None, chunk_sizes=None):
        """curve: CurveKeys when the engine publishes with CURVE; chunk_sizes: see
        EngineIndex."""
        self.name = name
        self.pub_endpoint = pub_endpoint
        self.replay_endpoint = replay_endpoint
        self.timeout_ms = timeout_ms
        self.index = EngineIndex(chunk_sizes)
        self.next_seq = None  # None: not synchronised yet
        self.counters = dict(live=0, replayed=0, replays=0, snapshots=0, snapshot_blocks=0,
                             busy=0)
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.dealer = context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        if curve is not None:  # before connecting: the handshake uses them
            curve.apply(self.sub)
            curve.apply(self.dealer)
        self.sub.connect(pub_endpoint)
        self.dealer.connect(replay_endpoint)

    def close(self):
        self.sub.close(linger=0)
        self.dealer.close(linger=0)

    def poll(self, timeout_ms):
        """Applies the batches that arrive within `timeout_ms`; returns how many."""
        handled = 0
        if self.next_seq is None:
            self.sync()
        while self.sub.poll(timeout_ms if handled == 0 else 0):
            _topic, seq_bytes, payload = self.sub.recv_multipart()
            self._live(schema.seq_from_bytes(seq_bytes), payload)
            handled += 1
        return handled

    def receive(self, seq, payload):
        """Applies one live message (seq, payload) that was read elsewhere, e.g. by a
        thread that only timestamps them, as poll() applies the ones it reads."""
        if self.next_seq is None:
            self.sync()
        self._live(seq, payload)

    def catch_up(self, target_seq):
        """Makes sure every batch before `target_seq` is applied (a lost last message
        leaves no later one to reveal the gap)."""
        if self.next_seq is None:
            self.sync()
        if self.next_seq < target_seq:
            self._fill_gap(target_seq)

    def sync(self):
        """Replaces the index with the engine's snapshot."""
        replies = self._request(schema.SNAPSHOT_REQUEST)
        if not replies:
            raise RuntimeError(f"{self.name}: the publisher does not serve snapshots")
        for _, batch in replies:
            self.index.apply(batch)
            self.counters["snapshot_blocks"] += sum(
                len(e.block_hashes) for e in batch.events if isinstance(e, schema.BlockStored))
        self.next_seq = replies[0][0]
        self.counters["snapshots"] += 1

    def _live(self, seq, payload):
        if seq < self.next_seq:
            return  # already applied (from a replay or a snapshot)
        if seq > self.next_seq:
            self._fill_gap(seq)
            if seq < self.next_seq:
                return
        self.index.apply(schema.decoder.decode(payload))
        self.next_seq = seq + 1
        self.counters["live"] += 1

    def _fill_gap(self, upto):
        """Applies batches next_seq..upto-1 by replay, or resynchronises by snapshot."""
        self.counters["replays"] += 1
        for seq, batch in self._request(self.next_seq):
            if seq < self.next_seq:
                continue
            if seq > self.next_seq:
                break  # the replay buffer no longer holds next_seq
            self.index.apply(batch)
            self.next_seq = seq + 1
            self.counters["replayed"] += 1
        if self.next_seq < upto:
            self.sync()

    def _request(self, value):
        """Sends a replay (value >= 0) or snapshot request; returns [(seq, batch)]. A busy
        answer is retried after a pause that doubles, until timeout_ms has passed."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        pause = 0.01
        while True:
            self.dealer.send_multipart([b"", schema.seq_to_bytes(value)])
            replies = self._read_reply(deadline)
            if replies is not None:
                return replies
            self.counters["busy"] += 1
            if time.monotonic() + pause > deadline:
                raise TimeoutError(f"{self.name}: {self.replay_endpoint} stayed busy")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _read_reply(self, deadline):
        """The batches of one reply up to its END; None when the engine answered busy."""
        replies = []
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self.dealer.poll(wait_ms):
                raise TimeoutError(f"{self.name}: no reply from {self.replay_endpoint}")
            _empty, marker, seq_bytes, payload = self.dealer.recv_multipart()
            seq = schema.seq_from_bytes(seq_bytes)
            if seq == schema.END_SEQ:
                return None if marker == BUSY_MARKER else replies
            replies.append((seq, schema.decoder.decode(payload)))


class KvRouter:
    """Follows several engines; routes a prompt to the one with the longest cached prefix."""

    def __init__(self, engines, context=None, chunk_sizes=None):
        """engines: [(name, pub_endpoint, replay_endpoint[, CurveKeys])]; chunk_sizes:
        {group_idx: tokens} of a hybrid model's chunked-local groups (EngineIndex)."""
        self.context = context or zmq.Context.instance()
        self.feeds = [EngineFeed(*e[:3], self.context, curve=e[3] if len(e) > 3 else None,
                                 chunk_sizes=chunk_sizes)
                      for e in engines]

    def poll(self, timeout_ms=10):
        return sum(feed.poll(timeout_ms) for feed in self.feeds)

    def route(self, tokens, block_size, extra_keys=None, host_weight=HOST_HIT_WEIGHT):
        """Returns (engine name, cached blocks) for the engine whose cached prefix is worth
        most (EngineIndex.prefix_score: device blocks 1, host-tier blocks host_weight)."""
        best = max(self.feeds, key=lambda f: f.index.prefix_score(tokens, block_size,
                                                                  extra_keys, host_weight))
        return best.name, best.index.prefix_blocks(tokens, block_size, extra_keys)

    def close(self):
        for feed in self.feeds:
            feed.close()


# --- the `follow` program ----------------------------------------------------------------

def _save_state(router, path):
    state = {f.name: ({g: (index.blocks, index.media) for g, index in f.index.groups.items()},
                      f.index.specs, f.index.hybrid, f.next_seq, f.counters)
             for f in router.feeds}
    with open(path + ".tmp", "wb") as out:
        pickle.dump(state, out)
    os.replace(path + ".tmp", path)


def _load_state(router, path):
    with open(path, "rb") as f:
        state = pickle.load(f)
    for feed in router.feeds:
        groups, feed.index.specs, feed.index.hybrid, feed.next_seq, feed.counters = \
            state[feed.name]
        for g, (blocks, media) in groups.items():
            index = feed.index.group(g)
            for h, key in blocks.items():
                index.blocks[h] = key
                index.by_content[key] = h
                index.media[h] = media[h]


def _read_targets(path):
    """The until-seq file: one line "NAME SEQ" per engine that has finished."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {name: int(seq) for name, seq in (line.split() for line in f if line.strip())}


def follow(args):
    certs = dict(args.engine_cert or [])
    if certs and not args.client_cert:
        raise SystemExit("--engine-cert needs --client-cert (the router's NAME.key_secret)")
    engines = [tuple(e) + ((CurveKeys.load(args.client_cert, certs[e[0]]),)
                           if e[0] in certs else ()) for e in args.engine]
    router = KvRouter(engines)
    if args.state and os.path.exists(args.state):
        _load_state(router, args.state)  # a restart: resume from the saved seq (replay)
    else:
        for feed in router.feeds:
            feed.sync()
    print("synced", flush=True)
    deadline = time.monotonic() + args.timeout_s
    while time.monotonic() < deadline:
        router.poll(timeout_ms=20)
        if args.state:
            _save_state(router, args.state)
        targets = _read_targets(args.until_seq_file)
        if len(targets) == len(router.feeds):
            for feed in router.feeds:
                feed.catch_up(targets[feed.name])
            break
    else:
        print("timed out", file=sys.stderr)
        return 1
    for feed in router.feeds:
        with open(f"{args.index_out}{feed.name}.json", "w") as out:
            json.dump({"hashes": feed.index.entries(),
                       "next_seq": feed.next_seq, "counters": feed.counters}, out)
    router.close()
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("follow", help="follow engines until they finish; write their indexes")
    f.add_argument("--engine", nargs=3, action="append", required=True,
                   metavar=("NAME", "PUB", "REPLAY"))
    f.add_argument("--client-cert", metavar="SECRET_CERT",
                   help="the router's CURVE secret certificate (NAME.key_secret)")
    f.add_argument("--engine-cert", nargs=2, action="append", metavar=("NAME", "PUBLIC_CERT"),
                   help="engine NAME publishes with CURVE; its public certificate (NAME.key)")
    f.add_argument("--state", help="save the index here after each poll; resume from it")
    f.add_argument("--until-seq-file", help='stop once it lists "NAME SEQ" for every engine')
    f.add_argument("--index-out", default="index-", help="write PREFIX<NAME>.json")
    f.add_argument("--timeout-s", type=float, default=120)
    args = parser.parse_args()
    return follow(args)


if __name__ == "__main__":
    sys.exit(main())
