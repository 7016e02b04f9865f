// Reading the page's JSON API (/ui/api/*, and /v1/models), with the API key it may need.
'use strict';

const API = 'api';

// With --api-key, /ui/api/* needs `Authorization: Bearer`: the key is asked for once and
// kept in this tab's sessionStorage (gone with the tab), never put in a URL (history, logs,
// Referer). tracer/web/auth.py.
const KEY_STORE = 'ttftscope.apiKey';

function apiKey() {
  try { return sessionStorage.getItem(KEY_STORE); } catch (e) { return null; }
}

async function getJson(path) {
  const key = apiKey();
  const headers = key ? { authorization: `Bearer ${key}` } : {};
  const res = await fetch(path, { cache: 'no-store', headers });
  if (res.status === 401) {
    document.getElementById('key-form').hidden = false;
    throw new Error(key ? 'wrong API key' : 'API key required');
  }
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  return res.json();
}
