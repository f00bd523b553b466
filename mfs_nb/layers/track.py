"""The user-verbatim track of one session (docs/architecture.md, "The verbatim tracks"):
classifications, vectors, the rendered track.

Each user message gets one `Verdict`, written once to the store (explicit channels when the
message is recorded; inferred ones in the recall index's thread once the message has its vectors,
or at the latest when it leaves the raw tail), so a restart renders the same bytes. A verdict
depends only on the message and the replies before it, so when it is made does not change it.
The track is a function of (covered prefix, verdicts, budget): it changes only when the covered
prefix moves, i.e. at compaction events.

The vector layer is switched off for the whole process — and classification falls back to
explicit channels plus length — when the embedder fails the quality gate or the built-in probe
trips the stop-loss rule. Any error while classifying one message makes it own words.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..events import replies_before
from ..models import embed
from ..window.tokens import estimate_tokens
from . import origin, snapshots
from .origin import OWN, Verdict

if TYPE_CHECKING:
    from ..events import Event
    from ..host import Host

_GATES: dict[str, str | None] = {}  # gate key (model id, version, probe) -> reason the layer is off (None: on)
_GATE_LOCK = threading.Lock()
_CACHE_MAX = 20_000


class CachedEmbedder:
    """Remembers vectors by text, so assistant messages are embedded once per process."""

    def __init__(self, inner: embed.Embedder):
        self.inner = inner
        self.model_id = inner.model_id
        self._vectors: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            known = {t: self._vectors[t] for t in texts if t in self._vectors}
        need = [t for t in dict.fromkeys(texts) if t not in known]
        if need:
            known.update(zip(need, self.inner.embed(need)))
            with self._lock:
                if len(self._vectors) > _CACHE_MAX:
                    self._vectors.clear()
                self._vectors.update((t, known[t]) for t in need)
        return np.stack([known[t] for t in texts])


def gate_probe() -> list[dict[str, Any]]:
    """The small labelled probe shipped with the package (own replies vs copies, EN and ZH)."""
    return json.loads(resources.files("mfs_nb").joinpath("data/gate_probe.json").read_text(encoding="utf-8"))


def prefetch(embedder: CachedEmbedder,
             jobs: Sequence[tuple[str, Sequence[tuple[int, str]], Sequence[float] | None, bool]]) -> None:
    """Embed in one call every text that classifying `jobs` (text, recent replies, own vector or
    None, whether an origin vector is wanted) will ask for. Which texts `origin.classify` embeds
    depends on n-gram overlaps only, never on the vectors, so a dry run with placeholder vectors
    names them all; the real runs then hit the cache."""
    wanted: list[str] = []

    def record(texts: list[str]) -> np.ndarray:
        wanted.extend(texts)
        return np.ones((len(texts), 8), dtype=np.float32)

    for text, recent, own, with_vector in jobs:
        try:
            origin.classify(text, recent, record, estimate_tokens, own_vector=own, with_vector=with_vector)
        except Exception:  # the real run decides; this only warms the cache
            pass
    if wanted:
        embedder(list(dict.fromkeys(wanted)))


def gate(embedder: CachedEmbedder) -> str | None:
    """Quality gate, then the stop-loss rule on the shipped probe. None: the layer may run."""
    problem = embed.quality_problem(embedder.inner)
    if problem:
        return problem
    prefetch(embedder, [(text, list(enumerate(item["context"], start=1)), None, True)
                        for item in gate_probe() for text in item["own"] + item["quote"]])
    own_m: list[float] = []
    quote_m: list[float] = []
    wrong = total = 0
    for item in gate_probe():
        recent = list(enumerate(item["context"], start=1))
        for text in item["own"]:
            v = origin.classify(text, recent, embedder, estimate_tokens)
            own_m.append(v.score)
            total += 1
            wrong += v.disposition != OWN
        for text in item["quote"]:
            quote_m.append(origin.classify(text, recent, embedder, estimate_tokens).score)
    return origin.stop_loss(own_m, quote_m, wrong, total)


def cache_dir() -> Path:
    """Where per-machine verdicts live: MFS_CACHE_DIR, else $XDG_CACHE_HOME/mfs_nb, else ~/.cache/mfs_nb."""
    explicit = os.environ.get("MFS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mfs_nb"


def gate_key(embedder: CachedEmbedder) -> str:
    """The embedder (id and version) and everything the gate's verdict depends on: the probe, the
    meaning pairs, the classifier and its thresholds (their source files). Any change runs it again."""
    from ..settings import VERSION

    digest = hashlib.sha256(VERSION.encode())
    package = resources.files("mfs_nb")
    for name in ("data/gate_probe.json", "models/embed.py", "layers/origin.py"):
        digest.update(package.joinpath(name).read_bytes())
    return f"{embedder.model_id}|{embed.version(embedder.inner)}|{digest.hexdigest()[:16]}"


def _read_gate_cache() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / "gate.json").read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached_gate(embedder: CachedEmbedder) -> str | None:
    """The gate's verdict for this embedder: from this process, from this machine's cache, or run
    now (once) and written to the cache. A cache that cannot be read or written only costs time."""
    key = gate_key(embedder)
    with _GATE_LOCK:
        if key in _GATES:
            return _GATES[key]
        stored = _read_gate_cache().get(key)
        if isinstance(stored, dict) and "problem" in stored:
            _GATES[key] = stored["problem"]
            return _GATES[key]
        problem = gate(embedder)
        _GATES[key] = problem
        try:
            folder = cache_dir()
            folder.mkdir(parents=True, exist_ok=True)
            data = _read_gate_cache()
            data[key] = {"problem": problem}
            tmp = folder / f"gate.json.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, folder / "gate.json")
        except OSError:
            pass
        return problem


_WARMING: set[str] = set()


def warm_gate_in_background(name: str) -> None:
    """Settle the gate's verdict for `name` in a daemon thread, once per process, so the first
    compaction does not run it inside a chat turn (a Session started without `%load_ext`)."""
    with _GATE_LOCK:
        if name == "off" or name in _WARMING:
            return
        _WARMING.add(name)

    def work() -> None:
        try:
            warm_gate(name)
        except Exception:  # the first compaction loads it itself, and says so if it cannot
            pass

    threading.Thread(target=work, daemon=True, name="mfs-gate").start()


def warm_gate(name: str = embed.DEFAULT_MODEL) -> str | None:
    """Load the embedder of a setting and settle its gate verdict (for a background thread at load)."""
    inner = embed.load(name)
    return None if inner is None else cached_gate(CachedEmbedder(inner))


class VerbatimTrack:
    """Verdicts of one session's user messages and the track built from them."""

    def __init__(self, host: Host):
        self.host = host
        self._lock = threading.RLock()
        stored = host.store.load_verdicts(host.name)
        said = _messages(host, set(stored))
        # a verdict that takes its words from its message, and whose message this kernel cannot read, is
        # left out (classified again when needed) rather than shown without its words
        self.verdicts: dict[int, Verdict] = {uid: Verdict.from_json(d, said.get(uid, "")) for uid, d in stored.items()
                                             if uid in said or None not in (d.get("own_text"), d.get("first_line"))}
        self._embedder: CachedEmbedder | None = None
        self._embedder_for: str | None = None
        self.off_reason: str | None = None
        self.notices: list[str] = []
        self._built: tuple[tuple[int, int], origin.Track | None] | None = None

    # -- the vector layer ------------------------------------------------------------------
    def vector_layer(self) -> CachedEmbedder | None:
        """The embedder, loaded and gated once per setting; None when the layer is off."""
        name = self.host.settings().embedding_model
        if name == self._embedder_for:
            return self._embedder
        self._embedder_for, self._embedder, self.off_reason = name, None, None
        if name == "off":
            self.off_reason = "switched off (embedding_model=off)"
            return None
        try:
            cached = CachedEmbedder(embed.load(name))  # type: ignore[arg-type]
            problem = cached_gate(cached)
        except Exception as exc:  # a model that cannot load must not cost the turn
            problem = f"cannot load {name}: {type(exc).__name__}: {exc}"
        if problem:
            self.off_reason = problem
            self.host.log("vector_layer_off", model=name, reason=problem)
            self.notices.append(f"quote detection is off ({problem}); user messages are classified by explicit "
                                "channels and length only")
            return None
        self._embedder = cached
        return cached

    def loaded_layer(self) -> CachedEmbedder | None:
        """The embedder if it is already loaded for the current setting (never loads it)."""
        return self._embedder if self._embedder_for == self.host.settings().embedding_model else None

    # -- verdicts --------------------------------------------------------------------------
    def add(self, uid: int, verdict: Verdict, model: str = "", message: str | None = None) -> None:
        """`verdict` for the user message `uid`, whose text is `message` (see `verdict_row`)."""
        with self._lock:
            self.host.store.save_verdicts(self.host.name, [verdict_row(uid, verdict, model, message)])
            self.verdicts.setdefault(uid, verdict)

    def classify_pending(self, upto: int, in_turn: bool = True) -> int:
        """Give every user message up to `upto` its verdict (once). Returns how many were new.

        In a turn (a compaction about to cover them), with the recall index on, only what the
        disposition needs is embedded (chunks that may quote a reply); a message the index has not
        embedded yet gets its origin vector when the index reaches it (`indexed`)."""
        with self._lock:
            events = self.host.events()
            todo = [e for e in events if e.role == "user" and e.uid <= upto and e.uid not in self.verdicts]
            if not todo:
                return 0
            embedder = self.vector_layer()
            own = self._own_vectors(embedder, todo) if embedder is not None else {}
            later = in_turn and self.host.settings().recall_index  # origin vectors the index will give
            if embedder is not None and len(todo) > 1:
                try:
                    prefetch(embedder, [(e.content, _recent(e, events), own.get(e.uid), not later) for e in todo])
                except Exception:  # each message is still classified (or made own words) below
                    pass
            rows, vectors, counts = [], [], {d: 0 for d in origin.DISPOSITIONS}
            for e in todo:
                verdict = self._classify(e, events, embedder, own.get(e.uid), not later)
                rows.append(verdict_row(e.uid, verdict, embedder.model_id if embedder else "", e.content))
                if verdict.vector and e.uid not in own:  # the index's own-words row is that vector already
                    vectors.append((e.uid, list(verdict.vector)))
                self.verdicts[e.uid] = verdict
                counts[verdict.disposition] += 1
            self.host.store.save_verdicts(self.host.name, rows)
            if embedder is not None:
                self._save_vectors(embedder, vectors, upto)
            self.host.log("origin", upto=upto, **{k.replace("+", "_"): v for k, v in counts.items() if v})
            return len(todo)

    def indexed(self, upto: int) -> None:
        """The recall index has vectors for uids up to `upto` (its thread calls this): the verdicts
        of the user messages among them. Those classified in a turn before need nothing more: the
        index's rows of their own words are their origin vectors (`Store.load_vectors`)."""
        self.classify_pending(upto, in_turn=False)

    def _save_vectors(self, embedder: CachedEmbedder, vectors: list[tuple[int, list[float]]], upto: int) -> None:
        if not vectors:
            return
        try:
            self.host.store.save_vectors(embedder.model_id, self.host.name, vectors)
        except Exception as exc:  # vectors are a record, not needed to render the track; the ledger says so
            self.host.log("vector_write_failed", upto=upto, vectors=len(vectors),
                       error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")

    def _own_vectors(self, embedder: CachedEmbedder, todo: Sequence[Event]) -> dict[int, list[float]]:
        """The recall index's vectors of these messages' own words (it usually writes them first): a
        message the index embedded is not embedded again for its stored origin vector."""
        try:
            return self.host.store.stored_vectors(embedder.model_id, self.host.name, [e.uid for e in todo])
        except Exception:  # the index is derived data; without it the classifier embeds as before
            return {}

    def _classify(self, event: Event, events: Sequence[Event], embedder: CachedEmbedder | None,
                  own_vector: Sequence[float] | None = None, with_vector: bool = True) -> Verdict:
        try:
            recent = _recent(event, events)
            verdict = origin.classify(event.content, recent, embedder, estimate_tokens, own_vector=own_vector,
                                      with_vector=with_vector)
            if verdict.disposition == origin.DOCUMENT:
                snap = snapshots.write(self.host.store.files, event.content, "message")
                verdict = Verdict(origin.DOCUMENT, verdict.source, "", None, verdict.score, verdict.chars,
                                  verdict.first_line, (snap.to_json(),), verdict.vector)
            return verdict
        except Exception:  # fail safe: never block, never lose — the message counts as own words
            return Verdict(OWN, "fallback", event.content, None, 0.0, len(event.content),
                           origin.first_line(event.content))

    # -- the track ---------------------------------------------------------------------------
    def build(self, upto: int, budget: int) -> origin.Track | None:
        """The track for user messages up to `upto` within `budget` tokens (cached per pair)."""
        key = (upto, budget)
        if self._built and self._built[0] == key:
            return self._built[1]
        if budget <= 0 or upto <= 0:
            track = None
        else:
            self.classify_pending(upto)
            from ..lang import header_language

            retried = self.host.retried()  # a question asked again is shown once, as the retry
            users = [e for e in self.host.events() if e.role == "user" and e.uid <= upto and e.uid not in retried]
            language = header_language(users)
            entries = [(e.uid, origin.render_entry(e.uid, self.verdicts[e.uid], language)) for e in users
                       if e.uid in self.verdicts]
            track = origin.build_track(entries, upto, budget, estimate_tokens, language)
            if track is not None:
                track = origin.shows_whole(track, entries, {e.uid: e.content for e in users})
        self._built = (key, track)
        return track


def _recent(event: Event, events: Sequence[Event]) -> list[tuple[int, str]]:
    """The assistant messages a user message is compared with: the last few before it."""
    return replies_before(events, event.uid, origin.RECENT)


def _messages(host: Host, uids: set[int]) -> dict[int, str]:
    """The content of these events. A verdict can be newer than the log this kernel read: another
    kernel recorded a message and classified it in between, so the log is read again first."""
    said = {e.uid: e.content for e in host.events() if e.uid in uids} if uids else {}
    if len(said) < len(uids):
        host.catch_up()
        said = {e.uid: e.content for e in host.events() if e.uid in uids}
    return said


def verdict_row(uid: int, verdict: Verdict, model: str, message: str | None = None) -> dict[str, Any]:
    """The stored row of a verdict; with `message`, the text of the event, what that text says is not
    stored a second time (`Verdict.to_json`)."""
    return {"uid": uid, "disposition": verdict.disposition, "source": verdict.source,
            "data": verdict.to_json(message), "model": model}
