"""
Generate text from a trained checkpoint (or OpenAI's GPT-2 weights), streaming tokens to the terminal.

    python sample.py --top_p 0.9                          # out/ckpt.pt, the default run of train.py
    python sample.py --ckpt=runs/ts/ckpt.pt --prompt="Once upon a time" --num_samples=3
    python sample.py --init_from=gpt2 --prompt="Hello, I'm a language model," --temperature=0.8 --top_k=50
    python sample.py --prompt=FILE:prompt.txt --temperature=0          # greedy, prompt read from a file

Decoding: logits / temperature -> top-k (exactly k tokens) -> top-p (the smallest set of tokens whose
probability reaches p) -> sample; temperature 0 is greedy (argmax). The candidates are ranked by a stable
sort, so ties in top-k / top-p go to the lower token id and the kept set is always deterministic. A token is
drawn by inverse CDF from one uniform number per row, so a seeded torch.Generator gives the same tokens with and
without the KV cache. Generation stops at <|endoftext|> unless --no_stop.
`generate()` is the library function train.py and the tests use; `load_model_and_tokenizer()` is how this file,
hellaswag.py, lambada.py and eval.py load a checkpoint (or GPT-2) with the tokenizer it was trained with.

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

import torch
import torch.nn.functional as F

import bpe
import model as model_lib

# -----------------------------------------------------------------------------
# sampling from one step's logits


def top_k_top_p(probs, top_k=None, top_p=None):
    """The tokens that may be sampled, most likely first: (probs (B, m), renormalised, 0 = excluded; ids (B, m)).

    top-k keeps exactly k tokens; top-p keeps the smallest set, in decreasing probability, whose mass reaches p
    (of the top-k-renormalised distribution when both are given, as Hugging Face does): a token is kept while
    the mass ranked above it is below p. The most likely token is always kept. probs: (B, V).
    """
    sp, si = torch.sort(probs, dim=-1, descending=True, stable=True)   # stable: equal probabilities by id
    if top_k:
        sp, si = sp[:, :top_k], si[:, :top_k]
    if top_p is not None and top_p < 1.0:
        mass = sp.double()   # float64, so sums of hand-made probabilities (0.5 + 0.25 ...) are exact
        before = F.pad(mass.cumsum(-1)[:, :-1], (1, 0))   # the mass ranked above each token
        keep = before < top_p * mass.sum(-1, keepdim=True)
        keep[:, 0] = True
        sp = sp * keep
    return sp / sp.sum(-1, keepdim=True), si


def filter_probs(probs, top_k=None, top_p=None):
    """The top-k / top-p filtered distribution over the whole vocabulary, (B, V), renormalised."""
    if not top_k and (top_p is None or top_p >= 1.0):
        return probs
    kept, ids = top_k_top_p(probs, top_k, top_p)
    return torch.zeros_like(probs).scatter_(-1, ids, kept)


def draw(probs, generator=None):
    """One index per row of probs (B, n) by inverse-CDF sampling: one uniform number per row, so the random
    stream advances the same way whatever the distribution; zero-probability entries are never drawn."""
    gen_device = generator.device if generator is not None else probs.device
    u = torch.rand(probs.size(0), 1, generator=generator, device=gen_device, dtype=torch.float64).to(probs.device)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:]
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # only u == 1 could reach total
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)  # the first entry whose cdf exceeds x: nonzero


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token per row from logits (B, V): greedy (the first maximum) when temperature == 0, else sampled."""
    if abs(temperature) <= 2 ** -150:   # 0, or so small that float32 rounds it to 0 (no tensor made per step)
        return logits.argmax(-1)
    logits = logits.float()
    # the max subtracted before dividing: a tiny temperature sends the others to -inf instead of overflowing to NaN
    probs = F.softmax((logits - logits.amax(-1, keepdim=True)) / temperature, dim=-1)
    if not top_k and (top_p is None or top_p >= 1.0):
        return draw(probs, generator)
    kept, ids = top_k_top_p(probs, top_k, top_p)
    return ids.gather(-1, draw(kept, generator).unsqueeze(-1)).squeeze(-1)


def _check_sampling_args(temperature, top_k, top_p):
    if temperature is None or not 0 <= temperature < float("inf"):  # written so that NaN fails too
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")


# -----------------------------------------------------------------------------
# generation


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
    model = model_lib.unwrap(model)   # generation runs eagerly: a compiled module would recompile per length
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

    def window_logits(start, end):
        """Logits after buf[:, start:end] from scratch (a fresh cache when caching)."""
        if not use_cache:
            return model_lib.logits(model, buf[:, start:end])[:, -1], None
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
                logits = model.forward_with_cache(buf[:, pos - 1:pos], cache)[:, -1]
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
    """(model, tokenizer) of a train.py checkpoint (--ckpt) or of released GPT-2 weights (--init_from), with the
    tokenizer it was trained with: the checkpoint's own, or --tokenizer, which must match it (bpe.tokenizer_for:
    the same vocabulary size and, for a checkpoint, the same fingerprint). Says on stderr what it loaded (rank 0).
    Any problem is one ValueError naming the flag. hellaswag.py, lambada.py and eval.py load through this too."""
    model, ckpt = model_lib.load_model(ckpt_path, init_from, device)
    where = f"--init_from {init_from}" if init_from else f"--ckpt {ckpt_path}"
    ref = tokenizer_ref or ckpt.get("tokenizer")
    if not ref:
        raise ValueError(f"{where}: the checkpoint names no tokenizer (its training data had none): give one with "
                         f"--tokenizer (gpt2, or a bpe.py tokenizer folder)")
    try:
        tokenizer = bpe.tokenizer_for(ref, model.vocab_size, ckpt.get("tokenizer_fingerprint"), "this model")
    except bpe.TokenizerMismatch as e:
        raise ValueError(f"{where}: {e}" + ("" if tokenizer_ref else "; pass --tokenizer")) from None
    except (OSError, ValueError) as e:
        hint = "" if tokenizer_ref else " (if it moved, or the path is relative to another folder: pass --tokenizer)"
        raise ValueError(f"{where}: cannot load {'--tokenizer' if tokenizer_ref else 'its tokenizer'} {ref!r} "
                         f"({e}){hint}") from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"loaded {where} ({model_lib.describe(model)}), tokenizer {ref}", file=sys.stderr)
    return model, tokenizer


def main():
    parser = argparse.ArgumentParser(description="Generate text from a checkpoint or GPT-2 weights.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--ckpt", type=os.path.expanduser, default=None,
                        help="checkpoint written by train.py (out/ckpt.pt when neither "
                             "--ckpt nor --init_from is given)")
    parser.add_argument("--init_from", type=os.path.expanduser, default=None,
                        help="released weights instead of --ckpt: gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local HF "
                             "dir")
    parser.add_argument("--tokenizer", type=os.path.expanduser, default=None,
                        help="instead of the checkpoint's tokenizer: gpt2 or a bpe.py "
                             "tokenizer folder (for a checkpoint that names none, or whose tokenizer folder moved)")
    parser.add_argument("--prompt", default="", help="prompt text, or FILE:path to read it from a file; "
                                                     "empty = start from <|endoftext|>")
    parser.add_argument("--num_samples", type=int, default=3, help="number of samples")
    parser.add_argument("--max_new_tokens", type=int, default=256, help="tokens to generate per sample")
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature; 0 = greedy")
    parser.add_argument("--top_k", type=int, default=None, help="keep only the k most likely tokens (None = all)")
    parser.add_argument("--top_p", type=float, default=1.0,
                        help="nucleus: smallest set of tokens whose probability reaches p")
    parser.add_argument("--seed", type=int, default=1337, help="random seed")
    parser.add_argument("--no_stop", action="store_true", help="do not stop at <|endoftext|>")
    parser.add_argument("--no_cache", action="store_true",
                        help="recompute the whole window every token (slow; for checking)")
    parser.add_argument("--device", default="auto",
                        help="auto (cuda if available, else cpu), cpu, cuda, cuda:1 or mps")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights dtype for generation")
    bpe.one_line_errors(parser)
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

    torch.manual_seed(args.seed)
    try:
        device = str(model_lib.resolve_device(args.device))   # auto -> cuda or cpu
        model, tokenizer = load_model_and_tokenizer(args.ckpt, args.init_from, device, args.tokenizer)
    except ValueError as e:
        raise SystemExit(f"sample.py: {e}") from None
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
    generator = torch.Generator(device=device).manual_seed(args.seed)

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
    bpe.run_main(main)
