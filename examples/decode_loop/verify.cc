// Dense-reference verification of the engine's output (see verify.h).
#include "verify.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "dense_reference.h"

namespace decode_loop {

bool VerifyResult::passed() const {
  return std::all_of(sequences.begin(), sequences.end(),
                     [](const VerifiedSequence& s) { return s.identical; });
}

absl::StatusOr<VerifyResult> verify(const Model& model, const Engine& engine, int32_t count,
                                    pagedkv::DType kv_dtype) {
  const auto start = std::chrono::steady_clock::now();
  VerifyResult result;
  result.requested = count;
  // Every finished sequence, in a stable order.
  std::vector<const SequenceRecord*> all;
  for (const auto& [seq, rec] : engine.sequences()) {
    if (rec.where == SequenceRecord::Where::kDone) all.push_back(&rec);
  }
  std::sort(all.begin(), all.end(),
            [](const SequenceRecord* a, const SequenceRecord* b) { return a->seq < b->seq; });
  absl::flat_hash_set<SeqId> picked;
  auto pick = [&](const char* why, auto&& pred) {
    if (static_cast<int32_t>(result.sequences.size()) >= count) return;
    for (const SequenceRecord* rec : all) {
      if (picked.contains(rec->seq) || !pred(*rec)) continue;
      picked.insert(rec->seq);
      result.sequences.push_back(
          {.seq = rec->seq, .request = rec->request, .sample = rec->sample, .why = why});
      return;
    }
  };
  pick("swap-preempted", [](const SequenceRecord& r) { return r.swap_preemptions > 0; });
  pick("recompute-preempted", [](const SequenceRecord& r) { return r.recompute_preemptions > 0; });
  pick("forked sample", [](const SequenceRecord& r) { return r.forked; });
  pick("prefix-cache hit",
       [](const SequenceRecord& r) { return !r.forked && r.first_cached_tokens > 0; });
  // Then spread over the rest, and fill up in order if the stride fell short.
  auto add = [&](const SequenceRecord* rec) {
    if (picked.insert(rec->seq).second) {
      result.sequences.push_back(
          {.seq = rec->seq, .request = rec->request, .sample = rec->sample, .why = "spread"});
    }
  };
  const size_t stride = std::max<size_t>(1, all.size() / std::max(1, count));
  for (size_t i = 0; i < all.size() && static_cast<int32_t>(result.sequences.size()) < count;
       i += stride) {
    add(all[i]);
  }
  for (size_t i = 0; i < all.size() && static_cast<int32_t>(result.sequences.size()) < count; ++i) {
    add(all[i]);
  }

  // Regenerate in parallel: one sequence per thread, each with its own workspace.
  std::vector<absl::Status> errors(result.sequences.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < result.sequences.size(); i = next++) {
      VerifiedSequence& v = result.sequences[i];
      const SequenceRecord& rec = engine.sequences().at(v.seq);
      const std::span<const TokenId> prompt(rec.tokens.data(), rec.prompt_len);
      v.num_tokens = rec.num_generated();
      absl::StatusOr<DenseResult> dense =
          dense_generate(model, prompt, v.num_tokens, rec.sampling, kv_dtype);
      if (!dense.ok()) {
        errors[i] = dense.status();
        continue;
      }
      v.identical = true;
      for (int32_t t = 0; t < v.num_tokens; ++t) {
        if (dense->tokens[t] != rec.tokens[rec.prompt_len + t]) {
          v.identical = false;
          v.first_mismatch = t;
          v.gap_at_mismatch = dense->top2_gaps[t];
          break;
        }
      }
    }
  };
  const size_t num_threads =
      std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), result.sequences.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : errors) {
    if (!status.ok()) return status;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace decode_loop
