// End-to-end check of gpuproxy's MCP surface with the official TypeScript
// SDK client, against a sandbox server (simulated providers).
//
// Over each transport — stdio (spawning `gpuproxy mcp`), Streamable HTTP
// (/mcp) and legacy HTTP+SSE (/api/v1/mcp/sse) — it lists the tools and
// the prompts, expands one (and is refused without a required argument),
// completes a GPU name, rents the cheapest offer (with progress
// notifications), reads spending://current, is refused when renting past
// the spending limit,
// destroys the instance, rents one by spec (attempts in the result) and is
// told no_matching_offer with the nearest miss for a spec under every
// offer, creates, lists, shows, updates and deletes a service, and reads
// the unit economics of what it rented. Any failure exits non-zero.
//
// Environment:
//   GPUPROXY_URL        base URL of the server (default http://127.0.0.1:8080)
//   GPUPROXY_API_KEY    an assistant key of an account with a small limit
//   MCP_STDIO_COMMAND   JSON array: the stdio server command
//                       (default ["gpuproxy","mcp"]); it inherits this
//                       environment, so GPUPROXY_API_KEY reaches it
//   E2E_TRANSPORTS      comma-separated subset of stdio,streamable,sse
//   E2E_TIMEOUT_MS      overall deadline (default 180000)
//   GPUPROXY_CONFIRM_KEY when set, an assistant key with confirm_above below
//                       the cheapest offer: confirmation is checked by
//                       elicitation (Streamable HTTP) and by confirm token
//                       (plain POST /api/v1/mcp)

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const base = (process.env.GPUPROXY_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
const key = process.env.GPUPROXY_API_KEY;
const stdioCommand = JSON.parse(process.env.MCP_STDIO_COMMAND || '["gpuproxy","mcp"]');
const wanted = (process.env.E2E_TRANSPORTS || 'stdio,streamable,sse').split(',').map((s) => s.trim()).filter(Boolean);
const deadline = Number(process.env.E2E_TIMEOUT_MS || 180000);

// An assistant key has every tool, its own account's billing included.
const assistantTools = [
  'check_spending_limit', 'create_gpu_instance', 'create_service', 'delete_service', 'destroy_gpu_instance',
  'get_billing_transactions', 'get_service', 'get_spending_info', 'get_unit_economics', 'keep_gpu_instance_alive',
  'list_gpu_instances', 'list_my_instances', 'list_services', 'proxy_inference_request', 'update_gpu_instance',
  'update_service',
];

// The prompts an assistant key sees (all of them).
const assistantPrompts = ['explain_refusal', 'rent_gpu_for_model', 'weekly_spend_report'];

class CheckFailed extends Error {}

function check(cond, msg) {
  if (!cond) throw new CheckFailed(msg);
}

function textOf(result) {
  return (result.content || []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

function transportFor(name) {
  const headers = { 'X-API-Key': key };
  switch (name) {
    case 'stdio':
      return new StdioClientTransport({
        command: stdioCommand[0],
        args: stdioCommand.slice(1),
        env: { ...process.env },
        stderr: 'inherit',
      });
    case 'streamable':
      return new StreamableHTTPClientTransport(new URL(base + '/mcp'), { requestInit: { headers } });
    case 'sse':
      return new SSEClientTransport(new URL(base + '/api/v1/mcp/sse'), { requestInit: { headers } });
    default:
      throw new CheckFailed(`unknown transport ${name}`);
  }
}

// callOK calls a tool that must succeed and returns its structured content.
async function callOK(client, name, args, options) {
  const res = await client.callTool({ name, arguments: args }, undefined, options);
  check(!res.isError, `${name} failed: ${textOf(res)}`);
  check(res.structuredContent && typeof res.structuredContent === 'object', `${name}: no structuredContent`);
  check(textOf(res).length > 0, `${name}: no text rendering`);
  return res.structuredContent;
}

async function exercise(name) {
  const client = new Client({ name: 'gpuproxy-e2e', version: '1.0.0' });
  const log = (...a) => console.log(`[${name}]`, ...a);
  await client.connect(transportFor(name));
  try {
    const info = client.getServerVersion();
    check(info && info.name === 'gpuproxy', `server info: ${JSON.stringify(info)}`);

    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name).sort();
    check(JSON.stringify(names) === JSON.stringify(assistantTools), `tools: ${names}`);
    for (const t of tools) {
      check(t.description && t.inputSchema && t.outputSchema && t.annotations, `tool ${t.name} lacks metadata`);
    }
    log(`${tools.length} tools`);

    // Prompts (slash commands) expand to messages naming the tools;
    // completions suggest GPU names from the live offers.
    const { prompts } = await client.listPrompts();
    const promptNames = prompts.map((p) => p.name).sort();
    check(JSON.stringify(promptNames) === JSON.stringify(assistantPrompts), `prompts: ${promptNames}`);
    const rent = await client.getPrompt({ name: 'rent_gpu_for_model',
      arguments: { model: 'meta-llama/Llama-3.1-8B-Instruct', budget_per_hour: '0.5' } });
    const rentText = rent.messages.map((m) => m.content.text).join('\n');
    check(rent.messages.length === 1 && rent.messages[0].role === 'user' && /create_gpu_instance/.test(rentText) &&
      /"max_price_per_hour": 0\.5/.test(rentText), `rent_gpu_for_model: ${JSON.stringify(rent)}`);
    let missing = '';
    try {
      await client.getPrompt({ name: 'rent_gpu_for_model', arguments: { model: 'x' } });
    } catch (err) {
      missing = String(err?.message || err);
    }
    check(/budget_per_hour/.test(missing), `a missing argument: ${missing || 'accepted'}`);
    const done = await client.complete({ ref: { type: 'ref/prompt', name: 'rent_gpu_for_model' },
      argument: { name: 'gpu', value: '4090' } });
    check(done.completion.values.length > 0 && done.completion.values.every((v) => /4090/.test(v)),
      `gpu completions: ${JSON.stringify(done.completion)}`);
    log(`${prompts.length} prompts; gpu "4090" completes to ${done.completion.values.join(', ')}`);

    const offers = await callOK(client, 'list_gpu_instances', { provider: 'vast.ai', max_price: 1, limit: 5 });
    check(offers.offers.length > 0, 'no offers under $1/h');
    const offer = offers.offers[0];
    log(`cheapest offer ${offer.instance_id}: ${offer.gpu_name} at $${offer.price_per_hour}/h`);

    let progress = 0;
    const inst = await callOK(client, 'create_gpu_instance', {
      provider: offer.provider,
      instance_id: offer.instance_id,
      image: 'vllm/vllm-openai:latest',
      idempotency_key: `e2e-${name}-${Date.now()}`,
    }, { onprogress: () => { progress++; }, timeout: 120000, resetTimeoutOnProgress: true });
    check(inst.status === 'running' && inst.endpoint, `created instance: ${JSON.stringify(inst)}`);
    check(progress > 0, 'no progress notifications while the instance started');
    log(`created ${inst.id} (${progress} progress notifications), running at ${inst.endpoint}`);

    const res = await client.readResource({ uri: 'spending://current' });
    const spending = JSON.parse(res.contents[0].text);
    check(Array.isArray(spending.windows) && spending.windows.length > 0, `spending: ${res.contents[0].text}`);
    check(spending.burn_rate_per_hour > 0, `burn rate after create: ${spending.burn_rate_per_hour}`);
    log(`spending: burn $${spending.burn_rate_per_hour}/h, ${spending.windows[0].window_minutes}-minute window ` +
      `remaining $${spending.windows[0].remaining}`);

    const all = await callOK(client, 'list_gpu_instances', { limit: 500 });
    const big = all.offers[all.offers.length - 1];
    const refused = await client.callTool({
      name: 'create_gpu_instance',
      arguments: { provider: big.provider, instance_id: big.instance_id, image: 'vllm/vllm-openai:latest' },
    });
    check(refused.isError === true, `renting $${big.price_per_hour}/h past the limit was not refused`);
    check(/spending limit exceeded/.test(textOf(refused)), `refusal does not explain: ${textOf(refused)}`);
    log(`refused past the limit: ${textOf(refused).split('\n')[0].slice(0, 120)}…`);

    const gone = await callOK(client, 'destroy_gpu_instance', { provider: inst.provider, instance_id: inst.id });
    check(gone.status === 'terminated', `destroyed instance: ${JSON.stringify(gone)}`);
    log(`destroyed ${gone.id}, cost to date $${gone.cost_to_date}`);

    // Rent by spec: gpuproxy rents the cheapest live offer matching it.
    const bySpec = await callOK(client, 'create_gpu_instance', {
      image: 'vllm/vllm-openai:latest',
      spec: { gpu: ['3090', '4090'], max_price_per_hour: 0.5, providers: 'vast.ai' },
      idempotency_key: `e2e-spec-${name}-${Date.now()}`,
    }, { timeout: 120000, resetTimeoutOnProgress: true });
    const tried = bySpec.attempts || [];
    const last = tried[tried.length - 1];
    check(bySpec.status === 'running' && last && last.outcome === 'rented' && last.offer_id === bySpec.offer_id &&
      bySpec.price_per_hour <= 0.5 && /3090|4090/.test(bySpec.gpu_name), `rented by spec: ${JSON.stringify(bySpec)}`);
    log(`rented by spec ${bySpec.id}: ${bySpec.gpu_name} at $${bySpec.price_per_hour}/h, ${tried.length} attempt(s)`);
    await callOK(client, 'destroy_gpu_instance', { instance_id: bySpec.id });
    const noMatch = await client.callTool({
      name: 'create_gpu_instance',
      arguments: { image: 'vllm/vllm-openai:latest', spec: { gpu: 'H100', max_price_per_hour: 0.05 } },
    });
    check(noMatch.isError === true && /no_matching_offer/.test(textOf(noMatch)) &&
      /cheapest H100 .* over your \$0\.05 cap/.test(textOf(noMatch)), `spec under every offer: ${textOf(noMatch)}`);
    log(`spec under every offer: ${textOf(noMatch).split('\n')[0].slice(0, 120)}…`);

    // Services: defined, listed, shown, changed and deleted. replicas.min 0
    // rents nothing until a request comes, so the limits above stay as
    // they are. The SDK checks each structuredContent against the tool's
    // output schema.
    const svcName = `e2e-${name}`;
    const svc = await callOK(client, 'create_service', {
      name: svcName, model: `e2e-model-${name}`, image: 'vllm/vllm-openai:latest', port: 8000,
      spec: { gpu: '4090', max_price_per_hour: 0.5 }, replicas: { min: 0, max: 1 }, lifetime: { idle_timeout: '10m' },
    });
    check(svc.id.startsWith('svc_') && svc.state === 'active' && svc.base_url === '/v1' && svc.desired_replicas === 0,
      `created service: ${JSON.stringify(svc)}`);
    const svcs = await callOK(client, 'list_services', {});
    check(svcs.services.some((x) => x.id === svc.id), `list_services: ${JSON.stringify(svcs)}`);
    const shown = await callOK(client, 'get_service', { service: svcName });
    check(shown.id === svc.id && shown.events.some((e) => e.kind === 'service.created'), `get_service: ${JSON.stringify(shown)}`);
    const changed = await callOK(client, 'update_service', { service: svc.id, scale: { up_delay: '10s' } });
    check(changed.scale.up_delay === '10s' && changed.image === svc.image, `update_service: ${JSON.stringify(changed)}`);
    const badUpdate = await client.callTool({ name: 'update_service', arguments: { service: svcName, queue_timeout: 'soon' } });
    check(badUpdate.isError === true && /\(invalid\): queue_timeout: /.test(textOf(badUpdate)), `bad update: ${textOf(badUpdate)}`);
    const deleted = await callOK(client, 'delete_service', { service: svcName });
    check(deleted.state === 'deleting', `delete_service: ${JSON.stringify(deleted)}`);
    log(`service ${svc.id} created, listed, shown, updated, refused a bad update, deleted`);

    // Unit economics over the last 7 days: the instance rented and
    // destroyed above ran, so the summary by instance shows its running
    // time; asking about one model answers with a sentence.
    const econ = await callOK(client, 'get_unit_economics', {});
    check(econ.group_by === 'instance' && econ.rows.some((r) => r.group === inst.id && r.running_seconds > 0) &&
      typeof econ.totals.gpu_cost === 'number', `get_unit_economics: ${JSON.stringify(econ)}`);
    const oneModel = await callOK(client, 'get_unit_economics', { model: `e2e-model-${name}` });
    check(oneModel.group_by === 'model' && oneModel.rows.length === 0, `one model: ${JSON.stringify(oneModel)}`);
    log(`unit economics: ${econ.rows.length} instances, GPU cost $${econ.totals.gpu_cost}`);
  } finally {
    await client.close();
  }
}

// confirmation: a client that declared elicitation is asked before a rental
// above the key's confirm_above (a decline rents nothing, an accept rents);
// over plain POST the call fails with confirmation_required and a
// confirm_token, and the same call with it proceeds.
async function confirmation(ckey) {
  const log = (...a) => console.log('[confirm]', ...a);
  const client = new Client({ name: 'gpuproxy-e2e-confirm', version: '1.0.0' }, { capabilities: { elicitation: {} } });
  let answer = 'decline';
  let asked = '';
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    asked = req.params.message;
    return answer === 'accept' ? { action: 'accept', content: { confirm: true } } : { action: answer };
  });
  await client.connect(new StreamableHTTPClientTransport(new URL(base + '/mcp'), { requestInit: { headers: { 'X-API-Key': ckey } } }));
  let offer;
  try {
    const offers = await callOK(client, 'list_gpu_instances', { provider: 'vast.ai', max_price: 1, limit: 5 });
    offer = offers.offers[0];
    const args = { provider: offer.provider, instance_id: offer.instance_id, image: 'vllm/vllm-openai:latest' };
    const declined = await client.callTool({ name: 'create_gpu_instance', arguments: args });
    check(declined.isError === true && /declined/.test(textOf(declined)), `declined: ${textOf(declined)}`);
    check(asked.includes('/hour') && asked.includes(offer.instance_id), `the person was asked: ${asked}`);
    log(`asked "${asked.slice(0, 100)}…", declined: nothing rented`);
    answer = 'accept';
    const inst = await callOK(client, 'create_gpu_instance', args, { timeout: 120000 });
    log(`accepted: rented ${inst.id}`);
    await callOK(client, 'destroy_gpu_instance', { provider: inst.provider, instance_id: inst.id });
    const again = await callOK(client, 'list_gpu_instances', { provider: 'vast.ai', max_price: 1, limit: 5 });
    offer = again.offers[0];
  } finally {
    await client.close();
  }
  const post = async (extra) => {
    const res = await fetch(base + '/api/v1/mcp', {
      method: 'POST',
      headers: { 'X-API-Key': ckey, 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'create_gpu_instance',
        arguments: { provider: offer.provider, instance_id: offer.instance_id, image: 'vllm/vllm-openai:latest', ...extra } } }),
    });
    return (await res.json()).result;
  };
  const first = await post({});
  const m = /"confirm_token":"(gpc_[^"]+)"/.exec(textOf(first));
  check(first.isError === true && /confirmation_required/.test(textOf(first)) && m, `plain POST: ${textOf(first)}`);
  const second = await post({ confirm_token: m[1] });
  check(!second.isError, `plain POST with the token: ${textOf(second)}`);
  log(`plain POST: confirmation_required with a token, then rented ${second.structuredContent.id}`);
}

async function main() {
  check(key, 'GPUPROXY_API_KEY is not set');
  const timer = setTimeout(() => {
    console.error(`e2e: timed out after ${deadline} ms`);
    process.exit(1);
  }, deadline);
  timer.unref();
  let failed = 0;
  for (const name of wanted) {
    try {
      await exercise(name);
      console.log(`ok   ${name}`);
    } catch (err) {
      failed++;
      console.error(`FAIL ${name}: ${err instanceof CheckFailed ? err.message : err?.stack || err}`);
    }
  }
  console.log(`e2e: ${wanted.length - failed} of ${wanted.length} transports passed`);
  if (process.env.GPUPROXY_CONFIRM_KEY) {
    try {
      await confirmation(process.env.GPUPROXY_CONFIRM_KEY);
      console.log('ok   confirmation');
    } catch (err) {
      failed++;
      console.error(`FAIL confirmation: ${err instanceof CheckFailed ? err.message : err?.stack || err}`);
    }
  }
  process.exitCode = failed ? 1 : 0;
}

main().catch((err) => {
  console.error(err?.stack || err);
  process.exitCode = 1;
});
