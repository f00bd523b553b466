"""Summary validation before any segment is committed (docs/architecture.md, "Failure handling";
issue 13). Pure functions.

A model's summary becomes a segment only when it is non-empty prose, not a refusal or a bare
preamble (a small multilingual pattern list), not filler, mentions some of the range's own
content words, is shorter than its input, and fits the segment target (a cap: the excess is cut
and the cut is noted). The fact list is never the model's: `segments.build` extracts it from the
originals. A rejected summary is a summarizer failure (it counts toward the breaker).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..events import Event
from ..window.tokens import estimate_tokens

CAP_FACTOR = 2  # a summary may take up to twice its target before the excess is cut
MIN_CHARS = 20
_ANALYSIS = re.compile(r"<analysis>.*?</analysis>", re.S | re.I)

# Refusals and error-like openings (en, zh, ja, de, fr, es, ru): the whole output is rejected.
_REFUSAL = re.compile(
    r"^\W*(?:error\b|exception\b|traceback\b|i(?:'|’)?m sorry|i am sorry|sorry\b|i apologi[sz]e|"
    r"i(?:'|’)?m (?:unable|not able)|i am (?:unable|not able)|i cannot|i can(?:'|’)?t|i can not|i won(?:'|’)?t|"
    r"unfortunately\b|as an ai\b|"
    r"抱歉|对不起|很遗憾|我无法|我不能|无法(?:总结|完成|提供)|申し訳|すみません|できません|"
    r"es tut mir leid|leider\b|ich kann (?:nicht|keine)|désolée?\b|je ne peux pas|je suis désolé|"
    r"lo siento|no puedo|lamentablemente|извините|к сожалению|я не могу)",
    re.I,
)
# Preambles: a first line that only announces the summary. It is dropped; if nothing is left, rejected.
_PREAMBLE = re.compile(
    r"^\W*(?:(?:sure|certainly|of course|okay|ok|absolutely|great|gladly)\b[^\n]{0,80}$|"
    r"(?:here(?:'|’)?s|here is|below is|the following is)\b[^\n]{0,80}(?:summary|recap|overview)[^\n]{0,40}$|"
    r"(?:好的|当然|没问题|以下是|下面是)[^\n]{0,40}$|(?:以下は)[^\n]{0,40}$|"
    r"(?:gerne|klar|hier ist)[^\n]{0,60}$|(?:bien sûr|voici)[^\n]{0,60}$|(?:claro|aquí (?:está|tienes))[^\n]{0,60}$)",
    re.I,
)
_FILLER = re.compile(r"lorem ipsum|dolor sit amet|consectetur adipiscing|\b(?:asdf|qwerty|placeholder text)\b", re.I)
_WORD = re.compile(r"[^\W\d_]{4,}", re.U)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")
_STOP = frozenset(re.findall(r"\w+",
    "that this with from have were what there their about would could should which your they them then than "
    "been into also more some only will just like when where here very much such each other these those does "
    "done make made over under after before because while being same summary conversation user assistant"))


def content_words(text: str) -> set[str]:
    """Lower-case words of four letters or more (minus a few stop words) and CJK character pairs."""
    words = {w.lower() for w in _WORD.findall(text) if not _CJK.search(w)} - _STOP
    cjk = "".join(_CJK.findall(text))
    return words | {cjk[i:i + 2] for i in range(len(cjk) - 1)}


def validate_summary(text: str | None, events: Sequence[Event], target: int) -> tuple[str | None, str]:
    """(prose, note) when usable — the note says what was cut, if anything — or (None, reason)."""
    body = _ANALYSIS.sub("", text or "").replace("<<mfs:summarize>>", "").replace("<<mfs:consolidate>>", "").strip()
    if not body:
        return None, "empty"
    if _REFUSAL.search(body[:200]):
        return None, "a refusal or an error, not a summary"
    lines = body.split("\n")
    if _PREAMBLE.match(lines[0].strip()):
        body = "\n".join(lines[1:]).strip()
    if len(body) < MIN_CHARS:
        return None, "a preamble with no summary after it" if len(lines) > 0 and body != lines[0] else "too short"
    if _FILLER.search(body):
        return None, "filler text (lorem ipsum or similar)"
    source = "\n".join(e.content for e in events)
    theirs = content_words(source)
    need = min(3, len(theirs))
    if need and len(content_words(body) & theirs) < need:
        return None, "it mentions none of the range's content"
    size, input_tokens = estimate_tokens(body), sum(estimate_tokens(e.content) + 4 for e in events)
    if size >= max(input_tokens, 1):
        return None, f"not shorter than its input ({size:,} ≥ {input_tokens:,} tokens)"
    cap = max(CAP_FACTOR * target, 64)
    if size > cap:
        keep = max(int(len(body) * cap / size), MIN_CHARS)
        cut = body[:keep].rsplit("\n", 1)[0] if "\n" in body[:keep] else body[:keep]
        note = f"summary cut at about {cap:,} tokens (it had {size:,})"
        return cut.rstrip() + f"\n[{note}]", note
    return body, ""
