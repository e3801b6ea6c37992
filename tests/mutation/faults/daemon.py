"""Faults in the daemon's entry points: the app, the command line, ctl, the runtime."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {
    'bridge/app.py': ('tests/daemon/test_operations.py', 'tests/daemon/test_principals.py', 'tests/daemon/test_drain.py', 'tests/daemon/test_groups.py', 'tests/daemon/test_traces.py'),
    'bridge/cli.py': ('tests/daemon/test_supervision.py', 'tests/daemon/test_operators.py', 'tests/daemon/test_pinned_servers.py::test_a_lock_file_made_by_pins_lock_is_what_the_daemon_holds_to_and_ctl_shows_what_waits', 'tests/daemon/test_pinned_servers.py::test_a_pins_file_that_is_wrong_stops_start_up_naming_the_key'),
    'bridge/ctl.py': ('tests/daemon/test_operators.py::test_ctl_every_action', 'tests/daemon/test_pinned_servers.py::test_a_lock_file_made_by_pins_lock_is_what_the_daemon_holds_to_and_ctl_shows_what_waits'),
    'bridge/runtime.py': ('tests/unit/test_runtime.py',),
    'bridge/__main__.py': ('tests/daemon/test_supervision.py::test_check_bad_config_lists_every_problem',),
    'bridge/demo_server.py': ('tests/interop/test_interop_sdk.py::test_demo_server_basics',),
}

FAULTS: list[Fault] = [
    # app.py
    Fault('app-scrape-never-openmetrics', 'bridge/app.py', 'choose_encoder(request.headers.get("Accept", ""))', 'choose_encoder("")'),
    Fault('app-ready-while-draining', 'bridge/app.py', '    if request.app[LIVE].draining:\n        problems["drain"]', '    if False:\n        problems["drain"]'),
    Fault('app-status-all-for-everyone', 'bridge/app.py', '    if caller is not None and not caller.admin:', '    if False:'),
    Fault('app-status-servers-not-filtered', 'bridge/app.py', 'for name, g in gateways.items() if caller.may_use(name)}}', 'for name, g in gateways.items()}}'),
    Fault('app-status-groups-not-filtered', 'bridge/app.py', 'return {"members": list(group.allowed(principal)), "sessions": sum(1 for s in group.sessions.values() if s.owner == principal)}', 'return {"members": list(group.members), "sessions": len(group.sessions)}'),
    Fault('app-drain-ends-at-once', 'bridge/app.py', '        if not any(busy) and (forwarder is None or not forwarder.calls()):', '        if True:'),
    Fault('app-reload-keeps-changed-server', 'bridge/app.py', 'changed = [name for name in new.servers if name in old.servers and new.servers[name] != old.servers[name]]', 'changed: list[str] = []'),
    Fault('app-reload-limits-not-applied', 'bridge/app.py', '            gateway.update_limits(new.limits)\n', ''),
    # cli.py
    Fault('cli-bad-config-exit-1', 'bridge/cli.py', '        config = _load(args, notes)\n    except ConfigError as exc:\n        _print_problems(exc)\n        return EXIT_USAGE', '        config = _load(args, notes)\n    except ConfigError as exc:\n        _print_problems(exc)\n        return EXIT_ERROR'),
    Fault('cli-startup-failure-exit-0', 'bridge/cli.py', '        log.error("startup_failed", error=str(exc))\n        return EXIT_ERROR', '        log.error("startup_failed", error=str(exc))\n        return EXIT_OK'),
    # ctl.py
    Fault('ctl-refusal-exit-0', 'bridge/ctl.py', '        print(f"{method} {path}: {status} {_reason(body)}", file=sys.stderr)\n        return EXIT_REFUSED', '        print(f"{method} {path}: {status} {_reason(body)}", file=sys.stderr)'),
    Fault('ctl-no-token-sent', 'bridge/ctl.py', '    if token:\n        request.add_header("Authorization", f"Bearer {token}")', '    if False:\n        request.add_header("Authorization", f"Bearer {token}")'),
    Fault('ctl-filters-dropped', 'bridge/ctl.py', 'return "GET", "/admin/sessions" + (f"?{urllib.parse.urlencode(query)}" if query else "")', 'return "GET", "/admin/sessions"'),
    # runtime.py
    Fault('rt-open-files-not-raised', 'bridge/runtime.py', '            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))\n', ''),
    Fault('rt-survivors-not-frozen', 'bridge/runtime.py', '        gc.collect(1)\n        gc.freeze()', '        gc.collect(1)'),
    Fault('rt-full-walk-never', 'bridge/runtime.py', 'if arrivals() - seen >= max(FULL_AFTER, sessions()) or since_full >= GC_FULL_EVERY:', 'if since_full >= GC_FULL_EVERY:'),
    Fault('rt-full-walk-frozen', 'bridge/runtime.py', '            gc.unfreeze()\n            gc.collect()', '            gc.collect()'),
    Fault('rt-malloc-over-operator', 'bridge/runtime.py', '    if any(k in os.environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")):\n        return\n', ''),
    # __main__.py
    Fault('main-exit-code-lost', 'bridge/__main__.py', 'raise SystemExit(main())', 'main()'),
    # demo_server.py: the server the tests and the demo config serve
    Fault('demo-echo-drops-text', 'bridge/demo_server.py', '        return _text(_arg(args, "text", (str,)))', '        return _text("")'),
    Fault('demo-add-structured-wrong', 'bridge/demo_server.py', '        return {**_text(str(total)), "structuredContent": {"sum": total}}', '        return _text(str(total))'),
    # pins
    Fault('ctl-pins-approve-is-a-get', 'bridge/ctl.py', '        case "pins" if args.verb in ("approve", "reject"):', '        case "pins" if False:'),
    Fault('cli-pins-file-unchecked', 'bridge/cli.py', '            pinsfile.read(config.pins.path)', '            pass'),
]  # fmt: skip
