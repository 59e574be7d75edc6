"""Multi-process training on torch.distributed: which process this is, the process group, the model wrapper
(DistributedDataParallel or FSDP2's `fully_shard`), the rank's share of a batch, and the few collectives the
trainer needs.

A run launched by `torchrun --nproc_per_node N` (or any launcher that sets RANK / WORLD_SIZE / LOCAL_RANK)
trains as one run of N processes; without those variables everything here is a no-op for one process, so
`poskit train` behaves exactly as before.

How the data is shared out: every rank draws the *whole* global batch (batch_size examples) from the run's
one data generator and keeps its own contiguous block of rows (rank r: rows r*b .. (r+1)*b - 1, b =
batch_size / N). The blocks are disjoint, each is a deterministic function of (seed, step, rank), and the
union over ranks is the batch a one-process run draws at that step. Drawing a batch costs microseconds
next to a training step, and it buys two properties: an N-process run sees exactly the data of a
one-process run (so their losses agree to rounding), and the data generator's state is the same on every
rank, so a run resumed with a different number of processes continues the very same data stream.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from poskit.util.config_check import ConfigError
from poskit.tasks.base import Batch

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Processes:
    """This process's place in the run: rank, world_size (1: a plain one-process run) and local_rank (its
    index on its machine, which picks its GPU)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def processes_from_env(environ=None) -> Processes:
    """The launch as torchrun describes it in RANK / WORLD_SIZE / LOCAL_RANK (a single process when
    WORLD_SIZE is unset). A malformed value is an error naming the variable."""
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ:
        return Processes()
    values = {}
    for name in _ENV:
        raw = environ.get(name, "0" if name == "LOCAL_RANK" else None)
        if raw is None:
            raise ValueError(f"environment variable {name} is unset but WORLD_SIZE is set; launch with torchrun "
                             "(which sets RANK, WORLD_SIZE and LOCAL_RANK) or unset WORLD_SIZE")
        try:
            values[name] = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name} must be a non-negative integer, got {raw!r}") from None
        if values[name] < 0:
            raise ValueError(f"environment variable {name} must be a non-negative integer, got {raw!r}")
    if values["WORLD_SIZE"] < 1 or values["RANK"] >= values["WORLD_SIZE"]:
        raise ValueError(f"environment variables RANK={values['RANK']} and WORLD_SIZE={values['WORLD_SIZE']} "
                         "must satisfy 0 <= RANK < WORLD_SIZE")
    return Processes(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])


def start_processes(device: str) -> Processes:
    """This process's Processes, with the process group started when the launch has several processes
    (once per process; it stays up for further runs, e.g. the runs of `poskit compare`, and is torn down at
    exit). gloo serves CPU runs; CUDA runs use nccl for tensors (and gloo for the small Python objects the
    trainer exchanges), and each rank takes the GPU of its local_rank."""
    procs = processes_from_env()
    if not procs.active:
        return procs
    cuda = torch.device(device).type == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise ConfigError("device", '"cpu" (CUDA is not available on this machine)', device)
        torch.cuda.set_device(procs.local_rank % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
        atexit.register(_stop)
    if dist.get_world_size() != procs.world_size:
        raise RuntimeError(f"the process group has {dist.get_world_size()} processes but WORLD_SIZE is "
                           f"{procs.world_size}")
    return procs


def _stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class PeerLost(ConnectionError):
    """Another process of a multi-process run stopped (it failed or was killed), so this one cannot go on: the
    message names this rank, what the backend saw, and how to continue (an OSError: the command line prints
    it as one line)."""


# what the backends say when the other end of a collective went away (gloo's TCP pairs, NCCL's remote errors)
_PEER_GONE = re.compile(r"connection (?:reset|closed) by peer|broken pipe|connection refused|socket closed|"
                        r"remote (?:process|peer|end)|ncclRemoteError|communicator was aborted", re.IGNORECASE)


@contextlib.contextmanager
def peers_watched(procs: Processes):
    """Turn a collective that fails because another rank is gone into a PeerLost naming this rank and what to
    do, instead of the backend's traceback (gloo's names a source file and a socket). Errors of any other kind,
    and every error of a one-process run, pass unchanged."""
    try:
        yield
    except RuntimeError as e:  # torch.distributed's DistError is one
        found = _PEER_GONE.search(str(e)) if procs.active else None
        if found is None:
            raise
        raise PeerLost(f"rank {procs.rank} of {procs.world_size}: lost contact with another process of this run "
                       f"({found.group(0).lower()}): it stopped or was killed, and its own output says why; this "
                       "process stops too. The last checkpoint is intact: launch the run again with --resume to "
                       "continue from it") from e


def check_batch_split(batch_size: int, procs: Processes) -> None:
    """Refuse a global batch the processes cannot share equally (each must take the same number of rows,
    or the averaged gradient would weight some examples more than others)."""
    if batch_size % procs.world_size:
        raise ConfigError("batch_size", f"a multiple of the number of processes ({procs.world_size}), since "
                                        "each process trains on an equal share of the global batch", batch_size)


def local_rows(batch: Batch, procs: Processes) -> Batch:
    """This rank's block of rows of the global `batch` (all of it for one process)."""
    if not procs.active:
        return batch
    check_batch_split(batch.inputs.shape[0], procs)  # never drop rows silently
    per_rank = batch.inputs.shape[0] // procs.world_size
    rows = slice(procs.rank * per_rank, (procs.rank + 1) * per_rank)
    return Batch(batch.inputs[rows], batch.targets[rows])


def wrap_model(model: torch.nn.Module, procs: Processes, mode: str) -> torch.nn.Module:
    """The module the training step calls: `model` itself for one process; DistributedDataParallel around it
    (gradients averaged across ranks after backward); or, for "fsdp", `model` sharded in place by FSDP2,
    one shard group per transformer block plus the rest at the root, so that a block's full weights exist
    only while it runs."""
    if not procs.active:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
        return DistributedDataParallel(model, device_ids=device_ids)
    from torch.distributed.fsdp import fully_shard

    for block in getattr(model, "blocks", []):
        fully_shard(block)
    fully_shard(model)
    return model


def barrier(procs: Processes) -> None:
    if procs.active:
        dist.barrier()


def sum_across(values: torch.Tensor, procs: Processes) -> torch.Tensor:
    """The element-wise sum of `values` over all ranks (`values` itself for one process)."""
    if procs.active:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def max_across(value: float, procs: Processes) -> float:
    """The largest `value` of any rank: a decision every rank must take alike (e.g. "is the time budget
    spent?") is taken on it."""
    if not procs.active:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def from_main(obj, procs: Processes):
    """Rank 0's `obj` on every rank (a picklable Python object)."""
    if not procs.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_main(obj, procs: Processes) -> list | None:
    """[obj of rank 0, obj of rank 1, ...] on rank 0; None on the other ranks."""
    if not procs.active:
        return [obj]
    out = [None] * procs.world_size if procs.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out



# -- the full (unsharded) training state, whatever the wrapper. A checkpoint always holds the state a
# one-process run would hold (plain model and optimizer state dicts, optimizer state keyed by parameter index),
# so that it resumes under any number of processes and either wrapper.

def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: torch.nn.Module, mode: str, procs: Processes) -> dict:
    """The model's full state dict on rank 0 (FSDP gathers the shards there, a collective every rank must
    enter, and gives the other ranks an empty dict)."""
    if procs.active and mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(model, options=_full_options())
    return model.state_dict()


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: str,
                         procs: Processes) -> dict:
    """The optimizer's state dict in torch's own layout (state keyed by parameter index); under FSDP gathered
    from the shards (a collective) and re-keyed from parameter names to indices."""
    if not (procs.active and mode == "fsdp"):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    named = get_optimizer_state_dict(model, optimizer, options=_full_options())
    if not named:  # cpu_offload gathers the full state on rank 0 only
        return {}
    order = [name for group in named["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    groups, start = [], 0
    for group in named["param_groups"]:
        n = len(group["params"])
        groups.append({**group, "params": list(range(start, start + n))})
        start += n
    return {"state": {index[name]: s for name, s in named["state"].items()}, "param_groups": groups}


def load_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict,
                    optimizer_state: dict, mode: str, procs: Processes) -> None:
    """Load full model and optimizer state dicts (every rank holds them) into a possibly sharded model."""
    if not (procs.active and mode == "fsdp"):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    # rank 0's copy is scattered to the shards (loading the full state on every rank at once mismatched
    # gloo's collectives in torch 2.13; broadcasting from rank 0 is also what a large model needs)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, model_state if procs.is_main else {}, options=options)
    named = {}
    if procs.is_main:
        name_of = {id(p): name for name, p in model.named_parameters()}
        order = [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
        if len(optimizer_state["param_groups"]) != len(optimizer.param_groups):
            raise ValueError(f"the saved optimizer has {len(optimizer_state['param_groups'])} parameter groups, "
                             f"this one {len(optimizer.param_groups)}")
        groups = [{**saved, "params": [order[i] for i in saved["params"]]} for saved in optimizer_state["param_groups"]]
        named = {"state": {order[i]: s for i, s in optimizer_state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, named, options=options)
