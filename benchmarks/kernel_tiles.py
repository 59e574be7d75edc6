"""The compiled CPU kernel's backward at several query-tile heights: which tile to use at which length.

    python benchmarks/kernel_tiles.py --shapes 1x4096,8x1024 --widths 128,64 --tiles 64,128,256 --rounds 9

Times the kernel's backward alone (causal, H=8, value width 64, q/k width 128 as PoPE's Cartesian q/k or 64 as
a bias form's), each tile height once per round, rounds alternating their order, and prints per shape the
median time of each tile and the median over rounds of its time divided by the first tile's in the same round:
paired ratios, so that a drift in the machine's speed between rounds cancels. The forward always uses the
default tile (its output and logsumexp do not depend on the tiling), so only the backward differs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from _harness import keep_freed_memory, table  # noqa: E402
from poskit.attention import cpu_flash  # noqa: E402
from poskit.attention.kernel_timing import backward_timer, interleaved  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x4096,8x1024", help="BxT pairs, comma-separated")
    ap.add_argument("--widths", default="128,64", help="q/k widths E (128: PoPE's Cartesian q/k; 64: d)")
    ap.add_argument("--tiles", default="64,128,256", help="backward query-tile heights; the first is the reference")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not cpu_flash.available():
        sys.exit("the compiled CPU kernel is not available on this machine (`poskit kernel info` says why)")
    tiles = [int(t) for t in args.tiles.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        B, T = (int(x) for x in shape.split("x"))
        for E in (int(w) for w in args.widths.split(",")):
            times = interleaved(backward_timer(B, T, E), tiles, args.rounds)
            for tile in tiles:
                ratio = statistics.median(a / b for a, b in zip(times[tile], times[tiles[0]]))
                rows.append(dict(B=B, T=T, E=E, tile=tile, ms=f"{1000 * statistics.median(times[tile]):.1f}",
                                 ratio=f"{ratio:.3f}"))
                print(rows[-1], file=sys.stderr, flush=True)
    print(f"kernel backward, causal, H=8, Dv=64, {args.threads} threads, medians of {args.rounds} rounds; "
          f"ratio: paired, against tile {tiles[0]}")
    print(table(rows, ["B", "T", "E", "tile", "ms", "ratio"]))


if __name__ == "__main__":
    keep_freed_memory()
    main()
