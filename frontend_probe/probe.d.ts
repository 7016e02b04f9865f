// Types for the ttftscope browser probe (probe.js / probe.global.js).
//   import { TTFTProbe } from '@ttftscope/probe';
//   TTFTProbe.install({ sampleRate: 0.1, model: 'smollm2' });

/**
 * A stream format: the beacon's `format`, a closed set. probe.js knows 'openai'; formats.js
 * (the add-on) adds the others; 'text' is a text/plain stream, 'custom' the isContent hook.
 */
export type StreamFormat = 'openai' | 'gemini' | 'ollama' | 'openai-responses' | 'anthropic'
  | 'ai-sdk-ui' | 'text' | 'custom';

/**
 * A format's rule on one parsed event: 1 (or true) answer text, 3 an event naming a tool call's
 * function, 2 reasoning text only (1 wins over 3, 3 over 2), 0 one of its own events with none,
 * undefined another format's event; a string is the engine's signed timing token (the AI SDK
 * UI stream's `data-ttft-timing` part). `tools` (formats.js) keeps the beacon's tool_calls.
 */
export type FormatRule = ((event: unknown) => 0 | 1 | 2 | 3 | boolean | string | undefined) & {
  tools?: (event: unknown, rec: object, ms: number) => unknown;
};

/** Which requests `install()` probes: a URL prefix, a RegExp tested on the absolute URL, or a predicate on it. */
export type ProbeMatch = string | RegExp | ((absoluteUrl: string) => boolean);

export interface ProbeOptions {
  /** Beacon endpoint; default '/v1/probe'. */
  collector?: string;
  /** Default: same-origin paths ending in /chat/completions or /completions. */
  match?: ProbeMatch;
  /** Fraction of requests probed, 0..1; default 1. Unsampled requests are left untouched. */
  sampleRate?: number;
  /** Copied into the beacon's optional `model` field. */
  model?: string;
  /**
   * Send `X-TTFT-Timing: 1` (default true), asking the server for its signed in-band timing
   * comment; cross-origin, the server's CORS preflight must allow the header.
   */
  timing?: boolean;
  /**
   * Force the stream format instead of recognising it (from Content-Type, the
   * `x-vercel-ai-ui-message-stream` header, then the first event of a known shape). Formats
   * other than 'openai' and 'text' need formats.js loaded; an unknown one throws.
   */
  format?: StreamFormat;
  /**
   * A house format: called with each parsed event (each decoded piece, for text/plain); a
   * truthy answer is content. The beacon's format is then 'custom'.
   */
  isContent?: (event: unknown) => unknown;
}

export type ProbeOutcome = 'ok' | 'http_error' | 'aborted' | 'network_error';

/** Milliseconds since the probe saw fetch() called (performance.now() clock). */
export interface BeaconTimes {
  start: 0;
  headers: number | null;
  first_byte: number | null;
  first_token: number | null;
  first_paint: number | null;
  end: number;
  /** The first reasoning (thinking) text, when the stream had some: it does not end TTFT. */
  first_reasoning?: number;
  /**
   * The first event naming a tool call's function, when the stream had one. The first output
   * is the earliest of first_token, first_reasoning and first_tool_call; its kind, that field's.
   */
  first_tool_call?: number;
}

/** One tool call of the stream (formats.js): never its arguments. */
export interface BeaconToolCall {
  /** The function's name, cut to 64 UTF-16 units (never inside a character). */
  name: string;
  /** The event naming the function, ms since fetch() like `t`. */
  start: number;
  /** When its arguments were complete (its format's rule); null: the stream ended first. */
  ready: number | null;
}

export interface ItlStats { count: number; mean: number; p50: number; p95: number; max: number }

export interface ResourceBreakdown {
  dns_ms: number;
  connect_ms: number;
  tls_ms: number;
  request_ms: number;
  response_ms: number;
}

/** The JSON body of the one beacon sent per probed request (README.md documents each field). */
export interface Beacon {
  v: 1;
  trace_id: string | null;
  traceparent: string;
  url_path: string;
  status: number | null;
  outcome: ProbeOutcome;
  t: BeaconTimes;
  chunks: number;
  itl_ms: ItlStats;
  /** Arrival of the first 32 content chunks, ms since fetch() like `t` (chunk_ms[0] = t.first_token). */
  chunk_ms: number[];
  /** markInput() → fetch() in ms; null when the page did not call markInput() (or over 60 s before). */
  input_ms: number | null;
  resource: ResourceBreakdown | null;
  probe_errors: number;
  sdk: string;
  /** The stream's format; null when no rule recognised an event (or the body never came). */
  format: StreamFormat | null;
  model?: string;
  /** The server's `Server-Timing: beacon;desc` (64 hex), when the response had one. */
  token?: string;
  /** The token of the stream's `: ttft-timing <token>` SSE comment, when it had one. */
  server?: string;
  /** The stream's first 8 tool calls, in start order; absent without one (or without formats.js). */
  tool_calls?: BeaconToolCall[];
}

export interface Probe {
  readonly version: string;
  /** The format rules, in the order they are tried (RULES); formats.js adds its own here. */
  readonly rules: Record<string, FormatRule>;
  /** Wraps the global fetch (once; a second call only replaces the options). */
  install(options?: ProbeOptions): Probe;
  /** Restores the original fetch (or turns the wrapper into a pass-through if another wrapped it). */
  uninstall(): void;
  /**
   * Call when the user submits (presses Enter): the next fetch the probe matches, sampled or
   * not, takes the mark, and its beacon reports `input_ms` (mark → fetch()). Optional.
   */
  markInput(): void;
  /** A fetch that is always probed (subject to sampleRate), whatever `match` says. */
  fetch(input: RequestInfo | URL, init?: RequestInit): Promise<Response>;
}

/** The globals the probe uses; tests pass fakes. */
export interface ProbeGlobal {
  fetch: typeof fetch;
  performance: Pick<Performance, 'now'> & Partial<Pick<Performance, 'getEntriesByName'>>;
  setTimeout(callback: () => void, ms: number): unknown;
  requestAnimationFrame?: (callback: (time: number) => void) => unknown;
  navigator?: { sendBeacon?: (url: string, data: Blob) => boolean };
  crypto: { getRandomValues<T extends ArrayBufferView>(array: T): T };
  location?: { href: string };
}

export interface ProbeEnv {
  /** Default: globalThis (the window). */
  global?: ProbeGlobal;
  /** Sampling draws in [0, 1); default Math.random. */
  random?: () => number;
}

export function createProbe(env?: ProbeEnv): Probe;
export const TTFTProbe: Probe;

export function newTraceparent(fill: (bytes: Uint8Array) => Uint8Array): string;
export function traceIdOf(traceparent: string | null | undefined): string | null;
export function serverTimingTraceId(header: string | null | undefined): string | null;
export function serverTimingToken(header: string | null | undefined): string | null;
export function itlStats(gapsMs: readonly number[]): ItlStats;
/** With `ndjson`, each non-blank line is one event's data (application/x-ndjson). */
export function sseParser(onData: (data: string) => void,
  onComment?: ((text: string) => void) | null, ndjson?: boolean): (text: string, end?: boolean) => void;
/** The format rules, tried in order: OpenAI's here, formats.js adds the others. */
export const RULES: Record<string, FormatRule>;
/** The token of a `ttft-timing <token>` comment (the text after ':'), or null. */
export function timingToken(comment: string): string | null;
export function utf8Feed(push: (text: string, end: boolean) => void): (bytes?: Uint8Array) => void;
export function hasContent(chunk: unknown): boolean;

declare global {
  interface Window {
    /** Set by the classic build, probe.global.js. */
    TTFTProbe: Probe;
  }
}
