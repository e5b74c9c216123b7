// End-to-end check of gpuproxy's services endpoint with the official
// OpenAI SDK for Node, as an engineer would point it at gpuproxy:
//
//   GPUPROXY_BASE_URL=http://127.0.0.1:8080/v1 GPUPROXY_API_KEY=gpx_… MODEL=llama-70b node client.mjs
//
// It lists the models, asks for a plain and a streamed chat completion, a
// completion and embeddings, and checks an unknown model's error; it
// prints one JSON object with what it got and exits non-zero on any
// failure.
import OpenAI from "openai";

const baseURL = process.env.GPUPROXY_BASE_URL;
const apiKey = process.env.GPUPROXY_API_KEY;
const model = process.env.MODEL;
if (!baseURL || !apiKey || !model) {
  console.error("set GPUPROXY_BASE_URL, GPUPROXY_API_KEY and MODEL");
  process.exit(2);
}

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const chat = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Say hello to the SDK" }],
});
out.chat = { content: chat.choices[0].message.content, finish: chat.choices[0].finish_reason, usage: chat.usage };

const stream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Stream a greeting" }],
  stream: true,
});
let streamed = "";
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  streamed += chunk.choices[0]?.delta?.content ?? "";
}
out.stream = { content: streamed, chunks };

const completion = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8 });
out.completion = completion.choices[0].text;

const emb = await client.embeddings.create({ model, input: ["first text", "second text"], encoding_format: "float" });
out.embeddings = emb.data.map((d) => d.embedding.length);

try {
  await client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] });
  out.unknown = "no error";
} catch (err) {
  out.unknown = { status: err.status, code: err.code, type: err.type, param: err.param ?? null, message: err.message };
}

console.log(JSON.stringify(out));
