// ttftscope demo chat: streams answers from /v1/chat/completions and renders each token as it
// arrives. The probe (probe.global.js, loaded first) wraps fetch, so every chat request here is
// timed in the browser and beaconed to /v1/probe. Text is only ever set with textContent.
'use strict';

TTFTProbe.install({ collector: '/v1/probe' });

const $ = id => document.getElementById(id);
const turns = [];
let model = null;

function bubble(role, text) {
  const li = document.createElement('li');
  li.className = `msg ${role}`;
  li.textContent = text;
  $('messages').append(li);
  li.scrollIntoView({ block: 'end' });
  return li;
}

function authHeaders() {
  const key = $('api-key').value.trim();
  return key ? { authorization: `Bearer ${key}` } : {};
}

async function loadModel() {
  try {
    const res = await fetch('/v1/models', { headers: authHeaders() });
    const body = await res.json();
    model = body.data[0].id;
    $('model').textContent = `model: ${model}`;
  } catch (err) {
    $('model').textContent = `could not list models: ${err.message}`;
  }
}

/** The trace id in `Server-Timing: trace;desc=00-<trace id>-<span id>-01`, or null. */
function traceIdOf(serverTiming) {
  const m = /trace;desc="?[\da-f]{2}-([\da-f]{32})-/i.exec(serverTiming || '');
  return m ? m[1].toLowerCase() : null;
}

/** Calls onContent(text) for each content delta of an SSE body; resolves at its end. */
async function readStream(body, onContent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
      const data = event.split(/\r?\n/).filter(l => l.startsWith('data:'))
        .map(l => l.slice(5).trimStart()).join('\n');
      if (!data || data === '[DONE]') continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) onContent(delta.content);
    }
  }
}

function addMeta(li, traceId, elapsedMs) {
  const meta = document.createElement('span');
  meta.className = 'meta';
  meta.append(`${elapsedMs.toFixed(0)} ms · `);
  if (traceId) {
    const link = document.createElement('a');
    link.href = `/ui/#trace=${traceId}`;
    link.target = '_blank';
    link.rel = 'noopener';
    link.textContent = `trace ${traceId.slice(0, 12)}…`;
    meta.append(link);
  }
  li.append(meta);
}

async function send(prompt) {
  if (!model) await loadModel();
  turns.push({ role: 'user', content: prompt });
  bubble('user', prompt);
  const li = bubble('assistant', '');
  li.dataset.state = 'streaming';
  const text = document.createTextNode('');
  li.append(text);
  const t0 = performance.now();
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...authHeaders() },
      body: JSON.stringify({ model, messages: turns, stream: true,
        max_tokens: Number($('max-tokens').value) || 64 }),
    });
    if (!res.ok) throw new Error((await res.json()).error.message);
    const traceId = traceIdOf(res.headers.get('server-timing'));
    li.dataset.traceId = traceId || '';
    await readStream(res.body, piece => { text.appendData(piece); });
    turns.push({ role: 'assistant', content: text.data });
    addMeta(li, traceId, performance.now() - t0);
    li.dataset.state = 'done';
  } catch (err) {
    turns.pop();
    li.className = 'msg error';
    li.textContent = `error: ${err.message}`;
    li.dataset.state = 'error';
  }
}

$('composer').addEventListener('submit', async event => {
  // the user asked now: Enter → fetch becomes the `input` client stage of this request
  TTFTProbe.markInput();
  event.preventDefault();
  const prompt = $('prompt').value.trim();
  if (!prompt) return;
  $('prompt').value = '';
  $('send').disabled = true;
  try {
    await send(prompt);
  } finally {
    $('send').disabled = false;
    $('prompt').focus();
  }
});

$('prompt').addEventListener('keydown', event => {
  if (event.key === 'Enter' && !event.shiftKey) {
    event.preventDefault();
    $('composer').requestSubmit();
  }
});

loadModel();
