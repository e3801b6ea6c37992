"""Faults in the process pool."""

from __future__ import annotations

from faults.fault import Fault

TESTS = {
    'bridge/process/confine.py': ('tests/unit/test_confine_unit.py',),
    'bridge/process/env.py': ('tests/unit/test_child_env.py', 'tests/daemon/test_secrets.py'),
    'bridge/process/pool.py': ('tests/unit/test_pool_unit.py',),
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
]  # fmt: skip
