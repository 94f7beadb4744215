// The official `openai` npm package against `loom serve` (tests/serve_openai_npm.sh starts the
// server): models, chat and completions, streaming and not, usage, and an error.
//   usage: node openai_client.mjs PORT API_KEY   (with NODE_PATH holding node_modules/openai)
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [port, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0 });
const check = (name) => console.log(`ok - ${name}`);

const models = await client.models.list();
const model = models.data[0].id;
assert.ok(model.length > 0);
check(`models.list: ${model}`);

const messages = [{ role: 'system', content: 'Speak as a king.' }, { role: 'user', content: 'Who goes there?' }];
const whole = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
assert.equal(whole.object, 'chat.completion');
assert.equal(whole.choices[0].message.role, 'assistant');
assert.ok(whole.choices[0].message.content.length > 0);
assert.equal(whole.usage.completion_tokens, 16);
assert.equal(whole.choices[0].finish_reason, 'length');
check('chat.completions.create');

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = '', usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  const c = chunk.choices[0];
  if (!c) continue;
  text += c.delta?.content ?? '';
  if (c.finish_reason) finish = c.finish_reason;
}
assert.equal(text, whole.choices[0].message.content);
assert.equal(finish, 'length');
assert.equal(usage.completion_tokens, 16);
check('chat.completions.create stream');

const runner = client.chat.completions.stream({ model, messages, max_tokens: 16, temperature: 0 });
const final = await runner.finalChatCompletion();
assert.equal(final.choices[0].message.content, whole.choices[0].message.content);
check('chat.completions.stream helper');

const comp = await client.completions.create({ model, prompt: 'ROMEO:', max_tokens: 12, temperature: 0, logprobs: 2 });
assert.equal(comp.object, 'text_completion');
assert.equal(comp.choices[0].logprobs.tokens.length, 12);
let ctext = '';
for await (const chunk of await client.completions.create({ model, prompt: 'ROMEO:', max_tokens: 12, temperature: 0, stream: true }))
  ctext += chunk.choices[0]?.text ?? '';
assert.equal(ctext, comp.choices[0].text);
check('completions.create, stream and not');

await assert.rejects(client.chat.completions.create({ model, messages, n: 2 }), (e) => {
  assert.ok(e instanceof OpenAI.APIError);
  assert.equal(e.status, 400);
  assert.equal(e.param, 'n');
  return true;
});
const bad = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 });
await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
check('errors: 400 with param, 401');
console.log('openai npm client: all checks passed');
