// Types for the ttftscope probe's stream-format add-on (formats.js / formats.global.js).
//   import { TTFTProbe } from '@ttftscope/probe';
//   import '@ttftscope/probe/formats.js';   // adds its rules to the probe's RULES
import type { FormatRule } from './probe';

/** Gemini, Ollama, OpenAI Responses, Anthropic Messages and the AI SDK UI message stream. */
export const FORMAT_RULES: {
  gemini: FormatRule;
  ollama: FormatRule;
  'openai-responses': FormatRule;
  anthropic: FormatRule;
  'ai-sdk-ui': FormatRule;
};
