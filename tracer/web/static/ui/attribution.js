// The attribution bar: where the median request's server TTFT went, stage by stage, over the
// last N requests, and the network's share of client TTFT where probe beacons joined.
'use strict';

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
