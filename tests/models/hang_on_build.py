"""A model builder that never returns: stands in for a worker that hangs (tests/test_probe_worker_faults.py).

It first touches the file named by EDGEBATCH_TEST_HANG_MARKER, so a test knows the worker got this
far (past its start-up, TensorFlow imported) before it kills the worker's parent.
"""

import os
import time


def build():
    marker = os.environ.get("EDGEBATCH_TEST_HANG_MARKER")
    if marker:
        with open(marker, "w") as handle:
            handle.write(str(os.getpid()))
    time.sleep(600)
    raise RuntimeError("hang_on_build.py slept 600 s: nothing killed its worker")
