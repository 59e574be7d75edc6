"""`poskit kernel build|info`: the compiled CPU attention kernel (poskit/attention/cpu_flash.cpp).

build: compile it now into the per-machine cache (otherwise the first attention call that needs it does), or
    again with --force, then calibrate (unless --no-calibrate). calibrate: time the kernel against the paths
    without it for each kind of call and dtype on this machine and keep the kernel only where it is not slower
    (for the rope family, only where it is faster than SDPA), and choose its backward's query tile at long
    sequences (saved beside the library; attention/kernel_calibration.py), and on a CPU with AVX512_BF16 whether
    bf16 calls take bf16 products. info:
    what this machine would use: CPU model and instruction set, compiler, cache directory, whether the library is
    built, its calibration, how bf16 multiplies, and whether attention uses it.
"""
from __future__ import annotations

import platform
from pathlib import Path


def add_kernel(sub) -> None:
    p = sub.add_parser("kernel", help="the compiled CPU attention kernel: build it ahead of use, or say where it is",
                       description=__doc__.split("\n", 2)[2].strip())
    p.add_argument("action", choices=["build", "calibrate", "info"])
    p.add_argument("--force", action="store_true", help="build: compile again even if the cached library exists")
    p.add_argument("--no-calibrate", action="store_true",
                   help="build: skip measuring the kernel against the paths without it (about a minute on 2 cores)")
    p.set_defaults(func=cmd_kernel)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cmd_kernel(args) -> int:
    import torch

    from poskit.attention import cpu_flash, kernel_build

    if args.action == "build":
        try:
            library = kernel_build.build(force=args.force, progress=print)
            kernel_build.load(build_if_missing=False)
        except kernel_build.KernelUnavailable as err:
            raise ValueError(f"cannot build the CPU attention kernel: {err}") from None
        print(f"ready: {library}")
        if not args.no_calibrate:
            _calibrate(library)
        return 0
    if args.action == "calibrate":
        try:
            library = kernel_build.load(build_if_missing=False)
        except kernel_build.KernelUnavailable as err:
            raise ValueError(f"cannot calibrate the CPU attention kernel: {err}") from None
        _calibrate(library)
        return 0
    compiler = kernel_build.find_compiler()
    try:
        library = kernel_build.cached_library()
        version = kernel_build.compiler_version(compiler) if compiler else None
    except kernel_build.KernelUnavailable as err:
        library, version = None, f"unusable ({err})"
    try:
        switch = "on" if cpu_flash.enabled() else f"off ({cpu_flash.ENV_SWITCH}=0)"
    except ValueError as err:
        switch = str(err)
    print(f"cpu:         {cpu_model()} ({torch.get_num_threads()} threads)")
    print(f"isa:         {kernel_build.isa_level()} (torch {torch.__version__})")
    print(f"compiler:    {compiler or 'none found'}" + (f" ({version})" if version else ""))
    print(f"cache:       {kernel_build.cache_root()}")
    print(f"library:     {library if library and library.exists() else 'not built (poskit kernel build)'}")
    print(f"calibration: {_calibration_line(library)}")
    print(f"bf16:        {_bf16_line(library)}")
    print(f"attention:   {switch}")
    return 0


def _timed_pair(enc, dtype, rounds: int) -> tuple[float, float]:
    """(kernel ms, ms without it): medians of interleaved forward + backward rounds of one causal call at
    kernel_calibration.SHAPE."""
    import time

    import torch

    import poskit
    from poskit.attention import cpu_flash, kernel_calibration, kernel_timing

    g = torch.Generator().manual_seed(0)
    shape = kernel_calibration.SHAPE
    q, k, v = (torch.randn(shape["B"], shape["H"], shape["T"], shape["D"], generator=g).to(dtype).requires_grad_()
               for _ in range(3))

    def run(switch: str) -> float:
        started = time.perf_counter()
        with cpu_flash.switched(switch):
            out = poskit.attention(q, k, v, enc, is_causal=True)
            out.backward(torch.ones_like(out))
        return time.perf_counter() - started

    ms = kernel_timing.medians_ms(kernel_timing.interleaved(run, ["1", "0"], rounds))
    return ms["1"], ms["0"]


def _timed_decode_pair(enc, dtype, rounds: int, queries: int = 1) -> tuple[float, float]:
    """(kernel ms, ms without it) of one step against cached keys at kernel_calibration.DECODE_SHAPE (encoded, or
    for PoPE magnitudes): `queries` new tokens per sequence, appended and attended, the cache rolled back (its room
    as generation leaves it)."""
    import time

    import torch

    from poskit.attention import KVCache, cached_attention, cpu_flash, kernel_calibration, kernel_timing, pope_decode

    shape = kernel_calibration.DECODE_SHAPE
    B, H, T, D = shape["B"], shape["H"], shape["T"], shape["D"]
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(B, H, T, D, generator=g).to(dtype) for _ in range(2))
    q1, k1, v1 = (torch.randn(B, H, queries, D, generator=g).to(dtype) for _ in range(3))
    positions, new = torch.arange(T)[None], torch.arange(T, T + queries)
    cache = KVCache(num_layers=1, max_length=T + max(kernel_calibration.DECODE_QUERY_COUNTS))
    with torch.no_grad():
        if enc.cache_form == "magnitude":  # PoPE: the magnitudes and their angle table, as its decode caches them
            magnitudes, angles = pope_decode.cache_entry(enc, k, positions)
            cache.append(0, magnitudes, v, positions, encoded=True, angles=angles)
        else:
            cache.append(0, enc.encode_k(k, positions), v, positions, encoded=True)

    def run(switch: str) -> float:
        started = time.perf_counter()
        with cpu_flash.switched(switch), torch.no_grad():
            cached_attention(q1, k1, v1, enc, cache, 0, new)
        elapsed = time.perf_counter() - started
        cache.crop(T)
        return elapsed

    ms = kernel_timing.medians_ms(kernel_timing.interleaved(run, ["1", "0"], rounds))
    return ms["1"], ms["0"]


def calibrate(library, *, rounds: int = 5, progress=print) -> dict:
    """Time the kernel against the paths without it for every form x dtype of attention/kernel_calibration.py,
    save the decisions beside `library` and return the document."""
    import warnings

    import torch

    import poskit
    from poskit.attention import kernel_calibration as kc
    from poskit.encodings.registration import UntrainedEncodingWarning
    from poskit.report.record import machine_info, utc_now

    results = {}
    with kc.ignoring_calibration(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UntrainedEncodingWarning)  # timed, never trained
        for form in kc.FORMS:
            name, options = kc.ENCODINGS[form]
            for dtype_name, dtype in kc.DTYPES.items():
                enc = poskit.build_encoding(name, head_dim=kc.SHAPE["D"], num_heads=kc.SHAPE["H"],
                                            dim=kc.SHAPE["H"] * kc.SHAPE["D"], **options).to(dtype)
                if form == "qk_equal_decode":
                    queries = {n: _decided(form, _timed_decode_pair(enc, dtype, rounds, n))
                               for n in kc.DECODE_QUERY_COUNTS}
                    entry = {"encoding": name, **queries[1], "queries": {str(n): t for n, t in queries.items()}}
                elif form == "magnitude_decode":
                    entry = {"encoding": name, **_decided(form, _timed_decode_pair(enc, dtype, rounds))}
                else:
                    entry = {"encoding": name, **_decided(form, _timed_pair(enc, dtype, rounds))}
                results[f"{form}/{dtype_name}"] = entry
                progress(f"  {form:18s} {dtype_name:8s} kernel {entry['kernel_ms']:8.1f} ms   without it "
                         f"{entry['fallback_ms']:8.1f} ms   -> {'kernel' if entry['kernel'] else 'without it'}"
                         + ("" if "queries" not in entry else "   (by new queries: " + ", ".join(
                             f"{n}: {'kernel' if t['kernel'] else 'without'}" for n, t in entry["queries"].items())
                            + ")"))
        backward_tile = _measured_tile(rounds, progress)
        products = _measured_products(rounds, progress)
        decode_rows = _measured_decode_rows(rounds, progress)
        flash_rows = _measured_flash_decode_rows(rounds, progress)
    doc = {"date": utc_now(), "machine": machine_info(), "threads": torch.get_num_threads(), "shape": kc.SHAPE,
           "rounds": rounds, "margin": kc.MARGIN, "results": results, "backward_tile": backward_tile,
           "pope_decode_rows": decode_rows, "flash_decode_rows": flash_rows}
    if products is not None:
        doc["bf16_products"] = products
    kc.write(library, doc)
    return doc


def _decided(form: str, timed: tuple[float, float]) -> dict:
    """{kernel_ms, fallback_ms, kernel}: the times rounded as saved first, so that the file's decisions follow from
    its numbers."""
    from poskit.attention import kernel_calibration as kc

    kernel_ms, fallback_ms = (round(ms, 2) for ms in timed)
    return {"kernel_ms": kernel_ms, "fallback_ms": fallback_ms, "kernel": kc.decide(kernel_ms, fallback_ms, form)}


def _measured_tile(rounds: int, progress) -> dict:
    """The backward's query tile at long sequences: the faster of kernel_calibration.TILE_CHOICES at TILE_SHAPE."""
    from poskit.attention import kernel_calibration as kc
    from poskit.attention import kernel_timing

    shape = kc.TILE_SHAPE
    run = kernel_timing.backward_timer(shape["B"], shape["T"], shape["E"], H=shape["H"], Dv=shape["Dv"])
    ms = {t: round(m, 2) for t, m in kernel_timing.medians_ms(
        kernel_timing.interleaved(run, list(kc.TILE_CHOICES), rounds)).items()}
    chosen = kc.choose_tile(ms)
    progress("  backward tile at long sequences  " + "   ".join(f"{t} rows {m:8.1f} ms" for t, m in ms.items())
             + f"   -> {chosen}")
    return {"shape": shape, "ms": {str(t): m for t, m in ms.items()}, "block_q": chosen}


def _measured_products(rounds: int, progress) -> dict | None:
    """Whether bf16 calls take the kernel's bf16 products: PoPE's widths at kernel_calibration.SHAPE, products
    against bf16 widened to fp32; None where the CPU cannot (nothing to decide)."""
    from poskit.attention import cpu_flash
    from poskit.attention import kernel_calibration as kc
    from poskit.attention import kernel_timing

    if not cpu_flash.bf16_products_available():
        progress("  bf16 products  not available here (no AVX512_BF16, not an AVX-512 build, or torch's oneDNN off): "
                 "bf16 is widened")
        return None
    shape = kc.SHAPE
    run = kernel_timing.products_timer(shape["B"], shape["T"], 2 * shape["D"], H=shape["H"], Dv=shape["D"])
    ms = {k: round(m, 2) for k, m in kernel_timing.medians_ms(kernel_timing.interleaved(run, [True, False],
                                                                                        rounds)).items()}
    use = kc.decide(ms[True], ms[False])
    progress(f"  bf16 products  {ms[True]:8.1f} ms   widened to fp32 {ms[False]:8.1f} ms   -> "
             + ("products" if use else "widened"))
    return {"shape": {**shape, "E": 2 * shape["D"], "Dv": shape["D"]}, "products_ms": ms[True],
            "widened_ms": ms[False], "use": use}


def _measured_decode_rows(rounds: int, progress) -> dict:
    """PoPE's decode against cached magnitudes at each of kernel_calibration.DECODE_ROW_COUNTS rows per kv head,
    through the fused loops and through the products of tiles, per dtype; the threshold chosen from them."""
    import torch

    from poskit.attention import cpu_flash
    from poskit.attention import kernel_calibration as kc

    shape = kc.DECODE_ROWS_SHAPE
    B, Hkv, T, D = shape["B"], shape["Hkv"], shape["T"], shape["D"]
    g = torch.Generator().manual_seed(0)
    angles = torch.rand(1, T, 2 * D, generator=g) * 2 - 1
    cache = _once_per_dtype(lambda dtype: (torch.rand(B, Hkv, T, D, generator=g).to(dtype),
                                           torch.randn(B, Hkv, T, D, generator=g).to(dtype)))

    def timer(dtype, rows: int):
        mu, v = cache(dtype)
        q = torch.randn(B, Hkv, rows, 2 * D, generator=g) / D
        return _timer(lambda path: cpu_flash.magnitude_decode(q, mu, v, angles,
                                                              tiled_rows=rows + 1 if path == "loops" else rows))
    return {"shape": shape, **_rows_threshold("pope decode rows", kc.DECODE_ROW_COUNTS, timer, ("loops", "products"),
                                              rounds, progress)}


def _measured_flash_decode_rows(rounds: int, progress) -> dict:
    """The flash forms' decode (one query head per kv head, causal by position) at each of
    kernel_calibration.FLASH_DECODE_ROW_COUNTS new queries, through the decode form and through the tiles, per
    dtype; the threshold chosen from them."""
    import torch

    from poskit.attention import cpu_flash
    from poskit.attention import kernel_calibration as kc

    shape = kc.FLASH_DECODE_ROWS_SHAPE
    B, Hkv, T, D = shape["B"], shape["Hkv"], shape["T"], shape["D"]
    g = torch.Generator().manual_seed(0)
    keys = torch.arange(T)[None]
    cache = _once_per_dtype(lambda dtype: tuple(torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2)))

    def timer(dtype, rows: int):
        q = torch.randn(B, Hkv, rows, D, generator=g).to(dtype)
        k, v = cache(dtype)
        return _timer(lambda path: cpu_flash.cpu_flash_attention(
            q, k, v, scale=D ** -0.5, q_positions=keys[:, T - rows:], k_positions=keys, causal=True,
            tiled_rows=rows + 1 if path == "decode" else 1))
    return {"shape": shape, **_rows_threshold("flash decode rows", kc.FLASH_DECODE_ROW_COUNTS, timer,
                                              ("decode", "tiles"), rounds, progress)}


def _rows_threshold(label: str, counts, timer, paths: tuple[str, str], rounds: int, progress) -> dict:
    """{"ms": {dtype: {rows: {"<below>_ms", "<from>_ms"}}}, "tiled_rows": {dtype: rows}}: timer(dtype, rows)(path)
    timed interleaved for both paths (the form below the threshold, the one from it on) at each count, and the
    threshold chosen from them (kernel_calibration.choose_tiled_rows)."""
    from poskit.attention import kernel_calibration as kc
    from poskit.attention import kernel_timing

    below, above = paths
    timed, chosen = {}, {}
    for name, dtype in kc.DTYPES.items():
        ms = {}
        for rows in counts:
            got = kernel_timing.medians_ms(kernel_timing.interleaved(timer(dtype, rows), list(paths), rounds))
            ms[rows] = (round(got[below], 2), round(got[above], 2))
        chosen[name] = kc.choose_tiled_rows(ms)
        timed[name] = {str(rows): {f"{below}_ms": a, f"{above}_ms": b} for rows, (a, b) in ms.items()}
        progress(f"  {label} {name:8s} " + "   ".join(f"{rows}: {a:.1f} / {b:.1f} ms" for rows, (a, b) in ms.items())
                 + f"   ({below} / {above}) -> {above} from {chosen[name]} rows")
    return {"ms": timed, "tiled_rows": chosen}


def _once_per_dtype(make):
    """get(dtype) -> make(dtype), made once per dtype: a timer's cache at every row count (each is up to 134 MB)."""
    made = {}

    def get(dtype):
        if dtype not in made:
            made[dtype] = make(dtype)
        return made[dtype]
    return get


def _timer(call):
    """run(path) -> seconds of one call(path)."""
    import time

    def run(path: str) -> float:
        started = time.perf_counter()
        call(path)
        return time.perf_counter() - started
    return run


def _calibrate(library) -> None:
    from poskit.attention import kernel_calibration

    print(f"calibrating: kernel against the paths without it, forward + backward, {kernel_calibration.SHAPE}, causal")
    found = kernel_calibration.parse(calibrate(library))
    off, tile, products = _without_kernel(found), found.long_block_q, found.bf16_products
    rows, flash_rows = _decode_rows_text(found.decode_tiled_rows), _decode_rows_text(found.flash_decode_tiled_rows)
    print(f"saved {kernel_calibration.path_for(library)}: the kernel serves "
          + ("every form and dtype" if not off else f"all but {', '.join(off)}")
          + (f"; its backward takes {tile}-row query tiles at long sequences" if tile else "")
          + (f"; PoPE's decode multiplies tiles from {rows} rows per kv head" if rows else "")
          + (f"; other calls take the tiles from {flash_rows} query rows per kv head" if flash_rows else "")
          + ({True: "; bf16 calls take bf16 products", False: "; bf16 is widened to fp32 (products measured slower)",
              None: ""}[products]))


def _decode_rows_text(rows: dict) -> str:
    """A calibrated threshold of rows per dtype as text ("16 (bfloat16), 8 (float32)")."""
    return ", ".join(f"{n} ({dtype})" for dtype, n in sorted(rows.items()))


def _without_kernel(found) -> list[str]:
    """The forms and dtypes a calibration keeps off the kernel ("form/dtype"; for the decode form measured per
    count of new queries, the counts)."""
    off = [f"{form}/{dtype}" for (form, dtype), use in sorted(found.kernel.items())
           if not use and not (form == "qk_equal_decode" and dtype in found.decode_queries)]
    for dtype, counts in sorted(found.decode_queries.items()):
        without = [str(n) for n, use in counts if not use]
        if without:
            off.append(f"qk_equal_decode/{dtype} at {', '.join(without)} new queries")
    return off


def _calibration_line(library) -> str:
    from poskit.attention import kernel_calibration

    if not library or not library.exists():
        return "none (no library)"
    path = kernel_calibration.path_for(library)
    try:
        if not kernel_calibration.read_switch():
            return f"ignored ({kernel_calibration.ENV_SWITCH}=off): routing by the defaults"
    except ValueError as err:
        return str(err)
    if not path.exists():
        return ("none (`poskit kernel calibrate`; meanwhile the kernel serves every call it can but the rope "
                "family's, which stay on SDPA)")
    try:
        found = kernel_calibration.read(path)
    except kernel_calibration.CalibrationError as err:
        return str(err)
    tile, products, off = found.long_block_q, found.bf16_products, _without_kernel(found)
    rows, flash_rows = _decode_rows_text(found.decode_tiled_rows), _decode_rows_text(found.flash_decode_tiled_rows)
    return (f"{path}: " + ("the kernel wins every form and dtype" if not off else f"without the kernel for {', '.join(off)}")
            + (f"; backward tile {tile} queries from {_long_keys()} keys" if tile else "; backward tile not measured")
            + (f"; PoPE's decode multiplies tiles from {rows} rows per kv head" if rows
               else "; PoPE's decode rows not measured")
            + (f"; other calls take the tiles from {flash_rows} query rows per kv head" if flash_rows
               else "; the decode form's rows not measured")
            + {True: "; bf16 products measured faster", False: "; bf16 products measured slower (widened)",
               None: ""}[products])


def _bf16_line(library) -> str:
    """How bf16 calls multiply on this machine (loading the library, when built, to ask it)."""
    import torch

    from poskit.attention import cpu_flash

    if not library or not library.exists():
        return "not known until the library is built"
    if not cpu_flash.bf16_products_available():
        return ("widened to fp32 per tile (this CPU has no AVX512_BF16, the library is not an AVX-512 build, or "
                "torch.backends.mkldnn is off)")
    if cpu_flash.uses_bf16_products(torch.bfloat16):
        return "bf16 products with fp32 accumulation (oneDNN brgemm: AMX tiles where the CPU has them, else AVX512_BF16)"
    return "widened to fp32 (this machine's calibration measured the bf16 products slower)"


def _long_keys() -> int:
    from poskit.attention import cpu_flash

    return cpu_flash.LONG_KEYS
