"""Opening a store, and the one-line errors a store that cannot be read or written gives: the only
place that imports lancedb (lazily), and where secrets are scrubbed from every message."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import StoreError

DEFAULT_STORE = ".mfs"
REMOTE_KEEP_S = 3600.0  # object storage: old versions outlive any clock skew between machines

_REST_CLIENT = "lance_namespace_urllib3_client"
_import_lock = threading.Lock()


def lancedb_module() -> Any:
    """`import lancedb`, about 1 s faster (issue 17: the first reply after `%load_ext` waits on it).

    `import lancedb` pulls in `lance_namespace`, which imports the models of the generated REST
    client for remote namespaces; the client package's `__init__` also imports its nine API
    modules, whose pydantic validators take about 1.2 s of the 1.7 s import on this machine. A
    local or object-store database never calls them. So, unless something already imported the
    client, the package is registered with its real search path but without running its
    `__init__`: submodules (`.models`, `.api.table_api`) import normally, and the first access to
    anything the `__init__` defines runs it for real. If the package is not where it is expected,
    nothing is changed.
    """
    with _import_lock:
        if "lancedb" not in sys.modules and _REST_CLIENT not in sys.modules:
            _defer_package_init(_REST_CLIENT)
        import lancedb

    return lancedb


def _defer_package_init(name: str) -> None:
    import importlib.util
    import types

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return

    class Deferred(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            self.__class__ = types.ModuleType  # from here on an ordinary module
            spec.loader.exec_module(self)  # type: ignore[union-attr]
            return getattr(self, attr)

    module = Deferred(name)
    module.__spec__ = spec
    module.__path__ = list(spec.submodule_search_locations)
    module.__file__ = spec.origin
    module.__package__ = name
    module.__loader__ = spec.loader
    sys.modules[name] = module

# environment variables whose values must never reach a message (object-storage credentials)
_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_ACCOUNT_KEY",
                "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN",
                "AZURE_STORAGE_TOKEN", "AZURE_CLIENT_SECRET", "GOOGLE_SERVICE_ACCOUNT_KEY",
                "GOOGLE_APPLICATION_CREDENTIALS")


def shown_uri(uri: str) -> str:
    """A store URI fit to print: a `user:password@` part removed (an Azure `container@account` stays)."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@:]*:[^/@]*@", r"\1", uri, flags=re.I)


def scrub(text: str) -> str:
    for var in _SECRET_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    text = re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]*:[^/@\s]*@", r"\1", text)  # user:password@ in a URI
    return re.sub(r"(?i)\b(signature|credential|token|secret|password|sig|key)=[^&\s\"]+", r"\1=***", text)


def read_only_error(exc: BaseException) -> bool:
    """Whether `exc` (or its cause) says the store cannot be written: a read-only file system, or a
    folder this user may not write (EROFS, EACCES, EPERM), however lance or the OS words it."""
    import errno

    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return True
        if isinstance(exc, PermissionError) or re.search(
                r"read-only file system|permission denied|operation not permitted|os error (30|13|1)\b", str(exc), re.I):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


@contextmanager
def unwritable(uri: str, what: str) -> Iterator[None]:
    """An OSError that says the store cannot be written becomes a `StoreError` with one line; any
    other error passes as it is."""
    try:
        yield
    except OSError as exc:
        if not read_only_error(exc):
            raise
        raise StoreError(store_problem(uri, what, exc)) from exc


def store_problem(uri: str, table: str, exc: BaseException) -> str:
    """One line for a store that cannot be read or written, naming the store but never a secret."""
    full = scrub(" ".join(f"{exc} {exc.__cause__ or ''}".split()))
    text = full[:200]
    uri = shown_uri(uri)
    where = f"table {table} of the store at {uri}" if table else f"the store at {uri}"
    if re.search(r"NoSuchBucket|bucket does not exist|ContainerNotFound|bucket.{0,40}not found", full, re.I):
        return (f"{where}: the bucket does not exist (or these credentials cannot see it); create it or fix the "
                "store URI (MFS_STORE or the `store` setting)")
    if re.search(r"credentials|InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|status: 40[13]\b", full, re.I):
        return (f"{where}: the credentials are missing or refused; set them in the environment (for S3 "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL for another S3 server) — they "
                "are read from there and never saved")
    if re.search(r"connection refused|tcp connect|timed? ?out|dns error|failed to lookup address|"
                 r"error sending request", full, re.I) and "://" in uri:
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the provider's endpoint"
        return (f"{where}: {endpoint} cannot be reached (refused or timed out); check the endpoint "
                "(AWS_ENDPOINT_URL) and the network, then re-run")
    if read_only_error(exc):
        what = (f", {table}" if table.endswith(" folder") else f", table {table}") if table else ""
        if re.search(r"read-only file system|os error 30", full, re.I):
            said = f"is read-only (a read-only file system{what})"
        else:
            said = f"is read-only or not accessible to this user (permission denied{what})"
        return (f"the store at {uri} {said}: nothing new can be saved there; make the folder writable, or set "
                "MFS_STORE to a writable folder (a copy of this one keeps its sessions)")
    if "://" not in uri and Path(uri).exists() and not Path(uri).is_dir():
        return (f"{uri} is a file, not a store folder: set MFS_STORE (or --store) to the folder that holds the "
                "store's tables, or to a new folder")
    if re.search(r"no space|os error 28|disk full|quota", text, re.I):
        return f"{where}: the disk is full; free space and re-run (nothing acknowledged was lost) ({text})"
    return f"{where} cannot be read or written ({text}); run `mfs-nb doctor --store {uri}`"


# LanceDB caches the metadata of every table version it reads, and a chat writes a version per event:
# with its default cache a process grew by 0.38 MB a chat. Each Store gets a bounded cache of its own
# (its own, not one per process: the cache also holds the object-store client of each bucket, which
# must follow the credentials and endpoint in the environment when a Store is opened). Entries of past
# versions are never read again (every read here takes the latest one) but keep the cache full: at
# 128/64 MB it was the largest part of a long session's growth (metadata full by chat 600, the index part
# +0.8 MB per 100 chats); at 16/16 MB the growth by chat 1,000 halved (110 → 56 MB).
_CACHE_MB = {"index": 32, "metadata": 16}


def lance_session() -> Any:
    return lancedb_module().Session(index_cache_size_bytes=_CACHE_MB["index"] << 20,
                                    metadata_cache_size_bytes=_CACHE_MB["metadata"] << 20)


def resolve_uri(store: str | os.PathLike[str] | None) -> str:
    """The store location: the argument, else ``MFS_STORE``, else ``./.mfs``. URIs pass through."""
    uri = str(store) if store else os.environ.get("MFS_STORE") or DEFAULT_STORE
    if "://" in uri:
        return uri
    return str(Path(uri).expanduser().resolve())



def table_names(db: Any) -> set[str]:
    """Every table name (all pages; lancedb's table_names is deprecated and stops at 10)."""
    names: set[str] = set()
    token = None
    while True:
        page = db.list_tables(page_token=token)
        names.update(page.tables)
        token = page.page_token
        if not token:
            return names

