// Deep links: what the page shows lives in the URL's hash, so a reload, a bookmark or
// back and forward bring the same view back. The forms:
//   #/adapters?q=bot&state=failing                     the list, searched and filtered
//   #/adapters/support-bot?tab=versions&v=3&base=2     an adapter, a version, a diff
//   #/fleet
"use strict";

const TABS = ["timeline", "versions"];

function positive(text) {
  const number = Number(text);
  return Number.isInteger(number) && number > 0 ? number : null;
}

function parseRoute(hash) {
  const text = hash.replace(/^#\/?/, "");
  const cut = text.indexOf("?");
  const path = cut < 0 ? text : text.slice(0, cut);
  const params = new URLSearchParams(cut < 0 ? "" : text.slice(cut + 1));
  const [view, name] = path.split("/");
  let adapter = null;
  try { adapter = name ? decodeURIComponent(name) : null; } catch { adapter = null; }
  return {
    view: view === "fleet" ? "fleet" : "adapters",
    name: view === "fleet" ? null : adapter,
    tab: TABS.includes(params.get("tab")) ? params.get("tab") : "timeline",
    v: positive(params.get("v")),
    base: positive(params.get("base")),
    q: params.get("q") || "",
    state: params.get("state") || "",
  };
}

function formatRoute(route) {
  if (route.view === "fleet") return "#/fleet";
  const params = new URLSearchParams();
  if (route.name) {
    if (route.tab !== "timeline") params.set("tab", route.tab);
    if (route.v) params.set("v", route.v);
    if (route.v && route.base) params.set("base", route.base);
  }
  if (route.q) params.set("q", route.q);
  if (route.state) params.set("state", route.state);
  const path = route.name ? `#/adapters/${encodeURIComponent(route.name)}` : "#/adapters";
  const query = params.toString();
  return query ? `${path}?${query}` : path;
}

// Go to the route ``patch`` makes of the current one: a new history entry, or with
// ``replace`` (typing in the search box) the same one rewritten.
function navigate(patch, { replace = false } = {}) {
  const hash = formatRoute({ ...state.route, ...patch });
  if (hash === location.hash) return;
  if (replace) {
    history.replaceState(null, "", hash);
    applyRoute();
  } else {
    location.hash = hash; // the hashchange event applies it
  }
}

// The adapters view as last left, for its tab button after a look at the fleet.
let lastAdaptersHash = "#/adapters";

function applyRoute() {
  const before = state.route;
  state.route = parseRoute(location.hash);
  if (!state.token) return;
  const route = state.route;
  showView(route.view);
  if (route.view === "fleet") return;
  lastAdaptersHash = formatRoute(route);
  if ($("search").value !== route.q) $("search").value = route.q;
  $("state-filter").value = route.state;
  renderAdapters();
  if (!before || before.name !== route.name) state.notice = state.canaryNotice = null;
  state.armed = null;
  forgetFailedReads();
  if (!route.name) {
    state.timeline = null;
    $("detail").replaceChildren(el("p", { class: "muted",
      text: "Choose an adapter to see its versions and alias moves." }));
  } else if (!before || before.name !== route.name || !state.timeline) {
    state.timeline = null;
    $("detail").replaceChildren(el("p", { class: "muted", text: "Loading…" }));
    loadTimeline(route.name);
  } else {
    renderDetail();
  }
}

window.addEventListener("hashchange", applyRoute);
