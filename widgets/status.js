// Status bar under a %%chat reply. Everything is set with textContent: model and user text never become HTML.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "mfs-status";
  el.appendChild(root);
  let fadeTimer = null;

  function draw() {
    const d = model.get("data") || {};
    root.replaceChildren();
    const meter = document.createElement("span");
    meter.className = "mfs-meter";
    const fill = document.createElement("span");
    fill.className = "mfs-meter-fill";
    fill.style.width = Math.min(100, (d.ratio || 0) * 100).toFixed(1) + "%";
    fill.style.background = d.colour || "#2e7d32";
    meter.appendChild(fill);
    const line = document.createElement("span");
    line.className = "mfs-line";
    line.textContent = d.line || "";
    line.title = `${d.tier_label || d.tier} · ${d.source_label || d.source} · usable window ${d.effective} tokens`;
    root.append(meter, line);
    for (const text of d.notices || []) {
      const n = document.createElement("div");
      n.className = "mfs-notice";
      n.textContent = text;
      root.appendChild(n);
    }
    if (d.organizing) {
      const bar = document.createElement("div");
      bar.className = "mfs-organizing";
      bar.textContent = d.organizing === "running" ? "organizing context…" : "organized (next reply may be a little slower)";
      root.appendChild(bar);
      if (d.organizing === "done") {
        clearTimeout(fadeTimer);
        fadeTimer = setTimeout(() => bar.classList.add("mfs-faded"), 3000);
      }
    }
  }
  model.on("change:data", draw);
  draw();
  return () => clearTimeout(fadeTimer);
}
export default { render };
