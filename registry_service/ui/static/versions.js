// The versions tab: the adapter's versions, one version's details (rank, alpha, target
// modules, files and sizes, config, uploader, notes) and a diff against another.
"use strict";

function versionPath(name, version) {
  return `/ui/api/adapters/${encodeURIComponent(name)}/versions/${version}`;
}

function versionsPane(timeline) {
  const name = timeline.adapter.name;
  const versions = timeline.entries.filter((e) => e.kind === "version");
  if (!versions.length) {
    return el("p", { class: "muted", text: "No versions yet: push one with loraplane push." });
  }
  const chosen = state.route.v;
  const list = el("ul", { class: "version-list" }, ...versions.map((e) => {
    const aliases = timeline.adapter.aliases.filter((a) => a.version === e.version)
      .map((a) => a.alias).join(", ");
    return el("li", {}, button("", { "data-testid": "version-item",
                                     "data-version": e.version,
                                     "aria-current": String(e.version === chosen) },
      () => navigate({ v: e.version, base: null }),
      el("span", { class: "what", text: `v${e.version} ` }),
      aliases ? el("span", { class: "chip converged", text: aliases }) : null, el("br"),
      el("span", { class: "sub", text: `${when(e.at)} · ${e.actor}` })));
  }));
  const pane = chosen ? versionDetails(name, chosen, versions)
    : el("p", { class: "muted", text: "Choose a version to see its details." });
  return el("div", { class: "versions" }, list, pane);
}

function readOrWait(path) {
  const read = readOnce(path, () => { if (state.route.tab === "versions") renderDetail(); });
  if (read === null) return { node: el("p", { class: "muted", text: "Loading…" }) };
  if (read.error) return { node: el("p", { class: "error", text: read.error.message }) };
  return { value: read.value };
}

function facts(rows) {
  return el("dl", { class: "facts" }, ...rows.flatMap(([term, value, id]) => [
    el("dt", { text: term }), el("dd", { "data-testid": id, text: String(value) })]));
}

function versionDetails(name, number, versions) {
  const read = readOrWait(versionPath(name, number));
  if (!read.value) return el("section", { class: "version-details" }, read.node);
  const v = read.value;
  const rows = [
    ["rank", v.rank, "v-rank"], ["alpha", v.alpha, "v-alpha"],
    ["target modules", v.target_modules.join(", "), "v-targets"],
    ["base model", v.base_model, "v-base-model"], ["uploaded by", v.uploader, "v-uploader"],
    ["uploaded at", when(v.created_at), "v-at"], ["total size", size(v.total_size), "v-size"],
    ["digest", v.digest, "v-digest"], ["notes", v.notes || "–", "v-notes"],
  ];
  const files = el("table", { class: "files" },
    el("thead", {}, el("tr", {}, el("th", { text: "file" }), el("th", { text: "size" }))),
    el("tbody", {}, ...v.files.map((f) => el("tr", { "data-testid": "v-file",
                                                      "data-name": f.name },
      el("td", {}, el("code", { text: f.name })), el("td", { text: size(f.size) })))));
  const config = v.config === null
    ? el("p", { class: "muted", text: "adapter_config.json could not be read just now." })
    : el("pre", { class: "config", "data-testid": "v-config",
                  text: JSON.stringify(v.config, null, 2) });
  return el("section", { class: "version-details", "data-testid": "version-details",
                         "data-version": number },
    el("h3", { text: `v${number}` }), promoteButtons(state.timeline.adapter, number),
    facts(rows), el("h4", { text: "Files" }), files,
    el("details", {}, el("summary", { text: "adapter_config.json" }), config),
    compareWith(name, number, versions));
}

function compareWith(name, number, versions) {
  const select = el("select", { id: "compare", "data-testid": "compare" },
    el("option", { value: "", text: "compare with…" }),
    ...versions.filter((e) => e.version !== number).map((e) => el("option", {
      value: e.version, text: `v${e.version}` })));
  select.value = state.route.base ? String(state.route.base) : "";
  select.addEventListener("change", () => navigate({ base: positive(select.value) }));
  const diff = state.route.base ? versionDiff(name, state.route.base, number) : null;
  return el("div", { class: "compare" }, el("h4", { text: "Diff" }), select, diff);
}

function versionDiff(name, base, head) {
  const read = readOrWait(`/ui/api/adapters/${encodeURIComponent(name)}/diff` +
                          `?base=${base}&head=${head}`);
  if (!read.value) return read.node;
  const d = read.value;
  const show = (value) => (value === undefined || value === null ? "–" : JSON.stringify(value));
  const config = d.config === null
    ? el("p", { class: "muted", text: "A config could not be read just now." })
    : d.config.length === 0 ? el("p", { class: "muted", text: "Same config." })
      : el("ul", { class: "diff" }, ...d.config.map((c) => el("li", {
        class: c.change, "data-testid": "diff-config", "data-key": c.key,
        "data-change": c.change,
        text: c.change === "added" ? `+ ${c.key}: ${show(c.after)}`
          : c.change === "removed" ? `− ${c.key}: ${show(c.before)}`
            : `~ ${c.key}: ${show(c.before)} → ${show(c.after)}`,
      })));
  const files = el("ul", { class: "diff" }, ...d.files.map((f) => el("li", {
    class: f.change, "data-testid": "diff-file", "data-name": f.name, "data-change": f.change,
    text: `${f.name}: ${f.change} (${size(f.before_size)} → ${size(f.after_size)})`,
  })));
  return el("div", { "data-testid": "diff", "data-base": base, "data-head": head },
    el("p", { class: "sub", text: `v${base} → v${head}: ${size(d.base_size)} → ` +
                                  `${size(d.head_size)}` }),
    el("h4", { text: "adapter_config.json" }), config, el("h4", { text: "Files" }), files);
}
