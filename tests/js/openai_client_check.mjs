// The official OpenAI Node SDK, unchanged, against a running `kvpack serve` (base URL in argv[2]):
// models.list / models.retrieve, completions and chat with logprobs, streamed chat (with logprobs),
// and n = 2 (two choices of one prefill, plain and streamed). Prints what it saw (the README's transcript) and exits non-zero on the first wrong answer.
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

// n = 2: two choices sharing one prefill. Greedy: both equal the single answer; usage counts the prompt once.
const two = await client.chat.completions.create({ model: id, messages, max_tokens: 8, temperature: 0, n: 2, logprobs: true });
assert.equal(two.choices.length, 2);
assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
for (const c of two.choices) {
  assert.equal(c.message.content, chat.choices[0].message.content, "greedy choices equal the n = 1 answer");
  assert.equal(c.logprobs.content.length, content.length);
}
assert.equal(two.usage.prompt_tokens, chat.usage.prompt_tokens);
assert.equal(two.usage.completion_tokens, 2 * chat.usage.completion_tokens);
show("n = 2", two.choices.map((c) => c.message.content));
// Seeded sampling, streamed: each index's text equals the non-streamed choice with the same seed.
const seeded = { model: id, messages, max_tokens: 8, temperature: 1, seed: 7, n: 2 };
const plain2 = await client.chat.completions.create(seeded);
const per = ["", ""];
for await (const chunk of await client.chat.completions.create({ ...seeded, stream: true })) {
  for (const c of chunk.choices) per[c.index] += c.delta?.content ?? "";
}
assert.deepEqual(per, plain2.choices.map((c) => c.message.content), "streamed n = 2 gives the same choices");
show("n = 2 streamed (seed 7)", per);
console.log("openai client check: OK");
