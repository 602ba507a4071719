// Internal: the state KvCacheManager keeps per sequence.
#ifndef PAGEDKV_CACHE_SEQUENCE_H_
#define PAGEDKV_CACHE_SEQUENCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/retention.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

// One layer group's part of a sequence (see layer_group.h). Entry i of `blocks` holds
// tokens [i * block_size, (i + 1) * block_size). A windowed group releases the blocks no
// future token attends to: entries before `first_held` are kNoBlock. A state group's
// `blocks` is the sequence's one state slot (or empty), `host_blocks` its copy while
// swapped.
struct GroupTable {
  std::vector<BlockId> blocks;       // device table (running; a waiting sequence's claim)
  std::vector<BlockId> host_blocks;  // while swapped: host copies of entries first_held..
  int32_t first_held = 0;            // first entry holding a block
  // A state group's slots of the state after each draft token (allocate_draft_slots()).
  std::vector<BlockId> draft_slots;
};

// The fields a decode step reads come first, so that a step touches two cache lines of it.
struct Sequence {
  SequenceState state = SequenceState::kWaiting;
  int32_t num_computed = 0;  // tokens whose KV is (being) written
  // Speculative decoding: the last num_draft tokens (all computed) are drafts that
  // accept_draft() has not judged: none is hashed, offered or checkpointed.
  int32_t num_draft = 0;
  // Disaggregated decode: the last num_importing computed tokens (after the local prefix
  // hit) are filled by a transfer (import_slots()); like drafts, none is verified, nor
  // attended, until complete_import() judges them.
  int32_t num_importing = 0;
  int32_t num_offered_blocks = 0;  // leading blocks already offered to the index
  // Holds K/V computed before the last reset_prefix_cache(): offers nothing to the index.
  bool kv_before_reset = false;
  // The step (see StepLedger) in which the sequence last got slots or was swapped
  // in, and its computed tokens before that step: while scheduled_step is the manager's
  // step, the K/V of tokens past settled_tokens is not written yet.
  int32_t settled_tokens = 0;
  uint64_t scheduled_step = 0;
  // The last block decode_in_place() found held by this sequence alone (group 0), and the
  // device pool's share_epoch() then: while the epoch holds, the block is still its own.
  BlockId exclusive_block = kNoBlock;
  uint64_t exclusive_epoch = 0;
  std::vector<TokenId> tokens;  // prompt, then generated tokens
  // One table per layer group, in the manager's group order; tables may hold lookahead
  // blocks.
  absl::InlinedVector<GroupTable, 1> tables;

  SeqId id = 0;
  int32_t priority = 0;
  int64_t arrival = 0;
  absl::InlinedVector<uint64_t, 2> extra_keys;
  std::vector<RetentionRange> retention;  // applied to its blocks as it releases them
  std::vector<BlockHash> block_hashes;    // chained hashes of full token blocks, lazily
  uint64_t preempted_batch = 0;           // the batched call that last preempted it
  // Where its last match_prefix()'s full-group chain ended and where its hit ended, in
  // blocks: branch points whose windows the windowed groups keep longest.
  int32_t match_chain_end = 0;
  int32_t match_hit = 0;
  // State groups: the prompt's length, and the branch point of its match (where the full
  // groups' chain ended past the hit; 0: none), in blocks: where checkpoints are saved.
  int32_t prompt_len = 0;
  int32_t state_branch = 0;
};

inline const char* state_name(SequenceState state) {
  switch (state) {
    case SequenceState::kWaiting:
      return "waiting";
    case SequenceState::kRunning:
      return "running";
    case SequenceState::kSwapped:
      return "swapped";
  }
  return "unknown";
}

// Tokens whose K/V is (being) written and that are neither drafts nor imports in flight:
// what may be cached.
inline int32_t verified_tokens(const Sequence& seq) {
  return seq.num_computed - seq.num_draft - seq.num_importing;
}

// Whether `seq` waits for a verdict on unverified tokens (accept_draft(), complete_import()):
// until then it takes no call that computes, shares or moves its K/V.
inline bool awaits_verdict(const Sequence& seq) { return (seq.num_draft | seq.num_importing) != 0; }

// Extends `seq`'s chained block hashes to its first `num_full_blocks` blocks (all full).
inline void hash_full_blocks(Sequence& seq, int32_t num_full_blocks, int32_t block_size,
                             const BlockHashFn& hash_fn) {
  for (auto i = static_cast<int32_t>(seq.block_hashes.size()); i < num_full_blocks; ++i) {
    const BlockHash* parent = i == 0 ? nullptr : &seq.block_hashes[i - 1];
    const auto tokens = std::span<const TokenId>(seq.tokens)
                            .subspan(static_cast<size_t>(i) * block_size, block_size);
    seq.block_hashes.push_back(hash_fn(parent, tokens, seq.extra_keys));
  }
}

// The tokens of `seq`'s block `index`.
inline std::span<const TokenId> block_tokens(const Sequence& seq, int32_t index,
                                             int32_t block_size) {
  return std::span<const TokenId>(seq.tokens)
      .subspan(static_cast<size_t>(index) * block_size, block_size);
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_SEQUENCE_H_
