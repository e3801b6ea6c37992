"""Faults in the admin API and the status page."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {
    'bridge/ops/admin.py': ('tests/daemon/test_operators.py', 'tests/daemon/test_pinned_servers.py'),
    'bridge/ops/lock.py': ('tests/daemon/test_pinned_servers.py::test_a_lock_file_made_by_pins_lock_is_what_the_daemon_holds_to_and_ctl_shows_what_waits',),
    'bridge/ops/statuspage.py': ('tests/daemon/test_operators.py::test_status_page_assets_are_served_to_anyone_locked_down', 'tests/daemon/test_operators.py'),
}

FAULTS: list[Fault] = [
    # admin.py
    Fault('admin-server-filter-ignored', 'bridge/ops/admin.py', '        if server is None or name == server\n', ''),
    Fault('admin-principal-filter-ignored', 'bridge/ops/admin.py', '        if owner is None or s.owner == owner\n', ''),
    Fault('admin-idle-is-age', 'bridge/ops/admin.py', '"idle_s": round(now - session.last_seen, 3),', '"idle_s": round(now - session.created, 3),'),
    Fault('admin-ambiguous-prefix-taken', 'bridge/ops/admin.py', '    if len(found) > 1:\n        raise HttpError(409,', '    if False:\n        raise HttpError(409,'),
    Fault('admin-hangup-cancels-restart', 'bridge/ops/admin.py', '    count = await asyncio.shield(task)', '    count = await task'),
    Fault('admin-restart-twice', 'bridge/ops/admin.py', '    if gateway.restarting:\n        raise HttpError(409,', '    if False:\n        raise HttpError(409,'),
    Fault('admin-rejected-reload-200', 'bridge/ops/admin.py', 'return web.json_response({"reloaded": False, "problems": problems}, status=422)', 'return web.json_response({"reloaded": False, "problems": problems})'),
    Fault('admin-changes-unaudited', 'bridge/ops/admin.py', '    _audit(request, "end_session", server=gateway.name, session=session.id, principal_of_session=session.owner, calls_failed=failed)\n', ''),
    # statuspage.py
    Fault('ui-inline-script-allowed', 'bridge/ops/statuspage.py', '"default-src \'none\'; script-src \'self\';', '"default-src \'none\'; script-src \'self\' \'unsafe-inline\';'),
    Fault('ui-framable', 'bridge/ops/statuspage.py', '"form-action \'none\'; frame-ancestors \'none\'; base-uri \'none\'"', '"form-action \'none\'; base-uri \'none\'"'),
    Fault('ui-sniffable', 'bridge/ops/statuspage.py', '    "X-Content-Type-Options": "nosniff",\n', ''),
    # admin.py: pins
    Fault('admin-pins-not-announced', 'bridge/ops/admin.py', '    gateway.withheld_changed(before)\n', ''),
    Fault('admin-pins-names-ignored', 'bridge/ops/admin.py', '        names = body.get("names")', '        names = None'),
    # lock.py
    Fault('lock-empty-kinds-unrecorded', 'bridge/ops/lock.py', '            pins.see(kind, items, Mode.HOLD, now)', '            if items:\n                pins.see(kind, items, Mode.HOLD, now)'),
    Fault('lock-undeclared-kinds-asked', 'bridge/ops/lock.py', '            if CAPABILITY[kind] not in capabilities:\n                continue\n', ''),
]  # fmt: skip
