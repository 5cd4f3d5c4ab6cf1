"""Who serves what: the consistent-hash ring and the topology of backends over it."""
