"""``locks.thread_lock``: an operating-system lock in a gevent-patched worker too, where the
store's group commit takes it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration


def test_a_patched_process_gets_a_thread_lock_where_it_asked_for_one() -> None:
    script = textwrap.dedent(
        """
        from gevent import monkey; monkey.patch_all()
        import os, tempfile, threading
        from ezat_compat.locks import thread_lock
        from ezat_compat.store.hotpath import SQLiteHotPath
        os_lock = type(monkey.get_original("_thread", "allocate_lock")())
        assert type(threading.Lock()) is not os_lock  # gevent's
        assert type(thread_lock()) is os_lock
        hot = SQLiteHotPath(os.path.join(tempfile.mkdtemp(), "x.db"))
        assert type(hot._lock) is os_lock and type(hot.group._queue_lock) is os_lock
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
