"""Token data for twell.train: a prepared token folder (uint16 ids on disk, memory-mapped), any
folder of plain-text files, a Hugging Face `datasets` dataset, or a synthetic sequence task.

A token folder (what scripts/prepare-corpus and `TokenData.save` write): train.bin and val.bin
(little-endian uint16 token ids, documents each followed by the end-of-text id; or train.bin.xz
and val.bin.xz, the same xz-compressed), meta.json ({"format": "twell-tokens-1", "vocab_size",
"eos_id", ..., and "val_ranges" {source: [start, end]} where the validation ids hold several
sources: validation then reports a cross-entropy per source) and, where there is one,
tokenizer.json.

Batches are random windows of seq_len + 1 tokens (inputs and their next-token targets). Window
starts are drawn from numpy's PCG64 seeded with (seed, rank, batch index): a batch depends on
nothing else, so a run resumes at any batch index, and each rank of a (rank, world_size) run draws
from its own contiguous 1/world_size of the token stream. Validation uses fixed, non-overlapping
windows of the validation ids, rank r taking every world_size-th one.

Several processes training one model (python -m twell.train --dist) use `part` and `parts`
instead: every process draws the batch one process would (the same windows, the same state) and
keeps its slice of it, rows [part * B / parts, (part + 1) * B / parts); the validation windows of
one process are dealt out the same way (process p takes every parts-th). Together the processes
see exactly one process's tokens, none twice, whatever their number.
"""
import hashlib
import json
import lzma
import os
import sys

import numpy as np

from twell.train import files
from twell.train.files import InputError

FORMAT = "twell-tokens-1"
EOS_TOKEN = "<|endoftext|>"
# A byte-level BPE's vocabulary: at least its 256 bytes and <|endoftext|>; at most 2^20.
BPE_SIZES = (257, 1 << 20)
TOKENIZER_LIMIT = 256 * files.MiB  # a tokenizer.json


class RandomWindows:
    """Batches [batch_size, seq_len + 1] (int64) of random windows of `tokens`; `position` is
    the index of the next batch (checkpointed through state_dict)."""

    def __init__(self, tokens, batch_size, seq_len, *, seed=0, rank=0, world_size=1, part=0,
                 parts=1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")
        if not 0 <= part < parts or batch_size % parts:
            raise ValueError(f"part: expected 0 <= part < parts ({parts}) dividing the batch size "
                             f"{batch_size}, got {part}")
        n = len(tokens)
        self.lo, self.hi = n * rank // world_size, n * (rank + 1) // world_size
        if self.hi - self.lo < seq_len + 1:
            raise ValueError(f"the training ids of rank {rank} ({self.hi - self.lo} tokens) are "
                             f"shorter than one window of seq_len + 1 = {seq_len + 1}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.part, self.parts = part, parts  # not in the state: a run resumes on any number
        self.position = 0

    def batch(self, index):
        """Batch `index`: this part's rows of it ([batch_size / parts, seq_len + 1])."""
        rng = np.random.default_rng([self.seed, self.rank, index])
        starts = self.lo + rng.integers(0, self.hi - self.lo - self.seq_len, size=self.batch_size)
        rows = self.batch_size // self.parts
        starts = starts[self.part * rows:(self.part + 1) * rows]
        return np.stack([np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64)
                         for s in starts])

    def __iter__(self):
        return self

    def __next__(self):
        b = self.batch(self.position)
        self.position += 1
        return b

    def state_dict(self):
        return {"position": self.position, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size}

    def load_state_dict(self, state):
        if (state["seed"], state["rank"], state["world_size"]) != (self.seed, self.rank,
                                                                   self.world_size):
            raise ValueError(f"data sampler: the checkpoint was made with seed/rank/world_size "
                             f"{state['seed']}/{state['rank']}/{state['world_size']}, this run "
                             f"has {self.seed}/{self.rank}/{self.world_size}")
        self.position = int(state["position"])


def eval_starts(length, batch_size, seq_len, *, max_batches=None, rank=0, world_size=1):
    """The window starts of eval_windows, in batches: fixed non-overlapping windows (stride
    seq_len), rank r taking every world_size-th; with max_batches, that many batches' windows
    spread evenly over the validation ids (so every part, every source, is in)."""
    count = (length - 1) // seq_len
    if count < 1:
        raise ValueError(f"the validation ids ({length} tokens) are shorter than one window "
                         f"of seq_len + 1 = {seq_len + 1}")
    windows = list(range(count))
    if max_batches is not None and max_batches * batch_size * world_size < count:
        keep = max_batches * batch_size * world_size
        windows = [count * i // keep for i in range(keep)]
    mine = [w * seq_len for w in windows[rank::world_size]]
    return [mine[b:b + batch_size] for b in range(0, len(mine), batch_size)]


def deal_starts(batches, part, parts):
    """The window starts of `batches` (eval_starts of one process) that process `part` of `parts`
    takes: every parts-th window, in batches of ceil(batch_size / parts) (batch_size: the first
    batch's), so that the parts together run each window once."""
    if parts == 1:
        return batches
    flat = [s for b in batches for s in b]
    size = -(-max((len(b) for b in batches), default=1) // parts)
    mine = flat[part::parts]
    return [mine[b:b + size] for b in range(0, len(mine), size)]


def eval_windows(tokens, batch_size, seq_len, *, max_batches=None, rank=0, world_size=1):
    """Batches of the windows eval_starts gives (each validation token a target at most once): a
    list of int64 arrays [<= batch_size, seq_len + 1]."""
    return [np.stack([np.asarray(tokens[i:i + seq_len + 1], dtype=np.int64) for i in starts])
            for starts in eval_starts(len(tokens), batch_size, seq_len, max_batches=max_batches,
                                      rank=rank, world_size=world_size)]


class TokenData:
    """Training and validation token ids (1-D integer arrays, memory-mapped or in memory), the
    vocabulary size, the end-of-text id (None: documents are not separated) and a meta dict."""

    def __init__(self, train, val, vocab_size, eos_id=None, meta=None, tokenizer=None,
                 val_sources=()):
        self.train, self.val = train, val
        self.val_sources = list(val_sources)  # [(source, start, end)] of the validation ids
        self.vocab_size, self.eos_id = int(vocab_size), eos_id
        self.meta = dict(meta or {})
        self.tokenizer = tokenizer

    def sampler(self, batch_size, seq_len, *, seed=0, rank=0, world_size=1, part=0, parts=1):
        return RandomWindows(self.train, batch_size, seq_len, seed=seed, rank=rank,
                             world_size=world_size, part=part, parts=parts)

    def val_starts(self, batch_size, seq_len, *, max_batches=None, rank=0, world_size=1, part=0,
                   parts=1):
        """The window starts of val_batches (same arguments), in batches."""
        return deal_starts(eval_starts(len(self.val), batch_size, seq_len,
                                       max_batches=max_batches, rank=rank,
                                       world_size=world_size), part, parts)

    def val_batches(self, batch_size, seq_len, *, max_batches=None, rank=0, world_size=1, part=0,
                    parts=1):
        """Validation batches (eval_windows; with parts > 1, this part's share of one process's
        windows, deal_starts)."""
        return [np.stack([np.asarray(self.val[i:i + seq_len + 1], dtype=np.int64) for i in b])
                for b in self.val_starts(batch_size, seq_len, max_batches=max_batches, rank=rank,
                                         world_size=world_size, part=part, parts=parts)]

    def val_source_ids(self, batch_size, seq_len, *, max_batches=None, rank=0, world_size=1,
                       part=0, parts=1):
        """For the batches of val_batches (same arguments): per batch an int64 array
        [<= batch_size, seq_len] giving the source (an index into val_sources) of each target
        token; None where the validation ids hold one source."""
        if len(self.val_sources) < 2:
            return None
        ends = np.array([end for _, _, end in self.val_sources])
        offsets = np.arange(1, seq_len + 1)
        return [np.searchsorted(ends, np.asarray(starts)[:, None] + offsets, side="right")
                for starts in self.val_starts(batch_size, seq_len, max_batches=max_batches,
                                              rank=rank, world_size=world_size, part=part,
                                              parts=parts)]

    def check_ids(self, what):
        """InputError naming `what` where an id is not below the vocabulary size."""
        for name, ids in (("training", self.train), ("validation", self.val)):
            top = max((int(ids[i:i + (1 << 24)].max()) for i in range(0, len(ids), 1 << 24)),
                      default=-1)
            if top >= self.vocab_size:
                raise InputError(what, f"token ids below the vocabulary size {self.vocab_size}",
                                 f"the id {top} in the {name} split")

    def describe(self):
        return (f"{self.meta.get('source_name', 'data')}: {len(self.train):,} training and "
                f"{len(self.val):,} validation tokens, vocabulary {self.vocab_size}")

    def save(self, folder):
        """Writes a token folder (train.bin, val.bin, meta.json, tokenizer.json where the
        tokenizer can save itself) that load_token_folder reads back."""
        if self.vocab_size > 65536:
            raise ValueError(f"a token folder holds uint16 ids; vocabulary {self.vocab_size}")
        os.makedirs(folder, exist_ok=True)
        for name in ("train", "val"):
            np.asarray(getattr(self, name), dtype="<u2").tofile(os.path.join(folder, f"{name}.bin"))
        meta = dict(self.meta, format=FORMAT, dtype="uint16", byteorder="little",
                    vocab_size=self.vocab_size, eos_id=self.eos_id,
                    tokens={"train": len(self.train), "val": len(self.val)})
        if self.tokenizer is not None and self.tokenizer.save(os.path.join(folder,
                                                                           "tokenizer.json")):
            meta["tokenizer"] = "tokenizer.json"
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        return folder


def is_token_folder(path):
    return os.path.lexists(os.path.join(path, "meta.json")) and any(
        os.path.lexists(os.path.join(path, n)) for n in ("train.bin", "train.bin.xz"))


# An xz token file is refused past this many bytes, compressed or decompressed (its ids
# decompress to memory; a count in meta.json can lower the bound, never raise it).
XZ_LIMIT = 1 << 31


def _token_ids(folder, name, want):
    """The ids of folder/NAME.bin (memory-mapped) or, where there is none, NAME.bin.xz
    (decompressed in memory: exactly `want` ids where meta.json gives a count, and at most 2^31
    bytes either way)."""
    path = os.path.join(folder, f"{name}.bin")
    if os.path.lexists(path) or not os.path.lexists(path + ".xz"):
        size = files.check_regular(path, path)
        if size == 0 or size % 2:
            raise InputError(path, "at least one whole uint16 token id", f"{size} bytes")
        if want is not None and want != size // 2:
            raise InputError(path, f"{want!r} token ids (meta.json's tokens.{name})"[:80],
                             f"{size // 2}")
        return np.memmap(path, dtype="<u2", mode="r")
    path += ".xz"
    limit = min(2 * want, XZ_LIMIT) if type(want) is int and want > 0 else XZ_LIMIT
    packed = files.read_bytes(path, path, XZ_LIMIT)
    try:
        raw = lzma.LZMADecompressor().decompress(packed, max_length=limit + 1)
    except lzma.LZMAError as e:
        raise InputError(path, "an xz stream of uint16 token ids", f"corrupt data ({e})") from None
    if len(raw) == 0 or len(raw) % 2 or len(raw) > limit or (want is not None
                                                            and len(raw) != 2 * want):
        raise InputError(path, f"{want!r} token ids (meta.json's tokens.{name})"[:80]
                         if want is not None else "at least one whole uint16 token id",
                         f"{len(raw)} bytes once decompressed" if len(raw) <= limit
                         else f"more than {limit} bytes once decompressed")
    return np.frombuffer(raw, dtype="<u2")


def _val_sources(where, meta, val_len):
    """[(source, start, end)] from meta.json's "val_ranges" (token ranges of the validation ids
    that tile them in order), [] where it has none."""
    ranges = meta.get("val_ranges")
    if ranges is None:
        return []
    what = f"{where}: val_ranges"
    if not isinstance(ranges, dict) or not ranges:
        raise InputError(what, "an object of source: [start, end]", type(ranges).__name__)
    out, at = [], 0
    for name, r in sorted(ranges.items(), key=lambda kv: kv[1][0] if isinstance(kv[1], list)
                          and kv[1] and type(kv[1][0]) is int else -1):
        if not (isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r)
                and r[0] == at and r[1] > r[0]):
            raise InputError(f"{what}.{name}"[:120], f"[{at}, end > {at}] (ranges tiling the "
                             "validation ids in order)", repr(r)[:60])
        out.append((name, r[0], r[1]))
        at = r[1]
    if at != val_len:
        raise InputError(what, f"ranges ending at the validation ids' count {val_len}", str(at))
    return out


def load_token_folder(folder):
    """A token folder as TokenData, every file checked first: meta.json (a JSON object: format,
    little-endian uint16 ids, vocab_size 1 to 65536, eos_id null or below it, the token counts
    where it has them, "val_ranges" where the validation ids hold several sources), train.bin and
    val.bin (regular files of at least one whole uint16 id, memory-mapped) or train.bin.xz and
    val.bin.xz (scripts/prepare-corpus: decompressed in memory), every id below vocab_size."""
    where = os.path.join(folder, "meta.json")
    meta = files.read_json(where, where)
    if not isinstance(meta, dict):
        raise InputError(where, "a JSON object", type(meta).__name__)
    if (meta.get("format"), meta.get("dtype"), meta.get("byteorder", "little")) != (
            FORMAT, "uint16", "little"):
        raise InputError(where, f"format {FORMAT!r} with little-endian uint16 ids",
                         f"{meta.get('format')!r} / {meta.get('dtype')!r} / "
                         f"{meta.get('byteorder')!r}"[:120])
    vocab, eos, counts = meta.get("vocab_size"), meta.get("eos_id"), meta.get("tokens")
    if type(vocab) is not int or not 1 <= vocab <= 65536:
        raise InputError(f"{where}: vocab_size", "an integer from 1 to 65536", repr(vocab)[:40])
    if eos is not None and (type(eos) is not int or not 0 <= eos < vocab):
        raise InputError(f"{where}: eos_id", f"null or an integer below {vocab}", repr(eos)[:40])
    ids = {n: _token_ids(folder, n, counts.get(n) if isinstance(counts, dict) else None)
           for n in ("train", "val")}
    meta.setdefault("source_name", folder)
    data = TokenData(ids["train"], ids["val"], vocab, eos, meta,
                     val_sources=_val_sources(where, meta, len(ids["val"])))
    data.check_ids(os.path.join(folder, "*.bin"))
    return data


# ---- tokenizers -------------------------------------------------------------------------------

class ByteEncoder:
    """Byte-level fallback: ids 0..255 are the UTF-8 bytes, 256 is the end of text."""
    vocab_size, eos_id, name = 257, 256, "bytes"

    def encode_batch(self, texts):
        return [list(t.encode("utf-8")) for t in texts]

    def save(self, path):
        return False


class HFTokenizersEncoder:
    """A `tokenizers.Tokenizer` (a tokenizer.json)."""

    def __init__(self, tok, name="tokenizer.json"):
        self.tok, self.name = tok, name
        self.vocab_size = tok.get_vocab_size()
        self.eos_id = next((tok.token_to_id(t) for t in (EOS_TOKEN, "</s>", "<eos>", "<|eos|>")
                            if tok.token_to_id(t) is not None), None)

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def save(self, path):
        self.tok.save(path)
        return True


class CallableEncoder:
    """Anything with encode(text) (a transformers tokenizer, ...): its eos_token_id and len()."""

    def __init__(self, tok):
        self.tok, self.name = tok, type(tok).__name__
        self.eos_id = getattr(tok, "eos_token_id", None)
        self.vocab_size = len(tok) if hasattr(tok, "__len__") else tok.vocab_size

    def encode_batch(self, texts):
        out = []
        for t in texts:
            try:
                ids = self.tok.encode(t, add_special_tokens=False)
            except TypeError:
                ids = self.tok.encode(t)
            out.append(list(getattr(ids, "ids", ids)))
        return out

    def save(self, path):
        return False


def train_bpe(texts, vocab_size):
    """A byte-level BPE tokenizer (Hugging Face `tokenizers`) trained on `texts`, with
    <|endoftext|> as id 0."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ImportError("training a BPE tokenizer needs the `tokenizers` package: "
                          "pip install tokenizers (or pass tokenizer=None for bytes)") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def make_encoder(tokenizer, train_texts=()):
    """tokenizer: None (bytes), an int (train a byte-level BPE of that vocabulary on the training
    texts), a path to a tokenizer.json or to a folder holding one (read as twell.train.files
    reads files), a tokenizers.Tokenizer, an encoder of this module, or any object with
    encode(text)."""
    if tokenizer is None:
        return ByteEncoder()
    if isinstance(tokenizer, (ByteEncoder, HFTokenizersEncoder, CallableEncoder)):
        return tokenizer
    if isinstance(tokenizer, int) and not isinstance(tokenizer, bool):
        if not BPE_SIZES[0] <= tokenizer <= BPE_SIZES[1]:
            raise InputError("tokenizer", f"a BPE vocabulary size from {BPE_SIZES[0]} to "
                             f"{BPE_SIZES[1]}", tokenizer)
        return HFTokenizersEncoder(train_bpe(list(train_texts), tokenizer),
                                   f"byte-level BPE {tokenizer}")
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ImportError(f"reading {path} needs the `tokenizers` package: "
                              "pip install tokenizers") from None
        text = files.read_bytes(path, path, TOKENIZER_LIMIT).decode("utf-8", errors="replace")
        try:
            tok = Tokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a plain Exception for what it cannot parse
            raise InputError(path, "a tokenizer.json of the tokenizers library",
                             f"one it cannot read ({str(e)[:120]})") from None
        return HFTokenizersEncoder(tok, path)
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "get_vocab_size"):
        return HFTokenizersEncoder(tokenizer)
    if hasattr(tokenizer, "encode"):
        return CallableEncoder(tokenizer)
    raise TypeError(f"tokenizer: expected None, an int, a path, a tokenizers.Tokenizer or an "
                    f"object with encode(), got {type(tokenizer).__name__}")


# ---- documents to tokens ----------------------------------------------------------------------

def _hash_permille(key):
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:4], "big") % 1000


def _ids(encoder, texts):
    dtype = np.uint16 if encoder.vocab_size <= 65536 else np.int32
    out = []
    for start in range(0, len(texts), 1024):
        for ids in encoder.encode_batch(texts[start:start + 1024]):
            out.append(np.asarray(ids, dtype=dtype))
            if encoder.eos_id is not None:
                out.append(np.asarray([encoder.eos_id], dtype=dtype))
    return np.concatenate(out) if out else np.zeros(0, dtype)


def from_documents(docs, tokenizer=None, *, val_permille=20, name="documents"):
    """TokenData from (key, text) pairs. A document goes to validation when the SHA-256 of its key
    (first 4 bytes, big-endian) modulo 1000 is below val_permille. Where that leaves either side
    empty (a few documents), the last val_permille / 1000 of the tokens (at least one) are the
    validation ids instead. `tokenizer`: see make_encoder (an int trains a BPE on the training
    documents)."""
    docs = [(k, t) for k, t in docs if t]
    if not docs:
        raise ValueError(f"{name}: no non-empty documents")
    val_docs = [t for k, t in docs if _hash_permille(k) < val_permille]
    train_docs = [t for k, t in docs if _hash_permille(k) >= val_permille]
    by_tokens = not val_docs or not train_docs
    encoder = make_encoder(tokenizer, [t for _, t in docs] if by_tokens else train_docs)
    if by_tokens:
        ids = _ids(encoder, [t for _, t in docs])
        cut = len(ids) - max(1, len(ids) * val_permille // 1000)
        train, val = ids[:cut], ids[cut:]
        split = f"the last {val_permille} per mille of the tokens"
    else:
        train, val = _ids(encoder, train_docs), _ids(encoder, val_docs)
        split = f"by document: sha256(key)[:4] (big-endian) % 1000 < {val_permille}"
    meta = {"source_name": name, "documents": len(docs), "split": split,
            "tokenizer_name": encoder.name}
    return TokenData(train, val, encoder.vocab_size, encoder.eos_id, meta, encoder)


def from_text_folder(path, tokenizer=None, *, val_permille=20, suffixes=None):
    """TokenData from every plain-text file under `path` (recursively, hidden files skipped, in
    sorted order; `suffixes` such as (".txt",) to filter), one document per file, keyed by its
    path relative to `path`. See from_documents for the split and `tokenizer`."""
    if not os.path.isdir(path):
        raise ValueError(f"{path}: not a folder")
    docs = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(names):
            if f.startswith(".") or (suffixes and not f.endswith(tuple(suffixes))):
                continue
            full = os.path.join(root, f)
            docs.append((os.path.relpath(full, path), files.read_text(full, full)))
    if not docs:
        raise ValueError(f"{path}: no text files")
    return from_documents(docs, tokenizer, val_permille=val_permille, name=path)


def from_hf_dataset(name_or_obj, text_field="text", tokenizer=None, *, split="train",
                    config=None, max_docs=None, val_permille=20):
    """TokenData from a Hugging Face dataset: a name for datasets.load_dataset(name, config,
    split=split) (needs `pip install datasets`, and the dataset on disk or a network), or any
    iterable of rows (a datasets.Dataset, a list of dicts) whose `text_field` holds the text.
    Rows are keyed by their index for the split (see from_documents)."""
    if isinstance(name_or_obj, str):
        try:
            import datasets
        except ImportError:
            raise ImportError(f"from_hf_dataset({name_or_obj!r}) needs the Hugging Face datasets "
                              "library: pip install datasets") from None
        rows, name = datasets.load_dataset(name_or_obj, config, split=split), name_or_obj
    else:
        rows, name = name_or_obj, type(name_or_obj).__name__
    docs = []
    for i, row in enumerate(rows):
        if max_docs is not None and i >= max_docs:
            break
        try:
            text = row[text_field]
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"{name}: row {i} has no field {text_field!r}") from None
        if not isinstance(text, str):
            raise InputError(f"{name}: row {i}: {text_field}", "text", type(text).__name__)
        docs.append((str(i), text))
    return from_documents(docs, tokenizer, val_permille=val_permille, name=f"hf:{name}")


def synthetic(vocab_size=128, train_tokens=1 << 20, val_tokens=1 << 14, seed=1234):
    """A learnable sequence task needing nothing on disk: runs of 8 to 256 tokens counting up
    modulo the vocabulary from a random start (the next token is the previous plus one, except at
    the start of a run)."""
    rng = np.random.default_rng(seed)

    def stream(n):
        parts, total = [], 0
        while total < n:
            length = int(rng.integers(8, 257))
            parts.append((int(rng.integers(0, vocab_size)) + np.arange(length)) % vocab_size)
            total += length
        return np.concatenate(parts)[:n].astype(np.uint16)

    return TokenData(stream(train_tokens), stream(val_tokens), vocab_size, None,
                     {"source_name": "synthetic", "split": "independent streams"})


def load(spec, tokenizer=None, *, text_field="text", val_permille=20, hf_split="train",
         hf_config=None, max_docs=None):
    """TokenData from a command-line spec: "synthetic", a token folder (has meta.json), a folder of
    text files, or "hf:NAME" (a Hugging Face dataset)."""
    if spec == "synthetic":
        return synthetic()
    if spec.startswith("hf:"):
        data = from_hf_dataset(spec[3:], text_field, tokenizer, split=hf_split, config=hf_config,
                               max_docs=max_docs, val_permille=val_permille)
        data.check_ids(spec)
        return data
    if is_token_folder(spec):
        if tokenizer is not None:
            print(f"twell.train: {spec} is already tokenized; --tokenizer ignored",
                  file=sys.stderr)
        return load_token_folder(spec)
    if os.path.isdir(spec):
        data = from_text_folder(spec, tokenizer, val_permille=val_permille)
        data.check_ids(spec)
        return data
    raise InputError(spec, "'synthetic', 'hf:NAME', a token folder (meta.json + train.bin, e.g. "
                     "from scripts/prepare-corpus) or a folder of text files",
                     "no such folder" if not os.path.lexists(spec) else
                     files.kind_of(os.stat(spec).st_mode) if os.path.exists(spec) else
                     "a broken link")
