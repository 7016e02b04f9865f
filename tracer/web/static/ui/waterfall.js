// The selected request's waterfall: its client and server stages (or a collector record's
// whole path) on one time axis, an SVG row each.
'use strict';

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
