"""Token data for twell.train: a prepared token folder (uint16 ids on disk, memory-mapped), any
folder of plain-text files, a Hugging Face `datasets` dataset, or a synthetic sequence task.

A token folder (what scripts/prepare-gcide and `TokenData.save` write): train.bin and val.bin
(little-endian uint16 token ids, documents each followed by the end-of-text id), meta.json
({"format": "twell-tokens-1", "vocab_size", "eos_id", ...}) and, where there is one,
tokenizer.json.

Batches are random windows of seq_len + 1 tokens (inputs and their next-token targets). Window
starts are drawn from numpy's PCG64 seeded with (seed, rank, batch index): a batch depends on
nothing else, so a run resumes at any batch index, and each rank of a (rank, world_size) run draws
from its own contiguous 1/world_size of the token stream. Validation uses fixed, non-overlapping
windows of the validation ids, rank r taking every world_size-th one.
"""
import hashlib
import json
import os
import sys

import numpy as np

FORMAT = "twell-tokens-1"
EOS_TOKEN = "<|endoftext|>"


class RandomWindows:
    """Batches [batch_size, seq_len + 1] (int64) of random windows of `tokens`; `position` is
    the index of the next batch (checkpointed through state_dict)."""

    def __init__(self, tokens, batch_size, seq_len, *, seed=0, rank=0, world_size=1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")
        n = len(tokens)
        self.lo, self.hi = n * rank // world_size, n * (rank + 1) // world_size
        if self.hi - self.lo < seq_len + 1:
            raise ValueError(f"the training ids of rank {rank} ({self.hi - self.lo} tokens) are "
                             f"shorter than one window of seq_len + 1 = {seq_len + 1}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.position = 0

    def batch(self, index):
        rng = np.random.default_rng([self.seed, self.rank, index])
        starts = self.lo + rng.integers(0, self.hi - self.lo - self.seq_len, size=self.batch_size)
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


def eval_windows(tokens, batch_size, seq_len, *, max_batches=None, rank=0, world_size=1):
    """Batches of fixed non-overlapping windows (stride seq_len, so each validation token is a
    target once) of `tokens`: a list of int64 arrays [<= batch_size, seq_len + 1]."""
    count = (len(tokens) - 1) // seq_len
    if count < 1:
        raise ValueError(f"the validation ids ({len(tokens)} tokens) are shorter than one window "
                         f"of seq_len + 1 = {seq_len + 1}")
    mine = list(range(rank, count, world_size))
    if max_batches is not None:
        mine = mine[:max_batches * batch_size]
    return [np.stack([np.asarray(tokens[i * seq_len:i * seq_len + seq_len + 1], dtype=np.int64)
                      for i in mine[b:b + batch_size]]) for b in range(0, len(mine), batch_size)]


class TokenData:
    """Training and validation token ids (1-D integer arrays, memory-mapped or in memory), the
    vocabulary size, the end-of-text id (None: documents are not separated) and a meta dict."""

    def __init__(self, train, val, vocab_size, eos_id=None, meta=None, tokenizer=None):
        self.train, self.val = train, val
        self.vocab_size, self.eos_id = int(vocab_size), eos_id
        self.meta = dict(meta or {})
        self.tokenizer = tokenizer

    def sampler(self, batch_size, seq_len, *, seed=0, rank=0, world_size=1):
        return RandomWindows(self.train, batch_size, seq_len, seed=seed, rank=rank,
                             world_size=world_size)

    def val_batches(self, batch_size, seq_len, *, max_batches=None, rank=0, world_size=1):
        return eval_windows(self.val, batch_size, seq_len, max_batches=max_batches, rank=rank,
                            world_size=world_size)

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
    return os.path.isfile(os.path.join(path, "meta.json")) and os.path.isfile(
        os.path.join(path, "train.bin"))


def load_token_folder(folder):
    """A token folder as TokenData (memory-mapped ids)."""
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT or meta.get("dtype") != "uint16":
        raise ValueError(f"{folder}/meta.json: expected format {FORMAT!r} with uint16 ids, got "
                         f"{meta.get('format')!r} / {meta.get('dtype')!r}")
    ids = {n: np.memmap(os.path.join(folder, f"{n}.bin"), dtype="<u2", mode="r")
           for n in ("train", "val")}
    meta.setdefault("source_name", folder)
    return TokenData(ids["train"], ids["val"], meta["vocab_size"], meta.get("eos_id"), meta)


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
    texts), a path to a tokenizer.json or to a folder holding one, a tokenizers.Tokenizer, or any
    object with encode(text)."""
    if tokenizer is None:
        return ByteEncoder()
    if isinstance(tokenizer, int):
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
        return HFTokenizersEncoder(Tokenizer.from_file(path), path)
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
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.startswith(".") or (suffixes and not f.endswith(tuple(suffixes))):
                continue
            full = os.path.join(root, f)
            with open(full, encoding="utf-8", errors="replace") as fh:
                docs.append((os.path.relpath(full, path), fh.read()))
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
            docs.append((str(i), row[text_field]))
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"{name}: row {i} has no field {text_field!r}") from None
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
        return from_hf_dataset(spec[3:], text_field, tokenizer, split=hf_split, config=hf_config,
                               max_docs=max_docs, val_permille=val_permille)
    if is_token_folder(spec):
        if tokenizer is not None:
            print(f"twell.train: {spec} is already tokenized; --tokenizer ignored",
                  file=sys.stderr)
        return load_token_folder(spec)
    if os.path.isdir(spec):
        return from_text_folder(spec, tokenizer, val_permille=val_permille)
    raise ValueError(f"--data {spec!r}: expected 'synthetic', 'hf:NAME', a token folder "
                     f"(meta.json + train.bin, e.g. from scripts/prepare-gcide) or a folder of "
                     f"text files")
