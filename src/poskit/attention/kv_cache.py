"""Key/value cache for incremental decoding, for every encoding kind.

The cache stores, per layer, the keys and values appended so far with their positions. Keys are stored
raw (before the encoding) by default: that is what CoPE needs (its gates are recomputed per query from
raw keys), what dynamic NTK needs (its frequencies change with the length), and what keeps ALiBi /
relative / none exact. For static rotary encodings (rope and pope) the engine stores the encoded key
instead, which saves re-encoding the whole cache at every step.

Storage is preallocated and grows by doubling, so appending one token copies one token (amortised), not
the whole cache as `torch.cat` would: with `cat`, a decode step at 8k cached keys spent most of its time
copying the cache. Pass `max_length` to allocate once. `keys`, `values`, `positions` are views of the
filled part.

Padded batches: each append may carry a (B, T) bool `key_mask` (True = real token, False = padding), stored
beside the keys (grown, cropped and validated with them) so that later steps never attend to the pads. A
layer that never received one has `key_mask` None (every key real). Tensors that require grad are appended out of place instead, so backpropagating through
several decode steps stays correct.

A step is all or nothing: inside `undone_on_error()` (the engine's cached attention and the models' forward
passes run in it) an exception restores every layer as it was before the block, so a step that fails after
appending (a later layer, the attention itself) leaves no half-appended tokens behind.
"""
from __future__ import annotations

import contextlib

import torch

from .inputs import all_finite

_MIN_CAPACITY = 64  # the first allocation of a layer: small prompts then grow by doubling


def _check_length(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


class _Buffer:
    """A tensor grown along `dim` by doubling; `view()` is the filled part."""

    def __init__(self, dim: int):
        self.dim, self.data, self.length = dim, None, 0

    def view(self) -> torch.Tensor | None:
        return None if self.data is None else self.data.narrow(self.dim, 0, self.length)

    def append(self, new: torch.Tensor, reserve: int, out_of_place: bool = False) -> None:
        if self.length == 0:
            # empty (new, or cropped to 0): start afresh, the old allocation may have another width or dtype
            self.data = None
        if out_of_place:
            old = self.view()
            self.data = new if old is None else torch.cat((old, new), self.dim)
            self.length = self.data.shape[self.dim]
            return
        n = new.shape[self.dim]
        end = self.length + n
        if self.data is None or end > self.data.shape[self.dim]:
            old = self.view()
            shape = list(new.shape)
            shape[self.dim] = max(end, reserve, 2 * (0 if self.data is None else self.data.shape[self.dim]))
            self.data = new.new_empty(shape)
            if old is not None:
                self.data.narrow(self.dim, 0, self.length).copy_(old)
        self.data.narrow(self.dim, self.length, n).copy_(new)
        self.length = end

    def check_extends(self, name: str, new: torch.Tensor) -> None:
        """Raise ValueError unless `new` can be appended to the filled buffer: the cached dtype and device
        (a copy would silently cast or move it), and its sizes outside the batch and growing dims."""
        data = self.data
        if new.dtype != data.dtype or new.device != data.device:
            raise ValueError(f"{name} must have the cached dtype {data.dtype} on {data.device} to extend the cache, "
                             f"got {new.dtype} on {new.device}")
        if new.dim() == data.dim():  # positions may come as (T,) against (1|B, T): checked by the caller
            for i in range(1, data.dim()):
                if i != self.dim and new.shape[i] != data.shape[i]:
                    what = "channels" if i == data.dim() - 1 else f"entries in dim {i}"
                    raise ValueError(f"{name} must have {data.shape[i]} {what} to extend the cache, got shape "
                                     f"{tuple(new.shape)}")

    def expand_batch(self, b: int) -> None:
        # shared (1, T) positions meeting per-batch (B, T) ones: store (B, T) from now on
        if self.data is not None and self.data.shape[0] != b:
            self.data = self.data.expand(b, *self.data.shape[1:]).clone()


class LayerCache:
    """One layer's cached keys (raw, or encoded when `encoded`), values, positions and CoPE gate keys."""

    def __init__(self, reserve: int = _MIN_CAPACITY):
        self._reserve = reserve
        self._keys, self._values, self._gate_keys = _Buffer(2), _Buffer(2), _Buffer(2)
        self._positions = _Buffer(1)
        self._angles = _Buffer(1)  # per-position tables an encoding keeps beside its cached keys (pope)
        self._key_mask = _Buffer(1)  # (B, T) bool, True = real token; empty until a mask is first appended
        self.encoded = False
        self._keys_finite = True  # no cached key (or gate key) is NaN or infinite: checked per append

    def _buffers(self) -> tuple:
        return self._keys, self._values, self._gate_keys, self._key_mask, self._positions, self._angles

    @property
    def keys_finite(self) -> bool:
        """Whether every cached key (and gate key) is finite: checked on each append (the new keys only), so
        that a decode step need not read the whole cache for it (the fast paths take finite keys only)."""
        return self._keys_finite

    @property
    def keys(self) -> torch.Tensor | None:  # (B, Hkv, T, D) raw keys, or encoded keys when `encoded`
        return self._keys.view()

    @property
    def values(self) -> torch.Tensor | None:  # (B, Hkv, T, Dv)
        return self._values.view()

    @property
    def positions(self) -> torch.Tensor | None:  # (1|B, T) int64
        return self._positions.view()

    @property
    def gate_keys(self) -> torch.Tensor | None:  # (B, Hkv, T, D), CoPE separate gates only
        return self._gate_keys.view()

    @property
    def angles(self) -> torch.Tensor | None:  # (1|B, T, E): e.g. pope's cos and sin of each cached position
        return self._angles.view()

    @property
    def key_mask(self) -> torch.Tensor | None:  # (B, T) bool, True = real token; None: every cached key is real
        return self._key_mask.view()

    @property
    def length(self) -> int:
        return self._keys.length

    def next_positions(self) -> torch.Tensor | None:
        """(B,) or (1,) int64: per sequence, the position after its last real cached key (0 when it has none);
        None for an empty layer."""
        pos = self.positions
        if pos is None or pos.shape[-1] == 0:
            return None
        mask = self.key_mask
        if mask is not None:
            pos = pos.masked_fill(~mask, -1)
        return pos.amax(-1) + 1

    def check_append(self, keys, values, positions, gate_keys=None, encoded: bool = False, angles=None,
                     key_mask=None) -> None:
        """Raise ValueError unless `append` with these arguments can extend this layer; touches nothing.
        `append` calls it before writing anything, so a refused append leaves the layer as it was."""
        for name, t in (("keys", keys), ("values", values), ("positions", positions)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
        for name, t in (("gate_keys", gate_keys), ("angles", angles), ("key_mask", key_mask)):
            if t is not None and not isinstance(t, torch.Tensor):
                raise ValueError(f"{name} must be a tensor or None, got {type(t).__name__}")
        if keys.dim() != 4 or values.dim() != 4 or values.shape[:3] != keys.shape[:3]:
            raise ValueError(f"keys and values must be (B, H_kv, T, .) tensors with the same B, H_kv and T, got "
                             f"{tuple(keys.shape)} and {tuple(values.shape)}")
        if positions.dim() not in (1, 2) or positions.shape[-1] != keys.shape[2] or (
                positions.dim() == 2 and positions.shape[0] not in (1, keys.shape[0])):
            raise ValueError(f"positions must be (T,) or (1|B, T) with T={keys.shape[2]} and B={keys.shape[0]}, "
                             f"got {tuple(positions.shape)}")
        if positions.dtype.is_floating_point or positions.is_complex() or positions.dtype == torch.bool:
            raise ValueError(f"positions must be an integer tensor, got dtype {positions.dtype}")
        if gate_keys is not None and (gate_keys.shape[:3] != keys.shape[:3] or gate_keys.dtype != keys.dtype
                                      or gate_keys.device != keys.device):
            raise ValueError(f"gate_keys must be (B, H_kv, T, .) with the B, H_kv, T, dtype and device of keys "
                             f"{tuple(keys.shape)} {keys.dtype} {keys.device}, got {tuple(gate_keys.shape)} "
                             f"{gate_keys.dtype} {gate_keys.device}")
        if angles is not None and (angles.dim() != 3 or angles.shape[1] != keys.shape[2]
                                   or angles.shape[0] not in (1, keys.shape[0])):
            raise ValueError(f"angles must be (1|B, T, E) with T={keys.shape[2]} and B={keys.shape[0]}, "
                             f"got {tuple(angles.shape)}")
        if key_mask is not None and (key_mask.dtype != torch.bool or key_mask.shape != (keys.shape[0], keys.shape[2])
                                     or key_mask.device != keys.device):
            raise ValueError(f"key_mask must be a bool tensor of shape (B, T) = {(keys.shape[0], keys.shape[2])} on "
                             f"{keys.device} (True = real token), got {key_mask.dtype} {tuple(key_mask.shape)} on "
                             f"{key_mask.device}")
        if not self.length:
            return
        if self.encoded != encoded:
            raise ValueError("a layer cache cannot mix raw and encoded keys")
        cached = self._keys.data
        if keys.shape[:2] != cached.shape[:2] or keys.shape[-1] != cached.shape[-1]:
            raise ValueError(f"keys must have shape {tuple(cached.shape[:2])} + (T, {cached.shape[-1]}) to extend the "
                             f"cache, got {tuple(keys.shape)}")
        if (gate_keys is None) != (self._gate_keys.length == 0):
            raise ValueError("gate_keys must be given at every append or never (CoPE gates='separate')")
        if (angles is None) != (self._angles.length == 0):
            raise ValueError("angles must be given at every append or never")
        self._keys.check_extends("keys", keys)
        self._values.check_extends("values", values)
        self._positions.check_extends("positions", positions)
        if gate_keys is not None:
            self._gate_keys.check_extends("gate_keys", gate_keys)
        if angles is not None:
            self._angles.check_extends("angles", angles)

    def append(self, keys, values, positions, gate_keys=None, encoded: bool = False, angles=None,
               key_mask=None) -> "LayerCache":
        """Extend the layer by the new tokens (validated first: a refused append changes nothing); returns it.
        key_mask: (B, T) bool, True = real token, for padded batches (see the module docstring)."""
        self.check_append(keys, values, positions, gate_keys, encoded, angles, key_mask)
        return self._write(keys, values, positions, gate_keys, encoded, angles, key_mask)

    def _write(self, keys, values, positions, gate_keys, encoded, angles, key_mask=None) -> "LayerCache":
        # arguments already passed check_append (the engine checks once, then also the encoding's positions)
        if positions.dim() == 1:
            positions = positions.unsqueeze(0)
        if self.length and positions.shape[0] != self.positions.shape[0]:
            b = max(positions.shape[0], self.positions.shape[0])
            self._positions.expand_batch(b)
            self._angles.expand_batch(b)
            positions = positions.expand(b, -1)
        # autograd keeps the views that earlier steps attended to (positions included): an in-place write
        # would invalidate them, so differentiable decoding grows out of place (a copy per step, like cat)
        grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (keys, values, gate_keys, self.keys, self.values, self.gate_keys))
        self._append_key_mask(key_mask, keys, grad)  # before the keys: it reads the cached length
        self._keys_finite = (self._keys_finite or not self.length) and all_finite(keys, gate_keys)
        self._keys.append(keys, self._reserve, grad)
        self._values.append(values, self._reserve, grad)
        self._positions.append(positions, self._reserve, grad)
        if gate_keys is not None:
            self._gate_keys.append(gate_keys, self._reserve, grad)
        if angles is not None:
            if angles.shape[0] != self.positions.shape[0]:
                angles = angles.expand(self.positions.shape[0], *angles.shape[1:])
            self._angles.append(angles, self._reserve, grad)
        self.encoded = encoded
        return self

    def _append_key_mask(self, key_mask, keys, out_of_place: bool) -> None:
        # stored only once some append is padded: the keys cached before it are all real (filled with True),
        # and unpadded appends after it extend the mask with True
        if key_mask is None and self._key_mask.length == 0:
            return
        B, T = keys.shape[0], keys.shape[2]
        if key_mask is None:
            key_mask = torch.ones(B, T, dtype=torch.bool, device=keys.device)
        if self._key_mask.length == 0 and self.length:
            self._key_mask.append(torch.ones(B, self.length, dtype=torch.bool, device=keys.device), self._reserve)
        self._key_mask.append(key_mask, self._reserve, out_of_place)  # (autograd may hold the old view)

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` (1-D int64, repeats allowed) of every cached tensor, in that order: beam
        search reorders its beams with it, and expanding a prompt to several beams repeats rows. Positions and
        per-position tables shared by the whole batch (batch 1 while the keys have more) stay shared."""
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"index must be a 1-D integer tensor of batch rows, got "
                             f"{getattr(index, 'shape', type(index).__name__)} {getattr(index, 'dtype', '')}")
        if not self.length:
            return
        batch = self._keys.data.shape[0]
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= batch):
            raise ValueError(f"index must hold batch rows in [0, {batch - 1}], got {index.tolist()}")
        for buf in self._buffers():
            if buf.data is not None and buf.length and buf.data.shape[0] == batch:
                buf.data = buf.data.index_select(0, index.to(buf.data.device))
        self._recheck_keys()

    def crop(self, length: int) -> None:
        """Keep the first `length` cached tokens (drop the rest): rejected drafts, beam restarts, benchmarks."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise ValueError(f"length must be an int in [0, {self.length}], got {length!r}")
        for buf in (self._keys, self._values, self._positions):
            buf.length = length
        self._angles.length = min(self._angles.length, length)
        self._gate_keys.length = min(self._gate_keys.length, length)
        self._key_mask.length = min(self._key_mask.length, length)
        self._recheck_keys()

    def _state(self) -> tuple:
        # the buffers' tensors and lengths, and the flags: an append writes past the old length, into a new
        # allocation when it grows or widens, so the old tensors and lengths restore the layer exactly
        return [(buf, buf.data, buf.length) for buf in self._buffers()], self.encoded, self._keys_finite

    def _restore(self, state: tuple) -> None:
        buffers, self.encoded, self._keys_finite = state
        for buf, data, length in buffers:
            buf.data, buf.length = data, length

    @contextlib.contextmanager
    def undone_on_error(self):
        """Inside the block, an exception restores the layer as it was before it (and propagates)."""
        state = self._state()
        try:
            yield self
        except BaseException:
            self._restore(state)
            raise

    def _recheck_keys(self) -> None:
        # keys were dropped: those that were not finite may be gone (a finite cache stays finite)
        if not self._keys_finite:
            self._keys_finite = not self.length or all_finite(self.keys, self.gate_keys)


class KVCache:
    """Per-layer caches, created empty; `append` grows one layer and returns it (views of the filled part).

    max_length: tokens to allocate for at the first append (e.g. prompt + new tokens); the cache still
    grows past it by doubling if more arrive.
    """

    def __init__(self, num_layers: int, max_length: int | None = None):
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        _check_length("max_length", max_length)
        self.num_layers, self.max_length = num_layers, max_length
        self.reset()

    def layer(self, idx: int) -> LayerCache:
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < self.num_layers:
            raise ValueError(f"layer index must be in [0, {self.num_layers - 1}], got {idx!r}")
        return self.layers[idx]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def next_position(self) -> int:
        """The position after the last cached one (0 for an empty cache)."""
        pos = self.layers[0].positions
        return 0 if pos is None or pos.numel() == 0 else int(pos.max()) + 1

    def next_positions(self) -> torch.Tensor | None:
        """(B,) (or (1,) when positions are shared) int64: per sequence, the position after its last real
        cached token, pads excluded (0 for a sequence with none); None for an empty cache."""
        return self.layers[0].next_positions()

    def append(self, idx: int, keys, values, positions, gate_keys=None, encoded: bool = False,
               angles=None, key_mask=None) -> LayerCache:
        return self.layer(idx).append(keys, values, positions, gate_keys, encoded, angles, key_mask)

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens of every layer (a layer holding fewer keeps what it has)."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise ValueError(f"length must be an int in [0, {self.length}], got {length!r}")
        for layer in self.layers:
            layer.crop(min(length, layer.length))

    @contextlib.contextmanager
    def undone_on_error(self):
        """Inside the block, an exception restores every layer as it was before it (and propagates): a forward
        pass that fails after some layers appended leaves the cache as it found it."""
        states = [(layer, layer._state()) for layer in self.layers]
        try:
            yield self
        except BaseException:
            for layer, state in states:
                layer._restore(state)
            raise

    def select_batch(self, index) -> None:
        """Keep the batch rows `index` of every layer (beam search: the hypotheses that survive a step)."""
        index = torch.as_tensor(index)
        if index.dim() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ValueError(f"index must be a 1-D integer tensor of batch rows, got {index.dtype} {tuple(index.shape)}")
        batch = next((layer.keys.shape[0] for layer in self.layers if layer.length), None)
        if batch is not None and index.numel() and not (0 <= int(index.min()) and int(index.max()) < batch):
            raise ValueError(f"index must hold batch rows in [0, {batch - 1}], got [{int(index.min())}, "
                             f"{int(index.max())}]")
        for layer in self.layers:
            layer.select_batch(index.to(layer.keys.device) if layer.length else index)

    def reset(self) -> None:
        self.layers = [LayerCache(self.max_length or _MIN_CAPACITY) for _ in range(self.num_layers)]


def undone_on_error(cache: KVCache | None):
    """`cache.undone_on_error()`, or a context that does nothing without a cache: what a model runs its layers
    in, so that one forward pass appends to every layer or to none."""
    return contextlib.nullcontext() if cache is None else cache.undone_on_error()
