"""Recall by meaning (docs/architecture.md, "Recall"): the pure half — what gets indexed, fusion,
snippets, keywords.

No LanceDB, no model here. `index.py` feeds these functions with what the store and the embedder
return; the same functions serve the tool, the magic, the CLI and the benchmark.

- `chunks` cuts one event into the rows that are indexed (the embedder reads ~600 chars, so a
  long tool result or an attached document becomes several rows of one uid);
- `cjk_text` keeps the CJK runs of a text for the n-gram full-text column (the word tokenizer
  sees a Chinese sentence as one over-long token and drops it);
- `fuse` is reciprocal-rank fusion of any number of ranked lists; `discount_questions` lowers the
  turns that ask (`asks`) in it, as the answer after them is what was asked for;
- `window_ranking` turns the scores of the coarse index (windows of `WINDOW_EVENTS` events, each one
  full-text document) into a ranking of the events inside them;
- `snippet` is the window of a text around the query's terms;
- `keywords` are the few topic words a segment header lists, chosen deterministically;
- `time_windows` reads the dates a query names ("in May 2023", "on 8 May, 2023", "2023-05-08",
  "2023年5月", "yesterday", "last week") as spans of time; the indexer searches the events written
  in them once more and fuses that ranking with the others.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError

CHUNK_CHARS = 600  # what the embedder reads of one text (embed.MAX_CHARS)
CONTEXT_CHARS = 300  # the end of the event before, indexed with an event's words
MAX_CHUNKS = 32  # rows per event; the rest of a huge result is still in the log, by uid
# Fusion and smoothing constants, chosen on the LoCoMo evidence benchmark (`mfs-nb bench recall`):
# a small k lets each method's top ranks count (a search answers with ten hits, not a hundred);
# a turn adds half the (floored) score of its better neighbour, and 0.35 of its better neighbour two
# away: a topic runs over a few turns, and the words of a question often stand a turn or two from
# its answer. The second ring, on 2026-12-05: hit@10 0.860 → 0.865, open-domain 0.471 → 0.549,
# temporal 0.850 → 0.872, multi-hop unchanged (0.25 and 0.15 gained less; a third ring nothing).
RRF_K = 10
METHODS = ("fts", "vector", "latent", "window")  # latent terms re-rank what the first two found; window: the coarse index
WEIGHTS = {"fts": 1.0, "vector": 1.0, "latent": 1.0, "window": 0.5}
# The coarse index (issue 44): every WINDOW_EVENTS events of the log, in fixed steps (uids 1-20,
# 21-40, ...), are one more full-text document; a question whose words stand spread over a few turns
# of one topic finds the window, and the turns inside it join the fusion ranked by their window's
# score (their own full-text score orders them within it). Chosen on the LoCoMo evidence benchmark
# (2026-12-05, development loop): windows of 20 without overlap did as well as overlapping ones of
# 10-20 at half the index; 20 did better than 4, 6 and 10; weight 0.5 better than 1.0.
WINDOW_EVENTS = 20
WINDOW_EVENT_CHARS = 1_000  # of each event's text in its window: a long tool result does not make it
WINDOW_OWN = 0.1  # a turn's own full-text score, beside its window's
WINDOW_SEP = "\x1e"  # between the events of a window's text (the word index reads it as a space)
NEIGHBOUR_SHARE = 0.5
NEIGHBOUR_SHARE_2 = 0.35  # the neighbour two turns away
# A turn that asks is seldom the turn that answers: its words match a question about its topic, but
# what was said back stands in the next turn. In a search over both speakers, a turn that asks keeps
# QUESTION_SHARE of its fused score (the answer after it is lent its score by smoothing). A turn asks
# when it ends with a question and its questions are at least ASKING_PART of its text: a long answer
# that closes with an offer ("Want me to write a checklist?") still answers. On the LoCoMo
# development loop (2026-12-06): within one step 93.9 -> 94.2 %; every turn ending with a question
# 94.4 %, half its text 94.0 %, the user's turns only 94.1 %; 0.6 best of 0.4-0.8.
QUESTION_SHARE = 0.6
ASKING_PART = 0.3
_CLOSERS = "\"')]*”’」 \t\n"  # what may follow a question mark at the end: quotes, brackets, emphasis
_SENTENCE = re.compile(r"[^.!?。！？]*[.!?。！？]+[\"')\]*”’」]*|[^.!?。！？]+$")
MAX_QUERY_CHARS = 2_000
MAX_K = 100
PAGE = 10  # the hits a search returns unless asked for more: the tool, the magic, the CLI, MCP
SNIPPET_CHARS = 240

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'-]{2,}")
_WORDS = re.compile(r"\w+")
# Words that say nothing about a topic (English function words and chat filler).
_STOPWORDS = """
about above after again also although always among another anyone anything around because been before
being below between both cannot could does doing done down during each either else even ever every
from further going gonna have having here hers herself himself into itself just know like made make
many maybe more most much must myself need never none once only other ought ours ourselves over
really right same shall should since some something such than that thats their theirs them
themselves then there these they thing things think this those though through thus together too
under until upon very want was wasn were weren what whatever when where whether which while who
whom whose will with within without would yeah yes you your yours yourself yourselves the and
for are but not all any can had has her him his how its let may our out own she too use
used using get got did way well still back just okay sure thanks thank hey hello great good
"""
STOP = frozenset(_STOPWORDS.split())


@dataclass(frozen=True)
class Hit:
    """One search result: where it is in the log, how well it matched, and a bit of its text."""

    uid: int
    role: str
    turn: int
    score: float
    snippet: str
    kind: str = "event"  # event | segment
    uid_to: int = 0  # a segment's last uid (its range is uid..uid_to)
    via: tuple[str, ...] = ()  # which methods found it: fts, vector
    neighbours: tuple[dict[str, Any], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the model or a terminal: where, who, score, snippet."""
        where = f"#{self.uid} {self.role}" if self.kind == "event" else f"summary of uids {self.uid}–{self.uid_to}"
        return f"[{where} · turn {self.turn} · {self.score:.3f}] {self.snippet}"


@dataclass
class Results:
    """Hits plus what the caller should know about how they were found."""

    hits: list[Hit]
    notices: list[str] = field(default_factory=list)
    methods: tuple[str, ...] = ()
    left_out: tuple[int, ...] = ()  # events of the first k left out as shown already (`shown`), best first

    def __iter__(self) -> Any:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)

    def __getitem__(self, i: int) -> Hit:
        return self.hits[i]


def check_query(query: Any, k: Any) -> tuple[str, int]:
    """A usable query and k, or InputError with one line. Long queries are cut, k is capped."""
    if isinstance(query, bytes):
        try:
            query = query.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("the search query is not UTF-8 text; search for words") from None
    if not isinstance(query, str):
        raise InputError(f"the search query must be text, not {type(query).__name__}")
    query = " ".join(query.replace("\x00", " ").split())
    if not query:
        raise InputError("the search query is empty: say what to look for, e.g. recall_search('pool size')")
    if isinstance(k, bool) or not isinstance(k, (int, float, str)):
        raise InputError(f"k must be a whole number, not {k!r}")
    try:
        kk = int(k)
    except (TypeError, ValueError):
        raise InputError(f"k must be a whole number, not {k!r}") from None
    if kk < 1:
        raise InputError(f"k must be at least 1 (got {kk})")
    return query[:MAX_QUERY_CHARS], min(kk, MAX_K)


def chunks(text: str, size: int = CHUNK_CHARS, limit: int = MAX_CHUNKS) -> list[str]:
    """The indexed pieces of one text: whole when short, else cuts at whitespace near `size`."""
    text = text.strip()
    if len(text) <= size:
        return [text] if text else []
    out: list[str] = []
    start = 0
    while start < len(text) and len(out) < limit:
        end = min(len(text), start + size)
        if end < len(text):
            space = text.rfind(" ", start + size // 2, end)
            end = space if space > start else end
        out.append(text[start:end].strip())
        start = end
    return [c for c in out if c]


def cjk_text(text: str) -> str:
    """The CJK runs of a text, space-separated (what the n-gram full-text column holds)."""
    return " ".join(_CJK.findall(text))


def has_cjk(text: str) -> bool:
    return bool(_CJK.search(text))


def latin_text(text: str) -> str:
    """The text without its CJK runs (what the word full-text column is queried with)."""
    return " ".join(_CJK.sub(" ", text).split())


def context_tail(text: str, chars: int = CONTEXT_CHARS) -> str:
    """The last `chars` characters of a text, starting at a word."""
    text = " ".join(text.split())
    if len(text) <= chars:
        return text
    cut = text[-chars:]
    return cut[cut.find(" ") + 1:] if " " in cut else cut


# Question words and other function words a full-text query gains nothing from.
_QUERY_WORDS = """a an and are as at be by did do does for from had has have he her his how i in is it its
me my of on or she that the their them they this to was we were what when where which who whom why will with
would could should you your about"""
_QUERY_STOP = frozenset(_QUERY_WORDS.split())


def fts_query(text: str) -> str:
    """Words only (punctuation means query syntax to a full-text engine, and a user means none),
    without question and function words unless nothing else is left."""
    words = re.findall(r"\w+", text)
    content = [w for w in words if w.lower() not in _QUERY_STOP]
    return " ".join(content or words)[:MAX_QUERY_CHARS]


def fuse(ranked: Sequence[Sequence[str]], k: int = RRF_K, weights: Sequence[float] | None = None
         ) -> list[tuple[str, float]]:
    """Reciprocal-rank fusion: list i votes weights[i]/(k + rank) for its keys; ties by first seen."""
    score: dict[str, float] = {}
    for i, lst in enumerate(ranked):
        w = 1.0 if weights is None else weights[i]
        for rank, key in enumerate(lst):
            score[key] = score.get(key, 0.0) + w / (k + rank + 1)
    order = {key: i for i, key in enumerate(dict.fromkeys(x for lst in ranked for x in lst))}
    return sorted(score.items(), key=lambda kv: (-kv[1], order[kv[0]]))


def asks(text: str) -> bool:
    """Whether a turn asks: it ends with a question mark (ASCII or full-width, before closing quotes,
    brackets or emphasis) and its questions make up at least ASKING_PART of its text."""
    t = text.rstrip(_CLOSERS)
    if not t.endswith(("?", "？")):
        return False
    asked = sum(len(p) for p in _SENTENCE.findall(t) if p.rstrip(_CLOSERS).endswith(("?", "？")))
    return asked >= ASKING_PART * len(t)


def discount_questions(fused: Sequence[tuple[str, float]], asking: Collection[str],
                       share: float | None = None) -> list[tuple[str, float]]:
    """The fused ranking with each key in `asking` (turns that ask: `asks`) at `share` of its
    score (default QUESTION_SHARE as it stands when called: the benchmark's ablation sets it), sorted
    again; ties keep their fused order."""
    share = QUESTION_SHARE if share is None else share
    if not asking or share == 1.0:
        return list(fused)
    scored = [(key, sc * share if key in asking else sc, i) for i, (key, sc) in enumerate(fused)]
    scored.sort(key=lambda x: (-x[1], x[2]))
    return [(key, sc) for key, sc, _ in scored]


def _window_terms(text: str) -> list[str]:
    """The terms a window is scored by: lower-cased words less `STOP`, and CJK character pairs. A
    search reads about a thousand events' texts this way (50 windows of 20), most with no CJK."""
    has_cjk = _CJK.search(text) is not None
    words = [w for w in _WORDS.findall((latin_text(text) if has_cjk else text).lower()) if w not in STOP]
    if not has_cjk:
        return words
    cjk = cjk_text(text).replace(" ", "")
    return words + [cjk[i:i + 2] for i in range(len(cjk) - 1)]


def latent_scores(rows: Sequence[dict[str, Any]], query: tuple[Sequence[int], Sequence[float]]) -> np.ndarray:
    """Each row's dot product of its latent terms with the query's (`terms` and `weights`, numpy
    arrays: `Store.latent_rows`), a term the query lacks weighing nothing; summed left to right in
    each row's order (the same bits as Python 3.11's `sum` over the row; from 3.12 `sum` compensates)."""
    q = dict(zip(*query))  # a term named twice: its last weight
    if not rows or not q:
        return np.zeros(len(rows))
    keys = np.fromiter(q, np.int64, len(q))
    order = np.argsort(keys)
    keys, values = keys[order], np.fromiter(q.values(), np.float64, len(q))[order]
    terms = np.concatenate([r["terms"] for r in rows])
    weights = np.concatenate([r["weights"] for r in rows])
    at = np.searchsorted(keys, terms).clip(max=len(keys) - 1)
    products = np.where(keys[at] == terms, values[at], 0.0) * weights
    owner = np.repeat(np.arange(len(rows)), [len(r["terms"]) for r in rows])
    return np.bincount(owner, weights=products, minlength=len(rows))


def window_scores(texts: dict[int, str], query: str, windows: int) -> tuple[dict[int, float], dict[int, float]]:
    """BM25 of `query` over the windows the full text found (first uid -> text, its events' texts
    joined by `WINDOW_SEP`), the terms' document frequencies counted among them, `windows` the number
    the session has; and each event's own score (uid -> score) with the same weights of the terms.
    The full-text engine's statistics span every session of the store, where a session's own names
    (its speakers, its project) are rare; within the session they stand in most windows and say little."""
    terms = set(_window_terms(query))
    if not terms or not texts:
        return {}, {}
    parts = {u: [_window_terms(x) for x in t.split(WINDOW_SEP)] for u, t in texts.items()}
    counts = {u: [Counter(p) for p in ps] for u, ps in parts.items()}  # counted at C speed, read per query term
    n = max(windows, len(parts))
    df = Counter(w for cs in counts.values() for w in {t for c in cs for t in terms if t in c})
    idf = {w: math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) for w in df}

    def matches(words: list[str], c: Counter[str]) -> dict[str, int]:
        """The query's terms in `words` with their counts, in the order they first appear there."""
        return {w: c[w] for _, w in sorted((words.index(w), w) for w in idf if w in c)}

    def bm25(tf: dict[str, int], length: int, avg: float) -> float:
        norm = 1.2 * (0.25 + 0.75 * length / (avg or 1.0))
        return sum(idf[w] * f * 2.2 / (f + norm) for w, f in tf.items())

    found = {u: [matches(p, c) for p, c in zip(parts[u], cs)] for u, cs in counts.items()}
    lengths = {u: sum(map(len, ps)) for u, ps in parts.items()}
    avg_window = sum(lengths.values()) / len(parts)
    events = [p for ps in parts.values() for p in ps]
    avg_event = sum(map(len, events)) / max(len(events), 1)
    own = {u + i: bm25(tf, len(p), avg_event) for u, ps in parts.items() for i, (p, tf) in enumerate(zip(ps, found[u]))}
    windows_tf: dict[int, dict[str, int]] = {}
    for u, tfs in found.items():  # a window's counts, its terms in the order they first appear in it
        tf = windows_tf[u] = {}
        for part in tfs:
            for w, f in part.items():
                tf[w] = tf.get(w, 0) + f
    return {u: bm25(windows_tf[u], lengths[u], avg_window) for u in parts}, own


def window_ranking(windows: dict[int, float], own: dict[int, float], n: int | None = None) -> list[int]:
    """The events inside the windows found (first uid -> score, higher is better), best window first;
    within a window, by `WINDOW_OWN` of their own score (`own`, uid -> score; 0 when not found), then
    by uid."""
    n = WINDOW_EVENTS if n is None else n
    score: dict[int, float] = {}
    for lo, s in windows.items():
        if s > 0:
            for u in range(lo, lo + n):
                score[u] = max(score.get(u, 0.0), s + WINDOW_OWN * own.get(u, 0.0))
    return sorted(score, key=lambda u: (-score[u], u))


def smooth(scores: dict[int, float], share: float = NEIGHBOUR_SHARE, floor: float | None = None,
           share2: float | None = None) -> list[tuple[int, float]]:
    """Candidates (uid -> score, higher is better) re-ranked with their neighbours: each score,
    less the lowest candidate's, plus `share` of the better of uid-1 and uid+1 and `share2` of the
    better of uid-2 and uid+2. The neighbours of a candidate join the ranking too: an answer often
    sits a turn or two after the turn that matched. Only the candidates are known, so this needs no
    scan of the log; `floor` is the score of what was not returned (default: the lowest candidate's);
    `share2` defaults to `NEIGHBOUR_SHARE_2` as it stands when called (the benchmark's ablation sets it)."""
    if not scores:
        return []
    share2 = NEIGHBOUR_SHARE_2 if share2 is None else share2
    floor = min(scores.values()) if floor is None else floor
    base = {u: s - floor for u, s in scores.items()}
    reach = (-2, -1, 1, 2) if share2 else (-1, 1)  # without the second ring, its turns do not join either
    pool = set(base) | {u + d for u in base for d in reach if u + d > 0}
    out = {u: base.get(u, 0.0) + share * max(base.get(u - 1, 0.0), base.get(u + 1, 0.0))
           + share2 * max(base.get(u - 2, 0.0), base.get(u + 2, 0.0)) for u in pool}
    return sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))


def snippet(text: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """About `width` chars of `text` around the first query term it contains, on one line."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    terms = [t.lower() for t in re.findall(r"\w+", query) if len(t) > 2] + _CJK.findall(query)
    low = flat.lower()
    at = min((p for p in (low.find(t) for t in terms) if p >= 0), default=0)
    start = max(0, min(at - width // 3, len(flat) - width))
    out = flat[start:start + width]
    return ("…" if start else "") + out + ("…" if start + width < len(flat) else "")


def keywords(texts: Iterable[str], n: int = 6) -> list[str]:
    """A few topic words of a range, deterministically: frequent content words (and CJK bigrams)
    that appear in more than one place weigh more; ties break alphabetically."""
    counts: Counter[str] = Counter()
    spread: Counter[str] = Counter()
    for text in texts:
        terms = _terms(text)
        counts.update(terms)
        spread.update(set(terms))
    scored = sorted(counts, key=lambda w: (-(counts[w] * (1 + math.log(spread[w]))), w))
    return scored[:n]


@functools.lru_cache(maxsize=20_000)
def _terms(text: str) -> tuple[str, ...]:
    """The content words and CJK bigrams of one text. A function of the text alone, so it is cached:
    a consolidation's sink reads every message the compacted history holds, each time it runs (by
    chat 4,000 of one session, 0.25 s a sink spent finding the same words again)."""
    words = [w.lower().strip("'-") for w in _WORD.findall(text)]
    words = [w for w in words if w not in STOP and len(w) > 3 and not w.isdigit()]
    grams = [run[i:i + 2] for run in _CJK.findall(text) for i in range(len(run) - 1)]
    return tuple(words + grams)


def where(session: str, role: str | Sequence[str] | None = None, uid_from: int | None = None,
          uid_to: int | None = None) -> str:
    """The filter of a search as a SQL predicate (session always; role and uid range when given)."""
    def q(v: str) -> str:
        return "'" + v.replace("'", "''") + "'"

    parts = [f"session = {q(session)}"]
    roles = [role] if isinstance(role, str) else list(role or [])
    if roles:
        bad = [r for r in roles if r not in ("user", "assistant", "tool", "segment")]
        if bad:
            raise InputError(f"role must be user, assistant, tool or segment, not {bad[0]!r}")
        parts.append(f"role IN ({', '.join(q(r) for r in roles)})")
    if uid_from is not None:
        parts.append(f"uid >= {int(uid_from)}")
    if uid_to is not None:
        parts.append(f"uid <= {int(uid_to)}")
    return " AND ".join(parts)


def window_where(session: str, uid_from: int | None = None, uid_to: int | None = None) -> str:
    """The filter of a search of the coarse index (its own table): the session's windows that overlap
    the uid range."""
    parts = [where(session)]
    if uid_from is not None:
        parts.append(f"uid_to >= {int(uid_from)}")
    if uid_to is not None:
        parts.append(f"uid <= {int(uid_to)}")
    return " AND ".join(parts)




def latent_of(embedder: Any) -> Any:
    """The embedder's latent-terms function (through a caching wrapper), or None when it has none."""
    return getattr(getattr(embedder, "inner", embedder), "latent", None)
