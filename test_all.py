"""The test suite: every component checked against an independent reference.

Run: python -m pytest test_all.py -q
Tests that need ../shared/data (real text) skip with a reason when it is absent.
"""

import argparse
import atexit
import contextlib
import functools
import importlib.util
import io
import json
import math
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import types
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import regex
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import transformers

import bench
import bpe
import experiments
import export
import fineweb
import flops
import hellaswag
import lambada
import model as M
import runs
import sample
import stories
import train


ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared"
DATA = SHARED / "data"

# GPT-2's tokenizer files offline: tiktoken's cache named by TIKTOKEN_CACHE_DIR, else ../shared's copy
TIKTOKEN_CACHE = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or SHARED / "tiktoken_cache")
if "TIKTOKEN_CACHE_DIR" not in os.environ and TIKTOKEN_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)
_GPT2_FILES = [TIKTOKEN_CACHE / "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6",   # encoder.json = vocab.json
               TIKTOKEN_CACHE / "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"]   # vocab.bpe = merges.txt
HAVE_GPT2_FILES = all(f.is_file() for f in _GPT2_FILES)


@pytest.fixture(autouse=True)
def _torch_threads_restored(request):
    """train.main(--num_threads=N) sets the process's thread count, as it should: not for the tests after it. The
    tiny models of model.py's, sample.py's and flops.py's tests run on one thread: far faster, and no stall when the
    2 cores are oversubscribed."""
    before = torch.get_num_threads()
    if request.node.name.startswith(("test_model_", "test_sample_", "test_flops_", "test_bench_sample_",
                                     "test_bench_train_")):
        torch.set_num_threads(1)
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _cpu_peak_file_of_the_tests(tmp_path_factory, monkeypatch, request):
    """flops.py keeps the best CPU peak measured on this machine in ~/.cache: each test's (some fake) in its own."""
    name = re.sub(r"\W", "_", request.node.name)[:100]
    monkeypatch.setattr(flops, "CPU_PEAK_FILE", tmp_path_factory.getbasetemp() / "cpu_peak" / f"{name}.json")


needs_data = pytest.mark.skipif(not DATA.is_dir(),
                                reason="../shared/data is absent (fresh machine): real-text test skipped")
needs_gpt2_files = pytest.mark.skipif(
    not HAVE_GPT2_FILES, reason=f"GPT-2's tokenizer files are not in {TIKTOKEN_CACHE} "
    "(../shared/tiktoken_cache or TIKTOKEN_CACHE_DIR): unavailable offline")


def _one_line_naming(message, prefix, *named):
    """A bad-input error is one line that starts with what it is about (a flag, a file) and names the values."""
    assert message.startswith(prefix) and "\n" not in message, message
    assert all(str(n) in message for n in named), (message, named)


def _bad_says(message, prefix, *named):
    """_one_line_naming, with each named value looked for after the prefix and as a whole word or number: a prefix
    that holds a tmp_path (named after the test, numbered by pytest) cannot name it by accident, nor "16" a 1, nor
    the file /a/b.txt its folder /a."""
    _one_line_naming(message, prefix)
    rest = message[len(prefix):]
    for value in map(str, named):
        assert re.search(rf"(?<![\w./-]){re.escape(value)}(?![\w/]|\.\d)", rest), (message, value)


def _bad_exit(monkeypatch, script, *argv):
    """The one-line message script.main() exits with (status 1) for this command line (after a newline, for Ctrl-C)."""
    monkeypatch.setattr(sys, "argv", [f"{script.__name__}.py", *map(str, argv)])
    with pytest.raises(SystemExit) as e:
        script.main()
    assert isinstance(e.value.code, str) and "\n" not in e.value.code.removeprefix("\n"), e.value.code
    return e.value.code


def _ctrl_c_line(monkeypatch, script, *argv):
    """The one line script.main() exits with on Ctrl-C, after a newline that leaves the terminal's ^C line."""
    message = _bad_exit(monkeypatch, script, *argv)
    assert message.startswith("\n"), message
    return message[1:]


def _raises(fn, *args, **kw):
    """The message of the ValueError that fn(*args, **kw) raises."""
    with pytest.raises(ValueError) as e:
        fn(*args, **kw)
    return str(e.value)


def _run(script, monkeypatch, *argv):
    """script.main() on this command line."""
    monkeypatch.setattr(sys, "argv", [f"{script.__name__}.py", *map(str, argv)])
    script.main()


def _exits(fn, *args, **kw):
    """The message of the SystemExit that fn(*args, **kw) (a main()) raises."""
    with pytest.raises(SystemExit) as e:
        fn(*args, **kw)
    return str(e.value)


torch.set_num_threads(min(2, torch.get_num_threads()))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watched_rank(rank, fn, seconds, *args):
    import faulthandler
    faulthandler.enable()   # a rank that aborts (SIGABRT from C++) prints where it was
    faulthandler.dump_traceback_later(seconds)   # a hang prints where this rank waits, before it is killed
    fn(rank, *args)
    faulthandler.cancel_dump_traceback_later()
    # done and checked: leave without the interpreter's teardown, where gloo's threads abort a rank now and then
    # ("terminate called without an active exception", no Python frame; ~1 run in 30 after destroy_process_group)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn_ranks(fn, *args, nprocs=2, timeout=240):
    """mp.spawn(fn, args=(nprocs, free port, *args)) with a deadline: hung ranks dump their stack and fail the test."""
    ctx = mp.spawn(_watched_rank, args=(fn, timeout - 30, nprocs, _free_port(), *args), nprocs=nprocs, join=False)
    try:
        finished = any(ctx.join(timeout=5) for _ in range(timeout // 5))
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    assert finished, f"{fn.__name__}: the ranks did not finish within {timeout} s"


# ==== bpe.py: the tokenizer: training against its reference trainer and tiktoken, encoding, files, the command line


_BPE_EOT = "<|endoftext|>"

_BPE_GPT2_VOCAB, _BPE_GPT2_MERGES = _GPT2_FILES

_BPE_EDGE_TEXTS = [
    "", "a", " ", "\n", "hello world", "Hello, World!  ", "  leading and trailing  ", "tabs\tand\t\ttabs",
    "line\nbreaks\n\n\nand \n \n spaces", "\r\nwindows\r\nlines", "emoji 🙂🚀 and 👍🏽 skin tone",
    "CJK 中文字符 日本語 한국어", "mixed\u00a0nbsp\u3000ideographic space\u2003em", "numbers 12345 3.14 1,000,000",
    "contractions: I'm you're he'll we've they'd it's 'S", "<|endoftext|>", "a<|endoftext|>b",
    "<|endoftext|><|endoftext|>", "x <|endoftext|> y\n<|endoftext|>\n", "<|endoftext", "|endoftext|>",
    "ends with space ", "\x00\x01 control \x1c\x1f chars", "ünïcödé àccents", "   ", "a  b   c    d",
]

_BPE_WORDS = ["the", "cat", "sat", "on", "a", "mat", "Lily", "saw", "big", "dog", "don't", "it's", "42", "3.5",
              "ünï", "日本", "🙂", "!", ",", ".", "\"", "(", ")"]


@functools.lru_cache(maxsize=1)
def _bpe_gpt2():  # loaded once for all tests (encode is pure; its caches only speed it up)
    return bpe.Tokenizer.from_files(_BPE_GPT2_VOCAB, _BPE_GPT2_MERGES, [_BPE_EOT])


def _bpe_synthetic_text(n_docs, seed=0, special=_BPE_EOT):
    """Deterministic English-like text with varied whitespace, documents separated by `special`."""
    rng = random.Random(seed)
    seps = [" "] * 12 + ["  ", "\n", "\n\n", " \n", "\n ", "\t", "\u00a0"]
    docs = []
    for _ in range(n_docs):
        n = rng.randint(5, 60)
        docs.append("".join(rng.choice(_BPE_WORDS) + rng.choice(seps) for _ in range(n)).strip(" "))
    return f"\n{special}\n".join(docs) + "\n"


def _bpe_small_tokenizer(tmp_path=None, specials=(_BPE_EOT,), vocab_size=400, save_to=None):
    """A tokenizer trained on 150 synthetic documents: trained once per (specials, size), a new object each call;
    saved as a tokenizer folder at save_to if given."""
    tok = bpe.Tokenizer(*_bpe_small_trained(tuple(specials), vocab_size), list(specials))
    if save_to:
        tok.save_dir(save_to)
    return tok


@functools.lru_cache(maxsize=None)
def _bpe_small_trained(specials, vocab_size):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "small.txt"
        path.write_text(_bpe_synthetic_text(150, seed=1), encoding="utf-8")
        return bpe.train_bpe(path, vocab_size, list(specials), num_workers=1)


def _bpe_byte_tokenizer(specials=(_BPE_EOT,)):
    """A byte-level tokenizer without merges: ids 0-255 are the bytes, the special tokens come after them."""
    return bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [], list(specials))


def _bpe_corpus(path, n=60, seed=0):
    """n stories of stories.py, each followed by its separator: a corpus of n documents."""
    path.write_text("".join(d + stories.SEPARATOR for d in stories.generate_stories(n, seed)), encoding="utf-8")
    return path


def _bpe_tok_dir(tmp_path, specials=(_BPE_EOT,)):
    """A tokenizer folder (vocab 300) trained on _bpe_corpus(tmp_path / "corpus.txt")."""
    vocab, merges = bpe.train_bpe(_bpe_corpus(tmp_path / "corpus.txt"), 300, list(specials), num_workers=1)
    bpe.Tokenizer(vocab, merges, list(specials)).save_dir(tmp_path / "tok")
    return tmp_path / "tok"


def _bpe_chunkings(text, rng):
    yield [text]
    yield list(text)  # one character at a time
    yield text.splitlines(keepends=True)
    for _ in range(5):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text), 40)))
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def _bpe_cli(*args, cwd=None, preexec_fn=None):
    return subprocess.run([sys.executable, str(ROOT / "bpe.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, preexec_fn=preexec_fn)


def _file_size_limit(n):
    """A subprocess's preexec_fn: files cannot grow past n bytes, so a longer write fails (EFBIG) as on a full disk."""
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))


def _files(folder):
    """Every file under folder, with its bytes: what a failed write must leave as it was."""
    return {p: p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def _bpe_says(message, prefix, *named):
    """_one_line_naming, with the named values looked for after the prefix (a path there may hold any word)."""
    _one_line_naming(message, str(prefix))
    _one_line_naming(message[len(str(prefix)):], "", *named)


def _bpe_warning(err, path):
    """The one line of stderr `err` that warns about `path`."""
    lines = [line for line in err.splitlines() if str(path) in line]
    assert len(lines) == 1, err
    _one_line_naming(lines[0], "bpe.py: warning: ")
    return lines[0]


def _bpe_report_line(out, figure):
    """The one line of bpe.py's printed report that gives `figure` (a word such as "merges" or "bytes/token")."""
    lines = [line for line in out.splitlines() if figure in line]
    assert len(lines) == 1, out
    return lines[0]


def _bpe_not_called(*a, **k):
    raise AssertionError("called, where it should not be (a refusal comes first, or the step is reused)")


def _bpe_regex_counts(text, specials=()):
    """The reference pre-token counts: the text split at the special tokens, then regex.findall on each piece."""
    docs = regex.split("|".join(map(regex.escape, specials)), text) if specials else [text]
    return Counter(t for d in docs for t in regex.findall(bpe.GPT2_SPLIT_PATTERN, d))


# ---- pre-tokenisation: the str.split fast path gives the GPT-2 regex's pre-tokens, special tokens split out first


def test_bpe_whitespace_table_is_exactly_regex_backslash_s():
    # the str.split fast path is exact only if its whitespace table is the regex module's \s, every character of it
    ws = set(regex.findall(r"\s", "".join(map(chr, range(0x110000)))))   # every code point, one pass
    assert set(bpe._WS_CHARS) == ws and set(bpe._NONSPACE_WS) == ws - {" "}


def test_bpe_pieces_match_gpt2_regex():
    # the str.split fast path must give exactly the GPT-2 regex pre-tokens (reference: regex.findall)
    rng = random.Random(0)
    alphabet = [" ", "  ", "\n", "\t", "\r\n", "\u00a0", "\u3000", "a", "Bc", "1", "'", "'s", "!", "é", "世", "🙂",
                "\x1c"]
    texts = _BPE_EDGE_TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25))) for _ in range(3000)]
    for text in texts:
        text = text.replace(_BPE_EOT, "")
        keys = []
        bpe._pieces_into(text, keys)
        ours = [t for k in keys for t in regex.findall(bpe.GPT2_SPLIT_PATTERN, bpe._piece_text(k))]
        assert ours == regex.findall(bpe.GPT2_SPLIT_PATTERN, text), repr(text)


def test_bpe_pretoken_counts_match_gpt2_regex_with_special_tokens():
    # reference: split on the special tokens, then regex.findall on each document
    rng = random.Random(2)
    alphabet = [" ", "  ", "\n", "\t", "a", "Bc", "1", "!", "é", _BPE_EOT, _BPE_EOT, "<|x y|>", "<|"]
    for specials in ([_BPE_EOT], [_BPE_EOT, "<|x y|>"]):  # the second has whitespace: per-document path
        for _ in range(1000):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
            counts = Counter()
            bpe._count_pretokens(text, specials, counts)
            assert counts == _bpe_regex_counts(text, specials), repr(text)


def test_bpe_special_tokens_made_of_letters_are_split_out(tmp_path):
    # an all-letter special token ("END") is split out in encoding and training, a space before it or letters around
    tok = _bpe_byte_tokenizer(["END"])
    end = tok.special_to_id["END"]
    for text in ["say END now", "END", "sayEND ENDing", "é END\n END"]:
        pieces = regex.split("(END)", text)
        want = [i for k, p in enumerate(pieces) for i in ([end] if k % 2 else list(p.encode()))]
        assert tok.encode(text) == want, text
        assert list(tok.encode_iterable(iter(text))) == want, text
        counts = {}
        bpe._count_pretokens(text, ["END"], counts)
        assert counts == dict(_bpe_regex_counts(text, ["END"])), text
    (tmp_path / "c.txt").write_text("the END of the END and the end " * 50, encoding="utf-8")
    vocab, _ = bpe.train_bpe(tmp_path / "c.txt", 300, ["END"], num_workers=1)
    assert not any(b"END" in v for i, v in vocab.items() if i > 0)  # id 0 is the special token itself


# ---- reading a corpus: chunks cut at special tokens, streamed UTF-8 decoding, worker processes, bad input files


def test_bpe_a_small_file_is_one_chunk_and_a_big_one_one_chunk_per_min_chunk_bytes(tmp_path):
    # up to min_chunk_bytes: one chunk; above it at most one per min_chunk_bytes, and no more than the workers
    path = tmp_path / "in.txt"
    path.write_text("word " * 2000, encoding="utf-8")   # 10,000 bytes, cut points after every word
    size = path.stat().st_size
    assert bpe._chunk_ranges(path, size, 8, 1 << 21, 10_000, [_BPE_EOT]) == [(0, size)]
    assert len(bpe._chunk_ranges(path, size, 8, 1 << 21, 2_500, [_BPE_EOT])) == 4
    assert len(bpe._chunk_ranges(path, size, 2, 1 << 21, 1_000, [_BPE_EOT])) == 2
    assert len(bpe._chunk_ranges(path, size, 2, 2_000, 1_000, [_BPE_EOT])) == 5


def test_bpe_chunk_boundaries_without_special_tokens(tmp_path):
    # no special token in the file: cuts fall on pre-token boundaries and counts stay exact
    path = tmp_path / "c.txt"
    text = _bpe_synthetic_text(200, seed=5, special="\n")
    path.write_text(text, encoding="utf-8")
    stats = {}
    counts = bpe.count_pretokens_file(path, [_BPE_EOT], num_workers=2, chunk_bytes=3000, min_chunk_bytes=1000,
                                      stats=stats)
    assert stats["num_chunks"] > 2
    assert counts == _bpe_regex_counts(text)


def test_bpe_streamed_counting_matches_regex(tmp_path, monkeypatch):
    # read in small blocks up to safe cut points: exact counts, a character split across blocks, a special with a space
    monkeypatch.setattr(bpe, "_READ_BLOCK", 37)
    specials = [_BPE_EOT, "<|end of text|>"]
    text = _bpe_synthetic_text(60, seed=12).replace("\n" + _BPE_EOT, "\n<|end of text|>", 20)
    (tmp_path / "c.txt").write_text(text, encoding="utf-8")
    counts = bpe.count_pretokens_file(tmp_path / "c.txt", specials, num_workers=1)
    assert counts == _bpe_regex_counts(text, specials)


def test_bpe_truncated_utf8_at_the_end_of_the_file_is_replaced_and_counted(tmp_path, capsys):
    # a file ending inside a multi-byte character: the decoder is flushed, and the warning counts invalid BYTES
    data = b"good text\n" + _BPE_EOT.encode() + b"\nthe end \xe2\x82"
    (tmp_path / "t.txt").write_bytes(data)
    for workers in (1, 2):
        stats = {}
        counts = bpe.count_pretokens_file(tmp_path / "t.txt", [_BPE_EOT], num_workers=workers, stats=stats,
                                          min_chunk_bytes=8)
        assert counts == _bpe_regex_counts(data.decode("utf-8", "replace"), [_BPE_EOT])
        assert counts[" \ufffd"] == 1 and stats["invalid_bytes"] == 2
        assert "2 bytes" in _bpe_warning(capsys.readouterr().err, tmp_path / "t.txt")


def test_bpe_train_replaces_invalid_utf8_and_warns_how_many_bytes(tmp_path, capsys):
    # invalid UTF-8 is trained on as errors="replace" decodes it; one warning names the file and the bytes replaced
    data = b"good text \xff\xfe here and there\n<|endoftext|>\nmore \xc3 text\n"
    (tmp_path / "bad.txt").write_bytes(data)
    stats = {}
    _, merges = bpe.train_bpe(tmp_path / "bad.txt", 300, [_BPE_EOT], num_workers=1, stats=stats)
    assert stats["invalid_bytes"] == 3
    assert "3 bytes" in _bpe_warning(capsys.readouterr().err, tmp_path / "bad.txt")
    assert merges == bpe.train_bpe_reference(data.decode("utf-8", "replace"), 300, [_BPE_EOT])[1]


def test_bpe_parallel_counting_with_spawned_workers(tmp_path, monkeypatch):
    # macOS and Windows start workers with "spawn" (a fresh interpreter that imports bpe.py), not "fork"
    path = tmp_path / "c.txt"
    text = _bpe_synthetic_text(150, seed=8)
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(sys, "platform", "darwin")
    import multiprocessing
    methods, get_context = [], multiprocessing.get_context   # the start method asked for: spawn, or this is fork's test
    monkeypatch.setattr(multiprocessing, "get_context", lambda m=None: methods.append(m) or get_context(m))
    stats = {}
    counts = bpe.count_pretokens_file(path, [_BPE_EOT], num_workers=2, min_chunk_bytes=1000, stats=stats)
    monkeypatch.undo()
    assert methods == ["spawn"] and stats["num_processes"] == 2 and stats["worker_peak_rss_kb"] > 0
    assert counts == _bpe_regex_counts(text, [_BPE_EOT])


def test_bpe_parallel_counting_adds_up_invalid_bytes_and_memory_over_the_processes(tmp_path):
    # a forked worker counts one half: the invalid bytes add up over both, and the memory figures are filled in
    path = tmp_path / "c.txt"
    half = _bpe_synthetic_text(100, seed=6).encode()
    path.write_bytes(half + b"one bad \xff byte\n" + half + b"two \xfe\xfe bad bytes\n")
    stats = {}
    counts = bpe.count_pretokens_file(path, [_BPE_EOT], num_workers=2, min_chunk_bytes=1000, stats=stats)
    assert stats["num_processes"] == 2 and stats["invalid_bytes"] == 3
    assert counts[" \ufffd"] == 1 and counts[" \ufffd\ufffd"] == 1
    assert stats["pretokenize_peak_kb"] > stats["worker_peak_rss_kb"] > 0


@pytest.mark.parametrize("how,named", [("raise", ("RuntimeError", "boom")), ("die", ("exit code 3",))],
                         ids=["raises", "dies"])
def test_bpe_a_counting_worker_that_fails_is_one_error_naming_the_file(tmp_path, monkeypatch, how, named):
    # a worker that raises, or dies without a word: one ValueError starting with the file, no traceback, no hang
    path = tmp_path / "c.txt"
    half = _bpe_synthetic_text(100, seed=6).encode()
    path.write_bytes(half + half)
    main_pid, real = os.getpid(), bpe._count_chunks

    def count(*a, **k):
        if os.getpid() != main_pid:  # in the forked worker only
            if how == "raise":
                raise RuntimeError("boom")
            os._exit(3)
        return real(*a, **k)
    monkeypatch.setattr(bpe, "_count_chunks", count)
    _bpe_says(_raises(bpe.train_bpe, path, 300, [_BPE_EOT], num_workers=2, min_chunk_bytes=1000), f"{path}: ", *named)


def test_bpe_worker_processes_leave_ctrl_c_to_the_parent(tmp_path):
    # the workers ignore Ctrl-C (the parent stops them); the single-process path keeps Ctrl-C working
    import multiprocessing as mp
    import signal
    text = tmp_path / "in.txt"
    text.write_text("hello world <|endoftext|> hi\n", encoding="utf-8")
    before = signal.getsignal(signal.SIGINT)
    try:
        recv, send = mp.Pipe(duplex=False)
        bpe._count_worker(send, str(text), [(0, text.stat().st_size)], ["<|endoftext|>"])
        assert recv.recv()[3] is None and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, before)
        _bpe_byte_tokenizer().save_dir(tmp_path / "tok")
        bpe._encode_worker_init(str(tmp_path / "tok"))
        assert signal.getsignal(signal.SIGINT) is before
        bpe._encode_worker_init(str(tmp_path / "tok"), True)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("kind,named", [("missing", "no such file"), ("empty", "empty"), ("a folder", "directory"),
                                        ("binary", "UTF-8")], ids=["missing", "empty", "a_folder", "binary_input"])
def test_bpe_an_input_file_missing_empty_a_folder_or_binary_is_refused_first(tmp_path, kind, named):
    # training and encoding check their input before anything else (the command line's cases are in its table)
    path = tmp_path / "corpus.txt"
    if kind in ("empty", "binary"):
        path.write_bytes(b"\x00\x01 a model file" * 100 if kind == "binary" else b"")   # (UTF-8 but for its NULs)
    elif kind == "a folder":
        path.mkdir()
    _bpe_byte_tokenizer().save_dir(tmp_path / "tok")
    for call in (lambda: bpe.train_bpe(path, 300, [_BPE_EOT], num_workers=1),
                 lambda: bpe.encode_file(path, str(tmp_path / "tok"), tmp_path / "o.bin", num_workers=1)):
        _bpe_says(_raises(call), f"{path}: ", named)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["tok"] + ["corpus.txt"] * (kind != "missing"))


# ---- training: the merges against hand computation and bpe.train_bpe_reference


@pytest.mark.parametrize("text, specials, merges", [
    # pre-tokens "abab", "ab", "ba": (a,b)=3 -> a+b; then (ab,ab)=1 and (b,a)=1 tie: the greater pair of bytes,
    # (b"b", b"a") > (b"ab", b"ab"), wins -> b+a (an id-based tie-break would pick (ab,ab)); then ab+ab
    ("abab<|endoftext|>ab<|endoftext|>ba", [_BPE_EOT], [(b"a", b"b"), (b"b", b"a"), (b"ab", b"ab")]),
    # pre-tokens "the", " cat", " the": (t,h)=2 and (h,e)=2 tie, b"t" > b"h": t+h; then (th,e)=2; then of the four
    # pairs of count 1, (" ",c) (c,a) (a,t) (" ",the), (c,a) is the greatest
    ("the cat the", [], [(b"t", b"h"), (b"th", b"e"), (b"c", b"a")]),
    # non-ASCII text, no binary: "café" once and " café" 999 times tie 4 pairs at 1000, the greatest first: é's bytes
    ("caf\u00e9 " * 1000, [], [(b"\xc3", b"\xa9"), (b"f", b"\xc3\xa9"), (b"c", b"a"), (b"ca", b"f\xc3\xa9")]),
], ids=["tie", "pretoken_boundaries", "non_ascii"])
def test_bpe_train_hand_computed_merges(tmp_path, text, specials, merges):
    path = tmp_path / "tiny.txt"
    path.write_text(text, encoding="utf-8")
    n = len(specials)
    vocab, got = bpe.train_bpe(path, 256 + n + len(merges), specials, num_workers=1)
    assert got == merges and [vocab[i] for i in range(n)] == [s.encode() for s in specials]
    assert vocab[n + ord("a")] == b"a" and [vocab[i] for i in range(256 + n, len(vocab))] == [a + b for a, b in merges]


@pytest.mark.parametrize("source", ["synthetic", "tinystories", "webtext"])
def test_bpe_train_matches_the_reference_trainer(tmp_path, source):
    # bpe.train_bpe_reference is the specification: the same vocabulary and merges, on synthetic and real text
    if source == "synthetic":
        text, num_merges = _bpe_synthetic_text(120, seed=3), 60   # (it runs out of pairs after 64 merges)
    else:
        if not DATA.is_dir():
            pytest.skip(f"real text: no team data at {DATA} (a fresh clone has none); the synthetic case still runs")
        name = {"tinystories": "tinystories/tinystories_valid_first1000.txt", "webtext": "webtext/cs336_corpus_en.txt"}
        text, num_merges = (DATA / name[source]).read_text(encoding="utf-8")[:20_000], 150
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    size = 256 + 1 + num_merges
    vocab, merges = bpe.train_bpe(path, size, [_BPE_EOT], num_workers=1)
    assert (vocab, merges) == bpe.train_bpe_reference(text, size, [_BPE_EOT])
    assert len(merges) == num_merges and len(set(vocab.values())) == size


@pytest.mark.parametrize("text,num_merges", [
    ("ababab\n" * 10 + "aba " * 8 + "abab " * 3, 5),
    ("aaaaaa\n" * 10 + " aaa" * 7 + " aaaaa" * 4, 5),
    ("\n" * 3000 + "x yy", 8),
    ("ab" * 600 + " abab ba\n" + "=" * 999, 8),
], ids=["ababab", "aaaaaa", "3000_newlines", "ab_600_times"])
def test_bpe_train_words_holding_a_pair_many_times_match_the_reference(tmp_path, text, num_merges):
    # several sites of the merged pair in a word ("ababab", "aaaaaa": the rebuild path) count the (new, new) pairs once
    # and leave no phantom (new, a) pair; a word holding its pair thousands of times is indexed once for it
    path = tmp_path / "o.txt"
    path.write_text(text, encoding="utf-8")
    _, merges = bpe.train_bpe(path, 256 + num_merges, [], num_workers=1)
    assert merges == bpe.train_bpe_reference(text, 256 + num_merges)[1] and len(merges) == num_merges


def test_bpe_train_same_merges_for_any_worker_count(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text(_bpe_synthetic_text(400, seed=4), encoding="utf-8")
    results, chunks = [], []
    for w in (1, 2, 3):
        stats = {}
        results.append(bpe.train_bpe(path, 600, [_BPE_EOT], num_workers=w, stats=stats, chunk_bytes=8000,
                                     min_chunk_bytes=1000))
        chunks.append(stats["num_chunks"])
    assert results[0] == results[1] == results[2]
    assert min(chunks) > 1  # really split into chunks


def test_bpe_train_refuses_a_vocabulary_below_the_bytes_and_special_tokens_and_an_empty_special(tmp_path):
    # at least the 256 bytes and the special tokens (257 here: no merge at all); a special token is non-empty
    (tmp_path / "a.txt").write_text("hello")
    message = _raises(bpe.train_bpe, tmp_path / "a.txt", 256, [_BPE_EOT])
    _one_line_naming(message, "vocab_size=256 ", "256 bytes", "1 special")
    vocab, merges = bpe.train_bpe(tmp_path / "a.txt", 257, [_BPE_EOT], num_workers=1)
    assert len(vocab) == 257 and merges == []
    message = _raises(bpe.train_bpe, tmp_path / "a.txt", 300, [_BPE_EOT, ""])
    _one_line_naming(message, "special_tokens ", repr([_BPE_EOT, ""]))


# ---- the Tokenizer: GPT-2's files encode as tiktoken does; special tokens, ids and decoding


def _bpe_fuzz(seed, alphabet, n, max_len):
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len))) for _ in range(n)]


_BPE_RARE_WS = [c for c in bpe._WS_CHARS if c not in " \t\n"] + ["\x85", "\u2028"]

_BPE_TIKTOKEN_TEXTS = {   # texts on which GPT-2's files must encode as tiktoken does, and decode back
    "edge-cases": lambda: _BPE_EDGE_TEXTS,   # (<|endoftext|><|endoftext|> among them: two tokens, there is no double)
    "fuzz": lambda: _bpe_fuzz(1, [" ", "  ", "\n", "\t", "\r\n", "\u00a0", "a", "Bc", "1", "'", "'ll", "!", "é", "世",
                                  "🙂", _BPE_EOT, "<|", "\x1c"], 2000, 30) + [_bpe_synthetic_text(300, seed=2)],
    # U+0085 (NEL), U+2028, U+3000 ... next to space runs: the fast path must cut these runs as the regex does
    "rare-whitespace": lambda: ["  \n\n\x85  a! "] + _bpe_fuzz(
        3, [" ", "  ", "\n", "a", "Bc", "!", "\t"] + _BPE_RARE_WS, 3000, 14),
    # a lone surrogate (no UTF-8 bytes) becomes U+FFFD and a pair written as two halves is one character, as in tiktoken
    "surrogates": lambda: ["half \ud83d an emoji", "\ude00", "pair \ud83d\ude00 ok",
                           "\ud83d\ud83d  \udfff<|endoftext|>x"],
    "shared-corpora": lambda: [f.read_text(encoding="utf-8")[:150_000] for f in sorted(DATA.glob("*/*.txt"))],
}


@needs_gpt2_files
@pytest.mark.parametrize("texts", list(_BPE_TIKTOKEN_TEXTS))
def test_bpe_gpt2_files_encode_as_tiktoken(texts):
    # and encode_iterable (fineweb.py's path) agrees on the short texts; the pre-token counts are the regex's
    import tiktoken
    if texts == "shared-corpora" and not DATA.is_dir():
        pytest.skip(f"real text: no team data at {DATA} (a fresh clone has none)")
    enc, tok, all_texts = tiktoken.get_encoding("gpt2"), _bpe_gpt2(), _BPE_TIKTOKEN_TEXTS[texts]()
    assert tok.vocab_size == enc.n_vocab and tok.eot_id == enc.eot_token and len(all_texts) > 1
    for text in all_texts:
        ids = tok.encode(text)
        assert ids == enc.encode(text, allowed_special="all"), repr(text[:200])
        assert tok.decode(ids) == text or texts == "surrogates"
        if len(text) < 100:
            assert list(tok.encode_iterable([text], block_chars=4)) == ids
        if texts == "rare-whitespace":
            counts = Counter()
            bpe._count_pretokens(text, [], counts)
            assert counts == Counter(regex.findall(bpe.GPT2_SPLIT_PATTERN, text)), repr(text)


def test_bpe_roundtrip_and_special_tokens(tmp_path):
    tok = _bpe_small_tokenizer(tmp_path)
    for text in _BPE_EDGE_TEXTS:
        assert tok.decode(tok.encode(text)) == text, repr(text)
    assert tok.encode(_BPE_EOT) == [0] and tok.eot_id == 0
    assert tok.encode("<|endoftext|><|endoftext|>") == [0, 0]
    # both the single and the double special token: the longest match wins
    vocab, merges = dict(tok.vocab), list(tok.merges)
    double = bpe.Tokenizer(vocab, merges, [_BPE_EOT, _BPE_EOT * 2])
    assert double.encode("a<|endoftext|><|endoftext|><|endoftext|>b") == \
        double.encode("a") + [double.vocab_size - 1, 0] + double.encode("b")
    assert double.decode(double.encode(_BPE_EOT * 3)) == _BPE_EOT * 3


def test_bpe_special_tokens_missing_from_vocab_are_appended(tmp_path):
    tok = _bpe_small_tokenizer(tmp_path, specials=())
    n = tok.vocab_size
    t2 = bpe.Tokenizer(tok.vocab, tok.merges, ["<|user|>", "<|bot|>"])
    assert t2.vocab_size == n + 2 and t2.encode("<|user|>hi<|bot|>") == [n] + tok.encode("hi") + [n + 1]
    assert t2.eot_id is None
    tok.save(tmp_path / "v.json", tmp_path / "m.txt")                   # from_files too (CS336's overlapping test)
    t3 = bpe.Tokenizer.from_files(tmp_path / "v.json", tmp_path / "m.txt", ["<|user|>", "<|bot|>"])
    assert t3.vocab_size == n + 2 and t3.encode("<|bot|>") == [n + 1]


def test_bpe_appended_special_token_gets_an_unused_id_when_the_vocab_has_a_hole():
    # ids 0-255 and 257 (no 256): "appended with new ids" means past the largest id, never onto a taken one
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[257] = b"ab"
    tok = bpe.Tokenizer(vocab, [(b"a", b"b")], ["<|x|>"])
    assert tok.special_to_id["<|x|>"] == 258 and tok.vocab_size == 259 and tok.vocab[257] == b"ab"
    assert tok.encode("ab<|x|>") == [257, 258] and tok.decode([257, 258]) == "ab<|x|>"


def test_bpe_eot_id_of_a_vocabulary_holding_endoftext_without_declaring_it_special(tmp_path):
    # a vocabulary holding "<|endoftext|>" read with no special tokens named: eot_id points at it; text stays text
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = _BPE_EOT.encode()
    tok = bpe.Tokenizer(vocab, [])
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    for t in (tok, bpe.Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")):
        assert t.special_tokens == [] and t.eot_id == 256 and t.encode("<|") == [ord("<"), ord("|")]
    assert bpe.Tokenizer({i: bytes([i]) for i in range(256)}, []).eot_id is None


def test_bpe_a_pretoken_that_is_a_token_is_that_token_as_tiktoken_does():
    # b"abc" is in the vocabulary but no merge reaches it: a pre-token that is a token is that token, as in tiktoken
    import tiktoken
    ranks = {bytes([b]): b for b in range(256)}
    ref = tiktoken.Encoding("abc-test", pat_str=bpe.GPT2_SPLIT_PATTERN, mergeable_ranks={**ranks, b"abc": 256},
                            special_tokens={})
    tok = bpe.Tokenizer({**{i: b for b, i in ranks.items()}, 256: b"abc"}, [])
    for text in ["abc", "abc abc", "xabc", "abcabc", "abc!", "(abc)"]:
        assert tok.encode(text) == ref.encode(text), text
    assert tok.encode("abc") == [256]


def test_bpe_decode_replaces_invalid_utf8(tmp_path):
    tok = _bpe_small_tokenizer(tmp_path)
    first_byte = tok.token_to_id[bytes([0xC3])]  # the first of the two bytes of "é", alone
    assert tok.decode([first_byte]) == "\ufffd"
    assert tok.decode(tok.encode("é")) == "é"


@pytest.mark.parametrize("which", ["bpe", pytest.param("gpt2", marks=needs_gpt2_files)])
def test_bpe_decode_refuses_ids_outside_the_vocabulary(tmp_path, which):
    # an id past the vocabulary or a negative one: one error naming the id and the range, bpe.py's and GPT-2's
    tok = _bpe_small_tokenizer(tmp_path) if which == "bpe" else bpe.load_tokenizer("gpt2")
    ids = tok.encode("hello")
    assert tok.decode(ids) == "hello"
    for bad in (tok.vocab_size, -1, 1 << 40):
        _one_line_naming(_raises(tok.decode, ids + [bad]), "decode: ", f"id {bad} ", f"[0, {tok.vocab_size})")


# ---- tokenizer files: vocab.json and merges.txt in GPT-2's format (HF tokenizers reads them), special_tokens.json


def test_bpe_save_and_from_files_roundtrip(tmp_path):
    tok = _bpe_small_tokenizer(tmp_path)
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert (tmp_path / "merges.txt").read_text(encoding="utf-8").startswith("#version")
    again = bpe.Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", [_BPE_EOT])
    assert again.vocab == tok.vocab and again.merges == tok.merges
    # without the #version line
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    (tmp_path / "m2.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert bpe.Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "m2.txt", [_BPE_EOT]).merges == tok.merges
    tok.save_dir(tmp_path / "d")
    d = bpe.Tokenizer.from_dir(tmp_path / "d")
    assert d.special_tokens == [_BPE_EOT] and d.vocab == tok.vocab
    text = _bpe_synthetic_text(5, seed=9)
    assert d.encode(text) == tok.encode(text)


def test_bpe_saved_files_load_in_hf_tokenizers(tmp_path):
    import tokenizers  # the independent reference (requirements-dev.txt)
    tok = _bpe_small_tokenizer(tmp_path)
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    hf = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(tmp_path / "vocab.json"),
                                                              str(tmp_path / "merges.txt")))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    text = _bpe_synthetic_text(20, seed=6).replace(_BPE_EOT, "")
    assert hf.encode(text).ids == tok.encode(text)


def test_bpe_a_merge_of_hash_signs_survives_the_merges_file_round_trip(tmp_path):
    # only the FIRST line of merges.txt may be the "#version" header: a merge of "#" and "#" is the line "# #"
    import tokenizers  # the independent reference (requirements-dev.txt)
    tok = bpe.Tokenizer({**{i: bytes([i]) for i in range(256)}, 256: b"##", 257: b"###"}, [(b"#", b"#"), (b"##", b"#")])
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert (tmp_path / "merges.txt").read_text(encoding="utf-8") == "#version: 0.2\n# #\n## #\n"
    again = bpe.Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert again.merges == tok.merges and again.encode("#####") == tok.encode("#####") == [256, 257]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(tmp_path / "vocab.json"),
                                                              str(tmp_path / "merges.txt")))
    assert hf.encode("#####").ids == [256, 257]


def test_bpe_saved_special_tokens_with_spaces_or_non_ascii_are_their_text_and_load_back(tmp_path):
    # special tokens are vocab.json's own text (as GPT-2's "<|endoftext|>"), not bytes-to-unicode, and read back so
    import tokenizers  # the independent reference (requirements-dev.txt)
    specials = [_BPE_EOT, "<|end of text|>", "<|ü|>"]
    tok = _bpe_byte_tokenizer(specials)
    tok.save_dir(tmp_path / "d")
    vocab = json.loads((tmp_path / "d" / "vocab.json").read_text(encoding="utf-8"))
    assert {t: vocab.get(t) for t in specials} == {_BPE_EOT: 256, "<|end of text|>": 257, "<|ü|>": 258}
    hf = tokenizers.models.BPE.from_file(str(tmp_path / "d" / "vocab.json"), str(tmp_path / "d" / "merges.txt"))
    assert [hf.token_to_id(t) for t in specials] == [256, 257, 258]
    for again in (bpe.Tokenizer.from_dir(tmp_path / "d"),
                  bpe.Tokenizer.from_files(tmp_path / "d" / "vocab.json", tmp_path / "d" / "merges.txt", specials)):
        assert again.vocab == tok.vocab
        assert again.special_to_id == {specials[0]: 256, specials[1]: 257, specials[2]: 258}
        text = "a<|end of text|>ü<|ü|>b" + _BPE_EOT
        assert again.encode(text) == tok.encode(text) == [97, 257, 0xC3, 0xBC, 258, 98, 256]


def _bpe_append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


_BPE_BROKEN_FOLDERS = {  # how a tokenizer folder is broken: (what to do to it, the file at fault, what the error names)
    "no files": (lambda d: [(d / n).unlink() for n in ("vocab.json", "merges.txt", "special_tokens.json")], "",
                 ("vocab.json",)),
    "no special_tokens.json": (lambda d: (d / "special_tokens.json").unlink(), "", ("special_tokens.json",)),
    "special_tokens.json not JSON": (lambda d: (d / "special_tokens.json").write_text("[oops"), "special_tokens.json",
                                     ("JSON",)),
    "an empty special token": (lambda d: (d / "special_tokens.json").write_text(json.dumps([_BPE_EOT, ""])),
                               "special_tokens.json", ("non-empty",)),
    "a special token not in vocab.json": (
        lambda d: (d / "special_tokens.json").write_text(json.dumps([_BPE_EOT, "<|pad|>"])), "special_tokens.json",
        ("'<|pad|>'", "vocab.json")),
    "vocab.json not UTF-8": (lambda d: (d / "vocab.json").write_bytes(b'{"\x97": 0}'), "vocab.json", ("JSON",)),
    "merges.txt not UTF-8": (lambda d: (d / "merges.txt").write_bytes(b"#version: 0.2\n\x97\xff \x80\n"), "merges.txt",
                             ("UTF-8",)),
    "a merge of tokens not in vocab.json": (lambda d: _bpe_append(d / "merges.txt", "zq xw\n"), "merges.txt",
                                            ("'zq'", "'xw'")),
    "a merge line of three tokens": (lambda d: _bpe_append(d / "merges.txt", "a b c\n"), "merges.txt",
                                     ("'a b c'",)),
    "an id that is no integer": (lambda d: _bpe_edit_vocab(d, lambda v: dict(v, **{"Ġzz": "7"})), "vocab.json",
                                 ("'Ġzz'", "'7'")),
    "a byte's token gone": (lambda d: _bpe_edit_vocab(d, lambda v: {k: i for k, i in v.items() if i != 70}),
                            "vocab.json", ()),
    "special_tokens.json not UTF-8": (lambda d: (d / "special_tokens.json").write_bytes(b"caf\xe9"),
                                      "special_tokens.json", ()),
}


def _bpe_edit_vocab(d, change):
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    (d / "vocab.json").write_text(json.dumps(change(vocab)), encoding="utf-8")


@pytest.mark.parametrize("broken", list(_BPE_BROKEN_FOLDERS))
def test_bpe_a_broken_tokenizer_folder_is_refused_in_one_line_naming_the_file(tmp_path, monkeypatch, broken):
    # load_tokenizer, from_dir and --encode name the file at fault; a special token not in vocab.json is not appended
    d = _bpe_tok_dir(tmp_path)
    breaks, name, named = _BPE_BROKEN_FOLDERS[broken]
    breaks(d)
    at_fault = d / name if name else d
    for load in (bpe.load_tokenizer, bpe.Tokenizer.from_dir):
        _bpe_says(_raises(load, str(d)), f"{at_fault}:", *named)
    out = tmp_path / "out" / "x.bin"
    msg = _bad_exit(monkeypatch, bpe, "--encode", tmp_path / "corpus.txt", "--tokenizer", d, "--out", out)
    _bpe_says(msg, f"bpe.py: {at_fault}:", *named)
    assert not out.parent.exists()


# ---- encoding a stream (encode_iterable): encode()'s ids however the text is cut, in bounded memory


def test_bpe_encode_iterable_equals_encode_for_any_chunking(tmp_path):
    specials = [_BPE_EOT, _BPE_EOT * 2, "<|end of text|>"]  # one with a space: cut points must avoid it
    tok = _bpe_small_tokenizer(tmp_path, specials=specials)
    rng = random.Random(7)
    text = _bpe_synthetic_text(40, seed=7).replace("\n" + _BPE_EOT, "\n<|end of text|>", 5)
    text += "word<|endoftext|><|endoftext|><|endoftext|>  \n\n<|end of text|>tail<|endof"
    for chunks in _bpe_chunkings(text, rng):
        assert list(tok.encode_iterable(chunks, block_chars=64)) == tok.encode(text)
    # a line that ends in the middle of a special token, and in the middle of a word
    lines = ["abc <|endof", "text|> def", "gh", "ij  ", "\n", "<|end of", " text|>x"]
    assert list(tok.encode_iterable(lines, block_chars=4)) == tok.encode("".join(lines))


@needs_gpt2_files
def test_bpe_encode_iterable_gpt2_file_handle(tmp_path):
    import tiktoken
    enc = tiktoken.get_encoding("gpt2")
    tok = _bpe_gpt2()
    path = tmp_path / "t.txt"
    text = _bpe_synthetic_text(200, seed=8)
    path.write_text(text, encoding="utf-8")
    with open(path, encoding="utf-8") as f:
        assert list(tok.encode_iterable(f)) == enc.encode(text, allowed_special="all")


def test_bpe_encode_iterable_memory_is_bounded(tmp_path):
    import tracemalloc
    tok = _bpe_small_tokenizer(tmp_path)
    line = "the cat sat on the mat, Lily saw a big dog.\n"

    def lines(n):  # ~1.1 MB of text, never held at once
        for i in range(n):
            yield line if i % 50 else _BPE_EOT + "\n"

    tok.encode("warm the cache: " + line + _BPE_EOT)
    tracemalloc.start()
    count = 0
    for _ in tok.encode_iterable(lines(25_000), block_chars=16_384):
        count += 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count > 200_000
    assert peak < 500_000, peak  # the text alone is 1.1 MB and its ids list would be > 1.6 MB


def test_bpe_encode_iterable_looks_for_a_cut_point_a_logarithmic_number_of_times(tmp_path, monkeypatch):
    # text with no cut point for a long stretch: looking again only once the buffer has doubled keeps it linear
    tok = _bpe_small_tokenizer(tmp_path)
    looks = []
    cut = bpe._safe_cut
    monkeypatch.setattr(bpe, "_safe_cut", lambda buf, *a: looks.append(len(buf)) or cut(buf, *a))
    text = "x" + "\n" * 5_000 + "the end"
    assert list(tok.encode_iterable(iter(text), block_chars=64)) == tok.encode(text)
    assert len(looks) < 16, len(looks)   # (looking at every chunk: 5,000)


# ---- tokenizer references: 'gpt2' (tiktoken) or a folder, told apart by a fingerprint


@needs_gpt2_files
def test_bpe_load_tokenizer_gpt2_and_dir(tmp_path):
    g = bpe.load_tokenizer("gpt2")
    assert (g.name, g.vocab_size, g.eot_id) == ("gpt2", 50257, 50256)
    assert g.encode("hi<|endoftext|>") == [5303, 50256] and g.decode([5303, 50256]) == "hi<|endoftext|>"
    text = "a  b\n\n c<|endoftext|><|endoftext|>\n  d " * 3
    assert list(g.encode_iterable(list(text), block_chars=8)) == g.encode(text)
    _bpe_gpt2().save_dir(tmp_path / "g")
    t = bpe.load_tokenizer(str(tmp_path / "g"))
    assert t.name == str(tmp_path / "g") and t.eot_id == 50256 and t.vocab_size == 50257
    assert t.encode("Hello world<|endoftext|>") == g.encode("Hello world<|endoftext|>")


def test_bpe_load_tokenizer_of_a_path_that_is_no_folder_says_what_it_expects(tmp_path):
    # anything but "gpt2" names a tokenizer folder: a path that is missing, or a file, is one line naming it
    (tmp_path / "a_file").write_text("x")
    for ref in (tmp_path / "missing", tmp_path / "a_file"):
        _bpe_says(_raises(bpe.load_tokenizer, ref), "tokenizer ", ref, "gpt2", "directory")


def test_bpe_tokenizer_fingerprint_changes_with_the_special_tokens_alone(tmp_path):
    # another special_tokens.json with the same vocab.json and merges.txt encodes otherwise: another fingerprint
    tok = bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [], [_BPE_EOT])
    tok.save_dir(tmp_path / "d")
    before = bpe.tokenizer_fingerprint(tmp_path / "d")
    assert bpe.tokenizer_fingerprint(str(tmp_path / "d")) == before and len(before) == 16
    (tmp_path / "d" / "special_tokens.json").write_text("[]", encoding="utf-8")
    assert bpe.Tokenizer.from_dir(tmp_path / "d").encode(_BPE_EOT) != tok.encode(_BPE_EOT)
    assert bpe.tokenizer_fingerprint(tmp_path / "d") != before


# ---- encode_file: a text file to a token file and its sidecar, on all cores


def test_bpe_encode_file_matches_encode_and_writes_sidecar(tmp_path):
    tok = _bpe_small_tokenizer(save_to=tmp_path / "tok")
    text = _bpe_synthetic_text(300, seed=10)
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    meta = bpe.encode_file(tmp_path / "in.txt", str(tmp_path / "tok"), tmp_path / "out.bin", num_workers=2,
                           chunk_bytes=4000, min_chunk_bytes=1000)
    ids = np.fromfile(tmp_path / "out.bin", dtype=np.uint16)
    assert ids.tolist() == tok.encode(text)
    side = json.loads((tmp_path / "out.bin.json").read_text())
    assert side == {"format": "tokens-v1", "dtype": "uint16", "vocab_size": tok.vocab_size, "num_tokens": len(ids),
                    "num_docs": 300, "tokenizer": str(tmp_path / "tok"),
                    "tokenizer_fingerprint": bpe.tokenizer_fingerprint(tmp_path / "tok"), "eot_id": 0}
    assert meta["num_tokens"] == len(ids)


@needs_gpt2_files
def test_bpe_encode_file_with_gpt2_ref_matches_tiktoken(tmp_path):
    import tiktoken
    text = _bpe_synthetic_text(200, seed=13)
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    meta = bpe.encode_file(tmp_path / "in.txt", "gpt2", tmp_path / "o.bin", num_workers=2, chunk_bytes=3000,
                           min_chunk_bytes=1000)
    ids = np.fromfile(tmp_path / "o.bin", dtype=np.uint16).tolist()
    assert ids == tiktoken.get_encoding("gpt2").encode(text, allowed_special="all")
    assert (meta["tokenizer"], meta["eot_id"], meta["num_docs"], meta["vocab_size"]) == ("gpt2", 50256, 200, 50257)


def test_bpe_encode_file_never_cuts_inside_a_longer_special_token(tmp_path):
    # a cut found inside the double special token moves to its start: every chunk size gives encode()'s ids
    tok = _bpe_byte_tokenizer([_BPE_EOT, _BPE_EOT * 2])
    tok.save_dir(tmp_path / "tok")
    text = "a b " * 20 + _BPE_EOT * 2 + " c d" * 20 + _BPE_EOT * 3 + "e"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    want = tok.encode(text)
    assert want.count(257) == 2 and want.count(256) == 1
    for chunk_bytes in range(10, 130, 3):
        bpe.encode_file(tmp_path / "in.txt", str(tmp_path / "tok"), tmp_path / "o.bin", num_workers=1,
                        chunk_bytes=chunk_bytes, min_chunk_bytes=1)
        assert np.fromfile(tmp_path / "o.bin", dtype=np.uint16).tolist() == want, chunk_bytes


@pytest.mark.parametrize("layout", ["after_each", "between", "leading", "blank_docs"])
def test_bpe_encode_file_counts_documents_not_separators(tmp_path, layout):
    # num_docs counts the pieces with text between eot tokens: a separator after every story is no extra document
    docs = ["One day a cat sat.", "The dog ran home.", "A bird sang."]
    sep = "\n" + _BPE_EOT + "\n"
    text = {"after_each": "".join(d + sep for d in docs), "between": sep.join(docs),
            "leading": "".join(sep + d for d in docs), "blank_docs": sep + " \n" + sep.join(docs) + sep + sep}[layout]
    _bpe_small_tokenizer(save_to=tmp_path / "tok")
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    for chunk_bytes in (12, 40, 1 << 21):  # documents split across chunks are counted once
        meta = bpe.encode_file(tmp_path / "in.txt", str(tmp_path / "tok"), tmp_path / "o.bin", num_workers=1,
                               chunk_bytes=chunk_bytes, min_chunk_bytes=1)
        assert meta["num_docs"] == 3, chunk_bytes


@pytest.mark.parametrize("n_vocab,dtype", [(65536, np.uint16), (65537, np.uint32), (70_001, np.uint32)])
def test_bpe_encode_file_writes_uint16_up_to_65536_ids_and_uint32_above(tmp_path, n_vocab, dtype):
    # ids up to 65535 fit uint16; a vocabulary of 65537 has id 65536, which would wrap to 0 in uint16
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({i: f"<f{i}>".encode() for i in range(256, n_vocab - 1)})
    bpe.Tokenizer(vocab, [], [_BPE_EOT]).save_dir(tmp_path / "tok")   # the special token takes the last id
    (tmp_path / "in.txt").write_text("hi<|endoftext|>yo", encoding="utf-8")
    meta = bpe.encode_file(tmp_path / "in.txt", str(tmp_path / "tok"), tmp_path / "o.bin", num_workers=1)
    assert (meta["vocab_size"], meta["eot_id"], meta["num_docs"]) == (n_vocab, n_vocab - 1, 2)
    assert meta["dtype"] == np.dtype(dtype).name
    assert np.fromfile(tmp_path / "o.bin", dtype=dtype).tolist() == [104, 105, n_vocab - 1, 121, 111]


def test_bpe_encode_file_invalid_utf8_is_replaced_and_its_bytes_counted_in_a_warning(tmp_path, capsys):
    # --encode decodes each chunk with U+FFFD replacement as training does, and says how many bytes it replaced
    tok = _bpe_small_tokenizer(save_to=tmp_path / "tok")
    data = b"good text \xff\xfe here\n" + _BPE_EOT.encode() + b"\nmore \xe2\x82 text\n"
    (tmp_path / "bad.txt").write_bytes(data)
    capsys.readouterr()
    for workers in (1, 2):
        bpe.encode_file(tmp_path / "bad.txt", str(tmp_path / "tok"), tmp_path / "o.bin", num_workers=workers,
                        min_chunk_bytes=8)
        assert np.fromfile(tmp_path / "o.bin", dtype=np.uint16).tolist() == tok.encode(data.decode("utf-8", "replace"))
        assert "4 bytes" in _bpe_warning(capsys.readouterr().err, tmp_path / "bad.txt")


def test_bpe_encode_file_an_error_while_encoding_a_chunk_is_raised_not_written_as_nothing(tmp_path, monkeypatch):
    # a chunk that fails to encode must stop the run with its error, never leave its ids out of the file in silence
    _bpe_small_tokenizer(save_to=tmp_path / "tok")
    (tmp_path / "in.txt").write_text(_bpe_synthetic_text(50, seed=3), encoding="utf-8")

    def broken(self, text):
        raise RuntimeError("boom")
    monkeypatch.setattr(bpe.Tokenizer, "_encode", broken)
    message = _raises(bpe.encode_file, tmp_path / "in.txt", str(tmp_path / "tok"), tmp_path / "o.bin", num_workers=1)
    _bpe_says(message, f"{tmp_path / 'in.txt'}: ", "RuntimeError", "boom")
    assert not list(tmp_path.glob("o.bin*"))


def test_bpe_encode_file_cut_short_keeps_the_old_pair_and_no_temp(tmp_path, monkeypatch):
    # an encoding that fails halfway leaves the previous out.bin and its sidecar untouched (a temp file, renamed)
    _bpe_small_tokenizer(save_to=tmp_path / "tok")
    (tmp_path / "a.txt").write_text(_bpe_synthetic_text(300, seed=10), encoding="utf-8")
    (tmp_path / "b.txt").write_text(_bpe_synthetic_text(300, seed=11), encoding="utf-8")
    kw = dict(num_workers=1, chunk_bytes=4000, min_chunk_bytes=1000)
    bpe.encode_file(tmp_path / "a.txt", str(tmp_path / "tok"), tmp_path / "out.bin", **kw)
    old = {p.name: p.read_bytes() for p in tmp_path.glob("out.bin*")}
    real, calls = bpe._encode_chunk, []

    def fails_on_the_third_chunk(task):
        calls.append(task)
        return (b"", 0, 0, 0, "simulated failure") if len(calls) == 3 else real(task)
    monkeypatch.setattr(bpe, "_encode_chunk", fails_on_the_third_chunk)
    message = _raises(bpe.encode_file, tmp_path / "b.txt", str(tmp_path / "tok"), tmp_path / "out.bin", **kw)
    _bpe_says(message, f"{tmp_path / 'b.txt'}: ", "simulated failure")
    assert {p.name: p.read_bytes() for p in tmp_path.glob("out.bin*")} == old and len(old) == 2


def test_bpe_encode_file_failing_to_write_the_sidecar_leaves_no_old_sidecar_beside_new_ids(tmp_path, monkeypatch):
    # the old sidecar goes before new ids replace out.bin: never new ids under old counts, and no temp file
    tok = _bpe_small_tokenizer(save_to=tmp_path / "tok")
    (tmp_path / "a.txt").write_text(_bpe_synthetic_text(300, seed=10), encoding="utf-8")
    (tmp_path / "b.txt").write_text(_bpe_synthetic_text(100, seed=11), encoding="utf-8")
    bpe.encode_file(tmp_path / "a.txt", str(tmp_path / "tok"), tmp_path / "out.bin", num_workers=1)

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(bpe.json, "dump", full_disk)
    with pytest.raises(OSError) as e:
        bpe.encode_file(tmp_path / "b.txt", str(tmp_path / "tok"), tmp_path / "out.bin", num_workers=1)
    assert e.value.errno == 28   # the disk's error itself, not another one raised while cleaning up
    ids = np.fromfile(tmp_path / "out.bin", dtype=np.uint16).tolist()
    assert ids == tok.encode((tmp_path / "b.txt").read_text(encoding="utf-8"))
    assert sorted(p.name for p in tmp_path.glob("out.bin*")) == ["out.bin"]


# ---- the command line: train and report, encode; a bad flag or path is one line and nothing is written


def test_bpe_cli_trains_saves_reports_and_encodes(tmp_path):
    # the report's phases, peak memory, longest token and bytes per token (recomputed here); encoding's speed
    text = _bpe_synthetic_text(30, seed=14)
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    r = _bpe_cli("--vocab", 350, "--input", tmp_path / "in.txt", "--out", tmp_path / "tok", "--workers", 1,
                 "--sample_docs", 1000)
    assert r.returncode == 0, r.stderr
    for figure in ("wall time", "pre-tokenisation", "merging", "peak RSS", "longest token", "bytes/token"):
        assert figure in r.stdout
    assert {p.name for p in (tmp_path / "tok").iterdir()} == {"vocab.json", "merges.txt", "special_tokens.json"}
    tok = bpe.load_tokenizer(tmp_path / "tok")
    docs = [d for d in text.split(_BPE_EOT) if d.strip()]
    ratio = sum(len(d.encode()) for d in docs) / sum(len(tok.encode(d)) for d in docs)
    line = _bpe_report_line(r.stdout, "bytes/token")
    assert f"{ratio:.2f} bytes/token" in line and f" {len(docs)} " in line
    longest = max(len(v) for i, v in tok.vocab.items() if i != tok.eot_id)
    assert longest > 3 and f"{longest} bytes" in _bpe_report_line(r.stdout, "longest")
    r = _bpe_cli("--encode", tmp_path / "in.txt", "--tokenizer", tmp_path / "tok", "--out", tmp_path / "in.bin")
    assert r.returncode == 0, r.stderr
    assert "MB/s" in r.stdout and (tmp_path / "in.bin.json").is_file()


def test_bpe_cli_default_out_folder_and_printed_counts(tmp_path, monkeypatch, capsys):
    # tokenizers/<input stem>-<vocab> by default; the counts printed by training and by --encode
    corpus = _bpe_corpus(tmp_path / "corpus.txt")
    monkeypatch.chdir(tmp_path)
    _run(bpe, monkeypatch, "--input", str(corpus), "--vocab", "300", "--workers", "1")
    out = Path("tokenizers") / "corpus-300"
    tok = bpe.load_tokenizer(out)
    assert tok.vocab_size == 300 and len(tok.merges) == 300 - 256 - 1
    line = _bpe_report_line(capsys.readouterr().out, "merges")
    assert all(figure in line for figure in ("300 tokens", "43 merges", str(corpus), str(out))), line
    _run(bpe, monkeypatch, "--encode", str(corpus), "--tokenizer", str(out), "--out", "c.bin", "--workers", "1")
    meta = json.loads(Path("c.bin.json").read_text())
    assert meta["dtype"] == "uint16" and meta["num_docs"] == 60 and meta["tokenizer"] == str(out)
    line = _bpe_report_line(capsys.readouterr().out, "c.bin")
    assert all(figure in line for figure in (f"{meta['num_tokens']:,} tokens", "uint16", "60 docs")), line


def test_bpe_cli_default_out_is_named_by_the_vocabulary_reached(tmp_path, monkeypatch, capsys):
    # a text that runs out of pairs before --vocab 10000: the folder and the report give the vocabulary reached
    corpus = _bpe_corpus(tmp_path / "corpus.txt", n=20)
    monkeypatch.chdir(tmp_path)
    _run(bpe, monkeypatch, "--input", str(corpus), "--vocab", "10000", "--workers", "1")
    (out,) = Path("tokenizers").iterdir()
    reached = bpe.load_tokenizer(out).vocab_size
    assert reached < 10000 and out.name == f"corpus-{reached}"
    line = _bpe_report_line(capsys.readouterr().out, "merges")
    assert f"{reached} tokens" in line and str(out) in line and "10000" not in line


def test_bpe_cli_an_empty_special_trains_without_special_tokens(tmp_path, monkeypatch):
    # --special "": no special token at all, and "<|endoftext|>" in a text is plain characters
    corpus = _bpe_corpus(tmp_path / "corpus.txt")
    _run(bpe, monkeypatch, "--vocab", "300", "--input", str(corpus), "--out", str(tmp_path / "d"),
         "--special", "", "--workers", "1", "--sample_docs", "2")
    assert json.loads((tmp_path / "d" / "special_tokens.json").read_text()) == []
    tok = bpe.load_tokenizer(tmp_path / "d")
    assert tok.vocab_size == 300 and len(tok.merges) == 300 - 256 and tok.eot_id is None
    assert tok.decode(tok.encode(_BPE_EOT)) == _BPE_EOT


def test_bpe_tokenizer_without_special_tokens_still_loads_and_says_no_doc_count(tmp_path, monkeypatch, capsys):
    # without <|endoftext|> there are no documents to count: the sidecar says None, the report says why
    d = _bpe_tok_dir(tmp_path, specials=())
    assert json.loads((d / "special_tokens.json").read_text()) == [] and bpe.load_tokenizer(str(d)).eot_id is None
    out = tmp_path / "x.bin"
    _run(bpe, monkeypatch, "--encode", str(tmp_path / "corpus.txt"), "--tokenizer", str(d),
         "--out", str(out), "--workers", "1")
    said = capsys.readouterr().out
    assert "None" not in said and _BPE_EOT in said
    side = json.loads(Path(f"{out}.json").read_text())
    assert side["eot_id"] is None and side["num_docs"] is None


# ---- the command line's refusals: one line naming the flag or file, exit status 1, nothing printed or written

_BPE_CLI_REFUSALS = {   # case: (command line, the line's start, what it names); {d} is the test's folder: corpus.txt,
    # empty.txt, model.bin (binary), noise.txt (invalid UTF-8), a_file, a_dir, tok/ (a tokenizer), ro/ (not writable)
    "workers-0": ("--input {d}/corpus.txt --vocab 300 --out {d}/t --workers 0", "bpe.py: --workers 0:", ()),
    "workers-negative-encode": ("--encode {d}/corpus.txt --out {d}/x.bin --workers -2", "bpe.py: --workers -2:", ()),
    "sample_docs-0-encode": ("--encode {d}/corpus.txt --out {d}/x.bin --sample_docs 0", "bpe.py: --sample_docs 0:",
                             ()),
    "sample_docs-negative": ("--input {d}/corpus.txt --vocab 300 --out {d}/t --sample_docs -1",
                             "bpe.py: --sample_docs -1:", ()),
    "vocab-below-bytes": ("--input {d}/corpus.txt --vocab 100 --out {d}/t", "bpe.py: --vocab 100: ", ("257",)),
    "encode-without-out": ("--encode {d}/corpus.txt", "bpe.py: --encode ", ("--out",)),
    "input-missing": ("--input {d}/none.txt --vocab 300 --out {d}/t", "bpe.py: {d}/none.txt: ", ("no such file",)),
    "input-empty": ("--input {d}/empty.txt --vocab 300 --out {d}/t", "bpe.py: {d}/empty.txt: ", ("empty",)),
    "input-a-folder": ("--input {d}/a_dir --vocab 300 --out {d}/t", "bpe.py: {d}/a_dir: ", ("directory",)),
    "encode-missing": ("--encode {d}/none.txt --tokenizer {d}/tok --out {d}/x.bin --workers 1",
                       "bpe.py: {d}/none.txt: ", ("no such file",)),
    "encode-empty": ("--encode {d}/empty.txt --tokenizer {d}/tok --out {d}/x.bin --workers 1",
                     "bpe.py: {d}/empty.txt: ", ("empty",)),
    "encode-a-folder": ("--encode {d}/a_dir --tokenizer {d}/tok --out {d}/x.bin --workers 1", "bpe.py: {d}/a_dir: ",
                        ("directory",)),
    "input-binary": ("--input {d}/model.bin --vocab 300 --out {d}/t", "bpe.py: {d}/model.bin: ", ("UTF-8",)),
    "input-not-utf8": ("--input {d}/noise.txt --vocab 300 --out {d}/t", "bpe.py: {d}/noise.txt: ", ("UTF-8",)),
    "out-a-file": ("--input {d}/corpus.txt --vocab 300 --out {d}/a_file", "bpe.py: --out {d}/a_file: ",
                   ("{d}/a_file",)),
    "out-in-a-file": ("--input {d}/corpus.txt --vocab 300 --out {d}/a_file/sub", "bpe.py: --out {d}/a_file/sub: ",
                      ("{d}/a_file",)),
    "out-not-writable": ("--input {d}/corpus.txt --out {d}/ro/tok", "bpe.py: --out {d}/ro/tok: ", ("not writable",)),
    "out-under-proc": ("--input {d}/corpus.txt --vocab 300 --out /proc/x", "bpe.py: --out /proc/x: ", ("/proc",)),
    "encode-out-a-folder": ("--encode {d}/corpus.txt --tokenizer {d}/tok --out {d}/a_dir --workers 1",
                            "bpe.py: --out {d}/a_dir: ", ("folder",)),
    "encode-out-in-a-file": ("--encode {d}/corpus.txt --tokenizer {d}/tok --out {d}/a_file/x.bin --workers 1",
                             "bpe.py: --out {d}/a_file/x.bin: ", ("{d}/a_file",)),
    "encode-out-not-writable": ("--encode {d}/corpus.txt --out {d}/ro/x.bin", "bpe.py: --out {d}/ro/x.bin: ",
                                ("not writable",)),
    "encode-out-under-proc": ("--encode {d}/corpus.txt --out /proc/x", "bpe.py: --out /proc/x: ", ("/proc",)),
    "out-a-tokenizer-already": ("--input {d}/corpus.txt --vocab 300 --out {d}/tok", "bpe.py: --out {d}/tok: ",
                                ("--force",)),
    "encode-out-exists": ("--encode {d}/corpus.txt --tokenizer {d}/tok --out {d}/a_file --workers 1",
                          "bpe.py: --out {d}/a_file: ", ("--force",)),
}


@pytest.mark.parametrize("case", list(_BPE_CLI_REFUSALS))
def test_bpe_cli_refuses_bad_input_before_any_work(tmp_path, monkeypatch, capsys, case):
    # bad counts, inputs and --out paths (/proc takes no new file, even from root): refused before any work
    if "proc" in case and not os.path.isdir("/proc/self"):
        pytest.skip("Linux's /proc")
    argv, prefix, named = _BPE_CLI_REFUSALS[case]
    fill = lambda s: s.replace("{d}", str(tmp_path))
    _bpe_corpus(tmp_path / "corpus.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "model.bin").write_bytes(b"\x00\x01 a model file" * 100)   # (valid UTF-8 but for its NULs)
    (tmp_path / "noise.txt").write_bytes(bytes(random.Random(0).randrange(128, 256) for _ in range(50000)))
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "ro").mkdir()
    _bpe_byte_tokenizer().save_dir(tmp_path / "tok")
    before = _files(tmp_path), sorted(tmp_path.rglob("*"))
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path / "ro" and access(path, mode))
    monkeypatch.setattr(bpe, "train_bpe", _bpe_not_called)
    _bad_says(_bad_exit(monkeypatch, bpe, *fill(argv).split()), fill(prefix), *map(fill, named))
    assert capsys.readouterr() == ("", "") and (_files(tmp_path), sorted(tmp_path.rglob("*"))) == before


def test_bpe_cli_force_writes_over_an_existing_output_and_a_default_name_reached_is_checked_too(tmp_path,
                                                                                                  monkeypatch):
    # --force writes a tokenizer over one and a token file over one; without it, the default folder named by the
    # vocabulary reached (known only after training) is refused too, and left as it was
    corpus = _bpe_corpus(tmp_path / "corpus.txt", n=20)
    monkeypatch.chdir(tmp_path)
    _bpe_byte_tokenizer().save_dir(tmp_path / "tok")
    _run(bpe, monkeypatch, "--input", corpus, "--vocab", 300, "--out", tmp_path / "tok", "--workers", 1, "--force")
    assert bpe.load_tokenizer(tmp_path / "tok").vocab_size == 300
    (tmp_path / "x.bin").write_bytes(b"old")
    _run(bpe, monkeypatch, "--encode", corpus, "--tokenizer", tmp_path / "tok", "--out", tmp_path / "x.bin",
         "--workers", 1, "--force")
    assert (tmp_path / "x.bin").read_bytes() != b"old" and (tmp_path / "x.bin.json").is_file()
    reached = len(bpe.train_bpe(corpus, 10000, [_BPE_EOT], num_workers=1)[0])
    mine = tmp_path / "tokenizers" / f"corpus-{reached}"
    _bpe_byte_tokenizer().save_dir(mine)
    before = _files(tmp_path)
    msg = _bad_exit(monkeypatch, bpe, "--input", corpus, "--vocab", 10000, "--workers", 1)
    _bpe_says(msg, f"bpe.py: {mine.relative_to(tmp_path)} ", "--force", "--out")
    assert _files(tmp_path) == before


@pytest.mark.parametrize("job", ["train", "encode"])
def test_bpe_cli_a_full_disk_is_one_line_and_leaves_the_earlier_output(tmp_path, job):
    # a full disk: exit status 1, one line naming --out, the earlier output left byte for byte, no temp file
    corpus = _bpe_corpus(tmp_path / "corpus.txt")
    if job == "train":
        out = tmp_path / "tok"
        _bpe_byte_tokenizer().save_dir(out)
        argv = ["--input", corpus, "--vocab", 400, "--out", out, "--workers", 1, "--force"]
    else:
        out = tmp_path / "x.bin"
        tok = _bpe_tok_dir(tmp_path)   # (a local tokenizer: GPT-2's files may be unavailable offline)
        bpe.encode_file(corpus, str(tok), out, num_workers=1)
        argv = ["--encode", corpus, "--tokenizer", tok, "--out", out, "--workers", 1, "--force"]
    before = _files(tmp_path)
    r = _bpe_cli(*argv, preexec_fn=_file_size_limit(2000))
    assert r.returncode == 1
    _one_line_naming(r.stderr.strip().splitlines()[-1], f"bpe.py: --out {out}: ")
    assert _files(tmp_path) == before


def test_bpe_cli_ctrl_c_writes_nothing_and_is_one_line(tmp_path, monkeypatch):
    # the message starts on a line of its own (after the progress display) and says what was not written
    text = tmp_path / "in.txt"
    text.write_text(_bpe_synthetic_text(50, seed=3), encoding="utf-8")

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(bpe, "train_bpe", ctrl_c)
    monkeypatch.setattr(bpe, "encode_file", ctrl_c)
    for argv, out in ((["--input", text, "--vocab", 300, "--out", tmp_path / "tok"], tmp_path / "tok"),
                      (["--encode", text, "--tokenizer", "gpt2", "--out", tmp_path / "x.bin"], tmp_path / "x.bin")):
        _one_line_naming(_ctrl_c_line(monkeypatch, bpe, *argv), "bpe.py: ", "interrupted", out)
        assert not out.exists()


def test_bpe_without_input_trains_on_the_main_jobs_corpus_made_first(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    made = []

    def prepare(cmd, cwd):   # stands in for `python fineweb.py --prepare_tinystories`
        made.append(cmd[1:])
        Path("data/tinystories").mkdir(parents=True)
        Path(bpe.MAIN_JOB_CORPUS).write_text(_bpe_synthetic_text(200, seed=3), encoding="utf-8")
        return types.SimpleNamespace(returncode=0)
    monkeypatch.setattr(bpe.subprocess, "run", prepare)
    _run(bpe, monkeypatch, "--vocab", "300", "--workers", "1", "--force")
    assert made == [bpe.PREPARE_MAIN_JOB] and bpe.load_tokenizer("tokenizers/train-300").vocab_size == 300
    assert f"training on {bpe.MAIN_JOB_CORPUS}" in capsys.readouterr().out
    bpe.main()   # the corpus is there now: not prepared again
    assert len(made) == 1


def test_bpe_progress_in_a_log_file_is_a_line_per_update_and_switched_off_draws_nothing(capsys):
    bar = bpe.progress_bar(3, "work", "step")
    for _ in range(3):
        bar.update()
    bar.close()
    err = capsys.readouterr().err   # (pytest's capture is no terminal)
    assert "\r" not in err and err.strip().splitlines()[-1].startswith("work: 100%")
    # switched off (a library call or a worker process): the count a caller reads back, nothing on stderr, no tqdm
    bar = bpe.progress_bar(10, "work", "step", enabled=False, initial=2)
    bar.update(3)
    bar.set_postfix_str("5 done", refresh=False)
    bar.close()
    assert bar.n == 5 and capsys.readouterr().err == ""


# ==== model.py: both models: building blocks against obvious references, whole models against transformers


_MODEL_LLAMA = dict(vocab_size=97, context_length=32, d_model=64, num_layers=2, num_heads=4, d_ff=96,
                    rope_theta=10000.0)

_MODEL_GPT = dict(block_size=32, vocab_size=97, n_layer=2, n_head=4, n_embd=64)


def _model_llama(seed=0, **kw):
    torch.manual_seed(seed)
    return M.TransformerLM(**{**_MODEL_LLAMA, **kw})


def _model_gpt(seed=0, **kw):
    torch.manual_seed(seed)
    return M.GPT(M.GPTConfig(**{**_MODEL_GPT, **kw}))


def _model_ids(vocab, shape=(2, 32), seed=1):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _named_in_order(message, *named):
    """message names these values in this order: the value before the limit it breaks, the file's before the model's."""
    at = 0
    for n in map(str, named):
        at = message.find(n, at)
        assert at >= 0, (message, named)
        at += len(n)


# ---- the Llama model's building blocks, each against torch's own version or its formula


def test_model_linear_and_embedding_init_is_cs336s_truncated_normal():
    # linears N(0, 2 / (in + out)) truncated at +-3 std, embeddings N(0, 1) truncated at +-3 (std 0.9866)
    torch.manual_seed(0)
    lin = M.Linear(256, 512)
    std = (2 / (256 + 512)) ** 0.5
    assert lin.weight.shape == (512, 256)   # (out, in), as nn.Linear stores it
    assert abs(lin.weight.std().item() / std - 0.9866) < 0.01
    assert 2.9 * std < lin.weight.abs().max().item() <= 3 * std + 1e-6
    emb = M.Embedding(1000, 256)
    assert emb.weight.shape == (1000, 256)
    assert abs(emb.weight.std().item() - 0.9866) < 0.01 and 2.9 < emb.weight.abs().max().item() <= 3.0


def test_model_rmsnorm_matches_torch_and_normalises_16_bit_inputs_in_float32():
    # fp16 activations of a few hundred square past fp16: the norm is taken in float32, the output in the input's dtype
    norm = M.RMSNorm(32)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(32) + 0.5)
    x = torch.randn(4, 6, 32) * 300
    torch.testing.assert_close(norm(x), F.rms_norm(x, (32,), norm.weight, eps=1e-5))
    for dtype in (torch.float16, torch.bfloat16):
        xl = x.to(dtype)
        out = norm(xl)
        assert out.dtype == dtype
        want = F.rms_norm(xl.float(), (32,), norm.weight, eps=1e-5).to(dtype)
        torch.testing.assert_close(out, want, atol=0, rtol=2 ** -10 if dtype == torch.float16 else 2 ** -7)


def test_model_silu_and_swiglu_match_torch():
    x = torch.randn(4, 10, requires_grad=True)
    torch.testing.assert_close(M.silu(x), F.silu(x))
    ffn = M.SwiGLU(10, 24)
    assert [tuple(p.shape) for p in (ffn.w1.weight, ffn.w2.weight, ffn.w3.weight)] == [(24, 10), (10, 24), (24, 10)]
    ref = F.linear(F.silu(F.linear(x, ffn.w1.weight)) * F.linear(x, ffn.w3.weight), ffn.w2.weight)
    torch.testing.assert_close(ffn(x), ref)


def test_model_rope_matches_complex_rotation():
    d_k, T = 16, 12
    rope = M.RotaryPositionalEmbedding(10000.0, d_k, 64)
    x = torch.randn(2, 3, T, d_k)
    pos = torch.randint(0, 64, (2, 1, T))
    # reference: each adjacent pair is a complex number multiplied by e^{i pos / theta^(2k/d)}
    freqs = 1.0 / 10000.0 ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    rot = torch.polar(torch.ones(2, 1, T, d_k // 2, dtype=torch.float64), pos[..., None].double() * freqs)
    ref = torch.view_as_real(torch.view_as_complex(x.double().reshape(2, 3, T, d_k // 2, 2)) * rot).reshape(x.shape)
    torch.testing.assert_close(rope(x, pos), ref.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rope(x), rope(x, torch.arange(T)))
    assert "cos" not in rope.state_dict() and "sin" not in rope.state_dict()


def test_model_rope_gradient_is_the_inverse_rotation():
    rope = M.RotaryPositionalEmbedding(10000.0, 16, 64)
    pos = torch.randint(0, 64, (2, 1, 12))
    x = torch.randn(2, 3, 12, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rope(t, pos), (x,))


def test_model_softmax_matches_torch_with_gradient():
    x = (torch.randn(3, 4, 50) * 20).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    g = torch.randn(3, 4, 50)
    for dim in (-1, 1):
        ours, ref = M.softmax(x, dim), torch.softmax(x_ref, dim)
        torch.testing.assert_close(ours, ref)
        ours.backward(g)
        ref.backward(g)
        torch.testing.assert_close(x.grad, x_ref.grad)
        x.grad = x_ref.grad = None
    big = torch.tensor([1000.0, 1001.0, -1000.0])  # max subtraction keeps it finite
    torch.testing.assert_close(M.softmax(big, 0), torch.softmax(big, 0))
    # float64 stays float64 (only 16-bit inputs are promoted, to float32): a difference float32 cannot hold
    close = torch.tensor([1e4, 1e4 + 1e-6, 0.0], dtype=torch.float64)
    torch.testing.assert_close(M.softmax(close, 0), torch.softmax(close, 0), rtol=1e-12, atol=1e-15)
    assert torch.autograd.gradcheck(lambda t: M.softmax(t, -1), torch.randn(3, 5, dtype=torch.float64,
                                                                             requires_grad=True))
    # with a mask: the softmax of the masked-out scores, x itself untouched, no gradient where masked
    mask, before = torch.rand(4, 50) > 0.5, x.detach().clone()
    mask[:, 0] = True
    ours, ref = M.softmax(x, -1, mask), torch.softmax(x_ref.masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(ours, ref)
    ours.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert torch.equal(x.detach(), before) and (x.grad[:, ~mask] == 0).all()


def test_model_attention_matches_torch_sdpa():
    q, k, v = (torch.randn(2, 3, 9, 8, requires_grad=True) for _ in range(3))
    mask = torch.rand(9, 9) > 0.3
    mask[:, 0] = True  # every row sees something
    ours = M.scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(ours.sum(), (q, k, v))
    grads_ref = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(M.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               atol=1e-5, rtol=1e-5)


def test_model_fully_masked_rows_give_zeros_not_nan():
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    mask[2] = False  # row 2 may attend to nothing
    out = M.scaled_dot_product_attention(q, k, v, mask)
    assert not out.isnan().any()
    assert (out[:, :, 2] == 0).all()
    keep = [0, 1, 3, 4]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.tril())  # same mask
    torch.testing.assert_close(out[:, :, keep], ref[:, :, keep], atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert not any(t.grad.isnan().any() for t in (q, k, v))
    assert (M.softmax(torch.full((3,), float("-inf")), 0) == 0).all()


def test_model_attention_is_causal_and_uses_positions():
    attn = M.MultiHeadSelfAttention(64, 4, 32, 10000.0)
    x = torch.randn(1, 10, 64)
    y = attn(x)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(1, 4, 64)  # changing the future leaves the past untouched
    torch.testing.assert_close(attn(x2)[:, :6], y[:, :6])
    torch.testing.assert_close(attn(x, torch.arange(10)), y)
    shifted = attn(x, torch.arange(5, 15)[None])
    torch.testing.assert_close(shifted, y, atol=1e-5, rtol=1e-5)  # RoPE scores depend on offsets only
    assert not torch.allclose(attn(x, torch.arange(10).flip(0)), y)


def test_model_per_row_token_positions_rotate_each_row_by_its_own_positions():
    # each row at its own offsets, as that row alone; batch == num_heads, so broadcasting on heads would still run
    torch.manual_seed(0)
    attn = M.MultiHeadSelfAttention(64, 4, 32, 10000.0, attn_impl="scratch")
    x = torch.randn(4, 10, 64)
    pos = torch.stack([torch.arange(10) * (b % 2 + 1) + b for b in range(4)])   # not all shifts of one another
    out = attn(x, pos)
    for b in range(4):
        torch.testing.assert_close(out[b], attn(x[b:b + 1], pos[b])[0], atol=1e-5, rtol=1e-5)
    m = _model_llama()
    ids = _model_ids(97, (4, 10))
    batched = m(ids, token_positions=pos)
    for b in range(4):
        torch.testing.assert_close(batched[b], m(ids[b:b + 1], token_positions=pos[b])[0], atol=1e-5, rtol=1e-5)


def test_model_attention_switches_equal():
    x = torch.randn(2, 16, 64, requires_grad=True)
    torch.manual_seed(0)
    a = M.MultiHeadSelfAttention(64, 4, 32, 10000.0, attn_impl="scratch")
    b = M.MultiHeadSelfAttention(64, 4, 32, 10000.0, attn_impl="sdpa")
    b.load_state_dict(a.state_dict())
    ya, yb = a(x), b(x)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    ga = torch.autograd.grad(ya.square().sum(), [x, *a.parameters()])
    gb = torch.autograd.grad(yb.square().sum(), [x, *b.parameters()])
    for u, w in zip(ga, gb):
        torch.testing.assert_close(u, w, atol=1e-4, rtol=1e-4)
    la, lb = _model_llama(attn_impl="scratch"), _model_llama(attn_impl="sdpa")
    ids = _model_ids(97)
    torch.testing.assert_close(la(ids), lb(ids), atol=1e-5, rtol=1e-5)
    ga, gb = _model_gpt(attn_impl="scratch"), _model_gpt(attn_impl="sdpa")
    torch.testing.assert_close(ga(ids)[0], gb(ids)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_model_attn_impl_chooses_the_kernel_in_both_architectures(arch, monkeypatch):
    # sdpa and scratch agree numerically: only which kernel ran tells them apart
    make = _model_llama if arch == "llama" else _model_gpt
    calls, real = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    for impl, fused in (("sdpa", True), ("scratch", False)):
        calls.clear()
        make(attn_impl=impl)(torch.zeros(1, 4, dtype=torch.long))
        assert bool(calls) == fused, impl
    _one_line_naming(_raises(make, attn_impl="flash"), "attn_impl", "'flash'")


def test_model_linear_and_embedding_match_torch_with_the_embeddings_gradient():
    # Embedding.forward is weight[ids] (by index_select, whose backward sums in a fixed order): same rows, same grads
    torch.manual_seed(0)
    lin, emb = M.Linear(16, 8), M.Embedding(50, 8)
    x, ids = torch.randn(3, 5, 16), torch.randint(0, 50, (3, 7))
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight))
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))
    g = torch.randn(3, 7, 8)
    out = emb(ids)
    out.backward(g)
    ref = emb.weight.detach().clone().requires_grad_()
    ref[ids].backward(g)
    assert torch.equal(out, ref[ids]) and torch.allclose(emb.weight.grad, ref.grad, atol=1e-6)


# ---- the Llama model: blocks, the ablation switches, against transformers' Llama


def test_model_block_pre_and_post_norm_structure():
    torch.manual_seed(0)
    pre = M.TransformerBlock(64, 4, 96, 32, 10000.0)
    post = M.TransformerBlock(64, 4, 96, 32, 10000.0, M.TransformerLMConfig(use_post_norm=True))
    post.load_state_dict(pre.state_dict())
    x = torch.randn(2, 8, 64)
    h = x + pre.attn(pre.ln1(x))
    torch.testing.assert_close(pre(x), h + pre.ffn(pre.ln2(h)))
    h = pre.ln1(x + pre.attn(x))
    torch.testing.assert_close(post(x), pre.ln2(h + pre.ffn(h)))


def test_model_post_norm_switch_reaches_every_block():
    # TransformerLM(use_post_norm=True) is the post-norm block stacked, not the pre-norm model with the same keys
    pre, post = _model_llama(), _model_llama(use_post_norm=True)
    with torch.no_grad():
        for layer in pre.layers:   # non-trivial gains so that pre and post norm cannot agree by accident
            layer.ln1.weight.uniform_(0.5, 1.5)
            layer.ln2.weight.uniform_(0.5, 1.5)
    post.load_state_dict(pre.state_dict())
    assert all(layer.use_post_norm for layer in post.layers) and not any(layer.use_post_norm for layer in pre.layers)
    ids = _model_ids(97)
    x = post.token_embeddings(ids)
    for layer in post.layers:
        h = layer.ln1(x + layer.attn(x))
        x = layer.ln2(h + layer.ffn(h))
    torch.testing.assert_close(post(ids), post.lm_head(post.ln_final(x)))
    assert not torch.allclose(post(ids), pre(ids), atol=1e-3)


def test_model_ablation_switches_state_dict_keys():
    base = set(_model_llama().state_dict())
    assert {"token_embeddings.weight", "ln_final.weight", "lm_head.weight", "layers.0.ln1.weight",
            "layers.0.attn.q_proj.weight", "layers.0.attn.k_proj.weight", "layers.0.attn.v_proj.weight",
            "layers.0.attn.output_proj.weight", "layers.0.ln2.weight", "layers.0.ffn.w1.weight",
            "layers.0.ffn.w2.weight", "layers.0.ffn.w3.weight"} <= base
    assert set(_model_llama(use_post_norm=True).state_dict()) == base
    assert set(_model_llama(remove_rope=True).state_dict()) == base
    no_norm = set(_model_llama(remove_rmsnorm=True).state_dict())
    assert no_norm == {k for k in base if "ln" not in k}
    silu = _model_llama(ffn_type="silu", d_ff=256)
    assert "layers.0.ffn.w3.weight" not in silu.state_dict()
    ids = _model_ids(97)
    for kw in (dict(use_post_norm=True), dict(remove_rope=True), dict(remove_rmsnorm=True), dict(ffn_type="silu")):
        m = _model_llama(**kw)
        out = m(ids)
        assert out.shape == (2, 32, 97) and torch.isfinite(out).all()
        assert M.build_model(json.loads(json.dumps(m.model_config()))).model_config() == m.model_config()
    ffn = silu.layers[0].ffn   # ffn_type="silu": W2 SiLU(W1 x), no gate
    inp = torch.randn(3, 64)
    torch.testing.assert_close(ffn(inp), F.linear(F.silu(F.linear(inp, ffn.w1.weight)), ffn.w2.weight))


def test_model_nope_takes_no_positions_at_all_but_stays_causal():
    # remove_rope: no rotary tables, so positions that are no shift of 0..T-1 change nothing either
    ids = _model_ids(97, (2, 12))
    nope, rope = _model_llama(remove_rope=True), _model_llama()
    assert all(layer.attn.rope is None for layer in nope.layers)
    out = nope(ids)
    scrambled = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(nope(ids, token_positions=scrambled), out)
    torch.testing.assert_close(nope(ids, token_positions=torch.arange(12) + 7), out)
    assert not torch.allclose(rope(ids, token_positions=scrambled), rope(ids), atol=1e-4)
    ids2 = ids.clone()
    ids2[:, 8:] = (ids2[:, 8:] + 1) % 97   # the future changed: the past unchanged
    torch.testing.assert_close(nope(ids2)[:, :8], out[:, :8])


def _model_rope_halves(w, num_heads):
    """Our RoPE rotates (2i, 2i+1); Llama's rotates (i, i + d_k/2): the rows of a q/k projection reordered."""
    d_k = w.size(0) // num_heads
    return w.view(num_heads, d_k // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def _model_llama_to_hf(ours):
    """transformers' LlamaForCausalLM with our weights; with qk_norm, Qwen3ForCausalLM (Llama with per-head RMSNorm
    on the queries and keys before RoPE)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    c = ours.model_config()
    config, model = (Qwen3Config, Qwen3ForCausalLM) if c["qk_norm"] else (LlamaConfig, LlamaForCausalLM)
    cfg = config(vocab_size=c["vocab_size"], hidden_size=c["d_model"], intermediate_size=c["d_ff"],
                 num_hidden_layers=c["num_layers"], num_attention_heads=c["num_heads"],
                 num_key_value_heads=c["num_heads"], head_dim=c["d_model"] // c["num_heads"],
                 max_position_embeddings=c["context_length"], rms_norm_eps=1e-5, rope_theta=c["rope_theta"],
                 tie_word_embeddings=c["tie_embeddings"], attention_bias=False, mlp_bias=False)
    hf = model(cfg).eval()
    H = c["num_heads"]
    sd = {"model.embed_tokens.weight": ours.token_embeddings.weight, "model.norm.weight": ours.ln_final.weight,
          "lm_head.weight": ours.lm_head.weight}
    for i, layer in enumerate(ours.layers):
        p = f"model.layers.{i}."
        sd |= {p + "self_attn.q_proj.weight": _model_rope_halves(layer.attn.q_proj.weight, H),
               p + "self_attn.k_proj.weight": _model_rope_halves(layer.attn.k_proj.weight, H),
               p + "self_attn.v_proj.weight": layer.attn.v_proj.weight,
               p + "self_attn.o_proj.weight": layer.attn.output_proj.weight,
               p + "mlp.gate_proj.weight": layer.ffn.w1.weight, p + "mlp.up_proj.weight": layer.ffn.w3.weight,
               p + "mlp.down_proj.weight": layer.ffn.w2.weight, p + "input_layernorm.weight": layer.ln1.weight,
               p + "post_attention_layernorm.weight": layer.ln2.weight}
        if layer.attn.q_norm is not None:   # a gain per head dimension, reordered as the q/k rows are
            sd |= {p + "self_attn.q_norm.weight": _model_rope_halves(layer.attn.q_norm.weight[:, None], 1)[:, 0],
                   p + "self_attn.k_norm.weight": _model_rope_halves(layer.attn.k_norm.weight[:, None], 1)[:, 0]}
    missing, unexpected = hf.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf


@pytest.mark.parametrize("attn_impl, theta", [("scratch", 1e4), ("sdpa", 1e4), ("scratch", 500.0), ("scratch", 5e5)])
def test_model_llama_matches_transformers(attn_impl, theta):
    # logits and loss; at two other RoPE bases than the default too (rope_theta must reach the rotary tables)
    ours = _model_llama(attn_impl=attn_impl, rope_theta=theta)
    with torch.no_grad():  # non-trivial norm gains so a transposed / skipped weight would show
        for layer in ours.layers:
            layer.ln1.weight.uniform_(0.5, 1.5)
            layer.ln2.weight.uniform_(0.5, 1.5)
    hf = _model_llama_to_hf(ours)
    ids = _model_ids(97)
    with torch.no_grad():
        ref = hf(ids).logits
        out = ours(ids)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    targets = torch.roll(ids, -1, 1)
    torch.testing.assert_close(M.lm_loss(ours, ids, targets), F.cross_entropy(ref.view(-1, 97), targets.view(-1)))


def test_model_llama_gradients_match_transformers():
    # the hand-written backwards (RoPE, softmax, cross-entropy) against HF autograd on the same weights
    ours = _model_llama(attn_impl="scratch")
    hf = _model_llama_to_hf(ours)
    ids = _model_ids(97)
    targets = torch.roll(ids, -1, 1)
    M.lm_loss(ours, ids, targets).backward()
    F.cross_entropy(hf(ids).logits.view(-1, 97), targets.view(-1)).backward()
    for i, layer in enumerate(ours.layers):
        ref, tol = hf.model.layers[i].self_attn, dict(rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(_model_rope_halves(layer.attn.q_proj.weight.grad, 4), ref.q_proj.weight.grad, **tol)
        torch.testing.assert_close(_model_rope_halves(layer.attn.k_proj.weight.grad, 4), ref.k_proj.weight.grad, **tol)
        torch.testing.assert_close(layer.attn.v_proj.weight.grad, ref.v_proj.weight.grad, **tol)
    torch.testing.assert_close(ours.token_embeddings.weight.grad, hf.model.embed_tokens.weight.grad,
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tie", [False, True])
def test_model_qk_norm_and_tied_head_match_transformers_qwen3(tie):
    # qk_norm is Qwen3's attention (RMSNorm per head on q and k, before RoPE); tie_embeddings its tied head
    ours = _model_llama(qk_norm=True, tie_embeddings=tie, attn_impl="scratch")
    with torch.no_grad():   # gains off 1, different per dimension: a misplaced or unpermuted gain shows
        for layer in ours.layers:
            layer.attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.attn.k_norm.weight.uniform_(0.5, 1.5)
    hf = _model_llama_to_hf(ours)
    assert type(hf).__name__ == "Qwen3ForCausalLM" and hf.config.tie_word_embeddings == tie
    ids = _model_ids(97)
    with torch.no_grad():
        ref, out = hf(ids).logits, ours(ids)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert not torch.allclose(_model_llama(tie_embeddings=tie, attn_impl="scratch")(ids), out, atol=1e-3)


def test_model_tied_head_is_one_matrix_through_training_counting_and_checkpoints():
    m = _model_llama(tie_embeddings=True)
    assert m.lm_head.weight is m.token_embeddings.weight
    assert m.lm_head.weight.std() < 0.5   # the head's init (the embedding's std-1 init would give huge logits)
    untied = _model_llama()
    n_emb = untied.token_embeddings.weight.numel()
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in untied.parameters()) - n_emb
    assert m.get_num_params() == m.get_num_params(non_embedding=False) == flops.count_params(m.model_config())["total"]
    opt = torch.optim.AdamW(M.param_groups(m, 0.1), lr=1e-2)
    ids = _model_ids(97)
    M.lm_loss(m, ids, torch.roll(ids, -1, 1)).backward()
    opt.step()
    again = M.build_model(m.model_config())
    again.load_state_dict(m.state_dict())
    assert again.lm_head.weight is again.token_embeddings.weight
    torch.testing.assert_close(again(ids), m(ids))


def test_model_relu2_ffn_and_logit_softcap_are_their_formulas():
    relu2 = _model_llama(ffn_type="relu2", d_ff=0)
    ffn = relu2.layers[0].ffn
    assert ffn.w1.weight.shape == (4 * 64, 64) and not hasattr(ffn, "w3")   # d_ff = 4 d_model, no gate
    inp = torch.randn(3, 64)
    torch.testing.assert_close(ffn(inp), F.linear(F.relu(F.linear(inp, ffn.w1.weight)) ** 2, ffn.w2.weight))
    plain, capped = _model_llama(), _model_llama(logit_softcap=2.0)
    capped.load_state_dict(plain.state_dict())
    ids = _model_ids(97)
    with torch.no_grad():
        ref = plain(ids)
        assert ref.abs().max() > 2.0   # the cap binds somewhere
        torch.testing.assert_close(capped(ids), 2.0 * torch.tanh(ref / 2.0))
    with pytest.raises(ValueError, match="logit_softcap"):
        M.TransformerLMConfig(logit_softcap=-1.0)


# ---- the loss


def test_model_cross_entropy_matches_torch():
    logits = (torch.randn(2, 5, 30) * 5).requires_grad_()
    logits_ref = logits.detach().clone().requires_grad_()
    targets = torch.randint(0, 30, (2, 5))
    loss = M.cross_entropy(logits, targets)
    ref = F.cross_entropy(logits_ref.view(-1, 30), targets.view(-1))
    torch.testing.assert_close(loss, ref)
    (loss * 3).backward()
    (ref * 3).backward()
    torch.testing.assert_close(logits.grad, logits_ref.grad)
    # bf16 logits (autocast): accumulated in float32, gradient returned in bf16
    lb = logits_ref.detach().bfloat16().requires_grad_()
    lb_ref = lb.detach().float().requires_grad_()
    loss_b, ref_b = M.cross_entropy(lb, targets), F.cross_entropy(lb_ref.view(-1, 30), targets.view(-1))
    torch.testing.assert_close(loss_b, ref_b)
    loss_b.backward()
    ref_b.backward()
    assert lb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lb.grad.float(), lb_ref.grad, atol=1e-4, rtol=1e-2)
    # float64 logits are accumulated in float64
    l64 = torch.randn(4, 7, dtype=torch.float64) * 3 + 1e4
    t64 = torch.randint(0, 7, (4,))
    torch.testing.assert_close(M.cross_entropy(l64, t64), F.cross_entropy(l64, t64), rtol=1e-12, atol=1e-12)
    huge = torch.tensor([[1e4, 0.0, -1e4]])  # log-sum-exp keeps it finite
    torch.testing.assert_close(M.cross_entropy(huge, torch.tensor([1])), torch.tensor(1e4))
    # num_classes: trailing (padding) columns get no probability and no gradient
    padded = torch.cat([logits_ref.detach(), torch.full((2, 5, 4), 50.0)], -1).requires_grad_()
    torch.testing.assert_close(M.cross_entropy(padded, targets, 30), ref)
    M.cross_entropy(padded, targets, 30).backward()
    assert (padded.grad[..., 30:] == 0).all()


@pytest.mark.parametrize("rows", [1, 4, 13, 60])   # one position a chunk .. all 60 in one
def test_model_linear_cross_entropy_matches_the_head_then_torchs_loss(rows):
    torch.manual_seed(0)
    x = torch.randn(3, 20, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (3, 20))
    x_ref, w_ref = (a.detach().clone().requires_grad_() for a in (x, w))
    loss = M.linear_cross_entropy(x, w, t, rows=rows)
    ref = F.cross_entropy((x_ref @ w_ref.T).view(-1, 50), t.view(-1))
    torch.testing.assert_close(loss, ref)
    (loss * 3).backward()
    (ref * 3).backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad, w_ref.grad)
    # bf16 autocast: bf16 matmuls as the head's, the softmax in float32, the gradients in the inputs' dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_b = M.linear_cross_entropy(x_ref, w_ref, t, rows=rows)
        ref_b = M.cross_entropy(x_ref @ w_ref.T, t)
    assert loss_b.dtype == torch.float32
    torch.testing.assert_close(loss_b, ref_b)
    grads = [torch.autograd.grad(v, (x_ref, w_ref)) for v in (loss_b, ref_b)]
    for a, b in zip(*grads):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=1e-4, rtol=2e-2)
    with torch.no_grad():   # evaluation: the loss alone
        torch.testing.assert_close(M.linear_cross_entropy(x, w, t, rows=rows), ref.detach())
    with pytest.raises(ValueError, match=r"linear_cross_entropy: targets must be in \[0, 50\)"):
        M.linear_cross_entropy(x, w, torch.full_like(t, 50))


@pytest.mark.parametrize("cap", [0.0, 2.0])
def test_model_transformerlm_with_targets_returns_the_loss_of_its_logits(cap):
    # through linear_cross_entropy (with a soft-cap, the head then cross_entropy): the same loss and grads
    torch.manual_seed(0)
    m = M.build_model(dict(arch="llama", vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=2,
                           d_ff=64, tie_embeddings=True, logit_softcap=cap))
    x, y = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    ref = M.cross_entropy(m(x), y)
    ref_grads = torch.autograd.grad(ref, list(m.parameters()))
    loss = m(x, targets=y)
    torch.testing.assert_close(loss, ref)
    for a, b in zip(torch.autograd.grad(loss, list(m.parameters())), ref_grads):
        torch.testing.assert_close(a, b)
    assert train.LossOf(m, "llama", chunked=True)(x, y).item() == loss.item()   # --chunked_loss
    torch.testing.assert_close(train.LossOf(m, "llama")(x, y), ref)


# ---- GPT-2: structure, init, the tanh GELU, vocabulary padding


def test_model_gpt_structure_and_init():
    # N(0, 0.02) weights, zero biases, both residual projections scaled by 1/sqrt(2 n_layer), the head tied to wte
    m = _model_gpt(n_layer=8, n_embd=128)
    assert m.lm_head.weight is m.transformer.wte.weight
    for block in m.transformer.h:
        assert block.attn.c_attn.bias.abs().max() == 0
        for w, std in ((block.attn.c_proj.weight, 0.005), (block.mlp.c_proj.weight, 0.005),   # 0.02 / sqrt(2 * 8)
                       (block.attn.c_attn.weight, 0.02), (block.mlp.c_fc.weight, 0.02)):
            assert abs(w.std().item() / std - 1) < 0.05
    logits, loss = m(_model_ids(97))
    assert logits.shape == (2, 32, 97) and loss is None


def test_model_gpt_mlp_is_the_tanh_gelu_of_gpt2():
    # "gelu_new" (tanh) by its formula, at pre-activations ~1-4 where it differs from the erf GELU by up to ~1e-3
    mlp = M.MLP(M.GPTConfig(n_embd=16, n_head=2))
    with torch.no_grad():
        mlp.c_fc.weight.normal_(0, 1.0)
    x = torch.randn(4, 16, dtype=torch.float64)
    mlp = mlp.double()
    h = F.linear(x, mlp.c_fc.weight, mlp.c_fc.bias)
    gelu_new = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    torch.testing.assert_close(mlp(x), F.linear(gelu_new, mlp.c_proj.weight, mlp.c_proj.bias), rtol=1e-10, atol=1e-10)


def test_model_vocab_padding_changes_neither_loss_nor_sampling():
    plain = _model_gpt()
    padded = _model_gpt(pad_vocab_to_multiple_of=64)
    assert padded.transformer.wte.weight.shape[0] == 128 and padded.vocab_size == 97
    with torch.no_grad():
        sd = plain.state_dict()
        for k, v in padded.state_dict().items():
            if k in ("transformer.wte.weight", "lm_head.weight"):
                v[:97].copy_(sd[k])
                v[97:].fill_(5.0)  # padded rows would dominate the logits if they were not removed
            else:
                v.copy_(sd[k])
    ids = _model_ids(97)
    targets = torch.roll(ids, -1, 1)
    (lp, loss_p), (l0, loss_0) = padded(ids, targets), plain(ids, targets)
    assert lp.shape == (2, 32, 97)
    torch.testing.assert_close(lp, l0)
    torch.testing.assert_close(loss_p, loss_0)
    loss_p.backward()
    loss_0.backward()
    torch.testing.assert_close(padded.transformer.wte.weight.grad[:97], plain.transformer.wte.weight.grad)
    assert (padded.transformer.wte.weight.grad[97:] == 0).all()
    with torch.no_grad():
        cache = padded.init_kv_cache(2)
        step = padded.forward_with_cache(ids[:, :5], cache)
    assert step.shape[-1] == 97
    gen = torch.Generator().manual_seed(0)
    draws_p = torch.multinomial(torch.softmax(step[:, -1], -1), 20, replacement=True, generator=gen)
    gen = torch.Generator().manual_seed(0)
    draws_0 = torch.multinomial(torch.softmax(l0[:, 4].detach(), -1), 20, replacement=True, generator=gen)
    assert torch.equal(draws_p, draws_0) and draws_p.max() < 97


# ---- GPT.from_pretrained: OpenAI's weights from a local folder or the hub, and the files it refuses


_MODEL_HF_SHAPE = dict(vocab_size=97, n_positions=32, n_embd=32, n_layer=1, n_head=2)


def _model_hf_gpt2(seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=97, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # default init zeroes biases and sets LayerNorm to 1/0: randomise so they are tested
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model_bin"])
def test_model_gpt_from_pretrained_matches_transformers(tmp_path, safe):
    hf = _model_hf_gpt2()
    if safe:
        hf.save_pretrained(tmp_path)
    else:  # transformers 5 only writes safetensors: write the legacy pickle format (older hub repos) by hand
        hf.config.save_pretrained(tmp_path)
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert (tmp_path / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
    ours = M.GPT.from_pretrained(str(tmp_path)).eval()
    assert ours.config.n_layer == 2 and ours.context_length == 32 and ours.vocab_size == 97
    ids = _model_ids(97)
    targets = torch.roll(ids, -1, 1)
    with torch.no_grad():
        ref = hf(ids, labels=None)
        logits, loss = ours(ids, targets)
    torch.testing.assert_close(logits, ref.logits, rtol=1e-5, atol=1e-4)
    ref_loss = F.cross_entropy(ref.logits.reshape(-1, 97), targets.reshape(-1))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    # HF's own loss (it shifts labels internally) equals ours on the shifted targets
    with torch.no_grad():
        hf_loss = hf(ids, labels=ids).loss
        ours_shift = M.cross_entropy(logits[:, :-1], ids[:, 1:])
    torch.testing.assert_close(ours_shift, hf_loss, rtol=1e-5, atol=1e-5)
    padded = M.GPT.from_pretrained(str(tmp_path), pad_vocab_to_multiple_of=64).eval()
    assert padded.transformer.wte.weight.shape[0] == 128
    assert not padded.transformer.wte.weight[padded.vocab_size:].any()   # the padded rows: zero, not random init
    with torch.no_grad():
        torch.testing.assert_close(padded(ids, targets)[0], logits)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model_bin"])
def test_model_from_pretrained_reads_openais_layout_unprefixed_keys_and_mask_buffers(tmp_path, safe):
    # GPT2Model keys (no "transformer." prefix, no lm_head) and the attn.bias / attn.masked_bias buffers (skipped)
    hf = _model_hf_gpt2()
    hf.config.save_pretrained(tmp_path)
    sd = {k[len("transformer."):]: v.clone().contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for i in range(hf.config.n_layer):
        sd[f"h.{i}.attn.bias"] = torch.tril(torch.ones(32, 32, dtype=torch.bool)).view(1, 1, 32, 32)
        sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    if safe:
        from safetensors.torch import save_file
        save_file(sd, tmp_path / "model.safetensors")
    else:
        torch.save(sd, tmp_path / "pytorch_model.bin")
    ours = M.GPT.from_pretrained(str(tmp_path)).eval()
    ids = _model_ids(97)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], hf(ids).logits, rtol=1e-5, atol=1e-4)


def test_model_from_pretrained_takes_the_block_size_from_n_positions_before_n_ctx(tmp_path):
    # the position table has n_positions rows (older configs wrote n_ctx beside it); n_ctx alone is taken
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(**_MODEL_HF_SHAPE)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, n_ctx=1024)))
    assert M.GPT.from_pretrained(str(tmp_path)).config.block_size == 32
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in dict(cfg, n_ctx=32).items()
                                                      if k != "n_positions"}))
    assert M.GPT.from_pretrained(str(tmp_path)).config.block_size == 32


def test_model_from_pretrained_hub_names_download_then_load(tmp_path, monkeypatch):
    # hub downloads faked by a local folder: the names asked for, the .bin fallback, offline the cache, the logits
    hub = pytest.importorskip("huggingface_hub")
    hf = _model_hf_gpt2()
    hf.save_pretrained(tmp_path / "safe")
    hf.config.save_pretrained(tmp_path / "pickle")
    torch.save(hf.state_dict(), tmp_path / "pickle" / "pytorch_model.bin")
    ids = _model_ids(97)
    with torch.no_grad():
        ref = hf(ids).logits
    for name, folder, online in [("gpt2-medium", "safe", True), ("gpt2-xl", "pickle", True), ("gpt2", "safe", False)]:
        calls = []
        monkeypatch.setattr(M, "hub_reachable", lambda online=online: (online, ""))

        def fake_download(repo, filename, local_files_only=False):  # offline: huggingface_hub's cache only
            assert local_files_only is not online
            calls.append((repo, filename))
            path = tmp_path / folder / filename
            if not path.is_file():
                raise FileNotFoundError(f"404 {repo}/{filename}")
            return str(path)
        monkeypatch.setattr(hub, "hf_hub_download", fake_download)
        ours = M.GPT.from_pretrained(name).eval()
        want = [(f"openai-community/{name}", "config.json"), (f"openai-community/{name}", "model.safetensors")]
        assert calls == want + ([] if folder == "safe" else [(f"openai-community/{name}", "pytorch_model.bin")])
        with torch.no_grad():
            torch.testing.assert_close(ours(ids)[0], ref, rtol=1e-5, atol=1e-4)


def test_model_hub_probe(monkeypatch):
    # nothing listens on port 443 here: unreachable; behind a proxy the probe is skipped
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1")
    try:
        socket.create_connection(("127.0.0.1", 443), timeout=1).close()
        pytest.skip("something listens on 127.0.0.1:443 here")
    except OSError:
        pass
    assert M.hub_reachable()[0] is False
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert M.hub_reachable()[0] is True


@pytest.mark.parametrize("reachable", [True, False], ids=["hub-error", "hub-unreachable"])
def test_model_from_pretrained_hub_failure_is_one_line(monkeypatch, reachable):
    # one line naming the repo and why: the hub's first error line, or that the hub is unreachable
    hub = pytest.importorskip("huggingface_hub")

    def offline(repo, filename, **kw):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")
    monkeypatch.setattr(hub, "hf_hub_download", offline)
    monkeypatch.setattr(M, "hub_reachable", lambda: (reachable, ""))
    message = _raises(M.GPT.from_pretrained, "gpt2")
    _one_line_naming(message, "GPT.from_pretrained: ", "openai-community/gpt2",
                     "couldn't connect" if reachable else "unreachable")
    assert ("couldn't connect" in message) == reachable


def test_model_from_pretrained_refuses_an_unknown_name_and_a_folder_without_weights(tmp_path):
    # an unknown name is named, with the names that are known
    _one_line_naming(_raises(M.GPT.from_pretrained, "gpt3-huge"), "GPT.from_pretrained: ", "'gpt3-huge'",
                     "gpt2-xl")
    (tmp_path / "config.json").write_text("{}")
    _one_line_naming(_raises(M.GPT.from_pretrained, str(tmp_path)), f"GPT.from_pretrained: {tmp_path}",
                     "model.safetensors", "pytorch_model.bin")


@pytest.mark.parametrize("key, value", [("layer_norm_epsilon", 1e-2), ("activation_function", "relu"),
                                        ("activation_function", "gelu"), ("scale_attn_weights", False),
                                        ("scale_attn_by_inverse_layer_idx", True), ("n_inner", 48),
                                        ("model_type", "gpt_bigcode")])
def test_model_from_pretrained_refuses_gpt2_settings_it_does_not_implement(tmp_path, key, value):
    # what transformers would load with other logits than GPT-2's: refused, naming the file, setting and value
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(**_MODEL_HF_SHAPE)).save_pretrained(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), key: value}))
    _one_line_naming(_raises(M.GPT.from_pretrained, str(tmp_path)), f"GPT.from_pretrained: {config}: ", key,
                     repr(value))


def test_model_from_pretrained_loads_openais_values_of_those_settings(tmp_path):
    # GPT-2's tanh GELU under either of its names, n_inner unset or 4 * n_embd: loaded, with transformers' logits
    from transformers import GPT2Config, GPT2LMHeadModel
    ids = _model_ids(97, (1, 8))
    for i, kw in enumerate(({}, dict(activation_function="gelu_pytorch_tanh", n_inner=128))):
        hf = GPT2LMHeadModel(GPT2Config(**_MODEL_HF_SHAPE, **kw)).eval()
        hf.save_pretrained(tmp_path / str(i))
        with torch.no_grad():
            torch.testing.assert_close(M.GPT.from_pretrained(str(tmp_path / str(i)))(ids)[0], hf(ids).logits,
                                       rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("file_vocab", [101, 140])
def test_model_from_pretrained_refuses_an_embedding_of_another_size_than_its_config(tmp_path, file_vocab):
    # a wte of another size than config.json's 120 tokens: named with the config's shape, then the file's
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(**{**_MODEL_HF_SHAPE, "vocab_size": file_vocab, "n_positions": 24})).save_pretrained(
        tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, vocab_size=120)))
    message = _raises(M.GPT.from_pretrained, str(tmp_path), pad_vocab_to_multiple_of=64)
    _one_line_naming(message, "GPT.from_pretrained: transformer.wte.weight")
    _named_in_order(message, "(120, 32)", f"({file_vocab}, 32)")


def test_model_from_pretrained_refuses_an_untied_head(tmp_path):
    # GPT ties lm_head to wte; a file whose head differs (tie_word_embeddings false) would load with wrong logits
    from transformers import GPT2Config, GPT2LMHeadModel
    hf = GPT2LMHeadModel(GPT2Config(**_MODEL_HF_SHAPE, tie_word_embeddings=False))
    assert not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)
    hf.save_pretrained(tmp_path)
    _one_line_naming(_raises(M.GPT.from_pretrained, str(tmp_path)), f"GPT.from_pretrained: {tmp_path}",
                     "lm_head", "wte")


def test_model_from_pretrained_refuses_missing_weights_and_unknown_overrides(tmp_path):
    # a file lacking a weight would leave it at its random init: refused, naming it; so is an unknown override
    hf = _model_hf_gpt2()
    hf.config.save_pretrained(tmp_path)
    torch.save({k: v for k, v in hf.state_dict().items() if k != "transformer.h.1.mlp.c_fc.bias"},
               tmp_path / "pytorch_model.bin")
    _one_line_naming(_raises(M.GPT.from_pretrained, str(tmp_path)), f"GPT.from_pretrained: {tmp_path}",
                     "'transformer.h.1.mlp.c_fc.bias'")
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert M.GPT.from_pretrained(str(tmp_path), pad_vocab_to_multiple_of=64).config.pad_vocab_to_multiple_of == 64
    _one_line_naming(_raises(M.GPT.from_pretrained, str(tmp_path), pad_vocab=64), "GPT.from_pretrained: ",
                     "'pad_vocab'")


# ---- both models: parameter counts, the loss at init, learning, the KV cache, what they refuse as input


def test_model_parameter_counts():
    with torch.device("meta"):
        cs336 = M.TransformerLM(vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16,
                                d_ff=1344, rope_theta=10000.0)
        gpt2 = M.GPT(M.GPTConfig())
        gpt2_padded = M.GPT(M.GPTConfig(pad_vocab_to_multiple_of=64))
    # per layer 4*512^2 (attention) + 3*512*1344 (SwiGLU) + 2*512 (norms); + ln_final + lm_head
    assert cs336.get_num_params() == 4 * (4 * 512 * 512 + 3 * 512 * 1344 + 2 * 512) + 512 + 512 * 10000 == 17_576_448
    assert cs336.get_num_params(non_embedding=False) == 17_576_448 + 10000 * 512
    assert gpt2.get_num_params(non_embedding=False) == 124_439_808
    assert gpt2.get_num_params() == 124_439_808 - 1024 * 768
    assert gpt2_padded.get_num_params(non_embedding=False) == 124_439_808 + 47 * 768


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_model_random_init_loss_is_ln_vocab(arch):
    vocab = 50257 if arch == "gpt2" else 10000
    m = _model_gpt(vocab_size=vocab, n_embd=64) if arch == "gpt2" else _model_llama(vocab_size=vocab)
    ids = _model_ids(vocab, (4, 32))
    targets = _model_ids(vocab, (4, 32), seed=2)
    with torch.no_grad():
        loss = M.lm_loss(m, ids, targets).item()
    assert abs(loss - math.log(vocab)) < 0.1, (loss, math.log(vocab))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_model_overfits_one_batch(arch):
    kw = dict(vocab_size=64, d_model=32, num_heads=2, d_ff=64, context_length=16)
    m = _model_llama(**kw) if arch == "llama" else _model_gpt(vocab_size=64, n_embd=32, n_head=2, block_size=16)
    ids = _model_ids(64, (4, 17), seed=3)
    x, y = ids[:, :-1], ids[:, 1:]
    opt = torch.optim.AdamW(M.param_groups(m, 0.0), lr=2e-2)
    for _ in range(100):
        loss = M.lm_loss(m, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, loss.item()


@pytest.mark.parametrize("attn_impl", ["scratch", "sdpa"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_model_kv_cache_equals_uncached(arch, attn_impl):
    m = (_model_llama if arch == "llama" else _model_gpt)(attn_impl=attn_impl).eval()
    ids = _model_ids(97, (2, 32))
    with torch.no_grad():
        full = M.logits(m, ids)
        cache = m.init_kv_cache(2)
        steps = [m.forward_with_cache(ids[:, :7], cache)]  # prompt
        steps += [m.forward_with_cache(ids[:, t:t + 1], cache) for t in range(7, 20)]  # one token at a time
        steps.append(m.forward_with_cache(ids[:, 20:32], cache))  # a chunk attending to cache + itself
    assert cache.pos == 32
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_model_kv_cache_refuses_what_it_cannot_hold(arch):
    # more tokens than the cache holds (full, or sized below the context); past the context: the position check
    m = _model_llama() if arch == "llama" else _model_gpt()
    who = f"{type(m).__name__}.forward_with_cache: "
    with torch.no_grad():
        full = m.init_kv_cache(1)
        m.forward_with_cache(_model_ids(97, (1, 32)), full)
        _one_line_naming(_raises(m.forward_with_cache, _model_ids(97, (1, 1)), full), who, "KV cache", "32")
        small = m.init_kv_cache(1, max_seq_len=4)
        message = _raises(m.forward_with_cache, _model_ids(97, (1, 5)), small)
        _one_line_naming(message, who, "KV cache")
        _named_in_order(message, "4", "5")   # the positions it holds, then those asked for
        long = m.init_kv_cache(1, max_seq_len=40)
        m.forward_with_cache(_model_ids(97, (1, 32)), long)
        message = _raises(m.forward_with_cache, _model_ids(97, (1, 1)), long)
        _one_line_naming(message, who)
        _named_in_order(message, "33", "32")   # the position asked for, then the context


_MODEL_REFUSALS = {   # case: (the call, the line's start, what it names in this order: the value at fault first)
    "cross-entropy-target-past-the-classes": (lambda: M.cross_entropy(torch.randn(2, 5), torch.tensor([0, 5])),
                                              "cross_entropy: targets", ["5"]),
    "cross-entropy-target-in-the-padding": (lambda: M.cross_entropy(torch.randn(2, 34), torch.tensor([0, 30]), 30),
                                            "cross_entropy: targets", ["30"]),
    **{f"{arch}-{what}": (lambda make=make, ids=ids: make()(ids), f"{who}: ", named)
       for arch, make, who in (("llama", _model_llama, "TransformerLM"), ("gpt2", _model_gpt, "GPT"))
       for what, ids, named in (("longer-than-the-context", _model_ids(97, (1, 33)), ["33", "32"]),
                                ("id-past-the-vocabulary", torch.tensor([[1, 97]]), ["97"]),
                                ("negative-id", torch.tensor([[-1, 3]]), ["97", "-1"]))},
    "heads-do-not-divide-d_model": (lambda: M.TransformerLM(**{**_MODEL_LLAMA, "d_model": 65}), "d_model",
                                    ["65", "num_heads", "4"]),
    "odd-rope-d_k": (lambda: M.RotaryPositionalEmbedding(10000.0, 7, 16), "RotaryPositionalEmbedding: d_k", ["7"]),
    "odd-head-size": (lambda: M.TransformerLM(**{**_MODEL_LLAMA, "d_model": 60}), "RotaryPositionalEmbedding: d_k",
                      ["15"]),   # (RoPE rotates pairs: d_model 60 over 4 heads is a head size of 15)
    "ffn_type": (lambda: M.TransformerLM(**_MODEL_LLAMA, ffn_type="relu"), "ffn_type", ["'relu'"]),
    "attn_impl": (lambda: M.TransformerLM(**_MODEL_LLAMA, attn_impl="flash"), "attn_impl", ["'flash'"]),
    "heads-do-not-divide-n_embd": (lambda: M.GPT(M.GPTConfig(**{**_MODEL_GPT, "n_embd": 65})), "GPT: n_embd",
                                   ["65", "n_head", "4"]),
    **{f"build_model-{i}": (lambda cfg=cfg: M.build_model(cfg), "build_model: ", named)
       for i, (cfg, named) in enumerate([
        (dict(arch="gpt2", n_embd=0, n_head=0), ["n_head"]), (dict(arch="gpt2", vocab_size=-1), ["vocab_size", "-1"]),
        (dict(arch="gpt2", vocab_size="50257"), ["vocab_size", "'50257'"]),
        (dict(arch="llama", vocab_size=10, context_length=8, d_model=8, num_layers=1, num_heads=0, d_ff=16),
         ["num_heads"]),
        (dict(arch="llama", vocab_size=-1, context_length=8, d_model=8, num_layers=1, num_heads=2, d_ff=16),
         ["vocab_size", "-1"]),
        (dict(arch="mamba"), ["'mamba'"]), (dict(arch="gpt2", d_model=3), ["'d_model'"]), (None, ["NoneType"]),
        (["arch", "gpt2"], ["list"])])},
}


@pytest.mark.parametrize("case", list(_MODEL_REFUSALS))
def test_model_refuses_what_it_cannot_build_or_run_naming_it(case):
    # a target or id outside the vocabulary, a sequence past the context, a bad shape or config: one line naming it
    call, prefix, named = _MODEL_REFUSALS[case]
    message = _raises(call)
    _one_line_naming(message, prefix, *named)
    _named_in_order(message, *named)


# ---- the common surface: build_model, param_groups, devices, checkpoints and the wrappers around a model


def test_model_param_groups_decay_matrices_only():
    for m in (_model_llama(), _model_gpt()):
        decay, no_decay = M.param_groups(m, 0.1)
        assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
        assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
        ids = {id(p) for p in decay["params"]} | {id(p) for p in no_decay["params"]}
        assert ids == {id(p) for p in m.parameters()}
        assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))


def test_model_resolve_device_auto_takes_a_gpu_where_there_is_one_and_cuda_n_a_visible_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert M.resolve_device("auto") == torch.device("cuda")
    assert M.resolve_device("cuda:1") == torch.device("cuda", 1)
    for name in ("cuda:2", "cuda:7"):   # GPUs are numbered 0..count-1; the error says how many are visible
        _one_line_naming(_raises(M.resolve_device, name), f"--device {name}", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert M.resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("visible, local_rank, index", [(8, 3, 3), (4, 3, 3), (1, 3, 0), (2, 0, 0), (2, 1, 1)])
def test_model_rank_gpu_maps_local_rank_to_a_visible_gpu(monkeypatch, visible, local_rank, index):
    # torchrun's LOCAL_RANK is the GPU's index, unless the launcher shows each process only its own GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert M.rank_gpu(local_rank) == torch.device("cuda", index)


@pytest.mark.parametrize("local_rank", [4, 5])
def test_model_rank_gpu_refuses_a_local_rank_past_the_visible_gpus(monkeypatch, local_rank):
    # GPUs are numbered 0..count-1: LOCAL_RANK 4 of 4 visible GPUs has none; the error says how to launch instead
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    _one_line_naming(_raises(M.rank_gpu, local_rank), f"LOCAL_RANK {local_rank}", "4", "--nproc_per_node")


def test_model_checkpoint_round_trip_and_wrappers(tmp_path):
    # DDP(torch.compile(m)) saves module._orig_mod.*, torch.compile(DDP(m)) _orig_mod.module.*: either loads
    for m in (_model_llama(remove_rope=True, attn_impl="sdpa"), _model_gpt(pad_vocab_to_multiple_of=64)):
        cfg = m.model_config()
        assert cfg["arch"] in ("llama", "gpt2") and json.loads(json.dumps(cfg)) == cfg
        ids = _model_ids(97)
        for prefix in ("_orig_mod.module.", "module._orig_mod.", "_orig_mod._orig_mod."):
            ckpt = {"model": {prefix + k: v for k, v in m.state_dict().items()}, "model_config": cfg}
            torch.save(ckpt, tmp_path / "ckpt.pt")
            loaded = M.model_from_checkpoint(torch.load(tmp_path / "ckpt.pt", weights_only=True))
            torch.testing.assert_close(M.lm_loss(loaded, ids, ids), M.lm_loss(m, ids, ids))
            assert M.unwrapped_state_dict(ckpt["model"]).keys() == m.state_dict().keys()

        class Wrapper(torch.nn.Module):  # stands in for DDP (.module) / torch.compile (._orig_mod)
            def __init__(self, inner):
                super().__init__()
                self.module = inner

            def forward(self, *a):
                return self.module(*a)

        torch.testing.assert_close(M.lm_loss(Wrapper(m), ids, ids, arch=cfg["arch"]), M.lm_loss(m, ids, ids))
        torch.testing.assert_close(M.lm_loss(Wrapper(m), ids, ids), M.lm_loss(m, ids, ids))
        assert len(M.param_groups(Wrapper(m), 0.1)[0]["params"]) == len(M.param_groups(m, 0.1)[0]["params"])


def test_model_checkpoint_that_does_not_fit_its_model_config_is_refused():
    # another architecture's or shape's weights: named, the checkpoint's value first; a dict that is no checkpoint
    llama, gpt = _model_llama(), _model_gpt()
    for weights, config in ((gpt, llama), (llama, gpt)):
        message = _raises(M.model_from_checkpoint, {"model": weights.state_dict(),
                                                          "model_config": config.model_config()})
        _one_line_naming(message, "state dict ")
        _named_in_order(message, weights.model_config()["arch"], config.model_config()["arch"])
    wide = _model_llama(d_ff=128)
    message = _raises(M.model_from_checkpoint, {"model": wide.state_dict(), "model_config": llama.model_config()})
    _one_line_naming(message, "state dict layers.0.ffn.w1.weight")
    _named_in_order(message, "(128, 64)", "(96, 64)")
    _one_line_naming(_raises(M.model_from_checkpoint, {"model": llama.state_dict()}), "model_from_checkpoint: ",
                     "'model_config'")


def test_model_sharded_checkpoint_reads_its_folder_and_runs_nothing_in_it(tmp_path):
    # an FSDP ckpt.pt names its shards' folder: read_checkpoint gives the whole weights; a .metadata that would call
    # a function or holds anything but tensors, a folder gone, a file object: each one line, nothing run
    import pickle
    import torch.distributed.checkpoint as dcp
    m = _model_gpt()

    def write(name, extra=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": m.state_dict(), **(extra or {})}, checkpoint_id=tmp_path / name)
        torch.save({"shards": name, "model_config": m.model_config(), "iteration": 3}, tmp_path / f"{name}.pt")
    write("good")
    ckpt = M.read_checkpoint(tmp_path / "good.pt")
    assert ckpt["iteration"] == 3 and all(torch.equal(ckpt["model"][k], v) for k, v in m.state_dict().items())
    write("bytes", {"note": "a pickled object"})
    write("evil")

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)
    (tmp_path / "evil" / ".metadata").write_bytes(pickle.dumps(Evil()))
    write("gone")
    shutil.rmtree(tmp_path / "gone")
    for name, named in (("bytes", "tensors"), ("evil", "system"), ("gone", "missing")):
        _one_line_naming(_raises(M.read_checkpoint, tmp_path / f"{name}.pt"), str(tmp_path / name), named)
    with open(tmp_path / "good.pt", "rb") as f:
        _one_line_naming(_raises(M.read_checkpoint, f), str(tmp_path / "good.pt"), "path")
    assert not (tmp_path / "ran").exists()


# ==== train.py: optimizer, schedule, clipping, data loading, checkpoints, evaluation, the run, the command line


def _train_write_tokens(path, ids, vocab_size, eot_id=0, tokenizer=None):
    ids = np.asarray(ids, dtype=np.uint16)
    ids.tofile(path)
    Path(str(path) + ".json").write_text(json.dumps(dict(
        format="tokens-v1", dtype="uint16", vocab_size=vocab_size, num_tokens=len(ids), num_docs=None,
        tokenizer=tokenizer, tokenizer_fingerprint=tokenizer and bpe.tokenizer_fingerprint(tokenizer), eot_id=eot_id)))


def _train_docs(n_tokens, seed):
    """eot (0) before every document; a document counts up in steps of 3 from a random start."""
    r = np.random.default_rng(seed)
    out = []
    while len(out) < n_tokens:
        a, n = r.integers(1, 64), r.integers(5, 40)
        out += [0] + [(a + 3 * i) % 63 + 1 for i in range(n)]
    return out[:n_tokens]


def _train_token_folder(d, vocab_size=64, tokenizer=None):
    """Folder d made, with 30,000 training and 3,000 validation tokens of _train_docs (ids < 64) in it, declared as
    vocab_size ids of tokenizer (None: no tokenizer named; "gpt2": bits/byte, samples and tasks work)."""
    d.mkdir()
    _train_write_tokens(d / "train.bin", _train_docs(30000, 0), vocab_size, tokenizer=tokenizer)
    _train_write_tokens(d / "val.bin", _train_docs(3000, 1), vocab_size, tokenizer=tokenizer)
    return d


@pytest.fixture
def _train_data(tmp_path):
    """A data folder of 64-id token files (no tokenizer named): 30,000 training and 3,000 validation tokens."""
    return _train_token_folder(tmp_path / "data")


def _train_byte_data(tmp_path):
    """Token files of random lowercase words under a byte-level bpe.py tokenizer (257 ids, eot 256) in data/tok."""
    d = tmp_path / "data"
    d.mkdir()
    tok = bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [], [bpe.EOT])
    tok.save_dir(d / "tok")
    eot = tok.eot_id  # 256

    def docs(n, seed):
        r = np.random.default_rng(seed)
        out = []
        while len(out) < n:
            out += [eot] + r.integers(97, 123, size=r.integers(3, 20)).tolist()
        return out[:n]
    _train_write_tokens(d / "train.bin", docs(20000, 0), 257, eot_id=eot, tokenizer=str(d / "tok"))
    _train_write_tokens(d / "val.bin", docs(3000, 1), 257, eot_id=eot, tokenizer=str(d / "tok"))
    return d, tok


def _train_cfg(data_dir, out_dir, **kw):
    """train.train()'s settings for a tiny run: a 2-layer Llama of width 32 on CPU in float32, 6 steps of 4 x 16
    tokens, no time budget, evaluated at the start and the end only, nothing printed per step; kw overrides."""
    cfg = dict(train.DEFAULTS, data_dir=str(data_dir), out_dir=str(out_dir), prepare_data=False, resume=False,
               vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=2, batch_size=4,
               max_iters=6, warmup_iters=2, learning_rate=3e-3, eval_interval=1000, eval_iters=2, log_interval=1000,
               num_samples=0, compile=False, device="cpu", dtype="float32", seed=0, time_budget="")
    cfg.update(kw)
    return cfg


def _train_main_args(data, out):
    """train.main()'s command line for a tiny 2-step run on data (a 1-layer Llama; the defaults' warmup)."""
    return [f"--data_dir={data}", f"--out_dir={out}", "--vocab_size=64", "--context_length=16", "--d_model=32",
            "--num_layers=1", "--num_heads=2", "--batch_size=4", "--max_iters=2", "--time_budget=", "--num_samples=0",
            "--device=cpu", "--compile=false"]


def _train_quiet(*a, **k):
    pass


def _train_weights(path):
    return torch.load(path, weights_only=True)["model"]


def _train_records(out_dir, kind):
    return [r for r in map(json.loads, (out_dir / "log.jsonl").read_text().splitlines()) if r["type"] == kind]


def _train_next_commands(printed):
    """The commands a run's summary suggests under "next:", in order (each line's text before its # comment)."""
    return [line.split("  # ")[0].strip() for line in printed.split("\nnext:\n")[-1].splitlines() if line.strip()]


def _train_two_steps(data_dir, out_dir):
    """A finished run of 2 steps in out_dir: the checkpoint a resume starts from."""
    train.train(_train_cfg(data_dir, out_dir, max_iters=2), log=_train_quiet)
    assert torch.load(out_dir / "ckpt.pt", weights_only=True)["iteration"] == 2


def _train_fake_clock():
    t = [0.0]

    def clock():   # every call is one second later: each optimizer step takes exactly 1 s
        t[0] += 1.0
        return t[0]
    return clock


def _train_slow_first_step_clock():
    """A fake clock: the first optimizer step takes 61 s (a compilation), every other step 1 s."""
    t, calls = [0.0], [0]

    def clock():
        calls[0] += 1
        t[0] += 61.0 if calls[0] == 3 else 1.0
        return t[0]
    return clock


def _train_crash_at(n):
    """An on_step hook that kills the run after optimizer step n (a crash, as far as the checkpoints can tell)."""
    def crash(step):
        if step == n:
            raise RuntimeError("simulated crash")
    return crash


# ---- the optimizer, the schedule and clipping, against torch's and the formulas


@pytest.mark.parametrize("eps, grad_scale", [(1e-8, 1.0), (1e-6, 1e-6)])  # gradients ~eps: where eps enters shows
def test_train_adamw_matches_torch_over_many_steps(eps, grad_scale):
    import copy
    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(5, 7)), torch.nn.Parameter(torch.randn(7))]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    mk = lambda ps: [{"params": [ps[0]], "weight_decay": 0.1}, {"params": [ps[1]], "weight_decay": 0.0}]
    opt_ref = torch.optim.AdamW(mk(ref), lr=1e-2, betas=(0.9, 0.95), eps=eps, foreach=False)
    opt_ours = train.AdamW(mk(ours), lr=1e-2, betas=(0.9, 0.95), eps=eps)
    for step in range(100):
        lr = train.get_lr_cosine_schedule(step, 1e-2, 1e-3, 10, 80)   # a schedule writing group["lr"]
        for opt in (opt_ref, opt_ours):
            for g in opt.param_groups:
                g["lr"] = lr
        g = torch.Generator().manual_seed(step)
        grads = [grad_scale * torch.randn(p.shape, generator=g) for p in ref]
        for ps, opt in ((ref, opt_ref), (ours, opt_ours)):
            for p, gr in zip(ps, grads):
                p.grad = gr.clone()
            opt.step()
    for a, b in zip(ref, ours):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # state dicts interchange with torch's (same names): a new AdamW of ours loads torch's and continues identically
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    opt_fresh = train.AdamW(mk(fresh), lr=1e-2, betas=(0.9, 0.95), eps=eps)
    opt_fresh.load_state_dict(copy.deepcopy(opt_ref.state_dict()))   # (loaded tensors would be torch's own)
    assert set(opt_fresh.state[fresh[0]]) == {"step", "exp_avg", "exp_avg_sq"}
    for ps, opt in ((ref, opt_ref), (fresh, opt_fresh)):
        for p in ps:
            p.grad = grad_scale * torch.ones_like(p)
        opt.step()
    for a, b in zip(ref, fresh):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_train_adamw_weight_decay_only_step():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.zeros(3)
    train.AdamW([p], lr=0.1, weight_decay=0.5).step()
    torch.testing.assert_close(p.detach(), torch.full((3,), 1 - 0.1 * 0.5))   # decoupled: theta *= 1 - lr*wd


@pytest.mark.parametrize("shape", [(12, 40), (40, 12), (16, 16)])
def test_train_orthogonalise_keeps_the_singular_vectors_and_brings_the_values_near_one(shape):
    # a polynomial in G G^T times G: G's singular vectors kept (U^T X V diagonal), singular values spread over
    # 0.1 .. 10 moved into Muon's band (about 0.7 to 1.2; 5 steps lift a value by at most ~3.4^5 ~ 500)
    torch.manual_seed(0)
    U, _, Vh = torch.linalg.svd(torch.randn(shape), full_matrices=False)
    S = torch.logspace(-1, 1, min(shape))
    G = U @ torch.diag(S) @ Vh
    D = U.mT @ train.orthogonalise(G) @ Vh.mT
    off = D - torch.diag(torch.diagonal(D))
    assert off.abs().max() < 1e-4
    assert 0.6 < torch.diagonal(D).min() and torch.diagonal(D).max() < 1.25


def test_train_orthogonalise_takes_a_stack_matrix_by_matrix():
    torch.manual_seed(0)
    G = torch.randn(3, 12, 40) * torch.tensor([0.1, 1.0, 10.0]).view(3, 1, 1)   # norms apart: each is its own
    for g in (G, G.mT):
        torch.testing.assert_close(train.orthogonalise(g), torch.stack([train.orthogonalise(m) for m in g]),
                                   rtol=0, atol=1e-5)
    # in bfloat16 (a run that autocasts to it): the same polynomial to bf16's precision, returned in G's dtype
    half = train.orthogonalise(G, dtype=torch.bfloat16)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, train.orthogonalise(G), rtol=0, atol=0.06)   # bf16: 8 bits of mantissa
    raw = M.build_model(dict(arch="llama", vocab_size=64, context_length=8, d_model=16, num_layers=1, num_heads=2,
                             d_ff=32))
    c = train.Settings(dict(train.DEFAULTS, optimizer="muon"))
    assert [train.make_optimizer(raw, c, False, bf16=b).ns_dtype for b in (False, True)] == [torch.float32,
                                                                                             torch.bfloat16]


def _muon_reference(W, grads, lr, wd, mu=0.95):
    """Muon written out plainly for one matrix: Nesterov momentum, 5 quintic Newton-Schulz steps on the short side
    (the coefficients of Jordan et al. 2024), the update scaled to AdamW's RMS, 0.2 sqrt(max(rows, cols))."""
    W, buf = W.clone(), torch.zeros_like(W)
    for g in grads:
        buf = mu * buf + (1 - mu) * g
        u = (1 - mu) * g + mu * buf
        X = u / u.norm()
        if X.shape[0] > X.shape[1]:
            X = X.T
        for _ in range(5):
            A = X @ X.T
            X = 3.4445 * X + (-4.7750 * A + 2.0315 * A @ A) @ X
        if u.shape[0] > u.shape[1]:
            X = X.T
        W = W * (1 - lr * wd) - lr * 0.2 * max(W.shape) ** 0.5 * X
    return W


def test_train_muon_matches_the_plain_reference_and_torchs_adamw_step_for_step():
    # the muon=True group follows _muon_reference matrix by matrix (two of one shape, orthogonalised as one stack,
    # and a tall one); the other groups are torch.optim.AdamW's, on the same gradients
    torch.manual_seed(0)
    shapes = {"muon": (8, 12), "muon2": (8, 12), "tall": (12, 8), "decay": (10, 8), "gain": (8,)}
    matrices = ["muon", "muon2", "tall"]
    ours = {k: torch.nn.Parameter(torch.randn(s)) for k, s in shapes.items()}
    ref = {k: torch.nn.Parameter(p.detach().clone()) for k, p in ours.items()}
    grads = [{k: torch.randn(s) for k, s in shapes.items()} for _ in range(5)]
    opt = train.Muon([dict(params=[ours[k] for k in matrices], weight_decay=0.1, muon=True),
                      dict(params=[ours["decay"]], weight_decay=0.1), dict(params=[ours["gain"]], weight_decay=0.0)],
                     lr=2e-2, betas=(0.9, 0.95), eps=1e-8)
    adam = torch.optim.AdamW([dict(params=[ref["decay"]], weight_decay=0.1), dict(params=[ref["gain"]],
                                                                                   weight_decay=0.0)],
                             lr=2e-2, betas=(0.9, 0.95), eps=1e-8)
    for g in grads:
        for k in shapes:
            ours[k].grad, ref[k].grad = g[k].clone(), g[k].clone()
        opt.step()
        adam.step()
    for k in matrices:
        torch.testing.assert_close(ours[k].detach(), _muon_reference(ref[k].detach(), [g[k] for g in grads], 2e-2, 0.1),
                                   rtol=0, atol=1e-5)
    for k in ("decay", "gain"):
        torch.testing.assert_close(ours[k].detach(), ref[k].detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_train_muon_takes_the_blocks_matrices_and_adamw_the_rest(arch):
    cfg = dict(arch="llama", vocab_size=64, context_length=16, d_model=16, num_layers=2, num_heads=2, d_ff=32) \
        if arch == "llama" else dict(arch="gpt2", vocab_size=64, block_size=16, n_embd=16, n_layer=2, n_head=2)
    m = M.build_model(cfg)
    groups = M.param_groups(m, 0.1, muon=True)
    name = {id(p): n for n, p in m.named_parameters()}
    muon = sorted(name[id(p)].split(".")[-2] for g in groups if g.get("muon") for p in g["params"])
    kinds = {"llama": ["k_proj", "output_proj", "q_proj", "v_proj", "w1", "w2", "w3"],
             "gpt2": ["c_attn", "c_fc", "c_proj", "c_proj"]}[arch]
    assert muon == sorted(kinds * 2)   # two layers; embeddings, the head, biases and gains stay with AdamW
    assert sorted(id(p) for g in groups for p in g["params"]) == sorted(id(p) for p in m.parameters())
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.1]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_train_embedding_and_head_lr_scales(_train_data, tmp_path, optimizer):
    # one step from the same init, no warmup: a head at --head_lr_scale=2 moves exactly as at twice the learning
    # rate, an embedding at --embedding_lr_scale=0 stays put, and the blocks keep the run's learning rate
    def one_step(name, **kw):
        cfg = _train_cfg(_train_data, tmp_path / name, max_iters=1, warmup_iters=0, optimizer=optimizer, **kw)
        return _train_weights(train.train(cfg, log=_train_quiet)["ckpt"])
    init = one_step("init", learning_rate=0.0)
    scaled = one_step("scaled", embedding_lr_scale=0.0, head_lr_scale=2.0)
    doubled = one_step("doubled", learning_rate=6e-3)
    assert torch.equal(scaled["lm_head.weight"], doubled["lm_head.weight"])
    assert not torch.equal(scaled["lm_head.weight"], init["lm_head.weight"])
    assert torch.equal(scaled["token_embeddings.weight"], init["token_embeddings.weight"])
    assert not torch.equal(doubled["token_embeddings.weight"], init["token_embeddings.weight"])
    block = "layers.0.ffn.w1.weight"
    assert not torch.equal(scaled[block], init[block]) and not torch.equal(scaled[block], doubled[block])


def test_train_ema_averages_the_weights_and_the_run_scores_and_keeps_the_average(_train_data, tmp_path):
    # --ema=0.6 over 3 steps: step t averages its weights in at 1 - min(0.6, 1 - 1/t) (steps 1 and 2 their mean,
    # then the moving average). Training is unchanged: its weights are a run's without --ema, bit for bit. The
    # checkpoint's model is the average, and the run's last evaluation scored it
    def run(name, **kw):
        summary = train.train(_train_cfg(_train_data, tmp_path / name, warmup_iters=0, lr_decay_iters=3, **kw),
                              log=_train_quiet)
        return summary, torch.load(tmp_path / name / "ckpt.pt", weights_only=True)
    (_, w1), (_, w2), (plain, w3) = (run(f"plain{t}", max_iters=t) for t in (1, 2, 3))
    summary, ckpt = run("ema", max_iters=3, ema=0.6)
    trained = ckpt["trained_weights"]
    assert set(trained) == {n for n, _ in M.build_model(ckpt["model_config"]).named_parameters()}
    for k in trained:
        assert torch.equal(trained[k], w3["model"][k])
        want = 0.6 * (w1["model"][k] + w2["model"][k]) / 2 + 0.4 * w3["model"][k]
        torch.testing.assert_close(ckpt["model"][k], want, rtol=0, atol=1e-6)
        assert not torch.equal(ckpt["model"][k], trained[k])
    model = M.model_from_checkpoint(ckpt).eval()
    scored = train.estimate_val_loss(model, runs.find_shards(_train_data, "val"), dict(batch_size=4, context_length=16),
                                     "llama", torch.device("cpu"), contextlib.nullcontext(), 0, 1, 2)
    assert summary["val_loss"] == pytest.approx(scored, rel=1e-6) and summary["val_loss"] != plain["val_loss"]


def test_train_cosine_schedule_points():
    f = lambda it: train.get_lr_cosine_schedule(it, 1.0, 0.1, 10, 110)
    assert f(0) == 0.0
    assert f(5) == pytest.approx(0.5)                     # warmup
    assert f(10) == pytest.approx(1.0)                    # peak
    assert f(60) == pytest.approx(0.1 + 0.5 * 0.9)        # middle of the cosine
    assert f(110) == pytest.approx(0.1)                   # end
    assert f(500) == pytest.approx(0.1)                   # flat after
    assert train.get_lr_cosine_schedule(0, 1.0, 0.1, 0, 100) == pytest.approx(1.0)   # no warmup


def test_train_wsd_schedule_points():
    f = lambda it: train.get_lr_wsd_schedule(it, 1.0, 0.1, 10, 110, 0.5)
    assert f(0) == 0.0 and f(5) == pytest.approx(0.5)                 # warmup
    assert f(10) == f(30) == f(55) == pytest.approx(1.0)              # stable until the last half of 110
    assert f(82.5) == pytest.approx(0.55)                              # halfway down the linear decay
    assert f(110) == f(500) == pytest.approx(0.1)                      # end, and flat after
    assert train.get_lr_wsd_schedule(0, 1.0, 0.1, 0, 100, 1.0) == pytest.approx(1.0)   # all decay, no warmup
    g = lambda it: train.get_lr_wsd_schedule(it, 1.0, 0.1, 10, 110, 0.2)
    assert g(88) == pytest.approx(1.0) and g(99) == pytest.approx(0.55)   # the last 20 %: the decay starts at 88


def test_train_warmup_from_one_is_build_nanogpts_schedule():
    # build-nanogpt's get_lr: lr*(it+1)/warmup, then the cosine from the peak at it = warmup to min_lr at max_steps,
    # step for step under --warmup_from_one; without it the warmup is CS336's (0 at step 0)
    max_lr, min_lr, warmup, max_steps = 6e-4, 6e-5, 10, 50

    def reference(it):
        if it < warmup:
            return max_lr * (it + 1) / warmup
        if it > max_steps:
            return min_lr
        ratio = (it - warmup) / (max_steps - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
    c = dict(train.DEFAULTS, learning_rate=max_lr, min_lr_ratio=0.1, warmup_iters=warmup, max_iters=max_steps,
             time_budget="", warmup_from_one=True)
    assert [train.scheduled_lr(c, it, 0.0) for it in range(60)] == pytest.approx([reference(it) for it in range(60)])
    cs336 = dict(c, warmup_from_one=False)
    assert train.scheduled_lr(cs336, 0, 0.0) == 0.0 and train.scheduled_lr(cs336, 5, 0.0) == pytest.approx(3e-4)


def test_train_gradient_clipping_matches_torch():
    for max_norm in (0.01, 1e3):                          # clipped, and untouched
        torch.manual_seed(1)
        a = [torch.nn.Parameter(torch.randn(shape)) for shape in ((4, 3), (3,), (2,))]
        b = [torch.nn.Parameter(p.detach().clone()) for p in a]
        for p, q in zip(a[:2], b[:2]):                    # the last one has no gradient
            p.grad = torch.randn(p.shape)
            q.grad = p.grad.clone()
        n_ref = torch.nn.utils.clip_grad_norm_(a, max_norm)
        n_ours = train.gradient_clipping((p for p in b), max_norm)   # a one-shot generator
        torch.testing.assert_close(torch.as_tensor(n_ours), n_ref)
        for p, q in zip(a[:2], b[:2]):
            torch.testing.assert_close(p.grad, q.grad)


def test_train_gradient_clipping_eps_matches_torch_at_tiny_norms():
    # the 1e-6 in max_norm / (norm + 1e-6) matters only for norms near 1e-6: there it must still match torch
    for norm in (5e-7, 2e-6):
        g = torch.tensor([0.6, 0.8, 0.0]) * norm
        a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
        a.grad, b.grad = g.clone(), g.clone()
        n_ref = torch.nn.utils.clip_grad_norm_([a], 1e-7)
        n_ours = train.gradient_clipping([b], 1e-7)
        torch.testing.assert_close(torch.as_tensor(n_ours), n_ref)
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=0)
        assert b.grad.norm() < 1e-7 * norm / (norm + 1e-6) * 1.001


def test_train_gradient_clipping_runs_the_same_few_ops_for_any_number_of_tensors():
    # multi-tensor kernels (torch._foreach_*): a few launches for all gradients, not ~300 small kernels a step
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func)
            return func(*args, **(kwargs or {}))
    counts = []
    for n in (3, 30):
        params = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(n)]
        for p in params:
            p.grad = torch.randn(4, 3)
        ops = []
        with Count():
            train.gradient_clipping(params, 0.1)
        counts.append(len(ops))
    assert counts[0] == counts[1] < 10


# ---- data loading: random windows (CS336) and the sequential sampler (build-nanogpt's, shuffled per epoch)


def test_train_get_batch_windows():
    # CS336's get_batch (numpy's global generator when no rng is given, seeded here so the test is deterministic)
    np.random.seed(0)
    data = np.arange(100, dtype=np.uint16)
    starts = set()
    for _ in range(200):
        x, y = train.get_batch(data, 8, 10, "cpu")
        assert x.shape == y.shape == (8, 10) and x.dtype == y.dtype == torch.int64 and x.device.type == "cpu"
        assert torch.equal(x[:, 1:], y[:, :-1])                       # y is x shifted by one
        assert torch.equal(x, x[:, :1] + torch.arange(10))             # real consecutive slices
        starts.update(x[:, 0].tolist())
    assert starts == set(range(0, 100 - 10))                           # every start in [0, len - T - 1]
    if torch.cuda.is_available():
        assert train.get_batch(data, 2, 10, "cuda")[0].device.type == "cuda"


def test_train_random_sampler_takes_a_file_of_exactly_one_window():
    arr = np.arange(17, dtype=np.uint16)
    x, y = runs.RandomSampler([("f", arr, {})], batch_size=2, context_length=16).next_batch("cpu")
    assert x.tolist() == [list(range(16))] * 2 and y.tolist() == [list(range(1, 17))] * 2


def test_train_random_sampler_draws_every_window_of_every_shard_in_proportion():
    # a shard drawn in proportion to its windows (len - T), then any window, the last one included
    T = 4
    small = np.arange(0, T + 1, dtype=np.uint16)             # 1 window
    big = np.arange(100, 100 + T + 9, dtype=np.uint16)        # 9 windows
    s = runs.RandomSampler([("s", small, {}), ("b", big, {})], batch_size=8, context_length=T, seed=0)
    starts, n_small, n = set(), 0, 0
    for _ in range(250):
        x, y = s.next_batch("cpu")
        assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x, x[:, :1] + torch.arange(T))
        first = x[:, 0].tolist()
        starts.update(first)
        n_small += sum(v < 100 for v in first)
        n += len(first)
    assert starts == {0} | set(range(100, 109))
    assert 0.07 < n_small / n < 0.13, n_small / n            # 1 of 10 windows


def test_train_random_sampler_ranks_draw_different_windows():
    # every rank its own stream (seeded by seed and rank), else all ranks train on the same windows
    arr = np.arange(10000, dtype=np.uint16)
    draw = lambda seed, rank: runs.RandomSampler([("f", arr, {})], 8, 16, seed=seed, rank=rank).next_batch("cpu")[0]
    assert torch.equal(draw(0, 1), draw(0, 1))
    assert not torch.equal(draw(0, 0), draw(0, 1))
    assert not torch.equal(draw(0, 0), draw(1, 0))


def test_train_sequential_sampler_reads_a_shard_to_its_last_token():
    # a shard of n*B*T + 1 tokens holds n batches, the last one ending on its last token
    arr = np.arange(4 * 8 + 1, dtype=np.uint16)
    s = runs.SequentialSampler([("a", arr, {})], 1, 8, shuffle=False)
    xs, ys = zip(*[s.next_batch("cpu") for _ in range(5)])
    assert [int(x[0, 0]) for x in xs] == [0, 8, 16, 24, 0]
    assert ys[3].tolist() == [list(range(25, 33))] and s.epoch == 1
    # the same with the shuffling reader on two shards: each one is read whole before the next
    two = [("a", np.arange(0, 17, dtype=np.uint16), {}), ("b", np.arange(100, 117, dtype=np.uint16), {})]
    s = runs.SequentialSampler(two, 1, 8, seed=0, eot_id=None)
    shard_of = [{t // 100 for t in s.next_batch("cpu")[0].flatten().tolist()} for _ in range(4)]
    assert s.epoch == 0 and shard_of[0] == shard_of[1] != shard_of[2] == shard_of[3]
    assert all(len(x) == 1 for x in shard_of)


def test_train_sequential_sampler_shuffles_the_shard_order_per_epoch():
    # shards told apart by their values (i*100 + position): each read once, whole, in an order drawn per epoch
    shards = [(f"s{i}", np.arange(i * 100, i * 100 + 40, dtype=np.uint16), {}) for i in range(4)]
    s = runs.SequentialSampler(shards, 1, 4, seed=0, eot_id=None)
    per_shard = (40 - 1) // 4
    orders = set()
    for _ in range(6):
        seen = [int(s.next_batch("cpu")[0][0, 0]) // 100 for _ in range(4 * per_shard)]
        order = tuple(seen[::per_shard])
        assert sorted(order) == [0, 1, 2, 3]
        assert all(seen[i * per_shard:(i + 1) * per_shard] == [order[i]] * per_shard for i in range(4))
        orders.add(order)
    assert len(orders) > 1


def test_train_sequential_sampler_shuffles_each_shard_with_its_own_order():
    # two shards holding the same documents: within one epoch each gets its own document order
    docs = sum([[0] + [10 * d + i for i in range(1, 4)] for d in range(1, 9)], [])
    arr = np.asarray(docs, dtype=np.uint16)
    s = runs.SequentialSampler([("a", arr, {}), ("b", arr.copy(), {})], 1, 4, seed=0, eot_id=0)
    n = (len(arr) - 1) // 4
    differ = 0
    for _ in range(3):
        first = torch.cat([s.next_batch("cpu")[0].flatten() for _ in range(n)])
        second = torch.cat([s.next_batch("cpu")[0].flatten() for _ in range(n)])
        differ += not torch.equal(first, second)
    assert differ >= 2


def test_train_sequential_sampler_keeps_a_shards_opening_piece_first():
    # a shard opening mid-document has no eot before that piece: it stays at the shard's start, never shuffled
    head = [50, 51, 52, 53, 54, 55, 56]
    docs = [[0] + [10 * d + i for i in range(1, 6)] for d in range(1, 5)]
    arr = np.asarray(head + sum(docs, []), dtype=np.uint16)
    s = runs.SequentialSampler([("a", arr, {})], 1, 4, seed=0, eot_id=0)
    orders = set()
    for epoch in range(6):
        flat = torch.cat([s.next_batch("cpu")[0].flatten() for _ in range((len(arr) - 1) // 4)]).tolist()
        assert flat[:len(head)] == head, epoch
        orders.add(tuple(flat[len(head) + 1::6][:3]))  # the first token of each document that follows
    assert len(orders) > 1   # the documents after it are still shuffled


def test_train_sequential_sampler_without_document_boundaries_never_repeats_an_epoch():
    # nothing to shuffle (no eot, one document): each epoch starts elsewhere, repeats no batch, reads the whole shard
    arr = np.arange(1000, dtype=np.uint16)
    for eot_id in (None, 5000, 0):
        s = runs.SequentialSampler([("a", arr, {})], 2, 8, seed=0, eot_id=eot_id)
        per_batch = 2 * 8
        epochs = []
        for _ in range(3):
            n = (len(arr) - 1) // per_batch
            epochs.append([s.next_batch("cpu")[0] for _ in range(n)])
        assert all(not torch.equal(a[0], b[0]) for a, b in zip(epochs, epochs[1:])), eot_id
        for batches in epochs:  # consecutive, wrapping once around the shard's end
            flat = torch.cat([x.flatten() for x in batches])
            steps = (flat[1:] - flat[:-1]) % len(arr)
            assert (steps == 1).all() and len(set(flat.tolist())) == len(flat)
    state = s.state_dict()   # (and a rotated epoch resumes where it was)
    later = [s.next_batch("cpu")[0] for _ in range(5)]
    s2 = runs.SequentialSampler([("a", arr, {})], 2, 8, seed=0, eot_id=eot_id)
    s2.load_state_dict(state)
    assert all(torch.equal(a, s2.next_batch("cpu")[0]) for a in later)


class _NanoGPTLoader:
    """build-nanogpt's DataLoaderLite (train_gpt2.py) written out, on in-memory shards instead of its .npy files:
    rank r starts at B*T*r, each batch advances B*T*world, and the next shard (wrapping) is loaded when position +
    B*T*world + 1 > len(tokens), with the rank's own position (its B*T*r offset included)."""

    def __init__(self, shards, B, T, rank, world):
        self.shards, self.B, self.T, self.rank, self.world = shards, B, T, rank, world
        self.shard, self.tokens, self.pos = 0, shards[0], B * T * rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = torch.from_numpy(self.tokens[self.pos:self.pos + B * T + 1].astype(np.int64))
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.pos += B * T * self.world
        if self.pos + (B * T * self.world + 1) > len(self.tokens):
            self.shard = (self.shard + 1) % len(self.shards)
            self.tokens, self.pos = self.shards[self.shard], B * T * self.rank
        return x, y


def test_train_sequential_sampler_reads_the_first_epoch_as_build_nanogpts_loader():
    # shuffle_first_epoch=False: 4 ranks read the shards in name order and documents as written, batch for batch as
    # build-nanogpt's loader, through the first epoch; the second is shuffled. Each shard's tail past its last
    # whole round of B*T*4 windows holds 3 windows or more (so the reference's ranks leave it in the same round)
    B, T, W = 2, 8, 4
    shards = [np.asarray(_train_docs(n, seed), dtype=np.uint16) for n, seed in ((241, 0), (184, 1), (316, 2))]
    named = [(f"train_{i:06d}.bin", a, {}) for i, a in enumerate(shards)]
    rounds = sum((len(a) - 1) // (B * T * W) for a in shards)   # 3 + 2 + 4 batches per rank in the first epoch
    ours = [runs.SequentialSampler(named, B, T, r, W, seed=0, eot_id=0, shuffle_first_epoch=False) for r in range(W)]
    default = [runs.SequentialSampler(named, B, T, r, W, seed=0, eot_id=0) for r in range(W)]
    refs = [_NanoGPTLoader(shards, B, T, r, W) for r in range(W)]
    for step in range(rounds):
        for r in range(W):
            x, y = ours[r].next_batch("cpu")
            rx, ry = refs[r].next_batch()
            assert torch.equal(x, rx) and torch.equal(y, ry), (step, r)
    assert all(s.epoch == 0 for s in ours)
    first = [torch.cat([default[r].next_batch("cpu")[0] for _ in range(rounds)]) for r in range(W)]
    assert not torch.equal(first[0], torch.cat([_NanoGPTLoader(shards, B, T, 0, W).next_batch()[0]
                                                for _ in range(rounds)]))   # the default shuffles the first epoch
    for _ in range(rounds):   # the second epoch: shuffled, the same as the default sampler's
        assert all(torch.equal(ours[r].next_batch("cpu")[0], default[r].next_batch("cpu")[0]) for r in range(W))
    assert all(s.epoch == 1 for s in ours)
    # with a shorter tail the reference's rank 3 moves on a round before rank 0; here a step's ranks share a shard
    short = [np.arange(2 * 64 + 11, dtype=np.uint16), np.arange(1000, 1300, dtype=np.uint16)]
    named = [(f"train_{i:06d}.bin", a, {}) for i, a in enumerate(short)]
    ours = [runs.SequentialSampler(named, B, T, r, W, seed=0, shuffle_first_epoch=False) for r in range(W)]
    refs = [_NanoGPTLoader(short, B, T, r, W) for r in range(W)]
    second = [[(s.next_batch("cpu")[0], ref.next_batch()[0]) for _ in range(2)][1] for s, ref in zip(ours, refs)]
    assert all(int(x.max()) < 1000 for x, _ in second)                  # ours: round 2 of shard 0 on every rank
    assert int(second[0][1].max()) < 1000 <= int(second[3][1].min())   # the reference's rank 3: already shard 1


# ---- checkpoints


def _model_config(flags, vocab_size, pad_vocab=1):
    return M.config_from_flags(flags["model"], flags, vocab_size, pad_vocab)


def test_train_checkpoint_roundtrip_path_and_bytesio(tmp_path, monkeypatch):
    cfg = _train_cfg(tmp_path, tmp_path)
    m = M.build_model(_model_config(cfg, 64, 1))
    opt = train.AdamW(m.parameters(), lr=1e-2)
    x = torch.randint(0, 64, (2, 8))
    M.lm_loss(m, x, x).backward()
    opt.step()
    for target in (tmp_path / "c.pt", io.BytesIO()):
        train.save_checkpoint(m, opt, 7, target, rng=runs.rng_state(), loader={"pos": 3})
        if isinstance(target, io.BytesIO):
            target.seek(0)
        m2 = M.build_model(m.model_config())
        opt2 = train.AdamW(m2.parameters(), lr=1e-2)
        assert train.load_checkpoint(target, m2, opt2) == 7
        for k, v in m.state_dict().items():
            assert torch.equal(v, m2.state_dict()[k])
        s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
        assert all(torch.equal(s1[i]["exp_avg_sq"], s2[i]["exp_avg_sq"]) for i in s1)
    assert not list(tmp_path.glob("*.tmp*"))                         # atomic write leaves no temp file
    # a write that fails half way (disk full, Ctrl-C): the old checkpoint stays whole and no temp file is left
    def full_disk(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")
    before = (tmp_path / "c.pt").read_bytes()
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        train.save_checkpoint(m, opt, 8, tmp_path / "c.pt")
    assert (tmp_path / "c.pt").read_bytes() == before and not list(tmp_path.glob("*.tmp*"))


def test_train_save_checkpoint_sees_through_the_module_train_py_compiles(tmp_path):
    # LossOf (compiled or not) is what train.py trains: save_checkpoint given it writes the model's own keys
    model = M.build_model(dict(arch="llama", vocab_size=64, context_length=16, d_model=32, num_layers=1, num_heads=2,
                               d_ff=64))
    opt = train.AdamW(model.parameters())
    plain = io.BytesIO()
    train.save_checkpoint(model, opt, 1, plain)
    for wrapped in (train.LossOf(model, "llama"), torch.compile(train.LossOf(model, "llama"), backend="eager")):
        buf = io.BytesIO()
        train.save_checkpoint(wrapped, opt, 1, buf)
        a, b = (torch.load(io.BytesIO(x.getvalue()), weights_only=True) for x in (plain, buf))
        assert b["model"].keys() == a["model"].keys() and b["model_config"] == a["model_config"]


@pytest.mark.parametrize("kind, named", [("truncated", ()), ("not train.py's", ("'model'", "'iteration'"))])
def test_train_checkpoint_that_is_not_a_whole_train_py_checkpoint_is_one_line(tmp_path, kind, named):
    # a file cut short, or one that holds no train.py run: one line naming the file, no unpickling traceback
    good = tmp_path / "good.pt"
    torch.save({"model": {}, "iteration": 1}, good)
    bad = tmp_path / "bad.pt"
    if kind == "truncated":
        bad.write_bytes(good.read_bytes()[:40])
    else:
        torch.save({"weights": {}}, bad)
    _one_line_naming(_raises(runs.read_train_checkpoint, bad), f"{bad}: ", *named)
    assert runs.read_train_checkpoint(good)["iteration"] == 1


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 5141120 vs 5141012"),
    OSError(28, "No space left on device")], ids=["torch-writer", "enospc"])
def test_train_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_last_one(tmp_path, _train_data, monkeypatch,
                                                                            error):
    # a full disk at step 4's checkpoint: one line naming it, both steps and --resume; step 2's kept, no temp file
    out, real_save, kept = tmp_path / "o", torch.save, []

    def save(obj, f, *a, **k):
        if isinstance(obj, dict) and obj.get("iteration") == 4:
            kept.append((out / "ckpt.pt").read_bytes())
            f.write(b"PK\x03\x04 a partial write")
            raise error
        return real_save(obj, f, *a, **k)
    monkeypatch.setattr(torch, "save", save)
    args = _train_main_args(_train_data, out) + ["--max_iters=6", "--eval_interval=2"]
    message = _exits(train.main, args)
    _one_line_naming(message, f"train.py: {out / 'ckpt.pt'}: ", "step 4", "step 2", "--resume")
    _named_in_order(message, "step 4", "step 2", "--resume")   # not written, then kept
    assert (out / "ckpt.pt").read_bytes() == kept[0] and {p.name for p in out.iterdir()} <= {".lock", "ckpt.pt",
                                                                                              "log.jsonl"}
    monkeypatch.setattr(torch, "save", real_save)
    train.main(args + ["--resume"])
    assert torch.load(out / "ckpt.pt", weights_only=True)["iteration"] == 6


def test_train_full_disk_at_the_first_checkpoint_says_to_run_the_command_again(tmp_path, _train_data, monkeypatch):
    # no checkpoint to continue from: the line does not send the user to --resume, and the same command then runs
    out, real_save = tmp_path / "o", torch.save

    def save(obj, f, *a, **k):
        if isinstance(obj, dict) and "iteration" in obj:
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *a, **k)
    monkeypatch.setattr(torch, "save", save)
    args = _train_main_args(_train_data, out) + ["--max_iters=4", "--eval_interval=2"]
    message = _exits(train.main, args)
    _one_line_naming(message, f"train.py: {out / 'ckpt.pt'}: ", "step 2")
    assert "--resume" not in message and not (out / "ckpt.pt").exists()
    monkeypatch.setattr(torch, "save", real_save)
    train.main(args)
    assert torch.load(out / "ckpt.pt", weights_only=True)["iteration"] == 4


def test_train_full_disk_at_a_sharded_checkpoint_is_one_line_and_keeps_the_last_one(tmp_path, _train_data,
                                                                                      monkeypatch):
    # --fsdp: a full disk at step 4's shards (DCP's CheckpointException): the same line, step 2's kept, --resume works
    import torch.distributed.checkpoint as dcp
    out, real_save = tmp_path / "o", dcp.save

    def save(state, checkpoint_id, **k):
        if ".shards-4-" in str(checkpoint_id):
            raise dcp.api.CheckpointException("save failed", {0: (OSError(28, "No space left on device"), None)})
        return real_save(state, checkpoint_id=checkpoint_id, **k)
    monkeypatch.setattr(dcp, "save", save)
    args = _train_main_args(_train_data, out) + ["--max_iters=6", "--eval_interval=2", "--fsdp"]
    _one_line_naming(_exits(train.main, args), f"train.py: {out / 'ckpt.pt'}: ", "step 4", "step 2", "--resume")
    assert torch.load(out / "ckpt.pt", weights_only=True)["iteration"] == 2
    monkeypatch.setattr(dcp, "save", real_save)
    train.main(args + ["--resume"])
    assert M.read_checkpoint(out / "ckpt.pt")["iteration"] == 6 and len(list(out.glob("ckpt.pt.shards-*"))) == 1


@pytest.mark.parametrize("cut", ["all-but-100-bytes", "the-last-3000-bytes"])
def test_train_fsdp_shards_cut_short_are_one_line_naming_their_folder(tmp_path, _train_data, cut):
    # a broken shard folder (DCP's CheckpointException is a BaseException): resuming it, or reading its weights
    # (sample.py, export.py), says so in one line naming the folder; cut at the end, the weights may still read
    out = tmp_path / "o"
    args = _train_main_args(_train_data, out) + ["--fsdp"]
    train.main(args)
    (folder,) = out.glob("ckpt.pt.shards-*")
    for f in folder.glob("*.distcp"):
        data = f.read_bytes()
        f.write_bytes(data[:100] if cut == "all-but-100-bytes" else data[:-3000])
    _one_line_naming(_exits(train.main, args + ["--resume"]), "train.py: ", folder)
    if cut == "all-but-100-bytes":
        _one_line_naming(_raises(M.read_checkpoint, out / "ckpt.pt"), str(folder))


@pytest.mark.parametrize("resume", ["auto", "true"])
def test_train_weights_saved_by_save_checkpoint_are_not_resumed_as_a_run(tmp_path, _train_data, resume):
    # the CS336 save_checkpoint's file (weights, optimizer, iteration) in --out_dir: one line naming it and what it
    # lacks, not a KeyError
    out = tmp_path / "o"
    m = _model_llama(vocab_size=64, context_length=16)
    train.save_checkpoint(m, torch.optim.AdamW(m.parameters()), 2, out / "ckpt.pt")
    message = _exits(train.main, _train_main_args(_train_data, out) + [f"--resume={resume}"])
    _one_line_naming(message, f"train.py: {out / 'ckpt.pt'}: ", "'config'", "--fresh")


# ---- evaluation: the validation loss and bits per byte


def test_train_estimate_val_loss_scores_the_first_tokens_of_the_validation_file_in_order(tmp_path, _train_data):
    # bits/byte counts the first eval_iters*B*T targets: the loss is taken on exactly those windows, in order
    import contextlib
    m = _model_llama(vocab_size=64, context_length=16)
    shards = runs.find_shards(_train_data, "val")
    cfg = dict(batch_size=4, context_length=16)
    got = train.estimate_val_loss(m, shards, cfg, "llama", torch.device("cpu"), contextlib.nullcontext(), 0, 1, 3)
    val = torch.from_numpy(np.fromfile(_train_data / "val.bin", dtype=np.uint16)[:3 * 64 + 1].astype(np.int64))
    with torch.no_grad():
        want = np.mean([M.lm_loss(m, val[i * 64:(i + 1) * 64].view(4, 16), val[i * 64 + 1:(i + 1) * 64 + 1].view(4, 16))
                        .item() for i in range(3)])
    assert got == pytest.approx(want, rel=1e-6)


def test_train_bytes_per_token_counts_utf8_bytes_not_characters():
    # bits/byte divides by UTF-8 bytes: a multi-byte character counts for each of its bytes
    tok = bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [], [bpe.EOT])
    text = "héllo wörld €"
    ids = list(text.encode("utf-8")) + [tok.eot_id]
    assert train.bytes_per_token(tok, ids, tok.eot_id) == pytest.approx(len(text.encode("utf-8")) / len(ids))
    assert len(text) < len(text.encode("utf-8"))
    # a character cut at the window's ends counts only its bytes inside (one byte a token here), not a U+FFFD's 3
    assert train.bytes_per_token(tok, [0xA9, 97, 0xE2], tok.eot_id) == pytest.approx(1.0)
    assert train.bytes_per_token(tok, [0xC3, 0xA9, 0xE2, 0x82], tok.eot_id) == pytest.approx(1.0)


# ---- device settings, batch arithmetic, the model's config


def _settings(c, device):
    """train.device_settings without its dtype_why phrase (a test of the choices, not of their wording)."""
    return {k: v for k, v in train.device_settings(c, device).items() if k != "dtype_why"}


def test_train_auto_precision_switches_are_on_for_cuda_only(monkeypatch):
    # the auto switches: all on for CUDA, off elsewhere; --dtype=auto is bfloat16 only where native; a value wins
    native = {True: True, False: True}   # is_bf16_supported(including_emulation=...)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native[including_emulation])
    monkeypatch.setattr(M, "cpu_flags", lambda: {"avx2"})   # a CPU without native bf16
    on = dict(tf32=True, dtype="bfloat16", pad_vocab=64, fused=True, compile=True)
    off = dict(tf32=False, dtype="float32", pad_vocab=1, fused=False, compile=False)
    auto = dict(train.DEFAULTS)
    assert _settings(auto, torch.device("cuda", 1)) == on
    assert _settings(auto, torch.device("cpu")) == off
    native[False] = False   # bf16 emulated only
    assert _settings(auto, torch.device("cuda")) == dict(on, dtype="float32")
    given = dict(auto, tf32="false", dtype="bfloat16", pad_vocab="false", fused="false", compile="false")
    assert _settings(given, torch.device("cuda")) == dict(off, dtype="bfloat16")
    given = dict(auto, tf32="true", dtype="float32", pad_vocab="true", fused="true", compile="true")
    assert _settings(given, torch.device("cpu")) == dict(on, dtype="float32")
    muon = dict(auto, optimizer="muon")   # torch's fused kernel is AdamW's: Muon runs this file's optimizer
    assert _settings(muon, torch.device("cuda")) == dict(on, dtype="float32", fused=False)


@pytest.mark.parametrize("flags, d_model, init_from, dtype", [
    ({"avx2", "fma"}, 512, "scratch", "float32"),              # AVX2 only: bf16 emulated, float32 as always
    ({"avx512f", "avx512bw"}, 512, "scratch", "float32"),      # AVX-512 without its BF16 extension: the same
    ({"avx512f", "avx512_bf16"}, 512, "scratch", "bfloat16"),  # AMD Zen 4, Intel Cooper Lake
    ({"amx_bf16", "amx_tile"}, 256, "scratch", "bfloat16"),    # Intel Sapphire Rapids (AMX)
    ({"fp", "asimd", "bf16"}, 1024, "scratch", "bfloat16"),    # Arm with BF16 (Graviton 3, Neoverse V1)
    ({"avx512f", "avx512_bf16"}, 128, "scratch", "bfloat16"),  # the main job's width: measured to pay
    ({"avx512f", "avx512_bf16"}, train.CPU_BF16_MIN_D_MODEL, "scratch", "bfloat16"),   # the speedrun's: the edge
    ({"avx512f", "avx512_bf16"}, 64, "scratch", "float32"),    # native, but too narrow: the casts cost more
    ({"avx512f", "avx512_bf16"}, 64, "gpt2", "bfloat16"),      # released GPT-2 brings its 768 width
])
def test_train_auto_dtype_on_cpu_is_bf16_where_native_and_wide_enough(monkeypatch, flags, d_model, init_from, dtype):
    monkeypatch.setattr(M, "cpu_flags", lambda: flags)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    c = dict(train.DEFAULTS, d_model=d_model, init_from=init_from)
    hw = train.device_settings(c, torch.device("cpu"))
    assert hw["dtype"] == dtype and hw["dtype_why"].startswith("auto")
    assert train.device_settings(dict(c, dtype="float32"), "cpu")["dtype"] == "float32"   # a given dtype wins
    assert train.device_settings(dict(c, dtype="bfloat16"), "cpu")["dtype"] == "bfloat16"


def test_train_dtype_help_gives_autos_cpu_width():
    # --help states the width from which auto takes CPU bf16, the one auto_dtype uses
    help_text = train.settings()["dtype"][0].metadata["help"]
    assert re.search(rf"\b{train.CPU_BF16_MIN_D_MODEL}\b", help_text), help_text


def test_train_an_odd_head_width_is_refused_only_where_rope_rotates_pairs(tmp_path):
    # 15 per head: RoPE cannot rotate it (refused before any work, _TRAIN_REFUSALS); without RoPE, or GPT-2, it runs
    odd = dict(train.DEFAULTS, out_dir=str(tmp_path / "o"), d_model=30, num_heads=2)
    _one_line_naming(_raises(train.check_config, odd), "--d_model=30", "--num_heads=2", "15")
    assert train.check_config(dict(odd, remove_rope=True)).d_model == 30
    M.build_model(dict(arch="llama", vocab_size=64, context_length=8, d_model=30, num_layers=1, num_heads=2,
                       d_ff=32, remove_rope=True))
    assert train.check_config(dict(odd, model="gpt2")).d_model == 30


def test_train_total_batch_tokens_sets_the_accumulation_steps():
    # tokens per step / (B * T * world) micro-steps; 0 = one; a total of no whole micro-batches is refused
    assert train.grad_accum_steps(524288, 64, 1024, 8) == 1
    assert train.grad_accum_steps(524288, 16, 1024, 1) == 32
    assert train.grad_accum_steps(0, 16, 1024, 8) == 1
    _one_line_naming(_raises(train.grad_accum_steps, 524288, 48, 1024, 1), "--total_batch_tokens=524,288 ", "49,152")


def test_train_model_config_passes_every_architecture_flag():
    # the ablation flags and rope_theta reach the model config (and so the model) that train() builds
    base = dict(train.DEFAULTS)
    for kw in (dict(remove_rope=True), dict(use_post_norm=True), dict(remove_rmsnorm=True),
               dict(ffn_type="silu"), dict(rope_theta=500.0), dict(attn_impl="scratch")):
        cfg = _model_config(dict(base, **kw), 100)
        assert all(cfg[k] == v for k, v in kw.items()), (kw, cfg)
        m = M.build_model(cfg)
        assert all(m.model_config()[k] == v for k, v in kw.items())
    assert M.build_model(_model_config(dict(base, remove_rope=True), 100)).layers[0].attn.rope is None
    gpt = _model_config(dict(base, model="gpt2", attn_impl="scratch"), 100, 64)
    assert (gpt["n_layer"], gpt["n_head"], gpt["n_embd"], gpt["block_size"], gpt["attn_impl"],
            gpt["pad_vocab_to_multiple_of"]) == (4, 4, 128, 128, "scratch", 64)


def test_train_default_d_ff_is_eight_thirds_of_d_model_rounded_to_64():
    # d_ff = 0: 8/3 d_model to the NEAREST multiple of 64 for SwiGLU (512 -> 1344, the baseline's), 4 d_model for SiLU
    for d_model, want in ((128, 320), (512, 1344), (320, 832), (1024, 2752)):
        cfg = dict(train.DEFAULTS, d_model=d_model, d_ff=0)
        assert _model_config(cfg, 100)["d_ff"] == want, d_model
    assert _model_config(dict(train.DEFAULTS, d_ff=0, ffn_type="silu"), 100)["d_ff"] == 512
    # below d_model 12 the nearest multiple of 64 is 0, a model without an FFN: at least 64
    for d_model in (8, 12):
        assert _model_config(dict(train.DEFAULTS, d_model=d_model, d_ff=0), 100)["d_ff"] == 64


# ---- the run: its processes and device


def test_train_tf32_num_threads_and_the_auto_dtype_reach_torch_and_the_log(tmp_path, _train_data, monkeypatch):
    # --tf32: matmul precision "high"; --num_threads=0 leaves torch's count alone; --dtype=auto's pick said and logged
    precision, threads, lines = [], [], []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", precision.append)
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(M, "cpu_flags", lambda: {"avx2"})
    train.train(_train_cfg(_train_data, tmp_path / "a", max_iters=1, tf32=False, num_threads=0, dtype="auto"),
                log=lines.append)
    assert precision == [] and threads == []
    config = _train_records(tmp_path / "a", "config")[0]
    assert config["used"]["dtype"] == "float32" and config["used"]["dtype_why"].startswith("auto")
    assert any(config["used"]["dtype_why"] in line for line in lines)
    train.train(_train_cfg(_train_data, tmp_path / "b", max_iters=1, tf32=True, num_threads=1), log=_train_quiet)
    assert precision == ["high"] and threads == [1]


# ---- the run: its token files, checked before anything is written


def _train_sidecar(name, change):
    """A change to _train_data: the sidecar `name` rewritten by change(its JSON)."""
    return lambda d: (d / name).write_text(json.dumps(change(json.loads((d / name).read_text()))))


def _train_tokens_of(tokenizer, vocab_size):
    """A change to _train_data: its sidecars name another tokenizer and vocabulary (the ids stay)."""
    return lambda d: [_train_write_tokens(d / n, np.fromfile(d / n, dtype=np.uint16), vocab_size, tokenizer=tokenizer)
                      for n in ("train.bin", "val.bin")]


_TRAIN_REFUSALS = {   # case: (settings over _train_cfg's, a change to _train_data first, the line's start, what it
    # names in this order); {data} is the data folder, {tmp} the test's
    "device-cuda": (dict(device="cuda"), None, "--device", ["cuda"]),
    "device-cuda:1": (dict(device="cuda:1"), None, "--device", ["cuda:1"]),
    "device-mps": (dict(device="mps"), None, "--device", ["mps"]),
    "device-unknown": (dict(device="gpu"), None, "--device", ["'gpu'"]),
    "token-file-cut-short": ({}, lambda d: (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:-6]),
                             "{data}/train.bin: ", ["59994", "30000"]),
    "token-file-empty": ({}, lambda d: _train_write_tokens(d / "train.bin", [], 64), "{data}/train.bin: ", []),
    "sidecar-no-vocab_size": ({}, _train_sidecar("val.bin.json", lambda m: {
        k: v for k, v in m.items() if k != "vocab_size"}), "{data}/val.bin.json: ", ['"vocab_size"']),
    "sidecar-vocab_sizes-disagree": ({}, _train_sidecar("val.bin.json", lambda m: dict(m, vocab_size=128)),
                                     "{data}: ", ["{data}/train.bin.json", "64", "{data}/val.bin.json", "128"]),
    "sidecar-not-an-object": ({}, _train_sidecar("val.bin.json", lambda m: [1, 2]),
                              "{data}/val.bin.json: ", []),
    "odd-head-width": (dict(d_model=30, num_heads=2), None, "--d_model=30", ["--num_heads=2", "15"]),
    "sidecar-not-utf8": ({}, lambda d: (d / "val.bin.json").write_bytes(b"\xff{}"), "{data}/val.bin.json: ", []),
    "sidecar-vocab_size-not-int": ({}, _train_sidecar("val.bin.json", lambda m: dict(m, vocab_size="abc")),
                                   "{data}/val.bin.json: ", ['"vocab_size"', "'abc'"]),
    "sidecar-vocab_size-0": ({}, _train_sidecar("val.bin.json", lambda m: dict(m, vocab_size=0)),
                             "{data}/val.bin.json: ", ['"vocab_size"', "0"]),
    "sidecar-eot_id-past-vocab": ({}, _train_sidecar("train.bin.json", lambda m: dict(m, eot_id=99999)),
                                  "{data}/train.bin.json: ", ['"eot_id"', "64", "99999"]),
    "sidecar-eot_id-equal-to-vocab": ({}, _train_sidecar("train.bin.json", lambda m: dict(m, eot_id=64)),
                                      "{data}/train.bin.json: ", ['"eot_id"', "64"]),
    "gpt2-tokenizer-of-another-size": ({}, _train_tokens_of("gpt2", 64), "{data}/train.bin.json: ",
                                       ["'gpt2'", "50257", "64"]),
    "token-id-past-vocab": ({}, lambda d: _train_write_tokens(d / "train.bin", [1, 2, 99, 3] * 100, 64),
                            "{data}/train.bin: ", ["99", "64"]),
    "token-id-equal-to-vocab": ({}, lambda d: _train_write_tokens(d / "train.bin", [1, 2, 64, 3] * 100, 64),
                                "{data}/train.bin: ", ["64", "64"]),
    "val-token-id-equal-to-vocab": ({}, lambda d: _train_write_tokens(d / "val.bin", [1, 2, 64, 3] * 100, 64),
                                    "{data}/val.bin: ", ["64", "64"]),
    "val-shorter-than-a-batch": ({}, lambda d: _train_write_tokens(d / "val.bin", _train_docs(64, 1), 64),
                                 "validation data", ["{data}/val.bin", "64", "65"]),   # (one token short)
    "train-shorter-than-a-batch": ({}, lambda d: _train_write_tokens(d / "train.bin", _train_docs(60, 1), 64),
                                   "training data", ["{data}/train.bin", "60", "65"]),
    "one-training-file-no-val": ({}, lambda d: [(d / n).unlink() for n in ("val.bin", "val.bin.json")], "{data}: ",
                                 []),
    "gpt2-hellaswag-file-missing": (dict(model="gpt2", vocab_size=50257, context_length=32, hellaswag=True,
                                         hellaswag_path="{tmp}/nope.jsonl"), _train_tokens_of("gpt2", 50257),
                                    "--hellaswag_path: ", ["{tmp}/nope.jsonl"]),
    "gpt2-lambada-file-missing": (dict(model="gpt2", vocab_size=50257, context_length=32, lambada=True,
                                       lambada_path="{tmp}/nope.jsonl"), _train_tokens_of("gpt2", 50257),
                                  "--lambada_path: ", ["{tmp}/nope.jsonl"]),
    "main-job-vocab-below-257": (dict(prepare_data=True, vocab_size=256, download=False), None, "--vocab_size",
                                 ["257", "256"]),
    **{f"gpt2-with-{'-'.join(kw)}": (dict(model="gpt2", **kw), None, "--", [f"--{k}={v}" for k, v in kw.items()] +
                                     ["--model=llama"])
       for kw in (dict(remove_rope=True), dict(ffn_type="silu", d_ff=999), dict(z_loss=1e-4, qk_norm=True),
                  dict(remove_rmsnorm=True, use_post_norm=True, rope_theta=500.0, tie_embeddings=True))},
    "llama-with-pad_vocab": (dict(pad_vocab="true"), None, "--pad_vocab=true", ["--model=gpt2"]),
    # every range a setting declares (its `check`), NaN and inf included, and a seed past numpy's 32 bits
    **{f"{name}={value}": ({name: value}, None, f"--{name} ", [repr(value).strip("'")]) for name, value in [
        ("batch_size", 0), ("batch_size", -4), ("context_length", 0), ("d_model", 0), ("num_layers", 0),
        ("num_heads", 0), ("d_ff", -1), ("eval_interval", 0), ("num_threads", -1), ("max_iters", -5),
        ("weight_decay", -1.0), ("warmup_iters", -10), ("grad_clip", -1.0), ("eval_tokens", -100),
        ("ckpt_interval", -1), ("num_samples", -1), ("learning_rate", -1.0), ("learning_rate", float("nan")),
        ("beta1", 1.5), ("min_lr_ratio", -2.0), ("top_p", 2.0), ("temperature", -1.0), ("temperature", float("inf")),
        ("sample_tokens", -3), ("time_budget", "-5m"), ("beta2", 1.0), ("beta1", -0.1), ("top_p", 0.0),
        ("min_lr_ratio", 1.5), ("rope_theta", 0.0), ("eps", -1e-8), ("eval_iters", 0), ("log_interval", 0),
        ("lr_decay_iters", -1), ("total_batch_tokens", -1), ("time_budget", "0s"), ("time_budget", "inf"),
        ("time_budget", "1e400m"), ("learning_rate", float("inf")),
        ("rope_theta", float("inf")), ("eps", float("inf")), ("weight_decay", float("inf")), ("seed", 2 ** 32)]},
}


@pytest.mark.parametrize("case", list(_TRAIN_REFUSALS))
def test_train_refuses_bad_settings_and_data_before_anything_is_written(tmp_path, _train_data, monkeypatch, case):
    # bad devices, token files, sidecars, ids, lengths, task files, settings: one line naming them, no out_dir made
    if case.startswith("gpt2-") and "with" not in case and not HAVE_GPT2_FILES:
        pytest.skip("GPT-2's tokenizer files are unavailable offline")
    settings, change, prefix, named = _TRAIN_REFUSALS[case]
    fill = lambda s: s.replace("{data}", str(_train_data)).replace("{tmp}", str(tmp_path)) if isinstance(s, str) else s
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    if change:
        change(_train_data)
    cfg = _train_cfg(_train_data, tmp_path / "o", **{"max_iters": 2, **{k: fill(v) for k, v in settings.items()}})
    message, named = _raises(train.train, cfg, log=_train_quiet), [fill(n) for n in named]
    _one_line_naming(message, fill(prefix), *named)
    if "-with-" not in case:   # (the other architecture's flags in the order it declares them)
        _named_in_order(message.removeprefix(fill(prefix)), *named)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag, more", [("--out_dir", []), ("--data_dir", []),
                                        ("--data_dir", ["--prepare_data=true", "--vocab_size=512"])])
def test_train_an_empty_folder_flag_is_refused_not_taken_as_the_current_folder(tmp_path, _train_data, monkeypatch,
                                                                               flag, more):
    # `--out_dir=` (a variable that was not set, say): one line naming the flag, nothing written where it runs
    monkeypatch.chdir(tmp_path)
    args = _train_main_args(_train_data, tmp_path / "o") + [f"{flag}=", *more]
    _one_line_naming(_exits(train.main, args), f"train.py: {flag} ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_train_takes_the_tokenizer_copied_with_its_data_and_one_tokenizer_named_by_two_paths(tmp_path, monkeypatch):
    # one tokenizer named two ways; the data copied, the original retrained: the copy beside the data is taken
    a = tmp_path / "a" / "data"
    a.mkdir(parents=True)
    _bpe_small_tokenizer(tmp_path, vocab_size=300).save_dir(a / "tok")
    monkeypatch.chdir(tmp_path / "a")
    for name, ref in (("train", "data/tok"), ("val", str(a / "tok"))):
        (tmp_path / f"{name}.txt").write_text(_bpe_synthetic_text(300, seed=len(name)), encoding="utf-8")
        bpe.encode_file(tmp_path / f"{name}.txt", ref, a / f"{name}.bin", num_workers=1)
    copy = tmp_path / "b" / "data"
    shutil.copytree(a, copy)
    (tmp_path / "other.txt").write_text(_bpe_synthetic_text(150, seed=7), encoding="utf-8")
    vocab, merges = bpe.train_bpe(tmp_path / "other.txt", 300, [_BPE_EOT], num_workers=1)
    bpe.Tokenizer(vocab, merges, [_BPE_EOT]).save_dir(a / "tok")
    s = train.train(_train_cfg(copy, tmp_path / "o", vocab_size=300, max_iters=1), log=_train_quiet)
    assert s["step"] == 1 and s["val_bpb"] is not None
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert ck["tokenizer"] == str(copy / "tok")
    assert ck["tokenizer_fingerprint"] == bpe.tokenizer_fingerprint(copy / "tok")


def test_train_without_a_val_file_holds_out_the_last_training_file(tmp_path, _train_data):
    # no val*.bin: the last train*.bin is validated on and not trained on, as when it is named val.bin
    d = _train_data
    ref = train.train(_train_cfg(d, tmp_path / "ref", max_iters=2), log=_train_quiet)
    for suffix in ("", ".json"):
        (d / f"val.bin{suffix}").rename(d / f"train_z.bin{suffix}")
    s = train.train(_train_cfg(d, tmp_path / "o", max_iters=2), log=_train_quiet)
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["train_files"] == [["train.bin", 30000]]
    assert s["val_loss"] == ref["val_loss"]
    # a single training file cannot be split so: refused, not scored on its own training text
    for suffix in ("", ".json"):
        (d / f"train_z.bin{suffix}").unlink()
    _one_line_naming(_raises(train.train, _train_cfg(d, tmp_path / "o2"), log=_train_quiet), f"{d}: ")
    assert not (tmp_path / "o2").exists()


# ---- the run: the model (from scratch or --init_from), what it must fit, its optimizer


def test_train_gpt2_model_with_padded_vocab_trains(tmp_path, _train_data):
    # --model=gpt2 --pad_vocab: the run trains GPT-2 and its checkpoint records the padding multiple (64)
    s = train.train(_train_cfg(_train_data, tmp_path / "o", model="gpt2", pad_vocab=True, max_iters=3,
                               eval_interval=3), log=_train_quiet)
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert ck["model_config"]["arch"] == "gpt2" and ck["model_config"]["pad_vocab_to_multiple_of"] == 64
    assert s["val_loss"] < math.log(64) + 0.5


def test_train_init_from_local_gpt2_weights(tmp_path, _train_data):
    # a tiny Hugging Face GPT-2 saved locally: the step-0 validation loss is transformers' on the same windows
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1,
                                                              n_head=2)).eval()
    hf.save_pretrained(tmp_path / "hf")
    other = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=1,
                                                                 n_head=2))
    other.save_pretrained(tmp_path / "hf97")  # a vocabulary that is not the data's: refused before anything is written
    message = _raises(train.train, _train_cfg(_train_data, tmp_path / "o97", model="gpt2",
                                              init_from=str(tmp_path / "hf97")), log=_train_quiet)
    _one_line_naming(message, f"--init_from={tmp_path / 'hf97'}: ", "97", "64")
    _named_in_order(message, "97", "64")   # the model's vocabulary, then the data's
    assert not (tmp_path / "o97").exists()
    s = train.train(_train_cfg(_train_data, tmp_path / "o", model="gpt2", init_from=str(tmp_path / "hf"),
                               max_iters=0), log=_train_quiet)
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iteration"] == 0  # no step: the weights still
    val = torch.from_numpy(np.fromfile(_train_data / "val.bin", dtype=np.uint16).astype(np.int64))
    n = 4 * 16
    losses = []
    with torch.no_grad():
        for i in range(2):   # the evaluator reads the validation tokens in order: windows of B*T+1
            buf = val[i * n: i * n + n + 1]
            x, y = buf[:-1].view(4, 16), buf[1:].view(4, 16)
            logits = hf(x).logits
            losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, 64), y.reshape(-1)))
    assert s["val_loss"] == pytest.approx(torch.stack(losses).mean().item(), abs=1e-4)


def test_train_check_token_range_scans_every_chunk_to_the_last_token(tmp_path):
    # an id >= vocab_size anywhere is found whichever chunk holds it (9 tokens: chunks [0, 4), [4, 8), [8, 9))
    for pos in range(9):
        arr = np.zeros(9, np.uint16)
        arr[pos] = 64
        _one_line_naming(_raises(runs.check_token_range, arr, 64, "f.bin", chunk=4), "f.bin: ", "64")
        runs.check_token_range(arr, 65, "f.bin", chunk=4)


def test_train_weight_decay_only_on_matrices(tmp_path, _train_data, monkeypatch):
    # every >= 2-D weight decays by --weight_decay, no 1-D parameter (norm gains, biases)
    built = []

    class Spy(train.AdamW):
        def __init__(self, params, **kw):
            super().__init__(params, **kw)
            built.append(self)
    monkeypatch.setattr(train, "AdamW", Spy)
    for model in ("llama", "gpt2"):
        built.clear()
        train.train(_train_cfg(_train_data, tmp_path / model, model=model, max_iters=1, weight_decay=0.25),
                    log=_train_quiet)
        (opt,) = built
        wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
        params = opt.param_groups[0]["params"] + opt.param_groups[1]["params"]
        assert all(wd[id(p)] == (0.25 if p.dim() >= 2 else 0.0) for p in params)
        assert {p.dim() >= 2 for p in params} == {True, False} and len(wd) == len({id(p) for p in params})


@pytest.mark.parametrize("warmup_iters, outlasts", [(5, True), (3, True), (2, False)])
def test_train_says_when_the_warmup_outlasts_the_schedule(tmp_path, _train_data, warmup_iters, outlasts):
    # 3 steps under a warmup of 5 or 3 never reach the peak lr: said once (warmup, length); a warmup of 2 does
    said = []
    s = train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=3, warmup_iters=warmup_iters), log=said.append)
    notes = [line for line in said if "--warmup_iters" in line]
    assert (s["last_lr"] != pytest.approx(3e-3)) == outlasts and len(notes) == outlasts
    if outlasts:
        _one_line_naming(notes[0], f"train.py: --warmup_iters={warmup_iters} ", "3")


# ---- the run: the loader and the evaluator (validation loss, bits per byte, samples, HellaSwag, LAMBADA)


def test_train_says_which_training_files_are_too_short_to_be_read(tmp_path, _train_data):
    _train_write_tokens(_train_data / "train_b.bin", _train_docs(40, 2), 64)  # < one batch of 4 x 16 + 1
    # (the sequential sampler skips it: said, rather than train on less data in silence)
    said = []
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=1), log=said.append)
    (note,) = [line for line in said if "train_b.bin" in line]
    _one_line_naming(note, "train.py: ", str(_train_data / "train_b.bin"), "65")
    assert str(_train_data / "train.bin") not in note


def test_train_eval_iters_never_reads_past_the_validation_file(tmp_path, _train_data):
    # a val file of 3 batches of tokens holds 2 batches of windows: asking for 10 evaluates those 2, no wrap-around
    _train_write_tokens(_train_data / "val.bin", np.fromfile(_train_data / "val.bin", dtype=np.uint16)[:3 * 4 * 16], 64)
    kw = dict(max_iters=1, learning_rate=0.0, warmup_iters=0)
    many = train.train(_train_cfg(_train_data, tmp_path / "a", eval_iters=10, **kw), log=_train_quiet)
    two = train.train(_train_cfg(_train_data, tmp_path / "b", eval_iters=2, **kw), log=_train_quiet)
    assert many["val_loss"] == two["val_loss"]


def test_train_eval_tokens_scores_the_same_text_at_any_batch_size(tmp_path, _train_data):
    # lr 0 keeps the initial weights, so any difference in val loss comes from the text scored
    kw = dict(max_iters=1, learning_rate=0.0, warmup_iters=0)
    val_loss = {}
    for B in (4, 8):
        for eval_tokens in (0, 8 * 16 * 3):  # 0: eval_iters=2 batches, i.e. 128 vs 256 tokens
            cfg = _train_cfg(_train_data, tmp_path / f"b{B}_{eval_tokens}", batch_size=B, eval_tokens=eval_tokens, **kw)
            val_loss[B, eval_tokens] = train.train(cfg, log=_train_quiet)["val_loss"]
    assert val_loss[4, 384] == pytest.approx(val_loss[8, 384], rel=1e-6)  # 6 x 64 and 3 x 128: the same 384 tokens
    assert abs(val_loss[4, 0] - val_loss[8, 0]) > 1e-4                      # without it, different text
    # not whole batches at every size, or more than the file holds: refused before anything is written
    bad = lambda n: _raises(train.train, _train_cfg(_train_data, tmp_path / "r", batch_size=8, eval_tokens=n, **kw),
                            log=_train_quiet)
    _one_line_naming(bad(500), "--eval_tokens=500 ", "128")
    _one_line_naming(bad(3072), "--eval_tokens=3,072", str(_train_data / "val.bin"), "2,999")
    assert not (tmp_path / "r").exists()
    # a file of exactly eval_tokens + 1 tokens holds them all (a token's target is the next one): the same loss
    _train_write_tokens(_train_data / "val.bin", _train_docs(385, 1), 64)   # the first 385 tokens of the 3,000
    s = train.train(_train_cfg(_train_data, tmp_path / "x", batch_size=8, eval_tokens=384, **kw), log=_train_quiet)
    assert s["val_loss"] == pytest.approx(val_loss[8, 384], rel=1e-6)


@needs_gpt2_files
def test_train_bits_per_byte_are_measured_on_the_scored_validation_file(tmp_path):
    # a first val file too short for one batch is skipped by the evaluator: bits/byte must use the file scored
    d = _train_token_folder(tmp_path / "data", 50257, "gpt2")
    _train_write_tokens(d / "val.bin", [40] * 10, 50257, tokenizer="gpt2")            # too short: skipped
    _train_write_tokens(d / "val_b.bin", _train_docs(3000, 1), 50257, tokenizer="gpt2")
    s = train.train(_train_cfg(d, tmp_path / "o", max_iters=1, eval_iters=2), log=_train_quiet)
    scored = np.fromfile(d / "val_b.bin", dtype=np.uint16)[1:2 * 4 * 16 + 1]
    bpt = train.bytes_per_token(bpe.load_tokenizer("gpt2"), scored, 0)  # the test data separates documents with 0
    assert s["val_bpb"] == pytest.approx(s["val_loss"] / math.log(2) / bpt, rel=1e-9)


def test_train_bits_per_byte_hand_computed_and_samples_of_a_prompt_cut_to_the_context(tmp_path):
    # one token per byte, 0 bytes per eot: bytes/token by hand, and every evaluation logs val_loss / ln 2 / it; a
    # sample prompt longer than the context is said once and cut, and each evaluation's record carries its samples
    d, tok = _train_byte_data(tmp_path)
    eot = tok.eot_id
    val = np.fromfile(d / "val.bin", dtype=np.uint16).tolist()
    n = 2 * 4 * 16                                   # eval_iters x batch_size x context_length targets
    assert val[0] == eot != val[n]                   # inputs val[:n] and targets val[1:n+1] differ by one eot
    targets = val[1:n + 1]
    bpt = sum(t != eot for t in targets) / len(targets)
    assert train.bytes_per_token(tok, targets, eot) == pytest.approx(bpt, rel=1e-12)
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no Python warning (two lines, with a source line) from generate()
        s = train.train(_train_cfg(d, tmp_path / "o", vocab_size=257, max_iters=2, eval_interval=1, eval_iters=2,
                                   num_samples=1, sample_tokens=2, sample_prompt="abcdefghijklmnopqrstuvwxyz"),
                        log=lines.append)
    evals = _train_records(tmp_path / "o", "eval")
    assert [r["step"] for r in evals] == [0, 1, 2]
    for r in evals:
        assert r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2) / bpt, rel=1e-9)
    assert s["val_bpb"] == pytest.approx(s["val_loss"] / math.log(2) / bpt, rel=1e-9)
    (note,) = [line for line in lines if "--sample_prompt" in line]
    _one_line_naming(note, "train.py: --sample_prompt", "26", "16")
    _named_in_order(note, "26", "16", "16")   # the prompt's length, the context's, the tokens kept
    assert len(s["samples"]) == 1 and s["samples"][0].startswith("klmnopqrstuvwxyz")
    assert [len(r["samples"]) for r in evals] == [1, 1, 1] and evals[-1]["samples"] == s["samples"]   # the last: s's


_TRAIN_LAMBADA_TEXTS = [
    "The old man took his fishing rod down to the river every morning and sat there until he caught a fish",
    "Mary baked a chocolate cake for her brother and put seven candles on the cake",
    "The children ran out into the yard and played until the teacher called them back into the classroom",
]


@needs_gpt2_files
@pytest.mark.parametrize("compiled", [False, True])
def test_train_scores_hellaswag_and_lambada_at_each_evaluation(tmp_path, compiled):
    # both tasks logged at every evaluation (compiled or not), the last equal to their evaluate() on the weights
    hs = _hs_write_rows(tmp_path / "hs.jsonl")
    lam = _lb_write(tmp_path / "lambada.jsonl", _TRAIN_LAMBADA_TEXTS)
    cfg = _train_cfg(_train_token_folder(tmp_path / "data", 50257, "gpt2"), tmp_path / "o", model="gpt2",
                     vocab_size=50257, context_length=64, max_iters=3, eval_interval=2, hellaswag=True,
                     hellaswag_path=str(hs), lambada=True, lambada_path=str(lam), compile=compiled,
                     compile_backend="aot_eager")
    train.train(cfg, log=_train_quiet)
    evals = _train_records(tmp_path / "o", "eval")
    assert [r["step"] for r in evals] == [0, 2, 3]
    assert all({"hellaswag_acc_norm", "lambada_acc", "lambada_ppl"} <= set(r) for r in evals)
    model = M.model_from_checkpoint(torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True))
    tok = bpe.load_tokenizer("gpt2")
    hs_result = hellaswag.evaluate(model, tok, hellaswag.load_examples(hs), "cpu")
    lam_result = lambada.evaluate(model, tok, lambada.load_examples(lam), "cpu")
    assert lam_result["num_total"] == 3 and hs_result["num_total"] == len(_HS_ROWS)
    assert evals[-1]["hellaswag_acc_norm"] == hs_result["acc_norm"]
    assert evals[-1]["lambada_acc"] == lam_result["acc"]
    assert evals[-1]["lambada_ppl"] == pytest.approx(lam_result["ppl"], rel=1e-4)
    assert 1 < evals[0]["lambada_ppl"] and evals[0]["lambada_ppl"] != evals[-1]["lambada_ppl"]


@needs_gpt2_files
def test_train_downstream_examples_the_context_cannot_hold_are_said_once_and_never_scored_as_zero(tmp_path):
    # a 4-token context: no HellaSwag ending fits (no figure, not 0.0), LAMBADA scores the 3 that fit; each said once
    tok = bpe.load_tokenizer("gpt2")
    assert all(max(len(tok.encode(" " + e)) for e in endings) >= 4 for _, _, endings in _HS_ROWS)
    hs = _hs_write_rows(tmp_path / "hs.jsonl")
    texts = _TRAIN_LAMBADA_TEXTS + ["Mary Poppins taught the children a long word: supercalifragilisticexpialidocious"]
    lam = _lb_write(tmp_path / "lambada.jsonl", texts)
    cfg = _train_cfg(_train_token_folder(tmp_path / "data", 50257, "gpt2"), tmp_path / "o", model="gpt2",
                     vocab_size=50257, context_length=4, max_iters=2, eval_interval=1, hellaswag=True,
                     hellaswag_path=str(hs), lambada=True, lambada_path=str(lam))
    said = []
    train.train(cfg, log=said.append)
    evals = _train_records(tmp_path / "o", "eval")
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert not any("hellaswag_acc_norm" in r for r in evals)
    model = M.model_from_checkpoint(torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True))
    lam_result = lambada.evaluate(model, tok, lambada.load_examples(lam), "cpu")
    assert (lam_result["num_total"], lam_result["num_skipped"]) == (3, 1)
    assert evals[-1]["lambada_acc"] == lam_result["acc"]
    assert evals[-1]["lambada_ppl"] == pytest.approx(lam_result["ppl"], rel=1e-4)
    (hs_note,) = [line for line in said if line.startswith("train.py: HellaSwag")]   # once each, not per evaluation
    (lam_note,) = [line for line in said if line.startswith("train.py: LAMBADA")]
    _one_line_naming(hs_note, "train.py: HellaSwag", "7 of 7", "4 tokens")
    _one_line_naming(lam_note, "train.py: LAMBADA", "1 of 4", "4 tokens", "3")


@pytest.mark.parametrize("tasks", [("hellaswag", "lambada"), ("hellaswag",), ("lambada",)])
def test_train_downstream_tasks_without_a_tokenizer_are_said_once_and_left_out(tmp_path, _train_data, tasks):
    # no tokenizer named: the run trains, says so once (either task alone too), and logs no task fields
    said = []
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=1, **dict.fromkeys(tasks, True)), log=said.append)
    (note,) = [line for line in said if line.startswith("train.py: ") and "tokenizer" in line]
    _one_line_naming(note, "train.py: ")
    evals = _train_records(tmp_path / "o", "eval")
    assert evals and all(set(r) == {"type", "step", "val_loss", "val_bpb", "elapsed"} for r in evals)


# ---- the run: its out_dir (one run at a time; a new run replaces the old one's checkpoint and log)


def test_train_two_runs_in_one_out_dir_are_refused(tmp_path, _train_data):
    # a second train.py on an out_dir in use would interleave its log and checkpoints with the first one's
    out = tmp_path / "o"
    held = runs.lock(out, "training run")   # what the first run holds while it trains
    try:
        message = _raises(train.train, _train_cfg(_train_data, out, max_iters=2), log=_train_quiet)
        _one_line_naming(message, f"{out}: ", str(out / ".lock"))
        assert not (out / "log.jsonl").exists()
    finally:
        held.close()
    train.train(_train_cfg(_train_data, out, max_iters=2), log=_train_quiet)   # free again: it trains
    train.train(_train_cfg(_train_data, out, max_iters=3, resume=True), log=_train_quiet)   # (released at the end)
    data = tmp_path / "fresh_data"   # two main jobs preparing one data folder: the second is refused, not crashed
    held = runs.lock(data, "train.py preparing its data")
    try:
        message = _raises(train.train, _train_cfg(data, tmp_path / "o2", prepare_data=True, vocab_size=300,
                                                  corpus_bytes=60000, download=False), log=_train_quiet)
        _one_line_naming(message, f"{data}: ", str(data / ".lock"))
        assert not (data / "train.bin").exists() and not (tmp_path / "o2").exists()
    finally:
        held.close()


def test_train_fresh_run_removes_the_old_runs_checkpoint_with_its_log(tmp_path, _train_data):
    # a new run truncates the old log: the old checkpoint goes too, or a crash would leave it to be resumed
    out = tmp_path / "o"
    train.train(_train_cfg(_train_data, out, max_iters=4), log=_train_quiet)
    said = []
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(_train_cfg(_train_data, out, fresh=True, max_iters=100), log=said.append,
                    on_step=_train_crash_at(2))
    assert not (out / "ckpt.pt").exists()
    train.train(_train_cfg(_train_data, out, max_iters=2), log=said.append)   # nothing to remove: said once
    (note,) = [line for line in said if line.startswith("train.py: ") and str(out) in line]
    _one_line_naming(note, "train.py: ", str(out))


def test_train_fresh_with_a_bad_task_file_keeps_the_old_run(tmp_path):
    # --fresh removes the old run's checkpoint and log only once every check has passed
    d, _ = _train_byte_data(tmp_path)
    out = tmp_path / "o"
    train.train(_train_cfg(d, out, vocab_size=257, max_iters=2), log=_train_quiet)
    log = (out / "log.jsonl").read_text()
    message = _raises(train.train, _train_cfg(d, out, vocab_size=257, fresh=True, lambada=True,
                                              lambada_path=str(tmp_path / "typo.jsonl")), log=_train_quiet)
    _one_line_naming(message, "--lambada_path: ", str(tmp_path / "typo.jsonl"))
    assert (out / "ckpt.pt").is_file() and (out / "log.jsonl").read_text() == log


# ---- the run: the loop (the optimizer step, clipping, the schedule, accumulation, checkpoints, log.jsonl)


def test_train_optimizer_steps_with_the_scheduled_lr_and_the_clipped_gradients(tmp_path, _train_data, monkeypatch):
    # the optimizer is handed the schedule's lr (not only logged) and gradients of norm min(pre-clip, --grad_clip)
    seen = []

    class Spy(train.AdamW):
        def step(self, closure=None):
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
            seen.append(([g["lr"] for g in self.param_groups], norm))
            return super().step(closure)
    monkeypatch.setattr(train, "AdamW", Spy)
    clip = 0.05
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=5, warmup_iters=2, log_interval=1,
                           learning_rate=1e-2, min_lr_ratio=0.1, grad_clip=clip), log=_train_quiet)
    logged = _train_records(tmp_path / "o", "train")
    assert len(seen) == len(logged) == 5
    for i, ((lrs, norm), r) in enumerate(zip(seen, logged)):
        want = train.get_lr_cosine_schedule(i, 1e-2, 1e-3, 2, 5)
        assert lrs == pytest.approx([want, want]) and r["lr"] == pytest.approx(want)
        assert norm == pytest.approx(min(r["grad_norm"], clip), rel=1e-4)
    assert any(r["grad_norm"] > clip for r in logged)   # the clip was reached (else this proves nothing)


def test_train_grad_clip_zero_means_no_clipping(tmp_path, _train_data):
    # --grad_clip=0: the run of a threshold never reached, not zeroed gradients; no norm computed, none logged
    kw = dict(max_iters=3, log_interval=1, learning_rate=1e-2)
    train.train(_train_cfg(_train_data, tmp_path / "off", grad_clip=0.0, **kw), log=_train_quiet)
    train.train(_train_cfg(_train_data, tmp_path / "big", grad_clip=1e9, **kw), log=_train_quiet)
    a, b = _train_weights(tmp_path / "off" / "ckpt.pt"), _train_weights(tmp_path / "big" / "ckpt.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["grad_norm"] for r in _train_records(tmp_path / "off", "train")] == [None] * 3
    assert all(r["grad_norm"] > 0 for r in _train_records(tmp_path / "big", "train"))


def test_train_lr_decay_iters_sets_the_cosine_length(tmp_path, _train_data):
    # the cosine reaches min_lr at lr_decay_iters (here before max_iters) and stays there
    cfg = _train_cfg(_train_data, tmp_path / "o", max_iters=6, warmup_iters=1, lr_decay_iters=3, log_interval=1,
                     learning_rate=1e-3, min_lr_ratio=0.1)
    s = train.train(cfg, log=_train_quiet)
    lrs = [r["lr"] for r in _train_records(tmp_path / "o", "train")]
    assert lrs == pytest.approx([train.get_lr_cosine_schedule(i, 1e-3, 1e-4, 1, 3) for i in range(6)])
    assert lrs[3:] == pytest.approx([1e-4] * 3) and s["lr"] == pytest.approx(1e-4)


def test_train_lr_schedule_wsd_reaches_the_optimizer_on_the_clock(tmp_path, _train_data):
    # under --time_budget the lr applied is WSD's at the clock's share (1 s steps, 10 s budget: step i at 10 i %)
    cfg = _train_cfg(_train_data, tmp_path / "o", time_budget="10s", max_iters=100, warmup_iters=10, log_interval=1,
                     learning_rate=1e-3, min_lr_ratio=0.1, lr_schedule="wsd", cooldown_frac=0.3)
    train.train(cfg, clock=_train_fake_clock(), log=_train_quiet)
    lrs = [r["lr"] for r in _train_records(tmp_path / "o", "train")]
    assert lrs == pytest.approx([train.get_lr_wsd_schedule(10 * i, 1e-3, 1e-4, 10, 100, 0.3) for i in range(10)])
    assert lrs[1:8] == pytest.approx([1e-3] * 7) and lrs[9] < lrs[8] < 1e-3   # stable until 70 %, then down


def test_train_z_loss_adds_the_squared_log_normaliser():
    m = _model_llama()
    ids = _model_ids(97)
    y = torch.roll(ids, -1, 1)
    loss = train.LossOf(m, "llama", z_loss=1e-2)(ids, y)
    loss.backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    logits = m(ids)
    ref = F.cross_entropy(logits.view(-1, 97), y.view(-1)) + 1e-2 * torch.logsumexp(logits, -1).pow(2).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for g, p in zip(got, m.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert train.LossOf(m, "llama")(ids, y) < loss   # off by default


def test_train_accumulation_matches_one_big_batch_and_logs_its_loss(tmp_path, _train_data):
    # 1 x (B=8) == 2 x (B=4) accumulated: the same weights, and the logged loss is over all micro-steps
    kw = dict(max_iters=4, log_interval=1)
    train.train(_train_cfg(_train_data, tmp_path / "a", batch_size=8, **kw), log=_train_quiet)
    train.train(_train_cfg(_train_data, tmp_path / "b", batch_size=4, total_batch_tokens=8 * 16, **kw),
                log=_train_quiet)
    a, b = _train_weights(tmp_path / "a" / "ckpt.pt"), _train_weights(tmp_path / "b" / "ckpt.pt")
    for k in a:   # float32 summation order differs; 4 AdamW steps keep it far below the update size (~lr)
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)
    a, b = _train_records(tmp_path / "a", "train"), _train_records(tmp_path / "b", "train")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5)
        assert rb["tokens"] == ra["tokens"] == ra["step"] * 8 * 16


def test_train_fetches_each_batch_while_the_micro_step_before_it_runs(tmp_path, _train_data, monkeypatch):
    # nanochat's order: forward of m, fetch of m+1, backward of m (a resume's position unchanged: the resume tests)
    events = []
    real_next, real_forward = runs.ReadAhead.next_batch, train.LossOf.forward

    def forward(self, x, y):
        loss = real_forward(self, x, y)
        events.append("forward")
        loss.register_hook(lambda grad: events.append("backward"))
        return loss
    monkeypatch.setattr(runs.ReadAhead, "next_batch", lambda self, d: (events.append("fetch"), real_next(self, d))[1])
    monkeypatch.setattr(train.LossOf, "forward", forward)
    train.train(_train_cfg(_train_data, tmp_path / "o", total_batch_tokens=128, max_iters=2), log=_train_quiet)
    assert events == ["fetch"] + ["forward", "fetch", "backward"] * 4   # 2 steps of 2 micro-steps


def test_train_checkpoints_at_every_evaluation_when_ckpt_interval_is_0(tmp_path, _train_data):
    # --ckpt_interval=0 writes ckpt.pt at every evaluation: a crash at step 8 (eval_interval 3) leaves step 6's (a
    # checkpoint at every step would leave step 7's)
    cfg = _train_cfg(_train_data, tmp_path / "o", max_iters=8, eval_interval=3, ckpt_interval=0)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(cfg, on_step=_train_crash_at(8), log=_train_quiet)
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iteration"] == 6


def test_train_log_records_carry_the_run_and_step_figures(tmp_path, _train_data, monkeypatch):
    # a config record, train records every log_interval and at the end, eval records; 1 s steps: exact figures
    monkeypatch.setattr(flops, "peak_flops", lambda device, dtype: 3e7)   # a peak that puts MFU near 30 %
    s = train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=6, log_interval=4), clock=_train_fake_clock(),
                    log=_train_quiet)
    cfg = _train_records(tmp_path / "o", "config")[0]
    n_params = sum(v.numel() for v in _train_weights(tmp_path / "o" / "ckpt.pt").values())
    assert (cfg["params"], cfg["world_size"], cfg["resumed_at_step"]) == (n_params, 1, None) == (s["params"], 1, None)
    rows = _train_records(tmp_path / "o", "train")
    assert [r["step"] for r in rows] == [4, 6]               # every log_interval steps, and the last step
    for r in rows:
        assert (r["tokens"], r["tokens_per_sec"], r["dt"], r["elapsed"]) == (r["step"] * 64, 64.0, 1.0, r["step"])
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and "lr" in r
        assert r["mfu"] == pytest.approx(flops.train_flops_per_token(cfg["model_config"], 16) * 64 / 3e7, rel=1e-12)
        assert 0.05 < r["mfu"] < 5
    ev = _train_records(tmp_path / "o", "eval")
    assert [(e["step"], e["elapsed"]) for e in ev] == [(0, 0.0), (6, 6.0)] and ev[-1]["val_loss"] == s["val_loss"]


# ---- the run: --time_budget (the clock ends the run and drives the schedule)


def test_train_time_budget_follows_injected_clock(tmp_path, _train_data):
    # --time_budget=10s, 1 s steps: the run stops after step 10 of 100, the schedule with it (cosine at 90 %)
    cfg = _train_cfg(_train_data, tmp_path / "o", time_budget="10s", max_iters=100, warmup_iters=0,
                     min_lr_ratio=0.1, learning_rate=1e-3)
    s = train.train(cfg, clock=_train_fake_clock(), log=_train_quiet)
    assert s["step"] == 10 and s["elapsed"] == pytest.approx(10.0)
    assert s["lr"] == pytest.approx(1e-4)                               # the schedule's end
    assert s["last_lr"] == pytest.approx(train.get_lr_cosine_schedule(90, 1e-3, 1e-4, 0, 100))
    rows = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    assert rows[-1]["type"] == "eval"                                  # it evaluates after stopping
    # the step the clock stopped it at is logged, though it is no multiple of log_interval (1000)
    assert [(r["step"], r["tokens"]) for r in rows if r["type"] == "train"] == [(10, 10 * 4 * 16)]


def test_train_time_budget_schedule_follows_steps_when_they_are_ahead_of_the_clock(tmp_path, _train_data):
    # max_iters reached before the budget: the schedule follows the steps (the further along), not the clock
    cfg = _train_cfg(_train_data, tmp_path / "o", time_budget="100s", max_iters=10, warmup_iters=2,
                     min_lr_ratio=0.1, learning_rate=1e-3)
    s = train.train(cfg, clock=_train_fake_clock(), log=_train_quiet)
    assert s["step"] == 10 and s["stopped_by"] == "max_iters" and s["elapsed"] == pytest.approx(10.0)
    assert s["last_lr"] == pytest.approx(train.get_lr_cosine_schedule(9, 1e-3, 1e-4, 2, 10))
    assert s["lr"] == pytest.approx(1e-4)


@pytest.mark.parametrize("compiled", [False, True])
def test_train_time_budget_leaves_a_compiled_runs_first_step_off_the_clock(tmp_path, _train_data, compiled):
    # compiling (inside the first step) neither spends the budget nor moves the clock's schedule (step 1 takes 61 s)
    cfg = _train_cfg(_train_data, tmp_path / "o", time_budget="20s", max_iters=1000, warmup_iters=10,
                     learning_rate=1e-3, log_interval=1, compile=compiled, compile_backend="eager")
    s = train.train(cfg, clock=_train_slow_first_step_clock(), log=_train_quiet)
    rows = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["lr"] for r in rows if r["type"] == "train"}
    if compiled:   # 20 one-second steps after the first; step 2 still warming up (the schedule at step 1)
        assert s["step"] == 21 and s["elapsed"] == pytest.approx(20.0)
        assert lr[2] == pytest.approx(train.get_lr_cosine_schedule(1, 1e-3, 1e-4, 10, 1000))
    else:          # eager: the slow first step is training time like any other, and spends the whole budget
        assert s["step"] == 1 and s["elapsed"] == pytest.approx(61.0)


class _FakeCudaEvent:
    """torch.cuda.Event on the CPU: record() reads the fake clock, elapsed_time() in ms, synchronize() counted."""
    clock, syncs = None, []

    def __init__(self, enable_timing=False):
        assert enable_timing

    def record(self):
        self.t = _FakeCudaEvent.clock()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0

    def synchronize(self):
        _FakeCudaEvent.syncs.append(self.t)


def test_train_on_cuda_the_clock_is_read_every_log_interval_and_where_the_budget_runs_out(monkeypatch):
    # runs.Pace on CUDA (events faked, 1 s steps): no sync per step; the clock read after step 1, every log_interval
    # (4) steps, and where the 10 s budget runs out: the run stops with exactly 10 s trained, as on the CPU
    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(_FakeCudaEvent, "clock", _train_fake_clock())
    monkeypatch.setattr(_FakeCudaEvent, "syncs", [])
    c = train.Settings(log_interval=4, eval_interval=1000, max_iters=100)
    pace, state = runs.Pace(None, torch.device("cuda"), False, c, 10.0, 1000), runs.RunState()
    stop, reads = runs.Stop(False, True), []
    while not state.finished(c.max_iters, 10.0):
        pace.step_started()
        state.step += 1
        pace.step_ended(counted=state.step > 1)
        if pace.due(state.step, stop):
            reads.append((state.step, pace.read(state, stop, True, "cpu"), state.elapsed))
    assert reads == [(1, 1.0, 0.0), (4, 1.0, 3.0), (8, 1.0, 7.0), (11, 1.0, 10.0)]
    assert len(_FakeCudaEvent.syncs) == 4


# ---- the run: torch.compile and precision


def test_train_compile_wraps_the_training_module_only(tmp_path, monkeypatch):
    # --compile=true wraps train.LossOf (the loss compiled too); evaluation and samples use the plain module
    d, _ = _train_byte_data(tmp_path)
    compiled, calls = [], []

    class FakeCompiled(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

        def forward(self, *a, **k):
            calls.append(torch.is_grad_enabled())
            return self._orig_mod(*a, **k)

    def fake_compile(m, backend="inductor", **kw):
        compiled.append((type(m).__name__, type(getattr(m, "module", None)).__name__, backend))
        return FakeCompiled(m)
    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = _train_cfg(d, tmp_path / "o", compile=True, compile_backend="aot_eager", max_iters=3, eval_interval=2,
                     num_samples=1, sample_tokens=4)
    s = train.train(cfg, log=_train_quiet)
    assert compiled == [("LossOf", "TransformerLM", "aot_eager")]   # the loss in the compiled graph with the model
    assert calls == [True] * 3                       # the 3 training steps; no evaluation, no sample
    assert len(s["samples"]) == 1 and len(_train_records(tmp_path / "o", "eval")) == 3


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_train_compiled_run_equals_the_eager_run(tmp_path, _train_data, arch):
    # compiled (aot_eager): the eager run's losses, weights, validation losses; its checkpoint loads and generates
    from sample import generate
    results = {}
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        cfg = _train_cfg(_train_data, out, model=arch, compile=compiled, compile_backend="aot_eager", max_iters=3,
                         eval_interval=2, log_interval=1)
        s = train.train(cfg, log=_train_quiet)
        results[compiled] = ([r["loss"] for r in _train_records(out, "train")], _train_weights(out / "ckpt.pt"),
                             [r["val_loss"] for r in _train_records(out, "eval")], s)
    (eager_losses, eager_w, eager_val, _), (losses, w, val, s) = results[False], results[True]
    assert len(losses) == 3 and losses == pytest.approx(eager_losses, rel=1e-5)
    assert all(torch.allclose(w[k], eager_w[k], atol=1e-5) for k in eager_w)
    assert s["step"] == 3 and len(val) == 3 and val == pytest.approx(eager_val, rel=1e-5)
    m = M.model_from_checkpoint(torch.load(tmp_path / "True" / "ckpt.pt", weights_only=True))
    assert len(generate(m, [[0, 5, 8]], 5, temperature=0)[0]) == 5   # (no stop token: all 5 new tokens)


def test_train_bf16_autocast_on_cpu_covers_training_and_evaluation(tmp_path, _train_data, monkeypatch):
    # --dtype=bfloat16 on CPU: training and evaluation under bf16 autocast; the CPU defaults run in float32
    seen = []
    real = M.lm_loss

    def spy(model, x, y, arch=None):
        seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))
        return real(model, x, y, arch=arch)
    monkeypatch.setattr(M, "lm_loss", spy)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        train.train(_train_cfg(_train_data, tmp_path / "a", max_iters=2, dtype="auto", tf32="auto"), log=_train_quiet)
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(precision)
    assert sorted(set(seen)) == [(False, False), (True, False)]          # eval (no grad) and training, float32
    seen.clear()
    s = train.train(_train_cfg(_train_data, tmp_path / "b", max_iters=2, dtype="bfloat16"), log=_train_quiet)
    assert set(seen) == {(True, torch.bfloat16), (False, torch.bfloat16)} and math.isfinite(s["val_loss"])


# ---- the command line: the flags and their checks (one line, before any work)


@pytest.mark.parametrize("name, value", [
    ("min_lr_ratio", 0.0), ("min_lr_ratio", 1.0), ("top_p", 1.0), ("beta1", 0.0), ("beta2", 0.0), ("temperature", 0.0),
    ("batch_size", 1), ("eval_interval", 1), ("log_interval", 1), ("d_ff", 0), ("max_iters", 0), ("grad_clip", 0.0),
    ("learning_rate", 0.0), ("seed", 0), ("seed", 2 ** 32 - 1), ("vocab_size", 256)])
def test_train_check_config_accepts_each_range_at_its_closed_ends(tmp_path, name, value):
    # closed ends are settings, not errors (a vocabulary of 256 too, for one's own data: 257 for the main job's)
    train.check_config(_train_cfg(tmp_path / "d", tmp_path / "o", **{name: value}))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--remove_rope=auto", "--fresh=auto", "--hellaswag=maybe"])
def test_train_plain_switches_are_true_or_false(capsys, flag):
    # a plain switch given auto: the parser's exit status 2, naming the flag and value; bare, a switch is on
    with pytest.raises(SystemExit) as e:
        train.get_config([flag])
    name, value = flag.split("=")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    _one_line_naming(err.split(": ", 1)[1], f"argument {name}: ", repr(value))
    assert train.get_config(["--compile=auto", "--remove_rope"])[0]["compile"] == "auto"
    assert train.get_config(["--remove_rope"])[0]["remove_rope"] is True


@pytest.mark.parametrize("text, seconds", [("90s", 90.0), ("45m", 2700.0), ("1.5h", 5400.0), ("600", 600.0),
                                           (" 2M ", 120.0), ("", None)])
def test_train_parse_duration_units(text, seconds):
    # --time_budget's units: s, m, h (any case, spaces around ignored), a bare number is seconds; "" is no budget
    assert runs.parse_duration(text) == seconds


def test_train_parse_duration_refuses_what_is_no_duration():
    _one_line_naming(_raises(runs.parse_duration, "soon"), "--time_budget", "'soon'")


def test_train_init_from_a_local_folder_expands_a_leading_tilde(tmp_path, monkeypatch):
    # a local Hugging Face folder has ~ expanded; OpenAI's release names and "scratch" pass through
    monkeypatch.setenv("HOME", str(tmp_path))
    for value, expected in (("~/hf-gpt2", f"{tmp_path}/hf-gpt2"), ("gpt2-xl", "gpt2-xl"), ("scratch", "scratch")):
        cfg, _ = train.get_config(["--model=gpt2", f"--init_from={value}"])
        assert cfg["init_from"] == expected


def test_train_and_stories_path_flags_expand_a_leading_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg, _ = train.get_config(["--out_dir=~/runs", "--data_dir=~/data", "--plot=~/log.jsonl", "--lambada_path=~/l",
                               "--hellaswag_path=~/h", "--sample_prompt=~/not a path"])
    assert [cfg[k] for k in ("out_dir", "data_dir", "plot", "lambada_path", "hellaswag_path", "sample_prompt")] == [
        f"{tmp_path}/runs", f"{tmp_path}/data", f"{tmp_path}/log.jsonl", f"{tmp_path}/l", f"{tmp_path}/h",
        "~/not a path"]
    monkeypatch.chdir(tmp_path)
    _run(stories, monkeypatch, "--out=~/s.txt", "--num_bytes=1000")
    assert (tmp_path / "s.txt").stat().st_size >= 1000 and not (tmp_path / "~").exists()


def _scripts_copy(tmp_path):
    """A copy of the project's scripts in tmp_path/clone, nothing beside it (no ../shared): a fresh clone's files."""
    copy = tmp_path / "clone"
    copy.mkdir()
    for f in ROOT.glob("*.py"):
        shutil.copy(f, copy)
    return copy


# runs `python SCRIPT ARGS` command lines in one interpreter (runpy): each one's exit code or message and stdout, JSON
_RUN_SCRIPTS = """
import contextlib, io, json, runpy, sys
sys.path.insert(0, "")
done = []
for argv in json.loads(sys.argv[1]):
    sys.argv, out, code = argv, io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as e:
            code = e.code or 0
    done.append([code, out.getvalue()])
print(json.dumps(done))
"""


def _run_scripts(cwd, *commands):
    """[(exit code or message, stdout)] of each command line (a list: script, args...) run in cwd, offline."""
    r = subprocess.run([sys.executable, "-c", _RUN_SCRIPTS, json.dumps([list(map(str, c)) for c in commands])],
                       cwd=cwd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_train_readme_hacking_diff_applies_and_its_command_trains_the_new_field(tmp_path, _train_data):
    # the README's Hacking diff applied with `git apply` to a copy of the scripts, then its command (tiny, 2 steps):
    # the new field is a flag with help and choices, stored in the checkpoint, Llama's only, and flops.py --ckpt counts
    # the LayerNorm biases, with no edit anywhere else
    hacking = (ROOT / "README.md").read_text().split("\n## Hacking\n", 1)[1].split("\n## ", 1)[0]
    diff = re.search(r"```diff\n(.*?)```", hacking, re.S).group(1)
    command = shlex.split(re.search(r"and then `python (train\.py [^`]*)`", hacking).group(1))
    out = dict(a[2:].split("=", 1) for a in command if a.startswith("--out_dir="))["out_dir"]
    copy = _scripts_copy(tmp_path)
    (tmp_path / "norm.diff").write_text(diff)
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)   # git apply: paths from the copy's root
    r = subprocess.run(["git", "apply", str(tmp_path / "norm.diff")], cwd=copy, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    quick = [a for a in _train_main_args(_train_data, "-") if not a.startswith("--out_dir")]
    (help_code, help_text), (code, _), (flops_code, flops_json), *refused = _run_scripts(
        copy, ["train.py", "--help"], command + quick, ["flops.py", f"--ckpt={out}/ckpt.pt", "--json"],
        command + quick + ["--norm=batchnorm"], command + quick + ["--out_dir=out/p", "--model=gpt2"])
    assert (help_code, code, flops_code) == (0, 0, 0) and "--norm" in help_text
    ckpt = torch.load(copy / out / "ckpt.pt", weights_only=True)
    assert ckpt["model_config"]["norm"] == ckpt["config"]["norm"] == "layernorm" and "ln_final.bias" in ckpt["model"]
    counted = json.loads(flops_json)["params"]
    assert counted["total"] == sum(t.numel() for t in ckpt["model"].values())
    assert counted["norm"] == 2 * (2 * 1 + 1) * 32   # weight and bias of ln1 and ln2 (1 layer) and of ln_final
    for (message, _), about, named in zip(refused, ("--norm", "--norm=layernorm"), ("'batchnorm'", "--model=llama")):
        _one_line_naming(message, f"train.py: {about}", named)   # its choices are checked (before the run in
        # --out_dir is compared with this one), and it is Llama's only
    assert not (copy / "out/p").exists()


@pytest.mark.parametrize("where", ["model", "run"])
def test_train_a_plain_dataclass_field_is_a_flag_too(tmp_path, _train_data, monkeypatch, capsys, where):
    # a plain field (`probe: bool = False`) in the model's config or TrainConfig is a flag too: in --help, stored
    import dataclasses
    module, name = (M, "TransformerLMConfig") if where == "model" else (train, "TrainConfig")

    @dataclasses.dataclass
    class WithProbe(getattr(module, name)):
        probe: bool = False
        probe_width: int = 3
    monkeypatch.setattr(module, name, WithProbe)
    with pytest.raises(SystemExit) as e:
        train.build_parser().parse_args(["--help"])
    listed = capsys.readouterr().out
    assert e.value.code == 0 and "--probe" in listed and "--probe_width" in listed
    train.main(_train_main_args(_train_data, tmp_path / "o") + ["--probe", "--probe_width=5"])
    ckpt = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert (ckpt["config"]["probe"], ckpt["config"]["probe_width"]) == (True, 5)
    if where == "model":
        assert (ckpt["model_config"]["probe"], ckpt["model_config"]["probe_width"]) == (True, 5)
        assert M.model_from_checkpoint(ckpt).config.probe_width == 5


_TRAIN_BAD_LOGS = {"torn.jsonl": b'{"type": "train", "step": 1, "loss": 2.0, "elapsed": 0.1}\n{"type": "train"\n',
                   "list.jsonl": b'{"type": "train", "step": 1, "loss": 2.0, "elapsed": 0.1}\n[1, 2]\n',
                   "binary.jsonl": b"\x80\x81\xfe binary",
                   "no-train.jsonl": b'{"type": "train", "step": 1}\n{"type": "eval", "step": 1, "elapsed": 0.1}\n'}

_TRAIN_CLI_REFUSALS = {   # case: (command line, the line's start, what it names); {d} is the test's folder, holding
    # data/ (_train_data), a_file, o/ (its log.jsonl a folder), the logs of _TRAIN_BAD_LOGS; {run}: a tiny 2-step run
    **{flag: (["--data_dir={d}/new", "--prepare_data=true", "--out_dir={d}/o2", "--d_model=32", "--num_heads=2",
               "--download=false", flag], f"train.py: {about}", named) for flag, about, named in [
        ("--model=gtp2", "--model", ["'gtp2'"]), ("--ffn_type=relu", "--ffn_type", ["'relu'"]),
        ("--attn_impl=flash", "--attn_impl", ["'flash'"]), ("--dtype=float16", "--dtype", ["'float16'"]),
        ("--num_heads=3", "--d_model=32", ["--num_heads=3"]), ("--seed=-1", "--seed", ["-1"]),
        ("--vocab_size=100", "--vocab_size", ["100", "257"]),
        ("--compile_backend=indcutor", "--compile_backend", ["'indcutor'"]),
        ("--total_batch_tokens=1000", "--total_batch_tokens=1,000", ["4,096"]),
        ("--eval_tokens=1000", "--eval_tokens=1,000", ["4,096"]),
        ("--init_from=gpt2", "--init_from=gpt2", ["--model=gpt2"]), ("--top_p=2", "--top_p", ["2.0"])]},
    # an --out_dir that is a file, or under one, or whose log.jsonl is a folder: the OS's reason, naming the path
    "out_dir-a-file": (["{run}", "--out_dir={d}/a_file"], "train.py: ", ["{d}/a_file"]),
    "out_dir-in-a-file": (["{run}", "--out_dir={d}/a_file/sub"], "train.py: ", ["{d}/a_file/sub"]),
    "log-a-folder": (["{run}", "--out_dir={d}/o"], "train.py: ", ["{d}/o/log.jsonl"]),
    "out_dir-under-proc": (["--out_dir=/proc/x"], "train.py: --out_dir /proc/x: ", ["/proc"]),   # (root's os.access
    # calls /proc writable)
    "resume-without-a-checkpoint": (["{run}", "--out_dir={d}/o3", "--resume=true"], "train.py: --resume",
                                    ["{d}/o3/ckpt.pt"]),
    # a missing, binary or broken log (naming the line), or one with no training record to draw
    "plot-missing": (["--plot={d}/missing.jsonl"], "train.py: ", ["{d}/missing.jsonl"]),
    **{f"plot-{name}": ([f"--plot={{d}}/{name}"], "train.py: ", [f"{{d}}/{name}", *(["line 2"] if line2 else [])])
       for name, line2 in (("torn.jsonl", True), ("list.jsonl", True), ("binary.jsonl", False),
                           ("no-train.jsonl", False))},
}


@pytest.mark.parametrize("case", list(_TRAIN_CLI_REFUSALS))
def test_train_cli_refuses_bad_input_before_any_work(tmp_path, _train_data, monkeypatch, case):
    # each check's one line naming the flag(s) and value, or the file, before data is prepared or anything written
    if "proc" in case and not os.path.isdir("/proc/self"):
        pytest.skip("Linux's /proc")
    argv, prefix, named = _TRAIN_CLI_REFUSALS[case]
    fill = lambda s: s.replace("{d}", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fineweb, "prepare_tinystories", _bpe_not_called)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "o" / "log.jsonl").mkdir(parents=True)
    for name, content in _TRAIN_BAD_LOGS.items():
        (tmp_path / name).write_bytes(content)
    written = lambda: {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*") if p.name != ".lock"}   # (a lock)
    before = written()
    run = _train_main_args(_train_data, tmp_path / "o")
    message = _exits(train.main, [x for a in argv for x in (run if a == "{run}" else [fill(a)])])
    _one_line_naming(message, fill(prefix), *map(fill, named))
    assert written() == before


# ---- the command line: presets


def test_train_presets_resolve_to_documented_values():
    # CS336's TinyStories baseline (40.96M tokens on CPU, 327.68M on GPU), OpenWebText, GPT-2 124M; a flag still wins
    cfg, _ = train.get_config(["--preset=tinystories-cpu"])
    assert (cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"], cfg["num_heads"],
            cfg["d_ff"], cfg["rope_theta"]) == (10000, 256, 512, 4, 16, 1344, 10000.0)
    assert cfg["batch_size"] * cfg["max_iters"] * cfg["context_length"] == 40_960_000
    ts, _ = train.get_config(["--preset=tinystories"])
    assert ts["batch_size"] * ts["max_iters"] * ts["context_length"] == 327_680_000
    owt, _ = train.get_config(["--preset=owt"])
    assert owt["vocab_size"] == 32000 and owt["d_model"] == 512 and owt["num_layers"] == 4
    g, _ = train.get_config(["--preset=gpt2-124m", "--batch_size=16"])    # flags still override
    assert g["model"] == "gpt2" and g["total_batch_tokens"] == 524288 and g["learning_rate"] == 6e-4
    assert (g["warmup_iters"], g["max_iters"], g["min_lr_ratio"], g["weight_decay"]) == (715, 19073, 0.1, 0.1)
    assert (g["beta1"], g["beta2"], g["grad_clip"], g["eval_interval"], g["hellaswag"]) == (0.9, 0.95, 1.0, 250, True)
    assert g["batch_size"] == 16 and train.grad_accum_steps(524288, 16, 1024, 8) == 4
    # build-nanogpt's token stream and warmup, its checkpoint interval; every other preset keeps the defaults
    assert (g["shuffle_first_epoch"], g["warmup_from_one"], g["ckpt_interval"]) == (False, True, 5000)
    assert all((train.get_config([f"--preset={p}"])[0][k], p) == (train.DEFAULTS[k], p) for p in train.PRESETS
               if p not in ("gpt2-124m", "gpt2-xl") for k in ("shuffle_first_epoch", "warmup_from_one",
                                                               "ckpt_interval"))
    xl, _ = train.get_config(["--preset=gpt2-xl"])   # OpenAI's 1.56B shape; GPT-3's 1.3B row: 2^20 tokens, lr 2e-4
    assert (xl["model"], xl["num_layers"], xl["d_model"], xl["num_heads"], xl["context_length"]) == (
        "gpt2", 48, 1600, 25, 1024)
    assert (xl["total_batch_tokens"], xl["learning_rate"], xl["fsdp"], xl["activation_checkpointing"]) == (
        2 ** 20, 2e-4, True, True)
    assert train.grad_accum_steps(2 ** 20, xl["batch_size"], 1024, 8) == 4
    assert 9.99e9 < xl["max_iters"] * 2 ** 20 <= 1e10   # FineWeb-Edu's 10B tokens once
    _one_line_naming(_exits(train.get_config, ["--preset=nope"]), "train.py: --preset", "'nope'", *train.PRESETS)
    # SPEC: the TinyStories baseline reaches 1.564 at lr_max 1e-3 (batch 32, 5,000 steps), 1.48 at batch 128
    for name, batch in (("tinystories-cpu", 32), ("tinystories", 128)):
        cfg, _ = train.get_config([f"--preset={name}"])
        assert (cfg["learning_rate"], cfg["batch_size"], cfg["time_budget"]) == (1e-3, batch, ""), name


def test_train_speedrun_presets_train_on_the_clock_with_their_recipe(tmp_path, _train_data):
    # a 5-minute budget the schedule follows, the recipe's switches (the weight average among them); speedrun-gpu's
    # tiny CPU smoke run
    cpu, _ = train.get_config(["--preset=speedrun-cpu"])
    assert (cpu["time_budget"], cpu["warmup_iters"] / cpu["max_iters"], cpu["vocab_size"], cpu["ema"]) == (
        "5m", 0.05, 4096, 0.995)
    assert (cpu["weight_decay"], cpu["tie_embeddings"]) == (0.5, True)   # against overfitting its 2 MiB of text
    assert train.scheduled_lr(cpu, 0, 150.0) > train.scheduled_lr(cpu, 0, 290.0)   # decaying by the clock
    assert "data/speedrun-4k" in train.PREPARE_COMMANDS["speedrun-cpu"] and cpu["data_dir"] == "data/speedrun-4k"
    tiny = ["--vocab_size=64", "--context_length=16", "--d_model=32", "--num_layers=1", "--num_heads=2", "--d_ff=64",
            "--batch_size=4", "--eval_tokens=128", "--max_iters=6", "--warmup_iters=2", "--time_budget=",
            "--device=cpu", "--num_samples=0", f"--data_dir={_train_data}", f"--out_dir={tmp_path / 'o'}"]
    cfg, _ = train.get_config(["--preset=speedrun-gpu", *tiny])
    s = train.train(cfg, log=_train_quiet)
    assert s["step"] == 6 and math.isfinite(s["val_loss"]) and (tmp_path / "o" / "ckpt.pt").is_file()
    assert isinstance(train.make_optimizer(M.load_model(s["ckpt"])[0], train.Settings(cfg), False), train.Muon) == (
        cfg["optimizer"] == "muon")


def test_train_speedrun_cpu_attends_from_primitives_and_chunks_its_loss_only_under_cpu_bf16(monkeypatch):
    # faster under bf16 on a CPU with it natively, slower in float32: the same capability check as --dtype=auto
    def picks(native, *flags):
        monkeypatch.setattr(M, "native_bf16", lambda device: native)
        cfg, _ = train.get_config(["--preset=speedrun-cpu", *flags])
        return cfg["attn_impl"], cfg["chunked_loss"]
    assert picks(True) == picks(True, "--dtype=bfloat16") == picks(False, "--dtype=bfloat16") == ("scratch", True)
    assert picks(False) == picks(True, "--dtype=float32") == picks(True, "--d_model=64") == ("sdpa", False)
    assert picks(True, "--attn_impl=sdpa") == ("sdpa", True) and picks(False, "--chunked_loss") == ("sdpa", True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # the preset on a GPU machine runs there
    assert picks(True) == ("sdpa", False)
    cfg, _ = train.get_config(["--preset=tinystories-cpu"])   # no other preset changes
    assert (cfg["attn_impl"], cfg["chunked_loss"]) == ("sdpa", False)


def test_train_speedrun_cpu_prepare_command_runs_on_a_fresh_clone(tmp_path, monkeypatch):
    # the printed preparation runs in a bare copy of the scripts (offline: stories.py's text, said); the preset trains
    command = train.PREPARE_COMMANDS["speedrun-cpu"]
    assert "shared" not in command and ".." not in command and "--vocab 4096" in command
    copy = _scripts_copy(tmp_path)
    command = command.replace("--vocab 4096", "--vocab 300").replace("python ", f"{shlex.quote(sys.executable)} ")
    r = subprocess.run(command, shell=True, cwd=copy, capture_output=True, text=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert len([line for line in r.stdout.splitlines() if "stories.py" in line and "compare" in line]) == 1
    monkeypatch.chdir(copy)
    s = train.train(train.get_config(["--preset=speedrun-cpu", "--d_model=32", "--num_layers=1", "--num_heads=2",
                                      "--d_ff=64", "--context_length=16", "--batch_size=4", "--eval_tokens=128",
                                      "--max_iters=2", "--warmup_iters=1", "--time_budget=", "--compile=false",
                                      "--num_samples=0", "--device=cpu"])[0], log=_train_quiet)
    assert s["step"] == 2 and math.isfinite(s["val_loss"]) and (copy / "out/speedrun-cpu/ckpt.pt").is_file()


def test_train_presets_run_in_their_own_folder_and_named_data_dirs_are_never_prepared(tmp_path):
    assert {train.get_config([f"--preset={p}"])[0]["out_dir"] for p in train.PRESETS} == {
        f"out/{p}" for p in train.PRESETS}                               # never the main job's out/ckpt.pt
    assert train.get_config(["--preset=owt", "--out_dir=o"])[0]["out_dir"] == "o"
    assert train.get_config([])[0]["prepare_data"] is True               # the main job builds its own data ...
    assert train.get_config(["--data_dir=d"])[0]["prepare_data"] is False  # ... but not in a folder named by hand
    assert train.get_config(["--data_dir=d", "--prepare_data=true"])[0]["prepare_data"] is True
    message = _exits(train.main, [f"--data_dir={tmp_path}/mine", f"--out_dir={tmp_path}/o", "--download=false"])
    _one_line_naming(message, f"train.py: {tmp_path}/mine: ", "--prepare_data=true")
    assert not (tmp_path / "mine").exists()


@pytest.mark.parametrize("preset", list(train.PREPARE_COMMANDS))
@pytest.mark.parametrize("folder", ["none", "my data"])
def test_train_preset_without_its_data_prints_the_command_that_prepares_it(tmp_path, preset, folder):
    # names the folder and ends with the preset's command for the folder --data_dir names (quoted): every path it
    # writes is in that folder, none in the preset's own; nothing written
    data_dir, own = f"{tmp_path}/{folder}", train.PRESETS[preset]["data_dir"]
    message = _exits(train.main, [f"--preset={preset}", f"--data_dir={data_dir}", f"--out_dir={tmp_path}/o"])
    first, *_, command = message.splitlines()
    assert first.startswith(f"train.py: {data_dir}: ")
    words = shlex.split(command)
    outs = [w.removeprefix("--out_dir=") for w in words if w.startswith("--out_dir=")] + [
        b for a, b in zip(words, words[1:]) if a == "--out"]
    assert outs and all(o == data_dir or o.startswith(f"{data_dir}/") for o in outs) and own not in command
    assert words == [w.replace(own, data_dir) for w in shlex.split(train.PREPARE_COMMANDS[preset])]
    assert not (tmp_path / "o").exists()


# ---- the command line: main() (its errors, its summary, its output, --plot) and the main job end to end


def test_train_next_commands_quote_a_path_with_a_space(tmp_path, _train_data, capsys):
    # the summary's commands paste into a shell as they are: a path with a space is one argument
    out = tmp_path / "my run"
    train.main(_train_main_args(_train_data, out))
    cmds = _train_next_commands(capsys.readouterr().out)
    assert shlex.split(cmds[0])[2:] == [f"--ckpt={out / 'ckpt.pt'}", "--top_p", "0.9"]
    assert shlex.split(cmds[1])[2:] == [f"--plot={out / 'log.jsonl'}"]


def test_train_output_piped_into_a_reader_that_leaves_does_not_stop_training(tmp_path, _train_data):
    # `python train.py | head -3`: the run goes on to its end and its checkpoint (log.jsonl keeps every line)
    args = _train_main_args(_train_data, tmp_path / "o") + ["--max_iters=30", "--log_interval=1", "--num_threads=1"]
    p = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=300) == 0, err[-2000:]
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iteration"] == 30


def test_train_plot_draws_one_png_of_one_or_several_runs_and_trains_nothing(tmp_path, _train_finished_run):
    # one log: curves.png beside it; several, comma-separated: compare.png beside the first; nothing else written
    pytest.importorskip("matplotlib")
    _, out = _train_copy_run(_train_finished_run, tmp_path)
    shutil.copytree(out, tmp_path / "b")
    before = _files(out)
    train.main([f"--plot={out / 'log.jsonl'}"])
    after = _files(out)
    assert after.pop(out / "curves.png")[:8] == b"\x89PNG\r\n\x1a\n" and after == before
    assert runs.plot_log(f"{out / 'log.jsonl'},{tmp_path / 'b' / 'log.jsonl'}") == [str(out / "compare.png")]
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    message = _raises(runs.plot_log, f"{out / 'log.jsonl'},{tmp_path / 'missing.jsonl'}")
    _one_line_naming(message, "--plot ", "missing.jsonl")


def test_train_plot_of_no_log_names_the_flag(tmp_path, monkeypatch):
    # `--plot=,` (a list of no files) is one line naming --plot, before matplotlib is imported
    monkeypatch.chdir(tmp_path)
    _one_line_naming(_exits(train.main, ["--plot=,"]), "train.py: --plot ")
    assert list(tmp_path.iterdir()) == []


def test_train_plot_draws_the_train_and_validation_curves(tmp_path, monkeypatch):
    # the training loss and the validation loss, each against the step and against the training time
    pytest.importorskip("matplotlib")
    import matplotlib.axes
    drawn = []
    real = matplotlib.axes.Axes.plot

    def plot(self, x, y, *a, **k):
        drawn.append((list(x), list(y), k.get("label")))
        return real(self, x, y, *a, **k)
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    rows = [dict(type="config"), dict(type="train", step=2, loss=3.0, elapsed=0.5),
            dict(type="train", step=4, loss=2.5, elapsed=1.0), dict(type="eval", step=4, val_loss=2.7, elapsed=1.0)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs.plot_log(tmp_path / "log.jsonl")
    series = [(x, y) for x, y, _ in drawn]
    # the raw loss and its running mean, the validation loss, by step and by minutes; no lr in this log: empty
    assert series[:6] == [([2, 4], [3.0, 2.5]), ([2, 4], [2.75, 2.75]), ([4], [2.7]),
                          ([0.5 / 60, 1.0 / 60], [3.0, 2.5]), ([0.5 / 60, 1.0 / 60], [2.75, 2.75]), ([1.0 / 60], [2.7])]
    assert [label for _, _, label in drawn[:2]] == [None, tmp_path.name]   # a run is named by its log's folder


def test_train_plot_leaves_out_records_missing_a_figure(tmp_path):
    # a hand-edited log's records without a step, time or loss are left out of the curves rather than fail the plot
    pytest.importorskip("matplotlib")
    log = tmp_path / "log.jsonl"
    log.write_text('{"type": "train", "step": 1, "loss": 2.0, "elapsed": 0.1}\n{"type": "train", "step": 2}\n'
                   '{"type": "eval", "step": 2, "val_loss": 1.9}\n')
    assert runs.plot_log(log) == [str(tmp_path / "curves.png")]


def test_train_main_job_end_to_end_offline_and_rerun_reuses(tmp_path, capsys, monkeypatch):
    # stories -> tokenizer -> tokens -> steps -> checkpoint -> sample, tiny; a rerun reuses it all; --fresh redoes it
    made = []   # the preparation steps that did work: stories written, a tokenizer trained, token files encoded

    def counted(name, real):
        def step(*a, **k):
            made.append(name)
            return real(*a, **k)
        return step
    for module, name in ((stories, "write_corpus"), (bpe, "train_bpe"), (fineweb, "write_token_file")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    prepared_all = ["train_bpe", "write_corpus", "write_token_file"]
    args = [f"--data_dir={tmp_path}/data", "--prepare_data=true", f"--out_dir={tmp_path}/out", "--download=false",
            "--corpus_bytes=60000",
            "--vocab_size=300", "--d_model=32", "--num_layers=1", "--num_heads=2", "--context_length=32",
            "--batch_size=4", "--max_iters=4", "--eval_interval=2", "--eval_iters=2", "--sample_tokens=8",
            "--time_budget=", "--num_threads=1"]
    out_dir, ckpt = tmp_path / "out", tmp_path / "out" / "ckpt.pt"
    train.main(args)
    assert sorted(set(made)) == prepared_all
    assert (tmp_path / "data" / "train.bin").is_file() and (tmp_path / "data" / "tokenizer").is_dir()
    ck = torch.load(ckpt, weights_only=True)
    assert ck["iteration"] == 4 and ck["tokenizer"].endswith("tokenizer") and ck["val_loss"] is not None
    assert ck["model_config"]["arch"] == "llama" and ck["config"]["d_model"] == 32
    evals = _train_records(out_dir, "eval")   # its own tokenizer: bits/byte and samples at every evaluation
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(r["val_bpb"] is not None and r["samples"][0].startswith("Once upon a time") for r in evals)
    assert _train_next_commands(capsys.readouterr().out)[0].startswith("python sample.py ")
    made.clear()
    train.main(args)                                                   # the rerun reuses everything
    assert made == [] and torch.load(ckpt, weights_only=True)["iteration"] == 4
    assert [r["resumed_at_step"] for r in _train_records(out_dir, "config")] == [None, 4]
    assert [r["step"] for r in _train_records(out_dir, "train")] == [4]   # no training step was repeated
    message = _exits(train.main, args + ["--d_model=64"])   # never resumes a different run
    _one_line_naming(message, f"train.py: {ckpt} ", "d_model", "32", "64")
    _named_in_order(message, "d_model", "32", "64")   # the checkpoint's value, then the new one
    train.main(args + ["--fresh", "--max_iters=1"])                    # --fresh starts over, the data's steps too
    assert sorted(set(made)) == prepared_all and torch.load(ckpt, weights_only=True)["iteration"] == 1
    made.clear()
    train.main(args + ["--max_iters=2"])                               # ... once: the next run resumes and reuses
    ck = torch.load(ckpt, weights_only=True)
    assert made == [] and ck["iteration"] == 2 and ck["config"]["fresh"] is False
    assert [r["resumed_at_step"] for r in _train_records(out_dir, "config")] == [None, 1]
    (tmp_path / "w").mkdir()
    monkeypatch.chdir(tmp_path / "w")   # the main job's own folders (a tiny run): it suggests the next preset, its data
    capsys.readouterr()
    train.main([a for a in args if not a.startswith(("--data_dir", "--out_dir"))])
    assert _train_next_commands(capsys.readouterr().out) == [
        "python sample.py --top_p 0.9", "python train.py --plot=out/log.jsonl",
        "python train.py --preset=tinystories-cpu", train.PREPARE_COMMANDS["tinystories-cpu"]]
    message = _exits(train.main, ["--preset=tinystories-cpu"])   # beside the main job's out/ckpt.pt: its own data
    assert message.splitlines()[-1].strip() == train.PREPARE_COMMANDS["tinystories-cpu"]
    assert not Path("out/tinystories-cpu").exists()


def test_train_log_records_the_time_left(tmp_path, _train_data):
    # each step takes 1 s (fake clock): the time left is the steps left at that pace, or the budget left if sooner
    train.train(_train_cfg(_train_data, tmp_path / "a", max_iters=6, log_interval=1), clock=_train_fake_clock(),
                log=_train_quiet)
    assert [r["time_left"] for r in _train_records(tmp_path / "a", "train")] == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    train.train(_train_cfg(_train_data, tmp_path / "b", max_iters=60, log_interval=1, time_budget="4s"),
                clock=_train_fake_clock(), log=_train_quiet)
    assert [r["time_left"] for r in _train_records(tmp_path / "b", "train")] == [3.0, 2.0, 1.0, 0.0]


def test_train_deterministic_switch_turns_on_deterministic_algorithms(tmp_path, _train_data, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = []
    try:
        train.train(_train_cfg(_train_data, tmp_path / "o", deterministic=True, max_iters=2),
                    on_step=lambda s: seen.append(torch.are_deterministic_algorithms_enabled()), log=_train_quiet)
        assert seen == [True, True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
    train.train(_train_cfg(_train_data, tmp_path / "p", max_iters=1), log=_train_quiet)
    assert not torch.are_deterministic_algorithms_enabled()


# ==== train.py: resume, stop requests and DDP: exact resume against a straight run, Ctrl-C / SIGTERM, 2 ranks vs 1


def _train_schedule_notes(lines):
    """What a resumed run says about its learning-rate schedule: its notes that compare it with the checkpoint's."""
    return [line for line in lines if line.startswith("train.py: ") and "checkpoint's run" in line]


# ---- resume's building blocks: the loader's position, the RNGs, the log lines kept


def test_train_sequential_sampler_shuffles_documents_and_resumes():
    # documents move whole, each epoch in another order; the position resumes exactly; ranks interleave windows
    docs = _train_docs(4000, 3)
    shards = [("a", np.asarray(docs[:2000], np.uint16), {}), ("b", np.asarray(docs[2000:], np.uint16), {})]
    s = runs.SequentialSampler(shards, 2, 8, seed=0, eot_id=0)
    first_epoch = [s.next_batch("cpu")[0] for _ in range(3)]
    for x in first_epoch:                                             # documents stay intact: +3 (mod 63) inside
        for row in x.tolist():
            for a, b in zip(row, row[1:]):
                assert b == 0 or a == 0 or b == (a + 2) % 63 + 1
    while s.epoch == 0:
        s.next_batch("cpu")
    state = s.state_dict()
    later = [s.next_batch("cpu")[0] for _ in range(3)]
    assert not all(torch.equal(a, b) for a, b in zip(first_epoch, later))   # epoch 1 reads another order
    s2 = runs.SequentialSampler(shards, 2, 8, seed=0, eot_id=0)
    s2.load_state_dict(state)
    assert all(torch.equal(a, s2.next_batch("cpu")[0]) for a in later)    # resumes at the exact position
    # two ranks read disjoint halves of what one rank with twice the batch reads
    one = runs.SequentialSampler(shards, 2, 8, 0, 1, seed=5, eot_id=0)
    r0 = runs.SequentialSampler(shards, 1, 8, 0, 2, seed=5, eot_id=0)
    r1 = runs.SequentialSampler(shards, 1, 8, 1, 2, seed=5, eot_id=0)
    for _ in range(5):
        assert torch.equal(one.next_batch("cpu")[0], torch.cat([r0.next_batch("cpu")[0], r1.next_batch("cpu")[0]]))


def test_train_sequential_sampler_resumes_inside_a_later_shard():
    # a position in the second shard of an epoch: the resumed reader continues in that shard, not in the first
    docs = _train_docs(4000, 3)
    shards = [("a", np.asarray(docs[:1500], np.uint16), {}), ("b", np.asarray(docs[1500:], np.uint16), {})]
    s = runs.SequentialSampler(shards, 2, 8, seed=0, eot_id=0)
    for _ in range(3):
        while s.shard == 0:
            s.next_batch("cpu")
        for _ in range(5):
            s.next_batch("cpu")
        state = s.state_dict()
        assert state["shard"] == 1 and state["pos"] > 0
        later = [s.next_batch("cpu")[0] for _ in range(4)]
        s2 = runs.SequentialSampler(shards, 2, 8, seed=0, eot_id=0)
        s2.load_state_dict(state)
        assert all(torch.equal(a, s2.next_batch("cpu")[0]) for a in later)
        while s.shard == 1:
            s.next_batch("cpu")


def test_train_rng_state_round_trip_restores_python_numpy_and_torch():
    # every generator back where it was (the loop draws from none, so the resume tests cannot see this)
    state = runs.rng_state()
    want = (random.random(), np.random.rand(), torch.rand(3))
    runs.set_rng_state(state)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == want[0] and got[1] == want[1] and torch.equal(got[2], want[2])


def test_train_cuda_rng_state_is_this_processs_gpu_only(monkeypatch):
    # only the current GPU's generator: a resume that sees fewer GPUs (or is another rank) still loads
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.tensor([7], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state.tolist()))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("every GPU's state saved"))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("every GPU's state set"))
    state = runs.rng_state()
    assert state["cuda"].tolist() == [7]
    runs.set_rng_state(state)
    assert restored == [[7]]


def test_train_resume_drops_torn_and_non_object_log_lines():
    # a resumed run keeps the log's records up to its step; later ones, a line torn mid-write, a non-object go
    assert runs.kept_on_resume('{"type": "train", "step": 4}', 4)
    for line in ('{"type": "train", "step": 5}', '{"type": "train", "step": 3, "lo', "[1, 2]", "7"):
        assert not runs.kept_on_resume(line, 4), line


# ---- resume: bit for bit the uninterrupted run


@pytest.mark.parametrize("optimizer, sampler, budget, ema", [
    ("adamw", "sequential", "", 0), ("muon", "sequential", "", 0.9), ("adamw", "random", "", 0),
    ("adamw", "sequential", "8s", 0)])
def test_train_resume_is_bit_identical(tmp_path, _train_data, optimizer, sampler, budget, ema):
    # crashed after step 6, resumed from 4: step 8 bit for bit (--ema: the average and the trained weights); under
    # --time_budget, the budget left is spent
    kw = dict(max_iters=100 if budget else 8, ckpt_interval=4, optimizer=optimizer, sampler=sampler,
              time_budget=budget, warmup_iters=0 if budget else 2, ema=ema)
    straight = train.train(_train_cfg(_train_data, tmp_path / "a", **kw), clock=_train_fake_clock(), log=_train_quiet)
    cfg = _train_cfg(_train_data, tmp_path / "b", **kw)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(cfg, clock=_train_fake_clock(), on_step=_train_crash_at(6), log=_train_quiet)
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["iteration"] == 4
    resumed = train.train(dict(cfg, resume=True), clock=_train_fake_clock(), log=_train_quiet)
    assert straight["step"] == resumed["step"] == 8
    assert not budget or straight["elapsed"] == resumed["elapsed"] == pytest.approx(8.0)
    a, b = (torch.load(tmp_path / run / "ckpt.pt", weights_only=True) for run in "ab")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])                     # bit for bit
    assert ("trained_weights" in a) == bool(ema)
    assert all(torch.equal(a["trained_weights"][k], b["trained_weights"][k]) for k in a.get("trained_weights", {}))


def test_train_resume_restores_the_global_rngs_after_building_the_model(tmp_path, _train_data, monkeypatch):
    # the generators are restored after the model is rebuilt: on_step draws the straight run's numbers
    peaks = {}
    monkeypatch.setattr(flops, "_cpu_peak_cache", peaks)

    def drawing(out, crash_at=None):
        def on_step(step):
            out.append((step, random.random(), float(np.random.rand()), torch.rand(()).item()))
            if step == crash_at:
                raise RuntimeError("simulated crash")
        return on_step
    straight, crashed, resumed = [], [], []
    kw = dict(max_iters=4, ckpt_interval=2, log_interval=1)   # MFU from the first step on
    train.train(_train_cfg(_train_data, tmp_path / "a", **kw), on_step=drawing(straight), log=_train_quiet)
    cfg = _train_cfg(_train_data, tmp_path / "b", **kw)
    peaks.clear()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(cfg, on_step=drawing(crashed, crash_at=3), log=_train_quiet)
    peaks.clear()
    train.train(dict(cfg, resume=True), on_step=drawing(resumed), log=_train_quiet)
    assert peaks and crashed == straight[:3] and [s for s, *_ in resumed] == [3, 4]
    assert resumed == straight[2:]


def test_train_time_budget_leaves_a_resumed_compiled_runs_first_step_off_the_clock(tmp_path, _train_data, monkeypatch):
    # a resumed run compiles again in its first step: that step is off the clock too (not only a fresh run's step 1)
    monkeypatch.setattr(torch, "compile", lambda m, **k: m)   # --compile=true without the compiler: only the clock
    cfg = _train_cfg(_train_data, tmp_path / "o", time_budget="20s", max_iters=1000, warmup_iters=0, ckpt_interval=4,
                     compile=True)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(cfg, clock=_train_slow_first_step_clock(), on_step=_train_crash_at(5), log=_train_quiet)
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert ck["iteration"] == 4 and ck["elapsed"] == pytest.approx(3.0)   # steps 2-4 counted, step 1 not
    s = train.train(dict(cfg, resume=True), clock=_train_slow_first_step_clock(), log=_train_quiet)
    assert s["step"] == 4 + 1 + 17 and s["elapsed"] == pytest.approx(20.0)   # step 5 off the clock, 6-22 on it


def test_train_resume_with_fused_adamw_is_fused(tmp_path, _train_data, monkeypatch):
    # our AdamW's checkpoint resumed with --fused=true: torch's AdamW, fused in every group (not None)
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=2), log=_train_quiet)
    seen = []

    class Spy(torch.optim.AdamW):
        def step(self, *a, **k):
            seen.append([g["fused"] for g in self.param_groups])
            return super().step(*a, **k)
    monkeypatch.setattr(torch.optim, "AdamW", Spy)
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=3, fused=True, resume=True), log=_train_quiet)
    assert seen == [[True, True]]


def test_train_resumes_a_moved_copy_of_its_data_and_continues_on_other_data_only_when_asked(tmp_path, _train_data,
                                                                                           capsys):
    # a moved copy of the data resumes as the uninterrupted run; other files under the same names are another run's:
    # --resume=auto stops, naming the checkpoint, both sizes and the ways on, nothing touched; --resume=true
    # continues the model on them from their beginning, and says so
    train.main(_train_main_args(_train_data, tmp_path / "straight") + ["--max_iters=4"])
    train.main(_train_main_args(_train_data, tmp_path / "o"))
    moved = tmp_path / "moved"
    shutil.move(_train_data, moved)
    train.main(_train_main_args(moved, tmp_path / "o") + ["--max_iters=4", "--resume=true"])
    assert _train_weights(tmp_path / "o" / "ckpt.pt").keys() == _train_weights(tmp_path / "straight" / "ckpt.pt").keys()
    for k, v in _train_weights(tmp_path / "straight" / "ckpt.pt").items():
        assert torch.equal(v, _train_weights(tmp_path / "o" / "ckpt.pt")[k]), k
    with open(moved / "train.bin", "ab") as f:   # the same names, one file longer
        f.write(np.zeros(100, np.uint16).tobytes())
    meta = json.loads((moved / "train.bin.json").read_text())
    (moved / "train.bin.json").write_text(json.dumps(dict(meta, num_tokens=meta["num_tokens"] + 100)))
    files = [*moved.iterdir(), *(tmp_path / "o").iterdir()]
    before = {p: p.read_bytes() for p in files}
    message = _exits(train.main, _train_main_args(moved, tmp_path / "o") + ["--max_iters=6"])
    _one_line_naming(message, f"train.py: {tmp_path / 'o' / 'ckpt.pt'} ", str(moved), "30,000", "30,100",
                     "--out_dir", "--fresh", "--resume=true")
    _named_in_order(message, "30,000", "30,100")   # the checkpoint's files, then the folder's
    assert {p: p.read_bytes() for p in files} == before
    capsys.readouterr()
    train.main(_train_main_args(moved, tmp_path / "o") + ["--max_iters=6", "--resume=true"])
    (note,) = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("train.py: ") and "30,100" in line]
    _one_line_naming(note, f"train.py: {tmp_path / 'o' / 'ckpt.pt'} ", str(moved), "30,000")
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert ck["iteration"] == 6 and ck["train_files"] == [["train.bin", 30100]]
    assert ck["loader"]["pos"] == 2 * 4 * 16   # the 2 steps since: read from the new files' start


# ---- resume: the log and the last evaluation


def test_train_resume_log_has_each_record_once_and_survives_a_torn_line(tmp_path, _train_data):
    # a crash after step 6 and a torn log line: every record once, the straight run's figures, a second config record
    kw = dict(max_iters=8, ckpt_interval=4, eval_interval=2, log_interval=1)
    train.train(_train_cfg(_train_data, tmp_path / "a", **kw), log=_train_quiet)
    cfg = _train_cfg(_train_data, tmp_path / "b", **kw)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(cfg, on_step=_train_crash_at(6), log=_train_quiet)
    with open(tmp_path / "b" / "log.jsonl", "a") as f:
        f.write('{"type": "train", "step": 7, "lo')
    train.train(dict(cfg, resume=True), log=_train_quiet)

    def records(run):
        return [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
    a, b = records("a"), records("b")
    for kind, steps in (("train", list(range(1, 9))), ("eval", [0, 2, 4, 6, 8])):
        assert [r["step"] for r in b if r["type"] == kind] == steps
        assert [r.get("loss", r.get("val_loss")) for r in b if r["type"] == kind] == \
            [r.get("loss", r.get("val_loss")) for r in a if r["type"] == kind]
    assert [r["resumed_at_step"] for r in b if r["type"] == "config"] == [None, 4]


def test_train_resume_rewrites_the_log_atomically_and_clears_stale_checkpoint_temps(tmp_path, _train_data, monkeypatch):
    # the kept lines go to a temp file renamed over log.jsonl: a full disk leaves the old log, not a truncated one; a
    # SIGKILL right after a resume starts leaves the kept log lines on disk, and the temp files of saves cut short by
    # such kills are removed
    out = tmp_path / "o"
    train.train(_train_cfg(_train_data, out, max_iters=4, ckpt_interval=2, log_interval=1), log=_train_quiet)
    before = (out / "log.jsonl").read_text()
    real_open = open

    def disk_full(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if "w" in mode and Path(path).name.startswith("log.jsonl"):
            f.close()   # opened for writing (so emptied), then nothing more fits
            raise OSError(28, "No space left on device")
        return f
    monkeypatch.setattr(runs, "open", disk_full, raising=False)
    with pytest.raises(OSError, match="No space left"):
        train.train(_train_cfg(_train_data, out, max_iters=6, ckpt_interval=2, log_interval=1, resume=True),
                    log=_train_quiet)
    assert (out / "log.jsonl").read_text() == before
    monkeypatch.undo()
    (out / "ckpt.pt.tmp4242").write_bytes(b"half a checkpoint")
    on_disk = []

    class FakeWandb:   # wandb.init runs after the log is set up and before anything is recorded: look at the disk
        @staticmethod
        def init(**kw):
            on_disk.append((out / "log.jsonl").read_text())
            return types.SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb)
    train.train(_train_cfg(_train_data, out, max_iters=6, ckpt_interval=2, log_interval=1, resume=True, wandb=True),
                log=_train_quiet)
    assert on_disk == [before] and before.count("\n") >= 6   # the config, 4 train and 2 eval records
    assert not list(out.glob("*.tmp*"))


def test_train_resume_at_a_checkpoint_without_an_evaluation_evaluates_it(tmp_path, _train_data):
    # resumed from a ckpt_interval checkpoint with max_iters lowered to it: that step's loss, not an older one
    straight = train.train(_train_cfg(_train_data, tmp_path / "a", max_iters=3), log=_train_quiet)
    cfg = _train_cfg(_train_data, tmp_path / "b", max_iters=6, ckpt_interval=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(cfg, on_step=_train_crash_at(5), log=_train_quiet)
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["val_step"] == 0
    s = train.train(dict(cfg, resume=True, max_iters=3), log=_train_quiet)
    assert s["step"] == 3 and s["val_loss"] == straight["val_loss"]
    assert [r["step"] for r in _train_records(tmp_path / "b", "eval")] == [0, 3]


def test_train_resume_at_its_evaluated_step_reports_the_checkpoints_loss_and_without_its_log_starts_one(tmp_path,
                                                                                                        _train_data):
    # resumed at its evaluated step: the checkpoint's loss, no new evaluation; a deleted log: resumed into a new one
    out = tmp_path / "o"
    first = train.train(_train_cfg(_train_data, out, max_iters=4), log=_train_quiet)
    again = train.train(_train_cfg(_train_data, out, max_iters=4, resume=True), log=_train_quiet)
    assert first["val_loss"] is not None
    assert (again["step"], again["val_loss"], again["val_step"]) == (4, first["val_loss"], 4)
    (out / "log.jsonl").unlink()
    assert train.train(_train_cfg(_train_data, out, max_iters=5, resume=True), log=_train_quiet)["step"] == 5
    assert [r["resumed_at_step"] for r in _train_records(out, "config")] == [4]
    assert [r["step"] for r in _train_records(out, "eval")] == [5]


def test_train_resume_from_a_step_0_checkpoint_keeps_its_log(tmp_path, _train_data, capsys):
    # --max_iters=0, then on: the step-0 evaluation kept once, the resume recorded, no schedule warning
    args = _train_main_args(_train_data, tmp_path / "o")
    train.main(args + ["--max_iters=0"])
    capsys.readouterr()
    train.main(args + ["--max_iters=3"])
    assert _train_schedule_notes(capsys.readouterr().out.splitlines()) == []
    recs = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    assert [(r["type"], r.get("step")) for r in recs if r["type"] != "train"] == [
        ("config", None), ("eval", 0), ("config", None), ("eval", 3)]
    assert [r["resumed_at_step"] for r in recs if r["type"] == "config"] == [None, 0]


# ---- resume: what it may change (and says about the schedule), what it refuses before any step


def test_train_resume_with_a_longer_cosine_says_so(tmp_path, _train_data):
    # a larger --max_iters stretches the cosine: one line naming the flag that keeps it; with it given, quiet
    lines = []
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=3), log=_train_quiet)
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=5, resume=True), log=lines.append)
    (note,) = _train_schedule_notes(lines)
    _one_line_naming(note, "train.py: ", "step 5", "3", "--lr_decay_iters=3")
    _named_in_order(note, "step 5", "3", "--lr_decay_iters=3")   # the new end, the old one, the flag that keeps it
    lines.clear()
    train.train(_train_cfg(_train_data, tmp_path / "o", max_iters=7, lr_decay_iters=5, resume=True),
                log=lines.append)
    assert _train_schedule_notes(lines) == []
    assert [r["resumed_at_step"] for r in _train_records(tmp_path / "o", "config")] == [None, 3, 5]


def test_train_resume_under_a_budget_says_when_the_clock_moves_the_schedule(tmp_path, _train_data):
    # under --time_budget another --max_iters or budget moves the lr: one line from what to what; kept, nothing said
    kw = dict(time_budget="20s", max_iters=20, lr_decay_iters=20, warmup_iters=2, log_interval=1, ckpt_interval=5)
    train.train(_train_cfg(_train_data, tmp_path / "full", **kw), clock=_train_fake_clock(), log=_train_quiet)
    full = {r["step"]: r["lr"] for r in _train_records(tmp_path / "full", "train")}
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(_train_cfg(_train_data, tmp_path / "cut", **kw), clock=_train_fake_clock(), log=_train_quiet,
                    on_step=_train_crash_at(6))
    # (one note only: no "pass --lr_decay_iters" hint under a budget, that flag alone does not keep the schedule there)
    for change, named in [({}, None), (dict(max_iters=40), ["--max_iters", "40"]),
                          (dict(max_iters=40, lr_decay_iters=0), ["--max_iters", "40", "--lr_decay_iters"]),
                          (dict(time_budget="10s"), ["--time_budget", "10s"]),
                          (dict(time_budget="40s"), None)]:   # (the steps stay ahead of the clock: no change)
        out = tmp_path / ("resumed" + "_".join(map(str, change.values())))
        shutil.copytree(tmp_path / "cut", out)
        lines = []
        train.train(_train_cfg(_train_data, out, **{**kw, **change}, resume=True), clock=_train_fake_clock(),
                    log=lines.append)
        notes = _train_schedule_notes(lines)
        lr = {r["step"]: r["lr"] for r in _train_records(out, "train")}[6]   # the lr of step 6, set at step 5
        if named is None:
            assert notes == [] and lr == pytest.approx(full[6])
        else:   # the note names the changes, the step and both learning rates
            assert len(notes) == 1 and lr != pytest.approx(full[6])
            _one_line_naming(notes[0], "train.py: ", "--time_budget", *named)
            _named_in_order(notes[0], "step 5", f"{lr:.3g}", f"{full[6]:.3g}")   # the new rate, then the old one


def test_train_fresh_wins_over_resume_true(tmp_path, _train_finished_run):
    # (--resume=true without a checkpoint: refused, in the command line's table)
    data, out = _train_copy_run(_train_finished_run, tmp_path)
    train.main(_train_main_args(data, out) + ["--resume=true", "--fresh", "--max_iters=1"])
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["iteration"] == 1 and [r["resumed_at_step"] for r in _train_records(out, "config")] == [None]


def test_train_resuming_a_preset_run_keeps_its_overrides(tmp_path, _train_data):
    # naming the same preset again does not put its values back over the first run's own flags
    first = ["--preset=tinystories", f"--data_dir={_train_data}", f"--out_dir={tmp_path / 'o'}", "--d_model=32",
             "--num_layers=1", "--num_heads=2", "--d_ff=64", "--context_length=16", "--batch_size=4", "--max_iters=2",
             "--warmup_iters=1", "--eval_iters=2", "--learning_rate=5e-4", "--time_budget=45m", "--device=cpu",
             "--compile=false", "--num_samples=0"]
    train.main(first)
    train.main(["--preset=tinystories", f"--out_dir={tmp_path / 'o'}", "--resume", "--max_iters=3"])
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert ck["iteration"] == 3
    assert {k: ck["config"][k] for k in ("d_model", "learning_rate", "time_budget", "max_iters")} == \
        dict(d_model=32, learning_rate=5e-4, time_budget="45m", max_iters=3)
    message = _exits(train.main, ["--preset=tinystories", f"--out_dir={tmp_path / 'o'}", "--resume",
                                  "--learning_rate=1e-3"])   # a setting given again and changed: named alone
    _one_line_naming(message, f"train.py: {tmp_path / 'o' / 'ckpt.pt'} ", "learning_rate", "0.0005", "0.001")
    _named_in_order(message, "learning_rate", "0.0005", "0.001")
    assert not any(k in message for k in ("d_model", "batch_size", "max_iters", "warmup_iters"))


def test_train_resume_takes_an_explicit_prepare_data_flag(tmp_path):
    # a flag given on resume applies over the checkpoint's settings, --prepare_data too
    d = _train_token_folder(tmp_path / "data", 300)   # a 300-id vocabulary: --prepare_data needs >= 257
    args = [a for a in _train_main_args(d, tmp_path / "o") if a != "--vocab_size=64"] + ["--vocab_size=300"]
    train.main(args)
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["config"]["prepare_data"] is False
    train.main(args + ["--max_iters=3", "--prepare_data=true"])
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert ck["iteration"] == 3 and ck["config"]["prepare_data"] is True


def test_train_a_folder_named_on_the_command_line_is_never_written_whatever_out_dir_holds(tmp_path, monkeypatch):
    # out/ckpt.pt of the main job, then --data_dir=data/x of another vocabulary: neither prepared nor resumed; --fresh
    monkeypatch.chdir(tmp_path)
    small = ["--download=false", "--corpus_bytes=60000", "--vocab_size=300", "--d_model=32", "--num_layers=1",
             "--num_heads=2", "--context_length=32", "--batch_size=4", "--max_iters=2", "--eval_iters=2",
             "--num_samples=0", "--time_budget=", "--num_threads=1"]
    train.main(small)
    assert torch.load("out/ckpt.pt", weights_only=True)["config"]["prepare_data"] is True
    fineweb.prepare_tinystories("data/x", vocab_size=280, allow_download=False, corpus_bytes=50000, log=_train_quiet)
    mine, run = _files("data/x"), _files("out")
    for resume in ([], ["--resume=true"]):
        message = _exits(train.main, ["--data_dir=data/x", *resume])
        _one_line_naming(message, f"train.py: {Path('out/ckpt.pt')}", "data/x", "300", "280")
        assert ("--fresh" in message) and ("--resume=true" not in message)
        assert _files("data/x") == mine and _files("out") == run
    train.main(["--data_dir=data/x", "--fresh", *small])
    train.main(["--data_dir=data/x", "--max_iters=3"])
    assert [r["resumed_at_step"] for r in _train_records(Path("out"), "config")] == [None, 2]
    assert torch.load("out/ckpt.pt", weights_only=True)["iteration"] == 3 and _files("data/x") == mine


def test_train_main_job_never_prepares_over_text_it_did_not_make(tmp_path):
    # --prepare_data=true on a folder of someone's own text (no prepared.json): one line naming it and the ways on,
    # before anything there is written
    d = tmp_path / "mine"
    d.mkdir()
    (d / "train.txt").write_text("my own text")
    (d / "val.txt").write_text("mine")
    message = _exits(train.main, [f"--data_dir={d}", "--prepare_data=true", f"--out_dir={tmp_path / 'o'}",
                                  "--download=false", "--corpus_bytes=6000", "--vocab_size=280", "--max_iters=2",
                                  "--time_budget=", "--num_samples=0", "--device=cpu"])
    _bad_says(message, f"train.py: {d}: ", "train.txt", "val.txt", "--data_dir", "--prepare_data=true", "--fresh")
    assert {p: b for p, b in _files(d).items() if p.name != ".lock"} == {   # (the lock held while it looked)
        d / "train.txt": b"my own text", d / "val.txt": b"mine"}


def test_train_resume_asking_for_another_corpus_is_refused_before_the_data_is_rewritten(tmp_path):
    # out_dir's run was trained on the data prepared: another --corpus_bytes would re-prepare it, then refuse the
    # resume; it is refused first, in one line naming both sizes and the checkpoint, data and run untouched
    d, out = tmp_path / "d", tmp_path / "o"
    run = [f"--data_dir={d}", "--prepare_data=true", f"--out_dir={out}", "--download=false", "--corpus_bytes=60000",
           "--vocab_size=300", "--d_model=32", "--num_layers=1", "--num_heads=2", "--context_length=32",
           "--batch_size=4", "--max_iters=2", "--eval_iters=2", "--num_samples=0", "--time_budget=", "--num_threads=1",
           "--device=cpu", "--compile=false"]
    train.main(run)
    data, ckpt = _files(d), _files(out)
    message = _exits(train.main, run + ["--corpus_bytes=40000", "--max_iters=3"])
    _bad_says(message, f"train.py: {d}: ", "60000", "40000", out / "ckpt.pt", "--fresh")
    assert _files(d) == data and _files(out) == ckpt
    train.main(run + ["--max_iters=3"])   # the same request: resumed on the data as it is
    assert torch.load(out / "ckpt.pt", weights_only=True)["iteration"] == 3 and _files(d) == data
    # the folder prepared again elsewhere with another size: the run's own request makes its data again, and resumes
    fineweb.prepare_tinystories(d, vocab_size=300, allow_download=False, log=_train_quiet, corpus_bytes=40000)
    assert _files(d) != data
    train.main(run + ["--max_iters=4"])
    assert torch.load(out / "ckpt.pt", weights_only=True)["iteration"] == 4 and _files(d) == data


@pytest.fixture(scope="module")
def _train_finished_run(tmp_path_factory):
    """_train_data's folder and a finished 2-step run on it, made once: each test resumes a copy (_train_copy_run)."""
    base = tmp_path_factory.mktemp("finished_run")
    _train_two_steps(_train_token_folder(base / "data"), base / "o")
    return base


def _train_copy_run(base, tmp_path):
    for name in ("data", "o"):
        shutil.copytree(base / name, tmp_path / name)
    return tmp_path / "data", tmp_path / "o"


def _train_ckpt_edit(change):
    """A change to the finished run: its ckpt.pt rewritten as change(the checkpoint)."""
    return lambda data, out: torch.save(change(torch.load(out / "ckpt.pt", weights_only=True)), out / "ckpt.pt")


_TRAIN_RESUME_REFUSALS = {   # case: (train.train's settings over _train_cfg(resume=True, max_iters=4), or main()'s
    # command line; a change to the data or the run first; the line's start; what it names, in order). {data}, {out}:
    # copies of _train_finished_run (2 layers of width 32, 4 x 16 tokens a step)
    "another-batch_size": (["--resume", "--max_iters=3", "--batch_size=8"], None, "train.py: {out}/ckpt.pt ",
                           ["batch_size", "4", "8", "--fresh"]),
    "another-accumulation": (["--resume", "--max_iters=3", "--total_batch_tokens=128"], None,
                             "train.py: {out}/ckpt.pt ", ["total_batch_tokens", "0", "128", "--fresh"]),
    "another-preset": (["--preset=tinystories-cpu", "--resume", "--max_iters=3", "--device=cpu", "--compile=false"],
                       None, "train.py: {out}/ckpt.pt ", ["context_length", "16", "256", "d_model", "32", "512"]),
    "a-bad-sample-flag": (["--resume", "--max_iters=4", "--sample_tokens=-3"], None, "train.py: --sample_tokens",
                          ["-3"]),
    "weights-of-another-width": ({}, _train_ckpt_edit(lambda ck: dict(ck, model_config=dict(ck["model_config"],
                                                                                            d_model=64))),
                                 "{out}/ckpt.pt: ", ["token_embeddings.weight", "(64, 32)", "(64, 64)"]),
    "weights-of-another-architecture": ({}, _train_ckpt_edit(lambda ck: dict(ck, model_config=dict(
        arch="gpt2", vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))), "{out}/ckpt.pt: ",
                                        ["llama", "gpt2"]),
    "data-of-another-vocabulary": ({}, lambda data, out: [_train_sidecar(n, lambda m: dict(m, vocab_size=80))(data)
                                                          for n in ("train.bin.json", "val.bin.json")],
                                   "{out}/ckpt.pt: ", ["64", "{data}", "80"]),
    "a-longer-context": (dict(context_length=17), None, "--context_length=17 ", ["16"]),   # (one position more)
    "a-data-position-gone": ({}, _train_ckpt_edit(lambda ck: dict(ck, loader=dict(ck["loader"], shard=3))),
                             "{out}/ckpt.pt: ", ["{data}", "--fresh"]),
    "another-number-of-processes": ({}, _train_ckpt_edit(lambda ck: dict(ck, loader=[ck["loader"]] * 2)),
                                    "{out}/ckpt.pt ", ["2", "1"]),
    "a-short-validation-file": ({}, lambda data, out: _train_write_tokens(data / "val.bin", _train_docs(50, 1), 64),
                                "validation data", ["{data}/val.bin", "50", "65"]),
}


@pytest.mark.parametrize("case", list(_TRAIN_RESUME_REFUSALS))
def test_train_resume_refuses_what_would_not_continue_the_run(tmp_path, _train_finished_run, case):
    # what would make it another run, a bad flag, weights or data that do not fit: one line, no step, nothing changed
    data, out = _train_copy_run(_train_finished_run, tmp_path)
    how, change, prefix, named = _TRAIN_RESUME_REFUSALS[case]
    fill = lambda s: s.replace("{data}", str(data)).replace("{out}", str(out))
    if change:
        change(data, out)
    kept, steps = _files(out), []
    if isinstance(how, list):
        with pytest.raises(SystemExit) as e:
            train.main([f"--data_dir={data}", f"--out_dir={out}", *how])
    else:
        with pytest.raises(ValueError) as e:
            train.train(_train_cfg(data, out, resume=True, max_iters=4, **how), log=_train_quiet, on_step=steps.append)
    named = [fill(n) for n in named]
    _one_line_naming(str(e.value), fill(prefix), *named)
    _named_in_order(str(e.value).removeprefix(fill(prefix)), *named)
    assert _files(out) == kept and not steps


def test_train_check_same_run_takes_only_the_same_files_under_the_same_tokenizer():
    # --resume=auto continues only these files (names, sizes) under this tokenizer; --resume=true goes on with any
    files = [["train.bin", 1000]]
    ckpt = dict(train_files=files, tokenizer_fingerprint="aa", model_config=dict(vocab_size=300), config={})
    same = types.SimpleNamespace(train_files=files, fingerprint="aa", vocab_size=300)
    auto, true = types.SimpleNamespace(resume="auto", data_dir="d"), types.SimpleNamespace(resume=True, data_dir="d")
    runs.check_same_run(ckpt, same, auto, "o/ckpt.pt")
    for other in (dict(fingerprint="bb"), dict(train_files=[["train.bin", 999]])):
        data = types.SimpleNamespace(**{**vars(same), **other})
        _bad_says(_raises(runs.check_same_run, ckpt, data, auto, "o/ckpt.pt"), "o/ckpt.pt ", "--fresh")
        runs.check_same_run(ckpt, data, true, "o/ckpt.pt")


# ---- stop requests: Ctrl-C and SIGTERM finish the step, write a checkpoint and stop


def test_train_ctrl_c_and_sigterm_checkpoint_without_an_extra_evaluation_and_resume_exactly(tmp_path, _train_data):
    # a stop request after step 3 (Ctrl-C: the SIGINT handler called; SIGTERM: sent for real): the step finishes, the
    # checkpoint is written at once, without the final evaluation, so the resumed run evaluates at the straight run's
    # steps and ends with its weights
    import signal
    before = signal.getsignal(signal.SIGTERM)
    kw = dict(max_iters=6, eval_interval=2)
    train.train(_train_cfg(_train_data, tmp_path / "a", **kw), log=_train_quiet)
    a = _train_weights(tmp_path / "a" / "ckpt.pt")
    for by, stop in (("ctrl-c", lambda: runs.Stop.handler(None, None)),
                     ("SIGTERM", lambda: os.kill(os.getpid(), signal.SIGTERM))):
        cfg = _train_cfg(_train_data, tmp_path / by, **kw)
        s = train.train(cfg, on_step=lambda step: step == 3 and stop(), log=_train_quiet)
        assert s["interrupted"] and s["stopped_by"] == by and s["step"] == 3
        assert signal.getsignal(signal.SIGTERM) is before
        ck = torch.load(tmp_path / by / "ckpt.pt", weights_only=True)
        assert ck["iteration"] == 3 and ck["val_step"] == 2
        assert [r["step"] for r in _train_records(tmp_path / by, "eval")] == [0, 2]
        s = train.train(dict(cfg, resume=True), log=_train_quiet)
        assert not s["interrupted"] and s["stopped_by"] == "max_iters"
        assert [r["step"] for r in _train_records(tmp_path / by, "eval")] == \
            [r["step"] for r in _train_records(tmp_path / "a", "eval")] == [0, 2, 4, 6]
        b = _train_weights(tmp_path / by / "ckpt.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), by
    # a stop request at the last step changes nothing: the run is finished, not cut short
    s = train.train(_train_cfg(_train_data, tmp_path / "c", max_iters=2),
                    on_step=lambda step: step == 2 and os.kill(os.getpid(), signal.SIGTERM), log=_train_quiet)
    assert not s["interrupted"] and s["stopped_by"] == "max_iters"


def test_train_restores_the_sigint_handler_and_a_second_ctrl_c_aborts_without_a_checkpoint(tmp_path, _train_data):
    # train()'s Ctrl-C handler is the loop's only (the caller's is back, even on an abort); a second Ctrl-C aborts
    import signal
    before = signal.getsignal(signal.SIGINT)
    train.train(_train_cfg(_train_data, tmp_path / "a", max_iters=1), log=_train_quiet)
    assert signal.getsignal(signal.SIGINT) is before

    def twice(step):
        if step == 2:
            runs.Stop.handler(None, None)
            runs.Stop.handler(None, None)
    with pytest.raises(KeyboardInterrupt):
        train.train(_train_cfg(_train_data, tmp_path / "b", max_iters=6, ckpt_interval=100), on_step=twice,
                    log=_train_quiet)
    assert not (tmp_path / "b" / "ckpt.pt").exists() and signal.getsignal(signal.SIGINT) is before


def test_train_main_exits_130_after_ctrl_c(tmp_path, _train_data, monkeypatch, capsys):
    # checkpointed but cut short: a script running train.py (experiments.py) must not take it as a finished run
    real_train = train.train
    monkeypatch.setattr(train, "train", lambda cfg, **kw: real_train(cfg, on_step=lambda step: step == 2 and
                                                                     runs.Stop.handler(None, None), **kw))
    args = _train_main_args(_train_data, tmp_path / "o") + ["--max_iters=6"]
    with pytest.raises(SystemExit) as e:
        train.main(args)
    out = capsys.readouterr().out
    assert e.value.code == 130 and torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iteration"] == 2
    # no evaluation at the stop: the summary names the step, what stopped it, and its validation loss's step
    (summary,) = [line for line in out.splitlines() if "ctrl-c" in line and "step 2" in line]
    assert set(re.findall(r"\bstep (\d+)", summary)) == {"2", "0"}
    cmds = _train_next_commands(out)   # the first suggestion continues the run; the preset's is the main job's only
    assert shlex.split(cmds[0]) == ["python", "train.py", "--resume", f"--out_dir={tmp_path / 'o'}"]
    assert not any("--preset" in cmd for cmd in cmds)
    train.main(shlex.split(cmds[0])[2:])  # the command it suggests resumes to the end: a normal exit,
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iteration"] == 6   # evaluated at its last step
    out = capsys.readouterr().out
    (summary,) = [line for line in out.splitlines() if "max_iters" in line and "step 6" in line]
    assert re.findall(r"\bstep (\d+)", summary) == ["6"]
    assert not any("--resume" in cmd for cmd in _train_next_commands(out))


@pytest.mark.parametrize("world, local, launch", [
    (1, None, ["python"]), (2, "2", ["torchrun", "--standalone", "--nproc_per_node=2"]),
    (16, "8", ["torchrun", "--nnodes=2", "--nproc_per_node=8"])])
def test_train_a_stopped_run_is_continued_by_as_many_processes_as_wrote_it(tmp_path, monkeypatch, capsys, world,
                                                                           local, launch):
    # a run stopped under torchrun is continued under torchrun, with its number of processes (nodes x per node)
    if local:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    else:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    out = tmp_path / "o"
    s = dict(stopped_by="ctrl-c", step=2, val_loss=None, val_step=None, val_bpb=None, samples=[], elapsed=1.0,
             elapsed_this_run=1.0, ckpt=str(out / "ckpt.pt"), log=str(out / "log.jsonl"), interrupted=True,
             world=world)
    train.print_summary(s, 1.0, main_job=False)
    cmd = _train_next_commands(capsys.readouterr().out)[0]
    assert shlex.split(cmd) == launch + ["train.py", "--resume", f"--out_dir={out}"]


def test_train_summary_after_a_stop_gives_no_stale_figures_or_sample(tmp_path, monkeypatch, capsys):
    # Ctrl-C at step 2, evaluated at 0: the summary gives neither that loss nor its sample; resumed, it gives both
    d, _ = _train_byte_data(tmp_path)
    real_train = train.train
    monkeypatch.setattr(train, "train", lambda cfg, **kw: real_train(cfg, on_step=lambda step: step == 2 and
                                                                     runs.Stop.handler(None, None), **kw))
    args = [a for a in _train_main_args(d, tmp_path / "o") if a != "--num_samples=0"] + [
        "--max_iters=6", "--num_samples=1", "--sample_tokens=4"]
    with pytest.raises(SystemExit) as e:
        train.main(args)
    summary = capsys.readouterr().out.split("\ndone in ")[-1].splitlines()
    (step0,) = _train_records(tmp_path / "o", "eval")
    assert e.value.code == 130 and step0["step"] == 0 and step0["samples"]
    assert re.findall(r"\bstep (\d+)", summary[0]) == ["2", "0"]
    assert f"{step0['val_loss']:.4f}" not in summary[0] and not any(line.startswith("sample:") for line in summary)
    monkeypatch.setattr(train, "train", real_train)
    train.main(args + ["--resume"])
    summary = capsys.readouterr().out.split("\ndone in ")[-1]
    last = _train_records(tmp_path / "o", "eval")[-1]
    assert last["step"] == 6 and f"{last['val_loss']:.4f}" in summary.splitlines()[0]
    assert summary.count("\nsample: ") == 1 and f"\nsample: {last['samples'][0]}\n" in summary


def test_train_main_ctrl_c_before_the_loop_is_one_line(tmp_path, _train_data, monkeypatch, capsys):
    # Ctrl-C while the model is being built (the loop's own handler is not installed yet): no traceback, exit 130
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(train.model_lib, "build_model", interrupted)
    with pytest.raises(SystemExit) as e:
        train.main(_train_main_args(_train_data, tmp_path / "o"))
    assert e.value.code == 130
    _one_line_naming(capsys.readouterr().err.strip(), "train.py: ")
    assert not (tmp_path / "o").exists()


# ---- DDP: torchrun's ranks against one process (gloo, in processes of this test and under torchrun itself)


def test_train_torchrun_rank_takes_its_local_ranks_gpu_and_nccl(monkeypatch):
    # the second node of two with 8 GPUs each: RANK 9 is LOCAL_RANK 1, so cuda:1 (not cuda:9), and NCCL; gloo off CUDA
    monkeypatch.setenv("RANK", "9")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert train.torchrun_rank(torch.device("cuda")) == (9, 1, 16, torch.device("cuda", 1), "nccl")
    assert train.torchrun_rank(torch.device("cpu")) == (9, 1, 16, torch.device("cpu"), "gloo")


def test_train_batch_arithmetic_is_checked_with_torchruns_world_size(tmp_path, monkeypatch):
    # before the process group (and data preparation): WORLD_SIZE is what torchrun sets
    cfg = _train_cfg(tmp_path, tmp_path / "o", batch_size=4, context_length=16, total_batch_tokens=192, eval_tokens=64)
    train.check_config(cfg)
    monkeypatch.setenv("WORLD_SIZE", "2")
    _one_line_naming(_raises(train.check_config, cfg), "--total_batch_tokens=192 ", "128")
    _one_line_naming(_raises(train.check_config, dict(cfg, total_batch_tokens=256)), "--eval_tokens=64 ", "128")


_TRAIN_DDP_KW = dict(total_batch_tokens=256, max_iters=3, warmup_iters=1, eval_tokens=256, eval_interval=2,
                     log_interval=1, num_threads=1)


def _train_ddp_worker(rank, world, port, data_dir, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    flops.peak_flops = lambda device, dtype: 1e9   # a known peak: MFU becomes a number computed by hand
    # the random sampler (a stream per rank) straight to step 4, and to 2 then resumed (each rank its own state)
    kw = dict(sampler="random", lr_decay_iters=4, num_threads=1)
    for sub, more in (("rand_a", dict(max_iters=4)), ("rand_b", dict(max_iters=2)),
                      ("rand_b", dict(max_iters=4, resume=True))):
        train.train(_train_cfg(data_dir, Path(out_dir) / sub, **kw, **more), log=_train_quiet, teardown=False)
        dist.barrier()   # rank 0's checkpoint is on disk before any rank resumes from it
    # a SIGTERM to rank 1 only (after step 1): both stop after step 3 (agreed every 3) and resume to rand_a's end
    import signal
    term = Path(out_dir) / "term"
    stopped = train.train(_train_cfg(data_dir, term, **kw, max_iters=4, log_interval=3), log=_train_quiet,
                          teardown=False,
                          on_step=lambda step: rank == 1 and step == 1 and os.kill(os.getpid(), signal.SIGTERM))
    if rank == 1:   # the repeat torchrun sends may come after the loop: still ignored, the teardown goes on
        os.kill(os.getpid(), signal.SIGTERM)
    dist.barrier()
    stopped["ckpt_step"] = torch.load(term / "ckpt.pt", weights_only=True)["iteration"]
    dist.barrier()
    train.train(_train_cfg(data_dir, term, **kw, max_iters=4, resume=True), log=_train_quiet, teardown=False)
    dist.barrier()
    Path(out_dir, f"term{rank}.json").write_text(json.dumps(
        {k: stopped[k] for k in ("step", "stopped_by", "interrupted", "ckpt_step")}))
    # Muon steps on the all-reduced gradients
    train.train(_train_cfg(data_dir, Path(out_dir) / "muon", **_TRAIN_DDP_KW, optimizer="muon"), log=_train_quiet,
                teardown=False)
    dist.barrier()
    # 1 s a step on rank 0, 3 s on rank 1: every rank takes rank 0's clock and stops after the same step
    t = [0.0]

    def clock():
        t[0] += 1.0 if rank == 0 else 3.0
        return t[0]
    s = train.train(_train_cfg(data_dir, Path(out_dir) / "budget", time_budget="6s", max_iters=100, warmup_iters=0,
                               num_threads=1), clock=clock, log=_train_quiet, teardown=False)
    Path(out_dir, f"budget{rank}.json").write_text(json.dumps({k: s[k] for k in ("step", "elapsed", "last_lr")}))
    dist.barrier()
    # then against one process, watched: what each rank prints and saves, and how often gradients are all-reduced
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    said, saves, synced = [], [], []
    real_save = train.save_checkpoint
    train.save_checkpoint = lambda *a, **k: (saves.append(a[2]), real_save(*a, **k))[1]

    class CountingDDP(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)

            def hook(state, bucket):
                synced.append(1)
                return default_hooks.allreduce_hook(None, bucket)
            self.register_comm_hook(None, hook)
    torch.nn.parallel.DistributedDataParallel = CountingDDP
    train.train(_train_cfg(data_dir, out_dir, **_TRAIN_DDP_KW), clock=_train_fake_clock(), log=said.append)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(dict(
        said=len(said), saves=saves, synced=len(synced), initialized=dist.is_initialized())))


def test_train_ddp_with_accumulation_matches_one_process_in_weights_and_every_logged_figure(tmp_path, _train_data,
                                                                                             monkeypatch):
    # 1 process x 4 micro-steps == 2 x 2: the same weights, losses, tokens, tokens/s (all ranks'), MFU per process
    monkeypatch.setattr(flops, "peak_flops", lambda device, dtype: 1e9)
    train.train(_train_cfg(_train_data, tmp_path / "one", **_TRAIN_DDP_KW), clock=_train_fake_clock(), log=_train_quiet)
    _spawn_ranks(_train_ddp_worker, str(_train_data), str(tmp_path / "two"))
    a, b = _train_weights(tmp_path / "one" / "ckpt.pt"), _train_weights(tmp_path / "two" / "ckpt.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)
    ev1, ev2 = _train_records(tmp_path / "one", "eval"), _train_records(tmp_path / "two", "eval")
    assert [r["step"] for r in ev2] == [r["step"] for r in ev1] == [0, 2, 3]
    for r1, r2 in zip(ev1, ev2):
        assert r2["val_loss"] == pytest.approx(r1["val_loss"], rel=1e-5)
    mcfg = torch.load(tmp_path / "one" / "ckpt.pt", weights_only=True)["model_config"]
    per_token = flops.train_flops_per_token(mcfg, 16)
    tr1, tr2 = _train_records(tmp_path / "one", "train"), _train_records(tmp_path / "two", "train")
    assert [r["step"] for r in tr2] == [r["step"] for r in tr1] == [1, 2, 3]
    for world, recs in ((1, tr1), (2, tr2)):
        for r in recs:
            assert r["tokens"] == r["step"] * 256 and r["tokens_per_sec"] == pytest.approx(256.0)
            assert r["mfu"] == pytest.approx(per_token * 256 / world / 1e9, rel=1e-9)
    for r1, r2 in zip(tr1, tr2):
        assert r2["loss"] == pytest.approx(r1["loss"], rel=1e-5)
    # only rank 0 prints and checkpoints (step 2 and the end); one all-reduce per optimizer step; the group torn down
    obs = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert obs[0]["said"] > 0 and obs[1]["said"] == 0
    assert [o["saves"] for o in obs] == [[2, 3], []]
    assert [o["synced"] for o in obs] == [3, 3]
    assert [o["initialized"] for o in obs] == [False, False]
    # random sampler under DDP: each rank's own loader state is saved and restored, so the resume is exact
    ck = torch.load(tmp_path / "two" / "rand_b" / "ckpt.pt", weights_only=True)
    assert len(ck["loader"]) == 2 and ck["loader"][0]["rng"] != ck["loader"][1]["rng"]
    a, b = (_train_weights(tmp_path / "two" / sub / "ckpt.pt") for sub in ("rand_a", "rand_b"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a stop request on one rank stops every rank at the same step, with a checkpoint to resume from exactly
    assert [json.loads((tmp_path / "two" / f"term{r}.json").read_text()) for r in (0, 1)] == [
        dict(step=3, stopped_by="a stop request on another rank", interrupted=True, ckpt_step=3),
        dict(step=3, stopped_by="SIGTERM", interrupted=True, ckpt_step=3)]
    c = _train_weights(tmp_path / "two" / "term" / "ckpt.pt")
    assert all(torch.equal(a[k], c[k]) for k in a)
    got = [json.loads((tmp_path / "two" / f"budget{r}.json").read_text()) for r in (0, 1)]
    assert got[0] == got[1] and got[0]["step"] == 6 and got[0]["elapsed"] == 6.0   # rank 0's clock on every rank
    # Muon, 2 processes x 2 micro-steps: one process's weights
    train.train(_train_cfg(_train_data, tmp_path / "muon", **_TRAIN_DDP_KW, optimizer="muon"), log=_train_quiet)
    a, b = (_train_weights(tmp_path / sub / "ckpt.pt") for sub in ("muon", "two/muon"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)


def _train_agree_worker(rank, world, port, root, ports):
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    root = Path(root)
    plain, byte_data = root / "plain", root / "data"   # (_train_data's tokens; _train_byte_data's, with a tokenizer)
    real_tokenizer_for = bpe.tokenizer_for

    def unloadable(*a, **k):
        raise OSError("no such tokenizer on this node")
    cases = {   # what each rank finds on its own disk: rank 0 the complete set, rank 1 one thing different
        "checkpoint": [plain, root / f"ck{rank}"],                          # ck0 holds a checkpoint, ck1 none
        "resume": [plain, root / f"ck{rank}", "--resume=true"],
        "data": [plain if rank == 0 else root / "empty", root / f"d{rank}"],
        "files": [plain if rank == 0 else root / "other", root / f"f{rank}"],
        "tokenizer": [byte_data, root / f"t{rank}"],                       # rank 1's tokenizer does not load
        "tasks": [byte_data, root / f"h{rank}", "--hellaswag=true", f"--hellaswag_path={root / f'hs{rank}.jsonl'}"],
        "settings": [plain, root / f"s{rank}", f"--batch_size={4 - 2 * rank}"]}
    said = {}
    for (case, (data, out, *more)), port in zip(cases.items(), ports):
        # a port of its own for each case's process group: on the last one's, a rank could reach its closing store
        os.environ["MASTER_PORT"] = str(port)
        bpe.tokenizer_for = unloadable if case == "tokenizer" and rank == 1 else real_tokenizer_for
        try:
            train.main([*_train_main_args(data, out), *more])
            said[case] = "trained"
        except SystemExit as e:
            said[case] = str(e.code)
    Path(root, f"agree{rank}.json").write_text(json.dumps(said))


def test_train_ddp_ranks_that_disagree_before_the_first_step_all_stop_with_the_same_error(tmp_path):
    # each rank reads its own disk: what would send ranks into different collectives (one resuming and one not,
    # token files missing, another tokenizer or task file) is agreed before the first step: every rank stops with
    # the same one-line error naming what differs and where (said by rank 0 alone), instead of a hang (_spawn_ranks'
    # deadline)
    _train_byte_data(tmp_path)
    for folder, n in (("plain", 30000), ("other", 20000), ("empty", 0)):
        (tmp_path / folder).mkdir()
        if n:
            _train_write_tokens(tmp_path / folder / "train.bin", _train_docs(n, 0), 64)
            _train_write_tokens(tmp_path / folder / "val.bin", _train_docs(3000, 1), 64)
    _hs_write_rows(tmp_path / "hs0.jsonl")
    _hs_write_rows(tmp_path / "hs1.jsonl", _hs_examples()[:3])
    train.main(_train_main_args(tmp_path / "plain", tmp_path / "ck0"))   # the checkpoint rank 0 finds
    ports = set()
    while len(ports) < 7:
        ports.add(_free_port())
    _spawn_ranks(_train_agree_worker, str(tmp_path), sorted(ports), timeout=120)
    said = [json.loads((tmp_path / f"agree{r}.json").read_text()) for r in (0, 1)]
    assert said[1] == dict.fromkeys(said[0], "1")   # the same error on each rank: rank 0 says it, rank 1 exits 1
    for case, named in (("checkpoint", ["checkpoint", "None on rank 1", "--out_dir"]),
                        ("resume", ["--resume", str(tmp_path / "ck1" / "ckpt.pt"), "rank 1"]),
                        ("data", [str(tmp_path / "empty"), "train*.bin", "rank 1"]),
                        ("files", ["training files", "20000", "rank 1"]),
                        ("tokenizer", ["tokenizer", "not loaded", "no such tokenizer on this node", "rank 1"]),
                        ("tasks", ["'hellaswag': 7", "'hellaswag': 3", "rank 1"]),
                        ("settings", ["--batch_size", "4", "2", "rank 1"])):
        _one_line_naming(said[0][case], "train.py: ", *named)


@pytest.mark.parametrize("compiled", [False, True])
def test_train_ddp_two_gloo_processes_match_one(tmp_path, _train_data, compiled):
    # 1 process x 2 accumulation steps == 2 processes x 1: the same 2*B windows; only the summation order differs
    # (1e-5 after 3 AdamW steps). Compiled (aot_eager): DDP around torch.compile(train.LossOf) against eager
    common = [f"--compile={str(compiled).lower()}", "--compile_backend=aot_eager", "--prepare_data=false",
              "--resume=false", f"--data_dir={_train_data}", "--vocab_size=64", "--context_length=16", "--d_model=32",
              "--num_layers=2", "--num_heads=2", "--batch_size=4",
              "--total_batch_tokens=128", "--max_iters=3", "--eval_interval=1000", "--eval_iters=2",
              "--num_samples=0", "--device=cpu", "--num_threads=1", "--time_budget=",
              "--seed=0", "--warmup_iters=2", "--learning_rate=3e-3", "--dtype=float32"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))   # TMPDIR: torchrun's log folder goes there
    one = train.train(_train_cfg(_train_data, tmp_path / "one", total_batch_tokens=128, max_iters=3,
                                 eval_interval=1000), log=_train_quiet)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={_free_port()}", "train.py", f"--out_dir={tmp_path}/two", *common],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    assert one["step"] == 3 and _train_records(tmp_path / "two", "config")[0]["world_size"] == 2
    assert [r["tokens"] for r in _train_records(tmp_path / "two", "train")] == [3 * 128]   # 1 micro-step x 2 ranks
    assert ("compiled" in two.stdout) == compiled   # (the run says so: no record holds what "auto" settings became)
    a, b = _train_weights(tmp_path / "one" / "ckpt.pt"), _train_weights(tmp_path / "two" / "ckpt.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)
    ck = torch.load(tmp_path / "two" / "ckpt.pt", weights_only=True)
    assert len(ck["loader"]) == 2                                       # every rank's loader position


def test_train_ddp_main_job_prepares_the_data_once_while_the_other_rank_waits(tmp_path):
    # rank 0 prepares the data while rank 1 waits on a gloo group (not NCCL's watchdog); both train on those files
    args = [f"--data_dir={tmp_path}/data", "--prepare_data=true", f"--out_dir={tmp_path}/out", "--download=false",
            "--corpus_bytes=60000", "--vocab_size=300", "--d_model=32", "--num_layers=1", "--num_heads=2",
            "--context_length=32", "--batch_size=4", "--max_iters=2", "--eval_interval=2", "--eval_iters=2",
            "--num_samples=0", "--time_budget=", "--num_threads=1", "--device=cpu", "--compile=false"]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        f"--master_port={_free_port()}", "train.py", *args],
                       cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "data" / "prepared.json").is_file()
    ck = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ck["iteration"] == 2 and len(ck["loader"]) == 2
    assert ck["tokenizer"] == str(tmp_path / "data" / "tokenizer") and ck["train_files"] == [
        ["train.bin", len(np.fromfile(tmp_path / "data" / "train.bin", dtype=np.uint16))]]
    assert _train_records(tmp_path / "out", "config")[0]["world_size"] == 2


def test_train_torchrun_ctrl_c_checkpoints_every_rank_at_the_same_step(tmp_path, _train_data):
    # a terminal's Ctrl-C reaches torchrun and its workers, and torchrun passes it on: each worker gets SIGINT twice.
    # They finish the step together with a checkpoint of both ranks' positions (the periodic one is at step 3000),
    # rank 0 says once that it stops, and no worker prints a traceback. Sent once step 1 is printed.
    import signal
    args = [f"--data_dir={_train_data}", "--prepare_data=false", f"--out_dir={tmp_path}/o", "--vocab_size=64",
            "--context_length=16", "--d_model=32", "--num_layers=1", "--num_heads=2", "--batch_size=4",
            "--max_iters=3000", "--eval_interval=3000", "--eval_iters=2", "--log_interval=1", "--num_samples=0",
            "--time_budget=", "--num_threads=1", "--device=cpu", "--compile=false"]
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={_free_port()}", "train.py", *args], cwd=ROOT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)   # its own group: a terminal's foreground job
    try:
        out = []
        for line in p.stdout:
            out.append(line)
            if line.startswith("step      1/"):
                os.killpg(p.pid, signal.SIGINT)
                break
        out.extend(p.stdout)
        err = p.stderr.read()
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    out = "".join(out)
    assert p.returncode != 0 and "KeyboardInterrupt" not in err, (out[-2000:], err[-2000:])
    assert len([line for line in out.splitlines() if line.startswith("train.py: ctrl-c")]) == 1   # said by rank 0
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert 1 <= ck["iteration"] < 3000 and len(ck["loader"]) == 2
    assert _train_records(tmp_path / "o", "train")[-1]["step"] == ck["iteration"]   # the stop's step is logged


_TRAIN_WIDE = dict(d_model=256, num_layers=2, num_heads=4, context_length=64, batch_size=8, max_iters=6,
                   warmup_iters=2, eval_interval=3, ckpt_interval=3, num_threads=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_two_identical_runs_at_the_default_thread_count_are_bit_for_bit_equal(tmp_path, _train_data, dtype):
    # d_model 256 at torch's default threads: two runs end with the same weights and log, under bf16 autocast too
    assert torch.get_num_threads() >= 2 or pytest.skip("one CPU thread: nothing multi-threaded to check")
    for out in ("a", "b"):
        train.train(_train_cfg(_train_data, tmp_path / out, **_TRAIN_WIDE, dtype=dtype), log=_train_quiet)
    a, b = _train_weights(tmp_path / "a" / "ckpt.pt"), _train_weights(tmp_path / "b" / "ckpt.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in _train_records(tmp_path / "a", "train")] == [
        r["loss"] for r in _train_records(tmp_path / "b", "train")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_killed_with_sigkill_resumes_to_the_uninterrupted_runs_weights(tmp_path, _train_data, dtype):
    # a real kill -9 after step 4 (last checkpoint step 3's), then --resume: the straight run's weights, in bf16 too
    train.train(_train_cfg(_train_data, tmp_path / "straight", **_TRAIN_WIDE, dtype=dtype), log=_train_quiet)
    cfg = _train_cfg(_train_data, tmp_path / "killed", **_TRAIN_WIDE, dtype=dtype)
    code = (f"import os, signal, train\n"
            f"train.train({cfg!r}, log=lambda *a, **k: None, on_step=lambda s: s == 4 and os.kill(os.getpid(), "
            f"signal.SIGKILL))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    assert torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=True)["iteration"] == 3
    train.train(dict(cfg, resume=True), log=_train_quiet)
    a, b = _train_weights(tmp_path / "straight" / "ckpt.pt"), _train_weights(tmp_path / "killed" / "ckpt.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_summary_after_a_resume_gives_this_runs_time_and_the_total(tmp_path, _train_data):
    cfg = _train_cfg(_train_data, tmp_path / "o", max_iters=3)
    train.train(cfg, clock=_train_fake_clock(), log=_train_quiet)
    s = train.train(dict(cfg, max_iters=5, resume=True), clock=_train_fake_clock(), log=_train_quiet)
    assert (s["elapsed_this_run"], s["elapsed"]) == (2.0, 5.0)


def test_train_resumed_run_with_nothing_left_to_train_says_how_to_extend_it(tmp_path, _train_data):
    for more, named in ((dict(max_iters=2), "--max_iters=2"),
                        (dict(max_iters=50, time_budget="2s"), "--time_budget=2s")):
        out = tmp_path / named[2:7]
        cfg = _train_cfg(_train_data, out, **more)
        train.train(cfg, clock=_train_fake_clock(), log=_train_quiet)
        said = []
        s = train.train(dict(cfg, resume=True), clock=_train_fake_clock(), log=said.append)
        line = [x for x in said if "--fresh" in x]   # the note, found by the way on it names, not by its wording
        assert s["step"] == torch.load(out / "ckpt.pt", weights_only=True)["iteration"] and len(line) == 1
        _one_line_naming(line[0], f"train.py: {out / 'ckpt.pt'} ", named)


# ---- past one GPU: FSDP (2 gloo processes against one), activation checkpointing, sharded (DCP) checkpoints

# each run by one process and by 2 under FSDP on the same global batch (4 windows of 4 x 16: 4 micro-steps, 2 per
# rank; noclip: 2 windows, one each): clipping that bites (norms ~1.5), AdamW, fused AdamW, Muon, activation
# checkpointing under FSDP and DDP, and GPT-2 (its tied head) compiled (aot_eager)
_TRAIN_FSDP_KW = dict(fsdp=True, total_batch_tokens=256, max_iters=3, warmup_iters=1, eval_tokens=128,
                      eval_interval=2, log_interval=1, num_threads=1)
_TRAIN_FSDP_RUNS = {"clip": dict(grad_clip=0.05), "noclip": dict(grad_clip=0.0, fused="true", total_batch_tokens=128),
                    "muon": dict(optimizer="muon"), "ac": dict(grad_clip=0.05, activation_checkpointing=True),
                    "ddp_ac": dict(fsdp=False, activation_checkpointing=True), "ema": dict(ema=0.5)}
_TRAIN_FSDP_COMPILED = {"compiled_ac": dict(compile=True, compile_backend="aot_eager", activation_checkpointing=True)}


def _train_fsdp_runs(arch):
    return {**_TRAIN_FSDP_RUNS, **(_TRAIN_FSDP_COMPILED if arch == "gpt2" else {})}


def _train_fsdp_worker(rank, world, port, data_dir, out_dir, arch):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    runs_ = _train_fsdp_runs(arch)
    for i, (name, kw) in enumerate(runs_.items()):
        train.train(_train_cfg(data_dir, Path(out_dir) / name, **{"model": arch, **_TRAIN_FSDP_KW, **kw}),
                    log=_train_quiet, teardown=i == len(runs_) - 1)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_train_fsdp_two_gloo_processes_match_one(tmp_path, _train_data, arch):
    # reduce-scatter sums in another order: measured 4e-7 on the weights, 1.3e-7 relative on the logs; held to 1e-5
    _spawn_ranks(_train_fsdp_worker, str(_train_data), str(tmp_path / "two"), arch)
    for name, kw in _train_fsdp_runs(arch).items():
        train.train(_train_cfg(_train_data, tmp_path / "one" / name, **{"model": arch, **_TRAIN_FSDP_KW, **kw}),
                    log=_train_quiet)
        one, two = (M.read_checkpoint(tmp_path / w / name / "ckpt.pt") for w in ("one", "two"))
        assert ("shards" in two) == kw.get("fsdp", True) and len(two["loader"]) == 2
        for k in one["model"]:
            torch.testing.assert_close(one["model"][k], two["model"][k], rtol=0, atol=1e-5)
        for kind, field in (("train", "loss"), ("train", "grad_norm"), ("eval", "val_loss")):
            a = [r[field] for r in _train_records(tmp_path / "one" / name, kind)]
            b = [r[field] for r in _train_records(tmp_path / "two" / name, kind)]
            assert len(a) == len(b) == 3   # (evaluated at 0, 2, 3); no norm is logged with --grad_clip=0
            assert b == a if None in a else b == pytest.approx(a, rel=1e-5, abs=0)
    # under FSDP activation checkpointing changes no number: its run is the clipped run's, bit for bit
    clip, ac = (M.read_checkpoint(tmp_path / "two" / name / "ckpt.pt")["model"] for name in ("clip", "ac"))
    assert all(torch.equal(clip[k], ac[k]) for k in clip)
    assert [(r["loss"], r["grad_norm"]) for r in _train_records(tmp_path / "two" / "ac", "train")] == [
        (r["loss"], r["grad_norm"]) for r in _train_records(tmp_path / "two" / "clip", "train")]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("compiled", [False, True])
def test_train_activation_checkpointing_changes_no_gradient_and_no_weight(arch, compiled):
    # 3 steps of LossOf, clipping and AdamW with and without each block recomputed: every gradient and the weights
    # bit for bit. It recomputes: eager, the second block's first FFN matrix runs twice a step; compiled (aot_eager),
    # the graph holds a checkpoint region per block
    from torch._dynamo.backends.debugging import aot_eager
    shape = (dict(context_length=16, d_model=32, num_layers=2, num_heads=2) if arch == "llama" else
             dict(block_size=16, n_embd=32, n_layer=2, n_head=2))
    cfg = dict(arch=arch, vocab_size=64, **shape)

    def run(checkpointing):
        torch.manual_seed(0)
        raw = M.build_model(cfg)
        train.parallelize(raw, train.Settings(activation_checkpointing=checkpointing, fsdp=False), 1, "cpu", {})
        block, graphs, calls = M.blocks(raw)[1], [], []
        model = train.LossOf(raw, arch)
        if compiled:   # (a hook that counts calls would break the graph; the tests before may have compiled these
            torch._dynamo.reset()   # models' code up to dynamo's limit of recompilations, past which it runs eager)
            model = torch.compile(model, backend=lambda gm, ex: (graphs.append(gm), aot_eager(gm, ex))[1])
        else:
            (block.ffn.w1 if arch == "llama" else block.mlp.c_fc).register_forward_hook(lambda *a: calls.append(1))
        opt, g, grads = train.AdamW(M.param_groups(raw, 0.1), lr=1e-2), torch.Generator().manual_seed(1), []
        for _ in range(3):
            x = torch.randint(0, 64, (4, 17), generator=g)
            model(x[:, :-1], x[:, 1:]).backward()
            grads.append([p.grad.clone() for p in raw.parameters()])
            train.gradient_clipping(raw.parameters(), 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)
        regions = sum(str(n.target) == "tag_activation_checkpoint" for gm in graphs for n in gm.graph.nodes)
        return grads, raw.state_dict(), len(calls), (len(graphs), regions)

    plain, checkpointed = run(False), run(True)
    assert all(torch.equal(a, b) for step_a, step_b in zip(plain[0], checkpointed[0]) for a, b in zip(step_a, step_b))
    assert all(torch.equal(plain[1][k], checkpointed[1][k]) for k in plain[1])
    if compiled:
        assert (plain[3], checkpointed[3]) == ((1, 0), (1, 2))   # (graphs, checkpoint regions): no graph break
    else:
        assert (plain[2], checkpointed[2]) == (3, 6)


# a run of 6 steps of 4 windows (2 micro-steps on each of 2 ranks, 4 in one process), a checkpoint every 2 steps,
# under --ema: the weights compared are the average, right after a resume only if its trained weights are too
_TRAIN_FSDP_RESUME = dict(fsdp=True, total_batch_tokens=256, max_iters=6, lr_decay_iters=6, warmup_iters=2,
                          ckpt_interval=2, eval_interval=1000, log_interval=1, num_threads=1, ema=0.9)


def _train_fsdp_resume_worker(rank, world, port, data_dir, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    for i, (sub, more) in enumerate((("straight", {}), ("killed", dict(resume=True)), ("from_one", dict(resume=True)))):
        train.train(_train_cfg(data_dir, Path(out_dir) / sub, **_TRAIN_FSDP_RESUME, **more), log=_train_quiet,
                    teardown=i == 2)
        if i < 2:
            dist.barrier()


def test_train_fsdp_killed_mid_checkpoint_resumes_exactly_and_on_another_number_of_processes(tmp_path, _train_data):
    # 2 processes SIGKILLed while committing step 4's checkpoint (shards written, ckpt.pt not replaced): step 2's is
    # left, whole; resumed on 2 processes, the uninterrupted run's weights bit for bit, step 4's folder removed.
    # Step 2's resumed in one process (DCP reshards), and a one-process checkpoint resumed on 2: the uninterrupted
    # run's first loss and final weights within 1e-5 (measured: losses 6e-8 relative, weights 2.4e-7)
    cfg = _train_cfg(_train_data, tmp_path / "killed", **_TRAIN_FSDP_RESUME)
    script = tmp_path / "kill.py"
    script.write_text(f"import os, signal, sys\nsys.path.insert(0, {str(ROOT)!r})\nimport train\n"
                      f"commit = train.save_atomically\n"
                      f"def killed_at_4(obj, path):\n"
                      f"    if obj['iteration'] == 4:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
                      f"    commit(obj, path)\n"
                      f"train.save_atomically = killed_at_4\ntrain.train({cfg!r}, log=lambda *a, **k: None)\n")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        f"--master_port={_free_port()}", str(script)], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)), timeout=300)
    assert r.returncode != 0
    assert torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=True)["iteration"] == 2
    shards = sorted(p.name.split("-")[1] for p in (tmp_path / "killed").glob("ckpt.pt.shards-*"))
    assert shards == ["2", "4"]   # step 4's written, not committed
    shutil.copytree(tmp_path / "killed", tmp_path / "to_one")
    train.train(_train_cfg(_train_data, tmp_path / "from_one", **dict(_TRAIN_FSDP_RESUME, max_iters=2)),
                log=_train_quiet)
    _spawn_ranks(_train_fsdp_resume_worker, str(_train_data), str(tmp_path))
    train.train(_train_cfg(_train_data, tmp_path / "to_one", **_TRAIN_FSDP_RESUME, resume=True), log=_train_quiet)
    straight = M.read_checkpoint(tmp_path / "straight" / "ckpt.pt")["model"]
    killed = M.read_checkpoint(tmp_path / "killed" / "ckpt.pt")
    assert killed["iteration"] == 6 and all(torch.equal(straight[k], killed["model"][k]) for k in straight)
    assert [p.name for p in (tmp_path / "killed").glob("ckpt.pt.shards-*")] == [killed["shards"]]
    losses = {r["step"]: r["loss"] for r in _train_records(tmp_path / "straight", "train")}
    for sub in ("to_one", "from_one"):
        resumed = M.read_checkpoint(tmp_path / sub / "ckpt.pt")
        assert len(resumed["loader"]) == (1 if sub == "to_one" else 2) and resumed["iteration"] == 6
        first = _train_records(tmp_path / sub, "train")[2]   # the records of steps 1-2 stay in the log
        assert first["step"] == 3 and first["loss"] == pytest.approx(losses[3], rel=1e-5, abs=0)
        for k in straight:
            torch.testing.assert_close(resumed["model"][k], straight[k], rtol=0, atol=1e-5)


def _train_fsdp_gpt2_worker(rank, world, port, data_dir, out_dir, tasks):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    train.train(_train_cfg(data_dir, out_dir, model="gpt2", fsdp=True, max_iters=2, eval_interval=2, num_threads=1,
                           context_length=64, num_samples=1, sample_tokens=8, **tasks), log=_train_quiet)


def test_train_fsdp_evaluates_and_its_checkpoint_samples_and_exports_as_the_same_weights_in_one_process(
        tmp_path, monkeypatch, capsys):
    # GPT-2 (tied) under FSDP on 2 processes: samples on rank 0 alone, LAMBADA's 3 passages on 2 ranks (uneven) with
    # the tasks' own one-process figures; its ckpt.pt samples and exports as a one-process checkpoint of the weights
    # torch's dcp_to_torch_save reads from the shards; flops.py --ckpt reads its shape
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    data, tok = _train_byte_data(tmp_path)
    hs, lam = _hs_write_rows(tmp_path / "hs.jsonl"), tmp_path / "lambada.jsonl"
    lam.write_text("".join(json.dumps({"text": t}) + "\n" for t in _TRAIN_LAMBADA_TEXTS))
    tasks = dict(hellaswag=True, hellaswag_path=str(hs), lambada=True, lambada_path=str(lam))
    _spawn_ranks(_train_fsdp_gpt2_worker, str(data), str(tmp_path / "fsdp"), tasks)
    evals = _train_records(tmp_path / "fsdp", "eval")
    model = M.load_model(tmp_path / "fsdp" / "ckpt.pt")[0]
    lam_result = lambada.evaluate(model, tok, lambada.load_examples(lam), "cpu")
    hs_result = hellaswag.evaluate(model, tok, hellaswag.load_examples(hs), "cpu")
    assert [r["step"] for r in evals] == [0, 2] and len(evals[-1]["samples"]) == 1 and lam_result["num_total"] == 3
    assert (evals[-1]["lambada_acc"], evals[-1]["hellaswag_acc_norm"]) == (lam_result["acc"], hs_result["acc_norm"])
    assert evals[-1]["lambada_ppl"] == pytest.approx(lam_result["ppl"], rel=1e-4)
    ckpt = torch.load(tmp_path / "fsdp" / "ckpt.pt", weights_only=True)
    dcp_to_torch_save(tmp_path / "fsdp" / ckpt["shards"], tmp_path / "whole.pt")
    (tmp_path / "one").mkdir()
    whole = {k: v for k, v in ckpt.items() if k != "shards"}
    torch.save(dict(whole, model=torch.load(tmp_path / "whole.pt", weights_only=True)["model"]),
               tmp_path / "one" / "ckpt.pt")
    printed = {}
    for run in ("fsdp", "one"):
        _run(sample, monkeypatch, f"--ckpt={tmp_path / run / 'ckpt.pt'}", "--prompt=ab", "--max_new_tokens=20",
             "--num_samples=2", "--no_stop", "--device=cpu")
        printed[run] = capsys.readouterr().out
        _run(export, monkeypatch, f"--ckpt={tmp_path / run / 'ckpt.pt'}", f"--out={tmp_path / run / 'hf'}")
        capsys.readouterr()
    assert printed["fsdp"] == printed["one"] and len(_sample_texts(printed["one"])) == 2
    files = sorted(p.name for p in (tmp_path / "one" / "hf").iterdir())
    assert "model.safetensors" in files and files == sorted(p.name for p in (tmp_path / "fsdp" / "hf").iterdir())
    assert all((tmp_path / "one" / "hf" / f).read_bytes() == (tmp_path / "fsdp" / "hf" / f).read_bytes()
               for f in files)
    assert flops._load_config(str(tmp_path / "fsdp" / "ckpt.pt")) == ckpt["model_config"]


# ==== data: fineweb.py and stories.py: corpora to token shards, the main job's data, the story generator


_FW_EOT = "<|endoftext|>"


def _fw_read_shards(out_dir):
    """All token ids of a shard directory in stream order (val_000000 first), plus the per-file arrays."""
    meta = json.loads((Path(out_dir) / "meta.json").read_text())
    dtype = np.dtype(meta["config"]["dtype"]).newbyteorder("<")
    arrays = [np.fromfile(Path(out_dir) / s["file"], dtype=dtype) for s in meta["shards"]]
    return np.concatenate(arrays), arrays, meta


def _fw_corpus(tmp_path, n=120, seed=0, name="corpus.txt"):
    docs = stories.generate_stories(n, seed)
    path = tmp_path / name
    path.write_text("".join(d + stories.SEPARATOR for d in docs), encoding="utf-8")
    return path, docs


@pytest.fixture(scope="module")
def _fw_bpe_dir(tmp_path_factory):
    """A small bpe.py tokenizer (vocab 300) trained on generated stories."""
    import bpe
    tmp = tmp_path_factory.mktemp("fw_bpe")
    path, _ = _fw_corpus(tmp, n=200, seed=5)
    vocab, merges = bpe.train_bpe(str(path), 300, [_FW_EOT], num_workers=1)
    bpe.Tokenizer(vocab, merges, [_FW_EOT]).save_dir(tmp / "tok")
    return str(tmp / "tok")


def _fw_fake_datasets(monkeypatch, rows_by_split, calls, fail=None):
    import types

    def load_dataset(path, name=None, split=None, streaming=False):
        calls.append(dict(path=path, name=name, split=split, streaming=streaming))
        if fail:
            raise fail
        return iter({"text": t} for t in rows_by_split[split])
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(fineweb, "hub_reachable", lambda timeout=3.0: (True, ""))


def _fw_crashing(docs, n):
    """The document stream dying after n documents, as a killed job's does."""
    yield from docs[:n]
    raise RuntimeError("simulated interruption")


def _fw_steps(monkeypatch):
    """The steps prepare_tinystories runs (not reuses), in order: "corpus" and "tokens" once per split, "tokenizer"."""
    steps = []

    def spy(module, name, step):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: steps.append(step) or real(*a, **k))
    spy(stories, "write_corpus", "corpus")
    spy(bpe, "train_bpe", "tokenizer")
    spy(fineweb, "write_token_file", "tokens")
    return steps


def _fw_bpe_training_sizes(monkeypatch):
    """The size in bytes of the text each bpe.train_bpe call trains on."""
    sizes, real = [], bpe.train_bpe
    monkeypatch.setattr(bpe, "train_bpe",
                        lambda path, *a, **k: sizes.append(os.path.getsize(path)) or real(path, *a, **k))
    return sizes


# ---- fineweb.py: the token dtype


@pytest.mark.parametrize("vocab_size,asked,dtype", [(65536, None, "uint16"), (65536, "auto", "uint16"),
                                                    (65537, None, "uint32"), (65536, "uint16", "uint16"),
                                                    (65537, "uint32", "uint32"), (300, "uint32", "uint32")])
def test_fw_choose_dtype_uint16_holds_exactly_65536_ids(vocab_size, asked, dtype):
    assert fineweb.choose_dtype(vocab_size, asked) == dtype   # ids 0..65535; auto (or None): uint16 if they fit


@pytest.mark.parametrize("vocab_size,asked,named", [(65537, "uint16", ("65537 ids", "uint32")),
                                                    (100_000, "uint16", ("100000 ids", "uint32")),
                                                    (300, "int8", ("'int8'", "uint16", "uint32"))])
def test_fw_choose_dtype_refuses_a_dtype_that_cannot_hold_the_ids(vocab_size, asked, named):
    _one_line_naming(_raises(fineweb.choose_dtype, vocab_size, asked), "--dtype", *named)


# ---- fineweb.py: documents from a local file (separated by <|endoftext|>) or folder (one per file)


def test_fw_file_docs_splits_at_separators_across_any_chunking(tmp_path):
    # separators cut by chunks, half separators, CRLF, a BOM, long documents: the whole text's split
    rng = random.Random(0)
    pieces = [_FW_EOT, "<|", "endoftext|>", "a", "bc ", " ", "\n", "\r\n", "é", "<", "|>", "x" * 40]
    path = tmp_path / "t.txt"
    for i in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        path.write_bytes((b"\xef\xbb\xbf" if i % 7 == 0 else b"") + text.encode("utf-8"))
        want = [d.strip() for d in text.split(_FW_EOT) if d.strip()]
        chunk = rng.randint(1, 14)
        assert list(fineweb.file_docs(path, chunk_chars=chunk)) == want, (text, chunk)


def test_fw_file_docs_streams_across_chunk_boundaries_and_drops_blank_documents(tmp_path):
    # documents and separators cut by chunks joined again, no separator needed last, blank documents dropped
    text = (f"  first doc \n{_FW_EOT}\n \n\t{_FW_EOT}second{_FW_EOT}a third one, longer than any chunk below"
            f"{_FW_EOT}{_FW_EOT}  last, without a separator after it \n")
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    want = ["first doc", "second", "a third one, longer than any chunk below", "last, without a separator after it"]
    for chunk_chars in (1, 3, 7, 16, 1 << 20):
        assert list(fineweb.file_docs(path, chunk_chars=chunk_chars)) == want, chunk_chars


def test_fw_folder_docs_skips_hidden_files_and_folders(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "a.txt").write_text("Doc A\n")
    (tmp_path / "sub" / "b.txt").write_text("  Doc B ")
    (tmp_path / "empty.txt").write_text(" \n")
    (tmp_path / ".hidden.txt").write_text("secret")
    (tmp_path / ".git" / "config").write_text("[core]")
    assert list(fineweb.folder_docs(tmp_path)) == ["Doc A", "Doc B"]


def test_fw_input_stamp_sees_a_same_size_edit_by_its_modification_time(tmp_path):
    # an edit keeping the size changes the stamp, or a rerun would resume shards of the old text
    path = tmp_path / "c.txt"
    folder = tmp_path / "docs"
    folder.mkdir()
    for p in (path, folder / "a.txt"):
        p.write_text("Tom had a red ball.", encoding="utf-8")
        os.utime(p, ns=(10**18, 10**18))
    before = [fineweb.input_stamp(path), fineweb.input_stamp(folder)]
    assert [fineweb.input_stamp(path), fineweb.input_stamp(folder)] == before   # the same file: the same stamp
    for p in (path, folder / "a.txt"):
        p.write_text("Tom had a big ball.", encoding="utf-8")
        os.utime(p, ns=(10**18, 10**18 + 10**9))
    after = [fineweb.input_stamp(path), fineweb.input_stamp(folder)]
    assert after[0] != before[0] and after[1] != before[1]


def test_fw_an_input_that_cannot_be_read_is_one_error_naming_the_file(tmp_path, monkeypatch):
    # a missing --input, a file or a folder's file not UTF-8, a folder with no files: one line starting with the path
    missing = tmp_path / "missing.txt"
    _bpe_says(_raises(fineweb.check_input, missing), f"{missing}: ", "no such file")
    msg = _bad_exit(monkeypatch, fineweb, "--input", missing, "--out_dir", tmp_path / "x")
    _bpe_says(msg, f"fineweb.py: {missing}: ", "no such file")
    assert not (tmp_path / "x").exists()
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait".encode("latin-1"))
    _bpe_says(_raises(list, fineweb.file_docs(bad)), f"{bad}: ", "UTF-8")
    (tmp_path / "docs").mkdir()
    shutil.copy(bad, tmp_path / "docs" / "a.txt")
    _bpe_says(_raises(list, fineweb.folder_docs(tmp_path / "docs")), f"{tmp_path / 'docs' / 'a.txt'}: ", "UTF-8")
    (tmp_path / "empty").mkdir()
    _bpe_says(_raises(list, fineweb.folder_docs(tmp_path / "empty")), f"{tmp_path / 'empty'}: ", "no files")


# ---- fineweb.py: documents streamed from the Hugging Face hub


def test_fw_hub_probe_uses_the_endpoint_port(monkeypatch):   # fineweb.py asks model.py's hub_reachable
    # HF_ENDPOINT's port is probed: (True, "") or (False, why); behind a proxy or a bad endpoint: not probed, said
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy", "HF_HUB_OFFLINE",
                "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert fineweb.hub_reachable() == (True, "")
    ok, why = fineweb.hub_reachable()   # closed now
    assert not ok and "127.0.0.1" in why
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")   # an http endpoint behind an http proxy
    ok, why = fineweb.hub_reachable()
    assert ok and "not probed" in why
    monkeypatch.delenv("HTTP_PROXY")
    for bad in ("https://host:99999", "hf-mirror.com"):  # malformed: left to huggingface_hub to explain
        monkeypatch.setenv("HF_ENDPOINT", bad)
        ok, why = fineweb.hub_reachable()
        assert ok and "not probed" in why


def test_fw_hub_offline_is_detected_at_once(monkeypatch):
    # HF_HUB_OFFLINE=1: no connection is tried, and a dataset is refused in one line that says why and what to use
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", _bpe_not_called)
    ok, why = fineweb.hub_reachable()
    assert not ok and "HF_HUB_OFFLINE" in why
    _one_line_naming(_raises(fineweb.hf_docs, "fineweb-edu"), "--dataset fineweb-edu", "HF_HUB_OFFLINE", "--input")


def test_fw_streams_fineweb_edu_sample_10bt(monkeypatch):
    calls = []
    _fw_fake_datasets(monkeypatch, {"train": ["  first page ", "", "second page"]}, calls)
    assert list(fineweb.hf_docs("fineweb-edu")) == ["  first page ", "", "second page"]   # as build-nanogpt reads them
    assert list(fineweb.hf_docs("fineweb-edu", strip=True)) == ["first page", "second page"]
    assert calls == [dict(path="HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train", streaming=True)] * 2


def test_fw_an_unknown_dataset_is_refused_naming_the_ones_there_are(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "create_connection", _bpe_not_called)   # refused before the hub is asked
    monkeypatch.chdir(tmp_path)
    _one_line_naming(_raises(fineweb.hf_docs, "no-such-corpus"), "--dataset ", "no-such-corpus", *fineweb.DATASETS)
    _one_line_naming(_bad_exit(monkeypatch, fineweb, "--dataset", "nope"), "fineweb.py: --dataset ", "nope",
                     *fineweb.DATASETS)
    assert list(tmp_path.iterdir()) == []


# ---- fineweb.py: shuffling documents through a buffer


@pytest.mark.parametrize("n", [500, 40], ids=["longer_than_the_buffer", "shorter_than_the_buffer"])
def test_fw_buffer_shuffle_is_a_seeded_permutation(n):
    # every document once, in an order that depends on the seed alone, also for a stream the buffer holds whole
    docs = [f"doc {i}" for i in range(n)]
    a = list(fineweb.buffer_shuffle(iter(docs), 64, seed=1))
    assert sorted(a) == sorted(docs) and a != docs
    assert a == list(fineweb.buffer_shuffle(iter(docs), 64, seed=1))
    assert a != list(fineweb.buffer_shuffle(iter(docs), 64, seed=2))


def test_fw_buffer_shuffle_moves_documents_away_from_their_neighbours():
    # evicting one slot always would keep the stream in order and start every seed with doc 0
    docs = list(range(1000))
    out = list(fineweb.buffer_shuffle(iter(docs), 64, seed=0))
    assert sorted(out) == docs
    in_order = sum(b == a + 1 for a, b in zip(out, out[1:]))
    assert in_order < 60, in_order                       # ~1000/64 expected; an in-order stream gives ~1000
    firsts = {next(iter(fineweb.buffer_shuffle(iter(docs), 64, seed=s))) for s in range(10)}
    assert len(firsts) > 5


def test_fw_buffer_shuffle_draws_from_every_slot_of_the_buffer():
    # a buffer of 1 keeps the order; of 2, the second slot's document leaves long before the final flush
    docs = list(range(200))
    assert list(fineweb.buffer_shuffle(iter(docs), 1, seed=3)) == docs
    out = list(fineweb.buffer_shuffle(iter(docs), 2, seed=3))
    assert sorted(out) == docs and out.index(1) < 50


# ---- fineweb.py: tokenising documents (an eot before each) on worker processes, the progress line


@pytest.mark.parametrize("which", ["bpe", pytest.param("gpt2", marks=needs_gpt2_files)])
def test_fw_literal_endoftext_inside_a_document_stays_text(tmp_path, _fw_bpe_dir, which):
    # a page that mentions "<|endoftext|>" is encoded as ordinary text: the only eot ids are the separators
    ref = _fw_bpe_dir if which == "bpe" else "gpt2"
    tok = bpe.load_tokenizer(ref)
    docs = ["A web page that mentions <|endoftext|> in its text.", "Second page."]
    folder = tmp_path / "pages"
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"{i}.txt").write_text(d, encoding="utf-8")
    fineweb.write_shards(fineweb.folder_docs(folder), tmp_path / "out", ref, shard_size=10**6, num_workers=1,
                         progress=False, log=lambda *a: None)
    ids, _, meta = _fw_read_shards(tmp_path / "out")
    assert int((ids == tok.eot_id).sum()) == 2 == meta["num_docs"]  # only the two separators
    assert tok.decode(ids.tolist()) == _FW_EOT + _FW_EOT.join(docs)


def test_fw_tokenizer_without_eot_is_an_error_with_worker_processes_too(tmp_path):
    # a tokenizer without <|endoftext|> is refused: by write_token_file before any work, by encode_docs at the first
    # batch (a pool restarts a failing worker forever); in a child process, so a hang fails on its timeout
    d = _bpe_tok_dir(tmp_path, specials=())
    code = f"""
import fineweb, sys
for call in (lambda: fineweb.write_token_file(iter(["hello world", "second doc"]), {str(tmp_path / "x.bin")!r},
                                               {str(d)!r}, num_workers=2),
             lambda: list(fineweb.encode_docs(iter(["hello world"]), {str(d)!r}, "uint16", num_workers=2))):
    try:
        call()
    except ValueError as e:
        print("ValueError:", e)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stderr[-2000:]
    for line in lines:
        _bpe_says(line, f"ValueError: {d}: ", _FW_EOT)
    assert not list(tmp_path.glob("x.bin*"))


# ---- fineweb.py: token files written whole or not at all: one file and its sidecar (write_token_file)


@pytest.mark.parametrize("which", [pytest.param("gpt2", marks=needs_gpt2_files), "bpe"])
def test_fw_token_file_holds_the_stream_and_its_sidecar_names_the_tokenizers_eot_id(tmp_path, _fw_bpe_dir, which):
    # an eot before every document, the tokenizer's own (GPT-2's 50256, a bpe.py 0), in the sidecar as on disk
    ref = "gpt2" if which == "gpt2" else _fw_bpe_dir
    tok = bpe.load_tokenizer(ref)
    path, docs = _fw_corpus(tmp_path, n=30)
    side = fineweb.write_token_file(fineweb.file_docs(path), tmp_path / "one.bin", ref, num_workers=2)
    ids = np.fromfile(tmp_path / "one.bin", dtype="<u2")
    assert ids.tolist() == [i for d in docs for i in [tok.eot_id] + tok.encode_ordinary(d)]
    assert side == {"format": "tokens-v1", "dtype": "uint16", "vocab_size": tok.vocab_size, "num_tokens": len(ids),
                    "num_docs": 30, "tokenizer": ref, "tokenizer_fingerprint": bpe.tokenizer_fingerprint(ref),
                    "eot_id": {"gpt2": 50256, "bpe": 0}[which]}
    assert json.loads((tmp_path / "one.bin.json").read_text()) == side


def test_fw_empty_input_is_refused_and_leaves_no_token_file(tmp_path, _fw_bpe_dir):
    # one line that starts with what is empty (the source of the stream, the token file), and no file written
    kw = dict(num_workers=1)
    message = _raises(fineweb.write_shards, iter([]), tmp_path / "shards", _fw_bpe_dir, shard_size=100, progress=False,
                      log=lambda *a: None, source="file:c.txt", **kw)
    _bpe_says(message, "file:c.txt: ", "no documents")
    assert not list((tmp_path / "shards").glob("*.bin"))
    blank = tmp_path / "blank.txt"
    blank.write_text(f"  \n{_FW_EOT}\n\n{_FW_EOT}  ", encoding="utf-8")   # only whitespace: no documents
    message = _raises(fineweb.write_token_file, fineweb.file_docs(blank), tmp_path / "one.bin", _fw_bpe_dir, **kw)
    _bpe_says(message, f"{tmp_path / 'one.bin'}: ", "no documents")
    assert not (tmp_path / "one.bin").exists() and not (tmp_path / "one.bin.tmp").exists()


def test_fw_shards_sidecars_and_meta_are_renamed_into_place(tmp_path, monkeypatch, _fw_bpe_dir):
    # "written to a .tmp file and renamed": a kill mid-write never leaves a file that looks complete
    real, renamed = os.replace, []
    monkeypatch.setattr(fineweb.os, "replace", lambda src, dst: (renamed.append((str(src), str(dst))), real(src, dst)))
    _, docs = _fw_corpus(tmp_path, n=30, seed=1)
    out = tmp_path / "out"
    meta = fineweb.write_shards(iter(docs), out, _fw_bpe_dir, shard_size=1500, num_workers=1, progress=False,
                                log=lambda *a: None)
    files = [s["file"] for s in meta["shards"]]
    assert len(files) >= 2
    for name in files + [f"{f}.json" for f in files] + ["meta.json"]:
        assert (f"{out / name}.tmp", str(out / name)) in renamed, name
    renamed.clear()
    fineweb.write_token_file(iter(docs), tmp_path / "one.bin", _fw_bpe_dir, num_workers=1)
    for name in ("one.bin", "one.bin.json"):
        assert (f"{tmp_path / name}.tmp", str(tmp_path / name)) in renamed, name
    assert not list(tmp_path.rglob("*.tmp"))


# ---- fineweb.py: shards and meta.json (write_shards): the stream cut exactly, resumed, refused when not the same


@pytest.mark.parametrize("which, dtype", [pytest.param("gpt2", "uint16", marks=needs_gpt2_files),
                                          pytest.param("gpt2", "uint32", marks=needs_gpt2_files), ("bpe", "uint16")])
def test_fw_round_trip_shards_sidecars_and_meta(tmp_path, _fw_bpe_dir, which, dtype):
    # the shards concatenated are the stream, an eot before each document encoded alone (tiktoken, encode), full
    # shards but the last, shard 0 the validation one; each sidecar names its tokens, documents and the tokenizer's
    # own eot id (a bpe.py tokenizer's is 0); uint32 holds the same stream
    ref = "gpt2" if which == "gpt2" else _fw_bpe_dir
    tok = bpe.load_tokenizer(ref)
    path, docs = _fw_corpus(tmp_path)
    assert list(fineweb.file_docs(path)) == docs
    out = tmp_path / "shards"
    fineweb.write_shards(fineweb.file_docs(path), out, ref, shard_size=2000, dtype=dtype, num_workers=2,
                         progress=False, log=lambda *a: None)
    ids, arrays, meta = _fw_read_shards(out)
    want = [i for d in docs for i in [tok.eot_id] + tok.encode_ordinary(d)]
    assert ids.tolist() == want and tok.decode(want) == _FW_EOT + _FW_EOT.join(docs)
    names = [s["file"] for s in meta["shards"]]
    assert names == ["val_000000.bin"] + [f"train_{i:06d}.bin" for i in range(1, len(names))] and len(names) > 2
    assert [len(a) for a in arrays[:-1]] == [2000] * (len(arrays) - 1) and 0 < len(arrays[-1]) <= 2000
    assert (out / "val_000000.bin").stat().st_size == 2000 * np.dtype(dtype).itemsize
    assert meta["complete"] and (meta["num_tokens"], meta["num_docs"]) == (len(want), len(docs))
    config = meta["config"]
    assert (config["tokenizer"], config["vocab_size"], config["dtype"], config["eot_id"]) == (
        ref, tok.vocab_size, dtype, {"gpt2": 50256, "bpe": 0}[which])
    for s, a in zip(meta["shards"], arrays):
        assert json.loads((out / f"{s['file']}.json").read_text()) == {
            "format": "tokens-v1", "dtype": dtype, "vocab_size": tok.vocab_size, "num_tokens": len(a),
            "num_docs": int((a == tok.eot_id).sum()), "tokenizer": ref,
            "tokenizer_fingerprint": bpe.tokenizer_fingerprint(ref), "eot_id": tok.eot_id}


@needs_data
@needs_gpt2_files
def test_fw_round_trip_on_real_text(tmp_path, _fw_bpe_dir):
    """Real files: curly quotes, non-ASCII, a BOM and CRLF line endings (Pride and Prejudice), a Wikipedia page."""
    import tiktoken
    enc = tiktoken.get_encoding("gpt2")
    folder = tmp_path / "real"
    folder.mkdir()
    (folder / "a.txt").write_bytes((DATA / "tinystories/cs336_tinystories_sample.txt").read_bytes())
    for name, src in [("b.txt", "books/pg1342_pride_and_prejudice.txt"),
                      ("c.txt", "webtext/wikipedia_taylorswift.txt")]:
        data = (DATA / src).read_bytes()
        (folder / name).write_bytes(data[:data.rindex(b"\n", 0, 60_000) + 1])  # cut at a line end, not mid-character
    docs = list(fineweb.folder_docs(folder))
    assert len(docs) == 3 and "\r\n" in docs[1] and not docs[1].startswith("\ufeff")
    assert docs[0] == (folder / "a.txt").read_text(encoding="utf-8").strip()
    for ref, decode, eot in [("gpt2", enc.decode, enc.eot_token), (_fw_bpe_dir, None, None)]:
        tok = bpe.load_tokenizer(ref)
        out = tmp_path / ("gpt2" if ref == "gpt2" else "bpe")
        fineweb.write_shards(iter(docs), out, ref, shard_size=7000, num_workers=2, progress=False, log=lambda *a: None,
                             batch_chars=20_000)
        ids, _, _ = _fw_read_shards(out)
        assert tok.decode(ids.tolist()) == _FW_EOT + _FW_EOT.join(docs)
        if ref == "gpt2":
            assert ids.tolist() == [i for d in docs for i in [eot] + enc.encode_ordinary(d)]


def test_fw_every_shard_size_cuts_the_stream_exactly_and_records_where(tmp_path, monkeypatch, _fw_bpe_dir):
    # 4 documents sharded at every size from 1 token to past the stream: full shards but the last, the stream exact;
    # meta.json records after each shard the documents complete and the next one's tokens written (offset 0 at a
    # boundary), and each shard counts the documents that start in it
    monkeypatch.setattr(os, "fsync", lambda fd: None)   # ~250 small folders: what is written matters here, not when
    tok = bpe.Tokenizer.from_dir(_fw_bpe_dir)
    docs = ["Tom had a red ball.", "Sue ran.", "The cat sat on the mat and looked at the dog.", "Mom smiled."]
    pieces = [[tok.eot_id] + tok.encode(d) for d in docs]
    ref = [i for piece in pieces for i in piece]
    ends = [sum(len(q) for q in pieces[:j + 1]) for j in range(len(pieces))]
    starts = [e - len(piece) for e, piece in zip(ends, pieces)]
    n = len(ref)
    for batch_chars in (1, 30):  # one document per batch; batches of 2, 1, 1 documents
        for size in range(1, n + 2):
            out = tmp_path / f"{batch_chars}_{size}"
            fineweb.write_shards(iter(docs), out, _fw_bpe_dir, shard_size=size, num_workers=1, progress=False,
                                 log=lambda *a: None, batch_chars=batch_chars)
            ids, arrays, meta = _fw_read_shards(out)
            assert ids.tolist() == ref, size
            assert [len(a) for a in arrays] == [size] * (n // size) + ([n % size] if n % size else []), size
            for k, s in enumerate(meta["shards"]):
                lo, hi = k * size, min((k + 1) * size, n)
                done = sum(e <= hi for e in ends)
                assert (s["end_doc"], s["end_offset"]) == (done, hi - (ends[done - 1] if done else 0)), (size, k)
                assert s["num_docs"] == sum(lo <= st < hi for st in starts), (size, k)
            assert meta["num_docs"] == len(docs) and meta["num_tokens"] == n and meta["complete"]


@needs_gpt2_files
def test_fw_resume_after_interruption(tmp_path, monkeypatch):
    # a rerun after the stream died goes on after the last whole shard, to the same bytes; a whole folder: nothing
    path, docs = _fw_corpus(tmp_path, n=150)
    kw = dict(tokenizer="gpt2", shard_size=4000, progress=False, log=lambda *a: None, batch_chars=3000)
    fineweb.write_shards(iter(docs), tmp_path / "clean", num_workers=1, **kw)
    out = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="simulated"):
        fineweb.write_shards(_fw_crashing(docs, 100), out, num_workers=2, **kw)
    meta = json.loads((out / "meta.json").read_text())
    assert not meta["complete"] and len(meta["shards"]) >= 2
    done = {s["file"]: (out / s["file"]).stat().st_mtime_ns for s in meta["shards"]}
    tokenised, real = [], fineweb.encode_docs

    def encode_docs(docs, *a, **k):
        docs = list(docs)
        tokenised.append(len(docs))
        return real(iter(docs), *a, **k)
    monkeypatch.setattr(fineweb, "encode_docs", encode_docs)
    logs = []
    fineweb.write_shards(iter(docs), out, num_workers=2, **{**kw, "log": logs.append})
    start = meta["shards"][-1]["end_doc"]
    assert tokenised == [len(docs) - start] and f"{start:,}" in logs[0]
    assert {f: (out / f).stat().st_mtime_ns for f in done} == done  # complete shards were not rewritten
    a, _, meta_a = _fw_read_shards(tmp_path / "clean")
    b, _, meta_b = _fw_read_shards(out)
    assert np.array_equal(a, b) and meta_a["shards"] == meta_b["shards"]
    for f in (tmp_path / "clean").glob("*.bin"):
        assert f.read_bytes() == (out / f.name).read_bytes()
    tokenised.clear()
    assert fineweb.write_shards(iter(docs), out, num_workers=1, **kw) == meta_b and tokenised == []


def test_fw_interrupted_run_meta_counts_the_documents_its_shards_hold(tmp_path, _fw_bpe_dir):
    # after an interruption meta.json counts every document with tokens on disk, the one split by the boundary too
    _, docs = _fw_corpus(tmp_path, n=80, seed=4)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated"):
        fineweb.write_shards(_fw_crashing(docs, 60), out, _fw_bpe_dir, shard_size=1999, num_workers=1, progress=False,
                             log=lambda *a: None, batch_chars=2000)
    meta = json.loads((out / "meta.json").read_text())
    last = meta["shards"][-1]
    assert not meta["complete"] and len(meta["shards"]) >= 2 and last["end_offset"] > 0  # a document cut in two
    assert meta["num_docs"] == sum(s["num_docs"] for s in meta["shards"]) == last["end_doc"] + 1
    assert meta["num_tokens"] == sum(s["num_tokens"] for s in meta["shards"])


def test_fw_seed_matters_only_when_shuffling(tmp_path, _fw_bpe_dir):
    # without --shuffle_docs the seed changes nothing, so it is not recorded and a rerun with another seed resumes
    _, docs = _fw_corpus(tmp_path, n=60, seed=6)
    kw = dict(shard_size=2000, num_workers=1, progress=False, log=lambda *a: None, batch_chars=2000)
    with pytest.raises(RuntimeError, match="simulated"):
        fineweb.write_shards(_fw_crashing(docs, 40), tmp_path / "out", _fw_bpe_dir, seed=1, **kw)
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["config"]["seed"] is None
    meta = fineweb.write_shards(iter(docs), tmp_path / "out", _fw_bpe_dir, seed=2, **kw)
    clean = fineweb.write_shards(iter(docs), tmp_path / "clean", _fw_bpe_dir, **kw)
    assert meta["complete"] and meta["shards"] == clean["shards"]
    shuffled = fineweb.write_shards(iter(docs), tmp_path / "shuf", _fw_bpe_dir, shuffle_docs=True, seed=7, **kw)
    assert shuffled["config"]["seed"] == 7


_FW_KW = dict(shard_size=10**6, num_workers=1, progress=False, log=lambda *a: None)


@pytest.fixture(scope="module")
def _fw_written(tmp_path_factory, _fw_bpe_dir):
    """(out, docs): 20 stories written once into a complete shard folder (_fw_bpe_dir); each test continues a copy."""
    tmp = tmp_path_factory.mktemp("fw_written")
    _, docs = _fw_corpus(tmp, n=20)
    fineweb.write_shards(iter(docs), tmp / "out", _fw_bpe_dir, **_FW_KW)
    return tmp / "out", docs


def _fw_meta_edit(change):
    return lambda out: (out / "meta.json").write_text(json.dumps(change(json.loads((out / "meta.json").read_text()))))


def _fw_foreign(sidecar):
    """out/ holding a token file fineweb.py did not write (with this sidecar text), and no meta.json."""
    def make(out):
        shutil.rmtree(out)
        out.mkdir()
        (out / "train.bin").write_bytes(b"\0\0")
        if sidecar:
            (out / "train.bin.json").write_text(sidecar)
    return make


def _fw_shard_of(nbytes):
    """An interrupted run's folder (meta.json not complete) whose shard is now nbytes(its tokens) long, or gone."""
    def change(out):
        meta = json.loads((out / "meta.json").read_text())
        (out / "meta.json").write_text(json.dumps({**meta, "complete": False}))
        shard = out / "val_000000.bin"
        shard.unlink() if nbytes is None else shard.write_bytes(b"\0" * nbytes(meta["shards"][0]["num_tokens"]))
    return change


_FW_OUT_DIR_REFUSALS = {   # case: (a change to the written folder, write_shards' settings, the line's start, what it
    # names); {out}: the folder, {tok}: its tokenizer, {listed}: the tokens its shard holds
    "other-settings": (None, dict(shard_size=100), "{out}: ", ["shard_size=1000000", "--fresh"]),
    "gpt2-another-tokenizer": (None, dict(tokenizer="gpt2"), "{out}: ",
                               ["'{tok}'", "'gpt2'", "{fingerprint}", "--fresh"]),
    "meta-not-json": (lambda out: (out / "meta.json").write_text("{oops"), {}, "{out}/meta.json: ", []),
    "meta-a-list": (_fw_meta_edit(lambda m: [1]), {}, "{out}/meta.json: ", []),
    "meta-without-config": (_fw_meta_edit(lambda m: {"complete": False}), {}, "{out}/meta.json: ", []),
    # every shard meta.json lists must be there with the size of its tokens, or a resume would be silently wrong
    "shard-truncated": (_fw_shard_of(lambda n: 2), {}, "{out}/val_000000.bin: ", ["{listed} tokens"]),
    "shard-one-token-longer": (_fw_shard_of(lambda n: 2 * n + 2), {}, "{out}/val_000000.bin: ", ["{listed} tokens"]),
    "shard-missing": (_fw_shard_of(None), {}, "{out}/val_000000.bin: ", ["{listed} tokens"]),
    # token files from elsewhere, with no meta.json of fineweb.py's: never mixed with new shards, nor overwritten
    "foreign-token-files": (_fw_foreign(None), {}, "{out}: ", ["meta.json"]),
    "foreign-token-files-and-sidecar": (_fw_foreign('{"tokenizer": "tok/elsewhere"}'), {}, "{out}: ",
                                        ["meta.json", "'tok/elsewhere'"]),
    "foreign-token-files-and-a-list": (_fw_foreign("[1, 2]"), {}, "{out}: ", ["no meta.json"]),
}


@pytest.mark.parametrize("case", list(_FW_OUT_DIR_REFUSALS))
def test_fw_refuses_an_out_dir_it_cannot_continue(tmp_path, _fw_bpe_dir, _fw_written, case):
    # one line naming the folder or the file at fault and the way on; the folder is left as it is
    if case.startswith("gpt2") and not HAVE_GPT2_FILES:
        pytest.skip("GPT-2's tokenizer files are unavailable offline")
    change, kw, prefix, named = _FW_OUT_DIR_REFUSALS[case]
    out = tmp_path / "out"
    shutil.copytree(_fw_written[0], out)
    listed = json.loads((out / "meta.json").read_text())["shards"][0]["num_tokens"]
    if change:
        change(out)
    before = _files(out)
    fill = lambda s: s.replace("{out}", str(out)).replace("{tok}", _fw_bpe_dir).replace("{listed}", f"{listed:,}") \
        .replace("{fingerprint}", bpe.tokenizer_fingerprint(_fw_bpe_dir))
    message = _raises(fineweb.write_shards, iter(_fw_written[1]), out, **{**_FW_KW, "tokenizer": _fw_bpe_dir, **kw})
    _bpe_says(message, fill(prefix), *map(fill, named))
    assert _files(out) == before


def test_fw_an_out_dir_goes_on_with_its_tokenizer_however_spelled_and_a_folder_named_gpt2_is_a_folder(
        tmp_path, _fw_bpe_dir, _fw_written, monkeypatch):
    # a tokenizer folder spelled with a trailing slash is the same one; a folder named gpt2 is that folder
    out, docs = _fw_written
    shutil.copytree(out, tmp_path / "out")
    assert fineweb.write_shards(iter(docs), tmp_path / "out", _fw_bpe_dir + "/", **_FW_KW)["complete"]
    shutil.copytree(_fw_bpe_dir, tmp_path / "gpt2")
    monkeypatch.chdir(tmp_path)
    meta = fineweb.write_shards(iter(docs), tmp_path / "local", "./gpt2", **_FW_KW)
    assert meta["config"]["tokenizer"] == "./gpt2" and meta["config"]["vocab_size"] == 300


def test_fw_cli_hub_documents_are_tokenised_as_given_unless_strip_docs(tmp_path, monkeypatch, _fw_bpe_dir):
    # --dataset documents go in as the hub gives them (build-nanogpt's stream); --strip_docs strips them and drops
    # empty ones; a folder written before the setting was recorded goes on only with --strip_docs, else refused
    rows = ["  first page \n", "", "second page"]
    _fw_fake_datasets(monkeypatch, {"train": rows}, [])
    tok = bpe.load_tokenizer(_fw_bpe_dir)

    def run(out, *flags):
        _run(fineweb, monkeypatch, "--dataset=fineweb-edu", f"--tokenizer={_fw_bpe_dir}", f"--out_dir={out}",
             "--num_workers=1", *flags)
        ids, _, meta = _fw_read_shards(out)
        return tok.decode(ids.tolist()), meta["config"].get("strip_docs")
    assert run(tmp_path / "given") == ("".join(_FW_EOT + d for d in rows), False)
    assert run(tmp_path / "stripped", "--strip_docs") == (f"{_FW_EOT}first page{_FW_EOT}second page", True)
    meta_path = tmp_path / "stripped" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["config"]["strip_docs"]
    meta_path.write_text(json.dumps(meta))
    assert run(tmp_path / "stripped", "--strip_docs") == (f"{_FW_EOT}first page{_FW_EOT}second page", None)
    _bpe_says(_bad_exit(monkeypatch, fineweb, "--dataset=fineweb-edu", f"--tokenizer={_fw_bpe_dir}",
                      f"--out_dir={tmp_path / 'stripped'}", "--num_workers=1"), "fineweb.py: ", "strip_docs=True")


def test_fw_refuses_shards_of_a_tokenizer_retrained_in_the_same_folder(tmp_path, _fw_bpe_dir):
    # the same folder name with other files inside is another tokenizer: the refusal names the fingerprints
    tok_dir = tmp_path / "tok"
    shutil.copytree(_fw_bpe_dir, tok_dir)
    _, docs = _fw_corpus(tmp_path, n=20, seed=2)
    kw = dict(shard_size=10**6, num_workers=1, progress=False, log=lambda *a: None)
    fineweb.write_shards(iter(docs), tmp_path / "out", tok_dir, **kw)
    old = bpe.tokenizer_fingerprint(str(tok_dir))
    merges = (tok_dir / "merges.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (tok_dir / "merges.txt").write_text("".join(merges[:-1]), encoding="utf-8")  # "retrained": one merge fewer
    new = bpe.tokenizer_fingerprint(str(tok_dir))
    assert new != old
    message = _raises(fineweb.write_shards, iter(docs), tmp_path / "out", tok_dir, **kw)
    _bpe_says(message, f"{tmp_path / 'out'}: ", old, new)


# ---- fineweb.py: the main job's data (prepare_tinystories): corpus, tokenizer, tokens, each step reused or redone


def test_fw_prepare_tinystories_offline_and_reuse(tmp_path, monkeypatch):
    # offline: the generated corpus, its tokenizer, the stories encoded; a second call reuses every step; another
    # vocabulary keeps the corpus only; fresh=True, or an unreadable prepared.json (said first), redoes everything
    logs = []
    steps = _fw_steps(monkeypatch)
    kw = dict(vocab_size=320, allow_download=False, log=logs.append, corpus_bytes=40_000, num_workers=2)
    got = fineweb.prepare_tinystories(tmp_path / "ts", **kw)
    d = Path(got["data_dir"])
    assert got["tokenizer"] == str(d / "tokenizer") and "stories.py" in got["source"]
    assert any("downloads disabled" in line for line in logs)
    assert steps == ["corpus", "corpus", "tokenizer", "tokens", "tokens"]
    tok = bpe.load_tokenizer(got["tokenizer"])
    assert tok.vocab_size == 320 and tok.eot_id is not None
    for split in ("train", "val"):
        side = json.loads((d / f"{split}.bin.json").read_text())
        ids = np.fromfile(d / f"{split}.bin", dtype="<u2")
        docs = list(fineweb.file_docs(d / f"{split}.txt"))
        assert side["format"] == "tokens-v1" and side["num_tokens"] == len(ids) == got[f"{split}_tokens"]
        assert side["num_docs"] == len(docs) and side["tokenizer"] == got["tokenizer"] and side["vocab_size"] == 320
        assert tok.decode(ids.tolist()) == _FW_EOT + _FW_EOT.join(docs)
    assert 36_000 <= (d / "train.txt").stat().st_size and 1_000 <= (d / "val.txt").stat().st_size
    train_docs, val_docs = list(fineweb.file_docs(d / "train.txt")), list(fineweb.file_docs(d / "val.txt"))
    assert not set(val_docs) & set(train_docs)  # held-out text: the val loss is not measured on training stories
    stamps = {p: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}
    steps.clear()
    again = fineweb.prepare_tinystories(tmp_path / "ts", **kw)
    assert again == got and steps == []
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    steps.clear()
    other = fineweb.prepare_tinystories(tmp_path / "ts", **{**kw, "vocab_size": 300})
    assert bpe.load_tokenizer(other["tokenizer"]).vocab_size == 300 and steps == ["tokenizer", "tokens", "tokens"]
    steps.clear()
    fineweb.prepare_tinystories(tmp_path / "ts", fresh=True, **kw)
    assert steps == ["corpus", "corpus", "tokenizer", "tokens", "tokens"]
    assert json.loads((d / "train.bin.json").read_text())["num_tokens"] == got["train_tokens"]
    for broken in ("{oops", "[1]"):
        (d / "prepared.json").write_text(broken)
        logs.clear()
        steps.clear()
        assert fineweb.prepare_tinystories(tmp_path / "ts", **kw) == got
        _bpe_says(logs[0], f"{d / 'prepared.json'}: ")
        assert steps == ["corpus", "corpus", "tokenizer", "tokens", "tokens"]


def test_fw_prepare_tinystories_redoes_a_step_whose_request_or_files_changed(tmp_path, monkeypatch):
    steps = _fw_steps(monkeypatch)
    kw = dict(vocab_size=280, allow_download=False, log=lambda *a: None, num_workers=1)
    d = tmp_path / "ts"
    fineweb.prepare_tinystories(d, corpus_bytes=12_000, **kw)
    small = (d / "train.txt").read_bytes()
    # another corpus size: a new corpus, not the old one reused
    steps.clear()
    fineweb.prepare_tinystories(d, corpus_bytes=24_000, **kw)
    assert steps[:2] == ["corpus", "corpus"]
    assert (d / "train.txt").stat().st_size > 1.5 * len(small)
    big = (d / "train.txt").read_bytes()
    # a corpus file edited (or cut short) after it was recorded: made again, not trusted
    (d / "train.txt").write_bytes(big[:5000])
    steps.clear()
    fineweb.prepare_tinystories(d, corpus_bytes=24_000, **kw)
    assert steps[:2] == ["corpus", "corpus"]
    assert (d / "train.txt").read_bytes() == big
    # a tokenizer changed on disk after it was recorded: trained again, and the tokens encoded again
    merges = (d / "tokenizer" / "merges.txt").read_text(encoding="utf-8").splitlines()
    (d / "tokenizer" / "merges.txt").write_text("\n".join(merges[:-5]) + "\n", encoding="utf-8")
    steps.clear()
    fineweb.prepare_tinystories(d, corpus_bytes=24_000, **kw)
    assert steps == ["tokenizer", "tokens", "tokens"]


def test_fineweb_says_the_vocabulary_reached_not_the_one_asked_for(tmp_path):
    # a text that runs out of pairs before --vocab_size 10000: every tokenizer line gives the vocabulary reached
    said = []
    for _ in range(2):   # trained, then reused
        fineweb.prepare_tinystories(tmp_path / "d", vocab_size=10000, allow_download=False, corpus_bytes=3000,
                                    log=said.append)
    path, _ = _fw_corpus(tmp_path, n=10)
    fineweb.train_tokenizer_on_docs(fineweb.file_docs(path), 10000, tmp_path / "t", log=said.append)
    reached = [bpe.load_tokenizer(tmp_path / d).vocab_size for d in ("d/tokenizer", "d/tokenizer", "t")]
    lines = [line for line in said if line.startswith("tokenizer: ")]
    assert len(lines) == 3 and all(n < 10000 for n in reached) and not any("10000" in line for line in lines)
    assert all(f"vocab {n}" in line for n, line in zip(reached, lines)), lines


def test_fineweb_prepare_tinystories_refuses_bad_corpus_bytes_first(tmp_path):
    message = _raises(fineweb.prepare_tinystories, tmp_path / "d", 300, allow_download=False, corpus_bytes=-5,
                      log=lambda *a: None)
    _one_line_naming(message, "corpus_bytes ", "-5")
    assert not (tmp_path / "d").exists()


def test_fw_prepare_all_of_tinystories_offline_fails_before_writing(tmp_path, monkeypatch, capsys):
    # all of TinyStories has no generated fallback: one error saying what size to give, nothing written or said first
    monkeypatch.setattr(fineweb, "hub_reachable", lambda *a, **k: (False, "cannot reach huggingface.co (test)"))
    logs = []
    for allow, why in [(True, "cannot reach huggingface.co"), (False, "downloads disabled")]:
        message = _raises(fineweb.prepare_tinystories, tmp_path / "all", allow_download=allow, corpus_bytes=None,
                          log=logs.append)
        _one_line_naming(message, "all of TinyStories", "--corpus_bytes 0", why, "--corpus_bytes 4000000")
    assert logs == [] and not (tmp_path / "all").exists()
    # a prepared folder asked to start over (fresh) for all of TinyStories offline: refused before it is wiped
    fineweb.prepare_tinystories(tmp_path / "ts", 280, allow_download=False, corpus_bytes=6000, log=logs.append)
    before = sorted(p.name for p in (tmp_path / "ts").iterdir())
    message = _raises(fineweb.prepare_tinystories, tmp_path / "ts", 280, fresh=True, corpus_bytes=None, log=logs.append)
    _one_line_naming(message, "all of TinyStories", "--corpus_bytes 0")
    assert sorted(p.name for p in (tmp_path / "ts").iterdir()) == before
    capsys.readouterr()
    msg = _bad_exit(monkeypatch, fineweb, "--prepare_tinystories", "--corpus_bytes=0", f"--out_dir={tmp_path / 'cli'}")
    _one_line_naming(msg, "fineweb.py: all of TinyStories", "--corpus_bytes 0")
    assert capsys.readouterr().out == "" and not (tmp_path / "cli").exists()


def test_fw_prepare_tinystories_never_writes_over_files_it_did_not_make(tmp_path, monkeypatch):
    # a folder without prepared.json holding any file it writes: refused in one line, nothing touched; --fresh
    # replaces them; a run interrupted mid-corpus (its mark written first) is resumed by the same command
    monkeypatch.setattr(fineweb, "hub_reachable", lambda *a, **k: (False, "offline in tests"))
    cli = ["--prepare_tinystories", "--corpus_bytes=6000", "--vocab_size=280", "--num_workers=1"]
    for name in ("train.txt", "val.txt", "tokenizer", "train.bin", "val.bin.json"):
        d = tmp_path / name.replace(".", "_")
        (d / name).parent.mkdir(parents=True)
        (d / "tokenizer").mkdir() if name == "tokenizer" else (d / name).write_text("mine")
        (d / "tokenizer" / "vocab.json").write_text("mine") if name == "tokenizer" else None
        before = _files(d)
        _bad_says(_bad_exit(monkeypatch, fineweb, *cli, f"--out_dir={d}"), f"fineweb.py: {d}: ", name, "--out_dir",
                  "--fresh")
        assert _files(d) == before and sorted(p.name for p in d.iterdir()) == [name]
    _run(fineweb, monkeypatch, *cli, f"--out_dir={tmp_path / 'train_txt'}", "--fresh")
    assert (tmp_path / "train_txt" / "train.txt").read_text() != "mine"

    def ctrl_c_on_val(path, *a):
        if Path(path).name == "val.txt":
            raise KeyboardInterrupt
        return real(path, *a)
    real = stories.write_corpus
    monkeypatch.setattr(stories, "write_corpus", ctrl_c_on_val)
    with pytest.raises(KeyboardInterrupt):
        fineweb.prepare_tinystories(tmp_path / "cut", 280, allow_download=False, corpus_bytes=6000, log=_train_quiet)
    assert (tmp_path / "cut" / "train.txt").is_file() and not (tmp_path / "cut" / "val.txt").exists()
    monkeypatch.setattr(stories, "write_corpus", real)
    got = fineweb.prepare_tinystories(tmp_path / "cut", 280, allow_download=False, corpus_bytes=6000,
                                      log=_train_quiet)
    assert got["val_tokens"] > 0 and (tmp_path / "cut" / "val.bin").is_file()


def test_fw_prepare_tinystories_falls_back_to_the_generated_corpus_when_the_download_fails(tmp_path, monkeypatch):
    # a failing download: one line naming the error, then stories.py's corpus, and no half-downloaded file left
    logs = []
    _fw_fake_datasets(monkeypatch, {}, [], fail=ConnectionError("no route to host"))
    got = fineweb.prepare_tinystories(tmp_path / "fail", vocab_size=280, log=logs.append, corpus_bytes=6000,
                                      num_workers=1)
    assert "stories.py" in got["source"]
    _one_line_naming(logs[0], "TinyStories ", "ConnectionError", "no route to host")
    assert not list((tmp_path / "fail").glob("*.tmp"))


@pytest.mark.parametrize("rows", [
    {"train": [f"Train story {i}. The cat sat." for i in range(400)],
     "validation": [f"Val story {i}." for i in range(200)]},
    {"train": [f"Trn story {i:05d}" for i in range(400)], "validation": [f"Val story {i:05d}" for i in range(200)]},
], ids=["rows_of_any_length", "rows_of_30_bytes"])
def test_fw_prepare_tinystories_download_stops_at_the_first_story_that_reaches_each_size(tmp_path, monkeypatch, rows):
    # 95 % and 5 % of corpus_bytes up to the first story reaching it (30-byte rows: 190 and 10), streamed from the hub
    calls = []
    _fw_fake_datasets(monkeypatch, rows, calls)
    got = fineweb.prepare_tinystories(tmp_path / "dl", vocab_size=280, log=lambda *a: None, corpus_bytes=6000,
                                      num_workers=1)
    assert got["source"].startswith("TinyStories") and {c["split"] for c in calls} == {"train", "validation"}
    assert all(c["path"] == "roneneldan/TinyStories" and c["streaming"] for c in calls)
    for split, path, limit in (("train", "train.txt", 5700), ("validation", "val.txt", 300)):
        text = (tmp_path / "dl" / path).read_text(encoding="utf-8")
        n = len(list(fineweb.file_docs(tmp_path / "dl" / path)))
        assert text == "".join(d + "\n" + _FW_EOT + "\n" for d in rows[split][:n])   # each story, then the separator
        last = len(rows[split][n - 1]) + len(_FW_EOT) + 2
        assert limit <= len(text.encode()) < limit + last, (split, len(text))


# ---- fineweb.py: the speedrun's and experiments.py's text (tinystories_head)


def test_fw_tinystories_head_is_the_head_of_each_split_fetched_once(tmp_path, monkeypatch):
    # through `datasets` (local rows): train.txt the first train_bytes of the stories, cut mid-story (never inside a
    # character), valid.txt the first val_stories; a second call reuses both, an edited file is fetched again
    calls, logs = [], []
    rows = {"train": [f"Train story {i}.\n\nIts second paragraph, \u00fcber {i}." for i in range(400)],
            "validation": [f"Val story {i}." for i in range(50)]}
    _fw_fake_datasets(monkeypatch, rows, calls)
    stream = "".join(d + "\n" + _FW_EOT + "\n" for d in rows["train"]).encode()
    cut = stream.index("\u00fc".encode(), 5000) + 1   # inside a two-byte character
    train_txt, valid_txt = fineweb.tinystories_head(tmp_path / "h", train_bytes=cut, val_stories=20, log=logs.append)
    assert train_txt.read_bytes() == stream[:cut - 1]
    assert valid_txt.read_text() == "".join(d + "\n" + _FW_EOT + "\n" for d in rows["validation"][:20])
    assert {(c["path"], c["split"], c["streaming"]) for c in calls} == {
        ("roneneldan/TinyStories", "train", True), ("roneneldan/TinyStories", "validation", True)}
    calls.clear()
    assert fineweb.tinystories_head(tmp_path / "h", train_bytes=cut, val_stories=20, log=logs.append) == (
        train_txt, valid_txt) and calls == []
    valid_txt.write_text("edited")
    fineweb.tinystories_head(tmp_path / "h", train_bytes=cut, val_stories=20, log=logs.append)
    assert len(calls) == 2 and valid_txt.read_text().startswith("Val story 0.")


def test_fw_tinystories_head_offline_says_in_one_line_that_its_figures_do_not_compare(tmp_path, monkeypatch, capsys):
    # offline: stories.py's stories of the same sizes, said in one line each time (the CLI too); online: TinyStories
    monkeypatch.setattr(fineweb, "hub_reachable", lambda *a, **k: (False, "cannot reach huggingface.co (test)"))
    logs = []
    train_txt, valid_txt = fineweb.tinystories_head(tmp_path / "h", train_bytes=6000, val_stories=12, log=logs.append)
    (said,) = [line for line in logs if "compare" in line]
    _one_line_naming(said, "TinyStories ", "cannot reach huggingface.co", "stories.py", "published")
    assert train_txt.stat().st_size == 6000 and len(list(fineweb.file_docs(valid_txt))) == 12
    generated, logs[:] = train_txt.read_bytes(), []
    fineweb.tinystories_head(tmp_path / "h", train_bytes=6000, val_stories=12, log=logs.append)
    assert train_txt.read_bytes() == generated and [line for line in logs if "compare" in line] == [said]
    _fw_fake_datasets(monkeypatch, {"train": ["A real story."] * 1000, "validation": ["A real one."] * 20}, [])
    fineweb.tinystories_head(tmp_path / "h", train_bytes=6000, val_stories=12, log=logs.append)
    assert train_txt.read_text().startswith("A real story.") and train_txt.stat().st_size == 6000
    monkeypatch.setattr(fineweb, "hub_reachable", lambda *a, **k: (False, "cannot reach huggingface.co (test)"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fineweb.py", "--tinystories_head", "--out_dir=cli"])
    capsys.readouterr()
    fineweb.main()
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if "compare" in line]) == 1 and (tmp_path / "cli/valid.txt").is_file()
    assert (tmp_path / "cli/train.txt").stat().st_size == fineweb.HEAD_TRAIN_BYTES


def test_fw_tinystories_head_never_writes_over_text_it_did_not_make(tmp_path, monkeypatch):
    # train.txt or valid.txt without head.json: refused in one line, nothing touched; fresh replaces them; a fetch
    # interrupted between the two files (its mark written first) is resumed by the same call
    monkeypatch.setattr(fineweb, "hub_reachable", lambda *a, **k: (False, "offline in tests"))
    for name in ("train.txt", "valid.txt"):
        d = tmp_path / name.replace(".", "_")
        d.mkdir()
        (d / name).write_text("mine")
        _bad_says(_bad_exit(monkeypatch, fineweb, "--tinystories_head", f"--out_dir={d}"), f"fineweb.py: {d}: ", name,
                  "--out_dir", "--fresh")
        assert _files(d) == {d / name: b"mine"}
    fineweb.tinystories_head(tmp_path / "train_txt", train_bytes=6000, val_stories=12, log=_train_quiet, fresh=True)
    assert (tmp_path / "train_txt" / "train.txt").stat().st_size == 6000

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt
    real = stories.generate_stories
    monkeypatch.setattr(stories, "generate_stories", ctrl_c)   # after train.txt, before valid.txt
    with pytest.raises(KeyboardInterrupt):
        fineweb.tinystories_head(tmp_path / "cut", train_bytes=6000, val_stories=12, log=_train_quiet)
    assert (tmp_path / "cut" / "train.txt").is_file() and not (tmp_path / "cut" / "valid.txt").exists()
    monkeypatch.setattr(stories, "generate_stories", real)
    _, valid_txt = fineweb.tinystories_head(tmp_path / "cut", train_bytes=6000, val_stories=12, log=_train_quiet)
    assert len(list(fineweb.file_docs(valid_txt))) == 12


# ---- fineweb.py: a tokenizer trained on the corpus first (train_tokenizer_on_docs)


def test_fw_train_tokenizer_on_docs_then_shard(tmp_path, monkeypatch):
    # trained once and reused for the same request; another size or amount of text is refused in one line naming both
    path, docs = _fw_corpus(tmp_path, n=80, seed=4)
    logs = []
    tok_dir = tmp_path / "out/tokenizer"
    ref = fineweb.train_tokenizer_on_docs(fineweb.file_docs(path), 290, tok_dir, num_workers=1, log=logs.append)
    tok = bpe.load_tokenizer(ref)
    assert tok.vocab_size == 290 and tok.eot_id == 0 and not (tmp_path / "out/bpe_train.txt.tmp").exists()
    monkeypatch.setattr(bpe, "train_bpe", _bpe_not_called)
    assert fineweb.train_tokenizer_on_docs(iter([]), 290, tok_dir, log=logs.append) == ref
    fineweb.write_shards(fineweb.file_docs(path), tmp_path / "out", ref, shard_size=2000, num_workers=1,
                         progress=False, log=logs.append)
    ids, _, meta = _fw_read_shards(tmp_path / "out")
    assert tok.decode(ids.tolist()) == _FW_EOT + _FW_EOT.join(docs) and meta["config"]["tokenizer"] == ref
    for size, max_bytes in [(300, None), (290, 5000)]:
        message = _raises(fineweb.train_tokenizer_on_docs, iter([]), size, tok_dir, max_bytes, log=logs.append)
        _bpe_says(message, f"{tok_dir}: ", "vocab_size 290, bpe_train_bytes 0",
                 f"vocab_size {size}, bpe_train_bytes {max_bytes or 0}", "--out_dir")


def test_fw_tokenizer_training_budget_counts_utf8_bytes(tmp_path, monkeypatch):
    # 41 UTF-8 bytes, 36 characters per phrase: the budget is in bytes, up to the first document that reaches it
    docs = ["Café crème brûlée, s'il vous plaît. " * 20 + str(i) for i in range(10, 40)]
    per_doc = [len(d.encode("utf-8")) + len(_FW_EOT) + 2 for d in docs]
    assert per_doc[0] == 20 * 41 + 2 + 15
    sizes = _fw_bpe_training_sizes(monkeypatch)
    fineweb.train_tokenizer_on_docs(iter(docs), 270, tmp_path / "tok", max_bytes=3000, num_workers=1,
                                    log=lambda *a: None)
    assert sizes == [sum(per_doc[:4])]  # 3 docs are 2511 bytes, 4 docs the first >= 3000
    # a budget met exactly by 3 documents stops there: no 4th
    fineweb.train_tokenizer_on_docs(iter(docs), 270, tmp_path / "tok3", max_bytes=sum(per_doc[:3]), num_workers=1,
                                    log=lambda *a: None)
    assert sizes[-1] == sum(per_doc[:3])


# ---- fineweb.py: the command line


def test_fw_cli_shuffle_docs_fresh_and_default_out_dir(tmp_path, monkeypatch, _fw_bpe_dir):
    # --shuffle_docs shuffles the stream, --fresh reaches prepare_tinystories, the default folders are --help's
    got = []
    monkeypatch.setattr(fineweb, "prepare_tinystories", lambda *a, **k: got.append((a, k)))
    monkeypatch.setattr(fineweb, "write_shards", lambda docs, out_dir, *a, **k: got.append((list(docs), out_dir, k)))
    monkeypatch.chdir(tmp_path)
    path, docs = _fw_corpus(tmp_path, n=40, seed=2, name="c.txt")

    def run(*argv):
        got.clear()
        _run(fineweb, monkeypatch, *argv)
        return got[0]
    a, k = run("--prepare_tinystories", "--fresh")
    assert a == ("data/tinystories", 2048) and k["fresh"] is True and k["corpus_bytes"] == 4_000_000
    a, k = run("--prepare_tinystories", "--corpus_bytes=0")
    assert k["fresh"] is False and k["corpus_bytes"] is None
    shuffled, out_dir, k = run(f"--input={path}", f"--tokenizer={_fw_bpe_dir}", "--shuffle_docs", "--shuffle_buffer=8",
                               "--seed=3", "--num_workers=1")
    assert shuffled == list(fineweb.buffer_shuffle(iter(docs), 8, 3)) and shuffled != docs
    assert (out_dir, k["shuffle_docs"], k["seed"]) == ("data/c-bpe", True, 3)
    plain, out_dir, k = run(f"--input={path}", "--num_workers=1")
    assert plain == docs and (out_dir, k["shuffle_docs"]) == ("data/c-gpt2", False)


def test_fw_max_docs_limits_the_tokenizer_training_text_too(tmp_path, monkeypatch):
    path, docs = _fw_corpus(tmp_path, n=80, seed=4)
    sizes = _fw_bpe_training_sizes(monkeypatch)
    argv = [f"--input={path}", "--max_docs=5", "--vocab_size=280", f"--out_dir={tmp_path / 'out'}", "--shard_size=500",
            "--num_workers=1"]
    _run(fineweb, monkeypatch, *argv)
    assert sizes == [sum(len(d.encode()) + len(_FW_EOT) + 2 for d in docs[:5])]
    ids, _, meta = _fw_read_shards(tmp_path / "out")
    assert meta["num_docs"] == 5 and meta["config"]["source"].endswith("[:5]")
    # the tokenizer remembers its documents: other ones (--max_docs=6) never reuse it in silence
    msg = _bad_exit(monkeypatch, fineweb, *[a.replace("--max_docs=5", "--max_docs=6") for a in argv])
    _bpe_says(msg, f"fineweb.py: {tmp_path / 'out' / 'tokenizer'}: ", "[:5]", "[:6]", "--out_dir")


def test_fw_cli_vocab_size_reuses_a_tokenizer_it_did_not_train_only_at_that_size(tmp_path, monkeypatch, _fw_bpe_dir):
    # out/tokenizer with no request.json (put there by hand): another --vocab_size is refused in one line naming both
    # sizes, before any training or shard; the same size is reused
    path, _ = _fw_corpus(tmp_path, n=40, seed=2)
    out = tmp_path / "out"
    shutil.copytree(_fw_bpe_dir, out / "tokenizer")
    monkeypatch.setattr(bpe, "train_bpe", _bpe_not_called)
    argv = [f"--input={path}", f"--out_dir={out}", "--shard_size=500", "--num_workers=1"]
    before = _files(tmp_path)
    msg = _bad_exit(monkeypatch, fineweb, *argv, "--vocab_size=400")
    _bpe_says(msg, f"fineweb.py: {out / 'tokenizer'}: ", "300", "400", "--tokenizer")
    assert _files(tmp_path) == before
    _run(fineweb, monkeypatch, *argv, "--vocab_size=300")
    assert json.loads((out / "meta.json").read_text())["config"]["vocab_size"] == 300


def test_fw_cli_vocab_size_refuses_shards_of_another_tokenizer_before_training_one(tmp_path, monkeypatch,
                                                                                   _fw_bpe_dir):
    # shards made with --tokenizer: --vocab_size into that folder is refused before it trains a tokenizer (none is
    # left behind), as are token files fineweb.py did not write
    path, _ = _fw_corpus(tmp_path, n=40, seed=2)
    out = tmp_path / "out"
    argv = [f"--input={path}", f"--out_dir={out}", "--shard_size=500", "--num_workers=1"]
    _run(fineweb, monkeypatch, *argv, f"--tokenizer={_fw_bpe_dir}")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.bin").write_bytes(b"\0\0")
    monkeypatch.setattr(bpe, "train_bpe", _bpe_not_called)
    before = _files(tmp_path)
    _bpe_says(_bad_exit(monkeypatch, fineweb, *argv, "--vocab_size=280"), f"fineweb.py: {out}: ", "--fresh")
    _bpe_says(_bad_exit(monkeypatch, fineweb, *argv, "--vocab_size=280", f"--out_dir={mine}"), f"fineweb.py: {mine}: ",
              "--out_dir")
    assert _files(tmp_path) == before and not (out / "tokenizer").exists() and not (mine / "tokenizer").exists()


def test_fw_cli_fresh_starts_a_shard_folder_over_and_keeps_other_files(tmp_path, monkeypatch, capsys):
    # a shard size too large leaves only the validation shard (a hint names --shard_size and --fresh); a smaller one
    # is refused, and with --fresh rebuilt, its tokenizer included, a file fineweb.py did not write kept
    path, _ = _fw_corpus(tmp_path, n=60, seed=1)
    out = tmp_path / "out"
    argv = [f"--input={path}", f"--out_dir={out}", "--vocab_size=300", "--num_workers=1"]

    def run(*more):
        _run(fineweb, monkeypatch, *argv, *more)
        return capsys.readouterr().out.splitlines()
    said = run("--shard_size=1000000")
    assert sorted(p.name for p in out.glob("*.bin")) == ["val_000000.bin"]
    assert any(line.startswith(f"{out}: ") and "--shard_size" in line and "--fresh" in line for line in said), said
    (out / "notes.txt").write_text("mine")
    msg = _bad_exit(monkeypatch, fineweb, *argv, "--shard_size=2000")
    _bpe_says(msg, f"fineweb.py: {out}: ", "shard_size=1000000", "--fresh")
    old_vocab = (out / "tokenizer" / "vocab.json").stat().st_mtime_ns
    said = run("--shard_size=2000", "--fresh")
    assert any(line.startswith(f"{out}: ") and "1 shard" in line and "tokenizer" in line for line in said), said
    meta = json.loads((out / "meta.json").read_text())
    assert meta["config"]["shard_size"] == 2000 and len(meta["shards"]) > 2 and meta["complete"]
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(s["file"] for s in meta["shards"])
    assert (out / "tokenizer" / "vocab.json").stat().st_mtime_ns != old_vocab and (out / "notes.txt").exists()
    other = tmp_path / "other"   # a folder fineweb.py did not write (no meta.json of its own): --fresh removes nothing
    other.mkdir()
    (other / "meta.json").write_text('{"format": "mine"}')
    (other / "train_000001.bin").write_bytes(b"\0\0")
    fineweb.clear_shards(other)
    assert sorted(p.name for p in other.iterdir()) == ["meta.json", "train_000001.bin"]
    # a tokenizer/ fineweb.py did not train (no request.json): --fresh removes shards and meta.json, never it
    mine = tmp_path / "mine"
    shutil.copytree(out / "tokenizer", mine / "tokenizer")
    (mine / "tokenizer" / "request.json").unlink()
    shutil.copy(out / "meta.json", mine / "meta.json")
    (mine / "val_000000.bin").write_bytes(b"\0\0")
    fineweb.clear_shards(mine, log=lambda *a: None)
    assert sorted(p.name for p in mine.iterdir()) == ["tokenizer"] and (mine / "tokenizer" / "vocab.json").is_file()


def test_fw_cli_refuses_shards_of_an_input_that_has_changed(tmp_path, monkeypatch, _fw_bpe_dir):
    # once the --input has changed (size or modification time) its complete shards are refused, saying so
    path, _ = _fw_corpus(tmp_path, n=40, seed=2, name="c.txt")
    argv = [f"--input={path}", f"--tokenizer={_fw_bpe_dir}", f"--out_dir={tmp_path / 'out'}", "--shard_size=500",
            "--num_workers=1"]
    _run(fineweb, monkeypatch, *argv)
    fineweb.main()   # unchanged: reused
    path.write_text(path.read_text()[: len(path.read_text()) // 2], encoding="utf-8")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    msg = _bad_exit(monkeypatch, fineweb, *argv)
    _bpe_says(msg, f"fineweb.py: {tmp_path / 'out'}: ", str(path.resolve()), "changed", "--fresh")


def test_fineweb_a_full_disk_is_one_line_naming_the_shard_and_leaves_nothing_half_written(tmp_path, _fw_bpe_dir):
    # a full disk at the first shard: exit status 1, one line naming --out_dir and the shard, no shard, no meta.json
    path, _ = _fw_corpus(tmp_path)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "fineweb.py"), f"--input={path}", f"--tokenizer={_fw_bpe_dir}",
                        f"--out_dir={out}", "--shard_size=1000", "--num_workers=1"], capture_output=True, text=True,
                       timeout=120, preexec_fn=_file_size_limit(1500))
    assert r.returncode == 1
    _one_line_naming(r.stderr.strip().splitlines()[-1], f"fineweb.py: --out_dir {out}: ", out / "val_000000.bin")
    assert not out.exists()


# ---- stories.py: seeded stories, and the corpus file of them


def test_stories_deterministic_for_a_seed():
    a, b, c = (stories.generate_stories(40, seed=s) for s in (3, 3, 4))
    assert a == b and a != c
    assert all(isinstance(s, str) and s and _FW_EOT not in s for s in a)


def test_stories_variety_and_well_formed():
    docs = stories.generate_stories(3000, seed=0)
    assert len(set(docs)) >= 0.99 * len(docs)  # tens of thousands of distinct stories are reachable
    for d in docs:
        assert "{" not in d and "}" not in d, d  # no unfilled template fields
        assert d.count('"') % 2 == 0, d  # every quote closes
        assert d[0].isupper() and d.rstrip()[-1] in '.!?"', d
    openers = {d.split("\n")[1].split()[0] for d in docs}
    assert len(openers) > 20  # the plots and their phrasings all occur


def test_stories_write_corpus_size_and_separator(tmp_path):
    path = tmp_path / "s.txt"
    n, nbytes = stories.write_corpus(path, 50_000, seed=2)
    data = path.read_bytes()
    assert len(data) == nbytes
    docs = stories.generate_stories(n, seed=2)  # the file holds exactly these stories, each followed by a separator
    assert data.decode("utf-8") == "".join(d + "\n<|endoftext|>\n" for d in docs)   # as TinyStories-train.txt
    last = len((docs[-1] + stories.SEPARATOR).encode())
    assert 50_000 <= nbytes < 50_000 + last  # at least the request, overshoot under one story
    stories.write_corpus(tmp_path / "t.txt", 50_000, seed=2)
    assert (tmp_path / "t.txt").read_bytes() == data


def test_stories_write_corpus_stops_at_exactly_the_size_and_counts_utf8_bytes(tmp_path, monkeypatch):
    # a size met exactly by k stories gets those k; sizes count UTF-8 bytes (an accented story); a size of 0 refused
    docs = stories.generate_stories(5, seed=7)
    exact = len("".join(d + stories.SEPARATOR for d in docs).encode())
    assert stories.write_corpus(tmp_path / "a.txt", exact, seed=7) == (5, exact)
    assert stories.write_corpus(tmp_path / "b.txt", exact + 1, seed=7)[0] == 6
    story = "Zo\u00eb ate cr\u00e8me br\u00fbl\u00e9e."  # 21 characters, 25 bytes
    monkeypatch.setattr(stories, "make_story", lambda r: story)
    one = (story + stories.SEPARATOR).encode()
    assert stories.write_corpus(tmp_path / "c.txt", 3 * len(one), seed=0) == (3, 3 * len(one))
    assert (tmp_path / "c.txt").read_bytes() == 3 * one
    _one_line_naming(_raises(stories.write_corpus, tmp_path / "d.txt", 0), "stories.write_corpus: ", "num_bytes", "0")
    assert not (tmp_path / "d.txt").exists()


def test_stories_write_corpus_cut_short_leaves_no_file(tmp_path, monkeypatch):
    # written to a temp file and renamed at the end: an interrupted run never leaves a corpus that looks complete
    calls = []

    def story_then_ctrl_c(r):
        calls.append(1)
        if len(calls) == 50:
            raise KeyboardInterrupt
        return "Tom had a red ball."
    monkeypatch.setattr(stories, "make_story", story_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        stories.write_corpus(tmp_path / "s.txt", 50_000, seed=2)
    assert list(tmp_path.iterdir()) == []


# ---- stories.py: the command line


def test_stories_print_separates_stories_as_the_corpus_file_does(monkeypatch, capsys):
    _run(stories, monkeypatch, "--print", "3", "--seed", "1")
    assert capsys.readouterr().out == stories.SEPARATOR.join(stories.generate_stories(3, seed=1)) + "\n"


def test_stories_force_writes_over_an_existing_out(tmp_path, monkeypatch, capsys):
    out = tmp_path / "s.txt"
    out.write_text("my own corpus")
    _run(stories, monkeypatch, f"--out={out}", "--num_bytes=500", "--seed=3", "--force")
    assert out.read_text(encoding="utf-8").startswith(stories.generate_stories(1, seed=3)[0] + stories.SEPARATOR)


# ---- fineweb.py and stories.py: the command line's refusals, one line each, before any work, nothing left behind

_DATA_CLI_REFUSALS = {   # case: (script, command line, the line's start, what it names); {d} is the test's folder:
    # c.txt (a corpus), binary.txt, empty.txt, no-doc.txt (separators only) and a_file; {tok}: a bpe.py tokenizer
    **{" ".join(flags): (fineweb, ["--input={d}/c.txt", "--tokenizer=gpt2", "--out_dir={d}/out", *flags],
                         f"fineweb.py: {flags[-1].replace('=', ' ')}:", [])
       for flags in (["--num_workers=-1"], ["--max_docs=0"], ["--shard_size=0"], ["--vocab_size=10"],
                     ["--shuffle_buffer=0"], ["--bpe_train_bytes=-1"], ["--prepare_tinystories", "--corpus_bytes=-5"],
                     ["--prepare_tinystories", "--corpus_bytes=1"])},
    "out_dir-a-file-prepare": (fineweb, ["--prepare_tinystories", "--corpus_bytes=1000", "--out_dir={d}/a_file",
                                         "--num_workers=1"], "fineweb.py: ", ["{d}/a_file"]),
    "out_dir-a-file": (fineweb, ["--input={d}/c.txt", "--tokenizer={tok}", "--out_dir={d}/a_file", "--num_workers=1"],
                       "fineweb.py: ", ["{d}/a_file"]),
    # a binary, empty or document-less input: no --out_dir, meta.json or temp file is left behind
    **{f"{kind}{'-vocab_size' * bool(vocab)}": (
        fineweb, ["--input={d}/" + kind + ".txt", "--tokenizer={tok}", "--out_dir={d}/out", "--num_workers=1", *vocab],
        "fineweb.py: ", [f"{kind}.txt", named])
       for kind, named in (("binary", "not a text file"), ("empty", "empty"), ("no-doc", "empty input"))
       for vocab in ([], ["--vocab_size=300"])},
    # (random.Random(-5) is random.Random(5): two seeds, one corpus)
    **{f"stories-{flag}={value}": (stories, ["--out={d}/sub/s.txt", "--num_bytes=1000", f"{flag}={value}"],
                                   f"stories.py: {flag} {value}:", [])
       for flag, value in (("--num_bytes", "-5"), ("--num_bytes", "0"), ("--print", "-2"), ("--out", "{d}"),
                           ("--seed", "-5"), ("--seed", "-1"))},
    # a corpus that is there already is written over only with --force (as bpe.py's --out)
    "stories-out-exists": (stories, ["--out={d}/c.txt", "--num_bytes=1000"], "stories.py: --out {d}/c.txt:",
                           ["--force"]),
}


@pytest.mark.parametrize("case", list(_DATA_CLI_REFUSALS))
def test_fw_and_stories_cli_refuse_bad_input_and_leave_nothing_behind(tmp_path, monkeypatch, capsys, _fw_bpe_dir, case):
    script, argv, prefix, named = _DATA_CLI_REFUSALS[case]
    fill = lambda s: s.replace("{d}", str(tmp_path)).replace("{tok}", _fw_bpe_dir)
    monkeypatch.setattr(fineweb, "hub_reachable", lambda *a, **k: (False, "offline in tests"))
    monkeypatch.setattr(stories, "write_corpus", _bpe_not_called)
    _bpe_corpus(tmp_path / "c.txt")
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01 a model file" * 100)
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "no-doc.txt").write_bytes(b"\n \n<|endoftext|>  \n")
    (tmp_path / "a_file").write_text("x")
    before = _files(tmp_path), sorted(tmp_path.rglob("*"))
    _one_line_naming(_bad_exit(monkeypatch, script, *map(fill, argv)), fill(prefix), *map(fill, named))
    assert (_files(tmp_path), sorted(tmp_path.rglob("*"))) == before
    assert script is fineweb or capsys.readouterr().out == ""


# ==== sample.py: decoding, the KV cache, loading a checkpoint with its tokenizer


def _sample_models():
    torch.manual_seed(0)
    llama = M.build_model(dict(arch="llama", vocab_size=64, context_length=16, d_model=32, num_layers=2,
                               num_heads=4, d_ff=64))
    gpt = M.build_model(dict(arch="gpt2", vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32))
    return [llama, gpt]


def _sample_greedy_reference(model, prompt, n):
    """Plain uncached greedy decoding, one sequence: the obvious loop."""
    ids = list(prompt)
    for _ in range(n):
        logits = M.logits(model, torch.tensor([ids[-model.context_length:]]))
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


# ---- top-k / top-p: the tokens that may be sampled, by hand and against the definition


def _sample_kept(probs, **kw):
    """The ids filter_probs keeps of one row; float64 and float32 probabilities must agree, and sum to 1."""
    kept = []
    for dtype in (torch.float64, torch.float32):
        out = sample.filter_probs(torch.tensor([probs], dtype=dtype), **kw)[0]
        assert float(out.sum()) == pytest.approx(1.0)
        kept.append(sorted(torch.nonzero(out).flatten().tolist()))
    assert kept[0] == kept[1], (probs, kw)
    return kept[0]


_SAMPLE_PROBS = [0.125, 0.5, 0.125, 0.25]  # sorted: id1 0.5, id3 0.25, then a tie id0 / id2 at 0.125


@pytest.mark.parametrize("probs, kw, kept", [
    (_SAMPLE_PROBS, dict(top_p=0.1), [1]),
    (_SAMPLE_PROBS, dict(top_p=0.5), [1]),            # 0.5 reaches 0.5: one token
    (_SAMPLE_PROBS, dict(top_p=0.5001), [1, 3]),
    (_SAMPLE_PROBS, dict(top_p=0.75), [1, 3]),
    (_SAMPLE_PROBS, dict(top_p=0.8), [0, 1, 3]),      # tie at the boundary: the lower id is kept
    (_SAMPLE_PROBS, dict(top_p=0.875), [0, 1, 3]),
    (_SAMPLE_PROBS, dict(top_p=0.9), [0, 1, 2, 3]),
    (_SAMPLE_PROBS, dict(top_p=1.0), [0, 1, 2, 3]),   # p = 1 keeps everything
    ([0.5, 0.0, 0.5, 0.0], dict(top_p=1.0), [0, 2]),   # ... that has any probability
    ([0.25] * 4, dict(top_k=2), [0, 1]),             # top-k keeps exactly k, lower ids on ties
    (_SAMPLE_PROBS, dict(top_k=3, top_p=0.8), [1, 3]),  # top-p on the top-k renormalised mass (0.5/0.875)
    # the smallest positive top_p times the top-2 mass 0.3 is 0.0 in float64: the most likely token is still kept
    ([0.08, 0.2, 0.09, 0.1, 0.1, 0.1, 0.1, 0.08, 0.05, 0.1], dict(top_k=2, top_p=5e-324), [1]),
], ids=["p0.1", "p0.5", "p0.5001", "p0.75", "p0.8-tie", "p0.875", "p0.9", "p1", "p1-zeros", "k2-tie", "k3-p0.8",
        "tiniest-p"])
def test_sample_top_k_top_p_keep_exactly_the_nucleus(probs, kw, kept):
    assert _sample_kept(probs, **kw) == kept


def test_sample_filter_probs_renormalises_what_it_keeps():
    kept = sample.filter_probs(torch.tensor([_SAMPLE_PROBS]), top_p=0.75)[0]
    assert kept.tolist() == pytest.approx([0, 2 / 3, 0, 1 / 3])


def _sample_reference_kept(row, top_k, top_p):
    """The kept set by the definition, in plain Python: rank by (probability desc, id asc), cut."""
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:top_k or len(row)]
    total = sum(row[i] for i in order)
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p * total:
            break
        kept.append(i)
        mass += row[i]
    return sorted(kept)


def _sample_rounded(scale, mult=1.0):
    """3 rows of 3000 probabilities from rounded logits: many exact ties, on the cut-off too."""
    g = torch.Generator().manual_seed(1)
    return torch.softmax(torch.round(torch.randn(3, 3000, generator=g) * scale), dim=-1) * mult


def _sample_spike():
    """A likely token or two over a flat tail of exact ties."""
    probs = torch.ones(2, 3000)
    probs[0, 17], probs[1, 5], probs[1, 6] = 3000.0, 1500.0, 1500.0
    return probs / probs.sum(-1, keepdim=True)


def _sample_peaked_and_flat():
    """Row 0's nucleus is one token, row 1's most of the vocabulary (a 0.2 token over a flat tail)."""
    V = 3000
    probs = torch.ones(2, V)
    probs[0, 5] = 20 * V
    probs[1, 9] = 0.25 * (V - 1)
    return probs / probs.sum(-1, keepdim=True)


def _sample_near_equal():
    """A flat distribution of distinct values: thousands of tokens within a hair of each other."""
    return torch.softmax(torch.randn(3, 3000, generator=torch.Generator().manual_seed(4)) * 0.05, dim=-1)


@pytest.mark.parametrize("probs, top_k, top_p", [
    (functools.partial(_sample_rounded, 4.0), None, 0.9),    # a steep distribution: a nucleus of a few tokens
    (functools.partial(_sample_rounded, 0.5), None, 0.9),    # a flat one: a nucleus of thousands
    (functools.partial(_sample_rounded, 0.5), None, 0.3),
    (functools.partial(_sample_rounded, 0.5, 3e4), None, 0.6),   # unnormalised weights (about 10): p of their sum
    (functools.partial(_sample_rounded, 4.0), 50, 0.8),
    (functools.partial(_sample_rounded, 2.0), 7, None),
    (_sample_spike, None, 0.3), (_sample_spike, None, 0.5), (_sample_spike, None, 0.7),
    (_sample_peaked_and_flat, None, 0.5), (_sample_peaked_and_flat, None, 0.9),   # each row its own nucleus
    (_sample_near_equal, None, 0.3), (_sample_near_equal, None, 0.77), (_sample_near_equal, None, 0.95),
], ids=["steep-p0.9", "flat-p0.9", "flat-p0.3", "unnormalised-p0.6", "steep-k50-p0.8", "k7", "spike-p0.3",
        "spike-p0.5", "spike-p0.7", "peaked-and-flat-p0.5", "peaked-and-flat-p0.9", "near-equal-p0.3",
        "near-equal-p0.77", "near-equal-p0.95"])
def test_sample_top_k_top_p_match_the_definition_over_a_large_vocabulary(probs, top_k, top_p):
    probs = probs()
    out = sample.filter_probs(probs, top_k=top_k, top_p=top_p)
    for b in range(len(probs)):
        expected = _sample_reference_kept(probs[b].double().tolist(), top_k, 1.0 if top_p is None else top_p)
        assert torch.nonzero(out[b]).flatten().tolist() == expected
        assert float(out[b].sum()) == pytest.approx(1.0)


# ---- draw and sample_next: one uniform number per row, the temperature, greedy


class _FixedUniform:
    """Stands in for a torch.Generator in draw(): torch.rand is patched to return u."""
    def __init__(self, u):
        self.u, self.device = u, torch.device("cpu")


@pytest.fixture
def _sample_fixed_uniform(monkeypatch):
    real = torch.rand

    def fake(*shape, generator=None, **kw):
        if isinstance(generator, _FixedUniform):
            return torch.full(shape, generator.u, dtype=kw.get("dtype", torch.float32))
        return real(*shape, generator=generator, **kw)
    monkeypatch.setattr(torch, "rand", fake)


@pytest.mark.usefixtures("_sample_fixed_uniform")
def test_sample_draw_inverse_cdf_boundaries():
    # each token owns [cdf_before, cdf): u on a boundary goes to the next token; a zero-probability token never
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    for u, want in [(0.0, 1), (0.25, 1), (0.5, 3), (0.9999, 3)]:
        assert sample.draw(probs, _FixedUniform(u)).tolist() == [want], u


@pytest.mark.usefixtures("_sample_fixed_uniform")
def test_sample_temperature_scales_the_logits():
    # hand-computed inverse CDF on softmax(logits / T): u is fixed, so the drawn token pins the distribution
    logits = torch.log(torch.tensor([[0.2, 0.3, 0.5]]))
    for T, u, want in [(1.0, 0.45, 1), (1.0, 0.55, 2), (0.5, 0.45, 2), (2.0, 0.22, 0)]:
        # at T = 0.5 the probabilities are (0.04, 0.09, 0.25) / 0.38: cdf 0.105, 0.342; at T = 2 cdf 0.2628, 0.5846
        assert sample.sample_next(logits, T, generator=_FixedUniform(u)).tolist() == [want], (T, u)


def test_sample_next_draws_only_from_the_nucleus_and_all_of_it():
    g = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([_SAMPLE_PROBS] * 400))
    drawn = sample.sample_next(logits, 1.0, top_p=0.8, generator=g)
    assert set(drawn.tolist()) == {0, 1, 3}


@pytest.mark.parametrize("temperature", [0.0, 1e-6, 1e-38, 1e-45, 1e-46, 1e-300, 2 ** -150,
                                         math.nextafter(2 ** -150, 1.0)])
def test_sample_a_zero_or_vanishing_temperature_is_the_argmax(temperature):
    # 0 is greedy; a temperature so small that logits / T overflows is still the argmax, never id V from NaN
    # probabilities: 2**-150 rounds to 0 in float32 (greedy), the next double above to 2**-149 (sampled, the argmax)
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 5
    assert torch.equal(sample.sample_next(logits, temperature), logits.argmax(-1))


def test_sample_top_p_of_one_is_no_top_p():
    # p = 1 is in range (the nucleus is the whole vocabulary): the same draws as no top-p from the same seed
    m = _sample_models()[0]
    draws = [sample.generate(m, [[1]], 6, top_p=p, generator=torch.Generator().manual_seed(0)) for p in (1.0, None)]
    assert draws[0] == draws[1]


# ---- generate: against the greedy loop and transformers, batches of prompts, stops, the KV cache, the window


@pytest.mark.parametrize("temperature", [0.0, 1e-46])
def test_sample_generate_at_temperature_zero_is_the_greedy_loop(temperature):
    for m in _sample_models():
        got = sample.generate(m, [[1, 2, 3]], 10, temperature=temperature)
        assert got == [_sample_greedy_reference(m, [1, 2, 3], 10)]


def test_sample_greedy_matches_transformers_generate(tmp_path):
    # independent reference: Hugging Face's GPT2LMHeadModel.generate on the same weights (saved and reloaded)
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                                               n_head=4)).eval()
    hf.save_pretrained(tmp_path)
    ours = M.GPT.from_pretrained(str(tmp_path))
    prompts = [[5, 9, 2], [7, 1, 1, 4, 3, 8, 2]]
    got = sample.generate(ours, prompts, 12, temperature=0.0)
    for p, g in zip(prompts, got):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=0, attention_mask=torch.ones(1, len(p), dtype=torch.long))
        assert g == ref[0, len(p):].tolist()


def test_sample_batched_prompts_of_different_lengths_equal_one_at_a_time():
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [13], [14, 15, 16, 17]]
    for m in _sample_models():
        batched = sample.generate(m, prompts, 6, temperature=0.0)
        for p, got in zip(prompts, batched):
            assert got == sample.generate(m, [p], 6, temperature=0.0)[0] == _sample_greedy_reference(m, p, 6)


def test_sample_seeded_sampling_is_reproducible():
    for m in _sample_models():
        run = lambda seed: sample.generate(m, [[1, 2], [3]], 12, temperature=1.0, top_k=20, top_p=0.95,
                                           generator=torch.Generator().manual_seed(seed))
        first = run(7)
        assert run(7) == first and run(8) != first


def test_sample_every_row_stops_at_its_own_end_of_text():
    # every row stops at the first stop token it draws (not returned); on_token streams exactly what is returned
    prompts = [[1, 2, 3], [4], [5, 6]]
    for m in _sample_models():
        run = lambda **kw: sample.generate(m, prompts, 12, temperature=1.0,
                                           generator=torch.Generator().manual_seed(5), **kw)
        free = run()
        for r in range(len(prompts)):
            stop, streamed = free[r][5], []
            got = run(stop_token=stop, on_token=lambda row, t: streamed.append((row, t)))
            assert got == [f[:f.index(stop)] if stop in f else f for f in free] and len(got[r]) <= 5
            assert [[t for row, t in streamed if row == k] for k in range(len(prompts))] == got


def test_sample_cached_equals_uncached_under_fixed_seed():
    # different prompt lengths, top-k/top-p sampling, and generation past the 16-token context (window slides)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    for m in _sample_models():
        for kw in (dict(temperature=0.0), dict(temperature=0.8, top_k=10, top_p=0.9), dict(temperature=1.2, top_p=0.7)):
            a = sample.generate(m, prompts, 30, generator=torch.Generator().manual_seed(3), use_cache=True, **kw)
            b = sample.generate(m, prompts, 30, generator=torch.Generator().manual_seed(3), use_cache=False, **kw)
            assert a == b and [len(x) for x in a] == [30, 30, 30]


def test_sample_sliding_window_follows_the_documented_scheme():
    # past the context the oldest half of the window is dropped: the plain uncached loop of that definition
    for m in _sample_models():
        ctx = m.context_length
        for prompt in ([1, 2, 3], list(range(1, 17))):
            ids, start = list(prompt), 0
            for _ in range(40):
                if len(ids) - start > ctx:
                    start = len(ids) - ctx // 2
                logits = M.logits(m, torch.tensor([ids[start:]]))
                ids.append(int(logits[0, -1].argmax()))
            assert sample.generate(m, [prompt], 40, temperature=0.0) == [ids[len(prompt):]]


def test_sample_a_prompt_longer_than_the_context_keeps_its_last_tokens_with_a_warning():
    m = _sample_models()[0]
    long_prompt = list(range(40))  # the context is 16
    with pytest.warns(UserWarning) as warned:
        got = sample.generate(m, [long_prompt], 5, temperature=0.0)
    assert any("16" in str(w.message) for w in warned)   # the warning names the context it keeps
    assert got == sample.generate(m, [long_prompt[-16:]], 5, temperature=0.0)


def test_sample_generate_restores_training_mode():
    # left as it was found: a model in training mode, and one in eval mode (sample.py's, eval.py's)
    for training in (True, False):
        m = _sample_models()[1].train(training)
        sample.generate(m, [[1, 2]], 3)
        assert m.training == training


@pytest.mark.parametrize("kw, prefix, value", [
    (dict(temperature=-0.5), "temperature", "-0.5"), (dict(temperature=float("nan")), "temperature", "nan"),
    (dict(temperature=float("inf")), "temperature", "inf"),   # inf would be uniform, NaN on -inf logits
    (dict(top_p=0.0), "top_p", "0.0"), (dict(top_p=1.5), "top_p", "1.5"), (dict(top_p=-1.0), "top_p", "-1.0"),
    (dict(top_k=0), "top_k", "0"), (dict(top_k=-1), "top_k", "-1"), (dict(max_new_tokens=-1), "max_new_tokens", "-1"),
    (dict(prompts=[[]]), "every prompt", ""), (dict(prompts=[]), "every prompt", "")],
    ids=["temperature-negative", "temperature-nan", "temperature-inf", "top_p-0", "top_p-1.5", "top_p-negative",
         "top_k-0", "top_k-negative", "max_new_tokens-negative", "an-empty-prompt", "no-prompt"])
def test_sample_generate_refuses_bad_arguments_naming_them(kw, prefix, value):
    m = _sample_models()[0]
    _one_line_naming(_raises(sample.generate, m, **{"prompts": [[1]], "max_new_tokens": 3, **kw}), prefix, value)


# ---- the command line: streaming text, a checkpoint with its tokenizer, the flags


def _sample_write_ckpt(path, m, tokenizer="gpt2"):
    torch.save({"model": m.state_dict(), "model_config": m.model_config(), "tokenizer": tokenizer,
                "iteration": 0}, path)


def _sample_byte_tokenizer(tmp_path):
    tok = bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [], special_tokens=["<|endoftext|>"])
    tok.save_dir(str(tmp_path / "tok"))
    return str(tmp_path / "tok")


def _sample_byte_llama(tmp_path, vocab_size=257, tokenizer=None, context_length=8):
    """A tiny Llama checkpoint (context 8) with a byte-level tokenizer -> (model, checkpoint path)."""
    m = M.build_model(dict(arch="llama", vocab_size=vocab_size, context_length=context_length, d_model=16,
                           num_layers=1, num_heads=2, d_ff=32))
    _sample_write_ckpt(tmp_path / "ckpt.pt", m, _sample_byte_tokenizer(tmp_path) if tokenizer is None else tokenizer)
    return m, tmp_path / "ckpt.pt"


def _sample_texts(out):
    """The samples sample.py printed (each the prompt and its continuation), without their "sample k/n" lines."""
    parts = re.split(r"^-+ sample (\d+)/(\d+)\n", out, flags=re.M)
    assert parts[0] == "", out   # nothing before the first sample
    texts = parts[3::3]
    assert [(int(k), int(n)) for k, n in zip(parts[1::3], parts[2::3])] == [(k + 1, len(texts))
                                                                            for k in range(len(texts))], out
    assert all(t.endswith("\n") for t in texts), out   # each sample ends its line
    return [t[:-1] for t in texts]


def _sample_cli(monkeypatch, capsys, *argv):
    """The samples sample.py prints for this command line (_sample_texts)."""
    _run(sample, monkeypatch, *argv)
    return _sample_texts(capsys.readouterr().out)


def test_sample_streamer_holds_back_partial_utf8(tmp_path):
    tok = bpe.load_tokenizer(_sample_byte_tokenizer(tmp_path))
    out = io.StringIO()
    streamer = sample._Streamer(tok, out)
    ids = tok.encode("é!")  # 'é' is two bytes, two tokens
    streamer(0, ids[0])
    assert out.getvalue() == ""  # half a character is not printed
    streamer(0, ids[1])
    assert out.getvalue() == "é"
    streamer(0, ids[2])
    streamer.flush()
    assert out.getvalue() == "é!\n"
    # an unfinished character at the end is flushed as U+FFFD, as decode() does
    out = io.StringIO()
    streamer = sample._Streamer(tok, out)
    streamer(0, tok.encode("é")[0])
    streamer.flush()
    assert out.getvalue() == tok.decode(tok.encode("é")[:1]) + "\n" == "\ufffd\n"


@needs_gpt2_files
def test_sample_streamer_with_gpt2_tokens_that_straddle_characters():
    # GPT-2 tokens straddling characters (b'\xa9\xb6\xe6'): the stream still equals decode() of all the tokens
    tok = bpe.load_tokenizer("gpt2")
    rng = random.Random(0)
    texts = ["a" + "橶" * 12 + "b", "龘靐" * 8, "naïve café 🙂🙂 日本語のテキスト"]
    texts += ["".join(rng.choice("橶龘靐日本語🙂é ab") for _ in range(40)) for _ in range(50)]
    for text in texts:
        ids = tok.encode(text)
        out = io.StringIO()
        streamer = sample._Streamer(tok, out)
        for i in ids:
            streamer(0, i)
        streamer.flush()
        assert out.getvalue() == text + "\n", text


@needs_gpt2_files
def test_sample_cli_streams_from_checkpoint(tmp_path, capsys, monkeypatch):
    torch.manual_seed(0)
    m = M.build_model(dict(arch="gpt2", vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=16))
    ckpt = tmp_path / "ckpt.pt"
    _sample_write_ckpt(ckpt, m)
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("Once upon a time", encoding="utf-8")
    argv = ["sample.py", f"--ckpt={ckpt}", f"--prompt=FILE:{prompt_file}", "--num_samples=2", "--max_new_tokens=5",
            "--top_p=0.9", "--seed=1", "--no_stop", "--device=cpu"]
    monkeypatch.setattr(sys, "argv", argv)
    sample.main()
    out = capsys.readouterr().out
    texts = _sample_texts(out)
    assert len(texts) == 2 and all(t.startswith("Once upon a time") for t in texts)
    monkeypatch.setattr(sys, "argv", argv)
    sample.main()
    assert capsys.readouterr().out == out  # seeded: identical text
    # --init_from: released-weights path (here a local Hugging Face directory, as from_pretrained accepts)
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=32, n_embd=16, n_layer=1, n_head=2))
    hf.save_pretrained(tmp_path / "hf")
    texts = _sample_cli(monkeypatch, capsys, f"--init_from={tmp_path / 'hf'}", "--prompt=Hi", "--num_samples=1",
                        "--max_new_tokens=3", "--device=cpu")
    assert len(texts) == 1 and texts[0].startswith("Hi")


def test_sample_cli_a_prompt_longer_than_the_context_keeps_its_last_tokens(tmp_path, capsys, monkeypatch):
    # a 12-byte prompt, an 8-token context: the prompt printed whole, its last 8 tokens continued, one line on stderr
    torch.manual_seed(0)
    m, ckpt = _sample_byte_llama(tmp_path)
    tok = bpe.load_tokenizer(tmp_path / "tok")
    _run(sample, monkeypatch, f"--ckpt={ckpt}", "--device=cpu", "--no_stop", "--prompt=abcdefghijkl",
         "--num_samples=1", "--max_new_tokens=6", "--temperature=0")
    captured = capsys.readouterr()
    want = tok.decode(sample.generate(m, [tok.encode("abcdefghijkl")[-8:]], 6, temperature=0.0)[0])
    assert _sample_texts(captured.out) == ["abcdefghijkl" + want]
    warning = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warning) == 1
    _one_line_naming(warning[0], "sample.py: ")
    _named_in_order(warning[0], "12", "8")   # the prompt's length, then the context


def test_sample_cli_num_samples_continue_one_seeded_stream(tmp_path, capsys, monkeypatch):
    # --num_samples draws with one generator seeded once: the samples continue its stream (they differ); --device
    # auto is the CPU on a machine without CUDA
    torch.manual_seed(0)
    m, ckpt = _sample_byte_llama(tmp_path)
    tok = bpe.load_tokenizer(tmp_path / "tok")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _run(sample, monkeypatch, f"--ckpt={ckpt}", "--device=auto", "--no_stop", "--prompt=ab", "--num_samples=2",
         "--max_new_tokens=12", "--seed=3")
    g = torch.Generator().manual_seed(3)
    texts = [tok.decode(sample.generate(m, [tok.encode("ab")], 12, generator=g)[0]) for _ in range(2)]
    assert texts[0] != texts[1]
    assert _sample_texts(capsys.readouterr().out) == ["ab" + t for t in texts]


def test_sample_cli_stops_at_end_of_text_unless_no_stop(tmp_path, capsys, monkeypatch):
    # a model that always predicts <|endoftext|>: without --no_stop it prints nothing new, with it the token's text
    torch.manual_seed(0)
    m, ckpt = _sample_byte_llama(tmp_path)
    tok = bpe.load_tokenizer(tmp_path / "tok")
    with torch.no_grad():
        m.token_embeddings.weight.fill_(1.0)
        for layer in m.layers:
            layer.attn.output_proj.weight.zero_()
            layer.ffn.w2.weight.zero_()
        m.lm_head.weight.zero_()
        m.lm_head.weight[tok.eot_id] = 1.0
    _sample_write_ckpt(ckpt, m, tokenizer=str(tmp_path / "tok"))
    base = [f"--ckpt={ckpt}", "--device=cpu", "--prompt=hi", "--num_samples=1"]
    assert _sample_cli(monkeypatch, capsys, *base, "--max_new_tokens=5") == ["hi"]
    assert _sample_cli(monkeypatch, capsys, *base, "--max_new_tokens=2", "--no_stop") == ["hi" + 2 * "<|endoftext|>"]


def test_sample_without_ckpt_or_init_from_samples_the_default_runs_checkpoint(tmp_path, monkeypatch, capsys):
    # README: `python sample.py --top_p 0.9` samples the latest checkpoint of the default run, out/ckpt.pt
    monkeypatch.chdir(tmp_path)
    _one_line_naming(_bad_exit(monkeypatch, sample, "--device=cpu"), "sample.py: --ckpt out/ckpt.pt: ")
    (tmp_path / "out").mkdir()
    _tiny_llama_ckpt(tmp_path / "out")
    flags = ["--prompt=ab", "--num_samples=1", "--max_new_tokens=4", "--temperature=0", "--no_stop", "--device=cpu"]
    _run(sample, monkeypatch, *flags)
    default = capsys.readouterr().out
    _run(sample, monkeypatch, "--ckpt=out/ckpt.pt", *flags)
    assert default == capsys.readouterr().out
    assert len(_sample_texts(default)) == 1 and _sample_texts(default)[0].startswith("ab")


def test_sample_says_on_stderr_which_checkpoint_model_and_tokenizer_it_loaded(tmp_path, capsys):
    ckpt = _tiny_llama_ckpt(tmp_path)
    sample.load_model_and_tokenizer(str(ckpt), None, "cpu")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(ckpt) in err[0] and "llama" in err[0] and str(tmp_path / "tok") in err[0]


def test_sample_prompt_file_is_used_exactly_and_dtype_reaches_the_model(tmp_path, monkeypatch, capsys):
    # FILE:path prompts keep the file's text as it is (here its final newline) and --dtype sets the weights' dtype
    ckpt = _tiny_llama_ckpt(tmp_path)
    tok = bpe.load_tokenizer(tmp_path / "tok")
    m = M.model_from_checkpoint(torch.load(ckpt, weights_only=True))
    (tmp_path / "p.txt").write_text("ab \n", encoding="utf-8")
    dtypes, generate = [], sample.generate
    monkeypatch.setattr(sample, "generate", lambda model, *a, **k: dtypes.append(
        next(model.parameters()).dtype) or generate(model, *a, **k))
    flags = [f"--ckpt={ckpt}", f"--prompt=FILE:{tmp_path / 'p.txt'}", "--num_samples=1", "--max_new_tokens=4",
             "--temperature=0", "--no_stop", "--device=cpu"]
    _run(sample, monkeypatch, *flags)
    want = tok.decode(generate(m, [tok.encode("ab \n")], 4, temperature=0.0)[0])
    assert _sample_texts(capsys.readouterr().out) == ["ab \n" + want]
    _run(sample, monkeypatch, *flags, "--dtype=bfloat16")
    assert dtypes == [torch.float32, torch.bfloat16]


def test_sample_cli_takes_every_seed_torch_takes_and_zero_new_tokens(tmp_path, capsys, monkeypatch):
    # torch seeds are 64-bit unsigned: 2**64 - 1 is one; --max_new_tokens=0 prints the prompt only
    m, ckpt = _sample_byte_llama(tmp_path)
    base = [f"--ckpt={ckpt}", "--device=cpu", "--prompt=hi", "--num_samples=1", f"--seed={2 ** 64 - 1}"]
    assert _sample_cli(monkeypatch, capsys, *base, "--max_new_tokens=0") == ["hi"]
    texts = _sample_cli(monkeypatch, capsys, *base, "--max_new_tokens=3", "--no_stop")
    g = torch.Generator().manual_seed(2 ** 64 - 1)
    want = bpe.load_tokenizer(tmp_path / "tok").decode(sample.generate(m, [[104, 105]], 3, generator=g)[0])
    assert texts == ["hi" + want]


def test_sample_cli_an_empty_prompt_needs_an_endoftext_token_to_start_from(tmp_path, monkeypatch, capsys):
    bpe.Tokenizer({i: bytes([i]) for i in range(256)}, []).save_dir(tmp_path / "tok")   # no special tokens
    _, ckpt = _sample_byte_llama(tmp_path, vocab_size=256, tokenizer=str(tmp_path / "tok"))
    args = (f"--ckpt={ckpt}", "--device=cpu", "--max_new_tokens=2")
    _one_line_naming(_bad_exit(monkeypatch, sample, *args), "sample.py: --prompt", "<|endoftext|>")
    texts = _sample_cli(monkeypatch, capsys, *args, "--prompt=a", "--num_samples=1", "--temperature=0")   # (no eot)
    assert len(texts) == 1 and texts[0].startswith("a")


def test_sample_cli_ctrl_c_while_streaming_is_one_line(tmp_path, capsys, monkeypatch):
    # Ctrl-C is how one stops a long sample: no traceback, one line of its own after the half-printed text
    _, ckpt = _sample_byte_llama(tmp_path)
    calls = []

    def _ctrl_c(*a, **k):
        calls.append(1)
        raise KeyboardInterrupt
    monkeypatch.setattr(sample, "generate", _ctrl_c)
    message = _ctrl_c_line(monkeypatch, sample, f"--ckpt={ckpt}", "--prompt=Hi", "--device=cpu")
    _one_line_naming(message, "sample.py: ", "interrupted")
    assert calls == [1]
    assert "sample 1/" in capsys.readouterr().out   # it was streaming the first sample


# ---- the command line's refusals: one line naming the flag, the file or the value, before anything is printed

_SAMPLE_CLI_REFUSALS = {   # case: (command line, the line's start, what it names); {d} is the test's folder: ckpt.pt
    # (a tiny Llama with the byte-level tokenizer tok/), small.pt (a 200-id model for that 257-id tokenizer), moved.pt
    # (its tokenizer folder gone), hf/ (an empty folder), latin1.txt and empty.txt
    **{flag: ([flag], f"sample.py: {flag.split('=')[0]}", [flag.split("=")[1]]) for flag in [
        "--temperature=-1", "--temperature=nan", "--temperature=inf", "--top_p=0", "--top_p=1.5", "--top_k=0",
        "--max_new_tokens=-1", "--max_new_tokens=-5", "--num_samples=0", "--seed=-1", f"--seed={2 ** 64}",
        "--ckpt=missing.pt"]},   # (the sampling flags before anything is loaded)
    "ckpt-and-init_from": (["--ckpt={d}/ckpt.pt", "--init_from=gpt2"], "sample.py: ", ["--ckpt", "--init_from"]),
    "prompt-file-latin-1": (["--prompt=FILE:{d}/latin1.txt"], "sample.py: --prompt FILE:{d}/latin1.txt: ", ["UTF-8"]),
    "prompt-file-empty": (["--prompt=FILE:{d}/empty.txt"], "sample.py: --prompt FILE:{d}/empty.txt: ", []),
    "prompt-file-missing": (["--prompt=FILE:{d}/none.txt"], "sample.py: --prompt FILE:{d}/none.txt: ", []),
    "a-tokenizer-larger-than-the-model": (["--ckpt={d}/small.pt", "--prompt=Hello", "--device=cpu"],
                                          "sample.py: --ckpt {d}/small.pt: ", ["'{d}/tok'", "257", "200"]),
    "a-tokenizer-that-cannot-load": (["--ckpt={d}/moved.pt"], "sample.py: --ckpt {d}/moved.pt: ",
                                     ["'{d}/gone'", "--tokenizer"]),
    "init_from-that-cannot-load": (["--init_from={d}/hf", "--device=cpu"], "sample.py: --init_from {d}/hf: ",
                                   ["config.json"]),   # (a local folder without config.json: no download tried)
}


@pytest.mark.parametrize("case", list(_SAMPLE_CLI_REFUSALS))
def test_sample_cli_refuses_bad_input_before_anything_is_printed(tmp_path, monkeypatch, capsys, case):
    argv, prefix, named = _SAMPLE_CLI_REFUSALS[case]
    fill = lambda s: s.replace("{d}", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    tok = _sample_byte_tokenizer(tmp_path)
    for name, vocab_size, tokenizer in ("ckpt", 257, tok), ("small", 200, tok), ("moved", 257, f"{tmp_path}/gone"):
        _sample_write_ckpt(tmp_path / f"{name}.pt", M.build_model(dict(
            arch="llama", vocab_size=vocab_size, context_length=8, d_model=16, num_layers=1, num_heads=2, d_ff=32)),
            tokenizer)
    (tmp_path / "hf").mkdir()
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    (tmp_path / "empty.txt").write_bytes(b"")
    _one_line_naming(_bad_exit(monkeypatch, sample, *map(fill, argv)), fill(prefix), *map(fill, named))
    assert capsys.readouterr().out == ""


def test_sample_checkpoint_without_a_tokenizer_needs_the_flag(tmp_path, capsys, monkeypatch):
    # no tokenizer named: one line asking for --tokenizer (no guessed gpt2); one of another size: refused, naming both
    tok = _bpe_small_tokenizer(vocab_size=300, save_to=tmp_path / "tok")
    torch.manual_seed(0)
    _, ckpt = _sample_byte_llama(tmp_path, tok.vocab_size, tokenizer="", context_length=16)
    argv = [f"--ckpt={ckpt}", "--prompt=the cat", "--num_samples=1", "--max_new_tokens=4", "--temperature=0",
            "--no_stop", "--device=cpu"]
    _one_line_naming(_bad_exit(monkeypatch, sample, *argv), f"sample.py: --ckpt {ckpt}: ", "--tokenizer")
    if HAVE_GPT2_FILES:  # (GPT-2's files offline)
        message = _bad_exit(monkeypatch, sample, *argv, "--tokenizer=gpt2")
        _one_line_naming(message, f"sample.py: --ckpt {ckpt}: ", "'gpt2'")
        _named_in_order(message.replace(str(tmp_path), ""), "50257", "300")
    _bpe_small_tokenizer(vocab_size=280, save_to=tmp_path / "small")   # fewer ids: it may sample undecodable ones
    message = _bad_exit(monkeypatch, sample, *argv, f"--tokenizer={tmp_path / 'small'}")
    _one_line_naming(message, f"sample.py: --ckpt {ckpt}: ", repr(str(tmp_path / "small")))
    _named_in_order(message.replace(str(tmp_path), ""), "280", "300")
    texts = _sample_cli(monkeypatch, capsys, *argv, f"--tokenizer={tmp_path / 'tok'}")   # (not gpt2's 50,257)
    assert len(texts) == 1 and texts[0].startswith("the cat")


# ==== flops.py: parameters, FLOPs, memory and MFU against the reference figures


_FLOPS_TINY = dict(arch="llama", vocab_size=10, context_length=8, d_model=4, num_layers=1, num_heads=2, d_ff=6)

_FLOPS_TINY_GPT = dict(arch="gpt2", vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=4)

# GPT-2 XL's shape as a Llama-style model: the reference figures
_FLOPS_XL = dict(arch="llama", vocab_size=50257, context_length=1024, d_model=1600, num_layers=48, num_heads=25,
                 d_ff=4288, rope_theta=10000.0)


# ---- parameters, by component, against the hand count and the models themselves


def test_flops_tiny_shape_params_hand_computed():
    # V=10, d=4, d_ff=6: embedding 10*4, Q/K/V/O 4*4*4, SwiGLU 3*4*6, 3 norms 3*4, untied head 4*10
    p = flops.count_params(_FLOPS_TINY)
    assert (p["embedding"], p["attention"], p["ffn"], p["norm"], p["lm_head"], p["total"]) == (40, 64, 72, 12, 40, 228)
    # SiLU FFN has two matrices; no RMSNorm removes the 12 gains
    silu = dict(_FLOPS_TINY, ffn_type="silu", d_ff=16, remove_rmsnorm=True)
    assert flops.count_params(silu)["total"] == 40 + 64 + 2 * 4 * 16 + 40
    # GPT-2: wte 10*4, wpe 8*4, c_attn 4*12+12, c_proj 4*4+4, c_fc 4*16+16, c_proj 16*4+4, 3 LayerNorms 3*8, tied head
    assert flops.count_params(_FLOPS_TINY_GPT)["total"] == 40 + 32 + 60 + 20 + 80 + 68 + 24


@pytest.mark.parametrize("cfg", [
    dict(arch="llama", vocab_size=37, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64),
    dict(arch="llama", vocab_size=100, context_length=8, d_model=48, num_layers=3, num_heads=3, d_ff=128),
    dict(arch="llama", vocab_size=37, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=128,
         ffn_type="silu"),
    dict(arch="llama", vocab_size=37, context_length=16, d_model=32, num_layers=1, num_heads=4, d_ff=80,
         remove_rmsnorm=True, remove_rope=True),
    dict(arch="gpt2", vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32),
    dict(arch="gpt2", vocab_size=50, block_size=24, n_layer=3, n_head=2, n_embd=16, pad_vocab_to_multiple_of=64),
])
def test_flops_param_counts_equal_real_models(cfg):
    m = M.build_model(cfg)
    p = flops.count_params(m.model_config())
    assert p["total"] == sum(t.numel() for t in m.parameters())
    assert p["total"] == sum(v for k, v in p.items() if k != "total")


# ---- FLOPs of a forward pass and of training, against the hand count and torch's FlopCounterMode


def test_flops_tiny_shape_forward_flops_hand_computed():
    f = flops.forward_flops(_FLOPS_TINY, 8)
    # T=8: each projection 2*T*d*d = 256; scores, weighted sum 2*T*T*d = 512 each; FFN 1152; head 2*T*d*V = 640
    assert [f[k] for k in ("q_proj", "k_proj", "v_proj", "o_proj")] == [256] * 4
    assert (f["attn_scores"], f["attn_values"], f["ffn"], f["lm_head"], f["total"]) == (512, 512, 1152, 640, 3840)
    assert flops.train_flops_per_token(_FLOPS_TINY, 8) == 3 * 3840 / 8   # forward + backward = 3 x forward
    assert flops.forward_flops(_FLOPS_TINY_GPT, 8)["ffn"] == 2 * 8 * 2 * 4 * 16   # GPT-2's 4*d GELU MLP


@pytest.mark.parametrize("cfg", [
    dict(arch="llama", vocab_size=50, context_length=32, d_model=32, num_layers=2, num_heads=4, d_ff=48),
    dict(arch="llama", vocab_size=50, context_length=32, d_model=32, num_layers=2, num_heads=4, d_ff=128,
         ffn_type="silu"),
    dict(arch="gpt2", vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32, attn_impl="scratch",
         pad_vocab_to_multiple_of=64),
    dict(arch="gpt2", vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32, attn_impl="sdpa"),
])
def test_flops_match_torch_flop_counter(cfg):
    from torch.utils.flop_counter import FlopCounterMode
    m = M.build_model(cfg)
    x = torch.randint(0, 50, (2, 16))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        m(x)
    ours = flops.forward_flops(m.model_config(), 16, batch_size=2)
    if m.model_config().get("attn_impl") == "sdpa":
        # FlopCounterMode has no formula for the CPU fused attention kernel: it counts only the projections
        assert counter.get_total_flops() == ours["total"] - ours["attn_scores"] - ours["attn_values"]
    else:
        assert counter.get_total_flops() == ours["total"]


# ---- training memory and the largest batch that fits


def test_flops_tiny_shape_memory_hand_computed():
    # per layer 8*T*d + 4*T*d_ff + 2*h*T^2, then T*d + 2*T*V; SiLU keeps 2 FFN intermediates, no RMSNorm no norm inputs
    silu = dict(_FLOPS_TINY, ffn_type="silu", d_ff=16, remove_rmsnorm=True)
    assert flops.activation_floats(_FLOPS_TINY, 8) == (8 * 8 * 4 + 4 * 8 * 6 + 2 * 2 * 64) + 8 * 4 + 2 * 8 * 10
    assert flops.activation_floats(silu, 8) == (6 * 8 * 4 + 2 * 8 * 16 + 2 * 2 * 64) + 2 * 8 * 10
    # fixed = 16 bytes (weights, grads, m, v) x 228 params = 3648; per sequence = 4 bytes x 896 floats = 3584
    assert flops.memory_bytes(_FLOPS_TINY, 8) == (3648, 3584)


def test_flops_max_batch_size_uses_decimal_gigabytes():
    # the tiny Llama above: 3648 bytes fixed + 3584 per sequence; GB is 1e9 bytes, not 2**30
    assert flops.max_batch_size(_FLOPS_TINY, 8, (3648 + 2 * 3584 + 0.5) / 1e9) == 2
    assert flops.max_batch_size(_FLOPS_TINY, 8, (3648 + 2 * 3584 - 0.5) / 1e9) == 1
    assert flops.max_batch_size(_FLOPS_TINY, 8, 3000 / 1e9) == 0  # not even the weights and optimizer state fit
    # GPT-2 XL at context 1024: 26.25 GB fixed + 16.37 GB per sequence; 40 GB holds none, 80 GB three
    assert flops.max_batch_size(_FLOPS_XL, 1024, 40) == 0 and flops.max_batch_size(_FLOPS_XL, 1024, 80) == 3


# ---- memory per GPU under FSDP and activation checkpointing: the terms by hand, the shards of a real FSDP2 run


def test_flops_checkpointing_keeps_block_inputs_and_one_block():
    # 3 layers of 8*T*d + 4*T*d_ff + 2*h*T^2 = 704 floats, the head T*d + 2*T*V = 192; checkpointed, each block keeps
    # its input (T*d = 32) and one block's 704 are recomputed at a time
    cfg = dict(_FLOPS_TINY, num_layers=3)
    assert flops.activation_terms(cfg, 8) == dict(blocks=3 * 704, head=192)
    assert flops.activation_terms(cfg, 8, checkpointing=True) == dict(block_inputs=3 * 32, recomputed_block=704,
                                                                     head=192)
    assert flops.activation_floats(cfg, 8, checkpointing=True) == 96 + 704 + 192
    _, a = flops.memory_terms(cfg, 8, checkpointing=True)
    assert a == dict(block_inputs=4 * 96, recomputed_block=4 * 704, head=4 * 192)   # fp32


def test_flops_fsdp_shards_are_torch_chunks_of_dim_0_and_two_blocks_are_gathered():
    # over 4 ranks, ceil(rows / 4) rows a rank: embedding and head (10 rows) 3, 3, 3, 1 rows of 4; Q, K, V, O, w2 one
    # row each; w1, w3 (6 rows) 2, 2, 2, 0; the three gains one element each
    rank0 = 12 + 12 + 4 * 4 + 6 + 8 + 8 + 3
    rank3 = 4 + 4 + 4 * 4 + 6 + 0 + 0 + 3
    assert [flops.shard_numel(_FLOPS_TINY, 4, r) for r in range(4)] == [rank0, rank0, rank0, rank3]
    assert 3 * rank0 + rank3 == flops.shard_numel(_FLOPS_TINY) == flops.count_params(_FLOPS_TINY)["total"] == 228
    # gathered whole: the root group (embedding 40, final norm 4, head 40) and 2 of the 3 blocks (144 each)
    cfg = dict(_FLOPS_TINY, num_layers=3)
    assert flops.gathered_numel(cfg) == 84 + 2 * 144
    b, _ = flops.memory_terms(cfg, 8, world_size=4, fsdp=True)
    assert b == dict(state=16 * flops.shard_numel(cfg, 4), gathered=2 * (84 + 2 * 144))   # fp32 x 4; bf16
    assert flops.memory_terms(cfg, 8, world_size=4)[0] == dict(state=16 * (84 + 3 * 144))   # DDP: all on every rank
    # GPT-2's root group: wte (tied) 40, wpe 32, ln_f 8; its block 244 (c_attn 60, c_proj 20, c_fc 80, 68, LNs 16)
    assert flops.gathered_numel(_FLOPS_TINY_GPT) == 40 + 32 + 8 + 244


# tiny shapes whose dim 0 does not split evenly over 2 ranks (37 rows, 27 = 3 * 9), so rank 0 holds more
_FLOPS_FSDP_CFGS = [
    dict(arch="llama", vocab_size=37, context_length=8, d_model=12, num_layers=2, num_heads=2, d_ff=20),
    dict(arch="llama", vocab_size=37, context_length=8, d_model=12, num_layers=2, num_heads=2, d_ff=20,
         tie_embeddings=True),
    dict(arch="gpt2", vocab_size=37, block_size=8, n_layer=2, n_head=3, n_embd=9),
]


def _flops_fsdp_worker(rank, world, port, out_dir):
    """FSDP2 as train.py applies it (fully_shard on each block, then the root), one AdamW step, then the bytes of
    the parameters, gradients and AdamW m and v this rank holds (its DTensors' local shards)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    held = []
    for cfg in _FLOPS_FSDP_CFGS:
        torch.manual_seed(0)
        m = M.build_model(cfg)
        for block in flops._blocks(m):
            fully_shard(block)
        fully_shard(m)
        opt = train.AdamW(m.parameters(), lr=1e-3)
        x = torch.randint(0, cfg["vocab_size"], (2, 8))
        M.lm_loss(m, x, x, arch=cfg["arch"]).backward()
        opt.step()
        tensors = [t for p in m.parameters() for t in (p, p.grad, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])]
        assert all(isinstance(t, DTensor) for t in tensors)
        held.append(sum(t.to_local().numel() * t.to_local().element_size() for t in tensors))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(held))
    dist.destroy_process_group()


def test_flops_fsdp_state_term_is_the_summed_shards_of_a_real_fsdp2_run(tmp_path):
    # the sharded term per rank equals, to the byte, FSDP2's local shards (2 gloo processes) after an AdamW step
    _spawn_ranks(_flops_fsdp_worker, str(tmp_path))
    held = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for i, cfg in enumerate(_FLOPS_FSDP_CFGS):
        assert [held[r][i] for r in range(2)] == [16 * flops.shard_numel(cfg, 2, r) for r in range(2)], cfg
        assert held[0][i] == flops.memory_terms(cfg, 8, world_size=2, fsdp=True)[0]["state"]
        assert held[0][i] > held[1][i]   # the uneven rows are on rank 0
        assert held[0][i] + held[1][i] == 16 * flops.count_params(cfg)["total"]   # nothing held twice


# ---- the reference figures


def test_flops_gpt2_xl_reference_figures():
    p = flops.count_params(_FLOPS_XL)["total"]
    assert round(p / 1e9, 2) == 1.64 and round(4 * p / 1e9, 2) == 6.56
    f = flops.forward_flops(_FLOPS_XL, 1024)
    assert round(f["total"] / 1e12, 2) == 3.52
    blocks = f["total"] - f["lm_head"]  # the ~60/30/10 split is of the transformer blocks (head: 4.7% of total)
    qkvo = sum(f[k] for k in ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert round(100 * f["ffn"] / blocks) == 60 and round(100 * qkvo / blocks) == 30
    assert round(100 * (f["attn_scores"] + f["attn_values"]) / blocks) == 10
    f16 = flops.forward_flops(_FLOPS_XL, 16384)
    assert round(f16["total"] / 1e12, 1) == 133.6
    assert round(100 * (f16["attn_scores"] + f16["attn_values"]) / f16["total"]) == 62
    fixed, per_seq = flops.memory_bytes(_FLOPS_XL, 1024)
    assert round(per_seq / 1e9, 2) == 16.37
    assert abs(fixed / 1e9 - 26.24) < 0.01  # 26.247: the spec's 26.24 is 16 bytes x 1.64e9 (N rounded first)
    assert flops.max_batch_size(_FLOPS_XL, 1024, 80) == 3


# ---- peak FLOP/s and MFU


@pytest.mark.parametrize("name, row", [
    ("H100", "H100"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H200", "H200"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA H800", "H800"), ("NVIDIA H800 PCIe", "H800 PCIe"), ("NVIDIA H20", "H20"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A800-SXM4-80GB", "A800"), ("NVIDIA A10G", "A10"),
    ("NVIDIA A40", "A40"), ("NVIDIA L4", "L4"), ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"), ("NVIDIA GeForce RTX 3090", "RTX 3090"),
    ("NVIDIA GeForce RTX 3090 Ti", "RTX 3090 Ti")])
def test_flops_peak_flops_finds_the_gpu_by_the_name_torch_gives_it(name, row):
    # the table's name inside get_device_name(), never in a longer one (L40 no L4, GB200 no B200); A10G is an A10
    assert flops.peak_flops(name, "bf16") == flops.GPU_PEAK[row][0]


def test_flops_peak_flops_takes_the_dtypes_column_and_fp32_follows_the_matmul_precision():
    # bf16 / fp16 tensor cores, then TF32; fp32 matmuls on TF32 only when allowed ("high" / "medium")
    h100, a100 = flops.GPU_PEAK["H100"], flops.GPU_PEAK["A100"]
    for dtype in ("bf16", "bfloat16", torch.bfloat16, "fp16", "float16", "half", torch.float16):
        assert flops.peak_flops("H100", dtype) == h100[0], dtype
    assert flops.peak_flops("NVIDIA B200", "tf32") == flops.GPU_PEAK["B200"][1]
    before = torch.get_float32_matmul_precision()
    try:
        for precision, column in (("highest", 2), ("high", 1), ("medium", 1)):
            torch.set_float32_matmul_precision(precision)
            assert flops.peak_flops("H100", "fp32") == h100[column], precision
            assert flops.peak_flops("NVIDIA A100-SXM4-80GB", torch.float32) == a100[column], precision
            assert flops.peak_flops("H100", "tf32") == h100[1], precision
    finally:
        torch.set_float32_matmul_precision(before)
    _one_line_naming(_raises(flops.peak_flops, "H100", "int8"), "flops.py: ", "'int8'")


@pytest.mark.parametrize("name", ["Voodoo2", "NVIDIA RTX A4000", "NVIDIA RTX A1000", "NVIDIA H1000"])
def test_flops_peak_flops_refuses_a_gpu_it_does_not_know(name):
    # RTX A4000 is no A40 and RTX A1000 no A100: unknown, not silently another card's peak
    _one_line_naming(_raises(flops.peak_flops, name, "bf16"), "flops.py: ", repr(name))


def test_flops_cpu_peak_is_measured_once_per_dtype(monkeypatch):
    # a CPU's peak is its measured matmul throughput: float32 (however spelled) and bf16 each measured once, cached
    measured = []
    monkeypatch.setattr(flops, "_cpu_peak_cache", {})
    monkeypatch.setattr(flops, "_measure_cpu_peak", lambda name: measured.append(name) or 1e9 * len(measured))
    assert flops.peak_flops("cpu", torch.float32) == flops.peak_flops("cpu", "fp32") == 1e9
    assert flops.peak_flops("cpu", "bf16") == flops.peak_flops("cpu", torch.bfloat16) == 2e9
    assert measured == ["float32", "bfloat16"]


def test_flops_cpu_peak_counts_two_flops_per_multiply_add_of_the_timed_matmul(monkeypatch):
    # n^3 multiply-adds are 2 n^3 FLOPs: at 0.5 s a product (a fake clock) the peak is 4 n^3 FLOP/s; measuring draws
    # from its own generator, so the global RNG (restored on resume) does not move
    ticks = iter(0.5 * i for i in range(100))
    monkeypatch.setattr(flops, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    rng = torch.get_rng_state()
    assert flops._measure_cpu_peak("float32", n=8, repeats=3) == 2 * 8 ** 3 / 0.5
    assert torch.equal(torch.get_rng_state(), rng)


def test_flops_cpu_mfu_never_exceeds_one_and_the_peak_is_the_best_measured(tmp_path, monkeypatch):
    # the best peak ever measured on this CPU is kept (a file), and raised by a run that beats it: MFU stays <= 1
    monkeypatch.setattr(flops, "CPU_PEAK_FILE", tmp_path / "cpu_peak.json")
    monkeypatch.setattr(flops, "_cpu_peak_cache", {})
    monkeypatch.setattr(flops, "_measure_cpu_peak", lambda dtype: 10e9)
    assert flops.peak_flops("cpu", "float32") == 10e9
    assert flops.utilisation(5e9, "cpu", "float32") == 0.5 and flops.utilisation(40e9, "cpu", "float32") == 1.0
    assert flops.peak_flops("cpu", "float32") == 40e9   # this process keeps what a run achieved
    saved = json.loads((tmp_path / "cpu_peak.json").read_text())
    assert list(saved.values()) == [10e9]   # only measurements are saved, not a run's figure
    monkeypatch.setattr(flops, "_cpu_peak_cache", {})
    monkeypatch.setattr(flops, "_measure_cpu_peak", lambda dtype: 4e9)   # the next process, on a busy machine
    assert flops.peak_flops("cpu", "float32") == 10e9


def test_flops_mfu_is_training_flops_over_the_peak():
    # training FLOP/s (3 x forward, attention included) over the peak: H100 SXM's 989.4 TFLOP/s dense bf16
    per_tok = flops.train_flops_per_token(_FLOPS_XL, 1024)
    assert flops.mfu(_FLOPS_XL, 1024, 1000.0, "H100", "bf16") == pytest.approx(per_tok * 1000.0 / 989.4e12)


# ---- the report: the time to train and the 6*N figures


def _flops_line(text, *words):
    """The one line of a printed report that holds all these words: a row found by its label, not by its place."""
    lines = [line for line in text.splitlines() if all(w in line for w in words)]
    assert len(lines) == 1, (words, text)
    return lines[0]


def _flops_context(text, T):
    """The block of a printed report (blocks are separated by a blank line) with context T's FLOPs and memory."""
    blocks = [b for b in text.split("\n\n") if "forward FLOPs" in b and f"context {T:,}," in b]
    assert len(blocks) == 1, (T, text)
    return blocks[0]


# GPT-2 XL's forward FLOPs per token at T = 1024: per layer 8*d^2 + 4*T*d + 6*d*d_ff, then the head 2*d*V
_FLOPS_XL_N, _FLOPS_XL_V, _FLOPS_XL_D = 1_640_452_800, 50257, 1600
_FLOPS_XL_FWD = 48 * (8 * 1600 * 1600 + 4 * 1024 * 1600 + 6 * 1600 * 4288) + 2 * 1600 * 50257


@pytest.mark.parametrize("mfu", [0.5, 0.25])
def test_flops_report_time_to_train_is_chinchilla_tokens_at_the_assumed_mfu(mfu):
    tokens = 20 * _FLOPS_XL_N
    out = flops.report(_FLOPS_XL, [1024], mfu_assumed=mfu, gpus=("H100", "A100"))
    line = _flops_line(out, "time to train")
    assert "32.81B" in line and "20 x params" in line and "1,024" in line
    assert f"{3 * _FLOPS_XL_FWD * tokens:.3e}" in line
    for gpu, peak in (("H100", 989.4e12), ("A100", 312e12)):   # bf16 dense peaks
        line = _flops_line(out, gpu, "MFU")
        days = 3 * _FLOPS_XL_FWD * tokens / (mfu * peak) / 86400
        assert f"{peak / 1e12:.1f}" in line and f"{100 * mfu:.0f}%" in line and f"{days:.1f} days" in line


def test_flops_report_6n_figures_and_a_given_token_budget():
    # 6*N per token with N = all parameters and with N = the matmul ones (no input embeddings), each beside its N; a
    # token budget replaces 20 x N, and the time to train gives its FLOPs
    N, V, d, fwd = _FLOPS_XL_N, _FLOPS_XL_V, _FLOPS_XL_D, _FLOPS_XL_FWD
    out = flops.report(_FLOPS_XL, [1024], train_tokens=10**9, gpus=("H100",))
    _named_in_order(_flops_line(out, "training FLOPs per token"), f"{6 * N / 1e9:.3f}", "1.64B",
                    f"{6 * (N - V * d) / 1e9:.3f}", "1.56B")
    line = _flops_line(out, "time to train")
    assert "1.00B" in line and "1,024" in line and "20 x params" not in out
    _named_in_order(line, f"{3 * fwd * 10**9:.3e}", f"{6 * N * 10**9:.3e}")
    hours = 3 * fwd * 10**9 / (0.5 * 989.4e12) / 3600
    assert f"{hours:.1f} h" in _flops_line(out, "H100", "MFU")
    gpt2 = dict(arch="gpt2", vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    n, n_matmul = 124_439_808, 124_439_808 - 1024 * 768
    _named_in_order(_flops_line(flops.report(gpt2, [1024]), "training FLOPs per token"), f"{6 * n / 1e9:.3f}",
                    "124.44M", f"{6 * n_matmul / 1e9:.3f}")


def test_flops_duration_units():
    assert [flops._duration(s) for s in (3599, 3600, 2 * 86400 - 1, 2 * 86400)] == ["60.0 min", "1.0 h", "48.0 h",
                                                                                    "2.0 days"]


# ---- the command line: presets and flags reach the model, the --json record, the table


def _flops_json(monkeypatch, capsys, *argv):
    """flops.py's --json record for this command line."""
    _run(flops, monkeypatch, *argv, "--json")
    return json.loads(capsys.readouterr().out)


def _flops_table(monkeypatch, capsys, *argv):
    """The tables flops.py prints for this command line."""
    _run(flops, monkeypatch, *argv)
    return capsys.readouterr().out


def _flops_shape(table):
    """The key=value pairs of the shape line (arch=...) under the first line's title."""
    line = table.splitlines()[1]
    assert line.startswith("arch="), table
    return dict(kv.split("=") for kv in line.split() if "=" in kv)


def test_flops_cli_json_record_holds_the_reference_figures(capsys, monkeypatch):
    # the default --model, GPT-2 XL's shape: 1.64B parameters, 3.5168 / 133.5777 forward TFLOPs at 1024 / 16384,
    # 16.37 GB per sequence + 26.25 GB fixed at 1024: 3 sequences on 80 GB
    r = _flops_json(monkeypatch, capsys, "--context", "1024,16384")
    assert (r["config"]["num_layers"], r["config"]["d_model"], r["config"]["num_heads"]) == (48, 1600, 25)
    assert r["params"]["total"] == 1_640_452_800 and list(r["contexts"]) == ["1024", "16384"]
    at_1024, at_16384 = r["contexts"]["1024"], r["contexts"]["16384"]
    assert round(at_1024["forward_flops"]["total"] / 1e12, 4) == 3.5168
    assert round(at_16384["forward_flops"]["total"] / 1e12, 4) == 133.5777
    assert round(at_1024["memory_per_sequence_bytes"] / 1e9, 2) == 16.37
    assert round(at_1024["memory_fixed_bytes"] / 1e9, 2) == 26.25 and at_1024["max_batch_size"] == 3
    assert at_1024["train_flops_per_token"] == flops.train_flops_per_token(_FLOPS_XL, 1024)


def test_flops_cli_table_shows_the_reference_figures(capsys, monkeypatch):
    # the same figures in the tables, a block per context; the time to train on an H100, an A100 and a B200
    out = _flops_table(monkeypatch, capsys, "--model=gpt2-xl", "--context", "1024", "16384")
    shape = _flops_shape(out)
    assert (shape["layers"], shape["d_model"], shape["heads"]) == ("48", "1600", "25")
    assert "1,640,452,800" in out and "6.56 GB" in out   # the parameters, and their bytes in fp32
    at_1024, at_16384 = _flops_context(out, 1024), _flops_context(out, 16384)
    assert "3.5168" in at_1024 and "133.5777" in at_16384
    _named_in_order(_flops_line(at_1024, "memory"), "16.37", "26.25")   # per sequence, then fixed
    assert re.findall(r"\d+", _flops_line(at_1024, "largest batch")) == ["80", "3"]
    for gpu in ("H100", "A100", "B200"):
        _flops_line(out, gpu, "MFU")


@pytest.mark.parametrize("model, layers, d_model, heads, params", [
    ("gpt2", 12, 768, 12, 124_439_808), ("gpt2-medium", 24, 1024, 16, 354_823_168),
    ("gpt2-large", 36, 1280, 20, 774_030_080), ("gpt2-xl", 48, 1600, 25, 1_557_611_200)])
def test_flops_cli_gpt2_presets_are_openais_sizes(capsys, monkeypatch, model, layers, d_model, heads, params):
    r = _flops_json(monkeypatch, capsys, f"--model={model}", "--arch=gpt2")
    c = r["config"]
    assert (c["arch"], c["n_layer"], c["n_embd"], c["n_head"], r["params"]["total"]) == ("gpt2", layers, d_model,
                                                                                          heads, params)


def test_flops_cli_the_models_own_context_is_the_default_context(capsys, monkeypatch):
    # the tinystories preset: context 256 unless --context_length; --train_tokens replaces 20 x N
    r = _flops_json(monkeypatch, capsys, "--model=tinystories")
    c = r["config"]
    assert (c["num_layers"], c["d_model"], c["num_heads"], c["d_ff"], c["ffn_type"], c["vocab_size"],
            c["context_length"]) == (4, 512, 16, 1344, "swiglu", 10000, 256)
    assert list(r["contexts"]) == ["256"]
    out = _flops_table(monkeypatch, capsys, "--model=tinystories")
    shape = _flops_shape(out)
    assert (shape["layers"], shape["d_model"], shape["heads"], shape["d_ff"], shape["vocab"],
            shape["context"]) == ("4", "512", "16", "1344", "10000", "256")
    assert "swiglu" in out.splitlines()[1]   # (the shape line)
    r = _flops_json(monkeypatch, capsys, "--model=tinystories", "--context_length=512")
    assert r["config"]["context_length"] == 512 and list(r["contexts"]) == ["512"]
    out = _flops_table(monkeypatch, capsys, "--model=tinystories", "--context_length=512", "--train_tokens=1e9")
    assert _flops_shape(out)["context"] == "512" and "1.00B" in _flops_line(out, "time to train")
    _flops_context(out, 512)


@pytest.mark.parametrize("ffn_type", ["silu", "relu2"])
def test_flops_cli_ffn_types_count_train_pys_model(capsys, monkeypatch, ffn_type):
    # each --ffn_type train.py takes: its 4*d FFN of two matrices, the parameters of the model train.py builds
    r = _flops_json(monkeypatch, capsys, "--model=tinystories", f"--ffn_type={ffn_type}")
    cfg = train.get_config(["--d_model=512", "--num_layers=4", "--num_heads=16", "--d_ff=0", "--context_length=256",
                            f"--ffn_type={ffn_type}"])[0]
    model = M.build_model(M.config_from_flags("llama", cfg, 10000))   # as train.py builds it
    assert (r["config"]["ffn_type"], r["config"]["d_ff"]) == (ffn_type, 4 * 512)
    assert r["params"]["total"] == sum(p.numel() for p in model.parameters())
    assert r["contexts"]["256"]["forward_flops"]["ffn"] == 4 * 2 * 256 * 2 * 512 * 2048   # layers x w1, w2


def test_flops_cli_each_context_has_its_own_memory_and_largest_batch(capsys, monkeypatch):
    # and the time to train is at the first context given
    cfg = M.config_from_flags("llama", dict(num_layers=4, d_model=512, num_heads=16, context_length=256), 10000)
    argv = ("--model=tinystories", "--context", "256", "2048", "--gpu_mem=40")
    r, out = _flops_json(monkeypatch, capsys, *argv), _flops_table(monkeypatch, capsys, *argv)
    for T in (256, 2048):
        fixed, per_seq = flops.memory_bytes(cfg, T)
        batch = flops.max_batch_size(cfg, T, 40)
        record = r["contexts"][str(T)]
        assert (record["memory_fixed_bytes"], record["memory_per_sequence_bytes"], record["max_batch_size"]) == (
            fixed, per_seq, batch)
        block = _flops_context(out, T)
        # per sequence, then fixed; 4 decimals below 1 GB fixed
        _named_in_order(_flops_line(block, "memory"), f"{per_seq / 1e9:.4f}", f"{fixed / 1e9:.4f}")
        assert re.findall(r"\d+", _flops_line(block, "largest batch")) == ["40", str(batch)]
    assert flops.max_batch_size(cfg, 256, 40) != flops.max_batch_size(cfg, 2048, 40)
    tokens = 20 * flops.count_params(cfg)["total"]
    assert f"{flops.train_flops_per_token(cfg, 256) * tokens:.3e}" in _flops_line(out, "time to train")


def test_flops_cli_pad_vocab_and_mfu_reach_the_figures(capsys, monkeypatch):
    # --pad_vocab_to_multiple_of pads GPT-2's 50257 tokens to 50304; --mfu is the MFU the time to train assumes
    r = _flops_json(monkeypatch, capsys, "--model=gpt2", "--arch=gpt2", "--pad_vocab_to_multiple_of=64")
    assert r["params"]["embedding"] == 50304 * 768
    assert _flops_shape(_flops_table(monkeypatch, capsys, "--model=gpt2", "--arch=gpt2",
                                     "--pad_vocab_to_multiple_of=64"))["vocab"] == "50304"
    cfg = M.config_from_flags("llama", dict(num_layers=4, d_model=512, num_heads=16, context_length=256), 10000)
    tokens = 20 * flops.count_params(cfg)["total"]
    seconds = flops.train_flops_per_token(cfg, 256) * tokens / (1.0 * flops.GPU_PEAK["H100"][0])
    line = _flops_line(_flops_table(monkeypatch, capsys, "--model=tinystories", "--mfu=1"), "H100", "MFU")
    assert "100%" in line and flops._duration(seconds) in line


# ---- the command line: which model the figures are for, memory per GPU


@pytest.mark.parametrize("flags, facts", [
    # the default: GPT-2 XL's shape as a Llama model, 1.64B, is not OpenAI's GPT-2 XL, 1.56B
    ([], ("GPT-2 XL", "Llama", "SwiGLU", "1.64B", "1.56B", "--arch=gpt2")),
    (["--model=gpt2-xl", "--arch=gpt2"], ("GPT-2 XL", "OpenAI", "1.56B", "1.64B", "--arch=llama")),
    (["--model=gpt2", "--arch=gpt2"], ("GPT-2 124M", "OpenAI", "124.44M")),
    (["--model=gpt2-xl", "--num_layers=2"], ("--num_layers=2", "Llama", "with --arch=gpt2")),
])
def test_flops_first_line_says_which_model_the_figures_are_for(capsys, monkeypatch, flags, facts):
    out = _flops_table(monkeypatch, capsys, *flags)
    _named_in_order(out.splitlines()[0], *facts)   # its own count first, the other architecture's after
    assert _flops_json(monkeypatch, capsys, *flags)["title"] == out.splitlines()[0]
    if "--num_layers=2" in flags:   # a changed shape is no longer OpenAI's model
        assert "OpenAI's GPT-2 XL" not in out.splitlines()[0]


def _flops_figure(line, before):
    """The number just before `before` in a report line ("1.07 * batch" -> 1.07 for "* batch")."""
    return float(re.search(rf"([\d.]+) {re.escape(before)}", line).group(1))


def test_flops_cli_fsdp_and_checkpointing_give_memory_per_gpu_as_terms(capsys, monkeypatch):
    # GPT-2 XL over 8 GPUs, sharded, checkpointed, by hand: every dim 0 but the vocabulary's (6,283 rows on rank 0)
    # splits evenly; the root group and 2 blocks gathered in bf16; 48 block inputs and 2 activations in fp32
    argv = ("--model=gpt2-xl", "--gpus=8", "--fsdp", "--activation_checkpointing", "--gpu_mem=80")
    out, r = _flops_table(monkeypatch, capsys, *argv), _flops_json(monkeypatch, capsys, *argv)
    N, V, d, T, L, d_ff = _FLOPS_XL_N, _FLOPS_XL_V, _FLOPS_XL_D, 1024, 48, 4288
    block = 4 * d * d + 3 * d * d_ff + 2 * d
    state = 16 * ((N - 2 * V * d) // 8 + 2 * 6283 * d)
    gathered = 2 * (2 * V * d + d + 2 * block)
    per_layer = 8 * T * d + 4 * T * d_ff + 2 * 25 * T * T
    acts = dict(block_inputs=4 * L * T * d, recomputed_block=4 * per_layer, head=4 * (T * d + 2 * T * V))
    record = r["contexts"]["1024"]
    assert record["memory_fixed_terms"] == dict(state=state, gathered=gathered)
    assert record["memory_per_sequence_terms"] == acts
    fixed, per_seq = state + gathered, sum(acts.values())
    assert record["max_batch_size"] == int((80e9 - fixed) // per_seq) == 71
    assert r["parallelism"] == dict(world_size=8, fsdp=True, checkpointing=True)
    # the table: a * batch + b, each term on its line (a and b), the precision assumed, the largest batch
    line = _flops_line(out, "memory")
    assert "FSDP over 8 GPUs" in line and "checkpointing" in line
    assert (_flops_figure(line, "* batch"), _flops_figure(line, "GB")) == (round(per_seq / 1e9, 2),
                                                                           round(fixed / 1e9, 2))
    for letter, terms in (("b", (state, gathered)), ("a", acts.values())):
        printed = [float(x) for x in re.findall(rf"^  {letter}  .*?([\d.]+) GB$", out, re.M)]
        assert printed == [round(v / 1e9, 2) for v in terms], out
    assert f"{16 * N / 8 / 1e9:.2f}" in _flops_line(out, "unpadded")
    _flops_line(out, "precision:", "fp32")
    _flops_line(out, "bf16 mixed-precision")
    assert re.findall(r"\d+", _flops_line(out, "largest batch")) == ["80", "71"]
    # 8 GPUs train in an eighth of the time
    hours = 3 * _FLOPS_XL_FWD * 20 * N / (0.5 * 989.4e12 * 8) / 3600
    assert f"{hours:.1f} h" in _flops_line(out, "8 x H100", "MFU")


@pytest.mark.parametrize("flags", [["--activation_checkpointing=false"], ["--gpus=8", "--fsdp=false"], ["--gpus=8"]])
def test_flops_cli_without_fsdp_and_checkpointing_the_memory_is_the_reference(capsys, monkeypatch, flags):
    # DDP (or one GPU): every GPU holds the whole model, 16.37 * batch + 26.25 GB as the reference says
    out = _flops_table(monkeypatch, capsys, "--model=gpt2-xl", *flags)
    _named_in_order(_flops_line(out, "memory"), "16.37", "26.25")
    assert re.findall(r"\d+", _flops_line(out, "largest batch")) == ["80", "3"]
    assert "precision" not in out


# ---- the command line's refusals: one line naming the flags and values, exit status 1, nothing printed

_FLOPS_CLI_REFUSALS = {   # case: (command line, the line's start, what it names); {ckpt}: a tiny Llama checkpoint
    "context-not-a-number": (["--context", "abc"], "flops.py: --context", ["'abc'"]),
    # the checkpoint's shape would win in silence: the flags to leave out are named
    **{f"ckpt-and-{flags[-1]}": (["--ckpt={ckpt}", *flags], "flops.py: --ckpt", [f.split("=")[0] for f in flags])
       for flags in (["--d_model=512"], ["--arch=gpt2"], ["--num_layers=2", "--ffn_type=silu"])},
    **{flag: (["--model=gpt2", "--arch=gpt2", flag], f"flops.py: {flag.split('=')[0]}", [flag.split("=")[1]])
       for flag in ("--num_layers=0", "--vocab_size=0", "--d_model=-768", "--num_heads=0", "--context_length=0",
                    "--d_ff=0", "--pad_vocab_to_multiple_of=0", "--train_tokens=-1", "--gpu_mem=-1", "--gpu_mem=nan")},
    # another architecture's flag would be ignored: named with the architecture in force (the default, if it is)
    "gpt2-with-d_ff": (["--model=gpt2", "--arch=gpt2", "--d_ff=100"], "flops.py: --d_ff", ["--arch=gpt2"]),
    "gpt2-with-ffn_type": (["--model=gpt2", "--arch=gpt2", "--ffn_type=silu"], "flops.py: --ffn_type",
                           ["--arch=gpt2"]),
    "llama-with-pad_vocab": (["--model=gpt2", "--pad_vocab_to_multiple_of=64"], "flops.py: --pad_vocab_to_multiple_of",
                             ["--arch=llama", "default"]),
    # a shape the model cannot have, named by its flags as train.py names it (the preset's width, said so)
    "heads-do-not-divide": (["--d_model=100", "--num_heads=3"], "flops.py: ", ["--d_model=100", "--num_heads=3"]),
    "heads-do-not-divide-the-presets": (["--num_heads=7"], "flops.py: ",
                                        ["--d_model=1600", "--model=gpt2-xl", "--num_heads=7"]),
    "gpt2-heads-do-not-divide": (["--arch=gpt2", "--num_heads=7"], "flops.py: ", ["--d_model=1600", "--num_heads=7"]),
    "odd-head-size": (["--d_model=30", "--num_heads=6"], "flops.py: ", ["--d_model=30", "--num_heads=6", "RoPE"]),
    # a world size it cannot shard over
    "fsdp-without-gpus": (["--fsdp"], "flops.py: ", ["--fsdp", "--gpus"]),
    "fsdp-on-one-gpu": (["--fsdp", "--gpus=1"], "flops.py: ", ["--fsdp", "--gpus"]),
    "gpus-0": (["--gpus=0"], "flops.py: ", ["--gpus", "'0'"]),
    "gpus-8,4": (["--gpus=8,4"], "flops.py: ", ["--gpus", "'8,4'"]),
    "gpus-not-a-number": (["--gpus=8,Z80"], "flops.py: ", ["--gpus", "'Z80'"]),
}


@pytest.mark.parametrize("case", list(_FLOPS_CLI_REFUSALS))
def test_flops_cli_refuses_flags_it_cannot_use(tmp_path, monkeypatch, capsys, case):
    argv, prefix, named = _FLOPS_CLI_REFUSALS[case]
    ckpt = str(_tiny_llama_ckpt(tmp_path)) if "{ckpt}" in " ".join(argv) else ""
    _one_line_naming(_bad_exit(monkeypatch, flops, *(a.replace("{ckpt}", ckpt) for a in argv)), prefix, *named)
    assert capsys.readouterr().out == ""


def test_flops_an_odd_head_width_is_fine_for_gpt2(monkeypatch, capsys):
    _run(flops, monkeypatch, "--arch=gpt2", "--d_model=30", "--num_heads=6")
    assert "arch=gpt2" in capsys.readouterr().out


# ==== evaluation: hellaswag.py, lambada.py: rendering and scoring with controlled models and against transformers


# ---- stand-ins for both scripts: a model of known preferences, tiny real models, the printed figures read back


class _TableLM(torch.nn.Module):
    """Stand-in LM: the logits after token a are table[a] (a bigram model; unigram if all rows are equal)."""

    def __init__(self, table, gpt_style=False, context_length=None):
        super().__init__()
        self.register_buffer("table", torch.as_tensor(table, dtype=torch.float32))
        self.gpt_style = gpt_style
        self.seen = []
        if context_length:
            self.context_length = context_length

    def forward(self, idx):
        self.seen.append((self.training, torch.is_grad_enabled(), tuple(idx.shape)))
        logits = self.table[idx]
        return (logits, None) if self.gpt_style else logits


def _eval_tiny_model(arch, vocab_size, context_length=64, seed=0):
    torch.manual_seed(seed)
    if arch == "gpt2":
        return M.GPT(M.GPTConfig(block_size=context_length, vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=32))
    return M.TransformerLM(vocab_size=vocab_size, context_length=context_length, d_model=32,
                           num_layers=1, num_heads=2, d_ff=64, rope_theta=10000.0)


def _eval_fit(model, rows, steps):
    """A few AdamW steps of next-token training on right-padded token rows: a tiny model that prefers what it saw."""
    T = max(map(len, rows))
    data = torch.tensor([row + [0] * (T - len(row)) for row in rows])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
    for _ in range(steps):
        logits = M.logits(model, data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _eval_gpt2_checkpoint(tmp_path):
    """(model, tokenizer, path): a train.py-format checkpoint of a tiny Llama-style model with the GPT-2 tokenizer."""
    tok = bpe.load_tokenizer("gpt2")
    model = _eval_tiny_model("llama", tok.vocab_size, context_length=128)
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "model_config": model.model_config(), "tokenizer": "gpt2",
                "iteration": 0, "config": {}}, ckpt)
    return model, tok, ckpt


def _eval_run(monkeypatch, capsys, script, *argv):
    """(stdout, stderr) of script.main() on this command line."""
    _run(script, monkeypatch, *argv)
    return capsys.readouterr()


def _eval_write(script, path, items):
    """A data file for script: hellaswag (context, 4 endings) pairs, labelled 0; lambada passages."""
    if script is hellaswag:
        return _hs_write_rows(path, [_hs_row(i, ctx, 0, endings) for i, (ctx, endings) in enumerate(items)])
    return _lb_write(path, items)


def _eval_figures(line):
    """A result line read back as its figures: 'acc_norm 0.6667 (2/3)' -> {'acc_norm': (0.6667, 2, 3)}, 'ppl 3.21' ->
    {'ppl': 3.21}, and 'skipped': the number it says were skipped (0 when it says none)."""
    figure = r"\b(acc_norm_char|acc_norm|acc|ppl) (\S+?)(?: \((\d+)/(\d+)\))?(?=,|\s|$)"
    figures = {name: (float(value), int(k), int(n)) if k else float(value)
               for name, value, k, n in re.findall(figure, line)}
    skipped = re.search(r"\b(\d+) skipped\b", line)
    return dict(figures, skipped=int(skipped.group(1)) if skipped else 0)


def _eval_progress(err):
    """The words of evaluate(progress=True)'s last progress line on stderr (a line per redraw here), and if it ended."""
    last = err.rstrip("\n").split("\n")[-1]
    return {w.strip("[],") for w in last.split()}, err.endswith("\n") and "\r" not in err


# ---- hellaswag.py: hand-written rows, a word tokenizer, an independent scorer


# Hand-written rows in the original rowanz format: one ending is the obvious continuation.
_HS_ROWS = [
    ("The chef cracks two eggs into a bowl . She", 0,
     ["whisks them with a fork until smooth .", "drives the bowl to the airport .",
      "paints the ceiling with the shells .", "sings loudly to a sleeping cat ."]),
    ("A man kneels beside a flat bicycle tire . He", 2,
     ["eats the tire for lunch .", "throws the bicycle into a lake .",
      "pumps air into the tire with a hand pump .", "reads a newspaper upside down ."]),
    ("A girl stands at the edge of a diving board . She", 1,
     ["plants a tree in the pool .", "jumps and dives into the water .",
      "folds the board into a paper plane .", "calls her dentist about a cake ."]),
    ("Two friends set up a chess board on a table . They", 3,
     ["bake the pieces in an oven .", "paint the table bright green .",
      "throw the board out the window .", "take turns moving the pieces ."]),
    ("A woman holds a paint roller next to a white wall . She", 0,
     ["rolls blue paint across the wall .", "feeds the roller to a goat .",
      "drives the wall to the beach .", "swims across the white carpet ."]),
    ("A boy ties the laces of his running shoes . He", 2,
     ["mails the shoes to the moon .", "cooks the laces in a pot .",
      "runs down the street in the morning .", "paints his dog bright blue ."]),
    ("A barber drapes a cape over a customer . He", 1,
     ["plays drums on the customer .", "trims the customer 's hair with scissors .",
      "fills the cape with sand .", "waters the mirror with a hose ."]),
]

_HS_LABELS = [label for _, label, _ in _HS_ROWS]


def _hs_row(i, ctx, label, endings, label_as_str=False):
    return {"ind": 100 + i, "activity_label": "Everyday", "ctx_a": ctx, "ctx_b": "", "ctx": ctx,
            "split": "val", "split_type": "indomain", "label": str(label) if label_as_str else label,
            "endings": endings, "source_id": f"handwritten~{i}"}


def _hs_examples():
    return [_hs_row(i, *r) for i, r in enumerate(_HS_ROWS)]


def _hs_write_rows(path, rows=None):
    rows = rows if rows is not None else _hs_examples()
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class _HsWordTokenizer:
    """Stand-in tokenizer: one id per whitespace-separated word (id 0 is reserved, so padding is visible)."""

    def __init__(self, texts):
        words = sorted({w for t in texts for w in t.split()})
        self.ids = {w: i + 1 for i, w in enumerate(words)}
        self.vocab_size = len(words) + 1

    def encode(self, text):
        return [self.ids[w] for w in text.split()]


def _hs_word_tokenizer():
    return _HsWordTokenizer([c for c, _, _ in _HS_ROWS] + [e for _, _, es in _HS_ROWS for e in es])


def _hs_bigram_table(tok, chosen):
    """A table that continues every context with ending chosen[i] of row i: big logits on its bigrams."""
    table = torch.zeros(tok.vocab_size, tok.vocab_size)
    for (ctx, _, endings), c in zip(_HS_ROWS, chosen):
        ids = tok.encode(ctx) + tok.encode(" " + endings[c])
        for a, b in zip(ids, ids[1:]):
            table[a, b] = 6.0
    return table


def _hs_reference_losses(table, ctx_ids, end_ids):
    """Independent scoring in plain Python: loss of each ending token given the previous token."""
    losses, prev = [], ctx_ids[-1]
    for t in end_ids:
        row = table[prev].tolist()
        losses.append(math.log(sum(math.exp(v) for v in row)) - row[t])
        prev = t
    return sum(losses), sum(losses) / len(losses)


# ---- hellaswag.py: the data: the download, the rows, the file (read_jsonl, which lambada.py reads through too)


def test_hs_download_fetches_once_atomically_and_fails_cleanly(tmp_path, monkeypatch):
    # the real urllib path, on file:// URLs (no network): fetched once, then read from the cache
    src = tmp_path / "remote.jsonl"
    src.write_bytes(b"x" * 100_000)
    dest = tmp_path / "cache" / "val.jsonl"
    assert hellaswag.download(src.as_uri(), dest) == dest and dest.read_bytes() == src.read_bytes()
    src.write_bytes(b"changed")
    assert hellaswag.download(src.as_uri(), dest) == dest and len(dest.read_bytes()) == 100_000  # cached: not refetched
    # a missing file, an HTTP error, a connection dropped mid-file: one error naming the URL, no file left
    import http.client
    import urllib.error
    import urllib.request

    class Dropped:  # the response object of a connection that closes after 5 bytes
        def __init__(self):
            self.sent = False

        def read(self, n=-1):
            if self.sent:
                raise http.client.IncompleteRead(b"", 95)
            self.sent = True
            return b"12345"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def http_404(url, timeout):
        raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)
    gone = (tmp_path / "nope.jsonl").as_uri()
    for url, patch, why in [(gone, None, "No such file"), ("https://example.invalid/x", http_404, "404"),
                            ("https://example.invalid/y", lambda url, timeout: Dropped(), "IncompleteRead")]:
        if patch:
            monkeypatch.setattr(urllib.request, "urlopen", patch)
        with pytest.raises(RuntimeError) as e:
            hellaswag.download(url, tmp_path / "fail" / "val.jsonl")
        _bad_says(str(e.value), "", url, why)
        assert list((tmp_path / "fail").iterdir()) == []


def test_hs_load_examples_reads_rowanz_format(tmp_path):
    rows = [_hs_row(i, *r, label_as_str=(i == 1)) for i, r in enumerate(_HS_ROWS)]
    path = _hs_write_rows(tmp_path / "val.jsonl", rows)
    with open(path, "a") as f:
        f.write("\n")  # a trailing blank line is fine
    examples = hellaswag.load_examples(path)
    assert len(examples) == len(_HS_ROWS)
    assert [e["label"] for e in examples] == _HS_LABELS  # the string label "2" became 2
    assert examples[3]["endings"] == _HS_ROWS[3][2] and examples[3]["ind"] == 103


@pytest.mark.parametrize("script, bad, named", [
    (hellaswag, "not json", ["JSON"]),
    (hellaswag, json.dumps({"ctx": "A man", "endings": ["a", "b", "c"], "label": 0}), ["'endings'", "4"]),
    (hellaswag, json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 4}), ["'label'", "4"]),
    (hellaswag, json.dumps({"ctx": "", "endings": ["a", "b", "c", "d"], "label": 1}), ["'ctx'"]),
    (hellaswag, json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": "\u00b2"}),   # isdigit
     ["'label'", "'²'"]),
    (lambada, "not json", ["JSON"]),
    (lambada, '{"text": "unterminated', ["JSON"]),
    (lambada, json.dumps({"txt": "He opened the door"}), ['"text"']),
    (lambada, json.dumps({"text": 42}), ['"text"']),
    (lambada, json.dumps({"text": None}), ['"text"']),
    (lambada, json.dumps(["He opened the door"]), ['"text"']),
    (lambada, json.dumps("He opened the door"), ['"text"']),
    (lambada, json.dumps({"text": "Goodbye"}), ["'text'"]),               # no word before the one to predict
    (lambada, json.dumps({"text": "  Goodbye  "}), ["'text'"]),
    (lambada, json.dumps({"text": "He opened the door "}), ["'text'"]),   # no word to predict after the last space
    (lambada, json.dumps({"text": " "}), ["'text'"]),
])
def test_eval_load_examples_rejects_bad_rows_naming_file_and_line(tmp_path, script, bad, named):
    # line 2 is blank: the line number counts it
    good = json.dumps(_hs_row(0, *_HS_ROWS[0]) if script is hellaswag else {"text": _LB_PASSAGES[0]})
    path = tmp_path / "data.jsonl"
    path.write_text(f"{good}\n\n{bad}\n{good}\n", encoding="utf-8")
    _bad_says(_raises(script.load_examples, path), f"{path}:3: ", *named)


@pytest.mark.parametrize("script, kind", [(hellaswag, "HellaSwag"), (lambada, "LAMBADA")])
@pytest.mark.parametrize("content, named", [
    (None, "no such"),                                  # no file at all
    ("a folder", "folder"),
    (b"", "no examples"),
    (b"\n  \n\n", "no examples"),                       # blank lines only
    (b'{"text": "a caf\xe9 au lait"}\n', "UTF-8"),      # Latin-1
], ids=["missing", "folder", "empty", "blank-lines", "latin-1"])
def test_eval_load_examples_rejects_a_file_without_examples(tmp_path, script, kind, content, named):
    # one line naming the file, what is wrong with it and what it should hold
    path = tmp_path / "data.jsonl"
    if content == "a folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    _bad_says(_raises(script.load_examples, path), f"{path}: ", named, kind)


@pytest.mark.parametrize("script", [hellaswag, lambada])
def test_eval_load_examples_reads_the_cached_file_else_downloads_it(tmp_path, monkeypatch, script):
    # path=None reads data_dir's copy, else downloads it there first from the reference figures' source (HellaSwag's
    # repository; OpenAI's LAMBADA, the harness's lambada_openai); a failed download is one error naming the URL
    url, name, source, write = {
        hellaswag: ("VAL_URL", "hellaswag_val.jsonl", "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/",
                    _hs_write_rows),
        lambada: ("TEST_URL", "lambada_test.jsonl", "https://openaipublic.blob.core.windows.net/gpt-2/data/",
                  _lb_write)}[script]
    assert getattr(script, url) == source + name and script.DATA_DIR == ROOT / "data" / script.__name__
    want = script.load_examples(write(tmp_path / name))
    assert len(want) == 7 and script.load_examples(None, data_dir=tmp_path) == want
    assert script.load_examples(data_dir=str(tmp_path)) == want
    monkeypatch.setattr(script, url, write(tmp_path / "remote.jsonl").as_uri())
    assert script.load_examples(None, data_dir=tmp_path / "cache") == want
    assert (tmp_path / "cache" / name).read_bytes() == (tmp_path / "remote.jsonl").read_bytes()
    monkeypatch.setattr(script, url, (tmp_path / "gone.jsonl").as_uri())
    with pytest.raises(RuntimeError) as e:
        script.load_examples(None, data_dir=tmp_path / "other")
    _bad_says(str(e.value), "", getattr(script, url))


# ---- hellaswag.py: rendering: context + " " + ending, 4 rows padded, the ending tokens the scored ones


def test_hs_render_rows_and_mask_token_by_token():
    tok = _hs_word_tokenizer()
    ctx, label, endings = _HS_ROWS[1]
    tokens, mask, got_label = hellaswag.render_example(_hs_row(1, *_HS_ROWS[1]), tok)
    ctx_ids = tok.encode(ctx)
    ends = [tok.encode(e) for e in endings]
    T = len(ctx_ids) + max(map(len, ends))
    assert got_label == label and tokens.shape == mask.shape == (4, T)
    for i, end in enumerate(ends):
        pad = T - len(ctx_ids) - len(end)
        assert tokens[i].tolist() == ctx_ids + end + [0] * pad
        assert mask[i].tolist() == [0] * len(ctx_ids) + [1] * len(end) + [0] * pad


def test_hs_render_truncates_context_from_the_start_for_all_rows():
    # a longest ending that leaves no room for context: Unscorable, naming the ending's length and the context's
    tok = _hs_word_tokenizer()
    ctx, _, endings = _HS_ROWS[1]
    longest = max(len(tok.encode(e)) for e in endings)
    tokens, mask, _ = hellaswag.render_example(_hs_row(1, *_HS_ROWS[1]), tok, max_len=longest + 3)
    assert tokens.shape == (4, longest + 3)
    assert (tokens[:, :3] == torch.tensor(tok.encode(ctx)[-3:])).all()  # the last 3 context words, every row
    assert (mask[:, :3] == 0).all() and mask.sum(1).tolist() == [len(tok.encode(e)) for e in endings]
    for max_len in (longest, longest - 1):
        with pytest.raises(hellaswag.Unscorable) as e:
            hellaswag.render_example(_hs_row(1, *_HS_ROWS[1]), tok, max_len=max_len)
        _bad_says(str(e.value), "hellaswag example 101: ", longest, max_len)


@needs_gpt2_files
def test_hs_render_with_tiktoken_space_belongs_to_the_ending():
    import tiktoken
    enc = tiktoken.get_encoding("gpt2")
    row = _hs_row(0, *_HS_ROWS[0])
    tokens, mask, _ = hellaswag.render_example(row, enc)
    ctx_ids = enc.encode(row["ctx"])
    for i, ending in enumerate(row["endings"]):
        end_ids = enc.encode(" " + ending)
        assert tokens[i, :len(ctx_ids) + len(end_ids)].tolist() == ctx_ids + end_ids
        assert enc.decode(tokens[i][mask[i] == 1].tolist()) == " " + ending
        assert enc.decode([tokens[i][mask[i] == 1][0].item()]).startswith(" ")


# ---- hellaswag.py: scoring: summed and mean cross-entropy of each ending's tokens


@pytest.mark.parametrize("kind", ["logits", "gpt-style", "bf16"])
def test_hs_score_endings_matches_hand_computed_losses(kind):
    # a bigram model: an off-by-one in the shift or the mask changes the numbers; a (logits, loss) model as GPT; a
    # bfloat16 model's logits upcast before the cross-entropy
    tok = _hs_word_tokenizer()
    table = torch.randn(tok.vocab_size, tok.vocab_size, generator=torch.Generator().manual_seed(0)) * 2
    model = _TableLM(table, gpt_style=kind == "gpt-style")
    if kind == "bf16":
        table = table.bfloat16().float()
        model = _TableLM(table).to(torch.bfloat16)
    for i, (ctx, _, endings) in enumerate(_HS_ROWS[:3]):
        tokens, mask, _ = hellaswag.render_example(_hs_row(i, ctx, 0, endings), tok)
        sum_loss, avg_loss = hellaswag.score_endings(model, tokens, mask)
        assert sum_loss.dtype == torch.float32
        for j, ending in enumerate(endings):
            ref_sum, ref_avg = _hs_reference_losses(table, tok.encode(ctx), tok.encode(ending))
            assert sum_loss[j].item() == pytest.approx(ref_sum, rel=1e-5)
            assert avg_loss[j].item() == pytest.approx(ref_avg, rel=1e-5)


# ---- hellaswag.py: evaluate: acc and acc_norm over examples, batched, skipping what cannot be scored, over DDP ranks


def test_hs_evaluate_controlled_model_gives_known_accuracy():
    # `datasets` rows' string labels score as labels (not 0); the hidden test split's empty labels: one clear error
    tok = _hs_word_tokenizer()
    examples = _hs_examples()
    truthful = _TableLM(_hs_bigram_table(tok, _HS_LABELS))
    as_str = [_hs_row(i, *r, label_as_str=True) for i, r in enumerate(_HS_ROWS)]
    assert all(isinstance(r["label"], str) for r in as_str)
    for rows in (examples, as_str):
        assert hellaswag.evaluate(truthful, tok, rows, "cpu") == dict(
            acc=1.0, acc_norm=1.0, acc_norm_char=1.0, num_correct=7, num_correct_norm=7, num_correct_norm_char=7,
            num_total=7, num_skipped=0)
    message = _raises(hellaswag.evaluate, truthful, tok, [dict(as_str[1], label="")], "cpu")
    _bad_says(message, "hellaswag example 101: ", "'label'", "''")
    # a model that believes in the wrong ending of the last 3 rows gets exactly 4/7
    misled = _TableLM(_hs_bigram_table(tok, _HS_LABELS[:4] + [(l + 1) % 4 for l in _HS_LABELS[4:]]))
    for batch_examples in (1, 3, 8):  # batching and padding never change the result
        r = hellaswag.evaluate(misled, tok, examples, "cpu", batch_examples=batch_examples)
        assert (r["num_correct_norm"], r["num_correct"], r["num_total"]) == (4, 4, 7)
        assert r["acc_norm"] == pytest.approx(4 / 7)


def test_hs_acc_and_acc_norm_differ_when_ending_lengths_differ():
    # unigram: the long ending's words cost -log 0.1, "ran" -log 0.01, "flew"/"swam" -log 0.001: the long one has the
    # lowest average (acc_norm) but a higher sum than "ran" (acc)
    long_ending = "sat on the warm mat"
    rows = [_hs_row(0, "The cat", 0, [long_ending, "ran", "flew", "swam"]),
            _hs_row(1, "The dog", 1, ["flew", "ran", long_ending, "swam"]),
            _hs_row(2, "The cow", 3, ["flew", "swam", "ran", long_ending])]
    tok = _HsWordTokenizer([r["ctx"] for r in rows] + [e for r in rows for e in r["endings"]])
    p = torch.full((tok.vocab_size,), 1e-6)
    for w in long_ending.split():
        p[tok.ids[w]] = 0.1
    p[tok.ids["ran"]], p[tok.ids["flew"]], p[tok.ids["swam"]] = 0.01, 0.001, 0.001
    model = _TableLM(p.log().expand(tok.vocab_size, -1))
    # by hand: long ending sum 5*2.303=11.5 avg 2.303; "ran" sum = avg = 4.6; so acc picks "ran", acc_norm the long one
    r = hellaswag.evaluate(model, tok, rows, "cpu")
    assert (r["num_correct"], r["num_correct_norm"], r["num_total"]) == (1, 2, 3)
    assert r["acc"] == pytest.approx(1 / 3) and r["acc_norm"] == pytest.approx(2 / 3)
    # each figure its own count; per character (lm-eval's) the long ending 11.5 / 19 = 0.61 beats "ran" 4.6 / 3
    assert (r["num_correct_norm_char"], r["acc_norm_char"]) == (2, pytest.approx(2 / 3))
    assert _eval_figures(hellaswag.result_line(r)) == {"acc_norm": (0.6667, 2, 3), "acc": (0.3333, 1, 3),
                                                       "acc_norm_char": (0.6667, 2, 3), "skipped": 0}


def test_hs_ties_go_to_the_lowest_ending_index():
    # no preference: equal losses, both accuracies pick ending 0 (the tie rule), so only rows labelled 0 count
    endings = ["ran home", "sat down", "ate fish", "was sad"]
    rows = [_hs_row(i, ctx, label, endings) for i, (ctx, label) in enumerate([("The cat", 0), ("The dog", 2),
                                                                             ("A cow", 0)])]
    tok = _HsWordTokenizer([r["ctx"] for r in rows] + endings)
    model = _TableLM(torch.zeros(tok.vocab_size, tok.vocab_size))
    for batch_examples in (1, 3):
        r = hellaswag.evaluate(model, tok, rows, "cpu", batch_examples=batch_examples)
        assert (r["num_correct"], r["num_correct_norm"], r["num_total"]) == (2, 2, 3)


def test_hs_per_example_losses_do_not_depend_on_batching(capsys):
    # one padded forward of examples of different lengths: each one's losses are those it gets alone
    tok = _hs_word_tokenizer()
    examples = _hs_examples()
    lengths = [len(tok.encode(r["ctx"])) + max(len(tok.encode(" " + e)) for e in r["endings"]) for r in examples]
    assert lengths[0] < max(lengths)  # the first example of the batch is not the widest
    table = torch.randn(tok.vocab_size, tok.vocab_size, generator=torch.Generator().manual_seed(3)) * 2
    outputs = []
    for batch_examples in (1, 8):
        hellaswag.evaluate(_TableLM(table), tok, examples, "cpu", verbose=True, batch_examples=batch_examples)
        outputs.append(capsys.readouterr().out)
    assert len(re.findall(r"\d\.\d{3}", outputs[0])) >= 2 * 4 * len(examples)   # a sum and a mean loss per ending
    assert outputs[0] == outputs[1]


def test_hs_evaluate_skips_examples_whose_ending_outgrows_the_context(capsys):
    # a small-context model (as during training) skips and counts those examples instead of stopping the run
    tok = _hs_word_tokenizer()
    examples = _hs_examples()
    longest = [max(len(tok.encode(" " + e)) for e in r[2]) for r in _HS_ROWS]
    model = _TableLM(_hs_bigram_table(tok, _HS_LABELS), context_length=sorted(longest)[3] + 1)   # the 3 longest out
    too_long = sum(n + 1 > model.context_length for n in longest)
    assert 0 < too_long < len(examples)
    for batch_examples in (1, 4):
        r = hellaswag.evaluate(model, tok, examples, "cpu", batch_examples=batch_examples)
        assert (r["num_skipped"], r["num_total"], r["num_correct_norm"]) == (too_long, 7 - too_long, 7 - too_long)
        assert max(shape[1] for _, _, shape in model.seen) <= model.context_length
    # both accuracies over the scored examples, not the skipped; the result line counts the skipped
    assert r["acc"] == r["acc_norm"] == 1.0
    assert _eval_figures(hellaswag.result_line(r))["skipped"] == too_long
    # the progress line counts skipped examples too, also when a whole batch is skipped (the last one here)
    fits = [e for e, n in zip(examples, longest) if n + 1 <= model.context_length]
    last_skipped = fits + [examples[longest.index(max(longest))]]
    capsys.readouterr()
    hellaswag.evaluate(model, tok, last_skipped, "cpu", batch_examples=1, progress=True)
    words, ended = _eval_progress(capsys.readouterr().err)
    assert {f"{len(last_skipped)}/{len(last_skipped)}", "1.0000"} <= words and ended


def test_hs_evaluate_runs_in_eval_no_grad_and_restores_train_mode(capsys):
    tok = _hs_word_tokenizer()
    model = _TableLM(_hs_bigram_table(tok, _HS_LABELS))
    model.train()
    hellaswag.evaluate(model, tok, _hs_examples(), "cpu", verbose=True, batch_examples=2)
    assert model.training and torch.is_grad_enabled()
    assert [s[:2] for s in model.seen] == [(False, False)] * 4  # 7 examples in batches of 2 -> 4 forwards
    assert model.seen[0][2][0] == 8  # 2 examples x 4 endings in one forward
    out = capsys.readouterr().out   # verbose: every example once, with its 4 endings
    assert all(out.count(ctx) == 1 and all(e in out for e in endings) for ctx, _, endings in _HS_ROWS)
    model.eval()
    hellaswag.evaluate(model, tok, _hs_examples(), "cpu")
    assert not model.training


@pytest.mark.parametrize("script", [hellaswag, lambada])
def test_eval_evaluate_runs_a_compiled_module_eagerly(script):
    # the plain module inside torch.compile's (whose forwards the stand-in records) scores, with the same result
    if script is hellaswag:
        tok, examples, kw = _hs_word_tokenizer(), _hs_examples(), {}
        model, key, right = _TableLM(_hs_bigram_table(tok, _HS_LABELS)), "num_correct_norm", 7
    else:
        tok, examples, kw = _lb_tokenizer(), _lb_examples(), dict(batch_size=4)
        model, key, right = _TableLM(_lb_designed_table(tok)), "num_correct", 4
    compiled = torch.compile(model)
    assert M.unwrap(compiled) is model
    assert script.evaluate(compiled, tok, examples, "cpu", **kw)[key] == right and len(model.seen) == 2


def _eval_ddp_case(name):
    """(model, tokenizer, examples, evaluate's batch keyword) of the DDP test: HellaSwag's stand-in model right on
    2 of the 7 rows; LAMBADA's designed table with a context of 1, so the 2-piece targets are skipped (the skip and
    cut counts are summed too)."""
    if name == "hellaswag":
        tok = _hs_word_tokenizer()
        return (_TableLM(_hs_bigram_table(tok, _HS_LABELS[:2] + [(label + 3) % 4 for label in _HS_LABELS[2:]])), tok,
                _hs_examples(), dict(batch_examples=2))
    tok = _lb_tokenizer()
    return _TableLM(_lb_designed_table(tok), context_length=1), tok, _lb_examples(), dict(batch_size=2)


def _eval_ddp_worker(rank, world_size, port, name, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model, tok, examples, kw = _eval_ddp_case(name)
        r = {"hellaswag": hellaswag, "lambada": lambada}[name].evaluate(model, tok, examples, "cpu", rank, world_size,
                                                                         **kw)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(r))
        dist.barrier()  # ranks leave together, as train.py does
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("script", [hellaswag, lambada])
def test_eval_ddp_two_processes_equal_one_process(tmp_path, script):
    # the examples split between the ranks (4 + 3), every rank gets the all-reduced totals
    model, tok, examples, _ = _eval_ddp_case(script.__name__)
    single = script.evaluate(model, tok, examples, "cpu")
    if script is hellaswag:
        assert (single["num_correct_norm"], single["num_total"]) == (2, 7)
    else:
        assert (single["num_correct"], single["num_total"], single["num_skipped"], single["num_cut"]) == (3, 5, 2, 5)
    _spawn_ranks(_eval_ddp_worker, script.__name__, str(tmp_path))
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert {k: v for k, v in r.items() if k not in ("nll", "ppl")} == {
            k: v for k, v in single.items() if k not in ("nll", "ppl")}
        assert all(r[k] == pytest.approx(single[k], rel=1e-9) for k in ("nll", "ppl") if k in single)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hs_tiny_model_trained_on_the_right_endings_scores_them(arch):
    # either architecture trained a few steps on each row's right ending prefers those; untrained, near chance
    tok = _hs_word_tokenizer()
    model = _eval_tiny_model(arch, tok.vocab_size)
    examples = _hs_examples()
    assert hellaswag.evaluate(model, tok, examples, "cpu")["num_correct_norm"] < 7
    _eval_fit(model, [tok.encode(r["ctx"]) + tok.encode(" " + r["endings"][r["label"]]) for r in examples], steps=40)
    r = hellaswag.evaluate(model, tok, examples, "cpu")
    assert (r["num_correct_norm"], r["num_total"]) == (7, 7)
    assert model.training  # left as it was found


@needs_data
@needs_gpt2_files
def test_hs_smoke_real_rows_tiny_random_gpt():
    # 20 real rows, a tiny random GPT and tiktoken: each padded, batched score equals that row's unpadded forward
    import tiktoken
    examples = hellaswag.load_examples(DATA / "hellaswag" / "hellaswag_val_subset.jsonl")[:20]
    assert examples[0]["ind"] == 20022 and examples[0]["label"] == 3
    tok = tiktoken.get_encoding("gpt2")
    model = _eval_tiny_model("gpt2", tok.n_vocab, context_length=256)
    r = hellaswag.evaluate(model, tok, examples, "cpu", batch_examples=4)
    assert r["num_total"] == 20 and 0 <= r["num_correct_norm"] <= 20 and r["acc"] == r["num_correct"] / 20
    tokens, mask, _ = hellaswag.render_example(examples[0], tok, 256)
    sum_loss, avg_loss = hellaswag.score_endings(model.eval(), tokens, mask)
    for i in range(4):
        n = int(mask[i].nonzero().max()) + 1
        one_sum, one_avg = hellaswag.score_endings(model, tokens[i:i + 1, :n], mask[i:i + 1, :n])
        assert one_avg.item() == pytest.approx(avg_loss[i].item(), rel=1e-4)
        assert one_sum.item() == pytest.approx(sum_loss[i].item(), rel=1e-4)


@needs_gpt2_files
def test_hs_init_from_hf_directory_matches_transformers_reference(tmp_path, monkeypatch, capsys):
    # --init_from (GPT.from_pretrained + tiktoken) on a tiny random GPT-2 against transformers' scores, row by row
    import tiktoken
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2, initializer_range=0.3)).eval()
    hf.save_pretrained(tmp_path / "hf")
    enc = tiktoken.get_encoding("gpt2")
    examples = _hs_examples()
    ref_correct = ref_correct_norm = ref_correct_char = 0
    ref_scores = []
    with torch.no_grad():
        for ex in examples:
            ctx_ids, sums, avgs = enc.encode(ex["ctx"]), [], []
            for ending in ex["endings"]:
                end_ids = enc.encode(" " + ending)
                logp = torch.log_softmax(hf(torch.tensor([ctx_ids + end_ids])).logits[0].double(), dim=-1)
                nll = [-logp[len(ctx_ids) + k - 1, t].item() for k, t in enumerate(end_ids)]
                sums.append(sum(nll))
                avgs.append(sum(nll) / len(nll))
            ref_scores.append((sums, avgs))
            ref_correct += min(range(4), key=sums.__getitem__) == ex["label"]
            ref_correct_norm += min(range(4), key=avgs.__getitem__) == ex["label"]
            ref_correct_char += min(range(4), key=lambda j: sums[j] / len(ex["endings"][j])) == ex["label"]
    ours = M.GPT.from_pretrained(str(tmp_path / "hf"))
    for ex, (sums, avgs) in zip(examples, ref_scores):
        tokens, mask, _ = hellaswag.render_example(ex, enc, 64)
        sum_loss, avg_loss = hellaswag.score_endings(ours, tokens, mask)
        assert sum_loss.tolist() == pytest.approx(sums, rel=1e-4)
        assert avg_loss.tolist() == pytest.approx(avgs, rel=1e-4)
    data = _hs_write_rows(tmp_path / "val.jsonl")
    out, _ = _eval_run(monkeypatch, capsys, hellaswag, f"--init_from={tmp_path / 'hf'}", "--data", data, "--device=cpu")
    n = len(examples)
    assert _eval_figures(out.strip().splitlines()[-1]) == {
        "acc_norm": (round(ref_correct_norm / n, 4), ref_correct_norm, n),
        "acc": (round(ref_correct / n, 4), ref_correct, n),
        "acc_norm_char": (round(ref_correct_char / n, 4), ref_correct_char, n), "skipped": 0}


# ---- hellaswag.py: the command line


@needs_gpt2_files
def test_hs_cli_on_a_checkpoint(tmp_path, monkeypatch, capsys):
    # a train.py checkpoint through main(): evaluate()'s score; --limit N scores the first N, --verbose prints each
    model, tok, ckpt = _eval_gpt2_checkpoint(tmp_path)
    data = _hs_write_rows(tmp_path / "val.jsonl")
    expected = hellaswag.result_line(hellaswag.evaluate(model, tok, hellaswag.load_examples(data), "cpu"))
    out = _eval_run(monkeypatch, capsys, hellaswag, "--ckpt", ckpt, "--data", data, "--device", "cpu").out
    assert out.strip().splitlines()[-1] == expected and _eval_figures(expected)["acc_norm"][2] == 7
    out = _eval_run(monkeypatch, capsys, hellaswag, "--ckpt", ckpt, "--data", data, "--limit", 3, "--verbose").out
    assert _eval_figures(out.strip().splitlines()[-1])["acc_norm"][2] == 3
    assert [ctx in out for ctx, _, _ in _HS_ROWS] == [True] * 3 + [False] * 4


# ---- lambada.py: hand-written passages, a piece tokenizer, an independent scorer


# LAMBADA-format passages whose last word the whole passage gives away. Each passage's last context word differs
# (his, some, the, old, her, their, hungry), so a bigram model can be told each target; two targets are two pieces
# long (" ice-" "cream", " pen-" "pal") with the stand-in tokenizer below.
_LB_PASSAGES = [
    "Tom lost his red kite in the tall oak tree. He climbed from branch to branch for an hour, and at last "
    "he reached the top and freed his kite",
    "The baker took a tray of warm bread out of the oven. A little girl pressed her nose against the window "
    "and begged her mother for some bread",
    "Anna trained every morning for months before the big race. On the day she ran faster than ever and "
    "crossed the line first, so she won the race",
    "Grandpa keeps an old violin in a wooden case under his bed. Every Sunday he takes it out, tunes the "
    "strings and plays a slow waltz on his old violin",
    "Lena bought a cone of ice-cream at the corner shop. The sun was so hot that it started to drip before "
    "she could finish her ice-cream",
    "The twins wrote a long letter to their pen-pal in Spain. Two weeks later a parcel full of photos "
    "arrived from their pen-pal",
    "Sam found a hungry puppy shivering by the river. He carried it home, wrapped it in a towel and gave a "
    "bowl of warm milk to the hungry puppy",
]

_LB_TARGETS = [" kite", " bread", " race", " violin", " ice-cream", " pen-pal", " puppy"]


def _lb_write(path, texts=_LB_PASSAGES, blank_lines=False):
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    if blank_lines:
        lines = ["\n", *lines[:2], "   \n", *lines[2:], "\n"]
    Path(path).write_text("".join(lines), encoding="utf-8")
    return path


def _lb_examples():
    return [{"text": t} for t in _LB_PASSAGES]


class _LbPieceTokenizer:
    """Stand-in GPT-2-like tokenizer: a piece is an optional leading space, then characters up to the next space
    or after a hyphen (" ice-cream" -> " ice-", "cream"); one id per piece seen in `texts`, id 0 reserved so that
    padding is visible. The space belongs to the next word, so "kite" and " kite" are different pieces (and
    "kite" alone is no piece at all). Records what it was asked to encode."""

    PIECE = re.compile(r" ?[^ \-]+-?")

    def __init__(self, texts):
        pieces = sorted({p for t in texts for p in self.PIECE.findall(t)})
        self.ids = {p: i + 1 for i, p in enumerate(pieces)}
        self.vocab_size = len(pieces) + 1
        self.calls = []

    def encode(self, text):
        self.calls.append(text)
        pieces = self.PIECE.findall(text)
        assert "".join(pieces) == text, f"stand-in tokenizer cannot encode {text!r}"
        return [self.ids[p] for p in pieces]


def _lb_tokenizer():
    return _LbPieceTokenizer(_LB_PASSAGES)


def _lb_reference(table, ctx_ids, tgt_ids):
    """Independent scoring in plain Python for a bigram table: (summed nll, every target token the argmax?),
    with the log-sum-exp written out and ties going to the lowest id."""
    nll, greedy, prev = 0.0, True, ctx_ids[-1]
    for t in tgt_ids:
        row = [float(v) for v in table[prev]]
        top = max(row)
        nll += top + math.log(sum(math.exp(v - top) for v in row)) - row[t]
        greedy = greedy and row.index(top) == t
        prev = t
    return nll, greedy


def _lb_designed_table(tok):
    """A bigram table whose verdict on each passage is known by construction:
    kite right; bread right; race wrong (prefers " violin"); violin right by a tie it wins (" waltz" has a higher
    id); ice-cream first piece right, second wrong (prefers " kite" over "cream"); pen-pal both pieces right;
    puppy wrong by a tie it loses (" bread" has a lower id)."""
    ids = tok.ids
    assert ids[" waltz"] > ids[" violin"] and ids[" bread"] < ids[" puppy"]  # the two ties mean what they say
    table = torch.zeros(tok.vocab_size, tok.vocab_size)
    for a, b in [(" his", " kite"), (" some", " bread"), (" the", " violin"), (" old", " violin"), (" old", " waltz"),
                 (" her", " ice-"), (" ice-", " kite"), (" their", " pen-"), (" pen-", "pal"),
                 (" hungry", " puppy"), (" hungry", " bread")]:
        table[ids[a], ids[b]] = 4.0
    return table


_LB_DESIGNED_VERDICTS = [True, True, False, True, False, True, False]


def _lb_one_row(toks, num_target):
    """score_targets' input for one unpadded passage: its tokens and the mask of its target tokens, as batches of 1."""
    return torch.tensor([toks]), torch.tensor([[0] * (len(toks) - num_target) + [1] * num_target])


# ---- lambada.py: the data: a passage split at its last space, the rows, the download


def test_lambada_split_passage_at_the_last_space():
    assert lambada.split_passage("the cat sat on the mat") == ("the cat sat on the", " mat")
    assert lambada.split_passage("He said,\n\"Come in.\" She smiled") == ("He said,\n\"Come in.\" She", " smiled")
    assert lambada.split_passage("two  spaces") == ("two ", " spaces")  # only the last space goes to the target
    for text, target in zip(_LB_PASSAGES, _LB_TARGETS):
        context, got = lambada.split_passage(text)
        assert got == target and context + target == text


def test_lambada_load_examples_reads_jsonl_with_blank_lines(tmp_path):
    path = _lb_write(tmp_path / "lambada.jsonl", blank_lines=True)
    with open(path, "a", encoding="utf-8", newline="") as f:  # a CRLF line and an extra key are fine too
        f.write(json.dumps({"text": "Snow fell all night, so in the morning the children built a snowman out of snow",
                            "id": 7}) + "\r\n")
    examples = lambada.load_examples(path)
    assert [e["text"] for e in examples] == _LB_PASSAGES + [
        "Snow fell all night, so in the morning the children built a snowman out of snow"]
    assert examples[-1]["id"] == 7
    assert lambada.load_examples(str(path)) == examples  # a str path too
    assert lambada.parse_example('{"text": "a b"}', "x:1") == {"text": "a b"}


# ---- lambada.py: rendering: context and " " + last word encoded apart, the context cut from its start to fit


def test_lambada_render_token_by_token_with_a_word_level_stand_in():
    tok = _lb_tokenizer()
    for text, target in zip(_LB_PASSAGES, _LB_TARGETS):
        context = text[:-len(target)]
        tok.calls.clear()
        tokens, num_target, cut = lambada.render_example({"text": text}, tok)
        assert tok.calls == [context, text]  # as lm-eval: the context, then the whole passage (split after it)
        ctx_ids, tgt_ids = tok.encode(context), tok.encode(target)
        assert tokens == ctx_ids + tgt_ids and num_target == len(tgt_ids) and cut is False
    tokens, num_target, _ = lambada.render_example({"text": _LB_PASSAGES[4]}, tok)
    ids = tok.ids
    assert num_target == 2 and tokens[-3:] == [ids[" her"], ids[" ice-"], ids["cream"]]


def test_lambada_render_cuts_the_context_from_the_start_to_fit_max_len():
    tok = _lb_tokenizer()
    example = {"text": _LB_PASSAGES[0]}  # one target piece
    full, _, _ = lambada.render_example(example, tok)
    n = len(full)
    # the model's input is all tokens but the last: n - 1 tokens fit max_len = n - 1 exactly, uncut
    assert lambada.render_example(example, tok, max_len=n - 1) == (full, 1, False)
    assert lambada.render_example(example, tok, max_len=n + 5) == (full, 1, False)
    for max_len in (n - 2, 10, 2, 1):
        tokens, num_target, cut = lambada.render_example(example, tok, max_len=max_len)
        assert len(tokens) - 1 == max_len and tokens == full[-(max_len + 1):]  # the start went, the end stayed
        assert num_target == 1 and cut is True
    example = {"text": _LB_PASSAGES[4]}  # " ice-" "cream": two target pieces
    full, _, _ = lambada.render_example(example, tok)
    # exactly max_len target tokens keep one context token; one more than that cannot be scored (evaluate skips it)
    assert lambada.render_example(example, tok, max_len=2) == (full[-3:], 2, True)
    with pytest.raises(hellaswag.Unscorable) as e:
        lambada.render_example(example, tok, max_len=1)
    _bad_says(str(e.value), "lambada: ", "' ice-cream'", 2, 1)
    assert issubclass(hellaswag.Unscorable, ValueError)


@pytest.mark.parametrize("drop, named", [(lambda text, ids: [] if not text.startswith(" ") else ids, "context"),
                                         (lambda text, ids: ids[:-1] if text.endswith(" kite") else ids, "' kite'")],
                         ids=["context", "target"])
def test_lambada_render_refuses_a_context_or_a_target_that_encodes_to_nothing(drop, named):
    # a tokenizer that drops what it does not know can leave no context, or no target: Unscorable, skipped, counted
    class Dropping(_LbPieceTokenizer):
        def encode(self, text):
            return drop(text, super().encode(text))
    with pytest.raises(hellaswag.Unscorable) as e:
        lambada.render_example(_lb_examples()[0], Dropping(_LB_PASSAGES))
    _bad_says(str(e.value), "lambada: ", named)


@needs_gpt2_files
def test_lambada_render_with_tiktoken_context_and_target_apart():
    import tiktoken
    enc = tiktoken.get_encoding("gpt2")
    for text, target in zip(_LB_PASSAGES, _LB_TARGETS):
        context = text[:-len(target)]
        tokens, num_target, cut = lambada.render_example({"text": text}, enc)
        ctx_ids, tgt_ids = enc.encode(context), enc.encode(target)
        assert tokens == ctx_ids + tgt_ids and num_target == len(tgt_ids) and not cut
        assert enc.decode(tokens[-num_target:]) == target and enc.decode(tokens[-num_target:][:1]).startswith(" ")
    tokens, num_target, _ = lambada.render_example({"text": _LB_PASSAGES[4]}, enc)
    assert num_target == len(enc.encode(" ice-cream")) > 1  # a multi-token target with the real tokenizer
    tokens, num_target, cut = lambada.render_example({"text": _LB_PASSAGES[4]}, enc, max_len=num_target)
    assert cut and len(tokens) == num_target + 1 and enc.decode(tokens[1:]) == " ice-cream"
    with pytest.raises(hellaswag.Unscorable):
        lambada.render_example({"text": _LB_PASSAGES[4]}, enc, max_len=num_target - 1)


# ---- lambada.py: scoring: the target's summed negative log-likelihood, and whether every token was the argmax


@pytest.mark.parametrize("kind", ["logits", "gpt-style", "bf16"])
def test_lambada_score_targets_matches_hand_computed_nll(kind):
    # a random bigram model (an off-by-one in the shift or mask changes the numbers): 7 passages in one right-padded
    # batch and one at a time; a (logits, loss) model as GPT; a bfloat16 model's nll in float32
    tok = _lb_tokenizer()
    table = torch.randn(tok.vocab_size, tok.vocab_size, generator=torch.Generator().manual_seed(0)) * 2
    model = _TableLM(table, gpt_style=kind == "gpt-style")
    if kind == "bf16":
        table = table.bfloat16().float()
        model = _TableLM(table).to(torch.bfloat16)
    rendered = [lambada.render_example(e, tok) for e in _lb_examples()]
    refs = [_lb_reference(table, toks[:-n], toks[-n:]) for toks, n, _ in rendered]
    T = max(len(toks) for toks, _, _ in rendered)
    tokens = torch.tensor([toks + [0] * (T - len(toks)) for toks, _, _ in rendered])
    mask = torch.tensor([[0] * (len(toks) - n) + [1] * n + [0] * (T - len(toks)) for toks, n, _ in rendered])
    nll, greedy = lambada.score_targets(model, tokens, mask)
    assert nll.dtype == torch.float32 and nll.tolist() == pytest.approx([r[0] for r in refs], rel=1e-5)
    assert greedy.tolist() == [r[1] for r in refs]
    assert model.seen[-1][2] == (7, T - 1)  # the last token is never an input
    for (toks, n, _), (ref_nll, ref_greedy) in zip(rendered, refs):
        one_nll, one_greedy = lambada.score_targets(model, *_lb_one_row(toks, n))
        assert one_nll.item() == pytest.approx(ref_nll, rel=1e-5) and one_greedy.item() == ref_greedy


# ---- lambada.py: evaluate: accuracy and perplexity over passages, batched, skipping what cannot be scored, DDP


def test_lambada_evaluate_controlled_model_gives_known_acc_and_ppl():
    tok = _lb_tokenizer()
    table = _lb_designed_table(tok)
    refs = []
    for text, target in zip(_LB_PASSAGES, _LB_TARGETS):
        refs.append(_lb_reference(table, tok.encode(text[:-len(target)]), tok.encode(target)))
    assert [g for _, g in refs] == _LB_DESIGNED_VERDICTS  # the design, checked by the plain-Python reference
    # ice-cream: its first piece is the argmax, its second is not -> not greedy, and its nll is the sum of both
    assert refs[4][0] > refs[0][0] > 0
    nll = sum(n for n, _ in refs)
    for batch_size in (1, 2, 3, 8):  # batching and padding never change the result
        r = lambada.evaluate(_TableLM(table), tok, _lb_examples(), "cpu", batch_size=batch_size)
        assert set(r) == {"acc", "ppl", "num_correct", "num_total", "num_skipped", "nll"}  # no num_cut: nothing cut
        assert (r["num_correct"], r["num_total"], r["num_skipped"]) == (4, 7, 0)
        assert r["acc"] == pytest.approx(4 / 7)
        assert r["nll"] == pytest.approx(nll, rel=1e-6)
        assert r["ppl"] == pytest.approx(math.exp(nll / 7), rel=1e-6)
    assert _eval_figures(lambada.result_line(r)) == {"acc": (0.5714, 4, 7), "ppl": pytest.approx(r["ppl"], abs=0.005),
                                                     "skipped": 0}
    # a model sure of every target: acc 1, ppl close to 1
    sure = torch.full((tok.vocab_size, tok.vocab_size), -30.0)
    for text, target in zip(_LB_PASSAGES, _LB_TARGETS):
        ids = tok.encode(text[:-len(target)])[-1:] + tok.encode(target)
        for a, b in zip(ids, ids[1:]):
            sure[a, b] = 30.0
    r = lambada.evaluate(_TableLM(sure, gpt_style=True), tok, _lb_examples(), "cpu")
    assert (r["num_correct"], r["acc"]) == (7, 1.0) and r["ppl"] == pytest.approx(1.0, abs=1e-6)


def test_lambada_perplexity_of_many_passages_is_exp_of_the_mean_nll():
    # uniform: every target piece costs log(V); 20 x 7 passages sum far above 700; ppl = V ** (9 / 7)
    tok = _lb_tokenizer()
    model = _TableLM(torch.zeros(tok.vocab_size, tok.vocab_size))
    r = lambada.evaluate(model, tok, _lb_examples() * 20, "cpu", batch_size=32)
    nll = 20 * 9 * math.log(tok.vocab_size)
    assert r["num_total"] == 140 and r["nll"] > 700 and r["nll"] == pytest.approx(nll, rel=1e-5)
    assert r["ppl"] == pytest.approx(tok.vocab_size ** (9 / 7), rel=1e-5)


def test_lambada_perplexity_of_a_confidently_wrong_model_is_not_capped_early():
    # every target piece 100 below the rest: ~130 nats a passage, ppl ~1e56, a finite float64: only a mean above
    # ~709 may be capped (a cap at 70 would report e^70 for any model this bad)
    tok = _lb_tokenizer()
    for penalty in (100.0, 1000.0):
        table = torch.zeros(tok.vocab_size, tok.vocab_size)
        for target in _LB_TARGETS:
            table[:, tok.encode(target)] = -penalty
        nll = sum(_lb_reference(table, tok.encode(text[:-len(target)]), tok.encode(target))[0]
                  for text, target in zip(_LB_PASSAGES, _LB_TARGETS))
        r = lambada.evaluate(_TableLM(table), tok, _lb_examples(), "cpu")
        assert r["num_total"] == 7 and r["nll"] == pytest.approx(nll, rel=1e-5)
        if nll / 7 < 700:
            assert 100 < nll / 7 and r["ppl"] == pytest.approx(math.exp(nll / 7), rel=1e-4)
        else:   # exp(1290) overflows a float64: capped, finite, still above every uncapped perplexity below it
            assert math.isfinite(r["ppl"]) and r["ppl"] >= math.exp(700)


def test_lambada_evaluate_skips_targets_longer_than_the_context(capsys):
    # context_length 1: the two 2-piece targets are skipped and counted; the others keep their last context token,
    # all a bigram model reads: their verdicts stay
    tok = _lb_tokenizer()
    table = _lb_designed_table(tok)
    refs = [_lb_reference(table, tok.encode(t[:-len(g)]), tok.encode(g)) for t, g in zip(_LB_PASSAGES, _LB_TARGETS)]
    kept = [i for i, g in enumerate(_LB_TARGETS) if len(tok.encode(g)) == 1]
    assert kept == [0, 1, 2, 3, 6]
    for batch_size in (1, 2, 8):
        model = _TableLM(table, context_length=1)
        r = lambada.evaluate(model, tok, _lb_examples(), "cpu", batch_size=batch_size)
        assert (r["num_skipped"], r["num_total"], r["num_correct"], r["num_cut"]) == (2, 5, 3, 5)
        assert r["acc"] == pytest.approx(3 / 5)
        assert r["nll"] == pytest.approx(sum(refs[i][0] for i in kept), rel=1e-6)
        assert r["ppl"] == pytest.approx(math.exp(r["nll"] / 5), rel=1e-9)
        assert max(shape[1] for _, _, shape in model.seen) == 1
    assert _eval_figures(lambada.result_line(r)) == {"acc": (0.6, 3, 5), "ppl": pytest.approx(r["ppl"], abs=0.005),
                                                     "skipped": 2}
    # context_length 2: every target fits, the 2-piece ones with one context token: nothing skipped, all cut
    model = _TableLM(table, context_length=2)
    r = lambada.evaluate(model, tok, _lb_examples(), "cpu")
    assert (r["num_skipped"], r["num_total"], r["num_correct"], r["num_cut"]) == (0, 7, 4, 7)
    assert r["nll"] == pytest.approx(sum(n for n, _ in refs), rel=1e-6)
    assert _eval_figures(lambada.result_line(r))["skipped"] == 0
    # nothing fits at all: no passage scored, nan perplexity, every one skipped
    model = _TableLM(table, context_length=1)
    r = lambada.evaluate(model, tok, [_lb_examples()[4], _lb_examples()[5]], "cpu")
    assert (r["num_total"], r["num_skipped"], r["acc"]) == (0, 2, 0.0) and math.isnan(r["ppl"])
    # the progress line counts skipped passages too, also when a whole batch is skipped (here: every batch)
    capsys.readouterr()
    lambada.evaluate(model, tok, [_lb_examples()[4], _lb_examples()[5]], "cpu", batch_size=1, progress=True)
    words, ended = _eval_progress(capsys.readouterr().err)
    assert {"2/2", "0.0000"} <= words and ended
    lambada.evaluate(model, tok, _lb_examples()[3:6], "cpu", batch_size=2, progress=True)  # the last batch: skipped
    words, ended = _eval_progress(capsys.readouterr().err)
    assert {"3/3", "1.0000"} <= words and ended


def test_lambada_evaluate_runs_in_eval_no_grad_restores_mode_and_prints_verbose(capsys):
    tok = _lb_tokenizer()
    model = _TableLM(_lb_designed_table(tok))
    model.train()
    r = lambada.evaluate(model, tok, _lb_examples(), "cpu", verbose=True, batch_size=3)
    assert model.training and torch.is_grad_enabled()
    assert [s[:2] for s in model.seen] == [(False, False)] * 3  # 7 passages in batches of 3 -> 3 forwards
    assert [s[2][0] for s in model.seen] == [3, 3, 1]
    assert r["num_correct"] == 4
    # verbose: every passage in order with its verdict and its target word, and the running count of right ones
    out = capsys.readouterr().out
    assert re.findall(r"\b(right|wrong)\b", out) == ["right" if v else "wrong" for v in _LB_DESIGNED_VERDICTS]
    where = [out.find(repr(target.strip())) for target in _LB_TARGETS]
    assert -1 not in where and where == sorted(where)
    assert re.findall(r"\b\d+/\d+\b", out)[-1] == "4/7"
    model.eval()
    lambada.evaluate(model, tok, _lb_examples(), "cpu", progress=True)
    assert not model.training
    words, ended = _eval_progress(capsys.readouterr().err)
    assert {"7/7", "0.5714"} <= words and ended


def _lb_model_reference(model, tokens, num_target):
    """One unpadded passage straight through the model: float64 log-softmax, summed nll and greedy of the target."""
    with torch.no_grad():
        out = model(torch.tensor([tokens[:-1]]))
    logp = torch.log_softmax((out[0] if isinstance(out, tuple) else out)[0].double(), dim=-1)
    positions = range(len(tokens) - num_target - 1, len(tokens) - 1)
    nll = -sum(logp[p, tokens[p + 1]].item() for p in positions)
    return nll, all(logp[p].argmax().item() == tokens[p + 1] for p in positions)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_lambada_batched_padded_scoring_equals_one_passage_at_a_time(arch):
    # a tiny model trained a few steps on the first 4 passages gets some targets right and some wrong
    tok = _lb_tokenizer()
    model = _eval_tiny_model(arch, tok.vocab_size, context_length=64)
    _eval_fit(model, [tok.encode(t) for t in _LB_PASSAGES[:4]], steps=25)
    model.eval()
    refs = [_lb_model_reference(model, *lambada.render_example(e, tok)[:2]) for e in _lb_examples()]
    greedy = [g for _, g in refs]
    assert any(greedy) and not all(greedy), greedy  # both verdicts occur, so accuracy is tested
    for mode in ("train", "eval"):
        model.train(mode == "train")
        for batch_size in (1, 2, 3, 8):
            r = lambada.evaluate(model, tok, _lb_examples(), "cpu", batch_size=batch_size)
            assert (r["num_correct"], r["num_total"]) == (sum(greedy), 7)
            assert r["nll"] == pytest.approx(sum(n for n, _ in refs), rel=1e-5)
            assert r["ppl"] == pytest.approx(math.exp(sum(n for n, _ in refs) / 7), rel=1e-5)
            assert model.training == (mode == "train")  # left as it was found


@needs_gpt2_files
def test_lambada_init_from_hf_directory_matches_transformers_reference(tmp_path, monkeypatch, capsys):
    # --init_from on a tiny random GPT-2 against transformers' scores, passage by passage; passages 8-9 end in the
    # model's own greedy choice (right targets); the last is longer than the 64-token context and is cut to fit
    import tiktoken
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2, initializer_range=0.3)).eval()
    hf.save_pretrained(tmp_path / "hf")
    enc = tiktoken.get_encoding("gpt2")

    def reference(text):
        context, word = text.rsplit(" ", 1)
        ctx_ids, tgt_ids = enc.encode(context), enc.encode(" " + word)
        ctx_ids = ctx_ids[-(64 + 1 - len(tgt_ids)):]
        ids = ctx_ids + tgt_ids
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([ids[:-1]])).logits[0].double(), dim=-1)
        pos = [len(ctx_ids) - 1 + k for k in range(len(tgt_ids))]
        return (-sum(logp[p, t].item() for p, t in zip(pos, tgt_ids)),
                all(logp[p].argmax().item() == t for p, t in zip(pos, tgt_ids)))

    texts = list(_LB_PASSAGES)
    for text in _LB_PASSAGES:
        context = text.rsplit(" ", 1)[0]
        with torch.no_grad():
            guess = enc.decode([hf(torch.tensor([enc.encode(context)])).logits[0, -1].argmax().item()])
        if re.fullmatch(r" [A-Za-z]+", guess) and len(texts) < 9:
            texts.append(context + guess)
    texts.append(" ".join(_LB_PASSAGES[:3]))
    assert len(texts) == 10, "fewer than 2 word-like greedy guesses: pick other passages"
    refs = [reference(t) for t in texts]
    assert [g for _, g in refs[7:9]] == [True, True] and not any(g for _, g in refs[:7])
    assert len(enc.encode(texts[-1])) > 64 and max(len(enc.encode(t)) for t in texts[:-1]) <= 64
    ours = M.GPT.from_pretrained(str(tmp_path / "hf"))
    examples = [{"text": t} for t in texts]
    for ex, (ref_nll, ref_greedy) in zip(examples, refs):
        tokens, k, _ = lambada.render_example(ex, enc, 64)
        nll, greedy = lambada.score_targets(ours.eval(), *_lb_one_row(tokens, k))
        assert nll.item() == pytest.approx(ref_nll, rel=1e-4) and greedy.item() == ref_greedy
    n, correct, nll = len(texts), sum(g for _, g in refs), sum(x for x, _ in refs)
    r = lambada.evaluate(ours, enc, examples, "cpu")
    assert (r["num_total"], r["num_correct"], r["num_cut"], r["num_skipped"]) == (n, correct, 1, 0)
    assert r["nll"] == pytest.approx(nll, rel=1e-4) and r["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-4)
    # the command line: the same figures, one warning naming how many contexts of how many were cut, to what length
    data = _lb_write(tmp_path / "lambada.jsonl", texts)
    out, err = _eval_run(monkeypatch, capsys, lambada, f"--init_from={tmp_path / 'hf'}", "--data", data, "--device=cpu")
    last = out.strip().splitlines()[-1]
    assert last == lambada.result_line(r)
    assert _eval_figures(last) == {"acc": (round(correct / n, 4), correct, n),
                                   "ppl": pytest.approx(math.exp(nll / n), rel=1e-4), "skipped": 0}
    (warning,) = [line for line in err.splitlines() if line.startswith("lambada.py: ") and "warning" in line]
    _bad_says(warning, "lambada.py: ", 1, 10, 64)


# ---- lambada.py: the command line


@needs_gpt2_files
def test_lambada_cli_on_a_checkpoint(tmp_path, monkeypatch, capsys):
    # a train.py checkpoint with GPT-2's tokenizer through main(): evaluate()'s score and count; --limit, --verbose
    model, tok, ckpt = _eval_gpt2_checkpoint(tmp_path)
    data = _lb_write(tmp_path / "lambada.jsonl", blank_lines=True)
    expected = lambada.result_line(lambada.evaluate(model, tok, _lb_examples(), "cpu"))
    assert _eval_figures(expected)["acc"][2] == 7
    out, _ = _eval_run(monkeypatch, capsys, lambada, "--ckpt", ckpt, "--data", data, "--device=cpu", "--batch_size=3")
    assert out.strip().splitlines()[-1] == expected and "7 passages" in out
    expected3 = lambada.result_line(lambada.evaluate(model, tok, _lb_examples()[:3], "cpu"))
    assert _eval_figures(expected3)["acc"][2] == 3
    out = _eval_run(monkeypatch, capsys, lambada, "--ckpt", ckpt, "--data", data, "--limit", 3, "--verbose",
                    "--device", "cpu").out
    assert out.strip().splitlines()[-1] == expected3 and len(re.findall(r"\b(right|wrong)\b", out)) == 3


# ---- hellaswag.py and lambada.py: the command line's mistakes and warnings: one line each, before any work


@pytest.mark.parametrize("script", [hellaswag, lambada])
@pytest.mark.parametrize("argv, flag, named", [
    ([], "", ["--ckpt", "--init_from"]),
    (["--ckpt=x.pt", "--init_from=gpt2"], "", ["--ckpt", "--init_from"]),
    # (a --limit of -3 would otherwise drop the last 3 examples, and 0 leave none to score)
    (["--init_from=gpt2", "--limit=0"], "--limit", ["0"]),
    (["--init_from=gpt2", "--limit=-3"], "--limit", ["-3"]),
    (["--init_from=gpt2", "--batch=0"], "--batch", ["0"]),   # hellaswag.py's --batch_examples, lambada's --batch_size
], ids=["no-model", "two-models", "limit-0", "limit-negative", "batch-0"])
def test_eval_bad_flags_are_one_line_before_any_work(monkeypatch, script, argv, flag, named):
    batch = {hellaswag: "--batch_examples", lambada: "--batch_size"}[script]
    flag, argv = flag.replace("--batch", batch), [a.replace("--batch=", f"{batch}=") for a in argv]
    # (both scripts' command line is hellaswag.eval_main)
    monkeypatch.setattr(hellaswag, "setup_device", lambda *a, **k: pytest.fail("went on to pick a device"))
    monkeypatch.setattr(hellaswag, "load_model", lambda *a, **k: pytest.fail("went on to load a model"))
    _bad_says(_bad_exit(monkeypatch, script, *argv), f"{script.__name__}.py: {flag}", *named)


_EVAL_CLI_FILE_REFUSALS = {   # case: (command line, the line's start after the script's name, what it names); {d}:
    # ckpt.pt (a tiny Llama, its byte-level tokenizer in tok/), small/ckpt.pt (200 ids), latin1.jsonl, bad.jsonl (its
    # second row no example), a_file (where the download would be cached)
    "missing-checkpoint": (["--ckpt={d}/nope"], "--ckpt {d}/nope: ", ["no such"]),
    "missing-data": (["--ckpt={d}/ckpt.pt", "--data={d}/nope"], "--data {d}/nope: ", ["no such"]),
    "data-not-utf8": (["--ckpt={d}/ckpt.pt", "--data={d}/latin1.jsonl"], "--data {d}/latin1.jsonl: ", ["UTF-8"]),
    "data-row-no-example": (["--ckpt={d}/ckpt.pt", "--data={d}/bad.jsonl"], "--data {d}/bad.jsonl:2: ", ["{field}"]),
    "data_dir-a-file": (["--ckpt={d}/ckpt.pt", "--data_dir={d}/a_file"], "(no --data) ", ["{d}/a_file"]),
    "tokenizer-larger-than-the-model": (["--ckpt={d}/small/ckpt.pt"], "--ckpt {d}/small/ckpt.pt: ",
                                        ["'{d}/small/tok'", "257", "200"]),
}


@pytest.mark.parametrize("case", list(_EVAL_CLI_FILE_REFUSALS))
@pytest.mark.parametrize("script", [hellaswag, lambada])
def test_eval_cli_names_the_file_it_cannot_use(tmp_path, monkeypatch, script, case):
    # missing files, data not UTF-8 or with a row that is no example (line and field named), a --data_dir that is a
    # file, a tokenizer larger than the model: one line, before a score
    argv, prefix, named = _EVAL_CLI_FILE_REFUSALS[case]
    field = "'endings'" if script is hellaswag else "'text'"
    fill = lambda s: s.replace("{d}", str(tmp_path)).replace("{field}", field)
    _tiny_llama_ckpt(tmp_path, context_length=64)
    (tmp_path / "small").mkdir()
    _tiny_llama_ckpt(tmp_path / "small", vocab_size=200)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"ctx": "un caf\xe9 noir", "text": "un caf\xe9 noir"}\n')
    rows = ([_hs_row(0, *_HS_ROWS[0]), {"ctx": "A man", "endings": ["a", "b"], "label": 0}] if script is hellaswag
            else [{"text": _LB_PASSAGES[0]}, {"text": "Goodbye"}])
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "a_file").write_text("x")
    message = _bad_exit(monkeypatch, script, *map(fill, argv), "--device=cpu")
    _bad_says(message, f"{script.__name__}.py: {fill(prefix)}", *map(fill, named))


@pytest.mark.parametrize("script", [hellaswag, lambada])
def test_eval_cli_ctrl_c_is_one_line(tmp_path, monkeypatch, script):
    ckpt = _tiny_llama_ckpt(tmp_path, context_length=64)
    name = f"{script.__name__}.py"

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt
    # Ctrl-C: one line after a newline (which leaves the terminal's ^C line), saying what was cut short
    monkeypatch.setattr(script, "load_examples", ctrl_c)
    argv = (f"--ckpt={ckpt}", "--device=cpu")
    _bad_says(_ctrl_c_line(monkeypatch, script, *argv), f"{name}: ", "interrupted", "data")
    monkeypatch.setattr(script, "load_examples", lambda *a, **k: [])
    monkeypatch.setattr(script, "evaluate", ctrl_c)
    _bad_says(_ctrl_c_line(monkeypatch, script, *argv), f"{name}: ", "interrupted", "no score")


def test_eval_load_model_takes_the_tokenizer_flag_over_the_checkpoints_and_checks_its_size(tmp_path, monkeypatch):
    # --tokenizer overrides the checkpoint's and --init_from's gpt2; one of another size than the model is refused
    transformers = pytest.importorskip("transformers")
    GPT2Config, GPT2LMHeadModel = transformers.GPT2Config, transformers.GPT2LMHeadModel
    ckpt = _tiny_llama_ckpt(tmp_path)  # names tmp_path/tok: 257 byte tokens with <|endoftext|>
    byte_tok = tmp_path / "bytes"
    bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [], special_tokens=[]).save_dir(str(byte_tok))
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=16, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        tmp_path / "hf")

    def load(**kw):
        args = argparse.Namespace(**{"ckpt": None, "init_from": None, "tokenizer": None, **kw})
        return hellaswag.load_model(args, "cpu")
    assert load(ckpt=str(ckpt))[1].vocab_size == 257
    _bad_says(_exits(load, ckpt=str(ckpt), tokenizer=str(byte_tok)), f"hellaswag.py: --ckpt {ckpt}: ",
              repr(str(byte_tok)), 256, 257)
    _bad_says(_exits(load, init_from=str(tmp_path / "hf"), tokenizer=str(byte_tok)),
              f"hellaswag.py: --init_from {tmp_path / 'hf'}: ", repr(str(byte_tok)), 256, 300)


@pytest.mark.parametrize("script, context_length, items", [
    # byte-level tokens: every ending is longer than the 16-token context
    (hellaswag, 16, [("A man sits.", ["then he stands up and walks away"] * 4)] * 2),
    # byte-level tokens: " extraordinarily" is 16 tokens, longer than the 8-token context
    (lambada, 8, ["The view was extraordinarily", "She sang extraordinarily"])], ids=["hellaswag", "lambada"])
def test_eval_cli_fails_when_nothing_fits_the_context(tmp_path, monkeypatch, script, context_length, items):
    # every example skipped is no score: one line naming the context length and how many were skipped
    ckpt = _tiny_llama_ckpt(tmp_path, context_length=context_length)
    data = _eval_write(script, tmp_path / "data.jsonl", items)
    _bad_says(_bad_exit(monkeypatch, script, f"--ckpt={ckpt}", f"--data={data}", "--device=cpu"),
              f"{script.__name__}.py: ", context_length, 2)


@pytest.mark.parametrize("script, context_length, items, skipped", [
    # byte-level tokens, 32-token context: the first context (39 bytes) is cut to fit its endings, "He" is not
    (hellaswag, 32, [("A man sits down on a bench in the park.", ["a", "b", "c", "d"]), ("He", ["e", "f", "g", "h"])],
     0),
    # byte tokens, 16-token context: the first passage is cut, "Hi you" is not, the last one's target skipped
    (lambada, 16, ["A man sat down on the bench. He smiled", "Hi you", "It was all quite incomprehensible"], 1)],
    ids=["hellaswag", "lambada"])
def test_eval_cli_warns_once_about_contexts_cut_to_fit(tmp_path, monkeypatch, capsys, script, context_length, items,
                                                       skipped):
    # one warning naming how many scored contexts were cut, and to what length; the result line counts the skipped
    # (--device auto: the CPU on a machine without CUDA)
    ckpt = _tiny_llama_ckpt(tmp_path, context_length=context_length)
    data = _eval_write(script, tmp_path / "data.jsonl", items)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out, err = _eval_run(monkeypatch, capsys, script, f"--ckpt={ckpt}", f"--data={data}", "--device=auto")
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    _bad_says(warning, f"{script.__name__}.py: ", 1, 2, context_length)
    assert _eval_figures(out.strip().splitlines()[-1])["skipped"] == skipped


# ==== export.py and eval.py: a checkpoint as a Hugging Face folder, and lm-evaluation-harness over our models;
# the references: transformers and lm-eval's own --model hf


HS_SUBSET = DATA / "hellaswag" / "hellaswag_val_subset.jsonl"

try:
    import eval as harness   # eval.py (named as the spec names it)
    import lm_eval
    import lm_eval.evaluator
except ImportError:
    harness = lm_eval = None
needs_lm_eval = pytest.mark.skipif(lm_eval is None, reason="lm-eval is not installed (requirements-eval.txt)")

EOT = "<|endoftext|>"
# a few lines of everyday text, for a tokenizer of our own that every test can have (no ../shared needed)
CORPUS = """A man is sitting on a roof. He starts pulling up roofing on the roof. The man climbs down the ladder.
A woman bakes bread in the kitchen. She kneads the dough and puts it in the oven, then she waits.
How to clean a bike chain. Put the bike on a stand. Spray the chain with degreaser and scrub it with a brush.
The children built a snowman out of snow. They gave it a carrot nose and two stones for eyes.
"Come in," she said, and smiled. He said  hello, and the dog barked twice at the door!
"""


@pytest.fixture(autouse=True)
def _no_environment_report(monkeypatch):
    """lm-eval records the machine in every result (torch's collect_env: seconds of subprocesses per run): not here.
    eval.main switches huggingface_hub and datasets offline when the hub is unreachable: undone after each test."""
    if lm_eval is not None:
        monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda storage: None)
        import datasets
        import huggingface_hub
        for module, name in ((huggingface_hub.constants, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
                             (datasets.config, "HF_DATASETS_OFFLINE")):
            monkeypatch.setattr(module, name, getattr(module, name))


# ---- tiny tokenizers and checkpoints


def _train_tokenizer(folder, text, vocab_size):
    """A bpe.py tokenizer trained on text (one worker), saved as a tokenizer folder -> (folder, Tokenizer)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text(text, encoding="utf-8")
    vocab, merges = bpe.train_bpe(folder / "corpus.txt", vocab_size, [EOT], num_workers=1)
    tok = bpe.Tokenizer(vocab, merges, [EOT])
    tok.save_dir(folder / "tok")
    return folder / "tok", bpe.load_tokenizer(folder / "tok")


def _checkpoint(path, arch, tok_ref, vocab_size, context_length=64, seed=0, **config):
    """A train.py-format checkpoint of a random tiny model -> (path, model)."""
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = dict(arch="llama", vocab_size=vocab_size, context_length=context_length, d_model=32, num_layers=2,
                   num_heads=4, **config)
    else:
        cfg = dict(arch="gpt2", vocab_size=vocab_size, block_size=context_length, n_layer=2, n_head=4, n_embd=32,
                   **config)
    model = M.build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:   # norm gains and biases off their 1 / 0 init: a weight mapped to the wrong place shows
                p.uniform_(0.5, 1.5)
            elif arch == "gpt2":   # its init (std 0.02) gives near-uniform distributions, where near-ties pick
                p.mul_(3.0)
    torch.save({"model": model.state_dict(), "model_config": model.model_config(), "tokenizer": str(tok_ref),
                "tokenizer_fingerprint": bpe.tokenizer_fingerprint(tok_ref), "iteration": 0}, path)
    return path, model


@pytest.fixture(scope="module")
def own_tok(tmp_path_factory):
    return _train_tokenizer(tmp_path_factory.mktemp("own"), CORPUS * 3, 320)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, own_tok):
    """{arch: (checkpoint, our model, export folder)}: one of each architecture, exported with export.py's main.
    GPT-2 pads its vocabulary (the padded rows must not reach the folder); Llama has a RoPE theta of its own."""
    tok_dir, tok = own_tok
    out = {}
    for arch, config in [("llama", dict(rope_theta=500.0)), ("gpt2", dict(pad_vocab_to_multiple_of=64))]:
        d = tmp_path_factory.mktemp(arch)
        ckpt, model = _checkpoint(d / "ckpt.pt", arch, tok_dir, tok.vocab_size, context_length=512, **config)
        mp = pytest.MonkeyPatch()
        try:
            _run(export, mp, "--ckpt", ckpt, "--out", d / "hf")
        finally:
            mp.undo()
        out[arch] = ckpt, model, d / "hf"
    return out


# ---- export.py: weights


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_export_logits_equal_the_project_model(exported, arch):
    _, ours, folder = exported[arch]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}[arch]
    assert hf.config.vocab_size == ours.vocab_size   # GPT-2's padded rows were dropped
    idx = torch.randint(0, ours.vocab_size, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, M.logits(ours, idx), atol=1e-5, rtol=0)


def test_export_a_tied_llama_loads_tied_with_the_same_logits(tmp_path, monkeypatch, own_tok):
    ckpt, ours = _checkpoint(tmp_path / "ckpt.pt", "llama", own_tok[0], own_tok[1].vocab_size, tie_embeddings=True)
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.tie_word_embeddings and hf.lm_head.weight is hf.model.embed_tokens.weight
    idx = torch.randint(0, ours.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, M.logits(ours, idx), atol=1e-5, rtol=0)


def test_export_llama_config_carries_theta_eps_and_an_untied_head(exported):
    _, ours, folder = exported["llama"]
    config = json.loads((folder / "config.json").read_text())
    assert (config["rope_theta"], config["rms_norm_eps"], config["tie_word_embeddings"]) == (500.0, 1e-5, False)
    assert (config["intermediate_size"], config["max_position_embeddings"]) == (ours.config.d_ff, 512)
    # the rotation convention is what the export changes: without the q/k permutation the logits differ
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        for layer, block in zip(hf.model.layers, ours.layers):
            layer.self_attn.q_proj.weight.copy_(block.attn.q_proj.weight)
            layer.self_attn.k_proj.weight.copy_(block.attn.k_proj.weight)
        idx = torch.arange(40)[None] % ours.vocab_size
        assert (hf(idx).logits - M.logits(ours, idx)).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_export_greedy_generate_equals_sample_generate(exported, own_tok, arch):
    _, ours, folder = exported[arch]
    tok = own_tok[1]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt = tok.encode("The children built a")
    want = sample.generate(ours, [prompt], 24, temperature=0, stop_token=tok.eot_id)[0]
    assert want
    got = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=tok.eot_id)
    got = got[0, len(prompt):].tolist()
    assert got[:len(want)] == want and got[len(want):] in ([], [tok.eot_id])   # transformers keeps the eos


def test_export_dtype_is_the_weights_dtype(tmp_path, monkeypatch, exported):
    ckpt, _, _ = exported["gpt2"]
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf", "--dtype", "bfloat16")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype="auto")
    assert hf.transformer.wte.weight.dtype == torch.bfloat16


# ---- export.py: tokenizer


def _shared_text(name):
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared/data): real-text test skipped")
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["tinystories/tinystories_sample.txt", "webtext/openwebtext_sample.txt"])
def test_export_autotokenizer_ids_equal_bpe_py(tmp_path, monkeypatch, name):
    text = _shared_text(name)
    tok_dir, tok = _train_tokenizer(tmp_path, text[:100_000], 600)
    ckpt, _ = _checkpoint(tmp_path / "ckpt.pt", "llama", tok_dir, tok.vocab_size)
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    # the whole file a document at a time (one 3 MB string is slow in tokenizers), and its start as one string
    docs = text.split(EOT)
    assert auto(docs)["input_ids"] == [tok.encode(d) for d in docs]
    ids = tok.encode(text[:20_000])
    assert auto(text[:20_000])["input_ids"] == ids and (EOT not in text or tok.eot_id in ids)
    assert auto.decode(ids) == tok.decode(ids)
    assert (auto.eos_token, auto.eos_token_id) == (EOT, tok.eot_id)


@needs_gpt2_files
def test_export_gpt2_tokenized_run_gets_gpt2s_files(tmp_path, monkeypatch):
    import tiktoken
    ckpt, _ = _checkpoint(tmp_path / "ckpt.pt", "gpt2", "gpt2", 50257, context_length=16)
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    assert (tmp_path / "hf" / "vocab.json").read_bytes() == (TIKTOKEN_CACHE / "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"
                                                             ).read_bytes()
    assert (tmp_path / "hf" / "merges.txt").read_bytes() == (TIKTOKEN_CACHE / "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"
                                                             ).read_bytes()
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    path = DATA / "webtext" / "openwebtext_sample.txt"
    text = path.read_text(encoding="utf-8") if path.is_file() else CORPUS + EOT + CORPUS.upper()
    assert auto(text)["input_ids"] == tiktoken.get_encoding("gpt2").encode(text, allowed_special="all")


# ---- export.py: bad input, the hub


@pytest.mark.parametrize("switch, value", [("remove_rope", True), ("use_post_norm", True), ("remove_rmsnorm", True),
                                           ("ffn_type", "silu"), ("ffn_type", "relu2"), ("qk_norm", True),
                                           ("logit_softcap", 30.0)])
def test_export_refuses_llama_ablations_hf_cannot_express(tmp_path, monkeypatch, own_tok, switch, value):
    ckpt, _ = _checkpoint(tmp_path / "ckpt.pt", "llama", own_tok[0], own_tok[1].vocab_size, **{switch: value})
    message = _bad_exit(monkeypatch, export, "--ckpt", ckpt, "--out", tmp_path / "hf")
    _one_line_naming(message, "export.py: --ckpt", ckpt, f"{switch}={value!r}", "LlamaForCausalLM")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("arch, plain", [("llama", False), ("llama", True), ("gpt2", True)])
def test_export_refuses_a_config_field_it_does_not_translate(tmp_path, monkeypatch, own_tok, arch, plain):
    # a field added to model.py's config (the README's Hacking example, with setting(...) or plain) is refused away
    # from its default, naming it and its value; at its default the model exports with the same logits
    import dataclasses
    name = {"llama": "TransformerLMConfig", "gpt2": "GPTConfig"}[arch]

    @dataclasses.dataclass
    class WithNorm(getattr(M, name)):
        norm: str = "rmsnorm" if plain else M.setting("rmsnorm", "rmsnorm | layernorm",
                                                      choices=("rmsnorm", "layernorm"))
    monkeypatch.setattr(M, name, WithNorm)
    ckpt, _ = _checkpoint(tmp_path / "ln.pt", arch, own_tok[0], own_tok[1].vocab_size, norm="layernorm")
    message = _bad_exit(monkeypatch, export, "--ckpt", ckpt, "--out", tmp_path / "hf")
    _one_line_naming(message, "export.py: --ckpt", ckpt, "norm='layernorm'", export.TARGETS[arch])
    assert not (tmp_path / "hf").exists()
    ckpt, ours = _checkpoint(tmp_path / "rms.pt", arch, own_tok[0], own_tok[1].vocab_size, norm="rmsnorm")
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, ours.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, M.logits(ours, idx), atol=1e-5, rtol=0)


def test_export_refuses_an_unknown_architecture(tmp_path, monkeypatch, exported):
    ckpt = torch.load(exported["llama"][0], weights_only=True)
    ckpt["model_config"]["arch"] = "mamba"
    torch.save(ckpt, tmp_path / "ckpt.pt")
    _one_line_naming(_bad_exit(monkeypatch, export, "--ckpt", tmp_path / "ckpt.pt", "--out", tmp_path / "hf"),
                     "export.py: --ckpt", "'mamba'")


def test_export_refuses_a_folder_with_files_unless_forced(tmp_path, monkeypatch, exported):
    ckpt = exported["gpt2"][0]
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    _one_line_naming(_bad_exit(monkeypatch, export, "--ckpt", ckpt, "--out", tmp_path / "hf"), "export.py: --out",
                     "--force")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["notes.txt"]
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf", "--force")
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (tmp_path / "hf" / "notes.txt").read_text() == "mine"


def test_export_weights_get_the_mode_of_the_other_files(tmp_path, monkeypatch, exported):
    # safetensors writes its file 0600: every file of the folder is 0666 less the umask, model.safetensors included
    umask = os.umask(0o027)
    try:
        _run(export, monkeypatch, "--ckpt", exported["gpt2"][0], "--out", tmp_path / "hf")
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux's /proc")
def test_export_an_out_under_proc_is_refused_before_loading(monkeypatch, exported):
    monkeypatch.setattr(export, "load_model_and_tokenizer", _bpe_not_called)
    _one_line_naming(_bad_exit(monkeypatch, export, "--ckpt", exported["gpt2"][0], "--out", "/proc/hf"),
                     "export.py: --out", "/proc/hf")


def test_export_a_full_disk_is_one_line_and_leaves_the_folder_as_it_was(tmp_path, exported):
    # --force over an earlier export, on a full disk: exit status 1, one line naming --out and the file, nothing changed
    shutil.copytree(exported["llama"][2], tmp_path / "hf")
    before = _files(tmp_path / "hf")
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), "--ckpt", str(exported["gpt2"][0]), "--out",
                        str(tmp_path / "hf"), "--force"], capture_output=True, text=True, timeout=300,
                       preexec_fn=_file_size_limit(20000))
    assert r.returncode == 1
    _one_line_naming(r.stderr.strip().splitlines()[-1], f"export.py: --out {tmp_path / 'hf'}: ", "model.safetensors")
    assert _files(tmp_path / "hf") == before and sorted(os.listdir(tmp_path / "hf")) == sorted(p.name for p in before)


def test_export_a_tokenizer_that_does_not_match_is_refused_by_its_fingerprint(tmp_path, monkeypatch, exported,
                                                                               own_tok):
    other_dir, other = _train_tokenizer(tmp_path, CORPUS.upper() * 3, own_tok[1].vocab_size)  # same size, other tokens
    assert other.vocab_size == own_tok[1].vocab_size
    message = _bad_exit(monkeypatch, export, "--ckpt", exported["llama"][0], "--out", tmp_path / "hf",
                     "--tokenizer", other_dir)
    _one_line_naming(message, "export.py: --ckpt", "fingerprint", other_dir)


class _FakeHub:
    def __init__(self):
        self.calls = []

    def create_repo(self, repo, exist_ok=False):
        self.calls.append(("create_repo", repo, exist_ok))

    def upload_folder(self, repo_id, folder_path, commit_message=None):
        self.calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))
        return f"https://huggingface.co/{repo_id}/commit/0"


def test_export_push_to_hub_uploads_the_folder(tmp_path, monkeypatch, capsys, exported):
    import huggingface_hub
    hub = _FakeHub()
    monkeypatch.setattr(huggingface_hub, "create_repo", hub.create_repo)
    monkeypatch.setattr(huggingface_hub, "upload_folder", hub.upload_folder)
    monkeypatch.setattr(M, "hub_reachable", lambda timeout=3.0: (True, ""))
    _run(export, monkeypatch, "--ckpt", exported["llama"][0], "--out", tmp_path / "hf", "--push_to_hub", "me/tiny")
    files = ["config.json", "merges.txt", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    assert hub.calls == [("create_repo", "me/tiny", True), ("upload_folder", "me/tiny", files)]
    assert "https://huggingface.co/me/tiny/commit/0" in capsys.readouterr().out.splitlines()[-1]   # where it went


def test_export_push_to_hub_offline_is_one_line_and_keeps_the_folder(tmp_path, monkeypatch, exported):
    monkeypatch.setattr(M, "hub_reachable", lambda timeout=3.0: (False, "cannot reach huggingface.co (no network)"))
    message = _bad_exit(monkeypatch, export, "--ckpt", exported["llama"][0], "--out", tmp_path / "hf",
                     "--push_to_hub", "me/tiny")
    _one_line_naming(message, "export.py: --push_to_hub me/tiny", "cannot reach huggingface.co", "hf upload me/tiny")
    assert (tmp_path / "hf" / "model.safetensors").is_file()


# ---- eval.py: the bridge against hellaswag.py and against lm-eval's own Hugging Face backend

# hand-written rows in the original rowanz format (one WikiHow-style row with the [title] markers lm-eval removes)
HS_ROWS = [
    dict(activity_label="Roof shingle removal", ctx_a="A man is sitting on a roof.", ctx_b="he",
         endings=["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                  "is holding a rubik's cube.", "starts pulling up roofing on a roof."], label=3),
    dict(activity_label="Baking cookies", ctx_a="A woman bakes bread in the kitchen.", ctx_b="she",
         endings=["kneads the dough and puts it in the oven.", "climbs down the ladder.",
                  "gave it a carrot nose.", "barked twice."], label=0),
    dict(activity_label="Cleaning a bike", ctx_a="How to clean a bike chain. [title] Put the bike on a stand.",
         ctx_b="[step] spray", endings=["the chain with degreaser and scrub it with a brush.", "the snowman.",
                                        "a roof on the chain.", "twice at the door."], label=0),
    dict(activity_label="Building a snowman", ctx_a="The children went outside.", ctx_b="they",
         endings=["built a snowman out of snow.", "said hello.", "put it in the oven.", "smiled at the dog."], label=0),
]


def _hs_rows():
    """The hand-written rows, then the first 8 of ../shared's HellaSwag subset when it is there."""
    rows = [dict(r, ind=i, ctx=f"{r['ctx_a']} {r['ctx_b']}", split="val", split_type="indomain", source_id="test")
            for i, r in enumerate(HS_ROWS)]
    if HS_SUBSET.is_file():
        rows += [json.loads(line) for line in HS_SUBSET.read_text(encoding="utf-8").splitlines()[:8]]
    return rows


def _task(folder, name, split, data, include=None, **fields):
    """A task YAML in folder (JSON is YAML): a shipped task read from another file, or one of its own."""
    cfg = dict(include=str(include)) if include else {}
    cfg.update(task=name, dataset_path="json", dataset_kwargs={"data_files": {split: str(data)}}, **fields)
    (Path(folder) / f"{name}.yaml").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


# a multiple-choice task rendered as hellaswag.py renders HellaSwag: the context, then " " + each ending
AS_HELLASWAG_PY = dict(output_type="multiple_choice", validation_split="validation", doc_to_text="{{ctx}}",
                       doc_to_target="{{label}}", doc_to_choice="endings",
                       metric_list=[dict(metric="acc", aggregation="mean", higher_is_better=True),
                                    dict(metric="acc_norm", aggregation="mean", higher_is_better=True)])


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A folder of tasks on small local files: the shipped hellaswag_local and lambada_openai_local on them, and
    HellaSwag rendered as hellaswag.py renders it (context, then " " + ending)."""
    d = tmp_path_factory.mktemp("tasks")
    hs = _hs_write_rows(d / "hs.jsonl", _hs_rows())
    _task(d, "hs_test", "validation", hs, include=ROOT / "tasks" / "hellaswag_local.yaml")
    _task(d, "hs_nanogpt", "validation", hs, **AS_HELLASWAG_PY)
    _task(d, "lambada_test", "test", _lb_write(d / "lambada.jsonl", LAMBADA_TEXTS),
          include=ROOT / "tasks" / "lambada_openai_local.yaml")
    return d


def _lm_eval(model, tasks_dir, task, **kw):
    """lm-eval on `task` of tasks_dir, local tasks only (lm-eval's thousands of own YAMLs take long to index)."""
    if not isinstance(model, str):   # the bridge, through eval.py's own call
        return harness.evaluate(model, [task], include_path=[tasks_dir], bootstrap_iters=0, log_samples=True)
    manager = lm_eval.tasks.TaskManager(include_path=[str(tasks_dir), str(ROOT / "tasks")], include_defaults=False)
    return lm_eval.simple_evaluate(model=model, tasks=[task], task_manager=manager, bootstrap_iters=0,
                                   log_samples=True, **kw)


def _hf_lm_eval(folder, tasks_dir, task):
    """lm-eval's own `--model hf` on an exported folder."""
    return _lm_eval("hf", tasks_dir, task, model_args=dict(pretrained=str(folder), dtype="float32"), device="cpu",
                    batch_size=8)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # lm-eval's HF backend and transformers: local files only


@needs_lm_eval
def test_eval_bridge_picks_what_hellaswag_py_picks_under_the_same_rendering(exported, own_tok, tasks):
    _, model, _ = exported["llama"]
    tok = own_tok[1]
    out = _lm_eval(harness.HarnessLM(model, tok, batch_size=5), tasks, "hs_nanogpt")
    samples = sorted(out["samples"]["hs_nanogpt"], key=lambda s: s["doc_id"])
    rows = _hs_rows()
    assert len(samples) == len(rows)
    for s, row in zip(samples, rows):   # lm-eval's acc_norm is hellaswag.py's acc_norm_char, example by example
        tokens, mask, _ = hellaswag.render_example(row, tok, model.context_length)
        sum_loss, _ = hellaswag.score_endings(model, tokens, mask)
        assert [r[0] for r in s["filtered_resps"]] == pytest.approx((-sum_loss).tolist(), rel=1e-6, abs=1e-4)
        one = hellaswag.evaluate(model, tok, [row], "cpu")
        assert (s["acc"], s["acc_norm"]) == (one["acc"], one["acc_norm_char"])
    ours = hellaswag.evaluate(model, tok, rows, "cpu")
    assert "num_cut" not in ours and ours["num_skipped"] == 0   # the same text scored, nothing cut to fit
    res = out["results"]["hs_nanogpt"]
    assert (res["acc,none"], res["acc_norm,none"]) == (pytest.approx(ours["acc"]), pytest.approx(ours["acc_norm_char"]))


@needs_lm_eval
def test_eval_bridge_equals_lm_eval_hf_on_the_exported_folder(exported, own_tok, tasks, offline):
    _, model, folder = exported["llama"]
    ours = _lm_eval(harness.HarnessLM(model, own_tok[1], batch_size=3), tasks, "hs_test")
    ref = _hf_lm_eval(folder, tasks, "hs_test")
    for key in ("acc,none", "acc_norm,none"):
        assert ours["results"]["hs_test"][key] == ref["results"]["hs_test"][key]
    for a, b in zip(*(sorted(r["samples"]["hs_test"], key=lambda s: s["doc_id"]) for r in (ours, ref))):
        assert a["arguments"] == b["arguments"]   # lm-eval's preprocessing of the shipped task reached both
        assert [r[0] for r in a["filtered_resps"]] == pytest.approx([r[0] for r in b["filtered_resps"]], abs=1e-4)
    context = next(s["arguments"] for s in ours["samples"]["hs_test"] if s["doc_id"] == 2)[0][0]
    assert context == "Cleaning a bike: How to clean a bike chain.. Put the bike on a stand. spray"   # lm-eval's text


class _Words:
    """A word-level stand-in tokenizer: " word" pieces, the space with the word (as GPT-2's), id 0 unused."""

    def __init__(self, words):
        self.ids = {w: i + 1 for i, w in enumerate(words)}
        self.vocab_size, self.eot_id = len(words) + 1, None

    def encode(self, text):
        return [self.ids[w] for w in re.findall(r" ?\S+", text)]


class _Unigram(torch.nn.Module):
    """Next-token log-probabilities that ignore the context."""

    def __init__(self, logp):
        super().__init__()
        self.logp, self.context_length = torch.nn.Parameter(logp), 16

    def forward(self, idx):
        return self.logp.expand(*idx.shape, -1)


@needs_lm_eval
def test_hellaswag_acc_norm_char_divides_by_the_endings_characters_as_lm_eval(tmp_path):
    # the 9-character label ending costs 9 nats (1 per character, 9 per token), "b" 1.05: per character picks the
    # label; per token, summed, or per character with the joining space (0.9 against 0.525) pick "b"
    tok = _Words(["The", " cat", " aaaaaaaaa", " b", " c", " d"])
    p = torch.tensor([0.0, 1e-3, 1e-3, *torch.tensor([9.0, 1.05, 10.0, 10.0]).neg().exp()])
    p[0] = 1 - p.sum()   # the rest of the mass on the unused id: the logits are exact log-probabilities
    model = _Unigram(p.log())
    row = dict(ind=0, ctx="The cat", endings=["aaaaaaaaa", "b", "c", "d"], label=0)
    r = hellaswag.evaluate(model, tok, [row], "cpu")
    assert (r["acc"], r["acc_norm"], r["acc_norm_char"]) == (0.0, 0.0, 1.0)
    _task(tmp_path, "hs_one", "validation", _hs_write_rows(tmp_path / "one.jsonl", [row]), **AS_HELLASWAG_PY)
    res = _lm_eval(harness.HarnessLM(model, tok), tmp_path, "hs_one")["results"]["hs_one"]
    assert (res["acc,none"], res["acc_norm,none"]) == (0.0, 1.0)


# LAMBADA passages: ordinary ones, and the case lm-eval's tokenisation decides: two spaces before the last word
LAMBADA_TEXTS = [
    "The children built a snowman out of snow. They gave it a carrot nose and two stones for eyes",
    "A woman bakes bread in the kitchen. She kneads the dough and puts it in the oven",
    '"Come in," she said, and smiled. He said  hello',
    "The man climbs down the ladder and sits on the roof.  Then he starts pulling up the roofing",
]


@needs_lm_eval
def test_lambada_py_scores_a_double_space_as_the_harness_does(exported, own_tok, tasks, offline):
    _, model, folder = exported["gpt2"]
    tok = own_tok[1]
    tokens, num_target, _ = lambada.render_example({"text": LAMBADA_TEXTS[2]}, tok)
    # the space left at the end of the context went to the target: it is predicted, then " hello"
    assert tok.decode(tokens[-num_target:]) == "  hello" and tok.decode(tokens[-num_target:][:1]) == " "
    lm = harness.HarnessLM(model, tok)
    for text in LAMBADA_TEXTS:   # lm-eval's own tokenisation of the task's (context, target)
        context, target = " ".join(text.split(" ")[:-1]), " " + text.split(" ")[-1]
        ctx_ids, tgt_ids = lm._encode_pair(context, target)
        assert lambada.render_example({"text": text}, tok) == (ctx_ids + tgt_ids, len(tgt_ids), False)
    ours = lambada.evaluate(model, tok, [{"text": t} for t in LAMBADA_TEXTS], "cpu")
    ref = _hf_lm_eval(folder, tasks, "lambada_test")["results"]["lambada_test"]
    assert ours["acc"] == ref["acc,none"] and ours["ppl"] == pytest.approx(ref["perplexity,none"], rel=1e-5)


# ---- eval.py: the other two request types, against lm-eval's HF backend


def _requests(kind, args):
    from lm_eval.api.instance import Instance
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def _hflm(folder):
    from lm_eval.models.huggingface import HFLM
    return HFLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=4)


@needs_lm_eval
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_eval_loglikelihood_rolling_equals_lm_eval_hf(tmp_path, monkeypatch, own_tok, offline, arch):
    tok_dir, tok = own_tok
    ckpt, model = _checkpoint(tmp_path / "ckpt.pt", arch, tok_dir, tok.vocab_size, context_length=32)
    _run(export, monkeypatch, "--ckpt", ckpt, "--out", tmp_path / "hf")
    docs = [(CORPUS,), (CORPUS[:40],), ("x",)]   # many windows of the context, one, a single token
    assert len(tok.encode(CORPUS)) > 4 * 32
    got = harness.HarnessLM(model, tok, batch_size=3).loglikelihood_rolling(
        _requests("loglikelihood_rolling", docs), disable_tqdm=True)
    want = _hflm(tmp_path / "hf").loglikelihood_rolling(_requests("loglikelihood_rolling", docs), disable_tqdm=True)
    assert got == pytest.approx(want, rel=1e-5)


@needs_lm_eval
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_eval_generate_until_equals_lm_eval_hf(exported, own_tok, offline, arch):
    lm = harness.HarnessLM(exported[arch][1], own_tok[1], batch_size=2)
    args = [("The children built a", {"until": ["."], "max_gen_toks": 20, "do_sample": False}),
            ("He said", {"until": ["\n", "and"], "max_gen_toks": 12}),
            ("A woman bakes bread in the kitchen. She", {"until": ["."], "max_gen_toks": 20, "do_sample": False})]
    got = lm.generate_until(_requests("generate_until", args), disable_tqdm=True)
    want = _hflm(exported[arch][2]).generate_until(_requests("generate_until", args), disable_tqdm=True)
    assert got == want and any(got)


# ---- eval.py: the command line


@needs_lm_eval
def test_eval_cli_prints_lm_evals_table_and_writes_its_json(tmp_path, monkeypatch, capsys, exported, tasks):
    ckpt = exported["gpt2"][0]
    _run(harness, monkeypatch, "--ckpt", ckpt, "--tasks", "hs_nanogpt", "--include_path", tasks, "--limit", 3,
         "--bootstrap_iters", 0, "--device", "cpu", "--output", tmp_path / "r.json")
    out = capsys.readouterr().out
    assert re.search(r"^\|hs_nanogpt *\|.*\|acc *\|", out, re.M)   # lm-eval's table
    assert out.splitlines()[-1] == f"results: {tmp_path / 'r.json'}"
    results = json.loads((tmp_path / "r.json").read_text())
    assert set(results["results"]["hs_nanogpt"]) >= {"acc,none", "acc_norm,none"} and "samples" not in results
    assert results["config"]["model_args"]["ckpt"] == str(ckpt)


@needs_lm_eval
def test_eval_a_continuation_longer_than_the_context_is_one_line_that_does_not_blame_the_hub(tmp_path, monkeypatch,
                                                                                             tasks):
    # HellaSwag's endings in bytes, a 16-byte context: lm-eval cannot skip a request, so the run stops, saying why
    # and nothing of the network (offline here)
    ckpt = _tiny_llama_ckpt(tmp_path, context_length=16)
    monkeypatch.setattr(M, "hub_reachable", lambda: (False, "no network here"))
    monkeypatch.setattr(harness, "offline_mode", lambda: None)
    message = _bad_exit(monkeypatch, harness, "--ckpt", ckpt, "--tasks", "hs_nanogpt", "--include_path", tasks,
                        "--limit", 2, "--bootstrap_iters", 0, "--device", "cpu", "--output", tmp_path / "r.json")
    _bad_says(message, "eval.py: --tasks hs_nanogpt: ", 16)
    assert "hub" not in message and "no network here" not in message


@needs_lm_eval
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux's /proc")
def test_eval_an_output_it_cannot_write_is_refused_before_the_evaluation(monkeypatch, exported):
    monkeypatch.setattr(harness, "load_model_and_tokenizer", _bpe_not_called)
    _one_line_naming(_bad_exit(monkeypatch, harness, "--ckpt", exported["gpt2"][0], "--tasks", "hs_nanogpt",
                               "--output", "/proc/r.json"), "eval.py: --output /proc/r.json")


@needs_lm_eval
def test_eval_default_output_is_beside_the_checkpoint(tmp_path, monkeypatch, capsys, exported, tasks):
    ckpt = tmp_path / "run" / "ckpt.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(Path(exported["gpt2"][0]).read_bytes())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # --device auto: the CPU here
    _run(harness, monkeypatch, "--ckpt", ckpt, "--tasks", "hs_nanogpt", "--include_path", tasks, "--limit", 1,
         "--bootstrap_iters", 0, "--device", "auto")
    assert (tmp_path / "run" / "ckpt_lm_eval.json").is_file()


@needs_lm_eval
def test_eval_unknown_task_is_lm_evals_message_in_one_line(monkeypatch, exported, tasks):
    monkeypatch.setattr(harness, "TaskManager", lambda include_path, include_defaults=True:
                        lm_eval.tasks.TaskManager(include_path=include_path, include_defaults=False))
    message = _bad_exit(monkeypatch, harness, "--ckpt", exported["gpt2"][0], "--tasks", "hellaswag_lokal",
                     "--device", "cpu")
    _one_line_naming(message, "eval.py: --tasks", "'hellaswag_lokal'", "not a registered task")


@needs_lm_eval
def test_eval_a_local_tasks_missing_data_is_one_line(tmp_path, monkeypatch, exported):
    _task(tmp_path, "hs_gone", "validation", tmp_path / "not_downloaded.jsonl",
          include=ROOT / "tasks" / "hellaswag_local.yaml")
    message = _bad_exit(monkeypatch, harness, "--ckpt", exported["gpt2"][0], "--tasks", "hs_gone", "--include_path",
                     tmp_path, "--device", "cpu")
    _one_line_naming(message, "eval.py: --tasks hs_gone", "not_downloaded.jsonl", "hellaswag.py")


@needs_lm_eval
def test_eval_offline_a_hub_task_fails_at_once_naming_the_local_tasks(tmp_path, monkeypatch, exported):
    # offline, huggingface_hub would retry each file for ~40 s: eval.py switches it and datasets to offline mode
    import datasets
    import huggingface_hub
    monkeypatch.setattr(M, "hub_reachable", lambda: (False, "probe faked"))
    (tmp_path / "hs_hub.yaml").write_text(json.dumps(dict(include=str(ROOT / "tasks" / "hellaswag_local.yaml"),
                                                          task="hs_hub", dataset_path="Rowan/hellaswag",
                                                          dataset_kwargs=None)), encoding="utf-8")
    message = _bad_exit(monkeypatch, harness, "--ckpt", exported["gpt2"][0], "--tasks", "hs_hub", "--include_path",
                        tmp_path, "--device", "cpu")
    _one_line_naming(message, "eval.py: --tasks hs_hub", "probe faked", "hellaswag_local")
    assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE


@needs_lm_eval
@pytest.mark.parametrize("argv, named", [(["--limit", "0"], "--limit"), (["--batch_size", "0"], "--batch_size"),
                                         (["--num_fewshot", "-1"], "--num_fewshot"), (["--tasks", ","], "--tasks"),
                                         (["--include_path", "/no/such/folder"], "/no/such/folder"),
                                         (["--init_from", "gpt2"], "not both")])
def test_eval_py_bad_flags_are_one_line_before_any_work(monkeypatch, argv, named):
    args = dict(zip(["--tasks", "--ckpt"], ["hs_nanogpt", "ckpt.pt"]))
    args.update(zip(argv[::2], argv[1::2]))
    _one_line_naming(_bad_exit(monkeypatch, harness, *[x for kv in args.items() for x in kv]), "eval.py: ", named)


@needs_lm_eval
def test_eval_a_tokenizer_that_does_not_match_is_refused(tmp_path, monkeypatch, exported):
    other_dir, other = _train_tokenizer(tmp_path, CORPUS, 300)   # another size
    message = _bad_exit(monkeypatch, harness, "--ckpt", exported["gpt2"][0], "--tasks", "hs_nanogpt",
                     "--tokenizer", other_dir, "--device", "cpu")
    _one_line_naming(message, "eval.py: --ckpt", other_dir, "300 tokens")


def test_eval_without_lm_eval_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)   # import lm_eval now fails, as when it is not installed
    spec = importlib.util.spec_from_file_location("eval_without_lm_eval", ROOT / "eval.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    message = _bad_exit(monkeypatch, script, "--ckpt", "ckpt.pt", "--tasks", "hellaswag")
    _one_line_naming(message, "eval.py: ", "lm-eval", "pip install -r requirements-eval.txt")


# ==== experiments.py: the sweeps and ablations: plans, reuse of finished logs, the report


# ---- stand-ins: results/ redirected, logs as `run` writes them, a tiny preset; results.md and `list` read back


@pytest.fixture
def _experiments_results(tmp_path, monkeypatch):
    """results/ and results/logs/ redirected into tmp_path/results (not made)."""
    monkeypatch.setattr(experiments, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(experiments, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(experiments, "LOGS", tmp_path / "results" / "logs")
    monkeypatch.setattr(experiments, "FLAGS", [], raising=False)
    return tmp_path / "results"


def _experiments_fake_log(path, name, groups=("ablation",), final=4.0, lr=3e-3, nan=False, steps=(5, 10), evals=None):
    """A log as `experiments.py run` leaves it in results/logs: the experiment record, train.py's config (10 steps),
    train records at steps (nan losses if nan) and evaluations at evals, (step, val loss) pairs: by default step 0's
    and the final one, val loss final at step 10."""
    evals = ((0, 7.6), (10, final)) if evals is None else evals
    rows = [dict(type="experiment", name=name, groups=list(groups), change=name, flags={"learning_rate": lr}, args=[],
                 wall=3.0),
            dict(type="config", batch_size=4, context_length=8, max_iters=10, learning_rate=lr, warmup_iters=1,
                 min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0, seed=1, num_threads=1, eval_iters=2,
                 model_config=dict(num_layers=1, d_model=8, num_heads=2, d_ff=16, context_length=8))]
    rows += [dict(type="train", step=s, loss=float("nan") if nan else 5.0 - s / 10, lr=lr, tokens_per_sec=100.0,
                  elapsed=s * 1.0, tokens=s * 32) for s in steps]
    rows += [dict(type="eval", step=s, val_loss=v, val_bpb=v / math.log(2) / 3.6, elapsed=s * 1.0) for s, v in evals]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _experiments_logs(results, *runs):
    """A finished fake log in results/logs for each (name, groups, final val loss[, lr])."""
    for name, groups, final, *lr in runs:
        _experiments_fake_log(results / "logs" / f"{name}.jsonl", name, groups, final, *lr)


@pytest.fixture
def _experiments_tiny_preset(tmp_path, monkeypatch):
    """A preset small enough for a train.py run of a few seconds, on generated stories in tmp_path."""
    p = dict(experiments.PRESETS["cpu"], train_text=_bpe_corpus(tmp_path / "train.txt", 80, 1),
             val_text=_bpe_corpus(tmp_path / "val.txt", 20, 2), vocab_size=300, lrs=[1e-2], batch_sizes=[8],
             extra_batch_sizes=[], eval_tokens=64, ablation_lr=None,
             base=dict(context_length=16, d_model=16, num_layers=1, num_heads=2, d_ff=0, batch_size=4,
                       learning_rate=1e-3, min_lr_ratio=0.1, warmup_iters=1, max_iters=2, weight_decay=0.1,
                       grad_clip=1.0, sampler="random", eval_interval=100, num_threads=1))
    monkeypatch.setitem(experiments.PRESETS, "tiny", p)
    return "tiny"


def _experiments_tag(path):
    return str(path).replace("/", "-")   # an absolute path outside the repository: /tmp/x/mine -> -tmp-x-mine


def _experiments_tables(md):
    """results.md read back: {section title: [{column title: cell} for each row of the section's table]}."""
    tables = {}
    for section in md.split("\n## ")[1:]:
        title, *lines = section.split("\n")
        cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
        if cells:
            tables[title] = [dict(zip(cells[0], row)) for row in cells[2:]]   # (cells[1] is the |---| line)
    return tables


def _experiments_row(table, run):
    (row,) = [r for r in table if r["run"] == run]
    return row


def _experiments_listed(out):
    """The train.py command lines `experiments.py list` printed, each split as a shell would split it."""
    return [shlex.split(line.split("python train.py ", 1)[1]) for line in out.splitlines()
            if "python train.py " in line]


# ---- experiments.py: the plan: which runs, with which train.py flags


@pytest.mark.parametrize("preset", sorted(experiments.PRESETS))
def test_experiments_plan_has_the_sweeps_and_ablations_on_equal_validation_tokens(preset):
    # a baseline, >= 5 lrs, 3 batch sizes, 4 ablations, a time-budget run; one validation text, equal training tokens
    runs = experiments.plan(preset)
    names = [r["name"] for r in runs]
    assert names[0] == "baseline" and len(names) == len(set(names))
    groups = lambda g: [r for r in runs if g in r["groups"]]
    assert len({r["flags"]["learning_rate"] for r in groups("lr")}) >= 5
    assert len({r["flags"]["batch_size"] for r in groups("batch")}) >= 3
    ablations = {r["name"]: r["flags"] for r in groups("ablation")}
    assert ablations["nope"]["remove_rope"] and ablations["post_norm"]["use_post_norm"]
    assert ablations["no_rmsnorm"]["remove_rmsnorm"]
    assert ablations["silu_ffn"]["ffn_type"] == "silu"
    assert ablations["silu_ffn"]["d_ff"] == 4 * ablations["baseline"]["d_model"]
    assert any(r["flags"]["time_budget"] for r in groups("time"))
    base = runs[0]["flags"]
    for r in runs:
        f = r["flags"]
        # the same scored validation tokens everywhere (train.py scores the first eval_iters*B*T tokens)
        assert f["eval_iters"] * f["batch_size"] == base["eval_iters"] * base["batch_size"]
        if "batch" in r["groups"]:   # equal tokens across batch sizes
            assert f["max_iters"] * f["batch_size"] == base["max_iters"] * base["batch_size"]


@pytest.mark.parametrize("preset, lr0, want", [("cpu", 3e-3, {16: 2.1e-3, 64: 4.2e-3, 128: 6e-3}),
                                               ("cs336", 1e-3, {64: 1.4e-3, 128: 2e-3, 256: 2.8e-3})])
def test_experiments_batch_runs_scale_the_lr_by_the_sqrt_of_the_batch(preset, lr0, want):
    runs = {r["name"]: r["flags"] for r in experiments.plan(preset)}
    assert runs["baseline"]["learning_rate"] == lr0 and runs["baseline"]["batch_size"] == 32
    for B, lr in want.items():  # lr0 * sqrt(B / 32), two significant digits
        assert runs[f"batch_{B}"]["learning_rate"] == lr
        if f"batch_{B}_lr0" in runs:
            assert runs[f"batch_{B}_lr0"]["learning_rate"] == lr0


def test_experiments_time_budget_and_batch_runs_keep_their_schedule_fractions():
    runs = {r["name"]: r["flags"] for r in experiments.plan("cpu")}
    base, t = runs["baseline"], runs["time_budget"]
    # the clock ends the time-budget run, so its max_iters lies beyond what it can reach; the warmup keeps its share
    assert t["time_budget"] and base["time_budget"] == "" and t["max_iters"] > base["max_iters"]
    assert t["warmup_iters"] / t["max_iters"] == base["warmup_iters"] / base["max_iters"]
    for B in (16, 64, 128):   # evaluations at the same token counts as the baseline's
        f = runs[f"batch_{B}"]
        assert f["eval_interval"] * B == base["eval_interval"] * base["batch_size"], B
        assert f["warmup_iters"] * B == base["warmup_iters"] * base["batch_size"], B


def test_experiments_steps_scale_the_time_budget_runs_clock_too():
    # --steps: the clock-limited run gets the same share of its budget (2.5m at 200), and its label says so
    assert experiments.plan("cpu")[0]["flags"]["max_iters"] == 200
    for steps, budget in [(None, "2.5m"), (50, "37.5s"), (400, "300s")]:
        t = next(r for r in experiments.plan("cpu", steps) if r["name"] == "time_budget")
        assert t["flags"]["time_budget"] == budget and budget in t["change"]


def test_experiments_flags_parse_in_train_py():
    # every run's command line is valid train.py syntax and sets what the plan says
    for r in experiments.plan("cpu", steps=7):
        cfg, _ = train.get_config(experiments.train_args(r["flags"], "d", "o"))
        for k, v in r["flags"].items():
            assert cfg[k] == v or str(cfg[k]) == str(v), (r["name"], k, cfg[k], v)
        assert cfg["fresh"] is True and cfg["num_samples"] == 0
    assert experiments.plan("cpu", steps=7)[0]["flags"]["max_iters"] == 7


# ---- experiments.py: step 1, the data: a tokenizer and token files made once, and the figures the report quotes


def test_experiments_prepare_data_starts_over_when_the_presets_text_changed(tmp_path, _experiments_results,
                                                                             _experiments_tiny_preset):
    # an edited preset (another train_text) gets a tokenizer trained on it and its own tokens, not the old ones
    scratch = tmp_path / "scratch"
    d = experiments.prepare_data(_experiments_tiny_preset, scratch, log=lambda *a: None)
    first = (d / "train.bin").read_bytes(), (scratch / "tokenizer-300" / "merges.txt").read_bytes()
    assert experiments.prepare_data(_experiments_tiny_preset, scratch, log=lambda *a: None) == d   # unchanged: reused
    assert ((d / "train.bin").read_bytes(), (scratch / "tokenizer-300" / "merges.txt").read_bytes()) == first
    experiments.PRESETS[_experiments_tiny_preset]["train_text"] = _bpe_corpus(tmp_path / "other.txt", 120, 7)
    said = []
    experiments.prepare_data(_experiments_tiny_preset, scratch, log=said.append)
    _bad_says(said[0], "data: ", scratch)   # says which data it makes again
    assert (scratch / "tokenizer-300" / "merges.txt").read_bytes() != first[1]
    assert (d / "train.bin").read_bytes() != first[0]
    setup = json.loads((_experiments_results / "setup.json").read_text())
    assert (setup["train_text"], setup["train_tokens"]) == ("other.txt", (d / "train.bin").stat().st_size // 2)
    # a token file of an earlier tokenizer of the folder (another fingerprint) is encoded again
    side = d / "val.bin.json"
    side.write_text(json.dumps(dict(json.loads(side.read_text()), tokenizer_fingerprint="stale")))
    experiments.prepare_data(_experiments_tiny_preset, scratch, log=lambda *a: None)
    assert json.loads(side.read_text())["tokenizer_fingerprint"] == bpe.tokenizer_fingerprint(scratch / "tokenizer-300")


def test_experiments_prepare_data_starts_over_for_another_text_of_the_same_name_and_size(
        tmp_path, _experiments_results, _experiments_tiny_preset):
    # --train=v2/train.txt after --train=v1/train.txt, both cut to one size (or a text edited in place, its size
    # kept): its own tokenizer and tokens, not v1's reused in silence
    scratch, p = tmp_path / "scratch", experiments.PRESETS[_experiments_tiny_preset]
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    v1, v2 = _bpe_corpus(tmp_path / "v1" / "train.txt", 80, 1), tmp_path / "v2" / "train.txt"
    v2.write_text(v1.read_text(encoding="utf-8").swapcase(), encoding="utf-8")   # same size, other text
    d = experiments.prepare_data(_experiments_tiny_preset, scratch, log=lambda *a: None, texts=(v1, p["val_text"]))
    first = (d / "train.bin").read_bytes()
    said = []
    experiments.prepare_data(_experiments_tiny_preset, scratch, log=said.append, texts=(v2, p["val_text"]))
    _bad_says(said[0], "data: ", scratch)
    assert (d / "train.bin").read_bytes() != first


def test_experiments_cpu_text_is_the_fetched_tinystories_head_unless_given(tmp_path, _experiments_results,
                                                                           _experiments_tiny_preset, monkeypatch):
    # the preset's text: fineweb.tinystories_head's files (fetched once under data/); --train / --valid win
    head = experiments.PRESETS[_experiments_tiny_preset]
    monkeypatch.setattr(fineweb, "tinystories_head", lambda log=print: (head["train_text"], head["val_text"]))
    monkeypatch.setitem(experiments.PRESETS, "tiny", dict(head, train_text=None, val_text=None))
    experiments.prepare_data("tiny", tmp_path / "s", log=lambda *a: None)
    setup = json.loads((_experiments_results / "setup.json").read_text())
    assert (setup["train_text"], setup["val_text"]) == ("train.txt", "val.txt")
    other = _bpe_corpus(tmp_path / "other.txt", 60, 9)
    experiments.prepare_data("tiny", tmp_path / "s", log=lambda *a: None, texts=(other, head["val_text"]))
    assert json.loads((_experiments_results / "setup.json").read_text())["train_text"] == "other.txt"


def test_experiments_unigram_loss_is_train_frequencies_scored_on_val(tmp_path, _experiments_results):
    d = tmp_path / "data"
    d.mkdir()
    np.array([0, 0, 0, 1], dtype="<u2").tofile(d / "train.bin")
    np.array([1, 2], dtype="<u2").tofile(d / "val.bin")
    (tmp_path / "train.txt").write_text("abcdefgh")
    (tmp_path / "val.txt").write_text("ijkl")
    p = dict(vocab_size=4, train_text=tmp_path / "train.txt", val_text=tmp_path / "val.txt")
    meta = {"train": {"num_tokens": 4, "num_docs": 1}, "val": {"num_tokens": 2, "num_docs": 1}}
    experiments.write_setup("cpu", d, "tok", meta, p)
    setup = json.loads((_experiments_results / "setup.json").read_text())
    # add-one smoothed train counts [4, 2, 1, 1] of 8: val token 1 costs log(8/2), token 2 log(8/1)
    assert setup["unigram_val_loss"] == pytest.approx((math.log(4) + math.log(8)) / 2)
    assert (setup["train_tokens"], setup["val_tokens"], setup["rare_tokens"]) == (4, 2, 4)
    assert (setup["train_bytes"], setup["val_bytes"]) == (8, 4)


# ---- experiments.py: step 2, the runs: a finished log on the same flags and data is reused, nothing else


def test_experiments_a_time_budget_run_is_finished_before_max_iters():
    def rows(time_budget):
        return [dict(type="config", max_iters=1000, time_budget=time_budget),
                dict(type="train", step=37, loss=2.0, lr=3e-4, tokens_per_sec=100.0, elapsed=150.0, tokens=37 * 4096),
                dict(type="eval", step=37, val_loss=2.1, val_bpb=0.8, elapsed=150.0)]
    assert experiments.finished(experiments.summarize(rows("2.5m")))      # stopped by the clock: done
    assert not experiments.finished(experiments.summarize(rows("")))      # stopped at 37 of 1000 steps: cut short
    assert not experiments.finished(experiments.summarize(rows("2.5m")[:2]))   # no validation loss: nothing to report


def test_experiments_run_one_reuses_only_a_finished_log_with_the_same_flags_and_data(tmp_path, _experiments_results,
                                                                                      monkeypatch):
    class Trained(Exception):
        pass

    def popen(*a, **k):
        raise Trained
    monkeypatch.setattr(experiments.subprocess, "Popen", popen)
    run = experiments.plan("cpu")[0]
    data, scratch = tmp_path / "data", tmp_path / "scratch"
    data.mkdir()
    _train_write_tokens(data / "train.bin", _train_docs(300, 0), 64)
    args = [str(a) for a in experiments.train_args(run["flags"], data, scratch / "runs" / "baseline")]
    dest = _experiments_results / "logs" / "baseline.jsonl"
    dest.parent.mkdir(parents=True)

    def write(args, last_eval, **data_record):
        rows = [dict(type="experiment", name="baseline", groups=run["groups"], change="baseline", flags=run["flags"],
                     args=args, wall=3.0, **data_record),
                dict(type="config", max_iters=200, time_budget=""),
                dict(type="train", step=200, loss=2.0, lr=3e-4, tokens_per_sec=100.0, elapsed=9.0, tokens=819200),
                dict(type="eval", step=last_eval, val_loss=2.1, val_bpb=0.8, elapsed=9.0)]
        dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    now = experiments.data_stamp(data)
    assert now == {"train.bin": [(data / "train.bin").stat().st_size, 64, None]}
    write(args, 200, data=now)   # a finished log of this very run on this very data: reused
    assert experiments.run_one(run, "cpu", data, scratch, log=lambda *a: None) == dest
    for other_args, last_eval, record in [([*args[:-1], "--seed=7"], 200, {"data": now}), (args, 100, {"data": now}),
                                          (args, 200, {})]:
        write(other_args, last_eval, **record)   # other flags, a log short of max_iters, no data record: again
        with pytest.raises(Trained):
            experiments.run_one(run, "cpu", data, scratch, log=lambda *a: None)
    write(args, 200, data=now)   # --rerun: trained again even though the log matches
    with pytest.raises(Trained):
        experiments.run_one(run, "cpu", data, scratch, rerun=True, log=lambda *a: None)
    write(args, 200, data=now)
    _train_write_tokens(data / "train.bin", _train_docs(200, 0), 64)   # the same name, other tokens: trained again
    with pytest.raises(Trained):
        experiments.run_one(run, "cpu", data, scratch, log=lambda *a: None)
    # the same file sizes under a retrained tokenizer (another fingerprint): trained again
    side = data / "train.bin.json"
    side.write_text(json.dumps(dict(json.loads(side.read_text()), tokenizer_fingerprint="aaaa")))
    write(args, 200, data=experiments.data_stamp(data))
    assert experiments.run_one(run, "cpu", data, scratch, log=lambda *a: None) == dest
    side.write_text(json.dumps(dict(json.loads(side.read_text()), tokenizer_fingerprint="bbbb")))
    with pytest.raises(Trained):
        experiments.run_one(run, "cpu", data, scratch, log=lambda *a: None)


# ---- experiments.py: step 3, samples: from the best finished run, and only from the checkpoint its log describes


def test_experiments_best_run_skips_a_divergent_run_listed_first(_experiments_results):
    logs = _experiments_results / "logs"
    _experiments_fake_log(logs / "lr_1e+00.jsonl", "lr_1e+00", ["lr"], float("nan"), lr=1.0, nan=True)
    _experiments_fake_log(logs / "lr_3e-02.jsonl", "lr_3e-02", ["lr"], float("inf"), lr=0.03)
    _experiments_logs(_experiments_results, ("baseline", ["lr"], 4.0), ("nope", ["ablation"], 4.25))
    names = ["lr_1e+00", "lr_3e-02", "baseline", "nope"]
    for order in (names, names[::-1]):
        assert experiments.best_run([dict(name=n) for n in order]) == ("baseline", 4.0)


def test_experiments_samples_only_from_the_checkpoint_its_log_describes(tmp_path, _experiments_results):
    # the best run's ckpt.pt must be the logged run (final step and val loss), not one left by another run
    _experiments_logs(_experiments_results, ("nope", ["ablation"], 4.0), ("baseline", ["ablation"], 4.5))
    runs = [dict(name="baseline"), dict(name="nope")]
    scratch = tmp_path / "runs"
    for name, iteration, val_loss in [("nope", 3, 6.1), ("baseline", 10, 4.5)]:  # nope's is stale
        (scratch / name).mkdir(parents=True)
        torch.save({"iteration": iteration, "val_loss": val_loss}, scratch / name / "ckpt.pt")
    assert experiments.best_run(runs) == ("nope", 4.0)
    assert experiments.best_run(runs, require_ckpt_in=scratch) == ("baseline", 4.5)
    torch.save({"iteration": 10, "val_loss": 4.0}, scratch / "nope" / "ckpt.pt")
    assert experiments.best_run(runs, require_ckpt_in=scratch) == ("nope", 4.0)


def test_experiments_samples_refuse_a_checkpoint_matching_only_step_or_only_loss(tmp_path, _experiments_results,
                                                                                 monkeypatch):
    _experiments_logs(_experiments_results, ("nope", ["ablation"], 4.0))
    scratch = tmp_path / "runs"
    (scratch / "nope").mkdir(parents=True)
    runs = [dict(name="nope")]
    for iteration, val_loss in [(10, 4.2), (7, 4.0)]:  # the same step on other data; another step, same loss
        torch.save({"iteration": iteration, "val_loss": val_loss}, scratch / "nope" / "ckpt.pt")
        assert experiments.best_run(runs, require_ckpt_in=scratch) is None
    torch.save({"iteration": 10, "val_loss": 4.0}, scratch / "nope" / "ckpt.pt")
    assert experiments.best_run(runs, require_ckpt_in=scratch) == ("nope", 4.0)
    # and write_samples asks for that match: sample.py runs on the matching checkpoint of --scratch's runs/ ...
    ran, said = [], []
    monkeypatch.setattr(experiments.subprocess, "run", lambda cmd, **k: ran.append(cmd) or types.SimpleNamespace(
        returncode=0, stdout="", stderr=""))
    experiments.write_samples(runs, tmp_path, log=said.append)
    assert [a for cmd in ran for a in cmd if a.startswith("--ckpt=")] == [
        f"--ckpt={experiments._rel(scratch / 'nope' / 'ckpt.pt')}"]
    (scratch / "nope" / "ckpt.pt").write_bytes(b"garbage")   # unreadable: not the checkpoint the log describes
    assert experiments.best_run(runs, require_ckpt_in=scratch) is None
    # ... and not from the unreadable one, one line saying so
    ran.clear()
    said.clear()
    experiments.write_samples(runs, tmp_path, log=said.append)
    (note,) = said
    assert ran == []
    _bad_says(note, "samples: ", "skipped")
    (scratch / "nope" / "ckpt.pt").unlink()   # none at all (deleted, or never written by this --scratch)
    assert experiments.best_run(runs, require_ckpt_in=scratch) is None


# ---- experiments.py: the report: each log summarized, results.md grouped as the plan groups, from the logs alone


def test_experiments_summary_reports_the_median_tokens_per_second_and_the_last_eval():
    # the median tokens/s (not the last step's nor the fastest), and the last evaluation (not the best)
    rows = [dict(type="train", step=s, loss=5.0, lr=1e-3, tokens_per_sec=v, elapsed=float(s), tokens=32 * s)
            for s, v in enumerate([None, 120.0, 100.0, 400.0, 110.0, 90.0], 1)]
    rows += [dict(type="eval", step=s, val_loss=v, val_bpb=b, elapsed=float(s))
             for s, v, b in ((0, 7.6, 3.0), (5, 4.0, 1.6), (6, 4.3, 1.7))]
    s = experiments.summarize(rows)
    assert s["tok_s"] == 110.0   # of 90, 100, 110, 120, 400
    assert (s["step"], s["val_loss"], s["val_bpb"], s["tokens"], s["final_train_loss"]) == (6, 4.3, 1.7, 192, 5.0)


def test_experiments_time_budget_run_counts_the_steps_after_its_last_train_record(tmp_path):
    # stopped by the clock at step 12, train records every 5 steps: the final evaluation's tokens and time count
    path = tmp_path / "t.jsonl"
    _experiments_fake_log(path, "time_budget", ["time"], 4.0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[-1].update(step=12, elapsed=12.4)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = experiments.summarize(experiments.read_log(path))
    assert (r["step"], r["tokens"], r["train_time"]) == (12, 12 * 32, 12.4)


def test_experiments_report_from_logs_alone(_experiments_results):
    results = _experiments_results
    _experiments_logs(results, ("baseline", ["lr", "ablation"], 4.0), ("nope", ["ablation"], 4.25))
    _experiments_fake_log(results / "logs" / "lr_1e-1.jsonl", "lr_1e-1", ["lr"], float("nan"), lr=0.1, nan=True)
    experiments.report(log=lambda *a: None)
    tables = _experiments_tables((results / "results.md").read_text())
    assert _experiments_row(tables["Ablations"], "nope")["Δ vs baseline"] == "+0.2500"
    # a divergent run is reported, not dropped
    assert _experiments_row(tables["Learning-rate sweep"], "lr_1e-1")["val loss"] == "nan"
    assert (results / "ablation.png").stat().st_size > 0 and (results / "lr.png").stat().st_size > 0


def test_experiments_report_orders_the_sweep_by_lr_and_takes_ablation_lr_deltas_against_that_lr(
        _experiments_results):
    # the lr table from the smallest lr up; ablations compared with the run at the sweep's best lr, not the baseline;
    # a train.py log without the experiment record is skipped with a note naming it
    results = _experiments_results
    _experiments_logs(results, ("baseline", ["lr", "ablation"], 4.0, 3e-3), ("lr_1e-1", ["lr"], 4.5, 1e-1),
                      ("lr_3e-4", ["lr"], 4.4, 3e-4), ("lr_1e-2", ["lr"], 3.8, 1e-2),
                      ("nope_lr_1e-2", ["ablation_lr"], 3.9, 1e-2), ("plain", ["lr"], 3.0))
    plain = results / "logs" / "plain.jsonl"
    plain.write_text("\n".join(plain.read_text().splitlines()[1:]) + "\n")   # no experiment record
    said = []
    experiments.report(log=said.append)
    (note,) = [s for s in said if "plain.jsonl" in s]
    _bad_says(note, "experiments.py: report: ", experiments._rel(plain), "experiment record")
    tables = _experiments_tables((results / "results.md").read_text())
    assert [r["run"] for r in tables["Learning-rate sweep"]] == ["lr_3e-4", "baseline", "lr_1e-2", "lr_1e-1"]
    nope = _experiments_row(tables["Ablations at the sweep's best learning rate"], "nope_lr_1e-2")
    assert nope["Δ vs lr_1e-2"] == "+0.1000"   # 3.9 - 3.8, not 3.9 - 4.0 (the baseline)


def test_experiments_report_groups_runs_as_the_presets_plan_does(_experiments_results):
    # nope's log records a stale grouping (lr): the plan's (ablation) wins; `report --preset=cs336` groups as the
    # cs336 plan does (no ablations at the best lr there), not as the cpu plan
    _experiments_logs(_experiments_results, ("baseline", ["lr"], 4.0), ("nope", ["lr"], 4.25),
                      ("lr_1e-2", ["lr", "ablation_lr"], 3.9, 1e-2))
    for preset in ("cpu", "cs336"):
        experiments.report(preset, log=lambda *a: None)
        tables = _experiments_tables((_experiments_results / "results.md").read_text())
        assert ("Ablations at the sweep's best learning rate" in tables) == (preset == "cpu"), preset
        assert [r["run"] for r in tables["Ablations"]] == ["baseline", "nope"]
        assert [r["run"] for r in tables["Learning-rate sweep"]] == ["baseline", "lr_1e-2"]


def test_experiments_report_skips_incomplete_and_broken_logs_with_a_note(_experiments_results):
    # each log it cannot report is one line naming the file and why; the finished runs are reported
    results, logs = _experiments_results, _experiments_results / "logs"
    _experiments_fake_log(logs / "baseline.jsonl", "baseline", steps=(), evals=((0, 7.69),))   # stopped before step 1
    _experiments_fake_log(logs / "post_norm.jsonl", "post_norm", evals=())                    # never evaluated
    _experiments_fake_log(logs / "nope.jsonl", "nope")
    _experiments_fake_log(logs / "lr_1e-2.jsonl", "lr_1e-2", evals=((0, 7.6), (5, 5.0)))     # cut short
    (logs / "silu_ffn.jsonl").write_text('{"type": "train", "step": 1\nnot json\n')
    (logs / "lr_3e-3.jsonl").write_text('{"type": "experiment"}\n[1, 2]\n')
    (logs / "folder.jsonl").mkdir()
    (results / "setup.json").write_text('{"preset": "foo"}')
    said = []
    experiments.report(log=said.append)
    assert all("\n" not in s for s in said) and not [s for s in said if "nope.jsonl" in s]
    for name, why in [("baseline", "incomplete"), ("post_norm", "incomplete"), ("lr_1e-2", "incomplete"),
                      ("silu_ffn", "JSON"), ("lr_3e-3", "JSON"), ("folder", "JSON")]:
        (note,) = [s for s in said if f"{name}.jsonl" in s]
        _bad_says(note, "experiments.py: report: ", experiments._rel(logs / f"{name}.jsonl"), why)
    (note,) = [s for s in said if "setup.json" in s]   # unreadable figures are left out, with a note
    _bad_says(note, "experiments.py: report: ", experiments._rel(results / "setup.json"))
    tables = _experiments_tables((results / "results.md").read_text())
    assert {r["run"] for table in tables.values() for r in table} == {"nope"}
    # a copy of a log under another name: the run reported once, from experiments.py's file; a note names both
    for copy in ("nope-copy.jsonl", "zz.jsonl"):
        _experiments_fake_log(logs / copy, "nope", final=9.0)
        said.clear()
        experiments.report(log=said.append)
        (note,) = [s for s in said if copy in s]
        _bad_says(note, f"experiments.py: report: skipping {experiments._rel(logs / copy)}: ", "'nope'",
                  experiments._rel(logs / "nope.jsonl"))
        tables = _experiments_tables((results / "results.md").read_text())
        assert [(r["run"], r["val loss"]) for table in tables.values() for r in table] == [("nope", "4.0000")]
        (logs / copy).unlink()


def test_experiments_report_leaves_out_runs_on_other_data_with_a_note(_experiments_results):
    # a fresh clone's `run --only=baseline,nope` on its own text beside our logs of the team's text: one table never
    # compares the two; the data is the one setup.json describes (the last `run`'s), else the latest run's
    results, logs = _experiments_results, _experiments_results / "logs"
    _experiments_logs(results, ("baseline", ["ablation"], 4.0), ("nope", ["ablation"], 4.25),
                      ("silu_ffn", ["ablation"], 3.0))
    new, old = {"train.bin": [10, 300, "aaaa"]}, {"train.bin": [12, 300, "bbbb"]}
    for name, data, finished in [("baseline", new, "2025-02-02"), ("nope", new, "2025-02-03"),
                                 ("silu_ffn", old, "2025-01-01")]:
        rows = experiments.read_log(logs / f"{name}.jsonl")
        rows[0].update(data=data, finished=finished)
        (logs / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    setup = dict(preset="cpu", train_text="t.txt", train_bytes=40, train_tokens=10, val_text="v.txt", val_bytes=8,
                 val_tokens=2, vocab_size=300, unigram_val_loss=5.0)
    for setup_data, reported, left_out in [(None, ["baseline", "nope"], "silu_ffn"),
                                           (old, ["silu_ffn"], "baseline,nope")]:
        if setup_data:
            (results / "setup.json").write_text(json.dumps(dict(setup, data=setup_data)))
        said = []
        experiments.report(log=said.append)
        (note,) = [s for s in said if "other data" in s]
        _bad_says(note, "experiments.py: report: ", f"--only={left_out}")
        tables = _experiments_tables((results / "results.md").read_text())
        assert [r["run"] for r in tables["Ablations"]] == reported


def test_experiments_report_without_matplotlib_writes_the_tables_and_says_so(_experiments_results, monkeypatch):
    # without matplotlib, `report` writes results.md without the plots and says how to get them
    _experiments_logs(_experiments_results, ("baseline", ["lr", "ablation"], 4.0), ("nope", ["ablation"], 4.25))
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    said = []
    experiments.report(log=said.append)
    md = (_experiments_results / "results.md").read_text()
    assert _experiments_row(_experiments_tables(md)["Ablations"], "nope")["Δ vs baseline"] == "+0.2500"
    assert ".png" not in md and not list(_experiments_results.glob("*.png"))
    assert "\n" not in said[-1] and "pip install matplotlib" in said[-1]


# ---- experiments.py: the command line: where each set of runs reports, `list`, `run`, its mistakes


def test_experiments_results_folder_per_preset_and_data(tmp_path, _experiments_results, capsys):
    # the cpu preset on its own data reports in results/, any other preset or --data_dir in a folder of its own
    results, mine = _experiments_results, tmp_path / "mine"
    for argv, want in [(["list", "--preset=cs336"], results / "cs336"),
                       (["list", "--preset=cs336"], results / "cs336"),
                       (["list", f"--data_dir={mine}"], results / f"cpu{_experiments_tag(mine)}"),
                       (["list", f"--data_dir={tmp_path / 'b' / 'mine'}"],   # another folder of that name: another
                        results / f"cpu{_experiments_tag(tmp_path / 'b' / 'mine')}"),   # report
                       (["list", "--data_dir=data/mine"], results / "cpu-data-mine"),   # inside the repository
                       (["list"], results)]:
        experiments.main(argv)
        assert (experiments.RESULTS, experiments.LOGS) == (want, want / "logs")


def test_experiments_steps_report_in_their_own_folder_with_the_schedule_scaled(_experiments_results, capsys):
    # another step count never shares a table with the preset's runs; its warmup and evaluations keep their fractions
    experiments.main(["list", "--steps=50", "--only=baseline,nope"])
    want = _experiments_results / "cpu-50steps"
    assert (experiments.RESULTS, experiments.LOGS) == (want, want / "logs")
    listed = _experiments_listed(capsys.readouterr().out)
    assert len(listed) == 2 and "--out_dir=data/experiments/cpu-50steps/runs/nope" in listed[1]
    base = experiments.plan("cpu")[0]["flags"]
    small = experiments.plan("cpu", 50)[0]["flags"]
    assert (small["max_iters"], small["warmup_iters"], small["eval_interval"]) == (
        50, base["warmup_iters"] * 50 // base["max_iters"], base["eval_interval"] * 50 // base["max_iters"])


def test_experiments_a_results_folders_messages_and_report_carry_its_flags(tmp_path, _experiments_results, capsys,
                                                                           monkeypatch):
    # another preset, --data_dir or --steps has its own results folder: the commands its messages and results.md quote
    # carry those flags (a bare `python experiments.py run` trains the cpu preset into results/), the files it names
    # are its own, and a --data_dir without token files is named as such
    message = _exits(experiments.main, ["report", "--preset=cs336"])
    _bad_says(message, "experiments.py: ", "`python experiments.py run --preset=cs336`")
    none = tmp_path / "none"
    message = _exits(experiments.main, ["run", f"--data_dir={none}", "--no_samples", f"--scratch={tmp_path / 's'}"])
    _bad_says(message, f"experiments.py: --data_dir {none}: ", "train*.bin")
    results = _experiments_results / "cpu-50steps"
    _experiments_logs(results, ("baseline", ["lr"], 4.0))
    experiments.main(["report", "--steps=50"])
    md = (results / "results.md").read_text()
    assert f"`python experiments.py report --steps=50` from `{experiments._rel(results / 'logs')}/*.jsonl`" in md
    scratch = tmp_path / "s"
    (scratch / "runs" / "baseline").mkdir(parents=True)
    torch.save({"iteration": 10, "val_loss": 4.0}, scratch / "runs" / "baseline" / "ckpt.pt")
    monkeypatch.setattr(experiments.subprocess, "run", lambda cmd, **k: subprocess.CompletedProcess(cmd, 0, "Once", ""))
    said = []
    experiments.write_samples([dict(name="baseline")], scratch, log=said.append)
    _bad_says(said[-1], "samples: ", experiments._rel(results / "samples.txt"))
    assert (results / "samples.txt").is_file() and not (_experiments_results / "samples.txt").exists()


def test_experiments_list_prints_the_commands_run_would_give(tmp_path, _experiments_results, capsys):
    # real folders, not placeholders: the data folder and each run's out_dir, as run_one passes them to train.py
    experiments.main(["list"])
    listed = _experiments_listed(capsys.readouterr().out)
    assert {"--data_dir=data/experiments/cpu/data", "--prepare_data=false",
            "--out_dir=data/experiments/cpu/runs/baseline", "--fresh"} <= set(listed[0])
    assert not [arg for args in listed for arg in args if "<" in arg]
    experiments.main(["list", f"--data_dir={tmp_path / 'my data'}"])   # commands that paste into a shell
    assert {f"--data_dir={tmp_path / 'my data'}", "--prepare_data=false",
            f"--out_dir=data/experiments/cpu{_experiments_tag(tmp_path / 'my data')}/runs/nope", "--fresh"} <= set(
        _experiments_listed(capsys.readouterr().out)[1])


def test_experiments_run_selection_only_in_the_order_given_and_extras_with_all(tmp_path, _experiments_results,
                                                                               monkeypatch, capsys):
    extras = {"batch_128", "batch_16_lr0", "batch_64_lr0", "baseline_seed2", "nope_lr_1e-2", "post_norm_lr_1e-2",
              "no_rmsnorm_lr_1e-2", "silu_ffn_lr_1e-2"}
    runs = experiments.plan("cpu")
    assert {r["name"] for r in runs if r.get("extra")} == extras
    ran = []
    monkeypatch.setattr(experiments, "prepare_data", lambda *a, **k: tmp_path)
    monkeypatch.setattr(experiments, "run_one", lambda r, *a, **k: ran.append(r["name"]))
    monkeypatch.setattr(experiments, "report", lambda *a, **k: None)
    for argv, want in [(["run"], [r["name"] for r in runs if r["name"] not in extras]),
                       (["run", "--all"], [r["name"] for r in runs]),
                       (["run", "--only=silu_ffn,baseline,batch_128"], ["silu_ffn", "baseline", "batch_128"])]:
        ran.clear()
        experiments.main(argv + ["--no_samples"])
        assert ran == want, argv
    capsys.readouterr()
    experiments.main(["list", "--only=nope,baseline"])
    out = capsys.readouterr().out
    assert out.index("nope ") < out.index("baseline ")


def test_experiments_absolute_scratch_outside_the_repo(tmp_path, _experiments_results, _experiments_tiny_preset,
                                                       capsys):
    # `run` on a tiny preset: data, checkpoints and consoles in --scratch, the log and report in its results folder
    scratch = tmp_path / "scratch"
    experiments.main(["run", f"--preset={_experiments_tiny_preset}", "--only=baseline", f"--scratch={scratch}",
                      "--no_samples"])
    results = _experiments_results / "tiny"  # a preset other than cpu reports in its own folder
    rec = experiments.experiment_record(experiments.read_log(results / "logs" / "baseline.jsonl"))
    assert f"--out_dir={scratch / 'tiny' / 'runs' / 'baseline'}" in rec["args"]
    assert (scratch / "tiny" / "runs" / "baseline" / "ckpt.pt").is_file() and (results / "results.md").is_file()
    assert json.loads((results / "setup.json").read_text())["tokenizer"] == str(scratch / "tiny" / "tokenizer-300")
    assert not (_experiments_results / "logs").exists()


@pytest.mark.parametrize("argv, prefix, named", [
    (["--steps=-5"], "experiments.py: --steps ", [-5]),
    (["--only=,"], "experiments.py: --only ", ["','"]),
    (["--only=baseline,bogus"], "experiments.py: --only", ["'bogus'"]),
    (["--train=/no/such.txt", "--valid=/no/such.txt"], "experiments.py: --train ", ["/no/such.txt"]),
    ([f"--train={ROOT / 'README.md'}"], "experiments.py: --valid", []),
    ([f"--train={ROOT / 'README.md'}", f"--valid={ROOT / 'README.md'}", "--preset=cs336"], "experiments.py: --train",
     ["--preset=cs336"])], ids=["negative-steps", "no-names", "unknown", "no-text", "train-alone", "not-cpu"])
def test_experiments_bad_flags_are_one_line_before_anything_runs(tmp_path, _experiments_results, argv, prefix, named):
    message = _exits(experiments.main, ["run", *argv, f"--scratch={tmp_path / 'scratch'}", "--no_samples"])
    _bad_says(message, prefix, *named)
    assert not (tmp_path / "scratch").exists() and not _experiments_results.exists()


def test_experiments_train_failure_is_one_line_with_absolute_scratch(tmp_path, _experiments_results,
                                                                     _experiments_tiny_preset):
    # the run that failed, train.py's exit status and last line, and where its whole console is
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.bin").write_bytes(b"\0" * 64)   # no sidecar: train.py refuses it
    message = _exits(experiments.main, ["run", f"--preset={_experiments_tiny_preset}", "--only=baseline",
                                             f"--scratch={tmp_path / 's'}", f"--data_dir={data}", "--no_samples"])
    console = tmp_path / "s" / f"tiny{_experiments_tag(data)}" / "runs" / "baseline" / "console.txt"
    _bad_says(message, "experiments.py: run baseline ", "train.py", "exit 1", "sidecar", console)


def test_experiments_run_interrupted_or_unwritable_is_one_line(tmp_path, _experiments_results, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    # Ctrl-C: one line after a newline (which leaves the terminal's ^C line), saying how to go on
    monkeypatch.setattr(experiments, "prepare_data", interrupted)
    message = _ctrl_c_line(monkeypatch, experiments, "run", "--only=baseline")
    _bad_says(message, "experiments.py: ", "interrupted", "python experiments.py run")
    # a results folder that cannot be made: the path
    (tmp_path / "a_file").write_text("x")
    monkeypatch.setattr(experiments, "prepare_data", lambda *a, **k: tmp_path)
    monkeypatch.setattr(experiments, "RESULTS_ROOT", tmp_path / "a_file")
    _bad_says(_exits(experiments.main, ["run", "--only=baseline"]), "experiments.py: ", tmp_path / "a_file" / "logs")


# ==== bench.py: the side-by-side benchmarks' command line and their GPU checks' own faults


# ---- bench.py gpu: every device path checked against its reference, and each check shown able to fail


def _bench_gpu_args(**kw):
    """bench.py gpu's flags for a quick CPU run: tiny shapes, a few steps, a backend that compiles fast, no DDP check
    (procs=2 for it: 2 gloo processes)."""
    flags = dict(device="cpu", tiny=True, batch_size=4, steps=4, compile_backend="aot_eager", procs=1)
    return argparse.Namespace(**{**flags, **kw})


def _bench_checks(out):
    """bench_gpu's checks read back from what it printed: (passed, what) for each line starting with OK or FAIL."""
    return [(line.split()[0] == "OK", line.split(None, 1)[1]) for line in out.splitlines()
            if line.split()[:1] in (["OK"], ["FAIL"])]


def test_bench_gpu_runs_every_check_on_cpu(capsys, monkeypatch):
    # on the CPU all 15 checks pass, after timing train.train for both architectures compiled and eager, the gpt2-xl
    # preset's activation checkpointing (tiny) on and off, and the GPT-2 preset's step under DDP (2 gloo processes)
    # against one; its data and checkpoints go when bench.py exits
    removed_at_exit, register = [], atexit.register
    monkeypatch.setattr(atexit, "register", lambda f, *a, **k: removed_at_exit.append(a[0]) if f is shutil.rmtree
                        else register(f, *a, **k))
    bench.bench_gpu(_bench_gpu_args(procs=2))
    out = capsys.readouterr().out
    checks = _bench_checks(out)
    assert len(checks) == 15 and all(ok for ok, _ in checks), checks
    assert checks[-1][1].startswith("DDP x2, 2 micro-steps (no_sync) vs 1 process")
    assert "passed" in out.splitlines()[-1]
    timed = [(a, m) for a in ("gpt2", "llama") for m in ("compiled", "eager")]
    assert {f"{a} {m}" for a, m in timed} <= {" ".join(line.split()[:2]) for line in out.splitlines()}  # each printed
    assert [line.split()[0] for line in out.splitlines() if line.split()[:1] in (["on"], ["off"])] == [
        "on", "on", "off", "off"]   # activation checkpointing's rows: two batches each way
    (ddp,) = [line.split() for line in out.splitlines() if line.startswith("gpt2 DDP x2 compiled")]
    assert float(ddp[5].replace(",", "")) > 0 and ddp[6].endswith("%")   # tokens/s and MFU
    (tmp,) = removed_at_exit
    assert tmp.name.startswith("bench_gpu_") and (tmp / "llama_compiled" / "ckpt.pt").is_file()
    assert all((tmp / f"{a}_{m}" / "log.jsonl").is_file() for a, m in timed)
    ddp_config = _train_records(tmp / "ddp", "config")[0]
    assert (ddp_config["world_size"], ddp_config["total_batch_tokens"], ddp_config["compile"]) == (2, 4 * 64 * 2 * 2,
                                                                                                "true")
    shutil.rmtree(tmp)


def test_bench_gpu_reports_failing_checks_alone_and_exits_nonzero(capsys, monkeypatch):
    # two faults, each failing its own check alone (a wrong scratch attention, a DDP check of 1 micro-step): exit 1
    real = train.grad_accum_steps
    monkeypatch.setattr(train, "grad_accum_steps", lambda total, B, T, world: 1 if world == 1 else real(total, B, T,
                                                                                                       world))
    monkeypatch.setattr(M, "scaled_dot_product_attention", lambda q, k, v, mask=None: torch.zeros_like(q))
    with pytest.raises(SystemExit) as e:
        bench.bench_gpu(_bench_gpu_args(steps=2, procs=2))
    out = capsys.readouterr().out
    failed = [what for ok, what in _bench_checks(out) if not ok]
    assert e.value.code == 1 and len(failed) == 2
    for what in ("SDPA (no flash kernel here) vs from scratch", "DDP x2, 2 micro-steps (no_sync) vs 1 process"):
        assert any(f.startswith(what) for f in failed) and what in out.splitlines()[-1], what


def test_bench_gpu_each_check_fails_on_its_own_fault(capsys, monkeypatch):
    # each check shown able to fail by its fault: a device doubling the weights, an off bf16 autocast loss, a fused
    # AdamW that is not train.AdamW, a torch.compile changing the loss, a KV cache that forgets, a checkpointed block
    # whose recomputation is not its forward
    real_to, real_loss, real_adamw = torch.nn.Module.to, M.lm_loss, torch.optim.AdamW
    real_checkpoint = torch.utils.checkpoint.checkpoint

    def doubled_to(self, *a, **k):
        out = real_to(self, *a, **k)
        with torch.no_grad():
            for p in out.parameters():
                p.mul_(2.0)
        return out

    def off_under_autocast(model, x, y, **k):
        return real_loss(model, x, y, **k) + (1.0 if torch.is_autocast_enabled("cpu") else 0.0)

    class BrokenFused(real_adamw):
        def __init__(self, params, lr=1e-3, fused=None, **k):
            super().__init__(params, lr=2 * lr if fused else lr, fused=fused, **k)

    def broken_compile(m, **k):
        return lambda *a, **kw: tuple(o + 1 if i == 1 else o for i, o in enumerate(m(*a, **kw)))

    class Forgetful(M.KVCache):
        def update(self, layer, k, v):
            return k, v   # the new positions only

    monkeypatch.setattr(torch.nn.Module, "to", doubled_to)
    monkeypatch.setattr(M, "lm_loss", off_under_autocast)
    monkeypatch.setattr(torch.optim, "AdamW", BrokenFused)
    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(M, "KVCache", Forgetful)
    def recomputed_off(block_forward, *a, **k):   # the backward's recomputation sees its input 10% off, not the forward
        calls = []

        def forward(x, *rest, **kw):
            calls.append(x)
            return block_forward(x * 1.1 if len(calls) > 1 else x, *rest, **kw)
        return real_checkpoint(forward, *a, **k)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", recomputed_off)
    with pytest.raises(SystemExit):
        bench.bench_gpu(_bench_gpu_args(steps=2))
    failed = [what for ok, what in _bench_checks(capsys.readouterr().out) if not ok]
    for what in ("llama: float32 forward on the device vs CPU", "gpt2: float32 forward on the device vs CPU",
                 "llama: bf16 autocast loss vs float32", "gpt2: bf16 autocast loss vs float32",
                 "fused AdamW vs train.AdamW, 5 steps", "torch.compile forward vs eager (bf16)",
                 "KV-cached greedy decoding vs uncached", "HellaSwag and LAMBADA on the device vs CPU",
                 "activation checkpointing vs without: loss, grad"):
        assert any(f.startswith(what) for f in failed), what


# ---- bench.py: the command line: every count and list checked before any benchmark runs


@pytest.mark.parametrize("argv, flag, named", [
    (["sample", "--repeats", "0"], "--repeats", ["0", "1"]),
    (["model", "--threads", "0"], "--threads", ["0", "1"]),
    (["train", "--steps", "0"], "--steps", ["0", "1"]),
    (["gpu", "--steps", "1", "--tiny"], "--steps", ["1", "2"]),   # the gpu section times the second half of its steps
    (["train", "--batch_size", "-2"], "--batch_size", ["-2", "1"]),
    (["sample", "--max_new_tokens", "0"], "--max_new_tokens", ["0", "1"]),
    (["sample", "--prompt_len", "0"], "--prompt_len", ["0", "1"]),
    (["sample", "--prompt_len", "-3"], "--prompt_len", ["-3", "1"]),
    # a list with a typo would time nothing, or mislabel a row: the bad list and the choices
    (["sample", "--modes", "foo"], "--modes", ["'foo'", "greedy", "top_p"]),
    (["tokenizer", "--parts", "trian"], "--parts", ["'trian'", "train", "encode", "encode_file"]),
    (["model", "--parts", ""], "--parts", ["''", "train", "generate", "compile"]),
    (["train", "--dtypes", "float32,float16"], "--dtypes", ["'float32,float16'", "bfloat16"]),
    (["sample", "--prompt_len", "1020", "--max_new_tokens", "10"], "--prompt_len",   # past GPT-2's positions
     ["1020", "--max_new_tokens", "10", "1,024"]),
    (["gpu", "--device", "foo", "--tiny"], "--device", ["'foo'"]),
    (["tokenizer", "--mix20", "."], "--mix20", [".", "folder"]),
    (["tokenizer", "--mix20", "/nonexistent-dir/mix20.txt"], "--mix20", ["/nonexistent-dir/mix20.txt",
                                                                         "/nonexistent-dir"]),
    (["gpu", "--compile_backend", "nope", "--tiny"], "--compile_backend", ["'nope'"]),
    (["gpu", "--procs", "-1", "--tiny"], "--procs", ["-1", "0"]),
    (["memory", "--num_layers", "0"], "--num_layers", ["0", "1"]),
    (["dtype", "--repeats", "0"], "--repeats", ["0", "1"]),
    (["loss", "--steps", "0"], "--steps", ["0", "1"]), (["loss", "--dtypes", "fp32"], "--dtypes", ["'fp32'"]),
    (["memory", "--vocab_size", "0"], "--vocab_size", ["0", "1"]),
    (["memory", "--d_model", "100", "--num_heads", "3"], "--num_heads", ["3", "100"]),   # the model's shape
    (["memory", "--d_model", "100", "--num_heads", "4"], "--num_heads", ["4", "100", "25"]),
    (["tokenizer", "--texts", "/no/such.txt:500"], "--texts", ["'/no/such.txt:500'"]),
    (["tokenizer", "--texts", f"{ROOT / 'README.md'}:100"], "--texts", ["257"]),
    (["tokenizer", "--texts", str(ROOT / "README.md")], "--texts", ["PATH:VOCAB"]),
    (["speedrun", "--minutes", "0"], "--minutes", ["0"]), (["speedrun", "--curve_every", "0"], "--curve_every", ["0"]),
    (["speedrun", "--peer_lr", "0"], "--peer_lr", ["'0'"]), (["speedrun", "--seeds", "a"], "--seeds", ["'a'"]),
    (["speedrun", "--num_heads", "3"], "--num_heads", ["3", "256"]),
    (["speedrun", "--train", "/no/such.txt"], "--train", ["/no/such.txt"]),
    (["speedrun", "--valid", str(ROOT / "README.md")], "--train", []),
    (["speedrun", "--vocab_size", "100"], "--vocab_size", ["100", "257"])])
def test_bench_bad_counts_are_one_line_before_any_work(monkeypatch, argv, flag, named):
    monkeypatch.setattr(sys, "argv", ["bench.py", *argv])
    for section in ("tokenizer", "model", "train", "gpu", "sample", "memory", "dtype", "loss", "speedrun"):
        monkeypatch.setattr(bench, f"bench_{section}", lambda args: pytest.fail("ran"))
    _bad_says(_exits(bench.main), f"bench.py: {flag}", *named)


@pytest.mark.parametrize("argv,section", [
    (["sample", "--repeats", "1", "--threads", "1", "--max_new_tokens", "1", "--prompt_len", "1"], "bench_sample"),
    (["train", "--steps", "1", "--batch_size", "1", "--repeats", "1", "--threads", "1"], "bench_train"),
    (["dtype", "--steps", "1", "--repeats", "1", "--threads", "1"], "bench_dtype"),
    (["loss", "--steps", "1", "--threads", "1", "--dtypes", "float32"], "bench_loss"),
    (["gpu", "--steps", "2", "--batch_size", "1", "--tiny"], "bench_gpu"),
    (["memory", "--d_model", "2", "--num_layers", "1", "--num_heads", "1", "--context_length", "1", "--vocab_size",
      "1", "--batch_size", "1", "--steps", "1", "--repeats", "1", "--threads", "1"], "bench_memory")])
def test_bench_smallest_allowed_counts_are_accepted(monkeypatch, argv, section):
    ran = []
    monkeypatch.setattr(sys, "argv", ["bench.py", *argv])
    monkeypatch.setattr(bench, section, lambda args: ran.append(args))
    bench.main()
    assert len(ran) == 1


def test_bench_gpu_under_torchrun_is_refused_in_one_line(monkeypatch):
    # every rank would run the checks on GPU 0: refused; it starts its own processes for the DDP check
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setattr(sys, "argv", ["bench.py", "gpu", "--tiny"])
    monkeypatch.setattr(bench, "bench_gpu", lambda args: pytest.fail("ran"))
    _bad_says(_exits(bench.main), "bench.py gpu: ", "torchrun", "python bench.py gpu")


def test_bench_tokenizer_texts_default_to_the_fetched_tinystories_and_make_the_mix_from_them(tmp_path, monkeypatch):
    # no --texts: the speedrun's TinyStories text at vocab 10,000; --mix20 made from the texts (make_mix20.py's rule)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("  one\ntwo \n")
    b.write_text("three")
    monkeypatch.setattr(fineweb, "tinystories_head", lambda: (a, b))
    assert bench._tok_texts(argparse.Namespace(texts="")) == [(a, 10000)]
    assert bench._tok_texts(argparse.Namespace(texts=f"{a}:500,{b}:300")) == [(a, 500), (b, 300)]
    bench._tok_make_mix(tmp_path / "mix.txt", [a, b], size=100)
    head = ("one\ntwo\n<|endoftext|>\nthree\n<|endoftext|>\n" * 4)[:100]
    assert (tmp_path / "mix.txt").read_text() == head[:head.rindex("\n") + 1]


def _bench_rows(text, first):
    """A bench.py table's rows read back as their cells, from the header row that begins with `first`."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    return [line.split() for line in lines[head + 1:] if line.strip()]


def test_bench_sample_times_both_sides_and_their_greedy_tokens_agree(capsys):
    # the section runs end to end (the test suite is what keeps it from going stale) at its smallest counts
    bench.bench_sample(argparse.Namespace(threads=1, repeats=1, max_new_tokens=3, prompt_len=2, modes="greedy,top_p"))
    rows = _bench_rows(capsys.readouterr().out, "mode")
    assert [(r[0], r[1]) for r in rows] == [("greedy", "1"), ("greedy", "8"), ("top_p", "1"), ("top_p", "8")]
    assert [r[-1] for r in rows[:2]] == ["3/3", "24/24"]
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


def test_bench_train_times_the_loop_beside_the_bare_step(capsys):
    bench.bench_train(argparse.Namespace(shape="small", batch_size=1, steps=1, repeats=1, threads=1,
                                         dtypes="float32"))
    out = capsys.readouterr().out
    assert re.search(r"^whole loop \(train\.train\), float32\s+[\d,]+\s+\d", out, re.M), out
    assert re.search(r"^model-only step .*float32\s+[\d,]+\s+1\.000", out, re.M), out


def test_bench_dtype_times_both_dtypes_at_the_presets_shapes_and_says_what_auto_picks(capsys, monkeypatch):
    # the presets' own shapes; each row both dtypes' tok/s and train.py's choice, here and on a faked native-bf16 CPU
    shapes = bench._dtype_shapes()
    for name in ("speedrun-cpu", "tinystories-cpu"):
        assert {k: shapes[f"--preset={name}"][k] for k in ("d_model", "batch_size", "compile")} == \
            {k: train.PRESETS[name].get(k, train.DEFAULTS[k]) for k in ("d_model", "batch_size", "compile")}
    assert shapes["main job"]["d_model"] == train.DEFAULTS["d_model"]
    # a fake loop (bfloat16 steps half as long): a real bf16 run on a CPU without it natively is ~20x slower
    monkeypatch.setattr(bench, "_loop_step_times", lambda cfg, steps, dtype, data, out: [
        0.5 if dtype == "bfloat16" else 1.0] * (steps - 1))
    for native, picks in ((False, "float32"), (True, "bfloat16")):
        monkeypatch.setattr(M, "native_bf16", lambda device, native=native: native)
        bench.bench_dtype(argparse.Namespace(steps=1, repeats=1, threads=1, only="d_model"))
        out = capsys.readouterr().out.splitlines()
        rows = {w: line for line in out for w in ("64", "192") if f"d_model {w}" in line}
        assert re.search(r"\| +4,096 \| +8,192 \| +2.00x \| float32", rows["64"]), rows   # narrower than the edge
        assert re.search(rf"\| +2.00x \| {picks}", rows["192"]), rows


def test_bench_loss_times_both_ways_of_the_loss_at_the_dtype_sections_shapes(capsys):
    bench.bench_loss(argparse.Namespace(steps=1, threads=1, dtypes="float32", only="d_model 64"))
    rows = [line for line in capsys.readouterr().out.splitlines() if "d_model 64" in line]
    assert len(rows) == 1 and re.search(r"d64, vocab 2,048, 32 x 128 +\| float32 +\|( +[\d.]+ \|){2} +[\d.]+x \|",
                                        rows[0]), rows


def test_bench_dtype_times_the_real_loop_at_a_shape_that_carries_its_own_settings(tmp_path):
    # the loop itself, not faked: a shape of bench.py dtype's (the main job's settings, compile among them), narrowed
    cfg = dict(bench._dtype_shapes()["main job"], vocab_size=64, context_length=16, d_model=16, num_layers=1,
               num_heads=2, batch_size=2)
    (tmp_path / "data").mkdir()
    bench._write_tokens(tmp_path / "data" / "train.bin", 2_000, 64, 0)
    bench._write_tokens(tmp_path / "data" / "val.bin", 500, 64, 1)
    dts = bench._loop_step_times(cfg, 3, "float32", tmp_path / "data", tmp_path / "out")
    assert len(dts) == 2 and all(dt > 0 for dt in dts)


def test_bench_memory_shards_every_byte_of_the_state_and_times_checkpointing(capsys):
    # under FSDP the 2 ranks' parameters, gradients and moments add up to one DDP rank's; both checkpointing rows timed
    args = argparse.Namespace(d_model=32, num_layers=2, num_heads=2, context_length=32, vocab_size=64, batch_size=2,
                              steps=1, repeats=1, threads=1)
    state, _ = bench.bench_memory(args)
    ddp, fsdp = state["ddp"], state["fsdp"]
    n_tensors = len(list(M.build_model(bench._memory_cfg(args)).parameters()))
    assert ddp[0] == ddp[1] and all(0 < f["parameters"] < ddp[0]["parameters"] for f in fsdp)
    for kind in ("parameters", "gradients"):
        assert fsdp[0][kind] + fsdp[1][kind] == ddp[0][kind]
    assert fsdp[0]["optimizer"] + fsdp[1]["optimizer"] == ddp[0]["optimizer"] + 4 * n_tensors
    rows = _bench_rows(capsys.readouterr().out, "activation")
    assert [r[0] for r in rows] == ["off", "on"] and all(float(r[1]) >= 0 and float(r[4]) > 0 for r in rows)


def _bench_speedrun_args(tmp_path, **kw):
    text = "".join(f"Once upon a time there was a cat number {i}. It liked fish.<|endoftext|>" for i in range(300))
    (tmp_path / "train.txt").write_text(text)
    (tmp_path / "val.txt").write_text(text[:3000])
    return argparse.Namespace(**{**dict(
        minutes=0.01, seeds="0", peer_lr="3e-3", ours="", train=str(tmp_path / "train.txt"),
        valid=str(tmp_path / "val.txt"), vocab_size=300, d_model=16, num_layers=1, num_heads=2, d_ff=32,
        context_length=16, batch_size=2, curve="", curve_every=10, curve_tokens=8192, peer_dtype="float32"), **kw})


def _bench_speedrun_fake_clocks(monkeypatch):
    """Each training step takes 1 s on both sides (train.py's clock, the peer loop's perf_counter): a budget of N
    seconds is N steps on any machine, however fast or loaded."""
    real = train.train
    monkeypatch.setattr(train, "train", lambda cfg, **kw: real(cfg, **{"clock": _train_fake_clock(), **kw}))
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=_train_fake_clock()))


def test_bench_speedrun_scores_both_sides_on_the_same_bytes(tmp_path, capsys, monkeypatch):
    # both sides scored on the whole validation text, the ratio ours over the peer's median; default: TinyStories head
    args = _bench_speedrun_args(tmp_path)
    monkeypatch.setattr(fineweb, "tinystories_head", lambda: (Path(args.train), Path(args.valid)))
    bench.bench_speedrun(argparse.Namespace(**{**vars(args), "train": "", "valid": ""}))
    out = capsys.readouterr().out
    rows = {r[0]: r for r in _bench_rows(out, "run") if r[0] in ("ours", "peer")}
    assert set(rows) == {"ours", "peer"} and all(int(r[-3]) >= 1 for r in rows.values())
    last = out.splitlines()[-1]   # the figures it names, wherever they stand in the line
    figures = dict(re.findall(r"\b(ours|peer|ratio) (\d+\.\d+)\b", last))
    assert last.startswith("speedrun: ") and set(figures) == {"ours", "peer", "ratio"}, out
    ours, peer, ratio = (float(figures[k]) for k in ("ours", "peer", "ratio"))
    assert (ours, peer) == (float(rows["ours"][-1]), float(rows["peer"][-1])) and 0 < ours < 10 and 0 < peer < 10
    assert ratio == pytest.approx(ours / peer, abs=2e-3)
    bpb = bench._speedrun_bpb(lambda x: torch.zeros(*x.shape, 300), list(range(33)), 100, 16)
    assert bpb == pytest.approx(32 * math.log(300) / math.log(2) / 100)   # uniform logits: log2(V) bits a token


def test_bench_speedrun_curve_scores_both_sides_every_few_steps_into_a_png(tmp_path, monkeypatch):
    drawn = {}
    plot = bench._speedrun_plot
    monkeypatch.setattr(bench, "_speedrun_plot", lambda path, results, *a: (drawn.update(results),
                                                                             plot(path, results, *a)))
    _bench_speedrun_fake_clocks(monkeypatch)   # 12 steps a side, not as many as this machine's speed allows
    bench.bench_speedrun(_bench_speedrun_args(tmp_path, minutes=0.2, curve=str(tmp_path / "c.png"), curve_every=2,
                                              curve_tokens=40))
    assert (tmp_path / "c.png").stat().st_size > 0 and set(drawn) == {"ours", "peer lr 0.003"}
    for name, (r,) in drawn.items():
        times = [t for t, _ in r["curve"]]
        assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0, (name, r["curve"])
        assert len(times) >= min(3, r["steps"] // 2 + 1) and all(0 < b < 20 for _, b in r["curve"])
        assert r["curve"][-1][1] < r["curve"][0][1]   # it learned between the first point and the last
    assert bench._speedrun_curve_tokens(argparse.Namespace(curve_tokens=40), 2, 16) == 64   # whole batches
    # a curve point over every validation token is the final score (less the first token's bytes: a few in 2,454)
    args = _bench_speedrun_args(tmp_path, curve="x.png", curve_tokens=10 ** 6)
    val = Path(args.valid).read_text()
    r = bench._speedrun_peer(args, 3e-3, 0, Path(args.train).read_text(), val,
                             len(val.replace(bpe.EOT, "").encode("utf-8")))
    assert r["curve"][-1][1] == pytest.approx(r["bpb"], rel=3e-3)


def test_bench_speedrun_peer_runs_under_bf16_autocast_when_asked_and_auto_follows_train_py(tmp_path, monkeypatch):
    seen, made = [], []
    real, real_autocast = torch.nn.functional.cross_entropy, torch.autocast
    monkeypatch.setattr(bench.F, "cross_entropy", lambda logits, *a, **k: (seen.append(logits.dtype),
                                                                           real(logits, *a, **k))[1])
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: (made.append((a, k)), real_autocast(*a, **k))[1])
    args = _bench_speedrun_args(tmp_path, peer_dtype="bfloat16")
    val = Path(args.valid).read_text()
    r = bench._speedrun_peer(args, 3e-3, 0, Path(args.train).read_text(), val, len(val.encode("utf-8")))
    assert made == [(("cpu",), dict(dtype=torch.bfloat16, enabled=True))]   # the peer's forwards under autocast
    assert r["steps"] >= 1 and 0 < r["bpb"] < 20 and seen and set(seen) == {torch.float32}   # the loss in float32
    for flags, d_model, dtype in (({"avx2"}, 512, "float32"), ({"avx512_bf16"}, 512, "bfloat16"),
                                  ({"avx512_bf16"}, 16, "float32")):
        monkeypatch.setattr(M, "cpu_flags", lambda flags=flags: flags)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
        assert bench._speedrun_peer_dtype(_bench_speedrun_args(tmp_path, peer_dtype="auto", d_model=d_model)) == dtype


def test_bench_speedrun_scores_an_ema_run_by_its_average_and_its_last_weights_beside(tmp_path, capsys, monkeypatch):
    # --ema: the row's figure is the checkpoint's model (the average), the weights training ended on scored beside it
    # (6 steps: after one alone the average is the last weights)
    _bench_speedrun_fake_clocks(monkeypatch)
    bench.bench_speedrun(_bench_speedrun_args(tmp_path, minutes=0.1, peer_lr="", ours="--ema=0.5"))
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ours --ema"))
    found = re.search(r"(\S+)\s+\(last weights (\S+)\)$", row)
    assert found, row
    average, last = map(float, found.groups())
    assert 0 < average < 20 and 0 < last < 20 and average != last


def test_bench_speedrun_a_preset_in_ours_brings_its_own_recipe(tmp_path, monkeypatch):
    # --ours="--preset=..." runs the preset's settings (bench.py passes only data, budget and logging flags)
    seen = []
    real = train.train
    monkeypatch.setattr(train, "train", lambda cfg, **kw: (seen.append(dict(cfg)), real(cfg, **kw))[1])
    tiny = "--d_model=16 --num_layers=1 --num_heads=2 --d_ff=32 --context_length=16 --batch_size=2 --vocab_size=300"
    bench.bench_speedrun(_bench_speedrun_args(tmp_path, peer_lr="", ours=f"--preset=speedrun-cpu {tiny}"))
    given = {f[2:].split("=")[0] for f in tiny.split()} | {"data_dir", "out_dir", "prepare_data", "time_budget",
                                                           "eval_interval", "eval_iters", "eval_tokens", "log_interval",
                                                           "num_samples", "seed", "device"}
    (cfg,) = seen
    assert {k: cfg[k] for k in train.PRESETS["speedrun-cpu"] if k not in given} == {
        k: v for k, v in train.PRESETS["speedrun-cpu"].items() if k not in given}
    assert (cfg["d_model"], cfg["time_budget"]) == (16, "0.6s")


def test_bench_ctrl_c_is_one_line(monkeypatch):
    # one line after a newline (which leaves the terminal's ^C line)
    def ctrl_c(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "bench_sample", ctrl_c)
    _bad_says(_ctrl_c_line(monkeypatch, bench, "sample"), "bench.py: ", "interrupted")


# ==== command lines and bad input: every script's flags, one clear line per mistake, nothing half-written


# ---- helpers for the sections above: a script's exit message, what a message says, a tiny checkpoint, stories


def _tiny_llama_ckpt(tmp_path, vocab_size=257, context_length=16):
    """A tiny train.py-format Llama checkpoint with a byte-level bpe.py tokenizer (257 tokens with <|endoftext|>)."""
    torch.manual_seed(0)
    return _sample_byte_llama(tmp_path, vocab_size, context_length=context_length)[1]


# ---- every script: a flag argparse rejects, ~ in a path flag, output into a pipe that closes early


@pytest.mark.parametrize("script", [bench, bpe, experiments, fineweb, flops, hellaswag, lambada, sample, stories,
                                    train])
def test_every_script_reports_a_bad_flag_in_one_line(script, monkeypatch, capsys):
    # one line on stderr (no usage block) naming the script and the flag or its value, exit status 2, before any work
    name = Path(script.__file__).name
    argv, prefix, named = {bench: (["sample", "--repeats=x"], "bench.py sample: ", ["--repeats", "'x'"]),
                           experiments: (["report", "--bogus"], f"{name}: ", ["--bogus"])}.get(
        script, (["--bogus"], f"{name}: ", ["--bogus"]))
    monkeypatch.setattr(sys, "argv", [name, *argv])
    with pytest.raises(SystemExit) as e:
        script.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.endswith("\n"), err
    _bad_says(err[:-1], prefix, *named)


@pytest.mark.parametrize("script, argv", [
    (sample, ["--ckpt=~/missing.pt"]), (flops, ["--ckpt=~/missing.pt"]), (hellaswag, ["--ckpt=~/missing.pt"]),
    (lambada, ["--ckpt=~/missing.pt"]), (lambada, ["--init_from=~/missing"]), (bpe, ["--input=~/missing.txt"]),
    (bpe, ["--encode=~/missing.txt", "--out=~/x.bin"]), (fineweb, ["--input=~/missing.txt"]),
    (sample, ["--ckpt=CKPT", "--prompt=FILE:~/missing.txt"]), (experiments, ["run", "--data_dir=~/missing"]),
    (bench, ["tokenizer", "--mix20=~/missing/mix.txt"])])
def test_cli_path_flags_expand_a_leading_tilde(tmp_path, monkeypatch, script, argv):
    # the shell leaves --flag=~/x as it is: without expansion a folder named "~" would appear in the working one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    argv = [a.replace("CKPT", str(_tiny_llama_ckpt(tmp_path))) for a in argv]
    message = _bad_exit(monkeypatch, script, *argv)
    assert f"{tmp_path / 'home' / 'missing'}" in message and "~" not in message, message


@pytest.mark.parametrize("which", ["stories", "sample"])
def test_output_piped_into_head_ends_quietly(tmp_path, which):
    # `python stories.py --print 2000 | head -1`: the reader goes away early; no BrokenPipeError traceback
    if which == "stories":
        cmd = ["stories.py", "--print", "2000"]
    else:
        cmd = ["sample.py", f"--ckpt={_sample_byte_llama(tmp_path)[1]}", "--max_new_tokens=100000", "--no_stop",
               "--device=cpu"]
    p = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    # (at most one line on stderr: sample.py's "loaded ...")
    assert p.wait(timeout=120) == 1 and "Traceback" not in err and err.count("\n") <= 1, err


def test_no_script_or_readme_reads_the_teams_data_and_docs_mark_it():
    # no script, README or docs line reads ../shared; a docs paragraph of the team's commands names it $TEAM_DATA
    for script in ROOT.glob("*.py"):
        if script.name != "test_all.py":
            text = script.read_text()
            assert "../shared" not in text and '"shared"' not in text, script.name
    assert "../shared" not in (ROOT / "README.md").read_text()
    for doc in (ROOT / "docs").glob("*.md"):
        assert "../shared" not in doc.read_text(), doc.name
        for paragraph in doc.read_text().split("\n\n"):
            assert "$TEAM_DATA" not in paragraph or "team's" in paragraph, (doc.name, paragraph)


# ---- the scripts that load a checkpoint (sample, flops, hellaswag, lambada): files and devices they cannot use


@pytest.mark.parametrize("script", [sample, flops, hellaswag, lambada])
@pytest.mark.parametrize("kind, named", [("truncated", "readable"), ("empty", "readable"), ("garbage", "readable"),
                                         ("directory", "directory")])
def test_cli_rejects_a_checkpoint_it_cannot_load(tmp_path, monkeypatch, script, kind, named):
    good = _tiny_llama_ckpt(tmp_path).read_bytes()
    bad = tmp_path / "bad.pt"
    if kind == "directory":
        bad.mkdir()
    else:
        bad.write_bytes({"truncated": good[:len(good) // 2], "empty": b"", "garbage": b"\x0e\xff not a pickle"}[kind])
    _bad_says(_bad_exit(monkeypatch, script, f"--ckpt={bad}"), f"{script.__name__}.py: --ckpt {bad}: ", named)


@pytest.mark.parametrize("script", [sample, hellaswag, lambada])
@pytest.mark.parametrize("kind, named", [("bare", ["train.py"]), ("no_config", ["train.py"]),
                                         ("list", ["dict", "list"])])
def test_cli_rejects_a_checkpoint_of_another_kind(tmp_path, monkeypatch, script, kind, named):
    # a readable file that is not a train.py checkpoint: a bare state dict, weights without their model_config, a list
    good = torch.load(_tiny_llama_ckpt(tmp_path), weights_only=True)
    content = {"bare": good["model"], "no_config": {k: v for k, v in good.items() if k != "model_config"},
               "list": [1, 2]}[kind]
    path = tmp_path / f"{kind}.pt"
    torch.save(content, path)
    _bad_says(_bad_exit(monkeypatch, script, f"--ckpt={path}", "--device=cpu"),
              f"{script.__name__}.py: --ckpt {path}: ", *named)


@pytest.mark.parametrize("script", [sample, hellaswag, lambada])
def test_cli_rejects_a_device_torch_cannot_use_here(tmp_path, monkeypatch, script):
    # a device torch does not know (the ones it takes named), CUDA where there is none, a GPU past the visible ones
    ckpt = _tiny_llama_ckpt(tmp_path)
    name = f"{script.__name__}.py"
    _bad_says(_bad_exit(monkeypatch, script, f"--ckpt={ckpt}", "--device=tpu"), f"{name}: --device", "'tpu'", "cpu",
              "cuda", "mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _bad_says(_bad_exit(monkeypatch, script, f"--ckpt={ckpt}", "--device=cuda"), f"{name}: --device cuda", "CUDA")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    _bad_says(_bad_exit(monkeypatch, script, f"--ckpt={ckpt}", "--device=cuda:3"), f"{name}: --device cuda:3", 1)


# ---- a tokenizer retrained into its folder: refused by every script that reads its ids


def test_a_tokenizer_retrained_into_its_folder_is_refused_by_train_sample_and_the_evals(tmp_path, monkeypatch,
                                                                                          capsys):
    # a tokenizer retrained in its folder: its fingerprint makes train, sample and the evals refuse it, naming both
    d, tok_dir = tmp_path / "data", tmp_path / "data" / "tok"
    d.mkdir()
    _bpe_small_tokenizer(tmp_path, vocab_size=300).save_dir(tok_dir)
    shutil.copytree(tok_dir, tmp_path / "original")

    def encode(*names):
        for name in names:
            (tmp_path / f"{name}.txt").write_text(_bpe_synthetic_text(300, seed=len(name)), encoding="utf-8")
            bpe.encode_file(tmp_path / f"{name}.txt", str(tok_dir), d / f"{name}.bin", num_workers=1)
    encode("train", "val")
    old = bpe.tokenizer_fingerprint(tok_dir)
    train.train(_train_cfg(d, tmp_path / "o", vocab_size=300, max_iters=1), log=_train_quiet)
    ckpt = tmp_path / "o" / "ckpt.pt"
    assert torch.load(ckpt, weights_only=True)["tokenizer_fingerprint"] == old

    (tmp_path / "other.txt").write_text(_bpe_synthetic_text(150, seed=7), encoding="utf-8")
    vocab, merges = bpe.train_bpe(tmp_path / "other.txt", 300, [_BPE_EOT], num_workers=1)
    bpe.Tokenizer(vocab, merges, [_BPE_EOT]).save_dir(tok_dir)   # retrained in place: same path, same 300 ids
    new = bpe.tokenizer_fingerprint(tok_dir)
    assert new != old
    message = _raises(train.train, _train_cfg(d, tmp_path / "o2", vocab_size=300, max_iters=1), log=_train_quiet)
    _bad_says(message, f"{d / 'train.bin'}.json: ", repr(str(tok_dir)), old, new)
    message = _raises(sample.load_model_and_tokenizer, str(ckpt), None, "cpu")
    _bad_says(message, f"--ckpt {ckpt}: ", repr(str(tok_dir)), old, new, "--tokenizer")
    for script in (hellaswag, lambada):
        _bad_says(_bad_exit(monkeypatch, script, f"--ckpt={ckpt}", "--device=cpu"),
                  f"{script.__name__}.py: --ckpt {ckpt}: ", old, new)
    # the original kept elsewhere is accepted by all; another tokenizer given with --tokenizer is refused too
    assert sample.load_model_and_tokenizer(str(ckpt), None, "cpu", str(tmp_path / "original"))[1].vocab_size == 300
    args = argparse.Namespace(ckpt=str(ckpt), init_from=None, tokenizer=str(tmp_path / "original"))
    assert hellaswag.load_model(args, "cpu")[1].vocab_size == 300
    message = _raises(sample.load_model_and_tokenizer, str(ckpt), None, "cpu", str(tok_dir))
    _bad_says(message, f"--ckpt {ckpt}: ", repr(str(tok_dir)), old, new)
    # token files of both versions in one data folder: refused, naming the tokenizer and both fingerprints
    encode("val")
    message = _raises(train.train, _train_cfg(d, tmp_path / "o2", vocab_size=300, max_iters=1), log=_train_quiet)
    _bad_says(message, f"{d}: ", repr(str(tok_dir)), old, new)
    encode("train")
    assert train.train(_train_cfg(d, tmp_path / "o2", vocab_size=300, max_iters=1), log=_train_quiet)["step"] == 1
    # the model trained on the old ids is not resumed on the new ones
    message = _raises(train.train, _train_cfg(d, tmp_path / "o", vocab_size=300, max_iters=2, resume=True),
                      log=_train_quiet)
    _bad_says(message, f"{ckpt}: ", old, new, "--fresh")


# ---- mutants.py: its mutants still name code that is there


def test_mutants_each_snippet_is_in_its_file_once():
    # an edit that moved a mutant's snippet makes mutants.py refuse to run at all: caught here, not months later
    import mutants
    mutants.check(mutants.MUTANTS)


# ---- CI: .ci/run lints before it tests


def test_ci_run_lints_with_ruff_before_the_tests(tmp_path):
    # .ci/run with a recording `python`: the dev requirements, `ruff check .`, then the suite; a lint failure stops it
    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n[ "$2" != ruff ] || exit "${{RUFF_RC:-0}}"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[1] for c in calls] == ["pip", "ruff", "pytest"] and calls[1] == "-m ruff check ."
    assert "ruff" in re.findall(r"(?m)^([\w.-]+)", (ROOT / "requirements-dev.txt").read_text())
    (tmp_path / "calls").unlink()
    r = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=dict(env, RUFF_RC="1"), capture_output=True)
    assert r.returncode == 1 and [c.split()[1] for c in (tmp_path / "calls").read_text().splitlines()] == [
        "pip", "ruff"]
