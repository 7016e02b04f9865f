// What counts as output in each stream format: the rules that end TTFT (and mark the first
// reasoning and tool call), kept in step with tracer/record/first_content.py.

const ok = s => typeof s == 'string' && s.length > 0;

/**
 * One rule per stream format, tried in this order on a stream's events until one recognises
 * the shape: the stream is then that format (`install({format})` forces one). A rule returns
 * 1 for an event with answer text, 3 for one that names a tool call's function (the call's
 * first delta), 2 for one with reasoning text only (1 wins over 3, 3 over 2), 0 for one of
 * its own events with none (role, start, ping, usage, metadata, tool-call arguments),
 * undefined for any other. A rule may carry `tools(event, rec, ms)`, which keeps `rec.tools`
 * (the beacon's tool_calls: formats.js adds them, OpenAI's too). The core holds OpenAI's;
 * formats.js (a separate add-on, README.md "Stream formats") adds Gemini, Ollama, Responses,
 * Anthropic and the AI SDK UI stream. tracer/record/first_content.py holds the same rules;
 * tests/fixtures/sse/ checks both.
 */
export const RULES = {
  // chat/completions chunks and bodies; reasoning_content (vLLM, DeepSeek) and reasoning
  // (OpenRouter, Ollama's /v1) are reasoning; a tool_calls item or a legacy function_call
  // with a name starts a tool call
  openai: j => Array.isArray(j?.choices) ? j.choices.reduce((k, c, d) => k == 1 ? 1 : (c = c || {}, d = c.delta || {},
    [c.text, d.content, c.message?.content].some(ok) || Math.max(k, [d.tool_calls, c.message?.tool_calls, [{ function: d.function_call }]]
      .some(l => Array.isArray(l) && l.some(x => ok(x?.function?.name))) ? 3 : 2 * [d.reasoning_content, d.reasoning].some(ok))), 0) : undefined,
};

/**
 * Whether a parsed chunk or body carries content, the rule TTFT ends at (the same as
 * tracer/record/first_content.py): ANY choice has a non-empty string in delta.content (chat
 * chunk), text (completions) or message.content (non-streamed body). Role-only, empty, null,
 * usage-only (choices: []), error and reasoning_content-only events don't.
 */
export function hasContent(j) {
  return RULES.openai(j) == 1;
}
