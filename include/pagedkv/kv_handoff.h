// File: pagedkv/kv_handoff.h
//
// A request's K/V handed from one engine to another (disaggregated prefill and decode), as
// the KV cache managers on both ends see it: which entries of each layer group's block
// table travel, from which blocks, into which blocks. The bytes move by a transport
// (pagedkv/kv_transfer.h: block i of group g travels as KvTransferBlock{g, entry, ...});
// the managers decide which blocks are read and written, that the sender's stay put until
// they are sent, and when the receiver's count as computed.
//
//   prefill engine                               decode engine
//   (computes the prompt, samples a token)       add_sequence(seq, prompt + that token)
//   export_sequence(seq) -> KvExport             match_prefix(seq)     local hits first
//     the sequence ends; its blocks stay         import_slots(seq, export.tokens.size())
//     pinned                                       -> KvImport: the entries to fill
//                                                take_step_ops(), run them: only then
//   send the entries the import names  ------->  receive them into the import's blocks
//   release_export(seq) once answered            complete_import(seq, verified) -> p
//                                                  p tokens count as computed; the
//                                                  engine computes the rest
//
// A failed or partial transfer costs recomputation, never wrong output: complete_import()
// counts the longest prefix that every layer group can serve from verified blocks (a full
// group: every entry before it; a windowed group: the entries its window needs there; a
// state group: its state, which only a whole transfer brings), releases the rest, and the
// sequence computes from there like one preempted by recompute.
#ifndef PAGEDKV_KV_HANDOFF_H_
#define PAGEDKV_KV_HANDOFF_H_

#include <cstdint>
#include <vector>

#include "pagedkv/block_hash.h"
#include "pagedkv/types.h"

namespace pagedkv {

// One layer group's entries of a hand-off: entry first_entry + i of the sequence's table
// is blocks[i]. An attention group's entries are token blocks (entry e holds tokens
// [e x block_size, (e + 1) x block_size)); a state group's one entry, 0, is the state
// slot, holding the state after the last token.
struct KvHandoffGroup {
  int32_t first_entry = 0;
  std::vector<BlockId> blocks;
};

// What the sender holds for a request (KvCacheManager::export_sequence()).
struct KvExport {
  SeqId seq = 0;
  std::vector<TokenId> tokens;          // the tokens whose K/V the blocks hold
  std::vector<BlockHash> block_hashes;  // chained hashes of the full blocks of `tokens`
  // Per layer group, in the manager's order: every entry the sequence held (a windowed
  // group: those of its window only; the released ones are never needed again).
  std::vector<KvHandoffGroup> groups;
};

// What the receiver must fill (KvCacheManager::import_slots()).
struct KvImport {
  int32_t num_local_tokens = 0;  // tokens its own prefix cache held: not transferred
  int32_t num_tokens = 0;        // tokens whose K/V the sequence holds once it is complete
  // Per layer group: the entries the transfer fills, each into the receiver's block.
  std::vector<KvHandoffGroup> groups;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_HANDOFF_H_
