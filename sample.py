"""
Generate text from a trained checkpoint (or OpenAI's GPT-2 weights), streaming tokens to the terminal.

    python sample.py --top_p 0.9                          # out/ckpt.pt, the default run of train.py
    python sample.py --ckpt=runs/ts/ckpt.pt --prompt="Once upon a time" --num_samples=3
    python sample.py --init_from=gpt2 --prompt="Hello, I'm a language model," --temperature=0.8 --top_k=50
    python sample.py --prompt=FILE:prompt.txt --temperature=0          # greedy, prompt read from a file

Decoding: logits / temperature -> top-k (exactly k tokens) -> top-p (the smallest set of tokens whose
probability reaches p) -> sample; temperature 0 is greedy (argmax). Ties in top-k / top-p are broken
toward the lower token id, so the kept set is always deterministic. Top-k and top-p rank candidates with
topk, far cheaper than sorting a 50k vocabulary. Top-p looks at the 256 most likely tokens first; when their
mass is short of p (a flat distribution), it finds its cut-off by a radix select over the vocabulary (see
`_nucleus`), still without a sort. A token is drawn by inverse CDF from one uniform number per row, so a
seeded torch.Generator gives the same tokens with and without the KV cache. Generation stops at
<|endoftext|> unless --no_stop. Speed on CPU: greedy avoids PyTorch's slow CPU argmax (`greedy`), and from batch 4
decoding goes through the LM head packed once for MKL (`packed_lm_head`).
`generate()` is the library function train.py and the tests use.

Context: a prompt longer than the model's context keeps its last `context_length` tokens (with a warning).
When generation runs past the context, the oldest half of the window is dropped and the KV cache is
rebuilt from the remaining tokens (one re-prefill every context/2 tokens), so the model always sees at least
half a context of history; the uncached path uses exactly the same windows, so both give identical tokens.
"""
import argparse
import codecs
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# sampling from one step's logits


TOP_P_CANDIDATES = 256  # top-p ranks this many tokens first: a trained model's nucleus is usually smaller


def _ranked(probs, m):
    """The m most likely tokens of each row, most likely first, ties toward the lower id: (probs, ids).

    Exactly the first m of a stable descending sort, but with topk, which is much cheaper than sorting
    the whole vocabulary: one int64 key per token orders by value then id (the bits of a non-negative float32
    grow with its value; the low 20 bits hold the reversed id, so keys are unique)."""
    V = probs.size(-1)
    if m >= V or probs.dtype != torch.float32 or V > 1 << 20:
        return [t[..., :m] for t in torch.sort(probs, dim=-1, descending=True, stable=True)]
    ids = torch.arange(V, device=probs.device)
    keys = (probs.view(torch.int32).long() << 20) | (V - 1 - ids)
    top = torch.topk(keys, m, dim=-1).indices
    return probs.gather(-1, top), top


def _nucleus(probs, top_p):
    """The top-p nucleus of each row of probs (B, V) float32 as a bool mask, found without sorting.

    A radix select on the bits of the probabilities (a non-negative float32's bits, read as an integer, grow
    with its value): three passes over 11 + 10 + 10 bits find v, the probability of the last token kept, i.e.
    the largest v such that the tokens with probability >= v hold p of the mass. Then every token above v is
    kept, and of the tokens equal to v, in id order, as many as needed. Sums are float64 (exact for float32
    addends of similar size), so the set equals a stable sort + cumsum's, at a few passes over the vocabulary
    instead of a 50k sort (2-4x faster than that sort on CPU at batch 8).
    """
    B, V = probs.shape
    weights = probs.double()  # the mass of the tokens that share the bits found so far; 0 for the others
    target = top_p * weights.sum(-1, keepdim=True)
    bits = probs.view(torch.int32)
    above = weights.new_zeros(B, 1)  # mass of the tokens known to rank above those still in play
    prefix = torch.zeros_like(bits[:, :1])  # the bits of v found so far
    # one int64 buffer (scatter_add_ indexes with int64) for the digits of every pass: fresh (B, V) tensors at
    # every pass cost more than the arithmetic on them
    digit = torch.empty_like(bits, dtype=torch.int64)
    for shift, n in ((20, 2048), (10, 1024), (0, 1024)):
        torch.bitwise_right_shift(bits, shift, out=digit).bitwise_and_(n - 1)
        mass = weights.new_zeros(B, n).scatter_add_(1, digit, weights)  # mass per value of this digit
        reach = above + mass.sum(-1, keepdim=True) - mass.cumsum(-1) + mass  # mass above + digits >= d
        d = ((reach >= target).sum(-1, keepdim=True) - 1).clamp(min=0)  # the largest digit that reaches p
        above = torch.cat([reach, above], -1).gather(1, d + 1)  # + the digits > d
        prefix = (prefix << (n.bit_length() - 1)) | d.int()
        if shift:
            weights.masked_fill_(digit != d, 0)
    # of the tokens equal to v, in id order, the j-th (from 0) is kept while above + j * v < target: count them
    # on a few j around the boundary (B, 4) rather than on the whole (B, V)
    v = prefix.view(torch.float32).double()
    j = ((target - above) / v).floor() + torch.arange(-1.0, 3.0, dtype=torch.float64, device=probs.device)
    count = torch.where((j >= 0) & (above + j * v < target), j + 1, 0).amax(-1, keepdim=True).clamp(max=V).int()
    tied = bits == prefix
    return (bits > prefix) | (tied & (tied.int().cumsum(-1, dtype=torch.int32) <= count))


def candidates(probs, top_k=None, top_p=None):
    """The tokens that may be sampled, as (probs, ids) of shape (B, m), renormalised (0 = excluded);
    ids is None when the probs span the whole vocabulary.

    top-k keeps exactly k tokens; top-p keeps the smallest set, in decreasing probability, whose mass
    reaches p (on the top-k-renormalised distribution when both are given, as Hugging Face does). Equal
    probabilities rank by token id, so at a tie on the boundary the lower ids are kept. probs: (B, V).
    """
    V = probs.size(-1)
    use_p = top_p is not None and top_p < 1.0
    if not top_k and not use_p:
        return probs, None
    if top_k or probs.dtype != torch.float32 or V <= TOP_P_CANDIDATES:
        sp, si = _ranked(probs, min(top_k or V, V))
        return _cut(sp, si, top_p if use_p else None)
    # top-p alone over a big vocabulary: rank only the TOP_P_CANDIDATES most likely tokens (topk), enough for a
    # trained model's nucleus in the usual case. A flat distribution, whose nucleus is larger (even that many
    # tokens at the top probability fall short of p), gets the radix select over the vocabulary instead: no sort
    if bool((TOP_P_CANDIDATES * probs.amax(-1) >= top_p * probs.sum(-1)).all()):  # a float32 estimate suffices
        sp, si = _ranked(probs, TOP_P_CANDIDATES)
        total = probs.sum(-1, keepdim=True, dtype=torch.float64)
        if bool((sp.double().sum(-1, keepdim=True) >= top_p * total).all()):  # exact
            return _cut(sp, si, top_p, total)
    kept = torch.where(_nucleus(probs, top_p), probs, 0.0)
    return kept / kept.sum(-1, keepdim=True), None


def _cut(sp, si, top_p, total=None):
    """Renormalised (probs, ids) of ranked candidates (B, m): with top_p, a token is kept while the mass ranked
    above it is below top_p * total, i.e. up to and including the one that reaches it. total: the mass p refers
    to (default: the candidates' own, as after top-k). The most likely token is always kept."""
    keep = torch.ones_like(sp, dtype=torch.bool)
    if top_p is not None:
        kept = sp.double()  # float64 so sums of hand-made probabilities (0.5 + 0.25 ...) are exact
        total = kept.sum(-1, keepdim=True) if total is None else total
        before = F.pad(kept.cumsum(-1)[:, :-1], (1, 0))  # mass of the tokens ranked above
        keep = before < top_p * total
    keep[:, 0] = True
    sp = sp * keep
    return sp / sp.sum(-1, keepdim=True), si


def filter_probs(probs, top_k=None, top_p=None):
    """The top-k / top-p filtered distribution over the whole vocabulary, (B, V), renormalised."""
    cp, ci = candidates(probs, top_k, top_p)
    return cp if ci is None else torch.zeros_like(probs).scatter_(-1, ci, cp)


def draw(probs, generator=None):
    """One index per row of probs (B, n) by inverse-CDF sampling: one uniform number per row, so the random
    stream advances the same way whatever the distribution; zero-probability entries are never drawn."""
    gen_device = generator.device if generator is not None else probs.device
    u = torch.rand(probs.size(0), 1, generator=generator, device=gen_device, dtype=torch.float64).to(probs.device)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:]
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # a guard: only u == 1 could reach total
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)  # the first entry whose cdf exceeds x: nonzero


GREEDY_NUMPY_MAX_BATCH, GREEDY_TWO_PASS_MIN_BATCH = 32, 4


def greedy(logits, block=1024):
    """logits.argmax(-1) (the first maximum on ties, the first NaN if any) for (B, V) logits, faster on CPU.

    PyTorch's CPU argmax over a 50k vocabulary is slow here: ~0.1 ms a row, ~15x NumPy's vectorised argmax and
    ~8x amax. So on CPU, float32/float64 logits go through NumPy's argmax (same ties, same NaN rule) while they are
    contiguous, up to GREEDY_NUMPY_MAX_BATCH rows: 6 against 95 us at batch 1, 62 against 191 us at batch 8, about
    even with the two passes below by batch 64. NumPy over strided rows (a padded vocabulary sliced off, batch 2+)
    is slower, so those (and larger batches) take two cheaper passes instead: the maximum of each block of `block`
    logits (amax), the first block holding the row's maximum, then argmax inside that block only; a ragged tail
    past the last full block is checked on its own. Its six small ops only pay from batch 4 (batch 8: 0.12-0.35 ms
    against 0.5 ms for argmax)."""
    B, V = logits.shape
    n = V // block
    cpu = logits.device.type == "cpu"
    numpy_ok = logits.is_contiguous() and logits.dtype in (torch.float32, torch.float64)
    if cpu and numpy_ok and B <= GREEDY_NUMPY_MAX_BATCH:
        return torch.from_numpy(np.argmax(logits.detach().numpy(), axis=-1)).long()
    if not cpu or n < 2 or B < GREEDY_TWO_PASS_MIN_BATCH:
        return logits.argmax(-1)
    blocks = logits[:, :n * block].unflatten(-1, (n, block))  # a view: rows are contiguous
    top = blocks.amax(-1).max(-1)  # (values, first block with the maximum)
    rows = torch.arange(B, device=logits.device)
    best = top.indices * block + blocks[rows, top.indices].argmax(-1)
    if n * block < V:  # the tail wins only when strictly larger (it lies after every full block), or, as in
        tail = logits[:, n * block:].max(-1)  # argmax, when it holds the row's first NaN
        wins = (tail.values > top.values) | (tail.values.isnan() & ~top.values.isnan())
        best = torch.where(wins, tail.indices + n * block, best)
    return best


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token per row from logits (B, V): greedy when temperature == 0, else sampled."""
    if abs(temperature) <= 2 ** -150:   # 0, or so small that float32 rounds it to 0 (no tensor made per step)
        return greedy(logits)
    logits = logits.float()
    # the max subtracted before dividing: a tiny temperature sends the others to -inf instead of overflowing to NaN
    probs = F.softmax((logits - logits.amax(-1, keepdim=True)) / temperature, dim=-1)
    cp, ci = candidates(probs, top_k, top_p)
    choice = draw(cp, generator)
    return choice if ci is None else ci.gather(-1, choice.unsqueeze(-1)).squeeze(-1)


def _check_sampling_args(temperature, top_k, top_p):
    if temperature is None or not 0 <= temperature < float("inf"):  # written so that NaN fails too
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")


# -----------------------------------------------------------------------------
# generation


def _unwrap(model):
    """The plain module behind DDP / torch.compile wrappers (generation runs eagerly: no recompiles)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or not isinstance(inner, torch.nn.Module):
            return model
        model = inner


PACKED_HEAD_MIN_BATCH, PACKED_HEAD_MIN_TOKENS = 4, 32


def packed_lm_head(model, batch_size, max_new_tokens):
    """The model's LM head through MKL's packed GEMM for batched decoding on CPU, or None where it does not pay.

    The head (d_model -> vocab) is most of a small model's decoding step. MKL can lay a weight out once for a
    fixed number of rows (the kernel torch.compile's CPU weight freezing uses); from batch 4 up that product
    measured 1.3-3x faster than F.linear at every width tried (128 to 1,600, vocab 50,257), and no faster at
    batch 1-2. The same float32 products summed in another order: logits agree to ~1e-5, so only a near-tie
    could make it pick another token than the plain head. Costs: ~20 ms to pack 50,257 x 256 (hence a minimum
    number of new tokens) and, while generate() runs, a packed copy measured at 1.6x the head's memory at width 768,
    2.6x at 256 and 5x at 128 (vocab 50,257).
    Inputs with another number of rows (the prefill) fall back to the plain product inside `_mkl_linear`, which
    keeps the original weight for that."""
    w = model.lm_head.weight.detach()
    if (batch_size < PACKED_HEAD_MIN_BATCH or max_new_tokens < PACKED_HEAD_MIN_TOKENS or w.device.type != "cpu"
            or w.dtype != torch.float32 or torch.is_autocast_enabled("cpu") or not torch.backends.mkl.is_available()
            or not hasattr(torch.ops.mkl, "_mkl_linear")):
        return None
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, batch_size)
    return lambda x: torch.ops.mkl._mkl_linear(x, packed, w, None, batch_size)


def _forward_logits(model, idx):
    out = model(idx)
    return out[0] if isinstance(out, tuple) else out  # GPT returns (logits, loss)


@torch.no_grad()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None, stop_token=None,
             generator=None, use_cache=True, on_token=None):
    """Continue each prompt (a list of token-id lists, lengths may differ) by up to max_new_tokens tokens.

    Returns the new tokens of every prompt, stopping at `stop_token` (not included). `on_token(row, id)` is
    called for each new token as it is produced. `generator` (a torch.Generator on the model's device)
    makes sampling reproducible. Different prompt lengths are exact, with no padding: the batch is prefilled
    with the shortest prompt's length, then each row's remaining prompt tokens are forced, one per step,
    while rows that are already past their prompt sample; every row thus sees exactly its own tokens.
    """
    _check_sampling_args(temperature, top_k, top_p)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (e.g. start from the end-of-text token)")
    model = _unwrap(model)
    ctx = model.context_length
    if any(len(p) > ctx for p in prompts):
        warnings.warn(f"a prompt is longer than the model's context ({ctx} tokens): keeping its last {ctx} tokens")
        prompts = [p[-ctx:] for p in prompts]
    device = next(model.parameters()).device
    B, lens = len(prompts), [len(p) for p in prompts]
    min_len, max_len = min(lens), max(lens)
    out = [[] for _ in range(B)]
    if max_new_tokens == 0:
        return out
    buf = torch.zeros(B, max_len + max_new_tokens, dtype=torch.long, device=device)  # prompts, then new tokens
    for i, p in enumerate(prompts):
        buf[i, :len(p)] = torch.tensor(p, dtype=torch.long)
    lengths = torch.tensor(lens, device=device)
    cache_len = min(ctx, buf.size(1))
    keep = max(1, ctx // 2)  # tokens kept when the window slides
    done = [False] * B
    lm_head = packed_lm_head(model, B, max_new_tokens) if use_cache else None

    def window_logits(start, end):
        """Logits after buf[:, start:end] from scratch (a fresh cache when caching)."""
        if not use_cache:
            return _forward_logits(model, buf[:, start:end])[:, -1], None
        cache = model.init_kv_cache(B, max_seq_len=cache_len, device=device)
        return model.forward_with_cache(buf[:, start:end], cache)[:, -1], cache

    was_training = model.training
    model.eval()
    try:
        start, pos = 0, min_len  # the model has seen buf[:, start:pos]; logits predict position pos
        logits, cache = window_logits(start, pos)
        while True:
            tok = sample_next(logits, temperature, top_k, top_p, generator)
            if pos < max_len:  # rows still inside their prompt take the prompt's token instead
                tok = torch.where(pos < lengths, buf[:, pos], tok)
            buf[:, pos] = tok
            for i, t in enumerate(tok.tolist()):
                if done[i] or pos < lens[i]:
                    continue
                if t == stop_token:
                    done[i] = True
                    continue
                out[i].append(t)
                if on_token is not None:
                    on_token(i, t)
                done[i] = len(out[i]) >= max_new_tokens
            pos += 1
            if all(done):
                break
            if pos - start > ctx:  # the window is full: slide it (the same windows with and without the cache)
                start = pos - keep
                logits, cache = window_logits(start, pos)
            elif use_cache:
                logits = model.forward_with_cache(buf[:, pos - 1:pos], cache, lm_head)[:, -1]
            else:
                logits, _ = window_logits(start, pos)
    finally:
        model.train(was_training)
    return out


# -----------------------------------------------------------------------------
# command line


class _Streamer:
    """Prints text as tokens arrive. Tokens are byte strings that may cut a UTF-8 character (GPT-2 even has tokens
    holding the end of one character and the start of the next), so an incremental decoder holds back an
    unfinished character until its last byte arrives: the printed text equals tokenizer.decode(all ids)."""

    def __init__(self, tokenizer, stream=None):
        self.tokenizer, self.stream = tokenizer, stream or sys.stdout  # looked up now: redirect_stdout works
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, row, token_id):
        self.stream.write(self.utf8.decode(self.tokenizer.decode_bytes([token_id])))
        self.stream.flush()

    def flush(self):
        self.stream.write(self.utf8.decode(b"", final=True) + "\n")
        self.stream.flush()


def load_model_and_tokenizer(ckpt_path, init_from, device, tokenizer_ref=None):
    import bpe
    import model as model_lib
    if init_from:
        try:
            model = model_lib.GPT.from_pretrained(init_from)
        except Exception as e:  # network or file problems: one line naming the flag
            raise SystemExit(f"sample.py: --init_from {init_from}: could not load the weights ({e})")
        model, ref, where, trained_with = model.to(device), "gpt2", f"--init_from {init_from}", None
    else:
        where = f"--ckpt {ckpt_path}"
        if not os.path.exists(ckpt_path):
            raise SystemExit(f"sample.py: {where}: no such checkpoint (train one with `python train.py`, "
                             f"or use --init_from=gpt2)")
        try:
            ckpt = model_lib.read_checkpoint(ckpt_path)   # on the CPU: only the weights go to the device
        except ValueError as e:
            raise SystemExit(f"sample.py: --ckpt {e}")
        if "model_config" not in ckpt or "model" not in ckpt:
            raise SystemExit(f"sample.py: {where}: not a train.py checkpoint (no model / model_config)")
        try:
            model = model_lib.model_from_checkpoint(ckpt, device=device)
        except ValueError as e:
            raise SystemExit(f"sample.py: {where}: {e}")
        ref, trained_with = ckpt.get("tokenizer"), ckpt.get("tokenizer_fingerprint")   # (older checkpoints: none)
        if not (ref or tokenizer_ref):
            raise SystemExit(f"sample.py: {where}: the checkpoint names no tokenizer (its training data had none): "
                             f"give one with --tokenizer (gpt2, or a bpe.py tokenizer folder)")
    whose = "the --tokenizer" if tokenizer_ref else "its tokenizer"
    ref = tokenizer_ref or ref
    try:
        tokenizer = bpe.load_tokenizer(ref)
    except (OSError, ValueError) as e:
        hint = "" if tokenizer_ref else " (if it moved, or the path is relative to another folder: pass --tokenizer)"
        raise SystemExit(f"sample.py: {where}: cannot load {whose} {ref!r} ({e}){hint}")
    if tokenizer.vocab_size != model.vocab_size:  # more: ids past the embedding table; fewer: ids it cannot decode
        raise SystemExit(f"sample.py: {where}: {whose} {ref!r} has {tokenizer.vocab_size} tokens but the model "
                         f"{'only ' if tokenizer.vocab_size > model.vocab_size else ''}{model.vocab_size}: not the "
                         f"tokenizer this model was trained with")
    if trained_with and (now := bpe.tokenizer_fingerprint(ref)) != trained_with:   # same size, other tokens
        what = (f"sample.py: {where}: {whose} {ref!r} is not the one this model was trained with (fingerprint {now}, "
                f"the checkpoint's {trained_with})")
        if not tokenizer_ref:   # retrained in its folder since; a --tokenizer given is the user's choice
            raise SystemExit(f"{what}: it was retrained or replaced since; pass --tokenizer")
        print(f"{what}; using it as asked", file=sys.stderr)
    return model, tokenizer


def main():
    parser = argparse.ArgumentParser(description="Generate text from a checkpoint or GPT-2 weights.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--ckpt", type=os.path.expanduser, default=None,
                        help="checkpoint written by train.py (out/ckpt.pt when neither "
                             "--ckpt nor --init_from is given)")
    parser.add_argument("--init_from", type=os.path.expanduser, default=None,
                        help="released weights instead of --ckpt: gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local HF dir")
    parser.add_argument("--tokenizer", type=os.path.expanduser, default=None,
                        help="instead of the checkpoint's tokenizer: gpt2 or a bpe.py "
                             "tokenizer folder (for a checkpoint that names none, or whose tokenizer folder moved)")
    parser.add_argument("--prompt", default="", help="prompt text, or FILE:path to read it from a file; "
                                                     "empty = start from <|endoftext|>")
    parser.add_argument("--num_samples", type=int, default=3, help="number of samples")
    parser.add_argument("--max_new_tokens", type=int, default=256, help="tokens to generate per sample")
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature; 0 = greedy")
    parser.add_argument("--top_k", type=int, default=None, help="keep only the k most likely tokens (None = all)")
    parser.add_argument("--top_p", type=float, default=1.0, help="nucleus: smallest set of tokens whose probability reaches p")
    parser.add_argument("--seed", type=int, default=1337, help="random seed")
    parser.add_argument("--no_stop", action="store_true", help="do not stop at <|endoftext|>")
    parser.add_argument("--no_cache", action="store_true", help="recompute the whole window every token (slow; for checking)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights dtype for generation")
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: {message} (see --help)\n")   # one line, no usage block
    args = parser.parse_args()

    if args.ckpt and args.init_from:
        raise SystemExit("sample.py: give one of --ckpt PATH or --init_from NAME, not both")
    args.ckpt = args.ckpt or (None if args.init_from else os.path.join("out", "ckpt.pt"))
    try:   # generate()'s own checks, before any loading, worded as flags
        _check_sampling_args(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise SystemExit(f"sample.py: --{e}") from None
    if args.num_samples < 1:
        raise SystemExit(f"sample.py: --num_samples must be >= 1, got {args.num_samples}")
    if not 0 <= args.seed < 2 ** 64:   # torch's seed range
        raise SystemExit(f"sample.py: --seed must be in [0, 2**64), got {args.seed}")
    if args.max_new_tokens < 0:
        raise SystemExit(f"sample.py: --max_new_tokens must be >= 0, got {args.max_new_tokens}")
    prompt = args.prompt
    if prompt.startswith("FILE:"):
        path = os.path.expanduser(prompt[len("FILE:"):])
        try:
            with open(path, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as e:
            raise SystemExit(f"sample.py: --prompt FILE:{path}: cannot read it ({e.strerror})")
        except UnicodeDecodeError:
            raise SystemExit(f"sample.py: --prompt FILE:{path}: not UTF-8 text")
        if not prompt:
            raise SystemExit(f"sample.py: --prompt FILE:{path}: the file is empty (leave out --prompt to start "
                             f"from <|endoftext|>)")

    from model import resolve_device
    try:
        resolve_device(args.device)
    except ValueError as e:
        raise SystemExit(f"sample.py: {e}")
    torch.manual_seed(args.seed)
    model, tokenizer = load_model_and_tokenizer(args.ckpt, args.init_from, args.device, args.tokenizer)
    model.to(dtype=getattr(torch, args.dtype)).eval()
    ids = tokenizer.encode(prompt) if prompt else []
    if not ids:
        if tokenizer.eot_id is None:
            raise SystemExit("sample.py: --prompt is empty and the tokenizer has no <|endoftext|> to start from")
        ids = [tokenizer.eot_id]
    ctx = model.context_length
    if len(ids) > ctx:
        print(f"sample.py: warning: the prompt is {len(ids)} tokens, the context is {ctx}: keeping the last {ctx}",
              file=sys.stderr)
        ids = ids[-ctx:]
    stop = None if args.no_stop else tokenizer.eot_id
    generator = torch.Generator(device=args.device).manual_seed(args.seed)

    try:
        for k in range(args.num_samples):
            print(f"---------- sample {k + 1}/{args.num_samples}")
            sys.stdout.write(prompt)
            streamer = _Streamer(tokenizer)
            generate(model, [ids], args.max_new_tokens, args.temperature, args.top_k, args.top_p, stop,
                     generator, use_cache=not args.no_cache, on_token=streamer)
            streamer.flush()
    except KeyboardInterrupt:   # Ctrl-C is how one stops a long sample: no traceback
        raise SystemExit("\nsample.py: interrupted") from None


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:   # the reader went away (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's last flush then fails silently
        sys.exit(1)
