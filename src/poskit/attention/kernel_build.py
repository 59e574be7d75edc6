"""Building, caching and loading the compiled CPU attention kernel (cpu_flash.cpp) once per machine.

The library is compiled with the system's C++ compiler straight against torch's headers and libtorch_cpu (no
ninja, no Python extension module: the kernel registers torch operators, `torch.ops.poskit_cpu_flash`), into a
cache directory keyed by everything the binary depends on: the source, torch's version and C++ ABI, the
compiler (its `--version` line) and the instruction set it targets. The instruction set is the level of the CPU
torch itself dispatches to (`torch.backends.cpu.get_cpu_capability()`: AVX512, AVX2 or DEFAULT, which torch
reads from the CPU's feature flags), compiled for as the portable x86-64-v4 / v3 levels rather than
-march=native, so that a library built on one CPU runs on every CPU of the same level (an AMD and an Intel
AVX2 machine share one build).

Where: $POSKIT_KERNEL_CACHE, else $XDG_CACHE_HOME/poskit/kernels, else ~/.cache/poskit/kernels; one directory per
key holding the library and a manifest.json saying what it was built from. Concurrent first uses build once
(a file lock); a build writes a temporary file and renames it, so a reader never sees half a library.

Without a compiler: `poskit kernel build` on a machine with one, the same torch version and the same
instruction-set level, then copy the directory `poskit kernel info` prints into this machine's cache (or point
$POSKIT_CPU_KERNEL_LIB at the library file): the library is loaded as it is, nothing is compiled.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_flash.cpp")
LIBRARY_NAME = "poskit_cpu_flash.so"
CACHE_ENV = "POSKIT_KERNEL_CACHE"
PREBUILT_ENV = "POSKIT_CPU_KERNEL_LIB"
COMPILERS = ("c++", "g++", "clang++")
# torch's CPU capability -> the flags that target it (portable instruction-set levels, tuned for no one CPU)
ISA_FLAGS = {
    "AVX512": ["-march=x86-64-v4", "-mtune=generic"],
    "AVX2": ["-march=x86-64-v3", "-mtune=generic"],
}


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why in one line."""


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "poskit" / "kernels"


def isa_level() -> str:
    """The instruction-set level the build targets: torch's own CPU capability (AVX512, AVX2 or DEFAULT) on
    x86-64, DEFAULT elsewhere."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "DEFAULT"
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # an old torch without the query: the portable baseline
        return "DEFAULT"
    return capability if capability in ISA_FLAGS else "DEFAULT"


def find_compiler() -> str | None:
    """The C++ compiler: $CXX if set (its path or name on PATH), else the first of COMPILERS on PATH; None when
    there is none."""
    wanted = os.environ.get("CXX")
    if wanted:
        return shutil.which(wanted)
    for name in COMPILERS:
        found = shutil.which(name)
        if found:
            return found
    return None


@functools.lru_cache(maxsize=8)
def compiler_version(compiler: str) -> str:
    try:
        run = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        raise KernelUnavailable(f"the C++ compiler {compiler} does not run ({type(err).__name__}: {err})") from None
    lines = (run.stdout or run.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def _torch_dirs() -> tuple[Path, Path]:
    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib"


def compile_command(compiler: str, output: Path, *, isa: str | None = None, extra_flags=()) -> list[str]:
    """The compiler's command line for the library at `output`: for `isa` (default: isa_level()), with
    `extra_flags` after the optimisation level (tests/test_cpu_flash_sanitized.py adds the sanitizers')."""
    include, lib = _torch_dirs()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    isa = isa_level() if isa is None else isa
    return [compiler, "-O3", *extra_flags, "-std=c++20", "-fPIC", "-shared", "-fopenmp", *ISA_FLAGS.get(isa, []),
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w",
            "-I", str(include), "-I", str(include / "torch" / "csrc" / "api" / "include"),
            str(SOURCE), "-o", str(output),
            "-L", str(lib), "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}"]


def build_key(compiler: str) -> dict:
    """What the library depends on; its hash names the cache directory."""
    return {
        "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "cxx11_abi": int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1)),
        "compiler": compiler_version(compiler),
        "isa": isa_level(),
        "flags": _flags_without_paths(),
    }


def _flags_without_paths() -> list[str]:
    """The compiler's flags with the source's and torch's directories written as placeholders: where a checkout
    or an environment lies changes nothing in the binary (the source's bytes and torch's version are keyed
    apart), so two checkouts of one commit share one build and its calibration."""
    include, lib = (str(path) for path in _torch_dirs())
    placeholders = ((str(SOURCE), "<source>"), (include, "<torch-include>"), (lib, "<torch-lib>"))
    flags = []
    for flag in compile_command("CXX", Path("OUT"))[1:]:
        for path, placeholder in placeholders:
            flag = flag.replace(path, placeholder)
        flags.append(flag)
    return flags


def key_directory(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"cpu_flash-{key['isa'].lower()}-{digest}"


def cached_library() -> Path | None:
    """The library for this machine if it is built (or given by $POSKIT_CPU_KERNEL_LIB), else None. Cheap: no
    build; it runs the compiler once for its version."""
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt:
        return Path(prebuilt).expanduser()
    compiler = find_compiler()
    if compiler is None:
        return _any_cached_library()
    path = key_directory(build_key(compiler)) / LIBRARY_NAME
    return path if path.exists() else None


def _any_cached_library() -> Path | None:
    """Without a compiler: a library copied into the cache for this source, torch and instruction set (built
    elsewhere with any compiler)."""
    root = cache_root()
    if not root.is_dir():
        return None
    source = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    for manifest in sorted(root.glob("cpu_flash-*/manifest.json")):
        try:
            key = json.loads(manifest.read_text())["key"]
        except (OSError, ValueError, KeyError):
            continue
        if (key.get("source_sha256") == source and key.get("torch") == torch.__version__ and key.get("isa") == isa_level()
                and key.get("cxx11_abi") == int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
                and (manifest.parent / LIBRARY_NAME).exists()):
            return manifest.parent / LIBRARY_NAME
    return None


NOT_CALIBRATED = ("poskit: the kernel is not calibrated on this machine: `poskit kernel calibrate` measures where it "
                  "beats the paths without it here; until then the rope family stays on SDPA and the other "
                  "encodings take the kernel")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build(*, force: bool = False, progress=None) -> Path:
    """Compile the library into the cache unless it is there (force: again) and return its path.
    progress: a function taking one line of text (default: stderr), told when a compilation starts and ends.
    Raises KernelUnavailable with a one-line reason when there is no compiler or the compilation fails."""
    from ..util.file_lock import file_lock

    say = progress or _to_stderr
    compiler = find_compiler()
    if compiler is None:
        wanted = os.environ.get("CXX")
        looked = f"$CXX={wanted!r}" if wanted else "c++, g++, clang++ on PATH"
        raise KernelUnavailable(f"no C++ compiler found (looked for {looked})")
    key = build_key(compiler)
    directory = key_directory(key)
    library = directory / LIBRARY_NAME
    if library.exists() and not force:
        return library
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / ".lock"):
        if library.exists() and not force:  # built by another process while this one waited
            return library
        say(f"poskit: compiling the CPU attention kernel for this machine ({key['isa']}, {Path(compiler).name}; "
            "once per machine, typically 20-60 s) ...")
        started = time.perf_counter()
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".so.tmp")
        os.close(fd)
        try:
            run = subprocess.run(compile_command(compiler, Path(tmp)), capture_output=True, text=True)
            if run.returncode != 0:
                error = next((line for line in run.stderr.splitlines() if "error" in line), run.stderr.strip()[-300:])
                raise KernelUnavailable(f"the compilation failed ({Path(compiler).name}): {error.strip()[:300]}")
            os.replace(tmp, library)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        seconds = time.perf_counter() - started
        (directory / "manifest.json").write_text(json.dumps(
            {"key": key, "built_seconds": round(seconds, 1), "command": compile_command(compiler, library)}, indent=1))
        say(f"poskit: CPU attention kernel built in {seconds:.1f} s: {library}")
    return library


@functools.lru_cache(maxsize=1)
def _loaded(path: str) -> str:
    torch.ops.load_library(path)
    return path


def load(*, build_if_missing: bool = True, progress=None) -> Path:
    """Load the library into this process (torch.ops.poskit_cpu_flash), building it first if needed; returns
    its path. Raises KernelUnavailable (one line) when it cannot be had."""
    library = cached_library()
    if library is None:
        if not build_if_missing:
            raise KernelUnavailable("the kernel is not built yet (`poskit kernel build`)")
        say = progress or _to_stderr
        library = build(progress=say)
        say(NOT_CALIBRATED)  # built on first use: `poskit kernel build` calibrates after building, this does not
    if not library.exists():
        raise KernelUnavailable(f"{PREBUILT_ENV} names {library}, which does not exist")
    try:
        _loaded(str(library))
    except Exception as err:  # a library for another torch or CPU, or a damaged file
        raise KernelUnavailable(f"the library {library} does not load ({type(err).__name__}: "
                                f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    return library
