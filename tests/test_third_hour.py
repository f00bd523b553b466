"""A newcomer's third hour, scripted (issue 71): the usual mistakes in a notebook run headless through
nbclient and ipykernel against a fake OpenAI-compatible endpoint on 127.0.0.1 — a model typo, a
mistyped flag, a call that fails and is asked again, no key after a restart — and the outputs a
newcomer reads: each says what is wrong and what to do, in words, and the README's lines are the ones
printed."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fake_provider import FakeProvider
from test_readme import _shape
from test_second_hour import _run, _text

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What pool_size did we settle on for the API service?"


def test_a_newcomers_third_hour(tmp_path, monkeypatch):
    provider = FakeProvider(reply="We settled on 24 connections per replica.")
    monkeypatch.setenv("MFS_STORE", str(tmp_path / ".mfs"))
    monkeypatch.delenv("MFS_API_KEY", raising=False)  # the key did not survive the restart
    monkeypatch.delenv("MFS_MODEL", raising=False)
    monkeypatch.setenv("MFS_EMBEDDING_MODEL", "off")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cells = [
        "%load_ext mfs_nb",
        "%mfs config model=opnai/gpt-4o-mini",                                               # 1: a typo
        f"%mfs config model=openai/fake-model api_base={provider.url} window_tokens=8k",
        "%%chat --sesion side\nhello",                                                      # 3: a mistyped flag
        "%mfs status",                                                                      # 4: no key
        "%%chat\nOur API service runs 4 replicas against a DB that allows 120 connections.",
        "%mfs config api_base=http://127.0.0.1:9/v1",  # nothing listens there: the next call fails
        f"%%chat\n{QUESTION}",
        f"%mfs config api_base={provider.url}",
        f"%%chat\n{QUESTION}",                                                              # 2: asked again
        "%recall 3-5",
        '%recall "pool_size"',                                                              # 5: plain words
        "%mfs config",
        "%context",
    ]
    try:
        ran = _run(cells, tmp_path)
    finally:
        provider.close()
    out = [_text(o) for _, o in ran]
    for source, outputs in ran:
        assert not any(o.get("output_type") == "error" for o in outputs), source
        assert "Traceback" not in _text(outputs), source
    # 1 and 3: caught where they are made, with the near miss named
    assert out[1].startswith("mfs: ") and "did you mean openai/gpt-4o-mini?" in out[1], out[1]
    assert "did you mean --session?" in out[3] and "unrecognized arguments" not in out[3], out[3]
    # 4: whether a key will be sent, and from where
    assert "key: none (fine for a local server)" in out[4] and "MFS_API_KEY" in out[4], out[4]
    # 2: the failed call is one line; the question asked again is sent once; the log keeps both, marked
    assert out[7].count("mfs: ") == 1 and "We settled on" not in out[7], out[7]
    assert "We settled on 24" in out[9]
    chats = [h for h in provider.hits if not str(h["body"]["messages"][-1].get("content", "")).startswith("<<mfs:")]
    sent = [m.get("content") or "" for m in chats[-1]["body"]["messages"]]
    assert sum(QUESTION in c for c in sent) == 1, sent
    assert "failed, asked again as #" in out[10] and out[10].count(QUESTION) == 2, out[10]
    # 5: one note at most above the hits; a source for every value; rows that line up
    assert sum(line.startswith("note:") for line in out[11].splitlines()) <= 1, out[11]
    config = [x for x in out[12].splitlines() if " = " in x]
    assert len(config) > 20 and all(x.rstrip().endswith(")") and "  (" in x for x in config), config
    rows = [x for x in out[13].splitlines() if x.endswith(" tokens")]
    assert len(rows) >= 3 and len({len(x) for x in rows}) == 1, rows
    assert "anchor+estimate" not in out[13] and "adjustment" not in out[13]
    # 6: the status line under a reply has the shape the README shows, and the note the README quotes is sent
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    shown = re.findall(r"`(ctx \d[^`]*)`", readme)
    printed = re.findall(r"ctx \d+%[^\n]*", out[9])
    assert printed and _shape(printed[-1]).replace("cache", "prefix") in {_shape(x) for x in shown}, (printed, shown)
    last = sent[-1]
    assert re.search(r"\[context \d+% of the usable window · compaction at \d+%\]$", last), last
    assert "[context " in readme and "of the usable window · compaction at" in readme
