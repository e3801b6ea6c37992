"""Traces (bridge/traces/, docs/how-to/tracing.md): a real OTLP/HTTP receiver (tests/support/otlp.py,
decoding with the official opentelemetry-proto messages) and a real instrumented server (the
official Python SDK's, tests/servers/traced.py): one client call yields one trace, the client's
parent, the bridge's span, the server's span, in that order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.daemon import PY, SERVERS, demo, faulty, run_bridge
from support.otlp import Receiver, Span, grpc_receiver, receiver
from support.rawclient import RawSse
from support.rawstreamable import RawStreamable, tool_call
from test_modern import PATHS, headers_for, metric, post, request, retry
from test_replicas import KEY, free_port

from bridge.metrics import LATENCY_BUCKETS

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CLIENT_SPAN}-01"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
CLIENT_KIND = 3
ERROR = 2  # Status.STATUS_CODE_ERROR
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}  # the bridge's batch goes out within 50 ms (default 5 s)


def traced(r: Receiver, ratio: float = 1.0) -> dict[str, Any]:
    server = {"command": PY, "args": [str(SERVERS / "traced.py")], "env": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": r.url}}
    return {"servers": {"traced": server}, "telemetry": {"traces": {"endpoint": r.url, "sampler": {"ratio": ratio}}}}


def bridge_span(name: str, trace: str = TRACE) -> Any:
    return lambda s: s.service == "mcp-bridge" and s.name == name and s.trace_id == trace


async def exported(b: Any) -> None:
    """Until the bridge counts a span exported: once the collector's answer is back, which
    may be after the collector has the span."""
    async with asyncio.timeout(5):
        while await metric(b, 'mcp_bridge_trace_spans_total{outcome="exported"}') < 1:
            await asyncio.sleep(0.02)


def http_attributes(route: str, path: str, status: int) -> dict[str, Any]:
    return {
        "http.request.method": "POST", "http.route": route, "url.path": path, "url.scheme": "http",
        "network.protocol.version": "1.1", "http.response.status_code": status,
    }  # fmt: skip


async def parent_of(r: Receiver, span: Span) -> Span:
    return await r.wait_for(lambda s: s.span_id == span.parent_id and s.trace_id == span.trace_id)


async def chain(r: Receiver, name: str, trace: str = TRACE) -> tuple[Span, Span]:
    """The bridge's span of a request and the server's span under it."""
    ours = await r.wait_for(bridge_span(name, trace))
    theirs = await r.wait_for(lambda s: s.service == "traced-server" and s.name == name and s.trace_id == ours.trace_id)
    assert theirs.parent_id == ours.span_id, (ours, theirs)
    assert ours.start <= theirs.start and theirs.end <= ours.end
    return ours, theirs


async def test_a_call_continues_the_clients_trace_through_the_bridge_into_the_server(bridge: Any) -> None:
    async with receiver() as r, bridge(traced(r), env=FAST_EXPORT) as b, RawStreamable(b.url("traced", "mcp")) as raw:
        await raw.initialize()
        params = {"name": "echo", "arguments": {"text": "traced"}, "_meta": {"traceparent": TRACEPARENT, "tracestate": "client=1", "keep": "me"}}
        response, _ = await raw.request("tools/call", params, request_id=7)
        assert response["result"]["content"][0]["text"] == "traced"
        ours, theirs = await chain(r, "tools/call echo")
        assert ours.parent_id == CLIENT_SPAN and ours.kind == SERVER_KIND
        assert ours.attributes == {
            "mcp.method.name": "tools/call", "gen_ai.tool.name": "echo", "gen_ai.operation.name": "execute_tool",
            "jsonrpc.request.id": "7", "network.transport": "tcp", "mcp.session.id": raw.session_id, "mcp.protocol.version": "2025-11-25",
        }, ours.attributes  # fmt: skip
        (written,) = [time for name, time in ours.events if name == "written"]
        assert ours.start <= written <= theirs.start  # waited at the bridge before, the server's own time after
        assert not [s for s in r.spans if s.parent_id == ours.span_id and s.service == "mcp-bridge"]
        audit = await b.wait_for("audit", where=lambda e: e.get("name") == "echo")
        assert (audit["trace_id"], audit["span_id"]) == (TRACE, ours.span_id)
        await exported(b)
        # The call's duration bucket holds its trace as exemplar, served as OpenMetrics only.
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{b.base}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
                exemplars = [x for x in (await resp.text()).splitlines() if x.startswith("mcp_bridge_request_duration_seconds_bucket") and " # " in x]
            async with http.get(f"{b.base}/metrics") as resp:
                assert resp.headers["Content-Type"].startswith("text/plain") and " # {" not in await resp.text()
        (bucket,) = exemplars
        assert 'method="tools/call"' in bucket and f'# {{span_id="{ours.span_id}",trace_id="{TRACE}"}}' in bucket, bucket
        seconds = float(bucket.split("} ")[-1].split()[0])  # the exemplar's value: the bucket is the one it falls in
        assert f'le="{min(b for b in LATENCY_BUCKETS if b >= seconds)}"' in bucket, bucket
        # A request the bridge answers itself (no call goes to the server) has its span too, ended.
        await raw.request("ping", {"_meta": {"traceparent": TRACEPARENT}})
        ping = await r.wait_for(bridge_span("ping"))
        assert ping.parent_id == CLIENT_SPAN and ping.events == []  # never written to the server
        # The server gets the bridge's span as its parent, and the rest of _meta as it was.
        seen, _ = await raw.request("tools/call", {"name": "meta", "arguments": {}, "_meta": {"traceparent": TRACEPARENT, "keep": "me"}})
        meta = json.loads(seen["result"]["content"][0]["text"])
        mine = await r.wait_for(bridge_span("tools/call meta"))
        assert meta["traceparent"] == f"00-{TRACE}-{mine.span_id}-01" and meta["keep"] == "me", meta


@pytest.mark.parametrize("path", PATHS)
async def test_a_2026_07_28_call_is_traced_with_no_session(bridge: Any, path: str) -> None:
    async with receiver() as r, bridge(traced(r), env=FAST_EXPORT) as b:
        call = request("tools/call", {"name": "echo", "arguments": {"text": "modern"}}, rid="m1")
        call["params"]["_meta"]["traceparent"] = TRACEPARENT
        answer = (await post(b.url("traced", "mcp"), call, headers_for(call), path)).final()
        assert answer["result"]["content"][0]["text"] == "modern"
        ours, _ = await chain(r, "tools/call echo")
        assert ours.parent_id == CLIENT_SPAN and "mcp.session.id" not in ours.attributes
        assert ours.attributes["mcp.protocol.version"] == "2026-07-28" and ours.attributes["jsonrpc.request.id"] == "m1"


@pytest.mark.parametrize("path", PATHS)
async def test_a_2026_07_28_call_that_waits_for_its_process_begins_its_span_on_arrival(bridge: Any, path: str) -> None:
    async with receiver() as r:
        config = traced(r)
        config["servers"]["traced"]["mode"] = "per-session"  # each request's own process, started for it
        async with bridge(config, env=FAST_EXPORT) as b:
            call = request("tools/call", {"name": "echo", "arguments": {"text": "fresh"}}, rid="w1")
            call["params"]["_meta"]["traceparent"] = TRACEPARENT
            answer = (await post(b.url("traced", "mcp"), call, headers_for(call), path)).final()
            assert answer["result"]["content"][0]["text"] == "fresh"
            ours, theirs = await chain(r, "tools/call echo")
            assert [name for name, _ in ours.events] == ["waiting_for_server", "written"], ours.events
            (waited, _), (written, at) = ours.events
            assert ours.events[0][1] == ours.start < at <= theirs.start  # the process started in between
            http = await r.wait_for(lambda s: s.service == "mcp-bridge" and s.name == "POST /servers/{name}/mcp")
            assert http.start <= ours.start and ours.links == [(http.trace_id, http.span_id)]


async def test_a_malformed_traceparent_is_ignored_and_a_tool_error_marks_the_span(bridge: Any) -> None:
    async with receiver() as r, bridge(traced(r), env=FAST_EXPORT) as b, RawStreamable(b.url("traced", "mcp")) as raw:
        await raw.initialize()
        bad = {"name": "echo", "arguments": {"text": "still served"}, "_meta": {"traceparent": "00-not-a-trace-01"}}
        response, _ = await raw.request("tools/call", bad)
        assert response["result"]["content"][0]["text"] == "still served"
        ours = await r.wait_for(lambda s: s.service == "mcp-bridge" and s.name == "tools/call echo")
        assert ours.trace_id != TRACE  # a trace of its own, begun by the HTTP request's span
        assert (await parent_of(r, ours)).parent_id == ""
        await chain(r, "tools/call echo", ours.trace_id)
        failed, _ = await raw.request("tools/call", {"name": "fail", "arguments": {}})
        assert failed["result"]["isError"] is True
        span = await r.wait_for(lambda s: s.service == "mcp-bridge" and s.name == "tools/call fail")
        assert span.attributes["error.type"] == "tool_error" and span.status_code == ERROR
        unknown, _ = await raw.request("tools/call", {"name": "nobody", "arguments": {}})
        refused = await r.wait_for(lambda s: s.service == "mcp-bridge" and s.name == "tools/call nobody")
        if "error" in unknown:  # the SDK answers an unknown tool with an error or a tool error, by version
            code = str(unknown["error"]["code"])
            assert refused.attributes["error.type"] == code == refused.attributes["rpc.response.status_code"] and refused.status_code == ERROR


async def test_an_unsampled_parent_is_not_traced_and_a_ratio_of_zero_traces_no_root(bridge: Any) -> None:
    async with receiver() as r, bridge(traced(r, ratio=0.0), env=FAST_EXPORT) as b, RawStreamable(b.url("traced", "mcp")) as raw:
        await raw.initialize()
        await raw.request("tools/call", {"name": "echo", "arguments": {"text": "root"}})
        unsampled = f"00-{TRACE}-{CLIENT_SPAN}-00"
        seen, _ = await raw.request("tools/call", {"name": "meta", "arguments": {}, "_meta": {"traceparent": unsampled, "keep": "me"}})
        meta = json.loads(seen["result"]["content"][0]["text"])
        assert meta["traceparent"] == unsampled and meta["keep"] == "me", meta  # reaches the server as it came
        await raw.request("tools/call", {"name": "echo", "arguments": {"text": "on"}, "_meta": {"traceparent": TRACEPARENT}})
        await chain(r, "tools/call echo")  # the sampled parent's: traced whatever the ratio
        traced_calls = [s for s in r.spans if s.service == "mcp-bridge" and s.name == "tools/call echo"]
        assert len(traced_calls) == 1, traced_calls


async def test_a_collector_that_is_down_loses_spans_counted_and_no_call(bridge: Any) -> None:
    async with receiver() as r:
        down = r.url
    config = {"servers": {"demo": demo()}, "telemetry": {"traces": {"endpoint": down}}}
    env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1"}
    async with bridge(config, env=env) as b, RawStreamable(b.url("demo", "mcp")) as raw:
        await raw.initialize()
        started = time.monotonic()
        for i in range(20):
            response, _ = await raw.request("tools/call", {"name": "echo", "arguments": {"text": str(i)}, "_meta": {"traceparent": TRACEPARENT}})
            assert response["result"]["content"][0]["text"] == str(i)
        assert time.monotonic() - started < 5  # export failing (1 s each, in its own thread) holds up no call
        failed = await b.wait_for("trace_export_failed", timeout=20)
        assert failed["dropped"] >= 1 and failed["level"] == "warning"
        assert await metric(b, 'mcp_bridge_trace_spans_total{outcome="dropped"}') >= failed["dropped"]
        assert await metric(b, 'mcp_bridge_trace_spans_total{outcome="exported"}') == 0


async def test_a_servers_request_to_the_client_is_a_span_under_the_call_that_caused_it(bridge: Any) -> None:
    config = {"servers": {"demo": demo()}, "telemetry": {"traces": {"endpoint": ""}}}
    async with receiver() as r:
        config["telemetry"]["traces"]["endpoint"] = r.url
        async with bridge(config, env=FAST_EXPORT) as b, RawStreamable(b.url("demo", "mcp")) as client:
            await client.initialize(capabilities={"sampling": {}})
            call = tool_call("sample", {"prompt": "2+2?"}, "s")
            call["params"]["_meta"] = {"traceparent": TRACEPARENT}
            asked = await client.post(call)
            assert asked.stream is not None
            ask = await asked.stream.message()
            assert ask["method"] == "sampling/createMessage"
            answer = {"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "4"}, "model": "m"}}
            assert (await client.post(answer)).status == 202
            response, _ = await asked.stream.response("s")
            assert response["result"]["content"][0]["text"] == "4"
            ours = await r.wait_for(bridge_span("tools/call sample"))
            sampling = await r.wait_for(bridge_span("sampling/createMessage"))
            assert sampling.parent_id == ours.span_id and sampling.kind == CLIENT_KIND
            assert sampling.attributes["mcp.method.name"] == "sampling/createMessage"
            assert sampling.attributes["jsonrpc.request.id"] == str(ask["id"]) and sampling.attributes["mcp.session.id"] == client.session_id
            assert ours.start <= sampling.start <= sampling.end <= ours.end
            (link,) = ours.links  # the POST that carried the call, its answer a stream: 200 once the stream ended
            streamed = await r.wait_for(lambda s: (s.trace_id, s.span_id) == link)
            assert streamed.attributes["http.response.status_code"] == 200 and streamed.status_code != ERROR and ours.end <= streamed.end
            # The POST that carried the client's answer links the question it answered.
            answered = await r.wait_for(lambda s: s.name == "POST /servers/{name}/mcp" and (sampling.trace_id, sampling.span_id) in s.links)
            assert answered.attributes["http.response.status_code"] == 202


@pytest.mark.parametrize("path", PATHS)
async def test_without_meta_the_traceparent_header_is_the_parent_and_with_both_the_header_is_linked(bridge: Any, path: str) -> None:
    header_trace, header_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    header = {"traceparent": f"00-{header_trace}-{header_span}-01"}
    async with receiver() as r, bridge(traced(r), env=FAST_EXPORT) as b:
        url = b.url("traced", "mcp")
        call = request("tools/call", {"name": "echo", "arguments": {"text": "by header"}}, rid="h1")
        assert (await post(url, call, {**headers_for(call), **header}, path)).final()["result"]["content"][0]["text"] == "by header"
        ours, _ = await chain(r, "tools/call echo", header_trace)
        http = await parent_of(r, ours)  # the HTTP request's span, under the header's context
        assert http.name == "POST /servers/{name}/mcp" and http.kind == SERVER_KIND and http.parent_id == header_span and ours.links == []
        assert http.attributes == http_attributes("/servers/{name}/mcp", "/servers/traced/mcp", 200), http.attributes
        assert http.start <= ours.start and ours.end <= http.end
        both = request("tools/call", {"name": "nap", "arguments": {"ms": 1}}, rid="h2")
        both["params"]["_meta"]["traceparent"] = TRACEPARENT
        assert (await post(url, both, {**headers_for(both), **header}, path)).final()["result"]["content"][0]["text"] == "rested"
        ours, _ = await chain(r, "tools/call nap")
        (link,) = ours.links  # to the HTTP request's span, the parent being the one in _meta
        linked = await r.wait_for(lambda s: (s.trace_id, s.span_id) == link)
        assert ours.parent_id == CLIENT_SPAN and linked.parent_id == header_span and linked.name == "POST /servers/{name}/mcp"
    async with receiver() as r, bridge(traced(r), env=FAST_EXPORT) as b, RawStreamable(b.url("traced", "mcp")) as raw:
        await raw.initialize()
        reply = await raw.post(tool_call("echo", {"text": "2025"}, 5), headers=header)
        assert reply.stream is not None or reply.json is not None
        ours, _ = await chain(r, "tools/call echo", header_trace)
        assert (await parent_of(r, ours)).parent_id == header_span


async def test_each_stage_a_call_waits_at_the_bridge_is_an_event_of_its_span(bridge: Any) -> None:
    slots = {**faulty(), "max_concurrent_calls": 1}
    held = {**faulty(), "attribution_window": 30}  # a call that can be asked holds the next until it ends
    crashy = {**faulty(), "restart": {"backoff_initial": 1}}
    async with receiver() as r:
        config = {"servers": {"slots": slots, "held": held, "crashy": crashy}, "telemetry": {"traces": {"endpoint": r.url}}}
        async with bridge(config, env=FAST_EXPORT) as b:

            def span(name: str, rid: str) -> Any:
                return lambda s: s.service == "mcp-bridge" and s.name == name and s.attributes["jsonrpc.request.id"] == rid

            def stages(s: Span) -> list[str]:
                return [name for name, _ in s.events]

            # A slot: the second call waits for the first, which holds the server's only one.
            async with RawStreamable(b.url("slots", "mcp")) as raw:
                await raw.initialize()
                first = await raw.post(tool_call("slow", {"ms": 300}, "first"))  # its headers: the call is in
                response, _ = await raw.request("tools/call", {"name": "echo", "arguments": {"text": "next"}}, request_id="next")
                assert response["result"]["content"][0]["text"] == "next"
                assert first.stream is not None
                await first.stream.response("first")
                waited = await r.wait_for(span("tools/call echo", "next"))
                alone = await r.wait_for(span("tools/call slow", "first"))
                assert stages(waited) == ["waiting_for_slot", "written"] and stages(alone) == ["written"]
                (written,) = [t for name, t in waited.events if name == "written"]
                assert written >= alone.end - 50_000_000  # written when the first call's slot freed
            # Held: a call of a session that can be asked goes alone; the next waits its turn.
            async with RawStreamable(b.url("held", "mcp")) as a, RawStreamable(b.url("held", "mcp")) as other:
                await a.initialize(capabilities={"sampling": {}})
                await other.initialize(capabilities={"sampling": {}})
                holder = await a.post(tool_call("slow", {"ms": 300}, "holder"))
                response, _ = await other.request("tools/call", {"name": "echo", "arguments": {"text": "turn"}}, request_id="turn")
                assert response["result"]["content"][0]["text"] == "turn"
                assert holder.stream is not None
                await holder.stream.response("holder")
                assert stages(await r.wait_for(span("tools/call echo", "turn"))) == ["held", "written"]
                assert stages(await r.wait_for(span("tools/call slow", "holder"))) == ["written"]
            # A restart in the middle: the call in flight fails with the process; one that comes
            # while the next process starts waits for it, and is served by it.
            async with RawStreamable(b.url("crashy", "mcp")) as raw:
                await raw.initialize()
                crashed, _ = await raw.request("tools/call", {"name": "crash", "arguments": {}}, request_id="crash")
                assert "error" in crashed, crashed
                response, _ = await raw.request("tools/call", {"name": "echo", "arguments": {"text": "after"}}, request_id="after")
                assert response["result"]["content"][0]["text"] == "after"
                lost = await r.wait_for(span("tools/call crash", "crash"))
                assert lost.status_code == ERROR and stages(lost) == ["written"]
                assert stages(await r.wait_for(span("tools/call echo", "after"))) == ["waiting_for_server", "written"]


async def test_a_call_whose_line_waits_for_a_server_that_stopped_reading_is_queued(bridge: Any) -> None:
    MiB = 1 << 20
    limits = {"max_message_bytes": "1MiB", "server_input_buffer": "1MiB", "server_input_stall": "1s"}
    async with receiver() as r:
        config = {"servers": {"deaf": {**faulty(), "restart": {"backoff_initial": 0.2}}}, "limits": limits, "telemetry": {"traces": {"endpoint": r.url}}}
        async with bridge(config, env=FAST_EXPORT) as b, RawStreamable(b.url("deaf", "mcp")) as raw:
            await raw.initialize()
            answer, _ = await raw.request("tools/call", {"name": "deaf", "arguments": {}}, request_id="deaf")
            assert answer["result"]["content"][0]["text"] == "deaf"  # and it reads no more
            blob = {"jsonrpc": "2.0", "method": "notifications/flood", "params": {"blob": "x" * (MiB * 3 // 4)}}
            assert (await raw.post(blob)).status == 202  # more than the pipe holds: the rest waits in the bridge
            lost, _ = await raw.request("tools/call", {"name": "echo", "arguments": {"text": "stuck"}}, request_id="stuck")
            assert "error" in lost, lost  # the server stalled, and was restarted with the call in it
            stuck = await r.wait_for(lambda s: s.name == "tools/call echo" and s.attributes["jsonrpc.request.id"] == "stuck")
            assert [name for name, _ in stuck.events] == ["queued", "written"], stuck.events
            assert stuck.event_attributes["queued"]["mcp_bridge.server_input.buffered"] > MiB // 2  # the blob, less what the pipe took
            served = await r.wait_for(lambda s: s.name == "tools/call deaf")
            assert [name for name, _ in served.events] == ["written"]  # nothing before it in the pipe


async def test_a_forward_between_replicas_is_a_span_between_the_clients_and_the_owners(tmp_path: Path) -> None:
    header_trace, header_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    async with receiver() as r, contextlib.AsyncExitStack() as stack:
        config = {**traced(r), "cluster": {"peer_key": KEY}}
        homes = tmp_path / "owner", tmp_path / "via"
        for home in homes:
            home.mkdir()
        owner, via = [
            await stack.enter_async_context(run_bridge(home, config, "--port", str(port), "--advertise", f"127.0.0.1:{port}", env=FAST_EXPORT))
            for home, port in zip(homes, (free_port(), free_port()), strict=True)
        ]
        async with RawStreamable(owner.url("traced", "mcp")) as raw:
            await raw.initialize()
            raw.url = via.url("traced", "mcp")
            traceparent = {"traceparent": f"00-{header_trace}-{header_span}-01", "tracestate": "client=1"}
            reply = await raw.post(tool_call("echo", {"text": "forwarded"}, "f"), headers=traceparent)
            response = reply.json if reply.stream is None else (await reply.stream.response("f"))[0]
            assert response["result"]["content"][0]["text"] == "forwarded"
            forward = await r.wait_for(lambda s: s.service == "mcp-bridge" and s.kind == CLIENT_KIND and s.trace_id == header_trace)
            received = await parent_of(r, forward)  # the request as the forwarding replica took it
            assert forward.name == "POST" and received.name == "POST /servers/{name}/mcp" and received.parent_id == header_span
            assert forward.attributes == {"http.request.method": "POST", "server.address": "127.0.0.1", "server.port": owner.port, "http.response.status_code": 200}
            ours, _ = await chain(r, "tools/call echo", header_trace)  # at the owner, under the forward
            # (Not `ours.end <= forward.end`: the owner ends its span once it has written the answer,
            # which the forwarding replica may have read and relayed by then.)
            served = await parent_of(r, ours)  # the request as the owner took it, under the forward
            assert served.name == "POST /servers/{name}/mcp" and served.parent_id == forward.span_id
            assert forward.start <= served.start <= ours.start <= forward.end
            await owner.stop()  # its sessions die with it: the forward finds no one
            gone = await raw.post(tool_call("echo", {"text": "lost"}, "g"), headers=traceparent)
            assert gone.status == 404
            lost = await r.wait_for(lambda s: s.kind == CLIENT_KIND and s.trace_id == header_trace and s.span_id != forward.span_id)
            assert lost.attributes["error.type"] == "owner_gone" and lost.status_code == ERROR and "http.response.status_code" not in lost.attributes
            logged = await via.wait_for("forward_owner_gone")
            assert (logged["trace_id"], logged["span_id"]) == (header_trace, lost.span_id)


@pytest.mark.parametrize("path", PATHS)
async def test_an_http_sse_message_posts_traceparent_header_is_its_requests_parent(bridge: Any, path: str) -> None:
    header_trace, header_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    async with receiver() as r, bridge(traced(r), env=FAST_EXPORT) as b, RawSse(b.url("traced", "sse")) as sse:
        await sse.initialize()
        body = json.dumps(tool_call("echo", {"text": "sse"}, 3)).encode()

        async def chunked() -> AsyncIterator[bytes]:  # a body the fast path leaves to aiohttp
            yield body

        headers = {"Content-Type": "application/json", "traceparent": f"00-{header_trace}-{header_span}-01"}
        async with aiohttp.ClientSession() as http, http.post(sse.endpoint, data=body if path == "fast" else chunked(), headers=headers) as resp:
            assert resp.status == 202
        assert (await sse.response(3))["result"]["content"][0]["text"] == "sse"
        ours, _ = await chain(r, "tools/call echo", header_trace)
        http = await parent_of(r, ours)
        assert http.parent_id == header_span and ours.attributes["mcp.session.id"] == sse.session_id
        assert http.attributes == http_attributes("/servers/{name}/messages", "/servers/traced/messages", 202), http.attributes


async def test_spans_go_over_grpc_with_the_configured_headers(bridge: Any) -> None:
    async with grpc_receiver() as r:
        traces = {"endpoint": r.url, "protocol": "grpc", "headers": {"x-api-key": "collector-key"}}
        async with bridge({"servers": {"demo": demo()}, "telemetry": {"traces": traces}}, env=FAST_EXPORT) as b, RawStreamable(b.url("demo", "mcp")) as raw:
            await raw.initialize()
            await raw.request("tools/call", {"name": "echo", "arguments": {"text": "g"}, "_meta": {"traceparent": TRACEPARENT}})
            ours = await r.wait_for(bridge_span("tools/call echo"))
            assert ours.parent_id == CLIENT_SPAN and ours.kind == SERVER_KIND
            assert r.headers["x-api-key"] == "collector-key"
            await exported(b)


async def test_a_2026_07_28_call_left_waiting_for_its_input_is_logged_and_ended_with_its_trace(bridge: Any) -> None:
    async with receiver() as r:
        config = {"servers": {"demo": demo()}, "limits": {"request_state_ttl": 1}, "telemetry": {"traces": {"endpoint": r.url}}}
        async with bridge(config, env=FAST_EXPORT) as b:
            call = request("tools/call", {"name": "sample", "arguments": {"prompt": "p"}}, rid=1, capabilities={"sampling": {}})
            call["params"]["_meta"]["traceparent"] = TRACEPARENT
            answer = await post(b.url("demo", "mcp"), call, headers_for(call))
            assert answer.json()["result"]["resultType"] == "input_required"
            expired = await b.wait_for("input_expired", timeout=10)  # no retry within the ttl
            ours = await r.wait_for(bridge_span("tools/call sample"))
            assert (expired["trace_id"], expired["span_id"]) == (TRACE, ours.span_id)
            assert ours.status_code == ERROR and ours.attributes["error.type"] == "cancelled" and "written" in [name for name, _ in ours.events]
            asked = await r.wait_for(bridge_span("sampling/createMessage"))
            assert asked.parent_id == ours.span_id and asked.status_code == ERROR


async def test_a_call_through_a_group_is_traced_under_the_groups_http_request(bridge: Any) -> None:
    header_trace, header_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    async with receiver() as r:
        config = {**traced(r), "groups": {"team": {"servers": ["traced"]}}}
        async with bridge(config, env=FAST_EXPORT) as b, RawStreamable(f"{b.base}/groups/team/mcp") as raw:
            await raw.initialize()
            reply = await raw.post(tool_call("traced__echo", {"text": "grouped"}, "g"), headers={"traceparent": f"00-{header_trace}-{header_span}-01"})
            response = reply.json if reply.stream is None else (await reply.stream.response("g"))[0]
            assert response["result"]["content"][0]["text"] == "grouped"
            ours, _ = await chain(r, "tools/call echo", header_trace)  # the member's own name, at its gateway
            http = await parent_of(r, ours)
            assert http.name == "POST /groups/{group}/mcp" and http.parent_id == header_span
            assert http.attributes["url.path"] == "/groups/team/mcp"


@pytest.mark.parametrize("path", PATHS)
async def test_a_2026_07_28_calls_next_round_links_the_question_it_answers(bridge: Any, path: str) -> None:
    async with receiver() as r:
        async with bridge({"servers": {"demo": demo()}, "telemetry": {"traces": {"endpoint": r.url}}}, env=FAST_EXPORT) as b:
            url = b.url("demo", "mcp")
            call = request("tools/call", {"name": "sample", "arguments": {"prompt": "2+2?"}}, rid=1, capabilities={"sampling": {}})
            call["params"]["_meta"]["traceparent"] = TRACEPARENT
            first = (await post(url, call, headers_for(call), path)).json()["result"]
            assert first["resultType"] == "input_required"
            again = retry(call, first, "4")
            final = (await post(url, again, headers_for(again), path)).final()
            assert final["result"]["content"][0]["text"] == "4"
            ours = await r.wait_for(bridge_span("tools/call sample"))
            asked = await r.wait_for(bridge_span("sampling/createMessage"))
            assert asked.parent_id == ours.span_id and asked.kind == CLIENT_KIND and ours.start <= asked.start <= asked.end <= ours.end
            # The retry's POST (the call's next round) links the question its inputResponses answered.
            second = await r.wait_for(lambda s: s.name == "POST /servers/{name}/mcp" and (TRACE, asked.span_id) in s.links)
            assert second.start <= asked.end and second.attributes["http.response.status_code"] == 200
