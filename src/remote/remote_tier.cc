// RemoteTier: lookups, verified loads and policy-chosen writes of the remote tier.
#include "pagedkv/remote_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pagedkv/remote_block_format.h"
#include "pagedkv/remote_namespace.h"

namespace pagedkv {
namespace {

absl::Status positive(const char* name, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("RemoteTier: ", name, " ", value, " must be > 0"));
}

RemoteBlockIdentity identity(std::string_view digest, const BlockHash& hash,
                             const std::optional<BlockHash>& parent,
                             std::span<const TokenId> tokens,
                             std::span<const uint64_t> extra_keys) {
  return {.namespace_digest = digest,
          .hash = hash,
          .parent = parent,
          .extra_keys = extra_keys,
          .tokens = tokens};
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::create(RemoteKvStore* store,
                                                               RemoteTierOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("RemoteTier: no store");
  if (!is_remote_namespace_digest(options.namespace_digest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RemoteTier: namespace_digest '", options.namespace_digest, "' is not ",
                     kRemoteNamespaceDigestChars, " lowercase hex digits"));
  }
  PAGEDKV_RETURN_IF_ERROR(positive("payload_bytes", options.payload_bytes));
  PAGEDKV_RETURN_IF_ERROR(positive("timeout_ms", options.timeout_ms));
  PAGEDKV_RETURN_IF_ERROR(positive("blocks_per_get", options.blocks_per_get));
  PAGEDKV_RETURN_IF_ERROR(positive("max_lookup_blocks", options.max_lookup_blocks));
  PAGEDKV_RETURN_IF_ERROR(positive("max_known_hashes", options.max_known_hashes));
  if (options.hash_fn == nullptr) return absl::InvalidArgumentError("RemoteTier: no hash_fn");
  return std::unique_ptr<RemoteTier>(new RemoteTier(store, std::move(options)));
}

// --- read path ---------------------------------------------------------------------------

absl::Status RemoteTier::start_lookup(SeqId seq, std::span<const TokenId> prompt,
                                      std::span<const uint64_t> extra_keys,
                                      const KvCacheManager& manager) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_lookup: sequence ", seq, " has no prompt"));
  }
  if (lookups_.contains(seq)) return absl::OkStatus();
  const BlockPool& device = **manager.device_pool();
  const BlockPool* host = (*manager.host_pool())->num_blocks() > 0 ? *manager.host_pool() : nullptr;
  const int32_t bs = device.block_size();
  // The last token is always computed: its block is never a hit.
  const int32_t max_blocks = static_cast<int32_t>((prompt.size() - 1) / bs);
  Lookup lookup;
  std::optional<BlockHash> parent;
  for (int32_t i = 0; i < max_blocks && std::ssize(lookup.blocks) < options_.max_lookup_blocks;
       ++i) {
    const std::span<const TokenId> tokens = prompt.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash hash = options_.hash_fn(parent ? &*parent : nullptr, tokens, extra_keys);
    BlockInfo block{
        hash, parent, {tokens.begin(), tokens.end()}, {extra_keys.begin(), extra_keys.end()}};
    parent = hash;
    const bool local =
        lookup.blocks.empty() && (device.indexed_block(hash) != kNoBlock ||
                                  (host != nullptr && host->indexed_block(hash) != kNoBlock));
    if (local) {  // a local hit: evidence of reuse
      if (options_.write_policy == RemoteWritePolicy::kSelective) choose_for_writing(block);
      continue;
    }
    if (lookup.blocks.empty()) lookup.first_block = i;
    lookup.blocks.push_back(std::move(block));
  }
  if (lookup.blocks.empty()) return absl::OkStatus();
  const auto n = static_cast<int32_t>(lookup.blocks.size());
  lookup.fetched.resize(lookup.blocks.size());
  lookup.block_size = bs;
  lookup.started = std::chrono::steady_clock::now();
  std::vector<std::pair<RemoteRequestId, Get>> issued;
  for (int32_t first = 0; first < n; first += options_.blocks_per_get) {
    std::vector<std::string> keys;
    for (int32_t j = first; j < std::min(n, first + options_.blocks_per_get); ++j) {
      keys.push_back(remote_block_key(options_.namespace_digest, lookup.blocks[j].hash));
    }
    absl::StatusOr<RemoteRequestId> id = store_->get(std::move(keys));
    if (!id.ok()) {
      // Gets already issued complete into nothing: their ids are not registered.
      return id.status();
    }
    issued.push_back({*id, Get{seq, first}});
  }
  lookup.gets_in_flight = static_cast<int32_t>(issued.size());
  for (auto& [id, get] : issued) gets_.emplace(id, get);
  lookups_.emplace(seq, std::move(lookup));
  ++stats_.lookups;
  stats_.lookup_blocks += n;
  return absl::OkStatus();
}

void RemoteTier::poll() {
  completions_.clear();
  store_->poll(&completions_);
  for (RemoteCompletion& c : completions_) {
    if (auto get = gets_.find(c.id); get != gets_.end()) {
      settle_get(c, get->second);
      gets_.erase(get);
    } else if (auto put = puts_.find(c.id); put != puts_.end()) {
      settle_put(c, put->second);
      puts_.erase(put);
    }
  }
}

void RemoteTier::settle_get(RemoteCompletion& c, const Get& get) {
  Lookup& lookup = lookups_.at(get.seq);  // cancel() drops a lookup's gets with it
  --lookup.gets_in_flight;
  for (size_t k = 0; k < c.results.size(); ++k) {
    const size_t j = get.first + k;
    FetchedBlock& fetched = lookup.fetched[j];
    fetched.state = FetchedBlock::State::kMissing;
    switch (c.results[k]) {
      case RemoteKeyResult::kOk:
        verify(std::move(c.values[k]), lookup.blocks[j], fetched);
        break;
      case RemoteKeyResult::kNotFound:
        ++stats_.missing_blocks;
        break;
      case RemoteKeyResult::kError:
        ++stats_.error_blocks;
        break;
    }
  }
}

// A fetched value is used only if it is intact and exactly the block the prompt needs.
void RemoteTier::verify(std::string value, const BlockInfo& block, FetchedBlock& out) {
  const absl::StatusOr<std::span<const std::byte>> payload = decode_remote_block(
      value,
      identity(options_.namespace_digest, block.hash, block.parent, block.tokens, block.extra_keys),
      options_.payload_bytes);
  if (payload.ok()) {
    out.state = FetchedBlock::State::kFound;
    // An offset, not a pointer: it stays right when the string moves.
    out.payload_at = reinterpret_cast<const char*>(payload->data()) - value.data();
    out.value = std::move(value);
    ++stats_.found_blocks;
  } else if (absl::IsDataLoss(payload.status())) {
    ++stats_.corrupt_blocks;
  } else if (absl::IsFailedPrecondition(payload.status())) {
    ++stats_.foreign_blocks;
  } else {
    ++stats_.other_blocks;
  }
}

bool RemoteTier::ready(SeqId seq) const {
  const auto it = lookups_.find(seq);
  if (it == lookups_.end() || it->second.gets_in_flight <= 0) return true;
  switch (options_.wait_policy) {
    case RemoteWaitPolicy::kBestEffort:
      return true;
    case RemoteWaitPolicy::kWaitComplete:
      return false;
    case RemoteWaitPolicy::kTimeout:
      return std::chrono::steady_clock::now() - it->second.started >=
             std::chrono::milliseconds(options_.timeout_ms);
  }
  return true;
}

int32_t RemoteTier::loadable_blocks(const Lookup& lookup, int32_t claimed_tokens) const {
  const int32_t first = claimed_tokens / lookup.block_size - lookup.first_block;
  if (claimed_tokens % lookup.block_size != 0 || first < 0) return 0;
  int32_t n = 0;
  while (first + n < std::ssize(lookup.fetched) &&
         lookup.fetched[first + n].state == FetchedBlock::State::kFound) {
    ++n;
  }
  return n;
}

int32_t RemoteTier::loadable_tokens(SeqId seq, int32_t claimed_tokens) const {
  const auto it = lookups_.find(seq);
  if (it == lookups_.end()) return 0;
  return loadable_blocks(it->second, claimed_tokens) * it->second.block_size;
}

absl::StatusOr<int32_t> RemoteTier::load(SeqId seq, int32_t claimed_tokens,
                                         std::span<const int64_t> slots) {
  const auto it = lookups_.find(seq);
  if (it == lookups_.end()) return 0;
  Lookup& lookup = it->second;
  const int32_t bs = lookup.block_size;
  const int32_t n = loadable_blocks(lookup, claimed_tokens);
  if (std::ssize(slots) < int64_t{n} * bs) {
    return absl::InvalidArgumentError(absl::StrCat("load: ", slots.size(), " slots for the ",
                                                   n * bs, " loadable tokens of sequence ", seq));
  }
  const int32_t first = claimed_tokens / bs - lookup.first_block;
  for (int32_t j = 0; j < n; ++j) {
    FetchedBlock& fetched = lookup.fetched[first + j];
    remember(lookup.blocks[first + j].hash);  // in the store: its events write nothing
    loads_.push_back({static_cast<BlockId>(slots[static_cast<size_t>(j) * bs] / bs),
                      std::move(fetched.value), fetched.payload_at});
  }
  if (lookup.gets_in_flight > 0) ++stats_.timed_out;
  stats_.loaded_blocks += n;
  stats_.loaded_tokens += int64_t{n} * bs;
  cancel(seq);
  return n * bs;
}

void RemoteTier::cancel(SeqId seq) {
  if (lookups_.erase(seq) == 0) return;
  absl::erase_if(gets_, [seq](const auto& entry) { return entry.second.seq == seq; });
}

absl::Status RemoteTier::run_loads(const WriteBlock& write_block) {
  for (size_t i = 0; i < loads_.size(); ++i) {
    const PendingLoad& load = loads_[i];
    const auto payload = std::as_bytes(std::span(load.value))
                             .subspan(static_cast<size_t>(load.payload_at),
                                      static_cast<size_t>(options_.payload_bytes));
    if (absl::Status status = write_block(load.block, payload); !status.ok()) {
      loads_.erase(loads_.begin(), loads_.begin() + static_cast<std::ptrdiff_t>(i));
      return status;
    }
  }
  loads_.clear();
  return absl::OkStatus();
}

// --- write path --------------------------------------------------------------------------

void RemoteTier::on_event(const KvEvent& event) {
  if (const auto* stored = std::get_if<BlockStored>(&event);
      stored != nullptr && stored->medium == Medium::kDevice) {
    std::optional<BlockHash> parent = stored->parent_hash;
    for (size_t i = 0; i < stored->block_hashes.size(); ++i) {
      const BlockHash& hash = stored->block_hashes[i];
      const auto tokens =
          std::span(stored->token_ids).subspan(i * stored->block_size, stored->block_size);
      BlockInfo block{hash, parent, {tokens.begin(), tokens.end()}, stored->extra_keys};
      parent = hash;
      if (known_.contains(hash)) continue;
      if (options_.write_policy == RemoteWritePolicy::kWriteThrough) {
        to_write_.push_back(std::move(block));
      } else {
        candidates_.insert_or_assign(hash, std::move(block));
      }
    }
  } else if (const auto* removed = std::get_if<BlockRemoved>(&event);
             removed != nullptr && removed->medium == Medium::kDevice) {
    for (const BlockHash& hash : removed->block_hashes) candidates_.erase(hash);
  } else if (std::holds_alternative<AllBlocksCleared>(event)) {
    // A flush: nothing computed before it is written after it.
    candidates_.clear();
    to_write_.clear();
  }
  if (options_.next_sink != nullptr) options_.next_sink->on_event(event);
}

void RemoteTier::choose_for_writing(const BlockInfo& block) {
  const auto it = candidates_.find(block.hash);
  if (it == candidates_.end() || known_.contains(block.hash)) return;
  to_write_.push_back(std::move(it->second));
  candidates_.erase(it);
}

absl::Status RemoteTier::write_computed(const KvCacheManager& manager,
                                        const ReadBlock& read_block) {
  if (to_write_.empty()) return absl::OkStatus();
  const BlockPool& device = **manager.device_pool();
  std::vector<std::string> keys;
  std::vector<std::string> values;
  Put put;
  std::string payload(static_cast<size_t>(options_.payload_bytes), '\0');
  for (const BlockInfo& block : to_write_) {
    const BlockId id = device.indexed_block(block.hash);
    if (id == kNoBlock || known_.contains(block.hash)) {
      stats_.skipped_writes += id == kNoBlock;
      continue;
    }
    PAGEDKV_RETURN_IF_ERROR(read_block(id, std::as_writable_bytes(std::span(payload))));
    std::string& value = values.emplace_back();
    PAGEDKV_RETURN_IF_ERROR(
        encode_remote_block(identity(options_.namespace_digest, block.hash, block.parent,
                                     block.tokens, block.extra_keys),
                            std::as_bytes(std::span(payload)), &value));
    keys.push_back(remote_block_key(options_.namespace_digest, block.hash));
    put.hashes.push_back(block.hash);
    put.value_bytes.push_back(std::ssize(value));
  }
  to_write_.clear();
  if (keys.empty()) return absl::OkStatus();
  absl::StatusOr<RemoteRequestId> id = store_->put(std::move(keys), std::move(values));
  if (!id.ok()) return id.status();
  for (const BlockHash& hash : put.hashes) remember(hash);
  puts_.emplace(*id, std::move(put));
  return absl::OkStatus();
}

void RemoteTier::settle_put(const RemoteCompletion& c, const Put& put) {
  for (size_t k = 0; k < c.results.size(); ++k) {
    if (c.results[k] == RemoteKeyResult::kOk) {
      ++stats_.written_blocks;
      stats_.written_bytes += put.value_bytes[k];
    } else {
      ++stats_.write_failures;
      forget(put.hashes[k]);  // a later computation of the block writes it again
    }
  }
}

void RemoteTier::remember(const BlockHash& hash) {
  if (!known_.insert(hash).second) return;
  known_order_.push_back(hash);
  if (std::ssize(known_order_) > options_.max_known_hashes) {
    known_.erase(known_order_.front());
    known_order_.pop_front();
  }
}

// Its entry in known_order_ stays: forgetting it again when it comes first is harmless.
void RemoteTier::forget(const BlockHash& hash) { known_.erase(hash); }

}  // namespace pagedkv
