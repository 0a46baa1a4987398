"""Atomic file writes and provenance shared by every record writer (DESIGN.md, "Records")."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import secrets
import subprocess
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    A reader never sees a half-written file; an interrupted write leaves the old file intact.
    A symbolic link to an existing regular file is kept: its target is written (atomically,
    beside the target). Missing folders are created only above ``path`` itself, never for a
    link's target.

    Returns:
        ``path`` as given.

    Raises:
        OSError: the write failed (a full disk, say): its ``filename`` is ``path`` when the
            system gave none.
        IsADirectoryError: ``path`` (or a link's target) is a folder (named, before writing).
        FileNotFoundError: ``path`` is a link whose target does not exist (a dangling link).
    """
    given = path = Path(path)
    if os.path.islink(path):
        path = Path(os.path.realpath(path))
        if not path.exists():  # a dangling link: writing through it would land outside
            raise FileNotFoundError(f"{given} is a symbolic link to {os.readlink(given)!r}, "
                                    "which does not exist; nothing was written through it")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(f"{given} is a folder, so no file can be written there")
    # The temporary name fits the folder's name limit whenever the final name does: the final
    # name is shortened (whole UTF-8 characters) to leave room for "." + "." + 8 random + ".tmp".
    try:
        name_max = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    stem = os.fsencode(path.name)[: max(1, name_max - 14)]
    stem_s = os.fsdecode(stem.decode("utf-8", "ignore").encode("utf-8")) if stem else "t"
    # The temporary name is chosen before the file is created, and the file created inside the
    # ``try``: a stop signal whose handler raises right after its creation still removes it
    # (``tempfile.mkstemp`` names it only once the call returns, too late for that).
    tmp = None
    try:
        for _ in range(100):
            tmp = os.path.join(path.parent, f".{stem_s}.{secrets.token_hex(4)}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_CLOEXEC", 0), 0o666)  # the umask applies
            except FileExistsError:  # another writer's: not ours to remove
                tmp = None
                continue
            break
        else:  # pragma: no cover - 100 collisions of 32 random bits
            raise FileExistsError(f"no free temporary name beside {path}")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a full disk says no path
            exc.filename = str(given)
        raise
    return given


def not_a_regular_file(path: str | os.PathLike, mode: int) -> OSError:
    """The error for ``path`` (of ``os.stat`` mode ``mode``) that is not a regular file, naming
    what it is (as stateremat._shared.checks names an output path of these kinds)."""
    import errno
    import stat

    kind = ("a folder" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "something else")
    return OSError(errno.EINVAL, f"it is {kind}, not a regular file", str(path))


#: The largest card or sidecar :func:`read_regular_bytes` reads: a real one is kilobytes to a few
#: megabytes; a larger file (a sparse or runaway one) is refused before it is read into memory.
MAX_READ_BYTES = 256 * 2**20


def read_regular_bytes(path: str | os.PathLike, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of regular file ``path``; anything else (a FIFO, a device such as /dev/zero, a
    socket) is refused before a byte is read, instead of blocking for a writer or reading forever,
    and so is a file of more than ``limit`` bytes (instead of a MemoryError, or the machine's
    memory filled).

    Raises:
        OSError: the file cannot be opened or read, is not a regular file, or is larger than
            ``limit`` (its ``strerror`` names the kind or the size).
    """
    import errno
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, without a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_a_regular_file(path, st.st_mode)
        too_big = OSError(errno.EFBIG, f"it is over {limit:,} bytes, far larger than such a file "
                          "is (a file of another kind, or damaged)", str(path))
        if st.st_size > limit:
            raise too_big
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(limit + 1)  # a file growing while it is read stops at the limit too
        if len(data) > limit:
            raise too_big
        return data
    finally:
        if fd >= 0:
            os.close(fd)


def json_default(obj: Any) -> Any:
    """``json.dumps`` fallback: numpy/torch scalars and arrays, paths and enums.

    Raises:
        TypeError: for any other type (as ``json.dumps`` expects).
    """
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "value"):  # enums
        return obj.value
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _finite(obj: Any) -> Any:
    # JSON has no NaN/inf: write null so every consumer can parse the file.
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps_json(obj: Any, indent: int | None = 2) -> str:
    """``obj`` as RFC 8259 JSON text: numpy/torch values via :func:`json_default`, and every
    non-finite float (NaN, an infinity such as a time past float range) as ``null``."""
    obj = json.loads(json.dumps(obj, default=json_default))
    return json.dumps(_finite(obj), indent=indent, sort_keys=False, allow_nan=False)


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice (:func:`loads_json`); ``key`` is that key."""

    def __init__(self, key: str):
        super().__init__(f"the key {key!r} appears twice in one JSON object (a reader would "
                         "keep only the last)")
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(k)
        out[k] = v
    return out


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses an object with a duplicate key.

    Raises:
        DuplicateKeyError: a key appears twice in one object.
        json.JSONDecodeError: not JSON (positions are of ``text`` as given).
    """
    return json.loads(text, object_pairs_hook=_unique_pairs)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically (non-finite floats become ``null``)."""
    return atomic_write_bytes(path, (dumps_json(obj) + "\n").encode())


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def source_hash(obj: Any) -> str:
    """Stable hex SHA-256 of a JSON-serialisable object (program spec, profile card, config).

    Strings and bytes are hashed as they are; anything else as canonical sorted JSON.
    """
    if isinstance(obj, bytes):
        return sha256_bytes(obj)
    if isinstance(obj, str):
        return sha256_bytes(obj.encode())
    text = json.dumps(obj, sort_keys=True, default=json_default, separators=(",", ":"))
    return sha256_bytes(text.encode())


def git_revision() -> str:
    """The git commit of the source tree stateremat runs from, or ``"unknown"``."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        rev = out.stdout.strip()
        if out.returncode == 0 and rev:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=here, capture_output=True, text=True, timeout=5,
            ).stdout.strip()
            return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def package_version() -> str:
    """The installed ``stateremat`` version, or ``"0.0.0+unknown"`` in an uninstalled tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stateremat")
    except PackageNotFoundError:  # running from a source tree without installation
        return "0.0.0+unknown"


def utc_now() -> str:
    """Current UTC time as ISO-8601 with seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def loadavg() -> str:
    """Contents of ``/proc/loadavg`` (the machine is shared; benchmarks record it)."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unavailable"


def provenance(**extra: Any) -> dict[str, Any]:
    """Metadata every record sidecar carries: versions, git revision, host, time, load.

    Framework versions are included only for frameworks already imported (never imports them).
    """
    import sys

    import numpy

    meta: dict[str, Any] = {
        "package_version": package_version(),
        "git_revision": git_revision(),
        "python_version": platform.python_version(),
        "numpy_version": numpy.__version__,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "created_utc": utc_now(),
        "loadavg": loadavg(),
    }
    if "torch" in sys.modules:
        meta["torch_version"] = sys.modules["torch"].__version__
    if "jax" in sys.modules:
        meta["jax_version"] = sys.modules["jax"].__version__
    meta.update(extra)
    return meta
