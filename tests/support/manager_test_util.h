// File: tests/support/manager_test_util.h
//
// Small helpers the KvCacheManager tests share: create a manager, admit a prompt, allocate
// and read tables with check_invariants() after every step, end a step as an engine does.
#ifndef PAGEDKV_TESTS_SUPPORT_MANAGER_TEST_UTIL_H_
#define PAGEDKV_TESTS_SUPPORT_MANAGER_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_events.h"

namespace pagedkv::testing {

using Slots = std::vector<int64_t>;
using Blocks = std::vector<BlockId>;

// Any of the allocator's classes: KvCacheManager, BlockPool.
template <typename Checked>
void require_valid(const Checked& checked) {
  const absl::Status status = checked.check_invariants();
  INFO(status.ToString());
  REQUIRE(status.ok());
}

inline KvCacheManager make_manager(KvCacheManager::Options options) {
  auto m = KvCacheManager::create(std::move(options));
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return *std::move(m);
}

inline std::vector<TokenId> iota_tokens(int n, TokenId first = 100) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline Slots allocate(KvCacheManager& m, SeqId seq, int32_t n, int32_t lookahead = 0) {
  auto slots = m.allocate_slots(seq, n, lookahead);
  INFO(slots.status().ToString());
  REQUIRE(slots.ok());
  require_valid(m);
  return Slots(slots->begin(), slots->end());
}

inline Blocks table(const KvCacheManager& m, SeqId seq, int32_t group = 0) {
  auto view = m.sequence(seq, group);
  REQUIRE(view.ok());
  return Blocks(view->block_table.begin(), view->block_table.end());
}

// The slots of layer group `group` from the last allocate_slots() call.
inline Slots slots_of(const KvCacheManager& m, int32_t group) {
  const std::span<const int64_t> s = *m.slot_mapping(group);
  return Slots(s.begin(), s.end());
}

// Ends a scheduling step as an engine does: it takes the pending copies, runs them and the
// step's kernels. Sequences scheduled before count as written from here on.
inline void end_step(KvCacheManager& m) { (void)m.take_step_ops(); }

inline void admit(KvCacheManager& m, SeqId seq, const std::vector<TokenId>& prompt,
                  SequenceOptions options = {}) {
  REQUIRE(m.add_sequence(seq, prompt, std::move(options)).ok());
  require_valid(m);
}

inline void require_error(const absl::Status& status, absl::StatusCode code,
                          const std::string& fragment) {
  INFO(status.ToString());
  REQUIRE(status.code() == code);
  REQUIRE_THAT(std::string(status.message()), Catch::Contains(fragment));
}

// Collects the events a manager emits.
struct EventLog : KvEventSink {
  void on_event(const KvEvent& e) override { events.push_back(e); }
  // The hashes announced by BlockStored since the last call.
  int32_t stored_blocks() {
    int32_t n = 0;
    for (const KvEvent& e : events) {
      if (const auto* stored = std::get_if<BlockStored>(&e)) {
        n += static_cast<int32_t>(stored->block_hashes.size());
      }
    }
    events.clear();
    return n;
  }
  std::vector<KvEvent> events;
};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_MANAGER_TEST_UTIL_H_
