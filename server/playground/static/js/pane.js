// A pane: one conversation with its own settings, transcript and statistics. Chat mode shows one
// pane; compare mode sends every prompt to two panes at once.
//
// Each pane keeps its own history (its own replies), so a multi-turn comparison continues each
// strategy's conversation rather than mixing them. The figures under a reply come from the
// response itself: time to first token and tokens/s are timed here around the stream,
// `usage.completion_tokens` counts the tokens, `usage.completion_tokens_details` carries a
// speculative request's accepted and rejected drafts, and a beam choice's `sequence_score`
// arrives with its finish chunk.

import { ApiError, detectWatermark, streamChat } from "./api.js";
import { el } from "./dom.js";
import { contentParts, messageContent, thumbnails } from "./images.js";
import { SettingsForm } from "./settings.js";

const NEAR_BOTTOM = 160; // px: keep following the stream unless the reader scrolled up

export class Pane {
  constructor(name, server, strategy) {
    this.name = name;
    this.history = [];
    this.controller = null;
    this.settingsRoot = el("div", { class: "settings" });
    this.error = el("p", { class: "pane-error", role: "alert", hidden: true });
    this.transcript = el("ol", { class: "transcript", "aria-live": "polite" });
    const copyLabels = { curl: "Copy as curl", python: "Copy as openai-python", anthropic: "Copy as anthropic-python" };
    this.copyButtons = Object.entries(copyLabels).map(([format, text]) =>
      el("button", { type: "button", class: "copy", text, "data-copy": format }),
    );
    this.root = el(
      "section",
      { class: "pane", "data-pane": name, "aria-label": `Pane ${name}` },
      el(
        "div",
        { class: "pane-head" },
        el("h2", { text: name }),
        el("div", { class: "pane-tools" }, ...this.copyButtons),
      ),
      this.settingsRoot,
      this.error,
      this.transcript,
    );
    this.settings = new SettingsForm(this.settingsRoot, server, strategy);
  }

  get running() {
    return this.controller !== null;
  }

  // The request this pane sends for `text` (and `images`, data: URLs) after its history (throws a
  // field's ApiError).
  requestBody(model, system, text, images = []) {
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...this.history];
    if (text || images.length) messages.push({ role: "user", content: messageContent(text, images) });
    return {
      ...(model ? { model } : {}),
      messages,
      ...this.settings.body(),
      stream: true,
      stream_options: { include_usage: true },
    };
  }

  // Runs one turn; resolves to "done", "stopped", "failed" (an error while streaming) or
  // "rejected" (the server refused the request: nothing was added to the conversation).
  async send(model, system, text, images = []) {
    this.settings.clearErrors();
    this.error.hidden = true;
    let body;
    try {
      body = this.requestBody(model, system, text, images);
    } catch (err) {
      this.showRejection(err);
      return "rejected";
    }
    const strategy = this.settings.spec;
    const user = this.addMessage("user", "You");
    this.showContent(user, messageContent(text, images));
    const reply = new Reply(this.addMessage("assistant", `Assistant · ${strategy.label}`), strategy);
    this.controller = new AbortController();
    const started = performance.now();
    let state = "done";
    try {
      for await (const chunk of streamChat(body, this.controller.signal)) {
        reply.take(chunk, performance.now() - started);
        this.follow();
      }
    } catch (err) {
      if (err.name === "AbortError") {
        state = "stopped";
      } else if (err instanceof ApiError && err.status >= 400) {
        user.remove();
        reply.node.remove();
        this.showRejection(err);
        return "rejected";
      } else {
        state = "failed";
        reply.fail(err.message);
      }
    } finally {
      this.controller = null;
    }
    reply.finish(state, performance.now() - started);
    if (body.watermarking_config && state === "done") await reply.scoreWatermark(body.watermarking_config);
    this.history.push({ role: "user", content: messageContent(text, images) }, reply.message(0));
    this.follow();
    return state;
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  showRejection(err) {
    if (!this.settings.showError(err.param, err.message)) {
      this.error.textContent = err.param ? `${err.param}: ${err.message}` : err.message;
      this.error.hidden = false;
    }
  }

  addMessage(role, label) {
    const node = el(
      "li",
      { class: `msg ${role}` },
      el("div", { class: "role", text: label }),
      el("div", { class: "content" }),
    );
    this.transcript.append(node);
    this.follow(true);
    return node;
  }

  follow(force = false) {
    const t = this.transcript;
    if (force || t.scrollHeight - t.scrollTop - t.clientHeight < NEAR_BOTTOM) t.scrollTop = t.scrollHeight;
  }

  // Starts over from `history` (compare mode's second pane begins with the first one's turns).
  load(history) {
    this.clear();
    this.history = history.map((m) => ({ ...m }));
    for (const message of this.history) {
      const node = this.addMessage(message.role, message.role === "user" ? "You" : "Assistant");
      this.showContent(node, message.content);
    }
  }

  // A message's text, and its images as thumbnails under it.
  showContent(node, content) {
    const { text, urls } = contentParts(content);
    node.querySelector(".content").textContent = text;
    if (urls.length) node.append(thumbnails(urls));
  }

  clear() {
    this.history = [];
    this.transcript.replaceChildren();
    this.error.hidden = true;
  }
}

// An assistant message as it streams: one text block per choice, then its statistics.
class Reply {
  constructor(node, strategy) {
    this.node = node;
    this.strategy = strategy;
    this.node.dataset.state = "streaming";
    this.content = node.querySelector(".content");
    this.choices = new Map(); // index -> { text, node, score, finish }
    this.usage = null;
    this.ttft = null;
    this.end = null;
    this.watermark = null;
    this.stats = el("dl", { class: "stats" });
    this.node.append(this.stats);
    this.showStats(null);
  }

  choice(index) {
    if (!this.choices.has(index)) {
      const node = index === 0 ? this.content : el("div", { class: "content choice", "data-index": String(index) });
      if (index !== 0) this.node.insertBefore(node, this.stats);
      this.choices.set(index, { text: "", node, score: null, finish: null, calls: [] });
    }
    return this.choices.get(index);
  }

  text(index) {
    return this.choices.has(index) ? this.choices.get(index).text : "";
  }

  take(chunk, elapsed) {
    if (chunk.usage) this.usage = chunk.usage;
    for (const c of chunk.choices || []) {
      if (this.ttft === null) this.ttft = elapsed; // the role chunk comes with the first token
      const choice = this.choice(c.index);
      const delta = c.delta || {};
      const thinking = delta.reasoning_content ?? delta.reasoning; // the server sends both names: one text
      if (thinking) this.takeReasoning(choice, thinking);
      if (delta.content) {
        choice.text += delta.content;
        choice.node.textContent = choice.text;
      }
      for (const call of delta.tool_calls || []) this.takeToolCall(choice, call);
      if (c.finish_reason) choice.finish = c.finish_reason;
      if (typeof c.sequence_score === "number") choice.score = c.sequence_score;
    }
  }

  // The model's thinking (--reasoning-parser), folded above the answer it led to: open it to read it.
  takeReasoning(choice, text) {
    if (!choice.reasoning) {
      const body = el("div", { class: "reasoning-text" });
      const node = el("details", { class: "reasoning" }, el("summary", { text: "Reasoning" }), body);
      choice.node.before(node);
      choice.reasoning = { text: "", node, body };
    }
    choice.reasoning.text += text;
    choice.reasoning.body.textContent = choice.reasoning.text;
  }

  // OpenAI's streamed tool calls: the first piece of call i brings its id and name, later pieces
  // add to its arguments; each call is shown as name(arguments) under the reply's text.
  takeToolCall(choice, piece) {
    const index = piece.index ?? choice.calls.length;
    if (!choice.calls[index]) {
      const node = el("pre", { class: "tool-call", "data-call": String(index) });
      this.node.insertBefore(node, this.stats);
      choice.calls[index] = { id: piece.id, name: "", arguments: "", node };
    }
    const call = choice.calls[index];
    const fn = piece.function || {};
    if (fn.name) call.name += fn.name;
    if (fn.arguments) call.arguments += fn.arguments;
    call.node.textContent = `tool call: ${call.name}(${call.arguments})`;
  }

  // The assistant turn as the conversation history keeps it (its tool calls included).
  message(index) {
    const choice = this.choices.get(index);
    const calls = choice ? choice.calls.filter(Boolean) : [];
    if (!calls.length) return { role: "assistant", content: this.text(index) };
    return {
      role: "assistant",
      content: this.text(index) || null,
      tool_calls: calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } })),
    };
  }

  fail(message) {
    this.node.append(el("p", { class: "msg-error", role: "alert", text: message }));
  }

  // The reply's watermark z-score from the server's detector; a refusal (too short) is shown as is.
  async scoreWatermark(config) {
    try {
      const found = await detectWatermark(this.text(0), config);
      this.watermark = `z ${found.z_score.toFixed(2)} · ${found.prediction ? "watermarked" : "not detected"}`;
    } catch (err) {
      this.watermark = err.message;
    }
    this.showStats(this.end);
  }

  finish(state, elapsed) {
    this.end = { state, elapsed };
    this.node.dataset.state = state;
    if (this.choices.size > 1) {
      for (const [index, choice] of this.choices) {
        const score = choice.score === null ? "" : ` · sequence_score ${choice.score.toFixed(4)}`;
        choice.node.dataset.label = `#${index + 1}${score}`;
      }
    }
    this.showStats({ state, elapsed });
  }

  showStats(end) {
    const items = [];
    const add = (key, label, value, title) => items.push(
      el("div", { "data-stat": key, title }, el("dt", { text: label }), el("dd", { text: value })),
    );
    if (!end) {
      add("state", "status", "streaming…", "");
      this.stats.replaceChildren(...items);
      return;
    }
    const tokens = this.usage ? this.usage.completion_tokens : null;
    const seconds = end.elapsed / 1000;
    add("tps", "tok/s", tokens === null ? "—" : (tokens / seconds).toFixed(1),
      "tokens generated ÷ seconds from sending to the last token");
    add("ttft", "TTFT", this.ttft === null ? "—" : `${Math.round(this.ttft)} ms`, "time to first token");
    add("tokens", "tokens", tokens === null ? "—" : String(tokens), "usage.completion_tokens (all choices)");
    if (this.strategy.speculative) {
      const details = this.usage && this.usage.completion_tokens_details;
      const accepted = details ? details.accepted_prediction_tokens : 0;
      const drafted = details ? accepted + details.rejected_prediction_tokens : 0;
      add("acceptance", "accepted", drafted ? `${Math.round((100 * accepted) / drafted)}% of ${drafted}` : "no drafts",
        "draft tokens the target kept (usage.completion_tokens_details)");
    }
    if (this.watermark) add("watermark", "watermark", this.watermark, "z-score of /v1/watermark/detect on this reply");
    const best = this.choices.get(0);
    if (best && best.score !== null) add("score", "sequence_score", best.score.toFixed(4), "the best beam's score");
    const finish = best && best.finish;
    add("state", "end", end.state === "done" ? finish || "done" : end.state, "finish_reason, or how it ended");
    this.stats.replaceChildren(...items);
  }
}
