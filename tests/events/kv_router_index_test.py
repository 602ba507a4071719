#!/usr/bin/env python3
"""Unit test of the reference router's per-medium index (examples/kv_router/kv_router.py):
events decoded from the wire schema, exact expected entries, prefixes and scores.
usage: kv_router_index_test.py ROUTER_DIR
"""

import sys

sys.path.insert(0, sys.argv[1])
import kv_events_schema as schema  # noqa: E402
import kv_router  # noqa: E402

BS = 2
GPU, CPU = kv_router.DEVICE_MEDIUM, kv_router.HOST_MEDIUM
A, B, C = b"\xaa" * 16, b"\xbb" * 16, b"\xcc" * 16
TOKENS = [1, 2, 3, 4, 5, 6]  # blocks A = [1, 2], B = [3, 4], C = [5, 6]
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def stored(hashes, parent, tokens, medium):
    return schema.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                              block_size=BS, lora_id=None, medium=medium, lora_name=None)


def removed(hashes, medium):
    return schema.BlockRemoved(block_hashes=hashes, medium=medium)


def apply(index, *events):
    # Through the wire: encode as the engine would, decode as the router does.
    payload = schema.msgspec.msgpack.encode(schema.KVEventBatch(ts=0.0, events=list(events)))
    index.apply(schema.decoder.decode(payload))


index = kv_router.EngineIndex()
apply(index, stored([A, B, C], None, TOKENS, GPU))
check(index.entries() == sorted(f"{h.hex()} GPU" for h in (A, B, C)), "three device blocks")
check(index.prefix_blocks(TOKENS + [0], BS) == 3, "prefix of 3 blocks")
check(index.prefix_score(TOKENS + [0], BS) == 3.0, "score 3 (all on the device)")

# C is evicted and demoted to the host tier: still a prefix hit, worth HOST_HIT_WEIGHT.
apply(index, removed([C], GPU), stored([C], B, [5, 6], CPU))
check(index.entries() == sorted([f"{A.hex()} GPU", f"{B.hex()} GPU", f"{C.hex()} CPU"]),
      "C moved to the host tier")
check(index.prefix_media(TOKENS, BS) == [{GPU}, {GPU}, {CPU}], "media along the prefix")
check(index.prefix_blocks(TOKENS, BS) == 3, "a host block still extends the prefix")
check(abs(index.prefix_score(TOKENS, BS) - (2 + kv_router.HOST_HIT_WEIGHT)) < 1e-12,
      f"score 2 + {kv_router.HOST_HIT_WEIGHT}")
check(index.prefix_score(TOKENS, BS, host_weight=0.0) == 2.0, "host weight 0: device only")

# B is stored on the host before it leaves the device: both media hold it for a moment.
apply(index, stored([B], A, [3, 4], CPU))
check(index.prefix_media(TOKENS, BS)[1] == {GPU, CPU}, "B held by both media")
check(len(index.entries()) == 4, "four (block, medium) entries")
apply(index, removed([B], GPU))
check(index.prefix_media(TOKENS, BS) == [{GPU}, {CPU}, {CPU}], "B on the host only")

# A removal from a medium that does not hold the block changes nothing; an event without a
# medium is a device event (vLLM before media).
apply(index, removed([A], CPU))
check(index.prefix_blocks(TOKENS, BS) == 3, "removing A from the host: no change")
apply(index, removed([A], None))
check(index.prefix_blocks(TOKENS, BS) == 0, "A gone: no prefix from the first block on")
check(sorted(index.entries()) == sorted([f"{B.hex()} CPU", f"{C.hex()} CPU"]),
      "B and C stay in the host tier")

# C promoted back (host -> device), then the host tier drops B; then a flush.
apply(index, removed([C], CPU), stored([C], B, [5, 6], GPU), removed([B], CPU))
check(index.entries() == [f"{C.hex()} GPU"], "C on the device, B dropped")
apply(index, schema.AllBlocksCleared())
check(index.entries() == [] and index.by_content == {}, "AllBlocksCleared empties every medium")

# Two engines: a longer prefix in the host tier beats a shorter one on the device, unless
# the host weight says otherwise.
device_short, host_long = kv_router.EngineIndex(), kv_router.EngineIndex()
apply(device_short, stored([A, B], None, TOKENS[:4], GPU))
apply(host_long, stored([A], None, TOKENS[:2], GPU), stored([B, C], A, TOKENS[2:], CPU))
check(device_short.prefix_score(TOKENS, BS) == 2.0, "device engine: score 2")
check(abs(host_long.prefix_score(TOKENS, BS) - (1 + 2 * kv_router.HOST_HIT_WEIGHT)) < 1e-12,
      "host engine: score 1 + 2 x weight (> 2)")
check(host_long.prefix_score(TOKENS, BS, host_weight=0.25) == 1.5, "weight 0.25: score 1.5")

if failures:
    print(f"FAIL: {len(failures)} check(s)")
    sys.exit(1)
print("PASS")
