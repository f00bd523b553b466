"""The compactor's numbers, read where they are used (a test may change one for its run)."""

BREAKER = 3  # consecutive summarizer failures before automatic LLM compaction stops
REFILL_CALLS = 2  # a compaction needed again within this many calls is a rapid refill
LOCK_WAIT_S = 10.0  # a manual or hard-line compaction waits this long for another kernel's lease
BREAKER_COOLDOWN_S = 600.0  # an open breaker lets one automatic try through after this long (half-open)
EARLIER_CHARS = 40_000  # of earlier summaries shown before a range too large to read at once (a fork)
