// A 2026-07-28 client (@modelcontextprotocol/client, pinned) against the bridge: node modern_client.mjs URL [PREFIX]
// (PREFIX: what the tools' names begin with, as a group shows them, e.g. `demo__`).
// Lists tools, calls echo, and a tool that samples (answered through input_required); prints one JSON line.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const url = process.argv[2];
const prefix = process.argv[3] ?? '';
const client = new Client(
    { name: 'ts-modern', version: '1.0.0' },
    { capabilities: { sampling: {} }, versionNegotiation: { mode: { pin: '2026-07-28' } } }
);
client.setRequestHandler('sampling/createMessage', async request => ({
    model: 'ts-model',
    role: 'assistant',
    content: { type: 'text', text: `ts answers ${request.params.messages.at(-1).content.text}` }
}));
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const tools = await client.listTools();
const echoed = await client.callTool({ name: `${prefix}echo`, arguments: { text: 'from typescript' } });
const sampled = await client.callTool({ name: `${prefix}sample`, arguments: { prompt: 'ts prompt' } });
console.log(JSON.stringify({
    tools: tools.tools.map(t => t.name),
    echoed: echoed.content[0].text,
    sampled: sampled.content[0].text,
    serverInfo: echoed._meta?.['io.modelcontextprotocol/serverInfo']?.name ?? null
}));
await client.close();
