"""What a failed model call means, in one line: a prompt too long for the window (and by how much), a
transport failure, a refused key; the key itself never in the text. `endpoint`: an `llm.Endpoint` (its model,
api_base, key() and key_hint())."""

from __future__ import annotations

import re
from typing import Any

from ..errors import LLMError, PromptTooLong
from ..redaction import redact

_GAP = re.compile(r"(\d[\d,]*)\s*tokens?\s*>\s*(\d[\d,]*)|requested\s+(\d[\d,]*)\s+tokens.*?maximum.*?(\d[\d,]*)",
                  re.I | re.S)
_MAXCTX = re.compile(r"maximum context length is\s+(\d[\d,]*).*?(?:resulted in|requested)\s+(\d[\d,]*)", re.I | re.S)


NO_KEY = "mfs-no-key"  # an endpoint's key where none is needed (a local server, the offline default)


class Switch(Exception):
    """A transport failure that the other endpoint may not have: the client tries the fallback."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def parse_token_gap(message: str) -> int | None:
    """How many tokens over the limit a prompt-too-long error says the request was, if it says."""
    m = _MAXCTX.search(message)
    if m:
        limit, used = (int(g.replace(",", "")) for g in m.groups())
        return max(used - limit, 0) or None
    m = _GAP.search(message)
    if m:
        if m.group(1):
            used, limit = int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))
        else:
            used, limit = int(m.group(3).replace(",", "")), int(m.group(4).replace(",", ""))
        return max(used - limit, 0) or None
    return None


def one_line(exc: BaseException, endpoint: Any) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = redact(text, (endpoint.key(),) if endpoint.key() != NO_KEY else ())
    return text[:300] + ("…" if len(text) > 300 else "")


def transport_failure(exc: BaseException, reason: str) -> str:
    """'timeout' or 'connection error' when no HTTP answer came (litellm may wrap these in a 500)."""
    seen: BaseException | None = exc
    names = []
    for _ in range(8):
        if seen is None:
            break
        names.append(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    if any("Timeout" in n for n in names) or re.search(r"\btimed? ?out\b", reason, re.I):
        return "timeout"
    if any("Connect" in n for n in names) or re.search(r"connection (?:error|refused|reset)|cannot connect", reason, re.I):
        return "connection error"
    return ""


def classify(exc: Exception, endpoint: Any) -> Exception:
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    reason = one_line(exc, endpoint)
    if re.search(r"api[_ ]key.{0,80}(must be set|missing|not set|not provided)|(missing|no) api[_ ]key", reason, re.I):
        return LLMError(f"{endpoint.model}: no API key for this endpoint; set {endpoint.key_hint()} in the environment "
                        "and re-run the cell (keys are never saved)")
    if "ContextWindowExceeded" in name or re.search(r"context length|prompt is too long|too many tokens", reason, re.I):
        return PromptTooLong(f"{endpoint.model}: prompt too long: {reason}", parse_token_gap(str(exc)))
    transport = transport_failure(exc, reason)
    if transport:  # nothing answered: never reported as an HTTP status
        return Switch(f"{transport} reaching {endpoint.model}"
                       f"{' at ' + endpoint.api_base if endpoint.api_base else ''}: {reason}")
    if "ServiceUnavailable" in name or "InternalServer" in name \
            or "RateLimit" in name or "BadGateway" in name or (isinstance(status, int) and (status == 429 or status >= 500)):
        label = f"HTTP {status}" if isinstance(status, int) else name
        return Switch(f"{label} from {endpoint.model}: {reason}")
    if "Authentication" in name or status == 401:
        return LLMError(f"{endpoint.model}: the endpoint rejected the key ({reason}); set {endpoint.key_hint()} "
                        "in the environment and re-run the cell")
    if "NotFound" in name or status == 404:
        return LLMError(f"{endpoint.model}: model or endpoint not found ({reason}); check `%mfs config model=…`")
    return LLMError(f"{endpoint.model}: {reason}")
