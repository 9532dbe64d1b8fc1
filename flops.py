"""
Parameter, FLOP and memory accounting for both Transformer variants, and MFU.

    python flops.py --model=gpt2-xl                       # the reference figures (Llama-style, d_ff 4288)
    python flops.py --model=gpt2-xl --context 1024 16384  # forward FLOPs at several context lengths
    python flops.py --model=gpt2 --arch=gpt2              # the real GPT-2 124M architecture
    python flops.py --model=tinystories --gpu_mem=24      # largest batch for a 24 GB card
    python flops.py --d_model=512 --num_layers=8 --num_heads=8 --vocab_size=10000 --context_length=256
    python flops.py --ckpt=out/ckpt.pt                    # the shape stored in a checkpoint
    python flops.py --model=gpt2-xl --gpus=8 --fsdp --activation_checkpointing --gpu_mem=80   # memory per GPU

Conventions (the ones that reproduce the reference figures exactly):
* FLOPs count matrix multiplies only, 2 per multiply-add. Norms, softmax, activations, RoPE and the
  residual adds are left out (O(T*d), softmax O(h*T^2): below 1% at these shapes).
* Attention scores (Q K^T) and the weighted sum (P V) are counted over the full T x T square, as a plain
  matmul computes them; a causal flash kernel skips the masked half, so its real work is a bit lower.
* Training = 3 x forward (the backward pass is two matmuls per forward matmul: input and weight grads).
* Memory: fp32 parameters, gradients and AdamW's two moments (16 bytes per parameter), plus fp32
  activations per layer of 8*T*d + 4*T*d_ff + 2*h*T^2 floats (SwiGLU; 2*T*d_ff for the SiLU / GELU FFN)
  and T*d + 2*T*V at the end (per sequence).
  GB means 1e9 bytes.
* --fsdp (over --gpus=N): the 16 bytes per parameter are those of the shards a GPU holds (FSDP2 splits every
  parameter on dim 0: ceil(rows / N) rows on rank 0, the most), plus the bf16 parameters CUDA's mixed-precision
  policy all-gathers: the root group (embeddings, final norm, head) and two blocks at a time.
  --activation_checkpointing: each block keeps only its input (T*d per layer) and one block's activations exist
  at a time, in its recomputation; the head's are kept as before. (docs/DECISIONS.md: Accounting.)
`mfu` (through `forward_flops`, `train_flops_per_token` and `peak_flops`) is what train.py uses for
its MFU column, so this file is the single source of truth for the accounting.
"""
import argparse
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

import torch

import model as model_lib

# -----------------------------------------------------------------------------
# the model itself: parameters and matmul FLOPs are counted on it, so any field of model.py's configs (an
# ablation that adds or removes a layer) is counted as the model builds it, with no edit here

def _model(cfg):
    """The model a model_config() dict describes, built on the meta device: shapes only, no memory, no time."""
    if not isinstance(cfg, dict):
        raise ValueError(f"flops.py: expected a model_config() dict, got {type(cfg).__name__}")
    with torch.device("meta"):
        return model_lib.build_model(cfg)


def _shape(cfg):
    return _sizes(_model(cfg))


def _sizes(m):
    """The few sizes the analytic parts (attention FLOPs, activation memory) need, from either architecture."""
    c = m.config
    if isinstance(c, model_lib.GPTConfig):
        return dict(arch="gpt2", V=c.vocab_size, V_pad=m.padded_vocab_size, T_max=c.block_size, d=c.n_embd,
                    L=c.n_layer, h=c.n_head, d_ff=4 * c.n_embd, ffn_type="gelu", norm=True, tied=True)
    return dict(arch="llama", V=c.vocab_size, V_pad=c.vocab_size, T_max=c.context_length, d=c.d_model,
                L=c.num_layers, h=c.num_heads, d_ff=c.d_ff, ffn_type=c.ffn_type, norm=not c.remove_rmsnorm,
                tied=c.tie_embeddings)


# parameter names -> the component they count in (the first fragment found in the name wins)
COMPONENTS = (("token_embeddings", "embedding"), ("wte", "embedding"), ("wpe", "position"), ("attn", "attention"),
              ("ffn", "ffn"), ("mlp", "ffn"), ("ln", "norm"), ("lm_head", "lm_head"))


def _component(name):
    parts = name.split(".")
    return next((comp for frag, comp in COMPONENTS if any(p.startswith(frag) for p in parts)), "other")


def count_params(cfg):
    """Parameters by component; 'total' equals sum(p.numel() for p in model.parameters()) (tied weights once:
    GPT-2's lm_head is its wte, counted as the embedding)."""
    p = dict(embedding=0, position=0, attention=0, ffn=0, norm=0, lm_head=0, other=0)
    for name, param in _model(cfg).named_parameters():
        p[_component(name)] += param.numel()
    p["total"] = sum(p.values())
    return p


# -----------------------------------------------------------------------------
# FLOPs

def _matmul_key(name):
    """Which forward_flops entry a linear layer's product counts in."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("q_proj", "k_proj", "v_proj", "lm_head"):
        return leaf
    if leaf == "c_attn":
        return "qkv"   # GPT-2's fused Q, K, V: a third each
    if _component(name) == "attention":
        return "o_proj"   # output_proj, GPT-2's attn.c_proj
    return "ffn" if _component(name) == "ffn" else "other"


def forward_flops(cfg, context_length, batch_size=1):
    """Matmul FLOPs of one forward pass over `batch_size` sequences of `context_length` tokens, by component:
    2 per multiply-add of every linear layer the model holds, plus the attention products Q K^T and P V."""
    m = _model(cfg)
    s, T = _sizes(m), context_length * batch_size
    f = dict(q_proj=0, k_proj=0, v_proj=0, o_proj=0,
             # per head: (T x d_head) @ (d_head x T), summed over heads that is 2*T*T*d; the same for P @ V
             attn_scores=s["L"] * 2 * T * context_length * s["d"], attn_values=s["L"] * 2 * T * context_length * s["d"],
             ffn=0, lm_head=0, other=0)
    for name, module in m.named_modules():
        if isinstance(module, (model_lib.Linear, torch.nn.Linear)):
            key, n = _matmul_key(name), 2 * T * module.weight.numel()
            for k in (("q_proj", "k_proj", "v_proj") if key == "qkv" else (key,)):
                f[k] += n // 3 if key == "qkv" else n
    f["total"] = sum(f.values())
    return f


def train_flops_per_token(cfg, context_length):
    """Training FLOPs per token (forward + backward = 3 x forward), attention included."""
    return 3 * forward_flops(cfg, context_length)["total"] / context_length


# -----------------------------------------------------------------------------
# memory: per GPU, b + a * batch, each a sum of named terms

def _blocks(m):
    """The model's Transformer blocks (Llama's layers, GPT-2's transformer.h): what FSDP shards as one unit each
    and activation checkpointing recomputes."""
    return next(mod for mod in m.modules() if isinstance(mod, torch.nn.ModuleList))


def shard_numel(cfg, world_size=1, rank=0):
    """Parameters that rank `rank` of `world_size` holds (tied weights once). FSDP2 (fully_shard) splits every
    parameter on dim 0 as torch.chunk does: ceil(rows / world_size) rows per rank, the last ranks fewer or none, so
    rank 0 holds the most (the figure per GPU). world_size 1: all of them."""
    n = 0
    for p in _model(cfg).parameters():
        rows = p.shape[0] if p.dim() else 1
        per_rank = -(-rows // world_size)
        n += max(0, min(per_rank, rows - rank * per_rank)) * (p.numel() // rows)
    return n


def gathered_numel(cfg):
    """Parameters FSDP holds whole besides the shards: the block that runs and the next one, whose all-gather is
    prefetched (the two largest blocks), and the root group (embeddings, final norm, head), which stays gathered
    from the start of the forward to the end of the backward."""
    m = _model(cfg)
    blocks = _blocks(m)
    in_blocks = {id(p) for p in blocks.parameters()}
    root = sum(p.numel() for p in m.parameters() if id(p) not in in_blocks)
    return root + sum(sorted(sum(p.numel() for p in b.parameters()) for b in blocks)[-2:])


def activation_terms(cfg, context_length, checkpointing=False):
    """Activations kept for the backward pass, in floats per sequence, by what keeps them (the spec's accounting).

    Per layer: 8*T*d (two norm inputs, Q, K, V, the weighted sum, the output projection, the FFN output),
    T*d_ff per FFN intermediate (SwiGLU keeps w1 x, silu(w1 x), w3 x and their product: 4; SiLU/GELU: 2; ReLU^2:
    2, relu(w1 x) and its square, as ReLU's backward needs only its output),
    2*h*T^2 (attention scores and their softmax). At the end (the head) T*d (final norm) and 2*T*V (logits,
    softmax). With activation checkpointing each block keeps only its input (T*d) and recomputes the rest in the
    backward, one block at a time: L*T*d + one layer's activations + the head.
    """
    s = _shape(cfg)
    T, d, h, V = context_length, s["d"], s["h"], s["V_pad"]
    ffn_intermediates = 4 if s["ffn_type"] == "swiglu" else 2
    per_layer = 8 * T * d + ffn_intermediates * T * s["d_ff"] + 2 * h * T * T
    final_norm = T * d
    if not s["norm"]:  # remove_rmsnorm: no norm inputs to keep, ln_final's included
        per_layer, final_norm = per_layer - 2 * T * d, 0
    head = final_norm + 2 * T * V
    if checkpointing:
        return dict(block_inputs=s["L"] * T * d, recomputed_block=per_layer, head=head)
    return dict(blocks=s["L"] * per_layer, head=head)


def activation_floats(cfg, context_length, checkpointing=False):
    """Activations kept for the backward pass, in floats per sequence: the sum of activation_terms."""
    return sum(activation_terms(cfg, context_length, checkpointing).values())


def memory_terms(cfg, context_length, world_size=1, fsdp=False, checkpointing=False, bytes_per_float=4):
    """Training memory per GPU as (b, a): dicts of named terms in bytes, total = sum(b) + sum(a) * batch_size.

    b: "state", the parameters, gradients and AdamW's m and v in fp32 (4 copies of every parameter the GPU holds:
    all of them, or under FSDP rank 0's shards, the largest); under FSDP also "gathered", the bf16 copy that
    CUDA's mixed-precision policy all-gathers (gathered_numel; fp32 on CPU, twice this). a: the activations in
    fp32 (activation_terms; under bf16 autocast or that policy most of them are bf16, about half).
    """
    b = dict(state=4 * bytes_per_float * shard_numel(cfg, world_size if fsdp else 1))
    if fsdp:
        b["gathered"] = 2 * gathered_numel(cfg)
    a = {k: bytes_per_float * v for k, v in activation_terms(cfg, context_length, checkpointing).items()}
    return b, a


def memory_bytes(cfg, context_length, bytes_per_float=4, **parallelism):
    """Training memory as (fixed, per_sequence) bytes: total = fixed + per_sequence * batch_size.

    Without `parallelism` (memory_terms' world_size, fsdp, checkpointing): fixed = parameters + gradients + AdamW
    m and v (4 copies of every parameter, fp32), per_sequence = the activations.
    """
    b, a = memory_terms(cfg, context_length, bytes_per_float=bytes_per_float, **parallelism)
    return sum(b.values()), sum(a.values())


def max_batch_size(cfg, context_length, gpu_mem_gb, **parallelism):
    fixed, per_seq = memory_bytes(cfg, context_length, **parallelism)
    return max(0, math.floor((gpu_mem_gb * 1e9 - fixed) / per_seq))


# -----------------------------------------------------------------------------
# peak FLOP/s and MFU

# dense (no sparsity) peak FLOP/s from the vendors' datasheets: (bf16/fp16 tensor, tf32 tensor, fp32).
# Matched in torch.cuda.get_device_name() as a name not followed by another digit (L4 is not L40), first match
# wins, so longer names come first.
GPU_PEAK = {
    "GB200": (2.5e15, 1.25e15, 80e12),        # the Grace-Blackwell module's GPU: higher clocks than B200
    "B200": (2.25e15, 1.125e15, 75e12),
    "H200 NVL": (835e12, 417.5e12, 60e12),
    "H200": (989.4e12, 494.7e12, 66.9e12),
    "H100 PCIe": (756e12, 378e12, 51.2e12),
    "H100 NVL": (835e12, 417.5e12, 60e12),
    "H100": (989.4e12, 494.7e12, 66.9e12),   # SXM
    "H800 PCIe": (756e12, 378e12, 51.2e12),
    "H800": (989.4e12, 494.7e12, 66.9e12),   # the H100 SXM chip with less interconnect
    "H20": (148e12, 74e12, 44e12),
    "A100": (312e12, 156e12, 19.5e12),
    "A800": (312e12, 156e12, 19.5e12),      # the A100 chip with less interconnect
    "A10": (125e12, 62.5e12, 31.2e12),      # also matches A10G (the same chip at lower clocks: an upper bound)
    "A40": (149.7e12, 74.8e12, 37.4e12),
    "L40S": (362e12, 183e12, 91.6e12),
    "L40": (181e12, 90.5e12, 90.5e12),
    "L4": (121e12, 60e12, 30.3e12),
    "RTX 4090": (165.2e12, 82.6e12, 82.6e12),
    "RTX 3090 Ti": (80e12, 40e12, 40e12),
    "RTX 3090": (71e12, 35.6e12, 35.6e12),
    "V100": (125e12, 15.7e12, 15.7e12),      # fp16 only; no bf16 or tf32 tensor cores
    "T4": (65e12, 8.1e12, 8.1e12),
}
_cpu_peak_cache = {}
CPU_PEAK_FILE = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "lmscratch" / "cpu_peak.json"


def _dtype_kind(dtype):
    name = str(dtype).replace("torch.", "").lower()
    if name in ("bf16", "bfloat16", "fp16", "float16", "half"):
        return 0
    if name in ("tf32",):
        return 1
    if name in ("fp32", "float32", "float"):
        # torch runs fp32 matmuls on TF32 tensor cores when allowed (train.py turns that on)
        return 1 if torch.get_float32_matmul_precision() != "highest" else 2
    raise ValueError(f"flops.py: unknown dtype {dtype!r} (expected bf16, fp16, tf32 or fp32)")


def _measure_cpu_peak(dtype_name, n=1024, repeats=10):
    """This CPU's matmul throughput now: the best of a few (n x n) @ (n x n) products at torch's thread count."""
    dtype = torch.bfloat16 if dtype_name in ("bfloat16", "bf16") else torch.float32
    gen = torch.Generator().manual_seed(0)   # its own generator: measuring must not move the global RNG (resume)
    a = torch.randn(n, n, dtype=dtype, generator=gen)
    b = torch.randn(n, n, dtype=dtype, generator=gen)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def cpu_name():
    """This machine's CPU model ("AMD EPYC", ...): /proc/cpuinfo's model name where there is one."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _cpu_key(dtype_name):
    """This machine's CPU, thread count and dtype: what a CPU peak holds for."""
    return f"{cpu_name()} | {torch.get_num_threads()} threads | {dtype_name}"


def _cpu_peak(dtype_name, at_least=0.0):
    """A CPU has no datasheet peak here: the best matmul throughput ever measured on this machine (kept in
    CPU_PEAK_FILE), never below `at_least`, what a run has just achieved. Measured once per process, it can be low
    when the machine is busy; the best over time (and within a process, over the runs themselves) keeps MFU at
    or below 100%."""
    key = _cpu_key(dtype_name)
    if key not in _cpu_peak_cache:
        try:
            saved = json.loads(CPU_PEAK_FILE.read_text()).get(key, 0.0)
        except (OSError, ValueError, AttributeError):
            saved = 0.0
        _cpu_peak_cache[key] = max(saved, _measure_cpu_peak(dtype_name))
        _save_cpu_peak(key, saved)
    _cpu_peak_cache[key] = max(_cpu_peak_cache[key], at_least)   # (for this process only: no run's figure is saved)
    return _cpu_peak_cache[key]


def _save_cpu_peak(key, saved):
    if _cpu_peak_cache[key] <= saved:
        return
    try:
        peaks = json.loads(CPU_PEAK_FILE.read_text()) if CPU_PEAK_FILE.is_file() else {}
        peaks = peaks if isinstance(peaks, dict) else {}
        peaks[key] = max(peaks.get(key, 0.0), _cpu_peak_cache[key])
        CPU_PEAK_FILE.parent.mkdir(parents=True, exist_ok=True)
        CPU_PEAK_FILE.write_text(json.dumps(peaks, indent=1) + "\n")
    except (OSError, ValueError):   # a read-only home: the process's own measurements still hold
        pass


def peak_flops(device, dtype):
    """Peak dense matmul FLOP/s of `device` ('cuda', 'cuda:0', a GPU name like 'H100', or 'cpu') in `dtype`."""
    name = str(device)
    if name.startswith("cpu"):
        key = str(dtype).replace("torch.", "").lower()
        return _cpu_peak("bfloat16" if key in ("bf16", "bfloat16") else "float32")
    if name.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(name))
    kind = _dtype_kind(dtype)
    for gpu, peaks in GPU_PEAK.items():   # most specific names first (dict order)
        if re.search(re.escape(gpu) + r"(?!\d)", name, re.IGNORECASE):
            return peaks[kind]
    raise ValueError(f"flops.py: no peak FLOP/s known for device {name!r}; known: {', '.join(GPU_PEAK)}")


def utilisation(flops_per_sec, device, dtype):
    """Achieved FLOP/s over the device's peak; on a CPU the peak is at least what was achieved (at most 1.0)."""
    peak = peak_flops(device, dtype)
    if str(device).startswith("cpu") and flops_per_sec > peak:   # the measured peak is below what a run just did
        key = str(dtype).replace("torch.", "").lower()
        peak = _cpu_peak("bfloat16" if key in ("bf16", "bfloat16") else "float32", flops_per_sec)
    return flops_per_sec / peak


def mfu(cfg, context_length, tokens_per_sec, device, dtype):
    """Model FLOPs utilisation: achieved training FLOP/s (3 x forward, attention included) over peak."""
    return utilisation(train_flops_per_token(cfg, context_length) * tokens_per_sec, device, dtype)


# -----------------------------------------------------------------------------
# presets and the CLI

# name: (num_layers, d_model, num_heads, context_length, vocab_size)
PRESETS = {
    "gpt2": (12, 768, 12, 1024, 50257),
    "gpt2-medium": (24, 1024, 16, 1024, 50257),
    "gpt2-large": (36, 1280, 20, 1024, 50257),
    "gpt2-xl": (48, 1600, 25, 1024, 50257),
    "tinystories": (4, 512, 16, 256, 10000),     # the spec's TinyStories baseline, d_ff 1344
}


def _num(x):
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:g}"


def _bytes(x):
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:g} bytes"


def _duration(seconds):
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# what each memory term holds, as report() prints it
MEMORY_TERMS = dict(
    state="params, grads, AdamW m and v: 16 bytes (fp32) a parameter",
    gathered="bf16 params all-gathered: the root group (embeddings, head) + 2 blocks",
    blocks="activations of the {L} blocks",
    block_inputs="block inputs, one kept per layer ({L} x T*d)",
    recomputed_block="one block's activations, recomputed in the backward",
    head="head: final norm input, logits and their softmax")


def _memory_report(cfg, T, gpu_mem, world_size=1, fsdp=False, checkpointing=False):
    """The training-memory lines of one context: a * batch + b, then (with --fsdp or --activation_checkpointing)
    each term of a and b and the precision they assume, and the largest batch."""
    b, a = memory_terms(cfg, T, world_size, fsdp, checkpointing)
    fixed, per_seq, n = sum(b.values()), sum(a.values()), count_params(cfg)["total"]
    digits = 2 if fixed >= 1e9 else 4
    gb = lambda x: f"{x / 1e9:.{digits}f}"
    bmax = max_batch_size(cfg, T, gpu_mem, world_size=world_size, fsdp=fsdp, checkpointing=checkpointing)
    if not (fsdp or checkpointing):   # the reference accounting, as the spec gives it
        return [f"training memory (fp32, AdamW), context {T:,}: {gb(per_seq)} * batch + {gb(fixed)} GB"
                f"  (params {gb(4 * n)} + grads {gb(4 * n)} + AdamW m, v {gb(8 * n)})",
                f"largest batch on {gpu_mem:g} GB: {bmax}"]
    how = [f"FSDP over {world_size} GPUs"] * fsdp + ["activation checkpointing"] * checkpointing
    L = _shape(cfg)["L"]
    out = [f"training memory per GPU (fp32, AdamW; {'; '.join(how)}), context {T:,}: "
           f"a * batch + b = {gb(per_seq)} * batch + {gb(fixed)} GB"]
    for letter, terms in (("b", b), ("a", a)):
        for key, value in terms.items():
            out.append(f"  {letter}  {MEMORY_TERMS[key].format(L=L):<72}{gb(value):>9} GB")
            if fsdp and key == "state":
                out.append(f"       rank 0's shards: ceil(rows / {world_size}) rows of every parameter "
                           f"(unpadded 16 N / {world_size} = {gb(16 * n / world_size)} GB)")
    out.append("  precision: fp32 params, grads, AdamW m, v and activations, as without these flags (bf16 compute "
               "keeps most activations in bf16: about half of a)")
    if fsdp:
        out.append("  under FSDP, CUDA's bf16 mixed-precision policy adds the all-gathered copy in b (without the "
                   "policy, as on CPU, that copy is fp32: twice)")
    out.append(f"largest batch on {gpu_mem:g} GB per GPU: {bmax}")
    return out


DEFAULT_GPUS = ("H100", "A100", "B200")


def report(cfg, contexts, gpu_mem=80.0, train_tokens=None, mfu_assumed=0.5, gpus=DEFAULT_GPUS,
           title=None, world_size=1, fsdp=False, checkpointing=False):
    """The printed tables, as one string: `title` (which model this is) first, then the shape line."""
    s = _shape(cfg)
    out = [title] if title else []
    p = count_params(cfg)
    n = p["total"]
    desc = (f"arch={s['arch']} layers={s['L']} d_model={s['d']} heads={s['h']} d_ff={s['d_ff']} ({s['ffn_type']}) "
            f"vocab={s['V_pad']} context={s['T_max']}")
    out.append(desc)
    out.append("")
    out.append(f"{'parameters':<22}{'count':>16}{'share':>8}")
    for k in ("embedding", "position", "attention", "ffn", "norm", "lm_head"):
        if p[k] or k in ("embedding", "lm_head"):
            note = " (tied)" if k == "lm_head" and s["tied"] else ""
            out.append(f"{k + note:<22}{p[k]:>16,}{100 * p[k] / n:>7.1f}%")
    out.append(f"{'total':<22}{n:>16,}   = {_num(n)} params, {_bytes(4 * n)} in fp32")

    n_matmul = n - p["embedding"] - p["position"] + (p["embedding"] if s["tied"] else 0)
    for T in contexts:
        f = forward_flops(cfg, T)
        tot = f["total"]
        blocks = tot - f["lm_head"]
        unit, div = ("TFLOPs", 1e12) if tot >= 1e12 else ("GFLOPs", 1e9)
        rows = [("Q/K/V/O projections", f["q_proj"] + f["k_proj"] + f["v_proj"] + f["o_proj"]),
                ("  Q, K, V (each)", f["q_proj"]), ("  O", f["o_proj"]),
                ("attention", f["attn_scores"] + f["attn_values"]),
                ("  scores Q K^T", f["attn_scores"]), ("  weighted sum P V", f["attn_values"]),
                ("FFN", f["ffn"]), ("LM head", f["lm_head"])]
        out.append("")
        out.append(f"forward FLOPs, context {T:,}, one sequence (matmuls only, 2 per multiply-add)")
        out.append(f"{'component':<22}{unit:>12}{'of total':>10}{'of blocks':>11}")
        for name, v in rows:
            of_blocks = f"{100 * v / blocks:>10.1f}%" if name != "LM head" else ""
            out.append(f"{name:<22}{v / div:>12.4f}{100 * v / tot:>9.1f}%{of_blocks}")
        out.append(f"{'total':<22}{tot / div:>12.4f}")
        per_tok = train_flops_per_token(cfg, T)
        out.append(f"training FLOPs per token: 3 x forward = {per_tok / 1e9:.3f} GFLOPs; "
                   f"6*N = {6 * n / 1e9:.3f} GFLOPs with N = all {_num(n)} params, "
                   f"{6 * n_matmul / 1e9:.3f} with N = the {_num(n_matmul)} in matmuls (no input embeddings)")

        out.extend(_memory_report(cfg, T, gpu_mem, world_size, fsdp, checkpointing))

    T = contexts[0]
    tokens = train_tokens if train_tokens else 20 * n
    total_train = train_flops_per_token(cfg, T) * tokens
    out.append("")
    out.append(f"time to train {_num(tokens)} tokens{' (20 x params, Chinchilla)' if not train_tokens else ''}"
               f" at context {T:,}: {total_train:.3e} FLOPs (6*N*D = {6 * n * tokens:.3e})")
    for g in gpus:
        peak = GPU_PEAK[g][0]
        secs = total_train / (mfu_assumed * peak * world_size)
        out.append(f"  {world_size} x {g:<6} bf16 peak {peak / 1e12:7.1f} TFLOP/s at {100 * mfu_assumed:.0f}% MFU: "
                   f"{_duration(secs)}")
    return "\n".join(out)


# OpenAI's names for the GPT-2 presets: at their shapes, --arch=llama is another model with another parameter count
OPENAI_NAMES = {"gpt2": "GPT-2 124M", "gpt2-medium": "GPT-2 Medium", "gpt2-large": "GPT-2 Large",
                "gpt2-xl": "GPT-2 XL"}


def _architecture(cfg):
    """What tells the architectures apart, in words."""
    if cfg.get("arch") == "gpt2":
        return "OpenAI's GPT-2 architecture (LayerNorm, GELU MLP, learned positions, tied head)"
    parts = ["no norm" if cfg.get("remove_rmsnorm") else "RMSNorm",
             {"swiglu": "SwiGLU", "silu": "SiLU FFN", "relu2": "ReLU^2 FFN"}.get(cfg.get("ffn_type"), "SwiGLU"),
             "no positions" if cfg.get("remove_rope") else "RoPE",
             "tied head" if cfg.get("tie_embeddings") else "untied head"]
    return f"the Llama architecture ({', '.join(parts)})"


def title(what, cfg, other=None, openai_name=None):
    """The report's first line: which model the figures are for and its parameter count; `other`, the same shape in
    the other architecture, gives that count too, so that nobody quotes one for the other (GPT-2 XL's shape is
    1.64B parameters in the Llama architecture, OpenAI's GPT-2 XL 1.56B)."""
    line = f"{what} in {_architecture(cfg)}: {_num(count_params(cfg)['total'])} parameters"
    if other is None:
        return line
    n_other = _num(count_params(other)["total"])
    if openai_name and cfg["arch"] == "gpt2":
        return f"{line}: OpenAI's {openai_name} (the Llama architecture makes this shape {n_other}: --arch=llama)"
    if openai_name:
        return f"{line}, not OpenAI's {openai_name} ({n_other}: --arch=gpt2)"
    return f"{line} ({n_other} with --arch={other['arch']})"


def _contexts(values):
    out = []
    for v in values:
        for part in str(v).split(","):
            if part.strip():
                if not part.strip().isdigit() or int(part) <= 0:
                    raise ValueError(f"flops.py: --context: expected positive integers, e.g. --context 1024 16384, "
                                     f"got {part!r}")
                out.append(int(part))
    return out


def _load_config(path):
    """The model_config of a train.py checkpoint; any problem -> SystemExit naming --ckpt."""
    try:
        ckpt = model_lib.read_checkpoint(path)
    except FileNotFoundError:
        raise SystemExit(f"flops.py: --ckpt {path}: no such file") from None
    except ValueError as e:
        raise SystemExit(f"flops.py: --ckpt {e}") from None
    if "model_config" not in ckpt:
        raise SystemExit(f"flops.py: --ckpt {path}: no 'model_config' in the checkpoint")
    return ckpt["model_config"]


def main():
    parser = argparse.ArgumentParser(description="Parameter, FLOP, memory and training-time accounting.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="gpt2-xl", help=f"preset shape: {', '.join(PRESETS)} (ignored with --ckpt)")
    parser.add_argument("--arch", default=None, choices=["llama", "gpt2"],
                        help="llama (RMSNorm/SwiGLU/RoPE, untied head: the spec's reference; None = llama) or gpt2 "
                             "(the real GPT-2)")
    parser.add_argument("--ckpt", type=os.path.expanduser, default=None,
                        help="read the shape from this checkpoint's model_config instead")
    parser.add_argument("--num_layers", "--n_layer", dest="num_layers", type=int, default=None, help="override layers")
    parser.add_argument("--d_model", "--n_embd", dest="d_model", type=int, default=None, help="override d_model")
    parser.add_argument("--num_heads", "--n_head", dest="num_heads", type=int, default=None, help="override heads")
    parser.add_argument("--context_length", "--block_size", dest="context_length", type=int, default=None,
                        help="override the model's context length (also the default --context)")
    parser.add_argument("--vocab_size", type=int, default=None, help="override vocabulary size")
    parser.add_argument("--d_ff", type=int, default=None,
                        help="override FFN width (llama; None = 8/3*d rounded to 64, at least 64, for swiglu, "
                             "4*d for silu and relu2)")
    parser.add_argument("--ffn_type", default=None, choices=["swiglu", "silu", "relu2"],
                        help="llama FFN type, as train.py's (None = swiglu)")
    parser.add_argument("--pad_vocab_to_multiple_of", type=int, default=None, help="gpt2 vocabulary padding (None = 1)")
    parser.add_argument("--context", nargs="+", default=None,
                        help="context lengths to report, e.g. --context 1024 16384 (None = the model's)")
    parser.add_argument("--gpu_mem", type=float, default=80.0, help="GPU memory budget in GB for the largest batch")
    parser.add_argument("--train_tokens", type=float, default=None, help="tokens to train on (None = 20 x params)")
    parser.add_argument("--mfu", type=float, default=0.5, help="assumed MFU for the training-time estimate")
    parser.add_argument("--gpus", default=",".join(DEFAULT_GPUS),
                        help=f"how many GPUs (the world size: memory per GPU under --fsdp, the time to train) and/or "
                             f"which, for the time estimate, e.g. --gpus=8 or --gpus=8,H100: {', '.join(GPU_PEAK)}")
    switch = dict(nargs="?", const="true", default="false", type=str.lower, choices=["true", "false"])
    parser.add_argument("--fsdp", **switch,
                        help="memory per GPU under FSDP (train.py --fsdp): parameters, gradients and AdamW state "
                             "sharded over the --gpus, plus the bf16 copy of the blocks being run")
    parser.add_argument("--activation_checkpointing", **switch,
                        help="memory with each block's activations recomputed in the backward (train.py "
                             "--activation_checkpointing): one input kept per block, one block's activations at a time")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON instead of tables")
    # one line, no usage block (bpe.one_line_errors: a copy, as this file imports no bpe.py)
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: {message} (see --help)\n")
    args = parser.parse_args()

    for flag in ("num_layers", "d_model", "num_heads", "context_length", "vocab_size", "d_ff",
                 "pad_vocab_to_multiple_of"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise SystemExit(f"flops.py: --{flag} must be a positive integer, got {value}")
    if not 0 < args.gpu_mem < math.inf:
        raise SystemExit(f"flops.py: --gpu_mem must be a positive number of GB, got {args.gpu_mem:g}")
    if args.train_tokens is not None and not 1 <= args.train_tokens < math.inf:
        raise SystemExit(f"flops.py: --train_tokens must be a finite number >= 1, got {args.train_tokens:g}")
    if not 0 < args.mfu <= 1:
        raise SystemExit(f"flops.py: --mfu must be in (0, 1], got {args.mfu}")
    shape_flags = ("arch", "num_layers", "d_model", "num_heads", "context_length", "vocab_size", "d_ff", "ffn_type",
                   "pad_vocab_to_multiple_of")
    given = [f"--{flag}" for flag in shape_flags if getattr(args, flag) is not None]
    if args.ckpt and given:
        raise SystemExit(f"flops.py: --ckpt reads the shape from the checkpoint: leave out {', '.join(given)} "
                         "(or --ckpt, to describe the shape with flags)")
    arch = args.arch or "llama"
    other = [f"--{flag}" for flag in ("d_ff", "ffn_type") if arch == "gpt2" and getattr(args, flag) is not None] + \
        (["--pad_vocab_to_multiple_of"] if arch == "llama" and args.pad_vocab_to_multiple_of is not None else [])
    if other:   # each shape flag belongs to one architecture: the other would ignore it
        raise SystemExit(f"flops.py: {', '.join(other)} does not apply to --arch={arch}"
                         f"{'' if args.arch else ' (the default)'}")
    world_size, gpus = _gpus(args.gpus)
    fsdp, checkpointing = args.fsdp == "true", args.activation_checkpointing == "true"
    if fsdp and world_size < 2:
        raise SystemExit(f"flops.py: --fsdp shards over the GPUs: say how many with --gpus, e.g. --gpus=8 "
                         f"(got {world_size})")
    if args.ckpt:
        cfg, other, openai_name = _load_config(args.ckpt), None, None
        what = f"checkpoint {args.ckpt}"
    else:
        if args.model not in PRESETS:
            raise SystemExit(f"flops.py: --model {args.model!r}: expected one of {', '.join(PRESETS)}")
        try:
            cfg = _preset_config(args, arch)
        except ValueError as e:
            raise SystemExit(f"flops.py: {e}") from None
        try:   # the same shape in the other architecture, for the first line's comparison
            other = _preset_config(args, "gpt2" if arch == "llama" else "llama")
        except ValueError:   # (GPT-2 has no RoPE: an odd head width is fine there)
            other = None
        overrides = [f"--{flag}={getattr(args, flag)}" for flag in shape_flags[1:] if getattr(args, flag) is not None]
        openai_name = None if overrides else OPENAI_NAMES.get(args.model)
        what = " ".join([f"--model={args.model}", *overrides]) + (f": {openai_name}'s shape" if openai_name else "")
    try:
        s = _shape(cfg)
        contexts = _contexts(args.context) if args.context else [s["T_max"]]
        head = title(what, cfg, other, openai_name)
    except ValueError as e:
        raise SystemExit(str(e))
    if not contexts or min(contexts) <= 0:
        raise SystemExit("flops.py: --context: expected positive integers, e.g. --context 1024 16384")

    parallelism = dict(world_size=world_size, fsdp=fsdp, checkpointing=checkpointing)
    if args.json:
        result = dict(title=head, config=cfg, params=count_params(cfg), parallelism=parallelism, contexts={})
        for T in contexts:
            b, a = memory_terms(cfg, T, **parallelism)
            result["contexts"][T] = dict(forward_flops=forward_flops(cfg, T),
                                         train_flops_per_token=train_flops_per_token(cfg, T),
                                         memory_fixed_bytes=sum(b.values()),
                                         memory_per_sequence_bytes=sum(a.values()),
                                         memory_fixed_terms=b, memory_per_sequence_terms=a,
                                         max_batch_size=max_batch_size(cfg, T, args.gpu_mem, **parallelism))
        print(json.dumps(result, indent=2))
    else:
        print(report(cfg, contexts, args.gpu_mem, args.train_tokens and int(args.train_tokens), args.mfu, gpus,
                     head, **parallelism))


def _gpus(value):
    """--gpus: (the world size, the GPU names for the time estimate): a count, names, or both ("8,H100")."""
    parts = [g.strip() for g in value.split(",") if g.strip()]
    counts, names = [g for g in parts if g.isdigit()], [g for g in parts if not g.isdigit()]
    for g in names:
        if g not in GPU_PEAK:
            raise SystemExit(f"flops.py: --gpus: unknown GPU {g!r}; known: {', '.join(GPU_PEAK)} (or a count, "
                             f"e.g. --gpus=8)")
    if len(counts) > 1 or (counts and int(counts[0]) < 1):
        raise SystemExit(f"flops.py: --gpus: expected one count of GPUs >= 1 (and GPU names), got {value!r}")
    return int(counts[0]) if counts else 1, names or list(DEFAULT_GPUS)


def _preset_config(args, arch):
    """The model_config of --model's preset in `arch` with the shape flags' overrides; a shape the model cannot
    have -> ValueError naming the flags, as train.py does."""
    L, d, h, T, V = PRESETS[args.model]
    pick = lambda value, preset: preset if value is None else value  # an override of 0 was rejected above
    d, h = pick(args.d_model, d), pick(args.num_heads, h)
    named = lambda flag, value: f"--{flag}={value}" + ("" if getattr(args, flag) is not None else
                                                        f" (--model={args.model}'s)")
    model_lib.check_heads(d, h, rope=arch == "llama", names=(named("d_model", d), named("num_heads", h)))
    flags = dict(num_layers=pick(args.num_layers, L), d_model=d, num_heads=h, d_ff=args.d_ff or 0,
                 context_length=pick(args.context_length, T), ffn_type=args.ffn_type or "swiglu")
    return model_lib.config_from_flags(arch, flags, pick(args.vocab_size, V), args.pad_vocab_to_multiple_of or 1)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:   # the reader went away (`| head`): stop quietly, as cat does (bpe.run_main's copy)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's last flush then fails silently
        sys.exit(1)
