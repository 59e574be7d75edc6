"""poskit.file_lock: one exclusive inter-process lock (the corpus cache builds and the study runner use it)."""
import subprocess
import sys

import pytest

from poskit.experiments.study import StudyBusy, exclusive
from poskit.util.file_lock import file_lock

pytest.importorskip("fcntl", reason="file locks need POSIX fcntl")


def test_a_held_lock_refuses_a_non_waiting_second_holder_and_is_free_after_release(tmp_path):
    lock = tmp_path / "x.lock"
    with file_lock(lock):
        with pytest.raises(BlockingIOError):
            with file_lock(lock, wait=False):
                pass
    with file_lock(lock, wait=False):  # released: free again
        pass


def test_another_process_cannot_take_a_held_lock_and_a_killed_holder_releases_it(tmp_path):
    lock = tmp_path / "x.lock"
    probe = ("import sys; from poskit.util.file_lock import file_lock\n"
             "try:\n    with file_lock(sys.argv[1], wait=False): print('got')\n"
             "except BlockingIOError: print('busy')\n")
    with file_lock(lock):
        assert subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True,
                              check=True).stdout.strip() == "busy"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from poskit.util.file_lock import file_lock\n"
                               "with file_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
                               str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BlockingIOError):
            with file_lock(lock, wait=False):
                pass
    finally:
        holder.kill()
        holder.wait()
    with file_lock(lock, wait=False):  # the kill released it: no stale lock
        pass


def test_an_error_inside_the_locked_work_is_not_reported_as_busy(tmp_path):
    with pytest.raises(BlockingIOError, match="from the work"):
        with exclusive(tmp_path / "s.lock", "a runner"):
            raise BlockingIOError("from the work")
    with pytest.raises(StudyBusy):
        with exclusive(tmp_path / "t.lock", "a runner"):
            with exclusive(tmp_path / "t.lock", "a second runner"):
                pass
