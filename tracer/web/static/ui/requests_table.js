// The requests table: the recent (or slowest) requests, each with its verdict's cause;
// clicking a row selects it (select, ui.js).
'use strict';

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
