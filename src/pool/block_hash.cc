#include "pagedkv/block_hash.h"

// The streaming state lives on the stack, which needs its definition.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstring>

namespace pagedkv {
namespace {

// Inputs up to this size are hashed in one shot from a stack buffer; longer ones (large
// blocks) go through the streaming state, which costs a reset but no allocation.
constexpr size_t kStackBytes = 1024;

}  // namespace

BlockHash hash_block(const BlockHash* parent, std::span<const TokenId> tokens,
                     std::span<const uint64_t> extra_keys) {
  const BlockHash root{};
  const BlockHash& chained = parent != nullptr ? *parent : root;
  const size_t parent_bytes = sizeof(chained.lo) + sizeof(chained.hi);
  const size_t extra_bytes = extra_keys.size_bytes();
  const size_t token_bytes = tokens.size_bytes();
  const size_t total = parent_bytes + extra_bytes + token_bytes;

  XXH128_hash_t h;
  if (total <= kStackBytes) {
    unsigned char buffer[kStackBytes];
    std::memcpy(buffer, &chained.lo, sizeof(chained.lo));
    std::memcpy(buffer + sizeof(chained.lo), &chained.hi, sizeof(chained.hi));
    if (extra_bytes > 0) std::memcpy(buffer + parent_bytes, extra_keys.data(), extra_bytes);
    if (token_bytes > 0) {
      std::memcpy(buffer + parent_bytes + extra_bytes, tokens.data(), token_bytes);
    }
    h = XXH3_128bits(buffer, total);
  } else {
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, &chained.lo, sizeof(chained.lo));
    XXH3_128bits_update(&state, &chained.hi, sizeof(chained.hi));
    XXH3_128bits_update(&state, extra_keys.data(), extra_bytes);
    XXH3_128bits_update(&state, tokens.data(), token_bytes);
    h = XXH3_128bits_digest(&state);
  }
  return BlockHash{h.low64, h.high64};
}

}  // namespace pagedkv
