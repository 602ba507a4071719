// KV events of a hybrid model (several layer groups): the group fields on the wire as vLLM
// encodes them, the snapshot mirror per (block, group, medium), and a real manager's
// events rebuilding every group's cached hashes exactly.
#include <catch2/catch.hpp>
#include <msgpack.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "events/cache_mirror.h"
#include "events/staged_batch.h"
#include "events/wire_format.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_events.h"

namespace pagedkv {
namespace {

using internal::CacheMirror;
using internal::StagedBatch;

constexpr EventGroup kFullGroup{0, AttentionKind::kFull, 0};
constexpr EventGroup kWindowGroup{1, AttentionKind::kSlidingWindow, 1024};
constexpr EventGroup kChunkGroup{2, AttentionKind::kChunkedLocal, 8192};

BlockStored stored(std::vector<BlockHash> hashes, std::optional<BlockHash> parent,
                   std::optional<EventGroup> group, Medium medium = Medium::kDevice) {
  BlockStored e;
  e.block_hashes = std::move(hashes);
  e.parent_hash = parent;
  e.block_size = 2;
  for (size_t i = 0; i < e.block_hashes.size() * 2; ++i) {
    e.token_ids.push_back(static_cast<TokenId>(100 + i));
  }
  e.medium = medium;
  e.group = group;
  return e;
}

// The decoded events of one encoded batch.
struct Decoded {
  msgpack::object_handle handle;
  const msgpack::object& events() const { return handle.get().via.array.ptr[1]; }
  const msgpack::object& event(uint32_t i) const { return events().via.array.ptr[i]; }
};

Decoded encode(const StagedBatch& batch) {
  std::string payload;
  internal::encode_batch(batch, {}, &payload);
  return {msgpack::unpack(payload.data(), payload.size())};
}

// The keys of a decoded map, in order.
std::vector<std::string> keys_of(const msgpack::object& map) {
  REQUIRE(map.type == msgpack::type::MAP);
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    keys.push_back(map.via.map.ptr[i].key.as<std::string>());
  }
  return keys;
}

const msgpack::object& field(const msgpack::object& map, std::string_view key) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    if (map.via.map.ptr[i].key.as<std::string>() == key) return map.via.map.ptr[i].val;
  }
  FAIL("no key " << key);
  throw;  // unreachable
}

const std::vector<std::string> kStoredKeys = {
    "type",    "block_hashes", "parent_block_hash", "token_ids",  "block_size",
    "lora_id", "medium",       "lora_name",         "extra_keys", "group_idx"};

TEST_CASE("a layer group's events carry vLLM's group_idx, kv_cache_spec_kind and window") {
  StagedBatch batch;
  batch.add(stored({{1, 1}}, std::nullopt, kWindowGroup));
  batch.add(stored({{2, 2}}, BlockHash{1, 1}, kChunkGroup, Medium::kHost));
  batch.add(stored({{3, 3}}, std::nullopt, kFullGroup));
  batch.add(BlockRemoved{{{1, 1}}, Medium::kDevice, kWindowGroup});
  batch.add(BlockRemoved{{{2, 2}}, Medium::kHost, kChunkGroup});
  const Decoded d = encode(batch);
  REQUIRE(d.events().via.array.size == 5);

  // vLLM's declaration order: the group's kind after group_idx, then the sliding window,
  // which vLLM sends for sliding-window specs only (get_kv_cache_spec_sliding_window()).
  std::vector<std::string> window_keys = kStoredKeys;
  window_keys.push_back("kv_cache_spec_kind");
  window_keys.push_back("kv_cache_spec_sliding_window");
  REQUIRE(keys_of(d.event(0)) == window_keys);
  REQUIRE(field(d.event(0), "group_idx").as<int>() == 1);
  REQUIRE(field(d.event(0), "kv_cache_spec_kind").as<std::string>() == "sliding_window");
  REQUIRE(field(d.event(0), "kv_cache_spec_sliding_window").as<int>() == 1024);

  std::vector<std::string> kind_keys = kStoredKeys;
  kind_keys.push_back("kv_cache_spec_kind");
  REQUIRE(keys_of(d.event(1)) == kind_keys);
  REQUIRE(field(d.event(1), "group_idx").as<int>() == 2);
  REQUIRE(field(d.event(1), "kv_cache_spec_kind").as<std::string>() == "chunked_local_attention");
  REQUIRE(field(d.event(1), "medium").as<std::string>() == "CPU");
  REQUIRE(keys_of(d.event(2)) == kind_keys);
  REQUIRE(field(d.event(2), "group_idx").as<int>() == 0);
  REQUIRE(field(d.event(2), "kv_cache_spec_kind").as<std::string>() == "full_attention");

  // BlockRemoved: vLLM's four keys, group_idx naming the group.
  const std::vector<std::string> removed_keys = {"type", "block_hashes", "medium", "group_idx"};
  REQUIRE(keys_of(d.event(3)) == removed_keys);
  REQUIRE(field(d.event(3), "group_idx").as<int>() == 1);
  REQUIRE(field(d.event(4), "group_idx").as<int>() == 2);
  REQUIRE(field(d.event(4), "medium").as<std::string>() == "CPU");
}

TEST_CASE("events without a group encode exactly as before: ten and four keys, group_idx 0") {
  StagedBatch batch;
  batch.add(stored({{1, 1}}, std::nullopt, std::nullopt));
  batch.add(BlockRemoved{{{1, 1}}});
  const Decoded d = encode(batch);
  REQUIRE(keys_of(d.event(0)) == kStoredKeys);
  REQUIRE(field(d.event(0), "group_idx").as<int>() == 0);
  REQUIRE(keys_of(d.event(1)) ==
          std::vector<std::string>{"type", "block_hashes", "medium", "group_idx"});
  REQUIRE(field(d.event(1), "group_idx").as<int>() == 0);
  REQUIRE(internal::spec_kind_name(AttentionKind::kFull) == std::string("full_attention"));
}

// (hash lo, group, medium) of every block a mirror's snapshot stores.
using Entry = std::tuple<uint64_t, uint64_t, int32_t, Medium>;
std::set<Entry> snapshot_entries(const CacheMirror& mirror, int32_t per_batch = 1000) {
  std::set<Entry> entries;
  for (const StagedBatch& b : mirror.snapshot(per_batch)) {
    b.for_each([&](const internal::StagedEventView& v) {
      if (v.event.kind != internal::EventKind::kStored) return;
      for (const BlockHash& h : v.hashes) {
        entries.emplace(h.lo, h.hi, v.event.has_group ? v.event.group.index : -1, v.event.medium);
      }
    });
  }
  return entries;
}

TEST_CASE("the mirror tracks a block per layer group: one hash in two groups, evicted from one") {
  CacheMirror mirror;
  StagedBatch batch;
  const BlockHash a{1, 0}, b{2, 0}, c{3, 0};
  const EventGroup window{1, AttentionKind::kSlidingWindow, 4};
  // The same chain in both groups, as a hybrid manager caches it.
  batch.add(stored({a, b, c}, std::nullopt, kFullGroup));
  batch.add(stored({a, b, c}, std::nullopt, window));
  mirror.apply(batch);
  REQUIRE(mirror.size() == 6);

  // The window group evicts a and demotes b to its host tier; the full group keeps both.
  batch.clear();
  batch.add(BlockRemoved{{a}, Medium::kDevice, window});
  batch.add(BlockRemoved{{b}, Medium::kDevice, window});
  batch.add(stored({b}, a, window, Medium::kHost));
  mirror.apply(batch);
  REQUIRE(mirror.size() == 5);
  const std::set<Entry> expected = {{1, 0, 0, Medium::kDevice},
                                    {2, 0, 0, Medium::kDevice},
                                    {3, 0, 0, Medium::kDevice},
                                    {2, 0, 1, Medium::kHost},
                                    {3, 0, 1, Medium::kDevice}};
  REQUIRE(snapshot_entries(mirror) == expected);

  // A removal in one group never touches the other's copy.
  batch.clear();
  batch.add(BlockRemoved{{c}, Medium::kDevice, kFullGroup});
  mirror.apply(batch);
  std::set<Entry> after = expected;
  after.erase({3, 0, 0, Medium::kDevice});
  REQUIRE(snapshot_entries(mirror) == after);

  // The snapshot's events keep each group's label (kind and window), and parents come
  // before children within a group: group 1's c names b (held on the host only).
  int stored_events = 0;
  for (const StagedBatch& s : mirror.snapshot(1)) {
    s.for_each([&](const internal::StagedEventView& v) {
      if (v.event.kind != internal::EventKind::kStored) return;
      ++stored_events;
      REQUIRE(v.event.has_group);
      if (v.event.group.index == 1) {
        REQUIRE(v.event.group == window);
        if (v.hashes[0] == c) REQUIRE((v.event.has_parent && v.event.parent == b));
      } else {
        REQUIRE(v.event.group == kFullGroup);
      }
    });
  }
  REQUIRE(stored_events == 4);
  CacheMirror rebuilt;
  for (const StagedBatch& s : mirror.snapshot(1)) rebuilt.apply(s);
  REQUIRE(rebuilt.size() == 4);
  REQUIRE(snapshot_entries(rebuilt) == after);
}

// --- a real manager --------------------------------------------------------------------

// (hash lo, hi, group, medium) as the manager's pools hold them (group -1: no groups).
using Held = Entry;

std::set<Held> manager_index(const KvCacheManager& m) {
  std::set<Held> held;
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    for (const Medium medium : {Medium::kDevice, Medium::kHost}) {
      const BlockPool& pool = medium == Medium::kDevice ? **m.device_pool(g) : **m.host_pool(g);
      for (BlockId b = 0; b < pool.num_blocks(); ++b) {
        const absl::StatusOr<BlockHash> h = pool.cached_hash(b);
        if (h.ok()) held.emplace(h->lo, h->hi, m.num_groups() > 1 ? g : -1, medium);
      }
    }
  }
  return held;
}

// Prompts sharing prefixes, one or two at a time: hits, window releases, evictions and
// (with host blocks) demotions and promotions in every group.
void run_workload(KvCacheManager& m, KvEventBuffer& events, CacheMirror& mirror,
                  std::vector<KvEvent>& all) {
  std::mt19937 rng(11);
  const std::vector<TokenId> system = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  auto end_step = [&] {
    (void)m.take_step_ops();
    StagedBatch batch;
    for (const KvEvent& e : events.take()) {
      batch.add(e);
      all.push_back(e);
    }
    mirror.apply(batch);
  };
  for (SeqId s = 0; s < 40; ++s) {
    std::vector<TokenId> prompt(system.begin(), system.begin() + 2 + s % 9);
    for (int i = 0; i < 1 + static_cast<int>(rng() % 6); ++i) {
      prompt.push_back(static_cast<TokenId>(100 + rng() % 4));
    }
    REQUIRE(m.add_sequence(s, prompt).ok());
    const absl::StatusOr<int32_t> hit = m.match_prefix(s);
    REQUIRE(hit.ok());
    REQUIRE(m.allocate_slots(s, static_cast<int32_t>(prompt.size()) - *hit).ok());
    end_step();
    for (int step = 0; step < 3; ++step) {
      const TokenId next = static_cast<TokenId>(200 + rng() % 3);
      REQUIRE(m.append_tokens(s, {&next, 1}).ok());
      REQUIRE(m.allocate_slots(s, 1).ok());
      end_step();
    }
    if (s % 2 == 1) {  // two sequences alive at a time
      REQUIRE(m.free(s - 1).ok());
      REQUIRE(m.free(s).ok());
      end_step();
    }
    REQUIRE(m.check_invariants().ok());
  }
}

TEST_CASE("a hybrid manager's events name each group and rebuild every group's index") {
  const int32_t host_blocks = GENERATE(0, 6);
  INFO("host blocks per group: " << host_blocks);
  KvEventBuffer events;
  auto manager = KvCacheManager::create(
      {.block_size = 2,
       .enable_host_cache = host_blocks > 0,
       .event_sink = &events,
       .layer_groups = {
           {.kind = AttentionKind::kFull, .num_blocks = 24, .num_host_blocks = host_blocks},
           {.kind = AttentionKind::kSlidingWindow,
            .window = 4,
            .num_blocks = 24,
            .num_host_blocks = host_blocks},
           {.kind = AttentionKind::kChunkedLocal,
            .window = 6,
            .num_blocks = 24,
            .num_host_blocks = host_blocks}}});
  REQUIRE(manager.ok());
  CacheMirror mirror;
  std::vector<KvEvent> all;
  run_workload(*manager, events, mirror, all);

  // Every stored or removed block names its group, with the group's kind and window.
  const EventGroup labels[] = {{0, AttentionKind::kFull, 0},
                               {1, AttentionKind::kSlidingWindow, 4},
                               {2, AttentionKind::kChunkedLocal, 6}};
  int per_group[3][2] = {};  // [group][stored, removed]
  for (const KvEvent& e : all) {
    std::optional<EventGroup> group;
    if (const auto* s = std::get_if<BlockStored>(&e)) {
      group = s->group;
      REQUIRE(group.has_value());
      ++per_group[group->index][0];
    } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
      group = r->group;
      REQUIRE(group.has_value());
      ++per_group[group->index][1];
    } else {
      continue;
    }
    REQUIRE(*group == labels[group->index]);
  }
  for (int g = 0; g < 3; ++g) {
    INFO("group " << g);
    REQUIRE(per_group[g][0] > 0);  // stored
    REQUIRE(per_group[g][1] > 0);  // and evicted
  }
  const KvCacheManager::GroupStats window = *manager->group_stats(1);
  REQUIRE(window.released_blocks > 0);
  REQUIRE(window.hit_blocks > 0);
  if (host_blocks > 0) REQUIRE(window.blocks_demoted > 0);

  // The stream, applied in order, holds exactly the manager's (hash, group, medium) entries.
  const std::set<Held> from_events = snapshot_entries(mirror);
  const std::set<Held> held = manager_index(*manager);
  REQUIRE(!held.empty());
  REQUIRE(from_events == held);
}

TEST_CASE("a manager with one layer group sends no group on its events") {
  KvEventBuffer events;
  auto manager = KvCacheManager::create({.block_size = 2,
                                         .enable_host_cache = true,
                                         .event_sink = &events,
                                         .layer_groups = full_attention(24, 6)});
  REQUIRE(manager.ok());
  CacheMirror mirror;
  std::vector<KvEvent> all;
  run_workload(*manager, events, mirror, all);
  int labelled = 0, blocks = 0;
  for (const KvEvent& e : all) {
    if (const auto* s = std::get_if<BlockStored>(&e)) {
      labelled += s->group.has_value();
      ++blocks;
    } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
      labelled += r->group.has_value();
      ++blocks;
    }
  }
  REQUIRE(blocks > 0);
  REQUIRE(labelled == 0);
  REQUIRE(snapshot_entries(mirror) == manager_index(*manager));
}

}  // namespace
}  // namespace pagedkv
