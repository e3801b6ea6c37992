"""Owner-addressed session ids (bridge/core/cluster.py), the `cluster` config block, and what a
forward sends (transports/forward.py): pure, no IO."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from bridge import cli
from bridge.config.load import load
from bridge.config.schema import Cluster as ClusterConfig
from bridge.config.schema import ConfigError
from bridge.core.cluster import DEAD_EPOCHS, FORWARDED_HEADER, Cluster, Forward, Gone, Local, Owner
from bridge.http.errors import HttpError
from bridge.http.forward import Forwarder
from bridge.metrics import Forwarding
from bridge.protocol import jsonrpc

KEY = "k" * 40
OTHER_KEY = "o" * 40
A, B = "10.0.0.7:8080", "10.0.0.8:8080"
VISIBLE_URL_SAFE = re.compile(r"[A-Za-z0-9_.-]+")


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def test_an_id_names_its_owner_and_epoch_and_is_url_safe() -> None:
    a = Cluster(A, KEY)
    sid = a.new_id("alice")
    address, epoch, random, mac = sid.split(".")
    assert VISIBLE_URL_SAFE.fullmatch(sid), sid
    assert (address, epoch) == (b64(A), a.epoch)
    assert len(base64.urlsafe_b64decode(random + "==")) == 16
    assert a.owner(sid, "alice") == Owner(A, a.epoch)
    assert a.new_id("alice") != sid
    assert Cluster(A, KEY).epoch != a.epoch  # each start draws its own


def test_ids_are_bound_to_key_and_principal() -> None:
    a, b = Cluster(A, KEY), Cluster(B, KEY)
    sid = a.new_id("alice")
    assert b.owner(sid, "alice") == Owner(A, a.epoch)
    assert b.owner(sid, "bob") is None
    assert b.owner(sid, None) is None
    assert Cluster(B, OTHER_KEY).owner(sid, "alice") is None
    anonymous = a.new_id(None)
    assert b.owner(anonymous, None) == Owner(A, a.epoch) and b.owner(anonymous, "alice") is None


@pytest.mark.parametrize("field", range(4))
def test_a_tampered_field_is_nobodys(field: int) -> None:
    a, b = Cluster(A, KEY), Cluster(B, KEY)
    parts = a.new_id("alice").split(".")
    parts[field] = b64("127.0.0.1:9") if field == 0 else parts[field][:-1] + ("A" if parts[field][-1] != "A" else "B")
    assert b.owner(".".join(parts), "alice") is None
    assert isinstance(b.route(".".join(parts), "alice", forwarded=False), Gone)


@pytest.mark.parametrize("sid", ["", "abc", "a.b.c", "a.b.c.d.e", "é.b.c.d", "x" * 300, "0123456789abcdef0123456789abcdef"])
def test_malformed_ids_are_nobodys(sid: str) -> None:
    assert Cluster(B, KEY).owner(sid, None) is None


def test_the_mac_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id's MAC is checked with hmac.compare_digest, against the MAC under each peer key:
    never with `==`, whose time says how many leading characters matched."""
    from bridge.core import cluster

    a, b = Cluster(A, KEY), Cluster(B, KEY, previous_key=OTHER_KEY)
    compared: list[tuple[str, str]] = []
    real = cluster.hmac.compare_digest

    def spy(x: Any, y: Any) -> bool:
        compared.append((x, y))
        return bool(real(x, y))

    monkeypatch.setattr(cluster.hmac, "compare_digest", spy)
    sid = a.new_id("alice")
    mac = sid.rpartition(".")[2]
    assert b.owner(sid, "alice") == Owner(A, a.epoch)
    assert compared and compared[0][0] == mac and compared[0][1] == mac  # the current key's MAC matches first
    compared.clear()
    forged = sid[:-1] + ("A" if sid[-1] != "A" else "B")
    assert b.owner(forged, "alice") is None
    assert [x for x, _ in compared] == [forged.rpartition(".")[2]] * 2  # under either key: both compared, in constant time
    assert all(len(x) == len(y) for x, y in compared)


def test_a_shortened_mac_is_nobodys() -> None:
    """The MAC is 128 bits (22 base64url characters), all of them checked: an id whose MAC is
    cut short, to a prefix of the real one or to nothing, names nobody."""
    a, b = Cluster(A, KEY), Cluster(B, KEY)
    sid = a.new_id("alice")
    body, _, mac = sid.rpartition(".")
    assert len(mac) == 22 and b.owner(sid, "alice") is not None
    for cut in (21, 16, 11, 1, 0):
        short = f"{body}.{mac[:cut]}"
        assert b.owner(short, "alice") is None, cut
        assert b.route(short, "alice", forwarded=False) == Gone("unknown session", "invalid")


def test_the_previous_key_is_accepted_and_the_current_one_signs() -> None:
    old = Cluster(A, OTHER_KEY)
    rotating = Cluster(B, KEY, previous_key=OTHER_KEY)
    assert rotating.owner(old.new_id("alice"), "alice") == Owner(A, old.epoch)
    assert Cluster(A, KEY).owner(rotating.new_id("alice"), "alice") is not None
    assert old.owner(rotating.new_id("alice"), "alice") is None


def test_routes() -> None:
    a, b = Cluster(A, KEY), Cluster(B, KEY)
    sid = a.new_id("alice")
    assert b.route(sid, "alice", forwarded=False) == Forward(Owner(A, a.epoch))
    assert a.route(sid, "alice", forwarded=True) == Local()
    assert b.route(sid, "alice", forwarded=True).outcome == "second_hop"  # type: ignore[union-attr]
    assert b.route(sid, "bob", forwarded=False).outcome == "invalid"  # type: ignore[union-attr]
    restarted = Cluster(A, KEY)
    stale = restarted.route(sid, "alice", forwarded=True)
    assert isinstance(stale, Gone) and stale.outcome == "stale" and stale.epoch == restarted.epoch
    b.owner_restarted(Owner(A, a.epoch))
    assert b.route(sid, "alice", forwarded=False).outcome == "owner_restarted"  # type: ignore[union-attr]
    assert b.route(restarted.new_id("alice"), "alice", forwarded=False) == Forward(Owner(A, restarted.epoch))


def test_dead_epochs_are_bounded() -> None:
    b = Cluster(B, KEY)
    for n in range(DEAD_EPOCHS + 10):
        b.owner_restarted(Owner(A, f"{n:08x}"))
    assert len(b._dead) == DEAD_EPOCHS and Owner(A, f"{DEAD_EPOCHS + 9:08x}") in b._dead


# ------------------------------------------------------------------- config


def write(tmp_path: Path, cluster: dict[str, Any]) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"servers": {"x": {"command": "true"}}, "cluster": cluster}))
    return path


def problems(tmp_path: Path, cluster: dict[str, Any], *argv: str) -> list[str]:
    args = cli.parse_args(["--config", str(write(tmp_path, cluster)), *argv])
    try:
        cli._load(args)
    except ConfigError as exc:
        return exc.problems
    return []


def test_key_file_without_its_trailing_newline(tmp_path: Path) -> None:
    key = tmp_path / "peer.key"
    key.write_text(KEY + "\n")
    old = tmp_path / "old.key"
    old.write_text(OTHER_KEY + "\n")
    config = load(write(tmp_path, {"advertise": A, "peer_key_file": str(key), "previous_peer_key_file": str(old)}))
    assert config.cluster is not None
    assert (config.cluster.peer_key, config.cluster.previous_peer_key) == (KEY, OTHER_KEY)


def test_without_cluster_nothing_changes(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"servers": {"x": {"command": "true"}}}))
    assert load(path).cluster is None
    args = cli.parse_args(["--config", str(path), "--advertise", A])
    with pytest.raises(ConfigError, match="--advertise: needs a cluster block"):
        cli._load(args)


def test_advertise_from_the_command_line(tmp_path: Path) -> None:
    args = cli.parse_args(["--config", str(write(tmp_path, {"peer_key": KEY})), "--advertise", "[fd00::7]:8080"])
    cluster = cli._load(args).cluster
    assert cluster is not None and cluster.advertise == "[fd00::7]:8080"


@pytest.mark.parametrize(
    ("cluster", "argv", "expected"),
    [
        ({"peer_key": KEY}, [], "cluster.advertise: required"),
        ({"peer_key": KEY, "advertise": "10.0.0.7"}, [], "cluster.advertise: expected HOST:PORT"),
        ({"peer_key": KEY}, ["--advertise", "h:99999"], "cluster.advertise: expected HOST:PORT"),
        ({"peer_key": KEY}, ["--advertise", "a b:80"], "cluster.advertise: expected HOST:PORT"),
        ({"advertise": A}, [], "cluster: give 'peer_key' or 'peer_key_file'"),
        ({"advertise": A, "peer_key": "short"}, [], "cluster.peer_key: too short"),
        ({"advertise": A, "peer_key": KEY, "peer_key_file": "/x"}, [], "cluster: give one of 'peer_key' and 'peer_key_file'"),
        ({"advertise": A, "peer_key": KEY, "previous_peer_key": "short"}, [], "cluster.previous_peer_key: too short"),
        ({"advertise": A, "peer_key_file": "/nonexistent/key"}, [], "cluster.peer_key_file: cannot read /nonexistent/key"),
        ({"advertise": A, "peer_key": KEY, "peers": []}, [], "cluster.peers"),
    ],
)
def test_cluster_problems(tmp_path: Path, cluster: dict[str, Any], argv: list[str], expected: str) -> None:
    found = problems(tmp_path, cluster, *argv)
    assert any(p.startswith(expected) or expected in p for p in found), found


def test_a_short_key_file(tmp_path: Path) -> None:
    key = tmp_path / "peer.key"
    key.write_text("short\n")
    found = problems(tmp_path, {"advertise": A, "peer_key_file": str(key)})
    assert found == [f"cluster.peer_key_file: the key in {key} is too short (at least 32 characters)"], found


def test_place_says_where_what_an_owner_holds_is() -> None:
    """The rules ids go by, for a verified owner (an MRTR requestState's)."""
    a = Cluster(A, KEY)
    assert a.place(a.me, forwarded=True) == Local()
    assert a.place(Owner(A, "0" * 8), forwarded=False) == Gone("the replica that owned it has restarted since", "stale", a.epoch)
    b = Owner(B, "1" * 8)
    assert a.place(b, forwarded=False) == Forward(b)
    assert isinstance(second := a.place(b, forwarded=True), Gone) and second.outcome == "second_hop"
    a.owner_restarted(b)
    assert isinstance(dead := a.place(b, forwarded=False), Gone) and dead.outcome == "owner_restarted"


# ------------------------------------------------- what a forward sends (transports/forward.py)


class Recording:
    """Stands in for the forwarder's aiohttp client: keeps the exact headers each request was
    given, and connects nowhere (the owner reads as gone)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    async def request(self, method: str, url: str, *, headers: Any, data: Any, allow_redirects: bool) -> Any:
        self.sent.append((method, url, headers))
        raise aiohttp.ClientConnectionError("no connection in a unit test")


def recording_forwarder() -> tuple[Forwarder, Recording]:
    forwarder = Forwarder(Cluster(A, KEY), ClusterConfig(), tls=False, read_timeout=1.0, counts=Forwarding())
    client = Recording()
    forwarder._client = client  # type: ignore[assignment]
    return forwarder, client


# A client's fields, as a proxy in front of the bridge passes them on: repeats, and fields meant
# for the one connection they came on (RFC 9110, 7.6.1), some of them named by a Connection field.
CLIENT_FIELDS = [
    ("Host", "bridge.example"),
    ("X-Forwarded-For", "198.51.100.7"),
    ("Authorization", "Bearer t"),
    ("Connection", "close, X-Secret"),
    ("x-forwarded-for", "10.0.0.2"),
    ("X-Secret", "s"),
    ("Connection", "X-Other"),  # a second Connection field names more
    ("X-Other", "o"),
    ("Keep-Alive", "timeout=5"),
    ("TE", "trailers"),
    ("Proxy-Authorization", "Basic eDp5"),
    ("Upgrade", "h2c"),
    ("Proxy-Connection", "keep-alive"),
    ("Trailer", "X-T"),
    ("Transfer-Encoding", "chunked"),
    (FORWARDED_HEADER, "203.0.113.9:1"),  # a client's own mark is replaced by the forwarder's
    ("Mcp-Session-Id", "sid"),
    ("Accept", "application/json"),
    ("X-Forwarded-For", "10.0.0.3"),
]
END_TO_END = [
    ("Host", "bridge.example"),
    ("X-Forwarded-For", "198.51.100.7"),
    ("Authorization", "Bearer t"),
    ("x-forwarded-for", "10.0.0.2"),
    (FORWARDED_HEADER, A),
    ("Mcp-Session-Id", "sid"),
    ("Accept", "application/json"),
    ("X-Forwarded-For", "10.0.0.3"),
]


async def test_a_forward_carries_every_end_to_end_field_in_order_and_its_mark() -> None:
    """Each repeat of a field (every proxy's X-Forwarded-For) reaches the owner, in order, in
    the multidict handed to aiohttp's client; none meant for one connection does; and the request
    is marked as forwarded, so the replica it reaches serves it or refuses it, never forwards it."""
    forwarder, client = recording_forwarder()
    request = make_mocked_request("POST", "/servers/demo/mcp", headers=CIMultiDict(CLIENT_FIELDS))
    with pytest.raises(HttpError) as gone:
        await forwarder.forward(request, Owner(B, "1" * 8))
    assert (gone.value.status, gone.value.code) == (404, jsonrpc.SESSION_CLOSED)
    [(method, url, headers)] = client.sent
    assert (method, url) == ("POST", f"http://{B}/servers/demo/mcp")
    assert list(headers.items()) == END_TO_END, list(headers.items())
    assert headers.getall("X-Forwarded-For") == ["198.51.100.7", "10.0.0.2", "10.0.0.3"]


async def test_a_forwarded_retry_carries_every_end_to_end_field_in_order_and_its_mark() -> None:
    """As a forward, from the fields either HTTP path's reply gives; the body is encoded again,
    so its own framing, coding and expectation go, and its type is JSON."""
    forwarder, client = recording_forwarder()
    body_fields = [("Content-Length", "99"), ("Content-Encoding", "gzip"), ("Expect", "100-continue"), ("Content-Type", "text/plain")]
    reply: Any = None  # not reached: the owner is gone before any answer
    with pytest.raises(HttpError) as gone:
        await forwarder.retry(Owner(B, "1" * 8), "demo", CIMultiDict(CLIENT_FIELDS + body_fields), b"{}", reply, 7, 1 << 20)
    assert (gone.value.status, gone.value.code, gone.value.request_id) == (400, jsonrpc.INVALID_PARAMS, 7)
    [(method, url, headers)] = client.sent
    assert (method, url) == ("POST", f"http://{B}/servers/demo/mcp")
    assert list(headers.items()) == [*END_TO_END, ("Content-Type", "application/json")], list(headers.items())
