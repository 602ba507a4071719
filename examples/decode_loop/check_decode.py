#!/usr/bin/env python3
"""CTest checker for pagedkv-decode: runs the binary with --json and checks the summary.

usage: check_decode.py [--full | --expect-mismatch | --host-cache-rise MB |
                        --concurrency-gain RATIO | --disaggregated] BINARY [ARGS...]

Always checks: exit status 0, the JSON parses, every request completed, verification ran
and passed (teacher-forced: logits within the dtype's bound, tokens equal or near-ties),
and when --verify is at least the number of mechanisms the run exercised, a verified
sequence went through each of them. With --speculative, drafts were verified and rejected
ones rolled back; with --draft replay also some accepted, and the output digest equal to
that of the same workload without speculation. With --full (the default small workload) also:
prefix-cache hit rate > 0, at least one preemption of each mode, at least one
copy-on-write copy, swapped blocks came back, and with a host tier blocks were demoted
and promoted. With --expect-mismatch (runs with --fault): the run must have exercised what
the fault breaks and verified a sequence that went through it, and the binary must exit 1
and its JSON report a failed verification with at least one failing sequence. With
--host-cache-rise MB: runs ARGS without and with --host-cache-mb MB; both must pass the
checks above, and with the host tier blocks must be demoted and promoted (every one of
them copied by the store, an exchange counting as both), some admission must hit the
host tier, verification must cover a sequence served from it, and the prefix-cache hit
rate must rise. With --concurrency-gain RATIO (a model with windowed layer groups): runs
ARGS and ARGS --treat-as-full; both must pass the checks above, and with the layer groups
the mean decode batch must be at least RATIO times that of full treatment.
With windowed layer groups, every run must release blocks behind the windows in each of
them; with --full prefix hits must also claim blocks in each. With state groups (--model
ssm), --full also needs checkpoints saved and restored in each, and a verified sequence
restored from one; with a host tier too, checkpoints demoted and restored from the tier
in each, and a verified sequence restored from a host-tier checkpoint.
With --disaggregated (ARGS with --disaggregate): the run must pass the checks above with
every handed-off sequence's K/V imported or recomputed, a verified sequence must have
been imported, and the output digest must equal that of ARGS on one engine (without
--disaggregate and --transfer-fault); with --transfer-fault, the fault must have ended
transfers (drop: blocks missing, corrupt: blocks corrupt, delay: transfers timed out,
peer-killed: the prefill engine gone, its sequences rerouted) and tokens recomputed (and
a verified sequence recomputed) for all but peer-killed, whose lost transfers may all
have been whole when it died.
"""
import json
import subprocess
import sys


def check_mismatch(proc):
    """A deliberately broken run: verification must fail, visibly and in the exit status."""
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        print(proc.stdout)
        print(f"FAIL: --json output does not parse: {e}")
        return 1
    verify = summary["verify"]
    fault = summary["fault"]
    covered = bool(fault and fault["exercised"] and fault["covered"])
    print(f"{'ok  ' if covered else 'FAIL'} fault {fault}: mechanisms exercised "
          f"{summary['mechanisms_exercised']}, covered "
          f"{verify['mechanisms_covered'] if verify else []}")
    mismatches = [s for s in verify["sequences"] if s["verdict"] == "FAIL"] if verify else []
    for s in mismatches:
        print(f"ok   fault caught: request {s['request']} sample {s['sample']} ({s['why']}) "
              f"{s['mechanisms']}: max logit diff {s['max_logit_diff']}, bound "
              f"{verify['bound']}: {s['detail']}")
    if proc.returncode != 1 or not verify or verify["passed"] or not mismatches:
        print(f"FAIL: expected exit 1 and a failed verification, got exit {proc.returncode}, "
              f"verify {verify}")
        return 1
    if not covered:
        print("FAIL: no verified sequence went through what the fault breaks")
        return 1
    print("PASS")
    return 0


def run(cmd):
    """Runs the binary with --json; returns its summary, or None after printing why not."""
    cmd = cmd + ["--json"]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.stderr:
        print(proc.stderr, file=sys.stderr)
    if proc.returncode != 0:
        print(proc.stdout)
        print(f"FAIL: exit status {proc.returncode}")
        return None
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        print(proc.stdout)
        print(f"FAIL: --json output does not parse: {e}")
        return None


class Checks:
    def __init__(self):
        self.failures = []

    def __call__(self, condition, what):
        status = "ok  " if condition else "FAIL"
        print(f"{status} {what}")
        if not condition:
            self.failures.append(what)


def check_speculative(summary, check):
    """--speculative: drafts were verified and some rolled back, under verification; with
    replayed drafts some were accepted, and greedy outputs equal the run without drafts."""
    spec = summary["speculative"]
    if spec["max_draft_tokens"] == 0:
        return
    check(spec["draft_tokens"] > 0 and "rollback" in summary["mechanisms_exercised"],
          f"drafts verified and rejected ones rolled back ({spec['draft_tokens']} drafts, "
          f"{spec['accepted_draft_tokens']} accepted, {spec['tokens_per_step']:.2f} tokens a "
          f"sequence-step)")
    if spec["drafter"] != "replay":
        return
    check(spec["accepted_draft_tokens"] > 0 and spec["tokens_per_step"] > 1,
          "replayed drafts accepted, more than a token a sequence-step")
    check(spec["rehearsal_output_digest"] == summary["output_digest"],
          f"the same output as without speculation (digest {summary['output_digest']}, "
          f"without {spec['rehearsal_output_digest']})")


def check_run(summary, check, full):
    check(summary["requests_completed"] == summary["requests"],
          f"all requests complete ({summary['requests_completed']}/{summary['requests']})")
    check(summary["generated_tokens"] > 0, f"tokens generated ({summary['generated_tokens']})")
    verify = summary["verify"]
    check(verify is not None and verify["passed"] and len(verify["sequences"]) > 0,
          "verification against the dense reference passed"
          + (f" ({len(verify['sequences'])} sequences, max logit diff "
             f"{verify['max_logit_diff']}, {verify['dtype']} bound {verify['bound']})"
             if verify else ""))
    if verify:
        for s in verify["sequences"]:
            print(f"     request {s['request']} sample {s['sample']} ({s['why']}) "
                  f"{s['mechanisms']}: {s['verdict']}, identical up to "
                  f"{s['identical_tokens']}/{s['tokens']}, max logit diff "
                  f"{s['max_logit_diff']} {s['detail']}")
        # Coverage by construction: one pick per mechanism exercised fits.
        if verify["requested"] >= len(summary["mechanisms_exercised"]):
            check(not verify["mechanisms_uncovered"],
                  f"verification covers every mechanism exercised "
                  f"({summary['mechanisms_exercised']}; uncovered "
                  f"{verify['mechanisms_uncovered']})")
    check_speculative(summary, check)
    groups = summary["kv_cache"]["layer_groups"]
    windowed = [g for g in groups if g["kind"] not in ("full", "state")]
    for g in windowed:
        check(g["released_blocks"] > 0,
              f"{g['kind']} {g['window']} group releases blocks behind its window "
              f"({g['released_blocks']})")
        if full:
            check(g["hit_blocks"] > 0,
                  f"{g['kind']} {g['window']} group: prefix hits claim its blocks "
                  f"({g['hit_blocks']})")
    for g in (g for g in groups if g["kind"] == "state" and full):
        check(g["checkpoints_saved"] > 0 and g["checkpoints_restored"] > 0,
              f"state group saves and restores checkpoints ({g['checkpoints_saved']} and "
              f"{g['checkpoints_restored']})")
        check(verify is not None and "state-restore" in verify["mechanisms_covered"],
              "a verified sequence was restored from a checkpoint")
        if summary["kv_cache"]["host_cache"]:
            check(g["blocks_demoted"] > 0 and g["blocks_promoted"] > 0,
                  f"state group demotes checkpoints to the host tier and restores them from it "
                  f"({g['blocks_demoted']} and {g['blocks_promoted']})")
            check(verify is not None and "state-host-restore" in verify["mechanisms_covered"],
                  "a verified sequence was restored from a host-tier checkpoint")
    if full:
        check(summary["prefix_cache_hit_rate"] > 0,
              f"prefix-cache hit rate > 0 ({summary['prefix_cache_hit_rate']:.3f})")
        check(summary["preemptions_recompute"] >= 1,
              f"recompute preemption ({summary['preemptions_recompute']})")
        check(summary["preemptions_swap"] >= 1, f"swap preemption ({summary['preemptions_swap']})")
        check(summary["blocks_swapped_in"] == summary["blocks_swapped_out"],
              "every swapped-out block swapped back in")
        check(summary["cow_copies"] >= 1, f"copy-on-write copies ({summary['cow_copies']})")
        check(0 < summary["kv_utilization"] <= 1,
              f"KV utilization in (0, 1] ({summary['kv_utilization']:.3f})")
        if summary["kv_cache"]["host_cache"]:
            check(summary["blocks_demoted"] > 0 and summary["blocks_promoted"] > 0,
                  f"the host tier demotes and promotes ({summary['blocks_demoted']} and "
                  f"{summary['blocks_promoted']} blocks)")


def without_disaggregation(argv):
    """ARGS for one engine: --disaggregate and the --transfer-* flags dropped."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0].replace("_", "-")
        if name in ("--disaggregate", "--transfer-fault", "--transfer-timeout-ms"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out + ["--verify", "0"]


def check_disaggregated(pair, single, check):
    d = pair["disaggregation"]
    check(d is not None and d["handoffs"] > 0,
          f"{d['handoffs']} sequences handed off from prefill to decode over {d['transport']}: "
          f"{d['transfers']} transfers ({d['transfers_complete']} complete, "
          f"{d['transfers_failed']} failed, {d['transfers_timed_out']} timed out), "
          f"{d['local_imports']} served by the decode engine's own cache; "
          f"{d['blocks_verified']} of {d['blocks_expected']} blocks verified "
          f"({d['blocks_corrupt']} corrupt, {d['blocks_missing']} missing); prompt tokens "
          f"{d['import_tokens']}: {d['local_hit_tokens']} local hits, "
          f"{d['imported_tokens']} imported, {d['recomputed_tokens']} recomputed")
    check(d["served_tokens"] + d["recomputed_tokens"] == d["import_tokens"] or d["peer_killed"],
          f"every handed-off prompt token served ({d['served_tokens']}: local hits kept and "
          f"imported) or recomputed")
    verify = pair["verify"]
    covered = verify["mechanisms_covered"] if verify else []
    check("transfer" in covered, "a verified sequence was imported")
    check(pair["output_digest"] == single["output_digest"],
          f"the same output as one engine (digest {pair['output_digest']}, one engine "
          f"{single['output_digest']})")
    fault = d["transfer_fault"]
    if fault == "none":
        check(d["transfers_complete"] == d["transfers"] and d["recomputed_tokens"] == 0,
              "every transfer complete, nothing recomputed")
        return
    broke = {"drop": d["blocks_missing"] > 0, "corrupt": d["blocks_corrupt"] > 0,
             "delay": d["transfers_timed_out"] > 0,
             "peer-killed": d["peer_killed"] and d["rerouted_sequences"] > 0}[fault]
    check(broke, f"--transfer-fault {fault} broke transfers (rerouted sequences "
                 f"{d['rerouted_sequences']})")
    if fault != "peer-killed":
        check(d["recomputed_tokens"] > 0 and "recompute" in covered,
              f"{d['recomputed_tokens']} tokens recomputed, a verified sequence among them")


def check_host_tier(base, tiered, check):
    """The same workload without and with the host tier."""
    check(not base["kv_cache"]["host_cache"] and base["blocks_demoted"] == 0,
          "without --host-cache-mb: no host tier, nothing demoted")
    check(tiered["kv_cache"]["host_cache"] and tiered["kv_cache"]["host_cache_blocks"] > 0,
          f"host tier of {tiered['kv_cache']['host_cache_blocks']} blocks")
    check(tiered["blocks_demoted"] > 0, f"blocks demoted ({tiered['blocks_demoted']})")
    check(tiered["blocks_promoted"] > 0, f"blocks promoted ({tiered['blocks_promoted']})")
    if tiered["kv_cache"]["host_admission"] == "reused":
        check(tiered["blocks_not_admitted"] > 0 and tiered["ghost_hits"] > 0,
              f"--host-admission reused drops blocks never reused "
              f"({tiered['blocks_not_admitted']}) and admits ghosts computed again "
              f"({tiered['ghost_hits']})")
    # An exchange is a promotion and a demotion in one copy.
    exchanged = tiered["exchange_blocks_executed"]
    check(tiered["demote_blocks_executed"] + exchanged == tiered["blocks_demoted"] and
          tiered["promote_blocks_executed"] + exchanged == tiered["blocks_promoted"],
          "the store ran every demotion and promotion the manager counted "
          f"({tiered['demote_blocks_executed']} demote, {tiered['promote_blocks_executed']} "
          f"promote, {exchanged} exchange copies)")
    # A hit whose full-attention chain is on the device may still take windowed groups'
    # windows from the host tier: those count as promotions, not as host-hit tokens.
    window_promotions = sum(g["blocks_promoted"] for g in tiered["kv_cache"]["layer_groups"]
                            if g["kind"] != "full")
    check(tiered["host_hit_tokens"] > 0 or window_promotions > 0,
          f"admissions hit the host tier ({tiered['host_hit_tokens']} tokens of full-attention "
          f"chains, {window_promotions} windowed blocks promoted)")
    covered = tiered["verify"]["mechanisms_covered"] if tiered["verify"] else []
    check("promote" in covered or "exchange" in covered,
          f"verification covers a sequence served from the host tier ({covered})")
    rate, tiered_rate = base["prefix_cache_hit_rate"], tiered["prefix_cache_hit_rate"]
    check(tiered_rate > rate,
          f"prefix-cache hit rate rises with the host tier ({rate:.3f} -> {tiered_rate:.3f})")


def check_concurrency_gain(grouped, as_full, ratio, check):
    """The same workload with layer groups and with every layer treated as full."""
    check(not grouped["kv_cache"]["treat_as_full"] and as_full["kv_cache"]["treat_as_full"],
          "the second run treats every layer as full attention")
    cap = grouped["capacity"]
    print(f"     capacity at {cap['tokens']} tokens: {cap['sequences']} sequences with layer "
          f"groups, {cap['sequences_as_full']} as full; held per sequence {cap['held_bytes']} "
          f"vs {cap['held_bytes_as_full']} bytes (minimum {cap['min_bytes']})")
    print(f"     peak decoding sequences {grouped['peak_decoding_sequences']} vs "
          f"{as_full['peak_decoding_sequences']}; steps {grouped['steps']} vs {as_full['steps']}")
    gain = grouped["mean_decode_batch"] / as_full["mean_decode_batch"]
    check(gain >= ratio,
          f"mean decode batch {grouped['mean_decode_batch']:.2f} with layer groups vs "
          f"{as_full['mean_decode_batch']:.2f} as full: {gain:.2f}x >= {ratio}x")
    check(grouped["peak_decoding_sequences"] > as_full["peak_decoding_sequences"],
          "peak decoding sequences higher with layer groups")


def main(argv):
    full = False
    expect_mismatch = False
    host_cache_mb = None
    concurrency_gain = None
    disaggregated = False
    if argv and argv[0] == "--full":
        full = True
        argv = argv[1:]
    elif argv and argv[0] == "--expect-mismatch":
        expect_mismatch = True
        argv = argv[1:]
    elif len(argv) >= 2 and argv[0] == "--host-cache-rise":
        host_cache_mb = argv[1]
        argv = argv[2:]
    elif len(argv) >= 2 and argv[0] == "--concurrency-gain":
        concurrency_gain = float(argv[1])
        argv = argv[2:]
    elif argv and argv[0] == "--disaggregated":
        disaggregated = True
        argv = argv[1:]
    if not argv:
        print(__doc__)
        return 2
    if expect_mismatch:
        cmd = argv + ["--json"]
        print("running:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.stderr:
            print(proc.stderr, file=sys.stderr)
        return check_mismatch(proc)
    check = Checks()
    summary = run(argv)
    if summary is None:
        return 1
    check_run(summary, check, full)
    if host_cache_mb is not None:
        tiered = run(argv + ["--host-cache-mb", host_cache_mb])
        if tiered is None:
            return 1
        check_run(tiered, check, full)
        check_host_tier(summary, tiered, check)
    if concurrency_gain is not None:
        as_full = run(argv + ["--treat-as-full"])
        if as_full is None:
            return 1
        check_run(as_full, check, full)
        check_concurrency_gain(summary, as_full, concurrency_gain, check)
    if disaggregated:
        single = run(without_disaggregation(argv))
        if single is None:
            return 1
        check_disaggregated(summary, single, check)
    if check.failures:
        print(f"FAIL: {len(check.failures)} check(s) failed")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
