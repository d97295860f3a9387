"""Backoff for following the event log while the registry restarts."""

from __future__ import annotations

from collections.abc import Callable

from loraplane.client.errors import RegistryError

MAX_RETRY_DELAY_S = 30.0

# Told (error, failed polls in a row) on each failure, and (None, 0) when one works again.
OnRetry = Callable[[RegistryError | None, int], None]


class RetryDelay:
    """Counts failed polls; a terminal error is raised at once."""

    def __init__(self, max_delay_s: float = MAX_RETRY_DELAY_S) -> None:
        self.max_delay_s = max_delay_s
        self.failures = 0

    def failed(self, error: RegistryError, on_retry: OnRetry | None) -> float:
        """The seconds to wait before the next poll."""
        if not error.retryable:
            raise error
        self.failures += 1
        if on_retry is not None:
            on_retry(error, self.failures)
        return float(min(self.max_delay_s, 2.0 ** (self.failures - 1)))

    def worked(self, on_retry: OnRetry | None) -> None:
        if self.failures and on_retry is not None:
            on_retry(None, 0)
        self.failures = 0
