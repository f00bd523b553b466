"""Content-addressed snapshots of attached and pasted documents (docs/architecture.md, "The verbatim
tracks").

A snapshot is written once under ``attachments/{sha256[:16]}-{name}.md`` and never changed: new
content means a new hash and a new path, so a message that names the path keeps the same bytes
forever (prefix-cache friendly, auditable). The same content imported twice is one file.

`collect` deletes a snapshot only when no event of any session, no verbatim-track row and no
export names it, and its file is older than the grace period (48 h).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import InputError
from .origin import first_line

DIR = "attachments"
MAX_BYTES = 20 * 1024 * 1024  # a bigger file is refused with a clear error
GRACE_S = 48 * 3600
NAME_CHARS = 64
PATH_RE = re.compile(r"attachments/[0-9a-f]{16}-[^\s/\\)]{1,80}?\.md")


@dataclass(frozen=True)
class Snapshot:
    path: str  # relative to the store: attachments/{hash16}-{name}.md
    sha256: str
    chars: int
    first_line: str

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "sha256": self.sha256, "chars": self.chars, "first_line": self.first_line}


def safe_name(name: str) -> str:
    """A file-name part that cannot leave the folder: no separators, no `..`, no leading dot,
    no control characters, at most 64 characters; letters of any script are kept."""
    base = re.split(r"[\\/]", str(name))[-1]
    base = unicodedata.normalize("NFC", base)
    stem = base[:-3] if base.lower().endswith(".md") else base
    stem = re.sub(r"[^\w.\-]+", "-", stem, flags=re.U).strip(".-_")
    stem = re.sub(r"\.{2,}", ".", stem)
    return stem[:NAME_CHARS].rstrip(".-_") or "document"


def snapshot_path(sha256: str, name: str) -> str:
    return f"{DIR}/{sha256[:16]}-{safe_name(name)}.md"


class Files(Protocol):
    """Where a store keeps its snapshots: a folder beside a local store's tables (`Folder`), a table of
    the store itself on object storage (`store.TableFiles`), so nothing is kept on one machine only."""

    def exists(self, rel: str) -> bool: ...
    def touch(self, rel: str) -> None: ...
    def put(self, rel: str, data: bytes) -> None: ...
    def listing(self) -> list[tuple[str, int, float]]: ...  # (rel, bytes, mtime) under DIR
    def remove(self, rel: str) -> None: ...


class Folder:
    """Snapshots as read-only files under a local folder."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def touch(self, rel: str) -> None:
        os.utime(self.root / rel)

    def put(self, rel: str, data: bytes) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def listing(self) -> list[tuple[str, int, float]]:
        folder = self.root / DIR
        if not folder.is_dir():
            return []
        out = []
        for f in sorted(folder.glob("*.md")):
            stat = f.stat()
            out.append((f"{DIR}/{f.name}", stat.st_size, stat.st_mtime))
        return out

    def remove(self, rel: str) -> None:
        (self.root / rel).unlink()


def _files(place: str | os.PathLike[str] | Files) -> Files:
    return Folder(place) if isinstance(place, (str, os.PathLike)) else place


def write(place: str | os.PathLike[str] | Files, text: str, name: str) -> Snapshot:
    """Store `text` (UTF-8) under its content address; an existing snapshot is left untouched."""
    files = _files(place)
    data = text.encode("utf-8")
    sha = hashlib.sha256(data).hexdigest()
    rel = snapshot_path(sha, name)
    if files.exists(rel):
        files.touch(rel)  # imported again: its grace period starts over
    else:
        files.put(rel, data)
    return Snapshot(rel, sha, len(text), first_line(text))


def read_document(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(name, text) of a file to attach; one-line `InputError` for anything that is not text."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"--doc {path}: no such file")
    if p.is_dir():
        raise InputError(f"--doc {path}: is a directory; attach files one by one")
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise InputError(f"--doc {path}: {size / 2**20:.0f} MB is more than the {MAX_BYTES // 2**20} MB a "
                         "snapshot may hold; attach the part that matters")
    data = p.read_bytes()
    if b"\x00" in data[:65536]:
        raise InputError(f"--doc {path}: looks binary (NUL bytes); attach text files only")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"--doc {path}: not UTF-8 text (bad byte at position {exc.start})") from None
    if not text.strip():
        raise InputError(f"--doc {path}: the file is empty")
    return p.name, text


def referenced_in(texts: Iterable[str]) -> set[str]:
    """Snapshot paths named anywhere in `texts`."""
    found: set[str] = set()
    for text in texts:
        if text and DIR in text:
            found.update(PATH_RE.findall(text))
    return found


def collect(place: str | os.PathLike[str] | Files, referenced: set[str], *, dry_run: bool = False,
            grace_s: float = GRACE_S, now: float | None = None) -> list[tuple[str, int]]:
    """Snapshots that nothing references and that are older than the grace period, removed
    unless `dry_run`. Returns (path, bytes) of each."""
    files = _files(place)
    now = time.time() if now is None else now
    gone: list[tuple[str, int]] = []
    for rel, size, mtime in files.listing():
        if rel in referenced or now - mtime < grace_s:
            continue
        gone.append((rel, size))
        if not dry_run:
            files.remove(rel)
    return gone


def exports_in(folder: str | os.PathLike[str]) -> list[str]:
    """Texts of exported chats and notebooks (*.md, *.ipynb) directly in `folder`."""
    out: list[str] = []
    for pattern in ("*.md", "*.ipynb"):
        for f in Path(folder).glob(pattern):
            try:
                if f.stat().st_size <= MAX_BYTES:
                    out.append(f.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
    return out


def garbage(store: object, live: Iterable[str] = (), export_dirs: Iterable[str | os.PathLike[str]] = (),
            *, dry_run: bool = False, now: float | None = None) -> list[tuple[str, int]]:
    """Collect the store's unreferenced snapshots: references are every event and verbatim row
    of every session in the store, the texts of live sessions, and exports in `export_dirs`."""
    texts = list(store.texts_naming(DIR + "/"))  # type: ignore[attr-defined]
    texts += list(live)
    for folder in export_dirs:
        texts += exports_in(folder)
    return collect(store.files, referenced_in(texts), dry_run=dry_run, now=now)  # type: ignore[attr-defined]
