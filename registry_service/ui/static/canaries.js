// Canaries: each running canary of the chosen adapter, live (its steps with the current
// one marked, its weight, state and reason, and every check canary against stable with
// its verdict, for the step so far and the last one judged), and, for a token that may,
// pause, resume, promote and abort with an optional reason.
//
// The buttons call the registry's own canary routes (POST /v1/adapters/{name}/aliases/
// {alias}/canary/{verb}) with the page's bearer token, like any client: the registry
// authorizes every call itself (a publisher of the adapter's tenant, or a global admin).
// A token that may not is offered no button, and a call sent anyway is refused (403).
//
// The canaries come from the live feed's "canaries" events (every look that changes
// them), and are read again (/ui/api/canaries) at sign-in and after every action. The
// panel is drawn in place: a live update redraws a canary's figures, not its reason
// field or its buttons, so typing and clicking are never cut off by a redraw.
"use strict";

// What each verb did, and what a refused one did not.
const CANARY_DONE = { pause: "paused", resume: "resumed", promote: "promoted",
                      abort: "aborted" };

// Newer reads win: an answer arriving after a newer one (or a live event) is dropped.
let canaryLoads = 0;

async function loadCanaries() {
  const load = ++canaryLoads;
  try {
    const found = await api("/ui/api/canaries");
    if (load === canaryLoads) showCanaries(found);
  } catch (error) { handle(error); }
}

// From the live feed: newer than any read still on its way.
function canariesEvent(found) {
  canaryLoads += 1;
  showCanaries(found);
}

function canariesOf(name) {
  return (state.canaries || []).filter((c) => c.adapter === name);
}

// What the adapters list shows of the canaries: it is drawn again only when this moves.
function canarySummary() {
  return (state.canaries || []).map((c) => `${c.id}:${c.state}:${c.weight}`).join(",");
}

function showCanaries(found) {
  const before = canarySummary();
  state.canaries = found.canaries;
  renderCanaries();
  if (canarySummary() !== before && state.route && state.route.view === "adapters") {
    renderAdapters();
  }
}

// ---- the adapters list: a chip per running canary ------------------------------

function canaryChips(name) {
  const running = canariesOf(name);
  if (!running.length) return null;
  return el("span", { class: "states" }, ...running.map((c) => el("span", {
    class: `chip canary-chip ${c.state}`, "data-testid": "adapter-canary",
    "data-alias": c.alias, "data-state": c.state,
    text: `${c.alias} canary v${c.canary_version} at ${c.weight}% ${c.state}`,
  })));
}

// ---- the panel in the adapter's detail -----------------------------------------

const canaryPanel = el("section", { class: "canaries", "data-testid": "canaries" });
const canaryNoticeLine = el("p", { class: "notice", "data-testid": "canary-notice",
                                   role: "status" });
const noCanaryLine = el("p", { class: "muted", "data-testid": "no-canary" });
const canaryList = el("div", {});
canaryPanel.append(el("h3", { text: "Canaries" }), canaryNoticeLine, noCanaryLine,
                   canaryList);
// By canary id: { node, body, controls, controlsKey, reason }.
const canaryCards = new Map();

function forgetCanaries() {
  canaryCards.clear();
  canaryList.replaceChildren();
  state.canaries = null;
  state.canaryNotice = null;
}

// The panel as the detail shows it (renderDetail puts this same node in each time).
function canaryPane() {
  renderCanaries();
  return canaryPanel;
}

function renderCanaries() {
  const name = state.timeline ? state.timeline.adapter.name : null;
  const running = name ? canariesOf(name) : [];
  const notice = state.canaryNotice && state.canaryNotice.adapter === name
    ? state.canaryNotice : null;
  for (const id of [...canaryCards.keys()]) {
    if (!running.some((c) => c.id === id)) canaryCards.delete(id);
  }
  const cards = running.map(canaryCard);
  // Moved only when the set changes: moving a node would take the focus from its field.
  const shown = [...canaryList.children];
  if (shown.length !== cards.length || shown.some((node, i) => node !== cards[i])) {
    canaryList.replaceChildren(...cards);
  }
  canaryNoticeLine.textContent = notice ? notice.text : "";
  canaryNoticeLine.className = `notice${notice && notice.bad ? " bad" : ""}`;
  noCanaryLine.hidden = running.length > 0;
  noCanaryLine.textContent = name ? `No canary runs on ${name}'s aliases.` : "";
  canaryPanel.hidden = !running.length && !notice;
}

function canaryCard(c) {
  let card = canaryCards.get(c.id);
  if (!card) {
    const reason = el("input", { type: "text", maxlength: 500, class: "reason-field",
                                 placeholder: "reason (optional)",
                                 "data-testid": "canary-reason-input",
                                 "aria-label": `Reason, for the record (canary ${c.id})` });
    card = { node: el("section", { class: "canary", "data-testid": "canary" }),
             body: el("div", {}), controls: el("p", { class: "actions canary-actions" }),
             controlsKey: null, reason };
    card.node.append(card.body, card.controls);
    canaryCards.set(c.id, card);
  }
  Object.assign(card.node.dataset, { id: c.id, alias: c.alias, state: c.state,
                                     weight: c.weight, step: c.step });
  card.body.replaceChildren(...canaryFigures(c));
  const key = `${c.state} ${c.updated_at} ${mayMoveAliases()}`;
  if (card.controlsKey !== key) {
    card.controlsKey = key;
    card.controls.replaceChildren(...canaryControls(c, card));
  }
  return card.node;
}

function canaryFigures(c) {
  const head = el("h4", {},
    `${c.alias}: canary v${c.canary_version} against stable v${c.stable_version} `,
    el("span", { class: `chip canary-state ${c.state}`, "data-testid": "canary-state",
                 text: c.state }));
  const steps = el("p", { class: "steps", "data-testid": "canary-steps" });
  const marks = [];
  if (c.step === 0) marks.push(["gates", true]);
  c.steps.forEach((weight, i) => marks.push([`${weight}%`, i + 1 === c.step]));
  marks.forEach(([text, current], i) => {
    if (i) steps.append(" → ");
    steps.append(el("span", { class: `step${current ? " current" : ""}`,
                              "data-testid": "canary-step", "data-current": String(current),
                              "aria-current": current ? "step" : null, text }));
  });
  const where = c.step === 0 ? "before its first step: its gates run, no traffic yet"
    : `step ${c.step} of ${c.steps.length}, each watched ${c.step_seconds} s`;
  const weight = el("p", { "data-testid": "canary-weight",
    text: `v${c.canary_version} takes ${c.weight}% of ${c.alias}'s traffic, ` +
          `v${c.stable_version} the other ${100 - c.weight}%.` });
  return [
    head, steps, weight,
    el("p", { class: "sub", text: `${where} · on failure: ${c.on_failure} · started ` +
                                  `${when(c.started_at)} by ${c.actor}` }),
    el("p", { class: "why", "data-testid": "canary-reason", text: c.reason || "" }),
    checksTable("This step so far", "live", c, c.live_checks || []),
    checksTable("Last judged step", "judged", c, c.checks),
  ];
}

function metricValue(metric, value, ratio = false) {
  if (value === null || value === undefined) return "–";
  if (ratio) return `× ${value}`;
  if (metric.startsWith("error_rate")) return `${(value * 100).toFixed(2)}%`;
  if (metric.endsWith("_p95")) return `${Math.round(value * 1000)} ms`;
  return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(4)));
}

function checksTable(title, kind, c, checks) {
  const caption = el("h5", { text: title });
  if (!checks.length) {
    return el("div", { class: "checks-box", "data-testid": "canary-checks",
                     "data-kind": kind }, caption,
      el("p", { class: "muted", text: kind === "judged" ? "No step judged yet."
                                                         : "Nothing measured yet." }));
  }
  const rows = checks.map((k) => {
    // A p95's limit is a ratio of stable's until stable has a value.
    const ratio = k.metric.endsWith("_p95") && k.stable === null;
    const limit = `${k.metric === "requests" ? "≥" : "≤"} ` +
                  metricValue(k.metric, k.threshold, ratio);
    return el("tr", { "data-testid": "canary-check", "data-metric": k.metric,
                      "data-verdict": k.verdict },
      el("td", {}, el("code", { text: k.metric }),
         k.detail ? el("span", { class: "sub detail", text: ` ${k.detail}` }) : null),
      el("td", { "data-testid": "check-stable", text: metricValue(k.metric, k.stable) }),
      el("td", { "data-testid": "check-canary", text: metricValue(k.metric, k.canary) }),
      el("td", { "data-testid": "check-limit", text: limit }),
      el("td", { class: "sub", text: `${k.stable_requests} / ${k.canary_requests}` }),
      el("td", {}, el("span", { class: `chip verdict ${k.verdict}`,
                                "data-testid": "verdict", text: k.verdict })));
  });
  return el("div", { class: "checks-box", "data-testid": "canary-checks",
                     "data-kind": kind }, caption,
    el("table", { class: "checks" },
      el("thead", {}, el("tr", {}, ...["check", `stable v${c.stable_version}`,
        `canary v${c.canary_version}`, "limit", "requests (stable / canary)", "verdict"]
        .map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows)));
}

// ---- actions ---------------------------------------------------------------------

function canaryControls(c, card) {
  if (!mayMoveAliases()) return [];
  const attrs = (verb) => ({ "data-testid": `canary-${verb}`, "data-alias": c.alias });
  const act = (verb) => () => canaryAction(c, verb, card);
  const moves = [];
  if (c.state === "progressing") moves.push(button("pause", attrs("pause"), act("pause")));
  if (c.state === "paused") moves.push(button("resume", attrs("resume"), act("resume")));
  // Promote and abort end the canary: a first click arms them, a second one acts.
  const armedFor = `${c.id} ${c.updated_at}`;
  moves.push(
    actionButton(`canary promote ${armedFor}`, "promote",
                 `confirm: all of ${c.alias} to v${c.canary_version}`, attrs("promote"),
                 act("promote")),
    actionButton(`canary abort ${armedFor}`, "abort",
                 `confirm: abort, ${c.alias} stays on v${c.stable_version}`, attrs("abort"),
                 act("abort")));
  return [card.reason, ...moves];
}

function doneText(c) {
  const said = c.reason ? ` (${c.reason})` : "";
  if (c.state === "promoted") {
    return `Canary ${c.id} promoted: ${c.alias} now points at v${c.canary_version}${said}.`;
  }
  if (c.state === "aborted") {
    return `Canary ${c.id} aborted: ${c.alias} stays on v${c.stable_version}${said}.`;
  }
  return `Canary ${c.id} on ${c.alias} ${c.state} at ${c.weight}%${said}.`;
}

async function canaryAction(c, verb, card) {
  const reason = card.reason.value.trim();
  const path = `${aliasPath(c.adapter, c.alias)}/canary/${verb}`;
  try {
    const after = await api(path, { method: "POST", body: reason ? { reason } : {} });
    card.reason.value = "";
    state.canaryNotice = { adapter: c.adapter, bad: false, text: doneText(after) };
  } catch (error) {
    if (!(error instanceof ApiError) || error.status === 401) { handle(error); return; }
    const again = error.status === 409 || error.status === 404
      ? " The page has read the canaries again: check and retry." : "";
    state.canaryNotice = { adapter: c.adapter, bad: true,
      text: `Not ${CANARY_DONE[verb]}: ${error.message} (${error.code}).${again}` };
  }
  card.controlsKey = null; // its buttons drawn again, enabled, even if nothing changed
  renderCanaries();
  // Every action is a revision of the alias (its timeline); a promotion moves it.
  await Promise.all([loadCanaries(), loadAdapters()]);
}
