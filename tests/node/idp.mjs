// A real OAuth 2.1 / OpenID authorization server for the sign-in tests: the npm
// package `oidc-provider` (pinned in package.json), configured here and nothing
// more. tests/idp.py starts it; nothing in it is written for the bridge.
//
//   node idp.mjs [PORT]      PORT (or IDP_PORT) 0 = ephemeral; listens on 127.0.0.1 only
//
// Environment:
//   IDP_JWKS      path of a JWKS file with the *private* signing keys (RS256 and/or
//                 ES256), written by the test so that it can mint tokens with the same
//                 keys. Required. SIGHUP reloads it: the keys change without a restart
//                 (registered clients, grants and sessions are kept).
//   IDP_ACCOUNTS  JSON {"account id": {"groups": [...]}}; default alice: [mcp:all],
//                 bob: [mcp:time]. Only these can log in.
//   IDP_SCOPES    space-separated resource scopes; default "mcp:time mcp:all".
//   IDP_ACCESS_TOKEN_ALG  JWS algorithm of access tokens; default RS256.
//
// What it serves: discovery (/.well-known/openid-configuration and
// /.well-known/oauth-authorization-server), open dynamic client registration
// (RFC 7591, no initial access token), the authorization code flow with PKCE S256
// required for every client, and resource indicators (RFC 8707): an access token
// requested for a `resource` of the form http://127.0.0.1:PORT[/path] is a JWT
// (typ at+jwt) whose `aud` is that resource, with `scope` and the account's
// `groups`. Any other resource is refused (invalid_target).
//
// Interactions are automatable over plain HTTP: the authorization endpoint
// redirects to /interaction/UID; `POST /interaction/UID` with the form field
// `login=ACCOUNT` logs that account in when the prompt is login, grants everything
// asked when the prompt is consent, and answers 303 to where the flow resumes.
//
// Stdout carries one JSON line per event, so the test waits on events, not time:
//   {"event": "listening", "issuer": ..., "port": ..., "kids": [...]}
//   {"event": "keys_loaded", "kids": [...]}   after a SIGHUP
//   {"event": "keys_failed", "error": ...}    a SIGHUP whose file is unusable (old keys kept)
// It exits on SIGTERM/SIGINT, and when its stdin closes (its test is gone).

import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

import Provider, { errors } from 'oidc-provider';
// The package's own in-memory adapter (it has no exports map; the version is pinned),
// one store for the process so that a Provider rebuilt with new keys keeps the state.
import { createMemoryAdapter } from 'oidc-provider/lib/adapters/memory_adapter.js';

const port = Number(process.argv[2] ?? process.env.IDP_PORT ?? 0);
const jwksPath = process.env.IDP_JWKS;
if (!jwksPath) {
  console.error('idp.mjs: IDP_JWKS (path of a JWKS file with private keys) is required');
  process.exit(2);
}
const accounts = JSON.parse(
  process.env.IDP_ACCOUNTS ?? '{"alice": {"groups": ["mcp:all"]}, "bob": {"groups": ["mcp:time"]}}',
);
const resourceScopes = (process.env.IDP_SCOPES ?? 'mcp:time mcp:all').split(/\s+/).filter(Boolean);
const accessTokenAlg = process.env.IDP_ACCESS_TOKEN_ALG ?? 'RS256';
const LOOPBACK_RESOURCE = /^http:\/\/127\.0\.0\.1:\d+(\/[^?#]*)?$/;
// Cookie signing keys live for the process so that a key reload keeps interactions going.
const cookieKeys = [randomBytes(32).toString('base64url')];
const adapter = createMemoryAdapter();
const MAX_FORM_BYTES = 4096;

// Stdout is for events only: oidc-provider's notices (console.info) go to stderr.
console.log = console.error;
console.info = console.error;

function emit(event) {
  process.stdout.write(`${JSON.stringify(event)}\n`);
}

function loadJwks() {
  const jwks = JSON.parse(readFileSync(jwksPath, 'utf8'));
  if (!Array.isArray(jwks.keys) || jwks.keys.length === 0) {
    throw new Error(`${jwksPath}: no keys`);
  }
  return jwks;
}

async function readForm(req) {
  let body = '';
  for await (const chunk of req) {
    body += chunk;
    if (body.length > MAX_FORM_BYTES) return null;
  }
  return new URLSearchParams(body);
}

async function grantEverythingAsked(provider, { grantId, session, params, prompt: { details } }) {
  const grant = grantId
    ? await provider.Grant.find(grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (details.missingOIDCScope) grant.addOIDCScope(details.missingOIDCScope.join(' '));
  if (details.missingOIDCClaims) grant.addOIDCClaims(details.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(details.missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  return grant.save();
}

function refuse(ctx, description) {
  ctx.status = 400;
  ctx.body = { error: 'invalid_request', error_description: description };
}

// POST /interaction/UID: the login and consent steps, without pages.
async function interaction(ctx, next) {
  if (ctx.method !== 'POST' || !/^\/interaction\/[\w-]+$/.test(ctx.path)) return next();
  const provider = ctx.app;
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  let result;
  switch (details.prompt.name) {
    case 'login': {
      const form = await readForm(ctx.req);
      if (!form) return refuse(ctx, `form over ${MAX_FORM_BYTES} bytes`);
      const login = form.get('login');
      if (!Object.hasOwn(accounts, login ?? '')) return refuse(ctx, `unknown account ${JSON.stringify(login)}`);
      result = { login: { accountId: login } };
      break;
    }
    case 'consent':
      result = { consent: { grantId: await grantEverythingAsked(provider, details) } };
      break;
    default:
      return refuse(ctx, `prompt ${details.prompt.name} is not automated`);
  }
  ctx.status = 303;
  ctx.redirect(await provider.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: false }));
}

function build(issuer, jwks) {
  const provider = new Provider(issuer, {
    adapter,
    jwks,
    cookies: { keys: cookieKeys },
    scopes: ['openid', 'offline_access', ...resourceScopes],
    responseTypes: ['code'],
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (ctx, client, oneOf) => oneOf,
        // A token request without `resource` gets a token for the one granted at authorization.
        useGrantedResource: () => true,
        getResourceServerInfo(ctx, resource) {
          if (!LOOPBACK_RESOURCE.test(resource)) throw new errors.InvalidTarget();
          return {
            scope: resourceScopes.join(' '),
            audience: resource,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: accessTokenAlg } },
          };
        },
      },
    },
    interactions: { url: (ctx, { uid }) => `/interaction/${uid}` },
    async findAccount(ctx, id) {
      if (!Object.hasOwn(accounts, id)) return undefined;
      return { accountId: id, claims: () => ({ sub: id }) };
    },
    extraTokenClaims(ctx, token) {
      const account = token.accountId && accounts[token.accountId];
      return account ? { groups: account.groups ?? [] } : undefined;
    },
    renderError(ctx, out) {
      ctx.type = 'json';
      ctx.body = out;
    },
  });
  provider.use(interaction);
  return provider;
}

const kids = ({ keys }) => keys.map((k) => k.kid);
const server = createServer();
let handle;

server.listen(port, '127.0.0.1', () => {
  const bound = server.address().port;
  const issuer = `http://127.0.0.1:${bound}`;
  const jwks = loadJwks();
  handle = build(issuer, jwks).callback();
  server.on('request', (req, res) => handle(req, res));

  process.on('SIGHUP', () => {
    try {
      const next = loadJwks();
      // A new Provider with the same issuer, cookie keys and store: clients, grants
      // and sessions carry over.
      handle = build(issuer, next).callback();
      emit({ event: 'keys_loaded', kids: kids(next) });
    } catch (error) {
      emit({ event: 'keys_failed', error: String(error) });
    }
  });
  emit({ event: 'listening', issuer, port: bound, kids: kids(jwks) });
});

function stop() {
  server.close();
  server.closeAllConnections();
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.stdin.on('end', stop);
process.stdin.resume();
