"""Output folders of the commands that write results: locked for the whole command, and refused
when they hold another command's results (see ``attsvm._folders``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

__all__ = ["owned_folders"]


@contextmanager
def owned_folders(*folders: tuple[str | Path, str, str]) -> Iterator[list[Path]]:
    """``with owned_folders((path, command, option), ...) as paths:`` — each folder is created if
    needed, checked to be a writable folder, locked (a second writer fails with exit 5) and claimed
    for ``attsvm COMMAND`` (a folder holding another command's results fails with exit 3)."""
    from attsvm._folders import FolderLock, check_output_folder, claim_folder

    holder = " ".join(["attsvm", *sys.argv[1:]])[:300]
    with ExitStack() as stack:
        paths = []
        for folder, command, option in folders:
            path = check_output_folder(folder, option)
            stack.enter_context(FolderLock(path, holder))
            claim_folder(path, command)
            paths.append(path)
        yield paths
