"""Cut an atomic write short where edgebatch.files.write_atomically has written its temporary file
and not yet renamed it: os.replace onto `target` raises KeyboardInterrupt, which is what Ctrl-C,
or SIGTERM under cli_errors.handle_errors, raises."""

import os
from pathlib import Path


def stopped_before_renaming_to(target, monkeypatch):
    real = os.replace

    def stopped(source, destination, *args, **kwargs):
        if Path(destination) == Path(target):
            raise KeyboardInterrupt
        return real(source, destination, *args, **kwargs)

    monkeypatch.setattr(os, "replace", stopped)
