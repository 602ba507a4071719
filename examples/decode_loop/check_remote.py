#!/usr/bin/env python3
"""CTest checker for pagedkv-decode's remote tier (--remote): engines sharing one store.

usage: check_remote.py SCENARIO STORE BINARY [ARGS...]
  STORE     dir (a temporary directory), redis (a redis-server started here on a free
            loopback port) or cluster (three Redis Cluster masters, redis-cli --cluster
            create); the Redis ones are skipped, exit 77, without redis-server or redis-cli
  SCENARIO  share     engine 1 (--request-seed 1) fills the store; engine 2 (--request-seed
                      2, same system prompts) runs with and without it: with it, its hit
                      rate (device hits and remote loads over the tokens looked up) must be
                      at least twice the rate without, a verified sequence must have
                      loaded remote blocks, and the longest time a step spent in the tier's
                      calls must stay under --remote-timeout-ms + 10 ms. Then engine 3
                      (--fault corrupt-remote: every fetched value has a payload byte
                      flipped) must count corrupt blocks, load none and still verify.
            corrupt   (redis) engine 1 fills the store, then a payload byte of every value
                      is flipped in Redis itself (SETRANGE); engine 2 must count corrupt
                      blocks (and load only what it wrote itself since) and verify.
            kill      (redis) engine 2 runs paced while the server is killed (-9) and
                      restarted on the same port; it must finish and verify, its store must
                      count errors and a reconnect, and no step may wait on the network.
            stall     (redis) the same while the server sleeps 2 s (DEBUG SLEEP).
            reshard   (cluster) engine 1's blocks land on all three masters; engine 2 runs
                      paced while 2,000 slots move from the first master to the second
                      (redis-cli --cluster reshard): no error surfaces, redirects are
                      followed, blocks load and verify.
            maxmemory (redis) a server of 2 MiB with allkeys-lru: engine 1 writes more than
                      it holds; engine 2 must find some blocks, miss others, and verify.
Every run must exit 0 with verification passed and every request completed.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

TIMEOUT_MS = 50  # --remote-timeout-ms of every run
# What a step may spend in the tier's calls beyond it: wall-clock time, which a loaded CI
# machine stretches (10 ms failed once with every core busy); a stall waited out would show
# the server's 2 s sleep or a 0.5 s restart, far above.
SLACK_MS = 50
SERVERS = []     # every redis-server started: killed at the end, whatever failed


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def redis_missing():
    """True, with the SKIPPED line printed, when redis-server or redis-cli is not installed."""
    if shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None:
        return False
    print("SKIPPED: redis-server or redis-cli not installed "
          "(scripts/install-deps.sh installs them)")
    return True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server on loopback, without persistence, in its own directory."""

    def __init__(self, work, *options):
        self.port = free_port()
        self.work = work
        os.makedirs(work, exist_ok=True)
        self.options = options
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.work, "--enable-debug-command", "yes",
             *self.options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        SERVERS.append(self.proc)
        for _ in range(500):
            if self.cli("PING", check=False) == "PONG":
                return
            time.sleep(0.01)
        fail("redis-server did not answer PING")

    def cli(self, *args, check=True):
        proc = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True)
        if check and proc.returncode != 0:
            fail(f"redis-cli {args}: {proc.stderr}")
        # Values are binary: undecodable bytes stay distinct characters.
        return proc.stdout.decode("utf-8", "surrogateescape").strip()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class Cluster:
    """Three Redis Cluster masters on loopback (redis-cli --cluster create), each in its own
    directory with its own nodes file."""

    def __init__(self, work):
        # The bus port too: port + 10000 (the default) may be taken or past 65535.
        self.nodes = [Redis(f"{work}/node{i}", "--cluster-enabled", "yes", "--cluster-port",
                            str(free_port()), "--cluster-config-file",
                            f"{work}/node{i}/nodes.conf", "--cluster-node-timeout", "5000")
                      for i in range(3)]
        self.port = self.nodes[0].port
        self.nodes[0].cli("--cluster", "create",
                          *[f"127.0.0.1:{n.port}" for n in self.nodes],
                          "--cluster-replicas", "0", "--cluster-yes")
        for node in self.nodes:
            for _ in range(1000):
                if "cluster_state:ok" in node.cli("CLUSTER", "INFO"):
                    break
                time.sleep(0.01)
            else:
                fail("the cluster did not reach cluster_state:ok")

    def node_id(self, node):
        return node.cli("CLUSTER", "MYID")

    def keys_per_node(self):
        return [int(n.cli("DBSIZE")) for n in self.nodes]

    def reshard(self, slots):
        """Moves `slots` slots from the first master to the second (MOVED/ASK meanwhile)."""
        self.nodes[0].cli("--cluster", "reshard", f"127.0.0.1:{self.port}",
                          "--cluster-from", self.node_id(self.nodes[0]),
                          "--cluster-to", self.node_id(self.nodes[1]),
                          "--cluster-slots", str(slots), "--cluster-yes")


def run_engine(binary, args, seed, remote, *extra, background=False):
    command = [binary, *args, "--json", "--request-seed", str(seed), "--remote-timeout-ms",
               str(TIMEOUT_MS), *extra]
    if remote:
        command += ["--remote", remote]
    print("+", " ".join(command), flush=True)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc if background else finish(proc)


def finish(proc):
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        print(err)
        fail(f"exit {proc.returncode}")
    summary = json.loads(out)
    verify = summary["verify"]
    if verify is None or not verify["passed"]:
        fail(f"verification did not pass: {verify}")
    if summary["requests_completed"] != summary["requests"]:
        fail("not every request completed")
    return summary


def hit_rate(summary):
    hits = summary["prefix_hit_tokens"] + summary["remote_tokens"]
    return hits / max(1, summary["prefix_query_tokens"])


def describe(name, s):
    r = s["remote"] or {}
    print(f"{name}: hit rate {hit_rate(s):.3f} (device {s['prefix_hit_tokens']}, remote "
          f"{s['remote_tokens']} of {s['prefix_query_tokens']} tokens); remote "
          f"{ {k: r.get(k) for k in ('found_blocks', 'missing_blocks', 'corrupt_blocks', 'error_blocks', 'timed_out', 'loaded_blocks', 'written_blocks', 'write_failures', 'store_errors', 'store_reconnects', 'store_redirects')} }; "
          f"max step {s['max_step_ms']:.1f} ms, in the tier {s['max_remote_ms_per_step']:.2f} ms; "
          f"verified {s['verify']['mechanisms_covered']}")


def check_no_network_wait(name, s):
    if s["max_remote_ms_per_step"] > TIMEOUT_MS + SLACK_MS:
        fail(f"{name}: a step spent {s['max_remote_ms_per_step']:.1f} ms in the remote tier's "
             f"calls, over {TIMEOUT_MS} + {SLACK_MS} ms")


def share(binary, args, remote):
    first = run_engine(binary, args, 1, remote)
    describe("engine 1", first)
    if first["remote"]["written_blocks"] == 0:
        fail("engine 1 wrote nothing to the store")
    alone = run_engine(binary, args, 2, None)
    shared = run_engine(binary, args, 2, remote)
    describe("engine 2 alone", alone)
    describe("engine 2 shared", shared)
    check_no_network_wait("engine 2", shared)
    if hit_rate(shared) < 2 * hit_rate(alone):
        fail(f"hit rate with the shared tier {hit_rate(shared):.3f} is not 2x "
             f"{hit_rate(alone):.3f} without")
    if "remote" not in shared["verify"]["mechanisms_covered"]:
        fail("no verified sequence loaded remote blocks")
    corrupt = run_engine(binary, args, 3, remote, "--fault", "corrupt-remote")
    describe("engine 3, corrupt reads", corrupt)
    r = corrupt["remote"]
    if r["corrupt_blocks"] == 0 or r["loaded_blocks"] != 0 or r["found_blocks"] != 0:
        fail("corrupt values were not all rejected")


def flip_every_value(redis):
    keys = redis.cli("--scan", "--pattern", "pagedkv:*").split()
    for key in keys:
        length = int(redis.cli("STRLEN", key))
        last = redis.cli("GETRANGE", key, str(length - 1), str(length - 1))
        # redis-cli prints a non-printable byte escaped; set a byte that differs.
        redis.cli("SETRANGE", key, str(length - 1), "A" if last != "A" else "B")
    return len(keys)


def paced(binary, args, remote, during, step_ms=10):
    """Runs engine 2 slowly (step_ms a step, 4 sequences at a time: lookups go out all
    along, for seconds) and calls during() 0.5 s into it."""
    proc = run_engine(binary, args, 2, remote, "--min-step-ms", str(step_ms), "--max-running",
                      "4", background=True)
    time.sleep(0.5)
    if proc.poll() is not None:
        fail("engine 2 finished before the fault: make the run longer")
    during()
    return finish(proc)


def main():
    scenario, store, binary, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    work = tempfile.mkdtemp(prefix="pagedkv-remote-")
    redis = None
    try:
        if store == "dir":
            remote = f"dir:{work}/store"
        elif redis_missing():
            return 77
        elif store == "cluster":
            redis = Cluster(work)
            remote = f"redis://127.0.0.1:{redis.port}"
        else:
            options = ["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"] \
                if scenario == "maxmemory" else []
            redis = Redis(work, *options)
            remote = f"redis://127.0.0.1:{redis.port}"
        if scenario == "share":
            share(binary, args, remote)
        elif scenario == "reshard":
            describe("engine 1", run_engine(binary, args, 1, remote))
            spread = redis.keys_per_node()
            print(f"keys per master: {spread}")
            if min(spread) == 0:
                fail("some master holds no block")
            # 40 ms steps: engine 2 still looks blocks up and writes them for seconds after
            # the 2,000 slots have moved (on an idle machine the reshard outlasted a 10 ms
            # run, and no lookup met a moved slot).
            s = paced(binary, args, remote, lambda: redis.reshard(2000), step_ms=40)
            describe("engine 2", s)
            print(f"keys per master after resharding: {redis.keys_per_node()}")
            r = s["remote"]
            if r["loaded_blocks"] == 0 or r["error_blocks"] or r["store_errors"] or \
                    r["write_failures"]:
                fail("the reshard surfaced errors, or nothing was loaded")
            if r["store_redirects"] == 0:
                fail("no MOVED or ASK was followed during the reshard")
        elif scenario == "corrupt":
            describe("engine 1", run_engine(binary, args, 1, remote))
            print(f"flipped a payload byte of {flip_every_value(redis)} values")
            s = run_engine(binary, args, 2, remote)
            describe("engine 2", s)
            # It may load blocks it wrote itself since.
            if s["remote"]["corrupt_blocks"] == 0:
                fail("no corrupt value was fetched")
        elif scenario == "kill":
            describe("engine 1", run_engine(binary, args, 1, remote))

            def kill_and_restart():
                redis.kill()
                time.sleep(0.5)
                redis.start()
            s = paced(binary, args, remote, kill_and_restart)
            describe("engine 2", s)
            check_no_network_wait("engine 2", s)
            if s["remote"]["store_errors"] == 0 or s["remote"]["store_reconnects"] == 0:
                fail("the store counted no error or no reconnect")
        elif scenario == "stall":
            describe("engine 1", run_engine(binary, args, 1, remote))
            sleeper = threading.Thread(target=redis.cli, args=("DEBUG", "SLEEP", "2"))
            s = paced(binary, args, remote, sleeper.start)
            sleeper.join()
            describe("engine 2", s)
            check_no_network_wait("engine 2", s)
            if s["remote"]["timed_out"] == 0 and s["remote"]["error_blocks"] == 0:
                fail("no lookup timed out or failed while the server slept")
        elif scenario == "maxmemory":
            first = run_engine(binary, args, 1, remote)
            describe("engine 1", first)
            s = run_engine(binary, args, 2, remote)
            describe("engine 2", s)
            info = redis.cli("INFO", "stats")
            evicted = int(next(l.split(":")[1] for l in info.splitlines()
                               if l.startswith("evicted_keys:")))
            print(f"redis evicted {evicted} keys")
            if evicted == 0:
                fail("the server evicted nothing: make the run write more")
            if s["remote"]["found_blocks"] == 0 or s["remote"]["missing_blocks"] == 0:
                fail("expected some blocks found and some evicted")
        else:
            fail(f"unknown scenario {scenario}")
    finally:
        for server in SERVERS:
            if server.poll() is None:
                server.kill()
                server.wait()
        shutil.rmtree(work, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
