// "Copy as curl", "copy as openai-python" and "copy as anthropic-python": the exact request a pane
// would send, as code.
//
// The openai client takes OpenAI's own fields as keyword arguments and everything else (the
// GenerationConfig knobs by their HF names, Decoda's extensions) through `extra_body`, so the
// snippet splits the body the same way. An API key is never pasted into a snippet: it reads
// DECODA_API_KEY from the environment instead.

// chat.completions.create's own keyword arguments (openai-python).
const OPENAI_ARGS = new Set([
  "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed", "stream",
  "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user",
]);

function shellQuote(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

export function curlSnippet(body, { origin, withKey }) {
  const lines = [`curl -N ${origin}/v1/chat/completions`, "-H 'Content-Type: application/json'"];
  if (withKey) lines.push('-H "Authorization: Bearer $DECODA_API_KEY"');
  lines.push(`-d ${shellQuote(JSON.stringify(body, null, 2))}`);
  return lines.join(" \\\n  ");
}

// A JSON value as a Python literal (JSON strings are valid Python string literals).
function py(value, indent) {
  const pad = "    ".repeat(indent);
  const inner = "    ".repeat(indent + 1);
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number" || typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    if (value.every((v) => typeof v !== "object" || v === null)) return `[${value.map((v) => py(v, 0)).join(", ")}]`;
    return `[\n${value.map((v) => inner + py(v, indent + 1)).join(",\n")},\n${pad}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  const flat = entries.map(([k, v]) => `${JSON.stringify(k)}: ${py(v, indent + 1)}`);
  const oneLine = `{${flat.join(", ")}}`;
  if (oneLine.length + pad.length <= 100 && !oneLine.includes("\n")) return oneLine;
  return `{\n${flat.map((line) => inner + line).join(",\n")},\n${pad}}`;
}

export function pythonSnippet(body, { origin, withKey }) {
  const args = [];
  const extra = {};
  for (const [key, value] of Object.entries(body)) {
    if (OPENAI_ARGS.has(key)) args.push(`    ${key}=${py(value, 1)},`);
    else extra[key] = value;
  }
  if (Object.keys(extra).length) {
    args.push(`    extra_body=${py(extra, 1)},  # GenerationConfig knobs by their HF names`);
  }
  const key = withKey ? 'os.environ["DECODA_API_KEY"]' : '"unused"';
  const several = (body.n || 1) > 1 || (body.num_return_sequences || 1) > 1;
  const print = several
    ? ["    for choice in chunk.choices:", "        if choice.index == 0:  # the first choice of several",
      '            print(choice.delta.content or "", end="", flush=True)']
    : ["    if chunk.choices:", '        print(chunk.choices[0].delta.content or "", end="", flush=True)'];
  return [
    ...(withKey ? ["import os", ""] : []),
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url="${origin}/v1", api_key=${key})`,
    "stream = client.chat.completions.create(",
    ...args,
    ")",
    "for chunk in stream:",
    ...print,
    "    if chunk.usage:",
    '        print(f"\\n\\n{chunk.usage.completion_tokens} tokens")',
    "",
  ].join("\n");
}

// "Copy as anthropic-python": the same request on the Messages API (POST /v1/messages). The chat
// body's system turn becomes `system`, `stop` `stop_sequences`, its function tools Anthropic's
// (`input_schema`), its tool_choice Anthropic's; the SDK's own arguments go as keywords and every
// other field (sampling knobs included: the SDK no longer takes them as keywords) through extra_body.
const ANTHROPIC_ARGS = new Set(["model", "messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice"]);
const NOT_ON_MESSAGES = new Set(["stream", "stream_options", "messages", "max_completion_tokens", "stop", "tools",
  "tool_choice", "parallel_tool_calls"]);

function anthropicToolChoice(choice, parallel) {
  const disable = parallel === false ? { disable_parallel_tool_use: true } : {};
  if (choice === undefined || choice === "auto") return parallel === false ? { type: "auto", ...disable } : undefined;
  if (choice === "none") return { type: "none" };
  if (choice === "required") return { type: "any", ...disable };
  return { type: "tool", name: choice.function.name, ...disable };
}

// A chat message's content as Messages blocks: image_url parts (data: URLs) become base64 image blocks.
function anthropicContent(content) {
  if (!Array.isArray(content)) return content ?? "";
  return content.map((part) => {
    if (part.type !== "image_url") return part;
    const [, mediaType, data] = /^data:([^;,]+);base64,(.*)$/s.exec(part.image_url.url) ?? [];
    return mediaType
      ? { type: "image", source: { type: "base64", media_type: mediaType, data } }
      : { type: "image", source: { type: "url", url: part.image_url.url } };
  });
}

export function messagesBody(body) {
  const system = body.messages.filter((m) => m.role === "system").map((m) => m.content).join("\n\n");
  const out = {
    model: body.model,
    max_tokens: body.max_tokens ?? body.max_completion_tokens ?? 256,
    messages: body.messages.filter((m) => m.role === "user" || m.role === "assistant")
      .map((m) => ({ role: m.role, content: anthropicContent(m.content) })),
  };
  if (system) out.system = system;
  if (body.stop !== undefined) out.stop_sequences = Array.isArray(body.stop) ? body.stop : [body.stop];
  if (body.tools) {
    out.tools = body.tools.map((t) => ({ name: t.function.name, description: t.function.description,
      input_schema: t.function.parameters ?? { type: "object" } }));
    const choice = anthropicToolChoice(body.tool_choice, body.parallel_tool_calls);
    if (choice) out.tool_choice = choice;
  }
  for (const [key, value] of Object.entries(body)) {
    if (!NOT_ON_MESSAGES.has(key) && !(key in out) && key !== "max_tokens") out[key] = value;
  }
  return out;
}

export function anthropicSnippet(body, { origin, withKey }) {
  const request = messagesBody(body);
  const args = [];
  const extra = {};
  for (const [key, value] of Object.entries(request)) {
    if (ANTHROPIC_ARGS.has(key)) args.push(`    ${key}=${py(value, 1)},`);
    else extra[key] = value;
  }
  if (Object.keys(extra).length) args.push(`    extra_body=${py(extra, 1)},  # sampling and GenerationConfig knobs`);
  const key = withKey ? 'os.environ["DECODA_API_KEY"]' : '"unused"';
  return [
    ...(withKey ? ["import os", ""] : []),
    "from anthropic import Anthropic",
    "",
    `client = Anthropic(base_url="${origin}", api_key=${key})`,
    "with client.messages.stream(",
    ...args,
    ") as stream:",
    "    for text in stream.text_stream:",
    '        print(text, end="", flush=True)',
    "    final = stream.get_final_message()",
    'print(f"\\n\\n{final.usage.output_tokens} tokens")',
    "",
  ].join("\n");
}
