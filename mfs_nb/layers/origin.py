"""Who wrote a user message, and what the verbatim track keeps of it (docs/architecture.md,
"The verbatim tracks").

Pure functions over text and vectors: no store, no files, no model loading (an `Embedder` is
passed in). Classification is zero-LLM and fails safe — any doubt, any error: the user's own words.

Order of decision for one user message:
1. an explicit channel the user chose (`--quote`, `--doc`, `--own`, a pasted document);
2. quote detection: each chunk of the message is compared with the recent assistant messages;
   a chunk is quoted when its embedding is close (cosine) *and* its character n-grams are mostly
   found in those messages — e5-style vectors put a reply on the same topic at 0.9+, so the
   vector alone cannot tell an answer from a copy; the overlap alone cannot see a reworded copy;
3. length: over `DOC_TOKENS` and not a quote → a document.

Dispositions in the track: own words verbatim; a quote as a one-line pointer; a quote with the
user's own words as full text, labelled; a document as a pointer to its snapshot.

Also here, what is nobody's words: the lines the intake writes around an attached document (the
opening one is its pointer, kept where a pointer helps), and the offline default's notice standing
in for a reply.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .. import lang
from ..window.tokens import newest_within
from .facts import stands_whole

OWN, QUOTE, QUOTE_NOTE, DOCUMENT = "own", "quote", "quote+note", "document"
DISPOSITIONS = (OWN, QUOTE, QUOTE_NOTE, DOCUMENT)

COSINE = 0.93  # measured on the probe set (docs/benchmarks.md, "verbatim")
OVERLAP = 0.5  # share of a chunk's n-grams found in the recent assistant messages
MIN_CHUNK = 24  # shorter chunks are never taken for quotes (non-space chars)
CHUNK = 300  # paragraphs longer than this are compared in windows of this many chars
VECTOR_CHUNKS = 8  # chunks averaged into a message's stored origin vector
RECENT = 4  # assistant messages a user message is compared with
DOC_TOKENS = 1500  # the length fallback
PASTE_CHARS = 1500  # pastes over this that look like documents become snapshots at once
SEPARATOR = re.compile(r"^\s*(-{3,}|={3,}|_{3,})\s*$", re.M)
_WORDISH = re.compile(r"[^\W\d_]", re.U)
# the lines `attachment_block` writes around a document (its path is under snapshots.DIR)
_OPENING = r"\[attached document attachments/[^\]\n]+ \([\d,]+ chars\)\]"
_CLOSING = re.compile(r"^[ \t]*\[end of attachments/[^\]\n]+\][ \t]*$", re.M)
_MARKUP = re.compile(rf"^[ \t]*{_OPENING}[ \t]*$|{_CLOSING.pattern}", re.M)
OFFLINE_NOTICE = (
    "**No model is configured**, so this reply comes from mfs_nb's offline default and no LLM "
    "read your message. Your message is kept in the log and will be part of the conversation once "
    "a model is set: `%mfs config model=openai/gpt-4o-mini` with `OPENAI_API_KEY` in the "
    "environment, or any litellm model name via `MFS_MODEL`."
)
_NOTICE = " ".join(OFFLINE_NOTICE.split())


def attachment_block(path: str, chars: int, inline: str) -> str:
    """An attached document as it stands in the user's message: a line naming its snapshot and size,
    its text (or the part the window allows), and a line that closes it."""
    return f"[attached document {path} ({chars:,} chars)]\n{inline}\n[end of {path}]"


def markup_free(text: str, pointer: bool = False) -> str:
    """A message's text less the lines that close its attached documents, and less the lines that
    open them unless `pointer` (the opening line names the snapshot: a pointer worth keeping)."""
    return (_CLOSING if pointer else _MARKUP).sub("", text)


def canned(text: str) -> bool:
    """Whether a reply is the offline default's chat notice (`offline`): mfs_nb's words, not a
    model's, and nothing the conversation said (the offline summaries, the fact track and the topic
    words leave it out)."""
    return " ".join(text.split()) == _NOTICE


@dataclass(frozen=True)
class Verdict:
    """The origin of one user message and what the track keeps of it."""

    disposition: str
    source: str  # explicit | vector | length | default | fallback
    own_text: str = ""
    quoted_uid: int | None = None
    score: float = 0.0  # best chunk margin: min(cosine / COSINE, overlap / OVERLAP); >= 1 is a quote
    chars: int = 0
    first_line: str = ""
    snapshots: tuple[dict[str, Any], ...] = ()
    vector: tuple[float, ...] = field(default=(), repr=False)

    def to_json(self, message: str | None = None) -> dict[str, Any]:
        """The stored form. Given the `message` it classifies (the event's content, kept in the log),
        what the message itself says is not stored twice: own words that are the whole message, and
        its first line, are null, and `from_json` takes them from the message again."""
        data = asdict(self)
        data["snapshots"] = [dict(s) for s in self.snapshots]
        data.pop("vector")
        if message:
            if data["own_text"] == message:
                data["own_text"] = None
            if data["first_line"] == first_line(message):
                data["first_line"] = None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], message: str = "") -> Verdict:
        known = {k: data[k] for k in ("disposition", "source", "own_text", "quoted_uid", "score", "chars",
                                      "first_line") if k in data}
        if "own_text" in known and known["own_text"] is None:
            known["own_text"] = message
        if "first_line" in known and known["first_line"] is None:
            known["first_line"] = first_line(message)
        return cls(**known, snapshots=tuple(data.get("snapshots") or ()))


def first_line(text: str, limit: int = 80) -> str:
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[:limit - 1] + "…"


def chunks(text: str) -> list[tuple[int, int]]:
    """(start, end) spans: paragraphs (blank-line separated), long ones cut into windows."""
    spans: list[tuple[int, int]] = []
    for m in re.finditer(r"\S(?:.*?\S)?(?=\n[ \t]*\n|\s*\Z)", text, re.S):
        start, end = m.start(), m.end()
        while end - start > CHUNK:
            cut = text.rfind(" ", start + CHUNK // 2, start + CHUNK)
            cut = cut if cut > start else start + CHUNK
            spans.append((start, cut))
            start = cut
        spans.append((start, end))
    return spans


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[*_`#>|]+", " ", text.lower())).strip()


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def gram_size(text: str) -> int:
    """Character n-gram size for copy tests: 4 for CJK text (a character is nearly a word), 7 for
    alphabetic text, where 4-grams like ' the' are shared by any two English texts."""
    sample = text[:2000]
    return 4 if len(_CJK.findall(sample)) > 0.2 * max(1, len(sample.strip())) else 7


def grams(text: str, n: int | None = None) -> set[str]:
    n = n or gram_size(text)
    t = _norm(text)
    return {t[i:i + n] for i in range(max(1, len(t) - n + 1))} if t else set()


def split_quote(text: str) -> tuple[str, str]:
    """`--quote` cells: the pasted part, then after a separator line (---) the user's own note."""
    m = SEPARATOR.search(text)
    if not m:
        return text.strip(), ""
    return text[:m.start()].strip(), text[m.end():].strip()


def looks_like_document(text: str) -> bool:
    """A paste the front end turns into a snapshot: long and shaped like a file (many lines or
    paragraphs, headings, code fences, tables) rather than one long note."""
    if len(text) <= PASTE_CHARS:
        return False
    lines = [x for x in text.splitlines() if x.strip()]
    paragraphs = len(re.split(r"\n[ \t]*\n", text.strip()))
    shaped = bool(re.search(r"^(#{1,6} |```|\|.*\|\s*$)", text, re.M))
    return len(lines) >= 20 or paragraphs >= 6 or shaped


def best_overlap(text: str, recent: Sequence[tuple[int, str]]) -> int | None:
    """The recent assistant message whose n-grams cover most of `text`, when that is at least
    `OVERLAP` (a cheap copy test that needs no model), else None."""
    n = gram_size(text)
    g = grams(text, n)
    if not g:
        return None
    best, best_uid = 0.0, None
    for uid, a in recent:
        share = len(g & grams(a, n)) / len(g)
        if share > best:
            best, best_uid = share, uid
    return best_uid if best >= OVERLAP else None


def _meaningful(text: str) -> bool:
    return len(_WORDISH.findall(text)) >= 2


def _positions(norm: str, n: int) -> dict[str, int]:
    pos: dict[str, int] = {}
    for i in range(max(1, len(norm) - n + 1)):
        pos.setdefault(norm[i:i + n], i)
    return pos


def aligned_window(piece: str, norm_ref: str, positions: dict[str, int], n: int) -> str:
    """The stretch of a (normalised) assistant message that lines up with `piece`: the median
    offset of their shared n-grams, as long as the piece."""
    p = _norm(piece)
    offsets = sorted(positions[p[i:i + n]] - i for i in range(max(1, len(p) - n + 1)) if p[i:i + n] in positions)
    if not offsets:
        return ""
    start = max(0, offsets[len(offsets) // 2])
    return norm_ref[start:start + len(p)]


def unit(vector: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    """A stored origin vector: `vector` scaled to length 1."""
    v = np.asarray(vector, dtype=np.float32)
    return tuple(float(x) for x in v / (np.linalg.norm(v) or 1.0))


def classify(text: str, recent: Sequence[tuple[int, str]], embed: Callable[[list[str]], np.ndarray] | None,
             count_tokens: Callable[[str], int], *, cosine: float = COSINE, overlap: float = OVERLAP,
             own_vector: Sequence[float] | None = None, with_vector: bool = True) -> Verdict:
    """The origin of `text` given the assistant messages before it (`recent`, oldest first).
    `embed` None means the vector layer is off: only the length rule applies. The verdict's stored
    vector is `own_vector` when given (the recall index's vector of the message's own words, so the
    message is not embedded twice), else the mean of its opening chunks, else (`with_vector` False)
    none: the disposition never depends on it.

    A chunk is compared, by embedding, with the stretch of the recent assistant message that
    shares most of its character n-grams (aligned on them), so a quote of half a paragraph is measured
    against that half and not against a window diluted by the rest."""
    spans = chunks(text)
    quoted: list[tuple[int, int, int, float]] = []  # start, end, assistant uid, margin
    best_any = 0.0  # the highest margin of any chunk
    vector: tuple[float, ...] = ()
    refs = [(uid, a) for uid, a in recent if a.strip()]
    if embed is not None and spans:
        pieces = [text[s:e] for s, e in spans]
        # a paste may run across several replies: align against all of them, joined in order
        joined = _norm("\n".join(a for _, a in refs))
        n = gram_size(text)
        positions = _positions(joined, n)
        ref_grams = {uid: grams(a, n) for uid, a in refs}
        union = set().union(*ref_grams.values()) if ref_grams else set()
        candidates: list[tuple[int, int, float, str]] = []  # chunk index, uid, overlap, aligned window
        short: list[tuple[int, int, float]] = []  # chunks too short to embed: copied only next to a quote
        for i, piece in enumerate(pieces):
            g = grams(piece, n)
            if not g or not refs:
                continue
            share = len(g & union) / len(g)
            uid = max(refs, key=lambda r: (len(g & ref_grams[r[0]]), r[0]))[0]
            if len(re.sub(r"\s", "", piece)) < MIN_CHUNK:
                short.append((i, uid, share))
                continue
            best_any = max(best_any, min(share / overlap, 0.999))
            if share >= overlap:
                window = aligned_window(piece, joined, positions, n)
                if window:
                    candidates.append((i, uid, share, window))
        # the stored origin vector: the one given, else the mean of the message's opening chunks
        head = pieces[:VECTOR_CHUNKS] if own_vector is None and with_vector else []
        asked = head + [_norm(pieces[i]) for i, *_ in candidates] + [w for *_, w in candidates]
        vectors = embed(asked) if asked else np.zeros((0, 1), dtype=np.float32)
        if head or own_vector is not None:
            vector = unit(vectors[:len(head)].mean(axis=0) if head else own_vector)
        k = len(candidates)
        mine, theirs = vectors[len(head):len(head) + k], vectors[len(head) + k:]
        for (i, uid, share, _), a, b in zip(candidates, mine, theirs):
            margin = min(float(a @ b) / cosine, share / overlap)  # >= 1: both tests pass
            best_any = max(best_any, margin)
            if margin >= 1.0:
                quoted.append((spans[i][0], spans[i][1], uid, margin))
        if quoted:  # list items and headings of a pasted reply are too short to embed, but copied too
            quoted += [(spans[i][0], spans[i][1], uid, share / overlap) for i, uid, share in short
                       if share >= overlap]
            quoted.sort()
    chars = len(text)
    if not quoted:
        if count_tokens(text) > DOC_TOKENS:
            return Verdict(DOCUMENT, "length", "", None, best_any, chars, first_line(text), vector=vector)
        return Verdict(OWN, "vector" if embed is not None and refs else "default", text, None, best_any, chars,
                       first_line(text), vector=vector)
    own_parts, pos = [], 0
    for s, e, _, _ in quoted:
        if s > pos:
            own_parts.append(text[pos:s])
        pos = e
    own_parts.append(text[pos:])
    own = "\n".join(p.strip() for p in own_parts if p.strip())
    votes: dict[int, int] = {}
    for s, e, uid, _ in quoted:
        votes[uid] = votes.get(uid, 0) + (e - s)
    source_uid = max(votes, key=lambda u: (votes[u], u))
    score = max(q[3] for q in quoted)
    if _meaningful(own):
        return Verdict(QUOTE_NOTE, "vector", text, source_uid, score, chars, first_line(text), vector=vector)
    return Verdict(QUOTE, "vector", "", source_uid, score, chars, first_line(text), vector=vector)


# -- the track ---------------------------------------------------------------------------------
def render_entry(uid: int, v: Verdict, language: str = "") -> str:
    """One line (or block) of the track, its labels in `language` (lang.py); the same verdict in
    the same language always renders the same bytes."""
    docs = [lang.text("document_snapshot", language, path=d["path"], chars=d["chars"], first_line=d["first_line"])
            for d in v.snapshots]
    if v.disposition == QUOTE:
        origin = (lang.text("quoted_from_reply", language, reply=v.quoted_uid) if v.quoted_uid
                  else lang.text("quoted_from_ai", language))
        out = lang.text("quoted", language, chars=v.chars, origin=origin, first_line=v.first_line, uid=uid)
        return f"[#{uid}] {out}"
    if v.disposition == QUOTE_NOTE:
        label = (lang.text("quoted_note_from", language, reply=v.quoted_uid) if v.quoted_uid
                 else lang.text("quoted_note", language))
        return f"[#{uid}] {label}\n{v.own_text}"
    if v.disposition == DOCUMENT and not docs:
        out = lang.text("document", language, chars=v.chars, first_line=v.first_line, uid=uid)
        return f"[#{uid}] {out}"
    parts = ([v.own_text] if v.own_text.strip() else []) + docs
    return f"[#{uid}] " + "\n".join(parts)


@dataclass(frozen=True)
class Track:
    """The rendered track and what it stands for."""

    text: str
    upto: int  # user messages with uid <= upto are in (or dropped from) the track
    kept: tuple[int, ...]
    dropped: tuple[int, int] | None
    tokens: int
    whole: tuple[int, ...] = ()  # kept messages whose whole text the track shows word for word (`shows_whole`)


def shows_whole(track: Track, entries: Sequence[tuple[int, str]], texts: dict[int, str]) -> Track:
    """`track` with `whole` set: the kept messages (uid -> text in `texts`) whose whole text, whitespace
    aside, stands in their entry — own words, or a quote short enough to stand whole in its pointer line; not
    a longer quote or a document. A search for the model leaves them out of its page, as it leaves out the
    raw tail (`SendView.shown_uids`)."""
    lines = dict(entries)
    return replace(track, whole=tuple(u for u in track.kept if stands_whole(texts.get(u, ""), lines.get(u, ""))))


def build_track(entries: Sequence[tuple[int, str]], upto: int, budget: int,
                count_tokens: Callable[[str], int], language: str = "") -> Track | None:
    """Newest entries first until the budget is spent; the older rest is named as recallable."""
    if not entries:
        return None
    header = lang.text("verbatim_caption", language, upto=upto)
    # room for the header and the note on dropped entries
    kept, dropped = newest_within(entries, budget - count_tokens(header) - 40, 2, count_tokens)
    lines = [header]
    if dropped:
        lines.append(lang.text("verbatim_dropped", language, lo=dropped[0], hi=dropped[1]))
    lines += [line for _, line in kept]
    text = "\n".join(lines)
    return Track(text, upto, tuple(uid for uid, _ in kept), dropped, count_tokens(text))


# -- the stop-loss rule (docs/architecture.md, "The verbatim tracks") ----------------------------
MAX_OWN_MISLABEL = 0.05


def stop_loss(own_margins: Sequence[float], quote_margins: Sequence[float],
              own_mislabelled: int, own_total: int) -> str | None:
    """Why the vector layer must be switched off, or None: own words mislabelled more than 5 %
    of the time, or the two classes overlap (the 95th percentile of own-words margins reaches
    the 5th percentile of quoted margins). Then only explicit channels and length decide."""
    if own_total and own_mislabelled / own_total > MAX_OWN_MISLABEL:
        return f"own words mislabelled {own_mislabelled}/{own_total} times (> 5 %)"
    if own_margins and quote_margins:
        hi = float(np.percentile(own_margins, 95))
        lo = float(np.percentile(quote_margins, 5))
        if hi >= lo:
            return f"own words and quotes overlap (own p95 {hi:.3f} >= quote p5 {lo:.3f})"
    return None
