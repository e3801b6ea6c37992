"""The multiplexer: everything that decides where a message goes lives in this package.

A `Mux` sits between one upstream MCP server process and the client sessions
that share it. It does no IO: the gateway feeds it what it read and carries
out the `Action`s it returns, in order. It reads time only from the `clock` it
is given (tests pass a fake one) and asks for a wake-up with a `Timer` action.

Rules
-----
Each rule names where it is kept (`mux` is `mux.py`, the decisions that cross tables)
and the section of tests/unit/test_mux.py that holds it; tests/unit/test_mux_properties.py
checks rules 1-6 and 9 together, with two principals, as a state machine.

1. Ids. Every client request gets a fresh upstream id (a counter); the table
   `_calls` maps it back to (session, client id). Two sessions may use the
   same ids; one session may not reuse an id while it is in flight.
   [mux; id rewriting]
2. Tokens. A request's `_meta.progressToken` is replaced by its upstream id;
   `notifications/progress` goes only to the owner, with its own token back.
   [mux; progress and cancelling]
3. Cancellation. A client's `notifications/cancelled` is rewritten to the
   upstream id and the call is forgotten at once, so no late result reaches
   the client. A session that goes away cancels all of its calls upstream.
   Whatever cancels a call upstream (the client, its session closing, a
   timeout, shutdown) remembers it, so what the server still says of it is
   dropped without a warning.
   [mux; progress and cancelling]
4. Server requests. Requests from the server get a fresh downstream id and go
   to the session of the call that asked (see `_attribute`): the owner of a
   related task, else the call in its window, else among the sessions that
   declared the needed capability. stdio does not say which call asked, and
   servers ask early, so in shared mode a question that comes within
   `attribution_window` of a call's start belongs to that call. For that to
   name one call, calls that may lead to a question take turns (`_take_turn`)
   while some session can be asked: one from a session that can be asked goes
   alone, once no call is in its window, and holds the others until its
   session is asked something, it finishes or has had its window (a
   `roots/list`, which servers send of their own accord, and a question its
   session cannot answer are no sign it asked: its window goes on); calls of
   sessions that cannot be asked go together (a question then reaches
   nobody), but not beside one that may be asked. Held calls take turns by
   principal (the one served least recently goes next), so one principal's
   queue delays another's by one window at most. A question in the window of
   a call whose session cannot answer it gets the server an error; whether
   the call needs it is the server's to say, and when a stateless session's
   call that did not declare the capability then fails (an error, or a result
   marked `isError`), its answer is -32021 naming the capabilities asked for
   (a server that asks for several and goes on with those it gets is answered
   as it answers).
   After the windows, a further question goes to the call that asked last;
   while only calls of sessions that cannot answer are in flight, to nobody.
   A request about no call in flight goes to a session only when every
   session able to answer is one principal's. With no such session, or when
   that session leaves, the server gets an error at once. `ping` and, with
   configured roots, `roots/list` are answered here. A request whose call is
   known (`server_request_for`: the era translator's form of a 2026-07-28
   server's input_required) goes to that call's session with no guess. A
   stateless session is asked only during tools/call, prompts/get and
   resources/read (what 2026-07-28 may answer input_required): a question
   during another of its calls gets the server -32601, naming both.
   [attribution.py; mux `_take_turn`, `_server_request`; turns.py; peer.py `can_handle`; server requests, principals]
5. Shared state. In shared mode the bridge initializes the server itself,
   answers each client's `initialize` from the cached result and absorbs
   `notifications/initialized`; `ping` is answered here. Subscriptions are
   reference-counted per uri; the server's log level is the most verbose any
   session asked for, and each session only sees messages at its level.
   Tasks belong to the session that created them. A stateless session (a
   2026-07-28 request, see `adopt`) has no handshake: it is initialized from
   its request's own capabilities, and its `server/discover` is answered from
   the cached result like `initialize` (in per-session mode the bridge then
   initializes the process itself). It hears only about its own calls: log
   messages at the level its request asked for (none without one), and of
   list changes only those it listens to; a server request with no call in
   flight never goes to it.
   [shared.py, mux; shared state, stateless sessions]
6. Notifications from the server go to the sessions they concern: progress
   to the caller, `resources/updated` to subscribers, task and elicitation
   notices to their owner, list changes to every initialized session. Log
   messages (by level) and anything else are about the calls in flight, if
   any: they go only to the sessions of the principal whose calls those are,
   and are dropped while calls of several principals are in flight; with
   none in flight they are about the server and go to every session.
   Principals are trust boundaries: when in doubt, nothing crosses one.
   [notices.py (owners), mux; tasks, principals]
7. Restarts. When the process exits every call sent to it fails at once;
   calls that arrive while it is down wait in the backlog. A new process is
   initialized (with the bridge's or the client's own `initialize`) and gets
   the live subscriptions and log level replayed before anything else.
   [states.py, mux; lifecycle, process failures]
8. Views. A session may see only part of the server (its principal's `View`):
   lists lose what it may not see, `resources/updated` for a uri it may not
   see does not reach it, and a request that names a hidden tool, prompt,
   resource or template (`_FILTERED`, `_REFERENCES`: every request of the
   schema that names one) is answered as the server answers a name it does
   not have, learned once per mux by a probe that carries nothing of the
   request. Nothing of that request reaches the server. The server's pins
   (bridge/core/pins.py, `set_pins`) judge every list answer of tools, prompts
   and templates, and what they withhold is hidden from every session by the
   same tables, on top of its view (`PinsSeen` tells the gateway what changed).
   [views.py, mux `_hidden`, `_after_list`; views, pins]
9. Slots. With `max_calls` set, at most that many client calls are written to
   the process and not yet ended: answered, failed, or cancelled (by their
   client, a timeout, their session closing; a cancelled call's slot frees at
   once, as a server answers no cancelled call). Past it a call waits in a
   queue that takes turns by principal as held calls do (rule 4), and is
   written when a slot frees; a held call let through waits there too, and
   its attribution window starts when it is written. While the process is
   not ready, calls wait in that queue rather than in the backlog. The queue
   and the backlog together hold at most `max_backlog` messages: a call past
   that is refused (-32003). A waiting call that is cancelled, times out or
   whose session closes leaves the queue, and the next goes. When the process
   exits, waiting calls stay for the next one (as the backlog does); they
   fail when the server fails or the bridge shuts down. The bridge's own calls
   never wait, nor do a client's `initialize`, `ping`, `resources/subscribe`,
   `resources/unsubscribe` and `logging/setLevel`: the handshake and state
   the mux shares between sessions, whose order upstream is the mux's to keep
   (rule 5), and not what the cap guards (a server's tools racing each other).
   With no cap, this rule costs a call one attribute test (`_send_call`).
   [turns.py, mux `_send_call`; slots]
10. Counts. A session has at most `max_inflight` calls in flight (-32004 past it, as past the second)
   and `max_subscriptions` subscriptions; the calls in flight per principal are
   counted in a table every mux of the daemon shares (`in_flight`: the rate limits
   read it), incremented when a call is taken and decremented on every path that
   ends it (`_forget_call`).
   [mux `_forward_call`, `_forget_call`; bounds, principals]
11. Revisions. The mux knows no transport and no revision: it knows sessions that
   did the handshake and stateless ones (`adopt`). The endpoints and the era
   translator make each revision's messages into those.
   [peer.py, states.py; stateless sessions]
12. States. A process and a peer change state only through the tables of
   states.py (`move`), which raises on a change they do not hold.
   [states.py; lifecycle]

Theory of operation
-------------------
Sessions are opened and closed by the shells. Each client message passes
through `from_client`, each server message through `from_server`; process
lifecycle events through `server_started`, `server_exited`, `server_failed`;
time through `expire` and `timer`. Each returns a list of actions. What a peer
gets wrong never raises: `from_client` raises `ProtocolError` for a message
that is not valid JSON-RPC, before any state changes, and everything else
becomes an error reply or a `Discard` to log. What the shell gets wrong does:
naming a session that is not open is a `KeyError`, opening one twice a
`ValueError`. In per-session mode the same code runs with one session and
passes `initialize` and `ping` through; subscriptions and the log level are
tracked as in shared mode, for routing and for the replay after a restart.
A per-session process started ahead of its session (the warm pool: `warm`)
is not initialized, since only its session knows the version and
capabilities to initialize it with: until a session opens, a new process
gets a `ping` instead (the spec allows one before `initialize`) and is READY
once anything answers it. From then on its mux is that of a process started
for its session: the session's own `initialize` passes through, or a
stateless session's is sent from its request (`adopt`).
"""


from bridge.core.mux.actions import Abandoned, Action, Broadcast, Call, Discard, PinsSeen, RestartServer, ServerRequest, Timer, ToServer, ToSession
from bridge.core.mux.mux import CANCELLED_MEMORY, Mux, bridge_initialize_params, negotiate
from bridge.core.mux.notices import EARLY_NOTES
from bridge.core.mux.peer import Peer
from bridge.core.mux.states import IllegalTransition, PeerState, State, Waiting

__all__ = [
    "CANCELLED_MEMORY", "EARLY_NOTES", "Abandoned", "Action", "Broadcast", "Call", "Discard", "IllegalTransition", "Mux",
    "Peer", "PeerState", "PinsSeen", "RestartServer", "ServerRequest", "State", "Timer", "ToServer", "ToSession",
    "Waiting", "bridge_initialize_params", "negotiate",
]  # fmt: skip
