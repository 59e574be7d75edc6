"""torch on one thread for a block: tiny matrices run faster on one thread, avoid OpenMP spin-waiting on a busy
machine, and do the same arithmetic in every process. The conftest fixture `one_thread` and the module-scoped
fixtures that train a shared run use this one context manager."""
import contextlib

import torch


@contextlib.contextmanager
def single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
