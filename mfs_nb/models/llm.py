"""The LLM boundary: the only module that imports litellm (docs/architecture.md, "Model boundaries
and the offline default"; endpoint fallback: "Failure handling").

litellm is imported lazily (it takes seconds) with its model-cost map read locally, so nothing
reaches for the network on import. Keys come from the environment only; they are passed to
litellm and nowhere else, and are scrubbed from every error message.

Keys go only to the endpoint they belong to: a custom `api_base` gets `MFS_API_KEY` (the fallback
`MFS_FALLBACK_API_KEY`) or no key at all — never a provider's key from the environment — and the
key is read from the environment at call time, so exporting it later takes effect at once.

`LLM` holds a primary and an optional fallback endpoint. Connection errors, timeouts, 5xx and
429 — streaming or not — move the call to the other endpoint; the state machine is guarded by a
lock so concurrent calls see one consistent state.
"""

from __future__ import annotations

import difflib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import LLMError
from ..settings import OFFLINE_MODEL
from . import prompt_cache
from .failures import NO_KEY, Switch, classify
from .prompt_cache import CacheHints

_litellm: Any = None
_import_lock = threading.Lock()


def litellm_module() -> Any:
    """Import litellm once, offline-safe, with the embedded offline provider registered."""
    global _litellm
    with _import_lock:
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            from ..window.tokens import ensure_tiktoken_cache

            ensure_tiktoken_cache()
            import litellm

            from .offline import provider_class

            litellm.suppress_debug_info = True
            litellm.telemetry = False
            providers = [p for p in (litellm.custom_provider_map or []) if p.get("provider") != "mfs-offline"]
            providers.append({"provider": "mfs-offline", "custom_handler": provider_class()()})
            litellm.custom_provider_map = providers
            _register_custom_providers(litellm)
            _litellm = litellm
    return _litellm


def _register_custom_providers(litellm: Any) -> None:
    try:
        from litellm.utils import custom_llm_setup

        custom_llm_setup()
    except ImportError:  # older litellm registers the map on first call
        pass


def is_offline(model: str) -> bool:
    return model.startswith("mfs-offline/")


# Sent as the key to a custom endpoint that has none configured, so litellm never falls back to a
# provider key from the environment (an OpenAI-compatible client needs some value).


@dataclass(frozen=True)
class Endpoint:
    """A model and where to reach it. The key is held in memory only and never printed; with
    `key_env` it is read from that environment variable at each call instead."""

    model: str
    api_base: str = ""
    api_key: str = field(default="", repr=False)
    label: str = "primary"
    key_env: str = ""

    def key(self) -> str:
        """The key this endpoint gets now ('' lets litellm use the provider's own key: only
        for a provider's endpoint, never for a custom api_base)."""
        key = os.environ.get(self.key_env, "") if self.key_env else self.api_key
        if self.api_base:
            return key or NO_KEY
        return key

    def key_hint(self) -> str:
        """Which variable to set for this endpoint's key."""
        if self.key_env:
            return self.key_env
        if self.api_base:
            return "MFS_API_KEY"
        return "the provider's key (e.g. OPENAI_API_KEY)"

    def describe(self) -> str:
        return f"{self.label}: {self.model}" + (f" @ {self.api_base}" if self.api_base else "")


@dataclass
class Completion:
    """One model answer: text, tool calls (OpenAI format), provider usage and who answered."""

    text: str
    tool_calls: list[dict[str, Any]]
    usage: dict[str, int] | None
    endpoint: str
    model: str
    duration_s: float = 0.0


class LLM:
    """Completions through litellm with primary → fallback switching."""

    def __init__(self, primary: Endpoint, fallback: Endpoint | None = None, *, timeout_s: float = 120.0,
                 retry_primary_after_s: float = 300.0, use: str = "chat",
                 on_switch: Callable[[str, dict[str, Any]], Any] | None = None):
        self.primary = primary
        self.fallback = fallback
        self.timeout_s = timeout_s
        self.retry_primary_after_s = retry_primary_after_s
        self.use = use  # chat | summarizer: each use keeps its own health
        self.on_switch = on_switch  # a ledger row for every switch and every return to the primary
        self._lock = threading.Lock()
        self._on_fallback_since: float | None = None
        self._serving = "primary"
        self.last_switch_reason = ""
        self.switches = 0
        self.no_cache: set[str] = set()  # endpoints that refused the prompt-cache hints
        self.notes: list[str] = []

    # -- state ---------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """'primary' or 'fallback': which endpoint the next call tries first."""
        with self._lock:
            return self._state_locked()

    def _state_locked(self) -> str:
        if self._on_fallback_since is None:
            return "primary"
        if time.monotonic() - self._on_fallback_since >= self.retry_primary_after_s:
            self._on_fallback_since = None
            return "primary"
        return "fallback"

    def _order(self) -> list[Endpoint]:
        with self._lock:
            first = self._state_locked()
        if self.fallback is None:
            return [self.primary]
        return [self.fallback, self.primary] if first == "fallback" else [self.primary, self.fallback]

    def _mark(self, endpoint: Endpoint, failed_reason: str | None = None) -> None:
        with self._lock:
            if endpoint is self.fallback:
                if self._on_fallback_since is None:
                    self.switches += 1
                    self._on_fallback_since = time.monotonic()
            elif endpoint is self.primary and self._on_fallback_since is not None:
                self._on_fallback_since = None
                self.switches += 1
            if failed_reason:
                self.last_switch_reason = failed_reason

    def _report(self, endpoint: Endpoint, reason: str) -> None:
        """A ledger row when the endpoint that answers changes (a switch, or a return to the primary)."""
        with self._lock:
            previous, self._serving = self._serving, endpoint.label
        if previous == endpoint.label or self.on_switch is None:
            return
        kind = "endpoint_return" if endpoint.label == "primary" else "endpoint_switch"
        try:
            self.on_switch(kind, {"use": self.use, "from": previous, "to": endpoint.label, "model": endpoint.model,
                                  "reason": reason})
        except Exception:  # the ledger is a record; a failed write never fails the call
            pass

    def in_force(self) -> Endpoint:
        """The endpoint the next call tries first."""
        return self.fallback if self.fallback is not None and self.state == "fallback" else self.primary

    def describe(self) -> str:
        """One line for `%mfs status`."""
        now = self.in_force()
        text = f"answering: {now.model}" + (f" at {now.api_base}" if now.api_base else "")
        if self.fallback is not None:
            text += (f" (the fallback, until the primary {self.primary.model} answers again)" if now is self.fallback
                     else f" (fallback {self.fallback.model} if it fails)")
        if self.last_switch_reason:
            text += f"; last switch because {self.last_switch_reason}"
        return f"{text} · {key_status(now)}"

    # -- calls ---------------------------------------------------------------------------
    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = True,
        on_delta: Callable[[str], None] | None = None,
        on_reset: Callable[[], None] | None = None,
        cache: CacheHints | None = None,
    ) -> Completion:
        """Call the model; on a transport failure try the other endpoint once. `cache`: where the
        request's stable points are, applied by each endpoint's own rules (`prompt_cache`)."""
        order = self._order()
        last: Switch | None = None
        for i, endpoint in enumerate(order):
            started = time.monotonic()
            try:
                result = self._call(endpoint, messages, tools, stream, on_delta, cache)
            except Switch as exc:
                last = exc
                if i + 1 < len(order):
                    if on_reset:
                        on_reset()
                    self._mark(order[i + 1], f"{endpoint.label} {exc.reason}")
                    continue
                break
            result.duration_s = time.monotonic() - started
            self._mark(endpoint)
            self._report(endpoint, last.reason if last else "")
            return result
        assert last is not None
        names = " and ".join(e.label for e in order)
        raise LLMError(f"{names} endpoint{'s' if len(order) > 1 else ''} failed: {last.reason}")

    def _call(self, endpoint: Endpoint, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              stream: bool, on_delta: Callable[[str], None] | None, cache: CacheHints | None = None) -> Completion:
        if is_offline(endpoint.model) and not endpoint.api_base:
            from . import offline  # answered in-process: the first offline reply never waits for litellm

            text, usage = offline.complete(messages, stream, on_delta, tools)
            return Completion(text, [], usage, endpoint.label, endpoint.model)
        litellm = litellm_module()
        kwargs: dict[str, Any] = {
            "model": endpoint.model,
            "messages": messages,
            "timeout": self.timeout_s,
            "num_retries": 0,
            "max_retries": 0,
        }
        if endpoint.api_base:
            kwargs["api_base"] = endpoint.api_base
        key = endpoint.key()
        if key:
            kwargs["api_key"] = key
        if tools:
            kwargs["tools"] = tools
        hinted = self._hint(endpoint, kwargs, cache)
        try:
            if stream:
                kwargs["stream"] = True
                kwargs["stream_options"] = {"include_usage": True}
                return self._consume_stream(endpoint, litellm.completion(**kwargs), on_delta)
            response = litellm.completion(**kwargs)
            return _from_response(endpoint, response)
        except (Switch, LLMError):
            raise
        except Exception as exc:
            if hinted and getattr(exc, "status_code", None) == 400 and prompt_cache.rejected(str(exc)):
                # the endpoint refuses the hints: this call again without them, and none from now on
                self.no_cache.add(endpoint.describe())
                self.notes.append(f"{endpoint.model} refused the prompt-cache hints; sent without them from now on")
                return self._call(endpoint, messages, tools, stream, on_delta, None)
            raise classify(exc, endpoint) from exc

    def _hint(self, endpoint: Endpoint, kwargs: dict[str, Any], cache: CacheHints | None) -> bool:
        """Put the endpoint family's cache hints into the request: breakpoints for Anthropic-style
        models, a `prompt_cache_key` for OpenAI ones, nothing for the rest or for an endpoint that
        refused them. Returns whether any hint was added."""
        if cache is None or endpoint.describe() in self.no_cache:
            return False
        kind = prompt_cache.family(endpoint.model)
        if kind == "anthropic":
            kwargs["messages"], tools, placed = prompt_cache.mark(kwargs["messages"], kwargs.get("tools"), cache)
            if tools:
                kwargs["tools"] = tools
            return placed > 0
        if kind == "openai" and cache.key:
            kwargs["prompt_cache_key"] = cache.key
            return True
        return False

    def take_notes(self) -> list[str]:
        """Notices for the person since the last call (a refused hint), once each."""
        notes, self.notes = self.notes, []
        return notes

    def _consume_stream(self, endpoint: Endpoint, chunks: Any, on_delta: Callable[[str], None] | None) -> Completion:
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: dict[str, int] | None = None
        model = endpoint.model
        for chunk in chunks:
            if getattr(chunk, "usage", None):
                usage = _usage(chunk.usage) or usage
            for choice in getattr(chunk, "choices", None) or ():
                delta = getattr(choice, "delta", None)
                if delta is None:
                    continue
                text = getattr(delta, "content", None)
                if text:
                    parts.append(text)
                    if on_delta:
                        on_delta(text)
                for tc in getattr(delta, "tool_calls", None) or ():
                    index = getattr(tc, "index", None) or 0
                    slot = calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    if getattr(tc, "id", None):
                        slot["id"] = tc.id
                    fn = getattr(tc, "function", None)
                    if fn is not None:
                        if getattr(fn, "name", None):
                            slot["function"]["name"] += fn.name
                        if getattr(fn, "arguments", None):
                            slot["function"]["arguments"] += fn.arguments
        tool_calls = [calls[i] for i in sorted(calls)]
        for n, call in enumerate(tool_calls):
            call["id"] = call["id"] or f"call_{n}"
        if not "".join(parts).strip() and not tool_calls:
            raise Switch(f"empty reply from {endpoint.model} (HTTP 200 stream with no content)")
        return Completion("".join(parts), tool_calls, usage, endpoint.label, model)


def _from_response(endpoint: Endpoint, response: Any) -> Completion:
    choices = getattr(response, "choices", None)
    message = getattr(choices[0], "message", None) if choices else None
    if message is None:
        raise Switch(f"malformed reply from {endpoint.model} (HTTP 200 with no choices)")
    tool_calls = []
    for n, tc in enumerate(getattr(message, "tool_calls", None) or ()):
        tool_calls.append({
            "id": tc.id or f"call_{n}",
            "type": "function",
            "function": {"name": tc.function.name or "", "arguments": tc.function.arguments or ""},
        })
    content = message.content if isinstance(message.content, str) else ""
    if not content.strip() and not tool_calls:
        raise Switch(f"empty reply from {endpoint.model} (HTTP 200 with no content)")
    return Completion(content, tool_calls, _usage(getattr(response, "usage", None)),
                      endpoint.label, endpoint.model)


def _field(raw: Any, name: str) -> int:
    value = raw.get(name) if isinstance(raw, dict) else getattr(raw, name, 0)
    return value if isinstance(value, int) and value > 0 else 0


def _usage(raw: Any) -> dict[str, int] | None:
    """Provider usage as plain ints; None when missing or malformed (it then never anchors)."""
    if raw is None:
        return None
    try:
        value: Any = raw.get("prompt_tokens") if isinstance(raw, dict) else raw.prompt_tokens
        prompt = int(value)
        completion = raw.get("completion_tokens") if isinstance(raw, dict) else getattr(raw, "completion_tokens", 0)
        details = raw.get("prompt_tokens_details") if isinstance(raw, dict) else getattr(raw, "prompt_tokens_details", None)
        cached = (details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", 0)) or 0
        # Anthropic (through litellm): reads and writes of its cache; a write costs more than an input token
        read = _field(raw, "cache_read_input_tokens")
        written = _field(raw, "cache_creation_input_tokens")
        if prompt < 0:
            return None
        return {"prompt_tokens": prompt, "completion_tokens": int(completion or 0),
                "cached_tokens": int(cached or read), "cache_write_tokens": int(written)}
    except (AttributeError, TypeError, ValueError):
        return None



def model_window(model: str) -> int | None:
    """The model's input window from litellm's local model map, or None when unknown."""
    if is_offline(model):
        return None
    try:
        info = litellm_module().get_model_info(model)
    except Exception:  # unknown model: the caller falls back to configuration
        return None
    value = info.get("max_input_tokens") or info.get("max_tokens")
    return int(value) if value else None


def unknown_model(model: str, api_base: str = "") -> str | None:
    """Why litellm could not route `model` (its own provider lookup, the one `completion` makes), with the
    nearest provider it knows when the prefix is a near miss; None when it can."""
    if is_offline(model):
        return None
    litellm = litellm_module()
    try:
        litellm.get_llm_provider(model, api_base=api_base or None)
        return None
    except Exception:
        pass
    prefix, _, rest = model.partition("/")
    providers = sorted({str(getattr(p, "value", p)) for p in litellm.provider_list})
    near = difflib.get_close_matches(prefix, providers, n=1, cutoff=0.6) if rest else []
    if near:
        return f"model {model!r}: litellm knows no provider {prefix!r}; did you mean {near[0]}/{rest}?"
    if rest:
        return (f"model {model!r}: litellm knows no provider {prefix!r}; name one it knows, e.g. openai/{rest} "
                "(https://docs.litellm.ai/docs/providers)")
    return (f"model {model!r}: litellm cannot tell its provider; name it, e.g. openai/{model} "
            + ("for an OpenAI-compatible server at api_base" if api_base else "or anthropic/" + model))


def missing_key(model: str, api_base: str = "") -> str | None:
    """The environment variable a model needs and lacks, if litellm can tell; None when fine."""
    if is_offline(model) or api_base:
        return None
    try:
        report = litellm_module().validate_environment(model=model)
    except Exception:
        return None
    missing = report.get("missing_keys") or []
    return missing[0] if missing and not report.get("keys_in_environment") else None


def key_status(endpoint: Endpoint) -> str:
    """Whether a key goes with this endpoint's requests, and from which variable (never its value)."""
    if is_offline(endpoint.model):
        return "key: none needed (the embedded offline model)"
    if endpoint.key_env:
        if os.environ.get(endpoint.key_env):
            return f"key: sent, from {endpoint.key_env}"
        return (f"key: none (fine for a local server); a server that needs one reads it from {endpoint.key_env}, "
                "which is not set in this kernel")
    if endpoint.api_key:
        return "key: sent, given in code when the session was made (held in memory, never saved)"
    if endpoint.api_base:
        return "key: none (fine for a local server)"
    try:
        report = litellm_module().validate_environment(model=endpoint.model)
    except Exception:
        return "key: whatever litellm finds in the environment for this provider"
    if report.get("keys_in_environment"):
        provider = endpoint.model.split("/", 1)[0].upper().replace("-", "_")
        name = next((v for v in (f"{provider}_API_KEY", f"{provider}_KEY") if os.environ.get(v)), None)
        return f"key: sent, from {name}" if name else "key: sent, from the provider's variable in the environment"
    missing = report.get("missing_keys") or []
    if not missing:
        return "key: none needed by this provider, as litellm reads it"
    return f"key: none: {missing[0]} is not set in this kernel; set it and re-run (keys are never saved)"


def default_endpoints(model: str, api_base: str, fallback_model: str, fallback_base_url: str) -> tuple[Endpoint, Endpoint | None]:
    """Endpoints from settings, with keys read from the environment (never from settings)."""
    primary = Endpoint(model or OFFLINE_MODEL, api_base, "", "primary", key_env="MFS_API_KEY" if api_base else "")
    fallback = None
    if fallback_model and fallback_base_url:
        fallback = Endpoint(fallback_model, fallback_base_url, "", "fallback", key_env="MFS_FALLBACK_API_KEY")
    return primary, fallback
