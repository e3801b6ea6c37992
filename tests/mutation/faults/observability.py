"""Faults in metrics, logs and traces."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {
    'bridge/metrics.py': ('tests/unit/test_metrics_unit.py', 'tests/daemon/test_metrics.py', 'tests/daemon/test_traces.py', 'tests/daemon/test_pinned_servers.py::test_warn_serves_a_change_and_reports_it_once'),
    'bridge/logs.py': ('tests/unit/test_logs_unit.py', 'tests/daemon/test_logs.py'),
    'bridge/traces/settings.py': ('tests/unit/test_traces_settings.py', 'tests/daemon/test_traces.py'),
    'bridge/traces/spans.py': ('tests/unit/test_traces_spans.py', 'tests/daemon/test_traces.py'),
}

FAULTS: list[Fault] = [
    # metrics.py
    Fault('metrics-method-label-unbounded', 'bridge/metrics.py', '    if isinstance(method, str) and (method in KNOWN_METHODS or method == "response"):', '    if isinstance(method, str):'),
    Fault('metrics-code-label-unbounded', 'bridge/metrics.py', 'return str(code) if code.__class__ is int and code in ERROR_CODES else "other"', 'return str(code)'),
    Fault('metrics-bucket-bound-exclusive', 'bridge/metrics.py', 'self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1', 'self.buckets[bisect.bisect_right(LATENCY_BUCKETS, seconds)] += 1'),
    Fault('metrics-buckets-not-cumulative', 'bridge/metrics.py', '            running += n\n', '            running = n\n'),
    Fault('metrics-exited-cpu-forgotten', 'bridge/metrics.py', '        self._cpu_exited += sum(cpu for key, cpu in self._cpu_seen.items() if key not in seen)\n', ''),
    Fault('metrics-stateless-sessions-counted', 'bridge/metrics.py', 'return sum(self.sessions_opened.values()) - self.sessions_opened["stateless"]', 'return sum(self.sessions_opened.values())'),
    Fault('metrics-exemplar-other-bucket', 'bridge/metrics.py', '        self.exemplars[bisect.bisect_left(LATENCY_BUCKETS, seconds)] = ', '        self.exemplars[-1] = '),
    # traces/settings.py
    Fault('traces-env-endpoint-ignored', 'bridge/traces/settings.py', '    if traces is None and (not env_endpoint or', '    if traces is None and (True or'),
    Fault('traces-config-ratio-ignored', 'bridge/traces/settings.py', '    ratio = traces.sampler.ratio\n', '    ratio = None\n'),
    Fault('traces-imported-always', 'bridge/traces/settings.py', '    found = settings(config, environ)\n    if found is None:\n        return None\n', '    found = settings(config, environ)\n    from bridge.traces import spans  # noqa: F401\n    if found is None:\n        return None\n'),
    # traces/spans.py
    Fault('traces-parent-ignored', 'bridge/traces/spans.py', '        parent = _parent(meta) if meta.__class__ is dict and "traceparent" in meta else None', '        parent = None'),
    Fault('traces-header-ignored', 'bridge/traces/spans.py', '        parent = _parent({"traceparent": carried[0], "tracestate": carried[1]}) if carried is not None else None', '        parent = None'),
    Fault('traces-http-not-parent', 'bridge/traces/spans.py', '                parent = trace.set_span_in_context(http)\n', '                pass\n'),
    Fault('traces-unsampled-parent-traced', 'bridge/traces/spans.py', '        elif not trace.get_current_span(parent).get_span_context().trace_flags.sampled:\n            return False\n', ''),
    Fault('traces-not-injected', 'bridge/traces/spans.py', '        _PROPAGATOR.inject(meta, context=trace.set_span_in_context(span))\n', ''),
    Fault('traces-no-stages', 'bridge/traces/spans.py', '        if sent:\n            span.add_event(', '        if False:\n            span.add_event('),
    Fault('traces-asked-unlinked', 'bridge/traces/spans.py', 'context=trace.set_span_in_context(call), kind=SpanKind.CLIENT', 'context=None, kind=SpanKind.CLIENT'),
    Fault('traces-answer-never-ends-asked', 'bridge/traces/spans.py', '        if span is None:\n            return\n        if isinstance(error := msg.get("error"), dict):', '        if True:\n            return\n        if isinstance(error := msg.get("error"), dict):'),
    Fault('traces-tool-error-unmarked', 'bridge/traces/spans.py', '        elif isinstance(result := message.get("result"), dict) and result.get("isError") is True:', '        elif False:'),
    Fault('traces-failed-export-uncounted', 'bridge/traces/spans.py', '            self._spans.dropped += len(batch)\n', '            pass\n'),
    Fault('traces-forward-context-not-passed', 'bridge/traces/spans.py', '        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))\n        return span\n', '        return span\n'),
    Fault('traces-queued-unrecorded', 'bridge/traces/spans.py', '        span.add_event("queued", ', '        pass  # '),
    Fault('traces-stage-not-recorded', 'bridge/traces/spans.py', '            span.add_event(why)\n', '            pass\n'),
    Fault('traces-stage-twice', 'bridge/traces/spans.py', 'if span is not None and not (isinstance(span, ReadableSpan) and span.events and span.events[-1].name == why):', 'if span is not None:'),
    Fault('traces-unsampled-http-ignored', 'bridge/traces/spans.py', '                if http is UNSAMPLED:\n                    return False\n', ''),
    Fault('traces-http-5xx-not-error', 'bridge/traces/spans.py', '            if status >= 500:', '            if status >= 600:'),
    Fault('traces-answer-unlinked', 'bridge/traces/spans.py', '            http.add_link(span.get_span_context())\n', '            pass\n'),
    Fault('traces-session-id-on-stateless', 'bridge/traces/spans.py', '    if session.transport == "stateless":', '    if False:'),
    Fault('traces-wait-for-process-unseen', 'bridge/traces/spans.py', '        if since is not None:\n            span.add_event(', '        if False:\n            span.add_event('),
    # logs.py
    Fault('logs-throttle-count-kept', 'bridge/logs.py', '        held, self.suppressed = self.suppressed, 0', '        held = self.suppressed'),
    Fault('logs-bad-request-bytes-quoted', 'bridge/logs.py', '    text = _QUOTED.split(" ".join(exc.message.split()), 1)[0]', '    text = " ".join(exc.message.split())'),
    Fault('logs-bad-request-traceback', 'bridge/logs.py', '        if not isinstance(exc, HttpProcessingError):\n            return True', '        if True:\n            return True'),
    Fault('logs-thread-traceback-raw', 'bridge/logs.py', '    threading.excepthook = _thread_died\n', ''),
    Fault('logs-stamp-local-time', 'bridge/logs.py', 'text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))', 'text = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(whole))'),
    Fault('logs-stamp-stale-second', 'bridge/logs.py', '        if whole != second:', '        if second < 0:'),
    Fault('metrics-pin-changes-unreported', 'bridge/metrics.py', '                pin_changes.add_metric([m.server, kind, outcome], n)', '                pass'),
]  # fmt: skip
