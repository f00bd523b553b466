"""Suite `qa` (opt-in): LoCoMo questions answered by a real model from each strategy's payload,
graded by an LLM judge and by token F1.

Each LoCoMo conversation is replayed once per strategy at the same window; the final payload of
each (the same budget for all) is what model M sees, followed by one question. mfs_nb's model also
gets its recall tool and the tool loop runs (at most `MAX_ROUNDS` rounds), reading the replayed
store; the baselines have no tools, as in the products they stand for. A judge model grades each
answer CORRECT or WRONG against the gold answer (the judge prompt is ours, after the one LoCoMo
memory papers use); token F1 is computed without any model. Categories 1–4 (multi-hop, temporal,
open-domain, single-hop); category 5 (adversarial, no answer) is left out.

It calls a model for every question, so it never runs by default and never in CI:
`mfs-nb bench qa --model M [--judge J] [--window W] [--api-base URL] [--questions N]`.
"""

from __future__ import annotations

import re
import statistics
import string
import tempfile
from collections import Counter as Bag
from collections.abc import Callable
from typing import Any

from ..commands.replay import normalise, replay
from ..errors import MfsError
from ..window.tokens import message_tokens
from . import baselines
from .dataset import Data, to_openai

NAME = "qa"
NEEDS = ("locomo",)
OPT_IN = True  # needs a model: only when named
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
MAX_ROUNDS = 4
DEFAULT_WINDOW = 8_000

ASK = ("Using only the conversation above (and, where you have it, the recall tool to read its exact earlier "
       "messages), answer the question below in a short phrase. If the conversation does not say, answer "
       "\"not mentioned\".\n\nQuestion: {question}")
JUDGE = ("You grade answers to questions about a long conversation between two people.\n\n"
         "Question: {question}\nGold answer: {gold}\nAnswer to grade: {answer}\n\n"
         "The answer is CORRECT when it states the same fact as the gold answer: other wording, a different "
         "but equivalent date format, or extra detail that does not contradict the gold answer are all fine. "
         "It is WRONG when it states a different fact, misses the point of the gold answer, or says the "
         "conversation does not tell. Reply with exactly one word: CORRECT or WRONG.")


def _normal_tokens(text: str) -> list[str]:
    text = text.lower()
    text = "".join(" " if c in string.punctuation else c for c in text)
    return [w for w in text.split() if w not in ("a", "an", "the", "and")]


def token_f1(answer: str, gold: str) -> float:
    """Token-level F1 between an answer and the gold answer (lowercased, punctuation and articles
    removed), as in SQuAD-style QA scoring."""
    a, g = _normal_tokens(answer), _normal_tokens(gold)
    common = sum((Bag(a) & Bag(g)).values())
    if not a or not g or not common:
        return 0.0
    precision, recall = common / len(a), common / len(g)
    return 2 * precision * recall / (precision + recall)


def parse_verdict(text: str) -> bool | None:
    """True for CORRECT, False for WRONG, None when the judge said neither."""
    words = re.findall(r"[A-Za-z]+", text.upper())
    if "CORRECT" in words and "WRONG" not in words:
        return True
    if "WRONG" in words and "CORRECT" not in words:
        return False
    return None


class Model:
    """A model behind mfs_nb's own LLM boundary (litellm, keys from the environment)."""

    def __init__(self, model: str, api_base: str = ""):
        from ..models.llm import LLM, default_endpoints

        self.name = model
        self.llm = LLM(default_endpoints(model, api_base, "", "")[0])

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Any:
        return self.llm.complete(messages, tools=tools, stream=False)


def answer(ask: Callable[..., Any], payload: list[dict[str, Any]], question: str,
           tools: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ask one question after `payload`; with `tools`, run the tool loop. Returns the answer, the
    prompt tokens of every call (provider usage when reported, else the estimate) and tool calls."""
    from ..recall.tools import call_tool

    messages = [*payload, {"role": "user", "content": ASK.format(question=question)}]
    schemas = [t.schema() for t in tools.values()] if tools else None
    prompt_tokens = calls = 0
    for _ in range(MAX_ROUNDS + 1):
        done = ask(messages, schemas)
        usage = done.usage or {}
        prompt_tokens += int(usage.get("prompt_tokens") or sum(message_tokens(m) for m in messages))
        if not (tools and done.tool_calls):
            return {"answer": done.text.strip(), "prompt_tokens": prompt_tokens, "tool_calls": calls}
        messages.append({"role": "assistant", "content": done.text or "", "tool_calls": done.tool_calls})
        for call in done.tool_calls:
            fn = call.get("function") or {}
            calls += 1
            result = call_tool(tools, fn.get("name", ""), fn.get("arguments", ""))
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
    return {"answer": "(no answer within the tool-round limit)", "prompt_tokens": prompt_tokens, "tool_calls": calls}


def judge(ask: Callable[..., Any], question: str, gold: str, given: str) -> bool | None:
    done = ask([{"role": "user", "content": JUDGE.format(question=question, gold=gold, answer=given)}], None)
    return parse_verdict(done.text)


def payloads(messages: list[dict[str, Any]], window: int, store: str) -> dict[str, list[dict[str, Any]]]:
    """The final payload of every strategy at `window`; mfs_nb's replay is kept in `store`."""
    out = {name: baselines.simulate(name, messages, window).final for name in baselines.STRATEGIES}
    finals: list[list[dict[str, Any]]] = []
    replay(normalise(messages), window=window, store=store, on_call=lambda s, plan: finals.append(plan.view.messages))
    out["mfs_nb"] = finals[-1] if finals else []
    return out


def run(data: Data, quick: bool, model: str | None = None, judge_model: str | None = None,
        window: int | None = None, api_base: str = "", questions: int | None = None,
        ask: Callable[..., Any] | None = None, grade: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Answer and grade. `ask`/`grade` replace the models (tests); otherwise `model` is required."""
    from ..session import Session

    if ask is None:
        if not model:
            raise MfsError("bench qa needs a model: mfs-nb bench qa --model M [--judge J] [--api-base URL]")
        ask = Model(model, api_base)
    if grade is None:
        grade = Model(judge_model, api_base) if judge_model else ask
    window = window or DEFAULT_WINDOW
    convs = data.get("locomo")[:1] if quick else data.get("locomo")
    limit = questions or (20 if quick else None)
    results: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for conv in convs:
        messages = to_openai(conv["messages"])
        with tempfile.TemporaryDirectory(prefix="mfs-qa-") as store:
            views = payloads(messages, window, store)
            session = Session("replay", store=store, window_tokens=window, background_compaction=False)
            recall = {"recall_history": session.tools["recall_history"]}
            asked = [q for q in conv["questions"] if q.get("category") in CATEGORIES and q.get("answer") is not None]
            for q in asked[:limit]:
                gold = str(q["answer"])
                for strategy, payload in views.items():
                    got = answer(ask, payload, q["question"], recall if strategy == "mfs_nb" else None)
                    verdict = judge(grade, q["question"], gold, got["answer"])
                    results.setdefault(strategy, {}).setdefault(q["category"], []).append(
                        {**got, "correct": verdict, "f1": token_f1(got["answer"], gold),
                         "payload_tokens": sum(message_tokens(m) for m in payload)})
            session.close()
    rows = []
    for strategy, by_cat in results.items():
        groups: list[tuple[str, list[dict[str, Any]]]] = [(f"{c} {CATEGORIES[c]}", by_cat[c]) for c in sorted(by_cat)]
        groups.append(("all", [x for c in by_cat.values() for x in c]))
        for label, items in groups:
            graded = [x["correct"] for x in items if x["correct"] is not None]
            rows.append([strategy, label, len(items),
                         f"{sum(graded) / len(graded):.1%}" if graded else "—",
                         f"{statistics.fmean(x['f1'] for x in items):.3f}",
                         f"{statistics.fmean(x['payload_tokens'] for x in items):,.0f}",
                         f"{statistics.fmean(x['prompt_tokens'] for x in items):,.0f}",
                         f"{statistics.fmean(x['tool_calls'] for x in items):.2f}",
                         len(items) - len(graded)])
    name = getattr(ask, "name", "scripted")
    return {
        "title": f"LoCoMo QA judged by a model (answers by {name}, window {window:,})",
        "tables": [{"caption": "Per strategy and category: judge accuracy, token F1, tokens and tool calls per "
                               "question. Counts questions of categories 1–4; does not count category 5",
                    "columns": ["strategy", "category", "questions", "judge: correct", "token F1",
                                "payload tokens", "prompt tokens / question (all calls)", "tool calls / question",
                                "ungraded (judge said neither)"],
                    "rows": rows}],
        "notes": [
            "Every strategy's final payload comes from the same replay at the same window; mfs_nb alone is offered "
            "recall_history and its tool loop runs against the replayed store (at most 4 rounds).",
            "The judge prompt asks for CORRECT or WRONG against the gold answer, accepting other wording and "
            "equivalent dates; token F1 lowercases and drops punctuation and articles.",
        ],
        "metrics": results,
    }
