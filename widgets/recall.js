import { h, human } from "./common.js";

// %recall A-B: the original events, verbatim, collapsible, long outputs folded, with a copy button.
function render({ model, el }) {
  const root = h("div", { class: "mfs-panel mfs-recall" });
  el.appendChild(root);
  function draw() {
    const d = model.get("data") || { events: [] };
    root.replaceChildren(
      h("div", { class: "mfs-muted", text: `${d.events.length} event(s), verbatim from the log` }),
      ...d.events.map((e) => {
        const head = `#${e.uid} · ${e.role}${e.origin && e.origin !== e.role ? " · " + e.origin : ""}${e.name ? " · " + e.name : ""} · turn ${e.turn} · ${e.created_at}`;
        const calls = e.tool_calls.map((c) => h("div", { class: "mfs-muted", text: `→ ${c.name}(${c.arguments})` }));
        return h("details", { class: "mfs-layer mfs-event", open: e.folded ? null : "open", "data-uid": e.uid },
          h("summary", {}, head, h("span", { class: "mfs-muted", text: ` (${human(e.chars)} chars)` }),
            h("button", { class: "mfs-button", text: "copy", onclick: (ev) => { ev.preventDefault(); navigator.clipboard && navigator.clipboard.writeText(e.content); } })),
          h("pre", { class: "mfs-pre", text: e.content }), ...calls);
      }));
  }
  model.on("change:data", draw);
  draw();
}
export default { render };
