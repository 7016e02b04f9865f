// Shared by the test pages: query options, the probe installed (its beacon goes to
// ?collector=, default /v1/probe), and a copy of every beacon body kept in window.__beacons
// for the test (the real beacon is still sent). run(fn) stores fn's answer in window.__result.
const q = Object.fromEntries(new URLSearchParams(location.search));
window.__beacons = [];
const sendBeacon = navigator.sendBeacon.bind(navigator);
navigator.sendBeacon = (url, data) => {
  data.text().then(t => window.__beacons.push({ url: String(url), body: t }));
  return sendBeacon(url, data);
};
TTFTProbe.install({ collector: q.collector || '/v1/probe' });
window.run = fn => fn(q).then(
  text => void (window.__result = { text }),
  e => void (window.__result = { error: String((e && e.stack) || e) }));
window.chatRequest = () => ({
  model: q.model, stream: true, max_tokens: Number(q.max_tokens || 8),
  messages: [{ role: 'user', content: q.prompt || 'Say hello.' }],
});
