"""cos/sin of position * frequency, computed in float64 and cached per (device, dtype).

Both rotary families (RoPE and PoPE) need cos(p * theta) and sin(p * theta) for integer positions p.
Computing the angle in float64 keeps the phase exact for positions up to 1e6 and beyond; the table for
positions [0, n) is kept (n grows by powers of two up to MAX_ROWS) and indexed, larger positions are
computed directly.

The table serves CPU tensors only. Choosing and growing it needs the positions' min and max as Python ints,
which on a GPU means waiting for every queued kernel (three host syncs per lookup): on an H200, PoPE's forward
at T=16384 took 2.0 ms with them and 1.26 ms without (docs/benchmarks.md), while the direct computation is one
small kernel. Under torch.compile the angles are computed directly too: the positions' min and max are
data-dependent values that break the graph (and `fullgraph=True`). The direct computation is the table's own
formula (float64 position times float64 frequency, then cos/sin), so both give the same numbers.
"""
from __future__ import annotations

import torch

MAX_ROWS = 1 << 16


class AngleTables:
    def __init__(self, gain: float = 1.0):
        self.gain = gain  # multiplies cos and sin (YaRN's attention factor); 1 elsewhere
        self._tables: dict = {}

    def lookup(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, cache: bool = True):
        """(cos, sin), each (*positions.shape, len(inv_freq)), times the gain, in `dtype`."""
        inv_freq = inv_freq.to(positions.device)
        if cache and positions.numel() and positions.device.type == "cpu" and not torch.compiler.is_compiling():
            lo, hi = int(positions.min()), int(positions.max())
            if lo >= 0 and hi < MAX_ROWS:
                cos, sin = self._table(hi + 1, inv_freq, dtype)
                return cos[positions], sin[positions]
        return self._compute(positions.double(), inv_freq, dtype)

    def _compute(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
        angles = positions.unsqueeze(-1) * inv_freq
        return (angles.cos() * self.gain).to(dtype), (angles.sin() * self.gain).to(dtype)

    def _table(self, rows: int, inv_freq: torch.Tensor, dtype: torch.dtype):
        key = (inv_freq.device, dtype)
        entry = self._tables.get(key)
        # rebuilt when longer positions arrive or the frequencies were changed in place
        if entry is None or entry[0][0].shape[0] < rows or not torch.equal(entry[1], inv_freq):
            n = min(MAX_ROWS, max(1024, 1 << (rows - 1).bit_length()))
            table = self._compute(torch.arange(n, dtype=torch.float64, device=inv_freq.device), inv_freq, dtype)
            entry = self._tables[key] = (table, inv_freq.clone())
        return entry[0]
