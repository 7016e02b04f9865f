// ttftscope /ui timeline: every request of a window on one time axis (a row each, coloured by
// phase), the engine's steps in a strip beneath, and the selected request's neighbours. The
// API is docs/reference.md, "Timeline and neighbours".
// A plain script loaded last, after the page's others, whose helpers it uses (el, fmtMs,
// fmtTick, fmtTime, niceStep from dom.js; getJson, API from api.js; select, state from ui.js). Bars go on a canvas, not one DOM node each: a
// window holds up to 2,000 requests and 10,000 steps. Strings from the API reach the DOM
// through textContent only (the tooltip, the neighbours table).
'use strict';

const TL_PHASES = { preprocess: '#a47fd1', queue: '#e06c5a', prefill: '#3f7fd9',
  first_token: '#2aa198', decode: '#8fb3e0' };
const TL_STEP_KINDS = { prefill: '#3f7fd9', mixed: '#a0559e', decode: '#5bb04f' };
const TL_BASE = '#c9ccd3';      // a request's interval where no phase covers it
const TL_ACCENT = '#3056d3';
// Rows share at most this height (px) and shrink to fit it, down to 1 px each.
const TL_ROWS_H = 560, TL_ROW_MAX = 14, TL_AXIS_H = 24, TL_STRIP_H = 76, TL_GAP = 12;
const TL_PAD_L = 10, TL_PAD_R = 10;
const tl = { data: null, layout: null, seq: 0, neighbours: new Set() };

function tlBox() { return document.getElementById('timeline'); }

function tlMode() { return document.querySelector('input[name="tl-mode"]:checked').value; }

// The API's query for the window the form names; throws a sentence when it names none.
function tlQuery() {
  const mode = tlMode();
  if (mode === 'around') {
    if (!state.selected) throw new Error('select a request first');
    const pad = Number(document.getElementById('tl-pad').value);
    if (!Number.isInteger(pad) || pad < 0 || pad > 600000) throw new Error('pad: 0 to 600,000 ms');
    return `trace_id=${encodeURIComponent(state.selected)}&pad_ms=${pad}`;
  }
  let from, to;
  if (mode === 'last') {
    // the browser's clock: on another host than the server, the window shifts by their skew
    const s = Number(document.getElementById('tl-last').value);
    if (!(s > 0 && s <= 3600)) throw new Error('last: 1 to 3,600 s');
    to = Date.now();
    from = to - Math.round(s * 1000);
  } else {
    from = new Date(document.getElementById('tl-from').value).getTime();
    to = new Date(document.getElementById('tl-to').value).getTime();
    if (!Number.isFinite(from) || !Number.isFinite(to)) throw new Error('from and to: a date and time each');
    if (!(to > from) || to - from > 3600000) throw new Error('to after from, at most one hour later');
  }
  return `from_unix_ms=${from}&to_unix_ms=${to}`;
}

async function loadTimeline() {
  const box = tlBox();
  const seq = ++tl.seq;
  let query;
  try { query = tlQuery(); } catch (err) { return tlFail(err); }
  box.dataset.state = 'loading';
  try {
    const data = await getJson(`${API}/timeline?${query}`);
    if (seq !== tl.seq) return;
    tl.data = data;
    box.dataset.query = query;
    drawTimeline();
    tlFillRange(data);
  } catch (err) {
    if (seq === tl.seq) tlFail(err);
  }
}

function tlFail(err, state = 'error') {
  tlBox().dataset.state = state;
  document.getElementById('timeline-summary').textContent = `timeline: ${err.message}`;
}

// The from/to inputs take the window drawn, so a user can move from it.
function tlFillRange(d) {
  const local = ms => new Date(ms - new Date(ms).getTimezoneOffset() * 60000).toISOString().slice(0, 23);
  document.getElementById('tl-from').value = local(d.from_unix_ms);
  document.getElementById('tl-to').value = local(d.to_unix_ms);
}

function drawTimeline() {
  const t0 = performance.now();
  const d = tl.data, box = tlBox(), canvas = document.getElementById('timeline-canvas');
  const reqs = d.requests, steps = d.steps, n = reqs.length;
  const span = Math.max(d.to_unix_ms - d.from_unix_ms, 1e-3);
  const rowH = n ? Math.max(1, Math.min(TL_ROW_MAX, Math.floor(TL_ROWS_H / n))) : 0;
  const barH = rowH >= 4 ? rowH - 1 : rowH;       // a 1 px gap once rows can spare it
  const width = Math.max(box.clientWidth, 720), plotW = width - TL_PAD_L - TL_PAD_R;
  const rowsTop = TL_AXIS_H, rowsH = n ? n * rowH : 28;
  const stripH = d.step_log_size === null ? 16 : TL_STRIP_H;      // a proxy: the label alone
  const stripTop = rowsTop + rowsH + TL_GAP, height = stripTop + stripH + 4;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = '#ffffff';
  ctx.fillRect(0, 0, width, height);
  // Whole pixels, so a 1 px bar keeps its colour instead of blending into two columns.
  const x = ms => Math.round(TL_PAD_L + Math.min(Math.max(ms / span, -0.001), 1.001) * plotW);
  const bar = (a, b) => { const x0 = x(a); return [x0, Math.max(1, x(b) - x0)]; };
  const selIndex = reqs.findIndex(r => r.trace_id === state.selected);
  const sel = selIndex >= 0 ? reqs[selIndex] : null;

  ctx.font = '11px system-ui, sans-serif';
  ctx.textBaseline = 'alphabetic';
  const step = niceStep(span, Math.max(2, Math.floor(plotW / 110)));
  for (let t = 0; t <= span + step / 1e6; t += step) {
    ctx.fillStyle = '#e3e6ec';
    ctx.fillRect(x(t), rowsTop - 4, 1, height - rowsTop);
    ctx.fillStyle = '#6b7385';
    ctx.textAlign = t === 0 ? 'left' : x(t) > width - 40 ? 'right' : 'center';
    ctx.fillText(fmtTick(t, step), x(t), rowsTop - 8);
  }
  if (sel) {
    ctx.fillStyle = 'rgba(48, 86, 211, 0.16)';
    ctx.fillRect(0, rowsTop + selIndex * rowH - 2, width, rowH + 4);
    ctx.fillStyle = TL_ACCENT;
    ctx.fillRect(0, rowsTop + selIndex * rowH - 2, 4, rowH + 4);
    // its arrival and its first token, across the rows and the steps: what ran in its wait
    ctx.setLineDash([3, 3]);
    ctx.strokeStyle = '#1d2330';
    for (const ms of [sel.start_ms, sel.ttft_ms === null ? null : sel.start_ms + sel.ttft_ms]) {
      if (ms === null) continue;
      ctx.beginPath();
      ctx.moveTo(x(ms) + 0.5, rowsTop - 4);
      ctx.lineTo(x(ms) + 0.5, height);
      ctx.stroke();
    }
    ctx.setLineDash([]);
    const [x0, w] = bar(sel.start_ms, sel.end_ms === null ? span : sel.end_ms);
    ctx.strokeStyle = TL_ACCENT;
    ctx.strokeRect(x0 - 1.5, rowsTop + selIndex * rowH - 1.5, w + 3, barH + 3);
  }
  ctx.fillStyle = '#e7a83e';      // the selected request's neighbours, in the gutter
  reqs.forEach((r, i) => {
    if (tl.neighbours.has(r.trace_id)) ctx.fillRect(0, rowsTop + i * rowH, 3, barH);
  });

  // The bars last, over the highlight and the marks, so each keeps its exact colour. One pass
  // per colour: a fillStyle change costs more than a rect.
  let rowsDrawn = 0;
  ctx.fillStyle = TL_BASE;
  reqs.forEach((r, i) => {
    const [x0, w] = bar(r.start_ms, r.end_ms === null ? span : r.end_ms);
    ctx.fillRect(x0, rowsTop + i * rowH, w, barH);
    rowsDrawn += 1;
  });
  for (const [phase, color] of Object.entries(TL_PHASES)) {
    ctx.fillStyle = color;
    reqs.forEach((r, i) => {
      for (const p of r.phases) {
        if (p.phase !== phase) continue;
        const [x0, w] = bar(p.start_ms, p.end_ms === null ? span : p.end_ms);
        ctx.fillRect(x0, rowsTop + i * rowH, w, barH);
      }
    });
  }
  if (!n) {
    ctx.fillStyle = '#6b7385';
    ctx.textAlign = 'left';
    ctx.fillText('no request in this window', TL_PAD_L, rowsTop + 18);
  }

  // The steps: height by the tokens each computed (prefill tokens + one per decode sequence).
  const base = stripTop + stripH;
  const tokens = s => s.num_prefill_tokens + s.num_decode_seqs;
  const maxTokens = Math.max(1, ...steps.map(tokens));
  let stepsDrawn = 0;
  for (const [kind, color] of Object.entries(TL_STEP_KINDS)) {
    ctx.fillStyle = color;
    for (const s of steps) {
      if (s.kind !== kind) continue;
      const h = Math.max(2, Math.round(tokens(s) / maxTokens * (TL_STRIP_H - 16)));
      const [x0, w] = bar(s.start_ms, s.end_ms);
      ctx.fillRect(x0, base - h, w, h);
      stepsDrawn += 1;
    }
  }
  if (sel) {      // under each step the selected request took part in
    ctx.fillStyle = TL_ACCENT;
    for (const s of steps) {
      if (s.requests.some(q => q.trace_id === sel.trace_id)) {
        const [x0, w] = bar(s.start_ms, s.end_ms);
        ctx.fillRect(x0, base + 1, w, 3);
      }
    }
  }
  ctx.fillStyle = '#6b7385';
  ctx.textAlign = 'left';
  ctx.fillText(d.step_log_size === null ? 'engine steps: none recorded here (a proxy has none)'
    : `engine steps · height: tokens in the step (tallest ${maxTokens})`, TL_PAD_L, stripTop + 10);

  tl.layout = { rowsTop, rowH, n, stripTop, base, span, plotW };
  const phases = sel ? sel.phases.map(p => ({ phase: p.phase, start_ms: p.start_ms, end_ms: p.end_ms,
    ms: p.end_ms - p.start_ms })) : [];
  Object.assign(box.dataset, {
    state: 'drawn', traceId: state.selected || '', fromUnixMs: d.from_unix_ms, toUnixMs: d.to_unix_ms,
    rows: rowsDrawn, steps: stepsDrawn, rowHeight: rowH, rowsTop, canvasWidth: width,
    canvasHeight: height, selectedIndex: selIndex, selectedPhases: JSON.stringify(phases),
    drawMs: (performance.now() - t0).toFixed(2) });
  const more = d.num_more_requests ? ` (${d.num_more_requests} older not shown)` : '';
  const moreSteps = d.num_more_steps ? ` (${d.num_more_steps} older not shown)` : '';
  document.getElementById('timeline-summary').textContent =
    `${fmtTime(d.from_unix_ms)} → ${fmtTime(d.to_unix_ms)} (${fmtMs(span)}) · ${n} requests${more}` +
    ` · ${steps.length} engine steps${moreSteps} · drawn in ${box.dataset.drawMs} ms`;
}

// What lies under the pointer: {request} in the rows, {step} in the strip, or null.
function tlHit(ev) {
  const L = tl.layout;
  if (!L || !tl.data) return null;
  const ms = (ev.offsetX - TL_PAD_L) / L.plotW * L.span;
  if (ev.offsetY >= L.rowsTop && ev.offsetY < L.rowsTop + L.n * L.rowH) {
    return { request: tl.data.requests[Math.floor((ev.offsetY - L.rowsTop) / L.rowH)] };
  }
  if (ev.offsetY >= L.stripTop && ev.offsetY <= L.base + 4) {
    const slack = 2 * L.span / L.plotW;        // 2 px, so a 1 px step can be found
    const s = tl.data.steps.find(s => s.start_ms - slack <= ms && ms <= s.end_ms + slack);
    return s ? { step: s } : null;
  }
  return null;
}

function tlTooltipLines(hit) {
  if (hit.request) {
    const r = hit.request;
    return [`trace ${r.trace_id}`, `${r.model} · ${r.request_id}${r.in_flight ? ' · in flight' : ''}`,
      ...r.phases.map(p => `${p.phase}: ${fmtMs(p.end_ms - p.start_ms)}`),
      `tokens: ${r.num_prompt_tokens} prompt, ${r.num_cached_tokens} cached · ` +
      `TTFT ${fmtMs(r.ttft_ms)}${r.cause ? ` · ${r.cause}` : ''}`];
  }
  const s = hit.step;
  const who = s.requests.slice(0, 6).map(q => `${q.phase} ${q.num_tokens} · ` +
    (q.trace_id ? q.trace_id.slice(0, 12) + '…' : q.request_id));
  if (s.requests.length > 6) who.push(`… ${s.requests.length - 6} more`);
  return [`${s.kind} step · ${fmtMs(s.end_ms - s.start_ms)}`,
    `${s.num_prefill_tokens} prefill tokens · ${s.num_decode_seqs} decoding` +
    (s.num_preempted ? ` · ${s.num_preempted} preempted` : ''), ...who];
}

function tlHover(ev) {
  const tip = document.getElementById('timeline-tip');
  const hit = tlHit(ev);
  tip.hidden = !hit;
  ev.target.style.cursor = hit && hit.request ? 'pointer' : 'default';
  if (!hit) return;
  tip.replaceChildren(...tlTooltipLines(hit).map(line => el('div', {}, line)));
  const left = Math.min(ev.offsetX + 14, tlBox().clientWidth - tip.offsetWidth - 4);
  tip.style.left = `${Math.max(0, left)}px`;
  tip.style.top = `${ev.offsetY + 14}px`;
}

function tlClick(ev) {
  const hit = tlHit(ev);
  if (!hit || !hit.request || hit.request.trace_id === state.selected) return;
  select(hit.request.trace_id);
  document.getElementById('waterfall-panel').scrollIntoView({ block: 'start' });
}

// The selected request's neighbours, as /ui/api/trace/<id> lists them.
function renderNeighbours(tr) {
  const table = document.getElementById('neighbours');
  const nb = tr.neighbours;
  table.dataset.traceId = tr.trace_id;
  tl.neighbours = new Set(nb ? nb.items.map(i => i.trace_id) : []);
  const rows = (nb ? nb.items : []).map(i => {
    const row = el('tr', { 'data-trace-id': i.trace_id },
      el('td', { class: 'mono', title: i.trace_id }, i.trace_id.slice(0, 12) + '…'),
      el('td', { class: 'num' }, fmtMs(i.overlap_ms)), el('td', { class: 'num' }, fmtMs(i.blame_ms)),
      el('td', {}, i.phase + (i.in_flight ? ' (in flight)' : '')),
      el('td', { class: 'num' }, `${i.num_prompt_tokens} / ${i.num_cached_tokens}`));
    row.addEventListener('click', () => {
      select(i.trace_id);
      document.getElementById('waterfall-panel').scrollIntoView({ block: 'start' });
    });
    return row;
  });
  if (!rows.length) rows.push(el('tr', {}, el('td', { colspan: '5', class: 'muted' },
    nb ? 'No other request overlapped its wait for the first token.'
      : 'This server lists no neighbours.')));
  table.tBodies[0].replaceChildren(...rows);
  document.getElementById('neighbours-more').textContent =
    nb && nb.num_more ? `${nb.num_more} more with less blame not listed` : '';
}

function tlLegend() {
  const item = (name, color) => el('span', { class: 'item' },
    el('span', { class: 'swatch', style: { background: color } }), name);
  document.getElementById('timeline-legend').replaceChildren(
    ...Object.entries(TL_PHASES).map(([p, c]) => item(p, c)),
    el('span', { class: 'muted' }, 'steps:'),
    ...Object.entries(TL_STEP_KINDS).map(([k, c]) => item(k, c)));
}

// The window from the page's own URL, e.g. /ui/?from_unix_ms=A&to_unix_ms=B or ?last_s=60 or
// ?pad_ms=500 (around the request of #trace=).
function tlFromUrl() {
  const q = new URLSearchParams(location.search);
  const pick = mode => {
    document.querySelector(`input[name="tl-mode"][value="${mode}"]`).checked = true;
  };
  if (q.has('pad_ms')) document.getElementById('tl-pad').value = q.get('pad_ms');
  if (q.has('last_s')) { pick('last'); document.getElementById('tl-last').value = q.get('last_s'); }
  const from = Number(q.get('from_unix_ms')), to = Number(q.get('to_unix_ms'));
  if (q.has('from_unix_ms') && q.has('to_unix_ms') && Number.isFinite(from) && Number.isFinite(to)) {
    pick('range');
    tlFillRange({ from_unix_ms: from, to_unix_ms: to });
    loadTimeline();
  } else if (q.has('last_s')) loadTimeline();
}

document.addEventListener('ttft:trace', ev => {
  renderNeighbours(ev.detail);
  // A server without neighbours keeps no timeline either (its /ui/api/timeline is a 404).
  if (!('neighbours' in ev.detail)) tlFail(new Error('this server keeps none'), 'none');
  else if (tlMode() === 'around') loadTimeline();
  else if (tl.data) drawTimeline();     // the same window, the highlight moved
});
document.getElementById('timeline-form').addEventListener('submit', ev => {
  ev.preventDefault();
  loadTimeline();
});
const tlCanvas = document.getElementById('timeline-canvas');
tlCanvas.addEventListener('mousemove', tlHover);
tlCanvas.addEventListener('mouseleave', () => {
  document.getElementById('timeline-tip').hidden = true;
});
tlCanvas.addEventListener('click', tlClick);
window.addEventListener('resize', () => { if (tl.data) drawTimeline(); });
tlLegend();
tlFromUrl();
