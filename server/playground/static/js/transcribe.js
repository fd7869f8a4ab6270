// The transcription pane, shown instead of chat when the served model transcribes speech (its
// /v1/models entry's task is automatic-speech-recognition): an audio file or a recording from the
// microphone (where the browser allows it) sent to /v1/audio/transcriptions or /translations, the
// text streamed in as it is decoded (or the whole answer in the format asked for).

import { ApiError, postForm, streamForm } from "./api.js";

const FORMATS = ["text", "json", "verbose_json", "srt", "vtt"];

function element(tag, attributes = {}, children = []) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

function labelled(text, control) {
  return element("label", { class: "field" }, [element("span", {}, [text]), control]);
}

export class TranscribePane {
  constructor(server) {
    this.server = server;
    this.recorded = null; // a Blob from the microphone, used when no file is chosen
    this.controller = null;
    this.file = element("input", { type: "file", id: "audio-file", accept: "audio/*,video/webm,video/mp4" });
    this.task = element("select", { id: "audio-task" }, [
      element("option", { value: "transcriptions" }, ["Transcribe"]),
      element("option", { value: "translations" }, ["Translate to English"]),
    ]);
    this.language = element("input", { id: "audio-language", placeholder: "detect", size: "6" });
    this.format = element("select", { id: "audio-format" }, FORMATS.map((f) => element("option", { value: f }, [f])));
    this.stream = element("input", { type: "checkbox", id: "audio-stream", checked: "" });
    this.beams = element("input", { type: "number", id: "audio-beams", min: "1", max: "8", value: "1" });
    this.record = element("button", { type: "button", id: "audio-record" }, ["Record"]);
    this.go = element("button", { type: "button", id: "audio-send", class: "primary" }, ["Transcribe"]);
    this.halt = element("button", { type: "button", id: "audio-stop" }, ["Stop"]);
    this.status = element("p", { class: "audio-status", role: "status" });
    this.output = element("pre", { id: "audio-output", class: "audio-output", "aria-live": "polite" });
    this.error = element("p", { class: "audio-error", role: "alert", hidden: "" });
    this.root = element("section", { class: "pane transcribe", "aria-label": "Transcription" }, [
      element("div", { class: "audio-controls" }, [
        labelled("Audio file", this.file),
        this.record,
        labelled("Task", this.task),
        labelled("Language", this.language),
        labelled("Format", this.format),
        labelled("Stream", this.stream),
        labelled("num_beams", this.beams),
      ]),
      element("div", { class: "actions" }, [this.go, this.halt]),
      this.status,
      this.error,
      this.output,
    ]);
    this.go.addEventListener("click", () => this.send());
    this.halt.addEventListener("click", () => this.controller && this.controller.abort());
    this.format.addEventListener("change", () => this.allowStream());
    this.task.addEventListener("change", () => (this.language.disabled = this.task.value === "translations"));
    this.record.addEventListener("click", () => this.toggleRecording());
    if (!(navigator.mediaDevices && window.MediaRecorder)) {
      this.record.disabled = true;
      this.record.title = "this browser (or an insecure origin) gives the page no microphone";
    }
    this.halt.disabled = true;
    this.allowStream();
  }

  allowStream() {
    // OpenAI streams json and text only
    const streams = ["text", "json"].includes(this.format.value);
    this.stream.disabled = !streams;
    if (!streams) this.stream.checked = false;
  }

  async toggleRecording() {
    if (this.recorder) {
      this.recorder.stop();
      return;
    }
    try {
      const media = await navigator.mediaDevices.getUserMedia({ audio: true });
      const chunks = [];
      this.recorder = new MediaRecorder(media);
      this.recorder.addEventListener("dataavailable", (event) => chunks.push(event.data));
      this.recorder.addEventListener("stop", () => {
        media.getTracks().forEach((track) => track.stop());
        this.recorded = new Blob(chunks, { type: this.recorder.mimeType || "audio/webm" });
        this.recorder = null;
        this.record.textContent = "Record";
        this.status.textContent = `Recorded ${(this.recorded.size / 1024).toFixed(0)} KiB: Transcribe sends it.`;
      });
      this.recorder.start();
      this.record.textContent = "Stop recording";
      this.status.textContent = "Recording…";
    } catch (err) {
      this.showError(new ApiError(0, { message: `no microphone: ${err.message}` }));
    }
  }

  form() {
    const form = new FormData();
    const chosen = this.file.files[0];
    if (chosen) form.append("file", chosen, chosen.name);
    else if (this.recorded) form.append("file", this.recorded, "recording.webm");
    else throw new ApiError(400, { message: "choose an audio file or record one", param: "file" });
    form.append("model", this.server.model);
    form.append("response_format", this.format.value);
    if (this.language.value.trim() && this.task.value === "transcriptions") {
      form.append("language", this.language.value.trim());
    }
    if (Number(this.beams.value) > 1) form.append("num_beams", this.beams.value);
    if (this.stream.checked) form.append("stream", "true");
    return form;
  }

  showError(err) {
    this.error.hidden = false;
    this.error.textContent = err.param ? `${err.param}: ${err.message}` : err.message;
  }

  async send() {
    if (this.controller) return;
    this.error.hidden = true;
    this.output.textContent = "";
    let form;
    try {
      form = this.form();
    } catch (err) {
      this.showError(err);
      return;
    }
    const path = `/v1/audio/${this.task.value}`;
    this.controller = new AbortController();
    this.go.disabled = true;
    this.halt.disabled = false;
    this.status.textContent = "Transcribing…";
    const started = performance.now();
    try {
      if (this.stream.checked) {
        for await (const event of streamForm(path, form, this.controller.signal)) {
          if (event.type === "transcript.text.delta") this.output.textContent += event.delta;
          if (event.type === "transcript.text.done") this.output.textContent = event.text;
        }
      } else {
        const text = await postForm(path, form, this.controller.signal);
        this.output.textContent = this.format.value === "json" ? JSON.parse(text).text : text;
      }
      this.status.textContent = `Done in ${((performance.now() - started) / 1000).toFixed(1)} s.`;
    } catch (err) {
      if (err.name === "AbortError") this.status.textContent = "Stopped.";
      else this.showError(err);
    } finally {
      this.controller = null;
      this.go.disabled = false;
      this.halt.disabled = true;
    }
  }
}
