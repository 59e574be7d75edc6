"""`poskit kernel build|info`: the compiled CPU attention kernel (poskit/attention/cpu_flash.cpp).

build: compile it now into the per-machine cache (otherwise the first attention call that needs it does), or
    again with --force. info: what this machine would use: CPU model and instruction set, compiler, cache
    directory, whether the library is built, and whether attention uses it.
"""
from __future__ import annotations

import platform
from pathlib import Path


def add_kernel(sub) -> None:
    p = sub.add_parser("kernel", help="the compiled CPU attention kernel: build it ahead of use, or say where it is",
                       description=__doc__.split("\n", 2)[2].strip())
    p.add_argument("action", choices=["build", "info"])
    p.add_argument("--force", action="store_true", help="build: compile again even if the cached library exists")
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
    print(f"attention:   {switch}")
    return 0
