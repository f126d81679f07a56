"""The sources of scripts/prepare-corpus: which Debian package each comes from, its licence, and how
its files become documents of plain English text.

A source is a Debian package of the main archive and an extractor: `documents(root)` yields
(document id, text) for the package unpacked at `root` (`dpkg-deb -x`). A document id is stable
across runs (a path inside the package, or a GCIDE headword), so the validation split, which hashes
it, is fixed. Only the standard library is used here.
"""
import gzip
import html.parser
import os
import re

# ---------------------------------------------------------------------------------------------
# Text clean-up shared by the sources


_RULE = re.compile(r"^\s*([=\-~^*#+`'\".:_])\1{2,}\s*$")  # reST over/underlines, ==== rules


def tidy(text, drop_rules=True):
    """Trailing spaces dropped, tabs to spaces, rule lines (`=====`) dropped, runs of blank lines
    reduced to one."""
    lines = []
    for line in text.replace("\r\n", "\n").replace("\t", "    ").split("\n"):
        line = line.rstrip()
        if drop_rules and _RULE.match(line):
            continue
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


def decode(raw):
    """UTF-8, or Windows-1252 for the few files with stray legacy bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def read_text(path):
    opener = gzip.open if path.endswith((".gz", ".dz")) else open  # dictzip is gzip
    with opener(path, "rb") as f:
        return decode(f.read())


def files_under(root, sub, suffixes, exclude=()):
    """Sorted (relative path, absolute path) of the regular files under root/sub whose names end in
    one of `suffixes`, skipping relative paths that contain any of `exclude`."""
    base = os.path.join(root, sub)
    out = []
    for d, dirs, names in os.walk(base):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(d, n)
            rel = os.path.relpath(path, base)
            if (n.endswith(suffixes) and os.path.isfile(path) and not os.path.islink(path)
                    and not any(e in rel for e in exclude)):
                out.append((rel, path))
    return out


class _HtmlText(html.parser.HTMLParser):
    """The readable text of an HTML page: no script, style or navigation; block elements end a
    line, paragraphs a paragraph."""
    SKIP = {"script", "style", "head", "nav"}
    BLOCK = {"p", "div", "pre", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr",
             "table", "blockquote", "section", "br", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip, self.pre = [], 0, 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag == "pre":
            self.pre += 1
        if tag in self.BLOCK:
            self.parts.append("\n\n" if tag in ("p", "pre", "h1", "h2", "h3", "h4") else "\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skip:
            self.skip -= 1
        elif tag == "pre" and self.pre:
            self.pre -= 1
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_text(page):
    """Plain text of an HTML page (see _HtmlText)."""
    parser = _HtmlText()
    parser.feed(page)
    parser.close()
    lines = (line.strip() for line in "".join(parser.parts).split("\n"))
    return tidy("\n".join(lines))


_NAV = re.compile(r'<div class="nav(?:header|footer)".*?</div>|<div id="banner">.*?</div>'
                  r'|<ul class="docnav[^"]*">.*?</ul>', re.S)


def _drop_nav(page):
    """The page without its navigation: Docbook's navheader / navfooter divs (PostgreSQL), the
    handbook's banner and docnav lists (none of which holds a nested element of its own kind)."""
    return _NAV.sub("", page)


# ---------------------------------------------------------------------------------------------
# GCIDE: the dictd text of dict-gcide, one document per entry

def _starts_entry(block):
    lines = block.split("\n", 2)
    return "\\" in lines[0] or (len(lines) > 1 and lines[1].startswith("\\"))


def gcide_entries(text):
    """[(headword, entry)] in file order: an entry starts at a line in column 0 after a blank line
    whose first line (or second, for long headwords) carries the pronunciation `\\...\\`; a block
    that does not continues the entry before it. The database header (`00-...` entries) and the
    licence text before the first entry are dropped. Homographs share their headword, so the
    split keeps them on one side."""
    entries = []
    for block in re.split(r"\n\n+(?=\S)", text.strip("\n")):
        if _starts_entry(block) and not block.startswith("00-"):
            entries.append(block)
        elif entries:
            entries[-1] += "\n\n" + block
    out = []
    for e in entries:
        first = e.split("\n", 1)[0]
        head = first.split("\\", 1)[0].strip() or first.strip()
        out.append((head, e))
    return out


def gcide_normalise(entry):
    """Each paragraph's lines joined with single spaces (the dictd indentation and wrapping
    dropped), paragraphs separated by one newline."""
    paragraphs = re.split(r"\n[ \t]*\n", entry)
    joined = (" ".join(line.strip() for line in p.split("\n") if line.strip()) for p in paragraphs)
    return "\n".join(re.sub(r"[ \t]{2,}", " ", p) for p in joined if p)


def gcide_documents(root):
    found = files_under(root, "usr/share/dictd", (".dict.dz",))
    if len(found) != 1:
        raise ValueError(f"dict-gcide: expected one .dict.dz under usr/share/dictd, found "
                         f"{[r for r, _ in found]}")
    for head, entry in gcide_entries(read_text(found[0][1])):
        yield head.lower(), gcide_normalise(entry)


# ---------------------------------------------------------------------------------------------
# The documentation packages

def linux_doc_documents(root):
    """The kernel's Documentation/**/*.rst and *.txt (gzipped in the package), translations
    (which are not English) left out."""
    base = _only_dir(root, "usr/share/doc", "linux-doc-")
    for rel, path in files_under(root, os.path.join(base, "Documentation"),
                                 (".rst.gz", ".txt.gz"), exclude=("translations/",)):
        yield rel, tidy(read_text(path))


def python_doc_documents(root):
    """The reStructuredText sources of the Python documentation (html/_sources/**/*.rst.txt)."""
    base = _only_dir(root, "usr/share/doc", "python3.", holding="html/_sources")
    for rel, path in files_under(root, os.path.join(base, "html", "_sources"), (".rst.txt",)):
        yield rel, tidy(read_text(path))


def handbook_documents(root):
    """The English Debian Administrator's Handbook, one HTML page a document."""
    for rel, path in files_under(root, "usr/share/doc/debian-handbook/html/en-US", (".html",)):
        yield rel, html_text(_drop_nav(read_text(path)))


def postgresql_doc_documents(root):
    """The PostgreSQL manual, one HTML page a document."""
    base = _only_dir(root, "usr/share/doc", "postgresql-doc-")
    for rel, path in files_under(root, os.path.join(base, "html"), (".html",)):
        yield rel, html_text(_drop_nav(read_text(path)))


_POD_DROP = re.compile(r"^=(cut|pod|over|back|begin|end|for|encoding)\b.*$", re.M)
_POD_HEAD = re.compile(r"^=(head\d|item)\s*", re.M)
_POD_CODES = re.compile(r"[BCEFILSXZ]<<+\s(.*?)\s>>+|[BCEFILSXZ]<([^<>]*)>")


def pod_text(pod):
    """Plain text of a POD file: directives dropped, headings and items kept as lines, formatting
    codes (B<...>, C<< ... >>) reduced to their text."""
    text = _POD_DROP.sub("", pod)
    text = _POD_HEAD.sub("", text)
    for _ in range(3):  # nested codes
        text = _POD_CODES.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return tidy(text)


def perl_doc_documents(root):
    """The Perl manual pages (usr/share/perl/*/pod/*.pod), the per-release change logs
    (perl*delta) left out."""
    for rel, path in files_under(root, "usr/share/perl", (".pod",), exclude=("delta.pod",)):
        yield rel, pod_text(read_text(path))


def _only_dir(root, sub, prefix, holding=""):
    """sub/<the one folder whose name starts with prefix and that holds `holding`> (the versioned
    folder of a package)."""
    base = os.path.join(root, sub)
    def real_dir(path):  # a folder, reached through no symbolic link (-doc packages link theirs)
        return os.path.isdir(path) and os.path.realpath(path) == os.path.abspath(path)
    names = sorted(n for n in os.listdir(base) if n.startswith(prefix)
                   and real_dir(os.path.join(base, n, holding))) if real_dir(base) else []
    if len(names) != 1:
        raise ValueError(f"expected one folder {sub}/{prefix}* in the package, found {names}")
    return os.path.join(sub, names[0])


class Source:
    """A corpus source: its name, the Debian package (apt-get download PACKAGE), the licence of the
    text as its copyright file states it, and its extractor."""

    def __init__(self, name, package, licence, documents, what):
        self.name, self.package, self.licence = name, package, licence
        self.documents, self.what = documents, what


SOURCES = {s.name: s for s in (
    Source("gcide", "dict-gcide", "GPL-3.0-or-later", gcide_documents,
           "GNU Collaborative International Dictionary of English (Webster's 1913, WordNet)"),
    Source("linux-doc", "linux-doc-6.1", "GPL-2.0-only", linux_doc_documents,
           "Linux kernel documentation (Documentation/, no translations)"),
    Source("python-doc", "python3.11-doc", "PSF-2.0", python_doc_documents,
           "Python 3.11 documentation (reStructuredText sources)"),
    Source("debian-handbook", "debian-handbook", "GPL-2.0-or-later OR CC-BY-SA-3.0",
           handbook_documents, "The Debian Administrator's Handbook (English)"),
    Source("postgresql-doc", "postgresql-doc-15", "PostgreSQL", postgresql_doc_documents,
           "PostgreSQL 15 manual"),
    Source("perl-doc", "perl-doc", "GPL-1.0-or-later OR Artistic-1.0-Perl", perl_doc_documents,
           "Perl manual pages (no per-release change logs)"),
)}
