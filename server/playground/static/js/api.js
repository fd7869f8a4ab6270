// The server's OpenAI API through fetch: JSON calls, and chat completions streamed as SSE.
//
// EventSource cannot POST a body, so the stream is read from fetch's ReadableStream and split
// into events here. Aborting the fetch (the Stop button) closes the connection, which is how
// the server learns to abort the request and free its rows (server/streaming.py).

const KEY_STORAGE = "decoda.apiKey";

let apiKey = localStorage.getItem(KEY_STORAGE) || "";

export function getApiKey() {
  return apiKey;
}

export function setApiKey(key) {
  apiKey = key.trim();
  if (apiKey) localStorage.setItem(KEY_STORAGE, apiKey);
  else localStorage.removeItem(KEY_STORAGE);
}

// An OpenAI-style error: `param` names the request field at fault (or is null).
export class ApiError extends Error {
  constructor(status, error) {
    super(error.message || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.param = error.param ?? null;
    this.code = error.code ?? null;
    this.type = error.type ?? null;
  }
}

function headers(json) {
  const out = {};
  if (json) out["Content-Type"] = "application/json";
  if (apiKey) out.Authorization = `Bearer ${apiKey}`;
  return out;
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's page): the status says enough
  }
  return new ApiError(response.status, (body && body.error) || { message: `HTTP ${response.status}` });
}

export async function getJSON(path) {
  const response = await fetch(path, { headers: headers(false) });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// The paths the server's OpenAPI document lists, and the chat request's fields: lets the page
// look for optional endpoints and knobs without requesting absent ones (each would be a 404 in
// the console).
export async function serverSpec() {
  try {
    const doc = await getJSON("/openapi.json");
    const chat = ((doc.components || {}).schemas || {}).ChatCompletionRequest || {};
    return { paths: new Set(Object.keys(doc.paths || {})), chatFields: new Set(Object.keys(chat.properties || {})) };
  } catch {
    return { paths: new Set(), chatFields: new Set() };
  }
}

export async function postJSON(path, body) {
  const response = await fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(body) });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// transformers' WatermarkDetector over a reply's text (/v1/watermark/detect), with the config the
// request used.
export function detectWatermark(text, config) {
  return postJSON("/v1/watermark/detect", { text, watermarking_config: config });
}

// Yields each SSE event's JSON payload until [DONE]. A non-200 answer throws its ApiError before
// anything is yielded; an error event inside the stream (the worker failed, the server is
// draining) throws one too.
export async function* streamChat(body, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(true),
    body: JSON.stringify(body),
    signal,
  });
  yield* events(response);
}

// A multipart form to an audio route (/v1/audio/transcriptions or translations): the answer as text
// (json, text, srt, vtt or verbose_json, as the form's response_format asked), or, with stream=true,
// its events one by one.
export async function postForm(path, form, signal) {
  const response = await fetch(path, { method: "POST", headers: headers(false), body: form, signal });
  if (!response.ok) throw await errorOf(response);
  return response.text();
}

export async function* streamForm(path, form, signal) {
  const response = await fetch(path, { method: "POST", headers: headers(false), body: form, signal });
  yield* events(response);
}

async function* events(response) {
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        finished = true;
        return;
      }
      buffer += value;
      let boundary;
      while ((boundary = /\r?\n\r?\n/.exec(buffer)) !== null) {
        const data = eventData(buffer.slice(0, boundary.index));
        buffer = buffer.slice(boundary.index + boundary[0].length);
        if (data === null) continue; // a comment (sse-starlette's ping)
        if (data === "[DONE]") {
          finished = true;
          return;
        }
        const payload = JSON.parse(data);
        if (payload.error) throw new ApiError(0, payload.error);
        yield payload;
      }
    }
  } finally {
    if (!finished) reader.cancel().catch(() => {});
  }
}

// The data of one SSE event (its `data:` lines joined), or null when it has none.
function eventData(block) {
  const lines = block.split(/\r?\n/).filter((line) => line.startsWith("data:"));
  if (!lines.length) return null;
  return lines.map((line) => line.slice(line.startsWith("data: ") ? 6 : 5)).join("\n");
}
