"""Hand-made faults in the access, config, JSON-RPC, routing and filter/rate-limit rules: does any test catch each?

Each fault is a textual patch (one exact, unique snippet replaced) applied alone
to a copy of the tree; the tests of the faulty module then run against that copy
(`-x`: the first failure kills the fault). A fault that every test passes
survived: a real bug that would ship green. Some faults are judged equivalent
(no behaviour anyone can observe changes); they are run and listed apart, with why.

    PYTHONPATH=$PWD .venv/bin/python tests/mutation/run.py [--baseline REV] [NAME ...]

`--baseline REV` runs the same faults against the tests as they were at REV (the
sources stay as they are now), for a before/after count. NAMEs pick faults by
name prefix. Not collected by pytest (its name does not start with `test_`).
A fault whose snippet no longer occurs exactly once stops the run: mend it to
express the same fault against the code as it is (or drop it, saying why).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600.0  # per fault: a fault that hangs the tests counts as killed, and says so

_MUX_TESTS = ("tests/unit/test_mux.py", "tests/unit/test_mux_properties.py", "tests/unit/test_policy_unit.py", "tests/unit/test_mux_states.py")
TESTS = {
    "bridge/access/guard.py": ("tests/daemon/test_security.py",),
    "bridge/config/schema.py": ("tests/unit/test_config.py", "tests/unit/test_policy_unit.py"),
    "bridge/config/load.py": ("tests/unit/test_config.py", "tests/unit/test_policy_unit.py"),
    "bridge/protocol/jsonrpc.py": ("tests/unit/test_jsonrpc.py", "tests/unit/test_mux.py", "tests/unit/test_mux_properties.py"),
    "bridge/core/mux/mux.py": _MUX_TESTS,
    "bridge/core/mux/peer.py": _MUX_TESTS,
    "bridge/core/mux/shared.py": _MUX_TESTS,
    "bridge/core/mux/notices.py": _MUX_TESTS,
    "bridge/core/mux/turns.py": _MUX_TESTS,
    "bridge/core/mux/views.py": _MUX_TESTS,
    "bridge/core/mux/states.py": _MUX_TESTS,
    "bridge/core/mux/attribution.py": _MUX_TESTS,
    "bridge/http/access.py": ("tests/daemon/test_security.py", "tests/daemon/test_app.py"),
    "bridge/access/policy.py": ("tests/unit/test_policy_unit.py", "tests/daemon/test_principals.py"),
    "bridge/access/oauth.py": ("tests/unit/test_oauth_unit.py",),
    "bridge/http/forward.py": ("tests/unit/test_cluster.py", "tests/daemon/test_replicas.py"),
    "bridge/http/body.py": ("tests/daemon/test_fastpath.py",),
    "bridge/process/pool.py": ("tests/unit/test_pool_unit.py",),
}


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    module: str
    old: str
    new: str
    equivalent: str = ""  # why no observable behaviour changes, when judged so


LOAD = "bridge/config/load.py"
SEC, CFG, RPC = "bridge/access/guard.py", "bridge/config/schema.py", "bridge/protocol/jsonrpc.py"
# The mux package: the Mux (decisions across tables) and its tables.
MUX, MUX_PEER, MUX_SHARED, MUX_NOTICES = "bridge/core/mux/mux.py", "bridge/core/mux/peer.py", "bridge/core/mux/shared.py", "bridge/core/mux/notices.py"
MUX_TURNS, MUX_VIEWS, MUX_STATES = "bridge/core/mux/turns.py", "bridge/core/mux/views.py", "bridge/core/mux/states.py"
MUX_ATTRIBUTION = "bridge/core/mux/attribution.py"
HTTP, POL = "bridge/http/access.py", "bridge/access/policy.py"
PRI, FWD, BODY = "bridge/access/oauth.py", "bridge/http/forward.py", "bridge/http/body.py"

# The fifteen that survived the first mutation run (issue 11).
ISSUE_11 = [
    Fault("sec-preflight-skips-host", SEC, "if not guard.host_allowed(host):", "if not preflight and not guard.host_allowed(host):"),
    Fault("cfg-token-and-sha256", LOAD, "if sum(source is not None for source in (token.token, token.sha256, token.token_file)) != 1:", "if sum(source is not None for source in (token.token, token.sha256, token.token_file)) == 0:"),
    Fault("cfg-sha256-63-digits", LOAD, 'r"[0-9a-fA-F]{64}"', 'r"[0-9a-fA-F]{63,64}"'),
    Fault("cfg-sha256-65-digits", LOAD, 're.fullmatch(r"[0-9a-fA-F]{64}"', 're.match(r"[0-9a-fA-F]{64}"'),
    Fault("cfg-sha256-not-hex", LOAD, 'r"[0-9a-fA-F]{64}"', 'r"[0-9a-zA-Z]{64}"'),
    Fault("cfg-token-8-enough", LOAD, "len(token.token) < MIN_TOKEN", "len(token.token) < 8"),
    Fault("cfg-token-16-short", LOAD, "len(token.token) < MIN_TOKEN", "len(token.token) <= MIN_TOKEN"),
    Fault("cfg-backoff-equal-refused", LOAD, "server.restart.backoff_initial > server.restart.backoff_max", "server.restart.backoff_initial >= server.restart.backoff_max"),
    Fault("mux-updated-bare-prefix", MUX_SHARED, 'uri.startswith(sub if sub.endswith("/") else sub + "/")', "uri.startswith(sub)"),
    Fault("mux-log-level-exclusive", MUX_PEER, "level >= peer.level", "level > peer.level"),
    Fault("rpc-error-data-null", RPC, '    if data is not None:\n        err["data"] = data', '    err["data"] = data'),
    Fault("rpc-protocol-error-drops-id", RPC, "return error(self.request_id, self.code, self.message)", "return error(None, self.code, self.message)"),
    Fault("sec-host-cache-unbounded", SEC, "                self._hosts.clear()", "                pass"),
    Fault("mux-cancelled-unbounded", MUX, "            self._cancelled.popitem(last=False)", "            pass"),
    Fault("mux-cancelled-forgets-newest", MUX, "self._cancelled.popitem(last=False)", "self._cancelled.popitem(last=True)"),
]  # fmt: skip

# Further faults of the same kinds: off-by-one, swapped condition, dropped branch.
FURTHER = [
    # security.py
    Fault("sec-scheme-case-sensitive", SEC, 'scheme.lower() == "bearer"', 'scheme == "Bearer"'),
    Fault("sec-first-match-returns", SEC, "                found = principal", "                return principal"),
    Fault("sec-no-host-refused", SEC, "        if host is None:\n            return True", "        if host is None:\n            return False"),
    Fault("sec-public-ignores-allowed-hosts", SEC, "            return not self.allowed_hosts", "            return True"),
    Fault("sec-host-with-port-not-listed", SEC, "if host.lower() in self.allowed_hosts or name in self.allowed_hosts:", "if name in self.allowed_hosts:"),
    Fault("sec-allowed-hosts-case", SEC, "frozenset(h.lower() for h in sec.allowed_hosts)", "frozenset(sec.allowed_hosts)"),
    Fault("sec-origin-any-scheme", SEC, 'bool(sep) and scheme in ("http", "https") and', "bool(sep) and"),
    Fault("sec-public-loopback-origin", SEC, "        if not self.loopback:\n            return False\n", ""),
    Fault("sec-ipv6-bracket", SEC, 'host[1 : host.find("]")]', "host[1:-1]"),
    Fault("sec-port-not-digits", SEC, "if sep and port.isdigit() and", "if sep and"),
    Fault("sec-preflight-needs-token", SEC, "if preflight or not guard.authenticating:", "if not guard.authenticating:"),
    Fault("sec-no-server-checked", SEC, "if server is not None and not principal.may_use(server):", "if not principal.may_use(server):"),
    Fault("sec-token-kinds-swapped", SEC, '"invalid_token" if authorization is not None else "missing_token"', '"missing_token" if authorization is not None else "invalid_token"'),
    # The HTTP side of the access rules (http/access.py): the preflight
    # answer given before the Host is looked at (only the daemon tests see it), an OPTIONS
    # without Origin taken for a preflight, the probes guarded.
    Fault("sec-preflight-before-checks", HTTP, "    result = admit(", "    if preflight and guard.origin_allowed(origin):\n        return Access(None, True)\n    result = admit("),
    Fault("sec-options-without-origin-open", HTTP, 'preflight = origin is not None and method == "OPTIONS"', 'preflight = method == "OPTIONS"'),
    Fault("sec-probes-guarded", HTTP, "if request.path not in OPEN_PATHS and not request.path.startswith(WELL_KNOWN):", "if True:"),
    Fault("sec-cors-for-any-origin", SEC, "if origin is None or not guard.origin_allowed(origin):", "if origin is None:"),
    Fault("sec-host-cache-wrong-after-clear", SEC, "                self._hosts.clear()", "                self._hosts.clear()\n                return True"),
    Fault("sec-origin-none-checked", SEC, "if origin is not None and not guard.origin_allowed(origin):", "if not guard.origin_allowed(origin):",
          equivalent="origin_allowed(None) is True, so the None test in admit only saves a call"),
    # config.py
    Fault("cfg-zero-duration-refused", CFG, "if value.__class__ in (int, float) and value >= 0:", "if value.__class__ in (int, float) and value > 0:"),
    Fault("cfg-negative-duration", CFG, "if value.__class__ in (int, float) and value >= 0:", "if value.__class__ in (int, float):"),
    Fault("cfg-kb-is-kib", CFG, '"KB": 1000,', '"KB": 1024,'),
    Fault("cfg-gb-is-gib", CFG, '"GB": 10**9,', '"GB": 1024**3,'),
    Fault("cfg-minutes-are-seconds", CFG, '"m": 60.0,', '"m": 1.0,'),
    Fault("cfg-escape-kept", LOAD, "return match.group(0)[1:]", "return match.group(0)"),
    Fault("cfg-empty-default-missing", LOAD, "        if default is not None:\n            return default", "        if default:\n            return default"),
    Fault("cfg-list-var-path", LOAD, 'return [_interpolate(v, f"{path}[{i}]", environ, problems)', "return [_interpolate(v, path, environ, problems)"),
    Fault("cfg-non-string-keys", LOAD, '                problems.append(f"{_join(path, key)}: keys must be strings")\n', "                pass\n"),
    Fault("cfg-required-not-checked", LOAD, "        elif info.required:", "        elif False:"),
    Fault("cfg-name-65-chars", CFG, "[A-Za-z0-9_.-]{0,63}$", "[A-Za-z0-9_.-]{0,64}$"),
    Fault("cfg-blank-command", LOAD, "if not server.command.strip():", "if not server.command:"),
    Fault("cfg-duplicate-names", LOAD, "    seen.add(token.name)\n", ""),
    Fault("cfg-star-is-unknown", LOAD, 'if server_name != "*" and server_name not in config.servers:', "if server_name not in config.servers:"),
    Fault("cfg-metrics-path-relative", LOAD, 'if not config.metrics.path.startswith("/") or', "if"),
    Fault("cfg-dot-localhost", CFG, 'if host == "localhost" or host.endswith(".localhost"):', 'if host == "localhost":'),
    Fault("cfg-zero-positive", CFG, "PositiveInt = Annotated[int, msgspec.Meta(ge=1)]", "PositiveInt = Annotated[int, msgspec.Meta(ge=0)]"),
    Fault("cfg-yaml-line-zero-based", LOAD, "mark.line + 1", "mark.line"),
    Fault("cfg-unauthenticated-ignored", LOAD, "security.oauth is not None or security.allow_unauthenticated or", "security.oauth is not None or"),
    # jsonrpc.py
    Fault("rpc-bool-id", RPC, "return cls is int or cls is str", "return isinstance(value, (int, str))"),
    Fault("rpc-null-params-refused", RPC, "if params is not None and params.__class__ is not dict:", "if params.__class__ is not dict:"),
    Fault("rpc-result-and-error", RPC, 'if ("result" in msg) == ("error" in msg):', 'if "result" not in msg and "error" not in msg:'),
    Fault("rpc-unsafe-id", RPC, """raise ProtocolError(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"', _safe_id(rid))""", """raise ProtocolError(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"', rid)"""),
    Fault("rpc-sniff-quotes-kept", RPC, "return raw[1:-1].decode(", "return raw.decode("),
    Fault("rpc-sniff-head-only", RPC, "match = _LEADING_ID.match(head) or _TRAILING_ID.search(tail)", "match = _LEADING_ID.match(head)"),
    Fault("rpc-sniff-id-prefix", RPC, '''(-?\\d+|"[^"\\\\]*")\\s*[,}]')''', '''(-?\\d+|"[^"\\\\]*")')'''),
    Fault("rpc-empty-params-dropped", RPC, '    msg: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}\n    if params is not None:', '    msg: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}\n    if params:'),
    # mux.py
    Fault("mux-inflight-limit-plus-one", MUX, "len(peer.calls) >= self.max_inflight", "len(peer.calls) > self.max_inflight"),
    Fault("mux-unsubscribe-last-kept", MUX, "len(subscribers) > 1:", "len(subscribers) >= 1:"),
    Fault("mux-level-always-forwarded", MUX, "        if wanted == self._levels.upstream:\n            return [self._reply(peer, msg[\"id\"], {})]\n", ""),
    Fault("mux-cancel-not-remembered", MUX, "        self._remember_cancelled(call.upstream_id)\n        msg[\"params\"]", "        msg[\"params\"]"),
    # A call cancelled upstream by the bridge (its session closed, a timeout, shutdown) not remembered.
    Fault("mux-upstream-cancel-not-remembered", MUX, "        self._remember_cancelled(call.upstream_id)\n        return ToServer(", "        return ToServer("),
    Fault("mux-held-answer-accepted", MUX, "if call is None or not call.sent:  # a call still held back", "if call is None:  # a call still held back"),
    Fault("mux-unset-level-filtered", MUX_PEER, "return level is None or peer.level is None or level >= peer.level", "return level is None or peer.level is not None and level >= peer.level"),
    Fault("mux-unknown-level-hidden", MUX, "len(LOG_LEVELS) if level is None else level", "0 if level is None else level"),
    Fault("mux-updated-exact-uri-ignored", MUX_SHARED, "if uri == sub or uri.startswith(", "if uri.startswith("),
    Fault("mux-updated-slash-doubled", MUX_SHARED, 'uri.startswith(sub if sub.endswith("/") else sub + "/")', 'uri.startswith(sub + "/")'),
    Fault("mux-least-verbose-level", MUX_SHARED, "return min(levels) if levels else None", "return max(levels) if levels else None"),
    Fault("mux-level-kept-on-close", MUX, "        if peer.level is not None:\n            out += self._sync_level()\n", ""),
    Fault("mux-failed-becomes-down", MUX_STATES, '"exited": _FAILED, "failed": _FAILED},', '"exited": _DOWN, "failed": _FAILED},'),
    Fault("mux-stateless-asked-during-any-call", MUX, "if peer.state is _STATELESS and call is not None and call.method not in MRTR_METHODS:", "if False:"),
    Fault("mux-states-illegal-pair-kept", MUX_STATES, "        raise IllegalTransition(f\"{event!r} in state {state.name}\") from None", "        return state"),
    Fault("mux-states-peer-readopted", MUX_STATES, "    PeerState.READY: {\"initialized\": PeerState.READY},", "    PeerState.READY: {\"initialized\": PeerState.READY, \"adopted\": PeerState.STATELESS},"),
    Fault("mux-backlog-not-marked-sent", MUX, "                call.sent = True\n                call.sent_at = self._clock()\n        out: list[Action] = [ToServer(m) for m in backlog]", "                call.sent_at = self._clock()\n        out: list[Action] = [ToServer(m) for m in backlog]"),
    Fault("mux-least-recent-session", MUX_ATTRIBUTION, "return max(candidates, key=lambda p: p.last_active), None", "return min(candidates, key=lambda p: p.last_active), None"),
    Fault("mux-sampling-tools-ignored", MUX_PEER, 'if ("tools" in params or "toolChoice" in params) and "tools" not in cap:', "if False:"),
    Fault("mux-sampling-context-ignored", MUX_PEER, 'return params.get("includeContext", "none") == "none" or "context" in cap', 'return params.get("includeContext", "none") == "none"'),
    Fault("mux-url-elicitation-anywhere", MUX_PEER, 'if wanted == "elicitation" and params.get("mode") == "url":', "if False:"),
    Fault("mux-progress-after-cancel-noisy", MUX, ' if token not in self._cancelled else []', ""),
    Fault("mux-server-id-reuse", MUX, "        if server_id in self._server_request_ids:\n", "        if False:\n"),
    Fault("mux-server-cancel-kept", MUX, "        req = self._server_requests[downstream_id]\n        self._forget_server_request(req)\n", "        req = self._server_requests[downstream_id]\n"),
    Fault("mux-any-session-can-answer", MUX, "self._can_answer(peer, not ASKABLE.isdisjoint(peer.capabilities))", "self._can_answer(peer, True)"),
    Fault("mux-roots-prompt-with-own-roots", MUX, 'if self.roots is None and "roots" in peer.capabilities:', 'if "roots" in peer.capabilities:'),
    Fault("mux-down-unsubscribe-sent", MUX, "        del self._subscriptions.by_uri[uri]\n        peer.subscriptions.discard(uri)\n        if self.state is not _READY:\n            return [*self._unsubscribe_queued(uri), self._reply(peer, msg[\"id\"], {})]\n", "        del self._subscriptions.by_uri[uri]\n        peer.subscriptions.discard(uri)\n"),
    Fault("mux-task-list-unfiltered", MUX, 'result["tasks"] = [t for t in result["tasks"] if t.__class__ is dict and t.get("taskId") in peer.tasks]', "pass"),
    Fault("mux-version-newer-than-server", MUX, "PROTOCOL_VERSIONS.index(client_version) > PROTOCOL_VERSIONS.index(", "PROTOCOL_VERSIONS.index(client_version) < PROTOCOL_VERSIONS.index("),
    Fault("mux-version-tie", MUX, "PROTOCOL_VERSIONS.index(client_version) > PROTOCOL_VERSIONS.index(", "PROTOCOL_VERSIONS.index(client_version) >= PROTOCOL_VERSIONS.index(",
          equivalent="on a tie the client's and the server's version are the same string"),
    Fault("mux-cancelled-kept-across-restart", MUX, "        self._cancelled.clear()\n", "",
          equivalent="upstream ids come from one counter and are never reused, so ids of a dead process can match no new reply; only memory (bounded) differs"),
    Fault("mux-timeout-at-the-instant", MUX, "            if call.started >= deadline:\n                continue", "            if call.started > deadline:\n                continue",
          equivalent="differs only when a call is exactly `timeout` old on a float clock; either reading of 'after timeout seconds' is right"),
]  # fmt: skip

# Faults in what was added since: principals, filters and views, turns, bounds, secret files, OAuth.
SINCE = [
    # mux.py: held calls take turns by principal (rule 4)
    Fault("mux-turns-first-come", MUX_TURNS, "return min(self._queues, key=lambda p: self._served.get(p, -1))", "return next(iter(self._queues))"),
    Fault("mux-turns-most-recent", MUX_TURNS, "return min(self._queues, key=lambda p: self._served.get(p, -1))", "return max(self._queues, key=lambda p: self._served.get(p, -1))"),
    Fault("mux-turns-never-served", MUX, "        self._held.served(self._peers[caller(call)[0]].principal)\n", ""),
    Fault("mux-turns-lifo", MUX_TURNS, "msg = queue.popleft()", "msg = queue.pop()"),
    Fault("mux-turns-remove-miscounts", MUX_TURNS, "                    del queue[i]\n                    self.waiting -= 1\n", "                    del queue[i]\n"),
    Fault("mux-turns-forgets-live-principal", MUX, "        if left:\n            self._by_principal[principal] = left\n        else:", "        self._held.forget(principal)\n        if left:\n            self._by_principal[principal] = left\n        else:"),
    Fault("mux-turns-remembered-forever", MUX, "            self._held.forget(principal)\n", "            pass\n"),
    # mux.py: notifications nothing owns, and requests about no call (rules 4 and 6)
    Fault("mux-busy-counts-held-calls", MUX, "            if call.sent and call.session is not None:", "            if call.session is not None:"),
    Fault("mux-unowned-across-principals", MUX, "        if len(busy) > 1:\n            return [Discard(", "        if False:\n            return [Discard("),
    Fault("mux-unowned-ignores-busy", MUX, "if p.state is not _OPEN and (not busy or p.principal in busy) and", "if p.state is not _OPEN and"),
    Fault("mux-unowned-to-uninitialized", MUX, "            if p.state is not _OPEN and (not busy or p.principal in busy)", "            if (not busy or p.principal in busy)"),
    Fault("mux-no-call-across-principals", MUX_ATTRIBUTION, "    if len({p.principal for p in candidates}) != 1:", "    if not candidates:"),
    Fault("mux-no-call-ignores-capability", MUX_ATTRIBUTION, "if p.state is _READY and (wanted is None or can_handle(p.capabilities, wanted, msg))", "if p.state is _READY"),
    # mux.py: filters and views
    Fault("mux-hidden-probe-keeps-params", MUX, 'msg["method"], msg["params"] = probe.method, jsonrpc.decode(probe.params)', 'msg["method"], msg["params"] = probe.method, {**msg["params"], **jsonrpc.decode(probe.params)}'),
    Fault("mux-hidden-always-probes", MUX, "        template = self._unknown.get(probe)", "        template = None"),
    Fault("mux-hidden-name-not-put-back", MUX, "msg.update(jsonrpc.decode(template.replace(probe.name, views.escaped(name))))", "msg.update(jsonrpc.decode(template))"),
    Fault("mux-hidden-name-unescaped", MUX, "answer = jsonrpc.decode(template.replace(probe.name, views.escaped(name)))", "answer = jsonrpc.decode(template.replace(probe.name, name.encode()))"),
    Fault("mux-hidden-probe-not-marked", MUX, "call.hidden, call.target, call.method = (name, probe), target, method", "call.target, call.method = target, method"),
    Fault("mux-hidden-completion-unchecked", MUX_VIEWS, '    "completion/complete": {\n', '    "completion/completes": {\n'),
    Fault("mux-hidden-ref-type-ignored", MUX_VIEWS, "named, params = refs.get(of), ref", 'named, params = refs["ref/prompt"], ref'),
    Fault("mux-hidden-unsubscribe-forwarded", MUX_VIEWS, '    "resources/unsubscribe": Named("resources", "uri", None),\n', ""),
    Fault("mux-hidden-unsubscribe-kept", MUX, "        peer.subscriptions.discard(uri)\n        return [*self._drop_subscriber(uri, peer.id)", "        return [*self._drop_subscriber(uri, peer.id)"),
    Fault("mux-list-unfiltered", MUX_VIEWS, "        result[field] = [item for item in items if not isinstance(item, dict) or view.admits(kind, item.get(key))]", "        pass"),
    Fault("mux-templates-by-uri", MUX_VIEWS, '"resources/templates/list": ("resourceTemplates", "resources", "uriTemplate"),', '"resources/templates/list": ("resourceTemplates", "resources", "uri"),'),
    Fault("mux-updated-ignores-view", MUX, 'visible = tuple(sid for sid in targets if (view := peers[sid].view) is None or view.admits("resources", uri))', "visible = tuple(targets)"),
    # mux.py: subscriptions and the backlog
    Fault("mux-unsubscribe-queued-still-sent", MUX, "            self._forget_call(call)\n            self._unqueue(call)\n            session, client_id = caller(call)", "            self._forget_call(call)\n            session, client_id = caller(call)"),
    Fault("mux-unsubscribe-queued-unanswered", MUX, "            out.append(ToSession(session, jsonrpc.result(client_id, {}), client_id, True, call))\n        return out", "        return out"),
    Fault("mux-unsubscribe-while-down-queued", MUX, '        if self.state is not _READY:\n            return [*self._unsubscribe_queued(uri), self._reply(peer, msg["id"], {})]\n', ""),
    Fault("mux-subscriptions-limit-plus-one", MUX, "len(peer.subscriptions) >= self.max_subscriptions", "len(peer.subscriptions) > self.max_subscriptions"),
    Fault("mux-resubscribe-counts", MUX, "if self.max_subscriptions and uri not in peer.subscriptions and", "if self.max_subscriptions and"),
    Fault("mux-backlog-limit-plus-one", MUX, "len(self._backlog) + self._for_slot.waiting >= self.max_backlog", "len(self._backlog) + self._for_slot.waiting > self.max_backlog"),
    Fault("mux-backlog-notifications-unbounded", MUX, "        if self._backlog_full():\n            return [Discard(", "        if False:\n            return [Discard("),
    Fault("mux-failed-notifications-queued", MUX, "        if self.state is _FAILED:\n            return []\n        if self._backlog_full():", "        if self._backlog_full():"),
    # mux.py: not_written, early task notes, calls in flight by principal
    Fault("mux-not-written-holds-turn", MUX, "return self._settle([self._fail(call, jsonrpc.SERVER_BUSY, reason)])", "return [self._fail(call, jsonrpc.SERVER_BUSY, reason)]"),
    Fault("mux-not-written-own-call-kept", MUX, "        if call.session is None:\n            self._forget_call(call)\n            return [Discard(f\"the bridge's", "        if call.session is None:\n            return [Discard(f\"the bridge's"),
    Fault("mux-early-notes-dropped", MUX, "and self._owner_of(msg) is None and self._task_call_in_flight():", "and self._owner_of(msg) is None and False:"),
    Fault("mux-early-notes-unbounded", MUX_NOTICES, "        if self._early_count > EARLY_NOTES:", "        if False:"),
    Fault("mux-early-notes-drop-newest", MUX_NOTICES, "_, dropped = self._early_notes.popitem(last=False)", "_, dropped = self._early_notes.popitem(last=True)"),
    Fault("mux-early-notes-not-delivered", MUX, "                out = [ToSession(peer.id, note) for note in self._owners.claim_task(peer, task_id)]", "                self._owners.claim_task(peer, task_id)"),
    Fault("mux-early-notes-miscounted", MUX_NOTICES, "        self._early_count -= len(early)\n", ""),
    Fault("mux-early-notes-kept-forever", MUX, "        if self._owners.has_early() and not self._task_call_in_flight():", "        if False:"),
    Fault("mux-in-flight-not-counted", MUX, "        in_flight[peer.principal] = in_flight.get(peer.principal, 0) + 1  # not `+=`: Counter's __missing__ is Python\n", ""),
    Fault("mux-in-flight-zero-kept", MUX, "        if left:\n            in_flight[principal] = left\n        else:\n            in_flight.pop(principal)  # not `del`: Counter's __delitem__ is Python\n", "        in_flight[principal] = left\n"),
    Fault("mux-in-flight-anonymous", MUX, "call = Call(peer.id, client_id, upstream_id, method, self._clock(), principal=peer.principal)", "call = Call(peer.id, client_id, upstream_id, method, self._clock())"),
    # config.py
    Fault("cfg-token-file-8-enough", LOAD, "if len(secret) < MIN_TOKEN:", "if len(secret) < 8:"),
    Fault("cfg-token-file-not-stripped", LOAD, "return _read_secret_file(path).strip()", "return _read_secret_file(path)"),
    Fault("cfg-file-var-newline-kept", LOAD, 'return _read_secret_file(file).rstrip("\\r\\n")', "return _read_secret_file(file)"),
    Fault("cfg-file-var-is-dash-default", LOAD, "file:([^}-][^}]*)", "file:([^}]+)"),
    Fault("cfg-secret-file-any-kind", LOAD, "if not stat.S_ISREG(os.fstat(fd).st_mode):", "if False:"),
    Fault("cfg-secret-file-nul", LOAD, 'if "\\0" in text:', "if False:"),
    Fault("cfg-secret-file-size-inclusive", LOAD, "if len(data) > SECRET_FILE_MAX:", "if len(data) >= SECRET_FILE_MAX:"),
    Fault("cfg-token-name-url", LOAD, 'if "://" in token.name:', "if False:"),
    Fault("cfg-token-filter-unknown-server", LOAD, "            if server_name not in config.servers:", "            if False:"),
    Fault("cfg-oauth-url-query", LOAD, "and bool(parts.netloc) and not parts.query and not parts.fragment", "and bool(parts.netloc)"),
    Fault("cfg-oauth-url-any-scheme", LOAD, 'return parts.scheme in ("http", "https") and', "return"),
    Fault("cfg-oauth-no-servers", LOAD, "    if not oauth.authorization_servers:", "    if False:"),
    Fault("cfg-oauth-no-algorithms", LOAD, "        if not server.algorithms:", "        if False:"),
    Fault("cfg-introspection-both-secrets", LOAD, "(intro.client_secret is None) == (intro.client_secret_file is None)", "intro.client_secret is None and intro.client_secret_file is None"),
    Fault("cfg-scope-star-unknown", LOAD, 'if name != "*" and name not in config.servers:', "if name not in config.servers:"),
    Fault("cfg-oauth-not-auth", LOAD, "security.tokens or security.oauth is not None or", "security.tokens or"),
    Fault("cfg-trusted-proxy-strict", LOAD, "ipaddress.ip_network(proxy, strict=False)", "ipaddress.ip_network(proxy, strict=True)"),
    Fault("cfg-input-buffer-unchecked", LOAD, "    if limits.input_buffer() < limits.max_message_bytes:", "    if False:"),
    Fault("cfg-input-buffer-default", CFG, "else 16 * self.max_message_bytes", "else self.max_message_bytes"),
    Fault("cfg-env-pattern-unanchored", CFG, '[A-Za-z0-9_]*\\*?$")', '[A-Za-z0-9_]*\\*?")'),
    Fault("cfg-roots-any-scheme", LOAD, 'if not root.startswith("file://"):', "if False:"),
    # jsonrpc.py
    Fault("rpc-sniff-trailing-unanchored", RPC, '''(-?\\d+|"[^"\\\\]*")\\s*\\}\\s*$')''', '''(-?\\d+|"[^"\\\\]*")\\s*\\}')'''),
    Fault("rpc-sniff-jsonrpc-first", RPC, '''(?:"jsonrpc"\\s*:\\s*"2\\.0"\\s*,\\s*)?''', ""),
    Fault("rpc-sniff-negative", RPC, '''"id"\\s*:\\s*(-?\\d+|"[^"\\\\]*")\\s*[,}]')''', '''"id"\\s*:\\s*(\\d+|"[^"\\\\]*")\\s*[,}]')'''),
    Fault("rpc-sniff-escapes", RPC, '''"id"\\s*:\\s*(-?\\d+|"[^"\\\\]*")\\s*[,}]')''', '''"id"\\s*:\\s*(-?\\d+|"[^"]*")\\s*[,}]')'''),
    Fault("rpc-method-not-string", RPC, '        if msg["method"].__class__ is not str:', "        if False:"),
    Fault("rpc-response-null-id", RPC, "    if not is_id(rid):\n        raise ProtocolError(INVALID_REQUEST, 'invalid response", "    if False:\n        raise ProtocolError(INVALID_REQUEST, 'invalid response"),
    # security.py
    Fault("sec-token-spaces-kept", SEC, "    token = token.strip()\n", ""),
    Fault("sec-forbidden-server-as-401", SEC, 'return Refusal(403, "forbidden_server"', 'return Refusal(401, "forbidden_server"'),
    # policy.py
    Fault("pol-deny-ignored", POL, "        if self.deny is not None and self.deny.match(name):\n            return False\n", ""),
    Fault("pol-empty-allow-all", POL, 'or "(?!)")', 'or "")'),
    Fault("pol-glob-prefix", POL, 'f"(?:{fnmatch.translate(p)})"', 'f"(?:{fnmatch.translate(p).removesuffix(chr(92) + chr(90))})"'),
    Fault("pol-glob-case", POL, "return re.compile(", "return re.compile(flags=re.IGNORECASE, pattern="),
    Fault("pol-narrowing-ignored", POL, "            specs.append(narrowing[i][server_name])", "            pass"),
    Fault("pol-narrowing-kind-mixed", POL, "if narrowing is not None and server_name in narrowing[i]:\n            specs.append(narrowing[i][server_name])", "if narrowing is not None and server_name in narrowing[0]:\n            specs.append(narrowing[0][server_name])"),
    Fault("pol-non-string-hidden", POL, "        if not isinstance(name, str):\n            return True", "        if not isinstance(name, str):\n            return False"),
    Fault("pol-token-rule-ignored", POL, "rule = self._rules.get(principal, self._default) if principal is not None else self._default", "rule = self._default"),
    Fault("pol-in-flight-plus-one", POL, "self._in_flight[principal] + calls > rule.in_flight", "self._in_flight[principal] + calls >= rule.in_flight"),
    Fault("pol-batch-counts-one", POL, "self._in_flight[principal] + calls > rule.in_flight", "self._in_flight[principal] + 1 > rule.in_flight"),
    Fault("pol-burst-one", POL, "burst = rule.burst or max(1, int(rule.per_second))", "burst = rule.burst or 1"),
    Fault("pol-retry-after-inverted", POL, "wait = max(1, math.ceil(missing / rule.per_second))", "wait = max(1, math.ceil(missing * rule.per_second))"),
    Fault("pol-refusals-uncounted", POL, '        self._refused[principal, "rate"] += calls\n', ""),
]  # fmt: skip

# The four that survived a review's planted faults (issue 30, item 12), and the rules fixed beside them
# (items 1 and 9): checked tokens, introspection, what a forward carries, compressed bodies.
ISSUE_30 = [
    Fault("oauth-cache-outlives-exp", PRI, "identity.expires <= self._wall()", "identity.expires + 3600 <= self._wall()"),
    Fault("oauth-active-truthy", PRI, 'claims.get("active") is True', 'claims.get("active")'),
    Fault("oauth-active-ignored", PRI, 'claims.get("active") is True and ', ""),
    Fault("fwd-connection-named-forwarded", FWD, "skipped = HOP_BY_HOP | connection_named(headers) | dropped", "skipped = HOP_BY_HOP | dropped"),
    Fault("fwd-te-forwarded", FWD, '"proxy-connection", "te", "trailer"', '"proxy-connection", "trailer"'),
    Fault("fwd-not-marked", FWD, "        out[FORWARDED_HEADER] = self.cluster.advertise\n", ""),
    Fault("fwd-last-repeat-only", FWD, "out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in skipped)", "out = CIMultiDict({k: v for k, v in headers.items() if k.lower() not in skipped})"),
    Fault("fwd-owners-connection-named-relayed", FWD, "skipped = _OWN_RESPONSE_HEADERS | connection_named(upstream.headers)", "skipped = _OWN_RESPONSE_HEADERS"),
    Fault("body-bomb-decompressed-whole", BODY, "piece = decoder.decompress(pending, limit + 1 - size)", "piece = decoder.decompress(pending)"),
    Fault("body-truncated-taken", BODY, "    if decoder is None or not decoder.eof:\n        raise _undecodable", "    if decoder is None:\n        raise _undecodable"),
    Fault("body-stacked-codings-decoded-once", BODY, "    if len(codings) > 1 or codings[0] not in _CODINGS:", "    if codings[0] not in _CODINGS:"),
    Fault("body-as-sent-unbounded", BODY, "        if taken > limit:\n", "        if False:\n"),
]  # fmt: skip

# The pool's rules (issue 36), against tests/unit/test_pool_unit.py.
POOL_ = "bridge/process/pool.py"
POOL = [
    # Sessions come before refills by two guards, each enough alone: `changed` refills only
    # when nobody waits, and `refill` starts nothing while anyone does. Without both, the test
    # of a freed slot fails (seen by hand); without one, nothing changes.
    Fault("pool-refill-before-sessions", POOL_, "        if not self.waiters:\n            for pool in list(self.pools):", "        if True:\n            for pool in list(self.pools):",
          equivalent="refill() itself starts nothing while a session waits"),
    Fault("pool-refill-while-waiting", POOL_, " and self.room() and not self.slots.waiters:", " and self.room():",
          equivalent="changed() refills only once nobody waits, and a warm process taken directly leaves no slot a waiting session could use"),
    Fault("pool-last-come-first-served", POOL_, "self.waiters = deque(w for w in self.waiters if not (w.done() or w.serve()))",
          "self.waiters = deque(reversed([w for w in reversed(self.waiters) if not (w.done() or w.serve())]))"),
    Fault("pool-left-client-keeps-process", POOL_, "                self.give_back(future.result())", "                pass"),
    Fault("pool-warm-given-back-stopped", POOL_, "        if member.warm and self.active:", "        if False:"),
    Fault("pool-retry-after-fixed", POOL_, "return max(1, math.ceil(self.settings.wait))", "return 5"),
]  # fmt: skip

FAULTS = ISSUE_11 + FURTHER + SINCE + ISSUE_30 + POOL


def copy_tree(dest: Path, baseline: str | None) -> None:
    """The tracked files as they are now (tests as at `baseline`, if given), plus the node packages."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    if baseline is not None:
        shutil.rmtree(dest / "tests")
        archive = subprocess.run(["git", "archive", baseline, "tests"], cwd=ROOT, check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    modules = ROOT / "tests" / "node" / "node_modules"
    if modules.exists():
        (dest / "tests" / "node").mkdir(parents=True, exist_ok=True)
        (dest / "tests" / "node" / "node_modules").symlink_to(modules.resolve())


def run_tests(tree: Path, files: tuple[str, ...]) -> tuple[str, str]:
    """'passed', 'failed' or 'timeout', and the first failing test's line (or why nothing ran)."""
    present = [f for f in files if (tree / f).exists()]
    if not present:
        return "passed", "no tests"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", "--hypothesis-seed=0", *present]
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {TIMEOUT:.0f}s"
    finally:
        shutil.rmtree(tree / ".hypothesis", ignore_errors=True)  # no example replayed from another fault
    if done.returncode == 0:
        return "passed", ""
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if done.returncode != 1 or not failed:
        return "failed", f"pytest exit {done.returncode}: {done.stdout.strip().splitlines()[-1:] or done.stderr[-200:]}"
    return "failed", failed[0][:160]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", metavar="REV", help="run the tests as they were at this git revision")
    parser.add_argument("names", nargs="*", help="only the faults whose name starts with one of these")
    args = parser.parse_args()
    faults = [f for f in FAULTS if not args.names or f.name.startswith(tuple(args.names))]
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, args.baseline)
        for module in sorted({f.module for f in faults}):
            outcome, detail = run_tests(tree, TESTS[module])
            if outcome != "passed":
                print(f"the unchanged {module} fails its own tests: {detail}", file=sys.stderr)
                return 2
        survivors: list[Fault] = []
        killed = 0
        for fault in faults:
            path = tree / fault.module
            original = path.read_text()
            if original.count(fault.old) != 1:
                print(f"{fault.name}: its snippet occurs {original.count(fault.old)} times in {fault.module}", file=sys.stderr)
                return 2
            path.write_text(original.replace(fault.old, fault.new))
            started = time.monotonic()
            try:
                outcome, detail = run_tests(tree, TESTS[fault.module])
            finally:
                path.write_text(original)
            verdict = "survived" if outcome == "passed" else "killed" if outcome == "failed" else "killed (timeout)"
            print(f"{verdict:<16} {fault.name:<36} {time.monotonic() - started:5.1f}s  {detail}", flush=True)
            if outcome == "passed":
                survivors.append(fault)
            else:
                killed += 1
    equivalent = [f for f in survivors if f.equivalent]
    real = [f for f in faults if not f.equivalent]
    print(f"\n{killed} of {len(faults)} faults killed; {len(real) - (len(survivors) - len(equivalent))} of {len(real)} real faults killed")
    for fault in survivors:
        print(f"survivor {fault.name} ({fault.module})" + (f": judged equivalent, {fault.equivalent}" if fault.equivalent else ""))
    return 1 if len(survivors) > len(equivalent) else 0


if __name__ == "__main__":
    sys.exit(main())
