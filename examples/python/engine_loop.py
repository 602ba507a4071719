"""A minimal serving-engine step loop in Python on pagedkv.

A toy model (one attention layer over random embeddings; the next token is the argmax of
the attention output against the embeddings) serves requests that share a system
prompt, through the allocator, KvStorage and the kernels:
  - admission with prefix hits (match_prefix) and prefill (write_kv + paged_extend_attention),
  - batched decode (append_tokens_batch + allocate_slots_batch + paged_decode_attention),
  - preemption under memory pressure (recompute; the victim is re-admitted later and hits
    its own cached blocks),
  - parallel sampling with fork() and copy-on-write,
  - with --host-blocks N, the prefix cache's host tier: cached blocks that eviction takes
    are demoted to host memory and promoted back on a later hit (the step's copies run in
    the documented order: swap-out, demote and exchange, copy-on-write, swap-in and
    promote).
On CPU it uses NumPy and the reference kernels; with --device cuda (or auto, when PyTorch
and a GPU are present) the same loop runs on PyTorch CUDA tensors.

Usage: python examples/python/engine_loop.py [--device auto|cpu|cuda] [--requests N]
       [--num-blocks N] [--host-blocks N] [--max-new-tokens N]
"""

import argparse
import collections
import zlib

import numpy as np

import pagedkv as pk

BLOCK, HEADS, HEAD_DIM, VOCAB = 16, 4, 64, 512
SYSTEM_PROMPT = list(range(40))  # shared by every request: prefix-cache hits


class Backend:
    """Arrays on the chosen device: NumPy on CPU, PyTorch on CUDA."""

    def __init__(self, device):
        self.device = device
        if device == pk.Device.CUDA:
            import torch

            self.torch = torch

    def put(self, array):
        if self.device == pk.Device.CPU:
            return np.ascontiguousarray(array)
        return self.torch.from_numpy(np.ascontiguousarray(array)).cuda()

    def get(self, tensor):
        return tensor if self.device == pk.Device.CPU else tensor.cpu().numpy()

    def zeros(self, shape):
        if self.device == pk.Device.CPU:
            return np.zeros(shape, np.float32)
        return self.torch.zeros(shape, dtype=self.torch.float32, device="cuda")

    def pool(self, dlpack_tensor):
        if self.device == pk.Device.CPU:
            return np.from_dlpack(dlpack_tensor)
        return self.torch.from_dlpack(dlpack_tensor)


class ToyModel:
    """One attention layer: q, k, v are fixed projections of a token's embedding."""

    def __init__(self, rng):
        self.embed = rng.standard_normal((VOCAB, HEADS * HEAD_DIM)).astype(np.float32)
        self.wq, self.wk, self.wv = (
            rng.standard_normal((HEADS * HEAD_DIM, HEADS * HEAD_DIM)).astype(np.float32) * 0.05
            for _ in range(3))

    def qkv(self, tokens):
        x = self.embed[np.asarray(tokens)]
        shape = (len(tokens), HEADS, HEAD_DIM)
        return ((x @ self.wq).reshape(shape), (x @ self.wk).reshape(shape),
                (x @ self.wv).reshape(shape))

    def next_tokens(self, attention_out):
        return (attention_out.reshape(len(attention_out), -1) @ self.embed.T).argmax(axis=1)


class Preempted:
    """Preemption hooks: the engine moves victims back to its waiting queue."""

    def __init__(self):
        self.victims = []

    def on_preempt(self, victim, mode):
        self.victims.append(victim)


class Engine:
    def __init__(self, device, num_blocks, host_blocks, max_new_tokens):
        self.xp = Backend(device)
        self.model = ToyModel(np.random.default_rng(0))
        self.hooks = Preempted()
        self.manager = pk.KvCacheManager(layer_groups=pk.full_attention(num_blocks, host_blocks),
                                         block_size=BLOCK, enable_host_cache=host_blocks > 0,
                                         preemption_hooks=self.hooks)
        spec = pk.KvCacheSpec(num_layers=1, num_kv_heads=HEADS, head_dim=HEAD_DIM,
                              dtype=pk.DType.FLOAT32, block_size=BLOCK)
        self.storage = pk.KvStorage(spec, num_blocks, device=device,
                                    num_host_blocks=host_blocks)
        self.k_cache = self.xp.pool(self.storage.k_cache(0))
        self.v_cache = self.xp.pool(self.storage.v_cache(0))
        self.max_new_tokens = max_new_tokens
        self.waiting: collections.deque[int] = collections.deque()  # admission order
        self.running: list[int] = []
        self.samples: dict[int, int] = {}  # request id -> extra samples to fork after prefill
        self.generated: collections.Counter[int] = collections.Counter()
        self.finished: dict[int, np.ndarray] = {}

    def submit(self, seq, prompt, num_samples=1):
        self.manager.add_sequence(seq, prompt)
        self.waiting.append(seq)
        if num_samples > 1:
            self.samples[seq] = num_samples - 1

    # --- one step ---------------------------------------------------------------------------

    def step(self):
        decode = self.schedule_decode()
        prefill = self.admit()
        self.run_copies()
        if prefill:
            self.run_prefill(prefill)
        if decode:
            self.run_decode(decode)
        self.fork_samples(prefill)
        self.finish()

    def schedule_decode(self):
        """Reserves one slot per running sequence (its last sampled token), preempting the
        newest sequences when blocks run out."""
        if not self.running:
            return []
        seqs = np.array(self.running, np.int64)
        self.hooks.victims.clear()
        batch = self.manager.allocate_slots_batch(seqs, 1, preempt=True)
        scheduled = [(int(s), int(slot)) for s, slot, code in
                     zip(seqs, batch.slots, batch.status) if code == pk.StatusCode.OK]
        for seq, code in zip(seqs.tolist(), batch.status.tolist()):
            if code == pk.StatusCode.RESOURCE_EXHAUSTED:  # nobody left to preempt: itself
                self.manager.preempt(seq, pk.PreemptionMode.RECOMPUTE)
        self.requeue_victims()
        return scheduled

    def admit(self):
        """Admits waiting sequences while blocks last: match the cached prefix, reserve
        the rest. Returns (seq, first new position, slots) of each admitted sequence."""
        admitted = []
        while self.waiting:
            seq = self.waiting[0]
            view = self.manager.sequence(seq)
            # A sequence that matched before but found no room keeps its claimed prefix.
            cached = (view.num_computed_tokens if len(view.block_table)
                      else self.manager.match_prefix(seq))
            num_new = len(view.tokens) - cached
            try:
                slots = self.manager.allocate_slots(seq, num_new)
            except pk.ResourceExhausted:
                break  # retried next step, after running sequences finish
            self.waiting.popleft()
            self.running.append(seq)
            admitted.append((seq, cached, slots))
        return admitted

    def requeue_victims(self):
        for victim in self.hooks.victims:
            if victim in self.running:
                self.running.remove(victim)
                self.waiting.appendleft(victim)
        self.hooks.victims.clear()

    def run_copies(self):
        """The step's copies, before its K/V writes: those that read device blocks the step
        refills first, then those that write device blocks."""
        self.storage.run_step_ops(self.manager.take_step_ops())

    def run_prefill(self, admitted):
        tokens, indptr, slots = [], [0], []
        for seq, cached, seq_slots in admitted:
            tokens.extend(self.manager.sequence(seq).tokens[cached:].tolist())
            indptr.append(len(tokens))
            slots.append(seq_slots)
        q, k, v = self.model.qkv(tokens)
        xp = self.xp
        pk.write_kv(xp.put(k), xp.put(v), xp.put(np.concatenate(slots)), self.k_cache,
                    self.v_cache)
        tables = self.manager.build_block_tables([seq for seq, _, _ in admitted])
        out = xp.zeros(q.shape)
        pk.paged_extend_attention(xp.put(q), self.k_cache, self.v_cache,
                                  xp.put(tables.block_table), xp.put(tables.context_lens),
                                  xp.put(np.array(indptr, np.int32)), out,
                                  max_query_len=int(max(np.diff(indptr))))
        last_rows = xp.get(out)[np.array(indptr[1:]) - 1]
        self.sample([seq for seq, _, _ in admitted], last_rows)

    def run_decode(self, scheduled):
        seqs = [seq for seq, _ in scheduled]
        last = [int(self.manager.sequence(seq).tokens[-1]) for seq in seqs]
        q, k, v = self.model.qkv(last)
        xp = self.xp
        pk.write_kv(xp.put(k), xp.put(v), xp.put(np.array([s for _, s in scheduled], np.int64)),
                    self.k_cache, self.v_cache)
        tables = self.manager.build_block_tables(seqs)
        out = xp.zeros(q.shape)
        pk.paged_decode_attention(xp.put(q), self.k_cache, self.v_cache,
                                  xp.put(tables.block_table), xp.put(tables.context_lens), out,
                                  max_context_len=int(tables.context_lens.max()))
        self.sample(seqs, xp.get(out))

    def sample(self, seqs, attention_out):
        """Appends each sequence's next token: it is computed (reserved) next step."""
        tokens = self.model.next_tokens(attention_out).astype(np.int32)
        result = self.manager.append_tokens_batch(np.array(seqs, np.int64), tokens)
        assert result.ok, result.errors
        for seq in seqs:
            self.generated[seq] += 1

    def fork_samples(self, admitted):
        """Parallel sampling: children share the parent's blocks (copy-on-write)."""
        for seq, _, _ in admitted:
            for i in range(self.samples.pop(seq, 0)):
                child = seq * 100 + i + 1
                self.manager.fork(seq, child)
                self.generated[child] = self.generated[seq]
                self.running.append(child)

    def finish(self):
        for seq in list(self.running):
            if self.generated[seq] >= self.max_new_tokens:
                self.finished[seq] = self.manager.sequence(seq).tokens[-self.max_new_tokens:]
                self.manager.free(seq)  # blocks stay cached for later prefix hits
                self.running.remove(seq)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--num-blocks", type=int, default=40,
                        help="device blocks; small enough to force preemption")
    parser.add_argument("--host-blocks", type=int, default=0,
                        help="host blocks of the prefix cache's host tier (0: no host tier)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    device = pk.Device.CPU
    if args.device == "cuda" or (args.device == "auto" and pk.cuda_device_available()):
        try:
            import torch  # noqa: F401
        except ImportError:
            if args.device == "cuda":
                raise SystemExit("--device cuda needs PyTorch")
        else:
            device = pk.Device.CUDA
    engine = Engine(device, args.num_blocks, args.host_blocks, args.max_new_tokens)
    rng = np.random.default_rng(1)
    for r in range(args.requests):
        question = rng.integers(100, VOCAB, size=int(rng.integers(5, 40))).tolist()
        engine.submit(r + 1, SYSTEM_PROMPT + question, num_samples=2 if r % 4 == 0 else 1)
    steps = 0
    while engine.waiting or engine.running:
        engine.step()
        engine.manager.check_invariants()
        steps += 1
        if steps > 10_000:
            raise SystemExit("no progress")
    s = engine.manager.stats()
    print(f"{device.name}: {len(engine.finished)} sequences finished in {steps} steps")
    print(f"prefix cache: {s.prefix_hit_tokens} of {s.prefix_query_tokens} prompt tokens hit")
    print(f"preemptions (recompute): {s.preemptions_recompute}, copy-on-write copies: "
          f"{s.cow_copies}, evictions: {s.evictions}")
    if args.host_blocks > 0:
        print(f"host tier: {s.host_hit_tokens} of the hit tokens, {s.blocks_demoted} blocks "
              f"demoted, {s.blocks_promoted} promoted")
    # The same requests give the same tokens with or without the host tier: its copies
    # bring back exactly the K/V that eviction took.
    outputs = b"".join(engine.finished[seq].astype(np.int32).tobytes()
                       for seq in sorted(engine.finished))
    print(f"generated tokens crc32: {zlib.crc32(outputs):08x}")
    first = min(engine.finished)
    print(f"sequence {first} generated {engine.finished[first].tolist()}")


if __name__ == "__main__":
    main()
