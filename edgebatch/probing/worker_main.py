"""A probe worker's process: `python -m edgebatch.probing.worker_main` (worker_child.run_and_exit).

Nothing in the package imports this module, so `-m` runs it without runpy's warning about a module
already imported by its package (edgebatch.probing imports worker.py).
"""

from edgebatch.probing.worker_child import run_and_exit

if __name__ == "__main__":
    run_and_exit()
