// Reading a streamed body as events: bytes to text across UTF-8 boundaries, text to
// text/event-stream (or NDJSON) events across chunk boundaries.

/**
 * Incremental text/event-stream parser: push decoded text as it arrives; `onData` gets each
 * event's data (multi-line `data:` joined by \n), `onComment` each comment line's text after
 * the ':'. `end` flushes a trailing \r line ending. With `ndjson`, each non-blank line is
 * one event's data instead (application/x-ndjson: Ollama).
 *   const push = sseParser(d => console.log(d)); push('data: {"a"'); push(':1}\n\n');
 */
export function sseParser(onData, onComment, ndjson) {
  let buf = '', data = [];
  const line = l => {
    if (ndjson) {
      if (l.trim()) onData(l);
    } else if (!l) {
      if (data.length) onData(data.join('\n'));
      data = [];
    } else if (l[0] == ':') {
      if (onComment) onComment(l.slice(1));
    } else {
      const i = l.indexOf(':'), v = i < 0 ? '' : l.slice(i + 1);
      if ((i < 0 ? l : l.slice(0, i)) == 'data') data.push(v[0] == ' ' ? v.slice(1) : v);
    }
  };
  return (text, end) => {
    buf += text;
    // a \r at the very end may be the first half of a \r\n split across chunks
    const eol = end ? /\r\n?|\n/ : /\r\n|\r(?!$)|\n/;
    for (let m; (m = eol.exec(buf)); buf = buf.slice(m.index + m[0].length)) line(buf.slice(0, m.index));
  };
}

/** feed(bytes) decodes UTF-8 across chunk boundaries into push(text, end); feed() ends it. */
export function utf8Feed(push) {
  const dec = new TextDecoder();
  return bytes => push(bytes ? dec.decode(bytes, { stream: true }) : dec.decode(), !bytes);
}
