"""Pre-tokenise a corpus into uint16 token shards (FineWeb-Edu by default), and prepare the small TinyStories
data set that `python train.py` trains on.

    python fineweb.py                                    # FineWeb-Edu sample-10BT, GPT-2 -> data/edu_fineweb10B
    python fineweb.py --dataset openwebtext --vocab_size 32000 --out_dir data/owt-32k   # train a BPE first, then shard
    python fineweb.py --input my_corpus.txt --out_dir data/mine --shard_size 1000000    # a local file or folder
    python fineweb.py --input my_corpus.txt --tokenizer data/tinystories/tokenizer      # an existing bpe.py tokenizer
    python fineweb.py --prepare_tinystories              # what train.py does first: stories + BPE 2048 + train/val.bin
    python fineweb.py --prepare_tinystories --corpus_bytes 0 --vocab_size 10000 --out_dir data/tinystories-10k
                                                         # all of TinyStories (official val split), the CS336 setup
    python fineweb.py --tinystories_head                 # the speedrun's text: 2 MiB of train, 1,000 val stories

Output (what train.py --data_dir reads): val_000000.bin (shard 0 = validation), train_000001.bin, ... each of
--shard_size tokens (the last one shorter), raw little-endian uint16 ids (uint32 when the vocabulary has more
than 65536 ids) with a sidecar X.bin.json {"format": "tokens-v1", dtype, vocab_size, num_tokens, num_docs,
tokenizer, tokenizer_fingerprint, eot_id}, and meta.json for the whole directory (tokenizer, vocabulary size,
dtype, token and document counts, and the position in the document stream after every shard, which is what
makes resuming exact).

The end-of-text token goes BEFORE every document (as build-nanogpt does): every document then starts right
after an <|endoftext|>, so a training window that crosses a boundary sees "end of previous text, start of a
new one", and sampling can be seeded with the eot token alone to start a fresh document.

Every shard is written to a .tmp file and renamed, then meta.json is updated; an interrupted run restarts
after the last complete shard (it re-reads the skipped documents but does not tokenise them again).
Documents from the hub (--dataset) are tokenised as the dataset gives them, as build-nanogpt does (--strip_docs
strips the whitespace around each and drops empty ones); those of a local --input are stripped (the whitespace
around them comes with their separators) and empty ones dropped.

--prepare_tinystories (prepare_tinystories(), called by train.py) writes DATA_DIR/train.txt, val.txt (the
stories, each followed by "\n<|endoftext|>\n"), DATA_DIR/tokenizer/ (bpe.py), DATA_DIR/train.bin, val.bin
(+ sidecars, eot before every story) and DATA_DIR/prepared.json, the record that lets a second call reuse
every step (written first: a folder holding any of these files without it is someone's own, refused unless
--fresh). Without network (or with HF_HUB_OFFLINE=1) it says so in one line and uses stories.py instead
(except with --corpus_bytes 0, all of TinyStories, which needs the download).

--tinystories_head (tinystories_head(), called by bench.py speedrun and experiments.py) writes
data/tinystories-head/train.txt, the first 2 MiB of TinyStories' train split (cut mid-story), and valid.txt,
its first 1,000 validation stories, each story followed by "\n<|endoftext|>\n"; offline, stories.py's stories of
the same sizes, saying in one line that figures on them do not compare with the published ones. Its record,
head.json, is written first too: train.txt or valid.txt without it are someone's own, refused unless --fresh.
"""
import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import threading
import time
from itertools import islice
from multiprocessing import Pool
from pathlib import Path

import numpy as np

import bpe

EOT = "<|endoftext|>"
DATASETS = {  # --dataset name -> where `datasets` streams it from
    "fineweb-edu": dict(path="HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train", text="text"),
    "tinystories": dict(path="roneneldan/TinyStories", name=None, split="train", text="text"),
    "openwebtext": dict(path="Skylion007/openwebtext", name=None, split="train", text="text"),
}

def choose_dtype(vocab_size, dtype=None):
    if dtype in (None, "auto"):
        return "uint16" if vocab_size <= 2**16 else "uint32"
    if dtype not in ("uint16", "uint32"):
        raise ValueError(f"--dtype: expected uint16, uint32 or auto, got {dtype!r}")
    if dtype == "uint16" and vocab_size > 2**16:
        raise ValueError(f"--dtype uint16: a vocabulary of {vocab_size} ids does not fit (at most 65536 ids): "
                         f"use uint32 or auto")
    return dtype


# ----------------------------------------------------------------------------------------------------------
# documents: local files, Hugging Face datasets, shuffling


def check_input(path):
    """Fail early, with the path in the message, on input we could not read."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{path}: no such file or folder")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{path}: not readable (permissions)")
    if p.is_file():   # an empty or binary file: said before anything is written
        bpe.check_text_file(p)


def file_docs(path, chunk_chars=1 << 20):
    """Documents of a text file separated by <|endoftext|>, streamed (memory: one chunk + one document).
    Surrounding whitespace of every document is stripped and empty documents are dropped; line endings are
    kept as they are (CRLF stays CRLF), a byte-order mark at the start of the file is dropped."""
    # the unfinished document's chunks, joined only once a separator ends it (re-joining it for every chunk would
    # be quadratic in a long document), and its last len(EOT) - 1 characters, where a separator may begin
    pending, tail, k = [], "", len(EOT) - 1
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:  # line endings kept; a leading BOM dropped
            while chunk := fh.read(chunk_chars):
                if EOT not in chunk and EOT not in tail + chunk[:k]:
                    pending.append(chunk)
                    tail = (tail + chunk[-k:])[-k:]
                    continue
                parts = "".join(pending + [chunk]).split(EOT)
                last = parts.pop()  # may be the start of a document (or of a separator) continuing in the next chunk
                pending, tail = [last], last[-k:]
                for doc in parts:
                    if doc.strip():
                        yield doc.strip()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start} of a chunk)") from None
    buf = "".join(pending)
    if buf.strip():
        yield buf.strip()


def input_stamp(path):
    """Sizes and modification times of a --input file or folder's files, hashed: recorded with the shards, so a rerun
    on an input that has changed since is refused instead of resuming (or reusing) shards of the old text."""
    p = Path(path)
    files = [p] if p.is_file() else _folder_files(p)
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(p) if f != p else ''}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:12]


def _folder_files(path):
    """The files of a folder in sorted order of their relative path, hidden files and folders skipped."""
    return sorted(p for p in Path(path).rglob("*")
                  if p.is_file() and not any(s.startswith(".") for s in p.relative_to(path).parts))


def folder_docs(path):
    """One document per file, files in sorted order of their relative path (hidden files skipped)."""
    files = _folder_files(path)
    if not files:
        raise ValueError(f"{path}: the folder holds no files")
    for p in files:
        try:
            with open(p, encoding="utf-8-sig", newline="") as fh:  # bytes as they are, minus a BOM
                doc = fh.read().strip()
        except (UnicodeDecodeError, OSError) as e:
            raise ValueError(f"{p}: cannot read as UTF-8 text ({e})") from None
        if doc:
            yield doc


def hub_reachable():
    """(ok, why not): model.py's quick probe of the Hugging Face hub, before `datasets` spends minutes retrying
    one that cannot be reached (imported here only: the rest of this file needs no torch)."""
    from model import hub_reachable
    return hub_reachable()


def hf_docs(dataset, split=None, strip=False):
    """Stream the text field of a Hugging Face dataset (nothing held in memory beyond the current rows): each
    document as the dataset gives it, as build-nanogpt tokenises it, or with strip=True stripped of the whitespace
    around it, empty ones dropped. Checks the name and the network now, so a bad call fails before anything is
    written."""
    if dataset not in DATASETS:
        raise ValueError(f"--dataset {dataset!r}: unknown, expected one of {', '.join(DATASETS)} (or --input PATH)")
    spec = DATASETS[dataset]
    ok, why = hub_reachable()
    if not ok:
        raise ValueError(f"--dataset {dataset}: the Hugging Face hub is unreachable ({why}); "
                         "use --input PATH for a local corpus")
    from datasets import load_dataset
    ds = load_dataset(spec["path"], name=spec["name"], split=split or spec["split"], streaming=True)
    texts = (row[spec["text"]] for row in ds)
    return (t.strip() for t in texts if t.strip()) if strip else texts


def buffer_shuffle(docs, buffer_size, seed):
    """Shuffle a stream with a fixed-size buffer (like a shuffle buffer in tf.data): memory is buffer_size
    documents, a document moves at most ~buffer_size places on average, and the order depends only on the seed."""
    r = random.Random(seed)
    buf = []
    for doc in docs:
        if len(buf) < buffer_size:
            buf.append(doc)
            continue
        i = r.randrange(buffer_size)
        yield buf[i]
        buf[i] = doc
    r.shuffle(buf)
    yield from buf


# ----------------------------------------------------------------------------------------------------------
# parallel tokenisation: batches of documents -> (tokens with an eot before every document, document lengths)

_worker = {}


def _init_worker(tokenizer_ref, dtype, in_pool=False):
    if in_pool:  # Ctrl-C is handled once, by the main process, which then stops the pool
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:   # a pool restarts a worker whose initializer fails, forever: the error waits for the first batch
            _start_worker(tokenizer_ref, dtype)
        except Exception as e:
            _worker["error"] = e
    else:
        _start_worker(tokenizer_ref, dtype)


def _start_worker(tokenizer_ref, dtype):
    tok = bpe.load_tokenizer(tokenizer_ref)
    if tok.eot_id is None:
        raise ValueError(f"{tokenizer_ref}: the tokenizer has no {EOT} special token, needed to separate documents")
    # encode_ordinary: a literal "<|endoftext|>" inside a document is text, so the only eot ids are our separators
    _worker.update(encode=tok.encode_ordinary, eot=tok.eot_id, dtype=np.dtype(dtype).newbyteorder("<"))


def _encode_batch(docs):
    if "error" in _worker:
        raise _worker["error"]
    encode, eot = _worker["encode"], _worker["eot"]
    ids, lengths = [], []
    for doc in docs:
        t = encode(doc)
        ids.append(eot)
        ids.extend(t)
        lengths.append(len(t) + 1)
    return np.array(ids, dtype=_worker["dtype"]), np.array(lengths, dtype=np.int64)


def _batches(docs, batch_chars):
    batch, size = [], 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_docs(docs, tokenizer_ref, dtype, num_workers=None, batch_chars=1 << 20):
    """Yield (tokens, doc_lengths) per batch, in order, tokenised on num_workers processes (default: all cores).
    At most 2 batches per worker are in flight, so memory stays bounded however fast the documents arrive
    (Pool.imap alone would read the whole input ahead)."""
    num_workers = num_workers or os.cpu_count() or 1
    batches = _batches(docs, batch_chars)
    if num_workers == 1:
        _init_worker(tokenizer_ref, dtype)
        yield from (_encode_batch(b) for b in batches)
        return
    slots, stop, error = threading.Semaphore(2 * num_workers), threading.Event(), []

    def gated():  # runs in the pool's task-feeding thread
        try:
            for b in batches:
                slots.acquire()
                if stop.is_set():
                    return
                yield b
        except Exception as e:  # an unreadable input surfaces in the main thread, after the batches before it
            error.append(e)

    with Pool(num_workers, initializer=_init_worker, initargs=(tokenizer_ref, dtype, True)) as pool:
        try:
            for out in pool.imap(_encode_batch, gated()):
                slots.release()
                yield out
        finally:
            stop.set()
            for _ in range(2 * num_workers + 1):
                slots.release()
    if error:
        raise error[0]


# ----------------------------------------------------------------------------------------------------------
# writing token files: atomic (write .tmp, then rename), with the sidecar train.py's load_tokens checks


def _atomic_write(path, data: bytes):
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:   # a full disk: no temp file left, and the error names the file
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None


def _write_json(path, obj):
    _atomic_write(path, (json.dumps(obj, indent=1) + "\n").encode())


def sidecar(dtype, vocab_size, num_tokens, num_docs, tokenizer, fingerprint, eot_id):
    return {"format": "tokens-v1", "dtype": dtype, "vocab_size": vocab_size, "num_tokens": int(num_tokens),
            "num_docs": None if num_docs is None else int(num_docs), "tokenizer": tokenizer,
            "tokenizer_fingerprint": fingerprint, "eot_id": eot_id}


def write_token_file(docs, out_path, tokenizer="gpt2", num_workers=None, dtype=None, progress=False):
    """Tokenise documents (eot before each) into ONE token file + sidecar, streamed to disk. Returns the sidecar."""
    tokenizer = str(tokenizer)
    tok, fingerprint = bpe.load_tokenizer(tokenizer), bpe.tokenizer_fingerprint(tokenizer)
    dtype = choose_dtype(tok.vocab_size, dtype)
    if tok.eot_id is None:
        raise ValueError(f"{tokenizer}: the tokenizer has no {EOT} special token, needed to separate documents")
    n_tokens = n_docs = 0
    bar = bpe.progress_bar(None, f"tokenising into {Path(out_path).name}", "doc", enabled=progress)
    tmp = f"{out_path}.tmp"
    try:
        with open(tmp, "wb") as fh:
            for ids, lengths in encode_docs(docs, tokenizer, dtype, num_workers):
                fh.write(ids.tobytes())
                n_tokens, n_docs = n_tokens + len(ids), n_docs + len(lengths)
                bar.set_postfix_str(f"{n_tokens:,} tokens", refresh=False)
                bar.update(len(lengths))
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as e:   # an unreadable input, Ctrl-C, a full disk: no half-written file left behind
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, str(out_path)) from None
        raise
    bar.close()
    if n_docs == 0:
        os.remove(tmp)
        raise ValueError(f"{out_path}: no documents to tokenise (empty input)")
    meta = sidecar(dtype, tok.vocab_size, n_tokens, n_docs, tokenizer, fingerprint, tok.eot_id)
    os.replace(tmp, out_path)
    _write_json(f"{out_path}.json", meta)
    return meta


def shard_name(index):
    return f"{'val' if index == 0 else 'train'}_{index:06d}.bin"


def write_shards(docs, out_dir, tokenizer="gpt2", shard_size=100_000_000, num_workers=None, dtype=None,
                 source="?", shuffle_docs=False, seed=1337, progress=True, log=print, batch_chars=1 << 20,
                 strip_docs=False):
    """Tokenise a document stream into val_000000.bin, train_000001.bin, ... of shard_size tokens.

    `docs` must be the same stream on every call (same source, same shuffling, stripped or not, as strip_docs
    records): a rerun after an interruption skips the documents already in complete shards. Documents are split
    across shard boundaries, so the shards concatenated are exactly the token stream. Returns the directory's
    meta.json as a dict."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    tokenizer = str(tokenizer)
    if str(Path(tokenizer)) != "gpt2":  # ./tok/ and tok are one folder (but ./gpt2 is a folder, not tiktoken)
        tokenizer = str(Path(tokenizer))
    tok = bpe.load_tokenizer(tokenizer)
    dtype = choose_dtype(tok.vocab_size, dtype)
    if tok.eot_id is None:
        raise ValueError(f"{tokenizer}: the tokenizer has no {EOT} special token, needed to separate documents")
    out = Path(out_dir)
    config = {"source": source, "tokenizer": tokenizer, "tokenizer_fingerprint": bpe.tokenizer_fingerprint(tokenizer),
              "vocab_size": tok.vocab_size, "dtype": dtype, "eot_id": tok.eot_id,
              "eot_position": "before each document",
              "shard_size": shard_size, "shuffle_docs": shuffle_docs, "seed": seed if shuffle_docs else None,
              "strip_docs": strip_docs}
    started = not (out / "meta.json").exists()
    meta = _resume_or_start(out, config)
    if meta["complete"]:
        log(f"{out}: already complete ({meta['num_tokens']:,} tokens in {len(meta['shards'])} shards); nothing to do")
        return meta
    shards = meta["shards"]
    start_doc, drop = (shards[-1]["end_doc"], shards[-1]["end_offset"]) if shards else (0, 0)
    if shards:
        log(f"{out}: resuming after shard {len(shards) - 1} (document {start_doc:,}, token {drop:,} of it)")

    buf = np.empty(shard_size, dtype=np.dtype(dtype).newbyteorder("<"))
    fill = shard_docs = 0
    doc_index = start_doc  # index in the stream of the first document of the current batch
    t0 = time.time()
    new_tokens = new_docs = 0
    bar = bpe.progress_bar(None, f"tokenising into {out}", "doc", enabled=progress, initial=start_doc)

    def flush(end_doc, end_offset):
        nonlocal fill, shard_docs
        index = len(shards)
        name = shard_name(index)
        _atomic_write(out / name, buf[:fill].tobytes())
        _write_json(out / f"{name}.json", sidecar(dtype, tok.vocab_size, fill, shard_docs, tokenizer,
                                                  config["tokenizer_fingerprint"], tok.eot_id))
        shards.append({"file": name, "num_tokens": int(fill), "num_docs": int(shard_docs),
                       "end_doc": int(end_doc), "end_offset": int(end_offset)})
        meta.update(num_tokens=sum(s["num_tokens"] for s in shards), num_docs=int(end_doc + (end_offset > 0)))
        _write_json(out / "meta.json", meta)  # the shard counts as done only once it is listed here
        fill = shard_docs = 0

    try:
        for ids, lengths in encode_docs(islice(docs, start_doc, None), tokenizer, dtype, num_workers, batch_chars):
            ends = np.cumsum(lengths)
            starts = ends - lengths
            pos, drop = drop, 0  # after a resume, the first document's first `drop` tokens are already on disk
            while pos < len(ids):
                take = min(shard_size - fill, len(ids) - pos)
                buf[fill:fill + take] = ids[pos:pos + take]
                shard_docs += int(np.searchsorted(starts, pos + take) - np.searchsorted(starts, pos))
                fill, pos = fill + take, pos + take
                if fill == shard_size:
                    done = int(np.searchsorted(ends, pos, side="right"))  # documents of this batch fully written
                    flush(doc_index + done, pos - (ends[done - 1] if done else 0))
            doc_index += len(lengths)
            new_docs, new_tokens = new_docs + len(lengths), new_tokens + len(ids)
            bar.set_postfix_str(f"{meta['num_tokens'] + fill:,} tokens, shard {len(shards)}", refresh=False)
            bar.update(len(lengths))
        if fill:
            flush(doc_index, 0)
        bar.close()
        if not shards:
            raise ValueError(f"{source}: no documents to tokenise (empty input)")
    except BaseException:   # (a bad input, Ctrl-C, a full disk) before any shard was complete: no meta.json claims
        if started and not shards:   # the folder for a run that wrote nothing
            (out / "meta.json").unlink(missing_ok=True)
        raise
    meta["complete"] = True
    _write_json(out / "meta.json", meta)
    dt = time.time() - t0
    log(f"{out}: {meta['num_docs']:,} documents, {meta['num_tokens']:,} tokens in {len(shards)} shards "
        f"({shard_name(0)} = validation); this run {new_tokens:,} tokens in {dt:.1f}s = "
        f"{new_tokens / max(dt, 1e-9) / 1e6:.2f} M tok/s, {new_docs / max(dt, 1e-9):,.0f} docs/s")
    if len(shards) == 1:
        log(f"{out}: only shard 0 (validation) was written: lower --shard_size (with --fresh) to get training shards")
    return meta


def clear_shards(out_dir, log=print):
    """--fresh: remove what fineweb.py wrote in out_dir (shards, their sidecars, meta.json, a tokenizer it trained
    there), so that the next write_shards starts over. Files it did not write stay."""
    out = Path(out_dir)
    try:   # a folder fineweb.py wrote: its meta.json says so
        ours = json.loads((out / "meta.json").read_text()).get("format") == "fineweb-v1"
    except (OSError, ValueError, AttributeError):
        ours = False
    names = re.compile(r"(val|train)_\d{6}\.bin(\.json)?(\.tmp)?|meta\.json(\.tmp)?|bpe_train\.txt\.tmp")
    shards = [p for p in out.glob("*") if names.fullmatch(p.name)] if ours else []
    for p in shards:
        p.unlink()
    trained = (out / "tokenizer" / "request.json").is_file()   # a tokenizer trained by --vocab_size
    if trained:
        shutil.rmtree(out / "tokenizer")
    if shards or trained:
        log(f"{out}: --fresh: removed {len([p for p in shards if p.suffix == '.bin'])} shard(s)"
            f"{' and the tokenizer trained there' if trained else ''}")


def refuse_shards_of_another_tokenizer(out_dir):
    """Before --vocab_size trains a tokenizer into out_dir/tokenizer (none there yet): token files already in out_dir
    were made with another one. Said now, not by write_shards once the training is done."""
    out = Path(out_dir)
    if (out / "meta.json").is_file():
        raise ValueError(f"{out}: holds shards (meta.json) made with another tokenizer than the one --vocab_size "
                         "would train now: choose another --out_dir, or --fresh to start over")
    _refuse_foreign_token_files(out)


def _refuse_foreign_token_files(out):
    """Token files in out that fineweb.py did not write (no meta.json beside them): refused, naming their tokenizer."""
    if out.exists() and any(out.glob("*.bin")):
        owner = next(out.glob("*.bin.json"), None)
        try:
            who = json.loads(owner.read_text()).get("tokenizer") if owner else "an unknown tokenizer"
        except (ValueError, AttributeError):   # a sidecar that is not JSON, or not an object
            who = "an unknown tokenizer"
        raise ValueError(f"{out}: already holds token files (made with {who!r}) but no meta.json from fineweb.py: "
                         "choose an empty --out_dir")


def _resume_or_start(out, config):
    """Read out/meta.json if this configuration wrote it; refuse a directory written with anything else."""
    meta_path = out / "meta.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError as e:
            raise ValueError(f"{meta_path}: not valid JSON ({e}): empty the directory and start again") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) or \
                not isinstance(meta.get("shards"), list):
            raise ValueError(f"{meta_path}: not a fineweb.py meta.json (no config and shards): empty the directory "
                             "and start again")
        old = {"strip_docs": True, **meta["config"]}   # (a folder written before this was recorded: stripped)
        same = ("tokenizer", "tokenizer_fingerprint")
        if [old.get(k) for k in same] != [config[k] for k in same]:
            raise ValueError(f"{out}: holds shards made with tokenizer {old.get('tokenizer')!r} "
                             f"(fingerprint {old.get('tokenizer_fingerprint')}), not {config['tokenizer']!r} "
                             f"({config['tokenizer_fingerprint']}): choose another --out_dir, or --fresh to start over")
        diff = [k for k in config if old.get(k) != config[k]]
        was, now = str(old.get("source")).split("@")[0], str(config["source"]).split("@")[0]
        if diff == ["source"] and was == now and now.startswith("file:"):
            raise ValueError(f"{out}: its shards were made from {now[5:]} as it was before: the input has changed "
                             f"since (size or modification time); use another --out_dir, or --fresh to start over")
        if diff:
            was = ", ".join(f"{k}={old.get(k)!r}" for k in diff)
            raise ValueError(f"{out}: was written with different settings ({was}): "
                             "rerun with the same flags to resume, --fresh to start over, or use another --out_dir")
        for s in meta["shards"]:  # every listed shard must be intact, or the resume would be silently wrong
            p = out / s["file"]
            if not p.is_file() or p.stat().st_size != s["num_tokens"] * np.dtype(config["dtype"]).itemsize:
                raise ValueError(f"{p}: missing or of the wrong size for the {s['num_tokens']:,} tokens "
                                 "meta.json lists: empty the directory and start again")
        return meta
    _refuse_foreign_token_files(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": "fineweb-v1", "config": config, "shards": [], "num_tokens": 0, "num_docs": 0, "complete": False}
    _write_json(meta_path, meta)  # claims the directory for this tokenizer and these settings
    return meta


# ----------------------------------------------------------------------------------------------------------
# the small TinyStories set for `python train.py`: corpus (download or generated) -> BPE -> train.bin / val.bin


def file_sha256(path):
    """The SHA-256 of a file's bytes, read a MiB at a time (the record of a text that preparation made or used)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while b := fh.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def _download_tinystories(splits, log, instead="using the corpus generated by stories.py instead"):
    """TinyStories' splits streamed with `datasets` into text files, each story followed by "\n<|endoftext|>\n":
    splits is [(split, path, max_bytes, max_stories)], a file ending with the first story that reaches max_bytes,
    or with its max_stories-th story (None: no limit). The files are renamed into place only once every split is
    in. Returns True on success; on any failure says why in one line (ending with `instead`), returns False."""
    ok, why = hub_reachable()
    if not ok:
        log(f"TinyStories download unavailable ({why}): {instead}")
        return False
    try:
        for split, path, max_bytes, max_stories in splits:
            written = n = 0
            with open(f"{path}.tmp", "w", encoding="utf-8", newline="") as fh:
                for doc in hf_docs("tinystories", split=split, strip=True):
                    doc = doc + "\n" + EOT + "\n"
                    fh.write(doc)
                    written, n = written + len(doc.encode()), n + 1
                    if (max_bytes is not None and written >= max_bytes) or n == max_stories:
                        break
        for _, path, *_ in splits:
            os.replace(f"{path}.tmp", path)
        return True
    except Exception as e:  # network errors come in many types; any of them means "fall back"
        for _, path, *_ in splits:
            Path(f"{path}.tmp").unlink(missing_ok=True)
        log(f"TinyStories download failed ({type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}): "
            f"{instead}")
        return False


def prepare_tinystories(data_dir="data/tinystories", vocab_size=2048, allow_download=True, fresh=False, log=print,
                        corpus_bytes=4_000_000, val_fraction=0.05, seed=0, num_workers=None, flag="--out_dir",
                        keep=None):
    """Make data_dir/{train,val}.bin (+ sidecars) and data_dir/tokenizer for train.py, reusing every step
    already done (recorded in data_dir/prepared.json, written first, so an interrupted run goes on); fresh=True
    redoes everything. A folder without prepared.json that holds any of these files is someone else's: refused
    (flag: the option naming data_dir, said in the error), unless fresh. keep: (corpus_bytes, why) of a corpus that
    must stay (a checkpoint was trained on it): while the folder holds it, a request for another is refused, saying
    why, before anything is rewritten.

    1. corpus: TinyStories (first corpus_bytes; None = the whole set) when the hub is reachable, else
       stories.py's generated stories -> data_dir/train.txt, val.txt (val_fraction of the bytes);
    2. tokenizer: bpe.py BPE with vocab_size ids (<|endoftext|> included) trained on train.txt;
    3. tokens: train.bin / val.bin with an eot before every story, on all cores.
    Returns dict(data_dir=..., tokenizer=...) (plus source and token counts)."""
    if corpus_bytes is not None and corpus_bytes < 2:
        raise ValueError(f"corpus_bytes must be at least 2 (train + validation) or None (all of TinyStories), "
                         f"got {corpus_bytes}")
    d = Path(data_dir)
    train_txt, val_txt, tok_dir, state_path = d / "train.txt", d / "val.txt", d / "tokenizer", d / "prepared.json"
    outputs = [train_txt, val_txt, tok_dir] + [d / f"{s}.bin{x}" for s in ("train", "val") for x in ("", ".json")]
    theirs = [p.name for p in outputs if p.exists()]
    if theirs and not fresh and not state_path.exists():   # never over someone's own files
        raise ValueError(f"{d}: holds {', '.join(theirs)} that data preparation did not write (no prepared.json): "
                         f"choose another {flag}, or --fresh to replace them")
    if corpus_bytes is None and (fresh or not state_path.is_file()):  # fail before anything is written
        ok, why = hub_reachable() if allow_download else (False, "downloads disabled")
        if not ok:
            raise ValueError(f"all of TinyStories (--corpus_bytes 0) needs the download ({why}); "
                             "offline, give the generated corpus a size such as --corpus_bytes 4000000")
    if fresh and d.exists():
        for p in [state_path] + [p for p in outputs if p != tok_dir]:
            p.unlink(missing_ok=True)
        shutil.rmtree(tok_dir, ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)
    try:
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    except ValueError:   # not JSON (or not text): a record of what was done that cannot be trusted
        state = None
    if not isinstance(state, dict):
        log(f"{state_path}: unreadable, so the data is prepared again")
        state = {}
    want = {"corpus_bytes": corpus_bytes, "val_fraction": val_fraction, "seed": seed}
    c = state.get("corpus", {})
    if keep and (c.get("request") or {}).get("corpus_bytes") == keep[0] != corpus_bytes:
        raise ValueError(f"{d}: prepared with corpus_bytes {keep[0]}, not {corpus_bytes}, and {keep[1]}")
    if not state_path.exists():   # the mark of a folder this function fills, written before any of its files
        _write_json(state_path, {})
    t0 = time.time()

    # 1. corpus
    if c.get("request") == want and train_txt.is_file() and val_txt.is_file() and \
            (c.get("train_sha256"), c.get("val_sha256")) == (file_sha256(train_txt), file_sha256(val_txt)):
        log(f"corpus: reusing {d}/train.txt, val.txt ({c['source']})")
    else:
        state = {}
        val_bytes = None if corpus_bytes is None else max(1, int(corpus_bytes * val_fraction))
        train_bytes = None if corpus_bytes is None else corpus_bytes - val_bytes
        source = "TinyStories (roneneldan/TinyStories)"
        if not (allow_download and _download_tinystories([("validation", val_txt, val_bytes, None),
                                                          ("train", train_txt, train_bytes, None)], log)):
            import stories
            if corpus_bytes is None:
                raise ValueError("all of TinyStories (--corpus_bytes 0) needs the download, which "
                                 "failed; the generated corpus needs a size such as --corpus_bytes 4000000")
            if not allow_download:
                log("corpus: downloads disabled: using the corpus generated by stories.py")
            stories.write_corpus(train_txt, train_bytes, seed)
            stories.write_corpus(val_txt, val_bytes, seed + 1)  # another seed: validation stories are new draws
            source = f"generated by stories.py, seed {seed}"
        state["corpus"] = {"request": want, "source": source, "train_sha256": file_sha256(train_txt),
                           "val_sha256": file_sha256(val_txt), "train_bytes": train_txt.stat().st_size,
                           "val_bytes": val_txt.stat().st_size}
        _write_json(state_path, state)
        c = state["corpus"]
        log(f"corpus: {source}: {c['train_bytes']:,} + {c['val_bytes']:,} bytes (train + val)")

    # 2. tokenizer
    want = {"train_sha256": state["corpus"]["train_sha256"], "vocab_size": vocab_size, "special_tokens": [EOT]}
    t = state.get("tokenizer", {})
    if t.get("request") == want and (tok_dir / "vocab.json").is_file() and \
            t.get("fingerprint") == bpe.tokenizer_fingerprint(str(tok_dir)):
        log(f"tokenizer: reusing {tok_dir} (vocab {t.get('vocab_size', vocab_size)})")
    else:
        t1 = time.time()
        vocab, merges = bpe.train_bpe(str(train_txt), vocab_size, [EOT], num_workers=num_workers)
        shutil.rmtree(tok_dir, ignore_errors=True)
        bpe.Tokenizer(vocab, merges, [EOT]).save_dir(str(tok_dir))
        state["tokenizer"] = {"request": want, "fingerprint": bpe.tokenizer_fingerprint(str(tok_dir)),
                              "vocab_size": len(vocab)}   # what was reached: fewer when the text runs out of pairs
        state.pop("tokens", None)
        _write_json(state_path, state)
        log(f"tokenizer: trained BPE, vocab {len(vocab)}, on {train_txt} in {time.time() - t1:.1f}s -> {tok_dir}")

    # 3. tokens
    want = {"tokenizer_fingerprint": state["tokenizer"]["fingerprint"], "train_sha256": state["corpus"]["train_sha256"],
            "val_sha256": state["corpus"]["val_sha256"]}
    k = state.get("tokens", {})
    bins = [d / "train.bin", d / "val.bin"]
    if k.get("request") == want and all(p.is_file() and Path(f"{p}.json").is_file() for p in bins):
        log(f"tokens: reusing {bins[0]} ({k['train_tokens']:,} tokens), {bins[1]} ({k['val_tokens']:,})")
    else:
        t1 = time.time()
        tr, va = [write_token_file(file_docs(txt), out, str(tok_dir), num_workers)
                  for txt, out in zip((train_txt, val_txt), bins)]
        state["tokens"] = {"request": want, "train_tokens": tr["num_tokens"], "val_tokens": va["num_tokens"]}
        _write_json(state_path, state)
        dt = time.time() - t1
        log(f"tokens: {bins[0]} ({tr['num_tokens']:,} tokens, {tr['num_docs']:,} stories), "
            f"{bins[1]} ({va['num_tokens']:,}) "
            f"in {dt:.1f}s ({(tr['num_tokens'] + va['num_tokens']) / max(dt, 1e-9) / 1e3:,.0f} k tok/s)")
    log(f"data ready in {time.time() - t0:.1f}s: {d}")
    return dict(data_dir=str(d), tokenizer=str(tok_dir), source=state["corpus"]["source"],
                train_tokens=state["tokens"]["train_tokens"], val_tokens=state["tokens"]["val_tokens"])


# the speedrun's and experiments.py's text (bench.py speedrun, train.py --preset=speedrun-cpu): the head of each split
HEAD_DIR, HEAD_TRAIN_BYTES, HEAD_VAL_STORIES = "data/tinystories-head", 2 * 2**20, 1000
TINYSTORIES = "TinyStories (roneneldan/TinyStories)"


def _cut(path, num_bytes):
    """Keep the first num_bytes of a UTF-8 text file (less the bytes of a character the cut would split)."""
    data = Path(path).read_bytes()
    if len(data) > num_bytes:
        _atomic_write(path, data[:num_bytes].decode("utf-8", "ignore").encode())


def tinystories_head(out_dir=HEAD_DIR, train_bytes=HEAD_TRAIN_BYTES, val_stories=HEAD_VAL_STORIES,
                     allow_download=True, log=print, seed=0, fresh=False):
    """The speedrun's and experiments.py's text in out_dir: train.txt, the first train_bytes of TinyStories' train
    split (cut there, mid-story), and valid.txt, its first val_stories validation stories, each story followed by
    "\n<|endoftext|>\n". Fetched once through `datasets` (head.json records what and from where), then reused.
    Offline, stories.py's generated stories of the same sizes, with one line saying that figures on them do not
    compare with the published ones; the download is tried again on the next call. Returns (train, valid) paths.
    A folder without head.json (written first) that holds train.txt or valid.txt is someone else's: refused, unless
    fresh (which also fetches again)."""
    d = Path(out_dir)
    train_txt, val_txt, record = d / "train.txt", d / "valid.txt", d / "head.json"
    theirs = [p.name for p in (train_txt, val_txt) if p.exists()]
    if theirs and not fresh and not record.exists():   # never over someone's own files
        raise ValueError(f"{d}: holds {', '.join(theirs)} that fineweb.py --tinystories_head did not write (no "
                         f"head.json): choose another --out_dir, or --fresh to replace them")
    want = {"train_bytes": train_bytes, "val_stories": val_stories}
    try:
        old = {} if fresh else json.loads(record.read_text())
    except (OSError, ValueError):
        old = {}
    cached = isinstance(old, dict) and old.get("request") == want and train_txt.is_file() and val_txt.is_file() and \
        (old.get("train_sha256"), old.get("valid_sha256")) == (file_sha256(train_txt), file_sha256(val_txt))
    if cached and old.get("source") == TINYSTORIES:
        log(f"text: reusing {train_txt}, {val_txt} ({old['source']})")
        return train_txt, val_txt
    instead = "using stories.py's generated stories instead: figures on them do not compare with the published ones"
    d.mkdir(parents=True, exist_ok=True)
    if not record.exists():   # the mark of a folder this function fills, written before its files
        _write_json(record, {})
    if allow_download and _download_tinystories([("validation", val_txt, None, val_stories),
                                                 ("train", train_txt, train_bytes, None)], log, instead):
        _cut(train_txt, train_bytes)
        source = TINYSTORIES
    else:
        if not allow_download:
            log(f"text: downloads disabled: {instead}")
        if cached:   # generated before: the same stories again
            log(f"text: reusing {train_txt}, {val_txt} ({old['source']})")
            return train_txt, val_txt
        import stories
        stories.write_corpus(train_txt, train_bytes, seed)
        _cut(train_txt, train_bytes)
        _atomic_write(val_txt, "".join(s + stories.SEPARATOR
                                       for s in stories.generate_stories(val_stories, seed + 1)).encode())
        source = f"generated by stories.py, seed {seed}"
    _write_json(record, {"request": want, "source": source, "train_sha256": file_sha256(train_txt),
                         "valid_sha256": file_sha256(val_txt)})
    log(f"text: {source}: {train_txt} ({train_txt.stat().st_size:,} bytes), {val_txt} ({val_stories:,} stories, "
        f"{val_txt.stat().st_size:,} bytes)")
    return train_txt, val_txt


def train_tokenizer_on_docs(docs, vocab_size, tok_dir, max_bytes=None, num_workers=None, log=print, source=None):
    """Train a bpe.py tokenizer (with <|endoftext|>) on the first max_bytes of a document stream (None: all)
    and save it to tok_dir; an existing tok_dir trained with the same request is reused (so a resumed run shards
    with the same tokenizer), one trained with another is refused (request.json records what was asked, the
    stream's `source` name included when given). One fineweb.py did not train (no request.json) is reused only at
    vocab_size."""
    tok_dir = Path(tok_dir)
    request = {"vocab_size": vocab_size, "max_bytes": max_bytes, "source": source}
    if (tok_dir / "vocab.json").is_file():
        size = None if (tok_dir / "request.json").is_file() else bpe.load_tokenizer(tok_dir).vocab_size
        if size not in (None, vocab_size):
            raise ValueError(f"{tok_dir}: holds a tokenizer of {size} ids (not trained by fineweb.py), not "
                             f"--vocab_size {vocab_size}: choose another --out_dir, or pass it as --tokenizer without "
                             f"--vocab_size")
        old = json.loads((tok_dir / "request.json").read_text()) if (tok_dir / "request.json").is_file() else request
        old.setdefault("source", source)  # a request.json written before sources were recorded
        if old != request:
            def asked(r):
                return f"vocab_size {r['vocab_size']}, bpe_train_bytes {r['max_bytes'] or 0}" + \
                    (f" on {r['source']}" if r["source"] else "")
            raise ValueError(f"{tok_dir}: holds a tokenizer trained with {asked(old)}, not {asked(request)}: "
                             "choose another --out_dir, or --fresh to start over")
        log(f"tokenizer: reusing {tok_dir}")
        return str(tok_dir)
    tok_dir.parent.mkdir(parents=True, exist_ok=True)
    text, tmp_dir = tok_dir.parent / "bpe_train.txt.tmp", Path(str(tok_dir) + ".tmp")
    written = 0
    try:   # however it ends (a bad input, a full disk), no temp file or half-written tokenizer is left
        with open(text, "w", encoding="utf-8", newline="") as fh:
            for doc in docs:
                fh.write(doc + "\n" + EOT + "\n")
                written += len(doc.encode()) + len(EOT) + 2
                if max_bytes and written >= max_bytes:
                    break
        if not written:
            raise ValueError(f"{source or tok_dir}: no documents to train the tokenizer on (empty input)")
        t0 = time.time()
        vocab, merges = bpe.train_bpe(str(text), vocab_size, [EOT], num_workers=num_workers)
        bpe.Tokenizer(vocab, merges, [EOT]).save_dir(tmp_dir)
        _write_json(tmp_dir / "request.json", request)
        os.replace(tmp_dir, tok_dir)
    finally:
        text.unlink(missing_ok=True)
        shutil.rmtree(tmp_dir, ignore_errors=True)
    log(f"tokenizer: trained BPE, vocab {len(vocab)}, on {written:,} bytes in {time.time() - t0:.1f}s -> {tok_dir}")
    return str(tok_dir)


# ----------------------------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="fineweb-edu", help=f"Hugging Face corpus to stream: {', '.join(DATASETS)}")
    p.add_argument("--input", type=os.path.expanduser, default=None,
                   help="local corpus instead: a text file (documents separated by "
                   f"{EOT}) or a folder (one document per file)")
    p.add_argument("--out_dir", type=os.path.expanduser, default=None,
                   help="output folder; None means data/edu_fineweb10B for the "
                   "default run, else data/<dataset or input name>-<gpt2|bpe> "
                   "(data/tinystories with --prepare_tinystories, "
                   f"{HEAD_DIR} with --tinystories_head)")
    p.add_argument("--tokenizer", type=os.path.expanduser, default="gpt2",
                   help="'gpt2' (tiktoken) or a bpe.py tokenizer directory")
    p.add_argument("--vocab_size", type=int, default=None,
                   help="train a bpe.py tokenizer of this size on the corpus first (saved in OUT_DIR/tokenizer) "
                   "instead of --tokenizer; with --prepare_tinystories the default is 2048")
    p.add_argument("--bpe_train_bytes", type=int, default=100_000_000, help="with --vocab_size: train the tokenizer on "
                   "the first this many bytes of the corpus (0: all of it)")
    p.add_argument("--shard_size", type=int, default=100_000_000, help="tokens per shard; shard 0 is validation")
    p.add_argument("--dtype", default="auto", choices=["auto", "uint16", "uint32"],
                   help="token dtype (auto: uint16 if the vocabulary fits)")
    p.add_argument("--num_workers", type=int, default=os.cpu_count(), help="tokenising processes")
    p.add_argument("--shuffle_docs", action="store_true",
                   help="shuffle documents (through a buffer of --shuffle_buffer)")
    p.add_argument("--shuffle_buffer", type=int, default=20_000, help="documents held in memory for --shuffle_docs")
    p.add_argument("--seed", type=int, default=1337, help="seed for --shuffle_docs")
    p.add_argument("--strip_docs", action="store_true", help="strip the whitespace around each --dataset document "
                   "and drop empty ones (by default they are tokenised as the hub gives them, as build-nanogpt does; "
                   "--input documents are always stripped)")
    p.add_argument("--max_docs", type=int, default=None, help="stop after this many documents (quick tries)")
    p.add_argument("--prepare_tinystories", action="store_true", help="instead: build train.py's default data set "
                   "(TinyStories or the generated corpus, a BPE tokenizer, train.bin/val.bin) in --out_dir")
    p.add_argument("--tinystories_head", action="store_true", help="instead: the speedrun's and experiments.py's text "
                   f"in --out_dir (default {HEAD_DIR}): the first 2 MiB of TinyStories' train split and its first "
                   "1,000 validation stories, fetched once (offline: stories.py's stories, which do not compare)")
    p.add_argument("--corpus_bytes", type=int, default=4_000_000, help="with --prepare_tinystories: bytes of stories "
                   "(0: all of TinyStories, with its official validation split)")
    p.add_argument("--fresh", action="store_true", help="start over: remove OUT_DIR's shards, meta.json and the "
                   "tokenizer trained there first (with --prepare_tinystories: redo every step; with "
                   "--tinystories_head: fetch again)")
    bpe.one_line_errors(p)
    args = p.parse_args()
    for flag, ok, expected in (  # every numeric flag, before anything is downloaded, trained or written
            ("num_workers", args.num_workers is None or args.num_workers >= 1, "a positive number of processes"),
            ("shard_size", args.shard_size >= 1, "a positive number of tokens"),
            ("max_docs", args.max_docs is None or args.max_docs >= 1, "a positive number of documents"),
            ("shuffle_buffer", args.shuffle_buffer >= 1, "a positive number of documents"),
            ("vocab_size", args.vocab_size is None or args.vocab_size >= 257, f"at least 257 ids (256 bytes + {EOT})"),
            ("bpe_train_bytes", args.bpe_train_bytes >= 0, "a number of bytes (0: all of the corpus)"),
            ("corpus_bytes", args.corpus_bytes == 0 or args.corpus_bytes >= 2,
             "at least 2 bytes (train + validation), or 0 for all of TinyStories")):
        if not ok:
            raise SystemExit(f"fineweb.py: --{flag} {getattr(args, flag)}: expected {expected}")
    out_dir = made = None
    try:
        if args.tinystories_head:
            bpe.check_output_path(args.out_dir or HEAD_DIR, "--out_dir", folder=True)
            tinystories_head(args.out_dir or HEAD_DIR, fresh=args.fresh)
            return
        if args.prepare_tinystories:
            out_dir = args.out_dir or "data/tinystories"
            bpe.check_output_path(out_dir, "--out_dir", folder=True)
            made = not Path(out_dir).exists()
            prepare_tinystories(out_dir, args.vocab_size or 2048, fresh=args.fresh,
                                corpus_bytes=args.corpus_bytes or None, num_workers=args.num_workers)
            return
        if args.input:
            check_input(args.input)
            open_docs = lambda: folder_docs(args.input) if Path(args.input).is_dir() else file_docs(args.input)
            source, name = f"file:{Path(args.input).resolve()}@{input_stamp(args.input)}", Path(args.input).stem
        else:
            open_docs = lambda: hf_docs(args.dataset, strip=args.strip_docs)
            source, name = f"hf:{DATASETS.get(args.dataset, {}).get('path')}", args.dataset
        if args.max_docs:  # the same documents train the tokenizer and fill the shards
            open_all, source = open_docs, f"{source}[:{args.max_docs}]"
            open_docs = lambda: islice(open_all(), args.max_docs)
        docs = open_docs()
        tok_name = "bpe" if args.vocab_size or args.tokenizer != "gpt2" else "gpt2"
        default_dir = ("data/edu_fineweb10B" if (name, tok_name) == ("fineweb-edu", "gpt2")
                       else f"data/{name}-{tok_name}")
        out_dir = args.out_dir or default_dir
        bpe.check_output_path(out_dir, "--out_dir", folder=True)   # before the download and the tokenizer training
        made = not Path(out_dir).exists()
        if args.fresh:
            clear_shards(out_dir)
        if args.vocab_size and not (Path(out_dir) / "tokenizer" / "vocab.json").is_file():
            refuse_shards_of_another_tokenizer(out_dir)   # before the training, which write_shards would follow
        if args.vocab_size:
            args.tokenizer = train_tokenizer_on_docs(docs, args.vocab_size, Path(out_dir) / "tokenizer",
                                                     args.bpe_train_bytes or None, args.num_workers, source=source)
            docs = open_docs()
        if args.shuffle_docs:
            docs, source = (buffer_shuffle(docs, args.shuffle_buffer, args.seed),
                            f"{source}|buffer {args.shuffle_buffer}")
        write_shards(docs, out_dir, args.tokenizer, args.shard_size, args.num_workers,
                     args.dtype, source=source, shuffle_docs=args.shuffle_docs, seed=args.seed,
                     strip_docs=args.strip_docs or bool(args.input))
    except ValueError as e:
        _remove_if_empty(out_dir, made)
        raise SystemExit(f"fineweb.py: {e}")
    except OSError as e:   # a full disk: what is complete stays (shards listed in meta.json, prepared.json's steps)
        _remove_if_empty(out_dir, made)
        raise SystemExit(f"fineweb.py: --out_dir {out_dir}: could not write {e.filename or 'in it'} "
                         f"({bpe.write_error(e)}); what was complete is kept: free some space, then rerun the same "
                         f"command to go on")
    except KeyboardInterrupt:
        _remove_if_empty(out_dir, made)
        raise SystemExit("\nfineweb.py: interrupted; rerun the same command to resume after the last complete shard")


def _remove_if_empty(folder, made):
    """A failed run leaves no empty --out_dir of its own making behind."""
    if made:
        with contextlib.suppress(OSError):   # not empty: something complete is kept there
            Path(folder).rmdir()


if __name__ == "__main__":
    main()
