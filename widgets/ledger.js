import { h, human } from "./common.js";

// %mfs ledger: a sortable table of ledger rows and a plot of payload tokens per call.
function render({ model, el }) {
  const root = h("div", { class: "mfs-panel mfs-ledger" });
  el.appendChild(root);
  let sortKey = "seq";
  let sortUp = true;

  function plot(series, marks, effective) {
    const W = 640, H = 120, P = 4;
    const svgNS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("class", "mfs-plot");
    if (!series.length) return svg;
    const maxY = Math.max(effective || 0, ...series.map((p) => p.tokens)) || 1;
    const x = (i) => P + (W - 2 * P) * (series.length === 1 ? 0.5 : i / (series.length - 1));
    const y = (v) => H - P - (H - 2 * P) * (v / maxY);
    const line = document.createElementNS(svgNS, "polyline");
    line.setAttribute("points", series.map((p, i) => `${x(i)},${y(p.tokens)}`).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#1e88e5"); line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
    if (effective) {
      const lim = document.createElementNS(svgNS, "line");
      lim.setAttribute("x1", P); lim.setAttribute("x2", W - P); lim.setAttribute("y1", y(effective)); lim.setAttribute("y2", y(effective));
      lim.setAttribute("stroke", "#c62828"); lim.setAttribute("stroke-dasharray", "4 3");
      svg.appendChild(lim);
    }
    series.forEach((p, i) => {
      if (!marks.includes(p.call)) return;
      const c = document.createElementNS(svgNS, "circle");
      c.setAttribute("cx", x(i)); c.setAttribute("cy", y(p.tokens)); c.setAttribute("r", 3.5); c.setAttribute("fill", "#7e57c2");
      const t = document.createElementNS(svgNS, "title"); t.textContent = `call ${p.call}: memory layer acted`; c.appendChild(t);
      svg.appendChild(c);
    });
    return svg;
  }

  function draw() {
    const d = model.get("data") || { rows: [], columns: [], series: [], marks: [] };
    const rows = [...d.rows].sort((a, b) => {
      const va = a[sortKey], vb = b[sortKey];
      const cmp = typeof va === "number" && typeof vb === "number" ? va - vb : String(va ?? "").localeCompare(String(vb ?? ""));
      return sortUp ? cmp : -cmp;
    });
    const head = h("tr", {}, d.columns.map((c) => h("th", {
      text: c + (c === sortKey ? (sortUp ? " ▲" : " ▼") : ""),
      onclick: () => { sortUp = c === sortKey ? !sortUp : true; sortKey = c; draw(); },
    })));
    // every value in words (ledger_data's cells): tiers by name, lists and objects as phrases, never JSON
    const cells = new Map((d.cells || []).map((c, i) => [d.rows[i], c]));
    const body = rows.map((r) => h("tr", {}, d.columns.map((c) => h("td", {
      text: (cells.get(r) || {})[c] ?? (r[c] === undefined || r[c] === null ? "" : typeof r[c] === "object" ? "" : r[c]),
    }))));
    root.replaceChildren(
      h("div", { class: "mfs-muted", text: `payload tokens per call (${d.series.length} calls; dots: memory-layer events; dashed: usable window ${human(d.effective || 0)})` }),
      plot(d.series, d.marks, d.effective),
      rows.length ? h("table", { class: "mfs-table" }, head, body) : h("div", { class: "mfs-muted", text: "ledger is empty: the memory layer has not acted yet" }));
  }
  model.on("change:data", draw);
  draw();
}
export default { render };
