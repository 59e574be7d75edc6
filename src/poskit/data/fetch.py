"""``poskit data fetch NAME``: fetch one registry artifact (a pip sdist or wheel, or a Debian package) into the
data cache and extract just the corpus files from it.

The command runner is injectable (``run=``) so tests exercise the logic without a network; by default it is
:func:`subprocess.run`.  The only network access is the package client's own (pip or apt-get); when the registry
cannot be reached the error is one line naming the package and the command.
"""
from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .home import fetched_dir, writable_dir

__all__ = ["Artifact", "ARTIFACTS", "FetchError", "fetch", "fetch_command"]


class FetchError(RuntimeError):
    """A fetch that failed: the message names the package and what to do."""


@dataclass(frozen=True)
class Artifact:
    """A registry package holding a corpus, and the glob (inside the archive) of the files to keep."""

    name: str
    registry: str  # "pip-sdist", "pip-wheel" or "apt"
    package: str  # as the client spells it: "miditok==3.1.0", "ragout-examples"
    members: str  # fnmatch pattern of archive member paths to extract

    @property
    def label(self) -> str:
        return f"{'Debian' if self.registry == 'apt' else 'PyPI'} package {self.package}"


ARTIFACTS: dict[str, Artifact] = {
    "maestro": Artifact("maestro", "pip-sdist", "miditok==3.1.0", "*/tests/MIDIs_one_track/Maestro_*.mid"),
    "genome": Artifact("genome", "apt", "ragout-examples", "*/examples/*/references/*.fasta.gz"),
    "wiki": Artifact("wiki", "pip-wheel", "gensim==4.4.0",
                     "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"),
    # German-English sentence pairs (poskit.data.translation); kept as files/share/de-en
    "translation": Artifact("translation", "apt", "trans-de-en", "*/share/trans/de-en"),
}

Runner = Callable[..., subprocess.CompletedProcess]


def fetch_command(artifact: Artifact, into: Path) -> list[str]:
    """The package client's command that downloads ``artifact`` into ``into`` (nothing is installed)."""
    if artifact.registry == "apt":
        return ["apt-get", "download", artifact.package]  # run with cwd=into: apt-get download has no -d
    binary = ["--no-binary", ":all:"] if artifact.registry == "pip-sdist" else ["--only-binary", ":all:"]
    return [sys.executable, "-m", "pip", "download", "--no-deps", *binary, "--dest", str(into), artifact.package]


def _download(artifact: Artifact, into: Path, run: Runner) -> Path:
    cmd = fetch_command(artifact, into)
    try:
        proc = run(cmd, cwd=into, capture_output=True, text=True)
    except FileNotFoundError:
        raise FetchError(f"cannot fetch {artifact.label}: {cmd[0]!r} is not installed on this machine") from None
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise FetchError(f"cannot fetch {artifact.label} (is the package registry reachable?): "
                         f"`{' '.join(cmd)}` failed: {last[-1] if last else 'exit ' + str(proc.returncode)}")
    suffixes = {"apt": (".deb",), "pip-sdist": (".tar.gz", ".zip"), "pip-wheel": (".whl",)}[artifact.registry]
    found = sorted(p for p in into.iterdir() if p.name.endswith(suffixes))
    if not found:
        raise FetchError(f"`{' '.join(cmd)}` succeeded but left no {'/'.join(suffixes)} file in {into}")
    return found[-1]


def _extract(archive: Path, artifact: Artifact, into: Path, run: Runner) -> list[Path]:
    """Extract the members matching the artifact's pattern, flattened into ``into``."""
    if archive.name.endswith(".deb"):
        unpacked = into / "deb"
        proc = run(["dpkg-deb", "-x", str(archive), str(unpacked)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise FetchError(f"cannot unpack {archive} with dpkg-deb: {(proc.stderr or '').strip()}")
        sources = [(str(p.relative_to(unpacked)), p.read_bytes) for p in sorted(unpacked.rglob("*")) if p.is_file()]
        keep = _write_members(sources, artifact, into)
        shutil.rmtree(unpacked)
        return keep
    try:
        if archive.name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as z:
                return _write_members([(n, lambda n=n: z.read(n)) for n in z.namelist()], artifact, into)
        with tarfile.open(archive) as t:
            members = [m for m in t.getmembers() if m.isfile()]
            return _write_members([(m.name, lambda m=m: t.extractfile(m).read()) for m in members], artifact, into)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as e:
        raise FetchError(f"cannot read the downloaded archive {archive}: {e}") from None


def _write_members(sources, artifact: Artifact, into: Path) -> list[Path]:
    written = []
    for name, read in sources:
        if fnmatch.fnmatch(name, artifact.members) or fnmatch.fnmatch("./" + name, artifact.members):
            # keep the parent directory for genomes (E.Coli/references/x.fasta.gz -> E.Coli/x.fasta.gz)
            parts = Path(name).parts
            rel = Path(parts[-3], parts[-1]) if artifact.registry == "apt" else Path(parts[-1])
            target = into / "files" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read())
            written.append(target)
    if not written:
        raise FetchError(f"{artifact.label} holds no file matching {artifact.members!r}")
    return written


def fetch(name: str, run: Runner = subprocess.run, force: bool = False) -> list[Path]:
    """Fetch and extract artifact ``name``; returns the extracted files (already there: returned as is)."""
    if name not in ARTIFACTS:
        raise ValueError(f"unknown fetchable corpus {name!r}; fetchable corpora: {sorted(ARTIFACTS)}")
    artifact = ARTIFACTS[name]
    target = fetched_dir(name)
    files = target / "files"
    if files.is_dir() and not force:
        existing = sorted(p for p in files.rglob("*") if p.is_file())
        if existing:
            return existing
    writable_dir(target)  # an unusable data home is named before anything is downloaded
    download = target / "download"
    if download.exists():
        shutil.rmtree(download)
    download.mkdir(parents=True)
    archive = _download(artifact, download, run)
    staging = target / "staging"  # extracted here, renamed into place whole: a failed fetch leaves no half corpus
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    _extract(archive, artifact, staging, run)
    if files.exists():
        shutil.rmtree(files)
    (staging / "files").replace(files)
    shutil.rmtree(staging)
    shutil.rmtree(download)  # only the extracted corpus files are kept
    return sorted(p for p in files.rglob("*") if p.is_file())
