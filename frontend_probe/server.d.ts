// Types for the ttftscope backend helper (server.js).
//   import { ttftJoin } from '@ttftscope/probe/server.js';

/** The request headers the engine needs from the browser's request. */
export const FORWARD: readonly ['traceparent', 'tracestate', 'x-ttft-timing'];
export const UI_STREAM_HEADER: 'x-vercel-ai-ui-message-stream';

/** A Fetch Request, a Headers, a Node IncomingMessage or a plain object of headers. */
export type HeaderSource = { headers: unknown } | Headers | Record<string, string | string[] | undefined>;

export interface TimingDataPart {
  type: 'data-ttft-timing';
  data: string;
  transient: true;
}

/** A header of the browser's request left out: no HTTP message may carry it. */
export interface RefusedHeader extends TypeError {
  header: string;
}

export interface TtftJoin {
  /** For the AI SDK providers' and the openai / @anthropic-ai/sdk clients' `fetch` option. */
  fetch: typeof fetch;
  /** The browser's headers left out (CR, LF or NUL in the value, an invalid name). */
  readonly refused: RefusedHeader[];
  /** `trace;desc=<traceparent>, beacon;desc=<token>` with a beaconKey and a valid
   * traceparent (respond() puts it first in Server-Timing), else null. */
  readonly signedServerTiming: string | null;
  /** The engine's Server-Timing, once its response came. */
  readonly serverTiming: string | null;
  /** The engine's signed `: ttft-timing` token, once its stream carried it. */
  readonly token: string | null;
  /** The AI SDK UI message stream data part holding the token, or null before it came. */
  part(): TimingDataPart | null;
  /**
   * `response` with the engine's Server-Timing added and, in an SSE body, the token written
   * once before `data: [DONE]` (an SSE comment; the data part in an AI SDK UI stream).
   */
  respond(response: Response): Promise<Response>;
}

export interface TtftJoinOptions {
  /** The fetch the backend would use; default globalThis.fetch. */
  fetch?: typeof fetch;
  /** How long respond() waits for the engine's response headers; default 10000 ms. */
  waitMs?: number;
  /** Told of each browser header left out; the request goes on without it. */
  onRefused?: (error: RefusedHeader) => void;
  /** The collector's `--beacon-key` (a string is UTF-8): respond() signs the beacon token
   * itself and exposes Server-Timing (Access-Control-Expose-Headers). */
  beaconKey?: string | Uint8Array;
  /** The backend's own server span's traceparent; default (or when invalid) the browser's. */
  traceparent?: string;
}

export function ttftJoin(request: HeaderSource, options?: TtftJoinOptions): TtftJoin;
export function headersOf(source: HeaderSource | undefined,
  onRefused?: (error: RefusedHeader) => void): Headers;
/**
 * The traceparent to send on (W3C Trace Context), or null when invalid; a later version
 * comes back as version 00.
 */
export function traceparentOf(value: string | null | undefined): string | null;
/** hex(HMAC-SHA256(key, traceId)): tracer/web/probe/token.py's BeaconSigner(key).token. */
export function beaconToken(key: string | Uint8Array, traceId: string): string;
/** `trace;desc=<traceparent>, beacon;desc=<token>`, or null for an invalid traceparent. */
export function signedServerTiming(traceparent: string | null | undefined,
  key: string | Uint8Array): string | null;
/** Adds Server-Timing to Access-Control-Expose-Headers (once); returns `headers`. */
export function exposeServerTiming(headers: Headers): Headers;
/** Writes a Web Response to a Node ServerResponse as it streams (Express, node:http). */
export function writeTo(nodeRes: import('node:http').ServerResponse, response: Response): Promise<void>;
