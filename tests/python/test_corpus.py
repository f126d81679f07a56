"""scripts/prepare-corpus on small packages built here with dpkg-deb (no download): every source's
extractor, the fixed split, per-source token ranges that decode back to the validation documents,
the compressed token files, the README and licences, and argument errors."""
import gzip
import json
import lzma
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "prepare-corpus")

pytest.importorskip("tokenizers")
if shutil.which("dpkg-deb") is None:
    pytest.skip("dpkg-deb is not installed", allow_module_level=True)

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega").split()


def prose(seed, n=60):
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n)) + "."


def write(path, data, gz=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = data.encode("utf-8") if isinstance(data, str) else data
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(data)


def build_deb(tmp, package, files):
    """tmp/debs/<package>_1.0_all.deb holding `files` ({relative path: (text, gzip?)})."""
    tree = os.path.join(tmp, "trees", package)
    write(os.path.join(tree, "DEBIAN", "control"),
          f"Package: {package}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\n"
          f"Description: test\n")
    write(os.path.join(tree, "usr", "share", "doc", package, "copyright"),
          f"License: test licence of {package}\n")
    for rel, (text, gz) in files.items():
        write(os.path.join(tree, rel), text, gz)
    os.makedirs(os.path.join(tmp, "debs"), exist_ok=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", tree,
                    os.path.join(tmp, "debs", f"{package}_1.0_all.deb")],
                   check=True, capture_output=True)


def fake_packages(tmp, docs=12):
    """One package per source, `docs` documents each; returns {source: [document texts]}, the
    texts as the extractor should give them (the markup they carry stripped)."""
    expect = {s: [] for s in ("gcide", "linux-doc", "python-doc", "debian-handbook",
                              "postgresql-doc", "perl-doc")}
    entries = []
    for i in range(docs):
        body = prose(i)
        entries.append(f"Word{i} \\Word\"{i}\\, n.\n     {body}")
        expect["gcide"].append(f"Word{i} \\Word\"{i}\\, n. {body}")
    dictd = "00-database-info\n     header\n\n" + "\n\n".join(entries) + "\n"
    build_deb(tmp, "dict-gcide", {"usr/share/dictd/gcide.dict.dz": (dictd, True)})

    files = {}
    for i in range(docs):
        body = prose(100 + i)
        files[f"usr/share/doc/linux-doc-6.1/Documentation/sub/doc{i:02d}.rst.gz"] = (
            f"Title {i}\n=======\n\n{body}\n", True)
        expect["linux-doc"].append(f"Title {i}\n\n{body}")
    files["usr/share/doc/linux-doc-6.1/Documentation/translations/zh_CN/x.rst.gz"] = (
        "TRANSLATED TEXT\n", True)
    build_deb(tmp, "linux-doc-6.1", files)

    files = {}
    for i in range(docs):
        body = prose(200 + i)
        files[f"usr/share/doc/python3.11/html/_sources/lib/m{i:02d}.rst.txt"] = (body + "\n", False)
        expect["python-doc"].append(body)
    build_deb(tmp, "python3.11-doc", files)

    for source, package, folder in (
            ("debian-handbook", "debian-handbook", "usr/share/doc/debian-handbook/html/en-US"),
            ("postgresql-doc", "postgresql-doc-15", "usr/share/doc/postgresql-doc-15/html")):
        files = {}
        for i in range(docs):
            body = prose(300 + i + 50 * len(source))
            files[f"{folder}/p{i:02d}.html"] = (
                f"<html><head><title>T</title><script>var NAV=1;</script></head><body>"
                f"<div id=\"banner\">Download the ebook</div>"
                f"<ul class=\"docnav top\"><li>Prev</li></ul>"
                f"<div class=\"navheader\">NAVIGATION</div><h1>Head {i}</h1><p>{body}</p>"
                f"<div class=\"navfooter\">FOOTER</div></body></html>", False)
            expect[source].append(f"Head {i}\n\n{body}")
        build_deb(tmp, package, files)

    files = {}
    for i in range(docs):
        body = prose(500 + i)
        files[f"usr/share/perl/5.36.0/pod/perlx{i:02d}.pod"] = (
            f"=head1 NAME\n\nB<perlx{i}> - C<< x >>\n\n=cut\n\n{body}\n", False)
        expect["perl-doc"].append(f"NAME\n\nperlx{i} - x\n\n{body}")
    files["usr/share/perl/5.36.0/pod/perl5360delta.pod"] = ("=head1 DELTA TEXT\n", False)
    build_deb(tmp, "perl-doc", files)
    return expect


def run(args, **kw):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True,
                          timeout=600, **kw)


def tokens(path):
    with lzma.open(path) as f:
        return np.frombuffer(f.read(), dtype="<u2")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("corpus"))
    expect = fake_packages(tmp)
    out = os.path.join(tmp, "out")
    r = run(["--deb-dir", os.path.join(tmp, "debs"), "--out", out, "--vocab", "400",
             "--val-permille", "150"])
    assert r.returncode == 0, r.stderr + r.stdout
    return tmp, out, expect


def test_sources_split_and_token_ranges(built):
    from tokenizers import Tokenizer
    tmp, out, expect = built
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    assert meta["format"] == "twell-tokens-1" and meta["compression"] == "xz"
    assert set(meta["sources"]) == set(expect)
    train, val = tokens(os.path.join(out, "train.bin.xz")), tokens(os.path.join(out, "val.bin.xz"))
    assert len(train) == meta["tokens"]["train"] and len(val) == meta["tokens"]["val"]
    assert sum(s["tokens"]["train"] for s in meta["sources"].values()) == len(train)
    eos = meta["eos_id"]
    assert train[-1] == eos and val[-1] == eos
    assert int(train.max()) < meta["vocab_size"] and int(val.max()) < meta["vocab_size"]
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    decoded_train = tok.decode(train.tolist(), skip_special_tokens=False)
    ranges = sorted(meta["val_ranges"].items(), key=lambda kv: kv[1][0])
    assert ranges[0][1][0] == 0 and ranges[-1][1][1] == len(val)
    for (_, (_, end)), (_, (start, _)) in zip(ranges, ranges[1:]):
        assert end == start
    for source, (start, end) in meta["val_ranges"].items():
        s = meta["sources"][source]
        assert end - start == s["tokens"]["val"]
        assert s["documents"]["train"] + s["documents"]["val"] == len(expect[source])
        assert s["documents"]["val"] >= 2  # ceil(12 * 150 / 1000) at least
        docs = tok.decode(val[start:end].tolist(), skip_special_tokens=False)
        docs = [d for d in docs.split(meta["eos_token"]) if d]
        assert len(docs) == s["documents"]["val"]
        for d in docs:  # each held-out document is one of the source's, and not in training
            assert d in expect[source], (source, d[:80])
            assert d not in decoded_train
    everything = decoded_train + tok.decode(val.tolist(), skip_special_tokens=False)
    for text in ("TRANSLATED", "DELTA", "NAVIGATION", "FOOTER", "NAV=1", "Download the ebook",
                 "Prev", "=head1", "B<", "====", "00-database"):
        assert text not in everything, text
    assert "perl-doc" in open(os.path.join(out, "README.md")).read()
    for s in meta["sources"].values():
        assert os.path.isfile(os.path.join(out, s["copyright"]))
        assert s["licence"] and s["deb_sha256"] and s["version"] == "1.0"


def test_output_is_reproducible(built):
    tmp, out, _ = built
    again = os.path.join(tmp, "again")
    r = run(["--deb-dir", os.path.join(tmp, "debs"), "--out", again, "--vocab", "400",
             "--val-permille", "150", "--sources", "python-doc,gcide"])
    assert r.returncode == 0, r.stderr
    with open(os.path.join(again, "meta.json")) as f:
        meta = json.load(f)
    assert list(meta["sources"]) == ["python-doc", "gcide"]
    with open(os.path.join(out, "meta.json")) as f:
        full = json.load(f)
    for s in ("python-doc", "gcide"):  # the same documents held out, whatever else is built
        assert meta["sources"][s]["documents"] == full["sources"][s]["documents"]
    third = os.path.join(tmp, "third")
    assert run(["--deb-dir", os.path.join(tmp, "debs"), "--out", third, "--vocab", "400",
                "--val-permille", "150", "--sources", "python-doc,gcide"]).returncode == 0
    for name in ("train.bin.xz", "val.bin.xz", "tokenizer.json", "meta.json"):
        with open(os.path.join(again, name), "rb") as a, open(os.path.join(third, name), "rb") as b:
            assert a.read() == b.read(), name


@pytest.mark.parametrize("args, names", [
    (["--sources", "gcide,bogus"], "--sources"),
    (["--sources", "gcide,gcide"], "--sources"),
    (["--sources", ","], "--sources"),
    (["--vocab", "100"], "--vocab"),
    (["--vocab", "70000"], "--vocab"),
    (["--val-permille", "0"], "--val-permille"),
    (["--val-permille", "900"], "--val-permille"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, names):
    r = run(args + ["--deb-dir", str(tmp_path / "debs"), "--out", str(tmp_path / "out")])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "debs").exists()  # nothing was downloaded


def test_out_naming_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    r = run(["--out", str(tmp_path / "f"), "--deb-dir", str(tmp_path / "debs")])
    assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("script", ["prepare-corpus", "prepare-gcide"])
def test_without_tokenizers_stops_before_downloading(tmp_path, script):
    """Under an interpreter without `tokenizers` and no project venv beside the script, it says
    how to get the package and downloads nothing (prepare-gcide runs prepare-corpus)."""
    scripts = tmp_path / "repo" / "scripts"
    scripts.mkdir(parents=True)
    for name in ("prepare-corpus", "prepare-gcide", "corpus_sources.py"):
        shutil.copy(os.path.join(ROOT, "scripts", name), scripts / name)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "tokenizers.py").write_text("raise ImportError('hidden for the test')\n")
    (hide / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # the shebang's
    (hide / "python3").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(hide), PATH=f"{hide}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run([str(scripts / script), "--deb-dir", str(tmp_path / "debs")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "tokenizers" in r.stderr and "nothing was downloaded" in r.stderr
    assert "pip install tokenizers" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "debs").exists() and not (tmp_path / "repo" / ".carry").exists()


def test_twell_train_reads_the_corpus_and_reports_each_source(built, tmp_path):
    """A token folder of .bin.xz files with validation ranges: twell.train's validation gives a
    cross-entropy per source whose token-weighted mean is the whole validation CE."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    _, out, _ = built
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "twell.train", "--data", out, "--model", "tiny",
                        "--device", "cpu", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
                        "--eval-batch-size", "8", "--no-progress", "--out", str(run)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(run / "log.jsonl") as f:
        last = [json.loads(line) for line in f if '"val_ce"' in line][-1]
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    per = last["val_ce_sources"]
    assert set(per) == set(meta["sources"])
    from twell.train import data
    d = data.load(out)
    ids = d.val_source_ids(8, 16)
    counts = np.bincount(np.concatenate([a.reshape(-1) for a in ids]), minlength=len(per))
    names = [n for n, _, _ in d.val_sources]
    mean = sum(per[n] * c for n, c in zip(names, counts)) / counts.sum()
    assert abs(mean - last["val_ce"]) < 1e-9 * max(1.0, last["val_ce"])


def test_val_source_ids_follow_the_ranges(built):
    from twell.train import data
    _, out, _ = built
    d = data.load(out)
    for max_batches in (None, 1):
        batches = d.val_batches(3, 10, max_batches=max_batches)
        sources = d.val_source_ids(3, 10, max_batches=max_batches)
        assert [b.shape[0] for b in batches] == [s.shape[0] for s in sources]
        for b, s in zip(batches, sources):
            assert s.shape == (b.shape[0], 10)
    # Each target position's source is the range holding it.
    starts = data.eval_starts(len(d.val), 3, 10)
    for batch_starts, s in zip(starts, d.val_source_ids(3, 10)):
        for row, start in zip(s, batch_starts):
            for j, src in enumerate(row):
                name, lo, hi = d.val_sources[src]
                assert lo <= start + j + 1 < hi, name
    limited = data.eval_starts(len(d.val), 2, 10, max_batches=1)
    assert limited[0][-1] > len(d.val) // 3  # spread over the ids, not their first part


@pytest.mark.parametrize("damage, what", [
    ("corrupt", "xz stream"),
    ("longer", "token ids"),
    ("ranges-gap", "val_ranges"),
    ("ranges-short", "val_ranges"),
    ("ranges-type", "val_ranges"),
])
def test_bad_compressed_folders_are_refused(built, tmp_path, damage, what):
    from twell.train import data
    _, out, _ = built
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    with open(bad / "meta.json") as f:
        meta = json.load(f)
    if damage == "corrupt":
        raw = bytearray((bad / "val.bin.xz").read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        (bad / "val.bin.xz").write_bytes(bytes(raw))
    elif damage == "longer":
        with lzma.open(bad / "val.bin.xz", "wb") as f:
            f.write(b"\0\0" * (meta["tokens"]["val"] + 1))
    else:
        first = sorted(meta["val_ranges"], key=lambda n: meta["val_ranges"][n][0])[0]
        if damage == "ranges-gap":
            meta["val_ranges"][first][1] -= 1
        elif damage == "ranges-short":
            meta["val_ranges"] = {first: meta["val_ranges"][first]}
        else:
            meta["val_ranges"][first] = "0-10"
        (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=what):
        data.load(str(bad))
