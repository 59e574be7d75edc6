"""A checkpoint on disk: the model's weights as safetensors with the model's config as JSON, beside the rest of
the training state (optimizer, step, RNG and data-generator states) as a torch file, committed by one small
record, checkpoint.json. Both trainers write it (the decoder-only Trainer, loop.py, and the encoder-decoder
trainer, seq2seq.py): the store takes a state dict whose "model" entry is the weights and a model-config dict,
and reads back exactly those; which other entries a state must hold is each trainer's to check
(`check_entries`).

    checkpoint.json                           the commit record: step, world_size, directory, the size and
                                              SHA-256 of each file below, and the SHA-256 of these entries
    checkpoints/step-00000100-3f2a9c/
        model.safetensors                     weights (loadable alone: safetensors.torch.load_file)
        model_config.json                     the config of the model they belong to (ModelConfig with
                                              vocab_size resolved, or EncoderDecoderConfig)
        training_state.pt                     everything else a resume needs (torch.load, weights_only)

Why a record and a fresh directory per checkpoint: three files cannot be renamed into place at once, but one
can. The files of a checkpoint are written and fsynced in a new directory first; the atomic rename of
checkpoint.json then makes them the run's checkpoint, and the previous directory is deleted afterwards. A
kill at any moment leaves checkpoint.json naming a complete directory (directories it does not name are
leftovers of a killed writer, removed when the run continues). The recorded sizes and hashes catch a file
truncated or corrupted later, before anything is loaded.

Runs written before this format keep a single `checkpoint.pt` (LEGACY_CHECKPOINT_FILE); they are read, resumed
(their next checkpoint is written in the new format, and checkpoint.pt is then removed) and converted
(`convert_legacy`, `poskit convert-checkpoint RUN`).
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import shutil
from pathlib import Path

import torch

from ..util.durable import fsync_dir, write_synced
from .files import CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, RunFileError, atomic_write_json, read_bytes, read_json

CHECKPOINTS_DIR = "checkpoints"
WEIGHTS_FILE, MODEL_CONFIG_FILE, STATE_FILE = "model.safetensors", "model_config.json", "training_state.pt"
FORMAT = "poskit-checkpoint-2"
_DIR_PATTERN = re.compile(r"^step-\d{8,}-[0-9a-f]{6}$")
_SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
RECORD_HASH = "record_sha256"  # checkpoint.json's hash of its own other entries


def has_checkpoint(run_dir) -> bool:
    run_dir = Path(run_dir)
    return (run_dir / CHECKPOINT_FILE).exists() or (run_dir / LEGACY_CHECKPOINT_FILE).exists()


def checkpoint_path(run_dir) -> Path:
    """The file a run's checkpoint is read through: checkpoint.json, or checkpoint.pt for a run written
    before it (when both exist, a resume of an old run was killed before deleting checkpoint.pt, and the
    record is the newer)."""
    run_dir = Path(run_dir)
    record = run_dir / CHECKPOINT_FILE
    return record if record.exists() or not (run_dir / LEGACY_CHECKPOINT_FILE).exists() else run_dir / LEGACY_CHECKPOINT_FILE


# -- writing

def _weights_bytes(weights: dict) -> bytes:
    from safetensors.torch import save

    tensors, seen = {}, set()
    for name, t in weights.items():
        t = t.detach().cpu().contiguous()
        # safetensors refuses tensors sharing memory (tied embeddings): store each name's own copy; loading
        # copies both names into the one shared parameter again
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            t = t.clone()
        seen.add(key)
        tensors[name] = t
    return save(tensors)


def write_checkpoint(run_dir, state: dict, model_config: dict, run: dict | None = None) -> Path:
    """Write `state` (a trainer's state dict: "model" the weights, "step" an int, any other entries
    torch.save-able with weights_only loading) as a checkpoint of `run_dir` and
    commit it; returns the directory holding its files. `run` (task, encoding, seed, code version) goes into
    the record, where results.json is checked against it cheaply. Afterwards the previous checkpoint's
    directory, any uncommitted one and a legacy checkpoint.pt are removed."""
    run_dir = Path(run_dir)
    rest = {k: v for k, v in state.items() if k != "model"}
    buffer = io.BytesIO()
    torch.save(rest, buffer)
    contents = {WEIGHTS_FILE: _weights_bytes(state["model"]),
                MODEL_CONFIG_FILE: (json.dumps(model_config, indent=2) + "\n").encode(),
                STATE_FILE: buffer.getvalue()}
    name = f"step-{int(state['step']):08d}-{secrets.token_hex(3)}"
    directory = run_dir / CHECKPOINTS_DIR / name
    directory.mkdir(parents=True)
    for file, data in contents.items():
        write_synced(directory / file, lambda f, data=data: f.write(data))
    fsync_dir(directory)
    fsync_dir(directory.parent)
    record = {"format": FORMAT, "step": int(state["step"]), "world_size": int(state.get("world_size", 1)),
              "directory": f"{CHECKPOINTS_DIR}/{name}", **({"run": run} if run else {}),
              "files": {file: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                        for file, data in contents.items()}}
    record[RECORD_HASH] = record_hash(record)
    atomic_write_json(run_dir / CHECKPOINT_FILE, record)  # the commit
    remove_uncommitted_checkpoints(run_dir)
    (run_dir / LEGACY_CHECKPOINT_FILE).unlink(missing_ok=True)
    return directory


def remove_uncommitted_checkpoints(run_dir) -> list[Path]:
    """Delete the checkpoint directories checkpoint.json does not name (the previous checkpoint's, or one a
    killed writer never committed); returns what was deleted. Without a readable record nothing is kept."""
    run_dir = Path(run_dir)
    root = run_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    keep = None
    if (run_dir / CHECKPOINT_FILE).exists():
        keep = (run_dir / _record(run_dir / CHECKPOINT_FILE)["directory"]).name
    stale = [p for p in root.iterdir() if p.name != keep]
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return stale


# -- reading

def record_hash(record: dict) -> str:
    """SHA-256 of the record's entries other than its own hash, in a canonical JSON form."""
    body = {k: v for k, v in record.items() if k != RECORD_HASH}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _record(path: Path) -> dict:
    """checkpoint.json, checked: its own hash, its entries, and a directory inside the run's checkpoints/."""
    record = read_json(path, "a checkpoint record")
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise RunFileError(path, f"is not a poskit checkpoint record (format {found!r}, expected {FORMAT!r})")
    # Without its own hash, a changed character inside a recorded SHA-256 would be blamed on the intact file
    # it describes. Records written before the hash was added have none and are read as before.
    if RECORD_HASH in record and record[RECORD_HASH] != record_hash(record):
        raise RunFileError(path, f"is corrupt: its entries no longer match the {RECORD_HASH} written with them "
                                 "(the file was changed after the checkpoint was committed)")
    directory = record.get("directory")
    parts = directory.split("/") if isinstance(directory, str) else []
    if len(parts) != 2 or parts[0] != CHECKPOINTS_DIR or not _DIR_PATTERN.match(parts[1]):
        raise RunFileError(path, f"names directory {directory!r}, not one of its run's "
                                 f"{CHECKPOINTS_DIR}/step-<step>-<id> directories")
    files = record.get("files")
    if not isinstance(files, dict) or set(files) != {WEIGHTS_FILE, MODEL_CONFIG_FILE, STATE_FILE} or not all(
            isinstance(f, dict) and isinstance(f.get("bytes"), int) and not isinstance(f.get("bytes"), bool)
            and f["bytes"] >= 0 and isinstance(f.get("sha256"), str) and _SHA256_PATTERN.match(f["sha256"])
            for f in files.values()):
        raise RunFileError(path, f"lacks the size and SHA-256 of each of {WEIGHTS_FILE}, {MODEL_CONFIG_FILE}, "
                                 f"{STATE_FILE}")
    return record


def _checked_bytes(path: Path, expected: dict, record_path: Path) -> bytes:
    data = read_bytes(path)
    if len(data) != expected["bytes"]:
        what = "truncated" if len(data) < expected["bytes"] else "longer than written"
        raise RunFileError(path, f"is {what}: {len(data)} bytes, but {record_path.name} recorded {expected['bytes']} "
                                 "(the file was changed after the checkpoint was written)")
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise RunFileError(path, f"is corrupt: its SHA-256 differs from the one {record_path.name} recorded when "
                                 "the checkpoint was written")
    return data


def read_checkpoint_files(record_path, device: str = "cpu") -> tuple[dict, Path]:
    """(state, path of its training_state.pt): the training state of the checkpoint that `record_path`
    (checkpoint.json) commits, in the layout it was written in ("model": the weights; "model_config": the
    model-config dict). Every file is checked
    against the record (size, SHA-256) and parsed before anything is returned; any problem is a RunFileError
    naming the file."""
    record_path = Path(record_path)
    record = _record(record_path)
    directory = record_path.parent / record["directory"]
    data = {name: _checked_bytes(directory / name, record["files"][name], record_path) for name in record["files"]}
    try:
        from safetensors.torch import load

        weights = load(data[WEIGHTS_FILE])
    except Exception as e:  # a header that parses but does not describe its bytes; the hash matched, so rare
        raise RunFileError(directory / WEIGHTS_FILE, f"is not a readable safetensors file ({_first_line(e)})") from None
    if device != "cpu":
        weights = {k: v.to(device) for k, v in weights.items()}
    model_config = read_json(directory / MODEL_CONFIG_FILE, "a ModelConfig")
    try:
        state = torch.load(io.BytesIO(data[STATE_FILE]), map_location=device, weights_only=True)
    except Exception as e:  # torch raises many types for a torn archive; all mean the same here
        raise RunFileError(directory / STATE_FILE, f"is not a readable training state ({_first_line(e)})") from None
    if not isinstance(state, dict):
        raise RunFileError(directory / STATE_FILE, f"holds a {type(state).__name__}, not a dict of training state")
    if state.get("step") != record["step"]:
        raise RunFileError(directory / STATE_FILE, f"is the state of step {state.get('step')!r}, but "
                                                   f"{record_path.name} commits step {record['step']}")
    return {**state, "model": weights, "model_config": model_config}, directory / STATE_FILE


def read_legacy_file(path, device: str = "cpu") -> dict:
    """The state in a checkpoint.pt of a run written before checkpoint.json (either trainer's), loaded with
    weights_only; a RunFileError naming the file when it is zero-filled, torn or not a dict."""
    path = Path(path)
    data = read_bytes(path)
    if not data.strip(b"\x00"):
        raise RunFileError(path, f"holds only zero bytes ({len(data)}), not a checkpoint (a write was cut short)")
    try:
        state = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    except Exception as e:  # torch raises many types for a torn zip archive or pickle; all mean the same here
        raise RunFileError(path, f"is not a readable checkpoint (truncated or corrupt: {_first_line(e)})") from None
    if not isinstance(state, dict):
        raise RunFileError(path, f"holds a {type(state).__name__}, not a checkpoint's dict of training state")
    return state


def read_state(path, device: str = "cpu") -> tuple[dict, Path]:
    """(state, the file its entries came from) of checkpoint `path`: a run's checkpoint.json (its files
    verified; entries come from training_state.pt) or a legacy checkpoint.pt. Only the files are checked
    here; the entries are the caller's (`check_entries`)."""
    path = Path(path)
    if path.name == LEGACY_CHECKPOINT_FILE:
        return read_legacy_file(path, device), path
    return read_checkpoint_files(path, device)


def check_entries(path, state: dict, entries: dict, writer: str) -> None:
    """Refuse (a RunFileError naming `path`) a state lacking one of `entries` (name -> accepted type or types;
    a bool is never an int) or holding it with another type; `writer` names what writes such states."""
    for key, kind in entries.items():
        value = state.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problem = "lacks" if key not in state else "has a malformed"
            raise RunFileError(path, f"{problem} entry {key!r}: not a checkpoint written by {writer}")


def _first_line(e: Exception) -> str:
    # the first sentence of the message (torch's zip reader appends a paragraph of advice to one line)
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return first.split(". ")[0].rstrip(".")[:200]
