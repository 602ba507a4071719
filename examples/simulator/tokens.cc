#include "tokens.h"

#include <algorithm>

#include "pagedkv/block_hash.h"

namespace pagedkv::sim {
namespace {

constexpr uint64_t kHashIdDomain = 0x4d4f4f4e43414b45ULL;  // "MOONCAKE"
constexpr uint64_t kSystemDomain = 0x53595354454d5052ULL;  // "SYSTEMPR"
constexpr uint64_t kPromptDomain = 0x50524f4d50540000ULL;  // "PROMPT"
constexpr uint64_t kOutputDomain = 0x4f55545055540000ULL;  // "OUTPUT"

}  // namespace

std::vector<TokenId> prompt_tokens(const Request& request, int64_t request_index) {
  std::vector<TokenId> tokens(request.input_length);
  int32_t p = 0;
  if (!request.hash_ids.empty()) {
    for (; p < request.input_length; ++p) {
      const size_t block = static_cast<size_t>(p / kMooncakeBlockTokens);
      const int64_t id = block < request.hash_ids.size() ? request.hash_ids[block] : -1;
      tokens[p] =
          id >= 0 ? derive_token(kHashIdDomain, static_cast<uint64_t>(id), p % kMooncakeBlockTokens)
                  : derive_token(kPromptDomain, request_index, p);
    }
    return tokens;
  }
  if (request.system_prompt_id >= 0) {
    const int32_t shared = std::min(request.system_prompt_length, request.input_length);
    for (; p < shared; ++p) tokens[p] = derive_token(kSystemDomain, request.system_prompt_id, p);
  }
  for (; p < request.input_length; ++p) {
    tokens[p] = derive_token(kPromptDomain, static_cast<uint64_t>(request_index), p);
  }
  return tokens;
}

TokenId output_token(int64_t request_index, int64_t sample, int64_t position) {
  return derive_token(kOutputDomain ^ static_cast<uint64_t>(sample) * 0x100000001b3ULL,
                      static_cast<uint64_t>(request_index), static_cast<uint64_t>(position));
}

std::vector<BlockHash> prefix_block_hashes(std::span<const TokenId> tokens, int32_t block_size,
                                           int32_t max_blocks) {
  const auto full = static_cast<int32_t>(tokens.size() / static_cast<size_t>(block_size));
  std::vector<BlockHash> hashes;
  hashes.reserve(static_cast<size_t>(std::max(0, std::min(full, max_blocks))));
  for (int32_t b = 0; b < full && b < max_blocks; ++b) {
    hashes.push_back(hash_block(hashes.empty() ? nullptr : &hashes.back(),
                                tokens.subspan(static_cast<size_t>(b) * block_size, block_size),
                                {}));
  }
  return hashes;
}

}  // namespace pagedkv::sim
