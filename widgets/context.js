import { h, human, span } from "./common.js";

// %context: the layered send view (stacked bar + expandable layers) and the tool trajectory.
function render({ model, el }) {
  const root = h("div", { class: "mfs-panel mfs-context" });
  el.appendChild(root);
  let tab = "layers";
  const recalled = {};

  model.on("msg:custom", (msg) => {
    if (msg && msg.type === "recall_result") {
      recalled[msg.uid] = msg.error ? { error: msg.error } : { events: msg.events };
      draw();
    }
  });

  function layersTab(d) {
    const total = d.layers.reduce((a, l) => a + l.tokens, 0) || 1;
    const bar = h("div", { class: "mfs-bar", title: "payload by layer" },
      d.layers.map((l) => h("span", {
        class: `mfs-bar-part mfs-kind-${l.kind}`, style: `width:${(100 * l.tokens / total).toFixed(2)}%`,
        title: `${l.label}: ${human(l.tokens)} tokens`,
      })));
    const list = d.layers.map((l, i) => {
      const details = h("details", { class: "mfs-layer", "data-layer": i },
        h("summary", {},
          h("span", { class: `mfs-swatch mfs-kind-${l.kind}` }),
          `${l.label} · ${span(l.uid_from, l.uid_to)} · ${human(l.tokens)} tokens · ${l.messages} msg`,
          l.level !== null && l.level !== undefined ? ` · merged ${l.level}×` : "",
          l.degraded ? h("span", { class: "mfs-badge mfs-degraded", text: "degraded" }) : ""),
        h("pre", { class: "mfs-pre", text: l.text }));
      return details;
    });
    const gaps = d.gaps && d.gaps.length
      ? h("div", { class: "mfs-gap", text: `coverage gap: ${d.gaps.length} uid(s) neither raw nor in a segment: ${d.gaps.slice(0, 20).join(", ")}` })
      : h("div", { class: "mfs-muted", text: `coverage: every uid is raw, in a segment, or in a recorded evicted range` });
    const head = `${human(d.usage.tokens)} of ${human(d.usage.effective)} usable (${d.usage.percent || ""} of the usable window) · ` +
      `${d.usage.tier_label || d.usage.tier} · ${d.usage.source_label || d.usage.source}`;
    return [h("div", { text: head }), bar, gaps, ...list];
  }

  function toolsTab(d) {
    if (!d.tools.length) return [h("div", { class: "mfs-muted", text: "no tool calls in this session yet" })];
    const rows = d.tools.map((t) => {
      const result = recalled[t.result_uid];
      return h("tr", {},
        h("td", { text: `#${t.uid}` }),
        h("td", { text: t.name }),
        h("td", {}, h("code", { text: t.arguments.length > 160 ? t.arguments.slice(0, 160) + "…" : t.arguments })),
        h("td", {}, h("span", { class: `mfs-badge mfs-state-${t.state}`, text: t.state }), ` ${human(t.chars)} chars`,
          t.result_uid ? h("button", { class: "mfs-button", text: "recall", onclick: () => model.send({ type: "recall", uid: t.result_uid }) }) : "",
          result ? h("pre", { class: "mfs-pre", text: result.error ? result.error : result.events.map((e) => e.content).join("\n") }) : ""));
    });
    return [h("table", { class: "mfs-table" }, h("tr", {}, ["uid", "tool", "arguments", "result in payload"].map((c) => h("th", { text: c }))), rows)];
  }

  function draw() {
    const d = model.get("data") || { layers: [], tools: [], usage: {} };
    root.replaceChildren(
      h("div", { class: "mfs-tabs" },
        h("button", { class: "mfs-tab" + (tab === "layers" ? " mfs-active" : ""), text: "send view", onclick: () => { tab = "layers"; draw(); } }),
        h("button", { class: "mfs-tab" + (tab === "tools" ? " mfs-active" : ""), text: `tool trajectory (${d.tools.length})`, onclick: () => { tab = "tools"; draw(); } })),
      ...(tab === "layers" ? layersTab(d) : toolsTab(d)));
  }
  model.on("change:data", draw);
  draw();
}
export default { render };
