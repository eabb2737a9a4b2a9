"""Where one B1 round trip's time goes, per side: ``bench_b1.py --split``.

Clock probes (``time.perf_counter_ns``) on the two places every round trip
passes on each side: the poll that hands a frame over (the runtime's
``progress._poll``) and the send of a frame that leaves at once (the
router's ``_send``).  Per call the controller records

* ``issue``: ``call_one()`` until it returns (the CALL sent);
* ``away``: the CALL sent until the poll that dispatched the reply returns:
  both wire legs, each receiver's pump and frame handler, and the worker's
  service below;
* ``settle``: that poll's return until ``get()`` returns;

and the worker ``service``: the poll that dispatched the call returns
until the reply is sent, with ``reply_send``, the reply's send alone.
``away - service`` is then what the two legs cost between the sends and
the polls' returns.  The probes are two Python calls per side and frame,
so they add ~1 µs to the round trip; they are for the split, not for B1's
figure.  They reach into the runtime's private attributes on purpose.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from _actors import Bench

from mpimesh import endpoint

__all__ = ["SplitBench", "Probes", "split_row"]

_clock = time.perf_counter_ns


class Probes:
    """The clock probes of one process: the last poll that handed a frame over, and the last send."""

    def __init__(self, reply_kind: int | None) -> None:
        #: when the last poll that dispatched a frame returned, and when the last send ended (ns)
        self.polled = self.sent = 0
        #: the worker's per-reply (service, reply_send) in ns
        self.service: list[int] = []
        self.reply_send: list[int] = []
        self._reply_kind = reply_kind

    def install(self) -> None:
        """Wrap this process's poll and send (the runtime's private ``progress._poll`` and ``router._send``)."""
        from mpimesh._core import current

        rt = current.runtime or current.current()
        poll, send = rt.progress._poll, rt.router._send

        def probed_poll(spin: float) -> int:
            handled = poll(spin)
            if handled:
                self.polled = _clock()
            return handled

        def probed_send(link: Any, rank: int, frame: Any) -> None:
            start = _clock()
            send(link, rank, frame)
            self.sent = end = _clock()
            if frame[0] == self._reply_kind:
                self.service.append(end - self.polled)
                self.reply_send.append(end - start)

        rt.progress._poll = probed_poll
        rt.router._send = probed_send


class SplitBench(Bench):
    """The benchmark actor with the worker's half of the probes."""

    _probes: Probes | None = None

    @endpoint
    def probe(self) -> None:
        """Install the probes in this worker (once)."""
        from mpimesh._core.protocol import Kind

        if SplitBench._probes is None:
            SplitBench._probes = Probes(Kind.REPLY)
            SplitBench._probes.install()

    @endpoint
    def probed(self, skip: int) -> dict[str, float]:
        """Medians in µs of the replies probed since the last call, the first ``skip`` left out; then forget them."""
        probes = SplitBench._probes
        assert probes is not None, "call probe() first"
        out = {"service_us": _us(probes.service[skip:]), "reply_send_us": _us(probes.reply_send[skip:])}
        probes.service.clear()
        probes.reply_send.clear()
        return out


def _us(ns: list[int]) -> float:
    return round(statistics.median(ns) / 1e3, 2) if ns else float("nan")


def split_row(one: Any, probes: Probes, calls: int, warmup: int) -> dict[str, float]:
    """Time ``calls`` round trips after ``warmup`` with the probes on both sides; medians in µs."""
    total, issue, away, settle = [], [], [], []
    for _ in range(warmup + calls):
        start = _clock()
        fut = one.noop.call_one(1)
        issued = _clock()
        fut.get()
        end = _clock()
        total.append(end - start)
        issue.append(issued - start)
        away.append(probes.polled - probes.sent)
        settle.append(end - probes.polled)
    # the worker's first replies are the warm-up's, and the `probed` call's own reply comes after
    row = {"total_us": _us(total[warmup:]), "issue_us": _us(issue[warmup:]), "away_us": _us(away[warmup:]),
           "settle_us": _us(settle[warmup:])}
    row.update(one.probed.call_one(warmup).get(60))
    return row
