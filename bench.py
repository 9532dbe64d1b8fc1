"""Side-by-side benchmarks: each section times our code and its peer in the same process (interleaved
repeats, medians), and prints the ratio. Never run it while tests or another benchmark run.

    python bench.py tokenizer        # bpe.py vs HF tokenizers (training) and tiktoken (encoding)
    python bench.py model            # train step (fp32, bf16) and generation vs transformers
    python bench.py train            # whole loop vs model-only step; the data loader alone
    python bench.py dtype            # the loop at float32 vs bfloat16 on this CPU: what --dtype=auto should pick
    python bench.py loss             # the Llama's loss in chunks vs the head then cross_entropy (CPU)
    python bench.py memory           # what --fsdp and --activation_checkpointing save (CPU, 2 gloo processes)
    python bench.py sample           # sample.generate vs transformers generate
    python bench.py gpu              # on a GPU: every CUDA path checked, then tokens/s and MFU
    python bench.py speedrun         # 5-minute training runs: ours vs HF tokenizers + LlamaForCausalLM + AdamW
    python bench.py SECTION --help   # that section's flags
"""
from contextlib import nullcontext
from pathlib import Path
import argparse
import atexit
import json
import math
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import bpe
import flops
import model as M
import numpy as np
import runs
import torch
import torch.nn.functional as F
import train


# -----------------------------------------------------------------------------
# tokenizer: bpe.py vs Hugging Face tokenizers (training) and tiktoken (encoding)
# Tokenizer benchmark: bpe.py vs Hugging Face `tokenizers` (training) and tiktoken (encoding).
#
#     python bench.py tokenizer                       # everything, 3 interleaved repeats
#     python bench.py tokenizer --parts train --repeats 5 --texts a.txt:10000,b.txt:500 --mix20 /tmp/mix20.txt
#
# The texts: --texts (default: the speedrun's TinyStories text, fetched by fineweb.tinystories_head), and --mix20, a
# ~20 MB corpus made from the --texts files when absent. GPT-2's files for encoding are tiktoken's own cached copy
# (TIKTOKEN_CACHE_DIR, else tiktoken's default folder), fetched by tiktoken once.
#
# Training runs in a fresh process per repeat (ours, HF, ours, HF, ...) so that each peak RSS is that
# run's own. HF: its process (threads), VmHWM. Ours: the larger of the two phases, pre-tokenisation (the
# main process's peak + the sum of the worker processes' peaks, pages shared after fork counted in each)
# and merging (the main process alone).
# Encoding runs in this process, interleaved, medians reported.

ROOT = Path(__file__).resolve().parent
MIX_BYTES = 20_000_000


def _tok_gpt2_files():
    """GPT-2's encoder.json and vocab.bpe as tiktoken caches them (named by the SHA-1 of their URL), fetched by
    tiktoken the first time (online), in TIKTOKEN_CACHE_DIR or tiktoken's default folder."""
    import tiktoken
    tiktoken.get_encoding("gpt2")
    cache = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
                 or Path(tempfile.gettempdir()) / "data-gym-cache")
    files = cache / "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6", cache / "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"
    if not all(f.is_file() for f in files):
        raise SystemExit(f"bench.py: GPT-2's encoder.json / vocab.bpe are not in tiktoken's cache {cache}: set "
                         "TIKTOKEN_CACHE_DIR to a folder tiktoken may fill")
    return files

# one training run in a fresh interpreter; prints {"seconds", "peak_mib", "vocab"} as JSON
_TOK_TRAIN_OURS = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import bpe
stats = {}
t0 = time.perf_counter()
vocab, merges = bpe.train_bpe(sys.argv[2], int(sys.argv[3]), ["<|endoftext|>"], stats=stats)
dt = time.perf_counter() - t0
# all processes: max(pre-tokenisation: main + sum of the workers' peaks, merging: main), see train_bpe
print(json.dumps({"seconds": dt, "peak_mib": stats["peak_rss_kb"] / 1024, "vocab": len(vocab),
                  "pretokenize_s": stats["pretokenize_s"], "merge_s": stats["merge_s"]}))
"""
_TOK_TRAIN_HF = r"""
import json, resource, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2 split regex
trainer = trainers.BpeTrainer(vocab_size=int(sys.argv[3]), special_tokens=["<|endoftext|>"], show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
t0 = time.perf_counter()
tok.train([sys.argv[2]], trainer)
dt = time.perf_counter() - t0
# this process only (ru_maxrss keeps the forking parent's peak across exec)
own = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024
print(json.dumps({"seconds": dt, "peak_mib": own, "vocab": tok.get_vocab_size()}))
"""


def _tok_run_train(script, path, vocab):
    r = subprocess.run([sys.executable, "-c", script, str(ROOT), str(path), str(vocab)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench: training subprocess failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _tok_median(xs):
    return statistics.median(xs)


def _tok_bench_train(args, cases):
    print(f"\n## training (fresh process per run, {args.repeats} interleaved repeats, medians)")
    print("| input | vocab | ours s | HF s | ours/HF time | ours MiB | HF MiB | ours/HF memory | "
          "ours split (pre-tok + merge) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path, vocab in cases:
        ours, hf = [], []
        for _ in range(args.repeats):
            ours.append(_tok_run_train(_TOK_TRAIN_OURS, path, vocab))
            hf.append(_tok_run_train(_TOK_TRAIN_HF, path, vocab))
        o_s, h_s = _tok_median([r["seconds"] for r in ours]), _tok_median([r["seconds"] for r in hf])
        o_m, h_m = _tok_median([r["peak_mib"] for r in ours]), _tok_median([r["peak_mib"] for r in hf])
        split = (f"{_tok_median([r['pretokenize_s'] for r in ours]):.2f} + "
                 f"{_tok_median([r['merge_s'] for r in ours]):.2f}")
        size = os.path.getsize(path) / 1e6
        print(f"| {Path(path).name} ({size:.1f} MB) | {vocab} | {o_s:.2f} | {h_s:.2f} | {o_s / h_s:.2f}x | "
              f"{o_m:.0f} | {h_m:.0f} | {o_m / h_m:.2f}x | {split} |", flush=True)


def _tok_bench_encode(args, text_path):
    import tiktoken
    import bpe
    gpt2_vocab, gpt2_merges = _tok_gpt2_files()
    text = Path(text_path).read_text(encoding="utf-8")
    mb = len(text.encode()) / 1e6
    enc = tiktoken.get_encoding("gpt2")
    print(f"\n## encode, single process, GPT-2 files, {Path(text_path).name} ({mb:.1f} MB), "
          f"{args.repeats} interleaved repeats")
    cold, warm, tk, hf_t = [], [], [], []
    hf = None
    try:
        from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers
        hf = HFTokenizer(models.BPE.from_file(str(gpt2_vocab), str(gpt2_merges)))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.add_special_tokens(["<|endoftext|>"])   # else each separator is 5 ordinary tokens
    except Exception as e:  # the peer is optional
        print(f"(HF tokenizers unavailable: {e})")
    for _ in range(args.repeats):
        tok = bpe.Tokenizer.from_files(gpt2_vocab, gpt2_merges, ["<|endoftext|>"])  # fresh: empty cache
        t0 = time.perf_counter(); ids = tok.encode(text); t1 = time.perf_counter()
        tok.encode(text); t2 = time.perf_counter()
        ref = enc.encode(text, allowed_special="all"); t3 = time.perf_counter()
        cold.append(mb / (t1 - t0)); warm.append(mb / (t2 - t1)); tk.append(mb / (t3 - t2))
        if hf is not None and args.hf_encode:
            t4 = time.perf_counter(); hf_ids = hf.encode(text).ids; hf_t.append(mb / (time.perf_counter() - t4))
            assert hf_ids == ref, "HF tokenizers' ids differ from tiktoken"
        assert ids == ref, "ids differ from tiktoken"
    print("| encoder | MB/s | vs tiktoken |\n|---|---|---|")
    t = _tok_median(tk)
    print(f"| bpe.py, fresh cache | {_tok_median(cold):.1f} | {_tok_median(cold) / t:.2f}x |")
    print(f"| bpe.py, warm cache | {_tok_median(warm):.1f} | {_tok_median(warm) / t:.2f}x |")
    print(f"| tiktoken | {t:.1f} | 1.00x |")
    if hf_t:
        print(f"| HF tokenizers (BPE.from_file + ByteLevel) | {_tok_median(hf_t):.1f} | {_tok_median(hf_t) / t:.2f}x |")
    print("(ids identical to tiktoken: checked)")


def _tok_bench_encode_file(args, text_path):
    import bpe
    import tempfile
    mb = os.path.getsize(text_path) / 1e6
    ncores = bpe._default_workers()
    print(f"\n## --encode (encode_file) on {Path(text_path).name} ({mb:.1f} MB), GPT-2 files, "
          f"{args.repeats} interleaved repeats")
    with tempfile.TemporaryDirectory() as d:
        bpe.Tokenizer.from_files(*_tok_gpt2_files(), ["<|endoftext|>"]).save_dir(Path(d) / "gpt2")
        res = {1: [], ncores: []}
        for _ in range(args.repeats):
            for w in res:
                meta = bpe.encode_file(text_path, str(Path(d) / "gpt2"), Path(d) / "out.bin", num_workers=w)
                res[w].append(mb / meta["seconds"])
    print("| workers | MB/s | speed-up |\n|---|---|---|")
    for w, xs in res.items():
        print(f"| {w} | {_tok_median(xs):.1f} | {_tok_median(xs) / _tok_median(res[1]):.2f}x |")


def _tok_make_mix(out, paths, size=MIX_BYTES):
    """The ~20 MB corpus: the texts, each stripped and followed by "\n<|endoftext|>\n", repeated up to size bytes
    and cut at a newline (the rule of the team's make_mix20.py, on these texts)."""
    unit = "".join(Path(p).read_text(encoding="utf-8").strip() + "\n<|endoftext|>\n" for p in paths).encode()
    text = (unit * -(-size // len(unit)))[:size]
    Path(out).write_bytes(text[:text.rindex(b"\n") + 1])
    print(f"made {out} ({os.path.getsize(out):,} bytes) from {', '.join(map(str, paths))}")


def _tok_texts(args):
    """--texts as [(path, vocab)]; empty: the speedrun's TinyStories training text at vocab 10,000."""
    if not args.texts:
        import fineweb
        return [(fineweb.tinystories_head()[0], 10000)]
    return [(Path(p), int(v)) for p, v in (t.rsplit(":", 1) for t in args.texts.split(","))]


def bench_tokenizer(args):
    args.parts = args.parts.split(",")
    mix20 = Path(args.mix20)
    needs_mix = ("train" in args.parts or "encode_file" in args.parts) and not mix20.is_file()
    texts = _tok_texts(args) if needs_mix or {"train", "encode"} & set(args.parts) else []
    if needs_mix:
        _tok_make_mix(mix20, [p for p, _ in texts])
    if "train" in args.parts:
        _tok_bench_train(args, texts + ([(mix20, 10000)] if args.big else []))
    if "encode" in args.parts:
        _tok_bench_encode(args, texts[0][0])
    if "encode_file" in args.parts:
        _tok_bench_encode_file(args, mix20)


# -----------------------------------------------------------------------------
# model: TransformerLM / GPT train step and KV-cached generation vs transformers
# bench.py model section: model.py vs transformers, side by side, interleaved in one process.
#
#     python bench.py model                      # train steps (fp32 + bf16), generation
#     python bench.py model --parts train --repeats 5
#     python bench.py model --parts compile      # torch.compile on CPU (slow to compile)
#
# Train step = forward + backward + torch.optim.AdamW step (the same optimizer on both sides), batch 8 x 256.
# Llama: CS336 TinyStories shape (vocab 10k, d 512, 4 layers, 16 heads, d_ff 1344) vs LlamaForCausalLM.
# GPT: 4 layers / 256 wide / block 256 / vocab 50,304 vs GPT2LMHeadModel (dropout 0 on both sides);
# the generation model has block 512 because prompt + new tokens = 272 positions.
# Generation: batch 1, 16-token prompt -> 256 new tokens, greedy, KV cache, on the GPT shape, vs
# GPT2LMHeadModel.generate(use_cache=True). Every figure is a median over --repeats, ours and the reference
# alternating so that machine load hits both alike.

def _bench_llama_pair(attn_impl):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    ours = M.TransformerLM(vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16,
                           d_ff=1344, rope_theta=10000.0, attn_impl=attn_impl)
    cfg = LlamaConfig(vocab_size=10000, hidden_size=512, intermediate_size=1344, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=256,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    ref = LlamaForCausalLM(cfg)  # attn_implementation defaults to sdpa
    c = ours.model_config()
    H, d_k = c["num_heads"], c["d_model"] // c["num_heads"]

    def halves(w):  # our RoPE rotates (2i, 2i+1); Llama rotates (i, i + d_k/2): reorder rows within each head
        return w.view(H, d_k // 2, 2, -1).transpose(1, 2).reshape(w.shape)
    sd = {"model.embed_tokens.weight": ours.token_embeddings.weight, "model.norm.weight": ours.ln_final.weight,
          "lm_head.weight": ours.lm_head.weight}
    for i, layer in enumerate(ours.layers):   # the same weights: the first step's losses must agree
        p = f"model.layers.{i}."
        sd |= {p + "self_attn.q_proj.weight": halves(layer.attn.q_proj.weight),
               p + "self_attn.k_proj.weight": halves(layer.attn.k_proj.weight),
               p + "self_attn.v_proj.weight": layer.attn.v_proj.weight,
               p + "self_attn.o_proj.weight": layer.attn.output_proj.weight,
               p + "mlp.gate_proj.weight": layer.ffn.w1.weight, p + "mlp.up_proj.weight": layer.ffn.w3.weight,
               p + "mlp.down_proj.weight": layer.ffn.w2.weight, p + "input_layernorm.weight": layer.ln1.weight,
               p + "post_attention_layernorm.weight": layer.ln2.weight}
    ref.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    return ours, ref, 10000


def _bench_gpt_pair(attn_impl="sdpa", block_size=256):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    ours = M.GPT(M.GPTConfig(block_size=block_size, vocab_size=50304, n_layer=4, n_head=4, n_embd=256,
                             attn_impl=attn_impl))
    cfg = GPT2Config(vocab_size=50304, n_positions=block_size, n_embd=256, n_layer=4, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    ref = GPT2LMHeadModel(cfg)
    ref.load_state_dict({k: v.t() if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else v
                         for k, v in ours.state_dict().items()}, strict=False)
    return ours, ref, 50304


def _bench_ours_loss(model, x, y):
    return M.lm_loss(model, x, y)


def _bench_ref_loss(model, x, y):
    # Hugging Face's own loss path on the same targets (shift_labels: y is already the next tokens), and no KV cache
    # (use_cache defaults to True, which builds one in every training forward)
    return model(input_ids=x, labels=y, shift_labels=y, use_cache=False).loss


def _bench_step(model, loss_fn, opt, x, y, dtype):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
    t0 = time.perf_counter()
    with ctx:
        loss = loss_fn(model, x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def _bench_interleaved(sides, repeats, warmup=1):
    """sides: {name: zero-arg callable returning seconds}; returns {name: median seconds}."""
    times = {name: [] for name in sides}
    for r in range(warmup + repeats):
        for name, fn in sides.items():
            t = fn()
            if r >= warmup:
                times[name].append(t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _bench_train(args, rows):
    B, T = 8, 256
    cases = [("llama", "scratch", "fp32"), ("llama", "sdpa", "fp32"), ("llama", "scratch", "bf16"),
             ("llama", "sdpa", "bf16"), ("gpt2", "sdpa", "fp32"), ("gpt2", "sdpa", "bf16")]
    for arch, attn_impl, dtype in cases:
        if args.only and args.only not in f"{arch}-{attn_impl}-{dtype}":
            continue
        ours, ref, vocab = _bench_llama_pair(attn_impl) if arch == "llama" else _bench_gpt_pair(attn_impl)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, vocab, (B, T), generator=g)
        y = torch.randint(0, vocab, (B, T), generator=g)
        with torch.no_grad():   # the same weights and targets, so the same loss: both sides do the same work
            a, b = _bench_ours_loss(ours, x, y).item(), _bench_ref_loss(ref, x, y).item()
        assert abs(a - b) < 1e-4, f"{arch}: loss {a} (ours) vs {b} (transformers) on the same weights"
        opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-4, weight_decay=0.1)
        opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-4, weight_decay=0.1)
        med = _bench_interleaved({"ours": lambda: _bench_step(ours, _bench_ours_loss, opt_o, x, y, dtype),
                                  "ref": lambda: _bench_step(ref, _bench_ref_loss, opt_r, x, y, dtype)},
                                 args.repeats)
        rows.append((f"train {arch} attn={attn_impl} {dtype}", B * T / med["ours"], B * T / med["ref"], "tok/s"))
        print(_bench_fmt(rows[-1]), flush=True)


def _bench_compile(args, rows):
    B, T = 8, 256
    for arch in ("llama", "gpt2"):
        ours, ref, vocab = _bench_llama_pair("sdpa") if arch == "llama" else _bench_gpt_pair()
        eager = M.build_model(ours.model_config())
        eager.load_state_dict(ours.state_dict())
        compiled = torch.compile(ours)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, vocab, (B, T), generator=g)
        y = torch.randint(0, vocab, (B, T), generator=g)
        opt_c = torch.optim.AdamW(compiled.parameters(), lr=1e-4, weight_decay=0.1)
        opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-4, weight_decay=0.1)
        opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-4, weight_decay=0.1)
        arch_kw = {"arch": arch}
        t0 = time.perf_counter()
        _bench_step(compiled, lambda m, a, b: M.lm_loss(m, a, b, **arch_kw), opt_c, x, y, "fp32")
        print(f"  compile + first step {arch}: {time.perf_counter() - t0:.1f} s", flush=True)
        med = _bench_interleaved(
            {"compiled": lambda: _bench_step(compiled, lambda m, a, b: M.lm_loss(m, a, b, **arch_kw), opt_c, x, y,
                                             "fp32"),
             "eager": lambda: _bench_step(eager, _bench_ours_loss, opt_e, x, y, "fp32"),
             "ref": lambda: _bench_step(ref, _bench_ref_loss, opt_r, x, y, "fp32")}, args.repeats)
        rows.append((f"train {arch} fp32 torch.compile vs reference", B * T / med["compiled"], B * T / med["ref"],
                     "tok/s"))
        rows.append((f"train {arch} fp32 torch.compile vs our eager", B * T / med["compiled"],
                     B * T / med["eager"], "tok/s"))
        print(_bench_fmt(rows[-2]), flush=True)
        print(_bench_fmt(rows[-1]), flush=True)


@torch.inference_mode()
def _bench_greedy(model, prompt, max_new_tokens):
    """The lean generation loop: prefill once, then one token per forward_with_cache."""
    cache = model.init_kv_cache(prompt.size(0), prompt.size(1) + max_new_tokens)
    tok = model.forward_with_cache(prompt, cache)[:, -1].argmax(-1, keepdim=True)
    out = [tok]
    for _ in range(max_new_tokens - 1):
        tok = model.forward_with_cache(tok, cache)[:, -1].argmax(-1, keepdim=True)
        out.append(tok)
    return torch.cat(out, 1)


def _bench_generate(args, rows):
    ours, ref = (m.eval() for m in _bench_gpt_pair(block_size=512)[:2])  # 16 + 256 positions > 256
    prompt = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(0))
    n = 256
    got = {}

    def run_ours():
        t0 = time.perf_counter()
        got["ours"] = _bench_greedy(ours, prompt, n)
        return time.perf_counter() - t0

    def run_ref():
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
                               use_cache=True, pad_token_id=0, eos_token_id=None)   # no stop, no eos ban: as ours
        got["ref"] = out[:, prompt.size(1):]
        return time.perf_counter() - t0

    med = _bench_interleaved({"ours": run_ours, "ref": run_ref}, args.repeats)
    assert torch.equal(got["ours"], got["ref"]), "greedy tokens differ from GPT2LMHeadModel.generate"
    rows.append(("decode loop gpt2 4x256 kv-cache greedy b1", n / med["ours"], n / med["ref"], "tok/s"))
    print(_bench_fmt(rows[-1]), flush=True)


def _bench_fmt(row):
    name, ours, ref, unit = row
    return f"| {name:<52} | {ours:>9.1f} | {ref:>9.1f} | {ours / ref:>5.2f}x | {unit} |"


def bench_model(args):
    torch.set_num_threads(args.threads)
    rows = []
    print(f"| {'case':<52} | {'ours':>9} | {'reference':>9} | {'ratio':>6} | unit |")
    print(f"|{'-' * 54}|{'-' * 11}|{'-' * 11}|{'-' * 8}|------|")
    parts = args.parts.split(",")
    if "train" in parts:
        _bench_train(args, rows)
    if "generate" in parts:
        _bench_generate(args, rows)
    if "compile" in parts:
        _bench_compile(args, rows)
    return rows


# -----------------------------------------------------------------------------
# train: the whole training loop vs the model-only step, and the data loader alone
#
#     python bench.py train                      # CS336 TinyStories shape (d 512, 4 layers, ctx 256, vocab 10k)
#     python bench.py train --shape=small        # the main job's model (d 128, 4 layers, ctx 128)
#     python bench.py train --dtypes=float32,bfloat16   # also compare CPU bf16 autocast

SHAPES = {
    "cs336": dict(vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344),
    "small": dict(vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4, d_ff=0),
}


def _write_tokens(path, n, vocab, seed=0):
    """n random ids with an eot (0) every ~200 tokens, as a token file with its sidecar."""
    r = np.random.default_rng(seed)
    ids = r.integers(1, vocab, size=n, dtype=np.uint16)
    ids[r.integers(0, n, size=n // 200)] = 0
    ids.tofile(path)
    Path(str(path) + ".json").write_text(json.dumps(dict(format="tokens-v1", dtype="uint16", vocab_size=vocab,
                                                         num_tokens=n, num_docs=None, tokenizer=None, eot_id=0)))


def _token_dir(folder, vocab):
    """folder with random train.bin (2M tokens) and val.bin (100k), as the loop benchmarks read them."""
    folder.mkdir()
    _write_tokens(folder / "train.bin", 2_000_000, vocab, 0)
    _write_tokens(folder / "val.bin", 100_000, vocab, 1)
    return folder


def _mcfg(cfg):
    flags = dict(train.DEFAULTS, **cfg)
    return M.config_from_flags(flags["model"], flags, cfg["vocab_size"])


def _model_step_times(cfg, steps, dtype):
    """fwd + bwd + clip + AdamW on one fixed batch: what the loop would cost with free data and no bookkeeping."""
    import model as model_lib
    torch.manual_seed(0)
    m = model_lib.build_model(_mcfg(cfg))
    opt = train.AdamW(model_lib.param_groups(m, 0.1), lr=1e-3, betas=(0.9, 0.95))
    x = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["context_length"]))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else torch.autocast("cpu", enabled=False)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with ctx:
            loss = model_lib.lm_loss(m, x, x)
        loss.backward()
        train.gradient_clipping(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return times[1:]   # the first step allocates optimizer state


def _loop_step_times(cfg, steps, dtype, data_dir, out_dir):
    """The real train() loop (sampler, accumulation, clipping, schedule, logging); per-step dt from its log."""
    c = dict(train.DEFAULTS, **cfg, data_dir=str(data_dir), out_dir=str(out_dir), prepare_data=False,
             resume=False, max_iters=steps, eval_interval=10 ** 9, eval_iters=1, log_interval=1, num_samples=0,
             device="cpu", dtype=dtype, sampler="sequential", time_budget="")
    train.train(c, log=lambda *a, **k: None)
    rows = [json.loads(l) for l in (Path(out_dir) / "log.jsonl").read_text().splitlines()]
    return [r["dt"] for r in rows if r["type"] == "train"][1:]


def _loader_tokens_per_sec(shards, B, T, kind, batches=200):
    s = (runs.SequentialSampler(shards, B, T, seed=0, eot_id=0) if kind == "sequential"
         else runs.RandomSampler(shards, B, T, seed=0))
    s.next_batch("cpu")
    t0 = time.perf_counter()
    for _ in range(batches):
        s.next_batch("cpu")
    return batches * B * T / (time.perf_counter() - t0)


BENCH_DEFAULTS = dict(shape="cs336", batch_size=8, steps=4, repeats=3, threads=2, dtypes="float32")


def bench_train(args):
    # bench.py's merged parser may not carry every option: fall back to this section's defaults
    args = argparse.Namespace(**{k: getattr(args, k, None) or v for k, v in BENCH_DEFAULTS.items()})
    torch.set_num_threads(args.threads)
    cfg = dict(SHAPES[args.shape], batch_size=args.batch_size)
    tokens = cfg["batch_size"] * cfg["context_length"]
    tmp = Path(tempfile.mkdtemp(prefix="bench_train_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)   # data and checkpoints: gone when bench.py exits
    data = _token_dir(tmp / "data", cfg["vocab_size"])
    shards = runs.find_shards(data, "train")

    print(f"train bench: shape {args.shape} {SHAPES[args.shape]}, batch {cfg['batch_size']} x {cfg['context_length']} "
          f"= {tokens:,} tokens/step, {args.threads} threads, {args.steps} steps x {args.repeats} repeats (medians)")
    print(f"{'what':<42} {'tok/s':>12} {'ratio':>8}")
    loader_tps = {}
    for kind in ("sequential", "random"):
        loader_tps[kind] = statistics.median(_loader_tokens_per_sec(shards, cfg["batch_size"], cfg["context_length"],
                                                                    kind) for _ in range(3))
        print(f"{'loader alone: ' + kind:<42} {loader_tps[kind]:>12,.0f}")
    for dtype in args.dtypes.split(","):
        loop, step = [], []
        for r in range(args.repeats):   # interleaved: ours (the loop), peer (the bare model step), ...
            loop += _loop_step_times(cfg, args.steps + 1, dtype, data, tmp / f"out{r}")
            step += _model_step_times(cfg, args.steps + 1, dtype)
        t_loop, t_step = statistics.median(loop), statistics.median(step)
        mfu = train._mfu(flops.train_flops_per_token(_mcfg(cfg), cfg["context_length"]), tokens / t_loop,
                         torch.device("cpu"), dtype)
        print(f"{'whole loop (train.train), ' + dtype:<42} {tokens / t_loop:>12,.0f} {t_step / t_loop:>8.3f}"
              + (f"   mfu {100 * mfu:.1f}%" if mfu else ""))
        print(f"{'model-only step (fwd+bwd+clip+AdamW), ' + dtype:<42} {tokens / t_step:>12,.0f} {1.0:>8.3f}")
        print(f"{'  loop overhead (loop / model step - 1)':<42} {100 * (t_loop / t_step - 1):>11.1f}%")
        # the part of the overhead that is data loading, measured alone (robust to a busy machine)
        print(f"{'  loader time / model step time':<42} {100 * tokens / loader_tps['sequential'] / t_step:>11.3f}%")


# -----------------------------------------------------------------------------
# dtype: what --dtype=auto should pick on this CPU, at the shapes it picks for

DTYPE_KEYS = ("model", "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "batch_size",
              "optimizer", "compile")


def _dtype_shapes():
    """The main job's shape, the CPU presets' (their optimizer and compilation too), and the main job's at other
    widths, around the edge of auto's rule (train.CPU_BF16_MIN_D_MODEL)."""
    main = {k: train.DEFAULTS[k] for k in DTYPE_KEYS}
    shapes = {"main job": main}
    for name in ("speedrun-cpu", "tinystories-cpu"):
        shapes[f"--preset={name}"] = dict(main, **{k: v for k, v in train.PRESETS[name].items() if k in DTYPE_KEYS})
    for d in (64, 192, 256):
        shapes[f"main job at d_model {d}"] = dict(main, d_model=d)
    return shapes


def bench_dtype(args):
    import model as model_lib
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    print(f"dtype bench: train.train's steps at float32 and bfloat16 (autocast), interleaved, medians of "
          f"{args.repeats} x {args.steps} steps a side; {args.threads} threads; native bf16 on this CPU: "
          f"{'yes' if model_lib.native_bf16(cpu) else 'no (bfloat16 is emulated)'}")
    tmp = Path(tempfile.mkdtemp(prefix="bench_dtype_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    print(f"| {'shape':<46} | fp32 tok/s | bf16 tok/s | bf16 / fp32 | auto picks |")
    print(f"|{'-' * 48}|-----------:|-----------:|------------:|------------|")
    for name, cfg in _dtype_shapes().items():
        if args.only and args.only not in name:
            continue
        data = tmp / f"data{cfg['vocab_size']}"
        if not data.exists():
            _token_dir(data, cfg["vocab_size"])
        times = {"float32": [], "bfloat16": []}
        for r in range(args.repeats):   # (a compiled shape compiles in each run: its first 2 steps are dropped)
            for dtype in times:
                times[dtype] += _loop_step_times(cfg, args.steps + 2, dtype, data, tmp / f"{dtype}{r}")[1:]
        tf, tb = statistics.median(times["float32"]), statistics.median(times["bfloat16"])
        tokens = cfg["batch_size"] * cfg["context_length"]
        shape = f"{name}: d{cfg['d_model']} x {cfg['num_layers']}, {cfg['batch_size']} x {cfg['context_length']}"
        auto, _ = train.auto_dtype(dict(train.DEFAULTS, **cfg), cpu)
        print(f"| {shape:<46} | {tokens / tf:>10,.0f} | {tokens / tb:>10,.0f} | {tf / tb:>10.2f}x | {auto:<10} |",
              flush=True)


# -----------------------------------------------------------------------------
# loss: the Llama's training loss in chunks (model(idx, targets=y): linear_cross_entropy) against the head
# then cross_entropy over the whole (tokens, vocab) logits, a forward and backward at the shapes of `dtype`, eager

def bench_loss(args):
    torch.set_num_threads(args.threads)
    print(f"loss bench: a Llama forward + backward, the loss in chunks (model(idx, targets=y)) against the head then "
          f"cross_entropy, eager, interleaved step by step, medians of {args.steps} steps; {args.threads} threads")
    print(f"| {'shape':<50} | dtype    | head, then loss ms | in chunks ms | speed-up |")
    print(f"|{'-' * 52}|----------|-------------------:|------------:|---------:|")
    for name, cfg in _dtype_shapes().items():
        if args.only and args.only not in name:
            continue
        c = train.Settings(dict(train.DEFAULTS, **cfg))
        torch.manual_seed(0)
        m = M.build_model(M.config_from_flags("llama", c, c.vocab_size, False))
        x, y = (torch.randint(0, c.vocab_size, (c.batch_size, c.context_length)) for _ in range(2))
        ways = {"head, then loss": lambda: M.cross_entropy(m(x), y), "in chunks": lambda: m(x, targets=y)}
        for dtype in args.dtypes.split(","):
            times = {way: [] for way in ways}
            for i in range(args.steps + 1):   # the first step of each way warms up, not counted
                for way, loss in ways.items():
                    t = time.perf_counter()
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                        value = loss()
                    value.backward()
                    m.zero_grad(set_to_none=True)
                    if i:
                        times[way].append(time.perf_counter() - t)
            plain, chunks = (1000 * statistics.median(times[way]) for way in ways)
            shape = f"{name}: d{c.d_model}, vocab {c.vocab_size:,}, {c.batch_size} x {c.context_length}"
            print(f"| {shape:<50} | {dtype:<8} | {plain:>18.1f} | {chunks:>11.1f} | {plain / chunks:>7.2f}x |",
                  flush=True)


# -----------------------------------------------------------------------------
# memory: what train.py's --fsdp and --activation_checkpointing save, on CPU
#
#     python bench.py memory     # Llama d256 x 8 layers, context 1024: per-rank bytes of parameters, gradients and
#                                # AdamW state, DDP against FSDP on 2 gloo processes; then the memory and time of a
#                                # training step with and without activation checkpointing (one process)
#
# A step's memory is the growth of the process's resident memory over the step, from after a first step (gradients
# and AdamW's state exist; the gradients are freed again) to the peak (Linux's VmHWM, reset by /proc/self/clear_refs);
# glibc is made to return every freed block of 64 KiB or more at once, so resident memory follows live tensors.
# Each variant runs in a fresh process, interleaved (off, on, off, on, ...), medians reported.

_MEMORY_STEP = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch, model as M, train
cfg, batch, steps, checkpointing, threads = json.loads(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(0)
raw = M.build_model(cfg)
train.parallelize(raw, train.Settings(activation_checkpointing=checkpointing, fsdp=False), 1, "cpu", {})
model, opt = train.LossOf(raw, cfg["arch"]), train.AdamW(M.param_groups(raw, 0.1), lr=1e-3)
x = torch.randint(0, cfg["vocab_size"], (batch, cfg["context_length"] + 1), generator=torch.Generator().manual_seed(0))
def step():
    model(x[:, :-1], x[:, 1:]).backward()
    train.gradient_clipping(raw.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
def rss(field):
    return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1]) * 1024
step()
base = rss("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
print(json.dumps(dict(memory=rss("VmHWM:") - base, step=statistics.median(times))))
"""


def _memory_cfg(args):
    return dict(arch="llama", vocab_size=args.vocab_size, context_length=args.context_length, d_model=args.d_model,
                num_layers=args.num_layers, num_heads=args.num_heads)


def _memory_state_rank(rank, world, port, cfg, mode, out):
    """One rank of one DDP or FSDP training step (train.py's own pieces): the bytes of the parameters, gradients and
    AdamW state it holds after it, into out/MODE{rank}.json."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        raw = M.build_model(cfg)
        train.parallelize(raw, train.Settings(fsdp=mode == "fsdp", activation_checkpointing=False), world, "cpu", {})
        model = train.LossOf(raw, cfg["arch"])
        if mode == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = train.AdamW(M.param_groups(raw, 0.1), lr=1e-3)
        x = torch.randint(0, cfg["vocab_size"], (1, min(16, cfg["context_length"]) + 1))   # (no batch term here)
        model(x[:, :-1], x[:, 1:]).backward()
        opt.step()

        def size(tensors):
            return sum(train.local(t).numel() * t.element_size() for t in tensors)
        Path(out, f"{mode}{rank}.json").write_text(json.dumps(dict(
            parameters=size(raw.parameters()), gradients=size(p.grad for p in raw.parameters()),
            optimizer=size(t for state in opt.state.values() for t in state.values()))))
    finally:
        torch.distributed.destroy_process_group()


def _memory_state(cfg, world=2):
    """{"ddp": [per-rank bytes], "fsdp": [...]}: each rank's parameters, gradients and optimizer state after a step."""
    import socket
    out = Path(tempfile.mkdtemp(prefix="bench_memory_"))
    try:
        for mode in ("ddp", "fsdp"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            torch.multiprocessing.spawn(_memory_state_rank, args=(world, port, cfg, mode, str(out)), nprocs=world)
        return {mode: [json.loads((out / f"{mode}{r}.json").read_text()) for r in range(world)]
                for mode in ("ddp", "fsdp")}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _memory_step(cfg, batch, steps, checkpointing, threads):
    """dict(memory (bytes), step (seconds, median)) of training steps in a fresh process (see the section's head)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    r = subprocess.run([sys.executable, "-c", _MEMORY_STEP, str(ROOT),
                        json.dumps([cfg, batch, steps, checkpointing, threads])],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"bench.py memory: the step process failed: {(r.stderr.strip().splitlines() or [''])[-1]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_memory(args):
    cfg = _memory_cfg(args)
    mib = 2 ** 20
    print(f"memory bench: llama d{args.d_model} x {args.num_layers} layers x {args.num_heads} heads, context "
          f"{args.context_length}, vocab {args.vocab_size}; AdamW (this file's), float32, CPU")
    state = _memory_state(cfg)
    print(f"\n{'per rank, 2 gloo processes':<28} {'parameters':>12} {'gradients':>12} {'optimizer':>12} {'total':>12} "
          f"{'ratio':>7}")
    ddp_total = sum(state["ddp"][0].values())
    for mode, rows in state.items():
        for rank, row in enumerate(rows):
            total = sum(row.values())
            print(f"{mode.upper() + ' rank ' + str(rank):<28} " + " ".join(f"{row[k] / mib:>8.2f} MiB" for k in row)
                  + f" {total / mib:>8.2f} MiB {total / ddp_total:>7.3f}")
    print(f"\n{'activation checkpointing':<28} {'step memory':>12} {'ratio':>7} {'step time':>11} {'ratio':>7}   "
          f"(1 process, batch {args.batch_size}, {args.threads} threads, medians of {args.repeats} x {args.steps})")
    results = {False: [], True: []}
    for _ in range(args.repeats):   # interleaved: off, on, off, on, ...
        for checkpointing in results:
            results[checkpointing].append(_memory_step(cfg, args.batch_size, args.steps, checkpointing, args.threads))
    medians = {k: {m: statistics.median(r[m] for r in v) for m in ("memory", "step")} for k, v in results.items()}
    for checkpointing, m in medians.items():
        print(f"{'on' if checkpointing else 'off':<28} {m['memory'] / mib:>8.1f} MiB "
              f"{m['memory'] / max(1, medians[False]['memory']):>7.3f} {m['step']:>9.3f} s "
              f"{m['step'] / medians[False]['step']:>7.3f}")
    return state, medians


# -----------------------------------------------------------------------------
# sample: sample.generate vs transformers generate(use_cache=True)
# Benchmark: sample.generate vs transformers GPT2LMHeadModel.generate(use_cache=True) on the same weights.
#
#     python bench.py sample                 # batch 1 and 8, 256 new tokens, 4-layer / 256-wide GPT-2
#     python bench.py sample --repeats 5 --threads 2

def bench_sample(args):
    import transformers

    import model as model_lib
    import sample

    threads = getattr(args, "threads", 2)
    repeats = getattr(args, "repeats", 3)
    n_new, prompt_len = getattr(args, "max_new_tokens", 256), getattr(args, "prompt_len", 16)
    modes = getattr(args, "modes", "greedy,top_p").split(",")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(vocab_size=50257, n_positions=1024, n_embd=256, n_layer=4, n_head=4)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with tempfile.TemporaryDirectory() as d:  # the same weights, loaded through GPT.from_pretrained
        hf.save_pretrained(d)
        ours = model_lib.GPT.from_pretrained(d).eval()
    print(f"sample: 4-layer / 256-wide GPT-2 (vocab 50257), prompt {prompt_len} tokens, {n_new} new tokens, "
          f"{threads} threads, median of {repeats}")

    def run_ours(prompts, mode):
        kw = dict(temperature=0.0) if mode == "greedy" else dict(temperature=1.0, top_p=0.9)
        out = sample.generate(ours, prompts.tolist(), n_new, generator=torch.Generator().manual_seed(0), **kw)
        return out

    def run_hf(prompts, mode):
        kw = dict(do_sample=False) if mode == "greedy" else dict(do_sample=True, top_p=0.9, top_k=0)
        with torch.no_grad():
            out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n_new,
                              min_new_tokens=n_new, use_cache=True, pad_token_id=0, eos_token_id=None, **kw)
        return out[:, prompts.size(1):].tolist()

    print(f"{'mode':<8}{'batch':>6}{'ours tok/s':>12}{'HF tok/s':>10}{'ratio':>8}{'ours ms/step':>14}{'HF ms/step':>12}"
          f"{'greedy match':>14}")
    for mode in modes:
        for batch in (1, 8):
            prompts = torch.randint(0, 50257, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
            run_ours(prompts[:, :4], mode), run_hf(prompts[:, :4], mode)  # warm-up
            t_ours, t_hf = [], []
            for _ in range(repeats):  # interleaved: ours, peer, ours, peer ...
                t0 = time.perf_counter()
                a = run_ours(prompts, mode)
                t_ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                b = run_hf(prompts, mode)
                t_hf.append(time.perf_counter() - t0)
            ours_ms = 1e3 * statistics.median(t_ours) / n_new
            hf_ms = 1e3 * statistics.median(t_hf) / n_new
            match = ""
            if mode == "greedy":  # same weights, so greedy tokens should agree (up to float ties late on)
                same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
                match = f"{same}/{batch * n_new}"
            print(f"{mode:<8}{batch:>6}{batch * 1e3 / ours_ms:>12.1f}{batch * 1e3 / hf_ms:>10.1f}"
                  f"{hf_ms / ours_ms:>7.2f}x{ours_ms:>14.2f}{hf_ms:>12.2f}{match:>14}")


# -----------------------------------------------------------------------------
# speedrun: the best model a fixed wall clock trains, ours beside a standard-tools peer
#
#     python bench.py speedrun                          # 5 min a run, seeds 0,1,2, the peer at lr 1e-3 and 3e-3
#     python bench.py speedrun --minutes 1 --seeds 0 --ours="--learning_rate=3e-3"
#
# Peer: Hugging Face tokenizers' byte-level BPE, LlamaForCausalLM, torch.optim.AdamW, random windows, warmup then
# cosine on the clock. Ours: bpe.py and train.train() with the same shape and schedule (plus --ours flags). Both
# clocks count training steps only (not tokenising, evaluating or checkpointing), and both are scored by one
# function on the whole validation text, in bits per byte (their tokenizers differ; the bytes do not). The text:
# --train / --valid, else the TinyStories head that fineweb.tinystories_head fetches once into data/tinystories-head.

def _speedrun_bpb(logits_of, ids, n_bytes, T, batch=16):
    """Bits per byte of a token sequence: next-token loss summed over windows of T, over the text's bytes."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    n = (len(ids) - 1) // T * T
    x, y = ids[:n].view(-1, T), ids[1:n + 1].view(-1, T)
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = logits_of(x[i:i + batch]).float()
            total += F.cross_entropy(out.flatten(0, 1), y[i:i + batch].flatten(), reduction="sum").item()
    return total / math.log(2) / n_bytes


def _speedrun_peer(args, lr, seed, train_text, val_text, n_bytes):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()   # decode to the text's bytes, not to the byte-level alphabet's characters
    tok.train_from_iterator([train_text], trainers.BpeTrainer(
        vocab_size=args.vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    train_ids = torch.tensor(tok.encode(train_text).ids)
    val_ids = tok.encode(val_text).ids
    torch.manual_seed(seed)
    T = args.context_length
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=args.d_model, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads, intermediate_size=args.d_ff, max_position_embeddings=T,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attn_implementation="sdpa"))
    opt = torch.optim.AdamW(M.param_groups(model, 0.1), lr=lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(seed)
    # the peer's precision as a transformers user runs it: torch.autocast around the forwards (and the scoring)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=_speedrun_peer_dtype(args) == "bfloat16")

    def logits_of(x):
        with autocast:
            return model(input_ids=x, use_cache=False).logits
    n = _speedrun_curve_tokens(args, args.batch_size, T)   # the curve: the first n validation targets, off the clock
    curve_bytes = len(tok.decode(val_ids[1:n + 1]).encode("utf-8"))   # (decode drops <|endoftext|>)
    budget, elapsed, steps, curve = 60 * args.minutes, 0.0, 0, []

    def curve_point():
        curve.append((elapsed, _speedrun_bpb(logits_of, val_ids[:n + 1], curve_bytes, T)))
    while elapsed < budget:
        if args.curve and steps % args.curve_every == 0:
            curve_point()
        t0 = time.perf_counter()
        for g in opt.param_groups:   # train.py's warmup (5%) and cosine (to 10%), over the share of the budget spent
            g["lr"] = train.get_lr_cosine_schedule(elapsed / budget, lr, 0.1 * lr, 0.05, 1.0)
        starts = torch.randint(0, len(train_ids) - T, (args.batch_size,), generator=gen)
        batch = torch.stack([train_ids[i:i + T + 1] for i in starts.tolist()])
        logits = logits_of(batch[:, :-1])   # T targets a row, as ours
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        elapsed += time.perf_counter() - t0
    if args.curve:
        curve_point()
    bpb = _speedrun_bpb(logits_of, val_ids, n_bytes, T)
    return dict(steps=steps, tps=steps * args.batch_size * T / elapsed, bpb=bpb, curve=curve)


def _speedrun_peer_dtype(args):
    """The peer's --peer_dtype; auto: what train.py's --dtype=auto picks for a model of the peer's width here."""
    if args.peer_dtype != "auto":
        return args.peer_dtype
    return train.auto_dtype(train.Settings(d_model=args.d_model, init_from="scratch"), torch.device("cpu"))[0]


def _speedrun_ours(args, seed, tmp, n_bytes):
    out = tmp / f"ours-{seed}"
    shape = dict(model="llama", d_model=args.d_model, num_layers=args.num_layers, num_heads=args.num_heads,
                 d_ff=args.d_ff, context_length=args.context_length, batch_size=args.batch_size, learning_rate=1e-3,
                 max_iters=1000000, warmup_iters=50000)   # 5% warmup on the clock, as the peer's
    preset = any(f.startswith("--preset") for f in shlex.split(args.ours))
    flags = [f"--data_dir={tmp / 'data'}", f"--out_dir={out}", "--prepare_data=false", "--fresh=true",
             f"--time_budget={60 * args.minutes}s", "--eval_interval=1000000000", "--eval_iters=1", "--eval_tokens=0",
             "--num_samples=0", "--log_interval=1000000000", "--device=cpu", f"--seed={seed}",
             *([] if preset else ["--compile=false", *(f"--{k}={v}" for k, v in shape.items())]),
             *shlex.split(args.ours)]
    cfg, _ = train.get_config(flags)
    if args.curve:   # train.py's own evaluation, every curve_every steps (off the clock), on the first n targets
        cfg.update(eval_interval=args.curve_every,
                   eval_tokens=_speedrun_curve_tokens(args, cfg["batch_size"], cfg["context_length"]))
    summary = train.train(cfg, log=lambda *a, **k: None)
    m, ckpt = M.load_model(summary["ckpt"])
    m.eval()
    val_ids = np.fromfile(tmp / "data" / "val.bin", dtype=np.uint16)

    def score():   # the model's weights now, on the whole validation text
        return _speedrun_bpb(lambda x: M.logits(m, x), val_ids, n_bytes, cfg["context_length"])
    bpb, last = score(), None
    if "trained_weights" in ckpt:   # --ema: the checkpoint's model is the average; the last weights scored too
        m.load_state_dict({**m.state_dict(), **ckpt["trained_weights"]})   # (a name it lacks: an error)
        last = score()
    tokens = summary["step"] * cfg["batch_size"] * cfg["context_length"]
    curve = [(r["elapsed"], r["val_bpb"]) for r in runs.read_log(summary["log"])[2]] if args.curve else []
    return dict(steps=summary["step"], tps=tokens / summary["elapsed"], bpb=bpb, last=last, curve=curve)


def _speedrun_curve_tokens(args, batch_size, context_length):
    """The validation targets each curve point scores: --curve_tokens rounded up to whole batches (train.py's
    --eval_tokens must be a multiple of one)."""
    per_batch = batch_size * context_length
    return -(-args.curve_tokens // per_batch) * per_batch


def _speedrun_plot(path, results, minutes, title):
    """One PNG: validation bits per byte (the curve's tokens) against training time, one line per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (name, rs) in enumerate(results.items()):
        for j, r in enumerate(rs):
            ax.plot([t / 60 for t, _ in r["curve"]], [b for _, b in r["curve"]], color=f"C{i}", lw=1.4, alpha=0.85,
                    label=f"{name} (final, whole text: {statistics.median(x['bpb'] for x in rs):.3f} median)"
                    if j == 0 else None)
    ax.set(xlabel="training time (min)", ylabel="validation bits per byte", xlim=(0, minutes), title=title)
    ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _check_heads_divide(args):
    """--num_heads divides --d_model (speedrun's and memory's model shape), one line before any work."""
    if args.d_model % args.num_heads:
        raise SystemExit(f"bench.py: --num_heads {args.num_heads}: expected a divisor of --d_model {args.d_model}")


def _check_speedrun_args(args):
    """bench.py speedrun's flags, each one line before any work."""
    if not args.minutes > 0:
        raise SystemExit(f"bench.py: --minutes {args.minutes:g}: expected a positive number")
    for flag, kind in (("seeds", int), ("peer_lr", float)):
        if flag == "peer_lr" and args.peer_lr == "":   # ours alone (probing a recipe)
            continue
        try:
            values = [kind(x) for x in getattr(args, flag).split(",")]
        except ValueError:
            values = []
        if not values or any(v < 0 for v in values) or (flag == "peer_lr" and 0 in values):
            raise SystemExit(f"bench.py: --{flag} {getattr(args, flag)!r}: expected a comma list of "
                             f"{'seeds (integers >= 0)' if kind is int else 'positive learning rates'}")
    _check_heads_divide(args)
    if args.vocab_size < 257:
        raise SystemExit(f"bench.py: --vocab_size {args.vocab_size}: expected at least 257 (the bytes and "
                         f"<|endoftext|>)")
    if args.curve_every < 1 or args.curve_tokens < 1:
        raise SystemExit(f"bench.py: --curve_every {args.curve_every} / --curve_tokens {args.curve_tokens}: expected "
                         f"positive integers")
    for flag in ("train", "valid"):
        if getattr(args, flag) and not Path(getattr(args, flag)).is_file():
            raise SystemExit(f"bench.py: --{flag} {getattr(args, flag)}: no such file (leave --train and --valid out "
                             f"for the TinyStories head, fetched into data/tinystories-head/)")
    if bool(args.train) != bool(args.valid):
        raise SystemExit(f"bench.py: --{'valid' if args.train else 'train'}: give --train and --valid together "
                         f"(or neither, for the TinyStories head)")


def bench_speedrun(args):
    import bpe
    import fineweb
    train_path, val_path = (Path(args.train), Path(args.valid)) if args.train else fineweb.tinystories_head()
    train_text, val_text = (p.read_text(encoding="utf-8") for p in (train_path, val_path))
    n_bytes = len(val_text.replace(bpe.EOT, "").encode("utf-8"))   # the text, not its separators
    tmp = Path(tempfile.mkdtemp(prefix="bench_speedrun_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    vocab, merges = bpe.train_bpe(train_path, args.vocab_size, [bpe.EOT])   # ours: bpe.py, encoded as --encode does
    bpe.Tokenizer(vocab, merges, special_tokens=[bpe.EOT]).save_dir(tmp / "tok")
    for name, path in (("train", train_path), ("val", val_path)):
        bpe.encode_file(path, tmp / "tok", tmp / "data" / f"{name}.bin")
    seeds = [int(x) for x in args.seeds.split(",")]
    peer_lrs = [float(x) for x in args.peer_lr.split(",") if x]
    print(f"speedrun: {args.minutes:g} min a run, {train_path} -> {val_path} ({n_bytes:,} bytes), "
          f"vocab {args.vocab_size}, the peer's shape (ours too, unless --ours sets one): Llama d{args.d_model} x "
          f"{args.num_layers} layers, context {args.context_length}, batch {args.batch_size}, "
          f"{torch.get_num_threads()} threads, {flops.cpu_name()} ({torch.backends.cpu.get_cpu_capability()}"
          f"{', native bf16' if M.native_bf16('cpu') else ''}), the peer in {_speedrun_peer_dtype(args)}")
    ours_name = "ours " + args.ours if args.ours else "ours"
    width = max(28, len(ours_name) + 2)   # the run column fits the --ours flags
    print(f"{'run':<{width}}{'seed':>5}{'steps':>8}{'tok/s':>9}{'val bpb':>9}")
    results = {}
    for seed in seeds:   # one after the other, each side on the same budget
        sides = [(ours_name, lambda: _speedrun_ours(args, seed, tmp, n_bytes))]
        sides += [(f"peer lr {lr:g}", lambda lr=lr: _speedrun_peer(args, lr, seed, train_text, val_text, n_bytes))
                  for lr in peer_lrs]
        for name, run in sides:
            r = run()
            results.setdefault(name, []).append(r)
            last = f"  (last weights {r['last']:.4f})" if r.get("last") is not None else ""   # (--ema)
            print(f"{name:<{width}}{seed:>5}{r['steps']:>8}{r['tps']:>9,.0f}{r['bpb']:>9.4f}{last}", flush=True)
    median = {name: statistics.median(r["bpb"] for r in rs) for name, rs in results.items()}
    print(f"medians over {len(seeds)} seed(s): " + ", ".join(f"{n} {b:.4f}" for n, b in median.items()))
    if args.curve:
        _speedrun_plot(args.curve, results, args.minutes, f"speedrun, {args.minutes:g} min a run: validation bits per "
                       f"byte (first {args.curve_tokens:,} tokens) by training time, {flops.cpu_name()}")
        print(f"wrote {args.curve}")
    if not peer_lrs:
        print(f"speedrun: ours {median[ours_name]:.4f} bpb (no peer run)")
        return
    peer_name = min((n for n in median if n != ours_name), key=median.get)   # the peer at its better learning rate
    ours, peer = median[ours_name], median[peer_name]
    print(f"speedrun: ours {ours:.4f} bpb, peer {peer:.4f} bpb, ratio {ours / peer:.3f}")


# -----------------------------------------------------------------------------
# gpu: every CUDA path checked, then timed, in one run (for the few minutes a GPU is lent)
#
#     python bench.py gpu                                   # CUDA: GPT-2 124M shape, ~5 min on one H100 / H200
#     python bench.py gpu --device cpu --tiny               # the same code on tiny shapes (the test suite runs it)
#
# Checks (each one line, OK or FAIL): both models on the device against float32 on the CPU; bf16 autocast against
# float32; flash attention (SDPA forced to its flash kernel on CUDA) against the from-scratch attention; PyTorch's
# fused AdamW against train.AdamW; a torch.compile'd forward against eager; KV-cached against uncached greedy
# decoding; HellaSwag and LAMBADA scores on the device against the CPU. Then train.train() itself on random tokens,
# GPT-2 and Llama at the same shape, compiled and eager: tokens/s, MFU (flops.py's peak for this GPU) and peak
# memory. Then the gpt2-xl preset's model with activation checkpointing (_checkpointing_check): the same loss and
# gradient as without, its peak memory against flops.py's, the largest batch. Last, what the 8-GPU preset runs
# (_ddp_check): train.train compiled under DDP, one process per GPU as torchrun starts them (NCCL; on the CPU 2 gloo
# processes), 2 micro-steps a step (no_sync on the first) at the preset's batch of 64, against one process: its
# tokens/s and MFU. It starts those processes itself, so it is run as `python bench.py gpu` (torchrun is refused);
# with one GPU the DDP check is skipped.

def bench_gpu(args):
    import bpe
    import hellaswag
    import lambada
    import sample
    device = str(M.resolve_device(args.device or "auto"))
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    shape = (dict(vocab_size=512, context_length=64, d_model=64, num_layers=2, num_heads=4) if args.tiny else
             dict(vocab_size=50257, context_length=1024, d_model=768, num_layers=12, num_heads=12))
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    if not cuda and not args.tiny:
        print("no CUDA device: running the checks on the CPU at the GPT-2 124M shape, which takes many minutes "
              "(--tiny for a quick run)", file=sys.stderr)
    print(f"gpu checks: torch {torch.__version__}, {name}"
          + (f", capability {torch.cuda.get_device_capability(dev)}, "
             f"bf16 {torch.cuda.get_device_capability(dev)[0] >= 8}" if cuda else "")   # native, not emulated
          + f", GPT-2 shape {shape}")
    failed = []

    def check(what, ok, detail):
        print(f"{'OK' if ok else 'FAIL':<5} {what:<48} {detail}")
        if not ok:
            failed.append(what)

    def build(arch, seed=0):  # the GPT-2 124M shape in either architecture (Llama: SwiGLU, d_ff 8/3*d, RoPE)
        torch.manual_seed(seed)
        return M.build_model(_mcfg(dict(shape, model=arch)))

    bf16 = torch.autocast(dev.type, dtype=torch.bfloat16)
    B, T = 2, shape["context_length"]
    x = torch.randint(0, shape["vocab_size"], (B, T), generator=torch.Generator().manual_seed(0))
    torch.set_float32_matmul_precision("highest")  # exact float32 for the checks (train.py turns TF32 on)
    with torch.no_grad():
        for arch in ("llama", "gpt2"):   # the GPT-2 model stays on the device for the checks after this loop
            ref, model = build(arch).eval(), build(arch).to(dev).eval()
            diff = (M.logits(model, x.to(dev)).float().cpu() - M.logits(ref, x)).abs().max().item()
            check(f"{arch}: float32 forward on the device vs CPU", diff < 1e-3, f"max |logit diff| {diff:.2e}")
            loss = M.lm_loss(model, x.to(dev), x.to(dev))
            with bf16:
                loss16 = M.lm_loss(model, x.to(dev), x.to(dev))
            rel = abs(loss16.item() - loss.item()) / loss.item()
            check(f"{arch}: bf16 autocast loss vs float32", rel < 1e-2,
                  f"{loss16.item():.4f} vs {loss.item():.4f} (rel {rel:.1e})")

        H, D = shape["num_heads"], shape["d_model"] // shape["num_heads"]
        q, k, v = torch.randn(3, B, H, T, D, generator=torch.Generator().manual_seed(1)).to(dev).unbind(0)
        scratch = M.scaled_dot_product_attention(q, k, v, torch.ones(T, T, dtype=torch.bool, device=dev).tril())
        flash = cuda and torch.cuda.get_device_capability(dev) >= (8, 0)   # the flash kernel needs sm80 or newer
        if flash:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if flash cannot run these inputs
                fused = torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                                         is_causal=True)
        else:   # the CPU, or an older GPU: SDPA's own choice of kernel, in float32
            fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        diff = (fused.float() - scratch).abs().max().item()
        check("flash attention (bf16) vs from scratch" if flash else "SDPA (no flash kernel here) vs from scratch",
              diff < 3e-2, f"max |diff| {diff:.2e}")

    # fused AdamW (what --fused=auto picks on CUDA) against this project's AdamW, fed the very same gradients
    # (computed once: CUDA backward kernels are not bit-reproducible, and Adam magnifies tiny gradient differences)
    ours, theirs = build("gpt2", 1).to(dev), build("gpt2", 1).to(dev)
    opt_ours = train.AdamW(M.param_groups(ours, 0.1), lr=1e-3, betas=(0.9, 0.95))
    opt_theirs = torch.optim.AdamW(M.param_groups(theirs, 0.1), lr=1e-3, betas=(0.9, 0.95), fused=True)
    for step in range(5):
        xs = torch.randint(0, shape["vocab_size"], (B, T), generator=torch.Generator().manual_seed(10 + step)).to(dev)
        M.lm_loss(ours, xs, xs).backward()
        for a, b in zip(ours.parameters(), theirs.parameters()):
            b.grad = a.grad.clone()
        for opt in (opt_ours, opt_theirs):
            opt.step()
            opt.zero_grad(set_to_none=True)
    diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
    check("fused AdamW vs train.AdamW, 5 steps", diff < 1e-5, f"max |param diff| {diff:.2e}")

    t0 = time.perf_counter()
    compiled = torch.compile(model, backend=args.compile_backend)
    with torch.no_grad(), bf16:
        _, loss_c = compiled(x.to(dev), x.to(dev))
        _, loss_e = model(x.to(dev), x.to(dev))
    rel = abs(loss_c.item() - loss_e.item()) / loss_e.item()
    check("torch.compile forward vs eager (bf16)", rel < 1e-2,
          f"{loss_c.item():.4f} vs {loss_e.item():.4f}, compiled in {time.perf_counter() - t0:.1f}s")

    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    cached = sample.generate(model, prompts, 16, temperature=0.0)
    uncached = sample.generate(model, prompts, 16, temperature=0.0, use_cache=False)
    check("KV-cached greedy decoding vs uncached", cached == uncached, f"{sum(map(len, cached))} tokens")

    tok = bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [])  # bytes only: no download, fits any vocabulary
    rows = [dict(ind=i, ctx=c, label=0, endings=e) for i, (c, e) in enumerate([
        ("She poured the milk into the", ["glass and drank it.", "sky above the moon.", "shoe of the horse.",
                                          "song on the radio."]),
        ("He tied his shoes and", ["went out for a run.", "ate the table.", "flew to the sun.", "swam in soup."])])]
    passages = [{"text": "The cat sat on the mat and looked at the other cat"},
                {"text": "She opened the door with her key and put the key"}]
    cpu_model = build("gpt2").eval()
    hs_dev, hs_cpu = (hellaswag.evaluate(m, tok, rows, d) for m, d in ((model, device), (cpu_model, "cpu")))
    lb_dev, lb_cpu = (lambada.evaluate(m, tok, passages, d) for m, d in ((model, device), (cpu_model, "cpu")))
    same = hs_dev == hs_cpu and lb_dev["num_correct"] == lb_cpu["num_correct"]
    check("HellaSwag and LAMBADA on the device vs CPU",
          same and abs(lb_dev["nll"] - lb_cpu["nll"]) < 1e-2 * lb_cpu["nll"],
          f"acc_norm {hs_dev['acc_norm']:.2f}, lambada nll {lb_dev['nll']:.3f} vs {lb_cpu['nll']:.3f}")
    del ref, model, cpu_model, compiled, ours, theirs, opt_ours, opt_theirs

    # the real training loop on random tokens: tokens/s, MFU and memory, compiled and eager
    tmp = Path(tempfile.mkdtemp(prefix="bench_gpu_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)   # data and GPT-2-sized checkpoints: removed at exit
    (tmp / "data").mkdir()
    _write_tokens(tmp / "data" / "train.bin", 4_000_000 if not args.tiny else 50_000, shape["vocab_size"], 0)
    _write_tokens(tmp / "data" / "val.bin", 200_000 if not args.tiny else 10_000, shape["vocab_size"], 1)
    print(f"{'train.train (random tokens)':<30} {'batch':>7} {'tok/s':>12} {'MFU':>7} {'peak mem':>10}")
    for arch, mode in [(arch, mode) for arch in ("gpt2", "llama") for mode in ("compiled", "eager")]:
        label = f"{arch} {mode}"
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        out = tmp / label.replace(" ", "_")
        cfg = dict(train.DEFAULTS, model=arch, **shape, batch_size=args.batch_size, data_dir=str(tmp / "data"),
                   out_dir=str(out), prepare_data=False, resume=False, max_iters=args.steps, warmup_iters=2,
                   eval_interval=10 ** 9, eval_iters=1, log_interval=1, num_samples=0, device=device,
                   compile=str(mode == "compiled").lower(), compile_backend=args.compile_backend, time_budget="",
                   sampler="random")
        try:
            train.train(cfg, log=lambda *a, **k: None)
        except Exception as e:  # report and go on: the other mode's figures are still worth having
            check(f"train.train {label}", False, f"{type(e).__name__}: {str(e)[:200]}")
            continue
        rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        steps = [r for r in rows if r["type"] == "train"][args.steps // 2:]  # past compilation and warm-up
        tps = statistics.median(r["tokens_per_sec"] for r in steps)
        mfu = [r["mfu"] for r in steps if r.get("mfu") is not None]
        mem = f"{torch.cuda.max_memory_allocated(dev) / 2 ** 30:.1f} GiB" if cuda else "-"
        print(f"{label:<30} {args.batch_size:>4}x{T:<4} {tps:>10,.0f} "
              f"{100 * statistics.median(mfu) if mfu else 0:>6.1f}% {mem:>10}")
        check(f"train.train {label}: loss is finite", all(math.isfinite(r["loss"]) for r in steps),
              f"{len(steps)} steps timed")
    try:
        _checkpointing_check(args, device, check)
    except Exception as e:  # report and go on to the DDP check
        check("activation checkpointing", False, f"{type(e).__name__}: {str(e)[:200]}")
    _ddp_check(args, shape, device, tmp, check)
    print(f"{'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    if failed:
        raise SystemExit(1)


def _checkpointing_check(args, device, check):
    """The gpt2-xl preset's model (GPT-2 XL: 48 x 1600, 25 heads, 1.56B; tiny with --tiny) in one process with
    --activation_checkpointing, built and stepped as train.py does on this device (its precision, parallelize,
    make_optimizer and gradient_clipping; eager). Checked: the loss and the gradient norm with checkpointing against
    without (the same ops on the same values). Then timed, on CUDA with the peak memory of three steps
    (torch.cuda.max_memory_allocated) and their median time: two batches with checkpointing, fitted to
    slope * batch + intercept beside flops.py's accounting (fp32 activations: an upper bound under bf16 autocast),
    the same two without it, and the largest batch the fit leaves room for on this GPU (5% less after each
    out-of-memory, up to 3 tries). Skipped on a CPU without --tiny (hours) and on a GPU too small for the batches."""
    cuda = torch.device(device).type == "cuda"
    if not cuda and not args.tiny:
        print("activation checkpointing skipped: GPT-2 XL on a CPU takes hours (--tiny runs it small)")
        return
    xl = train.PRESETS["gpt2-xl"]
    shape = (dict(model="gpt2", vocab_size=512, context_length=64, d_model=64, num_layers=2, num_heads=4)
             if args.tiny else {k: xl[k] for k in ("model", "vocab_size", "context_length", "d_model", "num_layers",
                                                      "num_heads")})
    c = train.check_config(dict(train.DEFAULTS, **shape, learning_rate=xl["learning_rate"], device=device,
                                activation_checkpointing=True))
    hw, autocast = train.precision(c, torch.device(device))
    T, mcfg = c.context_length, M.config_from_flags(c.model, c, c.vocab_size, hw["pad_vocab"])
    gb, batch0 = 1e9, args.batch_size if args.tiny else 8
    fixed, per_seq = flops.memory_bytes(mcfg, T, checkpointing=True)
    if cuda and torch.cuda.get_device_properties(device).total_memory < fixed + 2 * batch0 * per_seq:
        print(f"activation checkpointing skipped: GPT-2 XL at batch {2 * batch0} needs up to "
              f"{(fixed + 2 * batch0 * per_seq) / gb:.0f} GB (flops.py), more than this GPU has")
        return
    torch.manual_seed(0)
    with torch.device(device):
        raw = M.build_model(mcfg)
    optimizer = train.make_optimizer(raw, c, hw["fused"])

    def plain():   # undo parallelize's checkpointing: its wrapper is each block's own `forward` attribute
        for block in M.blocks(raw):
            block.__dict__.pop("forward", None)

    def run(batch, checkpointing, steps=3, update=True):   # -> (loss, grad norm, median step s, peak bytes or None)
        plain()
        if checkpointing:
            train.parallelize(raw, c, 1, device, hw)
        x = torch.randint(0, c.vocab_size, (batch, T), generator=torch.Generator().manual_seed(batch)).to(device)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            with autocast:
                loss = M.lm_loss(raw, x, x)
            loss.backward()
            norm = train.gradient_clipping(raw.parameters(), 1.0)
            if update:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss, norm = loss.item(), norm.item()   # (waits for the device)
            times.append(time.perf_counter() - t0)
        return loss, norm, statistics.median(times), torch.cuda.max_memory_allocated(device) if cuda else None

    def row(label, batch, checkpointing):   # -> the peak bytes; None off CUDA or after an out-of-memory
        try:
            step, peak = run(batch, checkpointing)[2:]
        except torch.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
            print(f"{label:<30} {batch:>4}x{T:<4} out of memory")
            return None
        predicted = f"{(fixed + per_seq * batch) / gb:.1f} GB" if checkpointing else "-"
        print(f"{label:<30} {batch:>4}x{T:<4} {step:>8.3f} {f'{peak / gb:.1f} GB' if peak else '-':>10} "
              f"{predicted:>10}")
        return peak

    try:
        # the same weights and batch each way; the second run's update makes the optimizer's state before the timing
        (loss0, norm0, *_), (loss1, norm1, *_) = (run(2, ckpt, steps=1, update=ckpt) for ckpt in (False, True))
        worst = max(abs(loss1 - loss0) / loss0, abs(norm1 - norm0) / norm0)
        check("activation checkpointing vs without: loss, grad", worst < 1e-3, f"max rel diff {worst:.1e} (loss "
              f"{loss1:.4f}, gradient norm {norm1:.4f})")
        print(f"{'activation checkpointing':<30} {'batch':>7} {'step s':>8} {'peak mem':>10} {'flops.py':>10}   "
              f"({mcfg['arch']} {c.num_layers} x {c.d_model}, {hw['dtype']}, eager, "
              f"{'fused AdamW' if hw['fused'] else 'train.AdamW'})")
        peaks = {n: row("on", n, True) for n in (batch0, 2 * batch0)}
        for n in (batch0, 2 * batch0):
            row("off", n, False)
        if not cuda or None in peaks.values():
            return
        slope = (peaks[2 * batch0] - peaks[batch0]) / batch0
        intercept = peaks[batch0] - slope * batch0
        check("checkpointed peak memory within flops.py's", all(p <= fixed + per_seq * n for n, p in peaks.items()),
              f"fit {slope / gb:.2f} * batch + {intercept / gb:.2f} GB; flops.py (fp32 activations) "
              f"{per_seq / gb:.2f} * batch + {fixed / gb:.2f} GB")
        if slope <= 0:
            return
        batch = int((torch.cuda.get_device_properties(device).total_memory - intercept) / slope)
        for _ in range(3):
            if row("on, the largest batch", batch, True) is not None:
                return
            batch = int(0.95 * batch)
    finally:
        plain()   # (the wrappers hold their blocks: without this the model would outlive the call on the GPU)


def _ddp_rank(rank, world, port, cfg):
    """One process of _ddp_check, with the environment torchrun gives its workers (so train.py takes its DDP path:
    the GPU of its LOCAL_RANK, NCCL on CUDA, gloo elsewhere)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    train.train(cfg, log=lambda *a, **k: None)


def _ddp_check(args, shape, device, tmp, check):
    """The GPT-2 preset's step before a long run: train.train compiled under DDP over --procs processes (every GPU),
    2 micro-steps an optimizer step with no_sync on the first, at the preset's batch of 64 (--batch_size with
    --tiny), against one process taking all 2 x procs micro-steps of the same windows (the sequential sampler gives
    rank r every procs-th window). Compared: the loss and the gradient norm (before clipping, of the all-reduced
    gradient) at each of the first steps: a gradient that is not the sum over every micro-step of every rank moves
    the norm. Then the DDP run's tokens/s (the whole step, all ranks) and MFU (per GPU)."""
    cuda = torch.device(device).type == "cuda"
    procs = args.procs or (torch.cuda.device_count() if cuda else 2)
    if procs < 2:
        print(f"DDP check skipped: {procs} process{'es' * (procs != 1)} ({'GPUs visible' if cuda else '--procs'}); "
              f"it needs 2 or more (on a node: every GPU)")
        return
    B, T, accum = args.batch_size if args.tiny else train.PRESETS["gpt2-124m"]["batch_size"], shape["context_length"], 2
    per_step, compared = B * T * accum * procs, min(args.steps, 3)
    data = tmp / "ddp_data"
    data.mkdir()
    _write_tokens(data / "train.bin", (compared + 1) * per_step + 1, shape["vocab_size"], 2)   # (compared: 1st epoch)
    _write_tokens(data / "val.bin", B * T * procs + 1, shape["vocab_size"], 3)
    cfg = dict(train.DEFAULTS, model="gpt2", **shape, batch_size=B, total_batch_tokens=per_step, data_dir=str(data),
               prepare_data=False, resume=False, max_iters=args.steps, lr_decay_iters=args.steps, warmup_iters=2,
               eval_interval=10 ** 9, eval_iters=1, log_interval=1, num_samples=0, device=device, compile="true",
               compile_backend=args.compile_backend, time_budget="", sampler="sequential", seed=0)
    label = f"gpt2 DDP x{procs} compiled"
    what = f"DDP x{procs}, {accum} micro-steps (no_sync) vs 1 process"
    try:
        if cuda:
            torch.cuda.empty_cache()   # (rank 0 shares GPU 0 with this process)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        torch.multiprocessing.spawn(_ddp_rank, args=(procs, port, dict(cfg, out_dir=str(tmp / "ddp"),
                                                                      num_threads=0 if cuda else 1)), nprocs=procs)
        train.train(dict(cfg, out_dir=str(tmp / "one"), max_iters=compared), log=lambda *a, **k: None)
    except Exception as e:   # a rank that failed: its last line
        check(what, False, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:200]}")
        return
    ddp, one = ([json.loads(line) for line in (tmp / name / "log.jsonl").read_text().splitlines()] for name in
                ("ddp", "one"))
    ddp, one = ([r for r in rows if r["type"] == "train"] for rows in (ddp, one))
    worst = max(abs(a[k] - b[k]) / abs(b[k]) for a, b in zip(ddp, one) for k in ("loss", "grad_norm"))
    check(what, worst < 1e-2 and len(one) == compared, f"loss and gradient norm of steps 1-{compared}: max rel diff "
          f"{worst:.1e}")
    timed = ddp[args.steps // 2:]
    tps = statistics.median(r["tokens_per_sec"] for r in timed)
    mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
    print(f"{label:<30} {B:>4}x{T:<4} {tps:>10,.0f} {100 * statistics.median(mfu) if mfu else 0:>6.1f}% "
          f"{'-':>10}   ({accum} micro-steps x {procs} processes a step)")


# -----------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sections = parser.add_subparsers(dest="section", required=True)

    p = sections.add_parser("tokenizer", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="bpe.py vs Hugging Face tokenizers (training) and tiktoken (encoding)")
    p.set_defaults(run=bench_tokenizer)
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats per measurement (medians reported)")
    p.add_argument("--parts", default="train,encode,encode_file", help="comma list of train, encode, encode_file")
    p.add_argument("--texts", default="", help="comma list of PATH:VOCAB, the training cases (the first one is also "
                   "the encoding text); empty: the speedrun's TinyStories text (data/tinystories-head/train.txt, "
                   "fetched once) at 10000")
    p.add_argument("--mix20", type=os.path.expanduser, default="/tmp/mix20.txt",
                   help="~20 MB corpus (made from the --texts files, repeated, if absent)")
    p.add_argument("--big", type=int, default=1, help="1: also train on the ~20 MB corpus")
    p.add_argument("--hf_encode", type=int, default=1, help="1: also time HF tokenizers' encode")

    p = sections.add_parser("model", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="TransformerLM / GPT train step and KV-cached generation vs transformers")
    p.set_defaults(run=bench_model)
    p.add_argument("--parts", default="train,generate", help="comma list of train, generate, compile")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per side (median reported)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--only", default="", help="train: run only cases containing this text, e.g. llama-sdpa")

    p = sections.add_parser("train", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="the whole training loop vs the model-only step, and the loader alone")
    p.set_defaults(run=bench_train)
    p.add_argument("--shape", default="cs336", choices=list(SHAPES), help="cs336 (d 512) or small (the main job's)")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per step")
    p.add_argument("--steps", type=int, default=4, help="measured steps per repeat")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (medians reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--dtypes", default="float32", help="comma list: float32,bfloat16 (CPU autocast)")

    p = sections.add_parser("dtype", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="train.py's loop at float32 and bfloat16 on this CPU, at the main job's and the CPU "
                            "presets' shapes: the measurement behind --dtype=auto's rule")
    p.set_defaults(run=bench_dtype)
    p.add_argument("--steps", type=int, default=12, help="measured steps per run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per dtype (medians reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--only", default="", help="run only the shapes whose name contains this text, e.g. preset")

    p = sections.add_parser("loss", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="the Llama's training loss in chunks (model(idx, targets=y)) against the head then "
                            "cross_entropy, at the shapes of the dtype section")
    p.set_defaults(run=bench_loss)
    p.add_argument("--steps", type=int, default=10, help="measured steps of each way (interleaved, medians)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma list: float32,bfloat16 (CPU autocast)")
    p.add_argument("--only", default="", help="run only the shapes whose name contains this text, e.g. preset")

    p = sections.add_parser("gpu", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="every CUDA path checked against a reference, then train.py's tokens/s and MFU")
    p.set_defaults(run=bench_gpu)
    p.add_argument("--device", default=None, help="default cuda if available, else cpu")
    p.add_argument("--tiny", action="store_true", help="tiny shapes instead of GPT-2 124M (for CPU runs and tests)")
    p.add_argument("--batch_size", type=int, default=32, help="sequences per step in the timed training runs")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per timed run (the second half is timed)")
    p.add_argument("--compile_backend", default="inductor", help="torch.compile backend")
    p.add_argument("--procs", type=int, default=0, help="processes of the DDP check, one per GPU (0: every visible "
                   "GPU; on the CPU 2 gloo processes); fewer than 2: no DDP check")

    p = sections.add_parser("memory", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="per-rank bytes, DDP vs FSDP; step memory and time with activation checkpointing")
    p.set_defaults(run=bench_memory)
    p.add_argument("--d_model", type=int, default=256, help="model width")
    p.add_argument("--num_layers", type=int, default=8, help="layers")
    p.add_argument("--num_heads", type=int, default=4, help="attention heads")
    p.add_argument("--context_length", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--vocab_size", type=int, default=4096, help="vocabulary")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per step (activation checkpointing)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per process")
    p.add_argument("--repeats", type=int, default=3, help="interleaved processes per variant (medians reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")

    p = sections.add_parser("sample", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="sample.generate vs transformers generate(use_cache=True)")
    p.set_defaults(run=bench_sample)
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--max_new_tokens", type=int, default=256, help="tokens generated per row")
    p.add_argument("--prompt_len", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--modes", default="greedy,top_p", help="decoding modes to time: greedy, top_p")
    p = sections.add_parser("speedrun", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="the best model a fixed wall clock trains: ours beside HF tokenizers + Llama + AdamW")
    p.set_defaults(run=bench_speedrun)
    p.add_argument("--minutes", type=float, default=5.0, help="training time of each run")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds, one run per side each (medians reported)")
    p.add_argument("--peer_lr", default="1e-3,3e-3",
                   help="comma list of the peer's learning rates (its best counts; '' = no peer)")
    p.add_argument("--ours", default="", help="train.py flags for our runs, e.g. \"--learning_rate=3e-3\" (the "
                   "peer's shape and schedule otherwise; a --preset brings its own)")
    p.add_argument("--curve", default="", help="also score both sides every --curve_every steps (off the clock) and "
                   "draw validation bits/byte against training time into this PNG")
    p.add_argument("--curve_every", type=int, default=10, help="steps between the curve's points")
    p.add_argument("--curve_tokens", type=int, default=8192, help="validation tokens each curve point scores")
    p.add_argument("--train", type=os.path.expanduser, default="", help="training text; empty: the first 2 MiB of "
                   "TinyStories' train split (fineweb.py --tinystories_head, fetched once into data/tinystories-head/)")
    p.add_argument("--valid", type=os.path.expanduser, default="", help="validation text, scored whole; empty: the "
                   "first 1,000 stories of TinyStories' validation split (as --train)")
    p.add_argument("--peer_dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the peer's autocast dtype (auto: train.py's --dtype=auto rule for the peer's width on this "
                   "CPU; ours follows train.py's --dtype, auto unless --ours sets it)")
    p.add_argument("--vocab_size", type=int, default=4096, help="both tokenizers' vocabulary")
    p.add_argument("--d_model", type=int, default=256, help="model width (both sides)")
    p.add_argument("--num_layers", type=int, default=4, help="layers")
    p.add_argument("--num_heads", type=int, default=8, help="attention heads")
    p.add_argument("--d_ff", type=int, default=704, help="SwiGLU hidden width")
    p.add_argument("--context_length", type=int, default=256, help="tokens per sequence")
    p.add_argument("--batch_size", type=int, default=16, help="sequences per step")
    for q in (parser, *sections.choices.values()):
        bpe.one_line_errors(q)
    args = parser.parse_args()
    gpu_steps = 2 if args.run is bench_gpu else 1  # the gpu section times the second half of its steps
    for name, least in (("repeats", 1), ("steps", gpu_steps), ("procs", 0), ("threads", 1), ("max_new_tokens", 1),
                        ("prompt_len", 1), ("batch_size", 1), ("d_model", 1), ("num_layers", 1), ("num_heads", 1),
                        ("d_ff", 1), ("context_length", 1), ("vocab_size", 1)):
        value = getattr(args, name, None)  # checked before any model is built
        if value is not None and value < least:
            raise SystemExit(f"bench.py: --{name} {value}: expected at least {least}")
    known = {(bench_tokenizer, "parts"): ("train", "encode", "encode_file"),
             (bench_model, "parts"): ("train", "generate", "compile"),
             (bench_train, "dtypes"): ("float32", "bfloat16"), (bench_loss, "dtypes"): ("float32", "bfloat16"),
             (bench_sample, "modes"): ("greedy", "top_p")}
    for (section, name), choices in known.items():   # a typo would time nothing, or mislabel a row
        if args.run is section:
            bad = [v for v in getattr(args, name).split(",") if v not in choices]
            if bad or not getattr(args, name):
                raise SystemExit(f"bench.py: --{name} {getattr(args, name)!r}: expected a comma list of "
                                 f"{', '.join(choices)}")
    if args.run is bench_sample and args.prompt_len + args.max_new_tokens > 1024:
        raise SystemExit(f"bench.py: --prompt_len {args.prompt_len} + --max_new_tokens {args.max_new_tokens}: the "
                         f"benchmark's GPT-2 has 1,024 positions")
    if args.run is bench_tokenizer:
        for t in filter(None, args.texts.split(",")):   # PATH:VOCAB, each file there, each vocabulary possible
            path, _, vocab = t.rpartition(":")
            if not (path and vocab.isdigit() and int(vocab) >= 257 and Path(path).is_file()):
                raise SystemExit(f"bench.py: --texts {t!r}: expected PATH:VOCAB, an existing file and a vocabulary "
                                 f"of at least 257")
    if args.run is bench_tokenizer and Path(args.mix20).is_dir():
        raise SystemExit(f"bench.py: --mix20 {args.mix20}: expected the corpus file's path (made if absent), "
                         f"got a folder")
    if (args.run is bench_tokenizer and not Path(args.mix20).is_file()
            and {"train", "encode_file"} & set(args.parts.split(","))):   # the corpus is made: it must be possible
        if not Path(args.mix20).resolve().parent.is_dir():
            raise SystemExit(f"bench.py: --mix20 {args.mix20}: no such file, and no folder "
                             f"{Path(args.mix20).resolve().parent} to make it in")
    if args.run is bench_speedrun:
        _check_speedrun_args(args)
    if args.run is bench_memory:   # the Llama's shape, said here rather than by a traceback from each spawned rank
        _check_heads_divide(args)
        if args.d_model // args.num_heads % 2:
            raise SystemExit(f"bench.py: --num_heads {args.num_heads}: expected heads of an even width (RoPE "
                             f"rotates pairs), got --d_model {args.d_model} / {args.num_heads} = "
                             f"{args.d_model // args.num_heads}")
    if args.run is bench_gpu and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit("bench.py gpu: run it as `python bench.py gpu`, not under torchrun: it starts one process "
                         "per GPU itself for its DDP check (--procs)")
    if args.run is bench_gpu and args.compile_backend not in torch.compiler.list_backends(exclude_tags=()):
        raise SystemExit(f"bench.py: --compile_backend: expected a torch.compile backend (inductor, aot_eager, ...: "
                         f"see torch.compiler.list_backends()), got {args.compile_backend!r}")
    if args.run is bench_gpu and args.device is not None:
        import model as model_lib
        try:
            model_lib.resolve_device(args.device)
        except ValueError as e:
            raise SystemExit(f"bench.py: {e}")
    try:
        args.run(args)
    except KeyboardInterrupt:
        raise SystemExit("\nbench.py: interrupted") from None


if __name__ == "__main__":
    main()
