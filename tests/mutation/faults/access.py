"""Faults in the access rules: tokens and the guard, OAuth, views and rate limits."""

from __future__ import annotations

from faults.fault import Fault

TESTS = {
    'bridge/access/guard.py': ('tests/daemon/test_security.py', 'tests/unit/test_oauth_unit.py'),
    'bridge/access/oauth.py': ('tests/unit/test_oauth_unit.py',),
    'bridge/access/policy.py': ('tests/unit/test_policy_unit.py', 'tests/daemon/test_principals.py'),
}

FAULTS = [
    Fault('sec-preflight-skips-host', 'bridge/access/guard.py', 'if not guard.host_allowed(host):', 'if not preflight and not guard.host_allowed(host):'),
    Fault('sec-host-cache-unbounded', 'bridge/access/guard.py', '                self._hosts.clear()', '                pass'),
    Fault('sec-scheme-case-sensitive', 'bridge/access/guard.py', 'scheme.lower() == "bearer"', 'scheme == "Bearer"'),
    Fault('sec-first-match-returns', 'bridge/access/guard.py', '                found = principal', '                return principal'),
    Fault('sec-no-host-refused', 'bridge/access/guard.py', '        if host is None:\n            return True', '        if host is None:\n            return False'),
    Fault('sec-public-ignores-allowed-hosts', 'bridge/access/guard.py', '            return not self.allowed_hosts', '            return True'),
    Fault('sec-host-with-port-not-listed', 'bridge/access/guard.py', 'if host.lower() in self.allowed_hosts or name in self.allowed_hosts:', 'if name in self.allowed_hosts:'),
    Fault('sec-allowed-hosts-case', 'bridge/access/guard.py', 'frozenset(h.lower() for h in sec.allowed_hosts)', 'frozenset(sec.allowed_hosts)'),
    Fault('sec-origin-any-scheme', 'bridge/access/guard.py', 'bool(sep) and scheme in ("http", "https") and', 'bool(sep) and'),
    Fault('sec-public-loopback-origin', 'bridge/access/guard.py', '        if not self.loopback:\n            return False\n', ''),
    Fault('sec-ipv6-bracket', 'bridge/access/guard.py', 'host[1 : host.find("]")]', 'host[1:-1]'),
    Fault('sec-port-not-digits', 'bridge/access/guard.py', 'if sep and port.isdigit() and', 'if sep and'),
    Fault('sec-preflight-needs-token', 'bridge/access/guard.py', 'if preflight or not guard.authenticating:', 'if not guard.authenticating:'),
    Fault('sec-no-server-checked', 'bridge/access/guard.py', 'if server is not None and not principal.may_use(server):', 'if not principal.may_use(server):'),
    Fault('sec-token-kinds-swapped', 'bridge/access/guard.py', '"invalid_token" if authorization is not None else "missing_token"', '"missing_token" if authorization is not None else "invalid_token"'),
    Fault('sec-cors-for-any-origin', 'bridge/access/guard.py', 'if origin is None or not guard.origin_allowed(origin):', 'if origin is None:'),
    Fault('sec-host-cache-wrong-after-clear', 'bridge/access/guard.py', '                self._hosts.clear()', '                self._hosts.clear()\n                return True'),
    Fault('sec-origin-none-checked', 'bridge/access/guard.py', 'if origin is not None and not guard.origin_allowed(origin):', 'if not guard.origin_allowed(origin):', equivalent='origin_allowed(None) is True, so the None test in admit only saves a call'),
    Fault('sec-token-spaces-kept', 'bridge/access/guard.py', '    token = token.strip()\n', ''),
    Fault('sec-unseen-principal-may-use-all', 'bridge/access/guard.py', '        return self._signed_in.get(principal, frozenset())', '        return self._signed_in.get(principal)'),
    Fault('sec-signed-in-unbounded', 'bridge/access/guard.py', '        if len(signed_in) > SIGNED_IN_KEPT:', '        if False:'),
    Fault('sec-signed-in-newest-forgotten', 'bridge/access/guard.py', '        signed_in.pop(identity.name, None)  # the newest last: the oldest give way\n', ''),
    Fault('sec-forbidden-server-as-401', 'bridge/access/guard.py', 'return Refusal(403, "forbidden_server"', 'return Refusal(401, "forbidden_server"'),
    Fault('oauth-cache-outlives-exp', 'bridge/access/oauth.py', 'identity.expires <= self._wall()', 'identity.expires + 3600 <= self._wall()'),
    Fault('oauth-active-truthy', 'bridge/access/oauth.py', 'claims.get("active") is True', 'claims.get("active")'),
    Fault('oauth-active-ignored', 'bridge/access/oauth.py', 'claims.get("active") is True and ', ''),
    Fault('pol-deny-ignored', 'bridge/access/policy.py', '        if self.deny is not None and self.deny.match(name):\n            return False\n', ''),
    Fault('pol-empty-allow-all', 'bridge/access/policy.py', 'or "(?!)")', 'or "")'),
    Fault('pol-glob-prefix', 'bridge/access/policy.py', 'f"(?:{fnmatch.translate(p)})"', 'f"(?:{fnmatch.translate(p).removesuffix(chr(92) + chr(90))})"'),
    Fault('pol-glob-case', 'bridge/access/policy.py', 'return re.compile(', 'return re.compile(flags=re.IGNORECASE, pattern='),
    Fault('pol-narrowing-ignored', 'bridge/access/policy.py', '            specs.append(narrowing[i][server_name])', '            pass'),
    Fault('pol-narrowing-kind-mixed', 'bridge/access/policy.py', 'if narrowing is not None and server_name in narrowing[i]:\n            specs.append(narrowing[i][server_name])', 'if narrowing is not None and server_name in narrowing[0]:\n            specs.append(narrowing[0][server_name])'),
    Fault('pol-non-string-hidden', 'bridge/access/policy.py', '        if not isinstance(name, str):\n            return True', '        if not isinstance(name, str):\n            return False'),
    Fault('pol-token-rule-ignored', 'bridge/access/policy.py', 'rule = self._rules.get(principal, self._default) if principal is not None else self._default', 'rule = self._default'),
    Fault('pol-in-flight-plus-one', 'bridge/access/policy.py', 'self._in_flight[principal] + calls > rule.in_flight', 'self._in_flight[principal] + calls >= rule.in_flight'),
    Fault('pol-batch-counts-one', 'bridge/access/policy.py', 'self._in_flight[principal] + calls > rule.in_flight', 'self._in_flight[principal] + 1 > rule.in_flight'),
    Fault('pol-burst-one', 'bridge/access/policy.py', 'burst = rule.burst or max(1, int(rule.per_second))', 'burst = rule.burst or 1'),
    Fault('pol-retry-after-inverted', 'bridge/access/policy.py', 'wait = max(1, math.ceil(missing / rule.per_second))', 'wait = max(1, math.ceil(missing * rule.per_second))'),
    Fault('pol-refusals-uncounted', 'bridge/access/policy.py', '        self._refused[principal, "rate"] += calls\n', ''),
]  # fmt: skip
