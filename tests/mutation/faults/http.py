"""Faults in the HTTP layer: access checks, bodies, forwarding."""

from __future__ import annotations

from faults.fault import Fault

TESTS = {
    'bridge/http/access.py': ('tests/daemon/test_security.py', 'tests/daemon/test_app.py'),
    'bridge/http/body.py': ('tests/daemon/test_fastpath.py',),
    'bridge/http/forward.py': ('tests/unit/test_cluster.py', 'tests/daemon/test_replicas.py', 'tests/daemon/test_traces.py::test_a_forward_between_replicas_is_a_span_between_the_clients_and_the_owners'),
    'bridge/http/errors.py': ('tests/unit/test_reply_unit.py', 'tests/daemon/test_modern.py::test_a_sessionless_request_without_the_envelope_is_a_modern_one', 'tests/daemon/test_fastpath.py'),
    'bridge/http/streams.py': ('tests/daemon/test_streamable.py::test_an_initialize_answered_as_a_stream_names_its_session_on_either_path', 'tests/daemon/test_sse_transport.py'),
    'bridge/http/state.py': (
        'tests/daemon/test_sse_transport.py::test_unknown_server_404',
        'tests/daemon/test_streamable.py::test_a_request_that_is_not_valid_json_rpc_is_refused_naming_its_id',
        'tests/daemon/test_operations.py::test_refusals_at_an_mcp_endpoint_count_as_errors_sent_on_either_http_path',
        'tests/daemon/test_principals.py::test_calls_in_flight_are_capped_per_principal_across_transports',
        'tests/daemon/test_security.py', 'tests/daemon/test_fastpath.py',
    ),
    'bridge/http/reply.py': ('tests/unit/test_reply_unit.py', 'tests/daemon/test_streamable.py'),
    'bridge/http/endpoints/post.py': ('tests/daemon/test_modern.py', 'tests/daemon/test_streamable.py'),
    'bridge/http/endpoints/sse_2024.py': ('tests/daemon/test_sse_transport.py', 'tests/daemon/test_traces.py::test_an_http_sse_message_posts_traceparent_header_is_its_requests_parent'),
    'bridge/http/endpoints/streamable_2025.py': ('tests/daemon/test_streamable.py',),
    'bridge/http/endpoints/stateless_2026.py': ('tests/unit/test_stateless_2026_unit.py', 'tests/daemon/test_modern.py'),
    'bridge/http/endpoints/group_2026.py': ('tests/daemon/test_groups.py',),
    'bridge/http/fastpath.py': (
        'tests/daemon/test_operations.py::test_refusals_at_an_mcp_endpoint_count_as_errors_sent_on_either_http_path',
        'tests/daemon/test_streamable.py::test_a_stream_under_way_outlives_the_idle_timeout',
        'tests/daemon/test_replicas.py::test_sse_session_posts_through_the_other_replicas',
        'tests/unit/test_fastpath_head.py', 'tests/daemon/test_fastpath.py',
        'tests/daemon/test_traces.py::test_an_http_sse_message_posts_traceparent_header_is_its_requests_parent',
    ),
    'bridge/http/endpoints/base.py': ('tests/daemon/test_streamable.py',),
    'bridge/http/aiohttp_reply.py': (
        'tests/unit/test_reply_unit.py',
        'tests/daemon/test_pool.py::test_a_session_refused_for_want_of_a_process_is_an_error_sent_on_either_path',
        'tests/daemon/test_modern.py', 'tests/daemon/test_streamable.py',
    ),
}

FAULTS = [
    Fault('sec-preflight-before-checks', 'bridge/http/access.py', '    result = admit(', '    if preflight and guard.origin_allowed(origin):\n        return Access(None, True)\n    result = admit('),
    Fault('sec-options-without-origin-open', 'bridge/http/access.py', 'preflight = origin is not None and method == "OPTIONS"', 'preflight = method == "OPTIONS"'),
    Fault('sec-probes-guarded', 'bridge/http/access.py', 'if request.path not in OPEN_PATHS and not request.path.startswith(WELL_KNOWN):', 'if True:'),
    Fault('body-bomb-decompressed-whole', 'bridge/http/body.py', 'piece = decoder.decompress(pending, limit + 1 - size)', 'piece = decoder.decompress(pending)'),
    Fault('body-truncated-taken', 'bridge/http/body.py', '    if decoder is None or not decoder.eof:\n        raise _undecodable', '    if decoder is None:\n        raise _undecodable'),
    Fault('body-stacked-codings-decoded-once', 'bridge/http/body.py', '    if len(codings) > 1 or codings[0] not in _CODINGS:', '    if codings[0] not in _CODINGS:'),
    Fault('body-as-sent-unbounded', 'bridge/http/body.py', '        if taken > limit:\n', '        if False:\n'),
    Fault('fwd-untraced', 'bridge/http/forward.py', 'span = self.traces.forwarding(headers, method, owner.address) if self.traces is not None else None', 'span = None'),
    Fault('fwd-owner-gone-unmarked', 'bridge/http/forward.py', '                error = "owner_gone"\n', ''),
    Fault('fwd-connection-named-forwarded', 'bridge/http/forward.py', 'skipped = HOP_BY_HOP | connection_named(headers) | dropped', 'skipped = HOP_BY_HOP | dropped'),
    Fault('fwd-te-forwarded', 'bridge/http/forward.py', '"proxy-connection", "te", "trailer"', '"proxy-connection", "trailer"'),
    Fault('fwd-not-marked', 'bridge/http/forward.py', '        out[FORWARDED_HEADER] = self.cluster.advertise\n', ''),
    Fault('fwd-last-repeat-only', 'bridge/http/forward.py', 'out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in skipped)', 'out = CIMultiDict({k: v for k, v in headers.items() if k.lower() not in skipped})'),
    Fault('fwd-owners-connection-named-relayed', 'bridge/http/forward.py', 'skipped = _OWN_RESPONSE_HEADERS | connection_named(upstream.headers)', 'skipped = _OWN_RESPONSE_HEADERS'),
    # errors.py
    Fault('err-body-without-id', 'bridge/http/errors.py', 'return jsonrpc.encode(jsonrpc.error(self.request_id, self.code, self.message))', 'return jsonrpc.encode(jsonrpc.error(None, self.code, self.message))'),
    Fault('err-headers-dropped', 'bridge/http/errors.py', 'content_type=JSON, headers=error.headers)', 'content_type=JSON)'),
    Fault('err-internal-is-400', 'bridge/http/errors.py', 'INTERNAL_ERROR = HttpError(500,', 'INTERNAL_ERROR = HttpError(400,'),
    # streams.py
    Fault('sse-cached', 'bridge/http/streams.py', '    "Cache-Control": "no-cache",\n', ''),
    Fault('sse-buffered-by-nginx', 'bridge/http/streams.py', '    "X-Accel-Buffering": "no",  # nginx: do not buffer the stream\n', ''),
    Fault('sse-extra-headers-dropped', 'bridge/http/streams.py', 'headers={**SSE_HEADERS, **(extra_headers or {})}', 'headers=SSE_HEADERS'),
    # state.py
    Fault('state-unknown-server-400', 'bridge/http/state.py', 'raise HttpError(404, f"unknown server {name!r}")', 'raise HttpError(400, f"unknown server {name!r}")'),
    Fault('state-throttled-without-retry-after', 'bridge/http/state.py', 'jsonrpc.TOO_MANY_REQUESTS, {"Retry-After": str(exc.retry_after)})', 'jsonrpc.TOO_MANY_REQUESTS)'),
    Fault('state-full-without-retry-after', 'bridge/http/state.py', 'return HttpError(503, str(exc), headers={"Retry-After": RETRY_AFTER_S})', 'return HttpError(503, str(exc))'),
    Fault('state-protocol-error-without-id', 'bridge/http/state.py', 'raise HttpError(400, exc.message, exc.code, request_id=exc.request_id) from None', 'raise HttpError(400, exc.message, exc.code) from None'),
    Fault('state-refusals-uncounted', 'bridge/http/state.py', '            gateway.metrics.error_sent({"code": error.code})', '            pass'),
    # reply.py
    Fault('reply-chunk-size-decimal', 'bridge/http/reply.py', 'return b"%x\\r\\n%s\\r\\n" % (len(data), data)', 'return b"%d\\r\\n%s\\r\\n" % (len(data), data)'),
    Fault('reply-later-bug-not-answered', 'bridge/http/reply.py', '            logs.get().exception("internal_error", where=where)\n            reply.error(INTERNAL_ERROR)', '            logs.get().exception("internal_error", where=where)'),
    Fault('reply-later-not-cancelled', 'bridge/http/reply.py', '    reply.watch(task.cancel)\n', ''),
    # endpoints/post.py
    Fault('post-lone-request-is-2025', 'bridge/http/endpoints/post.py', 'if stateless.is_stateless(payload) or (post.session_id is None and _lone_request(payload)):', 'if stateless.is_stateless(payload):'),
    Fault('post-envelope-ignored', 'bridge/http/endpoints/post.py', 'if stateless.is_stateless(payload) or (post.session_id is None and _lone_request(payload)):', 'if post.session_id is None and _lone_request(payload):'),
    Fault('post-lone-notification-is-2026', 'bridge/http/endpoints/post.py', '        and jsonrpc.is_id(payload.get("id"))\n', ''),
    # endpoints/sse_2024.py
    Fault('sse-message-header-unread', 'bridge/http/endpoints/sse_2024.py', '        session.http_trace = AiohttpHead(request.headers).trace_context()\n', '        pass\n'),
    Fault('fast-message-header-unread', 'bridge/http/fastpath.py', '            session.http_trace = head.trace_context()\n', '            pass\n'),
    Fault('sse-ended-session-takes-posts', 'bridge/http/endpoints/sse_2024.py', '    if session.ended:  # while its body was arriving\n        raise HttpError(404, "unknown session")\n', ''),
    Fault('sse-other-transport-session', 'bridge/http/endpoints/sse_2024.py', 'if session is None or session.transport != SseSession.transport:', 'if session is None:'),
    Fault('sse-byte-bound-ignored', 'bridge/http/endpoints/sse_2024.py', '        if self._waiting_bytes + (out.get_write_buffer_size() if out is not None else 0) > self._byte_limit:\n            return False\n', ''),
    Fault('sse-prefix-unchecked', 'bridge/http/endpoints/sse_2024.py', 'return prefix if _PREFIX.fullmatch(prefix) else ""', 'return prefix'),
    Fault('sse-keepalive-not-flushed', 'bridge/http/endpoints/sse_2024.py', '        self._parts.append(streams.PING)\n        self.flush()', '        self._parts.append(streams.PING)'),
    # endpoints/streamable_2025.py
    Fault('stream-batch-repeat-taken', 'bridge/http/endpoints/streamable_2025.py', '            raise HttpError(400, "invalid request: a request id is repeated in this batch", jsonrpc.INVALID_REQUEST)', '            pass'),
    Fault('stream-unsupported-version-taken', 'bridge/http/endpoints/streamable_2025.py', '    if version is not None and version not in _SESSION_VERSIONS:', '    if False:'),
    Fault('stream-accept-none-406', 'bridge/http/endpoints/streamable_2025.py', '    if not accept:\n        return Form.JSON', '    if not accept:\n        raise HttpError(406, "no Accept")'),
    Fault('stream-either-is-stream', 'bridge/http/endpoints/streamable_2025.py', 'return Form.EITHER if sse == json else Form.STREAM if sse > json else Form.JSON', 'return Form.STREAM if sse >= json else Form.JSON'),
    Fault('stream-event-id-unparsed', 'bridge/http/endpoints/streamable_2025.py', '        if key and seq.isdigit():\n            return key, int(seq)', '        if key and seq.isdigit():\n            return key, 0'),
    Fault('stream-failed-initialize-kept', 'bridge/http/endpoints/streamable_2025.py', '    if version is None:\n        gateway.close_session(session, "initialize failed")\n    else:', '    if False:\n        pass\n    else:'),
    # endpoints/group_2026.py
    Fault('group26-name-not-rewritten', 'bridge/http/endpoints/group_2026.py', '        params["name"] = found[1]\n', ''),
    Fault('group26-head-not-rewritten', 'bridge/http/endpoints/group_2026.py', '    head = post.request if own is None else _MemberHead(post.request, own)', '    head = post.request'),
    Fault('group26-cursor-ignored', 'bridge/http/endpoints/group_2026.py', '    if cursor is not None:\n        msg["params"]["cursor"] = cursor\n', ''),
    Fault('group26-no-timeout', 'bridge/http/endpoints/group_2026.py', '    await _gathered(kept.values(), group.config.list_timeout)', '    await _gathered(kept.values(), None)'),
    Fault('group26-first-member-only', 'bridge/http/endpoints/group_2026.py', '    kept = {member: _ask(post, member, body, parking) for member in members}', '    kept = {member: _ask(post, member, body, parking) for member in members[:1]}'),
    Fault('group26-discover-unmerged', 'bridge/http/endpoints/group_2026.py', '    status = stateless.complete(message, method, group.identity())', '    status = stateless.complete(message, method, stateless.Server(None, "private"))'),
    Fault('group26-no-admit', 'bridge/http/endpoints/group_2026.py', '        stateless.admit(msg, post.request.mirrored(), post.accept, None)', '        pass'),
    Fault('group26-listen-left-kept', 'bridge/http/endpoints/group_2026.py', '        self.listening.lefts.append(left)', '        pass'),
    Fault('group26-ack-first-only', 'bridge/http/endpoints/group_2026.py', '        for each in acks:\n', '        for each in acks[:1]:\n'),
    Fault('group26-refusal-not-found-first', 'bridge/http/endpoints/group_2026.py', "        if refused is None or (_code(refused) == jsonrpc.METHOD_NOT_FOUND and not (isinstance(error, dict) and error.get(\"code\") == jsonrpc.METHOD_NOT_FOUND)):", '        if refused is None:'),
    Fault('group26-audit-unnamed', 'bridge/http/endpoints/group_2026.py', '    return Post(gateway, post.principal, None, post.version, accept, post.resume_buffer, head, group.name)', '    return Post(gateway, post.principal, None, post.version, accept, post.resume_buffer, head)'),
    Fault('group26-uncounted', 'bridge/http/endpoints/group_2026.py', '    group.requests[gateway.name] += 1\n', ''),
    # endpoints/stateless_2026.py
    Fault('modern-ended-is-200', 'bridge/http/endpoints/stateless_2026.py', '            self._end(ended, 503)', '            self._end(ended, 200)'),
    Fault('modern-retry-keeps-call-id', 'bridge/http/endpoints/stateless_2026.py', '        if self.reply_id != self.call_id:\n            data = stateless.with_id(data, self.reply_id)', '        if False:\n            data = stateless.with_id(data, self.reply_id)'),
    Fault('modern-withdrawn-still-asked', 'bridge/http/endpoints/stateless_2026.py', '                for key in [k for k, downstream in ids.items() if downstream == withdrawn]:\n                    del asked[key], ids[key]\n', ''),
    Fault('modern-kept-hears', 'bridge/http/endpoints/stateless_2026.py', '        if self.kept_in is not None:\n            return True  # idle', '        if False:\n            return True  # idle'),
    Fault('modern-parked-end-stays-parked', 'bridge/http/endpoints/stateless_2026.py', '            parking, key = self.parked_in\n            parking.unpark(key)', '            parking, key = self.parked_in'),
    # fastpath.py
    Fault('fast-no-host-taken', 'bridge/http/fastpath.py', '    if host is None:\n        return None  # HTTP/1.1 requires it', '    if host is None:\n        host = b""  # HTTP/1.1 requires it'),
    Fault('fast-odd-length-taken', 'bridge/http/fastpath.py', 'if not length.isdigit() or len(length) > 18:', 'if len(length) > 18:'),
    Fault('fast-upgrade-kept', 'bridge/http/fastpath.py', '        if b"upgrade" in tokens:\n            return None\n', '', equivalent='aiohttp reads a POST naming upgrade in Connection as an ordinary request too (the differential test holds an example of one, which passes with the check removed), so handing it over changes no answer'),
    Fault('fast-close-ignored', 'bridge/http/fastpath.py', '        out.close = b"close" in tokens', '        out.close = False'),
    Fault('fast-forwarded-ignored', 'bridge/http/fastpath.py', '        out.forwarded = (_or_none(get(b"x-forwarded-proto")), _or_none(get(b"x-forwarded-host")), _or_none(get(b"x-forwarded-prefix")))', '        pass'),
    Fault('fast-session-id-alias-first', 'bridge/http/fastpath.py', '    session_id = found.get(b"session_id") or found.get(b"sessionId")', '    session_id = found.get(b"sessionId") or found.get(b"session_id")'),
    Fault('fast-bare-lf-waits', 'bridge/http/fastpath.py', 'if len(data) - pos > MAX_HEAD or data.count(b"\\n", pos) != data.count(b"\\r\\n", pos):', 'if len(data) - pos > MAX_HEAD:'),
    Fault('fast-large-refused-body-read', 'bridge/http/fastpath.py', 'if head.refusal is not None and (head.refusal.status == 413 or head.content_length > DISCARD_LIMIT):', 'if head.refusal is not None and head.refusal.status == 413:'),
    Fault('fast-refusals-uncounted', 'bridge/http/fastpath.py', '        if head.gateway is not None:\n            head.gateway.metrics.error_sent({"code": error.code})\n', ''),
    Fault('fast-no-cors', 'bridge/http/fastpath.py', '        if cors is not None:\n            headers = {**headers, **cors} if headers else cors\n', ''),
    Fault('fast-stream-not-idle-reaped', 'bridge/http/fastpath.py', 'if idle >= self._idle_timeout and self._busy is None:  # a stream under way is not idle', 'if idle >= self._idle_timeout:  # a stream under way is not idle'),
    Fault('fast-other-replica-served-here', 'bridge/http/fastpath.py', '                and not self._cluster.is_local(head.session_id)\n', '                and False\n'),
    # aiohttp_reply.py
    Fault('aioreply-session-header-dropped', 'bridge/http/aiohttp_reply.py', '        headers = {SESSION_HEADER: session_id} if session_id else None\n        if body:', '        headers = None\n        if body:'),
    Fault('aioreply-error-uncounted', 'bridge/http/aiohttp_reply.py', '            state.refused(self._request, exc)\n', ''),
    Fault('aioreply-error-midstream-clean', 'bridge/http/aiohttp_reply.py', '        if self.streaming:\n            self.abort()\n        else:', '        if self.streaming:\n            self.end_stream()\n        else:'),
    Fault('aioreply-client-gone-unwatched', 'bridge/http/aiohttp_reply.py', '            if left is not None:\n                left()', '            pass'),
    Fault('aioreply-early-events-lost', 'bridge/http/aiohttp_reply.py', '        if first:\n            self._early.append(first)\n', ''),
    Fault('aioreply-repeated-mirror-taken', 'bridge/http/aiohttp_reply.py', '            if lower[10:] in params:\n                repeated = name\n', ''),
    # endpoints/base.py: what a POST is, read by position on both paths
    Fault('base-post-fields-swapped', 'bridge/http/endpoints/base.py', '    session_id: str | None  # Mcp-Session-Id\n    version: str | None  # MCP-Protocol-Version', '    version: str | None  # MCP-Protocol-Version\n    session_id: str | None  # Mcp-Session-Id'),
]  # fmt: skip
