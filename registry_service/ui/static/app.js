// The registry's page: sign in with a token, list the tenant's adapters and their
// timelines, and show the fleet, kept live by the /ui/api/stream feed. Plain DOM code,
// no framework and nothing loaded from elsewhere. Text from the registry is always set
// with textContent, never parsed as HTML.
"use strict";

const TOKEN_KEY = "loraplane.token";
const state = { token: null, selected: null, view: "adapters", stream: null };

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

function when(iso) {
  return new Date(iso).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path, token = state.token) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${token}` } });
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  if (!response.ok) {
    const error = (body && body.error) || {};
    throw new ApiError(response.status, error.code || "http_error",
                       error.message || `HTTP ${response.status}`);
  }
  return body;
}

// A 401 means the token is gone (revoked, or never valid): back to the sign-in.
function handle(error) {
  if (error instanceof ApiError && error.status === 401) {
    signOut(`Signed out: ${error.message}.`);
  } else {
    $("app-error").textContent = error.message;
  }
}

// ---- sign-in --------------------------------------------------------------------

async function signIn(token, quiet) {
  try {
    const who = await api("/ui/api/session", token);
    sessionStorage.setItem(TOKEN_KEY, token);
    state.token = token;
    $("whoami").textContent = `${who.name} · ${who.role} · ${who.tenant || "all tenants"}`;
    $("signin").hidden = true;
    $("who").hidden = false;
    $("app").hidden = false;
    showView(state.view);
    await loadAdapters();
    connect();
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    showSignIn(quiet ? "" : `${error.message} (${error.code})`);
  }
}

function showSignIn(message) {
  $("app").hidden = true;
  $("who").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message;
  $("token").focus();
}

function signOut(message = "") {
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.token = null;
  state.selected = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $("adapter-list").replaceChildren();
  $("fleet-list").replaceChildren();
  $("timeline").replaceChildren(el("p", { class: "muted", text: "Choose an adapter." }));
  showSignIn(message);
}

// ---- adapters and timelines -----------------------------------------------------

// Two changes close together start two loads; only the latest one may draw, so an
// older answer arriving last never replaces a newer one.
let loads = 0;

async function loadAdapters() {
  const load = ++loads;
  try {
    const page = await api("/v1/adapters?limit=1000");
    if (load !== loads) return;
    renderAdapters(page.adapters);
    if (state.selected) await loadTimeline(state.selected, load);
  } catch (error) { handle(error); }
}

function renderAdapters(adapters) {
  $("no-adapters").hidden = adapters.length > 0;
  $("adapter-list").replaceChildren(...adapters.map((a) => {
    const button = el("button", {
      type: "button", "data-testid": "adapter-item", "data-name": a.name,
      "aria-current": String(a.name === state.selected),
    },
    el("span", { class: "adapter-name", text: a.name }), el("br"),
    el("span", { class: "sub",
                 text: `${a.tenant} · ${a.base_model} · latest v${a.latest_version ?? "–"}` }));
    button.addEventListener("click", () => select(a.name));
    return el("li", {}, button);
  }));
}

async function select(name) {
  state.selected = name;
  for (const button of document.querySelectorAll("#adapter-list button")) {
    button.setAttribute("aria-current", String(button.dataset.name === name));
  }
  await loadTimeline(name);
}

async function loadTimeline(name, load = loads) {
  try {
    const timeline = await api(`/ui/api/adapters/${encodeURIComponent(name)}/timeline`);
    if (state.selected === name && load === loads) renderTimeline(timeline);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      state.selected = null;
      $("timeline").replaceChildren(el("p", { class: "muted", text: `${name} is gone.` }));
    } else { handle(error); }
  }
}

function aliasChips(aliases) {
  return aliases.map((a) => el("span", {
    class: "chip", "data-testid": "alias", "data-alias": a.alias, "data-version": a.version,
    text: `${a.alias} → v${a.version}`,
  }));
}

function renderTimeline(timeline) {
  const a = timeline.adapter;
  const head = el("div", {},
    el("h2", { text: a.name }),
    el("p", { class: "sub", text: `${a.tenant} · base model ${a.base_model}` +
                                  (a.description ? ` · ${a.description}` : "") }),
    el("p", { "data-testid": "current-aliases" }, ...aliasChips(a.aliases)));
  const list = el("ol", { class: "entries" }, ...timeline.entries.map(entryItem));
  const more = timeline.truncated
    ? el("p", { class: "muted", text: "Older entries are not shown." }) : null;
  $("timeline").replaceChildren(head, list, more || "");
}

const ACTIONS = {
  publish: "moved by an upload", promote: "promoted", rollback: "rolled back",
  delete: "removed", adapter_deleted: "removed with the adapter",
};

function entryItem(e) {
  const attrs = { "data-testid": "timeline-entry", "data-kind": e.kind,
                  "data-version": e.version ?? "", "data-alias": e.alias ?? "",
                  "data-action": e.action ?? "" };
  if (e.kind === "version") {
    return el("li", { ...attrs, class: "version" },
      el("span", { class: "when", text: when(e.at) }), " ",
      el("span", { class: "what", text: `v${e.version} uploaded` }), ` by ${e.actor} `,
      el("code", { text: e.digest.slice(0, 12) }), ` ${(e.total_size / 1024).toFixed(1)} KiB`,
      e.notes ? el("div", { class: "notes", text: e.notes }) : null);
  }
  const from = e.from_version ? `v${e.from_version}` : "nothing";
  const to = e.to_version ? `v${e.to_version}` : "nothing";
  return el("li", { ...attrs, class: `move ${e.action}` },
    el("span", { class: "when", text: when(e.at) }), " ",
    el("span", { class: "what", text: `${e.alias}: ${from} → ${to}` }),
    ` ${ACTIONS[e.action] || e.action} by ${e.actor} `,
    el("span", { class: "chip", text: `${e.action} · rev ${e.revision}` }));
}

// ---- fleet ----------------------------------------------------------------------

// ``target``: the alias's version; an agent still serving another one is behind.
function agentChip(entry, target = null) {
  const behind = target !== null && entry.state === "serving" && entry.version !== target;
  const state = behind ? "behind" : entry.state;
  const chip = el("span", {
    class: `chip ${state}${entry.stale ? " stale" : ""}`, "data-testid": "agent",
    "data-agent": entry.agent_id, "data-state": entry.state, "data-version": entry.version,
    text: `${entry.agent_id} v${entry.version} ${state}${entry.stale ? " (stale)" : ""}`,
  });
  if (!entry.reason) return chip;
  const why = entry.code ? `${entry.reason} [${entry.code}]` : entry.reason;
  return el("span", {}, chip, el("span", { class: "reason", text: why }));
}

function aliasRow(alias) {
  const status = alias.converged ? "converged" : "rolling";
  return el("tr", {
    "data-testid": "fleet-alias", "data-alias": alias.alias,
    "data-version": alias.version ?? "", "data-converged": String(alias.converged),
  },
  el("td", {}, el("strong", { text: alias.alias }), ` → v${alias.version ?? "–"}`),
  el("td", {}, el("span", { class: `chip ${status}`, text: status }),
    alias.reason ? el("span", { class: "sub", text: ` ${alias.reason}` }) : null),
  el("td", {}, ...alias.serving.map((entry) => agentChip(entry, alias.version))),
  el("td", {}, ...alias.pending.map((id) => el("span", {
    class: "chip pending", "data-testid": "pending", "data-agent": id, text: id }))),
  el("td", {}, ...alias.failed.map((entry) => agentChip(entry))));
}

function renderFleet(fleet) {
  const cards = fleet.adapters.map((r) => {
    const rows = r.aliases.map(aliasRow);
    const table = rows.length
      ? el("table", {}, el("thead", {}, el("tr", {},
          ...["alias", "state", "serving", "pending", "failed"].map(
            (h) => el("th", { text: h })))), el("tbody", {}, ...rows))
      : el("p", { class: "muted", text: "No aliases." });
    const unaliased = r.unaliased.length
      ? el("p", { class: "sub" }, "Also held: ", ...r.unaliased.map((e) => agentChip(e)))
      : null;
    return el("section", { class: "fleet-adapter", "data-testid": "fleet-adapter",
                           "data-name": r.adapter },
      el("h2", { text: r.adapter }),
      el("p", { class: "sub",
                text: `${r.tenant} · ${r.base_model} · ${r.agents} live agent(s)` }),
      table, unaliased);
  });
  $("fleet-list").replaceChildren(...(cards.length ? cards
    : [el("p", { class: "muted", text: "No adapters this token may read." })]));
}

// ---- live feed: server-sent events read with fetch, so the token goes in a header ----

function setLive(on, text) {
  $("live").className = `live ${on ? "on" : "off"}`;
  $("live").textContent = text;
}

function dispatch(event, data) {
  if (event === "fleet") renderFleet(JSON.parse(data));
  else if (event === "changes") loadAdapters();
  else if (event === "error") {
    const error = JSON.parse(data);
    signOut(`Signed out: ${error.message}.`);
  }
}

async function readStream(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) dispatch(event, data.join("\n"));
    }
  }
}

async function connect() {
  if (state.stream) state.stream.abort();
  const controller = new AbortController();
  state.stream = controller;
  while (state.stream === controller) {
    try {
      const response = await fetch("/ui/api/stream", {
        headers: { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" },
        signal: controller.signal,
      });
      if (response.status === 401) { signOut("Signed out: the token is no longer valid."); return; }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      setLive(true, "live");
      await readStream(response);
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    // The stream ended or failed: say so, wait a moment, and connect again.
    setLive(false, "reconnecting");
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

// ---- views ----------------------------------------------------------------------

function showView(view) {
  state.view = view;
  for (const tab of document.querySelectorAll(".tab")) {
    tab.setAttribute("aria-selected", String(tab.dataset.view === view));
  }
  $("view-adapters").hidden = view !== "adapters";
  $("view-fleet").hidden = view !== "fleet";
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim(), false);
  });
  $("signout").addEventListener("click", () => signOut());
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => showView(tab.dataset.view));
  }
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved, true); else showSignIn("");
});
