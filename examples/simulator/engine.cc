#include "engine.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

enum class State { kWaiting, kRunning, kSwapped, kDone };

struct Seq {
  int32_t request = 0;
  int32_t sample = 0;     // output stream of this sequence (samples and beams differ)
  int32_t generated = 0;  // output tokens generated so far
  State state = State::kWaiting;
  bool registered = false;         // added to the allocator
  bool prefilled = false;          // its prompt (or recomputed context) is computed
  int32_t shared_tokens_left = 0;  // of its prefill, tokens read from the shared tier
};

struct Group {
  int32_t live = 0;           // sequences not finished
  int32_t forks_pending = 0;  // children to fork after the first prefill
  int32_t next_sample = 1;
  std::vector<SeqId> members;  // live sequences, oldest first (beams)
};

struct StepRecord {
  double time_s;
  double dt_s;
  float utilization;
  int32_t concurrency;
};

}  // namespace

class EngineModel::Impl {
 public:
  Impl(const Trace& trace, const AllocatorSetup& setup, const EngineOptions& options,
       std::unique_ptr<SimAllocator> alloc)
      : trace_(trace),
        setup_(setup),
        opt_(options),
        owned_alloc_(std::move(alloc)),
        alloc_(*owned_alloc_),
        budget_(setup.hybrid ? setup.hybrid->budget_bytes : setup.budget_tokens) {
    groups_.resize(trace.requests.size());
    request_stamp_.assign(trace.requests.size(), -1);
    phases_.assign(trace.requests.size(), RequestPhase::kNotHere);
    result_.allocator = allocator_name(setup_.config);
    alloc_.set_preemption_listener(
        [this](SeqId seq, PreemptionMode mode) { on_preempted(seq, mode); });
  }

  void submit(int32_t request) {
    arrivals_.push_back(request);
    phases_[request] = RequestPhase::kQueued;
  }

  RequestPhase phase(int32_t request) const { return phases_[request]; }

  absl::Status run_until(double until_s) {
    int idle_loops = 0;
    while (true) {
      while (next_arrival_ < arrivals_.size() && arrival_s(next_arrival_) <= now_) {
        arrive(arrivals_[next_arrival_++]);
      }
      if (running_.empty() && waiting_.empty() && swapped_.empty()) {
        if (next_arrival_ == arrivals_.size() || arrival_s(next_arrival_) > until_s) {
          return absl::OkStatus();
        }
        now_ = arrival_s(next_arrival_);
        continue;
      }
      if (now_ >= until_s) return absl::OkStatus();
      absl::Status s = step();
      if (!s.ok()) return s;
      if (opt_.shared_tier != nullptr) opt_.shared_tier->publish(now_);  // the step's blocks
      if (scheduled_.empty() && !(running_.empty() && swapped_.empty() && waiting_.empty())) {
        if (++idle_loops > 3) {
          return absl::InternalError(absl::StrCat(
              result_.allocator, ": engine stuck at t=", now_, ": ", running_.size(), " running, ",
              waiting_.size(), " waiting, ", swapped_.size(),
              " swapped, nothing schedulable; last admission error: ", last_admit_error_,
              "; allocator: ", alloc_.describe()));
        }
      } else {
        idle_loops = 0;
      }
      if (opt_.progress && result_.steps % opt_.progress_every == 0 && result_.steps > 0) {
        opt_.progress(result_.steps, result_.completed + result_.rejected,
                      static_cast<int64_t>(arrivals_.size()));
      }
    }
  }

  absl::StatusOr<EngineResult> drain() {
    if (absl::Status s = run_until(std::numeric_limits<double>::infinity()); !s.ok()) return s;
    result_.requests = static_cast<int64_t>(arrivals_.size());
    const int64_t unfinished = result_.requests - result_.completed - result_.rejected;
    if (unfinished != 0) {
      return absl::InternalError(
          absl::StrCat("engine idle with ", unfinished, " requests unfinished at t=", now_));
    }
    finish();
    return std::move(result_);
  }

 private:
  template <typename F>
  auto timed(F&& f) {
    if (!opt_.measure_allocator_time) return f();
    const auto t0 = std::chrono::steady_clock::now();
    auto add_elapsed = [&] {
      alloc_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - t0)
                       .count();
    };
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      add_elapsed();
    } else {
      auto r = f();
      add_elapsed();
      return r;
    }
  }

  const Request& request_of(const Seq& s) const { return trace_.requests[s.request]; }
  double arrival_s(size_t arrival) const { return trace_.requests[arrivals_[arrival]].arrival_s; }

  void arrive(int32_t r) {
    const Request& req = trace_.requests[r];
    Group& g = groups_[r];
    g.forks_pending = (req.num_samples - 1) + (req.beam_width - 1);
    g.next_sample = 1;
    g.live = 1;
    const SeqId id = next_id_++;
    seqs_.emplace(id, Seq{.request = r, .sample = 0});
    g.members.push_back(id);
    waiting_.push_back(id);
  }

  // The link time of the host-tier promotions the allocator made since the last step that
  // paid for them (a step that schedules nothing pays for none; the next one does). Each
  // promoted block, whether a plain promotion or an exchange, moves block_size tokens of
  // KV host -> device. The device -> host half of an exchange, like a demotion, runs in
  // the other direction of the full-duplex link at the same time and is not counted.
  double promotion_time_s() {
    const int64_t promoted = alloc_.counters().blocks_promoted;
    const int64_t blocks = promoted - promotions_charged_;
    promotions_charged_ = promoted;
    return static_cast<double>(blocks * setup_.config.block_size) *
           static_cast<double>(opt_.kv_bytes_per_token) / opt_.host_link_bytes_per_s;
  }

  void on_preempted(SeqId id, PreemptionMode mode) {
    Seq& s = seqs_.at(id);
    step_preempted_ = true;
    if (mode == PreemptionMode::kSwap) {
      s.state = State::kSwapped;
      swapped_.push_back(id);
    } else {
      s.state = State::kWaiting;
      s.prefilled = false;
      waiting_.push_front(id);  // resumes before new requests
    }
  }

  // The most prompt tokens `s` may compute now: the rest of the step's budget while its
  // prefill is chunked, else all.
  int32_t chunk_limit(const Seq& s, int64_t prefill_tokens) const {
    if (!opt_.chunked_prefill || s.prefilled) return std::numeric_limits<int32_t>::max();
    return static_cast<int32_t>(std::max<int64_t>(0, opt_.max_prefill_tokens - prefill_tokens));
  }

  // Cluster mode: the tokens of an admitted sequence's prefill that the shared tier holds:
  // the prompt's full blocks that follow the allocator's hits (device and host), as far as
  // the tier holds them in order, never the prompt's last token. Counted as shared hits.
  int32_t read_shared_tier(const Seq& s, const Work& work) {
    if (opt_.shared_tier == nullptr) return 0;
    const Request& req = request_of(s);
    const int32_t bs = setup_.config.block_size;
    const int32_t cached = req.input_length + s.generated - (work.tokens + work.remaining);
    const int32_t first = cached / bs;
    const int32_t last = (req.input_length - 1) / bs;  // full prompt blocks before the last token
    if (cached % bs != 0 || first >= last) return 0;
    const std::vector<TokenId> prompt = prompt_tokens(req, s.request);
    const std::vector<BlockHash> hashes = prefix_block_hashes(prompt, bs, last);
    const int32_t read =
        opt_.shared_tier->read_prefix(std::span(hashes).subspan(static_cast<size_t>(first)), now_) *
        bs;
    result_.prefix_shared_hit_tokens += read;
    return read;
  }

  // The step time of the shared-tier reads of this step's prefills.
  double shared_read_time_s() {
    const double bytes =
        static_cast<double>(step_shared_tokens_) * static_cast<double>(opt_.kv_bytes_per_token);
    step_shared_tokens_ = 0;
    return opt_.shared_tier == nullptr ? 0.0 : bytes / opt_.shared_tier_bytes_per_s;
  }

  // A sequence computed `work`: prefill time counts, and once its prompt is done it
  // generates from this step on (and forks its samples and beams).
  absl::Status computed(SeqId id, const Work& work, bool admission, int64_t& prefill_tokens) {
    Seq& s = seqs_.at(id);
    if (s.prefilled) return absl::OkStatus();
    if (admission || opt_.chunked_prefill) {
      const int32_t read = std::min(work.tokens, s.shared_tokens_left);
      s.shared_tokens_left -= read;
      step_shared_tokens_ += read;
      prefill_tokens += work.tokens - read;
    }
    if (work.remaining > 0) return absl::OkStatus();
    s.prefilled = true;
    if (s.sample == 0) phases_[s.request] = RequestPhase::kDecoding;
    return fork_pending(id);
  }

  // Parallel samples and beams share the prompt: they fork after its prefill.
  absl::Status fork_pending(SeqId id) {
    // Copies: emplace() below may rehash seqs_ and move the parent.
    const int32_t request = seqs_.at(id).request;
    const int32_t generated = seqs_.at(id).generated;
    Group& g = groups_[request];
    for (; g.forks_pending > 0; --g.forks_pending) {
      const SeqId child = next_id_++;
      absl::Status f = timed([&] { return alloc_.fork(id, child); });
      if (!f.ok()) return fail("fork", id, f);
      seqs_.emplace(child, Seq{.request = request,
                               .sample = g.next_sample++,
                               .generated = generated,
                               .state = State::kRunning,
                               .registered = true,
                               .prefilled = true});
      g.members.push_back(child);
      ++g.live;
      running_.push_back(child);
      scheduled_.push_back(child);
    }
    return absl::OkStatus();
  }

  absl::Status fail(const char* what, SeqId id, const absl::Status& s) const {
    return absl::InternalError(absl::StrCat(result_.allocator, " step ", result_.steps, ": ", what,
                                            "(seq ", id, "): ", s.message()));
  }

  absl::Status step() {
    step_preempted_ = false;
    scheduled_.clear();
    int64_t prefill_tokens = 0;

    // 1. Decode: every running sequence reserves its last generated token (or the next
    // chunk of its prompt).
    const std::vector<SeqId> snapshot = running_;
    for (SeqId id : snapshot) {
      Seq& s = seqs_.at(id);
      if (s.state != State::kRunning) continue;  // preempted earlier in this step
      const int32_t limit = chunk_limit(s, prefill_tokens);
      if (limit == 0) continue;  // its prefill waits for a step with budget left
      absl::StatusOr<Work> work = timed([&] { return alloc_.reserve(id, true, limit); });
      if (work.ok()) {
        scheduled_.push_back(id);
        if (absl::Status c = computed(id, *work, false, prefill_tokens); !c.ok()) return c;
        continue;
      }
      if (!absl::IsResourceExhausted(work.status())) return fail("reserve", id, work.status());
      absl::Status p = timed([&] { return alloc_.preempt(id); });
      if (!p.ok()) return fail("preempt", id, p);
    }

    // 2. Swapped sequences come back, oldest first, when nothing was preempted.
    while (!step_preempted_ && !swapped_.empty() && num_running() < opt_.max_num_seqs) {
      const SeqId id = swapped_.front();
      absl::Status in = timed([&] { return alloc_.swap_in(id); });
      if (absl::IsResourceExhausted(in)) break;
      if (!in.ok()) return fail("swap_in", id, in);
      swapped_.pop_front();
      seqs_.at(id).state = State::kRunning;
      running_.push_back(id);
      const int32_t limit = chunk_limit(seqs_.at(id), prefill_tokens);
      if (limit == 0) continue;
      absl::StatusOr<Work> work = timed([&] { return alloc_.reserve(id, false, limit); });
      if (work.ok()) {
        scheduled_.push_back(id);
        if (absl::Status c = computed(id, *work, false, prefill_tokens); !c.ok()) return c;
      } else if (!absl::IsResourceExhausted(work.status())) {
        return fail("reserve", id, work.status());
      }
    }

    // 3. Admission in arrival order, when nothing was preempted or is swapped out.
    while (!step_preempted_ && swapped_.empty() && !waiting_.empty() &&
           num_running() < opt_.max_num_seqs && prefill_tokens < opt_.max_prefill_tokens) {
      const SeqId id = waiting_.front();
      Seq& s = seqs_.at(id);
      Group& g = groups_[s.request];
      if (!s.registered) {
        const Request& req = request_of(s);
        const std::vector<TokenId> prompt = prompt_tokens(req, s.request);
        absl::Status add = timed([&] {
          return alloc_.add(id, prompt, req.input_length + req.output_length - 1, g.forks_pending);
        });
        if (absl::IsInvalidArgument(add)) {  // can never fit this budget
          waiting_.pop_front();
          reject(id);
          continue;
        }
        if (!add.ok()) return fail("add", id, add);
        s.registered = true;
      }
      const int32_t limit = chunk_limit(s, prefill_tokens);
      absl::StatusOr<Work> work = timed([&] { return alloc_.admit(id, limit); });
      if (absl::IsResourceExhausted(work.status())) {
        last_admit_error_ = std::string(work.status().message());
        break;
      }
      if (!work.ok()) return fail("admit", id, work.status());
      waiting_.pop_front();
      s.state = State::kRunning;
      s.shared_tokens_left = read_shared_tier(s, *work);
      running_.push_back(id);
      scheduled_.push_back(id);
      if (absl::Status c = computed(id, *work, true, prefill_tokens); !c.ok()) return c;
    }
    timed([&] { alloc_.run_copies(); });
    if (opt_.check_invariants) {
      if (absl::Status c = alloc_.check_invariants(); !c.ok()) {
        return absl::InternalError(absl::StrCat(result_.allocator, " step ", result_.steps,
                                                ": invariant broken: ", c.message()));
      }
    }
    if (scheduled_.empty()) {
      rebuild_running();
      return absl::OkStatus();
    }

    // Memory and concurrency while the step computes.
    active_.clear();
    for (SeqId id : running_) {
      if (seqs_.at(id).state == State::kRunning) active_.push_back(id);
    }
    const AllocatorUsage usage = alloc_.usage(active_);
    int32_t concurrency = 0;
    for (SeqId id : active_) {
      const int32_t r = seqs_.at(id).request;
      if (request_stamp_[r] != result_.steps) {
        request_stamp_[r] = result_.steps;
        ++concurrency;
      }
    }
    const double promote_s = promotion_time_s();
    result_.promote_time_s += promote_s;
    const double shared_s = shared_read_time_s();
    result_.shared_read_time_s += shared_s;
    const double dt = (opt_.step_ms +
                       opt_.prefill_ms_per_1k_tokens * static_cast<double>(prefill_tokens) / 1000) /
                          1000 +
                      promote_s + shared_s;
    record(dt, usage, concurrency);
    now_ += dt;
    ++result_.steps;

    // 4. Every scheduled sequence generates a token; finished ones release their memory.
    beam_groups_.clear();
    for (SeqId id : scheduled_) {
      Seq& s = seqs_.at(id);
      if (s.state != State::kRunning) continue;  // preempted after it was scheduled
      if (!s.prefilled) continue;                // mid-prefill: no token yet
      ++s.generated;
      ++result_.generated_tokens;
      const Request& req = request_of(s);
      if (s.generated >= req.output_length) {
        absl::Status f = timed([&] { return alloc_.free(id); });
        if (!f.ok()) return fail("free", id, f);
        finish_sequence(id);
        continue;
      }
      const TokenId token = output_token(s.request, s.sample, s.generated - 1);
      absl::Status a = timed([&] { return alloc_.append(id, token); });
      if (!a.ok()) return fail("append", id, a);
      if (req.beam_width > 1 && s.generated % opt_.beam_interval == 0) {
        beam_groups_.push_back(s.request);
      }
    }
    std::sort(beam_groups_.begin(), beam_groups_.end());
    beam_groups_.erase(std::unique(beam_groups_.begin(), beam_groups_.end()), beam_groups_.end());
    for (int32_t r : beam_groups_) {
      if (absl::Status b = reshape_beams(r); !b.ok()) return b;
    }
    rebuild_running();
    return absl::OkStatus();
  }

  // Beam-style fork: the last running beam is dropped and the first one forked.
  absl::Status reshape_beams(int32_t r) {
    Group& g = groups_[r];
    std::vector<SeqId> live;
    for (SeqId id : g.members) {
      if (seqs_.at(id).state == State::kRunning) live.push_back(id);
    }
    if (live.size() < 2) return absl::OkStatus();
    const SeqId worst = live.back();
    const SeqId best = live.front();
    absl::Status f = timed([&] { return alloc_.free(worst); });
    if (!f.ok()) return fail("free", worst, f);
    finish_sequence(worst);
    const SeqId child = next_id_++;
    absl::Status k = timed([&] { return alloc_.fork(best, child); });
    if (absl::IsResourceExhausted(k)) return absl::OkStatus();  // the beam stays narrower
    if (!k.ok()) return fail("fork", best, k);
    const Seq& parent = seqs_.at(best);
    seqs_.emplace(child, Seq{.request = r,
                             .sample = g.next_sample++,
                             .generated = parent.generated,
                             .state = State::kRunning,
                             .registered = true});
    g.members.push_back(child);
    ++g.live;
    running_.push_back(child);
    return absl::OkStatus();
  }

  void finish_sequence(SeqId id) {
    Seq& s = seqs_.at(id);
    s.state = State::kDone;
    Group& g = groups_[s.request];
    std::erase(g.members, id);
    if (--g.live == 0) {
      ++result_.completed;
      phases_[s.request] = RequestPhase::kDone;
      latency_sum_ += now_ - trace_.requests[s.request].arrival_s;
      result_.sim_time_s = now_;
    }
  }

  void reject(SeqId id) {
    Seq& s = seqs_.at(id);
    s.state = State::kDone;
    groups_[s.request].live = 0;
    phases_[s.request] = RequestPhase::kDone;
    ++result_.rejected;
    seqs_.erase(id);
  }

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }

  void rebuild_running() {
    std::vector<SeqId> kept;
    kept.reserve(running_.size());
    for (SeqId id : running_) {
      auto it = seqs_.find(id);
      if (it == seqs_.end()) continue;
      if (it->second.state == State::kRunning) {
        kept.push_back(id);
      } else if (it->second.state == State::kDone) {
        seqs_.erase(it);
      }
    }
    running_ = std::move(kept);
  }

  void record(double dt, const AllocatorUsage& usage, int32_t concurrency) {
    const double util = usage.reserved_slots > 0 ? static_cast<double>(usage.token_slots) /
                                                       static_cast<double>(usage.reserved_slots)
                                                 : 0.0;
    steps_.push_back({now_, dt, static_cast<float>(util), concurrency});
    if (usage.reserved_slots > 0) {
      util_weighted_ += util * dt;
      util_time_ += dt;
    }
    memory_weighted_ += static_cast<double>(usage.token_slots) /
                        static_cast<double>(std::max<int64_t>(budget_, 1)) * dt;
    reserved_weighted_ += static_cast<double>(usage.reserved_slots) /
                          static_cast<double>(std::max<int64_t>(budget_, 1)) * dt;
    conc_weighted_ += concurrency * dt;
    busy_time_ += dt;
    result_.peak_concurrency = std::max(result_.peak_concurrency, concurrency);
  }

  void finish() {
    const AllocatorCounters c = alloc_.counters();
    result_.preemptions = c.preemptions_recompute + c.preemptions_swap;
    result_.preemptions_swap = c.preemptions_swap;
    result_.prefix_query_tokens = c.prefix_query_tokens;
    result_.prefix_hit_tokens = c.prefix_hit_tokens;
    result_.prefix_host_hit_tokens = c.prefix_host_hit_tokens;
    result_.blocks_promoted = c.blocks_promoted;
    result_.blocks_demoted = c.blocks_demoted;
    result_.host_evictions = c.host_evictions;
    result_.evictions = c.evictions;
    result_.cow_copies = c.cow_copies;
    result_.mean_utilization = util_time_ > 0 ? util_weighted_ / util_time_ : 0;
    result_.mean_memory_use = busy_time_ > 0 ? memory_weighted_ / busy_time_ : 0;
    result_.mean_reserved = busy_time_ > 0 ? reserved_weighted_ / busy_time_ : 0;
    result_.mean_concurrency = busy_time_ > 0 ? conc_weighted_ / busy_time_ : 0;
    const double start = arrivals_.empty() ? 0 : arrival_s(0);
    const double span = result_.sim_time_s - start;
    result_.throughput_rps = span > 0 ? static_cast<double>(result_.completed) / span : 0;
    result_.mean_latency_s =
        result_.completed > 0 ? latency_sum_ / static_cast<double>(result_.completed) : 0;
    result_.allocator_ns_per_step =
        opt_.measure_allocator_time && result_.steps > 0
            ? static_cast<double>(alloc_ns_) / static_cast<double>(result_.steps)
            : 0;
    // The over-time series: time-weighted bucket means over the busy steps.
    const int32_t points = std::max(1, opt_.series_points);
    if (!steps_.empty()) {
      const double t0 = steps_.front().time_s;
      const double t1 = steps_.back().time_s + steps_.back().dt_s;
      const double width = std::max((t1 - t0) / points, 1e-9);
      std::vector<double> u(points, 0), k(points, 0), w(points, 0);
      for (const StepRecord& r : steps_) {
        const int32_t b = std::min(points - 1, static_cast<int32_t>((r.time_s - t0) / width));
        u[b] += r.utilization * r.dt_s;
        k[b] += r.concurrency * r.dt_s;
        w[b] += r.dt_s;
      }
      for (int32_t b = 0; b < points; ++b) {
        if (w[b] <= 0) continue;
        result_.series.push_back({.time_s = t0 + (b + 0.5) * width,
                                  .utilization = u[b] / w[b],
                                  .concurrency = static_cast<int32_t>(k[b] / w[b] + 0.5)});
      }
    }
  }

  const Trace& trace_;
  const AllocatorSetup setup_;
  const EngineOptions opt_;
  std::unique_ptr<SimAllocator> owned_alloc_;
  SimAllocator& alloc_;
  int64_t budget_;  // token slots, or bytes for hybrid pools

  EngineResult result_;
  double now_ = 0;
  std::vector<int32_t> arrivals_;  // submitted requests, in arrival order
  size_t next_arrival_ = 0;        // arrivals_[next_arrival_] has not arrived yet
  std::vector<RequestPhase> phases_;
  int64_t step_shared_tokens_ = 0;  // read from the shared tier this step
  SeqId next_id_ = 0;
  bool step_preempted_ = false;
  int64_t alloc_ns_ = 0;
  int64_t promotions_charged_ = 0;  // blocks promoted whose link time a step has paid
  double latency_sum_ = 0;
  double util_weighted_ = 0, util_time_ = 0, memory_weighted_ = 0, reserved_weighted_ = 0,
         conc_weighted_ = 0, busy_time_ = 0;

  absl::flat_hash_map<SeqId, Seq> seqs_;
  std::vector<Group> groups_;
  std::vector<int64_t> request_stamp_;
  std::deque<SeqId> waiting_;
  std::deque<SeqId> swapped_;
  std::vector<SeqId> running_;    // admission order
  std::vector<SeqId> scheduled_;  // computing this step
  std::vector<SeqId> active_;
  std::vector<int32_t> beam_groups_;
  std::vector<StepRecord> steps_;
  std::string last_admit_error_;
};

EngineModel::EngineModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EngineModel::~EngineModel() = default;
void EngineModel::submit(int32_t request) { impl_->submit(request); }
absl::Status EngineModel::run_until(double until_s) { return impl_->run_until(until_s); }
absl::StatusOr<EngineResult> EngineModel::drain() { return impl_->drain(); }
RequestPhase EngineModel::phase(int32_t request) const { return impl_->phase(request); }

absl::StatusOr<std::unique_ptr<EngineModel>> EngineModel::create(const Trace& trace,
                                                                 const AllocatorSetup& setup,
                                                                 const EngineOptions& options) {
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    const Request& r = trace.requests[i];
    if (r.input_length <= 0 || r.output_length <= 0 ||
        int64_t{r.input_length} + r.output_length > setup.max_model_len) {
      return absl::InvalidArgumentError(
          absl::StrCat(trace.name, " request ", i, ": input ", r.input_length, " + output ",
                       r.output_length, " must be positive and fit max_model_len ",
                       setup.max_model_len, " (clamp the trace first)"));
    }
    if (r.num_samples < 1 || r.beam_width < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(trace.name, " request ", i, ": num_samples and beam_width must be >= 1"));
    }
  }
  if (options.beam_interval < 1) {
    return absl::InvalidArgumentError("beam_interval must be >= 1");
  }
  if (options.chunked_prefill && options.max_prefill_tokens < 1) {
    return absl::InvalidArgumentError("chunked prefill needs max_prefill_tokens >= 1");
  }
  AllocatorSetup chunked = setup;
  if (options.chunked_prefill) chunked.max_chunk_tokens = options.max_prefill_tokens;
  if (options.shared_tier != nullptr && !(options.shared_tier_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_tier_bytes_per_s ", options.shared_tier_bytes_per_s, " must be > 0"));
  }
  absl::StatusOr<std::unique_ptr<SimAllocator>> alloc = make_allocator(chunked);
  if (!alloc.ok()) return alloc.status();
  return std::unique_ptr<EngineModel>(
      new EngineModel(std::make_unique<Impl>(trace, chunked, options, *std::move(alloc))));
}

absl::StatusOr<EngineResult> run_engine(const Trace& trace, const AllocatorSetup& setup,
                                        const EngineOptions& options) {
  absl::StatusOr<std::unique_ptr<EngineModel>> engine = EngineModel::create(trace, setup, options);
  if (!engine.ok()) return engine.status();
  for (size_t r = 0; r < trace.requests.size(); ++r) (*engine)->submit(static_cast<int32_t>(r));
  return (*engine)->drain();
}

}  // namespace pagedkv::sim
