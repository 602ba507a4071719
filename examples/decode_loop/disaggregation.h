// File: examples/decode_loop/disaggregation.h
//
// Disaggregated prefill and decode (--disaggregate): two engines in one process, a prefill
// engine that computes each request's prompt and first token and a decode engine that
// generates the rest, with the K/V handed from one to the other over pagedkv::transfer on
// loopback (TCP or shared memory), as separate machines would over their network. One
// thread drives both, a round per iteration:
//
//   prefill.step()                  prompts and first tokens; the sequences are exported
//                                   (pinned) at the end of the step: take_handoffs()
//   decode.begin_import(handoff)    admitted past its own prefix hit: the entries to fill
//     receiver.expect(entries)      into staging buffers, then
//     sender.send(those entries)    read from the prefill engine's pinned blocks
//   sender.poll(), receiver.poll()  bytes move; completions:
//     received: the verified leading blocks of each group written into the decode
//               engine's store, decode.end_import(): computed from there
//     sent:     prefill.release_export()
//   decode.step()
//
// The sequence's record (its tokens, sampling and, for verification, the first token's
// logits) goes from engine to engine in memory: a deployment sends it by its own RPC beside
// the transfer. Injected faults (TransferFault) break transfers on the prefill side's way
// out; the decode engine recomputes what did not arrive verified, and a prefill engine that
// dies mid-transfer leaves its requests to the decode engine.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_DISAGGREGATION_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_DISAGGREGATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler.h"
#include "workload.h"

namespace decode_loop {

enum class TransferFault {
  kNone,
  kDrop,        // every fourth transfer loses one block (the first, second or third)
  kCorrupt,     // every fourth transfer has one byte of one block flipped
  kDelay,       // three transfers leave late: one by half the timeout, two by twice it
  kPeerKilled,  // the prefill engine dies halfway through the hand-offs, mid-block
};

struct DisaggregationOptions {
  // Where the decode engine listens: tcp://127.0.0.1:0 (a free port) or shm://NAME.
  std::string endpoint = "tcp://127.0.0.1:0";
  TransferFault fault = TransferFault::kNone;
  absl::Duration transfer_timeout = absl::Seconds(10);  // per transfer, on both sides
};

struct DisaggregationStats {
  int64_t handoffs = 0;       // sequences the prefill engine exported
  int64_t transfers = 0;      // started (an import with entries to fill)
  int64_t local_imports = 0;  // imports the decode engine's own prefix cache served whole
  int64_t transfers_complete = 0;
  int64_t transfers_failed = 0;
  int64_t transfers_timed_out = 0;
  int64_t transfers_cancelled = 0;
  int64_t blocks_expected = 0;
  int64_t blocks_verified = 0;
  int64_t blocks_corrupt = 0;
  int64_t blocks_missing = 0;
  int64_t blocks_wrong = 0;
  int64_t bytes_verified = 0;
  int64_t import_tokens = 0;     // prompt tokens handed off
  int64_t local_hit_tokens = 0;  // of those, the decode engine's prefix cache held
  // Of those, what the decode engine did not compute: its own hits, kept, and the
  // transferred tokens counted as computed (imported_tokens).
  int64_t served_tokens = 0;
  int64_t imported_tokens = 0;
  // The rest, computed again by the decode engine: what the transfer did not deliver
  // verified (and local hits given up when a group could not serve past them).
  int64_t recomputed_tokens = 0;
  bool peer_killed = false;        // the prefill engine's connection broke: it is gone
  int64_t rerouted_sequences = 0;  // the dead prefill engine's, computed by the decode one
  double transfer_seconds = 0.0;   // sum over transfers of expect() to completion
  // Both engines together: the decode engine's RunStats with the requests, generated tokens
  // and output digest of the sequences the prefill engine finished (one-token outputs).
  RunStats combined;
  RunStats prefill;  // the prefill engine's, up to its end
};

// Serves `requests` with `prefill` (EngineOptions::hand_off) and `decode`, then ends both
// runs (Engine::finish_run(); the prefill engine's only if it lived). The engines must have
// the same model and cache plan. Errors: the engines', the transport's set-up, and
// InvalidArgument for a prefill engine without hand_off.
absl::StatusOr<DisaggregationStats> run_disaggregated(Engine& prefill, Engine& decode,
                                                      const std::vector<Request>& requests,
                                                      const DisaggregationOptions& options);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_DISAGGREGATION_H_
