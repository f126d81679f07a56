"""What a training forward of a twell FFN saved for backward, read from PyTorch, and the per-unit
hit counts it gives without a GEMM.

twell::ffn_train (twell.torch._ops) saves one uint8 tensor, the single-buffer form of
docs/format.md ("Hybrid training layout"): values, backup, cols, counts, row_slot, routed_rows,
num_routed, header, each 16-byte aligned (twell.layout.saved_offsets). Its size tells the form:

  compact  backup_capacity 0, C slots per (row, tile): for each compact row (row_slot -1) and tile,
           its active entries (relu_active: the gate value g > 0; a NaN or infinite g routes the
           row) as columns within the tile and a count, plane 0 holding g there. A routed row
           (row_slot >= 0: a tile over C, a NaN or infinite g, or, on CUDA under
           Determinism.fast, a row of many entries) is only listed: its entries are void and
           nothing else of it is kept (backward recomputes it from x).
  dense    CUDA only (automatic dispatch above dense_above, or dispatch "dense"):
           backup_capacity M, capacity 1, every row in the backup planes, plane 0 holding
           g = x W1^T before the ReLU (gated) or h = relu(g) (plain), in the weights' dtype.

g = x W1^T, W1 the gate (up for a plain FFN), as the op computed it: in float32 on the CPU, in the
weights' dtype (cuBLASLt's output) on CUDA.

Hits of unit n (SavedState.unit_hits): the rows m whose activation relu(g[m, n]) is > 0 (a NaN is
not; NaN gates still count in the op's L0, which counts relu_active). They come from the state for
every row it keeps (the dense form, the compact rows) and from a GEMM for the rows it does not (the
compact form's routed rows; see _routed_hits, whose row count on CUDA costs one host
synchronisation).
"""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from twell import layout
from twell.torch._ops import saved_dtype


def train_node(out):
    """The autograd node of the twell::ffn_train call behind a module's output, or None."""
    node, seen = getattr(out, "grad_fn", None), 0
    while node is not None and seen < 4:
        if "twell_ffn_train" in type(node).__name__:
            return node
        nxt = [f for f, _ in node.next_functions if f is not None]
        node, seen = (nxt[0] if nxt else None), seen + 1
    return None


class SavedState(NamedTuple):
    saved: torch.Tensor   # uint8, the whole state
    x: torch.Tensor       # [M, K], the op's input
    first: torch.Tensor   # [N, K], the op's W1 (gate, or up for a plain FFN)
    rows: int             # M
    cols: int             # N
    tile: int             # T, resolved
    capacity: Optional[int]  # C of the compact form; None: the dense form
    planes: int           # 2 gated, 1 plain
    dtype: torch.dtype    # of the values (float32 on the CPU, the weights' on CUDA)

    @property
    def dense(self):
        return self.capacity is None

    def offsets(self):
        return layout.saved_offsets(self.rows, self.cols, self.tile, self.capacity or 1,
                                    self.planes, self.dtype.itemsize, dense=self.dense)

    def _array(self, name, count, dtype):
        """`count` elements of `dtype` at the start of array `name` (a view, no copy)."""
        at = self.offsets()[name]
        return self.saved[at:at + count * dtype.itemsize].view(dtype)

    def num_routed(self):
        """The routed row count, a 0-d int32 tensor on the state's device (no synchronisation)."""
        return self._array("num_routed", 1, torch.int32)[0]

    def row_slot(self):
        return self._array("row_slot", self.rows, torch.int32)

    def unit_hits(self):
        """int64 [N]: per unit, the rows of this forward whose activation relu(g) is > 0, on the
        state's device (the compact form on CUDA reads its routed row count: one host
        synchronisation)."""
        if self.rows == 0:
            return torch.zeros(self.cols, dtype=torch.int64, device=self.saved.device)
        if self.dense:  # plane 0 of the backup: g (gated) or relu(g) (plain); > 0 either way
            g = self._array("backup", self.rows * self.cols, self.dtype).view(self.rows, self.cols)
            return positive_counts(g)
        return self._compact_hits() + self._routed_hits()

    def _compact_hits(self):
        """Hits of the compact rows: their valid entries (slot < count) whose value is > 0."""
        m, n, t, c = self.rows, self.cols, self.tile, self.capacity
        nt = (n + t - 1) // t
        dev = self.saved.device
        values = self._array("values", m * nt * c, self.dtype).view(m, nt, c)  # plane 0
        cols = self._array("cols", m * nt * c, torch.int16).view(m, nt, c).int() & 0xFFFF
        counts = self._array("counts", m * nt, torch.int16).view(m, nt).int() & 0xFFFF
        valid = ((torch.arange(c, device=dev, dtype=torch.int32) < counts.unsqueeze(-1))
                 & (values > 0) & (self.row_slot() < 0).view(m, 1, 1))
        col = torch.arange(nt, device=dev, dtype=torch.int32).view(1, nt, 1) * t + cols
        # Void slots (unspecified columns) go to an extra bin, dropped; index_add_ rather than
        # bincount, which synchronises on CUDA to size its output.
        col = torch.where(valid, col, n).reshape(-1)
        hits = torch.zeros(n + 1, dtype=torch.int64, device=dev)
        hits.index_add_(0, col, valid.reshape(-1).long())
        return hits[:n]

    def _routed_hits(self):
        """Hits of the compact form's routed rows, which the state does not keep: recomputed,
        g = x W1^T on the op's x and W1 for those rows alone (in float32 on the CPU, as the CPU
        op; in the weights' dtype on CUDA, as the op's gate GEMM), so the counts differ from the
        op's own only where a |g| lies within rounding of 0. On CUDA the routed row count lives on
        the device: reading it is one host synchronisation (where none may happen, inside a CUDA
        graph's capture, the GEMM runs over all M rows, those not routed zeroed)."""
        x, w = self.x, self.first
        with torch.autocast(x.device.type, enabled=False):
            if x.is_cuda and torch.cuda.is_current_stream_capturing():
                routed = self.row_slot() >= 0
                return positive_counts(F.linear(x.masked_fill(~routed.unsqueeze(1), 0), w))
            count = int(self.num_routed())
            if count == 0:
                return torch.zeros(self.cols, dtype=torch.int64, device=x.device)
            rows = x.index_select(0, self._array("routed_rows", count, torch.int32).long())
            g = F.linear(rows, w) if x.is_cuda else F.linear(rows.float(), w.float())
        return positive_counts(g)


def positive_counts(g):
    """int64 [N]: per column of g [M, N], its entries > 0 (a NaN is not one). The comparison writes
    a 0 / 1 mask in g's dtype, summed into float32 (exact below 2^24 rows; on CUDA torch reduces
    half and bfloat16 into float32 without a copy): (g > 0).sum(0) would first copy the bool mask
    to int64, 8 bytes an entry, most of the traffic of a count over a [M, N] plane."""
    if g.shape[0] >= 1 << 24:
        return (g > 0).sum(0)
    mask = torch.empty_like(g, memory_format=torch.contiguous_format)
    torch.gt(g, 0, out=mask)
    return mask.sum(0, dtype=torch.float32).long()


def find(module, out):
    """The SavedState of the training forward of twell FFN `module` whose output is `out`, or None
    where there is none to read: no twell::ffn_train node behind `out` (an inference call, a
    compiled graph's node), its state freed, or of neither form's size."""
    node = train_node(out)
    if node is None:
        return None
    try:
        x, gate, up, _, saved = node.saved_tensors
    except RuntimeError:  # freed by a backward
        return None
    # A split module's op runs its cold units alone (twell.torch.hot).
    n, k = module.intermediate_size - module.hot_units, module.hidden_size
    if ((gate is not None) != module.gated or x.dim() != 2 or x.shape[1] != k
            or tuple(up.shape) != (n, k) or saved.dtype != torch.uint8 or saved.dim() != 1):
        return None
    # The options of this call (the op's autograd context keeps them), else the module's.
    tile = getattr(node, "tile", module.tile)
    capacity = getattr(node, "capacity", module.capacity)
    dispatch = getattr(node, "dispatch", module.dispatch)
    rows, planes = x.shape[0], 2 if module.gated else 1
    dtype = saved_dtype(x.device.type, up.dtype)
    cuda = x.device.type == "cuda"
    nbytes = saved.numel()
    found = layout.compact_capacity_of(nbytes, rows, n, tile, capacity, cuda and dispatch == "auto",
                                       planes, dtype)
    resolved = layout.resolve_tile(tile, capacity, training=True)[0]
    if found is None and not (cuda and nbytes == layout.saved_bytes(rows, n, resolved, 1, planes,
                                                                    dtype, dense=True)):
        return None
    return SavedState(saved, x, gate if module.gated else up, rows, n, resolved, found, planes,
                      dtype)
