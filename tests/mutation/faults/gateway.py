"""Faults in the gateway: its sessions, placements and processes' glue."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {
    'bridge/gateway/sessions.py': ('tests/unit/test_sessions_unit.py',),
    'bridge/gateway/gateway.py': ('tests/daemon/test_security.py::test_session_belongs_to_its_token', 'tests/daemon/test_security.py::test_max_sessions_503', 'tests/daemon/test_streamable.py::test_a_session_whose_client_holds_a_stream_open_is_never_reaped_as_idle', 'tests/daemon/test_policy.py::test_every_outcome_is_audited_once_without_arguments_or_results', 'tests/daemon/test_operations.py::test_slow_session_logged_once', 'tests/daemon/test_principals.py', 'tests/daemon/test_operators.py', 'tests/daemon/test_drain.py', 'tests/daemon/test_bounds.py', 'tests/daemon/test_pinned_servers.py', 'tests/daemon/test_traces.py'),
    'bridge/gateway/placement.py': (
        'tests/unit/test_placement_unit.py',
        'tests/daemon/test_operations.py::test_readyz_names_a_per_session_server_whose_command_is_missing',
        'tests/daemon/test_pool.py', 'tests/daemon/test_principals.py', 'tests/daemon/test_modern.py',
    ),
    'bridge/gateway/upstream.py': ('tests/daemon/test_modern.py::test_an_answer_names_the_server_that_gave_it_after_a_restart_too', 'tests/daemon/test_bounds.py', 'tests/daemon/test_era.py', 'tests/daemon/test_confine.py', 'tests/daemon/test_supervision.py'),
    'bridge/gateway/pinsfile.py': ('tests/unit/test_pinsfile_unit.py', 'tests/daemon/test_pinned_servers.py'),
    'bridge/gateway/group.py': ('tests/daemon/test_groups.py', 'tests/daemon/test_traces.py::test_a_call_through_a_group_is_traced_under_the_groups_http_request'),
    'bridge/gateway/health.py': (
        'tests/daemon/test_pool.py::test_a_warm_process_is_probed_not_initialized_and_gets_its_sessions_own_initialize',
        'tests/daemon/test_principals.py', 'tests/daemon/test_operators.py', 'tests/daemon/test_pinned_servers.py',
    ),
}

FAULTS: list[Fault] = [
    # group.py
    Fault('gw-mux-answer-span-open', 'bridge/gateway/gateway.py', '                    traces.answered(action.session, action.related, action.message)\n', '                    pass\n'),
    Fault('gw-call-span-open', 'bridge/gateway/gateway.py', '                traces.answered(call.session, call.client_id, answer, sent)\n', '                pass\n'),
    Fault('gw-log-untraced', 'bridge/gateway/gateway.py', '        return traces.fields(traces.ids(session_id, request_id)) if traces is not None else {}', '        return {}'),
    Fault('gw-audit-untraced', 'bridge/gateway/gateway.py', '            if ids is not None and traces is not None:\n                audit = audit.bind(', '            if False:\n                audit = audit.bind('),
    Fault('gw-unsampled-meta-ignored', 'bridge/gateway/gateway.py', '                if http is UNSAMPLED and (\n', '                if http is UNSAMPLED or (\n'),
    Fault('gw-answer-to-asked-unread', 'bridge/gateway/gateway.py', '            elif session.id in traces.asked:\n', '            elif False:\n'),
    Fault('gw-queued-unseen', 'bridge/gateway/gateway.py', '                        self._queued(traces, upstream, message)\n', '                        pass\n'),
    Fault('gw-queued-any-line', 'bridge/gateway/gateway.py', 'if span is not None and (buffered := upstream.buffered()):', 'if span is not None and ((buffered := upstream.buffered()) or True):'),
    Fault('gw-no-exemplar', 'bridge/gateway/gateway.py', '            self.metrics.traced(call.method, time.monotonic() - call.started, *ids)\n', '            pass\n'),
    Fault('gw-stage-unsaid', 'bridge/gateway/gateway.py', '                    traces.waiting(session.id, request_id, why.value)\n', '                    pass\n'),
    Fault('grp-http-span-not-handed-on', 'bridge/gateway/group.py', '            sub.http_trace = joined.client.http_trace  # the span of the HTTP request that carried it\n', '            pass\n'),
    Fault('grp-requests-uncounted', 'bridge/gateway/group.py', '            self.requests[member] += 1\n', '            pass\n'),
    Fault('grp-members-not-filtered-by-token', 'bridge/gateway/group.py', ' and (servers is None or m in servers))', ')'),
    Fault('grp-closed-leaves-members-open', 'bridge/gateway/group.py', '        self._close_members(joined, reason)\n        self.log.info(', '        self.log.info('),
    Fault('grp-crashed-member-calls-wait', 'bridge/gateway/group.py', 'rules.member_gone(sub.server, f"its session ended ({reason})") + ', '', equivalent="a member gateway answers every call of a session before it closes it (its mux's shutdown, end_session's errors, a process's exit), so nothing is left to fail here; kept against a gateway that one day does not"),
    Fault('grp-rewritten-answer-sent-as-it-came', 'bridge/gateway/group.py', 'data if message is came and data else encode(message)', 'data if data else encode(message)'),
    Fault('grp-error-passed-on-unnamed', 'bridge/gateway/group.py', ' and b\'"error"\' not in data and', ' and'),
    Fault('grp-reload-keeps-leavers', 'bridge/gateway/group.py', '            for member in [m for m in joined.rules.names.members if m not in allowed]:', '            for member in []:'),
    Fault('grp-reload-adds-none', 'bridge/gateway/group.py', '                self._spawn(self._join(joined, member, allowed), f"join:{self.name}:{member}")', '                pass'),
    Fault('grp-no-member-is-a-503', 'bridge/gateway/group.py', '            raise NoMember(f"token not allowed for any server of group {self.name!r}")', '            raise SessionLimitError(f"token not allowed for any server of group {self.name!r}")'),
    Fault('sessions-id-short', 'bridge/gateway/sessions.py', '    return secrets.token_hex(16)  # 128 bits from the OS CSPRNG', '    return secrets.token_hex(4)  # 128 bits from the OS CSPRNG'),
    Fault('spares-unbounded', 'bridge/gateway/sessions.py', '        if self.count >= self.limit:\n            return False', '        if False:\n            return False'),
    Fault('spares-first-kept-taken-first', 'bridge/gateway/sessions.py', '        session = kept.pop()', '        session = kept.pop(0)'),
    Fault('spares-dropped-twice', 'bridge/gateway/sessions.py', '        if kept is not None and session in kept:', '        if kept is not None:'),
    Fault('spares-drop-miscounts', 'bridge/gateway/sessions.py', '                del self._by_kind[kind]\n            self.count -= 1', '                del self._by_kind[kind]'),
    # gateway.py
    Fault('registry-session-of-another-owner', 'bridge/gateway/sessions.py', '        if session is None or session.owner != owner:\n            return None', '        if session is None:\n            return None'),
    Fault('gw-session-limit-ignored', 'bridge/gateway/gateway.py', '        if len(self.sessions) + self._opening >= self.max_sessions:\n            self.metrics.sessions_dropped["limit"] += 1\n            raise', '        if False:\n            self.metrics.sessions_dropped["limit"] += 1\n            raise'),
    Fault('gw-draining-opens-sessions', 'bridge/gateway/gateway.py', 'if not self.accepting or (self.draining and session.addressed):', 'if not self.accepting:'),
    Fault('gw-end-session-calls-unanswered', 'bridge/gateway/gateway.py', '            session.deliver(encode(error), request_id, True)\n', ''),
    Fault('gw-ended-counted-as-other', 'bridge/gateway/gateway.py', '        reason = session.ending or reason\n', ''),
    Fault('gw-restart-no-wait', 'bridge/gateway/gateway.py', '            while (now := time.monotonic()) < deadline:', '            while False:'),
    Fault('gw-attached-reaped-idle', 'bridge/gateway/gateway.py', 'if s.last_seen < idle_before and not s.attached()]', 'if s.last_seen < idle_before]'),
    Fault('gw-drain-closes-calling', 'bridge/gateway/gateway.py', '            if self.session_inflight(session):\n                calling[session] = now\n            elif', '            if False:\n                calling[session] = now\n            elif'),
    Fault('gw-drain-no-follow-up-wait', 'bridge/gateway/gateway.py', 'return bool(self.sessions) or self.last_request > quiet_since or', 'return bool(self.sessions) or'),
    Fault('gw-slow-kept', 'bridge/gateway/gateway.py', '        if slow:\n            self._close_slow(slow)\n        if flush:', '        if flush:'),
    Fault('gw-audit-timeout-as-error', 'bridge/gateway/gateway.py', 'outcome = "timeout" if code == jsonrpc.REQUEST_TIMEOUT else "error"', 'outcome = "error"'),
    Fault('gw-throttled-taken', 'bridge/gateway/gateway.py', '                    self.log.info("rate_limited", principal=session.owner, limit=exc.limit, calls=calls, suppressed=held)\n                raise', '                    self.log.info("rate_limited", principal=session.owner, limit=exc.limit, calls=calls, suppressed=held)'),
    # placement.py
    Fault('place-retiring-not-cancelled', 'bridge/gateway/placement.py', '        retiring = self._retiring.pop(session.owner, None)\n        if retiring is not None:\n            retiring.cancel()\n', ''),
    Fault('place-principal-gets-a-second-process', 'bridge/gateway/placement.py', '        if existing is not None:  # another of its sessions got one while this one waited', '        if False:  # another of its sessions got one while this one waited'),
    Fault('place-per-session-process-kept', 'bridge/gateway/placement.py', '    def released(self, session: Session, upstream: Upstream) -> None:\n        self.host.stop_later(upstream)', '    def released(self, session: Session, upstream: Upstream) -> None:\n        pass'),
    Fault('place-principal-retired-with-sessions', 'bridge/gateway/placement.py', '        if upstream is None or upstream.mux.sessions():\n            return\n        del self.by_principal[principal]', '        if upstream is None:\n            return\n        del self.by_principal[principal]', equivalent='the retirement timer is set only when the process has no session and cancelled by at_hand, which every new session of the principal passes through first, so it never fires with a session open'),
    Fault('place-listeners-across-principals', 'bridge/gateway/placement.py', 'and method in peer.notices and peer.principal in principals:', 'and method in peer.notices:'),
    Fault('place-missing-command-ready', 'bridge/gateway/placement.py', '            return f"command {host.server.command!r} not found"', '            return None'),
    # upstream.py
    Fault('up-stall-not-restarted', 'bridge/gateway/upstream.py', '        self.supervisor.restart(f"server stopped reading its input for {limits.server_input_stall:g}s")', '        pass'),
    Fault('up-limit-kill-uncounted', 'bridge/gateway/upstream.py', '                self.gateway.metrics.limit_kills[cause.limit] += 1\n', ''),
    Fault('up-bad-line-stops-reading', 'bridge/gateway/upstream.py', '            self._log.warning("server_line_skipped", reason=exc.message, size=len(line), pid=self._pid())\n            return', '            raise'),
    Fault('up-modern-takes-turns', 'bridge/gateway/upstream.py', '                        self.mux.set_limits(attribution_window=0.0)', '                        pass'),
    Fault('up-identity-not-renewed', 'bridge/gateway/upstream.py', '        if init is not self._identity_of:', '        if self._identity_of is None and init is not None:'),
    # health.py
    Fault('health-principal-sees-all-sessions', 'bridge/gateway/health.py', 'sessions=sum(1 for s in gateway.sessions.values() if s.owner == principal),', 'sessions=len(gateway.sessions),'),
    Fault('health-principal-sees-all-calls', 'bridge/gateway/health.py', '        in_flight=sum(serving.values()),', '        in_flight=gateway.inflight(),'),
    Fault('health-admin-no-stderr', 'bridge/gateway/health.py', 'stderr_tail=last.stderr_tail() if last is not None else []', 'stderr_tail=[]'),
    Fault('health-warm-misreported', 'bridge/gateway/health.py', '        warm=upstream.warm and upstream in upstream.gateway.pool.warm,', '        warm=upstream.warm,'),
    # pinsfile.py
    Fault('pinsfile-write-lost', 'bridge/gateway/pinsfile.py', '        os.replace(temp, path)', '        os.replace(temp, path + ".new")'),
    Fault('pinsfile-read-only-written', 'bridge/gateway/pinsfile.py', '    if not mode & 0o222:', '    if False:'),
    Fault('pinsfile-settled-before-the-check', 'bridge/gateway/pinsfile.py', '        write(self.path, before)  # raises ReadOnly before anything changes\n', ''),
    Fault('pinsfile-warn-reported-held', 'bridge/gateway/pinsfile.py', '            outcome = "held" if withheld else "served"', '            outcome = "held"'),
    Fault('pinsfile-reload-drops-pending', 'bridge/gateway/pinsfile.py', '                        fresh.pending.setdefault(kind, {})[item] = pending', '                        pass'),
    Fault('pinsfile-first-sight-unsaved', 'bridge/gateway/pinsfile.py', '            try:\n                self.save()', '            try:\n                pass'),
    # pins in the gateway and its health
    Fault('gw-withheld-change-unannounced', 'bridge/gateway/gateway.py', '        if self.pins is None or before == self.pins.withheld:\n            return', '        if True:\n            return'),
    Fault('gw-pins-seen-dropped', 'bridge/gateway/gateway.py', '                    self.pins_file.seen(self.name, seen, metrics)', '                    pass'),
    Fault('health-pins-hidden', 'bridge/gateway/health.py', '        pins=_pins(gateway),\n', ''),
]  # fmt: skip
