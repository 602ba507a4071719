// The allocator alone, in one screen: requests that share a system prompt are admitted,
// decode a few tokens and finish, on a pool small enough that cached blocks get evicted.
// Prints blocks in use, prefix hits and evictions as it goes.
#include <fmt/core.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "pagedkv/kv_cache_manager.h"

namespace {

constexpr int kBlockSize = 16;
constexpr int kSystemPrompt = 256;  // tokens every request starts with
constexpr int kUserTokens = 40;     // distinct per request
constexpr int kNewTokens = 24;      // decoded per request, plus 0-7 more to stagger them
constexpr int kRequests = 48;
constexpr int kConcurrent = 6;

void check(const absl::Status& status) {
  if (!status.ok()) {
    fmt::print(stderr, "allocator demo: {}\n", status.ToString());
    std::exit(1);
  }
}

}  // namespace

int main() {
  using namespace pagedkv;
  auto created =
      KvCacheManager::create({.block_size = kBlockSize, .layer_groups = full_attention(128)});
  check(created.status());
  KvCacheManager& manager = *created;

  std::vector<TokenId> prompt(kSystemPrompt + kUserTokens);
  std::iota(prompt.begin(), prompt.begin() + kSystemPrompt, 1);
  int admitted = 0;
  int finished = 0;
  int next_report = 8;
  std::vector<SeqId> running;
  while (finished < kRequests) {
    // Admit up to kConcurrent requests: match the cached prefix, reserve the rest.
    while (static_cast<int>(running.size()) < kConcurrent && admitted < kRequests) {
      const SeqId id = admitted++;
      std::iota(prompt.begin() + kSystemPrompt, prompt.end(), 10'000 + id * kUserTokens);
      check(manager.add_sequence(id, prompt));
      const int32_t cached = *manager.match_prefix(id);
      check(manager.allocate_slots(id, static_cast<int32_t>(prompt.size()) - cached).status());
      running.push_back(id);
    }
    // One decode step for every running request.
    for (const SeqId id : running) {
      const TokenId next[] = {static_cast<TokenId>(50'000 + id)};
      check(manager.append_tokens(id, next));
      check(manager.allocate_slots(id, 1).status());
    }
    // Finish requests that generated enough tokens.
    std::erase_if(running, [&](SeqId id) {
      const auto view = manager.sequence(id);
      if (static_cast<int>(view->tokens.size()) <
          static_cast<int>(prompt.size()) + kNewTokens + id % 8) {
        return false;
      }
      check(manager.free(id));
      ++finished;
      return true;
    });
    check(manager.check_invariants());
    if (finished >= next_report) {
      const auto s = manager.stats();
      fmt::print(
          "{:2} finished: {} running, {:3}/{} blocks in use, {:3} cached free, {} evictions\n",
          finished, running.size(), s.used_blocks, s.num_blocks, s.cached_free_blocks, s.evictions);
      next_report += 8;
    }
  }
  const auto s = manager.stats();
  fmt::print(
      "requests {}  blocks {}  prefix tokens looked up {}  hit {}  prefix hit rate {:.1f}%  "
      "evictions {}\n",
      kRequests, s.num_blocks, s.prefix_query_tokens, s.prefix_hit_tokens,
      100.0 * static_cast<double>(s.prefix_hit_tokens) / static_cast<double>(s.prefix_query_tokens),
      s.evictions);
  return 0;
}
