"""Byte-level BPE tokenizer: train on a text file, encode / decode, save / load (GPT-2 file format).

Train a 10k vocabulary on TinyStories and save it to a tokenizer directory (prints wall time, peak memory,
the longest token and bytes/token; a bare `python bpe.py` trains on the main job's corpus, data/tinystories/train.txt,
prepared first by `fineweb.py --prepare_tinystories` when absent):

    python bpe.py --vocab 10000 --input data/TinyStories-train.txt --special "<|endoftext|>" --out tok/ts10k

Encode a text file into a token file (uint16 ids; uint32 for vocabularies above 65,536) with all cores:

    python bpe.py --encode data/TinyStories-valid.txt --tokenizer tok/ts10k --out data/ts_val.bin
    python bpe.py --encode data/owt_valid.txt --tokenizer gpt2 --out data/owt_val.bin   # tiktoken's GPT-2

An existing --out (a tokenizer folder that has files, or a token file) is refused unless --force.

From Python:

    vocab, merges = train_bpe("corpus.txt", 10000, ["<|endoftext|>"])
    vocab, merges = train_bpe_reference(open("corpus.txt").read(), 10000, ["<|endoftext|>"])   # the same, slowly
    tok = Tokenizer(vocab, merges, ["<|endoftext|>"]); ids = tok.encode("Hello!"); tok.decode(ids)
    tok = load_tokenizer("tok/ts10k")   # or load_tokenizer("gpt2")

How it works, in one paragraph. Text is first split on the special tokens (longest match first), then
cut into pre-tokens by the GPT-2 regex; BPE merges never cross either boundary. Training repeatedly merges
the most frequent adjacent pair (ties -> the lexicographically greater pair of bytes): the first definition
below, `train_bpe_reference`, does exactly that in plain Python and is the specification. `train_bpe` gives
the same vocabulary and merges fast: it counts the distinct pre-tokens (in parallel worker processes, over
chunks of the file cut at special tokens), then updates pair counts only for the words that contain the
merged pair. Encoding applies the merges in creation order to each distinct pre-token once and caches the
result.

A speed trick used by both training and encoding (see `_pieces_into`): the GPT-2 regex never puts a
whitespace character after a non-whitespace one in the same pre-token, and a single space in front of a
non-space character always sticks to it. So once the rare whitespace runs in which a space touches
another whitespace character are cut out, `str.split(" ")` (C speed) gives "pieces" (" " + word) whose
pre-tokenisation is independent of their neighbours; the slow regex then runs once per DISTINCT piece.
"""
import argparse
import codecs
import hashlib
import json
import os
import subprocess
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from heapq import heapify, heappop, heappush
from functools import reduce
from itertools import chain
from operator import iadd
from pathlib import Path

import regex

# GPT-2's pre-tokeniser pattern (Radford et al. 2019, openai/gpt-2 encoder.py), used by training and encoding.
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PRETOKEN_RE = regex.compile(GPT2_SPLIT_PATTERN)
EOT = "<|endoftext|>"


# -----------------------------------------------------------------------------
# the algorithm: its specification, then the fast trainer

def train_bpe_reference(text, vocab_size, special_tokens=()):
    """Byte-level BPE training, written for clarity, not speed: the specification that train_bpe meets exactly.

    The text is split at the special tokens (longest first; they are removed, so no merge crosses them), each part
    into pre-tokens by the GPT-2 regex, each pre-token into its UTF-8 bytes. Then, until the vocabulary is full or
    no pair is left: count every adjacent pair of tokens inside the pre-tokens, merge the most frequent pair
    everywhere (left to right), ties going to the lexicographically greater pair of bytes. Returns (vocab, merges)
    as train_bpe does: ids for the special tokens first, then the 256 bytes, then the merges in creation order.
    Each merge here recounts every pair of the text; train_bpe updates only the counts that a merge changes.
    """
    special_tokens = list(dict.fromkeys(special_tokens))
    vocab = {i: t.encode("utf-8") for i, t in enumerate(special_tokens)}
    vocab.update({len(special_tokens) + b: bytes([b]) for b in range(256)})
    longest_first = sorted(special_tokens, key=len, reverse=True)
    docs = regex.split("|".join(map(regex.escape, longest_first)), text) if special_tokens else [text]
    words = Counter()   # pre-token as a tuple of tokens (bytes) -> how often it occurs
    for doc in docs:
        for t in regex.findall(GPT2_SPLIT_PATTERN, doc):
            words[tuple(bytes([b]) for b in t.encode("utf-8"))] += 1
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for w, c in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += c
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        merged = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return vocab, merges


def train_bpe(input_path, vocab_size, special_tokens=(), num_workers=None, stats=None, progress=False, **opts):
    """Train a byte-level BPE; returns (vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]]).

    The result is train_bpe_reference's on the file's text (invalid UTF-8 read as U+FFFD), reached in two phases:
    the distinct pre-tokens counted in parallel processes (count_pretokens_file), then merged (merge_pretokens).
    Ids: special tokens first (0, 1, ...), then the 256 bytes, then merges in creation order.
    Ties in pair frequency go to the lexicographically greater pair of bytes (GPT-2 / CS336 convention).
    `stats` (a dict) receives timings and counts; `progress` prints a one-line merge progress display.
    """
    special_tokens = list(dict.fromkeys(special_tokens or ()))
    if any(not isinstance(t, str) or not t for t in special_tokens):
        raise ValueError(f"special_tokens must be non-empty strings, got {special_tokens!r}")
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size={vocab_size} is smaller than 256 bytes + {len(special_tokens)} special tokens")
    stats = stats if stats is not None else {}
    t0 = time.perf_counter()
    counts = count_pretokens_file(input_path, special_tokens, num_workers, stats=stats, progress=progress, **opts)
    t1 = time.perf_counter()
    stats["pretokenize_s"] = t1 - t0
    stats["num_pretokens"] = len(counts)
    vocab, merges = merge_pretokens(counts, vocab_size, special_tokens, progress)  # empties counts
    stats["merge_s"] = time.perf_counter() - t1
    # all processes: the pre-tokenisation phase (main + workers) or the merge loop (main alone), the larger
    stats["merge_peak_kb"] = peak_rss_kb()
    stats["peak_rss_kb"] = max(stats.get("pretokenize_peak_kb", 0), stats["merge_peak_kb"])
    return vocab, merges


def merge_pretokens(counts, vocab_size, special_tokens=(), progress=False):
    """The BPE merge loop over pre-token counts {str: int}; returns (vocab, merges) as train_bpe does.

    `counts` is emptied once the words are built from it, so that its memory is free for the merge loop.
    """
    vocab = {i: t.encode("utf-8") for i, t in enumerate(special_tokens)}
    offset = len(special_tokens)
    vocab.update({offset + b: bytes([b]) for b in range(256)})
    keys = [None] * offset + [_inverse_key(bytes([b])) for b in range(256)]
    merges = []

    # words: distinct pre-tokens as lists of token ids; the merge loop edits them in place
    words, wcounts = [], []
    pair_counts = defaultdict(int)
    pair_words = defaultdict(list)  # pair -> indices of words that contain (or once contained) it (lists: lean)
    for tok, c in counts.items():
        w = [offset + b for b in tok.encode("utf-8")]
        if len(w) < 2:
            continue
        i = len(words)
        words.append(w)
        wcounts.append(c)
        for p in zip(w, w[1:]):
            pair_counts[p] += c
            ws = pair_words[p]
            if not ws or ws[-1] != i:   # each word once per pair: a word of 40,000 newlines holds (\n, \n) 39,999
                ws.append(i)            # times, and every copy would be a scan of the word at each merge
    counts.clear()
    heap = [(-c, keys[p[0]] + keys[p[1]], p) for p, c in pair_counts.items()]
    heapify(heap)

    num_merges = vocab_size - len(vocab)
    bar = progress_bar(num_merges, "merging", "merge", enabled=progress)
    while len(merges) < num_merges and heap:
        negc, _, pair = heappop(heap)
        c = pair_counts.get(pair, 0)
        if c != -negc:  # stale entry (the count went down since it was pushed): lazy invalidation
            if c > 0:
                a, b = pair
                heappush(heap, (-c, keys[a] + keys[b], pair))
            continue
        a, b = pair
        new = len(vocab)
        vocab[new] = vocab[a] + vocab[b]
        keys.append(keys[a][:-1] + keys[b])  # == _inverse_key(vocab[new])
        merges.append((vocab[a], vocab[b]))
        touched = set()  # pairs that contain the new token
        for wi in pair_words.pop(pair):
            w = words[wi]
            if a not in w:
                continue  # the index is lazy: this word lost the pair in an earlier merge
            try:  # first site of (a, b); C-speed list.index instead of a Python loop over the word
                i = w.index(a)
                while w[i + 1] != b:
                    i = w.index(a, i + 1)
            except (ValueError, IndexError):
                continue
            c = wcounts[wi]
            n = len(w)
            if a not in w[i + 2:]:
                # one site (the common case): (x, a) -> (x, new) on the left, (b, y) -> (new, y) on the right
                if i > 0:
                    x = w[i - 1]
                    pair_counts[(x, a)] -= c
                    p = (x, new)
                    pair_counts[p] += c
                    touched.add(p)
                    pair_words[p].append(wi)
                if i + 2 < n:
                    y = w[i + 2]
                    pair_counts[(b, y)] -= c
                    p = (new, y)
                    pair_counts[p] += c
                    touched.add(p)
                    pair_words[p].append(wi)
                w[i:i + 2] = [new]
                continue
            # several possible sites: rebuild the word merging every non-overlapping (a, b) left to right
            out, i = w[:i], i
            while i < n:
                t = w[i]
                if t == a and i + 1 < n and w[i + 1] == b:
                    if out:
                        x = out[-1]
                        if x == new:  # "a b a b": (b, a) was already removed as the previous site's right pair
                            p = (new, new)
                        else:
                            pair_counts[(x, a)] -= c
                            p = (x, new)
                        pair_counts[p] += c
                        touched.add(p)
                    if i + 2 < n:
                        y = w[i + 2]
                        pair_counts[(b, y)] -= c
                        if not (y == a and i + 3 < n and w[i + 3] == b):  # else the next site adds (new, new)
                            p = (new, y)
                            pair_counts[p] += c
                            touched.add(p)
                    out.append(new)
                    i += 2
                else:
                    out.append(t)
                    i += 1
            words[wi] = out
            for p in {p for p in zip(out, out[1:]) if new in p}:   # (once each, as above)
                pair_words[p].append(wi)
        del pair_counts[pair]
        for p in touched:  # new pairs enter the heap with their final count for this step
            heappush(heap, (-pair_counts[p], keys[p[0]] + keys[p[1]], p))
        if len(merges) % 100 == 0:
            bar.update(len(merges) - bar.n)
    bar.update(len(merges) - bar.n)
    bar.close()
    if len(merges) < num_merges:
        print(f"bpe.py: warning: the text has no more pairs to merge: vocabulary of {len(vocab)} < {vocab_size} "
              f"requested", file=sys.stderr)
    return vocab, merges


def _inverse_key(b):
    """A bytes key whose ascending order is the DESCENDING lexicographic order of `b` (heapq is a min-heap).

    Each byte becomes two (0x01, 255-byte) and the string ends with 0x02, so a prefix sorts after
    its extensions, exactly reversing bytes comparison; pair keys are the concatenation of two keys.
    """
    return b"".join(_INV_BYTE[x] for x in b) + b"\x02"


_INV_BYTE = [bytes((1, 255 - x)) for x in range(256)]


# -----------------------------------------------------------------------------
# pre-tokenisation

def _special_regex(special_tokens):
    """A regex matching any special token, longest first (so '<|eot|><|eot|>' beats '<|eot|>' when both exist)."""
    if not special_tokens:
        return None
    toks = sorted(set(special_tokens), key=lambda t: (-len(t), t))
    return re.compile("(" + "|".join(re.escape(t) for t in toks) + ")")


_NONSPACE_WS = ("\t\n\x0b\x0c\r\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
                + "\u2028\u2029\u202f\u205f\u3000")
_WS_CHARS = " " + _NONSPACE_WS  # exactly the characters the regex module's \s matches


def _space_pairs_in(text):
    """The 2-character strings 'whitespace next to a space' that occur in text: the only places where
    str.split(" ") alone would cut a pre-token wrongly. Single-character scans first (memchr speed)."""
    present = [c for c in _NONSPACE_WS if c in text]
    return [p for p in ["  "] + [" " + c for c in present] + [c + " " for c in present] if p in text]


def _problem_runs(text, pairs):
    """Sorted (start, end) of the maximal whitespace runs of text that contain one of `pairs` (C-speed finds)."""
    spots = []
    for p in pairs:
        i = text.find(p)
        while i >= 0:
            spots.append(i)
            i = text.find(p, i + 1)
    spots.sort()
    runs, n = [], len(text)
    for i in spots:
        if runs and i < runs[-1][1]:
            continue
        a, b = i, i + 2
        while a > 0 and text[a - 1] in _WS_CHARS:
            a -= 1
        while b < n and text[b] in _WS_CHARS:
            b += 1
        runs.append((a, b))
    return runs


def _pieces_into(text, keys, pairs=None, specials=()):
    """Append to `keys` the pieces of `text`, in order; the pieces' pre-tokens concatenate to the text's.

    A word w (a str, the common case, produced by str.split at C speed) stands for the piece " " + w;
    a 1-tuple (p,) stands for a piece p that is pre-tokenised as it is (the start of the text, whitespace
    runs). Why this is exact: a GPT-2 pre-token never contains whitespace after non-whitespace, and a
    space directly in front of a non-space character always joins that character's pre-token. So
    unless a space touches other whitespace, " " + word is a self-contained run of pre-tokens. Where
    one does (`pairs`: such pairs found in the text), that whitespace run is cut out: all but its last
    character form one pre-token ('\\s+(?!\\S)'), and the last character goes with the next word (or
    stands alone when it is not a space). Special tokens without whitespace (`specials`) may stay inside
    words, where the piece encoder splits them out; a run right before one ends a document, so it is
    one pre-token.
    """
    if pairs is None:
        pairs = _space_pairs_in(text)
    runs = _problem_runs(text, pairs) if pairs else ()
    if not runs:
        words = text.split(" ")
        if words[0]:
            keys.append((words[0],))
        keys.extend(words[1:])
        return
    pos, lead = 0, ""
    for a, b in chain(runs, ((len(text), len(text)),)):
        words = text[pos:a].split(" ")
        if lead == " ":  # the previous run's last space joins the first word like any other single space
            keys.extend(words)
        else:
            if lead + words[0]:
                keys.append((lead + words[0],))
            keys.extend(words[1:])
        if a == len(text):
            break
        run = text[a:b]
        if b == len(text) or (specials and text.startswith(specials, b)):
            keys.append((run,))  # the end of the text (or of a document): the run is one pre-token
            lead = ""
        else:
            keys.append((run[:-1],))
            lead = run[-1]
        pos = b


def _piece_text(key):
    return key[0] if type(key) is tuple else " " + key


def _safe_cut(buf, special_tokens, special_re):
    """A late cut point i (0: none yet) with encode(buf[:i]) + encode(buf[i:] + more) == encode(buf + more)
    for any `more`."""
    maxlen = max((len(t) for t in special_tokens), default=1)
    limit = len(buf) - maxlen  # a special token starting before `limit` lies entirely in the buffer
    if limit <= 0:
        return 0
    spans = []
    if special_re is not None:
        for m in special_re.finditer(buf, 0, len(buf)):
            if m.start() >= limit:
                break
            spans.append((m.start(), m.end()))
        if spans and spans[-1][1] <= limit:
            return spans[-1][1]  # right after a special token: the text on either side is independent
    # else just before a whitespace character that follows a non-space one: no pre-token crosses it
    i = limit
    while i > 0 and not (buf[i] in _WS_CHARS and buf[i - 1] not in _WS_CHARS):
        i -= 1
    for s, e in spans:  # never inside a special token that contains whitespace
        if s < i < e:
            return s
    return i


# -----------------------------------------------------------------------------
# reading big files in chunks cut at special tokens

_TEXT_CUT_RE = re.compile(rb"[!-~](?=[ \n])")  # after a printable ASCII byte, before a space/newline


def _find_chunk_boundaries(path, num_chunks, split_tokens, window=1 << 20):
    """Byte offsets cutting the file into ~num_chunks pieces; each cut is at the start of a special token.

    Without special tokens (or none within `window` bytes of a guess) the cut falls after an ASCII
    non-space byte that is followed by a space or newline: a character and pre-token boundary.
    """
    size = os.path.getsize(path)
    num_chunks = max(1, min(num_chunks, size))
    toks = [t.encode("utf-8") for t in split_tokens]
    maxlen = max((len(t) for t in toks), default=1)
    bounds = [0]
    with open(path, "rb") as f:
        for i in range(1, num_chunks):
            guess = size * i // num_chunks
            if guess <= bounds[-1]:
                continue
            f.seek(guess)
            buf = f.read(window + maxlen)
            hits = [h for h in (buf.find(t) for t in toks) if h >= 0]
            if hits:
                cut = guess + min(hits)
            else:
                # no special token starts in buf, so a cut >= guess + maxlen cannot be inside one
                m = _TEXT_CUT_RE.search(buf, maxlen)
                if m:
                    cut = guess + m.end()
                else:
                    cut = _scan_for_special(f, guess + len(buf) - maxlen, toks, maxlen) if toks else size
            cut = _back_off_from_specials(f, cut, toks, maxlen)
            if bounds[-1] < cut < size:
                bounds.append(cut)
    bounds.append(size)
    return sorted(set(bounds))


def _back_off_from_specials(f, cut, toks, maxlen):
    """Move a cut left to the start of any special token that starts before it and runs past it: a cut
    found at '<|endoftext|>' may fall between the halves of a longer '<|endoftext|><|endoftext|>'."""
    while toks and cut > 0:
        start = max(0, cut - maxlen + 1)
        f.seek(start)
        buf = f.read(cut - start + maxlen)
        covering = [start + i for t in toks for i in range(cut - start)
                    if start + i + len(t) > cut and buf.startswith(t, i)]
        if not covering:
            return cut
        cut = min(covering)
    return cut


def _scan_for_special(f, pos, toks, maxlen, block=1 << 22):
    f.seek(pos)
    while True:
        buf = f.read(block + maxlen)
        if not buf:
            return os.fstat(f.fileno()).st_size
        hits = [h for h in (buf.find(t) for t in toks) if h >= 0]
        if hits:
            return pos + min(hits)
        if len(buf) <= maxlen:
            return os.fstat(f.fileno()).st_size
        pos += block
        f.seek(pos)


_INVALID_BYTES = [0]  # per process: bytes replaced by the "bpe_count" decoding error handler


def _replace_and_count(err):
    _INVALID_BYTES[0] += err.end - err.start
    return "\ufffd", err.end  # what errors="replace" does, counted


codecs.register_error("bpe_count", _replace_and_count)


def _decode_counting(data):
    """UTF-8 decode with U+FFFD replacement; returns (text, number of bytes that were invalid)."""
    _INVALID_BYTES[0] = 0
    return data.decode("utf-8", "bpe_count"), _INVALID_BYTES[0]


# -----------------------------------------------------------------------------
# training's first phase: the pre-token counts of a file, in parallel processes

def _inline_specials(special_tokens):
    """Special tokens may stay inside str.split(" ") words (see _pieces_into) when none contains whitespace and
    none is all letters (an all-letter word takes a fast path that never looks for special tokens)."""
    return not any(t.isalpha() or any(c in _WS_CHARS for c in t) for t in special_tokens)


def _count_pretokens(text, special_tokens, counts):
    """Add the pre-token counts of `text` (special tokens removed) into the dict `counts`."""
    special_re = _special_regex(special_tokens)
    keys, pairs = [], _space_pairs_in(text)
    if special_re is None or _inline_specials(special_tokens):
        _pieces_into(text, keys, pairs, tuple(special_tokens))
    else:
        for doc in special_re.split(text)[::2]:  # odd items are the special tokens
            _pieces_into(doc, keys, pairs)
    findall, get = _PRETOKEN_RE.findall, counts.get
    for key, c in Counter(keys).items():  # each distinct piece goes through the (slow) GPT-2 regex once
        if type(key) is str and key.isalpha():  # " " + letters is one pre-token (isalpha is \p{L})
            tok = " " + key
            counts[tok] = get(tok, 0) + c
            continue
        piece = _piece_text(key)
        parts = special_re.split(piece)[::2] if special_re is not None and special_re.search(piece) else (piece,)
        for part in parts:
            for tok in findall(part):
                counts[tok] = get(tok, 0) + c


_READ_BLOCK = 1 << 18  # bytes a training process reads at a time


def _count_chunks(path, ranges, special_tokens, progress_on=False):
    """Count the pre-tokens of byte ranges of the file into one dict, streaming each in ~256 KB blocks.

    Returns (counts, number of invalid UTF-8 bytes replaced)."""
    special_re = _special_regex(special_tokens)
    counts, bad = {}, 0
    bar = progress_bar(len(ranges), "pre-tokenising (this process's share)", "chunk", enabled=progress_on)
    for n, (start, end) in enumerate(ranges):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="bpe_count")
        _INVALID_BYTES[0] = 0
        buf = ""
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                data = f.read(min(left, _READ_BLOCK))
                left -= len(data)
                buf += decoder.decode(data, final=left <= 0 or not data)
                if not data:
                    break
                # count up to a point that no later text can change (as encode_iterable does)
                cut = _safe_cut(buf, special_tokens, special_re) if left > 0 else len(buf)
                if cut:
                    _count_pretokens(buf[:cut], special_tokens, counts)
                    buf = buf[cut:]
        if buf:
            _count_pretokens(buf, special_tokens, counts)
        bad += _INVALID_BYTES[0]
        bar.update()
    bar.close()
    return counts, bad


def _count_worker(conn, path, ranges, special_tokens):
    """Worker process: count its share of the chunks; send back (counts, invalid bytes, peak RSS in KiB, error)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle: it stops the workers
    try:
        counts, bad = _count_chunks(path, ranges, special_tokens)
        conn.send((counts, bad, peak_rss_kb(), None))
    except Exception as e:  # reported by the parent as one line, not a traceback from inside a worker
        conn.send((None, 0, 0, f"{type(e).__name__}: {e}"))
    conn.close()


class _Lines:
    """A stream for tqdm in a log file: each redraw becomes its own line (tqdm's carriage returns would make one
    endless line of the whole run)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s):
        s = s.replace("\r", "").strip()
        if s:
            self.stream.write(s + "\n")

    def flush(self):
        self.stream.flush()


class _NoBar:
    """progress_bar's stand-in when it draws nothing (library calls, worker processes): the count, and no tqdm,
    whose import costs each process ~80 ms and ~3 MiB."""

    def __init__(self, initial=0):
        self.n = initial

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, s, **kw):
        pass

    def close(self):
        pass


def progress_bar(total=None, desc="", unit="it", enabled=True, **kw):
    """A progress bar with the time left (tqdm) on stderr: redrawn in place on a terminal; in a log file a line
    every 30 s instead. The scripts' long steps (tokenizer training, encoding, data preparation, the evaluations)
    all show theirs through this."""
    if not enabled:
        return _NoBar(kw.get("initial", 0))
    from tqdm import tqdm
    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr if tty else _Lines(sys.stderr),
                mininterval=0.5 if tty else 30, dynamic_ncols=tty, **kw)


def peak_rss_kb():
    """Peak resident memory of this process in KiB (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM")).split()[1])
    except (OSError, StopIteration):
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return maxrss // 1024 if sys.platform == "darwin" else maxrss  # bytes on macOS, KiB on Linux


def check_text_file(input_path):
    """(Path, size in bytes) of an input text file; one clear error when it is missing, empty or binary (NUL bytes,
    or mostly invalid UTF-8, in its first MiB: a model file or an archive would train for minutes on noise)."""
    path = Path(input_path)
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, expected a text file")
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path}: file is empty")
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    bad = head.decode("utf-8", errors="replace").count("\ufffd")
    if b"\x00" in head or bad > len(head) // 10:
        why = "NUL bytes" if b"\x00" in head else f"{bad:,} invalid UTF-8 sequences"
        raise ValueError(f"{path}: not a text file ({why} in its first MiB): expected UTF-8 text")
    return path, size


def check_output_path(path, flag, folder=False):
    """Before any long work: `path` (a file, or with folder=True a folder, to write) can be made, i.e. its nearest
    existing ancestor is a writable folder. One ValueError naming the flag and the path otherwise."""
    if not str(path).strip():   # (Path("") is the current folder: `--out_dir=` would write there unasked)
        raise ValueError(f"{flag} {str(path)!r}: empty; expected the path of a {'folder' if folder else 'file'}")
    path = Path(path).absolute()
    blocker = next(p for p in (path, *path.parents) if p.exists())
    if (blocker != path or folder) and not blocker.is_dir():
        raise ValueError(f"{flag} {path}: {blocker} is a file, not a folder")
    if not folder and path.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; expected the path of a file to write")
    folder = blocker if blocker.is_dir() else blocker.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {folder} is not writable")
    try:   # os.access says yes to root everywhere, /proc and /sys included: a nameless file tried there decides
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write in {folder} ({e.strerror or e})") from None


def write_error(e):
    """Why a write failed, for a one-line message: the OS's reason, or the first line of a library's (torch's
    writer says only "unexpected pos" when the disk fills)."""
    reason = e.strerror if isinstance(e, OSError) and e.strerror else (str(e).strip().splitlines() or [repr(e)])[0]
    if "unexpected pos" in reason:   # "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
        reason = "it was written short, as on a full disk"
    return reason


def _chunk_ranges(path, size, num_workers, chunk_bytes, min_chunk_bytes, special_tokens):
    """[(start, end), ...]: the file cut at special tokens into chunks of at most chunk_bytes, one per worker, but
    no more chunks than min_chunk_bytes goes into the size (a file up to min_chunk_bytes is one chunk: a small
    file is not worth another process)."""
    num_chunks = max(min(num_workers, -(-size // min_chunk_bytes)), -(-size // chunk_bytes))
    bounds = _find_chunk_boundaries(path, num_chunks, list(special_tokens))
    return list(zip(bounds[:-1], bounds[1:]))


def _default_workers():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _warn_replaced(path, bad):
    """One warning line for the invalid UTF-8 that training and --encode decode with replacement."""
    if bad:
        print(f"bpe.py: warning: {path}: {bad} bytes of invalid UTF-8 replaced by U+FFFD", file=sys.stderr)


def count_pretokens_file(input_path, special_tokens=(), num_workers=None, chunk_bytes=16 << 20, min_chunk_bytes=4 << 20,
                         stats=None, progress=False):
    """{pre-token (str): count} over a file, special tokens excluded, counted by num_workers processes.

    The file is cut into chunks (see _chunk_ranges; up to 4 MiB a second process saves less time, ~0.1 s,
    than it costs memory). The main process counts every num_workers-th chunk itself while forked workers
    count the others, each into one dict that it sends back once: no idle parent and one dict per process
    keep peak memory low.
    """
    path, size = check_text_file(input_path)
    num_workers = num_workers or _default_workers()
    ranges = _chunk_ranges(path, size, num_workers, chunk_bytes, min_chunk_bytes, special_tokens)
    nproc = min(num_workers, len(ranges))
    shares = [ranges[k::nproc] for k in range(nproc)]  # equal-sized chunks: a static split balances the work
    workers = []
    try:
        if nproc > 1:  # start the workers before counting, so that they do not inherit the main process's dict
            import multiprocessing as mp
            ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
            for share in shares[1:]:
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_count_worker, args=(send, str(path), share, list(special_tokens)),
                                   daemon=True)
                proc.start()
                send.close()
                workers.append((proc, recv))
        try:
            counts, bad = _count_chunks(path, shares[0], special_tokens, progress)
        except Exception as e:
            raise ValueError(f"{path}: pre-tokenisation failed: {type(e).__name__}: {e}") from None
        worker_kb = 0
        for proc, recv in workers:
            try:
                c, nbad, rss_kb, err = recv.recv()
            except EOFError:
                proc.join()
                raise ValueError(f"{path}: a pre-tokenisation worker died (exit code {proc.exitcode}); "
                                 f"out of memory? try --workers 1") from None
            if err is not None:
                raise ValueError(f"{path}: pre-tokenisation failed: {err}")
            if len(c) > len(counts):  # add the smaller dict into the larger one
                counts, c = c, counts
            get = counts.get
            for tok, n in c.items():  # exact integer sums: any worker count gives the same totals
                counts[tok] = get(tok, 0) + n
            del c
            bad += nbad
            worker_kb += rss_kb
    finally:
        for proc, recv in workers:
            recv.close()
            if proc.is_alive():
                proc.kill()
            proc.join()
    _warn_replaced(path, bad)
    if stats is not None:
        # the all-process peak of this phase, counted generously: the main process's peak so far plus every
        # worker's peak, as if they all happened at the same moment (pages shared after fork count twice)
        stats["pretokenize_peak_kb"] = peak_rss_kb() + worker_kb
        stats["worker_peak_rss_kb"] = worker_kb
        stats["num_chunks"] = len(ranges)
        stats["num_processes"] = nproc
        stats["invalid_bytes"] = bad
    return counts


# -----------------------------------------------------------------------------
# GPT-2 file format: bytes <-> printable unicode characters

def bytes_to_unicode():
    """GPT-2's map from the 256 byte values to printable characters (so vocab.json / merges.txt are text)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:  # control characters and space are shifted to 256+ so every byte is visible
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_ENCODER = bytes_to_unicode()
_BYTE_DECODER = {c: b for b, c in _BYTE_ENCODER.items()}


def _token_to_str(b):
    return "".join(_BYTE_ENCODER[x] for x in b)


def _str_to_token(s, where):
    try:
        return bytes(_BYTE_DECODER[c] for c in s)
    except KeyError as e:
        raise ValueError(f"{where}: {s!r} contains {e.args[0]!r}, which is not a GPT-2 byte character") from None


# -----------------------------------------------------------------------------
# the tokenizer

_NO_MERGE = (1 << 62, None)  # the "rank" of a pair that is not a merge


class Tokenizer:
    """Byte-level BPE encoder/decoder over a vocabulary and merge list (GPT-2 semantics)."""

    def __init__(self, vocab, merges, special_tokens=None, name=None):
        self.vocab = dict(vocab)
        self.special_tokens = list(dict.fromkeys(special_tokens or ()))
        self.name = name or "bpe"
        self.token_to_id = {}
        for i, b in sorted(self.vocab.items()):
            self.token_to_id.setdefault(b, i)
        self.special_to_id = {}
        for t in self.special_tokens:  # special tokens missing from the vocabulary are appended
            b = t.encode("utf-8")
            if b not in self.token_to_id:
                i = max(self.vocab, default=-1) + 1
                self.vocab[i] = b
                self.token_to_id[b] = i
            self.special_to_id[t] = self.token_to_id[b]
        missing = [b for b in range(256) if bytes([b]) not in self.token_to_id]
        if missing:
            raise ValueError(f"vocabulary lacks single-byte tokens for bytes {missing[:5]}...: not a byte-level BPE")
        # merges -> rank, and (left id, right id) -> (rank, merged id)
        self.merges = [tuple(m) for m in merges]
        self.ranks = {}
        for r, (x, y) in enumerate(self.merges):
            ix, iy, ixy = self.token_to_id.get(x), self.token_to_id.get(y), self.token_to_id.get(x + y)
            if ix is None or iy is None or ixy is None:
                bad = x if ix is None else y if iy is None else x + y
                raise ValueError(f"merge {r} ({x!r}, {y!r}) does not match the vocabulary: {bad!r} is not a token")
            self.ranks.setdefault((ix, iy), (r, ixy))
        self.byte_ids = [self.token_to_id[bytes([b])] for b in range(256)]
        self._special_bytes = {t.encode("utf-8") for t in self.special_tokens}
        self._special_re = _special_regex(self.special_tokens)
        self._specials_tuple = tuple(self.special_tokens)
        self._inline_specials = _inline_specials(self.special_tokens)
        # piece key (see _pieces_into) -> token ids; special tokens sit there under a key no piece can have
        self._special_keys_by_text = {t: (t, None) for t in self.special_tokens}
        self._special_keys = {(t, None): (i,) for t, i in self.special_to_id.items()}
        self._cache = dict(self._special_keys)
        self._pretoken_cache = {}
        self.vocab_size = max(self.vocab) + 1
        self.eot_id = self.special_to_id.get(EOT, self.token_to_id.get(EOT.encode()))
        self._decode_table = [self.vocab.get(i, b"") for i in range(self.vocab_size)]
        self._ordinary = None if self.special_tokens else self

    # --- files ---------------------------------------------------------------
    @classmethod
    def from_files(cls, vocab_path, merges_path, special_tokens=None, name=None, specials_file=None):
        """Load GPT-2 format files: vocab.json {token: id}, merges.txt (optional '#version' first line).

        Special tokens missing from vocab.json are appended with new ids (as the constructor does), except when
        they come from a tokenizer folder's `specials_file`: save_dir wrote them into vocab.json, so there a
        missing one means the folder is broken, and it is refused."""
        try:
            with open(vocab_path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:   # ValueError: not JSON, or not UTF-8 text
            raise ValueError(f"{vocab_path}: cannot read a JSON vocabulary: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{vocab_path}: expected a JSON object {{token: id}}")
        specials = set(special_tokens or ())
        vocab = {}
        for s, i in raw.items():
            if type(i) is not int or i < 0:
                raise ValueError(f"{vocab_path}: token {s!r} has id {i!r}; expected a non-negative integer")
            vocab[i] = s.encode("utf-8") if s in specials else _str_to_token(s, vocab_path)
        if specials and specials_file is not None:
            present = set(vocab.values())
            for t in special_tokens:
                if t.encode("utf-8") not in present:
                    raise ValueError(f"{specials_file or vocab_path}: special token {t!r} is not in "
                                     f"{Path(vocab_path).name}")
        merges = []
        try:
            with open(merges_path, encoding="utf-8") as f:
                for n, line in enumerate(f):
                    line = line.rstrip("\r\n")
                    if (n == 0 and line.startswith("#version")) or not line:
                        continue
                    parts = line.split(" ")
                    if len(parts) != 2:
                        raise ValueError(f"{merges_path}:{n + 1}: expected two tokens separated by a space, "
                                         f"got {line!r}")
                    merges.append((_str_to_token(parts[0], merges_path), _str_to_token(parts[1], merges_path)))
        except OSError as e:
            raise ValueError(f"{merges_path}: cannot read: {e}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{merges_path}: not UTF-8 text (expected one merge per line)") from None
        try:
            return cls(vocab, merges, special_tokens, name=name)
        except ValueError as e:   # a merge that is not in the vocabulary, or a vocabulary without every byte
            raise ValueError(f"{merges_path if str(e).startswith('merge') else vocab_path}: {e}") from None

    def save(self, vocab_path, merges_path):
        """Write vocab.json / merges.txt in GPT-2's format (readable by from_files and HF tokenizers)."""
        specials = {t.encode("utf-8") for t in self.special_tokens}
        vocab = {}
        for i, b in sorted(self.vocab.items()):
            s = b.decode("utf-8") if b in specials else _token_to_str(b)
            vocab.setdefault(s, i)
        with open(vocab_path, "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(merges_path, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            for x, y in self.merges:
                f.write(f"{_token_to_str(x)} {_token_to_str(y)}\n")

    def save_dir(self, directory):
        """Write vocab.json, merges.txt and special_tokens.json into `directory` (created if needed): all three, or
        (a full disk) none, the folder left as it was; they are written in a temp folder inside it, then moved in."""
        d = Path(directory)
        made = not d.exists()
        d.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".saving-", dir=d))
        try:
            self.save(stage / "vocab.json", stage / "merges.txt")
            with open(stage / "special_tokens.json", "w", encoding="utf-8") as f:
                json.dump(self.special_tokens, f, ensure_ascii=False)
            for name in ("vocab.json", "merges.txt", "special_tokens.json"):
                os.replace(stage / name, d / name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            if made and not any(d.iterdir()):
                d.rmdir()

    @classmethod
    def from_dir(cls, directory):
        d = Path(directory)
        for n in ("vocab.json", "merges.txt", "special_tokens.json"):  # save_dir writes all three ("[]": no specials)
            if not (d / n).is_file():
                raise ValueError(f"{d}: not a tokenizer directory (missing {n})")
        try:
            with open(d / "special_tokens.json", encoding="utf-8") as f:
                specials = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{d / 'special_tokens.json'}: not JSON text: {e}") from None
        if not isinstance(specials, list) or not all(isinstance(t, str) and t for t in specials):
            raise ValueError(f"{d / 'special_tokens.json'}: expected a JSON list of non-empty strings")
        return cls.from_files(d / "vocab.json", d / "merges.txt", specials, name=str(directory),
                              specials_file=d / "special_tokens.json")

    # --- encoding ------------------------------------------------------------
    def _merge(self, pretoken):
        """Token ids of one pre-token: repeatedly merge the adjacent pair with the lowest merge rank.

        Merging the leftmost lowest-rank pair one at a time equals GPT-2's "all occurrences per step":
        a pair that contains the new token always has a higher rank, so the same rank comes next.
        """
        b = pretoken.encode("utf-8")
        whole = self.token_to_id.get(b)
        if whole is not None and b not in self._special_bytes:
            return [whole]  # a pre-token that is itself a token is that token (tiktoken does the same)
        ids = [self.byte_ids[x] for x in b]
        get, none = self.ranks.get, _NO_MERGE
        ranks = [get(p, none)[0] for p in zip(ids, ids[1:])]
        while ranks:
            r = min(ranks)
            if r == none[0]:
                break
            j = ranks.index(r)
            ids[j:j + 2] = [self.ranks[(ids[j], ids[j + 1])][1]]
            del ranks[j]
            if j > 0:
                ranks[j - 1] = get((ids[j - 1], ids[j]), none)[0]
            if j < len(ranks):
                ranks[j] = get((ids[j], ids[j + 1]), none)[0]
        return ids

    def _bpe(self, piece):
        """Token ids of one piece: its GPT-2 pre-tokens, each merged (and cached: pieces share pre-tokens)."""
        if self._special_re is not None and self._special_re.search(piece):
            out = []  # a piece may hold special tokens (see _pieces_into): split them out first
            for i, part in enumerate(self._special_re.split(piece)):
                out.extend((self.special_to_id[part],) if i % 2 else self._bpe(part))
            return tuple(out)
        out, cache = [], self._pretoken_cache
        for tok in _PRETOKEN_RE.findall(piece):
            ids = cache.get(tok)
            if ids is None:
                ids = cache[tok] = self._merge(tok)
            out.extend(ids)
        return tuple(out)

    def encode(self, text):
        """Token ids of `text`; special tokens (longest match first) become their single id."""
        try:
            return self._encode(text)
        except UnicodeEncodeError:   # a lone surrogate (half an emoji, e.g. from json.loads of cut text) has no
            # UTF-8 bytes: it becomes U+FFFD and split pairs are joined, as tiktoken does
            return self._encode(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))

    def _encode(self, text):
        cache = self._cache
        if len(cache) > 1_000_000:  # bound the cache on huge, diverse corpora
            cache.clear()
            cache.update(self._special_keys)
            self._pretoken_cache.clear()
        keys, pairs = [], _space_pairs_in(text)
        if self._inline_specials:
            _pieces_into(text, keys, pairs, self._specials_tuple)
        else:
            # split() with a capture group alternates text, special, text, ...
            for i, part in enumerate(self._special_re.split(text)):
                if i % 2:
                    keys.append(self._special_keys_by_text[part])
                elif part:
                    _pieces_into(part, keys, pairs)
        pcache = self._pretoken_cache
        for key in set(keys).difference(cache):
            if type(key) is str and key.isalpha():  # " " + letters is a single pre-token: skip the regex
                tok = " " + key
                ids = pcache.get(tok)
                if ids is None:
                    ids = pcache[tok] = self._merge(tok)
                cache[key] = ids
            else:
                cache[key] = self._bpe(_piece_text(key))
        return reduce(iadd, map(cache.__getitem__, keys), [])  # list += ids for every piece, at C speed

    def encode_ordinary(self, text):
        """encode() with special tokens' text taken as ordinary text (tiktoken's encode_ordinary): a document's
        literal "<|endoftext|>" stays text, so the only eot ids in fineweb.py's shards are its separators."""
        if self._ordinary is None:
            self._ordinary = Tokenizer(self.vocab, self.merges, [])
        return self._ordinary.encode(text)

    def encode_iterable(self, iterable, block_chars=1 << 16):
        """Lazily yield the ids of the concatenated strings in `iterable` (e.g. a file), in bounded memory.

        Text is buffered until a cut point is found after which nothing can change what came before
        (see _safe_cut), so the output equals encode("".join(iterable)) however the text is chunked.
        """
        return _encode_iterable(self, iterable, block_chars)

    def decode(self, ids):
        """Text of token ids; byte sequences that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids):
        """The bytes of token ids (a token may hold part of a UTF-8 character: streams decode these incrementally)."""
        table = self._decode_table
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # numpy arrays, iterators
        try:
            data = b"".join([table[i] for i in ids])
        except (IndexError, TypeError):
            bad = next(i for i in ids if not (hasattr(i, "__index__") and 0 <= i < len(table)))
            raise ValueError(f"decode: token id {bad!r} is outside the vocabulary [0, {len(table)})") from None
        if any(i < 0 for i in ids):
            raise ValueError(f"decode: token id {min(ids)} is outside the vocabulary [0, {len(table)})")
        return data


def _encode_iterable(tok, iterable, block_chars):
    parts, n, need = [], 0, block_chars
    for chunk in iterable:
        parts.append(chunk)
        n += len(chunk)
        if n < need:
            continue
        buf = "".join(parts)
        cut = _safe_cut(buf, tok.special_tokens, tok._special_re)
        if cut:
            yield from tok.encode(buf[:cut])
            buf = buf[cut:]
        parts, n = [buf], len(buf)
        # what is left has no cut point yet (one huge word, 100,000 blank lines): look again once it has doubled, not
        # at every chunk (each look joins and scans it all: quadratic for text that arrives a line at a time)
        need = max(block_chars, 2 * n)
    buf = "".join(parts)
    if buf:
        yield from tok.encode(buf)


# -----------------------------------------------------------------------------
# tokenizer references: "gpt2" (tiktoken) or a tokenizer directory

class TiktokenGPT2:
    """Thin wrapper over tiktoken's GPT-2 encoding with the same interface as Tokenizer."""

    def __init__(self):
        import tiktoken
        self.enc = tiktoken.get_encoding("gpt2")
        self.name = "gpt2"
        self.vocab_size = self.enc.n_vocab
        self.eot_id = self.enc.eot_token
        self.special_tokens = [EOT]
        self._special_re = _special_regex(self.special_tokens)

    def encode(self, text):
        return self.enc.encode(text, allowed_special="all")

    def encode_ordinary(self, text):
        return self.enc.encode_ordinary(text)

    def encode_iterable(self, iterable, block_chars=1 << 16):
        return _encode_iterable(self, iterable, block_chars)  # tiktoken has no streaming API of its own

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids):
        ids = list(ids)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"decode: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return self.enc.decode_bytes(ids)


def load_tokenizer(ref):
    """'gpt2' -> tiktoken's GPT-2 encoding; anything else is a tokenizer directory (Tokenizer.from_dir)."""
    ref = str(ref)
    if ref == "gpt2":
        return TiktokenGPT2()
    if not Path(ref).is_dir():
        raise ValueError(f"tokenizer {ref!r}: expected 'gpt2' or a directory with vocab.json, merges.txt, "
                         f"special_tokens.json")
    return Tokenizer.from_dir(ref)


def tokenizer_fingerprint(ref):
    """A tokenizer identified by content: token files, checkpoints and fineweb.py's shards record it, so a tokenizer
    retrained into the same folder is told apart from the one the data was encoded (or the model trained) with."""
    ref = str(ref)
    if ref == "gpt2":
        return "gpt2"
    h = hashlib.sha256()
    for name in ("vocab.json", "merges.txt", "special_tokens.json"):
        p = Path(ref, name)
        h.update(p.read_bytes() if p.is_file() else b"")
    return h.hexdigest()[:16]


class TokenizerMismatch(ValueError):
    """A tokenizer that is not the one a model or token files were made with."""


def tokenizer_for(ref, vocab_size, fingerprint=None, what="the model"):
    """Load tokenizer `ref` for `what` (a model, token files): it must have exactly its vocabulary size (more ids
    would index past the embedding, fewer leave ids it cannot decode) and, when `what` recorded one, its
    fingerprint (a same-size tokenizer of other tokens). TokenizerMismatch naming both otherwise; a tokenizer that
    cannot be loaded raises as load_tokenizer does (ValueError, OSError)."""
    tokenizer = load_tokenizer(ref)
    if tokenizer.vocab_size != vocab_size:
        raise TokenizerMismatch(f"tokenizer {ref!r} has {tokenizer.vocab_size} tokens but {what} {vocab_size}: not "
                                f"the tokenizer {what} was made with")
    now = tokenizer_fingerprint(ref)
    if fingerprint and now != fingerprint:
        raise TokenizerMismatch(f"tokenizer {ref!r} (fingerprint {now}) is not the one {what} was made with "
                                f"({fingerprint}): retrained or replaced since")
    return tokenizer


# -----------------------------------------------------------------------------
# encoding a whole file with all cores

_WORKER_TOKENIZER = None


def _encode_worker_init(ref, pool=False):
    global _WORKER_TOKENIZER
    if pool:   # Ctrl-C is the parent's to handle: it stops the pool
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_TOKENIZER = load_tokenizer(ref)


def _encode_chunk(args):
    import numpy as np
    path, start, end, dtype = args
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text, bad = _decode_counting(f.read(end - start))
        ids = np.asarray(_WORKER_TOKENIZER.encode(text), dtype=dtype)
        return ids.tobytes(), len(ids), end - start, bad, None
    except Exception as e:
        return b"", 0, end - start, 0, f"{type(e).__name__}: {e}"


def peak_rss_mb():
    """Peak resident memory in MiB of this process and of the largest finished child process."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # bytes on macOS, KiB on Linux
    return peak_rss_kb() / 1024, (kids / 1024 if sys.platform == "darwin" else kids) / 1024


def encode_file(input_path, tokenizer_ref, out_path, num_workers=None, chunk_bytes=1 << 21, min_chunk_bytes=1 << 18,
                progress=False):
    """Encode a UTF-8 text file into raw ids (out_path) plus the sidecar out_path + '.json'; returns the sidecar.

    Chunks are cut at special tokens (else at a whitespace boundary), encoded in worker processes,
    and written in file order, so the output equals tokenizer.encode(whole text).
    """
    import numpy as np  # only in file encoding: training and Tokenizer.encode never need it (~15 MB per process)
    path, size = check_text_file(input_path)
    tok, fingerprint = load_tokenizer(tokenizer_ref), tokenizer_fingerprint(tokenizer_ref)
    dtype = np.uint16 if tok.vocab_size <= 65536 else np.uint32
    num_workers = num_workers or _default_workers()
    ranges = _chunk_ranges(path, size, num_workers, chunk_bytes, min_chunk_bytes, tok.special_tokens)
    tasks = [(str(path), a, b, dtype) for a, b in ranges]
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    num_tokens = num_docs = done = bad = 0
    bar = progress_bar(size, f"encoding {path.name}", "B", enabled=progress, unit_scale=True)
    if tok.eot_id is not None:  # a document: what lies between end-of-text tokens, if it is not just whitespace
        blank = np.array([not tok.decode([i]).strip() for i in range(tok.vocab_size)])
        blank[tok.eot_id] = True
        open_doc = False  # whether the text so far ends inside a document
    pool = None
    if num_workers == 1 or len(tasks) <= 1:
        _encode_worker_init(str(tokenizer_ref))
        results = map(_encode_chunk, tasks)
    else:
        import multiprocessing as mp
        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        pool = ctx.Pool(min(num_workers, len(tasks)), initializer=_encode_worker_init,
                        initargs=(str(tokenizer_ref), True))
        results = pool.imap(_encode_chunk, tasks)  # ordered: chunks are written in file order
    # the ids go to a temp file renamed at the end, when an older sidecar goes: however the run ends, the output
    # folder holds the old pair, the new one, or ids without a sidecar (refused by train.py), never a mismatch
    side_path, tmp = Path(str(out_path) + ".json"), out_path.with_name(out_path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            for data, n, nbytes, nbad, err in results:
                if err is not None:
                    raise ValueError(f"{path}: encoding failed: {err}")
                f.write(data)
                if tok.eot_id is not None and n:
                    arr = np.frombuffer(data, dtype=dtype)
                    segment = np.cumsum(arr == tok.eot_id)  # each end-of-text token opens the next segment
                    docs = np.unique(segment[~blank[arr]])  # the segments holding text
                    num_docs += len(docs) - int(open_doc and len(docs) > 0 and docs[0] == 0)  # 0 continues a doc
                    open_doc = bool(len(docs) and docs[-1] == segment[-1]) or (open_doc and segment[-1] == 0)
                num_tokens += n
                done += nbytes
                bad += nbad
                bar.update(nbytes)
        side_path.unlink(missing_ok=True)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
        if pool is not None:
            pool.terminate()
    bar.close()
    _warn_replaced(path, bad)
    meta = {"format": "tokens-v1", "dtype": np.dtype(dtype).name, "vocab_size": tok.vocab_size,
            "num_tokens": num_tokens, "num_docs": num_docs if tok.eot_id is not None else None,
            "tokenizer": str(tokenizer_ref), "tokenizer_fingerprint": fingerprint, "eot_id": tok.eot_id}
    side_tmp = side_path.with_name(side_path.name + ".tmp")
    try:
        with open(side_tmp, "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(side_tmp, side_path)
    finally:   # a sidecar that could not be written leaves no temp file behind
        side_tmp.unlink(missing_ok=True)
    meta["seconds"] = time.perf_counter() - t0
    return meta


# -----------------------------------------------------------------------------
# CLI

def one_line_errors(parser):
    """argparse's mistakes (an unknown flag, a bad value) said in one line naming the script, exit status 2, without
    the usage block. Every script's parser goes through this (flops.py and stories.py, which import no bpe.py, hold
    a copy of this line)."""
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: {message} (see --help)\n")


def run_main(main):
    """Run a script's main(); when the reader of its output goes away (`| head`), stop quietly, as cat does.
    (flops.py and stories.py, which import no bpe.py, hold a copy.)"""
    try:
        main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's last flush then fails silently
        sys.exit(1)


def sample_documents(path, n=10, special=EOT, seed=0, max_bytes=1 << 26):
    """n documents (split on `special`, or on blank lines) drawn with a fixed seed from the file's start."""
    import random
    with open(path, "rb") as f:
        text = f.read(max_bytes).decode("utf-8", "replace")
    docs = [d for d in (text.split(special) if special and special in text else text.split("\n\n")) if d.strip()]
    return random.Random(seed).sample(docs, min(n, len(docs)))


MAIN_JOB_CORPUS = "data/tinystories/train.txt"   # what `python train.py` trains on (fineweb.prepare_tinystories)
PREPARE_MAIN_JOB = ["fineweb.py", "--prepare_tinystories"]   # run, not imported: this file imports no project file


def _refuse_a_folder_with_files(out, force, named):
    """A tokenizer folder is written over only with --force (as export.py's --out); named: by --out."""
    if out.is_dir() and any(out.iterdir()) and not force:
        where = f"--out {out}" if named else f"{out} (the folder named by the vocabulary, as no --out was given)"
        raise ValueError(f"{where}: the folder exists and is not empty (pass --force to write into it, or another "
                         f"--out)")


def main():
    p = argparse.ArgumentParser(description="Train a byte-level BPE tokenizer, or encode a text file with one.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", type=os.path.expanduser, default=None,
                   help=f"training text file (UTF-8); None: the main job's corpus, {MAIN_JOB_CORPUS} (prepared first "
                        f"by {' '.join(PREPARE_MAIN_JOB)} when absent)")
    p.add_argument("--vocab", type=int, default=10000,
                   help="vocabulary size, special tokens and the 256 bytes included")
    p.add_argument("--special", action="append", default=None,
                   help='special token (repeatable); default "<|endoftext|>"; pass --special "" for none')
    p.add_argument("--out", type=os.path.expanduser, default=None,
                   help="tokenizer directory to write (training; default tokenizers/<input stem>-<vocab reached>), "
                        "or the .bin file to write (--encode)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--encode", type=os.path.expanduser, default=None, metavar="FILE",
                   help="encode this text file into --out (a .bin of token ids)")
    p.add_argument("--tokenizer", type=os.path.expanduser, default="gpt2",
                   help="with --encode: 'gpt2' (tiktoken) or a tokenizer directory")
    p.add_argument("--sample_docs", type=int, default=10, help="documents sampled for the bytes/token figure")
    p.add_argument("--force", action="store_true",
                   help="write over an existing --out (a tokenizer folder that already has files, or a .bin)")
    one_line_errors(p)
    args = p.parse_args()

    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"bpe.py: --workers {args.workers}: expected a positive number")
    if args.sample_docs < 1:
        raise SystemExit(f"bpe.py: --sample_docs {args.sample_docs}: expected a positive number of documents")
    if args.encode is not None:
        if not args.out:
            raise SystemExit("bpe.py: --encode needs --out FILE.bin")
        try:
            check_output_path(args.out, "--out")
            if Path(args.out).exists() and not args.force:
                raise ValueError(f"--out {args.out}: the file exists (pass --force to write over it)")
            meta = encode_file(args.encode, args.tokenizer, args.out, args.workers, progress=True)
        except ValueError as e:
            raise SystemExit(f"bpe.py: {e}")
        except OSError as e:   # a full disk (encode_file leaves no partial file)
            raise SystemExit(f"bpe.py: --out {args.out}: could not write it ({write_error(e)}); nothing was written: "
                             f"free some space, then run again")
        except KeyboardInterrupt:
            raise SystemExit(f"\nbpe.py: interrupted; {args.out} not written") from None
        mb = os.path.getsize(args.encode) / 1e6
        own, kids = peak_rss_mb()
        docs = f"{meta['num_docs']:,} docs" if meta["num_docs"] is not None else f"no {EOT} token, so no document count"
        print(f"wrote {args.out}: {meta['num_tokens']:,} tokens ({meta['dtype']}), {docs}, "
              f"{mb:.1f} MB in {meta['seconds']:.2f}s = {mb / meta['seconds']:.1f} MB/s, "
              f"{mb * 1e6 / max(meta['num_tokens'], 1):.2f} bytes/token, peak RSS main {own:.0f} MiB + "
              f"largest worker {kids:.0f} MiB")
        return

    if args.input is None:  # the main job's corpus (made as `python train.py` makes it), so a bare command trains
        args.input = MAIN_JOB_CORPUS
        if not Path(args.input).is_file():
            print(f"no --input given: preparing the main job's corpus first: {' '.join(PREPARE_MAIN_JOB)}")
            if subprocess.run([sys.executable, *PREPARE_MAIN_JOB], cwd=Path(__file__).resolve().parent).returncode:
                raise SystemExit("bpe.py: no --input, and the main job's corpus could not be prepared: pass "
                                 "--input FILE")
        print(f"no --input given: training on {args.input}")
    specials = [s for s in (args.special if args.special is not None else [EOT]) if s]
    if args.vocab < 256 + len(specials):   # (train_bpe checks it too: said here as the flag)
        raise SystemExit(f"bpe.py: --vocab {args.vocab}: expected at least 256 bytes + {len(specials)} special "
                         f"token(s) = {256 + len(specials)}")
    out = Path(args.out or f"tokenizers/{Path(args.input).stem}-{args.vocab}")   # (named by the vocabulary reached)
    try:   # checked now, not after the training
        check_text_file(args.input)
        check_output_path(out, "--out", folder=True)
        _refuse_a_folder_with_files(out, args.force, args.out is not None)
    except ValueError as e:
        raise SystemExit(f"bpe.py: {e}") from None
    stats = {}
    t0 = time.perf_counter()
    try:
        vocab, merges = train_bpe(args.input, args.vocab, specials, num_workers=args.workers, stats=stats,
                                  progress=True)
    except ValueError as e:
        raise SystemExit(f"bpe.py: {e}")
    except KeyboardInterrupt:
        raise SystemExit(f"\nbpe.py: interrupted; nothing written to {out}") from None
    wall = time.perf_counter() - t0
    if args.out is None and len(vocab) < args.vocab:   # the text ran out of pairs to merge (train_bpe said so)
        out = out.with_name(f"{Path(args.input).stem}-{len(vocab)}")
        try:   # (a name known only now)
            _refuse_a_folder_with_files(out, args.force, args.out is not None)
        except ValueError as e:
            raise SystemExit(f"bpe.py: {e}; nothing written") from None
    tok = Tokenizer(vocab, merges, specials, name=str(out))
    try:
        tok.save_dir(out)
    except OSError as e:   # a full disk: save_dir wrote none of the three files
        raise SystemExit(f"bpe.py: --out {out}: could not write the tokenizer ({write_error(e)}); nothing was "
                         f"written there: free some space, then run again")
    learned = [vocab[i] for i in range(len(specials), len(vocab))]
    longest = max(len(b) for b in learned)
    longest_toks = [b for b in learned if len(b) == longest]
    docs = sample_documents(args.input, args.sample_docs, specials[0] if specials else None)
    nbytes = sum(len(d.encode()) for d in docs)
    ntoks = sum(len(tok.encode(d)) for d in docs)
    print(f"trained {len(vocab)} tokens ({len(merges)} merges) on {args.input} -> {out}")
    print(f"wall time {wall:.2f}s = pre-tokenisation {stats['pretokenize_s']:.2f}s ({stats['num_chunks']} chunk(s), "
          f"{stats['num_pretokens']:,} distinct pre-tokens) + merging {stats['merge_s']:.2f}s")
    print(f"peak RSS of all processes {stats['peak_rss_kb'] / 1024:.0f} MiB "
          f"(pre-tokenisation in {stats['num_processes']} "
          f"process(es), peaks summed: {stats['pretokenize_peak_kb'] / 1024:.0f} MiB; merging in the main process: "
          f"{stats['merge_peak_kb'] / 1024:.0f} MiB)")
    print(f"longest token ({longest} bytes): "
          + ", ".join(repr(b.decode('utf-8', 'replace')) for b in longest_toks[:3]))
    print(f"compression on {len(docs)} sampled documents: {nbytes / max(ntoks, 1):.2f} bytes/token")


if __name__ == "__main__":
    try:
        run_main(main)
    except KeyboardInterrupt:   # (training and encoding say what was written; this is Ctrl-C anywhere else)
        raise SystemExit("\nbpe.py: interrupted") from None
