// One pane's settings form: the strategy picker, that strategy's knobs and the shared ones,
// rendered from knobs.js; `body()` turns what is on screen into request fields, and
// `showError()` puts a server error next to the field its `param` names.

import { ApiError } from "./api.js";
import { el } from "./dom.js";
import {
  COMMON_GROUPS, FIELDS, OPTIONAL_GROUPS, SAMPLING_FIELDS, STRATEGIES, errorName, paramName, strategyById,
} from "./knobs.js";

// Error params that name another spelling of a field shown here.
const ALIASES = {
  n: "num_return_sequences",
  max_new_tokens: "max_tokens",
  max_completion_tokens: "max_tokens",
};

const LAYER_LIST = /^\[?\s*-?\d+(\s*,\s*-?\d+)*\s*\]?$/;

// A field's text as the request sends it; undefined: not sent.
function convert(def, raw) {
  switch (def.kind) {
    case "bool":
      return Boolean(raw);
    case "number": {
      const text = String(raw).trim();
      if (!text) return undefined;
      const number = Number(text);
      return Number.isFinite(number) ? number : text; // not a number: the server says why
    }
    case "layers": {
      const text = String(raw).trim();
      if (!text) return undefined;
      return LAYER_LIST.test(text) ? text.replace(/[[\]\s]/g, "").split(",").map(Number) : text;
    }
    case "json": {
      const text = String(raw).trim();
      if (!text) return undefined;
      try {
        return JSON.parse(text);
      } catch {
        return text; // not JSON: the server's 400 says why, next to the field
      }
    }
    case "select":
      return raw === "" ? undefined : raw === "true" ? true : raw === "false" ? false : raw;
    default:
      return raw === "" ? undefined : raw;
  }
}

export class SettingsForm {
  // server: { assistants: string[], presets: string[], groups: Set<string> } as the page learnt it
  constructor(root, server, strategy) {
    this.root = root;
    this.server = server;
    this.strategy = strategy;
    this.values = {}; // scope (a strategy id, or "common") -> field key -> raw value
    this.groupOpen = new Map(); // group id -> open, as the user left it: kept when the form is redrawn
    this.render();
  }

  get spec() {
    return strategyById(this.strategy);
  }

  raw(scope, key) {
    const values = this.values[scope] || {};
    return key in values ? values[key] : FIELDS[key].value;
  }

  // [scope, key] of every field on screen, in order.
  visible() {
    const spec = this.spec;
    const fields = spec.fields.map((key) => [spec.id, key]);
    if (spec.sampled) {
      fields.push([spec.id, "do_sample"]);
      if (this.raw(spec.id, "do_sample")) fields.push(...SAMPLING_FIELDS.map((key) => [spec.id, key]));
    }
    fields.push(["common", "max_tokens"]);
    for (const group of this.groups()) fields.push(...group.fields.map((key) => ["common", key]));
    return fields;
  }

  groups() {
    return [...COMMON_GROUPS, ...OPTIONAL_GROUPS.filter((group) => this.server.groups.has(group.id))];
  }

  render() {
    // a group opened or closed since it was drawn keeps that state: its "toggle" event is dispatched
    // later, as a task, so a strategy changed right after a click would otherwise redraw it as before
    for (const shown of this.root.querySelectorAll("details[data-group]")) {
      if (shown.open !== (shown.dataset.drawnOpen === "true")) this.groupOpen.set(shown.dataset.group, shown.open);
    }
    const spec = this.spec;
    const picker = el("select", { class: "strategy", name: "strategy" });
    for (const s of STRATEGIES) picker.append(el("option", { value: s.id, text: s.label, selected: s.id === spec.id }));
    picker.addEventListener("change", () => {
      this.strategy = picker.value;
      this.render();
    });
    const own = this.visible().filter(([scope]) => scope === spec.id);
    const fields = [this.field("common", "max_tokens"), ...own.map(([scope, key]) => this.field(scope, key))];
    const main = el("div", { class: "fields" }, ...fields);
    const groups = this.groups().map((group) => {
      const set = group.fields.some((key) => convert(FIELDS[key], this.raw("common", key)) !== undefined);
      const details = el(
        "details",
        { class: "group", open: this.groupOpen.get(group.id) ?? (set || Boolean(group.open)), "data-group": group.id },
        el("summary", { text: group.title }),
        el("div", { class: "fields" }, ...group.fields.map((key) => this.field("common", key))),
      );
      details.dataset.drawnOpen = String(details.open);
      details.addEventListener("toggle", () => this.groupOpen.set(group.id, details.open));
      return details;
    });
    this.root.replaceChildren(
      el("label", { class: "strategy-row" }, el("span", { text: "Strategy" }), picker),
      main,
      ...groups,
    );
  }

  field(scope, key) {
    const def = FIELDS[key];
    const name = errorName(key);
    const save = (value) => {
      (this.values[scope] ||= {})[key] = value;
    };
    const store = (value) => {
      save(value);
      this.clearError(wrapper);
    };
    let control;
    if (def.kind === "bool") {
      control = el("input", { type: "checkbox", checked: Boolean(this.raw(scope, key)) });
      control.addEventListener("change", () => {
        store(control.checked);
        this.render(); // do_sample shows or hides the sampling knobs
      });
    } else if (def.kind === "json") {
      control = el("textarea", { rows: 4, placeholder: def.placeholder || "", spellcheck: false });
      control.value = this.raw(scope, key);
      control.addEventListener("input", () => store(control.value));
    } else {
      const options = this.options(def);
      if (options) {
        control = el("select");
        for (const [value, label] of options) control.append(el("option", { value, text: label }));
        control.value = this.raw(scope, key);
        if (control.value !== this.raw(scope, key)) save(control.value); // a list's first choice
        control.addEventListener("change", () => store(control.value));
      } else {
        control = el("input", {
          type: "text",
          value: this.raw(scope, key),
          placeholder: key === "assistant_model" ? "none loaded" : def.placeholder || "",
          inputMode: def.kind === "number" ? "decimal" : "text",
          autocomplete: "off",
          spellcheck: false,
        });
        control.addEventListener("input", () => store(control.value));
      }
    }
    control.name = name;
    const wrapper = el(
      "label",
      { class: `field field-${def.kind}`, "data-param": name, title: def.help },
      el("span", { class: "field-name", text: def.nest ? paramName(key) : name }),
      control,
      el("span", { class: "field-error", role: "alert", hidden: true }),
    );
    return wrapper;
  }

  options(def) {
    if (def.kind === "select") return def.options;
    if (def.kind === "assistant" && this.server.assistants.length) return this.server.assistants.map((n) => [n, n]);
    if (def.kind === "preset") return [["", "none"], ...this.server.presets.map((n) => [n, n])];
    return null;
  }

  // The request fields on screen (the strategy's switch included). A required field left blank
  // throws the ApiError the server would have sent, so it lands next to the field the same way.
  body() {
    const spec = this.spec;
    const out = { ...(spec.fixed || {}) };
    if (spec.beam) out.logprobs = true; // beams' sequence_score comes with logprobs
    for (const [scope, key] of this.visible()) {
      const def = FIELDS[key];
      const value = convert(def, this.raw(scope, key));
      if (key === "response_schema") {
        if (value !== undefined) {
          out.response_format = { type: "json_schema", json_schema: { name: "playground", schema: value, strict: true } };
        }
      } else if (key === "watermark") {
        if (value) out.watermarking_config = { ...(out.watermarking_config || {}) };
      } else if (def.nest) {
        if (value !== undefined) (out[def.nest] ||= {})[paramName(key)] = value;
      } else if (value !== undefined) {
        out[paramName(key)] = value;
      }
    }
    // nested knobs count only with their switch on (a WatermarkingConfig needs watermark ticked)
    if (out.watermarking_config && !convert(FIELDS.watermark, this.raw("common", "watermark"))) {
      delete out.watermarking_config;
    }
    if (spec.id === "assistant" && out.assistant_model === undefined) {
      const message = "choose an assistant: this server lists none in /v1/models (decoda serve --assistant-model)";
      throw new ApiError(400, { message, param: "assistant_model" });
    }
    return out;
  }

  // Shows `message` next to the field `param` names; false when no such field is on screen.
  showError(param, message) {
    const name = ALIASES[param] || param;
    if (!name) return false;
    const wrapper = this.root.querySelector(`[data-param="${CSS.escape(name)}"]`);
    if (!wrapper) return false;
    const group = wrapper.closest("details");
    if (group) group.open = true;
    wrapper.classList.add("invalid");
    wrapper.querySelector("input, select, textarea").setAttribute("aria-invalid", "true");
    const error = wrapper.querySelector(".field-error");
    error.textContent = message;
    error.hidden = false;
    return true;
  }

  clearError(wrapper) {
    wrapper.classList.remove("invalid");
    wrapper.querySelector("input, select, textarea").removeAttribute("aria-invalid");
    wrapper.querySelector(".field-error").hidden = true;
  }

  clearErrors() {
    for (const wrapper of this.root.querySelectorAll(".field.invalid")) this.clearError(wrapper);
  }
}
