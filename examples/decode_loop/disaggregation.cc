// Two engines in one process, the K/V handed from prefill to decode over pagedkv::transfer
// (see disaggregation.h for one round of the loop).
#include "disaggregation.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transfer_faults.h"
#include "pagedkv/kv_transport.h"

namespace decode_loop {
namespace {

using pagedkv::KvTransferId;
using Where = SequenceRecord::Where;

// Bytes of one entry of `storage` (what read_block() / write_block() copy): a block (every
// layer's K then V), or a state slot.
int64_t entry_bytes(const pagedkv::KvStorage& storage) {
  return storage.holds_state() ? storage.state_shape().bytes() : storage.spec().bytes_per_block();
}

// The faults of `fault` for a run of about `transfers` transfers, by transfer id.
std::vector<pagedkv::KvTransferFault> plan_faults(TransferFault fault, int64_t transfers,
                                                  absl::Duration timeout) {
  using Kind = pagedkv::KvTransferFault::Kind;
  std::vector<pagedkv::KvTransferFault> faults;
  const auto every_fourth = [&](Kind kind) {
    for (int64_t id = 1; id < transfers; id += 4) {
      faults.push_back({.kind = kind,
                        .transfer = static_cast<KvTransferId>(id),
                        .block = static_cast<int32_t>((id / 4) % 3),
                        .byte_offset = 5});
    }
  };
  const auto at = [&](int64_t id, Kind kind, absl::Duration delay) {
    faults.push_back({.kind = kind,
                      .transfer = static_cast<KvTransferId>(id),
                      .block = 0,
                      .byte_offset = 64,  // a sender dying mid-block
                      .delay = delay});
  };
  switch (fault) {
    case TransferFault::kNone:
      break;
    case TransferFault::kDrop:
      every_fourth(Kind::kDrop);
      break;
    case TransferFault::kCorrupt:
      every_fourth(Kind::kCorruptByte);
      break;
    case TransferFault::kDelay:  // late but in time, then too late twice
      at(transfers / 4, Kind::kDelay, timeout / 2);
      at(transfers / 2, Kind::kDelay, timeout * 2);
      at(transfers * 3 / 4, Kind::kDelay, timeout * 2);
      break;
    case TransferFault::kPeerKilled:
      at(transfers / 2, Kind::kCloseConnection, absl::ZeroDuration());
      break;
  }
  return faults;
}

class EnginePair {
 public:
  EnginePair(Engine& prefill, Engine& decode, const DisaggregationOptions& options)
      : prefill_(prefill), decode_(decode), options_(options) {}

  absl::Status connect(int64_t expected_transfers);
  absl::Status run(const std::vector<Request>& requests);
  DisaggregationStats& stats() { return stats_; }

 private:
  // A transfer into the decode engine: the import's entries, received into staging first.
  struct Incoming {
    SeqId seq = 0;
    pagedkv::KvImport import;
    std::vector<std::vector<std::byte>> staging{};  // one per entry, groups in order
    absl::Time started{};
  };
  // A transfer out of the prefill engine: the pinned blocks' bytes, read at send().
  struct Outgoing {
    SeqId seq = 0;
    std::vector<std::vector<std::byte>> bytes{};
  };

  bool prefill_alive() const { return sender_ != nullptr; }
  bool done() const;
  absl::Status step_prefill();
  // Admits waiting hand-offs into the decode engine, as far as it has room, and starts
  // their transfers. Returns whether one was admitted.
  absl::StatusOr<bool> start_imports();
  absl::Status start_transfer(const Handoff& handoff, pagedkv::KvImport import);
  absl::StatusOr<bool> poll();
  absl::Status end_import(SeqId seq, const pagedkv::KvImport& import,
                          std::span<const int32_t> verified);
  absl::Status finish_import(Incoming& in, const pagedkv::KvReceiveCompletion& done);
  // The prefill engine is gone: its sequences not yet handed off, and the hand-offs the
  // decode engine has not admitted yet, are computed by the decode engine from their
  // prompts; transfers in flight end with what arrived verified.
  void kill_prefill();

  Engine& prefill_;
  Engine& decode_;
  DisaggregationOptions options_;
  std::unique_ptr<pagedkv::KvTransferSender> sender_;
  std::unique_ptr<pagedkv::KvTransferReceiver> receiver_;
  std::deque<Handoff> handoffs_;  // exported, not yet admitted by the decode engine
  absl::flat_hash_map<KvTransferId, Incoming> incoming_;
  absl::flat_hash_map<KvTransferId, Outgoing> outgoing_;
  KvTransferId next_id_ = 0;
  DisaggregationStats stats_;
};

absl::Status EnginePair::connect(int64_t expected_transfers) {
  const CachePlan& plan = decode_.options().cache;
  pagedkv::KvTransferOptions transfer{
      .namespace_digest = absl::StrCat("pagedkv-decode disaggregated: ", plan.num_groups(),
                                       " groups, block size ", plan.config.block_size)};
  for (int32_t g = 0; g < plan.num_groups(); ++g) {
    transfer.block_bytes.push_back(entry_bytes(decode_.store().storage(g)));
  }
  absl::StatusOr<std::unique_ptr<pagedkv::KvTransportListener>> listener =
      pagedkv::listen_kv_transport(options_.endpoint);
  if (!listener.ok()) return listener.status();
  // Each end's handshake waits for the other's: the prefill side connects from a thread.
  absl::StatusOr<std::unique_ptr<pagedkv::KvTransferSender>> sender;
  std::thread connector([&] {
    absl::StatusOr<std::unique_ptr<pagedkv::KvTransport>> transport =
        pagedkv::connect_kv_transport((*listener)->endpoint(), absl::Seconds(5));
    sender = transport.ok()
                 ? pagedkv::create_fault_injecting_kv_transfer_sender(
                       *std::move(transport), transfer,
                       plan_faults(options_.fault, expected_transfers, options_.transfer_timeout))
                 : transport.status();
  });
  absl::StatusOr<std::unique_ptr<pagedkv::KvTransferReceiver>> receiver =
      pagedkv::accept_kv_transfer(**listener, transfer);
  connector.join();
  if (!sender.ok()) return sender.status();
  if (!receiver.ok()) return receiver.status();
  sender_ = *std::move(sender);
  receiver_ = *std::move(receiver);
  return absl::OkStatus();
}

bool EnginePair::done() const {
  return !(prefill_alive() && (prefill_.busy() || !outgoing_.empty())) && handoffs_.empty() &&
         incoming_.empty() && !decode_.busy();
}

absl::Status EnginePair::run(const std::vector<Request>& requests) {
  absl::Status status = prefill_.submit(requests);
  while (status.ok() && !done()) {
    if (prefill_alive() && prefill_.busy()) status = step_prefill();
    absl::StatusOr<bool> admitted = status.ok() ? start_imports() : status;
    absl::StatusOr<bool> moved = admitted.ok() ? poll() : admitted.status();
    if (!moved.ok()) return moved.status();
    if (decode_.busy()) {
      status = decode_.step();
    } else if (!*admitted && !*moved && !(prefill_alive() && prefill_.busy())) {
      receiver_->wait(absl::Milliseconds(1));  // only transfers are left: wait for bytes
    }
  }
  if (!status.ok()) return status;
  if (prefill_alive()) {
    status = prefill_.finish_run();  // every export released: its invariants hold with none
    stats_.prefill = prefill_.stats();
  }
  return status.ok() ? decode_.finish_run() : status;
}

absl::Status EnginePair::step_prefill() {
  absl::Status status = prefill_.step();
  if (!status.ok()) return status;
  for (Handoff& handoff : prefill_.take_handoffs()) {
    ++stats_.handoffs;
    handoffs_.push_back(std::move(handoff));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> EnginePair::start_imports() {
  bool admitted = false;
  while (!handoffs_.empty()) {
    absl::StatusOr<std::optional<pagedkv::KvImport>> import =
        decode_.begin_import(handoffs_.front());
    if (!import.ok()) return import.status();
    if (!import->has_value()) break;  // no room yet
    admitted = true;
    Handoff handoff = std::move(handoffs_.front());
    handoffs_.pop_front();
    stats_.import_tokens += import->value().num_tokens;
    stats_.local_hit_tokens += import->value().num_local_tokens;
    absl::Status status = start_transfer(handoff, **std::move(import));
    if (!status.ok()) return status;
  }
  return admitted;
}

absl::Status EnginePair::start_transfer(const Handoff& handoff, pagedkv::KvImport import) {
  const SeqId seq = handoff.record.seq;
  if (import.groups.empty()) {  // the decode engine's own cache held the whole prompt
    ++stats_.local_imports;
    stats_.served_tokens += import.num_tokens;
    return prefill_.release_export(seq);
  }
  const KvTransferId id = next_id_++;
  Incoming in{.seq = seq, .import = std::move(import), .started = absl::Now()};
  Outgoing out{.seq = seq};
  std::vector<pagedkv::KvTransferDestination> destinations;
  for (int32_t g = 0; g < std::ssize(in.import.groups); ++g) {
    const pagedkv::KvHandoffGroup& wanted = in.import.groups[g];
    const pagedkv::KvHandoffGroup& held = handoff.kv.groups[g];
    for (int32_t i = 0; i < std::ssize(wanted.blocks); ++i) {
      const int32_t entry = wanted.first_entry + i;
      const int32_t source = entry - held.first_entry;
      if (source < 0 || source >= std::ssize(held.blocks)) {
        return absl::InternalError(absl::StrCat("sequence ", seq, ": the import wants entry ",
                                                entry, " of group ", g, ", the export holds [",
                                                held.first_entry, ", ",
                                                held.first_entry + std::ssize(held.blocks), ")"));
      }
      const bool hashed =
          decode_.options().cache.groups[g].kind != pagedkv::AttentionKind::kState &&
          entry < std::ssize(handoff.kv.block_hashes);
      const pagedkv::BlockHash hash =
          hashed ? handoff.kv.block_hashes[entry] : pagedkv::BlockHash{};
      const int64_t bytes = entry_bytes(decode_.store().storage(g));
      in.staging.emplace_back(bytes);
      destinations.push_back(
          {.group = g, .index = entry, .hash = hash, .parts = {std::span(in.staging.back())}});
      out.bytes.emplace_back(bytes);
      absl::Status status =
          prefill_.store().storage(g).read_block(held.blocks[source], out.bytes.back());
      if (!status.ok()) return status;
    }
  }
  ++stats_.transfers;
  stats_.blocks_expected += std::ssize(destinations);
  absl::Status status = receiver_->expect(id, destinations, options_.transfer_timeout);
  if (!status.ok()) return status;
  incoming_[id] = std::move(in);
  std::vector<pagedkv::KvTransferBlock> blocks;
  for (size_t i = 0; i < destinations.size(); ++i) {
    blocks.push_back({.group = destinations[i].group,
                      .index = destinations[i].index,
                      .hash = destinations[i].hash,
                      .parts = {std::span<const std::byte>(out.bytes[i])}});
  }
  status = sender_->send(id, std::move(blocks), options_.transfer_timeout);
  // A dead link: nothing is sent, the receiver's deadline or the broken connection ends
  // the import, which computes its tokens again.
  if (absl::IsUnavailable(status)) return prefill_.release_export(seq);
  if (!status.ok()) return status;
  outgoing_[id] = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<bool> EnginePair::poll() {
  bool moved = false;
  if (prefill_alive()) {
    std::vector<pagedkv::KvSendCompletion> sent;
    moved = sender_->poll(&sent) > 0;
    for (const pagedkv::KvSendCompletion& done : sent) {
      const auto it = outgoing_.find(done.id);
      absl::Status status = prefill_.release_export(it->second.seq);
      if (!status.ok()) return status;
      outgoing_.erase(it);
    }
    // The connection is gone (--transfer-fault peer-killed, or a real failure): so is the
    // prefill engine, as far as the decode engine can tell.
    if (!sender_->connection_status().ok()) kill_prefill();
  }
  std::vector<pagedkv::KvReceiveCompletion> received;
  moved = receiver_->poll(&received) > 0 || moved;
  for (const pagedkv::KvReceiveCompletion& done : received) {
    const auto it = incoming_.find(done.id);
    absl::Status status = finish_import(it->second, done);
    if (!status.ok()) return status;
    incoming_.erase(it);
  }
  return moved;
}

absl::Status EnginePair::finish_import(Incoming& in, const pagedkv::KvReceiveCompletion& done) {
  stats_.transfer_seconds += absl::ToDoubleSeconds(absl::Now() - in.started);
  switch (done.outcome) {
    case pagedkv::KvTransferOutcome::kComplete:
      ++stats_.transfers_complete;
      break;
    case pagedkv::KvTransferOutcome::kFailed:
      ++stats_.transfers_failed;
      break;
    case pagedkv::KvTransferOutcome::kCancelled:
      ++stats_.transfers_cancelled;
      break;
    case pagedkv::KvTransferOutcome::kTimedOut:
      ++stats_.transfers_timed_out;
      break;
  }
  stats_.blocks_verified += done.count(pagedkv::KvBlockState::kVerified);
  stats_.blocks_corrupt += done.count(pagedkv::KvBlockState::kCorrupt);
  stats_.blocks_missing += done.count(pagedkv::KvBlockState::kMissing);
  stats_.blocks_wrong += done.count(pagedkv::KvBlockState::kWrongBlock);
  // Only the verified leading blocks of each group reach the store: the rest are released.
  std::vector<int32_t> verified;
  size_t first = 0;  // of the group's entries in staging
  for (int32_t g = 0; g < std::ssize(in.import.groups); ++g) {
    const pagedkv::KvHandoffGroup& group = in.import.groups[g];
    verified.push_back(done.verified_prefix(g));
    for (int32_t i = 0; i < verified.back(); ++i) {
      absl::Status status =
          decode_.store().storage(g).write_block(group.blocks[i], in.staging[first + i]);
      if (!status.ok()) return status;
      stats_.bytes_verified += std::ssize(in.staging[first + i]);
    }
    first += group.blocks.size();
  }
  return end_import(in.seq, in.import, verified);
}

absl::Status EnginePair::end_import(SeqId seq, const pagedkv::KvImport& import,
                                    std::span<const int32_t> verified) {
  absl::StatusOr<int32_t> computed = decode_.end_import(seq, verified);
  if (!computed.ok()) return computed.status();
  stats_.served_tokens += *computed;
  stats_.imported_tokens += std::max(0, *computed - import.num_local_tokens);
  stats_.recomputed_tokens += import.num_tokens - *computed;
  return absl::OkStatus();
}

void EnginePair::kill_prefill() {
  stats_.peer_killed = true;
  stats_.prefill = prefill_.stats();
  sender_.reset();
  outgoing_.clear();  // nothing reads those bytes any more
  std::vector<SequenceRecord> left = prefill_.take_unfinished();
  for (Handoff& handoff : handoffs_) left.push_back(std::move(handoff.record));
  handoffs_.clear();
  stats_.rerouted_sequences = std::ssize(left);
  for (SequenceRecord& rec : left) decode_.resubmit(std::move(rec));
}

RunStats combine(const Engine& prefill, const Engine& decode, const RunStats& prefill_stats) {
  RunStats run = decode.stats();
  absl::flat_hash_map<int64_t, bool> complete;  // request -> every sample done
  for (const auto& [seq, rec] : decode.sequences()) {
    auto [it, inserted] = complete.try_emplace(rec.request, true);
    it->second = it->second && rec.where == Where::kDone;
  }
  for (const auto& [seq, rec] : prefill.sequences()) {
    if (rec.where == Where::kHandedOff) continue;  // the decode engine's now
    auto [it, inserted] = complete.try_emplace(rec.request, true);
    it->second = it->second && rec.where == Where::kDone;
  }
  run.requests = std::ssize(complete);
  run.requests_completed =
      std::ranges::count(complete, true, [](const auto& e) { return e.second; });
  run.prompt_tokens = prefill_stats.prompt_tokens;
  run.prefill_tokens += prefill_stats.prefill_tokens;
  run.prefill_seconds += prefill_stats.prefill_seconds;
  run.generated_tokens += prefill_stats.generated_tokens;
  run.output_digest += prefill_stats.output_digest;
  return run;
}

}  // namespace

absl::StatusOr<DisaggregationStats> run_disaggregated(Engine& prefill, Engine& decode,
                                                      const std::vector<Request>& requests,
                                                      const DisaggregationOptions& options) {
  if (!prefill.options().hand_off || decode.options().hand_off) {
    return absl::InvalidArgumentError(
        "run_disaggregated: the prefill engine needs hand_off, the decode engine not");
  }
  int64_t sequences = 0;
  for (const Request& r : requests) sequences += r.num_samples;
  EnginePair pair(prefill, decode, options);
  absl::Status status = pair.connect(sequences);
  if (status.ok()) status = pair.run(requests);
  if (!status.ok()) return status;
  DisaggregationStats stats = std::move(pair.stats());
  stats.combined = combine(prefill, decode, stats.prefill);
  return stats;
}

}  // namespace decode_loop
