// Shared by the stream-format test pages: the probe (with formats.js loaded before this file)
// installed for the app's own routes and the fake upstreams, a copy of each beacon body in
// window.__beacons (the real beacon is still sent to ?collector=), and the page's own clock:
// window.__fetchAt is when the page's client called fetch() (a wrapper outside the probe's),
// so the page can time its first text the way the probe does. run(fn) stores fn's answer.
const q = Object.fromEntries(new URLSearchParams(location.search));
window.__beacons = [];
const waiting = [];
const sendBeacon = navigator.sendBeacon.bind(navigator);
navigator.sendBeacon = (url, data) => {
  data.text().then(t => {
    window.__beacons.push({ url: String(url), body: t });
    for (const w of waiting.splice(0)) w();
  });
  return sendBeacon(url, data);
};
// Resolves once `n` beacons have been sent (each leaves after its stream and first paint).
window.beacons = async n => {
  while (window.__beacons.length < n) await new Promise(r => waiting.push(r));
  return window.__beacons.slice(0, n);
};
// a page may add install options of its own (window.PROBE_OPTIONS, set before this file)
TTFTProbe.install({ collector: q.collector || '/v1/probe', match: u => /\/(api|fake)\//.test(u),
  ...window.PROBE_OPTIONS });
const probed = window.fetch;
window.fetch = function fetch(input, init) {
  window.__fetchAt = performance.now();
  return probed(input, init);
};
window.run = fn => fn(q).then(
  answer => void (window.__result = typeof answer == 'string' ? { text: answer } : answer),
  e => void (window.__result = { error: String((e && e.stack) || e) }));
