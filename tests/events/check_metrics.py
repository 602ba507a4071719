#!/usr/bin/env python3
"""Runs the decode loop with --metrics-port, fetches /metrics with curl while it runs and
after its summary, parses the text with prometheus_client's parser (it rejects text that
is not valid exposition format), and checks the final values against the run's JSON
summary.
usage: check_metrics.py PAGEDKV_DECODE [decode loop options...]
"""

import json
import re
import shutil
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

DECODE, OPTIONS = sys.argv[1], sys.argv[2:]
PREFIX = "pagedkv:"


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def scrape(url):
    """Returns {sample name with its non-model labels: value}."""
    out = subprocess.run(["curl", "--silent", "--show-error", "--fail", "--max-time", "10", url],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        fail(f"curl {url}: {out.stderr.strip()}")
    samples = {}
    for family in text_string_to_metric_families(out.stdout):
        for s in family.samples:
            if not s.name.startswith(PREFIX):
                continue  # prometheus-cpp's own exposer_* metrics
            if s.labels.get("model_name") != "pagedkv-decode":
                fail(f"{s.name}: model_name label {s.labels.get('model_name')!r}")
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                              if k != "model_name")
            samples[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    if not samples:
        fail("no samples")
    return samples


def read_json(stream):
    """Reads lines until they form one JSON document (the process keeps stdout open)."""
    text = ""
    for _ in range(10000):
        line = stream.readline()
        if not line:
            break
        text += line
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            continue
    fail(f"no JSON summary on stdout: {text[:200]!r}")


if shutil.which("curl") is None:
    print("SKIPPED: curl is not installed (scripts/install-deps.sh installs it)")
    sys.exit(77)
proc = subprocess.Popen([DECODE, *OPTIONS, "--json", "--metrics-port", "0",
                         "--hold-s", "60"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
try:
    match = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", proc.stderr.readline())
    if not match:
        fail("no metrics URL on stderr")
    url = match.group(1)
    during = scrape(url)
    summary = read_json(proc.stdout)
    final = scrape(url)
finally:
    proc.kill()
    proc.wait(timeout=30)

expected = {
    "prefix_cache_queries_total": summary["allocator_prefix_query_tokens"],
    "prefix_cache_hits_total": summary["allocator_prefix_hit_tokens"],
    "num_preemptions_total{mode=recompute}": summary["preemptions_recompute"],
    "num_preemptions_total{mode=swap}": summary["preemptions_swap"],
    "num_evictions_total": summary["evictions"],
    "num_cow_copies_total": summary["cow_copies"],
    "num_blocks_swapped_out_total": summary["blocks_swapped_out"],
    "num_blocks_swapped_in_total": summary["blocks_swapped_in"],
}
for name, want in expected.items():
    got = final.get(PREFIX + name)
    if got != want:
        fail(f"{PREFIX}{name} = {got}, the summary says {want}")
    if during.get(PREFIX + name, 0) > got:
        fail(f"{PREFIX}{name} went back from {during[PREFIX + name]} to {got}")
usage = final[PREFIX + "kv_cache_usage_perc"]
if not 0 <= usage <= 1:
    fail(f"kv_cache_usage_perc {usage} outside [0, 1]")
if final[PREFIX + "prefix_cache_queries_total"] <= 0:
    fail("the run looked nothing up in the prefix cache")
print(f"PASS: {len(final)} samples; final values match the summary: "
      + ", ".join(f"{k}={final[PREFIX + k]:g}" for k in expected))
