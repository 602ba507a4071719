#include "prefix_replay.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/block_hash.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

// `status` with the request it failed on.
absl::Status at_request(const absl::Status& status, int64_t request) {
  return absl::Status(status.code(),
                      absl::StrCat("prefix replay, request ", request, ": ", status.message()));
}

// The blocks of `prompt`'s first `max_blocks` full blocks that `pool` holds as a verified
// chain from block 0: the hit the full-attention groups could serve alone. `hashes` is
// scratch.
absl::StatusOr<int32_t> chain_blocks(const BlockPool& pool, std::span<const TokenId> prompt,
                                     int32_t max_blocks, std::vector<BlockHash>& hashes) {
  const int32_t b = pool.block_size();
  hashes.resize(static_cast<size_t>(max_blocks));
  BlockId parent = kNoBlock;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const std::span<const TokenId> tokens = prompt.subspan(static_cast<size_t>(i) * b, b);
    hashes[i] = hash_block(i == 0 ? nullptr : &hashes[i - 1], tokens, {});
    absl::StatusOr<BlockId> block = pool.find_cached(hashes[i], parent, tokens, {});
    if (!block.ok()) return block.status();
    if (*block == kNoBlock) return i;
    parent = *block;
  }
  return max_blocks;
}

// The first full-attention group of `m`, or -1.
int32_t first_full_group(const KvCacheManager& m) {
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    if (m.layer_group(g)->kind == AttentionKind::kFull) return g;
  }
  return -1;
}

// What one request hit, and what the full groups held at its match, in tokens.
struct RequestHits {
  int32_t hit = 0;
  int32_t hold = 0;
};

// One request of the replay as sequence `seq`: added, its full hold read on `anchor` (the
// first full group's pool), matched, computed in chunks of `chunk_tokens`, freed.
absl::StatusOr<RequestHits> replay_request(KvCacheManager& m, const BlockPool& anchor, SeqId seq,
                                           std::span<const TokenId> prompt, int32_t chunk_tokens,
                                           std::vector<BlockHash>& hashes) {
  const auto length = static_cast<int32_t>(prompt.size());
  if (absl::Status s = m.add_sequence(seq, prompt); !s.ok()) return s;
  // A hit never covers the prompt's last token.
  const int32_t b = anchor.block_size();
  absl::StatusOr<int32_t> hold = chain_blocks(anchor, prompt, (length - 1) / b, hashes);
  if (!hold.ok()) return hold.status();
  absl::StatusOr<int32_t> hit = m.match_prefix(seq);
  if (!hit.ok()) return hit.status();
  for (int32_t computed = *hit; computed < length;) {
    const int32_t n =
        chunk_tokens > 0 ? std::min(chunk_tokens, length - computed) : length - computed;
    if (auto slots = m.allocate_slots(seq, n); !slots.ok()) return slots.status();
    (void)m.take_step_ops();  // no engine: the copies need not run
    computed += n;
  }
  if (absl::Status s = m.free(seq); !s.ok()) return s;
  return RequestHits{.hit = *hit, .hold = *hold * b};
}

}  // namespace

int32_t Prompts::longest() const {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

int64_t Prompts::total_tokens() const {
  int64_t n = 0;
  for (int32_t length : lengths) n += length;
  return n;
}

Prompts trace_prompts(const Trace& trace) {
  Prompts prompts{.name = trace.name};
  for (const Request& r : trace.requests) {
    prompts.lengths.push_back(r.input_length);
    prompts.outputs.push_back(r.output_length);
  }
  prompts.tokens = [requests = trace.requests](int64_t i, std::vector<TokenId>& out) {
    out = prompt_tokens(requests[static_cast<size_t>(i)], i);
  };
  return prompts;
}

int64_t median_request_tokens(const Prompts& prompts) {
  if (prompts.lengths.empty()) return 0;
  std::vector<int64_t> lengths;
  lengths.reserve(prompts.lengths.size());
  for (size_t i = 0; i < prompts.lengths.size(); ++i)
    lengths.push_back(int64_t{prompts.lengths[i]} + prompts.outputs[i]);
  std::sort(lengths.begin(), lengths.end());
  // Nearest rank: the ceil(0.5 n)-th smallest.
  return lengths[(lengths.size() + 1) / 2 - 1];
}

absl::StatusOr<PrefixHits> replay_prefix_hits(const Prompts& prompts,
                                              const KvCacheManager::Options& options,
                                              int32_t chunk_tokens) {
  if (chunk_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix replay: chunk_tokens ", chunk_tokens, " must be >= 0"));
  }
  absl::StatusOr<KvCacheManager> m = KvCacheManager::create(options);
  if (!m.ok()) return m.status();
  const int32_t anchor = first_full_group(*m);
  if (anchor < 0) return absl::InvalidArgumentError("prefix replay: no full-attention group");
  PrefixHits result;
  std::vector<TokenId> prompt;
  std::vector<BlockHash> hashes;
  for (int64_t r = 0; r < prompts.size(); ++r) {
    prompts.tokens(r, prompt);
    absl::StatusOr<RequestHits> request = replay_request(
        *m, **m->device_pool(anchor), static_cast<SeqId>(r), prompt, chunk_tokens, hashes);
    if (!request.ok()) return at_request(request.status(), r);
    ++result.requests;
    result.prompt_tokens += std::ssize(prompt);
    result.hit_tokens += request->hit;
    result.full_hold_tokens += request->hold;
    result.hits += request->hit > 0 ? 1 : 0;
    result.cut_hits += request->hit < request->hold ? 1 : 0;
  }
  for (int32_t g = 0; g < m->num_groups(); ++g) {
    const KvCacheManager::GroupStats stats = *m->group_stats(g);
    result.evictions.push_back(stats.evictions);
    result.checkpoints_saved += stats.checkpoints_saved;
  }
  return result;
}

}  // namespace pagedkv::sim
