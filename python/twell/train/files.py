"""Reading files someone hands twell.train and twell.capture: regular files only (a directory,
FIFO, device or socket named as a file is refused before anything blocks on it), sizes bounded
before reading, JSON parsed strictly, and every problem an InputError naming what was read:
"<what>: expected <expected>, got <actual>"."""
import json
import math
import os
import stat

MiB = 1 << 20
JSON_LIMIT = 64 * MiB  # any JSON twell reads (checkpoint state, meta.json, manifests, configs)
TEXT_LIMIT = 1024 * MiB  # one text file (--text, a file of a text folder)


class InputError(ValueError):
    """A bad argument or input file: "<what>: expected <expected>, got <got>" (what names the
    argument or the file), or `what` alone where a loader said it in its own words."""

    def __init__(self, what, expected=None, got=None):
        super().__init__(what if expected is None else f"{what}: expected {expected}, got {got}")
        self.what, self.expected, self.got = what, expected, got

    def within(self, prefix):
        """The same error under `prefix` (the argument that named the file, ...)."""
        return InputError(f"{prefix}: {self.what}", self.expected, self.got)


def kind_of(mode):
    """What a stat mode is, in words."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path, what, limit):
    """A read-only descriptor of the regular file `path` (symbolic links followed) no larger than
    `limit` bytes, and its size. O_NONBLOCK: opening a FIFO returns at once, and fstat refuses
    it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputError(what, "a regular file", "no such file") from None
    except OSError as e:
        raise InputError(what, "a readable regular file", e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(what, "a regular file", kind_of(st.st_mode))
        if limit is not None and st.st_size > limit:
            raise InputError(what, f"a file of at most {limit:,} bytes", f"{st.st_size:,} bytes")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def check_regular(path, what, limit=None):
    """The size of the regular file `path` (at most `limit` bytes), else InputError."""
    fd, size = _open_regular(path, what, limit)
    os.close(fd)
    return size


def read_head(path, what, n):
    """The first `n` bytes of the regular file `path`."""
    fd, _ = _open_regular(path, what, None)
    with os.fdopen(fd, "rb") as f:
        return f.read(n)


def read_bytes(path, what, limit):
    """The bytes of the regular file `path`, refused over `limit` bytes."""
    fd, size = _open_regular(path, what, limit)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # grew since fstat
        raise InputError(what, f"a file of at most {limit:,} bytes", "a file that keeps growing")
    return data


def read_text(path, what, limit=TEXT_LIMIT):
    """A regular file's text (UTF-8; undecodable bytes replaced)."""
    return read_bytes(path, what, limit).decode("utf-8", errors="replace")


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_json(data, what):
    """Strict JSON (no NaN or Infinity, UTF-8) from bytes or str, else InputError."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise InputError(what, "UTF-8 JSON", "bytes that are not UTF-8") from None
    except RecursionError:
        raise InputError(what, "JSON", "JSON nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError and the constants above
        raise InputError(what, "JSON", f"invalid JSON ({e})") from None


def json_records(text):
    """The JSON objects of a JSON-lines text (a log), skipping lines that are not one (a torn
    last line, garbage, nesting too deep to parse)."""
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict):
            yield rec


def finite_json(value):
    """`value` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def read_json(path, what, limit=JSON_LIMIT):
    """A regular file's JSON (at most `limit` bytes), else InputError."""
    return parse_json(read_bytes(path, what, limit), what)


def output_folder(path, what="--out"):
    """Creates folder `path` (with its parents) where it is missing; InputError where it names
    something else or cannot be made."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(what, "a folder (new or existing)",
                         f"{path}, which is {kind_of(os.stat(path).st_mode)}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise InputError(what, "a folder it can create", f"{path}: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(what, "a writable folder", f"{path}, which is not writable")
    return path
