// Tests of KvEventPublisher and its parts: the wire encoding (decoded back with msgpack-c),
// the snapshot mirror, and the sockets (PUB, replay, snapshot) over ipc.
#include "pagedkv/kv_event_publisher.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <msgpack.hpp>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/container/flat_hash_set.h"
#include "events/cache_mirror.h"
#include "events/curve_keys.h"
#include "events/staged_batch.h"
#include "events/wire_format.h"
#include "support/skip.h"
#include "temp_dir.h"

namespace pagedkv {
namespace {

using internal::CacheMirror;
using internal::StagedBatch;

BlockStored stored(std::vector<BlockHash> hashes, std::optional<BlockHash> parent,
                   int32_t block_size = 2, std::vector<uint64_t> extra_keys = {},
                   Medium medium = Medium::kDevice) {
  BlockStored e;
  e.medium = medium;
  e.block_hashes = std::move(hashes);
  e.parent_hash = parent;
  e.block_size = block_size;
  for (size_t i = 0; i < e.block_hashes.size() * block_size; ++i) {
    e.token_ids.push_back(static_cast<TokenId>(100 + i));
  }
  e.extra_keys = std::move(extra_keys);
  return e;
}

// Looks a key up in a decoded msgpack map.
const msgpack::object& field(const msgpack::object& map, std::string_view key) {
  REQUIRE(map.type == msgpack::type::MAP);
  for (const auto& kv : std::span(map.via.map.ptr, map.via.map.size)) {
    if (kv.key.as<std::string>() == key) return kv.val;
  }
  FAIL("no key " << key);
  throw;  // unreachable
}

std::string hash_hex(const msgpack::object& bin) {
  REQUIRE(bin.type == msgpack::type::BIN);
  std::string hex;
  for (uint32_t i = 0; i < bin.via.bin.size; ++i) {
    char byte[3];
    std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(bin.via.bin.ptr[i]));
    hex += byte;
  }
  return hex;
}

TEST_CASE("a batch encodes as vLLM's KVEventBatch: [ts, events, dp rank], events as tagged maps") {
  StagedBatch batch;
  batch.timestamp = 12.5;
  batch.add(stored({{0x1111, 0xAAAA}, {0x2222, 0xBBBB}}, BlockHash{0x3, 0x4}, 2, {77}));
  batch.add(BlockRemoved{{{0x5, 0x6}}});
  batch.add(KvEvent{std::in_place_type<AllBlocksCleared>});
  std::string payload;
  internal::encode_batch(batch, {.device_medium = "GPU", .data_parallel_rank = 3}, &payload);

  const msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& root = handle.get();
  REQUIRE(root.type == msgpack::type::ARRAY);
  REQUIRE(root.via.array.size == 3);
  REQUIRE(root.via.array.ptr[0].as<double>() == 12.5);
  REQUIRE(root.via.array.ptr[2].as<int>() == 3);
  const msgpack::object& events = root.via.array.ptr[1];
  REQUIRE(events.via.array.size == 3);

  const msgpack::object& s = events.via.array.ptr[0];
  REQUIRE(s.via.map.size == 10);
  REQUIRE(s.via.map.ptr[0].key.as<std::string>() == "type");  // the tag comes first
  REQUIRE(field(s, "type").as<std::string>() == "BlockStored");
  const msgpack::object& hashes = field(s, "block_hashes");
  REQUIRE(hashes.via.array.size == 2);
  // hi then lo, each big-endian: XXH3-128's canonical byte order.
  REQUIRE(hash_hex(hashes.via.array.ptr[0]) == "000000000000aaaa0000000000001111");
  REQUIRE(hash_hex(field(s, "parent_block_hash")) == "00000000000000040000000000000003");
  REQUIRE(field(s, "token_ids").as<std::vector<int>>() == std::vector<int>{100, 101, 102, 103});
  REQUIRE(field(s, "block_size").as<int>() == 2);
  REQUIRE(field(s, "lora_id").is_nil());
  REQUIRE(field(s, "lora_name").is_nil());
  REQUIRE(field(s, "medium").as<std::string>() == "GPU");
  REQUIRE(field(s, "group_idx").as<int>() == 0);
  // One extra-keys entry per block.
  const auto keys = field(s, "extra_keys").as<std::vector<std::vector<uint64_t>>>();
  REQUIRE(keys == std::vector<std::vector<uint64_t>>{{77}, {77}});

  const msgpack::object& r = events.via.array.ptr[1];
  REQUIRE(field(r, "type").as<std::string>() == "BlockRemoved");
  REQUIRE(field(r, "block_hashes").via.array.size == 1);
  REQUIRE(field(r, "medium").as<std::string>() == "GPU");
  REQUIRE(field(events.via.array.ptr[2], "type").as<std::string>() == "AllBlocksCleared");
  REQUIRE(events.via.array.ptr[2].via.map.size == 1);
}

TEST_CASE("a BlockStored without extra keys or parent sends nil for both") {
  StagedBatch batch;
  batch.add(stored({{1, 1}}, std::nullopt));
  std::string payload;
  internal::encode_batch(batch, {}, &payload);
  const msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& s = handle.get().via.array.ptr[1].via.array.ptr[0];
  REQUIRE(field(s, "parent_block_hash").is_nil());
  const msgpack::object& keys = field(s, "extra_keys");
  REQUIRE(keys.via.array.size == 1);
  REQUIRE(keys.via.array.ptr[0].is_nil());
}

TEST_CASE("each event carries its own medium: device blocks the option's string, host ones CPU") {
  StagedBatch batch;
  // A demotion (device -> host) and a promotion (host -> device), as the manager emits them.
  batch.add(BlockRemoved{{{0x1, 0x1}}, Medium::kDevice});
  batch.add(stored({{0x1, 0x1}}, std::nullopt, 2, {}, Medium::kHost));
  batch.add(BlockRemoved{{{0x2, 0x2}}, Medium::kHost});
  batch.add(stored({{0x2, 0x2}}, BlockHash{0x1, 0x1}, 2, {}, Medium::kDevice));
  std::string payload;
  internal::encode_batch(batch, {.device_medium = "HBM"}, &payload);
  const msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& events = handle.get().via.array.ptr[1];
  REQUIRE(events.via.array.size == 4);
  const char* expected_type[] = {"BlockRemoved", "BlockStored", "BlockRemoved", "BlockStored"};
  const char* expected_medium[] = {"HBM", "CPU", "CPU", "HBM"};
  const size_t expected_keys[] = {4, 10, 4, 10};  // vLLM's field sets, unchanged
  for (uint32_t i = 0; i < 4; ++i) {
    INFO("event " << i);
    const msgpack::object& e = events.via.array.ptr[i];
    REQUIRE(field(e, "type").as<std::string>() == expected_type[i]);
    REQUIRE(field(e, "medium").as<std::string>() == expected_medium[i]);
    REQUIRE(e.via.map.size == expected_keys[i]);
  }
  // The default device medium is vLLM's "GPU".
  internal::encode_batch(batch, {}, &payload);
  const msgpack::object_handle defaults = msgpack::unpack(payload.data(), payload.size());
  REQUIRE(field(defaults.get().via.array.ptr[1].via.array.ptr[0], "medium").as<std::string>() ==
          "GPU");
}

// The (hash, medium) pairs a snapshot stores, in order, after its AllBlocksCleared.
std::vector<std::pair<uint64_t, Medium>> snapshot_entries(const CacheMirror& mirror) {
  std::vector<std::pair<uint64_t, Medium>> entries;
  for (const StagedBatch& b : mirror.snapshot(1000)) {
    b.for_each([&](const internal::StagedEventView& v) {
      if (v.event.kind != internal::EventKind::kStored) return;
      for (const BlockHash& h : v.hashes) entries.emplace_back(h.lo, v.event.medium);
    });
  }
  return entries;
}

TEST_CASE("the mirror tracks a block per medium: demoted, promoted, held by both, dropped") {
  CacheMirror mirror;
  StagedBatch batch;
  const BlockHash a{1, 0}, b{2, 0}, c{3, 0};
  batch.add(stored({a, b, c}, std::nullopt));  // a chain a <- b <- c on the device
  mirror.apply(batch);
  REQUIRE(mirror.size() == 3);

  // c is evicted and demoted: removed from the device, stored on the host.
  batch.clear();
  batch.add(BlockRemoved{{c}, Medium::kDevice});
  batch.add(stored({c}, b, 2, {}, Medium::kHost));
  mirror.apply(batch);
  REQUIRE(mirror.size() == 3);
  using P = std::pair<uint64_t, Medium>;
  REQUIRE(snapshot_entries(mirror) ==
          std::vector<P>{{1, Medium::kDevice}, {2, Medium::kDevice}, {3, Medium::kHost}});

  // b also gets a host copy while it is still on the device (stored first, removed later):
  // both media hold it, and the snapshot stores it in both.
  batch.clear();
  batch.add(stored({b}, a, 2, {}, Medium::kHost));
  mirror.apply(batch);
  REQUIRE(mirror.size() == 4);
  std::vector<P> entries = snapshot_entries(mirror);
  REQUIRE(std::count(entries.begin(), entries.end(), P{2, Medium::kDevice}) == 1);
  REQUIRE(std::count(entries.begin(), entries.end(), P{2, Medium::kHost}) == 1);

  // Removing from one medium leaves the other; a removal of a block the medium does not
  // hold changes nothing.
  batch.clear();
  batch.add(BlockRemoved{{b}, Medium::kDevice});
  batch.add(BlockRemoved{{a}, Medium::kHost});
  mirror.apply(batch);
  REQUIRE(mirror.size() == 3);
  REQUIRE(snapshot_entries(mirror) ==
          std::vector<P>{{1, Medium::kDevice}, {2, Medium::kHost}, {3, Medium::kHost}});

  // c is promoted back (host -> device), then the host tier drops b.
  batch.clear();
  batch.add(BlockRemoved{{c}, Medium::kHost});
  batch.add(stored({c}, b, 2, {}, Medium::kDevice));
  batch.add(BlockRemoved{{b}, Medium::kHost});
  mirror.apply(batch);
  REQUIRE(mirror.size() == 2);
  // c's parent b is no longer held anywhere: the walk ends there, and c keeps b as parent.
  entries = snapshot_entries(mirror);
  std::sort(entries.begin(), entries.end());
  REQUIRE(entries == std::vector<P>{{1, Medium::kDevice}, {3, Medium::kDevice}});
  for (const StagedBatch& s : mirror.snapshot(1000)) {
    s.for_each([&](const internal::StagedEventView& v) {
      if (v.event.kind == internal::EventKind::kStored && v.hashes[0] == c) {
        REQUIRE(v.event.has_parent);
        REQUIRE(v.event.parent == b);
      }
    });
  }

  // The snapshot rebuilds the same per-medium state in an empty mirror.
  CacheMirror rebuilt;
  for (const StagedBatch& s : mirror.snapshot(1)) rebuilt.apply(s);
  REQUIRE(rebuilt.size() == 2);
  std::vector<P> again = snapshot_entries(rebuilt);
  std::sort(again.begin(), again.end());
  REQUIRE(again == entries);
}

TEST_CASE("the snapshot holds every mirrored block once, parents before children") {
  CacheMirror mirror;
  StagedBatch batch;
  // A chain of 40 blocks stored in four calls, a sibling branch, then two removals.
  std::vector<BlockHash> chain;
  for (uint64_t i = 0; i < 40; ++i) chain.push_back({i, 1});
  for (int part = 0; part < 4; ++part) {
    std::vector<BlockHash> run(chain.begin() + part * 10, chain.begin() + part * 10 + 10);
    batch.add(stored(run, part == 0 ? std::nullopt : std::optional(chain[part * 10 - 1])));
  }
  batch.add(stored({{7, 2}, {8, 2}}, chain[5]));
  batch.add(BlockRemoved{{chain[39], chain[20]}});  // 21..38 lose their cached parent
  mirror.apply(batch);
  REQUIRE(mirror.size() == 40);

  const std::vector<StagedBatch> snapshot = mirror.snapshot(/*blocks_per_batch=*/7);
  REQUIRE(snapshot.size() == 6);  // ceil(40 / 7)
  REQUIRE(snapshot[0].events[0].kind == internal::EventKind::kCleared);
  absl::flat_hash_set<BlockHash> seen;
  for (const StagedBatch& b : snapshot) {
    REQUIRE(b.events.size() <= 8);
    b.for_each([&](const internal::StagedEventView& v) {
      if (v.event.kind != internal::EventKind::kStored) return;
      REQUIRE(v.hashes.size() == 1);
      REQUIRE(v.tokens.size() == 2);
      if (v.event.has_parent && v.event.parent != chain[20]) {
        INFO("block " << v.hashes[0].lo << " before its parent " << v.event.parent.lo);
        REQUIRE(seen.contains(v.event.parent));
      }
      REQUIRE(seen.insert(v.hashes[0]).second);
    });
  }
  REQUIRE(seen.size() == 40);

  // Applied to an empty mirror, the snapshot rebuilds the same one.
  CacheMirror rebuilt;
  for (const StagedBatch& b : snapshot) rebuilt.apply(b);
  REQUIRE(rebuilt.snapshot(1000).at(0).hashes.size() == 40);
  StagedBatch clear;
  clear.add_cleared();
  mirror.apply(clear);
  REQUIRE(mirror.size() == 0);
}

// --- sockets -----------------------------------------------------------------------------

std::string ipc_endpoint(const char* name) {
  return "ipc:///tmp/pagedkv-test-" + std::to_string(getpid()) + "-" + name;
}

struct Message {
  std::string topic;
  int64_t seq = 0;
  std::string payload;
};

int64_t big_endian(const zmq::message_t& m) {
  REQUIRE(m.size() == 8);
  int64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<const unsigned char*>(m.data())[i];
  return v;
}

// Receives one (topic, seq, payload) message, with `skip` leading frames; waits at most 5 s.
Message receive(zmq::socket_t& socket, size_t skip = 0) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 1);
  std::vector<zmq::message_t> frames;
  REQUIRE(zmq::recv_multipart(socket, std::back_inserter(frames)));
  REQUIRE(frames.size() == skip + 3);
  return {frames[skip].to_string(), big_endian(frames[skip + 1]), frames[skip + 2].to_string()};
}

void request(zmq::socket_t& dealer, int64_t value) {
  std::array<char, 8> bytes = internal::seq_bytes(value);
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(bytes));
}

size_t num_events(const std::string& payload) {
  const msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
  return handle.get().via.array.ptr[1].via.array.size;
}

TEST_CASE("steps go out in order on PUB, replay resends from a seq, snapshot gives the state") {
  auto publisher = KvEventPublisher::create(
      {.endpoint = ipc_endpoint("pub"), .replay_endpoint = ipc_endpoint("replay"), .topic = "kv"});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;
  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect(p.endpoint());
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.connect(p.replay_endpoint());
  // A snapshot round trip proves the publisher is up; the SUB connection is made by then.
  request(dealer, KvEventPublisher::kSnapshotRequest);
  REQUIRE(num_events(receive(dealer, 1).payload) == 1);  // AllBlocksCleared only
  REQUIRE(receive(dealer, 1).seq == KvEventPublisher::kEndOfReply);

  p.end_step();  // no events: nothing sent, no seq used
  p.on_event(stored({{1, 0}, {2, 0}}, std::nullopt));
  p.end_step();
  p.on_event(stored({{3, 0}}, BlockHash{2, 0}));
  p.on_event(BlockRemoved{{{1, 0}}});
  p.end_step();
  p.on_event(stored({{4, 0}}, std::nullopt));
  p.end_step();
  for (int64_t seq = 0; seq < 3; ++seq) {
    const Message m = receive(sub);
    REQUIRE(m.topic == "kv");
    REQUIRE(m.seq == seq);
    REQUIRE(num_events(m.payload) == (seq == 1 ? 2u : 1u));
  }

  request(dealer, 1);
  REQUIRE(receive(dealer, 1).seq == 1);
  REQUIRE(receive(dealer, 1).seq == 2);
  const Message end = receive(dealer, 1);
  REQUIRE(end.seq == KvEventPublisher::kEndOfReply);
  REQUIRE(end.topic.empty());
  REQUIRE(end.payload.empty());

  // Blocks 2, 3, 4 are cached: AllBlocksCleared + 3 BlockStored, consistent with seq 3.
  request(dealer, KvEventPublisher::kSnapshotRequest);
  const Message snapshot = receive(dealer, 1);
  REQUIRE(snapshot.seq == 3);
  REQUIRE(num_events(snapshot.payload) == 4);
  REQUIRE(receive(dealer, 1).seq == KvEventPublisher::kEndOfReply);

  const KvEventPublisher::Stats s = p.stats();
  REQUIRE(s.next_seq == 3);
  REQUIRE(s.steps_published == 3);
  REQUIRE(s.events_published == 4);
  REQUIRE(s.replay_requests == 1);
  REQUIRE(s.snapshot_requests == 2);
  REQUIRE(s.cached_blocks == 3);
}

TEST_CASE("a start seq reads as vLLM reads it: empty or short is unsigned, -1's bytes END only") {
  auto publisher = KvEventPublisher::create(
      {.endpoint = ipc_endpoint("short-pub"), .replay_endpoint = ipc_endpoint("short-replay")});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;
  for (uint64_t h = 1; h <= 3; ++h) {
    p.on_event(stored({{h, 0}}, std::nullopt));
    p.end_step();
  }
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.connect(p.replay_endpoint());
  // Steps are published before a request is served: wait until a replay holds all three.
  auto replayed_seqs = [&](std::string_view start) {
    dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    dealer.send(zmq::buffer(start));
    std::vector<int64_t> seqs;
    for (Message m = receive(dealer, 1); m.seq != KvEventPublisher::kEndOfReply;
         m = receive(dealer, 1)) {
      seqs.push_back(m.seq);
    }
    return seqs;
  };
  const std::vector<int64_t> all = {0, 1, 2};
  int tries = 0;
  while (replayed_seqs(std::string_view("\0\0\0\0\0\0\0\0", 8)) != all) {
    REQUIRE(++tries < 1000);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(replayed_seqs("") == all);
  REQUIRE(replayed_seqs(std::string_view("\0\0\0\0", 4)) == all);
  REQUIRE(replayed_seqs(std::string_view("\0\0\0\2", 4)) == std::vector<int64_t>{2});
  REQUIRE(replayed_seqs(std::string_view("\xff\xff\xff\xff\xff\xff\xff\xff", 8)).empty());
  REQUIRE(replayed_seqs(std::string_view("\1\0\0\0\0\0\0\0\0", 9)).empty());
}

TEST_CASE(
    "a subscriber that stops reading loses messages at the HWM, counted, but replay has them") {
  auto publisher = KvEventPublisher::create({.endpoint = ipc_endpoint("hwm"),
                                             .replay_endpoint = ipc_endpoint("hwm-replay"),
                                             .replay_buffer_steps = 100000,
                                             .hwm = 2});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;
  zmq::context_t context;
  zmq::socket_t stalled(context, zmq::socket_type::sub);
  stalled.set(zmq::sockopt::subscribe, "");
  stalled.set(zmq::sockopt::rcvhwm, 1);
  stalled.connect(p.endpoint());
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.connect(p.replay_endpoint());
  request(dealer, KvEventPublisher::kSnapshotRequest);  // the publisher is up
  receive(dealer, 1);
  receive(dealer, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the SUB has subscribed

  // About 4 MB: far more than the socket buffers and the two-message HWM hold.
  const std::vector<TokenId> tokens(256, 7);
  constexpr int kSteps = 1000;
  for (int step = 0; step < kSteps; ++step) {
    for (uint64_t i = 0; i < 16; ++i) {
      BlockStored e;
      e.block_hashes = {BlockHash{i, static_cast<uint64_t>(step)}};
      e.token_ids = tokens;
      e.block_size = 256;
      p.on_event(e);
    }
    p.end_step();  // never waits for the stalled subscriber
  }
  KvEventPublisher::Stats s;
  for (int i = 0; i < 10000; ++i) {
    s = p.stats();
    if (s.steps_published + s.steps_dropped_hwm + s.steps_dropped_queue == kSteps) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(s.steps_published + s.steps_dropped_hwm + s.steps_dropped_queue == kSteps);
  REQUIRE(s.steps_dropped_hwm > 0);
  REQUIRE(s.events_dropped_hwm == 16 * s.steps_dropped_hwm);
  // The last step was handed off whatever the subscriber did; a replay still has it.
  request(dealer, kSteps - 1);
  REQUIRE(receive(dealer, 1).seq == kSteps - 1);
  REQUIRE(receive(dealer, 1).seq == KvEventPublisher::kEndOfReply);
}

TEST_CASE("a step beyond max_queued_events is dropped, counted, and leaves a seq gap") {
  auto publisher =
      KvEventPublisher::create({.endpoint = ipc_endpoint("drop"), .max_queued_events = 2});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;
  for (int i = 0; i < 3; ++i) p.on_event(BlockRemoved{{{1, 0}}});
  p.end_step();  // 3 events > 2: dropped
  p.on_event(BlockRemoved{{{1, 0}}});
  p.end_step();
  const KvEventPublisher::Stats s = p.stats();
  REQUIRE(s.steps_dropped_queue == 1);
  REQUIRE(s.events_dropped_queue == 3);
  REQUIRE(s.next_seq == 2);  // the dropped step used seq 0
}

TEST_CASE("bad options and unbindable endpoints are refused with the value") {
  auto no_endpoint = KvEventPublisher::create({});
  REQUIRE(no_endpoint.status().code() == absl::StatusCode::kInvalidArgument);
  auto bad_buffer =
      KvEventPublisher::create({.endpoint = ipc_endpoint("x"), .replay_buffer_steps = 0});
  REQUIRE(bad_buffer.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(bad_buffer.status().message()),
               Catch::Contains("replay_buffer_steps 0"));
  auto bad_scheme = KvEventPublisher::create({.endpoint = "nonsense://here"});
  REQUIRE(bad_scheme.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE_THAT(std::string(bad_scheme.status().message()), Catch::Contains("nonsense://here"));

  auto first = KvEventPublisher::create({.endpoint = "tcp://127.0.0.1:*"});
  REQUIRE(first.ok());
  auto taken = KvEventPublisher::create({.endpoint = (*first)->endpoint()});
  REQUIRE(taken.status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("reply limits must be positive, and the refusal names the value") {
  auto no_hwm = KvEventPublisher::create({.endpoint = ipc_endpoint("x"), .reply_hwm = 0});
  REQUIRE(no_hwm.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(no_hwm.status().message()), Catch::Contains("reply_hwm 0 must be > 0"));
  auto no_timeout =
      KvEventPublisher::create({.endpoint = ipc_endpoint("x"), .stalled_peer_timeout_ms = -5});
  REQUIRE(no_timeout.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(no_timeout.status().message()),
               Catch::Contains("stalled_peer_timeout_ms -5 must be > 0"));
}

// Every frame of the next message on `socket`, or none when nothing comes within
// `timeout_ms`.
std::vector<zmq::message_t> frames_within(zmq::socket_t& socket, int timeout_ms) {
  std::vector<zmq::message_t> frames;
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 1) {
    REQUIRE(zmq::recv_multipart(socket, std::back_inserter(frames)));
  }
  return frames;
}

bool is_busy(const std::vector<zmq::message_t>& frames) {
  return frames.size() == 4 && frames[0].size() == 0 &&
         frames[1].to_string() == KvEventPublisher::kBusyMarker &&
         big_endian(frames[2]) == KvEventPublisher::kEndOfReply && frames[3].size() == 0;
}

TEST_CASE("a request beyond max_pending_requests is answered busy: END with the marker") {
  auto publisher = KvEventPublisher::create({.endpoint = ipc_endpoint("busy-pub"),
                                             .replay_endpoint = ipc_endpoint("busy-replay"),
                                             .max_pending_requests = 1,
                                             .reply_hwm = 1,
                                             .reply_sndbuf_bytes = 4096,
                                             .stalled_peer_timeout_ms = 60000});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;
  const std::vector<TokenId> tokens(1024, 7);  // 4 KiB a batch
  for (int step = 0; step < 200; ++step) {
    BlockStored e;
    e.block_hashes = {BlockHash{static_cast<uint64_t>(step), 1}};
    e.token_ids = tokens;
    e.block_size = 1024;
    p.on_event(e);
    p.end_step();
  }
  zmq::context_t context;
  // A peer that asks for the whole buffer and never reads: its reply stays pending.
  zmq::socket_t stalled(context, zmq::socket_type::dealer);
  stalled.set(zmq::sockopt::rcvhwm, 1);
  stalled.set(zmq::sockopt::rcvbuf, 4096);
  stalled.connect(p.replay_endpoint());
  for (int i = 0; i < 5000 && p.stats().steps_published < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  request(stalled, 0);
  for (int i = 0; i < 5000 && p.stats().replay_requests == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(p.stats().replay_requests == 1);

  zmq::socket_t asker(context, zmq::socket_type::dealer);
  asker.connect(p.replay_endpoint());
  request(asker, 0);
  REQUIRE(is_busy(frames_within(asker, 5000)));
  REQUIRE(frames_within(asker, 100).empty());  // nothing else: the request was not queued
  request(asker, KvEventPublisher::kSnapshotRequest);
  REQUIRE(is_busy(frames_within(asker, 5000)));
  const KvEventPublisher::Stats s = p.stats();
  REQUIRE(s.requests_refused == 2);
  REQUIRE(s.replay_requests == 1);
  REQUIRE(s.snapshot_requests == 0);
}

TEST_CASE("a replay ends at the last batch published when its request was read") {
  auto publisher = KvEventPublisher::create({.endpoint = ipc_endpoint("bounded-pub"),
                                             .replay_endpoint = ipc_endpoint("bounded-replay"),
                                             .stalled_peer_timeout_ms = 60000});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;
  auto publish = [&](int first, int count) {
    for (int step = first; step < first + count; ++step) {
      p.on_event(stored({{static_cast<uint64_t>(step), 3}}, std::nullopt));
      p.end_step();
    }
    for (int i = 0; i < 5000 && p.stats().steps_published < first + count; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(p.stats().steps_published == first + count);
  };
  constexpr int kBefore = 300, kAfter = 300;
  publish(0, kBefore);
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.connect(p.replay_endpoint());
  request(dealer, 0);
  for (int i = 0; i < 5000 && p.stats().replay_requests == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(p.stats().replay_requests == 1);
  // Published while the reply is pending (more than reply_hwm batches of it are unread).
  publish(kBefore, kAfter);
  int64_t expected = 0;
  for (Message m = receive(dealer, 1); m.seq != KvEventPublisher::kEndOfReply;
       m = receive(dealer, 1)) {
    REQUIRE(m.seq == expected++);
  }
  REQUIRE(expected == kBefore);
}

TEST_CASE("a peer's second request while its reply is pending is answered busy") {
  auto publisher = KvEventPublisher::create(
      {.endpoint = ipc_endpoint("busy2-pub"), .replay_endpoint = ipc_endpoint("busy2-replay")});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;
  constexpr int kSteps = 500;
  for (int step = 0; step < kSteps; ++step) {
    p.on_event(stored({{static_cast<uint64_t>(step), 2}}, std::nullopt));
    p.end_step();
  }
  for (int i = 0; i < 5000 && p.stats().steps_published < kSteps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.connect(p.replay_endpoint());
  request(dealer, 0);  // 500 batches: sent over many turns
  request(dealer, 0);  // read with the first, while it is pending: refused
  int batches = 0, busy = 0;
  for (;;) {
    std::vector<zmq::message_t> frames = frames_within(dealer, 5000);
    REQUIRE(frames.size() == 4);
    if (is_busy(frames)) {
      ++busy;
      continue;
    }
    if (big_endian(frames[2]) == KvEventPublisher::kEndOfReply) break;
    REQUIRE(big_endian(frames[2]) == batches);  // the first reply, whole and in order
    ++batches;
  }
  REQUIRE(batches == kSteps);
  REQUIRE(busy == 1);
  REQUIRE(p.stats().requests_refused == 1);
}

// Writes a fresh key pair's certificates to DIR/NAME.key and DIR/NAME.key_secret.
internal::CurveKeyPair make_certificates(const std::string& dir, const std::string& name) {
  std::filesystem::create_directories(dir);
  absl::StatusOr<internal::CurveKeyPair> keys = internal::new_curve_key_pair();
  REQUIRE(keys.ok());
  REQUIRE(internal::write_certificate(dir + "/" + name + ".key", *keys, false).ok());
  REQUIRE(internal::write_certificate(dir + "/" + name + ".key_secret", *keys, true).ok());
  return *keys;
}

// A client socket with CURVE keys (server_key: the publisher's public key).
zmq::socket_t curve_client(zmq::context_t& context, zmq::socket_type type,
                           const internal::CurveKeyPair* own, const std::string& server_key) {
  zmq::socket_t socket(context, type);
  socket.set(zmq::sockopt::linger, 0);
  // A DEALER whose handshakes fail has no peer to queue a request for: never block on it.
  socket.set(zmq::sockopt::sndtimeo, 100);
  if (type == zmq::socket_type::sub) socket.set(zmq::sockopt::subscribe, "");
  if (own != nullptr) {
    socket.set(zmq::sockopt::curve_serverkey, server_key);
    socket.set(zmq::sockopt::curve_publickey, own->public_key);
    socket.set(zmq::sockopt::curve_secretkey, own->secret_key);
  }
  return socket;
}

TEST_CASE("with CURVE an allowed client receives and replays while others receive nothing") {
  if (!internal::curve_available()) {
    testing::report_skip("libzmq was built without CURVE (zmq_has(\"curve\") is false)");
    return;
  }
  testing::TempDir dir;
  const internal::CurveKeyPair server = make_certificates(dir.path(), "engine");
  const internal::CurveKeyPair router = make_certificates(dir.path() + "/clients", "router");
  const internal::CurveKeyPair stranger = make_certificates(dir.path() + "/others", "stranger");
  const internal::CurveKeyPair impostor = make_certificates(dir.path() + "/others", "impostor");
  auto publisher =
      KvEventPublisher::create({.endpoint = "tcp://127.0.0.1:*",
                                .replay_endpoint = "tcp://127.0.0.1:*",
                                .curve_secret_key_file = dir.path() + "/engine.key_secret",
                                .curve_allowed_clients_dir = dir.path() + "/clients"});
  REQUIRE(publisher.ok());
  KvEventPublisher& p = **publisher;

  zmq::context_t context;
  zmq::socket_t keyed = curve_client(context, zmq::socket_type::sub, &router, server.public_key);
  zmq::socket_t unkeyed = curve_client(context, zmq::socket_type::sub, nullptr, "");
  zmq::socket_t wrong_key =
      curve_client(context, zmq::socket_type::sub, &stranger, server.public_key);
  // An allowed key pair, but another server key: the client is talking to someone else.
  zmq::socket_t wrong_server =
      curve_client(context, zmq::socket_type::sub, &router, impostor.public_key);
  zmq::socket_t keyed_dealer =
      curve_client(context, zmq::socket_type::dealer, &router, server.public_key);
  zmq::socket_t unkeyed_dealer = curve_client(context, zmq::socket_type::dealer, nullptr, "");
  zmq::socket_t wrong_dealer =
      curve_client(context, zmq::socket_type::dealer, &stranger, server.public_key);
  for (zmq::socket_t* s : {&keyed, &unkeyed, &wrong_key, &wrong_server}) s->connect(p.endpoint());
  for (zmq::socket_t* s : {&keyed_dealer, &unkeyed_dealer, &wrong_dealer}) {
    s->connect(p.replay_endpoint());
  }
  // The keyed DEALER's round trip proves the handshakes run; give the SUBs time to join.
  request(keyed_dealer, KvEventPublisher::kSnapshotRequest);
  REQUIRE(num_events(receive(keyed_dealer, 1).payload) == 1);
  REQUIRE(receive(keyed_dealer, 1).seq == KvEventPublisher::kEndOfReply);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  for (uint64_t h = 1; h <= 3; ++h) {
    p.on_event(stored({{h, 0}}, std::nullopt));
    p.end_step();
  }
  for (int64_t seq = 0; seq < 3; ++seq) REQUIRE(receive(keyed).seq == seq);
  request(keyed_dealer, 1);
  REQUIRE(receive(keyed_dealer, 1).seq == 1);
  REQUIRE(receive(keyed_dealer, 1).seq == 2);
  REQUIRE(receive(keyed_dealer, 1).seq == KvEventPublisher::kEndOfReply);

  request(unkeyed_dealer, 0);
  request(wrong_dealer, 0);
  for (zmq::socket_t* s : {&unkeyed, &wrong_key, &wrong_server, &unkeyed_dealer, &wrong_dealer}) {
    REQUIRE(frames_within(*s, 200).empty());
  }
  const KvEventPublisher::Stats s = p.stats();
  REQUIRE(s.replay_requests == 1);     // the others' requests never reached the publisher
  REQUIRE(s.handshakes_refused >= 2);  // the stranger's SUB and DEALER (they retry)
}

TEST_CASE("CURVE options are checked: both or neither and key files named when wrong") {
  testing::TempDir dir;
  auto half = KvEventPublisher::create(
      {.endpoint = ipc_endpoint("curve-x"), .curve_secret_key_file = dir.path() + "/s"});
  REQUIRE(half.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(half.status().message()),
               Catch::Contains("is set but curve_allowed_clients_dir is empty"));
  auto other_half = KvEventPublisher::create(
      {.endpoint = ipc_endpoint("curve-x"), .curve_allowed_clients_dir = dir.path()});
  REQUIRE_THAT(std::string(other_half.status().message()),
               Catch::Contains("is set but curve_secret_key_file is empty"));
  if (!internal::curve_available()) {
    testing::report_skip("libzmq was built without CURVE (zmq_has(\"curve\") is false)");
    return;
  }
  auto missing = KvEventPublisher::create({.endpoint = ipc_endpoint("curve-x"),
                                           .curve_secret_key_file = dir.path() + "/absent",
                                           .curve_allowed_clients_dir = dir.path()});
  REQUIRE(missing.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(missing.status().message()),
               Catch::Contains("KvEventPublisher: CURVE certificate " + dir.path() +
                               "/absent: cannot open"));
  make_certificates(dir.path(), "engine");
  auto no_clients =
      KvEventPublisher::create({.endpoint = ipc_endpoint("curve-x"),
                                .curve_secret_key_file = dir.path() + "/engine.key_secret",
                                .curve_allowed_clients_dir = dir.path() + "/clients"});
  REQUIRE(no_clients.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(no_clients.status().message()),
               Catch::Contains("/clients: cannot list"));
}

}  // namespace
}  // namespace pagedkv
