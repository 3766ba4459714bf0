"""Output folders: one writer at a time, and one owning command per folder.

Every command that writes results (``reproduce``, ``plot``, ``analyze``, ``kv-bench``, ``lm-train``)
goes through two checks before it writes anything:

* :class:`FolderLock` — an OS-level lock (``fcntl.flock``) on ``<folder>/.attsvm.lock``, held for
  the whole command. A second writer fails at once with :class:`FolderBusyError`, naming the folder
  and the process that holds it. The kernel drops the lock when its holder dies, SIGKILL included,
  so a killed run never leaves a stale lock behind.
* :func:`claim_folder` — ``<folder>/.attsvm-owner.json`` names the command whose results the folder
  holds; a command refuses a folder owned by another one (:class:`RunFolderError`), so that, e.g.,
  an LM is never trained into a reproduction's folder. Folders written before the marker existed
  are recognised by their files.

Only the standard library is used here (:func:`save_figure`, handed a matplotlib figure, imports
:mod:`attsvm._style` when it is called).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "RunFolderError",
    "FolderBusyError",
    "FolderLock",
    "save_figure",
    "claim_folder",
    "folder_owner",
    "check_output_folder",
    "atomic_write",
    "refuse_foreign",
    "LOCK_FILE",
    "OWNER_FILE",
    "cache_root",
]

LOCK_FILE = ".attsvm.lock"
OWNER_FILE = ".attsvm-owner.json"

# files that identify the command that wrote a folder without an owner marker (older runs)
_SIGNATURES: tuple[tuple[str, str], ...] = (
    ("attsvm_lm.json", "lm-train"),
    ("kv_bench.json", "kv-bench"),
    ("heads.json", "analyze"),
    ("index.json", "reproduce all"),
    ("trials", "reproduce"),
)


def cache_root() -> Path:
    """The folder of attsvm's caches (trained LMs, converted models): ``$ATTSVM_CACHE``, default
    ``~/.cache/attsvm``."""
    return Path(os.environ.get("ATTSVM_CACHE") or Path.home() / ".cache" / "attsvm")


class RunFolderError(ValueError):
    """An output or run folder cannot be used: it is a file, unwritable, corrupt, or holds the results
    of another command or of other settings. The message names the folder and what to do."""


class FolderBusyError(RunFolderError):
    """Another process is writing the folder right now (it holds the folder's lock)."""


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_figure(fig: Any, path: Path, *, pdf: bool = True, **savefig_kwargs: Any) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix) and, for a PNG, a PDF beside it (``pdf=False``: not).

    The figure first gets the finishing pass of :func:`attsvm._style.finish` (plain decimal ticks on log axes
    that span less than two decades); a PNG is written at :data:`attsvm._style.PNG_DPI` (200) dpi or more, a larger
    ``dpi`` is kept, and the bounding box is the drawn content (``bbox_inches="tight"``): nothing is clipped.

    Every file is rendered in memory first, then written through a temporary file and ``os.replace``: a full disk
    or an unwritable folder raises the OSError itself (matplotlib's PDF writer, failing part-way, raised an
    AttributeError of its own that hid it), and no half-written figure is left behind. Returns ``path``."""
    import io

    from ._style import PNG_DPI, finish

    finish(fig)
    savefig_kwargs["dpi"] = max(float(savefig_kwargs.get("dpi") or PNG_DPI), PNG_DPI)
    targets = [path]
    if pdf and path.suffix.lower() == ".png":
        targets.append(path.with_suffix(".pdf"))
    rendered = []
    with _laid_out_once(fig, savefig_kwargs):
        for target in targets:
            buf = io.BytesIO()
            fig.savefig(buf, format=target.suffix.lstrip(".") or "png", **savefig_kwargs)
            data = buf.getvalue()
            if target.suffix.lower() == ".png":
                data = _palette_png(data, savefig_kwargs["dpi"])
            rendered.append((target, data))
    for target, data in rendered:
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
    return path


@contextlib.contextmanager
def _laid_out_once(fig: Any, savefig_kwargs: dict[str, Any]) -> Iterator[None]:
    """The figure laid out (its layout engine run) and its tight bounding box found once, at the PNG's dpi, for
    every file written inside: matplotlib's ``bbox_inches="tight"`` otherwise draws each file twice and runs the
    layout engine in both draws. A caller's explicit ``bbox_inches`` (not ``"tight"``) is used as it is."""
    if savefig_kwargs.get("bbox_inches", "tight") != "tight":
        yield
        return
    import matplotlib as mpl

    pad = savefig_kwargs.pop("pad_inches", 0.04)
    engine = fig.get_layout_engine()
    dpi = fig.dpi
    fig.set_dpi(savefig_kwargs["dpi"])
    try:
        fig.draw_without_rendering()
        savefig_kwargs["bbox_inches"] = fig.get_tightbbox().padded(pad)
    finally:
        fig.set_dpi(dpi)
    # then no engine (with matplotlib's "none" savefig would still draw once more): the positions the engine has
    # just set stay. savefig sets the engine to None itself and back when done, which brings back the rcParams'
    # default engine: the rcParams name none while the files are written
    with mpl.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)
        try:
            yield
        finally:
            if engine is not None:
                fig.set_layout_engine(engine)


def _palette_png(data: bytes, dpi: float) -> bytes:
    """An opaque PNG as a 256-colour palette PNG (no dithering): a figure's flat colours and anti-aliased edges
    survive, the file is a quarter of the size. Left as it is when it has transparency (or Pillow is missing)."""
    import io

    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return data
    im = Image.open(io.BytesIO(data))
    if im.mode == "RGBA":
        low = im.getchannel("A").getextrema()[0]
        if not isinstance(low, int | float) or low < 255:
            return data
    pal = im.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    pal.save(out, format="png", optimize=True, dpi=(dpi, dpi))
    return out.getvalue()


def check_output_folder(folder: str | Path, what: str = "--out") -> Path:
    """Create ``folder`` if needed and check that it is a writable folder (RunFolderError otherwise)."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{what} {str(path)!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunFolderError(f"{what} {str(path)!r}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunFolderError(f"{what} {str(path)!r} is not writable")
    return path


class FolderLock:
    """``with FolderLock(folder, "attsvm reproduce ..."):`` — exclusive, non-blocking, released on exit.

    The holder's pid and command are written into the lock file so that the second writer's message
    can name them.
    """

    def __init__(self, folder: str | Path, holder: str) -> None:
        self.folder = Path(folder)
        self.holder = holder
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        import fcntl

        path = self.folder / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunFolderError(
                f"{str(self.folder)!r}: cannot create the lock file {LOCK_FILE} ({exc.strerror or exc})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                who = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            finally:
                os.close(fd)
            who = who or "a process that has not written its id yet"
            raise FolderBusyError(
                f"{str(self.folder)!r} is being written by another attsvm process ({who}); "
                "wait for it to finish, or use another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {self.holder}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)  # the lock file stays: deleting it would race with the next writer

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def folder_owner(folder: str | Path) -> str | None:
    """The command whose results ``folder`` holds ("reproduce", "lm-train", ...), None when it holds none.

    A folder with visible files that no attsvm command wrote is reported as ``"another program"``.
    """
    path = Path(folder)
    if not path.is_dir():
        return None
    marker = path / OWNER_FILE
    if marker.exists():
        try:
            owner = json.loads(marker.read_text())["command"]
            if not isinstance(owner, str):
                raise TypeError
            return owner
        except (OSError, ValueError, KeyError, TypeError):
            raise RunFolderError(
                f"{str(marker)!r} is corrupt (expected JSON with a 'command'); "
                "check the folder and delete that file if the folder is yours"
            ) from None
    for name, command in _SIGNATURES:
        if (path / name).exists():
            return command
    cfg = path / "config.json"
    if cfg.exists():
        try:
            if "experiment" in json.loads(cfg.read_text()):
                return "reproduce"
        except (OSError, ValueError, TypeError):
            pass
    visible = [p for p in path.iterdir() if not p.name.startswith(".")]
    return "another program" if visible else None


def claim_folder(folder: str | Path, command: str, *, allow_foreign: bool = False) -> None:
    """Mark ``folder`` as holding ``attsvm COMMAND``'s results; refuse a folder that holds another's.

    Call it while holding the folder's :class:`FolderLock`. ``allow_foreign=True`` accepts a
    non-empty folder that no attsvm command wrote (its files are left alone).
    """
    path = Path(folder)
    refuse_foreign(path, command, allow_foreign=allow_foreign)
    if not (path / OWNER_FILE).exists():
        _write_owner(path, command)


def refuse_foreign(folder: str | Path, command: str, *, allow_foreign: bool = False) -> None:
    """Raise :class:`RunFolderError` when ``folder`` holds another command's results (writes nothing)."""
    path = Path(folder)
    owner = folder_owner(path)
    if owner in (None, command) or (owner == "another program" and allow_foreign):
        return
    what = "files of another program" if owner == "another program" else f"the results of `attsvm {owner}`"
    raise RunFolderError(
        f"{str(path)!r} holds {what}; `attsvm {command}` would overwrite them. Choose another (new or empty) folder"
    )


def _write_owner(path: Path, command: str) -> None:
    atomic_write(
        path / OWNER_FILE,
        json.dumps(
            {"command": command, "pid": os.getpid(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        ),
    )
