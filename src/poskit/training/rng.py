"""Random state: seeding a run, and the RNG states a checkpoint saves so that a resumed run draws what an
uninterrupted one would."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    np_state = np.random.get_state()
    # numpy's state as plain lists so the checkpoint loads with torch.load(weights_only=True)
    state = {"torch": torch.get_rng_state(), "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
             "python": random.getstate()}
    # dropout on a GPU draws from that device's own generator; saved once CUDA is in use (a CPU run neither
    # needs it nor should initialise CUDA to ask)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def check_rng_state(state: dict) -> None:
    """Raise ValueError unless every saved state would be accepted: each is applied to a scratch generator, so a
    corrupt checkpoint is refused while it is read, before the process's own RNGs or a model are touched (a
    damaged numpy key, say, raises OverflowError only once it is applied)."""
    try:
        torch.Generator().set_state(state["torch"].cpu())
        kind, keys, *rest = state["numpy"]
        np.random.RandomState().set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
        random.Random().setstate(_tuples(state["python"]))
    except (ValueError, TypeError, OverflowError, RuntimeError, KeyError, AttributeError) as e:
        raise ValueError(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None


def set_rng_state(state: dict) -> None:
    # checkpoints load with map_location=<run device>, but RNG states must be CPU byte tensors
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    random.setstate(_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        for device, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), device)


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
