#!/usr/bin/env python3
"""Which allocations make the peak of Megatron's unfused core attention on a GPU.

The builtin engine's unfused attention (engine/model.cc, CoreAttention and ScaleMaskSoftmax),
written again in PyTorch op for op: GQA's repeat_interleave, baddbmm into a persistent score
buffer (beta 0), the optional fp32 upcast, masked_fill_ with the causal mask, softmax, the cast
back, bmm with v, the output's permute. One forward and backward per configuration under the
CUDA caching allocator's history (torch.cuda.memory._record_memory_history), then the trace is
replayed to find the highest allocated moment and every block live at it, with the op that
allocated it (the innermost ATen frame of its C++ stack) and its size in score tensors.

    attention_snapshot.py [--seqs 1024,2048] [--heads 16] [--groups 4] [--head-dim 16]

Prints, per configuration: allocated bytes before the forward, the peak above it, and the live
set at the peak. The memory model's ScoreChain (search/layer_activations.cc) can be read against
it term by term. Needs torch with CUDA; standard library otherwise.
"""
import argparse
import collections

import torch

MIB = float(1 << 20)


def attention(q, k, v, buf, mask, scale, fp32):
    s, b, n, d = q.shape
    g = k.shape[2]
    if n // g > 1:
        k = k.repeat_interleave(n // g, 2)
        v = v.repeat_interleave(n // g, 2)
    q2 = q.reshape(s, b * n, -1)
    k2 = k.view(s, b * n, -1)
    scores = torch.baddbmm(buf, q2.transpose(0, 1), k2.transpose(0, 1).transpose(1, 2),
                           beta=0.0, alpha=scale)
    x = scores.view(b, n, s, s)
    half = x.dtype != torch.float32
    if half and fp32:
        x = x.to(torch.float32)
    x.masked_fill_(mask, -10000.0)
    probs = torch.softmax(x, -1)
    if half and fp32:
        probs = probs.to(scores.dtype)
    v2 = v.view(s, b * n, -1)
    ctx = torch.bmm(probs.view(b * n, s, s), v2.transpose(0, 1))
    ctx = ctx.view(b, n, s, -1).permute(2, 0, 1, 3).contiguous()
    return ctx.view(s, b, -1)


def op_of(frames):
    """The innermost frame that names an ATen op or a torch/autograd function."""
    for f in frames:
        name = f.get("name", "")
        if "at::native::" in name or "at::_ops::" in name or "Backward" in name:
            return name.split("(")[0][-90:]
    for f in frames:
        if f.get("filename", "").endswith(".py"):
            return "%s:%d" % (f["filename"].split("/")[-1], f["line"])
    return frames[0].get("name", "?")[-90:] if frames else "?"


def replay(trace):
    """The largest allocated total of the trace, the blocks live at that moment, and those still
    live at its end (what persists)."""
    live = {}
    total = best = 0
    best_set = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > best:
                best, best_set = total, dict(live)
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    return best, best_set, live


def run(seq, heads, groups, dim, fp32, dev):
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(seq, 1, heads, dim, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(seq, 1, groups, dim, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(seq, 1, groups, dim, device=dev, dtype=dt, requires_grad=True)
    mask = torch.triu(torch.ones(seq, seq, device=dev, dtype=torch.bool), 1).view(1, 1, seq, seq)
    buf = torch.empty(heads, seq, seq, device=dev, dtype=dt)
    grad = torch.randn(seq, 1, heads * dim, device=dev, dtype=dt)
    scale = dim ** -0.5
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(None)
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="all")
    start = torch.cuda.memory_allocated()
    peaks = []
    for _ in range(2):  # the first pass also allocates what persists (cuBLAS workspaces)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = attention(q, k, v, buf, mask, scale, fp32)
        out.backward(grad)
        del out
        q.grad = k.grad = v.grad = None
        torch.cuda.synchronize()
        peaks.append((base, torch.cuda.max_memory_allocated() - base))
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    base, peak = peaks[1]
    score = heads * seq * seq
    print("seq %d softmax %s: peak above the allocated bytes at its start: first pass %.2f MiB, "
          "second %.2f MiB; held after the first pass %.2f MiB (fp32 score tensor %.2f MiB)" % (
              seq, "fp32" if fp32 else "bf16", peaks[0][1] / MIB, peak / MIB,
              (base - start) / MIB, 4 * score / MIB))
    best, blocks, persistent = replay(snap["device_traces"][torch.device(dev).index or 0])
    for e in persistent.values():
        print("  held after both passes: %.2f MiB  %s" % (e["size"] / MIB,
                                                        op_of(e.get("frames", []))))
    print("  trace's peak (blocks allocated during the pass) %.2f MiB; live at it:" % (best / MIB))
    by_op = collections.defaultdict(list)
    for e in blocks.values():
        by_op[op_of(e.get("frames", []))].append(e["size"])
    for op, sizes in sorted(by_op.items(), key=lambda kv: -sum(kv[1])):
        print("    %9.2f MiB  %2d block(s)  %5.2f fp32 scores  %s" % (
            sum(sizes) / MIB, len(sizes), sum(sizes) / (4.0 * score), op))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", default="1024,2048")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=16)
    a = ap.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    for seq in [int(s) for s in a.seqs.split(",")]:
        for fp32 in (True, False):
            run(seq, a.heads, a.groups, a.head_dim, fp32, "cuda")


if __name__ == "__main__":
    main()
