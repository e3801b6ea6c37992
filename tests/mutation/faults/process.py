"""Faults in the process layer: the pool, confinement, the environment, the child and its supervisor."""

from __future__ import annotations

from faults.fault import Fault

TESTS = {
    'bridge/process/confine.py': ('tests/unit/test_confine_unit.py',),
    'bridge/process/env.py': ('tests/unit/test_child_env.py', 'tests/daemon/test_secrets.py'),
    'bridge/process/pool.py': ('tests/unit/test_pool_unit.py',),
    'bridge/process/child.py': ('tests/unit/test_framing.py', 'tests/daemon/test_child.py', 'tests/daemon/test_supervision.py', 'tests/daemon/test_drain.py'),
    'bridge/process/supervisor.py': ('tests/unit/test_supervisor_unit.py', 'tests/daemon/test_supervision.py'),
    'bridge/process/cgroups.py': (
        'tests/daemon/test_confine.py::test_check_says_how_the_memory_limit_is_enforced',
        'tests/daemon/test_confine.py::test_a_hybrid_host_with_no_v2_memory_controller_falls_back_to_the_address_space',
        'tests/daemon/test_confine.py::test_a_server_group_is_made_limited_joined_read_and_removed_on_a_v2_host',
        'tests/daemon/test_confine.py::test_a_daemon_sharing_its_group_with_other_processes_moves_back_and_falls_back',
    ),
    'bridge/process/procstat.py': ('tests/unit/test_procstat.py',),
}

FAULTS = [
    Fault('pool-refill-before-sessions', 'bridge/process/pool.py', '        if not self.waiters:\n            for pool in list(self.pools):', '        if True:\n            for pool in list(self.pools):', equivalent='refill() itself starts nothing while a session waits'),
    Fault('pool-refill-while-waiting', 'bridge/process/pool.py', ' and self.room() and not self.slots.waiters:', ' and self.room():', equivalent='changed() refills only once nobody waits, and a warm process taken directly leaves no slot a waiting session could use'),
    Fault('pool-last-come-first-served', 'bridge/process/pool.py', 'self.waiters = deque(w for w in self.waiters if not (w.done() or w.serve()))', 'self.waiters = deque(reversed([w for w in reversed(self.waiters) if not (w.done() or w.serve())]))'),
    Fault('pool-left-client-keeps-process', 'bridge/process/pool.py', '                self.give_back(future.result())', '                pass'),
    Fault('pool-warm-given-back-stopped', 'bridge/process/pool.py', '        if member.warm and self.active:', '        if False:'),
    Fault('pool-retry-after-fixed', 'bridge/process/pool.py', 'return max(1, math.ceil(self.settings.wait))', 'return 5'),
    Fault('env-daemon-environment-leaks', 'bridge/process/env.py', '    env = {k: v for k, v in environ.items() if k in names or k.startswith(prefixes)}', '    env = dict(environ)'),
    Fault('env-prefixes-ignored', 'bridge/process/env.py', '    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))', '    prefixes = ()'),
    Fault('env-inherit-env-ignored', 'bridge/process/env.py', '    patterns = CHILD_ENV + server.inherit_env', '    patterns = CHILD_ENV'),
    Fault('env-daemon-over-server', 'bridge/process/env.py', '    env.update(server.env)', '    env = {**server.env, **env}'),
    Fault('env-own-bin-shadows', 'bridge/process/env.py', 'env["PATH"] = f"{path}{os.pathsep}{own_bin}" if path else own_bin', 'env["PATH"] = f"{own_bin}{os.pathsep}{path}" if path else own_bin'),
    Fault('confine-oom-blamed-without-limit', 'bridge/process/confine.py', '    if oom_kills and rlimits.memory is not None:', '    if oom_kills:'),
    Fault('confine-sigxcpu-ignored', 'bridge/process/confine.py', '    if code == -signal.SIGXCPU and rlimits.cpu_time is not None:', '    if False:'),
    Fault('confine-sign-without-limit', 'bridge/process/confine.py', '            if getattr(rlimits, limit) is not None and any(sign in line for sign in signs):', '            if any(sign in line for sign in signs):'),
    Fault('confine-under-shares-prefix', 'bridge/process/confine.py', '    return path == folder or path.startswith(folder.rstrip("/") + "/")', '    return path.startswith(folder.rstrip("/"))'),
    Fault('confine-writable-not-exempt', 'bridge/process/confine.py', 'and _within(path, "/tmp") and not any(_within(path, w) for w in sandbox.writable)', 'and _within(path, "/tmp")'),
    # child.py
    Fault('framer-oversize-unreported', 'bridge/process/child.py', '            self._on_oversize(len(line), line[:EDGE], line[-EDGE:])\n        elif line.strip():', '            pass\n        elif line.strip():'),
    Fault('framer-blank-lines-emitted', 'bridge/process/child.py', '        elif line.strip():\n            self._on_line(line)', '        else:\n            self._on_line(line)'),
    Fault('framer-split-line-loses-start', 'bridge/process/child.py', '                self._buf += data[start:end]\n                self._emit(bytes(self._buf))', '                self._emit(data[start:end])'),
    Fault('child-no-sigkill', 'bridge/process/child.py', 'for sig, wait in ((signal.SIGTERM, timeout - grace), (signal.SIGKILL, grace)):', 'for sig, wait in ((signal.SIGTERM, timeout - grace),):'),
    Fault('child-group-survives-leader', 'bridge/process/child.py', '        self.signal_group(signal.SIGKILL)\n        assert self._transport is not None', '        assert self._transport is not None'),
    Fault('child-stderr-tail-not-kept', 'bridge/process/child.py', '        self._stderr_tail.append(line[:TAIL_LINE_BYTES])\n        if (held', '        if (held'),
    Fault('child-read-not-flushed', 'bridge/process/child.py', '            self._stdout.feed(data)\n            self._on_batch()  # every line of this read is handed over', '            self._stdout.feed(data)'),
    # supervisor.py
    Fault('sup-no-crash-loop', 'bridge/process/supervisor.py', '        if recent > policy.max_restarts:\n            return policy.backoff_max, True', '        if False:\n            return policy.backoff_max, True'),
    Fault('sup-old-exits-counted', 'bridge/process/supervisor.py', '        while self._exits and self._exits[0] < now - policy.window:\n            self._exits.popleft()\n', ''),
    Fault('sup-no-backoff', 'bridge/process/supervisor.py', '        return base * (0.8 + 0.4 * self._jitter()), False', '        return 0.0, False'),
    Fault('sup-restarts-uncounted', 'bridge/process/supervisor.py', '            self.restarts += 1\n', ''),
    # cgroups.py
    Fault('cg-no-limit-written', 'bridge/process/cgroups.py', '            (path / "memory.max").write_text(str(limit))\n', ''),
    Fault('cg-oom-kills-misread', 'bridge/process/cgroups.py', '                if key == "oom_kill":', '                if key == "oom":'),
    Fault('cg-no-memory-controller-taken', 'bridge/process/cgroups.py', '    if "memory" not in offered:\n        return Probe(', '    if False:\n        return Probe('),
    Fault('cg-shared-group-not-moved-back', 'bridge/process/cgroups.py', '                (group / "cgroup.procs").write_text(str(os.getpid()))\n        if exc.errno', '                pass\n        if exc.errno'),
    Fault('cg-group-not-removed', 'bridge/process/cgroups.py', '                self.path.rmdir()\n                return\n            except FileNotFoundError:', '                return\n            except FileNotFoundError:'),
    # procstat.py
    Fault('procstat-rss-in-pages', 'bridge/process/procstat.py', '            int(fields[_RSS]) * _PAGE,', '            int(fields[_RSS]),'),
    Fault('procstat-cpu-user-only', 'bridge/process/procstat.py', '            (int(fields[_UTIME]) + int(fields[_STIME])) / _TICKS,', '            int(fields[_UTIME]) / _TICKS,'),
    Fault('procstat-command-name-split', 'bridge/process/procstat.py', 'fields = stat[stat.rfind(b")") + 2 :].split()', 'fields = stat[stat.find(b")") + 2 :].split()'),
]  # fmt: skip
