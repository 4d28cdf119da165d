"""The trial engine's model written again in eager PyTorch, for bench/engine/run_gpu_bench.sh.

Same GPT decoder as engine/model.cc (Megatron Core's local layer spec, fusions off), same
parameter layout and initialisation order (so, with the same seed, the same weights and tokens),
same flat buffers (bf16 weights, fp32 main gradients, fp32 master weights and Adam moments), and
recompute at the same boundaries: torch.utils.checkpoint (reentrant, as Megatron's
CheckpointFunction) for core_attn, mlp, moe, shared_experts and full recompute, and an
output-discarding checkpoint (Megatron's CheckpointWithoutOutput) for layernorm, mla_up_proj and
moe_act. One difference: this twin refills a discarded output by copying the replayed value into
it (then frees the replay's copy); the engine shares the replayed storage without a copy.

Usage: python3 twin.py --spec SPEC.json --policies 'P1;P2' [--device cuda]
prints one JSON line per policy (the keys of remat-bench-engine's lines).
"""

import argparse
import gc
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from twin_ops import (  # the building blocks, beside this script
    NORM_EPS, CrossEntropyFn, GroupedGemmFn, OutputDiscardingCheckpoint, RmsNormFn, checkpoint,
    dropout, parse_policy)


class Gpt:
    def __init__(self, spec, policy, device, dtype):
        self.m = m = spec["model"]
        self.policy = policy
        self.device = device
        self.dtype = dtype
        self.heads = m["num_attention_heads"]
        self.groups = m.get("num_query_groups") or self.heads
        self.hidden = m["hidden_size"]
        self.kv = m.get("kv_channels") or self.hidden // self.heads
        self.seq = m["seq_length"]
        self.ffn = m.get("ffn_hidden_size") or 4 * self.hidden
        self.vocab_padded = (m["vocab_size"] + 127) // 128 * 128
        self.params = []  # (name, shape, init_std, init_value)
        self.index = {}
        self.score_buffer = None
        self.causal_mask = None
        self.declare()

    def add(self, name, shape, std, value=0.0):
        self.index[name] = len(self.params)
        self.params.append((name, list(shape), std, value))

    def add_norm(self, name, size):
        self.add(name + ".weight", [size], 0, 1.0)
        if self.m["normalization"] == "LayerNorm":
            self.add(name + ".bias", [size], 0, 0.0)

    def is_moe_layer(self, i):
        m = self.m
        if not m.get("num_moe_experts"):
            return False
        freq = m.get("moe_layer_freq", 1)
        if isinstance(freq, list):
            return freq[i] == 1
        return i % freq == 0

    def declare(self):
        m = self.m
        std = 0.02
        out_std = std / math.sqrt(2.0 * m["num_layers"])
        bias = m["add_bias_linear"]
        glu = 2 if m["gated_linear_unit"] else 1
        h = self.hidden
        self.add("embedding.word_embeddings.weight", [self.vocab_padded, h], std)
        if m["position_embedding_type"] == "learned_absolute":
            self.add("embedding.position_embeddings.weight", [self.seq, h], std)
        for i in range(m["num_layers"]):
            pre = f"decoder.layers.{i}."
            self.add_norm(pre + "input_layernorm", h)
            if m.get("multi_latent_attention"):
                qk = m["qk_head_dim"] + m["qk_pos_emb_head_dim"]
                if m.get("q_lora_rank"):
                    self.add(pre + "self_attention.linear_q_down_proj.weight", [m["q_lora_rank"], h], std)
                    self.add_norm(pre + "self_attention.q_layernorm", m["q_lora_rank"])
                    self.add(pre + "self_attention.linear_q_up_proj.weight", [self.heads * qk, m["q_lora_rank"]], std)
                else:
                    self.add(pre + "self_attention.linear_q_proj.weight", [self.heads * qk, h], std)
                self.add(pre + "self_attention.linear_kv_down_proj.weight",
                         [m["kv_lora_rank"] + m["qk_pos_emb_head_dim"], h], std)
                self.add_norm(pre + "self_attention.kv_layernorm", m["kv_lora_rank"])
                self.add(pre + "self_attention.linear_kv_up_proj.weight",
                         [self.heads * (m["qk_head_dim"] + m["v_head_dim"]), m["kv_lora_rank"]], std)
                self.add(pre + "self_attention.linear_proj.weight", [h, self.heads * m["v_head_dim"]], out_std)
            else:
                rows = (self.heads + 2 * self.groups) * self.kv
                self.add(pre + "self_attention.linear_qkv.weight", [rows, h], std)
                if bias:
                    self.add(pre + "self_attention.linear_qkv.bias", [rows], 0)
                self.add(pre + "self_attention.linear_proj.weight", [h, self.heads * self.kv], out_std)
            if bias:
                self.add(pre + "self_attention.linear_proj.bias", [h], 0)
            self.add_norm(pre + "pre_mlp_layernorm", h)
            if not self.is_moe_layer(i):
                self.add(pre + "mlp.linear_fc1.weight", [glu * self.ffn, h], std)
                if bias:
                    self.add(pre + "mlp.linear_fc1.bias", [glu * self.ffn], 0)
                self.add(pre + "mlp.linear_fc2.weight", [h, self.ffn], out_std)
                if bias:
                    self.add(pre + "mlp.linear_fc2.bias", [h], 0)
            else:
                e = m["num_moe_experts"]
                f = m.get("moe_ffn_hidden_size") or self.ffn
                self.add(pre + "mlp.router.weight", [e, h], std)
                if m["moe_grouped_gemm"]:
                    self.add(pre + "mlp.experts.weight1", [h, e * glu * f], std)
                    self.add(pre + "mlp.experts.weight2", [e * f, h], out_std)
                else:
                    for x in range(e):
                        ep = pre + f"mlp.experts.local_experts.{x}."
                        self.add(ep + "linear_fc1.weight", [glu * f, h], std)
                        self.add(ep + "linear_fc2.weight", [h, f], out_std)
                        if bias:
                            self.add(ep + "linear_fc1.bias", [glu * f], 0)
                            self.add(ep + "linear_fc2.bias", [h], 0)
                fs = m.get("moe_shared_expert_intermediate_size")
                if fs:
                    self.add(pre + "mlp.shared_experts.linear_fc1.weight", [glu * fs, h], std)
                    if bias:
                        self.add(pre + "mlp.shared_experts.linear_fc1.bias", [glu * fs], 0)
                    self.add(pre + "mlp.shared_experts.linear_fc2.weight", [h, fs], out_std)
                    if bias:
                        self.add(pre + "mlp.shared_experts.linear_fc2.bias", [h], 0)
        self.add_norm("decoder.final_layernorm", h)
        if not m.get("share_embeddings_and_output_weights", False):
            self.add("output_layer.weight", [self.vocab_padded, h], std)

    def P(self, name):
        return self.values[self.index[name]]

    def PO(self, name):
        i = self.index.get(name)
        return None if i is None else self.values[i]

    # ---- building blocks

    def norm(self, x, name):
        if self.m["normalization"] == "RMSNorm":
            return RmsNormFn.apply(x, self.P(name + ".weight"), NORM_EPS)
        return F.layer_norm(x, (x.size(-1),), self.P(name + ".weight"), self.P(name + ".bias"), NORM_EPS)

    @staticmethod
    def rope(t, freqs):
        rot = freqs.size(-1)
        x, passthrough = t[..., :rot], t[..., rot:]
        cos = torch.cos(freqs).to(t.dtype)
        sin = torch.sin(freqs).to(t.dtype)
        x1, x2 = torch.chunk(x, 2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
        return torch.cat((x * cos + rotated * sin, passthrough), dim=-1)

    def rope_freqs(self, dim):
        inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=self.device) / dim))
        pos = torch.arange(self.seq, dtype=torch.float32, device=self.device)
        freqs = torch.outer(pos, inv)
        return torch.cat((freqs, freqs), dim=-1).view(self.seq, 1, 1, dim)

    def scale_mask_softmax(self, scores):
        half = scores.dtype != torch.float32
        fp32 = half and self.m["attention_softmax_in_fp32"]
        x = scores.float() if fp32 else scores
        x.masked_fill_(self.causal_mask, -10000.0)
        probs = torch.softmax(x, dim=-1)
        return probs.to(scores.dtype) if fp32 else probs

    def core_attention(self, q, k, v, scale):
        n, g = q.size(2), k.size(2)
        if self.m["attention_backend"] == "flash":
            out = F.scaled_dot_product_attention(
                q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3),
                dropout_p=self.m["attention_dropout"], is_causal=True, scale=scale, enable_gqa=(n != g))
            b, n, s, dv = out.shape
            return out.permute(2, 0, 1, 3).contiguous().view(s, b, n * dv)
        if n // g > 1:
            k = k.repeat_interleave(n // g, dim=2)
            v = v.repeat_interleave(n // g, dim=2)
        b, sq, sk = q.size(1), q.size(0), k.size(0)
        q2 = q.reshape(sq, b * n, -1)
        k2 = k.view(sk, b * n, -1)
        if self.score_buffer is None or self.score_buffer.numel() < b * n * sq * sk:
            self.score_buffer = torch.empty(b * n, sq, sk, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(self.score_buffer, q2.transpose(0, 1), k2.transpose(0, 1).transpose(1, 2),
                               beta=0.0, alpha=scale)
        probs = self.scale_mask_softmax(scores.view(b, n, sq, sk))
        probs = dropout(probs, self.m["attention_dropout"])
        v2 = v.view(sk, b * n, -1)
        context = torch.bmm(probs.view(b * n, sq, sk), v2.transpose(0, 1))
        dv = context.size(-1)
        context = context.view(b, n, sq, dv).permute(2, 0, 1, 3).contiguous()
        return context.view(sq, b, n * dv)

    def attend(self, q, k, v, scale):
        if "core_attn" in self.policy["labels"]:
            return checkpoint(lambda a, b_, c: self.core_attention(a, b_, c, scale), q, k, v)
        return self.core_attention(q, k, v, scale)

    def self_attention(self, pre, x, freqs):
        n, g, d = self.heads, self.groups, self.kv
        qkv = F.linear(x, self.P(pre + "self_attention.linear_qkv.weight"),
                       self.PO(pre + "self_attention.linear_qkv.bias"))
        s, b = qkv.size(0), qkv.size(1)
        qkv = qkv.view(s, b, g, (n // g + 2) * d)
        q, k, v = torch.split(qkv, [(n // g) * d, d, d], dim=3)
        q = q.reshape(s, b, n, d)
        if freqs is not None:
            q = self.rope(q, freqs)
            k = self.rope(k, freqs)
        context = self.attend(q, k, v, 1.0 / math.sqrt(d))
        return F.linear(context, self.P(pre + "self_attention.linear_proj.weight"))

    def mla_attention(self, pre, x, freqs):
        m = self.m
        n = self.heads
        qk, pe, dv = m["qk_head_dim"], m["qk_pos_emb_head_dim"], m["v_head_dim"]
        q_in = x
        if m.get("q_lora_rank"):
            q_in = F.linear(x, self.P(pre + "self_attention.linear_q_down_proj.weight"))
            q_in = self.norm(q_in, pre + "self_attention.q_layernorm")
            q_up = pre + "self_attention.linear_q_up_proj.weight"
        else:
            q_up = pre + "self_attention.linear_q_proj.weight"
        kv_combined = F.linear(x, self.P(pre + "self_attention.linear_kv_down_proj.weight"))
        kv_c, k_pos = torch.split(kv_combined, [m["kv_lora_rank"], pe], dim=-1)
        kv_in = self.norm(kv_c, pre + "self_attention.kv_layernorm")

        def up_proj(q_c, kv_c, k_pe):
            q = F.linear(q_c, self.P(q_up))
            s, b = q.size(0), q.size(1)
            q = q.view(s, b, n, qk + pe)
            kv = F.linear(kv_c, self.P(pre + "self_attention.linear_kv_up_proj.weight")).view(s, b, n, qk + dv)
            k_pe = k_pe.unsqueeze(2)
            q_nope, q_pe = torch.split(q, [qk, pe], dim=-1)
            k_nope, value = torch.split(kv, [qk, dv], dim=-1)
            q_pe = self.rope(q_pe, freqs)
            k_pe = self.rope(k_pe, freqs)
            query = torch.cat((q_nope, q_pe), dim=-1)
            k_pe = k_pe.expand(-1, -1, n, -1)
            key = torch.cat((k_nope, k_pe), dim=-1)
            return query.contiguous(), key.contiguous(), value.contiguous()

        recompute_up = "mla_up_proj" in self.policy["labels"]
        cp = OutputDiscardingCheckpoint()
        if recompute_up:
            query, key, value = cp.run(up_proj, q_in, kv_in, k_pos)
        else:
            query, key, value = up_proj(q_in, kv_in, k_pos)
        context = self.attend(query, key, value, 1.0 / math.sqrt(qk + pe))
        if recompute_up:
            cp.discard(context)
        return F.linear(context, self.P(pre + "self_attention.linear_proj.weight"))

    def activation(self, x):
        if self.m["gated_linear_unit"]:
            a, b = torch.chunk(x, 2, dim=-1)
            return F.silu(a) * (b + 0.0)  # Megatron: x_linear + glu_linear_offset
        return F.gelu(x)

    def mlp_core(self, x, fc1_w, fc1_b, fc2_w, probs=None):
        inter = F.linear(x, fc1_w)
        if fc1_b is not None:
            inter = inter + fc1_b
        inter = self.activation(inter)
        if probs is not None:
            inter = (inter * probs).to(x.dtype)
        return F.linear(inter, fc2_w)

    def dense_mlp(self, pre, x):
        def region(y):
            return self.mlp_core(y, self.P(pre + "mlp.linear_fc1.weight"), self.PO(pre + "mlp.linear_fc1.bias"),
                                 self.P(pre + "mlp.linear_fc2.weight"))
        return checkpoint(region, x) if "mlp" in self.policy["labels"] else region(x)

    def shared_experts(self, pre, x):
        sp = pre + "mlp.shared_experts."

        def region(y):
            out = self.mlp_core(y, self.P(sp + "linear_fc1.weight"), self.PO(sp + "linear_fc1.bias"),
                                self.P(sp + "linear_fc2.weight"))
            b2 = self.PO(sp + "linear_fc2.bias")
            return out + b2 if b2 is not None else out
        return checkpoint(region, x) if "shared_experts" in self.policy["labels"] else region(x)

    def experts(self, pre, tokens, counts, probs):
        m = self.m
        e = m["num_moe_experts"]
        if m["moe_grouped_gemm"]:
            w1 = self.P(pre + "mlp.experts.weight1").view(e, self.hidden, -1)
            w2 = self.P(pre + "mlp.experts.weight2").view(e, -1, self.hidden)
            fc1 = GroupedGemmFn.apply(tokens, w1, counts)

            def act(x, p):
                return (self.activation(x) * p).to(x.dtype)
            if "moe_act" in self.policy["labels"]:
                cp = OutputDiscardingCheckpoint()
                inter = cp.run(act, fc1, probs.unsqueeze(-1))
                fc2 = GroupedGemmFn.apply(inter, w2, counts)
                cp.discard(fc2)
                return fc2
            return GroupedGemmFn.apply(act(fc1, probs.unsqueeze(-1)), w2, counts)
        outs = []
        token_list = torch.split(tokens, counts)
        prob_list = torch.split(probs, counts)
        for x in range(e):
            ep = pre + f"mlp.experts.local_experts.{x}."
            out = self.mlp_core(token_list[x], self.P(ep + "linear_fc1.weight"), self.PO(ep + "linear_fc1.bias"),
                                self.P(ep + "linear_fc2.weight"), prob_list[x].unsqueeze(-1))
            b2 = self.PO(ep + "linear_fc2.bias")
            outs.append(out + b2 if b2 is not None else out)
        return torch.cat(outs, dim=0)

    def moe_core(self, pre, x):
        m = self.m
        shared = None
        if m.get("moe_shared_expert_intermediate_size"):
            shared = self.shared_experts(pre, x)
        e = m["num_moe_experts"]
        hs = x.reshape(-1, self.hidden)
        num_tokens = hs.size(0)
        logits = F.linear(hs, self.P(pre + "mlp.router.weight"))
        scores, top_idx = torch.topk(logits, m["moe_router_topk"], dim=-1)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(logits)
        routing_probs = torch.zeros_like(logits).scatter(1, top_idx, probs)
        routing_map = torch.zeros_like(logits, dtype=torch.int32).scatter(1, top_idx, 1).bool()
        counts = routing_map.sum(0).tolist()
        map_t = routing_map.t().contiguous()
        token_idx = torch.arange(num_tokens, device=hs.device).unsqueeze(0).expand(e, -1)
        sorted_idx = token_idx.masked_select(map_t)
        permuted_probs = routing_probs.t().contiguous().masked_select(map_t)
        permuted = hs.index_select(0, sorted_idx)
        expert_out = self.experts(pre, permuted, counts, permuted_probs)
        out = torch.zeros(num_tokens, self.hidden, dtype=expert_out.dtype, device=expert_out.device).scatter_add(
            0, sorted_idx.unsqueeze(1).expand(-1, self.hidden), expert_out)
        out = out.view(x.shape)
        if shared is not None:
            out = out + shared
        return out

    def moe(self, pre, x):
        if "moe" in self.policy["labels"]:
            return checkpoint(lambda y: self.moe_core(pre, y), x)
        return self.moe_core(pre, x)

    def bias_dropout_add(self, x, bias, residual):
        y = x + bias if bias is not None else x
        return residual + dropout(y, self.m["hidden_dropout"])

    def layer(self, i, x, freqs):
        pre = f"decoder.layers.{i}."
        labels = self.policy["labels"]
        ln = "layernorm" in labels
        cp1 = OutputDiscardingCheckpoint()
        ln1 = cp1.run(lambda y: self.norm(y, pre + "input_layernorm"), x) if ln else self.norm(x, pre + "input_layernorm")
        if self.m.get("multi_latent_attention"):
            attn = self.mla_attention(pre, ln1, freqs)
        else:
            attn = self.self_attention(pre, ln1, freqs)
        if ln:
            cp1.discard(attn)
        h = self.bias_dropout_add(attn, self.PO(pre + "self_attention.linear_proj.bias"), x)
        cp2 = OutputDiscardingCheckpoint()
        ln2 = cp2.run(lambda y: self.norm(y, pre + "pre_mlp_layernorm"), h) if ln else self.norm(h, pre + "pre_mlp_layernorm")
        moe = self.is_moe_layer(i)
        mlp = self.moe(pre, ln2) if moe else self.dense_mlp(pre, ln2)
        if ln:
            cp2.discard(mlp)
        return self.bias_dropout_add(mlp, None if moe else self.PO(pre + "mlp.linear_fc2.bias"), h)

    def block(self, x, freqs):
        n = self.m["num_layers"]
        full = self.policy["full"]

        def layers(begin, end):
            def run(h):
                for i in range(begin, end):
                    h = self.layer(i, h, freqs)
                return h
            return run
        if full and full[0] == "uniform":
            for i in range(0, n, full[1]):
                x = checkpoint(layers(i, min(i + full[1], n)), x)
        else:
            for i in range(n):
                x = checkpoint(layers(i, i + 1), x) if (full and i < full[1]) else self.layer(i, x, freqs)
        return self.norm(x, "decoder.final_layernorm")

    def loss(self, tokens, labels):
        m = self.m
        if self.causal_mask is None and m["attention_backend"] == "unfused":
            self.causal_mask = torch.ones(self.seq, self.seq, dtype=torch.bool, device=self.device).triu(1)
        emb = F.embedding(tokens, self.P("embedding.word_embeddings.weight"))
        pos = self.PO("embedding.position_embeddings.weight")
        if pos is not None:
            positions = torch.arange(self.seq, device=tokens.device).unsqueeze(0).expand_as(tokens)
            emb = emb + F.embedding(positions, pos)
        emb = emb.transpose(0, 1).contiguous()
        emb = dropout(emb, m["hidden_dropout"])
        freqs = None
        if m["position_embedding_type"] == "rope":
            freqs = self.rope_freqs(m["qk_pos_emb_head_dim"] if m.get("multi_latent_attention") else self.kv)
        hidden = self.block(emb, freqs)
        out_w = self.PO("output_layer.weight")
        if out_w is None:
            out_w = self.P("embedding.word_embeddings.weight")
        logits = F.linear(hidden, out_w)
        losses = CrossEntropyFn.apply(logits, labels.transpose(0, 1).contiguous())
        return losses.mean()


class Optimizer:
    """Flat buffers and AdamW without temporaries, as in engine/trial_runner.cc."""

    LR, BETA1, BETA2, EPS, WD, MAX_NORM = 1e-4, 0.9, 0.999, 1e-8, 0.01, 1.0

    def __init__(self, model, seed):
        device, dtype = model.device, model.dtype
        sizes = [math.prod(shape) for _, shape, _, _ in model.params]
        self.numel = sum(sizes)
        self.dtype = dtype
        self.param_buffer = torch.empty(self.numel, dtype=dtype, device=device)
        # The engine seeds the device's default generator and draws every full parameter from it
        # in declaration order: the same weights here.
        if device.type == "cuda":
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)
        offsets, off = [], 0
        with torch.no_grad():
            for (name, shape, std, value), n in zip(model.params, sizes):
                full = torch.empty(shape, dtype=torch.float32, device=device)
                if std > 0:
                    full.normal_(0.0, std)
                else:
                    full.fill_(value)
                self.param_buffer[off:off + n].view(shape).copy_(full)
                del full
                offsets.append(off)
                off += n
        model.values = []
        for (name, shape, _, _), o, n in zip(model.params, offsets, sizes):
            p = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=device))
            p.data = self.param_buffer[o:o + n].view(shape)
            model.values.append(p)
        self.grad_buffer = torch.zeros(self.numel, dtype=torch.float32, device=device)
        self.hooks = []
        for p, o, n in zip(model.values, offsets, sizes):
            main_grad = self.grad_buffer[o:o + n].view(p.shape)

            def hook(param, main_grad=main_grad):
                main_grad.add_(param.grad)
                param.grad = None
            if hasattr(p, "register_post_accumulate_grad_hook"):
                self.hooks.append(p.register_post_accumulate_grad_hook(hook))
            else:  # PyTorch < 2.1: a hook on the AccumulateGrad node, as Megatron's DDP
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(lambda *_, p=p, hook=hook: hook(p))
                self.hooks.append(acc)
        self.master = self.param_buffer.float() if dtype != torch.float32 else self.param_buffer
        self.exp_avg = None
        self.step_count = 0

    def static_bytes(self):
        elem = 4 if self.dtype == torch.float32 else 2
        master = 0 if self.dtype == torch.float32 else 4
        return self.numel * (elem + 4 + master + 8)

    def zero_grad(self):
        self.grad_buffer.zero_()

    @staticmethod
    def squared_norm(g, block=4096):
        # The engine's Optimizer::SquaredNorm: fp32 norms of 4096-element blocks added in fp64.
        n = g.numel()
        rows = n // block
        sq = torch.zeros(1, dtype=torch.float64, device=g.device)
        if rows:
            sq += g[: rows * block].view(rows, block).norm(2, dim=1).double().pow(2).sum()
        if n > rows * block:
            sq += g[rows * block:].norm().double().pow(2)
        return sq

    @torch.no_grad()
    def step(self):
        g = self.grad_buffer
        norm = self.squared_norm(g).sqrt().float()
        coef = (self.MAX_NORM / (norm + 1e-6)).clamp_max(1.0)
        g.mul_(coef)
        self.step_count += 1
        if self.exp_avg is None:
            self.exp_avg = torch.zeros_like(self.master)
            self.exp_avg_sq = torch.zeros_like(self.master)
        bc1 = 1.0 - self.BETA1 ** self.step_count
        bc2 = 1.0 - self.BETA2 ** self.step_count
        self.master.mul_(1.0 - self.LR * self.WD)
        self.exp_avg.mul_(self.BETA1).add_(g, alpha=1.0 - self.BETA1)
        self.exp_avg_sq.mul_(self.BETA2).addcmul_(g, g, value=1.0 - self.BETA2)
        g.copy_(self.exp_avg_sq).sqrt_().div_(math.sqrt(bc2)).add_(self.EPS)
        self.master.addcdiv_(self.exp_avg, g, value=-self.LR / bc1)
        if self.dtype != torch.float32:
            self.param_buffer.copy_(self.master)
        return norm


def run_trial(spec, policy_text, device):
    policy = parse_policy(policy_text)
    m, search = spec["model"], spec["search"]
    dtype = torch.bfloat16 if spec["train"]["precision"] == "bf16" else torch.float32
    seed = spec["train"].get("seed", 1234)
    budget = int(search["memory_budget_gib"] * 1024 ** 3)
    result = {"policy": policy_text, "status": "ok", "message": ""}
    start = time.perf_counter()
    gc.collect()  # nothing of the previous trial may count in this one's peaks
    if device.type == "cuda":
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.reset_accumulated_memory_stats(device)
    torch.manual_seed(seed)
    model = opt = None
    try:
        model = Gpt(spec, policy, device, dtype)
        opt = Optimizer(model, seed)
        data_gen = torch.Generator().manual_seed(seed + 1)
        b, s = spec["train"]["micro_batch_size"], m["seq_length"]
        times = []
        warmup, measure = search["warmup_steps"], search["measure_steps"]
        result["setup_s"] = time.perf_counter() - start
        for step in range(warmup + measure):
            tokens = torch.randint(0, m["vocab_size"], (b, s), generator=data_gen).to(device)
            labels = torch.randint(0, m["vocab_size"], (b, s), generator=data_gen).to(device)
            sync(device)
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = model.loss(tokens, labels)
            loss.backward()
            norm = opt.step()
            sync(device)
            t1 = time.perf_counter()
            if step == warmup:
                result["loss"] = loss.item()
                result["grad_norm"] = norm.item()
            if step >= warmup:
                times.append(t1 - t0)
        result["step_time_s"] = statistics.median(times)
        result["step_time_spread_s"] = max(times) - min(times)
        result["tokens_per_s"] = b * s / result["step_time_s"]
        result["static_bytes"] = opt.static_bytes()
    except torch.cuda.OutOfMemoryError as e:
        result["status"] = "oom"
        result["message"] = str(e).splitlines()[0]
    finally:
        del model, opt
    if device.type == "cuda":
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        result["alloc_retries"] = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    return result


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="spec as JSON (the YAML spec's structure)")
    ap.add_argument("--policies", required=True, help="policy strings separated by ';'")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    device = torch.device(args.device)
    if device.type == "cuda":
        if device.index is None:  # set_device needs an index; "cuda" means the current one
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    for policy in [p for p in args.policies.split(";") if p]:
        print(json.dumps(run_trial(spec, policy, device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
