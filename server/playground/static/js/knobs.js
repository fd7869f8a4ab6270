// What the strategy picker offers: every decoding strategy and its knobs, by their HF names.
//
// The page never validates a knob itself: it sends what the user typed and shows the server's
// 400 message next to the field the error's `param` names (server/translate.py and
// decoding/params.py are the single source of truth). So a field here only says how to render
// and convert a value, never which values are allowed.
//
// Kinds: "number" (text box; a blank box is not sent, text that is not a number is sent as typed
// so the server names the problem), "select" (options as [value, label]), "bool" (checkbox),
// "text" (sent as a string), "layers" (dola_layers: "low", "high" or a list of indices),
// "assistant" (assistant_model: the assistants /v1/models lists), "preset" (generation_preset:
// the names /v1/presets lists), "json" (a text area holding JSON, sent parsed; text that does not
// parse is sent as typed, so the server names the problem).

export const FIELDS = {
  max_tokens: { kind: "number", value: "200", help: "tokens to generate at most" },
  do_sample: { kind: "bool", value: false, help: "sample (else greedy); shows the sampling knobs" },
  temperature: { kind: "number", value: "0.7", help: "> 0; 0 with do_sample is a 400" },
  top_k: { kind: "number", value: "", placeholder: "off", help: "keep the k most likely tokens" },
  top_p: { kind: "number", value: "", placeholder: "1.0", help: "nucleus: smallest set with mass p" },
  min_p: { kind: "number", value: "", placeholder: "off", help: "drop tokens below min_p x the top one" },
  typical_p: { kind: "number", value: "", placeholder: "1.0", help: "locally typical sampling" },
  seed: { kind: "number", value: "", placeholder: "random", help: "same seed, same draw" },
  repetition_penalty: { kind: "number", value: "", placeholder: "1.0", help: "> 1 discourages repeats" },
  no_repeat_ngram_size: { kind: "number", value: "", placeholder: "0", help: "never repeat an n-gram" },
  presence_penalty: { kind: "number", value: "", placeholder: "0", help: "OpenAI's, in [-2, 2]" },
  frequency_penalty: { kind: "number", value: "", placeholder: "0", help: "OpenAI's, in [-2, 2]" },
  stop: { kind: "text", value: "", placeholder: "none", help: "a stop string" },
  num_beams: { kind: "number", value: "4", help: "beams kept per step" },
  num_beam_groups: { kind: "number", value: "2", help: "groups of num_beams / groups beams" },
  diversity_penalty: { kind: "number", value: "0.5", help: "penalty on tokens other groups chose" },
  length_penalty: { kind: "number", value: "", placeholder: "1.0", help: "> 0 favours longer beams" },
  early_stopping: {
    kind: "select",
    value: "",
    options: [["", "default (false)"], ["true", "true"], ["false", "false"], ["never", "never"]],
    help: "when a beam search ends",
  },
  num_return_sequences: { kind: "number", value: "", placeholder: "1", help: "best beams returned" },
  penalty_alpha: { kind: "number", value: "0.6", help: "degeneration penalty, in [0, 1]" },
  contrastive_top_k: { name: "top_k", kind: "number", value: "4", help: "candidates per step (at most 32)" },
  dola_layers: { kind: "layers", value: "high", help: '"high", "low" or layer indices: 0,2,4' },
  prompt_lookup_num_tokens: { kind: "number", value: "10", help: "draft tokens copied from the context" },
  max_matching_ngram_size: { kind: "number", value: "", placeholder: "2", help: "n-gram matched in the context" },
  assistant_model: { kind: "assistant", value: "", help: "a draft model the server preloaded" },
  assistant_early_exit: { kind: "number", value: "8", help: "draft with the first k layers" },
  num_assistant_tokens: { kind: "number", value: "", placeholder: "5", help: "drafts per round" },
  num_assistant_tokens_schedule: {
    kind: "select",
    value: "",
    options: [["", "default (heuristic)"], ["heuristic", "heuristic"], ["constant", "constant"],
      ["heuristic_transient", "heuristic_transient"]],
    help: "how the draft length adapts",
  },
  assistant_confidence_threshold: { kind: "number", value: "", placeholder: "off", help: "stop drafting below it" },
  generation_preset: { kind: "preset", value: "", help: "a named generation config" },
  guidance_scale: { kind: "number", value: "", placeholder: "1 (off)", help: "classifier-free guidance; > 1 follows the prompt harder" },
  negative_prompt: { kind: "text", value: "", placeholder: "none", help: "what guidance steers away from" },
  // watermarking_config: a switch, then transformers' WatermarkingConfig fields nested under it
  watermark: { name: "watermarking_config", kind: "bool", value: false, help: "watermark the reply; its z-score is shown" },
  wm_greenlist_ratio: { nest: "watermarking_config", name: "greenlist_ratio", kind: "number", value: "", placeholder: "0.25", help: "share of the vocabulary that is green" },
  wm_bias: { nest: "watermarking_config", name: "bias", kind: "number", value: "", placeholder: "2.0", help: "added to green tokens' logits" },
  wm_hashing_key: { nest: "watermarking_config", name: "hashing_key", kind: "number", value: "", placeholder: "15485863", help: "the secret seeding the green lists" },
  wm_seeding_scheme: { nest: "watermarking_config", name: "seeding_scheme", kind: "select", value: "",
    options: [["", "default (lefthash)"], ["lefthash", "lefthash"], ["selfhash", "selfhash"]],
    help: "how the previous tokens seed the green list",
  },
  // response_format: a JSON schema the reply must follow (sent as OpenAI's json_schema format)
  response_schema: { name: "response_format", kind: "json", value: "", placeholder: '{"type": "object", "properties": {"answer": {"type": "string"}}}',
    help: "a JSON schema; the reply is JSON that validates against it (any strategy)" },
  // tools: OpenAI's function tools; the reply's tool calls are shown under its text
  tools: { kind: "json", value: "", placeholder: '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]',
    help: "function tools (OpenAI's format); the model may call them" },
  tool_choice: { kind: "select", value: "",
    options: [["", "default (auto)"], ["auto", "auto"], ["required", "required"], ["none", "none"]],
    help: "required: the reply is a call (constrained to the tools' schemas)" },
  parallel_tool_calls: { kind: "select", value: "", options: [["", "default (true)"], ["true", "true"], ["false", "false"]],
    help: "false: at most one call per reply" },
  wm_context_width: { nest: "watermarking_config", name: "context_width", kind: "number", value: "", placeholder: "1", help: "previous tokens that seed it" },
};

const SAMPLING = ["temperature", "top_k", "top_p", "min_p", "typical_p", "seed"];
const BEAM_ENDS = ["length_penalty", "early_stopping", "num_return_sequences"];
const DRAFTING = ["num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"];

// `fixed`: sent as is (the strategy's switch); `fields`: its knobs; `sampled`: a do_sample
// checkbox that adds the sampling knobs; `beam`: asks for logprobs, which is what makes the
// server return each beam's `sequence_score`; `speculative`: the acceptance rate applies.
export const STRATEGIES = [
  { id: "greedy", label: "Greedy", fixed: { do_sample: false }, fields: [] },
  { id: "sample", label: "Sampling", fixed: { do_sample: true }, fields: SAMPLING },
  { id: "beam", label: "Beam search", fixed: { do_sample: false }, fields: ["num_beams", ...BEAM_ENDS], beam: true },
  {
    id: "beam_sample", label: "Beam sampling", fixed: { do_sample: true },
    fields: ["num_beams", ...SAMPLING, ...BEAM_ENDS], beam: true,
  },
  {
    id: "group_beam", label: "Diverse beam search", fixed: { do_sample: false },
    fields: ["num_beams", "num_beam_groups", "diversity_penalty", ...BEAM_ENDS], beam: true,
  },
  {
    id: "contrastive", label: "Contrastive search", fixed: { do_sample: false },
    fields: ["penalty_alpha", "contrastive_top_k"],
  },
  { id: "dola", label: "DoLa", fields: ["dola_layers"], sampled: true },
  {
    id: "prompt_lookup", label: "Prompt lookup", fields: ["prompt_lookup_num_tokens", "max_matching_ngram_size"],
    sampled: true, speculative: true,
  },
  {
    id: "assistant", label: "Assistant model", fields: ["assistant_model", ...DRAFTING],
    sampled: true, speculative: true,
  },
  {
    id: "early_exit", label: "Early exit (self-speculative)", fields: ["assistant_early_exit", ...DRAFTING],
    sampled: true, speculative: true,
  },
];

export const SAMPLING_FIELDS = SAMPLING;

// Knobs every strategy shares, shown under each pane's strategy knobs.
export const COMMON_GROUPS = [
  {
    id: "penalties", title: "Penalties and stop",
    fields: ["repetition_penalty", "no_repeat_ngram_size", "presence_penalty", "frequency_penalty", "stop"],
  },
];

// Groups that exist only when the server offers them (`open`: unfolded at first): `requires` is a
// path that the server's /openapi.json must list (probed once at load, so an absent feature costs
// no failed request) and that must then answer 200. This is where later features plug in as plain field groups:
// watermarking (`watermarking_config`, whose output z-score comes from /v1/watermark/detect)
// and classifier-free guidance (`guidance_scale` and its negative prompt) belong here, with
// their fields added to FIELDS above, once the server accepts them.
// `requiresField`: instead of a path, a request field the chat schema must list; `probe: false`:
// the path is listed but not requested (a POST-only endpoint).
export const OPTIONAL_GROUPS = [
  { id: "preset", title: "Preset", requires: "/v1/presets", fields: ["generation_preset"], open: true },
  { id: "guidance", title: "Classifier-free guidance", requiresField: "guidance_scale",
    fields: ["guidance_scale", "negative_prompt"] },
  { id: "response_format", title: "Response format (JSON schema)", requiresField: "response_format",
    fields: ["response_schema"] },
  { id: "tools", title: "Tools", requiresField: "tools", fields: ["tools", "tool_choice", "parallel_tool_calls"] },
  { id: "watermark", title: "Watermark", requires: "/v1/watermark/detect", probe: false,
    fields: ["watermark", "wm_greenlist_ratio", "wm_bias", "wm_hashing_key", "wm_seeding_scheme", "wm_context_width"] },
];

export function strategyById(id) {
  return STRATEGIES.find((s) => s.id === id) || STRATEGIES[0];
}

// The request field a FIELDS entry sends (contrastive_top_k sends top_k).
export function paramName(key) {
  return FIELDS[key].name || key;
}

// The `param` a server error names for a field: nested ones as "watermarking_config.bias".
export function errorName(key) {
  const def = FIELDS[key];
  return def.nest ? `${def.nest}.${paramName(key)}` : paramName(key);
}
