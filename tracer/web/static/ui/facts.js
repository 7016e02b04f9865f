// The facts beside the waterfall: the selected request's TTFTs, where they went, its tokens,
// TPOT and its first non-text output and tool calls (names only, never arguments).
'use strict';

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
