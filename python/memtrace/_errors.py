"""Exceptions of the memtrace package."""


class MemtraceError(RuntimeError):
    """A memtrace call failed; the message names what and why."""


class MemtraceUnavailable(MemtraceError):
    """The memtrace library is neither in this process nor found by path."""
