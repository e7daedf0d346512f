"""Which of a node's multiaddrs others can use to join it.

The p2p daemon reports every address it listens on, including loopback and the unspecified
address; a node behind NAT also sees only its private address. What a node prints and publishes
(its status record, the `join through` lines, `swarm-node bootstrap`) goes through
`usable_maddrs`:

* announce addresses, when the operator gave them, are the node's public face: only they are used
  (plus relay circuits through other peers, which are reachable by construction);
* loopback and unspecified addresses are never listed, unless the node listens on loopback only
  (a swarm on one machine, `swarm-node local`): then loopback is the only way in, and it is kept;
* a client-mode node accepts no incoming connections: it lists nothing (`join_hint` says so);
* a node behind NAT with `swarm.use_auto_relay` (not client mode) reserves a slot at its initial
  peers, which relay for it when they run `swarm-node bootstrap` at a public address; it lists
  `<initial peer>/p2p-circuit/p2p/<its id>` (`relay_maddrs`). libp2p makes the reservation only
  after a boot delay when it knows a single relay candidate: about 3 minutes, measured.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

CLIENT_MODE_HINT = "client mode: this node accepts no incoming connections, so no peer can join through it"


def _ip_of(maddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    parts = maddr.split("/")
    for proto in ("ip4", "ip6"):
        if proto in parts:
            i = parts.index(proto)
            try:
                return ipaddress.ip_address(parts[i + 1])
            except (IndexError, ValueError):
                return None
    return None


def is_relay_circuit(maddr: str) -> bool:
    return "/p2p-circuit" in maddr


def is_local_only(maddr: str) -> bool:
    """True for addresses nobody else can dial: loopback, unspecified (0.0.0.0, ::), link-local."""
    if is_relay_circuit(maddr):
        return False
    ip = _ip_of(maddr)
    return ip is not None and (ip.is_loopback or ip.is_unspecified or ip.is_link_local)


def relay_maddrs(relays: Sequence[str], peer_id: str) -> list[str]:
    """Circuit addresses through each relay (a full multiaddr with /p2p/<relay id>) to `peer_id`."""
    return [f"{str(r).rstrip('/')}/p2p-circuit/p2p/{peer_id}" for r in relays
            if "/p2p/" in str(r) and "/p2p-circuit" not in str(r) and not is_local_only(str(r))]


def usable_maddrs(visible: Sequence[str], *, announce: Sequence[str] = (), client_mode: bool = False) -> list[str]:
    """The addresses to print and publish (see module doc), in their original order, de-duplicated."""
    if client_mode:
        return []
    visible = list(dict.fromkeys(str(m) for m in visible))
    if announce:
        announce_set = [str(a) for a in announce]
        chosen = [m for m in visible if any(m.startswith(a) for a in announce_set) or is_relay_circuit(m)]
        return chosen or [m for m in visible if not is_local_only(m)]
    outside = [m for m in visible if not is_local_only(m)]
    if outside:
        return outside
    return [m for m in visible if _ip_of(m) is not None and _ip_of(m).is_loopback]


def join_hint(usable: Sequence[str], *, client_mode: bool) -> str | None:
    """A line for the operator when the node cannot be joined through the addresses it has."""
    if client_mode:
        return CLIENT_MODE_HINT
    if not usable:
        return ("no address others can dial: listen on a reachable interface (swarm.host_maddrs) "
                "or give the public one (swarm.announce_maddrs)")
    return None


def check_initial_peers(initial_peers: Sequence[str]) -> list[str]:
    """Each initial peer must be a full multiaddr ending in /p2p/<peer id>; raise ValueError otherwise."""
    from hivemind.utils.multiaddr import Multiaddr
    from hivemind.utils.multiaddr import exceptions as maddr_errors

    out = []
    for addr in initial_peers:
        try:
            maddr = Multiaddr(addr)
            maddr["p2p"]
        except (maddr_errors.Error, ValueError, TypeError) as e:
            raise ValueError(f"initial peer {addr!r} is not a multiaddr with /p2p/<peer id>: {e}") from e
        out.append(str(maddr))
    return out
