"""Pure functions mirroring the C++ plans' option defaults and the saved training layout.

The fake (meta) implementations of twell.torch's ops use them: the size of what training saves
depends on the row count M alone, so a compiled graph can allocate it symbolically. The tests check
every value against the C++ library (docs/format.md, "Single-buffer form").
"""

DEFAULT_TILE = 256  # both backends (one gate-GEMM output tile on the GPU)
HEADER_BYTES = 64  # twell::TwellHeader, the last array of the single-buffer form


def resolve_tile(tile, capacity, training=False):
    """(tile, capacity) with 0 meaning the backend default: tile 256; capacity tile // 8 for
    inference, tile // 16 for what training saves (twell::TrainingOptions)."""
    tile = tile or DEFAULT_TILE
    if capacity:
        return tile, capacity
    return tile, max(1, tile // 16) if training else tile // 8


def training_capacities(tile, capacity, adaptive):
    """The capacities training's compact state may have, largest first, as twell::TrainingOptions
    resolves a min_capacity left at 0 (what the torch ops pass): a default capacity (0) under
    automatic dispatch on CUDA (`adaptive`) may be sized down by halves to min(capacity,
    max(4, tile // 64)); any other has its one capacity. Where two of them take the same bytes (a
    few rows), the plans and the ops take the first."""
    tile, top = resolve_tile(tile, capacity, training=True)
    low = min(top, max(4, tile // 64)) if adaptive and not capacity else top
    out, c = [], top
    while c >= low:
        out.append(c)
        c //= 2
    return out or [top]


def compact_capacity_of(nbytes, rows, cols, tile, capacity, adaptive, planes, dtype):
    """The capacity of a compact training state of `nbytes` bytes: the first of
    training_capacities with that size (as the plans read a buffer), or None where no compact state
    has it (the dense form's, or no state at all)."""
    tile = resolve_tile(tile, capacity, training=True)[0]
    for c in training_capacities(tile, capacity, adaptive):
        if saved_bytes(rows, cols, tile, c, planes, dtype) == nbytes:
            return c
    return None


def _aligned(nbytes):
    return (nbytes + 15) // 16 * 16


SAVED_ARRAYS = ("values", "backup", "cols", "counts", "row_slot", "routed_rows", "num_routed",
                "header")


def saved_offsets(rows, cols, tile, capacity, planes, itemsize, dense=False):
    """{array: byte offset} of the saved layout's single buffer (the arrays of saved_bytes, in its
    order: SAVED_ARRAYS), and "end": its size, saved_bytes. `itemsize`: bytes per value."""
    if dense:
        capacity = 1
    tiles = (cols + tile - 1) // tile
    slots = rows * tiles * capacity
    sizes = (planes * slots * itemsize, planes * rows * cols * itemsize if dense else 0, slots * 2,
             rows * tiles * 2, rows * 4, rows * 4, 4, HEADER_BYTES)
    out, at = {}, 0
    for name, size in zip(SAVED_ARRAYS, sizes):
        out[name] = at
        at += _aligned(size)
    out["end"] = at
    return out


def saved_bytes(rows, cols, tile, capacity, planes, dtype, dense=False):
    """Bytes of the saved TwELL layout for `rows` rows of `cols` neurons, values of `dtype`
    (anything with an itemsize: a torch or numpy dtype): the compact form (no backup rows) or,
    with dense=True, the dense form (capacity 1, every row in the backup planes; CUDA only).

    Arrays in order, each rounded up to 16 bytes: values [P, M, NT, C] dtype, backup [P, B, N]
    dtype (B = 0 or M), cols u16 [M, NT, C], counts u16 [M, NT], row_slot i32 [M],
    routed_rows i32 [M], num_routed i32 [1], header (64 bytes). `rows` may be a torch SymInt.
    """
    return saved_offsets(rows, cols, tile, capacity, planes, dtype.itemsize, dense)["end"]
