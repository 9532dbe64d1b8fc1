"""Both Transformer language models, built bottom-up.

1. The Llama-style model (the CS336 "LM from scratch" shape): pre-norm RMSNorm, SwiGLU, RoPE, no biases,
   written from tensor math only (no torch.nn layers, no torch.nn.functional, except the fused
   F.scaled_dot_product_attention behind attn_impl="sdpa", the default), with ablation switches.
2. GPT-2 (the nanoGPT / Hugging Face shape): learned positions, LayerNorm, GELU MLP, biases, tied lm_head;
   loads OpenAI's released weights.

Each model is built from its config dataclass (TransformerLMConfig, GPTConfig), declared once here: every field
is a train.py flag with its default and help, is stored in checkpoints (model_config()), is rebuilt by
model_from_checkpoint, and is counted by flops.py (which builds the model on the meta device). An ablation is a
field and its use, both in this file (README: Hacking).

Both models share one small surface so train.py, sample.py and the evaluators treat them alike:
    model(idx) -> logits (GPT: (logits, loss); Llama's model(idx, targets=y) -> loss, computed in chunks),
    model_config() -> dict, build_model(dict), load_model(),
    get_num_params(), init_kv_cache() + forward_with_cache(), param_groups(), blocks(), lm_loss(), unwrap().
read_checkpoint() reads any train.py checkpoint, an FSDP run's sharded one included, into one state dict.

    python -c "import model; m = model.GPT.from_pretrained('gpt2'); print(m.get_num_params())"
"""
import dataclasses
import enum
import json
import math
import os
import pickle
import socket
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from urllib.parse import urlparse

import torch
import torch.nn as nn
import torch.nn.functional as F  # only for the sdpa switch and the GPT-2 variant

# ----------------------------------------------------------------------------------------------------------
# Settings: a dataclass field that is also a command-line flag (train.py reads these; so do its own settings)

CHECKS = {  # the range a setting may be held to; the key is also what its error message says
    ">= 1": lambda v: v >= 1,
    ">= 0": lambda v: v >= 0,
    "finite and >= 0": lambda v: 0 <= v < math.inf,
    "finite and > 0": lambda v: 0 < v < math.inf,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
    "in [0, 2**32)": lambda v: 0 <= v < 2 ** 32,
}


def setting(default, help, check=None, choices=None, **meta):
    """A dataclass field with its --help text, a range check (a key of CHECKS) or allowed values, and any other
    metadata train.py reads (flag: the flag's name when it differs from the field's, None for no flag). A plain
    field (`probe: bool = False`) is a flag as well, with its name for help and no check."""
    if check is not None and check not in CHECKS:
        raise ValueError(f"setting: unknown check {check!r}; expected one of {list(CHECKS)}")
    return field(default=default, metadata=dict(help=help, check=check, choices=choices, **meta))


def check_setting(name, value, f):
    """A ValueError naming `name` (train.py passes the flag) when value breaks field f's check or choices."""
    check, choices = f.metadata.get("check"), f.metadata.get("choices")
    if check and not CHECKS[check](value):   # (the checks are written so that NaN fails too)
        raise ValueError(f"{name} must be {check}, got {value}")
    if choices and value not in choices:
        raise ValueError(f"{name}: expected {' or '.join(map(str, choices))}, got {value!r}")


def _check_ids(idx, vocab_size, context_length, who):
    """One clear line for the two classic mistakes. Checked on CPU only: on a GPU the check would force a
    host-device sync every micro-step (there, an out-of-range id still fails loudly in the embedding)."""
    if idx.dim() != 2:
        raise ValueError(f"{who}: expected token ids of shape (batch, seq), got {tuple(idx.shape)}")
    if idx.size(1) > context_length:
        raise ValueError(f"{who}: sequence length {idx.size(1)} exceeds context_length {context_length}")
    if idx.device.type == "cpu" and idx.numel() and not torch.compiler.is_compiling():
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{who}: token ids must be in [0, {vocab_size}), got min {lo} max {hi}")


# ----------------------------------------------------------------------------------------------------------
# Llama-style building blocks, from tensor math

class Linear(nn.Module):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        std = math.sqrt(2.0 / (in_features + out_features))
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, x):
        return x @ self.weight.t()


class Embedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids):
        # = self.weight[token_ids], whose backward (index_put with accumulate) adds up on the CPU's threads in an
        # order that varies run to run: index_select's backward gives the same sums every time, and is faster
        return self.weight.index_select(0, token_ids.reshape(-1)).view(*token_ids.shape, -1)


class RMSNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x):
        # squares of bf16 activations overflow / lose precision: normalise in float32, hand back the input dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight).to(x.dtype)


def silu(x):
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)
        self.w3 = Linear(d_model, d_ff, device, dtype)

    def forward(self, x):
        return self.w2(silu(self.w1(x)) * self.w3(x))


class SiLUFFN(nn.Module):
    """The ffn_type="silu" ablation: W2 SiLU(W1 x), no gate (callers pass d_ff = 4 d_model)."""

    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)

    def forward(self, x):
        return self.w2(silu(self.w1(x)))


class ReLU2FFN(SiLUFFN):
    """The ffn_type="relu2" switch: W2 ReLU(W1 x)^2, no gate (So et al. 2021's Primer; d_ff = 4 d_model)."""

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)).square())


def _rotate_pairs(x, cos, sin):
    """(x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin) for every adjacent pair; sin is stored as (-sin, +sin)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x1, x0, x3, x2, ...)
    return (x * cos).addcmul_(swapped, sin)


class _Rotate(torch.autograd.Function):
    """A rotation's gradient is the rotation by minus the angle: the backward is the forward with sin negated
    and keeps only the small cos/sin tables (autograd would keep and revisit both halves of q and k)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate_pairs(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate_pairs(grad, cos, -sin), None, None


class RotaryPositionalEmbedding(nn.Module):
    """RoPE (Su et al. 2021) on adjacent pairs (x0,x1), (x2,x3), ... rotated by pos / theta^(2k/d_k)."""

    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__()
        if d_k % 2:
            raise ValueError(f"RotaryPositionalEmbedding: d_k must be even to rotate pairs, got {d_k}")
        inv_freq = 1.0 / theta ** (torch.arange(0, d_k, 2, device=device, dtype=torch.float64) / d_k)
        angles = torch.arange(max_seq_len, device=device, dtype=torch.float64)[:, None] * inv_freq
        # (max_seq_len, d_k), one entry per element: cos_k twice, and (-sin_k, +sin_k) for pair k, so the
        # rotation is two elementwise products; rebuilt from theta, so not saved in the state dict
        self.register_buffer("cos", angles.cos().repeat_interleave(2, -1).float(), persistent=False)
        self.register_buffer("sin", torch.stack((-angles.sin(), angles.sin()), -1).flatten(-2).float(),
                             persistent=False)

    def forward(self, x, token_positions=None):
        """x (..., seq, d_k); token_positions (..., seq) broadcastable to x's leading dims, default 0..seq-1."""
        if token_positions is None:
            cos, sin = self.cos[: x.size(-2)], self.sin[: x.size(-2)]
        else:
            cos, sin = self.cos[token_positions], self.sin[token_positions]
        return _Rotate.apply(x, cos.to(x.dtype), sin.to(x.dtype))


class _Softmax(torch.autograd.Function):
    """softmax with a hand-written backward that keeps only the output: autograd through the plain formula
    would save three (B, H, T, T) intermediates per layer. Low-precision inputs are computed in float32. The mask
    is applied here, to the float32 copy, not to x: a masked entry's probability is 0, so its gradient is 0 with no
    masked_fill backward, and compiled on CPU the mask stays in registers (masking the scores before the softmax
    made the speedrun preset's bf16 step about 5% longer)."""

    @staticmethod
    def forward(ctx, x, dim, mask):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # float64 stays float64
        if mask is not None:
            xf = xf.masked_fill(~mask, float("-inf"))
        # a fully masked row (all -inf) must give zeros, not NaN: clamp its max to a finite number so exp
        # gives 0, and clamp the sum at 1 (a row with any finite entry sums to >= 1 after max-subtraction)
        m = xf.amax(dim, keepdim=True).clamp(min=torch.finfo(xf.dtype).min)
        e = (xf - m).exp_()
        p = e.div_(e.sum(dim, keepdim=True).clamp(min=1.0)).to(x.dtype)
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        acc = torch.promote_types(p.dtype, torch.float32)
        pf, gf = p.to(acc), grad.to(acc)
        # d softmax: p * (g - sum(g * p))
        return (pf * (gf - (gf * pf).sum(ctx.dim, keepdim=True))).to(p.dtype), None, None


def softmax(x, dim, mask=None):
    """softmax of x along dim; with a boolean mask (broadcast to x), only the entries where it is True count."""
    return _Softmax.apply(x, dim, mask)


def scaled_dot_product_attention(Q, K, V, mask=None):
    """Q (..., q, d_k), K (..., k, d_k), V (..., k, d_v); mask (q, k) boolean, True = may attend."""
    scores = (Q * Q.size(-1) ** -0.5) @ K.transpose(-2, -1)  # scaling Q is cheaper than scaling the scores
    return softmax(scores, dim=-1, mask=mask) @ V


def _causal_mask(q_len, k_len, device):
    """(q_len, k_len) True where query i (the last q_len of k_len positions) may see key j."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - q_len)


def _causal_attention(q, k, v, attn_impl):
    """Causal attention where the queries are the LAST q positions of the k keys (k > q with a KV cache)."""
    q_len, k_len = q.size(-2), k.size(-2)
    if attn_impl == "sdpa":  # flash attention on GPU, a fused kernel on CPU
        if q_len == k_len:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mask = None if q_len == 1 else _causal_mask(q_len, k_len, q.device)  # is_causal aligns top-left: no
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    mask = None if q_len == 1 else _causal_mask(q_len, k_len, q.device)
    return scaled_dot_product_attention(q, k, v, mask)


# "scratch" is the readable reference above; "sdpa" (the default) is numerically the same, fused (flash attention
# on GPU, a blocked kernel on CPU), never materialises the (T, T) scores, and measured faster on CPU in float32;
# at head size 32, compiled (the CPU speedrun), scratch's step is 0.84-0.87x sdpa's in bf16 and level in float32
ATTN_IMPLS = ("sdpa", "scratch")


class KVCache:
    """Keys and values of every layer for generation: (batch, heads, max_seq_len, head_dim) per layer,
    preallocated; `pos` = number of positions filled so far."""

    def __init__(self, num_layers, batch_size, num_heads, max_seq_len, head_dim, device=None, dtype=None):
        shape = (batch_size, num_heads, max_seq_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.max_seq_len = max_seq_len
        self.pos = 0

    def update(self, layer, k, v):
        """Store the new keys/values at pos.. and return everything cached so far for this layer."""
        end = self.pos + k.size(-2)
        self.k[layer][:, :, self.pos:end] = k
        self.v[layer][:, :, self.pos:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def check_room(self, new_tokens, who):
        if self.pos + new_tokens > self.max_seq_len:
            raise ValueError(f"{who}: KV cache holds {self.max_seq_len} positions; {self.pos} used, "
                             f"{new_tokens} more requested")


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, attn_impl="sdpa",
                 device=None, dtype=None, qk_norm=False):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"MultiHeadSelfAttention: d_model {d_model} must be divisible by num_heads {num_heads}")
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"MultiHeadSelfAttention: attn_impl must be one of {ATTN_IMPLS}, got {attn_impl!r}")
        self.num_heads, self.d_k, self.attn_impl = num_heads, d_model // num_heads, attn_impl
        self.q_proj = Linear(d_model, d_model, device, dtype)
        self.k_proj = Linear(d_model, d_model, device, dtype)
        self.v_proj = Linear(d_model, d_model, device, dtype)
        self.output_proj = Linear(d_model, d_model, device, dtype)
        self.rope = None
        if theta is not None:
            if max_seq_len is None:
                raise ValueError("MultiHeadSelfAttention: RoPE (theta given) needs max_seq_len")
            self.rope = RotaryPositionalEmbedding(theta, self.d_k, max_seq_len, device)
        # qk_norm: RMSNorm each head's query and key (learned gains), so attention logits cannot grow unbounded
        self.q_norm, self.k_norm = ((RMSNorm(self.d_k, device=device, dtype=dtype),
                                     RMSNorm(self.d_k, device=device, dtype=dtype)) if qk_norm else (None, None))

    def forward(self, x, token_positions=None, kv_cache=None, layer=0):
        # (no fused qkv matmul: a runtime torch.cat of the three weights measured no faster on CPU)
        q, k, v = (proj(x).unflatten(-1, (self.num_heads, self.d_k)).transpose(-3, -2)  # (..., heads, T, d_k)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        T = x.size(-2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            if token_positions is None and kv_cache is not None and kv_cache.pos:
                token_positions = torch.arange(kv_cache.pos, kv_cache.pos + T, device=x.device)
            if token_positions is not None and token_positions.dim() > 1:
                token_positions = token_positions.unsqueeze(-2)  # (..., seq) -> (..., 1 head, seq)
            q, k = self.rope(q, token_positions), self.rope(k, token_positions)
        if kv_cache is not None:
            k, v = kv_cache.update(layer, k, v)
        y = _causal_attention(q, k, v, self.attn_impl)
        return self.output_proj(y.transpose(-3, -2).flatten(-2))


def llama_d_ff(d_model):
    """SwiGLU width: 8/3 d_model (same parameters as a 4x GELU MLP) rounded to the nearest multiple of 64."""
    return max(64, round(8 * d_model / 3 / 64) * 64)


@dataclass
class TransformerLMConfig:
    """The Llama-style model. The first seven fields are TransformerLM's positional arguments (CS336's order);
    the others are its switches. Defaults: the main job's small model (train.py's flag defaults)."""
    vocab_size: int = setting(2048, "vocabulary size (train.py: what data preparation trains; the model takes the "
                                    "data's)", check=">= 1")
    context_length: int = setting(128, "tokens per training window (GPT-2: block_size)", check=">= 1")
    d_model: int = setting(128, "width (GPT-2: n_embd)", check=">= 1")
    num_layers: int = setting(4, "Transformer blocks (GPT-2: n_layer)", check=">= 1")
    num_heads: int = setting(4, "attention heads (GPT-2: n_head)", check=">= 1")
    d_ff: int = setting(0, "Llama feed-forward width (0 = 8/3*d_model rounded to 64, at least 64, for swiglu; "
                           "4*d_model for silu)", check=">= 0")
    rope_theta: float = setting(10000.0, "Llama: RoPE base", check="finite and > 0")
    remove_rmsnorm: bool = setting(False, "Llama ablation: no RMSNorm anywhere (ln_final included)")
    use_post_norm: bool = setting(False, "Llama ablation: post-norm blocks (normalise after each residual add)")
    remove_rope: bool = setting(False, "Llama ablation: no position information (NoPE)")
    ffn_type: str = setting("swiglu", "Llama ablation: swiglu | silu (W2 SiLU(W1 x), no gate) | relu2 "
                            "(W2 ReLU(W1 x)^2, no gate)", choices=("swiglu", "silu", "relu2"))
    attn_impl: str = setting("sdpa", "sdpa (F.scaled_dot_product_attention, flash on GPU) | scratch (the "
                                     "from-primitives path)", choices=ATTN_IMPLS)
    qk_norm: bool = setting(False, "Llama: RMSNorm on each head's queries and keys before RoPE")
    tie_embeddings: bool = setting(False, "Llama: the LM head is the token embedding matrix (one matrix, the "
                                          "head's init)")
    logit_softcap: float = setting(0.0, "Llama: logits = cap * tanh(logits / cap) (0 = off)", check=">= 0")

    def __post_init__(self):
        self.ffn_type = self.ffn_type or "swiglu"   # CS336 configs pass None for the default
        for f in fields(self):
            check_setting(f.name, getattr(self, f.name), f)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by num_heads {self.num_heads}")
        if not self.d_ff:   # callers pass d_ff = 4 d_model for the SiLU FFN to keep parameter counts comparable
            self.d_ff = llama_d_ff(self.d_model) if self.ffn_type == "swiglu" else 4 * self.d_model


FFNS = {"swiglu": SwiGLU, "silu": SiLUFFN, "relu2": ReLU2FFN}


def norm_layer(config, d_model, device=None, dtype=None):
    """The normalisation of a block (ln1, ln2) and of the model's end (ln_final); None removes it."""
    return None if config.remove_rmsnorm else RMSNorm(d_model, device=device, dtype=dtype)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then x + ffn(ln2(x)). config: the TransformerLMConfig whose switches
    (ablations, attn_impl) it follows; None = the defaults."""

    def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, config=None, device=None, dtype=None):
        super().__init__()
        c = config or TransformerLMConfig(d_model=d_model, num_heads=num_heads)
        self.use_post_norm = c.use_post_norm
        self.ln1 = norm_layer(c, d_model, device, dtype)
        self.attn = MultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta, c.attn_impl, device, dtype,
                                           c.qk_norm)
        self.ln2 = norm_layer(c, d_model, device, dtype)
        self.ffn = FFNS[c.ffn_type](d_model, d_ff, device, dtype)

    @staticmethod
    def _norm(ln, x):
        return x if ln is None else ln(x)

    def forward(self, x, token_positions=None, kv_cache=None, layer=0):
        if self.use_post_norm:  # the original Transformer: normalise after each residual add
            x = self._norm(self.ln1, x + self.attn(x, token_positions, kv_cache, layer))
            return self._norm(self.ln2, x + self.ffn(x))
        x = x + self.attn(self._norm(self.ln1, x), token_positions, kv_cache, layer)
        return x + self.ffn(self._norm(self.ln2, x))


class TransformerLM(nn.Module):
    """TransformerLM(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, **switches):
    the keywords are the fields of TransformerLMConfig, which the model keeps as self.config."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta=10000.0,
                 device=None, dtype=None, **switches):
        super().__init__()
        self.config = c = TransformerLMConfig(vocab_size, context_length, d_model, num_layers, num_heads, d_ff,
                                              rope_theta, **switches)
        self.vocab_size, self.context_length = c.vocab_size, c.context_length
        theta = None if c.remove_rope else c.rope_theta
        self.token_embeddings = Embedding(c.vocab_size, c.d_model, device, dtype)
        self.layers = nn.ModuleList(TransformerBlock(c.d_model, c.num_heads, c.d_ff, c.context_length, theta, c,
                                                     device, dtype) for _ in range(c.num_layers))
        # with use_post_norm the last block already ends in a norm; ln_final stays anyway (a learned rescale),
        # so every ablation keeps the same state-dict keys except remove_rmsnorm, the FFNs without a gate (no w3)
        # and qk_norm (its q_norm / k_norm gains)
        self.ln_final = norm_layer(c, c.d_model, device, dtype)
        self.lm_head = Linear(c.d_model, c.vocab_size, device, dtype)
        if c.tie_embeddings:   # the lookup reads the head's rows (its small init; RMSNorm follows in every block)
            self.token_embeddings.weight = self.lm_head.weight

    def model_config(self):
        return {"arch": "llama", **asdict(self.config)}

    def get_num_params(self, non_embedding=True):
        """Non-embedding excludes the token-embedding lookup; the lm_head is a matmul and counts (tied: once)."""
        n = sum(p.numel() for p in self.parameters())
        tied = self.config.tie_embeddings
        return n - self.token_embeddings.weight.numel() if non_embedding and not tied else n

    def forward(self, idx, token_positions=None, kv_cache=None, targets=None):
        """Logits (batch, seq, vocab); given targets (batch, seq), the mean next-token loss instead, the head and
        the loss computed together a chunk of positions at a time (linear_cross_entropy; train.py's
        --chunked_loss)."""
        _check_ids(idx, self.vocab_size, self.context_length, "TransformerLM")
        x = self.token_embeddings(idx)
        for i, layer in enumerate(self.layers):
            x = layer(x, token_positions, kv_cache, i)
        if self.ln_final is not None:
            x = self.ln_final(x)
        cap = self.config.logit_softcap
        if targets is not None and not cap:
            return linear_cross_entropy(x, self.lm_head.weight, targets)
        logits = self.lm_head(x)
        logits = cap * torch.tanh(logits / cap) if cap else logits
        return logits if targets is None else cross_entropy(logits, targets)

    def init_kv_cache(self, batch_size, max_seq_len=None, device=None, dtype=None):
        p = self.lm_head.weight
        attn = self.layers[0].attn
        return KVCache(len(self.layers), batch_size, attn.num_heads, max_seq_len or self.context_length, attn.d_k,
                       device or p.device, dtype or p.dtype)

    def forward_with_cache(self, idx, cache):
        """Logits for idx at positions cache.pos.., attending to everything cached; advances cache.pos."""
        cache.check_room(idx.size(1), "TransformerLM.forward_with_cache")
        if cache.pos + idx.size(1) > self.context_length:
            raise ValueError(f"TransformerLM.forward_with_cache: position {cache.pos + idx.size(1)} exceeds "
                             f"context_length {self.context_length}")
        logits = self(idx, kv_cache=cache)
        cache.pos += idx.size(1)
        return logits


def _softmax_and_logsumexp(x):
    """The softmax of x's rows (N, vocab), in a new tensor, and their log-sum-exp (N,), stable (every exponent
    <= 0): float32 for 16-bit logits, float64 stays float64."""
    acc = torch.promote_types(x.dtype, torch.float32)
    m = x.amax(-1, keepdim=True).to(acc)
    p = torch.sub(x, m).exp_()  # in acc even for bf16 logits (type promotion)
    sum_exp = p.sum(-1, keepdim=True)
    return p.div_(sum_exp), (sum_exp.log() + m).squeeze(1)


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the first `num_classes` logits, accumulated in float32, with a hand-written
    backward: d loss / d logits = (softmax - one_hot) / N. The forward keeps the softmax (in place of the logits
    it no longer needs), so the backward is two in-place edits of it instead of autograd's passes over (N, vocab)."""

    @staticmethod
    def forward(ctx, logits, targets, num_classes):
        x = logits.reshape(-1, logits.size(-1))[:, :num_classes]  # padded columns never get probability mass
        t = targets.reshape(-1, 1)
        p, lse = _softmax_and_logsumexp(x)
        loss = (lse - x.gather(1, t).squeeze(1).to(lse.dtype)).mean()
        ctx.save_for_backward(p, t)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        p, t = ctx.saved_tensors  # edited in place: this graph can be backpropagated once (no retain_graph)
        p.scatter_add_(1, t, torch.full(t.shape, -1.0, dtype=p.dtype, device=p.device))
        p.mul_(grad / p.size(0))
        if p.size(1) == ctx.shape[-1]:
            return p.to(ctx.dtype).view(ctx.shape), None, None
        dx = p.new_zeros(p.size(0), ctx.shape[-1], dtype=ctx.dtype)
        dx[:, : p.size(1)] = p
        return dx.view(ctx.shape), None, None


def cross_entropy(logits, targets, num_classes=None):
    """Mean cross-entropy of logits (..., vocab) against targets (...); num_classes < vocab ignores padding."""
    num_classes = num_classes or logits.size(-1)
    _check_targets(targets, logits.shape[:-1], num_classes, "cross_entropy", "logits shape without the last dim")
    return _CrossEntropy.apply(logits, targets, num_classes)


def _check_targets(targets, shape, num_classes, who, what):
    if targets.shape != shape:
        raise ValueError(f"{who}: targets shape {tuple(targets.shape)} must equal {what} {tuple(shape)}")
    if targets.device.type == "cpu" and targets.numel() and not torch.compiler.is_compiling():
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(f"{who}: targets must be in [0, {num_classes}), got min {lo} max {hi}")


class _LinearCrossEntropy(torch.autograd.Function):
    """cross_entropy(x @ weight^T, targets) a chunk of rows at a time, each chunk's gradients computed while its
    logits are at hand: the (rows, vocab) logits never exist whole, and a chunk's stay in the CPU's cache. The
    softmax and the sums are float32 as cross_entropy's; the matmuls follow autocast. The backward only scales
    the gradients the forward saved."""

    @staticmethod
    def forward(ctx, x, weight, targets, rows, needs_grad):
        n, ctx.dtypes = x.size(0), (x.dtype, weight.dtype)
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        dw = torch.zeros_like(weight, dtype=torch.float32) if needs_grad else None
        if torch.is_autocast_enabled(x.device.type):   # the matmuls' dtype: cast once, not in every chunk
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
        dx = torch.empty_like(x) if needs_grad else None
        for i in range(0, n, rows):
            xc, t = x[i:i + rows], targets[i:i + rows].unsqueeze(1)
            logits = (xc @ weight.t()).float()
            p, lse = _softmax_and_logsumexp(logits)
            loss += lse.sum() - logits.gather(1, t).sum()
            if needs_grad:   # d loss / d logits = (softmax - one_hot) / n
                p.scatter_add_(1, t, torch.full(t.shape, -1.0, device=p.device)).div_(n)
                p = p.to(x.dtype)
                dx[i:i + rows] = p @ weight
                dw += p.t() @ xc
        ctx.save_for_backward(dx, dw)
        return loss / n

    @staticmethod
    def backward(ctx, grad):
        dx, dw = ctx.saved_tensors
        return (dx * grad).to(ctx.dtypes[0]), (dw * grad).to(ctx.dtypes[1]), None, None, None


def linear_cross_entropy(x, weight, targets, rows=256):
    """Mean cross-entropy of the logits x @ weight^T (x (..., d), weight (vocab, d)) against targets (...),
    computed `rows` positions at a time: on CPU in bf16 a tenth faster a step than the head then cross_entropy at
    the speedrun's shape, and slower at small ones (docs/BENCHMARKS.md, "The loss in chunks")."""
    _check_targets(targets, x.shape[:-1], weight.size(0), "linear_cross_entropy", "x shape without the last dim")
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    flat = x.reshape(-1, x.size(-1))
    return _LinearCrossEntropy.apply(flat, weight, targets.reshape(-1), rows, needs_grad)


# ----------------------------------------------------------------------------------------------------------
# GPT-2 (nanoGPT / Hugging Face parameter names, so OpenAI's checkpoints load key for key)

@dataclass
class GPTConfig:
    """GPT-2's shape (defaults: the 124M model). `flag`: the train.py flag each field is set by (the flags are
    named as the Llama model's, so one command line serves both)."""
    block_size: int = setting(1024, "positions", check=">= 1", flag="context_length")
    vocab_size: int = setting(50257, "vocabulary size", check=">= 1")
    n_layer: int = setting(12, "blocks", check=">= 1", flag="num_layers")
    n_head: int = setting(12, "attention heads", check=">= 1", flag="num_heads")
    n_embd: int = setting(768, "width", check=">= 1", flag="d_model")
    pad_vocab_to_multiple_of: int = setting(1, "64/128: aligned matmul shapes on GPU (50257 -> 50304); train.py sets "
                                               "it from --pad_vocab", flag=None)
    attn_impl: str = setting("sdpa", "sdpa | scratch", choices=ATTN_IMPLS)

    def __post_init__(self):
        for f in fields(self):
            check_setting(f.name, getattr(self, f.name), f)
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT: n_embd {self.n_embd} must be divisible by n_head {self.n_head}")


def padded_vocab(vocab_size, multiple):
    """vocab_size rounded up to a multiple (GPT-2's 50257 -> 50304 at 64)."""
    m = max(1, int(multiple or 1))
    return (vocab_size + m - 1) // m * m


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_embd, self.attn_impl = config.n_head, config.n_embd, config.attn_impl
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, kv_cache=None, layer=0):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        if kv_cache is not None:
            k, v = kv_cache.update(layer, k, v)
        y = _causal_attention(q, k, v, self.attn_impl)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2's tanh GELU


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), kv_cache, layer)
        return x + self.mlp(self.ln_2(x))


HUB_SHAPES = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
              "gpt2-xl": (48, 25, 1600)}


def hub_reachable(timeout=3.0):
    """(ok, why not): a quick probe of the Hugging Face hub. Offline, huggingface_hub retries for ~25 s per file
    and `datasets` for minutes before they give up (fineweb.py asks this too)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "0").lower() not in ("0", "", "false", "no"):
            return False, f"{var} is set"
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy") + (("HTTP_PROXY", "http_proxy")
                                                                           if url.scheme == "http" else ())
    if any(os.environ.get(v) for v in proxies):
        return True, "behind a proxy: not probed"   # a direct connection would prove nothing
    try:
        host, port = url.hostname, url.port or (80 if url.scheme == "http" else 443)
    except ValueError:  # a port out of range
        host = None
    if host is None:  # a malformed HF_ENDPOINT: let the hub client say what is wrong with it
        return True, "HF_ENDPOINT not understood: not probed"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True, ""
    except OSError as e:
        return False, f"cannot reach {host} ({e})"


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.vocab_size, self.context_length = config.vocab_size, config.block_size
        self.padded_vocab_size = padded_vocab(config.vocab_size, config.pad_vocab_to_multiple_of)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(self.padded_vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, self.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying (Press & Wolf 2017), as GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # residual projections: std 0.02 / sqrt(2 n_layer) (GPT-2 paper)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def model_config(self):
        return {"arch": "gpt2", **asdict(self.config)}

    def get_num_params(self, non_embedding=True):
        """Parameters as stored (the tied wte/lm_head once, padded rows included). Non-embedding excludes
        the position embeddings only: wte doubles as the lm_head matmul (nanoGPT's convention)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def _logits(self, idx, kv_cache=None):
        _check_ids(idx, self.vocab_size, self.context_length, "GPT")
        start = kv_cache.pos if kv_cache is not None else 0
        pos = torch.arange(start, start + idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for i, block in enumerate(self.transformer.h):
            x = block(x, kv_cache, i)
        return self.lm_head(self.transformer.ln_f(x))  # (B, T, padded vocab)

    def forward(self, idx, targets=None):
        logits = self._logits(idx)
        loss = None if targets is None else cross_entropy(logits, targets, self.vocab_size)
        return logits[..., : self.vocab_size], loss  # padded ids are never visible to callers

    def init_kv_cache(self, batch_size, max_seq_len=None, device=None, dtype=None):
        p = self.lm_head.weight
        c = self.config
        return KVCache(c.n_layer, batch_size, c.n_head, max_seq_len or c.block_size, c.n_embd // c.n_head,
                       device or p.device, dtype or p.dtype)

    def forward_with_cache(self, idx, cache):
        cache.check_room(idx.size(1), "GPT.forward_with_cache")
        if cache.pos + idx.size(1) > self.context_length:
            raise ValueError(f"GPT.forward_with_cache: position {cache.pos + idx.size(1)} exceeds block_size "
                             f"{self.context_length}")
        logits = self._logits(idx, cache)
        cache.pos += idx.size(1)
        return logits[..., : self.vocab_size]

    @classmethod
    def from_pretrained(cls, name_or_path, **overrides):
        """OpenAI's GPT-2 (`gpt2` ... `gpt2-xl`, downloaded with huggingface_hub) or a local Hugging Face
        directory holding config.json + model.safetensors or pytorch_model.bin. overrides: GPTConfig fields
        such as pad_vocab_to_multiple_of or attn_impl."""
        if os.path.isdir(name_or_path):
            folder = name_or_path
            files = {f: os.path.join(folder, f) for f in ("config.json", "model.safetensors", "pytorch_model.bin")
                     if os.path.isfile(os.path.join(folder, f))}
        elif name_or_path in HUB_SHAPES:
            repo = f"openai-community/{name_or_path}"
            online = hub_reachable()[0]  # offline, a copy downloaded before still loads, at once
            try:
                from huggingface_hub import hf_hub_download

                def fetch(filename):
                    return hf_hub_download(repo, filename, local_files_only=not online)
                files = {"config.json": fetch("config.json")}
                try:
                    files["model.safetensors"] = fetch("model.safetensors")
                except Exception:  # older mirrors only have the pickle
                    files["pytorch_model.bin"] = fetch("pytorch_model.bin")
            except Exception as e:  # offline, no huggingface_hub, hub errors: one line, not a traceback
                why = ("the hub is unreachable and no copy is in its local cache" if not online else
                       (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:200])
                raise ValueError(f"GPT.from_pretrained: cannot download {repo} from the Hugging Face hub ({why}); "
                                 f"a local folder with config.json and model.safetensors works offline") from None
        else:
            raise ValueError(f"GPT.from_pretrained: {name_or_path!r} is neither a directory nor one of "
                             f"{sorted(HUB_SHAPES)}")
        if "config.json" not in files or len(files) < 2:
            raise ValueError(f"GPT.from_pretrained: {name_or_path}: expected config.json and model.safetensors "
                             f"or pytorch_model.bin")
        with open(files["config.json"]) as f:
            hf = json.load(f)
        # settings of GPT2Config that this GPT does not implement: another value would load and give wrong logits
        fixed = {"model_type": ("gpt2",), "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
                 "layer_norm_epsilon": (1e-5,), "scale_attn_weights": (True,),
                 "scale_attn_by_inverse_layer_idx": (False,), "n_inner": (None, 4 * hf.get("n_embd", 0))}
        for key, allowed in fixed.items():
            if key in hf and hf[key] not in allowed:
                raise ValueError(f"GPT.from_pretrained: {files['config.json']}: {key} {hf[key]!r} is not supported "
                                 f"(this GPT implements OpenAI's GPT-2: {key} {allowed[0]!r})")
        config = GPTConfig(block_size=hf.get("n_positions", hf.get("n_ctx", 1024)), vocab_size=hf["vocab_size"],
                           n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"])
        unknown = sorted(set(overrides) - {f.name for f in fields(GPTConfig)})
        if unknown:
            raise ValueError(f"GPT.from_pretrained: unknown GPTConfig field {unknown[0]!r}")
        config = replace(config, **overrides)
        if "model.safetensors" in files:
            from safetensors.torch import load_file
            sd_hf = load_file(files["model.safetensors"])
        else:
            sd_hf = torch.load(files["pytorch_model.bin"], map_location="cpu", weights_only=True)

        model = cls(config)
        sd = model.state_dict()
        # Hugging Face's Conv1D stores (in, out): transpose into nn.Linear's (out, in)
        conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        loaded = set()
        for key, w in sd_hf.items():
            key = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key
            if key == "lm_head.weight":  # tied to wte in OpenAI's GPT-2; a file with its own head is another model
                wte = sd_hf.get("transformer.wte.weight", sd_hf.get("wte.weight"))
                if wte is not None and not torch.equal(w, wte):
                    raise ValueError(f"GPT.from_pretrained: {name_or_path} has an lm_head untied from wte "
                                     f"(tie_word_embeddings false); this GPT ties them")
                continue
            if key.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # causal-mask buffers
            if key not in sd:
                raise ValueError(f"GPT.from_pretrained: unexpected weight {key!r} in {name_or_path}")
            if key.endswith(conv1d):
                w = w.t()
            # wte: the config's vocab_size rows (the model may pad more: zero, their logits are sliced off anyway)
            want = (config.vocab_size, config.n_embd) if key == "transformer.wte.weight" else tuple(sd[key].shape)
            if tuple(w.shape) != want:
                raise ValueError(f"GPT.from_pretrained: {key}: expected shape {want}, file has {tuple(w.shape)}")
            with torch.no_grad():
                sd[key][w.size(0):].zero_()
                sd[key][: w.size(0)].copy_(w)
            loaded.add(key)
        missing = [k for k in sd if k not in loaded and k != "lm_head.weight"]
        if missing:
            raise ValueError(f"GPT.from_pretrained: {name_or_path} lacks "
                             f"{missing[:3]}{'...' if len(missing) > 3 else ''}")
        return model


# ----------------------------------------------------------------------------------------------------------
# The common surface used by train.py, sample.py and the evaluators (flops.py builds models from configs too)

ARCHS = {"llama": "TransformerLMConfig", "gpt2": "GPTConfig"}   # model_config()["arch"] -> its config class


def config_class(arch):
    """The config dataclass of an architecture, looked up by name when asked (so a test can swap in its own)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be {' or '.join(map(repr, ARCHS))}, got {arch!r}")
    return globals()[ARCHS[arch]]


def check_heads(d_model, num_heads, rope, names=None):
    """A shape attention can have: num_heads dividing d_model, each head of an even width where RoPE rotates its
    pairs; else a ValueError naming the flags (names: how the caller's command line names them, with their values;
    default --d_model=D, --num_heads=H). Said before any work, not by RotaryPositionalEmbedding once data is ready."""
    d_name, h_name = names or (f"--d_model={d_model}", f"--num_heads={num_heads}")
    if d_model % num_heads:
        raise ValueError(f"{d_name} must be a multiple of {h_name}")
    if rope and d_model // num_heads % 2:
        raise ValueError(f"{d_name} / {h_name} = {d_model // num_heads} dimensions per head: RoPE rotates pairs, so "
                         f"it must be even")


def config_from_flags(arch, flags, vocab_size, pad_vocab=1):
    """The model_config() dict that train.py's (or flops.py's) flags describe: each field of the architecture's
    config from its flag (a field names its flag when it differs: GPTConfig.n_embd is --d_model), a flag not in
    `flags` at the field's default; the vocabulary is the data's, GPT-2's padding the device's (flag=None)."""
    cls = config_class(arch)
    kw = {f.name: flags.get(f.metadata.get("flag", f.name), f.default)
          for f in fields(cls) if f.metadata.get("flag", 1)}
    kw["vocab_size"] = vocab_size
    if arch == "gpt2":
        kw["pad_vocab_to_multiple_of"] = pad_vocab
    return {"arch": arch, **vars(cls(**kw))}


def build_model(cfg):
    """Build a model from a model_config() dict (as stored in checkpoints): {"arch": ..., **config fields}."""
    if not isinstance(cfg, dict):
        raise ValueError(f"build_model: expected a model_config dict, got {type(cfg).__name__}")
    cfg = dict(cfg)
    arch = cfg.pop("arch", None)
    try:
        cls = config_class(arch)
    except ValueError as e:
        raise ValueError(f"build_model: {e}") from None
    known = {f.name for f in fields(cls)}
    if set(cfg) - known:
        raise ValueError(f"build_model: unknown {arch} config keys {sorted(set(cfg) - known)}; expected some of "
                         f"{sorted(known)}")
    try:
        config = cls(**cfg)
    except (TypeError, ValueError) as e:  # a size of 0 or -1, an unknown ffn_type, ...
        raise ValueError(f"build_model: bad {arch} config {cfg}: {e}") from None
    return GPT(config) if arch == "gpt2" else TransformerLM(**asdict(config))


def unwrap(model):
    """The bare model inside the wrappers train.py puts around it: DDP and train.LossOf (.module),
    torch.compile (._orig_mod). Evaluation and generation run on it, eagerly."""
    while isinstance(getattr(model, "module", None), nn.Module) or hasattr(model, "_orig_mod"):
        model = model._orig_mod if hasattr(model, "_orig_mod") else model.module
    return model


def blocks(model):
    """The Transformer blocks of either model, in order (train.py's --fsdp shards them one by one, and
    --activation_checkpointing recomputes them one by one)."""
    model = unwrap(model)
    return model.layers if isinstance(model, TransformerLM) else model.transformer.h


def param_groups(model, weight_decay, muon=False):
    """AdamW groups: every matrix (>= 2-D: linear weights AND embeddings) is decayed; biases and norm gains
    are not. Embeddings are decayed because GPT-2's wte is also its output matrix (tied), and one rule for
    both models keeps ablations comparable (nanoGPT / CS336 do the same). muon=True: the blocks' matrices
    (not the embeddings or the head) are a third group, marked muon=True, for train.Muon."""
    params = [(n, p) for n, p in unwrap(model).named_parameters() if p.requires_grad]
    in_blocks = {n for n, p in params if muon and p.dim() == 2 and n.startswith(("layers.", "transformer.h."))}
    groups = [{"params": [p for n, p in params if p.dim() >= 2 and n not in in_blocks], "weight_decay": weight_decay},
              {"params": [p for n, p in params if p.dim() < 2], "weight_decay": 0.0}]
    if muon:
        groups.append({"params": [p for n, p in params if n in in_blocks], "weight_decay": weight_decay, "muon": True})
    return groups


def resolve_device(name):
    """auto | cpu | cuda | cuda:N | mps -> torch.device; a ValueError naming --device for one this machine lacks."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device: expected auto, cpu, cuda, cuda:N or mps, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: no such GPU ({torch.cuda.device_count()} visible)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {name}: MPS is not available on this machine")
    return device


def native_bf16(device):
    """Whether `device` computes bfloat16 natively, so that bf16 autocast pays: a CUDA GPU with bf16 tensor cores
    (Ampere and newer; a V100 emulates them), a CPU with AVX512-BF16 or AMX (AMD Zen 4, Intel Cooper Lake,
    Sapphire Rapids and newer) or Arm's BF16 extension. Elsewhere bf16 matmuls are emulated, ~20x slower on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"}) and \
        torch.ops.mkldnn._is_mkldnn_bf16_supported()


def cpu_flags():
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (x86 "flags", Arm "Features"); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def rank_gpu(local_rank):
    """The GPU of torchrun's process LOCAL_RANK: cuda:LOCAL_RANK, or cuda:0 when a launcher shows each process only
    its own GPU; a ValueError when there are fewer GPUs than processes."""
    visible = torch.cuda.device_count()
    if visible > 1 and local_rank >= visible:
        raise ValueError(f"LOCAL_RANK {local_rank}: only {visible} GPUs are visible "
                         "(torchrun --nproc_per_node at most the GPU count)")
    return torch.device("cuda", 0 if visible == 1 else local_rank)


def read_checkpoint(src, map_location="cpu"):
    """torch.load with weights_only=True (nothing in the file is executed) -> the checkpoint dict, with one clear
    line (ValueError) for a directory or a truncated, corrupt or foreign file; FileNotFoundError when missing. An
    FSDP run's checkpoint gets its "model" from the folder of shards it names (read_shards)."""
    name = src if isinstance(src, (str, os.PathLike)) else getattr(src, "name", "<file object>")
    if isinstance(src, (str, os.PathLike)) and os.path.isdir(src):
        raise ValueError(f"{name}: is a directory; expected a checkpoint file")
    try:
        ckpt = torch.load(src, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # torch's own messages run to many lines: keep the first sentence
        first = (str(e).strip().splitlines() or [""])[0].split(". ")[0]
        raise ValueError(f"{name}: not a readable checkpoint (truncated or corrupt?): {type(e).__name__}"
                         f"{': ' + first if first else ''}") from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"{name}: not a checkpoint (expected a dict, found {type(ckpt).__name__})")
    if "shards" in ckpt:   # train.py --fsdp's: the weights are in the folder beside the file that it names
        if not isinstance(src, (str, os.PathLike)):
            raise ValueError(f"{name}: an FSDP checkpoint keeps its weights in a folder beside it: pass its path")
        ckpt["model"] = read_shards(os.path.join(os.path.dirname(os.fspath(src)), str(ckpt["shards"])))
    return ckpt


def read_shards(folder):
    """The whole weights, as a state dict on the CPU, of an FSDP run's checkpoint folder: the shards its ranks wrote
    with torch.distributed.checkpoint (DCP), read by this process alone (no process group), whatever the number of
    ranks that wrote them. Nothing in the folder is executed (check_shards_metadata)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    try:
        check_shards_metadata(folder)
        reader = dcp.FileSystemReader(folder)
        entries = reader.read_metadata().state_dict_metadata
        state = {key: torch.empty(m.size, dtype=m.properties.dtype) for key, m in entries.items()
                 if key.startswith("model.") and isinstance(m, TensorStorageMetadata)}
        with warnings.catch_warnings():   # (that it reads in one process, as asked)
            warnings.filterwarnings("ignore", "torch.distributed is")
            dcp.load(state, storage_reader=reader, no_dist=True)
    except FileNotFoundError:
        raise ValueError(f"{folder}: missing: the folder of this FSDP checkpoint's weights") from None
    except ValueError:
        raise
    except (Exception, dcp.api.CheckpointException) as e:   # (DCP's own is a BaseException)
        raise shards_unreadable(folder, e) from None
    return {key[len("model."):]: value for key, value in state.items()}


def shards_unreadable(folder, e):
    """The one line (a ValueError) for an FSDP checkpoint's folder that DCP could not read; its CheckpointException
    carries each failing rank's error, the first of which says what went wrong."""
    import torch.distributed.checkpoint as dcp
    if isinstance(e, dcp.api.CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    first = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:200]
    return ValueError(f"{folder}: not readable FSDP shards (truncated or corrupt?): {type(e).__name__}"
                      f"{': ' + first if first else ''}")


class _ShardsMetadataUnpickler(pickle.Unpickler):
    """DCP's .metadata file is a pickle (torch.load's weights_only does not read it): this unpickler builds only the
    records DCP writes there -- its own dataclasses and enums, torch.Size, dtypes, layouts, paths -- and refuses any
    other callable before importing or calling it."""
    DCP = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")

    def find_class(self, module, name):
        if module in self.DCP or (module, name) in (("torch", "Size"), ("torch.serialization", "_get_layout"),
                                                      ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")):
            obj = super().find_class(module, name)
            if module not in self.DCP or dataclasses.is_dataclass(obj) or (
                    isinstance(obj, type) and issubclass(obj, enum.Enum)):
                return obj
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} has no place in a checkpoint's metadata")


def check_shards_metadata(folder):
    """Read a DCP folder's .metadata with _ShardsMetadataUnpickler, so that DCP's own reader (pickle.load) meets only
    what it let through, and check that it lists tensors only: DCP unpickles any other entry it loads in full
    (train.py writes none)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    with open(os.path.join(folder, ".metadata"), "rb") as f:
        entries = getattr(_ShardsMetadataUnpickler(f).load(), "state_dict_metadata", None)
    if not isinstance(entries, dict) or not all(isinstance(m, TensorStorageMetadata) for m in entries.values()):
        raise ValueError(f"{folder}: its .metadata lists other entries than tensors, which train.py never writes")


def model_from_checkpoint(ckpt, device="cpu"):
    """Build the model described by ckpt["model_config"] and load ckpt["model"] into it."""
    if "model_config" not in ckpt or "model" not in ckpt:
        raise ValueError("model_from_checkpoint: checkpoint needs 'model' and 'model_config' entries")
    model = build_model(ckpt["model_config"])
    load_state_dict_checked(model, unwrapped_state_dict(ckpt["model"]))
    return model.to(device)


def load_model(ckpt_path=None, init_from=None, device="cpu"):
    """The model of a train.py checkpoint (--ckpt) or of released GPT-2 weights (--init_from) -> (model, ckpt).
    For --init_from, ckpt is {"tokenizer": "gpt2"}: GPT-2's own. Any problem is one ValueError naming the flag.
    sample.py, hellaswag.py, lambada.py and eval.py load through this."""
    if init_from:
        try:
            return GPT.from_pretrained(init_from).to(device), {"tokenizer": "gpt2"}
        except Exception as e:  # an unknown name, the hub offline, a broken folder: all end the same way
            raise ValueError(f"--init_from {init_from}: cannot load GPT-2 weights ({e})") from None
    if not os.path.exists(ckpt_path):
        raise ValueError(f"--ckpt {ckpt_path}: no such checkpoint (train one with `python train.py`, or use "
                         f"--init_from=gpt2)")
    try:
        ckpt = read_checkpoint(ckpt_path)   # on the CPU: only the weights go to the device
    except ValueError as e:
        raise ValueError(f"--ckpt {e}") from None
    if "model_config" not in ckpt or "model" not in ckpt:
        raise ValueError(f"--ckpt {ckpt_path}: not a train.py checkpoint (no model / model_config)")
    try:
        return model_from_checkpoint(ckpt, device), ckpt
    except ValueError as e:
        raise ValueError(f"--ckpt {ckpt_path}: {e}") from None


def describe(model):
    """'llama, 1.28M parameters': what a script says it loaded."""
    return f"{model.model_config()['arch']}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters"


def unwrapped_state_dict(state):
    """Keys without the prefixes that torch.compile (_orig_mod.) and DDP (module.) wrappers add, in any order."""
    out = {}
    for key, value in state.items():
        while key.startswith(("_orig_mod.", "module.")):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def load_state_dict_checked(model, state):
    """load_state_dict with one clear line for another architecture or another shape."""
    expected = model.state_dict()
    arch = model.model_config()["arch"]
    other = "gpt2" if arch == "llama" else "llama"
    markers = {"llama": "token_embeddings.weight", "gpt2": "transformer.wte.weight"}
    if markers[arch] not in state and markers[other] in state:
        raise ValueError(f"state dict holds a {other} model, but the model is {arch}")
    missing = [k for k in expected if k not in state and not (arch == "gpt2" and k == "lm_head.weight")]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise ValueError(f"state dict does not match the {arch} model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise ValueError(f"state dict {key}: shape {tuple(value.shape)}, model expects "
                             f"{tuple(expected[key].shape)}")
    model.load_state_dict(state, strict=arch != "gpt2" or "lm_head.weight" in state)


def logits(model, idx):
    """Logits (B, T, vocab) of either architecture: GPT returns (logits, loss), TransformerLM the logits."""
    out = model(idx)
    return out[0] if isinstance(out, tuple) else out


def lm_loss(model, idx, targets, arch=None):
    """Mean next-token cross-entropy for either architecture, by calling the (possibly wrapped) module."""
    arch = arch or unwrap(model).model_config()["arch"]
    if arch == "gpt2":
        return model(idx, targets)[1]
    return cross_entropy(model(idx), targets)
