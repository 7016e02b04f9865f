// The verdict and the window's causes: one request's cause as the server's sentence, and the
// causes of a window ranked by the time they cost.
'use strict';

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
