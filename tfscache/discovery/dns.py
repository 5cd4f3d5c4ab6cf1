"""DNS membership: the peers are a (headless Kubernetes) Service's DNS records, re-resolved on an interval.

Nothing registers: the cluster's DNS already lists the pods. In Kubernetes a headless Service
(``clusterIP: None``) has, for each ready pod it selects,

* an SRV record per named port: ``_grpc._tcp.tfscache-headless.NS.svc.cluster.local`` ->
  ``0 N 8500 tfscache-0.tfscache-headless.NS.svc.cluster.local.`` (a StatefulSet's pods get
  their pod name as the first label, because the StatefulSet sets their hostname and subdomain);
* A/AAAA records: ``tfscache-headless.NS.svc.cluster.local`` -> every pod IP.

``record = "srv"`` (the default) reads ``_grpc._tcp.NAME`` and ``_rest._tcp.NAME``. A peer's name
is the first label of its SRV target (``tfscache-0``, the pod name: ``ring.self_name`` is
``$(POD_NAME)``), its addresses are the target's A (else AAAA) record with the SRV ports.
``record = "a"`` reads NAME's A and AAAA records and names each peer by its IP address
(``ring.self_name`` must then be ``$(POD_IP)``), with the configured ports.

A read that times out or fails (SERVFAIL, REFUSED, no server) is a failure: the last
membership stays, the read is retried with back-off. NXDOMAIN or no records is a successful
read of nobody, which ``Discovery._apply`` ignores once a membership is known (a cluster
where every pod is unready still has its last ring). ``reload()`` (SIGHUP) re-resolves now.

dnspython's asyncio resolver does the queries on the event loop; the system configuration
(/etc/resolv.conf, with its search list, so a short name works in a pod) is read in a thread.
"""

from __future__ import annotations

import asyncio
import logging

import dns.asyncresolver
import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver

from tfscache.discovery import Discovery, Peer, describe_error
from tfscache.discovery.peer import parse_dns_server
from tfscache.tasks import cancel

log = logging.getLogger("tfscache.discovery.dns")

RECORDS = ("srv", "a")
# DNS answers that mean "no such records" (a successful read of nobody), not a failure.
EMPTY = (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer)


class DnsError(Exception):
    """A DNS read failed (timeout, SERVFAIL, REFUSED, no server answered)."""


def host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class DnsDiscovery(Discovery):
    """Membership = the peers a DNS name's records list, re-read every ``interval_s`` seconds."""

    name = "dns"
    registration_note = (
        "dns discovery: nothing to register; this sidecar is on the others' rings while "
        "its DNS records list it (in Kubernetes: while its pod is ready)"
    )

    def __init__(
        self,
        dns_name: str,
        record: str = "srv",
        grpc_port: int = 8500,
        rest_port: int = 8501,
        interval_s: float = 5.0,
        server: str = "",
        request_timeout_s: float = 5.0,
        **options,
    ) -> None:
        super().__init__(**options)
        if not dns_name:
            raise ValueError("dns discovery needs a name (discovery.dns_name)")
        if record not in RECORDS:
            raise ValueError(
                f"dns discovery: record must be one of {', '.join(RECORDS)}, not {record!r}"
            )
        self.dns_name, self.record = dns_name, record
        self.grpc_port, self.rest_port = grpc_port, rest_port
        self.interval_s, self.request_timeout_s = interval_s, request_timeout_s
        self.server = parse_dns_server(server) if server else None
        self._resolver: dns.asyncresolver.Resolver | None = None
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._state = self._state_log(f"resolving {dns_name} ({record.upper()})", log)

    # -- the interface ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._resolver is None:
            self._resolver = await asyncio.to_thread(self._make_resolver)
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="dns-watch")
        await self._wait_known()

    async def register(self, peer: Peer) -> None:
        self.label = peer.name
        if self._members and peer.name not in {p.name for p in self._members}:
            log.info(
                "dns discovery: %s is not in %s's records yet (it is added when its pod is ready)",
                peer.name,
                self.dns_name,
            )

    async def deregister(self) -> None:
        return None  # the records follow the pod's readiness: a draining sidecar turns NOT_SERVING

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    async def reload(self) -> bool:
        """SIGHUP: re-resolve now instead of at the end of the interval."""
        self._wake.set()
        return True

    # -- resolving ----------------------------------------------------------------------------------

    def _make_resolver(self) -> dns.asyncresolver.Resolver:
        """The system's resolver configuration, or only ``server`` (reads /etc/resolv.conf: in a thread)."""
        if self.server is None:
            resolver = dns.asyncresolver.Resolver()
        else:
            resolver = dns.asyncresolver.Resolver(configure=False)
            resolver.nameservers, resolver.port = [self.server[0]], self.server[1]
        resolver.cache = None  # every interval asks the server (which has its own TTLs)
        return resolver

    async def _query(self, name: str | dns.name.Name, rdtype: str) -> dns.resolver.Answer | None:
        """The answer, or None for NXDOMAIN / no records; DnsError for a failed read."""
        try:
            return await self._resolver.resolve(
                name, rdtype, search=True, lifetime=self.request_timeout_s
            )
        except EMPTY:
            return None
        except dns.exception.DNSException as exc:
            raise DnsError(f"{rdtype} {name}: {describe_error(exc)}") from exc

    async def _addresses(
        self, name: str | dns.name.Name, known: dict[dns.name.Name, list[str]]
    ) -> list[str]:
        """The A records of ``name``, else its AAAA records (from ``known`` first), sorted."""
        if isinstance(name, dns.name.Name) and name in known:
            return known[name]
        for rdtype in ("A", "AAAA"):
            answer = await self._query(name, rdtype)
            if answer is not None:
                return sorted(r.address for r in answer)
        return []

    async def _srv(
        self, service: str
    ) -> tuple[dict[dns.name.Name, int], dict[dns.name.Name, list[str]]]:
        """``_SERVICE._tcp.NAME``: target -> port (lowest priority first), and the answer's
        additional A/AAAA."""
        answer = await self._query(f"_{service}._tcp.{self.dns_name}", "SRV")
        if answer is None:
            return {}, {}
        ports: dict[dns.name.Name, int] = {}
        for r in sorted(answer, key=lambda r: (r.priority, -r.weight, str(r.target))):
            if r.target != dns.name.root:  # "." means: no such service
                ports.setdefault(r.target, r.port)
        known: dict[dns.name.Name, list[str]] = {}
        for rrset in answer.response.additional:
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA) and rrset.name not in known:
                known[rrset.name] = sorted(r.address for r in rrset)
        return ports, known

    async def _resolve_srv(self) -> list[Peer]:
        grpc, known = await self._srv("grpc")
        rest, known_rest = await self._srv("rest")
        peers: dict[str, Peer] = {}
        for target, port in grpc.items():
            addresses = await self._addresses(target, {**known_rest, **known})
            name = target.labels[0].decode() if target.labels else ""
            if not addresses or not name:
                log.debug("dns discovery: SRV target %s has no address; skipped", target)
                continue
            if name in peers:
                log.debug(
                    "dns discovery: two SRV targets named %s; keeping %s", name, peers[name].grpc
                )
                continue
            rest_port = rest.get(target)
            peers[name] = Peer(name, host_port(addresses[0], port),
                               host_port(addresses[0], rest_port) if rest_port else "")
        return list(peers.values())

    async def _resolve_a(self) -> list[Peer]:
        return [Peer(address, host_port(address, self.grpc_port),
                     host_port(address, self.rest_port) if self.rest_port else "")
                for address in await self._addresses(self.dns_name, {})]

    async def resolve(self) -> list[Peer]:
        """One read of the membership (DnsError if it failed)."""
        return await (self._resolve_srv() if self.record == "srv" else self._resolve_a())

    async def _watch(self) -> None:
        backoff = self._backoff()
        while True:
            self._wake.clear()  # a reload() from here on wakes the wait below
            try:
                peers = await self.resolve()
            except DnsError as exc:
                self._state.failed(exc)
                delay = backoff.next_delay()
            else:
                self._state.ok()
                backoff.reset()
                await self._apply(peers)
                delay = self.interval_s
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
