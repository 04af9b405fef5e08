// The official OpenAI Node SDK, unchanged, against a running `kvpack serve` (base URL in argv[2]):
// models.list / models.retrieve, completions and chat with logprobs, streamed chat (with logprobs),
// and n = 2's clear 400 (n > 1 is not built yet). Prints what it saw (the README's transcript) and exits non-zero on the first wrong answer.
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused" });
const show = (label, value) => console.log(`${label}: ${typeof value === "string" ? value : JSON.stringify(value)}`);

const list = await client.models.list();
const id = list.data[0].id;
assert.ok(!/\s/.test(id), `model id without spaces: ${id}`);
const model = await client.models.retrieve(id);
assert.equal(model.id, id);
show("models.retrieve", { id: model.id, object: model.object, owned_by: model.owned_by });
await assert.rejects(client.models.retrieve("no-such-model"), (e) => e.status === 404);
show("models.retrieve('no-such-model')", "404 model_not_found");

const cmpl = await client.completions.create({ model: id, prompt: "Once upon a time", max_tokens: 8, temperature: 0, logprobs: 2 });
const lp = cmpl.choices[0].logprobs;
assert.equal(lp.tokens.length, lp.token_logprobs.length);
assert.ok(lp.token_logprobs.every((x) => x <= 0));
show("completions text", cmpl.choices[0].text);
show("completions logprobs (first 3)", lp.tokens.slice(0, 3).map((t, i) => [t, +lp.token_logprobs[i].toFixed(4), lp.top_logprobs[i]]));

const messages = [{ role: "user", content: "Tell me about a little dog." }];
const chat = await client.chat.completions.create({ model: id, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2 });
const content = chat.choices[0].logprobs.content;
assert.ok(content.length > 0);
for (const t of content) {
  assert.equal(t.top_logprobs.length, 2);
  assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6, "greedy picks the most likely token");
}
show("chat message", chat.choices[0].message.content);
show("chat logprobs (first 2)", content.slice(0, 2).map((t) => ({ token: t.token, logprob: +t.logprob.toFixed(4), top: t.top_logprobs.map((x) => x.token) })));

const stream = await client.chat.completions.create({ model: id, messages, max_tokens: 8, temperature: 0, stream: true, logprobs: true });
let streamed = "", streamedTokens = 0, chunks = 0;
for await (const chunk of stream) {
  if (!chunk.choices.length) continue;
  chunks += 1;
  streamed += chunk.choices[0].delta?.content ?? "";
  streamedTokens += chunk.choices[0].logprobs?.content?.length ?? 0;
}
assert.equal(streamed, chat.choices[0].message.content, "streamed chat gives the same greedy text");
assert.equal(streamedTokens, content.length, "every token's logprob arrives once in the stream");
show("streamed chat", `${chunks} chunks, ${streamedTokens} token logprobs, text ${JSON.stringify(streamed)}`);

// n > 1 is not built yet: the SDK gets the server's clear 400 naming the field.
await assert.rejects(client.chat.completions.create({ model: id, messages, max_tokens: 4, n: 2 }),
                     (e) => e.status === 400 && e.error?.param === "n");
show("n = 2", "400 (param n): only n = 1 is supported");
console.log("openai client check: OK");
