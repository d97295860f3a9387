// Promote and roll back, offered only to a token that may use them (the registry checks
// every call either way). Each sends the alias's revision as the page last read it, so
// if the alias moved since, the registry answers 409: the page says so and reads again.
"use strict";

function mayMoveAliases() {
  return Boolean(state.session && state.session.can_move_aliases);
}

function aliasPath(adapter, alias) {
  return `/v1/adapters/${encodeURIComponent(adapter)}/aliases/${encodeURIComponent(alias)}`;
}

// A first click arms the button and says what will happen, a second one does it: a
// move changes what the fleet serves. What is armed is kept in ``state.armed`` so that
// a redraw (live updates) keeps it; ``key`` names the alias's revision, so a button
// armed for a state that has since changed comes back disarmed.
function actionButton(key, text, confirmText, attrs, act) {
  const armed = state.armed === key;
  const node = button(armed ? confirmText : text,
                      { class: "action", "data-armed": String(armed), ...attrs }, async () => {
    if (state.armed !== key) {
      state.armed = key;
      node.dataset.armed = "true";
      node.textContent = confirmText;
      return;
    }
    state.armed = null;
    node.disabled = true;
    await act();
  });
  return node;
}

function rollbackButton(adapter, alias) {
  if (!mayMoveAliases()) return null;
  return actionButton(`rollback ${alias.alias} ${alias.revision}`,
    "roll back", `confirm: roll back ${alias.alias}`,
    { "data-testid": "rollback", "data-alias": alias.alias },
    () => moveAlias(alias.alias, "POST", `${aliasPath(adapter.name, alias.alias)}/rollback`,
                    { expected_revision: alias.revision }));
}

function promoteButtons(adapter, number) {
  if (!mayMoveAliases()) return null;
  const others = adapter.aliases.filter((a) => a.version !== number);
  if (!others.length) return null;
  return el("p", { class: "actions" }, ...others.map((a) => actionButton(
    `promote ${a.alias} ${a.revision} ${number}`, `promote ${a.alias} to v${number}`, `confirm: ${a.alias} v${a.version} → v${number}`,
    { "data-testid": "promote", "data-alias": a.alias },
    () => moveAlias(a.alias, "PUT", aliasPath(adapter.name, a.alias),
                    { version: number, expected_revision: a.revision }))));
}

async function moveAlias(alias, method, path, body) {
  try {
    const moved = await api(path, { method, body });
    state.notice = { text: `${alias} now points at v${moved.version} ` +
                           `(revision ${moved.revision}).`, bad: false };
  } catch (error) {
    if (!(error instanceof ApiError) || error.status === 401) { handle(error); return; }
    state.notice = { bad: true, text: error.status === 409
      ? `Not moved: ${error.message}. The page has read the adapter again: check and retry.`
      : `Not moved: ${error.message} (${error.code}).` };
  }
  await loadAdapters(); // draws the adapter again, with the notice
}
