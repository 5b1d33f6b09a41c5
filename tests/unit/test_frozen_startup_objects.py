"""What start-up loaded is kept out of the periodic full collection; later garbage is still freed."""
from __future__ import annotations

import subprocess
import sys
import textwrap

# A fresh interpreter: gc.freeze is process-wide and must not touch the test runner's objects.
SCRIPT = textwrap.dedent("""
    import gc, weakref
    from omni_backend.glibc_heaps import freeze_loaded_objects, release_garbage_and_free_memory

    class Node:
        pass

    loaded = [Node() for _ in range(50_000)]        # what a model's start-up leaves alive
    startup_garbage = Node()
    startup_garbage.me = startup_garbage            # a cycle left by start-up: freed, not frozen
    gone_at_startup = weakref.ref(startup_garbage)
    del startup_garbage
    tracked = len(gc.get_objects())
    freeze_loaded_objects()
    assert gone_at_startup() is None, "start-up's own garbage was frozen instead of freed"
    assert gc.get_freeze_count() >= len(loaded), gc.get_freeze_count()
    assert len(gc.get_objects()) < tracked - len(loaded), "the loaded objects are still collected"

    later = Node()
    later.me = later                                # a stream's cycle, made while serving
    gone_later = weakref.ref(later)
    del later
    release_garbage_and_free_memory()
    assert gone_later() is None, "a cycle made after start-up was not collected"
    print("ok")
""")


def test_start_up_objects_are_frozen_and_later_cycles_are_still_collected() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
