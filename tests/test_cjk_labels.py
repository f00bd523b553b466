"""A Chinese conversation reads in Chinese inside its segments and tracks (issue 39 item 9): every
label in a segment's header, its fact list, the fact track, the user-verbatim track, the eviction
note and the offline summarizer's guide is Chinese (and the benchmark strips each of them), and
topic words are real words — CJK character bigrams are never shown as topics."""

from __future__ import annotations

import re

from mfs_nb import lang
from mfs_nb.commands.replay import normalise, replay
from mfs_nb.events import Event
from mfs_nb.layers.fact_track import fact_track
from mfs_nb.layers.segments import Segment, build, instruction, topic_keywords
from mfs_nb.layers.workset import budget, lines_of
from mfs_nb.models.offline import extractive_merge, offline_reply

ENGLISH_LABELS = ("said (user and assistant):", "errors seen:", "commands run:", "other tool calls:",
                  "files touched:", "left for the budget", "older fact lines", "Facts (verbatim):", "topics:",
                  "degraded", "- user:", "- assistant:", "- tool:", "nothing to summarize", "nothing to merge")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")

GARDEN = ["番茄", "黄瓜", "辣椒", "茄子", "生菜", "豆角", "南瓜"]


def _user(i: int) -> str:
    plant = GARDEN[i % len(GARDEN)]
    return (f"第{i}周：阳台菜园里的{plant}已经长到{10 + i}厘米了，我每天早上七点浇水{200 + i}毫升。"
            f"记录放在 garden/week_{i}.md 里。请不要建议我用化肥，我只用自己做的堆肥。"
            f"你觉得{plant}下一步该怎么照顾？")


def _assistant(i: int) -> str:
    plant = GARDEN[i % len(GARDEN)]
    return (f"好的，{plant}长到{10 + i}厘米说明根系已经稳定。可以把浇水改到傍晚，避免中午暴晒时叶片烫伤；"
            f"堆肥每两周追加一次，每株大约一小把就够了。另外注意观察叶片背面有没有蚜虫，"
            f"发现的话用稀释的肥皂水喷洒，连续三天。搭一个简单的支架，让藤蔓顺着往上爬，通风会更好。") * 2


def _conversation(turns: int) -> list[dict]:
    out: list[dict] = []
    for i in range(turns):
        out += [{"role": "user", "content": _user(i)}, {"role": "assistant", "content": _assistant(i)}]
    return out


def _events(turns: int) -> list[Event]:
    out, uid = [], 0
    for i in range(turns):
        for role, text in (("user", _user(i)), ("assistant", _assistant(i))):
            uid += 1
            out.append(Event(uid, "s", i + 1, role, text, turn_start=role == "user"))
    return out


def _no_english_labels(text: str) -> None:
    for label in ENGLISH_LABELS:
        assert label not in text, label


def test_a_chinese_replay_at_8k_has_chinese_labels_and_no_bigram_topics(tmp_path):
    result = replay(normalise(_conversation(70)), window=8000, store=str(tmp_path / "store"))
    segments = [Segment.from_json(x) for x in result["segments"]]
    assert segments and all(x.language == lang.CHINESE for x in segments)
    for x in segments:
        assert not _CJK.search(x.keywords), x.keywords  # character bigrams are fragments, not topics
        _no_english_labels(x.render())
    payload = "\n".join(m["content"] for m in result["final_view"]["messages"] if m["role"] != "system")
    assert lang.text("facts_label", lang.CHINESE) in payload and "[截至 #" in payload  # a segment, a track
    _no_english_labels(payload)


def test_topics_of_a_chinese_range_are_never_bigrams_and_english_topics_stay():
    assert topic_keywords(_events(10)) == ""  # not bigrams, and not its paths' words (garden, week_3) either
    english = [Event(1, "s", 1, "user", "The billing pool (连接池) keeps timing out; billing calls retry and retry.",
                     turn_start=True), Event(2, "s", 1, "assistant", "The 连接池 billing retries are capped.")]
    topics = topic_keywords(english).split(", ")
    assert topics[0] == "billing" and not any(_CJK.search(t) for t in topics)
    stored = Segment(3, 1, 20, "- 训练计划", "", keywords="宝可, 可梦, 你的, 的宝, 训练", language=lang.CHINESE)
    assert stored.render().splitlines()[0] == "[segment #3 · uids 1–20]"  # stored before: its bigrams stay hidden


def test_fact_lists_and_the_fact_track_speak_chinese():
    events = _events(12)
    seg = build(1, events, None)  # the degraded guide: its speakers too
    assert seg.language == lang.CHINESE
    _no_english_labels(seg.render())
    assert lang.text("segment_degraded", lang.CHINESE) in seg.render().splitlines()[0]
    assert "用户：" in seg.facts and "说过的话" in seg.facts
    small = budget(lines_of(events), 300, language=lang.CHINESE)
    assert small.dropped and "[uid 1–" in small.render()
    _no_english_labels(small.render())
    track = fact_track(events, 24, 24, set(), 400)
    assert track is not None and track.text.startswith("[截至 #24")
    _no_english_labels(track.text)
    # a line a Chinese segment shows (with its Chinese speaker) is not repeated in the track
    shown = build(1, events[:6], "- 已经讨论了浇水和堆肥的安排，用户坚持只用自制堆肥。")
    again = fact_track(events[:6], 6, 6, set(), 10_000, shown_text=shown.render())
    assert again is None or not any(f"[#{u}]" in again.text for u in range(1, 7))


def test_an_english_fact_list_is_unchanged():
    events = [Event(1, "s", 1, "user", "Never touch deploy/pool.yaml; keep 64 workers.", turn_start=True)]
    text = budget(lines_of(events), 1_000).render()
    assert text.startswith("said (user and assistant):\n- user: ")


def test_the_offline_summarizer_labels_follow_the_requested_language():
    messages = _conversation(4)
    prose = offline_reply(messages + [{"role": "user", "content": instruction("bullets", 1, 8, 3000, "", "Chinese")}])
    assert prose.startswith("- 用户：") and "- 助手：" in prose
    _no_english_labels(prose)
    empty = offline_reply([{"role": "user", "content": instruction("bullets", 1, 1, 300, "", "Chinese")}])
    _no_english_labels(empty)
    assert extractive_merge([{"role": "user", "content": "[guide to uids 1–4]\n- 助手：甲\n- 用户：乙"}], 6) == "- 用户：乙"
    english = offline_reply(messages[:2] + [{"role": "user", "content": instruction("bullets", 1, 2, 300)}])
    assert english.startswith("- user: ")


def test_the_sink_guide_names_its_dropped_lines_in_chinese():
    from mfs_nb.compaction.terminal import bounded

    prose = "\n".join(f"- 用户：第{i}周的番茄长到{10 + i}厘米" for i in range(40))
    first = bounded(prose, 60, lang.CHINESE).splitlines()[0]
    assert first == lang.text("guide_dropped", lang.CHINESE, n=int(re.sub(r"\D", "", first)))


# -- the user-verbatim track, the eviction note, the benchmark's stripping --------------------
TRACK_ENGLISH = ("[quoted AI", "the user pasted", "[document]", "chars", "first line", "the user's note",
                 "older user messages", "left this track", "returns the text", "returns it", "from reply",
                 "from an AI reply")
DOC = "# 部署日志\n" + "".join(f"第{i}步：worker {i} 在 45 秒后重启，原因是连接池耗尽。\n" for i in range(30))


def _chinese_session(store_dir: str, **kw):
    from conftest import FakeLLM

    from mfs_nb import Session

    s = Session("zh", store=store_dir, window_tokens=24000, llm=FakeLLM(), **kw)
    for i in range(3):
        s.record("user", _user(i), new_turn=True)
        s.record("assistant", _assistant(i))
    quoted = s.record_user(_assistant(2)[:150], quote=True).uid
    s.record("assistant", "好的。")
    noted = s.record_user(_assistant(2)[:150] + "\n---\n我不同意，傍晚浇水会招蚊子。", quote=True).uid
    s.record("assistant", "明白。")
    doc = s.record_user("第三节哪里出错了？", attached=[("部署日志.md", DOC)]).uid
    s.record("assistant", "第三节的重启是连接池耗尽导致的。")
    for i in range(3, 30):
        s.record("user", f"第{i}周：番茄长到{10 + i}厘米了，接下来怎么办？", new_turn=True)
        s.record("assistant", _assistant(i))
    return s, quoted, noted, doc


def _track(s) -> str:
    view = s.send_view()
    kinds = [x.kind for x in view.layers]
    assert "verbatim" in kinds
    return view.messages[kinds.index("verbatim")]["content"]


def test_a_chinese_verbatim_track_labels_its_quotes_and_documents_in_chinese(store_dir):
    from mfs_nb.layers import origin

    s, quoted, noted, doc = _chinese_session(store_dir)
    s.compact()
    assert s.compactor.covered_to > doc
    text = _track(s)
    assert text.startswith("[截至 #")
    assert f"[#{quoted}] [引用的 AI 输出] 用户粘贴了 150 个字符，来自回复 #{quoted - 1}（首行：" in text
    assert f"）；recall_history({quoted}) 可取回原文" in text
    assert f"[#{noted}] [引用的 AI 输出（来自回复 #{quoted - 1}）+ 用户的附言]\n" in text
    path = s.verbatim.verdicts[doc].snapshots[0]["path"]
    assert f"[文档] {path}（{len(DOC):,} 个字符，首行：# 部署日志）" in text
    for label in TRACK_ENGLISH:
        assert label not in text, label
    # the same verdicts render in English for an English track, and the length rule's document too
    v = s.verbatim.verdicts[quoted]
    assert origin.render_entry(quoted, v).startswith(f"[#{quoted}] [quoted AI] the user pasted 150 chars")
    long = origin.Verdict(origin.DOCUMENT, "length", "", None, 0.0, 12345, "第一行")
    assert origin.render_entry(9, long, lang.CHINESE) == "[#9] [文档] 12,345 个字符，首行：第一行；recall_history(9) 可取回"
    assert origin.render_entry(9, long) == "[#9] [document] 12,345 chars, first line: 第一行; recall_history(9) returns it"


def test_a_chinese_track_names_the_messages_it_left_out_in_chinese(store_dir):
    s, *_ = _chinese_session(store_dir, verbatim_share=0.02)
    s.compact()
    built = s.track()
    assert built is not None and built.dropped is not None
    text = _track(s)
    assert lang.text("verbatim_dropped", lang.CHINESE, lo=built.dropped[0], hi=built.dropped[1]) in text
    for label in TRACK_ENGLISH:
        assert label not in text, label


def test_the_eviction_note_in_the_send_view_is_in_the_conversations_language():
    from mfs_nb.layers.view import project

    events = _events(10)
    view = project(events, "system", evicted=[(1, 4)])
    assert view.messages[1]["content"] == lang.text("evicted", lang.CHINESE, spans="1–4")
    seg = Segment(2, 5, 8, "- 浇水", "", language=lang.CHINESE)
    view = project(events, "system", segments=[seg], evicted=[(1, 4)])
    assert view.messages[1]["content"].startswith("[更早的历史（uid 1–4）已压缩")
    assert view.forms[1] != project(events, "system", evicted=[(1, 4)], segments=[
        Segment(2, 5, 8, "- 浇水", "")]).forms[1]  # the cached token count is keyed by the note's bytes
    english = [Event(1, "s", 1, "user", "keep 64 workers", turn_start=True), Event(2, "s", 1, "assistant", "ok")]
    assert project(english, "system", evicted=[(1, 2)]).messages[1]["content"].startswith("[earlier history, uids 1–2,")


def test_the_benchmark_strips_the_chinese_labels_and_keeps_the_words():
    from mfs_nb.bench import atom_text

    said = "阳台的番茄长到 12 厘米"
    labels = [
        lang.text("evicted", lang.CHINESE, spans="1–40, 52–60"),
        lang.text("verbatim_caption", lang.CHINESE, upto=412),
        lang.text("fact_caption", lang.CHINESE, upto=412),
        lang.text("facts_label", lang.CHINESE),
        *(lang.text(f"facts_{g}", lang.CHINESE) for g in ("errors", "commands", "calls", "files", "said")),
        lang.text("facts_dropped", lang.CHINESE, lo=3, hi=140, what=lang.text("count_said", lang.CHINESE, n=7)),
        lang.text("guide_dropped", lang.CHINESE, n=12),
        lang.text("nothing_to_summarize", lang.CHINESE),
        lang.text("nothing_to_merge", lang.CHINESE),
        lang.text("verbatim_dropped", lang.CHINESE, lo=1, hi=233),
    ]
    for label in labels:
        assert not atom_text.strip_markup(label).strip(), label
    for role in lang.SPEAKERS:
        assert atom_text.strip_markup(f"- {lang.speaker(role, lang.CHINESE)}{said} [#17]").split() == said.split()
        assert atom_text.strip_markup(f"- #17 {lang.speaker(role, lang.CHINESE)}{said}").split() == said.split()
    quoted = lang.text("quoted", lang.CHINESE, chars=3428, first_line=said, uid=41,
                       origin=lang.text("quoted_from_reply", lang.CHINESE, reply=40))
    assert atom_text.strip_markup(f"[#41] {quoted}").split() == [said.split()[0], "12", "厘米）；"]
    from_ai = lang.text("quoted", lang.CHINESE, chars=3428, first_line=said, uid=41,
                        origin=lang.text("quoted_from_ai", lang.CHINESE))
    assert "3,428" not in atom_text.strip_markup(from_ai) and "来自" not in atom_text.strip_markup(from_ai)
    for note in (lang.text("quoted_note", lang.CHINESE), lang.text("quoted_note_from", lang.CHINESE, reply=40)):
        assert atom_text.strip_markup(f"[#41] {note}\n{said}").split() == said.split()
    doc = lang.text("document_snapshot", lang.CHINESE, path="attachments/ab12-部署.md", chars=9120, first_line=said)
    assert "9,120" not in atom_text.strip_markup(doc) and "文档" not in atom_text.strip_markup(doc)
    assert "attachments/ab12-部署.md" in atom_text.strip_markup(doc) and said in atom_text.strip_markup(doc)
    pointer = lang.text("document", lang.CHINESE, chars=9120, first_line=said, uid=41)
    stripped = atom_text.strip_markup(pointer)
    assert "9,120" not in stripped and "可取回" not in stripped and "recall_history" not in stripped and said in stripped
    # what a person wrote with the same words stays
    person = "用户：我们的助手工具在文档首行写了 3,428 个字符"
    assert atom_text.strip_markup(person) == person
