// The chat page served at GET /: one static HTML file with its CSS and JavaScript, no build step.
// It keeps the conversation in the page, streams each answer from /v1/chat/completions (fetch and
// its own SSE parsing), shows tokens/s, and stops a reply by aborting the request (which frees the
// server's slot).
namespace loom::serve {

const char* chat_page_html() {
  return R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Loom chat</title>
<style>
  :root { --bg: #f6f5f2; --fg: #1d1d1f; --muted: #6b6b70; --user: #dfe9f7; --bot: #ffffff; --accent: #2f5d9e; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, sans-serif; background: var(--bg); color: var(--fg);
         display: flex; flex-direction: column; height: 100vh; }
  header { padding: 10px 16px; border-bottom: 1px solid #ddd; display: flex; gap: 12px; align-items: center; flex-wrap: wrap; }
  header h1 { font-size: 16px; margin: 0 8px 0 0; }
  header label { color: var(--muted); font-size: 13px; }
  header input { width: 70px; }
  #key { width: 140px; }
  #log { flex: 1; overflow-y: auto; padding: 16px; }
  .msg { max-width: 820px; margin: 0 auto 12px; padding: 10px 14px; border-radius: 10px; white-space: pre-wrap; word-wrap: break-word; }
  .user { background: var(--user); }
  .assistant { background: var(--bot); border: 1px solid #e3e3e3; }
  .error { background: #fde8e8; }
  .meta { max-width: 820px; margin: -8px auto 12px; color: var(--muted); font-size: 12px; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid #ddd; max-width: 852px; width: 100%; margin: 0 auto; }
  textarea { flex: 1; resize: vertical; min-height: 44px; font: inherit; padding: 8px; }
  button { font: inherit; padding: 8px 16px; border: 0; border-radius: 6px; background: var(--accent); color: #fff; cursor: pointer; }
  button:disabled { opacity: .5; cursor: default; }
  #stop { background: #9e2f2f; }
</style>
</head>
<body>
<header>
  <h1>Loom chat</h1>
  <span id="model" class="meta" style="margin:0"></span>
  <label>max tokens <input id="max" type="number" value="200" min="1"></label>
  <label>temperature <input id="temp" type="number" value="0.8" step="0.1" min="0" max="2"></label>
  <label>API key <input id="key" type="password" placeholder="(none)"></label>
  <button id="clear" type="button">New chat</button>
</header>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Message (Enter sends, Shift+Enter: new line)" autofocus></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" disabled>Stop</button>
</form>
<script>
const $ = (id) => document.getElementById(id);
const log = $('log'), input = $('input');
let messages = [];
let controller = null;
$('key').value = localStorage.getItem('loom-key') || '';
$('key').onchange = () => localStorage.setItem('loom-key', $('key').value);

function headers() {
  const h = {'Content-Type': 'application/json'};
  if ($('key').value) h['Authorization'] = 'Bearer ' + $('key').value;
  return h;
}
function add(cls, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + cls;
  d.textContent = text;
  log.appendChild(d);
  log.scrollTop = log.scrollHeight;
  return d;
}
function meta(text) {
  const d = document.createElement('div');
  d.className = 'meta';
  d.textContent = text;
  log.appendChild(d);
  return d;
}
fetch('/v1/models', {headers: headers()}).then(r => r.json()).then(j => {
  if (j.data) $('model').textContent = j.data[0].id;
}).catch(() => {});

async function send(text) {
  messages.push({role: 'user', content: text});
  add('user', text);
  const out = add('assistant', '');
  const info = meta('…');
  $('send').disabled = true;
  $('stop').disabled = false;
  controller = new AbortController();
  let reply = '', n = 0, deltas = 0, first = 0;
  const t0 = performance.now();
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), signal: controller.signal,
      body: JSON.stringify({messages, stream: true, max_tokens: +$('max').value,
                            temperature: +$('temp').value, stream_options: {include_usage: true}})
    });
    if (!res.ok) {
      const j = await res.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || ('HTTP ' + res.status));
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '', done = false;
    while (!done) {
      const r = await reader.read();
      if (r.done) break;
      buf += decoder.decode(r.value, {stream: true});
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') { done = true; break; }
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.usage) n = j.usage.completion_tokens;
          const c = j.choices && j.choices[0];
          if (c && c.delta && c.delta.content) {
            if (!first) first = performance.now();
            ++deltas;
            reply += c.delta.content;
            out.textContent = reply;
            log.scrollTop = log.scrollHeight;
          }
        }
      }
      const s = (performance.now() - (first || t0)) / 1000;
      if (first && s > 0) info.textContent = deltas + ' tokens, ' + (deltas / s).toFixed(1) + ' tokens/s…';
    }
    n = n || deltas;
    const s = (performance.now() - (first || t0)) / 1000;
    info.textContent = n + ' tokens, ' + (s > 0 ? (n / s).toFixed(1) : '–') + ' tokens/s, first token after ' +
                       (((first || performance.now()) - t0) / 1000).toFixed(2) + ' s';
  } catch (e) {
    if (e.name === 'AbortError') info.textContent = 'stopped';
    else { out.className = 'msg error'; out.textContent = reply + (reply ? '\n' : '') + e.message; info.textContent = ''; }
  }
  messages.push({role: 'assistant', content: reply});
  controller = null;
  $('send').disabled = false;
  $('stop').disabled = true;
  input.focus();
}
$('form').onsubmit = (e) => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = '';
  send(text);
};
input.onkeydown = (e) => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); $('form').requestSubmit(); }
};
$('stop').onclick = () => { if (controller) controller.abort(); };
$('clear').onclick = () => { if (controller) controller.abort(); messages = []; log.innerHTML = ''; };
</script>
</body>
</html>
)HTML";
}

}  // namespace loom::serve
