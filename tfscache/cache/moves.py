"""What a live cache knows to decide demotions and promotions (``cache.demote = host``).

The rules are pure (tfscache.cache.tiers); this gives them their inputs, per version, from what
the cache saw:

* **rates**: every lease counts a request (``Rates``, decayed over 60 s);
* **service times**: each lease's seconds, from grant to release, averaged per tier (an
  exponential moving average, weight ``SERVICE_WEIGHT``). Until a version was served on both
  tiers, the tier it lacks is taken to be ``HOST_SLOWDOWN`` times slower (host) or faster (GPU)
  than the one it has, the simulator's default;
* **costs**: a cold load's seconds are the version's last load (``Entry.load_s``; 0 for a version
  adopted at start-up, which is therefore not demoted: nothing says demotion pays); a
  promotion's are its last move's, either way, and until it moved once, ``PROMOTE_OF_LOAD`` of
  its load.

``demotable`` names the idle GPU-tier versions the planner may demote (the node can move them
and ``demote_pays``); ``granted`` tells, at each lease on a host-tier version, whether its
promotion now pays (``PromoteRule``: requests queued on it, or its rate), and then it is
``wanted`` until the planner promotes it (``promotions``, hottest first).
"""

from __future__ import annotations

from tfscache.cache.ledger import READY, Entry, Key, Ledger
from tfscache.cache.tiers import GPU, HOST, PromoteRule, Rates, TierCosts, demote_pays

PROMOTE_OF_LOAD = 0.5  # a promotion never measured is taken to cost this share of a cold load
HOST_SLOWDOWN = 4.0  # a tier never measured: this many times slower on host than on the GPU
SERVICE_WEIGHT = 0.2  # the weight of each new lease in a tier's moving average


class TierMoves:
    """The demotion and promotion inputs of one node's cache."""

    def __init__(self, ledger: Ledger, can_demote, rule: PromoteRule | None = None) -> None:
        """``can_demote(key)``: whether the node can move ``key`` (its adapter's)."""
        self.ledger = ledger
        self.can_demote = can_demote
        self.rule = rule or PromoteRule()
        self.rates = Rates()
        self.service: dict[tuple[Key, str], float] = {}  # (key, tier) -> seconds per lease
        self.moved_s: dict[Key, float] = {}  # key -> its last move's seconds
        self.wanted: dict[Key, float] = {}  # host-tier key -> its rate when its promotion paid
        self.not_before: dict[Key, float] = {}  # host-tier key -> when a failed promotion may retry

    def granted(self, entry: Entry, now: float) -> bool:
        """A lease on ``entry`` was granted (``entry.leases`` counts it): whether a promotion is
        newly wanted (the reloader is to be woken)."""
        rate = self.rates.request(entry.key, now)
        if entry.tier != HOST or entry.moving is not None or entry.key in self.wanted:
            return False
        if now < self.not_before.get(entry.key, 0.0):
            return False
        if self.rule.pays(rate, entry.leases, self.costs(entry)):
            self.wanted[entry.key] = rate
            return True
        return False

    def released(self, key: Key, tier: str, seconds: float) -> None:
        """A lease on ``key``, served from ``tier``, ended after ``seconds``."""
        old = self.service.get((key, tier))
        self.service[(key, tier)] = seconds if old is None else (
            old + SERVICE_WEIGHT * (seconds - old))

    def moved(self, key: Key, tier: str, seconds: float) -> None:
        self.moved_s[key] = seconds
        if tier == GPU:
            self.wanted.pop(key, None)

    def failed(self, key: Key, retry_at: float) -> None:
        """Promoting ``key`` failed: it is not wanted again before monotonic ``retry_at``."""
        self.wanted.pop(key, None)
        self.not_before[key] = retry_at

    def forget(self, key: Key) -> None:
        """``key`` left the node: what was learned of it while resident goes with it."""
        self.wanted.pop(key, None)
        self.not_before.pop(key, None)
        self.rates.forget(key)
        self.service.pop((key, GPU), None)
        self.service.pop((key, HOST), None)

    def costs(self, entry: Entry) -> TierCosts:
        key, load_s = entry.key, entry.load_s
        promote_s = self.moved_s.get(key, PROMOTE_OF_LOAD * load_s)
        gpu, host = self.service.get((key, GPU)), self.service.get((key, HOST))
        if gpu is None:
            gpu = host / HOST_SLOWDOWN if host is not None else 0.0
        if host is None:
            host = gpu * HOST_SLOWDOWN
        return TierCosts(load_s, promote_s, gpu, host)

    def demotable(self) -> list[Key]:
        """Idle GPU-tier versions the planner may demote rather than unload."""
        entries = self.ledger.entries
        return [k for k in self.ledger.idle()
                if entries[k].tier == GPU and self.can_demote(k)
                and demote_pays(self.costs(entries[k]))]

    def promotions(self) -> list[Key]:
        """Host-tier versions whose promotion paid and is not done, hottest first (the others,
        gone or moved since, are dropped)."""
        entries = self.ledger.entries
        for key in list(self.wanted):
            entry = entries.get(key)
            if entry is None or entry.state != READY or entry.tier != HOST:
                del self.wanted[key]
        return sorted((k for k in self.wanted if entries[k].moving is None),
                      key=lambda k: -self.wanted[k])
