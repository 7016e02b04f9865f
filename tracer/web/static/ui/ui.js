// ttftscope waterfall UI: a live table of recent requests, one request's waterfall (client
// and server stages on one time axis) under its verdict's sentence, the attribution bar and
// the window's causes ranked. No framework, no build step.
// Every value from the API is written with textContent or as an SVG attribute: never as HTML.
'use strict';

const API = 'api';
const POLL_MS = 2000;
const SVG_NS = 'http://www.w3.org/2000/svg';
const SERVER_STAGES = ['receive', 'template', 'tokenize', 'kv_lookup', 'queue', 'prefill',
  'sample', 'detokenize', 'send'];
const COLORS = {
  receive: '#7c8db5', template: '#a47fd1', tokenize: '#d17fb4', kv_lookup: '#e0a040',
  queue: '#e06c5a', prefill: '#3f7fd9', sample: '#2aa198', detokenize: '#5bb04f',
  send: '#9c7a45', unattributed: '#c9ccd3', network: '#b8bfcc',
  // the proxy's stages (receive and send are shared)
  upstream_connect: '#e0a040', upstream_ttfb: '#e06c5a', upstream_first_token: '#3f7fd9',
  // a proxy record joined with its engine's timing (queue, prefill, tokenize as above)
  upstream_request: '#c08a3e', upstream_other: '#b39b6a', inference: '#6f9fe0',
  engine_other: '#8e96a8', upstream_response: '#4f9fb0', model_load: '#c2a25b',
  kv_transfer: '#8f6fd0',
  // after the first output, up to the first text
  reasoning: '#c678dd', tool_call: '#d19a66',
  // the collector's whole path (backend segments are named after their spans: PART_COLORS)
  backend_to_engine: '#c08a3e', first_token: '#4f9fb0', engine: '#6f9fe0',
  'client.request': '#5d5290', 'client.first_byte': '#7b6fa8',
  'client.first_token': '#9a8fc4', 'client.first_paint': '#b7aed8',
};
// A collector record's segments are grouped by part; a backend segment has its span's name.
const PART_GROUPS = { network: 'network', backend: 'your backend (critical path, by span)',
  engine: 'engine' };
const PART_COLORS = { backend: '#d4a95a' };
const state = { selected: null, rows: [], shownClientTtft: undefined, shownCause: undefined };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') node.className = v;
    else if (k === 'style') Object.assign(node.style, v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '—';
  const a = Math.abs(ms);
  if (a >= 10000) return (ms / 1000).toFixed(2) + ' s';
  if (a >= 100) return ms.toFixed(0) + ' ms';
  if (a >= 10) return ms.toFixed(1) + ' ms';
  return ms.toFixed(2) + ' ms';
}

function fmtTick(ms, step) {
  if (Math.abs(ms) < step / 1e6) ms = 0;  // float steps land near, not on, zero
  const digits = step >= 1 ? 0 : Math.min(3, Math.ceil(-Math.log10(step)));
  return step >= 1000 ? `${+(ms / 1000).toFixed(3)} s` : `${ms.toFixed(digits)} ms`;
}

function fmtTime(unixMs) {
  const d = new Date(unixMs);
  const p = (n, w = 2) => String(n).padStart(w, '0');
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

// With --api-key, /ui/api/* needs `Authorization: Bearer`: the key is asked for once and
// kept in this tab's sessionStorage (gone with the tab), never put in a URL (history, logs,
// Referer). tracer/web/auth.py.
const KEY_STORE = 'ttftscope.apiKey';

function apiKey() {
  try { return sessionStorage.getItem(KEY_STORE); } catch (e) { return null; }
}

async function getJson(path) {
  const key = apiKey();
  const headers = key ? { authorization: `Bearer ${key}` } : {};
  const res = await fetch(path, { cache: 'no-store', headers });
  if (res.status === 401) {
    document.getElementById('key-form').hidden = false;
    throw new Error(key ? 'wrong API key' : 'API key required');
  }
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  return res.json();
}

function setStatus(text) {
  document.getElementById('status').textContent = text;
}

// ---- the table ---------------------------------------------------------------------------

// The verdicts that name no cause (tracer/record/causes.py, NO_CAUSE; a test keeps the two
// lists equal): `healthy` is drawn green, `unjudged` grey, as not judged; a cause orange.
const NO_CAUSE = ['healthy', 'unjudged'];

function causeBadge(cause) {
  if (!cause) return '—';
  const kind = cause === 'unjudged' ? ' unjudged' : NO_CAUSE.includes(cause) ? '' : ' cause';
  return el('span', { class: 'badge' + kind }, cause === 'unjudged' ? 'not judged' : cause);
}

function renderTable(rows) {
  const body = document.querySelector('#requests tbody');
  const out = rows.map(r => {
    const finish = el('span', { class: 'badge' + (r.finish_reason === 'length' ? ' length'
      : r.finish_reason === 'stop' ? '' : ' bad') }, r.finish_reason);
    const tr = el('tr', { 'data-trace-id': r.trace_id },
      el('td', {}, fmtTime(r.time_unix_ms)),
      el('td', { class: 'mono', title: r.trace_id }, r.trace_id.slice(0, 12) + '…'),
      el('td', {}, r.model),
      el('td', { class: 'num' }, r.num_prompt_tokens),
      el('td', { class: 'num' }, r.num_cached_tokens),
      el('td', { class: 'num' }, r.num_output_tokens),
      el('td', { class: 'num' }, fmtMs(r.server_ttft_ms)),
      el('td', { class: 'num' }, fmtMs(r.client_ttft_ms)),
      el('td', {}, causeBadge(r.cause)),
      el('td', {}, finish));
    if (r.trace_id === state.selected) tr.classList.add('selected');
    tr.addEventListener('click', () => select(r.trace_id));
    return tr;
  });
  if (!out.length) out.push(el('tr', {}, el('td', { colspan: '10', class: 'muted' },
    'No requests yet: send one from /demo or any OpenAI client.')));
  body.replaceChildren(...out);
}

// ---- the attribution bar ------------------------------------------------------------------

function renderAttribution(att) {
  const bar = document.getElementById('attribution-bar');
  const legend = document.getElementById('attribution-legend');
  const shown = att.stages.filter(s => s.median_share > 0 || s.stage !== 'unattributed');
  const total = shown.reduce((a, s) => a + Math.max(s.median_share, 0), 0) || 1;
  bar.replaceChildren(...shown.map(s => {
    const seg = el('div', { class: 'seg', title: `${s.stage}: ${(100 * s.median_share).toFixed(1)}%` +
      ` · median ${fmtMs(s.median_ms)}` });
    seg.style.width = (100 * Math.max(s.median_share, 0) / total) + '%';
    seg.style.background = COLORS[s.stage] || '#999';
    return seg;
  }));
  legend.replaceChildren(...shown.map(s => el('span', { class: 'item' },
    el('span', { class: 'swatch', style: { background: COLORS[s.stage] || '#999' } }),
    s.stage, el('span', { class: 'value' },
      `${(100 * s.median_share).toFixed(1)}% · ${fmtMs(s.median_ms)}`))));
  const n = att.num_requests;
  let summary = `${n} request${n === 1 ? '' : 's'} · median server TTFT ${fmtMs(att.median_ttft_ms)}`;
  if (att.network) {
    summary += ` · median network + gateway ${fmtMs(att.network.median_ms)} ` +
      `(${(100 * att.network.median_share_of_client_ttft).toFixed(1)}% of client TTFT, ` +
      `${att.network.num_requests} with a probe beacon)`;
  }
  document.getElementById('attribution-summary').textContent = summary;
}

// ---- the waterfall ------------------------------------------------------------------------

function waterfallRows(tr) {
  const rows = [];
  const client = tr.client;
  if (client && client.stages.length) {
    rows.push({ group: 'browser (probe, aligned to the server clock)' });
    for (const s of client.stages) rows.push({ label: s.stage, bars: [s], color: COLORS[s.stage] });
  }
  if (client && client.gap && tr.source !== 'collector') {
    const first = client.stages[0];
    const token = client.stages.find(s => s.stage === 'client.first_token');
    rows.push({ label: 'network + gateway', color: COLORS.network, hatch: true, total: client.gap.total_ms,
      bars: [{ start_ms: first.start_ms, end_ms: 0, duration_ms: client.gap.uplink_ms },
             { start_ms: tr.server_ttft_ms, end_ms: token.end_ms, duration_ms: client.gap.downlink_ms }] });
  }
  if (tr.source === 'collector') {
    // The whole path (docs/architecture.md, "The whole path"): contiguous segments that sum
    // to client TTFT, a group header whenever the part (or a disaggregated engine's worker)
    // changes.
    let shown = null;
    for (const s of tr.stages) {
      const p = s.attrs.part;
      const group = (PART_GROUPS[p] || String(p)) + (s.attrs.worker ? ` · ${s.attrs.worker} worker` : '');
      if (group !== shown) rows.push({ group });
      shown = group;
      const color = p === 'backend' ? PART_COLORS.backend : COLORS[s.stage] || '#999';
      rows.push({ label: s.stage, bars: [s], color });
    }
    return rows;
  }
  rows.push({ group: 'server' });
  for (const s of tr.stages) {
    const events = s.stage === 'prefill' ? tr.events.filter(e => e.name.startsWith('prefill')) : [];
    rows.push({ label: s.stage, bars: [s], color: COLORS[s.stage] || '#999', events });
  }
  // Each tool call from its first delta to its arguments complete: when an agent can act.
  const calls = tr.tool_calls || [];
  if (calls.length) rows.push({ group: 'tool calls (start → arguments ready)' });
  for (const c of calls) {
    const end = c.ready_ms === null ? c.start_ms : c.ready_ms;
    rows.push({ label: c.name || 'unnamed', color: COLORS.tool_call,
      bars: [{ start_ms: c.start_ms, end_ms: end, duration_ms: end - c.start_ms }] });
  }
  return rows;
}

function niceStep(span, approxTicks) {
  const raw = span / approxTicks, pow = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 2.5, 5, 10].map(m => m * pow).find(s => s >= raw) || raw;
}

function renderWaterfall(tr) {
  const box = document.getElementById('waterfall');
  const rows = waterfallRows(tr);
  const bars = rows.flatMap(r => r.bars || []);
  let lo = Math.min(0, ...bars.map(b => b.start_ms));
  let hi = Math.max(...bars.map(b => b.end_ms), tr.server_ttft_ms || 0, 0.001);
  const pad = (hi - lo) * 0.02;
  lo -= pad; hi += pad;
  const width = Math.max(box.clientWidth, 720), labelW = 170, durW = 96, rowH = 24, top = 28;
  const plotW = width - labelW - durW;
  const x = ms => labelW + (ms - lo) / (hi - lo) * plotW;
  const height = top + rows.length * rowH + 8;
  const root = svg('svg', { viewBox: `0 0 ${width} ${height}`, height, role: 'img',
    'aria-label': 'waterfall of the selected request' });
  root.append(hatchPattern());
  const axis = svg('g', { class: 'axis' });
  const step = niceStep(hi - lo, 8);
  for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) {
    axis.append(svg('line', { class: 'grid', x1: x(t), x2: x(t), y1: top - 6, y2: height - 4 }));
    axis.append(svg('text', { x: x(t), y: top - 10, 'text-anchor': 'middle' }, fmtTick(t, step)));
  }
  root.append(axis);
  const firstOutput = tr.first_output_kind && tr.first_output_kind !== 'text'
    ? [[tr.first_output_ms, 'first ' + tr.first_output_kind.replace('_', ' ')]] : [];
  for (const [ms, label] of [[0, 'receive start'], [tr.server_ttft_ms, 'server first token'],
    ...firstOutput]) {
    if (ms === null) continue;
    const mark = svg('line', { x1: x(ms), x2: x(ms), y1: top - 4, y2: height - 4,
      stroke: '#1d2330', 'stroke-dasharray': '3 3', 'stroke-width': 1 });
    mark.append(svg('title', {}, label));
    root.append(mark);
  }
  rows.forEach((row, i) => root.append(waterfallRow(row, top + i * rowH, rowH, x, width, durW)));
  box.replaceChildren(root);
}

function waterfallRow(row, y, rowH, x, width, durW) {
  const g = svg('g', {});
  if (row.group) {
    g.append(svg('text', { class: 'group', x: 4, y: y + rowH - 7 }, row.group));
    return g;
  }
  g.append(svg('text', { x: 14, y: y + rowH - 8 }, row.label));
  for (const b of row.bars) {
    const x0 = x(Math.min(b.start_ms, b.end_ms)), w = Math.max(Math.abs(x(b.end_ms) - x(b.start_ms)), 2);
    const rect = svg('rect', { x: x0, y: y + 5, width: w, height: rowH - 10, rx: 2,
      fill: row.hatch ? 'url(#ttft-hatch)' : row.color });
    rect.append(svg('title', {}, `${row.label}: ${fmtMs(b.duration_ms)} ` +
      `(${fmtMs(b.start_ms)} → ${fmtMs(b.end_ms)})`));
    g.append(rect);
  }
  for (const e of row.events || []) {
    g.append(svg('line', { x1: x(e.t_ms), x2: x(e.t_ms), y1: y + 3, y2: y + rowH - 3,
      stroke: '#1d2330', 'stroke-width': 1.5 }));
  }
  const total = row.total !== undefined ? row.total : row.bars.reduce((a, b) => a + b.duration_ms, 0);
  g.append(svg('text', { class: 'dur', x: width - 6, y: y + rowH - 8, 'text-anchor': 'end' },
    fmtMs(total)));
  return g;
}

function hatchPattern() {
  const defs = svg('defs', {});
  const p = svg('pattern', { id: 'ttft-hatch', width: 6, height: 6,
    patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' });
  p.append(svg('rect', { width: 6, height: 6, fill: '#dfe3ea' }),
    svg('line', { x1: 0, y1: 0, x2: 0, y2: 6, stroke: COLORS.network, 'stroke-width': 3 }));
  defs.append(p);
  return defs;
}

// "first tool call at X ms (get_weather), arguments ready at Y ms"
function toolCallLine(call) {
  const ready = call.ready_ms === null ? 'arguments never completed'
    : `arguments ready at ${fmtMs(call.ready_ms)}`;
  return `at ${fmtMs(call.start_ms)} (${call.name || 'unnamed'}), ${ready}`;
}

function renderFacts(tr) {
  const c = tr.client;
  const facts = [
    ['server TTFT', fmtMs(tr.server_ttft_ms)],
    ['client TTFT', fmtMs(c && c.client_ttft_ms)],
    ['network + gateway', fmtMs(c && c.network_overhead_ms)],
    ['render delay', fmtMs(c && c.render_delay_ms)],
    // θ itself is an offset between two arbitrary clock origins; its error bound is the news.
    ['clock alignment', c && c.clock ? `±${fmtMs(c.clock.uncertainty_ms)}` : '—'],
    ['tokens (prompt / cached / output)',
      `${tr.num_prompt_tokens} / ${tr.num_cached_tokens} / ${tr.num_output_tokens}`],
  ];
  // The whole path (a collector's record): each part's share of client TTFT and the one
  // segment that took the most, the first place to look.
  if (tr.source === 'collector' && c && c.client_ttft_ms) {
    const byPart = {};
    for (const s of tr.stages) byPart[s.attrs.part] = (byPart[s.attrs.part] || 0) + s.duration_ms;
    const pct = ms => `${(100 * ms / c.client_ttft_ms).toFixed(0)}%`;
    facts.push(['whole path', Object.entries(byPart).map(([p, ms]) =>
      `${p} ${fmtMs(ms)} (${pct(ms)})`).join(' · ')]);
    const top = tr.stages.reduce((a, b) => (b.duration_ms > a.duration_ms ? b : a));
    facts.push(['largest segment', `${top.stage} ${fmtMs(top.duration_ms)} (${pct(top.duration_ms)})`]);
  }
  // TPOT and, beside it, what share of the draft's tokens the target accepted (speculative
  // decoding): the acceptance is what TPOT follows when a draft model is on.
  if (tr.tpot_ms != null || tr.num_draft_tokens) {
    facts.push(['TPOT', fmtMs(tr.tpot_ms) + (tr.num_draft_tokens ? ' · draft acceptance ' +
      `${(100 * tr.num_draft_accepted / tr.num_draft_tokens).toFixed(0)}% ` +
      `(${tr.num_draft_accepted} of ${tr.num_draft_tokens})` : '')]);
  }
  // The first output when it was not text (docs/architecture.md, "First output, by kind"),
  // and each tool call: its function's name only, never its arguments.
  if (tr.first_output_kind && tr.first_output_kind !== 'text') {
    facts.push(['first output', `${tr.first_output_kind.replace('_', ' ')} at ${fmtMs(tr.first_output_ms)}`]);
  }
  if (c && c.first_output_kind && c.first_output_kind !== 'text') {
    facts.push(['client first output', `${c.first_output_kind.replace('_', ' ')} at ${fmtMs(c.first_output_ms)}`]);
  }
  for (const call of tr.tool_calls || []) {
    facts.push(['tool call', toolCallLine(call)]);
  }
  if ((tr.num_tool_calls || 0) > (tr.tool_calls || []).length) {
    facts.push(['tool calls', `${tr.num_tool_calls} in all, the first ${tr.tool_calls.length} shown`]);
  }
  document.getElementById('waterfall-facts').replaceChildren(...facts.map(([k, v]) =>
    el('div', { class: 'fact' }, el('span', { class: 'label' }, k), el('span', { class: 'value' }, v))));
  document.getElementById('waterfall-id').textContent = `${tr.trace_id} · ${tr.request_id}`;
}

// ---- the verdict and the window's causes ---------------------------------------------------

// One sentence above the waterfall: the cause, its numbers and the change to make, as the
// server wrote it (tracer/record/verdict.py); the page adds nothing of its own.
function renderVerdict(tr) {
  const box = document.getElementById('verdict');
  const v = tr.verdict;
  box.textContent = v ? v.sentence : 'No verdict: no first token, so no TTFT to explain.';
  box.dataset.cause = v ? v.cause : '';
  // The engine's own timing, when it could not fit the interval the proxy observed: it is
  // on no bar of the waterfall, and this says why (tracer/engines/placement.py).
  document.getElementById('engine-timing-rejected').textContent = tr.engine_timing_rejected
    ? `Engine timing not placed: ${tr.engine_timing_rejected}.` : '';
}

function renderDiagnosis(d) {
  const s = d.p95_ms === null ? 'no requests with a first token in this window'
    : `${d.num_requests} requests · TTFT p95 ${fmtMs(d.p95_ms)} · SLO ${fmtMs(d.slo_ms)}`;
  document.getElementById('diagnosis-summary').textContent = s;
  const rows = d.causes.map(c => el('tr', { 'data-cause': c.cause },
    el('td', {}, causeBadge(c.cause), ' ', el('span', { class: 'muted' }, c.title)),
    el('td', { class: 'num' }, c.num_requests),
    el('td', { class: 'num' }, `${c.above_slo_s.toFixed(1)} s`),
    el('td', { class: 'num' }, `${c.above_p95_s.toFixed(1)} s`),
    el('td', { class: 'num' }, `${c.excess_s.toFixed(1)} s`),
    el('td', { class: 'action' }, NO_CAUSE.includes(c.cause) ? '' : c.action),
    el('td', {}, ...c.slowest.map(t => {
      const a = el('a', { href: '#trace=' + t.trace_id, class: 'mono' }, fmtMs(t.ttft_ms));
      a.addEventListener('click', ev => { ev.preventDefault(); select(t.trace_id); });
      return a;
    }))));
  document.querySelector('#diagnosis tbody').replaceChildren(...rows);
}

// ---- flow ---------------------------------------------------------------------------------

async function select(traceId) {
  state.selected = traceId;
  if (location.hash !== '#trace=' + traceId) history.replaceState(null, '', '#trace=' + traceId);
  for (const tr of document.querySelectorAll('#requests tbody tr')) {
    tr.classList.toggle('selected', tr.dataset.traceId === traceId);
  }
  try {
    const tr = await getJson(`${API}/trace/${encodeURIComponent(traceId)}`);
    if (state.selected !== traceId) return;
    state.shownClientTtft = tr.client ? tr.client.client_ttft_ms : null;
    state.shownCause = tr.verdict ? tr.verdict.cause : null;
    renderVerdict(tr);
    renderFacts(tr);
    renderWaterfall(tr);
    document.body.dataset.waterfall = traceId;
    document.body.dataset.waterfallClient = tr.client ? 'yes' : 'no';
    document.dispatchEvent(new CustomEvent('ttft:trace', { detail: tr }));   // timeline.js
  } catch (err) {
    document.getElementById('waterfall').replaceChildren(el('p', { class: 'muted' }, String(err)));
  }
}

// The requests table's choice: newest or slowest, over everything the store holds or the
// last N minutes (the store keeps days; /ui/api/requests takes the range).
function requestsQuery() {
  const order = document.getElementById('requests-order').value;
  const minutes = document.getElementById('requests-window').value;
  const query = new URLSearchParams({ limit: '50', order });
  if (minutes) query.set('from_unix_ms', String(Date.now() - Number(minutes) * 60000));
  return query.toString();
}

async function poll() {
  try {
    const last = document.getElementById('attribution-last').value;
    const minutes = document.getElementById('diagnosis-minutes').value;
    const [{ requests }, att, diagnosis] = await Promise.all([
      getJson(`${API}/requests?${requestsQuery()}`),
      getJson(`${API}/attribution?last=${encodeURIComponent(last)}`),
      getJson(`${API}/diagnosis?minutes=${encodeURIComponent(minutes)}`)]);
    state.rows = requests;
    renderTable(requests);
    renderAttribution(att);
    renderDiagnosis(diagnosis);
    setStatus(`updated ${fmtTime(Date.now())}`);
    const wanted = state.selected || (requests[0] && requests[0].trace_id);
    const row = requests.find(r => r.trace_id === wanted);
    // (Re)draw when nothing is shown yet, the probe beacon has arrived since, or the
    // verdict has (it is judged off the request's thread, just after the record is stored).
    if (wanted && (wanted !== document.body.dataset.waterfall ||
        (row && (row.client_ttft_ms !== state.shownClientTtft ||
                 row.cause !== state.shownCause)))) await select(wanted);
  } catch (err) {
    setStatus(`offline: ${err.message}`);
  }
}

// What the serving engine runs on, where it says (our engine's /v1/models `engine` object:
// device, CPU capability, dtype, weight formats), so a figure read here can be tied to its
// path. Behind the proxy this is the upstream's /v1/models; an engine that says nothing
// leaves the line empty.
async function showEngine() {
  try {
    const models = await getJson('/v1/models');
    const info = models.data && models.data[0] && models.data[0].engine;
    if (!info) return;
    const parts = [info.device, info.cpu_capability, info.dtype,
      info.weight_formats && `weights ${info.weight_formats.join('+')}`,
      info.fused_cpu_ops === undefined ? null : (info.fused_cpu_ops ? 'fused ops' : 'torch ops')];
    document.getElementById('engine-info').textContent =
      `engine: ${parts.filter(Boolean).join(' · ')}`;
  } catch (err) { /* no /v1/models here (the collector): nothing to show */ }
}

const fromHash = /^#trace=([0-9a-f]{32})$/.exec(location.hash);
if (fromHash) state.selected = fromHash[1];
document.getElementById('attribution-last').addEventListener('change', poll);
document.getElementById('diagnosis-minutes').addEventListener('change', poll);
document.getElementById('requests-order').addEventListener('change', poll);
document.getElementById('requests-window').addEventListener('change', poll);
document.getElementById('key-form').addEventListener('submit', ev => {
  ev.preventDefault();
  const input = document.getElementById('key-input');
  try { sessionStorage.setItem(KEY_STORE, input.value); } catch (e) { /* storage off: ask again */ }
  input.value = '';
  ev.target.hidden = true;
  poll();
});
poll();
showEngine();
setInterval(poll, POLL_MS);
