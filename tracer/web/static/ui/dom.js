// /ui's small shared helpers: building DOM and SVG nodes, and writing times and durations.
// Every value from the API reaches the page through these as text or an SVG attribute, never
// as HTML. A plain script, the first the page loads: the others call these by name.
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';

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

// An axis step near span/approxTicks that reads well: 1, 2, 2.5 or 5 times a power of ten.
function niceStep(span, approxTicks) {
  const raw = span / approxTicks, pow = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 2.5, 5, 10].map(m => m * pow).find(s => s >= raw) || raw;
}
