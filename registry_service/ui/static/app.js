// The registry's page: sign in with a token, then the adapters (adapters.js,
// versions.js, actions.js), their running canaries (canaries.js) and the fleet
// (fleet.js), kept live by the /ui/api/stream feed, with what is shown kept in the URL (route.js). Loaded last: it starts the page.
"use strict";

// ---- sign-in --------------------------------------------------------------------

async function signIn(token, quiet) {
  try {
    const who = await api("/ui/api/session", { token });
    sessionStorage.setItem(TOKEN_KEY, token);
    state.token = token;
    state.session = who;
    $("whoami").textContent = `${who.name} · ${who.role} · ${who.tenant || "all tenants"}`;
    $("signin").hidden = true;
    $("who").hidden = false;
    $("app").hidden = false;
    applyRoute();
    await loadAdapters();
    loadCanaries();
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
  Object.assign(state, { stream: null, token: null, session: null, adapters: [],
                         fleet: null, timeline: null, notice: null });
  immutable.clear();
  forgetCanaries();
  sessionStorage.removeItem(TOKEN_KEY);
  $("adapter-list").replaceChildren();
  $("fleet-list").replaceChildren();
  $("detail").replaceChildren();
  showSignIn(message);
}

// ---- live feed: server-sent events read with fetch, so the token goes in a header ----

function setLive(on, text) {
  $("live").className = `live ${on ? "on" : "off"}`;
  $("live").textContent = text;
}

function dispatch(event, data) {
  if (event === "fleet") renderFleet(JSON.parse(data));
  else if (event === "changes") loadAdapters();
  else if (event === "canaries") canariesEvent(JSON.parse(data));
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
  for (const tab of document.querySelectorAll("#views .tab")) {
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
  $("tab-adapters").addEventListener("click", () => { location.hash = lastAdaptersHash; });
  $("tab-fleet").addEventListener("click", () => navigate({ view: "fleet" }));
  $("search").addEventListener("input", () => navigate({ q: $("search").value },
                                                       { replace: true }));
  $("state-filter").addEventListener("change", () => navigate({
    state: $("state-filter").value }));
  state.route = parseRoute(location.hash);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved, true); else showSignIn("");
});
