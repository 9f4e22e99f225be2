// genq playground: submit a job, follow /v1/jobs/{id}/stream (fetch + SSE parsing, because
// EventSource cannot send an Authorization header), list the caller's recent jobs and batches.
"use strict";

const KEY_STORAGE = "genq.apiKey";
const RECONNECTS = 5;
const $ = (id) => document.getElementById(id);

const state = { jobId: null, controller: null, chat: [], startedAt: 0, firstTokenAt: 0 };

// --- API ------------------------------------------------------------------------------------

class Unauthorized extends Error {}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path, options = {}, retried = false) {
  const headers = { ...authHeaders(), ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    if (retried || !(await askForKey())) throw new Unauthorized("an API key is needed");
    return api(path, options, true);
  }
  return response;
}

async function apiJSON(path, options = {}) {
  const response = await api(path, options);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = body.error || {};
    throw new Error(`${response.status} ${error.type || ""}: ${error.message || response.statusText}`);
  }
  return body;
}

function askForKey() {
  const dialog = $("key-dialog");
  $("key-input").value = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const key = $("key-input").value.trim();
      if (dialog.returnValue === "save" && key) {
        sessionStorage.setItem(KEY_STORAGE, key);
        resolve(true);
      } else {
        resolve(false);
      }
    }, { once: true });
  });
}

// --- SSE over fetch -------------------------------------------------------------------------

// Yields {event, data, id} for each event of a text/event-stream body.
async function* sseEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = parseBlock(block);
      if (event) yield event;
    }
  }
}

function parseBlock(block) {
  const event = { event: "message", data: [], id: null };
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue; // comments are heartbeats
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "data") event.data.push(value);
    else if (field === "event") event.event = value;
    else if (field === "id") event.id = value;
  }
  return event.data.length ? { ...event, data: event.data.join("\n") } : null;
}

// Follows a job's stream to its end, reconnecting with Last-Event-ID when the connection drops.
async function followJob(jobId, signal) {
  let lastId = null;
  for (let attempt = 0; attempt <= RECONNECTS; attempt++) {
    const headers = lastId ? { "Last-Event-ID": lastId } : {};
    try {
      const response = await api(`/v1/jobs/${encodeURIComponent(jobId)}/stream`, { headers, signal });
      if (!response.ok) throw new Error(`stream: ${response.status}`);
      for await (const event of sseEvents(response.body)) {
        if (event.id) lastId = event.id;
        if (handleEvent(event)) return;
      }
    } catch (error) {
      if (signal.aborted || error instanceof Unauthorized) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, 500 * (attempt + 1)));
  }
  throw new Error("the stream kept dropping; the job goes on: see Recent jobs");
}

// Returns true when the event ends the stream.
function handleEvent(event) {
  const data = JSON.parse(event.data);
  if (event.event === "output") {
    appendOutput(data.delta, data.tokens);
    return false;
  }
  if (event.event === "done") {
    showJob(data);
    return true;
  }
  if (event.event === "error") {
    setStatus("error");
    showError(data.error ? data.error.message : "the stream failed");
    return true;
  }
  return false;
}

// --- the answer panel -----------------------------------------------------------------------

function setStatus(status) {
  const pill = $("status");
  pill.textContent = status;
  pill.dataset.status = status;
}

function resetAnswer(job) {
  $("output").textContent = "";
  $("output").setAttribute("aria-busy", "true");
  $("job-id").textContent = job.id;
  for (const id of ["queue-time", "tokens", "tps", "finish"]) $(id).textContent = "—";
  setStatus(job.status);
  state.startedAt = performance.now();
  state.firstTokenAt = 0;
}

function appendOutput(delta, tokens) {
  const now = performance.now();
  if (!state.firstTokenAt) {
    state.firstTokenAt = now;
    setStatus("running");
  }
  const output = $("output");
  const atBottom = output.scrollHeight - output.scrollTop - output.clientHeight < 24;
  output.append(delta);
  if (atBottom) output.scrollTop = output.scrollHeight;
  $("tokens").textContent = String(tokens);
  const seconds = (now - state.firstTokenAt) / 1000;
  if (seconds > 0.2) $("tps").textContent = (tokens / seconds).toFixed(1);
}

function showJob(job) {
  setStatus(job.status);
  $("output").setAttribute("aria-busy", "false");
  $("job-id").textContent = job.id;
  const metrics = job.metrics || {};
  if (metrics.queue_ms != null) $("queue-time").textContent = formatMs(metrics.queue_ms);
  if (job.output) {
    if (!$("output").textContent) $("output").textContent = job.output.text;
    const tokens = job.output.usage.completion_tokens;
    $("tokens").textContent = String(tokens);
    $("finish").textContent = job.output.finish_reason;
    if (metrics.inference_ms) $("tps").textContent = (tokens / (metrics.inference_ms / 1000)).toFixed(1);
  } else if (job.error) {
    $("finish").textContent = job.error.type;
  }
  if (job.cached) $("finish").textContent += " (cached)";
}

function formatMs(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

function showError(message) {
  const box = $("form-error");
  box.textContent = message;
  box.hidden = !message;
}

// --- submitting -----------------------------------------------------------------------------

function mode() {
  return document.querySelector('input[name="mode"]:checked').value;
}

function jobBody() {
  const text = $("prompt").value.trim();
  const body = {
    max_tokens: Number($("max-tokens").value) || 64,
    temperature: Number($("temperature").value),
  };
  if ($("model").value) body.model = $("model").value;
  if (mode() === "prompt") return { ...body, prompt: text };
  const system = $("system").value.trim();
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...state.chat];
  return { ...body, messages: [...messages, { role: "user", content: text }] };
}

async function submit(event) {
  event.preventDefault();
  if (!$("prompt").value.trim()) {
    showError("Type a prompt first.");
    $("prompt").focus();
    return;
  }
  showError("");
  setBusy(true);
  state.controller = new AbortController();
  try {
    const body = jobBody();
    const job = await apiJSON("/v1/jobs", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    state.jobId = job.id;
    resetAnswer(job);
    await followJob(job.id, state.controller.signal);
    if (mode() === "chat" && $("status").dataset.status === "succeeded") recordTurn(body);
  } catch (error) {
    if (!state.controller.signal.aborted) showError(error.message);
  } finally {
    $("output").setAttribute("aria-busy", "false");
    setBusy(false);
    loadJobs();
  }
}

function recordTurn(body) {
  state.chat.push(body.messages[body.messages.length - 1]);
  state.chat.push({ role: "assistant", content: $("output").textContent });
  $("prompt").value = "";
  renderTranscript();
}

function renderTranscript() {
  const list = $("transcript");
  list.replaceChildren(...state.chat.map((message) => {
    const item = document.createElement("li");
    item.dataset.role = message.role;
    item.textContent = message.content;
    return item;
  }));
}

async function cancel() {
  if (!state.jobId) return;
  try {
    showJob(await apiJSON(`/v1/jobs/${encodeURIComponent(state.jobId)}/cancel`, { method: "POST" }));
  } catch (error) {
    showError(error.message);
  }
}

function setBusy(busy) {
  $("submit").disabled = busy;
  $("cancel").disabled = !busy;
}

// --- recent jobs ----------------------------------------------------------------------------

async function loadJobs() {
  try {
    const page = await apiJSON("/v1/jobs?limit=20");
    renderJobs(page.data);
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error.message);
  }
}

function jobSnippet(job) {
  return job.preview || "(empty)";
}

function renderJobs(jobs) {
  $("jobs-empty").hidden = jobs.length > 0;
  $("jobs").replaceChildren(...jobs.map((job) => {
    const button = document.createElement("button");
    button.type = "button";
    button.title = `Show job ${job.id}`;
    const snippet = document.createElement("span");
    snippet.className = "snippet";
    snippet.textContent = jobSnippet(job);
    const pill = document.createElement("span");
    pill.className = "pill";
    pill.dataset.status = job.status;
    pill.textContent = job.status;
    const when = document.createElement("span");
    when.className = "when";
    when.textContent = `${new Date(job.created_at).toLocaleTimeString()} · ${job.model}`;
    button.append(snippet, pill, when);
    button.addEventListener("click", () => openJob(job));
    const item = document.createElement("li");
    item.append(button);
    return item;
  }));
}

// --- batches --------------------------------------------------------------------------------

const BATCH_ENDED = ["completed", "failed", "expired", "cancelled"];
let batchTimer = null;

async function loadBatches() {
  try {
    const page = await apiJSON("/v1/batches?limit=10");
    renderBatches(page.data);
    clearTimeout(batchTimer);
    // While one is running, its progress is re-read every few seconds.
    if (page.data.some((batch) => !BATCH_ENDED.includes(batch.status))) batchTimer = setTimeout(loadBatches, 3000);
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error.message);
  }
}

function renderBatches(batches) {
  $("batches-empty").hidden = batches.length > 0;
  $("batches").replaceChildren(...batches.map((batch) => {
    const counts = batch.request_counts;
    const done = counts.completed + counts.failed;
    const item = document.createElement("li");
    item.className = "batch";
    item.title = batch.id;
    const name = document.createElement("span");
    name.className = "snippet";
    name.textContent = `${batch.endpoint.replace("/v1/", "")} · ${batch.id.slice(6, 14)}`;
    const pill = document.createElement("span");
    pill.className = "pill";
    pill.dataset.status = batch.status;
    pill.textContent = batch.status;
    const bar = document.createElement("progress");
    bar.max = Math.max(counts.total, 1);
    bar.value = done;
    const when = document.createElement("span");
    when.className = "when progress-text";
    when.textContent = `${done} / ${counts.total} (${counts.failed} failed) · ${new Date(batch.created_at * 1000).toLocaleTimeString()}`;
    item.append(name, pill, bar, when);
    return item;
  }));
}

async function openJob(job) {
  if (state.controller) state.controller.abort();
  state.controller = new AbortController();
  state.jobId = job.id;
  resetAnswer(job);
  setBusy(!["succeeded", "failed", "canceled"].includes(job.status));
  try {
    await followJob(job.id, state.controller.signal);
  } catch (error) {
    if (!state.controller.signal.aborted) showError(error.message);
  } finally {
    $("output").setAttribute("aria-busy", "false");
    setBusy(false);
  }
}

// --- start ----------------------------------------------------------------------------------

async function loadModels() {
  try {
    const models = await apiJSON("/v1/models");
    $("model").replaceChildren(...models.data.map((model) => new Option(model.id, model.id)));
    return true;
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error.message);
    return false;
  }
}

function switchMode() {
  const chat = mode() === "chat";
  $("chat-area").hidden = !chat;
  $("clear-chat").hidden = !chat;
  $("prompt-label").textContent = chat ? "Your message" : "Prompt";
}

function start() {
  $("composer").addEventListener("submit", submit);
  $("cancel").addEventListener("click", cancel);
  $("refresh").addEventListener("click", () => { loadJobs(); loadBatches(); });
  $("key-button").addEventListener("click", () => askForKey().then(() => { loadModels(); loadJobs(); loadBatches(); }));
  $("clear-chat").addEventListener("click", () => { state.chat = []; renderTranscript(); });
  $("temperature").addEventListener("input", () => { $("temperature-value").value = $("temperature").value; });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("composer").requestSubmit();
  });
  for (const radio of document.querySelectorAll('input[name="mode"]')) radio.addEventListener("change", switchMode);
  loadModels().then((ok) => { if (ok) { loadJobs(); loadBatches(); } });
}

start();
