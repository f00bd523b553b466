"""Exceptions a caller can catch. Each message is one line that says what happened and what to do."""

from __future__ import annotations


class MfsError(Exception):
    """Base class: anything the user can cause or fix. Shown as a one-line message, never a traceback."""


class ConfigError(MfsError, ValueError):
    """A configuration value is invalid; the old value stays in force."""


class InputError(MfsError, ValueError):
    """A cell, file or argument cannot be used as given; nothing was written."""


class StoreError(MfsError):
    """The LanceDB store cannot be opened or written."""


class LLMError(MfsError):
    """The model provider failed; the message carries the provider's reason and what to do."""


class PromptTooLong(LLMError):
    """The provider rejected the payload as longer than the model's window."""

    def __init__(self, message: str, gap_tokens: int | None = None):
        super().__init__(message)
        self.gap_tokens = gap_tokens
