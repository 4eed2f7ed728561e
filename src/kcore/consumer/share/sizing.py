"""How many records a share member's ShareFetch asks for (its MaxRecords), free of I/O.

Java's share consumer asks for ``max.poll.records``. A leader costs a few milliseconds a
ShareFetch whatever it acquires, answers one of a member's fetches at a time, and in
batch_optimized mode acquires whole producer batches anyway (a 1 MB batch of 100-byte records
is ~9,000 records, 18 polls). A member that takes records faster than the leader answers spends
much of its time waiting for the next fetch: with 1 member and 9,000-record batches, ~40% of a
round. Asking for more records a fetch spreads that cost over more of them.

Rules kept:

* a fetch asks for what this member takes in ``FETCH_ROUND_TRIPS`` of its leader's round
  trips, at the rate it took the records of its last full buffer: the wait for the leader is
  then at most about a fifth of its time;
* never fewer than ``max.poll.records`` (a slow member asks for what Java's asks for), and
  never more than it takes in a tenth of the acquisition lock (a record acquired is handed out
  long before its lock runs out) nor ``MAX_POLLS_A_FETCH`` polls' worth (what one member holds
  and decodes in one go stays bounded when a measurement is off);
* in record_limit acquire mode always ``max.poll.records``: the caller asked for that bound;
* until a rate is measured, ``max.poll.records``.

The caller's thread reports what polls take (:meth:`FetchSizing.taken`), the event loop the
round trips (:meth:`FetchSizing.answered`); each writes its own fields."""

from __future__ import annotations

__all__ = ["FETCH_ROUND_TRIPS", "MAX_POLLS_A_FETCH", "FetchSizing"]

FETCH_ROUND_TRIPS = 4
MAX_POLLS_A_FETCH = 64
# Weight of the newest measurement in the running estimates (rate, round trip).
SMOOTHING = 0.5


class FetchSizing:
    def __init__(self, max_poll_records: int, record_limit: bool) -> None:
        self.floor = max_poll_records
        self.fixed = record_limit
        self.rate = 0.0  # records a second this member takes from a full buffer; 0: unknown
        self.round_trip_s = 0.0  # a ShareFetch that acquired records, smoothed; 0: unknown
        # The full buffer being measured: when its first take happened, the records taken
        # before the latest take (their processing lies between the two), the latest take's.
        self._since: float | None = None
        self._before = 0
        self._latest = 0

    def answered(self, round_trip_s: float) -> None:
        """A ShareFetch that acquired records was answered ``round_trip_s`` after it went."""
        self.round_trip_s = _smooth(self.round_trip_s, round_trip_s)

    def taken(self, now: float, records: int, left: int) -> None:
        """A poll took ``records`` from the buffer at ``now``, leaving ``left`` there."""
        if self._since is None:
            self._since, self._before, self._latest = now, 0, records
        else:
            self._before += self._latest
            self._latest = records
        if left:
            return
        elapsed = now - self._since
        if self._before and elapsed > 0:
            self.rate = _smooth(self.rate, self._before / elapsed)
        self._since = None

    def max_records(self, acquisition_lock_s: float) -> int:
        """What the next ShareFetch asks for."""
        if self.fixed or not self.rate or not self.round_trip_s:
            return self.floor
        wanted = self.rate * min(FETCH_ROUND_TRIPS * self.round_trip_s, acquisition_lock_s / 10)
        return max(self.floor, min(int(wanted), MAX_POLLS_A_FETCH * self.floor))


def _smooth(old: float, new: float) -> float:
    return new if not old else old + SMOOTHING * (new - old)
