// The adapters view: the list (searched and filtered), and the chosen adapter with its
// timeline of uploads and alias moves (its versions tab is in versions.js).
"use strict";

// Two changes close together start two loads; only the latest one may draw, so an
// older answer arriving last never replaces a newer one.
let loads = 0;

async function loadAdapters() {
  const load = ++loads;
  try {
    const page = await api("/v1/adapters?limit=1000");
    if (load !== loads) return;
    state.adapters = page.adapters;
    renderAdapters();
    if (state.route && state.route.name) await loadTimeline(state.route.name, load);
  } catch (error) { handle(error); }
}

// The state of each alias of the adapter, from the fleet; ["not served"] with none.
function adapterStates(name) {
  const rollout = state.fleet && state.fleet.adapters.find((r) => r.adapter === name);
  if (!rollout) return null;
  const live = rollout.aliases.filter((a) => a.version !== null);
  return live.length ? live.map((a) => ({ alias: a.alias, version: a.version,
                                          state: aliasState(a) }))
    : [{ alias: null, version: null, state: "not served" }];
}

function matches(adapter, query, wanted) {
  const text = `${adapter.name} ${adapter.tenant} ${adapter.base_model} ${adapter.description}`;
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.every((w) => text.toLowerCase().includes(w))) return false;
  if (!wanted) return true;
  const states = adapterStates(adapter.name);
  return states !== null && states.some((s) => s.state === wanted);
}

function stateLine(name) {
  const states = adapterStates(name);
  if (states === null) return null;
  return el("span", { class: "states" }, ...states.map((s) => el("span", {
    class: `chip ${s.state.replace(" ", "-")}`, "data-testid": "adapter-state",
    "data-state": s.state,
    text: s.alias ? `${s.alias} v${s.version} ${s.state}` : "not served (no alias)",
  })));
}

function renderAdapters() {
  const { q, state: wanted, name: selected } = state.route;
  const shown = state.adapters.filter((a) => matches(a, q, wanted));
  $("no-adapters").hidden = state.adapters.length > 0;
  $("adapter-count").textContent = state.adapters.length && shown.length < state.adapters.length
    ? `${shown.length} of ${state.adapters.length} shown` : "";
  $("adapter-list").replaceChildren(...shown.map((a) => {
    const latest = a.latest_version ? `latest v${a.latest_version}` : "no versions yet";
    return el("li", {}, button("", {
      "data-testid": "adapter-item", "data-name": a.name,
      "aria-current": String(a.name === selected),
    }, () => navigate({ name: a.name, tab: "timeline", v: null, base: null }),
    el("span", { class: "adapter-name", text: a.name }), el("br"),
    el("span", { class: "sub", text: `${a.tenant} · ${a.base_model} · ${latest}` }),
    stateLine(a.name), canaryChips(a.name)));
  }));
}

async function loadTimeline(name, load = loads) {
  try {
    const timeline = await api(`/ui/api/adapters/${encodeURIComponent(name)}/timeline`);
    if (state.route.name !== name || load !== loads) return;
    state.timeline = timeline;
    renderDetail();
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      if (state.route.name !== name) return;
      state.timeline = null;
      $("detail").replaceChildren(el("p", { class: "muted", "data-testid": "gone",
                                             text: `${name} is gone, or not yours to see.` }));
    } else { handle(error); }
  }
}

function aliasChips(adapter) {
  if (!adapter.aliases.length) {
    return [el("span", { class: "muted", "data-testid": "no-alias",
                         text: "Not served: no alias points at a version." })];
  }
  return adapter.aliases.map((a) => el("span", { class: "alias" },
    el("span", { class: "chip", "data-testid": "alias", "data-alias": a.alias,
                 "data-version": a.version, text: `${a.alias} → v${a.version}` }),
    rollbackButton(adapter, a)));
}

function renderDetail() {
  const timeline = state.timeline;
  if (!timeline) return;
  const a = timeline.adapter;
  const tab = state.route.tab;
  const head = el("div", {},
    el("h2", { text: a.name }),
    el("p", { class: "sub", text: `${a.tenant} · base model ${a.base_model}` +
                                  (a.description ? ` · ${a.description}` : "") }),
    el("p", { "data-testid": "current-aliases" }, ...aliasChips(a)),
    el("p", { class: `notice${state.notice && state.notice.bad ? " bad" : ""}`,
              "data-testid": "notice", role: "status",
              text: state.notice ? state.notice.text : "" }));
  const tabs = el("nav", { class: "subtabs" }, ...TABS.map((t) => button(
    t === "timeline" ? "Timeline" : "Versions",
    { class: "tab", "data-testid": `subtab-${t}`, "aria-selected": String(t === tab) },
    () => navigate({ tab: t }))));
  const body = tab === "versions" ? versionsPane(timeline) : timelinePane(timeline);
  // Drawn again at every change: a field being typed in keeps the focus.
  const focused = document.activeElement;
  $("detail").replaceChildren(head, canaryPane(), tabs, body);
  if (focused && focused !== document.activeElement && focused.isConnected) focused.focus();
}

function timelinePane(timeline) {
  if (!timeline.entries.length) {
    return el("p", { class: "muted", text: "No versions yet: push one with loraplane push." });
  }
  const list = el("ol", { class: "entries" }, ...timeline.entries.map(entryItem));
  const more = timeline.truncated
    ? el("p", { class: "muted", text: "Older entries are not shown." }) : null;
  return el("div", {}, list, more);
}

const ACTIONS = {
  publish: "moved by an upload", promote: "promoted", rollback: "rolled back",
  delete: "removed", adapter_deleted: "removed with the adapter",
  canary_start: "canary started", canary_step: "canary stepped",
  canary_pause: "canary paused", canary_resume: "canary resumed",
  canary_promote: "promoted by its canary", canary_abort: "canary aborted",
};

function entryItem(e) {
  const attrs = { "data-testid": "timeline-entry", "data-kind": e.kind,
                  "data-version": e.version ?? "", "data-alias": e.alias ?? "",
                  "data-action": e.action ?? "" };
  if (e.kind === "version") {
    return el("li", { ...attrs, class: "version" },
      el("span", { class: "when", text: when(e.at) }), " ",
      el("span", { class: "what", text: `v${e.version} uploaded` }), ` by ${e.actor} `,
      el("code", { text: e.digest.slice(0, 12) }), ` ${size(e.total_size)}`,
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
