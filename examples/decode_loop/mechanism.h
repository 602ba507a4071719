// File: examples/decode_loop/mechanism.h
//
// The ways a sequence's K/V can reach it other than being written by its own write_kv:
// the mechanisms of the allocator that --verify must look at. The engine records, per
// sequence, which of them touched its K/V (SequenceRecord::mechanisms), from the ops the
// manager issued (before a --fault drops any) and from its own admissions and forks:
//
//   cow-copy    a copy-on-write copy into one of its blocks
//   swap-in     a swap-in copy into one of its blocks (its K/V swapped out and back)
//   recompute   admitted again after a recompute preemption (generated tokens recomputed)
//   fork        forked from a sample: it shares its parent's blocks and what reached them
//   promote     a host-tier prefix hit promoted into one of its blocks
//   exchange    a host-tier prefix hit exchanged into one of its blocks
//   demote      one of its promoted or exchanged blocks came from a host block that a
//               demotion (or an exchange's demote half) wrote: an evicted block that hit later
//   prefix-hit  a device prefix-cache hit at an admission
//   state-restore  its state slot restored from a checkpoint at an admission (a prefix hit
//               of a model with state layers)
//   state-host-restore  ... from a checkpoint of the host tier (a promote copy into its slot)
//   remote      prefix blocks loaded from the remote tier (--remote) at an admission
//   rollback    drafts of its (--speculative) that the target model rejected were rolled
//               back: their slots were released and later tokens' K/V took their place
//   transfer    its prompt's K/V came from the prefill engine (--disaggregate), into its
//               blocks past the prefix hit; what the transfer did not deliver verified,
//               it computed again (then recompute too)
//
// kMechanisms lists them in rank order: the order of the verifier's picks and summaries.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_MECHANISM_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_MECHANISM_H_

#include <array>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace decode_loop {

enum class Mechanism : uint8_t {
  kCowCopy,
  kSwapIn,
  kRecompute,
  kFork,
  kPromote,
  kExchange,
  kDemote,
  kPrefixHit,
  kStateRestore,
  kStateHostRestore,
  kRemote,
  kRollback,
  kTransfer,
};

inline constexpr std::array kMechanisms = {
    Mechanism::kCowCopy,      Mechanism::kSwapIn,
    Mechanism::kRecompute,    Mechanism::kFork,
    Mechanism::kPromote,      Mechanism::kExchange,
    Mechanism::kDemote,       Mechanism::kPrefixHit,
    Mechanism::kStateRestore, Mechanism::kStateHostRestore,
    Mechanism::kRemote,       Mechanism::kRollback,
    Mechanism::kTransfer,
};

// The mechanism's name in summaries and JSON ("cow-copy").
const char* mechanism_name(Mechanism mechanism);

// What a verified sequence picked for `mechanism` is ("swap-preempted").
const char* picked_as(Mechanism mechanism);

// A set of mechanisms (one bit each).
class MechanismSet {
 public:
  constexpr MechanismSet() = default;
  constexpr MechanismSet(std::initializer_list<Mechanism> mechanisms) {
    for (const Mechanism m : mechanisms) add(m);
  }

  constexpr void add(Mechanism m) { bits_ |= bit(m); }
  constexpr bool contains(Mechanism m) const { return (bits_ & bit(m)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr int32_t size() const { return std::popcount(bits_); }
  constexpr MechanismSet& operator|=(MechanismSet other) {
    bits_ |= other.bits_;
    return *this;
  }
  // The mechanisms of this set that `other` lacks.
  constexpr MechanismSet minus(MechanismSet other) const { return from_bits(bits_ & ~other.bits_); }
  constexpr MechanismSet operator&(MechanismSet other) const {
    return from_bits(bits_ & other.bits_);
  }
  constexpr bool operator==(const MechanismSet&) const = default;

 private:
  static constexpr uint32_t bit(Mechanism m) { return 1u << static_cast<uint32_t>(m); }
  static constexpr MechanismSet from_bits(uint32_t bits) {
    MechanismSet set;
    set.bits_ = bits;
    return set;
  }
  uint32_t bits_ = 0;
};

// The set's mechanism names in rank order, comma-separated ("none" when empty).
std::string mechanism_names(MechanismSet set);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_MECHANISM_H_
