// Small DOM helpers shared by the mfs_nb widgets. Text is only ever set with textContent.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = String(v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

export function human(n) {
  if (n < 1000) return String(n);
  if (n < 1e6) { const v = n / 1000; return (v >= 100 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1)) + "k"; }
  return (n / 1e6).toFixed(2) + "M";
}

export function span(a, b) {
  if (a === null || a === undefined) return "static";
  return a === b ? `uid ${a}` : `uids ${a}–${b}`;
}
