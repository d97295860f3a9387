// The page's shared pieces: its state, building DOM nodes, and calling the registry.
// Plain DOM code, no framework and nothing loaded from elsewhere. Text from the registry
// is always set with textContent, never parsed as HTML.
"use strict";

const TOKEN_KEY = "loraplane.token";
const state = {
  token: null,
  session: null, // what /ui/api/session said of the token
  route: null, // what the URL's hash asks for (route.js)
  adapters: [], // /v1/adapters
  fleet: null, // the last "fleet" event, null until it comes
  timeline: null, // the selected adapter's timeline
  notice: null, // { text, bad }: what the last promote or rollback came to
  canaries: null, // the running canaries (canaries.js), null until first read
  canaryNotice: null, // { adapter, text, bad }: what the last canary action came to
  armed: null, // the action waiting for its confirming click (actions.js)
  stream: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

function button(text, attrs, onClick, ...children) {
  const node = el("button", { type: "button", text, ...attrs }, ...children);
  node.addEventListener("click", onClick);
  return node;
}

function when(iso) {
  return new Date(iso).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(1)} ${units[unit]}`;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// GET ``path``, or another method with a JSON ``body``, as the signed-in token.
async function api(path, { token = state.token, method = "GET", body } = {}) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  let answer = null;
  try { answer = await response.json(); } catch { answer = null; }
  if (!response.ok) {
    const error = (answer && answer.error) || {};
    throw new ApiError(response.status, error.code || "http_error",
                       error.message || `HTTP ${response.status}`);
  }
  return answer;
}

// A 401 means the token is gone (revoked, or never valid): back to the sign-in.
function handle(error) {
  if (error instanceof ApiError && error.status === 401) {
    signOut(`Signed out: ${error.message}.`);
  } else {
    $("app-error").textContent = error.message;
  }
}

// Versions never change, so what the page read of one is kept for the session:
// ``readOnce`` answers { value } or { error }, or null while the first read runs, and
// calls ``then`` when that read ends.
const immutable = new Map();

function readOnce(path, then) {
  const hit = immutable.get(path);
  if (hit !== undefined) return hit;
  immutable.set(path, null);
  api(path).then(
    (value) => { immutable.set(path, { value }); then(); },
    (error) => {
      if (error instanceof ApiError && error.status === 401) { handle(error); return; }
      immutable.set(path, { error });
      then();
    });
  return null;
}

// A read that failed (the store down a moment) is tried again at the next navigation.
function forgetFailedReads() {
  for (const [path, read] of immutable) {
    if (read && read.error) immutable.delete(path);
  }
}
