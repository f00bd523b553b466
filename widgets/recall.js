import { h, human } from "./common.js";

// %recall A-B: the original events, verbatim, collapsible, long outputs folded, with a copy button.
// %recall "text": search hits; the search box asks the kernel again, a hit opens its event.
function render({ model, el }) {
  const root = h("div", { class: "mfs-panel mfs-recall" });
  el.appendChild(root);
  let found = null;
  const opened = {};

  model.on("msg:custom", (msg) => {
    if (msg && msg.type === "search_result") { found = msg; draw(); }
    if (msg && msg.type === "recall_result") { opened[msg.uid] = msg; draw(); }
  });

  function eventView(e) {
    const head = `#${e.uid} · ${e.role}${e.origin && e.origin !== e.role ? " · " + e.origin : ""}${e.name ? " · " + e.name : ""} · turn ${e.turn} · ${e.created_at}`;
    const calls = e.tool_calls.map((c) => h("div", { class: "mfs-muted", text: `→ ${c.name}(${c.arguments})` }));
    return h("details", { class: "mfs-layer mfs-event", open: e.folded ? null : "open", "data-uid": e.uid },
      h("summary", {}, head, h("span", { class: "mfs-muted", text: ` (${human(e.chars)} chars)` }),
        h("button", { class: "mfs-button", text: "copy", onclick: (ev) => { ev.preventDefault(); navigator.clipboard && navigator.clipboard.writeText(e.content); } })),
      h("pre", { class: "mfs-pre", text: e.content }), ...calls);
  }

  function hitsView(d) {
    if (d.error) return [h("div", { class: "mfs-gap", text: d.error })];
    const notes = (d.notices || []).map((n) => h("div", { class: "mfs-muted", text: n }));
    if (!d.hits.length) return [...notes, h("div", { class: "mfs-muted", text: "no matches" })];
    return [...notes, ...d.hits.map((hit) => {
      const got = opened[hit.uid];
      return h("div", { class: "mfs-hit", "data-uid": hit.uid },
        h("button", { class: "mfs-button", text: `#${hit.uid}`, onclick: () => model.send({ type: "recall", uid: hit.uid }) }),
        h("span", { text: ` ${hit.role} · turn ${hit.turn} · ${hit.score.toFixed(3)} ` }),
        h("span", { class: "mfs-muted", text: hit.snippet }),
        got ? (got.error ? h("div", { class: "mfs-gap", text: got.error }) : h("div", {}, ...got.events.map(eventView))) : "");
    })];
  }

  function draw() {
    const d = model.get("data") || { events: [] };
    const box = h("input", { class: "mfs-search", type: "search", placeholder: "search this session…", value: (found && found.query) || d.query || "" });
    const go = () => { if (box.value.trim()) model.send({ type: "search", query: box.value }); };
    box.addEventListener("keydown", (ev) => { if (ev.key === "Enter") go(); });
    const bar = h("div", { class: "mfs-tabs" }, box, h("button", { class: "mfs-button", text: "search", onclick: go }));
    const shown = found || (d.hits ? d : null);
    root.replaceChildren(bar, ...(shown ? hitsView(shown) : [
      h("div", { class: "mfs-muted", text: `${d.events.length} event(s), verbatim from the log` }),
      ...d.events.map(eventView)]));
  }
  model.on("change:data", draw);
  draw();
}
export default { render };
