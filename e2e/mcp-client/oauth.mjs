// End-to-end check of gpuproxy's OAuth 2.1 authorization for remote MCP
// with the official TypeScript SDK's OAuth client: the SDK discovers the
// authorization server from /mcp's 401, registers itself, starts the
// authorization code flow with PKCE and exchanges the code; the person's
// consent on the console (sign-in with an API key, Approve) is automated
// here with plain HTTP requests, as a browser would send them. Then it
// lists the tools and reads spending with the token, and recovers from an
// expired access token through the refresh token. Any failure exits
// non-zero.
//
// Environment:
//   GPUPROXY_URL      base URL of the server
//   GPUPROXY_API_KEY  the key the person signs in with (an assistant key)

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';

const base = (process.env.GPUPROXY_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
const key = process.env.GPUPROXY_API_KEY;
const redirectUrl = 'http://127.0.0.1:45871/callback';

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

// A browser, reduced to what the consent step needs: one cookie jar, no
// automatic redirects.
class Browser {
  constructor() { this.cookies = new Map(); }
  async go(url, init = {}) {
    const headers = { ...(init.headers || {}) };
    if (this.cookies.size) headers.Cookie = [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
    const res = await fetch(new URL(url, base), { ...init, headers, redirect: 'manual' });
    for (const c of res.headers.getSetCookie()) {
      const [kv] = c.split(';');
      const i = kv.indexOf('=');
      this.cookies.set(kv.slice(0, i), kv.slice(i + 1));
    }
    return res;
  }
  async post(url, form) {
    return this.go(url, { method: 'POST', body: new URLSearchParams(form),
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', 'Sec-Fetch-Site': 'same-origin' } });
  }
}

function redirectOf(res, step) {
  check(res.status >= 300 && res.status < 400, `${step}: status ${res.status}, want a redirect`);
  return new URL(res.headers.get('location'), base).toString();
}

// consent plays the person: open the authorization URL, sign in on the
// console with the API key, approve; returns the code sent to the client.
async function consent(authorizationUrl) {
  const b = new Browser();
  let to = redirectOf(await b.go(authorizationUrl), 'authorize');
  check(to.includes('/console/oauth/authorize?id='), `authorize went to ${to}, want the console's consent page`);
  const login = redirectOf(await b.go(to), 'consent without a session');
  check(login.includes('/console/login'), `consent went to ${login}, want the sign-in`);
  const next = new URL(login).searchParams.get('next');
  const back = redirectOf(await b.post('/console/login', { api_key: key, next }), 'sign-in');
  const page = await (await b.go(back)).text();
  check(page.includes('Approve'), `the consent page has no Approve button:\n${page}`);
  const csrf = page.match(/name="csrf" value="([^"]+)"/)[1];
  const id = page.match(/name="id" value="([^"]+)"/)[1];
  to = redirectOf(await b.post('/console/oauth/authorize', { csrf, id, decision: 'approve' }), 'approve');
  const cb = new URL(redirectOf(await b.go(to), 'callback'));
  check(cb.origin + cb.pathname === redirectUrl, `the code went to ${cb}, want ${redirectUrl}`);
  const code = cb.searchParams.get('code');
  check(code, `no code in ${cb}`);
  return code;
}

// The client's OAuth state, kept in memory as a real client keeps it on
// disk.
class Provider {
  constructor() { this.info = undefined; this.saved = undefined; this.verifier = undefined; this.code = undefined; this.redirects = 0; }
  get redirectUrl() { return redirectUrl; }
  get clientMetadata() {
    return { client_name: 'gpuproxy e2e (TypeScript SDK)', redirect_uris: [redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'], token_endpoint_auth_method: 'none' };
  }
  state() { return 'e2e-state'; }
  clientInformation() { return this.info; }
  saveClientInformation(info) { this.info = info; }
  tokens() { return this.saved; }
  saveTokens(t) { this.saved = t; }
  async redirectToAuthorization(url) {
    this.redirects++;
    check(url.searchParams.get('code_challenge_method') === 'S256', `the SDK asked for ${url.searchParams.get('code_challenge_method')}`);
    this.code = await consent(url.toString());
  }
  saveCodeVerifier(v) { this.verifier = v; }
  codeVerifier() { return this.verifier; }
}

async function connect(provider) {
  const client = new Client({ name: 'gpuproxy-oauth-e2e', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(base + '/mcp'), { authProvider: provider });
  await client.connect(transport);
  return client;
}

async function main() {
  check(key, 'GPUPROXY_API_KEY is required');
  const provider = new Provider();

  // First connection: 401, discovery, registration, consent, code.
  const transport = new StreamableHTTPClientTransport(new URL(base + '/mcp'), { authProvider: provider });
  const first = new Client({ name: 'gpuproxy-oauth-e2e', version: '1.0.0' });
  let unauthorized = false;
  try {
    await first.connect(transport);
  } catch (e) {
    unauthorized = e instanceof UnauthorizedError;
    if (!unauthorized) throw e;
  }
  check(unauthorized, 'the first connection did not need authorization');
  check(provider.info?.client_id, 'the SDK did not register a client');
  check(provider.code, 'the consent step produced no code');
  await transport.finishAuth(provider.code);
  check(provider.saved?.access_token && provider.saved?.refresh_token, `no tokens saved: ${JSON.stringify(provider.saved)}`);
  console.log(`ok   authorized: client ${provider.info.client_id}, scope "${provider.saved.scope}"`);

  // With the token.
  let client = await connect(provider);
  const tools = (await client.listTools()).tools.map((t) => t.name).sort();
  check(tools.includes('get_billing_transactions') && tools.includes('create_gpu_instance'), `tools: ${tools}`);
  const spending = await client.callTool({ name: 'get_spending_info', arguments: {} });
  check(!spending.isError, `get_spending_info failed: ${JSON.stringify(spending)}`);
  await client.close();
  console.log(`ok   tools with the token: ${tools.length}`);

  // An access token that no longer works: the SDK refreshes (the refresh
  // token rotates) without asking the person again.
  const oldRefresh = provider.saved.refresh_token;
  provider.saveTokens({ ...provider.saved, access_token: 'expired' });
  const redirectsBefore = provider.redirects;
  let refreshed = false;
  try {
    client = await connect(provider);
    refreshed = true;
  } catch (e) {
    if (!(e instanceof UnauthorizedError)) throw e;
  }
  if (!refreshed) {
    // Some SDK versions surface the 401 first and refresh in auth(); the
    // next connection then carries the new token.
    client = await connect(provider);
  }
  check(provider.redirects === redirectsBefore, 'the refresh asked the person again');
  check(provider.saved.refresh_token && provider.saved.refresh_token !== oldRefresh, 'the refresh token did not rotate');
  check((await client.listTools()).tools.length === tools.length, 'tools after refresh differ');
  await client.close();
  console.log('ok   refreshed with a rotated refresh token');
  console.log('oauth e2e: passed');
}

const timer = setTimeout(() => { console.error('oauth e2e: timed out'); process.exit(2); }, 60000);
main().then(() => { clearTimeout(timer); }, (e) => {
  console.error(`FAIL ${e.stack || e}`);
  process.exit(1);
});
