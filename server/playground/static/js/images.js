// Images attached to the next message, offered when the served model takes images (its /v1/models
// entry's input_modalities include "image"): chosen with the Image button or pasted into the message
// box, shown as thumbnails until sent, and sent as chat image_url parts holding data: URLs (the server
// fetches no remote URL unless its operator allows the host, and the page's Content-Security-Policy
// shows data: images only). A sent image stays in the conversation, so later turns send it again.

import { el } from "./dom.js";

export const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"]; // what the server opens

function dataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// Thumbnails of `urls` (a user turn's images in the transcript, or the composer's attachments).
export function thumbnails(urls, onRemove = null) {
  return el(
    "div",
    { class: "thumbs" },
    ...urls.map((url, index) => {
      const figure = el("figure", { class: "thumb" }, el("img", { src: url, alt: `image ${index + 1}` }));
      if (onRemove) {
        const remove = el("button", { type: "button", class: "remove", text: "×", title: "remove this image" });
        remove.setAttribute("aria-label", `remove image ${index + 1}`);
        remove.addEventListener("click", () => onRemove(index));
        figure.append(remove);
      }
      return figure;
    }),
  );
}

// A chat message's content: the text alone, or with images OpenAI's parts (the text first).
export function messageContent(text, urls) {
  if (!urls.length) return text;
  return [
    ...(text ? [{ type: "text", text }] : []),
    ...urls.map((url) => ({ type: "image_url", image_url: { url } })),
  ];
}

// A message content's text and image URLs, whichever shape it has.
export function contentParts(content) {
  if (!Array.isArray(content)) return { text: content ?? "", urls: [] };
  return {
    text: content.filter((p) => p.type === "text").map((p) => p.text).join(""),
    urls: content.filter((p) => p.type === "image_url").map((p) => p.image_url.url),
  };
}

export class Attachments {
  constructor({ button, input, strip, prompt }) {
    this.urls = [];
    this.enabled = false;
    this.button = button;
    this.input = input;
    this.strip = strip;
    button.addEventListener("click", () => input.click());
    input.addEventListener("change", () => {
      this.add([...input.files]);
      input.value = "";
    });
    prompt.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files ?? [])].filter((f) => IMAGE_TYPES.includes(f.type));
      if (!this.enabled || !files.length) return;
      event.preventDefault(); // an image pasted: attached, not written into the text
      this.add(files);
    });
  }

  enable() {
    this.enabled = true;
    this.button.hidden = false;
    document.body.dataset.images = "true";
  }

  async add(files) {
    for (const file of files) {
      if (IMAGE_TYPES.includes(file.type)) this.urls.push(await dataURL(file));
    }
    this.render();
  }

  // The attached images' URLs, handed to the message being sent (the strip empties).
  take() {
    const urls = this.urls;
    this.urls = [];
    this.render();
    return urls;
  }

  // Images of a message the server refused, back in the composer to send again.
  restore(urls) {
    this.urls = [...urls, ...this.urls];
    this.render();
  }

  render() {
    this.strip.replaceChildren(
      ...(this.urls.length ? [thumbnails(this.urls, (index) => { this.urls.splice(index, 1); this.render(); })] : []),
    );
    this.strip.hidden = !this.urls.length;
  }
}
