// ttftscope waterfall UI: a live table of recent requests, one request's waterfall (client
// and server stages on one time axis) under its verdict's sentence, the attribution bar and
// the window's causes ranked. No framework, no build step.
// This script is the page's flow: what is selected, the polling, the controls. It is loaded
// last of the page's scripts but timeline.js; the others each draw one part (index.html).
// Every value from the API is written with textContent or as an SVG attribute: never as HTML.
'use strict';

const POLL_MS = 2000;
const state = { selected: null, rows: [], shownClientTtft: undefined, shownCause: undefined };

function setStatus(text) {
  document.getElementById('status').textContent = text;
}

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
