"""The dates a query names, read as spans of time to search (`time_windows`), and a date range as the
uids it covers (`uid_bounds`). Pure."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from ..errors import InputError

# -- dates a query names ----------------------------------------------------------------------
# A conversation reports an event in the days after it happens ("last week I went to ..."), so the
# span searched for a named day or month runs on past it: a day, 8 days after it; a month or a
# year, 14 days after its end.
DAY_AFTER = timedelta(days=8)
PERIOD_AFTER = timedelta(days=14)
_MONTHS = {m: i + 1 for i, m in enumerate(["january", "february", "march", "april", "may", "june", "july",
                                             "august", "september", "october", "november", "december"])}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())} | {"sept": 9})
_MON = "|".join(sorted(_MONTHS, key=len, reverse=True))
_ORD = r"(\d{1,2})(st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"
_DATE = re.compile(
    # 8 May, 2023 / May 8th 2023 / May 2023 / August 11-15, 2023 (a day is not a version's "3.11")
    rf"(?<![\d.])\b(?:{_ORD}\s+(?:of\s+)?)?({_MON})\.?(?:\s+{_ORD}(?:\s*[-–]\s*(\d{{1,2}}))?\b)?"
    rf"(?:(?:,\s*|\s+){_YEAR})?\b"
    rf"|\b{_YEAR}-(\d{{2}})(?:-(\d{{2}}))?\b"  # 2023-05-08, 2023-05
    rf"|{_YEAR}\s*年\s*(?:(\d{{1,2}})\s*月\s*(?:(\d{{1,2}})\s*[日号])?)?"  # 2023年5月8日
    rf"|\b(?:in|during|since)\s+{_YEAR}\b(?![-/年])",  # in 2023
    re.IGNORECASE)
_YEARS = re.compile(rf"(?<![\d.]){_YEAR}(?![\d.])")
_RELATIVE = {"yesterday": (1, 1), "昨天": (1, 1), "today": (0, 0), "今天": (0, 0),
             "last week": (13, 7), "上周": (13, 7), "this week": (6, 0), "本周": (6, 0),
             "last month": (61, 28), "上个月": (61, 28), "this month": (30, 0)}
_AGO = re.compile(r"\b(\d{1,3}|a|one|two|three)\s+(day|week|month)s?\s+ago\b", re.IGNORECASE)
_SMALL = {"a": 1, "one": 1, "two": 2, "three": 3}


def _span(year: int, month: int | None, day: int | None, last_day: int | None = None
          ) -> tuple[datetime, datetime] | None:
    try:
        if day and month:
            start = datetime(year, month, day)
            end = datetime(year, month, last_day) if last_day and last_day > day else start
            return start - timedelta(days=1), end + DAY_AFTER
        if month:
            start = datetime(year, month, 1)
            return start, datetime(year + month // 12, month % 12 + 1, 1) + PERIOD_AFTER
        return datetime(year, 1, 1), datetime(year + 1, 1, 1) + PERIOD_AFTER
    except (ValueError, OverflowError):  # 31 February and the like
        return None


def _latest(month: int, day: int | None, last_day: int | None, present: datetime) -> tuple[datetime, datetime] | None:
    """The span of the latest occurrence of a day (or a month) without a year, up to `present`
    (29 February looks back to the last leap year)."""
    year = present.year if (month, day or 1) <= (present.month, present.day) else present.year - 1
    for y in range(year, year - 8, -1):
        span = _span(y, month, day, last_day)
        if span:
            return span
    return None


def time_windows(query: str, now: datetime, present: datetime | None = None) -> list[tuple[datetime, datetime]]:
    """The spans of time a query names, as naive datetimes [start, end) in the time of `now` (the
    caller's wall clock; the indexer passes local time and shifts the spans to UTC), oldest first.

    Recognised: a day, a range of days or a month with its year in words or ISO form (years
    1900-2099), a capitalised day and month without a year ("on Aug 15th": the year the query names
    elsewhere, else its latest occurrence up to `present`, the conversation's newest moment,
    default `now`), a Chinese 年/月/日 date, "in 2023", and a few relative phrases (yesterday, last
    week, three days ago, 昨天, 上周) counted back from `now`. "May" alone is the verb unless a day or
    a year comes with it; a bare month without a year is not read."""
    out: list[tuple[datetime, datetime]] = []
    named = {int(y) for y in _YEARS.findall(query)}
    only_year = next(iter(named)) if len(named) == 1 else None  # "Aug 11 and Aug 15, 2023": both 2023
    for m in _DATE.finditer(query):
        d1, o1, mon, d2, o2, d2_end, year, iy, im, idd, cy, cm, cd, y_only = m.groups()
        span = None
        if mon:
            month, day = _MONTHS[mon.lower()], int(d1 or d2 or 0) or None
            last = int(d2_end) if d2_end and not d1 else None
            if year or (day and only_year):
                span = _span(int(year or only_year), month, day, last)
            elif day and (mon[0].isupper() or o1 or o2):  # "3 may be" is a number and a verb
                span = _latest(month, day, last, present or now)
        elif iy:
            span = _span(int(iy), int(im), int(idd) if idd else None) if 1 <= int(im) <= 12 else None
        elif cy:
            span = _span(int(cy), int(cm) if cm else None, int(cd) if cd else None)
        elif y_only:
            span = _span(int(y_only), None, None)
        if span:
            out.append(span)
    low = query.lower()
    today = datetime(now.year, now.month, now.day)
    for phrase, (back, upto) in _RELATIVE.items():
        if phrase in low:
            out.append((today - timedelta(days=back), today - timedelta(days=upto) + timedelta(days=1)))
    for m in _AGO.finditer(query):
        word = m.group(1).lower()
        n = int(word) if word.isdigit() else _SMALL[word]
        days = n * {"day": 1, "week": 7, "month": 30}[m.group(2).lower()]
        out.append((today - timedelta(days=days + max(1, days // 4)), today - timedelta(days=days) + DAY_AFTER))
    return sorted(set(out))


def uid_bounds(log: Callable[[], Sequence[Any]], uid_from: int | None, uid_to: int | None, date_from: Any = None,
               date_to: Any = None) -> tuple[int | None, int | None]:
    """The uid range a search keeps: `uid_from`..`uid_to`, narrowed to the events (`log()`, read only when
    a date is given: in log order, each with `uid` and an ISO `created_at`) written between the dates (ISO
    dates or times; a date alone covers its whole day). (1, 0) when no event is left; bad dates raise
    InputError with one line."""
    lo, hi = uid_from, uid_to
    if lo is not None and hi is not None and hi < lo:
        raise InputError(f"uid range {lo}-{hi} is reversed; did you mean {hi}-{lo}?")
    if date_from is None and date_to is None:
        return lo, hi
    for value, what in ((date_from, "date_from"), (date_to, "date_to")):
        if value is not None and (not isinstance(value, str) or not value[:10].replace("-", "").isdigit()):
            raise InputError(f"{what} must be an ISO date like 2026-03-01, not {value!r}")
    events = log()
    times = [e.created_at for e in events]  # written in order, so sorted
    first = bisect_left(times, date_from) if date_from else 0
    last = bisect_right(times, date_to + ("\uffff" if len(date_to) <= 10 else "")) - 1 if date_to else len(events) - 1
    if first > last or not events:
        return 1, 0
    a, b = events[first].uid, events[last].uid
    return (max(a, lo) if lo is not None else a), (min(b, hi) if hi is not None else b)
