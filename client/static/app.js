// The speech page: stream POST /v1/audio/speech, play pcm with Web Audio as it arrives, and
// report time to first audio (click -> first audio bytes) and real-time factor. A model that
// chats gets a chat box instead (POST /v1/chat/completions: text and pcm16 audio as they stream).
"use strict";

const PCM_RATE = 24000;
const $ = (id) => document.getElementById(id);

// Everything a test (or a curious person in the console) needs to read the outcome.
const state = (window.omniSpeech = {
  ready: false, phase: "idle", error: null, ttfaMs: null, serverTtfaMs: null,
  totalMs: null, audioSeconds: 0, rtf: null, bytes: 0, chunks: 0, format: null,
});

let controller = null;
let audioContext = null;

function setPhase(phase) {
  state.phase = phase;
  document.body.dataset.phase = phase;
  $("play").disabled = phase === "streaming" || !state.ready;
  $("stop").disabled = phase !== "streaming";
  setChatPhase(chat.phase);
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

function authHeaders() {
  const key = $("apikey").value.trim();
  localStorage.setItem("omniApiKey", key);
  return key ? { authorization: `Bearer ${key}` } : {};
}

async function getJson(path) {
  const resp = await fetch(path, { headers: authHeaders() });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body?.error?.message || `${resp.status}`);
  return body;
}

function fill(select, values, selected) {
  select.replaceChildren(...values.map(([value, label]) => {
    const option = new Option(label, value);
    option.selected = value === selected;
    return option;
  }));
}

async function loadVoices() {
  // The previous model's voices go at once: a request sent while the new ones load must not carry
  // a voice the new model does not have. An answer for a model no longer selected is dropped.
  const model = $("model").value;
  $("voice").replaceChildren();
  try {
    const body = await getJson(`/v1/audio/voices?model=${encodeURIComponent(model)}`);
    if ($("model").value !== model) return;
    const voices = body.voices.length ? body.voices.map((v) => [v, v]) : [["alloy", "(model default)"]];
    fill($("voice"), voices, body.default);
  } catch (e) {
    setStatus(`voices: ${e.message}`, true);
  }
}

// Models that chat (POST /v1/chat/completions) rather than read text aloud, and those of them
// that answer in text only (their checkpoint does not speak).
const chatModels = new Set();
const textOnlyModels = new Set();

// A chat model shows the chat box instead of the text to read.
function showMode() {
  const chatting = chatModels.has($("model").value);
  state.mode = chatting ? "chat" : "speech";
  $("chat").hidden = !chatting;
  const speaks = !textOnlyModels.has($("model").value), box = $("chat-speak");
  if (speaks !== !box.disabled) box.checked = speaks;   // off for a text-only model, on again after it
  box.disabled = !speaks;
  for (const id of ["text", "speech-buttons", "format-label", "speed-label", "speech-stats"]) $(id).hidden = chatting;
  if (chatting) $("player").hidden = true;   // shown again by the next compressed-format Play
  setChatPhase(chat.phase);
}

async function loadModels() {
  try {
    const body = await getJson("/v1/models");
    const models = body.data.map((m) => [m.id, m.id === m.pipeline ? m.id : `${m.id} → ${m.pipeline}`]);
    chatModels.clear();
    textOnlyModels.clear();
    for (const m of body.data) {
      if (m.chat) chatModels.add(m.id);
      if (m.chat && m.speaks === false) textOnlyModels.add(m.id);
    }
    fill($("model"), models, models.length ? models[0][0] : null);
    showMode();
    await loadVoices();
    state.ready = models.length > 0;
    setStatus(state.ready ? "" : "no model is loaded in Triton", !state.ready);
  } catch (e) {
    state.ready = false;
    setStatus(`models: ${e.message}`, true);
  }
  setPhase(state.phase);
}

function show() {
  const ms = (v) => (v == null ? "–" : `${v.toFixed(0)} ms`);
  $("ttfa").textContent = ms(state.ttfaMs);
  $("server-ttfa").textContent = ms(state.serverTtfaMs);
  $("total").textContent = ms(state.totalMs);
  $("audio").textContent = state.audioSeconds ? `${state.audioSeconds.toFixed(2)} s` : "–";
  $("rtf").textContent = state.rtf == null ? "–" : state.rtf.toFixed(3);
  $("bytes").textContent = state.bytes ? state.bytes.toLocaleString() : "–";
}

// s16le bytes -> float samples; a byte left over from an odd-sized chunk waits for the next.
function pcmDecoder() {
  let carry = null;
  return (bytes) => {
    let data = bytes;
    if (carry) {
      data = new Uint8Array(carry.length + bytes.length);
      data.set(carry);
      data.set(bytes, carry.length);
      carry = null;
    }
    const whole = data.length - (data.length % 2);
    if (whole < data.length) carry = data.slice(whole);
    const view = new DataView(data.buffer, data.byteOffset, whole);
    const out = new Float32Array(whole / 2);
    for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    return out;
  };
}

// Gapless playback: each chunk starts exactly where the previous one ends.
function pcmPlayer(ctx) {
  let next = 0;
  return (samples) => {
    if (!samples.length) return;
    const buffer = ctx.createBuffer(1, samples.length, PCM_RATE);
    buffer.copyToChannel(samples, 0);
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    const when = Math.max(next, ctx.currentTime + 0.03);
    source.start(when);
    next = when + buffer.duration;
  };
}

async function durationOf(blob) {
  try {
    const ctx = new OfflineAudioContext(1, 1, 48000);
    const decoded = await ctx.decodeAudioData(await blob.arrayBuffer());
    return decoded.duration;
  } catch (e) {
    return 0;
  }
}

async function play() {
  stop();
  const format = $("format").value;
  Object.assign(state, { error: null, ttfaMs: null, serverTtfaMs: null, totalMs: null, audioSeconds: 0,
                         rtf: null, bytes: 0, chunks: 0, format });
  show();
  setPhase("streaming");
  setStatus("streaming…");
  $("player").hidden = true;
  controller = new AbortController();
  const t0 = performance.now();
  // Created inside the click: browsers only let a user gesture start audio.
  if (format === "pcm") {
    audioContext = new AudioContext({ sampleRate: PCM_RATE });
    audioContext.resume();
  }
  try {
    const resp = await fetch("/v1/audio/speech", {
      method: "POST",
      signal: controller.signal,
      headers: { "content-type": "application/json", ...authHeaders() },
      body: JSON.stringify({
        model: $("model").value, voice: $("voice").value, input: $("text").value,
        response_format: format, speed: parseFloat($("speed").value) || 1,
      }),
    });
    if (!resp.ok) {
      let message = `${resp.status}`;
      try { message = (await resp.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(`${resp.status}: ${message}`);
    }
    const serverTtfa = parseFloat(resp.headers.get("x-omni-ttfa-ms"));
    state.serverTtfaMs = Number.isFinite(serverTtfa) ? serverTtfa : null;
    const decode = pcmDecoder();
    const schedule = format === "pcm" ? pcmPlayer(audioContext) : null;
    const parts = [];
    const reader = resp.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (!value.length) continue;
      if (state.ttfaMs === null) state.ttfaMs = performance.now() - t0;
      state.bytes += value.length;
      state.chunks += 1;
      if (schedule) {
        const samples = decode(value);
        schedule(samples);
        state.audioSeconds += samples.length / PCM_RATE;
      } else {
        parts.push(value);
      }
      show();
    }
    state.totalMs = performance.now() - t0;
    if (!schedule) {
      const blob = new Blob(parts, { type: resp.headers.get("content-type") || "audio/mpeg" });
      state.audioSeconds = await durationOf(blob);
      const player = $("player");
      player.src = URL.createObjectURL(blob);
      player.hidden = false;
      player.play().catch(() => {});
    }
    state.rtf = state.audioSeconds ? state.totalMs / 1000 / state.audioSeconds : null;
    show();
    setStatus(`done: ${state.audioSeconds.toFixed(2)} s of ${format} audio`);
    setPhase("done");
  } catch (e) {
    if (e.name === "AbortError") {
      setStatus("stopped");
      setPhase("stopped");
    } else {
      state.error = e.message;
      setStatus(e.message, true);
      setPhase("error");
    }
  } finally {
    controller = null;
  }
}

// Stop the download (which cancels the stream in Triton) and silence what is scheduled.
function stop() {
  if (controller) controller.abort();
  if (audioContext) {
    audioContext.close();
    audioContext = null;
  }
}

async function uploadVoice() {
  const file = $("voice-file").files[0];
  const form = new FormData();
  form.append("name", $("voice-name").value.trim());
  form.append("ref_text", $("voice-text").value);
  form.append("consent", $("voice-consent").checked ? "true" : "false");
  if (file) form.append("audio", file, file.name);
  try {
    const resp = await fetch("/v1/audio/voices", { method: "POST", body: form, headers: authHeaders() });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error ? body.error.message : `HTTP ${resp.status}`);
    setStatus(`voice ${body.id} uploaded (${body.duration_s} s)`);
    await loadVoices();
    $("voice").value = body.id;
  } catch (e) {
    setStatus(`upload: ${e.message}`, true);
  }
}

// Live mode: a WebSocket session whose text is what is typed, sent as it is typed.
const live = (state.live = { phase: "idle", messages: [], bytes: 0, errors: [], firstAudioMs: null,
                             firstTextAt: null });
let liveSocket = null;
let liveSent = 0;

function liveStatus(text, isError = false) {
  $("live-status").textContent = text;
  $("live-status").className = isError ? "error" : "";
}

function liveStart() {
  liveStop();
  Object.assign(live, { phase: "open", messages: [], bytes: 0, errors: [], firstAudioMs: null, firstTextAt: null });
  audioContext = new AudioContext({ sampleRate: PCM_RATE });   // inside the click: may start audio
  audioContext.resume();
  const decode = pcmDecoder();
  const schedule = pcmPlayer(audioContext);
  const key = $("apikey").value.trim();
  const url = new URL("/v1/audio/speech/stream", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (key) url.searchParams.set("api_key", key);   // browsers cannot set headers on a WebSocket
  liveSocket = new WebSocket(url);
  liveSocket.binaryType = "arraybuffer";
  liveSocket.onopen = () => {
    liveSocket.send(JSON.stringify({ type: "session.config", model: $("model").value, voice: $("voice").value,
                                     response_format: "pcm", split_granularity: $("live-split").value }));
    $("live-text").disabled = false;
    $("live-done").disabled = false;
    $("live-text").value = "";
    liveSent = 0;
    $("live-text").focus();
    liveStatus("type: audio plays as it is made");
  };
  liveSocket.onmessage = (event) => {
    if (typeof event.data === "string") {
      const message = JSON.parse(event.data);
      live.messages.push(message);
      if (message.type === "error") {
        live.errors.push(message);
        liveStatus(message.message, true);
      } else if (message.type === "session.done") {
        liveStatus(`utterance ${message.utterance_index} done (${message.total_sentences} request(s))`);
        live.phase = "done";
      }
      return;
    }
    const samples = decode(new Uint8Array(event.data));
    if (live.firstAudioMs === null && live.firstTextAt !== null) live.firstAudioMs = performance.now() - live.firstTextAt;
    live.bytes += event.data.byteLength;
    schedule(samples);
  };
  liveSocket.onclose = () => {
    live.phase = live.phase === "done" ? "done" : "closed";
    $("live-text").disabled = true;
    $("live-done").disabled = true;
  };
}

// Only text added at the end is sent (what is spoken cannot be taken back).
function liveInput() {
  const text = $("live-text").value;
  if (!liveSocket || liveSocket.readyState !== WebSocket.OPEN || text.length <= liveSent) return;
  if (live.firstTextAt === null) live.firstTextAt = performance.now();
  liveSocket.send(JSON.stringify({ type: "input.text", text: text.slice(liveSent) }));
  liveSent = text.length;
}

function liveDone() {
  if (liveSocket && liveSocket.readyState === WebSocket.OPEN) {
    liveInput();
    liveSocket.send(JSON.stringify({ type: "input.done" }));
    live.phase = "finishing";
  }
}

function liveStop() {
  if (liveSocket) liveSocket.close();
  liveSocket = null;
}

// Chat: POST /v1/chat/completions streamed (SSE); the answer's text is shown as it is written and
// its pcm16 audio played as it is made; the page keeps the conversation and sends it each turn.
const chat = (state.chat = { phase: "idle", history: [], error: null, answer: "", audioSeconds: 0,
                             audioChunks: 0, firstTextMs: null, firstAudioMs: null, totalMs: null });
let chatController = null;

function setChatPhase(phase) {
  chat.phase = phase;
  $("chat-send").disabled = phase === "streaming" || !state.ready;
  $("chat-stop").disabled = phase !== "streaming";
}

function chatStatus(text, isError = false) {
  $("chat-status").textContent = text;
  $("chat-status").className = isError ? "error" : "";
}

function addTurn(role, text) {
  const div = document.createElement("div");
  div.className = `turn ${role}`;
  div.textContent = text;
  $("chat-log").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// The SSE events of a streamed body, as parsed JSON (null for [DONE]), as they arrive.
async function* sseEvents(body) {
  const reader = body.getReader();
  const text = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buffer += text.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        yield data === "[DONE]" ? null : JSON.parse(data);
      }
    }
  }
}

function base64Bytes(data) {
  const raw = atob(data);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

// Attachments of the next message: a recording from the microphone (encoded here as 16-bit WAV,
// OpenAI's input_audio part) and images (data URLs, image_url parts); sent before the text.
chat.attachments = [];
let recorder = null;

function showAttachments() {
  const box = $("chat-attachments");
  box.replaceChildren(...chat.attachments.map((a) => {
    const chip = document.createElement("span");
    chip.textContent = a.label;
    return chip;
  }));
}

function wavBytes(chunks, rate) {
  const samples = chunks.reduce((n, c) => n + c.length, 0);
  const view = new DataView(new ArrayBuffer(44 + 2 * samples));
  const text = (at, s) => { for (let i = 0; i < s.length; i++) view.setUint8(at + i, s.charCodeAt(i)); };
  text(0, "RIFF"); view.setUint32(4, 36 + 2 * samples, true); text(8, "WAVEfmt ");
  view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, rate, true); view.setUint32(28, 2 * rate, true); view.setUint16(32, 2, true);
  view.setUint16(34, 16, true); text(36, "data"); view.setUint32(40, 2 * samples, true);
  let at = 44;
  for (const chunk of chunks) {
    for (const x of chunk) { view.setInt16(at, Math.max(-1, Math.min(1, x)) * 32767, true); at += 2; }
  }
  return new Uint8Array(view.buffer);
}

function bytesBase64(bytes) {
  let raw = "";
  for (let i = 0; i < bytes.length; i += 0x8000) raw += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(raw);
}

async function chatRecord() {
  if (recorder) {   // second press: stop and attach
    const { context, stream, chunks, started } = recorder;
    recorder = null;
    stream.getTracks().forEach((t) => t.stop());
    await context.close();
    $("chat-record").classList.remove("recording");
    $("chat-record").textContent = "Record";
    const seconds = (performance.now() - started) / 1000;
    chat.attachments.push({ label: `recording ${seconds.toFixed(1)} s`,
                            part: { type: "input_audio", input_audio: { data: bytesBase64(wavBytes(chunks, context.sampleRate)), format: "wav" } } });
    showAttachments();
    return;
  }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const context = new AudioContext();
    const source = context.createMediaStreamSource(stream);
    const tap = context.createScriptProcessor(4096, 1, 1);
    const chunks = [];
    tap.onaudioprocess = (e) => chunks.push(new Float32Array(e.inputBuffer.getChannelData(0)));
    source.connect(tap);
    tap.connect(context.destination);
    recorder = { context, stream, chunks, started: performance.now() };
    $("chat-record").classList.add("recording");
    $("chat-record").textContent = "Stop recording";
  } catch (e) {
    chatStatus(`microphone: ${e.message}`, true);
  }
}

function chatImage(event) {
  const file = event.target.files[0];
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    chat.attachments.push({ label: `image ${file.name}`, part: { type: "image_url", image_url: { url: reader.result } } });
    showAttachments();
    event.target.value = "";
  };
  reader.readAsDataURL(file);
}

async function chatSend() {
  const typed = $("chat-input").value;
  if ((!typed.trim() && !chat.attachments.length) || chat.phase === "streaming" || recorder) return;
  chatStop();
  const parts = chat.attachments.map((a) => a.part);
  const labels = chat.attachments.map((a) => `[${a.label}]`);
  const content = parts.length ? [...parts, ...(typed.trim() ? [{ type: "text", text: typed }] : [])] : typed;
  chat.attachments = [];
  showAttachments();
  const speak = $("chat-speak").checked;
  Object.assign(chat, { error: null, answer: "", audioSeconds: 0, audioChunks: 0, firstTextMs: null,
                        firstAudioMs: null, totalMs: null });
  $("chat-input").value = "";
  addTurn("user", [...labels, typed].filter((s) => s.trim()).join(" "));
  const bubble = addTurn("assistant", "…");
  const messages = [...chat.history, { role: "user", content }];
  setChatPhase("streaming");
  chatStatus("answering…");
  chatController = new AbortController();
  const t0 = performance.now();
  let schedule = null;
  let decode = null;
  if (speak) {   // created inside the click or key press: browsers only let a user gesture start audio
    audioContext = new AudioContext({ sampleRate: PCM_RATE });
    audioContext.resume();
    schedule = pcmPlayer(audioContext);
    decode = pcmDecoder();
  }
  const request = { model: $("model").value, messages, stream: true };
  if (speak) Object.assign(request, { modalities: ["text", "audio"], audio: { voice: $("voice").value, format: "pcm16" } });
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      signal: chatController.signal,
      headers: { "content-type": "application/json", ...authHeaders() },
      body: JSON.stringify(request),
    });
    if (!resp.ok) {
      let message = `${resp.status}`;
      try { message = (await resp.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(`${resp.status}: ${message}`);
    }
    let finished = false;
    for await (const event of sseEvents(resp.body)) {
      if (event === null) { finished = true; break; }
      if (event.error) throw new Error(event.error.message);
      const delta = event.choices && event.choices[0] ? event.choices[0].delta : {};
      const text = delta.content || (delta.audio && delta.audio.transcript) || "";
      if (text) {
        if (chat.firstTextMs === null) chat.firstTextMs = performance.now() - t0;
        chat.answer += text;
        bubble.textContent = chat.answer;
      }
      if (delta.audio && delta.audio.data && schedule) {
        if (chat.firstAudioMs === null) chat.firstAudioMs = performance.now() - t0;
        const samples = decode(base64Bytes(delta.audio.data));
        schedule(samples);
        chat.audioSeconds += samples.length / PCM_RATE;
        chat.audioChunks += 1;
      }
    }
    if (!finished) throw new Error("the answer was cut off");
    chat.totalMs = performance.now() - t0;
    chat.history = [...messages, { role: "assistant", content: chat.answer }];
    const timing = chat.firstAudioMs === null ? "" : `, first audio after ${chat.firstAudioMs.toFixed(0)} ms`;
    chatStatus(`answered in ${chat.totalMs.toFixed(0)} ms: first text after ${chat.firstTextMs === null ? "–" : chat.firstTextMs.toFixed(0)} ms${timing}`
               + (speak ? `, ${chat.audioSeconds.toFixed(2)} s of audio` : ""));
    setChatPhase("done");
  } catch (e) {
    if (e.name === "AbortError") {
      chatStatus("stopped");
      setChatPhase("stopped");
    } else {
      chat.error = e.message;
      bubble.classList.add("error");
      if (!chat.answer) bubble.textContent = e.message;
      chatStatus(e.message, true);
      setChatPhase("error");
    }
  } finally {
    chatController = null;
  }
}

// Stop the answer (the hang-up cancels its stream in Triton) and silence what is scheduled.
function chatStop() {
  if (chatController) chatController.abort();
  if (audioContext) {
    audioContext.close();
    audioContext = null;
  }
}

function chatClear() {
  chatStop();
  chat.history = [];
  chat.attachments = [];
  showAttachments();
  $("chat-log").replaceChildren();
  chatStatus("");
  setChatPhase("idle");
}

$("chat-send").addEventListener("click", chatSend);
$("chat-stop").addEventListener("click", chatStop);
$("chat-clear").addEventListener("click", chatClear);
$("chat-record").addEventListener("click", chatRecord);
$("chat-image").addEventListener("change", chatImage);
$("chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    chatSend();
  }
});
$("model").addEventListener("change", showMode);

$("live-start").addEventListener("click", liveStart);
$("live-done").addEventListener("click", liveDone);
$("live-text").addEventListener("input", liveInput);

$("apikey").value = localStorage.getItem("omniApiKey") || "";
$("voice-upload").addEventListener("click", uploadVoice);
$("model").addEventListener("change", loadVoices);
$("apikey").addEventListener("change", loadModels);
$("play").addEventListener("click", play);
$("stop").addEventListener("click", stop);
setPhase("idle");
loadModels();
