// The chat page: /v1/models for the picker, /v1/chat/completions streamed (server-sent events over fetch).
// Model output is only ever set as textContent: nothing it writes becomes markup.
"use strict";

const KEY_STORE = "llamaplug.apiKey";
const $ = (id) => document.getElementById(id);
const history = [];  // the conversation as the API takes it
let running = null;  // the AbortController of the reply being streamed

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(KEY_STORE);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function status(text) { $("status").textContent = text || ""; }

async function apiError(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return `${resp.status}: ${body.error.message}`;
  } catch (_) { /* not the API's error shape */ }
  return `${resp.status} ${resp.statusText}`;
}

async function loadModels() {
  const select = $("model");
  const resp = await fetch("/v1/models", { headers: headers() });
  if (!resp.ok) {
    status(resp.status === 401 ? "This server needs an API key: enter it above." : await apiError(resp));
    return;
  }
  const previous = select.value;
  select.replaceChildren();
  for (const m of (await resp.json()).data) {
    const option = document.createElement("option");
    option.value = m.id;
    option.textContent = m.id;
    option.dataset.multimodal = String((m.capabilities || []).includes("multimodal"));
    select.append(option);
  }
  if (previous) select.value = previous;
  showImageInput();
  status("");
}

function showImageInput() {
  const option = $("model").selectedOptions[0];
  const multimodal = option !== undefined && option.dataset.multimodal === "true";
  $("image-label").hidden = !multimodal;
  if (!multimodal) $("image").value = "";
}

function bubble(role, text, imageUrl) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  const who = document.createElement("div");
  who.className = "role";
  who.textContent = role;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  div.append(who, body);
  if (imageUrl) {
    const img = document.createElement("img");
    img.src = imageUrl;
    img.alt = "attached image";
    div.append(img);
  }
  $("conversation").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = controller !== null;
  $("stop").disabled = controller === null;
}

// Each server-sent event's data payload, parsed; stops at [DONE].
async function* events(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  const file = $("image").files[0];
  if (running || (!text && !file)) return;
  const imageUrl = file ? await readImage(file) : null;
  const content = imageUrl
    ? [{ type: "text", text }, { type: "image_url", image_url: { url: imageUrl } }]
    : text;
  history.push({ role: "user", content });
  bubble("user", text, imageUrl);
  $("prompt").value = "";
  $("image").value = "";
  status("");

  const reply = bubble("assistant", "");
  const out = reply.querySelector(".text");
  reply.dataset.state = "streaming";
  const controller = new AbortController();
  setRunning(controller);
  const body = {
    model: $("model").value || undefined,
    messages: history,
    stream: true,
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value) || undefined,
  };
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await apiError(resp));
    for await (const chunk of events(resp)) {
      if (chunk.error) throw new Error(chunk.error.message);
      const choice = chunk.choices[0];
      if (choice.finish_reason) reply.dataset.finish = choice.finish_reason;
      const delta = choice.delta;
      if (delta.content) {
        out.textContent += delta.content;
        reply.scrollIntoView({ block: "end" });
      }
    }
    reply.dataset.state = "done";
  } catch (err) {
    if (err.name === "AbortError") {
      reply.dataset.state = "stopped";
    } else {
      reply.dataset.state = "error";
      status(String(err.message || err));
    }
  } finally {
    setRunning(null);
  }
  // A stopped reply stays in the conversation as far as it got; a failed one (and its question) does not.
  if (reply.dataset.state === "error") history.pop();
  else history.push({ role: "assistant", content: out.textContent });
}

function init() {
  const key = $("api-key");
  key.value = localStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => {
    if (key.value) localStorage.setItem(KEY_STORE, key.value);
    else localStorage.removeItem(KEY_STORE);
    loadModels();
  });
  $("model").addEventListener("change", showImageInput);
  $("composer").addEventListener("submit", send);
  $("stop").addEventListener("click", () => running && running.abort());
  $("clear").addEventListener("click", () => {
    if (running) running.abort();
    history.length = 0;
    $("conversation").replaceChildren();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  loadModels().catch((err) => status(String(err)));
}

document.addEventListener("DOMContentLoaded", init);
