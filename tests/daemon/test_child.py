"""One stdio process (bridge.process.child.Child) on its own: when its owner hears its output, and how it ends."""

from __future__ import annotations

import asyncio
import traceback

from support.daemon import PY

from bridge.process.child import Child

# Echoes each line of stdin to stdout; says goodbye when stdin closes.
ECHO = "import sys\nfor line in sys.stdin:\n    print(line, end='', flush=True)\nprint('bye', flush=True)\n"
ROUNDS = 20


async def test_a_read_of_stdout_reaches_the_owner_in_the_callback_that_read_it() -> None:
    """Each line is handed over by the pipe's own read callback (asyncio's subprocess
    transport would defer it to a later turn of the loop), and the end of the pipe is
    still seen: the last line comes before the exit, and the exit waits for no timeout."""
    lines: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue(maxsize=ROUNDS + 1)

    def on_line(line: bytes) -> None:
        in_read = any(frame.name == "_read_ready" for frame in traceback.extract_stack())
        lines.put_nowait((line, in_read))

    child = Child(
        server="echo", command=PY, args=["-c", ECHO], max_line=1 << 20, input_limit=1 << 20,
        on_line=on_line, on_oversize=lambda size, head, tail: None,
    )  # fmt: skip
    await child.start()
    try:
        for i in range(ROUNDS):
            assert child.send(b'{"n":%d}\n' % i).value == "sent"
            line, in_read = await asyncio.wait_for(lines.get(), 10)
            assert line == b'{"n":%d}' % i and in_read, (line, in_read)
        code = await child.stop(timeout=5)
        assert code == 0
        assert lines.get_nowait() == (b"bye", True)  # before the exit was reported
        assert child._closed is not None and child._closed.done()  # the pipe's end reached the transport
    finally:
        child.signal_group(9)
