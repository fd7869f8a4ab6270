// The playground's wiring: what the server offers (model, assistants, presets), chat and compare
// modes, the composer (Enter sends, Shift+Enter is a newline, Escape stops) and the copy dialog.

import { getApiKey, getJSON, serverSpec, setApiKey } from "./api.js";
import { Attachments } from "./images.js";
import { OPTIONAL_GROUPS } from "./knobs.js";
import { Pane } from "./pane.js";
import { anthropicSnippet, curlSnippet, pythonSnippet } from "./snippets.js";
import { TranscribePane } from "./transcribe.js";

const $ = (selector) => document.querySelector(selector);

// What the settings forms offer beyond knobs.js, filled in once the server answered.
const server = { model: null, assistants: [], presets: [], groups: new Set() };
const panes = [new Pane("A", server, "greedy"), new Pane("B", server, "contrastive")];
let mode = "chat";
const attachments = new Attachments({
  button: $("#attach"), input: $("#image-file"), strip: $("#attachments"), prompt: $("#prompt"),
});

function active() {
  return mode === "compare" ? panes : panes.slice(0, 1);
}

function notice(text) {
  const box = $("#notice");
  box.textContent = text;
  box.hidden = !text;
}

// Preset names from /v1/presets, whatever its list's shape: {data: [...]}, [...] or {name: config}.
function presetNames(answer) {
  const items = Array.isArray(answer) ? answer : Array.isArray(answer.data) ? answer.data : Object.keys(answer);
  return items.map((item) => (typeof item === "string" ? item : item.id || item.name)).filter(Boolean);
}

async function loadServer() {
  try {
    const models = (await getJSON("/v1/models")).data;
    const target = models.find((m) => m.role !== "assistant") || models[0];
    server.model = target ? target.id : null;
    server.assistants = models.filter((m) => m.role === "assistant").map((m) => m.id);
    $("#model-name").textContent = server.model || "no model";
    notice("");
    if (target && target.task === "automatic-speech-recognition") {
      showTranscription();
      return;
    }
    if (target && (target.input_modalities || []).includes("image")) attachments.enable();
  } catch (err) {
    $("#model-name").textContent = "not connected";
    if (err.status === 401) {
      notice("This server needs an API key: enter it under “API key”.");
      $("#auth").open = true;
    } else {
      notice(`Could not read /v1/models: ${err.message}`);
    }
    return;
  }
  const { paths, chatFields } = await serverSpec();
  for (const group of OPTIONAL_GROUPS) {
    if (group.requiresField) {
      if (chatFields.has(group.requiresField)) server.groups.add(group.id);
      continue;
    }
    if (!paths.has(group.requires)) continue;
    if (group.probe === false) {
      server.groups.add(group.id);
      continue;
    }
    try {
      const answer = await getJSON(group.requires);
      if (group.id === "preset") server.presets = presetNames(answer);
      server.groups.add(group.id);
    } catch {
      // listed but not answering 200 (not configured): the group stays hidden
    }
  }
  for (const pane of panes) pane.settings.render();
  document.body.dataset.ready = "true";
}

// A speech model: the transcription pane replaces chat, its composer and compare mode.
function showTranscription() {
  if (document.body.dataset.task === "speech") return;
  document.body.dataset.task = "speech";
  const container = $("#panes");
  container.replaceChildren(new TranscribePane(server).root);
  for (const hidden of [".composer", ".modes", ".system"]) $(hidden).hidden = true;
  document.body.dataset.ready = "true";
}

function setMode(next) {
  if (next === mode) return;
  if (next === "compare" && !panes[1].history.length) panes[1].load(panes[0].history);
  mode = next;
  document.body.dataset.mode = mode;
  $("#mode-chat").setAttribute("aria-pressed", String(mode === "chat"));
  $("#mode-compare").setAttribute("aria-pressed", String(mode === "compare"));
  panes[1].root.hidden = mode !== "compare";
}

async function send() {
  const prompt = $("#prompt");
  const text = prompt.value.trim();
  if ((!text && !attachments.urls.length) || panes.some((p) => p.running)) return;
  prompt.value = "";
  const images = attachments.take();
  const system = $("#system-prompt").value.trim();
  setRunning(true);
  try {
    const states = await Promise.all(active().map((pane) => pane.send(server.model, system, text, images)));
    if (states.every((s) => s === "rejected")) {
      prompt.value = text; // fix the field, send again
      attachments.restore(images);
    }
  } finally {
    setRunning(false);
    prompt.focus();
  }
}

function stop() {
  for (const pane of panes) pane.stop();
}

function setRunning(running) {
  $("#send").disabled = running;
  $("#stop").disabled = !running;
  document.body.dataset.running = String(running);
}

function openSnippet(pane, format) {
  let body;
  try {
    const text = $("#prompt").value.trim() || "Hello!";
    body = pane.requestBody(server.model, $("#system-prompt").value.trim(), text, attachments.urls);
  } catch (err) {
    pane.showRejection(err);
    return;
  }
  const options = { origin: window.location.origin, withKey: Boolean(getApiKey()) };
  const write = { curl: curlSnippet, python: pythonSnippet, anthropic: anthropicSnippet }[format];
  const text = write(body, options);
  const dialog = $("#snippet");
  dialog.querySelector("h2").textContent = { curl: "curl", python: "openai-python", anthropic: "anthropic-python" }[format];
  const area = dialog.querySelector("textarea");
  area.value = text;
  const status = dialog.querySelector(".copy-status");
  status.textContent = "";
  dialog.showModal();
  area.scrollTop = 0;
  copy(text, status);
}

async function copy(text, status) {
  try {
    await navigator.clipboard.writeText(text);
    status.textContent = "Copied to the clipboard.";
  } catch {
    status.textContent = "Select the text and copy it (the browser did not allow clipboard access).";
  }
}

function wire() {
  const container = $("#panes");
  for (const pane of panes) {
    container.append(pane.root);
    for (const button of pane.copyButtons) {
      button.addEventListener("click", () => openSnippet(pane, button.dataset.copy));
    }
  }
  panes[1].root.hidden = true;
  document.body.dataset.mode = mode;
  $("#mode-chat").addEventListener("click", () => setMode("chat"));
  $("#mode-compare").addEventListener("click", () => setMode("compare"));
  $("#send").addEventListener("click", send);
  $("#stop").addEventListener("click", stop);
  $("#clear").addEventListener("click", () => panes.forEach((p) => p.clear()));
  $("#prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && panes.some((p) => p.running)) stop();
  });
  const key = $("#api-key");
  key.value = getApiKey();
  key.addEventListener("change", () => {
    setApiKey(key.value);
    loadServer();
  });
  const dialog = $("#snippet");
  dialog.querySelector(".close").addEventListener("click", () => dialog.close());
  dialog.querySelector(".copy-again").addEventListener("click", () =>
    copy(dialog.querySelector("textarea").value, dialog.querySelector(".copy-status")),
  );
  setRunning(false);
}

wire();
loadServer();
