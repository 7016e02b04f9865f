// The colour of each stage, shared by the attribution bar and the waterfall, so one stage has
// one colour wherever it is drawn (tests/integration/test_browser_e2e.py looks for them).
'use strict';

const SERVER_STAGES = ['receive', 'template', 'tokenize', 'kv_lookup', 'queue', 'prefill',
  'sample', 'detokenize', 'send'];
const COLORS = {
  receive: '#7c8db5', template: '#a47fd1', tokenize: '#d17fb4', kv_lookup: '#e0a040',
  queue: '#e06c5a', prefill: '#3f7fd9', sample: '#2aa198', detokenize: '#5bb04f',
  send: '#9c7a45', unattributed: '#c9ccd3', network: '#b8bfcc',
  // the proxy's stages (receive and send are shared)
  upstream_connect: '#e0a040', upstream_ttfb: '#e06c5a', upstream_first_token: '#3f7fd9',
  // a proxy record joined with its engine's timing (queue, prefill, tokenize as above)
  upstream_request: '#c08a3e', upstream_other: '#b39b6a', inference: '#6f9fe0',
  engine_other: '#8e96a8', upstream_response: '#4f9fb0', model_load: '#c2a25b',
  kv_transfer: '#8f6fd0',
  // after the first output, up to the first text
  reasoning: '#c678dd', tool_call: '#d19a66',
  // the collector's whole path (backend segments are named after their spans: PART_COLORS)
  backend_to_engine: '#c08a3e', first_token: '#4f9fb0', engine: '#6f9fe0',
  'client.request': '#5d5290', 'client.first_byte': '#7b6fa8',
  'client.first_token': '#9a8fc4', 'client.first_paint': '#b7aed8',
};
// A collector record's segments are grouped by part; a backend segment has its span's name.
const PART_GROUPS = { network: 'network', backend: 'your backend (critical path, by span)',
  engine: 'engine' };
const PART_COLORS = { backend: '#d4a95a' };
