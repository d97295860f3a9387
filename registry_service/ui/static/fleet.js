// The fleet view: for each alias, the agents serving it, those behind or pending, and
// those that failed and why.
"use strict";

// An alias's state in a word. "no agents" is not a rollout under way: no fresh agent
// of the base model is there to serve it, so nothing is moving (neutral, not amber).
function aliasState(alias) {
  if (alias.converged) return "converged";
  if (alias.reason === "no agents") return "no agents";
  const failing = alias.failed.some((e) => !e.stale && e.version === alias.version);
  return failing ? "failing" : "rolling";
}

// ``target``: the alias's version; an agent still serving another one is behind.
function agentChip(entry, target = null) {
  const behind = target !== null && entry.state === "serving" && entry.version !== target;
  const shown = behind ? "behind" : entry.state;
  const chip = el("span", {
    class: `chip ${shown}${entry.stale ? " stale" : ""}`, "data-testid": "agent",
    "data-agent": entry.agent_id, "data-state": entry.state, "data-version": entry.version,
    text: `${entry.agent_id} v${entry.version} ${shown}${entry.stale ? " (stale)" : ""}`,
  });
  if (!entry.reason) return chip;
  const why = entry.code ? `${entry.reason} [${entry.code}]` : entry.reason;
  return el("span", {}, chip, el("span", { class: "reason", text: why }));
}

function cell(label, ...children) {
  return el("td", { "data-label": label }, ...children);
}

function aliasRow(alias) {
  const status = aliasState(alias);
  const why = alias.reason && alias.reason !== "no agents" ? ` ${alias.reason}` : null;
  return el("tr", {
    "data-testid": "fleet-alias", "data-alias": alias.alias, "data-state": status,
    "data-version": alias.version ?? "", "data-converged": String(alias.converged),
  },
  cell("alias", el("strong", { text: alias.alias }),
    alias.version === null ? " removed" : ` → v${alias.version}`),
  cell("state", el("span", { class: `chip ${status.replace(" ", "-")}`,
                             "data-testid": "alias-state", text: status }),
    why ? el("span", { class: "sub", text: why }) : null),
  cell("serving", ...alias.serving.map((entry) => agentChip(entry, alias.version))),
  cell("pending", ...alias.pending.map((id) => el("span", {
    class: "chip pending", "data-testid": "pending", "data-agent": id, text: id }))),
  cell("failed", ...alias.failed.map((entry) => agentChip(entry))));
}

function fleetCard(r) {
  const rows = r.aliases.map(aliasRow);
  const table = rows.length
    ? el("table", {}, el("thead", {}, el("tr", {},
        ...["alias", "state", "serving", "pending", "failed"].map(
          (h) => el("th", { text: h })))), el("tbody", {}, ...rows))
    : el("p", { class: "muted", "data-testid": "no-alias",
                text: "Not served: no alias points at a version." });
  const unaliased = r.unaliased.length
    ? el("p", { class: "sub" }, "Also held: ", ...r.unaliased.map((e) => agentChip(e)))
    : null;
  const agents = r.agents === 1 ? "1 live agent" : `${r.agents || "no"} live agents`;
  return el("section", { class: "fleet-adapter", "data-testid": "fleet-adapter",
                         "data-name": r.adapter },
    el("h2", { text: r.adapter }),
    el("p", { class: "sub", text: `${r.tenant} · ${r.base_model} · ${agents}` }),
    table, unaliased);
}

function renderFleet(fleet) {
  state.fleet = fleet;
  const cards = fleet.adapters.map(fleetCard);
  $("fleet-list").replaceChildren(...(cards.length ? cards
    : [el("p", { class: "muted", text: "No adapters this token may read." })]));
  if (state.route && state.route.view === "adapters") renderAdapters();
}
