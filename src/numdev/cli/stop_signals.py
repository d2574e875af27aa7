"""SIGTERM and SIGINT as an exception a measuring script catches: it stops its workers, keeps its
partial --out, removes what it made in /tmp, and exits 128 + the signal's number with one line."""

from __future__ import annotations

import signal


class Stopped(BaseException):
    """SIGTERM or SIGINT: the run ends, its workers stopped and its partial --out kept. A BaseException,
    as KeyboardInterrupt is: the `except Exception` that records a kernel's or a compile's failure and
    goes on must not take a signal for one (it did: a SIGTERM during a compile became its "error")."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopOnSignal:
    """Inside, the first SIGTERM or SIGINT raises Stopped and later ones are ignored: `timeout` signals
    the process and then its whole group, and a second signal must not cut the workers' stopping short."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        self.seen = False
        self.previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if not self.seen:
            self.seen = True
            raise Stopped(signum)

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
