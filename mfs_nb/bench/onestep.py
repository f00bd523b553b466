"""Answers within one step of the model (issue 44): a LoCoMo question counts when one of its evidence
turns stands word for word in the final payload, or is among the hits one search returns — what a
model has in front of it, or one tool call away. Run inside the `recall` suite, which has the
conversations indexed already.

Three ways, each at the same payload size (mfs_nb's final payload at `WINDOW`):

- **mfs_nb**: its final payload after the conversation is replayed at `WINDOW`, or an evidence turn
  in the first page of `recall_search` (its default of `PAGE` hits, hybrid search on the log; the
  turns that payload shows word for word are left out of the page, as the tool leaves them out for
  the model: until 2026-12-05 the page held them too).
- **truncate**: the newest messages that fit the same number of tokens.
- **truncate + BM25**: the same payload, or an evidence turn in the top `BM25_K` of a BM25 over the
  log — the simplest retrieval a user could put beside a chat (`bm25_top`, written here, not the
  engine's full text): English words stemmed and stop words left out by the harness's own rules
  (`atom_text`), each turn with its session's date, as the engine's log has it.
- **truncate + BM25, unseen**: the same, the BM25 top `BM25_K` taken among the messages truncation's
  payload does not show — the courtesy mfs_nb's page gets (it leaves out what its payload shows), so
  the margin between the two is not that courtesy's.

The payload side asks for an evidence turn's whole text in the markup-free payload (`atoms.Payload`),
never for the answer's words alone: a short answer ("2", "yes") also stands in a bag of words.
Nothing of the engine's code decides a match.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..commands.replay import normalise, replay
from ..recall import ranking as S
from ..window.tokens import message_tokens
from . import baselines, extraction
from .atom_text import STOP, stem_word
from .dataset import to_openai

WINDOW = 16_384  # the payload both sides are measured at
PAGE = S.PAGE  # recall_search's default k: the hits one call returns (8 until 2026-12-05)
BM25_K = 10  # the plain retrieval's top k
K1, B = 1.2, 0.75  # BM25's usual constants

_WORD = re.compile(r"\w+")


def _terms(text: str) -> list[str]:
    return [stem_word(w) for w in _WORD.findall(text.lower()) if w not in STOP]


class BM25:
    """A BM25 index over `docs`, built once (lower-cased words, stop words left out, stemmed)."""

    def __init__(self, docs: Sequence[str]):
        self.docs = [_terms(d) for d in docs]
        self.avg = sum(map(len, self.docs)) / max(len(self.docs), 1)
        self.df: Counter[str] = Counter()
        for words in self.docs:
            self.df.update(set(words))

    def top(self, query: str, k: int = BM25_K) -> list[int]:
        """Indices of the `k` documents ranked first for `query` (ties by position; no shared word, no rank)."""
        terms, n = set(_terms(query)), len(self.docs)
        scores = []
        for i, words in enumerate(self.docs):
            tf = Counter(w for w in words if w in terms)
            score = 0.0
            for t, f in tf.items():
                idf = math.log(1 + (n - self.df[t] + 0.5) / (self.df[t] + 0.5))
                score += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * len(words) / max(self.avg, 1e-9)))
            if score > 0:
                scores.append((-score, i))
        return [i for _, i in sorted(scores)[:k]]


def bm25_top(docs: Sequence[str], query: str, k: int = BM25_K) -> list[int]:
    """`BM25(docs).top(query, k)`, for one query."""
    return BM25(docs).top(query, k)


def questions(conv: dict[str, Any]) -> list[tuple[str, str, set[int], str]]:
    """(question, answer, evidence message indices, category) of every question with an answer and all
    its evidence in the conversation, the adversarial category left out (it has no answer to find)."""
    index = {m["id"]: i for i, m in enumerate(conv["messages"])}
    out = []
    for q in conv["questions"]:
        ev = [index.get(e) for e in q.get("evidence") or ()]
        if not ev or None in ev or q.get("answer") is None or q.get("category") == 5:
            continue
        out.append((q["question"], str(q["answer"]), {i for i in ev if i is not None}, str(q.get("category"))))
    return out


def truncated(messages: Sequence[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """The system prompt and the newest messages that fit `size` tokens."""
    used, start = message_tokens(baselines.SYSTEM), len(messages)
    while start > 0 and used + (cost := message_tokens(messages[start - 1])) <= size:
        start -= 1
        used += cost
    return [baselines.SYSTEM, *messages[start:]]


def final_payload(messages: list[dict[str, Any]], window: int = WINDOW) -> tuple[list[dict[str, Any]], set[int]]:
    """mfs_nb's payload for the last call of the conversation replayed at `window`, and the messages
    (indices) that payload shows word for word by the engine's own account (`SendView.shown_uids`):
    what `recall_search` leaves out of the model's page. An event is mapped to a message by its
    place in the replay and kept only where their texts are the same."""
    last: dict[str, Any] = {}

    def keep(session: Any) -> None:
        last["events"] = [(e.uid, e.content) for e in session.events]

    replay(normalise(messages), window=window, on_call=lambda session, plan: last.__setitem__("view", plan.view),
           keep=keep)
    view, events = last.get("view"), last.get("events", [])
    if view is None:
        return [], set()
    index = {uid: i for i, (uid, text) in enumerate(events)
             if i < len(messages) and text == messages[i].get("content")}
    return view.messages, {index[u] for u in view.shown_uids() if u in index}


def measure(conv: dict[str, Any], search: Callable[[str, set[int]], list[int]], window: int = WINDOW,
            keywords: Callable[[str], str] = str) -> list[dict[str, Any]]:
    """Per question: an evidence turn word for word in mfs_nb's final payload, in `search`'s page
    (message indices of the hits, at most `PAGE` read) for the question as asked and for `keywords` of
    it (the query a model writes), in truncation's payload of the same size, in BM25's top 10 for the
    question as asked. `search(query, shown)` is given the messages the final payload shows word for
    word, as the model's tool leaves them out of its page (`final_payload`)."""
    messages = to_openai(conv["messages"])
    qs = questions(conv)
    ours, shown = final_payload(messages, window)
    size = sum(message_tokens(m) for m in ours)
    cut = truncated(messages, size)
    start = len(messages) - (len(cut) - 1)  # truncation shows the messages from here on
    mine, theirs = flat_text(ours), flat_text(cut)
    bm25 = BM25([f"{m.get('date', '')} {m.get('speaker', m['role'])}: {m['content']}" for m in conv["messages"]])
    turns = [_flat(m["content"]) for m in messages]
    out = []
    for question, _answer, evidence, category in qs:
        ranked = bm25.top(question, len(messages))
        out.append({"category": category, "payload": held(mine, turns, evidence),
                    "search": bool(evidence & set(search(question, shown)[:PAGE])),
                    "search_keywords": bool(evidence & set(search(keywords(question), shown)[:PAGE])),
                    "truncate": held(theirs, turns, evidence),
                    "bm25": bool(evidence & set(ranked[:BM25_K])),
                    "bm25_unseen": bool(evidence & set([i for i in ranked if i < start][:BM25_K]))})
    return out


def _flat(text: str) -> str:
    return " ".join(text.split())


def flat_text(payload: Sequence[dict[str, Any]]) -> str:
    """A payload's markup-free text (`extraction.payload_text`), whitespace flattened."""
    return _flat(extraction.payload_text(payload))


def held(text: str, turns: Sequence[str], evidence: set[int]) -> bool:
    """Whether an evidence turn's whole text (whitespace flattened) stands in a payload's `flat_text`."""
    return any(turns[i] and turns[i] in text for i in evidence)


def rates(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The shares of questions each way has within one step."""
    n = max(len(rows), 1)
    return {"mfs_nb": sum(r["payload"] or r["search"] for r in rows) / n,
            "mfs_nb_keywords": sum(r["payload"] or r["search_keywords"] for r in rows) / n,
            "mfs_nb_payload": sum(r["payload"] for r in rows) / n,
            "truncate": sum(r["truncate"] for r in rows) / n,
            "truncate_bm25": sum(r["truncate"] or r["bm25"] for r in rows) / n,
            "truncate_bm25_unseen": sum(r["truncate"] or r["bm25_unseen"] for r in rows) / n,
            "questions": len(rows)}
