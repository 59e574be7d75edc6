"""Whether the compiled CPU kernel beats the paths without it on this machine: measured once and cached beside the
library, so that routing follows this CPU's numbers rather than constants measured on another.

The kernel serves a call where it can (cpu_flash.serves), unless a calibration of this machine measured the path
without it (POSKIT_CPU_KERNEL=0's: blocked, padded SDPA) faster for that kind of call, one decision per form x
dtype: "qk" (q/k wider than v: PoPE), "distance_table" (a bias of positions: ALiBi, T5, KERPLE, ...),
"offset_embeddings" (relative PE's q . e), "contextual" (CoPE with gates from the keys), and equal-width q/k (the
rope family, xPos), which SDPA's own flash kernel serves too: "qk_equal" for full sequences and
"qk_equal_decode" for new queries against cached keys (DECODE_SHAPE, forward only, at each of
DECODE_QUERY_COUNTS new queries: a call takes the decision of the smallest count at or above its own, and past
the largest, qk_equal's), each in fp32 and bf16. "magnitude_decode" (PoPE's one new token against a cache of key
magnitudes, timed at DECODE_SHAPE with one query head per kv head) weighs the kernel's decode against the
torch.compile'd loops that take the step without it (attention/pope_decode.py); steps of several new tokens, whose
path without the kernel rebuilds the Cartesian keys of the whole cache (measured 1.2-12x slower), keep the kernel.
`poskit kernel calibrate` measures it (cli/kernel.py; and `poskit kernel build` after building): forward +
backward of one causal call per form and dtype at B=2, H=8, T=1024, d=64 with the threads torch has, medians of
interleaved rounds. A form keeps the kernel unless its median exceeds the fallback's by MARGIN (a MEASURED_ONLY
form takes it only when it is faster by MARGIN), so that noise on a shared machine does not flip a default.
Without a calibration the kernel serves (faster than the paths without it wherever docs/benchmarks.md compared
the two), except the MEASURED_ONLY forms: equal-width q/k stay on SDPA unless this machine measured the kernel
faster (it was on the AVX-512 AMD EPYC of docs/benchmarks.md; on other CPUs the two were never compared).

The same file keeps the backward's query tile at long sequences (TILE_SHAPE): the faster of TILE_CHOICES by the
median of interleaved backward passes; without it the kernel takes cpu_flash.BLOCK_Q_BACKWARD, measured on an
AMD EPYC.

On a CPU with AVX512_BF16 it also keeps whether bf16 calls take the kernel's bf16 products (cpu_flash.cpp) or
widen bf16 to fp32: PoPE's widths at SHAPE, forward + backward, the products kept unless widening was faster by
MARGIN; without a measurement they are taken wherever the CPU has them.

PoPE's decode against cached magnitudes (cpu_flash.magnitude_decode) takes products of tiles from some number of
query rows per kv head and fused loops below it; the calibration keeps that number per dtype (DECODE_ROWS_SHAPE,
the smallest of DECODE_ROW_COUNTS from which the products were faster at it and every larger count); without it
the library's default (decode_tiled_rows(), measured on an AMD EPYC).

The flash forms (every call of cpu_flash_attention) take a decode form for few query rows per kv head (new
queries x query heads per kv head: cpu_flash.cpp's flash_decode_kernel) and the tiles from some number of rows on;
the calibration keeps that number per dtype too (FLASH_DECODE_ROWS_SHAPE, FLASH_DECODE_ROW_COUNTS new queries of
one query head per kv head, chosen as PoPE's); without it cpu_flash.FLASH_DECODE_TILED_ROWS.

POSKIT_KERNEL_CALIBRATION=off (read at every call) routes by the defaults as if nothing were measured: the same
paths on every machine, for runs whose numbers should not depend on where they ran (unset or "on": read it).

Why per CPU: on an Intel Xeon with AMX, bf16 SDPA ran faster than the kernel's bf16 (widened to fp32 there when it
was measured, its bf16 products then a hand-written AVX512_BF16 loop; they now go through oneDNN's brgemm, which
takes the AMX tiles) (docs/benchmarks.md, "Second CPU family"); whether that makes a fallback faster for some form
is what the calibration answers on each machine.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .env_switch import switched_on

FILE_NAME = "calibration.json"
ENV_SWITCH = "POSKIT_KERNEL_CALIBRATION"
FORMS = ("qk", "distance_table", "offset_embeddings", "contextual", "qk_equal", "qk_equal_decode",
         "magnitude_decode")
MEASURED_ONLY = frozenset({"qk_equal", "qk_equal_decode"})  # the kernel takes these only where measured faster
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# the encoding measured for each form (the kernel serves every encoding of a form by the same code)
ENCODINGS = {"qk": ("pope", {}), "distance_table": ("alibi", {}),
              "offset_embeddings": ("relative-capped", {"max_distance": 256}), "contextual": ("cope", {}),
              "qk_equal": ("rope", {}), "qk_equal_decode": ("rope", {}), "magnitude_decode": ("pope", {})}
MARGIN = 1.10  # the fallback must be this much faster before it replaces the kernel
SHAPE = {"B": 2, "H": 8, "T": 1024, "D": 64}
# "qk_equal_decode": new queries per sequence against T cached keys, the step timed alone (memory-bound for one
# query; the kernel's advantage grows with the count: docs/benchmarks.md, "Decode against a cache with room to
# grow", gives one machine's times at each count)
DECODE_SHAPE = {"B": 8, "H": 8, "T": 8192, "D": 64}
DECODE_QUERY_COUNTS = (1, 4, 16, 64)
# Without counts measured (a calibration written before they were), up to this many queries against cached keys
# take qk_equal_decode's one decision and more take qk_equal's.
DECODE_QUERIES = 16
# The kernel's backward query tile from cpu_flash.LONG_KEYS keys on, measured at this shape (PoPE's 128-wide q/k,
# 64-wide values: the widest case the kernel serves by default), one choice per machine: whether a head's keys,
# values and their gradients stay in cache at that length depends on the CPU's caches.
TILE_SHAPE = {"B": 1, "H": 8, "T": 4096, "E": 128, "Dv": 64}
TILE_CHOICES = (64, 128)
# PoPE's decode: rows per kv head (new tokens x query heads per kv head) timed through the fused loops and the
# products of tiles, against this many cached keys
DECODE_ROWS_SHAPE = {"B": 8, "Hkv": 8, "T": 4096, "D": 64}
DECODE_ROW_COUNTS = (4, 8, 16, 32, 64)
# The flash forms' decode: rows per kv head timed through the decode form and the tiles (from one row: the tiles
# may be faster for a single query on some CPU)
FLASH_DECODE_ROWS_SHAPE = {"B": 8, "Hkv": 8, "T": 4096, "D": 64}
FLASH_DECODE_ROW_COUNTS = (1, 2, 4, 8, 16, 32)

_measuring = False  # while True, serves() ignores the calibration (a calibration measures the kernel itself)


class CalibrationError(ValueError):
    """A calibration file that cannot be read: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Calibration:
    """What a calibration file says (each part None or absent where it was not measured)."""
    kernel: dict = field(default_factory=dict)  # {(form, dtype name): whether the kernel serves}
    long_block_q: int | None = None  # the backward's query tile from cpu_flash.LONG_KEYS keys on
    bf16_products: bool | None = None  # whether bf16 calls take the kernel's bf16 products
    # {dtype name: ((new queries, whether the kernel serves), ...) ascending}: qk_equal_decode by query count
    decode_queries: dict = field(default_factory=dict)
    # {dtype name: rows per kv head from which PoPE's decode takes products of tiles}
    decode_tiled_rows: dict = field(default_factory=dict)
    # {dtype name: rows per kv head from which the flash forms take the tiles rather than the decode form}
    flash_decode_tiled_rows: dict = field(default_factory=dict)


NOTHING_MEASURED = Calibration()


def path_for(library: Path) -> Path:
    return Path(library).parent / FILE_NAME


def decide(kernel_ms: float, fallback_ms: float, form: str | None = None) -> bool:
    """Whether the kernel serves: whichever path serves a form without a calibration keeps it unless the other
    is faster by more than MARGIN (the kernel, or for the MEASURED_ONLY forms SDPA)."""
    if form in MEASURED_ONLY:
        return MARGIN * kernel_ms <= fallback_ms
    return kernel_ms <= MARGIN * fallback_ms


def read(path: Path) -> Calibration:
    """A calibration file's decisions (CalibrationError naming the file where it cannot be read)."""
    try:
        return parse(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CalibrationError(f"{path}: not a readable kernel calibration ({type(err).__name__}: {err}); "
                               "`poskit kernel calibrate` writes it again") from None


def parse(doc: dict) -> Calibration:
    """A calibration document's decisions (as `write` takes it); ValueError, KeyError, TypeError or
    AttributeError where it is not one (read() names the file)."""
    kernel, decode_queries = {}, {}
    for key, entry in doc["results"].items():
        form, dtype = key.split("/")
        if form not in FORMS or dtype not in DTYPES or not isinstance(entry.get("kernel"), bool):
            raise ValueError(f"entry {key!r}")
        kernel[(form, dtype)] = entry["kernel"]
        if "queries" in entry:  # absent in a calibration written before the counts were measured
            if form != "qk_equal_decode":
                raise ValueError(f"{key}: only qk_equal_decode is timed by query count")
            decode_queries[dtype] = _read_query_counts(key, entry["queries"])
    products = None
    if "bf16_products" in doc:  # absent where the CPU cannot, or in a calibration written before they existed
        products = doc["bf16_products"]["use"]
        if not isinstance(products, bool):
            raise ValueError(f"bf16_products.use {products!r} is not true or false")
    tile = None
    if "backward_tile" in doc:  # absent in a calibration written before tiles were measured
        tile = doc["backward_tile"]["block_q"]
        if type(tile) is not int or tile not in TILE_CHOICES:
            raise ValueError(f"backward_tile.block_q {tile!r} is not one of {TILE_CHOICES}")
    # both absent in a calibration written before their thresholds were measured
    tiled_rows, flash_rows = (_read_tiled_rows(doc, section) for section in ("pope_decode_rows", "flash_decode_rows"))
    return Calibration(kernel, tile, products, decode_queries, tiled_rows, flash_rows)


def _read_tiled_rows(doc: dict, section: str) -> dict:
    """{dtype name: rows} of a section's "tiled_rows" (empty where the section is absent)."""
    found = {}
    for dtype, rows in doc.get(section, {"tiled_rows": {}})["tiled_rows"].items():
        if dtype not in DTYPES or type(rows) is not int or rows < 1:
            raise ValueError(f"{section}.tiled_rows: {dtype!r}: {rows!r} is not a positive integer")
        found[dtype] = rows
    return found


def _read_query_counts(key: str, queries: dict) -> tuple:
    counts = []
    for count, timed in queries.items():
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{key}: {count!r} is not a query count (a positive integer)")
        if not isinstance(timed.get("kernel"), bool):
            raise ValueError(f"{key}: the decision at {count} queries is not true or false")
        counts.append((int(count), timed["kernel"]))
    return tuple(sorted(counts))


@functools.lru_cache(maxsize=None)
def _decisions_at(path: str) -> Calibration:
    file = Path(path)
    if not file.exists():
        return NOTHING_MEASURED
    try:
        return read(file)
    except CalibrationError as err:
        warnings.warn(f"poskit: {err}; the CPU kernel serves every call it can but the rope family's (SDPA's)",
                      RuntimeWarning, stacklevel=4)
        return NOTHING_MEASURED


def read_switch() -> bool:
    """Whether routing reads this machine's calibration: POSKIT_KERNEL_CALIBRATION unset or on (the default)."""
    return switched_on(ENV_SWITCH, "route by this machine's calibration", "by the defaults")


def decisions(library: Path | None) -> Calibration:
    """This machine's decisions, read once per process and file (NOTHING_MEASURED: none, or not to be read)."""
    if library is None or _measuring or not read_switch():
        return NOTHING_MEASURED
    return _decisions_at(_path_text(library))


@functools.lru_cache(maxsize=None)
def _path_text(library: Path) -> str:
    # asked at every planned call on CPU: building the Path there cost ~5 us a call, a visible part of a small
    # call's ~50 us of planning
    return str(path_for(library))


def kernel_wins(library: Path | None, form: str, dtype: torch.dtype) -> bool:
    """Whether the kernel should serve a call of this form and dtype on this machine: as measured; unmeasured,
    yes except for the MEASURED_ONLY forms; always while a calibration measures the kernel."""
    if _measuring:
        return True
    name = _dtype_name(dtype)
    return decisions(library).kernel.get((form, name), form not in MEASURED_ONLY)


def cached_keys_kernel_wins(library: Path | None, queries: int, dtype: torch.dtype) -> bool:
    """Whether the kernel should serve `queries` new queries of an equal-width q/k encoding against more keys (a
    KV cache's, encoded or raw): the decision measured at the smallest of this machine's DECODE_QUERY_COUNTS at
    or above `queries`, and past the largest, full sequences' (qk_equal); without counts measured,
    qk_equal_decode's one decision up to DECODE_QUERIES queries and qk_equal's beyond."""
    if _measuring:
        return True
    name = _dtype_name(dtype)
    counts = decisions(library).decode_queries.get(name)
    if counts:
        return next((use for count, use in counts if queries <= count), kernel_wins(library, "qk_equal", dtype))
    return kernel_wins(library, "qk_equal_decode" if queries <= DECODE_QUERIES else "qk_equal", dtype)


def bf16_products_win(library: Path | None) -> bool:
    """Whether bf16 calls should take the kernel's bf16 products on this machine (True unless measured slower)."""
    return decisions(library).bf16_products is not False


def _dtype_name(dtype: torch.dtype) -> str | None:
    """The DTYPES name of `dtype` (None for one the calibration does not measure)."""
    return next((n for n, d in DTYPES.items() if d == dtype), None)


def decode_tiled_rows(library: Path | None, dtype: torch.dtype) -> int | None:
    """The rows per kv head from which PoPE's decode takes products of tiles on this machine (None: not measured)."""
    name = _dtype_name(dtype)
    return decisions(library).decode_tiled_rows.get(name)


def flash_decode_tiled_rows(library: Path | None, dtype: torch.dtype) -> int | None:
    """The rows per kv head from which the flash forms take the tiles rather than the decode form on this machine
    (None: not measured)."""
    return decisions(library).flash_decode_tiled_rows.get(_dtype_name(dtype))


def choose_tiled_rows(ms: dict[int, tuple[float, float]]) -> int:
    """From {rows: (fused loops ms, products ms)}: the smallest count from which the products were faster at it
    and at every larger count; none such: twice the largest count (the loops up to there and beyond)."""
    counts = sorted(ms)
    chosen = 2 * counts[-1]
    for count in reversed(counts):
        loops, products = ms[count]
        if products >= loops:
            break
        chosen = count
    return chosen


def long_backward_block_q(library: Path | None) -> int | None:
    """This machine's measured backward query tile at long sequences (None: not measured)."""
    return decisions(library).long_block_q


def choose_tile(ms: dict[int, float]) -> int:
    """The tile with the lowest median time."""
    return min(ms, key=ms.get)


@contextlib.contextmanager
def ignoring_calibration():
    """Within it the kernel serves every call it can, whatever the calibration says (to measure the kernel)."""
    global _measuring
    saved, _measuring = _measuring, True
    try:
        yield
    finally:
        _measuring = saved


def write(library: Path, doc: dict) -> Path:
    """Save a calibration document ({"results": {"form/dtype": {"kernel": bool, ...}}, ...}) beside `library`,
    atomically, and forget what this process had read."""
    path = path_for(library)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json.tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    _decisions_at.cache_clear()
    return path
