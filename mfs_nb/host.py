"""What the engine's parts may use of their session.

The compactor, the user-verbatim track and the recall index each work for one session, but none
of them gets the `Session`: they get a `Host`, the session's name and store, read access to its
log, a ledger writer and the few measurements they need. So none of them imports the `session` package,
none reads its private state, and what each may touch is written here in one place. Only the
front ends (magics and their warm-up, CLI, replay, demo, the benchmarks) import `Session`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .events import Event
    from .settings import Settings
    from .store import Store


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Host:
    """One session as the engine's parts see it. Every callable reads the session's state at the
    moment it is called (settings change with `%mfs set`, the log grows)."""

    name: str
    store: Store
    writer: str  # this kernel's writer id (leases and event rows are signed with it)
    settings: Callable[[], Settings]
    events: Callable[[], Sequence[Event]]  # the log as this kernel has it, in uid order
    log: Callable[..., Any]  # the ledger writer: log(kind, **fields)
    catch_up: Callable[[], None] = _nothing  # read the events other kernels appended since
    usage: Callable[[], Any] = _nothing  # the meter on the payload in force (`usage.Usage`)
    view: Callable[[], Any] = _nothing  # the payload in force, with its layers (`view.SendView`)
    counts: Callable[[Any], Sequence[int]] = lambda view: ()  # tokens of each message of a payload, as the meter counts
    system_prompt: Callable[[], str] = lambda: ""
    summarizer: Callable[[], Any] = _nothing  # the model client that writes segment prose
    before_cover: Callable[[int], Any] = _nothing  # runs before uids up to N are covered by a segment
    after_index: Callable[[int], Any] = _nothing  # runs in the index thread once uids up to N have vectors
    load_breaker: Callable[[], dict[str, Any] | None] = _nothing  # the saved circuit-breaker state
    save_breaker: Callable[[dict[str, Any]], None] = _nothing
    segments: Callable[[], Sequence[Any]] = lambda: ()  # the segment maps in force
    embedder: Callable[[bool], Any] = _nothing  # the quality-gated embedder or None; (False): only if loaded
    embedder_off: Callable[[], str | None] = _nothing  # why there is no embedder, when there is none
    busy: Callable[[], bool] = lambda: False  # a turn is running (background work yields to it)
    turn_ended: Callable[[], float] = lambda: 0.0  # when the last turn ended (time.monotonic; 0 before any)
    miss_weight: Callable[[], float | None] = _nothing  # a cache miss's price per token freed (`cost.miss_weight`)
    retried: Callable[[], Collection[int]] = lambda: ()  # events of failed turns asked again (`events.Retries`)
